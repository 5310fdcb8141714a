/*
 * dcp_cleanup_objects.c - the object-storage half of step 4 of a DCP
 * directory commit (dcp_cleanup.c decides what goes): listing an object
 * directory with what the cleanup leaves alone (objects of the save that
 * holds the lease now, live shared saves' marks), deleting objects, and
 * aborting the multipart uploads killed saves left.
 *
 * In object storage every file is a request: the listing (and the abort of
 * killed saves' uploads) can start beside the .metadata PUT (a prefetch,
 * which the commit starts once the lease was checked), and the deletes run
 * several at a time.
 */
#include "dcp_commit_internal.h"
#include "dcp_dir_internal.h"
#include "io_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

/* ---- directories in object storage ----------------------------------------------- */

/* A directory's objects as listed, for the cleanup. */
typedef struct object_lister {
    ckptio__dcp_list *all; /* every object's name */
    double *mtimes;        /* all's LastModified (0: unknown) */
    size_t cap;
    ckptio__dcp_list marks; /* the shared saves' marks among them */
    bool nomem;
} object_lister;

static int object_entry(void *user, const ckptio__object_entry *e) {
    object_lister *l = user;
    if (e->kind != CKPTIO__PATH_FILE) return 0; /* prefixes and names no file can have are never removed */
    if (l->all->n >= l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 64;
        double *m = ckptio__realloc(l->mtimes, cap * sizeof *m);
        if (!m) return l->nomem = true;
        l->mtimes = m;
        l->cap = cap;
    }
    l->mtimes[l->all->n] = e->mtime;
    const bool ok = ckptio__dcp_list_add(l->all, e->name) &&
                    (!ckptio__dcp_shared_mark_name(e->name) || ckptio__dcp_list_add(&l->marks, e->name));
    if (!ok) l->nomem = true;
    return !ok;
}

ckptio_status ckptio__dcp_list_objects(ckptio_engine *engine, const char *dir, ckptio__dcp_list *out,
                                       ckptio__dcp_list *young, double *keep_since) {
    object_lister l = {.all = out};
    ckptio_status st = ckptio__object_dir_list(engine, dir, object_entry, &l);
    if (st == CKPTIO_OK && l.nomem) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
    double since = 0;
    bool *dead = young ? ckptio__calloc(l.marks.n + 1, sizeof *dead) : NULL;
    if (st == CKPTIO_OK && young && !dead) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK && young) st = ckptio__dcp_keep_since(engine, dir, l.marks.v, l.marks.n, &since, dead);
    for (size_t i = 0; st == CKPTIO_OK && young && i < out->n; i++) {
        const char *name = out->v[i];
        const double mtime = l.mtimes[i];
        bool keep = since > 0 && (mtime == 0 || mtime >= since);
        if (ckptio__dcp_shared_mark_name(name)) { /* a live one stays, however old its last write */
            keep = true;
            for (size_t k = 0; k < l.marks.n; k++)
                if (!strcmp(l.marks.v[k], name)) keep = !dead[k];
        }
        if (keep && !ckptio__dcp_list_add(young, name))
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
    }
    ckptio__free(dead);
    ckptio__free(l.mtimes);
    ckptio__dcp_list_clear(&l.marks);
    if (keep_since) *keep_since = since;
    if (st != CKPTIO_OK)
        return ckptio__fail(st, __FILE__, __LINE__,
                            &((ckptio__err_ctx){.operation = "listdir", .path = dir, .file_offset = -1,
                                                .verbatim = true}),
                            "%s (looking for files of older saves; %s)", ckptio_last_error_message(),
                            CKPTIO__DCP_COMMITTED);
    if (young) ckptio__dcp_list_sort(young);
    return CKPTIO_OK;
}

/* ---- what the cleanup of an object directory starts early ------------------------------ */

/* The listing of an object directory and the abort of its old uploads, run
 * on threads of their own beside the .metadata PUT (the lease checked). */
struct ckptio__dcp_prefetch {
    ckptio_engine *engine;
    char *dir;
    pthread_t lister, aborter;
    bool listing, aborting;      /* the thread was started and not joined yet */
    ckptio__dcp_list all, young;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool listed;                 /* the listing is done: keep_since is known (0 when it failed) */
    double keep_since;
    ckptio_status list_st;
    ckptio__error_saved *list_error;
    ckptio_status abort_st;
    ckptio__error_saved *abort_error;
};

static void *prefetch_list(void *arg) {
    ckptio__dcp_prefetch *p = arg;
    double since = 0;
    p->list_st = ckptio__dcp_list_objects(p->engine, p->dir, &p->all, &p->young, &since);
    if (p->list_st != CKPTIO_OK) p->list_error = ckptio__error_save();
    pthread_mutex_lock(&p->mu);
    p->keep_since = p->list_st == CKPTIO_OK ? since : 0;
    p->listed = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static ckptio_status abort_uploads_listed(ckptio_engine *engine, const char *dir, double (*since_fn)(void *),
                                          void *user);

/* The abort's time waits for the directory's listing: an upload a live shared save began before the lease was
 * taken is that save's (its mark says since when). */
static double prefetch_keep_since(void *arg) {
    ckptio__dcp_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->listed) pthread_cond_wait(&p->cv, &p->mu);
    const double since = p->keep_since;
    pthread_mutex_unlock(&p->mu);
    return since;
}

/* The uploads are listed beside the directory's listing, not after it: those the abort may take are older than
 * the time that listing gives, whenever they were listed (an upload begun later is younger; one not listed is
 * kept), so the order of the two listings changes nothing but the round trip. */
static void *prefetch_abort(void *arg) {
    ckptio__dcp_prefetch *p = arg;
    p->abort_st = abort_uploads_listed(p->engine, p->dir, prefetch_keep_since, p);
    if (p->abort_st != CKPTIO_OK) p->abort_error = ckptio__error_save();
    return NULL;
}

ckptio_status ckptio__dcp_prefetch_start(const char *dir, bool abort_uploads, ckptio__dcp_prefetch **out) {
    *out = NULL;
    if (!ckptio__s3_is_url(dir)) return CKPTIO_OK;
    ckptio__dcp_prefetch *p = ckptio__calloc(1, sizeof *p);
    if (!p || !(p->dir = ckptio__strdup(dir))) {
        ckptio__free(p);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    ckptio_status st = ckptio_engine_create(&p->engine);
    if (st != CKPTIO_OK) {
        ckptio__free(p->dir);
        ckptio__free(p);
        return st;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    /* A thread that cannot start leaves its work to the cleanup itself. */
    p->listing = pthread_create(&p->lister, NULL, prefetch_list, p) == 0;
    p->aborting = abort_uploads && p->listing && pthread_create(&p->aborter, NULL, prefetch_abort, p) == 0;
    *out = p;
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_prefetch_take_listing(ckptio__dcp_prefetch *p, ckptio__dcp_list *all,
                                                ckptio__dcp_list *young) {
    if (!p->listing && !p->all.v && p->list_st == CKPTIO_OK)
        return ckptio__dcp_list_objects(p->engine, p->dir, all, young, NULL);
    if (p->listing) pthread_join(p->lister, NULL);
    p->listing = false;
    if (p->list_st != CKPTIO_OK) {
        ckptio__error_restore(p->list_error);
        p->list_error = NULL;
        return p->list_st;
    }
    *all = p->all;
    *young = p->young;
    p->all = p->young = (ckptio__dcp_list){0};
    return CKPTIO_OK;
}

/* Waits for the abort; its failure (with its message). */
static ckptio_status prefetch_abort_result(ckptio__dcp_prefetch *p) {
    if (p->aborting) pthread_join(p->aborter, NULL);
    p->aborting = false;
    const ckptio_status st = p->abort_st;
    p->abort_st = CKPTIO_OK;
    if (st != CKPTIO_OK) {
        ckptio__error_restore(p->abort_error);
        p->abort_error = NULL;
    }
    return st;
}

void ckptio__dcp_prefetch_finish(ckptio__dcp_prefetch *p) {
    if (!p) return;
    ckptio__error_saved *kept = ckptio__error_save();
    if (p->listing) pthread_join(p->lister, NULL);
    if (p->aborting) pthread_join(p->aborter, NULL);
    ckptio__free(p->list_error);
    ckptio__free(p->abort_error);
    ckptio__dcp_list_clear(&p->all);
    ckptio__dcp_list_clear(&p->young);
    ckptio_engine_destroy(p->engine);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    ckptio__free(p->dir);
    ckptio__free(p);
    ckptio__error_restore(kept);
}

/* ---- removing objects ---------------------------------------------------------------- */

/* Deletes at once: each is one round trip, so the older save's objects go
 * in the time of a few rather than one after another. */
#define DELETE_THREADS 8

typedef struct object_removal {
    ckptio_engine *engine;
    const char *dir;
    char **urls;
    size_t n;
    atomic_size_t next, removed;
    pthread_mutex_t mu;
    ckptio_status first;            /* the first failed delete, its message in first_error */
    ckptio__error_saved *first_error;
    ckptio_status uploads;          /* aborting the killed saves' uploads, its message in uploads_error */
    ckptio__error_saved *uploads_error;
    ckptio__dcp_prefetch *prefetched; /* the abort runs there already */
} object_removal;

static void *delete_objects(void *arg) {
    object_removal *r = arg;
    for (size_t i; (i = atomic_fetch_add(&r->next, 1)) < r->n;) {
        const ckptio_status st = ckptio__object_remove(r->engine, r->urls[i]);
        if (st == CKPTIO_OK) {
            atomic_fetch_add(&r->removed, 1);
            continue;
        }
        ckptio__fail(st, __FILE__, __LINE__,
                     &((ckptio__err_ctx){.operation = "unlink", .path = r->urls[i], .file_offset = -1,
                                         .verbatim = true}),
                     "%s (removing a file of an older save; %s)", ckptio_last_error_message(), CKPTIO__DCP_COMMITTED);
        pthread_mutex_lock(&r->mu);
        if (r->first == CKPTIO_OK) {
            r->first = st;
            r->first_error = ckptio__error_save();
        }
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

typedef struct since_of {
    double (*fn)(void *);
    void *user;
} since_of;

static double abort_cutoff(void *arg) {
    const since_of *s = arg;
    const double since = s->fn(s->user);
    /* No lease of ckptio's to measure "older" by (or a mark keeps all): none. Strictly before: an upload begun
     * in that second may be the live save's (the server's clock has whole seconds). */
    return since <= 1 ? -1 : since - 1;
}

/* The uploads that killed saves left under the directory (billed, invisible): those begun before the `since`
 * that since_fn(user) gives once they are listed (ckptio__dcp_list_objects' keep_since: the lease now held was
 * taken and no live shared save was marked), whose saves are over. */
static ckptio_status abort_uploads_listed(ckptio_engine *engine, const char *dir, double (*since_fn)(void *),
                                          void *user) {
    ckptio__error_saved *kept = ckptio__error_save();
    char *prefix = ckptio__path_join(dir, ""); /* "DIR/": not DIR2/ too */
    since_of s = {since_fn, user};
    const ckptio_status st = prefix ? ckptio__object_abort_uploads_listed(engine, prefix, abort_cutoff, &s, NULL)
                                    : CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio__free(prefix);
    if (st == CKPTIO_OK) {
        ckptio__error_restore(kept);
        return CKPTIO_OK;
    }
    ckptio__free(kept);
    return ckptio__fail(st, __FILE__, __LINE__,
                        &((ckptio__err_ctx){.operation = "abort uploads", .path = dir, .file_offset = -1,
                                            .verbatim = true}),
                        "%s (aborting the uploads of older saves; %s)", ckptio_last_error_message(),
                        CKPTIO__DCP_COMMITTED);
}

static double known_since(void *arg) { return *(const double *)arg; }

static ckptio_status abort_uploads_before(ckptio_engine *engine, const char *dir, double since) {
    if (since <= 1) return CKPTIO_OK; /* nothing to abort: no request */
    return abort_uploads_listed(engine, dir, known_since, &since);
}

/* abort_uploads_before, its time from the lease held here and the shared
 * saves' marks, listed alone (the listing's prefix is their names': the
 * directory's other objects are not paged through for them); only while this
 * process holds the lease. Without it (a cleanup run after the release) the
 * lease read could be a later save's, taken after a save without a cleanup
 * marked itself and began its uploads unseen by the listing: aborting
 * before that lease's time could end such a live upload. The uploads are
 * left to the next save's cleanup and `ckptio clean`. */
static ckptio_status abort_uploads_now(ckptio_engine *engine, const char *dir) {
    if (!ckptio__dcp_lease_held_here(dir)) return CKPTIO_OK;
    ckptio__dcp_list all = {0};
    object_lister l = {.all = &all};
    double since = 0;
    ckptio__error_saved *kept = ckptio__error_save();
    ckptio_status st = ckptio__object_dir_list_starting(engine, dir, CKPTIO__DCP_SHARED_PREFIX, object_entry, &l);
    if (st == CKPTIO_OK && l.nomem) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
    bool *dead = st == CKPTIO_OK ? ckptio__calloc(l.marks.n + 1, sizeof *dead) : NULL;
    if (st == CKPTIO_OK && !dead) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) st = ckptio__dcp_keep_since(engine, dir, l.marks.v, l.marks.n, &since, dead);
    ckptio__free(dead);
    ckptio__free(l.mtimes);
    ckptio__dcp_list_clear(&l.marks);
    ckptio__dcp_list_clear(&all);
    ckptio__error_restore(kept);
    if (st != CKPTIO_OK) return CKPTIO_OK; /* nothing to measure "older" by: nothing aborted */
    return abort_uploads_before(engine, dir, since);
}

static void *abort_old_uploads(void *arg) {
    object_removal *r = arg;
    if (r->prefetched && r->prefetched->aborting) { /* begun beside the .metadata PUT */
        r->uploads = prefetch_abort_result(r->prefetched);
    } else {
        r->uploads = abort_uploads_now(r->engine, r->dir);
    }
    if (r->uploads != CKPTIO_OK) r->uploads_error = ckptio__error_save();
    return NULL;
}

ckptio_status ckptio__dcp_remove_objects(ckptio_engine *engine, const char *dir, char **urls, size_t n,
                                         ckptio__dcp_prefetch *prefetched, size_t *removed) {
    object_removal r = {.engine = engine, .dir = dir, .urls = urls, .n = n, .prefetched = prefetched};
    atomic_init(&r.next, 0);
    atomic_init(&r.removed, 0);
    pthread_mutex_init(&r.mu, NULL);
    pthread_t uploads, workers[DELETE_THREADS];
    const bool uploads_thread = pthread_create(&uploads, NULL, abort_old_uploads, &r) == 0;
    size_t started = 0;
    while (started < DELETE_THREADS && started + 1 < n &&
           pthread_create(&workers[started], NULL, delete_objects, &r) == 0)
        started++;
    delete_objects(&r); /* this thread deletes too (all of them when no thread could start) */
    for (size_t i = 0; i < started; i++) pthread_join(workers[i], NULL);
    if (uploads_thread) pthread_join(uploads, NULL);
    else if (r.first == CKPTIO_OK) abort_old_uploads(&r);
    pthread_mutex_destroy(&r.mu);
    *removed = atomic_load(&r.removed);
    if (r.first != CKPTIO_OK) {
        ckptio__free(r.uploads_error);
        ckptio__error_restore(r.first_error);
        return r.first;
    }
    if (r.uploads != CKPTIO_OK) ckptio__error_restore(r.uploads_error);
    return r.uploads;
}
