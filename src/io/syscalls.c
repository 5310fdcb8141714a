/*
 * syscalls.c - the system calls of ckptio's commit protocols (atomic files,
 * the DCP directory commit, temporaries), each one that tests can make fail
 * (io_inject.c) and each retried on EINTR, real or injected, unless the
 * program asked the library to stop (ckptio_interrupt): then the call fails
 * with EINTR, so a signal that means "stop" is never swallowed by a retry.
 *
 * Kept apart from file.c so that every layer that commits files (src/io's
 * atomic file, src/ckpt's DCP directory commit) fails the same calls the
 * same way under test, and so that file.c and temporaries.c both depend on
 * this file instead of on each other.
 */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

/* Whether a call that failed with errno `err` is tried again. */
static bool again(int err) { return err == EINTR && !ckptio__interrupt_requested(); }

/* True (with errno set) where a fault of `kind` is injected for this call. */
static bool injected(ckptio__io_kind kind) {
    int err = 0;
    if (!ckptio__io_fault(kind, &err, NULL)) return false;
    errno = err;
    return true;
}

int ckptio__openat(int dirfd, const char *path, int flags, mode_t mode) {
    for (;;) {
        const int fd = injected(CKPTIO__IO_OPEN) ? -1 : openat(dirfd, path, flags, mode);
        if (fd >= 0 || !again(errno)) return fd;
    }
}

int ckptio__open(const char *path, int flags, mode_t mode) { return ckptio__openat(AT_FDCWD, path, flags, mode); }

/* fsync(fd), or fdatasync(fd) with `data_only`, retried as every call
 * here; `may_fail`: each try is a point where a test's fault may be
 * injected (ckptio__fsync_many checks the faults itself, in order, before
 * its threads run). */
static int fsync_retried(int fd, bool may_fail, bool data_only) {
    for (;;) {
        const int ret = may_fail && injected(CKPTIO__IO_FSYNC) ? -1 : data_only ? fdatasync(fd) : fsync(fd);
        if (ret == 0 || !again(errno)) return ret;
    }
}

int ckptio__fsync(int fd) { return fsync_retried(fd, true, false); }

int ckptio__fdatasync(int fd) { return fsync_retried(fd, true, true); }

typedef struct fsync_job {
    int fd, err;
} fsync_job;

static void *fsync_thread(void *arg) {
    fsync_job *j = arg;
    j->err = fsync_retried(j->fd, false, false) < 0 ? errno : 0;
    return NULL;
}

/* At most this many fsyncs run at once; more wait for a later round. */
#define FSYNC_MANY_MAX 16

int ckptio__fsync_many(const int *fds, size_t n, int *errs) {
    int failed = 0;
    size_t start = 0;
    while (start < n) {
        const size_t round = n - start < FSYNC_MANY_MAX ? n - start : FSYNC_MANY_MAX;
        fsync_job jobs[FSYNC_MANY_MAX];
        pthread_t threads[FSYNC_MANY_MAX];
        bool started[FSYNC_MANY_MAX] = {false};
        /* Faults are decided here, one call after another, so that a test's
         * "the nth fsync fails" names the same file on every run. */
        size_t run = 0;
        for (size_t i = 0; i < round; i++) {
            jobs[i] = (fsync_job){fds[start + i], 0};
            if (injected(CKPTIO__IO_FSYNC)) jobs[i].err = errno ? errno : EIO;
            else run++;
        }
        /* Every fsync but the last to run gets a thread (signals blocked: they
         * belong to the program's threads); where pthread_create fails, it
         * runs here and then. */
        for (size_t i = 0; i < round; i++) {
            if (jobs[i].err) continue;
            if (--run == 0) {
                fsync_thread(&jobs[i]);
                break;
            }
            started[i] = ckptio__thread_start(&threads[i], NULL, fsync_thread, &jobs[i]) == 0;
            if (!started[i]) fsync_thread(&jobs[i]);
        }
        for (size_t i = 0; i < round; i++) {
            if (started[i]) pthread_join(threads[i], NULL);
            errs[start + i] = jobs[i].err;
            failed += jobs[i].err != 0;
        }
        start += round;
    }
    return failed;
}

int ckptio__rename(const char *from, const char *to) {
    return injected(CKPTIO__IO_RENAME) ? -1 : rename(from, to);
}

int ckptio__unlink(const char *path) {
    for (;;) {
        const int ret = injected(CKPTIO__IO_UNLINK) ? -1 : unlink(path);
        if (ret == 0 || !again(errno)) return ret;
    }
}

DIR *ckptio__opendir(const char *path) { return injected(CKPTIO__IO_LISTDIR) ? NULL : opendir(path); }

/* read() or write() of at most len bytes; an injected fault of `kind`
 * fails it or cuts it short. */
static ssize_t transfer(ckptio__io_kind kind, int fd, void *buf, size_t len) {
    for (;;) {
        int err = 0;
        uint64_t n = len;
        ssize_t ret;
        if (ckptio__io_fault(kind, &err, &n)) {
            errno = err;
            ret = -1;
        } else {
            ret = kind == CKPTIO__IO_WRITE ? write(fd, buf, (size_t)n) : read(fd, buf, (size_t)n);
        }
        if (ret >= 0 || !again(errno)) return ret;
    }
}

ssize_t ckptio__write(int fd, const void *buf, size_t len) { return transfer(CKPTIO__IO_WRITE, fd, (void *)buf, len); }

ssize_t ckptio__read(int fd, void *buf, size_t len) { return transfer(CKPTIO__IO_READ, fd, buf, len); }
