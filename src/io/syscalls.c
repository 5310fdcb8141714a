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

int ckptio__fsync(int fd) {
    for (;;) {
        const int ret = injected(CKPTIO__IO_FSYNC) ? -1 : fsync(fd);
        if (ret == 0 || !again(errno)) return ret;
    }
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
