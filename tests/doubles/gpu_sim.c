/*
 * gpu_sim.c - the simulated device behind gpu_sim.h.
 *
 * One global lock guards all simulator state: it exists for tests, where
 * clarity beats concurrency. Copies run outside the lock on the stream's
 * thread so that the pipeline and the "device" really run at the same time.
 */
#include "gpu_sim.h"
#include "vm_flags.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

typedef struct sim_alloc {
    uintptr_t base;
    size_t size;
    uintptr_t owner;   /* the buffer it is part of (its own base, or the first piece's) */
    bool mapped;       /* a piece of a reservation (cuMemMap), not a cudaMalloc allocation */
    ckptio_mem_kind kind;
    struct sim_alloc *next;
} sim_alloc;

typedef struct sim_event {
    uint64_t recorded;  /* records so far */
    uint64_t done;      /* records whose work completed */
    bool failed;        /* the work captured by the last completed record failed */
    uint64_t failed_copy;
} sim_event;

enum op_kind { OP_COPY, OP_EVENT, OP_WAIT_WORD, OP_WAIT_EVENT, OP_FN };

typedef struct sim_op {
    enum op_kind kind;
    bool h2d;
    void *dst;
    const void *src;
    size_t bytes;        /* of each row */
    size_t rows;         /* 1, or more for a pitched copy */
    size_t spitch, dpitch;
    uint64_t hash, index;
    sim_event *event;
    volatile uint32_t *word;
    uint32_t value;
    uint64_t target;     /* OP_WAIT_EVENT: the event's record count to wait for */
    void (*fn)(void *);
    void *arg;
    struct sim_op *next;
} sim_op;

typedef struct sim_stream {
    pthread_t thread;
    sim_op *head, *tail;
    bool stop;
    bool failed;           /* a copy failed: later events report it (sticky, like CUDA) */
    uint64_t failed_copy;
    uint64_t rng;
} sim_stream;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER; /* any state change */
static ckptio__gpu_sim_config config = {.device_free = 1ull << 30};
static ckptio__gpu_sim_stats stats;
static uint64_t pending;
/* Host-word waits queued on streams and not yet passed (OP_WAIT_WORD). */
enum { MAX_WORD_WAITS = 256 };
static const sim_op *word_waits[MAX_WORD_WAITS];
static sim_alloc *allocs;

void ckptio__gpu_sim_configure(const ckptio__gpu_sim_config *cfg) {
    pthread_mutex_lock(&lock);
    config = cfg ? *cfg : (ckptio__gpu_sim_config){0};
    if (!config.device_free) config.device_free = 1ull << 30;
    uint64_t pinned = stats.pinned_now, streams = stats.streams_live, events = stats.events_live;
    int64_t depth = stats.ctx_depth;
    memset(&stats, 0, sizeof stats);
    /* Live resources survive a reset: they are still allocated. */
    stats.pinned_now = stats.pinned_peak = pinned;
    stats.streams_live = streams;
    stats.events_live = events;
    stats.ctx_depth = depth;
    pthread_mutex_unlock(&lock);
}

void ckptio__gpu_sim_get_stats(ckptio__gpu_sim_stats *out) {
    pthread_mutex_lock(&lock);
    *out = stats;
    pthread_mutex_unlock(&lock);
}

/* Records [p, p + bytes) as memory of `kind`, part of the buffer at `owner`; false when out of memory. */
static bool track_piece(void *p, size_t bytes, ckptio_mem_kind kind, void *owner, bool mapped) {
    sim_alloc *a = ckptio__malloc(sizeof *a);
    if (!a) return false;
    *a = (sim_alloc){.base = (uintptr_t)p, .size = bytes, .owner = (uintptr_t)owner, .kind = kind, .mapped = mapped};
    pthread_mutex_lock(&lock);
    a->next = allocs;
    allocs = a;
    if (kind == CKPTIO_MEM_PINNED) {
        stats.pinned_allocs++;
        stats.pinned_now += bytes;
        if (stats.pinned_now > stats.pinned_peak) stats.pinned_peak = stats.pinned_now;
    }
    pthread_mutex_unlock(&lock);
    return true;
}

static bool track_at(void *p, size_t bytes, ckptio_mem_kind kind) { return track_piece(p, bytes, kind, p, false); }

static void untrack_at(void *p);

/* A zeroed buffer of `bytes`, recorded as memory of `kind` in pieces of `piece` bytes (the last one shorter; one
 * piece for a buffer of none), mapped ones or not; NULL when out of memory. */
static void *track_pieces(size_t bytes, ckptio_mem_kind kind, size_t piece, bool mapped) {
    /* 4 KiB alignment, like real pinned and device allocations. */
    unsigned char *p = ckptio__aligned_alloc(4096, bytes ? bytes : 1);
    if (!p) return NULL;
    memset(p, 0, bytes);
    for (size_t at = 0; at == 0 || at < bytes; at += piece) {
        if (!track_piece(p + at, bytes - at < piece ? bytes - at : piece, kind, p, mapped)) {
            untrack_at(p);
            ckptio__free(p);
            return NULL;
        }
    }
    return p;
}

static void *track(size_t bytes, ckptio_mem_kind kind) { return track_pieces(bytes, kind, bytes ? bytes : 1, false); }

/* Forgets the records of the buffer at p, every piece (the memory stays). */
static void untrack_at(void *p) {
    pthread_mutex_lock(&lock);
    for (sim_alloc **pp = &allocs; *pp;) {
        sim_alloc *a = *pp;
        if (a->owner != (uintptr_t)p) {
            pp = &a->next;
            continue;
        }
        if (a->kind == CKPTIO_MEM_PINNED) {
            stats.pinned_now -= a->size;
            stats.pinned_frees++;
            /* A real device synchronises here: it would wait for a stream
             * that waits for a word the host has not written yet. */
            for (unsigned i = 0; i < MAX_WORD_WAITS; i++)
                if (word_waits[i] &&
                    atomic_load_explicit((_Atomic uint32_t *)(uintptr_t)word_waits[i]->word, memory_order_acquire) <
                        word_waits[i]->value) {
                    stats.pinned_frees_while_waiting++;
                    break;
                }
        }
        *pp = a->next;
        ckptio__free(a);
    }
    pthread_mutex_unlock(&lock);
}

static void untrack(void *p) {
    if (!p) return;
    untrack_at(p);
    ckptio__free(p);
}

void *ckptio__gpu_sim_device_alloc(size_t bytes) { return track(bytes, CKPTIO_MEM_CUDA); }

void *ckptio__gpu_sim_device_alloc_pieces(size_t bytes, size_t piece, bool mapped) {
    return track_pieces(bytes, CKPTIO_MEM_CUDA, piece ? piece : 1, mapped);
}
void ckptio__gpu_sim_device_free(void *ptr) { untrack(ptr); }

static sim_alloc *find_alloc(uintptr_t p) {
    for (sim_alloc *a = allocs; a; a = a->next)
        if (p >= a->base && p < a->base + (a->size ? a->size : 1)) return a;
    return NULL;
}

static ckptio_mem_kind sim_classify(const void *ptr, int *device) {
    pthread_mutex_lock(&lock);
    const sim_alloc *a = find_alloc((uintptr_t)ptr);
    ckptio_mem_kind kind = a ? a->kind : CKPTIO_MEM_HOST;
    pthread_mutex_unlock(&lock);
    *device = kind == CKPTIO_MEM_CUDA ? 0 : -1;
    return kind;
}

static ckptio_status sim_mem_range(const void *ptr, uintptr_t *base, uint64_t *size) {
    pthread_mutex_lock(&lock);
    const sim_alloc *a = find_alloc((uintptr_t)ptr);
    if (a && a->kind == CKPTIO_MEM_CUDA) {
        *base = a->base;
        *size = a->size;
    }
    pthread_mutex_unlock(&lock);
    if (!a || a->kind != CKPTIO_MEM_CUDA)
        return CKPTIO_FAIL_CTX(CKPTIO_E_CUDA, &((ckptio__err_ctx){.file_offset = -1, .cuda_result = 1}),
                               "cuMemGetAddressRange(%p): not a valid device address: CUDA_ERROR_INVALID_VALUE "
                               "(simulated)", ptr);
    return CKPTIO_OK;
}

static bool sim_mem_mapped(const void *ptr) {
    pthread_mutex_lock(&lock);
    const sim_alloc *a = find_alloc((uintptr_t)ptr);
    bool mapped = a && a->kind == CKPTIO_MEM_CUDA && a->mapped;
    pthread_mutex_unlock(&lock);
    return mapped;
}

static ckptio_status sim_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
    (void)device;
    pthread_mutex_lock(&lock);
    *free_bytes = config.device_free;
    *total_bytes = config.device_free * 2;
    pthread_mutex_unlock(&lock);
    return CKPTIO_OK;
}

static ckptio_status sim_ctx_enter(int device) {
    if (device != 0) return CKPTIO_FAIL(CKPTIO_E_CUDA, "simulated device %d does not exist", device);
    pthread_mutex_lock(&lock);
    stats.ctx_depth++;
    pthread_mutex_unlock(&lock);
    return CKPTIO_OK;
}

static void sim_ctx_leave(int device) {
    (void)device;
    pthread_mutex_lock(&lock);
    stats.ctx_depth--;
    pthread_mutex_unlock(&lock);
}

/* What pinning costs and whether this one fails (config), counted. */
static ckptio_status pin_begin(size_t bytes, bool huge) {
    pthread_mutex_lock(&lock);
    if (huge) stats.pinned_huge_allocs++;
    const bool fail = config.fail_pinned_at && stats.pinned_allocs + 1 == config.fail_pinned_at;
    if (fail) stats.pinned_allocs++;
    const unsigned delay_us = config.pinned_delay_us;
    pthread_mutex_unlock(&lock);
    if (delay_us) {
        struct timespec ts = {(time_t)(delay_us / 1000000), (long)(delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    if (fail)
        return CKPTIO_FAIL(CKPTIO_E_CUDA, "simulated pinned allocation of %zu bytes failed (CUDA out of memory)",
                           bytes);
    return CKPTIO_OK;
}

static ckptio_status sim_pinned_alloc(size_t bytes, bool huge, void **out) {
    *out = NULL;
    CKPTIO_FORWARD(pin_begin(bytes, huge));
    *out = track(bytes, CKPTIO_MEM_PINNED);
    if (!*out) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated pinned allocation of %zu bytes failed", bytes);
    return CKPTIO_OK;
}

static void sim_pinned_free(void *ptr) { untrack(ptr); }

static ckptio_status sim_slot_pin(void *addr, size_t bytes) {
    pthread_mutex_lock(&lock);
    const bool refuse = config.no_register;
    pthread_mutex_unlock(&lock);
    if (refuse) return CKPTIO_E_UNSUPPORTED;
    /* Huge when the range is advised so (VmFlags "hg"). */
    CKPTIO_FORWARD(pin_begin(bytes, ckptio__test_vm_flag(addr, "hg") == 1));
    if (!track_at(addr, bytes, CKPTIO_MEM_PINNED)) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory (simulator)");
    return CKPTIO_OK;
}

static void sim_slot_unpin(void *addr) { untrack_at(addr); }

/* ---- streams ---------------------------------------------------------------- */

static uint64_t next_rand(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void complete_event(sim_stream *s, sim_event *e) {
    e->done++;
    e->failed = s->failed;
    e->failed_copy = s->failed_copy;
}

/* The hash of a copy's source rows (modified while queued: a violation). */
static uint64_t rows_hash(const sim_op *op) {
    uint64_t h = 0;
    for (size_t i = 0; i < op->rows; i++)
        h = XXH3_64bits_withSeed((const char *)op->src + i * op->spitch, op->bytes, h);
    return h;
}

static void run_copy(sim_stream *s, sim_op *op, unsigned delay_us, uint64_t fail_at) {
    if (delay_us) {
        struct timespec ts = {0, (long)(next_rand(&s->rng) % (delay_us + 1)) * 1000};
        nanosleep(&ts, NULL);
    }
    if (rows_hash(op) != op->hash) {
        pthread_mutex_lock(&lock);
        stats.violations++;
        pthread_mutex_unlock(&lock);
    }
    if (fail_at && op->index == fail_at) {
        pthread_mutex_lock(&lock); /* read by stream_sync on other threads */
        s->failed = true;
        s->failed_copy = op->index;
        pthread_mutex_unlock(&lock);
        return;
    }
    if (s->failed) return; /* a failed stream executes nothing more, like a faulted context */
    for (size_t i = 0; i < op->rows; i++)
        memcpy((char *)op->dst + i * op->dpitch, (const char *)op->src + i * op->spitch, op->bytes);
    if (op->h2d)
        for (size_t i = 0; i < op->rows; i++)
            memset((char *)(uintptr_t)op->src + i * op->spitch, CKPTIO_SIM_POISON_USED, op->bytes);
}

static void *stream_main(void *arg) {
    sim_stream *s = arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&cond, &lock);
        if (!s->head) break;
        sim_op *op = s->head;
        unsigned delay = config.copy_delay_us;
        uint64_t fail_at = config.fail_run_at;
        pthread_mutex_unlock(&lock);
        switch (op->kind) {
        case OP_COPY: run_copy(s, op, delay, fail_at); break;
        case OP_WAIT_WORD:
            while (atomic_load_explicit((_Atomic uint32_t *)(uintptr_t)op->word, memory_order_acquire) < op->value) {
                struct timespec ts = {0, 20000};
                nanosleep(&ts, NULL);
            }
            break;
        case OP_WAIT_EVENT:
            pthread_mutex_lock(&lock);
            while (op->event->done < op->target) pthread_cond_wait(&cond, &lock);
            pthread_mutex_unlock(&lock);
            break;
        case OP_FN:
            if (!s->failed) op->fn(op->arg);
            break;
        case OP_EVENT: break;
        }
        pthread_mutex_lock(&lock);
        if (op->kind == OP_COPY) pending--;
        for (unsigned i = 0; op->kind == OP_WAIT_WORD && i < MAX_WORD_WAITS; i++)
            if (word_waits[i] == op) word_waits[i] = NULL;
        if (op->kind == OP_EVENT) complete_event(s, op->event);
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        ckptio__free(op);
        pthread_cond_broadcast(&cond);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

static ckptio_status sim_stream_create(void **out) {
    sim_stream *s = ckptio__calloc(1, sizeof *s);
    if (!s) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated stream");
    s->rng = (uint64_t)(uintptr_t)s | 1;
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        ckptio__free(s);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated stream thread");
    }
    pthread_mutex_lock(&lock);
    stats.streams_live++;
    pthread_mutex_unlock(&lock);
    *out = s;
    return CKPTIO_OK;
}

static void sim_stream_destroy(void *stream) {
    sim_stream *s = stream;
    if (!s) return;
    pthread_mutex_lock(&lock);
    s->stop = true; /* the thread drains its queue first, like cuStreamDestroy */
    stats.streams_live--;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    pthread_join(s->thread, NULL);
    ckptio__free(s);
}

static ckptio_status enqueue(sim_stream *s, sim_op *op) {
    pthread_mutex_lock(&lock);
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    return CKPTIO_OK;
}

static ckptio_status sim_stream_sync(void *stream) {
    sim_stream *s = stream;
    pthread_mutex_lock(&lock);
    while (s->head) pthread_cond_wait(&cond, &lock);
    bool failed = s->failed;
    uint64_t which = s->failed_copy;
    pthread_mutex_unlock(&lock);
    if (failed)
        return CKPTIO_FAIL_CTX(CKPTIO_E_CUDA, &((ckptio__err_ctx){.file_offset = -1, .cuda_result = 700}),
                               "cuStreamSynchronize: simulated asynchronous failure of copy #%llu: "
                               "CUDA_ERROR_ILLEGAL_ADDRESS", (unsigned long long)which);
    return CKPTIO_OK;
}

static ckptio_status sim_event_create(void **out) {
    sim_event *e = ckptio__calloc(1, sizeof *e);
    if (!e) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated event");
    pthread_mutex_lock(&lock);
    stats.events_live++;
    pthread_mutex_unlock(&lock);
    *out = e;
    return CKPTIO_OK;
}

static void sim_event_destroy(void *event) {
    if (!event) return;
    pthread_mutex_lock(&lock);
    stats.events_live--;
    pthread_mutex_unlock(&lock);
    ckptio__free(event);
}

static ckptio_status sim_event_record(void *event, void *stream) {
    sim_op *op = ckptio__calloc(1, sizeof *op);
    if (!op) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated event record");
    op->kind = OP_EVENT;
    op->event = event;
    pthread_mutex_lock(&lock);
    ((sim_event *)event)->recorded++;
    pthread_mutex_unlock(&lock);
    return enqueue(stream, op);
}

/* Waits for the record the event had when the wait was queued, as cuStreamWaitEvent does. */
static ckptio_status sim_stream_wait_event(void *stream, void *event) {
    sim_op *op = ckptio__calloc(1, sizeof *op);
    if (!op) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated stream wait");
    op->kind = OP_WAIT_EVENT;
    op->event = event;
    pthread_mutex_lock(&lock);
    op->target = ((sim_event *)event)->recorded;
    stats.stream_waits++;
    pthread_mutex_unlock(&lock);
    return enqueue(stream, op);
}

static bool sim_event_done(void *event) {
    sim_event *e = event;
    pthread_mutex_lock(&lock);
    if (config.events_settle)
        while (e->done < e->recorded) pthread_cond_wait(&cond, &lock);
    const bool done = !config.events_busy && e->done >= e->recorded;
    pthread_mutex_unlock(&lock);
    return done;
}

static ckptio_status sim_event_sync(void *event) {
    sim_event *e = event;
    pthread_mutex_lock(&lock);
    uint64_t target = e->recorded;
    while (e->done < target) pthread_cond_wait(&cond, &lock);
    bool failed = e->failed;
    uint64_t which = e->failed_copy;
    pthread_mutex_unlock(&lock);
    if (failed)
        return CKPTIO_FAIL_CTX(CKPTIO_E_CUDA, &((ckptio__err_ctx){.file_offset = -1, .cuda_result = 700}),
                               "waiting for a GPU copy (cuEventSynchronize): simulated asynchronous failure of "
                               "copy #%llu: CUDA_ERROR_ILLEGAL_ADDRESS", (unsigned long long)which);
    return CKPTIO_OK;
}

/* `rows` rows of `bytes` (1 row: a plain copy), pitches as gpu_ops.h says. */
static ckptio_status sim_copy_rows(bool h2d, void *dst, size_t dpitch, const void *src, size_t spitch, size_t bytes,
                                   size_t rows, void *stream) {
    pthread_mutex_lock(&lock);
    uint64_t index = ++stats.copies;
    if (rows > 1) stats.copies_2d++;
    bool fail = config.fail_enqueue_at && index == config.fail_enqueue_at;
    pthread_mutex_unlock(&lock);
    if (fail)
        return CKPTIO_FAIL_CTX(CKPTIO_E_CUDA, &((ckptio__err_ctx){.file_offset = -1, .cuda_result = 1}),
                               "%s(%p, %zu bytes): simulated failure of copy #%llu: CUDA_ERROR_INVALID_VALUE",
                               h2d ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", h2d ? dst : (void *)(uintptr_t)src,
                               bytes, (unsigned long long)index);
    sim_op *op = ckptio__calloc(1, sizeof *op);
    if (!op) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated copy");
    *op = (sim_op){.kind = OP_COPY, .h2d = h2d, .dst = dst, .src = src, .bytes = bytes, .rows = rows,
                   .spitch = spitch, .dpitch = dpitch, .index = index};
    if (!h2d)
        for (size_t i = 0; i < rows; i++) memset((char *)dst + i * dpitch, CKPTIO_SIM_POISON_D2H, bytes);
    op->hash = rows_hash(op);
    pthread_mutex_lock(&lock);
    if (h2d) stats.bytes_h2d += bytes * rows;
    else stats.bytes_d2h += bytes * rows;
    if (++pending > stats.max_pending) stats.max_pending = pending;
    pthread_mutex_unlock(&lock);
    return enqueue(stream, op);
}

static ckptio_status sim_h2d(void *dst, const void *src, size_t bytes, void *stream) {
    return sim_copy_rows(true, dst, bytes, src, bytes, bytes, 1, stream);
}

static ckptio_status sim_d2h(void *dst, const void *src, size_t bytes, void *stream) {
    return sim_copy_rows(false, dst, bytes, src, bytes, bytes, 1, stream);
}

/* What we take the driver to check of a pitched copy: pitches at least the
 * width, and the device side's rows inside one allocation (a piece of a
 * reservation counts alone), as it validates one device range. */
static ckptio_status check_2d(const void *device, size_t pitch, size_t width, size_t rows, size_t other_pitch) {
    if (pitch < width || other_pitch < width || rows == 0)
        return CKPTIO_FAIL_CTX(CKPTIO_E_CUDA, &((ckptio__err_ctx){.file_offset = -1, .cuda_result = 1}),
                               "cuMemcpy2DAsync: pitch below width: CUDA_ERROR_INVALID_VALUE (simulated)");
    const uintptr_t first = (uintptr_t)device, last = first + pitch * (rows - 1) + width - 1;
    pthread_mutex_lock(&lock);
    const sim_alloc *a = find_alloc(first);
    const bool inside = a && a->kind == CKPTIO_MEM_CUDA && last < a->base + a->size;
    pthread_mutex_unlock(&lock);
    if (!inside)
        return CKPTIO_FAIL_CTX(CKPTIO_E_CUDA, &((ckptio__err_ctx){.file_offset = -1, .cuda_result = 1}),
                               "cuMemcpy2DAsync(%p, %zu rows, pitch %zu): rows outside one device allocation: "
                               "CUDA_ERROR_INVALID_VALUE (simulated)", device, rows, pitch);
    return CKPTIO_OK;
}

static ckptio_status sim_h2d_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                                void *stream) {
    CKPTIO_FORWARD(check_2d(dst, dpitch, width, rows, spitch));
    return sim_copy_rows(true, dst, dpitch, src, spitch, width, rows, stream);
}

static ckptio_status sim_d2h_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                                void *stream) {
    CKPTIO_FORWARD(check_2d(src, spitch, width, rows, dpitch));
    return sim_copy_rows(false, dst, dpitch, src, spitch, width, rows, stream);
}

static ckptio_status sim_wait_word(void *stream, volatile uint32_t *word, uint32_t value) {
    sim_op *op = ckptio__calloc(1, sizeof *op);
    if (!op) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated wait");
    *op = (sim_op){.kind = OP_WAIT_WORD, .word = word, .value = value};
    pthread_mutex_lock(&lock);
    unsigned i = 0;
    while (i < MAX_WORD_WAITS && word_waits[i]) i++;
    if (i < MAX_WORD_WAITS) word_waits[i] = op;
    pthread_mutex_unlock(&lock);
    if (i == MAX_WORD_WAITS) {
        ckptio__free(op);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated wait: more than %d host-word waits queued", MAX_WORD_WAITS);
    }
    return enqueue(stream, op);
}

ckptio_status ckptio__gpu_sim_launch(void *stream, void (*fn)(void *arg), void *arg) {
    sim_op *op = ckptio__calloc(1, sizeof *op);
    if (!op) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "simulated launch");
    *op = (sim_op){.kind = OP_FN, .fn = fn, .arg = arg};
    return enqueue(stream, op);
}

static const ckptio__gpu_ops sim_ops = {
    .name = "simulated", /* "cuFile cannot run on the simulated device" */
    .classify = sim_classify,
    .mem_range = sim_mem_range,
    .mem_mapped = sim_mem_mapped,
    .mem_info = sim_mem_info,
    .ctx_enter = sim_ctx_enter,
    .ctx_leave = sim_ctx_leave,
    .pinned_alloc = sim_pinned_alloc,
    .pinned_free = sim_pinned_free,
    .slot_pin = sim_slot_pin,
    .slot_unpin = sim_slot_unpin,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_sync = sim_stream_sync,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait_event,
    .event_sync = sim_event_sync,
    .event_done = sim_event_done,
    .h2d_async = sim_h2d,
    .d2h_async = sim_d2h,
    .h2d_2d_async = sim_h2d_2d,
    .d2h_2d_async = sim_d2h_2d,
    .stream_wait_word = sim_wait_word,
};

const ckptio__gpu_ops *ckptio__gpu_sim_ops(void) { return &sim_ops; }
