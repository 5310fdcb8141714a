/*
 * test_cancel.c - a progress callback that returns non-zero stops every
 * path: host transfers, the GPU staging pipeline (simulated device) in both
 * directions and on 0 or 2 threads, plans mixing host and GPU extents, and
 * the saves built on them (safetensors with and without a checksum
 * manifest, torch.save) from host and device memory.
 *
 * The test, not the scheduler, decides how far a transfer gets between two
 * progress calls, so that no check depends on which thread runs when (the
 * 2-core CI machine under load once let the workers finish a transfer
 * before the calling thread's first progress call):
 *   - on 0 threads the calling thread does the work and reports between
 *     requests, at most every 10 ms (engine.c's rate limit); each request
 *     sleeps 3 ms (ckptio__io_inject_delay), so a call comes at least every
 *     4 requests, whatever the load;
 *   - on 2 threads the workers may start at most STEP requests before the
 *     first progress call and between two calls (ckptio__io_inject_hold);
 *     the calling thread reports while they wait.
 * The callback cancels at its first call after some bytes moved. A
 * canceled transfer fails with CKPTIO_E_CANCELED and stops early; a
 * canceled save leaves the older file byte for byte, no temporary and no
 * manifest. Progress during GPU work is reported from the calling thread,
 * monotonic, on the whole plan's scale.
 */
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"

#include <pthread.h>
#include <string.h>

#define KIB 1024u
#define MIB (1024u * 1024u)
#define BYTES (4 * MIB)
#define CHUNK (128 * KIB) /* one request each: 32 in BYTES */
#define STEP 4            /* requests the workers may start between two progress calls */

typedef struct watch {
    pthread_t caller;
    int calls;
    bool from_caller;  /* every call came from the thread that started the transfer */
    bool monotonic;
    uint64_t last_done, total;
    int finals;            /* calls with done == total */
    uint64_t before_final; /* the last done below total */
    uint64_t mark;         /* first_past records the first done >= this (0 = not watched) */
    uint64_t first_past;
    uint64_t cancel_after; /* cancel at the first call with done >= this (0 = never) */
    uint64_t canceled_at;
    bool regrant;          /* each call that does not cancel lets STEP more requests go */
} watch;

/* Starts watching a transfer: the workers may start STEP requests before
 * the first progress call, and STEP more after each call if `regrant`
 * (else none until the callback cancels). */
static void watch_start(watch *w, uint64_t cancel_after, bool regrant) {
    *w = (watch){.caller = pthread_self(), .from_caller = true, .monotonic = true, .cancel_after = cancel_after,
                 .regrant = regrant};
    ckptio__io_inject_hold(STEP);
}

static int on_progress(uint64_t done, uint64_t total, void *user) {
    watch *w = user;
    w->calls++;
    if (!pthread_equal(pthread_self(), w->caller)) w->from_caller = false;
    if (done < w->last_done || done > total || (w->total && total != w->total)) w->monotonic = false;
    w->last_done = done;
    w->total = total;
    if (done == total) w->finals++;
    else w->before_final = done;
    if (w->mark && !w->first_past && done >= w->mark) w->first_past = done;
    if (w->cancel_after && done >= w->cancel_after && !w->canceled_at) {
        w->canceled_at = done;
        ckptio__io_inject_release(); /* the held workers see the cancel once their request is done */
        return 1;
    }
    if (w->regrant) ckptio__io_inject_hold(STEP);
    return 0;
}

/* No worker waited in vain for a progress call (io_inject.h). */
static void check_hold(const char *what) {
    T_ASSERT_MSG(!ckptio__io_inject_hold_stalled(), "%s: the workers waited 30 s for a progress call", what);
}

static ckptio_engine *new_engine(int64_t threads, int64_t chunk, watch *w) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, CKPTIO_BACKEND_PREAD));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, chunk));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 0));
    T_OK(ckptio_engine_set_progress(e, on_progress, w));
    return e;
}

static uint64_t bytes_moved(ckptio_engine *e) {
    ckptio_stats s;
    T_OK(ckptio_engine_stats(e, &s));
    return s.bytes_read + s.bytes_written;
}

static void check_canceled(ckptio_status st, const watch *w, const char *what) {
    T_ASSERT_MSG(st == CKPTIO_E_CANCELED, "%s returned %s, not E_CANCELED (%s)", what, ckptio_status_name(st),
                 st == CKPTIO_OK ? "-" : ckptio_last_error_message());
    T_MESSAGE_HAS("canceled");
    T_ASSERT_MSG(w->canceled_at > 0, "%s: the callback never canceled", what);
    T_ASSERT_MSG(w->from_caller && w->monotonic, "%s: progress from a worker or not monotonic", what);
    check_hold(what);
}

/* ---- the GPU pipeline ---------------------------------------------------------- */

static void gpu_transfer_case(int64_t threads, ckptio_direction dir) {
    ckptio__gpu_sim_configure(NULL);
    unsigned char *data = malloc(BYTES);
    T_ASSERT(data);
    t_fill_random(data, BYTES, 7);
    const char *path = t_path("gpu.bin");
    t_write_file(path, data, BYTES);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(BYTES);
    T_ASSERT(dev);
    if (dir == CKPTIO_WRITE) memcpy(dev, data, BYTES);
    watch w;
    ckptio_engine *e = new_engine(threads, CHUNK, &w); /* 32 staging windows */
    ckptio_file *f = NULL;
    ckptio_plan *p = NULL;
    T_OK(ckptio_file_open(e, path, dir == CKPTIO_READ ? CKPTIO_OPEN_READ : CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE,
                          &f));
    T_OK(ckptio_plan_create(dir, &p));
    ckptio_extent x = {.file = f, .length = BYTES, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio_plan_add(p, &x));
    ckptio__io_inject_delay(3000); /* 3 ms per window */
    const char *what = dir == CKPTIO_READ ? "GPU read" : "GPU write";

    /* Uncanceled: progress comes during the GPU work, not only around it
     * (the first and the last call): 32 windows take at least 7 calls
     * between those on either number of threads. */
    watch_start(&w, 0, true);
    T_OK(ckptio_engine_execute(e, p));
    check_hold(what);
    T_ASSERT_MSG(w.calls >= 4, "only %d progress calls during a GPU transfer", w.calls);
    T_ASSERT(w.from_caller && w.monotonic && w.last_done == BYTES && w.total == BYTES);
    if (dir == CKPTIO_READ) T_ASSERT(memcmp(dev, data, BYTES) == 0);

    /* Canceled after some bytes: stops early. On 0 threads at most 4
     * windows move before the cancel; on 2, STEP before it and one per
     * worker after it. */
    const uint64_t before = bytes_moved(e);
    watch_start(&w, 1, false);
    check_canceled(ckptio_engine_execute(e, p), &w, what);
    const uint64_t moved = bytes_moved(e) - before;
    T_ASSERT_MSG(moved <= (STEP + 2) * CHUNK, "the canceled GPU transfer still moved %llu of %u bytes",
                 (unsigned long long)moved, BYTES);
    ckptio__io_inject_reset();

    /* The engine and its staging are fine afterwards. */
    T_OK(ckptio_engine_set_progress(e, NULL, NULL));
    memset(dev, 0, BYTES);
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    T_OK(ckptio_plan_add(p, &x));
    T_OK(ckptio_engine_execute(e, p));
    T_ASSERT(memcmp(dev, data, BYTES) == 0);
    ckptio_stats s;
    T_OK(ckptio_engine_stats(e, &s));
    T_ASSERT_MSG(s.staging_in_use == 0, "staging still in use: %llu", (unsigned long long)s.staging_in_use);
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_device_free(dev);
    free(data);
}

static void test_gpu_pipeline_reports_and_cancels(void) {
    gpu_transfer_case(0, CKPTIO_READ);
    gpu_transfer_case(2, CKPTIO_READ);
    gpu_transfer_case(0, CKPTIO_WRITE);
    gpu_transfer_case(2, CKPTIO_WRITE);
}

/* A plan of one host and one GPU extent: progress runs across both parts on
 * the plan's scale, and a cancel during the GPU part stops it. */
static void test_mixed_plan_cancels_in_gpu_part(void) {
    ckptio__gpu_sim_configure(NULL);
    unsigned char *data = malloc(2 * BYTES), *host = malloc(BYTES);
    T_ASSERT(data && host);
    t_fill_random(data, 2 * BYTES, 8);
    const char *path = t_path("mixed.bin");
    t_write_file(path, data, 2 * BYTES);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(BYTES);
    T_ASSERT(dev);
    watch w;
    ckptio_engine *e = new_engine(2, CHUNK, &w);
    ckptio_file *f = NULL;
    ckptio_plan *p = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    ckptio_extent xh = {.file = f, .length = BYTES, .memory = host, .mem_kind = CKPTIO_MEM_HOST};
    ckptio_extent xd = {.file = f, .file_offset = BYTES, .length = BYTES, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio_plan_add(p, &xh));
    T_OK(ckptio_plan_add(p, &xd));
    ckptio__io_inject_delay(3000);
    watch_start(&w, 0, true);
    T_OK(ckptio_engine_execute(e, p));
    check_hold("mixed plan");
    T_ASSERT(w.from_caller && w.monotonic && w.last_done == 2 * BYTES && w.total == 2 * BYTES);
    T_ASSERT(memcmp(host, data, BYTES) == 0 && memcmp(dev, data + BYTES, BYTES) == 0);
    /* Past the host part: inside the GPU part, which cannot finish between
     * two calls (STEP of its 32 windows at most). */
    watch_start(&w, BYTES + 1, true);
    check_canceled(ckptio_engine_execute(e, p), &w, "mixed plan");
    T_ASSERT(w.canceled_at < 2 * BYTES);
    ckptio__io_inject_reset();
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_device_free(dev);
    free(data);
    free(host);
}

/* ---- saves ----------------------------------------------------------------------- */

/* Six manifest blocks (4 MiB each). A save with checksums from GPU memory
 * stages whole blocks: one window per block, one to three write requests
 * each. With one block the window's only progress call is the final one,
 * whose answer is ignored (ckptio/core.h); with two, two workers could write
 * both before any call. With six, the STEP requests the hold lets through
 * finish at most four windows before a progress call, which cancels. */
#define SAVE_BYTES (6 * BYTES)

typedef enum save_kind { SAVE_SAFETENSORS, SAVE_SAFETENSORS_CHECKSUMS, SAVE_TORCH } save_kind;

static ckptio_status save(ckptio_engine *e, save_kind kind, const char *path, const void *mem,
                          ckptio_mem_kind mem_kind) {
    const int64_t shape[1] = {SAVE_BYTES};
    const ckptio_tensor_source t = {.name = "w", .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = shape,
                                    .data = mem, .nbytes = SAVE_BYTES, .mem_kind = mem_kind};
    switch (kind) {
    case SAVE_SAFETENSORS: return ckptio_safetensors_save(e, path, &t, 1, NULL, 0, 0);
    case SAVE_SAFETENSORS_CHECKSUMS:
        return ckptio_safetensors_save(e, path, &t, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS);
    case SAVE_TORCH: return ckptio_torch_save_tensors(e, path, &t, 1, NULL);
    }
    return CKPTIO_E_INVAL;
}

/* The older file at `path` and the bytes a save writes over it, in host or
 * simulated GPU memory. */
typedef struct save_fixture {
    const char *path;
    unsigned char *old, *fresh;
    void *mem;
    ckptio_mem_kind mem_kind;
} save_fixture;

static save_fixture fixture_make(const char *path, ckptio_mem_kind mem_kind, uint64_t seed) {
    ckptio__gpu_sim_configure(NULL);
    save_fixture f = {.path = path, .old = malloc(SAVE_BYTES), .fresh = malloc(SAVE_BYTES), .mem_kind = mem_kind};
    T_ASSERT(f.old && f.fresh);
    t_fill_random(f.old, SAVE_BYTES, seed);
    t_fill_random(f.fresh, SAVE_BYTES, seed + 1);
    t_write_file(path, f.old, SAVE_BYTES);
    f.mem = f.fresh;
    if (mem_kind == CKPTIO_MEM_CUDA) {
        f.mem = ckptio__gpu_sim_device_alloc(SAVE_BYTES);
        T_ASSERT(f.mem);
        memcpy(f.mem, f.fresh, SAVE_BYTES);
    }
    return f;
}

/* After a canceled save: the older file byte for byte, no temporary. */
static void fixture_check_kept(const save_fixture *f, const char *what) {
    size_t n = 0;
    unsigned char *now = t_read_file(f->path, &n);
    T_ASSERT_MSG(n == SAVE_BYTES && memcmp(now, f->old, SAVE_BYTES) == 0, "%s: the older file changed", what);
    free(now);
    T_ASSERT_MSG(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0, "%s: temporaries left in %s", what, t_tmpdir());
}

static void fixture_free(save_fixture *f) {
    if (f->mem_kind == CKPTIO_MEM_CUDA) ckptio__gpu_sim_device_free(f->mem);
    free(f->old);
    free(f->fresh);
}

static void save_case(save_kind kind, ckptio_mem_kind mem_kind, int64_t threads) {
    static const char *const names[] = {"safetensors", "safetensors+checksums", "torch"};
    char what[96];
    snprintf(what, sizeof what, "%s save from %s memory, %lld threads", names[kind],
             mem_kind == CKPTIO_MEM_CUDA ? "GPU" : "host", (long long)threads);
    const char *path = t_path("model.bin");
    char manifest[1024];
    T_OK(ckptio_manifest_path(path, manifest, sizeof manifest));
    remove(manifest);
    save_fixture f = fixture_make(path, mem_kind, 9);
    watch w;
    ckptio_engine *e = new_engine(threads, CHUNK, &w);
    ckptio__io_inject_delay(3000);
    watch_start(&w, 1, false);
    check_canceled(save(e, kind, path, f.mem, mem_kind), &w, what);
    ckptio__io_inject_reset();
    fixture_check_kept(&f, what);
    T_ASSERT_MSG(!t_file_exists(manifest), "%s: a manifest appeared", what);
    /* Uncanceled, the same save goes through. */
    T_OK(ckptio_engine_set_progress(e, NULL, NULL));
    T_OK(save(e, kind, path, f.mem, mem_kind));
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
    T_OK(ckptio_engine_destroy(e));
    remove(manifest);
    fixture_free(&f);
}

/* A torch save with CRCs is two plans (the data, whose CRCs the directory
 * needs, then the directory): progress sees one save, its total the file's
 * size, done == total once, at the end; a stop answered at the end of the
 * data cancels the save before the directory is written. */
static void torch_save_case(ckptio_mem_kind mem_kind, int64_t threads) {
    char what[96];
    snprintf(what, sizeof what, "torch save from %s memory, %lld threads", mem_kind == CKPTIO_MEM_CUDA ? "GPU" : "host",
             (long long)threads);
    const char *path = t_path("model.pt");
    save_fixture f = fixture_make(path, mem_kind, 11);
    watch w;
    ckptio_engine *e = new_engine(threads, CHUNK, &w);
    ckptio__io_inject_delay(3000);
    watch_start(&w, 0, true);
    w.mark = SAVE_BYTES;
    T_OK(save(e, SAVE_TORCH, path, f.mem, mem_kind));
    check_hold(what);
    size_t n = 0;
    free(t_read_file(path, &n));
    T_ASSERT_MSG(w.from_caller && w.monotonic, "%s: progress from a worker, or not monotonic on one total", what);
    T_ASSERT_MSG(w.total == n && w.last_done == n && w.finals == 1,
                 "%s: total %llu, last %llu, %d reports of done == total (want the file's %zu bytes, once, last)",
                 what, (unsigned long long)w.total, (unsigned long long)w.last_done, w.finals, n);
    /* The data plan's end is always reported (the end of each plan of a span is), so the first report
     * past the tensors' bytes comes at or before it: a stop answered there cancels before the directory
     * is written, whether or not a periodic report fell inside the directory's own plan. */
    const uint64_t data_end = w.first_past;
    T_ASSERT_MSG(data_end >= SAVE_BYTES && data_end <= w.before_final && w.before_final < n,
                 "%s: the first report past the data said %llu, the last before the end %llu of %zu", what,
                 (unsigned long long)data_end, (unsigned long long)w.before_final, n);
    t_write_file(path, f.old, SAVE_BYTES);
    watch_start(&w, data_end, true);
    check_canceled(save(e, SAVE_TORCH, path, f.mem, mem_kind), &w, what);
    ckptio__io_inject_reset();
    fixture_check_kept(&f, what);
    T_OK(ckptio_engine_destroy(e));
    fixture_free(&f);
}

static void test_torch_save_reports_one_transfer(void) {
    for (int64_t threads = 0; threads <= 2; threads += 2) {
        torch_save_case(CKPTIO_MEM_HOST, threads);
        torch_save_case(CKPTIO_MEM_CUDA, threads);
    }
}

static void test_canceled_saves_keep_the_old_file(void) {
    for (int kind = SAVE_SAFETENSORS; kind <= SAVE_TORCH; kind++)
        for (int64_t threads = 0; threads <= 2; threads += 2) {
            save_case((save_kind)kind, CKPTIO_MEM_HOST, threads);
            save_case((save_kind)kind, CKPTIO_MEM_CUDA, threads);
        }
}

int main(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    T_RUN(test_gpu_pipeline_reports_and_cancels);
    T_RUN(test_mixed_plan_cancels_in_gpu_part);
    T_RUN(test_canceled_saves_keep_the_old_file);
    T_RUN(test_torch_save_reports_one_transfer);
    ckptio__gpu_set_ops(NULL);
    return T_EXIT_PASS;
}
