/*
 * ckpy_file.h - what ckpy_file.c (File objects: a ckptio_file and extents)
 * offers the parts above it (ckpy_dcp.c).
 */
#ifndef CKPY_FILE_H
#define CKPY_FILE_H

#include "ckpy_handle.h"

/* The ckptio_file of a File object, or NULL with TypeError/ValueError (not
 * a File, or closed). The caller must not let the File be closed while it
 * uses the handle (the DCP code owns the Files it passes). */
ckptio_file *ckpy_file_handle(PyObject *obj);

/* A read-only File for the data file `relative_path` of the DCP directory
 * `dir` (ckptio_dcp_file_open_listed: refused unless the name stays inside
 * dir; `etag` non-NULL: an object of that size and ETag, opened with no request). */
PyObject *ckpy_file_open_dcp(PyObject *dir_arg, PyObject *relative_path, PyObject *engine_arg, uint64_t size,
                             const char *etag);

/* (File, got): a File opened for reading with its first min(length, size)
 * bytes read into the memory at `address` (ckptio_file_open_window: in object
 * storage one GET in place of HEAD + GET); got: how many. */
PyObject *ckpy_file_open_window(PyObject *path_arg, PyObject *addr_arg, PyObject *len_arg, PyObject *engine_arg);

#endif /* CKPY_FILE_H */
