/*
 * objstore_helpers.h - what the tests against a real S3 server share: the
 * server from the environment (scripts/s3_server.sh start prints it; no
 * server: the test exits 77, skipped), unique key prefixes per run, and the
 * check that no message ever holds a credential.
 */
#ifndef CKPTIO_TEST_OBJSTORE_HELPERS_H
#define CKPTIO_TEST_OBJSTORE_HELPERS_H

#include "helpers.h"
#include "io_internal.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The test bucket, or a skip when no server is configured. */
static inline const char *s3_test_bucket(void) {
    const char *endpoint = getenv("AWS_ENDPOINT_URL");
    const char *bucket = getenv("CKPTIO_TEST_S3_BUCKET");
    if (!endpoint || !*endpoint || !bucket || !*bucket || !getenv("AWS_ACCESS_KEY_ID"))
        t_skip("no S3 server: eval \"$(scripts/s3_server.sh start)\" first");
    return bucket;
}

/* "s3://BUCKET/t-PID-RAND/NAME" (a static buffer per call, 8 in turn). */
static inline const char *s3_url(const char *name) {
    static char bufs[8][1400];
    static int next;
    static char run[32];
    if (!run[0]) {
        unsigned r;
        t_fill_random(&r, sizeof r, (uint64_t)getpid() * 7919u + (uint64_t)time(NULL));
        snprintf(run, sizeof run, "t-%d-%08x", (int)getpid(), r);
    }
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "s3://%s/%s/%s", s3_test_bucket(), run, name);
    return b;
}

/* The whole object's bytes (malloc'ed; *len receives their count). */
static inline unsigned char *s3_object_bytes(ckptio_engine *e, const char *url, size_t *len) {
    ckptio_file *f;
    uint64_t size;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_file_size(f, &size));
    unsigned char *b = malloc(size ? size : 1);
    if (size) T_OK(ckptio__file_io(f, CKPTIO_READ, b, size, 0));
    T_OK(ckptio_file_close(f));
    *len = size;
    return b;
}

/* The key part of an s3_url(). */
static inline const char *s3_key_of(const char *url) { return strchr(url + 5, '/') + 1; }

/* Fails when the thread's last error message holds a credential. */
static inline void s3_no_secret_in_message(void) {
    const char *m = ckptio_last_error_message();
    const char *names[] = {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"};
    for (size_t i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v && strlen(v) >= 4) T_ASSERT_MSG(!strstr(m, v), "the message holds %s: %s", names[i], m);
    }
    T_ASSERT_MSG(!strstr(m, "Signature=") && !strstr(m, "Credential="), "the message holds a signature: %s", m);
}

/* A client for the test bucket with default settings, `retries` retries
 * and a short backoff (tests wait seconds, not minutes). */
static inline ckptio__s3_client *s3_test_client(unsigned retries) {
    ckptio__s3_settings s;
    ckptio__s3_settings_default(&s);
    s.retries = retries;
    s.backoff_ms = 20;
    s.timeout_ms = 5000;
    s.deadline_ms = 60000;
    s.part_bytes = CKPTIO__S3_MIN_PART;
    ckptio__s3_client *c = NULL;
    T_OK(ckptio__s3_client_create(&s, s3_test_bucket(), &c));
    return c;
}

/* An engine with small parts and a short backoff. */
static inline ckptio_engine *s3_test_engine(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_PART_BYTES, 5 << 20));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_BACKOFF_MS, 20));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_TIMEOUT_MS, 5000));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 0));
    return e;
}

/* ---- tests/s3_fault_proxy.py between ckptio and the server ---------------- */

/* The server's endpoint while a fault proxy stands in front of it (set it
 * from AWS_ENDPOINT_URL before the first proxy_start). */
static char upstream[512] __attribute__((unused));
static pid_t proxy_pid __attribute__((unused));
static char proxy_log[1024] __attribute__((unused));

/* Starts the proxy with `rules` (NULL-terminated) and points AWS_ENDPOINT_URL at it. */
static inline void proxy_start(const char *const *rules) {
    static int serial;
    const char *data = getenv("CKPTIO_TEST_DATA");
    char script[1200], port_file[1024];
    snprintf(script, sizeof script, "%s/../s3_fault_proxy.py", data ? data : "tests/data");
    snprintf(port_file, sizeof port_file, "%s/proxy-%d.port", t_tmpdir(), serial);
    snprintf(proxy_log, sizeof proxy_log, "%s/proxy-%d.log", t_tmpdir(), serial++);
    const char *argv[32] = {"python3", script, "--upstream", upstream, "--port-file", port_file,
                            "--log", proxy_log, "--max-seconds", "120"};
    int argc = 10;
    for (int i = 0; rules[i] && argc < 30; i++) {
        argv[argc++] = "--rule";
        argv[argc++] = rules[i];
    }
    argv[argc] = NULL;
    fflush(NULL);
    proxy_pid = fork();
    T_ASSERT(proxy_pid >= 0);
    if (proxy_pid == 0) {
        execvp("python3", (char *const *)argv);
        _exit(127);
    }
    char port[32] = "";
    for (int i = 0; i < 200 && !port[0]; i++) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            if (!fgets(port, sizeof port, f)) port[0] = '\0';
            fclose(f);
        }
        if (!port[0]) usleep(50 * 1000);
    }
    T_ASSERT_MSG(port[0], "the fault proxy did not start (%s)", script);
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%s", port);
    setenv("AWS_ENDPOINT_URL", url, 1);
}

/* The proxy's log so far, NUL-terminated (free() it; "" before any line). */
static inline char *proxy_log_text(void) {
    size_t len = 0;
    char *raw = t_read_file(proxy_log, &len), *text = calloc(1, len + 1);
    T_ASSERT(text);
    if (raw) memcpy(text, raw, len);
    free(raw);
    return text;
}

/* Stops the proxy; returns how many requests met `action`. */
static inline int proxy_stop(const char *action) {
    kill(proxy_pid, SIGTERM);
    int status;
    waitpid(proxy_pid, &status, 0);
    setenv("AWS_ENDPOINT_URL", upstream, 1);
    char *log = proxy_log_text();
    char needle[64];
    snprintf(needle, sizeof needle, "\"action\": \"%s\"", action);
    int n = 0;
    for (char *p = log; p && *p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    free(log);
    return n;
}

/* Writes `len` bytes as the object `url` (one PUT). */
static inline void s3_put_bytes(ckptio_engine *e, const char *url, const void *data, size_t len) {
    T_OK(ckptio_object_put(e, url, data, len, 0));
}

static inline bool s3_object_exists(ckptio_engine *e, const char *url) {
    ckptio__path_kind kind;
    T_OK(ckptio__object_stat(e, url, &kind, NULL));
    return kind == CKPTIO__PATH_FILE;
}

/* "URL/NAME" in a rotating buffer. */
static inline const char *s3_in(const char *dir, const char *name) {
    static char bufs[8][4200];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%.2048s%s%.2048s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name);
    return b;
}

/* The files `names` of tests/data/`data_dir` copied under `dir`, one object each. */
static inline void s3_put_files(ckptio_engine *e, const char *dir, const char *data_dir, const char *const *names,
                                size_t count) {
    for (size_t i = 0; i < count; i++) {
        size_t len = 0;
        void *data = t_read_file(t_data_path(data_dir, names[i]), &len);
        s3_put_bytes(e, s3_in(dir, names[i]), data, len);
        free(data);
    }
}

/* ---- the requests the proxy saw (its log) ------------------------------------- */

#define S3_MAX_REQUESTS 256

typedef struct s3_request_log {
    char method[S3_MAX_REQUESTS][8];
    char target[S3_MAX_REQUESTS][512];
    char range[S3_MAX_REQUESTS][64]; /* its Range header, "" when none */
    int id[S3_MAX_REQUESTS], status[S3_MAX_REQUESTS]; /* status 0: not answered by the server */
    double start[S3_MAX_REQUESTS], end[S3_MAX_REQUESTS];
    size_t n;
} s3_request_log;

/* The requests in the proxy's log, each with its answer's status and end
 * where the server answered it (else end == start). The proxy writes a
 * request's lines before it passes the answer on, so the log holds every
 * request whose answer the client has: no waiting for it. */
static inline void s3_read_requests(s3_request_log *g) {
    char *text = proxy_log_text();
    g->n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        const char *answered = strstr(line, "\"answered\": ");
        if (answered) { /* the answer of the latest request of that id */
            const int id = atoi(answered + 12);
            const char *st = strstr(line, "\"status\": "), *e = strstr(line, "\"end\": ");
            T_ASSERT_MSG(st && e, "log line: %s", line);
            size_t i = g->n;
            while (i > 0 && g->id[i - 1] != id) i--;
            T_ASSERT_MSG(i > 0, "an answer to no request: %s", line);
            g->status[i - 1] = atoi(st + 10);
            g->end[i - 1] = strtod(e + 7, NULL);
            continue;
        }
        T_ASSERT(g->n < S3_MAX_REQUESTS);
        const char *id = strstr(line, "\"id\": "), *m = strstr(line, "\"method\": \""),
                   *t = strstr(line, "\"target\": \""), *r = strstr(line, "\"range\": \""),
                   *s = strstr(line, "\"start\": ");
        T_ASSERT_MSG(id && m && t && r && s, "log line: %s", line);
        g->id[g->n] = atoi(id + 6);
        g->method[g->n][0] = g->target[g->n][0] = g->range[g->n][0] = '\0';
        sscanf(m + 11, "%7[^\"]", g->method[g->n]);
        sscanf(t + 11, "%511[^\"]", g->target[g->n]);
        sscanf(r + 10, "%63[^\"]", g->range[g->n]);
        g->status[g->n] = 0;
        g->start[g->n] = g->end[g->n] = strtod(s + 9, NULL);
        g->n++;
    }
    free(text);
}

/* Requests of `method` whose target contains `part`. */
static inline size_t s3_count_requests(const s3_request_log *g, const char *method, const char *part) {
    size_t n = 0;
    for (size_t i = 0; i < g->n; i++) n += !strcmp(g->method[i], method) && strstr(g->target[i], part);
    return n;
}


#endif
