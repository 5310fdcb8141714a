/*
 * gpu_staging.c - the per-engine pinned staging pool and per-worker streams
 * and events, kept across calls (pinning costs 0.55-0.61 s per GiB, far too
 * much to pay per transfer) and released with the engine. A slot is pinned
 * when its worker needs one (gpu_pipeline.c, next_slot), not when the worker
 * starts: the first load of a process starts copying after one allocation
 * per worker, and pins further slots only while the older ones are still
 * copying.
 */
#include "engine_internal.h"
#include "gpu_pipeline.h"

#include <string.h>

static void release_worker(ckptio__gpu_state *st, ckptio__gpu_worker_res *w, bool memory) {
    const ckptio__gpu_ops *ops = st->ops;
    if (w->device >= 0) {
        /* Streams and events belong to the device's context. */
        bool entered = ops->ctx_enter(w->device) == CKPTIO_OK;
        for (unsigned s = 0; s < CKPTIO_GPU_NSLOTS; s++) {
            if (w->event[s]) ops->event_destroy(w->event[s]);
            w->event[s] = NULL;
        }
        if (w->stream) ops->stream_destroy(w->stream);
        w->stream = NULL;
        if (entered) ops->ctx_leave(w->device);
        w->device = -1;
    }
    if (memory) {
        for (unsigned s = 0; s < CKPTIO_GPU_NSLOTS; s++) {
            if (w->mem[s]) {
                ops->pinned_free(w->mem[s]);
                st->reserved -= st->slot_bytes;
            }
            w->mem[s] = NULL;
        }
    }
}

static void destroy_state(void *p) {
    ckptio__gpu_state *st = p;
    if (!st) return;
    atomic_store(&st->prepare_stop, true);
    if (st->prepare_started) pthread_join(st->prepare_thread, NULL);
    pthread_mutex_destroy(&st->prepare_lock);
    for (unsigned w = 0; w < CKPTIO_GPU_MAX_WORKERS; w++) {
        ckptio__gpu_worker_res *r = &st->workers[w];
        release_worker(st, r, true);
        if (r->queue) r->backend->queue_destroy(r->queue);
        r->queue = NULL;
    }
    pthread_mutex_destroy(&st->lock);
    pthread_mutex_destroy(&st->pin_lock);
    ckptio__free(st);
}

ckptio_status ckptio__gpu_state_get(ckptio_engine *engine, const ckptio__gpu_ops *ops, ckptio__gpu_state **out) {
    ckptio__gpu_state *st = ckptio__engine_gpu_state(engine);
    if (st && st->ops != ops) {
        /* The test hook switched devices: release what the old ops made and
         * keep the (engine-owned) state object. */
        pthread_mutex_lock(&st->lock);
        const uint64_t before = st->reserved;
        for (unsigned w = 0; w < CKPTIO_GPU_MAX_WORKERS; w++) release_worker(st, &st->workers[w], true);
        ckptio__engine_staging(engine, -(int64_t)before, 0);
        st->ops = ops;
        pthread_mutex_unlock(&st->lock);
    }
    if (!st) {
        st = ckptio__calloc(1, sizeof *st);
        if (!st) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the GPU staging state");
        st->engine = engine;
        st->ops = ops;
        st->last_path = 0;
        pthread_mutex_init(&st->lock, NULL);
        pthread_mutex_init(&st->pin_lock, NULL);
        pthread_mutex_init(&st->prepare_lock, NULL);
        for (unsigned w = 0; w < CKPTIO_GPU_MAX_WORKERS; w++) st->workers[w].device = -1;
        ckptio__engine_set_gpu_state(engine, st, destroy_state);
    }
    *out = st;
    return CKPTIO_OK;
}

void ckptio__gpu_state_set_slot_bytes(ckptio__gpu_state *st, size_t slot_bytes) {
    if (st->slot_bytes == slot_bytes) return;
    const uint64_t before = st->reserved;
    for (unsigned w = 0; w < CKPTIO_GPU_MAX_WORKERS; w++) {
        ckptio__gpu_worker_res *r = &st->workers[w];
        for (unsigned s = 0; s < CKPTIO_GPU_NSLOTS; s++) {
            if (r->mem[s]) {
                st->ops->pinned_free(r->mem[s]);
                st->reserved -= st->slot_bytes;
                r->mem[s] = NULL;
            }
        }
    }
    ckptio__engine_staging(st->engine, (int64_t)st->reserved - (int64_t)before, 0);
    st->slot_bytes = slot_bytes;
}

ckptio_status ckptio__gpu_worker_ready(ckptio__gpu_state *st, unsigned w, int device) {
    const ckptio__gpu_ops *ops = st->ops;
    ckptio__gpu_worker_res *r = &st->workers[w];
    if (r->device != device && r->device >= 0) {
        /* Our context is current; release_worker pushes the old device's. */
        release_worker(st, r, false);
    }
    if (r->device < 0) {
        r->device = device;
        CKPTIO_FORWARD(ops->stream_create(&r->stream));
        for (unsigned s = 0; s < CKPTIO_GPU_NSLOTS; s++) CKPTIO_FORWARD(ops->event_create(&r->event[s]));
    }
    return CKPTIO_OK;
}

unsigned ckptio__gpu_pinned_slots(const ckptio__gpu_state *st, unsigned workers, unsigned slots) {
    unsigned n = 0;
    for (unsigned w = 0; w < workers; w++)
        for (unsigned s = 0; s < slots; s++) n += st->workers[w].mem[s] != NULL;
    return n;
}

ckptio_status ckptio__gpu_slot(ckptio__gpu_state *st, unsigned w, unsigned s, bool wait, unsigned char **out) {
    ckptio__gpu_worker_res *r = &st->workers[w];
    *out = r->mem[s];
    if (*out) return CKPTIO_OK;
    /* The driver pins one allocation at a time (measured: 64 allocations of
     * 4 MiB took 0.11-0.15 s on one thread, 0.14 s on 16), so a worker that
     * could reuse a slot it has does so rather than queue behind another's. */
    if (wait) pthread_mutex_lock(&st->pin_lock);
    else if (pthread_mutex_trylock(&st->pin_lock) != 0) return CKPTIO_OK;
    ckptio_status rc = st->ops->pinned_alloc(st->slot_bytes, st->huge_slots, &r->mem[s]);
    pthread_mutex_unlock(&st->pin_lock);
    CKPTIO_FORWARD(rc);
    /* Each worker only touches its own slots, but `reserved` is shared. */
    __atomic_add_fetch(&st->reserved, st->slot_bytes, __ATOMIC_RELAXED);
    ckptio__engine_staging(st->engine, (int64_t)st->slot_bytes, 0);
    *out = r->mem[s];
    return CKPTIO_OK;
}
