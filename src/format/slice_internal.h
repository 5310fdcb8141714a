/*
 * slice_internal.h - where the bytes of a box of a C-contiguous tensor lie:
 * the box [start, stop) of every dimension, read in C order, is a sequence
 * of equally long runs of consecutive bytes at regular strides. Pure
 * arithmetic (no I/O); src/ckpt/model_read.c turns runs into plan extents.
 */
#ifndef CKPTIO_SLICE_INTERNAL_H
#define CKPTIO_SLICE_INTERNAL_H

#include "common_internal.h"

/* Outer dimensions kept: only those the box takes more than one index of,
 * so their product (the run count, < 2^64) bounds their number below 64. */
#define CKPTIO__SLICE_MAX_OUTER 64

typedef struct ckptio__slice_runs {
    uint64_t nbytes;     /* bytes of the box: nruns x run_bytes (0 for an empty box) */
    uint64_t nruns;      /* runs, in C order of the box (0 for an empty box) */
    uint64_t run_bytes;  /* length of every run */
    uint64_t first;      /* offset of the first run from the tensor's first byte */
    uint64_t span;       /* from the first run's start to the last run's end */
    unsigned outer;      /* dimensions iterated run by run (the last one fastest) */
    uint64_t count[CKPTIO__SLICE_MAX_OUTER];  /* indices the box takes in each */
    uint64_t stride[CKPTIO__SLICE_MAX_OUTER]; /* byte distance of one step in each */
} ckptio__slice_runs;

/* Validates the slice and computes its runs. Rules: a known dtype;
 * shape != NULL when ndim > 0; start and stop both NULL (the whole tensor)
 * or both given; 0 <= start[d] <= stop[d] <= shape[d]; the tensor's size in
 * bits fits 64 bits; for dtypes narrower than a byte (F4, F6) every run
 * starts and ends on a byte boundary. Errors are CKPTIO_E_INVAL (malformed
 * slice) or CKPTIO_E_RANGE (outside the tensor, overflow), naming `what`
 * (e.g. "tensor 'w'"; may be NULL) and the dimension. */
ckptio_status ckptio__slice_layout(const ckptio_slice *slice, const char *what, ckptio__slice_runs *out);

/* Iterates the runs in order: `pos` starts zeroed; each call gives the
 * offset (from the tensor's first byte) of the next run. */
typedef struct ckptio__slice_cursor {
    uint64_t index[CKPTIO__SLICE_MAX_OUTER];
    uint64_t offset;
    uint64_t done;
} ckptio__slice_cursor;

void ckptio__slice_cursor_init(const ckptio__slice_runs *r, ckptio__slice_cursor *c);
/* Offset of the current run; then advances. Call at most nruns times. */
uint64_t ckptio__slice_cursor_next(const ckptio__slice_runs *r, ckptio__slice_cursor *c);

#endif /* CKPTIO_SLICE_INTERNAL_H */
