/*
 * dcp_convert.c - consolidating a DCP directory's tensors into one
 * safetensors file in bounded memory.
 *
 * ckptio_safetensors_save() takes every tensor's memory at once; a
 * checkpoint larger than host memory cannot be handed over that way. The
 * streamed writer of checkpoint_convert.c lays the file out with the same
 * code and asks for the tensors one at a time: each is assembled from its
 * chunks into a single buffer and written at its offset in the atomic
 * temporary, which is committed at the end.
 *
 * That buffer is sized by what .metadata declares, so it must be justified
 * by bytes on disk: every chunk of such a tensor is an untransformed item
 * holding at least the chunk's bytes inside its file, or a zstd item of a
 * tensor of at most CKPTIO__DCP_ZSTD_INLINE_MAX bytes. A larger tensor with
 * zstd chunks (146 KB of frames may decode to 4 GiB) is never held: its
 * chunks stream from their frames to the output through a fixed staging
 * buffer (ckptio__dcp_emit_tensor, ckptio__write_staged), and staged pieces
 * that are all zeros are not written, since the new output reads as zeros
 * there already.
 */
#include "convert_internal.h"
#include "dcp_dir_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct dcp_source {
    ckptio_dcp *h;
    const size_t *tensors; /* NULL: source i is tensor i */
    size_t current;        /* the source being written (write_from_dcp) */
} dcp_source;

static ckptio_status fill_from_dcp(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const dcp_source *s = ctx;
    return ckptio_dcp_read_tensor(s->h, s->tensors ? s->tensors[i] : i, buf, nbytes);
}

static ckptio_status produce_from_dcp(void *ctx, ckptio__emit_fn emit, void *emit_ctx) {
    const dcp_source *src = ctx;
    return ckptio__dcp_emit_tensor(src->h, src->tensors ? src->tensors[src->current] : src->current, emit, emit_ctx);
}

static ckptio_status write_from_dcp(void *ctx, size_t i, ckptio_file *file, uint64_t file_offset, uint64_t nbytes) {
    (void)nbytes; /* the chunks tile exactly nbytes (checked before anything is emitted) */
    dcp_source *src = ctx;
    src->current = i;
    return ckptio__write_staged(file, file_offset, produce_from_dcp, src);
}

/* Where an uncompressed chunk's item lies, for the disjointness check. */
typedef struct placed {
    size_t file, chunk;
    uint64_t offset, length;
} placed;

static int cmp_placed(const void *a, const void *b) {
    const placed *x = a, *y = b;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->chunk < y->chunk ? -1 : x->chunk > y->chunk;
}

/* Whether tensor t is streamed (a zstd chunk in a tensor too large to hold);
 * else that the buffer its bytes need is justified by bytes on disk: each
 * uncompressed chunk's item lies in its file, holds at least the chunk's
 * bytes, and shares none of them with another chunk's item (which would let
 * one stored range stand for many chunks). */
static ckptio_status plan_tensor(ckptio_dcp *h, const ckptio__dcp_tensor *t, bool *streamed) {
    bool zstd = false;
    for (size_t c = 0; c < t->nchunks; c++) zstd |= (t->stored[c].transforms & CKPTIO_DCP_TRANSFORM_ZSTD) != 0;
    *streamed = zstd && t->nbytes > CKPTIO__DCP_ZSTD_INLINE_MAX;
    if (*streamed) return CKPTIO_OK;
    const uint64_t es = ckptio__dcp_element_size(t->dtype);
    placed *at = ckptio__calloc(t->nchunks + 1, sizeof *at);
    if (!at) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu chunks", t->nchunks);
    size_t n = 0;
    ckptio_status st = CKPTIO_OK;
    for (size_t c = 0; c < t->nchunks && st == CKPTIO_OK; c++) {
        const ckptio_dcp_stored *s = &t->stored[c];
        ckptio_file *f = NULL;
        if ((st = ckptio__dcp_item_bounds(h, s, t->fqn, &f)) != CKPTIO_OK) break;
        if (s->transforms & CKPTIO_DCP_TRANSFORM_ZSTD) continue; /* the tensor is at most 64 MiB */
        uint64_t bytes = es;
        for (uint32_t d = 0; d < t->ndim; d++) bytes *= (uint64_t)t->sizes[c * t->ndim + d]; /* <= nbytes */
        if (bytes > s->length)
            st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                                 &((ckptio__err_ctx){.operation = "read DCP item", .path = ckptio_file_path(f),
                                                     .file_offset = (int64_t)s->offset, .subject = t->fqn}),
                                 "chunk %zu is %llu bytes by .metadata, more than its item of %llu bytes can hold", c,
                                 (unsigned long long)bytes, (unsigned long long)s->length);
        else if (bytes)
            at[n++] = (placed){.file = ckptio__dcp_file_index(h, s->file), .chunk = c, .offset = s->offset,
                               .length = s->length};
    }
    if (st == CKPTIO_OK && n > 1) qsort(at, n, sizeof *at, cmp_placed);
    for (size_t k = 1; st == CKPTIO_OK && k < n; k++) {
        ckptio_file *f = NULL;
        if (at[k].file != at[k - 1].file || at[k].offset >= at[k - 1].offset + at[k - 1].length) continue;
        if ((st = ckptio__dcp_file(h, at[k].file, &f, NULL)) == CKPTIO_OK) /* opened above */
            st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                                 &((ckptio__err_ctx){.operation = "read DCP item", .path = ckptio_file_path(f),
                                                     .file_offset = (int64_t)at[k].offset, .subject = t->fqn}),
                                 "chunks %zu and %zu are stored in overlapping bytes of the file ([%llu, +%llu) and "
                                 "[%llu, +%llu))",
                                 at[k - 1].chunk, at[k].chunk, (unsigned long long)at[k - 1].offset,
                                 (unsigned long long)at[k - 1].length, (unsigned long long)at[k].offset,
                                 (unsigned long long)at[k].length);
    }
    ckptio__free(at);
    return st;
}

ckptio_status ckptio__dcp_convert_plan(ckptio_dcp *h, size_t index, bool *streamed) {
    CKPTIO_RETURN_IF(index >= h->ntensors, CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)", index,
                     h->ntensors);
    return plan_tensor(h, &h->tensors[index], streamed);
}

ckptio_status ckptio_dcp_save_safetensors(ckptio_dcp *h, const char *path, const size_t *tensors, size_t count,
                                          const ckptio_kv *metadata, size_t metadata_count, unsigned flags) {
    CKPTIO_RETURN_IF(!h || !path, CKPTIO_E_INVAL, "ckptio_dcp_save_safetensors: handle and path are required");
    CKPTIO_RETURN_IF(flags & ~(unsigned)CKPTIO_SAFETENSORS_ALIGN_8, CKPTIO_E_INVAL,
                     "ckptio_dcp_save_safetensors: unknown flags 0x%x", flags);
    if (!tensors) count = h->ntensors;
    for (size_t i = 0; tensors && i < count; i++)
        CKPTIO_RETURN_IF(tensors[i] >= h->ntensors, CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)",
                         tensors[i], h->ntensors);
    ckptio_tensor_source *src = ckptio__calloc(count + 1, sizeof *src);
    int64_t *shapes = ckptio__calloc(count * 64 + 1, sizeof *shapes);
    bool *streamed = ckptio__calloc(count + 1, sizeof *streamed);
    ckptio_status st = CKPTIO_OK;
    if (!src || !shapes || !streamed) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", count);
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        const ckptio__dcp_tensor *t = &h->tensors[tensors ? tensors[i] : i];
        if ((st = plan_tensor(h, t, &streamed[i])) != CKPTIO_OK) goto out;
        int64_t *shape = shapes + i * 64;
        memcpy(shape, t->shape, t->ndim * sizeof *shape);
        /* torch counts float4_e2m1fn_x2 in packed pairs, safetensors F4 in values. */
        if (t->dtype == CKPTIO_DTYPE_F4 && t->ndim > 0) shape[t->ndim - 1] *= 2;
        src[i] = (ckptio_tensor_source){.name = t->fqn, .dtype = t->dtype, .ndim = t->ndim, .shape = shape,
                                        .nbytes = t->nbytes, .mem_kind = CKPTIO_MEM_HOST};
    }
    dcp_source ctx = {.h = h, .tensors = tensors};
    st = ckptio__st_save_streamed(h->engine, path, src, count, metadata, metadata_count, flags, fill_from_dcp, streamed,
                                  write_from_dcp, &ctx);
out:
    ckptio__free(streamed);
    ckptio__free(shapes);
    ckptio__free(src);
    return st;
}
