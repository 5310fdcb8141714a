/*
 * test_atomic.c - atomic save: temporary + fsync + rename + directory fsync.
 * Commit replaces an old file; close without commit leaves it intact and no
 * temporary; injected ENOSPC/EIO in the middle of a write, at fsync or at
 * rename leave the final name absent (or the old content intact) and no
 * temporaries, with errors naming file and offset; EINTR and short
 * transfers are resumed and the bytes are right; EXCLUSIVE; files whose
 * names nothing references yet, committed together (renamed, then every file
 * and the directory fsynced at once). Every case runs on each backend the
 * kernel allows, with 0 and 4 threads.
 */
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ckptio_backend g_backend = CKPTIO_BACKEND_PREAD;
static int64_t g_threads = 0;

static ckptio_engine *new_engine(int64_t direct) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, g_backend));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, g_threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, direct));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT_MIN_BYTES, 0));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 64 << 10));
    return e;
}

/* Writes `len` bytes of `data` to `f` at 0 in one plan (split into 64 KiB
 * tasks by the engine). */
static ckptio_status write_all(ckptio_engine *e, ckptio_file *f, const void *data, size_t len) {
    ckptio_plan *p;
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    ckptio_extent x = {.file = f, .length = len, .memory = (void *)data, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_plan_add(p, &x));
    ckptio_status st = ckptio_engine_execute(e, p);
    ckptio_plan_destroy(p);
    return st;
}

static ckptio_status read_all(ckptio_engine *e, ckptio_file *f, void *data, size_t len) {
    ckptio_plan *p;
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    ckptio_extent x = {.file = f, .length = len, .memory = data, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_plan_add(p, &x));
    ckptio_status st = ckptio_engine_execute(e, p);
    ckptio_plan_destroy(p);
    return st;
}

static void expect_file(const char *path, const void *data, size_t len) {
    size_t got;
    void *img = t_read_file(path, &got);
    T_ASSERT_MSG(got == len && memcmp(img, data, len) == 0, "%s: %zu bytes, expected %zu", path, got, len);
    free(img);
}

static void expect_no_temporaries(void) {
    T_ASSERT_MSG(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0, "temporaries left in %s", t_tmpdir());
}

static const size_t N = (1u << 20) + 4097; /* 17+ tasks, unaligned end */

static void test_commit_replaces(void) {
    const char *path = t_path("model.bin");
    t_write_file(path, "old", 3);
    unsigned char *data = malloc(N);
    t_fill_random(data, N, 1);
    ckptio_engine *e = new_engine(CKPTIO_DIRECT_AUTO);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_ASSERT(t_count_entries(t_tmpdir(), ".model.bin.ckptio-tmp-") == 1);
    T_OK(write_all(e, f, data, N));
    expect_file(path, "old", 3); /* nothing visible before commit */
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(e, &a));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_engine_stats(e, &b));
    T_ASSERT(b.seconds_fsync > a.seconds_fsync); /* sync is on by default */
    expect_file(path, data, N);
    expect_no_temporaries();
    /* The new file has ordinary permissions (0666 & ~umask). */
    mode_t mask = umask(0);
    umask(mask);
    struct stat sb;
    T_ASSERT(stat(path, &sb) == 0 && (sb.st_mode & 0777) == (0666 & ~mask));
    T_OK(ckptio_file_close(f));
    expect_file(path, data, N);

    /* OPT_SYNC = 0 skips every fsync. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 0));
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(write_all(e, f, "new", 3));
    T_OK(ckptio_engine_stats(e, &a));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_engine_stats(e, &b));
    T_ASSERT(b.seconds_fsync == a.seconds_fsync);
    T_OK(ckptio_file_close(f));
    expect_file(path, "new", 3);
    T_OK(ckptio_engine_destroy(e));
    free(data);
    unlink(path);
}

static void test_close_without_commit(void) {
    const char *path = t_path("keep.bin");
    t_write_file(path, "precious", 8);
    unsigned char *data = malloc(N);
    t_fill_random(data, N, 2);
    ckptio_engine *e = new_engine(CKPTIO_DIRECT_AUTO);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(write_all(e, f, data, N));
    T_OK(ckptio_file_close(f));
    expect_file(path, "precious", 8);
    expect_no_temporaries();
    /* A new name: nothing at all is left. */
    const char *fresh = t_path("never.bin");
    T_OK(ckptio_file_open(e, fresh, CKPTIO_OPEN_WRITE, &f));
    T_OK(write_all(e, f, data, N));
    T_OK(ckptio_file_close(f));
    T_ASSERT(!t_file_exists(fresh));
    expect_no_temporaries();
    T_OK(ckptio_engine_destroy(e));
    free(data);
    unlink(path);
}

static void failed_write_case(int err, ckptio_status want, int64_t direct, bool have_old) {
    const char *path = t_path("fail.bin");
    if (have_old) t_write_file(path, "old content", 11);
    else unlink(path);
    unsigned char *data = malloc(N);
    t_fill_random(data, N, 3);
    ckptio_engine *e = new_engine(direct);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    ckptio__io_inject(CKPTIO__IO_WRITE, 5, err, 0, false); /* the 5th write request fails */
    T_STATUS(write_all(e, f, data, N), want);
    ckptio__io_inject_reset();
    const ckptio_error_info *ei = ckptio_last_error();
    T_ASSERT(ei->sys_errno == err);
    T_ASSERT(strcmp(ei->operation, "write") == 0);
    T_ASSERT(strcmp(ei->path, path) == 0);
    T_ASSERT(ei->file_offset >= 0 && (uint64_t)ei->file_offset < N);
    T_MESSAGE_HAS("fail.bin: write at offset");
    T_MESSAGE_HAS("extent 0 (");
    T_MESSAGE_HAS(".fail.bin.ckptio-tmp-"); /* which temporary */
    T_MESSAGE_HAS(strerror(err));
    /* The caller gives up: close discards. */
    T_OK(ckptio_file_close(f));
    if (have_old) expect_file(path, "old content", 11);
    else T_ASSERT(!t_file_exists(path));
    expect_no_temporaries();
    T_OK(ckptio_engine_destroy(e));
    free(data);
    unlink(path);
}

static void test_failed_writes(void) {
    failed_write_case(ENOSPC, CKPTIO_E_NOSPC, CKPTIO_DIRECT_AUTO, true);
    failed_write_case(ENOSPC, CKPTIO_E_NOSPC, CKPTIO_DIRECT_OFF, false);
    failed_write_case(EIO, CKPTIO_E_IO, CKPTIO_DIRECT_ON, true);
    failed_write_case(EIO, CKPTIO_E_IO, CKPTIO_DIRECT_OFF, false);
}

static void test_failed_commit(void) {
    const char *path = t_path("commit.bin");
    ckptio_engine *e = new_engine(CKPTIO_DIRECT_AUTO);
    ckptio_file *f;
    /* fsync of the data fails: the name keeps its old content. */
    t_write_file(path, "old", 3);
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(write_all(e, f, "new data", 8));
    ckptio__io_inject(CKPTIO__IO_FSYNC, 1, EIO, 0, false);
    T_STATUS(ckptio_file_commit(f), CKPTIO_E_IO);
    T_MESSAGE_HAS("commit.bin: fsync: flushing the data to storage (temporary .commit.bin.ckptio-tmp-");
    /* No second chance: the failed fsync may have dropped the pages. */
    T_STATUS(ckptio_file_commit(f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("a commit of this file failed");
    T_OK(ckptio_file_close(f));
    expect_file(path, "old", 3);
    expect_no_temporaries();
    /* rename fails. */
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(write_all(e, f, "new data", 8));
    ckptio__io_inject(CKPTIO__IO_RENAME, 1, EACCES, 0, false);
    T_STATUS(ckptio_file_commit(f), CKPTIO_E_PERMISSION);
    T_MESSAGE_HAS("commit.bin: rename: renaming the finished temporary over it");
    T_OK(ckptio_file_close(f));
    expect_file(path, "old", 3);
    expect_no_temporaries();
    /* The directory fsync fails after the rename: the file is in place,
     * and the error says durability of the name is unknown. */
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(write_all(e, f, "new data", 8));
    ckptio__io_inject(CKPTIO__IO_FSYNC, 2, EIO, 0, false);
    T_STATUS(ckptio_file_commit(f), CKPTIO_E_IO);
    T_MESSAGE_HAS("may not survive a power loss");
    T_OK(ckptio_file_close(f));
    expect_file(path, "new data", 8);
    expect_no_temporaries();
    /* Creating the temporary fails. */
    ckptio__io_inject(CKPTIO__IO_OPEN, 1, ENOSPC, 0, false);
    T_STATUS(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f), CKPTIO_E_NOSPC);
    T_MESSAGE_HAS("creating the temporary");
    ckptio__io_inject_reset();
    expect_file(path, "new data", 8);
    expect_no_temporaries();
    T_OK(ckptio_engine_destroy(e));
    unlink(path);
}

static void retry_case(ckptio__io_kind kind, int err, uint64_t short_len, int64_t direct) {
    const char *path = t_path("retry.bin");
    unsigned char *data = malloc(N), *back = malloc(N);
    t_fill_random(data, N, 4 + (uint64_t)kind);
    ckptio_engine *e = new_engine(direct);
    ckptio_file *f;
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(e, &a));
    if (kind == CKPTIO__IO_WRITE) ckptio__io_inject(kind, 2, err, short_len, true); /* every 2nd request */
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(write_all(e, f, data, N));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    ckptio__io_inject_reset();
    expect_file(path, data, N);
    memset(back, 0, N);
    if (kind == CKPTIO__IO_READ) ckptio__io_inject(kind, 2, err, short_len, true);
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    T_OK(read_all(e, f, back, N));
    ckptio__io_inject_reset();
    T_ASSERT(memcmp(back, data, N) == 0);
    T_OK(ckptio_engine_stats(e, &b));
    T_ASSERT_MSG(b.retries - a.retries >= 8, "only %llu retries", (unsigned long long)(b.retries - a.retries));
    T_ASSERT(b.bytes_written - a.bytes_written == N && b.bytes_read - a.bytes_read == N);
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
    free(data);
    free(back);
    unlink(path);
}

static void test_retries(void) {
    retry_case(CKPTIO__IO_WRITE, EINTR, 0, CKPTIO_DIRECT_AUTO);
    retry_case(CKPTIO__IO_READ, EINTR, 0, CKPTIO_DIRECT_OFF);
    retry_case(CKPTIO__IO_WRITE, EAGAIN, 0, CKPTIO_DIRECT_OFF);
    retry_case(CKPTIO__IO_WRITE, 0, 1000, CKPTIO_DIRECT_OFF); /* short writes */
    retry_case(CKPTIO__IO_READ, 0, 1000, CKPTIO_DIRECT_OFF);  /* short reads */
    retry_case(CKPTIO__IO_WRITE, 0, 5000, CKPTIO_DIRECT_ON);  /* short O_DIRECT: block multiples */
    retry_case(CKPTIO__IO_READ, 0, 5000, CKPTIO_DIRECT_ON);
}

static void test_exclusive(void) {
    const char *path = t_path("excl.bin");
    ckptio_engine *e = new_engine(CKPTIO_DIRECT_AUTO);
    ckptio_file *f;
    t_write_file(path, "mine", 4);
    T_STATUS(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_EXCLUSIVE, &f), CKPTIO_E_EXISTS);
    T_MESSAGE_HAS("excl.bin: open: the file already exists");
    expect_no_temporaries();
    unlink(path);
    /* A dangling symlink counts as existing (never written through). */
    T_ASSERT(symlink(t_path("nowhere"), path) == 0);
    T_STATUS(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_EXCLUSIVE, &f), CKPTIO_E_EXISTS);
    unlink(path);
    /* Free name: created at commit. */
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_EXCLUSIVE, &f));
    T_OK(write_all(e, f, "first", 5));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    expect_file(path, "first", 5);
    unlink(path);
    /* Someone else creates the name while we write: commit refuses and
     * leaves their file alone. */
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_EXCLUSIVE, &f));
    T_OK(write_all(e, f, "second", 6));
    t_write_file(path, "theirs", 6);
    T_STATUS(ckptio_file_commit(f), CKPTIO_E_EXISTS);
    T_MESSAGE_HAS("appeared while it was being written");
    T_OK(ckptio_file_close(f));
    expect_file(path, "theirs", 6);
    expect_no_temporaries();
    T_OK(ckptio_engine_destroy(e));
    unlink(path);
}

/* The system calls of a commit in their order (ckptio__io_record). */
static char syscalls[256];

/* Three new files, one over an empty placeholder: each is renamed, then the
 * three files and their directory (once) are fsynced, none before the last
 * rename; the bytes are in place, no temporary is left. A failed fsync says
 * the file is in place but may not survive a power loss; a failed rename
 * stops there (later files stay temporaries, removed by close). */
static void test_commit_unreferenced(void) {
    const char *names[3] = {"u0.bin", "u1.bin", "u2.bin"};
    char paths[3][1024];
    for (int i = 0; i < 3; i++) snprintf(paths[i], sizeof paths[i], "%s", t_path(names[i]));
    ckptio_engine *e = new_engine(CKPTIO_DIRECT_AUTO);
    for (int round = 0; round < 4; round++) {
        t_write_file(paths[1], "", 0); /* a placeholder: an empty file under the final name */
        ckptio_file *f[3];
        for (int i = 0; i < 3; i++) {
            T_OK(ckptio_file_open(e, paths[i], CKPTIO_OPEN_WRITE, &f[i]));
            T_OK(write_all(e, f[i], names[i], 6));
        }
        if (round == 0) {
            ckptio__io_record(syscalls, sizeof syscalls, "fRo");
            const ckptio_status st = ckptio_file_commit_unreferenced(f, 3, 0);
            ckptio__io_record_stop();
            T_OK(st);
            const char *last_rename = strrchr(syscalls, 'R'), *first_fsync = strchr(syscalls, 'f');
            T_ASSERT_MSG(strlen(syscalls) == 8 && first_fsync > last_rename && strspn(first_fsync, "f") == 4,
                         "%s", syscalls);
            for (int i = 0; i < 3; i++) expect_file(paths[i], names[i], 6);
        } else if (round == 1) { /* the second file's fsync fails */
            ckptio__io_inject(CKPTIO__IO_FSYNC, 2, EIO, 0, false);
            T_STATUS(ckptio_file_commit_unreferenced(f, 3, 0), CKPTIO_E_IO);
            ckptio__io_inject_reset();
            T_MESSAGE_HAS("u1.bin: fsync: flushing the data to storage (the file is in place under its name but");
            for (int i = 0; i < 3; i++) expect_file(paths[i], names[i], 6);
        } else if (round == 2) { /* the directory's fsync fails */
            ckptio__io_inject(CKPTIO__IO_FSYNC, 4, EIO, 0, false);
            T_STATUS(ckptio_file_commit_unreferenced(f, 3, 0), CKPTIO_E_IO);
            ckptio__io_inject_reset();
            T_MESSAGE_HAS("flushing the directory after renaming");
            T_MESSAGE_HAS("may not survive a power loss");
        } else { /* the second rename fails: the first is in place, no fsync ran */
            for (int i = 0; i < 3; i++) unlink(paths[i]);
            t_write_file(paths[1], "", 0);
            ckptio__io_inject(CKPTIO__IO_RENAME, 2, EACCES, 0, false);
            T_STATUS(ckptio_file_commit_unreferenced(f, 3, 0), CKPTIO_E_PERMISSION);
            ckptio__io_inject_reset();
            T_MESSAGE_HAS("u1.bin: rename: renaming the finished temporary over it");
            expect_file(paths[0], names[0], 6);
            expect_file(paths[1], "", 0);
            T_ASSERT(access(paths[2], F_OK) != 0);
        }
        for (int i = 0; i < 3; i++) T_OK(ckptio_file_close(f[i]));
        expect_no_temporaries();
        T_STATUS(ckptio_file_commit_unreferenced(NULL, 1, 0), CKPTIO_E_INVAL);
    }
    /* Without OPT_SYNC: renamed, nothing fsynced. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 0));
    ckptio_file *g;
    T_OK(ckptio_file_open(e, paths[0], CKPTIO_OPEN_WRITE, &g));
    T_OK(write_all(e, g, "nosync", 6));
    ckptio__io_record(syscalls, sizeof syscalls, "fRo");
    const ckptio_status st = ckptio_file_commit_unreferenced(&g, 1, 0);
    ckptio__io_record_stop();
    T_OK(st);
    T_ASSERT_MSG(strcmp(syscalls, "R") == 0, "%s", syscalls);
    T_OK(ckptio_file_close(g));
    expect_file(paths[0], "nosync", 6);
    /* CKPTIO_COMMIT_SYNC_LATER: renamed only, the fsyncs left to the DCP commit. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 1));
    T_OK(ckptio_file_open(e, paths[0], CKPTIO_OPEN_WRITE, &g));
    T_OK(write_all(e, g, "later!", 6));
    ckptio__io_record(syscalls, sizeof syscalls, "fRo");
    const ckptio_status later = ckptio_file_commit_unreferenced(&g, 1, CKPTIO_COMMIT_SYNC_LATER);
    ckptio__io_record_stop();
    T_OK(later);
    T_ASSERT_MSG(strcmp(syscalls, "R") == 0, "%s", syscalls);
    T_OK(ckptio_file_close(g));
    expect_file(paths[0], "later!", 6);
    T_STATUS(ckptio_file_commit_unreferenced(&g, 0, 1u << 5), CKPTIO_E_INVAL);
    T_OK(ckptio_engine_destroy(e));
    for (int i = 0; i < 3; i++) unlink(paths[i]);
}

static void run_all(void) {
    T_RUN(test_commit_replaces);
    T_RUN(test_close_without_commit);
    T_RUN(test_failed_writes);
    T_RUN(test_failed_commit);
    T_RUN(test_retries);
    T_RUN(test_exclusive);
    T_RUN(test_commit_unreferenced);
}

int main(void) {
    const char *why = NULL;
    const int uring_err = ckptio__io_uring_probe(&why);
    for (int b = CKPTIO_BACKEND_PREAD; b <= CKPTIO_BACKEND_IO_URING; b++) {
        if (b == CKPTIO_BACKEND_IO_URING && uring_err) {
            printf("# io_uring skipped: %s (%s)\n", why, strerror(uring_err));
            break;
        }
        for (int t = 0; t <= 4; t += 4) {
            g_backend = (ckptio_backend)b;
            g_threads = t;
            printf("# backend %s, %d threads\n", ckptio_backend_name(g_backend), t);
            run_all();
        }
    }
    return 0;
}
