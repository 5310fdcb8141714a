/*
 * test_gpu_backends.c - the GPU pipeline is a stage of the engine's executor:
 * its file I/O goes through the engine's I/O backends, so a GPU plan gets
 * what a host plan gets. On the simulated device (src/gpu/gpu_sim.c):
 *  - reads and writes of unaligned extents through pread and io_uring (with
 *    O_DIRECT on and in AUTO) leave the right bytes, and io_uring gives the
 *    GPU workers rings of their own (counted in /proc/self/fd) while AUTO
 *    keeps pread for them;
 *  - a fault injected into the backends (EIO, a short read) has the same
 *    outcome on a GPU plan as on a host plan: status, errno, file, offset
 *    and the backend named in the message; short reads are resumed;
 *  - the counters count each extent byte once: bytes_read/written equal the
 *    plan's bytes (not the alignment padding and holes a window moves), and
 *    seconds_io is the call's wall time, not one share per worker.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"
#include "io_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

/* Unaligned offsets, lengths and device addresses, adjacent extents, a
 * small hole (bridged by a read window), a large one and an extent at EOF. */
typedef struct spec {
    uint64_t off, len, dev_off;
} spec;

#define FILE_SIZE (3 * MIB + 777)
static const spec specs[] = {
    {1, 4095, 3},
    {4096, 1 * MIB + 5, 8193},
    {1 * MIB + 4101, 100, 2 * MIB + 1},
    {1 * MIB + 9000, 700 * KIB, 2 * MIB + 4096},
    {2 * MIB + 65536, 200 * KIB + 3, 3 * MIB + 11},
    {FILE_SIZE - 12345, 12345, 4 * MIB + 5},
};
#define NSPEC (sizeof specs / sizeof specs[0])
#define DEV_SIZE (5 * MIB)

static uint64_t spec_bytes(void) {
    uint64_t n = 0;
    for (size_t i = 0; i < NSPEC; i++) n += specs[i].len;
    return n;
}

/* The specs as extents of `f` into or out of device memory `dev`. */
static void spec_extents(ckptio_extent *ext, ckptio_file *f, unsigned char *dev) {
    for (size_t i = 0; i < NSPEC; i++)
        ext[i] = (ckptio_extent){.file = f, .file_offset = specs[i].off, .length = specs[i].len,
                                 .memory = dev + specs[i].dev_off, .mem_kind = CKPTIO_MEM_CUDA};
}

static bool io_uring_usable(void) {
    const char *why = NULL;
    const int err = ckptio__io_uring_probe(&why);
    if (err) printf("# io_uring parts skipped: %s (%s)\n", why, strerror(err));
    return err == 0;
}

/* io_uring instances this process holds (each ring is an fd). */
static int count_rings(void) {
    DIR *d = opendir("/proc/self/fd");
    T_ASSERT(d);
    int n = 0;
    char link[300], target[128];
    struct dirent *ent;
    while ((ent = readdir(d))) {
        snprintf(link, sizeof link, "/proc/self/fd/%s", ent->d_name);
        const ssize_t len = readlink(link, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = '\0';
        if (strstr(target, "io_uring")) n++;
    }
    closedir(d);
    return n;
}

static ckptio_engine *make_engine(int64_t threads, int64_t backend, int64_t direct) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 4 * MIB));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 8 * MIB));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, backend));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, direct));
    return e;
}

/* Runs one plan of `n` extents of `f` in `dir`; memory kind as given. */
static ckptio_status run_plan(ckptio_engine *e, ckptio_direction dir, const ckptio_extent *ext, size_t n) {
    ckptio_plan *plan = NULL;
    T_OK(ckptio_plan_create(dir, &plan));
    for (size_t i = 0; i < n; i++) T_OK(ckptio_plan_add(plan, &ext[i]));
    const ckptio_status st = ckptio_engine_execute(e, plan);
    ckptio_plan_destroy(plan);
    return st;
}

static void stats_delta(ckptio_engine *e, const ckptio_stats *before, ckptio_stats *d) {
    ckptio_stats now;
    T_OK(ckptio_engine_stats(e, &now));
    *d = (ckptio_stats){.bytes_read = now.bytes_read - before->bytes_read,
                        .bytes_written = now.bytes_written - before->bytes_written,
                        .bytes_direct = now.bytes_direct - before->bytes_direct,
                        .bytes_buffered = now.bytes_buffered - before->bytes_buffered,
                        .bytes_h2d = now.bytes_h2d - before->bytes_h2d,
                        .bytes_d2h = now.bytes_d2h - before->bytes_d2h,
                        .io_requests = now.io_requests - before->io_requests,
                        .retries = now.retries - before->retries,
                        .seconds_io = now.seconds_io - before->seconds_io};
}

/* ---- (a) bytes through each backend ----------------------------------------- */

/* Reads specs into device memory and writes them from device memory to a
 * new file through `backend`; checks every byte and the rings made. */
static void round_trip(int64_t backend, int64_t direct, int want_new_rings) {
    ckptio__gpu_sim_configure(&(ckptio__gpu_sim_config){.copy_delay_us = 50});
    const char *path = t_path("gpu_backends.bin");
    unsigned char *want = malloc(FILE_SIZE);
    t_fill_random(want, FILE_SIZE, 7 + (uint64_t)backend);
    t_write_file(path, want, FILE_SIZE);
    ckptio_engine *e = make_engine(2, backend, direct);
    const int rings0 = count_rings();
    unsigned char *dev = ckptio__gpu_sim_device_alloc(DEV_SIZE);
    memset(dev, 0xEE, DEV_SIZE);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    ckptio_extent ext[NSPEC];
    spec_extents(ext, f, dev);
    T_OK(run_plan(e, CKPTIO_READ, ext, NSPEC));
    T_OK(ckptio_file_close(f));
    for (size_t i = 0; i < NSPEC; i++)
        T_ASSERT_MSG(memcmp(dev + specs[i].dev_off, want + specs[i].off, specs[i].len) == 0,
                     "backend %lld, direct %lld: extent %zu read wrong bytes", (long long)backend, (long long)direct,
                     i);
    const int new_rings = count_rings() - rings0;
    if (want_new_rings) T_ASSERT_MSG(new_rings >= 1, "io_uring asked for, but the GPU workers made no ring");
    else T_ASSERT_MSG(new_rings == 0, "%d io_uring rings made where the GPU stage should use pread", new_rings);

    /* Back out: the extents' bytes, then the holes as zeros. */
    const char *out = t_path("gpu_backends_out.bin");
    unlink(out);
    T_OK(ckptio_file_open(e, out, CKPTIO_OPEN_WRITE, &f));
    for (size_t i = 0; i < NSPEC; i++) ext[i].file = f;
    T_OK(run_plan(e, CKPTIO_WRITE, ext, NSPEC));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    size_t len = 0;
    unsigned char *got = t_read_file(out, &len);
    T_ASSERT_MSG(len == FILE_SIZE, "written file has %zu bytes", len);
    size_t at = 0;
    for (size_t i = 0; i < NSPEC; i++) {
        for (; at < specs[i].off; at++) T_ASSERT_MSG(got[at] == 0, "hole byte %zu is 0x%02x", at, got[at]);
        T_ASSERT_MSG(memcmp(got + specs[i].off, want + specs[i].off, specs[i].len) == 0,
                     "backend %lld, direct %lld: extent %zu written wrong", (long long)backend, (long long)direct, i);
        at = specs[i].off + specs[i].len;
    }
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.violations == 0, "%llu staging slots changed while their copy was in flight",
                 (unsigned long long)s.violations);
    free(got);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
    T_ASSERT_MSG(count_rings() == rings0, "the engine's rings outlived it");
    free(want);
}

static void test_pread_bytes(void) {
    round_trip(CKPTIO_BACKEND_PREAD, CKPTIO_DIRECT_ON, 0);
    round_trip(CKPTIO_BACKEND_PREAD, CKPTIO_DIRECT_AUTO, 0);
}

static void test_io_uring_bytes(void) {
    if (!io_uring_usable()) return;
    round_trip(CKPTIO_BACKEND_IO_URING, CKPTIO_DIRECT_ON, 1);
    round_trip(CKPTIO_BACKEND_IO_URING, CKPTIO_DIRECT_AUTO, 1);
    round_trip(CKPTIO_BACKEND_IO_URING, CKPTIO_DIRECT_OFF, 1);
}

/* AUTO resolves to io_uring for host workers where it runs; the GPU stage
 * keeps pread (the measured configuration, docs/GPU.md). */
static void test_auto_keeps_pread(void) { round_trip(CKPTIO_BACKEND_AUTO, CKPTIO_DIRECT_ON, 0); }

/* ---- (b) the same fault, the same error ------------------------------------- */

typedef struct outcome {
    ckptio_status status;
    int sys_errno;
    int64_t offset;
    char path[512];
    char message[1024];
} outcome;

/* Reads the file's first 2 MiB into host or device memory with the
 * `nth` read request failing with `err` (or cut to `short_len` bytes). */
static outcome read_with_fault(int64_t backend, bool gpu, uint64_t nth, int err, uint64_t short_len,
                               ckptio_stats *delta) {
    const char *path = t_path("fault.bin");
    ckptio_engine *e = make_engine(1, backend, CKPTIO_DIRECT_ON);
    /* One request in flight: io_uring completes (and injects) in order. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_QUEUE_DEPTH, 1));
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    unsigned char *mem = gpu ? ckptio__gpu_sim_device_alloc(2 * MIB) : malloc(2 * MIB);
    const ckptio_extent ex = {.file = f, .file_offset = 0, .length = 2 * MIB, .memory = mem,
                              .mem_kind = gpu ? CKPTIO_MEM_CUDA : CKPTIO_MEM_HOST};
    ckptio_stats before;
    T_OK(ckptio_engine_stats(e, &before));
    ckptio__io_inject(CKPTIO__IO_READ, nth, err, short_len, false);
    outcome o = {.status = run_plan(e, CKPTIO_READ, &ex, 1)};
    ckptio__io_inject_reset();
    if (o.status != CKPTIO_OK) {
        const ckptio_error_info *ei = ckptio_last_error();
        o.sys_errno = ei->sys_errno;
        o.offset = ei->file_offset;
        snprintf(o.path, sizeof o.path, "%s", ei->path);
        snprintf(o.message, sizeof o.message, "%s", ei->message);
    } else {
        size_t len = 0;
        unsigned char *want = t_read_file(path, &len);
        T_ASSERT_MSG(memcmp(mem, want, 2 * MIB) == 0, "%s read after a short transfer has wrong bytes",
                     gpu ? "GPU" : "host");
        free(want);
    }
    stats_delta(e, &before, delta);
    T_OK(ckptio_file_close(f));
    if (gpu) ckptio__gpu_sim_device_free(mem);
    else free(mem);
    T_OK(ckptio_engine_destroy(e));
    return o;
}

static void same_faults(int64_t backend, const char *name) {
    ckptio__gpu_sim_configure(&(ckptio__gpu_sim_config){0});
    unsigned char *data = malloc(3 * MIB);
    t_fill_random(data, 3 * MIB, 99);
    t_write_file(t_path("fault.bin"), data, 3 * MIB);
    free(data);
    ckptio_stats dh, dg;
    /* EIO on the first read request: both fail at offset 0 of the file. */
    const outcome h = read_with_fault(backend, false, 1, EIO, 0, &dh);
    const outcome g = read_with_fault(backend, true, 1, EIO, 0, &dg);
    T_ASSERT_MSG(h.status == CKPTIO_E_IO && g.status == CKPTIO_E_IO, "%s: host %s, GPU %s", name,
                 ckptio_status_name(h.status), ckptio_status_name(g.status));
    T_ASSERT_MSG(h.sys_errno == EIO && g.sys_errno == EIO, "%s: errno host %d, GPU %d", name, h.sys_errno,
                 g.sys_errno);
    T_ASSERT_MSG(strcmp(h.path, g.path) == 0 && strstr(g.path, "fault.bin"), "%s: path host '%s', GPU '%s'", name,
                 h.path, g.path);
    T_ASSERT_MSG(h.offset == 0 && g.offset == 0, "%s: offset host %lld, GPU %lld", name, (long long)h.offset,
                 (long long)g.offset);
    char backend_note[64];
    snprintf(backend_note, sizeof backend_note, "extent 0 (%s, O_DIRECT", name);
    T_ASSERT_MSG(strstr(h.message, backend_note) && strstr(g.message, backend_note),
                 "%s: messages do not both name '%s':\n  host: %s\n  GPU:  %s", name, backend_note, h.message,
                 g.message);
    T_ASSERT_MSG(strstr(g.message, "Input/output error"), "GPU message: %s", g.message);
    /* The failed request's bytes are not counted (the host's other
     * requests in flight on io_uring may have completed and count). */
    T_ASSERT_MSG(dh.bytes_read < 2 * MIB && dg.bytes_read == 0,
                 "%s: bytes counted for a failed read: host %llu, GPU %llu", name, (unsigned long long)dh.bytes_read,
                 (unsigned long long)dg.bytes_read);

    /* The second request fails: the GPU plan (1 MiB windows) stops at the
     * second window's start. */
    const outcome g2 = read_with_fault(backend, true, 2, EIO, 0, &dg);
    T_ASSERT_MSG(g2.status == CKPTIO_E_IO && g2.sys_errno == EIO && g2.offset == (int64_t)MIB,
                 "%s: second request: %s errno %d at %lld", name, ckptio_status_name(g2.status), g2.sys_errno,
                 (long long)g2.offset);

    /* A short read (one 4 KiB block of a request) is resumed by the
     * backend on both paths: right bytes, a retry counted. */
    const outcome hs = read_with_fault(backend, false, 1, 0, 4096, &dh);
    const outcome gs = read_with_fault(backend, true, 1, 0, 4096, &dg);
    T_ASSERT_MSG(hs.status == CKPTIO_OK && gs.status == CKPTIO_OK, "%s: short read: host %s, GPU %s (%s)", name,
                 ckptio_status_name(hs.status), ckptio_status_name(gs.status), gs.message);
    T_ASSERT_MSG(dh.retries >= 1 && dg.retries >= 1, "%s: short read not resumed: retries host %llu, GPU %llu",
                 name, (unsigned long long)dh.retries, (unsigned long long)dg.retries);
    T_ASSERT_MSG(dh.bytes_read == 2 * MIB && dg.bytes_read == 2 * MIB, "%s: bytes host %llu, GPU %llu", name,
                 (unsigned long long)dh.bytes_read, (unsigned long long)dg.bytes_read);
}

static void test_faults_pread(void) { same_faults(CKPTIO_BACKEND_PREAD, "pread"); }

static void test_faults_io_uring(void) {
    if (io_uring_usable()) same_faults(CKPTIO_BACKEND_IO_URING, "io_uring");
}

/* A write fault on the GPU path names the temporary's file and fails the
 * save, which leaves no file under the final name. */
static void test_write_fault(void) {
    ckptio__gpu_sim_configure(&(ckptio__gpu_sim_config){0});
    ckptio_engine *e = make_engine(2, CKPTIO_BACKEND_PREAD, CKPTIO_DIRECT_AUTO);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(2 * MIB);
    t_fill_random(dev, 2 * MIB, 5);
    const char *path = t_path("write_fault.bin");
    unlink(path);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    const ckptio_extent ex = {.file = f, .file_offset = 100, .length = 2 * MIB - 100, .memory = dev,
                              .mem_kind = CKPTIO_MEM_CUDA};
    ckptio__io_inject(CKPTIO__IO_WRITE, 2, ENOSPC, 0, false);
    T_STATUS(run_plan(e, CKPTIO_WRITE, &ex, 1), CKPTIO_E_NOSPC);
    ckptio__io_inject_reset();
    T_MESSAGE_HAS("write_fault.bin");
    T_MESSAGE_HAS("(pread, ");
    T_ASSERT(ckptio_last_error()->sys_errno == ENOSPC);
    T_OK(ckptio_file_close(f));
    T_ASSERT(!t_file_exists(path));
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
}

/* ---- (c) counted once ------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void counted_once(int64_t backend) {
    ckptio__gpu_sim_configure(&(ckptio__gpu_sim_config){0});
    const char *path = t_path("counted.bin");
    unsigned char *want = malloc(FILE_SIZE);
    t_fill_random(want, FILE_SIZE, 13);
    t_write_file(path, want, FILE_SIZE);
    free(want);
    /* 4 workers, small windows, slow requests: a per-worker sum of the
     * request time would come out near 4x the wall time. */
    ckptio_engine *e = make_engine(4, backend, CKPTIO_DIRECT_ON);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 4 * MIB));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 256 * KIB));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(DEV_SIZE);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    ckptio_extent ext[NSPEC];
    spec_extents(ext, f, dev);
    ckptio_stats before, d;
    T_OK(ckptio_engine_stats(e, &before));
    ckptio__io_inject_delay(5000);
    double t0 = now_s();
    T_OK(run_plan(e, CKPTIO_READ, ext, NSPEC));
    double wall = now_s() - t0;
    ckptio__io_inject_delay(0);
    stats_delta(e, &before, &d);
    const uint64_t total = spec_bytes();
    T_ASSERT_MSG(d.bytes_read == total && d.bytes_h2d == total,
                 "GPU read of %llu extent bytes counted bytes_read %llu, bytes_h2d %llu",
                 (unsigned long long)total, (unsigned long long)d.bytes_read, (unsigned long long)d.bytes_h2d);
    T_ASSERT_MSG(d.bytes_direct + d.bytes_buffered == total, "direct %llu + buffered %llu != %llu",
                 (unsigned long long)d.bytes_direct, (unsigned long long)d.bytes_buffered,
                 (unsigned long long)total);
    T_ASSERT_MSG(d.bytes_direct > 0, "no O_DIRECT byte with DIRECT=ON");
    T_ASSERT_MSG(d.io_requests >= 10, "only %llu requests for 256 KiB windows", (unsigned long long)d.io_requests);
    T_ASSERT_MSG(d.seconds_io <= wall * 1.05 + 0.002, "seconds_io %.4f for a call of %.4f s (counted per worker?)",
                 d.seconds_io, wall);
    T_OK(ckptio_file_close(f));

    /* Write back, into a new file: every byte once, and a mixed plan
     * (host and GPU extents) counts the plan's bytes, no more. */
    const char *out = t_path("counted_out.bin");
    unlink(out);
    T_OK(ckptio_file_open(e, out, CKPTIO_OPEN_WRITE, &f));
    unsigned char *host = malloc(1 * MIB);
    t_fill_random(host, 1 * MIB, 17);
    ckptio_extent wext[NSPEC + 1];
    spec_extents(wext, f, dev);
    wext[NSPEC] = (ckptio_extent){.file = f, .file_offset = FILE_SIZE, .length = 1 * MIB, .memory = host,
                                  .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_engine_stats(e, &before));
    t0 = now_s();
    T_OK(run_plan(e, CKPTIO_WRITE, wext, NSPEC + 1));
    wall = now_s() - t0;
    stats_delta(e, &before, &d);
    T_ASSERT_MSG(d.bytes_written == total + 1 * MIB && d.bytes_d2h == total,
                 "mixed write of %llu + %llu bytes counted bytes_written %llu, bytes_d2h %llu",
                 (unsigned long long)total, (unsigned long long)MIB, (unsigned long long)d.bytes_written,
                 (unsigned long long)d.bytes_d2h);
    T_ASSERT_MSG(d.bytes_direct + d.bytes_buffered == total + 1 * MIB, "direct %llu + buffered %llu",
                 (unsigned long long)d.bytes_direct, (unsigned long long)d.bytes_buffered);
    T_ASSERT_MSG(d.seconds_io <= wall * 1.05 + 0.002, "seconds_io %.4f for a call of %.4f s", d.seconds_io, wall);
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    free(host);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
}

static void test_counted_once_pread(void) { counted_once(CKPTIO_BACKEND_PREAD); }

static void test_counted_once_io_uring(void) {
    if (io_uring_usable()) counted_once(CKPTIO_BACKEND_IO_URING);
}

int main(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    T_RUN(test_pread_bytes);
    T_RUN(test_io_uring_bytes);
    T_RUN(test_auto_keeps_pread);
    T_RUN(test_faults_pread);
    T_RUN(test_faults_io_uring);
    T_RUN(test_write_fault);
    T_RUN(test_counted_once_pread);
    T_RUN(test_counted_once_io_uring);
    return T_EXIT_PASS;
}
