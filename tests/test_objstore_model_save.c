/*
 * test_objstore_model_save.c - ckptio_model_save under an s3:// prefix
 * (skipped, exit 77, without an S3 server): shards of several parts each,
 * uploaded together, are the bytes the same save writes on local disk, the
 * index too, and the model loads back bit-exact; a save cancelled while
 * its uploads are in flight, or while its shards' commits wait for them,
 * leaves no object and no unfinished upload under the prefix and an older
 * model there intact; an existing model is refused without
 * CKPTIO_MODEL_SAVE_OVERWRITE; uploads written in one plan hold no more
 * part buffers together than their shared bound (plus one part each); a
 * save whose parts each take longer than the request timeout (the fault
 * proxy delays them) still completes under a small shared bound; a first
 * part grown by a size given late counts in the bound at its new size.
 */
#include "objstore_helpers.h"

#define NT 6
#define TBYTES (6u << 20) /* 6 MiB each: with 5 MiB parts, two parts per tensor */

static unsigned char *data[NT];
static int64_t shape[1] = {TBYTES};
static ckptio_tensor_source src[NT];
static const char *names[NT] = {"l.0.w", "l.0.b", "l.1.w", "l.1.b", "l.2.w", "l.2.b"};

static void make_sources(uint64_t seed) {
    for (int i = 0; i < NT; i++) {
        if (!data[i]) data[i] = malloc(TBYTES);
        t_fill_random(data[i], TBYTES, seed + (uint64_t)i);
        src[i] = (ckptio_tensor_source){names[i], CKPTIO_DTYPE_U8, 1, shape, data[i], TBYTES, CKPTIO_MEM_HOST};
    }
}

static const char *in(const char *dir, const char *name) {
    static char buf[4][1500];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static void same_as_local(ckptio_engine *e, const char *url, const char *local) {
    size_t n_obj, n_loc;
    unsigned char *obj = s3_object_bytes(e, url, &n_obj), *loc = t_read_file(local, &n_loc);
    T_ASSERT_MSG(n_obj == n_loc && memcmp(obj, loc, n_loc) == 0, "%s differs from %s", url, local);
    free(obj);
    free(loc);
}

static int count_entry(void *user, const ckptio_object_info *info) {
    (void)info;
    ++*(int *)user;
    return 0;
}

static int objects_under(ckptio_engine *e, const char *dir) {
    int n = 0;
    T_OK(ckptio_object_list(e, in(dir, ""), NULL, count_entry, &n));
    return n;
}

static int uploads_under(ckptio_engine *e, const char *dir) {
    int n = 0;
    T_OK(ckptio_object_list_uploads(e, in(dir, ""), count_entry, &n));
    return n;
}

typedef struct remover {
    ckptio_engine *e;
    char bucket[256];
} remover;

static int remove_entry(void *user, const ckptio_object_info *info) {
    remover *r = user;
    char url[1500];
    snprintf(url, sizeof url, "s3://%s/%s", r->bucket, info->key);
    T_OK(ckptio_object_delete(r->e, url));
    return 0;
}

/* Deletes what a test left under `dir` (the server's disk is shared by every run). */
static void remove_all(ckptio_engine *e, const char *dir) {
    remover r = {.e = e};
    snprintf(r.bucket, sizeof r.bucket, "%s", s3_test_bucket());
    T_OK(ckptio_object_list(e, in(dir, ""), NULL, remove_entry, &r));
    T_ASSERT(objects_under(e, dir) == 0);
}

static void check_model(ckptio_engine *e, const char *dir) {
    ckptio_model *m;
    T_OK(ckptio_model_open(e, dir, 0, &m));
    unsigned char *got = malloc(TBYTES);
    for (int i = 0; i < NT; i++) {
        size_t idx;
        T_OK(ckptio_model_find(m, names[i], &idx));
        const ckptio_slice_target t = {.index = idx, .data = got, .capacity = TBYTES, .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_model_read(m, &t, 1));
        T_ASSERT(memcmp(got, data[i], TBYTES) == 0);
    }
    free(got);
    T_OK(ckptio_model_close(m));
}

static const ckptio_model_save_options two_each = {.max_shard_size = 2 * TBYTES};

static void test_round_trip(void) {
    ckptio_engine *e = s3_test_engine();
    make_sources(1);
    const char *dir = s3_url("model"), *local = t_path("model");
    size_t nshards;
    T_OK(ckptio_model_save(e, in(dir, ""), src, NT, &two_each, &nshards)); /* "prefix/" names the same prefix */
    T_ASSERT(nshards == 3);
    T_OK(ckptio_model_save(e, local, src, NT, &two_each, NULL));
    const char *files[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                           "model-00003-of-00003.safetensors", "model.safetensors.index.json"};
    for (int k = 0; k < 4; k++) same_as_local(e, in(dir, files[k]), in(local, files[k]));
    T_ASSERT(objects_under(e, dir) == 4 && uploads_under(e, dir) == 0);
    check_model(e, dir);
    /* An existing model is refused, and the refusal writes nothing. */
    make_sources(2);
    T_STATUS(ckptio_model_save(e, dir, src, NT, &two_each, NULL), CKPTIO_E_EXISTS);
    T_MESSAGE_HAS("already holds a model");
    make_sources(1);
    check_model(e, dir);
    remove_all(e, dir);
    T_OK(ckptio_engine_destroy(e));
}

static int cancel_after(uint64_t done, uint64_t total, void *user) {
    (void)user;
    return done >= total / 3;
}

/* After every byte was handed to the uploads: the commits are waiting for their last parts. */
static int cancel_at_commit(uint64_t done, uint64_t total, void *user) {
    ++*(int *)user;
    return done >= total;
}

static void test_cancel_leaves_nothing(void) {
    ckptio_engine *e = s3_test_engine();
    make_sources(3);
    const char *dir = s3_url("cancelled");
    T_OK(ckptio_model_save(e, dir, src, 2, NULL, NULL)); /* an older model: one model.safetensors */
    size_t older_len;
    unsigned char *older = s3_object_bytes(e, in(dir, "model.safetensors"), &older_len);
    make_sources(4);
    T_OK(ckptio_engine_set_progress(e, cancel_after, NULL));
    T_STATUS(ckptio_model_save(e, dir, src, NT,
                               &(ckptio_model_save_options){.max_shard_size = 2 * TBYTES,
                                                            .flags = CKPTIO_MODEL_SAVE_OVERWRITE},
                               NULL),
             CKPTIO_E_CANCELED);
    /* The same, canceled while the shards' commits wait for their uploads (the commits run together). */
    for (int at_commit = 0; at_commit < 2; at_commit++) {
        int calls = 0;
        if (at_commit) {
            T_OK(ckptio_engine_set_progress(e, cancel_at_commit, &calls));
            T_STATUS(ckptio_model_save(e, dir, src, NT,
                                       &(ckptio_model_save_options){.max_shard_size = 2 * TBYTES,
                                                                    .flags = CKPTIO_MODEL_SAVE_OVERWRITE},
                                       NULL),
                     CKPTIO_E_CANCELED);
            T_MESSAGE_HAS("while its commit waited");
        }
        T_OK(ckptio_engine_set_progress(e, NULL, NULL));
        T_ASSERT_MSG(objects_under(e, dir) == 1, "%d objects left", objects_under(e, dir));
        T_ASSERT_MSG(uploads_under(e, dir) == 0, "%d uploads left", uploads_under(e, dir));
        size_t now_len;
        unsigned char *now = s3_object_bytes(e, in(dir, "model.safetensors"), &now_len);
        T_ASSERT(now_len == older_len && memcmp(now, older, now_len) == 0);
        free(now);
    }
    free(older);
    /* The same save without the cancel replaces it: three shards and the index, the single file gone. */
    T_OK(ckptio_model_save(e, dir, src, NT,
                           &(ckptio_model_save_options){.max_shard_size = 2 * TBYTES,
                                                        .flags = CKPTIO_MODEL_SAVE_OVERWRITE},
                           NULL));
    T_ASSERT(objects_under(e, dir) == 4);
    check_model(e, dir);
    remove_all(e, dir);
    T_OK(ckptio_engine_destroy(e));
}

/* Uploads sharing one bound: three objects written in one plan whose pieces alternate between them (every
 * upload filling at once) hold at most one object's bound of part buffers together, plus one part each,
 * where each alone could hold its own bound; every byte arrives. */
static void test_shared_buffer_bound(void) {
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 2));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 4));
    enum { NF = 3, SIZE = 48 << 20, PART = 5 << 20, PIECE = 8 << 20, NP = SIZE / PIECE };
    unsigned char *bytes = malloc((size_t)NF * SIZE);
    t_fill_random(bytes, (size_t)NF * SIZE, 77);
    ckptio_file *f[NF];
    ckptio_extent x[NF * NP];
    for (int i = 0; i < NF; i++) {
        char name[32];
        snprintf(name, sizeof name, "shared/%d", i);
        T_OK(ckptio_file_open(e, s3_url(name), CKPTIO_OPEN_WRITE, &f[i]));
        T_OK(ckptio_file_truncate(f[i], SIZE));
        for (int p = 0; p < NP; p++)
            x[p * NF + i] = (ckptio_extent){.file = f[i], .file_offset = (uint64_t)p * PIECE, .length = PIECE,
                                            .memory = bytes + (size_t)i * SIZE + (size_t)p * PIECE,
                                            .mem_kind = CKPTIO_MEM_HOST};
    }
    uint64_t bound = 0;
    T_OK(ckptio__object_share_buffers(f, NF, &bound));
    T_ASSERT(bound == (2 + 2) * (uint64_t)PART + 4 * (uint64_t)PIECE); /* (concurrency + 2) parts + threads x chunk */
    T_OK(ckptio_engine_execute_extents(e, CKPTIO_WRITE, x, NF * NP));
    const uint64_t peak = ckptio__object_shared_peak(f[0]);
    T_ASSERT_MSG(peak > 0 && peak <= bound + NF * (uint64_t)PART, "peak %llu, bound %llu",
                 (unsigned long long)peak, (unsigned long long)bound);
    for (int i = 0; i < NF; i++) {
        T_OK(ckptio_file_commit(f[i]));
        T_OK(ckptio_file_close(f[i]));
    }
    for (int i = 0; i < NF; i++) {
        char name[32];
        snprintf(name, sizeof name, "shared/%d", i);
        size_t len;
        unsigned char *got = s3_object_bytes(e, s3_url(name), &len);
        T_ASSERT(len == SIZE && memcmp(got, bytes + (size_t)i * SIZE, SIZE) == 0);
        free(got);
        T_OK(ckptio_object_delete(e, s3_url(name)));
    }
    free(bytes);
    T_OK(ckptio_engine_destroy(e));
}

/* A slow link: the first two part PUTs take 2 s each at the fault proxy (the server then answers at once),
 * twice the request timeout, while the shards' uploads share a bound of three parts. A writer waits for a
 * part buffer longer than the request timeout with no buffer given back, but a part is in flight, so the
 * save goes on and is whole: every part sent once (no attempt timed out), the bytes as saved. */
static void test_slow_parts_under_a_shared_bound(void) {
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_TIMEOUT_MS, 1000));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_RETRIES, 0));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_S3_CONCURRENCY, 1));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 1));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 64 << 10)); /* the bound: 3 parts and 64 KiB */
    make_sources(5);
    const char *dir = s3_url("slow-parts");
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    const char *const slow[] = {"PUT:partNumber=:delay:2:2", NULL};
    proxy_start(slow);
    size_t nshards = 0;
    const ckptio_status st = ckptio_model_save(e, dir, src, NT, &two_each, &nshards);
    s3_request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    s3_read_requests(g);
    const int delayed = proxy_stop("delay");
    T_ASSERT_MSG(st == CKPTIO_OK, "%s", ckptio_last_error_message());
    /* 3 shards of 12 MiB and a header: three parts each (5 + 5 + the rest), each PUT once. */
    const size_t parts = s3_count_requests(g, "PUT", "partNumber=");
    T_ASSERT_MSG(nshards == 3 && parts == 9 && delayed == 2, "%zu shards, %zu part PUTs, %d delayed", nshards,
                 parts, delayed);
    free(g);
    T_OK(ckptio_engine_destroy(e));
    e = s3_test_engine(); /* read back in larger GETs than the save's 64 KiB chunks */
    T_ASSERT(objects_under(e, dir) == 4 && uploads_under(e, dir) == 0);
    check_model(e, dir);
    remove_all(e, dir);
    T_OK(ckptio_engine_destroy(e));
}

/* A first part grown by a size given after its first bytes (parts bigger than 5 MiB for an object of
 * 80 GiB: 9 MiB) counts in the shared bound at its new size. */
static void test_grown_first_part_counts_in_the_bound(void) {
    ckptio_engine *e = s3_test_engine();
    ckptio_file *f;
    T_OK(ckptio_file_open(e, s3_url("grown"), CKPTIO_OPEN_WRITE, &f));
    uint64_t bound = 0;
    T_OK(ckptio__object_share_buffers(&f, 1, &bound));
    unsigned char bytes[100];
    t_fill_random(bytes, sizeof bytes, 9);
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, bytes, sizeof bytes, 0));
    T_ASSERT(ckptio__object_shared_peak(f) == 5u << 20);
    T_OK(ckptio_file_truncate(f, 80ull << 30));
    T_ASSERT_MSG(ckptio__object_shared_peak(f) == 9u << 20, "peak %llu after the first part grew to 9 MiB",
                 (unsigned long long)ckptio__object_shared_peak(f));
    T_OK(ckptio_file_close(f)); /* never committed: the upload is aborted */
    T_OK(ckptio_engine_destroy(e));
}

int main(void) {
    s3_test_bucket();
    signal(SIGPIPE, SIG_IGN);
    T_RUN(test_round_trip);
    T_RUN(test_cancel_leaves_nothing);
    T_RUN(test_shared_buffer_bound);
    T_RUN(test_slow_parts_under_a_shared_bound);
    T_RUN(test_grown_first_part_counts_in_the_bound);
    for (int i = 0; i < NT; i++) free(data[i]);
    return T_EXIT_PASS;
}
