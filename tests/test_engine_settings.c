/*
 * test_engine_settings.c - engine settings, all taken from the one table
 * (src/engine/settings.c): every setting has a name, a variable, bounds and
 * a default inside them; each is readable and settable, refused outside its
 * bounds, and read from its environment variable when an engine is created
 * (malformed and out-of-range values fail naming the variable); a
 * misspelling of any of them is reported naming it; docs/ENGINE.md lists
 * every setting and variable exactly as the table has them. Also the
 * backend choice (AUTO falls back, a forced io_uring that cannot run fails).
 */
#include "engine_private.h"
#include "helpers.h"
#include "io_internal.h"

#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <string.h>

static void clear_env(void) {
    for (int o = 0; o < CKPTIO_OPT_COUNT_; o++) unsetenv(ckptio__setting_def((ckptio_option)o)->env);
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
    T_ASSERT(get(e, CKPTIO_OPT_GPU_HUGE_SLOTS) == CKPTIO_HUGE_SLOTS_AUTO);
    T_ASSERT(get(e, CKPTIO_OPT_NVTX) == 1);
    T_ASSERT(get(e, CKPTIO_OPT_S3_CONCURRENCY) == 16);
    T_ASSERT(get(e, CKPTIO_OPT_S3_PART_BYTES) == 16 << 20);
    T_ASSERT(get(e, CKPTIO_OPT_S3_RETRIES) == 8);
    T_ASSERT(get(e, CKPTIO_OPT_S3_TIMEOUT_MS) == 30000);
    T_ASSERT(get(e, CKPTIO_OPT_S3_DEADLINE_MS) == 300000);
    T_ASSERT(get(e, CKPTIO_OPT_S3_BACKOFF_MS) == 200);
    T_ASSERT(get(e, CKPTIO_OPT_S3_LEASE_MS) == 60000);
    T_ASSERT(get(e, CKPTIO_OPT_WRITE_CACHE) == CKPTIO_WRITE_CACHE_AUTO);
    T_ASSERT(get(e, CKPTIO_OPT_S3_BUFFERS_KEEP_MS) == 60000);
    ckptio_backend b;
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == (ckptio__io_uring_probe(NULL) == 0 ? CKPTIO_BACKEND_IO_URING : CKPTIO_BACKEND_PREAD));

    static const char *const names[] = {"backend", "threads", "chunk_bytes", "queue_depth",
                                        "staging_bytes", "direct", "direct_min_bytes", "sync",
                                        "gpu_path", "read_cache", "gpu_huge_slots", "nvtx",
                                        "s3_concurrency", "s3_part_bytes", "s3_retries", "s3_timeout_ms",
                                        "s3_deadline_ms", "s3_backoff_ms", "s3_lease_ms", "write_cache",
                                        "s3_buffers_keep_ms"};
    T_ASSERT(sizeof names / sizeof *names == CKPTIO_OPT_COUNT_);
    for (int o = 0; o < CKPTIO_OPT_COUNT_; o++) T_ASSERT(strcmp(ckptio_option_name((ckptio_option)o), names[o]) == 0);
    T_ASSERT(ckptio_option_name(CKPTIO_OPT_COUNT_) == NULL);
    T_ASSERT(strcmp(ckptio_backend_name(CKPTIO_BACKEND_AUTO), "auto") == 0);
    T_ASSERT(strcmp(ckptio_backend_name(CKPTIO_BACKEND_PREAD), "pread") == 0);
    T_ASSERT(strcmp(ckptio_backend_name(CKPTIO_BACKEND_IO_URING), "io_uring") == 0);
    T_ASSERT(strcmp(ckptio_backend_name((ckptio_backend)7), "unknown") == 0);
    T_ASSERT(strcmp(ckptio_option_value_name(CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_ON), "on") == 0);
    T_ASSERT(strcmp(ckptio_option_value_name(CKPTIO_OPT_READ_CACHE, CKPTIO_READ_CACHE_ON), "on") == 0);
    T_ASSERT(strcmp(ckptio_option_value_name(CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_PIPELINE), "pipeline") == 0);
    T_ASSERT(strcmp(ckptio_option_value_name(CKPTIO_OPT_GPU_HUGE_SLOTS, CKPTIO_HUGE_SLOTS_OFF), "off") == 0);
    T_ASSERT(ckptio_option_value_name(CKPTIO_OPT_GPU_PATH, 3) == NULL);
    T_ASSERT(ckptio_option_value_name(CKPTIO_OPT_GPU_PATH, -1) == NULL);
    T_ASSERT(ckptio_option_value_name(CKPTIO_OPT_THREADS, 1) == NULL);
    T_ASSERT(ckptio_option_value_name(CKPTIO_OPT_SYNC, 1) == NULL);
    T_ASSERT(ckptio_option_value_name(CKPTIO_OPT_COUNT_, 0) == NULL);
    int64_t v;
    T_STATUS(ckptio_engine_get(e, CKPTIO_OPT_COUNT_, &v), CKPTIO_E_INVAL);
    T_STATUS(ckptio_engine_set(e, (ckptio_option)-1, 1), CKPTIO_E_INVAL);
    T_OK(ckptio_engine_destroy(e));
    T_OK(ckptio_engine_destroy(NULL));
}

/* Every row of the table is whole: its variable is CKPTIO_ and its name in
 * capitals, its default lies inside its bounds, its value names cover the
 * bounds exactly, and it says what it does. */
static void test_table_rows_are_whole(void) {
    for (int o = 0; o < CKPTIO_OPT_COUNT_; o++) {
        const ckptio__setting *d = ckptio__setting_def((ckptio_option)o);
        T_ASSERT_MSG(d && d->name && d->env && d->doc && d->doc[0], "setting %d has no row", o);
        char env[64];
        int n = snprintf(env, sizeof env, "CKPTIO_%s", d->name);
        for (int i = 7; i < n; i++) env[i] = (char)toupper((unsigned char)env[i]);
        T_ASSERT_MSG(strcmp(env, d->env) == 0, "%s is read from %s", d->name, d->env);
        const int64_t def = d->compute ? d->compute() : d->def;
        T_ASSERT_MSG(d->min <= def && def <= d->max && (!d->multiple || def % d->multiple == 0),
                     "%s: default %lld outside [%lld, %lld]", d->name, (long long)def, (long long)d->min,
                     (long long)d->max);
        T_ASSERT_MSG(!d->compute == !d->compute_doc, "%s: a computed default says how", d->name);
        if (d->kind == CKPTIO__SETTING_ENUM) {
            int64_t count = 0;
            while (d->names[count]) count++;
            T_ASSERT_MSG(d->min == 0 && d->max == count - 1, "%s: %lld names for [%lld, %lld]", d->name,
                         (long long)count, (long long)d->min, (long long)d->max);
        } else {
            T_ASSERT_MSG(!d->names, "%s takes numbers but has names", d->name);
        }
        if (d->kind == CKPTIO__SETTING_BOOL) T_ASSERT(d->min == 0 && d->max == 1);
    }
    T_ASSERT(ckptio__setting_def(CKPTIO_OPT_COUNT_) == NULL);
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
    T_OK(ckptio_option_bounds(CKPTIO_OPT_GPU_PATH, &lo, &hi));
    T_ASSERT(lo == 0 && hi == CKPTIO_GPU_PATH_PIPELINE);
    T_STATUS(ckptio_option_bounds(CKPTIO_OPT_COUNT_, &lo, &hi), CKPTIO_E_INVAL);
    T_STATUS(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 5000), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("not a multiple of 4096");
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 3 * 4096));
    T_ASSERT(get(e, CKPTIO_OPT_CHUNK_BYTES) == 3 * 4096);
    T_OK(ckptio_engine_destroy(e));
}

/* A value of setting `d` other than `def`, and how its variable spells it. */
static int64_t other_value(const ckptio__setting *d, int64_t def, char *text, size_t cap) {
    int64_t v = def == d->max ? d->min : d->max;
    switch (d->kind) {
    case CKPTIO__SETTING_ENUM:
        v = (def + 1) % (d->max + 1);
        snprintf(text, cap, "%s", d->names[v]);
        for (char *c = text; *c; c++) *c = (char)toupper((unsigned char)*c); /* names are not case-sensitive */
        break;
    case CKPTIO__SETTING_BOOL: snprintf(text, cap, "%s", v ? "yes" : "off"); break;
    case CKPTIO__SETTING_SIZE:
        if (d->multiple) v -= v % d->multiple;
        if (v % 1024 == 0 && v > 0) snprintf(text, cap, "%lldK", (long long)(v / 1024));
        else snprintf(text, cap, "%lld", (long long)v);
        break;
    case CKPTIO__SETTING_INT: snprintf(text, cap, "%lld", (long long)v); break;
    }
    return v;
}

/* Every setting's variable is read at creation: a value other than the
 * default arrives; a malformed one fails creation naming the variable, as
 * does one past the bounds. */
static void test_every_variable_is_honoured(void) {
    for (int o = 0; o < CKPTIO_OPT_COUNT_; o++) {
        const ckptio__setting *d = ckptio__setting_def((ckptio_option)o);
        clear_env();
        const int64_t def = d->compute ? d->compute() : d->def;
        char text[64];
        const int64_t want = other_value(d, def, text, sizeof text);
        T_ASSERT(want != def);
        setenv(d->env, text, 1);
        ckptio_engine *e = NULL;
        T_OK(ckptio_engine_create(&e));
        T_ASSERT_MSG(get(e, (ckptio_option)o) == want, "%s=%s gave %lld, want %lld", d->env, text,
                     (long long)get(e, (ckptio_option)o), (long long)want);
        T_OK(ckptio_engine_destroy(e));
        setenv(d->env, "bogus!", 1);
        e = (ckptio_engine *)0x1;
        T_STATUS(ckptio_engine_create(&e), CKPTIO_E_INVAL);
        T_ASSERT(e == NULL);
        T_MESSAGE_HAS(d->env);
        T_MESSAGE_HAS("\"bogus!\" is not");
        if (d->kind == CKPTIO__SETTING_INT || d->kind == CKPTIO__SETTING_SIZE) {
            snprintf(text, sizeof text, "%lld", (long long)d->max + 1);
            setenv(d->env, text, 1);
            T_STATUS(ckptio_engine_create(&e), CKPTIO_E_RANGE);
            T_MESSAGE_HAS(d->env);
        }
    }
    clear_env();
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
    setenv("CKPTIO_GPU_HUGE_SLOTS", "0", 1); /* auto|off|on also take the boolean spellings */
    setenv("CKPTIO_NVTX", "0", 1);
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
    T_ASSERT(get(e, CKPTIO_OPT_GPU_HUGE_SLOTS) == CKPTIO_HUGE_SLOTS_OFF);
    T_ASSERT(get(e, CKPTIO_OPT_NVTX) == 0);
    ckptio_backend b;
    T_OK(ckptio_engine_backend(e, &b));
    T_ASSERT(b == CKPTIO_BACKEND_PREAD);
    /* Read once: changing the environment later changes nothing. */
    setenv("CKPTIO_THREADS", "5", 1);
    T_ASSERT(get(e, CKPTIO_OPT_THREADS) == 3);
    T_OK(ckptio_engine_destroy(e));
    setenv("CKPTIO_SYNC", "on", 1);
    setenv("CKPTIO_DIRECT", "1", 1);
    T_OK(ckptio_engine_create(&e));
    T_ASSERT(get(e, CKPTIO_OPT_THREADS) == 5 && get(e, CKPTIO_OPT_SYNC) == 1);
    T_ASSERT(get(e, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_ON);
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
        {"CKPTIO_BACKEND", "1", "auto|pread|io_uring", CKPTIO_E_INVAL}, /* no off|on: no boolean spelling */
        {"CKPTIO_READ_CACHE", "always", "CKPTIO_READ_CACHE: \"always\" is not one of auto|on|off", CKPTIO_E_INVAL},
        {"CKPTIO_GPU_PATH", "staged", "CKPTIO_GPU_PATH: \"staged\" is not one of auto|cufile|pipeline",
         CKPTIO_E_INVAL},
        {"CKPTIO_GPU_HUGE_SLOTS", "2", "CKPTIO_GPU_HUGE_SLOTS: \"2\" is not one of auto|off|on", CKPTIO_E_INVAL},
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

/* Only `var` of the CKPTIO_* names is set (besides CKPTIO_TEST_* ones, such
 * as ctest's CKPTIO_TEST_DATA, which are never reported); returns
 * ckptio_env_check's text. */
static const char *check_alone(const char *var, size_t *unknown) {
    t_unsetenv_prefix("CKPTIO_", "CKPTIO_TEST_");
    setenv(var, "1", 1);
    static char msg[512];
    T_OK(ckptio_env_check(msg, sizeof msg, unknown));
    unsetenv(var);
    return msg;
}

/* The misspelling check knows every setting of the table and every other
 * variable: each is quiet, and each with two neighbouring letters swapped
 * is reported as not a setting, naming it. */
static void test_misspellings_come_from_the_table(void) {
    for (size_t i = 0;; i++) {
        const char *env;
        if (i < CKPTIO_OPT_COUNT_) {
            env = ckptio__setting_def((ckptio_option)i)->env;
        } else {
            const ckptio__variable *v = ckptio__variable_def(i - CKPTIO_OPT_COUNT_);
            if (!v) break;
            env = v->env;
        }
        size_t unknown = 99;
        const char *msg = check_alone(env, &unknown);
        T_ASSERT_MSG(unknown == 0 && !msg[0], "%s reported: %s", env, msg);
        char typo[64];
        snprintf(typo, sizeof typo, "%s", env);
        const size_t n = strlen(typo);
        size_t at = 7 + (n - 7) / 2; /* a pair of different letters near the middle of the part after CKPTIO_ */
        while (at + 1 < n && (typo[at] == typo[at + 1] || typo[at] == '_' || typo[at + 1] == '_')) at++;
        if (at + 1 >= n) at = 7;
        const char c = typo[at];
        typo[at] = typo[at + 1];
        typo[at + 1] = c;
        char want[160];
        snprintf(want, sizeof want, "%s is not a ckptio setting: did you mean %s?\n", typo, env);
        msg = check_alone(typo, &unknown);
        T_ASSERT_MSG(unknown == 1 && strcmp(msg, want) == 0, "%s: got \"%s\", want \"%s\"", typo, msg, want);
    }
}

/* ---- docs/ENGINE.md lists what the table holds ------------------------------- */

/* `v` bytes as docs write them: "8 MiB", "4 KiB", "0". */
static void human_bytes(int64_t v, char *out, size_t cap) {
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    for (int u = 0; u < 4; u++) {
        const int64_t scale = 1ll << (10 * (4 - u));
        if (v > 0 && v % scale == 0) {
            snprintf(out, cap, "%lld %s", (long long)(v / scale), units[u]);
            return;
        }
    }
    snprintf(out, cap, "%lld", (long long)v);
}

/* The docs row of setting `d`: | `VARIABLE` | `name` | values | default | what |
 * (a `|` inside a cell is written `\|`). */
static void setting_row(const ckptio__setting *d, char *row, size_t cap) {
    char values[160] = "", def[80] = "";
    size_t used = 0;
    switch (d->kind) {
    case CKPTIO__SETTING_ENUM:
        for (size_t i = 0; d->names[i]; i++)
            used += (size_t)snprintf(values + used, sizeof values - used, "%s%s", i ? "\\|" : "", d->names[i]);
        snprintf(def, sizeof def, "%s", d->names[d->def]);
        break;
    case CKPTIO__SETTING_BOOL:
        snprintf(values, sizeof values, "0/1, off/on, false/true, no/yes");
        snprintf(def, sizeof def, "%lld", (long long)d->def);
        break;
    case CKPTIO__SETTING_SIZE: {
        char lo[32], hi[32], mult[32];
        human_bytes(d->min, lo, sizeof lo);
        human_bytes(d->max, hi, sizeof hi);
        human_bytes(d->multiple, mult, sizeof mult);
        used = (size_t)snprintf(values, sizeof values, "%s..%s", lo, hi);
        if (d->multiple) snprintf(values + used, sizeof values - used, ", a multiple of %s", mult);
        human_bytes(d->def, def, sizeof def);
        break;
    }
    case CKPTIO__SETTING_INT:
        snprintf(values, sizeof values, "%lld..%lld", (long long)d->min, (long long)d->max);
        snprintf(def, sizeof def, "%lld", (long long)d->def);
        break;
    }
    if (d->compute) snprintf(def, sizeof def, "%s", d->compute_doc);
    snprintf(row, cap, "| `%s` | `%s` | %s | %s | %s |", d->env, d->name, values, def, d->doc);
}

/* Whether `text` holds `line` as a whole line. */
static bool has_line(const char *text, const char *line) {
    const size_t n = strlen(line);
    for (const char *p = strstr(text, line); p; p = strstr(p + 1, line))
        if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == '\0')) return true;
    return false;
}

/* Every setting and variable of the table has its row in docs/ENGINE.md
 * (generated here from the table: the message gives the row to paste), and
 * every variable row there is one of them. */
static void test_docs_list_every_setting(void) {
    size_t len = 0;
    char *bytes = t_read_file(t_data_path("../../docs", "ENGINE.md"), &len);
    char *docs = malloc(len + 1); /* t_read_file's bytes are not a string */
    T_ASSERT(docs);
    memcpy(docs, bytes, len);
    docs[len] = '\0';
    free(bytes);
    char rows[CKPTIO_OPT_COUNT_ + 16][512];
    size_t nrows = 0;
    for (int o = 0; o < CKPTIO_OPT_COUNT_; o++)
        setting_row(ckptio__setting_def((ckptio_option)o), rows[nrows++], sizeof rows[0]);
    for (size_t i = 0; ckptio__variable_def(i); i++) {
        T_ASSERT(nrows < sizeof rows / sizeof *rows);
        const ckptio__variable *v = ckptio__variable_def(i);
        snprintf(rows[nrows++], sizeof rows[0], "| `%s` | %s |", v->env, v->doc);
    }
    size_t missing = 0;
    for (size_t r = 0; r < nrows; r++) {
        if (has_line(docs, rows[r])) continue;
        if (!missing++) fprintf(stderr, "docs/ENGINE.md (section 5, Settings) lacks these rows:\n");
        fprintf(stderr, "%s\n", rows[r]);
    }
    T_ASSERT_MSG(missing == 0, "%zu rows missing from docs/ENGINE.md (above)", missing);
    for (char *line = docs; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        if (strncmp(line, "| `CKPTIO_", 10) == 0) {
            bool found = false;
            for (size_t r = 0; r < nrows && !found; r++) found = strcmp(line, rows[r]) == 0;
            T_ASSERT_MSG(found, "docs/ENGINE.md lists a variable ckptio does not read, or differently:\n%s", line);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(docs);
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
    T_RUN(test_table_rows_are_whole);
    T_RUN(test_bounds);
    T_RUN(test_every_variable_is_honoured);
    T_RUN(test_env);
    T_RUN(test_misspellings_come_from_the_table);
    T_RUN(test_docs_list_every_setting);
    T_RUN(test_backend_choice);
    return 0;
}
