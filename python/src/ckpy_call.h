/*
 * ckpy_call.h - a C call of the extension (ckpy_call.c): the engine object's
 * fields the call needs, running a call with the GIL released under the
 * engine's lock, the engine's progress callback, fork() safety of locks.
 */
#ifndef CKPY_CALL_H
#define CKPY_CALL_H

#include "ckpy_values.h"

#include <pthread.h>

/* One call in flight on an engine (between ckpy_call_begin and _end). */
typedef struct ckpy_call ckpy_call;
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
    uint64_t told_done, told_total; /* what Python's progress was last called with */
};

typedef struct ckpy_engine {
    PyObject_HEAD
    ckptio_engine *engine;
    PyThread_type_lock lock;
    unsigned generation;         /* ckpy_fork_generation() of `lock` */
    _Atomic(ckpy_call *) call;   /* the call holding `lock`, or NULL */
} ckpy_engine;

/* ---- fork ---------------------------------------------------------------- */

/* Registers the fork handler (module init). */
void ckpy_fork_watch(void);

/* How many fork()s separate this process from the one that loaded the
 * extension; objects record it with their locks. */
unsigned ckpy_fork_generation(void);

/* Replaces *lock if it was made before the last fork(): the old one may be
 * held by a thread that does not exist here. GIL held; -1 with an error. */
int ckpy_fresh_lock(PyThread_type_lock *lock, unsigned *generation);

/* Call with the GIL held before taking the engine's lock: in a fork()ed
 * child, replaces a lock inherited from the parent (a parent thread inside
 * a call at fork() would hold it forever). -1 with an error. */
int ckpy_engine_fork_check(ckpy_engine *engine);

/* ---- calls --------------------------------------------------------------- */

/* The engine's progress callback (ckptio_progress_fn, user = the
 * ckpy_engine), installed on every engine the extension creates: during a
 * call made on the main thread, it runs the Python signal handlers every
 * few tens of milliseconds (taking the GIL for that moment only) and
 * cancels the transfer when one raises (Ctrl-C's KeyboardInterrupt). */
int ckpy_progress(uint64_t done, uint64_t total, void *user);

/* set_progress(callable_or_None) -> the previous one: the Python callable
 * (done, total) that this thread's following calls report their progress
 * to through ckpy_progress (GIL taken for each report; an exception it
 * raises cancels the call and is raised by it). */
PyObject *ckpy_set_progress(PyObject *module, PyObject *callable);

/* Refuses (-1, RuntimeError) a call from a signal handler that interrupted
 * a call on the same engine, whose lock this very thread holds. GIL held. */
int ckpy_refuse_reentry(ckpy_engine *engine);

/* Starts a call (GIL held; released on return), and ends it once its C
 * work returned `st`: takes the GIL back and raises. A signal handler's
 * exception wins over the cancellation it caused: Ctrl-C reads as
 * KeyboardInterrupt. @return 0, or -1 with an exception set. */
void ckpy_call_begin(ckpy_call *c);
int ckpy_call_end(ckpy_call *c, ckptio_status st);

/* Runs fn(engine->engine, arg) with the GIL released and the engine's lock
 * held. @return 0, or -1 with the ckptio exception of its failure raised. */
typedef ckptio_status (*ckpy_engine_op)(ckptio_engine *engine, void *arg);
int ckpy_engine_run(ckpy_engine *engine, ckpy_engine_op fn, void *arg);

#endif /* CKPY_CALL_H */
