/*
 * ckpy_mapping.c - Mapping: a checkpoint file mapped into memory
 * (ckptio_mapping), which ModelReader.map() and TorchReader.map() return.
 *
 * The object only owns the mapping: Python code makes tensors over
 * `address` (a ctypes array that holds this object, handed to
 * torch.frombuffer), so the file stays mapped while any tensor over it
 * lives, and is unmapped when the last one goes (dealloc).
 *
 * HostMemory is the same for new host memory (ckptio_host_alloc): a tensor
 * copied out of a checkpoint held in memory lives over one, which is
 * unmapped when the tensor goes.
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

/* ---- HostMemory: ckptio_host_alloc's memory, freed with the object ---- */

typedef struct ckpy_host_memory {
    PyObject_HEAD
    void *data;
    size_t length;
} ckpy_host_memory;

static PyTypeObject *host_memory_type = NULL;

static void host_memory_dealloc(PyObject *obj) {
    ckpy_host_memory *self = (ckpy_host_memory *)obj;
    ckptio_host_free(self->data, self->length);
    self->data = NULL;
    ckpy_free_object(obj);
}

static PyObject *host_get_address(PyObject *obj, void *c) {
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)((ckpy_host_memory *)obj)->data);
}

static PyObject *host_get_length(PyObject *obj, void *c) {
    return PyLong_FromSize_t(((ckpy_host_memory *)obj)->length);
}

static PyGetSetDef host_memory_getset[] = {
    {"address", host_get_address, NULL, "Address of the first byte.", NULL},
    {"length", host_get_length, NULL, "Bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot host_memory_slots[] = {
    {Py_tp_dealloc, host_memory_dealloc},
    {Py_tp_getset, host_memory_getset},
    {Py_tp_doc, "New host memory of ckptio_host_alloc (host_alloc()); unmapped when the object goes."},
    {0, NULL},
};

static PyType_Spec host_memory_spec = {
    "ckptio._ckptio.HostMemory",
    sizeof(ckpy_host_memory),
    0,
    Py_TPFLAGS_DEFAULT,
    host_memory_slots,
};

/* host_alloc(n, huge_pages) -> HostMemory of n (> 0) bytes. */
static PyObject *module_host_alloc(PyObject *module, PyObject *args) {
    PyObject *n_o;
    int huge = 0;
    uint64_t n;
    if (!PyArg_ParseTuple(args, "Op:host_alloc", &n_o, &huge) || ckpy_u64(n_o, "n", &n) < 0) return NULL;
    if (n == 0 || n > SIZE_MAX) {
        PyErr_Format(PyExc_ValueError, "host_alloc: %llu bytes (1 or more, within the address space)",
                     (unsigned long long)n);
        return NULL;
    }
    void *data = NULL;
    const ckptio_status st = ckptio_host_alloc((size_t)n, huge, &data);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    ckpy_host_memory *self = (ckpy_host_memory *)PyType_GenericAlloc(host_memory_type, 0);
    if (!self) {
        ckptio_host_free(data, (size_t)n);
        return NULL;
    }
    self->data = data;
    self->length = (size_t)n;
    return (PyObject *)self;
}

/* host_huge_pages(bytes) -> bool: ckptio_host_huge_pages. */
static PyObject *module_host_huge_pages(PyObject *module, PyObject *n_o) {
    uint64_t n;
    if (ckpy_u64(n_o, "bytes", &n) < 0) return NULL;
    return PyBool_FromLong(ckptio_host_huge_pages(n));
}

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
    {"host_alloc", module_host_alloc, METH_VARARGS,
     "host_alloc(n, huge_pages) -> HostMemory: n new bytes in a mapping of their own (ckptio_host_alloc)."},
    {"host_huge_pages", module_host_huge_pages, METH_O,
     "host_huge_pages(bytes) -> bool: whether buffers of that many bytes in all may go on huge pages."},
    {"host_copy", module_host_copy, METH_O,
     "host_copy([(dst, src, n), ...]): the copies, from 8 MiB in all on two threads, GIL released\n"
     "(ckptio_host_copy)."},
    {"mapping_check", module_mapping_check, METH_VARARGS,
     "mapping_check(address, length): CkptioError (E_TRUNCATED) when part of that memory lies in a ckptio\n"
     "mapping whose file was truncated since; None otherwise."},
    {NULL, NULL, 0, NULL},
};

/* The type of `spec` made and added to the module as `name`; *type keeps a reference. */
static int add_type(PyObject *module, PyType_Spec *spec, const char *name, PyTypeObject **type) {
    *type = (PyTypeObject *)PyType_FromSpec(spec);
    if (!*type) return -1;
    if (PyModule_AddObject(module, name, (PyObject *)*type) < 0) {
        Py_DECREF(*type);
        return -1;
    }
    Py_INCREF(*type);
    return 0;
}

int ckpy_mapping_add_to_module(PyObject *module) {
    if (add_type(module, &mapping_spec, "Mapping", &mapping_type) < 0 ||
        add_type(module, &host_memory_spec, "HostMemory", &host_memory_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, module_methods);
}
