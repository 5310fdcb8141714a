/*
 * manifest_save.c - the end of a safetensors save: the data plan, checksums
 * of every tensor, and the commit order that keeps a manifest from ever
 * describing data it was not made for.
 *
 * Commit order (each step durable before the next when CKPTIO_OPT_SYNC):
 *   1. data written to its temporary; the manifest to its own temporary;
 *   2. an old NAME.ckptio-manifest.json is unlinked, directory fsynced;
 *   3. data: fsync, rename over NAME, directory fsync (ckptio_file_commit);
 *   4. manifest: fsync, rename, directory fsync.
 * A crash between 2 and 4 leaves NAME (old or new) without a manifest:
 * verification then says "no manifest", never "corrupt". Writing the
 * manifest first instead would leave a new manifest over old data.
 *
 * The order holds for one writer. Two saves of one path at once (every
 * DDP rank saving the same file) interleave their steps and can leave
 * save A's data beside save B's manifest, of the same layout when the
 * code is the same. So each save puts a random save id into both (the
 * header's __metadata__ and the manifest): verification reports a
 * manifest whose id is not the data's as stale (CKPTIO_E_STALE), never
 * its blocks as corrupt. Verifying while a save replaces the file meets
 * the same pairs and gets the same answer.
 *
 * Hashing costs no save time for host memory: one helper thread hashes
 * (XXH3 on one core is several times faster than any disk:
 * docs/RELIABILITY.md#4-integrity-checksums) while the engine writes the
 * same, read-only, bytes. GPU memory is hashed on the
 * pinned staging copies by the data plan's observer
 * (ckptio__plan_set_observer with the manifest's block size), as the bytes
 * pass to the file: no second pass over the device or the disk. Only a
 * block the observer could not see whole (staging too small to hold a block
 * plus 4 KiB) is hashed by reading it back from the temporary.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "io_internal.h"
#include "manifest_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "xxh3_fast.h"

typedef struct hash_job {
    const unsigned char *data; /* host bytes of one block */
    uint64_t len;
    uint64_t *out;
} hash_job;

typedef struct hash_work {
    hash_job *jobs;
    size_t njobs;
    ckptio_status status;          /* the first failure (a mapped source truncated) */
    ckptio__error_saved *failure;  /* its message, taken on the hashing thread */
} hash_work;

/* GPU tensors: hashes of whole blocks as the data plan's observer sees them. */
typedef struct gpu_hash {
    ckptio__manifest *m;
    size_t *plan_tensor;    /* per plan extent: GPU tensor index, or SIZE_MAX */
    unsigned char **seen;   /* per tensor (GPU only): 1 per block hashed whole */
} gpu_hash;

static void gpu_observe(void *user, size_t extent, uint64_t offset, const void *bytes, uint64_t len) {
    gpu_hash *g = user;
    const size_t i = g->plan_tensor[extent];
    if (i == SIZE_MAX) return;
    ckptio__manifest_tensor *t = &g->m->tensors[i];
    const uint64_t bb = g->m->block_bytes;
    const size_t b = (size_t)(offset / bb);
    const uint64_t want = t->nbytes - (uint64_t)b * bb < bb ? t->nbytes - (uint64_t)b * bb : bb;
    /* A piece of a block: left to the read-back after the plan. Distinct
     * blocks are distinct memory, so whole-block calls never race. */
    if (offset % bb != 0 || len != want) return;
    t->blocks[b] = XXH3_64bits(bytes, (size_t)len);
    g->seen[i][b] = 1;
}

static void hash_job_run(void *arg) {
    hash_job *j = arg;
    *j->out = XXH3_64bits(j->data, (size_t)j->len);
}

/* Host blocks are the caller's memory, which may be a mapped file: guarded. */
static void *hash_thread(void *arg) {
    hash_work *w = arg;
    for (size_t i = 0; i < w->njobs && w->status == CKPTIO_OK; i++) {
        w->status = ckptio__guarded_call(hash_job_run, &w->jobs[i], w->jobs[i].data, w->jobs[i].len,
                                         "the checksums of a tensor");
        if (w->status != CKPTIO_OK) w->failure = ckptio__error_save();
    }
    return NULL;
}

static bool is_host(const ckptio_extent *x) {
    const ckptio_mem_kind kind = x->mem_kind == CKPTIO_MEM_AUTO ? ckptio__gpu_classify(x->memory) : x->mem_kind;
    return kind == CKPTIO_MEM_HOST || kind == CKPTIO_MEM_PINNED;
}

/* fsync of a directory after `removed` was unlinked from it, with the
 * injectable fault of every other fsync. */
static ckptio_status fsync_dir(const char *dir, const char *removed) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return CKPTIO_FAIL_SYS(errno, "open", dir, -1, "opening the directory to fsync it after removing %s", removed);
    const int ret = ckptio__fsync(fd);
    const int err = errno;
    close(fd);
    if (ret < 0) return CKPTIO_FAIL_SYS(err, "fsync", dir, -1, "flushing the directory after removing %s", removed);
    return CKPTIO_OK;
}

void ckptio__manifest_new_save_id(char out[CKPTIO__SAVE_ID_HEX + 1]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char bytes[CKPTIO__SAVE_ID_HEX / 2];
    ckptio__random_bytes(bytes, sizeof bytes);
    for (size_t i = 0; i < sizeof bytes; i++) {
        out[2 * i] = hex[bytes[i] >> 4];
        out[2 * i + 1] = hex[bytes[i] & 15];
    }
    out[CKPTIO__SAVE_ID_HEX] = '\0';
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return ckptio__strdup(".");
    const size_t n = slash == path ? 1 : (size_t)(slash - path);
    char *dir = ckptio__malloc(n + 1);
    if (dir) {
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    return dir;
}

/* Step 2: an old manifest goes before the data changes. */
static ckptio_status remove_old_manifest(ckptio_engine *engine, const char *mpath, const char *path) {
    if (unlink(mpath) < 0) {
        if (errno == ENOENT) return CKPTIO_OK;
        return CKPTIO_FAIL_SYS(errno, "unlink", mpath, -1, "removing the manifest of the previous %s", path);
    }
    if (!ckptio__engine_setting(engine, CKPTIO_OPT_SYNC)) return CKPTIO_OK;
    char *dir = dir_of(path);
    if (!dir) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory", path);
    ckptio_status st = fsync_dir(dir, mpath);
    ckptio__free(dir);
    return st;
}

/* The data plan; with `g`, GPU tensors (extents 1..) are hashed by its observer. */
static ckptio_status run_plan(ckptio_engine *engine, const ckptio_extent *extents, size_t n, gpu_hash *g) {
    ckptio_plan *plan = NULL;
    ckptio_status st = ckptio_plan_create(CKPTIO_WRITE, &plan);
    size_t k = 0;
    for (size_t i = 0; st == CKPTIO_OK && i < n; i++) {
        if (!extents[i].length) continue;
        if (g) g->plan_tensor[k] = i > 0 && g->seen[i - 1] ? i - 1 : SIZE_MAX;
        k++;
        st = ckptio_plan_add(plan, &extents[i]);
    }
    if (st == CKPTIO_OK && g) st = ckptio__plan_set_observer(plan, gpu_observe, g, g->m->block_bytes);
    if (st == CKPTIO_OK) st = ckptio_engine_execute(engine, plan);
    ckptio_plan_destroy(plan);
    return st;
}

/* Sets up `g` when some tensor is not in host memory; g->seen stays NULL
 * (no observer needed) otherwise. */
static ckptio_status gpu_hash_init(gpu_hash *g, const ckptio_extent *extents, ckptio__manifest *m, const char *path) {
    bool any = false;
    for (size_t i = 0; i < m->count; i++) any |= !is_host(&extents[i + 1]) && m->tensors[i].nblocks;
    if (!any) return CKPTIO_OK;
    g->m = m;
    g->plan_tensor = ckptio__calloc(m->count + 1, sizeof *g->plan_tensor);
    g->seen = ckptio__calloc(m->count ? m->count : 1, sizeof *g->seen);
    if (!g->plan_tensor || !g->seen) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for GPU hashing", path);
    for (size_t i = 0; i < m->count; i++) {
        if (is_host(&extents[i + 1]) || !m->tensors[i].nblocks) continue;
        if (!(g->seen[i] = ckptio__calloc(m->tensors[i].nblocks, 1)))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for GPU hashing", path);
    }
    return CKPTIO_OK;
}

static void gpu_hash_cleanup(gpu_hash *g) {
    if (g->seen)
        for (size_t i = 0; i < g->m->count; i++) ckptio__free(g->seen[i]);
    ckptio__free(g->seen);
    ckptio__free(g->plan_tensor);
}

/* Fills m (everything but the block hashes) and the jobs for host blocks. */
static ckptio_status describe(const char *path, const char *save_id, const ckptio_extent *extents,
                              const ckptio_tensor_source *tensors, size_t count, ckptio__manifest *m,
                              hash_work *work) {
    const char *slash = strrchr(path, '/');
    snprintf(m->save_id, sizeof m->save_id, "%s", save_id);
    if (!(m->file = ckptio__strdup(slash ? slash + 1 : path)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory", path);
    m->block_bytes = CKPTIO__MANIFEST_BLOCK;
    m->data_offset = extents[0].length;
    m->header_hash = XXH3_64bits(extents[0].memory, (size_t)extents[0].length);
    m->file_size = m->data_offset;
    if (count && !(m->tensors = ckptio__calloc(count, sizeof *m->tensors)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for the manifest", path);
    m->count = count;
    size_t njobs = 0;
    for (size_t i = 0; i < count; i++) {
        ckptio__manifest_tensor *t = &m->tensors[i];
        const ckptio_extent *x = &extents[i + 1];
        t->offset = x->file_offset;
        t->nbytes = x->length;
        t->nblocks = ckptio__manifest_nblocks(t->nbytes, m->block_bytes);
        if (x->file_offset + x->length > m->file_size) m->file_size = x->file_offset + x->length;
        if (!(t->name = ckptio__strdup(tensors[i].name)) ||
            (t->nblocks && !(t->blocks = ckptio__calloc(t->nblocks, sizeof *t->blocks))))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for the manifest", path);
        if (is_host(x)) njobs += t->nblocks;
    }
    if (njobs && !(work->jobs = ckptio__calloc(njobs, sizeof *work->jobs)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for %zu hash jobs", path, njobs);
    for (size_t i = 0; i < count; i++) {
        const ckptio_extent *x = &extents[i + 1];
        if (!is_host(x)) continue;
        ckptio__manifest_tensor *t = &m->tensors[i];
        for (size_t b = 0; b < t->nblocks; b++) {
            const uint64_t off = (uint64_t)b * m->block_bytes;
            const uint64_t len = t->nbytes - off < m->block_bytes ? t->nbytes - off : m->block_bytes;
            work->jobs[work->njobs++] = (hash_job){(const unsigned char *)x->memory + off, len, &t->blocks[b]};
        }
    }
    return CKPTIO_OK;
}

/* Hashes the blocks of non-host tensors the observer did not see whole
 * from what the file now holds. */
static ckptio_status hash_from_file(ckptio_file *file, const gpu_hash *g, ckptio__manifest *m) {
    unsigned char *buf = NULL;
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; st == CKPTIO_OK && g->seen && i < m->count; i++) {
        if (!g->seen[i]) continue;
        ckptio__manifest_tensor *t = &m->tensors[i];
        if (!buf && t->nblocks && !(buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, m->block_bytes)))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a %llu-byte hash buffer",
                               (unsigned long long)m->block_bytes);
        for (size_t b = 0; st == CKPTIO_OK && b < t->nblocks; b++) {
            if (g->seen[i][b]) continue;
            const uint64_t off = (uint64_t)b * m->block_bytes;
            const uint64_t len = t->nbytes - off < m->block_bytes ? t->nbytes - off : m->block_bytes;
            st = ckptio__file_io(file, CKPTIO_READ, buf, len, t->offset + off);
            if (st == CKPTIO_OK) t->blocks[b] = XXH3_64bits(buf, (size_t)len);
        }
    }
    ckptio__free(buf);
    return st;
}

/* Step 4 failed after the data was committed: say so, keeping the cause. */
static ckptio_status manifest_failed(ckptio_status st, const char *path) {
    const ckptio_error_info *e = ckptio_last_error();
    char cause[1024];
    snprintf(cause, sizeof cause, "%s", e->message);
    return CKPTIO_FAIL_CTX(st, &((ckptio__err_ctx){.operation = "commit manifest", .path = path, .file_offset = -1,
                                                   .sys_errno = 0}),
                           "the new data is in place, but its checksum manifest could not be written (%s)", cause);
}

ckptio_status ckptio__manifest_write_and_commit(ckptio_engine *engine, ckptio_file *file, const char *path,
                                                const ckptio_extent *extents, const ckptio_tensor_source *tensors,
                                                size_t count, const char *save_id) {
    ckptio__manifest m = {0};
    hash_work work = {0};
    gpu_hash gh = {0};
    pthread_t helper;
    bool helper_running = false;
    char *text = NULL, *mpath = NULL;
    size_t text_len = 0;
    ckptio_file *mfile = NULL;
    ckptio_status st = CKPTIO_OK;

    const bool checksums = save_id != NULL;
    const size_t cap = strlen(path) + strlen(CKPTIO_MANIFEST_SUFFIX) + 1;
    if (!(mpath = ckptio__malloc(cap))) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory", path);
    if ((st = ckptio_manifest_path(path, mpath, cap)) != CKPTIO_OK) goto out;

    if (checksums) {
        if ((st = describe(path, save_id, extents, tensors, count, &m, &work)) != CKPTIO_OK) goto out;
        if ((st = gpu_hash_init(&gh, extents, &m, path)) != CKPTIO_OK) goto out;
        /* No thread: hash inline after the plan. */
        if (work.njobs && pthread_create(&helper, NULL, hash_thread, &work) == 0) helper_running = true;
    }
    st = run_plan(engine, extents, count + 1, gh.seen ? &gh : NULL);
    if (helper_running) pthread_join(helper, NULL);
    else if (checksums && st == CKPTIO_OK) hash_thread(&work);
    if (st == CKPTIO_OK && work.status != CKPTIO_OK) {
        ckptio__error_restore(work.failure);
        work.failure = NULL;
        st = work.status;
    }
    free(work.failure); /* a failure of the plan came first */
    if (st != CKPTIO_OK) goto out;
    if (checksums) {
        if ((st = hash_from_file(file, &gh, &m)) != CKPTIO_OK) goto out;
        if (!(text = ckptio__manifest_dump(&m, &text_len))) {
            st = CKPTIO_E_NOMEM;
            goto out;
        }
        if ((st = ckptio_file_open(engine, mpath, CKPTIO_OPEN_WRITE, &mfile)) != CKPTIO_OK) goto out;
        /* Readable by whom the data is, not by whom an old manifest was
         * (step 2 removes that one before this commit anyway). */
        if ((st = ckptio__file_set_mode_source(mfile, path)) != CKPTIO_OK) goto out;
        if ((st = ckptio__file_io(mfile, CKPTIO_WRITE, text, text_len, 0)) != CKPTIO_OK) goto out;
    }
    if ((st = remove_old_manifest(engine, mpath, path)) != CKPTIO_OK) goto out;
    if ((st = ckptio_file_commit(file)) != CKPTIO_OK) goto out;
    if (mfile && (st = ckptio_file_commit(mfile)) != CKPTIO_OK) st = manifest_failed(st, path);
out:
    if (mfile) {
        /* Uncommitted: close removes its temporary. */
        ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
        const ckptio_status cst = ckptio_file_close(mfile);
        if (saved) ckptio__error_restore(saved);
        else if (st == CKPTIO_OK) st = cst;
    }
    ckptio__free(text);
    ckptio__free(work.jobs);
    gpu_hash_cleanup(&gh);
    ckptio__manifest_cleanup(&m);
    ckptio__free(mpath);
    return st;
}
