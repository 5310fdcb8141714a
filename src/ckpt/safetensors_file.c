/*
 * safetensors_file.c - safetensors files through the engine: open (read
 * and validate the header), read tensors, read the whole data section, and
 * save atomically.
 *
 * The format code (src/format/safetensors_*.c) decides what the bytes are;
 * this file only moves them. Tensor data always travels as one plan so that
 * the engine can spread it over its workers and overlap GPU copies.
 */
#include "engine_internal.h"
#include "manifest_internal.h"
#include "model_internal.h"
#include "safetensors_internal.h"

#include <string.h>

#define ST_FAIL CKPTIO__ST_FAIL
#define HEAD_WINDOW ((uint64_t)64 << 10) /* an object's first GET at open */

ckptio_status ckptio_safetensors_open(ckptio_engine *engine, const char *path, ckptio_safetensors **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_open: out must not be NULL");
    *out = NULL;
    if (!engine || !path) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_open: engine and path are required");
    ckptio_status status = CKPTIO_OK;
    char *header = NULL;
    unsigned char *window = NULL;
    uint64_t in_window = 0;
    ckptio_safetensors *st = ckptio__calloc(1, sizeof *st);
    if (!st || !(st->path = ckptio__strdup(path)) || !(window = ckptio__malloc((size_t)HEAD_WINDOW))) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %s", path);
        goto out;
    }
    st->engine = engine;
    /* The open brings the file's first HEAD_WINDOW bytes (an object's open is
     * that one GET, no HEAD: ckptio_file_open_window). They hold the 8-byte
     * length and, in most files, the whole header; the header allocation is
     * bounded by both the 100 MB cap and the real file size. A local file's
     * window is its 8-byte length alone: there a read costs the bytes it
     * copies, not a round trip, and the data is read once, by its plan. */
    const uint64_t window_len = ckptio__s3_is_url(path) ? HEAD_WINDOW : CKPTIO__ST_PREFIX;
    status = ckptio_file_open_window(engine, path, window, window_len, &in_window, &st->file);
    if (status != CKPTIO_OK) goto out;
    if ((status = ckptio_file_size(st->file, &st->file_size)) != CKPTIO_OK) goto out;

    unsigned char prefix[CKPTIO__ST_PREFIX] = {0};
    if (in_window >= CKPTIO__ST_PREFIX) memcpy(prefix, window, sizeof prefix);
    if (status == CKPTIO_OK) status = ckptio__st_check_prefix(prefix, st->file_size, path, &st->header_len);
    if (status == CKPTIO_OK) {
        st->data_offset = CKPTIO__ST_PREFIX + st->header_len;
        if (!(header = ckptio__malloc((size_t)st->header_len + 1)))
            status = CKPTIO_FAIL_CTX(CKPTIO_E_NOMEM, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                                     "out of memory for the %llu-byte header", (unsigned long long)st->header_len);
    }
    if (status == CKPTIO_OK) {
        /* What the window holds is copied; the rest, if any, is read. */
        const uint64_t have = in_window > CKPTIO__ST_PREFIX ? in_window - CKPTIO__ST_PREFIX : 0;
        const uint64_t copied = have < st->header_len ? have : st->header_len;
        if (copied) memcpy(header, window + CKPTIO__ST_PREFIX, (size_t)copied);
        if (copied < st->header_len)
            status = ckptio__file_io(st->file, CKPTIO_READ, header + copied, st->header_len - copied,
                                     CKPTIO__ST_PREFIX + copied);
    }
    if (status != CKPTIO_OK) goto out;
    header[st->header_len] = '\0';
    status = ckptio__st_index(st, header);

out:
    ckptio__free(window);
    ckptio__free(header);
    if (status != CKPTIO_OK) {
        if (st) {
            ckptio__error_saved *saved = ckptio__error_save();
            ckptio_file_close(st->file);
            ckptio__error_restore(saved);
            ckptio__st_destroy(st);
        }
        return status;
    }
    *out = st;
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_close(ckptio_safetensors *st) {
    if (!st) return CKPTIO_OK;
    ckptio_status status = ckptio_file_close(st->file);
    ckptio__st_destroy(st);
    return status;
}

static ckptio_status need_file(const ckptio_safetensors *st, const char *fn) {
    if (!st) return CKPTIO_FAIL(CKPTIO_E_INVAL, "%s: the handle is NULL", fn);
    if (!st->file)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "%s: the handle was made by ckptio_safetensors_parse and has no file", fn);
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_read(ckptio_safetensors *st, const ckptio_tensor_target *targets, size_t count) {
    CKPTIO_FORWARD(need_file(st, "ckptio_safetensors_read"));
    if (count && !targets)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_read: targets is NULL but count is %zu", count);
    /* Check every target before moving a byte. */
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_target *t = &targets[i];
        if (t->index >= st->count)
            return ST_FAIL(CKPTIO_E_RANGE, st->path, -1, NULL, NULL,
                           "target %zu asks for tensor index %zu but the file has %zu tensors", i, t->index, st->count);
        const ckptio_tensor_info *info = &st->tensors[t->index];
        if (t->capacity < info->nbytes)
            return ST_FAIL(CKPTIO_E_RANGE, st->path, -1, "tensor", info->name,
                           "target %zu has room for %llu bytes but the tensor is %llu bytes", i,
                           (unsigned long long)t->capacity, (unsigned long long)info->nbytes);
        if (!t->data && info->nbytes)
            return ST_FAIL(CKPTIO_E_INVAL, st->path, -1, "tensor", info->name, "target %zu has a NULL data pointer", i);
    }
    ckptio_extent *extents = ckptio__calloc(count, sizeof *extents);
    if (!extents) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu tensor reads", count);
    size_t n = 0; /* empty tensors move nothing */
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_info *info = &st->tensors[targets[i].index];
        if (info->nbytes)
            extents[n++] = (ckptio_extent){.file = st->file, .file_offset = info->file_offset, .length = info->nbytes,
                                           .memory = targets[i].data, .mem_kind = targets[i].mem_kind};
    }
    ckptio_status status = ckptio_engine_execute_extents(st->engine, CKPTIO_READ, extents, n);
    ckptio__free(extents);
    return status;
}

ckptio_status ckptio_safetensors_read_all(ckptio_safetensors *st, void *data, uint64_t capacity,
                                          ckptio_mem_kind mem_kind) {
    CKPTIO_FORWARD(need_file(st, "ckptio_safetensors_read_all"));
    if (capacity < st->data_size)
        return ST_FAIL(CKPTIO_E_RANGE, st->path, -1, NULL, NULL,
                       "the buffer has room for %llu bytes but the data section is %llu bytes",
                       (unsigned long long)capacity, (unsigned long long)st->data_size);
    if (!data && st->data_size)
        return ST_FAIL(CKPTIO_E_INVAL, st->path, -1, NULL, NULL, "ckptio_safetensors_read_all: data is NULL");
    if (!st->data_size) return CKPTIO_OK;
    const ckptio_extent extent = {.file = st->file, .file_offset = st->data_offset, .length = st->data_size,
                                  .memory = data, .mem_kind = mem_kind};
    return ckptio_engine_execute_extents(st->engine, CKPTIO_READ, &extent, 1);
}

/* The caller's metadata without a CKPTIO_SAVE_ID_KEY entry (ids belong to
 * the save that makes them), plus `save_id` under that key when given.
 * *out is NULL when there is nothing to change; malformed input (NULL
 * pairs or keys) is passed through for the layout to refuse. */
static ckptio_status metadata_with_save_id(const ckptio_kv *metadata, size_t count, const char *save_id,
                                           const char *path, ckptio_kv **out, size_t *out_count) {
    *out = NULL;
    *out_count = count;
    if (count && !metadata) return CKPTIO_OK;
    bool has_key = false;
    for (size_t i = 0; i < count; i++) has_key |= metadata[i].key && strcmp(metadata[i].key, CKPTIO_SAVE_ID_KEY) == 0;
    if (!has_key && !save_id) return CKPTIO_OK;
    if (!(*out = ckptio__calloc(count + 1, sizeof **out)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for the metadata", path);
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        if (!metadata[i].key || strcmp(metadata[i].key, CKPTIO_SAVE_ID_KEY) != 0) (*out)[n++] = metadata[i];
    if (save_id) (*out)[n++] = (ckptio_kv){CKPTIO_SAVE_ID_KEY, save_id};
    *out_count = n;
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_save(ckptio_engine *engine, const char *path, const ckptio_tensor_source *tensors,
                                      size_t count, const ckptio_kv *metadata, size_t metadata_count, unsigned flags) {
    if (!engine || !path) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_save: engine and path are required");
    ckptio__st_layout layout = {0};
    ckptio_file *file = NULL;
    ckptio_extent *extents = NULL;
    ckptio_kv *kv = NULL;
    size_t kv_count = 0;
    /* With checksums, the id that binds the manifest to this data goes
     * into the header (manifest_save.c). */
    const bool checksums = flags & CKPTIO_SAFETENSORS_CHECKSUMS;
    const bool in_place = flags & CKPTIO_SAFETENSORS_IN_PLACE;
    /* The manifest protocol orders two atomic commits; an in-place write has none. */
    if (checksums && in_place)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                               "checksums need an atomic save; they cannot be combined with an in-place write");
    char save_id[CKPTIO__SAVE_ID_HEX + 1];
    if (checksums) ckptio__manifest_new_save_id(save_id);
    ckptio_status status =
        metadata_with_save_id(metadata, metadata_count, checksums ? save_id : NULL, path, &kv, &kv_count);
    if (status != CKPTIO_OK) goto out;
    status = ckptio__st_layout_build(tensors, count, kv ? kv : metadata, kv_count,
                                     flags & ~(unsigned)(CKPTIO_SAFETENSORS_CHECKSUMS | CKPTIO_SAFETENSORS_IN_PLACE),
                                     path, &layout);
    if (status != CKPTIO_OK) goto out;

    extents = ckptio__calloc(count + 1, sizeof *extents);
    if (!extents) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu tensor writes", count);
        goto out;
    }
    if ((status = ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE | (in_place ? CKPTIO_OPEN_IN_PLACE : 0), &file)) !=
        CKPTIO_OK)
        goto out;
    /* The final size up front, as the reference writer does: the file
     * system can allocate it in one go. */
    if ((status = ckptio_file_truncate(file, layout.header_size + layout.data_size)) != CKPTIO_OK) goto out;
    extents[0] = (ckptio_extent){.file = file, .file_offset = 0, .length = layout.header_size,
                                 .memory = layout.header, .mem_kind = CKPTIO_MEM_HOST};
    for (size_t i = 0; i < count; i++)
        extents[i + 1] = (ckptio_extent){.file = file, .file_offset = layout.header_size + layout.offsets[i],
                                         .length = tensors[i].nbytes, .memory = (void *)tensors[i].data,
                                         .mem_kind = tensors[i].mem_kind};
    /* Data plan and commit, with the checksum manifest when asked
     * (manifest_save.c: it also drops a stale manifest of an older save). */
    status = ckptio__manifest_write_and_commit(engine, file, path, extents, tensors, count, checksums ? save_id : NULL);

out:
    if (file) {
        /* Without a commit, close removes the temporary: nothing appears
         * under `path` and an older file there stays as it was. */
        ckptio__error_saved *saved = status != CKPTIO_OK ? ckptio__error_save() : NULL;
        const ckptio_status close_status = ckptio_file_close(file);
        if (saved) ckptio__error_restore(saved);
        else if (status == CKPTIO_OK) status = close_status;
    }
    ckptio__free(extents);
    ckptio__free(kv);
    ckptio__st_layout_cleanup(&layout);
    return status;
}

ckptio_status ckptio_safetensors_layout(const ckptio_tensor_source *tensors, size_t count, const ckptio_kv *metadata,
                                        size_t metadata_count, unsigned flags, void *header, uint64_t capacity,
                                        uint64_t *header_size, uint64_t *offsets, uint64_t *file_size) {
    CKPTIO_RETURN_IF(!header_size || !file_size || (count && !offsets && header), CKPTIO_E_INVAL,
                     "ckptio_safetensors_layout: header_size, file_size and (with a header buffer) offsets are "
                     "required");
    ckptio__st_layout layout = {0};
    ckptio_status st = ckptio__st_layout_build(tensors, count, metadata, metadata_count, flags, NULL, &layout);
    if (st == CKPTIO_OK) {
        *header_size = layout.header_size;
        *file_size = layout.header_size + layout.data_size;
        if (offsets)
            for (size_t i = 0; i < count; i++) offsets[i] = layout.header_size + layout.offsets[i];
        if (header && capacity < layout.header_size)
            st = CKPTIO_FAIL(CKPTIO_E_RANGE, "the header is %llu bytes, the buffer has room for %llu",
                             (unsigned long long)layout.header_size, (unsigned long long)capacity);
        else if (header)
            memcpy(header, layout.header, (size_t)layout.header_size);
    }
    ckptio__st_layout_cleanup(&layout);
    return st;
}
