/*
 * _ckptio_module.c - the ckptio._ckptio extension module: module setup,
 * exceptions built from ckptio_last_error(), argument helpers, the dtype
 * table and format detection.
 *
 * Everything here goes through the public C API (ckptio.h) only.
 */
#include "_ckptio_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ckptio._errors.make_error, resolved at module init. */
static PyObject *make_error_fn = NULL;

/* ---- errors ------------------------------------------------------------- */

static PyObject *str_or_none(const char *s) {
    if (!s || !s[0]) Py_RETURN_NONE;
    return PyUnicode_DecodeFSDefault(s);
}

/* Builds the exception with ckptio._errors.make_error(...) and raises it. */
static PyObject *raise_record(ckptio_status status, int sys_errno, int cuda_result, const char *operation,
                              const char *path, int64_t offset, const char *subject, const char *message,
                              const char *source_file, int source_line) {
    PyObject *exc = NULL;
    if (!make_error_fn) {
        PyErr_Format(PyExc_RuntimeError, "ckptio: %s", message ? message : ckptio_strerror(status));
        return NULL;
    }
    PyObject *op = str_or_none(operation), *p = str_or_none(path), *subj = str_or_none(subject);
    PyObject *msg = PyUnicode_DecodeUTF8(message ? message : "", message ? (Py_ssize_t)strlen(message) : 0,
                                         "replace");
    PyObject *src = NULL;
    if (source_file && source_file[0]) src = PyUnicode_FromFormat("%s:%d", source_file, source_line);
    else {
        src = Py_None;
        Py_INCREF(src);
    }
    if (op && p && subj && msg && src) {
        exc = PyObject_CallFunction(make_error_fn, "isiiOOLOOO", (int)status, ckptio_status_name(status),
                                    sys_errno, cuda_result, op, p, (long long)offset, subj, msg, src);
    }
    Py_XDECREF(op);
    Py_XDECREF(p);
    Py_XDECREF(subj);
    Py_XDECREF(msg);
    Py_XDECREF(src);
    if (!exc) return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *ckpy_raise(ckptio_status status) {
    const ckptio_error_info *info = ckptio_last_error();
    if (!info || info->status != status || !info->message || !info->message[0]) {
        /* The record belongs to some other failure: report the code alone
         * rather than a misleading message. */
        char text[160];
        snprintf(text, sizeof text, "ckptio call failed: %s (%s)", ckptio_strerror(status),
                 ckptio_status_name(status));
        return raise_record(status, 0, 0, NULL, NULL, -1, NULL, text, NULL, 0);
    }
    return raise_record(status, info->sys_errno, info->cuda_result, info->operation, info->path,
                        info->file_offset, info->subject, info->message, info->source_file, info->source_line);
}

PyObject *ckpy_raise_custom(ckptio_status status, int sys_errno, const char *operation, const char *path,
                            int64_t offset, const char *fmt, ...) {
    char body[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    /* Same shape as the library's messages: "PATH: OPERATION at offset N: text: strerror". */
    char text[4096];
    size_t n = 0;
    if (path && path[0]) n += (size_t)snprintf(text + n, sizeof text - n, "%s: ", path);
    if (operation && operation[0] && n < sizeof text) {
        n += (size_t)snprintf(text + n, sizeof text - n, "%s", operation);
        if (offset >= 0 && n < sizeof text) n += (size_t)snprintf(text + n, sizeof text - n, " at offset %lld",
                                                                   (long long)offset);
        if (n < sizeof text) n += (size_t)snprintf(text + n, sizeof text - n, ": ");
    }
    if (n < sizeof text) n += (size_t)snprintf(text + n, sizeof text - n, "%s", body);
    if (sys_errno && n < sizeof text) snprintf(text + n, sizeof text - n, ": %s", strerror(sys_errno));
    return raise_record(status, sys_errno, 0, operation, path, offset, NULL, text, __FILE__, __LINE__);
}

/* ---- helpers ------------------------------------------------------------- */

PyObject *ckpy_path_bytes(PyObject *path) {
    PyObject *out = NULL;
    if (!PyUnicode_FSConverter(path, &out)) return NULL;
    return out;
}

int ckpy_u64(PyObject *obj, const char *what, uint64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %R", what, (PyObject *)Py_TYPE(obj));
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a non-negative integer below 2**64", what);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int ckpy_mem_kind(PyObject *obj, ckptio_mem_kind *out) {
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < CKPTIO_MEM_HOST || v > CKPTIO_MEM_AUTO) {
        PyErr_Format(PyExc_ValueError, "memory kind must be 0 (host), 1 (pinned), 2 (cuda) or 3 (auto), not %ld", v);
        return -1;
    }
    *out = (ckptio_mem_kind)v;
    return 0;
}

int ckpy_dtype(PyObject *obj, ckptio_dtype *out) {
    if (PyLong_Check(obj)) {
        long v = PyLong_AsLong(obj);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v < 0 || v >= CKPTIO_DTYPE_COUNT_) {
            PyErr_Format(PyExc_ValueError, "dtype code %ld is out of range", v);
            return -1;
        }
        *out = (ckptio_dtype)v;
        return 0;
    }
    PyObject *b = PyUnicode_AsUTF8String(obj);
    if (!b) return -1;
    ckptio_status st = ckptio_dtype_from_name(PyBytes_AsString(b), out);
    Py_DECREF(b);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        return -1;
    }
    return 0;
}

void ckpy_free_object(PyObject *self) {
    PyTypeObject *tp = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    tp_free(self);
    Py_DECREF(tp);
}

void ckpy_lock_nogil(PyThread_type_lock lock) {
    PyThread_acquire_lock(lock, WAIT_LOCK);
}

/* ---- module functions ------------------------------------------------------ */

static PyObject *mod_version(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(ckptio_version());
}

static PyObject *mod_status_name(PyObject *self, PyObject *arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(ckptio_status_name((ckptio_status)v));
}

static PyObject *mod_strerror(PyObject *self, PyObject *arg) {
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(ckptio_strerror((ckptio_status)v));
}

/* inherit_mode(fd, path): ckptio_inherit_mode, for writers that rename
 * temporaries of their own over `path` (the DCP commit). */
static PyObject *mod_inherit_mode(PyObject *self, PyObject *args) {
    int fd;
    PyObject *path_obj;
    if (!PyArg_ParseTuple(args, "iO:inherit_mode", &fd, &path_obj)) return NULL;
    PyObject *pb = ckpy_path_bytes(path_obj);
    if (!pb) return NULL;
    const char *path = PyBytes_AsString(pb);
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_inherit_mode(fd, path);
    Py_END_ALLOW_THREADS
    Py_DECREF(pb);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

/* [(code, safetensors_name or None, torch_name or None, bits), ...] */
static PyObject *mod_dtypes(PyObject *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (int i = 0; i < CKPTIO_DTYPE_COUNT_; i++) {
        const char *st_name = ckptio_dtype_name((ckptio_dtype)i);
        const char *torch_name = ckptio_dtype_torch_name((ckptio_dtype)i);
        PyObject *row = Py_BuildValue("(iOOI)", i, Py_None, Py_None, ckptio_dtype_bits((ckptio_dtype)i));
        if (!row) goto fail;
        PyObject *a = str_or_none(st_name), *b = str_or_none(torch_name);
        if (!a || !b) {
            Py_XDECREF(a);
            Py_XDECREF(b);
            Py_DECREF(row);
            goto fail;
        }
        /* PyTuple_SetItem steals the new values and drops the Nones. */
        PyTuple_SetItem(row, 1, a);
        PyTuple_SetItem(row, 2, b);
        int rc = PyList_Append(list, row);
        Py_DECREF(row);
        if (rc < 0) goto fail;
    }
    return list;
fail:
    Py_DECREF(list);
    return NULL;
}

static PyObject *mod_option_names(PyObject *self, PyObject *unused) {
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (int i = 0; i < CKPTIO_OPT_COUNT_; i++) {
        const char *name = ckptio_option_name((ckptio_option)i);
        PyObject *s = PyUnicode_FromString(name ? name : "");
        if (!s || PyList_Append(list, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(s);
    }
    return list;
}

/* ckptio_env_check(): one str per CKPTIO_* variable ckptio does not read. */
static PyObject *mod_env_check(PyObject *self, PyObject *unused) {
    (void)self;
    size_t unknown = 0;
    ckptio_status st = ckptio_env_check(NULL, 0, &unknown);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    if (unknown == 0) return PyList_New(0);
    /* Each line holds one name and the closest known one. */
    const size_t cap = unknown * 512 + 1;
    char *text = PyMem_Malloc(cap);
    if (!text) return PyErr_NoMemory();
    st = ckptio_env_check(text, cap, &unknown);
    PyObject *lines = NULL;
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
    } else {
        PyObject *all = PyUnicode_DecodeFSDefault(text);
        lines = all ? PyUnicode_Splitlines(all, 0) : NULL;
        Py_XDECREF(all);
    }
    PyMem_Free(text);
    return lines;
}

/* The library's format detector: ckptio_format_name() of what `path` holds. */
static PyObject *mod_format_detect(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *pb = ckpy_path_bytes(arg);
    if (!pb) return NULL;
    const char *path = PyBytes_AsString(pb);
    ckptio_format format = CKPTIO_FORMAT_UNKNOWN;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_format_detect(path, &format);
    Py_END_ALLOW_THREADS
    Py_DECREF(pb);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return PyUnicode_FromString(ckptio_format_name(format));
}

/* The same rule on a whole file held in memory (ckptio_format_detect_bytes). */
static PyObject *mod_format_detect_memory(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *addr_o, *len_o;
    uint64_t addr, len;
    if (!PyArg_ParseTuple(args, "OO:format_detect_memory", &addr_o, &len_o) || ckpy_u64(addr_o, "address", &addr) < 0 ||
        ckpy_u64(len_o, "length", &len) < 0)
        return NULL;
    ckptio_format format = CKPTIO_FORMAT_UNKNOWN;
    const ckptio_status st = ckptio_format_detect_bytes((const void *)(uintptr_t)addr, (size_t)len, len, &format);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return PyUnicode_FromString(ckptio_format_name(format));
}

static PyMethodDef module_methods[] = {
    {"version", mod_version, METH_NOARGS, "version() -> str: the C library's version, 'MAJOR.MINOR.PATCH'."},
    {"status_name", mod_status_name, METH_O, "status_name(code) -> str: e.g. 'E_FORMAT'."},
    {"strerror", mod_strerror, METH_O, "strerror(code) -> str: short description of a status code."},
    {"dtypes", mod_dtypes, METH_NOARGS,
     "dtypes() -> list of (code, safetensors_name|None, torch_name|None, bits), one per ckptio dtype."},
    {"option_names", mod_option_names, METH_NOARGS, "option_names() -> list of engine option names."},
    {"set_progress", ckpy_set_progress, METH_O,
     "set_progress(callable_or_None) -> previous: the callable (done, total) that this thread's following\n"
     "ckptio calls report progress to; an exception it raises cancels the call."},
    {"env_check", mod_env_check, METH_NOARGS,
     "env_check() -> list of str: one line per CKPTIO_* environment variable ckptio does not read,\n"
     "naming the closest known one (ckptio_env_check)."},
    {"inherit_mode", mod_inherit_mode, METH_VARARGS,
     "inherit_mode(fd, path) -> None: gives the open file fd the permission bits (and, where permitted,\n"
     "owner and group) of the regular file at path, if there is one; call before fsync and rename\n"
     "when replacing path by a temporary of your own (ckptio_inherit_mode)."},
    {"format_detect_memory", mod_format_detect_memory, METH_VARARGS,
     "format_detect_memory(address, length) -> str: format_detect's answer for a whole file held in memory."},
    {"format_detect", mod_format_detect, METH_O,
     "format_detect(path) -> str: 'safetensors', 'torch', 'torch_legacy', 'dcp', 'hf_index', 'directory' or\n"
     "'unknown' (ckptio_format_detect: a file's first bytes, a directory's entries)."},
    {"safetensors_save", (PyCFunction)(void (*)(void))ckpy_safetensors_save, METH_VARARGS | METH_KEYWORDS,
     "safetensors_save(path, tensors, metadata=None, align=4096, engine=None)\n\n"
     "Writes a safetensors file atomically. `tensors` is a sequence of\n"
     "(name, dtype, shape, address, nbytes, mem_kind); the memory must stay\n"
     "valid for the call. The GIL is released while writing."},
    {"torch_save", (PyCFunction)(void (*)(void))ckpy_torch_save, METH_VARARGS | METH_KEYWORDS,
     "torch_save(path, root, storages, tensor_type, dtype_type, ordered_type, alignment=0, prefix=None,\n"
     "           crc=True, engine=None) -> [(file_offset, record key) or None per storage]\n\n"
     "Writes a torch.save zip checkpoint atomically. `root` is the object tree with tensors\n"
     "as tensor_type tuples (storage id, dtype, shape, stride|None, storage_offset,\n"
     "requires_grad, is_parameter) and dtypes as dtype_type strs; `storages` lists\n"
     "(dtype, nbytes, location, address, mem_kind). The GIL is released while writing."},
    {NULL, NULL, 0, NULL},
};

static void module_free(void *module) {
    ckpy_engine_module_free();
    Py_CLEAR(make_error_fn);
}

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "_ckptio",
    "Low-level bindings of libckptio (addresses and sizes, no torch). Use the ckptio package.",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    module_free,
};

PyMODINIT_FUNC PyInit__ckptio(void);
int ckpy_pickle_add_to_module(PyObject *module); /* _ckptio_pickle.c */
int ckpy_model_add_to_module(PyObject *module);  /* _ckptio_model.c */

PyMODINIT_FUNC PyInit__ckptio(void) {
    PyObject *errors = PyImport_ImportModule("ckptio._errors");
    if (!errors) return NULL;
    Py_XDECREF(make_error_fn);
    make_error_fn = PyObject_GetAttrString(errors, "make_error");
    Py_DECREF(errors);
    if (!make_error_fn) return NULL;

    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (ckpy_engine_add_to_module(m) < 0 || ckpy_safetensors_add_to_module(m) < 0 ||
        ckpy_file_add_to_module(m) < 0 || ckpy_gds_add_to_module(m) < 0 || ckpy_torch_add_to_module(m) < 0 ||
        ckpy_dcp_add_to_module(m) < 0 || ckpy_dcp_commit_add_to_module(m) < 0 || ckpy_pickle_add_to_module(m) < 0 || ckpy_model_add_to_module(m) < 0 ||
        ckpy_steps_add_to_module(m) < 0 || ckpy_convert_add_to_module(m) < 0 || ckpy_snapshot_add_to_module(m) < 0 ||
        ckpy_mapping_add_to_module(m) < 0)
        goto fail;
    if (PyModule_AddIntConstant(m, "MEM_HOST", CKPTIO_MEM_HOST) < 0 ||
        PyModule_AddIntConstant(m, "MEM_PINNED", CKPTIO_MEM_PINNED) < 0 ||
        PyModule_AddIntConstant(m, "MEM_CUDA", CKPTIO_MEM_CUDA) < 0 ||
        PyModule_AddIntConstant(m, "MEM_AUTO", CKPTIO_MEM_AUTO) < 0 ||
        PyModule_AddIntConstant(m, "OPEN_READ", CKPTIO_OPEN_READ) < 0 ||
        PyModule_AddIntConstant(m, "OPEN_WRITE", CKPTIO_OPEN_WRITE) < 0 ||
        PyModule_AddIntConstant(m, "OPEN_IN_PLACE", CKPTIO_OPEN_IN_PLACE) < 0 ||
        PyModule_AddIntConstant(m, "OPEN_EXCLUSIVE", CKPTIO_OPEN_EXCLUSIVE) < 0 ||
        PyModule_AddIntConstant(m, "VERSION_NUMBER", (long)ckptio_version_number()) < 0)
        goto fail;
#define ADD_STATUS_(name, value, text) \
    if (PyModule_AddIntConstant(m, #name, value) < 0) goto fail;
    CKPTIO_STATUS_MAP(ADD_STATUS_)
#undef ADD_STATUS_
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
