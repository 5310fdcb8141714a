/*
 * ckpy_handle.c - the life of an object wrapping one C handle opened
 * through an engine (SafetensorsReader, TorchReader, File, GdsHandle): open,
 * calls under its locks (the object's, then the engine's, both taken with
 * the GIL released: ckpy_call.c), close, context manager, path and closed.
 */
#include "ckpy_handle.h"

/* In a fork()ed child: the object's and its engine's locks made anew. */
static int handle_fork_check(ckpy_handle *h) {
    if (ckpy_fresh_lock(&h->lock, &h->generation) < 0) return -1;
    return h->engine ? ckpy_engine_fork_check(h->engine) : 0;
}

typedef struct open_call {
    ckpy_open_op fn;
    const char *path;
    void *arg;
    void *handle;
} open_call;

static ckptio_status do_open(ckptio_engine *engine, void *arg) {
    open_call *c = arg;
    return c->fn(engine, c->path, c->arg, &c->handle);
}

ckpy_handle *ckpy_handle_new(PyTypeObject *type, const ckpy_handle_kind *kind, PyObject *path_arg,
                             PyObject *engine_arg, ckpy_open_op open, void *arg) {
    /* tp_alloc (PyType_GenericAlloc) zeroes the object, so a failure below
     * deallocates a consistent one: no handle, NULL references. */
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    ckpy_handle *self = (ckpy_handle *)alloc(type, 0);
    if (!self) return NULL;
    self->handle = NULL;
    self->engine = NULL;
    self->path = NULL;
    self->kind = kind;
    self->generation = ckpy_fork_generation();
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject *pb = ckpy_path_bytes(path_arg);
    if (!pb) goto fail;
    self->path = PyUnicode_DecodeFSDefault(PyBytes_AsString(pb));
    self->engine = ckpy_engine_resolve(engine_arg);
    if (!self->path || !self->engine) {
        Py_DECREF(pb);
        goto fail;
    }
    open_call c = {open, PyBytes_AsString(pb), arg, NULL};
    int rc = ckpy_engine_run(self->engine, do_open, &c);
    Py_DECREF(pb);
    if (rc < 0) goto fail;
    self->handle = c.handle;
    return self;
fail:
    Py_DECREF(self);
    return NULL;
}

PyObject *ckpy_reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs, const char *format,
                          const ckpy_handle_kind *kind, ckpy_open_op open, int (*describe)(ckpy_handle *self)) {
    static char *kwlist[] = {"path", "engine", NULL};
    PyObject *path_arg, *engine_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, kwlist, &path_arg, &engine_arg)) return NULL;
    ckpy_handle *self = ckpy_handle_new(type, kind, path_arg, engine_arg, open, NULL);
    if (!self) return NULL;
    if (describe(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

void ckpy_handle_dealloc(PyObject *obj) {
    ckpy_handle *self = (ckpy_handle *)obj;
    /* Calls on the object hold a reference to it, so none is in flight. */
    if (self->handle) {
        /* An exception may be on its way through: keep it. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (handle_fork_check(self) < 0) PyErr_Clear(); /* out of memory: the old lock it is */
        PyErr_Restore(type, value, tb);
    }
    if (self->handle) {
        if (self->kind->dealloc_drops_gil) {
            /* Close may wait for requests in flight; not while holding the GIL. */
            Py_BEGIN_ALLOW_THREADS
            self->kind->close(self);
            Py_END_ALLOW_THREADS
        } else {
            self->kind->close(self);
        }
        self->handle = NULL;
    }
    Py_CLEAR(self->engine);
    Py_CLEAR(self->path);
    /* A lock inherited through fork() may be held by a vanished thread. */
    if (self->lock && self->generation == ckpy_fork_generation()) PyThread_free_lock(self->lock);
    ckpy_free_object(obj);
}

PyObject *ckpy_handle_closed_error(ckpy_handle *self) {
    PyErr_Format(PyExc_ValueError, "I/O operation on a closed %s (%U)", self->kind->what, self->path);
    return NULL;
}

int ckpy_handle_run(ckpy_handle *self, ckpy_handle_op fn, void *arg) {
    if (handle_fork_check(self) < 0 || ckpy_refuse_reentry(self->engine) < 0) return -1;
    ckptio_status st = CKPTIO_OK;
    int was_closed = 0;
    ckpy_call call;
    ckpy_call_begin(&call);
    ckpy_lock_nogil(self->lock);
    if (!self->handle) {
        was_closed = 1;
    } else {
        ckpy_lock_nogil(self->engine->lock);
        atomic_store(&self->engine->call, &call);
        st = fn(self, arg);
        atomic_store(&self->engine->call, NULL);
        PyThread_release_lock(self->engine->lock);
    }
    PyThread_release_lock(self->lock);
    if (was_closed) {
        PyEval_RestoreThread(call.tstate);
        ckpy_handle_closed_error(self);
        return -1;
    }
    return ckpy_call_end(&call, st);
}

PyObject *ckpy_handle_close(PyObject *obj, PyObject *unused) {
    ckpy_handle *self = (ckpy_handle *)obj;
    if (handle_fork_check(self) < 0 || ckpy_refuse_reentry(self->engine) < 0) return NULL;
    ckptio_status st = CKPTIO_OK;
    Py_BEGIN_ALLOW_THREADS
    ckpy_lock_nogil(self->lock); /* waits for a call in flight on another thread */
    if (self->handle) st = self->kind->close(self);
    self->handle = NULL;
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

PyObject *ckpy_handle_enter(PyObject *obj, PyObject *unused) {
    Py_INCREF(obj);
    return obj;
}

PyObject *ckpy_handle_exit(PyObject *obj, PyObject *args) {
    PyObject *r = ckpy_handle_close(obj, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

PyObject *ckpy_handle_get_path(PyObject *obj, void *closure) {
    PyObject *v = ((ckpy_handle *)obj)->path;
    Py_INCREF(v);
    return v;
}

PyObject *ckpy_handle_get_closed(PyObject *obj, void *closure) {
    return PyBool_FromLong(((ckpy_handle *)obj)->handle == NULL);
}
