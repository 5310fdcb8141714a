/*
 * gpu_execute.c - the GPU layer's entry points: the engine's hand-off of
 * device extents (ckptio__gpu_execute), memory classification, and the
 * public CUDA helpers. Chooses between cuFile and the staging pipeline.
 */
#include "cufile_shim.h"
#include "cuda_shim.h"
#include "engine_internal.h"
#include "gpu_internal.h"
#include "gpu_pipeline.h"
#include "io_internal.h"

#include <stdio.h>
#include <string.h>

const char *ckptio_io_path_name(ckptio_io_path path) {
    switch (path) {
    case CKPTIO_IO_PATH_NONE: return "none";
    case CKPTIO_IO_PATH_CUFILE_DIRECT: return "cufile_direct";
    case CKPTIO_IO_PATH_CUFILE_COMPAT: return "cufile_compat";
    case CKPTIO_IO_PATH_PIPELINE: return "pipeline";
    case CKPTIO_IO_PATH_HOST: return "host";
    }
    return NULL;
}

ckptio_mem_kind ckptio__gpu_classify(const void *ptr) {
    const ckptio__gpu_ops *ops = ckptio__gpu_ops_try();
    int device;
    return ops ? ops->classify(ptr, &device) : CKPTIO_MEM_HOST;
}

ckptio_status ckptio_mem_classify(const void *ptr, ckptio_mem_kind *out, int *device) {
    CKPTIO_RETURN_IF(!out, CKPTIO_E_INVAL, "ckptio_mem_classify: out is NULL");
    int dev = -1;
    const ckptio__gpu_ops *ops = ckptio__gpu_ops_try();
    *out = ops ? ops->classify(ptr, &dev) : CKPTIO_MEM_HOST;
    if (device) *device = dev;
    return CKPTIO_OK;
}

ckptio_status ckptio_cuda_available(int *device_count) {
    const ckptio__cuda_api *cu;
    CKPTIO_FORWARD(ckptio__cuda_load(&cu));
    int n = 0;
    CUresult r = cu->cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) return CKPTIO_CUDA_FAIL(r, "cuDeviceGetCount");
    if (n == 0)
        return CKPTIO_FAIL(CKPTIO_E_NO_CUDA, "the CUDA driver is loaded (version %d) but reports no GPU",
                           cu->driver_version);
    if (device_count) *device_count = n;
    return CKPTIO_OK;
}

ckptio_status ckptio__gpu_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
    CKPTIO_RETURN_IF(!free_bytes || !total_bytes, CKPTIO_E_INVAL, "ckptio__gpu_mem_info: NULL output");
    const ckptio__gpu_ops *ops;
    CKPTIO_FORWARD(ckptio__gpu_ops_get(&ops));
    return ops->mem_info(device, free_bytes, total_bytes);
}

ckptio_status ckptio_gpu_check_free(int device, uint64_t needed, const char *what) {
    uint64_t free_bytes = 0, total = 0;
    CKPTIO_FORWARD(ckptio__gpu_mem_info(device, &free_bytes, &total));
    if (needed > free_bytes)
        return CKPTIO_FAIL_CTX(CKPTIO_E_DEVICE_OOM,
                               &((ckptio__err_ctx){.operation = "check GPU memory", .path = what, .file_offset = -1}),
                               "loading needs %llu bytes (%.2f GiB) on CUDA device %d but only %llu bytes (%.2f GiB) "
                               "of %llu are free",
                               (unsigned long long)needed, needed / 1073741824.0, device,
                               (unsigned long long)free_bytes, free_bytes / 1073741824.0,
                               (unsigned long long)total);
    return CKPTIO_OK;
}

ckptio_status ckptio_engine_gpu_path(ckptio_engine *engine, ckptio_io_path *out) {
    CKPTIO_RETURN_IF(!engine || !out, CKPTIO_E_INVAL, "ckptio_engine_gpu_path: engine and out are required");
    const ckptio__gpu_state *st = ckptio__engine_gpu_state(engine);
    *out = st ? (ckptio_io_path)st->last_path : CKPTIO_IO_PATH_NONE;
    return CKPTIO_OK;
}

ckptio_status ckptio_engine_gpu_prepare(ckptio_engine *engine, int device) {
    CKPTIO_RETURN_IF(!engine || device < 0, CKPTIO_E_INVAL,
                     "ckptio_engine_gpu_prepare: an engine and a device >= 0 are required (device %d)", device);
    const ckptio__gpu_ops *ops = NULL;
    CKPTIO_FORWARD(ckptio__gpu_ops_get(&ops));
    /* A device that cannot be used fails here, not in the background. */
    CKPTIO_FORWARD(ops->ctx_enter(device));
    ops->ctx_leave(device);
    return ckptio__gpu_prepare(engine, ops, device);
}

/* ---- cuFile for plan extents --------------------------------------------------- */

/* Moves the extents with cuFile, registering each distinct file's O_DIRECT
 * descriptor for the duration of the call. Returns CKPTIO_E_UNSUPPORTED with
 * the reason (and moves nothing) when cuFile refuses a file before any byte
 * moved, so AUTO can fall back. */
static ckptio_status cufile_extents(ckptio_direction dir, const ckptio_extent *ext, size_t count) {
    char why[600];
    if (!ckptio__cufile_ready(why, sizeof why)) return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "%s", why);
    for (size_t i = 0; i < count; i++) {
        if (!ext[i].length) continue;
        ckptio_file *f = ext[i].file;
        CKPTIO_FORWARD(ckptio__file_prepare_direct(f));
        const int fd = ckptio__file_direct_fd(f);
        if (fd < 0)
            return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                   &((ckptio__err_ctx){.operation = "cuFileHandleRegister", .path = f->path,
                                                       .file_offset = -1}),
                                   "cuFile needs an O_DIRECT descriptor and this file has none (O_DIRECT refused or "
                                   "CKPTIO_OPT_DIRECT is off)");
        ckptio__cufile_handle h = NULL;
        if (!ckptio__cufile_handle_register(fd, &h, why, sizeof why))
            return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                   &((ckptio__err_ctx){.operation = "cuFileHandleRegister", .path = f->path,
                                                       .file_offset = -1}),
                                   "%s", why);
        uint64_t done = 0;
        ckptio_status st =
            ckptio__cufile_transfer(h, dir, ext[i].memory, ext[i].length, ext[i].file_offset, 0, f->path, &done);
        ckptio__cufile_handle_deregister(h);
        CKPTIO_FORWARD(st);
        if (done < ext[i].length)
            return CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED,
                                   &((ckptio__err_ctx){.operation = "cuFileRead", .path = f->path,
                                                       .file_offset = (int64_t)(ext[i].file_offset + done)}),
                                   "extent %zu: unexpected end of file (%llu of %llu bytes read)", i,
                                   (unsigned long long)done, (unsigned long long)ext[i].length);
        ckptio__engine_stats_add(f->engine, &(ckptio_stats){.bytes_cufile = ext[i].length});
    }
    return CKPTIO_OK;
}

/* ---- the engine's hand-off ------------------------------------------------------- */

ckptio_status ckptio__gpu_execute(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *extents,
                                  size_t count) {
    return ckptio__gpu_execute_observed(engine, dir, extents, count, NULL);
}

ckptio_status ckptio__gpu_execute_observed(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *extents,
                                           size_t count, const ckptio__observer *obs) {
    CKPTIO_RETURN_IF(!engine || (!extents && count), CKPTIO_E_INVAL, "ckptio__gpu_execute: invalid arguments");
    const ckptio__gpu_ops *ops;
    CKPTIO_FORWARD(ckptio__gpu_ops_get(&ops));
    ckptio_status st = CKPTIO_OK;
    int *devices = ckptio__calloc(count ? count : 1, sizeof *devices);
    ckptio_extent *subset = NULL;
    if (!devices) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu GPU extents", count);
    bool several = false;
    int first_device = -1;
    /* The allocation the last extent was found in: the next ones inside it
     * (a column slice has one extent per row) need no driver call. */
    uintptr_t known_base = 0, known_end = 0;
    int known_device = -1;
    for (size_t i = 0; i < count; i++) {
        devices[i] = -1;
        if (!extents[i].length) continue;
        const uintptr_t m = (uintptr_t)extents[i].memory;
        if (m >= known_base && m < known_end) {
            devices[i] = known_device;
            if (devices[i] != first_device) several = true;
            continue;
        }
        ckptio_mem_kind kind = ops->classify(extents[i].memory, &devices[i]);
        if (kind != CKPTIO_MEM_CUDA) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                                 &((ckptio__err_ctx){.path = ckptio_file_path(extents[i].file),
                                                     .file_offset = (int64_t)extents[i].file_offset}),
                                 "extent %zu: memory %p was given as CUDA memory but the driver reports %s memory", i,
                                 extents[i].memory, kind == CKPTIO_MEM_PINNED ? "pinned host" : "host (or unknown)");
            goto out;
        }
        if (first_device < 0) first_device = devices[i];
        else if (devices[i] != first_device) several = true;
        uint64_t size = 0;
        ckptio__error_saved *saved = ckptio__error_save(); /* a lookup failure is the pipeline's to report */
        if (ops->mem_range(extents[i].memory, &known_base, &size) == CKPTIO_OK) {
            known_end = known_base + size;
            known_device = devices[i];
        } else {
            known_base = known_end = 0;
        }
        ckptio__error_restore(saved);
    }
    if (first_device < 0) goto out; /* nothing to move */

    const int64_t path = ckptio__engine_setting(engine, CKPTIO_OPT_GPU_PATH);
    ckptio__gpu_state *gs;
    if ((st = ckptio__gpu_state_get(engine, ops, &gs)) != CKPTIO_OK) goto out;
    /* cuFile only with the real driver, and in AUTO only where it runs in
     * GPUDirect mode: its compatibility mode is a plain bounce-buffer path
     * slower than the pipeline. */
    const bool real = ops == ckptio__gpu_cuda_ops();
    if (obs && path == CKPTIO_GPU_PATH_CUFILE) {
        /* cuFile moves the bytes without a host copy to observe. */
        st = CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED,
                         "this write needs its GPU bytes checksummed on the pinned staging copy, which cuFile does "
                         "not make; use CKPTIO_GPU_PATH_AUTO or PIPELINE");
        goto out;
    }
    if (!obs && (path == CKPTIO_GPU_PATH_CUFILE ||
                 (path == CKPTIO_GPU_PATH_AUTO && real && ckptio__cufile_direct_mode()))) {
        if (!real) {
            st = CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "cuFile cannot run on the %s device", ops->name);
            goto out;
        }
        const bool nvtx = ckptio__engine_setting(engine, CKPTIO_OPT_NVTX) != 0;
        ckptio__nvtx_push(nvtx, "ckptio: cuFile");
        st = cufile_extents(dir, extents, count);
        ckptio__nvtx_pop(nvtx);
        if (st == CKPTIO_OK) {
            gs->last_path = ckptio__cufile_direct_mode() ? CKPTIO_IO_PATH_CUFILE_DIRECT : CKPTIO_IO_PATH_CUFILE_COMPAT;
            goto out;
        }
        if (path == CKPTIO_GPU_PATH_CUFILE || st != CKPTIO_E_UNSUPPORTED) goto out;
        st = CKPTIO_OK; /* AUTO: cuFile refused the file; fall back quietly */
    }

    if (!several) {
        st = ckptio__gpu_pipeline_run_observed(engine, ops, first_device, dir, extents, count, false, obs);
    } else {
        /* One device at a time; other devices' extents are hidden by a zero
         * length so that extent numbers in messages stay the caller's. */
        subset = ckptio__malloc(count * sizeof *subset);
        if (!subset) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu GPU extents", count);
            goto out;
        }
        for (size_t i = 0; i < count && st == CKPTIO_OK; i++) {
            if (devices[i] < 0) continue;
            const int dev = devices[i];
            uint64_t bytes = 0;
            for (size_t j = 0; j < count; j++) {
                subset[j] = extents[j];
                if (devices[j] != dev) subset[j].length = 0;
                else if (j >= i) devices[j] = -1; /* done after this round */
                bytes += subset[j].length;
            }
            st = ckptio__gpu_pipeline_run_observed(engine, ops, dev, dir, subset, count, false, obs);
            ckptio__engine_progress_advance(engine, bytes);
        }
    }
    if (st == CKPTIO_OK) gs->last_path = CKPTIO_IO_PATH_PIPELINE;
out:
    ckptio__free(subset);
    ckptio__free(devices);
    return st;
}
