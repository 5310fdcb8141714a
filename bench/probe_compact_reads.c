/*
 * probe_compact_reads.c - a column slice's file stage from the page cache: reading the span its runs cover
 * (what ckptio's GPU pipeline does: gaps under 64 KiB are bridged, so a TP-8 column slice reads 8x its
 * bytes) against one pread per run into a packed buffer (only the slice's bytes copied, one syscall per row).
 * No GPU: this is the CPU side alone, the bound the pipeline's file stage puts on a column-slice load.
 *
 *   cc -O2 -pthread -o probe_compact_reads bench/probe_compact_reads.c
 *   ./probe_compact_reads FILE [THREADS=16] [ROW=16384]
 * FILE is read whole first (page cache). Each thread takes a contiguous share of the file and reads it
 * through its own 4 MiB buffer (kept hot, as a staging slot is): "span" reads 4 MiB windows; "runs W" reads W
 * bytes of every ROW-byte row, packed, for W = ROW/2, ROW/4, ROW/8. Prints GB/s of slice bytes for each, best
 * of 3.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "probe_util.h"

#define BUF (4u << 20)

static int fd;
static size_t file_size, row, width; /* width 0: span reads */
static unsigned nthreads;

static void *worker(void *arg) {
    const size_t t = (size_t)(uintptr_t)arg;
    const size_t share = file_size / nthreads / row * row;
    const size_t lo = t * share, hi = lo + share;
    char *buf = aligned_alloc(4096, BUF);
    memset(buf, 0, BUF);
    if (!width) {
        for (size_t o = lo; o < hi; o += BUF) {
            const size_t n = hi - o < BUF ? hi - o : BUF;
            if (pread(fd, buf, n, (off_t)o) != (ssize_t)n) abort();
        }
    } else {
        size_t used = 0;
        for (size_t o = lo; o < hi; o += row) {
            if (used + width > BUF) used = 0;
            if (pread(fd, buf + used, width, (off_t)o) != (ssize_t)width) abort();
            used += width;
        }
    }
    free(buf);
    return NULL;
}

static double run(size_t w) {
    width = w;
    double best = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t tid[256];
        const double t0 = now();
        for (unsigned i = 0; i < nthreads; i++) pthread_create(&tid[i], NULL, worker, (void *)(uintptr_t)i);
        for (unsigned i = 0; i < nthreads; i++) pthread_join(tid[i], NULL);
        const double dt = now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [THREADS] [ROW]\n", argv[0]);
        return 2;
    }
    nthreads = argc > 2 ? (unsigned)atoi(argv[2]) : 16;
    row = argc > 3 ? (size_t)atol(argv[3]) : 16384;
    if (nthreads < 1 || nthreads > 256 || row < 64) return 2;
    fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(argv[1]);
        return 1;
    }
    file_size = (size_t)st.st_size;
    width = 0;
    run(0); /* into the page cache */
    const size_t rows = file_size / nthreads / row * nthreads;
    const double span = run(0);
    printf("{\"threads\": %u, \"row\": %zu, \"file_bytes\": %zu, \"span_GBps\": %.2f", nthreads, row, file_size,
           (double)(rows * row) / span / 1e9);
    for (unsigned k = 2; k <= 8; k *= 2) {
        const double t = run(row / k);
        /* The span read delivers the same slice bytes in `span` seconds: slice bytes / time for both. */
        printf(", \"tp%u\": {\"runs_GBps\": %.2f, \"span_GBps\": %.2f}", k, (double)(rows * (row / k)) / t / 1e9,
               (double)(rows * (row / k)) / span / 1e9);
    }
    printf("}\n");
    return 0;
}
