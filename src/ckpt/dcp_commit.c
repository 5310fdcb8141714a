/*
 * dcp_commit.c - the small files of a DCP directory commit (the manifest,
 * .metadata) and the attributes every new file of a save takes.
 *
 * A file is written through a temporary named and locked as every atomic
 * save of this library names and locks its own (temporaries.c), so
 * `ckptio clean` and the next save recognise a crashed save's leftovers and
 * never remove one a live save holds: write, fsync, rename over NAME,
 * fsync the directory. A failure before the rename leaves NAME as it was
 * and removes the temporary; a failed directory fsync after it says that
 * the new NAME is in place but may not survive a power loss.
 *
 * Attributes: a save into an existing checkpoint keeps the checkpoint's
 * permission bits, owner and group (where permitted), as torch.save and
 * safetensors keep a file's by rewriting it in place. The reference is the
 * metadata file the save replaces (lstat: a symlink is no reference), and
 * every file is created with its mode (the umask may only narrow it), so
 * no byte of the checkpoint is ever readable with wider permissions
 * (inherit_mode.c sets the exact bits and the ids).
 *
 * Errors read "PATH: OPERATION: strerror (what was being done; what it
 * leaves behind)", the words ckptio.dcp has always used.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ckptio_status ckptio_dcp_reference(const char *dir, const char *name, unsigned *mode) {
    CKPTIO_RETURN_IF(!dir || !name || !mode, CKPTIO_E_INVAL, "ckptio_dcp_reference: dir, name and mode are required");
    struct stat st;
    *mode = 0666;
    if (ckptio__s3_is_url(dir)) /* objects carry no permission bits: the bucket's policy decides */
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND,
                               &((ckptio__err_ctx){.path = dir, .file_offset = -1, .subject = name}),
                               "objects have no file attributes to take");
    if (!ckptio__reference_stat(dir, name, &st))
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND,
                               &((ckptio__err_ctx){.path = dir, .file_offset = -1, .subject = name}),
                               "no regular file to take attributes from (new files get 0666 & ~umask)");
    *mode = st.st_mode & 0777;
    return CKPTIO_OK;
}

/* fsync of a directory: makes the renames and unlinks in it durable.
 * Returns 0 or the errno of the open or the fsync. */
int ckptio__dcp_fsync_dir(const char *dir) {
    const int fd = ckptio__open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return errno;
    const int err = ckptio__fsync(fd) < 0 ? errno : 0;
    close(fd);
    return err;
}

/* Writes all of data to fd; a short write goes on where it stopped. */
static ckptio_status write_all(int fd, const char *tmp, const char *final, const void *data, size_t len) {
    size_t done = 0;
    while (done < len) {
        const ssize_t n = ckptio__write(fd, (const char *)data + done, len - done);
        if (n < 0)
            return CKPTIO_FAIL_SYS_NOTE(errno, "write", tmp, "at offset %zu of %zu bytes of %s; %s is unchanged", done,
                                        len, final, final);
        if (n == 0) /* a regular file never does this; do not spin on it */
            return CKPTIO_FAIL_SYS_NOTE(EIO, "write", tmp, "0 bytes written at offset %zu of %s; %s is unchanged",
                                        done, final, final);
        done += (size_t)n;
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_stage(const char *dir, const char *name, const void *data, size_t len,
                               const char *reference, ckptio__dcp_staged *s) {
    *s = (ckptio__dcp_staged){.fd = -1};
    CKPTIO_RETURN_IF(!dir || !*dir || !name || !*name || strchr(name, '/') || (!data && len), CKPTIO_E_INVAL,
                     "ckptio__dcp_stage: dir, a file name without '/' and the data are required");
    if (!(s->final = ckptio__dcp_join(dir, name))) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = ckptio_temporary_create(dir, name, reference, &s->fd, s->tmp, sizeof s->tmp);
    if (st == CKPTIO_OK) st = write_all(s->fd, s->tmp, s->final, data, len);
    if (st != CKPTIO_OK) ckptio__dcp_staged_drop(s);
    return st;
}

ckptio_status ckptio__dcp_staged_sync(ckptio__dcp_staged *const *files, size_t n) {
    int fds[8], errs[8];
    CKPTIO_RETURN_IF(n > 8, CKPTIO_E_INVAL, "ckptio__dcp_staged_sync: at most 8 files, not %zu", n);
    for (size_t i = 0; i < n; i++) fds[i] = files[i]->fd;
    if (ckptio__fsync_many(fds, n, errs) == 0) return CKPTIO_OK;
    for (size_t i = 0;; i++)
        if (errs[i])
            return CKPTIO_FAIL_SYS_NOTE(errs[i], "fsync", files[i]->tmp,
                                        "flushing %s before its rename; %s is unchanged", files[i]->final,
                                        files[i]->final);
}

ckptio_status ckptio__dcp_staged_publish(ckptio__dcp_staged *s) {
    close(s->fd);
    s->fd = -1;
    if (ckptio__rename(s->tmp, s->final) == 0) {
        s->tmp[0] = '\0'; /* renamed: nothing left to remove */
        ckptio__dcp_staged_drop(s);
        return CKPTIO_OK;
    }
    const ckptio_status st = CKPTIO_FAIL_SYS_NOTE(errno, "rename", s->final, "replacing it with %s; %s is unchanged",
                                                  strrchr(s->tmp, '/') + 1, s->final);
    ckptio__dcp_staged_drop(s);
    return st;
}

void ckptio__dcp_staged_drop(ckptio__dcp_staged *s) {
    if (s->fd >= 0) close(s->fd);
    /* The first error matters; a temporary left behind is recognisable and
     * removed later. */
    if (s->tmp[0]) unlink(s->tmp);
    ckptio__free(s->final);
    *s = (ckptio__dcp_staged){.fd = -1};
}

ckptio_status ckptio__dcp_fsync_dir_after(const char *dir, const char *name) {
    const int err = ckptio__dcp_fsync_dir(dir);
    if (!err) return CKPTIO_OK;
    return CKPTIO_FAIL_SYS_NOTE(err, "fsync", dir,
                                "flushing the directory after replacing %s: the new %s is in place but may not "
                                "survive a power loss",
                                name, name);
}

ckptio_status ckptio__dcp_write_file(const char *dir, const char *name, const void *data, size_t len,
                                    const char *reference, unsigned flags) {
    CKPTIO_RETURN_IF(!dir || !*dir || !name || !*name || strchr(name, '/') || (!data && len), CKPTIO_E_INVAL,
                     "ckptio__dcp_write_file: dir, a file name without '/' and the data are required");
    const unsigned known = CKPTIO_DCP_SYNC | CKPTIO__DCP_NO_DIR_SYNC;
    CKPTIO_RETURN_IF(flags & ~known, CKPTIO_E_INVAL, "ckptio__dcp_write_file: unknown flags 0x%x", flags & ~known);
    const bool sync = flags & CKPTIO_DCP_SYNC;
    if (ckptio__s3_is_url(dir)) { /* one PUT replaces the object whole: no temporary, no rename */
        char *final = ckptio__dcp_join(dir, name);
        if (!final) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        ckptio_engine *engine = NULL;
        ckptio_status st = ckptio_engine_create(&engine);
        if (st == CKPTIO_OK) st = ckptio__object_write_all(engine, final, data, len, false);
        ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
        ckptio_engine_destroy(engine);
        if (saved) ckptio__error_restore(saved);
        ckptio__free(final);
        return st;
    }
    ckptio__dcp_staged s;
    ckptio__dcp_staged *one = &s;
    CKPTIO_FORWARD(ckptio__dcp_stage(dir, name, data, len, reference, &s));
    ckptio_status st = sync ? ckptio__dcp_staged_sync(&one, 1) : CKPTIO_OK;
    if (st != CKPTIO_OK) {
        ckptio__dcp_staged_drop(&s);
        return st;
    }
    CKPTIO_FORWARD(ckptio__dcp_staged_publish(&s));
    if (sync && !(flags & CKPTIO__DCP_NO_DIR_SYNC)) return ckptio__dcp_fsync_dir_after(dir, name);
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_create_file(const char *dir, const char *name, const char *reference) {
    CKPTIO_RETURN_IF(!dir || !*dir || !name || !*name || strchr(name, '/'), CKPTIO_E_INVAL,
                     "ckptio_dcp_create_file: dir and a file name without '/' are required");
    if (ckptio__s3_is_url(dir)) return CKPTIO_OK; /* no attributes to keep on an object */
    struct stat ref;
    if (!ckptio__reference_stat(dir, reference, &ref)) return CKPTIO_OK; /* a new checkpoint: nothing to keep */
    char *path = ckptio__dcp_join(dir, name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    const int fd = ckptio__open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, ref.st_mode & 0777);
    if (fd < 0) {
        st = CKPTIO_FAIL_SYS_NOTE(errno, "open", path,
                                  "creating the data file with the checkpoint's mode; the checkpoint is unchanged");
    } else {
        st = ckptio__inherit_from(fd, &ref, path);
        close(fd);
        if (st != CKPTIO_OK) unlink(path); /* new and empty: nothing references it */
    }
    ckptio__free(path);
    return st;
}
