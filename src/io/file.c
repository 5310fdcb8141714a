/*
 * file.c - ckptio_file: open, atomic commit, close, and the blocking
 * ckptio__file_io() used outside the engine's worker pool.
 *
 * Atomic write protocol (CKPTIO_OPEN_WRITE without IN_PLACE):
 *   1. create ".STEM.ckptio-tmp-00000S" (the first free slot S) in NAME's
 *      directory with O_CREAT|O_EXCL|O_NOFOLLOW (never follows or reuses
 *      anything) and flock it, so cleaners (temporaries.c) know a live
 *      writer has it; a killed save's temporary in a slot is removed first
 *      (STEM is NAME, or a bounded stand-in for long names:
 *      ckptio__temporary_stem);
 *   2. the engine writes the data there;
 *   3. commit: mode and owner of the NAME being replaced (inherit_mode.c)
 *      -> fsync(temp) -> rename(temp, NAME) -> fsync(directory).
 * A crash before 3's rename leaves NAME as it was (plus a temporary);
 * after the directory fsync the new NAME is durable. Close without commit
 * unlinks the temporary. See docs/ENGINE.md.
 */
#include "io_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

ckptio_status ckptio__file_set_mode_source(ckptio_file *f, const char *path) {
    char *copy = ckptio__strdup(path);
    if (!copy) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory", f->path);
    ckptio__free(f->mode_from);
    f->mode_from = copy;
    return CKPTIO_OK;
}

const char *ckptio__file_tmp_note(const ckptio_file *file, char *buf, size_t cap) {
    if (!file->tmp_path || cap == 0) return "";
    const char *base = strrchr(file->tmp_path, '/');
    snprintf(buf, cap, " (temporary %s)", base ? base + 1 : file->tmp_path);
    return buf;
}

/* "dir/name" -> "dir" ("/" for "/name", "." for "name"). */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return ckptio__strdup(".");
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = ckptio__malloc(n + 1);
    if (!dir) return NULL;
    memcpy(dir, path, n);
    dir[n] = '\0';
    return dir;
}

static ckptio_status create_temporary(ckptio_file *f) {
    const char *slash = strrchr(f->path, '/');
    const char *base = slash ? slash + 1 : f->path;
    if (!*base)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                               &((ckptio__err_ctx){.operation = "open", .path = f->path, .file_offset = -1}),
                               "the path names a directory, not a file");
    const size_t base_len = strlen(base);
    if (base_len > CKPTIO__NAME_MAX)
        return CKPTIO_FAIL_SYS(ENAMETOOLONG, "create", f->path, -1,
                               "the file name is %zu bytes long, names may have at most %d bytes", base_len,
                               CKPTIO__NAME_MAX);
    /* Created with the permission bits of the file it replaces (the umask
     * may only narrow them), so a 0600 checkpoint's bytes are never readable
     * wider while they are written; the commit sets owner and exact bits
     * (inherit_mode.c). */
    const mode_t create_mode = ckptio__inherited_create_mode(f->mode_from ? f->mode_from : f->path);
    /* In the first free slot of NAME's temporaries: a crashed save's leftover there (unlocked) takes space
     * this save may need, and is removed first, with any other stale temporary of NAME. */
    const int err = ckptio__temporary_create_for_save(f->dir_path, base, create_mode, &f->fd, &f->tmp_path);
    if (err == 0) return CKPTIO_OK;
    ckptio_status st;
    if (!f->tmp_path)
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for the temporary name", f->path);
    else if (err == EEXIST)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS,
                             &((ckptio__err_ctx){.operation = "create", .path = f->path, .file_offset = -1}),
                             "no free temporary name after %d attempts", CKPTIO__TMP_TRIES);
    else if (err == ENAMETOOLONG) /* a file system with names shorter than 255 bytes */
        st = CKPTIO_FAIL_SYS(err, "create", f->path, -1,
                             "the temporary %s (%zu bytes) is too long for this file system's names (at most %ld "
                             "bytes)",
                             f->tmp_path, strlen(strrchr(f->tmp_path, '/') + 1), pathconf(f->dir_path, _PC_NAME_MAX));
    else
        st = CKPTIO_FAIL_SYS(err, "create", f->path, -1, "creating the temporary %s", f->tmp_path);
    ckptio__free(f->tmp_path);
    f->tmp_path = NULL;
    return st;
}

static ckptio_status open_in_place(ckptio_file *f, mode_t create_mode) {
    const bool exclusive = f->flags & CKPTIO_OPEN_EXCLUSIVE;
    /* Try to create first so that commit knows whether the directory
     * entry is new (and must be made durable with a directory fsync). The
     * kernel applies the umask to create_mode. */
    f->fd = ckptio__open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, create_mode);
    if (f->fd >= 0) {
        f->created = true;
        return CKPTIO_OK;
    }
    if (errno == EEXIST && exclusive)
        return CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS,
                               &((ckptio__err_ctx){.operation = "open", .path = f->path, .file_offset = -1}),
                               "the file already exists and CKPTIO_OPEN_EXCLUSIVE was given");
    if (errno != EEXIST) return CKPTIO_FAIL_SYS(errno, "open", f->path, -1, "creating the file for writing");
    return ckptio__open_regular_or_fail(f->path, O_RDWR, CKPTIO_E_INVAL, "opening for writing in place", &f->fd, NULL);
}

ckptio_status ckptio_file_open(ckptio_engine *engine, const char *path, unsigned flags, ckptio_file **out) {
    return ckptio__file_open_created(engine, path, flags, 0666, out);
}

const char *ckptio_file_version(const ckptio_file *file) {
    return file && file->object ? ckptio__object_version(file) : "";
}

ckptio_status ckptio_file_open_window(ckptio_engine *engine, const char *path, void *buf, uint64_t len, uint64_t *got,
                                     ckptio_file **out) {
    CKPTIO_RETURN_IF(!got || (!buf && len) || !out, CKPTIO_E_INVAL,
                     "ckptio_file_open_window: got, out and a buffer of len bytes are required");
    *got = 0;
    *out = NULL;
    ckptio_status st;
    /* An object's first GET stands for its HEAD: one round trip instead of two. */
    if (len && engine && path && ckptio__s3_is_url(path))
        st = ckptio__object_open_prefix(engine, path, buf, len, got, out);
    else
        st = ckptio_file_open(engine, path, CKPTIO_OPEN_READ, out);
    if (st != CKPTIO_OK) return st;
    uint64_t size = 0;
    /* What the open did not bring is read (all of it where the open sent a HEAD). */
    if ((st = ckptio_file_size(*out, &size)) == CKPTIO_OK && *got < (size < len ? size : len))
        st = ckptio__file_io(*out, CKPTIO_READ, (char *)buf + *got, (size < len ? size : len) - *got, *got);
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio_file_close(*out);
        ckptio__error_restore(saved);
        *out = NULL;
        return st;
    }
    *got = size < len ? size : len;
    return CKPTIO_OK;
}

ckptio_status ckptio__file_open_created(ckptio_engine *engine, const char *path, unsigned flags, mode_t create_mode,
                                        ckptio_file **out) {
    const unsigned known = CKPTIO_OPEN_READ | CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE | CKPTIO_OPEN_EXCLUSIVE;
    CKPTIO_RETURN_IF(!engine || !path || !out, CKPTIO_E_INVAL, "ckptio_file_open: engine, path and out are required");
    *out = NULL;
    CKPTIO_RETURN_IF(!*path, CKPTIO_E_INVAL, "ckptio_file_open: empty path");
    CKPTIO_RETURN_IF(flags & ~known, CKPTIO_E_INVAL, "%s: unknown open flags 0x%x", path, flags & ~known);
    CKPTIO_RETURN_IF(!(flags & (CKPTIO_OPEN_READ | CKPTIO_OPEN_WRITE)), CKPTIO_E_INVAL,
                     "%s: open flags need CKPTIO_OPEN_READ or CKPTIO_OPEN_WRITE", path);
    CKPTIO_RETURN_IF((flags & (CKPTIO_OPEN_IN_PLACE | CKPTIO_OPEN_EXCLUSIVE)) && !(flags & CKPTIO_OPEN_WRITE),
                     CKPTIO_E_INVAL, "%s: CKPTIO_OPEN_IN_PLACE and CKPTIO_OPEN_EXCLUSIVE need CKPTIO_OPEN_WRITE", path);
    if (ckptio__s3_is_url(path)) return ckptio__object_open(engine, path, flags, out); /* object_file.c */

    ckptio_status st = CKPTIO_OK;
    ckptio_file *f = ckptio__calloc(1, sizeof *f);
    if (!f) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory opening the file", path);
    f->engine = engine;
    f->flags = flags;
    f->fd = -1;
    f->direct_fd = -1;
    f->writable = flags & CKPTIO_OPEN_WRITE;
    atomic_init(&f->direct_state, 0);
    atomic_init(&f->read_cache, 0);
    atomic_init(&f->write_cache, 0);
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->write_turn, NULL);
    f->path = ckptio__strdup(path);
    f->dir_path = dir_of(path);
    if (!f->path || !f->dir_path) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory opening the file", path);
        goto out;
    }

    if (!f->writable) {
        struct stat sb;
        st = ckptio__open_regular_or_fail(path, O_RDONLY, CKPTIO_E_INVAL, "opening for reading", &f->fd, &sb);
        if (st == CKPTIO_OK) {
            f->dev = sb.st_dev;
            f->ino = sb.st_ino;
            f->opened_size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
        }
    } else if (flags & CKPTIO_OPEN_IN_PLACE) {
        st = open_in_place(f, create_mode);
    } else {
        struct stat sb;
        /* Early, friendly refusal; commit re-checks atomically. lstat: a
         * dangling symlink under NAME counts as existing too. */
        if ((flags & CKPTIO_OPEN_EXCLUSIVE) && lstat(path, &sb) == 0) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS,
                                 &((ckptio__err_ctx){.operation = "open", .path = path, .file_offset = -1}),
                                 "the file already exists and CKPTIO_OPEN_EXCLUSIVE was given");
            goto out;
        }
        st = create_temporary(f);
    }
    if (st != CKPTIO_OK) goto out;
    /* In mode ON a refusal of O_DIRECT is reported here; otherwise the
     * descriptor opens when a transfer first wants it. */
    if (ckptio__io_engine_setting(engine, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_ON) st = ckptio__file_prepare_direct(f);
    if (st != CKPTIO_OK) goto out;
    ckptio__io_engine_file_ref(engine, +1);
    *out = f;
    return CKPTIO_OK;
out:
    /* The temporary goes while its descriptors still hold its lock: once they are closed, a cleaner may
     * remove it and another save of the name take its slot, which an unlink after the close would remove. */
    if (f->tmp_path) unlink(f->tmp_path);
    if (f->direct_fd >= 0) close(f->direct_fd);
    if (f->fd >= 0) close(f->fd);
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->write_turn);
    ckptio__free(f->tmp_path);
    ckptio__free(f->dir_path);
    ckptio__free(f->path);
    ckptio__free(f);
    return st;
}

void ckptio__file_release(ckptio_file *f) {
    if (!f || f->writable || f->object || f->fd < 0) return;
    if (f->direct_fd >= 0) close(f->direct_fd);
    close(f->fd);
    f->fd = f->direct_fd = -1;
    atomic_store(&f->direct_state, 0);
}

bool ckptio__file_is_open(const ckptio_file *f) { return f->object || f->fd >= 0; }

/* Files a reader keeps open at once when it has more than this many. */
#define FILE_WINDOW_MAX 256

size_t ckptio__file_window(size_t nfiles) {
    size_t w = FILE_WINDOW_MAX;
    struct rlimit rl;
    /* Up to two descriptors a file, and the process needs most of its limit
     * for everything else it has open. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur / 16 < w)
        w = rl.rlim_cur / 16 < 4 ? 4 : (size_t)(rl.rlim_cur / 16);
    return nfiles > w ? w : 0;
}

ckptio_status ckptio__file_acquire(ckptio_file *f) {
    if (f->object || f->fd >= 0) return CKPTIO_OK; /* an object has no descriptor to release */
    struct stat sb;
    CKPTIO_FORWARD(ckptio__open_regular_or_fail(f->path, O_RDONLY, CKPTIO_E_INVAL, "opening for reading again", &f->fd,
                                                &sb));
    if (sb.st_dev == f->dev && sb.st_ino == f->ino) return CKPTIO_OK;
    close(f->fd);
    f->fd = -1;
    return CKPTIO_FAIL_CTX(CKPTIO_E_DISALLOWED,
                           &((ckptio__err_ctx){.operation = "open", .path = f->path, .file_offset = -1}),
                           "opening for reading again: the file was replaced since it was opened and checked");
}

ckptio_status ckptio__file_prepare_direct(ckptio_file *f) {
    if (f->object) return CKPTIO_OK; /* no descriptor: never a local path */
    const int64_t mode = ckptio__io_engine_setting(f->engine, CKPTIO_OPT_DIRECT);
    if (mode == CKPTIO_DIRECT_OFF) return CKPTIO_OK;
    CKPTIO_FORWARD(ckptio__file_acquire(f));
    if (atomic_load_explicit(&f->direct_state, memory_order_acquire) == 0) {
        pthread_mutex_lock(&f->lock);
        if (atomic_load(&f->direct_state) == 0) {
            int err = 0;
            int dfd = -1;
            if (!ckptio__io_fault(CKPTIO__IO_OPEN_DIRECT, &err, NULL)) {
                /* Reopen the same inode through /proc: the name may have
                 * been replaced since open (and a temporary has no other
                 * stable name). Without /proc, reopen by name and check
                 * that it is still the same file. */
                const int acc = f->writable ? O_RDWR : O_RDONLY;
                char proc[64];
                snprintf(proc, sizeof proc, "/proc/self/fd/%d", f->fd);
                dfd = open(proc, acc | O_DIRECT | O_CLOEXEC);
                if (dfd < 0 && errno == ENOENT) {
                    struct stat a, b;
                    dfd = open(f->tmp_path ? f->tmp_path : f->path, acc | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
                    if (dfd >= 0 && (fstat(dfd, &a) < 0 || fstat(f->fd, &b) < 0 || a.st_ino != b.st_ino ||
                                     a.st_dev != b.st_dev)) {
                        close(dfd);
                        dfd = -1;
                        errno = ESTALE;
                    }
                }
                if (dfd < 0) err = errno;
            }
            if (dfd >= 0) {
                f->direct_fd = dfd;
                atomic_store_explicit(&f->direct_state, 1, memory_order_release);
            } else {
                /* EINVAL is the usual "this file system has no O_DIRECT"
                 * (tmpfs); any other reason also just means buffered I/O. */
                f->direct_errno = err;
                atomic_store_explicit(&f->direct_state, -1, memory_order_release);
            }
        }
        pthread_mutex_unlock(&f->lock);
    }
    if (mode == CKPTIO_DIRECT_ON && atomic_load(&f->direct_state) < 0)
        return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                               &((ckptio__err_ctx){.operation = "open", .path = f->path, .file_offset = -1,
                                                   .sys_errno = f->direct_errno}),
                               "O_DIRECT was refused and CKPTIO_OPT_DIRECT is ON");
    return CKPTIO_OK;
}

int ckptio__file_direct_fd(const ckptio_file *f) {
    if (ckptio__io_engine_setting(f->engine, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_OFF) return -1;
    return atomic_load_explicit(&f->direct_state, memory_order_acquire) == 1 ? f->direct_fd : -1;
}

ckptio_engine *ckptio__file_engine(const ckptio_file *file) { return file ? file->engine : NULL; }

ckptio_status ckptio__file_op_status(const ckptio_file *f, const ckptio__io_op *op, const char *what) {
    if (op->failure) { /* an object's: the request's own message */
        ckptio__error_restore(op->failure);
        ((ckptio__io_op *)op)->failure = NULL;
        return ckptio_last_error()->status;
    }
    char note[300];
    ckptio__file_tmp_note(f, note, sizeof note);
    const char *opname = op->dir == CKPTIO_READ ? "read" : "write";
    const uint64_t at = op->offset + op->done;
    if (op->err)
        return CKPTIO_FAIL_SYS(op->err, opname, f->path, at, "%s%s", what, f->tmp_path ? note : "");
    if (op->eof) {
        struct stat sb;
        long long size = fstat(f->fd, &sb) == 0 ? (long long)sb.st_size : -1;
        return CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED,
                               &((ckptio__err_ctx){.operation = opname, .path = f->path, .file_offset = (int64_t)at}),
                               "%s: unexpected end of file (the file has %lld bytes, %llu more were needed)", what,
                               size, (unsigned long long)(op->need - op->done));
    }
    return CKPTIO_OK;
}

static ckptio_status check_writable(const ckptio_file *f, const char *what, const char *subject) {
    const ckptio__err_ctx ctx = {.operation = what, .path = f->path, .file_offset = -1, .subject = subject};
    if (!f->writable) return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &ctx, "the file was not opened with CKPTIO_OPEN_WRITE");
    if (f->closed_for_write)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &ctx,
                               f->committed ? "the file was already committed" : "a commit of this file failed");
    return CKPTIO_OK;
}

ckptio_status ckptio__file_check_transfer(ckptio_file *f, ckptio_direction dir, const char *subject) {
    if (dir == CKPTIO_WRITE) return check_writable(f, "write", subject);
    if (!(f->flags & CKPTIO_OPEN_READ) && !f->writable)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                               &((ckptio__err_ctx){.operation = "read", .path = f->path, .file_offset = -1,
                                                   .subject = subject}),
                               "the file was not opened for reading");
    return ckptio__file_acquire(f);
}

void ckptio__file_op_init(ckptio__io_op *op, ckptio_file *file, ckptio_direction dir, void *buf, uint64_t len,
                          uint64_t offset) {
    const int dfd = ckptio__file_direct_fd(file);
    bool direct = dfd >= 0 && ckptio__direct_aligned(buf, len, offset);
    /* Warm data is copied from the page cache rather than read from the
     * disk again; cold data goes through it where the read policy says so. */
    if (direct && ckptio__io_engine_setting(file->engine, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_AUTO &&
        (dir == CKPTIO_READ ? ckptio__read_buffered(file, offset, len) : ckptio__write_buffered(file)))
        direct = false;
    *op = (ckptio__io_op){.fd = direct ? dfd : file->fd, .buffered_fd = file->fd, .direct = direct, .dir = dir,
                          .buf = buf, .len = len, .need = len, .offset = offset, .buf_index = -1,
                          .object = file->object, .turn = dir == CKPTIO_WRITE ? ckptio__file_write_turn(file) : NULL};
}

pthread_mutex_t *ckptio__file_write_turn(ckptio_file *file) {
    /* O_DIRECT on tmpfs (Linux 6.6 and later) takes the same inode lock. */
    return ckptio__file_in_memory(file) ? &file->write_turn : NULL;
}

ckptio_status ckptio__file_io(ckptio_file *file, ckptio_direction dir, void *buf, uint64_t len, uint64_t offset) {
    CKPTIO_RETURN_IF(!file || (!buf && len), CKPTIO_E_INVAL, "ckptio__file_io: file and buffer are required");
    CKPTIO_FORWARD(ckptio__file_check_transfer(file, dir, NULL));
    uint64_t end;
    if (ckptio__add_overflows(offset, len, &end) || end > (uint64_t)INT64_MAX)
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.path = file->path, .file_offset = -1}),
                               "range at offset %llu of %llu bytes is beyond the largest file offset",
                               (unsigned long long)offset, (unsigned long long)len);
    if (len == 0) return CKPTIO_OK;
    /* The loops of small reads outside the engine (headers, archives,
     * checksums) stop here once the program asked to (ckptio_interrupt). */
    if (ckptio__interrupt_requested())
        return CKPTIO_FAIL_CTX(CKPTIO_E_CANCELED,
                               &((ckptio__err_ctx){.operation = dir == CKPTIO_READ ? "read" : "write",
                                                   .path = file->path, .file_offset = (int64_t)offset}),
                               "interrupted");
    /* Only a request that O_DIRECT could serve (ckptio__file_op_init) opens its descriptor: a small
     * header read would open and close one for nothing (mode ON opened it with the file). */
    if (ckptio__direct_aligned(buf, len, offset)) CKPTIO_FORWARD(ckptio__file_prepare_direct(file));
    ckptio__io_op op;
    ckptio__file_op_init(&op, file, dir, buf, len, offset);
    const double t0 = ckptio__now();
    ckptio__io_sync(&op);
    ckptio_stats delta = {0};
    ckptio__io_op_count(&op, len, &delta); /* counts bytes only when all moved */
    delta.seconds_io = ckptio__now() - t0;
    ckptio__io_engine_stats_add(file->engine, &delta);
    return ckptio__file_op_status(file, &op, dir == CKPTIO_READ ? "reading" : "writing");
}

/* rename(tmp, path) that refuses to replace an existing path. */
static int rename_noreplace(const char *tmp, const char *path) {
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) return -1;
    /* File systems without RENAME_NOREPLACE: link() fails with EEXIST
     * just as atomically. */
    if (link(tmp, path) == 0) {
        unlink(tmp);
        return 0;
    }
    if (errno != EPERM && errno != ENOTSUP && errno != ENOSYS) return -1;
    /* No hard links either (e.g. some FUSE/network file systems): check,
     * then rename. Only here is there a window for a racing creator. */
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(tmp, path);
}

/* Renames the finished temporary over the final name (not replacing one
 * with CKPTIO_OPEN_EXCLUSIVE); from then on close keeps the data. */
static ckptio_status rename_into_place(ckptio_file *f) {
    int err = 0;
    int ret;
    if (ckptio__io_fault(CKPTIO__IO_RENAME, &err, NULL)) {
        errno = err;
        ret = -1;
    } else {
        ret = (f->flags & CKPTIO_OPEN_EXCLUSIVE) ? rename_noreplace(f->tmp_path, f->path)
                                                 : rename(f->tmp_path, f->path);
    }
    if (ret < 0) {
        err = errno;
        char note[300];
        if (err == EEXIST)
            return CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS,
                                   &((ckptio__err_ctx){.operation = "rename", .path = f->path, .file_offset = -1}),
                                   "the file appeared while it was being written and CKPTIO_OPEN_EXCLUSIVE was given%s",
                                   ckptio__file_tmp_note(f, note, sizeof note));
        return CKPTIO_FAIL_SYS(err, "rename", f->path, -1, "renaming the finished temporary over it%s",
                               ckptio__file_tmp_note(f, note, sizeof note));
    }
    ckptio__free(f->tmp_path);
    f->tmp_path = NULL; /* the data now lives under f->path: close keeps it */
    return CKPTIO_OK;
}

/* The start of every commit of a local file. Whatever happens from here
 * on, no more writes: a failed fsync must not be retried as if it had
 * succeeded (the kernel may have dropped the dirty pages and cleared the
 * error). A temporary takes the mode of what it replaces, before the fsync
 * that makes the mode durable with the data (with EXCLUSIVE there is
 * nothing to replace, unless a mode source was given). */
static ckptio_status begin_local_commit(ckptio_file *f) {
    f->closed_for_write = true;
    if (f->tmp_path && (f->mode_from || !(f->flags & CKPTIO_OPEN_EXCLUSIVE)))
        return ckptio_inherit_mode(f->fd, f->mode_from ? f->mode_from : f->path);
    return CKPTIO_OK;
}

/* Opens f's directory to fsync it after f was renamed into it. */
static ckptio_status open_dir_to_sync(const ckptio_file *f, int *dfd) {
    *dfd = ckptio__open(f->dir_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (*dfd < 0)
        return CKPTIO_FAIL_SYS(errno, "open", f->dir_path, -1, "opening the directory to fsync it after renaming %s",
                               f->path);
    return CKPTIO_OK;
}

ckptio_status ckptio_file_commit(ckptio_file *f) {
    CKPTIO_RETURN_IF(!f, CKPTIO_E_INVAL, "ckptio_file_commit: file is NULL");
    CKPTIO_FORWARD(check_writable(f, "commit", NULL));
    if (f->object) return ckptio__object_commit(f);
    CKPTIO_FORWARD(begin_local_commit(f));
    const bool sync = ckptio__io_engine_setting(f->engine, CKPTIO_OPT_SYNC) != 0;
    ckptio_stats delta = {0};
    if (sync) {
        const double t0 = ckptio__now();
        int ret = ckptio__fsync(f->fd);
        delta.seconds_fsync += ckptio__now() - t0;
        if (ret < 0) {
            int err = errno;
            ckptio__io_engine_stats_add(f->engine, &delta);
            char note[300];
            return CKPTIO_FAIL_SYS(err, "fsync", f->path, -1, "flushing the data to storage%s",
                                   ckptio__file_tmp_note(f, note, sizeof note));
        }
    }
    if (f->tmp_path) {
        const ckptio_status st = rename_into_place(f);
        if (st != CKPTIO_OK) {
            ckptio__io_engine_stats_add(f->engine, &delta);
            return st;
        }
    }
    f->committed = true;
    ckptio_status st = CKPTIO_OK;
    if (sync && (f->created || !(f->flags & CKPTIO_OPEN_IN_PLACE))) {
        /* The new directory entry is durable only once the directory is. */
        const double t0 = ckptio__now();
        int dfd;
        st = open_dir_to_sync(f, &dfd);
        if (st == CKPTIO_OK) {
            if (ckptio__fsync(dfd) < 0)
                st = CKPTIO_FAIL_SYS(errno, "fsync", f->dir_path, -1,
                                     "flushing the directory after renaming %s (the file is in place but its name may "
                                     "not survive a power loss)",
                                     f->path);
            close(dfd);
        }
        delta.seconds_fsync += ckptio__now() - t0;
    }
    ckptio__io_engine_stats_add(f->engine, &delta);
    return st;
}

/* ckptio_file_commit_unreferenced() for one file, without the fsyncs: its
 * mode set, its temporary renamed over its name. */
static ckptio_status rename_unreferenced(ckptio_file *f) {
    CKPTIO_FORWARD(check_writable(f, "commit", NULL));
    CKPTIO_RETURN_IF(f->object || !f->tmp_path, CKPTIO_E_INVAL,
                     "%s: commit: only an atomic write of a local file is renamed before its fsync", f->path);
    CKPTIO_FORWARD(begin_local_commit(f));
    CKPTIO_FORWARD(rename_into_place(f));
    f->committed = true;
    return CKPTIO_OK;
}

int ckptio__file_renamed_fd(const ckptio_file *f) { return f->sync_owed && !f->object ? f->fd : -1; }

bool ckptio__file_completion_owed(const ckptio_file *f) {
    return f->object && f->sync_owed && !f->committed && !f->closed_for_write;
}

bool ckptio__file_in_dir(const ckptio_file *f, const char *dir) {
    struct stat a, b;
    return !f->object && f->dir_path && stat(f->dir_path, &a) == 0 && stat(dir, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* Up to this many files and directories are fsynced at once. */
#define COMMIT_GROUP 64

/* fsync of fds[0..n) at once: the first failure, said of what[i]. */
static ckptio_status sync_group(ckptio_file *const *what, const int *fds, const bool *is_dir, size_t n,
                                ckptio_stats *delta) {
    int errs[COMMIT_GROUP];
    const double t0 = ckptio__now();
    const int failed = ckptio__fsync_many(fds, n, errs);
    delta->seconds_fsync += ckptio__now() - t0;
    for (size_t i = 0; failed && i < n; i++) {
        if (!errs[i]) continue;
        if (is_dir[i])
            return CKPTIO_FAIL_SYS(errs[i], "fsync", what[i]->dir_path, -1,
                                   "flushing the directory after renaming %s (the file is in place but its name may "
                                   "not survive a power loss)",
                                   what[i]->path);
        return CKPTIO_FAIL_SYS(errs[i], "fsync", what[i]->path, -1,
                               "flushing the data to storage (the file is in place under its name but its data may "
                               "not survive a power loss)");
    }
    return CKPTIO_OK;
}

ckptio_status ckptio_file_commit_unreferenced(ckptio_file *const *files, size_t count, unsigned flags) {
    CKPTIO_RETURN_IF(!files && count, CKPTIO_E_INVAL, "ckptio_file_commit_unreferenced: files is NULL");
    CKPTIO_RETURN_IF(flags & ~CKPTIO_COMMIT_SYNC_LATER, CKPTIO_E_INVAL,
                     "ckptio_file_commit_unreferenced: unknown flags 0x%x", flags & ~CKPTIO_COMMIT_SYNC_LATER);
    for (size_t i = 0; i < count; i++)
        CKPTIO_RETURN_IF(!files[i], CKPTIO_E_INVAL, "ckptio_file_commit_unreferenced: file %zu is NULL", i);
    ckptio_status st = CKPTIO_OK;
    size_t i = 0;
    while (st == CKPTIO_OK && i < count) {
        /* One group: every file renamed, then each file and each of their
         * directories fsynced together. */
        ckptio_file *what[COMMIT_GROUP];
        int fds[COMMIT_GROUP];
        bool is_dir[COMMIT_GROUP];
        size_t n = 0;
        ckptio_stats delta = {0};
        for (; st == CKPTIO_OK && i < count && 2 * (n + 1) <= COMMIT_GROUP; i++) {
            ckptio_file *f = files[i];
            if (f->object && (flags & CKPTIO_COMMIT_SYNC_LATER)) {
                /* Its last parts go on uploading; ckptio_dcp_commit() completes the upload beside its manifest's
                 * PUT (no name of it is visible before). */
                if ((st = check_writable(f, "commit", NULL)) == CKPTIO_OK) f->sync_owed = true;
                continue;
            }
            if (f->object || !f->tmp_path) { /* nothing to rename first: the usual commit */
                st = ckptio_file_commit(f);
                continue;
            }
            if ((st = rename_unreferenced(f)) != CKPTIO_OK) break;
            if (flags & CKPTIO_COMMIT_SYNC_LATER) {
                f->sync_owed = true;
                continue;
            }
            if (ckptio__io_engine_setting(f->engine, CKPTIO_OPT_SYNC) == 0) continue;
            what[n] = f;
            is_dir[n] = false;
            fds[n++] = f->fd;
        }
        /* Each directory once, after the files (which it names). */
        for (size_t k = 0, nfiles = n; st == CKPTIO_OK && k < nfiles; k++) {
            bool seen = false;
            for (size_t d = nfiles; d < n && !seen; d++) seen = strcmp(what[d]->dir_path, what[k]->dir_path) == 0;
            if (seen) continue;
            int dfd;
            if ((st = open_dir_to_sync(what[k], &dfd)) != CKPTIO_OK) break;
            what[n] = what[k];
            is_dir[n] = true;
            fds[n++] = dfd;
        }
        if (st == CKPTIO_OK && n) st = sync_group(what, fds, is_dir, n, &delta);
        for (size_t k = 0; k < n; k++)
            if (is_dir[k]) close(fds[k]);
        if (n) ckptio__io_engine_stats_add(what[0]->engine, &delta);
    }
    return st;
}

static void *close_fd(void *arg) {
    close((int)(intptr_t)arg);
    return NULL;
}

/* Temporaries larger than this that a close discards are closed on a thread
 * of their own. */
#define DISCARD_IN_BACKGROUND ((uint64_t)64 << 20)

/* Closes the last descriptor of an unlinked temporary. Its name is gone;
 * the close is where the file system frees its blocks, which takes a while
 * for a large file (docs/ENGINE.md section 4): a canceled or failed
 * save returns without waiting for that, which a detached thread that
 * blocks every signal does instead. Without a thread, here. */
static void discard(int fd) {
    struct stat sb;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_blocks * 512 >= DISCARD_IN_BACKGROUND) {
        pthread_attr_t attr;
        pthread_t t;
        if (pthread_attr_init(&attr) == 0) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            const int rc = ckptio__thread_start(&t, &attr, close_fd, (void *)(intptr_t)fd);
            pthread_attr_destroy(&attr);
            if (rc == 0) return;
        }
    }
    close(fd);
}

ckptio_status ckptio_file_close(ckptio_file *f) {
    if (!f) return CKPTIO_OK;
    if (f->object) return ckptio__object_close(f);
    ckptio_status st = CKPTIO_OK;
    bool unlinked = false;
    if (f->tmp_path && unlink(f->tmp_path) < 0 && errno != ENOENT)
        st = CKPTIO_FAIL_SYS(errno, "unlink", f->path, -1, "removing the uncommitted temporary %s", f->tmp_path);
    else if (f->tmp_path)
        unlinked = true;
    if (f->direct_fd >= 0) close(f->direct_fd);
    /* close() can report a deferred write error (NFS); keep the first. An
     * unlinked temporary's data is discarded anyway. */
    if (unlinked && f->fd >= 0) discard(f->fd);
    else if (f->fd >= 0 && close(f->fd) < 0 && st == CKPTIO_OK && errno != EINTR)
        st = CKPTIO_FAIL_SYS(errno, "close", f->path, -1, "closing the file");
    ckptio__io_engine_file_ref(f->engine, -1);
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->write_turn);
    ckptio__free(f->tmp_path);
    ckptio__free(f->mode_from);
    ckptio__free(f->dir_path);
    ckptio__free(f->path);
    ckptio__free(f);
    return st;
}

ckptio_status ckptio_file_size(ckptio_file *f, uint64_t *out) {
    CKPTIO_RETURN_IF(!f || !out, CKPTIO_E_INVAL, "ckptio_file_size: file and out are required");
    if (f->object) return ckptio__object_size(f, out);
    CKPTIO_FORWARD(ckptio__file_acquire(f));
    struct stat sb;
    if (fstat(f->fd, &sb) < 0) return CKPTIO_FAIL_SYS(errno, "fstat", f->path, -1, "reading the file size");
    *out = (uint64_t)sb.st_size;
    return CKPTIO_OK;
}

const char *ckptio_file_path(const ckptio_file *f) { return f ? f->path : NULL; }

ckptio_status ckptio_file_is_direct(ckptio_file *f, int *out) {
    CKPTIO_RETURN_IF(!f || !out, CKPTIO_E_INVAL, "ckptio_file_is_direct: file and out are required");
    *out = 0;
    CKPTIO_FORWARD(ckptio__file_prepare_direct(f));
    *out = ckptio__file_direct_fd(f) >= 0;
    return CKPTIO_OK;
}

ckptio_status ckptio_file_truncate(ckptio_file *f, uint64_t size) {
    CKPTIO_RETURN_IF(!f, CKPTIO_E_INVAL, "ckptio_file_truncate: file is NULL");
    CKPTIO_FORWARD(check_writable(f, "truncate", NULL));
    if (f->object) return ckptio__object_truncate(f, size);
    if (size > (uint64_t)INT64_MAX)
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE,
                               &((ckptio__err_ctx){.operation = "truncate", .path = f->path, .file_offset = -1}),
                               "size %llu is beyond the largest file size", (unsigned long long)size);
    int ret;
    do ret = ftruncate(f->fd, (off_t)size);
    while (ret < 0 && errno == EINTR && !ckptio__interrupt_requested());
    if (ret < 0) return CKPTIO_FAIL_SYS(errno, "truncate", f->path, (int64_t)size, "setting the file size");
    return CKPTIO_OK;
}
