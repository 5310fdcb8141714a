/*
 * test_gpu_pipeline.c - transfers through the GPU staging pipeline on the
 * simulated device (tests/doubles/gpu_sim.c): bytes, ordering (no staging
 * slot reused before its copy completed), overlap, unaligned offsets and
 * sizes, strided pieces in pitched copies, staging bounds, error paths
 * (copies failing when queued or when run, a slot that cannot be pinned,
 * reads failing midway, bad device memory, a file that shrank) and plans
 * through the public entry points. Runs without a GPU. The slots' pinning
 * is test_gpu_pinning.c's, the GDS file API test_gpu_gds.c's.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "gpu_pipeline.h"
#include "gpu_sim.h"
#include "gpu_sim_helpers.h"
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

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

int main(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
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
    T_RUN(test_slot_allocation_fails);
    T_RUN(test_read_fails_midway);
    T_RUN(test_bad_device_memory);
    T_RUN(test_device_memory_in_pieces);
    T_RUN(test_engine_and_safetensors);
    T_RUN(test_file_shrunk_after_open);
    return T_EXIT_PASS;
}
