/*
 * probe_cachestat.c - what asking the page cache before each read costs.
 *
 * ckptio reads a GPU load in windows of 4 MiB and, in CKPTIO_DIRECT=auto
 * mode, asks before each whether the page cache holds it (cachestat(2),
 * src/io/page_cache.c). This reads a file in 4 MiB preads on one thread,
 * without and with a cachestat of each window first, three passes each, and
 * prints GB/s and the share of the time cachestat took. Run it on a file on
 * tmpfs and on one in the page cache of a disk file system:
 *
 *   cc -O2 bench/probe_cachestat.c -o /tmp/probe_cachestat
 *   dd if=/dev/urandom of=/dev/shm/p.bin bs=1M count=2048; /tmp/probe_cachestat /dev/shm/p.bin
 *   cp /dev/shm/p.bin /var/tmp/p.bin; cat /var/tmp/p.bin > /dev/null; /tmp/probe_cachestat /var/tmp/p.bin
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "probe_util.h"

#ifndef SYS_cachestat
#define SYS_cachestat 451
#endif

struct range { uint64_t off, len; };
struct counts { uint64_t nr[5]; };

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE\n", argv[0]);
        return 2;
    }
    const int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    const size_t window = 4u << 20;
    const off_t size = lseek(fd, 0, SEEK_END);
    char *buf = aligned_alloc(4096, window);
    for (int ask = 0; ask <= 1; ask++) {
        for (int pass = 0; pass < 3; pass++) {
            double asking = 0;
            const double t0 = now();
            for (off_t off = 0; off < size; off += (off_t)window) {
                if (ask) {
                    const double a = now();
                    struct range r = {(uint64_t)off, window};
                    struct counts c;
                    if (syscall(SYS_cachestat, fd, &r, &c, 0) != 0) {
                        perror("cachestat");
                        return 1;
                    }
                    asking += now() - a;
                }
                if (pread(fd, buf, window, off) < 0) {
                    perror("pread");
                    return 1;
                }
            }
            const double dt = now() - t0;
            printf("%s: %.2f GB/s, cachestat %.1f%% of the time\n", ask ? "cachestat + pread" : "pread alone      ",
                   (double)size / dt / 1e9, 100 * asking / dt);
        }
    }
    free(buf);
    close(fd);
    return 0;
}
