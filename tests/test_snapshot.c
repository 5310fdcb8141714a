/*
 * test_snapshot.c - snapshot pools (ckptio_snapshot_*) on the simulated
 * device (tests/doubles/gpu_sim.c) and on host memory: a snapshot holds the
 * values the work queued on the caller's stream before the take leaves, and
 * nothing queued after it, while work that only reads the tensors runs
 * beside the copies; the caller's stream waits (on the device) for EARLY
 * copies at once and for the others at before_update; the pool is pinned in
 * the background, once, held one snapshot at a time and unpinned on
 * destroy; failures of pinning and of copies are reported.
 */
#include "common_internal.h"
#include "gpu_sim.h"
#include "helpers.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)

static void sim_reset(unsigned delay_us) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = delay_us};
    ckptio__gpu_sim_configure(&cfg);
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A "kernel" on the simulated training stream: writes `value` over a buffer, optionally after a pause. */
typedef struct fill_job {
    unsigned char *buf;
    size_t bytes;
    unsigned char value;
    unsigned pause_ms;
} fill_job;

static void fill_kernel(void *arg) {
    fill_job *j = arg;
    if (j->pause_ms) sleep_ms(j->pause_ms);
    memset(j->buf, j->value, j->bytes);
}

/* A kernel that only reads: records whether the pool's copies were still running when it ran. */
typedef struct probe_job {
    ckptio_snapshot_pool *pool;
    atomic_int copies_running;
} probe_job;

static void probe_kernel(void *arg) {
    probe_job *j = arg;
    atomic_store(&j->copies_running, !ckptio_snapshot_copied(j->pool));
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return false;
    return true;
}

static ckptio_snapshot_pool_info query(ckptio_snapshot_pool *pool) {
    ckptio_snapshot_pool_info info;
    T_OK(ckptio_snapshot_pool_query(pool, &info));
    return info;
}

/* Host pool: copies made during the take, exact whatever the caller does next; one snapshot at a time. */
static void test_host_pool(void) {
    ckptio_snapshot_pool *pool = NULL;
    T_OK(ckptio_snapshot_pool_create(NULL, 3 * MIB, -1, &pool));
    ckptio_snapshot_pool_info info = query(pool);
    T_ASSERT(info.bytes == 4 * MIB && info.piece_bytes == 4 * MIB && info.device == -1 && !info.pinned && !info.held);
    T_OK(ckptio_snapshot_pool_wait_ready(pool, info.bytes));
    T_ASSERT(query(pool).ready_bytes == info.bytes);
    unsigned char *a = malloc(MIB + 3), *b = malloc(5000);
    t_fill_random(a, MIB + 3, 1);
    t_fill_random(b, 5000, 2);
    unsigned char *want_a = malloc(MIB + 3), *want_b = malloc(5000);
    memcpy(want_a, a, MIB + 3);
    memcpy(want_b, b, 5000);
    const ckptio_snapshot_copy copies[] = {{.src = a, .offset = 0, .nbytes = MIB + 3, .device = -1},
                                           {.src = b, .offset = 2 * MIB, .nbytes = 5000, .device = -1}};
    T_OK(ckptio_snapshot_take(pool, copies, 2, NULL, 0));
    memset(a, 0x11, MIB + 3); /* training goes on */
    memset(b, 0x22, 5000);
    T_ASSERT(query(pool).held && ckptio_snapshot_copied(pool));
    T_OK(ckptio_snapshot_wait(pool));
    const unsigned char *base = info.base;
    T_ASSERT(memcmp(base, want_a, MIB + 3) == 0 && memcmp(base + 2 * MIB, want_b, 5000) == 0);
    /* One at a time: the next take is refused until this one is released. */
    T_STATUS(ckptio_snapshot_take(pool, copies, 2, NULL, 0), CKPTIO_E_BUSY);
    T_MESSAGE_HAS("release it before taking the next one");
    T_ASSERT(memcmp(base, want_a, MIB + 3) == 0);
    T_OK(ckptio_snapshot_release(pool));
    T_ASSERT(!query(pool).held);
    T_OK(ckptio_snapshot_take(pool, copies, 2, NULL, 0));
    T_ASSERT(all_bytes(base, MIB + 3, 0x11) && all_bytes(base + 2 * MIB, 5000, 0x22));
    T_OK(ckptio_snapshot_release(pool));
    /* Bad input: past the end, device memory into a host pool, a stream missing. */
    const ckptio_snapshot_copy past = {.src = a, .offset = 4 * MIB - 10, .nbytes = 11, .device = -1};
    T_STATUS(ckptio_snapshot_take(pool, &past, 1, NULL, 0), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("snapshot copy 0: 11 bytes at offset 4194294 run past the pool's 4194304");
    const ckptio_snapshot_copy dev = {.src = a, .offset = 0, .nbytes = 8, .device = 0};
    T_STATUS(ckptio_snapshot_take(pool, &dev, 1, NULL, 0), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("into a host pool");
    T_STATUS(ckptio_snapshot_pool_wait_ready(pool, 5 * MIB), CKPTIO_E_RANGE);
    T_ASSERT(!query(pool).held);
    T_OK(ckptio_snapshot_pool_destroy(pool));
    T_STATUS(ckptio_snapshot_pool_create(NULL, 0, -1, &pool), CKPTIO_E_INVAL);
    free(a);
    free(b);
    free(want_a);
    free(want_b);
}

/* The device path: a slow "optimizer step" queued before the take is in the snapshot, an update queued after
 * before_update is not, a kernel that only reads runs while the copies still do, and the caller never blocks. */
static void test_snapshot_follows_the_stream(void) {
    sim_reset(20000); /* each copy waits 0-20 ms: copies complete well after the take returned */
    const ckptio__gpu_ops *ops = ckptio__gpu_sim_ops();
    enum { NT = 12 };
    const size_t sizes[NT] = {1, 4095, 4096, 4097, 100000, MIB, MIB + 7, 3, 65536, 2 * MIB + 1, 17, 500000};
    unsigned char *dev[NT];
    ckptio_snapshot_copy copies[NT];
    uint64_t at = 0;
    for (int i = 0; i < NT; i++) {
        dev[i] = ckptio__gpu_sim_device_alloc(sizes[i]);
        memset(dev[i], 0xA0, sizes[i]); /* step k-1's values */
        copies[i] = (ckptio_snapshot_copy){.src = dev[i], .offset = at, .nbytes = sizes[i], .device = 0};
        at = (at + sizes[i] + 4095) / 4096 * 4096;
    }
    ckptio_snapshot_pool *pool = NULL;
    T_OK(ckptio_snapshot_pool_create(NULL, at, 0, &pool));
    ckptio_snapshot_pool_info info = query(pool);
    T_ASSERT(info.pinned && info.device == 0);
    T_OK(ckptio_snapshot_pool_wait_ready(pool, info.bytes));
    void *train = NULL;
    T_OK(ops->stream_create(&train));
    for (int round = 0; round < 3; round++) {
        /* Step k's optimizer step, still running when the save is asked for. */
        const unsigned char vk = (unsigned char)(0xB0 + round), vnext = (unsigned char)(0xC0 + round);
        fill_job step_k[NT], step_next[NT];
        for (int i = 0; i < NT; i++) {
            step_k[i] = (fill_job){.buf = dev[i], .bytes = sizes[i], .value = vk, .pause_ms = i == 0 ? 30 : 0};
            T_OK(ckptio__gpu_sim_launch(train, fill_kernel, &step_k[i]));
        }
        const ckptio_snapshot_stream s = {.device = 0, .stream = (uintptr_t)train};
        const double t0 = ckptio__now();
        T_OK(ckptio_snapshot_take(pool, copies, NT, &s, 1));
        T_ASSERT_MSG(ckptio__now() - t0 < 0.025, "the take blocked %.3f s", ckptio__now() - t0);
        /* Forward and backward of step k+1: read only, beside the copies. */
        probe_job probe = {.pool = pool};
        T_OK(ckptio__gpu_sim_launch(train, probe_kernel, &probe));
        /* Step k+1's optimizer step: waits for the copies on the device, then changes every tensor. */
        T_OK(ckptio_snapshot_before_update(pool, 0, (uintptr_t)train));
        for (int i = 0; i < NT; i++) {
            step_next[i] = (fill_job){.buf = dev[i], .bytes = sizes[i], .value = vnext};
            T_OK(ckptio__gpu_sim_launch(train, fill_kernel, &step_next[i]));
        }
        T_OK(ckptio_snapshot_wait(pool));
        T_ASSERT(ckptio_snapshot_copied(pool));
        const unsigned char *base = info.base;
        for (int i = 0; i < NT; i++)
            T_ASSERT_MSG(all_bytes(base + copies[i].offset, sizes[i], vk),
                         "round %d, tensor %d (%zu bytes): the snapshot does not hold step k's values", round, i,
                         sizes[i]);
        T_OK(ops->stream_sync(train));
        T_ASSERT_MSG(atomic_load(&probe.copies_running), "round %d: the read-only kernel ran after the copies", round);
        for (int i = 0; i < NT; i++) T_ASSERT(all_bytes(dev[i], sizes[i], vnext));
        T_OK(ckptio_snapshot_release(pool));
    }
    ckptio__gpu_sim_stats st;
    ckptio__gpu_sim_get_stats(&st);
    T_ASSERT(st.ctx_depth == 0);
    uint64_t total = 0;
    for (int i = 0; i < NT; i++) total += sizes[i];
    T_ASSERT(st.bytes_d2h == 3 * total);
    ops->stream_destroy(train);
    T_OK(ckptio_snapshot_pool_destroy(pool));
    ckptio__gpu_sim_get_stats(&st);
    T_ASSERT_MSG(st.pinned_now == 0 && st.streams_live == 0 && st.events_live == 0,
                 "left behind: %llu pinned bytes, %llu streams, %llu events", (unsigned long long)st.pinned_now,
                 (unsigned long long)st.streams_live, (unsigned long long)st.events_live);
    for (int i = 0; i < NT; i++) ckptio__gpu_sim_device_free(dev[i]);
}

/* EARLY tensors (a forward pass changes them next) are copied before the caller's stream goes on. */
static void test_early_copies_hold_the_stream(void) {
    sim_reset(15000);
    const ckptio__gpu_ops *ops = ckptio__gpu_sim_ops();
    const size_t n = 300000;
    unsigned char *stats = ckptio__gpu_sim_device_alloc(n), *weights = ckptio__gpu_sim_device_alloc(n);
    memset(stats, 0x01, n);
    memset(weights, 0x02, n);
    ckptio_snapshot_pool *pool = NULL;
    T_OK(ckptio_snapshot_pool_create(NULL, 2 * n, 0, &pool));
    void *train = NULL;
    T_OK(ops->stream_create(&train));
    const ckptio_snapshot_copy copies[] = {{.src = weights, .offset = 0, .nbytes = n, .device = 0},
                                           {.src = stats, .offset = n, .nbytes = n, .device = 0,
                                            .flags = CKPTIO_SNAPSHOT_EARLY}};
    const ckptio_snapshot_stream s = {.device = 0, .stream = (uintptr_t)train};
    ckptio__gpu_sim_stats before;
    ckptio__gpu_sim_get_stats(&before);
    T_OK(ckptio_snapshot_take(pool, copies, 2, &s, 1));
    ckptio__gpu_sim_stats after;
    ckptio__gpu_sim_get_stats(&after);
    fill_job forward = {.buf = stats, .bytes = n, .value = 0x7F}; /* the next forward updates running stats */
    T_OK(ckptio__gpu_sim_launch(train, fill_kernel, &forward));
    T_OK(ckptio_snapshot_before_update(pool, 0, (uintptr_t)train));
    fill_job update = {.buf = weights, .bytes = n, .value = 0x7E};
    T_OK(ckptio__gpu_sim_launch(train, fill_kernel, &update));
    T_OK(ckptio_snapshot_wait(pool));
    ckptio_snapshot_pool_info info = query(pool);
    const unsigned char *base = info.base;
    T_ASSERT_MSG(all_bytes(base + n, n, 0x01), "the EARLY tensor holds what the next forward wrote");
    T_ASSERT(all_bytes(base, n, 0x02));
    /* The copy stream waited for the caller's, the caller's for the EARLY copies, then before_update. */
    T_ASSERT(after.stream_waits - before.stream_waits == 2);
    T_OK(ckptio_snapshot_release(pool));
    /* Nothing held: before_update queues nothing. */
    ckptio__gpu_sim_get_stats(&before);
    T_OK(ckptio_snapshot_before_update(pool, 0, (uintptr_t)train));
    ckptio__gpu_sim_get_stats(&after);
    T_ASSERT(after.stream_waits == before.stream_waits);
    T_OK(ops->stream_sync(train));
    ops->stream_destroy(train);
    T_OK(ckptio_snapshot_pool_destroy(pool));
    ckptio__gpu_sim_device_free(stats);
    ckptio__gpu_sim_device_free(weights);
}

/* Copies are cut where the pool's pieces (separate registrations) meet; host and device tensors in one take. */
static void test_copies_cut_at_pieces(void) {
    sim_reset(0);
    const ckptio__gpu_ops *ops = ckptio__gpu_sim_ops();
    const size_t n = 3 * MIB + 5;
    unsigned char *dev = ckptio__gpu_sim_device_alloc(n);
    t_fill_random(dev, n, 7);
    unsigned char host[4000];
    t_fill_random(host, sizeof host, 8);
    ckptio_snapshot_pool *pool = NULL;
    T_OK(ckptio_snapshot_pool_create(NULL, 70 * MIB, 0, &pool));
    ckptio_snapshot_pool_info info = query(pool);
    T_ASSERT(info.bytes == 128 * MIB && info.piece_bytes == 64 * MIB);
    void *train = NULL;
    T_OK(ops->stream_create(&train));
    const uint64_t off = 64 * MIB - MIB; /* straddles the first piece's end */
    const ckptio_snapshot_copy copies[] = {{.src = dev, .offset = off, .nbytes = n, .device = 0},
                                           {.src = host, .offset = 100, .nbytes = sizeof host, .device = -1}};
    const ckptio_snapshot_stream s = {.device = 0, .stream = (uintptr_t)train};
    ckptio__gpu_sim_stats before, after;
    ckptio__gpu_sim_get_stats(&before);
    T_OK(ckptio_snapshot_take(pool, copies, 2, &s, 1));
    T_OK(ckptio_snapshot_release(pool));
    ckptio__gpu_sim_get_stats(&after);
    T_ASSERT_MSG(after.copies - before.copies == 2, "%llu copies", (unsigned long long)(after.copies - before.copies));
    const unsigned char *base = info.base;
    T_ASSERT(memcmp(base + off, dev, n) == 0 && memcmp(base + 100, host, sizeof host) == 0);
    T_ASSERT(after.pinned_now >= 128 * MIB);
    ops->stream_destroy(train);
    T_OK(ckptio_snapshot_pool_destroy(pool));
    ckptio__gpu_sim_get_stats(&after);
    T_ASSERT(after.pinned_now == 0);
    ckptio__gpu_sim_device_free(dev);
}

/* Pinning runs in the background, in address order; the take waits only for the bytes it writes. */
static void test_pinning_in_the_background(void) {
    ckptio__gpu_sim_config cfg = {.pinned_delay_us = 40000}; /* 40 ms per 64 MiB piece */
    ckptio__gpu_sim_configure(&cfg);
    ckptio_snapshot_pool *pool = NULL;
    const double t0 = ckptio__now();
    T_OK(ckptio_snapshot_pool_create(NULL, 4 * 64 * MIB, 0, &pool));
    T_ASSERT_MSG(ckptio__now() - t0 < 0.03, "create blocked %.3f s", ckptio__now() - t0);
    T_ASSERT(query(pool).ready_bytes < 4 * 64 * MIB);
    T_OK(ckptio_snapshot_pool_wait_ready(pool, 64 * MIB));
    T_ASSERT(query(pool).ready_bytes >= 64 * MIB);
    T_OK(ckptio_snapshot_pool_wait_ready(pool, 4 * 64 * MIB));
    ckptio__gpu_sim_stats st;
    ckptio__gpu_sim_get_stats(&st);
    T_ASSERT(st.pinned_allocs == 4 && st.pinned_now == 4 * 64 * MIB);
    T_ASSERT(ckptio__now() - t0 >= 0.15);
    T_OK(ckptio_snapshot_pool_destroy(pool));
    /* Destroyed while still pinning: stops, unpins what it pinned. */
    T_OK(ckptio_snapshot_pool_create(NULL, 6 * 64 * MIB, 0, &pool));
    T_OK(ckptio_snapshot_pool_wait_ready(pool, 64 * MIB));
    T_OK(ckptio_snapshot_pool_destroy(pool));
    ckptio__gpu_sim_get_stats(&st);
    T_ASSERT_MSG(st.pinned_now == 0 && st.pinned_allocs < 10, "%llu pinned, %llu pieces",
                 (unsigned long long)st.pinned_now, (unsigned long long)st.pinned_allocs);
}

/* A piece the driver will not pin: waits and takes fail naming it, every time; the pool still frees. */
static void test_pinning_fails(void) {
    ckptio__gpu_sim_config cfg = {.fail_pinned_at = 2};
    ckptio__gpu_sim_configure(&cfg);
    ckptio_snapshot_pool *pool = NULL;
    T_OK(ckptio_snapshot_pool_create(NULL, 3 * 64 * MIB, 0, &pool));
    T_OK(ckptio_snapshot_pool_wait_ready(pool, 64 * MIB));
    for (int i = 0; i < 2; i++) {
        T_STATUS(ckptio_snapshot_pool_wait_ready(pool, 3 * 64 * MIB), CKPTIO_E_CUDA);
        T_MESSAGE_HAS("pinning piece 1 of 3 (64 MiB at offset 67108864) of the snapshot pool: simulated pinned "
                      "allocation");
    }
    unsigned char *dev = ckptio__gpu_sim_device_alloc(4096);
    const ckptio_snapshot_copy c = {.src = dev, .offset = 64 * MIB, .nbytes = 4096, .device = 0};
    const ckptio_snapshot_copy first = {.src = dev, .offset = 0, .nbytes = 4096, .device = 0};
    void *train = NULL;
    T_OK(ckptio__gpu_sim_ops()->stream_create(&train));
    const ckptio_snapshot_stream s = {.device = 0, .stream = (uintptr_t)train};
    T_STATUS(ckptio_snapshot_take(pool, &c, 1, &s, 1), CKPTIO_E_CUDA);
    T_ASSERT(!query(pool).held);
    T_OK(ckptio_snapshot_take(pool, &first, 1, &s, 1)); /* the pinned part still serves */
    T_OK(ckptio_snapshot_release(pool));
    T_OK(ckptio_snapshot_pool_destroy(pool));
    /* A driver that cannot register host memory. */
    cfg = (ckptio__gpu_sim_config){.no_register = true};
    ckptio__gpu_sim_configure(&cfg);
    T_OK(ckptio_snapshot_pool_create(NULL, 64 * MIB, 0, &pool));
    T_STATUS(ckptio_snapshot_pool_wait_ready(pool, 1), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("the CUDA driver cannot page-lock host memory (cuMemHostRegister)");
    T_OK(ckptio_snapshot_pool_destroy(pool));
    ckptio__gpu_sim_ops()->stream_destroy(train);
    ckptio__gpu_sim_device_free(dev);
    ckptio__gpu_sim_stats st;
    ckptio__gpu_sim_get_stats(&st);
    T_ASSERT(st.pinned_now == 0 && st.ctx_depth == 0);
}

/* A copy refused when queued: nothing held, nothing left running, the next take works; a copy that fails on
 * the device: reported by wait and release. */
static void test_copy_failures(void) {
    const ckptio__gpu_ops *ops = ckptio__gpu_sim_ops();
    unsigned char *a = ckptio__gpu_sim_device_alloc(8192), *b = ckptio__gpu_sim_device_alloc(8192);
    memset(a, 1, 8192);
    memset(b, 2, 8192);
    ckptio_snapshot_copy copies[] = {{.src = a, .offset = 0, .nbytes = 8192, .device = 0},
                                     {.src = b, .offset = 8192, .nbytes = 8192, .device = 0}};
    void *train = NULL;
    ckptio__gpu_sim_config cfg = {.fail_enqueue_at = 2, .copy_delay_us = 5000};
    ckptio__gpu_sim_configure(&cfg);
    T_OK(ops->stream_create(&train));
    ckptio_snapshot_pool *pool = NULL;
    T_OK(ckptio_snapshot_pool_create(NULL, 16384, 0, &pool));
    const ckptio_snapshot_stream s = {.device = 0, .stream = (uintptr_t)train};
    T_STATUS(ckptio_snapshot_take(pool, copies, 2, &s, 1), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("simulated failure of copy #2");
    T_ASSERT(!query(pool).held);
    T_OK(ckptio_snapshot_take(pool, copies, 2, &s, 1));
    T_OK(ckptio_snapshot_release(pool));
    T_ASSERT(all_bytes(query(pool).base, 8192, 1) && all_bytes((unsigned char *)query(pool).base + 8192, 8192, 2));
    /* No stream for the device. */
    T_STATUS(ckptio_snapshot_take(pool, copies, 2, NULL, 0), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("snapshot copy 0: no stream given for CUDA device 0");
    T_OK(ckptio_snapshot_pool_destroy(pool));
    cfg = (ckptio__gpu_sim_config){.fail_run_at = 1};
    ckptio__gpu_sim_configure(&cfg);
    T_OK(ckptio_snapshot_pool_create(NULL, 16384, 0, &pool));
    T_OK(ckptio_snapshot_take(pool, copies, 2, &s, 1));
    T_STATUS(ckptio_snapshot_wait(pool), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("simulated asynchronous failure of copy #1");
    T_STATUS(ckptio_snapshot_release(pool), CKPTIO_E_CUDA);
    T_ASSERT(!query(pool).held);
    T_OK(ckptio_snapshot_pool_destroy(pool));
    ops->stream_destroy(train);
    ckptio__gpu_sim_device_free(a);
    ckptio__gpu_sim_device_free(b);
}

int main(void) {
    test_host_pool();
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    test_snapshot_follows_the_stream();
    test_early_copies_hold_the_stream();
    test_copies_cut_at_pieces();
    test_pinning_in_the_background();
    test_pinning_fails();
    test_copy_failures();
    ckptio__gpu_set_ops(NULL);
    printf("test_snapshot: ok\n");
    return 0;
}
