/*
 * ckpy_pickle.c - dcp_metadata_objects(): a DCP .metadata pickle through
 * libckptio's restricted unpickler (ckptio_pickle_parse_dcp_metadata), made
 * into torch's objects. Nothing named by the file is imported or called: a
 * class name from the file is only a key into tables ckptio/dcp/_metadata.py
 * passes in, and every check that module's pickle reading promises is made
 * here or in its callback.
 *
 * None, bool, int, float, str and bytes become themselves; lists, tuples,
 * sets and dicts (OrderedDict where the pickle built one) are built here; a
 * dtype is looked up in the table of torch's dtypes. An object is built here
 * when it is one of the dataclasses (cls.__new__(cls), then the state's fields
 * into its __dict__, as pickle's BUILD does) or a torch.Size of one tuple of
 * ints; any other object goes to the callback with its arguments and state
 * already built. These are most of a large checkpoint's millions of nodes,
 * which a builder in Python made several times slower (docs/DCP.md#measured).
 * A node shared through the pickle memo becomes one shared Python object, so
 * hostile sharing cannot blow the result up exponentially.
 */
#include "ckpy_values.h"
#include "ckpy_parts.h"

#include <stdarg.h>
#include <string.h>

/* What _metadata.py passes in (borrowed for the call). */
typedef struct {
    PyObject *memo;        /* value address -> built object */
    PyObject *dataclasses; /* {"module.Name": (class, field spec)} rebuilt as pickle rebuilds a dataclass */
    PyObject *size;        /* torch.Size */
    PyObject *dtypes;      /* {"float32": torch.float32, ...} */
    PyObject *ordered;     /* collections.OrderedDict */
    PyObject *refused;     /* the exception class of a refusal */
    PyObject *other;       /* other(class_name, args, state or None) -> object */
} builder;

static PyObject *build(builder *b, const ckptio_value *v);

/* Raises b->refused with a formatted message; returns NULL. */
static PyObject *refuse(builder *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (msg) {
        PyErr_SetObject(b->refused, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

/* A new list of the built items of a LIST/TUPLE/SET value. */
static PyObject *built_items(builder *b, const ckptio_value *v) {
    size_t n = 0;
    ckptio_status st = ckptio_value_len(v, &n);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        const ckptio_value *item = NULL;
        PyObject *pi = NULL;
        if ((st = ckptio_value_item(v, i, &item)) != CKPTIO_OK) ckpy_raise(st);
        else pi = build(b, item);
        if (!pi) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, (Py_ssize_t)i, pi);
    }
    return list;
}

static PyObject *build_set(builder *b, const ckptio_value *v) {
    PyObject *items = built_items(b, v), *set = items ? PySet_New(items) : NULL; /* TypeError: unhashable */
    Py_XDECREF(items);
    return set;
}

static PyObject *build_dict(builder *b, const ckptio_value *v) {
    int ordered = 0;
    const ckptio_value *attrs = NULL;
    size_t n = 0;
    ckptio_status st = ckptio_value_dict_ordered(v, &ordered);
    if (st == CKPTIO_OK) st = ckptio_value_dict_attrs(v, &attrs);
    if (st == CKPTIO_OK) st = ckptio_value_len(v, &n);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    if (attrs) return refuse(b, "a dict with attributes (BUILD state) does not occur in DCP metadata");
    PyObject *d = ordered ? PyObject_CallFunctionObjArgs(b->ordered, NULL) : PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        const ckptio_value *k = NULL, *item = NULL;
        if ((st = ckptio_value_dict_item(v, i, &k, &item)) != CKPTIO_OK) {
            ckpy_raise(st);
            Py_CLEAR(d);
            break;
        }
        PyObject *pk = build(b, k), *pv = pk ? build(b, item) : NULL;
        if (!pv || PyObject_SetItem(d, pk, pv) < 0) Py_CLEAR(d); /* TypeError: unhashable key */
        Py_XDECREF(pk);
        Py_XDECREF(pv);
    }
    return d;
}

/* The name of v's type, for messages (new reference, NULL on failure). */
static PyObject *type_name(PyObject *v) { return PyObject_GetAttrString((PyObject *)Py_TYPE(v), "__name__"); }

/* Refuses a dataclass field (or an item of it) of the wrong type: "NAME field 'F' VERB a TYPE, not WORDS". */
static int refuse_type(builder *b, const char *name, PyObject *field, const char *verb, PyObject *v, PyObject *words) {
    PyObject *tname = type_name(v);
    if (tname) refuse(b, "%s field '%U' %s a %U, not %U", name, field, verb, tname, words);
    Py_XDECREF(tname);
    return -1;
}

/* Checks the fields of a built dataclass against its spec: a tuple of (field, accepted types, required, type
 * of each item or None, what is accepted in words), from _metadata._field. Fields not in the spec are left
 * alone (a newer torch adds some); 0, or -1 with the refusal raised. */
static int check_fields(builder *b, const char *name, PyObject *fields, PyObject *spec) {
    for (Py_ssize_t i = 0, n = PyTuple_Size(spec); i < n; i++) {
        PyObject *entry = PyTuple_GetItem(spec, i); /* borrowed, like the items below */
        if (!entry || !PyTuple_Check(entry) || PyTuple_Size(entry) != 5) {
            PyErr_SetString(PyExc_TypeError, "dcp_metadata_objects: a field spec is not a 5-tuple");
            return -1;
        }
        PyObject *field = PyTuple_GetItem(entry, 0), *types = PyTuple_GetItem(entry, 1);
        PyObject *item_type = PyTuple_GetItem(entry, 3), *words = PyTuple_GetItem(entry, 4);
        PyObject *v = PyDict_GetItemWithError(fields, field); /* borrowed */
        if (!v) {
            if (PyErr_Occurred()) return -1;
            int required = PyObject_IsTrue(PyTuple_GetItem(entry, 2));
            if (required < 0) return -1;
            if (!required) continue;
            refuse(b, "%s lacks the field '%U'", name, field);
            return -1;
        }
        int ok = PyObject_IsInstance(v, types);
        if (ok < 0) return -1;
        if (!ok) return refuse_type(b, name, field, "is", v, words);
        if (item_type == Py_None || !(PyList_Check(v) || PyTuple_Check(v))) continue;
        for (Py_ssize_t j = 0, m = PySequence_Size(v); j < m; j++) {
            PyObject *item = PySequence_GetItem(v, j);
            int item_ok = item ? PyObject_IsInstance(item, item_type) : -1;
            if (item_ok == 0) refuse_type(b, name, field, "holds", item, words);
            Py_XDECREF(item);
            if (item_ok != 1) return -1;
        }
    }
    return 0;
}

/* cls.__new__(cls), then each field of `state` (a dict of identifiers) into its __dict__, then the fields
 * checked against `spec` (check_fields). */
static PyObject *build_dataclass(builder *b, PyObject *cls, PyObject *spec, const char *name, PyObject *args,
                                 const ckptio_value *state_value) {
    int has_args = PyObject_IsTrue(args);
    if (has_args < 0) return NULL;
    if (has_args) return refuse(b, "%s created with arguments %R (pickle passes none)", name, args);
    PyObject *obj = PyObject_CallMethod(cls, "__new__", "O", cls);
    if (!obj) return NULL;
    PyObject *state = NULL, *fields = NULL, *dunder = NULL;
    if (!(fields = PyObject_GetAttrString(obj, "__dict__")) || !PyDict_Check(fields)) goto fail;
    if (state_value) {
        if (!(state = build(b, state_value))) goto fail;
        if (!PyDict_Check(state)) {
            PyObject *tname = type_name(state);
            if (tname) refuse(b, "%s state is a %U, not a dict", name, tname);
            Py_XDECREF(tname);
            goto fail;
        }
        if (!(dunder = PyUnicode_FromString("__"))) goto fail;
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        while (PyDict_Next(state, &pos, &k, &v)) {
            int ok = PyUnicode_Check(k) && PyUnicode_IsIdentifier(k) == 1;
            if (ok) {
                Py_ssize_t starts = PyUnicode_Tailmatch(k, dunder, 0, PY_SSIZE_T_MAX, -1);
                if (starts < 0) goto fail;
                ok = !starts;
            }
            if (!ok) {
                refuse(b, "%s state has the field name %R", name, k);
                goto fail;
            }
            if (PyDict_SetItem(fields, k, v) < 0) goto fail;
        }
    }
    if (check_fields(b, name, fields, spec) < 0) goto fail;
    Py_XDECREF(state);
    Py_DECREF(fields);
    Py_XDECREF(dunder);
    return obj;
fail:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an object's __dict__ is not a dict");
    Py_XDECREF(state);
    Py_XDECREF(fields);
    Py_XDECREF(dunder);
    Py_DECREF(obj);
    return NULL;
}

/* torch.Size((ints)) when args is exactly that; NULL without an error otherwise (the callback decides). */
static PyObject *build_size(builder *b, PyObject *args) {
    if (!PyTuple_Check(args) || PyTuple_Size(args) != 1) return NULL;
    PyObject *dims = PyTuple_GetItem(args, 0);
    if (!PyTuple_Check(dims)) return NULL;
    for (Py_ssize_t i = 0, n = PyTuple_Size(dims); i < n; i++)
        if (!PyLong_CheckExact(PyTuple_GetItem(dims, i))) return NULL;
    return PyObject_CallFunctionObjArgs(b->size, dims, NULL);
}

static PyObject *build_object(builder *b, const ckptio_value *v) {
    const char *name = NULL;
    const ckptio_value *args_value = NULL, *state_value = NULL;
    ckptio_status st = ckptio_value_object(v, &name, &args_value, &state_value);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    PyObject *args = build(b, args_value);
    if (!args) return NULL;
    PyObject *r = NULL, *entry = PyDict_GetItemString(b->dataclasses, name); /* borrowed: (class, spec) */
    if (entry) {
        PyObject *cls = NULL, *spec = NULL;
        if (PyArg_ParseTuple(entry, "OO!", &cls, &PyTuple_Type, &spec))
            r = build_dataclass(b, cls, spec, name, args, state_value);
    } else if (state_value && strcmp(name, "torch.distributed.checkpoint.metadata.TensorProperties") != 0) {
        refuse(b, "%s with BUILD state", name);
    } else if (strcmp(name, "torch.Size") == 0 && (r = build_size(b, args))) {
        /* the common case; anything else about a torch.Size is the callback's to check */
    } else if (!PyErr_Occurred()) {
        PyObject *state = Py_None;
        if (state_value) state = build(b, state_value);
        else Py_INCREF(state);
        if (state) r = PyObject_CallFunction(b->other, "sOO", name, args, state);
        Py_XDECREF(state);
    }
    Py_DECREF(args);
    return r;
}

static PyObject *build_uncached(builder *b, const ckptio_value *v) {
    ckptio_value_kind kind = ckptio_value_kind_of(v);
    ckptio_status st = CKPTIO_OK;
    switch (kind) {
    case CKPTIO_VALUE_NONE: Py_RETURN_NONE;
    case CKPTIO_VALUE_BOOL: {
        int x = 0;
        if ((st = ckptio_value_bool(v, &x)) != CKPTIO_OK) return ckpy_raise(st);
        return PyBool_FromLong(x);
    }
    case CKPTIO_VALUE_INT: {
        int64_t x = 0;
        if ((st = ckptio_value_int(v, &x)) != CKPTIO_OK) return ckpy_raise(st);
        return PyLong_FromLongLong((long long)x);
    }
    case CKPTIO_VALUE_FLOAT: {
        double x = 0;
        if ((st = ckptio_value_float(v, &x)) != CKPTIO_OK) return ckpy_raise(st);
        return PyFloat_FromDouble(x);
    }
    case CKPTIO_VALUE_BIGINT:
    case CKPTIO_VALUE_STR:
    case CKPTIO_VALUE_BYTES: return ckpy_value_bytes_like(v, kind);
    case CKPTIO_VALUE_LIST: return built_items(b, v);
    case CKPTIO_VALUE_TUPLE: {
        PyObject *list = built_items(b, v), *t = list ? PyList_AsTuple(list) : NULL;
        Py_XDECREF(list);
        return t;
    }
    case CKPTIO_VALUE_SET: return build_set(b, v);
    case CKPTIO_VALUE_DICT: return build_dict(b, v);
    case CKPTIO_VALUE_DTYPE: {
        PyObject *dname = ckpy_value_bytes_like(v, CKPTIO_VALUE_STR);
        if (!dname) return NULL;
        PyObject *dtype = PyDict_GetItem(b->dtypes, dname); /* borrowed */
        if (dtype) Py_INCREF(dtype);
        else refuse(b, "dtype torch.%U does not exist in this torch", dname);
        Py_DECREF(dname);
        return dtype;
    }
    case CKPTIO_VALUE_OBJECT: return build_object(b, v);
    case CKPTIO_VALUE_TENSOR:
    case CKPTIO_VALUE_DEVICE: break;
    }
    PyErr_Format(PyExc_RuntimeError, "ckptio: value kind %d cannot occur in DCP metadata", (int)kind);
    return NULL;
}

static PyObject *build(builder *b, const ckptio_value *v) {
    /* Values of a fixed size need no sharing: building them again costs
     * what a memo lookup would (a DCP .metadata holds millions of ints). */
    switch (ckptio_value_kind_of(v)) {
    case CKPTIO_VALUE_NONE:
    case CKPTIO_VALUE_BOOL:
    case CKPTIO_VALUE_INT:
    case CKPTIO_VALUE_FLOAT: return build_uncached(b, v);
    default: break;
    }
    PyObject *key = PyLong_FromVoidPtr((void *)v);
    if (!key) return NULL;
    PyObject *hit = PyDict_GetItem(b->memo, key); /* borrowed */
    if (hit) {
        Py_DECREF(key);
        Py_INCREF(hit);
        return hit;
    }
    PyObject *r = build_uncached(b, v);
    if (r && PyDict_SetItem(b->memo, key, r) < 0) Py_CLEAR(r);
    Py_DECREF(key);
    return r;
}

static PyObject *dcp_metadata_objects(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *data = NULL;
    const char *origin = NULL;
    builder b = {0};
    if (!PyArg_ParseTuple(args, "SzO!OO!OOO:dcp_metadata_objects", &data, &origin, &PyDict_Type, &b.dataclasses,
                          &b.size, &PyDict_Type, &b.dtypes, &b.ordered, &b.refused, &b.other))
        return NULL;
    char *bytes = NULL;
    Py_ssize_t len = 0;
    if (PyBytes_AsStringAndSize(data, &bytes, &len) < 0) return NULL;
    ckptio_pickle *p = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_pickle_parse_dcp_metadata(bytes, (size_t)len, origin, &p);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    const ckptio_value *root = NULL;
    PyObject *r = NULL;
    st = ckptio_pickle_root(p, &root);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
    } else if ((b.memo = PyDict_New())) {
        r = build(&b, root);
        Py_DECREF(b.memo);
    }
    ckptio_pickle_close(p);
    return r;
}

/* dcp_check_chunks(origin, fqn, shape, nchunks, offsets, sizes, whole): ckptio_dcp_check_chunks on one tensor's
 * chunks, offsets and sizes given as native int64 bytes (array('q').tobytes()), nchunks x len(shape) each. */
static PyObject *dcp_check_chunks(PyObject *self, PyObject *args) {
    (void)self;
    const char *origin = NULL, *fqn = NULL;
    PyObject *shape = NULL, *offsets = NULL, *sizes = NULL;
    Py_ssize_t nchunks = 0;
    int whole = 1;
    if (!PyArg_ParseTuple(args, "zsO!nSSp:dcp_check_chunks", &origin, &fqn, &PyTuple_Type, &shape, &nchunks,
                          &offsets, &sizes, &whole))
        return NULL;
    const Py_ssize_t nd = PyTuple_Size(shape);
    int64_t dims[CKPTIO_DCP_MAX_NDIM];
    for (Py_ssize_t d = 0; d < nd && d < CKPTIO_DCP_MAX_NDIM; d++) {
        dims[d] = PyLong_AsLongLong(PyTuple_GetItem(shape, d));
        if (dims[d] == -1 && PyErr_Occurred()) return NULL;
    }
    /* More dimensions than that are the C check's to refuse (it reads no array then). */
    const Py_ssize_t want = nchunks * (nd <= CKPTIO_DCP_MAX_NDIM ? nd : 0) * (Py_ssize_t)sizeof(int64_t);
    if (nchunks < 0 || (nd <= CKPTIO_DCP_MAX_NDIM && (PyBytes_Size(offsets) != want || PyBytes_Size(sizes) != want))) {
        PyErr_Format(PyExc_ValueError, "dcp_check_chunks: %zd chunks of %zd dimensions want %zd bytes of each",
                     nchunks, nd, want);
        return NULL;
    }
    int64_t *buf = PyMem_Malloc((size_t)want * 2 + 1); /* bytes objects' data need not be 8-byte aligned */
    if (!buf) return PyErr_NoMemory();
    memcpy(buf, PyBytes_AsString(offsets), (size_t)want);
    memcpy((char *)buf + want, PyBytes_AsString(sizes), (size_t)want);
    const ckptio_status st = ckptio_dcp_check_chunks(origin, fqn, (uint32_t)nd, dims, (size_t)nchunks, buf,
                                                     (const int64_t *)((char *)buf + want), whole);
    PyMem_Free(buf);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

/* dcp_saved_by_ranks(paths): ckptio_dcp_saved_by_ranks on the str items of a sequence (data file names). */
static PyObject *dcp_saved_by_ranks(PyObject *self, PyObject *arg) {
    (void)self;
    const Py_ssize_t n = PySequence_Size(arg);
    if (n < 0) return NULL;
    PyObject *encoded = PyList_New(0); /* keeps the UTF-8 bytes alive while C reads them */
    const char **names = encoded ? PyMem_Calloc((size_t)n + 1, sizeof *names) : NULL;
    int several = -1;
    Py_ssize_t i = 0;
    if (encoded && !names) PyErr_NoMemory();
    for (; names && i < n; i++) {
        PyObject *item = PySequence_GetItem(arg, i);
        /* surrogatepass: any str encodes (a pickle may hold lone surrogates); the rule reads ASCII only */
        PyObject *utf8 =
            item && PyUnicode_Check(item) ? PyUnicode_AsEncodedString(item, "utf-8", "surrogatepass") : NULL;
        const int ok = item && (!PyUnicode_Check(item) || (utf8 && PyList_Append(encoded, utf8) == 0));
        if (utf8) names[i] = PyBytes_AsString(utf8);
        Py_XDECREF(utf8);
        Py_XDECREF(item);
        if (!ok) break;
    }
    if (names && i == n) several = ckptio_dcp_saved_by_ranks(names, (size_t)n);
    PyMem_Free(names);
    Py_XDECREF(encoded);
    return several < 0 ? NULL : PyBool_FromLong(several);
}

static PyMethodDef pickle_methods[] = {
    {"dcp_metadata_objects", dcp_metadata_objects, METH_VARARGS,
     "dcp_metadata_objects(data: bytes, origin: str | None, dataclasses: dict, size: type, dtypes: dict,\n"
     "ordered: type, refused: type, other: callable) -> the object a DCP .metadata pickle holds, read by the\n"
     "restricted unpickler (no code runs). Raises CkptioError E_DISALLOWED naming a global outside the\n"
     "allowlist, `refused` for an object graph DCP metadata does not have."},
    {"dcp_check_chunks", dcp_check_chunks, METH_VARARGS,
     "dcp_check_chunks(origin: str | None, fqn: str, shape: tuple, nchunks: int, offsets: bytes, sizes: bytes,\n"
     "whole: bool) -> None: the tensor's chunks lie inside it and, with whole, tile it exactly\n"
     "(ckptio_dcp_check_chunks), or CkptioError E_FORMAT. offsets and sizes: nchunks x len(shape) native int64\n"
     "values each."},
    {"dcp_saved_by_ranks", dcp_saved_by_ranks, METH_O,
     "dcp_saved_by_ranks(paths: sequence) -> bool: whether the str among paths (a .metadata's data file names)\n"
     "name files of several ranks (__RANK_...), when a reader may demand that chunks tile every tensor\n"
     "(ckptio_dcp_saved_by_ranks); items that are not str are skipped."},
    {NULL, NULL, 0, NULL}};

int ckpy_pickle_add_to_module(PyObject *module);

int ckpy_pickle_add_to_module(PyObject *module) { return PyModule_AddFunctions(module, pickle_methods); }
