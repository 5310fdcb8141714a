/*
 * cuda_shim.c - opens libcuda.so.1 once and resolves the driver entry points
 * ckptio uses, so that neither building nor running ckptio needs the CUDA
 * toolkit (see cuda_shim.h for where the declarations come from).
 */
#include "cuda_shim.h"
#include "engine_internal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ckptio__cuda_abi_value ckptio__cuda_abi_values[] = {
    {"CUDA_SUCCESS", (long long)CUDA_SUCCESS},
    {"CUDA_ERROR_INVALID_VALUE", (long long)CUDA_ERROR_INVALID_VALUE},
    {"CUDA_ERROR_OUT_OF_MEMORY", (long long)CUDA_ERROR_OUT_OF_MEMORY},
    {"CUDA_ERROR_NOT_INITIALIZED", (long long)CUDA_ERROR_NOT_INITIALIZED},
    {"CUDA_ERROR_DEINITIALIZED", (long long)CUDA_ERROR_DEINITIALIZED},
    {"CUDA_ERROR_NO_DEVICE", (long long)CUDA_ERROR_NO_DEVICE},
    {"CUDA_ERROR_INVALID_CONTEXT", (long long)CUDA_ERROR_INVALID_CONTEXT},
    {"CUDA_ERROR_INVALID_HANDLE", (long long)CUDA_ERROR_INVALID_HANDLE},
    {"CUDA_ERROR_NOT_READY", (long long)CUDA_ERROR_NOT_READY},
    {"CUDA_ERROR_ILLEGAL_ADDRESS", (long long)CUDA_ERROR_ILLEGAL_ADDRESS},
    {"CUDA_ERROR_NOT_PERMITTED", (long long)CUDA_ERROR_NOT_PERMITTED},
    {"CUDA_ERROR_NOT_SUPPORTED", (long long)CUDA_ERROR_NOT_SUPPORTED},
    {"CUDA_ERROR_UNKNOWN", (long long)CUDA_ERROR_UNKNOWN},
    {"CU_POINTER_ATTRIBUTE_CONTEXT", (long long)CU_POINTER_ATTRIBUTE_CONTEXT},
    {"CU_POINTER_ATTRIBUTE_MEMORY_TYPE", (long long)CU_POINTER_ATTRIBUTE_MEMORY_TYPE},
    {"CU_POINTER_ATTRIBUTE_DEVICE_POINTER", (long long)CU_POINTER_ATTRIBUTE_DEVICE_POINTER},
    {"CU_POINTER_ATTRIBUTE_IS_MANAGED", (long long)CU_POINTER_ATTRIBUTE_IS_MANAGED},
    {"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL", (long long)CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL},
    {"CU_MEMORYTYPE_HOST", (long long)CU_MEMORYTYPE_HOST},
    {"CU_MEMORYTYPE_DEVICE", (long long)CU_MEMORYTYPE_DEVICE},
    {"CU_MEMORYTYPE_ARRAY", (long long)CU_MEMORYTYPE_ARRAY},
    {"CU_MEMORYTYPE_UNIFIED", (long long)CU_MEMORYTYPE_UNIFIED},
    {"CU_MEMHOSTALLOC_PORTABLE", (long long)CU_MEMHOSTALLOC_PORTABLE},
    {"CU_MEMHOSTALLOC_DEVICEMAP", (long long)CU_MEMHOSTALLOC_DEVICEMAP},
    {"CU_STREAM_NON_BLOCKING", (long long)CU_STREAM_NON_BLOCKING},
    {"CU_EVENT_BLOCKING_SYNC", (long long)CU_EVENT_BLOCKING_SYNC},
    {"CU_EVENT_DISABLE_TIMING", (long long)CU_EVENT_DISABLE_TIMING},
    {"CU_STREAM_WAIT_VALUE_GEQ", (long long)CU_STREAM_WAIT_VALUE_GEQ},
    {"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", (long long)CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
    {"CU_DEVICE_ATTRIBUTE_PCI_BUS_ID", (long long)CU_DEVICE_ATTRIBUTE_PCI_BUS_ID},
    {"CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING", (long long)CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING},
    {"sizeof(CUdeviceptr)", (long long)sizeof(CUdeviceptr)},
    {"sizeof(CUDA_MEMCPY2D)", (long long)sizeof(CUDA_MEMCPY2D)},
    {"offsetof(CUDA_MEMCPY2D, srcPitch)", (long long)offsetof(CUDA_MEMCPY2D, srcPitch)},
    {"offsetof(CUDA_MEMCPY2D, dstMemoryType)", (long long)offsetof(CUDA_MEMCPY2D, dstMemoryType)},
    {"offsetof(CUDA_MEMCPY2D, dstDevice)", (long long)offsetof(CUDA_MEMCPY2D, dstDevice)},
    {"offsetof(CUDA_MEMCPY2D, WidthInBytes)", (long long)offsetof(CUDA_MEMCPY2D, WidthInBytes)},
    {"offsetof(CUDA_MEMCPY2D, Height)", (long long)offsetof(CUDA_MEMCPY2D, Height)},
    {NULL, 0},
};

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static ckptio__cuda_api api;
static bool api_ok;
static unsigned api_generation; /* ckptio__fork_generation() of cuInit */
static char load_error[512];

/* Resolves `name` into *slot; required symbols missing make the load fail. */
static bool resolve(void *lib, const char *name, void *slot, bool required) {
    void *sym = dlsym(lib, name);
    memcpy(slot, &sym, sizeof sym); /* object -> function pointer without a cast warning */
    if (!sym && required) {
        snprintf(load_error, sizeof load_error, "the CUDA driver library lacks the symbol %s (driver too old?)", name);
        return false;
    }
    return true;
}

static void load_driver(void) {
    const char *name = getenv(CKPTIO__ENV_CUDA_LIBRARY); /* process-wide, read once: settings.c */
    if (!name || !name[0]) name = "libcuda.so.1";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(load_error, sizeof load_error,
                 "no CUDA driver: dlopen(\"%s\") failed: %s (install the NVIDIA driver or run on a GPU machine)",
                 name, why ? why : "unknown reason");
        return;
    }
#define REQ(field, sym) \
    if (!resolve(lib, sym, &api.field, true)) goto fail;
#define OPT(field, sym) resolve(lib, sym, &api.field, false);
    REQ(cuInit, "cuInit")
    REQ(cuDriverGetVersion, "cuDriverGetVersion")
    REQ(cuGetErrorName, "cuGetErrorName")
    REQ(cuGetErrorString, "cuGetErrorString")
    REQ(cuDeviceGetCount, "cuDeviceGetCount")
    REQ(cuDeviceGet, "cuDeviceGet")
    REQ(cuDeviceGetAttribute, "cuDeviceGetAttribute")
    REQ(cuDeviceGetName, "cuDeviceGetName")
    REQ(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
    REQ(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")
    REQ(cuCtxPushCurrent, "cuCtxPushCurrent_v2")
    REQ(cuCtxPopCurrent, "cuCtxPopCurrent_v2")
    REQ(cuPointerGetAttribute, "cuPointerGetAttribute")
    REQ(cuMemGetInfo, "cuMemGetInfo_v2")
    REQ(cuMemGetAddressRange, "cuMemGetAddressRange_v2")
    REQ(cuMemAlloc, "cuMemAlloc_v2")
    REQ(cuMemFree, "cuMemFree_v2")
    REQ(cuMemHostAlloc, "cuMemHostAlloc")
    REQ(cuMemFreeHost, "cuMemFreeHost")
    REQ(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2")
    REQ(cuMemcpyHtoD, "cuMemcpyHtoD_v2")
    REQ(cuMemcpyDtoH, "cuMemcpyDtoH_v2")
    REQ(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
    REQ(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
    REQ(cuMemsetD8, "cuMemsetD8_v2")
    REQ(cuStreamCreate, "cuStreamCreate")
    REQ(cuStreamDestroy, "cuStreamDestroy_v2")
    REQ(cuStreamSynchronize, "cuStreamSynchronize")
    REQ(cuStreamWaitEvent, "cuStreamWaitEvent")
    REQ(cuEventCreate, "cuEventCreate")
    REQ(cuEventDestroy, "cuEventDestroy_v2")
    REQ(cuEventRecord, "cuEventRecord")
    REQ(cuEventQuery, "cuEventQuery")
    REQ(cuEventSynchronize, "cuEventSynchronize")
    OPT(cuStreamWaitValue32, "cuStreamWaitValue32_v2")
    OPT(cuLaunchHostFunc, "cuLaunchHostFunc")
    OPT(cuModuleLoadData, "cuModuleLoadData")
    OPT(cuModuleGetFunction, "cuModuleGetFunction")
    OPT(cuModuleUnload, "cuModuleUnload")
    OPT(cuLaunchKernel, "cuLaunchKernel")
    OPT(cuMemHostRegister, "cuMemHostRegister_v2")
    OPT(cuMemHostUnregister, "cuMemHostUnregister")
    OPT(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle")
    OPT(cuMemRelease, "cuMemRelease")
    OPT(cuMemcpy2DAsync, "cuMemcpy2DAsync_v2")
#undef REQ
#undef OPT
    CUresult r = api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        const char *rname = NULL;
        if (api.cuGetErrorName(r, &rname) != CUDA_SUCCESS) rname = NULL;
        snprintf(load_error, sizeof load_error, "the CUDA driver (%s) is present but cuInit failed: %s (%d)%s", name,
                 rname ? rname : "unknown error", r,
                 ckptio__fork_generation() ? "; this process was fork()ed, and a child cannot use CUDA once its "
                                             "parent initialised it: start it with the 'spawn' or 'forkserver' method"
                                           : "");
        goto fail;
    }
    if (api.cuDriverGetVersion(&api.driver_version) != CUDA_SUCCESS) api.driver_version = 0;
    api_generation = ckptio__fork_generation();
    api_ok = true;
    return; /* the library stays loaded for the life of the process */
fail:
    memset(&api, 0, sizeof api);
    dlclose(lib);
}

ckptio_status ckptio__cuda_refuse_forked(const char *what) {
    return CKPTIO_FAIL_CTX(CKPTIO_E_NO_CUDA, &((ckptio__err_ctx){.operation = "cuda init", .file_offset = -1}),
                           "%s was initialised before this process was fork()ed, and a forked child cannot use "
                           "it: load to the CPU in the child, or start the child with the 'spawn' or 'forkserver' "
                           "method (multiprocessing.set_start_method('spawn'))",
                           what);
}

/* In a fork()ed child of a process that initialised the driver, nothing of
 * the driver may be called: not even queries (ckptio__cuda_try() is NULL,
 * so memory classifies as host, as without a driver). */
static bool usable(void) { return api_ok && !ckptio__forked_since(api_generation); }

ckptio_status ckptio__cuda_load(const ckptio__cuda_api **out) {
    pthread_once(&load_once, load_driver);
    if (api_ok && !usable()) {
        *out = NULL;
        return ckptio__cuda_refuse_forked("CUDA");
    }
    if (!api_ok) {
        *out = NULL;
        return CKPTIO_FAIL_CTX(CKPTIO_E_NO_CUDA, &((ckptio__err_ctx){.operation = "cuda init", .file_offset = -1}),
                               "%s", load_error);
    }
    *out = &api;
    return CKPTIO_OK;
}

const ckptio__cuda_api *ckptio__cuda_try(void) {
    pthread_once(&load_once, load_driver);
    return usable() ? &api : NULL;
}

const char *ckptio__cuda_error_name(CUresult result) {
    static _Thread_local char buf[32];
    const char *name = NULL;
    if (api_ok && api.cuGetErrorName(result, &name) == CUDA_SUCCESS && name) return name;
    snprintf(buf, sizeof buf, "CUresult %d", result);
    return buf;
}

ckptio_status ckptio__cuda_fail(CUresult result, const char *src_file, int src_line, const ckptio__err_ctx *ctx,
                                const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    const char *desc = NULL;
    if (api_ok && api.cuGetErrorString(result, &desc) != CUDA_SUCCESS) desc = NULL;
    ckptio__err_ctx c = ctx ? *ctx : (ckptio__err_ctx){.file_offset = -1};
    c.cuda_result = result;
    ckptio_status st = result == CUDA_ERROR_OUT_OF_MEMORY ? CKPTIO_E_DEVICE_OOM : CKPTIO_E_CUDA;
    return ckptio__fail(st, src_file, src_line, &c, "%s: %s%s%s", text, ckptio__cuda_error_name(result),
                        desc ? " - " : "", desc ? desc : "");
}

/* ---- NVTX ------------------------------------------------------------------ */

static pthread_once_t nvtx_once = PTHREAD_ONCE_INIT;
static int (*nvtx_push_fn)(const char *);
static int (*nvtx_pop_fn)(void);

static void load_nvtx(void) {
    static const char *const names[] = {"libnvToolsExt.so.1", "libnvToolsExt.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) continue;
        void *push = dlsym(lib, "nvtxRangePushA");
        void *pop = dlsym(lib, "nvtxRangePop");
        if (push && pop) {
            memcpy(&nvtx_push_fn, &push, sizeof push);
            memcpy(&nvtx_pop_fn, &pop, sizeof pop);
            return;
        }
        dlclose(lib);
    }
}

void ckptio__nvtx_push(bool on, const char *name) {
    if (!on) return;
    pthread_once(&nvtx_once, load_nvtx);
    if (nvtx_push_fn) nvtx_push_fn(name);
}

void ckptio__nvtx_pop(bool on) {
    if (!on) return;
    pthread_once(&nvtx_once, load_nvtx);
    if (nvtx_pop_fn) nvtx_pop_fn();
}
