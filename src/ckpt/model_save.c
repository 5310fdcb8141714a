/*
 * model_save.c - ckptio_model_save(): tensors as a Hugging Face directory
 * (sharded safetensors + model.safetensors.index.json), locally or under an
 * s3:// prefix, every shard written in one engine plan.
 *
 * Order: everything that can be checked is checked first (names unique
 * over all shards, each shard's layout, the target holds no older model
 * unless overwriting); every shard is opened (a temporary; an upload) and
 * all their bytes go in ONE plan, so the disk or many multipart uploads
 * stay busy across shard boundaries (object uploads share one bound on
 * their part buffers); then the shards are committed one by one, and only
 * then the index (model_write.c's writer). A failure before the index is
 * written leaves nothing of this save: uncommitted files vanish at close,
 * and a shard whose commit began is deleted when its name is this save's
 * alone (new in the directory, or renamed into place by its commit): a
 * name that held an older file before keeps it when the commit did not get
 * that far. Once the index's write began nothing is rolled back unless its
 * name shows the write did not land (empty, or still the older index's
 * file): the index may already name the new shards (its rename done, the
 * directory's fsync failed). The older model's files that go after the
 * index go one by one, its index first, each failure reported after the
 * rest were tried.
 */
#include "convert_internal.h"
#include "dcp_commit_internal.h"
#include "engine_internal.h"
#include "io_internal.h"
#include "safetensors_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define HF_DEFAULT_SHARD ((uint64_t)5000000000u) /* "5GB", huggingface_hub's default */
#define DIR_FAIL(status, dir, ...) \
    CKPTIO_FAIL_CTX((status), &((ckptio__err_ctx){.path = (dir), .file_offset = -1}), __VA_ARGS__)

/* A file of the Hugging Face layout this save writes: model.safetensors,
 * its index, or model-NNNNN-of-NNNNN.safetensors (huggingface_hub's pattern). */
static bool model_file_name(const char *n) {
    if (strcmp(n, CKPTIO__HF_SINGLE_NAME) == 0 || strcmp(n, CKPTIO__HF_INDEX_NAME) == 0) return true;
    if (strlen(n) != strlen("model-00001-of-00001.safetensors") || strncmp(n, "model-", 6) != 0 ||
        strncmp(n + 11, "-of-", 4) != 0 || strcmp(n + 20, ".safetensors") != 0)
        return false;
    for (int i = 0; i < 5; i++)
        if (n[6 + i] < '0' || n[6 + i] > '9' || n[15 + i] < '0' || n[15 + i] > '9') return false;
    return true;
}

typedef struct old_files {
    char (*names)[64];
    size_t count, cap;
    bool failed;
    bool index_known;       /* local: the older index's identity below */
    dev_t index_dev;
    ino_t index_ino;
} old_files;

static void old_add(old_files *o, const char *name) {
    if (!model_file_name(name) || o->failed) return;
    if (o->count == o->cap) {
        const size_t cap = o->cap ? 2 * o->cap : 8;
        char(*n)[64] = ckptio__realloc(o->names, cap * sizeof *n);
        if (!n) {
            o->failed = true;
            return;
        }
        o->names = n;
        o->cap = cap;
    }
    snprintf(o->names[o->count++], 64, "%s", name);
}

static int old_entry(void *user, const ckptio__object_entry *e) {
    if (e->kind == CKPTIO__PATH_FILE) old_add(user, e->name);
    return 0;
}

static bool old_has(const old_files *o, const char *name) {
    for (size_t i = 0; i < o->count; i++)
        if (strcmp(o->names[i], name) == 0) return true;
    return false;
}

/* mkdir -p: the directory and its missing parents (0777 & ~umask). */
static ckptio_status make_dirs(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return DIR_FAIL(CKPTIO_E_INVAL, dir, "path too long");
    for (char *s = p + 1;; s++) {
        const bool end = *s == '\0';
        if (*s == '/' || end) {
            *s = '\0';
            struct stat sb;
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return CKPTIO_FAIL_SYS(errno, "mkdir", p, -1, "creating the directory to save the model in");
            if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
                return DIR_FAIL(CKPTIO_E_EXISTS, p, "exists and is not a directory; the model is saved as a "
                                "directory (nothing was written)");
            if (end) break;
            *s = '/';
        }
    }
    return CKPTIO_OK;
}

/* The model files already in `dir`. */
static ckptio_status list_old(ckptio_engine *engine, const char *dir, bool object, old_files *o) {
    if (object) {
        ckptio__path_kind kind = CKPTIO__PATH_MISSING;
        CKPTIO_FORWARD(ckptio__object_stat(engine, dir, &kind, NULL));
        if (kind == CKPTIO__PATH_FILE)
            return DIR_FAIL(CKPTIO_E_EXISTS, dir, "is an object; the model is saved as a directory (a prefix): "
                            "remove it or give another name (nothing was written)");
        CKPTIO_FORWARD(ckptio__object_dir_list(engine, dir, old_entry, o));
    } else {
        CKPTIO_FORWARD(make_dirs(dir));
        DIR *d = opendir(dir);
        if (!d) return CKPTIO_FAIL_SYS(errno, "opendir", dir, -1, "cannot read the directory to save the model in");
        const struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            /* Files only (a symlink is removed as a link): a directory or FIFO named like a shard is not a
             * model's, and is neither reported nor removed. */
            struct stat sb;
            if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
                (S_ISREG(sb.st_mode) || S_ISLNK(sb.st_mode))) {
                old_add(o, e->d_name);
                if (strcmp(e->d_name, CKPTIO__HF_INDEX_NAME) == 0)
                    o->index_known = true, o->index_dev = sb.st_dev, o->index_ino = sb.st_ino;
            }
        }
        closedir(d);
    }
    return o->failed ? CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir) : CKPTIO_OK;
}

static ckptio_status remove_file(ckptio_engine *engine, const char *dir, const char *name, bool object) {
    char *path = ckptio__path_join(dir, name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    if (object) st = ckptio__object_remove(engine, path);
    else if (ckptio__unlink(path) != 0 && errno != ENOENT)
        st = CKPTIO_FAIL_SYS(errno, "unlink", path, -1, "removing a file of the older model");
    ckptio__free(path);
    return st;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Names are unique over the whole model (each shard's layout checks its own). */
static ckptio_status check_unique(const ckptio_tensor_source *tensors, size_t count, const char *dir) {
    const char **names = ckptio__calloc(count + 1, sizeof *names);
    if (!names) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu names", count);
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < count && st == CKPTIO_OK; i++) {
        if (!tensors[i].name) st = DIR_FAIL(CKPTIO_E_INVAL, dir, "tensor %zu has no name", i);
        names[i] = tensors[i].name;
    }
    if (st == CKPTIO_OK) qsort(names, count, sizeof *names, cmp_name);
    for (size_t i = 1; i < count && st == CKPTIO_OK; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = dir, .subject = names[i],
                                                                     .file_offset = -1}),
                                 "two tensors are named '%s'", names[i]);
    ckptio__free(names);
    return st;
}

/* One shard being written. */
typedef struct shard {
    ckptio_tensor_source *sub; /* its tensors, in the caller's order */
    size_t n;
    ckptio__st_layout layout;
    ckptio_file *file;
    char *path;
    bool committed;            /* its commit was attempted: the final name may be this save's */
    bool file_committed;       /* its commit renamed it into place (or completed its upload) */
} shard;

typedef struct save {
    ckptio_engine *engine;
    const char *dir;
    bool object;
    ckptio__hf_layout hf;
    shard *shards;
    ckptio_kv *meta; /* a shard's __metadata__: format, then (one shard) the caller's pairs */
    size_t nmeta;
    bool index_attempted;      /* the index's write began */
    bool old_index_removed;    /* the older model's index went before the first shard of its names */
} save;

static ckptio_status shard_metadata(save *s, const ckptio_model_save_options *o) {
    if (!(s->meta = ckptio__calloc(o->metadata_count + 2, sizeof *s->meta)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the metadata");
    bool caller_format = false;
    for (size_t i = 0; i < o->metadata_count; i++) {
        CKPTIO_RETURN_IF(!o->metadata[i].key || !o->metadata[i].value, CKPTIO_E_INVAL,
                         "%s: metadata pair %zu has no key or no value", s->dir, i);
        caller_format |= strcmp(o->metadata[i].key, "format") == 0;
    }
    const bool one = s->hf.nshards == 1;
    if (!(one && caller_format)) s->meta[s->nmeta++] = (ckptio_kv){"format", "pt"};
    for (size_t i = 0; one && i < o->metadata_count; i++) s->meta[s->nmeta++] = o->metadata[i];
    return CKPTIO_OK;
}

/* Lays out every shard (names, dtypes and sizes checked before the target is looked at). */
static ckptio_status layout_shards(save *s, const ckptio_tensor_source *tensors, size_t count) {
    for (size_t k = 0; k < s->hf.nshards; k++) {
        shard *sh = &s->shards[k];
        if (!(sh->sub = ckptio__calloc(count + 1, sizeof *sh->sub)) ||
            !(sh->path = ckptio__path_join(s->dir, s->hf.names[k])))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory laying out the shards");
        for (size_t i = 0; i < count; i++)
            if (s->hf.shard_of[i] == k) sh->sub[sh->n++] = tensors[i];
        CKPTIO_FORWARD(ckptio__st_layout_build(sh->sub, sh->n, s->meta, s->nmeta, 0, sh->path, &sh->layout));
    }
    return CKPTIO_OK;
}

/* Opens every shard's file (a temporary; an upload), object uploads sharing one bound on their buffers. */
static ckptio_status open_shards(save *s) {
    for (size_t k = 0; k < s->hf.nshards; k++) {
        shard *sh = &s->shards[k];
        CKPTIO_FORWARD(ckptio_file_open(s->engine, sh->path, CKPTIO_OPEN_WRITE, &sh->file));
        CKPTIO_FORWARD(ckptio_file_truncate(sh->file, sh->layout.header_size + sh->layout.data_size));
    }
    if (!s->object) return CKPTIO_OK;
    ckptio_file **files = ckptio__calloc(s->hf.nshards, sizeof *files);
    if (!files) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    for (size_t k = 0; k < s->hf.nshards; k++) files[k] = s->shards[k].file;
    uint64_t bound;
    const ckptio_status st = ckptio__object_share_buffers(files, s->hf.nshards, &bound);
    ckptio__free(files);
    return st;
}

/* Every shard's header and tensors in one plan. */
static ckptio_status write_shards(save *s, size_t count) {
    ckptio_extent *x = ckptio__calloc(count + s->hf.nshards, sizeof *x);
    if (!x) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu tensor writes", count);
    size_t n = 0;
    for (size_t k = 0; k < s->hf.nshards; k++) {
        const shard *sh = &s->shards[k];
        x[n++] = (ckptio_extent){.file = sh->file, .file_offset = 0, .length = sh->layout.header_size,
                                 .memory = sh->layout.header, .mem_kind = CKPTIO_MEM_HOST};
        for (size_t i = 0; i < sh->n; i++)
            if (sh->sub[i].nbytes)
                x[n++] = (ckptio_extent){.file = sh->file,
                                         .file_offset = sh->layout.header_size + sh->layout.offsets[i],
                                         .length = sh->sub[i].nbytes, .memory = (void *)sh->sub[i].data,
                                         .mem_kind = sh->sub[i].mem_kind};
    }
    const ckptio_status st = ckptio_engine_execute_extents(s->engine, CKPTIO_WRITE, x, n);
    ckptio__free(x);
    return st;
}

/* Object shards are committed together: each commit waits for its last parts and sends its complete
 * request, and one after another those round trips would add up. A thread per shard (COMMIT_BATCH at
 * a time); the calling thread polls the engine's progress callback meanwhile and stops them on cancel. */
enum { COMMIT_BATCH = 16 };

typedef struct committer {
    ckptio_file *file;
    atomic_int *stop;
    atomic_int *running;
    ckptio_status st;
    ckptio__error_saved *error;
    pthread_t thread;
    bool started;
} committer;

static ckptio_status stopped(void *user) {
    return atomic_load((atomic_int *)user)
               ? CKPTIO_FAIL(CKPTIO_E_CANCELED, "the save was canceled while its shards were being committed")
               : CKPTIO_OK;
}

static void *commit_one(void *arg) {
    committer *c = arg;
    c->st = ckptio__object_commit_polled(c->file, stopped, c->stop);
    if (c->st != CKPTIO_OK) c->error = ckptio__error_save();
    atomic_fetch_sub(c->running, 1);
    return NULL;
}

static ckptio_status commit_objects(save *s, size_t first, size_t n) {
    committer c[COMMIT_BATCH] = {0};
    atomic_int stop = 0, running = 0;
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < n; i++) {
        c[i] = (committer){.file = s->shards[first + i].file, .stop = &stop, .running = &running};
        s->shards[first + i].committed = true; /* its name may be taken from here on */
        atomic_fetch_add(&running, 1);
        const int err = pthread_create(&c[i].thread, NULL, commit_one, &c[i]);
        if (err) {
            atomic_fetch_sub(&running, 1);
            st = CKPTIO_FAIL_SYS(err, "pthread_create", s->dir, -1, "starting the commits of the shards");
            atomic_store(&stop, 1);
            break;
        }
        c[i].started = true;
    }
    while (atomic_load(&running) > 0) {
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
        if (st == CKPTIO_OK && (st = ckptio__engine_commit_poll(s->engine)) != CKPTIO_OK) atomic_store(&stop, 1);
    }
    for (size_t i = 0; i < n; i++) {
        if (!c[i].started) continue;
        pthread_join(c[i].thread, NULL);
        if (st == CKPTIO_OK && c[i].st != CKPTIO_OK) {
            st = c[i].st;
            ckptio__error_restore(c[i].error);
        } else if (c[i].error) {
            ckptio__free(c[i].error);
        }
    }
    return st;
}

/* Commits the shards, writes the index, and (overwriting) removes the older model's other files. */
static ckptio_status publish(save *s, const ckptio_tensor_source *tensors, size_t count,
                             const ckptio_model_save_options *o, const old_files *old) {
    bool collides = false;
    for (size_t k = 0; k < s->hf.nshards; k++) collides |= old_has(old, s->hf.names[k]);
    /* An old index must not name a mix of old and new shards: it goes before the first shard of its names. */
    if (collides && old_has(old, CKPTIO__HF_INDEX_NAME)) {
        CKPTIO_FORWARD(remove_file(s->engine, s->dir, CKPTIO__HF_INDEX_NAME, s->object));
        s->old_index_removed = true;
    }
    for (size_t k = 0; s->object && k < s->hf.nshards; k += COMMIT_BATCH)
        CKPTIO_FORWARD(commit_objects(s, k, s->hf.nshards - k < COMMIT_BATCH ? s->hf.nshards - k : COMMIT_BATCH));
    for (size_t k = 0; !s->object && k < s->hf.nshards; k++) {
        /* Its name may be taken from here on, even when the commit fails after the rename (syncing the directory). */
        s->shards[k].committed = true;
        CKPTIO_FORWARD(ckptio_file_commit(s->shards[k].file));
    }
    const unsigned sync = ckptio__engine_setting(s->engine, CKPTIO_OPT_SYNC) ? CKPTIO_DCP_SYNC : 0;
    s->index_attempted = true;
    if (s->hf.nshards > 1)
        CKPTIO_FORWARD(ckptio__hf_index_write(s->dir, &s->hf, tensors, count, o->metadata, o->metadata_count, sync));
    /* The older model's other files: its index first (one naming removed shards must not outlive them), each
     * tried whatever the others gave, the first failure reported. */
    ckptio_status st = CKPTIO_OK;
    ckptio__error_saved *first = NULL;
    for (int index_pass = 1; index_pass >= 0; index_pass--) {
        for (size_t i = 0; i < old->count; i++) {
            const bool is_index = strcmp(old->names[i], CKPTIO__HF_INDEX_NAME) == 0;
            if (is_index != (index_pass == 1) || (is_index && s->hf.nshards > 1)) continue;
            bool kept = false;
            for (size_t k = 0; k < s->hf.nshards && !kept; k++) kept = strcmp(old->names[i], s->hf.names[k]) == 0;
            if (kept) continue;
            const ckptio_status r = remove_file(s->engine, s->dir, old->names[i], s->object);
            if (st == CKPTIO_OK && r != CKPTIO_OK) {
                st = r;
                first = ckptio__error_save();
            }
        }
    }
    if (first) ckptio__error_restore(first);
    return st;
}

/* After a failed save whose index write began: whether the index's name may hold this save's index (its
 * rename done, the directory's fsync failed; a PUT whose answer was lost), in which case nothing is rolled
 * back. Not when the name is empty, or (locally) still the older index's file. Unsure (a failed check, an
 * older index in object storage that stayed in place): yes, so nothing is deleted. */
static bool index_may_be_new(const save *s, const old_files *old) {
    if (!s->index_attempted) return false;
    if (s->hf.nshards < 2) return true; /* the model is its one shard, whose commit came before */
    char *path = ckptio__path_join(s->dir, CKPTIO__HF_INDEX_NAME);
    if (!path) return true;
    bool maybe = true;
    if (s->object) {
        ckptio__path_kind kind = CKPTIO__PATH_FILE;
        maybe = !(ckptio__object_stat(s->engine, path, &kind, NULL) == CKPTIO_OK && kind == CKPTIO__PATH_MISSING);
    } else {
        struct stat sb;
        if (lstat(path, &sb) != 0)
            maybe = errno != ENOENT;
        else if (old->index_known && !s->old_index_removed)
            maybe = !(sb.st_dev == old->index_dev && sb.st_ino == old->index_ino);
    }
    ckptio__free(path);
    return maybe;
}

ckptio_status ckptio_model_save(ckptio_engine *engine, const char *dir, const ckptio_tensor_source *tensors,
                                size_t count, const ckptio_model_save_options *options, size_t *nshards) {
    CKPTIO_RETURN_IF(!engine || !dir || !*dir || (count && !tensors), CKPTIO_E_INVAL,
                     "ckptio_model_save: engine, directory and tensors are required");
    const ckptio_model_save_options defaults = {0};
    const ckptio_model_save_options *o = options ? options : &defaults;
    CKPTIO_RETURN_IF(o->flags & ~(unsigned)CKPTIO_MODEL_SAVE_OVERWRITE, CKPTIO_E_INVAL,
                     "ckptio_model_save: unknown flags 0x%x", o->flags & ~(unsigned)CKPTIO_MODEL_SAVE_OVERWRITE);
    CKPTIO_RETURN_IF(o->metadata_count && !o->metadata, CKPTIO_E_INVAL,
                     "ckptio_model_save: metadata_count is %zu but metadata is NULL", o->metadata_count);
    char path[4096];
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* "dir/" names the directory "dir" */
    if (len >= sizeof path) return DIR_FAIL(CKPTIO_E_INVAL, dir, "path too long");
    memcpy(path, dir, len);
    path[len] = '\0';
    save s = {.engine = engine, .dir = path, .object = ckptio__s3_is_url(path)};
    old_files old = {0};
    ckptio_status st = ckptio__hf_layout_make(tensors, count, o->max_shard_size ? o->max_shard_size : HF_DEFAULT_SHARD,
                                              &s.hf);
    if (st != CKPTIO_OK) goto out;
    if (!(s.shards = ckptio__calloc(s.hf.nshards, sizeof *s.shards))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu shards", s.hf.nshards);
        goto out;
    }
    if ((st = check_unique(tensors, count, path)) != CKPTIO_OK || (st = shard_metadata(&s, o)) != CKPTIO_OK)
        goto out;
    if ((st = layout_shards(&s, tensors, count)) != CKPTIO_OK) goto out;
    if ((st = list_old(engine, path, s.object, &old)) != CKPTIO_OK) goto out;
    if (old.count && !(o->flags & CKPTIO_MODEL_SAVE_OVERWRITE)) {
        st = DIR_FAIL(CKPTIO_E_EXISTS, path, "already holds a model (%s): replace it with overwrite=True "
                      "(CKPTIO_MODEL_SAVE_OVERWRITE), or give another directory (nothing was written)", old.names[0]);
        goto out;
    }
    if ((st = open_shards(&s)) != CKPTIO_OK) goto out;
    if ((st = write_shards(&s, count)) != CKPTIO_OK) goto out;
    st = publish(&s, tensors, count, o, &old);
    if (st == CKPTIO_OK && nshards) *nshards = s.hf.nshards;
out:;
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    const bool roll_back = st != CKPTIO_OK && !index_may_be_new(&s, &old);
    for (size_t k = 0; s.shards && k < s.hf.nshards; k++) {
        shard *sh = &s.shards[k];
        /* Without a commit, close removes the temporary or aborts the upload. */
        if (sh->file) {
            sh->file_committed = sh->file->committed;
            ckptio_file_close(sh->file);
        }
        /* Rolled back before the index only, and only a name this save made its own: new here, or renamed
         * into place by its commit (an older file under that name otherwise stays). */
        if (roll_back && sh->committed && (sh->file_committed || !old_has(&old, s.hf.names[k])))
            remove_file(engine, path, s.hf.names[k], s.object);
        ckptio__st_layout_cleanup(&sh->layout);
        ckptio__free(sh->sub);
        ckptio__free(sh->path);
    }
    if (saved) ckptio__error_restore(saved);
    ckptio__free(s.shards);
    ckptio__free(s.meta);
    ckptio__free(old.names);
    ckptio__hf_layout_free(&s.hf);
    return st;
}
