/*
 * safetensors_header.c - parsing and validation of a safetensors header,
 * and the read-only accessors of a parsed handle.
 *
 * The rules are those of huggingface/safetensors (safetensors/src/tensor.rs,
 * SafeTensors::read_metadata and Metadata::validate), checked in the same
 * order, and at least as strict; docs/SAFETENSORS.md lists them and where
 * ckptio is stricter. Memory: every allocation is sized by what the header
 * bytes hold (entries, dims, string lengths), never by a count the header
 * merely claims.
 */
#include "safetensors_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_FAIL CKPTIO__ST_FAIL
#define ST_TENSOR_FAIL(st, name, ...) ST_FAIL(CKPTIO_E_FORMAT, (st)->path, -1, "tensor", (name), __VA_ARGS__)

/* "an object", "a string", ... for messages about a JSON value's type. */
static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

/* ---- the 8-byte prefix ---------------------------------------------------- */

ckptio_status ckptio__st_check_prefix(const unsigned char prefix[8], uint64_t file_size, const char *path,
                                      uint64_t *header_len) {
    if (file_size < CKPTIO__ST_PREFIX)
        return ST_FAIL(CKPTIO_E_TRUNCATED, path, -1, NULL, NULL,
                       "file is %llu bytes, shorter than the 8-byte header length", (unsigned long long)file_size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | prefix[i];
    if (n > CKPTIO__ST_MAX_HEADER)
        return ST_FAIL(CKPTIO_E_FORMAT, path, 0, NULL, NULL,
                       "header length %llu exceeds the limit of %u bytes", (unsigned long long)n,
                       CKPTIO__ST_MAX_HEADER);
    if (n > file_size - CKPTIO__ST_PREFIX)
        return ST_FAIL(CKPTIO_E_TRUNCATED, path, 0, NULL, NULL,
                       "header length %llu runs past the end of the file (%llu bytes)", (unsigned long long)n,
                       (unsigned long long)file_size);
    *header_len = n;
    return CKPTIO_OK;
}

static bool json_blank(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

ckptio__st_probe_result ckptio__st_probe(const unsigned char *head, size_t len, uint64_t file_size) {
    if (len < CKPTIO__ST_PREFIX + 1 || len > file_size) return CKPTIO__ST_PROBE_NO;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | head[i];
    /* The limits of ckptio__st_check_prefix, and "{}" as the shortest header. */
    if (n < 2 || n > CKPTIO__ST_MAX_HEADER || n > file_size - CKPTIO__ST_PREFIX) return CKPTIO__ST_PROBE_NO;
    const uint64_t header_end = CKPTIO__ST_PREFIX + n;
    const size_t end = header_end < len ? (size_t)header_end : len;
    for (size_t i = CKPTIO__ST_PREFIX; i < end; i++)
        if (!json_blank(head[i])) return head[i] == '{' ? CKPTIO__ST_PROBE_YES : CKPTIO__ST_PROBE_NO;
    return end < header_end ? CKPTIO__ST_PROBE_MORE : CKPTIO__ST_PROBE_NO;
}

/* ---- indexing --------------------------------------------------------------- */

/* One tensor entry between validation and the final tables. */
typedef struct st_entry {
    const char *name;   /* jansson's key (NUL-free: jansson refuses NUL in keys) */
    size_t name_len;
    const json_t *shape;
    ckptio_dtype dtype;
    uint64_t begin, end;
    size_t json_index;  /* tie-break: entries with equal offsets keep header order */
} st_entry;

static int entry_cmp(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->json_index < y->json_index ? -1 : (x->json_index > y->json_index);
}

/* A non-negative JSON integer, or a message on what it is instead. */
static bool get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static void describe_bad_number(const json_t *v, char *buf, size_t cap) {
    if (json_is_integer(v)) snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) snprintf(buf, cap, "the real number %g", json_real_value(v));
    else snprintf(buf, cap, "%s", json_kind(v));
}

/* Checks one tensor entry's fields; unknown fields are ignored, as the
 * reference does. */
static ckptio_status check_entry(const ckptio_safetensors *st, const char *name, const json_t *v, st_entry *e) {
    if (!json_is_object(v))
        return ST_TENSOR_FAIL(st, name, "entry is %s, expected an object with dtype, shape and data_offsets",
                              json_kind(v));
    const json_t *dtype = json_object_get(v, "dtype");
    const json_t *shape = json_object_get(v, "shape");
    const json_t *offsets = json_object_get(v, "data_offsets");
    if (!dtype) return ST_TENSOR_FAIL(st, name, "missing field 'dtype'");
    if (!shape) return ST_TENSOR_FAIL(st, name, "missing field 'shape'");
    if (!offsets) return ST_TENSOR_FAIL(st, name, "missing field 'data_offsets'");

    if (!json_is_string(dtype)) return ST_TENSOR_FAIL(st, name, "'dtype' is %s, expected a string", json_kind(dtype));
    if (!ckptio__st_dtype_from_name(json_string_value(dtype), json_string_length(dtype), &e->dtype))
        return ST_TENSOR_FAIL(st, name, "unknown dtype '%s'", json_string_value(dtype));

    if (!json_is_array(shape)) return ST_TENSOR_FAIL(st, name, "'shape' is %s, expected an array", json_kind(shape));
    for (size_t d = 0; d < json_array_size(shape); d++) {
        uint64_t dim;
        if (!get_u64(json_array_get(shape, d), &dim)) {
            char what[64];
            describe_bad_number(json_array_get(shape, d), what, sizeof what);
            return ST_TENSOR_FAIL(st, name, "shape[%zu] is %s, expected a non-negative integer", d, what);
        }
    }

    if (!json_is_array(offsets) || json_array_size(offsets) != 2) {
        if (json_is_array(offsets))
            return ST_TENSOR_FAIL(st, name, "'data_offsets' has %zu elements, expected [begin, end]",
                                  json_array_size(offsets));
        return ST_TENSOR_FAIL(st, name, "'data_offsets' is %s, expected [begin, end]", json_kind(offsets));
    }
    for (size_t k = 0; k < 2; k++) {
        uint64_t off;
        if (!get_u64(json_array_get(offsets, k), &off)) {
            char what[64];
            describe_bad_number(json_array_get(offsets, k), what, sizeof what);
            return ST_TENSOR_FAIL(st, name, "data_offsets[%zu] is %s, expected a non-negative integer", k, what);
        }
        if (k == 0) e->begin = off;
        else e->end = off;
    }
    e->name = name;
    e->name_len = strlen(name);
    e->shape = shape;
    return CKPTIO_OK;
}

/* The Metadata::validate rules, on entries sorted by offsets: contiguous
 * from 0, end >= begin, element count and bit count without overflow, whole
 * bytes, and end - begin equal to that size. */
static ckptio_status check_layout(const ckptio_safetensors *st, const st_entry *entries, size_t n) {
    uint64_t expect = 0;
    for (size_t i = 0; i < n; i++) {
        const st_entry *e = &entries[i];
        const unsigned long long b = e->begin, en = e->end;
        if (e->begin != expect || e->end < e->begin) {
            if (e->end < e->begin)
                return ST_TENSOR_FAIL(st, e->name, "data_offsets [%llu, %llu] end before they begin", b, en);
            if (i == 0)
                return ST_TENSOR_FAIL(st, e->name,
                                      "data_offsets [%llu, %llu] leave a gap at the start of the data section: "
                                      "the first tensor must begin at 0",
                                      b, en);
            if (e->begin > expect)
                return ST_TENSOR_FAIL(st, e->name,
                                      "data_offsets [%llu, %llu] leave a gap of %llu bytes after tensor '%s' "
                                      "(which ends at %llu); tensors must be packed back to back",
                                      b, en, (unsigned long long)(e->begin - expect), entries[i - 1].name,
                                      (unsigned long long)expect);
            return ST_TENSOR_FAIL(st, e->name, "data_offsets [%llu, %llu] overlap tensor '%s' (which ends at %llu)",
                                  b, en, entries[i - 1].name, (unsigned long long)expect);
        }
        expect = e->end;

        const size_t ndim = json_array_size(e->shape);
        uint64_t numel = 1;
        bool overflow = false;
        for (size_t d = 0; d < ndim; d++)
            if (ckptio__mul_overflows(numel, (uint64_t)json_integer_value(json_array_get(e->shape, d)), &numel))
                overflow = true; /* keep going: a later 0 does not rescue it in the reference either */
        const unsigned bits = ckptio_dtype_bits(e->dtype);
        uint64_t nbits = 0;
        if (!overflow) overflow = ckptio__mul_overflows(numel, bits, &nbits);
        if (overflow || nbits % 8 != 0 || nbits / 8 != e->end - e->begin) {
            /* Format the shape only on the error path. */
            int64_t dims[16];
            const size_t shown = ndim < 16 ? ndim : 16;
            for (size_t d = 0; d < shown; d++) dims[d] = json_integer_value(json_array_get(e->shape, d));
            char shape_text[200];
            /* Room is left for marking dims beyond the 16 shown. */
            ckptio__st_format_shape(shape_text, sizeof shape_text - 8, dims, shown);
            const size_t tl = strlen(shape_text);
            if (shown < ndim && !(tl >= 4 && strcmp(shape_text + tl - 4, "...]") == 0))
                memcpy(shape_text + tl - 1, ", ...]", 7);
            const char *dt = ckptio_dtype_name(e->dtype);
            if (overflow)
                return ST_TENSOR_FAIL(st, e->name, "dtype %s shape %s needs more than 2^64 bits", dt, shape_text);
            if (nbits % 8 != 0)
                return ST_TENSOR_FAIL(st, e->name, "dtype %s shape %s is %llu bits, not a whole number of bytes",
                                      dt, shape_text, (unsigned long long)nbits);
            return ST_TENSOR_FAIL(st, e->name, "data_offsets [%llu, %llu] cover %llu bytes but dtype %s shape %s needs %llu",
                                  b, en, (unsigned long long)(e->end - e->begin), dt, shape_text,
                                  (unsigned long long)(nbits / 8));
        }
    }
    return CKPTIO_OK;
}

/* Validates __metadata__ (null counts as absent, like the reference) and adds
 * the bytes its strings need to *arena_bytes. */
static ckptio_status check_metadata(const ckptio_safetensors *st, const json_t *md, size_t *count,
                                    size_t *arena_bytes) {
    *count = 0;
    if (json_is_null(md)) return CKPTIO_OK;
    if (!json_is_object(md))
        return ST_FAIL(CKPTIO_E_FORMAT, st->path, -1, "__metadata__", NULL, "is %s, expected an object of strings",
                       json_kind(md));
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)md, key, value) {
        if (!json_is_string(value))
            return ST_FAIL(CKPTIO_E_FORMAT, st->path, -1, "__metadata__ key", key, "value is %s, expected a string",
                           json_kind(value));
        if (strlen(json_string_value(value)) != json_string_length(value))
            return ST_FAIL(CKPTIO_E_FORMAT, st->path, -1, "__metadata__ key", key,
                           "value contains a NUL character, which ckptio does not support");
        *arena_bytes += strlen(key) + 1 + json_string_length(value) + 1;
        (*count)++;
    }
    return CKPTIO_OK;
}

static int name_cmp(const ckptio_safetensors *st, size_t a, size_t b) {
    return strcmp(st->tensors[a].name, st->tensors[b].name);
}

/* Heap sort of the by_name index: no allocation, O(n log n), no qsort_r. */
static void sift_down(const ckptio_safetensors *st, size_t *idx, size_t root, size_t n) {
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && name_cmp(st, idx[child], idx[child + 1]) < 0) child++;
        if (name_cmp(st, idx[root], idx[child]) >= 0) return;
        size_t tmp = idx[root];
        idx[root] = idx[child];
        idx[child] = tmp;
        root = child;
    }
}

static void sort_by_name(const ckptio_safetensors *st, size_t *idx, size_t n) {
    for (size_t i = n / 2; i-- > 0;) sift_down(st, idx, i, n);
    for (size_t end = n; end-- > 1;) {
        size_t tmp = idx[0];
        idx[0] = idx[end];
        idx[end] = tmp;
        sift_down(st, idx, 0, end);
    }
}

static ckptio_status json_failure(const ckptio_safetensors *st, const json_error_t *err) {
    const int64_t off = (int64_t)CKPTIO__ST_PREFIX + (err->position > 0 ? err->position : 0);
    switch (json_error_code(err)) {
    case json_error_out_of_memory:
        return ST_FAIL(CKPTIO_E_NOMEM, st->path, off, NULL, NULL, "out of memory parsing the header JSON");
    case json_error_invalid_utf8:
        return ST_FAIL(CKPTIO_E_FORMAT, st->path, off, NULL, NULL, "header is not valid UTF-8: %s", err->text);
    case json_error_duplicate_key:
        return ST_FAIL(CKPTIO_E_FORMAT, st->path, off, NULL, NULL, "header repeats a key (names must be unique): %s",
                       err->text);
    case json_error_null_byte_in_key:
        return ST_FAIL(CKPTIO_E_FORMAT, st->path, off, NULL, NULL,
                       "header has a name containing a NUL character, which ckptio does not support: %s", err->text);
    default:
        return ST_FAIL(CKPTIO_E_FORMAT, st->path, off, NULL, NULL, "header is not valid JSON: %s", err->text);
    }
}

ckptio_status ckptio__st_index(ckptio_safetensors *st, const char *json) {
    ckptio_status status = CKPTIO_OK;
    json_t *root = NULL;
    st_entry *entries = NULL;
    const json_t *md = NULL;
    size_t n = 0, md_count = 0, arena_bytes = 0, total_dims = 0, i = 0;
    uint64_t data_end = 0, avail = 0;
    const char *key;
    json_t *value;
    int64_t *dims;
    char *text;
    const size_t len = (size_t)st->header_len;

    CKPTIO_FORWARD(ckptio__st_scan(json, len, st->path));
    json_error_t err;
    /* JSON_ALLOW_NUL lets "\u0000" through in values the reference would
     * accept (ignored fields); names and metadata are checked for it below. */
    root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!root) return json_failure(st, &err);
    if (!json_is_object(root)) {
        status = ST_FAIL(CKPTIO_E_FORMAT, st->path, CKPTIO__ST_PREFIX, NULL, NULL,
                         "header is %s, expected a JSON object", json_kind(root));
        goto out;
    }

    /* Pass 1: validate every entry and size the arena. */
    md = json_object_get(root, "__metadata__");
    n = json_object_size(root) - (md ? 1 : 0);
    if (md && (status = check_metadata(st, md, &md_count, &arena_bytes)) != CKPTIO_OK) goto out;
    st->has_metadata = md && !json_is_null(md);
    entries = ckptio__calloc(n, sizeof *entries);
    if (!entries) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory indexing %zu tensors", n);
        goto out;
    }
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) continue;
        st_entry *e = &entries[i];
        if ((status = check_entry(st, key, value, e)) != CKPTIO_OK) goto out;
        e->json_index = i++;
        arena_bytes += e->name_len + 1;
        total_dims += json_array_size(e->shape);
    }

    qsort(entries, n, sizeof *entries, entry_cmp);
    if ((status = check_layout(st, entries, n)) != CKPTIO_OK) goto out;
    data_end = n ? entries[n - 1].end : 0;
    avail = st->file_size - st->data_offset;
    if (data_end > avail) {
        status = ST_FAIL(CKPTIO_E_TRUNCATED, st->path, -1, "tensor", entries[n - 1].name,
                         "data_offsets [%llu, %llu] end at file offset %llu, past the end of the file (%llu bytes)",
                         (unsigned long long)entries[n - 1].begin, (unsigned long long)data_end,
                         (unsigned long long)(st->data_offset + data_end), (unsigned long long)st->file_size);
        goto out;
    }
    if (data_end < avail) {
        status = ST_FAIL(CKPTIO_E_FORMAT, st->path, (int64_t)(st->data_offset + data_end), NULL, NULL,
                         "%llu trailing bytes after the last tensor: the data section ends at file offset %llu "
                         "but the file is %llu bytes",
                         (unsigned long long)(avail - data_end), (unsigned long long)(st->data_offset + data_end),
                         (unsigned long long)st->file_size);
        goto out;
    }

    /* Pass 2: the final tables. Shapes first in the arena for alignment. */
    st->tensors = ckptio__calloc(n, sizeof *st->tensors);
    st->by_name = ckptio__calloc(n, sizeof *st->by_name);
    st->metadata = ckptio__calloc(md_count, sizeof *st->metadata);
    st->arena = ckptio__malloc(total_dims * sizeof(int64_t) + arena_bytes);
    if (!st->tensors || !st->by_name || !st->metadata || !st->arena) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory indexing %zu tensors", n);
        goto out;
    }
    dims = (int64_t *)(void *)st->arena;
    text = st->arena + total_dims * sizeof(int64_t);
    for (size_t t = 0; t < n; t++) {
        const st_entry *e = &entries[t];
        ckptio_tensor_info *info = &st->tensors[t];
        memcpy(text, e->name, e->name_len + 1);
        info->name = text;
        text += e->name_len + 1;
        info->dtype = e->dtype;
        info->ndim = (uint32_t)json_array_size(e->shape);
        info->shape = dims;
        for (uint32_t d = 0; d < info->ndim; d++) *dims++ = json_integer_value(json_array_get(e->shape, d));
        info->file_offset = st->data_offset + e->begin;
        info->nbytes = e->end - e->begin;
        st->by_name[t] = t;
    }
    st->count = n;
    st->data_size = data_end;
    sort_by_name(st, st->by_name, n);
    if (md && json_is_object(md)) {
        size_t m = 0;
        json_object_foreach((json_t *)md, key, value) {
            const size_t klen = strlen(key) + 1, vlen = json_string_length(value) + 1;
            memcpy(text, key, klen);
            st->metadata[m].key = text;
            text += klen;
            memcpy(text, json_string_value(value), vlen);
            st->metadata[m].value = text;
            text += vlen;
            m++;
        }
        st->metadata_count = m;
    }

out:
    ckptio__free(entries);
    json_decref(root);
    return status;
}

void ckptio__st_destroy(ckptio_safetensors *st) {
    if (!st) return;
    ckptio__free(st->tensors);
    ckptio__free(st->by_name);
    ckptio__free(st->metadata);
    ckptio__free(st->arena);
    ckptio__free(st->path);
    ckptio__free(st);
}

/* ---- public: parse and accessors ------------------------------------------- */

ckptio_status ckptio_safetensors_parse(const void *bytes, size_t len, uint64_t file_size, ckptio_safetensors **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_parse: out must not be NULL");
    *out = NULL;
    if (!bytes && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_parse: bytes is NULL but len is %zu", len);
    if (len > file_size)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_parse: len %zu exceeds file_size %llu", len,
                           (unsigned long long)file_size);
    static const unsigned char zero_prefix[8];
    if (len < CKPTIO__ST_PREFIX && file_size >= CKPTIO__ST_PREFIX)
        return CKPTIO_FAIL(CKPTIO_E_TRUNCATED, "buffer holds %zu bytes, less than the 8-byte header length", len);
    uint64_t n;
    CKPTIO_FORWARD(ckptio__st_check_prefix(len >= CKPTIO__ST_PREFIX ? bytes : zero_prefix, file_size, NULL, &n));
    if (n > len - CKPTIO__ST_PREFIX)
        return CKPTIO_FAIL(CKPTIO_E_TRUNCATED, "buffer holds %zu bytes but the header ends at byte %llu", len,
                           (unsigned long long)(CKPTIO__ST_PREFIX + n));

    ckptio_safetensors *st = ckptio__calloc(1, sizeof *st);
    if (!st) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory creating a safetensors handle");
    st->file_size = file_size;
    st->header_len = n;
    st->data_offset = CKPTIO__ST_PREFIX + n;
    ckptio_status status = ckptio__st_index(st, (const char *)bytes + CKPTIO__ST_PREFIX);
    if (status != CKPTIO_OK) {
        ckptio__st_destroy(st);
        return status;
    }
    *out = st;
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_count(const ckptio_safetensors *st, size_t *out) {
    if (!st || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_count: NULL argument");
    *out = st->count;
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_tensor(const ckptio_safetensors *st, size_t index, ckptio_tensor_info *out) {
    if (!st || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_tensor: NULL argument");
    if (index >= st->count)
        return ST_FAIL(CKPTIO_E_RANGE, st->path, -1, NULL, NULL, "tensor index %zu out of range (the file has %zu)",
                       index, st->count);
    *out = st->tensors[index];
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_find(const ckptio_safetensors *st, const char *name, size_t *index) {
    if (!st || !name || !index) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_find: NULL argument");
    size_t lo = 0, hi = st->count;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(st->tensors[st->by_name[mid]].name, name);
        if (c == 0) {
            *index = st->by_name[mid];
            return CKPTIO_OK;
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return ST_FAIL(CKPTIO_E_NOT_FOUND, st->path, -1, "tensor", name, "not in the file");
}

ckptio_status ckptio_safetensors_metadata_count(const ckptio_safetensors *st, size_t *out) {
    if (!st || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_metadata_count: NULL argument");
    *out = st->metadata_count;
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_metadata(const ckptio_safetensors *st, size_t index, ckptio_kv *out) {
    if (!st || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_metadata: NULL argument");
    if (index >= st->metadata_count)
        return ST_FAIL(CKPTIO_E_RANGE, st->path, -1, NULL, NULL,
                       "metadata index %zu out of range (the file has %zu pairs)", index, st->metadata_count);
    *out = st->metadata[index];
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_data_offset(const ckptio_safetensors *st, uint64_t *out) {
    if (!st || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_data_offset: NULL argument");
    *out = st->data_offset;
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_data_size(const ckptio_safetensors *st, uint64_t *out) {
    if (!st || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_data_size: NULL argument");
    *out = st->data_size;
    return CKPTIO_OK;
}
