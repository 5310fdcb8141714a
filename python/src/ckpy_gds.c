/*
 * ckpy_gds.c - ckptio._ckptio.GdsHandle: the GDS file API
 * (ckptio_gds_*), what ckptio.GdsFile runs on, plus the CUDA queries of the
 * GPU section (cuda_available, mem_classify, gpu_check_free).
 *
 * Stream-ordered transfers (read_stream/write_stream) submit with
 * ckptio_gds_*_async on the caller's stream and wait for the request, all
 * with the GIL released: the bytes are ordered after the work already queued
 * on that stream and are in place when the call returns.
 */
#include "ckpy_handle.h"
#include "ckpy_parts.h"

#include <string.h>

static PyTypeObject *gds_type = NULL;

typedef struct open_args {
    int oflags;
    unsigned int mode;
} open_args;

static ckptio_status open_handle(ckptio_engine *engine, const char *path, void *arg, void **handle) {
    const open_args *a = arg;
    ckptio_gds_file *f = NULL;
    ckptio_status st = ckptio_gds_open(engine, path, a->oflags, a->mode, &f);
    *handle = f;
    return st;
}

/* Takes the engine's lock itself: close may wait for async requests. */
static ckptio_status close_handle(ckpy_handle *h) {
    ckpy_lock_nogil(h->engine->lock);
    ckptio_status st = ckptio_gds_close(h->handle);
    PyThread_release_lock(h->engine->lock);
    return st;
}

static const ckpy_handle_kind gds_kind = {"GDS file", close_handle, 1};

static PyObject *gds_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "oflags", "mode", "engine", NULL};
    PyObject *path_arg, *engine_arg = Py_None;
    open_args a = {0, 0644};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oi|IO:GdsHandle", kwlist, &path_arg, &a.oflags, &a.mode,
                                     &engine_arg))
        return NULL;
    return (PyObject *)ckpy_handle_new(type, &gds_kind, path_arg, engine_arg, open_handle, &a);
}

/* ---- transfers ---------------------------------------------------------------- */

typedef struct xfer_args {
    void *buf;
    uint64_t size, file_offset, buf_offset;
    void *stream;
    int use_stream;
    int write;
    uint64_t done;
} xfer_args;

static ckptio_status do_transfer(ckpy_handle *h, void *arg) {
    xfer_args *a = arg;
    ckptio_gds_file *f = h->handle;
    if (!a->use_stream)
        return a->write ? ckptio_gds_write(f, a->buf, a->size, a->file_offset, a->buf_offset, &a->done)
                        : ckptio_gds_read(f, a->buf, a->size, a->file_offset, a->buf_offset, &a->done);
    ckptio_gds_request *req = NULL;
    ckptio_status st =
        a->write ? ckptio_gds_write_async(f, a->buf, a->size, a->file_offset, a->buf_offset, a->stream, &req)
                 : ckptio_gds_read_async(f, a->buf, a->size, a->file_offset, a->buf_offset, a->stream, &req);
    if (st != CKPTIO_OK) return st;
    st = ckptio_gds_request_wait(req, &a->done);
    ckptio_status st2 = ckptio_gds_request_destroy(req);
    return st != CKPTIO_OK ? st : st2;
}

/* (address, size, file_offset, buf_offset=0, stream=None) */
static PyObject *transfer(PyObject *obj, PyObject *args, PyObject *kwargs, int write) {
    static char *kwlist[] = {"address", "size", "file_offset", "buf_offset", "stream", NULL};
    PyObject *addr_o, *size_o, *off_o, *boff_o = NULL, *stream_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, write ? "OOO|OO:write" : "OOO|OO:read", kwlist, &addr_o, &size_o,
                                     &off_o, &boff_o, &stream_o))
        return NULL;
    xfer_args a;
    memset(&a, 0, sizeof a);
    uint64_t addr, stream = 0;
    if (ckpy_u64(addr_o, "address", &addr) < 0 || ckpy_u64(size_o, "size", &a.size) < 0 ||
        ckpy_u64(off_o, "file_offset", &a.file_offset) < 0 ||
        (boff_o && ckpy_u64(boff_o, "buf_offset", &a.buf_offset) < 0))
        return NULL;
    if (stream_o != Py_None) {
        if (ckpy_u64(stream_o, "stream", &stream) < 0) return NULL;
        a.use_stream = 1;
        a.stream = (void *)(uintptr_t)stream;
    }
    if (addr == 0 && a.size != 0) {
        PyErr_SetString(PyExc_ValueError, "address 0 with a non-zero size");
        return NULL;
    }
    a.buf = (void *)(uintptr_t)addr;
    a.write = write;
    if (ckpy_handle_run((ckpy_handle *)obj, do_transfer, &a) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(a.done);
}

static PyObject *gds_read(PyObject *obj, PyObject *args, PyObject *kwargs) {
    return transfer(obj, args, kwargs, 0);
}

static PyObject *gds_write(PyObject *obj, PyObject *args, PyObject *kwargs) {
    return transfer(obj, args, kwargs, 1);
}

/* ---- registration, sync, state --------------------------------------------------- */

static ckptio_status do_register(ckpy_handle *h, void *arg) {
    return ckptio_gds_register_handle(h->handle);
}

static ckptio_status do_deregister(ckpy_handle *h, void *arg) {
    return ckptio_gds_deregister_handle(h->handle);
}

static ckptio_status do_sync(ckpy_handle *h, void *arg) {
    return ckptio_gds_sync(h->handle);
}

static PyObject *gds_register_handle(PyObject *obj, PyObject *unused) {
    if (ckpy_handle_run((ckpy_handle *)obj, do_register, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gds_deregister_handle(PyObject *obj, PyObject *unused) {
    if (ckpy_handle_run((ckpy_handle *)obj, do_deregister, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gds_sync(PyObject *obj, PyObject *unused) {
    if (ckpy_handle_run((ckpy_handle *)obj, do_sync, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

typedef struct buf_args {
    const void *base;
    uint64_t length;
} buf_args;

static ckptio_status do_buf_register(ckpy_handle *h, void *arg) {
    buf_args *a = arg;
    return ckptio_gds_buf_register(h->handle, a->base, a->length);
}

static ckptio_status do_buf_deregister(ckpy_handle *h, void *arg) {
    buf_args *a = arg;
    return ckptio_gds_buf_deregister(h->handle, a->base);
}

static PyObject *gds_buf_register(PyObject *obj, PyObject *args) {
    PyObject *addr_o, *len_o;
    uint64_t addr;
    buf_args a;
    if (!PyArg_ParseTuple(args, "OO:buf_register", &addr_o, &len_o)) return NULL;
    if (ckpy_u64(addr_o, "address", &addr) < 0 || ckpy_u64(len_o, "length", &a.length) < 0) return NULL;
    a.base = (const void *)(uintptr_t)addr;
    if (ckpy_handle_run((ckpy_handle *)obj, do_buf_register, &a) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *gds_buf_deregister(PyObject *obj, PyObject *addr_o) {
    uint64_t addr;
    buf_args a;
    if (ckpy_u64(addr_o, "address", &addr) < 0) return NULL;
    a.base = (const void *)(uintptr_t)addr;
    a.length = 0;
    if (ckpy_handle_run((ckpy_handle *)obj, do_buf_deregister, &a) < 0) return NULL;
    Py_RETURN_NONE;
}

static ckptio_status do_path(ckpy_handle *h, void *arg) {
    return ckptio_gds_file_path(h->handle, arg);
}

static PyObject *gds_io_path(PyObject *obj, PyObject *unused) {
    ckptio_io_path p = CKPTIO_IO_PATH_NONE;
    if (ckpy_handle_run((ckpy_handle *)obj, do_path, &p) < 0) return NULL;
    const char *name = ckptio_io_path_name(p);
    return PyUnicode_FromString(name ? name : "unknown");
}

static ckptio_status do_refusal(ckpy_handle *h, void *arg) {
    const char *r = ckptio_gds_file_refusal(h->handle);
    *(const char **)arg = r;
    return CKPTIO_OK;
}

static PyObject *gds_refusal(PyObject *obj, PyObject *unused) {
    const char *r = NULL;
    /* The string is owned by the file: it is copied below, under the GIL,
     * and close() cannot run before this call returns (it needs the lock
     * and then the GIL). */
    if (ckpy_handle_run((ckpy_handle *)obj, do_refusal, &r) < 0) return NULL;
    return PyUnicode_FromString(r ? r : "");
}

static PyGetSetDef gds_getset[] = {
    {"path", ckpy_handle_get_path, NULL, "The path given at open.", NULL},
    {"closed", ckpy_handle_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef gds_methods[] = {
    {"read", (PyCFunction)(void (*)(void))gds_read, METH_VARARGS | METH_KEYWORDS,
     "read(address, size, file_offset, buf_offset=0, stream=None) -> int: bytes read (short at end of file).\n"
     "With stream (a CUstream as int), the read is ordered on that stream; the call waits for it."},
    {"write", (PyCFunction)(void (*)(void))gds_write, METH_VARARGS | METH_KEYWORDS,
     "write(address, size, file_offset, buf_offset=0, stream=None) -> int: bytes written."},
    {"register_handle", gds_register_handle, METH_NOARGS, "register_handle(): cuFileHandleRegister (idempotent)."},
    {"deregister_handle", gds_deregister_handle, METH_NOARGS, "deregister_handle(): idempotent."},
    {"buf_register", gds_buf_register, METH_VARARGS, "buf_register(address, length): cuFileBufRegister."},
    {"buf_deregister", gds_buf_deregister, METH_O, "buf_deregister(address): cuFileBufDeregister."},
    {"sync", gds_sync, METH_NOARGS, "sync(): fsync the file's data."},
    {"io_path", gds_io_path, METH_NOARGS,
     "io_path() -> str: path of the last transfer: 'none', 'cufile_direct', 'cufile_compat', 'pipeline', 'host'."},
    {"refusal", gds_refusal, METH_NOARGS, "refusal() -> str: why cuFile is not used ('' if it is or was not tried)."},
    {"close", ckpy_handle_close, METH_NOARGS, "close(): deregisters and closes (waits for requests in flight)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot gds_slots[] = {
    {Py_tp_new, gds_new},
    {Py_tp_dealloc, ckpy_handle_dealloc},
    {Py_tp_methods, gds_methods},
    {Py_tp_getset, gds_getset},
    {Py_tp_doc, "GdsHandle(path, oflags, mode=0o644, engine=None): a file of the GDS API (ckptio_gds_open)."},
    {0, NULL},
};

static PyType_Spec gds_spec = {
    "ckptio._ckptio.GdsHandle",
    sizeof(ckpy_handle),
    0,
    Py_TPFLAGS_DEFAULT,
    gds_slots,
};

/* ---- CUDA queries ------------------------------------------------------------------ */

static PyObject *mod_cuda_available(PyObject *self, PyObject *unused) {
    int count = 0;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_cuda_available(&count);
    Py_END_ALLOW_THREADS
    if (st == CKPTIO_E_NO_CUDA) {
        const char *why = ckptio_last_error_message();
        return Py_BuildValue("(is)", 0, why ? why : "");
    }
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return Py_BuildValue("(is)", count, "");
}

static PyObject *mod_mem_classify(PyObject *self, PyObject *addr_o) {
    uint64_t addr;
    if (ckpy_u64(addr_o, "address", &addr) < 0) return NULL;
    ckptio_mem_kind kind = CKPTIO_MEM_HOST;
    int device = -1;
    ckptio_status st = ckptio_mem_classify((const void *)(uintptr_t)addr, &kind, &device);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return Py_BuildValue("(ii)", (int)kind, device);
}

static PyObject *mod_gpu_check_free(PyObject *self, PyObject *args) {
    int device;
    unsigned long long needed;
    const char *what = NULL;
    if (!PyArg_ParseTuple(args, "iK|z:gpu_check_free", &device, &needed, &what)) return NULL;
    ckptio_status st = ckptio_gpu_check_free(device, (uint64_t)needed, what);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static PyMethodDef cuda_defs[] = {
    {"cuda_available", mod_cuda_available, METH_NOARGS,
     "cuda_available() -> (device_count, reason): reason says why CUDA is unusable when the count is 0."},
    {"mem_classify", mod_mem_classify, METH_O, "mem_classify(address) -> (mem_kind, device ordinal or -1)."},
    {"gpu_check_free", mod_gpu_check_free, METH_VARARGS,
     "gpu_check_free(device, needed, what=None): raises CkptioError (E_DEVICE_OOM) if fewer bytes are free."},
};

int ckpy_gds_add_to_module(PyObject *module) {
    gds_type = (PyTypeObject *)PyType_FromSpec(&gds_spec);
    if (!gds_type) return -1;
    if (PyModule_AddObject(module, "GdsHandle", (PyObject *)gds_type) < 0) {
        Py_DECREF(gds_type);
        return -1;
    }
    for (size_t i = 0; i < sizeof cuda_defs / sizeof cuda_defs[0]; i++) {
        PyObject *fn = PyCFunction_NewEx(&cuda_defs[i], NULL, NULL);
        if (!fn) return -1;
        if (PyModule_AddObject(module, cuda_defs[i].ml_name, fn) < 0) {
            Py_DECREF(fn);
            return -1;
        }
    }
    return 0;
}
