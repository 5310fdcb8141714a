/*
 * test_dcp_commit.c - the DCP directory commit (include/ckptio/dcp.h "DCP
 * directory commit", src/ckpt/dcp_{commit,commit_run,manifest_write,
 * names}.c), as ckptio.dcp's writer runs it.
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
 *  - Attributes: every new file takes the replaced .metadata's mode from
 *    its creation on.
 * Which files step 4 removes: test_dcp_cleanup.c; the lock: test_dcp_lock.c.
 */
#include "dcp_commit_helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    T_RUN(test_new_files_take_the_checkpoints_mode);
    T_RUN(test_bad_arguments);
    free_fixtures();
    return T_EXIT_PASS;
}
