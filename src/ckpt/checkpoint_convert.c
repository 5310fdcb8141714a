/*
 * checkpoint_convert.c - torch.save <-> safetensors conversion in bounded
 * memory, every byte of the input read through the engine.
 *
 * The input is never memory-mapped: a mapped file that shrinks while it is
 * being copied kills the process with SIGBUS (or fails a write with EFAULT)
 * and leaves the output's temporary behind. Reading one tensor at a time
 * into one buffer turns the same event into CKPTIO_E_TRUNCATED naming the
 * input, and the unfinished output is removed like any failed save. The
 * output is laid out by the same code as ckptio_safetensors_save /
 * ckptio_torch_save_tensors, so the files are the ones those would write.
 */
#include "convert_internal.h"
#include "dcp_dir_internal.h"
#include "engine_internal.h"
#include "safetensors_internal.h"
#include "torch_internal.h"

#include <string.h>

/* ---- writing a tensor in runs ------------------------------------------------------- */

/* Staging of runs on their way to the output: host memory whatever the tensor's size. */
#define STAGE_BYTES ((size_t)8 << 20)
#define STAGE_EXTENTS 4096u

typedef struct stage {
    ckptio_file *file;
    uint64_t base;          /* the tensor's first byte in the file */
    uint8_t *buf;
    size_t used;
    ckptio_extent x[STAGE_EXTENTS];
    size_t nx;
} stage;

static bool all_zero(const uint8_t *p, uint64_t n) {
    uint64_t word = 0;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&word, p, 8);
        if (word) return false;
    }
    for (; n; p++, n--)
        if (*p) return false;
    return true;
}

static ckptio_status stage_flush(stage *s) {
    size_t kept = 0;
    for (size_t i = 0; i < s->nx; i++)
        if (!all_zero(s->x[i].memory, s->x[i].length)) s->x[kept++] = s->x[i];
    const ckptio_status st =
        kept ? ckptio_engine_execute_extents(ckptio__file_engine(s->file), CKPTIO_WRITE, s->x, kept) : CKPTIO_OK;
    s->used = 0;
    s->nx = 0;
    return st;
}

static ckptio_status stage_emit(void *ctx, uint64_t dst, const void *data, size_t n) {
    stage *s = ctx;
    const uint8_t *p = data;
    while (n) {
        if (s->used == STAGE_BYTES) CKPTIO_FORWARD(stage_flush(s));
        const size_t take = n < STAGE_BYTES - s->used ? n : STAGE_BYTES - s->used;
        ckptio_extent *last = s->nx ? &s->x[s->nx - 1] : NULL;
        if (last && last->file_offset + last->length == s->base + dst &&
            (uint8_t *)last->memory + last->length == s->buf + s->used) {
            last->length += take;
        } else if (s->nx == STAGE_EXTENTS) {
            CKPTIO_FORWARD(stage_flush(s));
            continue;
        } else {
            s->x[s->nx++] = (ckptio_extent){.file = s->file, .file_offset = s->base + dst, .length = take,
                                            .memory = s->buf + s->used, .mem_kind = CKPTIO_MEM_HOST};
        }
        memcpy(s->buf + s->used, p, take);
        s->used += take;
        p += take;
        dst += take;
        n -= take;
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__write_staged(ckptio_file *file, uint64_t base, ckptio__produce_fn produce, void *ctx) {
    stage *s = ckptio__calloc(1, sizeof *s);
    if (s) s->buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, STAGE_BYTES);
    if (!s || !s->buf) {
        ckptio__free(s);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for staging");
    }
    s->file = file;
    s->base = base;
    ckptio_status st = produce(ctx, stage_emit, s);
    if (st == CKPTIO_OK) st = stage_flush(s);
    ckptio__free(s->buf);
    ckptio__free(s);
    return st;
}

ckptio_status ckptio__st_save_streamed(ckptio_engine *engine, const char *path, const ckptio_tensor_source *tensors,
                                       size_t count, const ckptio_kv *metadata, size_t metadata_count, unsigned flags,
                                       ckptio__fill_fn fill, const bool *self_written, ckptio__write_fn write,
                                       void *ctx) {
    static const uint8_t placeholder = 0; /* the layout checks data != NULL; it is never read */
    ckptio__st_layout layout = {0};
    ckptio_tensor_source *src = ckptio__calloc(count + 1, sizeof *src);
    ckptio_file *file = NULL;
    void *buf = NULL;
    ckptio_status st = CKPTIO_OK;
    if (!src) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", count);
        goto out;
    }
    uint64_t largest = 0;
    for (size_t i = 0; i < count; i++) {
        src[i] = tensors[i];
        src[i].data = &placeholder;
        src[i].mem_kind = CKPTIO_MEM_HOST;
        if (tensors[i].nbytes > largest && !(self_written && self_written[i])) largest = tensors[i].nbytes;
    }
    if ((st = ckptio__st_layout_build(src, count, metadata, metadata_count, flags, path, &layout)) != CKPTIO_OK)
        goto out;
    if (largest > SIZE_MAX / 2 || !(buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, largest ? (size_t)largest : 1))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the largest tensor (%llu bytes)",
                         (unsigned long long)largest);
        goto out;
    }
    if ((st = ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE, &file)) != CKPTIO_OK) goto out;
    if ((st = ckptio_file_truncate(file, layout.header_size + layout.data_size)) != CKPTIO_OK) goto out;
    if ((st = ckptio__file_io(file, CKPTIO_WRITE, layout.header, layout.header_size, 0)) != CKPTIO_OK) goto out;
    for (size_t i = 0; i < count; i++) {
        if (tensors[i].nbytes == 0) continue;
        if (self_written && self_written[i]) {
            st = write(ctx, i, file, layout.header_size + layout.offsets[i], tensors[i].nbytes);
            if (st != CKPTIO_OK) goto out;
            continue;
        }
        if ((st = fill(ctx, i, buf, tensors[i].nbytes)) != CKPTIO_OK) goto out;
        const ckptio_extent x = {.file = file, .file_offset = layout.header_size + layout.offsets[i],
                                 .length = tensors[i].nbytes, .memory = buf, .mem_kind = CKPTIO_MEM_HOST};
        if ((st = ckptio_engine_execute_extents(engine, CKPTIO_WRITE, &x, 1)) != CKPTIO_OK) goto out;
    }
    st = ckptio_file_commit(file);
out:
    if (file) {
        /* Without a commit, close removes the temporary: nothing appears under `path`. */
        ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
        const ckptio_status cs = ckptio_file_close(file);
        if (saved) ckptio__error_restore(saved);
        else if (st == CKPTIO_OK) st = cs;
    }
    ckptio__free(buf);
    ckptio__free(src);
    ckptio__st_layout_cleanup(&layout);
    return st;
}

/* ---- torch.save -> safetensors ------------------------------------------------------- */

typedef struct torch_source {
    ckptio_torch *t;
    const size_t *index; /* source i is tensor index[i] of t */
    size_t current;      /* the source being written (write_from_torch) */
} torch_source;

static ckptio_status fill_from_torch(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const torch_source *s = ctx;
    const ckptio_tensor_target tg = {.index = s->index[i], .data = buf, .capacity = nbytes,
                                     .mem_kind = CKPTIO_MEM_HOST};
    return ckptio_torch_read(s->t, &tg, 1); /* gathers strided views */
}

/* A view that reaches more bytes than its storage holds (strides of 0: an
 * expanded tensor) is written in runs from its storage, never gathered into
 * one buffer: 1.5 KB of file may describe gigabytes of such a view. */
static ckptio_status produce_from_torch(void *ctx, ckptio__emit_fn emit, void *emit_ctx) {
    const torch_source *s = ctx;
    ckptio_torch_tensor_info ti;
    ckptio_torch_storage_info si;
    CKPTIO_FORWARD(ckptio_torch_tensor(s->t, s->index[s->current], &ti));
    CKPTIO_FORWARD(ckptio_torch_storage(s->t, ti.storage, &si));
    ckptio_dcp_layout lay = {.dtype = ti.dtype, .ndim = ti.ndim, .storage_offset = ti.storage_offset,
                             .storage_nbytes = si.nbytes};
    int64_t zeros[CKPTIO_DCP_MAX_NDIM] = {0}, dst_stride[CKPTIO_DCP_MAX_NDIM];
    int64_t acc = 1;
    for (uint32_t d = ti.ndim; d-- > 0;) { /* ndim <= 64: checked by the unpickler */
        lay.shape[d] = ti.shape[d];
        lay.stride[d] = ti.stride[d];
        dst_stride[d] = acc;
        acc *= ti.shape[d];
    }
    void *storage = ckptio__malloc(si.nbytes ? si.nbytes : 1); /* a record of the file: its bytes are there */
    if (!storage) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a storage of %llu bytes",
                                     (unsigned long long)si.nbytes);
    const ckptio_tensor_target tg = {.index = ti.storage, .data = storage, .capacity = si.nbytes,
                                     .mem_kind = CKPTIO_MEM_HOST};
    ckptio_status st = ckptio_torch_read_storages(s->t, &tg, 1);
    if (st == CKPTIO_OK) st = ckptio__dcp_emit_box_memory(&lay, storage, zeros, ti.shape, dst_stride, emit, emit_ctx);
    ckptio__free(storage);
    return st;
}

static ckptio_status write_from_torch(void *ctx, size_t i, ckptio_file *file, uint64_t file_offset, uint64_t nbytes) {
    (void)nbytes;
    torch_source *s = ctx;
    s->current = i;
    return ckptio__write_staged(file, file_offset, produce_from_torch, s);
}

ckptio_status ckptio_torch_save_safetensors(ckptio_torch *t, const char *path, const size_t *tensors, size_t count,
                                            const ckptio_kv *metadata, size_t metadata_count, unsigned flags) {
    CKPTIO_RETURN_IF(!t || !path, CKPTIO_E_INVAL, "ckptio_torch_save_safetensors: handle and path are required");
    CKPTIO_RETURN_IF(!t->engine, CKPTIO_E_INVAL,
                     "ckptio_torch_save_safetensors: the handle was made by ckptio_torch_parse and has no engine");
    CKPTIO_RETURN_IF(flags & ~(unsigned)CKPTIO_SAFETENSORS_ALIGN_8, CKPTIO_E_INVAL,
                     "ckptio_torch_save_safetensors: unknown flags 0x%x", flags);
    if (!tensors) count = t->ntensors;
    ckptio_tensor_source *src = ckptio__calloc(count + 1, sizeof *src);
    int64_t *shapes = ckptio__calloc(count * 64 + 1, sizeof *shapes);
    size_t *index = ckptio__calloc(count + 1, sizeof *index);
    bool *expanded = ckptio__calloc(count + 1, sizeof *expanded);
    ckptio_status st = CKPTIO_OK;
    if (!src || !shapes || !index || !expanded) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", count);
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        index[i] = tensors ? tensors[i] : i;
        ckptio_torch_tensor_info ti;
        if ((st = ckptio_torch_tensor(t, index[i], &ti)) != CKPTIO_OK) goto out;
        int64_t *shape = shapes + i * 64;
        memcpy(shape, ti.shape, ti.ndim * sizeof *shape); /* ndim <= 64: checked by the unpickler */
        /* torch counts float4_e2m1fn_x2 in packed pairs, safetensors F4 in values. */
        if (ti.dtype == CKPTIO_DTYPE_F4 && ti.ndim > 0) shape[ti.ndim - 1] *= 2;
        src[i] = (ckptio_tensor_source){.name = ti.name, .dtype = ti.dtype, .ndim = ti.ndim, .shape = shape,
                                        .nbytes = ti.nbytes, .mem_kind = CKPTIO_MEM_HOST};
        ckptio_torch_storage_info si;
        if ((st = ckptio_torch_storage(t, ti.storage, &si)) != CKPTIO_OK) goto out;
        expanded[i] = ti.nbytes > si.nbytes;
    }
    torch_source ctx = {.t = t, .index = index};
    st = ckptio__st_save_streamed(t->engine, path, src, count, metadata, metadata_count, flags, fill_from_torch,
                                  expanded, write_from_torch, &ctx);
out:
    ckptio__free(expanded);
    ckptio__free(index);
    ckptio__free(shapes);
    ckptio__free(src);
    return st;
}

/* ---- safetensors -> torch.save ------------------------------------------------------- */

static ckptio_status fill_from_safetensors(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const ckptio_tensor_target tg = {.index = i, .data = buf, .capacity = nbytes, .mem_kind = CKPTIO_MEM_HOST};
    return ckptio_safetensors_read(ctx, &tg, 1);
}

ckptio_status ckptio_safetensors_save_torch(ckptio_safetensors *st, const char *path,
                                            const ckptio_torch_save_options *options) {
    CKPTIO_RETURN_IF(!st || !path, CKPTIO_E_INVAL, "ckptio_safetensors_save_torch: handle and path are required");
    CKPTIO_RETURN_IF(!st->engine, CKPTIO_E_INVAL,
                     "ckptio_safetensors_save_torch: the handle was made by ckptio_safetensors_parse and has no file");
    ckptio_torch_writer *w = NULL;
    ckptio_status status = CKPTIO_OK;
    ckptio_tensor_source *src = ckptio__calloc(st->count + 1, sizeof *src);
    if (!src) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", st->count);
    /* Storage id i is tensor i (ckptio__torch_flat_writer), so the fill
     * reads safetensors tensor i. No data is bound: it is filled. */
    for (size_t i = 0; i < st->count; i++) {
        const ckptio_tensor_info *ti = &st->tensors[i];
        src[i] = (ckptio_tensor_source){.name = ti->name, .dtype = ti->dtype, .ndim = ti->ndim, .shape = ti->shape,
                                        .nbytes = ti->nbytes, .mem_kind = CKPTIO_MEM_HOST};
    }
    if ((status = ckptio__torch_flat_writer(path, src, st->count, &w)) == CKPTIO_OK)
        status = ckptio__torch_save_streamed(st->engine, path, w, options, fill_from_safetensors, st);
    ckptio_torch_writer_destroy(w);
    ckptio__free(src);
    return status;
}
