/*
 * object_api.c - the public functions on objects beyond files
 * (ckptio/object.h): listing, deleting, small conditional writes, and
 * the cleanup of multipart uploads that killed saves left unfinished.
 */
#include "io_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

int ckptio_path_is_object(const char *path) { return ckptio__s3_is_url(path) ? 1 : 0; }

/* Parses the URL and makes a client with the engine's settings. */
static ckptio_status target(ckptio_engine *engine, const char *url, bool allow_empty_key, const char *fn,
                            ckptio__s3_client **client, char **bucket, char **key) {
    *client = NULL;
    *bucket = *key = NULL;
    CKPTIO_RETURN_IF(!engine || !url, CKPTIO_E_INVAL, "%s: engine and url are required", fn);
    return ckptio__object_target(engine, url, allow_empty_key, client, bucket, key);
}

typedef struct relay {
    ckptio_object_fn fn;
    void *user;
} relay;

static int relay_entry(void *user, const ckptio__s3_entry *e) {
    const relay *r = user;
    const ckptio_object_info info = {.key = e->key, .size = e->size, .etag = e->etag, .time = e->time,
                                     .upload_id = e->upload_id, .is_prefix = e->is_prefix};
    return r->fn(r->user, &info);
}

ckptio_status ckptio_object_list(ckptio_engine *engine, const char *url, const char *delimiter, ckptio_object_fn fn,
                                 void *user) {
    CKPTIO_RETURN_IF(!fn, CKPTIO_E_INVAL, "ckptio_object_list: fn is required");
    ckptio__s3_client *c;
    char *bucket, *prefix;
    CKPTIO_FORWARD(target(engine, url, true, "ckptio_object_list", &c, &bucket, &prefix));
    relay r = {fn, user};
    const ckptio_status st = ckptio__s3_list(c, bucket, prefix, delimiter, relay_entry, &r);
    ckptio__object_target_release(c, bucket, prefix);
    return st;
}

ckptio_status ckptio_object_list_uploads(ckptio_engine *engine, const char *url, ckptio_object_fn fn, void *user) {
    CKPTIO_RETURN_IF(!fn, CKPTIO_E_INVAL, "ckptio_object_list_uploads: fn is required");
    ckptio__s3_client *c;
    char *bucket, *prefix;
    CKPTIO_FORWARD(target(engine, url, true, "ckptio_object_list_uploads", &c, &bucket, &prefix));
    relay r = {fn, user};
    const ckptio_status st = ckptio__s3_list_uploads(c, bucket, prefix, relay_entry, &r);
    ckptio__object_target_release(c, bucket, prefix);
    return st;
}

ckptio_status ckptio_object_delete(ckptio_engine *engine, const char *url) {
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(target(engine, url, false, "ckptio_object_delete", &c, &bucket, &key));
    ckptio__object_peek_forget(engine, url);
    const ckptio_status st = ckptio__s3_delete(c, bucket, key);
    ckptio__object_target_release(c, bucket, key);
    return st;
}

ckptio_status ckptio_object_put(ckptio_engine *engine, const char *url, const void *data, size_t len,
                                int if_absent) {
    CKPTIO_RETURN_IF(!data && len, CKPTIO_E_INVAL, "ckptio_object_put: data is NULL");
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(target(engine, url, false, "ckptio_object_put", &c, &bucket, &key));
    ckptio__object_peek_forget(engine, url);
    const ckptio_status st = ckptio__s3_put(c, bucket, key, data, len, if_absent != 0);
    ckptio__object_target_release(c, bucket, key);
    return st;
}

typedef struct upload_list {
    char **keys, **ids;
    double *times; /* Initiated, seconds since the epoch (-1: unknown) */
    size_t n, cap;
    bool nomem;
} upload_list;

static int gather(void *user, const ckptio__s3_entry *e) {
    upload_list *l = user;
    if (e->is_prefix || !e->upload_id[0]) return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **k = ckptio__realloc(l->keys, cap * sizeof *k);
        if (k) l->keys = k;
        char **i = k ? ckptio__realloc(l->ids, cap * sizeof *i) : NULL;
        if (i) l->ids = i;
        double *t = i ? ckptio__realloc(l->times, cap * sizeof *t) : NULL;
        if (t) l->times = t;
        if (!k || !i || !t) return l->nomem = true, 1;
        l->cap = cap;
    }
    l->keys[l->n] = ckptio__strdup(e->key);
    l->ids[l->n] = ckptio__strdup(e->upload_id);
    l->times[l->n] = ckptio__iso_time(e->time);
    if (!l->keys[l->n] || !l->ids[l->n]) {
        ckptio__free(l->keys[l->n]);
        ckptio__free(l->ids[l->n]);
        return l->nomem = true, 1;
    }
    l->n++;
    return 0;
}

ckptio_status ckptio_object_abort_uploads(ckptio_engine *engine, const char *url, double older_than_seconds,
                                          uint64_t *aborted) {
    if (aborted) *aborted = 0;
    CKPTIO_RETURN_IF(!(older_than_seconds >= 0), CKPTIO_E_INVAL,
                     "ckptio_object_abort_uploads: older_than_seconds must be 0 or more");
    return ckptio__object_abort_uploads_before(engine, url,
                                               older_than_seconds > 0 ? (double)time(NULL) - older_than_seconds : 0,
                                               aborted);
}

static double fixed_cutoff(void *user) { return *(const double *)user; }

ckptio_status ckptio__object_abort_uploads_before(ckptio_engine *engine, const char *url, double cutoff,
                                                  uint64_t *aborted) {
    return ckptio__object_abort_uploads_listed(engine, url, fixed_cutoff, &cutoff, aborted);
}

ckptio_status ckptio__object_abort_uploads_listed(ckptio_engine *engine, const char *url,
                                                  double (*cutoff_fn)(void *user), void *user, uint64_t *aborted) {
    if (aborted) *aborted = 0;
    ckptio__s3_client *c;
    char *bucket, *prefix;
    CKPTIO_FORWARD(target(engine, url, true, "ckptio_object_abort_uploads", &c, &bucket, &prefix));
    upload_list l = {0};
    /* Listed first, aborted after: aborting while paging would move the markers. */
    ckptio_status st = ckptio__s3_list_uploads(c, bucket, prefix, gather, &l);
    if (st == CKPTIO_OK && l.nomem) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing uploads");
    const double cutoff = st == CKPTIO_OK ? cutoff_fn(user) : -1;
    for (size_t i = 0; i < l.n && st == CKPTIO_OK && cutoff >= 0; i++) {
        if (cutoff && (l.times[i] < 0 || l.times[i] > cutoff)) continue; /* too young, or of unknown age: kept */
        st = ckptio__s3_mpu_abort(c, bucket, l.keys[i], l.ids[i]);
        if (st == CKPTIO_OK && aborted) (*aborted)++;
    }
    for (size_t i = 0; i < l.n; i++) {
        ckptio__free(l.keys[i]);
        ckptio__free(l.ids[i]);
    }
    ckptio__free(l.keys);
    ckptio__free(l.ids);
    ckptio__free(l.times);
    ckptio__object_target_release(c, bucket, prefix);
    return st;
}
