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
#include "engine_internal.h"
#include "model_internal.h"
#include "safetensors_internal.h"
#include "torch_internal.h"

#include <string.h>

ckptio_status ckptio__st_save_streamed(ckptio_engine *engine, const char *path, const ckptio_tensor_source *tensors,
                                       size_t count, const ckptio_kv *metadata, size_t metadata_count, unsigned flags,
                                       ckptio__fill_fn fill, void *ctx) {
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
        if (tensors[i].nbytes > largest) largest = tensors[i].nbytes;
    }
    if ((st = ckptio__st_layout_build(src, count, metadata, metadata_count, flags, path, &layout)) != CKPTIO_OK) goto out;
    if (largest > SIZE_MAX / 2 || !(buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, largest ? (size_t)largest : 1))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the largest tensor (%llu bytes)", (unsigned long long)largest);
        goto out;
    }
    if ((st = ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE, &file)) != CKPTIO_OK) goto out;
    if ((st = ckptio_file_truncate(file, layout.header_size + layout.data_size)) != CKPTIO_OK) goto out;
    if ((st = ckptio__file_io(file, CKPTIO_WRITE, layout.header, layout.header_size, 0)) != CKPTIO_OK) goto out;
    for (size_t i = 0; i < count; i++) {
        if (tensors[i].nbytes == 0) continue;
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
} torch_source;

static ckptio_status fill_from_torch(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const torch_source *s = ctx;
    const ckptio_tensor_target tg = {.index = s->index[i], .data = buf, .capacity = nbytes, .mem_kind = CKPTIO_MEM_HOST};
    return ckptio_torch_read(s->t, &tg, 1); /* gathers strided views */
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
    ckptio_status st = CKPTIO_OK;
    if (!src || !shapes || !index) {
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
    }
    torch_source ctx = {.t = t, .index = index};
    st = ckptio__st_save_streamed(t->engine, path, src, count, metadata, metadata_count, flags, fill_from_torch, &ctx);
out:
    ckptio__free(index);
    ckptio__free(shapes);
    ckptio__free(src);
    return st;
}

/* ---- safetensors files and models -> torch.save ------------------------------------------- */

/* The tensor descriptions of a source of `count` tensors: info(source, i). */
typedef const ckptio_tensor_info *(*info_fn)(const void *source, size_t i);

/* A flat torch.save of `count` tensors described by info(source, i) and
 * filled by fill(source, i, ...): storage id i is tensor i
 * (ckptio__torch_flat_writer). No data is bound: it is filled. */
static ckptio_status save_flat_torch(ckptio_engine *engine, const char *path, size_t count, info_fn info,
                                     ckptio__fill_fn fill, void *source, const ckptio_torch_save_options *options) {
    ckptio_torch_writer *w = NULL;
    ckptio_status status = CKPTIO_OK;
    ckptio_tensor_source *src = ckptio__calloc(count + 1, sizeof *src);
    if (!src) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", count);
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_info *ti = info(source, i);
        src[i] = (ckptio_tensor_source){.name = ti->name, .dtype = ti->dtype, .ndim = ti->ndim, .shape = ti->shape,
                                        .nbytes = ti->nbytes, .mem_kind = CKPTIO_MEM_HOST};
    }
    if ((status = ckptio__torch_flat_writer(path, src, count, &w)) == CKPTIO_OK)
        status = ckptio__torch_save_streamed(engine, path, w, options, fill, source);
    ckptio_torch_writer_destroy(w);
    ckptio__free(src);
    return status;
}

static const ckptio_tensor_info *safetensors_info(const void *st, size_t i) {
    return &((const ckptio_safetensors *)st)->tensors[i];
}

static ckptio_status fill_from_safetensors(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const ckptio_tensor_target tg = {.index = i, .data = buf, .capacity = nbytes, .mem_kind = CKPTIO_MEM_HOST};
    return ckptio_safetensors_read(ctx, &tg, 1);
}

ckptio_status ckptio_safetensors_save_torch(ckptio_safetensors *st, const char *path,
                                            const ckptio_torch_save_options *options) {
    CKPTIO_RETURN_IF(!st || !path, CKPTIO_E_INVAL, "ckptio_safetensors_save_torch: handle and path are required");
    CKPTIO_RETURN_IF(!st->engine, CKPTIO_E_INVAL,
                     "ckptio_safetensors_save_torch: the handle was made by ckptio_safetensors_parse and has no file");
    return save_flat_torch(st->engine, path, st->count, safetensors_info, fill_from_safetensors, st, options);
}

static const ckptio_tensor_info *model_info(const void *m, size_t i) { return ckptio__model_info(m, i); }

static ckptio_status fill_from_model(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const ckptio_slice_target tg = {.index = i, .data = buf, .capacity = nbytes, .mem_kind = CKPTIO_MEM_HOST};
    return ckptio_model_read(ctx, &tg, 1);
}

ckptio_status ckptio_model_save_torch(ckptio_model *m, const char *path, const ckptio_torch_save_options *options) {
    CKPTIO_RETURN_IF(!m || !path, CKPTIO_E_INVAL, "ckptio_model_save_torch: model and path are required");
    return save_flat_torch(m->engine, path, m->count, model_info, fill_from_model, m, options);
}
