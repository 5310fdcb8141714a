/*
 * ckpy_module.c - the top of the ckptio._ckptio extension: the module
 * (PyInit__ckptio gathers every part's functions and types, ckpy_parts.h),
 * its own small functions (version, statuses, the dtype table, settings'
 * names, the environment check, format detection) and its teardown.
 *
 * Everything here goes through the public C API (ckptio.h) only.
 */
#include "ckpy_values.h"
#include "ckpy_call.h"
#include "ckpy_engine.h"
#include "ckpy_parts.h"

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
        PyObject *a = ckpy_str_or_none(st_name), *b = ckpy_str_or_none(torch_name);
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
typedef struct detect_call {
    const char *path;
    ckptio_format format;
} detect_call;

static ckptio_status do_detect(ckptio_engine *e, void *arg) {
    detect_call *c = arg;
    return ckptio_format_detect_engine(e, c->path, &c->format);
}

static PyObject *mod_format_detect(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"path", "engine", NULL};
    PyObject *path_o, *engine_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:format_detect", kwlist, &path_o, &engine_o)) return NULL;
    PyObject *pb = ckpy_path_bytes(path_o);
    if (!pb) return NULL;
    detect_call c = {PyBytes_AsString(pb), CKPTIO_FORMAT_UNKNOWN};
    /* An s3:// path's requests with that engine's settings (the default one's
     * without), which keeps the probe's GET for the open that follows it. */
    if (engine_o != Py_None || ckptio_path_is_object(c.path)) {
        ckpy_engine *engine = ckpy_engine_resolve(engine_o);
        const int rc = engine ? ckpy_engine_run(engine, do_detect, &c) : -1;
        Py_XDECREF(engine);
        Py_DECREF(pb);
        return rc < 0 ? NULL : PyUnicode_FromString(ckptio_format_name(c.format));
    }
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_format_detect(c.path, &c.format);
    Py_END_ALLOW_THREADS
    Py_DECREF(pb);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return PyUnicode_FromString(ckptio_format_name(c.format));
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
    {"format_detect", (PyCFunction)(void (*)(void))mod_format_detect, METH_VARARGS | METH_KEYWORDS,
     "format_detect(path, engine=None) -> str: 'safetensors', 'torch', 'torch_legacy', 'dcp', 'hf_index',\n"
     "'directory' or 'unknown' (ckptio_format_detect: a file's first bytes, a directory's entries; with an\n"
     "engine, an s3:// path's requests take its settings)."},
    {"safetensors_save", (PyCFunction)(void (*)(void))ckpy_safetensors_save, METH_VARARGS | METH_KEYWORDS,
     "safetensors_save(path, tensors, metadata=None, align=4096, engine=None)\n\n"
     "Writes a safetensors file atomically. `tensors` is a sequence of\n"
     "(name, dtype, shape, address, nbytes, mem_kind); the memory must stay\n"
     "valid for the call. The GIL is released while writing."},
    {"model_save", (PyCFunction)(void (*)(void))ckpy_model_save, METH_VARARGS | METH_KEYWORDS,
     "model_save(dir, tensors, max_shard_size, metadata=None, engine=None, overwrite=False) -> int\n\n"
     "Writes a Hugging Face directory (sharded safetensors and the index, ckptio_model_save) at a local\n"
     "directory or an s3:// prefix, every shard in one engine job; returns the shard count."},
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
    ckpy_errors_free();
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

PyMODINIT_FUNC PyInit__ckptio(void) {
    if (ckpy_errors_init() < 0) return NULL;

    PyObject *m = PyModule_Create(&module_def);
    if (!m) return NULL;
    if (ckpy_engine_add_to_module(m) < 0 || ckpy_safetensors_add_to_module(m) < 0 ||
        ckpy_file_add_to_module(m) < 0 || ckpy_gds_add_to_module(m) < 0 || ckpy_torch_add_to_module(m) < 0 ||
        ckpy_dcp_add_to_module(m) < 0 || ckpy_dcp_commit_add_to_module(m) < 0 || ckpy_pickle_add_to_module(m) < 0 ||
        ckpy_model_add_to_module(m) < 0 || ckpy_steps_add_to_module(m) < 0 || ckpy_convert_add_to_module(m) < 0 ||
        ckpy_snapshot_add_to_module(m) < 0 || ckpy_object_add_to_module(m) < 0 ||
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
