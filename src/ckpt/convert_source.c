/*
 * convert_source.c - any checkpoint ckptio reads, as the list of tensors a
 * conversion writes: a safetensors file or a Hugging Face directory
 * (ckptio_model: one reader for both), a torch.save file, a DCP directory.
 *
 * Each tensor is described in safetensors terms (the writers' common
 * language: F4 counted in 4-bit values, which torch packs in pairs) and its
 * bytes are read on demand into the writer's buffer, through the engine,
 * never from a mapping: an input that shrinks meanwhile is an error naming
 * it. What a conversion may lose is counted here, so that the caller can say
 * it before anything is written.
 */
#include "convert_internal.h"
#include "io_internal.h"
#include "dcp_dir_internal.h"

#include <string.h>
#include <sys/stat.h>

#define SHAPE_MAX 64 /* dimensions: torch's limit, and every reader's */

/* Containers already counted. A pickle shares containers (its memo) and a
 * few hundred bytes can reach one along 3^60 paths: each is counted once, so
 * the count costs what the file holds, not the tree it expands to. */
typedef struct seen_set {
    const void **slots;
    size_t cap, count; /* cap: a power of two, or 0 */
} seen_set;

/* True the first time `p` is added (and when memory runs out: then counted again). */
static bool seen_first(seen_set *s, const void *p) {
    if (2 * (s->count + 1) > s->cap) {
        const size_t ncap = s->cap ? 2 * s->cap : 256;
        const void **grown = ckptio__calloc(ncap, sizeof *grown);
        if (!grown) return true;
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->slots[i]) continue;
            size_t j = ((uintptr_t)s->slots[i] >> 4) & (ncap - 1);
            while (grown[j]) j = (j + 1) & (ncap - 1);
            grown[j] = s->slots[i];
        }
        ckptio__free(s->slots);
        s->slots = grown;
        s->cap = ncap;
    }
    size_t i = ((uintptr_t)p >> 4) & (s->cap - 1);
    for (; s->slots[i]; i = (i + 1) & (s->cap - 1))
        if (s->slots[i] == p) return false;
    s->slots[i] = p;
    s->count++;
    return true;
}

/* Non-tensor leaves of a torch.save object tree: what a file of tensors
 * (safetensors, DCP without byte items) cannot hold. */
static size_t count_values(const ckptio_value *v, unsigned depth, seen_set *seen) {
    if (depth > 600) return 0; /* the unpickler bounds nesting; this bounds the recursion anyway */
    size_t n = 0, len = 0;
    switch (ckptio_value_kind_of(v)) {
    case CKPTIO_VALUE_TENSOR: return 0;
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_TUPLE:
    case CKPTIO_VALUE_SET:
        if (!seen_first(seen, v)) return 0;
        ckptio_value_len(v, &len);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *item;
            if (ckptio_value_item(v, i, &item) == CKPTIO_OK) n += count_values(item, depth + 1, seen);
        }
        return n;
    case CKPTIO_VALUE_DICT: {
        if (!seen_first(seen, v)) return 0;
        ckptio_value_len(v, &len);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *key, *item;
            if (ckptio_value_dict_item(v, i, &key, &item) == CKPTIO_OK) n += count_values(item, depth + 1, seen);
        }
        const ckptio_value *attrs = NULL;
        if (ckptio_value_dict_attrs(v, &attrs) == CKPTIO_OK && attrs) n += 1;
        return n;
    }
    default: return 1;
    }
}

static ckptio_status alloc_tables(ckptio__convert_source *s, size_t count) {
    s->count = count;
    s->tensors = ckptio__calloc(count + 1, sizeof *s->tensors);
    s->shapes = ckptio__calloc(count * SHAPE_MAX + 1, sizeof *s->shapes);
    s->index = ckptio__calloc(count + 1, sizeof *s->index);
    if (!s->tensors || !s->shapes || !s->index)
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the table of %zu tensors", count);
    return CKPTIO_OK;
}

/* Row i: `shape` in torch's terms when `torch_terms` (F4's last dimension doubled). */
static void set_row(ckptio__convert_source *s, size_t i, size_t index, const char *name, ckptio_dtype dtype,
                    uint32_t ndim, const int64_t *shape, uint64_t nbytes, bool torch_terms) {
    int64_t *row = s->shapes + i * SHAPE_MAX;
    memcpy(row, shape, ndim * sizeof *row);
    if (torch_terms && dtype == CKPTIO_DTYPE_F4 && ndim > 0) row[ndim - 1] *= 2;
    s->tensors[i] = (ckptio_tensor_source){.name = name, .dtype = dtype, .ndim = ndim, .shape = row,
                                           .nbytes = nbytes, .mem_kind = CKPTIO_MEM_HOST};
    s->index[i] = index;
    s->total += nbytes;
    if (nbytes > s->largest) s->largest = nbytes;
}

static ckptio_status open_model(ckptio_engine *engine, const char *path, ckptio__convert_source *s) {
    size_t n = 0, nmeta = 0;
    CKPTIO_FORWARD(ckptio_model_open(engine, path, 0, &s->model));
    ckptio_model_count(s->model, &n);
    CKPTIO_FORWARD(alloc_tables(s, n));
    for (size_t i = 0; i < n; i++) {
        ckptio_tensor_info ti;
        CKPTIO_FORWARD(ckptio_model_tensor(s->model, i, &ti, NULL));
        set_row(s, i, i, ti.name, ti.dtype, ti.ndim, ti.shape, ti.nbytes, false);
    }
    ckptio_model_metadata_count(s->model, &nmeta);
    if (nmeta && !(s->metadata = ckptio__calloc(nmeta, sizeof *s->metadata)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu metadata entries", nmeta);
    for (size_t i = 0; i < nmeta; i++) CKPTIO_FORWARD(ckptio_model_metadata(s->model, i, &s->metadata[i]));
    s->metadata_count = nmeta;
    return CKPTIO_OK;
}

static ckptio_status open_torch(ckptio_engine *engine, const char *path, ckptio__convert_source *s) {
    size_t n = 0, nstorages = 0;
    CKPTIO_FORWARD(ckptio_torch_open(engine, path, &s->torch));
    ckptio_torch_count(s->torch, &n);
    ckptio_torch_storage_count(s->torch, &nstorages);
    CKPTIO_FORWARD(alloc_tables(s, n));
    size_t *users = ckptio__calloc(nstorages + 1, sizeof *users);
    if (!users) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu storages", nstorages);
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; st == CKPTIO_OK && i < n; i++) {
        ckptio_torch_tensor_info ti;
        if ((st = ckptio_torch_tensor(s->torch, i, &ti)) != CKPTIO_OK) break;
        set_row(s, i, i, ti.name, ti.dtype, ti.ndim, ti.shape, ti.nbytes, true);
        if (ti.storage < nstorages) users[ti.storage]++;
    }
    for (size_t i = 0; st == CKPTIO_OK && i < n; i++) {
        ckptio_torch_tensor_info ti;
        ckptio_torch_tensor(s->torch, i, &ti);
        s->shared += ti.storage < nstorages && users[ti.storage] > 1;
    }
    ckptio__free(users);
    const ckptio_value *root = NULL;
    if (st == CKPTIO_OK && ckptio_torch_root(s->torch, &root) == CKPTIO_OK) {
        seen_set seen = {0};
        s->values = count_values(root, 0, &seen);
        ckptio__free(seen.slots);
    }
    return st;
}

static ckptio_status open_dcp(ckptio_engine *engine, const char *path, ckptio__convert_source *s) {
    size_t n = 0;
    CKPTIO_FORWARD(ckptio_dcp_open(engine, path, &s->dcp));
    ckptio_dcp_tensor_count(s->dcp, &n);
    ckptio_dcp_bytes_count(s->dcp, &s->byte_items);
    CKPTIO_FORWARD(alloc_tables(s, n));
    for (size_t i = 0; i < n; i++) {
        ckptio_dcp_tensor_info ti;
        CKPTIO_FORWARD(ckptio_dcp_tensor(s->dcp, i, &ti));
        set_row(s, i, i, ti.fqn, ti.dtype, ti.ndim, ti.shape, ti.nbytes, true);
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__convert_source_open(ckptio_engine *engine, const char *path, ckptio__convert_source *out) {
    memset(out, 0, sizeof *out);
    CKPTIO_RETURN_IF(!engine || !path, CKPTIO_E_INVAL, "ckptio_convert: engine and input path are required");
    ckptio_format format;
    CKPTIO_FORWARD(ckptio_format_detect(path, &format));
    ckptio_status st;
    switch (format) {
    case CKPTIO_FORMAT_SAFETENSORS:
    case CKPTIO_FORMAT_HF_INDEX:
    case CKPTIO_FORMAT_DIRECTORY:
        /* ckptio_model_open says what a directory without safetensors files lacks. */
        out->format = format == CKPTIO_FORMAT_SAFETENSORS ? format : CKPTIO_FORMAT_HF_INDEX;
        st = open_model(engine, path, out);
        break;
    /* A legacy file too: the torch reader says why it refuses it. */
    case CKPTIO_FORMAT_TORCH:
    case CKPTIO_FORMAT_TORCH_LEGACY:
        out->format = CKPTIO_FORMAT_TORCH;
        st = open_torch(engine, path, out);
        break;
    case CKPTIO_FORMAT_DCP:
        out->format = format;
        st = open_dcp(engine, path, out);
        break;
    default: {
        /* The words of ckptio's other commands for a file no reader takes. */
        struct stat sb;
        uint64_t object_size = 0;
        ckptio__path_kind kind;
        const unsigned long long size =
            ckptio__s3_is_url(path) ? (ckptio__object_stat(engine, path, &kind, &object_size), object_size)
            : stat(path, &sb) == 0  ? (unsigned long long)sb.st_size
                                    : 0;
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                             "not a checkpoint ckptio can read: neither a safetensors file nor a torch.save archive "
                             "(%llu bytes), nor a DCP or Hugging Face directory", size);
    }
    }
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio__convert_source_close(out);
        ckptio__error_restore(saved);
    }
    return st;
}

ckptio_status ckptio__convert_source_fill(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    ckptio__convert_source *s = ctx;
    const size_t k = s->index[i];
    if (s->model) {
        const ckptio_slice_target tg = {.index = k, .data = buf, .capacity = nbytes, .mem_kind = CKPTIO_MEM_HOST};
        return ckptio_model_read(s->model, &tg, 1);
    }
    if (s->torch) {
        const ckptio_tensor_target tg = {.index = k, .data = buf, .capacity = nbytes, .mem_kind = CKPTIO_MEM_HOST};
        return ckptio_torch_read(s->torch, &tg, 1); /* gathers strided views */
    }
    return ckptio_dcp_read_tensor(s->dcp, k, buf, nbytes);
}

ckptio_status ckptio__convert_source_bytes(void *ctx, size_t j, const char **fqn, void **data, uint64_t *len) {
    ckptio__convert_source *s = ctx;
    ckptio_dcp_bytes_info bi;
    CKPTIO_FORWARD(ckptio_dcp_bytes(s->dcp, j, &bi));
    CKPTIO_FORWARD(ckptio__dcp_check_bytes(s->dcp, j));
    *fqn = bi.fqn;
    return ckptio__dcp_load_bytes(s->dcp, j, data, len);
}

ckptio_status ckptio__convert_source_check_held(const ckptio__convert_source *s, const char *path) {
    for (size_t i = 0; i < s->count; i++) {
        const ckptio_tensor_source *t = &s->tensors[i];
        const ckptio__err_ctx at = {.path = path, .subject = t->name, .file_offset = -1};
        if (s->torch) {
            ckptio_torch_tensor_info ti;
            ckptio_torch_storage_info si;
            CKPTIO_FORWARD(ckptio_torch_tensor(s->torch, s->index[i], &ti));
            CKPTIO_FORWARD(ckptio_torch_storage(s->torch, ti.storage, &si));
            if (ti.nbytes > si.nbytes)
                return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &at, "tensor '%s' is a view of %llu bytes over a storage "
                                       "of %llu (an expanded view): a torch.save or DCP output holds each tensor "
                                       "whole in memory, more than the file's bytes justify; convert it to "
                                       "safetensors or a Hugging Face directory, which write such views in runs",
                                       t->name, (unsigned long long)ti.nbytes, (unsigned long long)si.nbytes);
        } else if (s->dcp) {
            bool streamed = false;
            CKPTIO_FORWARD(ckptio__dcp_convert_plan(s->dcp, s->index[i], &streamed));
            if (streamed)
                return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &at, "tensor '%s' is stored zstd-compressed and is %llu "
                                       "bytes by .metadata: a torch.save or DCP output holds each tensor whole in "
                                       "memory, which the compressed bytes on disk do not justify; convert it to "
                                       "safetensors or a Hugging Face directory, which stream it from its frames",
                                       t->name, (unsigned long long)t->nbytes);
        }
    }
    return CKPTIO_OK;
}

void ckptio__convert_source_close(ckptio__convert_source *s) {
    ckptio_model_close(s->model);
    ckptio_torch_close(s->torch);
    ckptio_dcp_close(s->dcp);
    ckptio__free(s->metadata);
    ckptio__free(s->tensors);
    ckptio__free(s->shapes);
    ckptio__free(s->index);
    memset(s, 0, sizeof *s);
}
