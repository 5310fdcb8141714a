/*
 * file_attributes.c - the mode and owner an atomic save gives its file.
 *
 * torch.save and safetensors rewrite an existing file in place, so a
 * checkpoint the user made 0600 stays 0600 (and keeps its owner when root
 * saves over it). An atomic save writes a new inode instead; to behave the
 * same, its temporary takes the permission bits of the regular file it will
 * replace, at creation (open's mode argument, so the bytes are never
 * readable with wider permissions; the umask may only narrow it), then that
 * file's owner and group where permitted and its exact permission bits.
 * Set-id and sticky bits are not copied. A new name gets 0666 & ~umask, as
 * any new file. The DCP writer uses the same rule for data files whose
 * names are new by creating their final name first with the checkpoint's
 * attributes (python/ckptio/dcp/_commit.py create_placeholder).
 */
#include "io_internal.h"

#include <sys/stat.h>
#include <unistd.h>

const struct stat *ckptio__replaced_attributes(const char *path, struct stat *buf) {
    /* lstat: a symlink under the name is what the rename replaces, and
     * its target's attributes are not the checkpoint's. */
    return lstat(path, buf) == 0 && S_ISREG(buf->st_mode) ? buf : NULL;
}

mode_t ckptio__create_mode(const struct stat *ref) { return ref ? (ref->st_mode & 0777) : 0666; }

void ckptio__adopt_attributes(int fd, const struct stat *ref) {
    struct stat now;
    if (!ref || fstat(fd, &now) < 0) return;
    /* Best effort: a file system or user that may not change these keeps
     * the file as created, which is never wider than the reference. */
    if (now.st_uid != ref->st_uid || now.st_gid != ref->st_gid) {
        if (fchown(fd, ref->st_uid, ref->st_gid) < 0) {
            /* Not root: a member of the group may still set the group. */
            (void)!fchown(fd, (uid_t)-1, ref->st_gid);
        }
    }
    /* After fchown, which may clear set-id bits: set the exact bits. */
    if (fstat(fd, &now) == 0 && (now.st_mode & 07777) != (ref->st_mode & 0777)) (void)!fchmod(fd, ref->st_mode & 0777);
}
