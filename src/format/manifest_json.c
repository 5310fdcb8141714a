/*
 * manifest_json.c - reading and writing the checksum manifest's JSON
 * (format in manifest_internal.h and docs/RELIABILITY.md), and the
 * manifest's file name beside its data file (ckptio_manifest_path).
 *
 * The parser treats its input as hostile: a manifest is an ordinary file
 * anyone can edit. Sizes and counts are checked against each other before
 * anything is allocated from them (the only allocations proportional to a
 * declared count are bounded by the text's own length), every offset sum
 * is overflow-checked, and "file" may only name a file in the same
 * directory, never a path.
 */
#include "manifest_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MF_FAIL(status_, path_, field_, ...)                                                                  \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.operation = "parse manifest", .path = (path_),             \
                                                   .file_offset = -1, .subject = (field_)}),                  \
                    __VA_ARGS__)

/* Longest data name kept whole in its manifest's name. */
#define MANIFEST_STEM_MAX (CKPTIO__NAME_MAX - (sizeof CKPTIO_MANIFEST_SUFFIX - 1))

ckptio_status ckptio_manifest_path(const char *data_path, char *buf, size_t cap) {
    CKPTIO_RETURN_IF(!data_path || !buf, CKPTIO_E_INVAL, "ckptio_manifest_path: data_path and buf are required");
    const char *slash = strrchr(data_path, '/');
    const char *base = slash ? slash + 1 : data_path;
    char stem[CKPTIO__NAME_MAX + 1];
    ckptio__bounded_name(base, MANIFEST_STEM_MAX, stem);
    const int n = snprintf(buf, cap, "%.*s%s%s", (int)(base - data_path), data_path, stem, CKPTIO_MANIFEST_SUFFIX);
    if (n < 0 || (size_t)n >= cap) {
        if (cap) buf[0] = '\0';
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "ckptio_manifest_path: %zu bytes do not hold the manifest path of %s", cap,
                           data_path);
    }
    return CKPTIO_OK;
}

static const char *const top_keys[] = {"format", "version", "save_id", "file", "file_size", "data_offset",
                                       "header_xxh3", "hash", "block_bytes", "tensors"};
static const char *const tensor_keys[] = {"name", "offset", "nbytes", "blocks"};

static bool known_key(const char *key, const char *const *keys, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, keys[i]) == 0) return true;
    return false;
}

static ckptio_status check_keys(json_t *obj, const char *const *keys, size_t n, const char *path,
                                const char *where) {
    const char *key;
    json_t *value;
    json_object_foreach(obj, key, value) {
        (void)value;
        if (!known_key(key, keys, n)) return MF_FAIL(CKPTIO_E_FORMAT, path, key, "unknown key in %s", where);
    }
    return CKPTIO_OK;
}

/* A non-negative JSON integer. */
static ckptio_status get_u64(json_t *obj, const char *key, const char *path, const char *field, uint64_t *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return MF_FAIL(CKPTIO_E_FORMAT, path, field, "missing");
    if (!json_is_integer(v)) return MF_FAIL(CKPTIO_E_FORMAT, path, field, "must be an integer");
    const json_int_t i = json_integer_value(v);
    if (i < 0) return MF_FAIL(CKPTIO_E_FORMAT, path, field, "must not be negative (%lld)", (long long)i);
    *out = (uint64_t)i;
    return CKPTIO_OK;
}

static ckptio_status get_str(json_t *obj, const char *key, const char *path, const char *field, const char **out,
                             size_t *len) {
    json_t *v = json_object_get(obj, key);
    if (!v) return MF_FAIL(CKPTIO_E_FORMAT, path, field, "missing");
    if (!json_is_string(v)) return MF_FAIL(CKPTIO_E_FORMAT, path, field, "must be a string");
    *out = json_string_value(v);
    *len = json_string_length(v);
    return CKPTIO_OK;
}

static bool is_lower_hex(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
    return true;
}

/* Exactly 16 lowercase hex digits. */
static bool parse_hex64(const char *s, size_t len, uint64_t *out) {
    if (len != 16 || !is_lower_hex(s, len)) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < 16; i++) v = v << 4 | (unsigned)(s[i] <= '9' ? s[i] - '0' : s[i] - 'a' + 10);
    *out = v;
    return true;
}

/* "file" names the data file beside the manifest: a base name only. */
static ckptio_status check_file_name(const char *name, size_t len, const char *path) {
    if (len == 0 || len > CKPTIO__MANIFEST_MAX_NAME || strlen(name) != len)
        return MF_FAIL(CKPTIO_E_FORMAT, path, "file", "must be a file name of 1..%u bytes without NUL",
                       CKPTIO__MANIFEST_MAX_NAME);
    if (name[0] == '/')
        return MF_FAIL(CKPTIO_E_DISALLOWED, path, "file", "absolute path '%.200s' refused: a manifest may only name "
                       "a file in its own directory", name);
    if (strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return MF_FAIL(CKPTIO_E_DISALLOWED, path, "file", "path '%.200s' refused: a manifest may only name a file "
                       "in its own directory", name);
    return CKPTIO_OK;
}

typedef struct span {
    uint64_t begin, end;
    size_t index;
} span;

static int by_begin(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int by_name(const void *a, const void *b) {
    const ckptio__manifest_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Tensors inside [data_offset, file_size) (checked per tensor), names
 * unique, ranges not overlapping. */
static ckptio_status check_tensor_set(const ckptio__manifest *m, const char *path) {
    if (m->count < 2) return CKPTIO_OK;
    ckptio_status st = CKPTIO_OK;
    span *spans = ckptio__malloc(m->count * sizeof *spans);
    const ckptio__manifest_tensor **names = ckptio__malloc(m->count * sizeof *names);
    if (!spans || !names) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory checking %zu manifest tensors", m->count);
        goto out;
    }
    for (size_t i = 0; i < m->count; i++) names[i] = &m->tensors[i];
    /* Empty tensors occupy no bytes: only the others can overlap. */
    size_t n = 0;
    for (size_t i = 0; i < m->count; i++)
        if (m->tensors[i].nbytes)
            spans[n++] = (span){m->tensors[i].offset, m->tensors[i].offset + m->tensors[i].nbytes, i};
    qsort(spans, n, sizeof *spans, by_begin);
    for (size_t i = 1; i < n; i++)
        if (spans[i].begin < spans[i - 1].end) {
            st = MF_FAIL(CKPTIO_E_FORMAT, path, m->tensors[spans[i].index].name,
                         "bytes [%llu, %llu) overlap tensor '%s'", (unsigned long long)spans[i].begin,
                         (unsigned long long)spans[i].end, m->tensors[spans[i - 1].index].name);
            goto out;
        }
    qsort(names, m->count, sizeof *names, by_name);
    for (size_t i = 1; i < m->count; i++)
        if (strcmp(names[i]->name, names[i - 1]->name) == 0) {
            st = MF_FAIL(CKPTIO_E_FORMAT, path, names[i]->name, "tensor listed twice");
            goto out;
        }
out:
    ckptio__free(spans);
    ckptio__free(names);
    return st;
}

static ckptio_status parse_tensor(json_t *obj, size_t index, const ckptio__manifest *m, const char *path,
                                  ckptio__manifest_tensor *t) {
    char field[48];
    snprintf(field, sizeof field, "tensors[%zu]", index);
    if (!json_is_object(obj)) return MF_FAIL(CKPTIO_E_FORMAT, path, field, "must be an object");
    CKPTIO_FORWARD(check_keys(obj, tensor_keys, sizeof tensor_keys / sizeof *tensor_keys, path, field));
    const char *name;
    size_t name_len;
    CKPTIO_FORWARD(get_str(obj, "name", path, field, &name, &name_len));
    if (name_len == 0 || strlen(name) != name_len)
        return MF_FAIL(CKPTIO_E_FORMAT, path, field, "name must be non-empty and hold no NUL");
    CKPTIO_FORWARD(get_u64(obj, "offset", path, name, &t->offset));
    CKPTIO_FORWARD(get_u64(obj, "nbytes", path, name, &t->nbytes));
    uint64_t end;
    if (t->offset < m->data_offset || ckptio__add_overflows(t->offset, t->nbytes, &end) || end > m->file_size)
        return MF_FAIL(CKPTIO_E_FORMAT, path, name, "bytes at offset %llu, %llu long, are outside the data section "
                       "[%llu, %llu)", (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                       (unsigned long long)m->data_offset, (unsigned long long)m->file_size);
    json_t *blocks = json_object_get(obj, "blocks");
    if (!json_is_array(blocks)) return MF_FAIL(CKPTIO_E_FORMAT, path, name, "blocks must be an array");
    /* The count is implied by nbytes: compare before allocating anything. */
    const size_t want = ckptio__manifest_nblocks(t->nbytes, m->block_bytes);
    if (json_array_size(blocks) != want)
        return MF_FAIL(CKPTIO_E_FORMAT, path, name, "%zu block checksums for %llu bytes in %llu-byte blocks "
                       "(%zu expected)", json_array_size(blocks), (unsigned long long)t->nbytes,
                       (unsigned long long)m->block_bytes, want);
    if (!(t->name = ckptio__strdup(name))) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading a manifest");
    if (want && !(t->blocks = ckptio__malloc(want * sizeof *t->blocks)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu manifest checksums", want);
    t->nblocks = want;
    for (size_t b = 0; b < want; b++) {
        json_t *h = json_array_get(blocks, b);
        if (!json_is_string(h) || !parse_hex64(json_string_value(h), json_string_length(h), &t->blocks[b]))
            return MF_FAIL(CKPTIO_E_FORMAT, path, name, "block %zu: checksum must be 16 lowercase hex digits", b);
    }
    return CKPTIO_OK;
}

static ckptio_status parse_root(json_t *root, const char *path, ckptio__manifest *m) {
    if (!json_is_object(root)) return MF_FAIL(CKPTIO_E_FORMAT, path, NULL, "the manifest must be a JSON object");
    CKPTIO_FORWARD(check_keys(root, top_keys, sizeof top_keys / sizeof *top_keys, path, "the manifest"));
    const char *s;
    size_t len;
    CKPTIO_FORWARD(get_str(root, "format", path, "format", &s, &len));
    if (strcmp(s, CKPTIO__MANIFEST_FORMAT) != 0)
        return MF_FAIL(CKPTIO_E_FORMAT, path, "format", "is '%.64s', not '" CKPTIO__MANIFEST_FORMAT "'", s);
    uint64_t version;
    CKPTIO_FORWARD(get_u64(root, "version", path, "version", &version));
    if (version != CKPTIO__MANIFEST_VERSION && version != CKPTIO__MANIFEST_VERSION_V1)
        return MF_FAIL(CKPTIO_E_UNSUPPORTED, path, "version",
                       "version %llu is not supported (this reader knows %d and %d)", (unsigned long long)version,
                       CKPTIO__MANIFEST_VERSION_V1, CKPTIO__MANIFEST_VERSION);
    if (version == CKPTIO__MANIFEST_VERSION_V1) {
        if (json_object_get(root, "save_id"))
            return MF_FAIL(CKPTIO_E_FORMAT, path, "save_id", "not part of version 1 (it came with version 2)");
    } else {
        CKPTIO_FORWARD(get_str(root, "save_id", path, "save_id", &s, &len));
        if (len != CKPTIO__SAVE_ID_HEX || !is_lower_hex(s, len))
            return MF_FAIL(CKPTIO_E_FORMAT, path, "save_id", "must be %d lowercase hex digits", CKPTIO__SAVE_ID_HEX);
        memcpy(m->save_id, s, len + 1);
    }
    CKPTIO_FORWARD(get_str(root, "hash", path, "hash", &s, &len));
    if (strcmp(s, CKPTIO__MANIFEST_HASH) != 0)
        return MF_FAIL(CKPTIO_E_UNSUPPORTED, path, "hash",
                       "hash '%.64s' is not supported (only '" CKPTIO__MANIFEST_HASH "')", s);
    CKPTIO_FORWARD(get_str(root, "file", path, "file", &s, &len));
    CKPTIO_FORWARD(check_file_name(s, len, path));
    if (!(m->file = ckptio__strdup(s))) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading a manifest");
    CKPTIO_FORWARD(get_u64(root, "file_size", path, "file_size", &m->file_size));
    CKPTIO_FORWARD(get_u64(root, "data_offset", path, "data_offset", &m->data_offset));
    if (m->data_offset > m->file_size)
        return MF_FAIL(CKPTIO_E_FORMAT, path, "data_offset", "%llu is past the file size %llu",
                       (unsigned long long)m->data_offset, (unsigned long long)m->file_size);
    CKPTIO_FORWARD(get_str(root, "header_xxh3", path, "header_xxh3", &s, &len));
    if (!parse_hex64(s, len, &m->header_hash))
        return MF_FAIL(CKPTIO_E_FORMAT, path, "header_xxh3", "must be 16 lowercase hex digits");
    CKPTIO_FORWARD(get_u64(root, "block_bytes", path, "block_bytes", &m->block_bytes));
    if (m->block_bytes < CKPTIO__MANIFEST_MIN_BLOCK || m->block_bytes > CKPTIO__MANIFEST_MAX_BLOCK ||
        (m->block_bytes & (m->block_bytes - 1)))
        return MF_FAIL(CKPTIO_E_FORMAT, path, "block_bytes", "%llu is not a power of two in [%u, %u]",
                       (unsigned long long)m->block_bytes, CKPTIO__MANIFEST_MIN_BLOCK, CKPTIO__MANIFEST_MAX_BLOCK);
    json_t *tensors = json_object_get(root, "tensors");
    if (!json_is_array(tensors)) return MF_FAIL(CKPTIO_E_FORMAT, path, "tensors", "must be an array");
    const size_t n = json_array_size(tensors);
    if (n && !(m->tensors = ckptio__calloc(n, sizeof *m->tensors)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu manifest tensors", n);
    for (size_t i = 0; i < n; i++) {
        m->count = i + 1; /* cleanup frees what this entry got so far */
        CKPTIO_FORWARD(parse_tensor(json_array_get(tensors, i), i, m, path, &m->tensors[i]));
    }
    return check_tensor_set(m, path);
}

ckptio_status ckptio__manifest_parse(const char *text, size_t len, const char *path, ckptio__manifest *out) {
    CKPTIO_RETURN_IF(!out || (!text && len), CKPTIO_E_INVAL, "ckptio__manifest_parse: text and out are required");
    memset(out, 0, sizeof *out);
    if (len > CKPTIO__MANIFEST_MAX_BYTES)
        return MF_FAIL(CKPTIO_E_FORMAT, path, NULL, "manifest of %zu bytes exceeds the limit of %u bytes", len,
                       CKPTIO__MANIFEST_MAX_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(text ? text : "", len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return MF_FAIL(CKPTIO_E_FORMAT, path, NULL, "not valid JSON at line %d, column %d: %s", jerr.line,
                       jerr.column, jerr.text);
    ckptio_status st = parse_root(root, path, out);
    json_decref(root);
    if (st != CKPTIO_OK) ckptio__manifest_cleanup(out);
    return st;
}

void ckptio__manifest_cleanup(ckptio__manifest *m) {
    if (!m) return;
    for (size_t i = 0; i < m->count; i++) {
        ckptio__free(m->tensors[i].name);
        ckptio__free(m->tensors[i].blocks);
    }
    ckptio__free(m->tensors);
    ckptio__free(m->file);
    memset(m, 0, sizeof *m);
}

size_t ckptio__manifest_find(const ckptio__manifest *m, const char *name) {
    for (size_t i = 0; i < m->count; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return i;
    return SIZE_MAX;
}

/* ---- writing ------------------------------------------------------------------ */

static json_t *hex64(uint64_t v) {
    char text[17];
    snprintf(text, sizeof text, "%016llx", (unsigned long long)v);
    return json_string(text);
}

/* json_object_set_new/json_array_append_new that remember a failure. */
static void put(json_t *obj, const char *key, json_t *value, bool *ok) {
    if (!value || json_object_set_new(obj, key, value) != 0) *ok = false;
}
static void append(json_t *arr, json_t *value, bool *ok) {
    if (!value || json_array_append_new(arr, value) != 0) *ok = false;
}

char *ckptio__manifest_dump(const ckptio__manifest *m, size_t *len) {
    bool ok = true;
    char *text = NULL, *out = NULL;
    json_t *root = json_object(), *tensors = json_array();
    if (!root || !tensors) {
        json_decref(tensors);
        ok = false;
        goto done;
    }
    put(root, "format", json_string(CKPTIO__MANIFEST_FORMAT), &ok);
    put(root, "version", json_integer(m->save_id[0] ? CKPTIO__MANIFEST_VERSION : CKPTIO__MANIFEST_VERSION_V1), &ok);
    if (m->save_id[0]) put(root, "save_id", json_string(m->save_id), &ok);
    put(root, "file", json_string(m->file), &ok);
    put(root, "file_size", json_integer((json_int_t)m->file_size), &ok);
    put(root, "data_offset", json_integer((json_int_t)m->data_offset), &ok);
    put(root, "header_xxh3", hex64(m->header_hash), &ok);
    put(root, "hash", json_string(CKPTIO__MANIFEST_HASH), &ok);
    put(root, "block_bytes", json_integer((json_int_t)m->block_bytes), &ok);
    put(root, "tensors", tensors, &ok);
    for (size_t i = 0; ok && i < m->count; i++) {
        const ckptio__manifest_tensor *t = &m->tensors[i];
        json_t *obj = json_object(), *blocks = json_array();
        if (!obj || !blocks) {
            json_decref(obj);
            json_decref(blocks);
            ok = false;
            break;
        }
        put(obj, "name", json_string(t->name), &ok);
        put(obj, "offset", json_integer((json_int_t)t->offset), &ok);
        put(obj, "nbytes", json_integer((json_int_t)t->nbytes), &ok);
        for (size_t b = 0; ok && b < t->nblocks; b++) append(blocks, hex64(t->blocks[b]), &ok);
        put(obj, "blocks", blocks, &ok);
        append(tensors, obj, &ok);
    }
    if (ok && !(text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER))) ok = false;
done:
    json_decref(root);
    if (ok) {
        const size_t n = strlen(text);
        if ((out = ckptio__malloc(n + 1))) {
            memcpy(out, text, n + 1);
            if (len) *len = n;
        }
    }
    free(text);
    if (!out) CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory writing a manifest of %zu tensors", m->count);
    return out;
}
