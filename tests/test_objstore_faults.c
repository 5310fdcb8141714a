/*
 * test_objstore_faults.c - the retry, give-up and abort paths of s3:// objects,
 * with tests/s3_fault_proxy.py between ckptio and a real S3 server (skipped,
 * exit 77, without one): reads and uploads that meet 503 SlowDown, 500s,
 * dropped and reset connections, stalls and truncated bodies succeed
 * bit-exact after N faults; past the retry budget or the deadline they fail
 * with a message naming the bucket, the key and the last cause; a failed or
 * killed upload leaves no object, no unfinished multipart upload, and the
 * older object as it was.
 */
#include "objstore_helpers.h"

#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>

static unsigned char *random_bytes(size_t n, uint64_t seed) {
    unsigned char *b = malloc(n);
    T_ASSERT(b);
    t_fill_random(b, n, seed);
    return b;
}

/* An engine through the proxy: 5 MiB parts, 4 retries, 1 s stall timeout. */
static ckptio_engine *fault_engine(unsigned retries) {
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_RETRIES, retries));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_TIMEOUT_MS, 1000));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 4));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 2 << 20));
    return e;
}

static void put_direct(const char *url, const void *data, size_t n) {
    ckptio_engine *e = s3_test_engine();
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    if (n) T_OK(ckptio__file_io(f, CKPTIO_WRITE, (void *)data, n, 0));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
}

/* Reads the whole object through the engine (many ranged GETs in flight). */
static ckptio_status read_all(ckptio_engine *e, const char *url, unsigned char *out, size_t n) {
    ckptio_file *f;
    CKPTIO_FORWARD(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
    const ckptio_extent x = {.file = f, .file_offset = 0, .length = n, .memory = out, .mem_kind = CKPTIO_MEM_HOST};
    ckptio_status st = ckptio_engine_execute_extents(e, CKPTIO_READ, &x, 1);
    ckptio_error_info saved = *ckptio_last_error();
    char message[2048];
    snprintf(message, sizeof message, "%s", saved.message);
    T_OK(ckptio_file_close(f));
    if (st != CKPTIO_OK)
        return CKPTIO_FAIL_CTX(st, &((ckptio__err_ctx){.verbatim = true, .file_offset = -1}), "%s", message);
    return st;
}

static void test_reads_retry(void) {
    const char *url = s3_url("read.bin");
    const size_t n = 9u << 20;
    unsigned char *data = random_bytes(n, 11), *back = malloc(n);
    put_direct(url, data, n);
    struct {
        const char *rule, *action;
        int want;
    } cases[] = {
        {"GET:read.bin:slowdown:3", "slowdown", 3},
        {"GET:read.bin:error:500:2", "error", 2},
        {"GET:read.bin:drop:2", "drop", 2},
        {"GET:read.bin:reset:2", "reset", 2},
        {"GET:read.bin:truncate:100000:3", "truncate", 3}, /* resumed where the bytes stopped */
        {"GET:read.bin:stall:4:1", "stall", 1},            /* no byte for 1 s: that attempt fails */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *rules[] = {cases[i].rule, NULL};
        proxy_start(rules);
        ckptio_engine *e = fault_engine(4);
        memset(back, 0, n);
        ckptio_stats st0, st1;
        T_OK(ckptio_engine_stats(e, &st0));
        T_OK(read_all(e, url, back, n));
        T_OK(ckptio_engine_stats(e, &st1));
        T_ASSERT_MSG(memcmp(back, data, n) == 0, "%s: bytes differ", cases[i].rule);
        T_ASSERT_MSG(st1.retries - st0.retries >= (uint64_t)cases[i].want, "%s: %llu retries counted",
                     cases[i].rule, (unsigned long long)(st1.retries - st0.retries));
        T_OK(ckptio_engine_destroy(e));
        const int got = proxy_stop(cases[i].action);
        T_ASSERT_MSG(got == cases[i].want, "%s: %d faults injected", cases[i].rule, got);
    }
    free(data);
    free(back);
}

static int count_fn(void *user, const ckptio_object_info *info) {
    (*(int *)user)++;
    return 0;
}

static int uploads_of(const char *url) {
    ckptio_engine *e = s3_test_engine();
    int n = 0;
    T_OK(ckptio_object_list_uploads(e, url, count_fn, &n));
    T_OK(ckptio_engine_destroy(e));
    return n;
}

static ckptio_status write_object(ckptio_engine *e, const char *url, const unsigned char *data, size_t n) {
    ckptio_file *f;
    CKPTIO_FORWARD(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    ckptio_status st = ckptio_file_truncate(f, n);
    const ckptio_extent x = {.file = f, .file_offset = 0, .length = n, .memory = (void *)data,
                             .mem_kind = CKPTIO_MEM_HOST};
    if (st == CKPTIO_OK) st = ckptio_engine_execute_extents(e, CKPTIO_WRITE, &x, 1);
    if (st == CKPTIO_OK) st = ckptio_file_commit(f);
    ckptio__error_saved *saved = ckptio__error_save();
    T_OK(ckptio_file_close(f)); /* aborts the upload when the commit did not happen */
    ckptio__error_restore(saved);
    return st;
}

static void test_uploads_retry(void) {
    const char *url = s3_url("upload.bin");
    const size_t n = (17u << 20) + 3;
    unsigned char *data = random_bytes(n, 12), *back = malloc(n);
    struct {
        const char *rule, *action;
        int want;
    } cases[] = {
        {"PUT:partNumber:slowdown:3", "slowdown", 3},
        {"PUT:partNumber:reset:2", "reset", 2},
        {"PUT:partNumber:drop:2:1", "drop", 2},
        {"POST:[?]uploads:error:503:2", "error", 2},     /* CreateMultipartUpload */
        {"POST:uploadId:slowdown:2", "slowdown", 2},      /* CompleteMultipartUpload */
        {"POST:uploadId:lose:1", "lose", 1},              /* completed, answer lost: the ETag check */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *rules[] = {cases[i].rule, NULL};
        proxy_start(rules);
        ckptio_engine *e = fault_engine(4);
        data[0] = (unsigned char)i;
        T_OK(write_object(e, url, data, n));
        T_OK(ckptio_engine_destroy(e));
        const int got = proxy_stop(cases[i].action);
        T_ASSERT_MSG(got == cases[i].want, "%s: %d faults injected", cases[i].rule, got);
        e = s3_test_engine();
        memset(back, 0, n);
        T_OK(read_all(e, url, back, n));
        T_ASSERT_MSG(memcmp(back, data, n) == 0, "%s: bytes differ", cases[i].rule);
        T_OK(ckptio_engine_destroy(e));
        T_ASSERT_MSG(uploads_of(url) == 0, "%s: an upload was left", cases[i].rule);
    }
    /* A single PUT (one part) retries too. */
    const char *small = s3_url("small-put.bin");
    const char *rules[] = {"PUT:small-put:slowdown:2", NULL};
    proxy_start(rules);
    ckptio_engine *e = fault_engine(4);
    T_OK(write_object(e, small, data, 1000));
    T_OK(ckptio_engine_destroy(e));
    T_ASSERT(proxy_stop("slowdown") == 2);
    free(data);
    free(back);
}

static void test_give_up(void) {
    const char *url = s3_url("giveup.bin");
    const size_t n = 3u << 20;
    unsigned char *data = random_bytes(n, 13), *back = malloc(n);
    put_direct(url, data, n);
    /* Past the retry budget: the last cause, the attempts, bucket and key. */
    const char *rules[] = {"GET:giveup:slowdown:1000", NULL};
    proxy_start(rules);
    ckptio_engine *e = fault_engine(2);
    const double t0 = ckptio__now();
    T_STATUS(read_all(e, url, back, n), CKPTIO_E_IO);
    T_ASSERT(ckptio__now() - t0 < 30);
    T_MESSAGE_HAS("SlowDown");
    T_MESSAGE_HAS("gave up after 3 attempts");
    T_MESSAGE_HAS(s3_test_bucket());
    T_MESSAGE_HAS(s3_key_of(url));
    s3_no_secret_in_message();
    T_OK(ckptio_engine_destroy(e));
    proxy_stop("slowdown");
    /* Past the deadline: stalls of 10 s against a 3 s deadline. */
    const char *stall[] = {"GET:giveup:stall:10:1000", NULL};
    proxy_start(stall);
    e = fault_engine(50);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_DEADLINE_MS, 3000));
    const double t1 = ckptio__now();
    T_STATUS(read_all(e, url, back, n), CKPTIO_E_IO);
    const double took = ckptio__now() - t1;
    T_ASSERT_MSG(took < 8, "gave up after %.1f s", took);
    T_MESSAGE_HAS("deadline 3 s");
    T_MESSAGE_HAS(s3_key_of(url));
    T_OK(ckptio_engine_destroy(e));
    proxy_stop("stall");
    /* The server gone: connection refused, retried, then a clear error. */
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1", 1);
    e = fault_engine(1);
    ckptio_file *f;
    T_STATUS(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f), CKPTIO_E_IO);
    T_MESSAGE_HAS("HEAD");
    T_MESSAGE_HAS(s3_key_of(url));
    T_MESSAGE_HAS("gave up after 2 attempts");
    T_OK(ckptio_engine_destroy(e));
    setenv("AWS_ENDPOINT_URL", upstream, 1);
    free(data);
    free(back);
}

/* CompleteMultipartUpload's failure may come inside an HTTP 200 (AWS documents
 * it) or, from a gateway under load, as a 400 whose document wraps a server
 * fault (InternalError, ServiceUnavailable): both are retried as a 5xx is,
 * within the retry budget, and past it stay a server fault (E_IO). A real 400
 * (InvalidPart) is not retried: the save fails with the server's code and
 * message, the bucket and the key, and the upload is aborted. */
static void test_complete_errors(void) {
    const char *url = s3_url("complete.bin");
    const size_t n = (11u << 20) + 7;
    unsigned char *data = random_bytes(n, 16), *back = malloc(n);
    static const char *const transient[] = {"POST:uploadId:error:200/InternalError:1",
                                            "POST:uploadId:error:400/InternalError:1",
                                            "POST:uploadId:error:400/ServiceUnavailable:1"};
    for (size_t i = 0; i < sizeof transient / sizeof *transient; i++) {
        const char *rules[] = {transient[i], NULL};
        proxy_start(rules);
        ckptio_engine *e = fault_engine(4);
        data[0] = (unsigned char)i;
        T_OK(write_object(e, url, data, n));
        T_OK(ckptio_engine_destroy(e));
        T_ASSERT_MSG(proxy_stop("error") == 1, "%s", transient[i]);
        e = s3_test_engine();
        memset(back, 0, n);
        T_OK(read_all(e, url, back, n));
        T_ASSERT_MSG(memcmp(back, data, n) == 0, "%s: bytes differ", transient[i]);
        T_OK(ckptio_engine_destroy(e));
        T_ASSERT_MSG(uploads_of(url) == 0, "%s: an upload was left", transient[i]);
    }
    const unsigned char kept = data[0];
    data[0] = 0xee;
    const char *always[] = {"POST:uploadId:error:400/InternalError:100", NULL};
    proxy_start(always);
    ckptio_engine *e = fault_engine(1);
    T_STATUS(write_object(e, url, data, n), CKPTIO_E_IO);
    T_MESSAGE_HAS("InternalError");
    T_MESSAGE_HAS("gave up after 2 attempts");
    T_MESSAGE_HAS(s3_key_of(url));
    T_OK(ckptio_engine_destroy(e));
    T_ASSERT(proxy_stop("error") == 2);
    T_ASSERT(uploads_of(url) == 0);
    const char *refuse[] = {"POST:uploadId:error:400/InvalidPart:100", NULL};
    proxy_start(refuse);
    e = fault_engine(4);
    T_STATUS(write_object(e, url, data, n), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("CompleteMultipartUpload");
    T_MESSAGE_HAS("HTTP 400 InvalidPart: InvalidPart injected by the fault proxy.");
    T_MESSAGE_HAS(s3_test_bucket());
    T_MESSAGE_HAS(s3_key_of(url));
    s3_no_secret_in_message();
    T_OK(ckptio_engine_destroy(e));
    T_ASSERT(proxy_stop("error") == 1);
    T_ASSERT(uploads_of(url) == 0);
    /* The object is the last whole save's. */
    data[0] = kept;
    e = s3_test_engine();
    T_OK(read_all(e, url, back, n));
    T_ASSERT(memcmp(back, data, n) == 0);
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free(data);
    free(back);
}

/* A writer that waits for a part buffer while another write grows the
 * upload's part table: the waiting writer must find its part in the table as
 * it is after the wait, not where it was before (the table moved). Two
 * stalled UploadParts keep all four buffers of this engine busy for 2 s;
 * meanwhile a write at part 17 grows the table from 16 entries. */
typedef struct {
    ckptio_file *f;
    const unsigned char *data;
    uint64_t off, len;
    ckptio_status st;
} part_writer;

static void *write_part(void *arg) {
    part_writer *w = arg;
    w->st = ckptio__file_io(w->f, CKPTIO_WRITE, (void *)(w->data + w->off), w->len, w->off);
    return NULL;
}

static void test_writer_waits_while_parts_grow(void) {
    const char *url = s3_url("grow.bin");
    const uint64_t part = 5u << 20, n = 16 * part + 8;
    unsigned char *data = random_bytes(5 * part, 17), *back = malloc(n), *want = calloc(1, n);
    memcpy(want, data, 5 * part);
    want[n - 1] = data[3];
    const char *rules[] = {"PUT:partNumber:stall:2:2", NULL};
    proxy_start(rules);
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 << 20));
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    for (uint64_t i = 0; i < 4; i++) T_OK(ckptio__file_io(f, CKPTIO_WRITE, data + i * part, part, i * part));
    uint64_t peak, bound;
    ckptio__object_buffers(f, &peak, &bound);
    T_ASSERT_MSG(bound < 5 * part, "a bound of %llu holds a fifth part", (unsigned long long)bound);
    part_writer w = {f, data, 4 * part, part, CKPTIO_OK};
    pthread_t t;
    T_ASSERT(pthread_create(&t, NULL, write_part, &w) == 0);
    /* Until the thread waits for a buffer (the first two parts are stalled), then the table grows. */
    for (int i = 0; i < 2000 && ckptio__object_writers_waiting(f) == 0; i++) usleep(5000);
    T_ASSERT_MSG(ckptio__object_writers_waiting(f) == 1, "the writer of part 5 never waited for a buffer");
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, data + 3, 1, n - 1));
    T_ASSERT(pthread_join(t, NULL) == 0);
    T_OK(w.st);
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
    T_ASSERT_MSG(proxy_stop("stall") == 2, "the stalls did not happen");
    e = s3_test_engine();
    T_OK(read_all(e, url, back, n));
    for (uint64_t i = 0; i < n; i += part)
        T_ASSERT_MSG(memcmp(back + i, want + i, i + part < n ? part : n - i) == 0, "part %llu differs",
                     (unsigned long long)(i / part + 1));
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free(data);
    free(back);
    free(want);
}

/* A renewal whose look takes longer than the lease lasts (the server slow,
 * the process stopped) may come after the lease lapsed and another save
 * took it: it never writes the lease again (its Last-Modified stays that of
 * the take), and the check fails. */
static void test_a_late_renewal_loses_the_lease(void) {
    const char *dir = s3_url("late-renewal");
    const char *lease = s3_url("late-renewal/" CKPTIO_DCP_LOCK_NAME);
    const char *rules[] = {"GET:ckptio-dcp\\.lock:stall:2:1:1", NULL}; /* the first renewal's look, not the take's */
    proxy_start(rules);
    ckptio_engine *e = s3_test_engine();
    setenv("CKPTIO_S3_LEASE_MS", "1500", 1); /* renewed every 0.5 s */
    ckptio_dcp_lock *a = NULL;
    const double t0 = ckptio__now();
    /* Read back by the first check (no GET of its own after the take's look, with or without conditional writes). */
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &a));
    unsetenv("CKPTIO_S3_LEASE_MS");
    double taken = 0, now = 0;
    T_OK(ckptio__object_info(e, lease, NULL, NULL, &taken, NULL));
    usleep(1000 * 1000); /* the renewal's look (at 0.5 s) is the stalled GET, not a check's */
    for (int i = 0; i < 80 && ckptio_dcp_lock_check(a) == CKPTIO_OK; i++) usleep(50 * 1000);
    T_ASSERT(ckptio_dcp_lock_check(a) == CKPTIO_E_BUSY);
    T_MESSAGE_HAS("was last renewed");
    while (ckptio__now() - t0 < 3.5) usleep(50 * 1000); /* the stalled look was answered at 2 s and more */
    T_OK(ckptio__object_info(e, lease, NULL, NULL, &now, NULL));
    T_ASSERT_MSG(now == taken, "the lease was written again %.0f s after it was taken", now - taken);
    T_OK(ckptio_dcp_lock_release(a));
    T_ASSERT_MSG(proxy_stop("stall") == 1, "the renewal's look was not stalled");
    T_OK(ckptio_object_delete(e, lease));
    T_OK(ckptio_engine_destroy(e));
}

/* A shared save's mark is checked as the lease is, with the same margin: its
 * renewal (a PUT, no look) stalled past the mark's time less the margin, its
 * check fails (the save then commits nothing), though the mark's object is
 * still there. */
static void test_a_late_mark_renewal_fails_the_check(void) {
    const char *dir = s3_url("late-mark");
    const char *rules[] = {"PUT:ckptio-dcp-shared-:stall:2:1:1", NULL}; /* the first renewal, not the take */
    proxy_start(rules);
    setenv("CKPTIO_S3_LEASE_MS", "1500", 1); /* renewed every 0.5 s; the margin 0.25 s */
    ckptio_dcp_lock *a = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &a));
    unsetenv("CKPTIO_S3_LEASE_MS");
    T_OK(ckptio_dcp_lock_check(a)); /* taken 0 s ago */
    const double t0 = ckptio__now();
    ckptio_status st = CKPTIO_OK;
    while (ckptio__now() - t0 < 3 && (st = ckptio_dcp_lock_check(a)) == CKPTIO_OK) usleep(50 * 1000);
    T_ASSERT_MSG(st == CKPTIO_E_BUSY, "status %d", st);
    T_MESSAGE_HAS("was last renewed");
    /* Not before the mark's time less the margin (1.25 s after its take, just before t0). */
    const double late = ckptio__now() - t0;
    T_ASSERT_MSG(late > 1.0, "the check failed %.2f s after the mark was taken", late);
    T_OK(ckptio_dcp_lock_release(a));
    T_ASSERT_MSG(proxy_stop("stall") == 1, "the mark's renewal was not stalled");
}

static int count_marks(void *user, const ckptio_object_info *info) {
    const char *name = strrchr(info->key, '/');
    if (name && !strncmp(name + 1, ".ckptio-dcp-shared-", 19)) ++*(int *)user;
    return 0;
}

/* A mark's renewal that completes after the mark may have lapsed (its PUT
 * delayed past the mark's time, and no check while it is in flight) renews
 * nothing: a cleanup may have counted the mark as lapsed meanwhile. The next
 * check fails, and the mark it rewrote is gone before the save releases it. */
static void test_a_mark_renewal_that_completes_late_is_lost(void) {
    const char *dir = s3_url("late-mark-write");
    const char *rules[] = {"PUT:ckptio-dcp-shared-:delay:2:1:1", NULL}; /* the first renewal, forwarded at 2.5 s */
    proxy_start(rules);
    ckptio_engine *e = s3_test_engine();
    setenv("CKPTIO_S3_LEASE_MS", "1500", 1); /* renewed every 0.5 s; the margin 0.25 s */
    ckptio_dcp_lock *a = NULL;
    const double t0 = ckptio__now();
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &a));
    unsetenv("CKPTIO_S3_LEASE_MS");
    while (ckptio__now() - t0 < 3.2) usleep(50 * 1000); /* the delayed renewal has been written */
    const ckptio_status st = ckptio_dcp_lock_check(a);
    T_ASSERT_MSG(st == CKPTIO_E_BUSY, "status %d", st);
    T_MESSAGE_HAS("was last renewed");
    int marks = 0;
    T_OK(ckptio_object_list(e, s3_in(dir, ""), "/", count_marks, &marks));
    T_ASSERT_MSG(marks == 0, "%d marks left after the late renewal", marks);
    T_OK(ckptio_dcp_lock_release(a));
    T_ASSERT_MSG(proxy_stop("delay") == 1, "the mark's renewal was not delayed");
    T_OK(ckptio_engine_destroy(e));
}

/* A part the server refuses for good ends the upload at once: the other parts in flight are stopped, not waited
 * for (one held back 20 s at the proxy, well within the request timeout), the upload is aborted and the older
 * object stays. */
static void test_a_refused_part_stops_the_others(void) {
    const char *url = s3_url("stopped.bin");
    const size_t old_n = 1u << 20, n = 21u << 20;
    unsigned char *old = random_bytes(old_n, 16), *data = random_bytes(n, 17);
    put_direct(url, old, old_n);
    const char *rules[] = {"PUT:partNumber=2&:delay:20:1", "PUT:partNumber=1&:error:400:1", NULL};
    proxy_start(rules);
    ckptio_engine *e = fault_engine(2);
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_TIMEOUT_MS, 60000));
    const double t0 = ckptio__now();
    T_STATUS(write_object(e, url, data, n), CKPTIO_E_INVAL);
    const double took = ckptio__now() - t0;
    T_MESSAGE_HAS("UploadPart");
    T_ASSERT_MSG(took < 10, "the failed upload ended after %.1f s, with the held-back part", took);
    T_OK(ckptio_engine_destroy(e));
    proxy_stop("error");
    T_ASSERT(uploads_of(url) == 0);
    size_t got_n = 0;
    e = s3_test_engine();
    unsigned char *got = s3_object_bytes(e, url, &got_n);
    T_ASSERT(got && got_n == old_n && !memcmp(got, old, old_n));
    free(got);
    T_OK(ckptio_engine_destroy(e));
    free(old);
    free(data);
}

static void test_failed_upload_leaves_nothing(void) {
    const char *url = s3_url("precious.bin");
    const size_t old_n = 2u << 20, n = 21u << 20;
    unsigned char *old = random_bytes(old_n, 14), *data = random_bytes(n, 15), *back = malloc(old_n);
    put_direct(url, old, old_n);
    /* Every part upload reset: the save fails, naming the key; the upload is aborted. */
    const char *rules[] = {"PUT:partNumber:reset:100000", NULL};
    proxy_start(rules);
    ckptio_engine *e = fault_engine(2);
    const ckptio_status st = write_object(e, url, data, n);
    T_ASSERT_MSG(st == CKPTIO_E_IO, "status %d", st);
    T_MESSAGE_HAS("UploadPart");
    T_MESSAGE_HAS(s3_key_of(url));
    s3_no_secret_in_message();
    T_OK(ckptio_engine_destroy(e));
    T_ASSERT(proxy_stop("reset") >= 3);
    T_ASSERT(uploads_of(url) == 0);
    e = s3_test_engine();
    ckptio_file *f;
    uint64_t size;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == old_n);
    T_OK(ckptio__file_io(f, CKPTIO_READ, back, old_n, 0));
    T_ASSERT(memcmp(back, old, old_n) == 0);
    T_OK(ckptio_file_close(f));
    /* The complete refused for good (a 400 is not retried): aborted too. */
    const char *refuse[] = {"POST:uploadId:error:400:1", NULL};
    proxy_start(refuse);
    T_STATUS(write_object(e, url, data, n), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("CompleteMultipartUpload");
    T_ASSERT(proxy_stop("error") == 1);
    T_ASSERT(uploads_of(url) == 0);
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == old_n);
    T_OK(ckptio_file_close(f));
    /* A download that breaks for good leaves the caller an error, not partial bytes presented as whole. */
    const char *cut[] = {"GET:precious:truncate:1000:100000", NULL};
    proxy_start(cut);
    ckptio_engine *e2 = fault_engine(2);
    T_STATUS(read_all(e2, url, back, old_n), CKPTIO_E_IO);
    T_MESSAGE_HAS("cut short");
    T_OK(ckptio_engine_destroy(e2));
    proxy_stop("truncate");
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free(old);
    free(data);
    free(back);
}

int main(void) {
    s3_test_bucket();
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    signal(SIGPIPE, SIG_IGN);
    T_RUN(test_reads_retry);
    T_RUN(test_uploads_retry);
    T_RUN(test_give_up);
    T_RUN(test_failed_upload_leaves_nothing);
    T_RUN(test_a_refused_part_stops_the_others);
    T_RUN(test_complete_errors);
    T_RUN(test_writer_waits_while_parts_grow);
    T_RUN(test_a_late_renewal_loses_the_lease);
    T_RUN(test_a_late_mark_renewal_fails_the_check);
    T_RUN(test_a_mark_renewal_that_completes_late_is_lost);
    return T_EXIT_PASS;
}
