/*
 * ckpy_engine.c - ckptio._ckptio.Engine: a ckptio_engine (worker threads,
 * staging memory, settings, statistics) plus the lock that keeps it to one
 * thread at a time, and the module's lazily created default engine.
 */
#include "ckpy_engine.h"

#include <string.h>

PyTypeObject *ckpy_engine_type = NULL;
static ckpy_engine *default_engine = NULL;

/* Whether a setting takes names (the library's table says: its lowest value has one). */
static int takes_names(ckptio_option option) {
    int64_t lo = 0;
    return ckptio_option_bounds(option, &lo, NULL) == CKPTIO_OK && ckptio_option_value_name(option, lo) != NULL;
}

static int option_from_name(PyObject *name, ckptio_option *out) {
    PyObject *b = PyUnicode_AsUTF8String(name);
    if (!b) return -1;
    const char *s = PyBytes_AsString(b);
    for (int i = 0; i < CKPTIO_OPT_COUNT_; i++) {
        const char *n = ckptio_option_name((ckptio_option)i);
        if (n && strcmp(n, s) == 0) {
            Py_DECREF(b);
            *out = (ckptio_option)i;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "unknown engine option '%s' (see ckptio.option_names())", s);
    Py_DECREF(b);
    return -1;
}

/* An option value: an int, a bool, or for enum settings one of their names. */
static int option_value(ckptio_option option, PyObject *value, int64_t *out) {
    if (PyUnicode_Check(value)) {
        if (!takes_names(option)) {
            PyErr_Format(PyExc_TypeError, "engine option '%s' takes an int", ckptio_option_name(option));
            return -1;
        }
        PyObject *b = PyUnicode_AsUTF8String(value);
        if (!b) return -1;
        const char *s = PyBytes_AsString(b);
        const char *name;
        for (int64_t i = 0; (name = ckptio_option_value_name(option, i)) != NULL; i++) {
            if (strcmp(name, s) == 0) {
                Py_DECREF(b);
                *out = i;
                return 0;
            }
        }
        PyErr_Format(PyExc_ValueError, "engine option '%s' does not take '%s'", ckptio_option_name(option), s);
        Py_DECREF(b);
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

typedef struct option_call {
    ckptio_option option;
    int64_t value;
} option_call;

static ckptio_status do_set(ckptio_engine *engine, void *arg) {
    const option_call *c = arg;
    return ckptio_engine_set(engine, c->option, c->value);
}

static ckptio_status do_get(ckptio_engine *engine, void *arg) {
    option_call *c = arg;
    return ckptio_engine_get(engine, c->option, &c->value);
}

/* Sets an option under the engine's lock; -1 with an error. */
static int engine_set_locked(ckpy_engine *self, ckptio_option option, int64_t value) {
    option_call c = {option, value};
    return ckpy_engine_run(self, do_set, &c);
}

static int apply_options(ckpy_engine *self, PyObject *kwargs) {
    if (!kwargs) return 0;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
        ckptio_option option;
        int64_t v;
        if (option_from_name(key, &option) < 0 || option_value(option, value, &v) < 0) return -1;
        if (engine_set_locked(self, option, v) < 0) return -1;
    }
    return 0;
}

/* One RuntimeWarning per CKPTIO_* variable ckptio does not read (a typo
 * such as CKPTIO_THREDS would otherwise be ignored without a word), when the
 * process creates its first engine: where the settings are read. Not at
 * import, so that the `ckptio` command's Python launcher stays quiet (the C
 * tool prints the same lines itself). -1 when a warning filter raised. */
static int warn_unknown_env_once(void) {
    static int done;
    if (done) return 0;
    done = 1;
    char text[2048];
    size_t unknown = 0;
    if (ckptio_env_check(text, sizeof text, &unknown) != CKPTIO_OK || unknown == 0) return 0;
    /* ckptio._warn.warn attributes each to the user's line, not to the
     * package's own code that happened to make the first engine. */
    PyObject *mod = PyImport_ImportModule("ckptio._warn");
    PyObject *warn = mod ? PyObject_GetAttrString(mod, "warn") : NULL;
    Py_XDECREF(mod);
    if (!warn) return -1;
    int rc = 0;
    for (char *line = text, *nl; rc == 0 && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) break; /* cut short: the rest did not fit */
        *nl = '\0';
        PyObject *r = PyObject_CallFunction(warn, "sO", line, PyExc_RuntimeWarning);
        if (!r) rc = -1;
        Py_XDECREF(r);
    }
    Py_DECREF(warn);
    return rc;
}

static ckpy_engine *engine_alloc(PyTypeObject *type) {
    if (warn_unknown_env_once() < 0) return NULL;
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    ckpy_engine *self = (ckpy_engine *)alloc(type, 0);
    if (!self) return NULL;
    self->engine = NULL;
    self->generation = ckpy_fork_generation();
    atomic_init(&self->call, NULL);
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        PyErr_NoMemory();
        return NULL;
    }
    ckptio_status st = ckptio_engine_create(&self->engine);
    if (st == CKPTIO_OK) st = ckptio_engine_set_progress(self->engine, ckpy_progress, self);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        Py_DECREF(self);
        return NULL;
    }
    return self;
}

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (args && PyTuple_Size(args) != 0) {
        PyErr_SetString(PyExc_TypeError, "Engine() takes settings as keyword arguments only");
        return NULL;
    }
    ckpy_engine *self = engine_alloc(type);
    if (!self) return NULL;
    if (apply_options(self, kwargs) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void engine_dealloc(PyObject *obj) {
    ckpy_engine *self = (ckpy_engine *)obj;
    /* Every user of the engine holds a reference, so nothing is in flight. */
    if (self->engine) ckptio_engine_destroy(self->engine);
    /* A lock inherited through fork() may be held by a vanished thread. */
    if (self->lock && self->generation == ckpy_fork_generation()) PyThread_free_lock(self->lock);
    ckpy_free_object(obj);
}

static PyObject *engine_set(PyObject *obj, PyObject *args) {
    ckpy_engine *self = (ckpy_engine *)obj;
    PyObject *name, *value;
    if (!PyArg_ParseTuple(args, "UO:set", &name, &value)) return NULL;
    ckptio_option option;
    int64_t v;
    if (option_from_name(name, &option) < 0 || option_value(option, value, &v) < 0) return NULL;
    if (engine_set_locked(self, option, v) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *engine_get(PyObject *obj, PyObject *name) {
    ckpy_engine *self = (ckpy_engine *)obj;
    ckptio_option option;
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "option name must be a str");
        return NULL;
    }
    if (option_from_name(name, &option) < 0) return NULL;
    option_call c = {option, 0};
    if (ckpy_engine_run(self, do_get, &c) < 0) return NULL;
    const char *value_name = ckptio_option_value_name(option, c.value);
    if (value_name) return PyUnicode_FromString(value_name);
    return PyLong_FromLongLong((long long)c.value);
}

static PyObject *engine_options(PyObject *obj, PyObject *unused) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int i = 0; i < CKPTIO_OPT_COUNT_; i++) {
        PyObject *name = PyUnicode_FromString(ckptio_option_name((ckptio_option)i));
        PyObject *v = name ? engine_get(obj, name) : NULL;
        int rc = v ? PyDict_SetItem(d, name, v) : -1;
        Py_XDECREF(name);
        Py_XDECREF(v);
        if (rc < 0) {
            Py_DECREF(d);
            return NULL;
        }
    }
    return d;
}

static int dict_put(PyObject *d, const char *key, PyObject *v) {
    if (!v) return -1;
    int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

static PyObject *engine_stats(PyObject *obj, PyObject *unused) {
    ckpy_engine *self = (ckpy_engine *)obj;
    ckptio_stats s;
    memset(&s, 0, sizeof s);
    ckptio_status st = ckptio_engine_stats(self->engine, &s); /* thread-safe: no lock */
    if (st != CKPTIO_OK) return ckpy_raise(st);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
#define U64_(field) \
    if (dict_put(d, #field, PyLong_FromUnsignedLongLong(s.field)) < 0) goto fail;
#define DBL_(field) \
    if (dict_put(d, #field, PyFloat_FromDouble(s.field)) < 0) goto fail;
    U64_(bytes_read)
    U64_(bytes_written)
    U64_(bytes_direct)
    U64_(bytes_buffered)
    U64_(bytes_bounced)
    U64_(bytes_h2d)
    U64_(bytes_d2h)
    U64_(bytes_cufile)
    U64_(staging_reserved)
    U64_(staging_in_use)
    U64_(staging_peak)
    U64_(io_requests)
    U64_(retries)
    DBL_(seconds_io)
    DBL_(seconds_fsync)
    DBL_(seconds_copy)
#undef U64_
#undef DBL_
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static ckptio_status do_backend(ckptio_engine *engine, void *arg) {
    return ckptio_engine_backend(engine, arg);
}

static PyObject *engine_backend(PyObject *obj, PyObject *unused) {
    ckpy_engine *self = (ckpy_engine *)obj;
    ckptio_backend b = CKPTIO_BACKEND_AUTO;
    if (ckpy_engine_run(self, do_backend, &b) < 0) return NULL;
    return PyUnicode_FromString(ckptio_backend_name(b));
}

static ckptio_status do_prepare_gpu(ckptio_engine *engine, void *arg) {
    return ckptio_engine_gpu_prepare(engine, *(int *)arg);
}

static PyObject *engine_prepare_gpu(PyObject *obj, PyObject *arg) {
    ckpy_engine *self = (ckpy_engine *)obj;
    const long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred()) return NULL;
    if (device < 0 || device > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "prepare_gpu: device index must be >= 0, not %ld", device);
        return NULL;
    }
    int d = (int)device;
    if (ckpy_engine_run(self, do_prepare_gpu, &d) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *engine_bounds(PyObject *cls, PyObject *name) {
    ckptio_option option;
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "option name must be a str");
        return NULL;
    }
    if (option_from_name(name, &option) < 0) return NULL;
    int64_t lo = 0, hi = 0;
    ckptio_status st = ckptio_option_bounds(option, &lo, &hi);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return Py_BuildValue("(LL)", (long long)lo, (long long)hi);
}

static PyMethodDef engine_methods[] = {
    {"set", engine_set, METH_VARARGS, "set(name, value): change one setting (int, or a name for enum settings)."},
    {"get", engine_get, METH_O, "get(name) -> int | str: read one setting."},
    {"options", engine_options, METH_NOARGS, "options() -> dict of every setting."},
    {"stats", engine_stats, METH_NOARGS, "stats() -> dict of cumulative counters (bytes, requests, seconds)."},
    {"backend", engine_backend, METH_NOARGS, "backend() -> str: the I/O backend in use ('pread' or 'io_uring')."},
    {"prepare_gpu", engine_prepare_gpu, METH_O,
     "prepare_gpu(device: int): start pinning, in the background, the staging memory loads to CUDA device "
     "`device` will use (ckptio_engine_gpu_prepare)."},
    {"bounds", engine_bounds, METH_O | METH_CLASS, "bounds(name) -> (min, max): inclusive bounds of a setting."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_new, engine_new},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_methods, engine_methods},
    {Py_tp_doc, "Engine(**settings)\n\n"
                "A ckptio engine: I/O worker threads, staging memory, settings and counters.\n"
                "Settings are keyword arguments named as in ckptio.option_names() (threads,\n"
                "chunk_bytes, backend='auto'|'pread'|'io_uring', direct='auto'|'off'|'on', ...);\n"
                "unset ones come from the CKPTIO_* environment variables. Calls on one engine\n"
                "are serialised; use several engines for concurrent transfers."},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    "ckptio._ckptio.Engine",
    sizeof(ckpy_engine),
    0,
    Py_TPFLAGS_DEFAULT,
    engine_slots,
};

ckpy_engine *ckpy_engine_resolve(PyObject *arg) {
    if (arg && arg != Py_None) {
        if (!PyObject_TypeCheck(arg, ckpy_engine_type)) {
            PyErr_SetString(PyExc_TypeError, "engine must be a ckptio.Engine or None");
            return NULL;
        }
        Py_INCREF(arg);
        return (ckpy_engine *)arg;
    }
    if (!default_engine) {
        default_engine = engine_alloc(ckpy_engine_type);
        if (!default_engine) return NULL;
    }
    Py_INCREF(default_engine);
    return default_engine;
}

static PyObject *mod_default_engine(PyObject *self, PyObject *unused) {
    return (PyObject *)ckpy_engine_resolve(NULL);
}

static PyMethodDef default_engine_def = {
    "default_engine", mod_default_engine, METH_NOARGS,
    "default_engine() -> Engine: the engine used when a call gets engine=None (created on first use).",
};

int ckpy_engine_add_to_module(PyObject *module) {
    ckpy_fork_watch();
    ckpy_engine_type = (PyTypeObject *)PyType_FromSpec(&engine_spec);
    if (!ckpy_engine_type) return -1;
    Py_INCREF(ckpy_engine_type);
    if (PyModule_AddObject(module, "Engine", (PyObject *)ckpy_engine_type) < 0) {
        Py_DECREF(ckpy_engine_type);
        return -1;
    }
    PyObject *fn = PyCFunction_NewEx(&default_engine_def, NULL, NULL);
    if (!fn) return -1;
    if (PyModule_AddObject(module, "default_engine", fn) < 0) {
        Py_DECREF(fn);
        return -1;
    }
    return 0;
}

void ckpy_engine_module_free(void) {
    Py_CLEAR(default_engine);
    Py_CLEAR(ckpy_engine_type);
}
