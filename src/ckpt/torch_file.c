/*
 * torch_file.c - reading torch.save files through the engine: open (zip
 * directory, local headers, small records, data.pkl), reading storages and
 * tensors into host or GPU memory, and verification of every record's
 * CRC-32. src/format/torch_read.c interprets the bytes read here.
 */
#include "engine_internal.h"
#include "io_internal.h"
#include "torch_internal.h"

#include <string.h>
#include <zlib.h>

#define OPEN_FAIL(t, status, offset, ...)                                                                    \
    CKPTIO_FAIL_CTX((status), &((ckptio__err_ctx){.operation = "open torch file", .path = (t)->path,        \
                                                  .file_offset = (int64_t)(offset)}),                       \
                    __VA_ARGS__)

/* For an archive held only at its edges (ckptio__torch_parse_windows): the
 * bytes [offset, +len) must lie in one of them. Checked before anything is
 * allocated for them. */
static ckptio_status window_check(const ckptio_torch *t, uint64_t len, uint64_t offset) {
    const uint64_t past_head = offset > t->head_len ? offset : t->head_len; /* first byte not in the head */
    if (!t->tail || (len <= t->head_len && offset <= t->head_len - len) || past_head >= t->tail_offset)
        return CKPTIO_OK;
    return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                           &((ckptio__err_ctx){.operation = "read", .path = t->path, .file_offset = (int64_t)offset}),
                           "a record of %llu bytes lies between the first %llu and the last %llu bytes of this "
                           "%llu-byte archive, which are all that is held of it (torch.save puts every record but "
                           "the storage there)",
                           (unsigned long long)len, (unsigned long long)t->head_len,
                           (unsigned long long)(t->file_size - t->tail_offset), (unsigned long long)t->file_size);
}

/* Bytes an object archive's header read brings in at once (each GET costs a round trip). */
#define READ_AHEAD ((uint64_t)64 << 10)

/* A small read of an archive in object storage, from one of two windows of
 * READ_AHEAD bytes (the one it misses is replaced: the head and the tail of
 * an archive each stay in one). */
static ckptio_status object_pread(ckptio_torch *t, void *buf, uint64_t len, uint64_t offset) {
    for (unsigned w = 0; w < 2; w++)
        if (t->ahead[w] && offset >= t->ahead_off[w] && offset + len <= t->ahead_off[w] + t->ahead_len[w]) {
            memcpy(buf, t->ahead[w] + (offset - t->ahead_off[w]), len);
            return CKPTIO_OK;
        }
    const unsigned w = t->ahead_next;
    t->ahead_next ^= 1;
    if (!t->ahead[w] && !(t->ahead[w] = ckptio__malloc(READ_AHEAD)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a read-ahead window");
    /* A read near the end takes the window that ends there (the tail's records come in one). */
    uint64_t from = offset, n = READ_AHEAD;
    if (t->file_size - from < n) from = t->file_size > n ? t->file_size - n : 0;
    if (n > t->file_size - from) n = t->file_size - from;
    t->ahead_len[w] = 0;
    CKPTIO_FORWARD(ckptio__file_io(t->file, CKPTIO_READ, t->ahead[w], n, t->base + from));
    t->bytes_read += n;
    t->ahead_off[w] = from;
    t->ahead_len[w] = n;
    memcpy(buf, t->ahead[w] + (offset - from), len);
    return CKPTIO_OK;
}

static ckptio_status torch_pread(ckptio_torch *t, void *buf, uint64_t len, uint64_t offset) {
    if (offset > t->file_size || len > t->file_size - offset)
        return CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED,
                               &((ckptio__err_ctx){.operation = "read", .path = t->path,
                                                   .file_offset = (int64_t)offset}),
                               "%llu bytes requested past the end of the file (%llu bytes)", (unsigned long long)len,
                               (unsigned long long)t->file_size);
    if (t->memory && t->tail) { /* an archive of which only the first and last bytes are held */
        CKPTIO_FORWARD(window_check(t, len, offset));
        const uint64_t from_head = offset >= t->head_len ? 0 : len < t->head_len - offset ? len : t->head_len - offset;
        if (from_head) memcpy(buf, t->memory + offset, from_head);
        if (len > from_head)
            memcpy((uint8_t *)buf + from_head, t->tail + (offset + from_head - t->tail_offset), len - from_head);
        return CKPTIO_OK;
    }
    if (t->memory) {
        memcpy(buf, t->memory + offset, len);
        return CKPTIO_OK;
    }
    if (t->file->object && len <= READ_AHEAD) return object_pread(t, buf, len, offset);
    t->bytes_read += len;
    return ckptio__file_io(t->file, CKPTIO_READ, buf, len, t->base + offset);
}

/* Reads a small text record into text (NUL-terminated); NULL when absent. */
static ckptio_status read_small(ckptio_torch *t, ptrdiff_t id, char *text, const char **out) {
    *out = NULL;
    if (id < 0) return CKPTIO_OK;
    const ckptio__zip_entry *e = &t->entries[id];
    if (e->size > CKPTIO__TORCH_MAX_SMALL_RECORD)
        return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                               &((ckptio__err_ctx){.operation = "open torch file", .path = t->path,
                                                   .file_offset = (int64_t)e->data_offset, .subject = e->name}),
                               "record of %llu bytes where a short text is expected", (unsigned long long)e->size);
    CKPTIO_FORWARD(torch_pread(t, text, e->size, e->data_offset));
    text[e->size] = '\0';
    *out = text;
    return CKPTIO_OK;
}

static ckptio_status load(ckptio_torch *t) {
    ckptio_status st = CKPTIO_OK;
    uint8_t *tail = NULL, *cd = NULL, *pickle = NULL;
    uint8_t head[CKPTIO_FORMAT_PROBE_BYTES] = {0};
    const size_t head_len = t->file_size < sizeof head ? (size_t)t->file_size : sizeof head;
    if (t->file_size < 4)
        return OPEN_FAIL(t, CKPTIO_E_TRUNCATED, 0, "file of %llu bytes is too short for a torch.save archive",
                         (unsigned long long)t->file_size);
    CKPTIO_FORWARD(torch_pread(t, head, head_len, 0));
    ckptio_format format;
    CKPTIO_FORWARD(ckptio_format_detect_bytes(head, head_len, t->file_size, &format));
    if (format == CKPTIO_FORMAT_TORCH_LEGACY)
        return OPEN_FAIL(t, CKPTIO_E_UNSUPPORTED, 0,
                         "legacy torch.save format (a bare pickle, written with "
                         "_use_new_zipfile_serialization=False or torch < 1.6) is not supported; "
                         "load and re-save it with a current torch");
    if (format == CKPTIO_FORMAT_SAFETENSORS)
        return OPEN_FAIL(t, CKPTIO_E_FORMAT, 0, "this is a safetensors file, not a torch.save archive");
    if (format != CKPTIO_FORMAT_TORCH)
        return OPEN_FAIL(t, CKPTIO_E_FORMAT, 0, "not a torch.save file: starts with %02x %02x %02x %02x, "
                         "not a zip header", head[0], head[1], head[2], head[3]);
    /* End records. torch.save writes no zip comment, so they are in the
     * last bytes: a short tail is read first (what a DCP reader pays per
     * item), the longest one an archive may need (a 64 KiB comment) only
     * when they are not in it. Both searches start from the end, so a record
     * found in the short tail is the one the long search finds. */
    const uint64_t want = CKPTIO_ZIP_MAX_TAIL + CKPTIO_ZIP64_LOCATOR_SIZE + CKPTIO_ZIP64_EOCD_SIZE;
    const size_t full_len = (size_t)(t->file_size < want ? t->file_size : want);
    size_t tail_len = full_len < 512 ? full_len : 512;
    ckptio__zip_directory dir;
    uint64_t need_offset = 0;
    if (!(tail = ckptio__malloc(full_len))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the zip tail");
        goto out;
    }
    for (;;) {
        if ((st = torch_pread(t, tail, tail_len, t->file_size - tail_len))) goto out;
        need_offset = 0;
        st = ckptio__zip_find_directory(tail, tail_len, t->file_size, t->path, &dir, &need_offset);
        if (st == CKPTIO_OK || (st == CKPTIO_E_TRUNCATED && need_offset) || tail_len == full_len) break;
        tail_len = full_len;
    }
    if (st == CKPTIO_E_TRUNCATED && need_offset) {
        uint8_t rec[CKPTIO_ZIP64_EOCD_SIZE];
        if ((st = torch_pread(t, rec, sizeof rec, need_offset))) goto out;
        st = ckptio__zip_parse_zip64_eocd(rec, need_offset, t->file_size, t->path, &dir);
    }
    if (st) goto out;
    /* Central directory: its size is bounded by the file size (checked). */
    if ((st = window_check(t, dir.cd_size, dir.cd_offset))) goto out;
    if (!(cd = ckptio__malloc(dir.cd_size ? dir.cd_size : 1))) {
        st = OPEN_FAIL(t, CKPTIO_E_NOMEM, dir.cd_offset, "no memory for a central directory of %llu bytes",
                       (unsigned long long)dir.cd_size);
        goto out;
    }
    if ((st = torch_pread(t, cd, dir.cd_size, dir.cd_offset))) goto out;
    if ((st = ckptio__zip_parse_central(cd, &dir, t->file_size, t->path, &t->entries))) goto out;
    t->nentries = (size_t)dir.count;
    ptrdiff_t ids[CKPTIO__TREC_COUNT_];
    if ((st = ckptio__torch_check_archive(t, ids))) goto out;
    /* Local headers give each record's data offset (their extras differ
     * from the central directory's: the alignment padding). */
    uint8_t hdr[CKPTIO_ZIP_LOCAL_HEADER_SIZE + 0xFFFF];
    for (size_t i = 0; i < t->nentries; i++) {
        ckptio__zip_entry *e = &t->entries[i];
        const size_t hlen = CKPTIO_ZIP_LOCAL_HEADER_SIZE + e->name_len;
        if ((st = torch_pread(t, hdr, hlen, e->header_offset))) goto out;
        if ((st = ckptio__zip_parse_local_header(e, hdr, hlen, t->file_size, t->path))) goto out;
    }
    if ((st = ckptio__zip_check_disjoint(t->entries, t->nentries, dir.cd_offset, t->path))) goto out;
    char version[CKPTIO__TORCH_MAX_SMALL_RECORD + 1], alignment[CKPTIO__TORCH_MAX_SMALL_RECORD + 1],
        byteorder[CKPTIO__TORCH_MAX_SMALL_RECORD + 1];
    const char *v = NULL, *a = NULL, *b = NULL;
    if ((st = read_small(t, ids[CKPTIO__TREC_VERSION], version, &v)) ||
        (st = read_small(t, ids[CKPTIO__TREC_ALIGNMENT], alignment, &a)) ||
        (st = read_small(t, ids[CKPTIO__TREC_BYTEORDER], byteorder, &b)))
        goto out;
    const ckptio__zip_entry *pk = &t->entries[ids[CKPTIO__TREC_PICKLE]];
    if (pk->size > CKPTIO__TORCH_MAX_PICKLE) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_RANGE,
                             &((ckptio__err_ctx){.operation = "open torch file", .path = t->path,
                                                 .file_offset = (int64_t)pk->data_offset, .subject = pk->name}),
                             "pickle of %llu bytes exceeds the %llu-byte limit", (unsigned long long)pk->size,
                             (unsigned long long)CKPTIO__TORCH_MAX_PICKLE);
        goto out;
    }
    if ((st = window_check(t, pk->size, pk->data_offset))) goto out;
    if (!(pickle = ckptio__malloc(pk->size ? pk->size : 1))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: no memory for a %llu-byte pickle", t->path, (unsigned long long)pk->size);
        goto out;
    }
    if ((st = torch_pread(t, pickle, pk->size, pk->data_offset))) goto out;
    st = ckptio__torch_build(t, pickle, (size_t)pk->size, pk->data_offset, v, a, b);
out:
    ckptio__free(tail);
    ckptio__free(cd);
    ckptio__free(pickle);
    return st;
}

static void torch_destroy(ckptio_torch *t) {
    if (!t) return;
    ckptio__free(t->ahead[0]);
    ckptio__free(t->ahead[1]);
    ckptio__torch_free_tables(t);
    ckptio__free(t);
}

ckptio_status ckptio_torch_open(ckptio_engine *engine, const char *path, ckptio_torch **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_torch_open: out must not be NULL");
    *out = NULL;
    if (!engine || !path) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_torch_open: engine and path are required");
    ckptio_status st = CKPTIO_OK;
    ckptio_torch *t = ckptio__calloc(1, sizeof *t);
    if (!t || !(t->path = ckptio__strdup(path))) {
        ckptio__free(t);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to open %s", path);
    }
    t->engine = engine;
    if ((st = ckptio_file_open(engine, path, CKPTIO_OPEN_READ, &t->file)) ||
        (st = ckptio_file_size(t->file, &t->file_size)) || (st = load(t))) {
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio_file_close(t->file);
        ckptio__error_restore(saved);
        torch_destroy(t);
        return st;
    }
    *out = t;
    return CKPTIO_OK;
}

ckptio_status ckptio__torch_open_range(ckptio_file *file, uint64_t offset, uint64_t length, ckptio_torch **out) {
    *out = NULL;
    ckptio_torch *t = ckptio__calloc(1, sizeof *t);
    if (!t || !(t->path = ckptio__strdup("<item>"))) {
        ckptio__free(t);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to open a torch.save item");
    }
    t->engine = ckptio__file_engine(file);
    t->file = file;
    t->file_borrowed = true;
    t->base = offset;
    t->file_size = length;
    const ckptio_status st = load(t);
    if (st) {
        torch_destroy(t);
        return st;
    }
    *out = t;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_parse(const void *bytes, size_t len, ckptio_torch **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_torch_parse: out must not be NULL");
    *out = NULL;
    if (!bytes && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_torch_parse: bytes must not be NULL");
    ckptio_torch *t = ckptio__calloc(1, sizeof *t);
    if (!t || !(t->path = ckptio__strdup("<memory>"))) {
        ckptio__free(t);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to parse a torch file");
    }
    t->memory = bytes ? bytes : (const uint8_t *)"";
    t->file_size = len;
    ckptio_status st = load(t);
    if (st) {
        torch_destroy(t);
        return st;
    }
    *out = t;
    return CKPTIO_OK;
}

ckptio_status ckptio__torch_parse_windows(const uint8_t *head, size_t head_len, const uint8_t *tail, size_t tail_len,
                                          uint64_t size, ckptio_torch **out) {
    *out = NULL;
    CKPTIO_RETURN_IF(head_len > size || tail_len > size || !head || !tail, CKPTIO_E_INVAL,
                     "ckptio__torch_parse_windows: windows larger than the archive");
    ckptio_torch *t = ckptio__calloc(1, sizeof *t);
    if (!t || !(t->path = ckptio__strdup("<memory>"))) {
        ckptio__free(t);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to parse a torch file");
    }
    t->memory = head;
    t->head_len = head_len;
    t->tail = tail;
    t->tail_offset = size - tail_len;
    t->file_size = size;
    ckptio_status st = load(t);
    if (st) {
        torch_destroy(t);
        return st;
    }
    *out = t;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_close(ckptio_torch *t) {
    if (!t) return CKPTIO_OK;
    ckptio_status st = t->file_borrowed ? CKPTIO_OK : ckptio_file_close(t->file);
    torch_destroy(t);
    return st;
}

ckptio_status ckptio_torch_map(ckptio_torch *t, ckptio_mapping **out) {
    CKPTIO_RETURN_IF(!t || !out, CKPTIO_E_INVAL, "ckptio_torch_map: handle and out are required");
    *out = NULL;
    CKPTIO_RETURN_IF(!t->file || t->file_borrowed || t->base, CKPTIO_E_INVAL,
                     "%s: only a torch.save file opened with ckptio_torch_open can be mapped", t->path);
    return ckptio__file_map(t->file, t->file_size, out);
}

/* ---- reading data --------------------------------------------------------------------- */

static ckptio_status run_extents(ckptio_torch *t, const ckptio_extent *ex, size_t n) {
    if (t->memory) {
        for (size_t i = 0; i < n; i++) {
            if (ex[i].mem_kind == CKPTIO_MEM_CUDA)
                return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED,
                                   "a handle from ckptio_torch_parse reads into host memory only");
            CKPTIO_FORWARD(torch_pread(t, ex[i].memory, ex[i].length, ex[i].file_offset));
        }
        return CKPTIO_OK;
    }
    return ckptio_engine_execute_extents(t->engine, CKPTIO_READ, ex, n);
}

ckptio_status ckptio_torch_read_storages(ckptio_torch *t, const ckptio_tensor_target *targets, size_t count) {
    if (!t || (count && !targets)) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and targets must not be NULL");
    ckptio_extent *ex = ckptio__calloc(count ? count : 1, sizeof *ex);
    if (!ex) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %zu extents", count);
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_target *tg = &targets[i];
        if (tg->index >= t->nstorages) {
            st = CKPTIO_FAIL(CKPTIO_E_RANGE, "target %zu: storage index %zu out of range (%zu storages)", i, tg->index,
                             t->nstorages);
            goto out;
        }
        const ckptio__torch_storage *s = &t->storages[tg->index];
        if (tg->capacity < s->nbytes || (!tg->data && s->nbytes)) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_RANGE,
                                 &((ckptio__err_ctx){.path = t->path, .subject = s->ref->key, .file_offset = -1}),
                                 "storage needs %llu bytes, target %zu has %llu", (unsigned long long)s->nbytes, i,
                                 (unsigned long long)tg->capacity);
            goto out;
        }
        ex[i] = (ckptio_extent){.file = t->file, .file_offset = t->base + t->entries[s->entry].data_offset,
                                .length = s->nbytes, .memory = tg->data, .mem_kind = tg->mem_kind};
    }
    st = run_extents(t, ex, count);
out:
    ckptio__free(ex);
    return st;
}

/* Copies a strided view out of `src` (which holds storage elements from
 * element `base` on) into dst in C order. */
static void gather(uint8_t *dst, const uint8_t *src, uint64_t base, const ckptio_torch_tensor_info *info,
                   uint64_t esize) {
    int64_t idx[64] = {0};
    const uint32_t nd = info->ndim;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; d++) numel *= (uint64_t)info->shape[d];
    for (uint64_t n = 0; n < numel; n++) {
        uint64_t off = info->storage_offset;
        for (uint32_t d = 0; d < nd; d++) off += (uint64_t)idx[d] * (uint64_t)info->stride[d];
        memcpy(dst + n * esize, src + (off - base) * esize, esize);
        for (uint32_t d = nd; d-- > 0;) {
            if (++idx[d] < info->shape[d]) break;
            idx[d] = 0;
        }
    }
}

ckptio_status ckptio_torch_read(ckptio_torch *t, const ckptio_tensor_target *targets, size_t count) {
    if (!t || (count && !targets)) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and targets must not be NULL");
    ckptio_extent *ex = ckptio__calloc(count ? count : 1, sizeof *ex);
    if (!ex) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %zu extents", count);
    ckptio_status st = CKPTIO_OK;
    size_t n = 0;
    uint8_t *scratch = NULL;
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_target *tg = &targets[i];
        ckptio_torch_tensor_info info;
        if ((st = ckptio_torch_tensor(t, tg->index, &info))) goto out;
        if (tg->capacity < info.nbytes || (!tg->data && info.nbytes)) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_RANGE,
                                 &((ckptio__err_ctx){.path = t->path, .subject = info.name, .file_offset = -1}),
                                 "tensor needs %llu bytes, target %zu has %llu", (unsigned long long)info.nbytes, i,
                                 (unsigned long long)tg->capacity);
            goto out;
        }
        if (info.is_contiguous && info.nbytes) /* an empty view may sit past its storage (torch allows it) */
            ex[n++] = (ckptio_extent){.file = t->file, .file_offset = t->base + info.file_offset, .length = info.nbytes,
                                      .memory = tg->data, .mem_kind = tg->mem_kind};
    }
    if ((st = run_extents(t, ex, n))) goto out;
    /* Strided views: read the span of storage they touch, then gather. */
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_target *tg = &targets[i];
        ckptio_torch_tensor_info info;
        if ((st = ckptio_torch_tensor(t, tg->index, &info))) goto out;
        if (info.is_contiguous || info.nbytes == 0) continue;
        if (tg->mem_kind != CKPTIO_MEM_HOST && tg->mem_kind != CKPTIO_MEM_PINNED) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                 &((ckptio__err_ctx){.path = t->path, .subject = info.name, .file_offset = -1}),
                                 "non-contiguous view needs a host target (read its storage to the GPU instead)");
            goto out;
        }
        const uint64_t esize = ckptio__torch_element_size(info.dtype);
        uint64_t last = info.storage_offset;
        for (uint32_t d = 0; d < info.ndim; d++) last += (uint64_t)(info.shape[d] - 1) * (uint64_t)info.stride[d];
        const uint64_t span = (last - info.storage_offset + 1) * esize; /* bounded by the storage (checked at open) */
        if (!(scratch = ckptio__malloc(span))) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to gather tensor %s (%llu bytes)", info.name,
                             (unsigned long long)span);
            goto out;
        }
        ckptio_extent one = {.file = t->file, .file_offset = t->base + info.file_offset, .length = span,
                             .memory = scratch, .mem_kind = CKPTIO_MEM_HOST};
        if ((st = run_extents(t, &one, 1))) goto out;
        gather(tg->data, scratch, info.storage_offset, &info, esize);
        ckptio__free(scratch);
        scratch = NULL;
    }
out:
    ckptio__free(scratch);
    ckptio__free(ex);
    return st;
}

/* ---- verify ---------------------------------------------------------------------------- */

ckptio_status ckptio_torch_verify(ckptio_torch *t, ckptio_torch_verify_report *report) {
    if (!t) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle must not be NULL");
    ckptio_torch_verify_report r = {0};
    const size_t chunk = 8u << 20;
    uint8_t *buf = ckptio__malloc(chunk);
    if (!buf) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for verification");
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < t->nentries; i++) {
        const ckptio__zip_entry *e = &t->entries[i];
        uLong crc = crc32(0L, Z_NULL, 0);
        for (uint64_t done = 0; done < e->size;) {
            uint64_t n = e->size - done < chunk ? e->size - done : chunk;
            if ((st = torch_pread(t, buf, n, e->data_offset + done))) goto out;
            crc = crc32(crc, buf, (uInt)n);
            done += n;
        }
        r.records++;
        r.bytes += e->size;
        if ((uint32_t)crc == e->crc32) {
            r.crc_checked++;
        } else if (e->crc32 == 0) {
            r.crc_absent++;
        } else {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_CHECKSUM,
                                 &((ckptio__err_ctx){.operation = "verify", .path = t->path,
                                                     .file_offset = (int64_t)e->data_offset, .subject = e->name}),
                                 "CRC-32 of the %llu data bytes is %08lx, the central directory says %08x",
                                 (unsigned long long)e->size, (unsigned long)crc, e->crc32);
            goto out;
        }
    }
out:
    ckptio__free(buf);
    if (report) *report = r;
    return st;
}
