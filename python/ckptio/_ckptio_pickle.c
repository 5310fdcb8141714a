/*
 * _ckptio_pickle.c - dcp_metadata_tree(): a DCP .metadata pickle through
 * libckptio's restricted unpickler (ckptio_pickle_parse_dcp_metadata),
 * returned as a tagged tree of plain Python values that ckptio/dcp/_metadata.py
 * maps to torch's classes. Nothing named by the file is imported or called.
 *
 * Tree: None, bool, int, float, str and bytes as themselves; every other
 * node is a tuple whose first item is a tag (so no real tuple is mistaken
 * for one):
 *   (TAG_LIST, [items])        (TAG_TUPLE, (items))      (TAG_SET, [items])
 *   (TAG_DICT, ordered, [(key, value), ...], attrs or None)
 *   (TAG_DTYPE, "float32")     (TAG_OBJECT, "module.Name", args, state or None)
 * A node shared through the pickle memo becomes one shared Python object,
 * so hostile sharing cannot blow the tree up exponentially.
 */
#include "_ckptio_internal.h"

#include <string.h>

enum { TAG_LIST = 0, TAG_TUPLE, TAG_DICT, TAG_SET, TAG_DTYPE, TAG_OBJECT };

static PyObject *conv(PyObject *memo, const ckptio_value *v);

/* A list of the items of a LIST/TUPLE/SET, or of (key, value) pairs of a DICT. */
static PyObject *items(PyObject *memo, const ckptio_value *v, int dict) {
    size_t n = 0;
    ckptio_status st = ckptio_value_len(v, &n);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        const ckptio_value *k = NULL, *item = NULL;
        PyObject *pi = NULL;
        st = dict ? ckptio_value_dict_item(v, i, &k, &item) : ckptio_value_item(v, i, &item);
        if (st != CKPTIO_OK) {
            ckpy_raise(st);
        } else if (dict) {
            PyObject *pk = conv(memo, k), *pv = pk ? conv(memo, item) : NULL;
            pi = pv ? PyTuple_Pack(2, pk, pv) : NULL;
            Py_XDECREF(pk);
            Py_XDECREF(pv);
        } else {
            pi = conv(memo, item);
        }
        if (!pi) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SetItem(list, (Py_ssize_t)i, pi);
    }
    return list;
}

static PyObject *conv_uncached(PyObject *memo, const ckptio_value *v) {
    ckptio_value_kind kind = ckptio_value_kind_of(v);
    ckptio_status st = CKPTIO_OK;
    PyObject *a = NULL, *b = NULL, *r = NULL;
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
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_SET:
        if (!(a = items(memo, v, 0))) return NULL;
        r = Py_BuildValue("(iO)", kind == CKPTIO_VALUE_LIST ? TAG_LIST : TAG_SET, a);
        break;
    case CKPTIO_VALUE_TUPLE:
        if (!(b = items(memo, v, 0)) || !(a = PyList_AsTuple(b))) break;
        r = Py_BuildValue("(iO)", TAG_TUPLE, a);
        break;
    case CKPTIO_VALUE_DICT: {
        int ordered = 0;
        const ckptio_value *attrs = NULL;
        st = ckptio_value_dict_ordered(v, &ordered);
        if (st == CKPTIO_OK) st = ckptio_value_dict_attrs(v, &attrs);
        if (st != CKPTIO_OK) return ckpy_raise(st);
        if (!(a = items(memo, v, 1))) break;
        if (attrs) {
            if (!(b = conv(memo, attrs))) break;
        } else {
            b = Py_None;
            Py_INCREF(b);
        }
        r = Py_BuildValue("(iOOO)", TAG_DICT, ordered ? Py_True : Py_False, a, b);
        break;
    }
    case CKPTIO_VALUE_DTYPE:
        if (!(a = ckpy_value_bytes_like(v, CKPTIO_VALUE_STR))) break;
        r = Py_BuildValue("(iO)", TAG_DTYPE, a);
        break;
    case CKPTIO_VALUE_OBJECT: {
        const char *cls = NULL;
        const ckptio_value *args = NULL, *state = NULL;
        if ((st = ckptio_value_object(v, &cls, &args, &state)) != CKPTIO_OK) return ckpy_raise(st);
        if (!(a = conv(memo, args))) break;
        if (state) {
            if (!(b = conv(memo, state))) break;
        } else {
            b = Py_None;
            Py_INCREF(b);
        }
        r = Py_BuildValue("(isOO)", TAG_OBJECT, cls, a, b);
        break;
    }
    case CKPTIO_VALUE_TENSOR:
    case CKPTIO_VALUE_DEVICE:
        PyErr_Format(PyExc_RuntimeError, "ckptio: value kind %d cannot occur in DCP metadata", (int)kind);
        break;
    }
    Py_XDECREF(a);
    Py_XDECREF(b);
    return r;
}

static PyObject *conv(PyObject *memo, const ckptio_value *v) {
    /* Values of a fixed size need no sharing: converting them again costs
     * what a memo lookup would (a DCP .metadata holds millions of ints). */
    switch (ckptio_value_kind_of(v)) {
    case CKPTIO_VALUE_NONE:
    case CKPTIO_VALUE_BOOL:
    case CKPTIO_VALUE_INT:
    case CKPTIO_VALUE_FLOAT: return conv_uncached(memo, v);
    default: break;
    }
    PyObject *key = PyLong_FromVoidPtr((void *)v);
    if (!key) return NULL;
    PyObject *hit = PyDict_GetItem(memo, key); /* borrowed */
    if (hit) {
        Py_DECREF(key);
        Py_INCREF(hit);
        return hit;
    }
    PyObject *r = conv_uncached(memo, v);
    if (r && PyDict_SetItem(memo, key, r) < 0) Py_CLEAR(r);
    Py_DECREF(key);
    return r;
}

static PyObject *dcp_metadata_tree(PyObject *self, PyObject *args) {
    PyObject *data = NULL;
    const char *origin = NULL;
    if (!PyArg_ParseTuple(args, "Sz:dcp_metadata_tree", &data, &origin)) return NULL;
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
    PyObject *r = NULL, *memo = NULL;
    st = ckptio_pickle_root(p, &root);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
    } else if ((memo = PyDict_New())) {
        r = conv(memo, root);
        Py_DECREF(memo);
    }
    ckptio_pickle_close(p);
    return r;
}

static PyMethodDef pickle_methods[] = {
    {"dcp_metadata_tree", dcp_metadata_tree, METH_VARARGS,
     "dcp_metadata_tree(data: bytes, origin: str | None) -> tagged tree of a DCP .metadata pickle, read by the\n"
     "restricted unpickler (no code runs). Raises CkptioError E_DISALLOWED naming a global outside the allowlist."},
    {NULL, NULL, 0, NULL}};

int ckpy_pickle_add_to_module(PyObject *module);

int ckpy_pickle_add_to_module(PyObject *module) {
    if (PyModule_AddFunctions(module, pickle_methods) < 0) return -1;
    if (PyModule_AddIntConstant(module, "PICKLE_TAG_LIST", TAG_LIST) < 0 ||
        PyModule_AddIntConstant(module, "PICKLE_TAG_TUPLE", TAG_TUPLE) < 0 ||
        PyModule_AddIntConstant(module, "PICKLE_TAG_DICT", TAG_DICT) < 0 ||
        PyModule_AddIntConstant(module, "PICKLE_TAG_SET", TAG_SET) < 0 ||
        PyModule_AddIntConstant(module, "PICKLE_TAG_DTYPE", TAG_DTYPE) < 0 ||
        PyModule_AddIntConstant(module, "PICKLE_TAG_OBJECT", TAG_OBJECT) < 0)
        return -1;
    return 0;
}
