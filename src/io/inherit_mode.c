/*
 * inherit_mode.c - what a file that replaces another by rename takes from
 * it: permission bits and, where permitted, owner and group.
 *
 * An atomic save renames a new inode over NAME, so without this the result
 * gets a new file's mode (0666 & ~umask) and the saver's ids: saving over a
 * 0600 checkpoint would leave it 0644, readable by everyone, while
 * torch.save and safetensors.save_file, which rewrite NAME in place, keep
 * 0600. ckptio_file_commit() calls this on the temporary before its fsync
 * (so the mode is as durable as the data) and before the rename (so NAME
 * is never visible with wider permissions). The DCP directory commit
 * (src/ckpt/dcp_commit.c) takes the attributes of the metadata file it
 * replaces the same way (ckptio__reference_stat, ckptio__inherit_from).
 *
 * Rules: only the 0777 bits are copied (set-id and sticky bits are not: a
 * checkpoint is data); owner and group are copied where the kernel allows
 * (root; or the same owner and a group the saver belongs to), and silently
 * left as they are where it does not (EPERM), as cp -p does. A mode that
 * cannot be set fails the save only if the new file would then be readable
 * or writable by more than the old one was.
 */
#include "io_internal.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

/* fchown errors that mean "not allowed or not supported here", not an I/O
 * failure: EINVAL for ids without a mapping in this user namespace. */
static bool chown_refused(int err) { return err == EPERM || err == EINVAL || err == ENOTSUP || err == EOPNOTSUPP; }

static int fchown_retry(int fd, uid_t uid, gid_t gid) {
    int ret;
    do ret = fchown(fd, uid, gid);
    while (ret < 0 && errno == EINTR);
    return ret;
}

mode_t ckptio__inherited_create_mode(const char *path) {
    struct stat old;
    return stat(path, &old) == 0 && S_ISREG(old.st_mode) ? (old.st_mode & 0777) : 0666;
}

bool ckptio__reference_stat(const char *dir, const char *name, struct stat *out) {
    if (!name) return false;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) return false;
    /* lstat: a symlink under the name is no reference (the commit replaces
     * the name, not what it points at). */
    return lstat(path, out) == 0 && S_ISREG(out->st_mode);
}

ckptio_status ckptio_inherit_mode(int fd, const char *path) {
    CKPTIO_RETURN_IF(fd < 0 || !path, CKPTIO_E_INVAL, "ckptio_inherit_mode: fd and path are required");
    struct stat old;
    /* Through a symlink, as torch.save would write through it: the mode
     * readers of NAME saw. Nothing to inherit from a missing name, or from
     * anything but a regular file. */
    if (stat(path, &old) < 0 || !S_ISREG(old.st_mode)) return CKPTIO_OK;
    return ckptio__inherit_from(fd, &old, path);
}

ckptio_status ckptio__inherit_from(int fd, const struct stat *old, const char *path) {
    struct stat cur;
    if (fstat(fd, &cur) < 0) return CKPTIO_FAIL_SYS(errno, "fstat", path, -1, "examining the file that replaces it");
    if (old->st_uid != cur.st_uid || old->st_gid != cur.st_gid) {
        int err = fchown_retry(fd, old->st_uid, old->st_gid) < 0 ? errno : 0;
        /* Not root: the group alone may still be allowed. */
        if (chown_refused(err) && old->st_gid != cur.st_gid)
            err = fchown_retry(fd, (uid_t)-1, old->st_gid) < 0 ? errno : 0;
        if (err && !chown_refused(err))
            return CKPTIO_FAIL_SYS(err, "fchown", path, -1, "giving the new file the owner of the one it replaces");
    }
    const mode_t want = old->st_mode & 0777;
    int ret;
    do ret = fchmod(fd, want);
    while (ret < 0 && errno == EINTR);
    if (ret < 0) {
        const int err = errno;
        /* Harmless where the new file grants nothing the old one did not
         * (file systems without modes, e.g. some FUSE mounts). */
        if (fstat(fd, &cur) < 0 || (cur.st_mode & 0777 & ~want))
            return CKPTIO_FAIL_SYS(err, "fchmod", path, -1,
                                   "giving the new file the permissions %04o of the one it replaces (it would be "
                                   "readable by more than before)",
                                   (unsigned)want);
    }
    return CKPTIO_OK;
}
