/*
 * gpu_internal.h - what the GPU layer offers the layers above it (format,
 * ckpt) and its own device provider (gpu_engine.c).
 *
 * The engine reaches these only through the ckptio__device_provider table
 * that gpu_engine.c fills in; everything CUDA stays behind this header.
 */
#ifndef CKPTIO_GPU_INTERNAL_H
#define CKPTIO_GPU_INTERNAL_H

#include "common_internal.h"
#include "engine_internal.h"

/* Moves the given extents (all with mem_kind CKPTIO_MEM_CUDA) between their
 * files and GPU memory, in direction `dir`, blocking until done. Called by
 * ckptio_engine_execute() on the caller's thread, through the device
 * provider (gpu_engine.c). */
ckptio_status ckptio__gpu_execute(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *extents,
                                  size_t count);

/* The same with a write-plan observer (NULL: none); see
 * ckptio__plan_set_observer() for the contract. obs->index maps the
 * positions in `extents` to the plan's extent numbers. */
ckptio_status ckptio__gpu_execute_observed(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *extents,
                                           size_t count, const ckptio__observer *obs);

/* Resolves what kind of memory `ptr` is: CKPTIO_MEM_CUDA, CKPTIO_MEM_PINNED
 * or CKPTIO_MEM_HOST (also when no CUDA driver is present). */
ckptio_mem_kind ckptio__gpu_classify(const void *ptr);

/* Free and total memory of a device (cuMemGetInfo); what ckptio_gpu_check_free() compares. */
ckptio_status ckptio__gpu_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);

#endif /* CKPTIO_GPU_INTERNAL_H */
