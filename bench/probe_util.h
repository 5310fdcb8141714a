/*
 * probe_util.h - what the C probes in bench/ share: a monotonic clock and,
 * where <cuda.h> was included first, a check that exits with the driver's
 * error name. Each probe stays one file to compile (`cc bench/probe_X.c`);
 * this header is found beside it.
 */
#ifndef CKPTIO_BENCH_PROBE_UTIL_H
#define CKPTIO_BENCH_PROBE_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#ifdef CUDA_VERSION
/* A driver call that must succeed: otherwise the call, its error's name and exit(1). */
#define CHECK(call)                                                                    \
    do {                                                                               \
        CUresult rc_ = (call);                                                         \
        if (rc_ != CUDA_SUCCESS) {                                                     \
            const char *s_ = NULL;                                                     \
            cuGetErrorName(rc_, &s_);                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?"); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)
#endif

#endif /* CKPTIO_BENCH_PROBE_UTIL_H */
