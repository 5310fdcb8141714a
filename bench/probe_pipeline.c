/*
 * probe_pipeline.c - ckptio's GPU read pipeline rebuilt in C, alone, to see
 * which of its parameters bound a load from the page cache or tmpfs.
 *
 * bench/probe_copy_contention.py's "windows" probe does the same in Python,
 * where 16 threads issuing a copy per 2 MiB window contend for the GIL; this
 * one has no interpreter between the reads and the copies, so its numbers
 * are what the pipeline's structure allows on the machine.
 *
 * Each of THREADS workers has its own stream, SLOTS pinned slots of WINDOW
 * bytes and an event per slot. Workers claim windows of the files (every
 * byte of every file, in order) from one counter and, per window: wait the
 * slot's event -> fill the slot (pread of the file, or memcpy from a
 * read-only mapping of it) -> cuMemcpyHtoDAsync to one device buffer ->
 * record the event. Modes: "staged" (all of it), "dma" (no fill: what the
 * copies alone reach), "fill" (no copy: what the CPU side alone reaches).
 * Slots are pinned before the clock starts (a later load's case).
 *
 *   cc -O2 -I$CUDA_HOME/include bench/probe_pipeline.c -o probe_pipeline \
 *      -L$CUDA_HOME/lib64/stubs -lcuda -lpthread
 *   ./probe_pipeline DIR mode=staged threads=16 window=2 slots=4 fill=pread passes=3 huge=0 fresh=0
 *   (window in MiB; fill=pread|mmap; huge=1 backs the slots with transparent huge pages; fresh=1
 *   frees the device buffer and allocates it anew before each pass, untimed, as loads into new tensors
 *   after torch.cuda.empty_cache() do; fresh=2 the same, then waits 1 s before the clock starts (does
 *   the driver finish something in the background?); fresh=3 the same, then fills the new buffer with
 *   cuMemsetD8 first (untimed; its time is printed: is it a first touch?); fresh=4 allocates a new
 *   buffer each pass without freeing the old (memory this process never had); wc=1: slots from
 *   cuMemHostAlloc(WRITECOMBINED) instead of registered pages; streams=N: the workers share N streams
 *   (worker t queues on stream t % N) instead of one each)
 *
 * Prints one line: the parameters, GB/s of each pass, the best, and the
 * process's CPU seconds per GB moved.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "probe_util.h"

#define MAX_FILES 64
#define MAX_THREADS 64
#define MAX_SLOTS 16

typedef struct {
    int fd;
    size_t size;
    const unsigned char *map; /* fill=mmap: the whole file, read-only, populated */
    uint64_t base;            /* offset of the file's bytes in the device buffer */
} file_t;

static file_t files[MAX_FILES];
static int nfiles;
static uint64_t total;
static CUcontext ctx;
static CUdeviceptr dst;
static size_t window, nwindows;
static unsigned threads = 16, nslots = 4;
static int mode_dma = 1, mode_fill = 1, fill_mmap = 0, huge = 0, fresh = 0, wc = 0;
static unsigned nstreams = 0; /* 0: a stream per worker; N: the workers share N streams */
static atomic_size_t next_window;

/* Window w: file index and offset (windows never span files). */
static void locate(size_t w, int *fi, uint64_t *off, size_t *len) {
    for (int i = 0; i < nfiles; i++) {
        const size_t nw = (files[i].size + window - 1) / window;
        if (w < nw) {
            *fi = i;
            *off = (uint64_t)w * window;
            *len = files[i].size - *off < window ? files[i].size - *off : window;
            return;
        }
        w -= nw;
    }
    *fi = -1;
}

typedef struct {
    unsigned char *slot[MAX_SLOTS];
    CUevent event[MAX_SLOTS];
    CUstream stream;
    int pending[MAX_SLOTS];
} worker_t;

static worker_t workers[MAX_THREADS];

static void *pin(size_t bytes) {
    if (wc) { /* the driver's own pinned pages, write-combined: the CPU writes them, only the GPU reads them */
        void *h = NULL;
        CHECK(cuMemHostAlloc(&h, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                            CU_MEMHOSTALLOC_WRITECOMBINED));
        memset(h, 0, bytes);
        return h;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    CHECK(cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    return p;
}

static void *run_worker(void *arg) {
    worker_t *wk = arg;
    CHECK(cuCtxSetCurrent(ctx));
    unsigned n = 0;
    for (;;) {
        const size_t w = atomic_fetch_add(&next_window, 1);
        if (w >= nwindows) break;
        int fi = -1;
        uint64_t off = 0;
        size_t len = 0;
        locate(w, &fi, &off, &len);
        const unsigned s = n++ % nslots;
        if (wk->pending[s]) CHECK(cuEventSynchronize(wk->event[s]));
        if (mode_fill) {
            if (fill_mmap) {
                memcpy(wk->slot[s], files[fi].map + off, len);
            } else {
                size_t got = 0;
                while (got < len) {
                    const ssize_t r = pread(files[fi].fd, wk->slot[s] + got, len - got, (off_t)(off + got));
                    if (r <= 0) {
                        perror("pread");
                        exit(1);
                    }
                    got += (size_t)r;
                }
            }
        }
        if (mode_dma) {
            CHECK(cuMemcpyHtoDAsync(dst + files[fi].base + off, wk->slot[s], len, wk->stream));
            CHECK(cuEventRecord(wk->event[s], wk->stream));
            wk->pending[s] = 1;
        }
    }
    CHECK(cuStreamSynchronize(wk->stream));
    for (unsigned s = 0; s < nslots; s++) wk->pending[s] = 0;
    return NULL;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [mode=staged|dma|fill] [threads=N] [window=MiB] [slots=N] "
                        "[fill=pread|mmap] [passes=N] [huge=0|1] [fresh=0..4] [wc=0|1] [streams=N]\n", argv[0]);
        return 2;
    }
    const char *mode = "staged", *fill = "pread";
    unsigned passes = 3;
    double window_mib = 2;
    for (int i = 2; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) continue;
        *eq = '\0';
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "mode")) mode = v;
        else if (!strcmp(k, "threads")) threads = (unsigned)atoi(v);
        else if (!strcmp(k, "window")) window_mib = atof(v);
        else if (!strcmp(k, "slots")) nslots = (unsigned)atoi(v);
        else if (!strcmp(k, "fill")) fill = v;
        else if (!strcmp(k, "passes")) passes = (unsigned)atoi(v);
        else if (!strcmp(k, "huge")) huge = atoi(v);
        else if (!strcmp(k, "fresh")) fresh = atoi(v);
        else if (!strcmp(k, "wc")) wc = atoi(v);
        else if (!strcmp(k, "streams")) nstreams = (unsigned)atoi(v);
        else {
            fprintf(stderr, "unknown parameter %s\n", k);
            return 2;
        }
    }
    if (threads < 1 || threads > MAX_THREADS || nslots < 1 || nslots > MAX_SLOTS) {
        fprintf(stderr, "threads 1..%d, slots 1..%d\n", MAX_THREADS, MAX_SLOTS);
        return 2;
    }
    mode_dma = strcmp(mode, "fill") != 0;
    mode_fill = strcmp(mode, "dma") != 0;
    fill_mmap = !strcmp(fill, "mmap");
    window = (size_t)(window_mib * (1 << 20));
    window &= ~(size_t)4095;

    DIR *d = opendir(argv[1]);
    if (!d) {
        perror(argv[1]);
        return 1;
    }
    char *names[MAX_FILES];
    int nn = 0;
    for (struct dirent *e; (e = readdir(d)) && nn < MAX_FILES;) {
        const size_t l = strlen(e->d_name);
        if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)nn, sizeof names[0], by_name);
    for (int i = 0; i < nn; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], names[i]);
        file_t *f = &files[nfiles++];
        f->fd = open(path, O_RDONLY);
        struct stat st;
        if (f->fd < 0 || fstat(f->fd, &st) != 0) {
            perror(path);
            return 1;
        }
        f->size = (size_t)st.st_size;
        f->base = total;
        total += (f->size + 4095) & ~(uint64_t)4095;
        nwindows += (f->size + window - 1) / window;
        if (fill_mmap) {
            f->map = mmap(NULL, f->size, PROT_READ, MAP_SHARED | MAP_POPULATE, f->fd, 0);
            if (f->map == MAP_FAILED) {
                perror("mmap file");
                return 1;
            }
        }
        free(names[i]);
    }
    if (!nfiles) {
        fprintf(stderr, "no .safetensors files in %s\n", argv[1]);
        return 1;
    }

    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&dst, total));
    for (unsigned t = 0; t < threads; t++) {
        if (nstreams && t >= nstreams) workers[t].stream = workers[t % nstreams].stream;
        else CHECK(cuStreamCreate(&workers[t].stream, CU_STREAM_NON_BLOCKING));
        for (unsigned s = 0; s < nslots; s++) {
            workers[t].slot[s] = pin(window);
            CHECK(cuEventCreate(&workers[t].event[s], CU_EVENT_DISABLE_TIMING));
        }
    }
    printf("mode=%s fill=%s threads=%u window=%gMiB slots=%u huge=%d fresh=%d wc=%d streams=%u files=%d GB=%.2f:", mode,
           fill, threads, window_mib, nslots, huge, fresh, wc, nstreams, nfiles, total / 1e9);
    double best = 0, cpu = 0;
    for (unsigned pass = 0; pass < passes; pass++) {
        atomic_store(&next_window, 0);
        if (fresh && pass) { /* a new destination each pass, as a load into new tensors has */
            if (fresh != 4) CHECK(cuMemFree(dst));
            CHECK(cuMemAlloc(&dst, total));
            if (fresh == 2) {
                CHECK(cuCtxSynchronize());
                sleep(1);
            } else if (fresh == 3) {
                const double m0 = now();
                CHECK(cuMemsetD8(dst, 0, total));
                CHECK(cuCtxSynchronize());
                printf(" [memset %.1f ms]", (now() - m0) * 1e3);
            }
        }
        pthread_t th[MAX_THREADS];
        const double c0 = cpu_seconds(), t0 = now();
        for (unsigned t = 0; t < threads; t++) pthread_create(&th[t], NULL, run_worker, &workers[t]);
        for (unsigned t = 0; t < threads; t++) pthread_join(th[t], NULL);
        const double dt = now() - t0;
        cpu += cpu_seconds() - c0;
        const double gbps = total / dt / 1e9;
        if (gbps > best) best = gbps;
        printf(" %.2f", gbps);
    }
    printf(" | best %.2f GB/s  cpu %.3f s/GB\n", best, cpu / (passes * total / 1e9));
    return 0;
}
