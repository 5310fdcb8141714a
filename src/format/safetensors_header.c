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
 * reference does. The shape stays in the tree: *shape. */
static ckptio_status check_entry(const ckptio_safetensors *st, const char *name, const json_t *v,
                                 ckptio__st_entry *e, const json_t **shape_out) {
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
    e->ndim = (uint32_t)json_array_size(shape);
    *shape_out = shape;
    return CKPTIO_OK;
}

/* Entries in offset order: a permutation of the parse's header order. */
static int offset_cmp(const void *a, const void *b, void *arg) {
    const ckptio__st_entry *all = arg, *x = &all[*(const size_t *)a], *y = &all[*(const size_t *)b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->json_index < y->json_index ? -1 : (x->json_index > y->json_index);
}

static int name_cmp(const void *a, const void *b, void *arg) {
    const ckptio__st_entry *all = arg;
    return strcmp(all[*(const size_t *)a].name, all[*(const size_t *)b].name);
}

/* The Metadata::validate rules, on entries in offset order: contiguous
 * from 0, end >= begin, element count and bit count without overflow, whole
 * bytes, and end - begin equal to that size. */
static ckptio_status check_layout(const ckptio_safetensors *st, const ckptio__st_parsed *p, const size_t *order) {
    uint64_t expect = 0;
    for (size_t i = 0; i < p->count; i++) {
        const ckptio__st_entry *e = &p->entries[order[i]];
        const unsigned long long b = e->begin, en = e->end;
        if (e->begin != expect || e->end < e->begin) {
            if (e->end < e->begin)
                return ST_TENSOR_FAIL(st, e->name, "data_offsets [%llu, %llu] end before they begin", b, en);
            if (i == 0)
                return ST_TENSOR_FAIL(st, e->name,
                                      "data_offsets [%llu, %llu] leave a gap at the start of the data section: "
                                      "the first tensor must begin at 0",
                                      b, en);
            const char *prev = p->entries[order[i - 1]].name;
            if (e->begin > expect)
                return ST_TENSOR_FAIL(st, e->name,
                                      "data_offsets [%llu, %llu] leave a gap of %llu bytes after tensor '%s' "
                                      "(which ends at %llu); tensors must be packed back to back",
                                      b, en, (unsigned long long)(e->begin - expect), prev,
                                      (unsigned long long)expect);
            return ST_TENSOR_FAIL(st, e->name, "data_offsets [%llu, %llu] overlap tensor '%s' (which ends at %llu)",
                                  b, en, prev, (unsigned long long)expect);
        }
        expect = e->end;

        const int64_t *dims = p->dims + e->dims;
        uint64_t numel = 1;
        bool overflow = false;
        for (uint32_t d = 0; d < e->ndim; d++)
            if (ckptio__mul_overflows(numel, (uint64_t)dims[d], &numel))
                overflow = true; /* keep going: a later 0 does not rescue it in the reference either */
        const unsigned bits = ckptio_dtype_bits(e->dtype);
        uint64_t nbits = 0;
        if (!overflow) overflow = ckptio__mul_overflows(numel, bits, &nbits);
        if (overflow || nbits % 8 != 0 || nbits / 8 != e->end - e->begin) {
            /* Format the shape only on the error path. */
            const size_t shown = e->ndim < 16 ? e->ndim : 16;
            char shape_text[200];
            /* Room is left for marking dims beyond the 16 shown. */
            ckptio__st_format_shape(shape_text, sizeof shape_text - 8, dims, shown);
            const size_t tl = strlen(shape_text);
            if (shown < e->ndim && !(tl >= 4 && strcmp(shape_text + tl - 4, "...]") == 0))
                memcpy(shape_text + tl - 1, ", ...]", 7);
            const char *dt = ckptio_dtype_name(e->dtype);
            if (overflow)
                return ST_TENSOR_FAIL(st, e->name, "dtype %s shape %s needs more than 2^64 bits", dt, shape_text);
            if (nbits % 8 != 0)
                return ST_TENSOR_FAIL(st, e->name, "dtype %s shape %s is %llu bits, not a whole number of bytes",
                                      dt, shape_text, (unsigned long long)nbits);
            return ST_TENSOR_FAIL(st, e->name,
                                  "data_offsets [%llu, %llu] cover %llu bytes but dtype %s shape %s needs %llu",
                                  b, en, (unsigned long long)(e->end - e->begin), dt, shape_text,
                                  (unsigned long long)(nbits / 8));
        }
    }
    return CKPTIO_OK;
}

/* Validates __metadata__ (null counts as absent, like the reference) and
 * collects its pairs into p->meta. */
static ckptio_status check_metadata(const ckptio_safetensors *st, const json_t *md, ckptio__st_parsed *p) {
    if (json_is_null(md)) return CKPTIO_OK;
    if (!json_is_object(md))
        return ST_FAIL(CKPTIO_E_FORMAT, st->path, -1, "__metadata__", NULL, "is %s, expected an object of strings",
                       json_kind(md));
    p->has_metadata = true;
    p->meta = ckptio__calloc(json_object_size(md) ? json_object_size(md) : 1, sizeof *p->meta);
    if (!p->meta) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading __metadata__");
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)md, key, value) {
        if (!json_is_string(value))
            return ST_FAIL(CKPTIO_E_FORMAT, st->path, -1, "__metadata__ key", key, "value is %s, expected a string",
                           json_kind(value));
        if (strlen(json_string_value(value)) != json_string_length(value))
            return ST_FAIL(CKPTIO_E_FORMAT, st->path, -1, "__metadata__ key", key,
                           "value contains a NUL character, which ckptio does not support");
        p->meta[p->nmeta++] = (ckptio__st_meta){.key = key, .key_len = strlen(key), .value = json_string_value(value),
                                                .value_len = json_string_length(value)};
    }
    return CKPTIO_OK;
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

/* The tables of `st` from a parse: names unique (else *duplicate, with no
 * message: only a fast parse lets a repeated name through, and the full
 * parser then reports it), the layout rules, the data section against the
 * file, then the tensors in offset order, the name index and the metadata. */
static ckptio_status build_tables(ckptio_safetensors *st, const ckptio__st_parsed *p, bool *duplicate) {
    const size_t n = p->count;
    ckptio_status status = CKPTIO_OK;
    size_t *by_offset = ckptio__malloc((n ? n : 1) * sizeof *by_offset);
    size_t *by_name = ckptio__malloc((n ? n : 1) * sizeof *by_name);
    size_t *position = ckptio__malloc((n ? n : 1) * sizeof *position);
    if (!by_offset || !by_name || !position) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory indexing %zu tensors", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) by_offset[i] = by_name[i] = i;
    ckptio__sort(by_name, n, sizeof *by_name, name_cmp, p->entries);
    for (size_t i = 1; i < n; i++)
        if (strcmp(p->entries[by_name[i - 1]].name, p->entries[by_name[i]].name) == 0) {
            *duplicate = true;
            status = CKPTIO_E_FORMAT;
            goto out;
        }
    ckptio__sort(by_offset, n, sizeof *by_offset, offset_cmp, p->entries);
    if ((status = check_layout(st, p, by_offset)) != CKPTIO_OK) goto out;
    const uint64_t data_end = n ? p->entries[by_offset[n - 1]].end : 0;
    const uint64_t avail = st->file_size - st->data_offset;
    if (data_end > avail) {
        const ckptio__st_entry *last = &p->entries[by_offset[n - 1]];
        status = ST_FAIL(CKPTIO_E_TRUNCATED, st->path, -1, "tensor", last->name,
                         "data_offsets [%llu, %llu] end at file offset %llu, past the end of the file (%llu bytes)",
                         (unsigned long long)last->begin, (unsigned long long)data_end,
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

    /* Shapes first in the arena for alignment, then names and metadata. */
    size_t total_dims = 0, text_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        total_dims += p->entries[i].ndim;
        text_bytes += p->entries[i].name_len + 1;
    }
    for (size_t i = 0; i < p->nmeta; i++) text_bytes += p->meta[i].key_len + 1 + p->meta[i].value_len + 1;
    st->tensors = ckptio__calloc(n ? n : 1, sizeof *st->tensors);
    st->by_name = ckptio__calloc(n ? n : 1, sizeof *st->by_name);
    st->metadata = ckptio__calloc(p->nmeta ? p->nmeta : 1, sizeof *st->metadata);
    st->arena = ckptio__malloc(total_dims * sizeof(int64_t) + text_bytes + 1);
    if (!st->tensors || !st->by_name || !st->metadata || !st->arena) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory indexing %zu tensors", n);
        goto out;
    }
    int64_t *dims = (int64_t *)(void *)st->arena;
    char *text = st->arena + total_dims * sizeof(int64_t);
    for (size_t t = 0; t < n; t++) {
        const ckptio__st_entry *e = &p->entries[by_offset[t]];
        ckptio_tensor_info *info = &st->tensors[t];
        memcpy(text, e->name, e->name_len + 1);
        info->name = text;
        text += e->name_len + 1;
        info->dtype = e->dtype;
        info->ndim = e->ndim;
        info->shape = dims;
        if (e->ndim) memcpy(dims, p->dims + e->dims, e->ndim * sizeof *dims);
        dims += e->ndim;
        info->file_offset = st->data_offset + e->begin;
        info->nbytes = e->end - e->begin;
        position[by_offset[t]] = t;
    }
    for (size_t k = 0; k < n; k++) st->by_name[k] = position[by_name[k]];
    st->count = n;
    st->data_size = data_end;
    for (size_t m = 0; m < p->nmeta; m++) {
        const ckptio__st_meta *kv = &p->meta[m];
        memcpy(text, kv->key, kv->key_len + 1);
        st->metadata[m].key = text;
        text += kv->key_len + 1;
        memcpy(text, kv->value, kv->value_len + 1);
        st->metadata[m].value = text;
        text += kv->value_len + 1;
    }
    st->metadata_count = p->nmeta;
    st->has_metadata = p->has_metadata;

out:
    ckptio__free(by_offset);
    ckptio__free(by_name);
    ckptio__free(position);
    return status;
}

/* Undoes a build_tables that a fast parse must not keep. */
static void drop_tables(ckptio_safetensors *st) {
    ckptio__free(st->tensors);
    ckptio__free(st->by_name);
    ckptio__free(st->metadata);
    ckptio__free(st->arena);
    st->tensors = NULL;
    st->by_name = NULL;
    st->metadata = NULL;
    st->arena = NULL;
    st->count = st->metadata_count = 0;
    st->data_size = 0;
    st->has_metadata = false;
}

/* Every header through jansson: the reference's rules, in its order. */
static ckptio_status index_full(ckptio_safetensors *st, const char *json, size_t len) {
    ckptio_status status = CKPTIO_OK;
    ckptio__st_parsed p = {0};
    size_t dims_cap = 0, i = 0;
    const char *key;
    json_t *value;
    json_error_t err;
    /* JSON_ALLOW_NUL lets "\u0000" through in values the reference would
     * accept (ignored fields); names and metadata are checked for it below. */
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!root) return json_failure(st, &err);
    if (!json_is_object(root)) {
        status = ST_FAIL(CKPTIO_E_FORMAT, st->path, CKPTIO__ST_PREFIX, NULL, NULL,
                         "header is %s, expected a JSON object", json_kind(root));
        goto out;
    }
    const json_t *md = json_object_get(root, "__metadata__");
    const size_t n = json_object_size(root) - (md ? 1 : 0);
    if (md && (status = check_metadata(st, md, &p)) != CKPTIO_OK) goto out;
    p.entries = ckptio__calloc(n ? n : 1, sizeof *p.entries);
    if (!p.entries) {
        status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory indexing %zu tensors", n);
        goto out;
    }
    json_object_foreach(root, key, value) {
        if (strcmp(key, "__metadata__") == 0) continue;
        ckptio__st_entry *e = &p.entries[i];
        const json_t *shape = NULL;
        if ((status = check_entry(st, key, value, e, &shape)) != CKPTIO_OK) goto out;
        e->json_index = i++;
        e->dims = p.ndims;
        if (p.ndims + e->ndim > dims_cap) {
            size_t cap = dims_cap ? dims_cap * 2 : 64;
            while (cap < p.ndims + e->ndim) cap *= 2;
            int64_t *grown = ckptio__realloc(p.dims, cap * sizeof *grown);
            if (!grown) {
                status = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory indexing %zu tensors", n);
                goto out;
            }
            p.dims = grown;
            dims_cap = cap;
        }
        for (uint32_t d = 0; d < e->ndim; d++) p.dims[p.ndims++] = json_integer_value(json_array_get(shape, d));
    }
    p.count = n;
    bool duplicate = false; /* jansson refused repeated keys already */
    status = build_tables(st, &p, &duplicate);
out:
    ckptio__free(p.entries);
    ckptio__free(p.dims);
    ckptio__free(p.meta);
    json_decref(root);
    return status;
}

/* `len` less the blanks that end the text: writers pad the header with
 * spaces to align the data (4 KiB with ckptio's default), and the padding
 * holds no value. Eight spaces at a time. */
static size_t without_padding(const char *json, size_t len) {
    static const uint64_t spaces = 0x2020202020202020ull;
    uint64_t word;
    while (len >= 8 && (memcpy(&word, json + len - 8, 8), word == spaces)) len -= 8;
    while (len && (json[len - 1] == ' ' || json[len - 1] == '\n' || json[len - 1] == '\r' || json[len - 1] == '\t'))
        len--;
    return len;
}

ckptio_status ckptio__st_index_with(ckptio_safetensors *st, const char *json, bool fast) {
    const size_t len = (size_t)st->header_len, used = without_padding(json, len);
    CKPTIO_FORWARD(ckptio__st_scan(json, used, st->path));
    ckptio__st_parsed p;
    const ckptio__st_fast how = fast ? ckptio__st_parse_fast(json, used, &p) : CKPTIO__ST_FAST_NOT_MINE;
    if (how == CKPTIO__ST_FAST_NO_MEMORY) return CKPTIO_E_NOMEM;
    if (how == CKPTIO__ST_FAST_PARSED) {
        bool duplicate = false;
        const ckptio_status status = build_tables(st, &p, &duplicate);
        ckptio__st_parsed_cleanup(&p);
        if (!duplicate) return status;
        drop_tables(st);
    }
    return index_full(st, json, len);
}

ckptio_status ckptio__st_index(ckptio_safetensors *st, const char *json) {
    return ckptio__st_index_with(st, json, true);
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
    if (!bytes && len)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_parse: bytes is NULL but len is %zu", len);
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
