/*
 * test_engine_settings.c - engine settings: defaults, bounds, setters and
 * getters, environment variables (read once at create, errors named), the
 * backend choice (AUTO falls back, a forced io_uring that cannot run fails).
 */
#include "helpers.h"
#include "io_internal.h"

#include <errno.h>
#include <sched.h>
#include <string.h>

static const char *const env_names[] = {"CKPTIO_BACKEND", "CKPTIO_THREADS", "CKPTIO_CHUNK_BYTES",
                                        "CKPTIO_QUEUE_DEPTH", "CKPTIO_STAGING_BYTES", "CKPTIO_DIRECT",
                                        "CKPTIO_DIRECT_MIN_BYTES", "CKPTIO_SYNC", "CKPTIO_GPU_PATH",
                                        "CKPTIO_READ_CACHE", "CKPTIO_S3_CONCURRENCY", "CKPTIO_S3_PART_BYTES",
                                        "CKPTIO_S3_RETRIES", "CKPTIO_S3_TIMEOUT_MS", "CKPTIO_S3_DEADLINE_MS",
                                        "CKPTIO_S3_BACKOFF_MS"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof env_names / sizeof *env_names; i++) unsetenv(env_names[i]);
}

static int64_t get(ckptio_engine *e, ckptio_option o) {
    int64_t v = -12345;
    T_OK(ckptio_engine_get(e, o, &v));
    return v;
}

static void test_defaults_and_names(void) {
    clear_env();
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    cpu_set_t set;
    T_ASSERT(sched_getaffinity(0, sizeof set, &set) == 0);
    int64_t cores = CPU_COUNT(&set), want = cores < 2 ? 2 : cores > 16 ? 16 : cores;
    T_ASSERT(get(e, CKPTIO_OPT_THREADS) == want);
    T_ASSERT(get(e, CKPTIO_OPT_BACKEND) == CKPTIO_BACKEND_AUTO);
    T_ASSERT(get(e, CKPTIO_OPT_CHUNK_BYTES) == 8 << 20);
    T_ASSERT(get(e, CKPTIO_OPT_QUEUE_DEPTH) == 16);
    T_ASSERT(get(e, CKPTIO_OPT_STAGING_BYTES) == 256 << 20);
    T_ASSERT(get(e, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_AUTO);
    T_ASSERT(get(e, CKPTIO_OPT_DIRECT_MIN_BYTES) == 1 << 20);
    T_ASSERT(get(e, CKPTIO_OPT_SYNC) == 1);
    T_ASSERT(get(e, CKPTIO_OPT_GPU_PATH) == CKPTIO_GPU_PATH_AUTO);
    T_ASSERT(get(e, CKPTIO_OPT_READ_CACHE) == CKPTIO_READ_CACHE_AUTO);
    T_ASSERT(get(e, CKPTIO_OPT_S3_CONCURRENCY) == 16);
    T_ASSERT(get(e, CKPTIO_OPT_S3_PART_BYTES) == 16 << 20);
    T_ASSERT(get(e, CKPTIO_OPT_S3_RETRIES) == 8);
    T_ASSERT(get(e, CKPTIO_OPT_S3_TIMEOUT_MS) == 30000);
    T_ASSERT(get(e, CKPTIO_OPT_S3_DEADLINE_MS) == 300000);
    T_ASSERT(get(e, CKPTIO_OPT_S3_BACKOFF_MS) == 200);
    ckptio_backend b;
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == (ckptio__io_uring_probe(NULL) == 0 ? CKPTIO_BACKEND_IO_URING : CKPTIO_BACKEND_PREAD));

    static const char *const names[] = {"backend", "threads", "chunk_bytes", "queue_depth", "staging_bytes",
                                        "direct", "direct_min_bytes", "sync", "gpu_path", "read_cache",
                                        "s3_concurrency", "s3_part_bytes", "s3_retries", "s3_timeout_ms",
                                        "s3_deadline_ms", "s3_backoff_ms"};
    for (int o = 0; o < CKPTIO_OPT_COUNT_; o++) T_ASSERT(strcmp(ckptio_option_name((ckptio_option)o), names[o]) == 0);
    T_ASSERT(ckptio_option_name(CKPTIO_OPT_COUNT_) == NULL);
    T_ASSERT(strcmp(ckptio_backend_name(CKPTIO_BACKEND_AUTO), "auto") == 0);
    T_ASSERT(strcmp(ckptio_backend_name(CKPTIO_BACKEND_PREAD), "pread") == 0);
    T_ASSERT(strcmp(ckptio_backend_name(CKPTIO_BACKEND_IO_URING), "io_uring") == 0);
    int64_t v;
    T_STATUS(ckptio_engine_get(e, CKPTIO_OPT_COUNT_, &v), CKPTIO_E_INVAL);
    T_STATUS(ckptio_engine_set(e, (ckptio_option)-1, 1), CKPTIO_E_INVAL);
    T_OK(ckptio_engine_destroy(e));
    T_OK(ckptio_engine_destroy(NULL));
}

static void test_bounds(void) {
    clear_env();
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    for (int o = 0; o < CKPTIO_OPT_COUNT_; o++) {
        int64_t lo, hi;
        T_OK(ckptio_option_bounds((ckptio_option)o, &lo, &hi));
        T_ASSERT(lo <= hi);
        const int64_t before = get(e, (ckptio_option)o);
        T_ASSERT(before >= lo && before <= hi); /* the default is inside */
        T_STATUS(ckptio_engine_set(e, (ckptio_option)o, lo - 1), CKPTIO_E_RANGE);
        T_MESSAGE_HAS(ckptio_option_name((ckptio_option)o));
        T_STATUS(ckptio_engine_set(e, (ckptio_option)o, hi + 1), CKPTIO_E_RANGE);
        T_ASSERT(get(e, (ckptio_option)o) == before); /* unchanged after a refusal */
        if (o == CKPTIO_OPT_BACKEND && ckptio__io_uring_probe(NULL) != 0) continue;
        T_OK(ckptio_engine_set(e, (ckptio_option)o, hi));
        T_ASSERT(get(e, (ckptio_option)o) == hi);
        T_OK(ckptio_engine_set(e, (ckptio_option)o, lo));
        T_ASSERT(get(e, (ckptio_option)o) == lo);
    }
    int64_t lo, hi;
    T_OK(ckptio_option_bounds(CKPTIO_OPT_THREADS, &lo, &hi));
    T_ASSERT(lo == 0 && hi == 256);
    T_OK(ckptio_option_bounds(CKPTIO_OPT_CHUNK_BYTES, &lo, &hi));
    T_ASSERT(lo == 4096 && hi == 1 << 30);
    T_STATUS(ckptio_option_bounds(CKPTIO_OPT_COUNT_, &lo, &hi), CKPTIO_E_INVAL);
    T_STATUS(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 5000), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("not a multiple of 4096");
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 3 * 4096));
    T_ASSERT(get(e, CKPTIO_OPT_CHUNK_BYTES) == 3 * 4096);
    T_OK(ckptio_engine_destroy(e));
}

static void test_env(void) {
    clear_env();
    setenv("CKPTIO_BACKEND", "pread", 1);
    setenv("CKPTIO_THREADS", "3", 1);
    setenv("CKPTIO_CHUNK_BYTES", "64K", 1);
    setenv("CKPTIO_QUEUE_DEPTH", "4", 1);
    setenv("CKPTIO_STAGING_BYTES", "2MiB", 1);
    setenv("CKPTIO_DIRECT", "OFF", 1);
    setenv("CKPTIO_DIRECT_MIN_BYTES", "0", 1);
    setenv("CKPTIO_SYNC", "false", 1);
    setenv("CKPTIO_GPU_PATH", "pipeline", 1);
    setenv("CKPTIO_READ_CACHE", "Off", 1);
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_ASSERT(get(e, CKPTIO_OPT_BACKEND) == CKPTIO_BACKEND_PREAD);
    T_ASSERT(get(e, CKPTIO_OPT_THREADS) == 3);
    T_ASSERT(get(e, CKPTIO_OPT_CHUNK_BYTES) == 64 << 10);
    T_ASSERT(get(e, CKPTIO_OPT_QUEUE_DEPTH) == 4);
    T_ASSERT(get(e, CKPTIO_OPT_STAGING_BYTES) == 2 << 20);
    T_ASSERT(get(e, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_OFF);
    T_ASSERT(get(e, CKPTIO_OPT_DIRECT_MIN_BYTES) == 0);
    T_ASSERT(get(e, CKPTIO_OPT_SYNC) == 0);
    T_ASSERT(get(e, CKPTIO_OPT_GPU_PATH) == CKPTIO_GPU_PATH_PIPELINE);
    T_ASSERT(get(e, CKPTIO_OPT_READ_CACHE) == CKPTIO_READ_CACHE_OFF);
    ckptio_backend b;
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == CKPTIO_BACKEND_PREAD);
    /* Read once: changing the environment later changes nothing. */
    setenv("CKPTIO_THREADS", "5", 1);
    T_ASSERT(get(e, CKPTIO_OPT_THREADS) == 3);
    T_OK(ckptio_engine_destroy(e));
    setenv("CKPTIO_SYNC", "on", 1);
    T_OK(ckptio_engine_create(&e));
    T_ASSERT(get(e, CKPTIO_OPT_THREADS) == 5 && get(e, CKPTIO_OPT_SYNC) == 1);
    T_OK(ckptio_engine_destroy(e));

    /* Malformed or out-of-range values fail creation, naming the variable. */
    struct {
        const char *var, *value, *needle;
        ckptio_status want;
    } bad[] = {
        {"CKPTIO_THREADS", "abc", "CKPTIO_THREADS: \"abc\" is not an integer", CKPTIO_E_INVAL},
        {"CKPTIO_THREADS", "999", "outside [0, 256]", CKPTIO_E_RANGE},
        {"CKPTIO_CHUNK_BYTES", "5000", "not a multiple of 4096", CKPTIO_E_RANGE},
        {"CKPTIO_CHUNK_BYTES", "8Q", "CKPTIO_CHUNK_BYTES: \"8Q\" is not a byte count", CKPTIO_E_INVAL},
        {"CKPTIO_DIRECT", "maybe", "CKPTIO_DIRECT: \"maybe\" is not one of auto|off|on", CKPTIO_E_INVAL},
        {"CKPTIO_SYNC", "2", "CKPTIO_SYNC", CKPTIO_E_INVAL},
        {"CKPTIO_BACKEND", "spdk", "auto|pread|io_uring", CKPTIO_E_INVAL},
        {"CKPTIO_READ_CACHE", "always", "CKPTIO_READ_CACHE: \"always\" is not one of auto|on|off", CKPTIO_E_INVAL},
        {"CKPTIO_STAGING_BYTES", "4K", "CKPTIO_STAGING_BYTES", CKPTIO_E_RANGE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        clear_env();
        setenv(bad[i].var, bad[i].value, 1);
        e = (ckptio_engine *)0x1;
        T_STATUS(ckptio_engine_create(&e), bad[i].want);
        T_ASSERT(e == NULL);
        T_MESSAGE_HAS(bad[i].needle);
    }
    clear_env();
}

static void test_backend_choice(void) {
    clear_env();
    /* A kernel that refuses io_uring (simulated): AUTO falls back silently,
     * a forced io_uring is an error at create and at set. */
    ckptio__io_uring_force_refusal(EPERM);
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    ckptio_backend b;
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == CKPTIO_BACKEND_PREAD);
    T_STATUS(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, CKPTIO_BACKEND_IO_URING), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("io_uring backend was requested but cannot run");
    T_ASSERT(ckptio_last_error()->sys_errno == EPERM);
    T_ASSERT(get(e, CKPTIO_OPT_BACKEND) == CKPTIO_BACKEND_AUTO);
    T_OK(ckptio_engine_destroy(e));
    setenv("CKPTIO_BACKEND", "io_uring", 1);
    T_STATUS(ckptio_engine_create(&e), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("CKPTIO_BACKEND");
    ckptio__io_uring_force_refusal(0);
    clear_env();

    const char *why;
    if (ckptio__io_uring_probe(&why) != 0) {
        printf("# io_uring part skipped: %s\n", why);
        return;
    }
    setenv("CKPTIO_BACKEND", "io_uring", 1);
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == CKPTIO_BACKEND_IO_URING);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, CKPTIO_BACKEND_PREAD));
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == CKPTIO_BACKEND_PREAD);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, CKPTIO_BACKEND_AUTO));
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == CKPTIO_BACKEND_IO_URING);
    T_OK(ckptio_engine_destroy(e));
    clear_env();
}

int main(void) {
    T_RUN(test_defaults_and_names);
    T_RUN(test_bounds);
    T_RUN(test_env);
    T_RUN(test_backend_choice);
    return 0;
}
