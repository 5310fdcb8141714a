/*
 * steps_root_io.c - how a checkpoint manager's root in object storage is
 * reached: the engine (the caller's, or a temporary one: the functions
 * that change a root take no engine, and requests need its S3 settings),
 * and the single-object operations of the step protocol (steps_object.c
 * lists; steps_marker.c, steps_remove.c and steps_scan.c use both).
 */
#include "common_internal.h"
#include "io_internal.h"
#include "steps_internal.h"

#include <string.h>
#include <xxhash.h>

ckptio_status ckptio__steps_engine(ckptio_engine *given, const char *root, ckptio_engine **use, ckptio_engine **owned) {
    *use = *owned = NULL;
    if (!ckptio__s3_is_url(root)) return CKPTIO_OK;
    if (given) {
        *use = given;
        return CKPTIO_OK;
    }
    CKPTIO_FORWARD(ckptio_engine_create(owned));
    *use = *owned;
    return CKPTIO_OK;
}

void ckptio__steps_engine_done(ckptio_engine *owned) {
    if (!owned) return;
    ckptio__error_saved *saved = ckptio__error_save();
    ckptio_engine_destroy(owned);
    ckptio__error_restore(saved);
}

ckptio_status ckptio__step_object_kind(ckptio_engine *e, const char *path, ckptio__path_kind *kind, uint64_t *size) {
    return ckptio__object_stat(e, path, kind, size);
}

ckptio_status ckptio__step_object_read(ckptio_engine *e, const char *path, char *buf, size_t cap, size_t *len) {
    void *data = NULL;
    size_t n = 0;
    *len = 0;
    CKPTIO_FORWARD(ckptio__object_read_all(e, path, cap, &data, &n));
    memcpy(buf, data, n);
    ckptio__free(data);
    *len = n;
    return CKPTIO_OK;
}

ckptio_status ckptio__step_object_metadata_hash(ckptio_engine *e, const char *dir, uint64_t *size, uint64_t *hash) {
    char *path = ckptio__path_join(dir, ".metadata");
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    void *data = NULL;
    size_t n = 0;
    const ckptio_status st = ckptio__object_read_all(e, path, (uint64_t)1 << 31, &data, &n);
    if (st == CKPTIO_OK) {
        *size = n;
        *hash = XXH3_64bits(data, n);
    }
    ckptio__free(data);
    ckptio__free(path);
    return st;
}

ckptio_status ckptio__step_object_put(ckptio_engine *e, const char *dir, const char *name, const void *data,
                                      size_t len) {
    char *path = ckptio__path_join(dir, name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    const ckptio_status st = ckptio__object_write_all(e, path, data, len, false);
    ckptio__free(path);
    return st;
}

ckptio_status ckptio__step_object_delete(ckptio_engine *e, const char *dir, const char *name) {
    char *path = ckptio__path_join(dir, name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    const ckptio_status st = ckptio__object_remove(e, path);
    ckptio__free(path);
    return st;
}

ckptio_status ckptio__step_object_abort_uploads(ckptio_engine *e, const char *dir) {
    char *prefix = ckptio__path_join(dir, "");
    if (!prefix) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    const ckptio_status st = ckptio__object_abort_uploads_before(e, prefix, 0, NULL);
    ckptio__free(prefix);
    return st;
}
