/*
 * _ckptio_common.c - sequences the extension's types and functions share:
 * running a C call with the GIL released under the engine's lock, the life
 * of an object wrapping one C handle (open, calls under its locks, close,
 * context manager, path/closed), and parsing read targets and extents.
 *
 * Keeping them here means the locking order (object lock, then engine lock,
 * both taken with the GIL released) is written once, and so are the two
 * things every such call must survive:
 *
 * Signals. CPython runs a Python signal handler (Ctrl-C's
 * KeyboardInterrupt) only when the main thread executes Python code again;
 * a save running with the GIL released would finish and commit first. The
 * engine reports progress on the calling thread at most every 10 ms
 * (ckptio_engine_set_progress), so the extension's progress callback is
 * where the call looks at signals: on the main thread, at most every
 * SIGNAL_CHECK_INTERVAL, it takes the GIL back for a moment and calls
 * PyErr_CheckSignals(). A handler that raises cancels the transfer
 * (CKPTIO_E_CANCELED: the temporary is removed, the old file stays) and its
 * exception is what the call raises; a handler that returns lets the call
 * go on, as a SIGINT handler that only asks for a clean stop expects. Calls
 * shorter than the interval, and calls on other threads (whose signals
 * CPython does not handle anyway), never touch the GIL. A handler that
 * calls into the engine whose call it interrupted gets an error instead of
 * a deadlock on that engine's lock.
 *
 * Progress. The same callback reports to Python: ckptio.save/load(...,
 * progress=) put a callable in this thread's slot (set_progress) for the
 * duration of their bulk call, and the call calls it as (done, total) with
 * the GIL taken for that moment: first, at most every SIGNAL_CHECK_INTERVAL,
 * and last (done == total). It runs on the calling thread, main or not. An
 * exception from it cancels the transfer as a signal handler's does, and is
 * what the call raises.
 *
 * fork(). A child inherits the objects with their locks, one of which a
 * parent thread inside a call may hold forever; a pthread_atfork child
 * handler counts forks and the locks are replaced at their next use (the
 * library rebuilds its engines the same way, see src/common/fork.c).
 */
#include "_ckptio_internal.h"

#include <pthread.h>
#include <time.h>

#define SIGNAL_CHECK_INTERVAL 0.02 /* seconds */

/* ---- fork ---------------------------------------------------------------------- */

static _Atomic unsigned fork_generation;

/* Runs in the child inside fork(): async-signal-safe work only. */
static void count_fork(void) { atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed); }

void ckpy_fork_watch(void) { pthread_atfork(NULL, NULL, count_fork); }

unsigned ckpy_fork_generation(void) { return atomic_load_explicit(&fork_generation, memory_order_relaxed); }

/* Replaces *lock if it was made before the last fork(). The old one is left
 * alone: it may be held by a thread that does not exist here, and freeing
 * a held lock is undefined. GIL held, so two threads never both replace it. */
static int fresh_lock(PyThread_type_lock *lock, unsigned *generation) {
    const unsigned now = atomic_load_explicit(&fork_generation, memory_order_relaxed);
    if (*generation == now) return 0;
    PyThread_type_lock l = PyThread_allocate_lock();
    if (!l) {
        PyErr_NoMemory();
        return -1;
    }
    *lock = l;
    *generation = now;
    return 0;
}

int ckpy_engine_fork_check(ckpy_engine *engine) {
    const unsigned before = engine->generation;
    if (fresh_lock(&engine->lock, &engine->generation) < 0) return -1;
    /* A call copied from a parent thread is nobody's here. */
    if (engine->generation != before) atomic_store(&engine->call, NULL);
    return 0;
}

static int handle_fork_check(ckpy_handle *h) {
    if (fresh_lock(&h->lock, &h->generation) < 0) return -1;
    return h->engine ? ckpy_engine_fork_check(h->engine) : 0;
}

/* ---- calls ---------------------------------------------------------------------- */

struct ckpy_call {
    PyThreadState *tstate; /* the caller's, detached while the GIL is released */
    pthread_t thread;      /* the caller's thread: the only one that may attach tstate */
    int watch_signals;     /* the caller is the main thread */
    double next_check;     /* monotonic time of the next signal check */
    int interrupted;       /* a signal handler or progress raised: its exception is set in tstate */
    PyObject *progress;    /* strong reference: the Python progress callable, or NULL */
    int reported;          /* progress was called at least once */
    /* A call may run several plans (a torch save writes its data, then the
     * archive's directory): their bytes add up, so Python sees one count. */
    uint64_t base;         /* bytes of the plans finished before this one */
    uint64_t last_done, last_total; /* the latest report, relative to its plan */
};

/* The progress callable of this thread's next calls (set_progress). */
static _Thread_local PyObject *thread_progress;

PyObject *ckpy_set_progress(PyObject *module, PyObject *callable) {
    (void)module;
    if (callable != Py_None && !PyCallable_Check(callable)) {
        PyErr_SetString(PyExc_TypeError, "progress must be a callable (done, total) or None");
        return NULL;
    }
    PyObject *previous = thread_progress ? thread_progress : Py_None;
    thread_progress = NULL;
    if (callable != Py_None) {
        Py_INCREF(callable);
        thread_progress = callable;
    }
    if (previous == Py_None) Py_INCREF(previous);
    return previous; /* the slot's reference passes to the caller */
}

static double monotonic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Is the caller the main thread, whose signals CPython handles? The main
 * thread's ident is asked of threading once per process (again in a child,
 * where the thread that forked is the main one). */
static int on_main_thread(void) {
    static unsigned long main_ident;
    static unsigned known_in = (unsigned)-1;
    const unsigned now = atomic_load_explicit(&fork_generation, memory_order_relaxed);
    if (known_in != now) {
        PyObject *threading = PyImport_ImportModule("threading");
        PyObject *main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
        PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
        const unsigned long v = ident ? PyLong_AsUnsignedLong(ident) : 0;
        const int ok = ident && !PyErr_Occurred();
        Py_XDECREF(threading);
        Py_XDECREF(main);
        Py_XDECREF(ident);
        if (!ok) {
            PyErr_Clear(); /* interpreter shutting down: no signal checks */
            return 0;
        }
        main_ident = v;
        known_in = now;
    }
    return PyThread_get_thread_ident() == main_ident;
}

/* Refuses a call from a signal handler that interrupted a call on the same
 * engine (its lock is held by this very thread). GIL held. */
static int refuse_reentry(ckpy_engine *engine) {
    ckpy_call *c = engine ? atomic_load(&engine->call) : NULL;
    if (!c || !pthread_equal(c->thread, pthread_self())) return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "ckptio: this engine is busy with the call a signal handler interrupted; use another "
                    "ckptio.Engine() inside signal handlers");
    return -1;
}

/* Starts a call: the GIL is released on return. GIL held. */
static void call_begin(ckpy_call *c) {
    c->thread = pthread_self();
    c->watch_signals = on_main_thread();
    c->next_check = monotonic_now() + SIGNAL_CHECK_INTERVAL;
    c->interrupted = 0;
    c->progress = thread_progress;
    Py_XINCREF(c->progress); /* the callable may replace the slot while it runs */
    c->reported = 0;
    c->base = c->last_done = c->last_total = 0;
    c->tstate = PyEval_SaveThread();
}

/* Ends a call whose C work returned `st`: takes the GIL back and raises.
 * A signal handler's exception wins over the cancellation it caused (and
 * over any failure at the same moment): Ctrl-C reads as KeyboardInterrupt.
 * @return 0, or -1 with an exception set. */
static int call_end(ckpy_call *c, ckptio_status st) {
    PyEval_RestoreThread(c->tstate);
    Py_CLEAR(c->progress);
    if (c->interrupted) return -1;
    if (st != CKPTIO_OK) {
        ckpy_raise(st); /* same thread, right after the failure */
        return -1;
    }
    return 0;
}

int ckpy_progress(uint64_t done, uint64_t total, void *user) {
    ckpy_engine *engine = user;
    ckpy_call *c = atomic_load_explicit(&engine->call, memory_order_relaxed);
    if (!c || (!c->watch_signals && !c->progress) || !pthread_equal(c->thread, pthread_self())) return 0;
    if (c->interrupted) return 1;
    if (c->last_done == c->last_total && (done < c->last_done || total != c->last_total))
        c->base += c->last_total; /* the previous plan finished: a new one starts */
    c->last_done = done;
    c->last_total = total;
    done += c->base;
    total += c->base;
    /* Python progress always sees the first and the last report. */
    const int edge = c->progress && (!c->reported || done == total);
    if (!edge && monotonic_now() < c->next_check) return 0;
    PyEval_RestoreThread(c->tstate);
    if (c->watch_signals && PyErr_CheckSignals() < 0) c->interrupted = 1;
    if (!c->interrupted && c->progress) {
        c->reported = 1;
        PyObject *r = PyObject_CallFunction(c->progress, "KK", (unsigned long long)done, (unsigned long long)total);
        if (r) Py_DECREF(r);
        else c->interrupted = 1;
    }
    c->tstate = PyEval_SaveThread();
    c->next_check = monotonic_now() + SIGNAL_CHECK_INTERVAL;
    return c->interrupted;
}

PyObject *ckpy_int64_tuple(const int64_t *v, uint32_t n) {
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    if (!t) return NULL;
    for (uint32_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong((long long)v[i]);
        if (!x) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SetItem(t, (Py_ssize_t)i, x);
    }
    return t;
}

int ckpy_engine_run(ckpy_engine *engine, ckpy_engine_op fn, void *arg) {
    if (ckpy_engine_fork_check(engine) < 0 || refuse_reentry(engine) < 0) return -1;
    ckptio_engine *e = engine->engine;
    PyThread_type_lock elock = engine->lock;
    ckpy_call call;
    call_begin(&call);
    ckpy_lock_nogil(elock);
    atomic_store(&engine->call, &call);
    const ckptio_status st = fn(e, arg);
    atomic_store(&engine->call, NULL);
    PyThread_release_lock(elock);
    return call_end(&call, st);
}

/* ---- parsing ------------------------------------------------------------------ */

ckptio_tensor_target *ckpy_parse_targets(PyObject *seq, const char *not_sequence, size_t *count) {
    if (!PySequence_Check(seq)) {
        PyErr_SetString(PyExc_TypeError, not_sequence);
        return NULL;
    }
    Py_ssize_t n = PySequence_Size(seq);
    if (n < 0) return NULL;
    ckptio_tensor_target *targets = PyMem_Calloc(n ? (size_t)n : 1, sizeof *targets);
    if (!targets) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(seq, i);
        if (!item) goto fail;
        PyObject *index_o, *addr_o, *cap_o, *kind_o;
        uint64_t index, addr, cap;
        int ok = PyArg_ParseTuple(item, "OOOO:read target", &index_o, &addr_o, &cap_o, &kind_o) &&
                 ckpy_u64(index_o, "target index", &index) == 0 && ckpy_u64(addr_o, "target address", &addr) == 0 &&
                 ckpy_u64(cap_o, "target capacity", &cap) == 0 && ckpy_mem_kind(kind_o, &targets[i].mem_kind) == 0;
        Py_DECREF(item);
        if (!ok) goto fail;
        targets[i].index = (size_t)index;
        targets[i].data = (void *)(uintptr_t)addr;
        targets[i].capacity = cap;
    }
    *count = (size_t)n;
    return targets;
fail:
    PyMem_Free(targets);
    return NULL;
}

int ckpy_parse_extent(PyObject *addr_o, PyObject *len_o, PyObject *off_o, PyObject *kind_o, ckptio_extent *e) {
    uint64_t addr;
    if (ckpy_u64(addr_o, "address", &addr) < 0 || ckpy_u64(len_o, "nbytes", &e->length) < 0 ||
        ckpy_u64(off_o, "file offset", &e->file_offset) < 0 || ckpy_mem_kind(kind_o, &e->mem_kind) < 0)
        return -1;
    if (addr == 0 && e->length != 0) {
        PyErr_SetString(PyExc_ValueError, "address 0 with a non-zero length");
        return -1;
    }
    e->memory = (void *)(uintptr_t)addr;
    return 0;
}

/* ---- handle objects ------------------------------------------------------------- */

typedef struct open_call {
    ckpy_open_op fn;
    const char *path;
    void *arg;
    void *handle;
} open_call;

static ckptio_status do_open(ckptio_engine *engine, void *arg) {
    open_call *c = arg;
    return c->fn(engine, c->path, c->arg, &c->handle);
}

ckpy_handle *ckpy_handle_new(PyTypeObject *type, const ckpy_handle_kind *kind, PyObject *path_arg,
                             PyObject *engine_arg, ckpy_open_op open, void *arg) {
    /* tp_alloc (PyType_GenericAlloc) zeroes the object, so a failure below
     * deallocates a consistent one: no handle, NULL references. */
    allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    ckpy_handle *self = (ckpy_handle *)alloc(type, 0);
    if (!self) return NULL;
    self->handle = NULL;
    self->engine = NULL;
    self->path = NULL;
    self->kind = kind;
    self->generation = ckpy_fork_generation();
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        Py_DECREF(self);
        PyErr_NoMemory();
        return NULL;
    }
    PyObject *pb = ckpy_path_bytes(path_arg);
    if (!pb) goto fail;
    self->path = PyUnicode_DecodeFSDefault(PyBytes_AsString(pb));
    self->engine = ckpy_engine_resolve(engine_arg);
    if (!self->path || !self->engine) {
        Py_DECREF(pb);
        goto fail;
    }
    open_call c = {open, PyBytes_AsString(pb), arg, NULL};
    int rc = ckpy_engine_run(self->engine, do_open, &c);
    Py_DECREF(pb);
    if (rc < 0) goto fail;
    self->handle = c.handle;
    return self;
fail:
    Py_DECREF(self);
    return NULL;
}

PyObject *ckpy_reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs, const char *format,
                          const ckpy_handle_kind *kind, ckpy_open_op open, int (*describe)(ckpy_handle *self)) {
    static char *kwlist[] = {"path", "engine", NULL};
    PyObject *path_arg, *engine_arg = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, format, kwlist, &path_arg, &engine_arg)) return NULL;
    ckpy_handle *self = ckpy_handle_new(type, kind, path_arg, engine_arg, open, NULL);
    if (!self) return NULL;
    if (describe(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

void ckpy_handle_dealloc(PyObject *obj) {
    ckpy_handle *self = (ckpy_handle *)obj;
    /* Calls on the object hold a reference to it, so none is in flight. */
    if (self->handle) {
        /* An exception may be on its way through: keep it. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (handle_fork_check(self) < 0) PyErr_Clear(); /* out of memory: the old lock it is */
        PyErr_Restore(type, value, tb);
    }
    if (self->handle) {
        if (self->kind->dealloc_drops_gil) {
            /* Close may wait for requests in flight; not while holding the GIL. */
            Py_BEGIN_ALLOW_THREADS
            self->kind->close(self);
            Py_END_ALLOW_THREADS
        } else {
            self->kind->close(self);
        }
        self->handle = NULL;
    }
    Py_CLEAR(self->engine);
    Py_CLEAR(self->path);
    /* A lock inherited through fork() may be held by a vanished thread. */
    if (self->lock && self->generation == ckpy_fork_generation()) PyThread_free_lock(self->lock);
    ckpy_free_object(obj);
}

PyObject *ckpy_handle_closed_error(ckpy_handle *self) {
    PyErr_Format(PyExc_ValueError, "I/O operation on a closed %s (%U)", self->kind->what, self->path);
    return NULL;
}

int ckpy_handle_run(ckpy_handle *self, ckpy_handle_op fn, void *arg) {
    if (handle_fork_check(self) < 0 || refuse_reentry(self->engine) < 0) return -1;
    ckptio_status st = CKPTIO_OK;
    int was_closed = 0;
    ckpy_call call;
    call_begin(&call);
    ckpy_lock_nogil(self->lock);
    if (!self->handle) {
        was_closed = 1;
    } else {
        ckpy_lock_nogil(self->engine->lock);
        atomic_store(&self->engine->call, &call);
        st = fn(self, arg);
        atomic_store(&self->engine->call, NULL);
        PyThread_release_lock(self->engine->lock);
    }
    PyThread_release_lock(self->lock);
    if (was_closed) {
        PyEval_RestoreThread(call.tstate);
        ckpy_handle_closed_error(self);
        return -1;
    }
    return call_end(&call, st);
}

PyObject *ckpy_handle_close(PyObject *obj, PyObject *unused) {
    ckpy_handle *self = (ckpy_handle *)obj;
    if (handle_fork_check(self) < 0 || refuse_reentry(self->engine) < 0) return NULL;
    ckptio_status st = CKPTIO_OK;
    Py_BEGIN_ALLOW_THREADS
    ckpy_lock_nogil(self->lock); /* waits for a call in flight on another thread */
    if (self->handle) st = self->kind->close(self);
    self->handle = NULL;
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    if (st != CKPTIO_OK) return ckpy_raise(st);
    Py_RETURN_NONE;
}

PyObject *ckpy_handle_enter(PyObject *obj, PyObject *unused) {
    Py_INCREF(obj);
    return obj;
}

PyObject *ckpy_handle_exit(PyObject *obj, PyObject *args) {
    PyObject *r = ckpy_handle_close(obj, NULL);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

PyObject *ckpy_handle_get_path(PyObject *obj, void *closure) {
    PyObject *v = ((ckpy_handle *)obj)->path;
    Py_INCREF(v);
    return v;
}

PyObject *ckpy_handle_get_closed(PyObject *obj, void *closure) {
    return PyBool_FromLong(((ckpy_handle *)obj)->handle == NULL);
}

/* A BYTES, STR or BIGINT node of a pickle value tree as bytes, str or int. */
PyObject *ckpy_value_bytes_like(const ckptio_value *v, ckptio_value_kind kind) {
    const char *data = NULL;
    size_t len = 0;
    ckptio_status st = ckptio_value_bytes(v, &data, &len);
    if (st != CKPTIO_OK) return ckpy_raise(st);
    if (kind == CKPTIO_VALUE_BYTES) return PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    if (kind == CKPTIO_VALUE_BIGINT) {
        /* int.from_bytes(data, "little", signed=True) */
        PyObject *b = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
        PyObject *fn = b ? PyObject_GetAttrString((PyObject *)&PyLong_Type, "from_bytes") : NULL;
        PyObject *a = fn ? Py_BuildValue("(Os)", b, "little") : NULL;
        PyObject *kw = a ? Py_BuildValue("{sO}", "signed", Py_True) : NULL;
        PyObject *r = kw ? PyObject_Call(fn, a, kw) : NULL;
        Py_XDECREF(b);
        Py_XDECREF(fn);
        Py_XDECREF(a);
        Py_XDECREF(kw);
        return r;
    }
    /* pickle's own decoding (torch.load's): lone surrogates pass. */
    return PyUnicode_DecodeUTF8(data, (Py_ssize_t)len, "surrogatepass");
}
