/*
 * ckpy_handle.h - objects wrapping one C handle opened through an engine
 * (ckpy_handle.c).
 */
#ifndef CKPY_HANDLE_H
#define CKPY_HANDLE_H

#include "ckpy_engine.h"

/* The objects (SafetensorsReader, TorchReader, File, GdsHandle): their
 * structs start with a ckpy_handle; the handle's lock serialises the C calls
 * on it, taken before the engine's lock (ckpy_internal.h). */

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

#endif /* CKPY_HANDLE_H */
