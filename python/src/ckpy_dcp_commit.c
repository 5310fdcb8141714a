/*
 * ckpy_dcp_commit.c - the DCP directory commit of libckptio (include/
 * ckptio/dcp.h "DCP directory commit") for ckptio.dcp's writer: the directory
 * lock, the data files' placeholders, the commit itself (ckptio_dcp_commit:
 * manifest, .metadata, removal of what older saves left) and a later
 * removal. Thin: arguments in, the C call with the GIL released, results
 * out; failures become exceptions through ckpy_raise (ckptio._errors).
 */
#include "ckpy_values.h"
#include "ckpy_file.h"
#include "ckpy_parts.h"

#include <string.h>

/* ---- arguments --------------------------------------------------------------------- */

/* A list of file names as bytes (filesystem encoding) and the C array over
 * them; free with names_free. */
typedef struct names_arg {
    PyObject *owned; /* list of bytes */
    const char **v;
    size_t n;
} names_arg;

static void names_free(names_arg *a) {
    Py_CLEAR(a->owned);
    PyMem_Free((void *)a->v);
    a->v = NULL;
    a->n = 0;
}

static int names_parse(PyObject *seq, names_arg *out) {
    memset(out, 0, sizeof *out);
    PyObject *fast = PySequence_List(seq);
    if (!fast) return -1;
    const Py_ssize_t n = PyList_Size(fast);
    out->owned = PyList_New(n);
    out->v = PyMem_Calloc(n ? (size_t)n : 1, sizeof *out->v);
    if (!out->owned || !out->v) {
        Py_DECREF(fast);
        names_free(out);
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = ckpy_path_bytes(PyList_GetItem(fast, i));
        if (!b) {
            Py_DECREF(fast);
            names_free(out);
            return -1;
        }
        PyList_SetItem(out->owned, i, b);
        out->v[i] = PyBytes_AsString(b);
    }
    Py_DECREF(fast);
    out->n = (size_t)n;
    return 0;
}

/* None or a path-like as bytes (a new reference, or Py_None borrowed as
 * NULL text). */
static int optional_name(PyObject *obj, PyObject **owned, const char **text) {
    *owned = NULL;
    *text = NULL;
    if (obj == Py_None) return 0;
    if (!(*owned = ckpy_path_bytes(obj))) return -1;
    *text = PyBytes_AsString(*owned);
    return 0;
}

/* What a save committed: None or (metadata_name, metadata bytes, files). */
typedef struct committed_arg {
    PyObject *name, *data;
    names_arg files;
    ckptio_dcp_committed c;
    int present;
} committed_arg;

static void committed_free(committed_arg *a) {
    Py_CLEAR(a->name);
    Py_CLEAR(a->data);
    names_free(&a->files);
}

static int committed_parse(PyObject *obj, committed_arg *out) {
    memset(out, 0, sizeof *out);
    if (obj == Py_None) return 0;
    PyObject *name_o, *data_o, *files_o;
    if (!PyArg_ParseTuple(obj, "OSO:committed", &name_o, &data_o, &files_o)) return -1;
    if (!(out->name = ckpy_path_bytes(name_o))) return -1;
    Py_INCREF(data_o);
    out->data = data_o;
    if (names_parse(files_o, &out->files) < 0) {
        committed_free(out);
        return -1;
    }
    out->c = (ckptio_dcp_committed){PyBytes_AsString(out->name), PyBytes_AsString(out->data),
                                    (size_t)PyBytes_Size(out->data), out->files.v, out->files.n};
    out->present = 1;
    return 0;
}

static PyObject *names_list(char **v, size_t n) {
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *s = PyUnicode_DecodeFSDefault(v[i]);
        if (!s) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, (Py_ssize_t)i, s);
    }
    return list;
}

/* ---- small files -------------------------------------------------------------------- */

/* (dir, name, reference or None): the arguments of a call about one file. */
typedef struct file_args {
    PyObject *dir, *name, *ref;
    const char *d, *n, *reference;
} file_args;

static void file_args_free(file_args *a) {
    Py_CLEAR(a->dir);
    Py_CLEAR(a->name);
    Py_CLEAR(a->ref);
}

static int file_args_parse(PyObject *dir_o, PyObject *name_o, PyObject *ref_o, file_args *a) {
    memset(a, 0, sizeof *a);
    if ((a->dir = ckpy_path_bytes(dir_o)) && (a->name = ckpy_path_bytes(name_o)) &&
        optional_name(ref_o, &a->ref, &a->reference) == 0) {
        a->d = PyBytes_AsString(a->dir);
        a->n = PyBytes_AsString(a->name);
        return 0;
    }
    file_args_free(a);
    return -1;
}

/* None, or the exception of a failed call. */
static PyObject *none_or_raise(ckptio_status st) {
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *mod_temporary_create(PyObject *module, PyObject *args) {
    PyObject *dir_o, *name_o, *ref_o = Py_None;
    file_args a;
    if (!PyArg_ParseTuple(args, "OO|O:dcp_temporary_create", &dir_o, &name_o, &ref_o) ||
        file_args_parse(dir_o, name_o, ref_o, &a) < 0)
        return NULL;
    char path[4096];
    int fd = -1;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_temporary_create(a.d, a.n, a.reference, &fd, path, sizeof path);
    Py_END_ALLOW_THREADS
    file_args_free(&a);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return Py_BuildValue("(iN)", fd, PyUnicode_DecodeFSDefault(path));
}

static PyObject *mod_reference(PyObject *module, PyObject *args) {
    PyObject *dir_o, *name_o;
    file_args a;
    if (!PyArg_ParseTuple(args, "OO:dcp_reference", &dir_o, &name_o) || file_args_parse(dir_o, name_o, Py_None, &a) < 0)
        return NULL;
    unsigned mode = 0;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_reference(a.d, a.n, &mode);
    Py_END_ALLOW_THREADS
    file_args_free(&a);
    if (st == CKPTIO_E_NOT_FOUND) Py_RETURN_NONE;
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return PyLong_FromUnsignedLong(mode);
}

static PyObject *mod_create_file(PyObject *module, PyObject *args) {
    PyObject *dir_o, *name_o, *ref_o;
    file_args a;
    if (!PyArg_ParseTuple(args, "OOO:dcp_create_file", &dir_o, &name_o, &ref_o) ||
        file_args_parse(dir_o, name_o, ref_o, &a) < 0)
        return NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_create_file(a.d, a.n, a.reference);
    Py_END_ALLOW_THREADS
    file_args_free(&a);
    return none_or_raise(st);
}

/* ---- the manifest ------------------------------------------------------------------- */

/* A PyMem block for the `n` elements (of `size` bytes) of the sequence
 * `seq`, recorded in mem[] for the caller to free; *list is a new list of
 * them. NULL with an error. */
static void *list_block(PyObject *seq, size_t size, PyObject **list, Py_ssize_t *n, void **mem, size_t *nmem) {
    if (!(*list = PySequence_List(seq))) return NULL;
    *n = PyList_Size(*list);
    void *block = PyMem_Calloc(*n ? (size_t)*n : 1, size);
    if (!block) {
        Py_CLEAR(*list);
        PyErr_NoMemory();
        return NULL;
    }
    mem[(*nmem)++] = block;
    return block;
}

/* One item (fqn, offsets or None, file, data_offset, nbytes, xxh3 or None,
 * parts or None, transforms); its strings live in `keep`, its arrays in mem[]. */
static int manifest_item(PyObject *row, PyObject *keep, ckptio_dcp_manifest_item *it, void **mem, size_t *nmem) {
    PyObject *fqn_o, *off_o, *file_o, *hash_o, *parts_o, *list = NULL;
    unsigned long long data_offset, nbytes;
    unsigned int transforms;
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(row, "UOOKKOOI:manifest item", &fqn_o, &off_o, &file_o, &data_offset, &nbytes, &hash_o,
                          &parts_o, &transforms))
        return -1;
    PyObject *fqn = PyUnicode_AsUTF8String(fqn_o), *file = fqn ? ckpy_path_bytes(file_o) : NULL;
    const int kept = fqn && file && PyList_Append(keep, fqn) == 0 && PyList_Append(keep, file) == 0;
    Py_XDECREF(fqn);
    Py_XDECREF(file);
    if (!kept) return -1;
    *it = (ckptio_dcp_manifest_item){.fqn = PyBytes_AsString(fqn), .file = PyBytes_AsString(file),
                                     .data_offset = data_offset, .nbytes = nbytes, .transforms = transforms};
    if (hash_o != Py_None) {
        it->hash = PyLong_AsUnsignedLongLong(hash_o);
        if (PyErr_Occurred()) return -1;
        it->hashed = 1;
    }
    if (off_o != Py_None) {
        int64_t *v = list_block(off_o, sizeof *v, &list, &n, mem, nmem);
        for (Py_ssize_t d = 0; v && d < n; d++) v[d] = PyLong_AsLongLong(PyList_GetItem(list, d));
        Py_XDECREF(list);
        if (!v || PyErr_Occurred()) return -1;
        it->offset = v;
        it->ndim = (uint32_t)n;
    }
    if (parts_o != Py_None) {
        ckptio_dcp_part *p = list_block(parts_o, sizeof *p, &list, &n, mem, nmem);
        for (Py_ssize_t k = 0; p && k < n; k++) {
            unsigned long long o, l, h;
            if (!PyArg_ParseTuple(PyList_GetItem(list, k), "KKK:part", &o, &l, &h)) p = NULL;
            else p[k] = (ckptio_dcp_part){o, l, h};
        }
        Py_XDECREF(list);
        if (!p) return -1;
        it->parts = p;
        it->nparts = (size_t)n;
    }
    return 0;
}

/* The items of a manifest; *mem (nmem blocks) and *out are the caller's to
 * free, also on failure. */
static int manifest_items(PyObject *seq, PyObject *keep, ckptio_dcp_manifest_item **out, size_t *count,
                          void ***mem, size_t *nmem) {
    PyObject *fast = PySequence_List(seq);
    if (!fast) return -1;
    const Py_ssize_t n = PyList_Size(fast);
    *out = PyMem_Calloc(n ? (size_t)n : 1, sizeof **out);
    *mem = PyMem_Calloc(2 * (size_t)n + 1, sizeof **mem);
    *nmem = *count = 0;
    int rc = *out && *mem ? 0 : (PyErr_NoMemory(), -1);
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++) {
        rc = manifest_item(PyList_GetItem(fast, i), keep, &(*out)[i], *mem, nmem);
        if (rc == 0) *count = (size_t)i + 1;
    }
    Py_DECREF(fast);
    return rc;
}

/* ---- removing what older saves left ------------------------------------------------- */

#define NOTE_CAP 4096

/* The arguments step 4's calls share: the directory, a list of names and
 * what the save committed. */
typedef struct cleanup_args {
    PyObject *dir;
    names_arg names;
    committed_arg committed;
} cleanup_args;

static void cleanup_args_free(cleanup_args *a) {
    Py_CLEAR(a->dir);
    names_free(&a->names);
    committed_free(&a->committed);
}

static int cleanup_args_parse(PyObject *dir_o, PyObject *names_o, PyObject *committed_o, cleanup_args *a) {
    memset(a, 0, sizeof *a);
    if ((a->dir = ckpy_path_bytes(dir_o)) && names_parse(names_o, &a->names) == 0 &&
        committed_parse(committed_o, &a->committed) == 0)
        return 0;
    cleanup_args_free(a);
    return -1;
}

static const ckptio_dcp_committed *committed_of(const cleanup_args *a) {
    return a->committed.present ? &a->committed.c : NULL;
}

static PyObject *mod_stale_files(PyObject *module, PyObject *args) {
    PyObject *dir_o, *keep_o, *committed_o, *result = NULL;
    cleanup_args a;
    if (!PyArg_ParseTuple(args, "OOO:dcp_stale_files", &dir_o, &keep_o, &committed_o) ||
        cleanup_args_parse(dir_o, keep_o, committed_o, &a) < 0)
        return NULL;
    char **names = NULL, note[NOTE_CAP];
    size_t count = 0;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_stale_files(PyBytes_AsString(a.dir), a.names.v, a.names.n, committed_of(&a), &names, &count, note,
                                sizeof note);
    Py_END_ALLOW_THREADS
    if (st == CKPTIO_OK) {
        PyObject *list = names_list(names, count);
        if (list) result = Py_BuildValue("(Ns)", list, note[0] ? note : NULL);
    } else {
        ckpy_raise(st);
    }
    ckptio_dcp_names_free(names, count);
    cleanup_args_free(&a);
    return result;
}

static PyObject *mod_remove_files(PyObject *module, PyObject *args) {
    PyObject *dir_o, *names_o, *committed_o;
    int sync, recheck;
    cleanup_args a;
    if (!PyArg_ParseTuple(args, "OOppO:dcp_remove_files", &dir_o, &names_o, &sync, &recheck, &committed_o) ||
        cleanup_args_parse(dir_o, names_o, committed_o, &a) < 0)
        return NULL;
    char note[NOTE_CAP];
    size_t removed = 0;
    const unsigned flags = (sync ? CKPTIO_DCP_SYNC : 0) | (recheck ? CKPTIO_DCP_RECHECK : 0);
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_remove_files(PyBytes_AsString(a.dir), a.names.v, a.names.n, flags, committed_of(&a), &removed,
                                 note, sizeof note);
    Py_END_ALLOW_THREADS
    cleanup_args_free(&a);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return Py_BuildValue("(ns)", (Py_ssize_t)removed, note[0] ? note : NULL);
}

/* ---- the commit ---------------------------------------------------------------------- */

/* The on_step callback: calls the Python callable with the GIL taken for
 * that moment; an exception (a test's injected fault, KeyboardInterrupt)
 * stops the commit and is raised once the C call returns. */
typedef struct step_ctx {
    PyObject *fn;
    PyObject *type, *value, *tb;
} step_ctx;

static int on_step(void *user, ckptio_dcp_commit_step step, const char *path, int done) {
    step_ctx *c = user;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(c->fn, "iNO", (int)step, PyUnicode_DecodeFSDefault(path),
                                        done ? Py_True : Py_False);
    const int stop = r == NULL;
    if (stop) PyErr_Fetch(&c->type, &c->value, &c->tb);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return stop;
}

typedef struct commit_call {
    const char *dir;
    const ckptio_dcp_commit_options *o;
    ckptio_dcp_commit_result *r;
} commit_call;

static ckptio_status do_commit(ckptio_engine *engine, void *arg) {
    (void)engine;
    const commit_call *c = arg;
    return ckptio_dcp_commit(c->dir, c->o, c->r);
}

static PyObject *mod_commit(PyObject *module, PyObject *args) {
    PyObject *dir_o, *md_o, *data, *files_o, *items_o, *fn = Py_None, *dir = NULL, *md = NULL, *result = NULL;
    PyObject *data_files_o = Py_None, *data_files = NULL, *engine_o = Py_None;
    ckpy_engine *engine = NULL;
    int sync, cleanup;
    if (!PyArg_ParseTuple(args, "OOSOOpi|OOO:dcp_commit", &dir_o, &md_o, &data, &files_o, &items_o, &sync, &cleanup,
                          &fn, &data_files_o, &engine_o))
        return NULL;
    if (cleanup < 0 || cleanup > 2) {
        PyErr_Format(PyExc_ValueError, "dcp_commit: cleanup must be 0 (none), 1 (now) or 2 (later), not %d", cleanup);
        return NULL;
    }
    names_arg files = {0};
    ckptio_file **handles = NULL;
    Py_ssize_t nhandles = 0;
    PyObject *keep = PyList_New(0);
    ckptio_dcp_manifest_item *items = NULL;
    void **mem = NULL;
    size_t count = 0, nmem = 0;
    if (!keep || !(dir = ckpy_path_bytes(dir_o)) || !(md = ckpy_path_bytes(md_o)) || names_parse(files_o, &files) < 0 ||
        (items_o != Py_None && manifest_items(items_o, keep, &items, &count, &mem, &nmem) < 0))
        goto out;
    /* The data files still to fsync (a list of File, kept alive by `data_files` for the call). */
    if (data_files_o != Py_None) {
        if (!(data_files = PySequence_List(data_files_o))) goto out;
        nhandles = PyList_Size(data_files);
        if (!(handles = PyMem_Calloc(nhandles ? (size_t)nhandles : 1, sizeof *handles))) {
            PyErr_NoMemory();
            goto out;
        }
        for (Py_ssize_t i = 0; i < nhandles; i++)
            if (!(handles[i] = ckpy_file_handle(PyList_GetItem(data_files, i)))) goto out;
    }
    static const unsigned cleanup_flags[] = {0, CKPTIO_DCP_CLEANUP, CKPTIO_DCP_CLEANUP_LATER};
    step_ctx ctx = {fn != Py_None ? fn : NULL, NULL, NULL, NULL};
    const ckptio_dcp_commit_options o = {
        PyBytes_AsString(md), PyBytes_AsString(data), (size_t)PyBytes_Size(data), files.v, files.n, items, count,
        (sync ? CKPTIO_DCP_SYNC : 0) | (items_o != Py_None ? CKPTIO_DCP_MANIFEST : 0) | cleanup_flags[cleanup],
        ctx.fn ? on_step : NULL, &ctx, handles, (size_t)nhandles};
    ckptio_dcp_commit_result r;
    ckptio_status st = CKPTIO_OK;
    if (engine_o != Py_None) {
        /* On the data files' engine: Ctrl-C stops the wait for their last parts (their uploads are aborted). */
        if (!(engine = ckpy_engine_resolve(engine_o))) goto out;
        commit_call c = {PyBytes_AsString(dir), &o, &r};
        if (ckpy_engine_run(engine, do_commit, &c) < 0) st = CKPTIO_E_CANCELED; /* raised already */
    } else {
        Py_BEGIN_ALLOW_THREADS /* `data` is immutable bytes, kept alive by the caller's tuple */
        st = ckptio_dcp_commit(PyBytes_AsString(dir), &o, &r);
        Py_END_ALLOW_THREADS
    }
    if (ctx.type) { /* the step callback's exception stopped the commit: it is the one raised */
        PyErr_Clear();
        PyErr_Restore(ctx.type, ctx.value, ctx.tb);
    } else if (st != CKPTIO_OK) {
        if (!PyErr_Occurred()) ckpy_raise(st);
    } else {
        PyObject *stale = cleanup == 2 ? names_list(r.stale, r.nstale) : (Py_INCREF(Py_None), Py_None);
        if (stale) result = Py_BuildValue("(Nns)", stale, (Py_ssize_t)r.removed, r.note[0] ? r.note : NULL);
    }
    ckptio_dcp_names_free(r.stale, r.nstale);
out:
    for (size_t i = 0; i < nmem; i++) PyMem_Free(mem[i]);
    PyMem_Free(mem);
    PyMem_Free(items);
    names_free(&files);
    PyMem_Free(handles);
    Py_XDECREF(data_files);
    Py_XDECREF(engine);
    Py_XDECREF(keep);
    Py_XDECREF(dir);
    Py_XDECREF(md);
    return result;
}

/* ---- the directory lock ------------------------------------------------------------- */

#define LOCK_CAPSULE "ckptio.dcp_lock"

/* The capsule holds a box so that release can empty it (a capsule's
 * pointer cannot be NULL). */
typedef struct lock_box {
    ckptio_dcp_lock *lock;
} lock_box;

static void lock_capsule_free(PyObject *capsule) {
    lock_box *box = PyCapsule_GetPointer(capsule, LOCK_CAPSULE);
    if (!box) {
        PyErr_Clear();
        return;
    }
    ckptio_dcp_lock_release(box->lock);
    PyMem_Free(box);
}

/* The on_wait callback: calls the Python callable with the GIL taken for
 * that moment; an exception (KeyboardInterrupt, ...) ends the wait and is
 * re-raised once the C call returns. */
typedef struct wait_ctx {
    PyObject *fn;
    PyObject *type, *value, *tb;
} wait_ctx;

static int on_wait(double waited, void *user) {
    wait_ctx *c = user;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(c->fn, "d", waited);
    const int stop = r == NULL;
    if (stop) PyErr_Fetch(&c->type, &c->value, &c->tb);
    Py_XDECREF(r);
    PyGILState_Release(g);
    return stop;
}

static PyObject *mod_lock_acquire(PyObject *module, PyObject *args) {
    PyObject *dir_o, *ref_o, *fn = Py_None, *dir = NULL, *ref = NULL;
    int shared, queued = 0, confirm_later = 0;
    double timeout;
    if (!PyArg_ParseTuple(args, "OOpd|Opp:dcp_lock_acquire", &dir_o, &ref_o, &shared, &timeout, &fn, &queued,
                          &confirm_later))
        return NULL;
    const char *reference;
    if (!(dir = ckpy_path_bytes(dir_o)) || optional_name(ref_o, &ref, &reference) < 0) {
        Py_XDECREF(dir);
        return NULL;
    }
    wait_ctx ctx = {fn != Py_None ? fn : NULL, NULL, NULL, NULL};
    ckptio_dcp_lock *lock = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_lock_acquire(PyBytes_AsString(dir), reference,
                                 (shared ? CKPTIO_DCP_LOCK_SHARED : 0) | (queued ? CKPTIO_DCP_LOCK_QUEUED : 0) |
                                     (confirm_later ? CKPTIO_DCP_LOCK_CONFIRM_LATER : 0),
                                 timeout,
                                 ctx.fn ? on_wait : NULL, &ctx, &lock);
    Py_END_ALLOW_THREADS
    Py_DECREF(dir);
    Py_XDECREF(ref);
    if (ctx.type) {
        ckptio_dcp_lock_release(lock);
        PyErr_Restore(ctx.type, ctx.value, ctx.tb);
        return NULL;
    }
    if (st != CKPTIO_OK) return ckpy_raise(st);
    lock_box *box = PyMem_Malloc(sizeof *box);
    if (!box) {
        ckptio_dcp_lock_release(lock);
        return PyErr_NoMemory();
    }
    box->lock = lock;
    PyObject *capsule = PyCapsule_New(box, LOCK_CAPSULE, lock_capsule_free);
    if (!capsule) {
        ckptio_dcp_lock_release(lock);
        PyMem_Free(box);
    }
    return capsule;
}

static PyObject *mod_lock_info(PyObject *module, PyObject *capsule) {
    lock_box *box = PyCapsule_GetPointer(capsule, LOCK_CAPSULE);
    if (!box) return NULL;
    if (!box->lock) {
        PyErr_SetString(PyExc_ValueError, "the DCP directory lock was released");
        return NULL;
    }
    ckptio_dcp_lock_info info;
    const ckptio_status st = ckptio_dcp_lock_query(box->lock, &info);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return Py_BuildValue("(OiKK)", info.locked ? Py_True : Py_False, info.sys_errno, (unsigned long long)info.device,
                         (unsigned long long)info.inode);
}

static PyObject *mod_lock_release(PyObject *module, PyObject *capsule) {
    lock_box *box = PyCapsule_GetPointer(capsule, LOCK_CAPSULE);
    if (!box) return NULL;
    ckptio_dcp_lock *lock = box->lock;
    box->lock = NULL;
    /* A lease's release is a GET and a DELETE: other threads (a commit's removal beside it) run meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    ckptio_dcp_lock_release(lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *mod_lock_check(PyObject *module, PyObject *capsule) {
    lock_box *box = PyCapsule_GetPointer(capsule, LOCK_CAPSULE);
    if (!box) return NULL;
    if (!box->lock) {
        PyErr_SetString(PyExc_ValueError, "the DCP directory lock was released");
        return NULL;
    }
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_dcp_lock_check(box->lock);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static PyMethodDef commit_methods[] = {
    {"dcp_temporary_create", mod_temporary_create, METH_VARARGS,
     "dcp_temporary_create(dir, name, reference=None) -> (fd, path): a flocked temporary of dir/name\n"
     "(ckptio_temporary_create); the caller closes fd."},
    {"dcp_reference", mod_reference, METH_VARARGS,
     "dcp_reference(dir, name) -> int or None: the permission bits new files of a save take from the\n"
     "regular file dir/name, None when there is none (ckptio_dcp_reference)."},
    {"dcp_create_file", mod_create_file, METH_VARARGS,
     "dcp_create_file(dir, name, reference): an empty data file with the reference's attributes\n"
     "(ckptio_dcp_create_file)."},
    {"dcp_commit", mod_commit, METH_VARARGS,
     "dcp_commit(dir, metadata_name, metadata, files, items, sync, cleanup, on_step=None, data_files=None)\n"
     "-> (stale or None, removed, note or None): steps 2-4 of a DCP save in one call (ckptio_dcp_commit).\n"
     "items: None (no manifest) or (fqn, offsets or None, file, data_offset, nbytes, xxh3 or None,\n"
     "[(offset, length, xxh3)] or None, transforms); cleanup: 0 none, 1 now, 2 list only (stale);\n"
     "on_step(step, path, done) runs around every step (DCP_STEP_*) and stops the commit by raising.\n"
     "data_files: this process's data Files, handed over by commit_unreferenced(sync_later=True): fsynced\n"
     "by the commit with the manifest and the metadata, objects completed beside the manifest's PUT (the\n"
     "caller closes them). engine: run on it (the data files' engine: Ctrl-C stops the wait for their\n"
     "uploads). GIL released."},
    {"dcp_stale_files", mod_stale_files, METH_VARARGS,
     "dcp_stale_files(dir, keep, committed) -> (names, note or None) (ckptio_dcp_stale_files);\n"
     "committed: None or (metadata_name, metadata bytes, files). GIL released."},
    {"dcp_remove_files", mod_remove_files, METH_VARARGS,
     "dcp_remove_files(dir, names, sync, recheck, committed) -> (removed, note or None)\n"
     "(ckptio_dcp_remove_files). GIL released."},
    {"dcp_lock_acquire", mod_lock_acquire, METH_VARARGS,
     "dcp_lock_acquire(dir, reference, shared, timeout, on_wait=None, queued=False, confirm_later=False) -> lock\n"
     "(ckptio_dcp_lock_acquire): timeout < 0 waits, 0 fails at once (E_BUSY); on_wait(waited_seconds) runs\n"
     "at each busy check and ends the wait by raising; queued waits in turn (CKPTIO_DCP_LOCK_QUEUED);\n"
     "confirm_later: a lease read back by the first check (CKPTIO_DCP_LOCK_CONFIRM_LATER).\n"
     "GIL released while waiting."},
    {"dcp_lock_info", mod_lock_info, METH_O,
     "dcp_lock_info(lock) -> (locked, errno, st_dev, st_ino) of the lock file (ckptio_dcp_lock_query)."},
    {"dcp_lock_check", mod_lock_check, METH_O,
     "dcp_lock_check(lock): raises CkptioError E_BUSY once the lease of a directory in object storage is no\n"
     "longer this save's (ckptio_dcp_lock_check); a flock always holds."},
    {"dcp_lock_release", mod_lock_release, METH_O,
     "dcp_lock_release(lock): unlocks and closes; a second call does nothing."},
    {NULL, NULL, 0, NULL},
};

int ckpy_dcp_commit_add_to_module(PyObject *module) {
    if (PyModule_AddFunctions(module, commit_methods) < 0) return -1;
    if (PyModule_AddIntConstant(module, "DCP_TRANSFORM_ZSTD", CKPTIO_DCP_TRANSFORM_ZSTD) < 0 ||
        PyModule_AddIntConstant(module, "DCP_STEP_MANIFEST", CKPTIO_DCP_STEP_MANIFEST) < 0 ||
        PyModule_AddIntConstant(module, "DCP_STEP_METADATA", CKPTIO_DCP_STEP_METADATA) < 0 ||
        PyModule_AddIntConstant(module, "DCP_STEP_LIST", CKPTIO_DCP_STEP_LIST) < 0 ||
        PyModule_AddIntConstant(module, "DCP_STEP_REMOVE", CKPTIO_DCP_STEP_REMOVE) < 0)
        return -1;
    return PyModule_AddStringConstant(module, "DCP_LOCK_NAME", CKPTIO_DCP_LOCK_NAME);
}
