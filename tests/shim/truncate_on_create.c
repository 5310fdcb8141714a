/*
 * truncate_on_create.c - an LD_PRELOAD shim for tests that must change a
 * file at an exact moment of a running `ckptio` command, without a race.
 *
 * When the process creates a file (open/openat with O_CREAT) whose path
 * contains $CKPTIO_TEST_TRUNCATE_ON (e.g. ".ckptio-tmp-", the temporary of
 * an atomic save), the file $CKPTIO_TEST_TRUNCATE_PATH is truncated to
 * $CKPTIO_TEST_TRUNCATE_SIZE bytes, once. tests/python/test_cli_hostile.py
 * uses it to shrink the input of `ckptio convert` after the input was
 * opened and validated and before its tensor bytes are copied.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static atomic_int fired;

static void maybe_truncate(const char *created) {
    const char *marker = getenv("CKPTIO_TEST_TRUNCATE_ON"), *target = getenv("CKPTIO_TEST_TRUNCATE_PATH"),
               *size = getenv("CKPTIO_TEST_TRUNCATE_SIZE");
    if (!marker || !target || !size || !created || !strstr(created, marker)) return;
    if (atomic_exchange(&fired, 1)) return;
    if (truncate(target, (off_t)strtoll(size, NULL, 10)) != 0) _exit(99); /* the test would mean nothing */
}

#define OPEN_WRAPPER(name, ...)                                                                     \
    int name(const char *path, int flags, ...) {                                                     \
        static int (*real)(const char *, int, ...);                                                  \
        if (!real) real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name);                  \
        mode_t mode = 0;                                                                             \
        if (flags & (O_CREAT | __O_TMPFILE)) {                                                       \
            va_list ap;                                                                              \
            va_start(ap, flags);                                                                     \
            mode = (mode_t)va_arg(ap, int);                                                          \
            va_end(ap);                                                                              \
        }                                                                                            \
        const int fd = real(path, flags, mode);                                                      \
        if (fd >= 0 && (flags & O_CREAT)) maybe_truncate(path);                                      \
        return fd;                                                                                   \
    }

OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)

#define OPENAT_WRAPPER(name)                                                                         \
    int name(int dirfd, const char *path, int flags, ...) {                                          \
        static int (*real)(int, const char *, int, ...);                                             \
        if (!real) real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, #name);             \
        mode_t mode = 0;                                                                             \
        if (flags & (O_CREAT | __O_TMPFILE)) {                                                       \
            va_list ap;                                                                              \
            va_start(ap, flags);                                                                     \
            mode = (mode_t)va_arg(ap, int);                                                          \
            va_end(ap);                                                                              \
        }                                                                                            \
        const int fd = real(dirfd, path, flags, mode);                                               \
        if (fd >= 0 && (flags & O_CREAT)) maybe_truncate(path);                                      \
        return fd;                                                                                   \
    }

OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)
