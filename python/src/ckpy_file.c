/*
 * ckpy_file.c - ckptio._ckptio.File: a ckptio_file and transfers of
 * extents (file range <-> host or GPU memory) through a plan executed by the
 * file's engine. This is what ckptio.GdsFile's load_storage/save_storage run
 * on: the engine picks O_DIRECT, bounce buffers and the GPU path.
 */
#include "ckpy_file.h"
#include "ckpy_parts.h"

#include <stdio.h>
#include <string.h>

typedef struct ckpy_file {
    ckpy_handle h; /* h.handle: the ckptio_file, NULL once closed */
    unsigned flags;
} ckpy_file;

static PyTypeObject *file_type = NULL;

static ckptio_status open_handle(ckptio_engine *engine, const char *path, void *arg, void **handle) {
    ckptio_file *f = NULL;
    ckptio_status st = ckptio_file_open(engine, path, *(const unsigned *)arg, &f);
    *handle = f;
    return st;
}

static ckptio_status close_handle(ckpy_handle *h) {
    return ckptio_file_close(h->handle); /* an uncommitted atomic write is discarded */
}

static const ckpy_handle_kind file_kind = {"ckptio file", close_handle, 0};

static PyObject *file_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "flags", "engine", NULL};
    PyObject *path_arg, *engine_arg = Py_None;
    unsigned int flags;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OI|O:File", kwlist, &path_arg, &flags, &engine_arg)) return NULL;
    ckpy_file *self = (ckpy_file *)ckpy_handle_new(type, &file_kind, path_arg, engine_arg, open_handle, &flags);
    if (self) self->flags = flags;
    return (PyObject *)self;
}

/* ---- transfers ------------------------------------------------------------ */

typedef struct transfer_args {
    ckptio_direction dir;
    ckptio_extent *extents;
    size_t count;
} transfer_args;

static ckptio_status do_transfer(ckpy_handle *h, void *arg) {
    transfer_args *a = arg;
    for (size_t i = 0; i < a->count; i++) a->extents[i].file = h->handle;
    return ckptio_engine_execute_extents(h->engine->engine, a->dir, a->extents, a->count);
}

static int parse_extent(PyObject *item, ckptio_extent *e) {
    PyObject *addr_o, *len_o, *off_o, *kind_o;
    if (!PyArg_ParseTuple(item, "OOOO:extent", &addr_o, &len_o, &off_o, &kind_o)) return -1;
    return ckpy_parse_extent(addr_o, len_o, off_o, kind_o, e);
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
    if (ckpy_handle_run(&self->h, do_transfer, &a) < 0) goto out;
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

static ckptio_status do_size(ckpy_handle *h, void *arg) {
    return ckptio_file_size(h->handle, arg);
}

static PyObject *file_size(PyObject *obj, PyObject *unused) {
    uint64_t size = 0;
    if (ckpy_handle_run((ckpy_handle *)obj, do_size, &size) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(size);
}

typedef struct version_out {
    char etag[160];
} version_out;

static ckptio_status do_version(ckpy_handle *h, void *arg) {
    snprintf(((version_out *)arg)->etag, sizeof ((version_out *)arg)->etag, "%s", ckptio_file_version(h->handle));
    return CKPTIO_OK;
}

static PyObject *file_version(PyObject *obj, PyObject *unused) {
    version_out v = {{0}};
    if (ckpy_handle_run((ckpy_handle *)obj, do_version, &v) < 0) return NULL;
    return PyUnicode_DecodeLatin1(v.etag, (Py_ssize_t)strlen(v.etag), NULL);
}

static ckptio_status do_truncate(ckpy_handle *h, void *arg) {
    return ckptio_file_truncate(h->handle, *(uint64_t *)arg);
}

static PyObject *file_truncate(PyObject *obj, PyObject *arg) {
    uint64_t size;
    if (ckpy_u64(arg, "size", &size) < 0) return NULL;
    if (ckpy_handle_run((ckpy_handle *)obj, do_truncate, &size) < 0) return NULL;
    Py_RETURN_NONE;
}

static ckptio_status do_commit(ckpy_handle *h, void *arg) {
    return ckptio_file_commit(h->handle);
}

static PyObject *file_commit(PyObject *obj, PyObject *unused) {
    if (ckpy_handle_run((ckpy_handle *)obj, do_commit, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static ckptio_status do_is_direct(ckpy_handle *h, void *arg) {
    return ckptio_file_is_direct(h->handle, arg);
}

static PyObject *file_is_direct(PyObject *obj, PyObject *unused) {
    int direct = 0;
    if (ckpy_handle_run((ckpy_handle *)obj, do_is_direct, &direct) < 0) return NULL;
    return PyBool_FromLong(direct);
}

static PyObject *get_flags(PyObject *obj, void *c) {
    return PyLong_FromUnsignedLong(((ckpy_file *)obj)->flags);
}

static PyObject *get_engine(PyObject *obj, void *c) {
    PyObject *e = (PyObject *)((ckpy_file *)obj)->h.engine;
    Py_INCREF(e);
    return e;
}

static PyGetSetDef file_getset[] = {
    {"path", ckpy_handle_get_path, NULL, "The path given at open.", NULL},
    {"closed", ckpy_handle_get_closed, NULL, "True after close().", NULL},
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
    {"version", file_version, METH_NOARGS,
     "version() -> str: the ETag an object's reads name in If-Match (\"\" for a local file)."},
    {"truncate", file_truncate, METH_O, "truncate(size): sets the file's size."},
    {"commit", file_commit, METH_NOARGS, "commit(): atomic writes: fsync, rename over the final name."},
    {"is_direct", file_is_direct, METH_NOARGS, "is_direct() -> bool: whether O_DIRECT is in use."},
    {"close", ckpy_handle_close, METH_NOARGS, "close(): closes; an uncommitted atomic write is discarded."},
    {"__enter__", ckpy_handle_enter, METH_NOARGS, NULL},
    {"__exit__", ckpy_handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot file_slots[] = {
    {Py_tp_new, file_new},
    {Py_tp_dealloc, ckpy_handle_dealloc},
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

typedef struct dcp_open {
    const char *name;
    uint64_t size;
    const char *etag;
} dcp_open;

static ckptio_status open_dcp_handle(ckptio_engine *engine, const char *dir, void *arg, void **handle) {
    const dcp_open *d = arg;
    ckptio_file *f = NULL;
    ckptio_status st = ckptio_dcp_file_open_listed(engine, dir, d->name, d->size, d->etag, &f);
    *handle = f;
    return st;
}

PyObject *ckpy_file_open_dcp(PyObject *dir_arg, PyObject *relative_path, PyObject *engine_arg, uint64_t size,
                             const char *etag) {
    PyObject *name = ckpy_path_bytes(relative_path);
    if (!name) return NULL;
    dcp_open d = {PyBytes_AsString(name), size, etag};
    ckpy_file *self = (ckpy_file *)ckpy_handle_new(file_type, &file_kind, dir_arg, engine_arg, open_dcp_handle, &d);
    Py_DECREF(name);
    if (!self) return NULL;
    self->flags = CKPTIO_OPEN_READ;
    /* .path is the data file's, as for File(path). */
    PyObject *path = PyUnicode_DecodeFSDefault(ckptio_file_path(self->h.handle));
    if (!path) {
        Py_DECREF(self);
        return NULL;
    }
    PyObject *was = self->h.path;
    self->h.path = path;
    Py_XDECREF(was);
    return (PyObject *)self;
}

typedef struct window_open {
    void *buf;
    uint64_t len, got;
} window_open;

static ckptio_status open_window_handle(ckptio_engine *engine, const char *path, void *arg, void **handle) {
    window_open *w = arg;
    ckptio_file *f = NULL;
    ckptio_status st = ckptio_file_open_window(engine, path, w->buf, w->len, &w->got, &f);
    *handle = f;
    return st;
}

PyObject *ckpy_file_open_window(PyObject *path_arg, PyObject *addr_arg, PyObject *len_arg, PyObject *engine_arg) {
    window_open w = {0};
    uint64_t addr;
    if (ckpy_u64(addr_arg, "address", &addr) < 0 || ckpy_u64(len_arg, "length", &w.len) < 0) return NULL;
    w.buf = (void *)(uintptr_t)addr;
    ckpy_file *self = (ckpy_file *)ckpy_handle_new(file_type, &file_kind, path_arg, engine_arg, open_window_handle, &w);
    if (!self) return NULL;
    self->flags = CKPTIO_OPEN_READ;
    PyObject *out = Py_BuildValue("(OK)", (PyObject *)self, (unsigned long long)w.got);
    Py_DECREF(self);
    return out;
}

ckptio_file *ckpy_file_handle(PyObject *obj) {
    if (!file_type || !PyObject_TypeCheck(obj, file_type)) {
        PyErr_Format(PyExc_TypeError, "expected a ckptio._ckptio.File, not %R", (PyObject *)Py_TYPE(obj));
        return NULL;
    }
    ckpy_handle *self = (ckpy_handle *)obj;
    if (!self->handle) ckpy_handle_closed_error(self);
    return self->handle;
}
