/*
 * ckptio/snapshot.h - snapshots of training state: copies of tensors into
 * a reused pinned pool on ckptio's own streams, overlapping compute, for
 * async saves (docs/SNAPSHOTS.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_SNAPSHOT_H
#define CKPTIO_SNAPSHOT_H

#include "core.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/snapshot.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Snapshots of training state that overlap compute                        */
/* ------------------------------------------------------------------------ */
/* (docs/SNAPSHOTS.md)
 * A snapshot pool is one block of page-locked host memory, sized once,
 * pinned on a background thread and reused, holding one snapshot at a
 * time: copies of tensors (GPU or host memory) at pool offsets the caller
 * chooses. Device-to-host copies run on ckptio's own copy stream per
 * device, never on the caller's, ordered after the work the caller's stream
 * had queued when the snapshot was taken (an event), so that compute that
 * only reads the tensors (a forward and backward pass) runs beside them;
 * whoever is about to change the tensors makes its stream wait for the
 * copies first, on the device (ckptio_snapshot_before_update). */

typedef struct ckptio_snapshot_pool ckptio_snapshot_pool;

/* One tensor's bytes to copy: [src, src + nbytes) to the pool at `offset`. */
typedef struct ckptio_snapshot_copy {
    const void *src;      /* device memory of `device`, or host memory (device -1) */
    uint64_t offset;      /* where they go in the pool */
    uint64_t nbytes;
    int device;           /* CUDA device ordinal of src, or -1: host memory, copied during the call */
    unsigned flags;       /* CKPTIO_SNAPSHOT_EARLY or 0 */
} ckptio_snapshot_copy;

/* Copied before the device's other copies, and the caller's stream waits
 * for these at once (on the device): for tensors that work the caller
 * queues next may change (buffers a forward pass updates), which no
 * ckptio_snapshot_before_update guards. */
#define CKPTIO_SNAPSHOT_EARLY 1u

/* The caller's stream on `device` (a CUstream as an integer; 0 is the
 * legacy default stream): the snapshot holds the values the work queued
 * on it so far leaves. */
typedef struct ckptio_snapshot_stream {
    int device;
    uintptr_t stream;
} ckptio_snapshot_stream;

typedef struct ckptio_snapshot_pool_info {
    void *base;            /* the pool's first byte; valid until the pool is destroyed */
    uint64_t bytes;        /* its size: the bytes asked for, rounded up to whole pieces */
    uint64_t ready_bytes;  /* bytes from base pinned so far (host pool: faulted in) */
    uint64_t piece_bytes;  /* pinned one registration at a time, in address order */
    int device;            /* the device whose context pins it, or -1 for a host pool */
    int pinned;            /* 1: page-locked for CUDA; 0: plain host memory */
    int held;              /* 1 while a snapshot is taken and not released */
} ckptio_snapshot_pool_info;

/*! ckptio_snapshot_pool_create() :
 * Reserves `bytes` of host memory (rounded up to whole 64 MiB pieces; a
 * pool under 64 MiB is one piece of whole 2 MiB pages) and
 * returns at once; a background thread faults the pieces in and page-locks
 * them for CUDA (portable, device-mapped) in the primary context of
 * `device`, in address order. `device` -1 makes a host pool: plain memory,
 * for host tensors, no driver needed. Transparent huge pages are asked for
 * wherever the kernel gives them, unless `engine`'s CKPTIO_OPT_GPU_HUGE_SLOTS
 * says off (`engine` may be NULL: the defaults; docs/SNAPSHOTS.md). The memory is held until
 * ckptio_snapshot_pool_destroy(). @return CKPTIO_E_NO_CUDA without a driver
 * (device >= 0), CKPTIO_E_INVAL for 0 bytes, CKPTIO_E_NOMEM when the
 * address space or the thread cannot be had. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_create(const ckptio_engine *engine, uint64_t bytes, int device,
                                                     ckptio_snapshot_pool **out);

/*! ckptio_snapshot_pool_query() : size, base, how much is pinned, whether a
 * snapshot is held. Thread-safe. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_query(ckptio_snapshot_pool *pool, ckptio_snapshot_pool_info *out);

/*! ckptio_snapshot_pool_wait_ready() :
 * Blocks until the pool's first `bytes` are pinned (all of it: its size).
 * If pinning failed before that (the driver refused to page-lock memory),
 * fails with that error, naming the piece, every time it is asked.
 * CKPTIO_E_RANGE for more bytes than the pool has. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_wait_ready(ckptio_snapshot_pool *pool, uint64_t bytes);

/*! ckptio_snapshot_take() :
 * Takes a snapshot: for each device with copies, records an event on that
 * device's stream in `streams` (which must name every device in
 * `copies`), makes the pool's copy stream for the device wait for it, queues
 * the device's EARLY copies, makes the caller's stream wait for them, then
 * queues the others; copies of host memory are made during the call, after
 * the device copies are queued. Copies are cut where the pool's pieces
 * meet. Returns once everything is queued: the caller's stream goes on at
 * once (after the EARLY copies), the rest run beside it. Waits first for
 * the pool's memory up to the last byte written to be pinned (normally done
 * long before). CKPTIO_E_BUSY while the pool holds a snapshot not
 * released; CKPTIO_E_RANGE for a copy past the pool's end; CKPTIO_E_INVAL for
 * device memory without a stream for its device, or into a host pool. On a
 * failure no copy is left running into the pool and none is held. */
CKPTIO_API ckptio_status ckptio_snapshot_take(ckptio_snapshot_pool *pool, const ckptio_snapshot_copy *copies,
                                              size_t count, const ckptio_snapshot_stream *streams, size_t nstreams);

/*! ckptio_snapshot_before_update() :
 * Call before queueing work on `stream` (of `device`) that changes tensors
 * the held snapshot copies: the stream waits, on the device, for the end of
 * the snapshot's copies from that device (cuStreamWaitEvent); the caller
 * does not block. Nothing to do (CKPTIO_OK) when no snapshot is held, it
 * copies nothing from `device`, or those copies are known complete.
 * Thread-safe. */
CKPTIO_API ckptio_status ckptio_snapshot_before_update(ckptio_snapshot_pool *pool, int device, uintptr_t stream);

/*! ckptio_snapshot_copied() : 1 when the held snapshot's copies have all
 * completed (or none is held), 0 while some still run; never blocks. */
CKPTIO_API int ckptio_snapshot_copied(ckptio_snapshot_pool *pool);

/*! ckptio_snapshot_wait() :
 * Blocks until the held snapshot's copies have completed: then its bytes in
 * the pool are the tensors' values at the point of the take. Reports a copy
 * that failed on the device (CKPTIO_E_CUDA with the driver's error). */
CKPTIO_API ckptio_status ckptio_snapshot_wait(ckptio_snapshot_pool *pool);

/*! ckptio_snapshot_release() :
 * Ends the held snapshot (waiting for its copies first, and reporting
 * their failure as ckptio_snapshot_wait does): the pool takes the next one.
 * The caller is done reading it. CKPTIO_OK when none is held. */
CKPTIO_API ckptio_status ckptio_snapshot_release(ckptio_snapshot_pool *pool);

/*! ckptio_snapshot_pool_destroy() :
 * Releases the held snapshot (waiting for its copies), stops the pinning,
 * destroys the copy streams and events, unpins (which synchronises the
 * device) and frees the memory. Accepts NULL. @return the release's status. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_destroy(ckptio_snapshot_pool *pool);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_SNAPSHOT_H */
