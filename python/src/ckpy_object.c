/*
 * ckpy_object.c - objects in S3-compatible storage beyond files
 * (include/ckptio/object.h): what an s3:// path is, small objects read and
 * written whole, deletes, listings and the cleanup of unfinished uploads,
 * for ckptio.dcp's writer and reader on object storage. Every call runs on
 * an engine (its CKPTIO_S3_* settings) with the GIL released.
 */
#include "ckpy_engine.h"
#include "ckpy_file.h"
#include "ckpy_parts.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct object_call {
    const char *url;
    const void *data;
    size_t len;
    int if_absent;
    const char *delimiter;
    double older_than;
    uint64_t max, size, aborted;
    int kind;        /* 0 missing, 1 file, 2 directory */
    char *buf;       /* object_read: ckptio_file_read_all's bytes */
    char **keys;     /* object_list */
    uint64_t *sizes;
    double *times;
    unsigned char *prefixes;
    char **etags;     /* object_list(etags=True): each entry's ETag */
    size_t n, cap, limit;
    int want_etags;
    int nomem;
} object_call;

/* Runs fn on `url` (path-like) with the engine argument resolved. */
static int run(PyObject *url_o, PyObject *engine_o, ckpy_engine_op fn, object_call *c) {
    PyObject *url = ckpy_path_bytes(url_o);
    if (!url) return -1;
    ckpy_engine *engine = ckpy_engine_resolve(engine_o);
    c->url = PyBytes_AsString(url);
    const int rc = engine ? ckpy_engine_run(engine, fn, c) : -1;
    Py_XDECREF(engine);
    Py_DECREF(url);
    return rc;
}

static int first_entry(void *user, const ckptio_object_info *info) {
    (void)info;
    *(int *)user = 1;
    return 1;
}

/* An object of that key (a file), else anything under KEY/ (a directory). */
static ckptio_status do_stat(ckptio_engine *e, void *arg) {
    object_call *c = arg;
    size_t n = strlen(c->url);
    c->kind = 0;
    if (n && c->url[n - 1] != '/') {
        ckptio_file *f = NULL;
        ckptio_status st = ckptio_file_open(e, c->url, CKPTIO_OPEN_READ, &f);
        if (st == CKPTIO_OK) {
            st = ckptio_file_size(f, &c->size);
            ckptio_file_close(f);
            c->kind = 1;
            return st;
        }
        if (st != CKPTIO_E_NOT_FOUND) return st;
    }
    char *dir = malloc(n + 2);
    if (!dir) return CKPTIO_E_NOMEM;
    memcpy(dir, c->url, n);
    if (!n || c->url[n - 1] != '/') dir[n++] = '/';
    dir[n] = '\0';
    int any = 0;
    const ckptio_status st = ckptio_object_list(e, dir, "/", first_entry, &any);
    free(dir);
    if (st == CKPTIO_OK && any) c->kind = 2;
    return st;
}

static PyObject *mod_object_stat(PyObject *m, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"url", "engine", NULL};
    PyObject *url_o, *engine_o = Py_None;
    object_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:object_stat", kwlist, &url_o, &engine_o) ||
        run(url_o, engine_o, do_stat, &c) < 0)
        return NULL;
    static const char *const kinds[] = {"missing", "file", "directory"};
    return Py_BuildValue("(sK)", kinds[c.kind], (unsigned long long)c.size);
}

/* The whole object (ckptio_file_read_all: its open is the GET of its first
 * MiB, no HEAD, which is all of most objects read this way; a larger one's
 * rest is one more read once its size was checked against max). */
static ckptio_status do_read(ckptio_engine *e, void *arg) {
    object_call *c = arg;
    void *data = NULL;
    size_t len = 0;
    const ckptio_status st = ckptio_file_read_all(e, c->url, c->max, &data, &len);
    if (st == CKPTIO_E_FORMAT && len > c->max) {
        c->nomem = 2; /* too large: said by the caller */
        return CKPTIO_OK;
    }
    c->buf = data;
    c->size = len;
    return st;
}

static PyObject *mod_object_read(PyObject *m, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"url", "max_bytes", "engine", NULL};
    PyObject *url_o, *engine_o = Py_None;
    unsigned long long max = 1ull << 30;
    object_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|KO:object_read", kwlist, &url_o, &max, &engine_o)) return NULL;
    c.max = max;
    const int rc = run(url_o, engine_o, do_read, &c);
    PyObject *out = NULL;
    if (rc == 0 && c.nomem == 2)
        PyErr_Format(PyExc_ValueError, "%S: larger than the %llu bytes expected of it", url_o, max);
    else if (rc == 0 && c.nomem)
        PyErr_NoMemory();
    else if (rc == 0)
        out = PyBytes_FromStringAndSize(c.buf, (Py_ssize_t)c.size);
    ckptio_file_data_free(c.buf);
    return out;
}

static ckptio_status do_put(ckptio_engine *e, void *arg) {
    object_call *c = arg;
    return ckptio_object_put(e, c->url, c->data, c->len, c->if_absent);
}

static PyObject *mod_object_put(PyObject *m, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"url", "data", "if_absent", "engine", NULL};
    PyObject *url_o, *data_o, *engine_o = Py_None;
    object_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!|pO:object_put", kwlist, &url_o, &PyBytes_Type, &data_o,
                                     &c.if_absent, &engine_o))
        return NULL;
    char *bytes = NULL;
    Py_ssize_t len = 0;
    if (PyBytes_AsStringAndSize(data_o, &bytes, &len) < 0) return NULL;
    c.data = bytes;
    c.len = (size_t)len;
    if (run(url_o, engine_o, do_put, &c) < 0) return NULL;
    Py_RETURN_NONE;
}

static ckptio_status do_delete(ckptio_engine *e, void *arg) {
    return ckptio_object_delete(e, ((object_call *)arg)->url);
}

static PyObject *mod_object_delete(PyObject *m, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"url", "engine", NULL};
    PyObject *url_o, *engine_o = Py_None;
    object_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:object_delete", kwlist, &url_o, &engine_o) ||
        run(url_o, engine_o, do_delete, &c) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* "2026-11-29T02:27:53.000Z" -> seconds since the epoch (0 when not that). */
static double iso_seconds(const char *t) {
    struct tm tm = {0};
    const char *end = t ? strptime(t, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    return end ? (double)timegm(&tm) : 0;
}

static int gather(void *user, const ckptio_object_info *info) {
    object_call *c = user;
    if (c->n == c->cap) {
        const size_t cap = c->cap ? 2 * c->cap : 64;
        char **k = realloc(c->keys, cap * sizeof *k);
        if (k) c->keys = k;
        uint64_t *s = k ? realloc(c->sizes, cap * sizeof *s) : NULL;
        if (s) c->sizes = s;
        double *t = s ? realloc(c->times, cap * sizeof *t) : NULL;
        if (t) c->times = t;
        unsigned char *p = t ? realloc(c->prefixes, cap) : NULL;
        if (p) c->prefixes = p;
        char **g = p ? realloc(c->etags, cap * sizeof *g) : NULL;
        if (g) c->etags = g;
        if (!g) return c->nomem = 1;
        c->cap = cap;
    }
    const size_t len = strlen(info->key);
    char *key = malloc(len + 1);
    if (!key) return c->nomem = 1;
    memcpy(key, info->key, len + 1);
    c->keys[c->n] = key;
    c->sizes[c->n] = info->size;
    c->times[c->n] = iso_seconds(info->time);
    c->prefixes[c->n] = (unsigned char)info->is_prefix;
    c->etags[c->n] = NULL;
    if (c->want_etags) {
        const size_t elen = strlen(info->etag);
        if (!(c->etags[c->n] = malloc(elen + 1))) {
            free(key);
            return c->nomem = 1;
        }
        memcpy(c->etags[c->n], info->etag, elen + 1);
    }
    c->n++;
    return c->limit && c->n >= c->limit; /* enough: the listing stops there */
}

static ckptio_status do_list(ckptio_engine *e, void *arg) {
    object_call *c = arg;
    return ckptio_object_list(e, c->url, c->delimiter, gather, c);
}

static PyObject *mod_object_list(PyObject *m, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"url", "delimiter", "engine", "etags", "limit", NULL};
    PyObject *url_o, *engine_o = Py_None;
    object_call c = {0};
    Py_ssize_t limit = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|zOpn:object_list", kwlist, &url_o, &c.delimiter, &engine_o,
                                     &c.want_etags, &limit))
        return NULL;
    c.limit = limit > 0 ? (size_t)limit : 0;
    const int rc = run(url_o, engine_o, do_list, &c);
    if (rc == 0 && c.nomem) PyErr_NoMemory();
    PyObject *out = rc == 0 && !c.nomem ? PyList_New((Py_ssize_t)c.n) : NULL;
    for (size_t i = 0; out && i < c.n; i++) {
        PyObject *row = c.want_etags ? Py_BuildValue("(NKdOs)", PyUnicode_DecodeFSDefault(c.keys[i]),
                                                     (unsigned long long)c.sizes[i], c.times[i],
                                                     c.prefixes[i] ? Py_True : Py_False, c.etags[i])
                                     : Py_BuildValue("(NKdO)", PyUnicode_DecodeFSDefault(c.keys[i]),
                                                     (unsigned long long)c.sizes[i], c.times[i],
                                                     c.prefixes[i] ? Py_True : Py_False);
        if (!row || PyList_SetItem(out, (Py_ssize_t)i, row) < 0) Py_CLEAR(out);
    }
    for (size_t i = 0; i < c.n; i++) {
        free(c.keys[i]);
        free(c.etags[i]);
    }
    free(c.keys);
    free(c.etags);
    free(c.sizes);
    free(c.times);
    free(c.prefixes);
    return out;
}

static ckptio_status do_abort(ckptio_engine *e, void *arg) {
    object_call *c = arg;
    return ckptio_object_abort_uploads(e, c->url, c->older_than, &c->aborted);
}

static PyObject *mod_object_abort_uploads(PyObject *m, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"url", "older_than", "engine", NULL};
    PyObject *url_o, *engine_o = Py_None;
    object_call c = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|dO:object_abort_uploads", kwlist, &url_o, &c.older_than,
                                     &engine_o) ||
        run(url_o, engine_o, do_abort, &c) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(c.aborted);
}

static PyObject *mod_path_is_object(PyObject *m, PyObject *arg) {
    PyObject *path = ckpy_path_bytes(arg);
    if (!path) return NULL;
    const int yes = ckptio_path_is_object(PyBytes_AsString(path));
    Py_DECREF(path);
    return PyBool_FromLong(yes);
}

static PyObject *mod_file_open_window(PyObject *m, PyObject *args, PyObject *kwargs) {
    (void)m;
    static char *kwlist[] = {"path", "address", "length", "engine", NULL};
    PyObject *path_o, *addr_o, *len_o, *engine_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|O:file_open_window", kwlist, &path_o, &addr_o, &len_o,
                                     &engine_o))
        return NULL;
    return ckpy_file_open_window(path_o, addr_o, len_o, engine_o);
}

static PyMethodDef object_methods[] = {
    {"file_open_window", (PyCFunction)(void (*)(void))mod_file_open_window, METH_VARARGS | METH_KEYWORDS,
     "file_open_window(path, address, length, engine=None) -> (File, got): opened for reading with its first\n"
     "min(length, size) bytes read to address (ckptio_file_open_window: an object's open is that one GET)."},
    {"path_is_object", mod_path_is_object, METH_O, "path_is_object(path) -> True for an s3:// URL."},
    {"object_stat", (PyCFunction)(void (*)(void))mod_object_stat, METH_VARARGS | METH_KEYWORDS,
     "object_stat(url, engine=None) -> ('file', size) | ('directory', 0) | ('missing', 0): an object of that\n"
     "key, else objects under KEY/."},
    {"object_read", (PyCFunction)(void (*)(void))mod_object_read, METH_VARARGS | METH_KEYWORDS,
     "object_read(url, max_bytes=1 GiB, engine=None) -> bytes of the whole object (E_RANGE when larger)."},
    {"object_put", (PyCFunction)(void (*)(void))mod_object_put, METH_VARARGS | METH_KEYWORDS,
     "object_put(url, data, if_absent=False, engine=None): one PUT (ckptio_object_put)."},
    {"object_delete", (PyCFunction)(void (*)(void))mod_object_delete, METH_VARARGS | METH_KEYWORDS,
     "object_delete(url, engine=None) (ckptio_object_delete; a missing object is no error)."},
    {"object_list", (PyCFunction)(void (*)(void))mod_object_list, METH_VARARGS | METH_KEYWORDS,
     "object_list(url, delimiter=None, engine=None, etags=False, limit=0) -> [(key, size, last_modified, is_prefix)]\n"
     "(ckptio_object_list; last_modified in seconds since the epoch, the server's clock); etags=True adds each\n"
     "entry's ETag as a fifth field; limit > 0 stops the listing after that many entries."},
    {"object_abort_uploads", (PyCFunction)(void (*)(void))mod_object_abort_uploads, METH_VARARGS | METH_KEYWORDS,
     "object_abort_uploads(url, older_than=0, engine=None) -> how many were aborted\n"
     "(ckptio_object_abort_uploads)."},
    {NULL, NULL, 0, NULL},
};

int ckpy_object_add_to_module(PyObject *module) { return PyModule_AddFunctions(module, object_methods); }
