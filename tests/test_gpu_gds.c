/*
 * test_gpu_gds.c - the GDS file API on the simulated device
 * (tests/doubles/gpu_sim.c) through the staging pipeline: synchronous reads
 * and writes, stream-ordered requests interleaved with simulated kernels,
 * and the pinned slots while a stream waits on a request: never freed,
 * shared by reads and writes, and within the staging bound. Runs without
 * a GPU.
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
#include <time.h>
#include <unistd.h>

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

/* A file of n random bytes opened as a GDS file on a one-worker engine with
 * `bound` bytes of staging and 8 MiB chunks (slots of min(bound / 4, 4 MiB)),
 * a simulated stream and n bytes of device memory. */
typedef struct kept_case {
    const char *path;
    size_t n;
    unsigned char *want, *dev;
    ckptio_engine *e;
    void *stream;
    ckptio_gds_file *g;
} kept_case;

static kept_case kept_case_open(const char *name, size_t n, uint64_t bound, uint64_t seed) {
    kept_case c = {.path = t_path(name), .n = n};
    c.want = make_file(c.path, n, seed);
    c.e = make_engine(1, (int64_t)bound, 8 * MIB);
    c.dev = open_stream_case(c.e, c.path, n, &c.stream, &c.g);
    return c;
}

/* The simulator's pinned bytes since its last reset stayed within `bound`
 * (and a request's gate word), and none was freed while the stream waited. */
static void check_pinned_peak(uint64_t bound) {
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.pinned_frees_while_waiting == 0, "%llu pinned frees while the stream waited",
                 (unsigned long long)s.pinned_frees_while_waiting);
    T_ASSERT_MSG(s.pinned_peak <= bound + 64, "pinned peak %llu above the staging bound %llu (and a gate word)",
                 (unsigned long long)s.pinned_peak, (unsigned long long)bound);
}

static void kept_case_close(kept_case *c) {
    T_OK(ckptio_gds_close(c->g));
    ckptio__gpu_sim_ops()->stream_destroy(c->stream);
    ckptio__gpu_sim_device_free(c->dev);
    T_OK(ckptio_engine_destroy(c->e));
    free(c->want);
}

/* While a stream waits on a stream-ordered request the run keeps the pinned
 * slots, here larger than the settings' (pinned by one worker before the
 * threads were raised), and pins no more than the staging bound holds: the
 * worker that has them runs alone rather than three more pinning their own. */
static void test_kept_slots_stay_within_the_staging_bound(void) {
    sim_reset(200);
    const uint64_t bound = 16 * MIB;
    kept_case c = kept_case_open("gds_kept_bound.bin", 32 * MIB + 5, bound, 43); /* 4 slots of 4 MiB */
    uint64_t done = 0;
    T_OK(ckptio_gds_write(c.g, c.dev, c.n, 0, 0, &done));
    T_ASSERT(done == c.n);
    /* From now on the settings ask for 4 workers with 1 MiB slots. */
    T_OK(ckptio_engine_set(c.e, CKPTIO_OPT_THREADS, 4));
    sim_reset(200); /* the high-water mark starts at what is pinned now */
    ckptio__gpu_sim_stats a;
    ckptio__gpu_sim_get_stats(&a);
    T_ASSERT_MSG(a.pinned_now == bound, "%llu bytes pinned by the first save", (unsigned long long)a.pinned_now);
    write_after_kernel(c.g, c.dev, c.n, c.stream, 0x3C);
    memset(c.dev, 0, c.n);
    ckptio_gds_request *r = NULL;
    T_OK(ckptio_gds_read_async(c.g, c.dev, c.n, 0, 0, c.stream, &r));
    T_OK(ckptio_gds_request_wait(r, &done));
    T_ASSERT(done == c.n);
    T_OK(ckptio_gds_request_destroy(r));
    T_OK(ckptio__gpu_sim_ops()->stream_sync(c.stream));
    for (size_t i = 0; i < c.n; i++) T_ASSERT_MSG(c.dev[i] == 0x3C, "device byte %zu is 0x%02x", i, c.dev[i]);
    check_pinned_peak(bound);
    check_file_filled(c.path, c.n, 0x3C);
    kept_case_close(&c);
}

/* The same when the staging bound was lowered while the slots stay kept: a
 * stream-ordered save rotates through the two slots a load pinned rather
 * than pin the other two a save would use, and its bytes arrive whole. */
static void test_kept_slots_a_save_uses_fewer(void) {
    ckptio__gpu_sim_config busy = {.copy_delay_us = 100, .events_busy = true}; /* the load pins both read slots */
    ckptio__gpu_sim_configure(&busy);
    kept_case c = kept_case_open("gds_kept_fewer.bin", 24 * MIB + 5, 16 * MIB, 46); /* slots of 4 MiB */
    uint64_t done = 0;
    T_OK(ckptio_gds_read(c.g, c.dev, c.n, 0, 0, &done));
    T_ASSERT(done == c.n && memcmp(c.dev, c.want, c.n) == 0);
    sim_reset(100);
    ckptio__gpu_sim_stats a;
    ckptio__gpu_sim_get_stats(&a);
    T_ASSERT_MSG(a.pinned_now == 8 * MIB, "%llu bytes pinned by the load", (unsigned long long)a.pinned_now);
    T_OK(ckptio_engine_set(c.e, CKPTIO_OPT_STAGING_BYTES, 8 * MIB));
    write_after_kernel(c.g, c.dev, c.n, c.stream, 0x77);
    T_OK(ckptio__gpu_sim_ops()->stream_sync(c.stream));
    check_pinned_peak(8 * MIB);
    check_file_filled(c.path, c.n, 0x77);
    kept_case_close(&c);
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

int main(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    T_RUN(test_gds_file_sync);
    T_RUN(test_gds_stream_ordered);
    T_RUN(test_gds_request_never_frees_pinned_slots);
    T_RUN(test_kept_slots_stay_within_the_staging_bound);
    T_RUN(test_kept_slots_a_save_uses_fewer);
    T_RUN(test_reads_and_writes_share_slots);
    return T_EXIT_PASS;
}
