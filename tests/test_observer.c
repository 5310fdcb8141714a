/*
 * test_observer.c - the write-plan observer contract (ckptio__plan_set_observer):
 * every byte of every extent observed exactly once, calls inside their
 * extent, bytes equal to what is written (on the simulated GPU: the staging
 * copy after its device-to-host copy completed, still intact when the
 * observer returns), block boundaries never crossed and whole blocks where
 * promised; read plans and forced cuFile refuse an observer.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "helpers.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define MAX_EXT 16

typedef struct recorder {
    pthread_mutex_t lock;
    size_t n;
    const unsigned char *src[MAX_EXT]; /* host copy of each extent's bytes */
    uint64_t len[MAX_EXT];
    unsigned char *count[MAX_EXT];     /* times each byte was observed */
    uint64_t block;
    uint64_t calls, whole_blocks, pieces;
    bool slow;                         /* sleep in some calls, then re-check the bytes */
    char error[256];
} recorder;

static void rec_error(recorder *r, const char *msg, size_t extent, uint64_t off, uint64_t len) {
    if (!r->error[0]) snprintf(r->error, sizeof r->error, "%s (extent %zu, offset %llu, %llu bytes)", msg, extent,
                               (unsigned long long)off, (unsigned long long)len);
}

static void observe(void *user, size_t extent, uint64_t off, const void *bytes, uint64_t len) {
    recorder *r = user;
    pthread_mutex_lock(&r->lock);
    r->calls++;
    if (extent >= r->n) rec_error(r, "extent index out of range", extent, off, len);
    else if (len == 0 || off + len > r->len[extent]) rec_error(r, "call outside its extent", extent, off, len);
    else if (r->block && off / r->block != (off + len - 1) / r->block)
        rec_error(r, "call crosses a block boundary", extent, off, len);
    pthread_mutex_unlock(&r->lock);
    if (r->error[0]) return;
    const bool sleepy = r->slow && (off / 4096) % 3 == 0;
    if (memcmp(bytes, r->src[extent] + off, len) != 0) {
        pthread_mutex_lock(&r->lock);
        rec_error(r, ((const unsigned char *)bytes)[0] == CKPTIO_SIM_POISON_D2H
                         ? "observed staging before its copy completed (poison)"
                         : "observed bytes differ from the source",
                  extent, off, len);
        pthread_mutex_unlock(&r->lock);
        return;
    }
    if (sleepy) {
        /* If the slot were refilled while we are still looking, the bytes
         * would change (or turn to poison) under us. */
        usleep(2000);
        if (memcmp(bytes, r->src[extent] + off, len) != 0) {
            pthread_mutex_lock(&r->lock);
            rec_error(r, "staging changed while the observer was still running", extent, off, len);
            pthread_mutex_unlock(&r->lock);
            return;
        }
    }
    pthread_mutex_lock(&r->lock);
    for (uint64_t i = 0; i < len; i++) r->count[extent][off + i]++;
    if (r->block) {
        const uint64_t want = r->len[extent] - off < r->block ? r->len[extent] - off : r->block;
        if (off % r->block == 0 && len == want) r->whole_blocks++;
        else r->pieces++;
    }
    pthread_mutex_unlock(&r->lock);
}

static void rec_init(recorder *r, uint64_t block, bool slow) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
    r->block = block;
    r->slow = slow;
}

static void rec_add(recorder *r, const unsigned char *src, uint64_t len) {
    T_ASSERT(r->n < MAX_EXT);
    r->src[r->n] = src;
    r->len[r->n] = len;
    r->count[r->n] = calloc(len ? len : 1, 1);
    T_ASSERT(r->count[r->n]);
    r->n++;
}

/* Every byte exactly once, no contract error. */
static void rec_check(recorder *r, const char *what) {
    T_ASSERT_MSG(!r->error[0], "%s: %s", what, r->error);
    for (size_t x = 0; x < r->n; x++)
        for (uint64_t i = 0; i < r->len[x]; i++)
            T_ASSERT_MSG(r->count[x][i] == 1, "%s: extent %zu byte %llu observed %u times", what, x,
                         (unsigned long long)i, r->count[x][i]);
}

static void rec_free(recorder *r) {
    for (size_t x = 0; x < r->n; x++) free(r->count[x]);
    pthread_mutex_destroy(&r->lock);
}

static ckptio_engine *make_engine(int64_t threads, int64_t staging, int64_t chunk) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, staging));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, chunk));
    return e;
}

/* Extents at odd offsets and lengths around chunk and block sizes; with
 * `gpu`, every other one lives in simulated device memory. Returns the
 * file's expected contents. */
typedef struct layout {
    uint64_t off[MAX_EXT], len[MAX_EXT];
    size_t n;
    uint64_t size;
} layout;

static layout make_layout(void) {
    const uint64_t lens[] = {1, 4095, 300 * KIB + 7, 0, 1 * MIB + 4096, 77, 2 * MIB + 12345, 64 * KIB, 5 * MIB + 3};
    layout l = {0};
    uint64_t pos = 123; /* unaligned start; extents adjacent, one gap */
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        if (i == 5) pos += 10000;
        l.off[l.n] = pos;
        l.len[l.n++] = lens[i];
        pos += lens[i];
    }
    l.size = pos;
    return l;
}

static void run_case(int64_t threads, int64_t staging, int64_t chunk, uint64_t block, bool gpu, bool slow,
                     unsigned delay_us, bool expect_whole) {
    char what[160];
    snprintf(what, sizeof what, "threads %lld staging %lld chunk %lld block %llu %s", (long long)threads,
             (long long)staging, (long long)chunk, (unsigned long long)block, gpu ? "gpu+host" : "host");
    ckptio__gpu_sim_config cfg = {.copy_delay_us = delay_us};
    ckptio__gpu_sim_configure(&cfg);
    ckptio_engine *e = make_engine(threads, staging, chunk);
    const layout l = make_layout();
    unsigned char *want = calloc(l.size, 1);
    T_ASSERT(want);
    t_fill_random(want, l.size, 1000 + (uint64_t)threads + block);
    void *mem[MAX_EXT] = {0};
    recorder r;
    rec_init(&r, block, slow);
    const char *path = t_path("observer.bin");
    unlink(path);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE, &f));
    ckptio_plan *p = NULL;
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    for (size_t i = 0; i < l.n; i++) {
        const bool dev = gpu && i % 2 == 0;
        mem[i] = dev ? ckptio__gpu_sim_device_alloc(l.len[i] + 1) : malloc(l.len[i] + 1);
        T_ASSERT(mem[i]);
        memcpy(mem[i], want + l.off[i], l.len[i]);
        ckptio_extent ex = {.file = f, .file_offset = l.off[i], .length = l.len[i], .memory = mem[i],
                            .mem_kind = dev ? CKPTIO_MEM_CUDA : CKPTIO_MEM_HOST};
        T_OK(ckptio_plan_add(p, &ex));
        rec_add(&r, want + l.off[i], l.len[i]);
    }
    T_OK(ckptio__plan_set_observer(p, observe, &r, block));
    T_OK(ckptio_engine_execute(e, p));
    T_OK(ckptio_file_close(f));
    rec_check(&r, what);
    if (block && expect_whole)
        T_ASSERT_MSG(r.pieces == 0 && r.whole_blocks > 0, "%s: %llu blocks came in pieces (%llu whole)", what,
                     (unsigned long long)r.pieces, (unsigned long long)r.whole_blocks);
    if (block && !expect_whole) /* the case really exercises pieces */
        T_ASSERT_MSG(r.pieces > 0, "%s: expected some blocks in pieces", what);
    /* The observer changes nothing in what is written. */
    size_t got_len = 0;
    unsigned char *got = t_read_file(path, &got_len);
    T_ASSERT_MSG(got_len == l.size, "%s: file has %zu bytes, expected %llu", what, got_len,
                 (unsigned long long)l.size);
    for (size_t i = 0; i < l.n; i++)
        T_ASSERT_MSG(memcmp(got + l.off[i], want + l.off[i], l.len[i]) == 0, "%s: extent %zu written wrong", what, i);
    if (gpu) {
        ckptio__gpu_sim_stats s;
        ckptio__gpu_sim_get_stats(&s);
        T_ASSERT_MSG(s.violations == 0, "%s: %llu staging slots modified while their copy was in flight", what,
                     (unsigned long long)s.violations);
    }
    free(got);
    for (size_t i = 0; i < l.n; i++) {
        if (gpu && i % 2 == 0) ckptio__gpu_sim_device_free(mem[i]);
        else free(mem[i]);
    }
    rec_free(&r);
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_engine_destroy(e));
    free(want);
}

static void test_host(void) {
    const int64_t threads[] = {0, 1, 3};
    const uint64_t blocks[] = {0, 4096, 3 * 4096 + 5, 1 * MIB};
    for (size_t t = 0; t < 3; t++)
        for (size_t b = 0; b < 4; b++) run_case(threads[t], 8 * MIB, 64 * KIB, blocks[b], false, false, 0, true);
}

static void test_gpu(void) {
    /* Staging large enough for block + 4 KiB per slot: whole blocks. */
    run_case(2, 16 * MIB, 8 * MIB, 1 * MIB, true, false, 50, true);
    run_case(0, 8 * MIB, 8 * MIB, 1 * MIB, true, true, 50, true);
    /* Default-like geometry where slots equal the block: the pipeline
     * trades workers for larger slots (4 x 4 slots of 1 MiB + 4 KiB fit
     * in 16.1 MiB, 4 x 4 x 1 MiB would not hold whole blocks). */
    run_case(4, 16 * MIB + 64 * KIB, 1 * MIB, 1 * MIB, true, false, 20, true);
    /* Any chunking (block 0), slow observer: slots not reused early. */
    run_case(3, 1 * MIB, 8 * MIB, 0, true, true, 100, false);
    /* Staging too small for whole blocks: pieces, but never across a boundary. */
    run_case(2, 1 * MIB, 8 * MIB, 1 * MIB, true, false, 20, false);
}

static void test_refusals(void) {
    ckptio_plan *p = NULL;
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    T_STATUS(ckptio__plan_set_observer(p, observe, NULL, 0), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("read plan");
    T_OK(ckptio__plan_set_observer(p, NULL, NULL, 0)); /* removing is always fine */
    T_OK(ckptio_plan_destroy(p));

    /* Forced cuFile cannot show staging bytes: refused before any byte moves. */
    ckptio__gpu_sim_configure(NULL);
    ckptio_engine *e = make_engine(1, 4 * MIB, 1 * MIB);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_CUFILE));
    const char *path = t_path("observer_cufile.bin");
    unlink(path);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE, &f));
    unsigned char *dev = ckptio__gpu_sim_device_alloc(8192);
    T_ASSERT(dev);
    recorder r;
    rec_init(&r, 0, false);
    rec_add(&r, dev, 8192);
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    ckptio_extent ex = {.file = f, .file_offset = 0, .length = 8192, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio_plan_add(p, &ex));
    T_OK(ckptio__plan_set_observer(p, observe, &r, 0));
    T_STATUS(ckptio_engine_execute(e, p), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("cuFile");
    T_ASSERT(r.calls == 0);
    /* The same plan with the pipeline forced works. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_PIPELINE));
    T_OK(ckptio_engine_execute(e, p));
    rec_check(&r, "pipeline after cuFile refusal");
    rec_free(&r);
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_close(f));
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_engine_destroy(e));
}

int main(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    test_host();
    test_gpu();
    test_refusals();
    return T_EXIT_PASS;
}
