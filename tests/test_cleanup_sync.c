/*
 * test_cleanup_sync.c - removing stale temporaries is made durable.
 *
 * ckptio_cleanup_temporaries() fsyncs the directory once after a scan that
 * removed something (never when nothing was removed), and a failed fsync is
 * an error naming the directory, after the temporaries are gone. The clean
 * an atomic save does before creating its temporary relies on the commit's
 * directory fsync instead, which comes after the unlink in the same
 * directory. Checked with the fault-injection layer (fsync requests are
 * counted and failed) and, where strace works, from a real trace.
 */
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *make_dir(const char *name) {
    const char *dir = t_path(name);
    T_ASSERT(mkdir(dir, 0777) == 0);
    return dir;
}

/* A temporary a killed save left (no lock held). */
static void plant(const char *dir, const char *entry) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, entry);
    t_write_file(path, "stale", 5);
}

static void test_fsync_failure_is_reported(void) {
    const int errs[] = {EIO, ENOSPC};
    const ckptio_status want[] = {CKPTIO_E_IO, CKPTIO_E_NOSPC};
    for (int k = 0; k < 2; k++) {
        const char *dir = make_dir(k ? "fail-nospc" : "fail-eio");
        plant(dir, ".a.bin.ckptio-tmp-AAAAAA");
        plant(dir, ".b.bin.ckptio-tmp-BBBBBB");
        plant(dir, "b.bin"); /* a final name: never touched */
        ckptio__io_inject(CKPTIO__IO_FSYNC, 1, errs[k], 0, false);
        ckptio_cleanup_report r;
        T_STATUS(ckptio_cleanup_temporaries(dir, NULL, 0, &r), want[k]);
        T_ASSERT(ckptio__io_inject_countdown(CKPTIO__IO_FSYNC) == 0); /* the fsync was made, and failed */
        ckptio__io_inject_reset();
        const ckptio_error_info *e = ckptio_last_error();
        T_ASSERT(strcmp(e->operation, "fsync") == 0 && strcmp(e->path, dir) == 0 && e->sys_errno == errs[k]);
        T_MESSAGE_HAS(dir);
        T_MESSAGE_HAS("flushing the directory after removing 2 stale temporaries");
        T_MESSAGE_HAS("a power loss may bring them back");
        T_MESSAGE_HAS(strerror(errs[k]));
        /* The removal itself happened and is reported. */
        T_ASSERT(r.removed == 2 && r.bytes_freed == 10);
        T_ASSERT(t_count_entries(dir, "ckptio-tmp") == 0 && t_count_entries(dir, "b.bin") == 1);
        /* The library stays usable: nothing left, nothing to sync. */
        T_OK(ckptio_cleanup_temporaries(dir, NULL, 0, &r));
        T_ASSERT(r.removed == 0);
    }
    /* One temporary: singular wording. */
    const char *dir = make_dir("fail-one");
    plant(dir, ".c.ckptio-tmp-CCCCCC");
    ckptio__io_inject(CKPTIO__IO_FSYNC, 1, EIO, 0, false);
    T_STATUS(ckptio_cleanup_temporaries(dir, "c", 0, NULL), CKPTIO_E_IO);
    ckptio__io_inject_reset();
    T_MESSAGE_HAS("after removing 1 stale temporary: a power loss may bring it back (the next clean removes it)");
}

/* fsyncs made by one cleanup: the nth request fails for the first n that
 * is past the last request. Each probe plants the same temporaries again. */
static uint64_t count_fsyncs(const char *dir, int stale, bool live) {
    for (uint64_t n = 1;; n++) {
        for (int i = 0; i < stale; i++) {
            char entry[64];
            snprintf(entry, sizeof entry, ".f%d.ckptio-tmp-XXXXX%d", i, i);
            plant(dir, entry);
        }
        int fd = -1;
        if (live) { /* a live writer's temporary: locked, kept, no removal */
            char path[1024];
            snprintf(path, sizeof path, "%s/.live.ckptio-tmp-LLLLLL", dir);
            fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
            T_ASSERT(fd >= 0 && flock(fd, LOCK_EX) == 0);
        }
        ckptio__io_inject(CKPTIO__IO_FSYNC, n, EIO, 0, false);
        ckptio_cleanup_report r;
        const ckptio_status st = ckptio_cleanup_temporaries(dir, NULL, 0, &r);
        const bool fired = ckptio__io_inject_countdown(CKPTIO__IO_FSYNC) == 0;
        ckptio__io_inject_reset();
        if (fd >= 0) {
            T_ASSERT(r.busy == 1);
            close(fd);
            char path[1024];
            snprintf(path, sizeof path, "%s/.live.ckptio-tmp-LLLLLL", dir);
            T_ASSERT(unlink(path) == 0);
        }
        T_ASSERT(r.removed == (size_t)stale && t_count_entries(dir, "ckptio-tmp") == 0);
        if (!fired) {
            T_OK(st);
            return n - 1;
        }
        T_STATUS(st, CKPTIO_E_IO);
    }
}

static void test_one_fsync_only_when_something_was_removed(void) {
    const char *dir = make_dir("count");
    T_ASSERT(count_fsyncs(dir, 0, false) == 0); /* nothing to remove */
    T_ASSERT(count_fsyncs(dir, 0, true) == 0);  /* only a live writer's temporary */
    T_ASSERT(count_fsyncs(dir, 1, false) == 1);
    T_ASSERT(count_fsyncs(dir, 3, true) == 1); /* once per directory, not per file */
    /* EINTR is retried. */
    plant(dir, ".g.ckptio-tmp-GGGGGG");
    ckptio__io_inject(CKPTIO__IO_FSYNC, 1, EINTR, 0, false);
    ckptio_cleanup_report r;
    T_OK(ckptio_cleanup_temporaries(dir, NULL, 0, &r));
    T_ASSERT(ckptio__io_inject_countdown(CKPTIO__IO_FSYNC) == 0 && r.removed == 1);
    ckptio__io_inject_reset();
}

/* ---- from a real trace ------------------------------------------------------------- */

typedef struct event {
    char kind; /* 'F' fsync, 'U' unlink, 'R' rename */
    char arg[600];
} event;

/* Runs `self MODE DIR` under strace; returns the events, or NULL (skip). */
static event *trace(const char *self, const char *mode, const char *dir, int *n) {
    char log[1024], cmd[4096];
    snprintf(log, sizeof log, "%s/strace-%s.log", t_tmpdir(), mode);
    snprintf(cmd, sizeof cmd,
             "ASAN_OPTIONS=detect_leaks=0 strace -f -qq -y -e trace=fsync,fdatasync,rename,renameat,renameat2,"
             "unlink,unlinkat -o %s %s %s %s >/dev/null 2>&1",
             log, self, mode, dir);
    if (system(cmd) != 0) return NULL;
    size_t len;
    char *text = t_read_file(log, &len);
    event *ev = calloc(512, sizeof *ev);
    T_ASSERT(ev);
    *n = 0;
    for (char *line = strtok(text, "\n"); line && *n < 512; line = strtok(NULL, "\n")) {
        const char kind = strstr(line, "fsync(") || strstr(line, "fdatasync(") ? 'F'
                          : strstr(line, "rename")                              ? 'R'
                          : strstr(line, "unlink")                              ? 'U'
                                                                                : 0;
        if (!kind || strstr(line, "= -1")) continue;
        ev[*n].kind = kind;
        const char *lt = strchr(line, '<'), *gt = lt ? strchr(lt, '>') : NULL;
        if (kind == 'F' && lt && gt) snprintf(ev[*n].arg, sizeof ev[*n].arg, "%.*s", (int)(gt - lt - 1), lt + 1);
        else snprintf(ev[*n].arg, sizeof ev[*n].arg, "%s", line);
        (*n)++;
    }
    free(text);
    return ev;
}

static int find(const event *ev, int n, int from, char kind, const char *needle, bool exact) {
    for (int i = from; i < n; i++)
        if (ev[i].kind == kind && (exact ? strcmp(ev[i].arg, needle) == 0 : strstr(ev[i].arg, needle) != NULL))
            return i;
    return -1;
}

static void test_traced_order(const char *self) {
    if (system("strace -V >/dev/null 2>&1") != 0) {
        printf("# skip test_traced_order: strace not installed\n");
        return;
    }
    /* ckptio_cleanup_temporaries: both unlinks, then one fsync of the directory. */
    const char *dir = make_dir("traced-clean");
    plant(dir, ".a.ckptio-tmp-AAAAAA");
    plant(dir, ".b.ckptio-tmp-BBBBBB");
    int n;
    event *ev = trace(self, "clean", dir, &n);
    if (!ev) {
        printf("# skip test_traced_order: strace could not trace (ptrace refused?)\n");
        return;
    }
    const int ua = find(ev, n, 0, 'U', ".a.ckptio-tmp-AAAAAA", false);
    const int ub = find(ev, n, 0, 'U', ".b.ckptio-tmp-BBBBBB", false);
    const int fs = find(ev, n, 0, 'F', dir, true);
    T_ASSERT_MSG(ua >= 0 && ub >= 0 && fs > ua && fs > ub, "unlinks %d %d, directory fsync %d", ua, ub, fs);
    T_ASSERT_MSG(find(ev, n, fs + 1, 'F', "", false) < 0 && find(ev, n, 0, 'F', "", false) == fs,
                 "more than one fsync");
    free(ev);
    /* A save over stale temporaries of its NAME (a killed save's in the first
     * slot, which makes the save look for others, and an older one): the
     * unlinks come before the rename, and the commit's directory fsync after
     * them all. */
    dir = make_dir("traced-save");
    plant(dir, ".x.bin.ckptio-tmp-000000");
    plant(dir, ".x.bin.ckptio-tmp-SSSSSS");
    ev = trace(self, "save", dir, &n);
    T_ASSERT(ev);
    const int u0 = find(ev, n, 0, 'U', ".x.bin.ckptio-tmp-000000", false);
    const int us = find(ev, n, 0, 'U', ".x.bin.ckptio-tmp-SSSSSS", false);
    const int rn = find(ev, n, 0, 'R', "/.x.bin.ckptio-tmp-", false);
    T_ASSERT_MSG(u0 >= 0 && us >= 0 && rn > us && rn > u0, "stale unlinks %d %d, rename %d", u0, us, rn);
    T_ASSERT_MSG(find(ev, n, rn, 'F', dir, true) > rn, "no directory fsync after the rename");
    char stale[1024];
    snprintf(stale, sizeof stale, "%s/.x.bin.ckptio-tmp-SSSSSS", dir);
    T_ASSERT(!t_file_exists(stale) && t_count_entries(dir, "ckptio-tmp") == 0);
    free(ev);
    printf("ok test_traced_order\n");
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "clean") == 0) /* helper for the trace */
        return ckptio_cleanup_temporaries(argv[2], NULL, 0, NULL) == CKPTIO_OK ? 0 : 1;
    if (argc == 3 && strcmp(argv[1], "save") == 0) { /* an atomic save with sync on (the default) */
        char path[1024];
        snprintf(path, sizeof path, "%s/x.bin", argv[2]);
        ckptio_engine *e = NULL;
        ckptio_file *f;
        ckptio_status st = ckptio_engine_create(&e);
        if (st == CKPTIO_OK) st = ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f);
        if (st == CKPTIO_OK) {
            st = ckptio_file_commit(f);
            ckptio_file_close(f);
        }
        ckptio_engine_destroy(e);
        if (st != CKPTIO_OK) fprintf(stderr, "%s\n", ckptio_last_error_message());
        return st == CKPTIO_OK ? 0 : 1;
    }
    T_RUN(test_fsync_failure_is_reported);
    T_RUN(test_one_fsync_only_when_something_was_removed);
    char self[1024];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    T_ASSERT(len > 0);
    self[len] = '\0';
    test_traced_order(self);
    return 0;
}
