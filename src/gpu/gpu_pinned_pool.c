/*
 * gpu_pinned_pool.c - the snapshot pool's memory (gpu_pinned_pool.h).
 *
 * One thread registers the pieces in address order; up to
 * POOL_FILLERS threads fault them in ahead of it, side by side in the one
 * range (as the staging slots are: gpu_slot_range.c says why one range), so
 * that the registrations, which the driver runs one at a time, are all the
 * pinning thread waits for.
 */
#include "gpu_pinned_pool.h"
#include "gpu_slot_range.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define POOL_FILLERS 4

struct ckptio__pinned_pool {
    const ckptio__gpu_ops *ops; /* NULL: plain host memory */
    int device;
    unsigned char *base;
    uint64_t bytes;             /* whole pieces */
    uint64_t piece;             /* CKPTIO__POOL_PIECE_BYTES, or the whole pool when smaller */
    size_t npieces;
    _Atomic uint64_t ready;     /* bytes from base faulted in and pinned */
    _Atomic size_t next_fill;   /* the next piece a filler claims */
    _Atomic bool *filled;       /* per piece */
    _Atomic bool stop;
    size_t npinned;             /* pieces [0, npinned) are registered (the pinning thread's, then destroy's) */
    pthread_mutex_t lock;       /* with `cond`: ready, filled, failure */
    pthread_cond_t cond;
    pthread_t thread;
    bool started;
    ckptio_status failed;       /* the pinning thread's failure, CKPTIO_OK while none */
    int cuda_result;
    char failure[512];
};

static unsigned char *piece_addr(const ckptio__pinned_pool *p, size_t i) {
    return p->base + i * p->piece;
}

static void *filler_main(void *arg) {
    ckptio__pinned_pool *p = arg;
    for (;;) {
        const size_t i = atomic_fetch_add(&p->next_fill, 1);
        if (i >= p->npieces || atomic_load(&p->stop)) break;
        ckptio__slot_range_fill(piece_addr(p, i), p->piece);
        pthread_mutex_lock(&p->lock);
        atomic_store(&p->filled[i], true);
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
    }
    return NULL;
}

/* Keeps the thread's failure for every later wait (the thread's error record is its own). */
static void record_failure(ckptio__pinned_pool *p, ckptio_status st, size_t piece) {
    const ckptio_error_info *e = ckptio_last_error();
    pthread_mutex_lock(&p->lock);
    p->failed = st;
    p->cuda_result = e->cuda_result;
    snprintf(p->failure, sizeof p->failure,
             "pinning piece %zu of %zu (%llu MiB at offset %llu) of the snapshot pool: %s",
             piece, p->npieces, (unsigned long long)(p->piece >> 20), (unsigned long long)(piece * p->piece),
             st == CKPTIO_E_UNSUPPORTED ? "the CUDA driver cannot page-lock host memory (cuMemHostRegister)"
                                        : e->message);
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

static void *pinner_main(void *arg) {
    ckptio__pinned_pool *p = arg;
    pthread_t fillers[POOL_FILLERS];
    bool running[POOL_FILLERS] = {false};
    for (unsigned t = 0; t < POOL_FILLERS && t + 1 < p->npieces; t++)
        running[t] = pthread_create(&fillers[t], NULL, filler_main, p) == 0;
    bool entered = false;
    if (p->ops) {
        const ckptio_status st = p->ops->ctx_enter(p->device);
        if (st != CKPTIO_OK) {
            record_failure(p, st, 0);
            goto out;
        }
        entered = true;
    }
    for (size_t i = 0; i < p->npieces && !atomic_load(&p->stop); i++) {
        if (!atomic_load(&p->filled[i])) {
            /* Fill it here when no filler has claimed it (none could start), else wait for it. */
            size_t want = i;
            if (atomic_compare_exchange_strong(&p->next_fill, &want, i + 1)) {
                ckptio__slot_range_fill(piece_addr(p, i), p->piece);
                atomic_store(&p->filled[i], true);
            }
            pthread_mutex_lock(&p->lock);
            while (!atomic_load(&p->filled[i]) && !atomic_load(&p->stop)) pthread_cond_wait(&p->cond, &p->lock);
            pthread_mutex_unlock(&p->lock);
            if (!atomic_load(&p->filled[i])) break;
        }
        if (p->ops) {
            const ckptio_status st = p->ops->slot_pin(piece_addr(p, i), p->piece);
            if (st != CKPTIO_OK) {
                record_failure(p, st, i);
                break;
            }
            p->npinned = i + 1;
        }
        pthread_mutex_lock(&p->lock);
        atomic_store(&p->ready, (uint64_t)(i + 1) * p->piece);
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
    }
out:
    if (entered) p->ops->ctx_leave(p->device);
    atomic_store(&p->stop, true); /* fillers stop claiming */
    for (unsigned t = 0; t < POOL_FILLERS; t++)
        if (running[t]) pthread_join(fillers[t], NULL);
    return NULL;
}

ckptio_status ckptio__pinned_pool_create(const ckptio__gpu_ops *ops, int device, uint64_t bytes, bool huge,
                                         ckptio__pinned_pool **out) {
    *out = NULL;
    CKPTIO_RETURN_IF(bytes == 0, CKPTIO_E_INVAL, "a snapshot pool of 0 bytes");
    CKPTIO_RETURN_IF(bytes > (1ull << 46), CKPTIO_E_INVAL,
                     "a snapshot pool of %llu bytes is larger than the address space allows",
                     (unsigned long long)bytes);
    /* A pool smaller than a piece is one piece of whole huge pages. */
    const uint64_t piece = bytes < CKPTIO__POOL_PIECE_BYTES ? ckptio__align_up(bytes, CKPTIO_HUGE_PAGE_BYTES)
                                                            : CKPTIO__POOL_PIECE_BYTES;
    const uint64_t whole = ckptio__align_up(bytes, piece);
    ckptio__pinned_pool *p = ckptio__calloc(1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a snapshot pool");
    p->ops = ops;
    p->device = device;
    p->bytes = whole;
    p->piece = piece;
    p->npieces = (size_t)(whole / piece);
    p->filled = ckptio__calloc(p->npieces, sizeof *p->filled);
    if (!p->filled) {
        ckptio__free(p);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a snapshot pool of %zu pieces", p->npieces);
    }
    const ckptio_status st = ckptio__slot_range_reserve((size_t)whole, huge, &p->base);
    if (st != CKPTIO_OK) {
        ckptio__free((void *)p->filled);
        ckptio__free(p);
        return st;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    const int err = pthread_create(&p->thread, NULL, pinner_main, p);
    if (err != 0) {
        ckptio__pinned_pool_destroy(p);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "could not start the thread that pins the snapshot pool: %s", strerror(err));
    }
    p->started = true;
    *out = p;
    return CKPTIO_OK;
}

unsigned char *ckptio__pinned_pool_base(const ckptio__pinned_pool *pool) { return pool->base; }
uint64_t ckptio__pinned_pool_bytes(const ckptio__pinned_pool *pool) { return pool->bytes; }
uint64_t ckptio__pinned_pool_piece(const ckptio__pinned_pool *pool) { return pool->piece; }
uint64_t ckptio__pinned_pool_ready(const ckptio__pinned_pool *pool) { return atomic_load(&pool->ready); }

ckptio_status ckptio__pinned_pool_wait(ckptio__pinned_pool *pool, uint64_t bytes) {
    if (bytes > pool->bytes)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "%llu bytes asked of a snapshot pool of %llu", (unsigned long long)bytes,
                           (unsigned long long)pool->bytes);
    pthread_mutex_lock(&pool->lock);
    while (atomic_load(&pool->ready) < bytes && pool->failed == CKPTIO_OK) pthread_cond_wait(&pool->cond, &pool->lock);
    const ckptio_status failed = atomic_load(&pool->ready) >= bytes ? CKPTIO_OK : pool->failed;
    char message[sizeof pool->failure];
    memcpy(message, pool->failure, sizeof message);
    const int cuda_result = pool->cuda_result;
    pthread_mutex_unlock(&pool->lock);
    if (failed == CKPTIO_OK) return CKPTIO_OK;
    return CKPTIO_FAIL_CTX(failed,
                           &((ckptio__err_ctx){.file_offset = -1, .cuda_result = cuda_result, .verbatim = true}),
                           "%s", message);
}

void ckptio__pinned_pool_destroy(ckptio__pinned_pool *pool) {
    if (!pool) return;
    if (pool->started) {
        pthread_mutex_lock(&pool->lock);
        atomic_store(&pool->stop, true);
        pthread_cond_broadcast(&pool->cond);
        pthread_mutex_unlock(&pool->lock);
        pthread_join(pool->thread, NULL);
    }
    if (pool->ops && pool->npinned) {
        const bool entered = pool->ops->ctx_enter(pool->device) == CKPTIO_OK;
        for (size_t i = 0; i < pool->npinned; i++) pool->ops->slot_unpin(piece_addr(pool, i));
        if (entered) pool->ops->ctx_leave(pool->device);
    }
    if (pool->base) ckptio__slot_range_release(pool->base, (size_t)pool->bytes);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->cond);
    ckptio__free((void *)pool->filled);
    ckptio__free(pool);
}
