/*
 * kernel_files.c - reads the kernel's small status files (/proc/meminfo,
 * /proc/buddyinfo, THP's `enabled`, io_uring's sysctl) for the policies
 * that look at them.
 *
 * read(2) rather than stdio: no allocation and no locale, so a policy can
 * ask on any thread, and one helper so that every such file is read whole
 * (a /proc file may come in several reads) and retried on EINTR the same way.
 */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

ssize_t ckptio__read_kernel_file(const char *path, char *buf, size_t cap) {
    if (cap == 0) return -1;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got < cap - 1) {
        const ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            close(fd);
            return -1;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (ssize_t)got;
}
