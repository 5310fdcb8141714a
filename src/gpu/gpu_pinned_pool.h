/*
 * gpu_pinned_pool.h - one large block of host memory, page-locked in the
 * background piece by piece: the memory a snapshot of training state is
 * copied into (gpu_snapshot.c). Reserved as one address range (the staging
 * slots' range code, gpu_slot_range.h), faulted in by a few threads and
 * registered with the driver one piece at a time in address order, so the
 * first bytes are usable long before the last are pinned and no single
 * registration holds the driver for long.
 */
#ifndef CKPTIO_GPU_PINNED_POOL_H
#define CKPTIO_GPU_PINNED_POOL_H

#include "gpu_ops.h"

/* Bytes registered at once: 64 MiB took ~30 ms with 4 KiB pages and ~8 ms on
 * huge pages on an H200 host (0.5 and 0.25-0.3 s per GiB, docs/GPU.md), short
 * enough that a caller's own driver calls waiting behind one do not stall. */
#define CKPTIO__POOL_PIECE_BYTES (64ull << 20)

typedef struct ckptio__pinned_pool ckptio__pinned_pool;

/* Reserves `bytes` (rounded up to whole pieces; a pool smaller than
 * CKPTIO__POOL_PIECE_BYTES is one piece of whole 2 MiB pages) and starts a thread that
 * faults the pieces in and, with `ops`, page-locks them (slot_pin) in the
 * primary context of `device`, in address order. `ops` NULL: plain host
 * memory, faulted in the same way (no driver). `huge`: ask for transparent
 * huge pages. Fails with the reservation's or the thread's creation error. */
ckptio_status ckptio__pinned_pool_create(const ckptio__gpu_ops *ops, int device, uint64_t bytes, bool huge,
                                         ckptio__pinned_pool **out);

unsigned char *ckptio__pinned_pool_base(const ckptio__pinned_pool *pool);
uint64_t ckptio__pinned_pool_bytes(const ckptio__pinned_pool *pool);

/* The size of its pieces: one registration each, so a copy into the pool must not cross from one into the next. */
uint64_t ckptio__pinned_pool_piece(const ckptio__pinned_pool *pool);

/* Bytes from the base that are ready (faulted in and, with ops, pinned). */
uint64_t ckptio__pinned_pool_ready(const ckptio__pinned_pool *pool);

/* Blocks until the first `bytes` are ready. If the background thread failed
 * (the driver refused to pin, ...) before getting there, fails with its
 * status and message, every time. */
ckptio_status ckptio__pinned_pool_wait(ckptio__pinned_pool *pool, uint64_t bytes);

/* Stops the thread, unpins every pinned piece (the copies into the pool
 * must have completed: unpinning synchronises the device) and releases the
 * memory. Accepts NULL. */
void ckptio__pinned_pool_destroy(ckptio__pinned_pool *pool);

#endif /* CKPTIO_GPU_PINNED_POOL_H */
