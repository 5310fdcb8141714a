/*
 * settings.c - the one table of ckptio's settings and what is derived from
 * it: defaults, bounds, names, the environment variables read when an
 * engine is created, ckptio_engine_set/get (and the backend a setting
 * resolves to), and the list of names the misspelling check (env_check.c)
 * knows.
 *
 * Adding a setting: its value at the end of ckptio_option (ckptio/core.h) and
 * one ROW below; docs/ENGINE.md#5-settings then needs the row that
 * tests/test_engine_settings.c prints for it until it is there.
 */
#include "engine_private.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define KIB (1ll << 10)
#define MIB (1ll << 20)
#define GIB (1ll << 30)

static const char *const backend_names[] = {"auto", "pread", "io_uring", NULL};
static const char *const direct_names[] = {"auto", "off", "on", NULL};
static const char *const gpu_path_names[] = {"auto", "cufile", "pipeline", NULL};
static const char *const read_cache_names[] = {"auto", "on", "off", NULL};
static const char *const write_cache_names[] = {"auto", "on", "off", NULL};
static const char *const huge_slots_names[] = {"auto", "off", "on", NULL};

/* Threads: one per core up to 16, at least 2. Page-cache reads scale with
 * threads while disk-bound transfers do not lose with more, and 2 keeps one
 * request queued behind the running one on small machines
 * (docs/ENGINE.md#6-measurements). */
static int64_t default_threads(void) {
    cpu_set_t set;
    long n = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (n <= 0) n = 2;
    return n < 2 ? 2 : n > 16 ? 16 : n;
}

/* ROW(ID, name, kind, default, min, max, multiple, value names, docs line): the setting CKPTIO_OPT_<ID>, read
 * from the environment variable CKPTIO_<ID>. ROW_FN: the default is computed when an engine is created. */
#define ROW(ID, name, kind, def, min, max, mult, names, doc)                                                          \
    [CKPTIO_OPT_##ID] = {name, "CKPTIO_" #ID, CKPTIO__SETTING_##kind, def, NULL, NULL, min, max, mult, names, doc}
#define ROW_FN(ID, name, kind, fn, fn_doc, min, max, doc)                                                             \
    [CKPTIO_OPT_##ID] = {name, "CKPTIO_" #ID, CKPTIO__SETTING_##kind, 0, fn, fn_doc, min, max, 0, NULL, doc}

static const ckptio__setting settings[CKPTIO_OPT_COUNT_] = {
    ROW(BACKEND, "backend", ENUM, CKPTIO_BACKEND_AUTO, 0, 2, 0, backend_names, "I/O backend (section 3)"),
    ROW_FN(THREADS, "threads", INT, default_threads, "min(cores, 16), at least 2", 0, 256,
           "I/O worker threads; 0 runs every transfer on the caller"),
    ROW(CHUNK_BYTES, "chunk_bytes", SIZE, 8 * MIB, 4 * KIB, 1 * GIB, CKPTIO_DIRECT_ALIGN, NULL,
        "largest single I/O request"),
    ROW(QUEUE_DEPTH, "queue_depth", INT, 16, 1, 1024, 0, NULL, "requests in flight per io_uring worker"),
    ROW(STAGING_BYTES, "staging_bytes", SIZE, 256 * MIB, 1 * MIB, 1024 * GIB, 0, NULL,
        "bounce and pinned staging memory of all workers together"),
    ROW(DIRECT, "direct", ENUM, CKPTIO_DIRECT_AUTO, 0, 2, 0, direct_names, "O_DIRECT (section 2)"),
    ROW(DIRECT_MIN_BYTES, "direct_min_bytes", SIZE, 1 * MIB, 0, 1024 * GIB, 0, NULL,
        "smaller transfers go through the page cache"),
    ROW(SYNC, "sync", BOOL, 1, 0, 1, 0, NULL, "fsync files and directories at commit"),
    ROW(GPU_PATH, "gpu_path", ENUM, CKPTIO_GPU_PATH_AUTO, 0, 2, 0, gpu_path_names,
        "cuFile or the staging pipeline (docs/GPU.md#paths)"),
    ROW(READ_CACHE, "read_cache", ENUM, CKPTIO_READ_CACHE_AUTO, 0, 2, 0, read_cache_names,
        "cold reads through the page cache (section 2, read policy)"),
    ROW(GPU_HUGE_SLOTS, "gpu_huge_slots", ENUM, CKPTIO_HUGE_SLOTS_AUTO, 0, 2, 0, huge_slots_names,
        "pinned staging on huge pages (docs/GPU.md#huge-slots)"),
    ROW(NVTX, "nvtx", BOOL, 1, 0, 1, 0, NULL, "NVTX ranges around GPU transfers where libnvToolsExt.so.1 loads"),
    ROW(S3_CONCURRENCY, "s3_concurrency", INT, 16, 1, 256, 0, NULL,
        "s3:// requests in flight per transfer (docs/OBJECT_STORAGE.md)"),
    ROW(S3_PART_BYTES, "s3_part_bytes", SIZE, 16 * MIB, 5 * MIB, 5 * GIB, 0, NULL,
        "smallest multipart part (grows with the object)"),
    ROW(S3_RETRIES, "s3_retries", INT, 8, 0, 100, 0, NULL, "retries of a failed s3:// request"),
    ROW(S3_TIMEOUT_MS, "s3_timeout_ms", INT, 30 * 1000, 1000, 3600 * 1000, 0, NULL,
        "an s3:// attempt without progress this long fails"),
    ROW(S3_DEADLINE_MS, "s3_deadline_ms", INT, 300 * 1000, 1000, 24 * 3600 * 1000, 0, NULL,
        "one s3:// request, all its attempts together"),
    ROW(S3_BACKOFF_MS, "s3_backoff_ms", INT, 200, 1, 60 * 1000, 0, NULL,
        "first retry's backoff ceiling (doubling, 20 s at most)"),
    ROW(S3_LEASE_MS, "s3_lease_ms", INT, 60 * 1000, 1000, 24 * 3600 * 1000, 0, NULL,
        "an s3:// directory's save lease lapses this long after its holder stops renewing it"),
    ROW(WRITE_CACHE, "write_cache", ENUM, CKPTIO_WRITE_CACHE_AUTO, 0, 2, 0, write_cache_names,
        "saved files left in the page cache (section 2, the cache after a save)"),
    ROW(S3_BUFFERS_KEEP_MS, "s3_buffers_keep_ms", INT, 60 * 1000, 0, 24 * 3600 * 1000, 0, NULL,
        "s3:// upload part buffers no upload uses are kept this long for the next upload (0: freed at once)"),
};

/* Variables read outside an engine's settings: once per process, before any engine may exist (the driver
 * libraries are loaded once, for ckptio_cuda_available() too), or by the CLI. */
static const ckptio__variable variables[] = {
    {CKPTIO__ENV_CUDA_LIBRARY, "the CUDA driver library to load (default libcuda.so.1), read at its first use"},
    {CKPTIO__ENV_CUFILE_LIBRARY, "the cuFile library to load (default libcufile.so.0), read at its first use"},
    {"CKPTIO_NO_PROGRESS", "the ckptio command: no progress bars"},
    {"CKPTIO_S3_ADDRESSING",
     "s3:// addressing (path, virtual or auto), read with the endpoint (docs/OBJECT_STORAGE.md)"},
    {"CKPTIO_S3_SIGN_PAYLOAD",
     "s3:// payload signing (auto, on or off), read with the endpoint (docs/OBJECT_STORAGE.md)"},
    {NULL, NULL},
};

const ckptio__setting *ckptio__setting_def(ckptio_option option) {
    return (unsigned)option < CKPTIO_OPT_COUNT_ ? &settings[option] : NULL;
}

const ckptio__variable *ckptio__variable_def(size_t i) {
    return i < sizeof variables / sizeof *variables - 1 ? &variables[i] : NULL;
}

const char *ckptio__option_env(ckptio_option option) { return settings[option].env; }

static void settings_defaults(int64_t *values) {
    for (int i = 0; i < CKPTIO_OPT_COUNT_; i++)
        values[i] = settings[i].compute ? settings[i].compute() : settings[i].def;
}

const char *ckptio_option_name(ckptio_option option) {
    if ((unsigned)option >= CKPTIO_OPT_COUNT_) return NULL;
    return settings[option].name;
}

const char *ckptio_option_value_name(ckptio_option option, int64_t value) {
    if ((unsigned)option >= CKPTIO_OPT_COUNT_) return NULL;
    const ckptio__setting *d = &settings[option];
    if (d->kind != CKPTIO__SETTING_ENUM || value < d->min || value > d->max) return NULL;
    return d->names[value];
}

const char *ckptio_backend_name(ckptio_backend backend) {
    const char *name = ckptio_option_value_name(CKPTIO_OPT_BACKEND, backend);
    return name ? name : "unknown";
}

ckptio_status ckptio_option_bounds(ckptio_option option, int64_t *min, int64_t *max) {
    CKPTIO_RETURN_IF((unsigned)option >= CKPTIO_OPT_COUNT_, CKPTIO_E_INVAL, "unknown engine option %d", (int)option);
    if (min) *min = settings[option].min;
    if (max) *max = settings[option].max;
    return CKPTIO_OK;
}

/* CKPTIO_E_RANGE (error record set) unless `value` is within the setting's bounds. */
static ckptio_status setting_check(ckptio_option option, int64_t value) {
    CKPTIO_RETURN_IF((unsigned)option >= CKPTIO_OPT_COUNT_, CKPTIO_E_INVAL, "unknown engine option %d", (int)option);
    const ckptio__setting *d = &settings[option];
    if (value < d->min || value > d->max)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "engine option %s: %lld is outside [%lld, %lld]", d->name, (long long)value,
                           (long long)d->min, (long long)d->max);
    if (d->multiple && value % d->multiple != 0)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "engine option %s: %lld is not a multiple of %lld", d->name,
                           (long long)value, (long long)d->multiple);
    return CKPTIO_OK;
}

static bool is_true(const char *t) {
    return !strcasecmp(t, "1") || !strcasecmp(t, "on") || !strcasecmp(t, "true") || !strcasecmp(t, "yes");
}

static bool is_false(const char *t) {
    return !strcasecmp(t, "0") || !strcasecmp(t, "off") || !strcasecmp(t, "false") || !strcasecmp(t, "no");
}

/* The value of `names` called `want`, or -1. */
static int64_t name_index(const char *const *names, const char *want) {
    for (int64_t i = 0; names[i]; i++)
        if (strcasecmp(want, names[i]) == 0) return i;
    return -1;
}

/* Parses one environment value of setting `d`. A setting named auto|off|on
 * also takes the boolean spellings for off and on. */
static bool parse_value(const ckptio__setting *d, const char *text, int64_t *out) {
    switch (d->kind) {
    case CKPTIO__SETTING_ENUM: {
        int64_t i = name_index(d->names, text);
        if (i < 0 && (is_true(text) || is_false(text))) i = name_index(d->names, is_true(text) ? "on" : "off");
        return i >= 0 ? (*out = i, true) : false;
    }
    case CKPTIO__SETTING_BOOL:
        if (is_true(text)) return *out = 1, true;
        if (is_false(text)) return *out = 0, true;
        return false;
    case CKPTIO__SETTING_SIZE: {
        uint64_t v;
        if (!ckptio__parse_size(text, &v) || v > (uint64_t)INT64_MAX) return false;
        return *out = (int64_t)v, true;
    }
    case CKPTIO__SETTING_INT: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (errno || end == text || *end) return false;
        return *out = v, true;
    }
    }
    return false;
}

/* The error for `text`, which is not a value of `d`. */
static ckptio_status parse_error(const ckptio__setting *d, const char *text) {
    const ckptio__err_ctx ctx = {.subject = d->env, .file_offset = -1};
    if (d->kind == CKPTIO__SETTING_ENUM) {
        char names[128] = "";
        for (size_t i = 0, used = 0; d->names[i] && used < sizeof names; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? "|" : "", d->names[i]);
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &ctx, "\"%s\" is not one of %s", text, names);
    }
    const char *expect = d->kind == CKPTIO__SETTING_BOOL   ? "0/1, on/off, true/false or yes/no"
                         : d->kind == CKPTIO__SETTING_SIZE ? "a byte count such as 4096, 64K or 8M"
                                                           : "an integer";
    return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &ctx, "\"%s\" is not %s", text, expect);
}

/* Resolves AUTO and checks a forced backend; stores the result. */
static ckptio_status resolve_backend(ckptio_engine *e, int64_t value) {
    const char *why = "";
    const int err = ckptio__io_uring_probe(&why);
    if (value == CKPTIO_BACKEND_IO_URING && err)
        return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                               &((ckptio__err_ctx){.operation = "io_uring_queue_init", .file_offset = -1,
                                                   .sys_errno = err}),
                               "the io_uring backend was requested but cannot run: %s", why);
    e->backend = value == CKPTIO_BACKEND_PREAD || err ? CKPTIO_BACKEND_PREAD : CKPTIO_BACKEND_IO_URING;
    return CKPTIO_OK;
}

ckptio_status ckptio_engine_set(ckptio_engine *e, ckptio_option option, int64_t value) {
    CKPTIO_RETURN_IF(!e, CKPTIO_E_INVAL, "ckptio_engine_set: engine is NULL");
    CKPTIO_FORWARD(setting_check(option, value));
    if (option == CKPTIO_OPT_BACKEND) CKPTIO_FORWARD(resolve_backend(e, value));
    e->settings[option] = value;
    return CKPTIO_OK;
}

ckptio_status ckptio_engine_get(const ckptio_engine *e, ckptio_option option, int64_t *value) {
    CKPTIO_RETURN_IF(!e || !value, CKPTIO_E_INVAL, "ckptio_engine_get: engine and value are required");
    CKPTIO_RETURN_IF((unsigned)option >= CKPTIO_OPT_COUNT_, CKPTIO_E_INVAL, "unknown engine option %d", (int)option);
    *value = e->settings[option];
    return CKPTIO_OK;
}

int64_t ckptio__engine_setting(const ckptio_engine *e, ckptio_option option) { return e->settings[option]; }

ckptio_status ckptio_engine_backend(ckptio_engine *e, ckptio_backend *out) {
    CKPTIO_RETURN_IF(!e || !out, CKPTIO_E_INVAL, "ckptio_engine_backend: engine and out are required");
    *out = e->backend;
    return CKPTIO_OK;
}

/* Applies every setting's environment variable to `e` (ckptio_engine_set);
 * a malformed or refused value fails, naming the variable. */
static ckptio_status settings_from_env(ckptio_engine *e) {
    for (int i = 0; i < CKPTIO_OPT_COUNT_; i++) {
        const ckptio__setting *d = &settings[i];
        const char *text = getenv(d->env);
        if (!text || !*text) continue;
        int64_t v;
        if (!parse_value(d, text, &v)) return parse_error(d, text);
        ckptio_status st = ckptio_engine_set(e, (ckptio_option)i, v);
        if (st != CKPTIO_OK)
            return CKPTIO_FAIL_CTX(st, &((ckptio__err_ctx){.subject = d->env, .file_offset = -1}), "%s",
                                   ckptio_last_error_message());
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__settings_init(ckptio_engine *e) {
    settings_defaults(e->settings);
    CKPTIO_FORWARD(resolve_backend(e, e->settings[CKPTIO_OPT_BACKEND]));
    return settings_from_env(e);
}
