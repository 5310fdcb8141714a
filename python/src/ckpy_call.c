/*
 * ckpy_call.c - a C call of the extension: run with the GIL released under
 * the engine's lock (ckpy_engine_run; ckpy_handle.c adds an object's lock
 * before it), the engine's progress callback, and fork() safety of the
 * locks.
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
#include "ckpy_call.h"

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
int ckpy_fresh_lock(PyThread_type_lock *lock, unsigned *generation) {
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
    if (ckpy_fresh_lock(&engine->lock, &engine->generation) < 0) return -1;
    /* A call copied from a parent thread is nobody's here. */
    if (engine->generation != before) atomic_store(&engine->call, NULL);
    return 0;
}

/* ---- calls ---------------------------------------------------------------------- */

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
int ckpy_refuse_reentry(ckpy_engine *engine) {
    ckpy_call *c = engine ? atomic_load(&engine->call) : NULL;
    if (!c || !pthread_equal(c->thread, pthread_self())) return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "ckptio: this engine is busy with the call a signal handler interrupted; use another "
                    "ckptio.Engine() inside signal handlers");
    return -1;
}

/* Starts a call: the GIL is released on return. GIL held. */
void ckpy_call_begin(ckpy_call *c) {
    c->thread = pthread_self();
    c->watch_signals = on_main_thread();
    c->next_check = monotonic_now() + SIGNAL_CHECK_INTERVAL;
    c->interrupted = 0;
    c->progress = thread_progress;
    Py_XINCREF(c->progress); /* the callable may replace the slot while it runs */
    c->reported = 0;
    c->base = c->last_done = c->last_total = 0;
    c->told_done = c->told_total = UINT64_MAX;
    c->tstate = PyEval_SaveThread();
}

/* Ends a call whose C work returned `st`: takes the GIL back and raises.
 * A signal handler's exception wins over the cancellation it caused (and
 * over any failure at the same moment): Ctrl-C reads as KeyboardInterrupt.
 * @return 0, or -1 with an exception set. */
int ckpy_call_end(ckpy_call *c, ckptio_status st) {
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
    /* Python progress always sees the first and the last report, once: a
     * commit that waits for the server repeats the last one, which only
     * lets signals be checked. */
    const int edge =
        c->progress && (!c->reported || (done == total && !(c->told_done == done && c->told_total == total)));
    if (!edge && monotonic_now() < c->next_check) return 0;
    PyEval_RestoreThread(c->tstate);
    if (c->watch_signals && PyErr_CheckSignals() < 0) c->interrupted = 1;
    if (!c->interrupted && c->progress && (edge || !(c->told_done == done && c->told_total == total))) {
        c->reported = 1;
        c->told_done = done;
        c->told_total = total;
        PyObject *r = PyObject_CallFunction(c->progress, "KK", (unsigned long long)done, (unsigned long long)total);
        if (r) Py_DECREF(r);
        else c->interrupted = 1;
    }
    c->tstate = PyEval_SaveThread();
    c->next_check = monotonic_now() + SIGNAL_CHECK_INTERVAL;
    return c->interrupted;
}

int ckpy_engine_run(ckpy_engine *engine, ckpy_engine_op fn, void *arg) {
    if (ckpy_engine_fork_check(engine) < 0 || ckpy_refuse_reentry(engine) < 0) return -1;
    ckptio_engine *e = engine->engine;
    PyThread_type_lock elock = engine->lock;
    ckpy_call call;
    ckpy_call_begin(&call);
    ckpy_lock_nogil(elock);
    atomic_store(&engine->call, &call);
    const ckptio_status st = fn(e, arg);
    atomic_store(&engine->call, NULL);
    PyThread_release_lock(elock);
    return ckpy_call_end(&call, st);
}

