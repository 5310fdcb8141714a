/*
 * test_objstore_dirs.c - directories in object storage (s3://BUCKET/PREFIX/)
 * against a real S3 server (skipped, exit 77, without one): the format
 * probe of objects and prefixes; a Hugging Face model under a prefix (its
 * index and shards, or a single model.safetensors) and the requests its
 * open makes; a small file opened with its first bytes; a checkpoint
 * manager's root (begin, commit, scan, the FULL check, latest, readers'
 * pins, removal order, clean, retention, aliens left whole); listings that
 * name keys outside the prefix or names no file can have, through the
 * fault proxy. DCP checkpoints under a prefix: test_objstore_dcp.c.
 */
#include "dcp_commit_internal.h"
#include "objstore_helpers.h"
#include "steps_fixture.h"
#include "steps_internal.h"

#include <errno.h>
#include <sys/stat.h>
#include <time.h>

/* The fixture's checkpoint copied under `dir`. */
static void put_fixture(ckptio_engine *e, const char *dir) {
    s3_put_files(e, dir, "dcp/sharded", fixture_files, NFIXTURE);
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
    save_shard(e, s3_in(dir, "plain/a.safetensors"), names, 1, 1000, 1);
    ckptio_format f;
    T_OK(ckptio_format_detect(s3_in(dir, "plain/a.safetensors"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_SAFETENSORS);
    T_OK(ckptio_format_detect(s3_in(dir, "plain"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_DIRECTORY);
    T_OK(ckptio_format_detect(s3_in(dir, "plain/"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_DIRECTORY);
    s3_put_bytes(e, s3_in(dir, "dcp/.metadata"), "x", 1);
    T_OK(ckptio_format_detect(s3_in(dir, "dcp"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_DCP);
    s3_put_bytes(e, s3_in(dir, "hf/model.safetensors.index.json"), "{}", 2);
    T_OK(ckptio_format_detect(s3_in(dir, "hf/"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_HF_INDEX);
    s3_put_bytes(e, s3_in(dir, "junk.bin"), "not a checkpoint at all", 23);
    T_OK(ckptio_format_detect(s3_in(dir, "junk.bin"), &f));
    T_ASSERT(f == CKPTIO_FORMAT_UNKNOWN);
    /* Nothing there: not found, naming the URL; a missing bucket too. */
    T_ASSERT(ckptio_format_detect(s3_in(dir, "nothing"), &f) == CKPTIO_E_NOT_FOUND);
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
    save_shard(e, s3_in(dir, "model-00001-of-00002.safetensors"), a, 2, 300000, 10);
    save_shard(e, s3_in(dir, "model-00002-of-00002.safetensors"), b, 1, 300000, 20);
    const char *index = "{\"metadata\": {\"total_size\": 3600000}, \"weight_map\": {"
                        "\"layer.0.w\": \"model-00001-of-00002.safetensors\", "
                        "\"layer.0.b\": \"model-00001-of-00002.safetensors\", "
                        "\"layer.1.w\": \"model-00002-of-00002.safetensors\"}}";
    s3_put_bytes(e, s3_in(dir, "model.safetensors.index.json"), index, strlen(index));
    ckptio_model *m;
    for (int form = 0; form < 3; form++) { /* the prefix, with a '/', the index itself */
        const char *path = form == 0 ? dir : form == 1 ? s3_in(dir, "") : s3_in(dir, "model.safetensors.index.json");
        T_OK(ckptio_model_open(e, path, 0, &m));
        size_t shards = 0;
        T_OK(ckptio_model_shard_count(m, &shards));
        T_ASSERT(shards == 2);
        const char *first = NULL;
        T_OK(ckptio_model_shard(m, 0, &first, NULL));
        T_ASSERT_MSG(!strcmp(first, s3_in(dir, "model-00001-of-00002.safetensors")), "%s", first);
        size_t total = 0;
        T_OK(ckptio_model_count(m, &total));
        T_ASSERT_MSG(total == 3, "%zu tensors", total);
        check_model(m, a, 2, 300000, 10);
        check_model(m, b, 1, 300000, 20);
        T_OK(ckptio_model_close(m));
    }
    /* A shard missing: the error names the index, the tensor and the shard. */
    T_OK(ckptio_object_delete(e, s3_in(dir, "model-00002-of-00002.safetensors")));
    T_ASSERT(ckptio_model_open(e, dir, 0, &m) == CKPTIO_E_NOT_FOUND);
    const char *msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "layer.1.w") && strstr(msg, "model-00002-of-00002.safetensors"), "%s", msg);
    s3_no_secret_in_message();
    /* A single model.safetensors under the prefix wins (transformers' order). */
    const char *one[] = {"x"};
    save_shard(e, s3_in(dir, "model.safetensors"), one, 1, 1000, 30);
    T_OK(ckptio_model_open(e, dir, 0, &m));
    check_model(m, one, 1, 1000, 30);
    T_OK(ckptio_model_close(m));
    /* An index naming a shard outside the prefix is refused before anything is opened. */
    const char *hostile_dir = s3_url("hf-hostile");
    const char *hostile = "{\"weight_map\": {\"x\": \"../hf/model.safetensors\"}}";
    s3_put_bytes(e, s3_in(hostile_dir, "model.safetensors.index.json"), hostile, strlen(hostile));
    T_ASSERT(ckptio_model_open(e, hostile_dir, 0, &m) == CKPTIO_E_DISALLOWED);
    ckptio_engine_destroy(e);
}

/* ---- requests of a model's open, as the server sees them ------------------------ */

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
            save_shard(e, s3_in(dir, shard[i]), names[i], 1, 5000, 40 + (uint64_t)i);
        } else { /* a header longer than the first GET: its rest is read */
            char *big = malloc(100000);
            memset(big, 'm', 99999);
            big[99999] = '\0';
            const ckptio_kv kv = {"pad", big};
            float *data = malloc(5000 * 4);
            t_fill_random(data, 5000 * 4, 43);
            static const int64_t shape[1] = {5000};
            const ckptio_tensor_source src = {"w3", CKPTIO_DTYPE_F32, 1, shape, data, 5000 * 4, CKPTIO_MEM_HOST};
            T_OK(ckptio_safetensors_save(e, s3_in(dir, shard[i]), &src, 1, &kv, 1, 0));
            free(data);
            free(big);
        }
        const size_t at = strlen(index);
        snprintf(index + at, sizeof index - at, "%s\"w%d\": \"%s\"", i ? ", " : "", i, shard[i]);
    }
    strcat(index, "}}");
    s3_put_bytes(e, s3_in(dir, "model.safetensors.index.json"), index, strlen(index));
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    const char *const no_rules[] = {NULL};
    s3_request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);

    proxy_start(no_rules);
    ckptio_format fmt;
    T_OK(ckptio_format_detect_engine(e, dir, &fmt));
    T_ASSERT(fmt == CKPTIO_FORMAT_HF_INDEX);
    s3_read_requests(g);
    proxy_stop("pass");
    T_ASSERT_MSG(g->n == 2 && s3_count_requests(g, "GET", "list-type") == 1, "%zu requests, %zu listings", g->n,
                 s3_count_requests(g, "GET", "list-type"));

    proxy_start(no_rules);
    ckptio_model *m;
    T_OK(ckptio_model_open(e, dir, 0, &m));
    s3_read_requests(g);
    for (int i = 0; i < 4; i++) {
        const size_t heads = s3_count_requests(g, "HEAD", shard[i]), gets = s3_count_requests(g, "GET", shard[i]);
        T_ASSERT_MSG(heads == 0 && gets == (i < 3 ? 1u : 2u), "%s: %zu HEADs, %zu GETs", shard[i], heads, gets);
    }
    T_ASSERT_MSG(s3_count_requests(g, "GET", "list-type") == 1, "%zu listings",
                 s3_count_requests(g, "GET", "list-type"));
    T_ASSERT_MSG(s3_count_requests(g, "GET", "index.json") == 1 && s3_count_requests(g, "HEAD", "index.json") == 0,
                 "the index: %zu GETs, %zu HEADs", s3_count_requests(g, "GET", "index.json"),
                 s3_count_requests(g, "HEAD", "index.json"));
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
    save_shard(e, s3_in(dir, shard[1]), names[1], 1, 5000, 99);
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
    s3_read_requests(g);
    T_ASSERT_MSG(s3_count_requests(g, "HEAD", shard[1]) == 1, "%zu HEADs of %s", s3_count_requests(g, "HEAD", shard[1]),
                 shard[1]);
    check_model(m, names[1], 1, 5000, 99);
    T_OK(ckptio_model_close(m));
    proxy_stop("pass");
    free(g);
    ckptio_engine_destroy(e);
}

/* A safetensors object opens with one GET and no HEAD, listed or not; a probe
 * of its format followed by its open costs that one GET too (the engine keeps
 * the probe's answer for the open). The open taking the probe's answer is
 * pinned to the ETag the probe saw: an object replaced in between fails its
 * read E_STALE. An index opened by its own path: one GET of it, no HEAD. */
static void test_probe_and_open_requests(void) {
    ckptio_engine *e = s3_test_engine(), *other = s3_test_engine();
    const char *dir = s3_url("probe-open");
    const char *w[] = {"w"};
    char url[4200], index[4200];
    snprintf(url, sizeof url, "%s", s3_in(dir, "model.safetensors"));
    snprintf(index, sizeof index, "%s", s3_in(dir, "other.safetensors.index.json"));
    save_shard(e, url, w, 1, 5000, 70);
    save_shard(e, s3_in(dir, "other-1.safetensors"), w, 1, 5000, 71);
    const char *text = "{\"weight_map\": {\"w\": \"other-1.safetensors\"}}";
    s3_put_bytes(e, index, text, strlen(text));
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    const char *const no_rules[] = {NULL};
    s3_request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);

    proxy_start(no_rules);
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(e, url, &st));
    T_OK(ckptio_safetensors_close(st));
    s3_read_requests(g);
    proxy_stop("pass");
    T_ASSERT_MSG(g->n == 1 && s3_count_requests(g, "GET", "model.safetensors") == 1, "open: %zu requests, %zu HEADs",
                 g->n, s3_count_requests(g, "HEAD", "model.safetensors"));

    ckptio_format fmt;
    ckptio_model *m;
    proxy_start(no_rules);
    T_OK(ckptio_format_detect_engine(e, url, &fmt));
    T_ASSERT(fmt == CKPTIO_FORMAT_SAFETENSORS);
    T_OK(ckptio_model_open(e, url, 0, &m));
    s3_read_requests(g);
    T_ASSERT_MSG(g->n == 1 && s3_count_requests(g, "GET", "model.safetensors") == 1,
                 "probe and open: %zu requests, %zu HEADs", g->n, s3_count_requests(g, "HEAD", "model.safetensors"));
    check_model(m, w, 1, 5000, 70);
    T_OK(ckptio_model_close(m));
    proxy_stop("pass");

    proxy_start(no_rules);
    T_OK(ckptio_format_detect_engine(e, index, &fmt));
    T_ASSERT(fmt == CKPTIO_FORMAT_HF_INDEX);
    T_OK(ckptio_model_open(e, index, 0, &m));
    s3_read_requests(g);
    T_ASSERT_MSG(g->n == 2 && s3_count_requests(g, "GET", "index.json") == 1 &&
                     s3_count_requests(g, "GET", "other-1.safetensors") == 1,
                 "an index's probe and open: %zu requests", g->n);
    check_model(m, w, 1, 5000, 71);
    T_OK(ckptio_model_close(m));
    proxy_stop("pass");

    T_OK(ckptio_format_detect_engine(e, url, &fmt));
    save_shard(other, url, w, 1, 5000, 72); /* replaced, through another engine */
    T_OK(ckptio_model_open(e, url, 0, &m));
    float *got = malloc(5000 * 4);
    const ckptio_slice_target rq = {.index = 0, .data = got, .capacity = 5000 * 4, .mem_kind = CKPTIO_MEM_HOST};
    T_ASSERT_MSG(ckptio_model_read(m, &rq, 1) == CKPTIO_E_STALE, "%s", ckptio_last_error_message());
    T_OK(ckptio_model_close(m));
    /* Written through the same engine, the kept answer is dropped: the open sees the new object. */
    T_OK(ckptio_format_detect_engine(e, url, &fmt));
    save_shard(e, url, w, 1, 5000, 73);
    T_OK(ckptio_model_open(e, url, 0, &m));
    check_model(m, w, 1, 5000, 73);
    T_OK(ckptio_model_close(m));
    free(got);
    free(g);
    ckptio_engine_destroy(other);
    ckptio_engine_destroy(e);
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
        s3_put_bytes(e, s3_in(dir, names[i]), data, sizes[i]);
    }
    put_fixture(e, dir);
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    const char *const no_rules[] = {NULL};
    s3_request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    static const size_t heads[3] = {1, 0, 0}, gets[3] = {1, 1, 2};
    char versions[3][128];
    for (int i = 0; i < 3; i++) {
        proxy_start(no_rules);
        ckptio_file *f;
        uint64_t n = 99, size = 0;
        memset(got, 0, (1u << 20) + 5);
        T_OK(ckptio_file_open_window(e, s3_in(dir, names[i]), got, 1u << 20, &n, &f));
        T_OK(ckptio_file_size(f, &size));
        T_ASSERT_MSG(size == sizes[i] && n == (size < (1u << 20) ? size : 1u << 20), "%s: size %llu, got %llu",
                     names[i], (unsigned long long)size, (unsigned long long)n);
        if (size > n) {
            const ckptio_extent x = {.file = f, .file_offset = n, .length = size - n, .memory = got + n,
                                     .mem_kind = CKPTIO_MEM_HOST};
            T_OK(ckptio_engine_execute_extents(e, CKPTIO_READ, &x, 1));
        }
        T_ASSERT_MSG(!memcmp(got, data, size), "%s: the bytes differ", names[i]);
        s3_read_requests(g);
        T_ASSERT_MSG(s3_count_requests(g, "HEAD", names[i]) == heads[i] &&
                         s3_count_requests(g, "GET", names[i]) == gets[i] && g->n == heads[i] + gets[i],
                     "%s: %zu requests, %zu HEADs, %zu GETs", names[i], g->n,
                     s3_count_requests(g, "HEAD", names[i]), s3_count_requests(g, "GET", names[i]));
        if (i == 2) { /* replaced after the open: its read names the pinned ETag */
            data[0] ^= 1;
            s3_put_bytes(e, s3_in(dir, names[i]), data, sizes[i]);
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
    T_OK(ckptio_object_list(e, s3_in(dir, ""), "/", note_etag, &l));
    for (int i = 0; i < 3; i++)
        T_ASSERT_MSG(versions[i][0] == '"' && (i == 2) == (strcmp(versions[i], l.etags[i]) != 0),
                     "%s: opened at %s, listed %s", names[i], versions[i], l.etags[i]);
    proxy_start(no_rules);
    ckptio_dcp *h;
    T_OK(ckptio_dcp_open(e, dir, &h));
    s3_read_requests(g);
    T_ASSERT_MSG(s3_count_requests(g, "GET", "/.metadata") == 1 && s3_count_requests(g, "HEAD", "/.metadata") == 0,
                 ".metadata: %zu GETs, %zu HEADs", s3_count_requests(g, "GET", "/.metadata"),
                 s3_count_requests(g, "HEAD", "/.metadata"));
    T_OK(ckptio_dcp_close(h));
    proxy_stop("pass");
    free(g);
    free(data);
    free(got);
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
    T_ASSERT(s3_object_exists(e, s3_in(dir, CKPTIO_STEP_BEGUN)));
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
    s3_put_bytes(e, s3_in(step_file(root, 400, ""), DATA0), data, len);
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
    T_OK(ckptio_file_open(e, s3_in(dir, "__0_cccccccccccc_0.distcp"), CKPTIO_OPEN_WRITE, &f));
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
    s3_put_bytes(e, s3_in(step_file(root, 100, ""), "notes.txt"), "mine", 4);
    T_ASSERT(ckptio_steps_remove(root, 600) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT(ckptio_steps_remove(root, 100) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "notes.txt"), "%s", ckptio_last_error_message());
    T_ASSERT(s3_object_exists(e, s3_in(step_file(root, 100, ""), CKPTIO_STEP_MARKER)));
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
    s3_put_bytes(e, s3_in(step, CKPTIO_STEP_BEGUN), "", 0);
    char odd[64];
    snprintf(odd, sizeof odd, "a\x01%s", "b.distcp");
    s3_put_bytes(e, s3_in(step, odd), "x", 1);
    T_ASSERT(ckptio_steps_remove(root, 7) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "control bytes"), "%s", ckptio_last_error_message());
    T_ASSERT(s3_object_exists(e, s3_in(step, ".metadata")));
    T_OK(ckptio_object_delete(e, s3_in(step, odd)));
    s3_put_bytes(e, s3_in(step, "sub/__0_0123456789ab_0.distcp"), "x", 1);
    T_ASSERT(ckptio_steps_remove(root, 7) == CKPTIO_E_UNSUPPORTED);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "'sub'"), "%s", ckptio_last_error_message());
    /* Keys that are '..' and '.' under a model prefix are not shards and never opened. */
    const char *hf = s3_url("hf-dots");
    const char *names1[] = {"w"};
    save_shard(e, s3_in(hf, "w.safetensors"), names1, 1, 10, 3);
    s3_put_bytes(e, s3_in(hf, "../escape.safetensors"), "x", 1);
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
    T_RUN(test_probe_and_open_requests);
    T_RUN(test_steps);
    T_RUN(test_hostile_listings);
    return T_EXIT_PASS;
}
