/*
 * gpu_staging.c - the per-engine pinned staging pool and per-worker streams
 * and events, kept across calls (pinning costs far too much to pay per
 * transfer: docs/GPU.md#the-pipeline) and released with the engine. A slot is pinned
 * when its worker needs one (gpu_pipeline.c, next_slot), not when the worker
 * starts: the first load of a process starts copying after one allocation
 * per worker, and pins further slots only while the older ones are still
 * copying. Slots live in one address range reserved per engine
 * (gpu_slot_range.c): workers fault their slots in side by side, and only
 * the driver's registrations take turns.
 */
#include "engine_internal.h"
#include "gpu_pipeline.h"
#include "gpu_slot_range.h"

#include <pthread.h>
#include <string.h>

static bool in_range(const ckptio__gpu_state *st, const void *p) {
    return st->range && (const unsigned char *)p >= st->range && (const unsigned char *)p < st->range + st->range_bytes;
}

/* Unpins a slot and gives its memory back. */
static void free_slot(ckptio__gpu_state *st, void *mem) {
    if (in_range(st, mem)) {
        st->ops->slot_unpin(mem);
        ckptio__slot_range_discard(mem, st->slot_bytes);
    } else {
        st->ops->pinned_free(mem);
    }
    st->reserved -= st->slot_bytes;
}

static void release_range(ckptio__gpu_state *st) {
    ckptio__slot_range_release(st->range, st->range_bytes);
    st->range = NULL;
    st->range_bytes = 0;
}

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
            if (w->mem[s]) free_slot(st, w->mem[s]);
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
    release_range(st);
    pthread_mutex_destroy(&st->lock);
    pthread_mutex_destroy(&st->pin_lock);
    pthread_mutex_destroy(&st->resize_lock);
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
        pthread_mutex_init(&st->resize_lock, NULL);
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
            if (r->mem[s]) free_slot(st, r->mem[s]);
            r->mem[s] = NULL;
        }
    }
    ckptio__engine_staging(st->engine, (int64_t)st->reserved - (int64_t)before, 0);
    release_range(st); /* its slots had the old size */
    st->slot_bytes = slot_bytes;
}

uint64_t ckptio__gpu_kept_slot_bytes(const ckptio__gpu_state *st) {
    if (atomic_load(&st->stream_waits) == 0) return 0;
    return ckptio__gpu_pinned_slots(st, CKPTIO_GPU_MAX_WORKERS, CKPTIO_GPU_NSLOTS) > 0 ? st->slot_bytes : 0;
}

void ckptio__gpu_stream_wait_begin(ckptio__gpu_state *st) {
    pthread_mutex_lock(&st->resize_lock);
    atomic_fetch_add(&st->stream_waits, 1);
    pthread_mutex_unlock(&st->resize_lock);
}

void ckptio__gpu_stream_wait_end(ckptio__gpu_state *st) { atomic_fetch_sub(&st->stream_waits, 1); }

/* Slot (w, s)'s place: one stride per worker and slot index, strides of
 * whole 2 MiB pages so that every slot can be on huge pages. */
static size_t range_stride(size_t slot_bytes) {
    return (slot_bytes + CKPTIO_HUGE_PAGE_BYTES - 1) & ~(CKPTIO_HUGE_PAGE_BYTES - 1);
}

/* Where worker w's slot s lies in the range. */
static unsigned char *slot_addr(const ckptio__gpu_state *st, unsigned w, unsigned s) {
    return st->range + ((size_t)w * CKPTIO_GPU_NSLOTS + s) * range_stride(st->slot_bytes);
}

void ckptio__gpu_slot_range_ready(ckptio__gpu_state *st) {
    if (atomic_load(&st->range_refused) || !st->slot_bytes) return;
    /* A range was made for the current slot size: every change of the size
     * goes through ckptio__gpu_state_set_slot_bytes, which releases it. */
    if (!st->range) {
        const size_t bytes = (size_t)CKPTIO_GPU_MAX_WORKERS * CKPTIO_GPU_NSLOTS * range_stride(st->slot_bytes);
        ckptio__error_saved *saved = ckptio__error_save(); /* a refusal here is no error of the caller's */
        const ckptio_status reserved = ckptio__slot_range_reserve(bytes, st->huge_slots, &st->range);
        ckptio__error_restore(saved);
        if (reserved != CKPTIO_OK) {
            /* Address space refused (strict overcommit, say): slots are
             * allocated one by one, as before there was a range. */
            st->range = NULL;
            return;
        }
        st->range_bytes = bytes;
        st->range_huge = st->huge_slots;
    } else if (st->range_huge != st->huge_slots) {
        /* Applies to the faults to come: pinned slots keep their pages. */
        ckptio__slot_range_advise(st->range, st->range_bytes, st->huge_slots);
        st->range_huge = st->huge_slots;
    }
}

typedef struct prefill_job {
    unsigned char *const *addr; /* the slots to fill */
    size_t count, bytes;
    unsigned first, step;       /* this thread's: first, first + step, ... */
} prefill_job;

static void *prefill_main(void *arg) {
    const prefill_job *j = arg;
    for (size_t i = j->first; i < j->count; i += j->step)
        ckptio__slot_range_fill(j->addr[i], j->bytes);
    return NULL;
}

void ckptio__gpu_slots_prefill(ckptio__gpu_state *st, unsigned workers, unsigned slots) {
    if (!st->range || atomic_load(&st->range_refused)) return;
    unsigned char *addr[CKPTIO_GPU_MAX_WORKERS * CKPTIO_GPU_NSLOTS];
    size_t n = 0;
    for (unsigned s = 0; s < slots && s < CKPTIO_GPU_NSLOTS; s++)
        for (unsigned w = 0; w < workers && w < CKPTIO_GPU_MAX_WORKERS; w++)
            if (!st->workers[w].mem[s]) addr[n++] = slot_addr(st, w, s);
    /* Pinning on one thread spends most of its time faulting pages in, not
     * registering them (docs/GPU.md#pinning); the faults run side
     * by side in the range. Threads of its own, not the engine's pool: the
     * caller is prepare's thread, which ckptio_engine_destroy joins only
     * after it has destroyed the pool. */
    pthread_t tid[CKPTIO__PREFILL_THREADS];
    prefill_job jobs[CKPTIO__PREFILL_THREADS];
    const unsigned k = n < CKPTIO__PREFILL_THREADS ? (unsigned)n : CKPTIO__PREFILL_THREADS;
    bool started[CKPTIO__PREFILL_THREADS] = {false};
    ckptio__error_saved *saved = ckptio__error_save(); /* fills report nothing here */
    for (unsigned t = 1; t < k; t++) {
        jobs[t] = (prefill_job){.addr = addr, .count = n, .bytes = st->slot_bytes, .first = t, .step = k};
        started[t] = pthread_create(&tid[t], NULL, prefill_main, &jobs[t]) == 0;
    }
    /* This thread takes share 0, and the share of any thread that did not start. */
    for (unsigned t = 0; t < k; t++) {
        if (t > 0 && started[t]) continue;
        jobs[t] = (prefill_job){.addr = addr, .count = n, .bytes = st->slot_bytes, .first = t, .step = k};
        prefill_main(&jobs[t]);
    }
    for (unsigned t = 1; t < k; t++)
        if (started[t]) pthread_join(tid[t], NULL);
    ckptio__error_restore(saved);
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
    for (unsigned w = 0; w < workers; w++) n += ckptio__gpu_pinned_slots_of(st, w, slots);
    return n;
}

unsigned ckptio__gpu_pinned_slots_of(const ckptio__gpu_state *st, unsigned w, unsigned slots) {
    unsigned n = 0;
    for (unsigned s = 0; s < slots; s++) n += st->workers[w].mem[s] != NULL;
    return n;
}

/* Slots worker w would pin in a run that uses up to `k` of its slots:
 * those of [0, k) not pinned, or, with `any_pinned` (a read's ring takes
 * whichever are), as many as it has fewer than k. */
static unsigned slots_to_pin(const ckptio__gpu_state *st, unsigned w, unsigned k, bool any_pinned) {
    const unsigned have = ckptio__gpu_pinned_slots_of(st, w, any_pinned ? CKPTIO_GPU_NSLOTS : k);
    return k > have ? k - have : 0;
}

static unsigned run_slots_to_pin(const ckptio__gpu_state *st, unsigned workers, unsigned k, bool any_pinned) {
    unsigned n = 0;
    for (unsigned w = 0; w < workers; w++) n += slots_to_pin(st, w, k, any_pinned);
    return n;
}

/* Whether worker w's pinned slot s is one a run using up to `k` slots per
 * worker takes (the first k pinned, or slots [0, k)). */
static bool slot_used(const ckptio__gpu_state *st, unsigned w, unsigned s, unsigned k, bool any_pinned) {
    return any_pinned ? ckptio__gpu_pinned_slots_of(st, w, s) < k : s < k;
}

void ckptio__gpu_slots_bound(ckptio__gpu_state *st, uint64_t bound, bool keep, bool any_pinned, unsigned *workers,
                             unsigned *slots) {
    if (!st->slot_bytes) return;
    const uint64_t fit = bound / st->slot_bytes; /* slots within the bound */
    uint64_t pinned = ckptio__gpu_pinned_slots(st, CKPTIO_GPU_MAX_WORKERS, CKPTIO_GPU_NSLOTS);
    const uint64_t to_pin = run_slots_to_pin(st, *workers, *slots, any_pinned);
    if (!keep && pinned + to_pin > fit) {
        /* Slots of this size pinned under a larger bound, or for workers the
         * run does not have: as many as the bound needs go, the last
         * workers' first (freeing one the run does not use leaves what it
         * would pin as it was). */
        const uint64_t before = st->reserved;
        uint64_t excess = pinned + to_pin - fit;
        for (unsigned w = CKPTIO_GPU_MAX_WORKERS; w-- > 0 && excess;) {
            ckptio__gpu_worker_res *r = &st->workers[w];
            for (unsigned s = CKPTIO_GPU_NSLOTS; s-- > 0 && excess;) {
                if (!r->mem[s] || (w < *workers && slot_used(st, w, s, *slots, any_pinned))) continue;
                free_slot(st, r->mem[s]);
                r->mem[s] = NULL;
                pinned--;
                excess--;
            }
        }
        ckptio__engine_staging(st->engine, (int64_t)st->reserved - (int64_t)before, 0);
    }
    /* What cannot be freed (kept slots, or the run's own) is not added to:
     * fewer workers, then fewer slots each. The floor is one worker with one
     * slot, which it pins if it has none: a run needs a slot. */
    const uint64_t allowed = fit > pinned ? fit - pinned : 0;
    while (run_slots_to_pin(st, *workers, *slots, any_pinned) > allowed && (*workers > 1 || *slots > 1)) {
        if (*workers > 1) --*workers;
        else --*slots;
    }
}

unsigned char *ckptio__gpu_slot_fault_in(ckptio__gpu_state *st, unsigned w, unsigned s) {
    if (st->workers[w].mem[s] || !st->range || atomic_load(&st->range_refused)) return NULL;
    /* In the range, the kernel's part (faulting the slot in, zeroing it) runs
     * here, beside the other workers' (gpu_slot_range.c), and only the
     * driver's registration takes the pinning lock. */
    unsigned char *addr = slot_addr(st, w, s);
    ckptio__slot_range_fill(addr, st->slot_bytes);
    return addr;
}

ckptio_status ckptio__gpu_slot_pin(ckptio__gpu_state *st, unsigned w, unsigned s, unsigned char *filled,
                                   size_t keep, bool wait, unsigned char **out) {
    ckptio__gpu_worker_res *r = &st->workers[w];
    *out = r->mem[s];
    if (*out) return CKPTIO_OK;
    /* The driver pins one allocation at a time, however many threads ask
     * (docs/GPU.md#pinning), so a worker that could reuse a slot
     * it has does so rather than queue behind another's; the pages it
     * filled stay for its next try. */
    if (wait) pthread_mutex_lock(&st->pin_lock);
    else if (pthread_mutex_trylock(&st->pin_lock) != 0) return CKPTIO_OK;
    ckptio_status rc = CKPTIO_E_UNSUPPORTED;
    if (filled && !atomic_load(&st->range_refused)) {
        rc = st->ops->slot_pin(filled, st->slot_bytes);
        if (rc == CKPTIO_OK) r->mem[s] = filled;
        if (rc == CKPTIO_E_UNSUPPORTED) atomic_store(&st->range_refused, true); /* the driver cannot register */
    }
    if (rc == CKPTIO_E_UNSUPPORTED) {
        rc = st->ops->pinned_alloc(st->slot_bytes, st->huge_slots, &r->mem[s]);
        /* What the caller read into the range moves to the slot it got instead. */
        if (rc == CKPTIO_OK && filled && keep) memcpy(r->mem[s], filled, keep);
    }
    if (filled && r->mem[s] != filled) ckptio__slot_range_discard(filled, st->slot_bytes);
    pthread_mutex_unlock(&st->pin_lock);
    CKPTIO_FORWARD(rc);
    /* Each worker only touches its own slots, but `reserved` is shared. */
    __atomic_add_fetch(&st->reserved, st->slot_bytes, __ATOMIC_RELAXED);
    ckptio__engine_staging(st->engine, (int64_t)st->slot_bytes, 0);
    *out = r->mem[s];
    return CKPTIO_OK;
}

ckptio_status ckptio__gpu_slot(ckptio__gpu_state *st, unsigned w, unsigned s, bool wait, unsigned char **out) {
    /* A pinned slot: fault_in gives NULL and pin hands the slot back. */
    return ckptio__gpu_slot_pin(st, w, s, ckptio__gpu_slot_fault_in(st, w, s), 0, wait, out);
}
