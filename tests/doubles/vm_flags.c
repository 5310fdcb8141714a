/*
 * vm_flags.c - see vm_flags.h.
 */
#include "vm_flags.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

int ckptio__test_vm_flag(const void *p, const char *flag) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            continue;
        }
        if (in && strncmp(line, "VmFlags:", 8) == 0) {
            char want[8];
            snprintf(want, sizeof want, " %s", flag);
            found = strstr(line, want) != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}
