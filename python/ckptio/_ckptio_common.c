/*
 * _ckptio_common.c - sequences the extension's types and functions share:
 * running a C call with the GIL released under the engine's lock, the life
 * of an object wrapping one C handle (open, calls under its locks, close,
 * context manager, path/closed), and parsing read targets and extents.
 *
 * Keeping them here means the locking order (object lock, then engine lock,
 * both taken with the GIL released) is written once.
 */
#include "_ckptio_internal.h"

PyObject *ckpy_int64_tuple(const int64_t *v, uint32_t n) {
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (!t) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong((long long)v[i]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SetItem(t, (Py_ssize_t)i, x);
    }
    return t;
}

int ckpy_engine_run(ckpy_engine *engine, ckpy_engine_op fn, void *arg) {
    ckptio_status st;
    ckptio_engine *e = engine->engine;
    PyThread_type_lock elock = engine->lock;
    Py_BEGIN_ALLOW_THREADS
    ckpy_lock_nogil(elock);
    st = fn(e, arg);
    PyThread_release_lock(elock);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) {
        ckpy_raise(st); /* same thread, right after the failure */
        return -1;
    }
    return 0;
}

/* ---- parsing ------------------------------------------------------------------ */

ckptio_tensor_target *ckpy_parse_targets(PyObject *seq, const char *not_sequence, size_t *count) {
    if (!PySequence_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, not_sequence);
        return NULL;
    }
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return NULL;
    ckptio_tensor_target *targets = PyMem_Calloc(n ? (size_t)n : 1, sizeof *targets);
    if (!targets) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (!item) goto fail;
        PyObject *index_o, *addr_o, *cap_o, *kind_o;
        uint64_t index, addr, cap;
        int ok = PyArg_ParseTuple(item, "OOOO:read target", &index_o, &addr_o, &cap_o, &kind_o) &&
                 ckpy_u64(index_o, "target index", &index) == 0 && ckpy_u64(addr_o, "target address", &addr) == 0 &&
                 ckpy_u64(cap_o, "target capacity", &cap) == 0 && ckpy_mem_kind(kind_o, &targets[i].mem_kind) == 0;
        Py_DECREF(item);
        if (!ok) goto fail;
        targets[i].index = (size_t)index;
        targets[i].data = (void *)(uintptr_t)addr;
        targets[i].capacity = cap;
    }
    *count = (size_t)n;
    return targets;
fail:
    PyMem_Free(targets);
    return NULL;
}

int ckpy_parse_extent(PyObject *addr_o, PyObject *len_o, PyObject *off_o, PyObject *kind_o, ckptio_extent *e) {
    uint64_t addr;
    if (ckpy_u64(addr_o, "address", &addr) < 0 || ckpy_u64(len_o, "nbytes", &e->length) < 0 ||
        ckpy_u64(off_o, "file offset", &e->file_offset) < 0 || ckpy_mem_kind(kind_o, &e->mem_kind) < 0)
        return -1;
    if (addr == 0 && e->length != 0) {
        PyErr_SetString(PyExc_ValueError, "address 0 with a non-zero length");
        return -1;
    }
    e->memory = (void *)(uintptr_t)addr;
    return 0;
}

ckptio_status ckpy_run_plan(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *extents, size_t count) {
    ckptio_plan *plan = NULL;
    ckptio_status st = ckptio_plan_create(dir, &plan);
    for (size_t i = 0; st == CKPTIO_OK && i < count; i++) st = ckptio_plan_add(plan, &extents[i]);
    if (st == CKPTIO_OK) st = ckptio_engine_execute(engine, plan);
    ckptio_plan_destroy(plan); /* keeps the first error: destroy does not fail on a valid plan */
    return st;
}

/* ---- handle objects ------------------------------------------------------------- */

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
    if (self->lock) PyThread_free_lock(self->lock);
    ckpy_free_object(obj);
}

PyObject *ckpy_handle_closed_error(ckpy_handle *self) {
    PyErr_Format(PyExc_ValueError, "I/O operation on a closed %s (%U)", self->kind->what, self->path);
    return NULL;
}

int ckpy_handle_run(ckpy_handle *self, ckpy_handle_op fn, void *arg) {
    ckptio_status st = CKPTIO_OK;
    int was_closed = 0;
    Py_BEGIN_ALLOW_THREADS
    ckpy_lock_nogil(self->lock);
    if (!self->handle) {
        was_closed = 1;
    } else {
        ckpy_lock_nogil(self->engine->lock);
        st = fn(self, arg);
        PyThread_release_lock(self->engine->lock);
    }
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    if (was_closed) {
        ckpy_handle_closed_error(self);
        return -1;
    }
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        return -1;
    }
    return 0;
}

PyObject *ckpy_handle_close(PyObject *obj, PyObject *unused) {
    ckpy_handle *self = (ckpy_handle *)obj;
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

/* A BYTES, STR or BIGINT node of a pickle value tree as bytes, str or int. */
PyObject *ckpy_value_bytes_like(const ckptio_value *v, ckptio_value_kind kind) {
    const char *data = NULL;
    size_t len = 0;
    ckptio_status st = ckptio_value_bytes(v, &data, &len);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    if (kind == CKPTIO_VALUE_BYTES) return PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    if (kind == CKPTIO_VALUE_BIGINT) {
        /* int.from_bytes(data, "little", signed=True) */
        PyObject *b = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
        PyObject *fn = b ? PyObject_GetAttrString((PyObject *)&PyLong_Type, "from_bytes") : NULL;
        PyObject *a = fn ? Py_BuildValue("(Os)", b, "little") : NULL;
        PyObject *kw = a ? Py_BuildValue("{sO}", "signed", Py_True) : NULL;
        PyObject *r = kw ? PyObject_Call(fn, a, kw) : NULL;
        Py_XDECREF(b);
        Py_XDECREF(fn);
        Py_XDECREF(a);
        Py_XDECREF(kw);
        return r;
    }
    return PyUnicode_DecodeUTF8(data, (Py_ssize_t)len, "strict");
}
