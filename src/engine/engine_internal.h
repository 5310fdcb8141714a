/*
 * engine_internal.h - what the engine offers the rest of libckptio
 * (the GPU pipeline, checkpoint code). Implemented in src/engine and src/io.
 */
#ifndef CKPTIO_ENGINE_INTERNAL_H
#define CKPTIO_ENGINE_INTERNAL_H

#include "common_internal.h"

/* Alignment O_DIRECT needs for offsets, lengths and buffer addresses. */
#define CKPTIO_DIRECT_ALIGN 4096u

/* Blocking, complete transfer of [offset, offset + len) between `file` and
 * the host buffer `buf`: retries EINTR and short transfers, uses O_DIRECT
 * when buf, offset and len are CKPTIO_DIRECT_ALIGN-aligned and the file has
 * a direct descriptor, buffered I/O otherwise. Reads past end of file fail
 * with CKPTIO_E_TRUNCATED. Safe to call from several threads at once on one
 * file. Errors name the file, operation and offset. Updates engine stats. */
ckptio_status ckptio__file_io(ckptio_file *file, ckptio_direction dir, void *buf, uint64_t len,
                              uint64_t offset);

/* The engine a file was opened with. */
ckptio_engine *ckptio__file_engine(const ckptio_file *file);

/* Runs fn(arg, worker) on `nworkers` threads of the engine's pool
 * (worker = 0..nworkers-1; nworkers 0 or 1 runs inline on the caller) and
 * waits for all of them. */
typedef void (*ckptio__worker_fn)(void *arg, unsigned worker);
ckptio_status ckptio__engine_parallel(ckptio_engine *engine, unsigned nworkers, ckptio__worker_fn fn, void *arg);

/* Reads a setting without the status dance (option must be valid). */
int64_t ckptio__engine_setting(const ckptio_engine *engine, ckptio_option option);

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
 * user's callback at most every few milliseconds (always when done ==
 * total). Inside ckptio_engine_execute(), `done` and `total` are taken as
 * the GPU part of the plan and reported on the whole plan's scale. Returns
 * CKPTIO_E_CANCELED (error record set) when the callback asks to stop. */
ckptio_status ckptio__engine_progress(ckptio_engine *engine, uint64_t done, uint64_t total);

/* Like ckptio__engine_parallel(), but while the workers run, the calling
 * thread reports progress from *done (which the workers advance with
 * atomic adds) against `total`. If the callback cancels, *cancel is set to 1
 * (workers should poll it and stop early) and, after every worker returned,
 * the call returns CKPTIO_E_CANCELED. */
ckptio_status ckptio__engine_parallel_progress(ckptio_engine *engine, unsigned nworkers, ckptio__worker_fn fn,
                                               void *arg, _Atomic uint64_t *done, uint64_t total,
                                               _Atomic int *cancel);

/* Open-file bookkeeping (src/io): ckptio_engine_destroy() refuses with
 * CKPTIO_E_BUSY while files opened with the engine are still open. */
void ckptio__engine_file_ref(ckptio_engine *engine, int delta);

#endif /* CKPTIO_ENGINE_INTERNAL_H */
