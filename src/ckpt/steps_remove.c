/*
 * steps_remove.c - starting a step, removing steps, cleaning what crashed
 * saves left, and retention.
 *
 * Removal takes the marker away first and makes that durable before any
 * data file goes: a crash in the middle leaves a PARTIAL step (which the
 * next save or `ckptio clean` removes), never a step that looks complete
 * with files missing. Retention counts only steps that hold a marker, runs
 * after a newer step's marker is durable, and always keeps the newest step
 * that passes the FAST check, so damage to the newest steps never costs
 * the last good one.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"
#include "steps_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Unlinks every entry of DIR but subdirectories (refused). */
static ckptio_status remove_files(const char *dir) {
    DIR *d = ckptio__opendir(dir);
    if (!d) return CKPTIO_FAIL_SYS_NOTE(errno, "opendir", dir, "listing the step's files to remove them");
    ckptio_status st = CKPTIO_OK;
    for (struct dirent *e; st == CKPTIO_OK && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(sb.st_mode)) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                                 "'%s' is a directory: a step holds only files; nothing inside it is removed", e->d_name);
            break;
        }
        char *path = ckptio__dcp_join(dir, e->d_name);
        if (!path) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        } else if (ckptio__unlink(path) != 0 && errno != ENOENT) {
            st = CKPTIO_FAIL_SYS_NOTE(errno, "unlink", path, "removing the step's files; the step is partial");
        }
        ckptio__free(path);
    }
    closedir(d);
    return st;
}

static ckptio_status remove_step(const char *root, uint64_t step) {
    char *dir = ckptio__step_dir(root, step), *marker = NULL;
    if (!dir) return ckptio_last_error()->status;
    ckptio_status st = CKPTIO_OK;
    int err = 0;
    struct stat sb;
    if (lstat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        /* A symlink named like a step could lead the removal out of the root: nothing is followed. */
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "not a directory (%s): not a step; nothing is removed",
                             S_ISLNK(sb.st_mode) ? "a symlink" : "a file");
    } else if (!(marker = ckptio__dcp_join(dir, CKPTIO_STEP_MARKER))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    } else if (ckptio__unlink(marker) == 0) {
        if ((err = ckptio__dcp_fsync_dir(dir)) != 0)
            st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", dir, "making the marker's removal durable; the step is partial");
    } else if (errno != ENOENT) {
        st = CKPTIO_FAIL_SYS_NOTE(errno, "unlink", marker, "the step is unchanged");
    }
    if (st == CKPTIO_OK) st = remove_files(dir);
    if (st == CKPTIO_OK && rmdir(dir) != 0 && errno != ENOENT)
        st = CKPTIO_FAIL_SYS_NOTE(errno, "rmdir", dir, "its files are removed; the step is partial");
    if (st == CKPTIO_OK && (err = ckptio__dcp_fsync_dir(root)) != 0)
        st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", root, "the step is removed but its removal may not survive a power loss");
    ckptio__free(marker);
    ckptio__free(dir);
    return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "remove");
}

ckptio_status ckptio_steps_remove(const char *root, uint64_t step) {
    CKPTIO_RETURN_IF(!root || !*root, CKPTIO_E_INVAL, "ckptio_steps_remove: root is required");
    return remove_step(root, step);
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

static ckptio_status clean(const char *root, removed_list *l) {
    ckptio_step_info *steps = NULL;
    size_t n = 0;
    CKPTIO_FORWARD(ckptio_steps_scan(root, &steps, &n));
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < n && st == CKPTIO_OK; i++) {
        if (steps[i].state != CKPTIO_STEP_PARTIAL) continue;
        st = remove_step(root, steps[i].step);
        if (st == CKPTIO_OK) st = note_removed(l, steps[i].step);
    }
    ckptio_steps_free(steps);
    return st;
}

ckptio_status ckptio_steps_clean(const char *root, uint64_t **removed, size_t *nremoved) {
    CKPTIO_RETURN_IF(!root || !*root, CKPTIO_E_INVAL, "ckptio_steps_clean: root is required");
    if (removed) *removed = NULL;
    if (nremoved) *nremoved = 0;
    removed_list l = {0};
    const ckptio_status st = clean(root, &l);
    hand_over(&l, removed, nremoved);
    return st;
}

ckptio_status ckptio_steps_begin(const char *root, uint64_t step, char *dir, size_t cap) {
    CKPTIO_RETURN_IF(!root || !*root || !dir, CKPTIO_E_INVAL, "ckptio_steps_begin: root and dir are required");
    char *path = ckptio__step_dir(root, step);
    if (!path) return ckptio__step_fail(root, step, "begin");
    ckptio_status st = CKPTIO_OK;
    int err = 0;
    if (strlen(path) >= cap) st = CKPTIO_FAIL(CKPTIO_E_RANGE, "ckptio_steps_begin: %zu bytes is too small", cap);
    else snprintf(dir, cap, "%s", path);
    if (st == CKPTIO_OK && mkdir(root, 0777) != 0 && errno != EEXIST)
        st = CKPTIO_FAIL_SYS_NOTE(errno, "mkdir", root, "creating the root for the step");
    if (st == CKPTIO_OK) {
        removed_list l = {0};
        st = clean(root, &l);
        ckptio__free(l.steps);
    }
    if (st == CKPTIO_OK && mkdir(path, 0777) != 0) {
        if (errno == EEXIST)
            st = CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                                 "the step was saved before (it holds a commit marker); a step is never overwritten");
        else
            st = CKPTIO_FAIL_SYS_NOTE(errno, "mkdir", path, "creating the step directory; nothing was written");
    }
    if (st == CKPTIO_OK && (err = ckptio__dcp_fsync_dir(root)) != 0)
        st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", root, "flushing the new step directory's entry; nothing was written");
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

static ckptio_status retain(ckptio_engine *engine, const char *root, uint64_t keep_last, uint64_t keep_every,
                            removed_list *l) {
    ckptio_step_info *steps = NULL;
    size_t n = 0, marked = 0;
    CKPTIO_FORWARD(ckptio_steps_scan(root, &steps, &n));
    for (size_t i = 0; i < n; i++) /* keep the steps holding a marker, in order */
        if (steps[i].state != CKPTIO_STEP_PARTIAL) steps[marked++] = steps[i];
    ckptio_status st = CKPTIO_OK;
    uint64_t newest_good = 0;
    bool have_good = false;
    if (keep_last && marked > keep_last) {
        for (size_t i = marked; i-- > 0 && !have_good && st == CKPTIO_OK;) {
            ckptio_step_info info;
            st = ckptio_steps_check(engine, root, steps[i].step, CKPTIO_STEP_CHECK_FAST, &info);
            if (st == CKPTIO_E_NOT_FOUND) st = CKPTIO_OK;
            else if (st == CKPTIO_OK && info.state == CKPTIO_STEP_COMPLETE) have_good = true, newest_good = steps[i].step;
        }
    }
    for (size_t i = 0; i < marked && st == CKPTIO_OK; i++) {
        if (retained(steps, marked, i, keep_last, keep_every, newest_good, have_good)) continue;
        st = remove_step(root, steps[i].step);
        if (st == CKPTIO_OK) st = note_removed(l, steps[i].step);
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
    const ckptio_status st = retain(engine, root, keep_last, keep_every, &l);
    hand_over(&l, removed, nremoved);
    return st;
}
