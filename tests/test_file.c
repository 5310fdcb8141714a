/*
 * test_file.c - ckptio_file: open flags and errors, O_DIRECT detection (a
 * tmpfs file gets buffered I/O, reported, not an error unless DIRECT=on),
 * in-place writes, truncate, size, the blocking ckptio__file_io() (which opens
 * the O_DIRECT descriptor only for a request it could serve).
 */
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

static ckptio_engine *engine_with(int64_t direct) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, direct));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT_MIN_BYTES, 0));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 0));
    /* These cases test O_DIRECT itself; writes this small would otherwise stay in the page cache. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_WRITE_CACHE, CKPTIO_WRITE_CACHE_OFF));
    return e;
}

static void test_open_errors(void) {
    ckptio_engine *e = engine_with(CKPTIO_DIRECT_AUTO);
    ckptio_file *f = (ckptio_file *)0x1;
    T_STATUS(ckptio_file_open(e, t_path("x"), 0, &f), CKPTIO_E_INVAL);
    T_ASSERT(f == NULL);
    T_MESSAGE_HAS("CKPTIO_OPEN_READ or CKPTIO_OPEN_WRITE");
    T_STATUS(ckptio_file_open(e, t_path("x"), CKPTIO_OPEN_READ | CKPTIO_OPEN_IN_PLACE, &f), CKPTIO_E_INVAL);
    T_STATUS(ckptio_file_open(e, t_path("x"), 1u << 9, &f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("unknown open flags");
    T_STATUS(ckptio_file_open(e, "", CKPTIO_OPEN_READ, &f), CKPTIO_E_INVAL);
    T_STATUS(ckptio_file_open(NULL, t_path("x"), CKPTIO_OPEN_READ, &f), CKPTIO_E_INVAL);

    const char *missing = t_path("missing.bin");
    T_STATUS(ckptio_file_open(e, missing, CKPTIO_OPEN_READ, &f), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS(missing);
    T_MESSAGE_HAS("No such file or directory");
    T_ASSERT(ckptio_last_error()->sys_errno == ENOENT);
    T_ASSERT(strcmp(ckptio_last_error()->operation, "open") == 0);
    T_STATUS(ckptio_file_open(e, t_tmpdir(), CKPTIO_OPEN_READ, &f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("not a regular file");
    /* Atomic write into a directory that does not exist. */
    T_STATUS(ckptio_file_open(e, t_path("nodir/x.bin"), CKPTIO_OPEN_WRITE, &f), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("nodir/x.bin: create");
    T_STATUS(ckptio_file_open(e, t_path("dir/"), CKPTIO_OPEN_WRITE, &f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("names a directory");
    /* Read-only files refuse writes, truncation and commit. */
    t_write_file(t_path("ro.bin"), "abc", 3);
    T_OK(ckptio_file_open(e, t_path("ro.bin"), CKPTIO_OPEN_READ, &f));
    T_STATUS(ckptio_file_truncate(f, 0), CKPTIO_E_INVAL);
    T_STATUS(ckptio_file_commit(f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("not opened with CKPTIO_OPEN_WRITE");
    T_STATUS(ckptio__file_io(f, CKPTIO_WRITE, "x", 1, 0), CKPTIO_E_INVAL);
    uint64_t size;
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == 3);
    T_ASSERT(strcmp(ckptio_file_path(f), t_path("ro.bin")) == 0);
    T_ASSERT(ckptio_file_path(NULL) == NULL);
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_file_close(NULL));
    /* An injected open failure. */
    ckptio__io_inject(CKPTIO__IO_OPEN, 1, EACCES, 0, false);
    T_STATUS(ckptio_file_open(e, t_path("ro.bin"), CKPTIO_OPEN_READ, &f), CKPTIO_E_PERMISSION);
    T_MESSAGE_HAS("Permission denied");
    ckptio__io_inject_reset();
    T_OK(ckptio_engine_destroy(e));
}

static void test_direct_detection(void) {
    ckptio_engine *e = engine_with(CKPTIO_DIRECT_AUTO);
    ckptio_file *f;
    int d = -1;
    /* The test directory is on a disk file system: O_DIRECT works. */
    T_OK(ckptio_file_open(e, t_path("d.bin"), CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_is_direct(f, &d));
    T_ASSERT(d == 1);
    /* Turning it off applies at once; on again re-uses the descriptor. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_OFF));
    T_OK(ckptio_file_is_direct(f, &d));
    T_ASSERT(d == 0);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_AUTO));
    T_OK(ckptio_file_is_direct(f, &d));
    T_ASSERT(d == 1);
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    /* A file system refusing O_DIRECT (injected EINVAL, as tmpfs does):
     * buffered in AUTO, an error in ON. */
    ckptio__io_inject(CKPTIO__IO_OPEN_DIRECT, 1, EINVAL, 0, false);
    T_OK(ckptio_file_open(e, t_path("d.bin"), CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_file_is_direct(f, &d));
    T_ASSERT(d == 0);
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_ON));
    ckptio__io_inject(CKPTIO__IO_OPEN_DIRECT, 1, EINVAL, 0, false);
    T_STATUS(ckptio_file_open(e, t_path("d.bin"), CKPTIO_OPEN_READ, &f), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("O_DIRECT was refused and CKPTIO_OPT_DIRECT is ON");
    T_MESSAGE_HAS("d.bin");
    ckptio__io_inject_reset();
    T_OK(ckptio_engine_destroy(e));
}

/* Whether the kernel itself lets `dir` open files with O_DIRECT. */
static bool kernel_allows_direct(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (fd >= 0) close(fd);
    unlink(path);
    return fd >= 0;
}

static void test_dev_shm(void) {
    struct statfs sfs;
    if (statfs("/dev/shm", &sfs) != 0 || (unsigned long)sfs.f_type != TMPFS_MAGIC || access("/dev/shm", W_OK) != 0) {
        printf("# /dev/shm is not a writable tmpfs here: part skipped\n");
        return;
    }
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/ckptio-test-%d.bin", (int)getpid());
    /* tmpfs refused O_DIRECT with EINVAL before Linux 6.6 and accepts it
     * since; ckptio must report whichever is true. Where the kernel
     * accepts it, the refusal is injected (EINVAL, as old tmpfs gave). */
    const bool native = kernel_allows_direct(path);
    printf("# tmpfs O_DIRECT: %s\n", native ? "accepted by this kernel (refusal injected)" : "refused by this kernel");
    const size_t n = (2u << 20) + 77;
    unsigned char *src = malloc(n), *dst = malloc(n);
    t_fill_random(src, n, 4);
    for (int round = 0; round < 4; round++) {
        const int backend = round < 2 ? CKPTIO_BACKEND_PREAD : CKPTIO_BACKEND_IO_URING;
        const bool refuse = round % 2 == 0 || !native; /* refused for real or injected */
        if (backend == CKPTIO_BACKEND_IO_URING && ckptio__io_uring_probe(NULL) != 0) {
            printf("# io_uring part skipped\n");
            break;
        }
        ckptio_engine *e = engine_with(CKPTIO_DIRECT_AUTO);
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, backend));
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 256 << 10));
        ckptio_file *f;
        if (refuse && native) ckptio__io_inject(CKPTIO__IO_OPEN_DIRECT, 1, EINVAL, 0, true);
        T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
        int d = -1;
        T_OK(ckptio_file_is_direct(f, &d));
        T_ASSERT(d == !refuse);
        ckptio_plan *p;
        ckptio_extent x = {.file = f, .file_offset = 3, .length = n, .memory = src, .mem_kind = CKPTIO_MEM_AUTO};
        T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
        T_OK(ckptio_plan_add(p, &x));
        T_OK(ckptio_engine_execute(e, p));
        T_OK(ckptio_plan_destroy(p));
        T_OK(ckptio_file_commit(f));
        T_OK(ckptio_file_close(f));
        T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
        x = (ckptio_extent){.file = f, .file_offset = 3, .length = n, .memory = dst, .mem_kind = CKPTIO_MEM_PINNED};
        T_OK(ckptio_plan_create(CKPTIO_READ, &p));
        T_OK(ckptio_plan_add(p, &x));
        memset(dst, 0, n);
        T_OK(ckptio_engine_execute(e, p));
        T_ASSERT(memcmp(dst, src, n) == 0);
        size_t flen;
        unsigned char *img = t_read_file(path, &flen);
        T_ASSERT(flen == n + 3 && memcmp(img + 3, src, n) == 0);
        free(img);
        ckptio_stats st;
        T_OK(ckptio_engine_stats(e, &st));
        /* A file in memory gains nothing from O_DIRECT (tmpfs copies through
         * its pages all the same), so in AUTO mode both the write and the
         * read go through the page cache even where O_DIRECT is open. */
        T_ASSERT(st.bytes_direct == 0 && st.bytes_buffered == 2 * n);
        T_OK(ckptio_plan_destroy(p));
        T_OK(ckptio_file_close(f));
        /* DIRECT=on makes a refusal an error. */
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_ON));
        if (refuse) {
            T_STATUS(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f), CKPTIO_E_UNSUPPORTED);
            T_MESSAGE_HAS(path);
            T_MESSAGE_HAS("O_DIRECT was refused");
            T_MESSAGE_HAS("Invalid argument");
        } else {
            T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
            T_OK(ckptio_file_close(f));
        }
        ckptio__io_inject_reset();
        T_OK(ckptio_engine_destroy(e));
        unlink(path);
    }
    free(src);
    free(dst);
}

static void test_in_place_and_truncate(void) {
    ckptio_engine *e = engine_with(CKPTIO_DIRECT_AUTO);
    const char *path = t_path("inplace.bin");
    t_write_file(path, "0123456789", 10);
    ckptio_file *f;
    T_STATUS(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE | CKPTIO_OPEN_EXCLUSIVE, &f),
             CKPTIO_E_EXISTS);
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE, &f));
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0); /* no temporary */
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, "AB", 2, 4));
    /* Visible at once under the final name, rest of the file kept. */
    size_t len;
    char *img = t_read_file(path, &len);
    T_ASSERT(len == 10 && memcmp(img, "0123AB6789", 10) == 0);
    free(img);
    T_OK(ckptio_file_truncate(f, 5));
    uint64_t size;
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == 5);
    T_OK(ckptio_file_truncate(f, 8192));
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == 8192);
    /* Reading works on a write file too. */
    char back[5];
    T_OK(ckptio__file_io(f, CKPTIO_READ, back, 5, 0));
    T_ASSERT(memcmp(back, "0123A", 5) == 0);
    T_OK(ckptio_file_commit(f));
    T_STATUS(ckptio_file_commit(f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("already committed");
    T_STATUS(ckptio_file_truncate(f, 0), CKPTIO_E_INVAL);
    T_STATUS(ckptio__file_io(f, CKPTIO_WRITE, "x", 1, 0), CKPTIO_E_INVAL);
    T_OK(ckptio_file_close(f));
    T_ASSERT(t_file_exists(path));
    /* In place and exclusive on a new name creates it. */
    const char *fresh = t_path("inplace-new.bin");
    T_OK(ckptio_file_open(e, fresh, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE | CKPTIO_OPEN_EXCLUSIVE, &f));
    T_ASSERT(t_file_exists(fresh));
    T_OK(ckptio_file_close(f));
    T_ASSERT(t_file_exists(fresh)); /* in place: close keeps what was written */
    T_OK(ckptio_engine_destroy(e));
}

static _Atomic int direct_opens;

static bool count_direct_opens(ckptio__io_kind kind, int *err, uint64_t *len) {
    (void)err;
    (void)len;
    if (kind == CKPTIO__IO_OPEN_DIRECT) atomic_fetch_add(&direct_opens, 1);
    return false;
}

static void test_file_io(void) {
    ckptio_engine *e = engine_with(CKPTIO_DIRECT_AUTO);
    const size_t n = 3 * 4096;
    unsigned char *buf;
    T_ASSERT(posix_memalign((void **)&buf, 4096, n) == 0);
    t_fill_random(buf, n, 12);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, t_path("fio.bin"), CKPTIO_OPEN_WRITE | CKPTIO_OPEN_READ, &f));
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(e, &a));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, buf, n, 0));       /* aligned: O_DIRECT */
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, buf + 1, 100, n)); /* unaligned: buffered */
    T_OK(ckptio_engine_stats(e, &b));
    T_ASSERT(b.bytes_written - a.bytes_written == n + 100);
    T_ASSERT(b.bytes_direct - a.bytes_direct == n);
    T_ASSERT(b.bytes_buffered - a.bytes_buffered == 100);
    T_ASSERT(ckptio__file_engine(f) == e);
    unsigned char *back = malloc(n + 100);
    T_OK(ckptio__file_io(f, CKPTIO_READ, back, n + 100, 0));
    T_ASSERT(memcmp(back, buf, n) == 0 && memcmp(back + n, buf + 1, 100) == 0);
    T_STATUS(ckptio__file_io(f, CKPTIO_READ, back, 200, n), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("fio.bin: read at offset 12388");
    T_STATUS(ckptio__file_io(f, CKPTIO_READ, back, 10, UINT64_MAX - 3), CKPTIO_E_RANGE);
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    /* A read O_DIRECT cannot serve (a small header) does not open the O_DIRECT descriptor; an aligned one does. */
    T_OK(ckptio_file_open(e, t_path("fio.bin"), CKPTIO_OPEN_READ, &f));
    atomic_store(&direct_opens, 0);
    ckptio__io_set_fault_hook(count_direct_opens);
    T_OK(ckptio__file_io(f, CKPTIO_READ, back, 100, n));
    T_ASSERT(memcmp(back, buf + 1, 100) == 0);
    T_ASSERT_MSG(atomic_load(&direct_opens) == 0, "%d O_DIRECT opens", atomic_load(&direct_opens));
    T_OK(ckptio__file_io(f, CKPTIO_READ, buf, 4096, 0));
    T_ASSERT_MSG(atomic_load(&direct_opens) == 1, "%d O_DIRECT opens", atomic_load(&direct_opens));
    ckptio__io_set_fault_hook(NULL);
    T_OK(ckptio_file_close(f));
    free(back);
    free(buf);
    T_OK(ckptio_engine_destroy(e));
}

int main(void) {
    T_RUN(test_open_errors);
    T_RUN(test_direct_detection);
    T_RUN(test_dev_shm);
    T_RUN(test_in_place_and_truncate);
    T_RUN(test_file_io);
    return 0;
}
