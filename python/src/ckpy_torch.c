/*
 * ckpy_torch.c - ckptio._ckptio.TorchReader: torch.save zip checkpoints
 * read through the C API (ckptio_torch_open/_read/_read_storages).
 *
 * The pickled object tree is rebuilt by tree(): containers and scalars
 * become Python objects here; tensors, dtypes, devices and OrderedDicts are
 * made by callbacks from the Python layer (which knows torch). A node
 * reachable along several paths becomes one Python object, as in pickle.
 */
#include "ckpy_handle.h"
#include "ckpy_mapping.h"
#include "ckpy_parts.h"

#include <string.h>

#define TREE_MAX_DEPTH 900

typedef struct ckpy_torch_reader {
    ckpy_handle h;           /* h.handle: the ckptio_torch, NULL once closed */
    PyObject *tensors;       /* list of tuples, see get_tensors */
    PyObject *storages;      /* list of tuples, see get_storages */
    unsigned long long alignment;
    PyObject *keep;          /* from_bytes: the bytes the handle points into */
} ckpy_torch_reader;

static PyTypeObject *reader_type = NULL;

static int describe(ckpy_handle *h) {
    ckpy_torch_reader *self = (ckpy_torch_reader *)h;
    const ckptio_torch *t = self->h.handle;
    size_t count = 0, scount = 0;
    uint64_t alignment = 0;
    ckptio_status st = ckptio_torch_count(t, &count);
    if (st == CKPTIO_OK) st = ckptio_torch_storage_count(t, &scount);
    if (st == CKPTIO_OK) st = ckptio_torch_alignment(t, &alignment);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        return -1;
    }
    self->alignment = (unsigned long long)alignment;
    self->tensors = PyList_New((Py_ssize_t)count);
    self->storages = PyList_New((Py_ssize_t)scount);
    if (!self->tensors || !self->storages) return -1;
    for (size_t i = 0; i < count; i++) {
        ckptio_torch_tensor_info ti;
        st = ckptio_torch_tensor(t, i, &ti);
        if (st != CKPTIO_OK) {
            ckpy_raise(st);
            return -1;
        }
        PyObject *shape = ckpy_int64_tuple(ti.shape, ti.ndim);
        PyObject *stride = shape ? ckpy_int64_tuple(ti.stride, ti.ndim) : NULL;
        if (!stride) {
            Py_XDECREF(shape);
            return -1;
        }
        /* Names are dict keys of the pickle: decoded as pickle does. */
        PyObject *name = PyUnicode_DecodeUTF8(ti.name, (Py_ssize_t)strlen(ti.name), "surrogatepass");
        if (!name) {
            Py_DECREF(shape);
            Py_DECREF(stride);
            return -1;
        }
        PyObject *row = Py_BuildValue("(NiNNKnOOOKK)", name, (int)ti.dtype, shape, stride,
                                      (unsigned long long)ti.storage_offset, (Py_ssize_t)ti.storage,
                                      ti.requires_grad ? Py_True : Py_False, ti.is_parameter ? Py_True : Py_False,
                                      ti.is_contiguous ? Py_True : Py_False, (unsigned long long)ti.file_offset,
                                      (unsigned long long)ti.nbytes);
        if (!row) return -1;
        PyList_SetItem(self->tensors, (Py_ssize_t)i, row);
    }
    for (size_t i = 0; i < scount; i++) {
        ckptio_torch_storage_info si;
        st = ckptio_torch_storage(t, i, &si);
        if (st != CKPTIO_OK) {
            ckpy_raise(st);
            return -1;
        }
        PyObject *row = Py_BuildValue("(ssiKKk)", si.key, si.location ? si.location : "cpu", (int)si.dtype,
                                      (unsigned long long)si.nbytes, (unsigned long long)si.file_offset,
                                      (unsigned long)si.crc32);
        if (!row) return -1;
        PyList_SetItem(self->storages, (Py_ssize_t)i, row);
    }
    return 0;
}

static ckptio_status open_handle(ckptio_engine *engine, const char *path, void *arg, void **handle) {
    ckptio_torch *t = NULL;
    ckptio_status st = ckptio_torch_open(engine, path, &t);
    *handle = t;
    return st;
}

static ckptio_status close_handle(ckpy_handle *h) {
    return ckptio_torch_close(h->handle);
}

static const ckpy_handle_kind reader_kind = {"torch checkpoint reader", close_handle, 0};

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    return ckpy_reader_new(type, args, kwargs, "O|O:TorchReader", &reader_kind, open_handle, describe);
}

static void reader_dealloc(PyObject *obj) {
    ckpy_torch_reader *self = (ckpy_torch_reader *)obj;
    Py_CLEAR(self->tensors);
    Py_CLEAR(self->storages);
    PyObject *keep = self->keep;
    self->keep = NULL;
    ckpy_handle_dealloc(obj); /* closes the handle before the bytes go */
    Py_XDECREF(keep);
}

typedef struct memory_arg {
    const char *data;
    Py_ssize_t len;
} memory_arg;

static ckptio_status parse_handle(ckptio_engine *engine, const char *what, void *arg, void **handle) {
    const memory_arg *m = arg;
    ckptio_torch *t = NULL;
    ckptio_status st = ckptio_torch_parse(m->data, (size_t)m->len, &t);
    *handle = t;
    return st;
}

/* TorchReader over a torch.save archive held in a bytes object (kept alive
 * by the reader): ckptio_torch_parse, the same restricted unpickler. */
static PyObject *mod_torch_reader_from_bytes(PyObject *module, PyObject *args) {
    PyObject *data, *what;
    if (!PyArg_ParseTuple(args, "SO:torch_reader_from_bytes", &data, &what)) return NULL;
    memory_arg m = {PyBytes_AsString(data), PyBytes_Size(data)};
    ckpy_torch_reader *self =
        (ckpy_torch_reader *)ckpy_handle_new(reader_type, &reader_kind, what, Py_None, parse_handle, &m);
    if (!self) return NULL;
    Py_INCREF(data);
    self->keep = data;
    if (describe(&self->h) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* ---- the object tree ------------------------------------------------------------ */

typedef struct tree_ctx {
    const ckptio_torch *t;
    PyObject *memo;        /* dict: node address -> Python object */
    PyObject *make_tensor; /* (tensor index) -> tensor */
    PyObject *make_dict;   /* (ordered: bool) -> empty dict / OrderedDict */
    PyObject *make_dtype;  /* (torch name) -> torch.dtype */
    PyObject *make_device; /* (text) -> torch.device */
    PyObject *set_attrs;   /* (obj, attrs dict) -> None */
    PyObject *make_size;   /* (tuple) -> torch.Size, or NULL: tuples stay tuples */
    PyObject *make_numpy;  /* (class name, args tuple) -> numpy value, or NULL: numpy values are refused */
} tree_ctx;

static PyObject *convert(tree_ctx *c, const ckptio_value *v, int depth);

static PyObject *value_error(ckptio_status st) {
    return ckpy_raise(st);
}

static PyObject *convert_container(tree_ctx *c, const ckptio_value *v, ckptio_value_kind kind, int depth) {
    size_t n = 0;
    ckptio_status st = ckptio_value_len(v, &n);
    if (st != CKPTIO_OK) return value_error(st);
    if (kind == CKPTIO_VALUE_DICT) {
        int ordered = 0;
        const ckptio_value *attrs = NULL;
        st = ckptio_value_dict_ordered(v, &ordered);
        if (st == CKPTIO_OK) st = ckptio_value_dict_attrs(v, &attrs);
        if (st != CKPTIO_OK) return value_error(st);
        PyObject *d = PyObject_CallFunction(c->make_dict, "O", ordered ? Py_True : Py_False);
        if (!d) return NULL;
        for (size_t i = 0; i < n; i++) {
            const ckptio_value *k = NULL, *item = NULL;
            st = ckptio_value_dict_item(v, i, &k, &item);
            if (st != CKPTIO_OK) {
                Py_DECREF(d);
                return value_error(st);
            }
            PyObject *pk = convert(c, k, depth + 1);
            PyObject *pv = pk ? convert(c, item, depth + 1) : NULL;
            int rc = pv ? PyObject_SetItem(d, pk, pv) : -1;
            Py_XDECREF(pk);
            Py_XDECREF(pv);
            if (rc < 0) {
                Py_DECREF(d);
                return NULL;
            }
        }
        if (attrs) {
            PyObject *pa = convert(c, attrs, depth + 1);
            PyObject *r = pa ? PyObject_CallFunction(c->set_attrs, "OO", d, pa) : NULL;
            Py_XDECREF(pa);
            if (!r) {
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(r);
        }
        return d;
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        const ckptio_value *item = NULL;
        st = ckptio_value_item(v, i, &item);
        PyObject *pi = st == CKPTIO_OK ? convert(c, item, depth + 1) : value_error(st);
        if (!pi) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, (Py_ssize_t)i, pi);
    }
    if (kind == CKPTIO_VALUE_LIST) return list;
    PyObject *r = kind == CKPTIO_VALUE_TUPLE ? PyList_AsTuple(list) : PySet_New(list);
    Py_DECREF(list);
    int is_size = 0;
    if (r && kind == CKPTIO_VALUE_TUPLE && c->make_size && ckptio_value_tuple_is_size(v, &is_size) == CKPTIO_OK &&
        is_size) {
        PyObject *size = PyObject_CallFunctionObjArgs(c->make_size, r, NULL);
        Py_DECREF(r);
        r = size;
    }
    return r;
}

static PyObject *convert_uncached(tree_ctx *c, const ckptio_value *v, int depth) {
    ckptio_value_kind kind = ckptio_value_kind_of(v);
    ckptio_status st;
    switch (kind) {
    case CKPTIO_VALUE_NONE: Py_RETURN_NONE;
    case CKPTIO_VALUE_BOOL: {
        int b = 0;
        st = ckptio_value_bool(v, &b);
        if (st != CKPTIO_OK) return value_error(st);
        return PyBool_FromLong(b);
    }
    case CKPTIO_VALUE_INT: {
        int64_t i = 0;
        st = ckptio_value_int(v, &i);
        if (st != CKPTIO_OK) return value_error(st);
        return PyLong_FromLongLong((long long)i);
    }
    case CKPTIO_VALUE_FLOAT: {
        double d = 0;
        st = ckptio_value_float(v, &d);
        if (st != CKPTIO_OK) return value_error(st);
        return PyFloat_FromDouble(d);
    }
    case CKPTIO_VALUE_BIGINT:
    case CKPTIO_VALUE_STR:
    case CKPTIO_VALUE_BYTES: return ckpy_value_bytes_like(v, kind);
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_TUPLE:
    case CKPTIO_VALUE_SET:
    case CKPTIO_VALUE_DICT: return convert_container(c, v, kind, depth);
    case CKPTIO_VALUE_TENSOR: {
        size_t index = 0;
        st = ckptio_value_tensor(v, &index);
        if (st != CKPTIO_OK) return value_error(st);
        return PyObject_CallFunction(c->make_tensor, "n", (Py_ssize_t)index);
    }
    case CKPTIO_VALUE_OBJECT: { /* here: a numpy value (ckptio_value_object; DCP metadata: ckpy_pickle.c) */
        const char *cls = NULL;
        const ckptio_value *args = NULL;
        st = ckptio_value_object(v, &cls, &args, NULL);
        if (st != CKPTIO_OK) return value_error(st);
        if (!c->make_numpy) {
            PyErr_Format(PyExc_TypeError, "ckptio: the object tree holds a %s and no make_numpy was given", cls);
            return NULL;
        }
        PyObject *pargs = convert(c, args, depth + 1);
        PyObject *r = pargs ? PyObject_CallFunction(c->make_numpy, "sO", cls, pargs) : NULL;
        Py_XDECREF(pargs);
        return r;
    }
    case CKPTIO_VALUE_DTYPE:
    case CKPTIO_VALUE_DEVICE: {
        PyObject *text = ckpy_value_bytes_like(v, CKPTIO_VALUE_STR);
        if (!text) return NULL;
        PyObject *r = PyObject_CallFunction(kind == CKPTIO_VALUE_DTYPE ? c->make_dtype : c->make_device, "O", text);
        Py_DECREF(text);
        return r;
    }
    }
    PyErr_Format(PyExc_RuntimeError, "ckptio: unknown value kind %d in the object tree", (int)kind);
    return NULL;
}

static PyObject *convert(tree_ctx *c, const ckptio_value *v, int depth) {
    if (depth > TREE_MAX_DEPTH) {
        PyErr_Format(PyExc_RecursionError, "checkpoint object tree nests deeper than %d levels", TREE_MAX_DEPTH);
        return NULL;
    }
    PyObject *key = PyLong_FromVoidPtr((void *)v);
    if (!key) return NULL;
    PyObject *hit = PyDict_GetItem(c->memo, key); /* borrowed */
    if (hit) {
        Py_DECREF(key);
        Py_INCREF(hit);
        return hit;
    }
    PyObject *r = convert_uncached(c, v, depth);
    if (r && PyDict_SetItem(c->memo, key, r) < 0) Py_CLEAR(r);
    Py_DECREF(key);
    return r;
}

static PyObject *reader_tree(PyObject *obj, PyObject *args, PyObject *kwargs) {
    ckpy_torch_reader *self = (ckpy_torch_reader *)obj;
    static char *kwlist[] = {"make_tensor", "make_dict", "make_dtype", "make_device", "set_attrs", "make_size",
                             "make_numpy", NULL};
    tree_ctx c;
    memset(&c, 0, sizeof c);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|OO:tree", kwlist, &c.make_tensor, &c.make_dict,
                                     &c.make_dtype, &c.make_device, &c.set_attrs, &c.make_size, &c.make_numpy))
        return NULL;
    if (c.make_size == Py_None) c.make_size = NULL;
    if (c.make_numpy == Py_None) c.make_numpy = NULL;
    if (!self->h.handle) return ckpy_handle_closed_error(&self->h);
    const ckptio_value *root = NULL;
    ckptio_status st = ckptio_torch_root(self->h.handle, &root);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    c.t = self->h.handle;
    c.memo = PyDict_New();
    if (!c.memo) return NULL;
    /* The callbacks run Python code but never close this reader: the GIL is
     * held throughout and close() needs it to start. */
    PyObject *r = convert(&c, root, 0);
    Py_DECREF(c.memo);
    return r;
}

/* ---- reading ----------------------------------------------------------------- */

typedef struct read_args {
    const ckptio_tensor_target *targets;
    size_t count;
    int storages;
} read_args;

static ckptio_status do_read(ckpy_handle *h, void *arg) {
    const read_args *a = arg;
    return a->storages ? ckptio_torch_read_storages(h->handle, a->targets, a->count)
                       : ckptio_torch_read(h->handle, a->targets, a->count);
}

static PyObject *read_common(ckpy_torch_reader *self, PyObject *seq, int storages) {
    read_args a;
    ckptio_tensor_target *targets =
        ckpy_parse_targets(seq, "targets must be a sequence of (index, address, capacity, mem_kind)", &a.count);
    if (!targets) return NULL;
    a.targets = targets;
    a.storages = storages;
    int rc = ckpy_handle_run(&self->h, do_read, &a);
    PyMem_Free(targets);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *reader_read(PyObject *obj, PyObject *seq) {
    return read_common((ckpy_torch_reader *)obj, seq, 0);
}

static PyObject *reader_read_storages(PyObject *obj, PyObject *seq) {
    return read_common((ckpy_torch_reader *)obj, seq, 1);
}

static ckptio_status do_verify(ckpy_handle *h, void *arg) {
    return ckptio_torch_verify(h->handle, arg);
}

static PyObject *reader_verify(PyObject *obj, PyObject *unused) {
    ckptio_torch_verify_report rep;
    memset(&rep, 0, sizeof rep);
    if (ckpy_handle_run((ckpy_handle *)obj, do_verify, &rep) < 0) return NULL;
    return Py_BuildValue("{snsnsnsK}", "records", (Py_ssize_t)rep.records, "crc_checked", (Py_ssize_t)rep.crc_checked,
                         "crc_absent", (Py_ssize_t)rep.crc_absent, "bytes", (unsigned long long)rep.bytes);
}

static ckptio_status do_map(ckpy_handle *h, void *arg) { return ckptio_torch_map(h->handle, arg); }

static PyObject *reader_map(PyObject *obj, PyObject *unused) {
    ckptio_mapping *m = NULL;
    if (ckpy_handle_run((ckpy_handle *)obj, do_map, &m) < 0) return NULL;
    return ckpy_mapping_wrap(m);
}

static PyObject *get_tensors(PyObject *obj, void *c) {
    return PyList_GetSlice(((ckpy_torch_reader *)obj)->tensors, 0, PY_SSIZE_T_MAX);
}

static PyObject *get_storages(PyObject *obj, void *c) {
    return PyList_GetSlice(((ckpy_torch_reader *)obj)->storages, 0, PY_SSIZE_T_MAX);
}

static PyObject *get_alignment(PyObject *obj, void *c) {
    return PyLong_FromUnsignedLongLong(((ckpy_torch_reader *)obj)->alignment);
}

static PyGetSetDef reader_getset[] = {
    {"path", ckpy_handle_get_path, NULL, "The path given at open.", NULL},
    {"tensors", get_tensors, NULL,
     "List of (name, dtype code, shape, stride, storage_offset, storage index, requires_grad,\n"
     "is_parameter, is_contiguous, file_offset, nbytes), in pickle order.",
     NULL},
    {"storages", get_storages, NULL, "List of (key, location, dtype code, nbytes, file_offset, crc32).", NULL},
    {"alignment", get_alignment, NULL, "The file's storage alignment (.storage_alignment record).", NULL},
    {"closed", ckpy_handle_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef reader_methods[] = {
    {"tree", (PyCFunction)(void (*)(void))reader_tree, METH_VARARGS | METH_KEYWORDS,
     "tree(make_tensor, make_dict, make_dtype, make_device, set_attrs, make_size=None, make_numpy=None) -> object:\n"
     "the unpickled object (make_size(tuple) rebuilds torch.Size values; without it they stay tuples;\n"
     "make_numpy(class_name, args) builds a numpy value from the node ckptio_value_object describes)."},
    {"read", reader_read, METH_O,
     "read(targets): tensors (C order) into memory; targets: (tensor index, address, capacity, mem_kind)."},
    {"read_storages", reader_read_storages, METH_O,
     "read_storages(targets): whole storages into memory; targets: (storage index, address, capacity, mem_kind)."},
    {"verify", reader_verify, METH_NOARGS, "verify() -> dict: checks every record's CRC-32."},
    {"map", reader_map, METH_NOARGS,
     "map() -> Mapping: the file mapped into memory, private and copy-on-write (a storage is at address +\n"
     "its file_offset)."},
    {"close", ckpy_handle_close, METH_NOARGS, "close(): releases the file."},
    {"__enter__", ckpy_handle_enter, METH_NOARGS, NULL},
    {"__exit__", ckpy_handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot reader_slots[] = {
    {Py_tp_new, reader_new},
    {Py_tp_dealloc, reader_dealloc},
    {Py_tp_methods, reader_methods},
    {Py_tp_getset, reader_getset},
    {Py_tp_doc, "TorchReader(path, engine=None): an open torch.save zip checkpoint."},
    {0, NULL},
};

static PyType_Spec reader_spec = {
    "ckptio._ckptio.TorchReader",
    sizeof(ckpy_torch_reader),
    0,
    Py_TPFLAGS_DEFAULT,
    reader_slots,
};

static PyMethodDef torch_methods[] = {
    {"torch_reader_from_bytes", mod_torch_reader_from_bytes, METH_VARARGS,
     "torch_reader_from_bytes(data: bytes, what: str) -> TorchReader over a torch.save archive held in\n"
     "memory (ckptio_torch_parse: the restricted unpickler; `what` names it in errors)."},
    {NULL, NULL, 0, NULL},
};

int ckpy_torch_add_to_module(PyObject *module) {
    reader_type = (PyTypeObject *)PyType_FromSpec(&reader_spec);
    if (!reader_type) return -1;
    if (PyModule_AddObject(module, "TorchReader", (PyObject *)reader_type) < 0) {
        Py_DECREF(reader_type);
        return -1;
    }
    return PyModule_AddFunctions(module, torch_methods);
}
