/*
 * ckpy_dcp.c - what ckptio.dcp (torch.distributed.checkpoint storage)
 * needs from C: writing the items of .distcp files (ckptio_dcp_write: one
 * engine plan for every item of every file of a rank), reading extents of
 * several files in one plan, describing stored items (ckptio_dcp_header_*:
 * only their headers are read; the tensor bytes are then read with the
 * engine), XXH3-64 hashes and zstd decompression.
 */
#include "ckpy_file.h"
#include "ckpy_parts.h"

#include <string.h>

static int int64_array(PyObject *seq, int64_t **out, uint32_t *n_out) {
    PyObject *fast = PySequence_List(seq);
    if (!fast) return -1;
    const Py_ssize_t n = PyList_Size(fast);
    int64_t *v = PyMem_Calloc(n ? (size_t)n : 1, sizeof *v);
    if (!v) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const long long x = PyLong_AsLongLong(PyList_GetItem(fast, i));
        if (x == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            PyMem_Free(v);
            return -1;
        }
        v[i] = (int64_t)x;
    }
    Py_DECREF(fast);
    *out = v;
    *n_out = (uint32_t)n;
    return 0;
}

/* ---- writing items ------------------------------------------------------------ */

typedef struct write_call {
    ckptio_dcp_item *items;
    size_t count;
    ckptio_torch_save_options options;
} write_call;

static ckptio_status do_write(ckptio_engine *engine, void *arg) {
    write_call *c = arg;
    return ckptio_dcp_write(engine, c->items, c->count, &c->options);
}

/* A one-tensor archive as torch.save(tensor) writes it: storage "cpu" (torch
 * moves DCP tensors to the cpu first), C-contiguous, no grad. */
static int build_archive(PyObject *spec, ckptio_torch_writer **out) {
    PyObject *code_o, *shape_o, *addr_o, *nbytes_o, *kind_o;
    if (!PyArg_ParseTuple(spec, "OOOOO:tensor item", &code_o, &shape_o, &addr_o, &nbytes_o, &kind_o)) return -1;
    ckptio_dtype dtype;
    uint64_t addr, nbytes;
    ckptio_mem_kind kind;
    if (ckpy_dtype(code_o, &dtype) < 0 || ckpy_u64(addr_o, "address", &addr) < 0 ||
        ckpy_u64(nbytes_o, "nbytes", &nbytes) < 0 || ckpy_mem_kind(kind_o, &kind) < 0)
        return -1;
    int64_t *shape = NULL;
    uint32_t ndim = 0;
    if (int64_array(shape_o, &shape, &ndim) < 0) return -1;
    ckptio_torch_writer *w = NULL;
    size_t sid = 0;
    ckptio_value *root = NULL;
    ckptio_status st = ckptio_torch_writer_create(&w);
    if (st == CKPTIO_OK)
        st = ckptio_torch_writer_storage(w, dtype, nbytes, "cpu", (const void *)(uintptr_t)addr, kind, &sid);
    if (st == CKPTIO_OK) {
        ckptio_torch_tensor_spec ts;
        memset(&ts, 0, sizeof ts);
        ts.storage = sid;
        ts.dtype = dtype;
        ts.ndim = ndim;
        ts.shape = shape;
        st = ckptio_torch_writer_tensor(w, &ts, &root);
    }
    if (st == CKPTIO_OK) st = ckptio_torch_writer_set_root(w, root);
    PyMem_Free(shape);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        ckptio_torch_writer_destroy(w);
        return -1;
    }
    *out = w;
    return 0;
}

static PyObject *mod_dcp_write(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"items", "alignment", "engine", NULL};
    PyObject *seq, *engine_arg = Py_None;
    unsigned int alignment = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|IO:dcp_write", kwlist, &seq, &alignment, &engine_arg))
        return NULL;
    PyObject *fast = PySequence_List(seq); /* holds every payload alive for the call */
    if (!fast) return NULL;
    const Py_ssize_t n = PyList_Size(fast);
    PyObject *result = NULL;
    ckpy_engine *engine = NULL;
    write_call c;
    memset(&c, 0, sizeof c);
    c.items = PyMem_Calloc(n ? (size_t)n : 1, sizeof *c.items);
    if (!c.items) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *file_o, *payload;
        unsigned int flags;
        if (!PyArg_ParseTuple(PyList_GetItem(fast, i), "OIO:item", &file_o, &flags, &payload)) goto out;
        ckptio_dcp_item *it = &c.items[i];
        if (!(it->file = ckpy_file_handle(file_o))) goto out;
        it->flags = flags;
        if (PyBytes_Check(payload)) {
            it->bytes = PyBytes_AsString(payload); /* the caller's list keeps it alive */
            it->nbytes = (uint64_t)PyBytes_Size(payload);
        } else if (build_archive(payload, &it->archive) < 0) {
            goto out;
        }
        c.count = (size_t)i + 1;
    }
    if (!(engine = ckpy_engine_resolve(engine_arg))) goto out;
    c.options.storage_alignment = alignment;
    c.options.record_prefix = "archive";
    c.count = (size_t)n;
    if (ckpy_engine_run(engine, do_write, &c) < 0) goto out;
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result && i < n; i++) {
        const ckptio_dcp_item *it = &c.items[i];
        PyObject *hash = it->hashed ? PyLong_FromUnsignedLongLong(it->hash) : (Py_INCREF(Py_None), Py_None);
        PyObject *parts = it->parts ? PyList_New((Py_ssize_t)it->nparts) : (Py_INCREF(Py_None), Py_None);
        for (size_t k = 0; parts && it->parts && k < it->nparts; k++) {
            const ckptio_dcp_part *pt = &it->parts[k];
            PyObject *part = Py_BuildValue("(KKK)", (unsigned long long)pt->offset, (unsigned long long)pt->length,
                                           (unsigned long long)pt->hash);
            if (!part) Py_CLEAR(parts);
            else PyList_SetItem(parts, (Py_ssize_t)k, part);
        }
        PyObject *row = hash && parts ? Py_BuildValue("(KKNN)", (unsigned long long)it->offset,
                                                      (unsigned long long)it->length, hash, parts)
                                      : NULL;
        if (!row) {
            Py_XDECREF(hash);
            Py_XDECREF(parts);
        }
        if (!row) {
            Py_CLEAR(result);
            break;
        }
        PyList_SetItem(result, i, row);
    }
out:
    for (size_t i = 0; c.items && i < (size_t)n; i++) ckptio_torch_writer_destroy(c.items[i].archive);
    if (c.items) ckptio_dcp_items_release(c.items, (size_t)n);
    PyMem_Free(c.items);
    Py_XDECREF(engine);
    Py_DECREF(fast);
    return result;
}

/* ---- committing a save's data files ------------------------------------------------ */

typedef struct commit_call {
    ckptio_file **files;
    size_t count;
    unsigned flags;
} commit_call;

static ckptio_status do_commit_unreferenced(ckptio_engine *engine, void *arg) {
    (void)engine;
    const commit_call *c = arg;
    return ckptio_file_commit_unreferenced(c->files, c->count, c->flags);
}

static PyObject *mod_commit_unreferenced(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"files", "engine", "sync_later", NULL};
    PyObject *seq, *engine_arg = Py_None;
    int sync_later = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|Op:commit_unreferenced", kwlist, &seq, &engine_arg,
                                     &sync_later))
        return NULL;
    PyObject *fast = PySequence_List(seq); /* holds every File alive for the call */
    if (!fast) return NULL;
    const Py_ssize_t n = PyList_Size(fast);
    PyObject *result = NULL;
    ckpy_engine *engine = NULL;
    commit_call c = {PyMem_Calloc(n ? (size_t)n : 1, sizeof *c.files), (size_t)n,
                     sync_later ? CKPTIO_COMMIT_SYNC_LATER : 0u};
    if (!c.files) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!(c.files[i] = ckpy_file_handle(PyList_GetItem(fast, i)))) goto out;
    if (!(engine = ckpy_engine_resolve(engine_arg))) goto out;
    if (ckpy_engine_run(engine, do_commit_unreferenced, &c) < 0) goto out;
    result = Py_None;
    Py_INCREF(result);
out:
    PyMem_Free(c.files);
    Py_XDECREF(engine);
    Py_DECREF(fast);
    return result;
}

/* ---- reading extents of several files in one plan -------------------------------- */

typedef struct read_call {
    ckptio_extent *extents;
    size_t count;
} read_call;

static ckptio_status do_read(ckptio_engine *engine, void *arg) {
    const read_call *c = arg;
    return ckptio_engine_execute_extents(engine, CKPTIO_READ, c->extents, c->count);
}

static PyObject *mod_dcp_read(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"extents", "engine", NULL};
    PyObject *seq, *engine_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:dcp_read", kwlist, &seq, &engine_arg)) return NULL;
    PyObject *fast = PySequence_List(seq);
    if (!fast) return NULL;
    const Py_ssize_t n = PyList_Size(fast);
    PyObject *result = NULL;
    ckpy_engine *engine = NULL;
    read_call c = {0};
    c.extents = PyMem_Calloc(n ? (size_t)n : 1, sizeof *c.extents);
    if (!c.extents) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *file_o, *addr_o, *len_o, *off_o, *kind_o;
        ckptio_extent *e = &c.extents[i];
        if (!PyArg_ParseTuple(PyList_GetItem(fast, i), "OOOOO:extent", &file_o, &addr_o, &len_o, &off_o,
                              &kind_o))
            goto out;
        if (!(e->file = ckpy_file_handle(file_o)) || ckpy_parse_extent(addr_o, len_o, off_o, kind_o, e) < 0)
            goto out;
    }
    if (!(engine = ckpy_engine_resolve(engine_arg))) goto out;
    c.count = (size_t)n;
    if (ckpy_engine_run(engine, do_read, &c) < 0) goto out;
    result = Py_None;
    Py_INCREF(result);
out:
    PyMem_Free(c.extents);
    Py_XDECREF(engine);
    Py_DECREF(fast);
    return result;
}

/* ---- describing items (ckptio_dcp_header_*) ------------------------------------------ */

#define HEADER_CAPSULE "ckptio.dcp_header"

static void header_capsule_free(PyObject *capsule) {
    ckptio_dcp_header *h = PyCapsule_GetPointer(capsule, HEADER_CAPSULE);
    if (!h) PyErr_Clear();
    ckptio_dcp_header_close(h);
}

static PyObject *header_capsule(ckptio_dcp_header *h) {
    PyObject *capsule = PyCapsule_New(h, HEADER_CAPSULE, header_capsule_free);
    if (!capsule) ckptio_dcp_header_close(h);
    return capsule;
}

typedef struct header_call {
    uint64_t offset, length, bytes_read;
    ckptio_dcp_header *header;
} header_call;

static ckptio_status do_header_read(ckpy_handle *file, void *arg) {
    header_call *c = arg;
    return ckptio_dcp_header_read(file->handle, c->offset, c->length, NULL, &c->bytes_read, &c->header);
}

static PyObject *mod_header_read(PyObject *module, PyObject *args) {
    PyObject *file_o;
    unsigned long long offset, length;
    if (!PyArg_ParseTuple(args, "OKK:dcp_header_read", &file_o, &offset, &length)) return NULL;
    if (!ckpy_file_handle(file_o)) return NULL;
    header_call c = {.offset = offset, .length = length};
    if (ckpy_handle_run((ckpy_handle *)file_o, do_header_read, &c) < 0) return NULL;
    size_t count = 1;
    ckptio_dcp_header_count(c.header, &count);
    PyObject *capsule = header_capsule(c.header);
    return capsule ? Py_BuildValue("(NKn)", capsule, (unsigned long long)c.bytes_read, (Py_ssize_t)count) : NULL;
}

static PyObject *mod_header_parse(PyObject *module, PyObject *args) {
    unsigned long long addr, len, offset;
    PyObject *origin_o;
    if (!PyArg_ParseTuple(args, "KKOK:dcp_header_parse", &addr, &len, &origin_o, &offset)) return NULL;
    PyObject *origin = ckpy_path_bytes(origin_o);
    if (!origin) return NULL;
    ckptio_dcp_header *h = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_header_parse((const void *)(uintptr_t)addr, (size_t)len, PyBytes_AsString(origin), offset, NULL,
                                 &h);
    Py_END_ALLOW_THREADS
    Py_DECREF(origin);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return header_capsule(h);
}

static PyObject *mod_header_zstd(PyObject *module, PyObject *args) {
    unsigned long long addr, len, limit, offset;
    PyObject *origin_o;
    const char *subject = NULL;
    if (!PyArg_ParseTuple(args, "KKKOK|z:dcp_header_zstd", &addr, &len, &limit, &origin_o, &offset, &subject))
        return NULL;
    PyObject *origin = ckpy_path_bytes(origin_o);
    if (!origin) return NULL;
    ckptio_dcp_header *h = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_header_zstd((const void *)(uintptr_t)addr, (size_t)len, (uint64_t)limit, PyBytes_AsString(origin),
                                offset, subject, &h);
    Py_END_ALLOW_THREADS
    Py_DECREF(origin);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return header_capsule(h);
}

static PyObject *mod_header_windows(PyObject *module, PyObject *args) {
    unsigned long long size, offset, length, head, head_len, tail, tail_len;
    PyObject *path_o;
    if (!PyArg_ParseTuple(args, "OKKKKKKK:dcp_header_windows", &path_o, &size, &offset, &length, &head, &head_len,
                          &tail, &tail_len))
        return NULL;
    PyObject *path = ckpy_path_bytes(path_o);
    if (!path) return NULL;
    ckptio_dcp_header *h = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_header_windows(PyBytes_AsString(path), size, offset, length, (const void *)(uintptr_t)head,
                                   (size_t)head_len, (const void *)(uintptr_t)tail, (size_t)tail_len, NULL, &h);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (st == CKPTIO_E_UNSUPPORTED) Py_RETURN_NONE;
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return header_capsule(h);
}

static PyObject *mod_header_read_box(PyObject *module, PyObject *args) {
    PyObject *capsule, *offsets_o, *sizes_o, *strides_o;
    const char *fqn;
    unsigned long long addr, capacity;
    if (!PyArg_ParseTuple(args, "OsOOKOK:dcp_header_read_box", &capsule, &fqn, &offsets_o, &sizes_o, &addr,
                          &strides_o, &capacity))
        return NULL;
    const ckptio_dcp_header *h = PyCapsule_GetPointer(capsule, HEADER_CAPSULE);
    if (!h) return NULL;
    ckptio_dcp_layout lay;
    ckptio_status st = ckptio_dcp_header_layout(h, fqn, &lay);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    int64_t *offsets = NULL, *sizes = NULL, *strides = NULL;
    uint32_t n0 = 0, n1 = 0, n2 = 0;
    PyObject *result = NULL;
    if (int64_array(offsets_o, &offsets, &n0) < 0 || int64_array(sizes_o, &sizes, &n1) < 0 ||
        int64_array(strides_o, &strides, &n2) < 0)
        goto out;
    if (n0 != lay.ndim || n1 != lay.ndim || n2 != lay.ndim) {
        PyErr_Format(PyExc_ValueError, "dcp_header_read_box: a box of %u/%u/%u values for a tensor of %u dimensions",
                     n0, n1, n2, lay.ndim);
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_header_read_box(h, fqn, offsets, sizes, (void *)(uintptr_t)addr, strides, (uint64_t)capacity);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        goto out;
    }
    result = Py_None;
    Py_INCREF(result);
out:
    PyMem_Free(offsets);
    PyMem_Free(sizes);
    PyMem_Free(strides);
    return result;
}

static PyObject *mod_header_layout(PyObject *module, PyObject *args) {
    PyObject *capsule;
    const char *fqn;
    if (!PyArg_ParseTuple(args, "Os:dcp_header_layout", &capsule, &fqn)) return NULL;
    const ckptio_dcp_header *h = PyCapsule_GetPointer(capsule, HEADER_CAPSULE);
    if (!h) return NULL;
    ckptio_dcp_layout lay;
    const ckptio_status st = ckptio_dcp_header_layout(h, fqn, &lay);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    PyObject *shape = ckpy_int64_tuple(lay.shape, lay.ndim);
    PyObject *stride = shape ? ckpy_int64_tuple(lay.stride, lay.ndim) : NULL;
    if (!stride) {
        Py_XDECREF(shape);
        return NULL;
    }
    return Py_BuildValue("(iNNKKK)", (int)lay.dtype, shape, stride, (unsigned long long)lay.storage_offset,
                         (unsigned long long)lay.storage_start, (unsigned long long)lay.storage_nbytes);
}

/* ---- hashes and zstd ----------------------------------------------------------------- */

static PyObject *mod_hash_xxh3(PyObject *module, PyObject *args) {
    unsigned long long addr, len;
    if (!PyArg_ParseTuple(args, "KK:hash_xxh3", &addr, &len)) return NULL;
    uint64_t h = 0;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_hash_xxh3((const void *)(uintptr_t)addr, (size_t)len, &h);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *mod_zstd_decompress(PyObject *module, PyObject *args) {
    unsigned long long addr, len, limit;
    if (!PyArg_ParseTuple(args, "KKK:zstd_decompress", &addr, &len, &limit)) return NULL;
    const void *src = (const void *)(uintptr_t)addr;
    uint64_t size = 0;
    ckptio_status st;
    /* Counted by decompressing through a fixed buffer (stopping past the
     * limit; a frame declaring more is refused from its header) before the
     * output exists: it is sized by the bytes the frames really make. */
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_zstd_stream(src, (size_t)len, (uint64_t)limit, NULL, NULL, &size);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    if (size > (uint64_t)PY_SSIZE_T_MAX) return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!out) return NULL;
    char *dst = PyBytes_AsString(out);
    size_t got = 0;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_zstd_decompress(src, (size_t)len, dst, (size_t)size, &got);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK || got != size) {
        Py_DECREF(out);
        if (st != CKPTIO_OK) return ckpy_raise(st);
        return ckpy_raise_custom(CKPTIO_E_FORMAT, 0, "zstd decompress", NULL, -1,
                                 "zstd data produced %zu bytes where %llu were announced", got,
                                 (unsigned long long)size);
    }
    return out;
}

/* ---- verifying a directory: its manifest, or its structure ---------------------- */

typedef struct verify_call {
    const char *dir;
    ckptio_dcp_verify_report report;
    char manifest[256]; /* "" when there was none: the structure was checked */
} verify_call;

static ckptio_status do_verify(ckptio_engine *engine, void *arg) {
    verify_call *c = arg;
    ckptio_dcp *h = NULL;
    const char *manifest = NULL;
    ckptio_status st = ckptio_dcp_open(engine, c->dir, &h);
    if (st == CKPTIO_OK) st = ckptio_dcp_validate(h, &c->report, &manifest);
    if (st == CKPTIO_OK && manifest) snprintf(c->manifest, sizeof c->manifest, "%s", manifest);
    ckptio_dcp_close(h); /* keeps the error of a failed verify */
    return st;
}

static PyObject *mod_dcp_verify(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dir", "engine", NULL};
    PyObject *dir_arg, *engine_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:dcp_verify", kwlist, &dir_arg, &engine_arg)) return NULL;
    PyObject *dir = ckpy_path_bytes(dir_arg);
    if (!dir) return NULL;
    PyObject *result = NULL;
    ckpy_engine *engine = ckpy_engine_resolve(engine_arg);
    verify_call c = {.dir = PyBytes_AsString(dir)};
    if (engine && ckpy_engine_run(engine, do_verify, &c) == 0) {
        PyObject *manifest = Py_None;
        if (c.manifest[0]) manifest = PyUnicode_DecodeFSDefault(c.manifest);
        else Py_INCREF(manifest);
        if (manifest)
            result = Py_BuildValue("{s:n,s:n,s:n,s:K,s:n,s:N,s:O}", "items", (Py_ssize_t)c.report.items, "checked",
                                   (Py_ssize_t)c.report.checked, "unhashed", (Py_ssize_t)c.report.unhashed, "bytes",
                                   (unsigned long long)c.report.bytes, "partial", (Py_ssize_t)c.report.partial,
                                   "manifest", manifest, "checksums", c.manifest[0] ? Py_True : Py_False);
    }
    Py_XDECREF(engine);
    Py_DECREF(dir);
    return result;
}

static PyObject *mod_dcp_file_open(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dir", "relative_path", "engine", "size", "etag", NULL};
    PyObject *dir_arg, *name_arg, *engine_arg = Py_None;
    unsigned long long size = 0;
    const char *etag = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OKz:dcp_file_open", kwlist, &dir_arg, &name_arg, &engine_arg,
                                     &size, &etag))
        return NULL;
    return ckpy_file_open_dcp(dir_arg, name_arg, engine_arg, size, etag);
}

static PyMethodDef dcp_methods[] = {
    {"dcp_file_open", (PyCFunction)(void (*)(void))mod_dcp_file_open, METH_VARARGS | METH_KEYWORDS,
     "dcp_file_open(dir, relative_path, engine=None, size=0, etag=None) -> File: a data file of a DCP directory,\n"
     "read-only (ckptio_dcp_file_open: a relative_path that leaves the directory is refused, E_FORMAT); an etag:\n"
     "the object of that size and ETag a listing gave, opened with no request (ckptio_dcp_file_open_listed)."},
    {"dcp_verify", (PyCFunction)(void (*)(void))mod_dcp_verify, METH_VARARGS | METH_KEYWORDS,
     "dcp_verify(dir, engine=None) -> {items, checked, unhashed, bytes, partial, manifest, checksums}:\n"
     "ckptio_dcp_open + ckptio_dcp_validate (against the ckptio manifest, or without one the structure;\n"
     "bounded memory). GIL released."},
    {"dcp_write", (PyCFunction)(void (*)(void))mod_dcp_write, METH_VARARGS | METH_KEYWORDS,
     "dcp_write(items, alignment=0, engine=None) -> [(offset, length, xxh3 or None, parts or None)]\n\n"
     "Writes .distcp items (ckptio_dcp_write): each (File, flags, payload) where payload is bytes\n"
     "(a byte item) or (dtype, shape, address, nbytes, mem_kind) (a torch.save archive of one\n"
     "C-contiguous tensor). Items of one file are placed in order from offset 0. parts: [(offset in the\n"
     "item, length, xxh3)] for archives hashed from GPU memory (ckptio_dcp_part). GIL released."},
    {"commit_unreferenced", (PyCFunction)(void (*)(void))mod_commit_unreferenced, METH_VARARGS | METH_KEYWORDS,
     "commit_unreferenced(files, engine=None, sync_later=False): commits atomic write Files whose names\n"
     "nothing references yet (a DCP save's data files): each renamed, then all fsynced with their directory\n"
     "at once (ckptio_file_commit_unreferenced); sync_later: renamed only, for dcp_commit's data_files.\n"
     "GIL released."},
    {"dcp_read", (PyCFunction)(void (*)(void))mod_dcp_read, METH_VARARGS | METH_KEYWORDS,
     "dcp_read(extents, engine=None): file -> memory for (File, address, nbytes, file_offset, mem_kind)\n"
     "extents of any number of files, in one engine plan. GIL released."},
    {"dcp_header_windows", mod_header_windows, METH_VARARGS,
     "dcp_header_windows(path, file_size, offset, length, head_addr, head_len, tail_addr, tail_len) -> header\n"
     "or None: dcp_header_read's header of a torch.save item from its first and last bytes, already read\n"
     "(ckptio_dcp_header_windows); None when the item needs dcp_header_read (a SAFETENSORS blob, or a\n"
     "record between the windows)."},
    {"dcp_header_read", mod_header_read, METH_VARARGS,
     "dcp_header_read(file, offset, length) -> (header, bytes_read, tensors): the parsed header of the\n"
     "untransformed DCP item at [offset, +length) of an open File: a torch.save archive of one tensor or\n"
     "a SAFETENSORS blob describing `tensors` tensors (ckptio_dcp_header_read; only headers are read,\n"
     "through the File's engine)."},
    {"dcp_header_parse", mod_header_parse, METH_VARARGS,
     "dcp_header_parse(address, length, origin, offset) -> header: the same for a decoded item in memory\n"
     "(a torch.save archive; the memory must outlive the header)."},
    {"dcp_header_zstd", mod_header_zstd, METH_VARARGS,
     "dcp_header_zstd(address, length, limit, origin, offset, subject=None) -> header: the same for a zstd\n"
     "item's stored frames in memory (ckptio_dcp_header_zstd: decompressed through a fixed buffer, at most\n"
     "`limit` bytes, held only when small; the frames' memory must outlive the header)."},
    {"dcp_header_read_box", mod_header_read_box, METH_VARARGS,
     "dcp_header_read_box(header, fqn, offsets, sizes, address, strides, capacity): copies the box of the stored\n"
     "tensor into host memory at `address` with element `strides` (ckptio_dcp_header_read_box; a large zstd item\n"
     "is decompressed again through a fixed buffer). Releases the GIL."},
    {"dcp_header_layout", mod_header_layout, METH_VARARGS,
     "dcp_header_layout(header, fqn) -> (dtype, shape, stride, storage_offset, storage_start,\n"
     "storage_nbytes): where the tensor's storage is (ckptio_dcp_header_layout)."},
    {"hash_xxh3", mod_hash_xxh3, METH_VARARGS, "hash_xxh3(address, nbytes) -> int: XXH3-64 of host memory."},
    {"zstd_decompress", mod_zstd_decompress, METH_VARARGS,
     "zstd_decompress(address, nbytes, limit) -> bytes: all zstd frames of the buffer, decompressed;\n"
     "E_FORMAT before anything is decompressed when they declare (or produce) more than limit bytes."},
    {NULL, NULL, 0, NULL},
};

int ckpy_dcp_add_to_module(PyObject *module) {
    if (PyModule_AddFunctions(module, dcp_methods) < 0) return -1;
    if (PyModule_AddIntConstant(module, "DCP_ITEM_ZSTD", CKPTIO_DCP_ITEM_ZSTD) < 0 ||
        PyModule_AddIntConstant(module, "DCP_ITEM_CRC32", CKPTIO_DCP_ITEM_CRC32) < 0 ||
        PyModule_AddIntConstant(module, "DCP_ITEM_HASH", CKPTIO_DCP_ITEM_HASH) < 0 ||
        PyModule_AddIntConstant(module, "DCP_ARCHIVE_OVERHEAD_MAX", (long)CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX) < 0 ||
        PyModule_AddIntConstant(module, "DCP_BYTE_ITEM_MAX", (long)CKPTIO_DCP_BYTE_ITEM_MAX) < 0)
        return -1;
    return 0;
}
