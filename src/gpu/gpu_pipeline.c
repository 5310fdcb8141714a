/*
 * gpu_pipeline.c - moving extents between files and GPU memory through
 * pinned staging slots (the scheme is described in gpu_pipeline.h).
 *
 * Alignment: a window's bytes sit in its slot at the same position modulo
 * 4 KiB as in the file (slot + (x - align_down(window start))), so the bulk
 * of every window is an O_DIRECT transfer whatever the tensors' offsets:
 * reads fetch the aligned superset of the window (a tail past end of file is
 * read buffered), writes send an unaligned head and tail buffered and the
 * aligned middle direct. Device addresses need no alignment at all.
 *
 * File I/O: the pipeline is the GPU stage of the engine's executor. Each
 * worker moves its windows' file bytes through its own queue of the
 * engine's I/O backend, as the host workers do (gpu_file_stage.c).
 * In BACKEND=AUTO the stage uses pread, the backend the GPU loads were
 * tuned with (docs/GPU.md#file-stage); BACKEND=io_uring or pread applies as
 * set.
 *
 * Progress and cancel: workers count the extents' bytes of each window
 * they finish (holes a read spans are not counted); the calling thread reports them through the engine's progress
 * callback (waiting on the pool, or between windows when it is the only
 * worker), and a callback that cancels stops the workers as an error does:
 * no new window starts, copies in flight are waited for.
 */
#include "cuda_shim.h"
#include "engine_internal.h"
#include "gpu_device_range.h"
#include "gpu_pipeline.h"
#include "gpu_windows.h"
#include "io_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN ((uint64_t)CKPTIO_DIRECT_ALIGN)

typedef ckptio__gpu_run run;       /* the plan's (gpu_windows.h), by shorter names */
typedef ckptio__gpu_window window;
typedef ckptio__gpu_file_stage file_stage;

/* The device allocation an extent's memory starts in (gpu_device_range.h):
 * rows joined into one pitched copy all lie in one (strided_run). */
typedef ckptio__gpu_alloc device_alloc;

typedef struct pipe {
    ckptio_engine *engine;
    ckptio__gpu_state *st;
    const ckptio__gpu_ops *ops;
    int device;
    ckptio_direction dir;
    const ckptio__observer *obs; /* write observer, or NULL */
    ckptio__gpu_file_stage_config stage; /* what every worker's file stage gets (stage.plan: &plan) */
    ckptio__gpu_plan plan;        /* extents, runs and windows (gpu_windows.h) */
    unsigned worker_slots;        /* slots each worker rotates through (ckptio__gpu_slots_bound) */
    _Atomic size_t next;
    _Atomic int failed;           /* an error or a cancel: workers stop */
    _Atomic uint64_t done;        /* extent bytes of the windows finished */
    uint64_t total;               /* extent bytes in all */
    bool report;                  /* report progress (the caller's thread runs the call) */
    bool inline_run;              /* the one worker is the calling thread */
    pthread_mutex_t lock; /* guards status, err, the sums below */
    ckptio_status status;
    ckptio__error_saved *err;
    uint64_t bytes_copied;
    double seconds_copy;
    device_alloc *alloc;          /* per extent: the device allocation it lies in */
    bool nvtx;                    /* NVTX ranges (the engine's CKPTIO_OPT_NVTX, read once per run) */
} pipe;

/* ---- errors: workers record the first one for the caller's thread ----------- */

static void set_error(pipe *p, ckptio_status status) {
    pthread_mutex_lock(&p->lock);
    if (p->status == CKPTIO_OK) {
        p->status = status;
        p->err = ckptio__error_save();
    }
    pthread_mutex_unlock(&p->lock);
    atomic_store(&p->failed, 1);
}

/* A window's `bytes` of extent data moved: count them and, when the worker
 * is the calling thread itself, report (the pool's waiting thread reports
 * otherwise). */
static void window_done(pipe *p, uint64_t bytes, bool on_caller) {
    const uint64_t done = atomic_fetch_add(&p->done, bytes) + bytes;
    if (on_caller && p->report && ckptio__engine_progress(p->engine, done, p->total) == CKPTIO_E_CANCELED)
        set_error(p, CKPTIO_E_CANCELED);
}

/* Re-raises the current error with the extent/window it concerns. */
static ckptio_status annotate(ckptio_status status, const ckptio_file *file, uint64_t offset, const char *operation,
                              const char *subject) {
    return ckptio__fail_again(status, __FILE__, __LINE__,
                              (ckptio__err_ctx){.operation = operation, .path = ckptio_file_path(file),
                                                .file_offset = (int64_t)offset, .subject = subject});
}

/* ---- device side ------------------------------------------------------------- */

/* Pieces of a window that repeat at a fixed stride on both sides: the same
 * width, each one `host_pitch` bytes after the last in the file (so in the
 * staging) and `dev_pitch` bytes after it in device memory. A column slice
 * of a row-major tensor is such a run, one piece per row: queued as one
 * pitched copy rather than one copy per row (4096 copies of 4 KiB for a
 * quarter of an 8192 x 8192 bf16 matrix's columns). */
typedef struct strided_run {
    unsigned char *host, *dev; /* the first piece */
    size_t width, rows;
    size_t host_pitch, dev_pitch;
    size_t idx;                /* the first piece's extent, for errors */
    uint64_t lo;               /* its file offset */
    device_alloc alloc;        /* the device allocation every row lies in */
} strided_run;

/* Pitches past this are not joined: the driver caps a pitched copy's pitch
 * (CU_DEVICE_ATTRIBUTE_MAX_PITCH), and rows this far apart gain nothing. */
#define STRIDE_PITCH_MAX ((size_t)1 << 30)

/* Whether the piece at `host`/`dev` of `width` bytes, in device allocation
 * `alloc`, continues run `g`. Rows stay inside the first row's allocation:
 * the driver takes a pitched copy as one range of device memory. */
static bool continues(const strided_run *g, const unsigned char *host, const unsigned char *dev, size_t width,
                      const device_alloc *alloc) {
    if (width != g->width || host <= g->host || dev <= g->dev) return false;
    if (alloc->base != g->alloc.base || (uintptr_t)dev + width > g->alloc.end) return false;
    if (g->rows == 1) {
        const size_t hp = (size_t)(host - g->host), dp = (size_t)(dev - g->dev);
        return hp >= width && dp >= width && hp <= STRIDE_PITCH_MAX && dp <= STRIDE_PITCH_MAX;
    }
    return host == g->host + g->rows * g->host_pitch && dev == g->dev + g->rows * g->dev_pitch;
}

/* Queues run `g`: one copy when its rows touch on both sides (or it has one
 * row), else one pitched copy. */
static ckptio_status queue_run(pipe *p, const strided_run *g, void *stream) {
    const bool h2d = p->dir == CKPTIO_READ;
    const bool contiguous = g->rows == 1 || (g->host_pitch == g->width && g->dev_pitch == g->width);
    ckptio_status st = CKPTIO_OK;
    if (contiguous) {
        const size_t bytes = g->width * g->rows;
        st = h2d ? p->ops->h2d_async(g->dev, g->host, bytes, stream)
                 : p->ops->d2h_async(g->host, g->dev, bytes, stream);
    } else {
        st = h2d ? p->ops->h2d_2d_async(g->dev, g->dev_pitch, g->host, g->host_pitch, g->width, g->rows, stream)
                 : p->ops->d2h_2d_async(g->host, g->host_pitch, g->dev, g->dev_pitch, g->width, g->rows, stream);
    }
    if (st != CKPTIO_OK) {
        char subject[64];
        snprintf(subject, sizeof subject, "extent %zu", g->idx);
        return annotate(st, p->plan.ext[g->idx].file, g->lo, h2d ? "copy to GPU" : "copy from GPU", subject);
    }
    return CKPTIO_OK;
}

/* Queues the copies between window `w` and host memory `host`, which holds
 * the file's bytes from offset `a` on (a staging slot), or,
 * for a packed window, its pieces back to back from `host` on:
 * pieces at a fixed stride on both sides go as one copy (strided_run).
 * Returns how many bytes were queued in *queued even on failure (the caller
 * must still wait). */
static ckptio_status queue_copies(pipe *p, const window *w, unsigned char *host, uint64_t a, void *stream,
                                  uint64_t *queued) {
    size_t k = w->first, idx;
    uint64_t lo, hi;
    *queued = 0;
    strided_run g = {0};
    uint64_t packed = 0;
    while (ckptio__gpu_next_piece(&p->plan, w, &k, &idx, &lo, &hi)) {
        const ckptio_extent *e = &p->plan.ext[idx];
        unsigned char *dev = (unsigned char *)e->memory + (lo - e->file_offset);
        unsigned char *src = w->packed ? host + packed : host + (lo - a);
        const size_t width = (size_t)(hi - lo);
        packed += width;
        if (g.rows && continues(&g, src, dev, width, &p->alloc[idx])) {
            if (g.rows++ == 1) {
                g.host_pitch = (size_t)(src - g.host);
                g.dev_pitch = (size_t)(dev - g.dev);
            }
            continue;
        }
        if (g.rows) {
            CKPTIO_FORWARD(queue_run(p, &g, stream));
            *queued += g.width * g.rows;
        }
        g = (strided_run){.host = src, .dev = dev, .width = width, .rows = 1, .idx = idx, .lo = lo,
                          .alloc = p->alloc[idx]};
    }
    if (g.rows) {
        CKPTIO_FORWARD(queue_run(p, &g, stream));
        *queued += g.width * g.rows;
    }
    return CKPTIO_OK;
}

/* Shows the observer the bytes of window `w`, now complete in `slot`. */
static void observe_window(pipe *p, const window *w, const unsigned char *slot) {
    const uint64_t a = ckptio__align_down(w->start, ALIGN);
    size_t k = w->first, idx;
    uint64_t lo, hi;
    while (ckptio__gpu_next_piece(&p->plan, w, &k, &idx, &lo, &hi))
        ckptio__observe_range(p->obs, idx, &p->plan.ext[idx], lo, hi, slot + (lo - a));
}

/* Waits for slot s's copies; accounts the time and frees its staging. */
static ckptio_status wait_slot(pipe *p, ckptio__gpu_worker_res *r, unsigned s, const window *w, uint64_t in_use) {
    const double t0 = ckptio__now();
    ckptio_status st = p->ops->event_sync(r->event[s]);
    const double dt = ckptio__now() - t0;
    pthread_mutex_lock(&p->lock);
    p->seconds_copy += dt;
    pthread_mutex_unlock(&p->lock);
    ckptio__engine_staging(p->engine, 0, -(int64_t)in_use);
    if (st != CKPTIO_OK)
        return annotate(st, p->plan.runs[w->run].file, w->start,
                        p->dir == CKPTIO_READ ? "copy to GPU" : "copy from GPU", "staging window");
    return CKPTIO_OK;
}

static void add_copied(pipe *p, uint64_t bytes) {
    pthread_mutex_lock(&p->lock);
    p->bytes_copied += bytes;
    pthread_mutex_unlock(&p->lock);
}

/* A read slot of a staging worker: the window whose copies it holds and its
 * staging bytes in use. */
typedef struct read_slot {
    bool pending;
    const window *w;
    uint64_t used;
} read_slot;

/* The pinned slots a read worker rotates through, the one holding its
 * oldest copies first (one stream per worker: its copies complete in order).
 * A worker starts with the slots it has and pins another only when that
 * oldest one is still copying, so a process's first load pins (slow, and
 * slowing the copies beside it: docs/GPU.md#pinning) when the
 * pipeline would otherwise wait, not before its copies start. */
typedef struct slot_ring {
    unsigned order[CKPTIO_GPU_NSLOTS];
    unsigned n, pos, max;
} slot_ring;

static void ring_init(const ckptio__gpu_worker_res *r, unsigned max, slot_ring *q) {
    q->n = q->pos = 0;
    q->max = max;
    for (unsigned s = 0; s < CKPTIO_GPU_NSLOTS && q->n < q->max; s++)
        if (r->mem[s]) q->order[q->n++] = s;
}

/* The slot for the next window of a worker that has one (first_slot gives
 * it its first): the oldest one, or a newly pinned one when the oldest is
 * busy and no other worker is pinning. */
static ckptio_status next_slot(pipe *p, unsigned index, const read_slot *slots, slot_ring *q, unsigned *out) {
    ckptio__gpu_worker_res *r = &p->st->workers[index];
    if (q->n < q->max) {
        const unsigned oldest = q->order[q->pos];
        if (slots[oldest].pending && !p->ops->event_done(r->event[oldest])) {
            unsigned s = 0;
            while (s < CKPTIO_GPU_NSLOTS && r->mem[s]) s++;
            unsigned char *mem = NULL;
            if (s < CKPTIO_GPU_NSLOTS) CKPTIO_FORWARD(ckptio__gpu_slot(p->st, index, s, false, &mem));
            if (mem) {
                memmove(&q->order[q->pos + 1], &q->order[q->pos], (q->n - q->pos) * sizeof q->order[0]);
                q->order[q->pos] = s;
                q->n++;
            }
        }
    }
    *out = q->order[q->pos];
    q->pos = (q->pos + 1) % q->n;
    return CKPTIO_OK;
}

/* Reads window `w` into `slot`, its `used` bytes counted as staging in use
 * while they are there. */
static ckptio_status read_into(pipe *p, file_stage *fs, const window *w, unsigned char *slot, uint64_t used) {
    ckptio__engine_staging(p->engine, 0, (int64_t)used);
    const ckptio_status st = w->packed ? ckptio__gpu_read_packed(fs, w, slot) : ckptio__gpu_read_window(fs, w, slot);
    if (st != CKPTIO_OK) ckptio__engine_staging(p->engine, 0, -(int64_t)used);
    return st;
}

/* A worker's first slot, for its first window `w`. When another worker
 * holds the pinning lock, `w` is read into the slot's pages, faulted in but
 * not yet pinned, before this worker waits for the lock (*read true): a
 * process's first load has its workers pin their first slots one after
 * another, and the read, longer than a registration, then runs during that
 * wait instead of after it. The registration keeps the bytes in the pages
 * (docs/GPU.md#first-window). */
static ckptio_status first_slot(pipe *p, unsigned index, file_stage *fs, slot_ring *q, const window *w,
                                uint64_t used, unsigned *out, bool *read) {
    *read = false;
    unsigned char *filled = ckptio__gpu_slot_fault_in(p->st, index, 0);
    unsigned char *mem = NULL;
    ckptio_status st = ckptio__gpu_slot_pin(p->st, index, 0, filled, 0, false, &mem);
    if (st == CKPTIO_OK && !mem) {
        if (filled) {
            CKPTIO_FORWARD(read_into(p, fs, w, filled, used));
            *read = true;
        }
        st = ckptio__gpu_slot_pin(p->st, index, 0, filled, *read ? used : 0, true, &mem);
        if (st != CKPTIO_OK && *read) ckptio__engine_staging(p->engine, 0, -(int64_t)used);
    }
    if (st != CKPTIO_OK)
        return annotate(st, p->plan.runs[w->run].file, w->start, "allocate pinned staging", "staging window");
    q->order[0] = 0;
    q->n = 1;
    q->pos = 0;
    *out = 0;
    return CKPTIO_OK;
}

/* Reads window `w` into the worker's next slot (waiting for that slot's
 * previous copies first) and queues its copies. */
static ckptio_status stage_window(pipe *p, unsigned index, file_stage *fs, read_slot *slots, slot_ring *q,
                                  const window *w) {
    ckptio__gpu_worker_res *r = &p->st->workers[index];
    ckptio_status st;
    const bool object = ckptio__gpu_object_window(fs, w); /* the slot holds the file from `a` on */
    const uint64_t a = object ? w->start : ckptio__align_down(w->start, ALIGN);
    const uint64_t used = w->packed ? w->packed : object ? w->end - w->start : ckptio__align_up(w->end, ALIGN) - a;
    unsigned cur = 0;
    bool read = false;
    if (q->n == 0) {
        /* A ring is empty only before a worker's first slot: ring_init takes every pinned one. */
        CKPTIO_FORWARD(first_slot(p, index, fs, q, w, used, &cur, &read));
    } else if ((st = next_slot(p, index, slots, q, &cur)) != CKPTIO_OK) {
        return annotate(st, p->plan.runs[w->run].file, w->start, "allocate pinned staging", "staging window");
    }
    unsigned char *slot = r->mem[cur];
    read_slot *rs = &slots[cur];
    if (rs->pending) {
        rs->pending = false;
        CKPTIO_FORWARD(wait_slot(p, r, cur, rs->w, rs->used));
    }
    rs->used = used;
    if (!read) CKPTIO_FORWARD(read_into(p, fs, w, slot, used));
    uint64_t queued = 0;
    st = queue_copies(p, w, slot, a, r->stream, &queued);
    ckptio_status rec = p->ops->event_record(r->event[cur], r->stream);
    if (rec == CKPTIO_OK) {
        rs->pending = true;
        rs->w = w;
        add_copied(p, queued);
    } else {
        /* Without an event we cannot know when the slot is free: drain. */
        ckptio__engine_staging(p->engine, 0, -(int64_t)rs->used);
        p->ops->stream_sync(r->stream);
        if (st == CKPTIO_OK) st = rec;
    }
    CKPTIO_FORWARD(st);
    window_done(p, queued, p->inline_run);
    return CKPTIO_OK;
}

/* A read worker: claims windows one by one and stages each through its
 * slots, the read of one overlapping the copies of the ones before. */
static void worker_read(pipe *p, file_stage *fs, unsigned index) {
    read_slot slots[CKPTIO_GPU_NSLOTS] = {0};
    ckptio__gpu_worker_res *r = &p->st->workers[index];
    slot_ring ring;
    ring_init(r, p->worker_slots, &ring);
    ckptio_status st = CKPTIO_OK;
    while (st == CKPTIO_OK && !atomic_load(&p->failed)) {
        const size_t wi = atomic_fetch_add(&p->next, 1);
        if (wi >= p->plan.nwin) break;
        st = stage_window(p, index, fs, slots, &ring, &p->plan.wins[wi]);
    }
    if (st != CKPTIO_OK) set_error(p, st);
    for (unsigned i = 0; i < CKPTIO_GPU_NSLOTS; i++) {
        if (!slots[i].pending) continue;
        slots[i].pending = false;
        ckptio_status ws = wait_slot(p, r, i, slots[i].w, slots[i].used);
        if (ws != CKPTIO_OK) set_error(p, ws);
    }
}

static void worker_write(pipe *p, unsigned index, file_stage *fs) {
    ckptio__gpu_worker_res *r = &p->st->workers[index];
    const window *pw[CKPTIO_GPU_NSLOTS] = {0};
    uint64_t used[CKPTIO_GPU_NSLOTS] = {0}, data[CKPTIO_GPU_NSLOTS] = {0};
    unsigned head = 0, count = 0;
    bool exhausted = false;
    for (;;) {
        /* Keep up to worker_slots device-to-host copies queued ahead of the writes. */
        while (count < p->worker_slots && !exhausted && !atomic_load(&p->failed)) {
            const size_t wi = atomic_fetch_add(&p->next, 1);
            if (wi >= p->plan.nwin) {
                exhausted = true;
                break;
            }
            const window *w = &p->plan.wins[wi];
            const unsigned s = (head + count) % p->worker_slots;
            unsigned char *slot;
            ckptio_status ss = ckptio__gpu_slot(p->st, index, s, true, &slot);
            if (ss != CKPTIO_OK) {
                set_error(p, annotate(ss, p->plan.runs[w->run].file, w->start, "allocate pinned staging",
                                      "staging window"));
                break;
            }
            used[s] = ckptio__align_up(w->end, ALIGN) - ckptio__align_down(w->start, ALIGN);
            ckptio__engine_staging(p->engine, 0, (int64_t)used[s]);
            uint64_t queued = 0;
            ckptio_status st =
                queue_copies(p, w, slot, ckptio__align_down(w->start, ALIGN), r->stream, &queued);
            ckptio_status rec = p->ops->event_record(r->event[s], r->stream);
            if (rec != CKPTIO_OK) {
                ckptio__engine_staging(p->engine, 0, -(int64_t)used[s]);
                p->ops->stream_sync(r->stream);
                set_error(p, st != CKPTIO_OK ? st : rec);
                break;
            }
            pw[s] = w;
            data[s] = queued;
            count++;
            add_copied(p, queued);
            if (st != CKPTIO_OK) {
                set_error(p, st);
                break;
            }
        }
        if (count == 0) break;
        const unsigned s = head;
        ckptio_status st = wait_slot(p, r, s, pw[s], used[s]);
        if (st == CKPTIO_OK && !atomic_load(&p->failed)) {
            /* Before the write: the slot is refilled only after both. */
            if (p->obs) observe_window(p, pw[s], r->mem[s]);
            st = ckptio__gpu_write_window(fs, pw[s], r->mem[s]);
            if (st == CKPTIO_OK) window_done(p, data[s], p->inline_run);
        }
        if (st != CKPTIO_OK) set_error(p, st);
        head = (head + 1) % p->worker_slots;
        count--;
    }
}

static void worker_main(void *arg, unsigned w) {
    pipe *p = arg;
    ckptio_status st = p->ops->ctx_enter(p->device);
    if (st != CKPTIO_OK) {
        set_error(p, st);
        return;
    }
    ckptio__nvtx_push(p->nvtx, p->dir == CKPTIO_READ ? "ckptio: file -> GPU worker" : "ckptio: GPU -> file worker");
    ckptio__gpu_worker_res *r = &p->st->workers[w];
    file_stage fs;
    st = ckptio__gpu_worker_ready(p->st, w, p->device);
    if (st == CKPTIO_OK) st = ckptio__gpu_file_stage_ready(&fs, r, w, &p->stage);
    if (st != CKPTIO_OK) {
        set_error(p, st);
    } else {
        if (p->dir == CKPTIO_READ) worker_read(p, &fs, w);
        else worker_write(p, w, &fs);
        ckptio__engine_stats_add(p->engine, &fs.st);
        if (fs.broken) {
            /* Unusable: the next run builds a new one (as exec.c does). */
            r->backend->queue_destroy(r->queue);
            r->queue = NULL;
        }
    }
    ckptio__nvtx_pop(p->nvtx);
    p->ops->ctx_leave(p->device);
}

/* ---- entry ------------------------------------------------------------------- */

ckptio_status ckptio__gpu_pipeline_run(ckptio_engine *engine, const ckptio__gpu_ops *ops, int device,
                                       ckptio_direction dir, const ckptio_extent *extents, size_t count,
                                       bool inline_only) {
    const double t0 = ckptio__now();
    ckptio_status st =
        ckptio__gpu_pipeline_run_observed(engine, ops, device, dir, extents, count, inline_only, NULL);
    ckptio__engine_stats_add(engine, &(ckptio_stats){.seconds_io = ckptio__now() - t0});
    return st;
}

ckptio_status ckptio__gpu_pipeline_run_observed(ckptio_engine *engine, const ckptio__gpu_ops *ops, int device,
                                                ckptio_direction dir, const ckptio_extent *extents, size_t count,
                                                bool inline_only, const ckptio__observer *obs) {
    ckptio_status st = CKPTIO_OK;
    if (dir != CKPTIO_WRITE) obs = NULL;
    pipe p = {.engine = engine, .ops = ops, .device = device, .dir = dir, .plan = {.ext = extents}, .obs = obs,
              .status = CKPTIO_OK, .nvtx = ckptio__engine_setting(engine, CKPTIO_OPT_NVTX) != 0};
    p.stage.plan = &p.plan;
    pthread_mutex_init(&p.lock, NULL);
    bool locked = false, resize_locked = false;
    p.alloc = ckptio__calloc(count ? count : 1, sizeof *p.alloc);
    if (!p.alloc) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory checking %zu GPU extents", count);
        goto out;
    }
    if ((st = ckptio__gpu_device_ranges(ops, extents, count, p.alloc)) != CKPTIO_OK) goto out;
    unsigned nworkers;
    uint64_t slot;
    ckptio__gpu_geometry(engine, inline_only, obs ? obs->block : 0, &nworkers, &slot);
    uint64_t window_bytes = slot;
    /* A read that touches an s3:// object: slots of whole GETs (they hold a file's windows too). */
    unsigned object_gets = dir == CKPTIO_READ ? ckptio__gpu_object_geometry(engine, inline_only, extents, count,
                                                                             &nworkers, &p.stage.object_get)
                                              : 0;
    p.plan.object_window = p.stage.object_get * object_gets;
    if (slot < p.plan.object_window) slot = p.plan.object_window;
    /* The engine's staging, for the whole run. Whether its pinned slots may
     * be resized is decided before the windows are planned: while a stream
     * waits on a stream-ordered request they keep their size, and the
     * windows are cut to fit them (ckptio__gpu_kept_slot_bytes says why);
     * otherwise resize_lock stays held until any resize is done, so that no
     * request queues a stream's wait meanwhile. */
    if ((st = ckptio__gpu_state_get(engine, ops, &p.st)) != CKPTIO_OK) goto out;
    atomic_fetch_add(&p.st->transfers_waiting, 1); /* a prepare thread yields (gpu_pipeline.h) */
    pthread_mutex_lock(&p.st->lock);
    atomic_fetch_sub(&p.st->transfers_waiting, 1);
    locked = true;
    pthread_mutex_lock(&p.st->resize_lock);
    resize_locked = true;
    const uint64_t kept = ckptio__gpu_kept_slot_bytes(p.st);
    if (kept) {
        pthread_mutex_unlock(&p.st->resize_lock);
        resize_locked = false;
        if (window_bytes > kept) window_bytes = kept;
        if (p.plan.object_window > kept) {
            if (p.stage.object_get > kept) p.stage.object_get = kept;
            object_gets = (unsigned)(kept / p.stage.object_get);
            p.plan.object_window = p.stage.object_get * object_gets;
        }
    }
    p.plan.order = ckptio__calloc(count ? count : 1, sizeof *p.plan.order);
    p.plan.runs = ckptio__calloc(count ? count : 1, sizeof *p.plan.runs);
    if (!p.plan.order || !p.plan.runs) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu GPU extents", count);
        goto out;
    }
    if ((st = ckptio__gpu_plan_runs(&p.plan, count, dir, window_bytes)) != CKPTIO_OK) goto out;
    if (p.plan.nruns == 0) goto out;
    for (size_t r = 0; r < p.plan.nruns; r++) {
        if (r == 0 || p.plan.runs[r].file != p.plan.runs[r - 1].file) {
            /* Descriptors are opened on the caller's thread, never by workers. */
            if ((st = ckptio__file_check_transfer(p.plan.runs[r].file, dir, NULL)) != CKPTIO_OK) goto out;
            if ((st = ckptio__file_prepare_direct(p.plan.runs[r].file)) != CKPTIO_OK) goto out;
            if ((st = ckptio_file_size(p.plan.runs[r].file, &p.plan.runs[r].file_size)) != CKPTIO_OK) goto out;
        } else {
            p.plan.runs[r].file_size = p.plan.runs[r - 1].file_size;
        }
    }
    /* Packed reads (gpu_windows.c): not when the user asked for O_DIRECT. */
    const bool may_pack =
        dir == CKPTIO_READ && !inline_only && ckptio__engine_setting(engine, CKPTIO_OPT_DIRECT) != CKPTIO_DIRECT_ON;
    for (size_t r = 0; r < p.plan.nruns && may_pack; r++)
        p.plan.runs[r].packed = !p.plan.runs[r].file->object && ckptio__gpu_run_packs(&p.plan, &p.plan.runs[r]);
    if ((st = ckptio__gpu_plan_windows(&p.plan, window_bytes, obs ? obs->block : 0)) != CKPTIO_OK) goto out;
    if (nworkers > p.plan.nwin) nworkers = (unsigned)p.plan.nwin;
    /* The file stage: AUTO keeps pread, the backend the GPU loads were
     * tuned with (docs/GPU.md#file-stage); a backend set explicitly applies. */
    p.stage.backend_forced = ckptio__engine_setting(engine, CKPTIO_OPT_BACKEND) == CKPTIO_BACKEND_IO_URING;
    p.stage.backend = p.stage.backend_forced ? &ckptio__backend_io_uring : &ckptio__backend_pread;
    p.stage.depth = 1;
    if (p.stage.backend_forced) {
        const int64_t qd = ckptio__engine_setting(engine, CKPTIO_OPT_QUEUE_DEPTH);
        p.stage.depth = qd < CKPTIO_GPU_WINDOW_OPS_MAX ? (unsigned)qd : CKPTIO_GPU_WINDOW_OPS_MAX;
    }
    /* s3:// objects: the object backend, a read's window's GETs all in flight. */
    for (size_t r = 0; r < p.plan.nruns; r++)
        if (p.plan.runs[r].file->object) {
            p.stage.backend = &ckptio__backend_object;
            p.stage.backend_forced = false;
            p.stage.depth = object_gets > CKPTIO_GPU_WINDOW_OPS_MAX ? object_gets : CKPTIO_GPU_WINDOW_OPS_MAX;
            break;
        }
    if (dir == CKPTIO_READ) slot = ckptio__gpu_read_slot(engine, p.st, nworkers, slot);
    /* Pinned staging stays within CKPTIO_OPT_STAGING_BYTES whatever slots
     * earlier runs left pinned. Kept slots (a stream waits) were sized for
     * another geometry, often larger than this run's: the workers and their
     * slots are then capped to what the bound still holds, since those slots
     * cannot be freed. Otherwise slots of this size pinned under a larger
     * bound, or for more workers, that the run does not use are freed. */
    p.worker_slots = dir == CKPTIO_READ ? CKPTIO_GPU_READ_SLOTS : CKPTIO_GPU_NSLOTS;
    if (!kept) ckptio__gpu_state_set_slot_bytes(p.st, (size_t)slot);
    ckptio__gpu_slots_bound(p.st, (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_STAGING_BYTES), kept != 0,
                            dir == CKPTIO_READ, &nworkers, &p.worker_slots);
    if (kept) {
        slot = kept;
    } else {
        pthread_mutex_unlock(&p.st->resize_lock);
        resize_locked = false;
    }
    /* What this call may pin: each worker's slots (a read's rotate through
     * CKPTIO_GPU_READ_SLOTS, a write's through all, or fewer where the bound
     * says). Only when some are missing: the decision reads /proc, which a
     * stream of small GDS requests on pinned slots should not pay each time.
     * Still the caller's thread. */
    if (ckptio__gpu_pinned_slots(p.st, nworkers, p.worker_slots) < nworkers * p.worker_slots) {
        p.st->huge_slots = ckptio__gpu_huge_slots(engine, (uint64_t)nworkers * p.worker_slots * slot);
        ckptio__gpu_slot_range_ready(p.st);
    }
    ckptio__nvtx_push(p.nvtx, dir == CKPTIO_READ ? "ckptio: file -> GPU" : "ckptio: GPU -> file");
    for (size_t i = 0; i < count; i++) p.total += extents[i].length;
    /* A background caller (inline_only) is not the thread progress belongs to. */
    p.report = !inline_only;
    p.inline_run = inline_only || nworkers <= 1;
    if (p.inline_run) worker_main(&p, 0);
    else if (p.report)
        st = ckptio__engine_parallel_progress(engine, nworkers, worker_main, &p, &p.done, p.total, &p.failed);
    else st = ckptio__engine_parallel(engine, nworkers, worker_main, &p);
    ckptio__nvtx_pop(p.nvtx);
    if (p.status != CKPTIO_OK) {
        /* A worker's error is the first one: it beats a pool-level status. */
        ckptio__error_restore(p.err);
        p.err = NULL;
        st = p.status;
    }
    ckptio_stats delta = {.seconds_copy = p.seconds_copy};
    if (dir == CKPTIO_READ) delta.bytes_h2d = p.bytes_copied;
    else delta.bytes_d2h = p.bytes_copied;
    ckptio__engine_stats_add(engine, &delta);
out:
    if (resize_locked) pthread_mutex_unlock(&p.st->resize_lock);
    if (locked) pthread_mutex_unlock(&p.st->lock);
    pthread_mutex_destroy(&p.lock);
    ckptio__free(p.plan.wins);
    ckptio__free(p.alloc);
    ckptio__free(p.plan.runs);
    ckptio__free(p.plan.order);
    return st;
}
