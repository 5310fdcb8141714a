/*
 * gpu_prepare.c - ckptio_engine_gpu_prepare's background pinning: the slots
 * a load will use (gpu_geometry.c) pinned ahead into the engine's
 * staging (gpu_staging.c), so that a process's first load starts with them.
 */
#include "engine_internal.h"
#include "gpu_pipeline.h"

#include <string.h>

/* Pins slot 0 of every worker, then slot 1, ... so that a transfer starting
 * midway finds each worker's first slots ready. A transfer holds st->lock
 * for its whole run: when one waits for it, this thread stops at its next
 * slot and the transfer's workers pin what is still missing (and report any
 * error: here a failure only ends the pinning). */
typedef struct prepare_job {
    ckptio__gpu_state *st;
    const ckptio__gpu_ops *ops;
    int device;
    unsigned workers;  /* workers whose slots it pins */
    unsigned slots;    /* slots per worker it pins: the read ring's */
    uint64_t slot;     /* the slot size it pins */
} prepare_job;

/* Takes st->lock for the next step of pinning, unless the thread is to stop
 * or a transfer waits for the lock (it pins what it needs itself). */
static bool lock_for_next_step(ckptio__gpu_state *st) {
    return !atomic_load(&st->prepare_stop) && !atomic_load(&st->transfers_waiting) &&
           pthread_mutex_trylock(&st->lock) == 0;
}

static void *prepare_main(void *arg) {
    prepare_job job = *(prepare_job *)arg;
    ckptio__free(arg);
    ckptio__gpu_state *st = job.st;
    const ckptio__gpu_ops *ops = job.ops;
    if (ops->ctx_enter(job.device) != CKPTIO_OK) return NULL;
    /* The kernel's part first, for every slot at once and side by side: the
     * registrations below then hold the driver for a fraction of the time
     * this thread would take alone, and a caller's cudaMallocs wait for the
     * driver meanwhile (docs/GPU.md#pinning). */
    if (!lock_for_next_step(st)) goto out;
    /* Slots of another size by now (a transfer ran in between): left alone, as below. */
    if (st->slot_bytes == job.slot && st->ops == ops) ckptio__gpu_slots_prefill(st, job.workers, job.slots);
    pthread_mutex_unlock(&st->lock);
    for (unsigned s = 0; s < job.slots; s++) {
        for (unsigned w = 0; w < job.workers; w++) {
            if (!lock_for_next_step(st)) goto out;
            unsigned char *mem = NULL;
            const bool same = st->slot_bytes == job.slot && st->ops == ops;
            const ckptio_status rc = same ? ckptio__gpu_slot(st, w, s, true, &mem) : CKPTIO_E_INVAL;
            pthread_mutex_unlock(&st->lock);
            if (rc != CKPTIO_OK) goto out;
        }
    }
out:
    ops->ctx_leave(job.device);
    return NULL;
}

ckptio_status ckptio__gpu_prepare(ckptio_engine *engine, const ckptio__gpu_ops *ops, int device) {
    ckptio__gpu_state *st = NULL;
    CKPTIO_FORWARD(ckptio__gpu_state_get(engine, ops, &st));
    unsigned workers = 0;
    uint64_t slot = 0;
    ckptio__gpu_load_geometry(engine, &workers, &slot);
    ckptio_status rc = CKPTIO_OK;
    pthread_mutex_lock(&st->prepare_lock);
    if (st->prepare_started) {
        if (pthread_tryjoin_np(st->prepare_thread, NULL) != 0) {
            /* Still pinning: it does this call's work. */
            pthread_mutex_unlock(&st->prepare_lock);
            return CKPTIO_OK;
        }
        st->prepare_started = false;
    }
    /* A transfer running now pins what it needs itself. Slots of another
     * size are left alone: freeing pinned memory synchronises the device. */
    bool start = false;
    const unsigned slots = CKPTIO_GPU_READ_SLOTS;
    if (pthread_mutex_trylock(&st->lock) == 0) {
        /* Every slot already pinned (a server calling it before each load): no thread. */
        start = st->slot_bytes != slot || ckptio__gpu_pinned_slots(st, workers, slots) < workers * slots;
        if (start && st->slot_bytes != slot) {
            if (ckptio__gpu_pinned_slots(st, CKPTIO_GPU_MAX_WORKERS, CKPTIO_GPU_NSLOTS) > 0) start = false;
            else ckptio__gpu_state_set_slot_bytes(st, slot); /* none pinned: frees nothing */
        }
        if (start) {
            st->huge_slots = ckptio__gpu_huge_slots(engine, (uint64_t)workers * slots * slot);
            ckptio__gpu_slot_range_ready(st);
        }
        pthread_mutex_unlock(&st->lock);
    }
    prepare_job *job = start ? ckptio__malloc(sizeof *job) : NULL;
    if (start && !job) rc = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory starting to pin staging memory");
    if (job) {
        *job = (prepare_job){.st = st, .ops = ops, .device = device, .workers = workers,
                             .slots = slots, .slot = slot};
        atomic_store(&st->prepare_stop, false);
        const int err = pthread_create(&st->prepare_thread, NULL, prepare_main, job);
        if (err == 0) {
            st->prepare_started = true;
        } else {
            ckptio__free(job);
            rc = CKPTIO_FAIL(CKPTIO_E_NOMEM, "could not start a thread to pin staging memory: %s", strerror(err));
        }
    }
    pthread_mutex_unlock(&st->prepare_lock);
    return rc;
}
