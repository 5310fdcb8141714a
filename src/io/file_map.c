/*
 * file_map.c - checkpoint files mapped into memory (ckptio_mapping): zero-copy
 * loads to the CPU, as safetensors' safe_open and torch.load(mmap=True) do.
 *
 * A mapping is private (MAP_PRIVATE) and readable and writable: writes to it
 * copy the page first and never reach the file, as in torch's default. It
 * outlives the handle that made it and holds no descriptor (it finds its
 * file by name, for the checks below).
 *
 * A file replaced by a rename keeps its old inode alive under the mapping,
 * which then still shows the old bytes. A file truncated in place takes its
 * pages away: touching them raises SIGBUS, which kills a process. Every live
 * mapping is registered here so that ckptio's own code can tell: plans that
 * move memory in a mapping check its file first (ckptio__mapped_check), and
 * what ckptio's code copies or hashes itself runs under a SIGBUS guard
 * (mapped_guard.c) that turns a page lost in between into CKPTIO_E_TRUNCATED
 * naming the file. Code outside ckptio that touches such a page still gets
 * the signal (docs/RELIABILITY.md, "Mapped loads").
 *
 * The guard: the kernel's own copies (pread, pwrite, io_uring, O_DIRECT)
 * fail with EFAULT on such a page; what ckptio touches in user space -
 * bounce-buffer copies, the checksums of a save, the gather of a slice -
 * runs with the thread's ranges noted, and a SIGBUS handler that finds the
 * faulting address inside them jumps back to the guard, which returns
 * CKPTIO_E_TRUNCATED naming the file. Any other SIGBUS goes to the handler
 * installed before (or the default action, which ends the process as it
 * would have without ckptio). The handler is installed when the first
 * mapping is made: processes that never map a file are left alone. A SIGBUS
 * handler the application installs later replaces it; guards then catch
 * nothing (docs/RELIABILITY.md, "Mapped loads").
 */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct ckptio_mapping {
    unsigned char *data; /* NULL when the file is empty */
    uint64_t length;     /* the file's size when it was mapped */
    char *where;         /* the file's absolute name when mapped (a later chdir cannot move it) */
    dev_t dev;           /* the inode mapped: a name that still leads to it */
    ino_t ino;           /* gives its size now */
    char *path;
};

/* Live mappings sorted by address. Readers of `count` without the lock only
 * ask whether there are any. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ckptio_mapping **registry;
static size_t registry_cap;
static _Atomic size_t registry_count;

static ckptio_status registry_add(ckptio_mapping *m) {
    pthread_mutex_lock(&registry_lock);
    const size_t n = registry_count;
    if (n == registry_cap) {
        const size_t cap = registry_cap ? registry_cap * 2 : 16;
        ckptio_mapping **grown = ckptio__realloc(registry, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&registry_lock);
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory registering a mapping of %s", m->path);
        }
        registry = grown;
        registry_cap = cap;
    }
    size_t i = n;
    while (i > 0 && registry[i - 1]->data > m->data) {
        registry[i] = registry[i - 1];
        i--;
    }
    registry[i] = m;
    registry_count = n + 1;
    pthread_mutex_unlock(&registry_lock);
    return CKPTIO_OK;
}

static void registry_remove(const ckptio_mapping *m) {
    pthread_mutex_lock(&registry_lock);
    const size_t n = registry_count;
    for (size_t i = 0; i < n; i++)
        if (registry[i] == m) {
            memmove(&registry[i], &registry[i + 1], (n - i - 1) * sizeof *registry);
            registry_count = n - 1;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}

/* The first registered mapping that ends after `addr` (lock held). */
static size_t registry_first_after(uintptr_t addr) {
    size_t lo = 0, hi = registry_count;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)registry[mid]->data + registry[mid]->length <= addr) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The mapped file's size now. No descriptor is kept (a model of a thousand
 * shards maps a thousand files): the name tells while it leads to the mapped
 * inode, which is how a file is truncated in place (open with O_TRUNC,
 * truncate). Renamed over or removed, the inode is out of reach of names and
 * keeps its bytes (a holder of a descriptor of it is not seen). */
static uint64_t size_now(const ckptio_mapping *m) {
    struct stat sb;
    if (stat(m->where, &sb) != 0 || sb.st_dev != m->dev || sb.st_ino != m->ino) return m->length;
    return sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
}

static ckptio_status lost(const ckptio_mapping *m, uint64_t offset, uint64_t size, const char *subject) {
    return CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED,
                           &((ckptio__err_ctx){.path = m->path, .file_offset = (int64_t)offset, .subject = subject}),
                           "memory mapped from this file lost its bytes: the file is %llu bytes now, %llu when it was "
                           "mapped (it was truncated in place after a mapped load; replace checkpoints by renaming "
                           "a new file over them, which leaves mappings of the old one intact)",
                           (unsigned long long)size, (unsigned long long)m->length);
}

ckptio_status ckptio__mapped_check(const void *memory, uint64_t length, const char *subject) {
    if (!length || !atomic_load_explicit(&registry_count, memory_order_relaxed)) return CKPTIO_OK;
    const uintptr_t lo = (uintptr_t)memory, hi = lo + length;
    ckptio_status st = CKPTIO_OK;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = registry_first_after(lo); st == CKPTIO_OK && i < registry_count; i++) {
        const ckptio_mapping *m = registry[i];
        const uintptr_t start = (uintptr_t)m->data;
        if (start >= hi) break;
        /* The file offsets of this memory: [first, end) of the mapping. */
        const uint64_t first = lo > start ? lo - start : 0;
        const uint64_t end = hi - start < m->length ? hi - start : m->length;
        const uint64_t size = size_now(m);
        if (size < end) st = lost(m, size > first ? size : first, size, subject);
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

ckptio_status ckptio__mapped_lost(const void *address, const char *subject) {
    const uintptr_t a = (uintptr_t)address;
    ckptio_status st = CKPTIO_E_TRUNCATED;
    pthread_mutex_lock(&registry_lock);
    const size_t i = registry_first_after(a);
    if (i < registry_count && (uintptr_t)registry[i]->data <= a) {
        const ckptio_mapping *m = registry[i];
        st = lost(m, a - (uintptr_t)m->data, size_now(m), subject);
    } else {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED, &((ckptio__err_ctx){.file_offset = -1, .subject = subject}),
                             "memory at %p lost its bytes: it maps a file that was truncated after it was mapped",
                             address);
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

/* ---- the SIGBUS guard ---------------------------------------------------------------- */

typedef struct guard {
    sigjmp_buf env;
    uintptr_t lo[2], hi[2];   /* the ranges this guard covers */
    volatile uintptr_t fault; /* where the SIGBUS hit */
    int slot;                 /* in `active`, or -1: unguarded */
} guard;

/* The guards threads are inside, found by thread in the handler. Not thread
 * locals: the library's TLS is dynamic (it lives in a module loaded with
 * dlopen), and reaching it may allocate, which a signal handler must not.
 * A thread past the table's size runs unguarded. */
#define GUARD_SLOTS 256
static struct {
    _Atomic(pthread_t) owner; /* 0: free */
    _Atomic(guard *) g;
} active[GUARD_SLOTS];

static struct sigaction previous;
static _Atomic int installed;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_errno;

static bool covers(const guard *g, uintptr_t a) {
    return (a >= g->lo[0] && a < g->hi[0]) || (a >= g->lo[1] && a < g->hi[1]);
}

/* The guard of the calling thread, or NULL (async-signal-safe). */
static guard *my_guard(void) {
    const pthread_t self = pthread_self();
    for (int i = 0; i < GUARD_SLOTS; i++)
        if (pthread_equal(atomic_load(&active[i].owner), self)) return atomic_load(&active[i].g);
    return NULL;
}

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    guard *g = my_guard();
    const uintptr_t a = (uintptr_t)info->si_addr;
    if (g && info->si_code > 0 && covers(g, a)) {
        g->fault = a;
        siglongjmp(g->env, 1);
    }
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, context);
        return;
    }
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    /* The default action: a fault raises the signal again when the access is
     * retried on return; a signal sent by someone is raised again here. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
    if (info->si_code <= 0) raise(SIGBUS);
}

static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    /* NODEFER: a guard left by siglongjmp must not leave SIGBUS blocked. */
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &previous) != 0) install_errno = errno;
    else atomic_store(&installed, 1);
}

ckptio_status ckptio__mapped_guard_install(void) {
    pthread_once(&install_once, install);
    if (!atomic_load(&installed))
        return CKPTIO_FAIL_SYS(install_errno, "sigaction", NULL, -1, "installing the SIGBUS guard of mapped files");
    return CKPTIO_OK;
}

/* Everything a guard holds is set before sigsetjmp; only the handler
 * writes to it afterwards (fault, volatile). */
static void prepare(guard *g, const void *a, uint64_t alen, const void *b, uint64_t blen) {
    g->lo[0] = (uintptr_t)a;
    g->hi[0] = (uintptr_t)a + alen;
    g->lo[1] = (uintptr_t)b;
    g->hi[1] = (uintptr_t)b + blen;
    g->fault = 0;
    g->slot = -1;
    const pthread_t self = pthread_self();
    for (int i = 0; i < GUARD_SLOTS; i++) {
        pthread_t free_owner = (pthread_t)0;
        if (atomic_load_explicit(&active[i].owner, memory_order_relaxed) == (pthread_t)0 &&
            atomic_compare_exchange_strong(&active[i].owner, &free_owner, self)) {
            g->slot = i;
            return;
        }
    }
}

static void enter(guard *g) {
    if (g->slot >= 0) atomic_store(&active[g->slot].g, g);
}

static void leave(guard *g) {
    if (g->slot < 0) return;
    atomic_store(&active[g->slot].g, NULL);
    atomic_store(&active[g->slot].owner, (pthread_t)0);
}

ckptio_status ckptio__guarded_copy(void *dst, const void *src, size_t n, const char *subject) {
    if (!n) return CKPTIO_OK;
    if (!atomic_load_explicit(&installed, memory_order_relaxed)) {
        memcpy(dst, src, n);
        return CKPTIO_OK;
    }
    guard g;
    prepare(&g, src, n, dst, n);
    if (sigsetjmp(g.env, 0)) {
        leave(&g);
        return ckptio__mapped_lost((const void *)g.fault, subject);
    }
    enter(&g);
    memcpy(dst, src, n);
    leave(&g);
    return CKPTIO_OK;
}

ckptio_status ckptio__guarded_call(void (*fn)(void *arg), void *arg, const void *memory, uint64_t length,
                                   const char *subject) {
    if (!atomic_load_explicit(&installed, memory_order_relaxed)) {
        fn(arg);
        return CKPTIO_OK;
    }
    guard g;
    prepare(&g, memory, length, NULL, 0);
    if (sigsetjmp(g.env, 0)) {
        leave(&g);
        return ckptio__mapped_lost((const void *)g.fault, subject);
    }
    enter(&g);
    fn(arg);
    leave(&g);
    return CKPTIO_OK;
}

/* ---- mapping ------------------------------------------------------------------------ */

ckptio_status ckptio__file_map(ckptio_file *f, uint64_t expect_size, ckptio_mapping **out) {
    *out = NULL;
    if (f->object)
        return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = f->path, .file_offset = -1}),
                               "an s3:// object cannot be mapped into memory; load it without mmap");
    /* A file a model released (its window of descriptors) opens again, the same inode or an error. */
    CKPTIO_FORWARD(ckptio__file_acquire(f));
    ckptio_mapping *m = ckptio__calloc(1, sizeof *m);
    char *abs = realpath(f->path, NULL); /* libc's malloc */
    if (!m || !(m->path = ckptio__strdup(f->path)) || !(m->where = ckptio__strdup(abs ? abs : f->path))) {
        free(abs);
        if (m) ckptio__free(m->path);
        ckptio__free(m);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory mapping %s", f->path);
    }
    free(abs);
    ckptio_status st = CKPTIO_OK;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        st = CKPTIO_FAIL_SYS(errno, "fstat", f->path, -1, "reading the size to map");
        goto fail;
    }
    /* The bytes mapped must be the bytes validated at open. */
    if ((uint64_t)sb.st_size != expect_size) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_STALE, &((ckptio__err_ctx){.path = f->path, .file_offset = -1}),
                             "the file is %llu bytes now but was %llu when it was opened: it changed in place; "
                             "open it again",
                             (unsigned long long)sb.st_size, (unsigned long long)expect_size);
        goto fail;
    }
    m->dev = sb.st_dev;
    m->ino = sb.st_ino;
    m->length = expect_size;
    if (m->length) {
        if (m->length > SIZE_MAX) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.path = f->path, .file_offset = -1}),
                                 "%llu bytes do not fit the address space", (unsigned long long)m->length);
            goto fail;
        }
        void *p = mmap(NULL, (size_t)m->length, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd, 0);
        if (p == MAP_FAILED) {
            st = CKPTIO_FAIL_SYS(errno, "mmap", f->path, -1, "mapping %llu bytes", (unsigned long long)m->length);
            goto fail;
        }
        m->data = p;
        if ((st = ckptio__mapped_guard_install()) != CKPTIO_OK || (st = registry_add(m)) != CKPTIO_OK) goto fail;
    }
    *out = m;
    return CKPTIO_OK;
fail:
    if (m->data) munmap(m->data, (size_t)m->length);
    ckptio__free(m->path);
    ckptio__free(m->where);
    ckptio__free(m);
    return st;
}

ckptio_status ckptio_mapping_data(const ckptio_mapping *m, void **data, uint64_t *length) {
    CKPTIO_RETURN_IF(!m || !data || !length, CKPTIO_E_INVAL, "ckptio_mapping_data: NULL argument");
    *data = m->data;
    *length = m->length;
    return CKPTIO_OK;
}

const char *ckptio_mapping_path(const ckptio_mapping *m) { return m ? m->path : NULL; }

ckptio_status ckptio_mapping_check(const void *memory, uint64_t length) {
    return ckptio__mapped_check(memory, length, NULL);
}

ckptio_status ckptio_mapping_copy(void *dst, const void *src, size_t n) {
    CKPTIO_RETURN_IF((!dst || !src) && n, CKPTIO_E_INVAL, "ckptio_mapping_copy: NULL buffer of %zu bytes", n);
    return ckptio__guarded_copy(dst, src, n, NULL);
}

ckptio_status ckptio_mapping_release(ckptio_mapping *m) {
    if (!m) return CKPTIO_OK;
    if (m->data) {
        registry_remove(m);
        munmap(m->data, (size_t)m->length);
    }
    ckptio__free(m->path);
    ckptio__free(m->where);
    ckptio__free(m);
    return CKPTIO_OK;
}
