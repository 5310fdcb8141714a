/*
 * dcp_box.c - copying a box of a stored DCP tensor out of its storage, in
 * runs, from memory or while a zstd item decompresses.
 *
 * A large zstd item is never held decoded (dcp_item.c keeps the first and
 * last bytes of its archive to parse it): its storage is decompressed again
 * through a fixed buffer and the box's elements are handed on as they pass.
 * That needs the elements in storage order: the box's dimensions are visited
 * by decreasing stride, which reaches the storage in increasing order for
 * every layout whose strides do not overlap (C order, transposes, views with
 * gaps). Each run is contiguous in the storage and in the destination, so the
 * common cases (a whole chunk, rows of a row-sharded tensor) are one run or
 * one run per row.
 */
#include "dcp_dir_internal.h"

#include <stdio.h>
#include <string.h>

#define BFAIL(status_, path_, offset_, fqn_, ...)                                                          \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.operation = "read DCP item", .path = (path_),           \
                                                   .file_offset = (int64_t)(offset_), .subject = (fqn_)}),  \
                    __VA_ARGS__)

typedef struct box {
    uint32_t m;                           /* dimensions visited around the runs, outermost first */
    uint64_t len[CKPTIO_DCP_MAX_NDIM];
    uint64_t sstep[CKPTIO_DCP_MAX_NDIM];  /* bytes in the storage per step of each */
    uint64_t dstep[CKPTIO_DCP_MAX_NDIM];  /* bytes in the destination per step */
    uint64_t idx[CKPTIO_DCP_MAX_NDIM];
    uint64_t run;                         /* bytes per run */
    uint64_t runs_left;
    uint64_t spos, dpos, done;            /* the current run: where it starts in each, bytes handed on */
    uint64_t dst_end;                     /* one past the last destination byte */
    bool ordered;                         /* runs come in increasing storage order */
    ckptio__dcp_emit_fn emit;
    void *ctx;
} box;

typedef struct where {
    const char *path, *fqn;
    uint64_t offset;
} where;

static ckptio_status plan(box *b, const ckptio_dcp_layout *lay, const int64_t *off, const int64_t *len,
                          const int64_t *dst_strides, const where *w) {
    memset(b, 0, sizeof *b);
    const uint64_t es = ckptio__dcp_element_size(lay->dtype);
    if (!es || lay->ndim > CKPTIO_DCP_MAX_NDIM)
        return BFAIL(CKPTIO_E_FORMAT, w->path, w->offset, w->fqn, "stored tensor of dtype %s and %u dimensions",
                     ckptio_dtype_name(lay->dtype), lay->ndim);
    const uint32_t nd = lay->ndim;
    uint64_t sbase = lay->storage_offset, dlast = 0;
    bool empty = false;
    for (uint32_t k = 0; k < nd; k++) {
        uint64_t end, step;
        if (off[k] < 0 || len[k] < 0 || lay->stride[k] < 0 || dst_strides[k] < 0 ||
            ckptio__add_overflows((uint64_t)off[k], (uint64_t)len[k], &end) || end > (uint64_t)lay->shape[k])
            return BFAIL(CKPTIO_E_RANGE, w->path, w->offset, w->fqn,
                         "box [%lld, +%lld) of dimension %u lies outside the stored tensor (size %lld)",
                         (long long)off[k], (long long)len[k], k, (long long)lay->shape[k]);
        if (len[k] == 0) empty = true;
        if (ckptio__mul_overflows((uint64_t)off[k], (uint64_t)lay->stride[k], &step) ||
            ckptio__add_overflows(sbase, step, &sbase))
            return BFAIL(CKPTIO_E_FORMAT, w->path, w->offset, w->fqn, "strides overflow");
        if (len[k] > 0 && (ckptio__mul_overflows((uint64_t)(len[k] - 1), (uint64_t)dst_strides[k], &step) ||
                           ckptio__add_overflows(dlast, step, &dlast)))
            return BFAIL(CKPTIO_E_RANGE, w->path, w->offset, w->fqn, "destination strides overflow");
    }
    if (empty) return CKPTIO_OK; /* runs_left == 0: nothing to hand on */
    if (ckptio__mul_overflows(dlast + 1, es, &b->dst_end))
        return BFAIL(CKPTIO_E_RANGE, w->path, w->offset, w->fqn, "destination strides overflow");
    /* The dimensions that vary, by decreasing stride (stable). */
    uint32_t order[CKPTIO_DCP_MAX_NDIM], m = 0;
    for (uint32_t k = 0; k < nd; k++) {
        if (len[k] == 1) continue;
        uint32_t j = m++;
        while (j > 0 && lay->stride[order[j - 1]] < lay->stride[k]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = k;
    }
    /* Visited in that order, element positions increase iff each stride
     * exceeds the reach of all smaller ones: no two elements share a byte. */
    b->ordered = true;
    uint64_t reach = 0;
    for (uint32_t j = m; j-- > 0;) {
        const uint32_t k = order[j];
        uint64_t step;
        if ((uint64_t)lay->stride[k] <= reach) b->ordered = false;
        if (ckptio__mul_overflows((uint64_t)(len[k] - 1), (uint64_t)lay->stride[k], &step) ||
            ckptio__add_overflows(reach, step, &reach))
            return BFAIL(CKPTIO_E_FORMAT, w->path, w->offset, w->fqn, "strides overflow");
    }
    if (!b->ordered) /* overlapping strides: C order of the box (only from memory) */
        for (uint32_t k = 0, j = 0; k < nd; k++)
            if (len[k] != 1) order[j++] = k;
    /* Inner dimensions contiguous in both the storage and the destination make one run. */
    uint64_t run = 1;
    while (m > 0 && (uint64_t)lay->stride[order[m - 1]] == run && (uint64_t)dst_strides[order[m - 1]] == run) {
        run *= (uint64_t)len[order[m - 1]];
        m--;
    }
    b->m = m;
    b->run = run * es;
    b->runs_left = 1;
    for (uint32_t j = 0; j < m; j++) {
        const uint32_t k = order[j];
        b->len[j] = (uint64_t)len[k];
        b->sstep[j] = (uint64_t)lay->stride[k] * es;
        b->dstep[j] = (uint64_t)dst_strides[k] * es;
        b->runs_left *= b->len[j];
    }
    b->spos = lay->storage_start + sbase * es;
    return CKPTIO_OK;
}

static void next_run(box *b) {
    b->done = 0;
    b->runs_left--;
    for (uint32_t j = b->m; j-- > 0;) {
        if (++b->idx[j] < b->len[j]) {
            b->spos += b->sstep[j];
            b->dpos += b->dstep[j];
            return;
        }
        b->spos -= (b->len[j] - 1) * b->sstep[j];
        b->dpos -= (b->len[j] - 1) * b->dstep[j];
        b->idx[j] = 0;
    }
}

/* Hands on what bytes [off, off + n) of the storage's space (data) hold of
 * the box's runs. Pieces come in order; from memory, one piece holds all. */
static ckptio_status feed(box *b, const uint8_t *data, uint64_t off, uint64_t n) {
    while (b->runs_left) {
        const uint64_t start = b->spos + b->done, end = b->spos + b->run;
        if (start >= off + n) return CKPTIO_OK; /* in a later piece */
        if (start < off)
            return CKPTIO_FAIL(CKPTIO_E_INTERNAL, "box run at byte %llu was passed by the stream",
                               (unsigned long long)start);
        const uint64_t stop = end < off + n ? end : off + n;
        CKPTIO_FORWARD(b->emit(b->ctx, b->dpos + b->done, data + (start - off), (size_t)(stop - start)));
        b->done += stop - start;
        if (b->done < b->run) return CKPTIO_OK; /* continues in the next piece */
        next_run(b);
    }
    return CKPTIO_OK;
}

static ckptio_status stream_sink(void *ctx, const void *data, size_t n, uint64_t offset) {
    return feed(ctx, data, offset, n);
}

ckptio_status ckptio__dcp_emit_box_memory(const ckptio_dcp_layout *lay, const uint8_t *storage,
                                          const int64_t *offsets, const int64_t *sizes, const int64_t *dst_strides,
                                          ckptio__dcp_emit_fn emit, void *ctx) {
    box b;
    const where w = {.path = "<memory>", .fqn = NULL, .offset = 0};
    CKPTIO_FORWARD(plan(&b, lay, offsets, sizes, dst_strides, &w));
    b.emit = emit;
    b.ctx = ctx;
    return feed(&b, storage, lay->storage_start, lay->storage_nbytes);
}

static ckptio_status emit_box(const ckptio_dcp_header *h, const char *fqn, const int64_t *offsets,
                              const int64_t *sizes, const int64_t *dst_strides, ckptio__dcp_emit_fn emit, void *ctx,
                              uint64_t capacity) {
    ckptio__dcp_archive a;
    ckptio_dcp_layout lay;
    CKPTIO_FORWARD(ckptio__dcp_header_archive(h, &a));
    CKPTIO_FORWARD(ckptio_dcp_header_layout(h, fqn, &lay));
    const where w = {.path = a.path, .fqn = fqn, .offset = a.offset};
    box b;
    CKPTIO_FORWARD(plan(&b, &lay, offsets, sizes, dst_strides, &w));
    if (b.runs_left && b.dst_end > capacity)
        return BFAIL(CKPTIO_E_RANGE, a.path, a.offset, fqn, "the destination holds %llu bytes, the box reaches %llu",
                     (unsigned long long)capacity, (unsigned long long)b.dst_end);
    b.emit = emit;
    b.ctx = ctx;
    if (!b.runs_left) return CKPTIO_OK;
    if (a.data) return feed(&b, a.data + lay.storage_start, lay.storage_start, lay.storage_nbytes);
    if (!b.ordered)
        return BFAIL(CKPTIO_E_UNSUPPORTED, a.path, a.offset, fqn,
                     "zstd item: a storage of %llu bytes whose strides overlap is read only when the decoded item "
                     "is at most %llu bytes (this one: %llu)",
                     (unsigned long long)lay.storage_nbytes, (unsigned long long)CKPTIO__DCP_ZSTD_INLINE_MAX,
                     (unsigned long long)a.len);
    ckptio_status st = ckptio_zstd_stream(a.zsrc, a.zlen, a.zlimit, stream_sink, &b, NULL);
    if (st != CKPTIO_OK) return st;
    if (b.runs_left)
        return BFAIL(CKPTIO_E_FORMAT, a.path, a.offset, fqn, "zstd item: the decoded item ended inside the storage");
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_header_emit_box(const ckptio_dcp_header *h, const char *fqn, const int64_t *offsets,
                                          const int64_t *sizes, const int64_t *dst_strides, ckptio__dcp_emit_fn emit,
                                          void *ctx) {
    CKPTIO_RETURN_IF(!h || !offsets || !sizes || !dst_strides || !emit, CKPTIO_E_INVAL,
                     "ckptio__dcp_header_emit_box: bad arguments");
    return emit_box(h, fqn, offsets, sizes, dst_strides, emit, ctx, UINT64_MAX);
}

static ckptio_status copy_out(void *ctx, uint64_t dst, const void *data, size_t n) {
    memcpy((uint8_t *)ctx + dst, data, n);
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_header_read_box(const ckptio_dcp_header *h, const char *fqn, const int64_t *offsets,
                                         const int64_t *sizes, void *dst, const int64_t *dst_strides,
                                         uint64_t capacity) {
    CKPTIO_RETURN_IF(!h || !offsets || !sizes || !dst_strides || (!dst && capacity), CKPTIO_E_INVAL,
                     "ckptio_dcp_header_read_box: header, box, dst and dst_strides are required");
    return emit_box(h, fqn, offsets, sizes, dst_strides, copy_out, dst, capacity);
}
