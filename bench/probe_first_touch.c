/*
 * probe_first_touch.c - what a copied load of files into new memory costs
 * without ckptio: the files read with pread(2) into one fresh buffer, by 1 or
 * 2 threads, the buffer got in one of these ways:
 *
 *   malloc     plain malloc: 4 KiB pages, each faulted in by the read that first writes it
 *   populate   MAP_POPULATE: faulted in (zeroed) by mmap before the reads
 *   popwrite   malloc, each 8 MiB piece MADV_POPULATE_WRITE'd by its reader just before its read
 *   huge       2 MiB aligned, MADV_HUGEPAGE: transparent huge pages, one fault per 2 MiB
 *
 * It prints the allocation and read seconds, GB/s and the process's minor
 * faults and system CPU seconds (the first touch is kernel time).
 *
 *   cc -O2 -pthread bench/probe_first_touch.c -o /tmp/probe_first_touch
 *   cat DIR/model-0000* > /dev/null   # warm (DIR: a Hugging Face directory)
 *   /tmp/probe_first_touch malloc 2 DIR/model-0000?-of-00004.safetensors
 *
 * Linux only (MADV_POPULATE_WRITE: 5.14+).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_FILES 64
#define PIECE ((size_t)8 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

typedef struct job {
    int fd;
    char *dst;
    size_t off, len;
} job;

static job jobs[MAX_FILES * 4];
static int njobs, nthreads, populate_write;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void read_job(const job *j) {
    for (size_t done = 0; done < j->len;) {
        size_t n = j->len - done < PIECE ? j->len - done : PIECE;
        if (populate_write) {
            uintptr_t a = (uintptr_t)(j->dst + done) & ~(uintptr_t)4095;
            (void)madvise((void *)a, (uintptr_t)(j->dst + done + n) - a, MADV_POPULATE_WRITE);
        }
        ssize_t r = pread(j->fd, j->dst + done, n, (off_t)(j->off + done));
        if (r <= 0) {
            perror("pread");
            exit(1);
        }
        done += (size_t)r;
    }
}

static void *reader(void *arg) {
    for (int i = (int)(intptr_t)arg; i < njobs; i += nthreads) read_job(&jobs[i]);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc - 3 > MAX_FILES) {
        fprintf(stderr, "usage: %s malloc|populate|popwrite|huge THREADS FILE...\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    nthreads = atoi(argv[2]);
    if (nthreads < 1 || nthreads > 64) nthreads = 1;
    int fds[MAX_FILES];
    size_t sizes[MAX_FILES], total = 0;
    const int nfiles = argc - 3;
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if ((fds[i] = open(argv[3 + i], O_RDONLY)) < 0 || fstat(fds[i], &st) != 0) {
            perror(argv[3 + i]);
            return 1;
        }
        sizes[i] = (size_t)st.st_size;
        total += sizes[i];
    }
    const double t0 = now();
    char *buf;
    if (!strcmp(mode, "malloc") || !strcmp(mode, "popwrite")) {
        buf = malloc(total);
        populate_write = !strcmp(mode, "popwrite");
    } else {
        const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (!strcmp(mode, "populate") ? MAP_POPULATE : 0);
        char *m = mmap(NULL, total + HUGE_PAGE, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (m == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        buf = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        if (!strcmp(mode, "huge")) (void)madvise(buf, total, MADV_HUGEPAGE);
    }
    if (!buf) {
        perror("malloc");
        return 1;
    }
    const double t1 = now();
    size_t base = 0;
    for (int i = 0; i < nfiles; i++) { /* four jobs a file */
        const size_t quarter = (sizes[i] + 3) / 4;
        for (size_t o = 0; o < sizes[i]; o += quarter)
            jobs[njobs++] = (job){fds[i], buf + base + o, o, sizes[i] - o < quarter ? sizes[i] - o : quarter};
        base += sizes[i];
    }
    pthread_t th[64];
    for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, reader, (void *)(intptr_t)t);
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
    const double t2 = now();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("%-8s threads %d  alloc %.3f s  read %.3f s  total %.3f s  %.2f GB/s  minor faults %ld  sys %.2f s\n", mode,
           nthreads, t1 - t0, t2 - t1, t2 - t0, total / (t2 - t0) / 1e9, ru.ru_minflt,
           ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
    return 0;
}
