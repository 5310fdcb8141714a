/*
 * test_cuda_pinned.c - how the real CUDA operations table pins staging
 * memory, run against a fake driver (tests/shim/fake_libcuda.c through
 * CKPTIO_CUDA_LIBRARY) so that CI checks it without a GPU:
 *  - a slot is anonymous memory registered with cuMemHostRegister (portable,
 *    device-mapped), 4 KiB-aligned, not inherited by forked children
 *    (MADV_DONTFORK), and unregistered and unmapped when freed;
 *  - a failed registration returns its error and leaves no mapping behind;
 *  - a driver that refuses registration from the start gets cuMemHostAlloc
 *    for the whole process (a child process: the choice is per process),
 *    but one that refused after registering slots is an error, never a
 *    switch that would free registered slots with cuMemFreeHost;
 *  - pitched copies reach cuMemcpy2DAsync, and a driver without it gets
 *    the same bytes row by row;
 *  - a snapshot pool is registered piece by piece (portable, device-mapped)
 *    and unregistered on destroy; its copy stream and the caller's wait on
 *    events through cuStreamWaitEvent.
 */
#include "gpu_ops.h"
#include "gpu_slot_range.h"
#include "helpers.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024u * 1024u)


static const ckptio__gpu_ops *ops; /* the real table, on the fake driver */
static const char *self;           /* this program, for the fallback process */
static int *copy2d_calls;
static int *register_result, *register_calls, *unregister_calls, *hostalloc_calls, *freehost_calls;
static void **last_registered, **last_unregistered;
static size_t *last_registered_bytes;
static unsigned *last_register_flags;

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "fake driver lacks %s\n", name);
        exit(T_EXIT_FAIL);
    }
    return p;
}

static void bind_fake(const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL); /* the same object ckptio opens */
    if (!lib) {
        fprintf(stderr, "cannot open the fake driver %s: %s\n", path, dlerror());
        exit(T_EXIT_FAIL);
    }
    register_result = sym(lib, "fake_cuda_register_result");
    register_calls = sym(lib, "fake_cuda_register_calls");
    unregister_calls = sym(lib, "fake_cuda_unregister_calls");
    hostalloc_calls = sym(lib, "fake_cuda_hostalloc_calls");
    freehost_calls = sym(lib, "fake_cuda_freehost_calls");
    last_registered = sym(lib, "fake_cuda_last_registered");
    last_unregistered = sym(lib, "fake_cuda_last_unregistered");
    last_registered_bytes = sym(lib, "fake_cuda_last_registered_bytes");
    last_register_flags = sym(lib, "fake_cuda_last_register_flags");
    copy2d_calls = sym(lib, "fake_cuda_copy2d_calls");
}


static int count_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    int n = 0, c;
    if (!f) return -1;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static void test_a_slot_is_registered_anonymous_memory(void) {
    void *p = NULL;
    T_OK(ops->pinned_alloc(2 * MIB, false, &p));
    T_ASSERT(p != NULL && (uintptr_t)p % 4096 == 0);
    T_ASSERT_MSG(*register_calls == 1 && *hostalloc_calls == 0, "%d registrations, %d cuMemHostAlloc",
                 *register_calls, *hostalloc_calls);
    T_ASSERT(*last_registered == p && *last_registered_bytes == 2 * MIB);
    T_ASSERT_MSG(*last_register_flags == 0x3, "flags %#x, want PORTABLE | DEVICEMAP", *last_register_flags);
    memset(p, 0xAB, 2 * MIB);
    T_ASSERT_MSG(t_vm_flag(p, "dc") == 1, "the slot's mapping lacks MADV_DONTFORK (VmFlags dc: %d)",
                 t_vm_flag(p, "dc"));
    T_ASSERT(t_vm_flag((unsigned char *)p - 4096, "dc") == 1); /* the length page too: one mapping */
    ops->pinned_free(p);
    T_ASSERT(*unregister_calls == 1 && *last_unregistered == p);
    T_ASSERT_MSG(t_page_state(p) == -1 && t_page_state((unsigned char *)p - 4096) == -1,
                 "the slot is still mapped after its free");
    /* Odd sizes round up to pages and still free whole. */
    T_OK(ops->pinned_alloc(sizeof(uint32_t), false, &p));
    T_ASSERT(*last_registered_bytes == 4096);
    ops->pinned_free(p);
    T_ASSERT(t_page_state(p) == -1);
}

/* A huge slot (`huge`: the default while free 2 MiB blocks allow, or
 * CKPTIO_GPU_HUGE_SLOTS=on): the slot starts on a 2 MiB boundary, advised for
 * huge pages, filled, registered whole; its header page is still the one
 * before it; the whole reservation goes with the free. */
static void test_a_huge_slot_is_aligned_advised_and_freed_whole(void) {
    const int before = count_mappings();
    void *p = NULL;
    T_OK(ops->pinned_alloc(4 * MIB, true, &p));
    T_ASSERT_MSG((uintptr_t)p % (2 * MIB) == 0, "huge slot at %p: not on a 2 MiB boundary", p);
    T_ASSERT(*last_registered == p && *last_registered_bytes == 4 * MIB && *last_register_flags == 0x3);
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) /* a kernel with THP */
        T_ASSERT_MSG(t_vm_flag(p, "hg") == 1, "the huge slot is not advised MADV_HUGEPAGE (VmFlags hg: %d)",
                     t_vm_flag(p, "hg"));
    T_ASSERT(t_vm_flag(p, "dc") == 1 && t_vm_flag((unsigned char *)p - 4096, "dc") == 1);
    memset(p, 0x5A, 4 * MIB);
    const unsigned calls = (unsigned)*unregister_calls;
    ops->pinned_free(p);
    T_ASSERT(*unregister_calls == (int)calls + 1 && *last_unregistered == p);
    T_ASSERT_MSG(count_mappings() == before, "%d mappings before a huge slot, %d after its free", before,
                 count_mappings());
}

static void test_a_failed_registration_leaves_nothing(void) {
    const int before = count_mappings();
    const int calls = *register_calls;
    *register_result = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    void *p = (void *)1;
    T_STATUS(ops->pinned_alloc(1 * MIB, false, &p), CKPTIO_E_NOMEM);
    T_MESSAGE_HAS("cuMemHostRegister(1048576 bytes) of pinned staging memory failed: CUDA_ERROR_OUT_OF_MEMORY");
    T_ASSERT(p == NULL && *register_calls == calls + 1 && *hostalloc_calls == 0);
    T_ASSERT_MSG(count_mappings() == before, "%d mappings before, %d after a failed registration", before,
                 count_mappings());
    /* Refused after slots were registered: an error, not a switch to cuMemHostAlloc. */
    *register_result = 801; /* CUDA_ERROR_NOT_SUPPORTED */
    T_STATUS(ops->pinned_alloc(1 * MIB, false, &p), CKPTIO_E_CUDA);
    T_MESSAGE_HAS("CUDA_ERROR_NOT_SUPPORTED");
    T_ASSERT(*hostalloc_calls == 0 && count_mappings() == before);
    *register_result = 0;
    T_OK(ops->pinned_alloc(1 * MIB, false, &p));
    T_ASSERT(*last_registered == p && *hostalloc_calls == 0);
    ops->pinned_free(p);
    T_ASSERT(count_mappings() == before);
}

/* The range an engine's slots live in (gpu_slot_range.c) and the pinning
 * of a slot in it: reserved on a 2 MiB boundary with no memory behind it,
 * not inherited by a fork, advised for huge pages or against them; a fill
 * faults a slot in, a pin registers exactly it, an unpin unregisters it,
 * a discard gives its memory back, and the release unmaps the range. */
static void test_a_slot_range(void) {
    const int before = count_mappings();
    unsigned char *range = NULL;
    T_OK(ckptio__slot_range_reserve(8 * MIB, true, &range));
    T_ASSERT_MSG((uintptr_t)range % (2 * MIB) == 0, "range at %p: not on a 2 MiB boundary", (void *)range);
    T_ASSERT(t_page_state(range) == 0 && t_page_state(range + 8 * MIB - 4096) == 0); /* reserved, not filled */
    T_ASSERT(t_vm_flag(range, "dc") == 1);
    const bool thp = access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0;
    if (thp) T_ASSERT_MSG(t_vm_flag(range, "hg") == 1, "the range is not advised MADV_HUGEPAGE");
    unsigned char *slot = range + 4 * MIB;
    ckptio__slot_range_fill(slot, 4 * MIB);
    for (size_t off = 0; off < 4 * MIB; off += 4096) /* every page, with huge pages or without */
        T_ASSERT_MSG(t_page_state(slot + off) == 1, "page %zu of a filled slot is not in memory", off / 4096);
    T_ASSERT(t_page_state(range) == 0);
    const int calls = *register_calls;
    T_OK(ops->slot_pin(slot, 4 * MIB));
    T_ASSERT(*register_calls == calls + 1 && *last_registered == slot && *last_registered_bytes == 4 * MIB &&
             *last_register_flags == 0x3);
    memset(slot, 0x77, 4 * MIB);
    ops->slot_unpin(slot);
    T_ASSERT(*last_unregistered == slot);
    ckptio__slot_range_discard(slot, 4 * MIB);
    T_ASSERT_MSG(t_page_state(slot) == 0, "a discarded slot is still in memory");
    /* Advised again against huge pages: the faults to come take 4 KiB pages. */
    ckptio__slot_range_advise(range, 8 * MIB, false);
    if (thp) T_ASSERT(t_vm_flag(range, "hg") == 0 && t_vm_flag(range, "nh") == 1);
    /* A failed registration is the caller's to clean up: the memory stays. */
    ckptio__slot_range_fill(slot, 4 * MIB);
    *register_result = 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    T_STATUS(ops->slot_pin(slot, 4 * MIB), CKPTIO_E_NOMEM);
    T_MESSAGE_HAS("cuMemHostRegister(4194304 bytes) of pinned staging memory failed: CUDA_ERROR_OUT_OF_MEMORY");
    *register_result = 0;
    T_ASSERT(t_page_state(slot) == 1);
    ckptio__slot_range_release(range, 8 * MIB);
    T_ASSERT_MSG(count_mappings() == before, "%d mappings before the range, %d after its release", before,
                 count_mappings());
}

/* In a process of its own: the driver refuses registration from the start. */
static int fallback_child(void) {
    *register_result = 801;
    unsigned char *range = NULL;
    T_OK(ckptio__slot_range_reserve(2 * MIB, false, &range));
    ckptio__slot_range_fill(range, 2 * MIB);
    T_ASSERT_MSG(ops->slot_pin(range, 2 * MIB) == CKPTIO_E_UNSUPPORTED, "a refused first registration of a slot "
                 "is not CKPTIO_E_UNSUPPORTED (pinned_alloc takes over then)");
    ckptio__slot_range_release(range, 2 * MIB);
    *register_calls = 0;
    void *a = NULL, *b = NULL;
    T_OK(ops->pinned_alloc(2 * MIB, false, &a));
    T_ASSERT(a != NULL && *register_calls == 1 && *hostalloc_calls == 1);
    T_OK(ops->pinned_alloc(2 * MIB, false, &b));
    T_ASSERT_MSG(*register_calls == 1 && *hostalloc_calls == 2, "registration tried %d times, %d cuMemHostAlloc",
                 *register_calls, *hostalloc_calls);
    memset(a, 1, 2 * MIB);
    ops->pinned_free(a);
    ops->pinned_free(b);
    T_ASSERT(*freehost_calls == 2 && *unregister_calls == 0);
    return T_EXIT_PASS;
}

/* Three columns of a 7-row matrix of 40-byte rows to contiguous "device"
 * memory and back, through the real table (the fake driver's device
 * memory is host memory); `pitched_calls`: the driver's pitched copies
 * expected (0 for a driver without them: the table copies row by row). */
enum { ROWS = 7, ROW = 40, COL = 13, WIDTH = 6 };

static void pitched_copies_case(int pitched_calls) {
    unsigned char host[ROWS * ROW], dev[ROWS * WIDTH], back[ROWS * ROW];
    for (size_t i = 0; i < sizeof host; i++) host[i] = (unsigned char)(i * 7 + 1);
    memset(dev, 0xEE, sizeof dev);
    memset(back, 0, sizeof back);
    const int before = *copy2d_calls;
    T_OK(ops->h2d_2d_async(dev, WIDTH, host + COL, ROW, WIDTH, ROWS, NULL));
    for (size_t r = 0; r < ROWS; r++)
        T_ASSERT_MSG(memcmp(dev + r * WIDTH, host + r * ROW + COL, WIDTH) == 0, "row %zu copied wrong", r);
    T_OK(ops->d2h_2d_async(back + COL, ROW, dev, WIDTH, WIDTH, ROWS, NULL));
    for (size_t i = 0; i < sizeof back; i++) {
        const bool in = i % ROW >= COL && i % ROW < COL + WIDTH;
        T_ASSERT_MSG(back[i] == (in ? host[i] : 0), "byte %zu is %u after the copy back", i, back[i]);
    }
    T_ASSERT_MSG(*copy2d_calls == before + pitched_calls, "%d pitched driver calls, expected %d",
                 *copy2d_calls - before, pitched_calls);
}

static void test_pitched_copies_reach_the_driver(void) {
    pitched_copies_case(2);
    /* A pitch below the width is the driver's error, named. */
    unsigned char host[ROWS * ROW], dev[ROWS * WIDTH];
    memset(host, 0, sizeof host);
    ckptio_status st = ops->h2d_2d_async(dev, WIDTH - 1, host, ROW, WIDTH, ROWS, NULL);
    T_ASSERT(st == CKPTIO_E_CUDA);
    T_ASSERT_MSG(strstr(ckptio_last_error()->message, "cuMemcpy2DAsync") != NULL, "message: %s",
                 ckptio_last_error()->message);
}

/* A driver without cuMemcpy2DAsync (its own process: the driver is loaded
 * once per process): the same bytes, row by row. */
static void test_pitched_copies_on_an_older_driver(void) {
    if (!getenv("CKPTIO_TEST_FAKE_CUDA_OLD")) {
        printf("skip test_pitched_copies_on_an_older_driver: CKPTIO_TEST_FAKE_CUDA_OLD is not set\n");
        return;
    }
    const int code = t_run_self(self, "old_driver");
    T_ASSERT_MSG(code == 0, "the old-driver process ended with exit code %d (-1: not normally)", code);
}

static void test_a_snapshot_pool_on_the_driver(void) {
    int *waits = sym(dlopen(getenv("CKPTIO_TEST_FAKE_CUDA"), RTLD_NOW | RTLD_NOLOAD), "fake_cuda_stream_waits");
    void **waiting = sym(dlopen(getenv("CKPTIO_TEST_FAKE_CUDA"), RTLD_NOW | RTLD_NOLOAD),
                         "fake_cuda_last_waiting_stream");
    *register_result = 0;
    const int reg0 = *register_calls, unreg0 = *unregister_calls;
    ckptio_snapshot_pool *pool = NULL;
    T_OK(ckptio_snapshot_pool_create(NULL, 65 * MIB, 0, &pool));
    T_OK(ckptio_snapshot_pool_wait_ready(pool, 128 * MIB));
    T_ASSERT_MSG(*register_calls - reg0 == 2, "%d registrations", *register_calls - reg0);
    T_ASSERT(*last_registered_bytes == 64 * MIB && (*last_register_flags & 3u) == 3u);
    ckptio_snapshot_pool_info info;
    T_OK(ckptio_snapshot_pool_query(pool, &info));
    T_ASSERT(info.pinned && info.ready_bytes == 128 * MIB && *last_registered == (char *)info.base + 64 * MIB);
    unsigned char *dev = malloc(2 * MIB), *small = malloc(4096); /* the fake driver copies with memcpy */
    T_ASSERT(dev && small);
    t_fill_random(dev, 2 * MIB, 5);
    t_fill_random(small, 4096, 6);
    const ckptio_snapshot_copy copies[] = {{.src = dev, .offset = 63 * MIB, .nbytes = 2 * MIB, .device = 0},
                                           {.src = small, .offset = 0, .nbytes = 4096, .device = 0,
                                            .flags = CKPTIO_SNAPSHOT_EARLY}};
    void *caller = (void *)(uintptr_t)0x5150;
    const ckptio_snapshot_stream s = {.device = 0, .stream = (uintptr_t)caller};
    const int w0 = *waits;
    T_OK(ckptio_snapshot_take(pool, copies, 2, &s, 1));
    T_ASSERT_MSG(*waits - w0 == 2 && *waiting == caller, "%d stream waits", *waits - w0); /* copy stream, caller */
    T_OK(ckptio_snapshot_before_update(pool, 0, (uintptr_t)caller)); /* the copies are done: no wait queued */
    T_ASSERT(*waits - w0 == 2 && ckptio_snapshot_copied(pool));
    T_OK(ckptio_snapshot_release(pool));
    T_ASSERT(memcmp((char *)info.base + 63 * MIB, dev, 2 * MIB) == 0 && memcmp(info.base, small, 4096) == 0);
    T_OK(ckptio_snapshot_pool_destroy(pool));
    T_ASSERT_MSG(*unregister_calls - unreg0 == 2, "%d unregistrations", *unregister_calls - unreg0);
    free(dev);
    free(small);
}

static void test_a_driver_without_registration_gets_host_alloc(void) {
    const int code = t_run_self(self, "fallback");
    T_ASSERT_MSG(code == 0, "the fallback process ended with exit code %d (-1: not normally)", code);
}

int main(int argc, char **argv) {
    const bool old_driver = argc > 1 && strcmp(argv[1], "old_driver") == 0;
    const char *fake = getenv(old_driver ? "CKPTIO_TEST_FAKE_CUDA_OLD" : "CKPTIO_TEST_FAKE_CUDA");
    if (!fake) {
        fprintf(stderr, "CKPTIO_TEST_FAKE_CUDA(_OLD) is not set (ctest sets it): skipped\n");
        return T_EXIT_SKIP;
    }
    setenv("CKPTIO_CUDA_LIBRARY", fake, 1);
    bind_fake(fake);
    ops = ckptio__gpu_cuda_ops();
    self = argv[0];
    if (argc > 1 && strcmp(argv[1], "fallback") == 0) return fallback_child();
    if (old_driver) {
        pitched_copies_case(0);
        return T_EXIT_PASS;
    }
    T_RUN(test_a_slot_is_registered_anonymous_memory);
    T_RUN(test_a_huge_slot_is_aligned_advised_and_freed_whole);
    T_RUN(test_a_failed_registration_leaves_nothing);
    T_RUN(test_a_slot_range);
    T_RUN(test_pitched_copies_reach_the_driver);
    T_RUN(test_pitched_copies_on_an_older_driver);
    T_RUN(test_a_snapshot_pool_on_the_driver);
    T_RUN(test_a_driver_without_registration_gets_host_alloc);
    return T_EXIT_PASS;
}
