/*
 * gpu_mapped.h - reading a file window into GPU memory with no CPU copy:
 * the window's page-cache pages are mapped read-only, page-locked for the
 * device (gpu_ops host_register) and copied by DMA straight to their
 * destinations.
 *
 * Why: a staged read of cached data costs a CPU copy (page cache -> pinned
 * slot, one memcpy per byte on the worker threads) before the device copy;
 * from the page cache or tmpfs that copy, not the PCIe link, bounds the
 * load. Registering the pages instead costs a page-table walk per page,
 * which the pipeline's workers overlap with the copies of other windows.
 *
 * Only for reads, and only where the pages are already in memory: a file on
 * tmpfs or ramfs (always), or a window the page cache holds all but a
 * sliver of (cachestat/mincore, src/io/page_cache.c). Registration faults
 * any missing page in synchronously; for cold data O_DIRECT into staging
 * is faster, so cold windows stay staged. The CPU never touches a mapping:
 * a page past the end of a file that shrank makes the registration fail
 * (EFAULT inside the driver, never SIGBUS), and the window is then read
 * through the staging slot, whose read reports the truncation as an error.
 */
#ifndef CKPTIO_GPU_MAPPED_H
#define CKPTIO_GPU_MAPPED_H

#include "gpu_ops.h"
#include "io_internal.h"

/* How a run of a file may be read. */
typedef enum ckptio__map_policy {
    CKPTIO__MAP_NEVER = 0,     /* staged: a write, CKPTIO_DIRECT=on, CKPTIO_GPU_PATH=staged, no support */
    CKPTIO__MAP_IF_CACHED = 1, /* per window: mapped when the page cache holds it */
    CKPTIO__MAP_ALWAYS = 2     /* tmpfs/ramfs: the file's pages are memory */
} ckptio__map_policy;

/* The policy for reading `file` into device memory under the engine's
 * settings (called once per file and transfer). */
ckptio__map_policy ckptio__gpu_map_policy(ckptio_engine *engine, ckptio_direction dir, ckptio_file *file);

/* Whether the page cache holds file range [start, start + len) of `fd`,
 * all but 1/64 of its pages (cachestat/mincore): what "in memory" means for
 * mapped windows (gpu_pipeline.c) and for packed reads (gpu_windows.c). */
bool ckptio__gpu_range_resident(int fd, uint64_t start, uint64_t len);

/* One window's mapping: `addr` maps file bytes [offset, offset + len). */
typedef struct ckptio__gpu_mapping {
    void *addr;
    size_t len;
    uint64_t offset;
} ckptio__gpu_mapping;

/* Maps and registers the pages holding file bytes [start, end) when
 * `policy` allows it for them. false (nothing held, thread error record
 * left as it was on a policy "no", set on a failure) when the window must
 * be staged; *unsupported is set when the device can never register, so
 * the caller stops trying. On true, release with ckptio__gpu_unmap once
 * the copies reading it completed. */
bool ckptio__gpu_map(const ckptio__gpu_ops *ops, int device, ckptio__map_policy policy, ckptio_file *file,
                     uint64_t start, uint64_t end, ckptio__gpu_mapping *out, bool *failed, bool *unsupported);

/* Unregisters and unmaps (no-op for an empty mapping); leaves it empty. */
void ckptio__gpu_unmap(const ckptio__gpu_ops *ops, ckptio__gpu_mapping *m);

#endif /* CKPTIO_GPU_MAPPED_H */
