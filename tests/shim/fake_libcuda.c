/*
 * fake_libcuda.c - a stand-in for libcuda.so.1 (loaded through
 * CKPTIO_CUDA_LIBRARY) that lets CI run the real CUDA operations table's
 * host-side logic: how pinned staging is made and released (registered
 * anonymous memory, or cuMemHostAlloc where registration is refused).
 *
 * It has one device whose "device memory" is host memory, runs every copy
 * at once, and counts the pinning calls; tests read the counters and set
 * what cuMemHostRegister_v2 answers through the fake_cuda_* symbols below
 * (dlsym on the same library). Only what tests/test_cuda_pinned.c needs
 * behaves: the other entry points exist because ckptio resolves them.
 */
/* The entry points are the driver's, resolved with dlsym: their prototypes
 * are cuda.h's, which ckptio does not need. */
#pragma GCC diagnostic ignored "-Wmissing-prototypes"

#include "cuda_shim.h" /* the driver's types as ckptio declares them (test_gpu_abi checks them against cuda.h) */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_READY = 600, NOT_PERMITTED = 800, NOT_SUPPORTED = 801 };

/* ---- what tests read and set ---------------------------------------------- */
int fake_cuda_register_result;        /* what cuMemHostRegister_v2 returns (0: registers) */
int fake_cuda_register_calls, fake_cuda_unregister_calls;
int fake_cuda_hostalloc_calls, fake_cuda_freehost_calls;
void *fake_cuda_last_registered;
size_t fake_cuda_last_registered_bytes;
unsigned fake_cuda_last_register_flags;
void *fake_cuda_last_unregistered;

CUresult cuInit(unsigned flags) { return flags ? INVALID_VALUE : OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }

static const char *name_of(CUresult r) {
    switch (r) {
    case OK: return "CUDA_SUCCESS";
    case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case NOT_READY: return "CUDA_ERROR_NOT_READY";
    case NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    case NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return NULL;
    }
}
CUresult cuGetErrorName(CUresult r, const char **s) { return (*s = name_of(r)) ? OK : INVALID_VALUE; }
CUresult cuGetErrorString(CUresult r, const char **s) { return (*s = name_of(r)) ? OK : INVALID_VALUE; }

CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return ordinal == 0 ? OK : INVALID_VALUE; }
CUresult cuDeviceGetAttribute(int *v, int attribute, int d) { (void)attribute; (void)d; *v = 1; return OK; }
CUresult cuDeviceGetName(char *name, int len, int d) {
    (void)d;
    strncpy(name, "fake CUDA device", (size_t)len);
    if (len > 0) name[len - 1] = 0;
    return OK;
}
static int context;
CUresult cuDevicePrimaryCtxRetain(void **ctx, int d) { (void)d; *ctx = &context; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; return OK; }
CUresult cuCtxPushCurrent_v2(void *ctx) { (void)ctx; return OK; }
CUresult cuCtxPopCurrent_v2(void **ctx) { if (ctx) *ctx = &context; return OK; }
/* No pointer is device memory: everything classifies as host. */
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p) {
    (void)data; (void)attribute; (void)p;
    return INVALID_VALUE;
}
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) { *free_bytes = *total = (size_t)1 << 30; return OK; }
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    (void)base; (void)size; (void)p;
    return INVALID_VALUE;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    void *m = malloc(bytes ? bytes : 1);
    *p = (CUdeviceptr)(uintptr_t)m;
    return m ? OK : OUT_OF_MEMORY;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return OK; }

CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned flags) {
    (void)flags;
    fake_cuda_hostalloc_calls++;
    return posix_memalign(pp, 4096, bytes ? bytes : 1) == 0 ? OK : OUT_OF_MEMORY;
}
CUresult cuMemFreeHost(void *p) { fake_cuda_freehost_calls++; free(p); return OK; }
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    (void)flags;
    *d = (CUdeviceptr)(uintptr_t)p;
    return OK;
}
CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags) {
    fake_cuda_register_calls++;
    if (fake_cuda_register_result != OK) return fake_cuda_register_result;
    /* The driver faults every page in: touch them as it would. */
    volatile unsigned char *b = p;
    for (size_t i = 0; i < bytes; i += 4096) (void)b[i];
    fake_cuda_last_registered = p;
    fake_cuda_last_registered_bytes = bytes;
    fake_cuda_last_register_flags = flags;
    return OK;
}
CUresult cuMemHostUnregister(void *p) {
    fake_cuda_unregister_calls++;
    fake_cuda_last_unregistered = p;
    return OK;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return OK; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (const void *)(uintptr_t)s, n); return OK; }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
    (void)st;
    return cuMemcpyHtoD_v2(d, s, n);
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
    (void)st;
    return cuMemcpyDtoH_v2(d, s, n);
}
int fake_cuda_copy2d_calls;

#ifndef FAKE_CUDA_NO_COPY2D /* built without it: a driver older than pitched copies */
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, void *st) {
    (void)st;
    if (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes || c->srcXInBytes || c->srcY ||
        c->dstXInBytes || c->dstY || c->srcArray || c->dstArray)
        return INVALID_VALUE;
    const char *src = c->srcMemoryType == CU_MEMORYTYPE_HOST     ? c->srcHost
                      : c->srcMemoryType == CU_MEMORYTYPE_DEVICE ? (const char *)(uintptr_t)c->srcDevice
                                                                  : NULL;
    char *dst = c->dstMemoryType == CU_MEMORYTYPE_HOST     ? c->dstHost
                : c->dstMemoryType == CU_MEMORYTYPE_DEVICE ? (char *)(uintptr_t)c->dstDevice
                                                            : NULL;
    if (!src || !dst) return INVALID_VALUE;
    fake_cuda_copy2d_calls++;
    for (size_t i = 0; i < c->Height; i++) memcpy(dst + i * c->dstPitch, src + i * c->srcPitch, c->WidthInBytes);
    return OK;
}
#endif
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset((void *)(uintptr_t)d, v, n); return OK; }

static int handle; /* streams and events: every copy is already done */
CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = &handle; return OK; }
CUresult cuStreamDestroy_v2(void *s) { (void)s; return OK; }
CUresult cuStreamSynchronize(void *s) { (void)s; return OK; }
int fake_cuda_stream_waits;           /* cuStreamWaitEvent calls */
void *fake_cuda_last_waiting_stream;  /* the stream of the last one */
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    (void)e;
    (void)flags;
    fake_cuda_stream_waits++;
    fake_cuda_last_waiting_stream = s;
    return OK;
}
CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = &handle; return OK; }
CUresult cuEventDestroy_v2(void *e) { (void)e; return OK; }
CUresult cuEventRecord(void *e, void *s) { (void)e; (void)s; return OK; }
CUresult cuEventQuery(void *e) { (void)e; return OK; }
CUresult cuEventSynchronize(void *e) { (void)e; return OK; }
