/*
 * test_gpu_pipeline.c - the GPU staging pipeline and the GDS file API on the
 * simulated device (tests/doubles/gpu_sim.c): bytes, ordering (no staging slot
 * reused before its copy completed), overlap, unaligned offsets, staging
 * bounds, slot geometry and pinning, error paths and stream-ordered
 * requests. Runs without a GPU.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "gpu_pipeline.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <malloc.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static ckptio_engine *make_engine_path(int64_t threads, int64_t staging, int64_t chunk, ckptio_gpu_path path) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, staging));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, chunk));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, path));
    return e;
}

/* The staging pipeline (the simulated device has no cuFile anyway). */
static ckptio_engine *make_engine(int64_t threads, int64_t staging, int64_t chunk) {
    return make_engine_path(threads, staging, chunk, CKPTIO_GPU_PATH_PIPELINE);
}

static void sim_reset(unsigned delay_us) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = delay_us};
    ckptio__gpu_sim_configure(&cfg);
}

static void check_sim_clean(uint64_t staging_bound) {
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.violations == 0, "%llu staging slots were modified while their copy was in flight",
                 (unsigned long long)s.violations);
    T_ASSERT_MSG(s.ctx_depth == 0, "context pushes and pops unbalanced: %lld", (long long)s.ctx_depth);
    T_ASSERT_MSG(s.pinned_peak <= staging_bound, "pinned peak %llu above the staging bound %llu",
                 (unsigned long long)s.pinned_peak, (unsigned long long)staging_bound);
}

static void check_engine_staging(ckptio_engine *e, uint64_t bound) {
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT_MSG(st.staging_in_use == 0, "staging still in use after the transfer: %llu",
                 (unsigned long long)st.staging_in_use);
    T_ASSERT_MSG(st.staging_reserved <= bound && st.staging_peak <= bound,
                 "staging reserved %llu / peak %llu above bound %llu", (unsigned long long)st.staging_reserved,
                 (unsigned long long)st.staging_peak, (unsigned long long)bound);
}

/* A file of `size` random bytes; returns its contents (caller frees). */
static unsigned char *make_file(const char *path, size_t size, uint64_t seed) {
    unsigned char *data = malloc(size ? size : 1);
    T_ASSERT(data);
    t_fill_random(data, size, seed);
    t_write_file(path, data, size);
    return data;
}

/* make_file(path, size, seed), opened for reading on `e` into *f; returns the file's contents. */
static unsigned char *open_made_file(ckptio_engine *e, const char *path, size_t size, uint64_t seed, ckptio_file **f) {
    unsigned char *want = make_file(path, size, seed);
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, f));
    return want;
}

/* The file at `path` holds exactly `expect` (`size` bytes); a byte the
 * simulator poisoned says which copy was read too early. */
static void check_file_bytes(const char *path, const unsigned char *expect, size_t size) {
    size_t got_len = 0;
    unsigned char *got = t_read_file(path, &got_len);
    T_ASSERT_MSG(got_len == size, "%s has %zu bytes, expected %zu", path, got_len, size);
    for (size_t i = 0; i < size; i++)
        T_ASSERT_MSG(got[i] == expect[i], "file byte %zu is 0x%02x, expected 0x%02x%s", i, got[i], expect[i],
                     got[i] == CKPTIO_SIM_POISON_D2H ? " (staging read before its copy completed)" : "");
    free(got);
}

/* ---- reads ---------------------------------------------------------------- */

static void read_extents_case(int64_t threads, int64_t staging, unsigned delay) {
    sim_reset(delay);
    const size_t fsize = 5 * MIB + 777;
    ckptio_engine *e = make_engine(threads, staging, 8 * MIB);
    const char *path = t_path("read.bin");
    ckptio_file *f = NULL;
    unsigned char *want = open_made_file(e, path, fsize, 11, &f);
    const size_t dsize = 6 * MIB;
    unsigned char *dev = ckptio__gpu_sim_device_alloc(dsize);
    T_ASSERT(dev);
    memset(dev, 0xEE, dsize);
    /* Unaligned offsets, lengths and device addresses; adjacent extents,
     * small holes, a large hole, an extent ending at EOF, one empty. */
    const struct { uint64_t off, len, dev_off; } spec[] = {
        {0, 4096, 0},          {4096, 1, 8192},          {4097, 3 * MIB + 5, 8193},
        {3 * MIB + 10000, 65537, 4 * MIB + 3}, {4 * MIB + 1, 100, 4 * MIB + 70000},
        {fsize - 12345, 12345, 5 * MIB + 11}, {777, 0, 5 * MIB + 50000},
    };
    const size_t n = sizeof spec / sizeof spec[0];
    ckptio_extent ext[sizeof spec / sizeof spec[0]];
    for (size_t i = 0; i < n; i++)
        ext[i] = (ckptio_extent){.file = f, .file_offset = spec[i].off, .length = spec[i].len,
                                 .memory = dev + spec[i].dev_off, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, ext, n));
    uint64_t total = 0;
    unsigned char *expect = malloc(dsize);
    memset(expect, 0xEE, dsize);
    for (size_t i = 0; i < n; i++) {
        memcpy(expect + spec[i].dev_off, want + spec[i].off, spec[i].len);
        total += spec[i].len;
    }
    for (size_t i = 0; i < dsize; i++)
        T_ASSERT_MSG(dev[i] == expect[i], "device byte %zu is 0x%02x, expected 0x%02x", i, dev[i], expect[i]);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT_MSG(st.bytes_h2d == total, "bytes_h2d %llu != %llu", (unsigned long long)st.bytes_h2d,
                 (unsigned long long)total);
    check_engine_staging(e, (uint64_t)staging);
    check_sim_clean((uint64_t)staging);
    ckptio_io_path p;
    T_OK(ckptio_engine_gpu_path(e, &p));
    T_ASSERT(p == CKPTIO_IO_PATH_PIPELINE);
    if (delay) {
        ckptio__gpu_sim_stats s;
        ckptio__gpu_sim_get_stats(&s);
        /* File reads ran while earlier copies were still queued. */
        T_ASSERT_MSG(s.max_pending >= 2, "no overlap: at most %llu copy pending", (unsigned long long)s.max_pending);
    }
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(expect);
    free(want);
}

static void test_read_one_worker(void) { read_extents_case(1, 1 * MIB, 200); }
static void test_read_four_workers(void) { read_extents_case(4, 8 * MIB, 100); }
static void test_read_no_delay(void) { read_extents_case(2, 2 * MIB, 0); }

/* ---- writes --------------------------------------------------------------- */

static void test_write_extents(void) {
    sim_reset(150);
    const size_t fsize = 4 * MIB + 321;
    const char *path = t_path("write.bin");
    unsigned char *file0 = malloc(fsize);
    memset(file0, 0x11, fsize);
    t_write_file(path, file0, fsize);
    ckptio_engine *e = make_engine(3, 4 * MIB, 8 * MIB);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE, &f));
    const size_t dsize = 5 * MIB;
    unsigned char *dev = ckptio__gpu_sim_device_alloc(dsize);
    t_fill_random(dev, dsize, 5);
    const struct { uint64_t off, len, dev_off; } spec[] = {
        {1, 4095, 3},            {4096, 2 * MIB + 1, 5000}, {2 * MIB + 4097, 100, 3 * MIB},
        {2 * MIB + 8192, 1 * MIB, 3 * MIB + 4096}, {fsize - 3, 3, 5 * MIB - 3},
    };
    const size_t n = sizeof spec / sizeof spec[0];
    ckptio_extent ext[sizeof spec / sizeof spec[0]];
    unsigned char *expect = malloc(fsize);
    memcpy(expect, file0, fsize);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        ext[i] = (ckptio_extent){.file = f, .file_offset = spec[i].off, .length = spec[i].len,
                                 .memory = dev + spec[i].dev_off, .mem_kind = CKPTIO_MEM_CUDA};
        memcpy(expect + spec[i].off, dev + spec[i].dev_off, spec[i].len);
        total += spec[i].len;
    }
    T_OK(ckptio__gpu_execute(e, CKPTIO_WRITE, ext, n));
    T_OK(ckptio_file_close(f));
    check_file_bytes(path, expect, fsize);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT(st.bytes_d2h == total);
    check_engine_staging(e, 4 * MIB);
    check_sim_clean(4 * MIB);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.max_pending >= 2, "device-to-host copies were not queued ahead of writes");
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(expect);
    free(file0);
}

/* ---- strided pieces: one pitched copy per window ---------------------------- */

/* Bytes this process has read with read calls (/proc/self/io rchar): what
 * a read moved from the file, gaps included, which the engine's bytes_read
 * (extent bytes) does not show. */
static uint64_t proc_rchar(void) {
    FILE *io = fopen("/proc/self/io", "r");
    unsigned long long v = 0;
    char line[128];
    while (io && fgets(line, sizeof line, io))
        if (sscanf(line, "rchar: %llu", &v) == 1) break;
    if (io) fclose(io);
    return v;
}

/* Where column_slice_case's rows land. */
typedef struct column_layout {
    size_t piece;               /* device memory mapped in pieces of this size (0: one allocation) */
    size_t dev_stride;          /* row i lands at i * dev_stride (0: width, back to back) */
} column_layout;

/* Rows of a row-major matrix in a file; every row's columns [col, col + width)
 * go to `dev`, one row after the other (a column slice), except row `odd_row`,
 * which lands elsewhere (the stride breaks there). Returns the copies queued
 * (*copies_2d: of them pitched; *bytes_read: what the read calls moved, gaps
 * included) and checks every device byte. */
static uint64_t column_slice_case(column_layout kn, size_t col, size_t width, uint64_t *copies_2d,
                                  uint64_t *bytes_read) {
    sim_reset(50);
    const size_t stride = kn.dev_stride ? kn.dev_stride : width;
    enum { ROWS = 512, ODD_ROW = 200 };
    const size_t row = 16 * KIB, fsize = ROWS * row + 123;
    ckptio_engine *e = make_engine(2, 4 * MIB, 8 * MIB); /* 512 KiB windows: 32 rows each */
    ckptio_file *f = NULL;
    unsigned char *want = open_made_file(e, t_path("matrix.bin"), fsize, 21, &f);
    const size_t dsize = ROWS * stride + 4 * KIB + width;
    /* piece: device memory mapped in pieces of that size (torch's expandable segments). */
    unsigned char *dev = kn.piece ? ckptio__gpu_sim_device_alloc_pieces(dsize, kn.piece, true)
                                  : ckptio__gpu_sim_device_alloc(dsize);
    memset(dev, 0xEE, dsize);
    ckptio_extent ext[ROWS];
    unsigned char *expect = malloc(dsize);
    memset(expect, 0xEE, dsize);
    for (size_t i = 0; i < ROWS; i++) {
        const size_t at = i == ODD_ROW ? ROWS * stride + 4 * KIB : i * stride;
        ext[i] = (ckptio_extent){.file = f, .file_offset = i * row + col, .length = width, .memory = dev + at,
                                 .mem_kind = CKPTIO_MEM_CUDA};
        memcpy(expect + at, want + i * row + col, width);
    }
    const uint64_t rchar = proc_rchar();
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, ext, ROWS));
    *bytes_read = proc_rchar() - rchar;
    for (size_t i = 0; i < dsize; i++)
        T_ASSERT_MSG(dev[i] == expect[i], "col %zu width %zu: device byte %zu is 0x%02x, expected 0x%02x", col, width,
                     i, dev[i], expect[i]);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT(st.bytes_h2d == (uint64_t)ROWS * width && st.bytes_read == (uint64_t)ROWS * width);
    check_engine_staging(e, 4 * MIB);
    check_sim_clean(4 * MIB);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    *copies_2d = s.copies_2d;
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(expect);
    free(want);
    return s.copies;
}

static void test_column_slice_in_pitched_copies(void) {
    /* 12 KiB columns at 4 KiB (three quarters of the row, aligned), then 6
     * bytes at byte 10 (three bf16 columns, unaligned everywhere), then a
     * width that a window boundary cuts. 16 windows of 32 rows, one row
     * elsewhere. Each is read by span: more than half of each row, or
     * pieces too small to be read one by one (a quarter of the row would be
     * read packed: test_column_slice_packed_from_memory). */
    const size_t cases[][2] = {{4 * KIB, 12 * KIB}, {10, 6}, {5000, 9000}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t pitched = 0, read = 0;
        const uint64_t copies = column_slice_case((column_layout){0}, cases[c][0], cases[c][1], &pitched, &read);
        T_ASSERT_MSG(read >= 512 * 16 * KIB - 16 * KIB, "col %zu: the span read only %llu bytes", cases[c][0],
                     (unsigned long long)read);
        T_ASSERT_MSG(copies <= 3 * 16 + 4, "col %zu: %llu copies for 16 windows", cases[c][0],
                     (unsigned long long)copies);
        T_ASSERT_MSG(pitched >= 14, "col %zu: only %llu pitched copies", cases[c][0], (unsigned long long)pitched);
        /* Destinations mapped in pieces of about 10 rows, some rows across
         * two: no pitched copy leaves its piece (the simulator refuses one
         * that does), so more copies. */
        uint64_t in_pieces = 0;
        const uint64_t split = column_slice_case((column_layout){.piece = 10 * cases[c][1] + 3},
                                                 cases[c][0], cases[c][1], &in_pieces, &read);
        T_ASSERT_MSG(split > copies && in_pieces >= 1, "col %zu, in pieces: %llu copies, %llu pitched", cases[c][0],
                     (unsigned long long)split, (unsigned long long)in_pieces);
    }
}

/* A column slice of a file the page cache holds, its runs a quarter of
 * their span: read piece by piece into packed slots, so only the slice's
 * bytes are read, and copied in few copies (one per window where the rows
 * land back to back, pitched where they land apart). Pieces of 6 bytes are
 * not worth a read each: the span. */
static void test_column_slice_packed_from_memory(void) {
    uint64_t pitched = 0, read = 0;
    uint64_t copies = column_slice_case((column_layout){0}, 4 * KIB, 4 * KIB, &pitched, &read);
    T_ASSERT_MSG(read >= 512 * 4 * KIB && read < 512 * 5 * KIB, "packed: %llu bytes read for a 2 MiB slice",
                 (unsigned long long)read);
    /* 2 MiB in 512 KiB slots: 4 windows, one copy each, and the stray row (two more). */
    T_ASSERT_MSG(copies <= 8 && pitched == 0, "packed: %llu copies, %llu pitched", (unsigned long long)copies,
                 (unsigned long long)pitched);
    copies = column_slice_case((column_layout){.dev_stride = 5 * KIB}, 4 * KIB, 4 * KIB, &pitched, &read);
    T_ASSERT_MSG(read < 512 * 5 * KIB && copies <= 8 && pitched >= 4,
                 "packed, rows apart on the device: %llu read, %llu copies, %llu pitched", (unsigned long long)read,
                 (unsigned long long)copies, (unsigned long long)pitched);
    copies = column_slice_case((column_layout){.piece = 41 * KIB + 3}, 4 * KIB, 4 * KIB, &pitched, &read);
    T_ASSERT_MSG(read < 512 * 5 * KIB, "packed, destinations in pieces: %llu read", (unsigned long long)read);
    copies = column_slice_case((column_layout){0}, 10, 6, &pitched, &read);
    T_ASSERT_MSG(read >= 512 * 16 * KIB - 16 * KIB, "6-byte pieces: %llu bytes read, expected the span",
                 (unsigned long long)read);
}

/* A packed read of a file in memory (tmpfs: always packed) that is shorter
 * than its extents: the truncation is an error naming the file, as for a
 * span read. */
static void test_packed_read_past_the_end(void) {
    char path[] = "/dev/shm/ckptio-packed-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) {
        printf("skip test_packed_read_past_the_end: no /dev/shm\n");
        return;
    }
    close(fd);
    sim_reset(0);
    ckptio_engine *e = make_engine(2, 4 * MIB, 8 * MIB);
    ckptio_file *f = NULL;
    unsigned char *want = open_made_file(e, path, 100 * 16 * KIB, 4, &f);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(120 * 4 * KIB);
    ckptio_extent ext[120];
    for (size_t i = 0; i < 120; i++)
        ext[i] = (ckptio_extent){.file = f, .file_offset = i * 16 * KIB, .length = 4 * KIB, .memory = dev + i * 4 * KIB,
                                 .mem_kind = CKPTIO_MEM_CUDA};
    const uint64_t rchar = proc_rchar();
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, ext, 120), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS(path);
    /* It was the packed read that failed: the read calls moved the 100 rows'
     * 400 KiB of slice (and a few KiB of /proc the pinning's guard reads),
     * not the 1.6 MB span a span read covers. */
    const uint64_t moved = proc_rchar() - rchar;
    T_ASSERT_MSG(moved < 600 * KIB, "%llu bytes moved by read calls: not a packed read",
                 (unsigned long long)moved);
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    unlink(path);
    free(want);
}

/* A save from strided device memory (a column slice written out whole):
 * contiguous in the file, so in the slot; pitched on the device. */
static void test_strided_device_memory_saved_in_pitched_copies(void) {
    sim_reset(50);
    enum { ROWS = 300 };
    const size_t width = 3000, pitch = 8192, fsize = ROWS * width;
    const char *path = t_path("columns.bin");
    unsigned char *zero = calloc(1, fsize);
    t_write_file(path, zero, fsize);
    ckptio_engine *e = make_engine(2, 4 * MIB, 8 * MIB);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(ROWS * pitch);
    t_fill_random(dev, ROWS * pitch, 9);
    ckptio_extent ext[ROWS];
    unsigned char *expect = malloc(fsize);
    for (size_t i = 0; i < ROWS; i++) {
        ext[i] = (ckptio_extent){.file = f, .file_offset = i * width, .length = width, .memory = dev + i * pitch + 7,
                                 .mem_kind = CKPTIO_MEM_CUDA};
        memcpy(expect + i * width, dev + i * pitch + 7, width);
    }
    T_OK(ckptio__gpu_execute(e, CKPTIO_WRITE, ext, ROWS));
    T_OK(ckptio_file_close(f));
    check_file_bytes(path, expect, fsize);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.copies_2d >= 1 && s.copies < ROWS / 4, "%llu copies, %llu pitched", (unsigned long long)s.copies,
                 (unsigned long long)s.copies_2d);
    check_sim_clean(4 * MIB);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(expect);
    free(zero);
}

/* Sizes around slot boundaries and alignments, both directions. */
static void test_sizes_and_offsets(void) {
    sim_reset(0);
    /* staging 1 MiB, 1 worker -> 256 KiB slots */
    ckptio_engine *e = make_engine(1, 1 * MIB, 8 * MIB);
    const uint64_t slot = 256 * KIB;
    const uint64_t sizes[] = {1, 4095, 4096, 4097, slot - 1, slot, slot + 1, 3 * slot + 123};
    const uint64_t offs[] = {0, 1, 4095, 4096, 12345};
    const size_t fsize = 2 * MIB;
    const char *src = t_path("sizes_src.bin");
    unsigned char *want = make_file(src, fsize, 77);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(fsize);
    ckptio_file *rf = NULL;
    T_OK(ckptio_file_open(e, src, CKPTIO_OPEN_READ, &rf));
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
            const uint64_t len = sizes[si], off = offs[oi], doff = (off * 7 + 3) % 4096;
            memset(dev, 0xEE, fsize);
            ckptio_extent ex = {.file = rf, .file_offset = off, .length = len, .memory = dev + doff,
                                .mem_kind = CKPTIO_MEM_CUDA};
            T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
            T_ASSERT_MSG(memcmp(dev + doff, want + off, len) == 0, "read len %llu off %llu differs",
                         (unsigned long long)len, (unsigned long long)off);
            T_ASSERT(doff == 0 || dev[doff - 1] == 0xEE);
            T_ASSERT(dev[doff + len] == 0xEE);
            /* and back out to a fresh file at the same offset */
            const char *dst = t_path("sizes_dst.bin");
            unlink(dst);
            ckptio_file *wf = NULL;
            T_OK(ckptio_file_open(e, dst, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE, &wf));
            ex.file = wf;
            T_OK(ckptio__gpu_execute(e, CKPTIO_WRITE, &ex, 1));
            T_OK(ckptio_file_close(wf));
            size_t got_len = 0;
            unsigned char *got = t_read_file(dst, &got_len);
            T_ASSERT_MSG(got_len == off + len, "written file has %zu bytes, expected %llu", got_len,
                         (unsigned long long)(off + len));
            T_ASSERT(memcmp(got + off, want + off, len) == 0);
            for (uint64_t i = 0; i < off; i++) T_ASSERT(got[i] == 0);
            free(got);
        }
    }
    check_sim_clean(1 * MIB);
    ckptio_file_close(rf);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* ---- errors --------------------------------------------------------------- */

/* A file of `size` random bytes opened for reading on a one-worker engine
 * with 1 MiB of staging (4 slots of 256 KiB), a device buffer as large and
 * the one extent reading all of it. */
typedef struct one_worker_read {
    unsigned char *want, *dev;
    ckptio_engine *e;
    ckptio_file *f;
    ckptio_extent ex;
} one_worker_read;

static one_worker_read one_worker_read_setup(const char *path, size_t size, uint64_t seed) {
    one_worker_read r = {.want = make_file(path, size, seed), .e = make_engine(1, 1 * MIB, 8 * MIB)};
    T_OK(ckptio_file_open(r.e, path, CKPTIO_OPEN_READ, &r.f));
    r.dev = ckptio__gpu_sim_device_alloc(size);
    r.ex = (ckptio_extent){.file = r.f, .file_offset = 0, .length = size, .memory = r.dev,
                           .mem_kind = CKPTIO_MEM_CUDA};
    return r;
}

static void one_worker_read_done(one_worker_read *r) {
    ckptio_file_close(r->f);
    ckptio__gpu_sim_device_free(r->dev);
    T_OK(ckptio_engine_destroy(r->e));
    free(r->want);
}

static void test_copy_fails_when_queued(void) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = 50, .fail_enqueue_at = 3};
    ckptio__gpu_sim_configure(&cfg);
    const char *path = t_path("fail_q.bin");
    one_worker_read r = one_worker_read_setup(path, 2 * MIB, 3);
    T_STATUS(ckptio__gpu_execute(r.e, CKPTIO_READ, &r.ex, 1), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("simulated failure of copy #3");
    T_MESSAGE_HAS("extent 0");
    T_MESSAGE_HAS(path);
    T_MESSAGE_HAS("copy to GPU at offset 524288"); /* the third 256 KiB window */
    T_ASSERT(ckptio_last_error()->cuda_result == 1);
    check_engine_staging(r.e, 1 * MIB);
    check_sim_clean(1 * MIB);
    /* The same engine and staging work again afterwards. */
    sim_reset(50);
    T_OK(ckptio__gpu_execute(r.e, CKPTIO_READ, &r.ex, 1));
    T_ASSERT(memcmp(r.dev, r.want, 2 * MIB) == 0);
    one_worker_read_done(&r);
}

/* Pinned slots are allocated when a worker first fills them (the first load
 * of a process starts copying after one allocation per worker) and reused
 * by later transfers. */
static void test_slots_allocated_on_first_use(void) {
    ckptio__gpu_sim_config busy = {.events_busy = true}; /* every window wants a slot of its own */
    ckptio__gpu_sim_configure(&busy);
    const char *path = t_path("lazy.bin");
    unsigned char *want = make_file(path, 2 * MIB, 21);
    ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB); /* 4 workers x 4 slots of 256 KiB */
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(2 * MIB);
    ckptio_extent ex = {.file = f, .file_offset = 4096, .length = 100 * KIB, .memory = dev,
                        .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev, want + 4096, 100 * KIB) == 0);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.pinned_allocs == 1, "one window, %llu pinned allocations", (unsigned long long)s.pinned_allocs);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT_MSG(st.staging_reserved == 256 * KIB, "staging reserved %llu after one window",
                 (unsigned long long)st.staging_reserved);
    /* Eight windows over four workers: at most 16 slots, and a second
     * identical transfer allocates nothing more. */
    ex = (ckptio_extent){.file = f, .file_offset = 0, .length = 2 * MIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    ckptio__gpu_sim_get_stats(&s);
    const uint64_t after_first = s.pinned_allocs;
    T_ASSERT(after_first >= 2 && after_first <= 16);
    memset(dev, 0, 2 * MIB);
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev, want, 2 * MIB) == 0);
    check_engine_staging(e, 4 * MIB);
    check_sim_clean(4 * MIB);
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* A worker pins another slot only when its oldest one is still copying: on
 * a device that finishes each copy before the next window, one slot serves
 * a whole load; on one that never seems done, a worker pins all four and
 * then waits for the oldest. Bytes and slot reuse are checked either way. */
static void test_slots_pinned_on_demand(void) {
    const char *path = t_path("demand.bin");
    unsigned char *want = make_file(path, 2 * MIB, 23);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(2 * MIB);
    const bool settle[] = {true, false};
    const uint64_t expect[] = {1, CKPTIO_GPU_READ_SLOTS};
    for (int k = 0; k < 2; k++) {
        ckptio__gpu_sim_config cfg = {.copy_delay_us = 30, .events_settle = settle[k], .events_busy = !settle[k]};
        ckptio__gpu_sim_configure(&cfg);
        ckptio_engine *e = make_engine(1, 1 * MIB, 8 * MIB); /* 1 worker, 256 KiB slots: 8 windows */
        ckptio_file *f = NULL;
        T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
        memset(dev, 0, 2 * MIB);
        ckptio_extent ex = {.file = f, .file_offset = 0, .length = 2 * MIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
        T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
        T_ASSERT(memcmp(dev, want, 2 * MIB) == 0);
        ckptio__gpu_sim_stats s;
        ckptio__gpu_sim_get_stats(&s);
        T_ASSERT_MSG(s.pinned_allocs == expect[k], "%s device: %llu slots pinned for 8 windows, want %llu",
                     settle[k] ? "fast" : "slow", (unsigned long long)s.pinned_allocs, (unsigned long long)expect[k]);
        check_sim_clean(1 * MIB);
        ckptio_file_close(f);
        T_OK(ckptio_engine_destroy(e));
    }
    ckptio__gpu_sim_device_free(dev);
    free(want);
}

/* Slots (and so windows) are at most CKPTIO_GPU_SLOT_MAX, whatever the
 * chunk and staging settings would allow; a read pins at most its read
 * slots of that size, and the bytes arrive whole. */
static void test_slot_size_is_capped(void) {
    sim_reset(0);
    const size_t n = 9 * MIB + 333;
    const char *path = t_path("slot_cap.bin");
    unsigned char *want = make_file(path, n, 29);
    ckptio_engine *e = make_engine(1, 64 * MIB, 64 * MIB); /* 16 MiB slots if nothing capped them */
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(n);
    ckptio_extent ex = {.file = f, .length = n, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev, want, n) == 0);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT_MSG(st.staging_reserved > 0 && st.staging_reserved % CKPTIO_GPU_SLOT_MAX == 0 &&
                     st.staging_reserved <= CKPTIO_GPU_READ_SLOTS * (uint64_t)CKPTIO_GPU_SLOT_MAX,
                 "%llu bytes pinned, want 1 or %d slots of %u", (unsigned long long)st.staging_reserved,
                 CKPTIO_GPU_READ_SLOTS, CKPTIO_GPU_SLOT_MAX);
    ckptio_file_close(f);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_device_free(dev);
    free(want);
}

/* The engine's GPU state on the simulated device, with its lock held and
 * slots of `slot_bytes`, as a transfer sets it up. */
static ckptio__gpu_state *locked_state(ckptio_engine *e, size_t slot_bytes) {
    ckptio__gpu_state *st = NULL;
    T_OK(ckptio__gpu_state_get(e, ckptio__gpu_sim_ops(), &st));
    pthread_mutex_lock(&st->lock);
    ckptio__gpu_state_set_slot_bytes(st, slot_bytes);
    return st;
}

/* A worker that could reuse a slot never queues behind another's pinning. */
static void test_slot_pinning_never_waits_without_need(void) {
    sim_reset(0);
    ckptio_engine *e = make_engine(2, 2 * MIB, 8 * MIB);
    ckptio__gpu_state *st = locked_state(e, 256 * KIB);
    unsigned char *slot = (unsigned char *)1;
    pthread_mutex_lock(&st->pin_lock); /* another worker is pinning */
    T_OK(ckptio__gpu_slot(st, 0, 1, false, &slot));
    T_ASSERT_MSG(slot == NULL, "a slot was pinned while another worker held the pinning lock");
    pthread_mutex_unlock(&st->pin_lock);
    T_OK(ckptio__gpu_slot(st, 0, 1, false, &slot));
    T_ASSERT(slot != NULL);
    unsigned char *again = NULL;
    T_OK(ckptio__gpu_slot(st, 0, 1, true, &again));
    T_ASSERT(again == slot); /* reused, not pinned twice */
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.pinned_allocs == 1);
    pthread_mutex_unlock(&st->lock);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.pinned_now == 0, "%llu pinned bytes left after the engine", (unsigned long long)s.pinned_now);
}

/* ---- pinning ahead (ckptio_engine_gpu_prepare) ------------------------------- */

/* Waits up to 5 s for the simulated device to have made `allocs` pinned
 * allocations; returns how many it made. */
static uint64_t wait_pinned_allocs(uint64_t allocs) {
    ckptio__gpu_sim_stats s;
    for (int i = 0; i < 5000; i++) {
        ckptio__gpu_sim_get_stats(&s);
        if (s.pinned_allocs >= allocs) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ckptio__gpu_sim_get_stats(&s);
    return s.pinned_allocs;
}

/* The background thread pins every slot a load will use, and the load that
 * follows pins nothing more. */
static void test_prepare_pins_ahead(void) {
    sim_reset(0);
    const char *path = t_path("prep.bin");
    unsigned char *want = make_file(path, 4 * MIB, 41);
    ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB); /* 4 workers x 2 read slots of 256 KiB */
    const uint64_t slots = 4 * CKPTIO_GPU_READ_SLOTS;
    T_OK(ckptio_engine_gpu_prepare(e, 0));
    T_ASSERT_MSG(wait_pinned_allocs(slots) == slots, "prepare pinned %llu slots, not %llu",
                 (unsigned long long)wait_pinned_allocs(slots), (unsigned long long)slots);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT(st.staging_reserved == slots * 256 * KIB && st.staging_in_use == 0);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(4 * MIB);
    ckptio_extent ex = {.file = f, .length = 4 * MIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev, want, 4 * MIB) == 0);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.pinned_allocs == slots, "the load pinned %llu more slots",
                 (unsigned long long)(s.pinned_allocs - slots));
    check_sim_clean(4 * MIB);
    /* Every slot pinned: a further call (a server calling it before each
     * load) starts no thread and pins nothing. */
    T_OK(ckptio_engine_gpu_prepare(e, 0));
    ckptio__gpu_state *gs = ckptio__engine_gpu_state(e);
    pthread_mutex_lock(&gs->prepare_lock);
    const bool started = gs->prepare_started;
    pthread_mutex_unlock(&gs->prepare_lock);
    T_ASSERT_MSG(!started, "prepare started a thread with every slot already pinned");
    T_ASSERT(wait_pinned_allocs(slots + 1) == slots);
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* Prefill faults in the range's pages of exactly the slots asked for that
 * are not pinned yet, on several threads, so that prepare's pinning is the
 * driver's registrations alone. */
static void test_prefill_faults_in_unpinned_slots(void) {
    sim_reset(0);
    ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB);
    ckptio__gpu_state *st = locked_state(e, 256 * KIB);
    st->huge_slots = false;
    ckptio__gpu_slot_range_ready(st);
    T_ASSERT_MSG(st->range != NULL, "no range reserved for the slots");
    const size_t stride = (256 * KIB + CKPTIO_HUGE_PAGE_BYTES - 1) & ~(size_t)(CKPTIO_HUGE_PAGE_BYTES - 1);
#define SLOT_AT(w, s) (st->range + ((size_t)(w) * CKPTIO_GPU_NSLOTS + (s)) * stride)
    unsigned char *pinned = NULL;
    T_OK(ckptio__gpu_slot(st, 1, 0, true, &pinned)); /* pinned before: left as it is */
    T_ASSERT(pinned == SLOT_AT(1, 0));
    T_ASSERT(t_page_state(SLOT_AT(0, 0)) == 0 && t_page_state(SLOT_AT(2, 1) + 256 * KIB - 1) == 0);
    ckptio__gpu_slots_prefill(st, 3, 2);
    for (unsigned w = 0; w < 3; w++)
        for (unsigned s = 0; s < 2; s++)
            for (size_t off = 0; off < 256 * KIB; off += 4096)
                T_ASSERT_MSG(t_page_state(SLOT_AT(w, s) + off) == 1, "slot (%u, %u) page %zu not faulted in", w, s,
                             off / 4096);
    T_ASSERT_MSG(t_page_state(SLOT_AT(3, 0)) == 0, "worker 3's slot was filled, though not asked for");
    if (CKPTIO_GPU_NSLOTS > 2) T_ASSERT(t_page_state(SLOT_AT(0, 2)) == 0);
#undef SLOT_AT
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.pinned_allocs == 1, "prefill registered %llu slots", (unsigned long long)s.pinned_allocs - 1);
    pthread_mutex_unlock(&st->lock);
    T_OK(ckptio_engine_destroy(e));
}

/* Reads the `bytes` of the file at `path` to `dev` in one GPU transfer and
 * checks them against `want`. */
static void read_whole_file(ckptio_engine *e, const char *path, unsigned char *dev, const unsigned char *want,
                            size_t bytes) {
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    memset(dev, 0, bytes);
    ckptio_extent ex = {.file = f, .length = bytes, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev, want, bytes) == 0);
    ckptio_file_close(f);
}

/* prepare pins exactly the read slots of the workers a load runs, one per
 * engine thread (16 here); the load that follows runs those workers and
 * pins nothing more. */
static void test_prepare_pins_what_a_load_uses(void) {
    const char *path = t_path("read_workers.bin");
    unsigned char *want = make_file(path, 32 * MIB, 49);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(32 * MIB);
    const uint64_t workers = 16;
    sim_reset(0);
    ckptio_engine *e = make_engine(16, 64 * MIB, 8 * MIB); /* 16 threads x 4 slots of 1 MiB */
    const uint64_t slots = workers * CKPTIO_GPU_READ_SLOTS;
    T_OK(ckptio_engine_gpu_prepare(e, 0));
    T_ASSERT(wait_pinned_allocs(slots) == slots);
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.pinned_allocs == slots, "prepare pinned %llu slots, want %llu", (unsigned long long)s.pinned_allocs,
                 (unsigned long long)slots);
    /* A read whose copies never seem done (counters reset): each worker
     * that runs takes a stream and would pin a slot prepare did not. */
    ckptio__gpu_sim_config busy = {.copy_delay_us = 20, .events_busy = true};
    ckptio__gpu_sim_configure(&busy);
    read_whole_file(e, path, dev, want, 32 * MIB);
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.streams_live <= workers && s.pinned_allocs == 0,
                 "%llu workers ran the read (at most %llu) and pinned %llu more slots",
                 (unsigned long long)s.streams_live, (unsigned long long)workers, (unsigned long long)s.pinned_allocs);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_device_free(dev);
    free(want);
}

/* A /proc/buddyinfo for the huge-slot guard: one zone with `blocks` free
 * blocks of 2 MiB (order `order2m`), `blocks4m` of 4 MiB, and many small
 * blocks, which must not count. */
static void write_buddyinfo(const char *path, unsigned order2m, uint64_t blocks, uint64_t blocks4m) {
    char text[512];
    int n = snprintf(text, sizeof text, "Node 0, zone   Normal");
    for (unsigned o = 0; o <= order2m + 2; o++) {
        const uint64_t c = o < order2m ? 100000 : o == order2m ? blocks : o == order2m + 1 ? blocks4m : 0;
        n += snprintf(text + n, sizeof text - (size_t)n, " %6llu", (unsigned long long)c);
    }
    n += snprintf(text + n, sizeof text - (size_t)n, " \n");
    t_write_file(path, text, (size_t)n);
}

/* CKPTIO_OPT_GPU_HUGE_SLOTS: ON asks the device for huge-page slots, for a
 * load's own pinning and for prepare's; OFF never does; AUTO (the default)
 * does while THP is enabled and the free blocks of 2 MiB and more
 * (/proc/buddyinfo) cover twice what the call may pin (4 MiB here: 4
 * workers x 2 read slots x 256 KiB, for the load and for prepare alike).
 * Set through the engine, or through CKPTIO_GPU_HUGE_SLOTS at its creation.
 * The guard's files come from the test hook: never this host's. */
static void test_huge_slots_setting(void) {
    const char *path = t_path("huge.bin");
    unsigned char *want = make_file(path, 4 * MIB, 53);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(4 * MIB);
    const long page = sysconf(_SC_PAGESIZE);
    unsigned order2m = 0;
    while (((uint64_t)page << order2m) < 2 * MIB) order2m++;
    const char *buddy = t_path("buddyinfo"), *thp = t_path("thp_enabled");
    {
        ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB);
        unsigned workers = 0;
        uint64_t slot = 0;
        ckptio__gpu_load_geometry(e, &workers, &slot);
        T_ASSERT_MSG((uint64_t)workers * CKPTIO_GPU_READ_SLOTS * slot == 2 * MIB, "%u workers x %u slots x %llu",
                     workers, CKPTIO_GPU_READ_SLOTS, (unsigned long long)slot);
        T_OK(ckptio_engine_destroy(e));
    }
    static const struct {
        const char *env;    /* CKPTIO_GPU_HUGE_SLOTS at the engine's creation; NULL: unset */
        int64_t set;        /* -1, or the value set on the engine after that */
        const char *thp;    /* the THP `enabled` file; NULL: missing */
        uint64_t blocks;    /* free 2 MiB blocks */
        uint64_t blocks4m;  /* free 4 MiB blocks */
        bool huge;
    } cases[] = {
        {NULL, CKPTIO_HUGE_SLOTS_ON, "always madvise [never]\n", 0, 0, true}, /* forced: no guard */
        {"on", -1, "always madvise [never]\n", 0, 0, true},
        {"1", -1, "always madvise [never]\n", 0, 0, true},
        {NULL, CKPTIO_HUGE_SLOTS_OFF, "always [madvise] never\n", 1000, 1000, false},
        {"off", -1, "always [madvise] never\n", 1000, 1000, false},
        {"0", -1, "always [madvise] never\n", 1000, 1000, false},
        {"off", CKPTIO_HUGE_SLOTS_AUTO, "always [madvise] never\n", 1000, 1000, true},
        {"auto", -1, "always [madvise] never\n", 1000, 1000, true},
        {NULL, -1, "always [madvise] never\n", 1000, 1000, true},
        {NULL, -1, "[always] madvise never\n", 1000, 0, true},
        {NULL, -1, "always [madvise] never\n", 2, 0, true},  /* exactly 4 MiB */
        {NULL, -1, "always [madvise] never\n", 0, 1, true},  /* one 4 MiB block */
        {NULL, -1, "always [madvise] never\n", 1, 0, false}, /* 2 MiB: too few */
        {NULL, -1, "always [madvise] never\n", 0, 0, false},
        {NULL, -1, "always madvise [never]\n", 1000, 1000, false},
        {NULL, -1, NULL, 1000, 1000, false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        if (cases[k].env) setenv("CKPTIO_GPU_HUGE_SLOTS", cases[k].env, 1);
        else unsetenv("CKPTIO_GPU_HUGE_SLOTS");
        write_buddyinfo(buddy, order2m, cases[k].blocks, cases[k].blocks4m);
        unlink(thp);
        if (cases[k].thp) t_write_file(thp, cases[k].thp, strlen(cases[k].thp));
        ckptio__huge_pages_set_sources(buddy, thp);
        /* A load's own pinning, then prepare's on an engine of its own. */
        for (int by_prepare = 0; by_prepare < 2; by_prepare++) {
            sim_reset(0);
            ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB);
            if (cases[k].set >= 0) T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_HUGE_SLOTS, cases[k].set));
            if (by_prepare) {
                T_OK(ckptio_engine_gpu_prepare(e, 0));
                T_ASSERT(wait_pinned_allocs(4 * CKPTIO_GPU_READ_SLOTS) == 4 * CKPTIO_GPU_READ_SLOTS);
            } else {
                read_whole_file(e, path, dev, want, 4 * MIB);
            }
            ckptio__gpu_sim_stats s;
            ckptio__gpu_sim_get_stats(&s);
            const uint64_t want_huge = cases[k].huge ? s.pinned_allocs : 0;
            T_ASSERT_MSG(s.pinned_allocs > 0 && s.pinned_huge_allocs == want_huge,
                         "%s, CKPTIO_GPU_HUGE_SLOTS=%s, set %lld, THP %s, %llu free 2 MiB and %llu 4 MiB blocks: "
                         "%llu of %llu slots huge",
                         by_prepare ? "prepare" : "load", cases[k].env ? cases[k].env : "(unset)",
                         (long long)cases[k].set,
                         cases[k].thp ? cases[k].thp : "(missing)\n", (unsigned long long)cases[k].blocks,
                         (unsigned long long)cases[k].blocks4m, (unsigned long long)s.pinned_huge_allocs,
                         (unsigned long long)s.pinned_allocs);
            T_OK(ckptio_engine_destroy(e));
        }
    }
    ckptio__huge_pages_set_sources(NULL, NULL);
    unsetenv("CKPTIO_GPU_HUGE_SLOTS");
    ckptio__gpu_sim_device_free(dev);
    free(want);
}


typedef struct background_read {
    ckptio_engine *e;
    const char *path;
    unsigned char *dev;
    const unsigned char *want;
    size_t bytes;
} background_read;

static void *background_read_main(void *arg) {
    const background_read *b = arg;
    read_whole_file(b->e, b->path, b->dev, b->want, b->bytes);
    return NULL;
}

/* A worker whose first slot must wait for the pinning lock reads its first
 * window into the slot's pages first (a process's first load pins its
 * workers' slots one after another): while another worker holds the lock,
 * every worker has a window's bytes staged and nothing pinned, and they
 * reach the device once it is released. With a driver that cannot register
 * (the slots then come from pinned_alloc), the bytes read move with them. */
static void test_first_windows_are_read_while_another_worker_pins(void) {
    const char *path = t_path("first_windows.bin");
    unsigned char *want = make_file(path, 4 * MIB, 61);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(4 * MIB);
    for (int refuse = 0; refuse < 2; refuse++) {
        ckptio__gpu_sim_config cfg = {.no_register = refuse, .copy_delay_us = 200};
        ckptio__gpu_sim_configure(&cfg);
        ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB); /* 4 workers, 256 KiB slots */
        ckptio__gpu_state *st = NULL;
        T_OK(ckptio__gpu_state_get(e, ckptio__gpu_sim_ops(), &st));
        pthread_mutex_lock(&st->pin_lock); /* another worker is pinning */
        background_read b = {.e = e, .path = path, .dev = dev, .want = want, .bytes = 4 * MIB};
        pthread_t tid;
        T_ASSERT(pthread_create(&tid, NULL, background_read_main, &b) == 0);
        ckptio_stats stats = {0};
        for (int i = 0; i < 5000 && stats.staging_in_use < 4 * 256 * KIB; i++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            T_OK(ckptio_engine_stats(e, &stats));
        }
        ckptio__gpu_sim_stats s;
        ckptio__gpu_sim_get_stats(&s);
        T_ASSERT_MSG(stats.staging_in_use == 4 * 256 * KIB && stats.staging_reserved == 0 && s.pinned_allocs == 0 &&
                         s.copies == 0,
                     "while the pinning lock was held: %llu bytes staged, %llu pinned, %llu pinned allocations, "
                     "%llu copies (want 4 windows read, nothing pinned or copied)",
                     (unsigned long long)stats.staging_in_use, (unsigned long long)stats.staging_reserved,
                     (unsigned long long)s.pinned_allocs, (unsigned long long)s.copies);
        pthread_mutex_unlock(&st->pin_lock);
        T_ASSERT(pthread_join(tid, NULL) == 0); /* read_whole_file compared the device's bytes */
        check_sim_clean(4 * MIB);
        check_engine_staging(e, 4 * MIB);
        ckptio__gpu_sim_get_stats(&s);
        T_ASSERT_MSG(atomic_load(&st->range_refused) == (refuse == 1) && s.pinned_allocs >= 4,
                     "refused %d: range refused %d, %llu pinned allocations", refuse,
                     (int)atomic_load(&st->range_refused), (unsigned long long)s.pinned_allocs);
        T_OK(ckptio_engine_destroy(e));
    }
    ckptio__gpu_sim_device_free(dev);
    free(want);
}

/* The slots live in one range reserved per engine, each at its worker's
 * and index's place; a worker fills its slot without the pinning lock (the
 * kernel's part runs beside the other workers'), keeps the pages when the
 * lock is busy, and the range goes with the engine. A driver that cannot
 * register memory gets slots allocated one by one, as before. */
static void test_slots_live_in_one_range(void) {
    sim_reset(0);
    const char *path = t_path("range.bin");
    unsigned char *want = make_file(path, 4 * MIB, 59);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(4 * MIB);
    ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB); /* 4 workers, 256 KiB slots */
    read_whole_file(e, path, dev, want, 4 * MIB);
    ckptio__gpu_state *st = NULL;
    T_OK(ckptio__gpu_state_get(e, ckptio__gpu_sim_ops(), &st));
    pthread_mutex_lock(&st->lock);
    const size_t stride = 2 * MIB; /* 256 KiB slots, each at a 2 MiB boundary of its own */
    T_ASSERT_MSG(st->range != NULL && st->range_bytes == (size_t)CKPTIO_GPU_MAX_WORKERS * CKPTIO_GPU_NSLOTS * stride &&
                     (uintptr_t)st->range % (2 * MIB) == 0,
                 "range %p of %zu bytes", (void *)st->range, st->range_bytes);
    unsigned pinned = 0;
    for (unsigned w = 0; w < CKPTIO_GPU_MAX_WORKERS; w++)
        for (unsigned k = 0; k < CKPTIO_GPU_NSLOTS; k++) {
            unsigned char *m = st->workers[w].mem[k];
            if (!m) continue;
            pinned++;
            T_ASSERT_MSG(m == st->range + ((size_t)w * CKPTIO_GPU_NSLOTS + k) * stride,
                         "worker %u slot %u at %p, not at its place in the range", w, k, (void *)m);
        }
    T_ASSERT(pinned > 0);
    unsigned char *spare = st->range + (size_t)(0 * CKPTIO_GPU_NSLOTS + 3) * stride;
    T_ASSERT(st->workers[0].mem[3] == NULL && t_page_state(spare) == 0);
    pthread_mutex_lock(&st->pin_lock); /* another worker is pinning */
    unsigned char *slot = (unsigned char *)1;
    T_OK(ckptio__gpu_slot(st, 0, 3, false, &slot));
    T_ASSERT(slot == NULL);
    T_ASSERT_MSG(t_page_state(spare) == 1, "the slot was not filled while another worker held the pinning lock");
    pthread_mutex_unlock(&st->pin_lock);
    T_OK(ckptio__gpu_slot(st, 0, 3, false, &slot));
    T_ASSERT(slot == spare);
    unsigned char *range = st->range;
    pthread_mutex_unlock(&st->lock);
    T_OK(ckptio_engine_destroy(e));
    T_ASSERT_MSG(t_page_state(range) == -1, "the slots' range is still mapped after the engine");
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.pinned_now == 0);
    /* No registration: slots one by one (pinned_alloc), the load the same. */
    ckptio__gpu_sim_config cfg = {.no_register = true};
    ckptio__gpu_sim_configure(&cfg);
    e = make_engine(4, 4 * MIB, 8 * MIB);
    memset(dev, 0, 4 * MIB);
    read_whole_file(e, path, dev, want, 4 * MIB);
    T_OK(ckptio__gpu_state_get(e, ckptio__gpu_sim_ops(), &st));
    T_ASSERT(atomic_load(&st->range_refused));
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.pinned_allocs > 0 && s.pinned_now == s.pinned_allocs * 256 * KIB);
    for (unsigned w = 0; w < 4; w++)
        for (unsigned k = 0; k < CKPTIO_GPU_NSLOTS; k++) {
            const unsigned char *m = st->workers[w].mem[k];
            T_ASSERT(!m || !st->range || m < st->range || m >= st->range + st->range_bytes);
        }
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.pinned_now == 0);
    ckptio__gpu_sim_device_free(dev);
    free(want);
}

/* This process's address space in bytes (VmSize), 0 if unknown. */
__attribute__((unused)) static uint64_t address_space_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kib << 10;
}

/* In a process of its own: address space too tight for the slots' range
 * (as under strict overcommit): the range is not reserved, the caller sees no
 * error from trying, and slots are allocated one by one, the load the same. */
static int no_range_child(void) {
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NO_RANGE_SKIP 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(NO_RANGE_SKIP)
    return T_EXIT_SKIP; /* ASan's allocator maps memory as it goes, under the limit this sets */
#else
    mallopt(M_ARENA_MAX, 1); /* no 64 MiB heap reserved per thread: the limit below is about the range */
    const char *path = t_path("no_range.bin");
    unsigned char *want = make_file(path, 4 * MIB, 61);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(4 * MIB);
    ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB);
    /* Room for the slots one by one and the threads' stacks (8 MiB each
     * reserved: 4 workers, 4 simulated streams), not for the range (64
     * workers x 4 slots x 2 MiB). */
    const uint64_t limit = address_space_bytes() + 192 * MIB;
    struct rlimit rl = {.rlim_cur = limit, .rlim_max = limit};
    T_ASSERT(limit > 192 * MIB && setrlimit(RLIMIT_AS, &rl) == 0);
    read_whole_file(e, path, dev, want, 4 * MIB);
    ckptio__gpu_state *st = NULL;
    T_OK(ckptio__gpu_state_get(e, ckptio__gpu_sim_ops(), &st));
    T_ASSERT_MSG(st->range == NULL, "a range of %zu bytes was reserved under a %llu-byte address space limit",
                 st->range_bytes, (unsigned long long)limit);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.pinned_allocs > 0);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_device_free(dev);
    free(want);
    return T_EXIT_PASS;
#endif
}

static const char *self_path;

static void test_slots_without_a_range(void) {
    const int code = t_run_self(self_path, "no-range");
    T_ASSERT_MSG(code == T_EXIT_PASS || code == T_EXIT_SKIP,
                 "the process without room for a range ended with exit code %d (-1: not normally)", code);
}

/* A transfer started while prepare is pinning waits for at most the slot
 * being pinned, not for all of them: the thread yields to a waiting
 * transfer. (It re-takes the engine's GPU lock right after releasing it, so
 * without the yield the transfer waited for most of the pinning: 9 of the
 * 16 slots when this test was written.) */
static void test_prepare_yields_to_a_transfer(void) {
    ckptio__gpu_sim_config cfg = {.pinned_delay_us = 20000}; /* 20 ms per slot: 16 slots take 0.32 s */
    ckptio__gpu_sim_configure(&cfg);
    const char *path = t_path("prep_yield.bin");
    unsigned char *want = make_file(path, 64 * KIB, 47);
    ckptio_engine *e = make_engine(8, 8 * MIB, 8 * MIB); /* 8 workers x 2 read slots */
    T_OK(ckptio_engine_gpu_prepare(e, 0));
    T_ASSERT(wait_pinned_allocs(1) >= 1); /* the thread is pinning */
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(64 * KIB);
    ckptio_extent ex = {.file = f, .length = 64 * KIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(memcmp(dev, want, 64 * KIB) == 0);
    T_ASSERT_MSG(s.pinned_allocs < 8, "the transfer waited for %llu of prepare's 16 slots",
                 (unsigned long long)s.pinned_allocs);
    ckptio_file_close(f);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.pinned_now == 0 && s.ctx_depth == 0);
    ckptio__gpu_sim_device_free(dev);
    free(want);
}

/* A transfer right after prepare (the thread stops or finishes: never a slot
 * pinned twice), prepare called again and the engine destroyed at once
 * (the thread is joined, everything freed). */
static void test_prepare_races_transfers_and_destroy(void) {
    for (int round = 0; round < 20; round++) {
        sim_reset(round % 2 ? 20 : 0);
        const char *path = t_path("prep_race.bin");
        unsigned char *want = make_file(path, 2 * MIB + 333, 43 + (uint64_t)round);
        ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB);
        T_OK(ckptio_engine_gpu_prepare(e, 0));
        ckptio_file *f = NULL;
        T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
        unsigned char *dev = ckptio__gpu_sim_device_alloc(2 * MIB + 333);
        ckptio_extent ex = {.file = f, .length = 2 * MIB + 333, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
        T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
        T_ASSERT(memcmp(dev, want, 2 * MIB + 333) == 0);
        T_OK(ckptio_engine_gpu_prepare(e, 0));
        T_OK(ckptio_engine_gpu_prepare(e, 0));
        ckptio_file_close(f);
        T_OK(ckptio_engine_destroy(e));
        ckptio__gpu_sim_stats s;
        ckptio__gpu_sim_get_stats(&s);
        T_ASSERT_MSG(s.pinned_allocs <= 16, "round %d: %llu pinned allocations for 16 slots", round,
                     (unsigned long long)s.pinned_allocs);
        T_ASSERT_MSG(s.pinned_now == 0 && s.ctx_depth == 0 && s.violations == 0,
                     "round %d: %llu pinned bytes left, context depth %lld, %llu violations", round,
                     (unsigned long long)s.pinned_now, (long long)s.ctx_depth, (unsigned long long)s.violations);
        ckptio__gpu_sim_device_free(dev);
        free(want);
    }
}

/* Bad arguments and devices fail at once; slots of another size are kept;
 * a pinning failure ends the pinning quietly and the load still works. */
static void test_prepare_refusals_and_failures(void) {
    sim_reset(0);
    T_STATUS(ckptio_engine_gpu_prepare(NULL, 0), CKPTIO_E_INVAL);
    ckptio_engine *e = make_engine(4, 4 * MIB, 8 * MIB);
    T_STATUS(ckptio_engine_gpu_prepare(e, -1), CKPTIO_E_INVAL);
    T_STATUS(ckptio_engine_gpu_prepare(e, 1), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("simulated device 1 does not exist");
    const char *path = t_path("prep_fail.bin");
    unsigned char *want = make_file(path, 1 * MIB, 47);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(1 * MIB);
    ckptio_extent ex = {.file = f, .length = 1 * MIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1)); /* 256 KiB slots now exist */
    ckptio__gpu_sim_stats a, b;
    ckptio__gpu_sim_get_stats(&a);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 8 * MIB)); /* loads would take 512 KiB slots */
    T_OK(ckptio_engine_gpu_prepare(e, 0));
    T_OK(ckptio_engine_gpu_prepare(e, 0)); /* joins the first: it pinned nothing */
    ckptio__gpu_sim_get_stats(&b);
    T_ASSERT_MSG(b.pinned_allocs == a.pinned_allocs && b.pinned_frees == a.pinned_frees,
                 "prepare touched slots of another size (%llu -> %llu allocations, %llu -> %llu frees)",
                 (unsigned long long)a.pinned_allocs, (unsigned long long)b.pinned_allocs,
                 (unsigned long long)a.pinned_frees, (unsigned long long)b.pinned_frees);
    ckptio_file_close(f);
    T_OK(ckptio_engine_destroy(e));
    /* A fresh engine whose second pinning fails: the thread stops there and
     * the load pins the rest. */
    ckptio__gpu_sim_config cfg = {.fail_pinned_at = 2};
    ckptio__gpu_sim_configure(&cfg);
    e = make_engine(4, 4 * MIB, 8 * MIB);
    T_OK(ckptio_engine_gpu_prepare(e, 0));
    T_ASSERT(wait_pinned_allocs(2) == 2);
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    memset(dev, 0, 1 * MIB);
    ex = (ckptio_extent){.file = f, .length = 1 * MIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev, want, 1 * MIB) == 0);
    check_sim_clean(4 * MIB);
    ckptio_file_close(f);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_device_free(dev);
    free(want);
}

/* A slot that cannot be pinned midway fails the transfer with an error that
 * names it; nothing is left in use and the engine works afterwards. */
static void test_slot_allocation_fails(void) {
    /* events_busy: each window pins a slot while the worker has fewer than
     * its CKPTIO_GPU_READ_SLOTS (2): the second pinning fails. */
    ckptio__gpu_sim_config cfg = {.copy_delay_us = 50, .fail_pinned_at = 2, .events_busy = true};
    ckptio__gpu_sim_configure(&cfg);
    const char *path = t_path("fail_pin.bin");
    one_worker_read r = one_worker_read_setup(path, 2 * MIB, 5);
    T_STATUS(ckptio__gpu_execute(r.e, CKPTIO_READ, &r.ex, 1), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("simulated pinned allocation of 262144 bytes failed");
    T_MESSAGE_HAS(path);
    T_MESSAGE_HAS("allocate pinned staging at offset 262144"); /* the second window's slot */
    check_engine_staging(r.e, 1 * MIB);
    check_sim_clean(1 * MIB);
    /* Writes allocate on first use too, and fail the same way. */
    ckptio_engine *e2 = make_engine(1, 1 * MIB, 8 * MIB);
    cfg.fail_pinned_at = 2;
    ckptio__gpu_sim_configure(&cfg);
    ckptio_file *g2 = NULL;
    T_OK(ckptio_file_open(e2, t_path("fail_pin_w2.bin"), CKPTIO_OPEN_WRITE, &g2));
    ckptio_extent wx = {.file = g2, .file_offset = 0, .length = 2 * MIB, .memory = r.dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e2, CKPTIO_WRITE, &wx, 1), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("allocate pinned staging at offset 262144");
    check_engine_staging(e2, 1 * MIB);
    ckptio_file_close(g2);
    T_OK(ckptio_engine_destroy(e2));
    /* The first engine's slots work again, and the missing one is made. */
    sim_reset(50);
    T_OK(ckptio__gpu_execute(r.e, CKPTIO_READ, &r.ex, 1));
    T_ASSERT(memcmp(r.dev, r.want, 2 * MIB) == 0);
    check_sim_clean(1 * MIB);
    one_worker_read_done(&r);
}

static void test_copy_fails_asynchronously(void) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = 50, .fail_run_at = 2};
    ckptio__gpu_sim_configure(&cfg);
    const char *path = t_path("fail_run.bin");
    const size_t size = 3 * MIB;
    ckptio_engine *e = make_engine(1, 1 * MIB, 8 * MIB);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(size);
    t_fill_random(dev, size, 9);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    ckptio_extent ex = {.file = f, .file_offset = 0, .length = size, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_WRITE, &ex, 1), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("simulated asynchronous failure of copy #2");
    T_MESSAGE_HAS("copy from GPU");
    T_MESSAGE_HAS(path);
    T_ASSERT(ckptio_last_error()->cuda_result == 700);
    check_engine_staging(e, 1 * MIB);
    check_sim_clean(1 * MIB);
    T_OK(ckptio_file_close(f)); /* uncommitted atomic file: nothing left behind */
    T_ASSERT(!t_file_exists(path));
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
}

static void test_read_fails_midway(void) {
    sim_reset(20);
    ckptio_engine *e = make_engine(2, 2 * MIB, 8 * MIB);
    const char *path = t_path("fail_read.bin");
    ckptio_file *f = NULL;
    unsigned char *want = open_made_file(e, path, 3 * MIB, 21, &f);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(3 * MIB);
    ckptio_extent ex = {.file = f, .file_offset = 0, .length = 3 * MIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    ckptio__io_inject(CKPTIO__IO_READ, 4, EIO, 0, false);
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1), CKPTIO_E_IO);
    ckptio__io_inject_reset();
    T_MESSAGE_HAS(path);
    T_MESSAGE_HAS("at offset ");
    T_MESSAGE_HAS("Input/output error");
    /* The 4th read call fails: usually a later window, but with 2 workers the first window's read can be the
     * 4th call made (a fresh clone's CI saw offset 0), so any window start is right. */
    const int64_t off = ckptio_last_error()->file_offset;
    T_ASSERT_MSG(off >= 0 && off < (int64_t)(3 * MIB) && off % (256 * KIB) == 0,
                 "failure offset %lld is not a window start", (long long)off);
    check_engine_staging(e, 2 * MIB);
    check_sim_clean(2 * MIB);
    /* past end of file */
    ckptio_extent past = {.file = f, .file_offset = 3 * MIB - 10, .length = 20, .memory = dev,
                          .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &past, 1), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS(path);
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

static void test_bad_device_memory(void) {
    sim_reset(0);
    ckptio_engine *e = make_engine(1, 1 * MIB, 8 * MIB);
    const char *path = t_path("bad_mem.bin");
    ckptio_file *f = NULL;
    unsigned char *want = open_made_file(e, path, 64 * KIB, 2, &f);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(4096);
    ckptio_extent ex = {.file = f, .file_offset = 0, .length = 8192, .memory = dev + 100, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("runs past the end of its allocation (4096 bytes");
    T_MESSAGE_HAS("extent 0");
    /* The driver is asked once per allocation: an extent after one that
     * was checked in the same allocation is still checked for its end. */
    ckptio_extent two[2] = {{.file = f, .file_offset = 0, .length = 100, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA},
                            {.file = f, .file_offset = 200, .length = 4000, .memory = dev + 200,
                             .mem_kind = CKPTIO_MEM_CUDA}};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, two, 2), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("extent 1");
    /* ... and host memory after device memory is still found out. */
    unsigned char host[16];
    two[1] = (ckptio_extent){.file = f, .file_offset = 200, .length = 16, .memory = host, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, two, 2), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("extent 1: memory");
    ex = (ckptio_extent){.file = f, .file_offset = 0, .length = 16, .memory = host, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("was given as CUDA memory but the driver reports host");
    /* The pipeline's own range check, reached without execute's classification: the driver's refusal comes back
     * with the file, offset and extent put in front and its CUDA result kept (ckptio__fail_again). */
    ex = (ckptio_extent){.file = f, .file_offset = 64, .length = 16, .memory = host, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_pipeline_run(e, ckptio__gpu_sim_ops(), 0, CKPTIO_READ, &ex, 1, false), CKPTIO_E_CUDA);
    T_MESSAGE_HAS(path);
    T_MESSAGE_HAS("check device buffer at offset 64: extent 0: cuMemGetAddressRange(");
    T_MESSAGE_HAS("not a valid device address");
    T_ASSERT(ckptio_last_error()->cuda_result == 1);
    T_ASSERT(ckptio_last_error()->file_offset == 64);
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* Memory reserved once and mapped piece by piece (torch's expandable_segments): the driver reports each piece
 * as an allocation of its own, and a tensor may span several. */
static void test_device_memory_in_pieces(void) {
    sim_reset(0);
    ckptio_engine *e = make_engine(2, 1 * MIB, 8 * MIB);
    const char *path = t_path("pieces.bin");
    ckptio_file *f = NULL;
    unsigned char *want = open_made_file(e, path, 64 * KIB, 3, &f);
    unsigned char *dev = ckptio__gpu_sim_device_alloc_pieces(64 * KIB, 20 * KIB, true); /* 20 + 20 + 20 + 4 KiB */
    T_ASSERT(dev != NULL);
    ckptio_extent ex = {.file = f, .file_offset = 1000, .length = 60000, .memory = dev + 100,
                        .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev + 100, want + 1000, 60000) == 0);
    /* past the last piece: the range error gives the whole mapped span */
    ex.length = 64 * KIB - 99;
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("runs past the end of its allocation (65536 bytes");
    ckptio__gpu_sim_device_free(dev);
    /* cudaMalloc allocations that happen to be neighbours are not one buffer: running out of one is refused */
    dev = ckptio__gpu_sim_device_alloc_pieces(64 * KIB, 20 * KIB, false);
    T_ASSERT(dev != NULL);
    ex = (ckptio_extent){.file = f, .file_offset = 0, .length = 20 * KIB + 1, .memory = dev,
                         .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("runs past the end of its allocation (20480 bytes");
    ex.length = 20 * KIB;
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1));
    T_ASSERT(memcmp(dev, want, 20 * KIB) == 0);
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    check_sim_clean(8 * MIB);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

static void test_classify_and_meminfo(void) {
    unsigned char *dev = ckptio__gpu_sim_device_alloc(100);
    unsigned char host[8];
    ckptio_mem_kind k;
    int d;
    T_OK(ckptio_mem_classify(dev + 50, &k, &d));
    T_ASSERT(k == CKPTIO_MEM_CUDA && d == 0);
    T_OK(ckptio_mem_classify(host, &k, &d));
    T_ASSERT(k == CKPTIO_MEM_HOST && d == -1);
    T_ASSERT(ckptio__gpu_classify(dev) == CKPTIO_MEM_CUDA);
    ckptio__gpu_sim_config cfg = {.device_free = 1000};
    ckptio__gpu_sim_configure(&cfg);
    T_OK(ckptio_gpu_check_free(0, 1000, "model.safetensors"));
    T_STATUS(ckptio_gpu_check_free(0, 5000, "model.safetensors"), CKPTIO_E_DEVICE_OOM);
    T_MESSAGE_HAS("model.safetensors");
    T_MESSAGE_HAS("needs 5000 bytes");
    T_MESSAGE_HAS("only 1000 bytes");
    ckptio__gpu_sim_device_free(dev);
    sim_reset(0);
}

/* ---- GDS file API ----------------------------------------------------------- */

typedef struct end_log {
    int calls, at_end;
    uint64_t last_done;
} end_log;

/* Records each report and asks to stop at done == total. */
static int stop_at_end(uint64_t done, uint64_t total, void *user) {
    end_log *l = user;
    l->calls++;
    l->last_done = done;
    l->at_end += done == total;
    return done == total;
}

static void test_gds_file_sync(void) {
    sim_reset(30);
    ckptio_engine *e = make_engine_path(2, 2 * MIB, 8 * MIB, CKPTIO_GPU_PATH_AUTO);
    const char *path = t_path("gds.bin");
    ckptio_gds_file *g = NULL;
    T_STATUS(ckptio_gds_open(e, path, O_RDWR, 0, &g), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS(path);
    T_OK(ckptio_gds_open(e, path, O_RDWR | O_CREAT, 0640, &g));
    T_ASSERT(strstr(ckptio_gds_file_refusal(g), "simulated"));
    const size_t n = 1 * MIB + 4099;
    unsigned char *src = ckptio__gpu_sim_device_alloc(n + 100);
    unsigned char *dst = ckptio__gpu_sim_device_alloc(n + 100);
    t_fill_random(src, n + 100, 42);
    memset(dst, 0xEE, n + 100);
    uint64_t done = 0;
    /* Progress: the pipeline's reports, then one final report after the
     * last byte (done == total), whose answer cancels nothing. */
    end_log l = {0};
    T_OK(ckptio_engine_set_progress(e, stop_at_end, &l));
    T_OK(ckptio_gds_write(g, src, n, 3, 17, &done));
    T_ASSERT(done == n);
    T_ASSERT_MSG(l.at_end == 1 && l.last_done == n, "%d reports said done == total, the last %llu of %zu", l.at_end,
                 (unsigned long long)l.last_done, n);
    T_OK(ckptio_engine_set_progress(e, NULL, NULL));
    ckptio_io_path p;
    T_OK(ckptio_gds_file_path(g, &p));
    T_ASSERT(p == CKPTIO_IO_PATH_PIPELINE);
    T_OK(ckptio_gds_sync(g));
    T_OK(ckptio_gds_read(g, dst, n, 3, 5, &done));
    T_ASSERT(done == n);
    T_OK(ckptio_gds_file_path(g, &p));
    T_ASSERT(p == CKPTIO_IO_PATH_PIPELINE);
    T_ASSERT(memcmp(dst + 5, src + 17, n) == 0);
    T_ASSERT(dst[4] == 0xEE && dst[5 + n] == 0xEE);
    /* short read at end of file, like cuFileRead; and nothing past it */
    T_OK(ckptio_gds_read(g, dst, 1000, n + 3 - 10, 0, &done));
    T_ASSERT(done == 10);
    T_ASSERT(memcmp(dst, src + 17 + n - 10, 10) == 0);
    T_OK(ckptio_gds_read(g, dst, 1000, n + 100, 0, &done));
    T_ASSERT(done == 0);
    /* host buffers take the host path */
    unsigned char host[300];
    T_OK(ckptio_gds_read(g, host, 300, 3, 0, &done));
    T_ASSERT(done == 300 && memcmp(host, src + 17, 300) == 0);
    T_OK(ckptio_gds_file_path(g, &p));
    T_ASSERT(p == CKPTIO_IO_PATH_HOST);
    T_OK(ckptio_gds_buf_register(g, src, n)); /* no-op without cuFile */
    T_OK(ckptio_gds_buf_deregister(g, src));
    T_OK(ckptio_gds_close(g));
    size_t flen = 0;
    unsigned char *file = t_read_file(path, &flen);
    T_ASSERT(flen == n + 3 && memcmp(file + 3, src + 17, n) == 0);
    free(file);
    /* read-only handle refuses writes */
    T_OK(ckptio_gds_open(e, path, O_RDONLY, 0, &g));
    T_STATUS(ckptio_gds_write(g, src, 10, 0, 0, &done), CKPTIO_E_PERMISSION);
    T_OK(ckptio_gds_close(g));
    /* forcing cuFile on the simulated device is a clear error */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_CUFILE));
    T_STATUS(ckptio_gds_open(e, path, O_RDONLY, 0, &g), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("cuFile cannot run on the simulated device");
    check_sim_clean(2 * MIB);
    ckptio__gpu_sim_device_free(src);
    ckptio__gpu_sim_device_free(dst);
    T_OK(ckptio_engine_destroy(e));
}

typedef struct kernel_arg {
    unsigned char *dev;
    size_t n;
    unsigned char *out;
    unsigned sleep_ms;
    unsigned char fill;
} kernel_arg;

/* "Kernel": optionally sleeps, then adds 1 to every byte and copies out. */
static void add_one_kernel(void *p) {
    kernel_arg *a = p;
    for (size_t i = 0; i < a->n; i++) a->out[i] = (unsigned char)(a->dev[i] + 1);
}

/* "Kernel": slow producer that fills the buffer a write must save. */
static void slow_fill_kernel(void *p) {
    kernel_arg *a = p;
    struct timespec ts = {0, (long)a->sleep_ms * 1000000L};
    nanosleep(&ts, NULL);
    memset(a->dev, a->fill, a->n);
}

/* A simulated stream, the GDS file at path opened read-write with engine e
 * and n bytes of device memory, returned. */
static unsigned char *open_stream_case(ckptio_engine *e, const char *path, size_t n, void **stream,
                                       ckptio_gds_file **g) {
    T_OK(ckptio__gpu_sim_ops()->stream_create(stream));
    T_OK(ckptio_gds_open(e, path, O_RDWR, 0, g));
    return ckptio__gpu_sim_device_alloc(n);
}

/* A slow kernel fills dev with `fill` on `stream`, then a stream-ordered
 * write saves it at offset 0: waited for and destroyed. */
static void write_after_kernel(ckptio_gds_file *g, unsigned char *dev, size_t n, void *stream, unsigned char fill) {
    kernel_arg k = {.dev = dev, .n = n, .sleep_ms = 50, .fill = fill};
    T_OK(ckptio__gpu_sim_launch(stream, slow_fill_kernel, &k));
    ckptio_gds_request *r = NULL;
    T_OK(ckptio_gds_write_async(g, dev, n, 0, 0, stream, &r));
    uint64_t bytes = 0;
    T_OK(ckptio_gds_request_wait(r, &bytes));
    T_ASSERT(bytes == n);
    T_OK(ckptio_gds_request_destroy(r));
}

/* Every byte of the file at path (n of them) is `fill`. */
static void check_file_filled(const char *path, size_t n, unsigned char fill) {
    size_t flen = 0;
    unsigned char *file = t_read_file(path, &flen);
    T_ASSERT(flen == n);
    for (size_t i = 0; i < n; i++)
        T_ASSERT_MSG(file[i] == fill, "file byte %zu is 0x%02x: the write ran before the producing kernel", i,
                     file[i]);
    free(file);
}

static void test_gds_stream_ordered(void) {
    sim_reset(100);
    ckptio_engine *e = make_engine(2, 2 * MIB, 8 * MIB);
    const char *path = t_path("gds_async.bin");
    const size_t n = 2 * MIB + 5;
    unsigned char *want = make_file(path, n, 99);
    const ckptio__gpu_ops *ops = ckptio__gpu_sim_ops();
    void *stream = NULL;
    ckptio_gds_file *g = NULL;
    unsigned char *dev = open_stream_case(e, path, n, &stream, &g);
    unsigned char *out = malloc(n);
    memset(dev, 0, n);
    /* read, then a kernel on the same stream that must see the data */
    ckptio_gds_request *r1 = NULL;
    T_OK(ckptio_gds_read_async(g, dev, n, 0, 0, stream, &r1));
    kernel_arg k1 = {.dev = dev, .n = n, .out = out};
    T_OK(ckptio__gpu_sim_launch(stream, add_one_kernel, &k1));
    uint64_t bytes = 0;
    T_OK(ckptio_gds_request_wait(r1, &bytes));
    T_ASSERT(bytes == n);
    T_OK(ops->stream_sync(stream));
    for (size_t i = 0; i < n; i++)
        T_ASSERT_MSG(out[i] == (unsigned char)(want[i] + 1), "kernel saw byte %zu = 0x%02x before the read finished",
                     i, (unsigned char)(out[i] - 1));
    T_OK(ckptio_gds_request_destroy(r1));
    /* a slow kernel produces data, then a write on the same stream saves it */
    write_after_kernel(g, dev, n, stream, 0x5A);
    T_OK(ckptio_gds_close(g));
    check_file_filled(path, n, 0x5A);
    /* a failing async read reports its error at wait, and the stream moves on */
    T_OK(ckptio_gds_open(e, path, O_RDONLY, 0, &g));
    ckptio__io_inject(CKPTIO__IO_READ, 1, EIO, 0, false);
    ckptio_gds_request *r3 = NULL;
    T_OK(ckptio_gds_read_async(g, dev, n, 0, 0, stream, &r3));
    T_STATUS(ckptio_gds_request_wait(r3, &bytes), CKPTIO_E_IO);
    T_MESSAGE_HAS(path);
    T_STATUS(ckptio_gds_request_wait(r3, &bytes), CKPTIO_E_IO); /* same answer twice */
    ckptio__io_inject_reset();
    T_OK(ops->stream_sync(stream));
    T_OK(ckptio_gds_request_destroy(r3));
    T_OK(ckptio_gds_close(g));
    ops->stream_destroy(stream);
    check_sim_clean(2 * MIB + 64); /* staging plus the requests' 4-byte gate words */
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.events_live == 0 && s.streams_live == 0 && s.pinned_now == 0,
                 "leaked after engine destroy: %llu events, %llu streams, %llu pinned bytes",
                 (unsigned long long)s.events_live, (unsigned long long)s.streams_live,
                 (unsigned long long)s.pinned_now);
    free(out);
    free(want);
}

/* A stream-ordered request whose run would resize the engine's pinned slots
 * keeps them (its windows cut to fit): freeing pinned memory synchronises a
 * real device, which would wait for the caller's stream, which waits on the
 * request. The simulator counts pinned frees while a stream waits on a host
 * word not yet written. Once no request is in flight a transfer resizes them. */
static void test_gds_request_never_frees_pinned_slots(void) {
    sim_reset(0);
    const size_t n = 9 * MIB + 5;
    const char *path = t_path("gds_keep.bin");
    unsigned char *want = make_file(path, n, 41);
    ckptio_engine *e = make_engine(2, 64 * MIB, 8 * MIB); /* 4 MiB slots */
    const ckptio__gpu_ops *ops = ckptio__gpu_sim_ops();
    void *stream = NULL;
    ckptio_gds_file *g = NULL;
    unsigned char *dev = open_stream_case(e, path, n, &stream, &g);
    uint64_t done = 0;
    T_OK(ckptio_gds_read(g, dev, n, 0, 0, &done));
    T_ASSERT(done == n && memcmp(dev, want, n) == 0);
    /* From now on the settings ask for 1 MiB slots. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 * MIB));
    ckptio__gpu_sim_stats a, b, c;
    ckptio__gpu_sim_get_stats(&a);
    T_ASSERT(a.pinned_allocs > 0);
    write_after_kernel(g, dev, n, stream, 0x3C);
    T_OK(ops->stream_sync(stream));
    ckptio__gpu_sim_get_stats(&b);
    T_ASSERT_MSG(b.pinned_frees_while_waiting == 0,
                 "%llu pinned frees while the stream waited on the request (a deadlock on a real device)",
                 (unsigned long long)b.pinned_frees_while_waiting);
    check_file_filled(path, n, 0x3C);
    /* No request in flight: the next transfer takes the new size. */
    T_OK(ckptio_gds_write(g, dev, n, 0, 0, &done));
    ckptio__gpu_sim_get_stats(&c);
    T_ASSERT_MSG(c.pinned_frees > b.pinned_frees && c.pinned_frees_while_waiting == 0,
                 "frees %llu -> %llu, %llu while waiting", (unsigned long long)b.pinned_frees,
                 (unsigned long long)c.pinned_frees, (unsigned long long)c.pinned_frees_while_waiting);
    T_OK(ckptio_gds_close(g));
    ops->stream_destroy(stream);
    check_sim_clean(64 * MIB + 64);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* While a stream waits on a stream-ordered request the run keeps the pinned
 * slots, here larger than the settings' (pinned by one worker before the
 * threads were raised), and pins no more than the staging bound holds: the
 * worker that has them runs alone rather than three more pinning their own. */
static void test_kept_slots_stay_within_the_staging_bound(void) {
    sim_reset(200);
    const size_t n = 32 * MIB + 5;
    const uint64_t bound = 16 * MIB;
    const char *path = t_path("gds_kept_bound.bin");
    unsigned char *want = make_file(path, n, 43);
    ckptio_engine *e = make_engine(1, (int64_t)bound, 8 * MIB); /* one worker, 4 slots of 4 MiB */
    const ckptio__gpu_ops *ops = ckptio__gpu_sim_ops();
    void *stream = NULL;
    ckptio_gds_file *g = NULL;
    unsigned char *dev = open_stream_case(e, path, n, &stream, &g);
    uint64_t done = 0;
    T_OK(ckptio_gds_write(g, dev, n, 0, 0, &done));
    T_ASSERT(done == n);
    /* From now on the settings ask for 4 workers with 1 MiB slots. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 4));
    sim_reset(200); /* the high-water mark starts at what is pinned now */
    ckptio__gpu_sim_stats a, b;
    ckptio__gpu_sim_get_stats(&a);
    T_ASSERT_MSG(a.pinned_now == bound, "%llu bytes pinned by the first save", (unsigned long long)a.pinned_now);
    write_after_kernel(g, dev, n, stream, 0x3C);
    memset(dev, 0, n);
    ckptio_gds_request *r = NULL;
    T_OK(ckptio_gds_read_async(g, dev, n, 0, 0, stream, &r));
    T_OK(ckptio_gds_request_wait(r, &done));
    T_ASSERT(done == n);
    T_OK(ckptio_gds_request_destroy(r));
    T_OK(ops->stream_sync(stream));
    for (size_t i = 0; i < n; i++) T_ASSERT_MSG(dev[i] == 0x3C, "device byte %zu is 0x%02x", i, dev[i]);
    ckptio__gpu_sim_get_stats(&b);
    T_ASSERT_MSG(b.pinned_frees_while_waiting == 0, "%llu pinned frees while the stream waited",
                 (unsigned long long)b.pinned_frees_while_waiting);
    T_ASSERT_MSG(b.pinned_peak <= bound + 64, "pinned peak %llu above the staging bound %llu (and a gate word)",
                 (unsigned long long)b.pinned_peak, (unsigned long long)bound);
    check_file_filled(path, n, 0x3C);
    T_OK(ckptio_gds_close(g));
    ops->stream_destroy(stream);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* A lowered staging bound that leaves the slot size as it was: the slots
 * pinned beyond the new bound (by workers the run no longer has) are freed
 * before the run pins any, in both directions. */
static void test_pinned_slots_follow_a_lowered_bound(void) {
    sim_reset(50);
    const size_t n = 8 * MIB + 5;
    const char *path = t_path("lowered_bound.bin");
    unsigned char *want = make_file(path, n, 44);
    ckptio_engine *e = make_engine(4, 128 * MIB, 4 * MIB); /* 4 workers, slots of 4 MiB */
    const uint64_t slots = 4 * CKPTIO_GPU_READ_SLOTS;
    T_OK(ckptio_engine_gpu_prepare(e, 0));
    T_ASSERT(wait_pinned_allocs(slots) == slots);
    /* 1 worker within 16 MiB: 4 MiB slots again. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 1));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 16 * MIB));
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(n);
    ckptio_extent x = {.file = f, .file_offset = 0, .length = n, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &x, 1));
    T_ASSERT(memcmp(dev, want, n) == 0);
    ckptio__gpu_sim_stats a, b;
    ckptio__gpu_sim_get_stats(&a);
    T_ASSERT_MSG(a.pinned_now <= 16 * MIB, "%llu bytes pinned after a load under a 16 MiB bound",
                 (unsigned long long)a.pinned_now);
    T_OK(ckptio_file_close(f));
    const char *out = t_path("lowered_bound_out.bin");
    T_OK(ckptio_file_open(e, out, CKPTIO_OPEN_WRITE, &f));
    x.file = f;
    T_OK(ckptio__gpu_execute(e, CKPTIO_WRITE, &x, 1));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    check_file_bytes(out, want, n);
    ckptio__gpu_sim_get_stats(&b);
    T_ASSERT_MSG(b.pinned_now <= 16 * MIB, "%llu bytes pinned after a save under a 16 MiB bound",
                 (unsigned long long)b.pinned_now);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT(st.staging_reserved == b.pinned_now && st.staging_in_use == 0);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* Through the public entry points: a plan mixing host and device extents
 * (AUTO kinds resolved by the simulator) and a safetensors round trip whose
 * tensors live in device memory. */
static void test_engine_and_safetensors(void) {
    sim_reset(40);
    ckptio_engine *e = make_engine(2, 2 * MIB, 8 * MIB);
    const size_t n = 1 * MIB + 99;
    unsigned char *dev = ckptio__gpu_sim_device_alloc(n);
    unsigned char *host = malloc(n);
    t_fill_random(dev, n, 1);
    t_fill_random(host, n, 2);
    const char *path = t_path("mixed.bin");
    ckptio_file *f = NULL;
    ckptio_plan *plan = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &plan));
    ckptio_extent a = {.file = f, .file_offset = 0, .length = n, .memory = host, .mem_kind = CKPTIO_MEM_AUTO};
    ckptio_extent b = {.file = f, .file_offset = n, .length = n, .memory = dev, .mem_kind = CKPTIO_MEM_AUTO};
    T_OK(ckptio_plan_add(plan, &a));
    T_OK(ckptio_plan_add(plan, &b));
    T_OK(ckptio_engine_execute(e, plan));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    ckptio_plan_destroy(plan);
    size_t len = 0;
    unsigned char *file = t_read_file(path, &len);
    T_ASSERT(len == 2 * n && memcmp(file, host, n) == 0 && memcmp(file + n, dev, n) == 0);
    free(file);

    /* safetensors: save from device memory, read back into device memory */
    const char *st_path = t_path("dev.safetensors");
    const int64_t shape_a[2] = {512, 1024}, shape_b[1] = {777};
    unsigned char *ta = ckptio__gpu_sim_device_alloc(512 * 1024 * 2), *tb = ckptio__gpu_sim_device_alloc(777 * 4);
    t_fill_random(ta, 512 * 1024 * 2, 3);
    t_fill_random(tb, 777 * 4, 4);
    const ckptio_tensor_source src[2] = {
        {.name = "w", .dtype = CKPTIO_DTYPE_BF16, .ndim = 2, .shape = shape_a, .data = ta, .nbytes = 512 * 1024 * 2,
         .mem_kind = CKPTIO_MEM_CUDA},
        {.name = "b", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape_b, .data = tb, .nbytes = 777 * 4,
         .mem_kind = CKPTIO_MEM_AUTO},
    };
    T_OK(ckptio_safetensors_save(e, st_path, src, 2, NULL, 0, 0));
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(e, st_path, &st));
    unsigned char *ra = ckptio__gpu_sim_device_alloc(512 * 1024 * 2), *rb = ckptio__gpu_sim_device_alloc(777 * 4);
    size_t ia, ib;
    T_OK(ckptio_safetensors_find(st, "w", &ia));
    T_OK(ckptio_safetensors_find(st, "b", &ib));
    const ckptio_tensor_target tg[2] = {
        {.index = ia, .data = ra, .capacity = 512 * 1024 * 2, .mem_kind = CKPTIO_MEM_CUDA},
        {.index = ib, .data = rb, .capacity = 777 * 4, .mem_kind = CKPTIO_MEM_AUTO}};
    T_OK(ckptio_safetensors_read(st, tg, 2));
    T_ASSERT(memcmp(ra, ta, 512 * 1024 * 2) == 0);
    T_ASSERT(memcmp(rb, tb, 777 * 4) == 0);
    T_OK(ckptio_safetensors_close(st));
    ckptio_stats stats;
    T_OK(ckptio_engine_stats(e, &stats));
    T_ASSERT(stats.bytes_d2h == n + 512 * 1024 * 2 + 777 * 4);
    T_ASSERT(stats.bytes_h2d == 512 * 1024 * 2 + 777 * 4);
    /* The engine's host bounce buffers count in the engine's staging too:
     * bound the GPU part (pinned memory) through the simulator. */
    T_ASSERT(stats.staging_in_use == 0);
    check_sim_clean(2 * MIB);
    ckptio__gpu_sim_device_free(ta);
    ckptio__gpu_sim_device_free(tb);
    ckptio__gpu_sim_device_free(ra);
    ckptio__gpu_sim_device_free(rb);
    ckptio__gpu_sim_device_free(dev);
    free(host);
    T_OK(ckptio_engine_destroy(e));
}

/* ---- files that change under a transfer -------------------------------------- */

/* A file that shrank after it was opened: the staged read of the windows
 * past its new end says the file is truncated, an error naming the file;
 * no staging stays in use, and what is still there reads correctly. */
static void test_file_shrunk_after_open(void) {
    sim_reset(20);
    const char *path = t_path("shrinks.bin");
    unsigned char *want = make_file(path, 3 * MIB, 35);
    ckptio_engine *e = make_engine(2, 2 * MIB, 8 * MIB);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    T_ASSERT(truncate(path, 1 * MIB + 100) == 0);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(3 * MIB);
    ckptio_extent ex = {.file = f, .file_offset = 0, .length = 3 * MIB, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS(path);
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT(st.staging_in_use == 0);
    check_sim_clean(2 * MIB);
    ckptio_extent head = {.file = f, .file_offset = 0, .length = 1 * MIB, .memory = dev,
                          .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio__gpu_execute(e, CKPTIO_READ, &head, 1));
    T_ASSERT(memcmp(dev, want, 1 * MIB) == 0);
    ckptio_file_close(f);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

/* Reads and writes share the pinned slots: a read's smaller windows never
 * resize them, since freeing pinned memory synchronises a real device and
 * would deadlock a stream-ordered GDS request waiting on this thread. */
static void test_reads_and_writes_share_slots(void) {
    sim_reset(0);
    ckptio__gpu_sim_stats z;
    ckptio__gpu_sim_get_stats(&z);
    T_ASSERT(z.pinned_allocs == 0);
    const size_t n = 9 * MIB + 5;
    const char *path = t_path("share.bin");
    unsigned char *want = make_file(path, n, 39);
    ckptio_engine *e = make_engine(2, 64 * MIB, 8 * MIB); /* 4 MiB slots (the cap), reads and writes */
    ckptio_gds_file *g = NULL;
    T_OK(ckptio_gds_open(e, path, O_RDWR, 0, &g));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(n);
    uint64_t done = 0;
    T_OK(ckptio_gds_read(g, dev, n, 0, 0, &done));
    T_ASSERT(done == n && memcmp(dev, want, n) == 0);
    ckptio__gpu_sim_stats a, b;
    ckptio__gpu_sim_get_stats(&a);
    T_ASSERT(a.pinned_allocs > 0);
    T_OK(ckptio_gds_write(g, dev, n, 0, 0, &done));
    T_OK(ckptio_gds_read(g, dev, n, 0, 0, &done));
    ckptio__gpu_sim_get_stats(&b);
    /* Slots are pinned on first use, so the write may add some; none is freed. */
    T_ASSERT_MSG(b.pinned_frees == a.pinned_frees, "pinned slots freed between a read and a write (%llu -> %llu)",
                 (unsigned long long)a.pinned_frees, (unsigned long long)b.pinned_frees);
    T_ASSERT_MSG(b.pinned_allocs <= 2 * CKPTIO_GPU_NSLOTS, "%llu pinned allocations for two workers' %u slots",
                 (unsigned long long)b.pinned_allocs, 2 * CKPTIO_GPU_NSLOTS);
    T_OK(ckptio_gds_close(g));
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

int main(int argc, char **argv) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    self_path = argv[0];
    if (argc > 1 && strcmp(argv[1], "no-range") == 0) return no_range_child();
    T_RUN(test_classify_and_meminfo);
    T_RUN(test_read_one_worker);
    T_RUN(test_read_four_workers);
    T_RUN(test_read_no_delay);
    T_RUN(test_write_extents);
    T_RUN(test_sizes_and_offsets);
    T_RUN(test_column_slice_in_pitched_copies);
    T_RUN(test_column_slice_packed_from_memory);
    T_RUN(test_packed_read_past_the_end);
    T_RUN(test_strided_device_memory_saved_in_pitched_copies);
    T_RUN(test_copy_fails_when_queued);
    T_RUN(test_copy_fails_asynchronously);
    T_RUN(test_slots_allocated_on_first_use);
    T_RUN(test_slots_pinned_on_demand);
    T_RUN(test_slot_size_is_capped);
    T_RUN(test_slot_allocation_fails);
    T_RUN(test_slot_pinning_never_waits_without_need);
    T_RUN(test_first_windows_are_read_while_another_worker_pins);
    T_RUN(test_slots_live_in_one_range);
    T_RUN(test_slots_without_a_range);
    T_RUN(test_prepare_pins_ahead);
    T_RUN(test_prefill_faults_in_unpinned_slots);
    T_RUN(test_prepare_pins_what_a_load_uses);
    T_RUN(test_prepare_races_transfers_and_destroy);
    T_RUN(test_prepare_yields_to_a_transfer);
    T_RUN(test_huge_slots_setting);
    T_RUN(test_prepare_refusals_and_failures);
    T_RUN(test_read_fails_midway);
    T_RUN(test_bad_device_memory);
    T_RUN(test_device_memory_in_pieces);
    T_RUN(test_engine_and_safetensors);
    T_RUN(test_gds_file_sync);
    T_RUN(test_gds_stream_ordered);
    T_RUN(test_gds_request_never_frees_pinned_slots);
    T_RUN(test_kept_slots_stay_within_the_staging_bound);
    T_RUN(test_pinned_slots_follow_a_lowered_bound);
    T_RUN(test_file_shrunk_after_open);
    T_RUN(test_reads_and_writes_share_slots);
    return T_EXIT_PASS;
}
