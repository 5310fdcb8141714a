/*
 * ckpy_mapping.c - Mapping: a checkpoint file mapped into memory
 * (ckptio_mapping), which ModelReader.map() and TorchReader.map() return.
 *
 * The object only owns the mapping: Python code makes tensors over
 * `address` (a ctypes array that holds this object, handed to
 * torch.frombuffer), so the file stays mapped while any tensor over it
 * lives, and is unmapped when the last one goes (dealloc).
 */
#include "ckpy_mapping.h"
#include "ckpy_parts.h"
#include "ckpy_values.h"

typedef struct ckpy_mapping {
    PyObject_HEAD
    ckptio_mapping *mapping;
} ckpy_mapping;

static PyTypeObject *mapping_type = NULL;

PyObject *ckpy_mapping_wrap(ckptio_mapping *m) {
    ckpy_mapping *self = (ckpy_mapping *)PyType_GenericAlloc(mapping_type, 0);
    if (!self) {
        ckptio_mapping_release(m);
        return NULL;
    }
    self->mapping = m;
    return (PyObject *)self;
}

static void mapping_dealloc(PyObject *obj) {
    ckpy_mapping *self = (ckpy_mapping *)obj;
    ckptio_mapping_release(self->mapping);
    self->mapping = NULL;
    ckpy_free_object(obj);
}

static PyObject *get_address(PyObject *obj, void *c) {
    void *data = NULL;
    uint64_t length = 0;
    ckptio_mapping_data(((ckpy_mapping *)obj)->mapping, &data, &length);
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)data);
}

static PyObject *get_length(PyObject *obj, void *c) {
    void *data = NULL;
    uint64_t length = 0;
    ckptio_mapping_data(((ckpy_mapping *)obj)->mapping, &data, &length);
    return PyLong_FromUnsignedLongLong((unsigned long long)length);
}

static PyObject *get_path(PyObject *obj, void *c) {
    return PyUnicode_DecodeFSDefault(ckptio_mapping_path(((ckpy_mapping *)obj)->mapping));
}

static PyObject *mapping_check(PyObject *obj, PyObject *unused) {
    void *data = NULL;
    uint64_t length = 0;
    ckptio_mapping_data(((ckpy_mapping *)obj)->mapping, &data, &length);
    const ckptio_status st = ckptio_mapping_check(data, length);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static PyGetSetDef mapping_getset[] = {
    {"address", get_address, NULL, "Address of the file's first byte (0 for an empty file).", NULL},
    {"length", get_length, NULL, "Bytes mapped: the file's size when it was mapped.", NULL},
    {"path", get_path, NULL, "The mapped file.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef mapping_methods[] = {
    {"check", mapping_check, METH_NOARGS,
     "check(): CkptioError (E_TRUNCATED) when the file no longer holds every mapped byte."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot mapping_slots[] = {
    {Py_tp_dealloc, mapping_dealloc},
    {Py_tp_methods, mapping_methods},
    {Py_tp_getset, mapping_getset},
    {Py_tp_doc, "A checkpoint file mapped into memory, private and copy-on-write (ModelReader.map(),\n"
                "TorchReader.map()); unmapped when the object goes."},
    {0, NULL},
};

static PyType_Spec mapping_spec = {
    "ckptio._ckptio.Mapping",
    sizeof(ckpy_mapping),
    0,
    Py_TPFLAGS_DEFAULT,
    mapping_slots,
};

/* host_copy(copies): ckptio_host_copy of a list of (dst, src, n), GIL released. */
static PyObject *module_host_copy(PyObject *module, PyObject *seq_o) {
    if (!PyList_Check(seq_o)) {
        PyErr_Format(PyExc_TypeError, "host_copy() takes a list of (dst, src, n), not %R", (PyObject *)Py_TYPE(seq_o));
        return NULL;
    }
    PyObject *seq = seq_o;
    Py_INCREF(seq);
    const Py_ssize_t count = PyList_Size(seq);
    ckptio_copy one[16];
    ckptio_copy *copies = count <= 16 ? one : PyMem_Malloc((size_t)count * sizeof *copies);
    if (!copies) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GetItem(seq, i);
        uint64_t dst, src, n;
        if (!PyTuple_Check(item) || PyTuple_Size(item) != 3) {
            PyErr_Format(PyExc_TypeError, "host_copy(): item %zd is not a (dst, src, n) tuple", i);
            goto fail;
        }
        if (ckpy_u64(PyTuple_GetItem(item, 0), "dst", &dst) < 0 ||
            ckpy_u64(PyTuple_GetItem(item, 1), "src", &src) < 0 || ckpy_u64(PyTuple_GetItem(item, 2), "n", &n) < 0)
            goto fail;
        copies[i] = (ckptio_copy){(void *)(uintptr_t)dst, (const void *)(uintptr_t)src, (size_t)n};
    }
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_host_copy(copies, (size_t)count);
    Py_END_ALLOW_THREADS
    if (copies != one) PyMem_Free(copies);
    Py_DECREF(seq);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
fail:
    if (copies != one) PyMem_Free(copies);
    Py_DECREF(seq);
    return NULL;
}

/* mapping_check(address, length): ckptio_mapping_check on any memory. */
static PyObject *module_mapping_check(PyObject *module, PyObject *args) {
    PyObject *addr_o, *len_o;
    uint64_t addr, len;
    if (!PyArg_ParseTuple(args, "OO:mapping_check", &addr_o, &len_o) || ckpy_u64(addr_o, "address", &addr) < 0 ||
        ckpy_u64(len_o, "length", &len) < 0)
        return NULL;
    const ckptio_status st = ckptio_mapping_check((const void *)(uintptr_t)addr, len);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

/* copy(dst, src, n): ckptio_mapping_copy with the GIL released. */
static PyObject *module_copy(PyObject *module, PyObject *args) {
    PyObject *dst_o, *src_o, *n_o;
    uint64_t dst, src, n;
    if (!PyArg_ParseTuple(args, "OOO:copy", &dst_o, &src_o, &n_o) || ckpy_u64(dst_o, "dst", &dst) < 0 ||
        ckpy_u64(src_o, "src", &src) < 0 || ckpy_u64(n_o, "n", &n) < 0)
        return NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_mapping_copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, (size_t)n);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

/* memory_of(obj) -> (address, length) of a bytes or bytearray object's
 * contents (no copy; valid while obj lives and, for a bytearray, is not
 * resized); TypeError for other objects. */
static PyObject *module_memory_of(PyObject *module, PyObject *obj) {
    if (PyBytes_Check(obj))
        return Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)PyBytes_AsString(obj), PyBytes_Size(obj));
    if (PyByteArray_Check(obj))
        return Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)PyByteArray_AsString(obj), PyByteArray_Size(obj));
    PyErr_Format(PyExc_TypeError, "memory_of() takes bytes or bytearray, not %R", (PyObject *)Py_TYPE(obj));
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"memory_of", module_memory_of, METH_O,
     "memory_of(bytes_or_bytearray) -> (address, length) of its contents, without a copy."},
    {"copy", module_copy, METH_VARARGS,
     "copy(dst, src, n): n bytes from address src to address dst, one thread, GIL released (memory in a\n"
     "mapped file that lost its bytes: CkptioError E_TRUNCATED, never SIGBUS)."},
    {"host_copy", module_host_copy, METH_O,
     "host_copy([(dst, src, n), ...]): the copies, from 8 MiB in all on two threads, GIL released\n"
     "(ckptio_host_copy)."},
    {"mapping_check", module_mapping_check, METH_VARARGS,
     "mapping_check(address, length): CkptioError (E_TRUNCATED) when part of that memory lies in a ckptio\n"
     "mapping whose file was truncated since; None otherwise."},
    {NULL, NULL, 0, NULL},
};

int ckpy_mapping_add_to_module(PyObject *module) {
    mapping_type = (PyTypeObject *)PyType_FromSpec(&mapping_spec);
    if (!mapping_type) return -1;
    if (PyModule_AddObject(module, "Mapping", (PyObject *)mapping_type) < 0) {
        Py_DECREF(mapping_type);
        return -1;
    }
    Py_INCREF(mapping_type);
    return PyModule_AddFunctions(module, module_methods);
}
