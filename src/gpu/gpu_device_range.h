/*
 * gpu_device_range.h - before a GPU transfer moves a byte, every extent's
 * device memory is checked to lie in memory the driver mapped for it, and
 * the allocation each extent starts in is kept for the pipeline, whose
 * pitched copies must not leave one (gpu_pipeline.c).
 */
#ifndef CKPTIO_GPU_DEVICE_RANGE_H
#define CKPTIO_GPU_DEVICE_RANGE_H

#include "gpu_ops.h"

#include <stddef.h>
#include <stdint.h>

/* A device allocation, as cuMemGetAddressRange reports it. */
typedef struct ckptio__gpu_alloc {
    uintptr_t base, end;
} ckptio__gpu_alloc;

/* Checks that each of the `count` extents lies in device memory mapped
 * without a gap from its first byte to its last (memory mapped piece by
 * piece, as torch's expandable segments do, counts as one range; cudaMalloc
 * allocations that happen to touch do not), and sets alloc[i] to the
 * allocation extent i starts in (empty extents: left as they are). The
 * driver is asked once per allocation, not once per extent. Fails with
 * CKPTIO_E_RANGE naming the extent, its file and offset, or with the
 * driver's error. */
ckptio_status ckptio__gpu_device_ranges(const ckptio__gpu_ops *ops, const ckptio_extent *extents, size_t count,
                                        ckptio__gpu_alloc *alloc);

#endif
