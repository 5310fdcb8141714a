/*
 * steps_remove.c - starting a step, removing steps, cleaning what crashed
 * saves left, and retention.
 *
 * Only what the manager itself started is ever removed: a step directory
 * holding its marker or its begun mark (made when the step began, before
 * anything else), or an empty one; and only when every entry in it is a
 * regular file under a name the manager or the DCP writer gives. The whole
 * directory is checked before the first unlink, so a refusal removes
 * nothing. Removal takes the marker away first and makes that durable
 * before any data file goes, and the begun mark last: a crash in the
 * middle leaves a PARTIAL step (which the next save or `ckptio clean`
 * removes), never a step that looks complete with files missing, nor one
 * that no longer looks like the manager's. Retention counts only steps
 * that hold a marker, runs after a newer step's marker is durable, always
 * keeps the newest step that passes the FAST check, so damage to the
 * newest steps never costs the last good one, and keeps for later a step
 * a reader pins.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"
#include "steps_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* How far a removal got, for its messages: a failure half-way says what
 * was removed and what is left. */
typedef struct removal {
    const char *dir;
    bool marker;         /* the step had a marker */
    bool marker_gone;    /* and it is removed */
    size_t files;        /* the other entries but the begun mark */
    size_t files_gone;   /* removed of them */
    bool begun_gone;     /* the begun mark is removed */
} removal;

/* "the marker and 2 of 5 files are removed; 3 files, the begun mark and
 * the directory are left: the step is partial (...)" */
static const char *progress(const removal *r, char *out, size_t cap) {
    const size_t left = r->files - r->files_gone;
    snprintf(out, cap,
             "%s%zu of %zu file%s removed; %zu file%s, %sthe directory left: the step is partial (ckptio clean or "
             "the next save removes it)",
             r->marker_gone ? "the marker and " : "", r->files_gone, r->files, r->files == 1 ? "" : "s", left,
             left == 1 ? "" : "s", r->begun_gone ? "" : "the begun mark and ");
    return out;
}

/* Makes the begun mark of a step that holds a marker but none (saved by a
 * release without begun marks): a removal that stops after the marker is
 * gone must still leave a step recognisably the manager's. */
static ckptio_status make_begun(const char *dir) {
    char *path = ckptio__dcp_join(dir, CKPTIO_STEP_BEGUN);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    int err = 0;
    const int fd = ckptio__open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0)
        st = CKPTIO_FAIL_SYS_NOTE(errno, "open", path, "making the begun mark before the step's removal; nothing is "
                                  "removed");
    else if (close(fd), (err = ckptio__dcp_fsync_dir(dir)) != 0)
        st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", dir, "making the begun mark durable before the step's removal; "
                                  "nothing else is removed");
    ckptio__free(path);
    return st;
}

/* Holds the marker exclusively for the removal (a reader's pin holds it
 * shared): *fd stays open until the removal ends. */
static ckptio_status lock_marker(const char *dir, uint64_t step, int *fd) {
    char *path = ckptio__dcp_join(dir, CKPTIO_STEP_MARKER);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    struct stat sb;
    mode_t type = 0;
    /* The checked open (open_regular.c): never a FIFO's wait or a device's open. */
    *fd = ckptio__open_regular(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW, &sb, &type);
    int ret = -1;
    if (*fd < 0 && type) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                             "the commit marker is %s, not a regular file: refused without opening it; nothing is "
                             "removed",
                             ckptio__file_type_name(type));
    } else if (*fd < 0) {
        st = CKPTIO_FAIL_SYS_NOTE(errno, "open", path, "locking the marker before the step's removal; nothing is "
                                  "removed");
    } else {
        do ret = flock(*fd, LOCK_EX | LOCK_NB);
        while (ret < 0 && errno == EINTR && !ckptio__interrupt_requested());
        if (ret < 0 && errno == EWOULDBLOCK)
            st = CKPTIO_FAIL_CTX(CKPTIO_E_BUSY, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                                 "a reader holds step %llu (ckptio_steps_pin): nothing is removed",
                                 (unsigned long long)step);
        else if (ret < 0 && errno == EINTR) /* the program asked to stop: CKPTIO_E_CANCELED */
            st = CKPTIO_FAIL_SYS_NOTE(EINTR, "flock", path, "locking the marker before the step's removal; nothing "
                                      "is removed");
        /* A file system without flock: readers cannot pin, nothing to wait for. */
    }
    if (st != CKPTIO_OK && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    ckptio__free(path);
    return st;
}

static ckptio_status unlink_in(const char *dir, const char *name, const char *note) {
    char *path = ckptio__dcp_join(dir, name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    if (ckptio__unlink(path) != 0 && errno != ENOENT) st = CKPTIO_FAIL_SYS_NOTE(errno, "unlink", path, "%s", note);
    ckptio__free(path);
    return st;
}

/* Removes the files of a step whose entries `e` were all checked: the
 * marker first (made durable), the begun mark last, then the directory. */
static ckptio_status remove_checked(const char *root, const char *dir, const ckptio__step_entries *e) {
    removal r = {.dir = dir, .marker = e->marker, .files = e->count - e->marker - e->begun};
    char note[512];
    int err = 0;
    ckptio_status st = CKPTIO_OK;
    if (e->marker) {
        if ((st = unlink_in(dir, CKPTIO_STEP_MARKER, "the step is unchanged")) != CKPTIO_OK) return st;
        r.marker_gone = true;
        if ((err = ckptio__dcp_fsync_dir(dir)) != 0)
            return CKPTIO_FAIL_SYS_NOTE(err, "fsync", dir, "making the marker's removal durable; %s",
                                        progress(&r, note, sizeof note));
    }
    for (size_t i = 0; i < e->count; i++) {
        const char *name = e->names[i];
        if (!strcmp(name, CKPTIO_STEP_MARKER) || !strcmp(name, CKPTIO_STEP_BEGUN)) continue;
        if ((st = unlink_in(dir, name, progress(&r, note, sizeof note))) != CKPTIO_OK) return st;
        r.files_gone++;
    }
    if ((st = unlink_in(dir, CKPTIO_STEP_BEGUN, progress(&r, note, sizeof note))) != CKPTIO_OK) return st;
    r.begun_gone = true;
    if (rmdir(dir) != 0 && errno != ENOENT) {
        if (errno == ENOTEMPTY || errno == EEXIST)
            return CKPTIO_FAIL_SYS_NOTE(errno, "rmdir", dir, "every file it held is removed, but an entry appeared "
                                        "meanwhile: the directory is left with it");
        return CKPTIO_FAIL_SYS_NOTE(errno, "rmdir", dir, "every file it held is removed; the empty directory is left "
                                    "(partial: ckptio clean or the next save removes it)");
    }
    if ((err = ckptio__dcp_fsync_dir(root)) != 0)
        return CKPTIO_FAIL_SYS_NOTE(err, "fsync", root, "the step is removed but its removal may not survive a power "
                                    "loss");
    return CKPTIO_OK;
}

/* An object step whose entries `e` were all checked: the same order as
 * remove_checked, each delete durable when answered; then the uploads its
 * save left unfinished. */
static ckptio_status remove_object_checked(ckptio_engine *io, const char *dir, const ckptio__step_entries *e) {
    removal r = {.dir = dir, .marker = e->marker, .files = e->count - e->marker - e->begun};
    char note[512];
    ckptio_status st = CKPTIO_OK;
    if (e->marker) {
        if ((st = ckptio__step_object_delete(io, dir, CKPTIO_STEP_MARKER)) != CKPTIO_OK) return st;
        r.marker_gone = true;
    }
    for (size_t i = 0; i < e->count; i++) {
        const char *name = e->names[i];
        if (!strcmp(name, CKPTIO_STEP_MARKER) || !strcmp(name, CKPTIO_STEP_BEGUN)) continue;
        if ((st = ckptio__step_object_delete(io, dir, name)) != CKPTIO_OK)
            return ckptio__fail(st, __FILE__, __LINE__,
                                &((ckptio__err_ctx){.operation = "unlink", .path = dir, .file_offset = -1,
                                                    .verbatim = true}),
                                "%s (%s)", ckptio_last_error_message(), progress(&r, note, sizeof note));
        r.files_gone++;
    }
    if ((st = ckptio__step_object_abort_uploads(io, dir)) != CKPTIO_OK ||
        (st = ckptio__step_object_delete(io, dir, CKPTIO_STEP_BEGUN)) != CKPTIO_OK)
        return ckptio__fail(st, __FILE__, __LINE__,
                            &((ckptio__err_ctx){.operation = "unlink", .path = dir, .file_offset = -1,
                                                .verbatim = true}),
                            "%s (%s)", ckptio_last_error_message(), progress(&r, note, sizeof note));
    return CKPTIO_OK;
}

/* remove_step for a step in object storage: the same checks, from one listing. */
static ckptio_status remove_object_step(ckptio_engine *io, const char *root, uint64_t step, const char *dir) {
    ckptio__step_entries e = {0};
    ckptio_status st = ckptio__step_object_entries(io, dir, true, &e);
    if (st != CKPTIO_OK) {
        /* the listing's error; nothing is removed */
    } else if (e.count == 0) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "no step directory; nothing is removed");
    } else if (e.alien[0]) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "'%s' is %s: a step holds only the files the manager and the DCP writer make; nothing "
                             "in the step is removed",
                             e.alien, e.alien_why);
    } else if (!e.marker && !e.begun) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "not the manager's step (no commit marker " CKPTIO_STEP_MARKER ", no begun mark "
                             CKPTIO_STEP_BEGUN "): another writer's; nothing is removed");
    } else if (e.pins) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_BUSY, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "a reader holds step %llu (ckptio_steps_pin: %zu live pin%s): nothing is removed",
                             (unsigned long long)step, e.pins, e.pins == 1 ? "" : "s");
    } else if (!e.begun && (st = ckptio__step_object_put(io, dir, CKPTIO_STEP_BEGUN, "", 0)) != CKPTIO_OK) {
        /* nothing is removed */
    } else {
        st = remove_object_checked(io, dir, &e);
    }
    ckptio__step_entries_free(&e);
    (void)root;
    return st;
}

/* The removal of one step (ckptio_steps_remove): nothing is removed unless
 * the whole directory is the manager's and the DCP writer's. `io`: the
 * engine of an object root, NULL for a local one. */
static ckptio_status remove_step(ckptio_engine *io, const char *root, uint64_t step) {
    char *dir = ckptio__step_dir(root, step);
    if (!dir) return ckptio_last_error()->status;
    if (io) {
        const ckptio_status st = remove_object_step(io, root, step, dir);
        ckptio__free(dir);
        return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "remove");
    }
    ckptio_status st = CKPTIO_OK;
    ckptio__step_entries e = {0};
    int marker_fd = -1;
    struct stat sb;
    if (lstat(dir, &sb) != 0) {
        st = errno == ENOENT ? CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                                               "no step directory; nothing is removed")
                             : CKPTIO_FAIL_SYS_NOTE(errno, "lstat", dir, "nothing is removed");
    } else if (!S_ISDIR(sb.st_mode)) {
        /* A symlink named like a step could lead the removal out of the root: nothing is followed. */
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "not a directory (%s): not a step; nothing is removed",
                             S_ISLNK(sb.st_mode) ? "a symlink" : "a file");
    } else if ((st = ckptio__step_entries_read(dir, true, &e)) != CKPTIO_OK) {
        /* the listing's error; nothing is removed */
    } else if (e.alien[0]) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "'%s' is %s: a step holds only the files the manager and the DCP writer make; nothing "
                             "in the step is removed",
                             e.alien, e.alien_why);
    } else if (!e.marker && !e.begun && e.count > 0) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "not the manager's step (no commit marker " CKPTIO_STEP_MARKER ", no begun mark "
                             CKPTIO_STEP_BEGUN "): another writer's; nothing is removed");
    } else if (e.marker && (st = lock_marker(dir, step, &marker_fd)) != CKPTIO_OK) {
        /* pinned by a reader, or the marker could not be opened; nothing is removed */
    } else if (!e.begun && e.count > 0 && (st = make_begun(dir)) != CKPTIO_OK) {
        /* nothing is removed */
    } else {
        st = remove_checked(root, dir, &e);
    }
    if (marker_fd >= 0) close(marker_fd);
    ckptio__step_entries_free(&e);
    ckptio__free(dir);
    return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "remove");
}

ckptio_status ckptio_steps_remove(const char *root, uint64_t step) {
    CKPTIO_RETURN_IF(!root || !*root, CKPTIO_E_INVAL, "ckptio_steps_remove: root is required");
    ckptio_engine *io, *owned;
    CKPTIO_FORWARD(ckptio__steps_engine(NULL, root, &io, &owned));
    const ckptio_status st = remove_step(io, root, step);
    ckptio__steps_engine_done(owned);
    return st;
}

/* A growing list of removed steps. */
typedef struct removed_list {
    uint64_t *steps;
    size_t count, cap;
} removed_list;

static ckptio_status note_removed(removed_list *l, uint64_t step) {
    if (l->count == l->cap) {
        const size_t cap = l->cap ? l->cap * 2 : 8;
        uint64_t *grown = ckptio__realloc(l->steps, cap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        l->steps = grown;
        l->cap = cap;
    }
    l->steps[l->count++] = step;
    return CKPTIO_OK;
}

static void hand_over(removed_list *l, uint64_t **removed, size_t *nremoved) {
    if (nremoved) *nremoved = l->count;
    if (removed) *removed = l->steps;
    else ckptio__free(l->steps);
}

void ckptio_steps_list_free(uint64_t *steps) { ckptio__free(steps); }

/* Whether a removal's failure only means "left alone": the step holds
 * something removal refuses (E_UNSUPPORTED), a reader pins it (E_BUSY),
 * or it went meanwhile (E_NOT_FOUND). Nothing was removed then. */
static bool left_alone(ckptio_status st) {
    return st == CKPTIO_E_UNSUPPORTED || st == CKPTIO_E_BUSY || st == CKPTIO_E_NOT_FOUND;
}

static ckptio_status clean(ckptio_engine *io, const char *root, removed_list *l) {
    ckptio_step_info *steps = NULL;
    size_t n = 0;
    CKPTIO_FORWARD(ckptio_steps_scan(root, &steps, &n));
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < n && st == CKPTIO_OK; i++) {
        if (steps[i].state != CKPTIO_STEP_PARTIAL) continue;
        st = remove_step(io, root, steps[i].step);
        if (st == CKPTIO_OK) st = note_removed(l, steps[i].step);
        else if (left_alone(st)) st = CKPTIO_OK; /* the scan's reason says why */
    }
    ckptio_steps_free(steps);
    return st;
}

ckptio_status ckptio_steps_clean(const char *root, uint64_t **removed, size_t *nremoved) {
    CKPTIO_RETURN_IF(!root || !*root, CKPTIO_E_INVAL, "ckptio_steps_clean: root is required");
    if (removed) *removed = NULL;
    if (nremoved) *nremoved = 0;
    removed_list l = {0};
    ckptio_engine *io, *owned;
    CKPTIO_FORWARD(ckptio__steps_engine(NULL, root, &io, &owned));
    const ckptio_status st = clean(io, root, &l);
    ckptio__steps_engine_done(owned);
    hand_over(&l, removed, nremoved);
    return st;
}

/* Why begin cannot use the step directory PATH that exists after the
 * clean: the error, saying what the directory is. */
static ckptio_status exists_error(const char *root, uint64_t step, const char *path) {
    ckptio_step_info info;
    const ckptio_status st = ckptio_steps_check(NULL, root, step, CKPTIO_STEP_CHECK_MARKER, &info);
    const ckptio__err_ctx ctx = {.path = path, .file_offset = -1};
    if (st != CKPTIO_OK)
        return CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS, &ctx, "something that is not a step directory has its name; it is "
                               "left alone");
    if (info.state == CKPTIO_STEP_FOREIGN)
        return CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS, &ctx, "the directory is not the manager's (%s); save under another "
                               "step number, or move it away", info.reason);
    if (info.state == CKPTIO_STEP_PARTIAL)
        return CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS, &ctx, "a partial step that removal leaves whole (%s); it is not "
                               "reused", info.reason);
    return CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS, &ctx,
                           "the step was saved before (it holds a commit marker); a step is never overwritten");
}

/* The new step directory's begun mark, made durable with the directory's
 * entry in ROOT before anything else is written into it. */
static ckptio_status mark_begun(const char *root, const char *path) {
    char *mark = ckptio__dcp_join(path, CKPTIO_STEP_BEGUN);
    if (!mark) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    int err = 0;
    const int fd = ckptio__open(mark, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) {
        st = CKPTIO_FAIL_SYS_NOTE(errno, "open", mark, "making the step's begun mark; nothing was written");
        (void)rmdir(path); /* empty: nothing of anyone's is lost */
    } else if (close(fd), (err = ckptio__dcp_fsync_dir(path)) != 0) {
        st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", path, "flushing the begun mark; nothing else was written");
    } else if ((err = ckptio__dcp_fsync_dir(root)) != 0) {
        st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", root, "flushing the new step directory's entry; nothing was written");
    }
    ckptio__free(mark);
    return st;
}

/* ckptio_steps_begin on an object root: the step's prefix must hold
 * nothing; the begun mark is its first object (created only if absent where
 * the server can do that). */
static ckptio_status begin_object(ckptio_engine *io, const char *root, uint64_t step, const char *path) {
    removed_list l = {0};
    ckptio_status st = clean(io, root, &l);
    ckptio__free(l.steps);
    if (st != CKPTIO_OK) return st;
    char *asked = ckptio__path_join(path, "");
    if (!asked) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio__path_kind kind = CKPTIO__PATH_MISSING;
    st = ckptio__step_object_kind(io, asked, &kind, NULL);
    ckptio__free(asked);
    if (st == CKPTIO_OK && kind != CKPTIO__PATH_MISSING) return exists_error(root, step, path);
    char *mark = st == CKPTIO_OK ? ckptio__path_join(path, CKPTIO_STEP_BEGUN) : NULL;
    if (st == CKPTIO_OK && !mark) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        st = ckptio__object_write_all(io, mark, "", 0, true);
        if (st == CKPTIO_E_UNSUPPORTED) { /* no conditional writes: the root's lease keeps other managers out */
            ckptio__error_restore(saved);
            st = ckptio__object_write_all(io, mark, "", 0, false);
        } else if (st == CKPTIO_E_EXISTS) {
            ckptio__free(saved);
            st = exists_error(root, step, path);
        } else {
            ckptio__free(saved);
        }
    }
    ckptio__free(mark);
    return st;
}

ckptio_status ckptio_steps_begin(const char *root, uint64_t step, char *dir, size_t cap) {
    CKPTIO_RETURN_IF(!root || !*root || !dir, CKPTIO_E_INVAL, "ckptio_steps_begin: root and dir are required");
    char *path = ckptio__step_dir(root, step);
    if (!path) return ckptio__step_fail(root, step, "begin");
    ckptio_status st = CKPTIO_OK;
    if (strlen(path) >= cap) st = CKPTIO_FAIL(CKPTIO_E_RANGE, "ckptio_steps_begin: %zu bytes is too small", cap);
    else snprintf(dir, cap, "%s", path);
    ckptio_engine *io = NULL, *owned = NULL;
    if (st == CKPTIO_OK) st = ckptio__steps_engine(NULL, root, &io, &owned);
    if (st == CKPTIO_OK && io) {
        st = begin_object(io, root, step, path);
        ckptio__steps_engine_done(owned);
        ckptio__free(path);
        return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "begin");
    }
    if (st == CKPTIO_OK && mkdir(root, 0777) != 0 && errno != EEXIST)
        st = CKPTIO_FAIL_SYS_NOTE(errno, "mkdir", root, "creating the root for the step");
    if (st == CKPTIO_OK) {
        removed_list l = {0};
        st = clean(NULL, root, &l);
        ckptio__free(l.steps);
    }
    if (st == CKPTIO_OK && mkdir(path, 0777) != 0) {
        if (errno == EEXIST) st = exists_error(root, step, path);
        else st = CKPTIO_FAIL_SYS_NOTE(errno, "mkdir", path, "creating the step directory; nothing was written");
    }
    if (st == CKPTIO_OK) st = mark_begun(root, path);
    ckptio__free(path);
    return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "begin");
}

/* Whether retention keeps steps[i] (ascending list of marked steps). */
static bool retained(const ckptio_step_info *marked, size_t n, size_t i, uint64_t keep_last, uint64_t keep_every,
                     uint64_t newest_good, bool have_good) {
    if (keep_last == 0 || n - i <= keep_last) return true;
    if (keep_every && marked[i].step % keep_every == 0) return true;
    return have_good && marked[i].step == newest_good;
}

static ckptio_status retain(ckptio_engine *engine, ckptio_engine *io, const char *root, uint64_t keep_last,
                            uint64_t keep_every, removed_list *l) {
    ckptio_step_info *steps = NULL;
    size_t n = 0, marked = 0;
    CKPTIO_FORWARD(ckptio_steps_scan(root, &steps, &n));
    for (size_t i = 0; i < n; i++) /* keep the steps holding a marker, in order */
        if (steps[i].state == CKPTIO_STEP_COMPLETE || steps[i].state == CKPTIO_STEP_DAMAGED) steps[marked++] = steps[i];
    ckptio_status st = CKPTIO_OK;
    uint64_t newest_good = 0;
    bool have_good = false;
    if (keep_last && marked > keep_last) {
        for (size_t i = marked; i-- > 0 && !have_good && st == CKPTIO_OK;) {
            ckptio_step_info info;
            st = ckptio_steps_check(engine, root, steps[i].step, CKPTIO_STEP_CHECK_FAST, &info);
            if (st == CKPTIO_E_NOT_FOUND) st = CKPTIO_OK;
            else if (st == CKPTIO_OK && info.state == CKPTIO_STEP_COMPLETE)
                have_good = true, newest_good = steps[i].step;
        }
    }
    for (size_t i = 0; i < marked && st == CKPTIO_OK; i++) {
        if (retained(steps, marked, i, keep_last, keep_every, newest_good, have_good)) continue;
        st = remove_step(io, root, steps[i].step);
        if (st == CKPTIO_OK) st = note_removed(l, steps[i].step);
        else if (left_alone(st)) st = CKPTIO_OK; /* pinned, or holding what removal refuses: kept this time */
    }
    ckptio_steps_free(steps);
    return st;
}

ckptio_status ckptio_steps_retain(ckptio_engine *engine, const char *root, uint64_t keep_last, uint64_t keep_every,
                                  uint64_t **removed, size_t *nremoved) {
    CKPTIO_RETURN_IF(!engine || !root || !*root, CKPTIO_E_INVAL, "ckptio_steps_retain: engine and root are required");
    if (removed) *removed = NULL;
    if (nremoved) *nremoved = 0;
    removed_list l = {0};
    ckptio_engine *io, *owned;
    CKPTIO_FORWARD(ckptio__steps_engine(engine, root, &io, &owned));
    const ckptio_status st = retain(engine, io, root, keep_last, keep_every, &l);
    ckptio__steps_engine_done(owned);
    hand_over(&l, removed, nremoved);
    return st;
}
