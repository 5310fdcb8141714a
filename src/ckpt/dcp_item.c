/*
 * dcp_item.c - what a stored tensor item of a DCP data file is: the one
 * place that tells a torch.save archive from a SAFETENSORS blob and says
 * where a tensor's bytes lie, for this library's reader (dcp_assemble.c)
 * and for ckptio.dcp's FileSystemReader, which reads only the slices it
 * needs from there.
 *
 * An untransformed item is a torch.save archive of one tensor (told by the
 * library's format detector, ckptio_format_detect_bytes, on its first
 * bytes) or the start of a SAFETENSORS blob that runs to the end of the
 * file (torch's SAFETENSORS layout: all tensors of a rank's file share it,
 * so callers keep the parsed header for the blob's other tensors). Only
 * headers are read, through the file's engine: the archive's zip records
 * and pickle, or the blob's length prefix and JSON header; or, for items in
 * object storage, from the archive's first and last bytes that the caller
 * read for many items at once (ckptio_dcp_header_windows). A decoded
 * (decompressed) item must be an archive: held in memory when small, else
 * only its first and last MiB are kept while it decompresses through a
 * fixed buffer (ckptio_dcp_header_zstd), and its storage is decompressed
 * again when a box of it is read (dcp_box.c).
 */
#include "dcp_dir_internal.h"
#include "engine_internal.h"
#include "torch_internal.h"

#include <stdio.h>
#include <string.h>

/* safetensors' own header size cap. */
#define BLOB_HEADER_MAX 100000000u

struct ckptio_dcp_header {
    ckptio_torch *torch;           /* an archive of one tensor, or */
    ckptio_safetensors *blob;      /* a SAFETENSORS blob */
    uint64_t base;                 /* where the item starts: file offset, or 0 in memory */
    char *path;                    /* for messages */
    uint64_t offset;
    /* A zstd item (ckptio_dcp_header_zstd): the whole archive when it is
     * small, else its edges and the stored frames to decompress again. */
    uint8_t *decoded;              /* owned: the archive (small), or its first and last bytes */
    const uint8_t *archive;        /* all archive_len bytes in memory (parse, small zstd item), or NULL */
    uint64_t archive_len;          /* the decoded archive's size */
    const uint8_t *zsrc;           /* the stored frames (the caller's) */
    size_t zlen;
    uint64_t zlimit;
};

#define IFAIL(op_, status_, path_, offset_, subject_, ...)                                                  \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.operation = (op_), .path = (path_),                    \
                                                   .file_offset = (int64_t)(offset_), .subject = (subject_)}), \
                    __VA_ARGS__)

/* Re-raises the last error (about bytes the library parsed in memory, or in
 * an item it named "<item>") with the item's file, offset and name in front. */
static ckptio_status wrap(ckptio_status st, const char *op, const char *path, uint64_t offset, const char *subject,
                          const char *what) {
    char inner[768];
    const char *text = ckptio_last_error_message();
    if (strncmp(text, "<memory>: ", 10) == 0) text += 10;
    else if (strncmp(text, "<item>: ", 8) == 0) text += 8;
    snprintf(inner, sizeof inner, "%s", text);
    return IFAIL(op, st, path, offset, subject, "%s: %s", what, inner);
}

static ckptio_dcp_header *header_new(const char *path, uint64_t offset, uint64_t base) {
    ckptio_dcp_header *h = ckptio__calloc(1, sizeof *h);
    char *copy = ckptio__strdup(path);
    if (!h || !copy) {
        ckptio__free(h);
        ckptio__free(copy);
        return NULL;
    }
    *h = (ckptio_dcp_header){.base = base, .path = copy, .offset = offset};
    return h;
}

/* The archive's one tensor: anything else is no DCP tensor item. */
static ckptio_status check_one_tensor(const ckptio_dcp_header *h, const char *subject) {
    size_t n = 0;
    ckptio_torch_count(h->torch, &n);
    if (n != 1)
        return IFAIL("read DCP item", CKPTIO_E_FORMAT, h->path, h->offset, subject,
                     "a torch.save item holds %zu tensors where one is expected", n);
    return CKPTIO_OK;
}

/* Hands the header out, or closes it keeping the error of `st`. */
static ckptio_status finish(ckptio_dcp_header *h, ckptio_status st, ckptio_dcp_header **out) {
    if (st == CKPTIO_OK) {
        *out = h;
        return st;
    }
    ckptio__error_saved *saved = ckptio__error_save();
    ckptio_dcp_header_close(h);
    ckptio__error_restore(saved);
    return st;
}

static ckptio_status read_blob(ckptio_file *file, uint64_t offset, uint64_t size, const char *subject,
                               ckptio_dcp_header *h, uint64_t *bytes_read) {
    const char *path = ckptio_file_path(file);
    const uint64_t blob_size = size - offset;
    if (blob_size < 8)
        return IFAIL("read DCP item", CKPTIO_E_FORMAT, path, offset, subject,
                     "neither a torch.save archive nor a safetensors blob (%llu bytes to the end of the file)",
                     (unsigned long long)blob_size);
    unsigned char prefix[8];
    CKPTIO_FORWARD(ckptio__file_io(file, CKPTIO_READ, prefix, 8, offset));
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | prefix[i];
    if (n > BLOB_HEADER_MAX || 8 + n > blob_size)
        return IFAIL("read DCP item", CKPTIO_E_FORMAT, path, offset, subject,
                     "neither a torch.save archive nor a safetensors blob (header length %llu for a blob of %llu "
                     "bytes)",
                     (unsigned long long)n, (unsigned long long)blob_size);
    void *head = ckptio__malloc(8 + n);
    if (!head)
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a safetensors header of %llu bytes",
                           (unsigned long long)n);
    ckptio_status st = ckptio__file_io(file, CKPTIO_READ, head, 8 + n, offset);
    if (st == CKPTIO_OK && (st = ckptio_safetensors_parse(head, 8 + n, blob_size, &h->blob)) != CKPTIO_OK)
        st = wrap(st, "read DCP item", path, offset, subject, "safetensors blob");
    ckptio__free(head);
    *bytes_read += 16 + n;
    return st;
}

ckptio_status ckptio_dcp_header_read(ckptio_file *file, uint64_t offset, uint64_t length, const char *subject,
                                     uint64_t *bytes_read, ckptio_dcp_header **out) {
    if (out) *out = NULL;
    CKPTIO_RETURN_IF(!file || !out, CKPTIO_E_INVAL, "ckptio_dcp_header_read: file and out are required");
    uint64_t size = 0, got = 0;
    CKPTIO_FORWARD(ckptio_file_size(file, &size));
    const char *path = ckptio_file_path(file);
    if (offset > size)
        return IFAIL("read DCP item", CKPTIO_E_TRUNCATED, path, offset, subject,
                     "the item starts past the end of the file (%llu bytes)", (unsigned long long)size);
    unsigned char head[CKPTIO_FORMAT_PROBE_BYTES];
    const size_t head_len = size - offset < sizeof head ? (size_t)(size - offset) : sizeof head;
    CKPTIO_FORWARD(ckptio__file_io(file, CKPTIO_READ, head, head_len, offset));
    got += head_len;
    ckptio_format format = CKPTIO_FORMAT_UNKNOWN;
    CKPTIO_FORWARD(ckptio_format_detect_bytes(head, head_len, size - offset, &format));
    ckptio_dcp_header *h = header_new(path, offset, offset);
    if (!h) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    if (format != CKPTIO_FORMAT_TORCH) {
        st = read_blob(file, offset, size, subject, h, &got);
    } else if (length == 0 || size - offset < length) {
        st = IFAIL("parse DCP item", CKPTIO_E_TRUNCATED, path, offset, subject,
                   "item of %llu bytes does not lie inside the file (%llu bytes)", (unsigned long long)length,
                   (unsigned long long)size);
    } else if ((st = ckptio__torch_open_range(file, offset, length, &h->torch)) != CKPTIO_OK) {
        st = wrap(st, "parse DCP item", path, offset, subject, "torch.save item");
    } else {
        got += h->torch->bytes_read;
        st = check_one_tensor(h, subject);
    }
    if (bytes_read) *bytes_read = got;
    return finish(h, st, out);
}

ckptio_status ckptio_dcp_header_windows(const char *path, uint64_t file_size, uint64_t offset, uint64_t length,
                                        const void *head, size_t head_len, const void *tail, size_t tail_len,
                                        const char *subject, ckptio_dcp_header **out) {
    if (out) *out = NULL;
    CKPTIO_RETURN_IF(!path || !out || !head || !tail, CKPTIO_E_INVAL,
                     "ckptio_dcp_header_windows: path, windows and out are required");
    /* The checks of ckptio_dcp_header_read, with its messages. */
    if (offset > file_size)
        return IFAIL("read DCP item", CKPTIO_E_TRUNCATED, path, offset, subject,
                     "the item starts past the end of the file (%llu bytes)", (unsigned long long)file_size);
    if (length == 0 || file_size - offset < length)
        return IFAIL("parse DCP item", CKPTIO_E_TRUNCATED, path, offset, subject,
                     "item of %llu bytes does not lie inside the file (%llu bytes)", (unsigned long long)length,
                     (unsigned long long)file_size);
    CKPTIO_RETURN_IF(head_len > length || tail_len > length, CKPTIO_E_INVAL,
                     "ckptio_dcp_header_windows: windows larger than the item");
    const size_t probe = length < CKPTIO_FORMAT_PROBE_BYTES ? (size_t)length : CKPTIO_FORMAT_PROBE_BYTES;
    CKPTIO_RETURN_IF(head_len < probe, CKPTIO_E_INVAL, "ckptio_dcp_header_windows: the head window is too short");
    ckptio_format format = CKPTIO_FORMAT_UNKNOWN;
    CKPTIO_FORWARD(ckptio_format_detect_bytes(head, probe, file_size - offset, &format));
    if (format != CKPTIO_FORMAT_TORCH)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "%s at offset %llu: not a torch.save archive (read its header "
                           "with ckptio_dcp_header_read)", path, (unsigned long long)offset);
    ckptio_dcp_header *h = header_new(path, offset, offset);
    if (!h || !(h->decoded = ckptio__malloc(head_len + tail_len ? head_len + tail_len : 1))) {
        ckptio_dcp_header_close(h);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    /* The header keeps its own copy of the windows (the archive's tables point into them while it parses). */
    memcpy(h->decoded, head, head_len);
    memcpy(h->decoded + head_len, tail, tail_len);
    ckptio_status st = ckptio__torch_parse_windows(h->decoded, head_len, h->decoded + head_len, tail_len, length,
                                                   &h->torch);
    /* A record between the windows: the caller reads the item from the file. */
    if (st == CKPTIO_E_UNSUPPORTED) return finish(h, st, out);
    if (st != CKPTIO_OK) st = wrap(st, "parse DCP item", path, offset, subject, "torch.save item");
    else st = check_one_tensor(h, subject);
    return finish(h, st, out);
}

ckptio_status ckptio_dcp_header_parse(const void *data, size_t len, const char *origin, uint64_t offset,
                                      const char *subject, ckptio_dcp_header **out) {
    if (out) *out = NULL;
    CKPTIO_RETURN_IF(!out || (!data && len), CKPTIO_E_INVAL, "ckptio_dcp_header_parse: data and out are required");
    if (!origin) origin = "<memory>";
    ckptio_format format = CKPTIO_FORMAT_UNKNOWN;
    CKPTIO_FORWARD(ckptio_format_detect_bytes(data ? data : "", len, len, &format));
    if (format != CKPTIO_FORMAT_TORCH)
        return IFAIL("read DCP item", CKPTIO_E_FORMAT, origin, offset, subject,
                     "the decoded item (%zu bytes) is not a torch.save archive", len);
    ckptio_dcp_header *h = header_new(origin, offset, 0);
    if (!h) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = ckptio_torch_parse(data, len, &h->torch);
    if (st != CKPTIO_OK) st = wrap(st, "read DCP item", origin, offset, subject, "torch.save item");
    else st = check_one_tensor(h, subject);
    h->archive = data;
    h->archive_len = len;
    return finish(h, st, out);
}

/* ---- zstd items ------------------------------------------------------------------ */

/* Bytes of a large decoded archive kept at each end while it streams past: a
 * torch.save archive of one tensor has its zip records and pickle there (the
 * local headers and pickle first, the central directory last) and its storage
 * in between, which is never held. */
#define ZSTD_EDGE ((size_t)1 << 20)

/* What the first pass over a zstd item keeps (a ckptio_zstd_sink). */
typedef struct zstd_capture {
    uint8_t *buf;          /* the archive while it is at most inline_max bytes; then its first ZSTD_EDGE */
    size_t len, cap;
    uint64_t inline_max;
    uint8_t *ring;         /* once the archive is larger: its last ZSTD_EDGE bytes, circular */
    size_t ring_pos;
    uint64_t total;
    bool magic_checked;
    bool failed;           /* the sink refused the item (its error names it already) */
    const char *path, *subject;
    uint64_t offset;
} zstd_capture;

static void ring_put(zstd_capture *c, const uint8_t *p, size_t n) {
    if (n == 0) return;
    if (n >= ZSTD_EDGE) {
        memcpy(c->ring, p + n - ZSTD_EDGE, ZSTD_EDGE);
        c->ring_pos = 0;
        return;
    }
    const size_t first = n < ZSTD_EDGE - c->ring_pos ? n : ZSTD_EDGE - c->ring_pos;
    memcpy(c->ring + c->ring_pos, p, first);
    memcpy(c->ring, p + first, n - first);
    c->ring_pos = (c->ring_pos + n) % ZSTD_EDGE;
}

static ckptio_status capture_sink(void *ctx, const void *data, size_t n, uint64_t offset) {
    zstd_capture *c = ctx;
    const uint8_t *p = data;
    c->total = offset + n;
    if (!c->ring && c->len + n <= c->inline_max) { /* still small: keep it all */
        if (c->len + n > c->cap) {
            uint64_t cap = c->cap ? c->cap : (uint64_t)64 << 10;
            while (cap < c->len + n) cap *= 2;
            if (cap > c->inline_max) cap = c->inline_max;
            uint8_t *grown = ckptio__realloc(c->buf, (size_t)cap);
            if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a decoded item of %llu bytes",
                                           (unsigned long long)(c->len + n));
            c->buf = grown;
            c->cap = (size_t)cap;
        }
        memcpy(c->buf + c->len, p, n);
        c->len += n;
    } else {
        if (!c->ring) { /* past inline_max: keep the first and the last ZSTD_EDGE bytes only */
            if (!(c->ring = ckptio__malloc(ZSTD_EDGE)))
                return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the end of a decoded item");
            ring_put(c, c->buf, c->len);
            uint8_t *head = ckptio__realloc(c->buf, ZSTD_EDGE);
            if (!head) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the start of a decoded item");
            c->buf = head;
            c->cap = ZSTD_EDGE;
            if (c->len > ZSTD_EDGE) c->len = ZSTD_EDGE;
        }
        if (c->len < ZSTD_EDGE) {
            const size_t take = n < ZSTD_EDGE - c->len ? n : ZSTD_EDGE - c->len;
            memcpy(c->buf + c->len, p, take);
            c->len += take;
        }
        ring_put(c, p, n);
    }
    /* An archive starts with a zip local header: anything else is refused on
     * its first bytes, not after decompressing all of it. */
    if (!c->magic_checked && c->len >= 4) {
        c->magic_checked = true;
        c->failed = memcmp(c->buf, "PK\x03\x04", 4) != 0;
        if (c->failed)
            return IFAIL("read DCP item", CKPTIO_E_FORMAT, c->path, c->offset, c->subject,
                         "zstd item: the decoded item is not a torch.save archive (it starts with %02x %02x %02x "
                         "%02x, not a zip local header)",
                         c->buf[0], c->buf[1], c->buf[2], c->buf[3]);
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_header_zstd_inline(const void *src, size_t len, uint64_t limit, uint64_t inline_max,
                                             const char *origin, uint64_t offset, const char *subject,
                                             ckptio_dcp_header **out) {
    if (out) *out = NULL;
    CKPTIO_RETURN_IF(!out || (!src && len), CKPTIO_E_INVAL, "ckptio_dcp_header_zstd: src and out are required");
    if (!origin) origin = "<memory>";
    zstd_capture c = {.inline_max = inline_max, .path = origin, .subject = subject, .offset = offset};
    ckptio_dcp_header *h = header_new(origin, offset, 0);
    if (!h) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = ckptio_zstd_stream(src, len, limit, capture_sink, &c, NULL);
    if (st != CKPTIO_OK) {
        if (!c.failed) st = wrap(st, "read DCP item", origin, offset, subject, "zstd item"); /* the codec's */
    } else if (!c.ring) { /* small: parsed, and read later, from memory */
        h->decoded = c.buf;
        c.buf = NULL;
        h->archive = h->decoded ? h->decoded : (const uint8_t *)"";
        h->archive_len = c.total;
        if ((st = ckptio_torch_parse(h->archive, (size_t)c.total, &h->torch)) != CKPTIO_OK)
            st = wrap(st, "read DCP item", origin, offset, subject, "zstd item: torch.save item");
    } else { /* large: its records from the edges; its storage streams again when it is read */
        const size_t tail_len = c.total < ZSTD_EDGE ? (size_t)c.total : ZSTD_EDGE;
        h->archive_len = c.total;
        if (!(h->decoded = ckptio__malloc(c.len + tail_len))) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the edges of a decoded item");
        } else {
            memcpy(h->decoded, c.buf, c.len);
            uint8_t *tail = h->decoded + c.len;
            if (c.total < ZSTD_EDGE) {
                memcpy(tail, c.ring, tail_len);
            } else {
                memcpy(tail, c.ring + c.ring_pos, ZSTD_EDGE - c.ring_pos);
                memcpy(tail + ZSTD_EDGE - c.ring_pos, c.ring, c.ring_pos);
            }
            if ((st = ckptio__torch_parse_windows(h->decoded, c.len, tail, tail_len, c.total, &h->torch)) != CKPTIO_OK)
                st = wrap(st, "read DCP item", origin, offset, subject, "zstd item: torch.save item");
        }
    }
    if (st == CKPTIO_OK) st = check_one_tensor(h, subject);
    h->zsrc = src;
    h->zlen = len;
    h->zlimit = limit;
    ckptio__free(c.buf);
    ckptio__free(c.ring);
    return finish(h, st, out);
}

ckptio_status ckptio_dcp_header_zstd(const void *src, size_t len, uint64_t limit, const char *origin,
                                     uint64_t offset, const char *subject, ckptio_dcp_header **out) {
    return ckptio__dcp_header_zstd_inline(src, len, limit, CKPTIO__DCP_ZSTD_INLINE_MAX, origin, offset, subject,
                                          out);
}

ckptio_status ckptio__dcp_header_archive(const ckptio_dcp_header *h, ckptio__dcp_archive *out) {
    CKPTIO_RETURN_IF(!h || !out, CKPTIO_E_INVAL, "ckptio__dcp_header_archive: header and out are required");
    CKPTIO_RETURN_IF(!h->archive && !h->zsrc, CKPTIO_E_INVAL,
                     "%s at offset %llu: the header of an untransformed item describes bytes in its file; read "
                     "them from there (ckptio_dcp_header_layout)",
                     h->path, (unsigned long long)h->offset);
    *out = (ckptio__dcp_archive){.data = h->archive, .len = h->archive_len, .zsrc = h->zsrc, .zlen = h->zlen,
                                 .zlimit = h->zlimit, .path = h->path, .offset = h->offset};
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_header_layout(const ckptio_dcp_header *h, const char *fqn, ckptio_dcp_layout *out) {
    CKPTIO_RETURN_IF(!h || !out, CKPTIO_E_INVAL, "ckptio_dcp_header_layout: header and out are required");
    memset(out, 0, sizeof *out);
    if (h->torch) {
        ckptio_torch_tensor_info ti;
        ckptio_torch_storage_info si;
        CKPTIO_FORWARD(ckptio_torch_tensor(h->torch, 0, &ti));
        CKPTIO_FORWARD(ckptio_torch_storage(h->torch, ti.storage, &si));
        if (ti.ndim > CKPTIO_DCP_MAX_NDIM)
            return IFAIL("read DCP item", CKPTIO_E_FORMAT, h->path, h->offset, fqn, "%u dimensions", ti.ndim);
        out->dtype = ti.dtype;
        out->ndim = ti.ndim;
        memcpy(out->shape, ti.shape, ti.ndim * sizeof *ti.shape);
        memcpy(out->stride, ti.stride, ti.ndim * sizeof *ti.stride);
        out->storage_offset = ti.storage_offset;
        out->storage_start = h->base + si.file_offset;
        out->storage_nbytes = si.nbytes;
        return CKPTIO_OK;
    }
    size_t index = 0;
    ckptio_tensor_info ti;
    if (!fqn || ckptio_safetensors_find(h->blob, fqn, &index) != CKPTIO_OK)
        return IFAIL("read DCP item", CKPTIO_E_FORMAT, h->path, h->offset, NULL,
                     "the safetensors blob has no tensor '%s'", fqn ? fqn : "");
    CKPTIO_FORWARD(ckptio_safetensors_tensor(h->blob, index, &ti));
    out->dtype = ti.dtype;
    out->ndim = ti.ndim;
    memcpy(out->shape, ti.shape, ti.ndim * sizeof *ti.shape);
    /* safetensors counts F4 values, torch packed pairs. */
    if (ti.dtype == CKPTIO_DTYPE_F4) {
        if (ti.ndim == 0 || ti.shape[ti.ndim - 1] % 2)
            return IFAIL("read DCP item", CKPTIO_E_FORMAT, h->path, h->offset, NULL,
                         "tensor '%s': an F4 tensor with %u dimensions (the last %lld) cannot be packed into "
                         "float4_e2m1fn_x2 (the last dimension must be even)",
                         fqn, ti.ndim, ti.ndim ? (long long)ti.shape[ti.ndim - 1] : 0LL);
        out->shape[ti.ndim - 1] /= 2;
    }
    int64_t acc = 1;
    for (uint32_t d = ti.ndim; d-- > 0;) {
        out->stride[d] = acc;
        acc *= out->shape[d];
    }
    out->storage_start = h->base + ti.file_offset;
    out->storage_nbytes = ti.nbytes;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_header_count(const ckptio_dcp_header *h, size_t *count) {
    CKPTIO_RETURN_IF(!h || !count, CKPTIO_E_INVAL, "ckptio_dcp_header_count: header and count are required");
    *count = 1;
    if (h->blob) CKPTIO_FORWARD(ckptio_safetensors_count(h->blob, count));
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_header_close(ckptio_dcp_header *h) {
    if (!h) return CKPTIO_OK;
    ckptio_torch_close(h->torch);
    ckptio_safetensors_close(h->blob);
    ckptio__free(h->decoded);
    ckptio__free(h->path);
    ckptio__free(h);
    return CKPTIO_OK;
}
