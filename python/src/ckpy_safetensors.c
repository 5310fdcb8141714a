/*
 * ckpy_safetensors.c - safetensors through the C API:
 * SafetensorsReader (ckptio_safetensors_open/_read/_close) and
 * safetensors_save (ckptio_safetensors_save), model_save (ckptio_model_save).
 *
 * The reader copies the header's description (names, dtypes, shapes,
 * offsets, __metadata__) into Python objects once at open, so later queries
 * need neither the GIL-free path nor the handle's lock; only reads and close
 * touch the C handle.
 */
#include "ckpy_handle.h"
#include "ckpy_parts.h"

#include <string.h>

typedef struct ckpy_st_reader {
    ckpy_handle h;           /* h.handle: the ckptio_safetensors, NULL once closed */
    PyObject *tensors;       /* list of (name, dtype code, shape, file_offset, nbytes), index order */
    PyObject *metadata;      /* dict str -> str, file order */
    unsigned long long data_offset;
} ckpy_st_reader;

static PyTypeObject *reader_type = NULL;

/* ---- opening -------------------------------------------------------------- */

/* Copies tensor descriptions and metadata out of the handle. */
static int describe(ckpy_handle *h) {
    ckpy_st_reader *self = (ckpy_st_reader *)h;
    const ckptio_safetensors *handle = self->h.handle;
    size_t count = 0, mcount = 0;
    uint64_t data_offset = 0;
    ckptio_status st = ckptio_safetensors_count(handle, &count);
    if (st == CKPTIO_OK) st = ckptio_safetensors_metadata_count(handle, &mcount);
    if (st == CKPTIO_OK) st = ckptio_safetensors_data_offset(handle, &data_offset);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        return -1;
    }
    self->data_offset = (unsigned long long)data_offset;
    self->tensors = PyList_New((Py_ssize_t)count);
    self->metadata = PyDict_New();
    if (!self->tensors || !self->metadata) return -1;
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        st = ckptio_safetensors_tensor(handle, i, &info);
        if (st != CKPTIO_OK) {
            ckpy_raise(st);
            return -1;
        }
        PyObject *shape = ckpy_int64_tuple(info.shape, info.ndim);
        if (!shape) return -1;
        PyObject *row = Py_BuildValue("(s#iNKK)", info.name, (Py_ssize_t)strlen(info.name), (int)info.dtype, shape,
                                      (unsigned long long)info.file_offset, (unsigned long long)info.nbytes);
        if (!row) return -1;
        PyList_SetItem(self->tensors, (Py_ssize_t)i, row);
    }
    for (size_t i = 0; i < mcount; i++) {
        ckptio_kv kv;
        st = ckptio_safetensors_metadata(handle, i, &kv);
        if (st != CKPTIO_OK) {
            ckpy_raise(st);
            return -1;
        }
        PyObject *k = PyUnicode_FromString(kv.key);
        PyObject *v = k ? PyUnicode_FromString(kv.value) : NULL;
        int rc = v ? PyDict_SetItem(self->metadata, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) return -1;
    }
    return 0;
}

static ckptio_status open_handle(ckptio_engine *engine, const char *path, void *arg, void **handle) {
    ckptio_safetensors *st = NULL;
    ckptio_status status = ckptio_safetensors_open(engine, path, &st);
    *handle = st;
    return status;
}

static ckptio_status close_handle(ckpy_handle *h) {
    return ckptio_safetensors_close(h->handle);
}

static const ckpy_handle_kind reader_kind = {"safetensors reader", close_handle, 0};

static PyObject *reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    return ckpy_reader_new(type, args, kwargs, "O|O:SafetensorsReader", &reader_kind, open_handle, describe);
}

static void reader_dealloc(PyObject *obj) {
    ckpy_st_reader *self = (ckpy_st_reader *)obj;
    Py_CLEAR(self->tensors);
    Py_CLEAR(self->metadata);
    ckpy_handle_dealloc(obj);
}

/* ---- reading ------------------------------------------------------------- */

typedef struct read_args {
    const ckptio_tensor_target *targets;
    size_t count;
} read_args;

static ckptio_status do_read(ckpy_handle *h, void *arg) {
    const read_args *a = arg;
    return ckptio_safetensors_read(h->handle, a->targets, a->count);
}

static PyObject *reader_read(PyObject *obj, PyObject *seq) {
    read_args a;
    ckptio_tensor_target *targets =
        ckpy_parse_targets(seq, "read() takes a sequence of (index, address, capacity, mem_kind)", &a.count);
    if (!targets) return NULL;
    a.targets = targets;
    int rc = ckpy_handle_run((ckpy_handle *)obj, do_read, &a);
    PyMem_Free(targets);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

typedef struct read_all_args {
    void *data;
    uint64_t capacity;
    ckptio_mem_kind kind;
} read_all_args;

static ckptio_status do_read_all(ckpy_handle *h, void *arg) {
    const read_all_args *a = arg;
    return ckptio_safetensors_read_all(h->handle, a->data, a->capacity, a->kind);
}

static PyObject *reader_read_all(PyObject *obj, PyObject *args) {
    PyObject *addr_o, *cap_o, *kind_o;
    uint64_t addr, cap;
    read_all_args a;
    if (!PyArg_ParseTuple(args, "OOO:read_all", &addr_o, &cap_o, &kind_o)) return NULL;
    if (ckpy_u64(addr_o, "address", &addr) < 0 || ckpy_u64(cap_o, "capacity", &cap) < 0 ||
        ckpy_mem_kind(kind_o, &a.kind) < 0)
        return NULL;
    a.data = (void *)(uintptr_t)addr;
    a.capacity = cap;
    if (ckpy_handle_run((ckpy_handle *)obj, do_read_all, &a) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *get_tensors(PyObject *obj, void *c) {
    /* A copy, so callers cannot change the reader's view of the file. */
    return PyList_GetSlice(((ckpy_st_reader *)obj)->tensors, 0, PY_SSIZE_T_MAX);
}

static PyObject *get_metadata(PyObject *obj, void *c) {
    return PyDict_Copy(((ckpy_st_reader *)obj)->metadata);
}

static PyObject *get_data_offset(PyObject *obj, void *c) {
    return PyLong_FromUnsignedLongLong(((ckpy_st_reader *)obj)->data_offset);
}

static PyGetSetDef reader_getset[] = {
    {"path", ckpy_handle_get_path, NULL, "The path given at open.", NULL},
    {"tensors", get_tensors, NULL,
     "List of (name, dtype code, shape, file_offset, nbytes), in file order (index = position).", NULL},
    {"metadata", get_metadata, NULL, "The __metadata__ pairs as a dict (file order).", NULL},
    {"data_offset", get_data_offset, NULL, "Where the data section starts (8 + header length).", NULL},
    {"closed", ckpy_handle_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static ckptio_status do_verify(ckpy_handle *h, void *arg) {
    return ckptio_safetensors_verify(h->handle, NULL, arg);
}

static PyObject *reader_verify(PyObject *obj, PyObject *unused) {
    ckptio_verify_report rep;
    memset(&rep, 0, sizeof rep);
    if (ckpy_handle_run((ckpy_handle *)obj, do_verify, &rep) < 0) return NULL;
    return Py_BuildValue("{snsnsK}", "tensors", (Py_ssize_t)rep.tensors, "blocks", (Py_ssize_t)rep.blocks, "bytes",
                         (unsigned long long)rep.bytes);
}

static PyMethodDef reader_methods[] = {
    {"read", reader_read, METH_O,
     "read(targets): reads tensors into memory; targets is a sequence of\n"
     "(index, address, capacity, mem_kind). One plan, GIL released."},
    {"read_all", reader_read_all, METH_VARARGS,
     "read_all(address, capacity, mem_kind): reads the whole data section into one buffer."},
    {"verify", reader_verify, METH_NOARGS,
     "verify() -> dict: checks every tensor against the checksum manifest beside the file."},
    {"close", ckpy_handle_close, METH_NOARGS, "close(): releases the file (waits for a read in flight)."},
    {"__enter__", ckpy_handle_enter, METH_NOARGS, NULL},
    {"__exit__", ckpy_handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot reader_slots[] = {
    {Py_tp_new, reader_new},
    {Py_tp_dealloc, reader_dealloc},
    {Py_tp_methods, reader_methods},
    {Py_tp_getset, reader_getset},
    {Py_tp_doc, "SafetensorsReader(path, engine=None): an open, validated safetensors file."},
    {0, NULL},
};

static PyType_Spec reader_spec = {
    "ckptio._ckptio.SafetensorsReader",
    sizeof(ckpy_st_reader),
    0,
    Py_TPFLAGS_DEFAULT,
    reader_slots,
};

/* ---- saving -------------------------------------------------------------- */

/* Everything a save needs to keep alive until the C call returns. */
typedef struct save_state {
    ckptio_tensor_source *sources;
    int64_t **shapes;
    ckptio_kv *kvs;
    size_t count, kv_count;
    PyObject *keep; /* list of bytes objects backing the C strings */
} save_state;

static const char *keep_utf8(save_state *s, PyObject *str, const char *what) {
    if (!PyUnicode_Check(str)) {
        PyErr_Format(PyExc_TypeError, "%s must be a str, not %R", what, (PyObject *)Py_TYPE(str));
        return NULL;
    }
    PyObject *b = PyUnicode_AsUTF8String(str);
    if (!b) return NULL;
    int rc = PyList_Append(s->keep, b);
    Py_DECREF(b);
    if (rc < 0) return NULL;
    const char *c = PyBytes_AsString(b);
    if (c && strlen(c) != (size_t)PyBytes_Size(b)) {
        PyErr_Format(PyExc_ValueError, "%s must not contain NUL characters", what);
        return NULL;
    }
    return c;
}

static int parse_source(save_state *s, PyObject *item, size_t i) {
    PyObject *name_o, *dtype_o, *shape_o, *addr_o, *nbytes_o, *kind_o;
    if (!PyArg_ParseTuple(item, "OOOOOO:tensor", &name_o, &dtype_o, &shape_o, &addr_o, &nbytes_o, &kind_o))
        return -1;
    ckptio_tensor_source *src = &s->sources[i];
    uint64_t addr, nbytes;
    src->name = keep_utf8(s, name_o, "tensor name");
    if (!src->name || ckpy_dtype(dtype_o, &src->dtype) < 0 || ckpy_u64(addr_o, "tensor address", &addr) < 0 ||
        ckpy_u64(nbytes_o, "tensor nbytes", &nbytes) < 0 || ckpy_mem_kind(kind_o, &src->mem_kind) < 0)
        return -1;
    if (!PySequence_Check(shape_o)) {
        PyErr_Format(PyExc_TypeError, "shape of tensor '%s' must be a sequence of ints", src->name);
        return -1;
    }
    Py_ssize_t ndim = PySequence_Size(shape_o);
    if (ndim < 0) return -1;
    s->shapes[i] = PyMem_Calloc(ndim ? (size_t)ndim : 1, sizeof(int64_t));
    if (!s->shapes[i]) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t d = 0; d < ndim; d++) {
        PyObject *v = PySequence_GetItem(shape_o, d);
        if (!v) return -1;
        long long dim = PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (dim == -1 && PyErr_Occurred()) return -1;
        if (dim < 0) {
            PyErr_Format(PyExc_ValueError, "tensor '%s': dimension %zd is negative (%lld)", src->name, d, dim);
            return -1;
        }
        s->shapes[i][d] = (int64_t)dim;
    }
    src->ndim = (uint32_t)ndim;
    src->shape = s->shapes[i];
    src->data = (const void *)(uintptr_t)addr;
    src->nbytes = nbytes;
    return 0;
}

static int parse_metadata(save_state *s, PyObject *metadata) {
    if (metadata == Py_None) return 0;
    if (!PyDict_Check(metadata)) {
        PyErr_SetString(PyExc_TypeError, "metadata must be a dict of str to str, or None");
        return -1;
    }
    Py_ssize_t n = PyDict_Size(metadata);
    s->kvs = PyMem_Calloc(n ? (size_t)n : 1, sizeof *s->kvs);
    if (!s->kvs) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(metadata, &pos, &key, &value)) {
        ckptio_kv *kv = &s->kvs[s->kv_count];
        kv->key = keep_utf8(s, key, "metadata key");
        if (!kv->key) return -1;
        kv->value = keep_utf8(s, value, "metadata value");
        if (!kv->value) return -1;
        s->kv_count++;
    }
    return 0;
}

typedef struct save_call {
    const char *path;
    const save_state *s;
    unsigned flags;
    int model;                        /* ckptio_model_save with `options`, else ckptio_safetensors_save */
    ckptio_model_save_options options;
    size_t nshards;
} save_call;

static ckptio_status do_save(ckptio_engine *engine, void *arg) {
    save_call *c = arg;
    const save_state *s = c->s;
    if (c->model) {
        c->options.metadata = s->kv_count ? s->kvs : NULL;
        c->options.metadata_count = s->kv_count;
        return ckptio_model_save(engine, c->path, s->sources, s->count, &c->options, &c->nshards);
    }
    return ckptio_safetensors_save(engine, c->path, s->sources, s->count, s->kv_count ? s->kvs : NULL, s->kv_count,
                                   c->flags);
}

/* The tensors and metadata of a save call into `s` (zeroed); -1 with an error. */
static int parse_save(save_state *s, PyObject *seq, PyObject *metadata) {
    if (!PySequence_Check(seq)) {
        PyErr_SetString(PyExc_TypeError,
                        "tensors must be a sequence of (name, dtype, shape, address, nbytes, mem_kind)");
        return -1;
    }
    const Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return -1;
    s->count = (size_t)n;
    s->keep = PyList_New(0);
    s->sources = PyMem_Calloc(n ? (size_t)n : 1, sizeof *s->sources);
    s->shapes = PyMem_Calloc(n ? (size_t)n : 1, sizeof *s->shapes);
    if (!s->keep || !s->sources || !s->shapes) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (!item) return -1;
        const int rc = parse_source(s, item, (size_t)i);
        Py_DECREF(item);
        if (rc < 0) return -1;
    }
    return parse_metadata(s, metadata);
}

static void save_state_free(save_state *s) {
    if (s->shapes)
        for (size_t i = 0; i < s->count; i++) PyMem_Free(s->shapes[i]);
    PyMem_Free(s->shapes);
    PyMem_Free(s->sources);
    PyMem_Free(s->kvs);
    Py_XDECREF(s->keep);
}

static int align_flags(int align, unsigned *flags) {
    if (align == 4096) *flags = CKPTIO_SAFETENSORS_ALIGN_4K;
    else if (align == 8) *flags = CKPTIO_SAFETENSORS_ALIGN_8;
    else {
        PyErr_Format(PyExc_ValueError,
                     "align must be 4096 (data section 4 KiB-aligned) or 8 (reference layout), not %d", align);
        return -1;
    }
    return 0;
}

/* Parses the tensors, the metadata, the path and the engine, and makes the call with the GIL released; -1 with
 * an error. */
static int run_save(save_call *call, PyObject *seq, PyObject *metadata, PyObject *path_arg, PyObject *engine_arg) {
    int rc = -1;
    PyObject *pb = NULL;
    ckpy_engine *engine = NULL;
    save_state s;
    memset(&s, 0, sizeof s);
    if (parse_save(&s, seq, metadata) < 0 || !(pb = ckpy_path_bytes(path_arg)) ||
        !(engine = ckpy_engine_resolve(engine_arg)))
        goto out;
    call->path = PyBytes_AsString(pb);
    call->s = &s;
    rc = ckpy_engine_run(engine, do_save, call);
out:
    save_state_free(&s);
    Py_XDECREF(pb);
    Py_XDECREF(engine);
    return rc < 0 ? -1 : 0;
}

PyObject *ckpy_safetensors_save(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "tensors", "metadata", "align", "engine", "checksums", "in_place", NULL};
    PyObject *path_arg, *seq, *metadata = Py_None, *engine_arg = Py_None;
    int align = 4096, checksums = 0, in_place = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OiOpp:safetensors_save", kwlist, &path_arg, &seq, &metadata,
                                     &align, &engine_arg, &checksums, &in_place))
        return NULL;
    save_call call = {0};
    if (align_flags(align, &call.flags) < 0) return NULL;
    if (checksums) call.flags |= CKPTIO_SAFETENSORS_CHECKSUMS;
    if (in_place) call.flags |= CKPTIO_SAFETENSORS_IN_PLACE;
    if (run_save(&call, seq, metadata, path_arg, engine_arg) < 0) return NULL;
    Py_RETURN_NONE;
}

/* model_save(dir, tensors, max_shard_size, metadata=None, engine=None, overwrite=False) -> shard count */
PyObject *ckpy_model_save(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dir", "tensors", "max_shard_size", "metadata", "engine", "overwrite", NULL};
    PyObject *path_arg, *seq, *metadata = Py_None, *engine_arg = Py_None;
    unsigned long long max_shard_size;
    int overwrite = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOK|OOp:model_save", kwlist, &path_arg, &seq, &max_shard_size,
                                     &metadata, &engine_arg, &overwrite))
        return NULL;
    save_call call = {.model = 1,
                      .options = {.max_shard_size = max_shard_size,
                                  .flags = overwrite ? CKPTIO_MODEL_SAVE_OVERWRITE : 0}};
    if (run_save(&call, seq, metadata, path_arg, engine_arg) < 0) return NULL;
    return PyLong_FromSize_t(call.nshards);
}

/* safetensors_serialize(tensors, metadata=None, align=4096) -> bytes: the
 * file ckptio_safetensors_save would write, made in memory
 * (ckptio_safetensors_layout, then one copy of each tensor straight into the
 * bytes object, with the GIL released). Host and pinned memory only. */
static PyObject *mod_safetensors_serialize(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"tensors", "metadata", "align", NULL};
    PyObject *seq, *metadata = Py_None;
    int align = 4096;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Oi:safetensors_serialize", kwlist, &seq, &metadata, &align))
        return NULL;
    unsigned flags;
    if (align_flags(align, &flags) < 0) return NULL;
    PyObject *result = NULL, *out = NULL;
    uint64_t *offsets = NULL;
    save_state s;
    memset(&s, 0, sizeof s);
    if (parse_save(&s, seq, metadata) < 0) goto fail;
    for (size_t i = 0; i < s.count; i++)
        if (s.sources[i].mem_kind != CKPTIO_MEM_HOST && s.sources[i].mem_kind != CKPTIO_MEM_PINNED) {
            PyErr_Format(PyExc_ValueError, "safetensors_serialize: tensor '%s' is not in host memory",
                         s.sources[i].name);
            goto fail;
        }
    const ckptio_kv *kvs = s.kv_count ? s.kvs : NULL;
    uint64_t header_size = 0, file_size = 0;
    ckptio_status st = ckptio_safetensors_layout(s.sources, s.count, kvs, s.kv_count, flags, NULL, 0, &header_size,
                                                 NULL, &file_size);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        goto fail;
    }
    offsets = PyMem_Calloc(s.count ? s.count : 1, sizeof *offsets);
    out = offsets ? PyBytes_FromStringAndSize(NULL, (Py_ssize_t)file_size) : PyErr_NoMemory();
    if (!out) goto fail;
    unsigned char *file = (unsigned char *)PyBytes_AsString(out);
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_safetensors_layout(s.sources, s.count, kvs, s.kv_count, flags, file, header_size, &header_size,
                                   offsets, &file_size);
    for (size_t i = 0; st == CKPTIO_OK && i < s.count; i++)
        st = ckptio_mapping_copy(file + offsets[i], s.sources[i].data, (size_t)s.sources[i].nbytes);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        goto fail;
    }
    result = out;
    out = NULL;
fail:
    Py_XDECREF(out);
    PyMem_Free(offsets);
    save_state_free(&s);
    return result;
}

/* ---- a file held in memory --------------------------------------------------- */

/* safetensors_describe(address, length, what) -> (tensors, metadata): the
 * header of a whole safetensors file at [address, address + length) parsed
 * and validated (ckptio_safetensors_parse), the tensors as
 * (name, dtype code, shape, offset, nbytes, 0) in offset order, as
 * ModelReader.tensors gives them. Errors name the data `what`. The caller
 * keeps the memory alive for the call. */
static PyObject *mod_safetensors_describe(PyObject *module, PyObject *args) {
    PyObject *addr_o, *len_o;
    const char *what;
    uint64_t addr, len;
    if (!PyArg_ParseTuple(args, "OOs:safetensors_describe", &addr_o, &len_o, &what) ||
        ckpy_u64(addr_o, "address", &addr) < 0 || ckpy_u64(len_o, "length", &len) < 0)
        return NULL;
    ckptio_safetensors *handle = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_safetensors_parse((const void *)(uintptr_t)addr, (size_t)len, len, &handle);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) {
        const ckptio_error_info *e = ckptio_last_error();
        return ckpy_raise_custom(st, 0, NULL, what, e->file_offset, "%s", e->message);
    }
    PyObject *result = NULL, *tensors = NULL, *metadata = PyDict_New();
    size_t count = 0, mcount = 0;
    ckptio_safetensors_count(handle, &count);
    ckptio_safetensors_metadata_count(handle, &mcount);
    if (!metadata || !(tensors = PyList_New((Py_ssize_t)count))) goto out;
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        ckptio_safetensors_tensor(handle, i, &info);
        PyObject *shape = ckpy_int64_tuple(info.shape, info.ndim);
        if (!shape) goto out;
        PyObject *row = Py_BuildValue("(s#iNKKi)", info.name, (Py_ssize_t)strlen(info.name), (int)info.dtype, shape,
                                      (unsigned long long)info.file_offset, (unsigned long long)info.nbytes, 0);
        if (!row) goto out;
        PyList_SetItem(tensors, (Py_ssize_t)i, row);
    }
    for (size_t i = 0; i < mcount; i++) {
        ckptio_kv kv;
        ckptio_safetensors_metadata(handle, i, &kv);
        PyObject *k = PyUnicode_FromString(kv.key);
        PyObject *v = k ? PyUnicode_FromString(kv.value) : NULL;
        const int rc = v ? PyDict_SetItem(metadata, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) goto out;
    }
    result = PyTuple_Pack(2, tensors, metadata);
out:
    Py_XDECREF(tensors);
    Py_XDECREF(metadata);
    ckptio_safetensors_close(handle);
    return result;
}

static PyMethodDef module_methods[] = {
    {"safetensors_serialize", (PyCFunction)(void (*)(void))mod_safetensors_serialize, METH_VARARGS | METH_KEYWORDS,
     "safetensors_serialize(tensors, metadata=None, align=4096) -> bytes: the file safetensors_save would write,\n"
     "made in memory (host tensors; one copy of each, GIL released)."},
    {"safetensors_describe", mod_safetensors_describe, METH_VARARGS,
     "safetensors_describe(address, length, what) -> (tensors, metadata): a whole safetensors file held in\n"
     "memory, parsed and validated; tensors as (name, dtype code, shape, offset, nbytes, 0) in offset order."},
    {NULL, NULL, 0, NULL},
};

int ckpy_safetensors_add_to_module(PyObject *module) {
    reader_type = (PyTypeObject *)PyType_FromSpec(&reader_spec);
    if (!reader_type) return -1;
    if (PyModule_AddObject(module, "SafetensorsReader", (PyObject *)reader_type) < 0) {
        Py_DECREF(reader_type);
        return -1;
    }
    return PyModule_AddFunctions(module, module_methods);
}
