/*
 * ckpy_model.c - ModelReader: a safetensors file, a Hugging Face
 * directory or its index as one handle (ckptio_model_open/_read/_close).
 *
 * Like SafetensorsReader, the description (tensors with their shard, shard
 * paths, merged __metadata__, the index) is copied into Python objects once
 * at open; only reads, verify and close touch the C handle. read() takes
 * whole-tensor targets in SafetensorsReader's form; read_slices() takes
 * boxes, all read in one ckptio_model_read() call (one engine plan).
 */
#include "ckpy_handle.h"
#include "ckpy_mapping.h"
#include "ckpy_parts.h"

#include <string.h>

typedef struct ckpy_model_reader {
    ckpy_handle h;           /* h.handle: the ckptio_model, NULL once closed */
    PyObject *tensors;       /* list of (name, dtype code, shape, file_offset, nbytes, shard), model order */
    PyObject *shards;        /* list of shard paths (str), shard order */
    PyObject *metadata;      /* dict str -> str */
    PyObject *index;         /* str path of the index, or None */
    PyObject *total_size;    /* int, or None */
    int has_metadata;        /* some shard has a __metadata__ object (maybe empty) */
} ckpy_model_reader;

static PyTypeObject *model_type = NULL;

/* ---- opening -------------------------------------------------------------------------- */

/* The rows (name, dtype code, shape, file_offset, nbytes, shard) into
 * self->tensors (a list of `count` slots). */
static int describe_rows(ckpy_model_reader *self, const ckptio_model *m, size_t count) {
    int rc = -1;
    /* A row that repeats the last one's shape and size shares those objects
     * (tuples and ints are immutable): 100,000 experts of one shape cost one. */
    PyObject *last_shape = NULL, *last_nbytes = NULL;
    const int64_t *last_dims = NULL; /* the model's, alive while it is open */
    uint32_t last_ndim = 0;
    uint64_t last_size = 0;
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        size_t shard = 0;
        const ckptio_status st = ckptio_model_tensor(m, i, &info, &shard);
        if (st != CKPTIO_OK) {
            ckpy_raise(st);
            goto out;
        }
        if (!last_shape || last_ndim != info.ndim ||
            (info.ndim && memcmp(last_dims, info.shape, info.ndim * sizeof *info.shape) != 0)) {
            Py_XDECREF(last_shape);
            if (!(last_shape = ckpy_int64_tuple(info.shape, info.ndim))) goto out;
            last_dims = info.shape;
            last_ndim = info.ndim;
        }
        if (!last_nbytes || last_size != info.nbytes) {
            Py_XDECREF(last_nbytes);
            if (!(last_nbytes = PyLong_FromUnsignedLongLong((unsigned long long)info.nbytes))) goto out;
            last_size = info.nbytes;
        }
        PyObject *row = PyTuple_New(6);
        if (!row) goto out;
        PyList_SetItem(self->tensors, (Py_ssize_t)i, row); /* steals it; its items follow */
        PyObject *name = PyUnicode_FromStringAndSize(info.name, (Py_ssize_t)strlen(info.name));
        PyObject *code = name ? PyLong_FromLong((long)info.dtype) : NULL;
        PyObject *offset = code ? PyLong_FromUnsignedLongLong((unsigned long long)info.file_offset) : NULL;
        PyObject *where = offset ? PyLong_FromSize_t(shard) : NULL;
        if (!where) {
            Py_XDECREF(name);
            Py_XDECREF(code);
            Py_XDECREF(offset);
            goto out;
        }
        Py_INCREF(last_shape);
        Py_INCREF(last_nbytes);
        PyTuple_SetItem(row, 0, name);
        PyTuple_SetItem(row, 1, code);
        PyTuple_SetItem(row, 2, last_shape);
        PyTuple_SetItem(row, 3, offset);
        PyTuple_SetItem(row, 4, last_nbytes);
        PyTuple_SetItem(row, 5, where);
    }
    rc = 0;
out:
    Py_XDECREF(last_shape);
    Py_XDECREF(last_nbytes);
    return rc;
}

static int describe(ckpy_model_reader *self) {
    const ckptio_model *m = self->h.handle;
    size_t count = 0, nshards = 0, nmeta = 0;
    ckptio_status st = ckptio_model_count(m, &count);
    if (st == CKPTIO_OK) st = ckptio_model_shard_count(m, &nshards);
    if (st == CKPTIO_OK) st = ckptio_model_metadata_count(m, &nmeta);
    if (st == CKPTIO_OK) st = ckptio_model_has_metadata(m, &self->has_metadata);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        return -1;
    }
    self->tensors = PyList_New((Py_ssize_t)count);
    self->shards = PyList_New((Py_ssize_t)nshards);
    self->metadata = PyDict_New();
    if (!self->tensors || !self->shards || !self->metadata) return -1;
    if (describe_rows(self, m, count) < 0) return -1;
    for (size_t s = 0; s < nshards; s++) {
        const char *path = NULL;
        if ((st = ckptio_model_shard(m, s, &path, NULL)) != CKPTIO_OK) {
            ckpy_raise(st);
            return -1;
        }
        PyObject *p = PyUnicode_DecodeFSDefault(path);
        if (!p) return -1;
        PyList_SetItem(self->shards, (Py_ssize_t)s, p);
    }
    for (size_t i = 0; i < nmeta; i++) {
        ckptio_kv kv;
        if ((st = ckptio_model_metadata(m, i, &kv)) != CKPTIO_OK) {
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
    const char *index = NULL;
    int64_t total = -1;
    if (ckptio_model_index(m, &index, &total) == CKPTIO_OK) {
        self->index = PyUnicode_DecodeFSDefault(index);
        if (!self->index) return -1;
    } else {
        self->index = Py_None;
        Py_INCREF(Py_None);
    }
    if (total >= 0) {
        self->total_size = PyLong_FromLongLong((long long)total);
        if (!self->total_size) return -1;
    } else {
        self->total_size = Py_None;
        Py_INCREF(Py_None);
    }
    return 0;
}

static ckptio_status open_handle(ckptio_engine *engine, const char *path, void *arg, void **handle) {
    ckptio_model *m = NULL;
    ckptio_status status = ckptio_model_open(engine, path, *(const unsigned *)arg, &m);
    *handle = m;
    return status;
}

static ckptio_status close_handle(ckpy_handle *h) { return ckptio_model_close(h->handle); }

static const ckpy_handle_kind model_kind = {"model reader", close_handle, 0};

static PyObject *model_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"path", "engine", "allow_symlinks", NULL};
    PyObject *path_arg, *engine_arg = Py_None;
    int allow = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Op:ModelReader", kwlist, &path_arg, &engine_arg, &allow))
        return NULL;
    unsigned flags = allow ? CKPTIO_MODEL_ALLOW_SYMLINKS : 0;
    ckpy_handle *self = ckpy_handle_new(type, &model_kind, path_arg, engine_arg, open_handle, &flags);
    if (!self) return NULL;
    if (describe((ckpy_model_reader *)self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void model_dealloc(PyObject *obj) {
    ckpy_model_reader *self = (ckpy_model_reader *)obj;
    Py_CLEAR(self->tensors);
    Py_CLEAR(self->shards);
    Py_CLEAR(self->metadata);
    Py_CLEAR(self->index);
    Py_CLEAR(self->total_size);
    ckpy_handle_dealloc(obj);
}

/* ---- reading ------------------------------------------------------------------------- */

typedef struct read_args {
    const ckptio_slice_target *targets;
    size_t count;
} read_args;

static ckptio_status do_read(ckpy_handle *h, void *arg) {
    const read_args *a = arg;
    return ckptio_model_read(h->handle, a->targets, a->count);
}

static PyObject *model_read(PyObject *obj, PyObject *seq) {
    size_t n = 0;
    ckptio_tensor_target *whole =
        ckpy_parse_targets(seq, "read() takes a sequence of (index, address, capacity, mem_kind)", &n);
    if (!whole) return NULL;
    ckptio_slice_target *targets = PyMem_Calloc(n ? n : 1, sizeof *targets);
    if (!targets) {
        PyMem_Free(whole);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < n; i++)
        targets[i] = (ckptio_slice_target){.index = whole[i].index, .data = whole[i].data,
                                           .capacity = whole[i].capacity, .mem_kind = whole[i].mem_kind};
    PyMem_Free(whole);
    read_args a = {targets, n};
    int rc = ckpy_handle_run((ckpy_handle *)obj, do_read, &a);
    PyMem_Free(targets);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* A tuple of ints into `out` (ndim entries, allocated); None leaves NULL. */
static int parse_bounds(PyObject *o, const char *what, size_t i, int64_t **out, Py_ssize_t *ndim) {
    *out = NULL;
    if (o == Py_None) return 0;
    if (!PyTuple_Check(o)) {
        PyErr_Format(PyExc_TypeError, "read_slices(): %s of slice %zu must be a tuple of ints or None", what, i);
        return -1;
    }
    const Py_ssize_t n = PyTuple_Size(o);
    if (*ndim >= 0 && n != *ndim) {
        PyErr_Format(PyExc_ValueError, "read_slices(): slice %zu has %zd start and %zd stop entries", i, *ndim, n);
        return -1;
    }
    *ndim = n;
    *out = PyMem_Calloc(n ? (size_t)n : 1, sizeof **out);
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t d = 0; d < n; d++) {
        long long v = PyLong_AsLongLong(PyTuple_GetItem(o, d));
        if (v == -1 && PyErr_Occurred()) return -1;
        (*out)[d] = (int64_t)v;
    }
    return 0;
}

static PyObject *model_read_slices(PyObject *obj, PyObject *seq) {
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_SetString(PyExc_TypeError,
                        "read_slices() takes a list of (index, start, stop, address, capacity, mem_kind)");
        return NULL;
    }
    const Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return NULL;
    PyObject *result = NULL;
    ckptio_slice_target *targets = PyMem_Calloc(n ? (size_t)n : 1, sizeof *targets);
    int64_t **bounds = PyMem_Calloc(n ? 2 * (size_t)n : 1, sizeof *bounds);
    if (!targets || !bounds) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (!item) goto out;
        PyObject *index_o, *start_o, *stop_o, *addr_o, *cap_o, *kind_o;
        uint64_t index, addr, cap;
        Py_ssize_t ndim = -1;
        int ok = PyArg_ParseTuple(item, "OOOOOO:slice target", &index_o, &start_o, &stop_o, &addr_o, &cap_o,
                                  &kind_o) &&
                 ckpy_u64(index_o, "slice index", &index) == 0 && ckpy_u64(addr_o, "slice address", &addr) == 0 &&
                 ckpy_u64(cap_o, "slice capacity", &cap) == 0 &&
                 ckpy_mem_kind(kind_o, &targets[i].mem_kind) == 0 &&
                 parse_bounds(start_o, "start", (size_t)i, &bounds[2 * i], &ndim) == 0 &&
                 parse_bounds(stop_o, "stop", (size_t)i, &bounds[2 * i + 1], &ndim) == 0;
        Py_DECREF(item);
        if (!ok) goto out;
        targets[i].index = (size_t)index;
        targets[i].start = bounds[2 * i];
        targets[i].stop = bounds[2 * i + 1];
        targets[i].data = (void *)(uintptr_t)addr;
        targets[i].capacity = cap;
    }
    read_args a = {targets, (size_t)n};
    if (ckpy_handle_run((ckpy_handle *)obj, do_read, &a) < 0) goto out;
    result = Py_None;
    Py_INCREF(result);
out:
    for (Py_ssize_t i = 0; bounds && i < 2 * n; i++) PyMem_Free(bounds[i]);
    PyMem_Free(bounds);
    PyMem_Free(targets);
    return result;
}

/* The file offset, size and shard of tensor `i` from the rows copied at open. */
static int row_place(ckpy_model_reader *self, uint64_t i, uint64_t *offset, uint64_t *nbytes, Py_ssize_t *shard) {
    if (i >= (uint64_t)PyList_Size(self->tensors)) {
        PyErr_Format(PyExc_IndexError, "read_runs(): tensor index %llu out of range", (unsigned long long)i);
        return -1;
    }
    PyObject *row = PyList_GetItem(self->tensors, (Py_ssize_t)i);
    *offset = PyLong_AsUnsignedLongLong(PyTuple_GetItem(row, 3));
    *nbytes = PyLong_AsUnsignedLongLong(PyTuple_GetItem(row, 4));
    *shard = PyLong_AsSsize_t(PyTuple_GetItem(row, 5));
    return PyErr_Occurred() ? -1 : 0;
}

/* read_runs(runs): each run (first, count, address, capacity, mem_kind) is
 * the tensors first .. first + count - 1, back to back in one shard, read
 * back to back into one buffer: one extent (ckptio_model_read merges them). */
static PyObject *model_read_runs(PyObject *obj, PyObject *seq) {
    ckpy_model_reader *self = (ckpy_model_reader *)obj;
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, "read_runs() takes a list of (first, count, address, capacity, mem_kind)");
        return NULL;
    }
    const Py_ssize_t nruns = PySequence_Size(seq);
    if (nruns < 0) return NULL;
    size_t n = 0, cap = 0;
    ckptio_slice_target *targets = NULL;
    PyObject *result = NULL;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *item = PySequence_GetItem(seq, r);
        if (!item) goto out;
        PyObject *first_o, *count_o, *addr_o, *cap_o, *kind_o;
        uint64_t first, count, address, capacity;
        ckptio_mem_kind kind;
        const int ok = PyArg_ParseTuple(item, "OOOOO:run", &first_o, &count_o, &addr_o, &cap_o, &kind_o) &&
                       ckpy_u64(first_o, "run first", &first) == 0 && ckpy_u64(count_o, "run count", &count) == 0 &&
                       ckpy_u64(addr_o, "run address", &address) == 0 &&
                       ckpy_u64(cap_o, "run capacity", &capacity) == 0 && ckpy_mem_kind(kind_o, &kind) == 0;
        Py_DECREF(item);
        if (!ok) goto out;
        if (n + count > cap) {
            size_t grown = cap ? cap * 2 : 64;
            while (grown < n + count) grown *= 2;
            ckptio_slice_target *t = PyMem_Realloc(targets, grown * sizeof *t);
            if (!t) {
                PyErr_NoMemory();
                goto out;
            }
            targets = t;
            cap = grown;
        }
        uint64_t start = 0, used = 0;
        Py_ssize_t first_shard = 0;
        for (uint64_t k = 0; k < count; k++) {
            uint64_t offset, nbytes;
            Py_ssize_t shard;
            if (row_place(self, first + k, &offset, &nbytes, &shard) < 0) goto out;
            if (k == 0) {
                start = offset;
                first_shard = shard;
            }
            if (shard != first_shard || offset != start + used || used + nbytes > capacity) {
                PyErr_Format(PyExc_ValueError,
                             "read_runs(): run %zd: tensor %llu does not follow the run's tensors in one shard or "
                             "does not fit its %llu bytes",
                             r, (unsigned long long)(first + k), (unsigned long long)capacity);
                goto out;
            }
            targets[n++] = (ckptio_slice_target){.index = (size_t)(first + k),
                                                 .data = (void *)(uintptr_t)(address + used), .capacity = nbytes,
                                                 .mem_kind = kind};
            used += nbytes;
        }
    }
    read_args a = {targets, n};
    if (ckpy_handle_run((ckpy_handle *)obj, do_read, &a) < 0) goto out;
    result = Py_None;
    Py_INCREF(result);
out:
    PyMem_Free(targets);
    return result;
}

static ckptio_status do_map(ckpy_handle *h, void *arg) {
    void **io = arg; /* [0]: the shard (size_t *), [1]: the result (ckptio_mapping **) */
    return ckptio_model_map(h->handle, *(size_t *)io[0], io[1]);
}

static PyObject *model_map(PyObject *obj, PyObject *arg) {
    const Py_ssize_t shard = PyLong_AsSsize_t(arg);
    if (shard == -1 && PyErr_Occurred()) return NULL;
    if (shard < 0) {
        PyErr_SetString(PyExc_ValueError, "map(): the shard index must be >= 0");
        return NULL;
    }
    size_t s = (size_t)shard;
    ckptio_mapping *m = NULL;
    void *io[2] = {&s, &m};
    if (ckpy_handle_run((ckpy_handle *)obj, do_map, io) < 0) return NULL;
    return ckpy_mapping_wrap(m);
}

/* Every shard against the checksum manifest beside it. */
static ckptio_status do_verify(ckpy_handle *h, void *arg) {
    ckptio_verify_report *total = arg;
    size_t n = 0;
    ckptio_status st = ckptio_model_shard_count(h->handle, &n);
    for (size_t s = 0; st == CKPTIO_OK && s < n; s++) {
        ckptio_safetensors *shard = NULL;
        ckptio_verify_report rep;
        memset(&rep, 0, sizeof rep);
        st = ckptio_model_shard(h->handle, s, NULL, &shard);
        if (st == CKPTIO_OK) st = ckptio_safetensors_verify(shard, NULL, &rep);
        total->tensors += rep.tensors;
        total->blocks += rep.blocks;
        total->bytes += rep.bytes;
    }
    return st;
}

static PyObject *model_verify(PyObject *obj, PyObject *unused) {
    ckptio_verify_report rep;
    memset(&rep, 0, sizeof rep);
    if (ckpy_handle_run((ckpy_handle *)obj, do_verify, &rep) < 0) return NULL;
    return Py_BuildValue("{snsnsK}", "tensors", (Py_ssize_t)rep.tensors, "blocks", (Py_ssize_t)rep.blocks, "bytes",
                         (unsigned long long)rep.bytes);
}

/* ---- attributes ------------------------------------------------------------------------- */

static PyObject *get_tensors(PyObject *obj, void *c) {
    return PyList_GetSlice(((ckpy_model_reader *)obj)->tensors, 0, PY_SSIZE_T_MAX);
}

static PyObject *get_shards(PyObject *obj, void *c) {
    return PyList_GetSlice(((ckpy_model_reader *)obj)->shards, 0, PY_SSIZE_T_MAX);
}

static PyObject *get_metadata(PyObject *obj, void *c) { return PyDict_Copy(((ckpy_model_reader *)obj)->metadata); }

static PyObject *get_index(PyObject *obj, void *c) {
    PyObject *v = ((ckpy_model_reader *)obj)->index;
    Py_INCREF(v);
    return v;
}

static PyObject *get_total_size(PyObject *obj, void *c) {
    PyObject *v = ((ckpy_model_reader *)obj)->total_size;
    Py_INCREF(v);
    return v;
}

static PyObject *get_has_metadata(PyObject *obj, void *c) {
    return PyBool_FromLong(((ckpy_model_reader *)obj)->has_metadata);
}

static PyGetSetDef model_getset[] = {
    {"path", ckpy_handle_get_path, NULL, "The path given at open.", NULL},
    {"tensors", get_tensors, NULL,
     "List of (name, dtype code, shape, file_offset, nbytes, shard), in model order (index = position).", NULL},
    {"shards", get_shards, NULL, "Paths of the shards, sorted by file name.", NULL},
    {"metadata", get_metadata, NULL, "The shards' __metadata__ pairs merged (first shard wins).", NULL},
    {"has_metadata", get_has_metadata, NULL, "True when a shard has a __metadata__ object (maybe empty).", NULL},
    {"index", get_index, NULL, "Path of the index that was read, or None.", NULL},
    {"total_size", get_total_size, NULL, "The index's metadata.total_size, or None.", NULL},
    {"closed", ckpy_handle_get_closed, NULL, "True after close().", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef model_methods[] = {
    {"read", model_read, METH_O,
     "read(targets): reads whole tensors; targets is a sequence of (index, address, capacity, mem_kind).\n"
     "One plan over all shards, GIL released."},
    {"read_slices", model_read_slices, METH_O,
     "read_slices(targets): reads boxes of tensors; targets is a list of\n"
     "(index, start, stop, address, capacity, mem_kind), start/stop tuples of ints (None: the whole\n"
     "tensor). Each box lands in C order. One plan, GIL released."},
    {"read_runs", model_read_runs, METH_O,
     "read_runs(runs): each run (first, count, address, capacity, mem_kind) reads the tensors first ..\n"
     "first + count - 1, back to back in one shard, back to back into one buffer. One plan, GIL released."},
    {"map", model_map, METH_O,
     "map(shard) -> Mapping: the shard's file mapped into memory, private and copy-on-write (a tensor is at\n"
     "address + its file_offset)."},
    {"verify", model_verify, METH_NOARGS,
     "verify() -> dict: checks every shard against the checksum manifest beside it."},
    {"close", ckpy_handle_close, METH_NOARGS, "close(): releases every shard (waits for a read in flight)."},
    {"__enter__", ckpy_handle_enter, METH_NOARGS, NULL},
    {"__exit__", ckpy_handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot model_slots[] = {
    {Py_tp_new, model_new},
    {Py_tp_dealloc, model_dealloc},
    {Py_tp_methods, model_methods},
    {Py_tp_getset, model_getset},
    {Py_tp_doc, "ModelReader(path, engine=None, allow_symlinks=False): a safetensors file, a Hugging Face\n"
                "directory or its index as one validated handle."},
    {0, NULL},
};

static PyType_Spec model_spec = {
    "ckptio._ckptio.ModelReader",
    sizeof(ckpy_model_reader),
    0,
    Py_TPFLAGS_DEFAULT,
    model_slots,
};

int ckpy_model_add_to_module(PyObject *module);

int ckpy_model_add_to_module(PyObject *module) {
    model_type = (PyTypeObject *)PyType_FromSpec(&model_spec);
    if (!model_type) return -1;
    if (PyModule_AddObject(module, "ModelReader", (PyObject *)model_type) < 0) {
        Py_DECREF(model_type);
        return -1;
    }
    return 0;
}
