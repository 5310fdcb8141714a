/*
 * gpu_file_stage.c - the file side of the GPU pipeline (gpu_pipeline.c):
 * each worker moves its windows' bytes between the file and its pinned
 * staging slot through its own queue of the engine's I/O backend.
 *
 * The queues are the host workers' (ckptio__io_queue_create: pread, or an
 * io_uring ring per worker with no lock shared between workers), built
 * with the same rules (ckptio__file_op_init: O_DIRECT when aligned, the
 * read policy), counted the same way (ckptio__io_op_count: extent bytes,
 * not padding or holes) and failing with the same message shape. So faults
 * injected into the backends hit GPU plans where they hit host plans. A
 * window's two or three operations (aligned body, buffered head and tail)
 * are in flight together on io_uring, one after the other on pread, where
 * the common window is a single pread into the slot.
 */
#include "gpu_pipeline.h"

#include "gpu_windows.h"

#include <stdio.h>

#define ALIGN ((uint64_t)CKPTIO_DIRECT_ALIGN)

typedef ckptio__gpu_run run; /* the plan's (gpu_windows.h), by shorter names */
typedef ckptio__gpu_window window;
typedef ckptio__gpu_file_stage file_stage;

ckptio_status ckptio__gpu_file_stage_ready(ckptio__gpu_file_stage *fs, ckptio__gpu_worker_res *r, unsigned w,
                                          const ckptio__gpu_file_stage_config *cfg) {
    if (r->queue && (r->backend != cfg->backend || r->depth != cfg->depth)) {
        r->backend->queue_destroy(r->queue);
        r->queue = NULL;
    }
    if (!r->queue) {
        const ckptio__backend_ops *be = cfg->backend;
        unsigned depth = cfg->depth;
        CKPTIO_FORWARD(ckptio__io_queue_create(&be, &depth, cfg->backend_forced, w, &r->queue));
        r->backend = be;
        r->depth = depth;
    }
    *fs = (ckptio__gpu_file_stage){.be = r->backend, .q = r->queue, .depth = r->depth, .plan = cfg->plan,
                                   .object_get = cfg->object_get};
    return CKPTIO_OK;
}

/* Extent bytes of window `w` inside the file range [lo, hi): holes a read
 * bridges and alignment padding are moved but are no one's data. */
static uint64_t data_bytes(const file_stage *fs, const window *w, uint64_t lo, uint64_t hi) {
    size_t k = w->first, idx;
    uint64_t a, b, sum = 0;
    while (ckptio__gpu_next_piece(fs->plan, w, &k, &idx, &a, &b)) {
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (b > a) sum += b - a;
    }
    return sum;
}

/* The failure of `op` in window `w` as the host executor words it:
 * "extent N (backend, O_DIRECT|buffered, ...)" at the offset it stopped. */
static ckptio_status op_failure(const file_stage *fs, const window *w, ckptio__io_op *op) {
    const uint64_t at = op->offset + op->done;
    size_t k = w->first, idx, name = fs->plan->order[w->first];
    uint64_t lo, hi;
    while (ckptio__gpu_next_piece(fs->plan, w, &k, &idx, &lo, &hi)) {
        name = idx; /* the extent the failure is in or before, else the window's last */
        if (hi > at) break;
    }
    char what[160];
    snprintf(what, sizeof what, "extent %zu (%s, %s, GPU staging window)", name, fs->be->name,
             op->direct ? "O_DIRECT" : "buffered");
    if (!op->err) op->eof = true;
    return ckptio__file_op_status(fs->plan->runs[w->run].file, op, what);
}

/* Moves window `w`'s operations through the worker's queue, all in flight
 * at once where its depth allows, and waits for every one: the slot is
 * not touched again before they are done. Returns the first failure in
 * file order. */
static ckptio_status run_ops(file_stage *fs, const window *w, ckptio__io_op *ops, unsigned n) {
    unsigned submitted = 0, inflight = 0;
    while (submitted < n || inflight) {
        while (submitted < n && inflight < fs->depth) {
            fs->be->submit(fs->q, &ops[submitted++]);
            inflight++;
        }
        if (!fs->be->wait(fs->q)) {
            /* The ring itself failed: nothing it holds can be trusted. */
            fs->broken = true;
            return CKPTIO_FAIL_CTX(CKPTIO_E_INTERNAL,
                                   &((ckptio__err_ctx){.path = ckptio_file_path(fs->plan->runs[w->run].file),
                                                       .file_offset = (int64_t)w->start}),
                                   "the %s queue of a GPU staging worker failed with %u requests in flight",
                                   fs->be->name, inflight);
        }
        inflight--;
    }
    ckptio__io_op *failed = NULL;
    for (unsigned i = 0; i < n; i++) {
        /* A packed window's operations are its extents' pieces: all data. */
        const uint64_t data = w->packed ? ops[i].len : data_bytes(fs, w, ops[i].offset, ops[i].offset + ops[i].len);
        ckptio__io_op_count(&ops[i], data, &fs->st);
        if (!failed && (ops[i].err || ops[i].done < ops[i].need)) failed = &ops[i];
    }
    return failed ? op_failure(fs, w, failed) : CKPTIO_OK;
}

bool ckptio__gpu_object_window(const ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w) {
    return fs->object_get && fs->plan->runs[w->run].file->object;
}

/* Reads window `w` of an s3:// object: ranged GETs of the geometry's size
 * (CKPTIO_OPT_CHUNK_BYTES) from the window's start, the last one shorter,
 * all in flight at once (the geometry made them at most the stage's
 * depth), while the worker's other slot is copied to the device. A
 * window's GETs are never cut finer: each costs the server a fixed amount. */
static ckptio_status read_object_window(file_stage *fs, const window *w, unsigned char *slot) {
    const run *rn = &fs->plan->runs[w->run];
    ckptio__io_op ops[CKPTIO_GPU_OBJECT_GETS_MAX];
    unsigned k = 0;
    for (uint64_t at = w->start; at < w->end && k < CKPTIO_GPU_OBJECT_GETS_MAX; at += fs->object_get, k++) {
        const uint64_t m = w->end - at < fs->object_get ? w->end - at : fs->object_get;
        ckptio__file_op_init(&ops[k], rn->file, CKPTIO_READ, slot + (at - w->start), m, at);
    }
    return run_ops(fs, w, ops, k);
}

ckptio_status ckptio__gpu_read_window(ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w, unsigned char *slot) {
    const run *rn = &fs->plan->runs[w->run];
    const uint64_t a = ckptio__align_down(w->start, ALIGN);
    if (ckptio__gpu_object_window(fs, w)) return read_object_window(fs, w, slot);
    const uint64_t ea = ckptio__align_up(w->end, ALIGN);
    ckptio__io_op ops[CKPTIO_GPU_WINDOW_OPS_MAX];
    unsigned n = 0;
    if (ea <= rn->file_size) {
        ckptio__file_op_init(&ops[n++], rn->file, CKPTIO_READ, slot, ea - a, a);
    } else {
        const uint64_t ed = ckptio__align_down(w->end, ALIGN);
        if (ed > a) ckptio__file_op_init(&ops[n++], rn->file, CKPTIO_READ, slot, ed - a, a);
        const uint64_t from = ed > a ? ed : a;
        ckptio__file_op_init(&ops[n++], rn->file, CKPTIO_READ, slot + (from - a), w->end - from, from);
    }
    return run_ops(fs, w, ops, n);
}

ckptio_status ckptio__gpu_read_packed(ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w, unsigned char *slot) {
    ckptio__io_op ops[CKPTIO_GPU_WINDOW_OPS_MAX];
    unsigned n = 0;
    size_t k = w->first, idx;
    uint64_t lo, hi, used = 0;
    while (ckptio__gpu_next_piece(fs->plan, w, &k, &idx, &lo, &hi)) {
        ckptio__file_op_init(&ops[n++], fs->plan->runs[w->run].file, CKPTIO_READ, slot + used, hi - lo, lo);
        used += hi - lo;
        if (n == CKPTIO_GPU_WINDOW_OPS_MAX) {
            CKPTIO_FORWARD(run_ops(fs, w, ops, n));
            n = 0;
        }
    }
    return n ? run_ops(fs, w, ops, n) : CKPTIO_OK;
}

ckptio_status ckptio__gpu_write_window(ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w, unsigned char *slot) {
    ckptio_file *file = fs->plan->runs[w->run].file;
    const uint64_t a = ckptio__align_down(w->start, ALIGN);
    const uint64_t head_end = ckptio__align_up(w->start, ALIGN);
    const uint64_t tail_start = ckptio__align_down(w->end, ALIGN);
    ckptio__io_op ops[CKPTIO_GPU_WINDOW_OPS_MAX];
    unsigned n = 0;
    if (head_end >= tail_start) {
        ckptio__file_op_init(&ops[n++], file, CKPTIO_WRITE, slot + (w->start - a), w->end - w->start, w->start);
    } else {
        if (head_end > w->start)
            ckptio__file_op_init(&ops[n++], file, CKPTIO_WRITE, slot + (w->start - a), head_end - w->start, w->start);
        ckptio__file_op_init(&ops[n++], file, CKPTIO_WRITE, slot + (head_end - a), tail_start - head_end, head_end);
        if (w->end > tail_start)
            ckptio__file_op_init(&ops[n++], file, CKPTIO_WRITE, slot + (tail_start - a), w->end - tail_start,
                                 tail_start);
    }
    return run_ops(fs, w, ops, n);
}
