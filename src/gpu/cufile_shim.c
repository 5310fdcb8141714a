/*
 * cufile_shim.c - libcufile.so.0 through dlopen (see cufile_shim.h for the
 * ABI). cuFile is only an option: every failure here becomes a reason text
 * and the caller decides whether that is an error (forced path) or a quiet
 * fallback to the pipeline (AUTO).
 */
#include "cufile_shim.h"
#include "engine_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cufile_descr {
    int type; /* CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1 */
    union {
        int fd;
        void *handle;
    } handle;
    const void *fs_ops;
} cufile_descr;

static struct {
    ckptio__cufile_error (*driver_open)(void);
    ckptio__cufile_error (*handle_register)(ckptio__cufile_handle *fh, cufile_descr *descr);
    void (*handle_deregister)(ckptio__cufile_handle fh);
    ckptio__cufile_error (*buf_register)(const void *base, size_t length, int flags);
    ckptio__cufile_error (*buf_deregister)(const void *base);
    ssize_t (*read)(ckptio__cufile_handle fh, void *base, size_t size, off_t file_offset, off_t buf_offset);
    ssize_t (*write)(ckptio__cufile_handle fh, const void *base, size_t size, off_t file_offset, off_t buf_offset);
} cf;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool ready;
static unsigned ready_generation; /* ckptio__fork_generation() of cuFileDriverOpen */
static char refusal[512];

static const char *const names[] = {
    "CU_FILE_DRIVER_NOT_INITIALIZED", "CU_FILE_DRIVER_INVALID_PROPS",  "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
    "CU_FILE_DRIVER_VERSION_MISMATCH", "CU_FILE_DRIVER_VERSION_READ_ERROR", "CU_FILE_DRIVER_CLOSING",
    "CU_FILE_PLATFORM_NOT_SUPPORTED", "CU_FILE_IO_NOT_SUPPORTED",       "CU_FILE_DEVICE_NOT_SUPPORTED",
    "CU_FILE_NVFS_DRIVER_ERROR",      "CU_FILE_CUDA_DRIVER_ERROR",      "CU_FILE_CUDA_POINTER_INVALID",
    "CU_FILE_CUDA_MEMORY_TYPE_INVALID", "CU_FILE_CUDA_POINTER_RANGE_ERROR", "CU_FILE_CUDA_CONTEXT_MISMATCH",
    "CU_FILE_INVALID_MAPPING_SIZE"};

const char *ckptio__cufile_strerror(int err, char *buf, size_t cap) {
    if (err > 5000 && err <= 5000 + (int)(sizeof names / sizeof names[0]))
        snprintf(buf, cap, "%s (%d)", names[err - 5001], err);
    else if (err >= 5000)
        snprintf(buf, cap, "cuFile error %d", err);
    else
        snprintf(buf, cap, "%s", strerror(err));
    return buf;
}

static bool sym(void *lib, const char *name, void *slot) {
    void *p = dlsym(lib, name);
    memcpy(slot, &p, sizeof p);
    if (!p) snprintf(refusal, sizeof refusal, "libcufile lacks %s", name);
    return p != NULL;
}

static void load(void) {
    const char *name = getenv(CKPTIO__ENV_CUFILE_LIBRARY); /* process-wide, read once: settings.c */
    if (!name || !name[0]) name = "libcufile.so.0";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        snprintf(refusal, sizeof refusal, "cuFile is not installed: dlopen(\"%s\") failed: %s", name,
                 why ? why : "unknown reason");
        return;
    }
    if (!sym(lib, "cuFileDriverOpen", &cf.driver_open) || !sym(lib, "cuFileHandleRegister", &cf.handle_register) ||
        !sym(lib, "cuFileHandleDeregister", &cf.handle_deregister) ||
        !sym(lib, "cuFileBufRegister", &cf.buf_register) || !sym(lib, "cuFileBufDeregister", &cf.buf_deregister) ||
        !sym(lib, "cuFileRead", &cf.read) || !sym(lib, "cuFileWrite", &cf.write)) {
        dlclose(lib);
        return;
    }
    ckptio__cufile_error e = cf.driver_open();
    if (e.err != 0) {
        char t[96];
        snprintf(refusal, sizeof refusal, "cuFileDriverOpen failed: %s (CUresult %d)",
                 ckptio__cufile_strerror(e.err, t, sizeof t), e.cu_err);
        dlclose(lib);
        return;
    }
    /* The driver stays open for the life of the process (as PyTorch does):
     * closing it while another user in the process relies on it is worse. */
    ready_generation = ckptio__fork_generation();
    ready = true;
}

/* Opened in the parent of a fork()ed child: the child must not call it. */
static bool usable(void) { return ready && !ckptio__forked_since(ready_generation); }

bool ckptio__cufile_ready(char *why, size_t cap) {
    pthread_once(&once, load);
    if (ready && !usable()) {
        if (why) snprintf(why, cap, "cuFile was opened before this process was fork()ed; a forked child cannot use it");
        return false;
    }
    if (!ready && why) snprintf(why, cap, "%s", refusal);
    return ready;
}

bool ckptio__cufile_direct_mode(void) {
    return access("/proc/driver/nvidia-fs/stats", R_OK) == 0 || access("/dev/nvidia-fs0", F_OK) == 0;
}

bool ckptio__cufile_handle_register(int fd, ckptio__cufile_handle *out, char *why, size_t cap) {
    if (!ckptio__cufile_ready(why, cap)) return false;
    cufile_descr d;
    memset(&d, 0, sizeof d);
    d.type = 1;
    d.handle.fd = fd;
    ckptio__cufile_error e = cf.handle_register(out, &d);
    if (e.err != 0) {
        char t[96];
        snprintf(why, cap,
                 "cuFileHandleRegister refused the file: %s (CUresult %d)%s",
                 ckptio__cufile_strerror(e.err, t, sizeof t), e.cu_err,
                 ckptio__cufile_direct_mode() ? ""
                                              : "; the nvidia-fs kernel driver is not loaded, so GPUDirect Storage is "
                                                "unavailable on this machine");
        return false;
    }
    return true;
}

void ckptio__cufile_handle_deregister(ckptio__cufile_handle handle) {
    if (usable() && handle) cf.handle_deregister(handle);
}

static ssize_t result(ssize_t n, int *err) {
    if (n >= 0) return n;
    *err = n == -1 ? errno : (int)-n; /* -1: errno; other negatives: -CUfileOpError */
    return -1;
}

ssize_t ckptio__cufile_read(ckptio__cufile_handle h, void *base, size_t size, off_t file_offset, off_t buf_offset,
                            int *err) {
    return result(cf.read(h, base, size, file_offset, buf_offset), err);
}

ssize_t ckptio__cufile_write(ckptio__cufile_handle h, const void *base, size_t size, off_t file_offset,
                             off_t buf_offset, int *err) {
    return result(cf.write(h, base, size, file_offset, buf_offset), err);
}

bool ckptio__cufile_buf_register(const void *base, size_t length, char *why, size_t cap) {
    if (!ckptio__cufile_ready(why, cap)) return false;
    ckptio__cufile_error e = cf.buf_register(base, length, 0);
    if (e.err != 0) {
        char t[96];
        snprintf(why, cap, "cuFileBufRegister(%p, %zu) failed: %s (CUresult %d)", base, length,
                 ckptio__cufile_strerror(e.err, t, sizeof t), e.cu_err);
        return false;
    }
    return true;
}

void ckptio__cufile_buf_deregister(const void *base) {
    if (usable()) cf.buf_deregister(base);
}

ckptio_status ckptio__cufile_transfer(ckptio__cufile_handle h, ckptio_direction dir, void *base, uint64_t size,
                                      uint64_t file_offset, uint64_t buf_offset, const char *path, uint64_t *done) {
    *done = 0;
    while (*done < size) {
        /* cuFile moves at most about 2 GiB per call on some versions. */
        const uint64_t want = size - *done < (1ull << 30) ? size - *done : (1ull << 30);
        int err = 0;
        const off_t foff = (off_t)(file_offset + *done), boff = (off_t)(buf_offset + *done);
        ssize_t n = dir == CKPTIO_READ ? ckptio__cufile_read(h, base, want, foff, boff, &err)
                                       : ckptio__cufile_write(h, base, want, foff, boff, &err);
        if (n < 0) {
            if (err == EINTR && !ckptio__interrupt_requested()) continue;
            char t[96];
            return CKPTIO_FAIL_CTX(err >= 5000 ? CKPTIO_E_IO : ckptio__status_from_errno(err),
                                   &((ckptio__err_ctx){.operation = dir == CKPTIO_READ ? "cuFileRead" : "cuFileWrite",
                                                       .path = path, .file_offset = (int64_t)foff}),
                                   "%llu of %llu bytes done: %s", (unsigned long long)*done,
                                   (unsigned long long)size, ckptio__cufile_strerror(err, t, sizeof t));
        }
        if (n == 0) {
            if (dir == CKPTIO_READ) break; /* end of file */
            return CKPTIO_FAIL_CTX(CKPTIO_E_IO,
                                   &((ckptio__err_ctx){.operation = "cuFileWrite", .path = path,
                                                       .file_offset = (int64_t)foff}),
                                   "cuFileWrite made no progress (%llu of %llu bytes done)",
                                   (unsigned long long)*done, (unsigned long long)size);
        }
        *done += (uint64_t)n;
    }
    return CKPTIO_OK;
}
