/*
 * ckpy_snapshot.c - ckptio._ckptio.SnapshotPool: a snapshot pool
 * (ckptio_snapshot_*, include/ckptio/snapshot.h), what ckptio.Snapshots
 * runs on. Tensors are passed as integer addresses, streams as the integer
 * handles torch gives (torch.cuda.Stream.cuda_stream).
 *
 * Every call releases the GIL: the pool is thread-safe, and the training
 * thread's before_update must not wait behind a writer thread's wait(). A
 * call in progress keeps the pool alive: close() waits for the calls that
 * started before it, then destroys the pool.
 */
#include "ckpy_engine.h"
#include "ckpy_parts.h"

#include <time.h>

static PyTypeObject *pool_type = NULL;

typedef struct snapshot_pool_object {
    PyObject_HEAD
    ckptio_snapshot_pool *pool; /* NULL once closed */
    atomic_int calls;           /* calls running with the GIL released */
    unsigned generation;        /* ckpy_fork_generation() at creation */
} snapshot_pool_object;

/* The pool for a call (counted), or NULL with ValueError once closed or in a fork()ed child. */
static ckptio_snapshot_pool *enter(snapshot_pool_object *self) {
    if (!self->pool || self->generation != ckpy_fork_generation()) {
        PyErr_SetString(PyExc_ValueError, self->pool ? "a snapshot pool cannot be used in a fork()ed child"
                                                     : "the snapshot pool is closed");
        return NULL;
    }
    atomic_fetch_add(&self->calls, 1);
    return self->pool;
}

static void leave(snapshot_pool_object *self) { atomic_fetch_sub(&self->calls, 1); }

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"nbytes", "device", "engine", NULL};
    unsigned long long nbytes = 0;
    int device = -1;
    PyObject *engine_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "K|iO:SnapshotPool", kwlist, &nbytes, &device, &engine_arg))
        return NULL;
    ckpy_engine *engine = ckpy_engine_resolve(engine_arg); /* its settings only (huge pages) */
    if (!engine) return NULL;
    ckptio_snapshot_pool *pool = NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_snapshot_pool_create(engine->engine, (uint64_t)nbytes, device, &pool);
    Py_END_ALLOW_THREADS
    Py_DECREF(engine);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    snapshot_pool_object *self = (snapshot_pool_object *)PyType_GenericAlloc(type, 0);
    if (!self) {
        ckptio_snapshot_pool_destroy(pool);
        return NULL;
    }
    self->pool = pool;
    atomic_store(&self->calls, 0);
    self->generation = ckpy_fork_generation();
    return (PyObject *)self;
}

static ckptio_status destroy_when_idle(snapshot_pool_object *self, ckptio_snapshot_pool *pool) {
    while (atomic_load(&self->calls) > 0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return ckptio_snapshot_pool_destroy(pool);
}

static PyObject *pool_close(PyObject *obj, PyObject *unused) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    ckptio_snapshot_pool *pool = self->pool;
    self->pool = NULL;
    if (!pool || self->generation != ckpy_fork_generation()) Py_RETURN_NONE; /* a child's copy is not its own */
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = destroy_when_idle(self, pool);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static void pool_dealloc(PyObject *obj) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    if (self->pool && self->generation == ckpy_fork_generation()) {
        ckptio_snapshot_pool *pool = self->pool;
        self->pool = NULL;
        Py_BEGIN_ALLOW_THREADS
        (void)destroy_when_idle(self, pool);
        Py_END_ALLOW_THREADS
    }
    ckpy_free_object(obj);
}

static PyObject *pool_info(PyObject *obj, PyObject *unused) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    ckptio_snapshot_pool *pool = enter(self);
    if (!pool) return NULL;
    ckptio_snapshot_pool_info info;
    ckptio_status st = ckptio_snapshot_pool_query(pool, &info);
    leave(self);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:i,s:O,s:O}", "address", (unsigned long long)(uintptr_t)info.base,
                         "nbytes", (unsigned long long)info.bytes, "ready_bytes",
                         (unsigned long long)info.ready_bytes, "piece_bytes", (unsigned long long)info.piece_bytes,
                         "device", info.device, "pinned", info.pinned ? Py_True : Py_False, "held",
                         info.held ? Py_True : Py_False);
}

static PyObject *pool_wait_ready(PyObject *obj, PyObject *arg) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    uint64_t nbytes;
    if (ckpy_u64(arg, "nbytes", &nbytes) < 0) return NULL;
    ckptio_snapshot_pool *pool = enter(self);
    if (!pool) return NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_snapshot_pool_wait_ready(pool, nbytes);
    Py_END_ALLOW_THREADS
    leave(self);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

/* One (address, offset, nbytes, device, flags) tuple. */
static int parse_copy(PyObject *item, Py_ssize_t i, ckptio_snapshot_copy *c) {
    unsigned long long addr, offset, nbytes;
    int device;
    unsigned int flags;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "KKKiI", &addr, &offset, &nbytes, &device, &flags)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "snapshot copy %zd: expected (address, offset, nbytes, device, flags)", i);
        return -1;
    }
    *c = (ckptio_snapshot_copy){.src = (const void *)(uintptr_t)addr, .offset = offset, .nbytes = nbytes,
                                .device = device, .flags = flags};
    return 0;
}

static PyObject *pool_take(PyObject *obj, PyObject *args) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    PyObject *copies_o, *streams_o;
    if (!PyArg_ParseTuple(args, "OO:take", &copies_o, &streams_o)) return NULL;
    PyObject *copies_seq = PySequence_List(copies_o);
    if (!copies_seq) return NULL;
    PyObject *streams_seq = PySequence_List(streams_o);
    if (!streams_seq) {
        Py_DECREF(copies_seq);
        return NULL;
    }
    const Py_ssize_t n = PyList_Size(copies_seq), ns = PyList_Size(streams_seq);
    ckptio_snapshot_copy *copies = PyMem_Malloc(sizeof *copies * (size_t)(n ? n : 1));
    ckptio_snapshot_stream *streams = PyMem_Malloc(sizeof *streams * (size_t)(ns ? ns : 1));
    PyObject *result = NULL;
    if (!copies || !streams) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_copy(PyList_GetItem(copies_seq, i), i, &copies[i]) < 0) goto out;
    for (Py_ssize_t i = 0; i < ns; i++) {
        int device;
        unsigned long long handle;
        if (!PyArg_ParseTuple(PyList_GetItem(streams_seq, i), "iK", &device, &handle)) goto out;
        streams[i] = (ckptio_snapshot_stream){.device = device, .stream = (uintptr_t)handle};
    }
    ckptio_snapshot_pool *pool = enter(self);
    if (!pool) goto out;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_snapshot_take(pool, copies, (size_t)n, streams, (size_t)ns);
    Py_END_ALLOW_THREADS
    leave(self);
    if (st != CKPTIO_OK) {
        ckpy_raise(st);
        goto out;
    }
    result = Py_None;
    Py_INCREF(result);
out:
    PyMem_Free(copies);
    PyMem_Free(streams);
    Py_DECREF(copies_seq);
    Py_DECREF(streams_seq);
    return result;
}

static PyObject *pool_before_update(PyObject *obj, PyObject *args) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    int device;
    unsigned long long stream;
    if (!PyArg_ParseTuple(args, "iK:before_update", &device, &stream)) return NULL;
    ckptio_snapshot_pool *pool = enter(self);
    if (!pool) return NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = ckptio_snapshot_before_update(pool, device, (uintptr_t)stream);
    Py_END_ALLOW_THREADS
    leave(self);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_copied(PyObject *obj, PyObject *unused) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    ckptio_snapshot_pool *pool = enter(self);
    if (!pool) return NULL;
    int copied;
    Py_BEGIN_ALLOW_THREADS
    copied = ckptio_snapshot_copied(pool);
    Py_END_ALLOW_THREADS
    leave(self);
    return PyBool_FromLong(copied);
}

static PyObject *run_simple(PyObject *obj, ckptio_status (*fn)(ckptio_snapshot_pool *)) {
    snapshot_pool_object *self = (snapshot_pool_object *)obj;
    ckptio_snapshot_pool *pool = enter(self);
    if (!pool) return NULL;
    ckptio_status st;
    Py_BEGIN_ALLOW_THREADS
    st = fn(pool);
    Py_END_ALLOW_THREADS
    leave(self);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

static PyObject *pool_wait(PyObject *obj, PyObject *unused) { return run_simple(obj, ckptio_snapshot_wait); }
static PyObject *pool_release(PyObject *obj, PyObject *unused) { return run_simple(obj, ckptio_snapshot_release); }

static PyMethodDef pool_methods[] = {
    {"info", pool_info, METH_NOARGS,
     "info() -> dict: address, nbytes, ready_bytes (pinned so far), piece_bytes, device, pinned, held."},
    {"wait_ready", pool_wait_ready, METH_O,
     "wait_ready(nbytes): blocks until the first nbytes are pinned (raises the pinning's failure)."},
    {"take", pool_take, METH_VARARGS,
     "take(copies, streams): copies is a sequence of (address, offset, nbytes, device, flags) (device -1: host\n"
     "memory, copied during the call; flags: SNAPSHOT_EARLY), streams of (device, stream handle): the streams\n"
     "whose queued work the snapshot follows (ckptio_snapshot_take). Raises E_BUSY while one is held."},
    {"before_update", pool_before_update, METH_VARARGS,
     "before_update(device, stream): the stream waits, on the device, for the held snapshot's copies."},
    {"copied", pool_copied, METH_NOARGS, "copied() -> bool: the held snapshot's copies have completed."},
    {"wait", pool_wait, METH_NOARGS, "wait(): blocks until the held snapshot's copies have completed."},
    {"release", pool_release, METH_NOARGS, "release(): ends the held snapshot (waits for its copies)."},
    {"close", pool_close, METH_NOARGS, "close(): releases, unpins and frees the pool (idempotent)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot pool_slots[] = {
    {Py_tp_new, pool_new},
    {Py_tp_dealloc, pool_dealloc},
    {Py_tp_methods, pool_methods},
    {Py_tp_doc, "SnapshotPool(nbytes, device=-1, engine=None): a snapshot pool pinned in the background for CUDA\n"
                "device `device` (-1: plain host memory), huge pages as `engine`'s gpu_huge_slots allows\n"
                "(ckptio_snapshot_pool_create)."},
    {0, NULL},
};

static PyType_Spec pool_spec = {
    "ckptio._ckptio.SnapshotPool",
    sizeof(snapshot_pool_object),
    0,
    Py_TPFLAGS_DEFAULT,
    pool_slots,
};

int ckpy_snapshot_add_to_module(PyObject *module) {
    pool_type = (PyTypeObject *)PyType_FromSpec(&pool_spec);
    if (!pool_type) return -1;
    if (PyModule_AddObject(module, "SnapshotPool", (PyObject *)pool_type) < 0) {
        Py_DECREF(pool_type);
        return -1;
    }
    return PyModule_AddIntConstant(module, "SNAPSHOT_EARLY", CKPTIO_SNAPSHOT_EARLY);
}
