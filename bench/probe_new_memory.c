/*
 * probe_new_memory.c - how fast this machine faults new anonymous memory in,
 * and whether that depends on the memory's history (issue 17).
 *
 * A process's first GPU load faults its 128 MiB of staging in (16 workers x
 * 2 slots of 4 MiB, huge pages advised, MADV_POPULATE_WRITE) beside its
 * copies. On the lent Firecracker VMs faulting new memory measured slow
 * (128 MiB on 8 threads: 9-23 ms). If the host backs the guest's memory only
 * when the guest first touches it, memory the guest has used before (freed
 * by an earlier process) faults in faster than memory it never touched, and
 * a first load's pinning costs less on a machine whose memory is in use.
 *
 *   cc -O2 -pthread bench/probe_new_memory.c -o probe_new_memory
 *   ./probe_new_memory fill mib=128 threads=16 passes=3   # one line per pass
 *   ./probe_new_memory touch gib=16                        # fault G GiB in, then exit (frees it)
 *   options: huge=1|0 (MADV_HUGEPAGE or MADV_NOHUGEPAGE), how=populate|memset|touch|read (touch: one write
 *   per 4 KiB page, as ckptio fills its slots since 2026-11-27)
 *   (read: pread a file, FILE=path, into the memory: the faults come with a copy, as a read into an
 *   unfaulted slot would take them)
 *
 * fill: each pass maps `mib` MiB (2 MiB aligned, MADV_HUGEPAGE), faults it in
 * on `threads` threads (each its share, MADV_POPULATE_WRITE), times that,
 * then unmaps it. Prints wall ms, GB/s, thp_fault_alloc's change and
 * MemTotal / MemFree (kB) before the pass.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "probe_util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define HUGE_SZ ((size_t)2 << 20)

static long vmstat(const char *key) {
    FILE *f = fopen("/proc/vmstat", "r");
    if (!f) return -1;
    char name[128];
    long v = -1, x;
    while (fscanf(f, "%127s %ld", name, &x) == 2)
        if (!strcmp(name, key)) { v = x; break; }
    fclose(f);
    return v;
}

static long meminfo(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    const size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') { v = strtol(line + n + 1, NULL, 10); break; }
    fclose(f);
    return v;
}

typedef struct job {
    unsigned char *addr;
    size_t bytes, off;
} job;

static int huge = 1, how = 0, fd = -1; /* how: 0 populate, 1 memset, 2 read, 3 touch */

static void *fault_in(void *arg) {
    const job *j = arg;
    if (how == 2) {
        for (size_t done = 0; done < j->bytes;) {
            const ssize_t n = pread(fd, j->addr + done, j->bytes - done, (off_t)(j->off + done));
            if (n <= 0) { perror("pread"); exit(1); }
            done += (size_t)n;
        }
    } else if (how == 3) {
        for (size_t off = 0; off < j->bytes; off += 4096) ((volatile unsigned char *)j->addr)[off] = 1;
    } else if (how == 1 || madvise(j->addr, j->bytes, MADV_POPULATE_WRITE) != 0) {
        memset(j->addr, 1, j->bytes);
    }
    return NULL;
}

/* Maps `bytes`, faults them in on `threads` threads; returns seconds. */
static double fill(size_t bytes, unsigned threads) {
    const size_t len = bytes + HUGE_SZ;
    unsigned char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) { perror("mmap"); exit(1); }
    unsigned char *base = (unsigned char *)(((uintptr_t)map + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
    (void)madvise(base, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    pthread_t tid[256];
    job jobs[256];
    const size_t share = (bytes / threads + HUGE_SZ - 1) & ~(HUGE_SZ - 1);
    const double t0 = now();
    unsigned started = 0;
    for (unsigned t = 0; t < threads; t++) {
        const size_t off = (size_t)t * share;
        if (off >= bytes) break;
        jobs[t] = (job){base + off, off + share > bytes ? bytes - off : share, off};
        if (pthread_create(&tid[t], NULL, fault_in, &jobs[t]) != 0) { perror("pthread_create"); exit(1); }
        started++;
    }
    for (unsigned t = 0; t < started; t++) pthread_join(tid[t], NULL);
    const double dt = now() - t0;
    munmap(map, len);
    return dt;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s fill [mib=M] [threads=T] [passes=P] | touch [gib=G]\n", argv[0]);
        return 1;
    }
    unsigned mib = 128, threads = 16, passes = 3, gib = 16;
    for (int i = 2; i < argc; i++)
        if (sscanf(argv[i], "mib=%u", &mib) != 1 && sscanf(argv[i], "threads=%u", &threads) != 1 &&
            sscanf(argv[i], "passes=%u", &passes) != 1 && sscanf(argv[i], "gib=%u", &gib) != 1 &&
            sscanf(argv[i], "huge=%d", &huge) != 1 && strcmp(argv[i], "how=populate") && strcmp(argv[i], "how=memset") &&
            strcmp(argv[i], "how=touch") &&
            strcmp(argv[i], "how=read")) {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 1;
        }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "how=memset")) how = 1;
        if (!strcmp(argv[i], "how=read")) how = 2;
        if (!strcmp(argv[i], "how=touch")) how = 3;
    }
    if (how == 2) {
        const char *path = getenv("FILE");
        if (!path || (fd = open(path, O_RDONLY)) < 0) { fprintf(stderr, "how=read needs FILE=path\n"); return 1; }
    }
    if (!threads || threads > 256) { fprintf(stderr, "threads in 1..256\n"); return 1; }
    if (!strcmp(argv[1], "touch")) {
        const double dt = fill((size_t)gib << 30, threads);
        printf("touch %u GiB on %u threads: %.0f ms (%.2f GB/s)\n", gib, threads, dt * 1e3,
               (double)((size_t)gib << 30) / dt / 1e9);
        return 0;
    }
    for (unsigned p = 1; p <= passes; p++) {
        const long total = meminfo("MemTotal"), free_kb = meminfo("MemFree");
        const long thp0 = vmstat("thp_fault_alloc");
        const double dt = fill((size_t)mib << 20, threads);
        const long thp1 = vmstat("thp_fault_alloc");
        printf("{\"pass\": %u, \"how\": %d, \"huge\": %d, \"mib\": %u, \"threads\": %u, \"ms\": %.2f, \"GBps\": %.2f, \"thp\": %ld, "
               "\"MemTotal_kB\": %ld, \"MemFree_kB\": %ld}\n",
               p, how, huge, mib, threads, dt * 1e3, (double)((size_t)mib << 20) / dt / 1e9, thp1 - thp0, total, free_kb);
    }
    return 0;
}
