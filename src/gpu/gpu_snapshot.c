/*
 * gpu_snapshot.c - snapshots of training state that overlap compute
 * (ckptio_snapshot_*, include/ckptio/snapshot.h; docs/SNAPSHOTS.md).
 *
 * A pool holds one snapshot at a time. Taking one, per device: an event
 * recorded on the caller's stream marks the end of the work it has queued
 * (step k's optimizer step); the device's copy stream, ckptio's own, waits
 * for it, then copies the tensors into the pinned pool. Tensors marked
 * EARLY (those nothing orders against later, buffers a forward pass
 * changes) are copied first, and the caller's stream waits for them at
 * once, on the device. The others are waited for by whoever is about to
 * change them (the next optimizer step): before_update makes that stream
 * wait for the copy's end, again on the device. The caller never blocks and
 * its stream never copies.
 */
#include "gpu_pinned_pool.h"
#include "io_internal.h"   /* ckptio__huge_pages_advisable */

#include <pthread.h>
#include <string.h>

#define SNAPSHOT_DEVICES 16 /* devices one pool copies from */

/* Huge pages for the pool wherever THP can give them, without the staging
 * slots' guard on free 2 MiB blocks: the pool is faulted in by threads of its
 * own in the background, so a fault that compacts memory first delays the
 * pinning, never a transfer, and registering 2 MiB pages is 2-4 times faster
 * (128 MiB in 0.03 s against 0.07-0.15 s, docs/GPU.md). The engine's
 * CKPTIO_OPT_GPU_HUGE_SLOTS off or on decides as for the slots. */
static bool pool_huge(const ckptio_engine *engine) {
    int64_t setting = CKPTIO_HUGE_SLOTS_AUTO;
    if (engine && ckptio_engine_get(engine, CKPTIO_OPT_GPU_HUGE_SLOTS, &setting) != CKPTIO_OK)
        setting = CKPTIO_HUGE_SLOTS_AUTO;
    if (setting == CKPTIO_HUGE_SLOTS_OFF) return false;
    return setting == CKPTIO_HUGE_SLOTS_ON || ckptio__huge_pages_advisable();
}

typedef struct snapshot_device {
    int device;       /* -1: slot unused */
    void *stream;     /* the copy stream, in the device's primary context */
    void *after;      /* recorded on the caller's stream: the state is final there */
    void *early;      /* recorded on the copy stream after the EARLY copies */
    void *done;       /* recorded on the copy stream after every copy */
    bool active;      /* the held snapshot copies from this device */
    bool complete;    /* ... and those copies are known to have completed */
} snapshot_device;

struct ckptio_snapshot_pool {
    ckptio__pinned_pool *mem;
    const ckptio__gpu_ops *ops; /* NULL: a host pool (no driver) */
    int device;
    pthread_mutex_t lock;       /* everything below */
    bool held;                  /* a snapshot was taken and not released */
    bool taking;                /* ckptio_snapshot_take is queueing copies */
    snapshot_device dev[SNAPSHOT_DEVICES];
};

static struct snapshot_device *device_slot(ckptio_snapshot_pool *p, int device);

ckptio_status ckptio_snapshot_pool_create(const ckptio_engine *engine, uint64_t bytes, int device,
                                          ckptio_snapshot_pool **out) {
    CKPTIO_RETURN_IF(!out, CKPTIO_E_INVAL, "ckptio_snapshot_pool_create: out is NULL");
    *out = NULL;
    const ckptio__gpu_ops *ops = NULL;
    if (device >= 0) CKPTIO_FORWARD(ckptio__gpu_ops_get(&ops));
    ckptio_snapshot_pool *p = ckptio__calloc(1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a snapshot pool");
    p->ops = ops;
    p->device = device < 0 ? -1 : device;
    for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++) p->dev[i].device = -1;
    const ckptio_status st = ckptio__pinned_pool_create(ops, p->device, bytes, pool_huge(engine), &p->mem);
    if (st != CKPTIO_OK) {
        ckptio__free(p);
        return st;
    }
    pthread_mutex_init(&p->lock, NULL);
    if (ops) {
        /* The device's copy stream and events now, not in the first take (which the training waits for). */
        ckptio_status made = ops->ctx_enter(p->device);
        if (made == CKPTIO_OK) {
            if (!device_slot(p, p->device)) made = ckptio_last_error()->status;
            ops->ctx_leave(p->device);
        }
        if (made != CKPTIO_OK) {
            ckptio__error_saved *saved = ckptio__error_save();
            (void)ckptio_snapshot_pool_destroy(p);
            ckptio__error_restore(saved);
            return made;
        }
    }
    *out = p;
    return CKPTIO_OK;
}

ckptio_status ckptio_snapshot_pool_query(ckptio_snapshot_pool *pool, ckptio_snapshot_pool_info *out) {
    CKPTIO_RETURN_IF(!pool || !out, CKPTIO_E_INVAL, "ckptio_snapshot_pool_query: pool and out are required");
    memset(out, 0, sizeof *out);
    out->base = ckptio__pinned_pool_base(pool->mem);
    out->bytes = ckptio__pinned_pool_bytes(pool->mem);
    out->ready_bytes = ckptio__pinned_pool_ready(pool->mem);
    out->piece_bytes = ckptio__pinned_pool_piece(pool->mem);
    out->device = pool->device;
    out->pinned = pool->ops != NULL;
    pthread_mutex_lock(&pool->lock);
    out->held = pool->held;
    pthread_mutex_unlock(&pool->lock);
    return CKPTIO_OK;
}

ckptio_status ckptio_snapshot_pool_wait_ready(ckptio_snapshot_pool *pool, uint64_t bytes) {
    CKPTIO_RETURN_IF(!pool, CKPTIO_E_INVAL, "ckptio_snapshot_pool_wait_ready: pool is NULL");
    return ckptio__pinned_pool_wait(pool->mem, bytes);
}

/* The slot of `device`, made (stream and events in its primary context, which
 * the caller entered) on first use; NULL with an error when it cannot be. */
static struct snapshot_device *device_slot(ckptio_snapshot_pool *p, int device) {
    snapshot_device *free_slot = NULL;
    for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++) {
        if (p->dev[i].device == device) return &p->dev[i];
        if (p->dev[i].device < 0 && !free_slot) free_slot = &p->dev[i];
    }
    if (!free_slot) {
        CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "a snapshot pool copies from at most %d CUDA devices", SNAPSHOT_DEVICES);
        return NULL;
    }
    snapshot_device d = {.device = device};
    ckptio_status st = p->ops->stream_create(&d.stream);
    if (st == CKPTIO_OK) st = p->ops->event_create(&d.after);
    if (st == CKPTIO_OK) st = p->ops->event_create(&d.early);
    if (st == CKPTIO_OK) st = p->ops->event_create(&d.done);
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        if (d.done) p->ops->event_destroy(d.done);
        if (d.early) p->ops->event_destroy(d.early);
        if (d.after) p->ops->event_destroy(d.after);
        if (d.stream) p->ops->stream_destroy(d.stream);
        ckptio__error_restore(saved);
        return NULL;
    }
    *free_slot = d;
    return free_slot;
}

/* Queues copy `c` into the pool, cut where the pool's pieces (separate
 * registrations) meet: one copy may not span two. */
static ckptio_status queue_copy(ckptio_snapshot_pool *p, const ckptio_snapshot_copy *c, void *stream) {
    unsigned char *base = ckptio__pinned_pool_base(p->mem);
    const uint64_t piece = ckptio__pinned_pool_piece(p->mem);
    uint64_t done = 0;
    while (done < c->nbytes) {
        const uint64_t at = c->offset + done;
        const uint64_t room = piece - at % piece;
        const uint64_t n = c->nbytes - done < room ? c->nbytes - done : room;
        CKPTIO_FORWARD(p->ops->d2h_async(base + at, (const unsigned char *)c->src + done, (size_t)n, stream));
        done += n;
    }
    return CKPTIO_OK;
}

/* Queues the snapshot's copies from device slot d (its context entered). */
static ckptio_status queue_device(ckptio_snapshot_pool *p, snapshot_device *d, void *caller_stream,
                                  const ckptio_snapshot_copy *copies, size_t count) {
    const ckptio__gpu_ops *ops = p->ops;
    CKPTIO_FORWARD(ops->event_record(d->after, caller_stream));
    CKPTIO_FORWARD(ops->stream_wait_event(d->stream, d->after));
    bool any_early = false;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < count; i++) {
            const ckptio_snapshot_copy *c = &copies[i];
            if (c->device != d->device || ((c->flags & CKPTIO_SNAPSHOT_EARLY) != 0) != (pass == 0) || !c->nbytes)
                continue;
            CKPTIO_FORWARD(queue_copy(p, c, d->stream));
            any_early |= pass == 0;
        }
        if (pass == 0 && any_early) {
            /* The caller's stream goes on only once these are copied: it may change them next. */
            CKPTIO_FORWARD(ops->event_record(d->early, d->stream));
            CKPTIO_FORWARD(ops->stream_wait_event(caller_stream, d->early));
        }
    }
    return ops->event_record(d->done, d->stream);
}

static ckptio_status check_copies(const ckptio_snapshot_pool *p, const ckptio_snapshot_copy *copies, size_t count,
                                  const ckptio_snapshot_stream *streams, size_t nstreams, uint64_t *end) {
    const uint64_t bytes = ckptio__pinned_pool_bytes(p->mem);
    *end = 0;
    for (size_t i = 0; i < count; i++) {
        const ckptio_snapshot_copy *c = &copies[i];
        uint64_t last = 0;
        if (ckptio__add_overflows(c->offset, c->nbytes, &last) || last > bytes)
            return CKPTIO_FAIL(CKPTIO_E_RANGE, "snapshot copy %zu: %llu bytes at offset %llu run past the pool's %llu",
                               i, (unsigned long long)c->nbytes, (unsigned long long)c->offset,
                               (unsigned long long)bytes);
        if (c->nbytes && !c->src)
            return CKPTIO_FAIL(CKPTIO_E_INVAL, "snapshot copy %zu: no source for %llu bytes", i,
                               (unsigned long long)c->nbytes);
        if (last > *end) *end = last;
        if (c->device < 0 || !c->nbytes) continue;
        if (!p->ops)
            return CKPTIO_FAIL(CKPTIO_E_INVAL, "snapshot copy %zu: CUDA device %d memory into a host pool (made "
                               "with device -1)", i, c->device);
        bool found = false;
        for (size_t s = 0; s < nstreams && !found; s++) found = streams[s].device == c->device;
        if (!found)
            return CKPTIO_FAIL(CKPTIO_E_INVAL, "snapshot copy %zu: no stream given for CUDA device %d (the stream "
                               "whose work the snapshot follows)", i, c->device);
    }
    return CKPTIO_OK;
}

ckptio_status ckptio_snapshot_take(ckptio_snapshot_pool *pool, const ckptio_snapshot_copy *copies, size_t count,
                                   const ckptio_snapshot_stream *streams, size_t nstreams) {
    CKPTIO_RETURN_IF(!pool || (count && !copies) || (nstreams && !streams), CKPTIO_E_INVAL,
                     "ckptio_snapshot_take: pool, copies and streams are required");
    uint64_t end = 0;
    CKPTIO_FORWARD(check_copies(pool, copies, count, streams, nstreams, &end));
    pthread_mutex_lock(&pool->lock);
    const bool busy = pool->held || pool->taking;
    if (!busy) pool->taking = true;
    pthread_mutex_unlock(&pool->lock);
    CKPTIO_RETURN_IF(busy, CKPTIO_E_BUSY,
                     "the snapshot pool holds a snapshot still in use: release it before taking the next one");
    ckptio_status st = ckptio__pinned_pool_wait(pool->mem, end);
    /* Device copies first, so that the host's copies below overlap them. */
    snapshot_device *used[SNAPSHOT_DEVICES];
    size_t nused = 0;
    for (size_t s = 0; s < nstreams && st == CKPTIO_OK; s++) {
        const int device = streams[s].device;
        bool has = false;
        for (size_t i = 0; i < count && !has; i++) has = copies[i].device == device && copies[i].nbytes;
        if (!has || !pool->ops) continue;
        st = pool->ops->ctx_enter(device);
        if (st != CKPTIO_OK) break;
        pthread_mutex_lock(&pool->lock);
        snapshot_device *d = device_slot(pool, device);
        pthread_mutex_unlock(&pool->lock);
        if (!d) st = CKPTIO_E_UNSUPPORTED; /* the error is recorded */
        if (d) {
            used[nused++] = d;
            st = queue_device(pool, d, (void *)streams[s].stream, copies, count);
        }
        pool->ops->ctx_leave(device);
    }
    unsigned char *base = ckptio__pinned_pool_base(pool->mem);
    for (size_t i = 0; i < count && st == CKPTIO_OK; i++)
        if (copies[i].device < 0 && copies[i].nbytes) memcpy(base + copies[i].offset, copies[i].src, copies[i].nbytes);
    if (st != CKPTIO_OK) {
        /* Nothing may still write into the pool once the call returned. */
        ckptio__error_saved *saved = ckptio__error_save();
        for (size_t k = 0; k < nused; k++)
            if (pool->ops->ctx_enter(used[k]->device) == CKPTIO_OK) {
                (void)pool->ops->stream_sync(used[k]->stream);
                pool->ops->ctx_leave(used[k]->device);
            }
        ckptio__error_restore(saved);
    }
    pthread_mutex_lock(&pool->lock);
    pool->taking = false;
    pool->held = st == CKPTIO_OK;
    for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++) pool->dev[i].active = pool->dev[i].complete = false;
    if (st == CKPTIO_OK)
        for (size_t k = 0; k < nused; k++) used[k]->active = true;
    pthread_mutex_unlock(&pool->lock);
    return st;
}

ckptio_status ckptio_snapshot_before_update(ckptio_snapshot_pool *pool, int device, uintptr_t stream) {
    CKPTIO_RETURN_IF(!pool, CKPTIO_E_INVAL, "ckptio_snapshot_before_update: pool is NULL");
    pthread_mutex_lock(&pool->lock);
    snapshot_device *d = NULL;
    for (unsigned i = 0; i < SNAPSHOT_DEVICES && !d; i++)
        if (pool->dev[i].device == device && pool->dev[i].active && !pool->dev[i].complete) d = &pool->dev[i];
    ckptio_status st = CKPTIO_OK;
    if (d && pool->held) {
        /* Under the lock: a release cannot hand the events to the next snapshot meanwhile. */
        st = pool->ops->ctx_enter(device);
        if (st == CKPTIO_OK) {
            if (pool->ops->event_done(d->done)) d->complete = true;
            else st = pool->ops->stream_wait_event((void *)stream, d->done);
            pool->ops->ctx_leave(device);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

int ckptio_snapshot_copied(ckptio_snapshot_pool *pool) {
    if (!pool) return 1;
    pthread_mutex_lock(&pool->lock);
    bool all = true;
    if (pool->held)
        for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++) {
            snapshot_device *d = &pool->dev[i];
            if (!d->active || d->complete) continue;
            if (pool->ops->event_done(d->done)) d->complete = true;
            else all = false;
        }
    pthread_mutex_unlock(&pool->lock);
    return all;
}

ckptio_status ckptio_snapshot_wait(ckptio_snapshot_pool *pool) {
    CKPTIO_RETURN_IF(!pool, CKPTIO_E_INVAL, "ckptio_snapshot_wait: pool is NULL");
    pthread_mutex_lock(&pool->lock);
    int devices[SNAPSHOT_DEVICES];
    void *events[SNAPSHOT_DEVICES];
    unsigned n = 0;
    if (pool->held)
        for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++)
            if (pool->dev[i].active && !pool->dev[i].complete) {
                devices[n] = pool->dev[i].device;
                events[n++] = pool->dev[i].done;
            }
    pthread_mutex_unlock(&pool->lock);
    /* Outside the lock: the training thread's before_update must not wait behind a host wait. The events stay
     * this snapshot's until it is released, which is this caller's to do. */
    ckptio_status first = CKPTIO_OK;
    for (unsigned k = 0; k < n; k++) {
        ckptio_status st = pool->ops->ctx_enter(devices[k]);
        if (st == CKPTIO_OK) {
            st = pool->ops->event_sync(events[k]);
            pool->ops->ctx_leave(devices[k]);
        }
        if (st != CKPTIO_OK && first == CKPTIO_OK) first = st;
        if (st == CKPTIO_OK) {
            pthread_mutex_lock(&pool->lock);
            for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++)
                if (pool->dev[i].device == devices[k] && pool->dev[i].active) pool->dev[i].complete = true;
            pthread_mutex_unlock(&pool->lock);
        }
    }
    return first;
}

ckptio_status ckptio_snapshot_release(ckptio_snapshot_pool *pool) {
    CKPTIO_RETURN_IF(!pool, CKPTIO_E_INVAL, "ckptio_snapshot_release: pool is NULL");
    /* A copy that failed has ended too: the pool is free either way, and the failure is reported. */
    const ckptio_status st = ckptio_snapshot_wait(pool);
    pthread_mutex_lock(&pool->lock);
    pool->held = false;
    for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++) pool->dev[i].active = pool->dev[i].complete = false;
    pthread_mutex_unlock(&pool->lock);
    return st;
}

ckptio_status ckptio_snapshot_pool_destroy(ckptio_snapshot_pool *pool) {
    if (!pool) return CKPTIO_OK;
    const ckptio_status st = ckptio_snapshot_release(pool);
    ckptio__error_saved *saved = ckptio__error_save();
    for (unsigned i = 0; i < SNAPSHOT_DEVICES; i++) {
        snapshot_device *d = &pool->dev[i];
        if (d->device < 0) continue;
        const bool entered = pool->ops->ctx_enter(d->device) == CKPTIO_OK;
        pool->ops->event_destroy(d->done);
        pool->ops->event_destroy(d->early);
        pool->ops->event_destroy(d->after);
        pool->ops->stream_destroy(d->stream);
        if (entered) pool->ops->ctx_leave(d->device);
    }
    ckptio__pinned_pool_destroy(pool->mem);
    ckptio__error_restore(saved);
    pthread_mutex_destroy(&pool->lock);
    ckptio__free(pool);
    return st;
}
