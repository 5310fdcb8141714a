/*
 * test_objstore_gpu.c - how an s3:// object reaches device memory (the
 * simulated device), seen from the server's side: tests/s3_fault_proxy.py
 * stands between ckptio and a real S3 server (skipped, exit 77, without
 * one) and logs every request with its range and when it started and ended.
 * A load into device memory asks for the object in ranged GETs of the
 * engine's chunk size, as a load into host memory does, with no more of them
 * in flight than CKPTIO_OPT_S3_CONCURRENCY; the bytes arrive intact. A
 * local file's load after it keeps the engine's larger pinned slots.
 */
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "objstore_helpers.h"

#define MAX_GETS 256

typedef struct get_log {
    uint64_t first[MAX_GETS], last[MAX_GETS]; /* the ranges asked for, inclusive */
    double start[MAX_GETS], end[MAX_GETS];
    size_t n;
} get_log;

/* The ranged GETs in the proxy's log. */
static void read_gets(get_log *g) {
    s3_request_log *all = calloc(1, sizeof *all);
    T_ASSERT(all);
    s3_read_requests(all);
    g->n = 0;
    for (size_t i = 0; i < all->n; i++) {
        if (strcmp(all->method[i], "GET") || strncmp(all->range[i], "bytes=", 6)) continue;
        T_ASSERT(g->n < MAX_GETS);
        unsigned long long a, b;
        T_ASSERT_MSG(sscanf(all->range[i], "bytes=%llu-%llu", &a, &b) == 2, "range %s", all->range[i]);
        g->first[g->n] = a;
        g->last[g->n] = b;
        g->start[g->n] = all->start[i];
        g->end[g->n] = all->end[i];
        g->n++;
    }
    free(all);
}

/* The most GETs the server was answering at one moment. */
static size_t most_in_flight(const get_log *g) {
    size_t most = 0;
    for (size_t i = 0; i < g->n; i++) {
        size_t n = 0;
        for (size_t j = 0; j < g->n; j++) n += g->start[j] <= g->start[i] && g->end[j] > g->start[i];
        if (n > most) most = n;
    }
    return most;
}

static void put_object(const char *url, const void *data, size_t n) {
    ckptio_engine *e = s3_test_engine();
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, (void *)data, n, 0));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
}

/* Reads [0, n) of `name` into new device memory on engine `e` and checks the bytes. */
static void load_into_device(ckptio_engine *e, const char *name, const unsigned char *want, size_t n) {
    unsigned char *dev = ckptio__gpu_sim_device_alloc(n);
    T_ASSERT(dev);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, name, CKPTIO_OPEN_READ, &f));
    const ckptio_extent x = {.file = f, .file_offset = 0, .length = n, .memory = dev, .mem_kind = CKPTIO_MEM_CUDA};
    T_OK(ckptio_engine_execute_extents(e, CKPTIO_READ, &x, 1));
    T_OK(ckptio_file_close(f));
    T_ASSERT_MSG(memcmp(dev, want, n) == 0, "%s: the bytes differ in device memory", name);
    ckptio__gpu_sim_device_free(dev);
}

/* Loads `url` (n bytes) into device memory through the proxy with `threads`
 * workers, `concurrency` GETs in flight and `chunk`-byte GETs, then checks
 * the GETs: chunk-sized but for the object's tail, covering the object
 * once, at most `concurrency` in flight. */
static void load_and_count(const char *url, const unsigned char *want, size_t n, unsigned threads,
                           unsigned concurrency, uint64_t chunk) {
    const char *const no_rules[] = {NULL};
    proxy_start(no_rules);
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, concurrency));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, (int64_t)chunk));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_PIPELINE));
    load_into_device(e, url, want, n);
    T_OK(ckptio_engine_destroy(e));
    get_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    const size_t want_gets = (n + chunk - 1) / chunk;
    read_gets(g);
    proxy_stop("pass");
    T_ASSERT_MSG(g->n == want_gets, "%zu ranged GETs for %zu bytes in GETs of %llu (want %zu)", g->n, n,
                 (unsigned long long)chunk, want_gets);
    uint64_t covered = 0;
    for (size_t i = 0; i < g->n; i++) {
        const uint64_t size = g->last[i] - g->first[i] + 1;
        const bool tail = g->last[i] == n - 1;
        T_ASSERT_MSG(size == chunk || (tail && size < chunk), "GET %zu asks for bytes %llu-%llu: %llu, not %llu", i,
                     (unsigned long long)g->first[i], (unsigned long long)g->last[i], (unsigned long long)size,
                     (unsigned long long)chunk);
        T_ASSERT_MSG(g->first[i] % chunk == 0, "GET %zu starts at %llu", i, (unsigned long long)g->first[i]);
        covered += size;
    }
    T_ASSERT_MSG(covered == n, "the GETs asked for %llu bytes of %zu", (unsigned long long)covered, n);
    const size_t most = most_in_flight(g);
    T_ASSERT_MSG(most <= concurrency, "%zu GETs in flight at once, S3 concurrency %u", most, concurrency);
    free(g);
}

/* One GET per window, as many workers as GETs in flight, and several GETs
 * per window where the S3 concurrency is more than the workers. */
static void test_device_loads_get_whole_chunks(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    const size_t n = (40u << 20) + 12345;
    unsigned char *data = malloc(n);
    T_ASSERT(data);
    t_fill_random(data, n, 77);
    const char *url = s3_url("gpu-gets.bin");
    put_object(url, data, n);
    load_and_count(url, data, n, 4, 4, 8u << 20);  /* 4 workers, one 8 MiB GET each */
    load_and_count(url, data, n, 2, 8, 8u << 20);  /* 2 workers, 4 GETs of 8 MiB per window */
    load_and_count(url, data, n, 16, 6, 2u << 20); /* more threads than GETs in flight: 6 workers */
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free(data);
    ckptio__gpu_set_ops(NULL);
}

/* The slots an object load pinned (of 8 MiB) serve a local file's load next
 * on the same engine: nothing is freed to be pinned again at 4 MiB (freeing
 * pinned memory synchronises the device), and the bytes arrive. */
static void test_file_load_keeps_object_slots(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    const size_t n = (24u << 20) + 777;
    unsigned char *data = malloc(n);
    T_ASSERT(data);
    t_fill_random(data, n, 78);
    const char *url = s3_url("gpu-slots.bin"), *path = t_path("gpu-slots.bin");
    put_object(url, data, n);
    t_write_file(path, data, n);
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 4));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 4));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_PIPELINE));
    ckptio__gpu_sim_stats object, file;
    load_into_device(e, url, data, n);
    ckptio__gpu_sim_get_stats(&object);
    T_ASSERT_MSG(object.pinned_now && object.pinned_now % (8u << 20) == 0, "%llu bytes pinned, not 8 MiB slots",
                 (unsigned long long)object.pinned_now);
    load_into_device(e, path, data, n);
    ckptio__gpu_sim_get_stats(&file);
    /* Workers may pin their second slot (on demand), of the same size. */
    T_ASSERT_MSG(file.pinned_frees == object.pinned_frees && (file.pinned_now - object.pinned_now) % (8u << 20) == 0,
                 "the file's load re-pinned: %llu frees, %llu bytes pinned (%llu before)",
                 (unsigned long long)(file.pinned_frees - object.pinned_frees), (unsigned long long)file.pinned_now,
                 (unsigned long long)object.pinned_now);
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free(data);
    ckptio__gpu_set_ops(NULL);
}

int main(void) {
    s3_test_bucket();
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    signal(SIGPIPE, SIG_IGN);
    T_RUN(test_device_loads_get_whole_chunks);
    T_RUN(test_file_load_keeps_object_slots);
    return T_EXIT_PASS;
}
