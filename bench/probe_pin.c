/*
 * probe_pin.c - what pinning ckptio's staging slots costs, split into the
 * kernel's part and the driver's part, and what parallel fills would save.
 *
 * Pinning a slot is two steps: the kernel maps anonymous memory and fills it
 * (huge=1: a 2 MiB-aligned slot inside a larger reservation, MADV_HUGEPAGE,
 * then MADV_POPULATE_WRITE, or memset where the kernel (< 5.14) lacks it;
 * huge=0: mmap with MAP_POPULATE), then the driver registers it
 * (cuMemHostRegister, PORTABLE | DEVICEMAP). Today both happen under one
 * lock. If the T workers filled their own slots in parallel and only the
 * registrations were serialised, how long until all N slots are pinned?
 *
 * Phases, each on new memory (slots are unregistered and unmapped after each,
 * untimed):
 *   serial  - one thread, per slot: fill, register
 *   locked  - T threads, per slot: fill + register under one mutex (today)
 *   split   - T threads fill their slots without the lock, then register
 *             each under the mutex
 *   prefill - T threads fill all slots, then one thread registers them all
 *   region-split, region-prefill - split and prefill again, but every slot
 *             lies in one mapping made (and advised MADV_HUGEPAGE) before the
 *             clock starts: the threads only fault their pages in. mmap and
 *             madvise(MADV_HUGEPAGE) take the process's mmap lock for
 *             writing, which waits for every fault in progress and holds
 *             off new ones; if the fills above do not scale with threads
 *             because of that, these do.
 * The context is made current and touched (a 1 MiB cuMemAlloc) first.
 *
 *   cc -O2 -I$CUDA_HOME/include bench/probe_pin.c -o probe_pin \
 *      -L$CUDA_HOME/lib64/stubs -lcuda -lpthread
 *   ./probe_pin slots=32 mib=4 huge=1 threads=16 device=0
 *
 * Prints one line per phase (wall ms; fill and register ms summed over
 * slots) and the change in /proc/vmstat's thp_fault_alloc (huge pages?).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "probe_util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define HUGE_SZ ((size_t)2 << 20)
#define MAX_THREADS 256

typedef struct {
    unsigned char *res; /* the mapping (huge=1: the reservation around p) */
    size_t res_len;
    unsigned char *p;
    double fill_s, reg_s;
} slot_t;

enum { LOCKED, SPLIT, FILL_ONLY };

static CUcontext ctx;
static slot_t *slots;
static unsigned nslots = 32, threads = 16;
static size_t bytes;
static int huge = 1;
static int mode;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_barrier_t start;
static unsigned char *region; /* region phases: the one mapping holding every slot */
static size_t region_len;

static long thp_fault_alloc(void) {
    FILE *f = fopen("/proc/vmstat", "r");
    char key[64];
    long v, r = -1;
    if (!f) return -1;
    while (fscanf(f, "%63s %ld", key, &v) == 2)
        if (!strcmp(key, "thp_fault_alloc")) r = v;
    fclose(f);
    return r;
}

static void fill(slot_t *s) {
    const double t0 = now();
    if (region) {
        s->p = region + (size_t)(s - slots) * bytes;
        if (madvise(s->p, bytes, MADV_POPULATE_WRITE) != 0) {
            if (errno != EINVAL) { perror("madvise(MADV_POPULATE_WRITE)"); exit(1); }
            memset(s->p, 0, bytes);
        }
    } else if (huge) {
        s->res_len = bytes + HUGE_SZ;
        s->res = mmap(NULL, s->res_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s->res == MAP_FAILED) { perror("mmap"); exit(1); }
        s->p = (unsigned char *)(((uintptr_t)s->res + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
        if (madvise(s->p, bytes, MADV_HUGEPAGE) != 0) { perror("madvise(MADV_HUGEPAGE)"); exit(1); }
        if (madvise(s->p, bytes, MADV_POPULATE_WRITE) != 0) {
            if (errno != EINVAL) { perror("madvise(MADV_POPULATE_WRITE)"); exit(1); }
            memset(s->p, 0, bytes); /* kernel < 5.14 */
        }
    } else {
        s->res_len = bytes;
        s->res = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (s->res == MAP_FAILED) { perror("mmap"); exit(1); }
        s->p = s->res;
    }
    s->fill_s = now() - t0;
}

static void reg(slot_t *s) {
    const double t0 = now();
    CHECK(cuMemHostRegister(s->p, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    s->reg_s = now() - t0;
}

static void *run_worker(void *arg) {
    const unsigned t = (unsigned)(uintptr_t)arg;
    CHECK(cuCtxSetCurrent(ctx));
    pthread_barrier_wait(&start);
    for (unsigned i = t; i < nslots; i += threads) { /* slots t, t+T, ... */
        if (mode == LOCKED) pthread_mutex_lock(&lock);
        fill(&slots[i]);
        if (mode == LOCKED) { reg(&slots[i]); pthread_mutex_unlock(&lock); }
    }
    if (mode == SPLIT)
        for (unsigned i = t; i < nslots; i += threads) {
            pthread_mutex_lock(&lock);
            reg(&slots[i]);
            pthread_mutex_unlock(&lock);
        }
    return NULL;
}

/* Runs the T workers in mode m; returns wall seconds from their release to the last one's end. */
static double run_threads(int m) {
    pthread_t tid[MAX_THREADS];
    mode = m;
    pthread_barrier_init(&start, NULL, threads + 1);
    for (unsigned t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, run_worker, (void *)(uintptr_t)t) != 0) { perror("pthread_create"); exit(1); }
    pthread_barrier_wait(&start);
    const double t0 = now();
    for (unsigned t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    const double dt = now() - t0;
    pthread_barrier_destroy(&start);
    return dt;
}

static void sums(double *fill_ms, double *reg_ms) {
    *fill_ms = *reg_ms = 0;
    for (unsigned i = 0; i < nslots; i++) { *fill_ms += slots[i].fill_s * 1e3; *reg_ms += slots[i].reg_s * 1e3; }
}

static void release(void) {
    for (unsigned i = 0; i < nslots; i++) {
        CHECK(cuMemHostUnregister(slots[i].p));
        if (slots[i].res && munmap(slots[i].res, slots[i].res_len) != 0) { perror("munmap"); exit(1); }
    }
    if (region && munmap(region, region_len) != 0) { perror("munmap"); exit(1); }
    region = NULL;
    memset(slots, 0, nslots * sizeof *slots);
}

static void report(const char *name, double total_s, const char *extra) {
    double f, r;
    sums(&f, &r);
    printf("%s slots=%u mib=%zu huge=%d threads=%u: total %.1f ms %s(fill %.1f ms, register %.1f ms summed; "
           "per slot fill %.2f register %.2f)\n",
           name, nslots, bytes >> 20, huge, threads, total_s * 1e3, extra, f, r, f / nslots, r / nslots);
}

/* The T workers fill every slot, then this thread registers them all. */
static void prefill(const char *name) {
    char extra[96];
    const double fill_wall = run_threads(FILL_ONLY);
    const double t0 = now();
    for (unsigned i = 0; i < nslots; i++) reg(&slots[i]);
    const double reg_wall = now() - t0;
    snprintf(extra, sizeof extra, "= parallel fill %.1f ms + serial register %.1f ms ", fill_wall * 1e3, reg_wall * 1e3);
    report(name, fill_wall + reg_wall, extra);
}

int main(int argc, char **argv) {
    unsigned mib = 4, device = 0;
    for (int i = 1; i < argc; i++) {
        if (sscanf(argv[i], "slots=%u", &nslots) == 1 || sscanf(argv[i], "mib=%u", &mib) == 1 ||
            sscanf(argv[i], "huge=%d", &huge) == 1 || sscanf(argv[i], "threads=%u", &threads) == 1 ||
            sscanf(argv[i], "device=%u", &device) == 1)
            continue;
        fprintf(stderr, "usage: %s [slots=N] [mib=S] [huge=0|1] [threads=T] [device=D]\n", argv[0]);
        return 1;
    }
    if (!nslots || !mib || !threads || threads > MAX_THREADS) {
        fprintf(stderr, "slots, mib must be > 0; threads in 1..%d\n", MAX_THREADS);
        return 1;
    }
    bytes = (size_t)mib << 20;
    slots = calloc(nslots, sizeof *slots);
    if (!slots) { perror("calloc"); return 1; }

    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, (int)device));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUdeviceptr warm;
    CHECK(cuMemAlloc(&warm, 1 << 20));

    const long thp0 = thp_fault_alloc();

    double t0 = now();
    for (unsigned i = 0; i < nslots; i++) { fill(&slots[i]); reg(&slots[i]); }
    report("serial", now() - t0, "");
    release();

    report("locked", run_threads(LOCKED), "");
    release();

    report("split", run_threads(SPLIT), "");
    release();

    prefill("prefill");
    release();

    for (int k = 0; k < 2; k++) {
        region_len = nslots * bytes + HUGE_SZ;
        unsigned char *map = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) { perror("mmap"); exit(1); }
        region = (unsigned char *)(((uintptr_t)map + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
        if (huge && madvise(region, nslots * bytes, MADV_HUGEPAGE) != 0) { perror("madvise(MADV_HUGEPAGE)"); exit(1); }
        if (k == 0) {
            report("region-split", run_threads(SPLIT), "");
        } else {
            prefill("region-prefill");
        }
        region = map; /* release() unmaps the whole mapping */
        release();
    }

    const long thp1 = thp_fault_alloc();
    if (thp0 < 0 || thp1 < 0) printf("thp_fault_alloc unavailable\n");
    else printf("thp_fault_alloc +%ld (2 MiB pages throughout, 6 phases: %zu)\n", thp1 - thp0,
                6 * nslots * (bytes / HUGE_SZ));

    CHECK(cuMemFree(warm));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
