/*
 * engine_internal.h - what the engine offers the layers above it (the GPU
 * layer, formats, checkpoint code). Implemented in src/engine; files and
 * their blocking transfers (ckptio__file_io) are src/io's (io_internal.h).
 */
#ifndef CKPTIO_ENGINE_INTERNAL_H
#define CKPTIO_ENGINE_INTERNAL_H

#include "common_internal.h"
#include "io_internal.h"

/* Runs fn(arg, worker) on `nworkers` threads of the engine's pool
 * (worker = 0..nworkers-1; nworkers 0 or 1 runs inline on the caller) and
 * waits for all of them. */
typedef void (*ckptio__worker_fn)(void *arg, unsigned worker);
ckptio_status ckptio__engine_parallel(ckptio_engine *engine, unsigned nworkers, ckptio__worker_fn fn, void *arg);

/* Reads a setting without the status dance (option must be valid). The
 * engine's settings are the only tunables of a transfer: nothing below or
 * above reads the environment for one (docs/ENGINE.md#5-settings). */
int64_t ckptio__engine_setting(const ckptio_engine *engine, ckptio_option option);

/* The process-wide variables naming the driver libraries src/gpu loads
 * (read once, when the library is first needed; settings.c documents them). */
#define CKPTIO__ENV_CUDA_LIBRARY "CKPTIO_CUDA_LIBRARY"
#define CKPTIO__ENV_CUFILE_LIBRARY "CKPTIO_CUFILE_LIBRARY"

/* Adds to the engine's counters (thread-safe). Only non-zero fields of
 * `delta` matter; staging_* are maintained with ckptio__engine_staging(). */
void ckptio__engine_stats_add(ckptio_engine *engine, const ckptio_stats *delta);

/* Records staging memory changes: reserved and in-use deltas (may be negative). */
void ckptio__engine_staging(ckptio_engine *engine, int64_t reserved_delta, int64_t in_use_delta);

/* Per-engine slot for the GPU layer's state (pinned pool, streams), created
 * on first use by src/gpu and destroyed with the engine through the
 * registered destructor. */
void *ckptio__engine_gpu_state(ckptio_engine *engine);
void ckptio__engine_set_gpu_state(ckptio_engine *engine, void *state, void (*destroy)(void *state));

/* Progress reporting from the thread that runs a transfer. Calls the
 * user's callback at most every few milliseconds, never with done == total
 * (that is ckptio__engine_progress_done's, after the transfer). Inside
 * ckptio_engine_execute(), `done` and `total` are taken as the GPU part of
 * the plan and reported on the whole plan's scale. Returns
 * CKPTIO_E_CANCELED (error record set) when the callback asks to stop. */
ckptio_status ckptio__engine_progress(ckptio_engine *engine, uint64_t done, uint64_t total);

/* The final report of a transfer made outside ckptio_engine_execute() (the
 * GDS file API): every byte moved, done == total; the callback's answer is
 * ignored. Inside ckptio_engine_execute() the plan makes its own. */
/* While a commit waits for bytes a transfer has handed over (an object's
 * last parts uploading), asks the progress callback again whether to go on,
 * at most every CKPTIO_PROGRESS_INTERVAL, repeating its last report (a
 * Ctrl-C is seen there); CKPTIO_E_CANCELED when it says stop. */
ckptio_status ckptio__engine_commit_poll(ckptio_engine *e);

void ckptio__engine_progress_done(ckptio_engine *engine, uint64_t total);

/* One progress scale for a call made of several plans (a torch-format
 * save: its data, then the archive's directory): until
 * ckptio__engine_progress_span_end(), each ckptio_engine_execute() reports
 * its bytes after those of the span's plans before it, out of `total`,
 * which must be the sum of their totals. The callback then sees one
 * transfer: one report of 0, bytes that only grow, and done == total once,
 * at the end of the last plan; an answer to stop between two plans cancels
 * the call. Not for calls whose plans' sizes are not known up front. */
void ckptio__engine_progress_span_begin(ckptio_engine *engine, uint64_t total);
void ckptio__engine_progress_span_end(ckptio_engine *engine);

/* Inside ckptio_engine_execute(): `bytes` of the GPU part are done by a
 * run whose progress started again from 0 (one pipeline run per device);
 * the next run's reports come after them. No effect elsewhere. */
void ckptio__engine_progress_advance(ckptio_engine *engine, uint64_t bytes);

/* Like ckptio__engine_parallel(), but while the workers run, the calling
 * thread reports progress from *done (which the workers advance with
 * atomic adds) against `total`. If the callback cancels, *cancel is set to 1
 * (workers should poll it and stop early) and, after every worker returned,
 * the call returns CKPTIO_E_CANCELED. */
ckptio_status ckptio__engine_parallel_progress(ckptio_engine *engine, unsigned nworkers, ckptio__worker_fn fn,
                                               void *arg, _Atomic uint64_t *done, uint64_t total,
                                               _Atomic int *cancel);

/* ---- write-plan observers ---------------------------------------------------
 * A write plan can carry one observer: fn(user, extent, offset, bytes, len)
 * sees every byte of every extent exactly once, as a pointer to host memory
 * holding the bytes being written: the caller's memory for host extents,
 * the pinned staging copy for GPU extents (so a checksum of device memory
 * costs no second pass over the device or the disk).
 *  - extent: index in the plan (ckptio_plan_add order); offset: position of
 *    `bytes` within that extent; zero-length extents are never observed.
 *  - Calls come from worker threads (or the caller's thread with 0 threads),
 *    concurrently and in any order, also for one extent. They happen after
 *    the bytes are in host memory and before they can change: a GPU staging
 *    slot is not refilled until fn returned. `bytes` is valid during the
 *    call only. fn must be thread-safe and must not call into the engine.
 *  - block > 0: no call crosses an extent offset that is a multiple of
 *    `block`, and a whole block [k*block, min((k+1)*block, length)) comes in
 *    ONE call for host extents always, and for GPU extents whenever a staging
 *    slot can hold block + 4 KiB (the pipeline sizes its slots so when
 *    CKPTIO_OPT_STAGING_BYTES >= 4 x (block + 4 KiB)); otherwise a block may
 *    come in several pieces and the caller must cope (e.g. hash it again from
 *    the file). block = 0: calls of any size (combine per-call CRCs in
 *    offset order with crc32_combine).
 *  - The cuFile path moves device bytes without host staging: an observed
 *    plan uses the staging pipeline under CKPTIO_GPU_PATH_AUTO and fails with
 *    CKPTIO_E_UNSUPPORTED under CKPTIO_GPU_PATH_CUFILE.
 * fn NULL removes the observer. Read plans refuse one (CKPTIO_E_INVAL). */
typedef void (*ckptio__observe_fn)(void *user, size_t extent, uint64_t offset, const void *bytes, uint64_t len);

typedef struct ckptio__observer {
    ckptio__observe_fn fn;
    void *user;
    uint64_t block;
    const size_t *index; /* GPU layer: plan index of each extent it was given (NULL: the same) */
} ckptio__observer;

ckptio_status ckptio__plan_set_observer(ckptio_plan *plan, ckptio__observe_fn fn, void *user, uint64_t block);

/* ckptio_plan_add, except that an extent continuing the plan's last one -
 * same file and memory kind, the next bytes of both the file and the memory
 * - lengthens that one instead: tensors read back to back into one buffer
 * become one extent, and the engine's cost per extent is paid once. For
 * read plans (their extents have no identity an observer would see). */
ckptio_status ckptio__plan_add_merged(ckptio_plan *plan, const ckptio_extent *extent);
/* Whether two read extents of this memory kind that continue each other in file and memory may become one:
 * host memory is one flat range, but device memory (and AUTO, which may be device) is not: two cudaMalloc
 * allocations can lie back to back, and an extent spanning both is refused by the device range check (the
 * GPU pipeline merges nearby runs of one allocation itself). */
static inline bool ckptio__mem_kind_merges(ckptio_mem_kind kind) {
    return kind == CKPTIO_MEM_HOST || kind == CKPTIO_MEM_PINNED;
}

/* Whether read extent `e` continues `last` in file and memory and may lengthen it (ckptio__mem_kind_merges). */
static inline bool ckptio__extent_continues(const ckptio_extent *last, const ckptio_extent *e) {
    return last && e->length && last->length && last->file == e->file && last->mem_kind == e->mem_kind &&
           ckptio__mem_kind_merges(e->mem_kind) && last->file_offset + last->length == e->file_offset &&
           (const unsigned char *)last->memory + last->length == (const unsigned char *)e->memory;
}

/* The number of extents of a plan, and their bytes together. */
ckptio_status ckptio__plan_count(const ckptio_plan *plan, size_t *out);
ckptio_status ckptio__plan_total_bytes(const ckptio_plan *plan, uint64_t *out);

/* Calls obs->fn for the file range [lo, hi) of extent `index` (plan index
 * `obs->index[index]` if mapped), whose bytes are at `bytes`, cut at the
 * observer's block boundaries. */
void ckptio__observe_range(const ckptio__observer *obs, size_t index, const ckptio_extent *x, uint64_t lo,
                           uint64_t hi, const void *bytes);

/* ---- device memory: where the GPU layer plugs in -----------------------------
 * The engine moves host extents itself and hands extents in device memory to
 * its engine's device provider, a table defined here and filled in by
 * src/gpu: the engine includes and calls nothing of src/gpu. The public
 * ckptio_engine_create() (src/gpu/gpu_engine.c) creates every engine with
 * the GPU layer's provider. */
typedef struct ckptio__device_provider {
    /* CKPTIO_MEM_CUDA, CKPTIO_MEM_PINNED or CKPTIO_MEM_HOST (also when no
     * driver is present) for the memory at `ptr`. */
    ckptio_mem_kind (*classify)(const void *ptr);
    /* Moves `extents` (all CKPTIO_MEM_CUDA) between their files and device
     * memory in direction `dir`, blocking; called by ckptio_engine_execute()
     * on the caller's thread after the host extents. `obs` (NULL: none) is
     * the plan's observer, its index mapping positions in `extents` to the
     * plan's extent numbers. */
    ckptio_status (*execute)(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *extents, size_t count,
                             const ckptio__observer *obs);
} ckptio__device_provider;

/* ckptio_engine_create() with `device` (NULL: no device memory; every
 * pointer is host memory and an extent given as CKPTIO_MEM_CUDA fails with
 * CKPTIO_E_UNSUPPORTED). `device` must outlive the engine. */
ckptio_status ckptio__engine_create(const ckptio__device_provider *device, ckptio_engine **out);

#endif /* CKPTIO_ENGINE_INTERNAL_H */
