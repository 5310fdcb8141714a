/*
 * probe_register_flags.c - what one staging slot's registration costs by
 * cuMemHostRegister's flags, alone and beside running copies (issue 17).
 *
 * A process's first load starts its 16 workers one registration apart
 * (~0.4 ms each on an H200, bench/probe_copy_timeline.py): the driver pins
 * one allocation at a time. ckptio registers with PORTABLE | DEVICEMAP; this
 * asks whether other flags register faster and still copy at the pinned
 * rate.
 *
 *   cc -O2 -I$CUDA_HOME/include bench/probe_register_flags.c -o probe_register_flags \
 *      -L$CUDA_HOME/lib64/stubs -lcuda
 *   ./probe_register_flags [slots=16] [mib=4] [rounds=3]
 *
 * For each flag set, each round: 16 slots of 4 MiB in one 2 MiB-aligned
 * range advised MADV_HUGEPAGE, faulted in by touching, then registered one
 * by one (quiet: nothing else on the GPU), copied to the device (4 MiB
 * pieces, one stream, 8 passes: GB/s), unregistered; then registered again
 * while a stream copies 2 GiB from another pinned buffer (busy). Prints one
 * JSON line per flag set and round: register ms per slot (median, max),
 * copy GB/s, busy register ms per slot (median, max).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "probe_util.h"

#define HUGE_SZ ((size_t)2 << 20)
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Registers n slots one by one; per-slot ms into ms[]. */
static void register_all(unsigned char **slot, unsigned n, size_t bytes, unsigned flags, double *ms) {
    for (unsigned i = 0; i < n; i++) {
        const double t = now();
        CHECK(cuMemHostRegister(slot[i], bytes, flags));
        ms[i] = (now() - t) * 1e3;
    }
}

static void unregister_all(unsigned char **slot, unsigned n) {
    for (unsigned i = 0; i < n; i++) CHECK(cuMemHostUnregister(slot[i]));
}

static void median_max(double *ms, unsigned n, double *med, double *max) {
    qsort(ms, n, sizeof *ms, cmp_double);
    *med = ms[n / 2];
    *max = ms[n - 1];
}

int main(int argc, char **argv) {
    unsigned nslots = 16, mib = 4, rounds = 3;
    for (int i = 1; i < argc; i++)
        if (sscanf(argv[i], "slots=%u", &nslots) != 1 && sscanf(argv[i], "mib=%u", &mib) != 1 &&
            sscanf(argv[i], "rounds=%u", &rounds) != 1) {
            fprintf(stderr, "usage: %s [slots=N] [mib=S] [rounds=R]\n", argv[0]);
            return 1;
        }
    if (!nslots || nslots > 256 || !mib) return 1;
    const size_t bytes = (size_t)mib << 20;
    CHECK(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUstream st, busy;
    CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d, dbusy;
    CHECK(cuMemAlloc(&d, bytes * nslots));
    const size_t busy_bytes = (size_t)2 << 30, busy_piece = (size_t)64 << 20;
    CHECK(cuMemAlloc(&dbusy, busy_piece));
    void *hbusy;
    CHECK(cuMemHostAlloc(&hbusy, busy_piece, 0));
    memset(hbusy, 1, busy_piece);

    const unsigned flag_sets[] = {0x3, 0x2, 0x1, 0x0, 0x8, 0xa};
    const char *names[] = {"PORTABLE|DEVICEMAP", "DEVICEMAP", "PORTABLE", "0", "READ_ONLY", "DEVICEMAP|READ_ONLY"};
    double *ms = calloc(nslots, sizeof *ms);
    unsigned char **slot = calloc(nslots, sizeof *slot);
    for (unsigned r = 0; r < rounds; r++) {
        for (unsigned f = 0; f < sizeof flag_sets / sizeof flag_sets[0]; f++) {
            const size_t len = bytes * nslots + HUGE_SZ;
            unsigned char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (map == MAP_FAILED) { perror("mmap"); return 1; }
            unsigned char *base = (unsigned char *)(((uintptr_t)map + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
            (void)madvise(base, bytes * nslots, MADV_HUGEPAGE);
            for (size_t off = 0; off < bytes * nslots; off += 4096) base[off] = 1;
            for (unsigned i = 0; i < nslots; i++) slot[i] = base + (size_t)i * bytes;

            const CUresult probe = cuMemHostRegister(slot[0], bytes, flag_sets[f]);
            if (probe != CUDA_SUCCESS) {
                const char *s = NULL;
                cuGetErrorName(probe, &s);
                printf("{\"flags\": \"%s\", \"round\": %u, \"refused\": \"%s\"}\n", names[f], r, s ? s : "?");
                munmap(map, len);
                continue;
            }
            CHECK(cuMemHostUnregister(slot[0]));
            double q_med, q_max, b_med, b_max;
            register_all(slot, nslots, bytes, flag_sets[f], ms);
            median_max(ms, nslots, &q_med, &q_max);
            CHECK(cuStreamSynchronize(st));
            const double t0 = now();
            for (unsigned p = 0; p < 8; p++)
                for (unsigned i = 0; i < nslots; i++)
                    CHECK(cuMemcpyHtoDAsync(d + (CUdeviceptr)(i * bytes), slot[i], bytes, st));
            CHECK(cuStreamSynchronize(st));
            const double gbps = 8.0 * (double)(bytes * nslots) / (now() - t0) / 1e9;
            unregister_all(slot, nslots);
            /* Again beside copies from another pinned buffer (~40 ms of them queued). */
            for (size_t done = 0; done < busy_bytes; done += busy_piece)
                CHECK(cuMemcpyHtoDAsync(dbusy, hbusy, busy_piece, busy));
            register_all(slot, nslots, bytes, flag_sets[f], ms);
            const CUresult still = cuStreamQuery(busy);
            median_max(ms, nslots, &b_med, &b_max);
            CHECK(cuStreamSynchronize(busy));
            unregister_all(slot, nslots);
            munmap(map, len);
            printf("{\"flags\": \"%s\", \"round\": %u, \"register_ms_median\": %.3f, \"register_ms_max\": %.3f, "
                   "\"copy_GBps\": %.2f, \"busy_register_ms_median\": %.3f, \"busy_register_ms_max\": %.3f, "
                   "\"copies_still_running_after\": %s}\n",
                   names[f], r, q_med, q_max, gbps, b_med, b_max, still == CUDA_ERROR_NOT_READY ? "true" : "false");
        }
    }
    return 0;
}
