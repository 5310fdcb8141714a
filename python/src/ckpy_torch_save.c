/*
 * ckpy_torch_save.c - ckptio._ckptio.torch_save: writes a torch.save zip
 * checkpoint through ckptio_torch_writer_* and ckptio_torch_save.
 *
 * The Python layer hands over the object tree with every tensor replaced by
 * a TensorRef (a tuple: storage id, dtype, shape, stride, storage_offset,
 * requires_grad, is_parameter) and every torch.dtype by a DtypeRef (a str:
 * the torch name), plus the list of storages (dtype, nbytes, location,
 * address, mem_kind). Containers reached twice become one shared node, as
 * pickle's memo does.
 */
#include "ckpy_engine.h"
#include "ckpy_parts.h"

#include <string.h>

#define TREE_MAX_DEPTH 900

typedef struct build_ctx {
    ckptio_torch_writer *w;
    PyObject *memo;        /* dict: id(container) -> node address */
    PyObject *tensor_type; /* TensorRef */
    PyObject *dtype_type;  /* DtypeRef */
    PyObject *ordered_type;/* collections.OrderedDict */
    size_t *storage_ids;
    size_t storage_count;
} build_ctx;

static int fail_status(ckptio_status st) {
    ckpy_raise(st);
    return -1;
}

static int int64_array(PyObject *seq, const char *what, int64_t **out, uint32_t *n_out) {
    if (!PySequence_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a sequence of ints", what);
        return -1;
    }
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return -1;
    int64_t *v = PyMem_Calloc(n ? (size_t)n : 1, sizeof *v);
    if (!v) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PySequence_GetItem(seq, i);
        long long y = x ? PyLong_AsLongLong(x) : -1;
        Py_XDECREF(x);
        if (y == -1 && PyErr_Occurred()) {
            PyMem_Free(v);
            return -1;
        }
        v[i] = (int64_t)y;
    }
    *out = v;
    *n_out = (uint32_t)n;
    return 0;
}

static int build_tensor(build_ctx *c, PyObject *obj, ckptio_value **out) {
    PyObject *sid_o, *dtype_o, *shape_o, *stride_o, *off_o, *rg_o, *param_o;
    if (!PyArg_ParseTuple(obj, "OOOOOOO:TensorRef", &sid_o, &dtype_o, &shape_o, &stride_o, &off_o, &rg_o, &param_o))
        return -1;
    ckptio_torch_tensor_spec spec;
    memset(&spec, 0, sizeof spec);
    uint64_t sid;
    if (ckpy_u64(sid_o, "storage id", &sid) < 0 || ckpy_dtype(dtype_o, &spec.dtype) < 0 ||
        ckpy_u64(off_o, "storage offset", &spec.storage_offset) < 0)
        return -1;
    if (sid >= c->storage_count) {
        PyErr_Format(PyExc_ValueError, "tensor refers to storage %llu of %zu", (unsigned long long)sid,
                     c->storage_count);
        return -1;
    }
    spec.storage = c->storage_ids[sid];
    int64_t *shape = NULL, *stride = NULL;
    uint32_t nd = 0, nd2 = 0;
    if (int64_array(shape_o, "tensor shape", &shape, &nd) < 0) return -1;
    if (stride_o != Py_None) {
        if (int64_array(stride_o, "tensor stride", &stride, &nd2) < 0) {
            PyMem_Free(shape);
            return -1;
        }
        if (nd2 != nd) {
            PyMem_Free(shape);
            PyMem_Free(stride);
            PyErr_SetString(PyExc_ValueError, "tensor stride and shape differ in length");
            return -1;
        }
    }
    spec.ndim = nd;
    spec.shape = shape;
    spec.stride = stride;
    spec.requires_grad = PyObject_IsTrue(rg_o) == 1;
    spec.is_parameter = PyObject_IsTrue(param_o) == 1;
    ckptio_status st = ckptio_torch_writer_tensor(c->w, &spec, out);
    PyMem_Free(shape);
    PyMem_Free(stride);
    return st == CKPTIO_OK ? 0 : fail_status(st);
}

static int build_int(build_ctx *c, PyObject *obj, ckptio_value **out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!overflow) {
        ckptio_status st = ckptio_torch_writer_int(c->w, (int64_t)v, out);
        return st == CKPTIO_OK ? 0 : fail_status(st);
    }
    /* obj.to_bytes((obj.bit_length() + 8) // 8, "little", signed=True) */
    PyObject *bits = PyObject_CallMethod(obj, "bit_length", NULL);
    long nbits = bits ? PyLong_AsLong(bits) : -1;
    Py_XDECREF(bits);
    if (nbits < 0) return -1;
    PyObject *fn = PyObject_GetAttrString(obj, "to_bytes");
    PyObject *a = fn ? Py_BuildValue("(ls)", (nbits + 8) / 8, "little") : NULL;
    PyObject *kw = a ? Py_BuildValue("{sO}", "signed", Py_True) : NULL;
    PyObject *b = kw ? PyObject_Call(fn, a, kw) : NULL;
    Py_XDECREF(fn);
    Py_XDECREF(a);
    Py_XDECREF(kw);
    if (!b) return -1;
    ckptio_status st = ckptio_torch_writer_bigint(c->w, PyBytes_AsString(b), (size_t)PyBytes_Size(b), out);
    Py_DECREF(b);
    return st == CKPTIO_OK ? 0 : fail_status(st);
}

static int build(build_ctx *c, PyObject *obj, ckptio_value **out, int depth);

static int build_container(build_ctx *c, PyObject *obj, ckptio_value_kind kind, int ordered, ckptio_value **out,
                           int depth) {
    ckptio_status st = ckptio_torch_writer_container(c->w, kind, ordered, out);
    if (st != CKPTIO_OK) return fail_status(st);
    if (kind == CKPTIO_VALUE_DICT) {
        PyObject *items = PyMapping_Items(obj); /* insertion order, OrderedDict's too */
        if (!items) return -1;
        Py_ssize_t n = PyList_Size(items);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *kv = PyList_GetItem(items, i);
            ckptio_value *k = NULL, *v = NULL;
            if (build(c, PyTuple_GetItem(kv, 0), &k, depth + 1) < 0 ||
                build(c, PyTuple_GetItem(kv, 1), &v, depth + 1) < 0) {
                Py_DECREF(items);
                return -1;
            }
            st = ckptio_torch_writer_set_item(c->w, *out, k, v);
            if (st != CKPTIO_OK) {
                Py_DECREF(items);
                return fail_status(st);
            }
        }
        Py_DECREF(items);
        return 0;
    }
    PyObject *it = PyObject_GetIter(obj);
    if (!it) return -1;
    PyObject *item;
    while ((item = PyIter_Next(it))) {
        ckptio_value *v = NULL;
        int rc = build(c, item, &v, depth + 1);
        Py_DECREF(item);
        if (rc < 0) {
            Py_DECREF(it);
            return -1;
        }
        st = ckptio_torch_writer_append(c->w, *out, v);
        if (st != CKPTIO_OK) {
            Py_DECREF(it);
            return fail_status(st);
        }
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static int build_uncached(build_ctx *c, PyObject *obj, ckptio_value **out, int depth) {
    ckptio_status st;
    if (obj == Py_None) {
        st = ckptio_torch_writer_none(c->w, out);
        return st == CKPTIO_OK ? 0 : fail_status(st);
    }
    if (PyBool_Check(obj)) {
        st = ckptio_torch_writer_bool(c->w, obj == Py_True, out);
        return st == CKPTIO_OK ? 0 : fail_status(st);
    }
    int is = PyObject_IsInstance(obj, c->tensor_type);
    if (is < 0) return -1;
    if (is) return build_tensor(c, obj, out);
    is = PyObject_IsInstance(obj, c->dtype_type);
    if (is < 0) return -1;
    if (is) {
        ckptio_dtype dt;
        if (ckpy_dtype(obj, &dt) < 0) return -1;
        st = ckptio_torch_writer_dtype(c->w, dt, out);
        return st == CKPTIO_OK ? 0 : fail_status(st);
    }
    if (PyLong_Check(obj)) return build_int(c, obj, out);
    if (PyFloat_Check(obj)) {
        st = ckptio_torch_writer_float(c->w, PyFloat_AsDouble(obj), out);
        return st == CKPTIO_OK ? 0 : fail_status(st);
    }
    if (PyUnicode_Check(obj)) {
        /* As pickle writes str: a lone surrogate ('\udc80' from a file name
         * decoded with surrogateescape) is kept, and read back alike. */
        PyObject *b = PyUnicode_AsEncodedString(obj, "utf-8", "surrogatepass");
        if (!b) return -1;
        st = ckptio_torch_writer_str(c->w, PyBytes_AsString(b), (size_t)PyBytes_Size(b), out);
        Py_DECREF(b);
        return st == CKPTIO_OK ? 0 : fail_status(st);
    }
    if (PyBytes_Check(obj)) {
        st = ckptio_torch_writer_bytes(c->w, PyBytes_AsString(obj), (size_t)PyBytes_Size(obj), out);
        return st == CKPTIO_OK ? 0 : fail_status(st);
    }
    if (PyList_Check(obj)) return build_container(c, obj, CKPTIO_VALUE_LIST, 0, out, depth);
    if (PyTuple_Check(obj)) return build_container(c, obj, CKPTIO_VALUE_TUPLE, 0, out, depth);
    if (PyDict_Check(obj)) {
        int ordered = PyObject_IsInstance(obj, c->ordered_type);
        if (ordered < 0) return -1;
        return build_container(c, obj, CKPTIO_VALUE_DICT, ordered, out, depth);
    }
    if (PyObject_IsInstance(obj, (PyObject *)&PySet_Type) == 1 ||
        PyObject_IsInstance(obj, (PyObject *)&PyFrozenSet_Type) == 1)
        return build_container(c, obj, CKPTIO_VALUE_SET, 0, out, depth);
    PyErr_Format(PyExc_TypeError, "cannot save a %R in a torch checkpoint", (PyObject *)Py_TYPE(obj));
    return -1;
}

static int build(build_ctx *c, PyObject *obj, ckptio_value **out, int depth) {
    if (depth > TREE_MAX_DEPTH) {
        PyErr_Format(PyExc_RecursionError, "state dict nests deeper than %d levels", TREE_MAX_DEPTH);
        return -1;
    }
    /* TensorRefs are tuples too: one per tensor object, so a tensor reached
     * twice stays one object for torch.load. */
    int shareable = PyList_Check(obj) || PyDict_Check(obj) || PyTuple_Check(obj);
    PyObject *key = NULL;
    if (shareable) {
        key = PyLong_FromVoidPtr(obj);
        if (!key) return -1;
        PyObject *hit = PyDict_GetItem(c->memo, key); /* borrowed */
        if (hit) {
            *out = PyLong_AsVoidPtr(hit);
            Py_DECREF(key);
            return 0;
        }
    }
    int rc = build_uncached(c, obj, out, depth);
    if (rc == 0 && key) {
        PyObject *node = PyLong_FromVoidPtr(*out);
        if (!node || PyDict_SetItem(c->memo, key, node) < 0) rc = -1;
        Py_XDECREF(node);
    }
    Py_XDECREF(key);
    return rc;
}

static int add_storages(build_ctx *c, PyObject *seq, PyObject *keep) {
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return -1;
    c->storage_ids = PyMem_Calloc(n ? (size_t)n : 1, sizeof *c->storage_ids);
    if (!c->storage_ids) {
        PyErr_NoMemory();
        return -1;
    }
    c->storage_count = (size_t)n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (!item) return -1;
        PyObject *dtype_o, *nbytes_o, *loc_o, *addr_o, *kind_o;
        ckptio_dtype dt;
        uint64_t nbytes, addr;
        ckptio_mem_kind kind;
        int ok = PyArg_ParseTuple(item, "OOUOO:storage", &dtype_o, &nbytes_o, &loc_o, &addr_o, &kind_o) &&
                 ckpy_dtype(dtype_o, &dt) == 0 && ckpy_u64(nbytes_o, "storage nbytes", &nbytes) == 0 &&
                 ckpy_u64(addr_o, "storage address", &addr) == 0 && ckpy_mem_kind(kind_o, &kind) == 0;
        PyObject *loc = ok ? PyUnicode_AsUTF8String(loc_o) : NULL;
        Py_DECREF(item);
        if (!loc) return -1;
        int rc = PyList_Append(keep, loc);
        Py_DECREF(loc);
        if (rc < 0) return -1;
        ckptio_status st = ckptio_torch_writer_storage(c->w, dt, nbytes, PyBytes_AsString(loc),
                                                       (const void *)(uintptr_t)addr, kind, &c->storage_ids[i]);
        if (st != CKPTIO_OK) return fail_status(st);
    }
    return 0;
}

typedef struct save_call {
    const char *path;
    ckptio_torch_writer *w;
    const ckptio_torch_save_options *opt;
} save_call;

static ckptio_status do_save(ckptio_engine *engine, void *arg) {
    const save_call *c = arg;
    return ckptio_torch_save(engine, c->path, c->w, c->opt);
}

PyObject *ckpy_torch_save(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path",      "root",   "storages", "tensor_type", "dtype_type", "ordered_type",
                             "alignment", "prefix", "crc",      "engine",      "in_place",   NULL};
    PyObject *path_arg, *root, *storages, *engine_arg = Py_None, *prefix_o = Py_None;
    unsigned int alignment = 0;
    int crc = 1, in_place = 0;
    build_ctx c;
    memset(&c, 0, sizeof c);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|IOpOp:torch_save", kwlist, &path_arg, &root, &storages,
                                     &c.tensor_type, &c.dtype_type, &c.ordered_type, &alignment, &prefix_o, &crc,
                                     &engine_arg, &in_place))
        return NULL;
    PyObject *result = NULL, *pb = NULL, *prefix_b = NULL, *keep = PyList_New(0);
    ckpy_engine *engine = NULL;
    if (!keep) return NULL;
    c.memo = PyDict_New();
    if (!c.memo) goto out;
    if (prefix_o != Py_None) {
        prefix_b = PyUnicode_AsUTF8String(prefix_o);
        if (!prefix_b) goto out;
    }
    pb = ckpy_path_bytes(path_arg);
    if (!pb) goto out;
    engine = ckpy_engine_resolve(engine_arg);
    if (!engine) goto out;
    ckptio_status st = ckptio_torch_writer_create(&c.w);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        goto out;
    }
    if (add_storages(&c, storages, keep) < 0) goto out;
    ckptio_value *root_node = NULL;
    if (build(&c, root, &root_node, 0) < 0) goto out;
    st = ckptio_torch_writer_set_root(c.w, root_node);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        goto out;
    }
    ckptio_torch_save_options opt;
    memset(&opt, 0, sizeof opt);
    opt.storage_alignment = alignment;
    opt.record_prefix = prefix_b ? PyBytes_AsString(prefix_b) : NULL;
    opt.flags = (crc ? 0 : CKPTIO_TORCH_SAVE_NO_CRC) | (in_place ? CKPTIO_TORCH_SAVE_IN_PLACE : 0);
    save_call call = {PyBytes_AsString(pb), c.w, &opt};
    if (ckpy_engine_run(engine, do_save, &call) < 0) goto out;
    /* Where each storage's bytes went: [(file_offset, record key) or None]. */
    result = PyList_New((Py_ssize_t)c.storage_count);
    if (!result) goto out;
    for (size_t i = 0; i < c.storage_count; i++) {
        uint64_t off = 0;
        const char *key = NULL;
        st = ckptio_torch_writer_storage_offset(c.w, c.storage_ids[i], &off, &key);
        PyObject *row;
        if (st == CKPTIO_E_NOT_FOUND) {
            row = Py_None;
            Py_INCREF(row);
        } else if (st != CKPTIO_OK) {
            Py_CLEAR(result);
            ckpy_raise(st);
            goto out;
        } else {
            row = Py_BuildValue("(Ks)", (unsigned long long)off, key ? key : "");
            if (!row) {
                Py_CLEAR(result);
                goto out;
            }
        }
        PyList_SetItem(result, (Py_ssize_t)i, row);
    }
out:
    ckptio_torch_writer_destroy(c.w);
    PyMem_Free(c.storage_ids);
    Py_XDECREF(c.memo);
    Py_XDECREF(keep);
    Py_XDECREF(pb);
    Py_XDECREF(prefix_b);
    Py_XDECREF(engine);
    return result;
}
