/*
 * _ckptio_internal.h - what the files of the ckptio._ckptio extension share.
 *
 * The extension is built against CPython's stable ABI (Py_LIMITED_API
 * 3.8, an abi3 module), so one binary imports on every CPython >= 3.8. That
 * rules out the buffer protocol (limited API only from 3.11): Python code
 * hands memory over as integer addresses (tensor.data_ptr(),
 * ndarray.ctypes.data) and keeps the owning objects alive for the call.
 *
 * Every call that does I/O drops the GIL (Py_BEGIN_ALLOW_THREADS) and
 * serialises on the locks of the handles it uses instead, because a ckptio
 * handle is used by one thread at a time. Locks are only ever taken with the
 * GIL released and released before taking the GIL back, so the GIL and
 * these locks cannot deadlock. Order: reader/file lock, then engine lock.
 *
 * Such a call stays interruptible (Ctrl-C cancels a save or load instead of
 * letting it finish) and survives fork(): _ckptio_common.c has both.
 */
#ifndef CKPTIO_PY_INTERNAL_H
#define CKPTIO_PY_INTERNAL_H

#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x03080000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "ckptio.h"
/* The DCP writer, item reader and directory commit of ckptio.dcp are built on the experimental API. */
#include "ckptio_experimental.h"

#include <stdatomic.h>
#include <stdint.h>

/* ---- errors (_ckptio_module.c) ------------------------------------------ */

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

/* ---- engines (_ckptio_engine.c) ------------------------------------------ */

typedef struct ckpy_call ckpy_call;

typedef struct ckpy_engine {
    PyObject_HEAD
    ckptio_engine *engine;
    PyThread_type_lock lock;
    unsigned generation;         /* ckpy_fork_generation() of `lock` */
    _Atomic(ckpy_call *) call;   /* the call holding `lock`, or NULL */
} ckpy_engine;

extern PyTypeObject *ckpy_engine_type;

/* Resolves an `engine=` argument: None gives the module's default engine
 * (created on first use). @return a new reference, or NULL with an error. */
ckpy_engine *ckpy_engine_resolve(PyObject *arg);

int ckpy_engine_add_to_module(PyObject *module);

/* Frees the default engine (module teardown). */
void ckpy_engine_module_free(void);

/* ---- safetensors (_ckptio_safetensors.c) --------------------------------- */

int ckpy_safetensors_add_to_module(PyObject *module);
PyObject *ckpy_safetensors_save(PyObject *self, PyObject *args, PyObject *kwargs);

/* ---- files and extents (_ckptio_file.c) ---------------------------------- */

int ckpy_file_add_to_module(PyObject *module);

/* The ckptio_file of a File object, or NULL with TypeError/ValueError (not
 * a File, or closed). The caller must not let the File be closed while it
 * uses the handle (the DCP code owns the Files it passes). */
ckptio_file *ckpy_file_handle(PyObject *obj);

/* A read-only File for the data file `relative_path` of the DCP directory
 * `dir` (ckptio_dcp_file_open: refused unless the name stays inside dir). */
PyObject *ckpy_file_open_dcp(PyObject *dir_arg, PyObject *relative_path, PyObject *engine_arg);

/* ---- torch.distributed.checkpoint items (_ckptio_dcp.c) ------------------- */

int ckpy_dcp_add_to_module(PyObject *module);

/* ---- any checkpoint into any format (_ckptio_convert.c) ------------------- */

int ckpy_convert_add_to_module(PyObject *module);

/* ---- the DCP directory commit (_ckptio_dcp_commit.c) ---------------------- */

int ckpy_dcp_commit_add_to_module(PyObject *module);

/* ---- the checkpoint manager's steps (_ckptio_steps.c) -------------------- */

int ckpy_steps_add_to_module(PyObject *module);

/* ---- snapshot pools (_ckptio_snapshot.c) ----------------------------------- */

int ckpy_snapshot_add_to_module(PyObject *module);

/* ---- GDS file API and CUDA queries (_ckptio_gds.c) ------------------------ */

int ckpy_gds_add_to_module(PyObject *module);

/* ---- mapped files (_ckptio_mapping.c) ------------------------------------ */

int ckpy_mapping_add_to_module(PyObject *module);

/* A Mapping object owning `mapping` (released on failure too). */
PyObject *ckpy_mapping_wrap(ckptio_mapping *mapping);

/* ---- torch.save checkpoints (_ckptio_torch.c, _ckptio_torch_save.c) ------- */

int ckpy_torch_add_to_module(PyObject *module);
PyObject *ckpy_torch_save(PyObject *self, PyObject *args, PyObject *kwargs);

/* ---- helpers (_ckptio_module.c) ------------------------------------------- */

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

/* ---- calls: interruptible, fork-safe (_ckptio_common.c) ------------------- */

/* The engine's progress callback (ckptio_progress_fn, user = the
 * ckpy_engine), installed on every engine the extension creates: during a
 * call made on the main thread, it runs the Python signal handlers every
 * few tens of milliseconds (taking the GIL for that moment only) and
 * cancels the transfer when one raises (Ctrl-C's KeyboardInterrupt). */
int ckpy_progress(uint64_t done, uint64_t total, void *user);

/* set_progress(callable_or_None) -> the previous one: the Python callable
 * (done, total) that this thread's following calls report their progress
 * to through ckpy_progress (GIL taken for each report; an exception it
 * raises cancels the call and is raised by it). */
PyObject *ckpy_set_progress(PyObject *module, PyObject *callable);

/* Registers the fork handler (module init). */
void ckpy_fork_watch(void);

/* How many fork()s separate this process from the one that loaded the
 * extension; objects record it with their locks. */
unsigned ckpy_fork_generation(void);

/* Call with the GIL held before taking the engine's lock: in a fork()ed
 * child, replaces a lock inherited from the parent (a parent thread inside
 * a call at fork() would hold it forever). -1 with an error. */
int ckpy_engine_fork_check(ckpy_engine *engine);

/* ---- shared sequences (_ckptio_common.c) ---------------------------------- */

/* A tuple of Python ints from `n` int64 values (shapes, strides). */
PyObject *ckpy_int64_tuple(const int64_t *v, uint32_t n);

/* A BYTES, STR or BIGINT node of a pickle value tree (ckptio_value) as a Python
 * bytes, str or int; raises and returns NULL on failure. */
PyObject *ckpy_value_bytes_like(const ckptio_value *v, ckptio_value_kind kind);

/* Runs fn(engine->engine, arg) with the GIL released and the engine's lock
 * held. @return 0, or -1 with the ckptio exception of its failure raised. */
typedef ckptio_status (*ckpy_engine_op)(ckptio_engine *engine, void *arg);
int ckpy_engine_run(ckpy_engine *engine, ckpy_engine_op fn, void *arg);

/* Parses a sequence of (index, address, capacity, mem_kind) read targets
 * into a PyMem array (the caller frees it) of *count entries; NULL with an
 * error otherwise, TypeError `not_sequence` if `seq` is not a sequence. */
ckptio_tensor_target *ckpy_parse_targets(PyObject *seq, const char *not_sequence, size_t *count);

/* Fills an extent's memory side and file offset from Python values
 * (address, nbytes, file offset, mem_kind); -1 with an error. */
int ckpy_parse_extent(PyObject *addr_o, PyObject *len_o, PyObject *off_o, PyObject *kind_o, ckptio_extent *e);

/* ---- objects wrapping one C handle opened through an engine ------------------
 * (SafetensorsReader, TorchReader, File, GdsHandle; _ckptio_common.c). Their
 * structs start with a ckpy_handle; the handle's lock serialises the C calls
 * on it, taken before the engine's lock (see the top of this file). */

typedef struct ckpy_handle ckpy_handle;

typedef struct ckpy_handle_kind {
    const char *what; /* "I/O operation on a closed <what> (<path>)" */
    /* Closes self->handle (non-NULL); called with the GIL released and the
     * object's lock held by close(), with neither lock held by dealloc. */
    ckptio_status (*close)(ckpy_handle *self);
    int dealloc_drops_gil; /* dealloc closes with the GIL released */
} ckpy_handle_kind;

struct ckpy_handle {
    PyObject_HEAD
    void *handle;            /* the C handle; NULL once closed */
    ckpy_engine *engine;     /* strong reference: the handle was opened with it */
    PyThread_type_lock lock; /* one C call on the handle at a time */
    PyObject *path;          /* str: the path given at open */
    const ckpy_handle_kind *kind;
    unsigned generation;     /* ckpy_fork_generation() of `lock` */
};

/* Opens with fn(engine, path, arg, &handle), called with the GIL released
 * and the engine's lock held. */
typedef ckptio_status (*ckpy_open_op)(ckptio_engine *engine, const char *path, void *arg, void **handle);

/* Allocates an object of `type` (whose struct starts with a ckpy_handle; the
 * rest is zeroed), converts `path_arg`, resolves `engine_arg` and opens.
 * @return a new reference, or NULL with an error (the object released). */
ckpy_handle *ckpy_handle_new(PyTypeObject *type, const ckpy_handle_kind *kind, PyObject *path_arg,
                             PyObject *engine_arg, ckpy_open_op open, void *arg);

/* tp_new of a reader: parses (path, engine=None) with `format` ("O|O:Name"),
 * opens, then fills the type's own fields with describe(self) (GIL held;
 * -1 with an error). @return a new reference, or NULL with an error. */
PyObject *ckpy_reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs, const char *format,
                          const ckpy_handle_kind *kind, ckpy_open_op open, int (*describe)(ckpy_handle *self));

/* Closes a handle still open and frees the object's ckpy_handle part and the
 * object; types with more references clear them first. Py_tp_dealloc. */
void ckpy_handle_dealloc(PyObject *obj);

/* Raises ValueError "I/O operation on a closed <what> (<path>)". @return NULL. */
PyObject *ckpy_handle_closed_error(ckpy_handle *self);

/* Runs fn(self, arg) with the GIL released and the object's and engine's
 * locks held. @return 0, or -1 with an error (closed object, or the ckptio
 * exception of fn's failure). */
typedef ckptio_status (*ckpy_handle_op)(ckpy_handle *self, void *arg);
int ckpy_handle_run(ckpy_handle *self, ckpy_handle_op fn, void *arg);

/* Methods and getters every handle object has: close() (waits for a call in
 * flight; closing twice is a no-op), __enter__, __exit__ (closes), path and
 * closed. */
PyObject *ckpy_handle_close(PyObject *obj, PyObject *unused);
PyObject *ckpy_handle_enter(PyObject *obj, PyObject *unused);
PyObject *ckpy_handle_exit(PyObject *obj, PyObject *args);
PyObject *ckpy_handle_get_path(PyObject *obj, void *closure);
PyObject *ckpy_handle_get_closed(PyObject *obj, void *closure);

#endif /* CKPTIO_PY_INTERNAL_H */
