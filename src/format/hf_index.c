/*
 * hf_index.c - parser of the Hugging Face sharded-safetensors index
 * (model.safetensors.index.json); rules in hf_index_internal.h.
 *
 * The index is untrusted input like a safetensors header: it decides which
 * files are opened, so every shard name must stay inside the directory
 * (checked here by name; model_dir.c checks symlinks when it opens them).
 * Tables are sized by what the parsed JSON holds, never by a declared count.
 */
#include "hf_index_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IX_FAIL(status_, path_, subject_, ...)                                                                  \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.operation = "parse index", .path = (path_), .file_offset = -1, \
                                                   .subject = (subject_)}),                                    \
                    __VA_ARGS__)

bool ckptio__hf_plain_name(const char *name, size_t len) {
    if (!name || len == 0 || len > CKPTIO__HF_INDEX_MAX_NAME) return false;
    if (memchr(name, '\0', len) || memchr(name, '/', len)) return false;
    return !((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'));
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const ckptio__hf_entry *)a)->name, ((const ckptio__hf_entry *)b)->name);
}

void ckptio__hf_index_free(ckptio__hf_index *x) {
    if (!x) return;
    for (size_t i = 0; x->shards && i < x->nshards; i++) ckptio__free(x->shards[i]);
    for (size_t i = 0; x->entries && i < x->count; i++) ckptio__free(x->entries[i].name);
    ckptio__free(x->shards);
    ckptio__free(x->entries);
    memset(x, 0, sizeof *x);
}

const ckptio__hf_entry *ckptio__hf_index_find(const ckptio__hf_index *x, const char *name) {
    const ckptio__hf_entry key = {.name = (char *)name};
    return x->count ? bsearch(&key, x->entries, x->count, sizeof key, cmp_entry) : NULL;
}

/* The shard names of `wmap`, validated, sorted and made distinct. */
static ckptio_status collect_shards(json_t *wmap, const char *path, ckptio__hf_index *x) {
    const size_t n = json_object_size(wmap);
    const char **names = ckptio__malloc((n ? n : 1) * sizeof *names);
    if (!names) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading the %zu entries of %s", n, path);
    size_t k = 0;
    const char *key;
    json_t *value;
    ckptio_status st = CKPTIO_OK;
    json_object_foreach(wmap, key, value) {
        char subject[300];
        snprintf(subject, sizeof subject, "weight_map['%.256s']", key);
        if (!json_is_string(value)) {
            st = IX_FAIL(CKPTIO_E_FORMAT, path, subject, "the shard must be a file name (a string)");
            goto out;
        }
        const char *s = json_string_value(value);
        const size_t len = json_string_length(value);
        if (!ckptio__hf_plain_name(s, len)) {
            /* A name that leads out of the directory is refused by policy;
             * an empty or overlong one is merely malformed. */
            const bool leaves = memchr(s, '/', len) || (len == 1 && s[0] == '.') ||
                                (len == 2 && s[0] == '.' && s[1] == '.');
            st = IX_FAIL(leaves ? CKPTIO_E_DISALLOWED : CKPTIO_E_FORMAT, path, subject,
                         "shard '%.256s' refused: an index may only name files in its own directory (a plain name "
                         "of 1..%u bytes: no '/', not '.' or '..')",
                         s, CKPTIO__HF_INDEX_MAX_NAME);
            goto out;
        }
        names[k++] = s;
    }
    qsort(names, k, sizeof *names, cmp_str);
    size_t distinct = 0;
    for (size_t i = 0; i < k; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0) distinct++;
    x->shards = ckptio__calloc(distinct ? distinct : 1, sizeof *x->shards);
    if (!x->shards) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing the shards of %s", path);
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        if (i > 0 && strcmp(names[i], names[i - 1]) == 0) continue;
        if (!(x->shards[x->nshards] = ckptio__strdup(names[i]))) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing the shards of %s", path);
            goto out;
        }
        x->nshards++;
    }
out:
    ckptio__free(names);
    return st;
}

static ckptio_status collect_entries(json_t *wmap, const char *path, ckptio__hf_index *x) {
    const size_t n = json_object_size(wmap);
    x->entries = ckptio__calloc(n ? n : 1, sizeof *x->entries);
    if (!x->entries) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading the %zu entries of %s", n, path);
    const char *key;
    json_t *value;
    json_object_foreach(wmap, key, value) {
        ckptio__hf_entry *e = &x->entries[x->count];
        if (!(e->name = ckptio__strdup(key)))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading the entries of %s", path);
        x->count++;
        const char *shard = json_string_value(value);
        char *const *hit = bsearch(&shard, x->shards, x->nshards, sizeof *x->shards, cmp_str);
        if (!hit) return CKPTIO_FAIL(CKPTIO_E_INTERNAL, "%s: shard '%s' missing from its own list", path, shard);
        e->shard = (size_t)(hit - x->shards);
    }
    /* Keys of one JSON object are distinct (duplicates were refused). */
    qsort(x->entries, x->count, sizeof *x->entries, cmp_entry);
    return CKPTIO_OK;
}

ckptio_status ckptio__hf_index_parse(const char *json, size_t len, const char *path, ckptio__hf_index *out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio__hf_index_parse: out is NULL");
    memset(out, 0, sizeof *out);
    if (!json && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio__hf_index_parse: json is NULL");
    if (!path) path = "<index>";
    if (len > CKPTIO__HF_INDEX_MAX_BYTES)
        return IX_FAIL(CKPTIO_E_FORMAT, path, NULL, "the index is %zu bytes, more than ckptio's limit of %u", len,
                       CKPTIO__HF_INDEX_MAX_BYTES);
    ckptio__hf_index x;
    memset(&x, 0, sizeof x);
    ckptio_status st = CKPTIO_OK;
    json_error_t err;
    /* Without JSON_ALLOW_NUL jansson refuses "\u0000" in every string, so
     * names reach C as complete NUL-terminated strings. */
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                               &((ckptio__err_ctx){.operation = "parse index", .path = path,
                                                   .file_offset = err.position >= 0 ? (int64_t)err.position : -1}),
                               "not a valid JSON index: %s (line %d, column %d)", err.text, err.line, err.column);
    }
    if (!json_is_object(root)) {
        st = IX_FAIL(CKPTIO_E_FORMAT, path, NULL, "the index must be a JSON object");
        goto out;
    }
    json_t *wmap = json_object_get(root, "weight_map");
    if (!wmap) {
        st = IX_FAIL(CKPTIO_E_FORMAT, path, "weight_map", "missing: a Hugging Face index maps tensors to shards in "
                     "\"weight_map\"");
        goto out;
    }
    if (!json_is_object(wmap)) {
        st = IX_FAIL(CKPTIO_E_FORMAT, path, "weight_map", "must be an object of tensor name -> shard file name");
        goto out;
    }
    json_t *md = json_object_get(root, "metadata");
    if (md && !json_is_null(md)) {
        if (!json_is_object(md)) {
            st = IX_FAIL(CKPTIO_E_FORMAT, path, "metadata", "must be an object");
            goto out;
        }
        json_t *total = json_object_get(md, "total_size");
        if (json_is_integer(total) && json_integer_value(total) >= 0) {
            x.has_total_size = true;
            x.total_size = (uint64_t)json_integer_value(total);
        }
    }
    if ((st = collect_shards(wmap, path, &x)) != CKPTIO_OK) goto out;
    if ((st = collect_entries(wmap, path, &x)) != CKPTIO_OK) goto out;
out:
    json_decref(root);
    if (st != CKPTIO_OK) {
        ckptio__hf_index_free(&x);
        return st;
    }
    *out = x;
    return CKPTIO_OK;
}

/* ---- writing --------------------------------------------------------------------------- */

char *ckptio__hf_index_json(const char *const *names, const char *const *shards, size_t count, uint64_t total_size,
                           const ckptio_kv *metadata, size_t metadata_count) {
    json_t *root = json_object(), *md = json_object(), *wmap = json_object();
    char *text = NULL;
    bool ok = root && md && wmap && total_size <= (uint64_t)INT64_MAX;
    /* total_size first, the caller's pairs over it: huggingface_hub's {**split.metadata, **metadata}. */
    ok = ok && json_object_set_new(md, "total_size", json_integer((json_int_t)total_size)) == 0;
    for (size_t i = 0; ok && i < metadata_count; i++) {
        json_t *value = json_string(metadata[i].value);
        ok = value && json_object_set_new(md, metadata[i].key, value) == 0;
    }
    for (size_t i = 0; ok && i < count; i++) {
        json_t *shard = json_string(shards[i]);
        ok = shard && json_object_set_new(wmap, names[i], shard) == 0;
    }
    if (ok && json_object_set(root, "metadata", md) == 0 && json_object_set(root, "weight_map", wmap) == 0) {
        /* json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it. */
        char *body = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
        const size_t n = body ? strlen(body) : 0;
        if (body && (text = ckptio__malloc(n + 2))) {
            memcpy(text, body, n);
            memcpy(text + n, "\n", 2);
        }
        free(body);
    }
    json_decref(root);
    json_decref(md);
    json_decref(wmap);
    if (!text) CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the index of %zu tensors", count);
    return text;
}
