/*
 * test_dcp_commit.c - the DCP directory commit (include/ckptio/dcp.h "DCP
 * directory commit", src/ckpt/dcp_{commit,commit_run,cleanup,lock,
 * manifest_write,names}.c), as ckptio.dcp's writer runs it.
 *
 * The commit under test replaces a checkpoint stock torch wrote
 * (tests/data/dcp/ts: .metadata, __0_0.distcp) by one ckptio.dcp wrote
 * (tests/data/dcp/zstd: its data file, manifest and .metadata): lock, the
 * manifest (rebuilt from the fixture's items; it must come out byte for
 * byte as the Python writer wrote it), .metadata, the list of stale files,
 * their removal, unlock.
 *  - The order of the steps, the step callback's stops, the fsyncs before
 *    any rename, the data files handed over (data_files) and which of them
 *    are refused.
 *  - Faults: the nth open, write, fsync, rename, unlink, opendir and read
 *    of the commit fails with ENOSPC or EIO, for n = 1, 2, ... until n
 *    passes the last such call (and short writes, which must be resumed).
 *    Every failure names the file, the operation, strerror and what it
 *    leaves ("... is unchanged" before .metadata is replaced, "committed" /
 *    "in place" after); .metadata is then the old or the new one, complete
 *    (the new one verifies against its manifest); only files the next save
 *    removes are left, never a temporary, no descriptor leaks; the next
 *    clean commit leaves exactly the new checkpoint.
 *  - Which files step 4 removes: torch's and ckptio's names, temporaries
 *    (a live writer's kept), files a per-rank metadata still references,
 *    unreadable metadata files (keep everything, say why), the re-check of
 *    a list taken earlier, the committed metadata spared from unpickling.
 *  - Attributes: every new file takes the replaced .metadata's mode from
 *    its creation on.
 *  - The lock: busy (E_BUSY naming the holder's pid, at once or after a
 *    timeout), shared vs exclusive, the wait callback and its cancel, a
 *    holder killed with SIGKILL, and a forked child that does not keep its
 *    parent's lock alive.
 */
#include "helpers.h"
#include "dcp_commit_internal.h"
#include "io_inject.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OLD_DATA "__0_0.distcp"
#define NEW_DATA "__0_ee16d53c3f1b_0.distcp"
#define NEW_MANIFEST ".ckptio-manifest-ee16d53c3f1b.json"

static ckptio_engine *engine;
static void *old_md, *new_md, *old_data, *new_data, *manifest_text;
static size_t old_md_len, new_md_len, old_data_len, new_data_len, manifest_len;

/* The items of the fixture's manifest, as the writer hands them over. */
enum { MAX_ITEMS = 16 };
static ckptio_dcp_manifest_item items[MAX_ITEMS];
static int64_t item_offsets[MAX_ITEMS][8];
static size_t nitems;
static json_t *manifest_json;

static const char *fixture(const char *rel) { return t_data_path("dcp", rel); }

static uint64_t hex64(const char *s) { return strtoull(s, NULL, 16); }

static void load_fixtures(void) {
    old_md = t_read_file(fixture("ts/.metadata"), &old_md_len);
    old_data = t_read_file(fixture("ts/" OLD_DATA), &old_data_len);
    new_md = t_read_file(fixture("zstd/.metadata"), &new_md_len);
    new_data = t_read_file(fixture("zstd/" NEW_DATA), &new_data_len);
    manifest_text = t_read_file(fixture("zstd/" NEW_MANIFEST), &manifest_len);
    json_error_t err;
    manifest_json = json_loadb(manifest_text, manifest_len, 0, &err);
    T_ASSERT(manifest_json != NULL);
    const json_t *list = json_object_get(manifest_json, "items");
    nitems = json_array_size(list);
    T_ASSERT(nitems > 0 && nitems <= MAX_ITEMS);
    for (size_t i = 0; i < nitems; i++) {
        const json_t *o = json_array_get(list, i), *off = json_object_get(o, "offset");
        ckptio_dcp_manifest_item *it = &items[i];
        it->fqn = json_string_value(json_object_get(o, "fqn"));
        it->file = json_string_value(json_object_get(o, "file"));
        it->data_offset = (uint64_t)json_integer_value(json_object_get(o, "data_offset"));
        it->nbytes = (uint64_t)json_integer_value(json_object_get(o, "nbytes"));
        it->hashed = json_is_string(json_object_get(o, "xxh3"));
        if (it->hashed) it->hash = hex64(json_string_value(json_object_get(o, "xxh3")));
        it->transforms = json_array_size(json_object_get(o, "transform")) ? CKPTIO_DCP_TRANSFORM_ZSTD : 0;
        if (json_is_array(off)) {
            it->ndim = (uint32_t)json_array_size(off);
            for (uint32_t d = 0; d < it->ndim; d++) item_offsets[i][d] = json_integer_value(json_array_get(off, d));
            it->offset = item_offsets[i];
        }
    }
}

/* ---- directories -------------------------------------------------------------------- */

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        T_ASSERT(unlink(p) == 0);
    }
    closedir(d);
    rmdir(dir);
}

static void put(const char *dir, const char *name, const void *data, size_t len) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    t_write_file(p, data, len);
}

static const char *in(const char *dir, const char *name) {
    static char buf[4][2048];
    static int slot;
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

/* The old checkpoint, with step 1 of the new save done (its data file
 * committed under its new name). */
static const char *setup(const char *name) {
    const char *dir = t_path(name);
    remove_dir(dir);
    T_ASSERT(mkdir(dir, 0755) == 0);
    put(dir, ".metadata", old_md, old_md_len);
    put(dir, OLD_DATA, old_data, old_data_len);
    put(dir, NEW_DATA, new_data, new_data_len);
    return dir;
}

static bool same_file(const char *path, const void *want, size_t len) {
    if (!t_file_exists(path)) return false;
    size_t n = 0;
    void *got = t_read_file(path, &n);
    const bool same = n == len && memcmp(got, want, len) == 0;
    free(got);
    return same;
}

/* Sorted names of the entries of dir, joined by ' '. */
static const char *entries(const char *dir) {
    static char out[4096];
    char *names[64];
    int n = 0;
    DIR *d = opendir(dir);
    T_ASSERT(d != NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 64;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        strcat(out, i ? " " : "");
        strcat(out, names[i]);
        free(names[i]);
    }
    return out;
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* ---- the commit ---------------------------------------------------------------------- */

static const char *const new_files[] = {NEW_DATA};

static ckptio_dcp_committed committed(void) {
    return (ckptio_dcp_committed){".metadata", new_md, new_md_len, new_files, 1};
}

/* Steps 0 and 2-4 as ckptio.dcp's writer runs them: the lock, then
 * ckptio_dcp_commit() with `extra` flags; the first failure ends it (the lock
 * is released either way). */
static ckptio_status commit_with(const char *dir, unsigned flags, ckptio_dcp_commit_fn on_step, void *user,
                                 ckptio_dcp_commit_result *r) {
    ckptio_dcp_lock *lock = NULL;
    ckptio_status st = ckptio_dcp_lock_acquire(dir, ".metadata", 0, 0.0, NULL, NULL, &lock);
    const ckptio_dcp_commit_options o = {".metadata", new_md, new_md_len, new_files, 1, items, nitems,
                                         flags | CKPTIO_DCP_MANIFEST, on_step, user, NULL, 0};
    if (st == CKPTIO_OK) st = ckptio_dcp_commit(dir, &o, r);
    ckptio__error_saved *saved = ckptio__error_save();
    T_OK(ckptio_dcp_lock_release(lock));
    ckptio__error_restore(saved);
    return st;
}

static ckptio_status commit(const char *dir, unsigned flags) {
    ckptio_dcp_commit_result r;
    const ckptio_status st = commit_with(dir, flags | CKPTIO_DCP_CLEANUP, NULL, NULL, &r);
    if (st == CKPTIO_OK) T_ASSERT_MSG(r.note[0] == '\0' && !r.stale, "unexpected note: %s", r.note);
    return st;
}

/* The version under .metadata (0 old, 1 new), checked complete: its files
 * are there, the new one verifies against its manifest; no temporary is
 * left and nothing but the two checkpoints' files and the lock. */
static int check_state(const char *dir, const char *what) {
    const int v = same_file(in(dir, ".metadata"), new_md, new_md_len)   ? 1
                  : same_file(in(dir, ".metadata"), old_md, old_md_len) ? 0
                                                                         : -1;
    T_ASSERT_MSG(v >= 0, "%s: .metadata is neither version (%s)", what, entries(dir));
    T_ASSERT_MSG(t_count_entries(dir, CKPTIO__TMP_MARK) == 0, "%s: a temporary is left: %s", what, entries(dir));
    if (v == 0) T_ASSERT_MSG(same_file(in(dir, OLD_DATA), old_data, old_data_len), "%s: old data gone", what);
    if (v == 1) {
        T_ASSERT_MSG(same_file(in(dir, NEW_DATA), new_data, new_data_len), "%s: new data gone", what);
        ckptio_dcp *h = NULL;
        ckptio_dcp_verify_report r;
        T_OK(ckptio_dcp_open(engine, dir, &h));
        T_OK(ckptio_dcp_verify(h, &r));
        T_ASSERT(r.checked == r.items && r.items == nitems);
        ckptio_dcp_close(h);
    }
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const char *n = e->d_name;
        T_ASSERT_MSG(!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, ".metadata") || !strcmp(n, OLD_DATA) ||
                         !strcmp(n, NEW_DATA) || !strcmp(n, NEW_MANIFEST) || !strcmp(n, CKPTIO_DCP_LOCK_NAME),
                     "%s: unexpected %s", what, n);
    }
    closedir(d);
    return v;
}

static void check_clean(const char *dir, const char *what) {
    T_ASSERT_MSG(check_state(dir, what) == 1, "%s: not the new checkpoint", what);
    T_ASSERT_MSG(strcmp(entries(dir), ".ckptio-dcp.lock .ckptio-manifest-ee16d53c3f1b.json .metadata " NEW_DATA) == 0,
                 "%s: %s", what, entries(dir));
}

static void test_commit_replaces_torch_checkpoint(void) {
    const char *dir = setup("plain");
    T_OK(commit(dir, CKPTIO_DCP_SYNC));
    check_clean(dir, "a clean commit");
    /* The manifest comes out as the Python writer wrote it. */
    T_ASSERT_MSG(same_file(in(dir, NEW_MANIFEST), manifest_text, manifest_len), "manifest differs from the fixture");
    /* Again over itself: nothing to remove, the same result. */
    T_OK(commit(dir, 0));
    check_clean(dir, "a second commit");
}

/* ---- the order of the steps ------------------------------------------------------------ */

/* What the step callback saw: "step:done" for each call, and the state of
 * the directory at each. */
typedef struct seen {
    const char *dir, *md; /* the directory, its metadata file (NULL: .metadata) */
    char calls[256];
    int stop_step, stop_done; /* stop at this call (-1: never) */
} seen;

static int record(void *user, ckptio_dcp_commit_step step, const char *path, int done) {
    seen *s = user;
    static const char *const names[] = {"manifest", "metadata", "list", "remove"};
    char one[32];
    snprintf(one, sizeof one, "%s%s:%d", s->calls[0] ? " " : "", names[step], done);
    strcat(s->calls, one);
    const char *dir = s->dir, *md = s->md ? s->md : ".metadata";
    const bool manifest = t_file_exists(in(dir, NEW_MANIFEST)) || s->md,
               new_md_in = same_file(in(dir, md), new_md, new_md_len), old_data_in = t_file_exists(in(dir, OLD_DATA));
    switch (step) { /* each step runs after the one before it finished, never before */
    case CKPTIO_DCP_STEP_MANIFEST:
        T_ASSERT_MSG(strcmp(path, in(dir, NEW_MANIFEST)) == 0 && manifest == done && !new_md_in, "%s", s->calls);
        break;
    case CKPTIO_DCP_STEP_METADATA:
        T_ASSERT_MSG(strcmp(path, in(dir, md)) == 0 && manifest && new_md_in == done, "%s", s->calls);
        break;
    case CKPTIO_DCP_STEP_LIST:
        T_ASSERT_MSG(strcmp(path, dir) == 0 && new_md_in && old_data_in, "%s", s->calls);
        break;
    case CKPTIO_DCP_STEP_REMOVE:
        T_ASSERT_MSG(strcmp(path, dir) == 0 && new_md_in && old_data_in != done, "%s", s->calls);
        break;
    }
    return (int)step == s->stop_step && done == s->stop_done;
}

static void test_commit_runs_its_steps_in_order(void) {
    const char *dir = setup("order");
    seen s = {dir, NULL, "", -1, 0};
    ckptio_dcp_commit_result r;
    T_OK(commit_with(dir, CKPTIO_DCP_SYNC | CKPTIO_DCP_CLEANUP, record, &s, &r));
    T_ASSERT_MSG(strcmp(s.calls, "manifest:0 manifest:1 metadata:0 metadata:1 list:0 list:1 remove:0 remove:1") == 0,
                 "%s", s.calls);
    T_ASSERT(r.committed == 1 && r.removed == 1 && !r.stale && r.note[0] == '\0');
    check_clean(dir, "in order");
    /* A save without collectives: its own __RANK.metadata, no cleanup (it
     * does not know the other ranks' files); without MANIFEST, no manifest. */
    dir = setup("per-rank");
    s = (seen){dir, "__0.metadata", "", -1, 0};
    const ckptio_dcp_commit_options o = {"__0.metadata", new_md, new_md_len, new_files, 1, items, nitems,
                                         CKPTIO_DCP_SYNC, record, &s, NULL, 0};
    T_OK(ckptio_dcp_commit(dir, &o, &r));
    T_ASSERT_MSG(strcmp(s.calls, "metadata:0 metadata:1") == 0, "%s", s.calls);
    T_ASSERT(r.committed == 1 && same_file(in(dir, "__0.metadata"), new_md, new_md_len));
    T_ASSERT(same_file(in(dir, ".metadata"), old_md, old_md_len) && t_file_exists(in(dir, OLD_DATA)) &&
             !t_file_exists(in(dir, NEW_MANIFEST)));
    /* CLEANUP_LATER: the list comes back, nothing is removed; removing it
     * later (re-checked) leaves the new checkpoint alone. */
    dir = setup("later");
    T_OK(commit_with(dir, CKPTIO_DCP_CLEANUP_LATER, NULL, NULL, &r));
    T_ASSERT_MSG(r.nstale == 1 && strcmp(r.stale[0], OLD_DATA) == 0 && r.removed == 0, "%zu stale", r.nstale);
    T_ASSERT(t_file_exists(in(dir, OLD_DATA)));
    const ckptio_dcp_committed c = committed();
    size_t removed = 0;
    char note[256];
    T_OK(ckptio_dcp_remove_files(dir, (const char *const *)r.stale, r.nstale, CKPTIO_DCP_RECHECK, &c, &removed, note,
                                 sizeof note));
    ckptio_dcp_names_free(r.stale, r.nstale);
    T_ASSERT(removed == 1);
    check_clean(dir, "listed, removed later");
}

/* The callback stops the commit before or after any step: the old
 * checkpoint stays until .metadata is replaced, the new one is whole after;
 * the error says where it stopped and what that leaves. */
static void test_commit_stops_where_the_callback_says(void) {
    for (int step = 0; step < 4; step++) {
        for (int done = 0; done < 2; done++) {
            char what[64];
            snprintf(what, sizeof what, "stopped at step %d done %d", step, done);
            const char *dir = setup("stop");
            seen s = {dir, NULL, "", step, done};
            ckptio_dcp_commit_result r;
            T_STATUS(commit_with(dir, CKPTIO_DCP_SYNC | CKPTIO_DCP_CLEANUP, record, &s, &r), CKPTIO_E_CANCELED);
            const bool after = step > CKPTIO_DCP_STEP_METADATA || (step == CKPTIO_DCP_STEP_METADATA && done);
            T_ASSERT_MSG(r.committed == after && check_state(dir, what) == after, "%s: %s", what, s.calls);
            T_MESSAGE_HAS(done ? "the commit stopped after the step" : "the commit stopped before the step");
            T_MESSAGE_HAS(after ? "the new checkpoint is committed" : "the checkpoint is unchanged");
            T_ASSERT_MSG(strcmp(ckptio_last_error()->path, dir) == 0, "%s: %s", what, ckptio_last_error()->path);
            T_OK(commit(dir, CKPTIO_DCP_SYNC));
            check_clean(dir, what);
        }
    }
}

/* The system calls of a commit in their order (ckptio__io_record). */
static char syscalls[256];

/* The manifest and .metadata are both written and fsynced before either is
 * renamed (their fsyncs run together: one journal commit), then renamed in
 * that order, and one directory fsync after .metadata's rename makes both
 * renames durable before the commit returns, before the cleanup lists
 * anything. Without sync: no fsync at all. */
static void test_commit_syncs_its_files_before_any_rename(void) {
    const char *dir = setup("sync order");
    ckptio__io_record(syscalls, sizeof syscalls, "rwfRoul");
    const ckptio_status st = commit(dir, CKPTIO_DCP_SYNC);
    ckptio__io_record_stop();
    T_OK(st);
    check_clean(dir, "sync order");
    /* o: the temporary's open, w: its write, f: fsync, R: rename. */
    const char *at = strstr(syscalls, "wff");
    T_ASSERT_MSG(at && strchr(syscalls, 'R') > at, "%s", syscalls);
    T_ASSERT_MSG(strstr(syscalls, "ffRRof") != NULL, "%s", syscalls);
    T_ASSERT_MSG(strstr(syscalls, "ffRRof") < strchr(syscalls, 'l'), "%s", syscalls);
    dir = setup("no sync");
    ckptio__io_record(syscalls, sizeof syscalls, "rwfRoul");
    T_OK(commit(dir, 0));
    ckptio__io_record_stop();
    T_ASSERT_MSG(!strchr(syscalls, 'f') && strstr(syscalls, "RR"), "%s", syscalls);
    check_clean(dir, "no sync");
}

/* The new data file written through the engine and renamed with
 * CKPTIO_COMMIT_SYNC_LATER (setup's copy removed first): the commit's
 * data_files. */
static ckptio_file *renamed_data_file(const char *dir) {
    T_ASSERT(unlink(in(dir, NEW_DATA)) == 0);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(engine, in(dir, NEW_DATA), CKPTIO_OPEN_WRITE, &f));
    ckptio_plan *p;
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    const ckptio_extent x = {.file = f, .length = new_data_len, .memory = new_data, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_plan_add(p, &x));
    T_OK(ckptio_engine_execute(engine, p));
    ckptio_plan_destroy(p);
    T_OK(ckptio_file_commit_unreferenced(&f, 1, CKPTIO_COMMIT_SYNC_LATER));
    return f;
}

static ckptio_status commit_data_files(const char *dir, ckptio_file *f, unsigned flags) {
    ckptio_dcp_lock *lock = NULL;
    ckptio_dcp_commit_result r;
    ckptio_status st = ckptio_dcp_lock_acquire(dir, ".metadata", 0, 0.0, NULL, NULL, &lock);
    const ckptio_dcp_commit_options o = {".metadata", new_md, new_md_len, new_files, 1, items, nitems,
                                         flags | CKPTIO_DCP_MANIFEST | CKPTIO_DCP_CLEANUP, NULL, NULL, &f, 1};
    if (st == CKPTIO_OK) st = ckptio_dcp_commit(dir, &o, &r);
    ckptio__error_saved *saved = ckptio__error_save();
    T_OK(ckptio_dcp_lock_release(lock));
    ckptio__error_restore(saved);
    if (st == CKPTIO_OK) ckptio_dcp_names_free(r.stale, r.nstale);
    return st;
}

/* A data file renamed but not fsynced (the process that commits hands its
 * own over): it, the directory, the manifest's and .metadata's temporaries
 * are fsynced in one round, before the manifest or .metadata is renamed.
 * Each of those fsyncs failing leaves the old checkpoint, the error naming
 * the file. */
static void test_commit_syncs_the_data_files_handed_over(void) {
    const char *dir = setup("data files");
    ckptio_file *f = renamed_data_file(dir);
    ckptio__io_record(syscalls, sizeof syscalls, "rwfRoul");
    const ckptio_status st = commit_data_files(dir, f, CKPTIO_DCP_SYNC);
    ckptio__io_record_stop();
    T_OK(st);
    T_OK(ckptio_file_close(f));
    check_clean(dir, "data files");
    T_ASSERT_MSG(strstr(syscalls, "offffRRof") && strchr(syscalls, 'f') == strstr(syscalls, "ffff"), "%s", syscalls);
    /* The round's fsyncs fail in its order (ckptio__fsync_many decides faults one call after another): the
     * data file, the directory, the manifest's temporary, .metadata's temporary; each error names its file. */
    static const char *const named[] = {NEW_DATA, "", NEW_MANIFEST, ".metadata"};
    for (int n = 1; n <= 4; n++) {
        char what[64], note[2200];
        snprintf(what, sizeof what, "fsync %d of the first round fails", n);
        dir = setup("data files fault");
        f = renamed_data_file(dir);
        ckptio__io_inject(CKPTIO__IO_FSYNC, (uint64_t)n, EIO, 0, false);
        T_STATUS(commit_data_files(dir, f, CKPTIO_DCP_SYNC), CKPTIO_E_IO);
        ckptio__io_inject_reset();
        const ckptio_error_info *e = ckptio_last_error();
        T_ASSERT_MSG(!strcmp(e->operation, "fsync") && e->sys_errno == EIO, "%s: %s", what, e->message);
        if (n == 1) {
            T_ASSERT_MSG(!strcmp(e->path, in(dir, NEW_DATA)), "%s: names %s", what, e->path);
            snprintf(note, sizeof note, "flushing the data file before .metadata names it; the checkpoint is "
                                        "unchanged");
        } else if (n == 2) {
            T_ASSERT_MSG(!strcmp(e->path, dir), "%s: names %s", what, e->path);
            snprintf(note, sizeof note, "flushing the directory after renaming the data files; the checkpoint is "
                                        "unchanged");
        } else { /* the temporary, and the file it becomes */
            T_ASSERT_MSG(!strncmp(e->path, dir, strlen(dir)) && strstr(e->path, CKPTIO__TMP_MARK), "%s: names %s",
                         what, e->path);
            const char *final = in(dir, named[n - 1]);
            snprintf(note, sizeof note, "flushing %s before its rename; %s is unchanged", final, final);
        }
        T_MESSAGE_HAS(note);
        T_OK(ckptio_file_close(f));
        T_ASSERT_MSG(check_state(dir, what) == 0, "%s", what);
        T_OK(commit(dir, CKPTIO_DCP_SYNC));
        check_clean(dir, what);
    }
}

/* Only a file renamed by ckptio_file_commit_unreferenced(CKPTIO_COMMIT_SYNC_LATER) is handed over: one not
 * committed, or committed with its own fsyncs (ckptio_file_commit, ckptio_file_commit_unreferenced without the
 * flag), is refused; so is one outside DIR (the commit fsyncs DIR only: its name would never be made durable)
 * or not among `files`. Each leaves the old checkpoint. */
static void test_commit_refuses_other_data_files(void) {
    static const char *const how[] = {"not committed", "committed", "committed unreferenced, fsynced"};
    for (int k = 0; k < 3; k++) {
        const char *dir = setup("data files refused");
        T_ASSERT(unlink(in(dir, NEW_DATA)) == 0);
        ckptio_file *f = NULL;
        T_OK(ckptio_file_open(engine, in(dir, NEW_DATA), CKPTIO_OPEN_WRITE, &f));
        if (k == 1) T_OK(ckptio_file_commit(f));
        if (k == 2) T_OK(ckptio_file_commit_unreferenced(&f, 1, 0));
        T_STATUS(commit_data_files(dir, f, CKPTIO_DCP_SYNC), CKPTIO_E_INVAL);
        T_MESSAGE_HAS("is not committed by ckptio_file_commit_unreferenced(CKPTIO_COMMIT_SYNC_LATER)");
        T_OK(ckptio_file_close(f));
        if (k) T_ASSERT_MSG(check_state(dir, how[k]) == 0, "%s", how[k]);
    }
    /* Renamed with the flag, but in another directory under the same name. */
    const char *other = setup("data files elsewhere");
    ckptio_file *f = renamed_data_file(other);
    const char *dir = setup("data files refused");
    T_STATUS(commit_data_files(dir, f, CKPTIO_DCP_SYNC), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("is not one of the files in");
    T_OK(ckptio_file_close(f));
    T_ASSERT(check_state(dir, "a data file of another directory") == 0);
    /* In DIR, but not one of `files`. */
    T_OK(ckptio_file_open(engine, in(dir, "__0_ee16d53c3f1b_1.distcp"), CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_commit_unreferenced(&f, 1, CKPTIO_COMMIT_SYNC_LATER));
    T_STATUS(commit_data_files(dir, f, CKPTIO_DCP_SYNC), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("is not one of the files in");
    T_OK(ckptio_file_close(f));
    T_ASSERT(unlink(in(dir, "__0_ee16d53c3f1b_1.distcp")) == 0);
    T_ASSERT(check_state(dir, "a data file not among files") == 0);
}

/* ---- faults -------------------------------------------------------------------------- */

static const struct {
    ckptio__io_kind kind;
    const char *name, *op, *op2; /* what the error may say it was doing */
} kinds[] = {
    {CKPTIO__IO_OPEN, "open", "open", "fsync"}, /* an open of the directory for its fsync */
    {CKPTIO__IO_WRITE, "write", "write", NULL},
    {CKPTIO__IO_FSYNC, "fsync", "fsync", NULL},
    {CKPTIO__IO_RENAME, "rename", "rename", NULL},
    {CKPTIO__IO_UNLINK, "unlink", "unlink", NULL},
    {CKPTIO__IO_LISTDIR, "opendir", "listdir", NULL},
    {CKPTIO__IO_READ, "read", "read", NULL},
};

static void check_error(ckptio_status st, int err, int k, int version, const char *dir, const char *what) {
    const ckptio_error_info *e = ckptio_last_error();
    T_ASSERT_MSG(st == (err == ENOSPC ? CKPTIO_E_NOSPC : CKPTIO_E_IO) && e->sys_errno == err, "%s: %s (%s)", what,
                 ckptio_status_name(st), e->message);
    /* "PATH: OPERATION: strerror (what it was doing; what it leaves)" */
    const char *m = e->message;
    char head[2100];
    snprintf(head, sizeof head, "%s: %s: %s (", e->path, e->operation, strerror(err));
    T_ASSERT_MSG(strncmp(m, head, strlen(head)) == 0 && m[strlen(m) - 1] == ')', "%s: %s", what, m);
    T_ASSERT_MSG(strncmp(e->path, dir, strlen(dir)) == 0, "%s: names %s", what, e->path);
    T_ASSERT_MSG(!strcmp(e->operation, kinds[k].op) || (kinds[k].op2 && !strcmp(e->operation, kinds[k].op2)),
                 "%s: operation %s", what, e->operation);
    if (version == 1)
        T_ASSERT_MSG(strstr(m, "committed") || strstr(m, "is in place"), "%s: %s", what, m);
    else
        T_ASSERT_MSG(strstr(m, "is unchanged") || strstr(m, "is in place"), "%s: %s", what, m);
}

static void test_every_commit_call_fails_once(void) {
    const int fds = open_fds();
    int total = 0, calls[sizeof kinds / sizeof *kinds] = {0};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        for (int e = 0; e < 2; e++) {
            const int err = e ? EIO : ENOSPC;
            for (uint64_t n = 1;; n++) {
                char what[128];
                snprintf(what, sizeof what, "%s at %s call %llu", strerror(err), kinds[k].name, (unsigned long long)n);
                const char *dir = setup("faults");
                ckptio__io_inject(kinds[k].kind, n, err, 0, false);
                const ckptio_status st = commit(dir, CKPTIO_DCP_SYNC);
                const bool fired = ckptio__io_inject_countdown(kinds[k].kind) == 0;
                ckptio__io_inject_reset();
                if (!fired) { /* n passed the last call of this kind */
                    T_ASSERT_MSG(st == CKPTIO_OK, "%s: no fault, yet %s", what, ckptio_last_error_message());
                    calls[k] = (int)n - 1;
                    break;
                }
                const int v = check_state(dir, what);
                T_ASSERT_MSG(st != CKPTIO_OK, "%s: the commit did not fail", what);
                check_error(st, err, (int)k, v, dir, what);
                T_OK(commit(dir, CKPTIO_DCP_SYNC));
                check_clean(dir, what);
                T_ASSERT_MSG(open_fds() == fds, "%s: %d descriptors open, %d before", what, open_fds(), fds);
                total++;
            }
        }
    }
    /* The sweep covered the whole sequence: the lock file, two temporaries
     * and two directory fsyncs opened; two files written, renamed and
     * fsynced; the directory fsynced once after .metadata's rename (which
     * makes the manifest's rename durable too) and once after the cleanup;
     * the old data file unlinked; one listing; .metadata read. */
    T_ASSERT_MSG(calls[0] >= 5 && calls[1] >= 2 && calls[2] == 4 && calls[3] == 2 && calls[4] == 1 && calls[5] == 1 &&
                     calls[6] >= 1,
                 "calls: open %d write %d fsync %d rename %d unlink %d opendir %d read %d", calls[0], calls[1],
                 calls[2], calls[3], calls[4], calls[5], calls[6]);
    printf("  %d faulted commits\n", total);
}

static void test_short_writes_are_resumed(void) {
    const char *dir = setup("short");
    ckptio__io_inject(CKPTIO__IO_WRITE, 1, 0, 7, true);
    const ckptio_status st = commit(dir, CKPTIO_DCP_SYNC);
    ckptio__io_inject_reset();
    T_OK(st);
    check_clean(dir, "short writes");
    T_ASSERT(same_file(in(dir, NEW_MANIFEST), manifest_text, manifest_len));
}

/* ---- what step 4 removes ----------------------------------------------------------- */

static void list_stale(const char *dir, const ckptio_dcp_committed *c, char *note, const char *want) {
    char **names = NULL, got[4096] = "";
    size_t n = 0;
    const char *const keep[] = {NEW_DATA, ".metadata", NEW_MANIFEST};
    T_OK(ckptio_dcp_stale_files(dir, keep, 3, c, &names, &n, note, 1024));
    for (size_t i = 0; i < n; i++) {
        strcat(got, i ? " " : "");
        strcat(got, names[i]);
    }
    ckptio_dcp_names_free(names, n);
    T_ASSERT_MSG(strcmp(got, want) == 0, "stale: got '%s', want '%s'", got, want);
}

static void test_stale_files(void) {
    const char *dir = setup("stale");
    put(dir, ".metadata", new_md, new_md_len);
    put(dir, NEW_MANIFEST, manifest_text, manifest_len);
    /* Names DCP writers give, unreferenced: listed. */
    put(dir, "__1_0123456789ab_0.distcp", "x", 1);
    put(dir, "__1_0123456789ab_0.distcp.ckptio-manifest.json", "{}", 2);
    put(dir, ".ckptio-manifest-0123456789ab.json", "{}", 2);
    put(dir, ".metadata.tmp", "x", 1);
    put(dir, "__2.metadata.tmp", "x", 1);
    /* Not a DCP name: never touched. */
    put(dir, "notes.txt", "x", 1);
    put(dir, "__x_0.distcp", "x", 1);
    /* Referenced by a per-rank metadata file: kept. */
    put(dir, "__3.metadata", old_md, old_md_len);
    char note[1024];
    const ckptio_dcp_committed c = committed();
    list_stale(dir, &c, note,
               ".ckptio-manifest-0123456789ab.json .metadata.tmp __1_0123456789ab_0.distcp "
               "__1_0123456789ab_0.distcp.ckptio-manifest.json __2.metadata.tmp");
    T_ASSERT(note[0] == '\0');
    /* Temporaries: listed; a live writer's survives the removal. */
    int live = -1, dead = -1;
    char live_path[1024], dead_path[1024];
    T_OK(ckptio_temporary_create(dir, "other.bin", NULL, &live, live_path, sizeof live_path));
    T_OK(ckptio_temporary_create(dir, ".metadata", NULL, &dead, dead_path, sizeof dead_path));
    close(dead);
    char **names = NULL;
    size_t n = 0, removed = 0;
    const char *const keep[] = {NEW_DATA, ".metadata", NEW_MANIFEST};
    T_OK(ckptio_dcp_stale_files(dir, keep, 3, &c, &names, &n, note, sizeof note));
    T_ASSERT(n == 7);
    T_OK(ckptio_dcp_remove_files(dir, (const char *const *)names, n, CKPTIO_DCP_SYNC, &c, &removed, note,
                                 sizeof note));
    ckptio_dcp_names_free(names, n);
    T_ASSERT_MSG(removed == 6 && t_file_exists(live_path) && !t_file_exists(dead_path), "removed %zu", removed);
    close(live);
    T_ASSERT(t_file_exists(in(dir, OLD_DATA)) && t_file_exists(in(dir, "notes.txt")) &&
             t_file_exists(in(dir, "__x_0.distcp")));
    /* The per-rank metadata gone, its data file is stale too; so is the
     * temporary whose writer closed it. */
    T_ASSERT(unlink(in(dir, "__3.metadata")) == 0);
    char want[1200];
    snprintf(want, sizeof want, "%s " OLD_DATA, strrchr(live_path, '/') + 1);
    list_stale(dir, &c, note, want);
}

/* A metadata file the cleanup cannot read might reference anything: only
 * temporaries are listed, and the note says which file and why. */
static void test_unreadable_metadata_keeps_everything(void) {
    static const struct {
        const char *name, *why;
    } cases[] = {{"__7.metadata", "cannot be read ("}, {"__8.metadata", "(a symlink)"},
                 {"__9.metadata", "(not a regular file)"}};
    const ckptio_dcp_committed c = committed();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *dir = setup("unreadable");
        put(dir, ".metadata", new_md, new_md_len);
        if (i == 0) put(dir, cases[i].name, "not a pickle", 12);
        if (i == 1) T_ASSERT(symlink(".metadata", in(dir, cases[i].name)) == 0);
        if (i == 2) T_ASSERT(mkfifo(in(dir, cases[i].name), 0600) == 0); /* never opened blocking */
        int fd = -1;
        char tmp[1024], note[1024];
        T_OK(ckptio_temporary_create(dir, "x", NULL, &fd, tmp, sizeof tmp));
        close(fd);
        list_stale(dir, &c, note, strrchr(tmp, '/') + 1);
        T_ASSERT_MSG(strstr(note, cases[i].name) && strstr(note, cases[i].why) && strstr(note, "keeping the files") &&
                         strstr(note, "the new checkpoint is committed"),
                     "note: %s", note);
        if (i == 2) unlink(in(dir, cases[i].name)); /* remove_dir unlinks only files it can */
        if (i == 1) unlink(in(dir, cases[i].name));
    }
}

/* The committed metadata is recognised by its bytes, unread: a planner's
 * classes that the restricted unpickler refuses do not stop the cleanup. */
static void test_committed_metadata_is_not_unpickled(void) {
    const char *dir = setup("committed");
    static const char ours[] = "pickled by a custom planner";
    put(dir, ".metadata", ours, sizeof ours);
    const ckptio_dcp_committed c = {".metadata", ours, sizeof ours, new_files, 1};
    char note[1024];
    list_stale(dir, &c, note, OLD_DATA);
    T_ASSERT(note[0] == '\0');
    /* Without it, that .metadata is unreadable: keep everything. */
    list_stale(dir, NULL, note, "");
    T_ASSERT(strstr(note, ".metadata cannot be read"));
}

/* A list taken at commit and removed later (cleanup="background") keeps
 * what a writer that reuses names (torch's, no lock) committed meanwhile. */
static void test_recheck_keeps_what_is_referenced_now(void) {
    const char *dir = setup("recheck");
    const char *const list[] = {OLD_DATA};
    size_t removed = 9;
    char note[1024];
    put(dir, ".metadata", old_md, old_md_len); /* torch's save of __0_0.distcp committed again */
    T_OK(ckptio_dcp_remove_files(dir, list, 1, CKPTIO_DCP_RECHECK, NULL, &removed, note, sizeof note));
    T_ASSERT(removed == 0 && t_file_exists(in(dir, OLD_DATA)));
    T_OK(ckptio_dcp_remove_files(dir, list, 1, 0, NULL, &removed, note, sizeof note));
    T_ASSERT(removed == 1 && !t_file_exists(in(dir, OLD_DATA)));
    /* A name that is gone already is no error. */
    T_OK(ckptio_dcp_remove_files(dir, list, 1, CKPTIO_DCP_SYNC, NULL, &removed, note, sizeof note));
    T_ASSERT(removed == 0);
}

/* Only regular files are removed: a symlink under a data file's name loses
 * nothing (neither the link nor its target), a directory or FIFO under such
 * a name stays, each is named in the note, and the commit succeeds. */
static void test_only_regular_files_are_removed(void) {
    const char *dir = setup("not_regular");
    const char *outside = t_path("not_regular_target.bin");
    t_write_file(outside, "precious", 8);
    T_ASSERT(symlink(outside, in(dir, "__5_0123456789ab_0.distcp")) == 0);
    T_ASSERT(mkdir(in(dir, "__6_0123456789ab_0.distcp"), 0755) == 0);
    put(dir, "__6_0123456789ab_0.distcp/inside", "x", 1);
    T_ASSERT(mkfifo(in(dir, ".ckptio-manifest-0123456789ab.json"), 0600) == 0);
    ckptio_dcp_commit_result r;
    T_OK(commit_with(dir, CKPTIO_DCP_SYNC | CKPTIO_DCP_CLEANUP, NULL, NULL, &r));
    T_ASSERT_MSG(strstr(r.note, "'__5_0123456789ab_0.distcp' alone: a symlink") &&
                     strstr(r.note, "'__6_0123456789ab_0.distcp' alone: a directory") &&
                     strstr(r.note, "'.ckptio-manifest-0123456789ab.json' alone: not a regular file"),
                 "note: %s", r.note);
    struct stat sb;
    T_ASSERT(lstat(in(dir, "__5_0123456789ab_0.distcp"), &sb) == 0 && S_ISLNK(sb.st_mode));
    T_ASSERT(same_file(outside, "precious", 8) && same_file(in(dir, "__6_0123456789ab_0.distcp/inside"), "x", 1));
    T_ASSERT(lstat(in(dir, ".ckptio-manifest-0123456789ab.json"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    T_ASSERT(!t_file_exists(in(dir, OLD_DATA)) && same_file(in(dir, ".metadata"), new_md, new_md_len));
    /* A list taken earlier that names them (the background removal): left alone too, no error. */
    const char *const list[] = {"__5_0123456789ab_0.distcp", "__6_0123456789ab_0.distcp"};
    size_t removed = 9;
    char note[1024];
    T_OK(ckptio_dcp_remove_files(dir, list, 2, CKPTIO_DCP_SYNC, NULL, &removed, note, sizeof note));
    T_ASSERT_MSG(removed == 0 && strstr(note, "a symlink") && strstr(note, "a directory"), "%zu: %s", removed, note);
    T_ASSERT(lstat(in(dir, "__5_0123456789ab_0.distcp"), &sb) == 0 && S_ISLNK(sb.st_mode));
    T_ASSERT(same_file(in(dir, "__6_0123456789ab_0.distcp/inside"), "x", 1));
    unlink(in(dir, "__5_0123456789ab_0.distcp"));
    unlink(in(dir, "__6_0123456789ab_0.distcp/inside"));
    rmdir(in(dir, "__6_0123456789ab_0.distcp"));
    unlink(in(dir, ".ckptio-manifest-0123456789ab.json"));
    unlink(outside);
}

/* ---- attributes ----------------------------------------------------------------------- */

static unsigned mode_of(const char *path) {
    struct stat sb;
    T_ASSERT(lstat(path, &sb) == 0);
    return sb.st_mode & 07777;
}

static void test_new_files_take_the_checkpoints_mode(void) {
    const mode_t old_umask = umask(022);
    const char *dir = setup("mode");
    T_ASSERT(chmod(in(dir, ".metadata"), 0600) == 0);
    unsigned mode = 0;
    T_OK(ckptio_dcp_reference(dir, ".metadata", &mode));
    T_ASSERT(mode == 0600);
    int fd = -1;
    char tmp[1024];
    T_OK(ckptio_temporary_create(dir, ".metadata", ".metadata", &fd, tmp, sizeof tmp));
    struct stat sb;
    T_ASSERT(fstat(fd, &sb) == 0 && (sb.st_mode & 0777) == 0600); /* from its creation on */
    close(fd);
    unlink(tmp);
    T_OK(ckptio_dcp_create_file(dir, "__0_0123456789ab_0.distcp", ".metadata"));
    T_ASSERT(mode_of(in(dir, "__0_0123456789ab_0.distcp")) == 0600);
    T_STATUS(ckptio_dcp_create_file(dir, "__0_0123456789ab_0.distcp", ".metadata"), CKPTIO_E_EXISTS);
    T_OK(commit(dir, 0));
    T_ASSERT(mode_of(in(dir, ".metadata")) == 0600 && mode_of(in(dir, NEW_MANIFEST)) == 0600 &&
             mode_of(in(dir, CKPTIO_DCP_LOCK_NAME)) == 0600);
    /* No reference: a new checkpoint's files are 0666 & ~umask, and no
     * placeholder is needed. A symlink is no reference. */
    T_STATUS(ckptio_dcp_reference(dir, "missing", &mode), CKPTIO_E_NOT_FOUND);
    T_ASSERT(symlink(".metadata", in(dir, "link")) == 0);
    T_STATUS(ckptio_dcp_reference(dir, "link", &mode), CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_dcp_create_file(dir, "__0_0123456789ab_1.distcp", "missing"));
    T_ASSERT(!t_file_exists(in(dir, "__0_0123456789ab_1.distcp")));
    T_OK(ckptio__dcp_write_file(dir, "fresh", "x", 1, "link", 0));
    T_ASSERT(mode_of(in(dir, "fresh")) == 0644);
    unlink(in(dir, "link"));
    umask(old_umask);
}

static void test_bad_arguments(void) {
    const char *dir = setup("args");
    T_STATUS(ckptio__dcp_write_file(dir, "a/b", "x", 1, NULL, 0), CKPTIO_E_INVAL);
    T_STATUS(ckptio__dcp_write_file(dir, "a", "x", 1, NULL, 1u << 9), CKPTIO_E_INVAL);
    T_STATUS(ckptio_dcp_remove_files(dir, (const char *const[]){"../x"}, 1, 0, NULL, NULL, NULL, 0), CKPTIO_E_INVAL);
    const char *const other[] = {OLD_DATA};
    T_STATUS(ckptio__dcp_manifest_write(dir, ".metadata", other, 1, items, nitems, NULL, 0), CKPTIO_E_INVAL);
    char token[13];
    T_ASSERT(ckptio__dcp_token(new_files, 1, token) && strcmp(token, "ee16d53c3f1b") == 0);
    const char *const two[] = {NEW_DATA, "__1_0123456789ab_0.distcp"};
    T_ASSERT(!ckptio__dcp_token(two, 2, token) && !ckptio__dcp_token(other, 1, token));
    /* The commit's own checks, before anything is written. */
    ckptio_dcp_commit_result r;
    ckptio_dcp_commit_options o = {"model.bin", new_md, new_md_len, new_files, 1, NULL, 0, 0, NULL, NULL, NULL, 0};
    T_STATUS(ckptio_dcp_commit(dir, &o, &r), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("must be .metadata or __RANK.metadata, not 'model.bin'");
    o.metadata_name = ".metadata";
    o.flags = CKPTIO_DCP_CLEANUP | CKPTIO_DCP_CLEANUP_LATER;
    T_STATUS(ckptio_dcp_commit(dir, &o, &r), CKPTIO_E_INVAL);
    o.flags = 1u << 12;
    T_STATUS(ckptio_dcp_commit(dir, &o, &r), CKPTIO_E_INVAL);
    o.flags = 0;
    o.files = (const char *const[]){"../x"};
    T_STATUS(ckptio_dcp_commit(dir, &o, &r), CKPTIO_E_INVAL);
    T_STATUS(ckptio_dcp_commit(dir, NULL, &r), CKPTIO_E_INVAL);
    T_ASSERT(same_file(in(dir, ".metadata"), old_md, old_md_len) && r.committed == 0);
    /* A missing directory: the listing fails, naming it. */
    char **names = NULL;
    size_t n = 0;
    T_STATUS(ckptio_dcp_stale_files(in(dir, "missing"), NULL, 0, NULL, &names, &n, NULL, 0), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS(": listdir: ");
}

/* ---- the lock --------------------------------------------------------------------------- */

/* Waits until `fd` reaches end of file (its writer closed or died). */
static void wait_closed(int fd) {
    char c;
    while (read(fd, &c, 1) > 0) {
    }
}

/* A child that takes the lock (shared or not) and holds it until its
 * release pipe closes or it is killed; returns its pid once it holds it.
 * With `fork_worker`, it then forks a worker of its own (a DataLoader
 * worker) and holds the lock until killed; the worker tries the lock,
 * answers 'b' when it finds it busy, and lives until the release pipe
 * closes. */
static pid_t holder(const char *dir, unsigned flags, bool fork_worker, int *release_fd) {
    int ready[2], release[2];
    T_ASSERT(pipe(ready) == 0 && pipe(release) == 0);
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(release[1]);
        ckptio_dcp_lock *lock = NULL;
        if (ckptio_dcp_lock_acquire(dir, NULL, flags, -1.0, NULL, NULL, &lock) != CKPTIO_OK) _exit(2);
        if (!fork_worker) {
            if (write(ready[1], "x", 1) != 1) _exit(3);
            wait_closed(release[0]);
            ckptio_dcp_lock_release(lock);
            _exit(0);
        }
        if (fork() == 0) {
            ckptio_dcp_lock *mine = NULL;
            const ckptio_status busy = ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &mine);
            ckptio_dcp_lock_release(lock); /* the parent's handle: frees it, unlocks nothing */
            if (write(ready[1], busy == CKPTIO_E_BUSY ? "b" : "f", 1) != 1) _exit(3);
            wait_closed(release[0]);
            _exit(0);
        }
        for (;;) pause();
    }
    close(ready[1]);
    close(release[0]);
    char c = 0;
    T_ASSERT(read(ready[0], &c, 1) == 1 && c != 'f');
    close(ready[0]);
    *release_fd = release[1];
    return pid;
}

static void reap(pid_t pid, int release_fd) {
    if (release_fd >= 0) close(release_fd);
    int status;
    T_ASSERT(waitpid(pid, &status, 0) == pid);
}

static int waits;
static int count_waits(double waited, void *user) {
    (void)waited;
    waits++;
    return user != NULL && waits >= 3; /* user set: cancel at the third check */
}

static void test_lock_busy_and_shared(void) {
    const char *dir = setup("lock");
    int rel;
    pid_t pid = holder(dir, 0, false, &rel);
    ckptio_dcp_lock *lock = NULL;
    /* At once: E_BUSY naming the holder. */
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock), CKPTIO_E_BUSY);
    char want[128];
    snprintf(want, sizeof want, "(lock .ckptio-dcp.lock, held by pid %d): this save wrote nothing", (int)pid);
    T_MESSAGE_HAS(want);
    T_ASSERT(strcmp(ckptio_last_error()->operation, "lock") == 0 && ckptio_last_error()->sys_errno == EWOULDBLOCK);
    /* Shared waits for an exclusive holder too; after a timeout, saying so. */
    const double t0 = ckptio__now();
    waits = 0;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0.3, count_waits, NULL, &lock),
             CKPTIO_E_BUSY);
    T_ASSERT(ckptio__now() - t0 >= 0.3 && waits >= 3);
    T_MESSAGE_HAS(") after waiting 0.3");
    /* The callback ends the wait. */
    waits = 0;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, -1.0, count_waits, &waits, &lock), CKPTIO_E_CANCELED);
    T_ASSERT(waits == 3 && lock == NULL);
    /* Waiting: succeeds once the holder lets go. */
    close(rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, -1.0, NULL, NULL, &lock));
    ckptio_dcp_lock_info info;
    T_OK(ckptio_dcp_lock_query(lock, &info));
    T_ASSERT(info.locked == 1);
    reap(pid, -1);
    T_OK(ckptio_dcp_lock_release(lock));
    T_OK(ckptio_dcp_lock_release(NULL));
    /* Shared beside shared; exclusive waits for both. */
    pid = holder(dir, CKPTIO_DCP_LOCK_SHARED, false, &rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0.0, NULL, NULL, &lock));
    ckptio_dcp_lock *excl = NULL;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &excl), CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_release(lock));
    reap(pid, rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &excl));
    T_OK(ckptio_dcp_lock_release(excl));
    /* The lock file stays (removing it would let two saves lock two inodes). */
    T_ASSERT(t_file_exists(in(dir, CKPTIO_DCP_LOCK_NAME)));
}

static void test_lock_dies_with_its_holder(void) {
    const char *dir = setup("lock-kill");
    int rel;
    /* SIGKILL: the kernel drops the flock with the holder. */
    pid_t pid = holder(dir, 0, false, &rel);
    ckptio_dcp_lock *lock = NULL;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock), CKPTIO_E_BUSY);
    kill(pid, SIGKILL);
    reap(pid, rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock));
    T_OK(ckptio_dcp_lock_release(lock));

    /* A holder forks a worker (a DataLoader worker) and is then killed: the
     * worker lives on but closed its copy of the descriptor at the fork, so
     * the lock ends with the holder. The worker found it busy. */
    pid = holder(dir, 0, true, &rel);
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock), CKPTIO_E_BUSY);
    kill(pid, SIGKILL);
    reap(pid, -1);
    /* The worker still runs (its release pipe is open): yet the lock is free. */
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock));
    T_OK(ckptio_dcp_lock_release(lock));
    close(rel);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    load_fixtures();
    T_RUN(test_commit_replaces_torch_checkpoint);
    T_RUN(test_commit_runs_its_steps_in_order);
    T_RUN(test_commit_stops_where_the_callback_says);
    T_RUN(test_commit_syncs_its_files_before_any_rename);
    T_RUN(test_commit_syncs_the_data_files_handed_over);
    T_RUN(test_commit_refuses_other_data_files);
    T_RUN(test_every_commit_call_fails_once);
    T_RUN(test_short_writes_are_resumed);
    T_RUN(test_stale_files);
    T_RUN(test_unreadable_metadata_keeps_everything);
    T_RUN(test_committed_metadata_is_not_unpickled);
    T_RUN(test_recheck_keeps_what_is_referenced_now);
    T_RUN(test_only_regular_files_are_removed);
    T_RUN(test_new_files_take_the_checkpoints_mode);
    T_RUN(test_bad_arguments);
    T_RUN(test_lock_busy_and_shared);
    T_RUN(test_lock_dies_with_its_holder);
    json_decref(manifest_json);
    free(old_md);
    free(new_md);
    free(old_data);
    free(new_data);
    free(manifest_text);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
