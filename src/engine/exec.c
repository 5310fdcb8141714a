/*
 * exec.c - ckptio_engine_execute(): plan -> tasks -> workers -> backend.
 *
 * 1. The plan is validated, and extents in GPU memory are set aside for the
 *    engine's device provider (engine_internal.h; src/gpu fills it in).
 * 2. Host extents are cut into tasks at multiples of CKPTIO_OPT_CHUNK_BYTES
 *    in file offset space (so every task after an extent's first starts
 *    aligned). Tasks are numbered; a worker claims the next number with one
 *    atomic add and finds its extent by binary search over prefix counts, so
 *    10,000 small extents cost no allocation per task and a 100 GiB extent
 *    does not need a task table. Writes to several files of which some take
 *    turns (files in memory) are claimed in a dealt order instead: one task
 *    of each file in turn (deal_across_files).
 * 3. A worker turns its task into operations for the backend, keeping up to
 *    queue-depth operations in flight (1 for pread):
 *      - buffered descriptor: one operation for the whole task;
 *      - O_DIRECT (file accepts it, extent >= CKPTIO_OPT_DIRECT_MIN_BYTES or
 *        mode ON): full 4 KiB blocks go O_DIRECT, straight from/to the
 *        caller's memory when that is aligned, else through the worker's
 *        bounce buffer; a partial block at the head or tail is read O_DIRECT
 *        as a whole block into a bounce slot, and written through the page
 *        cache (docs/ENGINE.md explains why).
 * 4. With an observer (write plans, ckptio__plan_set_observer), a worker
 *    observes a task's bytes right after submitting the task's last
 *    operation, so that hashing overlaps the write in flight; with a block
 *    size, each block is observed whole by the worker whose task holds the
 *    block's first byte (the caller's memory stays valid and unchanged for
 *    the whole execution, so a block may reach past its task).
 * 5. The first error wins: it is recorded with its message, a stop flag makes
 *    every worker stop submitting, in-flight operations are drained, and the
 *    record is moved to the calling thread.
 * The calling thread waits and reports progress (or, with 0 threads, does the
 * work itself and reports between operations).
 */
#include "engine_private.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string.h>

#define ALIGN CKPTIO_DIRECT_ALIGN
#define TICK_MS 5

typedef struct exec {
    ckptio_engine *engine;
    const ckptio_plan *plan;
    ckptio_direction dir;
    size_t *host;             /* plan indices of host extents with bytes */
    size_t nhost;
    uint64_t *first_task;     /* nhost + 1 prefix counts of tasks */
    uint64_t ntasks;
    uint64_t *order;          /* claim number -> task number (dealt across files), or NULL: in order */
    uint64_t host_bytes;
    uint64_t chunk;
    uint64_t direct_min;
    int64_t direct_mode;
    const ckptio__backend_ops *backend;
    bool backend_forced;      /* io_uring was asked for explicitly */
    unsigned depth;           /* operations in flight per io_uring worker */
    size_t bounce_size;       /* bounce bytes per worker this plan can use */
    size_t bounce_limit;      /* bounce bytes per worker the staging bound allows */
    bool inline_caller;       /* the calling thread is the only worker */
    bool sync_calls;          /* the worker makes plain pread/pwrite calls, whatever its slot's backend */
    _Atomic uint64_t next_task;
    _Atomic uint64_t bytes_done;
    _Atomic int stop;
    pthread_mutex_t lock;     /* status and record */
    ckptio_status status;
    ckptio__error_saved *record;
} exec;

typedef struct xop {
    ckptio__io_op io;         /* first member: the backend hands it back */
    size_t extent;
    unsigned char *user;      /* read through a bounce slot: destination */
    uint64_t user_len;        /* bytes of the extent this operation covers */
    uint64_t skip;            /* where those bytes start in the bounce slot */
    int slot;                 /* bounce slot, or -1 */
} xop;

typedef struct cursor {
    bool active;
    size_t extent;
    const ckptio_extent *x;
    uint64_t pos, end;        /* file range left of the current task */
    int dfd;                  /* O_DIRECT descriptor for it, or -1 */
} cursor;

typedef struct worker {
    exec *x;
    unsigned index;
    ckptio__worker_slot *slot;
    const ckptio__backend_ops *be;
    ckptio__io_queue *queue;  /* the slot's, or with sync_calls its own */
    unsigned depth;
    xop *ops;
    unsigned *free_ops, nfree_ops;
    unsigned *free_slots, nfree_slots, nslots;
    size_t slot_size;
    bool exhausted;           /* no task left to claim */
    cursor c;
    bool observe;             /* the current task still has to be observed */
    uint64_t observe_lo;      /* where the current task starts in the file */
    ckptio_stats st;
} worker;

/* First error wins; the others only make the workers stop sooner. */
static void record_error(exec *x, ckptio_status st) {
    pthread_mutex_lock(&x->lock);
    if (x->status == CKPTIO_OK) {
        x->status = st;
        x->record = ckptio__error_save();
    }
    pthread_mutex_unlock(&x->lock);
    atomic_store(&x->stop, 1);
}

/* The copies and observers of a worker touch the caller's memory, which may
 * be a mapped file: they run guarded (src/io/mapped_guard.c), and a page the
 * file lost is CKPTIO_E_TRUNCATED naming the file and the extent. */
static void extent_subject(char *buf, size_t cap, size_t extent) { snprintf(buf, cap, "extent %zu", extent); }

static void exec_tick(void *arg) {
    exec *x = arg;
    if (atomic_load(&x->stop)) return;
    if (ckptio__engine_report(x->engine, atomic_load(&x->bytes_done), x->plan->total, false) == CKPTIO_E_CANCELED)
        record_error(x, CKPTIO_E_CANCELED);
}

/* ---- per-worker setup ---------------------------------------------------- */

static ckptio_status worker_setup(worker *w) {
    exec *x = w->x;
    ckptio__worker_slot *s = w->slot;
    const ckptio__backend_ops *be = x->backend;
    unsigned depth = be == &ckptio__backend_pread ? 1 : x->depth;
    if (x->sync_calls) {
        /* A queue of its own: the slot keeps its ring for the plans after this one. */
        if (ckptio__backend_pread.queue_create(1, &w->queue) != 0)
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for worker %u's queue", w->index);
        w->be = &ckptio__backend_pread;
        w->depth = 1;
        goto ops;
    }
    if (s->queue && (s->backend != be || s->depth != depth)) {
        s->backend->queue_destroy(s->queue);
        s->queue = NULL;
        s->bounce_registered = false;
    }
    if (!s->queue) {
        CKPTIO_FORWARD(ckptio__io_queue_create(&be, &depth, x->backend_forced, w->index, &s->queue));
        s->backend = be;
        s->depth = depth;
    }
    w->be = s->backend;
    w->queue = s->queue;
    w->depth = s->depth;
ops:
    w->ops = ckptio__malloc(w->depth * sizeof *w->ops);
    w->free_ops = ckptio__malloc(w->depth * sizeof *w->free_ops);
    w->free_slots = ckptio__malloc(w->depth * sizeof *w->free_slots);
    if (!w->ops || !w->free_ops || !w->free_slots)
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for worker %u's %u operations", w->index, w->depth);
    for (unsigned i = 0; i < w->depth; i++) w->free_ops[i] = w->depth - 1 - i;
    w->nfree_ops = w->depth;
    return CKPTIO_OK;
}

/* Allocates (or resizes) the worker's bounce buffer on first need and
 * splits it into up to `depth` slots. */
static ckptio_status bounce_setup(worker *w) {
    exec *x = w->x;
    ckptio__worker_slot *s = w->slot;
    /* A buffer left by an earlier plan is kept while it is large enough and within the staging bound. */
    if (s->bounce && (s->bounce_size < x->bounce_size || s->bounce_size > x->bounce_limit)) {
        if (s->bounce_registered && s->backend->register_buffer) s->backend->register_buffer(s->queue, NULL, 0);
        s->bounce_registered = false;
        ckptio__free(s->bounce);
        ckptio__engine_staging(x->engine, -(int64_t)s->bounce_size, 0);
        s->bounce = NULL;
        s->bounce_size = 0;
    }
    if (!s->bounce) {
        s->bounce = ckptio__aligned_alloc(ALIGN, x->bounce_size);
        if (!s->bounce)
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for worker %u's %zu-byte bounce buffer", w->index,
                               x->bounce_size);
        s->bounce_size = x->bounce_size;
        ckptio__engine_staging(x->engine, (int64_t)s->bounce_size, 0);
    }
    if (!s->bounce_registered && !x->sync_calls && s->backend->register_buffer)
        s->bounce_registered = s->backend->register_buffer(s->queue, s->bounce, s->bounce_size) == 0;
    size_t slot = ckptio__align_down(s->bounce_size / w->depth, ALIGN);
    if (slot < ALIGN) slot = ALIGN;
    w->slot_size = slot;
    w->nslots = (unsigned)(s->bounce_size / slot);
    if (w->nslots > w->depth) w->nslots = w->depth;
    for (unsigned i = 0; i < w->nslots; i++) w->free_slots[i] = w->nslots - 1 - i;
    w->nfree_slots = w->nslots;
    return CKPTIO_OK;
}

/* A bounce slot index, -1 when all are busy, -2 on failure (recorded). */
static int take_slot(worker *w) {
    if (!w->nslots) {
        ckptio_status st = bounce_setup(w);
        if (st != CKPTIO_OK) {
            record_error(w->x, st);
            return -2;
        }
    }
    if (!w->nfree_slots) return -1;
    ckptio__engine_staging(w->x->engine, 0, (int64_t)w->slot_size);
    return (int)w->free_slots[--w->nfree_slots];
}

static void give_slot(worker *w, int slot) {
    w->free_slots[w->nfree_slots++] = (unsigned)slot;
    ckptio__engine_staging(w->x->engine, 0, -(int64_t)w->slot_size);
}

/* ---- tasks and operations ------------------------------------------------ */

/* Where an extent's tasks are counted from. A file's extents are cut at
 * multiples of the chunk in file offset space (each task after the first
 * starts aligned, as O_DIRECT wants); an object's from the extent's own start,
 * since each task is one ranged GET, a request whose cost does not depend on
 * alignment: a 16 MiB tensor at an odd offset is two GETs, not three. */
static uint64_t task_base(const exec *x, const ckptio_extent *e) {
    return e->file->object ? e->file_offset : ckptio__align_down(e->file_offset, x->chunk);
}

/* Tasks of an extent: chunk-sized pieces from task_base(); an object's last
 * piece takes a remainder of less than a quarter chunk along (a GET of up to
 * 1.25 chunks) rather than becoming a request of its own. */
static uint64_t extent_tasks(const exec *x, const ckptio_extent *e) {
    if (!e->file->object)
        return (ckptio__align_down(e->file_offset + e->length - 1, x->chunk) - task_base(x, e)) / x->chunk + 1;
    const uint64_t whole = e->length / x->chunk, rest = e->length % x->chunk;
    if (whole == 0) return 1;
    return rest >= x->chunk / 4 ? whole + 1 : whole;
}

static bool claim(worker *w) {
    exec *x = w->x;
    uint64_t t = atomic_fetch_add(&x->next_task, 1);
    if (t >= x->ntasks) return false;
    if (x->order) t = x->order[t];
    size_t lo = 0, hi = x->nhost; /* first_task[lo] <= t < first_task[hi] */
    while (hi - lo > 1) {
        const size_t mid = lo + (hi - lo) / 2;
        if (x->first_task[mid] <= t) lo = mid;
        else hi = mid;
    }
    const size_t idx = x->host[lo];
    const ckptio_extent *e = &x->plan->ext[idx];
    const uint64_t k = t - x->first_task[lo];
    const uint64_t base = task_base(x, e);
    const uint64_t ext_end = e->file_offset + e->length;
    const uint64_t stop = k + 1 == x->first_task[lo + 1] - x->first_task[lo] ? ext_end : base + (k + 1) * x->chunk;
    cursor *c = &w->c;
    c->active = true;
    c->extent = idx;
    c->x = e;
    c->pos = k ? base + k * x->chunk : e->file_offset;
    c->end = stop < ext_end ? stop : ext_end;
    w->observe = x->plan->observer.fn != NULL;
    w->observe_lo = c->pos;
    c->dfd = ckptio__file_direct_fd(e->file);
    if (c->dfd >= 0 && x->direct_mode != CKPTIO_DIRECT_ON && e->length < x->direct_min) c->dfd = -1;
    /* A file in memory gains nothing from O_DIRECT (tmpfs takes it since Linux 6.6 and copies through its
     * pages all the same), and memory off a 4 KiB boundary would first be copied into a bounce buffer. */
    if (c->dfd >= 0 && x->direct_mode != CKPTIO_DIRECT_ON && ckptio__file_in_memory(e->file)) c->dfd = -1;
    /* A chunk the page cache already holds is copied from memory, not
     * fetched from the disk again with O_DIRECT (warm loads); cold chunks
     * go through it where the read policy says so (read_policy.c). */
    if (c->dfd >= 0 && x->dir == CKPTIO_READ && x->direct_mode == CKPTIO_DIRECT_AUTO &&
        ckptio__read_buffered(e->file, c->pos, c->end - c->pos))
        c->dfd = -1;
    /* Small saves stay in the page cache for the load that follows (read_policy.c). */
    if (c->dfd >= 0 && x->dir == CKPTIO_WRITE && x->direct_mode == CKPTIO_DIRECT_AUTO &&
        ckptio__write_buffered(e->file))
        c->dfd = -1;
    return true;
}

/* Fills `op` with the next operation of the worker's work.
 * Returns 1 (ready), 0 (no work left), -1 (needs a bounce slot, none free)
 * or -2 (failed, recorded). */
static int next_op(worker *w, xop *op) {
    exec *x = w->x;
    cursor *c = &w->c;
    if (!c->active) {
        if (w->exhausted) return 0;
        if (!claim(w)) {
            w->exhausted = true;
            return 0;
        }
    }
    const ckptio_extent *e = c->x;
    unsigned char *mem = (unsigned char *)e->memory + (c->pos - e->file_offset);
    const int fd = e->file->fd;
    const uint64_t pos = c->pos, end = c->end;
    uint64_t take;
    *op = (xop){.io = {.fd = fd, .buffered_fd = fd, .dir = x->dir, .buf_index = -1, .object = e->file->object,
                       .turn = x->dir == CKPTIO_WRITE ? ckptio__file_write_turn(e->file) : NULL},
                .extent = c->extent, .slot = -1};
    ckptio__io_op *io = &op->io;
    if (c->dfd < 0) {
        take = end - pos;
        io->buf = mem;
        io->offset = pos;
        io->len = io->need = take;
    } else if (pos % ALIGN != 0 || end - pos < ALIGN) {
        const uint64_t blk = ckptio__align_down(pos, ALIGN);
        const uint64_t pend = end < blk + ALIGN ? end : blk + ALIGN;
        take = pend - pos;
        if (x->dir == CKPTIO_WRITE) {
            /* Partial block: through the page cache, which merges it with
             * whatever else shares the block; no read-modify-write race. */
            io->buf = mem;
            io->offset = pos;
            io->len = io->need = take;
        } else {
            const int s = take_slot(w);
            if (s < 0) return s;
            op->slot = s;
            op->user = mem;
            op->skip = pos - blk;
            io->fd = c->dfd;
            io->direct = true;
            io->buf = w->slot->bounce + (size_t)s * w->slot_size;
            io->buf_index = w->slot->bounce_registered ? 0 : -1;
            io->offset = blk;
            io->len = ALIGN;          /* may run past end of file: fine */
            io->need = pend - blk;
        }
    } else {
        const uint64_t a1 = ckptio__align_down(end, ALIGN);
        io->fd = c->dfd;
        io->direct = true;
        io->offset = pos;
        if ((uintptr_t)mem % ALIGN == 0) {
            take = a1 - pos;
            io->buf = mem;
        } else {
            const int s = take_slot(w);
            if (s < 0) return s;
            take = a1 - pos < w->slot_size ? a1 - pos : w->slot_size;
            op->slot = s;
            io->buf = w->slot->bounce + (size_t)s * w->slot_size;
            io->buf_index = w->slot->bounce_registered ? 0 : -1;
            if (x->dir == CKPTIO_WRITE) {
                char subject[48];
                extent_subject(subject, sizeof subject, c->extent);
                const ckptio_status st = ckptio__guarded_copy(io->buf, mem, take, subject);
                if (st != CKPTIO_OK) {
                    give_slot(w, s);
                    record_error(x, st);
                    return -2;
                }
            } else {
                op->user = mem;
            }
        }
        io->len = io->need = take;
    }
    op->user_len = take;
    c->pos = pos + take;
    if (c->pos == c->end) c->active = false;
    return 1;
}

static void finish(worker *w, xop *op) {
    exec *x = w->x;
    ckptio__io_op *io = &op->io;
    ckptio__io_op_count(io, op->user_len, &w->st);
    if (io->err || io->done < io->need) {
        char what[160];
        snprintf(what, sizeof what, "extent %zu (%s, %s)", op->extent, w->be->name,
                 op->slot >= 0 ? "O_DIRECT through a bounce buffer" : io->direct ? "O_DIRECT" : "buffered");
        if (!io->err) io->eof = true;
        const ckptio_extent *e = &x->plan->ext[op->extent];
        /* The kernel's copy from or to a mapped file that lost its pages:
         * EFAULT, said as what it is when a ckptio mapping holds the memory. */
        char subject[48];
        extent_subject(subject, sizeof subject, op->extent);
        if (io->err != EFAULT || ckptio__mapped_check(e->memory, e->length, subject) == CKPTIO_OK)
            record_error(x, ckptio__file_op_status(e->file, io, what));
        else
            record_error(x, CKPTIO_E_TRUNCATED);
    } else {
        if (op->user) {
            char subject[48];
            extent_subject(subject, sizeof subject, op->extent);
            const ckptio_status st = ckptio__guarded_copy(op->user, io->buf + op->skip, op->user_len, subject);
            if (st != CKPTIO_OK) record_error(x, st);
        }
        if (op->slot >= 0) w->st.bytes_bounced += op->user_len;
        atomic_fetch_add(&x->bytes_done, op->user_len);
    }
    if (op->slot >= 0) give_slot(w, op->slot);
    w->free_ops[w->nfree_ops++] = (unsigned)(op - w->ops);
}

/* Observes the task the worker just submitted completely (see 4. above). */
static void observe_task_run(void *arg) {
    worker *w = arg;
    const ckptio__observer *obs = &w->x->plan->observer;
    const ckptio_extent *e = w->c.x;
    w->observe = false;
    const uint64_t lo = w->observe_lo - e->file_offset, hi = w->c.end - e->file_offset;
    if (!obs->block) {
        ckptio__observe_range(obs, w->c.extent, e, w->observe_lo, w->c.end, (const unsigned char *)e->memory + lo);
        return;
    }
    for (uint64_t b = (lo + obs->block - 1) / obs->block * obs->block; b < hi; b += obs->block) {
        const uint64_t len = e->length - b < obs->block ? e->length - b : obs->block;
        ckptio__observe_range(obs, w->c.extent, e, e->file_offset + b, e->file_offset + b + len,
                              (const unsigned char *)e->memory + b);
    }
}

static void observe_task(worker *w) {
    const ckptio_extent *e = w->c.x;
    char subject[48];
    extent_subject(subject, sizeof subject, w->c.extent);
    const ckptio_status st = ckptio__guarded_call(observe_task_run, w, e->memory, e->length, subject);
    if (st != CKPTIO_OK) record_error(w->x, st);
}

static void worker_main(void *arg, unsigned index) {
    exec *x = arg;
    worker w = {.x = x, .index = index, .slot = &x->engine->slots[index]};
    ckptio_status st = worker_setup(&w);
    if (st != CKPTIO_OK) {
        record_error(x, st);
        goto out;
    }
    unsigned inflight = 0;
    for (;;) {
        while (inflight < w.depth && !atomic_load_explicit(&x->stop, memory_order_relaxed)) {
            xop *op = &w.ops[w.free_ops[--w.nfree_ops]];
            const int r = next_op(&w, op);
            if (r != 1) {
                w.nfree_ops++;
                break;
            }
            w.be->submit(w.queue, &op->io);
            inflight++;
            if (w.observe && !w.c.active) observe_task(&w);
        }
        if (inflight == 0) break;
        ckptio__io_op *io = w.be->wait(w.queue);
        if (!io) {
            record_error(x, CKPTIO_FAIL(CKPTIO_E_INTERNAL, "the %s queue of worker %u failed with %u requests "
                                        "in flight", w.be->name, index, inflight));
            /* Unusable: drop it so the next transfer builds a new one. */
            w.be->queue_destroy(w.queue);
            w.queue = NULL;
            if (!x->sync_calls) {
                w.slot->queue = NULL;
                w.slot->bounce_registered = false;
            }
            break;
        }
        inflight--;
        finish(&w, (xop *)io);
        if (x->inline_caller) exec_tick(x);
    }
out:
    if (x->sync_calls && w.queue) ckptio__backend_pread.queue_destroy(w.queue);
    ckptio__engine_stats_add(x->engine, &w.st);
    ckptio__free(w.ops);
    ckptio__free(w.free_ops);
    ckptio__free(w.free_slots);
}

/* ---- dealing write tasks across files -------------------------------------- */

/* A host extent of a write plan: its file and its position in x->host. */
typedef struct by_file {
    const ckptio_file *file;
    size_t pos;
} by_file;

static int by_file_cmp(const void *a, const void *b) {
    const by_file *p = a, *q = b;
    if (p->file != q->file) return (uintptr_t)p->file < (uintptr_t)q->file ? -1 : 1;
    return p->pos < q->pos ? -1 : p->pos > q->pos;
}

/* One file's tasks while they are dealt. */
typedef struct deal_hand {
    size_t first;        /* its first extent's position in x->host: files are dealt in plan order */
    size_t k, stop;      /* its current and past-the-last extent in the sorted by_file array */
    uint64_t next, end;  /* its next task, the end of its current extent's tasks */
} deal_hand;

static int hand_cmp(const void *a, const void *b) {
    const deal_hand *p = a, *q = b;
    return p->first < q->first ? -1 : p->first > q->first;
}

/* A write plan into several files of which some take turns (files in memory, docs/ENGINE.md#write-turns) is
 * claimed one task of each file in turn: in plan order every worker would queue for the first file's turn
 * while the other files wait, and the plan would go at one writer's speed. A file's tasks keep their order.
 * Without memory for the order the plan is claimed in order (slower, as correct). */
static void deal_across_files(exec *x) {
    if (x->dir != CKPTIO_WRITE || x->nhost < 2) return;
    const ckptio_plan *p = x->plan;
    bool several = false, turns = false;
    for (size_t i = 0; i < x->nhost; i++) {
        ckptio_file *f = p->ext[x->host[i]].file;
        several |= f != p->ext[x->host[0]].file;
        turns |= ckptio__file_write_turn(f) != NULL;
    }
    if (!several || !turns) return;
    by_file *ext = ckptio__malloc(x->nhost * sizeof *ext);
    deal_hand *hands = ckptio__malloc(x->nhost * sizeof *hands);
    uint64_t *order = ckptio__malloc(x->ntasks * sizeof *order);
    if (!ext || !hands || !order) goto out;
    for (size_t i = 0; i < x->nhost; i++) ext[i] = (by_file){.file = p->ext[x->host[i]].file, .pos = i};
    qsort(ext, x->nhost, sizeof *ext, by_file_cmp);
    size_t nhands = 0;
    for (size_t i = 0; i < x->nhost; i++) {
        if (i && ext[i].file == ext[i - 1].file) {
            hands[nhands - 1].stop = i + 1;
            continue;
        }
        hands[nhands++] = (deal_hand){.first = ext[i].pos, .k = i, .stop = i + 1,
                                      .next = x->first_task[ext[i].pos], .end = x->first_task[ext[i].pos + 1]};
    }
    qsort(hands, nhands, sizeof *hands, hand_cmp);
    uint64_t n = 0;
    for (size_t live = nhands; live;) {
        size_t kept = 0;
        for (size_t h = 0; h < live; h++) {
            deal_hand d = hands[h];
            order[n++] = d.next++;
            if (d.next == d.end && ++d.k < d.stop) {
                d.next = x->first_task[ext[d.k].pos];
                d.end = x->first_task[ext[d.k].pos + 1];
            }
            if (d.next < d.end) hands[kept++] = d;
        }
        live = kept;
    }
    if (n == x->ntasks) {
        x->order = order;
        order = NULL;
    }
out:
    ckptio__free(ext);
    ckptio__free(hands);
    ckptio__free(order);
}

/* ---- execute --------------------------------------------------------------- */

/* Whether a write plan goes to one local file through the page cache: the
 * file system takes each such write under the file's lock (ext4, XFS), so
 * workers beyond the first would only wait their turn, and the calling
 * thread does it all. Not with an observer, whose hashing a second worker
 * overlaps with the writes. */
static bool one_buffered_file(const exec *x) {
    if (x->dir != CKPTIO_WRITE || x->plan->observer.fn || !x->nhost) return false;
    ckptio_file *f = x->plan->ext[x->host[0]].file;
    if (f->object || x->direct_mode == CKPTIO_DIRECT_ON) return false;
    bool small = true;
    for (size_t i = 0; i < x->nhost; i++) {
        const ckptio_extent *ex = &x->plan->ext[x->host[i]];
        if (ex->file != f) return false;
        small &= ex->length < x->direct_min;
    }
    /* The workers' own rule (claim()): whatever is not O_DIRECT goes through the page cache. */
    return x->direct_mode == CKPTIO_DIRECT_OFF || small || ckptio__file_in_memory(f) || ckptio__write_buffered(f);
}

static ckptio_status run_host(exec *x) {
    ckptio_engine *e = x->engine;
    const ckptio_plan *p = x->plan;
    x->chunk = (uint64_t)ckptio__engine_setting(e, CKPTIO_OPT_CHUNK_BYTES);
    x->direct_mode = ckptio__engine_setting(e, CKPTIO_OPT_DIRECT);
    x->direct_min = (uint64_t)ckptio__engine_setting(e, CKPTIO_OPT_DIRECT_MIN_BYTES);
    x->depth = (unsigned)ckptio__engine_setting(e, CKPTIO_OPT_QUEUE_DEPTH);
    x->backend = e->backend == CKPTIO_BACKEND_IO_URING ? &ckptio__backend_io_uring : &ckptio__backend_pread;
    x->backend_forced = ckptio__engine_setting(e, CKPTIO_OPT_BACKEND) == CKPTIO_BACKEND_IO_URING;
    const unsigned threads = (unsigned)ckptio__engine_setting(e, CKPTIO_OPT_THREADS);

    /* O_DIRECT descriptors are opened here, on the caller's thread, so that
     * a refusal in mode ON is reported before any byte moves. */
    /* In mode AUTO only for files some extent of which may go O_DIRECT (see
     * claim()): a file read through the page cache holds one descriptor. */
    if (x->direct_mode != CKPTIO_DIRECT_OFF) {
        const ckptio_file *prev = NULL;
        for (size_t i = 0; i < x->nhost; i++) {
            const ckptio_extent *ex = &p->ext[x->host[i]];
            ckptio_file *f = ex->file;
            if (f == prev) continue;
            if (x->direct_mode == CKPTIO_DIRECT_AUTO &&
                (ex->length < x->direct_min ||
                 (x->dir == CKPTIO_READ && atomic_load_explicit(&f->read_cache, memory_order_relaxed) > 0)))
                continue;
            CKPTIO_FORWARD(ckptio__file_prepare_direct(f));
            prev = f;
        }
    }
    x->first_task = ckptio__malloc((x->nhost + 1) * sizeof *x->first_task);
    if (!x->first_task) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu extents", x->nhost);
    uint64_t n = 0;
    for (size_t i = 0; i < x->nhost; i++) {
        const ckptio_extent *ex = &p->ext[x->host[i]];
        x->first_task[i] = n;
        n += extent_tasks(x, ex);
    }
    x->first_task[x->nhost] = n;
    x->ntasks = n;
    deal_across_files(x);

    const bool one_writer = one_buffered_file(x);
    const unsigned nworkers = threads == 0 || one_writer ? 1 : (uint64_t)threads < n ? threads : (unsigned)n;
    /* io_uring hands buffered writes to its own kernel threads, each a context switch there and back, for
     * nothing when one writer makes them in turn anyway: pwrite on the calling thread, unless io_uring was
     * asked for. */
    x->sync_calls = one_writer && !x->backend_forced;
    /* s3:// objects: each worker keeps its share of the S3 concurrency in
     * flight as ranged GETs (io_object.c). */
    for (size_t i = 0; i < x->nhost; i++)
        if (p->ext[x->host[i]].file->object) {
            const unsigned c = (unsigned)ckptio__engine_setting(e, CKPTIO_OPT_S3_CONCURRENCY);
            x->backend = &ckptio__backend_object;
            x->backend_forced = false;
            x->depth = (c + nworkers - 1) / nworkers;
            break;
        }
    const unsigned depth = x->backend == &ckptio__backend_pread ? 1 : x->depth;
    /* Staging bound: every worker of a full-width transfer together holds
     * at most CKPTIO_OPT_STAGING_BYTES; more than chunk x depth per worker
     * could never be used. */
    uint64_t per = (uint64_t)ckptio__engine_setting(e, CKPTIO_OPT_STAGING_BYTES) / (threads ? threads : 1);
    if (per > x->chunk * depth) per = x->chunk * depth;
    per = ckptio__align_down(per, ALIGN);
    x->bounce_limit = per < ALIGN ? ALIGN : (size_t)per;
    /* A small plan never needs more bounce per worker than its share of the bytes (one block per
     * operation at least): a buffer sized to the bound would be faulted in and pinned for nothing, the
     * fixed cost of a fresh engine's first small transfer. */
    const uint64_t share = ckptio__align_up((x->host_bytes + nworkers - 1) / nworkers, ALIGN);
    const uint64_t need = share > (uint64_t)depth * ALIGN ? share : (uint64_t)depth * ALIGN;
    x->bounce_size = need < x->bounce_limit ? (size_t)need : x->bounce_limit;
    CKPTIO_FORWARD(ckptio__engine_reserve_slots(e, nworkers));

    /* One worker's share is the whole plan: the calling thread does it, which spares a small transfer the
     * hand-off to a pool thread and back (two wake-ups, each a context switch on a busy machine). The engine
     * runs one plan at a time, so worker slot 0 is free. */
    if (threads == 0 || nworkers == 1) {
        x->inline_caller = true;
        worker_main(x, 0);
    } else {
        ckptio__pool *pool;
        CKPTIO_FORWARD(ckptio__engine_pool(e, &pool));
        CKPTIO_FORWARD(ckptio__pool_run(pool, nworkers, worker_main, x, exec_tick, x, TICK_MS));
    }
    if (x->status != CKPTIO_OK) {
        if (x->record) {
            ckptio__error_restore(x->record);
            x->record = NULL;
        } else {
            CKPTIO_FAIL(x->status, "a transfer worker failed (its error details were lost: out of memory)");
        }
    }
    return x->status;
}

/* Sets each written file's size to the end of its last extent before any
 * data moves. On ext4 (and XFS) an O_DIRECT write that extends the file
 * updates the size under the inode's exclusive lock, which serialises the
 * workers; writes inside the size run in parallel
 * (docs/ENGINE.md#sized-first). Writes only ever grow a file, so the
 * result is what the writes alone would have left. */
static ckptio_status extend_written_files(const ckptio_plan *p) {
    enum { MAX_FILES = 64 }; /* beyond that, files simply grow as written */
    ckptio_file *files[MAX_FILES];
    uint64_t ends[MAX_FILES];
    size_t nfiles = 0;
    for (size_t i = 0; i < p->count; i++) {
        const ckptio_extent *ex = &p->ext[i];
        if (!ex->length) continue;
        if (ex->file->object) continue; /* an object grows as it is written */
        const uint64_t end = ex->file_offset + ex->length; /* validated: no overflow */
        size_t k = 0;
        while (k < nfiles && files[k] != ex->file) k++;
        if (k == nfiles) {
            if (nfiles == MAX_FILES) continue;
            files[nfiles] = ex->file;
            ends[nfiles++] = end;
        } else if (end > ends[k]) {
            ends[k] = end;
        }
    }
    for (size_t k = 0; k < nfiles; k++) {
        struct stat sb;
        if (fstat(files[k]->fd, &sb) != 0)
            return CKPTIO_FAIL_SYS(errno, "fstat", files[k]->path, -1, "reading the size before writing");
        if ((uint64_t)sb.st_size >= ends[k]) continue;
        if (ftruncate(files[k]->fd, (off_t)ends[k]) != 0)
            return CKPTIO_FAIL_SYS(errno, "ftruncate", files[k]->path, (int64_t)ends[k],
                                   "setting the file size before writing");
    }
    return CKPTIO_OK;
}

ckptio_status ckptio_engine_execute(ckptio_engine *e, const ckptio_plan *p) {
    CKPTIO_RETURN_IF(!e || !p, CKPTIO_E_INVAL, "ckptio_engine_execute: engine and plan are required");
    ckptio__engine_fork_check(e);
    if (atomic_fetch_add(&e->busy, 1) != 0) {
        atomic_fetch_sub(&e->busy, 1);
        return CKPTIO_FAIL(CKPTIO_E_BUSY, "the engine is already executing a plan on another thread");
    }
    const double t0 = ckptio__now();
    exec x = {.engine = e, .plan = p, .dir = p->dir};
    pthread_mutex_init(&x.lock, NULL);
    ckptio_extent *gpu = NULL;
    size_t *gpu_index = NULL; /* plan index of each gpu[] entry */
    size_t ngpu = 0;
    ckptio_status st = ckptio__plan_validate(e, p);
    if (st != CKPTIO_OK) goto out;

    x.host = ckptio__malloc((p->count ? p->count : 1) * sizeof *x.host);
    if (!x.host) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu extents", p->count);
        goto out;
    }
    for (size_t i = 0; i < p->count; i++) {
        const ckptio_extent *ex = &p->ext[i];
        if (!ex->length) continue;
        ckptio_mem_kind kind = ex->mem_kind;
        if (kind == CKPTIO_MEM_AUTO) kind = e->device ? e->device->classify(ex->memory) : CKPTIO_MEM_HOST;
        if (kind != CKPTIO_MEM_CUDA) {
            x.host[x.nhost++] = i;
            x.host_bytes += ex->length;
            continue;
        }
        if (!gpu) {
            gpu = ckptio__malloc(p->count * sizeof *gpu);
            gpu_index = ckptio__malloc(p->count * sizeof *gpu_index);
            if (!gpu || !gpu_index) {
                st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu extents", p->count);
                goto out;
            }
        }
        if (!e->device) {
            st = CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "extent %zu is in device memory and this engine has no GPU layer",
                             i);
            goto out;
        }
        gpu_index[ngpu] = i;
        gpu[ngpu] = *ex;
        gpu[ngpu++].mem_kind = CKPTIO_MEM_CUDA;
    }

    st = ckptio__engine_report(e, 0, p->total, true);
    if (st != CKPTIO_OK) goto out;
    /* Page cache or O_DIRECT for cold reads, for the host and GPU parts alike. */
    if (p->dir == CKPTIO_READ && ckptio__engine_setting(e, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_AUTO &&
        p->total >= (uint64_t)ckptio__engine_setting(e, CKPTIO_OPT_DIRECT_MIN_BYTES))
        ckptio__read_policy_apply(e, p->ext, p->count);
    if (p->dir == CKPTIO_WRITE) {
        st = extend_written_files(p);
        if (st != CKPTIO_OK) goto out;
        /* Below CKPTIO_OPT_DIRECT_MIN_BYTES no extent goes O_DIRECT in AUTO mode: the page cache
         * it is, and the memory there is need not be asked. */
        if (ckptio__engine_setting(e, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_AUTO &&
            p->total >= (uint64_t)ckptio__engine_setting(e, CKPTIO_OPT_DIRECT_MIN_BYTES))
            ckptio__write_policy_apply(e, p->ext, p->count);
    }
    if (x.nhost) {
        st = run_host(&x);
        if (st != CKPTIO_OK) goto out;
    }
    if (ngpu) {
        e->progress_rebase = true;
        e->progress_base = x.host_bytes;
        e->progress_plan_total = p->total;
        ckptio__observer obs = p->observer;
        obs.index = gpu_index;
        st = e->device->execute(e, p->dir, gpu, ngpu, obs.fn ? &obs : NULL);
        e->progress_rebase = false;
        if (st != CKPTIO_OK) goto out;
    }
    st = ckptio__engine_plan_done(e, p->total);
out:
    {
        ckptio_stats d = {.seconds_io = ckptio__now() - t0};
        ckptio__engine_stats_add(e, &d);
    }
    pthread_mutex_destroy(&x.lock);
    ckptio__free(x.first_task);
    ckptio__free(x.order);
    ckptio__free(x.host);
    ckptio__free(gpu);
    ckptio__free(gpu_index);
    atomic_fetch_sub(&e->busy, 1);
    return st;
}
