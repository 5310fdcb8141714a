/*
 * test_model_save.c - ckptio_model_save (a Hugging Face directory) on local
 * disk: the split against hand-computed cases of huggingface_hub's rule (an
 * oversize tensor included), the shard names, each shard's metadata, the
 * index text byte for byte, the bytes read back through ckptio_model_open
 * (host and simulated GPU sources), and the commit order: a failure
 * injected into any shard's write, its rename or the index, and a cancel,
 * leave no index, no shard and no temporary of the save, and an older
 * model beside it (other names) intact; an existing model is refused
 * without CKPTIO_MODEL_SAVE_OVERWRITE and replaced with it, files that are
 * not the model's untouched; bad arguments are refused before anything is
 * created. The s3:// side is in test_objstore_formats.c.
 */
#include "gpu_ops.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ckptio_engine *engine;

#define NT 6
static const int64_t sizes[NT] = {3000, 12000, 4000, 5000, 1, 0}; /* bytes (U8), limit 10000 */
static const char *names[NT] = {"a.first", "b.oversize", "c.third", "d.fourth", "e.tiny", "f.empty"};
static unsigned char *data[NT];
static int64_t shapes[NT][1];
static ckptio_tensor_source src[NT];

static void make_sources(uint64_t seed) {
    for (int i = 0; i < NT; i++) {
        shapes[i][0] = sizes[i];
        free(data[i]);
        data[i] = malloc(sizes[i] ? (size_t)sizes[i] : 1);
        t_fill_random(data[i], (size_t)sizes[i], seed + (uint64_t)i);
        src[i] = (ckptio_tensor_source){names[i], CKPTIO_DTYPE_U8, 1, shapes[i], data[i], (uint64_t)sizes[i],
                                        CKPTIO_MEM_HOST};
    }
}

/* The options of a save split at `max_shard_size` bytes (0: one file), replacing a model there when
 * `overwrite` (a static: valid until the next call). */
static const ckptio_model_save_options *options(uint64_t max_shard_size, bool overwrite) {
    static ckptio_model_save_options o;
    o = (ckptio_model_save_options){.max_shard_size = max_shard_size,
                                    .flags = overwrite ? CKPTIO_MODEL_SAVE_OVERWRITE : 0};
    return &o;
}

/* A save of the sources over the model in `dir`, split at `max_shard_size`, whose `nth` request of `kind`
 * fails with EIO: it fails E_IO. */
static void save_failing(const char *dir, uint64_t max_shard_size, ckptio__io_kind kind, uint64_t nth) {
    ckptio__io_inject(kind, nth, EIO, 0, false);
    T_STATUS(ckptio_model_save(engine, dir, src, NT, options(max_shard_size, true), NULL), CKPTIO_E_IO);
    ckptio__io_inject_reset();
}

static const char *in(const char *dir, const char *name) {
    static char buf[4][1024];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 1024, "%s/%s", dir, name);
    return p;
}

/* Every tensor of the model at `dir` equals the sources, in the shard the split puts it. */
static void check_model(const char *dir, const char *const *expect_shard) {
    ckptio_model *m;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    size_t count;
    T_OK(ckptio_model_count(m, &count));
    T_ASSERT(count == NT);
    for (int i = 0; i < NT; i++) {
        size_t idx, shard;
        T_OK(ckptio_model_find(m, names[i], &idx));
        ckptio_tensor_info info;
        T_OK(ckptio_model_tensor(m, idx, &info, &shard));
        const char *path;
        T_OK(ckptio_model_shard(m, shard, &path, NULL));
        T_ASSERT_MSG(strcmp(strrchr(path, '/') + 1, expect_shard[i]) == 0, "%s in %s, expected %s", names[i], path,
                     expect_shard[i]);
        unsigned char *got = malloc(sizes[i] ? (size_t)sizes[i] : 1);
        const ckptio_slice_target t = {.index = idx, .data = got, .capacity = (uint64_t)sizes[i],
                                       .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_model_read(m, &t, 1));
        T_ASSERT(memcmp(got, data[i], (size_t)sizes[i]) == 0);
        free(got);
    }
    size_t nmeta;
    T_OK(ckptio_model_metadata_count(m, &nmeta));
    T_ASSERT(nmeta == 1);
    ckptio_kv kv;
    T_OK(ckptio_model_metadata(m, 0, &kv));
    T_ASSERT(strcmp(kv.key, "format") == 0 && strcmp(kv.value, "pt") == 0);
    T_OK(ckptio_model_close(m));
}

/* huggingface_hub's split of sizes {3000, 12000, 4000, 5000, 1, 0} at 10000: the oversize tensor is appended
 * to the shard list at once (shard 1); a, c (7000) close when d would pass the limit (shard 2); d, e, f last. */
static const char *const split_10k[NT] = {"model-00002-of-00003.safetensors", "model-00001-of-00003.safetensors",
                                          "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                          "model-00003-of-00003.safetensors", "model-00003-of-00003.safetensors"};

static const char index_10k[] =
    "{\n"
    "  \"metadata\": {\n"
    "    \"note\": \"x\",\n"
    "    \"total_size\": 24001\n"
    "  },\n"
    "  \"weight_map\": {\n"
    "    \"a.first\": \"model-00002-of-00003.safetensors\",\n"
    "    \"b.oversize\": \"model-00001-of-00003.safetensors\",\n"
    "    \"c.third\": \"model-00002-of-00003.safetensors\",\n"
    "    \"d.fourth\": \"model-00003-of-00003.safetensors\",\n"
    "    \"e.tiny\": \"model-00003-of-00003.safetensors\",\n"
    "    \"f.empty\": \"model-00003-of-00003.safetensors\"\n"
    "  }\n"
    "}\n";

static void test_split_index_bytes(void) {
    make_sources(1);
    const char *dir = t_path("split/nested/out");
    const ckptio_kv note = {"note", "x"};
    const ckptio_model_save_options o = {.max_shard_size = 10000, .metadata = &note, .metadata_count = 1};
    size_t nshards = 0;
    T_OK(ckptio_model_save(engine, dir, src, NT, &o, &nshards)); /* parents created */
    T_ASSERT(nshards == 3);
    T_ASSERT(t_count_entries(dir, "") == 4); /* 3 shards and the index, no temporaries */
    size_t len;
    char *index = t_read_file(in(dir, "model.safetensors.index.json"), &len);
    T_ASSERT_MSG(len == strlen(index_10k) && memcmp(index, index_10k, len) == 0, "index:\n%.*s", (int)len, index);
    free(index);
    check_model(dir, split_10k);
    /* The default limit (5 GB): one model.safetensors, no index, the caller's metadata in the file. */
    const char *one = t_path("split/one/");
    T_OK(ckptio_model_save(engine, one, src, NT, &(ckptio_model_save_options){.metadata = &note, .metadata_count = 1},
                           &nshards));
    T_ASSERT(nshards == 1 && t_count_entries(one, "") == 1 && t_file_exists(in(one, "model.safetensors")));
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, in(one, "model.safetensors"), &st));
    size_t nmeta;
    T_OK(ckptio_safetensors_metadata_count(st, &nmeta));
    ckptio_kv kv0, kv1;
    T_ASSERT(nmeta == 2);
    T_OK(ckptio_safetensors_metadata(st, 0, &kv0));
    T_OK(ckptio_safetensors_metadata(st, 1, &kv1));
    T_ASSERT(strcmp(kv0.key, "format") == 0 && strcmp(kv1.key, "note") == 0);
    T_OK(ckptio_safetensors_close(st));
    /* Every tensor alone (limit 1 byte: each nonzero one passes it or fills it) */
    const char *each = t_path("split/each");
    T_OK(ckptio_model_save(engine, each, src, NT, options(1, false), &nshards));
    T_ASSERT(nshards == 5); /* e (1 byte) fits, then f (0 bytes) joins it */
}

/* Simulated GPU memory as the source: the same bytes land in the shards. */
static void test_gpu_sources(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    make_sources(7);
    ckptio_tensor_source gsrc[NT];
    void *dev[NT];
    for (int i = 0; i < NT; i++) {
        dev[i] = ckptio__gpu_sim_device_alloc(sizes[i] ? (size_t)sizes[i] : 1);
        memcpy(dev[i], data[i], (size_t)sizes[i]);
        gsrc[i] = src[i];
        gsrc[i].data = dev[i];
        gsrc[i].mem_kind = CKPTIO_MEM_CUDA;
    }
    const char *dir = t_path("gpu");
    T_OK(ckptio_model_save(e, dir, gsrc, NT, options(10000, false), NULL));
    check_model(dir, split_10k);
    for (int i = 0; i < NT; i++) ckptio__gpu_sim_device_free(dev[i]);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_set_ops(NULL);
}

/* An older single-file model at `dir` (the sources of `seed`), beside which a failed save of 3 shards must
 * leave nothing; returns its bytes (free() them) and makes the sources of seed + 1, the new save's. */
static unsigned char *older_model(const char *dir, uint64_t seed, size_t *older_len) {
    make_sources(seed);
    T_OK(ckptio_model_save(engine, dir, src, NT, NULL, NULL));
    t_write_file(in(dir, "config.json"), "{}", 2);
    make_sources(seed + 1);
    return t_read_file(in(dir, "model.safetensors"), older_len);
}

static void older_intact(const char *dir, const unsigned char *older, size_t older_len) {
    size_t len;
    unsigned char *now = t_read_file(in(dir, "model.safetensors"), &len);
    T_ASSERT(len == older_len && memcmp(now, older, len) == 0);
    free(now);
    T_ASSERT(t_file_exists(in(dir, "config.json")));
    T_ASSERT_MSG(t_count_entries(dir, "") == 2, "%d entries in %s: %s", t_count_entries(dir, ""), dir,
                 ckptio_last_error_message());
}

/* The new 3-shard model removed, the older single file written back. */
static void put_older_back(const char *dir, const unsigned char *older, size_t older_len) {
    for (int s = 1; s <= 3; s++) {
        char n[64];
        snprintf(n, sizeof n, "model-%05d-of-00003.safetensors", s);
        unlink(in(dir, n));
    }
    unlink(in(dir, "model.safetensors.index.json"));
    t_write_file(in(dir, "model.safetensors"), older, older_len);
}

static void test_failures_leave_nothing(void) {
    const char *dir = t_path("fail");
    size_t older_len;
    unsigned char *older = older_model(dir, 3, &older_len);
    /* Every write request, rename and open in turn, until the save makes fewer of them. */
    const ckptio__io_kind kinds[] = {CKPTIO__IO_WRITE, CKPTIO__IO_RENAME, CKPTIO__IO_OPEN, CKPTIO__IO_FSYNC};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (uint64_t nth = 1;; nth++) {
            ckptio__io_inject(kinds[k], nth, EIO, 0, false);
            const ckptio_status st = ckptio_model_save(engine, dir, src, NT, options(10000, true), NULL);
            const bool fired = ckptio__io_inject_countdown(kinds[k]) == 0;
            ckptio__io_inject_reset();
            if (!fired) { /* past the save's last request of this kind: it succeeded; put the older one back */
                T_OK(st);
                check_model(dir, split_10k);
                T_ASSERT(!t_file_exists(in(dir, "model.safetensors")));
                put_older_back(dir, older, older_len);
                T_ASSERT_MSG(nth > 3, "kind %zu: only %llu requests", k, (unsigned long long)nth - 1);
                break;
            }
            T_ASSERT_MSG(st != CKPTIO_OK, "kind %zu request %llu failed but the save succeeded", k,
                         (unsigned long long)nth);
            if (t_file_exists(in(dir, "model.safetensors.index.json"))) {
                /* The index's rename was done and a later step failed (opening or syncing the directory): the
                 * new model is whole and stays (nothing rolled back under an index that names it), and the
                 * older file, whose removal comes after, is still there and unchanged. */
                T_ASSERT(kinds[k] == CKPTIO__IO_FSYNC || kinds[k] == CKPTIO__IO_OPEN);
                check_model(in(dir, "model.safetensors.index.json"), split_10k);
                size_t now_len;
                unsigned char *now = t_read_file(in(dir, "model.safetensors"), &now_len);
                T_ASSERT(now_len == older_len && memcmp(now, older, older_len) == 0);
                free(now);
                put_older_back(dir, older, older_len);
                continue;
            }
            older_intact(dir, older, older_len); /* no index, no shard, no temporary */
        }
    }
    free(older);
}

static int cancel_after(uint64_t done, uint64_t total, void *user) {
    (void)total;
    return done >= *(uint64_t *)user;
}

static void test_cancel_leaves_nothing(void) {
    const char *dir = t_path("cancel");
    size_t older_len;
    unsigned char *older = older_model(dir, 5, &older_len);
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    /* Canceled at the first report, which comes before the plan ends: a report is made at most every 10 ms, and
     * each request takes 20 ms. (Waiting for a report with a byte done raced the end of a short plan.) */
    uint64_t at = 0;
    T_OK(ckptio_engine_set_progress(e, cancel_after, &at));
    ckptio__io_inject_delay(20000);
    T_STATUS(ckptio_model_save(e, dir, src, NT, options(10000, true), NULL), CKPTIO_E_CANCELED);
    ckptio__io_inject_reset();
    older_intact(dir, older, older_len);
    free(older);
    T_OK(ckptio_engine_destroy(e));
}

/* The same sizes at 20000: nothing is oversize; a, b, c (19000) close when d would pass the limit. */
static const char *const split_20k[NT] = {"model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                                          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                          "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors"};

/* A failed overwrite removes only what is this save's, and never what loads: an older file under a name the
 * failed commit did not reach; an older index the failed index write left in place; a new model already
 * named by its index when removing the older model's other files fails. */
static void test_failed_overwrites_keep_what_loads(void) {
    /* The one shard's name is the older file's: the temporary's fsync fails before the rename. */
    const char *dir = t_path("keep_single");
    size_t older_len;
    unsigned char *older = older_model(dir, 3, &older_len);
    save_failing(dir, 0, CKPTIO__IO_FSYNC, 1);
    older_intact(dir, older, older_len);
    free(older);
    /* Three older shards at 10000, two new ones at 20000: the index's rename fails (the third rename). */
    dir = t_path("keep_index");
    make_sources(5);
    T_OK(ckptio_model_save(engine, dir, src, NT, options(10000, false), NULL));
    make_sources(6);
    save_failing(dir, 20000, CKPTIO__IO_RENAME, 3);
    make_sources(5);
    check_model(dir, split_10k);
    T_ASSERT_MSG(t_count_entries(dir, "") == 4, "%d entries", t_count_entries(dir, ""));
    /* The new index is in place; removing the first older shard tried fails: the new model stays whole and
     * the other older shards are removed all the same (one of the three stays). */
    make_sources(7);
    save_failing(dir, 20000, CKPTIO__IO_UNLINK, 1);
    check_model(dir, split_20k);
    T_ASSERT(t_file_exists(in(dir, "model-00001-of-00003.safetensors")) +
                 t_file_exists(in(dir, "model-00002-of-00003.safetensors")) +
                 t_file_exists(in(dir, "model-00003-of-00003.safetensors")) ==
             1);
}

static void test_existing_model(void) {
    make_sources(6);
    const char *dir = t_path("exists");
    T_OK(ckptio_model_save(engine, dir, src, NT, options(10000, false), NULL));
    t_write_file(in(dir, "config.json"), "{}", 2);
    t_write_file(in(dir, "model-00009-of-00009.safetensors.bak"), "x", 1); /* not the pattern: untouched */
    make_sources(16);
    /* Refused without the flag: nothing written, the older model as it was. */
    T_STATUS(ckptio_model_save(engine, dir, src, NT, NULL, NULL), CKPTIO_E_EXISTS);
    T_MESSAGE_HAS("already holds a model");
    T_ASSERT(t_count_entries(dir, "") == 6);
    make_sources(6);
    check_model(dir, split_10k);
    /* A failed overwrite under the same names: the bytes all go before anything is committed, so the older
     * model stays whole. */
    make_sources(36);
    save_failing(dir, 10000, CKPTIO__IO_WRITE, 2);
    make_sources(6);
    check_model(dir, split_10k);
    T_ASSERT(t_count_entries(dir, "") == 6);
    /* Replaced with it: the same names (the old index goes first), then fewer shards (the rest removed). */
    make_sources(26);
    T_OK(ckptio_model_save(engine, dir, src, NT, options(10000, true), NULL));
    check_model(dir, split_10k);
    T_OK(ckptio_model_save(engine, dir, src, NT, options(20000, true), NULL));
    check_model(dir, split_20k);
    T_ASSERT(t_count_entries(dir, "") == 5); /* 2 shards, index, config.json, the .bak */
    T_ASSERT(t_file_exists(in(dir, "config.json")) && t_file_exists(in(dir, "model-00009-of-00009.safetensors.bak")));
    /* A file where the directory should be. */
    const char *file = t_path("exists/config.json");
    T_STATUS(ckptio_model_save(engine, file, src, NT, NULL, NULL), CKPTIO_E_EXISTS);
}

static void test_bad_input(void) {
    make_sources(8);
    const char *dir = t_path("bad");
    ckptio_tensor_source dup[NT];
    memcpy(dup, src, sizeof dup);
    dup[4].name = "a.first"; /* the same name in another shard */
    T_STATUS(ckptio_model_save(engine, dir, dup, NT, options(10000, false), NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("a.first");
    memcpy(dup, src, sizeof dup);
    dup[3].nbytes = 4999; /* does not match its shape */
    T_STATUS(ckptio_model_save(engine, dir, dup, NT, NULL, NULL), CKPTIO_E_INVAL);
    T_STATUS(ckptio_model_save(engine, dir, src, NT, &(ckptio_model_save_options){.flags = 1u << 7}, NULL),
             CKPTIO_E_INVAL);
    T_STATUS(ckptio_model_save(engine, dir, src, NT, &(ckptio_model_save_options){.metadata_count = 1}, NULL),
             CKPTIO_E_INVAL);
    T_STATUS(ckptio_model_save(engine, "", src, NT, NULL, NULL), CKPTIO_E_INVAL);
    T_ASSERT(!t_file_exists(dir)); /* refused before anything was created */
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_split_index_bytes);
    T_RUN(test_gpu_sources);
    T_RUN(test_failures_leave_nothing);
    T_RUN(test_cancel_leaves_nothing);
    T_RUN(test_existing_model);
    T_RUN(test_failed_overwrites_keep_what_loads);
    T_RUN(test_bad_input);
    T_OK(ckptio_engine_destroy(engine));
    for (int i = 0; i < NT; i++) free(data[i]);
    return T_EXIT_PASS;
}
