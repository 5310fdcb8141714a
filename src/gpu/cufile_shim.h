/*
 * cufile_shim.h - cuFile (GPUDirect Storage), loaded at run time.
 *
 * ABI origin: cufile.h of the GDS/cuFile library (libcufile.so.0, CUDA 11.4
 * and later): CUfileError_t is { CUfileOpError err; CUresult cu_err; } (two
 * ints), CUfileDescr_t is { int type; union { int fd; void *handle; };
 * const void *fs_ops; }, CU_FILE_HANDLE_TYPE_OPAQUE_FD is 1, CU_FILE_SUCCESS
 * is 0 and cuFile's own error codes start at 5000.
 */
#ifndef CKPTIO_CUFILE_SHIM_H
#define CKPTIO_CUFILE_SHIM_H

#include "common_internal.h"

#include <sys/types.h>

typedef struct ckptio__cufile_error {
    int err;     /* CUfileOpError: 0 success, 5000+ cuFile errors */
    int cu_err;  /* CUresult when err is a CUDA driver error */
} ckptio__cufile_error;

typedef void *ckptio__cufile_handle;

/* Loads libcufile.so.0 (or CKPTIO_CUFILE_LIBRARY) and calls
 * cuFileDriverOpen, once per process. Returns true when cuFile can be
 * used; otherwise false and `why` says what refused. */
bool ckptio__cufile_ready(char *why, size_t cap);

/* True when the nvidia-fs kernel driver is loaded, i.e. cuFile would run
 * in GPUDirect mode rather than its POSIX compatibility mode. */
bool ckptio__cufile_direct_mode(void);

/* cuFileHandleRegister on an O_DIRECT descriptor. False + `why` on refusal. */
bool ckptio__cufile_handle_register(int fd, ckptio__cufile_handle *out, char *why, size_t cap);
void ckptio__cufile_handle_deregister(ckptio__cufile_handle handle);

/* cuFileRead / cuFileWrite: bytes moved, or -1 with *err set to an errno or a
 * cuFile error code (>= 5000). */
ssize_t ckptio__cufile_read(ckptio__cufile_handle h, void *base, size_t size, off_t file_offset, off_t buf_offset,
                            int *err);
ssize_t ckptio__cufile_write(ckptio__cufile_handle h, const void *base, size_t size, off_t file_offset,
                             off_t buf_offset, int *err);

/* cuFileBufRegister / Deregister; false + why on failure. */
bool ckptio__cufile_buf_register(const void *base, size_t length, char *why, size_t cap);
void ckptio__cufile_buf_deregister(const void *base);

/* A complete transfer with cuFileRead/cuFileWrite: loops over partial
 * transfers; a read stops early at end of file (*done tells how far).
 * Errors name the path, the offset reached and the cuFile/errno reason. */
ckptio_status ckptio__cufile_transfer(ckptio__cufile_handle h, ckptio_direction dir, void *base, uint64_t size,
                                      uint64_t file_offset, uint64_t buf_offset, const char *path, uint64_t *done);

/* Text for a cuFile error code or errno. */
const char *ckptio__cufile_strerror(int err, char *buf, size_t cap);

#endif /* CKPTIO_CUFILE_SHIM_H */
