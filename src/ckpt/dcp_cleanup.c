/*
 * dcp_cleanup.c - step 4 of a DCP directory commit: removing what older
 * saves left (docs/DCP.md "Atomic commit and overwrite").
 *
 * Which files go is decided when the new .metadata is in place, under the
 * directory's lock: DCP-named files (dcp_names.c) outside the new
 * checkpoint that no metadata file in the directory references now. The
 * metadata files are read again with the restricted unpickler (the one
 * just committed is not: its bytes are compared with what the save wrote),
 * because torch's own writer reuses names such as __0_0.distcp and takes no
 * lock. One that cannot be read (a symlink, a FIFO, a pickle outside the
 * allowlist, garbage) might reference any file: then only temporaries are
 * removed and the caller is told why, so it can warn. Temporaries are
 * removed only when no live writer holds them (the flock rule of
 * temporaries.c). Nothing is ever followed: metadata files are opened
 * O_NOFOLLOW | O_NONBLOCK, and only regular files are read. Only regular
 * files are removed: a symlink, a directory or a FIFO under a DCP writer's
 * name is no writer's file (a link's target may be anyone's); it is left
 * where it is and the note names it, and the commit still succeeds.
 *
 * A background removal lists the files at commit and removes them later,
 * without the lock: by then a later save may have committed; it reads the
 * metadata files again right before and keeps whatever they reference
 * (CKPTIO_DCP_RECHECK). Its list names only files older than its commit,
 * which no later ckptio save reuses (new token, new temporary names).
 *
 * In object storage every file is a request: the listing (and the abort of
 * killed saves' uploads) can start beside the .metadata PUT (a prefetch,
 * which the commit starts once the lease was checked), and the deletes run
 * several at a time.
 */
#include "dcp_commit_internal.h"
#include "dcp_dir_internal.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* A growable list of names. */
typedef struct names {
    char **v;
    size_t n, cap;
} names;

static void names_clear(names *l) {
    ckptio_dcp_names_free(l->v, l->n);
    *l = (names){0};
}

static bool names_add(names *l, const char *s) {
    if (l->n + 1 >= l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 16;
        char **v = ckptio__realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = ckptio__strdup(s))) return false;
    l->n++;
    return true;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void names_sort(names *l) {
    if (l->n) qsort(l->v, l->n, sizeof *l->v, cmp_str);
}

static bool names_has(const names *sorted, const char *s) {
    return sorted->n && bsearch(&s, sorted->v, sorted->n, sizeof *sorted->v, cmp_str);
}

void ckptio_dcp_names_free(char **list, size_t count) {
    for (size_t i = 0; list && i < count; i++) ckptio__free(list[i]);
    ckptio__free(list);
}

/* ---- directories in object storage ----------------------------------------------- */

/* A directory's objects as listed, for the cleanup. */
typedef struct object_lister {
    names *all;        /* every object's name */
    double *mtimes;    /* all's LastModified (0: unknown) */
    size_t cap;
    names marks;       /* the shared saves' marks among them */
    bool nomem;
} object_lister;

static bool shared_mark_name(const char *name) {
    return !strncmp(name, CKPTIO__DCP_SHARED_PREFIX, sizeof CKPTIO__DCP_SHARED_PREFIX - 1);
}

static int object_entry(void *user, const ckptio__object_entry *e) {
    object_lister *l = user;
    if (e->kind != CKPTIO__PATH_FILE) return 0; /* prefixes and names no file can have are never removed */
    if (l->all->n >= l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 64;
        double *m = ckptio__realloc(l->mtimes, cap * sizeof *m);
        if (!m) return l->nomem = true;
        l->mtimes = m;
        l->cap = cap;
    }
    l->mtimes[l->all->n] = e->mtime;
    const bool ok = names_add(l->all, e->name) && (!shared_mark_name(e->name) || names_add(&l->marks, e->name));
    if (!ok) l->nomem = true;
    return !ok;
}

/* The objects of the directory `dir` (an s3:// prefix); with `young`, also
 * those the cleanup leaves alone: written at or after the lease held on it
 * now was taken (that save's) or a live shared save's mark was written (a
 * save without a cleanup, in progress beside it: ckptio__dcp_keep_since),
 * and those live marks themselves; a mark that lapsed may go. *keep_since
 * (may be NULL): that time (0: no lease and no mark, nothing is kept). */
static ckptio_status list_objects(ckptio_engine *engine, const char *dir, names *out, names *young,
                                  double *keep_since) {
    object_lister l = {.all = out};
    ckptio_status st = ckptio__object_dir_list(engine, dir, object_entry, &l);
    if (st == CKPTIO_OK && l.nomem) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
    double since = 0;
    bool *dead = young ? ckptio__calloc(l.marks.n + 1, sizeof *dead) : NULL;
    if (st == CKPTIO_OK && young && !dead) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK && young) st = ckptio__dcp_keep_since(engine, dir, l.marks.v, l.marks.n, &since, dead);
    for (size_t i = 0; st == CKPTIO_OK && young && i < out->n; i++) {
        const char *name = out->v[i];
        const double mtime = l.mtimes[i];
        bool keep = since > 0 && (mtime == 0 || mtime >= since);
        if (shared_mark_name(name)) { /* a live one stays, however old its last write */
            keep = true;
            for (size_t k = 0; k < l.marks.n; k++)
                if (!strcmp(l.marks.v[k], name)) keep = !dead[k];
        }
        if (keep && !names_add(young, name)) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
    }
    ckptio__free(dead);
    ckptio__free(l.mtimes);
    names_clear(&l.marks);
    if (keep_since) *keep_since = since;
    if (st != CKPTIO_OK)
        return ckptio__fail(st, __FILE__, __LINE__,
                            &((ckptio__err_ctx){.operation = "listdir", .path = dir, .file_offset = -1,
                                                .verbatim = true}),
                            "%s (looking for files of older saves; %s)", ckptio_last_error_message(),
                            CKPTIO__DCP_COMMITTED);
    if (young) names_sort(young);
    return CKPTIO_OK;
}

/* An engine for the object store's settings (CKPTIO_S3_* from the
 * environment), or NULL for a local directory. */
static ckptio_status object_engine(const char *dir, ckptio_engine **engine) {
    *engine = NULL;
    return ckptio__s3_is_url(dir) ? ckptio_engine_create(engine) : CKPTIO_OK;
}

/* The entries of `dir` (without . and ..). */
static ckptio_status list_dir(ckptio_engine *engine, const char *dir, names *out) {
    if (engine) return list_objects(engine, dir, out, NULL, NULL);
    DIR *d = ckptio__opendir(dir);
    if (!d)
        return CKPTIO_FAIL_SYS_NOTE(errno, "listdir", dir, "looking for files of older saves; %s",
                                    CKPTIO__DCP_COMMITTED);
    ckptio_status st = CKPTIO_OK;
    for (;;) {
        errno = 0;
        const struct dirent *e = readdir(d);
        if (!e) {
            if (errno)
                st = CKPTIO_FAIL_SYS_NOTE(errno, "listdir", dir, "looking for files of older saves; %s",
                                          CKPTIO__DCP_COMMITTED);
            break;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!names_add(out, e->d_name)) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
            break;
        }
    }
    closedir(d);
    return st;
}

/* ---- what the metadata files reference now ------------------------------------------ */

ckptio_status ckptio__dcp_referenced_files(const void *bytes, size_t len, const char *origin, char ***out,
                                           size_t *count) {
    *out = NULL;
    *count = 0;
    ckptio_pickle *p = NULL;
    CKPTIO_FORWARD(ckptio_pickle_parse_dcp_metadata(bytes, len, origin, &p));
    const ckptio_value *root = NULL;
    ckptio_pickle_root(p, &root);
    const ckptio_value *md = ckptio__dcp_fields_of(root, CKPTIO__DCP_MD "Metadata");
    const ckptio_value *sd = md ? ckptio__dcp_dict_get(md, "storage_data") : NULL;
    const ckptio_value_kind kind = ckptio_value_kind_of(sd);
    size_t n = 0;
    char **list = NULL;
    ckptio_status st = CKPTIO_OK;
    const ckptio__err_ctx ctx = {.path = origin, .file_offset = -1, .subject = "storage_data"};
    if (!md)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = origin, .file_offset = -1}),
                             "the pickled object is not a Metadata");
    else if (sd && kind != CKPTIO_VALUE_NONE && (kind != CKPTIO_VALUE_DICT || ckptio_value_len(sd, &n) != CKPTIO_OK))
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "not a dict");
    else if (!(list = ckptio__calloc(n + 1, sizeof *list)))
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    /* Anything but a _StorageInfo with a string relative_path might name a
     * file in some other way: the caller then keeps every file. */
    for (size_t i = 0; st == CKPTIO_OK && i < n; i++) {
        const ckptio_value *k, *v;
        ckptio_value_dict_item(sd, i, &k, &v);
        const ckptio_value *f = ckptio__dcp_fields_of(v, "torch.distributed.checkpoint.filesystem._StorageInfo");
        size_t plen = 0;
        const char *path = f ? ckptio__dcp_str_of(ckptio__dcp_dict_get(f, "relative_path"), &plen) : NULL;
        if (!path || memchr(path, '\0', plen))
            st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "entry %zu is not a _StorageInfo with a relative_path", i);
        else if (!(list[*count] = ckptio__strdup(path)))
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        else
            ++*count;
    }
    ckptio_pickle_close(p);
    if (st != CKPTIO_OK) {
        ckptio_dcp_names_free(list, *count);
        *count = 0;
        return st;
    }
    *out = list;
    return CKPTIO_OK;
}

typedef enum { READ_OK, READ_MISSING, READ_UNREADABLE } read_outcome;

/* The bytes of metadata file `path`. A symlink, FIFO or other non-regular
 * file is READ_UNREADABLE with `why` (never followed or waited on); an I/O
 * error fails (nothing was removed yet). */
static ckptio_status read_metadata_file(ckptio_engine *engine, const char *path, void **data, size_t *len,
                                        read_outcome *outcome, const char **why) {
    static const char what[] = "reading it to find the files it references: nothing was removed; "
                               CKPTIO__DCP_COMMITTED;
    *data = NULL;
    *len = 0;
    *outcome = READ_OK;
    if (engine) { /* an object: no symlinks, no FIFOs */
        ckptio__error_saved *saved = ckptio__error_save();
        const ckptio_status st = ckptio__object_read_all(engine, path, (uint64_t)1 << 31, data, len);
        if (st == CKPTIO_E_NOT_FOUND) {
            ckptio__error_restore(saved);
            *outcome = READ_MISSING;
            return CKPTIO_OK;
        }
        ckptio__free(saved);
        return st;
    }
    struct stat sb;
    mode_t type = 0;
    const int fd = ckptio__open_regular(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW, &sb, &type);
    if (fd < 0 && type) { /* a symlink (never followed), FIFO, device: never opened */
        *outcome = READ_UNREADABLE;
        *why = type == S_IFLNK ? "a symlink" : "not a regular file";
        return CKPTIO_OK;
    }
    if (fd < 0 && errno == ENOENT) {
        *outcome = READ_MISSING;
        return CKPTIO_OK;
    }
    if (fd < 0) return CKPTIO_FAIL_SYS_NOTE(errno, "open", path, "%s", what);
    ckptio_status st = CKPTIO_OK;
    size_t cap = 0;
    char *buf = NULL;
    for (;;) {
        if (*len == cap) {
            cap = cap ? 2 * cap : (size_t)sb.st_size + 4096;
            char *more = ckptio__realloc(buf, cap);
            if (!more) {
                st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading %s", path);
                goto out;
            }
            buf = more;
        }
        const ssize_t n = ckptio__read(fd, buf + *len, cap - *len);
        if (n < 0) {
            st = CKPTIO_FAIL_SYS_NOTE(errno, "read", path, "%s", what);
            goto out;
        }
        if (n == 0) break;
        *len += (size_t)n;
    }
out:
    close(fd);
    if (st != CKPTIO_OK || *outcome != READ_OK) {
        ckptio__free(buf);
        *len = 0;
    } else {
        *data = buf;
    }
    return st;
}

/* Appends "left NAME alone (WHAT)" to the note, after what it holds. */
static void note_left_alone(char *note, size_t cap, const char *dir, const char *name, mode_t mode) {
    if (!note || !cap) return;
    const size_t len = strnlen(note, cap);
    if (len + 1 >= cap) return;
    snprintf(note + len, cap - len, "%s%s: left '%s' alone: %s under a name a DCP writer gives its files, which "
             "are regular files; it is not removed", len ? "; " : "", dir, name,
             S_ISLNK(mode) ? "a symlink" : S_ISDIR(mode) ? "a directory" : "not a regular file");
}

/* The type of `name` in `dir` (lstat: nothing followed); 0 when it is gone or cannot be checked. */
static mode_t entry_type(const char *dir, const char *name) {
    char *path = ckptio__dcp_join(dir, name);
    struct stat sb;
    const mode_t type = path && lstat(path, &sb) == 0 ? (sb.st_mode & S_IFMT) : 0;
    ckptio__free(path);
    return type;
}

static void set_note(char *note, size_t cap, const char *dir, const char *name, const char *why) {
    if (note && cap)
        snprintf(note, cap, "%s: keeping the files of older saves: %s cannot be read (%s); %s", dir, name, why,
                 CKPTIO__DCP_COMMITTED);
}

/* Adds to `out` every data file the metadata files among `entries` reference
 * now. *known = false (and the note says why) when one cannot be read: it
 * might reference any file. */
static ckptio_status referenced_now(ckptio_engine *engine, const char *dir, const names *entries,
                                    const ckptio_dcp_committed *committed, names *out, bool *known, char *note,
                                    size_t note_cap) {
    *known = true;
    for (size_t i = 0; i < entries->n; i++) {
        const char *name = entries->v[i];
        if (!ckptio__dcp_metadata_name(name)) continue;
        char *path = ckptio__dcp_join(dir, name);
        if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        void *data = NULL;
        size_t len = 0;
        read_outcome outcome;
        const char *why = NULL;
        ckptio_status st = read_metadata_file(engine, path, &data, &len, &outcome, &why);
        if (st == CKPTIO_OK && outcome == READ_OK) {
            const bool same = committed && committed->metadata_name && strcmp(name, committed->metadata_name) == 0 &&
                              committed->metadata_len == len &&
                              (len == 0 || memcmp(committed->metadata, data, len) == 0);
            if (same) { /* what this save wrote: no second unpickling */
                for (size_t k = 0; st == CKPTIO_OK && k < committed->nfiles; k++)
                    if (!names_add(out, committed->files[k])) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
            } else {
                char **files = NULL;
                size_t n = 0;
                if (ckptio__dcp_referenced_files(data, len, path, &files, &n) != CKPTIO_OK) {
                    outcome = READ_UNREADABLE;
                    why = ckptio_last_error_message();
                }
                for (size_t k = 0; st == CKPTIO_OK && k < n; k++)
                    if (!names_add(out, files[k])) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
                ckptio_dcp_names_free(files, n);
            }
        }
        if (st == CKPTIO_OK && outcome == READ_UNREADABLE) {
            set_note(note, note_cap, dir, name, why);
            *known = false;
        }
        ckptio__free(data);
        ckptio__free(path);
        if (st != CKPTIO_OK || !*known) return st;
    }
    names_sort(out);
    return CKPTIO_OK;
}

/* ---- what the cleanup of an object directory starts early ------------------------------ */

/* The listing of an object directory and the abort of its old uploads, run
 * on threads of their own beside the .metadata PUT (the lease checked). */
struct ckptio__dcp_prefetch {
    ckptio_engine *engine;
    char *dir;
    pthread_t lister, aborter;
    bool listing, aborting;      /* the thread was started and not joined yet */
    names all, young;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool listed;                 /* the listing is done: keep_since is known (0 when it failed) */
    double keep_since;
    ckptio_status list_st;
    ckptio__error_saved *list_error;
    ckptio_status abort_st;
    ckptio__error_saved *abort_error;
};

static void *prefetch_list(void *arg) {
    ckptio__dcp_prefetch *p = arg;
    double since = 0;
    p->list_st = list_objects(p->engine, p->dir, &p->all, &p->young, &since);
    if (p->list_st != CKPTIO_OK) p->list_error = ckptio__error_save();
    pthread_mutex_lock(&p->mu);
    p->keep_since = p->list_st == CKPTIO_OK ? since : 0;
    p->listed = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static ckptio_status abort_uploads_listed(ckptio_engine *engine, const char *dir, double (*since_fn)(void *),
                                          void *user);

/* The abort's time waits for the directory's listing: an upload a live shared save began before the lease was
 * taken is that save's (its mark says since when). */
static double prefetch_keep_since(void *arg) {
    ckptio__dcp_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->listed) pthread_cond_wait(&p->cv, &p->mu);
    const double since = p->keep_since;
    pthread_mutex_unlock(&p->mu);
    return since;
}

/* The uploads are listed beside the directory's listing, not after it: those the abort may take are older than
 * the time that listing gives, whenever they were listed (an upload begun later is younger; one not listed is
 * kept), so the order of the two listings changes nothing but the round trip. */
static void *prefetch_abort(void *arg) {
    ckptio__dcp_prefetch *p = arg;
    p->abort_st = abort_uploads_listed(p->engine, p->dir, prefetch_keep_since, p);
    if (p->abort_st != CKPTIO_OK) p->abort_error = ckptio__error_save();
    return NULL;
}

ckptio_status ckptio__dcp_prefetch_start(const char *dir, bool abort_uploads, ckptio__dcp_prefetch **out) {
    *out = NULL;
    if (!ckptio__s3_is_url(dir)) return CKPTIO_OK;
    ckptio__dcp_prefetch *p = ckptio__calloc(1, sizeof *p);
    if (!p || !(p->dir = ckptio__strdup(dir))) {
        ckptio__free(p);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    ckptio_status st = ckptio_engine_create(&p->engine);
    if (st != CKPTIO_OK) {
        ckptio__free(p->dir);
        ckptio__free(p);
        return st;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    /* A thread that cannot start leaves its work to the cleanup itself. */
    p->listing = pthread_create(&p->lister, NULL, prefetch_list, p) == 0;
    p->aborting = abort_uploads && p->listing && pthread_create(&p->aborter, NULL, prefetch_abort, p) == 0;
    *out = p;
    return CKPTIO_OK;
}

/* Moves the listing into all and young (sorted as list_objects leaves them). */
static ckptio_status prefetch_take_listing(ckptio__dcp_prefetch *p, names *all, names *young) {
    if (!p->listing && !p->all.v && p->list_st == CKPTIO_OK)
        return list_objects(p->engine, p->dir, all, young, NULL);
    if (p->listing) pthread_join(p->lister, NULL);
    p->listing = false;
    if (p->list_st != CKPTIO_OK) {
        ckptio__error_restore(p->list_error);
        p->list_error = NULL;
        return p->list_st;
    }
    *all = p->all;
    *young = p->young;
    p->all = p->young = (names){0};
    return CKPTIO_OK;
}

/* Waits for the abort; its failure (with its message). */
static ckptio_status prefetch_abort_result(ckptio__dcp_prefetch *p) {
    if (p->aborting) pthread_join(p->aborter, NULL);
    p->aborting = false;
    const ckptio_status st = p->abort_st;
    p->abort_st = CKPTIO_OK;
    if (st != CKPTIO_OK) {
        ckptio__error_restore(p->abort_error);
        p->abort_error = NULL;
    }
    return st;
}

void ckptio__dcp_prefetch_finish(ckptio__dcp_prefetch *p) {
    if (!p) return;
    ckptio__error_saved *kept = ckptio__error_save();
    if (p->listing) pthread_join(p->lister, NULL);
    if (p->aborting) pthread_join(p->aborter, NULL);
    ckptio__free(p->list_error);
    ckptio__free(p->abort_error);
    names_clear(&p->all);
    names_clear(&p->young);
    ckptio_engine_destroy(p->engine);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    ckptio__free(p->dir);
    ckptio__free(p);
    ckptio__error_restore(kept);
}

/* ---- listing ------------------------------------------------------------------------ */

/* The manifests (.ckptio-manifest-TOKEN.json) of the ckptio saves whose
 * data files are among `referenced`: a checkpoint that another metadata
 * file names (a save without collectives beside .metadata) keeps its
 * manifest with its data files. Sorted. */
static ckptio_status manifests_of(const names *referenced, names *out) {
    for (size_t i = 0; i < referenced->n; i++) {
        char name[CKPTIO__DCP_MANIFEST_NAME_SIZE];
        if (ckptio__dcp_manifest_name((const char *const *)&referenced->v[i], 1, name) && !names_add(out, name))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    names_sort(out);
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_stale_files(const char *dir, const char *const *keep, size_t nkeep,
                                     const ckptio_dcp_committed *committed, char ***out, size_t *count, char *note,
                                     size_t note_cap) {
    if (out) *out = NULL;
    if (count) *count = 0;
    if (note && note_cap) note[0] = '\0';
    CKPTIO_RETURN_IF(!dir || !*dir || !out || !count || (!keep && nkeep), CKPTIO_E_INVAL,
                     "ckptio_dcp_stale_files: dir, out and count are required");
    return ckptio__dcp_stale_files_listed(dir, keep, nkeep, committed, NULL, out, count, note, note_cap);
}

ckptio_status ckptio__dcp_stale_files_listed(const char *dir, const char *const *keep, size_t nkeep,
                                             const ckptio_dcp_committed *committed, ckptio__dcp_prefetch *listed,
                                             char ***out, size_t *count, char *note, size_t note_cap) {
    names entries = {0}, kept = {0}, candidates = {0}, referenced = {0}, young = {0};
    ckptio_engine *engine = NULL;
    ckptio_status st = object_engine(dir, &engine);
    if (st == CKPTIO_OK && engine && listed) st = prefetch_take_listing(listed, &entries, &young);
    else if (st == CKPTIO_OK)
        st = engine ? list_objects(engine, dir, &entries, &young, NULL) : list_dir(NULL, dir, &entries);
    for (size_t i = 0; st == CKPTIO_OK && i < nkeep; i++)
        if (!names_add(&kept, keep[i])) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) names_sort(&kept);
    for (size_t i = 0; st == CKPTIO_OK && i < entries.n; i++) {
        const char *name = entries.v[i];
        /* A shared save's mark that lapsed goes too (a live one is among the young). */
        if (names_has(&kept, name) || names_has(&young, name) ||
            !(ckptio__dcp_stale_name(name) || (engine && shared_mark_name(name))))
            continue;
        if (!engine) { /* on a file system (objects are all plain files) */
            const mode_t type = entry_type(dir, name);
            if (!type) continue; /* gone meanwhile */
            if (type != S_IFREG) {
                /* Temporaries that are not regular files are the cleaner's rule to leave (temporaries.c). */
                if (!ckptio__dcp_temporary_name(name)) note_left_alone(note, note_cap, dir, name, type);
                continue;
            }
        }
        if (!names_add(&candidates, name)) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    bool known = true;
    if (st == CKPTIO_OK && candidates.n)
        st = referenced_now(engine, dir, &entries, committed, &referenced, &known, note, note_cap);
    names victims = {0}, tokens = {0};
    if (st == CKPTIO_OK && known) st = manifests_of(&referenced, &tokens);
    for (size_t i = 0; st == CKPTIO_OK && i < candidates.n; i++) {
        const char *name = candidates.v[i];
        /* Not knowing what a metadata file references, only temporaries go. */
        const bool go = known ? !names_has(&referenced, name) && !names_has(&tokens, name)
                              : ckptio__dcp_temporary_name(name);
        if (go && !names_add(&victims, name)) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    if (st == CKPTIO_OK) {
        names_sort(&victims);
        *out = victims.v;
        *count = victims.n;
        if (!victims.v && !(*out = ckptio__calloc(1, sizeof **out))) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    } else {
        names_clear(&victims);
    }
    names_clear(&entries);
    names_clear(&kept);
    names_clear(&candidates);
    names_clear(&referenced);
    names_clear(&tokens);
    names_clear(&young);
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_engine_destroy(engine);
    if (saved) ckptio__error_restore(saved);
    return st;
}

/* ---- removing ----------------------------------------------------------------------- */

/* Unlinks the temporary `path` when no live writer holds it, as
 * ckptio_cleanup_temporaries does: a regular file we can flock, still under
 * its name (a writer holds its flock until it commits or closes; the kernel
 * drops it when the writer dies). Returns 1 when removed, 0 when kept, -1
 * with errno when the unlink failed. */
static int remove_temporary(const char *path) {
    struct stat mine, named;
    mode_t type = 0;
    const int fd = ckptio__open_regular(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW, &mine, &type);
    if (fd < 0) return 0; /* gone, a symlink, a FIFO or device, or not ours to check: keep */
    int ret = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        lstat(path, &named) == 0 && named.st_dev == mine.st_dev && named.st_ino == mine.st_ino)
        ret = ckptio__unlink(path) == 0 ? 1 : -1;
    const int err = errno;
    close(fd); /* after the unlink: the lock covers it */
    errno = err;
    return ret;
}

/* ---- removing objects ---------------------------------------------------------------- */

/* Deletes at once: each is one round trip, so the older save's objects go
 * in the time of a few rather than one after another. */
#define DELETE_THREADS 8

typedef struct object_removal {
    ckptio_engine *engine;
    const char *dir;
    char **urls;
    size_t n;
    atomic_size_t next, removed;
    pthread_mutex_t mu;
    ckptio_status first;            /* the first failed delete, its message in first_error */
    ckptio__error_saved *first_error;
    ckptio_status uploads;          /* aborting the killed saves' uploads, its message in uploads_error */
    ckptio__error_saved *uploads_error;
    ckptio__dcp_prefetch *prefetched; /* the abort runs there already */
} object_removal;

static void *delete_objects(void *arg) {
    object_removal *r = arg;
    for (size_t i; (i = atomic_fetch_add(&r->next, 1)) < r->n;) {
        const ckptio_status st = ckptio__object_remove(r->engine, r->urls[i]);
        if (st == CKPTIO_OK) {
            atomic_fetch_add(&r->removed, 1);
            continue;
        }
        ckptio__fail(st, __FILE__, __LINE__,
                     &((ckptio__err_ctx){.operation = "unlink", .path = r->urls[i], .file_offset = -1,
                                         .verbatim = true}),
                     "%s (removing a file of an older save; %s)", ckptio_last_error_message(), CKPTIO__DCP_COMMITTED);
        pthread_mutex_lock(&r->mu);
        if (r->first == CKPTIO_OK) {
            r->first = st;
            r->first_error = ckptio__error_save();
        }
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

typedef struct since_of {
    double (*fn)(void *);
    void *user;
} since_of;

static double abort_cutoff(void *arg) {
    const since_of *s = arg;
    const double since = s->fn(s->user);
    /* No lease of ckptio's to measure "older" by (or a mark keeps all): none. Strictly before: an upload begun
     * in that second may be the live save's (the server's clock has whole seconds). */
    return since <= 1 ? -1 : since - 1;
}

/* The uploads that killed saves left under the directory (billed, invisible): those begun before the `since`
 * that since_fn(user) gives once they are listed (list_objects' keep_since: the lease now held was taken and no
 * live shared save was marked), whose saves are over. */
static ckptio_status abort_uploads_listed(ckptio_engine *engine, const char *dir, double (*since_fn)(void *),
                                          void *user) {
    ckptio__error_saved *kept = ckptio__error_save();
    char *prefix = ckptio__path_join(dir, ""); /* "DIR/": not DIR2/ too */
    since_of s = {since_fn, user};
    const ckptio_status st = prefix ? ckptio__object_abort_uploads_listed(engine, prefix, abort_cutoff, &s, NULL)
                                    : CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio__free(prefix);
    if (st == CKPTIO_OK) {
        ckptio__error_restore(kept);
        return CKPTIO_OK;
    }
    ckptio__free(kept);
    return ckptio__fail(st, __FILE__, __LINE__,
                        &((ckptio__err_ctx){.operation = "abort uploads", .path = dir, .file_offset = -1,
                                            .verbatim = true}),
                        "%s (aborting the uploads of older saves; %s)", ckptio_last_error_message(),
                        CKPTIO__DCP_COMMITTED);
}

static double known_since(void *arg) { return *(const double *)arg; }

static ckptio_status abort_uploads_before(ckptio_engine *engine, const char *dir, double since) {
    if (since <= 1) return CKPTIO_OK; /* nothing to abort: no request */
    return abort_uploads_listed(engine, dir, known_since, &since);
}

/* abort_uploads_before, its time from the lease held here and the shared
 * saves' marks, listed alone (the listing's prefix is their names': the
 * directory's other objects are not paged through for them); only while this
 * process holds the lease. Without it (a cleanup run after the release) the
 * lease read could be a later save's, taken after a save without a cleanup
 * marked itself and began its uploads unseen by the listing: aborting
 * before that lease's time could end such a live upload. The uploads are
 * left to the next save's cleanup and `ckptio clean`. */
static ckptio_status abort_uploads_now(ckptio_engine *engine, const char *dir) {
    if (!ckptio__dcp_lease_held_here(dir)) return CKPTIO_OK;
    names all = {0};
    object_lister l = {.all = &all};
    double since = 0;
    ckptio__error_saved *kept = ckptio__error_save();
    ckptio_status st = ckptio__object_dir_list_starting(engine, dir, CKPTIO__DCP_SHARED_PREFIX, object_entry, &l);
    if (st == CKPTIO_OK && l.nomem) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
    bool *dead = st == CKPTIO_OK ? ckptio__calloc(l.marks.n + 1, sizeof *dead) : NULL;
    if (st == CKPTIO_OK && !dead) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) st = ckptio__dcp_keep_since(engine, dir, l.marks.v, l.marks.n, &since, dead);
    ckptio__free(dead);
    ckptio__free(l.mtimes);
    names_clear(&l.marks);
    names_clear(&all);
    ckptio__error_restore(kept);
    if (st != CKPTIO_OK) return CKPTIO_OK; /* nothing to measure "older" by: nothing aborted */
    return abort_uploads_before(engine, dir, since);
}

static void *abort_old_uploads(void *arg) {
    object_removal *r = arg;
    if (r->prefetched && r->prefetched->aborting) { /* begun beside the .metadata PUT */
        r->uploads = prefetch_abort_result(r->prefetched);
    } else {
        r->uploads = abort_uploads_now(r->engine, r->dir);
    }
    if (r->uploads != CKPTIO_OK) r->uploads_error = ckptio__error_save();
    return NULL;
}

/* Deletes the objects urls[0..n) (deletes are durable when answered:
 * nothing to fsync) while the directory's old uploads are aborted; the first
 * failed delete is returned, else the abort's failure. */
static ckptio_status remove_objects(ckptio_engine *engine, const char *dir, char **urls, size_t n,
                                    ckptio__dcp_prefetch *prefetched, size_t *removed) {
    object_removal r = {.engine = engine, .dir = dir, .urls = urls, .n = n, .prefetched = prefetched};
    atomic_init(&r.next, 0);
    atomic_init(&r.removed, 0);
    pthread_mutex_init(&r.mu, NULL);
    pthread_t uploads, workers[DELETE_THREADS];
    const bool uploads_thread = pthread_create(&uploads, NULL, abort_old_uploads, &r) == 0;
    size_t started = 0;
    while (started < DELETE_THREADS && started + 1 < n &&
           pthread_create(&workers[started], NULL, delete_objects, &r) == 0)
        started++;
    delete_objects(&r); /* this thread deletes too (all of them when no thread could start) */
    for (size_t i = 0; i < started; i++) pthread_join(workers[i], NULL);
    if (uploads_thread) pthread_join(uploads, NULL);
    else if (r.first == CKPTIO_OK) abort_old_uploads(&r);
    pthread_mutex_destroy(&r.mu);
    *removed = atomic_load(&r.removed);
    if (r.first != CKPTIO_OK) {
        ckptio__free(r.uploads_error);
        ckptio__error_restore(r.first_error);
        return r.first;
    }
    if (r.uploads != CKPTIO_OK) ckptio__error_restore(r.uploads_error);
    return r.uploads;
}

ckptio_status ckptio_dcp_remove_files(const char *dir, const char *const *list, size_t count, unsigned flags,
                                      const ckptio_dcp_committed *committed, size_t *removed_out, char *note,
                                      size_t note_cap) {
    return ckptio__dcp_remove_files_listed(dir, list, count, flags, committed, NULL, removed_out, note, note_cap);
}

ckptio_status ckptio__dcp_remove_files_listed(const char *dir, const char *const *list, size_t count, unsigned flags,
                                              const ckptio_dcp_committed *committed, ckptio__dcp_prefetch *prefetched,
                                              size_t *removed_out, char *note, size_t note_cap) {
    if (removed_out) *removed_out = 0;
    if (note && note_cap) note[0] = '\0';
    CKPTIO_RETURN_IF(!dir || !*dir || (!list && count), CKPTIO_E_INVAL, "ckptio_dcp_remove_files: dir is required");
    CKPTIO_RETURN_IF(flags & ~(unsigned)(CKPTIO_DCP_SYNC | CKPTIO_DCP_RECHECK), CKPTIO_E_INVAL,
                     "ckptio_dcp_remove_files: unknown flags 0x%x", flags);
    for (size_t i = 0; i < count; i++)
        CKPTIO_RETURN_IF(!list[i] || !*list[i] || strchr(list[i], '/'), CKPTIO_E_INVAL,
                         "ckptio_dcp_remove_files: '%s' is not a file name", list[i] ? list[i] : "(null)");
    names referenced = {0};
    bool known = true, recheck = false;
    ckptio_engine *engine = NULL;
    CKPTIO_FORWARD(object_engine(dir, &engine));
    for (size_t i = 0; (flags & CKPTIO_DCP_RECHECK) && i < count; i++)
        if (!ckptio__dcp_temporary_name(list[i])) recheck = true;
    if (recheck) {
        names entries = {0};
        ckptio_status st = list_dir(engine, dir, &entries);
        if (st == CKPTIO_OK) st = referenced_now(engine, dir, &entries, committed, &referenced, &known, note, note_cap);
        names_clear(&entries);
        if (st != CKPTIO_OK) {
            names_clear(&referenced);
            ckptio__error_saved *saved = ckptio__error_save();
            ckptio_engine_destroy(engine);
            ckptio__error_restore(saved);
            return st;
        }
    }
    size_t removed = 0;
    ckptio_status first = CKPTIO_OK;
    names urls = {0}; /* objects: deleted together below (no temporaries there: uploads appear whole) */
    for (size_t i = 0; i < count; i++) {
        const char *name = list[i];
        const bool temporary = ckptio__dcp_temporary_name(name);
        if (recheck && !temporary && (!known || names_has(&referenced, name))) continue;
        char *path = ckptio__dcp_join(dir, name);
        if (!path || (engine && !names_add(&urls, path))) {
            if (first == CKPTIO_OK) first = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
            ckptio__free(path);
            continue;
        }
        if (engine) {
            ckptio__free(path);
            continue;
        }
        struct stat sb;
        int ret = 0;
        if (temporary) ret = remove_temporary(path);
        else if (lstat(path, &sb) != 0) ret = errno == ENOENT ? 0 : -1;
        else if (!S_ISREG(sb.st_mode)) note_left_alone(note, note_cap, dir, name, sb.st_mode);
        else ret = ckptio__unlink(path) == 0 ? 1 : -1;
        if (ret > 0) removed++;
        else if (ret < 0 && errno != ENOENT && first == CKPTIO_OK)
            first = CKPTIO_FAIL_SYS_NOTE(errno, "unlink", path, "removing a file of an older save; %s",
                                         CKPTIO__DCP_COMMITTED);
        ckptio__free(path);
    }
    names_clear(&referenced);
    if (engine) {
        if (first == CKPTIO_OK) first = remove_objects(engine, dir, urls.v, urls.n, prefetched, &removed);
        names_clear(&urls);
        if (removed_out) *removed_out = removed;
        ckptio__error_saved *saved = first != CKPTIO_OK ? ckptio__error_save() : NULL;
        ckptio_engine_destroy(engine);
        if (saved) ckptio__error_restore(saved);
        return first;
    }
    if (removed_out) *removed_out = removed;
    if (removed && (flags & CKPTIO_DCP_SYNC)) {
        /* Also after a failed unlink: what was removed must stay removed. */
        const int err = ckptio__dcp_fsync_dir(dir);
        if (err)
            return CKPTIO_FAIL_SYS_NOTE(err, "fsync", dir,
                                        "flushing the directory after removing %zu files of older saves (a power loss "
                                        "may bring them back); %s",
                                        removed, CKPTIO__DCP_COMMITTED);
    }
    return first;
}
