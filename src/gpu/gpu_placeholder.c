/*
 * gpu_placeholder.c - TEMPORARY until src/gpu lands: no GPU support.
 * The GPU helper deletes this file when it adds the real implementation.
 */
#include "gpu_internal.h"

ckptio_status ckptio__gpu_execute(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *extents,
                                  size_t count) {
    (void)engine, (void)dir, (void)extents, (void)count;
    return CKPTIO_FAIL(CKPTIO_E_NO_CUDA, "GPU memory transfers are not available in this build");
}

ckptio_mem_kind ckptio__gpu_classify(const void *ptr) {
    (void)ptr;
    return CKPTIO_MEM_HOST;
}
