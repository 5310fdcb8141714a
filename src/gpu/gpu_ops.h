/*
 * gpu_ops.h - the device operations the GPU layer is built on.
 *
 * The staging pipeline and the GDS file API never call the CUDA driver
 * directly: they go through this table. The real implementation
 * (gpu_cuda_ops.c) forwards to the driver shim; the test suite's simulated
 * one (tests/doubles/gpu_sim.c, not part of the shipped library) uses host
 * memory and one thread per stream, so that the
 * pipeline's scheduling, ordering and error paths are tested on machines
 * without a GPU. Streams and events are opaque handles (CUstream/CUevent
 * for the real device).
 *
 * Every function that returns a status has set the thread's error record on
 * failure (CKPTIO_E_CUDA / CKPTIO_E_DEVICE_OOM with the driver's error name).
 * Functions taking a device run on the calling thread with that device's
 * context made current by ctx_enter() (the real device needs it).
 */
#ifndef CKPTIO_GPU_OPS_H
#define CKPTIO_GPU_OPS_H

#include "common_internal.h"

typedef struct ckptio__gpu_ops {
    /* "cuda", or what an installed table stands in for ("simulated"): messages
     * say "the <name> device". */
    const char *name;
    /* What kind of memory ptr is and, for device memory, its device
     * ordinal (-1 otherwise). Never fails: unknown pointers are HOST. */
    ckptio_mem_kind (*classify)(const void *ptr, int *device);
    /* Base and size of the device allocation holding ptr. */
    ckptio_status (*mem_range)(const void *ptr, uintptr_t *base, uint64_t *size);
    /* Whether ptr lies in a piece mapped with cuMemMap into a reserved range,
     * where pieces of one reservation lie back to back (torch's
     * expandable_segments); false for cudaMalloc memory and on any failure. */
    bool (*mem_mapped)(const void *ptr);
    ckptio_status (*mem_info)(int device, uint64_t *free_bytes, uint64_t *total_bytes);
    /* Makes the primary context of `device` current on this thread (pushed)
     * and pops it again. */
    ckptio_status (*ctx_enter)(int device);
    void (*ctx_leave)(int device);
    /* Page-locked host memory, usable from every context and mapped for
     * the device (stream_wait_word needs that). `huge`: back it with
     * transparent huge pages where the kernel gives them (the default
     * while free 2 MiB blocks allow: ckptio__gpu_huge_slots,
     * gpu_pipeline.h). */
    ckptio_status (*pinned_alloc)(size_t bytes, bool huge, void **out);
    void (*pinned_free)(void *ptr);
    /* Page-locks host memory the caller made and filled (a staging slot in
     * its engine's reserved range, gpu_slot_range.h), for every context and
     * mapped for the device, like pinned_alloc's. CKPTIO_E_UNSUPPORTED (no
     * error set) when this driver cannot register host memory: the caller
     * then uses pinned_alloc. slot_unpin undoes it; the memory stays the
     * caller's. */
    ckptio_status (*slot_pin)(void *addr, size_t bytes);
    void (*slot_unpin)(void *addr);
    ckptio_status (*stream_create)(void **out);
    void (*stream_destroy)(void *stream);
    ckptio_status (*stream_sync)(void *stream);
    ckptio_status (*event_create)(void **out);
    void (*event_destroy)(void *event);
    ckptio_status (*event_record)(void *event, void *stream);
    /* Makes `stream` wait, on the device (the caller does not block), until
     * the work captured by the last record of `event` completed
     * (cuStreamWaitEvent); work queued on `stream` afterwards runs after it. */
    ckptio_status (*stream_wait_event)(void *stream, void *event);
    /* Blocks until the work captured by the last record completed; an
     * asynchronous failure of that work is reported here. */
    ckptio_status (*event_sync)(void *event);
    /* Whether the work captured by the last record completed, without
     * waiting (true also when it failed: event_sync reports that). */
    bool (*event_done)(void *event);
    ckptio_status (*h2d_async)(void *dst_device, const void *src_host, size_t bytes, void *stream);
    ckptio_status (*d2h_async)(void *dst_host, const void *src_device, size_t bytes, void *stream);
    /* `rows` rows of `width` bytes in one queued copy (cuMemcpy2DAsync): row
     * i starts at src + i * src_pitch and lands at dst + i * dst_pitch (both
     * pitches >= width). A column slice of a row-major tensor is one such
     * copy per staging window instead of one copy per row. Required: a
     * driver without cuMemcpy2DAsync gets one copy per row from the CUDA
     * ops themselves (gpu_cuda_ops.c). */
    ckptio_status (*h2d_2d_async)(void *dst_device, size_t dst_pitch, const void *src_host, size_t src_pitch,
                                  size_t width, size_t rows, void *stream);
    ckptio_status (*d2h_2d_async)(void *dst_host, size_t dst_pitch, const void *src_device, size_t src_pitch,
                                  size_t width, size_t rows, void *stream);
    /* Makes `stream` wait until *word >= value (word in pinned memory from
     * pinned_alloc, written by a host thread). CKPTIO_E_UNSUPPORTED when
     * the driver cannot (callers then fall back to synchronising). */
    ckptio_status (*stream_wait_word)(void *stream, volatile uint32_t *word, uint32_t value);
} ckptio__gpu_ops;

/* The real driver's operations (they fail with CKPTIO_E_NO_CUDA when the
 * driver is missing; use ckptio__gpu_ops_get() to find out up front). */
const ckptio__gpu_ops *ckptio__gpu_cuda_ops(void);

/* The operations GPU transfers use: the table installed with
 * ckptio__gpu_set_ops(), else the real driver. Fails with CKPTIO_E_NO_CUDA
 * (and a message naming what is missing) when there is no driver. */
ckptio_status ckptio__gpu_ops_get(const ckptio__gpu_ops **out);

/* Like ckptio__gpu_ops_get() but quiet: NULL (no error recorded) without
 * a driver. */
const ckptio__gpu_ops *ckptio__gpu_ops_try(void);

/* Test hook: route all GPU work of this process through `ops` (NULL restores
 * the real driver). Not thread-safe with transfers in flight. */
void ckptio__gpu_set_ops(const ckptio__gpu_ops *ops);

#endif /* CKPTIO_GPU_OPS_H */
