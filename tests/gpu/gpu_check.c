/*
 * gpu_check.c - checks of the GPU path on a machine with a real GPU (built
 * and run by tests/gpu/run_gpu_checks.sh; needs no CUDA toolkit: the driver
 * API comes through ckptio's own shim).
 *
 * Every check uses random data, poisoned destinations and compares every
 * byte: sizes from 0 to more than 4 GiB with unaligned file offsets, buffer
 * offsets and lengths, both directions, through the engine (plans) and the
 * GDS file API, with the pipeline forced and with cuFile forced (expected to
 * be refused clearly where nvidia-fs is absent), and stream-ordered requests
 * interleaved with kernels on the same stream (PTX embedded below, loaded
 * with cuModuleLoadData). Exit 0 = all passed, 1 = a failure, 77 = no GPU.
 *
 * Usage: gpu_check [DIR] [--quick]   (DIR: scratch directory, default /tmp)
 */
#include "ckptio.h"
#include "cuda_shim.h"
#include "gpu_internal.h" /* ckptio__gpu_mem_info */

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define GIB (1ull << 30)

static const ckptio__cuda_api *cu;
static const char *dir = "/tmp";
static int failures;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                  \
            fprintf(stderr, __VA_ARGS__);                                         \
            fprintf(stderr, "\n");                                                \
            failures++;                                                           \
            return false;                                                         \
        }                                                                         \
    } while (0)
#define OK(expr) CHECK((expr) == CKPTIO_OK, "%s: %s", #expr, ckptio_last_error_message())
#define CU(expr)                                                                              \
    do {                                                                                      \
        CUresult r_ = (expr);                                                                 \
        if (r_ != CUDA_SUCCESS) {                                                             \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #expr,               \
                    ckptio__cuda_error_name(r_));                                             \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* add_one(ptr, n): ptr[i] += 1 for i < n (grid-stride).
 * fill(ptr, n, v): ptr[i] = v. PTX ISA 7.0, JIT-compiled by the driver. */
static const char ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry add_one(.param .u64 p_ptr, .param .u64 p_n)\n"
    "{\n"
    "  .reg .pred %p<2>; .reg .b32 %r<6>; .reg .b64 %rd<9>; .reg .b16 %rs<3>;\n"
    "  ld.param.u64 %rd1, [p_ptr]; ld.param.u64 %rd2, [p_n];\n"
    "  mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ntid.x; mov.u32 %r3, %tid.x; mov.u32 %r4, %nctaid.x;\n"
    "  mul.wide.u32 %rd3, %r1, %r2; cvt.u64.u32 %rd4, %r3; add.u64 %rd5, %rd3, %rd4;\n"
    "  mul.wide.u32 %rd6, %r4, %r2;\n"
    "LOOP_A:\n"
    "  setp.ge.u64 %p1, %rd5, %rd2; @%p1 bra DONE_A;\n"
    "  add.u64 %rd7, %rd1, %rd5; ld.global.u8 %rs1, [%rd7]; add.u16 %rs2, %rs1, 1; st.global.u8 [%rd7], %rs2;\n"
    "  add.u64 %rd5, %rd5, %rd6; bra LOOP_A;\n"
    "DONE_A:\n"
    "  ret;\n"
    "}\n"
    ".visible .entry fill(.param .u64 p_ptr, .param .u64 p_n, .param .u32 p_v)\n"
    "{\n"
    "  .reg .pred %p<2>; .reg .b32 %r<6>; .reg .b64 %rd<9>; .reg .b16 %rs<2>;\n"
    "  ld.param.u64 %rd1, [p_ptr]; ld.param.u64 %rd2, [p_n]; ld.param.u32 %r5, [p_v]; cvt.u16.u32 %rs1, %r5;\n"
    "  mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ntid.x; mov.u32 %r3, %tid.x; mov.u32 %r4, %nctaid.x;\n"
    "  mul.wide.u32 %rd3, %r1, %r2; cvt.u64.u32 %rd4, %r3; add.u64 %rd5, %rd3, %rd4;\n"
    "  mul.wide.u32 %rd6, %r4, %r2;\n"
    "LOOP_F:\n"
    "  setp.ge.u64 %p1, %rd5, %rd2; @%p1 bra DONE_F;\n"
    "  add.u64 %rd7, %rd1, %rd5; st.global.u8 [%rd7], %rs1;\n"
    "  add.u64 %rd5, %rd5, %rd6; bra LOOP_F;\n"
    "DONE_F:\n"
    "  ret;\n"
    "}\n";

static CUfunction k_add_one, k_fill;

static void fill_random(unsigned char *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
    for (; i < n; i++) p[i] = (unsigned char)(x >> (8 * (i % 8)));
}

static bool write_file(const char *path, const unsigned char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f, "cannot create %s", path);
    CHECK(n == 0 || fwrite(data, 1, n, f) == n, "short write to %s", path);
    CHECK(fclose(f) == 0, "close %s", path);
    return true;
}

static bool read_file_at(const char *path, unsigned char *data, size_t n, uint64_t off) {
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0, "cannot open %s", path);
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, data + done, n - done, (off_t)(off + done));
        if (r <= 0) break;
        done += (size_t)r;
    }
    close(fd);
    CHECK(done == n, "%s: read %zu of %zu bytes", path, done, n);
    return true;
}

/* First differing byte, or -1. */
static long long first_diff(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return (long long)i;
    return -1;
}

static void launch(CUfunction f, CUstream s, void **params) {
    CU(cu->cuLaunchKernel(f, 1024, 1, 1, 256, 1, 1, 0, s, params, NULL));
}

/* One read+write round trip of `len` bytes at file offset `off`, device
 * buffer offset `doff`, through plans (use_gds 0) or the GDS API (1). */
static bool round_trip(ckptio_engine *e, uint64_t len, uint64_t off, uint64_t doff, int use_gds, unsigned char *host,
                       unsigned char *back, CUdeviceptr dbuf, uint64_t dcap, uint64_t seed) {
    char src[512], dst[512];
    snprintf(src, sizeof src, "%s/ckptio_gpu_src.bin", dir);
    snprintf(dst, sizeof dst, "%s/ckptio_gpu_dst.bin", dir);
    fill_random(host, off + len, seed);
    if (!write_file(src, host, off + len)) return false;
    const uint64_t guard = 4096;
    CHECK(doff + len + guard <= dcap, "device buffer too small");
    CU(cu->cuMemsetD8(dbuf, 0xEE, doff + len + guard));
    void *dptr = (void *)(uintptr_t)(dbuf + doff);
    double t0 = now();
    if (use_gds) {
        ckptio_gds_file *g = NULL;
        OK(ckptio_gds_open(e, src, O_RDONLY, 0, &g));
        uint64_t got = 0;
        OK(ckptio_gds_read(g, (void *)(uintptr_t)dbuf, len, off, doff, &got));
        CHECK(got == len, "gds read moved %llu of %llu", (unsigned long long)got, (unsigned long long)len);
        OK(ckptio_gds_close(g));
    } else {
        ckptio_file *f = NULL;
        ckptio_plan *p = NULL;
        OK(ckptio_file_open(e, src, CKPTIO_OPEN_READ, &f));
        OK(ckptio_plan_create(CKPTIO_READ, &p));
        ckptio_extent ex = {.file = f, .file_offset = off, .length = len, .memory = dptr, .mem_kind = CKPTIO_MEM_AUTO};
        OK(ckptio_plan_add(p, &ex));
        OK(ckptio_engine_execute(e, p));
        ckptio_plan_destroy(p);
        OK(ckptio_file_close(f));
    }
    const double t_read = now() - t0;
    /* check: payload and the poison around it */
    size_t lo = doff >= 64 ? 64 : (size_t)doff;
    CU(cu->cuMemcpyDtoH(back, dbuf + doff - lo, lo + len + 64));
    for (size_t i = 0; i < lo; i++) CHECK(back[i] == 0xEE, "byte before the destination overwritten");
    long long d = first_diff(back + lo, host + off, len);
    CHECK(d < 0, "read len %llu off %llu doff %llu gds %d: byte %lld is 0x%02x, file has 0x%02x",
          (unsigned long long)len, (unsigned long long)off, (unsigned long long)doff, use_gds, d,
          back[lo + (size_t)d], host[off + (size_t)d]);
    for (size_t i = 0; i < 64; i++) CHECK(back[lo + len + i] == 0xEE, "byte after the destination overwritten");

    /* write the device bytes back out at the same offset into a fresh file */
    unlink(dst);
    t0 = now();
    if (use_gds) {
        ckptio_gds_file *g = NULL;
        OK(ckptio_gds_open(e, dst, O_RDWR | O_CREAT, 0644, &g));
        uint64_t put = 0;
        OK(ckptio_gds_write(g, (void *)(uintptr_t)dbuf, len, off, doff, &put));
        CHECK(put == len, "gds write moved %llu of %llu", (unsigned long long)put, (unsigned long long)len);
        OK(ckptio_gds_sync(g));
        OK(ckptio_gds_close(g));
    } else {
        ckptio_file *f = NULL;
        ckptio_plan *p = NULL;
        OK(ckptio_file_open(e, dst, CKPTIO_OPEN_WRITE, &f));
        OK(ckptio_plan_create(CKPTIO_WRITE, &p));
        ckptio_extent ex = {.file = f, .file_offset = off, .length = len, .memory = dptr, .mem_kind = CKPTIO_MEM_CUDA};
        OK(ckptio_plan_add(p, &ex));
        OK(ckptio_engine_execute(e, p));
        ckptio_plan_destroy(p);
        OK(ckptio_file_commit(f));
        OK(ckptio_file_close(f));
    }
    const double t_write = now() - t0;
    if (len) {
        struct stat sb;
        CHECK(stat(dst, &sb) == 0 && (uint64_t)sb.st_size == off + len, "written file size %lld, expected %llu",
              (long long)sb.st_size, (unsigned long long)(off + len));
        memset(back, 0, len);
        if (!read_file_at(dst, back, len, off)) return false;
        d = first_diff(back, host + off, len);
        CHECK(d < 0, "write len %llu off %llu gds %d: file byte %lld differs", (unsigned long long)len,
              (unsigned long long)off, use_gds, d);
    }
    if (len >= 256 * MIB)
        printf("   %6.2f GiB  read %.2f GB/s (page cache), write %.2f GB/s (%s)\n", len / (double)GIB,
               len / t_read / 1e9, len / t_write / 1e9, use_gds ? "gds api, fdatasync" : "plan, fsync+rename");
    unlink(src);
    unlink(dst);
    return true;
}

static bool check_sizes(ckptio_engine *e, bool quick) {
    const uint64_t big = quick ? 1 * GIB + 12345 : 4 * GIB + 12345; /* > 4 GiB: 32-bit overflow checks */
    const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, 1 * MIB + 3, 8 * MIB, 64 * MIB + 5, 257 * MIB + 4095, big};
    const uint64_t offs[] = {0, 1, 4096, 123457};
    const uint64_t dcap = big + 2 * MIB;
    CUdeviceptr dbuf = 0;
    CU(cu->cuMemAlloc(&dbuf, dcap));
    unsigned char *host = malloc(big + 200000), *back = malloc(big + 8192);
    CHECK(host && back, "host memory");
    bool ok = true;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0] && ok; si++) {
        for (size_t oi = 0; oi < sizeof offs / sizeof offs[0] && ok; oi++) {
            if (sizes[si] >= 256 * MIB && oi != 2 && oi != 1) continue; /* keep the big ones few */
            const uint64_t doff = (offs[oi] * 13 + 7) % 4096;
            for (int gds = 0; gds <= 1 && ok; gds++)
                ok = round_trip(e, sizes[si], offs[oi], doff, gds, host, back, dbuf, dcap, si * 10 + oi);
        }
        if (ok) printf("ok size %llu (all offsets, plans and GDS API)\n", (unsigned long long)sizes[si]);
    }
    free(host);
    free(back);
    CU(cu->cuMemFree(dbuf));
    return ok;
}

static bool check_forced_cufile(ckptio_engine *e) {
    char path[512];
    snprintf(path, sizeof path, "%s/ckptio_gpu_cufile.bin", dir);
    unsigned char data[8192];
    fill_random(data, sizeof data, 5);
    if (!write_file(path, data, sizeof data)) return false;
    OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_CUFILE));
    ckptio_gds_file *g = NULL;
    ckptio_status st = ckptio_gds_open(e, path, O_RDONLY, 0, &g);
    if (st != CKPTIO_OK) {
        printf("ok forced cuFile refused clearly: %s: %s\n", ckptio_status_name(st), ckptio_last_error_message());
        CHECK(st == CKPTIO_E_UNSUPPORTED || st == CKPTIO_E_NO_CUDA, "unexpected status %s", ckptio_status_name(st));
    } else {
        CUdeviceptr d = 0;
        CU(cu->cuMemAlloc(&d, sizeof data));
        uint64_t got = 0;
        OK(ckptio_gds_read(g, (void *)(uintptr_t)d, sizeof data, 0, 0, &got));
        unsigned char back[8192];
        CU(cu->cuMemcpyDtoH(back, d, sizeof data));
        CHECK(got == sizeof data && memcmp(back, data, sizeof data) == 0, "cuFile read differs");
        ckptio_io_path p;
        OK(ckptio_gds_file_path(g, &p));
        printf("ok forced cuFile works here: path %s\n", ckptio_io_path_name(p));
        CU(cu->cuMemFree(d));
        OK(ckptio_gds_close(g));
    }
    /* AUTO must fall back to the pipeline silently. */
    OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_AUTO));
    OK(ckptio_gds_open(e, path, O_RDONLY, 0, &g));
    printf("   AUTO: cuFile %s%s\n", ckptio_gds_file_refusal(g)[0] ? "not used: " : "used",
           ckptio_gds_file_refusal(g));
    OK(ckptio_gds_close(g));
    OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_PIPELINE));
    unlink(path);
    return true;
}

/* read_async -> add_one kernel -> (DtoH on the same stream); and
 * fill kernel -> write_async: every byte checked, several rounds. */
static bool check_stream_order(ckptio_engine *e) {
    const size_t n = 96 * MIB + 77;
    char path[512];
    snprintf(path, sizeof path, "%s/ckptio_gpu_async.bin", dir);
    unsigned char *data = malloc(n), *back = NULL;
    CHECK(data, "host memory");
    fill_random(data, n, 17);
    if (!write_file(path, data, n)) return false;
    CUstream s = NULL;
    CU(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d = 0;
    CU(cu->cuMemAlloc(&d, n + 4096));
    CU(cu->cuMemHostAlloc((void **)&back, n, 0));
    ckptio_gds_file *g = NULL;
    OK(ckptio_gds_open(e, path, O_RDWR, 0, &g));
    for (int round = 0; round < 3; round++) {
        CU(cu->cuMemsetD8(d, 0, n));
        /* a slow kernel first, so the read must really wait for it */
        unsigned v = 0x33;
        uint64_t nn = n;
        void *fp[] = {&d, &nn, &v};
        for (int i = 0; i < 20; i++) launch(k_fill, s, fp);
        ckptio_gds_request *r = NULL;
        OK(ckptio_gds_read_async(g, (void *)(uintptr_t)d, n, 0, 0, s, &r));
        void *ap[] = {&d, &nn};
        launch(k_add_one, s, ap);
        CU(cu->cuMemcpyDtoHAsync(back, d, n, s));
        CU(cu->cuStreamSynchronize(s));
        uint64_t bytes = 0;
        OK(ckptio_gds_request_wait(r, &bytes));
        OK(ckptio_gds_request_destroy(r));
        CHECK(bytes == n, "async read moved %llu", (unsigned long long)bytes);
        for (size_t i = 0; i < n; i++)
            CHECK(back[i] == (unsigned char)(data[i] + 1), "round %d: byte %zu is 0x%02x, expected file+1 = 0x%02x",
                  round, i, back[i], (unsigned char)(data[i] + 1));
        /* kernel writes 0x40+round, then write_async saves it */
        v = 0x40u + (unsigned)round;
        for (int i = 0; i < 10; i++) launch(k_fill, s, fp);
        OK(ckptio_gds_write_async(g, (void *)(uintptr_t)d, n, 0, 0, s, &r));
        OK(ckptio_gds_request_wait(r, &bytes));
        OK(ckptio_gds_request_destroy(r));
        memset(data, 0, n);
        if (!read_file_at(path, data, n, 0)) return false;
        for (size_t i = 0; i < n; i++)
            CHECK(data[i] == 0x40 + round, "round %d: file byte %zu is 0x%02x: write ran before the kernel", round, i,
                  data[i]);
        fill_random(data, n, 17 + round + 1);
        if (!write_file(path, data, n)) return false;
    }
    OK(ckptio_gds_close(g));
    CU(cu->cuMemFreeHost(back));
    CU(cu->cuMemFree(d));
    CU(cu->cuStreamDestroy(s));
    free(data);
    unlink(path);
    printf("ok stream-ordered read/write interleaved with kernels (3 rounds, %zu bytes)\n", n);
    return true;
}

static bool check_errors(ckptio_engine *e) {
    char path[512];
    snprintf(path, sizeof path, "%s/ckptio_gpu_err.bin", dir);
    unsigned char data[4096];
    fill_random(data, sizeof data, 3);
    if (!write_file(path, data, sizeof data)) return false;
    CUdeviceptr d = 0;
    CU(cu->cuMemAlloc(&d, 4096));
    ckptio_file *f = NULL;
    OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    ckptio_plan *p = NULL;
    OK(ckptio_plan_create(CKPTIO_READ, &p));
    ckptio_extent ex = {.file = f, .file_offset = 0, .length = 4096, .memory = (void *)(uintptr_t)(d + 100),
                        .mem_kind = CKPTIO_MEM_CUDA};
    OK(ckptio_plan_add(p, &ex));
    ckptio_status st = ckptio_engine_execute(e, p);
    CHECK(st == CKPTIO_E_RANGE, "overflowing device buffer gave %s", ckptio_status_name(st));
    printf("ok device buffer overflow refused: %s\n", ckptio_last_error_message());
    ckptio_plan_destroy(p);
    OK(ckptio_file_close(f));
    uint64_t fr = 0, tot = 0;
    OK(ckptio__gpu_mem_info(0, &fr, &tot));
    st = ckptio_gpu_check_free(0, tot + 1, path);
    CHECK(st == CKPTIO_E_DEVICE_OOM, "check_free gave %s", ckptio_status_name(st));
    printf("ok %s\n", ckptio_last_error_message());
    ckptio_mem_kind k;
    int dev;
    OK(ckptio_mem_classify((void *)(uintptr_t)d, &k, &dev));
    CHECK(k == CKPTIO_MEM_CUDA && dev == 0, "device memory classified as %d on %d", k, dev);
    void *pinned = NULL;
    CU(cu->cuMemHostAlloc(&pinned, 4096, 0));
    OK(ckptio_mem_classify(pinned, &k, &dev));
    CHECK(k == CKPTIO_MEM_PINNED, "pinned memory classified as %d", k);
    OK(ckptio_mem_classify(data, &k, &dev));
    CHECK(k == CKPTIO_MEM_HOST, "stack memory classified as %d", k);
    CU(cu->cuMemFreeHost(pinned));
    CU(cu->cuMemFree(d));
    unlink(path);
    printf("ok classification (device, pinned, pageable)\n");
    return true;
}

int main(int argc, char **argv) {
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = true;
        else dir = argv[i];
    }
    int ndev = 0;
    if (ckptio_cuda_available(&ndev) != CKPTIO_OK) {
        printf("SKIP: %s\n", ckptio_last_error_message());
        return 77;
    }
    if (ckptio__cuda_load(&cu) != CKPTIO_OK || !cu->cuModuleLoadData || !cu->cuLaunchKernel) {
        printf("FAIL: driver lacks module/launch entry points\n");
        return 1;
    }
    CUdevice dev0;
    CUcontext ctx;
    CU(cu->cuDeviceGet(&dev0, 0));
    CU(cu->cuDevicePrimaryCtxRetain(&ctx, dev0));
    CU(cu->cuCtxPushCurrent(ctx));
    char name[256] = "";
    cu->cuDeviceGetName(name, sizeof name, dev0);
    printf("device 0: %s, %d device(s), driver %d, ckptio %s\n", name, ndev, cu->driver_version, ckptio_version());
    CUmodule mod;
    CU(cu->cuModuleLoadData(&mod, ptx));
    CU(cu->cuModuleGetFunction(&k_add_one, mod, "add_one"));
    CU(cu->cuModuleGetFunction(&k_fill, mod, "fill"));

    ckptio_engine *e = NULL;
    if (ckptio_engine_create(&e) != CKPTIO_OK) {
        printf("FAIL: engine: %s\n", ckptio_last_error_message());
        return 1;
    }
    ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_PIPELINE);
    const double t0 = now();
    bool ok = check_errors(e);
    ok = check_forced_cufile(e) && ok;
    ok = check_stream_order(e) && ok;
    ok = check_sizes(e, quick) && ok;
    ckptio_stats st;
    ckptio_engine_stats(e, &st);
    printf("stats: h2d %.2f GiB, d2h %.2f GiB, staging reserved %.1f MiB (peak in use %.1f MiB), copy wait %.2f s, "
           "cufile %llu bytes\n",
           st.bytes_h2d / (double)GIB, st.bytes_d2h / (double)GIB, st.staging_reserved / (double)MIB,
           st.staging_peak / (double)MIB, st.seconds_copy, (unsigned long long)st.bytes_cufile);
    ckptio_io_path p;
    ckptio_engine_gpu_path(e, &p);
    printf("last engine GPU path: %s\n", ckptio_io_path_name(p));
    ckptio_engine_destroy(e);
    cu->cuModuleUnload(mod);
    printf("%s (%d failures) in %.1f s\n", ok && !failures ? "ALL GPU CHECKS PASSED" : "GPU CHECKS FAILED", failures,
           now() - t0);
    return ok && !failures ? 0 : 1;
}
