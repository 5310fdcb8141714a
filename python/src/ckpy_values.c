/*
 * ckpy_values.c - the bottom of the ckptio._ckptio extension: a failed C
 * call as the ckptio exception (built by ckptio._errors.make_error from
 * ckptio_last_error()), and Python values to C arguments and back (paths,
 * integers, memory kinds, dtypes, shapes, read targets, extents, the bytes
 * of pickle values). It uses no other file of the extension.
 *
 * Everything here goes through the public C API (ckptio.h) only.
 */
#include "ckpy_values.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ckptio._errors.make_error, resolved at module init. */
static PyObject *make_error_fn = NULL;

/* ---- errors ------------------------------------------------------------- */

int ckpy_errors_init(void) {
    PyObject *errors = PyImport_ImportModule("ckptio._errors");
    if (!errors) return -1;
    Py_XDECREF(make_error_fn);
    make_error_fn = PyObject_GetAttrString(errors, "make_error");
    Py_DECREF(errors);
    return make_error_fn ? 0 : -1;
}

void ckpy_errors_free(void) { Py_CLEAR(make_error_fn); }

PyObject *ckpy_str_or_none(const char *s) {
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
    PyObject *op = ckpy_str_or_none(operation), *p = ckpy_str_or_none(path), *subj = ckpy_str_or_none(subject);
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

/* ---- sequences ---------------------------------------------------------- */

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
    /* pickle's own decoding (torch.load's): lone surrogates pass. */
    return PyUnicode_DecodeUTF8(data, (Py_ssize_t)len, "surrogatepass");
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
