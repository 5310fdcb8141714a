/*
 * _ckptio_file.c - ckptio._ckptio.File: a ckptio_file and transfers of
 * extents (file range <-> host or GPU memory) through a plan executed by the
 * file's engine. This is what ckptio.GdsFile's load_storage/save_storage run
 * on: the engine picks O_DIRECT, bounce buffers and the GPU path.
 */
#include "_ckptio_internal.h"

#include <string.h>

typedef struct ckpy_file {
    PyObject_HEAD
    ckptio_file *file;       /* NULL once closed */
    ckpy_engine *engine;     /* strong reference: the file was opened with it */
    PyThread_type_lock lock; /* one C call on the file at a time */
    PyObject *path;          /* str */
    unsigned flags;
} ckpy_file;

static PyTypeObject *file_type = NULL;

static PyObject *file_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "flags", "engine", NULL};
    PyObject *path_arg, *engine_arg = Py_None;
    unsigned int flags;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OI|O:File", kwlist, &path_arg, &flags, &engine_arg)) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    ckpy_file *self = (ckpy_file *)alloc(type, 0);
    if (!self) return NULL;
    self->file = NULL;
    self->engine = NULL;
    self->path = NULL;
    self->flags = flags;
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    PyObject *pb = ckpy_path_bytes(path_arg);
    if (!pb) goto fail;
    self->path = PyUnicode_DecodeFSDefault(PyBytes_AsString(pb));
    self->engine = ckpy_engine_resolve(engine_arg);
    if (!self->path || !self->engine) {
        Py_DECREF(pb);
        goto fail;
    }
    const char *cpath = PyBytes_AsString(pb);
    ckptio_status st;
    ckptio_file *f = NULL;
    ckptio_engine *engine = self->engine->engine;
    PyThread_type_lock elock = self->engine->lock;
    Py_BEGIN_ALLOW_THREADS
    ckpy_lock_nogil(elock);
    st = ckptio_file_open(engine, cpath, flags, &f);
    PyThread_release_lock(elock);
    Py_END_ALLOW_THREADS
    Py_DECREF(pb);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        goto fail;
    }
    self->file = f;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static void file_dealloc(PyObject *obj) {
    ckpy_file *self = (ckpy_file *)obj;
    if (self->file) ckptio_file_close(self->file); /* an uncommitted atomic write is discarded */
    self->file = NULL;
    Py_CLEAR(self->engine);
    Py_CLEAR(self->path);
    if (self->lock) PyThread_free_lock(self->lock);
    ckpy_free_object(obj);
}

/* Runs `fn` with the GIL released and the file and engine locks held. */
typedef ckptio_status (*file_op)(ckpy_file *self, void *arg);

static int run_locked(ckpy_file *self, file_op fn, void *arg) {
    ckptio_status st = CKPTIO_OK;
    int was_closed = 0;
    Py_BEGIN_ALLOW_THREADS
    ckpy_lock_nogil(self->lock);
    if (!self->file) {
        was_closed = 1;
    } else {
        ckpy_lock_nogil(self->engine->lock);
        st = fn(self, arg);
        PyThread_release_lock(self->engine->lock);
    }
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    if (was_closed) {
        PyErr_Format(PyExc_ValueError, "I/O operation on a closed ckptio file (%U)", self->path);
        return -1;
    }
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        return -1;
    }
    return 0;
}

/* ---- transfers ------------------------------------------------------------ */

typedef struct transfer_args {
    ckptio_direction dir;
    ckptio_extent *extents;
    size_t count;
} transfer_args;

static ckptio_status do_transfer(ckpy_file *self, void *arg) {
    transfer_args *a = arg;
    ckptio_plan *plan = NULL;
    ckptio_status st = ckptio_plan_create(a->dir, &plan);
    for (size_t i = 0; st == CKPTIO_OK && i < a->count; i++) {
        a->extents[i].file = self->file;
        st = ckptio_plan_add(plan, &a->extents[i]);
    }
    if (st == CKPTIO_OK) st = ckptio_engine_execute(self->engine->engine, plan);
    ckptio_plan_destroy(plan); /* keeps the first error: destroy does not fail on a valid plan */
    return st;
}

static int parse_extent(PyObject *item, ckptio_extent *e) {
    PyObject *addr_o, *len_o, *off_o, *kind_o;
    uint64_t addr;
    if (!PyArg_ParseTuple(item, "OOOO:extent", &addr_o, &len_o, &off_o, &kind_o)) return -1;
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

static PyObject *transfer(ckpy_file *self, ckptio_direction dir, PyObject *seq) {
    if (!PySequence_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, "extents must be a sequence of (address, nbytes, file_offset, mem_kind)");
        return NULL;
    }
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return NULL;
    ckptio_extent *extents = PyMem_Calloc(n ? (size_t)n : 1, sizeof *extents);
    if (!extents) return PyErr_NoMemory();
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (!item) goto out;
        int rc = parse_extent(item, &extents[i]);
        Py_DECREF(item);
        if (rc < 0) goto out;
    }
    transfer_args a = {dir, extents, (size_t)n};
    if (run_locked(self, do_transfer, &a) < 0) goto out;
    result = Py_None;
    Py_INCREF(result);
out:
    PyMem_Free(extents);
    return result;
}

static PyObject *file_read(PyObject *obj, PyObject *seq) {
    return transfer((ckpy_file *)obj, CKPTIO_READ, seq);
}

static PyObject *file_write(PyObject *obj, PyObject *seq) {
    return transfer((ckpy_file *)obj, CKPTIO_WRITE, seq);
}

/* ---- file state ------------------------------------------------------------ */

static ckptio_status do_size(ckpy_file *self, void *arg) {
    return ckptio_file_size(self->file, arg);
}

static PyObject *file_size(PyObject *obj, PyObject *unused) {
    uint64_t size = 0;
    if (run_locked((ckpy_file *)obj, do_size, &size) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(size);
}

static ckptio_status do_truncate(ckpy_file *self, void *arg) {
    return ckptio_file_truncate(self->file, *(uint64_t *)arg);
}

static PyObject *file_truncate(PyObject *obj, PyObject *arg) {
    uint64_t size;
    if (ckpy_u64(arg, "size", &size) < 0) return NULL;
    if (run_locked((ckpy_file *)obj, do_truncate, &size) < 0) return NULL;
    Py_RETURN_NONE;
}

static ckptio_status do_commit(ckpy_file *self, void *arg) {
    return ckptio_file_commit(self->file);
}

static PyObject *file_commit(PyObject *obj, PyObject *unused) {
    if (run_locked((ckpy_file *)obj, do_commit, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static ckptio_status do_is_direct(ckpy_file *self, void *arg) {
    return ckptio_file_is_direct(self->file, arg);
}

static PyObject *file_is_direct(PyObject *obj, PyObject *unused) {
    int direct = 0;
    if (run_locked((ckpy_file *)obj, do_is_direct, &direct) < 0) return NULL;
    return PyBool_FromLong(direct);
}

static PyObject *file_close(PyObject *obj, PyObject *unused) {
    ckpy_file *self = (ckpy_file *)obj;
    ckptio_status st = CKPTIO_OK;
    Py_BEGIN_ALLOW_THREADS
    ckpy_lock_nogil(self->lock); /* waits for a transfer on another thread */
    if (self->file) st = ckptio_file_close(self->file);
    self->file = NULL;
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *file_enter(PyObject *obj, PyObject *unused) {
    Py_INCREF(obj);
    return obj;
}

static PyObject *file_exit(PyObject *obj, PyObject *args) {
    PyObject *r = file_close(obj, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *get_path(PyObject *obj, void *c) {
    PyObject *v = ((ckpy_file *)obj)->path;
    Py_INCREF(v);
    return v;
}

static PyObject *get_closed(PyObject *obj, void *c) {
    return PyBool_FromLong(((ckpy_file *)obj)->file == NULL);
}

static PyObject *get_flags(PyObject *obj, void *c) {
    return PyLong_FromUnsignedLong(((ckpy_file *)obj)->flags);
}

static PyObject *get_engine(PyObject *obj, void *c) {
    PyObject *e = (PyObject *)((ckpy_file *)obj)->engine;
    Py_INCREF(e);
    return e;
}

static PyGetSetDef file_getset[] = {
    {"path", get_path, NULL, "The path given at open.", NULL},
    {"closed", get_closed, NULL, "True after close().", NULL},
    {"flags", get_flags, NULL, "The CKPTIO_OPEN_* flags given at open.", NULL},
    {"engine", get_engine, NULL, "The engine the file was opened with.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef file_methods[] = {
    {"read", file_read, METH_O,
     "read(extents): file -> memory for a sequence of (address, nbytes, file_offset, mem_kind),\n"
     "one plan on the engine, GIL released. Reading past the end of the file fails."},
    {"write", file_write, METH_O, "write(extents): memory -> file, same extents as read()."},
    {"size", file_size, METH_NOARGS, "size() -> int: current size in bytes."},
    {"truncate", file_truncate, METH_O, "truncate(size): sets the file's size."},
    {"commit", file_commit, METH_NOARGS, "commit(): atomic writes: fsync, rename over the final name."},
    {"is_direct", file_is_direct, METH_NOARGS, "is_direct() -> bool: whether O_DIRECT is in use."},
    {"close", file_close, METH_NOARGS, "close(): closes; an uncommitted atomic write is discarded."},
    {"__enter__", file_enter, METH_NOARGS, NULL},
    {"__exit__", file_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot file_slots[] = {
    {Py_tp_new, file_new},
    {Py_tp_dealloc, file_dealloc},
    {Py_tp_methods, file_methods},
    {Py_tp_getset, file_getset},
    {Py_tp_doc, "File(path, flags, engine=None): a ckptio file (flags: OPEN_READ | OPEN_WRITE | ...)."},
    {0, NULL},
};

static PyType_Spec file_spec = {
    "ckptio._ckptio.File",
    sizeof(ckpy_file),
    0,
    Py_TPFLAGS_DEFAULT,
    file_slots,
};

int ckpy_file_add_to_module(PyObject *module) {
    file_type = (PyTypeObject *)PyType_FromSpec(&file_spec);
    if (!file_type) return -1;
    if (PyModule_AddObject(module, "File", (PyObject *)file_type) < 0) {
        Py_DECREF(file_type);
        return -1;
    }
    return 0;
}

ckptio_file *ckpy_file_handle(PyObject *obj) {
    if (!file_type || !PyObject_TypeCheck(obj, file_type)) {
        PyErr_Format(PyExc_TypeError, "expected a ckptio._ckptio.File, not %R", (PyObject *)Py_TYPE(obj));
        return NULL;
    }
    ckpy_file *self = (ckpy_file *)obj;
    if (!self->file) PyErr_Format(PyExc_ValueError, "I/O operation on a closed ckptio file (%U)", self->path);
    return self->file;
}
