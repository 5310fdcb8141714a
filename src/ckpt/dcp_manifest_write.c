/*
 * dcp_manifest_write.c - step 2 of a DCP directory commit: the checksum
 * manifest .ckptio-manifest-<token>.json beside .metadata, written before
 * .metadata is replaced (so a manifest never describes files that are not
 * yet committed) and read back by dcp_manifest_verify.c. The layout is
 * docs/DCP.md "Manifest and verify": {"format": "ckptio-dcp-manifest",
 * "version": 1, "hash": "xxh3-64", "metadata", "files", "items": [{fqn,
 * offset, file, data_offset, nbytes, xxh3, parts?, transform}]}.
 */
#include "dcp_commit_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *hex(uint64_t v) {
    char s[17];
    snprintf(s, sizeof s, "%016llx", (unsigned long long)v);
    return json_string(s);
}

/* json_array_append_new/json_object_set_new that remember a failure (they
 * free `value` either way). */
static void put(json_t *obj, const char *key, json_t *value, bool *ok) {
    if (!value || json_object_set_new(obj, key, value) != 0) *ok = false;
}

static void push(json_t *arr, json_t *value, bool *ok) {
    if (!value || json_array_append_new(arr, value) != 0) *ok = false;
}

static json_t *item_json(const ckptio_dcp_manifest_item *it, bool *ok) {
    json_t *o = json_object();
    if (!o) {
        *ok = false;
        return NULL;
    }
    put(o, "fqn", json_string(it->fqn), ok);
    if (it->offset) {
        json_t *off = json_array();
        for (uint32_t d = 0; off && d < it->ndim; d++) push(off, json_integer(it->offset[d]), ok);
        put(o, "offset", off, ok);
    } else {
        put(o, "offset", json_null(), ok);
    }
    put(o, "file", json_string(it->file), ok);
    put(o, "data_offset", json_integer((json_int_t)it->data_offset), ok);
    put(o, "nbytes", json_integer((json_int_t)it->nbytes), ok);
    put(o, "xxh3", it->hashed ? hex(it->hash) : json_null(), ok);
    if (it->nparts) {
        json_t *parts = json_array();
        for (size_t p = 0; parts && p < it->nparts; p++) {
            const ckptio_dcp_part *q = &it->parts[p];
            push(parts, json_pack("[IIo]", (json_int_t)q->offset, (json_int_t)q->length, hex(q->hash)), ok);
        }
        put(o, "parts", parts, ok);
    }
    json_t *tr = json_array();
    if (tr && (it->transforms & CKPTIO_DCP_TRANSFORM_ZSTD)) push(tr, json_string("stream.zstd/1"), ok);
    put(o, "transform", tr, ok);
    return o;
}

static bool item_valid(const ckptio_dcp_manifest_item *it) {
    return it->fqn && it->file && (!it->nparts || it->parts) && (!it->ndim || it->offset) && it->ndim <= 64 &&
           it->data_offset <= INT64_MAX && it->nbytes <= INT64_MAX - it->data_offset;
}

ckptio_status ckptio__dcp_manifest_text(const char *dir, const char *metadata_name, const char *const *files,
                                       size_t nfiles, const ckptio_dcp_manifest_item *items, size_t count,
                                       char **out, char name[CKPTIO__DCP_MANIFEST_NAME_SIZE]) {
    *out = NULL;
    CKPTIO_RETURN_IF(!dir || !metadata_name || (!files && nfiles) || (!items && count), CKPTIO_E_INVAL,
                     "ckptio__dcp_manifest_write: dir, metadata_name, files and items are required");
    if (!ckptio__dcp_manifest_name(files, nfiles, name))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio__dcp_manifest_write: the %zu files are not the data files of one "
                           "ckptio save (__RANK_TOKEN_N.distcp with one TOKEN)", nfiles);
    for (size_t i = 0; i < count; i++)
        CKPTIO_RETURN_IF(!item_valid(&items[i]), CKPTIO_E_INVAL, "ckptio__dcp_manifest_write: item %zu is incomplete "
                         "or out of range", i);
    bool ok = true;
    json_t *root = json_object(), *list = json_array(), *arr = json_array();
    if (!root || !list || !arr) ok = false;
    for (size_t i = 0; ok && i < nfiles; i++) push(list, json_string(files[i]), &ok);
    for (size_t i = 0; ok && i < count; i++) push(arr, item_json(&items[i], &ok), &ok);
    if (root) {
        put(root, "format", json_string("ckptio-dcp-manifest"), &ok);
        put(root, "version", json_integer(1), &ok);
        put(root, "hash", json_string("xxh3-64"), &ok);
        put(root, "metadata", json_string(metadata_name), &ok);
        put(root, "files", list, &ok);
        put(root, "items", arr, &ok);
    } else {
        json_decref(list);
        json_decref(arr);
    }
    /* json_string() refuses text that is not UTF-8: an fqn or name the
     * caller got wrong, reported as such rather than as memory. */
    char *text = ok ? json_dumps(root, JSON_INDENT(1) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (!text)
        return CKPTIO_FAIL(ok ? CKPTIO_E_NOMEM : CKPTIO_E_INVAL,
                           "ckptio__dcp_manifest_write: cannot build the manifest of %s (out of memory, or a name that "
                           "is not UTF-8)", dir);
    *out = text;
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_manifest_write(const char *dir, const char *metadata_name, const char *const *files,
                                        size_t nfiles, const ckptio_dcp_manifest_item *items, size_t count,
                                        const char *reference, unsigned flags) {
    char *text, name[CKPTIO__DCP_MANIFEST_NAME_SIZE];
    CKPTIO_FORWARD(ckptio__dcp_manifest_text(dir, metadata_name, files, nfiles, items, count, &text, name));
    const ckptio_status st = ckptio__dcp_write_file(dir, name, text, strlen(text), reference, flags);
    free(text);
    return st;
}
