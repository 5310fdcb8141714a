/*
 * gpu_cuda_ops.c - the device operations table on the real CUDA driver.
 *
 * Contexts: ckptio works inside PyTorch's (or any runtime-API user's)
 * process, so it uses the primary context of the device that owns a
 * pointer, retained once and kept for the life of the process (as the
 * runtime API does), pushed around each use and popped afterwards so the
 * caller's current context is left as it was.
 */
#include "cuda_shim.h"
#include "gpu_ops.h"
#include "gpu_slot_range.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_DEVICES 64

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primary[MAX_DEVICES];

static ckptio_status need_api(const ckptio__cuda_api **out) { return ckptio__cuda_load(out); }

static ckptio_mem_kind cuda_classify(const void *ptr, int *device) {
    *device = -1;
    const ckptio__cuda_api *cu = ckptio__cuda_try();
    if (!cu || !ptr) return CKPTIO_MEM_HOST;
    unsigned memtype = 0;
    /* Unregistered (pageable) host memory makes the driver answer
     * CUDA_ERROR_INVALID_VALUE: that is the HOST answer, not an error. */
    if (cu->cuPointerGetAttribute(&memtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)ptr) !=
        CUDA_SUCCESS)
        return CKPTIO_MEM_HOST;
    if (memtype == CU_MEMORYTYPE_HOST) return CKPTIO_MEM_PINNED;
    if (memtype != CU_MEMORYTYPE_DEVICE && memtype != CU_MEMORYTYPE_UNIFIED) return CKPTIO_MEM_HOST;
    int ordinal = -1;
    if (cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)ptr) !=
        CUDA_SUCCESS)
        ordinal = 0;
    *device = ordinal;
    return CKPTIO_MEM_CUDA;
}

static ckptio_status cuda_ctx_enter(int device);
static void cuda_ctx_leave(int device);

static ckptio_status cuda_mem_range(const void *ptr, uintptr_t *base, uint64_t *size) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    /* cuMemGetAddressRange only finds allocations of the current context:
     * memory of device 1 looked up while the caller's device 0 is current
     * is CUDA_ERROR_NOT_FOUND. Ask in the owning device's context. */
    int device = -1;
    if (cuda_classify(ptr, &device) != CKPTIO_MEM_CUDA || device < 0) device = -1;
    if (device >= 0) CKPTIO_FORWARD(cuda_ctx_enter(device));
    CUdeviceptr b = 0;
    size_t s = 0;
    CUresult r = cu->cuMemGetAddressRange(&b, &s, (CUdeviceptr)(uintptr_t)ptr);
    if (device >= 0) cuda_ctx_leave(device);
    if (r != CUDA_SUCCESS)
        return CKPTIO_CUDA_FAIL(r, "cuMemGetAddressRange(%p, device %d): not a valid device address", ptr, device);
    *base = (uintptr_t)b;
    *size = s;
    return CKPTIO_OK;
}

/* cuMemRetainAllocationHandle answers only for memory mapped with cuMemMap (not for cudaMalloc memory); the
 * handle it retains is released at once. */
static bool cuda_mem_mapped(const void *ptr) {
    const ckptio__cuda_api *cu = ckptio__cuda_try();
    if (!cu || !cu->cuMemRetainAllocationHandle || !cu->cuMemRelease) return false;
    unsigned long long handle = 0;
    if (cu->cuMemRetainAllocationHandle(&handle, (void *)ptr) != CUDA_SUCCESS) return false;
    cu->cuMemRelease(handle);
    return true;
}

static ckptio_status primary_ctx(const ckptio__cuda_api *cu, int device, CUcontext *out) {
    if (device < 0 || device >= MAX_DEVICES)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "CUDA device ordinal %d out of range", device);
    pthread_mutex_lock(&ctx_lock);
    ckptio_status st = CKPTIO_OK;
    if (!primary[device]) {
        CUdevice dev;
        CUresult r = cu->cuDeviceGet(&dev, device);
        if (r == CUDA_SUCCESS) r = cu->cuDevicePrimaryCtxRetain(&primary[device], dev);
        if (r != CUDA_SUCCESS) st = CKPTIO_CUDA_FAIL(r, "retaining the primary context of CUDA device %d", device);
    }
    *out = primary[device];
    pthread_mutex_unlock(&ctx_lock);
    return st;
}

static ckptio_status cuda_ctx_enter(int device) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUcontext ctx = NULL;
    CKPTIO_FORWARD(primary_ctx(cu, device, &ctx));
    CUresult r = cu->cuCtxPushCurrent(ctx);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuCtxPushCurrent(device %d)", device);
    return CKPTIO_OK;
}

static void cuda_ctx_leave(int device) {
    (void)device;
    const ckptio__cuda_api *cu = ckptio__cuda_try();
    CUcontext ignored = NULL;
    if (cu) cu->cuCtxPopCurrent(&ignored);
}

static ckptio_status cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CKPTIO_FORWARD(cuda_ctx_enter(device));
    size_t f = 0, t = 0;
    CUresult r = cu->cuMemGetInfo(&f, &t);
    cuda_ctx_leave(device);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuMemGetInfo(device %d)", device);
    *free_bytes = f;
    *total_bytes = t;
    return CKPTIO_OK;
}

/* Pinned staging is anonymous memory that the kernel fills in one go
 * (MAP_POPULATE) and the driver then page-locks (cuMemHostRegister), rather
 * than cuMemHostAlloc: a process's first load runs faster this way, though
 * pinning alone costs about the same; our reading is that the driver is
 * held for less of the time the load's copies need it when the pages
 * already exist before the call (docs/GPU.md#pinning).
 * The page before the slot holds the mapping's address and length for the
 * free. MADV_DONTFORK: a child forked later (a DataLoader worker) neither
 * inherits nor copies it; it cannot use CUDA anyway. Where the driver
 * cannot register host memory, the process uses cuMemHostAlloc from its
 * first allocation on.
 * Huge slots (`huge`, the default where ckptio__gpu_huge_slots allows):
 * the slot starts on a 2 MiB boundary of a larger reservation and is
 * advised MADV_HUGEPAGE before it is faulted in (ckptio__slot_range_fill),
 * so that the driver pins 2 MiB pages, which makes first loads faster
 * (docs/GPU.md#huge-slots). The guard: with THP's defrag in madvise
 * mode a fault in an advised range that finds no free 2 MiB block compacts
 * memory first, a stall a busy host would pay on its first load; so the
 * pipeline asks for huge slots only while THP is enabled and the kernel's
 * free blocks of 2 MiB and more cover twice what the call may pin
 * (src/io/huge_pages.c), unless the engine's CKPTIO_OPT_GPU_HUGE_SLOTS says
 * off or on. Where the kernel gives no huge page, the advice is ignored and
 * the slot is on 4 KiB pages, filled all the same.
 * The pipeline's slots are made this way (one mapping each) only where no
 * range could be reserved for them or the driver refused a slot there:
 * gpu_staging.c places them in one reserved range and pins them with
 * slot_pin, below (gpu_slot_range.c says why). */
#define PIN_HEADER 4096u

/* The page before a slot: what its free must unmap. */
typedef struct pin_header {
    unsigned char *map;
    size_t len;
} pin_header;

static atomic_int pin_by_register = 1;       /* cleared once, before any registered slot exists */
static atomic_int registered_slots_made = 0;

static ckptio_status pinned_fail(CUresult r, const char *call, size_t bytes) {
    /* Pinned host memory exhausted is a host-side shortage. */
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOMEM, &((ckptio__err_ctx){.file_offset = -1, .cuda_result = r}),
                               "%s(%zu bytes) of pinned staging memory failed: %s", call, bytes,
                               ckptio__cuda_error_name(r));
    return CKPTIO_CUDA_FAIL(r, "%s(%zu bytes) of pinned staging memory", call, bytes);
}

/* CKPTIO_OK with *out set; or CKPTIO_E_UNSUPPORTED (nothing made) when
 * this driver cannot register host memory. */
/* Anonymous memory for a slot of `body` bytes with its header page before
 * it, filled by the kernel; *slot on a 2 MiB boundary when `huge`. */
static ckptio_status map_slot(size_t body, bool huge, pin_header *h, unsigned char **slot) {
    h->len = body + (huge ? CKPTIO_HUGE_PAGE_BYTES : PIN_HEADER);
    h->map = mmap(NULL, h->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (huge ? 0 : MAP_POPULATE), -1, 0);
    if (h->map == MAP_FAILED)
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "mmap(%zu bytes) of pinned staging memory failed: %s", h->len,
                           strerror(errno));
    *slot = h->map + PIN_HEADER;
    if (huge) {
        *slot = (unsigned char *)(((uintptr_t)h->map + PIN_HEADER + CKPTIO_HUGE_PAGE_BYTES - 1) &
                                  ~(uintptr_t)(CKPTIO_HUGE_PAGE_BYTES - 1));
        (void)madvise(*slot, body, MADV_HUGEPAGE); /* best effort: 4 KiB pages otherwise */
        ckptio__slot_range_fill(*slot - PIN_HEADER, body + PIN_HEADER);
    }
    (void)madvise(h->map, h->len, MADV_DONTFORK); /* best effort: without it a fork only copies more */
    memcpy(*slot - PIN_HEADER, h, sizeof *h);
    return CKPTIO_OK;
}

static ckptio_status register_alloc(const ckptio__cuda_api *cu, size_t bytes, bool huge, void **out) {
    const size_t body = (bytes + 4095) & ~(size_t)4095;
    pin_header h;
    unsigned char *slot = NULL;
    CKPTIO_FORWARD(map_slot(body, huge, &h, &slot));
    const CUresult r = cu->cuMemHostRegister(slot, body, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (r != CUDA_SUCCESS) {
        munmap(h.map, h.len);
        if ((r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED) && !atomic_load(&registered_slots_made))
            return CKPTIO_E_UNSUPPORTED;
        return pinned_fail(r, "cuMemHostRegister", bytes);
    }
    atomic_store(&registered_slots_made, 1);
    *out = slot;
    return CKPTIO_OK;
}

static ckptio_status cuda_pinned_alloc(size_t bytes, bool huge, void **out) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    *out = NULL;
    if (atomic_load(&pin_by_register) && cu->cuMemHostRegister && cu->cuMemHostUnregister) {
        const ckptio_status st = register_alloc(cu, bytes, huge, out);
        if (st != CKPTIO_E_UNSUPPORTED) return st;
    }
    atomic_store(&pin_by_register, 0);
    const CUresult r = cu->cuMemHostAlloc(out, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r != CUDA_SUCCESS) {
        *out = NULL;
        return pinned_fail(r, "cuMemHostAlloc", bytes);
    }
    return CKPTIO_OK;
}

static void cuda_pinned_free(void *ptr) {
    const ckptio__cuda_api *cu = ckptio__cuda_try(); /* NULL in a forked child: its copy is not ours to free */
    if (!cu || !ptr) return;
    if (!atomic_load(&pin_by_register)) {
        cu->cuMemFreeHost(ptr);
        return;
    }
    pin_header h;
    memcpy(&h, (unsigned char *)ptr - PIN_HEADER, sizeof h);
    cu->cuMemHostUnregister(ptr);
    munmap(h.map, h.len);
}

static ckptio_status cuda_slot_pin(void *addr, size_t bytes) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    if (!atomic_load(&pin_by_register) || !cu->cuMemHostRegister || !cu->cuMemHostUnregister)
        return CKPTIO_E_UNSUPPORTED;
    const CUresult r = cu->cuMemHostRegister(addr, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (r == CUDA_SUCCESS) {
        atomic_store(&registered_slots_made, 1);
        return CKPTIO_OK;
    }
    if ((r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED) && !atomic_load(&registered_slots_made))
        return CKPTIO_E_UNSUPPORTED;
    return pinned_fail(r, "cuMemHostRegister", bytes);
}

static void cuda_slot_unpin(void *addr) {
    const ckptio__cuda_api *cu = ckptio__cuda_try(); /* NULL in a forked child: not ours to undo */
    if (cu && addr) cu->cuMemHostUnregister(addr);
}

static ckptio_status cuda_stream_create(void **out) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUstream s = NULL;
    /* Non-blocking: our copies must not serialise with the legacy default
     * stream a caller may be using. */
    CUresult r = cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuStreamCreate");
    *out = s;
    return CKPTIO_OK;
}

static void cuda_stream_destroy(void *stream) {
    const ckptio__cuda_api *cu = ckptio__cuda_try();
    if (cu && stream) cu->cuStreamDestroy((CUstream)stream);
}

static ckptio_status cuda_stream_sync(void *stream) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUresult r = cu->cuStreamSynchronize((CUstream)stream);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuStreamSynchronize");
    return CKPTIO_OK;
}

static ckptio_status cuda_event_create(void **out) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUevent e = NULL;
    /* Blocking sync: waiting workers sleep instead of spinning a core each. */
    CUresult r = cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuEventCreate");
    *out = e;
    return CKPTIO_OK;
}

static void cuda_event_destroy(void *event) {
    const ckptio__cuda_api *cu = ckptio__cuda_try();
    if (cu && event) cu->cuEventDestroy((CUevent)event);
}

static ckptio_status cuda_event_record(void *event, void *stream) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUresult r = cu->cuEventRecord((CUevent)event, (CUstream)stream);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuEventRecord");
    return CKPTIO_OK;
}

static ckptio_status cuda_stream_wait_event(void *stream, void *event) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUresult r = cu->cuStreamWaitEvent((CUstream)stream, (CUevent)event, 0);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuStreamWaitEvent(stream %p)", stream);
    return CKPTIO_OK;
}

static ckptio_status cuda_event_sync(void *event) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUresult r = cu->cuEventSynchronize((CUevent)event);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "waiting for a GPU copy (cuEventSynchronize)");
    return CKPTIO_OK;
}

static ckptio_status cuda_h2d(void *dst, const void *src, size_t bytes, void *stream) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUresult r = cu->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes, (CUstream)stream);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuMemcpyHtoDAsync(%p, %zu bytes)", dst, bytes);
    return CKPTIO_OK;
}

static ckptio_status cuda_d2h(void *dst, const void *src, size_t bytes, void *stream) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    CUresult r = cu->cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes, (CUstream)stream);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuMemcpyDtoHAsync(%p, %zu bytes)", src, bytes);
    return CKPTIO_OK;
}

/* One pitched copy (cuMemcpy2DAsync, optional in the shim: without it the
 * caller copies row by row, see gpu_ops.h). */
static ckptio_status cuda_copy_2d(bool h2d, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                  size_t width, size_t rows, void *stream) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    if (!cu->cuMemcpy2DAsync) { /* an old driver: row by row */
        for (size_t i = 0; i < rows; i++) {
            unsigned char *d = (unsigned char *)dst + i * dst_pitch;
            const unsigned char *s = (const unsigned char *)src + i * src_pitch;
            CKPTIO_FORWARD(h2d ? cuda_h2d(d, s, width, stream) : cuda_d2h(d, s, width, stream));
        }
        return CKPTIO_OK;
    }
    CUDA_MEMCPY2D c = {.WidthInBytes = width, .Height = rows, .srcPitch = src_pitch, .dstPitch = dst_pitch};
    if (h2d) {
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = src;
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = (CUdeviceptr)(uintptr_t)dst;
    } else {
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = (CUdeviceptr)(uintptr_t)src;
        c.dstMemoryType = CU_MEMORYTYPE_HOST;
        c.dstHost = dst;
    }
    CUresult r = cu->cuMemcpy2DAsync(&c, (CUstream)stream);
    if (r != CUDA_SUCCESS)
        return CKPTIO_CUDA_FAIL(r, "cuMemcpy2DAsync(%s %p, %zu rows of %zu bytes, pitches %zu and %zu)",
                                h2d ? "to" : "from", h2d ? dst : src, rows, width, src_pitch, dst_pitch);
    return CKPTIO_OK;
}

static ckptio_status cuda_h2d_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                                 size_t rows, void *stream) {
    return cuda_copy_2d(true, dst, dst_pitch, src, src_pitch, width, rows, stream);
}

static ckptio_status cuda_d2h_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                                 size_t rows, void *stream) {
    return cuda_copy_2d(false, dst, dst_pitch, src, src_pitch, width, rows, stream);
}

static ckptio_status cuda_wait_word(void *stream, volatile uint32_t *word, uint32_t value) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(need_api(&cu));
    if (!cu->cuStreamWaitValue32)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "the CUDA driver lacks cuStreamWaitValue32_v2");
    CUdeviceptr dptr = 0;
    CUresult r = cu->cuMemHostGetDevicePointer(&dptr, (void *)(uintptr_t)word, 0);
    if (r == CUDA_SUCCESS) r = cu->cuStreamWaitValue32((CUstream)stream, dptr, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuStreamWaitValue32 on the caller's stream");
    return CKPTIO_OK;
}

static bool cuda_event_done(void *event) {
    const ckptio__cuda_api *cu = ckptio__cuda_try();
    return !cu || cu->cuEventQuery((CUevent)event) != CUDA_ERROR_NOT_READY;
}

static const ckptio__gpu_ops cuda_ops = {
    .name = "cuda",
    .classify = cuda_classify,
    .mem_range = cuda_mem_range,
    .mem_mapped = cuda_mem_mapped,
    .mem_info = cuda_mem_info,
    .ctx_enter = cuda_ctx_enter,
    .ctx_leave = cuda_ctx_leave,
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
    .slot_pin = cuda_slot_pin,
    .slot_unpin = cuda_slot_unpin,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_sync = cuda_event_sync,
    .event_done = cuda_event_done,
    .h2d_async = cuda_h2d,
    .d2h_async = cuda_d2h,
    .h2d_2d_async = cuda_h2d_2d,
    .d2h_2d_async = cuda_d2h_2d,
    .stream_wait_word = cuda_wait_word,
};

const ckptio__gpu_ops *ckptio__gpu_cuda_ops(void) { return &cuda_ops; }

static _Atomic(const ckptio__gpu_ops *) installed_ops;
static _Atomic unsigned installed_generation;

/* An installed device (the tests' simulator) is treated as CUDA is: installed
 * before fork(), it cannot be used in the child (its streams are threads of
 * the parent). */
void ckptio__gpu_set_ops(const ckptio__gpu_ops *ops) {
    atomic_store(&installed_generation, ckptio__fork_generation());
    atomic_store(&installed_ops, ops);
}

ckptio_status ckptio__gpu_ops_get(const ckptio__gpu_ops **out) {
    const ckptio__gpu_ops *ops = atomic_load(&installed_ops);
    if (ops && ckptio__forked_since(atomic_load(&installed_generation))) {
        *out = NULL;
        char what[64];
        snprintf(what, sizeof what, "the %s device", ops->name);
        return ckptio__cuda_refuse_forked(what);
    }
    if (ops) {
        *out = ops;
        return CKPTIO_OK;
    }
    const ckptio__cuda_api *cu;
    ckptio_status st = ckptio__cuda_load(&cu);
    *out = st == CKPTIO_OK ? &cuda_ops : NULL;
    return st;
}

const ckptio__gpu_ops *ckptio__gpu_ops_try(void) {
    const ckptio__gpu_ops *ops = atomic_load(&installed_ops);
    if (ops) return ckptio__forked_since(atomic_load(&installed_generation)) ? NULL : ops;
    return ckptio__cuda_try() ? &cuda_ops : NULL;
}
