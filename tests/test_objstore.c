/*
 * test_objstore.c - s3:// objects against a real S3 server (OpenStack Swift's
 * s3api from scripts/s3_server.sh; exit 77, skipped, without one): single
 * requests, files read and written through the engine (bit-exact, the
 * object invisible until commit, nothing left by a close without commit or
 * a cancel, the older object intact), errors that name the bucket, the key
 * and the server's Code and Message and never a credential, hostile keys,
 * listings over several pages, the cleanup of uploads a killed writer left,
 * memory that stays bounded while an object larger than the buffers
 * streams through, and part buffers that later and concurrent uploads of
 * one engine reuse, and objects of a known size cut without a short last
 * part, their multipart upload created with the size.
 */
#include "objstore_helpers.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>

static unsigned char *random_bytes(size_t n, uint64_t seed) {
    unsigned char *b = malloc(n ? n : 1);
    T_ASSERT(b);
    t_fill_random(b, n, seed);
    return b;
}

static void test_single_requests(void) {
    ckptio__s3_client *c = s3_test_client(3);
    const char *bucket = s3_test_bucket();
    const char *key = s3_key_of(s3_url("single"));
    const size_t n = 300 * 1024 + 7;
    unsigned char *data = random_bytes(n, 1), *back = malloc(n);
    T_OK(ckptio__s3_put(c, bucket, key, data, n, false));
    uint64_t size;
    char etag[128];
    T_OK(ckptio__s3_head(c, bucket, key, &size, etag));
    T_ASSERT(size == n && etag[0]);
    T_OK(ckptio__s3_get(c, bucket, key, etag, 0, n, back));
    T_ASSERT(memcmp(back, data, n) == 0);
    memset(back, 0, n);
    T_OK(ckptio__s3_get(c, bucket, key, NULL, 1000, 5000, back));
    T_ASSERT(memcmp(back, data + 1000, 5000) == 0);
    /* Past the end: the object's size in the error. */
    T_STATUS(ckptio__s3_get(c, bucket, key, NULL, n - 10, 20, back), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("the object ended early");
    T_STATUS(ckptio__s3_get(c, bucket, key, NULL, n + 10, 20, back), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("416");
    /* Another version: reads that name the old ETag are refused. */
    data[0] ^= 1;
    T_OK(ckptio__s3_put(c, bucket, key, data, n, false));
    T_STATUS(ckptio__s3_get(c, bucket, key, etag, 0, 10, back), CKPTIO_E_STALE);
    T_MESSAGE_HAS("412");
    /* Swift's s3api has no conditional writes: a clear refusal, never a silent overwrite. */
    ckptio_status st = ckptio__s3_put(c, bucket, key, data, 10, true);
    T_ASSERT_MSG(st == CKPTIO_E_UNSUPPORTED || st == CKPTIO_E_EXISTS, "%d %s", st, ckptio_last_error_message());
    T_OK(ckptio__s3_head(c, bucket, key, &size, NULL));
    T_ASSERT(size == n);
    T_OK(ckptio__s3_delete(c, bucket, key));
    T_OK(ckptio__s3_delete(c, bucket, key)); /* gone already: fine */
    T_STATUS(ckptio__s3_head(c, bucket, key, &size, NULL), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS(key);
    T_STATUS(ckptio__s3_get(c, bucket, key, NULL, 0, 10, back), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("NoSuchKey");
    T_MESSAGE_HAS(bucket);
    s3_no_secret_in_message();
    ckptio__s3_client_destroy(c);
    free(data);
    free(back);
}

static int object_count(ckptio_engine *e, const char *url, bool uploads);

static int count_fn(void *user, const ckptio_object_info *info) {
    (*(int *)user)++;
    return 0;
}

static int object_count(ckptio_engine *e, const char *url, bool uploads) {
    int n = 0;
    if (uploads) T_OK(ckptio_object_list_uploads(e, url, count_fn, &n));
    else T_OK(ckptio_object_list(e, url, NULL, count_fn, &n));
    return n;
}

/* The number of unfinished uploads under url once it is `want` (the
 * uploader creates the upload in the background), or after 10 s. */
static int uploads_become(ckptio_engine *e, const char *url, int want) {
    int n = 0;
    for (int i = 0; i < 200 && (n = object_count(e, url, true)) != want; i++) usleep(50 * 1000);
    return n;
}

/* Writes `data` to `url` through the engine in `pieces` extents, last first. */
static void write_extents(ckptio_engine *e, ckptio_file *f, const unsigned char *data, size_t n, int pieces) {
    ckptio_extent x[16];
    size_t at = 0;
    for (int i = 0; i < pieces; i++) {
        const size_t len = i + 1 == pieces ? n - at : n / (size_t)pieces + (size_t)i * 977;
        x[pieces - 1 - i] = (ckptio_extent){.file = f, .file_offset = at, .length = len,
                                            .memory = (void *)(data + at), .mem_kind = CKPTIO_MEM_HOST};
        at += len;
    }
    T_OK(ckptio_engine_execute_extents(e, CKPTIO_WRITE, x, (size_t)pieces));
}

static void test_file_round_trip(void) {
    ckptio_engine *e = s3_test_engine();
    const char *url = s3_url("file.bin");
    const size_t n = (23u << 20) + 123;
    unsigned char *data = random_bytes(n, 2), *back = calloc(1, n);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_truncate(f, n));
    write_extents(e, f, data, n, 7);
    uint64_t size;
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == n);
    /* Before the commit: no object, one unfinished upload. */
    T_ASSERT(object_count(e, url, false) == 0);
    T_ASSERT(uploads_become(e, url, 1) == 1);
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_ASSERT(object_count(e, url, false) == 1);
    T_ASSERT(object_count(e, url, true) == 0);

    ckptio_stats before, after;
    T_OK(ckptio_engine_stats(e, &before));
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == n);
    ckptio_extent x[5];
    const size_t cuts[6] = {0, 1, 4096 * 3 + 5, 9u << 20, (17u << 20) + 1, n};
    for (int i = 0; i < 5; i++)
        x[i] = (ckptio_extent){.file = f, .file_offset = cuts[i], .length = cuts[i + 1] - cuts[i],
                               .memory = back + cuts[i], .mem_kind = CKPTIO_MEM_AUTO};
    T_OK(ckptio_engine_execute_extents(e, CKPTIO_READ, x, 5));
    T_ASSERT(memcmp(back, data, n) == 0);
    T_OK(ckptio_engine_stats(e, &after));
    T_ASSERT(after.bytes_read - before.bytes_read == n);
    unsigned char small[100];
    T_OK(ckptio__file_io(f, CKPTIO_READ, small, sizeof small, n - 100));
    T_ASSERT(memcmp(small, data + n - 100, 100) == 0);
    /* A read past the end is refused before any request, naming the extent. */
    x[0] = (ckptio_extent){.file = f, .file_offset = n - 5, .length = 10, .memory = back, .mem_kind = CKPTIO_MEM_HOST};
    T_STATUS(ckptio_engine_execute_extents(e, CKPTIO_READ, x, 1), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("extent 0");
    T_OK(ckptio_file_close(f));

    /* A small object: one PUT, no multipart upload; an empty one too. */
    const char *small_url = s3_url("small.bin");
    T_OK(ckptio_file_open(e, small_url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, data, 1000, 0));
    T_ASSERT(object_count(e, small_url, true) == 0);
    T_OK(ckptio_file_commit(f));
    T_STATUS(ckptio__file_io(f, CKPTIO_WRITE, data, 10, 0), CKPTIO_E_INVAL); /* committed */
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_file_open(e, small_url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio__file_io(f, CKPTIO_READ, back, 1000, 0));
    T_ASSERT(memcmp(back, data, 1000) == 0);
    T_OK(ckptio_file_close(f));
    const char *empty_url = s3_url("empty.bin");
    T_OK(ckptio_file_open(e, empty_url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_file_open(e, empty_url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == 0);
    T_OK(ckptio_file_close(f));
    /* Holes read as zeros, as in a local file. */
    const char *holes_url = s3_url("holes.bin");
    T_OK(ckptio_file_open(e, holes_url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_truncate(f, 12u << 20));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, data, 100, 6u << 20));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_file_open(e, holes_url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio__file_io(f, CKPTIO_READ, back, 12u << 20, 0));
    for (size_t i = 0; i < (12u << 20); i++)
        if (i < (6u << 20) || i >= (6u << 20) + 100) T_ASSERT(back[i] == 0);
    T_ASSERT(memcmp(back + (6u << 20), data, 100) == 0);
    T_OK(ckptio_file_close(f));
    /* In place: refused for objects. */
    T_STATUS(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE, &f), CKPTIO_E_UNSUPPORTED);
    /* EXCLUSIVE: refused where an object exists. */
    T_STATUS(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_EXCLUSIVE, &f), CKPTIO_E_EXISTS);
    T_OK(ckptio_engine_destroy(e));
    free(data);
    free(back);
}

static int cancel_after(uint64_t done, uint64_t total, void *user) {
    return done > 0 && done < total ? (*(int *)user = 1) : 0;
}

static void check_object(ckptio_engine *e, const char *url, const unsigned char *want, size_t n) {
    ckptio_file *f;
    uint64_t size;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT_MSG(size == n, "%s has %llu bytes, want %zu", url, (unsigned long long)size, n);
    unsigned char *back = malloc(n);
    T_OK(ckptio__file_io(f, CKPTIO_READ, back, n, 0));
    T_ASSERT(memcmp(back, want, n) == 0);
    free(back);
    T_OK(ckptio_file_close(f));
}

static void test_abort_paths(void) {
    ckptio_engine *e = s3_test_engine();
    const char *url = s3_url("keep.bin");
    const size_t old_n = 1 << 20, n = 40u << 20;
    unsigned char *old = random_bytes(old_n, 3), *data = random_bytes(n, 4);
    T_OK(ckptio_object_put(e, url, old, old_n, 0));

    /* Close without commit after parts were sent: nothing appears, nothing stays. */
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    write_extents(e, f, data, n, 3);
    T_ASSERT(uploads_become(e, url, 1) == 1);
    T_OK(ckptio_file_close(f));
    T_ASSERT(object_count(e, url, true) == 0);
    check_object(e, url, old, old_n);

    /* The engine's cancel: the save fails, the upload is aborted at close.
     * One upload at a time and 16 MiB of buffers: the 40 MiB save waits on
     * the network, so progress is reported before its end. */
    int canceled = 0;
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 << 20));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 1));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 1));
    T_OK(ckptio_engine_set_progress(e, cancel_after, &canceled));
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_truncate(f, n));
    ckptio_extent x = {.file = f, .file_offset = 0, .length = n, .memory = data, .mem_kind = CKPTIO_MEM_HOST};
    T_STATUS(ckptio_engine_execute_extents(e, CKPTIO_WRITE, &x, 1), CKPTIO_E_CANCELED);
    T_ASSERT(canceled);
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_set_progress(e, NULL, NULL));
    T_ASSERT(object_count(e, url, true) == 0);
    check_object(e, url, old, old_n);

    /* A write far out of order with too little buffer: a clear error, then nothing appears. */
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    ckptio_status st = CKPTIO_OK;
    for (uint64_t i = 0; i < 8 && st == CKPTIO_OK; i++) /* one byte into each of 8 parts */
        st = ckptio__file_io(f, CKPTIO_WRITE, data, 1, i * (5u << 20) + 1);
    T_ASSERT(st == CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("roughly in order");
    T_OK(ckptio_file_close(f));
    check_object(e, url, old, old_n);
    T_OK(ckptio_engine_destroy(e));
    free(old);
    free(data);
}

static void test_errors(void) {
    ckptio_engine *e = s3_test_engine();
    const char *bucket = s3_test_bucket();
    ckptio_file *f;
    const char *missing = s3_url("no/such/key");
    T_STATUS(ckptio_file_open(e, missing, CKPTIO_OPEN_READ, &f), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS(s3_key_of(missing));
    T_MESSAGE_HAS(bucket);
    T_MESSAGE_HAS("404");
    s3_no_secret_in_message();
    T_STATUS(ckptio_file_open(e, "s3://ckptio-no-such-bucket/k", CKPTIO_OPEN_READ, &f), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("s3://ckptio-no-such-bucket/k");
    int n = 0;
    T_STATUS(ckptio_object_list(e, "s3://ckptio-no-such-bucket/", NULL, count_fn, &n), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("NoSuchBucket");
    T_MESSAGE_HAS("ckptio-no-such-bucket");
    s3_no_secret_in_message();

    /* Wrong secret, unknown key id: the server's Code; no credential in the message. */
    char *secret = strdup(getenv("AWS_SECRET_ACCESS_KEY")), *id = strdup(getenv("AWS_ACCESS_KEY_ID"));
    setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789", 1);
    const char *url = s3_url("denied");
    T_STATUS(ckptio_object_put(e, url, "x", 1, 0), CKPTIO_E_PERMISSION);
    T_MESSAGE_HAS("403");
    T_MESSAGE_HAS("SignatureDoesNotMatch");
    T_MESSAGE_HAS(s3_key_of(url));
    s3_no_secret_in_message();
    T_ASSERT(!strstr(ckptio_last_error_message(), secret));
    T_STATUS(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f), CKPTIO_E_PERMISSION);
    s3_no_secret_in_message();
    T_ASSERT(!strstr(ckptio_last_error_message(), secret));
    setenv("AWS_SECRET_ACCESS_KEY", secret, 1);
    setenv("AWS_ACCESS_KEY_ID", "nobody:nothing", 1);
    T_STATUS(ckptio_object_list(e, url, NULL, count_fn, &n), CKPTIO_E_PERMISSION);
    T_MESSAGE_HAS("HTTP 403 "); /* AWS: InvalidAccessKeyId; Swift's tempauth: SignatureDoesNotMatch */
    s3_no_secret_in_message();
    T_ASSERT(!strstr(ckptio_last_error_message(), "nobody:nothing"));
    setenv("AWS_ACCESS_KEY_ID", id, 1);
    free(secret);
    free(id);
    /* Bad URLs never reach the network (or a local path). */
    T_STATUS(ckptio_file_open(e, "s3://x/k", CKPTIO_OPEN_READ, &f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("bucket name");
    T_OK(ckptio_engine_destroy(e));
}

static int entries_in(const char *dir) {
    DIR *d = opendir(dir);
    T_ASSERT(d);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

typedef struct seen {
    int n;
    char keys[16][1100];
} seen;

static int remember(void *user, const ckptio_object_info *info) {
    seen *s = user;
    if (s->n < 16) snprintf(s->keys[s->n], sizeof s->keys[0], "%s", info->key);
    s->n++;
    return 0;
}

static void test_hostile_keys(void) {
    ckptio_engine *e = s3_test_engine();
    /* In an empty working directory: nothing below may create a local path. */
    char cwd[4096];
    T_ASSERT(getcwd(cwd, sizeof cwd));
    const char *empty = t_path("hostile-cwd");
    T_ASSERT(mkdir(empty, 0700) == 0 && chdir(empty) == 0);
    const char *base = s3_url("hostile/");
    char longname[1100];
    const size_t used = strlen(s3_key_of(base));
    memset(longname, 'L', CKPTIO__S3_MAX_KEY - used);
    longname[CKPTIO__S3_MAX_KEY - used] = '\0';
    const char *names[] = {"b", "a/../b", "./c", "d/./e", "ctl\x01\x1f\x7f-end", "sp ace+plus%25pct&amp;",
                           "uni\xc3\xa9\xe2\x82\xac", "trail/", longname};
    const size_t count = sizeof names / sizeof *names;
    for (size_t i = 0; i < count; i++) {
        char url[1400], body[64];
        snprintf(url, sizeof url, "%s%s", base, names[i]);
        const int len = snprintf(body, sizeof body, "object %zu", i);
        T_OK(ckptio_object_put(e, url, body, (size_t)len, 0));
    }
    for (size_t i = 0; i < count; i++) {
        char url[1400], body[64], back[64] = "";
        snprintf(url, sizeof url, "%s%s", base, names[i]);
        const int len = snprintf(body, sizeof body, "object %zu", i);
        ckptio_file *f;
        T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
        uint64_t size;
        T_OK(ckptio_file_size(f, &size));
        T_ASSERT_MSG(size == (uint64_t)len, "key %zu: %llu bytes", i, (unsigned long long)size);
        T_OK(ckptio__file_io(f, CKPTIO_READ, back, (uint64_t)len, 0));
        T_ASSERT_MSG(memcmp(back, body, (size_t)len) == 0, "key %zu read back \"%s\"", i, back);
        T_OK(ckptio_file_close(f));
    }
    /* The listing gives every key back exactly (URL-encoded on the wire). */
    seen s = {0};
    T_OK(ckptio_object_list(e, base, NULL, remember, &s));
    T_ASSERT_MSG(s.n == (int)count, "%d keys listed", s.n);
    for (size_t i = 0; i < count; i++) {
        char want[1100];
        snprintf(want, sizeof want, "%s%s", s3_key_of(base), names[i]);
        bool found = false;
        for (int k = 0; k < s.n && !found; k++) found = strcmp(s.keys[k], want) == 0;
        T_ASSERT_MSG(found, "key %zu not listed", i);
    }
    /* Errors show control characters escaped and long keys cut. */
    char url[1400];
    snprintf(url, sizeof url, "%sctl\x01 missing", base);
    ckptio_file *f;
    T_STATUS(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("ctl\\x01 missing");
    T_ASSERT(!strchr(ckptio_last_error_message(), '\x01'));
    snprintf(url, sizeof url, "%s%sX", base, longname);
    T_STATUS(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f), CKPTIO_E_INVAL); /* 1025 bytes */
    T_ASSERT(strlen(ckptio_last_error_message()) < 600);
    T_ASSERT(entries_in(".") == 0);
    T_ASSERT(chdir(cwd) == 0);
    for (size_t i = 0; i < count; i++) {
        snprintf(url, sizeof url, "%s%s", base, names[i]);
        T_OK(ckptio_object_delete(e, url));
    }
    T_ASSERT(object_count(e, base, false) == 0);
    T_OK(ckptio_engine_destroy(e));
}

static void test_listing_pages(void) {
    ckptio_engine *e = s3_test_engine();
    const char *base = s3_url("list/");
    const char *names[] = {"a", "b", "d/1", "d/2", "e", "f/x", "g"};
    char url[1400];
    for (size_t i = 0; i < 7; i++) {
        snprintf(url, sizeof url, "%s%s", base, names[i]);
        T_OK(ckptio_object_put(e, url, "", 0, 0));
    }
    ckptio__s3_set_list_page(2); /* four pages */
    seen s = {0};
    T_OK(ckptio_object_list(e, base, NULL, remember, &s));
    T_ASSERT(s.n == 7);
    for (size_t i = 0; i < 7; i++) T_ASSERT(strcmp(s.keys[i] + strlen(s3_key_of(base)), names[i]) == 0);
    memset(&s, 0, sizeof s);
    T_OK(ckptio_object_list(e, base, "/", remember, &s));
    T_ASSERT_MSG(s.n == 6, "%d entries", s.n);
    int prefixes = 0;
    for (int i = 0; i < s.n; i++) {
        const char *rest = s.keys[i] + strlen(s3_key_of(base));
        prefixes += !strcmp(rest, "d/") || !strcmp(rest, "f/");
    }
    T_ASSERT(prefixes == 2);
    ckptio__s3_set_list_page(0);
    for (size_t i = 0; i < 7; i++) {
        snprintf(url, sizeof url, "%s%s", base, names[i]);
        T_OK(ckptio_object_delete(e, url));
    }
    T_OK(ckptio_engine_destroy(e));
}

static void test_killed_writer_cleanup(void) {
    ckptio_engine *e = s3_test_engine();
    const char *url = s3_url("killed/model.bin");
    const char *prefix = s3_url("killed/");
    const size_t n = 12u << 20;
    unsigned char *data = random_bytes(n, 5);
    fflush(NULL);
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        /* A save killed half-way: parts sent, no commit, no close. */
        ckptio_engine *ce = s3_test_engine();
        ckptio_file *f;
        if (ckptio_file_open(ce, url, CKPTIO_OPEN_WRITE, &f) != CKPTIO_OK) _exit(2);
        if (ckptio__file_io(f, CKPTIO_WRITE, data, n, 0) != CKPTIO_OK) _exit(3);
        for (int i = 0; i < 200 && object_count(ce, prefix, true) == 0; i++) usleep(50 * 1000);
        kill(getpid(), SIGKILL);
        _exit(4);
    }
    int status;
    T_ASSERT(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
    T_ASSERT(object_count(e, prefix, false) == 0); /* no object */
    T_ASSERT(object_count(e, prefix, true) == 1);  /* but an unfinished upload */
    uint64_t aborted = 99;
    T_OK(ckptio_object_abort_uploads(e, prefix, 3600, &aborted));
    T_ASSERT(aborted == 0); /* younger than an hour: kept */
    T_OK(ckptio_object_abort_uploads(e, prefix, 0, &aborted));
    T_ASSERT(aborted == 1);
    T_ASSERT(object_count(e, prefix, true) == 0);
    T_ASSERT(object_count(e, prefix, false) == 0);
    T_OK(ckptio_engine_destroy(e));
    free(data);
}

static bool sanitized(void) {
#if defined(__SANITIZE_ADDRESS__)
    return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return true;
#endif
#endif
    return false;
}

static uint64_t vm_hwm_kib(void) {
    FILE *fp = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t v = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "VmHWM: %lu kB", &v) == 1) break;
    if (fp) fclose(fp);
    return v;
}

static void test_memory_bounded(void) {
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 << 20));
    const char *url = s3_url("big.bin");
    const uint64_t total = 96u << 20, piece = 1u << 20;
    unsigned char *buf = malloc(piece), *back = malloc(piece);
    FILE *clear = fopen("/proc/self/clear_refs", "w"); /* "5": the peak RSS starts again from now */
    if (clear) {
        fputs("5", clear);
        fclose(clear);
    }
    const uint64_t hwm0 = vm_hwm_kib();
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    for (uint64_t off = 0; off < total; off += piece) {
        t_fill_random(buf, piece, off);
        T_OK(ckptio__file_io(f, CKPTIO_WRITE, buf, piece, off));
    }
    uint64_t peak, bound;
    ckptio__object_buffers(f, &peak, &bound);
    T_ASSERT_MSG(bound == 4 * (5u << 20) + 2 * (1u << 20), "bound %llu", (unsigned long long)bound);
    T_ASSERT_MSG(peak <= bound && peak < total / 3, "peak %llu of bound %llu", (unsigned long long)peak,
                 (unsigned long long)bound);
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f));
    for (uint64_t off = 0; off < total; off += piece) {
        T_OK(ckptio__file_io(f, CKPTIO_READ, back, piece, off));
        t_fill_random(buf, piece, off);
        T_ASSERT_MSG(memcmp(buf, back, piece) == 0, "MiB at %llu differs", (unsigned long long)off);
    }
    T_OK(ckptio_file_close(f));
    const uint64_t grown = vm_hwm_kib() - hwm0;
    /* (ASan's quarantine keeps freed buffers resident: the RSS says nothing there.) */
    if (hwm0 && !sanitized())
        T_ASSERT_MSG(grown < 64 * 1024, "the peak RSS grew by %llu KiB for a 96 MiB object",
                     (unsigned long long)grown);
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free(buf);
    free(back);
}

typedef struct pooled_upload {
    ckptio_engine *engine;
    const char *url;
    const unsigned char *data;
    size_t n;
    ckptio_status status;
} pooled_upload;

/* Writes the object in 1 MiB pieces, in order, and commits it. */
static void *pooled_upload_run(void *arg) {
    pooled_upload *u = arg;
    ckptio_file *f;
    u->status = ckptio_file_open(u->engine, u->url, CKPTIO_OPEN_WRITE, &f);
    if (u->status != CKPTIO_OK) return NULL;
    for (size_t off = 0; off < u->n && u->status == CKPTIO_OK; off += 1u << 20) {
        const size_t len = u->n - off < (1u << 20) ? u->n - off : 1u << 20;
        u->status = ckptio__file_io(f, CKPTIO_WRITE, (void *)(u->data + off), len, off);
    }
    if (u->status == CKPTIO_OK) u->status = ckptio_file_commit(f);
    const ckptio_status st = ckptio_file_close(f);
    if (u->status == CKPTIO_OK) u->status = st;
    return NULL;
}

/* Part buffers come from the engine's pool and go back to it: an upload
 * after the first one allocates no buffer, uploads at once share the pool,
 * the pool never keeps more than one upload's bound, a fork()ed child
 * uploads through a pool of its own, and the engine frees what it keeps
 * when destroyed (ASan's leak check). */
static void test_part_buffers_reused(void) {
    ckptio_engine *e = s3_test_engine(); /* 5 MiB parts */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 << 20));
    const uint64_t bound = 4 * (5u << 20) + 2 * (1u << 20); /* four parts' buffers at most */
    const size_t n = (21u << 20) + 12345;                   /* five parts, the last short */
    unsigned char *data = random_bytes(n, 71), *other = random_bytes(n, 72);
    ckptio__s3_part_pool_stats s;
    ckptio__object_part_pool_stats(e, &s);
    T_ASSERT(s.allocated == 0 && s.reused == 0 && s.kept_bytes == 0);

    /* The first upload holds four buffers at once: a piece of each of the first four parts, then the rest. */
    const char *a = s3_url("pool-a.bin");
    ckptio_file *f;
    T_OK(ckptio_file_open(e, a, CKPTIO_OPEN_WRITE, &f));
    const size_t part = 5u << 20, mib = 1u << 20;
    for (size_t p = 0; p < 4; p++) T_OK(ckptio__file_io(f, CKPTIO_WRITE, data + p * part, mib, p * part));
    for (size_t p = 0; p < 4; p++)
        T_OK(ckptio__file_io(f, CKPTIO_WRITE, data + p * part + mib, 4 * mib, p * part + mib));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, data + (20u << 20), n - (20u << 20), 20u << 20));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    ckptio__object_part_pool_stats(e, &s);
    T_ASSERT_MSG(s.allocated == 4 && s.reused == 1 && s.kept_bytes == 4 * (5u << 20),
                 "first upload: allocated %llu, reused %llu, kept %llu", (unsigned long long)s.allocated,
                 (unsigned long long)s.reused, (unsigned long long)s.kept_bytes);
    check_object(e, a, data, n);

    /* A second upload, through the engine's workers: every buffer is one the first touched. */
    const char *b = s3_url("pool-b.bin");
    T_OK(ckptio_file_open(e, b, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_truncate(f, n));
    const ckptio_extent x = {.file = f, .file_offset = 0, .length = n, .memory = other, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_engine_execute_extents(e, CKPTIO_WRITE, &x, 1));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    ckptio__object_part_pool_stats(e, &s);
    T_ASSERT_MSG(s.allocated == 4 && s.reused == 6, "second upload: allocated %llu, reused %llu",
                 (unsigned long long)s.allocated, (unsigned long long)s.reused);
    check_object(e, b, other, n);

    /* Two uploads at once share the pool: at most four more buffers, the bound kept, both objects exact. */
    pooled_upload u[2] = {{e, s3_url("pool-c.bin"), data, n, CKPTIO_OK},
                          {e, s3_url("pool-d.bin"), other, n, CKPTIO_OK}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) T_ASSERT(pthread_create(&t[i], NULL, pooled_upload_run, &u[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) T_OK(u[i].status);
    ckptio__object_part_pool_stats(e, &s);
    T_ASSERT_MSG(s.allocated <= 8 && s.kept_peak <= bound && s.kept_bytes <= bound,
                 "two uploads at once: allocated %llu, kept peak %llu of %llu", (unsigned long long)s.allocated,
                 (unsigned long long)s.kept_peak, (unsigned long long)bound);
    check_object(e, u[0].url, data, n);
    check_object(e, u[1].url, other, n);
    for (int i = 0; i < 2; i++) T_OK(ckptio_object_delete(e, u[i].url));

    /* A fork()ed child drops its copy of the kept buffers and uploads through a pool of its own. */
    T_ASSERT(s.kept_bytes > 0);
    pooled_upload forked = {e, s3_url("pool-fork.bin"), data, n, CKPTIO_OK};
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        pooled_upload_run(&forked);
        ckptio__s3_part_pool_stats cs;
        ckptio__object_part_pool_stats(e, &cs);
        _exit(forked.status != CKPTIO_OK ? 1 : cs.allocated == 0 ? 2 : 0); /* a fresh pool allocates */
    }
    int status = 0;
    T_ASSERT(waitpid(pid, &status, 0) == pid);
    T_ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's upload: status %d", status);
    check_object(e, forked.url, data, n);
    T_OK(ckptio_object_delete(e, forked.url));
    T_OK(ckptio_object_delete(e, a));
    T_OK(ckptio_object_delete(e, b));
    T_OK(ckptio_engine_destroy(e)); /* frees the kept buffers */

    /* s3_buffers_keep_ms 0: nothing is kept after the upload. */
    e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_BUFFERS_KEEP_MS, 0));
    pooled_upload one = {e, s3_url("pool-e.bin"), data, n, CKPTIO_OK};
    pooled_upload_run(&one);
    T_OK(one.status);
    ckptio__object_part_pool_stats(e, &s);
    T_ASSERT(s.kept_bytes == 0 && s.reused == 0 && s.freed == s.allocated);
    T_OK(ckptio_object_delete(e, one.url));
    T_OK(ckptio_engine_destroy(e));
    free(data);
    free(other);
}

/* The parts of an object written as `n` bytes of `data` (truncated to n first when `sized`), counted from its
 * ETag (a multipart object's is "MD5-PARTS", one PUT's has no dash: 1); its bytes checked. */
static unsigned parts_of_upload(ckptio_engine *e, const char *url, const unsigned char *data, size_t n, bool sized) {
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    if (sized) T_OK(ckptio_file_truncate(f, n));
    const ckptio_extent x = {.file = f, .file_offset = 0, .length = n, .memory = (void *)data,
                             .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_engine_execute_extents(e, CKPTIO_WRITE, &x, 1));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    check_object(e, url, data, n);
    char etag[128];
    T_OK(ckptio__object_info(e, url, NULL, etag, NULL, NULL));
    const char *dash = strrchr(etag, '-');
    T_OK(ckptio_object_delete(e, url));
    return dash ? (unsigned)strtoul(dash + 1, NULL, 10) : 1;
}

static void test_no_short_last_part(void) {
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_PART_BYTES, 8 << 20));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 4));
    const size_t part = 8u << 20, n = 4 * part + 100000, most = 4 * part + (5u << 20);
    unsigned char *data = random_bytes(most, 81);
    /* Four parts and 100 kB, the size given first, four parts in flight at once: four parts of 9 MiB (the last
     * shorter), not a fifth of 100 kB that would go out alone after the four. */
    unsigned parts = parts_of_upload(e, s3_url("parts-4.bin"), data, n, true);
    T_ASSERT_MSG(parts == 4, "%zu bytes in %u parts, want 4", n, parts);
    /* Three parts and 100 kB: the short part goes beside the three. */
    parts = parts_of_upload(e, s3_url("parts-3.bin"), data, 3 * part + 100000, true);
    T_ASSERT_MSG(parts == 4, "%zu bytes in %u parts, want 4", 3 * part + 100000, parts);
    /* A rest larger than an eighth of a part spread over the parts is a part of its own. */
    parts = parts_of_upload(e, s3_url("parts-5.bin"), data, most, true);
    T_ASSERT_MSG(parts == 5, "%zu bytes in %u parts, want 5", most, parts);
    /* Without the size, the parts are cut before the end is known: part_bytes each. */
    parts = parts_of_upload(e, s3_url("parts-unsized.bin"), data, n, false);
    T_ASSERT_MSG(parts == 5, "%zu bytes written without a size in %u parts, want 5", n, parts);
    T_OK(ckptio_engine_destroy(e));
    free(data);
}

/* An object of several parts whose size is given first: its multipart upload is created at once, before any part
 * is full (its round trip beside the filling of the first part); a close without commit aborts it. Sized for one
 * part afterwards, the object goes in one PUT and the upload created for the larger size is aborted. */
static void test_upload_created_with_the_size(void) {
    ckptio_engine *e = s3_test_engine(); /* 5 MiB parts */
    const char *url = s3_url("early.bin");
    unsigned char *data = random_bytes(1000, 91);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_truncate(f, 3 * (5u << 20)));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, data, 1000, 0)); /* no part is full */
    T_ASSERT(uploads_become(e, url, 1) == 1);
    T_OK(ckptio_file_close(f));
    T_ASSERT(uploads_become(e, url, 0) == 0);
    T_ASSERT(object_count(e, url, false) == 0);

    T_OK(ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f));
    T_OK(ckptio_file_truncate(f, 3 * (5u << 20)));
    T_ASSERT(uploads_become(e, url, 1) == 1);
    T_OK(ckptio_file_truncate(f, 1000));
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, data, 1000, 0));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_ASSERT(uploads_become(e, url, 0) == 0);
    check_object(e, url, data, 1000);
    char etag[128];
    T_OK(ckptio__object_info(e, url, NULL, etag, NULL, NULL));
    T_ASSERT_MSG(!strchr(etag, '-'), "one PUT, not a multipart upload: ETag %s", etag);
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free(data);
}

int main(void) {
    s3_test_bucket();
    T_RUN(test_single_requests);
    T_RUN(test_file_round_trip);
    T_RUN(test_abort_paths);
    T_RUN(test_errors);
    T_RUN(test_hostile_keys);
    T_RUN(test_listing_pages);
    T_RUN(test_killed_writer_cleanup);
    T_RUN(test_memory_bounded);
    T_RUN(test_part_buffers_reused);
    T_RUN(test_no_short_last_part);
    T_RUN(test_upload_created_with_the_size);
    return T_EXIT_PASS;
}
