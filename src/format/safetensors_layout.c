/*
 * safetensors_layout.c - the writer's side of the safetensors format: input
 * validation, tensor order, offsets and the header bytes.
 *
 * The output must be byte-identical to the reference writer
 * (huggingface/safetensors tensor.rs `prepare`, serialized by serde_json)
 * when CKPTIO_SAFETENSORS_ALIGN_8 is given. The JSON is therefore written
 * here rather than by jansson: serde_json escapes control characters as
 * lowercase "\u001f" where jansson writes "\u001F", and the key order and
 * separators must be exactly serde's. jansson still checks UTF-8.
 */
#include "safetensors_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_FAIL CKPTIO__ST_FAIL

/* ---- a growable byte buffer ------------------------------------------------- */

typedef struct st_buf {
    unsigned char *data;
    size_t len, cap;
    bool failed;  /* an allocation failed; later appends do nothing */
} st_buf;

static void buf_put(st_buf *b, const void *p, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        unsigned char *data = ckptio__realloc(b->data, cap);
        if (!data) {
            b->failed = true;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void buf_put_spaces(st_buf *b, size_t n) {
    static const char spaces[64] = {[0 ... 63] = ' '};
    while (n > 0 && !b->failed) {
        const size_t k = n < sizeof spaces ? n : sizeof spaces;
        buf_put(b, spaces, k);
        n -= k;
    }
}

static void buf_puts(st_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_put_u64(st_buf *b, uint64_t v) {
    char text[24];
    int n = snprintf(text, sizeof text, "%llu", (unsigned long long)v);
    buf_put(b, text, (size_t)n);
}

/* A JSON string as serde_json writes it: '"' and '\\' escaped, the control
 * characters with short escapes (\b \f \n \r \t) where JSON has them and
 * \u00xx (lowercase hex) otherwise; everything else, including DEL, '/' and
 * non-ASCII UTF-8, as is. */
static void buf_put_json_string(st_buf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    buf_put(b, "\"", 1);
    const char *run = s;
    for (const char *p = s; *p; p++) {
        const unsigned char c = (unsigned char)*p;
        char esc[6];
        size_t esc_len = 2;
        esc[0] = '\\';
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            if (c >= 0x20) continue;
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            esc_len = 6;
            break;
        }
        buf_put(b, run, (size_t)(p - run));
        buf_put(b, esc, esc_len);
        run = p + 1;
    }
    buf_puts(b, run);
    buf_put(b, "\"", 1);
}

/* ---- validation ----------------------------------------------------------------- */

/* jansson refuses to make a string of invalid UTF-8: the reference's names
 * are Rust Strings, and ckptio's reader refuses invalid UTF-8 too. */
static bool valid_utf8(const char *s) {
    json_t *j = json_string(s);
    if (!j) return false;
    json_decref(j);
    return true;
}

typedef struct st_sort_item {
    int rank;           /* safetensors dtype rank, higher first */
    const char *name;
    size_t index;       /* index into the caller's array */
} st_sort_item;

static int by_rank_then_name(const void *a, const void *b) {
    const st_sort_item *x = a, *y = b;
    if (x->rank != y->rank) return x->rank > y->rank ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int by_name(const void *a, const void *b) {
    const st_sort_item *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static ckptio_status check_source(const ckptio_tensor_source *t, size_t i, const char *path) {
    if (!t->name) return ST_FAIL(CKPTIO_E_INVAL, path, -1, NULL, NULL, "tensor %zu has a NULL name", i);
    if (!t->name[0]) return ST_FAIL(CKPTIO_E_INVAL, path, -1, NULL, NULL, "tensor %zu has an empty name", i);
    if (strcmp(t->name, "__metadata__") == 0)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name, "the name is reserved for the metadata");
    if (!valid_utf8(t->name))
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name, "the name is not valid UTF-8");
    if (ckptio_dtype_bits(t->dtype) == 0)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name, "invalid dtype %d", (int)t->dtype);
    if (!ckptio_dtype_name(t->dtype)[0])
        return ST_FAIL(CKPTIO_E_UNSUPPORTED, path, -1, "tensor", t->name, "dtype %s has no safetensors equivalent",
                       ckptio_dtype_torch_name(t->dtype));
    if (t->ndim > 0 && !t->shape)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name, "shape is NULL but ndim is %u", t->ndim);
    uint64_t numel = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name, "shape[%u] is %lld, must be >= 0", d,
                           (long long)t->shape[d]);
        overflow |= ckptio__mul_overflows(numel, (uint64_t)t->shape[d], &numel);
    }
    char shape_text[160];
    ckptio__st_format_shape(shape_text, sizeof shape_text, t->shape, t->ndim);
    uint64_t need = 0;
    if (overflow || !ckptio__dtype_nbytes(t->dtype, numel, &need))
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name,
                       "dtype %s shape %s is not a whole number of bytes below 2^64", ckptio_dtype_name(t->dtype),
                       shape_text);
    if (t->nbytes != need)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name, "nbytes is %llu but dtype %s shape %s needs %llu",
                       (unsigned long long)t->nbytes, ckptio_dtype_name(t->dtype), shape_text,
                       (unsigned long long)need);
    if (!t->data && t->nbytes > 0)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", t->name, "data is NULL but nbytes is %llu",
                       (unsigned long long)t->nbytes);
    return CKPTIO_OK;
}

static ckptio_status check_metadata(const ckptio_kv *md, size_t count, const char *path, st_sort_item *scratch) {
    if (count && !md)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, NULL, NULL, "metadata is NULL but metadata_count is %zu", count);
    for (size_t i = 0; i < count; i++) {
        if (!md[i].key || !md[i].value)
            return ST_FAIL(CKPTIO_E_INVAL, path, -1, NULL, NULL, "metadata pair %zu has a NULL key or value", i);
        if (!valid_utf8(md[i].key) || !valid_utf8(md[i].value))
            return ST_FAIL(CKPTIO_E_INVAL, path, -1, "__metadata__ key", md[i].key, "key or value is not valid UTF-8");
        scratch[i] = (st_sort_item){.name = md[i].key, .index = i};
    }
    qsort(scratch, count, sizeof *scratch, by_name);
    for (size_t i = 1; i < count; i++)
        if (strcmp(scratch[i - 1].name, scratch[i].name) == 0)
            return ST_FAIL(CKPTIO_E_INVAL, path, -1, "__metadata__ key", scratch[i].name, "appears more than once");
    return CKPTIO_OK;
}

/* ---- layout ------------------------------------------------------------------------ */

void ckptio__st_layout_cleanup(ckptio__st_layout *layout) {
    if (!layout) return;
    ckptio__free(layout->order);
    ckptio__free(layout->offsets);
    ckptio__free(layout->header);
    memset(layout, 0, sizeof *layout);
}

ckptio_status ckptio__st_layout_build(const ckptio_tensor_source *tensors, size_t count, const ckptio_kv *metadata,
                                      size_t metadata_count, unsigned flags, const char *path,
                                      ckptio__st_layout *out) {
    ckptio_status status = CKPTIO_OK;
    st_sort_item *items = NULL;
    st_buf b = {0};
    memset(out, 0, sizeof *out);

    if (flags & ~(unsigned)CKPTIO_SAFETENSORS_ALIGN_8)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, NULL, NULL, "unknown save flags 0x%x", flags);
    if (count && !tensors)
        return ST_FAIL(CKPTIO_E_INVAL, path, -1, NULL, NULL, "tensors is NULL but count is %zu", count);
    const size_t scratch_n = count > metadata_count ? count : metadata_count;
    items = ckptio__calloc(scratch_n, sizeof *items);
    out->order = ckptio__calloc(count, sizeof *out->order);
    out->offsets = ckptio__calloc(count, sizeof *out->offsets);
    if (!items || !out->order || !out->offsets) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory laying out %zu tensors", count);
        goto out;
    }
    if ((status = check_metadata(metadata, metadata_count, path, items)) != CKPTIO_OK) goto out;
    for (size_t i = 0; i < count; i++) {
        if ((status = check_source(&tensors[i], i, path)) != CKPTIO_OK) goto out;
        items[i] = (st_sort_item){.rank = ckptio__dtype_safetensors_rank(tensors[i].dtype),
                                  .name = tensors[i].name, .index = i};
    }
    qsort(items, count, sizeof *items, by_name);
    for (size_t i = 1; i < count; i++)
        if (strcmp(items[i - 1].name, items[i].name) == 0) {
            status = ST_FAIL(CKPTIO_E_INVAL, path, -1, "tensor", items[i].name, "the name appears more than once");
            goto out;
        }
    qsort(items, count, sizeof *items, by_rank_then_name);

    /* Offsets, back to back in the sorted order. */
    uint64_t offset = 0;
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_source *t = &tensors[items[i].index];
        out->order[i] = items[i].index;
        out->offsets[items[i].index] = offset;
        if (ckptio__add_overflows(offset, t->nbytes, &offset)) {
            status = ST_FAIL(CKPTIO_E_RANGE, path, -1, "tensor", t->name, "the data section exceeds 2^64 bytes");
            goto out;
        }
    }
    out->count = count;
    out->data_size = offset;

    /* JSON after 8 placeholder bytes for the length. */
    buf_put(&b, "\0\0\0\0\0\0\0\0", CKPTIO__ST_PREFIX);
    buf_puts(&b, "{");
    if (metadata_count) {
        buf_puts(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < metadata_count; i++) {
            if (i) buf_puts(&b, ",");
            buf_put_json_string(&b, metadata[i].key);
            buf_puts(&b, ":");
            buf_put_json_string(&b, metadata[i].value);
        }
        buf_puts(&b, "}");
    }
    for (size_t i = 0; i < count; i++) {
        const ckptio_tensor_source *t = &tensors[out->order[i]];
        if (i || metadata_count) buf_puts(&b, ",");
        buf_put_json_string(&b, t->name);
        buf_puts(&b, ":{\"dtype\":\"");
        buf_puts(&b, ckptio_dtype_name(t->dtype));
        buf_puts(&b, "\",\"shape\":[");
        for (uint32_t d = 0; d < t->ndim; d++) {
            if (d) buf_puts(&b, ",");
            buf_put_u64(&b, (uint64_t)t->shape[d]);
        }
        buf_puts(&b, "],\"data_offsets\":[");
        buf_put_u64(&b, out->offsets[out->order[i]]);
        buf_puts(&b, ",");
        buf_put_u64(&b, out->offsets[out->order[i]] + t->nbytes);
        buf_puts(&b, "]}");
    }
    buf_puts(&b, "}");
    if (b.failed) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory building a safetensors header");
        goto out;
    }

    /* Spaces are the only legal padding (gaps in the data are not). */
    const uint64_t json_len = b.len - CKPTIO__ST_PREFIX;
    const uint64_t align = (flags & CKPTIO_SAFETENSORS_ALIGN_8) ? 8 : 4096;
    const uint64_t padded = ckptio__align_up(json_len + CKPTIO__ST_PREFIX, align) - CKPTIO__ST_PREFIX;
    if (padded > CKPTIO__ST_MAX_HEADER) {
        status = ST_FAIL(CKPTIO_E_RANGE, path, -1, NULL, NULL,
                         "the header would be %llu bytes, over the %u-byte limit readers accept",
                         (unsigned long long)padded, CKPTIO__ST_MAX_HEADER);
        goto out;
    }
    buf_put_spaces(&b, (size_t)(CKPTIO__ST_PREFIX + padded - b.len));
    if (b.failed) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory building a safetensors header");
        goto out;
    }
    /* What the reader's pre-scan refuses (more than CKPTIO__ST_MAX_VALUES
     * JSON values: very many tensors of many dimensions) is not written. */
    if (ckptio__st_scan((const char *)b.data + CKPTIO__ST_PREFIX, (size_t)padded, path) != CKPTIO_OK) {
        status = ST_FAIL(CKPTIO_E_RANGE, path, -1, NULL, NULL,
                         "the header would hold more than %u JSON values, which readers refuse (%zu tensors)",
                         CKPTIO__ST_MAX_VALUES, count);
        goto out;
    }
    for (int i = 0; i < 8; i++) b.data[i] = (unsigned char)(padded >> (8 * i));
    out->header = b.data;
    out->header_size = b.len;
    b.data = NULL;

out:
    ckptio__free(items);
    ckptio__free(b.data);
    if (status != CKPTIO_OK) {
        ckptio__free(out->order);
        ckptio__free(out->offsets);
        memset(out, 0, sizeof *out);
    }
    return status;
}
