/*
 * model_dir.c - ckptio_model: a single safetensors file, a Hugging Face
 * directory or its index, opened as one handle (rules in ckptio/model.h and
 * docs/MODELS.md).
 *
 * The index is parsed by src/format/hf_index.c; this file finds it, opens
 * the shards it names (each validated like any safetensors file) and checks
 * that index and shards agree. A shard named by an index or found in a
 * directory must be a regular file inside that directory: its name is plain
 * (checked by the parser), and a symlink must resolve inside the directory
 * unless the caller allows otherwise. After opening, the descriptor's inode
 * is compared with the file that was checked, so a name swapped in between
 * is refused rather than read.
 *
 * Descriptors stay bounded whatever the shard count: a model of more shards
 * than its window keeps none open after its headers are read, and a read
 * reopens them a window at a time (model_read.c); a reopen must find the
 * inode that was checked (docs/MODELS.md "Many shards").
 */
#include "engine_internal.h"
#include "hf_index_internal.h"
#include "io_internal.h"
#include "model_internal.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_INDEX_NAME "model.safetensors.index.json"
#define HF_SINGLE_NAME "model.safetensors"
#define INDEX_SUFFIX ".index.json"
#define SHARD_SUFFIX ".safetensors"
#define LIST_MAX 4 /* names quoted in an error about several files */

static char *join(const char *dir, const char *name) { return ckptio__path_join(dir, name); }

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* ---- shards ------------------------------------------------------------------ */

void ckptio__model_release_shards(const ckptio_model *m, size_t keep) {
    if (!m->fd_window) return;
    for (size_t s = 0; s < m->nshards; s++)
        if (s != keep) ckptio__file_release(m->shards[s]->file);
}

/* Why a shard is opened, for its error messages. */
typedef struct shard_origin {
    const char *dir;          /* the directory it must stay in, or NULL (a file named by the caller) */
    const char *index;        /* the index naming it, or NULL */
    const char *tensor;       /* a tensor the index maps to it (with index) */
} shard_origin;

/* Checks that `path` (a name inside o->dir) is a regular file staying in
 * the directory; *want receives what it resolves to. */
static ckptio_status check_shard_path(const char *path, const char *name, const shard_origin *o, unsigned flags,
                                      struct stat *want) {
    struct stat ls;
    if (lstat(path, &ls) != 0 || (S_ISLNK(ls.st_mode) && stat(path, want) != 0)) {
        const int err = errno;
        if (err == ENOENT && o->index)
            return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND,
                                   &((ckptio__err_ctx){.operation = "open shard", .path = o->index,
                                                       .file_offset = -1, .subject = "weight_map",
                                                       .sys_errno = ENOENT}),
                                   "tensor '%s' is in shard '%s', which is missing from %s", o->tensor, name, o->dir);
        return CKPTIO_FAIL_SYS(err, "stat", path, -1, "opening a shard%s%s", o->index ? " named by " : "",
                               o->index ? o->index : "");
    }
    if (!S_ISLNK(ls.st_mode)) *want = ls;
    if (S_ISLNK(ls.st_mode) && !(flags & CKPTIO_MODEL_ALLOW_SYMLINKS)) {
        char *real = realpath(path, NULL), *base = realpath(o->dir, NULL);
        const size_t blen = base ? strlen(base) : 0;
        const bool inside = real && base && strncmp(real, base, blen) == 0 &&
                            (real[blen] == '/' || (blen == 1 && base[0] == '/'));
        ckptio_status st = CKPTIO_OK;
        if (!real || !base)
            st = CKPTIO_FAIL_SYS(errno, "realpath", path, -1, "resolving a shard that is a symlink");
        else if (!inside)
            st = CKPTIO_FAIL_CTX(CKPTIO_E_DISALLOWED,
                                 &((ckptio__err_ctx){.operation = "open shard", .path = path, .file_offset = -1}),
                                 "shard '%s'%s%s is a symlink to %s, outside %s: a checkpoint may only read its own "
                                 "files (CKPTIO_MODEL_ALLOW_SYMLINKS / allow_symlinks=True for a directory you "
                                 "trust, such as the Hugging Face hub cache)",
                                 name, o->index ? " named by " : "", o->index ? o->index : "", real, base);
        free(real);
        free(base);
        CKPTIO_FORWARD(st);
    }
    if (!S_ISREG(want->st_mode))
        return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                               &((ckptio__err_ctx){.operation = "open shard", .path = path, .file_offset = -1}),
                               "shard '%s' is not a regular file", name);
    return CKPTIO_OK;
}

/* Takes the outcome of opening shard `name` (at `path`, which it keeps
 * or frees) into m->shards[m->nshards]; `want`: what a local shard's name
 * resolved to when it was checked. */
static ckptio_status place_shard(ckptio_model *m, const char *name, const shard_origin *o, char *path,
                                 ckptio_safetensors *st, ckptio_status status, bool local, const struct stat *want) {
    struct stat got;
    if (status == CKPTIO_E_NOT_FOUND && !local && o->dir && o->index) {
        ckptio__free(path);
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND,
                               &((ckptio__err_ctx){.operation = "open shard", .path = o->index, .file_offset = -1,
                                                   .subject = "weight_map"}),
                               "tensor '%s' is in shard '%s', which is missing from %s", o->tensor, name, o->dir);
    }
    if (status != CKPTIO_OK) {
        ckptio__free(path);
        return status;
    }
    m->shard_paths[m->nshards] = path;
    m->shards[m->nshards++] = st;
    if (local && (fstat(st->file->fd, &got) != 0 || got.st_dev != want->st_dev || got.st_ino != want->st_ino))
        return CKPTIO_FAIL_CTX(CKPTIO_E_DISALLOWED,
                               &((ckptio__err_ctx){.operation = "open shard", .path = path, .file_offset = -1}),
                               "shard '%s' was replaced while it was being opened", name);
    /* Past the first window (which a read takes first) the descriptors go:
     * reads reopen them a window at a time. */
    if (m->fd_window && m->nshards > m->fd_window) ckptio__file_release(st->file);
    return CKPTIO_OK;
}

/* Opens shard `name` (a path when o->dir is NULL) into m->shards[m->nshards]. */
static ckptio_status open_shard(ckptio_model *m, const char *name, const shard_origin *o, unsigned flags) {
    char *path = o->dir ? join(o->dir, name) : ckptio__strdup(name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening shard %s", name);
    struct stat want;
    ckptio_safetensors *st = NULL;
    /* An object has no symlinks and no inode: its key is the prefix's and the
     * ETag read at open pins its bytes (ckptio_file_open). */
    const bool local = o->dir && !ckptio__s3_is_url(path);
    ckptio_status status = local ? check_shard_path(path, name, o, flags, &want) : CKPTIO_OK;
    if (status == CKPTIO_OK) status = ckptio_safetensors_open(m->engine, path, &st);
    return place_shard(m, name, o, path, st, status, local, &want);
}

/* Shards of an object prefix open concurrently: each open is the GET of the
 * header (ckptio_safetensors_open), requests that wait on the network, not
 * on this machine, so N shards cost one round trip rather than N before the
 * first byte of data moves. */
typedef struct shard_open {
    const char *name;
    shard_origin origin;
    char *path;
    ckptio_safetensors *st;
    ckptio_status status;
    ckptio__error_saved *error;
} shard_open;

typedef struct shard_opens {
    ckptio_engine *engine;
    shard_open *v;
    size_t n;
    _Atomic size_t next;
} shard_opens;

static void shard_open_worker(void *arg, unsigned index) {
    (void)index;
    shard_opens *j = arg;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;) {
        shard_open *s = &j->v[i];
        s->status = ckptio_safetensors_open(j->engine, s->path, &s->st);
        if (s->status != CKPTIO_OK) s->error = ckptio__error_save();
    }
}

/* Opens the shards `names` of the object prefix `o[i].dir` in that order
 * into m->shards, their requests in flight together (at most the S3
 * concurrency at once). The first failing shard in order gives the error. */
static ckptio_status open_object_shards(ckptio_model *m, const char *const *names, const shard_origin *o,
                                        size_t n) {
    shard_opens j = {.engine = m->engine, .n = n};
    if (!(j.v = ckptio__calloc(n ? n : 1, sizeof *j.v)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %zu shards", n);
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < n && st == CKPTIO_OK; i++) {
        j.v[i] = (shard_open){.name = names[i], .origin = o[i], .path = join(o[i].dir, names[i])};
        if (!j.v[i].path) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening shard %s", names[i]);
    }
    if (st == CKPTIO_OK) {
        const uint64_t c = (uint64_t)ckptio__engine_setting(m->engine, CKPTIO_OPT_S3_CONCURRENCY);
        const unsigned workers = (unsigned)(n < c ? n : c ? c : 1);
        st = ckptio__engine_parallel(m->engine, workers, shard_open_worker, &j);
    }
    for (size_t i = 0; i < n; i++) {
        shard_open *s = &j.v[i];
        if (st == CKPTIO_OK) {
            if (s->error) ckptio__error_restore(s->error);
            s->error = NULL;
            st = place_shard(m, s->name, &s->origin, s->path, s->st, s->status, false, NULL);
        } else {
            ckptio__free(s->error);
            ckptio__free(s->path);
            if (s->st) {
                ckptio__error_saved *saved = ckptio__error_save();
                ckptio_safetensors_close(s->st);
                ckptio__error_restore(saved);
            }
        }
    }
    ckptio__free(j.v);
    return st;
}

static ckptio_status reserve_shards(ckptio_model *m, size_t n) {
    m->fd_window = ckptio__file_window(n);
    m->shard_paths = ckptio__calloc(n ? n : 1, sizeof *m->shard_paths);
    m->shards = ckptio__calloc(n ? n : 1, sizeof *m->shards);
    if (!m->shard_paths || !m->shards) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %zu shards", n);
    return CKPTIO_OK;
}

/* ---- the index ------------------------------------------------------------------ */

/* Reads the index at `path`: its open brings its bytes (in object storage
 * one GET, no HEAD: ckptio__object_read_all). */
static ckptio_status read_index(ckptio_model *m, const char *path, char **text, size_t *len) {
    void *data = NULL;
    const ckptio_status st = ckptio__object_read_all(m->engine, path, CKPTIO__HF_INDEX_MAX_BYTES, &data, len);
    *text = data;
    return st;
}

/* Every index entry is in its shard, and every shard tensor is mapped to
 * its own shard: together, each tensor is in exactly one shard. */
static ckptio_status check_index(const ckptio_model *m, const ckptio__hf_index *x) {
#define IXFAIL(...)                                                                                              \
    CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = m->index_path, .file_offset = -1,             \
                                                         .subject = "weight_map"}),                            \
                    __VA_ARGS__)
    for (size_t i = 0; i < x->count; i++) {
        size_t at;
        if (ckptio_safetensors_find(m->shards[x->entries[i].shard], x->entries[i].name, &at) != CKPTIO_OK)
            return IXFAIL("tensor '%s' is mapped to shard '%s', which does not hold it", x->entries[i].name,
                          x->shards[x->entries[i].shard]);
    }
    for (size_t s = 0; s < m->nshards; s++) {
        const ckptio_safetensors *st = m->shards[s];
        for (size_t t = 0; t < st->count; t++) {
            const char *name = st->tensors[t].name;
            const ckptio__hf_entry *e = ckptio__hf_index_find(x, name);
            if (!e) return IXFAIL("tensor '%s' of shard '%s' is not in the index", name, x->shards[s]);
            if (e->shard != s)
                return IXFAIL("tensor '%s' is in two shards, '%s' and '%s' (the index maps it to '%s')", name,
                              x->shards[s < e->shard ? s : e->shard], x->shards[s < e->shard ? e->shard : s],
                              x->shards[e->shard]);
        }
    }
    return CKPTIO_OK;
#undef IXFAIL
}

/* Opens the index `index` and its shards in `dir`. */
static ckptio_status open_index(ckptio_model *m, const char *dir, const char *index, unsigned flags) {
    char *text = NULL;
    shard_origin *origins = NULL;
    size_t len = 0;
    ckptio__hf_index x;
    memset(&x, 0, sizeof x);
    ckptio_status st = CKPTIO_OK;
    if (!(m->index_path = ckptio__strdup(index))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %s", index);
        goto out;
    }
    if ((st = read_index(m, index, &text, &len)) != CKPTIO_OK) goto out;
    if ((st = ckptio__hf_index_parse(text, len, index, &x)) != CKPTIO_OK) goto out;
    if (x.has_total_size && x.total_size <= INT64_MAX) m->total_size = (int64_t)x.total_size;
    if ((st = reserve_shards(m, x.nshards)) != CKPTIO_OK) goto out;
    if (!(origins = ckptio__calloc(x.nshards ? x.nshards : 1, sizeof *origins))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %zu shards", x.nshards);
        goto out;
    }
    for (size_t i = x.count; i-- > 0;) origins[x.entries[i].shard].tensor = x.entries[i].name; /* the first */
    for (size_t s = 0; s < x.nshards; s++)
        origins[s] = (shard_origin){.dir = dir, .index = index, .tensor = origins[s].tensor ? origins[s].tensor : ""};
    if (ckptio__s3_is_url(dir))
        st = open_object_shards(m, (const char *const *)x.shards, origins, x.nshards);
    for (size_t s = 0; !ckptio__s3_is_url(dir) && s < x.nshards && st == CKPTIO_OK; s++)
        st = open_shard(m, x.shards[s], &origins[s], flags);
    if (st == CKPTIO_OK) st = check_index(m, &x);
out:
    ckptio__free(origins);
    ckptio__free(text);
    ckptio__hf_index_free(&x);
    return st;
}

/* ---- directories ---------------------------------------------------------------- */

typedef struct name_list {
    char **names;
    size_t count, cap;
} name_list;

static void list_free(name_list *l) {
    for (size_t i = 0; i < l->count; i++) ckptio__free(l->names[i]);
    ckptio__free(l->names);
    memset(l, 0, sizeof *l);
}

static ckptio_status list_add(name_list *l, const char *name) {
    if (l->count == l->cap) {
        const size_t cap = l->cap ? l->cap * 2 : 16;
        char **n = ckptio__realloc(l->names, cap * sizeof *n);
        if (!n) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing a directory");
        l->names = n;
        l->cap = cap;
    }
    if (!(l->names[l->count] = ckptio__strdup(name)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing a directory");
    l->count++;
    return CKPTIO_OK;
}

/* "'a', 'b', 'c' and 2 more" */
static void list_text(const name_list *l, char *buf, size_t cap) {
    size_t pos = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < l->count && i < LIST_MAX && pos < cap; i++)
        pos += (size_t)snprintf(buf + pos, cap - pos, "%s'%s'", i ? ", " : "", l->names[i]);
    if (l->count > LIST_MAX && pos < cap) snprintf(buf + pos, cap - pos, " and %zu more", l->count - LIST_MAX);
}

static bool has_entry(const char *dir, const char *name) {
    char *p = join(dir, name);
    struct stat sb;
    const bool yes = p && lstat(p, &sb) == 0;
    ckptio__free(p);
    return yes;
}

/* What a directory holds that open_dir decides by. */
typedef struct dir_view {
    bool any;               /* anything at all under the prefix (objects) */
    bool single, index;     /* model.safetensors, model.safetensors.index.json */
    name_list indexes, files;
} dir_view;

static void view_free(dir_view *v) {
    list_free(&v->indexes);
    list_free(&v->files);
}

/* Hidden files, ckptio temporaries, "." and ".." are no shards or indexes. */
static ckptio_status view_add(dir_view *v, const char *name) {
    if (name[0] == '.') return CKPTIO_OK;
    if (ends_with(name, SHARD_SUFFIX INDEX_SUFFIX)) return list_add(&v->indexes, name);
    if (ends_with(name, SHARD_SUFFIX)) return list_add(&v->files, name);
    return CKPTIO_OK;
}

static ckptio_status view_local(const char *dir, dir_view *v) {
    /* transformers' order: a single model.safetensors first, then its index. */
    if ((v->single = has_entry(dir, HF_SINGLE_NAME))) return CKPTIO_OK;
    v->index = has_entry(dir, HF_INDEX_NAME);
    ckptio_status st = CKPTIO_OK;
    DIR *d = opendir(dir);
    if (!d) return CKPTIO_FAIL_SYS(errno, "opendir", dir, -1, "listing a model directory");
    for (struct dirent *e; st == CKPTIO_OK && (errno = 0, e = readdir(d)) != NULL;) st = view_add(v, e->d_name);
    if (st == CKPTIO_OK && errno) st = CKPTIO_FAIL_SYS(errno, "readdir", dir, -1, "listing a model directory");
    closedir(d);
    return st;
}

typedef struct view_lister {
    dir_view *v;
    ckptio_status st;
} view_lister;

static int view_entry(void *user, const ckptio__object_entry *e) {
    view_lister *l = user;
    l->v->any = true;
    if (e->kind != CKPTIO__PATH_FILE) return 0; /* prefixes and names no file can have: never shards */
    dir_view *v = l->v;
    v->single |= !strcmp(e->name, HF_SINGLE_NAME);
    v->index |= !strcmp(e->name, HF_INDEX_NAME);
    l->st = view_add(v, e->name);
    return l->st != CKPTIO_OK;
}

/* A prefix of an object store: one listing. */
static ckptio_status view_object(ckptio_engine *engine, const char *dir, dir_view *v) {
    view_lister l = {.v = v, .st = CKPTIO_OK};
    CKPTIO_FORWARD(ckptio__object_dir_list(engine, dir, view_entry, &l));
    return l.st;
}

static ckptio_status open_dir(ckptio_model *m, const char *dir, unsigned flags) {
    const shard_origin plain = {.dir = dir};
    const bool object = ckptio__s3_is_url(dir);
    dir_view v = {0};
    ckptio_status st = object ? view_object(m->engine, dir, &v) : view_local(dir, &v);
    char *index = NULL;
    if (st != CKPTIO_OK) goto out;
    if (object && !v.any) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.operation = "open", .path = dir,
                                                                    .file_offset = -1}),
                             "no object of that key and nothing under it as a prefix");
        goto out;
    }
    if (v.single) {
        if ((st = reserve_shards(m, 1)) == CKPTIO_OK) st = open_shard(m, HF_SINGLE_NAME, &plain, flags);
        goto out;
    }
    if (v.indexes.count > 1) qsort(v.indexes.names, v.indexes.count, sizeof *v.indexes.names, cmp_str);
    if (v.files.count > 1) qsort(v.files.names, v.files.count, sizeof *v.files.names, cmp_str);
    char names[600];
    if (v.index || v.indexes.count == 1) {
        const char *name = v.index ? HF_INDEX_NAME : v.indexes.names[0];
        struct stat sb;
        if (!(index = join(dir, name))) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %s", dir);
            goto out;
        }
        /* The index is a file of the directory too: the same rules. */
        if (!object && (st = check_shard_path(index, name, &plain, flags, &sb)) != CKPTIO_OK) goto out;
        st = open_index(m, dir, index, flags);
    } else if (v.indexes.count > 1) {
        list_text(&v.indexes, names, sizeof names);
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "%zu safetensors indexes (%s) and no %s: open one of them", v.indexes.count, names,
                             HF_INDEX_NAME);
    } else if (v.files.count == 0) {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                             "no %s, no *%s%s and no *%s file in the directory", HF_INDEX_NAME, SHARD_SUFFIX,
                             INDEX_SUFFIX, SHARD_SUFFIX);
    } else {
        /* No index: every .safetensors file is a shard; a name in two of
         * them is refused when the table is built. */
        if ((st = reserve_shards(m, v.files.count)) != CKPTIO_OK) goto out;
        shard_origin *origins = object ? ckptio__calloc(v.files.count, sizeof *origins) : NULL;
        for (size_t i = 0; origins && i < v.files.count; i++) origins[i] = plain;
        if (object)
            st = origins ? open_object_shards(m, (const char *const *)v.files.names, origins, v.files.count)
                         : CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %zu shards", v.files.count);
        for (size_t i = 0; !object && st == CKPTIO_OK && i < v.files.count; i++)
            st = open_shard(m, v.files.names[i], &plain, flags);
        ckptio__free(origins);
    }
out:
    ckptio__free(index);
    view_free(&v);
    return st;
}

/* ---- the table ------------------------------------------------------------------- */

static int cmp_by_name(const void *a, const void *b, void *arg) {
    const ckptio_model *m = arg;
    return strcmp(ckptio__model_info(m, *(const size_t *)a)->name, ckptio__model_info(m, *(const size_t *)b)->name);
}

typedef struct meta_item {
    ckptio_kv kv;
    size_t seq;
} meta_item;

static int cmp_meta_key(const void *a, const void *b) {
    const meta_item *x = a, *y = b;
    const int c = strcmp(x->kv.key, y->kv.key);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

static int cmp_meta_seq(const void *a, const void *b) {
    const meta_item *x = a, *y = b;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

/* __metadata__ of all shards, first shard winning (sorting keeps it bounded
 * by n log n whatever the shards hold). */
static ckptio_status merge_metadata(ckptio_model *m) {
    size_t n = 0;
    for (size_t s = 0; s < m->nshards; s++) n += m->shards[s]->metadata_count;
    if (!n) return CKPTIO_OK;
    meta_item *items = ckptio__malloc(n * sizeof *items);
    m->meta = ckptio__malloc(n * sizeof *m->meta);
    if (!items || !m->meta) {
        ckptio__free(items);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory merging the metadata of %zu shards", m->nshards);
    }
    size_t k = 0;
    for (size_t s = 0; s < m->nshards; s++)
        for (size_t i = 0; i < m->shards[s]->metadata_count; i++, k++)
            items[k] = (meta_item){.kv = m->shards[s]->metadata[i], .seq = k};
    qsort(items, n, sizeof *items, cmp_meta_key);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(items[i].kv.key, items[kept - 1].kv.key) != 0) items[kept++] = items[i];
    qsort(items, kept, sizeof *items, cmp_meta_seq);
    for (size_t i = 0; i < kept; i++) m->meta[i] = items[i].kv;
    m->nmeta = kept;
    ckptio__free(items);
    return CKPTIO_OK;
}

static ckptio_status build_table(ckptio_model *m) {
    size_t n = 0;
    for (size_t s = 0; s < m->nshards; s++) n += m->shards[s]->count;
    m->tensors = ckptio__malloc((n ? n : 1) * sizeof *m->tensors);
    m->by_name = ckptio__malloc((n ? n : 1) * sizeof *m->by_name);
    if (!m->tensors || !m->by_name) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory indexing %zu tensors", n);
    for (size_t s = 0; s < m->nshards; s++)
        for (size_t t = 0; t < m->shards[s]->count; t++) {
            m->tensors[m->count] = (ckptio__model_tensor){.shard = s, .local = t};
            m->by_name[m->count] = m->count;
            m->count++;
        }
    /* One shard's names are sorted already (and unique). */
    if (m->nshards == 1) memcpy(m->by_name, m->shards[0]->by_name, n * sizeof *m->by_name);
    else ckptio__sort(m->by_name, n, sizeof *m->by_name, cmp_by_name, m);
    for (size_t i = 1; i < n; i++) {
        const size_t a = m->by_name[i - 1], b = m->by_name[i];
        if (strcmp(ckptio__model_info(m, a)->name, ckptio__model_info(m, b)->name) == 0)
            return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = m->path, .file_offset = -1}),
                                   "tensor '%s' is in two files, %s and %s: without an index each tensor must be in "
                                   "exactly one",
                                   ckptio__model_info(m, a)->name, m->shard_paths[m->tensors[a].shard],
                                   m->shard_paths[m->tensors[b].shard]);
    }
    return merge_metadata(m);
}

/* ---- open / close ------------------------------------------------------------------- */

ckptio_status ckptio_model_open(ckptio_engine *engine, const char *path, unsigned flags, ckptio_model **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_model_open: out must not be NULL");
    *out = NULL;
    if (!engine || !path) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_model_open: engine and path are required");
    if (flags & ~(unsigned)CKPTIO_MODEL_ALLOW_SYMLINKS)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_model_open: unknown flags 0x%x", flags);
    ckptio_model *m = ckptio__calloc(1, sizeof *m);
    if (!m || !(m->path = ckptio__strdup(path))) {
        ckptio__free(m);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %s", path);
    }
    m->engine = engine;
    m->total_size = -1;
    ckptio_status st;
    struct stat sb;
    ckptio__path_kind kind = CKPTIO__PATH_MISSING;
    if (ckptio__s3_is_url(path)) {
        /* An object of that key is a file; anything else is a prefix, whose
         * one listing (open_dir) also tells whether anything is under it. The
         * look is the GET of the object's first bytes, which its open then
         * takes (ckptio__object_peek_first): one request, not a HEAD and a GET. */
        const size_t len = strlen(path);
        kind = CKPTIO__PATH_DIR;
        st = CKPTIO_OK;
        if (path[len - 1] != '/' && strchr(path + 5, '/')) {
            ckptio__error_saved *saved = ckptio__error_save();
            uint64_t got = 0, size = 0;
            st = ckptio__object_peek_first(engine, path, NULL, 0, &got, &size);
            if (st == CKPTIO_OK) kind = CKPTIO__PATH_FILE;
            if (st == CKPTIO_E_NOT_FOUND) {
                ckptio__error_restore(saved);
                st = CKPTIO_OK;
            } else {
                ckptio__free(saved);
            }
        }
        sb.st_mode = kind == CKPTIO__PATH_DIR ? S_IFDIR : S_IFREG;
    } else {
        st = stat(path, &sb) == 0 ? CKPTIO_OK : CKPTIO_FAIL_SYS(errno, "stat", path, -1, "opening a model");
    }
    if (st != CKPTIO_OK) {
        /* the error is set */
    } else if (S_ISDIR(sb.st_mode)) {
        st = open_dir(m, path, flags);
    } else if (ends_with(path, INDEX_SUFFIX)) {
        /* Shards live beside the index. */
        char *dir = ckptio__strdup(path);
        if (!dir) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %s", path);
        } else {
            char *slash = strrchr(dir, '/');
            if (ckptio__s3_is_url(dir) && strchr(dir + 5, '/') == slash) /* "s3://B/x.index.json": the bucket's */
                slash[1] = '\0';
            else if (!slash) strcpy(dir, ".");
            else if (slash == dir) dir[1] = '\0';
            else *slash = '\0';
            st = open_index(m, dir, path, flags);
            ckptio__free(dir);
        }
    } else {
        const shard_origin o = {0};
        st = reserve_shards(m, 1);
        if (st == CKPTIO_OK) st = open_shard(m, path, &o, flags);
    }
    if (st == CKPTIO_OK) st = build_table(m);
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio_model_close(m);
        ckptio__error_restore(saved);
        return st;
    }
    *out = m;
    return CKPTIO_OK;
}

ckptio_status ckptio_model_close(ckptio_model *m) {
    if (!m) return CKPTIO_OK;
    ckptio_status first = CKPTIO_OK;
    for (size_t s = 0; m->shards && s < m->nshards; s++) {
        const ckptio_status st = ckptio_safetensors_close(m->shards[s]);
        if (first == CKPTIO_OK) first = st;
    }
    for (size_t s = 0; m->shard_paths && s < m->nshards; s++) ckptio__free(m->shard_paths[s]);
    ckptio__free(m->shard_paths);
    ckptio__free(m->shards);
    ckptio__free(m->tensors);
    ckptio__free(m->by_name);
    ckptio__free(m->meta);
    ckptio__free(m->index_path);
    ckptio__free(m->path);
    ckptio__free(m);
    return first;
}

/* ---- queries ----------------------------------------------------------------------- */

#define NEED(cond, ...) CKPTIO_RETURN_IF(!(cond), CKPTIO_E_INVAL, __VA_ARGS__)

ckptio_status ckptio_model_count(const ckptio_model *m, size_t *out) {
    NEED(m && out, "ckptio_model_count: model and out are required");
    *out = m->count;
    return CKPTIO_OK;
}

ckptio_status ckptio_model_tensor(const ckptio_model *m, size_t index, ckptio_tensor_info *out, size_t *shard) {
    NEED(m && out, "ckptio_model_tensor: model and out are required");
    CKPTIO_RETURN_IF(index >= m->count, CKPTIO_E_RANGE, "%s: tensor index %zu, the model has %zu tensors", m->path,
                     index, m->count);
    *out = *ckptio__model_info(m, index);
    if (shard) *shard = m->tensors[index].shard;
    return CKPTIO_OK;
}

static int cmp_find(const void *key, const void *elem, void *arg) {
    return strcmp(key, ckptio__model_info(arg, *(const size_t *)elem)->name);
}

ckptio_status ckptio_model_find(const ckptio_model *m, const char *name, size_t *index) {
    NEED(m && name && index, "ckptio_model_find: model, name and index are required");
    size_t lo = 0, hi = m->count;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = cmp_find(name, &m->by_name[mid], (void *)m);
        if (c == 0) {
            *index = m->by_name[mid];
            return CKPTIO_OK;
        }
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = m->path, .file_offset = -1}),
                           "no tensor named '%s'", name);
}

ckptio_status ckptio_model_shard_count(const ckptio_model *m, size_t *out) {
    NEED(m && out, "ckptio_model_shard_count: model and out are required");
    *out = m->nshards;
    return CKPTIO_OK;
}

ckptio_status ckptio_model_shard(const ckptio_model *m, size_t index, const char **path, ckptio_safetensors **st) {
    NEED(m, "ckptio_model_shard: model is NULL");
    CKPTIO_RETURN_IF(index >= m->nshards, CKPTIO_E_RANGE, "%s: shard index %zu, the model has %zu shards", m->path,
                     index, m->nshards);
    if (path) *path = m->shard_paths[index];
    if (st) {
        /* The handle reopens its file when used; the others' descriptors go,
         * so that a loop over every shard's handle holds one at a time. */
        ckptio__model_release_shards(m, index);
        *st = m->shards[index];
    }
    return CKPTIO_OK;
}

ckptio_status ckptio_model_index(const ckptio_model *m, const char **path, int64_t *total_size) {
    NEED(m && path, "ckptio_model_index: model and path are required");
    *path = m->index_path;
    if (total_size) *total_size = m->total_size;
    if (!m->index_path)
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = m->path, .file_offset = -1}),
                               "the model was not opened through an index");
    return CKPTIO_OK;
}

ckptio_status ckptio_model_metadata_count(const ckptio_model *m, size_t *out) {
    NEED(m && out, "ckptio_model_metadata_count: model and out are required");
    *out = m->nmeta;
    return CKPTIO_OK;
}

ckptio_status ckptio_model_metadata(const ckptio_model *m, size_t index, ckptio_kv *out) {
    NEED(m && out, "ckptio_model_metadata: model and out are required");
    CKPTIO_RETURN_IF(index >= m->nmeta, CKPTIO_E_RANGE, "%s: metadata index %zu, the model has %zu pairs", m->path,
                     index, m->nmeta);
    *out = m->meta[index];
    return CKPTIO_OK;
}

ckptio_status ckptio_model_has_metadata(const ckptio_model *m, int *out) {
    NEED(m && out, "ckptio_model_has_metadata: model and out are required");
    *out = 0;
    for (size_t s = 0; s < m->nshards; s++) *out |= m->shards[s]->has_metadata;
    return CKPTIO_OK;
}
