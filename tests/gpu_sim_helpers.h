/*
 * gpu_sim_helpers.h - what the tests of the GPU staging pipeline on the
 * simulated device (tests/doubles/gpu_sim.c) share: engines with a given
 * geometry, the simulator's checks (no staging slot reused before its copy
 * completed, contexts balanced, pinned bytes within a bound), the engine's
 * staging accounting, and files of known random bytes.
 */
#ifndef CKPTIO_TEST_GPU_SIM_HELPERS_H
#define CKPTIO_TEST_GPU_SIM_HELPERS_H

#include "engine_internal.h"
#include "gpu_sim.h"
#include "helpers.h"

#include <stdlib.h>
#include <time.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static inline ckptio_engine *make_engine_path(int64_t threads, int64_t staging, int64_t chunk, ckptio_gpu_path path) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, staging));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, chunk));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, path));
    return e;
}

/* The staging pipeline (the simulated device has no cuFile anyway). */
static inline ckptio_engine *make_engine(int64_t threads, int64_t staging, int64_t chunk) {
    return make_engine_path(threads, staging, chunk, CKPTIO_GPU_PATH_PIPELINE);
}

static inline void sim_reset(unsigned delay_us) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = delay_us};
    ckptio__gpu_sim_configure(&cfg);
}

static inline void check_sim_clean(uint64_t staging_bound) {
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT_MSG(s.violations == 0, "%llu staging slots were modified while their copy was in flight",
                 (unsigned long long)s.violations);
    T_ASSERT_MSG(s.ctx_depth == 0, "context pushes and pops unbalanced: %lld", (long long)s.ctx_depth);
    T_ASSERT_MSG(s.pinned_peak <= staging_bound, "pinned peak %llu above the staging bound %llu",
                 (unsigned long long)s.pinned_peak, (unsigned long long)staging_bound);
}

static inline void check_engine_staging(ckptio_engine *e, uint64_t bound) {
    ckptio_stats st;
    T_OK(ckptio_engine_stats(e, &st));
    T_ASSERT_MSG(st.staging_in_use == 0, "staging still in use after the transfer: %llu",
                 (unsigned long long)st.staging_in_use);
    T_ASSERT_MSG(st.staging_reserved <= bound && st.staging_peak <= bound,
                 "staging reserved %llu / peak %llu above bound %llu", (unsigned long long)st.staging_reserved,
                 (unsigned long long)st.staging_peak, (unsigned long long)bound);
}

/* A file of `size` random bytes; returns its contents (caller frees). */
static inline unsigned char *make_file(const char *path, size_t size, uint64_t seed) {
    unsigned char *data = malloc(size ? size : 1);
    T_ASSERT(data);
    t_fill_random(data, size, seed);
    t_write_file(path, data, size);
    return data;
}

/* make_file(path, size, seed), opened for reading on `e` into *f; returns the file's contents. */
static inline unsigned char *open_made_file(ckptio_engine *e, const char *path, size_t size, uint64_t seed,
                                            ckptio_file **f) {
    unsigned char *want = make_file(path, size, seed);
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, f));
    return want;
}

/* The file at `path` holds exactly `expect` (`size` bytes); a byte the
 * simulator poisoned says which copy was read too early. */
static inline void check_file_bytes(const char *path, const unsigned char *expect, size_t size) {
    size_t got_len = 0;
    unsigned char *got = t_read_file(path, &got_len);
    T_ASSERT_MSG(got_len == size, "%s has %zu bytes, expected %zu", path, got_len, size);
    for (size_t i = 0; i < size; i++)
        T_ASSERT_MSG(got[i] == expect[i], "file byte %zu is 0x%02x, expected 0x%02x%s", i, got[i], expect[i],
                     got[i] == CKPTIO_SIM_POISON_D2H ? " (staging read before its copy completed)" : "");
    free(got);
}

/* Waits up to 5 s for the simulated device to have made `allocs` pinned
 * allocations; returns how many it made. */
static inline uint64_t wait_pinned_allocs(uint64_t allocs) {
    ckptio__gpu_sim_stats s;
    for (int i = 0; i < 5000; i++) {
        ckptio__gpu_sim_get_stats(&s);
        if (s.pinned_allocs >= allocs) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ckptio__gpu_sim_get_stats(&s);
    return s.pinned_allocs;
}

#endif /* CKPTIO_TEST_GPU_SIM_HELPERS_H */
