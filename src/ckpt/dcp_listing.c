/*
 * dcp_listing.c - the sizes and ETags of the objects directly under a DCP
 * checkpoint's prefix, from one listing run on a thread of its own while
 * .metadata is read: a data object found there opens with no request
 * (ckptio_dcp_file_open_listed) where it would send a HEAD. Its reads name
 * the listed ETag in If-Match, so an object replaced since fails E_STALE as
 * after a HEAD. The listing's ETags are used only if it gives .metadata the
 * ETag that its GET answered with: some servers list other ETags than their
 * GETs answer to (gateways, encryption modes), where every read would fail.
 * A listing that failed (no permission to list) or a name past its first
 * LISTED_MAX entries leaves the object to its HEAD. The Python reader's rule
 * (python/ckptio/dcp/_objects.py PrefixListing) is the same.
 */
#include "dcp_dir_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LISTED_MAX 1000

typedef struct listed {
    char *name, *etag;
    uint64_t size;
} listed;

struct ckptio__dcp_listing {
    ckptio_engine *engine;
    char *prefix;
    pthread_t thread;
    listed *entries;
    size_t n, cap;
    bool failed; /* out of memory, or the listing failed */
    bool joined;
};

static int note(void *user, const ckptio_object_info *info) {
    ckptio__dcp_listing *l = user;
    if (info->is_prefix || !info->etag[0]) return 0;
    if (l->n == l->cap) {
        const size_t cap = l->cap ? l->cap * 2 : 64;
        listed *grown = ckptio__realloc(l->entries, cap * sizeof *grown);
        if (!grown) return l->failed = true, 1;
        l->entries = grown;
        l->cap = cap;
    }
    listed *e = &l->entries[l->n];
    const char *slash = strrchr(info->key, '/');
    e->name = ckptio__strdup(slash ? slash + 1 : info->key);
    e->etag = ckptio__strdup(info->etag);
    e->size = info->size;
    if (!e->name || !e->etag) {
        ckptio__free(e->name);
        ckptio__free(e->etag);
        return l->failed = true, 1;
    }
    return ++l->n >= LISTED_MAX;
}

static void *run(void *arg) {
    ckptio__dcp_listing *l = arg;
    /* Its failure is no error of the load: the objects then open with HEADs. */
    if (ckptio_object_list(l->engine, l->prefix, "/", note, l) != CKPTIO_OK) l->failed = true;
    return NULL;
}

ckptio_status ckptio__dcp_listing_start(ckptio_engine *engine, const char *dir, ckptio__dcp_listing **out) {
    *out = NULL;
    if (!engine || !ckptio_path_is_object(dir)) return CKPTIO_OK;
    ckptio__dcp_listing *l = ckptio__calloc(1, sizeof *l);
    const size_t len = strlen(dir);
    if (!l || !(l->prefix = ckptio__malloc(len + 2))) {
        ckptio__free(l);
        return CKPTIO_OK; /* no listing: HEADs */
    }
    snprintf(l->prefix, len + 2, "%s%s", dir, dir[len - 1] == '/' ? "" : "/");
    l->engine = engine;
    if (ckptio__thread_start(&l->thread, NULL, run, l) != 0) {
        ckptio__free(l->prefix);
        ckptio__free(l);
        return CKPTIO_OK;
    }
    *out = l;
    return CKPTIO_OK;
}

static const listed *find(const ckptio__dcp_listing *l, const char *name) {
    for (size_t i = 0; l && !l->failed && i < l->n; i++)
        if (!strcmp(l->entries[i].name, name)) return &l->entries[i];
    return NULL;
}

void ckptio__dcp_listing_finish(ckptio__dcp_listing *l, const char *witness, const char *etag) {
    if (!l) return;
    pthread_join(l->thread, NULL);
    l->joined = true;
    const listed *w = find(l, witness);
    if (!w || !etag || strcmp(w->etag, etag) != 0) l->failed = true;
}

bool ckptio__dcp_listing_get(const ckptio__dcp_listing *l, const char *name, uint64_t *size, const char **etag) {
    const listed *e = find(l, name);
    if (!e) return false;
    *size = e->size;
    *etag = e->etag;
    return true;
}

void ckptio__dcp_listing_free(ckptio__dcp_listing *l) {
    if (!l) return;
    if (!l->joined) pthread_join(l->thread, NULL);
    for (size_t i = 0; i < l->n; i++) {
        ckptio__free(l->entries[i].name);
        ckptio__free(l->entries[i].etag);
    }
    ckptio__free(l->entries);
    ckptio__free(l->prefix);
    ckptio__free(l);
}
