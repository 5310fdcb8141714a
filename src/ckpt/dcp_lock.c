/*
 * dcp_lock.c - the lock that serializes the saves of one DCP checkpoint
 * directory (docs/DCP.md "Concurrent saves").
 *
 * A save's commit replaces .metadata and then removes the files of older
 * saves; two saves into one directory at once would each remove what the
 * other wrote. So a save holds flock(LOCK_EX) on DIR/.ckptio-dcp.lock from
 * before its first data file is written until its cleanup's list is taken
 * and the foreground removal is done. Saves that remove nothing (per-rank
 * metadata, no collectives) take it shared: they run beside each other,
 * never beside a save with a cleanup.
 *
 * Why flock on a lock file (not on the directory's descriptor, not a pid
 * file): the kernel drops an flock when the holder's last descriptor goes
 * away, also on SIGKILL, so a dead save never blocks the next one and
 * there is nothing stale to recognise (a pid says nothing across
 * containers or hosts); flock on a directory is local to the client on
 * NFS, while on a regular file opened for writing NFS emulates it with a
 * byte-range lock on the server that other clients see (unless mounted
 * local_lock=flock). The file is empty, never removed (removing it would
 * let a waiter lock an orphaned inode while a third save locks a new one)
 * and created with the attributes of the checkpoint's metadata file. A
 * file system without flock keeps working, unserialized: the lock then
 * says so (ckptio_dcp_lock_info) and the caller warns.
 *
 * flock is not fair: a holder that releases the lock and asks for it again
 * at once (a checkpoint manager saving in a loop) takes it back before a
 * waiter's next poll, every time. With CKPTIO_DCP_LOCK_QUEUED an
 * acquisition first takes a second lock, the turn (DIR/.ckptio-dcp.queue,
 * empty, never removed), holds it while it waits for the lock and gives it
 * up once it has the lock: the holder that asks again then waits for the
 * turn, which the waiter holds, so two contenders alternate.
 *
 * A child forked while a save holds the lock (a DataLoader worker) shares
 * the open file description and so the lock: the fork handler below closes
 * the child's copies (without LOCK_UN, which would release the parent's
 * lock), so the lock dies with its holder and never with a straggling
 * child. Release uses LOCK_UN before close for the same reason in reverse.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

struct ckptio_dcp_lock {
    int fd;                        /* -1 once closed (released, or in a forked child) */
    ckptio__dcp_lease *lease;      /* a directory in object storage: its lease (dcp_lease.c), fd -1 */
    ckptio_dcp_lock_info info;
    struct ckptio_dcp_lock *next;  /* held locks, for the fork handler */
};

/* ---- forked children -------------------------------------------------------------- */

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static ckptio_dcp_lock *held;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void before_fork(void) { pthread_mutex_lock(&held_lock); }
static void in_parent(void) { pthread_mutex_unlock(&held_lock); }

/* Only close(): the child of a multi-threaded process may do nothing that
 * is not async-signal-safe here. */
static void in_child(void) {
    for (ckptio_dcp_lock *l = held; l; l = l->next) {
        if (l->fd >= 0) close(l->fd);
        l->fd = -1;
    }
    held = NULL;
    pthread_mutex_unlock(&held_lock);
}

static void watch_forks(void) { pthread_atfork(before_fork, in_parent, in_child); }

static void hold(ckptio_dcp_lock *l) {
    pthread_mutex_lock(&held_lock);
    l->next = held;
    held = l;
    pthread_mutex_unlock(&held_lock);
}

/* Takes l off the list; returns its descriptor (-1 when a fork handler
 * closed it in this process). */
static int unhold(ckptio_dcp_lock *l) {
    pthread_mutex_lock(&held_lock);
    for (ckptio_dcp_lock **p = &held; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    const int fd = l->fd;
    l->fd = -1;
    pthread_mutex_unlock(&held_lock);
    return fd;
}

/* ---- acquiring ---------------------------------------------------------------------- */

#define OPEN_NOTE "locking the directory against concurrent saves; the checkpoint is unchanged"

/* flock failures that mean "this file system cannot lock", not "busy". */
static bool lock_unsupported(int err) {
    return err == ENOLCK || err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS || err == EINVAL || err == EBADF;
}

/* An existing lock file: only a regular file is opened (a FIFO or device
 * under the name is refused, never waited on). */
static ckptio_status open_existing_lock(const char *path, int acc, int *fd) {
    struct stat sb;
    mode_t type = 0;
    *fd = ckptio__open_regular(AT_FDCWD, path, acc | O_NOFOLLOW, &sb, &type);
    if (*fd >= 0) return CKPTIO_OK;
    if (type)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                               &((ckptio__err_ctx){.operation = "open", .path = path, .file_offset = -1,
                                                   .verbatim = true}),
                               "%s: open: is %s, not a regular file: refused without opening it (" OPEN_NOTE ")", path,
                               ckptio__file_type_name(type));
    return CKPTIO_FAIL_SYS_NOTE(errno, "open", path, OPEN_NOTE);
}

static ckptio_status open_lock_file(const char *dir, const char *path, const char *reference, int *out) {
    struct stat ref;
    const bool has_ref = ckptio__reference_stat(dir, reference, &ref);
    const mode_t mode = has_ref ? ref.st_mode & 0777 : 0666;
    int fd = ckptio__open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0 && errno == EEXIST) {
        ckptio_status st = open_existing_lock(path, O_RDWR, &fd);
        if (st != CKPTIO_OK && ckptio_last_error()->sys_errno != EACCES && ckptio_last_error()->sys_errno != EPERM)
            return st;
        /* Someone else's lock file we may not write: flock needs only an
         * open descriptor locally (NFS needs write access, see above). */
        if (st != CKPTIO_OK) {
            if ((st = open_existing_lock(path, O_RDONLY, &fd)) != CKPTIO_OK) return st;
            *out = fd;
            return CKPTIO_OK;
        }
    }
    if (fd < 0) return CKPTIO_FAIL_SYS_NOTE(errno, "open", path, OPEN_NOTE);
    if (has_ref) {
        /* Follows the checkpoint's attributes; it is empty, so a refusal
         * exposes nothing and is not worth failing the save for. */
        ckptio__error_saved *saved = ckptio__error_save();
        (void)ckptio__inherit_from(fd, &ref, path);
        ckptio__error_restore(saved);
    }
    *out = fd;
    return CKPTIO_OK;
}

/* Whether `pid` is among the pids listed in `out` so far (", held by pid N, M"). */
static bool listed(const char *out, const char *pid) {
    const size_t n = strlen(pid);
    for (const char *at = strstr(out, pid); at; at = strstr(at + 1, pid))
        if (at[-1] == ' ' && (at[n] == ',' || at[n] == '\0')) return true;
    return false;
}

/* ", held by pid N[, M]" from /proc/locks for the lock file, or "". Each
 * pid once: /proc/locks is read in pieces, and a list that changes between
 * them (other processes' locks) can show an entry twice. */
static void holders(const struct stat *sb, char *out, size_t cap) {
    out[0] = '\0';
    char key[64], line[256];
    snprintf(key, sizeof key, "%02x:%02x:%llu", major(sb->st_dev), minor(sb->st_dev), (unsigned long long)sb->st_ino);
    FILE *f = fopen("/proc/locks", "re");
    if (!f) return;
    size_t pos = 0;
    while (fgets(line, sizeof line, f)) {
        /* "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" ("->" marks waiters) */
        char id[32], type[32], adv[32], mode[32], pid[32], where[64];
        if (sscanf(line, "%31s %31s %31s %31s %31s %63s", id, type, adv, mode, pid, where) != 6) continue;
        if (strcmp(type, "FLOCK") != 0 || strcmp(where, key) != 0 || (pos && listed(out, pid))) continue;
        const int n = snprintf(out + pos, cap - pos, "%s%s", pos ? ", " : ", held by pid ", pid);
        if (n < 0 || (size_t)n >= cap - pos) break;
        pos += (size_t)n;
    }
    fclose(f);
}

static ckptio_status busy(const char *dir, const char *path, const struct stat *sb, double waited) {
    char who[256], when[64] = "";
    holders(sb, who, sizeof who);
    if (waited >= 0) snprintf(when, sizeof when, " after waiting %g s", waited);
    return ckptio__fail(CKPTIO_E_BUSY, __FILE__, __LINE__,
                        &((ckptio__err_ctx){.operation = "lock", .path = path, .file_offset = -1,
                                            .sys_errno = EWOULDBLOCK, .verbatim = true}),
                        "%s: another save holds the directory (lock " CKPTIO_DCP_LOCK_NAME "%s)%s: this save wrote "
                        "nothing and the checkpoint is unchanged; wait for the other save",
                        dir, who, when);
}

static void pause_for(double seconds) {
    if (seconds <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)seconds, .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !ckptio__interrupt_requested()) {
    }
}

static ckptio_status make_lock(int fd, const struct stat *sb, bool locked, int err, ckptio_dcp_lock **out) {
    ckptio_dcp_lock *l = ckptio__calloc(1, sizeof *l);
    if (!l) {
        close(fd); /* releases the flock with the descriptor */
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    l->fd = fd;
    l->info = (ckptio_dcp_lock_info){.locked = locked, .sys_errno = err, .device = sb->st_dev, .inode = sb->st_ino};
    hold(l);
    *out = l;
    return CKPTIO_OK;
}

/* How an acquisition waits: its directory, deadline and callback. */
typedef struct waiting {
    const char *dir;
    double timeout_seconds, start;
    ckptio_dcp_lock_wait_fn on_wait;
    void *user;
} waiting;

/* Takes flock `op` on the lock file PATH, polling with a backoff up to
 * `max_pause` s until it is free, the deadline passes (busy, with the
 * holders of the file BUSY_PATH) or on_wait cancels. *fd receives the
 * locked descriptor and *sb its stat; *unsupported the errno of a file
 * system that cannot flock (then *fd is open, unlocked). */
static ckptio_status take(const waiting *w, const char *path, const char *reference, int op, double max_pause,
                          const char *busy_path, int *fd_out, struct stat *sb_out, int *unsupported) {
    double pause = 0.002;
    *unsupported = 0;
    for (;;) {
        int fd = -1;
        struct stat sb, named;
        ckptio_status st = open_lock_file(w->dir, path, reference, &fd);
        if (st != CKPTIO_OK) return st;
        if (fstat(fd, &sb) < 0) {
            st = CKPTIO_FAIL_SYS_NOTE(errno, "open", path, OPEN_NOTE);
            close(fd);
            return st;
        }
        int ret;
        do ret = flock(fd, op | LOCK_NB);
        while (ret < 0 && errno == EINTR && !ckptio__interrupt_requested());
        if (ret < 0 && errno == EWOULDBLOCK) {
            close(fd);
            const double now = ckptio__now();
            if ((w->on_wait && w->on_wait(now - w->start, w->user) != 0) || ckptio__interrupt_requested())
                return CKPTIO_FAIL_CTX(CKPTIO_E_CANCELED,
                                       &((ckptio__err_ctx){.operation = "lock", .path = path, .file_offset = -1}),
                                       "waiting for another save of %s was canceled; the checkpoint is unchanged",
                                       w->dir);
            const double left = w->start + w->timeout_seconds - now;
            if (w->timeout_seconds >= 0 && left <= 0) {
                struct stat locked;
                if (strcmp(busy_path, path) != 0 && stat(busy_path, &locked) == 0) sb = locked;
                return busy(w->dir, busy_path, &sb, w->timeout_seconds > 0 ? now - w->start : -1);
            }
            /* A backoff up to max_pause: prompt when the other save ends, cheap while it runs. */
            pause_for(w->timeout_seconds < 0 || pause < left ? pause : left);
            pause = pause * 2 < max_pause ? pause * 2 : max_pause;
            continue;
        }
        if (ret < 0) {
            const int err = errno;
            if (lock_unsupported(err)) {
                *unsupported = err;
                *fd_out = fd;
                *sb_out = sb;
                return CKPTIO_OK;
            }
            close(fd);
            return CKPTIO_FAIL_SYS_NOTE(err, "flock", path, OPEN_NOTE);
        }
        if (lstat(path, &named) < 0 || named.st_dev != sb.st_dev || named.st_ino != sb.st_ino) {
            close(fd); /* removed or replaced while we waited: lock the file that is there now */
            continue;
        }
        *fd_out = fd;
        *sb_out = sb;
        return CKPTIO_OK;
    }
}

ckptio_status ckptio_dcp_lock_acquire(const char *dir, const char *reference, unsigned flags, double timeout_seconds,
                                      ckptio_dcp_lock_wait_fn on_wait, void *user, ckptio_dcp_lock **out) {
    if (out) *out = NULL;
    CKPTIO_RETURN_IF(!dir || !*dir || !out, CKPTIO_E_INVAL, "ckptio_dcp_lock_acquire: dir and out are required");
    const unsigned known = CKPTIO_DCP_LOCK_SHARED | CKPTIO_DCP_LOCK_QUEUED | CKPTIO_DCP_LOCK_CONFIRM_LATER;
    CKPTIO_RETURN_IF(flags & ~known, CKPTIO_E_INVAL, "ckptio_dcp_lock_acquire: unknown flags 0x%x", flags);
    CKPTIO_RETURN_IF(timeout_seconds != timeout_seconds, CKPTIO_E_INVAL, "ckptio_dcp_lock_acquire: timeout is NaN");
    if (ckptio__s3_is_url(dir)) { /* no flock on an object store: a lease (CKPTIO_DCP_LOCK_QUEUED has no turn there) */
        ckptio_dcp_lock *l = ckptio__calloc(1, sizeof *l);
        if (!l) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        const ckptio_status st =
            ckptio__dcp_lease_acquire(dir, flags & CKPTIO_DCP_LOCK_SHARED, flags & CKPTIO_DCP_LOCK_CONFIRM_LATER,
                                      timeout_seconds, on_wait, user, &l->lease);
        if (st != CKPTIO_OK) {
            ckptio__free(l);
            return st;
        }
        l->fd = -1;
        l->info.locked = 1;
        *out = l;
        return CKPTIO_OK;
    }
    pthread_once(&fork_once, watch_forks);
    char *path = ckptio__dcp_join(dir, CKPTIO_DCP_LOCK_NAME);
    char *queue = (flags & CKPTIO_DCP_LOCK_QUEUED) ? ckptio__dcp_join(dir, CKPTIO_DCP_LOCK_QUEUE_NAME) : NULL;
    ckptio_status st = CKPTIO_OK;
    if (!path || ((flags & CKPTIO_DCP_LOCK_QUEUED) && !queue)) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    const waiting w = {dir, timeout_seconds, ckptio__now(), on_wait, user};
    const int op = (flags & CKPTIO_DCP_LOCK_SHARED) ? LOCK_SH : LOCK_EX;
    int queue_fd = -1, fd = -1, unsupported = 0;
    struct stat qsb, sb;
    /* Queued: the turn first. Whoever waits for the lock holds the turn, so
     * a holder that releases the lock and asks again at once waits behind
     * it instead of taking the lock back before the waiter's next poll. */
    if (st == CKPTIO_OK && queue) st = take(&w, queue, reference, LOCK_EX, 0.05, path, &queue_fd, &qsb, &unsupported);
    /* Holding the turn, nobody else asks for the lock: poll it often. */
    if (st == CKPTIO_OK) st = take(&w, path, reference, op, queue_fd >= 0 ? 0.005 : 0.05, path, &fd, &sb, &unsupported);
    if (queue_fd >= 0) {
        flock(queue_fd, LOCK_UN);
        close(queue_fd);
    }
    if (st == CKPTIO_OK) st = make_lock(fd, &sb, unsupported == 0, unsupported, out);
    ckptio__free(queue);
    ckptio__free(path);
    return st;
}

ckptio_status ckptio_dcp_lock_query(const ckptio_dcp_lock *lock, ckptio_dcp_lock_info *out) {
    CKPTIO_RETURN_IF(!lock || !out, CKPTIO_E_INVAL, "ckptio_dcp_lock_query: lock and out are required");
    *out = lock->info;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_lock_check(ckptio_dcp_lock *lock) {
    CKPTIO_RETURN_IF(!lock, CKPTIO_E_INVAL, "ckptio_dcp_lock_check: lock is required");
    return lock->lease ? ckptio__dcp_lease_check(lock->lease) : CKPTIO_OK;
}

ckptio_status ckptio_dcp_lock_release(ckptio_dcp_lock *lock) {
    if (!lock) return CKPTIO_OK;
    if (lock->lease) {
        ckptio__dcp_lease_release(lock->lease);
        ckptio__free(lock);
        return CKPTIO_OK;
    }
    const int fd = unhold(lock);
    if (fd >= 0) {
        /* LOCK_UN before close: should any other process still share the
         * open file description (a child forked in a way that skipped the
         * fork handler), the lock must end now, not with that process. */
        flock(fd, LOCK_UN);
        close(fd);
    }
    ckptio__free(lock);
    return CKPTIO_OK;
}
