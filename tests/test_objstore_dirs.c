/*
 * test_objstore_dirs.c - directories in object storage (s3://BUCKET/PREFIX/)
 * against a real S3 server (skipped, exit 77, without one): the format
 * probe of objects and prefixes; a Hugging Face model under a prefix (its
 * index and shards, or a single model.safetensors); a DCP checkpoint's
 * reader and its commit steps (small files, stale files of older saves,
 * the lease that keeps two savers apart, the cleanup guard for a later
 * save's objects); a checkpoint manager's root (begin, commit, scan, the
 * FULL check, latest, readers' pins, removal order, clean, retention,
 * aliens left whole); listings that name keys outside the prefix or names
 * no file can have, through the fault proxy.
 */
#include "dcp_commit_internal.h"
#include "objstore_helpers.h"
#include "steps_fixture.h"
#include "steps_internal.h"

#include <errno.h>
#include <sys/stat.h>
#include <time.h>

/* Writes `len` bytes as the object `url` (one PUT). */
static void put(ckptio_engine *e, const char *url, const void *data, size_t len) {
    T_OK(ckptio_object_put(e, url, data, len, 0));
}

static bool exists(ckptio_engine *e, const char *url) {
    ckptio__path_kind kind;
    T_OK(ckptio__object_stat(e, url, &kind, NULL));
    return kind == CKPTIO__PATH_FILE;
}

/* "URL/NAME" in a rotating buffer. */
static const char *in(const char *dir, const char *name) {
    static char bufs[8][4200];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%.2048s%s%.2048s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name);
    return b;
}

/* A small safetensors file with tensors named `names` (F32 [n]), values from seed. */
static void save_shard(ckptio_engine *e, const char *url, const char *const *names, size_t count, int64_t n,
                       uint64_t seed) {
    ckptio_tensor_source src[8];
    float *data[8];
    static int64_t shape[1];
    shape[0] = n;
    for (size_t i = 0; i < count; i++) {
        data[i] = malloc((size_t)n * 4);
        t_fill_random(data[i], (size_t)n * 4, seed + i);
        src[i] = (ckptio_tensor_source){names[i], CKPTIO_DTYPE_F32, 1, shape, data[i], (uint64_t)n * 4,
                                        CKPTIO_MEM_HOST};
    }
    T_OK(ckptio_safetensors_save(e, url, src, count, NULL, 0, 0));
    for (size_t i = 0; i < count; i++) free(data[i]);
}

static void test_format_probe(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("probe");
    const char *names[] = {"w"};
    save_shard(e, in(dir, "plain/a.safetensors"), names, 1, 1000, 1);
    ckptio_format f;
    T_OK(ckptio_format_detect(in(dir, "plain/a.safetensors"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_SAFETENSORS);
    T_OK(ckptio_format_detect(in(dir, "plain"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_DIRECTORY);
    T_OK(ckptio_format_detect(in(dir, "plain/"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_DIRECTORY);
    put(e, in(dir, "dcp/.metadata"), "x", 1);
    T_OK(ckptio_format_detect(in(dir, "dcp"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_DCP);
    put(e, in(dir, "hf/model.safetensors.index.json"), "{}", 2);
    T_OK(ckptio_format_detect(in(dir, "hf/"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_HF_INDEX);
    put(e, in(dir, "junk.bin"), "not a checkpoint at all", 23);
    T_OK(ckptio_format_detect(in(dir, "junk.bin"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_UNKNOWN);
    /* Nothing there: not found, naming the URL; a missing bucket too. */
    T_ASSERT(ckptio_format_detect(in(dir, "nothing"), &f) == CKPTIO_E_NOT_FOUND);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "probe/nothing"), "%s", ckptio_last_error_message());
    T_ASSERT(ckptio_format_detect("s3://ckptio-no-such-bucket-x/a", &f) == CKPTIO_E_NOT_FOUND);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "ckptio-no-such-bucket-x"), "%s", ckptio_last_error_message());
    s3_no_secret_in_message();
    ckptio_engine_destroy(e);
}

/* Every tensor of the model, read through one plan, against the values saved. */
static void check_model(ckptio_model *m, const char *const *names, size_t count, int64_t n, uint64_t seed) {
    float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    for (size_t i = 0; i < count; i++) {
        size_t index;
        T_OK(ckptio_model_find(m, names[i], &index));
        const ckptio_slice_target rq = {.index = index, .data = got, .capacity = (uint64_t)n * 4,
                                        .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_model_read(m, &rq, 1));
        t_fill_random(want, (size_t)n * 4, seed + i);
        T_ASSERT_MSG(memcmp(want, got, (size_t)n * 4) == 0, "tensor %s differs", names[i]);
    }
    free(want);
    free(got);
}

static void test_hf_prefix(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("hf");
    const char *a[] = {"layer.0.w", "layer.0.b"}, *b[] = {"layer.1.w"};
    save_shard(e, in(dir, "model-00001-of-00002.safetensors"), a, 2, 300000, 10);
    save_shard(e, in(dir, "model-00002-of-00002.safetensors"), b, 1, 300000, 20);
    const char *index = "{\"metadata\": {\"total_size\": 3600000}, \"weight_map\": {"
                        "\"layer.0.w\": \"model-00001-of-00002.safetensors\", "
                        "\"layer.0.b\": \"model-00001-of-00002.safetensors\", "
                        "\"layer.1.w\": \"model-00002-of-00002.safetensors\"}}";
    put(e, in(dir, "model.safetensors.index.json"), index, strlen(index));
    ckptio_model *m;
    for (int form = 0; form < 3; form++) { /* the prefix, with a '/', the index itself */
        const char *path = form == 0 ? dir : form == 1 ? in(dir, "") : in(dir, "model.safetensors.index.json");
        T_OK(ckptio_model_open(e, path, 0, &m));
        size_t shards = 0;
        T_OK(ckptio_model_shard_count(m, &shards));
        T_ASSERT(shards == 2);
        const char *first = NULL;
        T_OK(ckptio_model_shard(m, 0, &first, NULL));
        T_ASSERT_MSG(!strcmp(first, in(dir, "model-00001-of-00002.safetensors")), "%s", first);
        size_t total = 0;
        T_OK(ckptio_model_count(m, &total));
        T_ASSERT_MSG(total == 3, "%zu tensors", total);
        check_model(m, a, 2, 300000, 10);
        check_model(m, b, 1, 300000, 20);
        T_OK(ckptio_model_close(m));
    }
    /* A shard missing: the error names the index, the tensor and the shard. */
    T_OK(ckptio_object_delete(e, in(dir, "model-00002-of-00002.safetensors")));
    T_ASSERT(ckptio_model_open(e, dir, 0, &m) == CKPTIO_E_NOT_FOUND);
    const char *msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "layer.1.w") && strstr(msg, "model-00002-of-00002.safetensors"), "%s", msg);
    s3_no_secret_in_message();
    /* A single model.safetensors under the prefix wins (transformers' order). */
    const char *one[] = {"x"};
    save_shard(e, in(dir, "model.safetensors"), one, 1, 1000, 30);
    T_OK(ckptio_model_open(e, dir, 0, &m));
    check_model(m, one, 1, 1000, 30);
    T_OK(ckptio_model_close(m));
    /* An index naming a shard outside the prefix is refused before anything is opened. */
    const char *hostile_dir = s3_url("hf-hostile");
    const char *hostile = "{\"weight_map\": {\"x\": \"../hf/model.safetensors\"}}";
    put(e, in(hostile_dir, "model.safetensors.index.json"), hostile, strlen(hostile));
    T_ASSERT(ckptio_model_open(e, hostile_dir, 0, &m) == CKPTIO_E_DISALLOWED);
    ckptio_engine_destroy(e);
}

/* ---- requests of a model's open, as the server sees them ------------------------ */

#define MAX_REQUESTS 64

typedef struct request_log {
    char method[MAX_REQUESTS][8];
    char target[MAX_REQUESTS][512];
    double start[MAX_REQUESTS], end[MAX_REQUESTS];
    size_t n;
} request_log;

/* The requests in the proxy's log, once `want` of them are there (it logs
 * a request once answered). */
static void read_requests(request_log *g, size_t want) {
    for (int tries = 0; tries < 100; tries++) {
        char *text = proxy_log_text();
        g->n = 0;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            T_ASSERT(g->n < MAX_REQUESTS);
            const char *m = strstr(line, "\"method\": \""), *t = strstr(line, "\"target\": \"");
            const char *s = strstr(line, "\"start\": "), *e = strstr(line, "\"end\": ");
            T_ASSERT_MSG(m && t && s, "log line: %s", line);
            sscanf(m + 11, "%7[^\"]", g->method[g->n]);
            sscanf(t + 11, "%511[^\"]", g->target[g->n]);
            g->start[g->n] = strtod(s + 9, NULL);
            g->end[g->n] = e ? strtod(e + 7, NULL) : g->start[g->n]; /* a fault's line has no end */
            g->n++;
        }
        free(text);
        if (g->n >= want) return;
        usleep(20 * 1000);
    }
}

/* Requests of `method` whose target contains `part`. */
static size_t count_requests(const request_log *g, const char *method, const char *part) {
    size_t n = 0;
    for (size_t i = 0; i < g->n; i++) n += !strcmp(g->method[i], method) && strstr(g->target[i], part);
    return n;
}

/* A prefix of 4 shards opens with a HEAD of its key, one listing, one GET of
 * the index and per shard one GET of its first 64 KiB (a second one only for
 * a header past them), no HEAD of what the listing sized, the shards'
 * requests in flight together; the format probe of the prefix is a HEAD of
 * its key and the prefix's listing. A shard replaced after the open fails
 * its read as stale. */
static void test_hf_prefix_requests(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("hf-requests");
    const char *names[4][1] = {{"w0"}, {"w1"}, {"w2"}, {"w3"}};
    char shard[4][64];
    char index[1024] = "{\"weight_map\": {";
    for (int i = 0; i < 4; i++) {
        snprintf(shard[i], sizeof shard[i], "model-%05d-of-00004.safetensors", i + 1);
        if (i < 3) {
            save_shard(e, in(dir, shard[i]), names[i], 1, 5000, 40 + (uint64_t)i);
        } else { /* a header longer than the first GET: its rest is read */
            char *big = malloc(100000);
            memset(big, 'm', 99999);
            big[99999] = '\0';
            const ckptio_kv kv = {"pad", big};
            float *data = malloc(5000 * 4);
            t_fill_random(data, 5000 * 4, 43);
            static const int64_t shape[1] = {5000};
            const ckptio_tensor_source src = {"w3", CKPTIO_DTYPE_F32, 1, shape, data, 5000 * 4, CKPTIO_MEM_HOST};
            T_OK(ckptio_safetensors_save(e, in(dir, shard[i]), &src, 1, &kv, 1, 0));
            free(data);
            free(big);
        }
        const size_t at = strlen(index);
        snprintf(index + at, sizeof index - at, "%s\"w%d\": \"%s\"", i ? ", " : "", i, shard[i]);
    }
    strcat(index, "}}");
    put(e, in(dir, "model.safetensors.index.json"), index, strlen(index));
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    const char *const no_rules[] = {NULL};
    request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);

    proxy_start(no_rules);
    ckptio_format fmt;
    T_OK(ckptio_format_detect_engine(e, dir, &fmt));
    T_ASSERT(fmt == CKPTIO_FORMAT_HF_INDEX);
    read_requests(g, 2);
    proxy_stop("pass");
    T_ASSERT_MSG(g->n == 2 && count_requests(g, "GET", "list-type") == 1, "%zu requests, %zu listings", g->n,
                 count_requests(g, "GET", "list-type"));

    proxy_start(no_rules);
    ckptio_model *m;
    T_OK(ckptio_model_open(e, dir, 0, &m));
    read_requests(g, 8);
    for (int i = 0; i < 4; i++) {
        const size_t heads = count_requests(g, "HEAD", shard[i]), gets = count_requests(g, "GET", shard[i]);
        T_ASSERT_MSG(heads == 0 && gets == (i < 3 ? 1u : 2u), "%s: %zu HEADs, %zu GETs", shard[i], heads, gets);
    }
    T_ASSERT_MSG(count_requests(g, "GET", "list-type") == 1, "%zu listings", count_requests(g, "GET", "list-type"));
    T_ASSERT_MSG(count_requests(g, "GET", "index.json") == 1 && count_requests(g, "HEAD", "index.json") == 0,
                 "the index: %zu GETs, %zu HEADs", count_requests(g, "GET", "index.json"),
                 count_requests(g, "HEAD", "index.json"));
    T_ASSERT_MSG(g->n == 8, "%zu requests to open the model", g->n);
    /* Some two shards' requests were in flight at one moment. */
    bool together = false;
    for (size_t i = 0; i < g->n; i++)
        for (size_t j = 0; j < g->n; j++)
            if (strstr(g->target[i], "-of-00004") && strstr(g->target[j], "-of-00004") &&
                strcmp(g->target[i], g->target[j]) && g->start[j] >= g->start[i] && g->start[j] < g->end[i])
                together = true;
    T_ASSERT_MSG(together, "the shards were opened one after another");
    for (int i = 0; i < 4; i++) check_model(m, names[i], 1, 5000, 40 + (uint64_t)i);
    save_shard(e, in(dir, shard[1]), names[1], 1, 5000, 99);
    float *got = malloc(5000 * 4);
    size_t at;
    T_OK(ckptio_model_find(m, "w1", &at));
    const ckptio_slice_target rq = {.index = at, .data = got, .capacity = 5000 * 4, .mem_kind = CKPTIO_MEM_HOST};
    T_ASSERT_MSG(ckptio_model_read(m, &rq, 1) == CKPTIO_E_STALE, "%s", ckptio_last_error_message());
    free(got);
    T_OK(ckptio_model_close(m));
    proxy_stop("pass");

    /* A header GET whose body was cut short and resumed does not stand for
     * the HEAD (its bytes may be two versions): the shard is opened with one. */
    const char *const cut[] = {"GET:model-00002:truncate:100:1", NULL};
    proxy_start(cut);
    T_OK(ckptio_model_open(e, dir, 0, &m));
    read_requests(g, 10);
    T_ASSERT_MSG(count_requests(g, "HEAD", shard[1]) == 1, "%zu HEADs of %s", count_requests(g, "HEAD", shard[1]),
                 shard[1]);
    check_model(m, names[1], 1, 5000, 99);
    T_OK(ckptio_model_close(m));
    proxy_stop("pass");
    free(g);
    ckptio_engine_destroy(e);
}

/* ---- DCP checkpoints ------------------------------------------------------------ */

/* The fixture's checkpoint copied under `dir`. */
static void put_fixture(ckptio_engine *e, const char *dir) {
    for (size_t i = 0; i < NFIXTURE; i++) {
        size_t len = 0;
        void *data = t_read_file(t_data_path("dcp/sharded", fixture_files[i]), &len);
        put(e, in(dir, fixture_files[i]), data, len);
        free(data);
    }
}

/* A small file opened with its first bytes (ckptio_file_open_window): one GET
 * and no HEAD for an object of up to the window, a second GET for the rest of
 * a larger one, the HEAD for an empty one (its GET answers 416); the bytes
 * are the object's; a replaced object read with the pinned ETag is E_STALE.
 * ckptio_dcp_open reads .metadata so: one GET, no HEAD. */
typedef struct listed_etags {
    char names[3][32], etags[3][128];
} listed_etags;

static int note_etag(void *user, const ckptio_object_info *info) {
    listed_etags *l = user;
    for (int i = 0; i < 3; i++)
        if (!strcmp(strrchr(info->key, '/') + 1, l->names[i]))
            snprintf(l->etags[i], sizeof l->etags[i], "%s", info->etag);
    return 0;
}

static void test_open_window_requests(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("open-window");
    static const uint64_t sizes[3] = {0, 10, (1u << 20) + 5};
    unsigned char *data = malloc((1u << 20) + 5), *got = malloc((1u << 20) + 5);
    T_ASSERT(data && got);
    t_fill_random(data, (1u << 20) + 5, 5);
    char names[3][32];
    for (int i = 0; i < 3; i++) {
        snprintf(names[i], sizeof names[i], "small-%d.bin", i);
        put(e, in(dir, names[i]), data, sizes[i]);
    }
    put_fixture(e, dir);
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    const char *const no_rules[] = {NULL};
    request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    static const size_t heads[3] = {1, 0, 0}, gets[3] = {1, 1, 2};
    char versions[3][128];
    for (int i = 0; i < 3; i++) {
        proxy_start(no_rules);
        ckptio_file *f;
        uint64_t n = 99, size = 0;
        memset(got, 0, (1u << 20) + 5);
        T_OK(ckptio_file_open_window(e, in(dir, names[i]), got, 1u << 20, &n, &f));
        T_OK(ckptio_file_size(f, &size));
        T_ASSERT_MSG(size == sizes[i] && n == (size < (1u << 20) ? size : 1u << 20), "%s: size %llu, got %llu",
                     names[i], (unsigned long long)size, (unsigned long long)n);
        if (size > n) {
            const ckptio_extent x = {.file = f, .file_offset = n, .length = size - n, .memory = got + n,
                                     .mem_kind = CKPTIO_MEM_HOST};
            T_OK(ckptio_engine_execute_extents(e, CKPTIO_READ, &x, 1));
        }
        T_ASSERT_MSG(!memcmp(got, data, size), "%s: the bytes differ", names[i]);
        read_requests(g, heads[i] + gets[i]);
        T_ASSERT_MSG(count_requests(g, "HEAD", names[i]) == heads[i] && count_requests(g, "GET", names[i]) == gets[i]
                         && g->n == heads[i] + gets[i], "%s: %zu requests, %zu HEADs, %zu GETs", names[i], g->n,
                     count_requests(g, "HEAD", names[i]), count_requests(g, "GET", names[i]));
        if (i == 2) { /* replaced after the open: its read names the pinned ETag */
            data[0] ^= 1;
            put(e, in(dir, names[i]), data, sizes[i]);
            const ckptio_extent x = {.file = f, .file_offset = 0, .length = 100, .memory = got,
                                     .mem_kind = CKPTIO_MEM_HOST};
            T_ASSERT_MSG(ckptio_engine_execute_extents(e, CKPTIO_READ, &x, 1) == CKPTIO_E_STALE, "%s",
                         ckptio_last_error_message());
        }
        snprintf(versions[i], sizeof versions[i], "%s", ckptio_file_version(f));
        T_OK(ckptio_file_close(f));
        proxy_stop("pass");
    }
    /* ckptio_file_version: the ETag the reads named, the listing's on this
     * server; the replaced object's is the version it was opened at. */
    listed_etags l = {{{0}}, {{0}}};
    memcpy(l.names, names, sizeof l.names);
    T_OK(ckptio_object_list(e, in(dir, ""), "/", note_etag, &l));
    for (int i = 0; i < 3; i++)
        T_ASSERT_MSG(versions[i][0] == '"' && (i == 2) == (strcmp(versions[i], l.etags[i]) != 0),
                     "%s: opened at %s, listed %s", names[i], versions[i], l.etags[i]);
    proxy_start(no_rules);
    ckptio_dcp *h;
    T_OK(ckptio_dcp_open(e, dir, &h));
    read_requests(g, 2);
    T_ASSERT_MSG(count_requests(g, "GET", "/.metadata") == 1 && count_requests(g, "HEAD", "/.metadata") == 0,
                 ".metadata: %zu GETs, %zu HEADs", count_requests(g, "GET", "/.metadata"),
                 count_requests(g, "HEAD", "/.metadata"));
    T_OK(ckptio_dcp_close(h));
    proxy_stop("pass");
    free(g);
    free(data);
    free(got);
    ckptio_engine_destroy(e);
}

/* ckptio_dcp_open of a prefix lists it beside the .metadata GET: its data
 * objects open with the listed sizes and ETags, no HEAD, and one replaced
 * after the listing fails its read E_STALE. Where the listing gives other
 * ETags than the GETs (the proxy's etags action) each data object opens
 * with its HEAD and the checkpoint reads whole. */
static void test_dcp_open_lists_the_prefix(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-listed");
    put_fixture(e, dir);
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    const char *const no_rules[] = {NULL}, *const other_etags[] = {"GET:list-type=2:etags:100", NULL};
    ckptio_dcp *h;
    ckptio_dcp_verify_report r;
    for (size_t lying = 0; lying < 2; lying++) {
        proxy_start(lying ? other_etags : no_rules);
        T_OK(ckptio_dcp_open(e, dir, &h));
        T_OK(ckptio_dcp_verify(h, &r));
        T_ASSERT(r.items > 0 && r.unhashed == 0);
        T_OK(ckptio_dcp_close(h));
        read_requests(g, 4);
        T_ASSERT_MSG(count_requests(g, "GET", "list-type=2") == 1 && count_requests(g, "HEAD", ".distcp") == 2 * lying,
                     "%s listing: %zu listings, %zu HEADs of data objects", lying ? "a lying" : "an honest",
                     count_requests(g, "GET", "list-type=2"), count_requests(g, "HEAD", ".distcp"));
        proxy_stop(lying ? "etags" : "pass");
    }
    T_OK(ckptio_dcp_open(e, dir, &h));
    size_t len = 0;
    unsigned char *data = t_read_file(t_data_path("dcp/sharded", DATA0), &len);
    data[len - 10] ^= 1;
    put(e, in(dir, DATA0), data, len);
    free(data);
    T_ASSERT(ckptio_dcp_verify(h, &r) == CKPTIO_E_STALE);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), DATA0), "%s", ckptio_last_error_message());
    T_OK(ckptio_dcp_close(h));
    free(g);
    ckptio_engine_destroy(e);
}

static void test_dcp_reader(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-read");
    put_fixture(e, dir);
    ckptio_dcp *h;
    T_OK(ckptio_dcp_open(e, dir, &h));
    const char *manifest = NULL;
    T_OK(ckptio_dcp_manifest(h, &manifest));
    ckptio_dcp_verify_report r;
    T_OK(ckptio_dcp_verify(h, &r));
    T_ASSERT(r.items > 0 && r.unhashed == 0);
    T_OK(ckptio_dcp_close(h));
    /* A flipped byte in a data object: verify names the item. */
    size_t len = 0;
    unsigned char *data = t_read_file(t_data_path("dcp/sharded", DATA0), &len);
    data[len - 10] ^= 1;
    put(e, in(dir, DATA0), data, len);
    free(data);
    T_OK(ckptio_dcp_open(e, dir, &h));
    T_ASSERT(ckptio_dcp_verify(h, &r) == CKPTIO_E_CHECKSUM);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), DATA0), "%s", ckptio_last_error_message());
    T_OK(ckptio_dcp_close(h));
    /* The manifest gone: the reader says there is none. */
    T_OK(ckptio_object_delete(e, in(dir, fixture_files[1])));
    T_OK(ckptio_dcp_open(e, dir, &h));
    T_ASSERT(ckptio_dcp_manifest(h, &manifest) == CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_dcp_close(h));
    ckptio_engine_destroy(e);
}

static void test_dcp_commit_steps(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-commit");
    /* Small files: one PUT each, no temporary, no attributes. */
    T_OK(ckptio__dcp_write_file(dir, ".metadata", "old", 3, NULL, CKPTIO_DCP_SYNC));
    T_ASSERT(exists(e, in(dir, ".metadata")));
    unsigned mode = 0;
    T_ASSERT(ckptio_dcp_reference(dir, ".metadata", &mode) == CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_dcp_create_file(dir, "__0_000000000001_0.distcp", ".metadata"));
    T_ASSERT(!exists(e, in(dir, "__0_000000000001_0.distcp")));
    int fd = -1;
    char tmp[512];
    T_ASSERT(ckptio_temporary_create(dir, "x", NULL, &fd, tmp, sizeof tmp) == CKPTIO_E_UNSUPPORTED);
    /* Stale files: an older save's data objects that no metadata references are listed and removed; what
     * the current .metadata references stays; names no DCP writer gives are never touched. */
    put_fixture(e, dir);
    put(e, in(dir, "__0_0123456789ab_0.distcp"), "old data", 8);
    put(e, in(dir, ".ckptio-manifest-0123456789ab.json"), "{}", 2);
    put(e, in(dir, "notes.txt"), "mine", 4);
    char **names = NULL;
    size_t n = 0;
    char note[512];
    const char *keep[] = {".metadata", ".ckptio-manifest-80b4e47c5ac9.json"};
    T_OK(ckptio_dcp_stale_files(dir, keep, 2, NULL, &names, &n, note, sizeof note));
    T_ASSERT_MSG(n == 2 && !strcmp(names[0], ".ckptio-manifest-0123456789ab.json") &&
                     !strcmp(names[1], "__0_0123456789ab_0.distcp"),
                 "%zu stale: %s %s %s", n, n ? names[0] : "", n > 1 ? names[1] : "", n > 2 ? names[2] : "");
    size_t removed = 0;
    T_OK(ckptio_dcp_remove_files(dir, (const char *const *)names, n, CKPTIO_DCP_SYNC | CKPTIO_DCP_RECHECK, NULL,
                                 &removed, note, sizeof note));
    T_ASSERT(removed == 2);
    ckptio_dcp_names_free(names, n);
    T_ASSERT(!exists(e, in(dir, "__0_0123456789ab_0.distcp")) && exists(e, in(dir, DATA0)) &&
             exists(e, in(dir, "notes.txt")));
    ckptio_dcp *h;
    T_OK(ckptio_dcp_open(e, dir, &h));
    T_OK(ckptio_dcp_verify(h, NULL));
    T_OK(ckptio_dcp_close(h));
    ckptio_engine_destroy(e);
}

/* Two savers of one prefix: the second is kept out while the first's
 * lease lives; a lease whose holder stopped renewing lapses and is taken
 * over, and the first's check then fails; the cleanup under the new lease
 * leaves the objects written after it alone. */
static void test_dcp_lease(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-lease");
    ckptio_dcp_lock *a = NULL, *b = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &a));
    ckptio_dcp_lock_info info;
    T_OK(ckptio_dcp_lock_query(a, &info));
    T_ASSERT(info.locked == 1);
    T_ASSERT(exists(e, in(dir, CKPTIO_DCP_LOCK_NAME)));
    T_OK(ckptio_dcp_lock_check(a));
    const double t0 = ckptio__now();
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.5, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_ASSERT(ckptio__now() - t0 >= 0.4);
    const char *msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "another save holds the directory") && strstr(msg, "wrote nothing"), "%s", msg);
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_release(a));
    T_ASSERT(!exists(e, in(dir, CKPTIO_DCP_LOCK_NAME)));
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &b));
    T_OK(ckptio_dcp_lock_release(b));

    /* A holder that stops renewing: a lease of 2 s written by hand, as a killed saver leaves it. */
    char text[256];
    ckptio__lease_text dead = {.owner = "0123456789abcdef0123456789abcdef", .since = 1, .ttl_ms = 2000};
    const size_t len = ckptio__lease_format(&dead, text, sizeof text);
    put(e, in(dir, CKPTIO_DCP_LOCK_NAME), text, len);
    put(e, in(dir, "__0_aaaaaaaaaaaa_0.distcp"), "older", 5);
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 10, NULL, NULL, &b)); /* waits until it lapses */
    T_OK(ckptio_dcp_lock_check(b));
    /* Objects written after b's lease was taken belong to b's save: a cleanup keeps them. */
    put(e, in(dir, "__0_bbbbbbbbbbbb_0.distcp"), "newer", 5);
    char **names = NULL;
    size_t n = 0;
    char note[256];
    T_OK(ckptio_dcp_stale_files(dir, NULL, 0, NULL, &names, &n, note, sizeof note));
    T_ASSERT_MSG(n == 1 && !strcmp(names[0], "__0_aaaaaaaaaaaa_0.distcp"), "%zu stale", n);
    ckptio_dcp_names_free(names, n);
    /* Someone overwrites b's lease: b's check fails, and its release leaves the other's lease. */
    put(e, in(dir, CKPTIO_DCP_LOCK_NAME), text, len);
    T_ASSERT(ckptio_dcp_lock_check(b) == CKPTIO_E_BUSY);
    msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "no longer this save's") && strstr(msg, "commits nothing more"), "%s", msg);
    T_OK(ckptio_dcp_lock_release(b));
    T_ASSERT(exists(e, in(dir, CKPTIO_DCP_LOCK_NAME)));
    s3_no_secret_in_message();
    ckptio_engine_destroy(e);
}

/* A lease read back by its first check (CKPTIO_DCP_LOCK_CONFIRM_LATER): the
 * check waits out the settling time and is the read-back; a write of another
 * saver that came after this one's (the race on a server without conditional
 * writes) fails the check, and the release leaves the other's lease. */
static void test_dcp_lease_confirmed_later(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-lease-later");
    ckptio_dcp_lock *a = NULL, *b = NULL;
    const double before = ckptio__now(); /* the lease's write comes after this */
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &a));
    T_ASSERT(exists(e, in(dir, CKPTIO_DCP_LOCK_NAME)));
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_check(a));
    T_ASSERT(ckptio__now() - before >= 0.099); /* not read back before its write could settle */
    T_OK(ckptio_dcp_lock_check(a));
    T_OK(ckptio_dcp_lock_release(a));
    T_ASSERT(!exists(e, in(dir, CKPTIO_DCP_LOCK_NAME)));

    /* Another saver's write lands right after this one's: this one's first check finds it. */
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &a));
    char text[256];
    ckptio__lease_text other = {.owner = "fedcba9876543210fedcba9876543210", .since = 1, .ttl_ms = 60000};
    const size_t len = ckptio__lease_format(&other, text, sizeof text);
    put(e, in(dir, CKPTIO_DCP_LOCK_NAME), text, len);
    T_ASSERT(ckptio_dcp_lock_check(a) == CKPTIO_E_BUSY);
    const char *msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "no longer this save's") && strstr(msg, "owner fedcba987654") &&
                     strstr(msg, "commits nothing more"),
                 "%s", msg);
    T_ASSERT(ckptio_dcp_lock_check(a) == CKPTIO_E_BUSY); /* lost stays lost */
    T_OK(ckptio_dcp_lock_release(a));
    void *back = NULL;
    size_t back_len = 0;
    T_OK(ckptio__object_read_all(e, in(dir, CKPTIO_DCP_LOCK_NAME), 4096, &back, &back_len));
    T_ASSERT(back_len == len && !memcmp(back, text, len)); /* the other's lease, untouched */
    ckptio__free(back);
    s3_no_secret_in_message();
    ckptio_engine_destroy(e);
}

/* The commit's step callback of test_dcp_commit_cleanup: the lease checked before .metadata. */
static int check_before_metadata(void *user, ckptio_dcp_commit_step step, const char *path, int done) {
    (void)path;
    if (step == CKPTIO_DCP_STEP_METADATA && !done) return ckptio_dcp_lock_check(user) != CKPTIO_OK;
    return 0;
}

/* A new save's data object and its commit with the cleanup, the lease checked before .metadata. */
#define NEW_OBJECT "__0_bbbbbbbbbbbb_0.distcp"
static void commit_new_save(ckptio_engine *e, const char *dir, ckptio_dcp_lock *lock, ckptio_dcp_commit_result *r) {
    put(e, in(dir, NEW_OBJECT), "new", 3);
    static const char *const files[] = {NEW_OBJECT};
    ckptio_dcp_commit_options o = {.metadata_name = ".metadata", .metadata = "new metadata", .metadata_len = 12,
                                   .files = files, .nfiles = 1, .flags = CKPTIO_DCP_CLEANUP,
                                   .on_step = check_before_metadata, .user = lock};
    T_OK(ckptio_dcp_commit(dir, &o, r));
}

/* ckptio_dcp_commit in object storage over an older save: the listing and
 * the abort of a killed save's upload run beside the .metadata PUT, the
 * metadata object is read after it (the new one, so the older save's
 * objects go, all of them, deleted together), the new save's objects stay. */
static void test_dcp_commit_cleanup(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-commit-run");
    char name[64];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "__0_0123456789ab_%d.distcp", i);
        put(e, in(dir, name), "old", 3);
    }
    put(e, in(dir, ".ckptio-manifest-0123456789ab.json"), "{}", 2);
    put(e, in(dir, ".metadata"), "not a pickle", 12); /* read after the commit, it would keep everything */
    ckptio_file *f;
    T_OK(ckptio_file_open(e, in(dir, "__0_cccccccccccc_0.distcp"), CKPTIO_OPEN_WRITE, &f));
    void *big = calloc(1, 12 << 20);
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, big, 12 << 20, 0)); /* a killed save's parts, never completed */
    free(big);
    struct timespec older = {2, 100000000}; /* older than the lease by the server's whole seconds */
    nanosleep(&older, NULL);
    ckptio_dcp_lock *lock = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &lock));
    ckptio_dcp_commit_result r;
    commit_new_save(e, dir, lock, &r);
    T_ASSERT_MSG(r.committed && r.removed == 7, "removed %zu: %s", r.removed, r.note);
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "__0_0123456789ab_%d.distcp", i);
        T_ASSERT(!exists(e, in(dir, name)));
    }
    T_ASSERT(!exists(e, in(dir, ".ckptio-manifest-0123456789ab.json")) && exists(e, in(dir, NEW_OBJECT)));
    uint64_t aborted = 99;
    T_OK(ckptio_object_abort_uploads(e, in(dir, ""), 0, &aborted));
    T_ASSERT_MSG(aborted == 0, "%llu unfinished uploads were left", (unsigned long long)aborted);
    ckptio_file_close(f); /* its abort finds the upload gone: no error */
    T_OK(ckptio_dcp_lock_release(lock));
    T_ASSERT(!exists(e, in(dir, CKPTIO_DCP_LOCK_NAME)));
    ckptio_engine_destroy(e);
}

/* The shared saves' marks under `dir`. */
static int count_mark(void *user, const ckptio__object_entry *e) {
    if (!strncmp(e->name, CKPTIO__DCP_SHARED_PREFIX, sizeof CKPTIO__DCP_SHARED_PREFIX - 1)) ++*(int *)user;
    return 0;
}
static int marks_under(ckptio_engine *e, const char *dir) {
    int n = 0;
    T_OK(ckptio__object_dir_list(e, dir, count_mark, &n));
    return n;
}

/* A save without collectives (the lock taken shared) in progress while a
 * save with a cleanup takes the lease and commits: the shared save's mark
 * keeps its data objects and its unfinished upload (begun before the lease)
 * from that cleanup, which still removes the older save's objects and a
 * mark that lapsed; the mark goes with the shared save's release. */
static void test_dcp_shared_save_beside_a_cleanup(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-shared");
    put(e, in(dir, "__0_0123456789ab_0.distcp"), "old", 3);
    put(e, in(dir, ".metadata"), "not a pickle", 12); /* replaced below, before the cleanup reads it */
    char text[256];
    ckptio__lease_text dead = {.owner = "0123456789abcdef0123456789abcdef", .since = 1, .ttl_ms = 1000};
    const size_t len = ckptio__lease_format(&dead, text, sizeof text);
    put(e, in(dir, CKPTIO__DCP_SHARED_PREFIX "0123456789abcdef0123456789abcdef"), text, len); /* a killed one's */
    struct timespec older = {2, 100000000}; /* older by the server's whole seconds (listings round up) */
    nanosleep(&older, NULL);
    ckptio_dcp_lock *shared = NULL, *lock = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &shared));
    T_ASSERT_MSG(marks_under(e, dir) == 2, "%d marks", marks_under(e, dir));
    put(e, in(dir, "__0_dddddddddddd_0.distcp"), "shared", 6);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, in(dir, "__0_dddddddddddd_1.distcp"), CKPTIO_OPEN_WRITE, &f));
    const size_t big_len = 12 << 20;
    unsigned char *big = malloc(big_len);
    for (size_t i = 0; i < big_len; i++) big[i] = (unsigned char)(i * 31 + 7);
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, big, big_len, 0)); /* its parts are sent; the upload is open */
    nanosleep(&older, NULL);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &lock));
    ckptio_dcp_commit_result r;
    commit_new_save(e, dir, lock, &r);
    T_ASSERT_MSG(r.committed && r.removed == 2, "removed %zu: %s", r.removed, r.note);
    T_ASSERT(!exists(e, in(dir, "__0_0123456789ab_0.distcp")) && exists(e, in(dir, NEW_OBJECT)));
    T_ASSERT(exists(e, in(dir, "__0_dddddddddddd_0.distcp")));
    T_ASSERT_MSG(marks_under(e, dir) == 1, "%d marks", marks_under(e, dir)); /* the lapsed one went */
    T_OK(ckptio_dcp_lock_release(lock));
    T_OK(ckptio_dcp_lock_check(shared));
    T_OK(ckptio_file_commit(f)); /* its upload was not aborted */
    T_OK(ckptio_file_close(f));
    void *back = NULL;
    size_t back_len = 0;
    T_OK(ckptio__object_read_all(e, in(dir, "__0_dddddddddddd_1.distcp"), big_len, &back, &back_len));
    T_ASSERT(back_len == big_len && !memcmp(back, big, big_len));
    ckptio__free(back);
    free(big);
    T_OK(ckptio_dcp_lock_release(shared));
    T_ASSERT(marks_under(e, dir) == 0);
    ckptio_engine_destroy(e);
}

/* A lease that another save took over and released (the object is gone)
 * is lost: its renewal never writes it again and the check fails. */
static void test_dcp_lease_gone_is_lost(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-lease-gone");
    setenv("CKPTIO_S3_LEASE_MS", "1200", 1); /* renewed every 0.4 s */
    ckptio_dcp_lock *a = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &a));
    unsetenv("CKPTIO_S3_LEASE_MS");
    T_OK(ckptio_object_delete(e, in(dir, CKPTIO_DCP_LOCK_NAME)));
    struct timespec renewals = {1, 0};
    nanosleep(&renewals, NULL);
    T_ASSERT(!exists(e, in(dir, CKPTIO_DCP_LOCK_NAME))); /* not written again */
    T_ASSERT(ckptio_dcp_lock_check(a) == CKPTIO_E_BUSY);
    T_MESSAGE_HAS("commits nothing more");
    T_OK(ckptio_dcp_lock_release(a));
    ckptio_engine_destroy(e);
}

/* ---- a checkpoint manager's root ----------------------------------------------------- */

static const char *state_of(const char *root, uint64_t step) {
    ckptio_step_info info;
    T_OK(ckptio_steps_check(NULL, root, step, CKPTIO_STEP_CHECK_MARKER, &info));
    return info.state == CKPTIO_STEP_COMPLETE  ? "complete"
           : info.state == CKPTIO_STEP_PARTIAL ? "partial"
           : info.state == CKPTIO_STEP_FOREIGN ? "foreign"
                                               : "damaged";
}

/* A step saved as the manager saves it: begin, the DCP files, commit. */
static void save_step(ckptio_engine *e, const char *root, uint64_t step) {
    char dir[2048];
    T_OK(ckptio_steps_begin(root, step, dir, sizeof dir));
    T_ASSERT(exists(e, in(dir, CKPTIO_STEP_BEGUN)));
    put_fixture(e, dir);
    T_ASSERT(!strcmp(state_of(root, step), "partial"));
    T_OK(ckptio_steps_commit(root, step));
}

static void test_steps(void) {
    ckptio_engine *e = s3_test_engine();
    const char *root = s3_url("run");
    for (uint64_t s = 100; s <= 400; s += 100) save_step(e, root, s);
    ckptio_step_info *steps = NULL;
    size_t n = 0;
    T_OK(ckptio_steps_scan(root, &steps, &n));
    T_ASSERT(n == 4 && steps[0].step == 100 && steps[3].step == 400);
    for (size_t i = 0; i < n; i++) T_ASSERT_MSG(steps[i].state == CKPTIO_STEP_COMPLETE, "%s", steps[i].reason);
    T_ASSERT(steps[0].files == NFIXTURE + 2);
    ckptio_steps_free(steps);
    /* A step is never begun twice. */
    char dir[2048];
    T_ASSERT(ckptio_steps_begin(root, 200, dir, sizeof dir) == CKPTIO_E_EXISTS);
    /* Damage in the newest step: FULL skips it with the reason, latest is the one before. */
    size_t len = 0;
    unsigned char *data = t_read_file(t_data_path("dcp/sharded", DATA0), &len);
    data[len - 10] ^= 0x40;
    put(e, in(step_file(root, 400, ""), DATA0), data, len);
    free(data);
    uint64_t latest = 0;
    ckptio_step_info *skipped = NULL;
    size_t nskipped = 0;
    T_OK(ckptio_steps_latest(e, root, CKPTIO_STEP_CHECK_FULL, &latest, &skipped, &nskipped));
    T_ASSERT_MSG(latest == 300 && nskipped == 1 && skipped[0].state == CKPTIO_STEP_DAMAGED, "latest %llu",
                 (unsigned long long)latest);
    T_ASSERT_MSG(strstr(skipped[0].reason, DATA0), "%s", skipped[0].reason);
    ckptio_steps_free(skipped);
    /* A partial step (a save killed after its begun mark) is cleaned; its unfinished upload aborted. */
    T_OK(ckptio_steps_begin(root, 500, dir, sizeof dir));
    ckptio_file *f;
    T_OK(ckptio_file_open(e, in(dir, "__0_cccccccccccc_0.distcp"), CKPTIO_OPEN_WRITE, &f));
    void *big = calloc(1, 12 << 20);
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, big, 12 << 20, 0)); /* parts sent, never completed */
    uint64_t parts_peak, parts_bound;
    ckptio__object_buffers(f, &parts_peak, &parts_bound);
    free(big);
    T_ASSERT(!strcmp(state_of(root, 500), "partial"));
    uint64_t *removed = NULL;
    size_t nremoved = 0;
    T_OK(ckptio_steps_clean(root, &removed, &nremoved));
    T_ASSERT(nremoved == 1 && removed[0] == 500);
    ckptio_steps_list_free(removed);
    ckptio_file_close(f); /* its abort finds the upload gone: no error */
    ckptio_step_info info;
    T_ASSERT(ckptio_steps_check(NULL, root, 500, CKPTIO_STEP_CHECK_MARKER, &info) == CKPTIO_E_NOT_FOUND);
    /* A foreign step (no marker, no begun mark) and a step holding an alien object are left whole. */
    put_fixture(e, step_file(root, 600, ""));
    T_ASSERT(!strcmp(state_of(root, 600), "foreign"));
    put(e, in(step_file(root, 100, ""), "notes.txt"), "mine", 4);
    T_ASSERT(ckptio_steps_remove(root, 600) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT(ckptio_steps_remove(root, 100) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "notes.txt"), "%s", ckptio_last_error_message());
    T_ASSERT(exists(e, in(step_file(root, 100, ""), CKPTIO_STEP_MARKER)));
    /* A pinned step is kept by retention; unpinned it goes, marker first (nothing of it left). */
    ckptio_step_pin *pin = NULL;
    T_OK(ckptio_steps_pin(root, 200, &pin));
    T_ASSERT(ckptio_steps_remove(root, 200) == CKPTIO_E_BUSY);
    T_OK(ckptio_steps_retain(e, root, 1, 0, &removed, &nremoved));
    /* keep_last 1 keeps 400 (it passes the FAST check: sizes, not bytes); 100 holds an alien, 200 is pinned */
    T_ASSERT_MSG(nremoved == 1 && removed[0] == 300, "%zu removed", nremoved);
    ckptio_steps_list_free(removed);
    ckptio_steps_unpin(pin);
    T_OK(ckptio_steps_retain(e, root, 1, 0, &removed, &nremoved));
    T_ASSERT(nremoved == 1 && removed[0] == 200);
    ckptio_steps_list_free(removed);
    T_ASSERT(ckptio_steps_check(NULL, root, 200, CKPTIO_STEP_CHECK_MARKER, &info) == CKPTIO_E_NOT_FOUND);
    /* A missing marker's step cannot be pinned. */
    T_ASSERT(ckptio_steps_pin(root, 200, &pin) == CKPTIO_E_NOT_FOUND);
    /* The root's lease keeps a second manager out. */
    ckptio_dcp_lock *a = NULL, *b = NULL;
    T_OK(ckptio_dcp_lock_acquire(root, NULL, CKPTIO_DCP_LOCK_QUEUED, 0, NULL, NULL, &a));
    T_ASSERT(ckptio_dcp_lock_acquire(root, NULL, CKPTIO_DCP_LOCK_QUEUED, 0, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_release(a));
    /* The lease object is no step and no alien of the root: 100, 400 and the foreign 600 are left. */
    T_OK(ckptio_steps_scan(root, &steps, &n));
    T_ASSERT(n == 3 && steps[0].step == 100 && steps[1].step == 400 && steps[2].step == 600);
    ckptio_steps_free(steps);
    ckptio_engine_destroy(e);
}

/* ---- hostile listings ------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) { t_write_file(path, text, strlen(text)); }

static void test_hostile_listings(void) {
    ckptio_engine *e = s3_test_engine();
    const char *root = s3_url("hostile");
    const char *key = s3_key_of(root);
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    /* A listing naming a key outside the prefix asked for: the listing fails, naming that key. */
    char doc[4096], rule[1400];
    const char *file = t_path("outside.xml");
    snprintf(doc, sizeof doc,
             "<?xml version=\"1.0\"?><ListBucketResult><Name>%s</Name><Prefix>%s/</Prefix><KeyCount>1</KeyCount>"
             "<IsTruncated>false</IsTruncated><CommonPrefixes><Prefix>etc/step_00000001/</Prefix></CommonPrefixes>"
             "<Contents><Key>etc/passwd</Key><Size>5</Size><ETag>\"x\"</ETag>"
             "<LastModified>2024-01-01T00:00:00.000Z</LastModified></Contents></ListBucketResult>",
             s3_test_bucket(), key);
    write_text(file, doc);
    snprintf(rule, sizeof rule, "GET:list-type:answer:%s:100", file);
    const char *rules[] = {rule, NULL};
    proxy_start(rules);
    ckptio_step_info *steps = NULL;
    size_t n = 0;
    T_ASSERT(ckptio_steps_scan(root, &steps, &n) == CKPTIO_E_FORMAT);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "s3://ckptio-test/etc/") &&
                     strstr(ckptio_last_error_message(), "not under the prefix"),
                 "%s", ckptio_last_error_message());
    ckptio_model *m = NULL;
    T_ASSERT(ckptio_model_open(e, root, 0, &m) != CKPTIO_OK);
    char **names = NULL;
    char note[64];
    T_ASSERT(ckptio_dcp_stale_files(root, NULL, 0, NULL, &names, &n, note, sizeof note) == CKPTIO_E_FORMAT);
    proxy_stop("answer");
    /* Names no file can have under the prefix ('..', control bytes, a subdirectory): never shards, never
     * removed, and a step holding one is left whole. */
    const char *step = step_file(root, 7, "");
    put_fixture(e, step);
    put(e, in(step, CKPTIO_STEP_BEGUN), "", 0);
    char odd[64];
    snprintf(odd, sizeof odd, "a\x01%s", "b.distcp");
    put(e, in(step, odd), "x", 1);
    T_ASSERT(ckptio_steps_remove(root, 7) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "control bytes"), "%s", ckptio_last_error_message());
    T_ASSERT(exists(e, in(step, ".metadata")));
    T_OK(ckptio_object_delete(e, in(step, odd)));
    put(e, in(step, "sub/__0_0123456789ab_0.distcp"), "x", 1);
    T_ASSERT(ckptio_steps_remove(root, 7) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "'sub'"), "%s", ckptio_last_error_message());
    /* Keys that are '..' and '.' under a model prefix are not shards and never opened. */
    const char *hf = s3_url("hf-dots");
    const char *names1[] = {"w"};
    save_shard(e, in(hf, "w.safetensors"), names1, 1, 10, 3);
    put(e, in(hf, "../escape.safetensors"), "x", 1);
    T_OK(ckptio_model_open(e, hf, 0, &m)); /* the one plain name is the model */
    size_t shards = 0;
    T_OK(ckptio_model_shard_count(m, &shards));
    T_ASSERT(shards == 1);
    T_OK(ckptio_model_close(m));
    ckptio_engine_destroy(e);
}

int main(void) {
    s3_test_bucket();
    T_RUN(test_format_probe);
    T_RUN(test_hf_prefix);
    T_RUN(test_hf_prefix_requests);
    T_RUN(test_open_window_requests);
    T_RUN(test_dcp_reader);
    T_RUN(test_dcp_open_lists_the_prefix);
    T_RUN(test_dcp_commit_steps);
    T_RUN(test_dcp_lease);
    T_RUN(test_dcp_lease_confirmed_later);
    T_RUN(test_dcp_commit_cleanup);
    T_RUN(test_dcp_shared_save_beside_a_cleanup);
    T_RUN(test_dcp_lease_gone_is_lost);
    T_RUN(test_steps);
    T_RUN(test_hostile_listings);
    return T_EXIT_PASS;
}
