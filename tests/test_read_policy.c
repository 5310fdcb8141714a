/*
 * test_read_policy.c - cold reads through the page cache or with O_DIRECT
 * (src/io/read_policy.c, CKPTIO_OPT_READ_CACHE).
 *
 * Each case writes a file, evicts it from the page cache (fsync, then
 * POSIX_FADV_DONTNEED) and reads it, then checks the engine's counters (bytes
 * moved with O_DIRECT or buffered) and what the page cache holds afterwards:
 * a load that went through the page cache leaves the file there, so the next
 * one is served from memory, on the host path and the GPU path alike.
 * MemAvailable is replaced through the test hook where a case needs a file
 * "too big" for the cache. On a memory file system (tmpfs) nothing can be
 * evicted: the test skips.
 */
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#define MIB (1u << 20)
#define FILE_SIZE (6 * MIB + 123)

static unsigned char *aligned(size_t n) {
    void *p = NULL;
    T_ASSERT(posix_memalign(&p, 4096, n ? n : 1) == 0);
    return p;
}

/* Drops the file's pages; false if the page cache kept them. */
static bool evict(const char *path) {
    const int fd = open(path, O_RDONLY);
    T_ASSERT(fd >= 0);
    T_ASSERT(fsync(fd) == 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    uint64_t cached = 0, pages = 0;
    const bool known = ckptio__range_cached_pages(fd, 0, FILE_SIZE, &cached, &pages);
    close(fd);
    return known && cached == 0;
}

/* Fraction of the file's pages in the page cache, in percent. */
static unsigned cached_percent(const char *path) {
    const int fd = open(path, O_RDONLY);
    T_ASSERT(fd >= 0);
    uint64_t cached = 0, pages = 0;
    T_ASSERT(ckptio__range_cached_pages(fd, 0, FILE_SIZE, &cached, &pages));
    close(fd);
    return (unsigned)(cached * 100 / pages);
}

static unsigned char *make_file(const char *path, uint64_t seed) {
    unsigned char *data = malloc(FILE_SIZE);
    T_ASSERT(data);
    t_fill_random(data, FILE_SIZE, seed);
    t_write_file(path, data, FILE_SIZE);
    if (!evict(path)) t_skip("the page cache keeps %s (a memory file system?): nothing is ever cold", path);
    return data;
}

static ckptio_engine *make_engine(ckptio_read_cache mode) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 * MIB));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_AUTO));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_READ_CACHE, mode));
    return e;
}

/* Reads `nfiles` files whole in one plan to host memory; returns the stats
 * delta and checks the bytes. */
static ckptio_stats read_files(ckptio_engine *e, const char *const *paths, unsigned char *const *want,
                               size_t nfiles) {
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(e, &a));
    ckptio_plan *p = NULL;
    ckptio_file *f[4] = {NULL};
    unsigned char *dst[4] = {NULL};
    T_ASSERT(nfiles <= 4);
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    for (size_t i = 0; i < nfiles; i++) {
        T_OK(ckptio_file_open(e, paths[i], CKPTIO_OPEN_READ, &f[i]));
        dst[i] = aligned(FILE_SIZE);
        const ckptio_extent x = {.file = f[i], .file_offset = 0, .length = FILE_SIZE, .memory = dst[i],
                                 .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_plan_add(p, &x));
    }
    T_OK(ckptio_engine_execute(e, p));
    for (size_t i = 0; i < nfiles; i++) {
        T_ASSERT_MSG(memcmp(dst[i], want[i], FILE_SIZE) == 0, "file %zu read wrong bytes", i);
        T_OK(ckptio_file_close(f[i]));
        free(dst[i]);
    }
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_engine_stats(e, &b));
    return (ckptio_stats){.bytes_read = b.bytes_read - a.bytes_read,
                          .bytes_direct = b.bytes_direct - a.bytes_direct,
                          .bytes_buffered = b.bytes_buffered - a.bytes_buffered};
}

/* AUTO with a file far below a quarter of MemAvailable: the cold read goes
 * through the page cache and leaves the file there; the second is warm. */
static void test_auto_small_file_is_cached(void) {
    ckptio__read_policy_set_mem_available(0);
    const char *path = t_path("small.bin");
    unsigned char *want = make_file(path, 1);
    ckptio_engine *e = make_engine(CKPTIO_READ_CACHE_AUTO);
    ckptio_stats d = read_files(e, &path, &want, 1);
    T_ASSERT_MSG(d.bytes_read == FILE_SIZE && d.bytes_buffered == FILE_SIZE && d.bytes_direct == 0,
                 "read %llu, buffered %llu, direct %llu", (unsigned long long)d.bytes_read,
                 (unsigned long long)d.bytes_buffered, (unsigned long long)d.bytes_direct);
    T_ASSERT_MSG(cached_percent(path) == 100, "only %u%% of the file is cached after the load", cached_percent(path));
    d = read_files(e, &path, &want, 1);
    T_ASSERT(d.bytes_buffered == FILE_SIZE && d.bytes_direct == 0);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* AUTO with the file above a quarter of MemAvailable: O_DIRECT, nothing
 * cached; exactly a quarter still goes through the cache. */
static void test_auto_big_file_is_direct(void) {
    const char *path = t_path("big.bin");
    unsigned char *want = make_file(path, 2);
    ckptio_engine *e = make_engine(CKPTIO_READ_CACHE_AUTO);
    ckptio__read_policy_set_mem_available(4ull * FILE_SIZE - 4);
    ckptio_stats d = read_files(e, &path, &want, 1);
    T_ASSERT_MSG(d.bytes_direct > FILE_SIZE - 8192 && d.bytes_direct + d.bytes_buffered == FILE_SIZE,
                 "direct %llu of %u", (unsigned long long)d.bytes_direct, FILE_SIZE);
    T_ASSERT_MSG(cached_percent(path) < 10, "%u%% of the file is cached after an O_DIRECT load", cached_percent(path));
    ckptio__read_policy_set_mem_available(4ull * FILE_SIZE);
    d = read_files(e, &path, &want, 1);
    T_ASSERT(d.bytes_buffered == FILE_SIZE && d.bytes_direct == 0);
    T_ASSERT(cached_percent(path) == 100);
    ckptio__read_policy_set_mem_available(0);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* The plan's files count together: two files that would each fit, but not
 * both, are read with O_DIRECT (a directory of shards is one checkpoint). */
static void test_auto_counts_every_file_of_a_plan(void) {
    const char *paths[2] = {t_path("shard1.bin"), t_path("shard2.bin")};
    unsigned char *want[2] = {make_file(paths[0], 3), make_file(paths[1], 4)};
    ckptio_engine *e = make_engine(CKPTIO_READ_CACHE_AUTO);
    ckptio__read_policy_set_mem_available(4ull * FILE_SIZE + 4ull * FILE_SIZE / 2);
    ckptio_stats d = read_files(e, paths, want, 2);
    T_ASSERT_MSG(d.bytes_direct > 2 * (FILE_SIZE - 8192), "direct %llu", (unsigned long long)d.bytes_direct);
    T_ASSERT(cached_percent(paths[0]) < 10 && cached_percent(paths[1]) < 10);
    d = read_files(e, paths, want, 1); /* one of them alone fits */
    T_ASSERT(d.bytes_buffered == FILE_SIZE && d.bytes_direct == 0);
    ckptio__read_policy_set_mem_available(0);
    T_OK(ckptio_engine_destroy(e));
    free(want[0]), free(want[1]);
}

/* OFF: O_DIRECT whatever the size; ON: the page cache whatever the size. */
static void test_forced_modes(void) {
    const char *path = t_path("forced.bin");
    unsigned char *want = make_file(path, 5);
    ckptio_engine *e = make_engine(CKPTIO_READ_CACHE_OFF);
    ckptio_stats d = read_files(e, &path, &want, 1);
    T_ASSERT(d.bytes_direct > FILE_SIZE - 8192 && cached_percent(path) < 10);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_READ_CACHE, CKPTIO_READ_CACHE_ON));
    ckptio__read_policy_set_mem_available(4096); /* "no memory": ON still caches */
    d = read_files(e, &path, &want, 1);
    T_ASSERT(d.bytes_buffered == FILE_SIZE && d.bytes_direct == 0 && cached_percent(path) == 100);
    /* Warm data is read from the cache in OFF mode too. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_READ_CACHE, CKPTIO_READ_CACHE_OFF));
    d = read_files(e, &path, &want, 1);
    T_ASSERT(d.bytes_buffered == FILE_SIZE && d.bytes_direct == 0);
    /* DIRECT=on wins over the read policy. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_READ_CACHE, CKPTIO_READ_CACHE_ON));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_ON));
    d = read_files(e, &path, &want, 1);
    T_ASSERT(d.bytes_direct > FILE_SIZE - 8192);
    ckptio__read_policy_set_mem_available(0);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* Residency questions are counted through the fault seam: a fault armed
 * far beyond any read's count never fires, and its countdown tells how
 * many questions were asked since it was armed. */
#define NEVER (1ull << 40)

static void arm_residency_count(void) { ckptio__io_inject(CKPTIO__IO_RESIDENCY, NEVER, EIO, 0, false); }

static uint64_t residency_questions_since_armed(void) {
    return NEVER - ckptio__io_inject_countdown(CKPTIO__IO_RESIDENCY);
}

static bool on_tmpfs(const char *dir) {
    struct statfs sb;
    return statfs(dir, &sb) == 0 && sb.f_type == TMPFS_MAGIC;
}

/* A file on tmpfs is in memory by definition: its reads go through the page
 * cache without asking it per range (cachestat cost 15% of a 4 MiB read
 * there, page_cache.c), even where the read policy sends cold reads to
 * O_DIRECT. A file on disk read the same way is asked about. */
static void test_memory_file_system_is_not_asked(void) {
    if (!on_tmpfs("/dev/shm") || access("/dev/shm", W_OK) != 0) {
        printf("  (no writable tmpfs at /dev/shm: not run)\n");
        return;
    }
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/ckptio-test-%d.bin", (int)getpid());
    unsigned char *want = malloc(FILE_SIZE);
    T_ASSERT(want);
    t_fill_random(want, FILE_SIZE, 8);
    t_write_file(path, want, FILE_SIZE);
    ckptio__read_policy_set_mem_available(4ull * FILE_SIZE - 4); /* "too big": cold reads go O_DIRECT */
    ckptio_engine *e = make_engine(CKPTIO_READ_CACHE_AUTO);
    arm_residency_count();
    const char *p = path;
    ckptio_stats d = read_files(e, &p, &want, 1);
    uint64_t asked = residency_questions_since_armed();
    unlink(path);
    T_ASSERT_MSG(asked == 0 && d.bytes_buffered == FILE_SIZE && d.bytes_direct == 0,
                 "tmpfs: %llu residency questions, %llu bytes buffered, %llu direct", (unsigned long long)asked,
                 (unsigned long long)d.bytes_buffered, (unsigned long long)d.bytes_direct);
    if (!on_tmpfs(t_tmpdir())) {
        const char *disk = t_path("asked.bin");
        unsigned char *want_disk = make_file(disk, 9);
        arm_residency_count();
        d = read_files(e, &disk, &want_disk, 1);
        asked = residency_questions_since_armed();
        T_ASSERT_MSG(asked > 0 && d.bytes_direct > FILE_SIZE - 8192, "disk: %llu residency questions, %llu direct",
                     (unsigned long long)asked, (unsigned long long)d.bytes_direct);
        free(want_disk);
    }
    ckptio__io_inject_reset();
    ckptio__read_policy_set_mem_available(0);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* ckptio__file_io (GPU pipeline threads, headers, manifests) outside a
 * plan judges the file by its own size. */
static void test_file_io_outside_a_plan(void) {
    const char *path = t_path("fileio.bin");
    unsigned char *want = make_file(path, 6);
    for (int big = 0; big <= 1; big++) {
        T_ASSERT(evict(path));
        ckptio__read_policy_set_mem_available(big ? 4ull * FILE_SIZE - 4 : 0);
        ckptio_engine *e = make_engine(CKPTIO_READ_CACHE_AUTO);
        ckptio_file *f = NULL;
        T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
        const size_t n = 4 * MIB;
        unsigned char *buf = aligned(n);
        ckptio_stats a, b;
        T_OK(ckptio_engine_stats(e, &a));
        T_OK(ckptio__file_io(f, CKPTIO_READ, buf, n, 0));
        T_OK(ckptio_engine_stats(e, &b));
        T_ASSERT(memcmp(buf, want, n) == 0);
        if (big) T_ASSERT(b.bytes_direct - a.bytes_direct == n);
        else T_ASSERT(b.bytes_buffered - a.bytes_buffered == n && b.bytes_direct == a.bytes_direct);
        T_OK(ckptio_file_close(f));
        T_OK(ckptio_engine_destroy(e));
        free(buf);
    }
    ckptio__read_policy_set_mem_available(0);
    free(want);
}

/* A GPU load (simulated device): with ON the first load of a cold file goes
 * through the page cache, so the second reads the cached pages (buffered,
 * no O_DIRECT). With OFF, and with AUTO for a plan going to GPU memory
 * (O_DIRECT is faster and far cheaper in CPU there, read_policy.c), the
 * file stays cold and the second load reads with O_DIRECT again. */
static void test_gpu_second_load_reads_the_page_cache(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio__gpu_sim_configure(NULL);
    const char *path = t_path("gpu.bin");
    unsigned char *want = make_file(path, 7);
    const ckptio_read_cache modes[] = {CKPTIO_READ_CACHE_ON, CKPTIO_READ_CACHE_OFF, CKPTIO_READ_CACHE_AUTO};
    for (int mode = 0; mode < 3; mode++) {
        T_ASSERT(evict(path));
        ckptio_engine *e = make_engine(modes[mode]);
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 2 * MIB));
        ckptio_file *f = NULL;
        T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
        unsigned char *dev = ckptio__gpu_sim_device_alloc(FILE_SIZE);
        T_ASSERT(dev);
        ckptio_stats s[2];
        for (int load = 0; load < 2; load++) {
            memset(dev, 0xEE, FILE_SIZE);
            ckptio_stats a;
            T_OK(ckptio_engine_stats(e, &a));
            ckptio_plan *p = NULL;
            T_OK(ckptio_plan_create(CKPTIO_READ, &p));
            const ckptio_extent x = {.file = f, .file_offset = 0, .length = FILE_SIZE, .memory = dev,
                                     .mem_kind = CKPTIO_MEM_CUDA};
            T_OK(ckptio_plan_add(p, &x));
            T_OK(ckptio_engine_execute(e, p));
            T_OK(ckptio_plan_destroy(p));
            T_ASSERT_MSG(memcmp(dev, want, FILE_SIZE) == 0, "load %d read wrong bytes", load);
            T_OK(ckptio_engine_stats(e, &s[load]));
            s[load].bytes_direct -= a.bytes_direct;
            s[load].bytes_buffered -= a.bytes_buffered;
        }
        if (mode == 0) {
            T_ASSERT_MSG(s[0].bytes_direct == 0, "the first load moved %llu bytes with O_DIRECT",
                         (unsigned long long)s[0].bytes_direct);
            T_ASSERT_MSG(s[1].bytes_direct == 0 && s[1].bytes_buffered == FILE_SIZE,
                         "second load: %llu of %u bytes from the page cache, %llu with O_DIRECT",
                         (unsigned long long)s[1].bytes_buffered, FILE_SIZE, (unsigned long long)s[1].bytes_direct);
        } else {
            T_ASSERT(s[0].bytes_direct > FILE_SIZE - 8192 && s[1].bytes_direct > FILE_SIZE - 8192);
            /* at most the partial last block, which is read buffered */
            T_ASSERT_MSG(s[1].bytes_buffered < 4096, "second load: %llu bytes from the page cache",
                         (unsigned long long)s[1].bytes_buffered);
        }
        ckptio__gpu_sim_device_free(dev);
        T_OK(ckptio_file_close(f));
        T_OK(ckptio_engine_destroy(e));
    }
    free(want);
}

int main(void) {
    T_RUN(test_auto_small_file_is_cached);
    T_RUN(test_auto_big_file_is_direct);
    T_RUN(test_auto_counts_every_file_of_a_plan);
    T_RUN(test_forced_modes);
    T_RUN(test_file_io_outside_a_plan);
    T_RUN(test_memory_file_system_is_not_asked);
    T_RUN(test_gpu_second_load_reads_the_page_cache);
    return T_EXIT_PASS;
}
