/*
 * engine.c - ckptio_engine: lifetime (its settings come from settings.c),
 * statistics, progress, and the hooks the GPU layer uses.
 */
#include "engine_private.h"

#include <string.h>

/* Progress callbacks come at most this often (plus first and last). */
#define CKPTIO_PROGRESS_INTERVAL 0.010

static void engine_file_ref(ckptio_engine *e, int delta) {
    if (e) atomic_fetch_add(&e->open_files, delta);
}

static ckptio__s3_part_pool *engine_part_pool(ckptio_engine *e) {
    ckptio__engine_fork_check(e);
    pthread_mutex_lock(&e->lock);
    if (!e->part_pool && ckptio__s3_part_pool_create(&e->part_pool) != CKPTIO_OK) e->part_pool = NULL;
    ckptio__s3_part_pool *p = e->part_pool;
    pthread_mutex_unlock(&e->lock);
    return p;
}

static _Atomic(ckptio__object_peek *) *engine_peek_slot(ckptio_engine *e) { return &e->peek; }

/* How the files opened with an engine (src/io, a layer below) reach it. */
static const ckptio__engine_link io_link = {
    .setting = ckptio__engine_setting,
    .stats_add = ckptio__engine_stats_add,
    .file_ref = engine_file_ref,
    .commit_poll = ckptio__engine_commit_poll,
    .part_pool = engine_part_pool,
    .peek_slot = engine_peek_slot,
};

ckptio_status ckptio__engine_create(const ckptio__device_provider *device, ckptio_engine **out) {
    CKPTIO_RETURN_IF(!out, CKPTIO_E_INVAL, "ckptio_engine_create: out is NULL");
    *out = NULL;
    ckptio__io_set_engine_link(&io_link);
    ckptio_engine *e = ckptio__calloc(1, sizeof *e);
    if (!e) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory creating an engine");
    e->device = device;
    pthread_mutex_init(&e->lock, NULL);
    atomic_init(&e->generation, ckptio__fork_generation());
    ckptio_status st = ckptio__settings_init(e);
    if (st != CKPTIO_OK) {
        pthread_mutex_destroy(&e->lock);
        ckptio__free(e);
        return st;
    }
    *out = e;
    return CKPTIO_OK;
}

void ckptio__engine_slot_release(ckptio_engine *e, ckptio__worker_slot *s) {
    if (s->queue) s->backend->queue_destroy(s->queue);
    s->queue = NULL;
    s->bounce_registered = false;
    if (s->bounce) {
        ckptio__free(s->bounce);
        ckptio__engine_staging(e, -(int64_t)s->bounce_size, 0);
    }
    s->bounce = NULL;
    s->bounce_size = 0;
}

ckptio_status ckptio__engine_reserve_slots(ckptio_engine *e, unsigned n) {
    if (n <= e->nslots) return CKPTIO_OK;
    ckptio__worker_slot *s = ckptio__realloc(e->slots, n * sizeof *s);
    if (!s) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %u worker slots", n);
    memset(s + e->nslots, 0, (n - e->nslots) * sizeof *s);
    e->slots = s;
    e->nslots = n;
    return CKPTIO_OK;
}

ckptio_status ckptio_engine_destroy(ckptio_engine *e) {
    if (!e) return CKPTIO_OK;
    ckptio__engine_fork_check(e); /* never join a parent's threads */
    const int busy = atomic_load(&e->busy);
    if (busy) return CKPTIO_FAIL(CKPTIO_E_BUSY, "the engine is still executing a transfer on another thread");
    const int files = atomic_load(&e->open_files);
    if (files)
        return CKPTIO_FAIL(CKPTIO_E_BUSY, "%d file(s) opened with this engine are still open; close them first",
                           files);
    ckptio__pool_destroy(e->pool);
    for (unsigned i = 0; i < e->nslots; i++) ckptio__engine_slot_release(e, &e->slots[i]);
    ckptio__free(e->slots);
    if (e->gpu_state && e->gpu_state_destroy) e->gpu_state_destroy(e->gpu_state);
    ckptio__s3_part_pool_destroy(e->part_pool); /* no file is open: no upload uses it */
    ckptio__object_peek_free(atomic_exchange(&e->peek, NULL));
    pthread_mutex_destroy(&e->lock);
    ckptio__free(e);
    return CKPTIO_OK;
}

ckptio_status ckptio_engine_set_progress(ckptio_engine *e, ckptio_progress_fn fn, void *user) {
    CKPTIO_RETURN_IF(!e, CKPTIO_E_INVAL, "ckptio_engine_set_progress: engine is NULL");
    e->progress = fn;
    e->progress_user = user;
    return CKPTIO_OK;
}

/* ---- fork ---------------------------------------------------------------- */

/* A fork()ed child's copy of an engine its parent used: the pool's threads
 * are gone (their bookkeeping would make the next transfer wait for them
 * forever), e->lock may be held by one of them, the io_uring rings are
 * shared with the parent and the GPU state belongs to a device the child
 * cannot use. All of it is replaced without touching the parent's side:
 *  - the lock is initialised afresh;
 *  - the pool's memory is freed; threads start again on first need;
 *  - each ring is closed through the child's own descriptor and mapping
 *    (the parent's ring lives on), bounce buffers (the child's
 *    copy-on-write pages) are freed;
 *  - the GPU state is dropped without its destructor, which would call the
 *    driver (or join simulated stream threads) on the parent's objects: its
 *    small struct leaks, once per engine and child, and GPU transfers in the
 *    child fail (src/gpu refuses a device initialised before fork());
 *  - the upload part pool's kept buffers are freed without its trimmer
 *    thread (ckptio__s3_part_pool_forget); a new pool starts on first need;
 *  - nothing of the parent's runs here: busy and staging are zero.
 * Settings, the progress callback, counters and open files stay. Runs under
 * the rebuild lock, before anything else in the child uses the engine. */
static void engine_rebuild_in_child(ckptio_engine *e) {
    pthread_mutex_init(&e->lock, NULL);
    ckptio__pool_forget(e->pool);
    e->pool = NULL;
    for (unsigned i = 0; i < e->nslots; i++) {
        ckptio__worker_slot *s = &e->slots[i];
        if (s->queue) s->backend->queue_destroy(s->queue);
        ckptio__free(s->bounce);
        memset(s, 0, sizeof *s);
    }
    e->gpu_state = NULL;
    e->gpu_state_destroy = NULL;
    ckptio__s3_part_pool_forget(e->part_pool);
    e->part_pool = NULL;
    e->progress_rebase = false;
    e->span = false;
    e->stats.staging_reserved = 0;
    e->stats.staging_in_use = 0;
    atomic_store(&e->busy, 0);
}

void ckptio__engine_fork_check(ckptio_engine *e) {
    const unsigned now = ckptio__fork_generation();
    if (atomic_load_explicit(&e->generation, memory_order_acquire) == now) return;
    ckptio__fork_rebuild_lock();
    if (atomic_load_explicit(&e->generation, memory_order_relaxed) != now) {
        engine_rebuild_in_child(e);
        atomic_store_explicit(&e->generation, now, memory_order_release);
    }
    ckptio__fork_rebuild_unlock();
}

/* ---- statistics -------------------------------------------------------- */

ckptio_status ckptio_engine_stats(const ckptio_engine *e, ckptio_stats *out) {
    CKPTIO_RETURN_IF(!e || !out, CKPTIO_E_INVAL, "ckptio_engine_stats: engine and out are required");
    ckptio__engine_fork_check((ckptio_engine *)e); /* logically const */
    pthread_mutex_t *lock = (pthread_mutex_t *)&e->lock; /* logically const */
    pthread_mutex_lock(lock);
    *out = e->stats;
    pthread_mutex_unlock(lock);
    return CKPTIO_OK;
}

void ckptio__engine_stats_add(ckptio_engine *e, const ckptio_stats *d) {
    if (!e || !d) return;
    ckptio__engine_fork_check(e);
    pthread_mutex_lock(&e->lock);
    ckptio_stats *s = &e->stats;
    s->bytes_read += d->bytes_read;
    s->bytes_written += d->bytes_written;
    s->bytes_direct += d->bytes_direct;
    s->bytes_buffered += d->bytes_buffered;
    s->bytes_bounced += d->bytes_bounced;
    s->bytes_h2d += d->bytes_h2d;
    s->bytes_d2h += d->bytes_d2h;
    s->bytes_cufile += d->bytes_cufile;
    s->io_requests += d->io_requests;
    s->retries += d->retries;
    s->seconds_io += d->seconds_io;
    s->seconds_fsync += d->seconds_fsync;
    s->seconds_copy += d->seconds_copy;
    pthread_mutex_unlock(&e->lock);
}

void ckptio__engine_staging(ckptio_engine *e, int64_t reserved_delta, int64_t in_use_delta) {
    if (!e) return;
    ckptio__engine_fork_check(e);
    pthread_mutex_lock(&e->lock);
    ckptio_stats *s = &e->stats;
    s->staging_reserved = (uint64_t)((int64_t)s->staging_reserved + reserved_delta);
    s->staging_in_use = (uint64_t)((int64_t)s->staging_in_use + in_use_delta);
    if (s->staging_in_use > s->staging_peak) s->staging_peak = s->staging_in_use;
    pthread_mutex_unlock(&e->lock);
}

/* ---- GPU hooks --------------------------------------------------------- */

void *ckptio__engine_gpu_state(ckptio_engine *e) {
    ckptio__engine_fork_check(e);
    return e->gpu_state;
}

void ckptio__engine_set_gpu_state(ckptio_engine *e, void *state, void (*destroy)(void *state)) {
    ckptio__engine_fork_check(e);
    e->gpu_state = state;
    e->gpu_state_destroy = destroy;
}

/* ---- progress and parallel work ----------------------------------------- */

ckptio_status ckptio__engine_report(ckptio_engine *e, uint64_t done, uint64_t total, bool force) {
    /* The program asked the library to stop (ckptio_interrupt): every
     * transfer cancels here, with or without a callback, before its end. */
    if (done < total && ckptio__interrupt_requested())
        return CKPTIO_FAIL(CKPTIO_E_CANCELED, "interrupted after %llu of %llu bytes", (unsigned long long)done,
                           (unsigned long long)total);
    if (!e->progress) return CKPTIO_OK;
    if (e->span) {
        /* A later plan's first report would repeat the last one's end. */
        if (force && done == 0 && e->span_base > 0) return CKPTIO_OK;
        done = e->span_base + done < e->span_total ? e->span_base + done : e->span_total;
        total = e->span_total;
    }
    /* done == total is the final report's alone, made after the transfer,
     * whose answer cannot cancel (ckptio/core.h). A periodic one can see every
     * byte counted while the workers are still finishing: reported, a
     * callback that stops at the end canceled a save that had moved every
     * byte, and no file was written. */
    if (!force && done >= total) return CKPTIO_OK;
    const double now = ckptio__now();
    if (!force && now - e->progress_last < CKPTIO_PROGRESS_INTERVAL) return CKPTIO_OK;
    e->progress_last = now;
    e->progress_done = done;
    e->progress_total = total;
    if (e->progress(done, total, e->progress_user) != 0)
        return CKPTIO_FAIL(CKPTIO_E_CANCELED, "the progress callback canceled the transfer after %llu of %llu bytes",
                           (unsigned long long)done, (unsigned long long)total);
    return CKPTIO_OK;
}

ckptio_status ckptio__engine_progress(ckptio_engine *e, uint64_t done, uint64_t total) {
    if (!e) return CKPTIO_OK;
    if (e->progress_rebase) return ckptio__engine_report(e, e->progress_base + done, e->progress_plan_total, false);
    return ckptio__engine_report(e, done, total, false);
}

ckptio_status ckptio__engine_commit_poll(ckptio_engine *e) {
    if (!e || !e->progress) return CKPTIO_OK;
    const double now = ckptio__now();
    if (now - e->progress_last < CKPTIO_PROGRESS_INTERVAL) return CKPTIO_OK;
    e->progress_last = now;
    if (e->progress(e->progress_done, e->progress_total, e->progress_user) != 0)
        return CKPTIO_FAIL(CKPTIO_E_CANCELED, "the progress callback canceled the transfer while its commit waited for "
                           "the last bytes to reach the server");
    return CKPTIO_OK;
}

void ckptio__engine_progress_done(ckptio_engine *e, uint64_t total) {
    if (e && !e->progress_rebase) (void)ckptio__engine_plan_done(e, total);
}

ckptio_status ckptio__engine_plan_done(ckptio_engine *e, uint64_t total) {
    const bool last = !e->span || e->span_base + total >= e->span_total;
    const ckptio_status st = ckptio__engine_report(e, total, total, true);
    if (e->span) e->span_base += total;
    /* The end of the call only informs: the bytes have all moved, so its
     * answer cannot cancel anything. Between a span's plans it still can. */
    return last ? CKPTIO_OK : st;
}

void ckptio__engine_progress_span_begin(ckptio_engine *e, uint64_t total) {
    e->span = true;
    e->span_base = 0;
    e->span_total = total;
}

void ckptio__engine_progress_span_end(ckptio_engine *e) { e->span = false; }

void ckptio__engine_progress_advance(ckptio_engine *e, uint64_t bytes) {
    if (e && e->progress_rebase) e->progress_base += bytes;
}

ckptio_status ckptio__engine_pool(ckptio_engine *e, ckptio__pool **out) {
    ckptio__engine_fork_check(e);
    ckptio_status st = CKPTIO_OK;
    pthread_mutex_lock(&e->lock);
    if (!e->pool) st = ckptio__pool_create(&e->pool);
    *out = e->pool;
    pthread_mutex_unlock(&e->lock);
    return st;
}

ckptio_status ckptio__engine_parallel(ckptio_engine *e, unsigned nworkers, ckptio__worker_fn fn, void *arg) {
    CKPTIO_RETURN_IF(!e || !fn, CKPTIO_E_INVAL, "ckptio__engine_parallel: engine and fn are required");
    if (nworkers <= 1) {
        fn(arg, 0);
        return CKPTIO_OK;
    }
    ckptio__pool *pool;
    CKPTIO_FORWARD(ckptio__engine_pool(e, &pool));
    return ckptio__pool_run(pool, nworkers, fn, arg, NULL, NULL, 0);
}

typedef struct progress_tick {
    ckptio_engine *engine;
    _Atomic uint64_t *done;
    uint64_t total;
    _Atomic int *cancel;
    bool canceled;
    ckptio__error_saved *record; /* error record of the cancel */
} progress_tick;

static void parallel_tick(void *arg) {
    progress_tick *t = arg;
    if (t->canceled || (t->cancel && atomic_load(t->cancel))) return;
    if (ckptio__engine_progress(t->engine, atomic_load(t->done), t->total) == CKPTIO_E_CANCELED) {
        t->canceled = true;
        t->record = ckptio__error_save();
        if (t->cancel) atomic_store(t->cancel, 1);
    }
}

ckptio_status ckptio__engine_parallel_progress(ckptio_engine *e, unsigned nworkers, ckptio__worker_fn fn, void *arg,
                                               _Atomic uint64_t *done, uint64_t total, _Atomic int *cancel) {
    CKPTIO_RETURN_IF(!e || !fn || !done, CKPTIO_E_INVAL,
                     "ckptio__engine_parallel_progress: engine, fn and done are required");
    if (nworkers == 0) {
        fn(arg, 0);
        return CKPTIO_OK;
    }
    progress_tick t = {.engine = e, .done = done, .total = total, .cancel = cancel};
    ckptio__pool *pool;
    CKPTIO_FORWARD(ckptio__engine_pool(e, &pool));
    ckptio_status st = ckptio__pool_run(pool, nworkers, fn, arg, parallel_tick, &t, 5);
    if (st != CKPTIO_OK) return st; /* nothing ran, no tick happened */
    if (t.canceled) {
        if (t.record) ckptio__error_restore(t.record);
        else CKPTIO_FAIL(CKPTIO_E_CANCELED, "the progress callback canceled the transfer");
        return CKPTIO_E_CANCELED;
    }
    return CKPTIO_OK;
}
