/*
 * test_gpu_pinning.c - the GPU pipeline's pinned staging slots on the
 * simulated device (tests/doubles/gpu_sim.c): pinned on first use and on
 * demand, their size capped, pinning that never waits without need, the
 * first windows read while another worker pins, the address range they live
 * in (and life without one), pinning ahead (ckptio_engine_gpu_prepare),
 * huge-page slots, and slots pinned under a larger staging bound given back
 * when it is lowered. Runs without a GPU.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "gpu_pipeline.h"
#include "gpu_sim.h"
#include "gpu_sim_helpers.h"
#include "helpers.h"

#include <errno.h>
#include <malloc.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- slots pinned on first use, and their geometry ---------------------------- */

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

/* A lowered staging bound that leaves the slot size as it was: slots pinned
 * beyond the new bound (by workers the run no longer has) are freed, as many
 * as the bound needs, before the run pins any, in both directions. */
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
    /* As many slots freed as the bound needs, not more: the bound's 4 slots stay pinned. */
    T_ASSERT_MSG(a.pinned_now == 16 * MIB, "%llu bytes pinned after a load under a 16 MiB bound",
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

int main(int argc, char **argv) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    self_path = argv[0];
    if (argc > 1 && strcmp(argv[1], "no-range") == 0) return no_range_child();
    T_RUN(test_slots_allocated_on_first_use);
    T_RUN(test_slots_pinned_on_demand);
    T_RUN(test_slot_size_is_capped);
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
    T_RUN(test_pinned_slots_follow_a_lowered_bound);
    return T_EXIT_PASS;
}
