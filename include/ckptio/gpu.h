/*
 * ckptio/gpu.h - GPU memory: CUDA access, the GPU path of the engine, and the GDS
 * file API (docs/GPU.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_GPU_H
#define CKPTIO_GPU_H

#include "core.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/gpu.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* GPU: CUDA access and the GDS file API                                    */
/* ------------------------------------------------------------------------ */
/* The CUDA driver is loaded at run time (dlopen "libcuda.so.1"); building and
 * running ckptio need no CUDA toolkit. Without a driver, the functions below
 * fail with CKPTIO_E_NO_CUDA (message says why) and host transfers keep
 * working. GPU work uses the primary context of the device owning the
 * memory (the one PyTorch uses) and leaves the caller's current context as
 * it was. Streams are passed as `void *` holding a CUstream (for PyTorch:
 * torch.cuda.current_stream().cuda_stream); NULL means the legacy default
 * stream. docs/GPU.md describes paths, settings and stream semantics. */

/* Which mechanism moved the bytes of a GPU transfer. */
typedef enum ckptio_io_path {
    CKPTIO_IO_PATH_NONE = 0,          /* nothing moved yet */
    CKPTIO_IO_PATH_CUFILE_DIRECT = 1, /* cuFile with GPUDirect Storage (nvidia-fs) */
    CKPTIO_IO_PATH_CUFILE_COMPAT = 2, /* cuFile in its POSIX compatibility mode */
    CKPTIO_IO_PATH_PIPELINE = 3,      /* ckptio's pinned-staging pipeline */
    CKPTIO_IO_PATH_HOST = 4           /* host memory: plain file I/O, no GPU */
} ckptio_io_path;

/*! ckptio_io_path_name() : "none", "cufile_direct", "cufile_compat",
 * "pipeline" or "host" (static), NULL if invalid. */
CKPTIO_API const char *ckptio_io_path_name(ckptio_io_path path);

/*! ckptio_cuda_available() :
 * Loads the driver if needed. @return CKPTIO_OK with *device_count (may be
 * NULL), or CKPTIO_E_NO_CUDA with a message naming what is missing. */
CKPTIO_API ckptio_status ckptio_cuda_available(int *device_count);

/*! ckptio_mem_classify() :
 * *out = CKPTIO_MEM_CUDA (device or managed memory), CKPTIO_MEM_PINNED
 * (page-locked host memory known to CUDA) or CKPTIO_MEM_HOST (pageable
 * memory, and every pointer when no driver is present). *device (may be
 * NULL) receives the owning device ordinal, or -1. Never fails for a
 * non-NULL out. */
CKPTIO_API ckptio_status ckptio_mem_classify(const void *ptr, ckptio_mem_kind *out, int *device);

/*! ckptio_gpu_check_free() :
 * For loaders that allocate: @return CKPTIO_OK if `device` has at least
 * `needed` bytes free, else CKPTIO_E_DEVICE_OOM with a message giving the
 * bytes needed and free (and `what`, e.g. a file name, when not NULL). */
CKPTIO_API ckptio_status ckptio_gpu_check_free(int device, uint64_t needed, const char *what);

/*! ckptio_engine_gpu_path() : the path the engine's last GPU transfer took
 * (CKPTIO_IO_PATH_NONE before any). */
CKPTIO_API ckptio_status ckptio_engine_gpu_path(ckptio_engine *engine, ckptio_io_path *out);

/*! ckptio_engine_gpu_prepare() :
 * Starts pinning, on a background thread, the host staging memory the
 * engine's loads to CUDA device `device` will use (the engine keeps it for
 * later transfers; 2 slots of up to 4 MiB per worker thread: 128 MiB with
 * 16), and returns at once.
 * A process's first load otherwise pins it as it goes, which slows it
 * (docs/GPU.md#pinning): a model server calls this while it
 * builds its model, so the load that follows starts with its staging
 * ready. The driver pins and allocates device memory one at a time: GPU
 * allocations made meanwhile wait for the pinning, so call it ahead of work
 * that does not allocate GPU memory. A transfer that starts meanwhile stops
 * the pinning and pins the rest itself; an error while pinning ends it
 * silently (the transfer that needs the memory reports it). Slots of another size (after a save with checksums) are
 * kept, and nothing is pinned then. The engine's destruction waits for the
 * thread. Thread-safe.
 * @return CKPTIO_OK; CKPTIO_E_INVAL (NULL engine, negative device), the
 * error of a device CUDA cannot use (no driver, bad ordinal, forked child). */
CKPTIO_API ckptio_status ckptio_engine_gpu_prepare(ckptio_engine *engine, int device);

/* ---- GDS file API (like cuFile and torch.cuda.gds.GdsFile) ----------------
 * A file opened for transfers between it and device or host buffers at
 * explicit offsets. With CKPTIO_OPT_GPU_PATH (env CKPTIO_GPU_PATH) AUTO,
 * cuFile is used where it runs in GPUDirect mode (nvidia-fs present and the
 * handle registers); otherwise, with no user action, ckptio's pipeline.
 * CUFILE forces cuFile (a refusal is an error, message says why), PIPELINE
 * forces the pipeline. ckptio_gds_file_path() tells which path ran.
 * A handle is used by one thread at a time; async requests on one file
 * run in submission order on a background thread. */

typedef struct ckptio_gds_file ckptio_gds_file;
typedef struct ckptio_gds_request ckptio_gds_request;

/*! ckptio_gds_open() :
 * Opens `path` with the POSIX open flags `oflags` (O_RDONLY, O_WRONLY or
 * O_RDWR, optionally O_CREAT, O_EXCL, O_TRUNC), O_DIRECT added where the
 * file system accepts it (writes go to the file in place, not atomically),
 * and registers the handle (ckptio_gds_register_handle). `mode` is the
 * permission bits of a file O_CREAT creates, narrowed by the umask as
 * open(2)'s are (0: 0666); an existing file keeps its mode. The engine
 * must outlive the file. */
CKPTIO_API ckptio_status ckptio_gds_open(ckptio_engine *engine, const char *path, int oflags, unsigned mode,
                                         ckptio_gds_file **out);

/*! ckptio_gds_close() : deregisters and closes; waits for the file's async
 * requests first. Accepts NULL. */
CKPTIO_API ckptio_status ckptio_gds_close(ckptio_gds_file *file);

/*! ckptio_gds_register_handle() / ckptio_gds_deregister_handle() :
 * cuFileHandleRegister / Deregister (GdsFile.register_handle). Registering
 * decides the path for device buffers: in AUTO a cuFile refusal is not an
 * error (the pipeline is used; ckptio_gds_file_refusal() says why); with
 * CKPTIO_GPU_PATH_CUFILE it is. Deregistering makes device transfers use
 * the pipeline until the next registration. Both are idempotent. */
CKPTIO_API ckptio_status ckptio_gds_register_handle(ckptio_gds_file *file);
CKPTIO_API ckptio_status ckptio_gds_deregister_handle(ckptio_gds_file *file);

/*! ckptio_gds_file_refusal() : why cuFile is not used for this file ("" if
 * it is, or was not tried). Owned by the file. */
CKPTIO_API const char *ckptio_gds_file_refusal(const ckptio_gds_file *file);

/*! ckptio_gds_buf_register() / ckptio_gds_buf_deregister() :
 * cuFileBufRegister / Deregister for a device buffer reused across calls
 * (a no-op returning CKPTIO_OK when cuFile is not in use: the pipeline
 * needs no registration). */
CKPTIO_API ckptio_status ckptio_gds_buf_register(ckptio_gds_file *file, const void *base, uint64_t length);
CKPTIO_API ckptio_status ckptio_gds_buf_deregister(ckptio_gds_file *file, const void *base);

/*! ckptio_gds_read() :
 * Reads `size` bytes at `file_offset` into buf + buf_offset (device,
 * pinned or pageable memory; any alignment), blocking until the bytes are
 * in place. Like cuFileRead, a read reaching end of file is short:
 * *bytes_read (may be NULL) receives the count. */
CKPTIO_API ckptio_status ckptio_gds_read(ckptio_gds_file *file, void *buf, uint64_t size, uint64_t file_offset,
                                         uint64_t buf_offset, uint64_t *bytes_read);

/*! ckptio_gds_write() : writes `size` bytes from buf + buf_offset at
 * `file_offset`, blocking until they are in the file (not fsynced: see
 * ckptio_gds_sync). *bytes_written may be NULL. */
CKPTIO_API ckptio_status ckptio_gds_write(ckptio_gds_file *file, const void *buf, uint64_t size,
                                          uint64_t file_offset, uint64_t buf_offset, uint64_t *bytes_written);

/*! ckptio_gds_sync() : fsync of the file's data (durability of writes). */
CKPTIO_API ckptio_status ckptio_gds_sync(ckptio_gds_file *file);

/*! ckptio_gds_read_async() / ckptio_gds_write_async() :
 * Stream-ordered variants (like cuFileReadAsync): the transfer starts after
 * the work queued on `stream` before this call, and work queued on
 * `stream` after this call sees its result: kernels launched later on the
 * stream read the loaded bytes; kernels launched earlier have finished
 * writing the bytes a write saves. The call returns at once with a request
 * (*out); ckptio_gds_request_wait() gives its outcome. buf must stay valid
 * until then. Where the driver cannot make a stream wait for the host
 * (no cuStreamWaitValue32), the call synchronises `stream` and runs the
 * transfer before returning (same ordering, no overlap; see docs/GPU.md). */
CKPTIO_API ckptio_status ckptio_gds_read_async(ckptio_gds_file *file, void *buf, uint64_t size,
                                               uint64_t file_offset, uint64_t buf_offset, void *stream,
                                               ckptio_gds_request **out);
CKPTIO_API ckptio_status ckptio_gds_write_async(ckptio_gds_file *file, const void *buf, uint64_t size,
                                                uint64_t file_offset, uint64_t buf_offset, void *stream,
                                                ckptio_gds_request **out);

/*! ckptio_gds_request_wait() : blocks the host until the request finished;
 * @return its status (the error record describes a failure) and the bytes
 * moved in *bytes (may be NULL). May be called again (same answer). */
CKPTIO_API ckptio_status ckptio_gds_request_wait(ckptio_gds_request *request, uint64_t *bytes);

/*! ckptio_gds_request_destroy() : waits (like _wait) and frees. Accepts NULL. */
CKPTIO_API ckptio_status ckptio_gds_request_destroy(ckptio_gds_request *request);

/*! ckptio_gds_file_path() : the path the file's last transfer took. */
CKPTIO_API ckptio_status ckptio_gds_file_path(const ckptio_gds_file *file, ckptio_io_path *out);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_GPU_H */
