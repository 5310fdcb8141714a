/*
 * test_small_save.c - what a small atomic save does not do, and the stale
 * temporaries it still removes.
 *
 * A save's temporary takes the first free slot of its NAME
 * (".NAME.ckptio-tmp-000000" ..., src/io/temporaries.c): a save into a
 * directory without leftovers lists nothing; a killed save's temporary in a
 * slot makes the next save of NAME list the directory once and remove every
 * stale temporary of NAME (older random names included); a live save's is
 * kept and the next save takes the next slot. A save below
 * CKPTIO_OPT_DIRECT_MIN_BYTES does not ask how much memory there is (its
 * writes go through the page cache whatever the answer), and a write plan
 * to one file through the page cache is written by the calling thread.
 */
#include "helpers.h"
#include "io_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ckptio_engine *engine;

static void save(const char *path, const char *text) {
    ckptio_file *f;
    T_OK(ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, (void *)text, strlen(text), 0));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
}

static void expect_file(const char *path, const void *want, size_t len) {
    size_t n;
    unsigned char *got = t_read_file(path, &n);
    T_ASSERT_MSG(n == len && memcmp(got, want, len) == 0, "%s does not hold the %zu bytes saved last", path, len);
    free(got);
}

static uint64_t sweeps(void) { return atomic_load(&ckptio__temporary_sweeps); }

static const char *in_dir(const char *dir, const char *name) {
    static char buf[4][1024];
    static int turn;
    char *out = buf[turn++ % 4];
    snprintf(out, sizeof buf[0], "%s/%s", dir, name);
    return out;
}

static void test_a_save_lists_nothing_and_leftovers_are_removed(void) {
    const char *dir = t_path("slots");
    T_ASSERT(mkdir(dir, 0777) == 0);
    char path[1024];
    snprintf(path, sizeof path, "%s", in_dir(dir, "a.bin"));
    /* Nothing left over: no listing, and the temporary was slot 0. */
    uint64_t before = sweeps();
    save(path, "one");
    save(path, "two");
    T_ASSERT_MSG(sweeps() == before, "%llu listings for two saves", (unsigned long long)(sweeps() - before));
    /* A killed save leaves slot 0; an older leftover has a random name. */
    t_killed_save(path);
    T_ASSERT(t_file_exists(in_dir(dir, ".a.bin.ckptio-tmp-000000")));
    t_write_file(in_dir(dir, ".a.bin.ckptio-tmp-Ab3xYz"), "old", 3);
    t_write_file(in_dir(dir, ".b.bin.ckptio-tmp-000000"), "b's", 3);
    before = sweeps();
    save(path, "three");
    T_ASSERT_MSG(sweeps() == before + 1, "%llu listings", (unsigned long long)(sweeps() - before));
    T_ASSERT_MSG(t_count_entries(dir, ".a.bin.ckptio-tmp-") == 0, "a.bin's stale temporaries were kept");
    T_ASSERT_MSG(t_file_exists(in_dir(dir, ".b.bin.ckptio-tmp-000000")), "another name's temporary was removed");
    expect_file(path, "three", 5);
    /* A leftover in a later slot (its save ran beside another): found without a listing of its own. */
    t_write_file(in_dir(dir, ".a.bin.ckptio-tmp-000002"), "old", 3);
    before = sweeps();
    save(path, "four");
    T_ASSERT(sweeps() == before + 1 && t_count_entries(dir, ".a.bin.ckptio-tmp-") == 0);
    /* A live save holds slot 0: the next save takes slot 1 and both commit. */
    ckptio_file *live;
    T_OK(ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE, &live));
    T_ASSERT(t_file_exists(in_dir(dir, ".a.bin.ckptio-tmp-000000")));
    save(path, "five");
    T_ASSERT(t_file_exists(in_dir(dir, ".a.bin.ckptio-tmp-000000")));
    expect_file(path, "five", 4);
    T_OK(ckptio__file_io(live, CKPTIO_WRITE, "six", 3, 0));
    T_OK(ckptio_file_commit(live));
    T_OK(ckptio_file_close(live));
    expect_file(path, "six", 3);
    T_ASSERT(t_count_entries(dir, ".a.bin.ckptio-tmp-") == 0);
}

/* Every write call, the thread that makes it. */
static pthread_t writer_threads[64];
static _Atomic int nwrites;

static bool note_writer(ckptio__io_kind kind, int *err, uint64_t *len) {
    (void)err;
    (void)len;
    if (kind != CKPTIO__IO_WRITE) return false;
    const int i = atomic_fetch_add(&nwrites, 1);
    if (i < 64) writer_threads[i] = pthread_self();
    return false;
}

/* Writes the 8 pieces of `data` (each `piece` bytes) to `a`, or alternately to `a` and `b`, in one plan on a
 * fresh engine with 2 threads; returns how many write calls ran on another thread than this one. */
static int writes_elsewhere(const char *a, const char *b, const unsigned char *data, size_t piece, int64_t direct) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, CKPTIO_BACKEND_PREAD));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, direct));
    ckptio_file *f[2] = {NULL, NULL};
    T_OK(ckptio_file_open(e, a, CKPTIO_OPEN_WRITE, &f[0]));
    if (b) T_OK(ckptio_file_open(e, b, CKPTIO_OPEN_WRITE, &f[1]));
    ckptio_plan *p;
    T_OK(ckptio_plan_create(CKPTIO_WRITE, &p));
    for (size_t i = 0; i < 8; i++) {
        ckptio_file *to = b && i % 2 ? f[1] : f[0];
        const ckptio_extent x = {.file = to, .file_offset = (b ? i / 2 : i) * piece, .length = piece,
                                 .memory = (void *)(data + i * piece), .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_plan_add(p, &x));
    }
    atomic_store(&nwrites, 0);
    ckptio__io_set_fault_hook(note_writer);
    T_OK(ckptio_engine_execute(e, p));
    ckptio__io_set_fault_hook(NULL);
    T_OK(ckptio_plan_destroy(p));
    for (int i = 0; i < 2; i++)
        if (f[i]) {
            T_OK(ckptio_file_commit(f[i]));
            T_OK(ckptio_file_close(f[i]));
        }
    T_OK(ckptio_engine_destroy(e));
    const int n = atomic_load(&nwrites);
    T_ASSERT(n >= 8 && n <= 64);
    int elsewhere = 0;
    for (int i = 0; i < n; i++) elsewhere += !pthread_equal(writer_threads[i], pthread_self());
    return elsewhere;
}

static void test_a_small_save_stays_on_the_calling_thread(void) {
    enum { PIECE = 20000 };
    unsigned char *data = malloc(8 * PIECE);
    T_ASSERT(data);
    t_fill_random(data, 8 * PIECE, 5);
    const char *a = t_path("threads-a.bin"), *b = t_path("threads-b.bin");
    /* One file through the page cache, and no question about the memory there is. */
    const uint64_t asked = atomic_load(&ckptio__mem_available_lookups);
    T_ASSERT_MSG(writes_elsewhere(a, NULL, data, PIECE, CKPTIO_DIRECT_AUTO) == 0,
                 "a small save's writes ran on a worker thread");
    T_ASSERT_MSG(atomic_load(&ckptio__mem_available_lookups) == asked, "a small save read /proc/meminfo");
    expect_file(a, data, 8 * PIECE);
    /* Two files: the workers share them (which shows the count sees them). */
    T_ASSERT(writes_elsewhere(a, b, data, PIECE, CKPTIO_DIRECT_AUTO) > 0);
    unlink(a);
    unlink(b);
    free(data);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_a_save_lists_nothing_and_leftovers_are_removed);
    T_RUN(test_a_small_save_stays_on_the_calling_thread);
    T_OK(ckptio_engine_destroy(engine));
    return 0;
}
