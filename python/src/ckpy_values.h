/*
 * ckpy_values.h - errors as exceptions and Python values as C arguments
 * (ckpy_values.c, the bottom of the extension: it uses no other file).
 */
#ifndef CKPY_VALUES_H
#define CKPY_VALUES_H

#include "ckpy_internal.h"

/* ---- errors ------------------------------------------------------------- */

/* Resolves ckptio._errors.make_error (module init; -1 with an error) and
 * drops it (module teardown). */
int ckpy_errors_init(void);
void ckpy_errors_free(void);

/* Raises the ckptio exception for a failed C call: reads the calling
 * thread's ckptio_last_error() (call right after the failure, on the same
 * thread) and builds the exception through ckptio._errors.make_error().
 * @return NULL, so callers can `return ckpy_raise(st);`. */
PyObject *ckpy_raise(ckptio_status status);

/* Raises a ckptio exception for a failure found by the extension itself
 * (argument checks, a failed system call). `sys_errno` 0 = none,
 * `path` may be NULL, `offset` -1 = none. @return NULL. */
PyObject *ckpy_raise_custom(ckptio_status status, int sys_errno, const char *operation, const char *path,
                            int64_t offset, const char *fmt, ...);

/* ---- values ------------------------------------------------------------- */

/* None for NULL or "", else the text as str (filesystem encoding). */
PyObject *ckpy_str_or_none(const char *s);

/* Converts a str or os.PathLike to a new bytes object (filesystem encoding);
 * NULL with an error otherwise. */
PyObject *ckpy_path_bytes(PyObject *path);

/* Parses a Python int as an unsigned 64-bit value, or -1 with an error
 * naming `what`. */
int ckpy_u64(PyObject *obj, const char *what, uint64_t *out);

/* Parses a memory kind (an int 0..3: host, pinned, cuda, auto). */
int ckpy_mem_kind(PyObject *obj, ckptio_mem_kind *out);

/* Parses a dtype given as a name ("F32", "float32", "torch.float32"). */
int ckpy_dtype(PyObject *obj, ckptio_dtype *out);

/* Heap-type deallocation tail: frees the object and drops the type's
 * reference (required for PyType_FromSpec types). */
void ckpy_free_object(PyObject *self);

/* Acquires `lock`; must be called with the GIL released. */
void ckpy_lock_nogil(PyThread_type_lock lock);

/* ---- sequences ---------------------------------------------------------- */

/* A tuple of Python ints from `n` int64 values (shapes, strides). */
PyObject *ckpy_int64_tuple(const int64_t *v, uint32_t n);

/* A BYTES, STR or BIGINT node of a pickle value tree (ckptio_value) as a Python
 * bytes, str or int; raises and returns NULL on failure. */
PyObject *ckpy_value_bytes_like(const ckptio_value *v, ckptio_value_kind kind);

/* Parses a sequence of (index, address, capacity, mem_kind) read targets
 * into a PyMem array (the caller frees it) of *count entries; NULL with an
 * error otherwise, TypeError `not_sequence` if `seq` is not a sequence. */
ckptio_tensor_target *ckpy_parse_targets(PyObject *seq, const char *not_sequence, size_t *count);

/* Fills an extent's memory side and file offset from Python values
 * (address, nbytes, file offset, mem_kind); -1 with an error. */
int ckpy_parse_extent(PyObject *addr_o, PyObject *len_o, PyObject *off_o, PyObject *kind_o, ckptio_extent *e);

#endif /* CKPY_VALUES_H */
