/*
 * open_regular.c - opening a file a checkpoint names, for reading or for
 * writing in place: only a regular file is ever opened for I/O.
 *
 * Any name in a checkpoint's directory may be something else: a FIFO
 * (open(2) would wait for a writer forever), a device (its driver's open
 * runs: a symlink to /dev/watchdog arms it, /dev/zero never ends), a socket
 * or a directory. The name is first opened with O_PATH, which calls no
 * driver and never waits, and its type is asked of that descriptor; only a
 * regular file is then opened for I/O, through /proc/self/fd (the inode
 * just checked, whatever the name holds by then) or, without /proc, by
 * name with O_NONBLOCK, checked again to be the same inode.
 */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

const char *ckptio__file_type_name(mode_t mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symlink";
    default: return "a file of unknown type";
    }
}

int ckptio__open_path(int dirfd, const char *path, int flags, struct stat *sb) {
    const int fd = ckptio__openat(dirfd, path, O_PATH | O_CLOEXEC | (flags & O_NOFOLLOW), 0);
    if (fd < 0) return -1;
    if (fstat(fd, sb) != 0) {
        const int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

int ckptio__reopen_regular(int path_fd, int dirfd, const char *path, int flags, const struct stat *sb) {
    const int acc = (flags & O_ACCMODE) | O_CLOEXEC | O_NOCTTY;
    /* /proc/self/fd/N opens the very inode `path_fd` holds, checked. */
    char proc[32] = "/proc/self/fd/", digits[16];
    size_t n = 0;
    for (unsigned v = (unsigned)path_fd; n == 0 || v; v /= 10) digits[n++] = (char)('0' + v % 10);
    for (size_t i = 0; i < n; i++) proc[14 + i] = digits[n - 1 - i];
    proc[14 + n] = '\0';
    int fd = ckptio__open(proc, acc, 0);
    if (fd >= 0 || errno != ENOENT) return fd;
    /* No /proc: by name, which may hold something else by now; O_NONBLOCK
     * so that a FIFO swapped in is not waited on, then checked. */
    if ((fd = ckptio__openat(dirfd, path, acc | O_NONBLOCK | (flags & O_NOFOLLOW), 0)) < 0) return -1;
    struct stat now;
    int err = 0;
    if (fstat(fd, &now) != 0) err = errno;
    else if (!S_ISREG(now.st_mode) || now.st_dev != sb->st_dev || now.st_ino != sb->st_ino) err = ESTALE;
    /* The descriptor is handed on as a blocking one (io_uring would answer
     * EAGAIN for a non-blocking one instead of waiting for the disk). */
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) err = errno;
    if (err) {
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

int ckptio__open_regular(int dirfd, const char *path, int flags, struct stat *sb, mode_t *type) {
    *type = 0;
    const int pfd = ckptio__open_path(dirfd, path, flags, sb);
    if (pfd < 0) return -1;
    if (!S_ISREG(sb->st_mode)) {
        close(pfd);
        *type = sb->st_mode & S_IFMT;
        errno = S_ISLNK(sb->st_mode) ? ELOOP : S_ISDIR(sb->st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    const int fd = ckptio__reopen_regular(pfd, dirfd, path, flags, sb);
    const int err = errno;
    close(pfd);
    errno = err;
    return fd;
}

ckptio_status ckptio__open_regular_or_fail(const char *path, int flags, ckptio_status refuse, const char *note,
                                           int *fd, struct stat *sb) {
    struct stat local;
    mode_t type = 0;
    *fd = ckptio__open_regular(AT_FDCWD, path, flags, sb ? sb : &local, &type);
    if (*fd >= 0) return CKPTIO_OK;
    const char *sep = note && *note ? " (" : "", *end = note && *note ? ")" : "";
    if (type)
        return CKPTIO_FAIL_CTX(refuse, &((ckptio__err_ctx){.operation = "open", .path = path, .file_offset = -1}),
                               "is %s, not a regular file: refused without opening it%s%s%s",
                               ckptio__file_type_name(type), sep, note ? note : "", end);
    if (errno == ESTALE)
        return CKPTIO_FAIL_CTX(refuse, &((ckptio__err_ctx){.operation = "open", .path = path, .file_offset = -1}),
                               "the file was replaced while it was being opened%s%s%s", sep, note ? note : "", end);
    return CKPTIO_FAIL_SYS(errno, "open", path, -1, "%s", note && *note ? note : "opening the file");
}
