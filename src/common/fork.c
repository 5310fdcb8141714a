/*
 * fork.c - noticing that the process is a fork()ed child.
 *
 * Threads do not survive fork(): a child inherits the parent's engines with
 * their pools' bookkeeping but none of their threads, locks that a vanished
 * thread may hold, io_uring rings it shares with the parent, and device state
 * the CUDA driver forbids it to use. multiprocessing's default start method
 * on Linux and DataLoader workers fork processes that already used ckptio.
 *
 * The pthread_atfork child handler only counts forks: it runs inside fork(),
 * where a child of a multi-threaded process may only do async-signal-safe
 * work, and a child that goes on to exec() should pay nothing. Process-wide
 * state records the generation it was made in and rebuilds itself at its
 * next use in a child (a pid check would do the same with a system call per
 * use, and could be fooled by a grandchild reusing its grandparent's pid).
 * Rebuilds are serialised by one lock that the fork handlers keep consistent
 * (taken before fork, released on both sides), so two threads of a child
 * never rebuild the same engine twice.
 */
#include "common_internal.h"

#include <pthread.h>
#include <stdatomic.h>

static _Atomic unsigned generation;
static pthread_mutex_t rebuild_lock = PTHREAD_MUTEX_INITIALIZER;

static void before_fork(void) { pthread_mutex_lock(&rebuild_lock); }

static void in_parent(void) { pthread_mutex_unlock(&rebuild_lock); }

static void in_child(void) {
    atomic_fetch_add_explicit(&generation, 1, memory_order_relaxed);
    pthread_mutex_unlock(&rebuild_lock);
}

/* At load time, so that no fork can come between the first use of any
 * ckptio state and the handler's registration. */
__attribute__((constructor)) static void watch_forks(void) { pthread_atfork(before_fork, in_parent, in_child); }

unsigned ckptio__fork_generation(void) { return atomic_load_explicit(&generation, memory_order_relaxed); }

void ckptio__fork_rebuild_lock(void) { pthread_mutex_lock(&rebuild_lock); }

void ckptio__fork_rebuild_unlock(void) { pthread_mutex_unlock(&rebuild_lock); }

bool ckptio__forked_since(unsigned made_in) { return ckptio__fork_generation() != made_in; }
