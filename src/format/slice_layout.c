/*
 * slice_layout.c - the runs of consecutive bytes a box of a C-contiguous
 * tensor covers (slice_internal.h).
 *
 * Trailing dimensions the box takes whole join the run; the innermost
 * dimension it cuts sets the run's length; every dimension before that
 * repeats the run. Dimensions the box takes a single index of only move the
 * first run, so they are dropped from the iteration: a [1, 1, ..., n] box of
 * a tensor with a thousand dimensions still iterates one dimension.
 * Arithmetic is done in bits, so that F4 (4-bit) and F6 (6-bit) tensors are
 * sliced exactly where the cuts fall on bytes and refused where they do not.
 */
#include "slice_internal.h"

#include <string.h>

#define SL_FAIL(status_, what_, ...) \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.file_offset = -1, .subject = (what_)}), __VA_ARGS__)

ckptio_status ckptio__slice_layout(const ckptio_slice *s, const char *what, ckptio__slice_runs *out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio__slice_layout: out is NULL");
    /* The scalars only: count[] and stride[] are read below `outer` alone,
     * and clearing their 1 KiB costs a read of many small tensors more. */
    out->nbytes = out->nruns = out->run_bytes = out->first = out->span = 0;
    out->outer = 0;
    if (!s) return SL_FAIL(CKPTIO_E_INVAL, what, "the slice is NULL");
    const unsigned bits = ckptio_dtype_bits(s->dtype);
    if (!bits) return SL_FAIL(CKPTIO_E_INVAL, what, "unknown dtype %d", (int)s->dtype);
    const uint32_t ndim = s->ndim;
    if (ndim && !s->shape) return SL_FAIL(CKPTIO_E_INVAL, what, "shape is NULL for a %u-d tensor", ndim);
    if ((s->start == NULL) != (s->stop == NULL))
        return SL_FAIL(CKPTIO_E_INVAL, what, "start and stop must both be given or both be NULL");
    bool empty = false;
    for (uint32_t d = 0; d < ndim; d++) {
        const int64_t n = s->shape[d];
        if (n < 0)
            return SL_FAIL(CKPTIO_E_INVAL, what, "dimension %u of the shape is negative (%lld)", d, (long long)n);
        const int64_t a = s->start ? s->start[d] : 0, b = s->stop ? s->stop[d] : n;
        if (a < 0 || b < a || b > n)
            return SL_FAIL(CKPTIO_E_RANGE, what, "dimension %u: [%lld, %lld) is not a range inside [0, %lld)", d,
                           (long long)a, (long long)b, (long long)n);
        if (a == b) empty = true;
    }
    if (empty) return CKPTIO_OK; /* no bytes, no runs; also for shapes too large to multiply out */

    uint64_t total = bits;
    for (uint32_t d = 0; d < ndim; d++)
        if (ckptio__mul_overflows(total, (uint64_t)s->shape[d], &total))
            return SL_FAIL(CKPTIO_E_RANGE, what, "a %u-d tensor of this shape has more than 2^64 bits", ndim);

    /* k: the box takes dimensions k.. whole. */
    uint32_t k = ndim;
    while (k > 0 && (!s->start || (s->start[k - 1] == 0 && s->stop[k - 1] == s->shape[k - 1]))) k--;
    uint64_t run_bits = total, first_bits = 0, stride = bits;
    uint64_t count_rev[CKPTIO__SLICE_MAX_OUTER], stride_rev[CKPTIO__SLICE_MAX_OUTER];
    unsigned outer = 0;
    for (uint32_t d = ndim; d-- > 0;) {
        if (d < k) {
            const uint64_t a = (uint64_t)s->start[d], n = (uint64_t)(s->stop[d] - s->start[d]);
            first_bits += a * stride; /* inside the tensor: no overflow */
            if (d == k - 1) {
                run_bits = n * stride;
            } else if (n > 1) {
                if (outer == CKPTIO__SLICE_MAX_OUTER)
                    return CKPTIO_FAIL(CKPTIO_E_INTERNAL, "slice of %u dims iterates more than %u", ndim, outer);
                count_rev[outer] = n;
                stride_rev[outer++] = stride;
            }
        }
        stride *= (uint64_t)s->shape[d];
    }
    if (first_bits % 8 || run_bits % 8)
        return SL_FAIL(CKPTIO_E_INVAL, what,
                       "the slice cuts %s elements (%u bits each) inside a byte: its bounds must fall on byte "
                       "boundaries",
                       ckptio_dtype_name(s->dtype), bits);
    for (unsigned i = 0; i < outer; i++)
        if (stride_rev[i] % 8)
            return SL_FAIL(CKPTIO_E_INVAL, what,
                           "the slice cuts %s elements (%u bits each) inside a byte: its rows do not start on byte "
                           "boundaries",
                           ckptio_dtype_name(s->dtype), bits);
    out->outer = outer;
    out->nruns = 1;
    out->span = run_bits / 8;
    for (unsigned i = 0; i < outer; i++) {
        out->count[i] = count_rev[outer - 1 - i];
        out->stride[i] = stride_rev[outer - 1 - i] / 8;
        out->nruns *= out->count[i];
        out->span += (out->count[i] - 1) * out->stride[i];
    }
    out->run_bytes = run_bits / 8;
    out->first = first_bits / 8;
    out->nbytes = out->nruns * out->run_bytes;
    return CKPTIO_OK;
}

void ckptio__slice_cursor_init(const ckptio__slice_runs *r, ckptio__slice_cursor *c) {
    memset(c->index, 0, sizeof c->index);
    c->offset = r->first;
    c->done = 0;
}

uint64_t ckptio__slice_cursor_next(const ckptio__slice_runs *r, ckptio__slice_cursor *c) {
    const uint64_t at = c->offset;
    c->done++;
    for (unsigned i = r->outer; i-- > 0;) {
        if (++c->index[i] < r->count[i]) {
            c->offset += r->stride[i];
            break;
        }
        c->index[i] = 0;
        c->offset -= (r->count[i] - 1) * r->stride[i];
    }
    return at;
}
