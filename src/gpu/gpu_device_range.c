/*
 * gpu_device_range.c - the device memory of a GPU transfer's extents,
 * checked before any byte moves (gpu_device_range.h): an extent that runs
 * past the memory mapped for it fails here, naming it, rather than in a
 * copy the driver may or may not refuse.
 */
#include "gpu_device_range.h"

#include "common_internal.h"
#include "io_internal.h"

#include <stdio.h>

/* The device memory from ptr's allocation on that stays mapped without a gap, up to `want` bytes past ptr:
 * cuMemGetAddressRange reports one physical allocation, and memory reserved once and mapped piece by piece
 * (cuMemAddressReserve + cuMemMap: torch's expandable_segments maps 20 MiB pieces) holds tensors that span
 * several. The walk goes on while the next piece is mapped too and starts where this one ends; cudaMalloc
 * allocations that happen to lie back to back stay apart, so an extent running out of one is still refused. */
static ckptio_status device_span(const ckptio__gpu_ops *ops, const void *ptr, uint64_t want, uintptr_t *base,
                                 uint64_t *size, ckptio__gpu_alloc *first) {
    CKPTIO_FORWARD(ops->mem_range(ptr, base, size));
    uintptr_t end = *base + *size;
    *first = (ckptio__gpu_alloc){.base = *base, .end = end};
    const uintptr_t need = (uintptr_t)ptr + want;
    if (end < need && ops->mem_mapped(ptr)) {
        while (end < need) {
            uintptr_t next = 0;
            uint64_t len = 0;
            /* A failure here is not reported: past the mapped memory, the caller's range error says more. */
            if (ops->mem_range((const void *)end, &next, &len) != CKPTIO_OK || next != end || len == 0 ||
                !ops->mem_mapped((const void *)end))
                break;
            end += len;
        }
    }
    *size = end - *base;
    return CKPTIO_OK;
}

/* Checks that extent `idx` lies in device memory it may use; *alloc is the
 * allocation its first byte is in, *span_end where the memory mapped from
 * there without a gap ends. */
static ckptio_status check_device_range(const ckptio__gpu_ops *ops, const ckptio_extent *e, size_t idx,
                                        ckptio__gpu_alloc *alloc, uintptr_t *span_end) {
    uintptr_t base = 0;
    uint64_t size = 0;
    char subject[64];
    snprintf(subject, sizeof subject, "extent %zu", idx);
    const ckptio__err_ctx ctx = {.operation = "check device buffer", .path = ckptio_file_path(e->file),
                                 .file_offset = (int64_t)e->file_offset, .subject = subject};
    ckptio_status st = device_span(ops, e->memory, e->length, &base, &size, alloc);
    if (st != CKPTIO_OK) return ckptio__fail_again(st, __FILE__, __LINE__, ctx);
    *span_end = base + size;
    if ((uintptr_t)e->memory - base > size || e->length > size - ((uintptr_t)e->memory - base))
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &ctx,
                               "device buffer %p + %llu bytes runs past the end of its allocation (%llu bytes at "
                               "0x%llx)", e->memory, (unsigned long long)e->length, (unsigned long long)size,
                               (unsigned long long)base);
    return CKPTIO_OK;
}

ckptio_status ckptio__gpu_device_ranges(const ckptio__gpu_ops *ops, const ckptio_extent *extents, size_t count,
                                        ckptio__gpu_alloc *alloc) {
    /* Once per allocation, not once per extent: a column slice has one
     * extent per row, all in one tensor (704k rows for a 14 GB model's
     * matrices, each lookup several driver calls). */
    ckptio__gpu_alloc last = {0};
    uintptr_t last_span_end = 0;
    for (size_t i = 0; i < count; i++) {
        if (!extents[i].length) continue;
        const uintptr_t m = (uintptr_t)extents[i].memory;
        if (m >= last.base && m < last.end && extents[i].length <= last_span_end - m) {
            alloc[i] = last; /* inside what the last check found mapped */
            continue;
        }
        CKPTIO_FORWARD(check_device_range(ops, &extents[i], i, &alloc[i], &last_span_end));
        last = alloc[i];
    }
    return CKPTIO_OK;
}
