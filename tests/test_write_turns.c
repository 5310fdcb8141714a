/*
 * test_write_turns.c - writes to one file in memory (tmpfs) take turns: the
 * engine's workers never have two write calls on it at once, with either
 * backend and from the GPU pipeline (simulated device), and the bytes land
 * whole. A file on disk (when the test directory is not tmpfs) is written
 * by several workers at once, which is what shows the count can see overlap.
 */
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "io_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define FILE_BYTES (4u << 20)

static _Atomic int writing, most_writing, calls, overlapped;

/* The fault hook runs before every write call: it counts the calls in
 * flight and holds each a moment, so that overlapping workers show. */
static bool count_writers(ckptio__io_kind kind, int *err, uint64_t *len) {
    (void)err;
    (void)len;
    if (kind != CKPTIO__IO_WRITE) return false;
    const int now = atomic_fetch_add(&writing, 1) + 1;
    atomic_fetch_add(&calls, 1);
    if (now > 1) atomic_fetch_add(&overlapped, 1);
    int most = atomic_load(&most_writing);
    while (now > most && !atomic_compare_exchange_weak(&most_writing, &most, now)) {
    }
    usleep(500);
    atomic_fetch_sub(&writing, 1);
    return false;
}

static bool is_tmpfs(const char *dir) {
    struct statfs sb;
    return statfs(dir, &sb) == 0 && sb.f_type == TMPFS_MAGIC;
}

static ckptio_engine *four_workers(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 4));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 64 << 10));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 4 << 20));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 0));
    return e;
}

static void count_from_now(void) {
    atomic_store(&writing, 0);
    atomic_store(&most_writing, 0);
    atomic_store(&calls, 0);
    atomic_store(&overlapped, 0);
    ckptio__io_set_fault_hook(count_writers);
}

/* Stops counting, checks that `path` holds `src` and removes it; returns
 * the most write calls that were in flight at once. */
static int counted_and_checked(const char *path, const unsigned char *src) {
    ckptio__io_set_fault_hook(NULL);
    size_t n;
    unsigned char *img = t_read_file(path, &n);
    T_ASSERT_MSG(n == FILE_BYTES && memcmp(img, src, n) == 0, "%s: the file does not hold the bytes written", path);
    free(img);
    unlink(path);
    return atomic_load(&most_writing);
}

/* Writes FILE_BYTES from host memory to `path` with 4 workers in 64 KiB
 * tasks (with `direct`, O_DIRECT: writes through the page cache to one file
 * on disk are made by one worker, the file system would take them in turns);
 * returns the most write calls that were in flight at once. */
static int write_with_workers(const char *path, int backend, const unsigned char *src, bool direct) {
    ckptio_engine *e = four_workers();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, backend));
    if (direct) T_OK(ckptio_engine_set(e, CKPTIO_OPT_WRITE_CACHE, CKPTIO_WRITE_CACHE_OFF));
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    ckptio_plan *p;
    ckptio_extent x = {.file = f, .file_offset = 0, .length = FILE_BYTES, .memory = (void *)src,
                       .mem_kind = CKPTIO_MEM_AUTO};
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    T_OK(ckptio_plan_add(p, &x));
    count_from_now();
    T_OK(ckptio_engine_execute(e, p));
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
    return counted_and_checked(path, src);
}

/* The same from simulated GPU memory: the pipeline's 4 workers copy to
 * their staging slots side by side, and their writes take turns. */
static int write_from_gpu(const char *path, const unsigned char *src) {
    ckptio_engine *e = four_workers();
    unsigned char *dev = ckptio__gpu_sim_device_alloc(FILE_BYTES);
    T_ASSERT(dev);
    memcpy(dev, src, FILE_BYTES);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    const ckptio_extent x = {.file = f, .file_offset = 0, .length = FILE_BYTES, .memory = dev,
                             .mem_kind = CKPTIO_MEM_CUDA};
    count_from_now();
    T_OK(ckptio__gpu_execute(e, CKPTIO_WRITE, &x, 1));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    return counted_and_checked(path, src);
}

static void test_writes_to_a_tmpfs_file_take_turns(void) {
    if (!is_tmpfs("/dev/shm") || access("/dev/shm", W_OK) != 0) t_skip("no writable tmpfs at /dev/shm");
    unsigned char *src = malloc(FILE_BYTES);
    T_ASSERT(src);
    t_fill_random(src, FILE_BYTES, 17);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/ckptio-turns-%d.bin", (int)getpid());
    const int backends[] = {CKPTIO_BACKEND_PREAD, CKPTIO_BACKEND_IO_URING};
    for (size_t b = 0; b < sizeof backends / sizeof *backends; b++) {
        if (backends[b] == CKPTIO_BACKEND_IO_URING && ckptio__io_uring_probe(NULL) != 0) {
            printf("# io_uring not available here: its part skipped\n");
            continue;
        }
        const int most = write_with_workers(path, backends[b], src, false);
        T_ASSERT_MSG(most == 1, "backend %d: %d writes to one tmpfs file were in flight at once", backends[b], most);
    }
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio__gpu_sim_configure(&(ckptio__gpu_sim_config){.copy_delay_us = 100});
    int most = write_from_gpu(path, src);
    T_ASSERT_MSG(most == 1, "from the GPU: %d writes to one tmpfs file were in flight at once", most);
    if (!is_tmpfs(t_tmpdir())) {
        most = write_with_workers(t_path("turns-disk.bin"), CKPTIO_BACKEND_PREAD, src, true);
        T_ASSERT_MSG(most > 1, "a file on disk: %d write in flight at most; 4 workers should overlap", most);
        most = write_from_gpu(t_path("turns-disk-gpu.bin"), src);
        T_ASSERT_MSG(most > 1, "a file on disk from the GPU: %d write in flight at most; 4 workers should overlap",
                     most);
    } else {
        printf("# the test directory is tmpfs too: the disk comparison skipped\n");
    }
    free(src);
}

/* One plan writing FILES tmpfs files with 4 workers: the files are written side by side (each still one
 * writer at a time), not one after the other: most write calls run while another file is being written. */
#define FILES 4
static void test_files_in_memory_are_written_side_by_side(void) {
    if (!is_tmpfs("/dev/shm") || access("/dev/shm", W_OK) != 0) t_skip("no writable tmpfs at /dev/shm");
    unsigned char *src = malloc((size_t)FILES * FILE_BYTES);
    T_ASSERT(src);
    t_fill_random(src, (size_t)FILES * FILE_BYTES, 23);
    const int backends[] = {CKPTIO_BACKEND_PREAD, CKPTIO_BACKEND_IO_URING};
    for (size_t b = 0; b < sizeof backends / sizeof *backends; b++) {
        if (backends[b] == CKPTIO_BACKEND_IO_URING && ckptio__io_uring_probe(NULL) != 0) continue;
        ckptio_engine *e = four_workers();
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, backends[b]));
        ckptio_file *f[FILES];
        char path[FILES][96];
        ckptio_plan *p;
        T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
        for (int i = 0; i < FILES; i++) {
            snprintf(path[i], sizeof path[i], "/dev/shm/ckptio-turns-%d-%d.bin", (int)getpid(), i);
            T_OK(ckptio_file_open(e, path[i], CKPTIO_OPEN_WRITE, &f[i]));
            /* Two extents per file, so that a file's tasks span extents. */
            for (int h = 0; h < 2; h++) {
                const ckptio_extent x = {.file = f[i], .file_offset = (uint64_t)h * (FILE_BYTES / 2),
                                         .length = FILE_BYTES / 2,
                                         .memory = src + (size_t)i * FILE_BYTES + (size_t)h * (FILE_BYTES / 2),
                                         .mem_kind = CKPTIO_MEM_HOST};
                T_OK(ckptio_plan_add(p, &x));
            }
        }
        count_from_now();
        T_OK(ckptio_engine_execute(e, p));
        ckptio__io_set_fault_hook(NULL);
        const int n = atomic_load(&calls), side = atomic_load(&overlapped);
        T_OK(ckptio_plan_destroy(p));
        for (int i = 0; i < FILES; i++) {
            T_OK(ckptio_file_commit(f[i]));
            T_OK(ckptio_file_close(f[i]));
            size_t len;
            unsigned char *img = t_read_file(path[i], &len);
            T_ASSERT_MSG(len == FILE_BYTES && memcmp(img, src + (size_t)i * FILE_BYTES, len) == 0,
                         "%s: the file does not hold the bytes written", path[i]);
            free(img);
            unlink(path[i]);
        }
        T_OK(ckptio_engine_destroy(e));
        /* 64 KiB tasks, 4 x 64 per plan: in plan order nearly every call would wait for the first file's turn
         * alone (only the calls where one file's tasks meet the next overlap). */
        T_ASSERT_MSG(side * 2 > n, "backend %d: only %d of %d write calls ran while another file was written",
                     backends[b], side, n);
    }
    free(src);
}

/* Host memory off a 4 KiB boundary is written to a tmpfs file straight from where it is: O_DIRECT (which tmpfs
 * takes since Linux 6.6) would copy it through a bounce buffer first, for nothing. */
static void test_unaligned_memory_to_tmpfs_is_not_bounced(void) {
    if (!is_tmpfs("/dev/shm") || access("/dev/shm", W_OK) != 0) t_skip("no writable tmpfs at /dev/shm");
    unsigned char *buf = malloc(FILE_BYTES + 64);
    T_ASSERT(buf);
    unsigned char *src = buf + 16; /* never on a page */
    t_fill_random(src, FILE_BYTES, 29);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/ckptio-unaligned-%d.bin", (int)getpid());
    ckptio_engine *e = four_workers();
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    ckptio_plan *p;
    const ckptio_extent x = {.file = f, .length = FILE_BYTES, .memory = src, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    T_OK(ckptio_plan_add(p, &x));
    T_OK(ckptio_engine_execute(e, p));
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_OK(ckptio_engine_destroy(e));
    size_t len;
    unsigned char *img = t_read_file(path, &len);
    T_ASSERT_MSG(len == FILE_BYTES && memcmp(img, src, len) == 0, "%s: the file does not hold the bytes written",
                 path);
    free(img);
    unlink(path);
    free(buf);
    T_ASSERT_MSG(st.bytes_bounced == 0, "%llu bytes went through a bounce buffer into a tmpfs file",
                 (unsigned long long)st.bytes_bounced);
}

int main(void) {
    T_RUN(test_writes_to_a_tmpfs_file_take_turns);
    T_RUN(test_files_in_memory_are_written_side_by_side);
    T_RUN(test_unaligned_memory_to_tmpfs_is_not_bounced);
    return 0;
}
