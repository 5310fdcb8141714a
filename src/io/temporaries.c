/*
 * temporaries.c - finding and removing the temporaries that crashed atomic
 * saves leave behind (".STEM.ckptio-tmp-XXXXXX", see file.c), and the
 * STEM rule they are named by.
 *
 * STEM is the data file's NAME, or for a NAME of more than 236 bytes
 * (whose temporary's name would pass NAME_MAX) a stand-in of 236 bytes:
 * NAME's first bytes, '~', and 16 hex digits of NAME's XXH3-64
 * (ckptio__bounded_name). A cleaner given `name` derives the same STEM, so
 * the filter finds a long name's temporaries and only those.
 *
 * Which temporaries are stale: file.c takes flock(LOCK_EX) on every
 * temporary right after creating it and holds it until the file is closed.
 * The kernel drops the lock when the writer's last descriptor goes away,
 * whatever the cause (close, exit, kill -9), so "a cleaner can lock it"
 * means "no live writer has it open". This is exact where a pid test is
 * not: pids are reused, and a writer in another pid namespace (container)
 * or on another NFS client has a pid the cleaner cannot interpret. A
 * cleaner that locks a temporary in the instant between its creation and
 * its writer's flock makes the writer fail its lock (or see its name gone)
 * and pick another name, so a live save never loses its file.
 *
 * Only regular files whose whole name matches the pattern are removed;
 * symlinks and directories with such names are reported and left alone,
 * and nothing is ever followed (O_NOFOLLOW, unlinkat on the directory).
 * One kind of directory is removed: a directory temporary (a conversion's
 * output built beside its final name) that proves to be a dead builder's:
 * it holds the lock file CKPTIO__TMP_DIR_LOCK, a regular file the cleaner
 * can flock (its builder, which flocked it right after creating it, is
 * gone), and nothing but regular files. A directory without that file, or
 * holding anything else, is left whole: nothing proves it is ckptio's.
 *
 * An atomic save's temporary (ckptio__temporary_create_for_save) takes
 * the first free of CKPTIO__TMP_SLOTS fixed names, ".STEM.ckptio-tmp-00000S":
 * a killed save's leftover is then found by name, and the save lists the
 * directory (removing every stale temporary of its NAME) only when its
 * first choice is taken or a later slot exists. Saves that find no
 * leftover list nothing.
 *
 * Durability: ckptio_cleanup_temporaries() fsyncs the directory once after
 * a scan that removed something, so a power loss cannot bring the removed
 * files back (and a failed fsync is an error naming the directory). The
 * best-effort clean of an atomic save does not: that save's commit
 * fsyncs the same directory after its rename (CKPTIO_OPT_SYNC), which makes
 * the earlier unlinks durable too; without sync nothing of the save is
 * durable either, and a temporary that comes back is just removed again.
 */
#include "io_internal.h"

#include <dirent.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SUFFIX_LEN 6 /* random characters after CKPTIO__TMP_MARK */

static bool is_alnum(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

void ckptio__temporary_stem(const char *name, char out[CKPTIO__NAME_MAX + 1]) {
    ckptio__bounded_name(name, CKPTIO__TMP_STEM_MAX, out);
}

/* ".STEM.ckptio-tmp-XXXXXX" with a non-empty STEM (equal to `stem` when
 * given) and six characters of [A-Za-z0-9]. */
static bool is_temporary_name(const char *entry, const char *stem) {
    const size_t len = strlen(entry), mark = strlen(CKPTIO__TMP_MARK);
    if (entry[0] != '.' || len < 2 + mark + SUFFIX_LEN) return false;
    for (size_t i = len - SUFFIX_LEN; i < len; i++)
        if (!is_alnum(entry[i])) return false;
    if (memcmp(entry + len - SUFFIX_LEN - mark, CKPTIO__TMP_MARK, mark) != 0) return false;
    if (!stem) return true;
    const size_t n = strlen(stem);
    return len == 1 + n + mark + SUFFIX_LEN && memcmp(entry + 1, stem, n) == 0;
}

/* ---- creating ------------------------------------------------------------------ */

/* Six random name characters (uniqueness is enforced by O_EXCL anyway). */
static void random_suffix(char *out) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char bytes[SUFFIX_LEN];
    ckptio__random_bytes(bytes, sizeof bytes);
    for (int i = 0; i < SUFFIX_LEN; i++) out[i] = alphabet[bytes[i] % (sizeof alphabet - 1)];
    out[SUFFIX_LEN] = '\0';
}

/* Marks a new temporary as in use with flock(LOCK_EX): cleaners remove only
 * temporaries they can lock, and the lock dies with the process, also with
 * kill -9. Returns false when a cleaner got to the file between its creation
 * and the lock (it holds the lock or unlinked the name): the caller then
 * picks another name. File systems without flock keep working; cleaners
 * leave their temporaries. */
static bool lock_temporary(int fd, const char *path) {
    int ret;
    do ret = flock(fd, LOCK_EX | LOCK_NB);
    while (ret < 0 && errno == EINTR);
    if (ret < 0) return errno != EWOULDBLOCK;
    struct stat mine, named;
    return fstat(fd, &mine) == 0 && lstat(path, &named) == 0 && mine.st_ino == named.st_ino &&
           mine.st_dev == named.st_dev;
}

int ckptio__temporary_create(const char *dir, const char *name, mode_t mode, int *fd, char **path) {
    *fd = -1;
    char stem[CKPTIO__NAME_MAX + 1];
    ckptio__temporary_stem(name, stem);
    const size_t cap = strlen(dir) + strlen(stem) + 32;
    if (!(*path = ckptio__malloc(cap))) return ENOMEM;
    for (int attempt = 0; attempt < CKPTIO__TMP_TRIES; attempt++) {
        char suffix[SUFFIX_LEN + 1];
        random_suffix(suffix);
        snprintf(*path, cap, "%s/.%s" CKPTIO__TMP_MARK "%s", dir, stem, suffix);
        /* O_EXCL|O_CREAT refuses an existing entry, a symlink included;
         * O_NOFOLLOW says so explicitly. A new name gets `mode` & ~umask,
         * like any newly created file (mkstemp's 0600 would surprise
         * readers). */
        *fd = ckptio__open(*path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (*fd >= 0) {
            if (lock_temporary(*fd, *path)) return 0;
            close(*fd); /* a cleaner has it: it removes it */
            *fd = -1;
            continue;
        }
        if (errno != EEXIST) return errno;
    }
    return EEXIST;
}

/* ---- a save's temporary: fixed slots instead of a listing ------------------------ */

static ckptio_status clean_dir(const char *dir, const char *name, double min_age, ckptio_cleanup_report *r,
                               bool quiet, bool durable);

/* ".STEM.ckptio-tmp-00000S", the name of slot `slot` of a save's temporary. */
static void slot_path(char *out, size_t cap, const char *dir, const char *stem, unsigned slot) {
    snprintf(out, cap, "%s/.%s" CKPTIO__TMP_MARK "%06u", dir, stem, slot);
}

/* Removes the stale temporaries of `name` in `dir` (best effort, quiet: the
 * save's commit fsyncs the directory, which makes the unlinks durable). */
static void sweep(const char *dir, const char *name) {
    ckptio_cleanup_report r = {0};
    atomic_fetch_add_explicit(&ckptio__temporary_sweeps, 1, memory_order_relaxed);
    (void)clean_dir(dir, name, 0.0, &r, true, false);
}

_Atomic uint64_t ckptio__temporary_sweeps;

int ckptio__temporary_create_for_save(const char *dir, const char *name, mode_t mode, int *fd, char **path) {
    *fd = -1;
    char stem[CKPTIO__NAME_MAX + 1];
    ckptio__temporary_stem(name, stem);
    const size_t cap = strlen(dir) + strlen(stem) + 32;
    if (!(*path = ckptio__malloc(cap))) return ENOMEM;
    bool swept = false;
    for (unsigned slot = 0; slot < CKPTIO__TMP_SLOTS; slot++) {
        slot_path(*path, cap, dir, stem, slot);
        *fd = ckptio__open(*path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (*fd < 0) {
            if (errno != EEXIST) return errno;
            /* The slot holds a live save of NAME or a killed one's leftover: one sweep removes what is stale
             * (this slot included), then the slot is tried again. */
            if (!swept) {
                sweep(dir, name);
                swept = true;
                slot--;
            }
            continue;
        }
        if (!lock_temporary(*fd, *path)) { /* a cleaner has it: it removes it */
            close(*fd);
            *fd = -1;
            continue;
        }
        /* A temporary in a later slot was made while this one was taken: a killed save's leftover,
         * unless its save is still running. */
        char *other = swept ? NULL : ckptio__malloc(cap);
        for (unsigned s = slot + 1; other && s < CKPTIO__TMP_SLOTS; s++) {
            struct stat sb;
            slot_path(other, cap, dir, stem, s);
            if (fstatat(AT_FDCWD, other, &sb, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) {
                sweep(dir, name);
                break;
            }
        }
        ckptio__free(other);
        return 0;
    }
    /* Every slot is held by a live save of NAME: random names, as for any other temporary. */
    if (!swept) sweep(dir, name);
    ckptio__free(*path);
    *path = NULL;
    return ckptio__temporary_create(dir, name, mode, fd, path);
}

ckptio_status ckptio_temporary_create(const char *dir, const char *name, const char *reference, int *fd,
                                      char *path, size_t cap) {
    if (fd) *fd = -1;
    CKPTIO_RETURN_IF(!dir || !*dir || !name || !*name || strchr(name, '/') || !fd || !path || !cap, CKPTIO_E_INVAL,
                     "ckptio_temporary_create: dir, a file name without '/', fd and path are required");
    CKPTIO_RETURN_IF(ckptio__s3_is_url(dir), CKPTIO_E_UNSUPPORTED,
                     "%s: an object store has no temporaries: objects are written whole (ckptio_file_open)", dir);
    struct stat ref;
    const bool has_ref = ckptio__reference_stat(dir, reference, &ref);
    char *tmp = NULL;
    const int err = ckptio__temporary_create(dir, name, has_ref ? ref.st_mode & 0777 : 0666, fd, &tmp);
    ckptio_status st = CKPTIO_OK;
    if (err == EEXIST)
        st = ckptio__fail(CKPTIO_E_EXISTS, __FILE__, __LINE__,
                          &((ckptio__err_ctx){.operation = "open", .path = dir, .file_offset = -1,
                                              .sys_errno = EEXIST, .verbatim = true}),
                          "%s/%s: open: no free temporary name after %d tries; %s/%s is unchanged", dir, name,
                          CKPTIO__TMP_TRIES, dir, name);
    else if (err)
        st = CKPTIO_FAIL_SYS_NOTE(err, "open", tmp ? tmp : dir, "creating the temporary of %s/%s; %s/%s is unchanged",
                                  dir, name, dir, name);
    else if (has_ref && (st = ckptio__inherit_from(*fd, &ref, tmp)) != CKPTIO_OK) {
        /* Never wider than the reference (its mode at creation): only owner
         * and group are missing. The commit must not go on without them. */
        unlink(tmp); /* before the close: the lock still covers it */
        close(*fd);
        *fd = -1;
    }
    if (st == CKPTIO_OK && strlen(tmp) >= cap) {
        st = CKPTIO_FAIL(CKPTIO_E_RANGE, "ckptio_temporary_create: %s does not fit in %zu bytes", tmp, cap);
        unlink(tmp); /* before the close: the lock still covers it */
        close(*fd);
        *fd = -1;
    }
    if (st == CKPTIO_OK) memcpy(path, tmp, strlen(tmp) + 1);
    ckptio__free(tmp);
    return st;
}

int ckptio__temporary_dir_create(const char *out, char *tmp, size_t cap, int *lock_fd) {
    *lock_fd = -1;
    const char *slash = strrchr(out, '/');
    const int dirlen = slash ? (int)(slash - out + 1) : 0;
    char stem[CKPTIO__NAME_MAX + 1];
    ckptio__temporary_stem(slash ? slash + 1 : out, stem);
    for (int attempt = 0; attempt < CKPTIO__TMP_TRIES; attempt++) {
        char suffix[SUFFIX_LEN + 1], lock[4096 + 64];
        random_suffix(suffix);
        if ((size_t)snprintf(tmp, cap, "%.*s.%s" CKPTIO__TMP_MARK "%s", dirlen, out, stem, suffix) >= cap ||
            (size_t)snprintf(lock, sizeof lock, "%s/" CKPTIO__TMP_DIR_LOCK, tmp) >= sizeof lock)
            return ENAMETOOLONG;
        if (mkdir(tmp, 0777) != 0) {
            if (errno == EEXIST) continue;
            return errno;
        }
        const int fd = ckptio__open(lock, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0) {
            const int err = errno;
            (void)rmdir(tmp);
            if (err == EEXIST || err == ENOENT) continue; /* a cleaner got there first */
            return err;
        }
        if (lock_temporary(fd, lock)) {
            *lock_fd = fd;
            return 0;
        }
        close(fd); /* a cleaner has it: it removes the directory */
    }
    return EEXIST;
}

int ckptio__temporary_dir_unlock(const char *tmp) {
    char lock[4096 + 64];
    if ((size_t)snprintf(lock, sizeof lock, "%s/" CKPTIO__TMP_DIR_LOCK, tmp) >= sizeof lock) return ENAMETOOLONG;
    return ckptio__unlink(lock) == 0 || errno == ENOENT ? 0 : errno;
}

static double seconds_since(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) * 1e-9;
}

/* Whether every entry of the directory `dir` is a regular file (lstat);
 * *bytes their sizes. */
static bool only_regular_files(int dir, uint64_t *bytes) {
    const int fd = dup(dir);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return false;
    }
    rewinddir(d); /* a dup shares its offset: an earlier scan of `dir` left it at the end */
    bool ok = true;
    *bytes = 0;
    for (struct dirent *e; ok && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat sb;
        ok = fstatat(dir, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode);
        if (ok) *bytes += (uint64_t)sb.st_size;
    }
    closedir(d);
    return ok;
}

/* Unlinks every entry of `dir` but its lock file, then the lock file.
 * Returns 0 or the errno of a failed unlink. */
static int empty_temporary_dir(int dir) {
    const int fd = dup(dir);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        const int err = errno;
        if (fd >= 0) close(fd);
        return err;
    }
    rewinddir(d); /* as in only_regular_files: the offset is shared with `dir` */
    int err = 0;
    for (struct dirent *e; !err && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, CKPTIO__TMP_DIR_LOCK)) continue;
        if (unlinkat(dir, e->d_name, 0) != 0 && errno != ENOENT) err = errno;
    }
    closedir(d);
    if (!err && unlinkat(dir, CKPTIO__TMP_DIR_LOCK, 0) != 0 && errno != ENOENT) err = errno;
    return err;
}

/* A directory temporary (a conversion's output being built): removed only
 * when it proves to be a dead builder's (see the top of the file). Returns
 * 0, or the errno of a failed removal. */
static int clean_dir_entry(int dfd, const char *entry, double min_age, ckptio_cleanup_report *r) {
    const int dir = openat(dfd, entry, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dir < 0) {
        if (errno != ENOENT) r->ignored++;
        return 0;
    }
    struct stat sb, now;
    mode_t type = 0;
    const int fd = ckptio__open_regular(dir, CKPTIO__TMP_DIR_LOCK, O_RDONLY | O_NOFOLLOW, &sb, &type);
    int err = 0, ret;
    uint64_t bytes = 0;
    if (fd < 0) {
        r->ignored++; /* no lock file (or not a regular one): nothing proves the directory is ckptio's */
        close(dir);
        return 0;
    }
    do ret = flock(fd, LOCK_EX | LOCK_NB);
    while (ret < 0 && errno == EINTR);
    if (ret < 0) r->busy++; /* its builder is alive (or the file system has no locks) */
    else if (seconds_since(&sb.st_mtim) < min_age) r->young++;
    else if (fstatat(dir, CKPTIO__TMP_DIR_LOCK, &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != sb.st_ino ||
             now.st_dev != sb.st_dev)
        ; /* removed or replaced meanwhile: another cleaner's, or its builder finished */
    else if (!only_regular_files(dir, &bytes)) r->ignored++; /* holds something a conversion does not make */
    else if ((err = empty_temporary_dir(dir)) == 0) {
        if (unlinkat(dfd, entry, AT_REMOVEDIR) == 0) {
            r->removed++;
            r->bytes_freed += bytes;
        } else if (errno != ENOENT) {
            err = errno;
        }
    }
    close(fd); /* after the removal: the lock covers it */
    close(dir);
    return err;
}

/* Examines one matching entry and removes it if stale. Returns 0, or the
 * errno of a failed unlink. */
static int clean_entry(int dfd, const char *entry, double min_age, ckptio_cleanup_report *r) {
    /* Only a regular file is opened: a FIFO or device under such a name is
     * never waited on, never removed. */
    struct stat sb, now;
    mode_t type = 0;
    int fd = ckptio__open_regular(dfd, entry, O_RDONLY | O_NOFOLLOW, &sb, &type);
    if (fd < 0) {
        if (type == S_IFDIR) return clean_dir_entry(dfd, entry, min_age, r);
        if (type) r->ignored++;             /* a symlink (never followed), FIFO, device: never removed */
        else if (errno != ENOENT) r->busy++; /* cannot be checked (permissions): keep */
        return 0;                           /* ENOENT: its writer committed or discarded it meanwhile */
    }
    int err = 0;
    int ret;
    do ret = flock(fd, LOCK_EX | LOCK_NB);
    while (ret < 0 && errno == EINTR);
    if (ret < 0) {
        r->busy++; /* a live writer holds it, or the file system has no locks */
        goto out;
    }
    if (seconds_since(&sb.st_mtim) < min_age) {
        r->young++;
        goto out;
    }
    /* The name must still be the inode we locked. */
    if (fstatat(dfd, entry, &now, AT_SYMLINK_NOFOLLOW) < 0 || now.st_ino != sb.st_ino || now.st_dev != sb.st_dev)
        goto out;
    if (unlinkat(dfd, entry, 0) < 0) {
        if (errno != ENOENT) err = errno;
        goto out;
    }
    r->removed++;
    r->bytes_freed += (uint64_t)sb.st_size;
out:
    close(fd); /* after the unlink: the lock covers it */
    return err;
}

/* fsync of the scanned directory after `removed` temporaries were unlinked
 * from it (fault-injectable like every other fsync). Returns 0 or errno. */
static int sync_dir(int dfd) { return ckptio__fsync(dfd) < 0 ? errno : 0; }

/* Scans `dir`. With `quiet`, no error record is written (errors are just
 * returned as CKPTIO_E_IO). With `durable`, the directory is fsynced when
 * something was removed. */
static ckptio_status clean_dir(const char *dir, const char *name, double min_age, ckptio_cleanup_report *r,
                               bool quiet, bool durable) {
    DIR *d = opendir(dir);
    if (!d) {
        if (quiet) return CKPTIO_E_IO;
        return CKPTIO_FAIL_SYS(errno, "open", dir, -1, "opening the directory to look for temporaries");
    }
    const int dfd = dirfd(d);
    const size_t removed_before = r->removed;
    char stem[CKPTIO__NAME_MAX + 1];
    if (name) ckptio__temporary_stem(name, stem);
    ckptio_status st = CKPTIO_OK;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            if (errno && st == CKPTIO_OK)
                st = quiet ? CKPTIO_E_IO : CKPTIO_FAIL_SYS(errno, "readdir", dir, -1, "listing the directory");
            break;
        }
        if (!is_temporary_name(e->d_name, name ? stem : NULL)) continue;
        const int err = clean_entry(dfd, e->d_name, min_age, r);
        if (err && st == CKPTIO_OK)
            st = quiet ? CKPTIO_E_IO
                       : CKPTIO_FAIL_CTX(ckptio__status_from_errno(err),
                                         &((ckptio__err_ctx){.operation = "unlink", .path = dir, .file_offset = -1,
                                                             .subject = e->d_name, .sys_errno = err}),
                                         "removing a stale temporary");
    }
    const size_t removed = r->removed - removed_before;
    if (durable && removed) {
        /* Also after a failed unlink: what was removed must stay removed. */
        const int err = sync_dir(dfd);
        if (err && st == CKPTIO_OK)
            st = quiet ? CKPTIO_E_IO
                       : CKPTIO_FAIL_SYS(err, "fsync", dir, -1,
                                         "flushing the directory after removing %zu stale temporar%s: a power loss "
                                         "may bring %s back (the next clean removes %s)",
                                         removed, removed == 1 ? "y" : "ies", removed == 1 ? "it" : "them",
                                         removed == 1 ? "it" : "them");
    }
    closedir(d);
    return st;
}

ckptio_status ckptio_cleanup_temporaries(const char *dir, const char *name, double min_age_seconds,
                                         ckptio_cleanup_report *report) {
    ckptio_cleanup_report r = {0};
    if (report) *report = r;
    CKPTIO_RETURN_IF(!dir || !*dir, CKPTIO_E_INVAL, "ckptio_cleanup_temporaries: dir is required");
    CKPTIO_RETURN_IF(name && (!*name || strchr(name, '/')), CKPTIO_E_INVAL,
                     "ckptio_cleanup_temporaries: name '%s' must be a file name without '/'", name);
    CKPTIO_RETURN_IF(!(min_age_seconds >= 0) || isinf(min_age_seconds), CKPTIO_E_INVAL,
                     "ckptio_cleanup_temporaries: min_age_seconds must be a finite number >= 0");
    const ckptio_status st = clean_dir(dir, name, min_age_seconds, &r, false, true);
    if (report) *report = r;
    return st;
}

