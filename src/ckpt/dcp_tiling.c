/*
 * dcp_tiling.c - do the chunks of a DCP tensor tile it exactly?
 *
 * .metadata is untrusted and may split one tensor into hundreds of thousands
 * of chunks, so the check must not compare chunks pairwise. It uses an exact
 * characterisation instead: the indicator of a half-open box [a, b) is
 * prod_k (H(x_k - a_k) - H(x_k - b_k)), H the step function; expanded, it is
 * a signed sum over the box's 2^ndim corners of orthant functions, and
 * orthant functions of distinct corners are linearly independent. So the
 * chunks cover every element of the tensor exactly once (and nothing else)
 * if and only if the polynomial identity
 *
 *     sum_i prod_k (Z_k[a_ik] - Z_k[b_ik]) == prod_k (Z_k[0] - Z_k[size_k])
 *
 * holds in the formal variables Z_k[c] (one per dimension and coordinate):
 * its monomials are exactly the corners. The identity is tested at a random
 * point modulo the prime 2^61 - 1 (Schwartz-Zippel: a wrong tiling passes
 * with probability at most ndim / 2^61), with Z_k[c] a hash of (k, c) under
 * a seed drawn from getrandom() per check, so a file cannot be made to
 * pass. That is O(chunks x ndim) time and no memory.
 *
 * When the tiling is wrong, the message names two overlapping chunks if a
 * sweep over the chunks sorted by their start in dimension 0 finds them
 * within a bounded number of comparisons, and the gap otherwise.
 */
#include "dcp_commit_internal.h"
#include "dcp_dir_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <xxhash.h>

#define PRIME ((uint64_t)0x1FFFFFFFFFFFFFFFull) /* 2^61 - 1 */
/* Pair comparisons the sweep may make to name an overlap (the check itself
 * has already decided; this only improves the message). */
#define SWEEP_BUDGET ((uint64_t)1 << 24)

static uint64_t mul_mod(uint64_t a, uint64_t b) {
    const unsigned __int128 p = (unsigned __int128)a * b;
    uint64_t r = (uint64_t)(p & PRIME) + (uint64_t)(p >> 61); /* <= 2 x PRIME */
    if (r >= PRIME) r -= PRIME;
    return r >= PRIME ? r - PRIME : r;
}

static uint64_t sub_mod(uint64_t a, uint64_t b) { return a >= b ? a - b : a + PRIME - b; }

/* Z_k[c]: a pseudo-random field element for coordinate c of dimension k. */
static uint64_t var(uint64_t seed, uint32_t k, int64_t c) {
    const uint64_t in[2] = {k, (uint64_t)c};
    return XXH3_64bits_withSeed(in, sizeof in, seed) % PRIME;
}

static uint64_t box_value(uint64_t seed, uint32_t nd, const int64_t *off, const int64_t *size) {
    uint64_t v = 1;
    for (uint32_t k = 0; k < nd && v; k++)
        v = mul_mod(v, sub_mod(var(seed, k, off[k]), var(seed, k, off[k] + size[k])));
    return v;
}

static uint64_t random_seed(void) {
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&ts;
    }
    return seed;
}

static bool empty_chunk(const ckptio__dcp_tensor *t, size_t c) {
    for (uint32_t d = 0; d < t->ndim; d++)
        if (t->sizes[c * t->ndim + d] == 0) return true;
    return false;
}

static bool chunks_meet(const ckptio__dcp_tensor *t, size_t a, size_t b) {
    const uint32_t nd = t->ndim;
    for (uint32_t d = 0; d < nd; d++) {
        const int64_t a0 = t->offsets[a * nd + d], a1 = a0 + t->sizes[a * nd + d];
        const int64_t b0 = t->offsets[b * nd + d], b1 = b0 + t->sizes[b * nd + d];
        if (!(a0 < b1 && b0 < a1)) return false;
    }
    return true;
}

static int cmp_start(const void *x, const void *y, void *arg) {
    const ckptio__dcp_tensor *t = arg;
    const size_t a = *(const size_t *)x, b = *(const size_t *)y;
    const int64_t sa = t->offsets[a * t->ndim], sb = t->offsets[b * t->ndim];
    return sa != sb ? (sa < sb ? -1 : 1) : (a < b ? -1 : a > b);
}

/* Two overlapping chunks (*a < *b), found by a bounded sweep; false if none
 * was found within the budget (or memory). */
static bool find_overlap(const ckptio__dcp_tensor *t, size_t *a, size_t *b) {
    size_t n = 0, *order = ckptio__calloc(t->nchunks + 1, sizeof *order);
    if (!order) return false;
    for (size_t c = 0; c < t->nchunks; c++)
        if (!empty_chunk(t, c)) order[n++] = c;
    bool found = false;
    if (t->ndim == 0) {
        if (n >= 2) *a = order[0], *b = order[1], found = true;
        ckptio__free(order);
        return found;
    }
    qsort_r(order, n, sizeof *order, cmp_start, (void *)t);
    uint64_t budget = SWEEP_BUDGET;
    for (size_t i = 0; i < n && !found && budget; i++) {
        const int64_t end = t->offsets[order[i] * t->ndim] + t->sizes[order[i] * t->ndim];
        for (size_t j = i + 1; j < n && budget && t->offsets[order[j] * t->ndim] < end; j++, budget--)
            if (chunks_meet(t, order[i], order[j])) {
                *a = order[i] < order[j] ? order[i] : order[j];
                *b = order[i] < order[j] ? order[j] : order[i];
                found = true;
                break;
            }
    }
    ckptio__free(order);
    return found;
}

/* Whether the chunks tile `t` exactly; *total receives the elements they
 * cover together (UINT64_MAX past 64 bits). */
static bool tiles_exactly(const ckptio__dcp_tensor *t, uint64_t *out_total) {
    const uint32_t nd = t->ndim;
    uint64_t total = 0;
    for (size_t c = 0; c < t->nchunks; c++) {
        uint64_t vol = 1;
        for (uint32_t d = 0; d < nd; d++) vol *= (uint64_t)t->sizes[c * nd + d]; /* <= numel: no overflow */
        if (ckptio__add_overflows(total, vol, &total)) total = UINT64_MAX;
    }
    bool exact = total == t->numel;
    if (exact) {
        const uint64_t seed = random_seed();
        uint64_t sum = 0;
        for (size_t c = 0; c < t->nchunks; c++) {
            sum += box_value(seed, nd, t->offsets + c * nd, t->sizes + c * nd);
            if (sum >= PRIME) sum -= PRIME;
        }
        static const int64_t zeros[64];
        exact = sum == box_value(seed, nd, zeros, t->shape);
    }
    *out_total = total;
    return exact;
}

/* The check itself; errors name `path` and the tensor's fqn. */
static ckptio_status check_tiling(const char *path, const ckptio__dcp_tensor *t) {
    const ckptio__err_ctx ctx = {.path = path, .file_offset = -1, .subject = t->fqn};
    uint64_t total = 0;
    if (tiles_exactly(t, &total)) return CKPTIO_OK;
    size_t a = 0, b = 0;
    /* Inside the tensor with at least its volume, an inexact tiling overlaps. */
    if (total >= t->numel) {
        if (find_overlap(t, &a, &b)) return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "chunks %zu and %zu overlap", a, b);
        return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "the %zu chunks overlap (they cover %llu elements for the "
                               "tensor's %llu)", t->nchunks, (unsigned long long)total, (unsigned long long)t->numel);
    }
    return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "the %zu chunks cover %llu of the tensor's %llu elements (a gap)",
                           t->nchunks, (unsigned long long)total, (unsigned long long)t->numel);
}

ckptio_status ckptio__dcp_check_tiling(const ckptio_dcp *h, const ckptio__dcp_tensor *t) {
    return check_tiling(h->md_path, t);
}

ckptio_status ckptio__dcp_check_coverage(const ckptio_dcp *h, size_t *partial) {
    *partial = 0;
    const bool whole = ckptio__dcp_several_ranks((const char *const *)h->files, h->nfiles);
    for (size_t i = 0; i < h->ntensors; i++) {
        uint64_t total = 0;
        if (whole) CKPTIO_FORWARD(check_tiling(h->md_path, &h->tensors[i]));
        else if (!tiles_exactly(&h->tensors[i], &total)) (*partial)++;
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_numel(const ckptio__err_ctx *ctx, uint32_t ndim, const int64_t *shape, uint64_t *numel) {
    *numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (shape[d] < 0) return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, ctx, "size[%u] is %lld", d, (long long)shape[d]);
        if (ckptio__mul_overflows(*numel, (uint64_t)shape[d], numel))
            return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, ctx, "the number of elements overflows 64 bits");
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_chunk_inside(const ckptio__err_ctx *ctx, size_t c, uint32_t ndim, const int64_t *shape,
                                       const int64_t *off, const int64_t *size) {
    for (uint32_t d = 0; d < ndim; d++)
        if (off[d] < 0 || size[d] < 0 || off[d] > shape[d] || size[d] > shape[d] - off[d])
            return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, ctx,
                                   "chunk %zu spans [%lld, %lld) in dimension %u, outside the tensor's size %lld", c,
                                   (long long)off[d], (long long)off[d] + (long long)size[d], d, (long long)shape[d]);
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_check_chunks(const char *path, const char *fqn, uint32_t ndim, const int64_t *shape,
                                      size_t nchunks, const int64_t *offsets, const int64_t *sizes, int whole) {
    CKPTIO_RETURN_IF(!fqn || (ndim && !shape) || (nchunks && ndim && (!offsets || !sizes)), CKPTIO_E_INVAL,
                     "ckptio_dcp_check_chunks: fqn, shape, offsets and sizes are required");
    char subj[256];
    snprintf(subj, sizeof subj, "state_dict_metadata['%s']", fqn);
    const ckptio__err_ctx ctx = {.path = path, .file_offset = -1, .subject = subj};
    if (ndim > CKPTIO_DCP_MAX_NDIM)
        return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "the tensor has %u dimensions (at most %u)", ndim,
                               (unsigned)CKPTIO_DCP_MAX_NDIM);
    uint64_t numel = 0;
    CKPTIO_FORWARD(ckptio__dcp_numel(&ctx, ndim, shape, &numel));
    /* Inside the tensor (as ckptio_dcp_open checks a directory's chunks), which the tiling's arithmetic needs. */
    for (size_t c = 0; c < nchunks && ndim; c++)
        CKPTIO_FORWARD(ckptio__dcp_chunk_inside(&ctx, c, ndim, shape, offsets + c * ndim, sizes + c * ndim));
    if (!whole) return CKPTIO_OK;
    static const int64_t none[1]; /* a scalar's or a chunkless tensor's arrays may be NULL: no arithmetic on NULL */
    shape = shape ? shape : none;
    offsets = offsets ? offsets : none;
    sizes = sizes ? sizes : none;
    const ckptio__dcp_tensor t = {.fqn = subj, .ndim = ndim, .shape = (int64_t *)shape, .numel = numel,
                                  .nchunks = nchunks, .offsets = (int64_t *)offsets, .sizes = (int64_t *)sizes};
    return check_tiling(path, &t);
}
