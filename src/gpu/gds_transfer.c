/*
 * gds_transfer.c - the GDS file's transfers: ckptio_gds_read/write and the
 * work function the asynchronous requests (gds_async.c) run. Device buffers
 * go through cuFile when the handle registered in GPUDirect mode (or cuFile
 * was forced), otherwise through the staging pipeline; host buffers through
 * the engine.
 */
#include "cuda_shim.h"
#include "engine_internal.h"
#include "gds_internal.h"
#include "gpu_pipeline.h"

static ckptio_status host_transfer(ckptio_gds_file *f, ckptio_direction dir, void *ptr, uint64_t size,
                                   uint64_t offset, ckptio_mem_kind kind) {
    const ckptio_extent e = {.file = f->file, .file_offset = offset, .length = size, .memory = ptr, .mem_kind = kind};
    return ckptio_engine_execute_extents(f->engine, dir, &e, 1);
}

ckptio_status ckptio__gds_transfer(ckptio_gds_file *f, ckptio_direction dir, void *buf, uint64_t size,
                                   uint64_t file_offset, uint64_t buf_offset, uint64_t *bytes) {
    *bytes = 0;
    const char *path = f->file->path;
    uint64_t end;
    if (!size) return CKPTIO_OK;
    CKPTIO_RETURN_IF(!buf, CKPTIO_E_INVAL, "%s: GDS %s of %llu bytes with a NULL buffer", path,
                     dir == CKPTIO_READ ? "read" : "write", (unsigned long long)size);
    if (ckptio__add_overflows(file_offset, size, &end) || end > (uint64_t)INT64_MAX ||
        ckptio__add_overflows((uintptr_t)buf, buf_offset, &end) || ckptio__add_overflows(end, size, &end))
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                               "file offset %llu, buffer offset %llu and size %llu overflow",
                               (unsigned long long)file_offset, (unsigned long long)buf_offset,
                               (unsigned long long)size);
    if (dir == CKPTIO_READ) {
        /* Like cuFileRead: a read reaching end of file is short, not an error. */
        uint64_t fsize = 0;
        CKPTIO_FORWARD(ckptio_file_size(f->file, &fsize));
        if (file_offset >= fsize) return CKPTIO_OK;
        if (size > fsize - file_offset) size = fsize - file_offset;
    }
    unsigned char *ptr = (unsigned char *)buf + buf_offset;
    const ckptio__gpu_ops *ops = ckptio__gpu_ops_try();
    int device = -1;
    const ckptio_mem_kind kind = ops ? ops->classify(ptr, &device) : CKPTIO_MEM_HOST;
    ckptio_status st;
    if (kind != CKPTIO_MEM_CUDA) {
        st = host_transfer(f, dir, ptr, size, file_offset, kind);
        if (st == CKPTIO_OK) atomic_store(&f->last_path, CKPTIO_IO_PATH_HOST);
    } else if (f->registered) {
        uint64_t done = 0;
        const bool nvtx = ckptio__engine_setting(f->engine, CKPTIO_OPT_NVTX) != 0;
        ckptio__nvtx_push(nvtx, dir == CKPTIO_READ ? "ckptio: cuFileRead" : "ckptio: cuFileWrite");
        st = ckptio__cufile_transfer(f->handle, dir, buf, size, file_offset, buf_offset, path, &done);
        ckptio__nvtx_pop(nvtx);
        ckptio__engine_stats_add(f->engine, &(ckptio_stats){.bytes_cufile = done});
        if (st == CKPTIO_OK)
            atomic_store(&f->last_path, ckptio__cufile_direct_mode() ? CKPTIO_IO_PATH_CUFILE_DIRECT
                                                                     : CKPTIO_IO_PATH_CUFILE_COMPAT);
        size = done;
    } else {
        const ckptio_extent e = {.file = f->file, .file_offset = file_offset, .length = size, .memory = ptr,
                                 .mem_kind = CKPTIO_MEM_CUDA};
        st = ckptio__gpu_pipeline_run(f->engine, ops, device, dir, &e, 1, false);
        if (st == CKPTIO_OK) {
            ckptio__engine_progress_done(f->engine, size);
            ckptio__gpu_state *gs = ckptio__engine_gpu_state(f->engine);
            atomic_store(&f->last_path, CKPTIO_IO_PATH_PIPELINE);
            if (gs) gs->last_path = CKPTIO_IO_PATH_PIPELINE;
        }
    }
    if (st == CKPTIO_OK) *bytes = size;
    return st;
}

ckptio_status ckptio_gds_read(ckptio_gds_file *f, void *buf, uint64_t size, uint64_t file_offset, uint64_t buf_offset,
                              uint64_t *bytes_read) {
    CKPTIO_RETURN_IF(!f, CKPTIO_E_INVAL, "ckptio_gds_read: file is NULL");
    uint64_t n = 0;
    ckptio_status st = ckptio__gds_transfer(f, CKPTIO_READ, buf, size, file_offset, buf_offset, &n);
    if (bytes_read) *bytes_read = n;
    return st;
}

ckptio_status ckptio_gds_write(ckptio_gds_file *f, const void *buf, uint64_t size, uint64_t file_offset,
                               uint64_t buf_offset, uint64_t *bytes_written) {
    CKPTIO_RETURN_IF(!f, CKPTIO_E_INVAL, "ckptio_gds_write: file is NULL");
    CKPTIO_RETURN_IF(!f->file->writable, CKPTIO_E_PERMISSION, "%s: GDS write on a file opened O_RDONLY",
                     f->file->path);
    uint64_t n = 0;
    ckptio_status st =
        ckptio__gds_transfer(f, CKPTIO_WRITE, (void *)(uintptr_t)buf, size, file_offset, buf_offset, &n);
    if (bytes_written) *bytes_written = n;
    return st;
}
