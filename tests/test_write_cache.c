/*
 * test_write_cache.c - the cache after a save (src/io/read_policy.c, the
 * write half; CKPTIO_OPT_WRITE_CACHE).
 *
 * Each case saves a file through a write plan and commits it (fsync), then
 * asks the page cache how much of the file it holds (cachestat, else
 * mincore: ckptio__range_cached_pages) and checks the engine's counters:
 * a small save in AUTO goes through the page cache and stays there for the
 * next load; with OFF, above 128 MiB, or above a quarter of MemAvailable it
 * is written with O_DIRECT and leaves (almost) nothing. On a memory file
 * system everything is in memory anyway: the test skips.
 */
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "io_internal.h"

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

static void skip_on_memory_file_systems(void) {
    struct statfs sb;
    T_ASSERT(statfs(t_tmpdir(), &sb) == 0);
    if (sb.f_type == TMPFS_MAGIC || sb.f_type == RAMFS_MAGIC)
        t_skip("%s is in memory: every file is cached", t_tmpdir());
}

/* Percent of [0, size) of the file that the page cache holds. */
static unsigned cached_percent(const char *path, uint64_t size) {
    const int fd = open(path, O_RDONLY);
    T_ASSERT(fd >= 0);
    uint64_t cached = 0, pages = 0;
    T_ASSERT(ckptio__range_cached_pages(fd, 0, size, &cached, &pages));
    close(fd);
    return (unsigned)(cached * 100 / pages);
}

static ckptio_engine *make_engine(ckptio_write_cache mode) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 * MIB));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_AUTO));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_WRITE_CACHE, mode));
    return e;
}

/* Saves `len` bytes of `data` (host or simulated device memory) at `offset`
 * of a new file, commits; returns the engine's counters for the save. */
static ckptio_stats save(ckptio_engine *e, const char *path, const void *data, uint64_t len, uint64_t offset,
                         ckptio_mem_kind kind) {
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(e, &a));
    ckptio_file *f = NULL;
    ckptio_plan *p = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    const ckptio_extent x = {.file = f, .file_offset = offset, .length = len, .memory = (void *)data,
                             .mem_kind = kind};
    T_OK(ckptio_plan_add(p, &x));
    T_OK(ckptio_engine_execute(e, p));
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_stats(e, &b));
    return (ckptio_stats){.bytes_written = b.bytes_written - a.bytes_written,
                          .bytes_direct = b.bytes_direct - a.bytes_direct,
                          .bytes_buffered = b.bytes_buffered - a.bytes_buffered};
}

static void check_saved(const char *path, const unsigned char *want, uint64_t len, uint64_t offset) {
    size_t n;
    unsigned char *got = t_read_file(path, &n);
    T_ASSERT(n == offset + len && memcmp(got + offset, want, len) == 0);
    free(got);
}

/* AUTO, a small file: written through the page cache, which keeps it. */
static void test_small_save_stays_in_the_page_cache(void) {
    skip_on_memory_file_systems();
    ckptio__read_policy_set_mem_available(0);
    unsigned char *data = aligned(FILE_SIZE);
    t_fill_random(data, FILE_SIZE, 1);
    ckptio_engine *e = make_engine(CKPTIO_WRITE_CACHE_AUTO);
    const char *path = t_path("small.bin");
    const ckptio_stats d = save(e, path, data, FILE_SIZE, 0, CKPTIO_MEM_HOST);
    T_ASSERT_MSG(d.bytes_written == FILE_SIZE && d.bytes_direct == 0 && d.bytes_buffered == FILE_SIZE,
                 "written %llu, direct %llu, buffered %llu", (unsigned long long)d.bytes_written,
                 (unsigned long long)d.bytes_direct, (unsigned long long)d.bytes_buffered);
    T_ASSERT_MSG(cached_percent(path, FILE_SIZE) == 100, "%u%% cached after the save", cached_percent(path, FILE_SIZE));
    check_saved(path, data, FILE_SIZE, 0);
    T_OK(ckptio_engine_destroy(e));
    free(data);
}

/* OFF, a file above a quarter of MemAvailable, and a file above 128 MiB:
 * O_DIRECT, nothing left in the page cache but the partial last block. ON
 * caches whatever the memory says. */
static void test_off_and_big_saves_use_o_direct(void) {
    skip_on_memory_file_systems();
    unsigned char *data = aligned(FILE_SIZE);
    t_fill_random(data, FILE_SIZE, 2);
    const char *path = t_path("big.bin");
    for (int c = 0; c < 4; c++) {
        ckptio_engine *e = make_engine(c == 0 ? CKPTIO_WRITE_CACHE_OFF
                                              : c == 3 ? CKPTIO_WRITE_CACHE_ON : CKPTIO_WRITE_CACHE_AUTO);
        /* Cases 1 and 3: the file is over a quarter of the memory there is. */
        ckptio__read_policy_set_mem_available(c == 1 || c == 3 ? 4ull * FILE_SIZE - 4 : 0);
        /* Case 2: the file ends 200 MiB in (a hole before the data): over 128 MiB. */
        const uint64_t offset = c == 2 ? 200ull * MIB : 0;
        const ckptio_stats d = save(e, path, data, FILE_SIZE, offset, CKPTIO_MEM_HOST);
        const unsigned pct = cached_percent(path, offset + FILE_SIZE);
        if (c == 3) {
            T_ASSERT_MSG(d.bytes_direct == 0 && pct == 100, "ON: direct %llu, %u%% cached",
                         (unsigned long long)d.bytes_direct, pct);
        } else {
            T_ASSERT_MSG(d.bytes_direct >= FILE_SIZE - 4096 && d.bytes_buffered < 4096,
                         "case %d: direct %llu, buffered %llu", c, (unsigned long long)d.bytes_direct,
                         (unsigned long long)d.bytes_buffered);
            T_ASSERT_MSG(cached_percent(path, offset + FILE_SIZE) <= 1, "case %d: %u%% cached", c, pct);
        }
        check_saved(path, data, FILE_SIZE, offset);
        T_OK(ckptio_engine_destroy(e));
    }
    ckptio__read_policy_set_mem_available(0);
    free(data);
}

/* A small save from (simulated) GPU memory goes through the staging
 * pipeline, whose writes follow the same decision. */
static void test_small_gpu_save_stays_in_the_page_cache(void) {
    skip_on_memory_file_systems();
    ckptio__read_policy_set_mem_available(0);
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio__gpu_sim_configure(NULL);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(FILE_SIZE);
    T_ASSERT(dev);
    t_fill_random(dev, FILE_SIZE, 3);
    for (int mode = 0; mode < 2; mode++) {
        ckptio_engine *e = make_engine(mode ? CKPTIO_WRITE_CACHE_OFF : CKPTIO_WRITE_CACHE_AUTO);
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 2 * MIB));
        const char *path = t_path("gpu.bin");
        const ckptio_stats d = save(e, path, dev, FILE_SIZE, 0, CKPTIO_MEM_CUDA);
        const unsigned pct = cached_percent(path, FILE_SIZE);
        if (mode == 0)
            T_ASSERT_MSG(d.bytes_direct == 0 && pct == 100, "AUTO: direct %llu, %u%% cached",
                         (unsigned long long)d.bytes_direct, pct);
        else
            T_ASSERT_MSG(d.bytes_direct >= FILE_SIZE - 8192 && pct <= 1, "OFF: direct %llu, %u%% cached",
                         (unsigned long long)d.bytes_direct, pct);
        check_saved(path, dev, FILE_SIZE, 0);
        T_OK(ckptio_engine_destroy(e));
    }
    ckptio__gpu_sim_device_free(dev);
}

int main(void) {
    T_RUN(test_small_save_stays_in_the_page_cache);
    T_RUN(test_off_and_big_saves_use_o_direct);
    T_RUN(test_small_gpu_save_stays_in_the_page_cache);
    return 0;
}
