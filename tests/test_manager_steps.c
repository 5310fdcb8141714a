/*
 * test_manager_steps.c - the checkpoint manager's steps (src/ckpt/steps_*.c):
 * names, scan, the states complete / partial / damaged under damage (a
 * flipped byte, a truncated file, a deleted or forged marker, a replaced
 * .metadata), latest with its skipped steps, begin / commit / remove /
 * clean, retention (keep_last, keep_every, the newest good step kept), and
 * fault injection (ENOSPC, EIO, rename and fsync failures) on every step
 * that changes the root: the error names the step and the operation and
 * the root stays resumable.
 *
 * Steps are filled with a real ckptio.dcp checkpoint (tests/data/dcp/sharded,
 * with its checksum manifest) copied file by file.
 */
#include "helpers.h"
#include "io_inject.h"
#include "io_internal.h"
#include "steps_fixture.h"
#include "steps_internal.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ckptio_engine *engine;

/* begin and copy the fixture: a step whose DCP save is done. */
static void write_step(const char *root, uint64_t step) {
    char dir[4096];
    T_OK(ckptio_steps_begin(root, step, dir, sizeof dir));
    copy_fixture(root, step);
}

static void save_step(const char *root, uint64_t step) {
    write_step(root, step);
    T_OK(ckptio_steps_commit(root, step));
}

static ckptio_step_info check(const char *root, uint64_t step, ckptio_step_check c) {
    ckptio_step_info info;
    T_OK(ckptio_steps_check(engine, root, step, c, &info));
    T_ASSERT(info.step == step);
    return info;
}

static uint64_t latest(const char *root, ckptio_step_check c, size_t *nskipped, ckptio_step_info **skipped) {
    uint64_t step = (uint64_t)-1;
    T_OK(ckptio_steps_latest(engine, root, c, &step, skipped, nskipped));
    return step;
}

static void flip_byte(const char *path, size_t at) {
    size_t len = 0;
    unsigned char *data = t_read_file(path, &len);
    T_ASSERT(at < len);
    data[at] ^= 0x01;
    t_write_file(path, data, len);
    free(data);
}

static void truncate_by(const char *path, off_t n) {
    struct stat sb;
    T_ASSERT(stat(path, &sb) == 0);
    T_ASSERT(truncate(path, sb.st_size - n) == 0);
}

static bool has(const char *text, const char *needle) { return strstr(text, needle) != NULL; }

/* ---- names and scan ---------------------------------------------------------------- */

static void test_names(void) {
    char name[32];
    uint64_t step = 0;
    T_OK(ckptio_steps_dir_name(100, name, sizeof name));
    T_ASSERT(strcmp(name, "step_00000100") == 0);
    T_OK(ckptio_steps_dir_name(123456789012ull, name, sizeof name));
    T_ASSERT(strcmp(name, "step_123456789012") == 0);
    T_STATUS(ckptio_steps_dir_name(CKPTIO_STEP_MAX + 1, name, sizeof name), CKPTIO_E_RANGE);
    T_STATUS(ckptio_steps_dir_name(1, name, 8), CKPTIO_E_RANGE);
    T_ASSERT(ckptio__step_from_name("step_00000100", &step) && step == 100);
    T_ASSERT(ckptio__step_from_name("step_123456789012", &step) && step == 123456789012ull);
    T_ASSERT(!ckptio__step_from_name("step_100", &step));
    T_ASSERT(!ckptio__step_from_name("step_000000100", &step)); /* not canonical */
    T_ASSERT(!ckptio__step_from_name("step_0000010x", &step));
    T_ASSERT(!ckptio__step_from_name("step_-0000100", &step));
    T_ASSERT(!ckptio__step_from_name("xstep_00000100", &step));
}

static void test_scan(void) {
    const char *root = new_root();
    ckptio_step_info *steps = NULL;
    size_t n = 99;
    T_OK(ckptio_steps_scan(root, &steps, &n)); /* no root yet: no steps */
    T_ASSERT(n == 0);
    ckptio_steps_free(steps);
    save_step(root, 20);
    save_step(root, 10);
    char path[4096];
    /* Not steps: a non-canonical name, a file, a symlink to a step. */
    snprintf(path, sizeof path, "%s/step_30", root);
    T_ASSERT(mkdir(path, 0777) == 0);
    snprintf(path, sizeof path, "%s/step_00000040", root);
    t_write_file(path, "x", 1);
    snprintf(path, sizeof path, "%s/step_00000050", root);
    T_ASSERT(symlink("step_00000010", path) == 0);
    snprintf(path, sizeof path, "%s/step_00000060", root); /* a save that never committed */
    T_ASSERT(mkdir(path, 0777) == 0);
    T_OK(ckptio_steps_scan(root, &steps, &n));
    T_ASSERT(n == 3);
    T_ASSERT(steps[0].step == 10 && steps[0].state == CKPTIO_STEP_COMPLETE && steps[0].files == 6);
    T_ASSERT(steps[0].bytes > 10000 && steps[0].reason[0] == '\0');
    T_ASSERT(steps[1].step == 20 && steps[1].state == CKPTIO_STEP_COMPLETE);
    T_ASSERT(steps[2].step == 60 && steps[2].state == CKPTIO_STEP_PARTIAL && has(steps[2].reason, "empty"));
    ckptio_steps_free(steps);
    /* Removing a step name that is a symlink (to step 10) or a file follows nothing and removes nothing. */
    T_ASSERT(ckptio_steps_remove(root, 50) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT(has(ckptio_last_error()->message, "a symlink") && has(ckptio_last_error()->message, "nothing is removed"));
    T_ASSERT(ckptio_steps_remove(root, 40) == CKPTIO_E_UNSUPPORTED);
    T_OK(ckptio_steps_scan(root, &steps, &n));
    T_ASSERT(n == 3 && steps[0].step == 10 && steps[0].state == CKPTIO_STEP_COMPLETE && steps[0].files == 6);
    ckptio_steps_free(steps);
    snprintf(path, sizeof path, "%s/step_00000050", root);
    struct stat lsb;
    T_ASSERT(lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode));
    /* The marker holds the step and .metadata's size and hash. */
    size_t len = 0;
    char *text = t_read_file(step_file(root, 10, CKPTIO_STEP_MARKER), &len);
    ckptio__step_marker m;
    T_OK(ckptio__step_marker_parse(text, len, "marker", &m));
    T_ASSERT(m.step == 10 && m.metadata_size == 1512);
    free(text);
    T_STATUS(ckptio_steps_check(engine, root, 70, CKPTIO_STEP_CHECK_FULL, &(ckptio_step_info){0}), CKPTIO_E_NOT_FOUND);
    T_STATUS(ckptio_steps_check(NULL, root, 10, CKPTIO_STEP_CHECK_FAST, &(ckptio_step_info){0}), CKPTIO_E_INVAL);
}

/* ---- the marker's parser --------------------------------------------------------------- */

static void test_marker_parse(void) {
    static const struct {
        const char *text;
        const char *where;
    } bad[] = {
        {"", "line 1"},
        {"ckptio-step 2\nstep 1\nmetadata 5 0123456789abcdef\n", "line 1"},
        {"ckptio-step 1\nstep 01\nmetadata 5 0123456789abcdef\n", "line 2"},
        {"ckptio-step 1\nstep -1\nmetadata 5 0123456789abcdef\n", "line 2"},
        {"ckptio-step 1\nstep 1000000000000000000\nmetadata 5 0123456789abcdef\n", "line 2"},
        {"ckptio-step 1\nstep 99999999999999999999\nmetadata 5 0123456789abcdef\n", "line 2"},
        {"ckptio-step 1\nstep 1\nmetadata 5 0123456789ABCDEF\n", "line 3"},
        {"ckptio-step 1\nstep 1\nmetadata 5 0123456789abcde\n", "line 3"},
        {"ckptio-step 1\nstep 1\nmetadata 5 0123456789abcdef", "line 3"},
        {"ckptio-step 1\nstep 1\nmetadata 5 0123456789abcdef\nx", "line 4"},
    };
    ckptio__step_marker m;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        T_STATUS(ckptio__step_marker_parse(bad[i].text, strlen(bad[i].text), "M", &m), CKPTIO_E_FORMAT);
        T_MESSAGE_HAS(bad[i].where);
        T_MESSAGE_HAS("parse step marker");
    }
    const char *good = "ckptio-step 1\nstep 0\nmetadata 0 00000000000000ff\n";
    T_OK(ckptio__step_marker_parse(good, strlen(good), "M", &m));
    T_ASSERT(m.step == 0 && m.metadata_size == 0 && m.metadata_xxh3 == 0xff);
    char out[128];
    const size_t n = ckptio__step_marker_format(&m, out, sizeof out);
    T_ASSERT(n == strlen(good) && memcmp(out, good, n) == 0);
    T_ASSERT(ckptio__step_marker_format(&m, out, 10) == 0);
}

/* ---- damage ------------------------------------------------------------------------------ */

static void test_damage(void) {
    const char *root = new_root();
    for (uint64_t s = 10; s <= 50; s += 10) save_step(root, s);
    size_t nskipped = 0;
    ckptio_step_info *skipped = NULL;
    T_ASSERT(latest(root, CKPTIO_STEP_CHECK_FULL, &nskipped, &skipped) == 50 && nskipped == 0);
    ckptio_steps_free(skipped);

    /* A flipped byte in the newest step's data: FULL skips it, FAST cannot see it. */
    flip_byte(step_file(root, 50, DATA0), 1000);
    ckptio_step_info info = check(root, 50, CKPTIO_STEP_CHECK_FULL);
    T_ASSERT(info.state == CKPTIO_STEP_DAMAGED && has(info.reason, "XXH3-64") && has(info.reason, DATA0));
    T_ASSERT(check(root, 50, CKPTIO_STEP_CHECK_FAST).state == CKPTIO_STEP_COMPLETE);
    T_ASSERT(latest(root, CKPTIO_STEP_CHECK_FULL, &nskipped, &skipped) == 40);
    T_ASSERT(nskipped == 1 && skipped[0].step == 50 && skipped[0].state == CKPTIO_STEP_DAMAGED);
    ckptio_steps_free(skipped);

    /* A truncated file: FAST sees it from the sizes. */
    truncate_by(step_file(root, 40, "__1_80b4e47c5ac9_0.distcp"), 100);
    info = check(root, 40, CKPTIO_STEP_CHECK_FAST);
    T_ASSERT(info.state == CKPTIO_STEP_DAMAGED && has(info.reason, "truncated"));
    T_ASSERT(latest(root, CKPTIO_STEP_CHECK_FAST, &nskipped, &skipped) == 50 && nskipped == 0);
    ckptio_steps_free(skipped);

    /* A deleted marker: partial. */
    T_ASSERT(unlink(step_file(root, 30, CKPTIO_STEP_MARKER)) == 0);
    T_ASSERT(check(root, 30, CKPTIO_STEP_CHECK_MARKER).state == CKPTIO_STEP_PARTIAL);
    T_ASSERT(latest(root, CKPTIO_STEP_CHECK_FULL, &nskipped, &skipped) == 20);
    T_ASSERT(nskipped == 3 && skipped[0].step == 50 && skipped[1].step == 40 && skipped[2].step == 30);
    T_ASSERT(skipped[2].state == CKPTIO_STEP_PARTIAL);
    ckptio_steps_free(skipped);

    /* Another step's marker: damaged at the marker level. */
    size_t len = 0;
    void *m10 = t_read_file(step_file(root, 10, CKPTIO_STEP_MARKER), &len);
    t_write_file(step_file(root, 30, CKPTIO_STEP_MARKER), m10, len);
    info = check(root, 30, CKPTIO_STEP_CHECK_MARKER);
    T_ASSERT(info.state == CKPTIO_STEP_DAMAGED && has(info.reason, "belongs to step 10"));
    free(m10);
    /* A marker that does not parse. */
    t_write_file(step_file(root, 30, CKPTIO_STEP_MARKER), "garbage", 7);
    info = check(root, 30, CKPTIO_STEP_CHECK_MARKER);
    T_ASSERT(info.state == CKPTIO_STEP_DAMAGED && has(info.reason, "line 1"));

    /* .metadata replaced after the commit (same length, one byte off). */
    flip_byte(step_file(root, 20, ".metadata"), 5);
    info = check(root, 20, CKPTIO_STEP_CHECK_FAST);
    T_ASSERT(info.state == CKPTIO_STEP_DAMAGED && has(info.reason, "replaced or damaged after the commit"));
    /* A missing data file. */
    T_ASSERT(unlink(step_file(root, 10, "__1_80b4e47c5ac9_0.distcp")) == 0);
    info = check(root, 10, CKPTIO_STEP_CHECK_FAST);
    T_ASSERT(info.state == CKPTIO_STEP_DAMAGED && has(info.reason, "__1_80b4e47c5ac9_0.distcp"));

    uint64_t step = 7;
    T_STATUS(ckptio_steps_latest(engine, root, CKPTIO_STEP_CHECK_FULL, &step, &skipped, &nskipped), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("no complete step");
    T_ASSERT(step == 7 && nskipped == 5);
    ckptio_steps_free(skipped);
}

/* A check that fails for a reason that is not damage (an I/O error, memory,
 * a permission, a cancel) is an error naming the step, never DAMAGED: the
 * walk does not go on to an older step and nothing is replaced. Every read
 * and open of a FULL check of the newest step fails in turn. */
typedef struct check_fault {
    ckptio__io_kind kind;
    int err;
    ckptio_status status;
} check_fault;

static void test_failed_checks_are_not_damage(void) {
    const char *root = new_root();
    save_step(root, 10);
    save_step(root, 20);
    static const check_fault cases[] = {{CKPTIO__IO_READ, EIO, CKPTIO_E_IO},
                                        {CKPTIO__IO_READ, ENOMEM, CKPTIO_E_NOMEM},
                                        {CKPTIO__IO_OPEN, EIO, CKPTIO_E_IO},
                                        {CKPTIO__IO_OPEN, EACCES, CKPTIO_E_PERMISSION},
                                        {CKPTIO__IO_OPEN, EMFILE, CKPTIO_E_IO}};
    unsigned fired_total = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        for (uint64_t nth = 1;; nth++) {
            T_ASSERT(nth < 200);
            ckptio_step_info info;
            ckptio__io_inject(cases[k].kind, nth, cases[k].err, 0, false);
            const ckptio_status st = ckptio_steps_check(engine, root, 20, CKPTIO_STEP_CHECK_FULL, &info);
            const bool fired = ckptio__io_inject_countdown(cases[k].kind) == 0;
            ckptio__io_inject_reset();
            if (!fired) {
                T_OK(st);
                T_ASSERT(info.state == CKPTIO_STEP_COMPLETE);
                break;
            }
            fired_total++;
            /* Either the request was retried or served otherwise (complete), or the check failed with the cause. */
            if (st == CKPTIO_OK) {
                T_ASSERT_MSG(info.state == CKPTIO_STEP_COMPLETE, "%s at %s request %llu: classified %d: %s",
                             strerror(cases[k].err), cases[k].kind == CKPTIO__IO_READ ? "read" : "open",
                             (unsigned long long)nth, (int)info.state, info.reason);
                continue;
            }
            T_ASSERT_MSG(st == cases[k].status, "status %d, expected %d: %s", (int)st, (int)cases[k].status,
                         ckptio_last_error_message());
            T_MESSAGE_HAS("step 20 (");
            T_MESSAGE_HAS(": check: ");
            T_ASSERT(ckptio_last_error()->sys_errno == cases[k].err);
            /* latest fails the same way instead of taking step 10. */
            uint64_t step = 7;
            size_t nskipped = 9;
            ckptio_step_info *skipped = NULL;
            ckptio__io_inject(cases[k].kind, nth, cases[k].err, 0, false);
            const ckptio_status lst = ckptio_steps_latest(engine, root, CKPTIO_STEP_CHECK_FULL, &step, &skipped,
                                                          &nskipped);
            ckptio__io_inject_reset();
            T_ASSERT_MSG(lst == cases[k].status && step == 7, "latest: status %d, step %llu: %s", (int)lst,
                         (unsigned long long)step, ckptio_last_error_message());
            T_ASSERT(nskipped == 0);
            ckptio_steps_free(skipped);
        }
    }
    T_ASSERT(fired_total >= 5);
    printf("# check: %u injected faults fired\n", fired_total);

    /* A cancel (ckptio_interrupt) during a FULL check: E_CANCELED, not damage. */
    T_OK(ckptio_interrupt(1));
    ckptio_step_info info;
    const ckptio_status st = ckptio_steps_check(engine, root, 20, CKPTIO_STEP_CHECK_FULL, &info);
    uint64_t step = 7;
    const ckptio_status lst = ckptio_steps_latest(engine, root, CKPTIO_STEP_CHECK_FULL, &step, NULL, NULL);
    T_OK(ckptio_interrupt(0));
    T_ASSERT_MSG(st == CKPTIO_E_CANCELED, "status %d: %s", (int)st, ckptio_last_error_message());
    T_ASSERT(lst == CKPTIO_E_CANCELED && step == 7);
    /* Nothing was lost on their account: both steps are complete. */
    T_ASSERT(check(root, 20, CKPTIO_STEP_CHECK_FULL).state == CKPTIO_STEP_COMPLETE);
    T_ASSERT(check(root, 10, CKPTIO_STEP_CHECK_FULL).state == CKPTIO_STEP_COMPLETE);
    /* Proven damage still is damage, with the status that proves it. */
    flip_byte(step_file(root, 20, DATA0), 1000);
    info = check(root, 20, CKPTIO_STEP_CHECK_FULL);
    T_ASSERT(info.state == CKPTIO_STEP_DAMAGED && info.status == CKPTIO_E_CHECKSUM);
    T_ASSERT(check(root, 10, CKPTIO_STEP_CHECK_FULL).status == CKPTIO_OK);
}

/* ---- begin, remove, clean, retention --------------------------------------------------- */

static void test_begin_clean(void) {
    const char *root = new_root();
    char dir[4096];
    save_step(root, 10);
    T_STATUS(ckptio_steps_begin(root, 10, dir, sizeof dir), CKPTIO_E_EXISTS);
    T_MESSAGE_HAS("step 10 (");
    T_MESSAGE_HAS("begin");
    T_ASSERT(check(root, 10, CKPTIO_STEP_CHECK_FULL).state == CKPTIO_STEP_COMPLETE);
    /* A crashed save (begun, files, no marker), a crashed removal (the marker gone first) and a save that
     * crashed before its begun mark (an empty directory): partial, cleaned. */
    save_step(root, 30);
    T_ASSERT(unlink(step_file(root, 30, CKPTIO_STEP_MARKER)) == 0);
    char partial[4096];
    snprintf(partial, sizeof partial, "%s/step_00000020", root);
    T_ASSERT(mkdir(partial, 0777) == 0);
    t_write_file(step_file(root, 20, CKPTIO_STEP_BEGUN), "", 0);
    t_write_file(step_file(root, 20, DATA0), "abc", 3);
    snprintf(partial, sizeof partial, "%s/step_00000025", root);
    T_ASSERT(mkdir(partial, 0777) == 0);
    uint64_t *removed = NULL;
    size_t n = 0;
    T_OK(ckptio_steps_clean(root, &removed, &n));
    T_ASSERT(n == 3 && removed[0] == 20 && removed[1] == 25 && removed[2] == 30);
    ckptio_steps_list_free(removed);
    T_ASSERT(!t_file_exists(step_file(root, 20, "")) && !t_file_exists(step_file(root, 30, "")));
    T_ASSERT(!t_file_exists(partial));
    T_ASSERT(check(root, 10, CKPTIO_STEP_CHECK_FULL).state == CKPTIO_STEP_COMPLETE);
    /* begin removes the partial steps too, and a partial step of the same number is replaced. */
    T_OK(ckptio_steps_begin(root, 40, dir, sizeof dir));
    T_OK(ckptio_steps_begin(root, 40, dir, sizeof dir));
    T_ASSERT(has(dir, "/step_00000040"));
    T_OK(ckptio_steps_begin(root, 50, dir, sizeof dir));
    T_ASSERT(!t_file_exists(step_file(root, 40, "")));
    /* No .metadata: nothing to commit. */
    T_STATUS(ckptio_steps_commit(root, 50), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("step 50 (");
    T_MESSAGE_HAS("commit");
    T_ASSERT(!t_file_exists(step_file(root, 50, CKPTIO_STEP_MARKER)));
    /* A subdirectory inside a step is not removed with it, nor anything else
     * (tests/test_manager_removal.c has every kind of entry). */
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/step_00000050/nested", root);
    T_ASSERT(mkdir(sub, 0777) == 0);
    T_STATUS(ckptio_steps_remove(root, 50), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("remove");
    T_MESSAGE_HAS("'nested' is a directory");
    T_ASSERT(t_file_exists(sub) && t_file_exists(step_file(root, 50, CKPTIO_STEP_BEGUN)));
}

static void expect_steps(const char *root, const uint64_t *want, size_t nwant) {
    ckptio_step_info *steps = NULL;
    size_t n = 0;
    T_OK(ckptio_steps_scan(root, &steps, &n));
    T_ASSERT_MSG(n == nwant, "%zu steps, expected %zu", n, nwant);
    for (size_t i = 0; i < n; i++)
        T_ASSERT_MSG(steps[i].step == want[i], "step %zu: %llu", i, (unsigned long long)steps[i].step);
    ckptio_steps_free(steps);
}

static void test_retention(void) {
    const char *root = new_root();
    uint64_t *removed = NULL;
    size_t n = 0;
    for (uint64_t s = 10; s <= 30; s += 10) save_step(root, s);
    T_OK(ckptio_steps_retain(engine, root, 3, 0, &removed, &n)); /* nothing beyond 3 */
    T_ASSERT(n == 0);
    ckptio_steps_list_free(removed);
    for (uint64_t s = 40; s <= 70; s += 10) save_step(root, s);
    T_OK(ckptio_steps_retain(engine, root, 3, 20, &removed, &n)); /* keep 50..70, and 20, 40 */
    T_ASSERT(n == 2 && removed[0] == 10 && removed[1] == 30);
    ckptio_steps_list_free(removed);
    expect_steps(root, (const uint64_t[]){20, 40, 50, 60, 70}, 5);
    /* A partial step is not retention's business. */
    char dir[4096];
    T_OK(ckptio_steps_begin(root, 80, dir, sizeof dir));
    T_OK(ckptio_steps_retain(engine, root, 2, 0, &removed, &n));
    T_ASSERT(n == 3 && removed[0] == 20 && removed[1] == 40 && removed[2] == 50);
    ckptio_steps_list_free(removed);
    expect_steps(root, (const uint64_t[]){60, 70, 80}, 3);
    T_OK(ckptio_steps_remove(root, 80));

    /* The newest K damaged: the newest good step stays. */
    const char *r2 = new_root();
    for (uint64_t s = 10; s <= 50; s += 10) save_step(r2, s);
    truncate_by(step_file(r2, 50, DATA0), 10);
    T_ASSERT(unlink(step_file(r2, 40, ".metadata")) == 0);
    T_OK(ckptio_steps_retain(engine, r2, 2, 0, &removed, &n));
    T_ASSERT(n == 2 && removed[0] == 10 && removed[1] == 20);
    ckptio_steps_list_free(removed);
    expect_steps(r2, (const uint64_t[]){30, 40, 50}, 3);
    T_ASSERT(latest(r2, CKPTIO_STEP_CHECK_FULL, &n, NULL) == 30);
}

/* ---- fault injection ----------------------------------------------------------------------- */

typedef struct fault_case {
    ckptio__io_kind kind;
    int err;
    const char *label;
} fault_case;

static const fault_case faults[] = {
    {CKPTIO__IO_WRITE, ENOSPC, "write ENOSPC"}, {CKPTIO__IO_WRITE, EIO, "write EIO"},
    {CKPTIO__IO_FSYNC, EIO, "fsync EIO"},       {CKPTIO__IO_RENAME, EIO, "rename EIO"},
    {CKPTIO__IO_RENAME, ENOSPC, "rename ENOSPC"}, {CKPTIO__IO_OPEN, EIO, "open EIO"},
    {CKPTIO__IO_UNLINK, EIO, "unlink EIO"},     {CKPTIO__IO_LISTDIR, EIO, "opendir EIO"},
};

/* The root after any failure: the newest complete step verifies and is `want`. */
static void expect_resumable(const char *root, uint64_t want, const char *what) {
    size_t n = 0;
    uint64_t step = (uint64_t)-1;
    T_ASSERT_MSG(ckptio_steps_latest(engine, root, CKPTIO_STEP_CHECK_FULL, &step, NULL, &n) == CKPTIO_OK &&
                 step == want,
                 "%s: resumes from step %lld, expected %llu (%s)", what, (long long)step, (unsigned long long)want,
                 ckptio_last_error_message());
}

/* Runs `attempt` for every fault of `faults`, injected at request 1, 2, ...
 * until a run in which it did not fire (the operation made fewer requests of
 * that kind); `attempt` makes its assertions and says whether the fault
 * fired. Returns how many fired. */
typedef bool (*fault_attempt)(const fault_case *f, uint64_t nth);

static unsigned each_fault(fault_attempt attempt) {
    unsigned fired_total = 0;
    for (size_t k = 0; k < sizeof faults / sizeof *faults; k++) {
        for (uint64_t nth = 1;; nth++) {
            T_ASSERT(nth < 200);
            if (!attempt(&faults[k], nth)) break;
            fired_total++;
        }
    }
    return fired_total;
}

static bool commit_with_fault(const fault_case *f, uint64_t nth) {
    const char *root = new_root();
    save_step(root, 10);
    /* The new step's data is in place; only its commit sees the fault. */
    write_step(root, 20);
    char dir[4096];
    snprintf(dir, sizeof dir, "%.4000s/step_00000020", root);
    ckptio__io_inject(f->kind, nth, f->err, 0, false);
    const ckptio_status st = ckptio_steps_commit(root, 20);
    const bool fired = ckptio__io_inject_countdown(f->kind) == 0;
    ckptio__io_inject_reset();
    char what[128];
    snprintf(what, sizeof what, "commit, %s at request %llu", f->label, (unsigned long long)nth);
    if (!fired) {
        T_ASSERT_MSG(st == CKPTIO_OK, "%s: %s", what, ckptio_last_error_message());
        expect_resumable(root, 20, what);
        return false;
    }
    if (st == CKPTIO_OK) { /* e.g. a failed unlink of nothing: the commit completed */
        expect_resumable(root, 20, what);
        return true;
    }
    const char *msg = ckptio_last_error_message();
    T_ASSERT_MSG(has(msg, "step 20 (") && has(msg, ": commit: ") && has(msg, strerror(f->err)), "%s: %s", what, msg);
    /* Either the marker never landed (resume from 10) or it did and only a
     * later fsync failed (then step 20 is complete). */
    const bool marked = t_file_exists(step_file(root, 20, CKPTIO_STEP_MARKER));
    expect_resumable(root, marked ? 20 : 10, what);
    T_ASSERT_MSG(t_count_entries(dir, "ckptio-tmp") == 0, "%s: a temporary was left", what);
    return true;
}

static void test_faults_commit(void) {
    const unsigned fired_total = each_fault(commit_with_fault);
    T_ASSERT(fired_total >= 4);
    printf("# commit: %u injected faults fired\n", fired_total);
}

static bool retain_with_fault(const fault_case *f, uint64_t nth) {
    const char *root = new_root();
    for (uint64_t s = 10; s <= 40; s += 10) save_step(root, s);
    uint64_t *removed = NULL;
    size_t n = 0;
    ckptio__io_inject(f->kind, nth, f->err, 0, false);
    const ckptio_status st = ckptio_steps_retain(engine, root, 2, 0, &removed, &n);
    const bool fired = ckptio__io_inject_countdown(f->kind) == 0;
    ckptio__io_inject_reset();
    ckptio_steps_list_free(removed);
    char what[128];
    snprintf(what, sizeof what, "retention, %s at request %llu", f->label, (unsigned long long)nth);
    if (st != CKPTIO_OK) {
        const char *msg = ckptio_last_error_message();
        /* The scan's own listing fails before any step is named; a failed check names its step. */
        T_ASSERT_MSG(((has(msg, "step 10 (") || has(msg, "step 20 (")) && has(msg, ": remove: ")) ||
                         has(msg, "listing the steps") || has(msg, ": check: "),
                     "%s: %s", what, msg);
    }
    /* Whatever happened, the newest steps are intact. */
    expect_resumable(root, 40, what);
    T_ASSERT(check(root, 30, CKPTIO_STEP_CHECK_FULL).state == CKPTIO_STEP_COMPLETE);
    /* What a failed removal left is partial, and clean finishes it. */
    if (st != CKPTIO_OK) {
        T_OK(ckptio_steps_clean(root, NULL, NULL));
        ckptio_step_info *steps = NULL;
        T_OK(ckptio_steps_scan(root, &steps, &n));
        for (size_t i = 0; i < n; i++) T_ASSERT(steps[i].state == CKPTIO_STEP_COMPLETE);
        ckptio_steps_free(steps);
    }
    return fired;
}

static void test_faults_remove(void) {
    const unsigned fired_total = each_fault(retain_with_fault);
    T_ASSERT(fired_total >= 4);
    printf("# retention: %u injected faults fired\n", fired_total);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_names);
    T_RUN(test_scan);
    T_RUN(test_marker_parse);
    T_RUN(test_damage);
    T_RUN(test_failed_checks_are_not_damage);
    T_RUN(test_begin_clean);
    T_RUN(test_retention);
    T_RUN(test_faults_commit);
    T_RUN(test_faults_remove);
    ckptio_engine_destroy(engine);
    return T_EXIT_PASS;
}
