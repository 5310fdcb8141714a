/*
 * dcp_assemble.c - decoding the stored items of a DCP directory and
 * assembling whole tensors from their chunks; the structural check.
 *
 * A chunk's item is one of: a torch.save archive of one tensor, a
 * SAFETENSORS blob (all tensors of a rank's file share it, so its parsed
 * header is kept), or a zstd frame around an archive; dcp_item.c tells
 * which and where the tensor's storage lies. Only that storage is read,
 * through the engine, one chunk at a time: host memory besides the
 * destination is at most one storage (read through a 16 MiB buffer when it
 * is only checked). A zstd item's stored frames are read whole and
 * decompressed through a fixed buffer (dcp_item.c, dcp_box.c), straight
 * into the destination when the archive is over 64 MiB: nothing is sized by
 * what .metadata or the frames declare. A chunk that is the whole tensor,
 * stored dense, is read straight into the destination.
 */
#include "dcp_dir_internal.h"
#include "engine_internal.h"

#include <stdio.h>
#include <string.h>

#define IFAIL(status_, path_, offset_, fqn_, ...)                                                          \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.operation = "read DCP item", .path = (path_),           \
                                                   .file_offset = (int64_t)(offset_), .subject = (fqn_)}),  \
                    __VA_ARGS__)

/* A decoded chunk: a strided view of a storage held in memory, or the
 * header of a zstd item whose storage is read from its frames. */
typedef struct dcp_view {
    const uint8_t *storage;
    ckptio_dcp_layout layout;
    bool direct;               /* already read into the caller's destination */
    void *item;                /* buffer owned by the view: the storage, or a zstd item's frames */
    ckptio_dcp_header *zstd;   /* a zstd item: read with ckptio__dcp_header_emit_box (frames in item) */
} dcp_view;

static void view_free(dcp_view *v) {
    ckptio_dcp_header_close(v->zstd);
    ckptio__free(v->item);
    v->item = NULL;
    v->zstd = NULL;
}

static ckptio_status read_range(ckptio_file *f, void *buf, uint64_t len, uint64_t offset) {
    return ckptio__dcp_io(f, CKPTIO_READ, buf, len, offset);
}

static ckptio_status read_item(ckptio_file *f, const ckptio_dcp_stored *s, const char *fqn, void **out) {
    *out = ckptio__malloc(s->length ? s->length : 1);
    if (!*out)
        return IFAIL(CKPTIO_E_NOMEM, ckptio_file_path(f), s->offset, fqn, "out of memory for an item of %llu bytes",
                     (unsigned long long)s->length);
    const ckptio_status st = read_range(f, *out, s->length, s->offset);
    if (st != CKPTIO_OK) { /* a failed read leaves nothing to free: the byte items' caller forwards at once */
        ckptio__free(*out);
        *out = NULL;
    }
    return st;
}

/* Bytes read at a time when a storage is only checked for being readable. */
#define CHECK_PIECE ((uint64_t)16 << 20)

/* Reads [offset, +len) of f through one buffer of at most CHECK_PIECE bytes:
 * truncation and unreadable sectors show, memory stays bounded. */
static ckptio_status read_through(ckptio_file *f, uint64_t len, uint64_t offset) {
    const uint64_t piece = len < CHECK_PIECE ? len : CHECK_PIECE;
    void *buf = ckptio__malloc(piece ? piece : 1);
    if (!buf) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %llu bytes", (unsigned long long)piece);
    ckptio_status st = CKPTIO_OK;
    for (uint64_t done = 0; done < len && st == CKPTIO_OK; done += piece)
        st = read_range(f, buf, len - done < piece ? len - done : piece, offset + done);
    ckptio__free(buf);
    return st;
}

/* Re-raises the last error with the item's file, offset and tensor in front
 * (an error about bytes parsed in memory names no file of its own). */
static ckptio_status wrap(ckptio_status st, ckptio_file *f, uint64_t offset, const char *fqn, const char *what) {
    char inner[768];
    const char *text = ckptio_last_error_message();
    if (strncmp(text, "<memory>: ", 10) == 0) text += 10;
    snprintf(inner, sizeof inner, "%s", text);
    return IFAIL(st, ckptio_file_path(f), offset, fqn, "%s: %s", what, inner);
}

/* The header of the untransformed item `s` (a blob's is parsed once and
 * kept for its other tensors); *owned when the caller closes it. */
static ckptio_status item_header(ckptio_dcp *h, ckptio_file *f, const ckptio_dcp_stored *s, const char *fqn,
                                 ckptio_dcp_header **out, bool *owned) {
    const size_t fi = ckptio__dcp_file_index(h, s->file);
    *owned = false;
    for (size_t i = 0; i < h->nblobs; i++)
        if (h->blobs[i].file == fi && h->blobs[i].offset == s->offset) {
            *out = h->blobs[i].header;
            return CKPTIO_OK;
        }
    CKPTIO_FORWARD(ckptio_dcp_header_read(f, s->offset, s->length, fqn, NULL, out));
    size_t count = 0;
    ckptio_dcp_header_count(*out, &count);
    if (count <= 1) { /* an archive (or a blob of one tensor): nothing to keep */
        *owned = true;
        return CKPTIO_OK;
    }
    ckptio__dcp_blob *blobs = ckptio__realloc(h->blobs, (h->nblobs + 1) * sizeof *blobs);
    if (!blobs) {
        ckptio_dcp_header_close(*out);
        *out = NULL;
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    h->blobs = blobs;
    h->blobs[h->nblobs++] = (ckptio__dcp_blob){.file = fi, .offset = s->offset, .header = *out};
    return CKPTIO_OK;
}

/* What decode() does with the chunk's storage. */
typedef enum decode_mode {
    DECODE_READ,   /* into memory (or straight into `direct`); a zstd item keeps its header to be read */
    DECODE_CHECK,  /* only checked: read through a bounded buffer, a zstd item decompressed once */
} decode_mode;

/* Decodes chunk c of tensor t into a view of its storage. With `direct`
 * (the tensor's destination) a chunk that is the whole tensor, stored
 * contiguous, is read straight into it. A zstd item is decompressed through
 * a fixed buffer, never held whole unless small (ckptio_dcp_header_zstd): its
 * archive may hold at most the chunk's bytes plus
 * CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX, which stops a bomb early. */
static ckptio_status decode(ckptio_dcp *h, const ckptio__dcp_tensor *t, size_t c, void *direct, decode_mode mode,
                            dcp_view *v) {
    memset(v, 0, sizeof *v);
    const ckptio_dcp_stored *s = &t->stored[c];
    ckptio_file *f = NULL;
    CKPTIO_FORWARD(ckptio__dcp_item_bounds(h, s, t->fqn, &f));
    const char *path = ckptio_file_path(f);
    uint64_t chunk_bytes = ckptio__dcp_element_size(t->dtype);
    for (uint32_t d = 0; d < t->ndim; d++) chunk_bytes *= (uint64_t)t->sizes[c * t->ndim + d]; /* <= nbytes */
    ckptio_dcp_layout *lay = &v->layout;
    if (s->transforms & CKPTIO_DCP_TRANSFORM_ZSTD) {
        CKPTIO_FORWARD(read_item(f, s, t->fqn, &v->item)); /* the stored frames: inside the file */
        CKPTIO_FORWARD(ckptio_dcp_header_zstd(v->item, s->length, chunk_bytes + CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX, path,
                                              s->offset, t->fqn, &v->zstd));
        CKPTIO_FORWARD(ckptio_dcp_header_layout(v->zstd, t->fqn, lay));
    } else {
        ckptio_dcp_header *hd = NULL;
        bool owned = false;
        CKPTIO_FORWARD(item_header(h, f, s, t->fqn, &hd, &owned));
        const ckptio_status st = ckptio_dcp_header_layout(hd, t->fqn, lay);
        if (owned) ckptio_dcp_header_close(hd);
        CKPTIO_FORWARD(st);
        /* Only the storage's bytes are read, not the whole item. */
        bool dense = lay->storage_offset == 0;
        for (uint32_t d = lay->ndim, acc = 1; dense && d-- > 0; acc *= (uint32_t)lay->shape[d])
            dense = lay->shape[d] == 1 || lay->stride[d] == (int64_t)acc;
        if (mode == DECODE_CHECK) {
            CKPTIO_FORWARD(read_through(f, lay->storage_nbytes, lay->storage_start));
        } else {
            if (direct && dense && lay->storage_nbytes == t->nbytes && t->nchunks == 1 && lay->dtype == t->dtype) {
                v->direct = true;
                v->storage = direct;
            } else {
                if (!(v->item = ckptio__malloc(lay->storage_nbytes ? lay->storage_nbytes : 1)))
                    return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %llu bytes",
                                       (unsigned long long)lay->storage_nbytes);
                v->storage = v->item;
            }
            CKPTIO_FORWARD(read_range(f, (void *)v->storage, lay->storage_nbytes, lay->storage_start));
        }
    }
    /* The stored tensor must be the chunk .metadata describes. */
    if (lay->dtype != t->dtype)
        return IFAIL(CKPTIO_E_FORMAT, path, s->offset, t->fqn, "chunk %zu is stored as %s, .metadata says %s", c,
                     ckptio_dtype_name(lay->dtype), ckptio_dtype_name(t->dtype));
    bool same = lay->ndim == t->ndim;
    for (uint32_t d = 0; same && d < t->ndim; d++) same = lay->shape[d] == t->sizes[c * t->ndim + d];
    if (!same)
        return IFAIL(CKPTIO_E_FORMAT, path, s->offset, t->fqn,
                     "chunk %zu is stored with another shape (%u dims) than .metadata gives it", c, lay->ndim);
    return CKPTIO_OK;
}

/* C-order strides (elements) of tensor t, and the element where chunk c's
 * box starts. */
static uint64_t chunk_base(const ckptio__dcp_tensor *t, size_t c, int64_t *gstride) {
    int64_t acc = 1;
    uint64_t base = 0;
    for (uint32_t d = t->ndim; d-- > 0;) {
        gstride[d] = acc;
        base += (uint64_t)t->offsets[c * t->ndim + d] * (uint64_t)acc;
        acc *= t->shape[d];
    }
    return base;
}

/* Copies the chunk box [off, off + size) from the view into the C-order
 * tensor at dst. Each innermost row is one memcpy when the view's last
 * stride is 1. */
static void scatter(const ckptio__dcp_tensor *t, size_t c, const dcp_view *v, uint8_t *dst) {
    const uint64_t es = ckptio__dcp_element_size(t->dtype);
    const uint32_t nd = t->ndim;
    const int64_t *off = t->offsets + c * nd, *size = t->sizes + c * nd;
    const uint8_t *src = v->storage + v->layout.storage_offset * es;
    if (nd == 0) {
        memcpy(dst, src, es);
        return;
    }
    for (uint32_t d = 0; d < nd; d++)
        if (size[d] == 0) return;
    int64_t gstride[64], idx[64] = {0};
    int64_t acc = 1;
    for (uint32_t d = nd; d-- > 0;) {
        gstride[d] = acc;
        acc *= t->shape[d];
    }
    const uint32_t last = nd - 1;
    for (;;) {
        int64_t de = off[last], se = 0;
        for (uint32_t d = 0; d < last; d++) {
            de += (off[d] + idx[d]) * gstride[d];
            se += idx[d] * v->layout.stride[d];
        }
        uint8_t *drow = dst + (uint64_t)de * es;
        const uint8_t *srow = src + (uint64_t)se * es;
        if (v->layout.stride[last] == 1) {
            memcpy(drow, srow, (uint64_t)size[last] * es);
        } else {
            for (int64_t k = 0; k < size[last]; k++) memcpy(drow + k * es, srow + k * v->layout.stride[last] * es, es);
        }
        uint32_t d = last;
        while (d-- > 0) {
            if (++idx[d] < size[d]) break;
            idx[d] = 0;
        }
        if (d == UINT32_MAX) return;
    }
}

ckptio_status ckptio_dcp_read_tensor(ckptio_dcp *h, size_t index, void *dst, uint64_t capacity) {
    CKPTIO_RETURN_IF(!h || (!dst && capacity), CKPTIO_E_INVAL, "ckptio_dcp_read_tensor: handle and dst are required");
    CKPTIO_RETURN_IF(index >= h->ntensors, CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)", index,
                     h->ntensors);
    const ckptio__dcp_tensor *t = &h->tensors[index];
    if (capacity < t->nbytes)
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.file_offset = -1, .subject = t->fqn}),
                               "destination holds %llu bytes, the tensor needs %llu", (unsigned long long)capacity,
                               (unsigned long long)t->nbytes);
    CKPTIO_FORWARD(ckptio__dcp_check_tiling(h, t));
    const uint64_t es = ckptio__dcp_element_size(t->dtype);
    for (size_t c = 0; c < t->nchunks; c++) {
        dcp_view v;
        ckptio_status st = decode(h, t, c, dst, DECODE_READ, &v);
        if (st == CKPTIO_OK && v.zstd) { /* straight from the frames into the box */
            int64_t gstride[CKPTIO_DCP_MAX_NDIM];
            const int64_t zeros[CKPTIO_DCP_MAX_NDIM] = {0};
            const uint64_t base = chunk_base(t, c, gstride) * es;
            st = ckptio_dcp_header_read_box(v.zstd, t->fqn, zeros, t->sizes + c * t->ndim, (uint8_t *)dst + base,
                                            gstride, t->nbytes - base);
        } else if (st == CKPTIO_OK && !v.direct) {
            scatter(t, c, &v, dst);
        }
        view_free(&v);
        if (st != CKPTIO_OK) return st;
    }
    return CKPTIO_OK;
}

/* Hands a chunk's bytes on at their offset in the tensor. */
typedef struct shifted_emit {
    ckptio__dcp_emit_fn emit;
    void *ctx;
    uint64_t base;
} shifted_emit;

static ckptio_status emit_shifted(void *ctx, uint64_t dst, const void *data, size_t n) {
    const shifted_emit *e = ctx;
    return e->emit(e->ctx, e->base + dst, data, n);
}

ckptio_status ckptio__dcp_emit_tensor(ckptio_dcp *h, size_t index, ckptio__dcp_emit_fn emit, void *ctx) {
    const ckptio__dcp_tensor *t = &h->tensors[index];
    CKPTIO_FORWARD(ckptio__dcp_check_tiling(h, t));
    const uint64_t es = ckptio__dcp_element_size(t->dtype);
    const int64_t zeros[CKPTIO_DCP_MAX_NDIM] = {0};
    for (size_t c = 0; c < t->nchunks; c++) {
        dcp_view v;
        int64_t gstride[CKPTIO_DCP_MAX_NDIM];
        shifted_emit e = {.emit = emit, .ctx = ctx, .base = chunk_base(t, c, gstride) * es};
        const int64_t *size = t->sizes + c * t->ndim;
        ckptio_status st = decode(h, t, c, NULL, DECODE_READ, &v);
        if (st == CKPTIO_OK && v.zstd)
            st = ckptio__dcp_header_emit_box(v.zstd, t->fqn, zeros, size, gstride, emit_shifted, &e);
        else if (st == CKPTIO_OK)
            st = ckptio__dcp_emit_box_memory(&v.layout, v.storage, zeros, size, gstride, emit_shifted, &e);
        view_free(&v);
        if (st != CKPTIO_OK) return st;
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_load_bytes(ckptio_dcp *h, size_t index, void **out, uint64_t *len) {
    const ckptio__dcp_bytes *b = &h->bytes[index];
    ckptio_file *f = NULL;
    void *item = NULL;
    *out = NULL;
    CKPTIO_FORWARD(ckptio__dcp_item_bounds(h, &b->stored, b->fqn, &f));
    CKPTIO_FORWARD(read_item(f, &b->stored, b->fqn, &item));
    if (!(b->stored.transforms & CKPTIO_DCP_TRANSFORM_ZSTD)) {
        *out = item;
        *len = b->stored.length;
        return CKPTIO_OK;
    }
    uint64_t raw_len = 0;
    size_t got = 0;
    /* Counted by decompressing (through a fixed buffer, stopping past the
     * bound) before the output is allocated: never sized by what the frames
     * declare. */
    ckptio_status st = ckptio_zstd_stream(item, b->stored.length, CKPTIO_DCP_BYTE_ITEM_MAX, NULL, NULL, &raw_len);
    if (st != CKPTIO_OK) st = wrap(st, f, b->stored.offset, b->fqn, "zstd byte item");
    else if (!(*out = ckptio__malloc(raw_len ? raw_len : 1)))
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory decompressing %llu bytes", (unsigned long long)raw_len);
    else if ((st = ckptio_zstd_decompress(item, b->stored.length, *out, raw_len, &got)) != CKPTIO_OK)
        st = wrap(st, f, b->stored.offset, b->fqn, "zstd byte item");
    ckptio__free(item);
    if (st != CKPTIO_OK) {
        ckptio__free(*out);
        *out = NULL;
        return st;
    }
    *len = got;
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_check_bytes(ckptio_dcp *h, size_t index) {
    const ckptio__dcp_bytes *b = &h->bytes[index];
    void *data = NULL;
    uint64_t len = 0;
    ckptio_torch *t = NULL;
    CKPTIO_FORWARD(ckptio__dcp_load_bytes(h, index, &data, &len));
    /* What torch's planner would torch.load(weights_only=False): the
     * restricted unpickler refuses any global outside the allowlist. */
    ckptio_status st = ckptio_torch_parse(data, (size_t)len, &t);
    if (st != CKPTIO_OK) {
        ckptio_file *f = h->handles[ckptio__dcp_file_index(h, b->stored.file)]; /* opened by the load */
        st = wrap(st, f, b->stored.offset, b->fqn, "byte item (torch.save of a non-tensor value)");
    }
    ckptio_torch_close(t);
    ckptio__free(data);
    return st;
}

ckptio_status ckptio_dcp_read_bytes(ckptio_dcp *h, size_t index, void *dst, uint64_t capacity, uint64_t *len) {
    CKPTIO_RETURN_IF(!h || !len || (!dst && capacity), CKPTIO_E_INVAL,
                     "ckptio_dcp_read_bytes: handle, dst and len are required");
    CKPTIO_RETURN_IF(index >= h->nbytes_items, CKPTIO_E_RANGE, "byte item %zu out of range (%zu items)", index,
                     h->nbytes_items);
    void *data = NULL;
    CKPTIO_FORWARD(ckptio__dcp_load_bytes(h, index, &data, len));
    ckptio_status st = CKPTIO_OK;
    if (*len > capacity)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.file_offset = -1, .subject = h->bytes[index].fqn}),
                             "destination holds %llu bytes, the item has %llu", (unsigned long long)capacity,
                             (unsigned long long)*len);
    else if (*len)
        memcpy(dst, data, *len);
    ckptio__free(data);
    return st;
}

ckptio_status ckptio_dcp_check(ckptio_dcp *h, ckptio_dcp_verify_report *report) {
    ckptio_dcp_verify_report r = {0};
    ckptio_status st = CKPTIO_OK;
    CKPTIO_RETURN_IF(!h, CKPTIO_E_INVAL, "ckptio_dcp_check: handle is required");
    for (size_t j = 0; j < h->nbytes_items && st == CKPTIO_OK; j++) {
        r.items++;
        if ((st = ckptio__dcp_check_bytes(h, j)) == CKPTIO_OK) {
            r.checked++;
            r.bytes += h->bytes[j].stored.length;
        }
    }
    if (st == CKPTIO_OK) st = ckptio__dcp_check_coverage(h, &r.partial);
    for (size_t i = 0; i < h->ntensors && st == CKPTIO_OK; i++) {
        const ckptio__dcp_tensor *t = &h->tensors[i];
        for (size_t c = 0; c < t->nchunks && st == CKPTIO_OK; c++) {
            dcp_view v;
            r.items++;
            if ((st = decode(h, t, c, NULL, DECODE_CHECK, &v)) == CKPTIO_OK) {
                r.checked++;
                r.bytes += t->stored[c].length;
            }
            view_free(&v);
        }
    }
    if (report) *report = r;
    return st;
}
