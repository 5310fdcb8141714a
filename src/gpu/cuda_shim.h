/*
 * cuda_shim.h - the CUDA driver API, loaded at run time.
 *
 * ckptio builds and runs without the CUDA toolkit: the few driver types and
 * constants it needs are declared here and libcuda.so.1 is opened with
 * dlopen() on first use. Without a driver every GPU call fails with
 * CKPTIO_E_NO_CUDA and everything else keeps working.
 *
 * ABI origin: the types, enum values and function signatures below are those
 * of the CUDA driver API's cuda.h (CUDA 12/13, x86_64 and aarch64 Linux).
 * They are part of the driver's stable C ABI: names ending in _v2 are the
 * entry points cuda.h maps the plain names to (e.g. cuMemAlloc ->
 * cuMemAlloc_v2); we resolve those exact symbols. tests/test_gpu_abi.c checks
 * the values against the real cuda.h when one is installed.
 */
#ifndef CKPTIO_CUDA_SHIM_H
#define CKPTIO_CUDA_SHIM_H

#include "common_internal.h"

#include <stddef.h>
#include <stdint.h>

/* ---- driver types (cuda.h) ------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef void (*CUhostFn)(void *user_data);

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
};

/* CUpointer_attribute */
enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
};

/* CUmemorytype */
enum {
    CU_MEMORYTYPE_HOST = 1,
    CU_MEMORYTYPE_DEVICE = 2,
    CU_MEMORYTYPE_ARRAY = 3,
    CU_MEMORYTYPE_UNIFIED = 4
};

/* CUDA_MEMCPY2D (_v2): a pitched copy, rows of WidthInBytes, Height of them.
 * The layout is checked against cuda.h by tests/test_gpu_abi.c. */
typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes, srcY;
    int srcMemoryType; /* CUmemorytype */
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

/* cuMemHostAlloc flags, CUstream_flags, CUevent_flags, CUstreamWaitValue_flags */
#define CU_MEMHOSTALLOC_PORTABLE 0x01u
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02u
#define CU_MEMHOSTREGISTER_PORTABLE 0x01u
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02u
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_BLOCKING_SYNC 0x1u
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_STREAM_WAIT_VALUE_GEQ 0x0u

/* CUdevice_attribute values we read. */
enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41
};

/* The values above by name, for tests/test_gpu_abi.c (NULL-terminated). */
typedef struct ckptio__cuda_abi_value {
    const char *name;
    long long value;
} ckptio__cuda_abi_value;
extern const ckptio__cuda_abi_value ckptio__cuda_abi_values[];

/* ---- the resolved entry points --------------------------------------------- */

/* Function pointers into libcuda.so.1. Required ones are never NULL once
 * ckptio__cuda_load() succeeded; optional ones (marked) may be NULL on old
 * drivers and callers check. */
typedef struct ckptio__cuda_api {
    CUresult (*cuInit)(unsigned flags);
    CUresult (*cuDriverGetVersion)(int *version);
    CUresult (*cuGetErrorName)(CUresult error, const char **name);
    CUresult (*cuGetErrorString)(CUresult error, const char **text);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGet)(CUdevice *device, int ordinal);
    CUresult (*cuDeviceGetAttribute)(int *value, int attribute, CUdevice device);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice device);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice device);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device);           /* _v2 */
    CUresult (*cuCtxPushCurrent)(CUcontext ctx);                       /* _v2 */
    CUresult (*cuCtxPopCurrent)(CUcontext *ctx);                       /* _v2 */
    CUresult (*cuPointerGetAttribute)(void *data, int attribute, CUdeviceptr ptr);
    CUresult (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes); /* _v2 */
    CUresult (*cuMemGetAddressRange)(CUdeviceptr *base, size_t *size, CUdeviceptr ptr); /* _v2 */
    CUresult (*cuMemAlloc)(CUdeviceptr *dptr, size_t bytes);          /* _v2 */
    CUresult (*cuMemFree)(CUdeviceptr dptr);                           /* _v2 */
    CUresult (*cuMemHostAlloc)(void **pp, size_t bytes, unsigned flags);
    CUresult (*cuMemFreeHost)(void *p);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *dptr, void *p, unsigned flags); /* _v2 */
    CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);           /* _v2 */
    CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);                 /* _v2 */
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s); /* _v2 */
    CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s); /* _v2 */
    CUresult (*cuMemsetD8)(CUdeviceptr dst, unsigned char value, size_t count);        /* _v2 */
    CUresult (*cuStreamCreate)(CUstream *stream, unsigned flags);
    CUresult (*cuStreamDestroy)(CUstream stream);                     /* _v2 */
    CUresult (*cuStreamSynchronize)(CUstream stream);
    CUresult (*cuStreamWaitEvent)(CUstream stream, CUevent event, unsigned flags);
    CUresult (*cuEventCreate)(CUevent *event, unsigned flags);
    CUresult (*cuEventDestroy)(CUevent event);                        /* _v2 */
    CUresult (*cuEventRecord)(CUevent event, CUstream stream);
    CUresult (*cuEventQuery)(CUevent event);
    CUresult (*cuEventSynchronize)(CUevent event);
    /* optional */
    CUresult (*cuStreamWaitValue32)(CUstream stream, CUdeviceptr addr, uint32_t value, unsigned flags); /* _v2 */
    CUresult (*cuLaunchHostFunc)(CUstream stream, CUhostFn fn, void *user);
    CUresult (*cuModuleLoadData)(CUmodule *module, const void *image);
    CUresult (*cuModuleGetFunction)(CUfunction *fn, CUmodule module, const char *name);
    CUresult (*cuModuleUnload)(CUmodule module);
    CUresult (*cuMemHostRegister)(void *p, size_t bytes, unsigned flags); /* _v2 */
    CUresult (*cuMemHostUnregister)(void *p);
    /* Succeeds only for memory mapped with cuMemMap (CUmemGenericAllocationHandle is an unsigned long long). */
    CUresult (*cuMemRetainAllocationHandle)(unsigned long long *handle, void *addr);
    CUresult (*cuMemRelease)(unsigned long long handle);
    CUresult (*cuMemcpy2DAsync)(const CUDA_MEMCPY2D *copy, CUstream stream); /* _v2 */
    CUresult (*cuLaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared_bytes, CUstream stream, void **params, void **extra);
    int driver_version;  /* cuDriverGetVersion, e.g. 12040 */
} ckptio__cuda_api;

/* Loads and initialises the driver once per process (thread-safe). Returns
 * CKPTIO_OK and the table, or CKPTIO_E_NO_CUDA with a message saying why
 * (library missing, symbol missing, cuInit failed) - the same message on
 * every call. The library name can be overridden with CKPTIO_CUDA_LIBRARY
 * (read once; for tests and unusual installs). */
ckptio_status ckptio__cuda_load(const ckptio__cuda_api **out);

/* The table if the driver loaded, NULL otherwise (never sets an error). */
const ckptio__cuda_api *ckptio__cuda_try(void);

/* CKPTIO_E_NO_CUDA for a device (`what`: "CUDA", "the simulated device")
 * initialised before this process was fork()ed: a forked child cannot use
 * it (the driver's state belongs to the parent). The message says what to
 * do instead. */
ckptio_status ckptio__cuda_refuse_forked(const char *what);

/* "CUDA_ERROR_OUT_OF_MEMORY" style name of a CUresult ("CUresult N" when the
 * driver does not know it or is not loaded). */
const char *ckptio__cuda_error_name(CUresult result);

/* Records a failed driver call: CKPTIO_E_DEVICE_OOM for out-of-memory,
 * CKPTIO_E_CUDA otherwise; the message ends with the driver's error name and
 * text, and cuda_result is set. */
ckptio_status ckptio__cuda_fail(CUresult result, const char *src_file, int src_line, const ckptio__err_ctx *ctx,
                                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define CKPTIO_CUDA_FAIL(result, ...) ckptio__cuda_fail((result), __FILE__, __LINE__, NULL, __VA_ARGS__)

/* NVTX ranges around I/O phases: with `on` (the engine's CKPTIO_OPT_NVTX),
 * pushes/pops a named range when an NVTX library (libnvToolsExt.so.1) can
 * be loaded; does nothing otherwise. Pass a pop the push's `on`. */
void ckptio__nvtx_push(bool on, const char *name);
void ckptio__nvtx_pop(bool on);

#endif /* CKPTIO_CUDA_SHIM_H */
