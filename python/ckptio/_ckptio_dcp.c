/*
 * _ckptio_dcp.c - what ckptio.dcp (torch.distributed.checkpoint storage)
 * needs from C: writing the items of .distcp files (ckptio_dcp_write: one
 * engine plan for every item of every file of a rank), reading extents of
 * several files in one plan, describing a torch.save item in place (the
 * file is mapped and only the zip directory, local headers and pickle are
 * touched; the tensor bytes are then read with the engine), safetensors
 * headers inside a data file, XXH3-64 hashes and zstd decompression.
 */
#include "_ckptio_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* ---- reading extents of several files in one plan -------------------------------- */

typedef struct read_call {
    ckptio_extent *extents;
    size_t count;
} read_call;

static ckptio_status do_read(ckptio_engine *engine, void *arg) {
    const read_call *c = arg;
    return ckpy_run_plan(engine, CKPTIO_READ, c->extents, c->count);
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

/* ---- describing items --------------------------------------------------------------- */

/* ([(name, dtype, shape, stride, storage_offset, storage, file_offset, nbytes, contiguous)],
 *  [(nbytes, file_offset)]) of a parsed archive; offsets count from its first byte. */
static PyObject *archive_rows(ckptio_torch *t) {
    size_t count = 0, scount = 0;
    ckptio_status st = ckptio_torch_count(t, &count);
    if (st == CKPTIO_OK) st = ckptio_torch_storage_count(t, &scount);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    PyObject *tensors = PyList_New((Py_ssize_t)count), *storages = PyList_New((Py_ssize_t)scount);
    if (!tensors || !storages) goto fail;
    for (size_t i = 0; i < count; i++) {
        ckptio_torch_tensor_info ti;
        if ((st = ckptio_torch_tensor(t, i, &ti)) != CKPTIO_OK) {
            ckpy_raise(st);
            goto fail;
        }
        PyObject *shape = ckpy_int64_tuple(ti.shape, ti.ndim);
        PyObject *stride = shape ? ckpy_int64_tuple(ti.stride, ti.ndim) : NULL;
        if (!stride) {
            Py_XDECREF(shape);
            goto fail;
        }
        PyObject *row = Py_BuildValue("(siNNKnKKO)", ti.name, (int)ti.dtype, shape, stride,
                                      (unsigned long long)ti.storage_offset, (Py_ssize_t)ti.storage,
                                      (unsigned long long)ti.file_offset, (unsigned long long)ti.nbytes,
                                      ti.is_contiguous ? Py_True : Py_False);
        if (!row) goto fail;
        PyList_SetItem(tensors, (Py_ssize_t)i, row);
    }
    for (size_t i = 0; i < scount; i++) {
        ckptio_torch_storage_info si;
        if ((st = ckptio_torch_storage(t, i, &si)) != CKPTIO_OK) {
            ckpy_raise(st);
            goto fail;
        }
        PyObject *row = Py_BuildValue("(KK)", (unsigned long long)si.nbytes, (unsigned long long)si.file_offset);
        if (!row) goto fail;
        PyList_SetItem(storages, (Py_ssize_t)i, row);
    }
    return Py_BuildValue("(NN)", tensors, storages);
fail:
    Py_XDECREF(tensors);
    Py_XDECREF(storages);
    return NULL;
}

/* Parses an archive held in memory; a failure names `path` and `offset`. */
static PyObject *parse_archive(const void *bytes, size_t len, const char *path, int64_t offset) {
    ckptio_torch *t = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_torch_parse(bytes, len, &t);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK)
        return ckpy_raise_custom(st, 0, "parse DCP item", path, offset, "torch.save item of %zu bytes: %s", len,
                                 ckptio_last_error_message());
    PyObject *rows = archive_rows(t);
    ckptio_torch_close(t);
    return rows;
}

static PyObject *mod_torch_item(PyObject *module, PyObject *args) {
    PyObject *path_arg;
    unsigned long long offset, length;
    if (!PyArg_ParseTuple(args, "OKK:dcp_torch_item", &path_arg, &offset, &length)) return NULL;
    PyObject *pb = ckpy_path_bytes(path_arg);
    if (!pb) return NULL;
    const char *path = PyBytes_AsString(pb);
    PyObject *result = NULL;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int err = errno;
        ckpy_raise_custom(ckpy_status_from_errno(err), err, "open", path, -1, "cannot open the data file");
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < offset || (uint64_t)sb.st_size - offset < length || length == 0) {
        ckpy_raise_custom(CKPTIO_E_TRUNCATED, 0, "parse DCP item", path, (int64_t)offset,
                          "item of %llu bytes does not lie inside the file (%lld bytes)", length,
                          (long long)sb.st_size);
        close(fd);
        goto out;
    }
    /* Map the item; parsing touches only its directory, headers and pickle. */
    const long page = sysconf(_SC_PAGESIZE);
    const uint64_t base = offset / (uint64_t)page * (uint64_t)page;
    const size_t maplen = (size_t)(offset - base + length);
    void *map = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, (off_t)base);
    const int map_err = errno;
    close(fd);
    if (map == MAP_FAILED) {
        ckpy_raise_custom(ckpy_status_from_errno(map_err), map_err, "mmap", path, (int64_t)offset,
                          "cannot map the item");
        goto out;
    }
    result = parse_archive((const uint8_t *)map + (offset - base), (size_t)length, path, (int64_t)offset);
    munmap(map, maplen);
out:
    Py_DECREF(pb);
    return result;
}

static PyObject *mod_torch_item_memory(PyObject *module, PyObject *args) {
    unsigned long long addr, len;
    const char *what;
    if (!PyArg_ParseTuple(args, "KKs:dcp_torch_item_memory", &addr, &len, &what)) return NULL;
    if (!addr || !len) {
        PyErr_SetString(PyExc_ValueError, "an empty buffer is not a torch.save item");
        return NULL;
    }
    return parse_archive((const void *)(uintptr_t)addr, (size_t)len, what, -1);
}

/* (rows [(name, dtype, shape, offset in the blob, nbytes)], data offset, metadata) of a
 * safetensors header held in memory, for a blob of blob_size bytes. */
static PyObject *mod_safetensors_header(PyObject *module, PyObject *args) {
    unsigned long long addr, len, blob_size;
    if (!PyArg_ParseTuple(args, "KKK:dcp_safetensors_header", &addr, &len, &blob_size)) return NULL;
    ckptio_safetensors *st = NULL;
    ckptio_status s = ckptio_safetensors_parse((const void *)(uintptr_t)addr, (size_t)len, blob_size, &st);
    if (s != CKPTIO_OK) return ckpy_raise(s);
    PyObject *rows = NULL, *meta = NULL, *result = NULL;
    size_t count = 0, mcount = 0;
    uint64_t data_offset = 0;
    if ((s = ckptio_safetensors_count(st, &count)) || (s = ckptio_safetensors_metadata_count(st, &mcount)) ||
        (s = ckptio_safetensors_data_offset(st, &data_offset))) {
        ckpy_raise(s);
        goto out;
    }
    if (!(rows = PyList_New((Py_ssize_t)count)) || !(meta = PyDict_New())) goto out;
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info ti;
        if ((s = ckptio_safetensors_tensor(st, i, &ti))) {
            ckpy_raise(s);
            goto out;
        }
        PyObject *shape = ckpy_int64_tuple(ti.shape, ti.ndim);
        PyObject *row = shape ? Py_BuildValue("(siNKK)", ti.name, (int)ti.dtype, shape,
                                              (unsigned long long)ti.file_offset, (unsigned long long)ti.nbytes)
                              : NULL;
        if (!row) goto out;
        PyList_SetItem(rows, (Py_ssize_t)i, row);
    }
    for (size_t i = 0; i < mcount; i++) {
        ckptio_kv kv;
        if ((s = ckptio_safetensors_metadata(st, i, &kv))) {
            ckpy_raise(s);
            goto out;
        }
        PyObject *v = PyUnicode_FromString(kv.value);
        if (!v || PyDict_SetItemString(meta, kv.key, v) < 0) {
            Py_XDECREF(v);
            goto out;
        }
        Py_DECREF(v);
    }
    result = Py_BuildValue("(OKO)", rows, (unsigned long long)data_offset, meta);
out:
    Py_XDECREF(rows);
    Py_XDECREF(meta);
    ckptio_safetensors_close(st);
    return result;
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
    /* Bounded before the output buffer exists: a small frame declaring
     * gigabytes is refused from its header. */
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_zstd_decompressed_size_max(src, (size_t)len, (uint64_t)limit, &size);
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

/* ---- verifying a directory against its manifest ---------------------------------- */

typedef struct verify_call {
    const char *dir;
    ckptio_dcp_verify_report report;
} verify_call;

static ckptio_status do_verify(ckptio_engine *engine, void *arg) {
    verify_call *c = arg;
    ckptio_dcp *h = NULL;
    ckptio_status st = ckptio_dcp_open(engine, c->dir, &h);
    if (st == CKPTIO_OK) st = ckptio_dcp_verify(h, &c->report);
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
    if (engine && ckpy_engine_run(engine, do_verify, &c) == 0)
        result = Py_BuildValue("{s:n,s:n,s:n,s:K}", "items", (Py_ssize_t)c.report.items, "checked",
                               (Py_ssize_t)c.report.checked, "unhashed", (Py_ssize_t)c.report.unhashed, "bytes",
                               (unsigned long long)c.report.bytes);
    Py_XDECREF(engine);
    Py_DECREF(dir);
    return result;
}

static PyObject *mod_dcp_file_open(PyObject *module, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"dir", "relative_path", "engine", NULL};
    PyObject *dir_arg, *name_arg, *engine_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:dcp_file_open", kwlist, &dir_arg, &name_arg, &engine_arg))
        return NULL;
    return ckpy_file_open_dcp(dir_arg, name_arg, engine_arg);
}

static PyMethodDef dcp_methods[] = {
    {"dcp_file_open", (PyCFunction)(void (*)(void))mod_dcp_file_open, METH_VARARGS | METH_KEYWORDS,
     "dcp_file_open(dir, relative_path, engine=None) -> File: a data file of a DCP directory, read-only\n"
     "(ckptio_dcp_file_open: a relative_path that leaves the directory is refused, E_FORMAT)."},
    {"dcp_verify", (PyCFunction)(void (*)(void))mod_dcp_verify, METH_VARARGS | METH_KEYWORDS,
     "dcp_verify(dir, engine=None) -> {items, checked, unhashed, bytes}: ckptio_dcp_open + ckptio_dcp_verify\n"
     "(the checkpoint directory against its ckptio manifest; bounded memory). GIL released."},
    {"dcp_write", (PyCFunction)(void (*)(void))mod_dcp_write, METH_VARARGS | METH_KEYWORDS,
     "dcp_write(items, alignment=0, engine=None) -> [(offset, length, xxh3 or None, parts or None)]\n\n"
     "Writes .distcp items (ckptio_dcp_write): each (File, flags, payload) where payload is bytes\n"
     "(a byte item) or (dtype, shape, address, nbytes, mem_kind) (a torch.save archive of one\n"
     "C-contiguous tensor). Items of one file are placed in order from offset 0. parts: [(offset in the\n"
     "item, length, xxh3)] for archives hashed from GPU memory (ckptio_dcp_part). GIL released."},
    {"dcp_read", (PyCFunction)(void (*)(void))mod_dcp_read, METH_VARARGS | METH_KEYWORDS,
     "dcp_read(extents, engine=None): file -> memory for (File, address, nbytes, file_offset, mem_kind)\n"
     "extents of any number of files, in one engine plan. GIL released."},
    {"dcp_torch_item", mod_torch_item, METH_VARARGS,
     "dcp_torch_item(path, offset, length) -> (tensors, storages) of the torch.save archive stored at\n"
     "[offset, +length) of a file. Tensor rows: (name, dtype, shape, stride, storage_offset, storage,\n"
     "file_offset, nbytes, contiguous); storage rows: (nbytes, file_offset); offsets from the item start."},
    {"dcp_torch_item_memory", mod_torch_item_memory, METH_VARARGS,
     "dcp_torch_item_memory(address, length, what) -> the same for an archive in memory."},
    {"dcp_safetensors_header", mod_safetensors_header, METH_VARARGS,
     "dcp_safetensors_header(address, length, blob_size) -> ([(name, dtype, shape, offset, nbytes)],\n"
     "data_offset, metadata) of a safetensors blob whose first `length` bytes are in memory."},
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
