/*
 * gpu_pipeline.h - ckptio's own path between files and GPU memory: pinned
 * staging slots, one stream per worker, storage I/O overlapped with copies.
 *
 * Reads, per worker:   wait slot's event -> read file window into the slot
 *                      (the worker's queue of the engine's I/O backend,
 *                      O_DIRECT when aligned: the file stage) -> queue the
 *                      host-to-device copies -> record the slot's event ->
 *                      next slot. The read of window k+1 overlaps the copy of
 *                      window k; a slot is refilled only after its event.
 * Writes, per worker:  queue device-to-host copies for up to NSLOTS windows
 *                      ahead, then wait the oldest slot's event, write it,
 *                      refill that slot: copies overlap the writes.
 * Windows are claimed dynamically from one shared counter, so workers stay
 * busy until the end. Extents adjacent in a file share windows, so many
 * small tensors still make large requests.
 */
#ifndef CKPTIO_GPU_PIPELINE_H
#define CKPTIO_GPU_PIPELINE_H

#include "engine_internal.h"
#include "gpu_ops.h"
#include "gpu_windows.h"
#include "io_internal.h"

#include <pthread.h>
#include <stdatomic.h>

/* The geometry's constants (gpu_geometry.c; docs/GPU.md#slot-geometry says why these). */
#define CKPTIO_GPU_NSLOTS 4              /* staging slots per worker (writes queue this many copies) */
#define CKPTIO_GPU_READ_SLOTS 2          /* of them, the slots a read worker rotates through */
#define CKPTIO_GPU_MIN_SLOT (256u << 10) /* below this, use fewer workers instead */
#define CKPTIO_GPU_MAX_WORKERS 64
#define CKPTIO_GPU_SLOT_MAX (4u << 20)   /* slots (and windows) of files: at most 4 MiB */
#define CKPTIO_GPU_OBJECT_GETS_MAX 32    /* ranged GETs of one window of an s3:// object */

/* One worker's GPU resources, kept across calls. */
typedef struct ckptio__gpu_worker_res {
    int device;                          /* device of stream and events, -1 none */
    void *stream;
    void *mem[CKPTIO_GPU_NSLOTS];        /* pinned slots, slot_bytes each */
    void *event[CKPTIO_GPU_NSLOTS];
    /* The worker's file stage: a queue of the engine's I/O backend (an
     * io_uring ring of its own, or the pread queue), made on first need
     * with ckptio__io_queue_create like the host workers' queues. */
    const ckptio__backend_ops *backend;  /* backend of `queue` */
    ckptio__io_queue *queue;             /* NULL until first need */
    unsigned depth;                      /* depth `queue` was created with */
} ckptio__gpu_worker_res;

/* Per-engine GPU state (ckptio__engine_gpu_state): the reused staging. */
typedef struct ckptio__gpu_state {
    ckptio_engine *engine;
    const ckptio__gpu_ops *ops;          /* ops the resources were made with */
    pthread_mutex_t lock;                /* one pipeline run at a time per engine */
    pthread_mutex_t pin_lock;            /* one pinned allocation at a time */
    size_t slot_bytes;                   /* geometry of the pinned slots */
    bool huge_slots;                     /* slots pinned from now on: on huge pages (set under `lock`) */
    uint64_t reserved;                   /* pinned bytes allocated */
    /* The address range the slots live in (gpu_slot_range.h), range_bytes
     * long: a place per worker and slot index, slot_bytes rounded up to 2
     * MiB apart; set up under `lock` by ckptio__gpu_slot_range_ready for the
     * current slot_bytes and released when it changes. NULL: slots come from
     * ops->pinned_alloc (no range could be reserved, or the driver cannot
     * register memory: range_refused). */
    unsigned char *range;
    size_t range_bytes;
    bool range_huge;                     /* how the range is advised */
    _Atomic bool range_refused;
    ckptio__gpu_worker_res workers[CKPTIO_GPU_MAX_WORKERS];
    /* ckptio_engine_gpu_prepare's background pinning: one thread at a time,
     * joined by the next prepare and by the engine's destruction. */
    pthread_mutex_t prepare_lock;        /* guards prepare_thread and prepare_started */
    pthread_t prepare_thread;
    bool prepare_started;                /* prepare_thread is to be joined */
    _Atomic bool prepare_stop;           /* the engine is going away */
    /* Transfers waiting for `lock`. The prepare thread stops when one is: it
     * takes `lock` again right after releasing it, and a mutex is not fair,
     * so a waiting transfer could otherwise wait for most of the pinning
     * (test_prepare_yields_to_a_transfer: 9 of 16 slots without this). */
    _Atomic unsigned transfers_waiting;
    /* Stream-ordered GDS requests of the engine whose caller's stream waits
     * on them (gds_async.c): counted up under resize_lock before the wait is
     * queued, down once the request opened its gate. While there are any,
     * pinned slots are not freed (ckptio__gpu_kept_slot_bytes); a run that
     * may resize them holds resize_lock until it has. */
    _Atomic unsigned stream_waits;
    pthread_mutex_t resize_lock;
    int last_path;                       /* ckptio_io_path of the last GPU transfer */
} ckptio__gpu_state;

/* The engine's GPU state, created on first use. */
ckptio_status ckptio__gpu_state_get(ckptio_engine *engine, const ckptio__gpu_ops *ops, ckptio__gpu_state **out);

/* Whether staging slots pinned from now on use transparent huge pages
 * (docs/GPU.md#huge-slots): the engine's CKPTIO_OPT_GPU_HUGE_SLOTS;
 * under AUTO, while THP is enabled ([always] or [madvise]) and the kernel's
 * free blocks of 2 MiB and more cover twice `pin_bytes`, what the calling
 * transfer or prepare may pin (src/io/huge_pages.c): with THP's defrag in
 * madvise mode a fault in an advised range that finds no free 2 MiB block
 * compacts memory first, a stall on a busy host's first load; with that
 * margin the faults take free blocks. Reads /proc/buddyinfo and
 * /sys/kernel/mm/transparent_hugepage/enabled: call it on a caller's
 * thread, once per transfer. */
bool ckptio__gpu_huge_slots(ckptio_engine *engine, uint64_t pin_bytes);

/* Workers and slot size a load (no observer) runs with under the engine's
 * settings: what ckptio_engine_gpu_prepare pins ahead. */
void ckptio__gpu_load_geometry(ckptio_engine *engine, unsigned *nworkers, uint64_t *slot);

/* Workers and slot size of a transfer under the engine's settings (threads,
 * staging and chunk bytes; 1 worker when `inline_only`): slots of at most
 * 4 MiB, 4 per worker within the staging bound, fewer workers before slots
 * under CKPTIO_GPU_MIN_SLOT; with an observer block size `block` (writes),
 * slots large enough for a whole block at any alignment (gpu_geometry.c). */
void ckptio__gpu_geometry(ckptio_engine *engine, bool inline_only, uint64_t block, unsigned *nworkers,
                          uint64_t *slot);

/* Workers and GETs of a read whose `count` extents include one in an
 * s3:// object (gpu_geometry.c); 0 and nothing set when none does. Returns
 * the GETs per window and worker, G, all in flight; *get_bytes is
 * CKPTIO_OPT_CHUNK_BYTES; *nworkers x G <= CKPTIO_OPT_S3_CONCURRENCY GETs in
 * flight and *nworkers x CKPTIO_GPU_READ_SLOTS x G x *get_bytes <=
 * CKPTIO_OPT_STAGING_BYTES pinned (GETs smaller than the chunk only where
 * one worker's two slots of one chunk would exceed it). */
unsigned ckptio__gpu_object_geometry(ckptio_engine *engine, bool inline_only, const ckptio_extent *extents,
                                     size_t count, unsigned *nworkers, uint64_t *get_bytes);

/* The slot size a read of `nworkers` workers runs with, `slot` its own
 * geometry's (st->lock held): the larger slots already pinned (an object
 * read's) where the workers' read slots stay within CKPTIO_OPT_STAGING_BYTES,
 * since its windows fit them and re-pinning costs a load more than the
 * larger slots do (and freeing pinned memory synchronises the device). */
uint64_t ckptio__gpu_read_slot(ckptio_engine *engine, const ckptio__gpu_state *st, unsigned nworkers, uint64_t slot);

/* Starts pinning the slots a load to `device` will use, in the background
 * (ckptio_engine_gpu_prepare). */
ckptio_status ckptio__gpu_prepare(ckptio_engine *engine, const ckptio__gpu_ops *ops, int device);

/* Sets the geometry for a run (frees slots of another size; st->lock held). */
void ckptio__gpu_state_set_slot_bytes(ckptio__gpu_state *st, size_t slot_bytes);

/* The size of the pinned slots while a stream waits on a stream-ordered
 * request of the engine (stream_waits) and some slots are pinned: a run
 * then keeps them, cuts its windows to fit and pins no more of them than
 * the staging bound holds (ckptio__gpu_slots_bound); 0 otherwise (the run may
 * resize them). Called with st->lock and st->resize_lock held. Freeing pinned
 * memory synchronises a real device, which would wait for that stream,
 * which waits for the request, which waits for this run (or is this run):
 * a deadlock. */
uint64_t ckptio__gpu_kept_slot_bytes(const ckptio__gpu_state *st);

/* A stream-ordered request is about to make its caller's stream wait on it
 * (before the wait is queued), and its gate opened (the stream goes on). */
void ckptio__gpu_stream_wait_begin(ckptio__gpu_state *st);
void ckptio__gpu_stream_wait_end(ckptio__gpu_state *st);

/* How many of slots [0, slots) of workers [0, workers), or of worker w, are pinned (under `lock`). */
unsigned ckptio__gpu_pinned_slots(const ckptio__gpu_state *st, unsigned workers, unsigned slots);
unsigned ckptio__gpu_pinned_slots_of(const ckptio__gpu_state *st, unsigned w, unsigned slots);

/* Keeps a run's pinned slots within `bound` bytes (CKPTIO_OPT_STAGING_BYTES),
 * the slot size set (st->lock held; resize_lock too unless `keep`). The run
 * has *workers workers using up to *slots slots each: a write's slots
 * [0, *slots), or, with `any_pinned` (a read's ring), the first *slots
 * pinned ones and new ones up to that many. Slots pinned earlier count: a
 * run may add slots only up to the bound. Without `keep`, pinned slots the
 * run does not use are freed first when the bound needs it (pinned under a
 * larger bound or for more workers); with `keep` (a stream waits:
 * ckptio__gpu_kept_slot_bytes) nothing is freed, and the run gets fewer
 * workers, then fewer slots each, down to one worker with one slot. */
void ckptio__gpu_slots_bound(ckptio__gpu_state *st, uint64_t bound, bool keep, bool any_pinned, unsigned *workers,
                             unsigned *slots);

/* Gives worker w its stream and events on `device` (created on first need,
 * reused afterwards). Called on the worker's thread with the device's
 * context current. */
ckptio_status ckptio__gpu_worker_ready(ckptio__gpu_state *st, unsigned w, int device);

/* Makes the range the slots are pinned in fit the slot size and
 * huge_slots (under `lock`, before workers that may pin start). Without a
 * range (refused, or the reservation failed) slots come from
 * ops->pinned_alloc, as they did before there was one. */
void ckptio__gpu_slot_range_ready(ckptio__gpu_state *st);

/* Faults in, on up to CKPTIO__PREFILL_THREADS threads side by side, the
 * range's pages of slots [0, slots) of workers [0, workers) not yet pinned,
 * so that pinning them afterwards is the driver's registration alone (under
 * `lock`; best effort: a slot that could not be filled is filled again when
 * it is pinned, which reports the error). Without a range, nothing. */
#define CKPTIO__PREFILL_THREADS 8
void ckptio__gpu_slots_prefill(ckptio__gpu_state *st, unsigned workers, unsigned slots);

/* Worker w's pinned slot s, allocated on its first use and reused
 * afterwards (same thread and context as ckptio__gpu_worker_ready). Without
 * `wait`, a slot not yet allocated is left so (*out NULL, CKPTIO_OK) when
 * another worker is pinning memory at that moment. */
ckptio_status ckptio__gpu_slot(ckptio__gpu_state *st, unsigned w, unsigned s, bool wait, unsigned char **out);

/* The two halves of ckptio__gpu_slot, for a worker that has work to do
 * between them. ckptio__gpu_slot_fault_in: the place of worker w's slot s
 * in the range, faulted in and not yet pinned (no lock taken); NULL when
 * the slot is pinned already or there is no range to pin in.
 * ckptio__gpu_slot_pin: pins it (`filled`, or a slot of its own from
 * ops->pinned_alloc when `filled` is NULL or the driver cannot register);
 * its first `keep` bytes, which the caller wrote while unpinned, are in the
 * slot it gets either way. Without `wait` as in ckptio__gpu_slot, the
 * filled pages staying for the next try. */
unsigned char *ckptio__gpu_slot_fault_in(ckptio__gpu_state *st, unsigned w, unsigned s);
ckptio_status ckptio__gpu_slot_pin(ckptio__gpu_state *st, unsigned w, unsigned s, unsigned char *filled,
                                   size_t keep, bool wait, unsigned char **out);

/* ---- the file stage (gpu_file_stage.c) -------------------------------------- */

#define CKPTIO_GPU_WINDOW_OPS_MAX 3 /* file operations of one window: head, body, tail */

/* What a run gives every worker's file stage. */
typedef struct ckptio__gpu_file_stage_config {
    const ckptio__backend_ops *backend; /* the file stage's backend */
    bool backend_forced;                /* CKPTIO_OPT_BACKEND names it: no fallback */
    unsigned depth;                     /* queue depth of each worker's file stage */
    const ckptio__gpu_plan *plan;       /* the run's extents, runs and windows */
    uint64_t object_get;                /* a read's GET size for s3:// objects (gpu_geometry.c); 0: none */
} ckptio__gpu_file_stage_config;

/* One worker's file stage for one run: its queue and its counters, added
 * to the engine's once, when the worker ends. */
typedef struct ckptio__gpu_file_stage {
    const ckptio__backend_ops *be;
    ckptio__io_queue *q;
    unsigned depth;
    bool broken;     /* the queue failed: dropped when the worker ends */
    ckptio_stats st;
    const ckptio__gpu_plan *plan;
    uint64_t object_get;
} ckptio__gpu_file_stage;

/* Makes worker w's queue (r) match the run's backend and depth (a queue of
 * another backend or depth, e.g. after a setting changed, is replaced) and
 * sets up *fs on it for the run `cfg`. */
ckptio_status ckptio__gpu_file_stage_ready(ckptio__gpu_file_stage *fs, ckptio__gpu_worker_res *r, unsigned w,
                                          const ckptio__gpu_file_stage_config *cfg);

/* Whether `w` is a read's window of an s3:// object (its bytes start at the slot's first byte). */
bool ckptio__gpu_object_window(const ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w);

/* Reads window `w` into `slot`: the aligned superset of the window in one
 * operation, or, when it ends in the file's last partial block, the
 * aligned part and the rest buffered (a range past EOF fails as
 * truncated). A window of an s3:// object goes as ranged GETs from its
 * start (ckptio__gpu_object_window). */
ckptio_status ckptio__gpu_read_window(ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w, unsigned char *slot);

/* Reads packed window `w` into `slot`: each extent's piece, back to back,
 * in file order (the pipeline's copies find them there),
 * CKPTIO_GPU_WINDOW_OPS_MAX at a time. A piece past the end of the file
 * fails as truncated. */
ckptio_status ckptio__gpu_read_packed(ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w, unsigned char *slot);

/* Writes window `w` from `slot`: an unaligned head and tail buffered, the
 * aligned middle direct (one buffered write when no whole block is inside). */
ckptio_status ckptio__gpu_write_window(ckptio__gpu_file_stage *fs, const ckptio__gpu_window *w, unsigned char *slot);

/* Runs the extents (all device memory of `device`) through the pipeline,
 * blocking until done. `inline_only` runs one worker on the calling thread
 * (no pool), for callers that are themselves background threads.
 * Errors name the extent, file and offset. The entry of transfers outside
 * a plan (the GDS file API): it counts its wall time as seconds_io, which
 * ckptio_engine_execute() counts for a plan's GPU part. */
ckptio_status ckptio__gpu_pipeline_run(ckptio_engine *engine, const ckptio__gpu_ops *ops, int device,
                                       ckptio_direction dir, const ckptio_extent *extents, size_t count,
                                       bool inline_only);

/* The same with a write observer (NULL: none; engine_internal.h has the
 * contract): each window's bytes are observed in its pinned slot after the
 * device-to-host copy completed and before the slot is written out and
 * refilled. With obs->block, windows end at block boundaries where a block
 * fits, and slots are made large enough for a block plus 4 KiB of alignment
 * when the staging bound allows (fewer workers if need be). */
ckptio_status ckptio__gpu_pipeline_run_observed(ckptio_engine *engine, const ckptio__gpu_ops *ops, int device,
                                                ckptio_direction dir, const ckptio_extent *extents, size_t count,
                                                bool inline_only, const ckptio__observer *obs);

#endif /* CKPTIO_GPU_PIPELINE_H */
