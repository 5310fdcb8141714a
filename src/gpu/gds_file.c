/*
 * gds_file.c - the GDS file API: a file for reads and writes between it and
 * device or host buffers at explicit offsets (cuFile's and
 * torch.cuda.gds.GdsFile's model). This file opens, registers and closes
 * it; gds_transfer.c moves bytes, gds_async.c queues stream-ordered
 * requests.
 */
#include "cuda_shim.h"
#include "engine_internal.h"
#include "gds_internal.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ckptio_status ckptio_gds_open(ckptio_engine *engine, const char *path, int oflags, unsigned mode,
                              ckptio_gds_file **out) {
    CKPTIO_RETURN_IF(!engine || !path || !out, CKPTIO_E_INVAL, "ckptio_gds_open: engine, path and out are required");
    *out = NULL;
    const int acc = oflags & O_ACCMODE;
    unsigned flags = CKPTIO_OPEN_READ;
    if (acc == O_RDONLY) {
        CKPTIO_RETURN_IF(oflags & (O_TRUNC | O_CREAT | O_EXCL), CKPTIO_E_INVAL,
                         "%s: ckptio_gds_open: O_CREAT, O_EXCL and O_TRUNC need O_WRONLY or O_RDWR", path);
    } else if (acc == O_WRONLY || acc == O_RDWR) {
        flags |= CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE;
        if (oflags & O_EXCL) {
            CKPTIO_RETURN_IF(!(oflags & O_CREAT), CKPTIO_E_INVAL, "%s: ckptio_gds_open: O_EXCL needs O_CREAT", path);
            flags |= CKPTIO_OPEN_EXCLUSIVE;
        }
        struct stat sb;
        if (!(oflags & O_CREAT) && stat(path, &sb) != 0)
            return CKPTIO_FAIL_SYS(errno, "open", path, -1, "opening for writing without O_CREAT");
    } else {
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "%s: ckptio_gds_open: invalid access mode in flags 0x%x", path, oflags);
    }
    ckptio_status st = CKPTIO_OK;
    ckptio_gds_file *f = ckptio__calloc(1, sizeof *f);
    if (!f) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory opening a GDS file", path);
    f->engine = engine;
    f->generation = ckptio__fork_generation();
    atomic_init(&f->last_path, CKPTIO_IO_PATH_NONE);
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
    /* The mode goes to the open that creates the file, as open(2)'s does:
     * the umask narrows it (a chmod after the creation would not). */
    const mode_t create_mode = mode ? (mode_t)(mode & 0777) : 0666;
    if ((st = ckptio__file_open_created(engine, path, flags, create_mode, &f->file)) != CKPTIO_OK) goto fail;
    if ((oflags & O_TRUNC) && (st = ckptio_file_truncate(f->file, 0)) != CKPTIO_OK) goto fail;
    if ((st = ckptio_gds_register_handle(f)) != CKPTIO_OK) goto fail;
    *out = f;
    return CKPTIO_OK;
fail:
    ckptio_file_close(f->file);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    ckptio__free(f);
    return st;
}

ckptio_status ckptio_gds_close(ckptio_gds_file *f) {
    if (!f) return CKPTIO_OK;
    /* A fork()ed child's copy of a file opened in the parent: the request
     * thread and the cuFile handle are the parent's (joining that thread
     * here would wait forever, its lock may be held): leave them alone. */
    const bool inherited = ckptio__forked_since(f->generation);
    if (!inherited) {
        ckptio__gds_async_shutdown(f);
        ckptio_gds_deregister_handle(f);
    }
    ckptio_status st = ckptio_file_close(f->file);
    if (!inherited) {
        pthread_cond_destroy(&f->cond);
        pthread_mutex_destroy(&f->lock);
    }
    ckptio__free(f);
    return st;
}

ckptio_status ckptio_gds_register_handle(ckptio_gds_file *f) {
    CKPTIO_RETURN_IF(!f, CKPTIO_E_INVAL, "ckptio_gds_register_handle: file is NULL");
    if (f->registered) return CKPTIO_OK;
    const char *path = f->file->path;
    const int64_t mode = ckptio__engine_setting(f->engine, CKPTIO_OPT_GPU_PATH);
    const ckptio__gpu_ops *ops = ckptio__gpu_ops_try();
    const bool real = ops == ckptio__gpu_cuda_ops();
    f->refusal[0] = '\0';
    if (mode == CKPTIO_GPU_PATH_PIPELINE) {
        snprintf(f->refusal, sizeof f->refusal, "CKPTIO_OPT_GPU_PATH is pipeline");
        return CKPTIO_OK;
    }
    if (!real) {
        if (ops)
            snprintf(f->refusal, sizeof f->refusal, "cuFile cannot run on the %s device", ops->name);
        else
            snprintf(f->refusal, sizeof f->refusal, "no CUDA driver");
        if (mode == CKPTIO_GPU_PATH_AUTO) return CKPTIO_OK;
        if (!ops) return ckptio__gpu_ops_get(&ops); /* CKPTIO_E_NO_CUDA with its reason */
        return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                               &((ckptio__err_ctx){.operation = "cuFileHandleRegister", .path = path,
                                                   .file_offset = -1}),
                               "%s", f->refusal);
    }
    if (mode == CKPTIO_GPU_PATH_AUTO && !ckptio__cufile_direct_mode()) {
        snprintf(f->refusal, sizeof f->refusal,
                 "the nvidia-fs kernel driver is not loaded: cuFile could only run in its compatibility mode, "
                 "which is slower than ckptio's pipeline");
        return CKPTIO_OK;
    }
    CKPTIO_FORWARD(ckptio__file_prepare_direct(f->file));
    const int fd = ckptio__file_direct_fd(f->file);
    if (fd < 0)
        snprintf(f->refusal, sizeof f->refusal,
                 "cuFile needs an O_DIRECT descriptor and this file has none (O_DIRECT refused or "
                 "CKPTIO_OPT_DIRECT is off)");
    else if (ckptio__cufile_handle_register(fd, &f->handle, f->refusal, sizeof f->refusal))
        f->registered = true;
    if (f->registered || mode == CKPTIO_GPU_PATH_AUTO) return CKPTIO_OK;
    return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                           &((ckptio__err_ctx){.operation = "cuFileHandleRegister", .path = path, .file_offset = -1}),
                           "%s (CKPTIO_GPU_PATH=cufile forces cuFile; use auto or pipeline)", f->refusal);
}

ckptio_status ckptio_gds_deregister_handle(ckptio_gds_file *f) {
    CKPTIO_RETURN_IF(!f, CKPTIO_E_INVAL, "ckptio_gds_deregister_handle: file is NULL");
    if (!f->registered) return CKPTIO_OK;
    ckptio__cufile_handle_deregister(f->handle);
    f->handle = NULL;
    f->registered = false;
    snprintf(f->refusal, sizeof f->refusal, "the cuFile handle was deregistered");
    return CKPTIO_OK;
}

const char *ckptio_gds_file_refusal(const ckptio_gds_file *f) { return f ? f->refusal : ""; }

ckptio_status ckptio_gds_buf_register(ckptio_gds_file *f, const void *base, uint64_t length) {
    CKPTIO_RETURN_IF(!f || !base, CKPTIO_E_INVAL, "ckptio_gds_buf_register: file and base are required");
    if (!f->registered) return CKPTIO_OK;
    char why[600];
    if (!ckptio__cufile_buf_register(base, (size_t)length, why, sizeof why))
        return CKPTIO_FAIL_CTX(CKPTIO_E_CUDA,
                               &((ckptio__err_ctx){.operation = "cuFileBufRegister", .path = f->file->path,
                                                   .file_offset = -1}),
                               "%s", why);
    return CKPTIO_OK;
}

ckptio_status ckptio_gds_buf_deregister(ckptio_gds_file *f, const void *base) {
    CKPTIO_RETURN_IF(!f || !base, CKPTIO_E_INVAL, "ckptio_gds_buf_deregister: file and base are required");
    if (f->registered) ckptio__cufile_buf_deregister(base);
    return CKPTIO_OK;
}

ckptio_status ckptio_gds_file_path(const ckptio_gds_file *f, ckptio_io_path *out) {
    CKPTIO_RETURN_IF(!f || !out, CKPTIO_E_INVAL, "ckptio_gds_file_path: file and out are required");
    *out = (ckptio_io_path)atomic_load(&((ckptio_gds_file *)f)->last_path);
    return CKPTIO_OK;
}

ckptio_status ckptio_gds_sync(ckptio_gds_file *f) {
    CKPTIO_RETURN_IF(!f, CKPTIO_E_INVAL, "ckptio_gds_sync: file is NULL");
    const double t0 = ckptio__now();
    if (ckptio__fdatasync(f->file->fd) < 0)
        return CKPTIO_FAIL_SYS(errno, "fsync", f->file->path, -1, "making GDS writes durable");
    ckptio__engine_stats_add(f->engine, &(ckptio_stats){.seconds_fsync = ckptio__now() - t0});
    return CKPTIO_OK;
}
