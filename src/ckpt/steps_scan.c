/*
 * steps_scan.c - finding the steps of a root and telling which ones a
 * training job may resume from.
 *
 * The states come from the disk alone, so a job restarted after any crash
 * (or `ckptio inspect ROOT`) sees what the saves left: PARTIAL is a step
 * the manager began (its begun mark, made before anything else and removed
 * last) without its commit marker (a save that did not finish, or a removal
 * that stopped half-way: both remove the marker first / write it last), or
 * an empty one; FOREIGN is any other step directory without a marker (not
 * the manager's: never removed); DAMAGED is a step whose marker or data
 * does not hold up to the check asked for.
 * A damaged step is a result reported with its reason, never an error: the
 * caller goes on to the next older step. Only proven damage is: a check
 * that fails for another reason (an I/O error, memory, a cancel, a
 * permission) says nothing about the step, so it is an error, and nothing
 * is skipped, replaced or removed on its account.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"
#include "steps_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void set_state(ckptio_step_info *out, ckptio_step_state state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_state(ckptio_step_info *out, ckptio_step_state state, const char *fmt, ...) {
    out->state = state;
    out->status = state == CKPTIO_STEP_DAMAGED ? CKPTIO_E_FORMAT : CKPTIO_OK;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->reason, sizeof out->reason, fmt, ap);
    va_end(ap);
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The step numbers of ROOT's step directories, ascending (a missing root
 * has none). */
static ckptio_status list_steps(ckptio_engine *io, const char *root, uint64_t **steps, size_t *count) {
    *steps = NULL;
    *count = 0;
    if (io) { /* an object root */
        CKPTIO_FORWARD(ckptio__steps_object_list(io, root, steps, count));
        if (*count) qsort(*steps, *count, sizeof **steps, cmp_u64);
        return CKPTIO_OK;
    }
    DIR *d = ckptio__opendir(root);
    if (!d) {
        if (errno == ENOENT) return CKPTIO_OK;
        return CKPTIO_FAIL_SYS_NOTE(errno, "opendir", root, "listing the steps of the root");
    }
    size_t cap = 0;
    ckptio_status st = CKPTIO_OK;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        uint64_t step;
        struct stat sb;
        if (!ckptio__step_from_name(e->d_name, &step)) continue;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (*count == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *grown = ckptio__realloc(*steps, cap * sizeof *grown);
            if (!grown) {
                st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing the steps of %s", root);
                break;
            }
            *steps = grown;
        }
        (*steps)[(*count)++] = step;
    }
    closedir(d);
    if (st != CKPTIO_OK) {
        ckptio__free(*steps);
        *steps = NULL;
        *count = 0;
        return st;
    }
    if (*count) qsort(*steps, *count, sizeof **steps, cmp_u64);
    return CKPTIO_OK;
}

/* ---- what a step directory holds ------------------------------------------------------ */

/* Why removal refuses the entry NAME of type MODE, or NULL. */
static const char *refused(const char *name, mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISLNK(mode)) return "a symlink";
    if (!S_ISREG(mode)) return "not a regular file";
    if (!ckptio__step_own_name(name)) return "a name neither the manager nor the DCP writer gives a file";
    return NULL;
}

static ckptio_status keep_name(ckptio__step_entries *e, size_t *cap, const char *name) {
    if (e->count == *cap) {
        const size_t grown_cap = *cap ? *cap * 2 : 16;
        char **grown = ckptio__realloc(e->names, grown_cap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        e->names = grown;
        *cap = grown_cap;
    }
    if (!(e->names[e->count] = ckptio__strdup(name))) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    return CKPTIO_OK;
}

ckptio_status ckptio__step_entries_read(const char *dir, bool for_removal, ckptio__step_entries *out) {
    memset(out, 0, sizeof *out);
    DIR *d = for_removal ? ckptio__opendir(dir) : opendir(dir);
    if (!d) return CKPTIO_FAIL_SYS_NOTE(errno, "opendir", dir, "listing the step's files");
    ckptio_status st = CKPTIO_OK;
    size_t cap = 0;
    for (struct dirent *e; st == CKPTIO_OK && (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat sb;
        if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue; /* removed meanwhile */
            sb.st_mode = 0;                /* unknown: refused below as not a regular file */
        }
        if (for_removal && (st = keep_name(out, &cap, e->d_name)) != CKPTIO_OK) break;
        out->count++;
        out->marker |= !strcmp(e->d_name, CKPTIO_STEP_MARKER);
        out->begun |= !strcmp(e->d_name, CKPTIO_STEP_BEGUN);
        out->metadata |= !strcmp(e->d_name, ".metadata");
        if (S_ISREG(sb.st_mode)) {
            out->files++;
            out->bytes += (uint64_t)sb.st_size;
        }
        const char *why = refused(e->d_name, sb.st_mode);
        if (why && !out->alien[0]) {
            snprintf(out->alien, sizeof out->alien, "%s", e->d_name);
            out->alien_why = why;
        }
    }
    closedir(d);
    if (st != CKPTIO_OK) ckptio__step_entries_free(out);
    return st;
}

#define PARTIAL_REASON "no commit marker (" CKPTIO_STEP_MARKER "): the save did not finish, or a removal stopped"

/* The marker-level state of the step in DIR; *m receives the marker when
 * the state is COMPLETE. A marker that cannot be read for a reason other
 * than what it is (an I/O error, a permission) is an error, not damage. */
static ckptio_status marker_state(ckptio_engine *io, const char *dir, uint64_t step, ckptio__step_marker *m,
                                  ckptio_step_info *out) {
    char *path = ckptio__dcp_join(dir, CKPTIO_STEP_MARKER);
    char buf[CKPTIO__STEP_MARKER_MAX + 1];
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading the marker of %s", dir);
    if (io) { /* an object: one GET */
        size_t len = 0;
        ckptio_status st = ckptio__step_object_read(io, path, buf, CKPTIO__STEP_MARKER_MAX + 1, &len);
        if (st == CKPTIO_E_NOT_FOUND) {
            set_state(out, CKPTIO_STEP_PARTIAL, "%s", PARTIAL_REASON);
            st = CKPTIO_OK;
        } else if (st != CKPTIO_OK) {
            /* the GET failed: nothing proven about the step */
        } else if (ckptio__step_marker_parse(buf, len, path, m) != CKPTIO_OK) {
            set_state(out, CKPTIO_STEP_DAMAGED, "%s", ckptio_last_error_message());
        } else if (m->step != step) {
            set_state(out, CKPTIO_STEP_DAMAGED, "%s: the marker belongs to step %llu, not to this directory's", path,
                      (unsigned long long)m->step);
        } else {
            set_state(out, CKPTIO_STEP_COMPLETE, "%s", "");
        }
        ckptio__free(path);
        return st;
    }
    struct stat sb;
    mode_t type = 0;
    const int fd = ckptio__open_regular(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW, &sb, &type);
    if (fd < 0) {
        ckptio_status st = CKPTIO_OK;
        if (type)
            set_state(out, CKPTIO_STEP_DAMAGED, "%s: open: is %s, not a regular file: refused without opening it",
                      path, ckptio__file_type_name(type));
        else if (errno == ENOENT)
            set_state(out, CKPTIO_STEP_PARTIAL, "%s", PARTIAL_REASON);
        else
            st = CKPTIO_FAIL_SYS_NOTE(errno, "open", path, "reading the step's commit marker");
        ckptio__free(path);
        return st;
    }
    size_t len = 0;
    ssize_t n = 0;
    while (len < sizeof buf && (n = ckptio__read(fd, buf + len, sizeof buf - len)) > 0) len += (size_t)n;
    const int err = errno;
    close(fd);
    ckptio_status st = CKPTIO_OK;
    if (n < 0)
        st = CKPTIO_FAIL_SYS_NOTE(err, "read", path, "reading the step's commit marker");
    else if (ckptio__step_marker_parse(buf, len, path, m) != CKPTIO_OK)
        set_state(out, CKPTIO_STEP_DAMAGED, "%s", ckptio_last_error_message());
    else if (m->step != step)
        set_state(out, CKPTIO_STEP_DAMAGED, "%s: the marker belongs to step %llu, not to this directory's", path,
                  (unsigned long long)m->step);
    else
        set_state(out, CKPTIO_STEP_COMPLETE, "%s", "");
    ckptio__free(path);
    return st;
}

/* Sizes of the data files .metadata names, by index (ckptio_dcp_file).
 * false with *st = CKPTIO_OK: damage (a file missing or not a regular
 * file), in *out; false with an error in *st: nothing proven. */
static bool file_sizes(ckptio_engine *io, ckptio_dcp *h, const char *dir, uint64_t *sizes, size_t nfiles,
                       ckptio_step_info *out, ckptio_status *st) {
    for (size_t i = 0; i < nfiles; i++) {
        const char *name = NULL;
        struct stat sb;
        ckptio_dcp_file(h, i, &name);
        char *path = ckptio__dcp_join(dir, name);
        if (!path) {
            *st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory checking %s", dir);
            return false;
        }
        int rc = 0, err = 0;
        if (io) { /* an object: HEAD */
            ckptio__path_kind kind = CKPTIO__PATH_MISSING;
            uint64_t size = 0;
            const ckptio_status got = ckptio__step_object_kind(io, path, &kind, &size);
            if (got != CKPTIO_OK) { /* the HEAD failed: nothing proven */
                *st = got;
                ckptio__free(path);
                return false;
            }
            if (kind != CKPTIO__PATH_FILE) {
                rc = -1;
                err = ENOENT;
            }
            sb.st_mode = S_IFREG;
            sb.st_size = (off_t)size;
        } else {
            rc = lstat(path, &sb);
            err = errno;
            if (rc != 0 && err != ENOENT && err != ENOTDIR) {
                *st = CKPTIO_FAIL_SYS_NOTE(err, "lstat", path, "the size of a data file named by .metadata");
                ckptio__free(path);
                return false;
            }
        }
        ckptio__free(path);
        if (rc != 0 || !S_ISREG(sb.st_mode)) {
            set_state(out, CKPTIO_STEP_DAMAGED, "%s/%s: data file named by .metadata: %s", dir, name,
                      rc != 0 ? (io ? "no such object" : strerror(err)) : "not a regular file");
            out->status = CKPTIO_E_NOT_FOUND;
            return false;
        }
        sizes[i] = (uint64_t)sb.st_size;
    }
    return true;
}

/* Whether the stored item `s` of `fqn` lies inside its file. */
static bool item_inside(ckptio_dcp *h, const char *dir, const uint64_t *sizes, size_t nfiles, const char *fqn,
                        const ckptio_dcp_stored *s, ckptio_step_info *out) {
    for (size_t i = 0; i < nfiles; i++) {
        const char *name = NULL;
        ckptio_dcp_file(h, i, &name);
        if (strcmp(name, s->file) != 0) continue;
        if (s->offset > sizes[i] || s->length > sizes[i] - s->offset) {
            set_state(out, CKPTIO_STEP_DAMAGED,
                      "%s/%s: item '%s' (%llu bytes at offset %llu) runs past the end of the file (%llu bytes): "
                      "truncated",
                      dir, name, fqn, (unsigned long long)s->length, (unsigned long long)s->offset,
                      (unsigned long long)sizes[i]);
            return false;
        }
        return true;
    }
    set_state(out, CKPTIO_STEP_DAMAGED, "%s: item '%s' is in '%s', which .metadata does not list", dir, fqn, s->file);
    return false;
}

/* Whether a failed check's status proves the step broken: bytes that do
 * not parse or match, a size, a file missing. An I/O error, memory, a
 * cancel or a permission says nothing about the step. */
static bool proves_damage(ckptio_status st) {
    return st == CKPTIO_E_FORMAT || st == CKPTIO_E_CHECKSUM || st == CKPTIO_E_TRUNCATED || st == CKPTIO_E_STALE ||
           st == CKPTIO_E_NOT_FOUND;
}

/* A failed read of a step's .metadata or items: REFUSED when ckptio's
 * reader refuses something the bytes hold (a value outside the allowlist, a
 * limit; the bytes are what was saved), DAMAGED when the failure proves it
 * (proves_damage), else the error itself is returned. Only what is proven
 * broken may ever be replaced or removed as damage. */
static ckptio_status set_failure(ckptio_step_info *out, ckptio_status st) {
    if (st == CKPTIO_E_DISALLOWED || st == CKPTIO_E_UNSUPPORTED || st == CKPTIO_E_RANGE)
        set_state(out, CKPTIO_STEP_REFUSED, "ckptio's reader refuses it (not damage; the step is kept): %s",
                  ckptio_last_error_message());
    else if (proves_damage(st))
        set_state(out, CKPTIO_STEP_DAMAGED, "%s", ckptio_last_error_message());
    else
        return st;
    out->status = st;
    return CKPTIO_OK;
}

/* FAST (and FULL) on a step whose marker is good: CKPTIO_OK with the
 * state in *out, or the error of a check that proved nothing. */
static ckptio_status data_check(ckptio_engine *engine, ckptio_engine *io, const char *dir,
                                const ckptio__step_marker *m, ckptio_step_check check, ckptio_step_info *out) {
    uint64_t size = 0, hash = 0;
    const ckptio_status hashed =
        io ? ckptio__step_object_metadata_hash(io, dir, &size, &hash) : ckptio__step_metadata_hash(dir, &size, &hash);
    if (hashed != CKPTIO_OK) return set_failure(out, hashed);
    if (size != m->metadata_size || hash != m->metadata_xxh3) {
        set_state(out, CKPTIO_STEP_DAMAGED,
                  "%s/.metadata: %llu bytes with XXH3-64 %016llx, the marker recorded %llu bytes with %016llx: "
                  "replaced or damaged after the commit",
                  dir, (unsigned long long)size, (unsigned long long)hash, (unsigned long long)m->metadata_size,
                  (unsigned long long)m->metadata_xxh3);
        return CKPTIO_OK;
    }
    ckptio_dcp *h = NULL;
    uint64_t *sizes = NULL;
    size_t nfiles = 0, ntensors = 0, nbytes = 0;
    const char *manifest = NULL;
    ckptio_status st = ckptio_dcp_open(engine, dir, &h);
    if (st != CKPTIO_OK) return set_failure(out, st);
    ckptio_dcp_file_count(h, &nfiles);
    ckptio_dcp_tensor_count(h, &ntensors);
    ckptio_dcp_bytes_count(h, &nbytes);
    if (!(sizes = ckptio__calloc(nfiles + 1, sizeof *sizes))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory checking %s", dir);
        goto out;
    }
    /* Only a manifest that is not there means "saved without checksums"
     * (ckptio_dcp_validate's rule); one that is there but is not a regular
     * file (a FIFO, a device) is damage. */
    const ckptio_status has = ckptio_dcp_manifest(h, &manifest);
    if (has != CKPTIO_OK && has != CKPTIO_E_NOT_FOUND) {
        st = set_failure(out, has);
        goto out;
    }
    if (has == CKPTIO_OK) {
        struct stat sb;
        char *path = ckptio__dcp_join(dir, manifest);
        ckptio__path_kind kind = CKPTIO__PATH_MISSING;
        int rc = -1, err = ENOMEM;
        if (path && io) {
            st = ckptio__step_object_kind(io, path, &kind, NULL); /* a failed HEAD proves nothing */
            rc = st == CKPTIO_OK && kind == CKPTIO__PATH_FILE ? 0 : -1;
            err = ENOENT;
            sb.st_mode = S_IFREG;
        } else if (path) {
            rc = lstat(path, &sb);
            err = errno;
        }
        if (st != CKPTIO_OK)
            ;
        else if (rc != 0 && err != ENOENT && err != ENOTDIR)
            st = path ? CKPTIO_FAIL_SYS_NOTE(err, "lstat", path, "looking for the save's checksum manifest")
                      : CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory checking %s", dir);
        else if (rc != 0 || !S_ISREG(sb.st_mode)) {
            set_state(out, CKPTIO_STEP_DAMAGED, "%s/%s: the save's checksum manifest is missing", dir, manifest);
            out->status = CKPTIO_E_NOT_FOUND;
        }
        ckptio__free(path);
        if (st != CKPTIO_OK || out->state != CKPTIO_STEP_COMPLETE) goto out;
    }
    if (!file_sizes(io, h, dir, sizes, nfiles, out, &st)) goto out;
    for (size_t t = 0; t < ntensors; t++) {
        ckptio_dcp_tensor_info ti;
        ckptio_dcp_tensor(h, t, &ti);
        for (size_t c = 0; c < ti.chunks; c++) {
            ckptio_dcp_chunk_info ci;
            ckptio_dcp_chunk(h, t, c, &ci);
            if (!item_inside(h, dir, sizes, nfiles, ti.fqn, &ci.stored, out)) goto out;
        }
    }
    for (size_t b = 0; b < nbytes; b++) {
        ckptio_dcp_bytes_info bi;
        ckptio_dcp_bytes(h, b, &bi);
        if (!item_inside(h, dir, sizes, nfiles, bi.fqn, &bi.stored, out)) goto out;
    }
    if (check == CKPTIO_STEP_CHECK_FULL) {
        /* A step saved without checksums has no manifest to verify against:
         * its structure and byte items are checked instead. */
        const ckptio_status checked = manifest ? ckptio_dcp_verify(h, NULL) : ckptio_dcp_check(h, NULL);
        if (checked != CKPTIO_OK) st = set_failure(out, checked);
    }
out:;
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio__free(sizes);
    ckptio_dcp_close(h);
    if (saved) ckptio__error_restore(saved);
    return st;
}

/* The state of a step directory without a marker, from what it holds:
 * only what the manager began (its begun mark) or an empty directory is
 * partial; anything else is another writer's. */
static void unmarked_state(const ckptio__step_entries *e, bool listed, const char *why_unlisted,
                           ckptio_step_info *out) {
    if (!listed)
        set_state(out, CKPTIO_STEP_FOREIGN, "no commit marker, and the directory cannot be listed (%s): not known "
                  "to be the manager's; left alone", why_unlisted);
    else if (e->begun)
        set_state(out, CKPTIO_STEP_PARTIAL, "%s", PARTIAL_REASON);
    else if (e->count == 0)
        set_state(out, CKPTIO_STEP_PARTIAL, "empty: a save that stopped before its first file, or a removal that "
                  "stopped before removing the directory");
    else
        set_state(out, CKPTIO_STEP_FOREIGN, "no commit marker (" CKPTIO_STEP_MARKER ") and no begun mark ("
                  CKPTIO_STEP_BEGUN "): not started by this manager (another writer's%s, or a save of a ckptio "
                  "release without begun marks that did not finish); never removed or reused by the manager",
                  e->metadata ? " DCP checkpoint, e.g. torch's own writer's" : "");
}

/* Appends to the reason why removal leaves the step alone. */
static void note_alien(const ckptio__step_entries *e, ckptio_step_info *out) {
    if (!e->alien[0] || out->state == CKPTIO_STEP_FOREIGN) return;
    const size_t len = strlen(out->reason);
    snprintf(out->reason + len, sizeof out->reason - len, "%sholds '%s' (%s), which the manager does not make: "
             "removal leaves this step whole", len ? "; " : "", e->alien, e->alien_why);
}

/* Whether the step directory DIR (or, with `marker`, its marker) is there,
 * locally (lstat: a symlink is not a step) or as objects under the prefix. */
static ckptio_status present(ckptio_engine *io, const char *path, bool dir, bool *yes, int *err) {
    *yes = false;
    *err = 0;
    if (io) {
        char *asked = dir ? ckptio__path_join(path, "") : NULL; /* "DIR/": only ever a directory */
        if (dir && !asked) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        ckptio__path_kind kind = CKPTIO__PATH_MISSING;
        const ckptio_status st = ckptio__step_object_kind(io, dir ? asked : path, &kind, NULL);
        ckptio__free(asked);
        CKPTIO_FORWARD(st);
        *yes = kind == (dir ? CKPTIO__PATH_DIR : CKPTIO__PATH_FILE);
        if (!*yes) *err = ENOENT;
        return CKPTIO_OK;
    }
    struct stat sb;
    const int rc = lstat(path, &sb);
    *err = rc != 0 ? errno : 0;
    *yes = rc == 0 && (!dir || S_ISDIR(sb.st_mode));
    return CKPTIO_OK;
}

static ckptio_status check_step(ckptio_engine *engine, ckptio_engine *io, const char *root, uint64_t step,
                                ckptio_step_check check, ckptio_step_info *out) {
    memset(out, 0, sizeof *out);
    out->step = step;
    char *dir = ckptio__step_dir(root, step);
    if (!dir) return ckptio_last_error()->status;
    struct stat sb;
    bool there = false;
    int err = 0;
    if (present(io, dir, true, &there, &err) != CKPTIO_OK) {
        ckptio__free(dir);
        return ckptio_last_error()->status;
    }
    const int rc = there ? 0 : -1;
    sb.st_mode = there ? S_IFDIR : 0;
    if (rc != 0 || !S_ISDIR(sb.st_mode)) {
        ckptio__free(dir);
        if (rc != 0 && err != ENOENT)
            return CKPTIO_FAIL_SYS_NOTE(err, "lstat", root, "looking for step %llu", (unsigned long long)step);
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = root, .file_offset = -1}),
                               "step %llu: no step directory", (unsigned long long)step);
    }
    ckptio__step_marker m;
    ckptio__step_entries e;
    char why_unlisted[256] = "";
    const bool listed = (io ? ckptio__step_object_entries(io, dir, false, &e)
                            : ckptio__step_entries_read(dir, false, &e)) == CKPTIO_OK;
    if (listed && io && e.count == 0) { /* a prefix with nothing under it is no directory: removed meanwhile */
        ckptio__free(dir);
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = root, .file_offset = -1}),
                               "step %llu: no step directory", (unsigned long long)step);
    }
    if (!listed) {
        snprintf(why_unlisted, sizeof why_unlisted, "%s",
                 io ? ckptio_last_error_message() : strerror(ckptio_last_error()->sys_errno));
        if (ckptio_last_error()->sys_errno == ENOENT) { /* removed meanwhile */
            ckptio__free(dir);
            return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = root, .file_offset = -1}),
                                   "step %llu: no step directory", (unsigned long long)step);
        }
    }
    out->bytes = e.bytes;
    out->files = e.files;
    ckptio_status st = marker_state(io, dir, step, &m, out);
    if (st == CKPTIO_OK && out->state == CKPTIO_STEP_PARTIAL) unmarked_state(&e, listed, why_unlisted, out);
    if (st == CKPTIO_OK && out->state == CKPTIO_STEP_COMPLETE && check != CKPTIO_STEP_CHECK_MARKER) {
        st = data_check(engine, io, dir, &m, check, out);
        char *marker = ckptio__dcp_join(dir, CKPTIO_STEP_MARKER);
        bool marked = true, still = true;
        int merr = 0;
        if ((st != CKPTIO_OK || out->state == CKPTIO_STEP_DAMAGED) && marker &&
            present(io, marker, false, &marked, &merr) == CKPTIO_OK && !marked && merr == ENOENT) {
            /* The marker went while the data was read: a removal, not damage. */
            const bool gone = present(io, dir, true, &still, &merr) != CKPTIO_OK || !still;
            ckptio__free(marker);
            ckptio__free(dir);
            ckptio__step_entries_free(&e);
            if (gone)
                return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = root, .file_offset = -1}),
                                       "step %llu: removed while it was checked", (unsigned long long)step);
            set_state(out, CKPTIO_STEP_PARTIAL, "its commit marker was removed while it was checked: a removal in "
                      "progress");
            return CKPTIO_OK;
        }
        ckptio__free(marker);
    }
    if (st == CKPTIO_OK && listed) note_alien(&e, out);
    ckptio__step_entries_free(&e);
    ckptio__free(dir);
    /* Not damage: the caller fails with the cause, and skips or removes nothing. */
    return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "check");
}

static bool valid_check(ckptio_engine *engine, ckptio_step_check check) {
    return check == CKPTIO_STEP_CHECK_MARKER ||
           ((check == CKPTIO_STEP_CHECK_FAST || check == CKPTIO_STEP_CHECK_FULL) && engine);
}

ckptio_status ckptio_steps_check(ckptio_engine *engine, const char *root, uint64_t step, ckptio_step_check check,
                                 ckptio_step_info *out) {
    CKPTIO_RETURN_IF(!root || !*root || !out, CKPTIO_E_INVAL, "ckptio_steps_check: root and out are required");
    CKPTIO_RETURN_IF(!valid_check(engine, check), CKPTIO_E_INVAL,
                     "ckptio_steps_check: check %d needs an engine (MARKER, FAST or FULL)", (int)check);
    ckptio_engine *io, *owned;
    CKPTIO_FORWARD(ckptio__steps_engine(engine, root, &io, &owned));
    const ckptio_status st = check_step(engine, io, root, step, check, out);
    ckptio__steps_engine_done(owned);
    return st;
}

ckptio_status ckptio_steps_scan(const char *root, ckptio_step_info **steps, size_t *count) {
    CKPTIO_RETURN_IF(!root || !*root || !steps || !count, CKPTIO_E_INVAL,
                     "ckptio_steps_scan: root, steps and count are required");
    *steps = NULL;
    *count = 0;
    uint64_t *numbers = NULL;
    size_t n = 0;
    ckptio_engine *io, *owned;
    CKPTIO_FORWARD(ckptio__steps_engine(NULL, root, &io, &owned));
    ckptio_status ls = list_steps(io, root, &numbers, &n);
    ckptio_step_info *info = ls == CKPTIO_OK ? ckptio__calloc(n + 1, sizeof *info) : NULL;
    if (ls != CKPTIO_OK || !info) {
        ckptio__free(numbers);
        if (ls == CKPTIO_OK) ls = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing the steps of %s", root);
        ckptio__steps_engine_done(owned);
        return ls;
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        const ckptio_status st = check_step(NULL, io, root, numbers[i], CKPTIO_STEP_CHECK_MARKER, &info[kept]);
        if (st == CKPTIO_OK) kept++;
        else if (st != CKPTIO_E_NOT_FOUND) { /* removed meanwhile: not a step any more */
            ckptio__free(numbers);
            ckptio__free(info);
            ckptio__steps_engine_done(owned);
            return st;
        }
    }
    ckptio__free(numbers);
    ckptio__steps_engine_done(owned);
    *steps = info;
    *count = kept;
    return CKPTIO_OK;
}

void ckptio_steps_free(ckptio_step_info *steps) { ckptio__free(steps); }

ckptio_status ckptio_steps_latest(ckptio_engine *engine, const char *root, ckptio_step_check check, uint64_t *step,
                                  ckptio_step_info **skipped, size_t *nskipped) {
    CKPTIO_RETURN_IF(!root || !*root || !step, CKPTIO_E_INVAL, "ckptio_steps_latest: root and step are required");
    CKPTIO_RETURN_IF(!valid_check(engine, check), CKPTIO_E_INVAL,
                     "ckptio_steps_latest: check %d needs an engine (MARKER, FAST or FULL)", (int)check);
    if (skipped) *skipped = NULL;
    if (nskipped) *nskipped = 0;
    uint64_t *numbers = NULL;
    size_t n = 0, nskip = 0;
    ckptio_engine *io, *owned;
    CKPTIO_FORWARD(ckptio__steps_engine(engine, root, &io, &owned));
    const ckptio_status ls = list_steps(io, root, &numbers, &n);
    if (ls != CKPTIO_OK) {
        ckptio__steps_engine_done(owned);
        return ls;
    }
    ckptio_step_info *skip = ckptio__calloc(n + 1, sizeof *skip);
    ckptio_status st = skip ? CKPTIO_E_NOT_FOUND : CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    for (size_t i = n; skip && i-- > 0;) {
        ckptio_step_info info;
        const ckptio_status cs = check_step(engine, io, root, numbers[i], check, &info);
        if (cs == CKPTIO_E_NOT_FOUND) continue;
        if (cs != CKPTIO_OK) {
            st = cs;
            break;
        }
        if (info.state == CKPTIO_STEP_COMPLETE) {
            *step = numbers[i];
            st = CKPTIO_OK;
            break;
        }
        skip[nskip++] = info;
    }
    ckptio__free(numbers);
    ckptio__steps_engine_done(owned);
    if (st == CKPTIO_E_NOT_FOUND)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = root, .file_offset = -1}),
                             "no complete step to resume from (%zu step%s skipped)", nskip, nskip == 1 ? "" : "s");
    if (skipped && st != CKPTIO_E_NOMEM) {
        *skipped = skip;
        if (nskipped) *nskipped = nskip;
    } else {
        ckptio__free(skip);
    }
    return st;
}
