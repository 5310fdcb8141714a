/*
 * dcp_commit_run.c - ckptio_dcp_commit(): steps 2 to 4 of a DCP directory
 * commit in their order, in one call (docs/DCP.md "Atomic commit and
 * overwrite").
 *
 * The order is the protocol: the manifest before .metadata (locally a
 * manifest never describes files that are not yet committed; in object
 * storage it is stored while this process's data objects complete, unread
 * until .metadata names them), .metadata replaced atomically
 * (the one moment the new checkpoint becomes current), and only then the
 * files of older saves listed and removed (never one the new checkpoint or
 * another save still needs). Each step is a function of its own file
 * (dcp_manifest_write.c, dcp_commit.c, dcp_cleanup.c); this one runs them,
 * calls the caller's step callback around each, and says in the result how
 * far it got.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The stop the step callback asked for, and what it leaves behind. */
static ckptio_status stopped(const char *dir, const char *step, int done, int committed) {
    return CKPTIO_FAIL_CTX(CKPTIO_E_CANCELED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                           "the commit stopped %s the step '%s' (the step callback asked); %s",
                           done ? "after" : "before", step,
                           committed ? CKPTIO__DCP_COMMITTED : "the checkpoint is unchanged");
}

static const char *const step_names[] = {"manifest", "metadata", "list", "remove"};

/* The callback around a step: CKPTIO_OK to go on. */
static ckptio_status around(const char *dir, const ckptio_dcp_commit_options *o, const ckptio_dcp_commit_result *r,
                            ckptio_dcp_commit_step step, const char *path, int done) {
    if (o->on_step && o->on_step(o->user, step, path, done)) return stopped(dir, step_names[step], done, r->committed);
    return CKPTIO_OK;
}

/* Whether the object f is DIR/NAME for one of `files`. */
static bool object_in_dir(const char *dir, const ckptio_dcp_commit_options *o, const ckptio_file *f) {
    const char *path = ckptio_file_path(f);
    size_t n = strlen(dir);
    while (n && dir[n - 1] == '/') n--;
    if (strncmp(path, dir, n) != 0 || path[n] != '/') return false;
    for (size_t k = 0; k < o->nfiles; k++)
        if (strcmp(o->files[k], path + n + 1) == 0) return true;
    return false;
}

/* The data files handed over (options' data_files) by
 * ckptio_file_commit_unreferenced(CKPTIO_COMMIT_SYNC_LATER), each one of
 * `files` in DIR. A local one is renamed, its fsyncs owed, and DIR is the
 * one directory whose fsync makes their names durable before .metadata
 * names them (sync_first_round). An object's upload is still to complete
 * (objects_first_round); one stored whole already needs nothing. */
static ckptio_status check_data_files(const char *dir, const ckptio_dcp_commit_options *o) {
    const bool local = !ckptio__s3_is_url(dir);
    for (size_t i = 0; i < o->ndata_files; i++) {
        const ckptio_file *f = o->data_files[i];
        CKPTIO_RETURN_IF(!f || (local && ckptio__file_renamed_fd(f) < 0), CKPTIO_E_INVAL,
                         "ckptio_dcp_commit: data file %zu is not committed by ckptio_file_commit_unreferenced("
                         "CKPTIO_COMMIT_SYNC_LATER)", i);
        if (!local) {
            CKPTIO_RETURN_IF(ckptio__file_completion_owed(f) && !object_in_dir(dir, o, f), CKPTIO_E_INVAL,
                             "ckptio_dcp_commit: data file %zu (%s) is not one of the files in %s", i,
                             ckptio_file_path(f), dir);
            continue;
        }
        const char *path = ckptio_file_path(f), *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
        bool named = false;
        for (size_t k = 0; k < o->nfiles && !named; k++) named = strcmp(o->files[k], name) == 0;
        CKPTIO_RETURN_IF(!named || !ckptio__file_in_dir(f, dir), CKPTIO_E_INVAL,
                         "ckptio_dcp_commit: data file %zu (%s) is not one of the files in %s, the directory whose "
                         "fsync makes their names durable", i, path, dir);
    }
    return CKPTIO_OK;
}

/* The manifest's PUT, on a thread of its own. */
typedef struct manifest_put {
    const char *dir;
    const ckptio_dcp_commit_options *o;
    const char *reference;
    unsigned sync;
    ckptio_status st;
    ckptio__error_saved *error;
} manifest_put;

static void *put_manifest(void *arg) {
    manifest_put *m = arg;
    const ckptio_dcp_commit_options *o = m->o;
    m->st = ckptio__dcp_manifest_write(m->dir, o->metadata_name, o->files, o->nfiles, o->items, o->nitems,
                                       m->reference, m->sync);
    if (m->st != CKPTIO_OK) m->error = ckptio__error_save();
    return NULL;
}

/* Removes the object `url` if it can (what is left is unreferenced: a later
 * save's cleanup removes it), keeping the calling thread's error. */
static void remove_unreferenced(const char *url) {
    ckptio__error_saved *saved = ckptio__error_save();
    ckptio_engine *engine = NULL;
    if (ckptio_engine_create(&engine) == CKPTIO_OK) ckptio__object_remove(engine, url);
    ckptio_engine_destroy(engine);
    ckptio__error_restore(saved);
}

/* Step 2 in object storage: the manifest's PUT beside the completion of
 * this process's data objects whose uploads were handed over still running
 * (their last parts, then CompleteMultipartUpload). The manifest names only
 * objects of this save's token, which nothing reads before .metadata names
 * them, so it need not wait for them; .metadata does (the caller writes it
 * after this returns). A data object that fails fails the commit, the
 * checkpoint unchanged, and the manifest stored beside it is removed. */
static ckptio_status objects_first_round(const char *dir, const ckptio_dcp_commit_options *o, bool with_manifest,
                                         const char *manifest_path, const char *reference, unsigned sync) {
    manifest_put m = {dir, o, reference, sync, CKPTIO_OK, NULL};
    pthread_t t;
    const bool beside = with_manifest && ckptio__thread_start(&t, NULL, put_manifest, &m) == 0;
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < o->ndata_files && st == CKPTIO_OK; i++)
        if (ckptio__file_completion_owed(o->data_files[i])) st = ckptio_file_commit(o->data_files[i]);
    if (beside) pthread_join(t, NULL);
    else if (with_manifest && st == CKPTIO_OK) put_manifest(&m);
    if (st != CKPTIO_OK) {
        if (with_manifest && m.st == CKPTIO_OK) remove_unreferenced(manifest_path);
        ckptio__free(m.error);
        return st;
    }
    if (m.st != CKPTIO_OK) ckptio__error_restore(m.error);
    return m.st;
}

static ckptio_status check_options(const char *dir, const ckptio_dcp_commit_options *o) {
    const unsigned known = CKPTIO_DCP_SYNC | CKPTIO_DCP_MANIFEST | CKPTIO_DCP_CLEANUP | CKPTIO_DCP_CLEANUP_LATER;
    CKPTIO_RETURN_IF(!dir || !*dir || !o, CKPTIO_E_INVAL, "ckptio_dcp_commit: dir and options are required");
    CKPTIO_RETURN_IF(o->flags & ~known, CKPTIO_E_INVAL, "ckptio_dcp_commit: unknown flags 0x%x", o->flags & ~known);
    CKPTIO_RETURN_IF((o->flags & CKPTIO_DCP_CLEANUP) && (o->flags & CKPTIO_DCP_CLEANUP_LATER), CKPTIO_E_INVAL,
                     "ckptio_dcp_commit: CKPTIO_DCP_CLEANUP and CKPTIO_DCP_CLEANUP_LATER exclude each other");
    CKPTIO_RETURN_IF(!o->metadata_name || !ckptio__dcp_metadata_name(o->metadata_name), CKPTIO_E_INVAL,
                     "ckptio_dcp_commit: the metadata file must be .metadata or __RANK.metadata, not '%s'",
                     o->metadata_name ? o->metadata_name : "(null)");
    CKPTIO_RETURN_IF(!o->metadata && o->metadata_len, CKPTIO_E_INVAL, "ckptio_dcp_commit: no metadata bytes");
    CKPTIO_RETURN_IF(!o->files && o->nfiles, CKPTIO_E_INVAL, "ckptio_dcp_commit: no data file names");
    CKPTIO_RETURN_IF(!o->items && o->nitems, CKPTIO_E_INVAL, "ckptio_dcp_commit: no manifest items");
    CKPTIO_RETURN_IF(!o->data_files && o->ndata_files, CKPTIO_E_INVAL, "ckptio_dcp_commit: no data files");
    for (size_t i = 0; i < o->nfiles; i++)
        CKPTIO_RETURN_IF(!o->files[i] || !*o->files[i] || strchr(o->files[i], '/'), CKPTIO_E_INVAL,
                         "ckptio_dcp_commit: data file %zu ('%s') is not a file name", i,
                         o->files[i] ? o->files[i] : "(null)");
    return check_data_files(dir, o);
}

/* Step 4: the files of older saves, listed (and removed unless later). */
static ckptio_status cleanup(const char *dir, const ckptio_dcp_commit_options *o, ckptio_dcp_commit_result *r,
                             const char *manifest, ckptio__dcp_prefetch *prefetched) {
    const ckptio_dcp_committed committed = {o->metadata_name, o->metadata, o->metadata_len, o->files, o->nfiles};
    const char **keep = ckptio__calloc(o->nfiles + 2, sizeof *keep);
    if (!keep) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    size_t nkeep = 0;
    for (size_t i = 0; i < o->nfiles; i++) keep[nkeep++] = o->files[i];
    keep[nkeep++] = o->metadata_name;
    if (manifest[0]) keep[nkeep++] = manifest;
    char **stale = NULL;
    size_t nstale = 0;
    ckptio_status st = around(dir, o, r, CKPTIO_DCP_STEP_LIST, dir, 0);
    if (st == CKPTIO_OK)
        st = ckptio__dcp_stale_files_listed(dir, keep, nkeep, &committed, prefetched, &stale, &nstale, r->note,
                                            sizeof r->note);
    ckptio__free(keep);
    if (st == CKPTIO_OK) st = around(dir, o, r, CKPTIO_DCP_STEP_LIST, dir, 1);
    if (st == CKPTIO_OK && (o->flags & CKPTIO_DCP_CLEANUP_LATER)) {
        r->stale = stale;
        r->nstale = nstale;
        return CKPTIO_OK;
    }
    if (st == CKPTIO_OK) st = around(dir, o, r, CKPTIO_DCP_STEP_REMOVE, dir, 0);
    if (st == CKPTIO_OK) {
        /* The list's note (a metadata file that cannot be read) is the one
         * worth keeping: a removal without re-check adds none. */
        char note[sizeof r->note];
        st = ckptio__dcp_remove_files_listed(dir, (const char *const *)stale, nstale, o->flags & CKPTIO_DCP_SYNC,
                                             &committed, prefetched, &r->removed, note, sizeof note);
    }
    ckptio_dcp_names_free(stale, nstale);
    if (st == CKPTIO_OK) st = around(dir, o, r, CKPTIO_DCP_STEP_REMOVE, dir, 1);
    return st;
}

/* The first round of fsyncs of a local commit, all at once: the data files
 * handed over renamed but not fsynced, DIR (which names them:
 * check_data_files), the manifest's and .metadata's temporaries. All of it
 * is durable before the manifest or .metadata is renamed: .metadata never
 * names a data file, and its new name never holds bytes, that a crash could
 * lose. */
static ckptio_status sync_first_round(const char *dir, const ckptio_dcp_commit_options *o,
                                      ckptio__dcp_staged *const *staged, size_t nstaged) {
    const size_t nd = o->ndata_files;
    if (nd == 0) return ckptio__dcp_staged_sync(staged, nstaged);
    const size_t n = nd + 1 + nstaged;
    int *fds = ckptio__calloc(2 * n, sizeof *fds);
    if (!fds) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    int *errs = fds + n;
    for (size_t i = 0; i < nd; i++) fds[i] = ckptio__file_renamed_fd(o->data_files[i]);
    const int dfd = ckptio__open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0) {
        const ckptio_status st = CKPTIO_FAIL_SYS_NOTE(errno, "open", dir,
                                                      "opening the directory to fsync it after renaming the data "
                                                      "files; the checkpoint is unchanged");
        ckptio__free(fds);
        return st;
    }
    fds[nd] = dfd;
    for (size_t k = 0; k < nstaged; k++) fds[nd + 1 + k] = staged[k]->fd;
    const int failed = ckptio__fsync_many(fds, n, errs);
    close(dfd);
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; failed && i < n && st == CKPTIO_OK; i++) {
        if (!errs[i]) continue;
        if (i < nd)
            st = CKPTIO_FAIL_SYS_NOTE(errs[i], "fsync", ckptio_file_path(o->data_files[i]),
                                      "flushing the data file before %s names it; the checkpoint is unchanged",
                                      o->metadata_name);
        else if (i == nd)
            st = CKPTIO_FAIL_SYS_NOTE(errs[i], "fsync", dir,
                                      "flushing the directory after renaming the data files; the checkpoint is "
                                      "unchanged");
        else
            st = CKPTIO_FAIL_SYS_NOTE(errs[i], "fsync", staged[i - nd - 1]->tmp,
                                      "flushing %s before its rename; %s is unchanged", staged[i - nd - 1]->final,
                                      staged[i - nd - 1]->final);
    }
    ckptio__free(fds);
    return st;
}

/* Steps 2 and 3 in a local directory. Both files are written to their
 * temporaries and fsynced together (one journal commit, not two), then the
 * manifest is renamed, then .metadata, and one directory fsync makes both
 * renames durable: a crash never leaves a name whose content is not on the
 * disk, and never .metadata without the data files (durable before the
 * commit). Temporaries left by a stop or a failure are removed. */
static ckptio_status local_steps(const char *dir, const ckptio_dcp_commit_options *o, ckptio_dcp_commit_result *r,
                                 const char *manifest, const char *manifest_path, const char *metadata_path,
                                 bool with_manifest, const char *reference) {
    ckptio__dcp_staged man = {.fd = -1}, md = {.fd = -1};
    ckptio__dcp_staged *both[2];
    size_t nboth = 0;
    ckptio_status st = CKPTIO_OK;
    if (with_manifest) {
        st = around(dir, o, r, CKPTIO_DCP_STEP_MANIFEST, manifest_path, 0);
        char *text = NULL, name[CKPTIO__DCP_MANIFEST_NAME_SIZE];
        if (st == CKPTIO_OK)
            st = ckptio__dcp_manifest_text(dir, o->metadata_name, o->files, o->nfiles, o->items, o->nitems, &text,
                                           name);
        if (st == CKPTIO_OK) st = ckptio__dcp_stage(dir, manifest, text, strlen(text), reference, &man);
        free(text);
        if (st == CKPTIO_OK) both[nboth++] = &man;
    }
    if (st == CKPTIO_OK) st = ckptio__dcp_stage(dir, o->metadata_name, o->metadata, o->metadata_len, reference, &md);
    if (st == CKPTIO_OK) both[nboth++] = &md;
    if (st == CKPTIO_OK && (o->flags & CKPTIO_DCP_SYNC)) st = sync_first_round(dir, o, both, nboth);
    if (st == CKPTIO_OK && with_manifest) {
        st = ckptio__dcp_staged_publish(&man);
        if (st == CKPTIO_OK) st = around(dir, o, r, CKPTIO_DCP_STEP_MANIFEST, manifest_path, 1);
    }
    if (st == CKPTIO_OK) st = around(dir, o, r, CKPTIO_DCP_STEP_METADATA, metadata_path, 0);
    if (st == CKPTIO_OK) st = ckptio__dcp_staged_publish(&md);
    if (st == CKPTIO_OK && (o->flags & CKPTIO_DCP_SYNC)) st = ckptio__dcp_fsync_dir_after(dir, o->metadata_name);
    ckptio__dcp_staged_drop(&man);
    ckptio__dcp_staged_drop(&md);
    return st;
}

ckptio_status ckptio_dcp_commit(const char *dir, const ckptio_dcp_commit_options *o, ckptio_dcp_commit_result *r) {
    CKPTIO_RETURN_IF(!r, CKPTIO_E_INVAL, "ckptio_dcp_commit: result is required");
    memset(r, 0, sizeof *r);
    CKPTIO_FORWARD(check_options(dir, o));
    const unsigned sync = o->flags & CKPTIO_DCP_SYNC;
    /* New files take the attributes of the metadata file they replace (a
     * missing one, or one that is no regular file, is no reference). */
    const char *reference = o->metadata_name;
    char manifest[CKPTIO__DCP_MANIFEST_NAME_SIZE];
    ckptio__dcp_manifest_name(o->files, o->nfiles, manifest);
    char *manifest_path = ckptio__dcp_join(dir, manifest), *metadata_path = ckptio__dcp_join(dir, o->metadata_name);
    ckptio_status st = manifest_path && metadata_path ? CKPTIO_OK : CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    const bool with_manifest = manifest[0] && (o->flags & CKPTIO_DCP_MANIFEST);
    ckptio__dcp_prefetch *prefetched = NULL;
    if (st == CKPTIO_OK && ckptio__s3_is_url(dir)) {
        /* Objects: each PUT replaces its object whole, the manifest's beside the completion of the data objects
         * handed over, .metadata's after both. */
        if (with_manifest) st = around(dir, o, r, CKPTIO_DCP_STEP_MANIFEST, manifest_path, 0);
        if (st == CKPTIO_OK) st = objects_first_round(dir, o, with_manifest, manifest_path, reference, sync);
        if (st == CKPTIO_OK && with_manifest) st = around(dir, o, r, CKPTIO_DCP_STEP_MANIFEST, manifest_path, 1);
        if (st == CKPTIO_OK) st = around(dir, o, r, CKPTIO_DCP_STEP_METADATA, metadata_path, 0);
        /* The cleanup's listing (and, removing now, the abort of killed saves'
         * uploads, which no live save owns) runs beside the .metadata PUT: the
         * step callback before it has checked the lease. */
        if (st == CKPTIO_OK && (o->flags & (CKPTIO_DCP_CLEANUP | CKPTIO_DCP_CLEANUP_LATER)))
            st = ckptio__dcp_prefetch_start(dir, o->flags & CKPTIO_DCP_CLEANUP, &prefetched);
        if (st == CKPTIO_OK)
            st = ckptio__dcp_write_file(dir, o->metadata_name, o->metadata, o->metadata_len, reference, sync);
    } else if (st == CKPTIO_OK) {
        st = local_steps(dir, o, r, manifest, manifest_path, metadata_path, with_manifest, reference);
    }
    if (st == CKPTIO_OK) {
        r->committed = 1;
        st = around(dir, o, r, CKPTIO_DCP_STEP_METADATA, metadata_path, 1);
    }
    if (st == CKPTIO_OK && (o->flags & (CKPTIO_DCP_CLEANUP | CKPTIO_DCP_CLEANUP_LATER)))
        st = cleanup(dir, o, r, manifest, prefetched);
    ckptio__dcp_prefetch_finish(prefetched);
    ckptio__free(manifest_path);
    ckptio__free(metadata_path);
    return st;
}
