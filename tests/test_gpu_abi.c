/*
 * test_gpu_abi.c - the driver constants src/gpu/cuda_shim.h declares by hand
 * equal those of the real cuda.h, when a CUDA toolkit is installed here
 * (skipped otherwise: ckptio itself never needs the header).
 */
#include "helpers.h"

#include <stddef.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(</usr/local/cuda/include/cuda.h>)
#include </usr/local/cuda/include/cuda.h>
#define HAVE_CUDA_H 1
#endif
#endif

/* Same layout as in cuda_shim.h (that header cannot be included together
 * with the real cuda.h: both declare the driver types). */
typedef struct abi_value {
    const char *name;
    long long value;
} abi_value;
extern const abi_value ckptio__cuda_abi_values[];

int main(void) {
#ifndef HAVE_CUDA_H
    t_skip("no /usr/local/cuda/include/cuda.h to compare against");
#else
    static const abi_value real[] = {
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
    };
    size_t checked = 0;
    for (const abi_value *v = ckptio__cuda_abi_values; v->name; v++) {
        bool found = false;
        for (size_t i = 0; i < sizeof real / sizeof real[0]; i++) {
            if (strcmp(real[i].name, v->name) != 0) continue;
            found = true;
            T_ASSERT_MSG(real[i].value == v->value, "%s: shim has %lld, cuda.h has %lld", v->name, v->value,
                         real[i].value);
        }
        T_ASSERT_MSG(found, "%s is not compared", v->name);
        checked++;
    }
    T_ASSERT(checked == sizeof real / sizeof real[0]);
    /* The versioned entry points cuda_shim.c resolves are the ones cuda.h
     * maps the plain names to. */
#define XSTR_(x) #x
#define XSTR(x) XSTR_(x)
    static const char *const pairs[][2] = {
        {XSTR(cuMemGetInfo), "cuMemGetInfo_v2"},           {XSTR(cuMemAlloc), "cuMemAlloc_v2"},
        {XSTR(cuMemFree), "cuMemFree_v2"},                 {XSTR(cuMemGetAddressRange), "cuMemGetAddressRange_v2"},
        {XSTR(cuMemHostGetDevicePointer), "cuMemHostGetDevicePointer_v2"},
        {XSTR(cuMemcpyHtoDAsync), "cuMemcpyHtoDAsync_v2"}, {XSTR(cuMemcpyDtoHAsync), "cuMemcpyDtoHAsync_v2"},
        {XSTR(cuMemcpyHtoD), "cuMemcpyHtoD_v2"},           {XSTR(cuMemcpyDtoH), "cuMemcpyDtoH_v2"},
        {XSTR(cuMemsetD8), "cuMemsetD8_v2"},               {XSTR(cuCtxPushCurrent), "cuCtxPushCurrent_v2"},
        {XSTR(cuCtxPopCurrent), "cuCtxPopCurrent_v2"},     {XSTR(cuStreamDestroy), "cuStreamDestroy_v2"},
        {XSTR(cuEventDestroy), "cuEventDestroy_v2"},
        {XSTR(cuDevicePrimaryCtxRelease), "cuDevicePrimaryCtxRelease_v2"},
        {XSTR(cuStreamWaitValue32), "cuStreamWaitValue32_v2"},
        {XSTR(cuMemRetainAllocationHandle), "cuMemRetainAllocationHandle"},
        {XSTR(cuMemRelease), "cuMemRelease"},
        {XSTR(cuMemcpy2DAsync), "cuMemcpy2DAsync_v2"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        T_ASSERT_MSG(strcmp(pairs[i][0], pairs[i][1]) == 0, "cuda.h maps to %s, the shim resolves %s", pairs[i][0],
                     pairs[i][1]);
    printf("ok %zu driver ABI values match cuda.h (CUDA_VERSION %d)\n", checked, CUDA_VERSION);
    return T_EXIT_PASS;
#endif
}
