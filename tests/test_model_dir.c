/*
 * test_model_dir.c - models (ckptio_model): Hugging Face directories, their
 * index and single files as one handle; whole tensors read in one call
 * (host, O_DIRECT on unaligned data); and hostile directories and indexes
 * (missing shard, a tensor in two shards, traversal names, absent tensors,
 * duplicate keys, symlinks leaving the directory, a FIFO shard). Slices:
 * test_model_slices.c.
 *
 * Shards are written with CKPTIO_SAFETENSORS_ALIGN_8, i.e. byte for byte
 * what the safetensors package writes: data NOT 4 KiB-aligned.
 */
#include "model_dir_helpers.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- valid models ------------------------------------------------------------------- */

static void check_table(ckptio_model *m) {
    size_t count = 0, nshards = 0;
    T_OK(ckptio_model_count(m, &count));
    T_ASSERT(count == NT);
    T_OK(ckptio_model_shard_count(m, &nshards));
    T_ASSERT(nshards == NSHARDS);
    for (size_t i = 0; i < NT; i++) {
        size_t index = 99, shard = 99;
        ckptio_tensor_info info;
        T_OK(ckptio_model_find(m, T[i].name, &index));
        T_OK(ckptio_model_tensor(m, index, &info, &shard));
        T_ASSERT(strcmp(info.name, T[i].name) == 0 && info.dtype == T[i].dtype && info.ndim == T[i].ndim);
        T_ASSERT(info.nbytes == T[i].nbytes);
        for (uint32_t d = 0; d < info.ndim; d++) T_ASSERT(info.shape[d] == T[i].shape[d]);
        const char *path = NULL;
        T_OK(ckptio_model_shard(m, shard, &path, NULL));
        T_ASSERT_MSG(strstr(path, shard_name(T[i].shard)) != NULL, "%s is in %s", T[i].name, path);
    }
    size_t idx;
    T_STATUS(ckptio_model_find(m, "nope", &idx), CKPTIO_E_NOT_FOUND);
    /* Order: shard by shard, offsets increasing inside each. */
    size_t prev_shard = 0;
    uint64_t prev_off = 0;
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        size_t shard;
        T_OK(ckptio_model_tensor(m, i, &info, &shard));
        T_ASSERT(shard > prev_shard || (shard == prev_shard && (i == 0 || info.file_offset >= prev_off)));
        prev_shard = shard;
        prev_off = info.file_offset;
    }
    size_t nmeta;
    ckptio_kv kv;
    T_OK(ckptio_model_metadata_count(m, &nmeta));
    T_ASSERT(nmeta == 1);
    T_OK(ckptio_model_metadata(m, 0, &kv));
    T_ASSERT(strcmp(kv.key, "format") == 0 && strcmp(kv.value, "pt") == 0);
}

static void test_index_dir(void) {
    const char *dir = make_model_dir("hf");
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    check_table(m);
    const char *index = NULL;
    int64_t total = 0;
    T_OK(ckptio_model_index(m, &index, &total));
    T_ASSERT(strstr(index, "model.safetensors.index.json") != NULL);
    uint64_t sum = 0;
    for (size_t i = 0; i < NT; i++) sum += T[i].nbytes;
    T_ASSERT(total == (int64_t)sum);
    T_OK(ckptio_model_close(m));

    /* The index file itself. */
    T_OK(ckptio_model_open(engine, join2(dir, "model.safetensors.index.json"), 0, &m));
    check_table(m);
    T_OK(ckptio_model_close(m));

    /* A single file is a one-shard model without index. */
    T_OK(ckptio_model_open(engine, join2(dir, shard_name(1)), 0, &m));
    size_t n = 0;
    T_OK(ckptio_model_shard_count(m, &n));
    T_ASSERT(n == 1);
    T_OK(ckptio_model_count(m, &n));
    T_ASSERT(n == 3);
    T_STATUS(ckptio_model_index(m, &index, NULL), CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_model_close(m));
    T_OK(ckptio_model_close(NULL));
}

/* All tensors of all shards in one call. */
static void read_all_and_check(ckptio_engine *e, const char *dir, ckptio_mem_kind kind, ckptio_stats *delta) {
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(e, dir, 0, &m));
    ckptio_slice_target targets[NT];
    unsigned char *bufs[NT];
    for (size_t i = 0; i < NT; i++) {
        bufs[i] = malloc(T[i].nbytes + 8);
        memset(bufs[i], 0xEE, T[i].nbytes + 8);
        T_OK(ckptio_model_find(m, T[i].name, &targets[i].index));
        targets[i] = (ckptio_slice_target){.index = targets[i].index, .data = bufs[i], .capacity = T[i].nbytes,
                                           .mem_kind = kind};
    }
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(e, &a));
    T_OK(ckptio_model_read(m, targets, NT));
    T_OK(ckptio_engine_stats(e, &b));
    if (delta) {
        delta->bytes_read = b.bytes_read - a.bytes_read;
        delta->bytes_direct = b.bytes_direct - a.bytes_direct;
        delta->bytes_bounced = b.bytes_bounced - a.bytes_bounced;
    }
    for (size_t i = 0; i < NT; i++) {
        T_ASSERT_MSG(memcmp(bufs[i], T[i].data, T[i].nbytes) == 0, "bytes of %s", T[i].name);
        T_ASSERT_MSG(bufs[i][T[i].nbytes] == 0xEE, "wrote past %s", T[i].name);
        free(bufs[i]);
    }
    T_OK(ckptio_model_close(m));
}

static void test_read_whole(void) {
    const char *dir = make_model_dir("whole");
    ckptio_stats d;
    read_all_and_check(engine, dir, CKPTIO_MEM_HOST, &d);
    uint64_t sum = 0;
    for (size_t i = 0; i < NT; i++) sum += T[i].nbytes;
    T_ASSERT_MSG(d.bytes_read == sum, "read %llu bytes for %llu of tensors", (unsigned long long)d.bytes_read,
                 (unsigned long long)sum);
}

/* The data section of a safetensors-written file starts wherever its
 * header ends; read with O_DIRECT forced on, unaligned heads and tails go
 * through bounce buffers. */
static void test_direct_unaligned(void) {
    const char *dir = make_model_dir("direct");
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_ON));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT_MIN_BYTES, 0));
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(e, dir, 0, &m));
    unsigned char probe[16];
    ckptio_slice_target t = {.index = 0, .data = probe, .capacity = 0, .mem_kind = CKPTIO_MEM_HOST};
    const int64_t z[1] = {0};
    ckptio_tensor_info info;
    size_t bi;
    T_OK(ckptio_model_find(m, "layers.0.q.bias", &bi));
    T_OK(ckptio_model_tensor(m, bi, &info, NULL));
    t.index = bi;
    t.start = z;
    t.stop = z;
    ckptio_status st = ckptio_model_read(m, &t, 1);
    T_OK(ckptio_model_close(m));
    if (st == CKPTIO_E_UNSUPPORTED) {
        printf("# O_DIRECT refused by the file system of %s: skipped\n", dir);
        ckptio_engine_destroy(e);
        return;
    }
    ckptio_stats d;
    read_all_and_check(e, dir, CKPTIO_MEM_HOST, &d);
    T_ASSERT_MSG(d.bytes_direct > 0, "no byte moved with O_DIRECT");
    T_ASSERT_MSG(d.bytes_bounced > 0, "unaligned data needed no bounce: is it aligned?");
    T_ASSERT(info.file_offset % 4096 != 0);
    T_OK(ckptio_engine_destroy(e));
}

/* ---- directory forms ------------------------------------------------------------------ */

static void test_dir_forms(void) {
    ckptio_model *m = NULL;
    size_t n;
    /* model.safetensors alone. */
    const char *d1 = t_path("single");
    T_ASSERT(mkdir(d1, 0755) == 0);
    write_shard(d1, "model.safetensors", 1, NULL);
    write_text(join2(d1, "notes.txt"), "not a shard");
    T_OK(ckptio_model_open(engine, d1, 0, &m));
    T_OK(ckptio_model_count(m, &n));
    T_ASSERT(n == 3);
    T_OK(ckptio_model_close(m));

    /* Several files without index: all of them, each tensor in one. */
    const char *d2 = t_path("noindex");
    T_ASSERT(mkdir(d2, 0755) == 0);
    for (int s = 0; s < NSHARDS; s++) write_shard(d2, shard_name(s), s, NULL);
    T_OK(ckptio_model_open(engine, d2, 0, &m));
    check_table(m);
    T_OK(ckptio_model_close(m));
    read_all_and_check(engine, d2, CKPTIO_MEM_HOST, NULL);
    /* ... and a name in two of them is refused, naming both. */
    write_shard(d2, "zz-extra.safetensors", 1, NULL);
    T_STATUS(ckptio_model_open(engine, d2, 0, &m), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("two files");
    T_MESSAGE_HAS("zz-extra.safetensors");
    T_MESSAGE_HAS(shard_name(1));

    /* One index of another name is used; two are ambiguous. */
    const char *d3 = t_path("otherindex");
    T_ASSERT(mkdir(d3, 0755) == 0);
    for (int s = 0; s < NSHARDS; s++) write_shard(d3, shard_name(s), s, NULL);
    write_index(d3, "");
    T_ASSERT(rename(join2(d3, "model.safetensors.index.json"),
                    join2(d3, "diffusion_model.safetensors.index.json")) == 0);
    write_text(join2(d3, "stray.safetensors"), "garbage that would fail if opened");
    T_OK(ckptio_model_open(engine, d3, 0, &m));
    check_table(m);
    T_OK(ckptio_model_close(m));
    write_text(join2(d3, "other.safetensors.index.json"), "{\"weight_map\": {}}");
    T_STATUS(ckptio_model_open(engine, d3, 0, &m), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("2 safetensors indexes");

    /* Nothing to open. */
    const char *d4 = t_path("empty");
    T_ASSERT(mkdir(d4, 0755) == 0);
    T_STATUS(ckptio_model_open(engine, d4, 0, &m), CKPTIO_E_NOT_FOUND);
    T_STATUS(ckptio_model_open(engine, t_path("does-not-exist"), 0, &m), CKPTIO_E_NOT_FOUND);
    T_STATUS(ckptio_model_open(engine, d4, 8, &m), CKPTIO_E_INVAL);
    T_ASSERT(m == NULL);
}

/* ---- hostile indexes -------------------------------------------------------------------- */

/* Writes `json` as the index of a fresh copy of the model and expects the
 * open to fail with `want` and a message holding each of `needles`. */
static void expect_index(const char *json, ckptio_status want, const char *const *needles) {
    static int k;
    char name[32];
    snprintf(name, sizeof name, "hostile%d", k++);
    const char *dir = make_model_dir(name);
    write_text(join2(dir, "model.safetensors.index.json"), json);
    ckptio_model *m = NULL;
    const ckptio_status st = ckptio_model_open(engine, dir, 0, &m);
    T_ASSERT_MSG(st == want, "index %s: got %s (%s), expected %s", json, ckptio_status_name(st),
                 st ? ckptio_last_error_message() : "", ckptio_status_name(want));
    T_ASSERT(m == NULL);
    for (; needles && *needles; needles++)
        T_ASSERT_MSG(strstr(ckptio_last_error_message(), *needles), "index %s: message '%s' lacks '%s'", json,
                     ckptio_last_error_message(), *needles);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), "model.safetensors.index.json") ||
                     strstr(ckptio_last_error_message(), dir),
                 "message '%s' names neither the index nor the directory", ckptio_last_error_message());
}

static void test_hostile_index(void) {
    /* A shard that does not exist: the message names the index, a tensor and the shard. */
    {
        const char *dir = make_model_dir("missing");
        T_ASSERT(unlink(join2(dir, shard_name(1))) == 0);
        ckptio_model *m = NULL;
        T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_NOT_FOUND);
        T_MESSAGE_HAS("model.safetensors.index.json");
        T_MESSAGE_HAS(shard_name(1));
        T_MESSAGE_HAS("layers.0.norm"); /* the first tensor (by name) the index maps to it */
    }
    /* A tensor in two shards. */
    {
        const char *dir = make_model_dir("twice");
        write_shard(dir, shard_name(2), 2, "mask");
        ckptio_model *m = NULL;
        T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_FORMAT);
        T_MESSAGE_HAS("two shards");
        T_MESSAGE_HAS("'mask'");
        T_MESSAGE_HAS(shard_name(0));
        T_MESSAGE_HAS(shard_name(2));
    }
    /* The index names a tensor no shard holds / omits one a shard holds. */
    {
        const char *const n1[] = {"ghost", "does not hold it", NULL};
        char json[8192];
        const char *dir = make_model_dir("ghost");
        write_index(dir, ", \"ghost\": \"model-00002-of-00003.safetensors\"");
        size_t len;
        char *text = t_read_file(join2(dir, "model.safetensors.index.json"), &len);
        snprintf(json, sizeof json, "%.*s", (int)len, text);
        free(text);
        expect_index(json, CKPTIO_E_FORMAT, n1);
        /* Without "mask": its shard holds a tensor the index does not list. */
        char *p = strstr(json, "\"mask\": \"model-00001-of-00003.safetensors\", ");
        T_ASSERT(p);
        memmove(p, p + strlen("\"mask\": \"model-00001-of-00003.safetensors\", "),
                strlen(p + strlen("\"mask\": \"model-00001-of-00003.safetensors\", ")) + 1);
        char *g = strstr(json, ", \"ghost\"");
        *g = '\0';
        strcat(json, "}}");
        const char *const n2[] = {"'mask'", "not in the index", NULL};
        expect_index(json, CKPTIO_E_FORMAT, n2);
    }
    /* Names that leave the directory are refused before anything is opened. */
    {
        const char *outside = t_path("evil.safetensors");
        write_shard(t_tmpdir(), "evil.safetensors", 0, NULL);
        T_ASSERT(t_file_exists(outside));
        static const char *const bad[] = {"../evil.safetensors", "/etc/passwd", "sub/x.safetensors", ".", "..",
                                          "./model-00001-of-00003.safetensors"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char json[512];
            snprintf(json, sizeof json, "{\"weight_map\": {\"embed.weight\": \"%s\"}}", bad[i]);
            const char *const needles[] = {"embed.weight", "own directory", NULL};
            expect_index(json, CKPTIO_E_DISALLOWED, needles);
        }
        const char *const empty[] = {"plain name", NULL};
        expect_index("{\"weight_map\": {\"embed.weight\": \"\"}}", CKPTIO_E_FORMAT, empty);
    }
    /* Malformed JSON and structure. */
    {
        const char *const dup[] = {"duplicate", NULL};
        expect_index("{\"weight_map\": {\"mask\": \"model-00001-of-00003.safetensors\", \"mask\": "
                     "\"model-00002-of-00003.safetensors\"}}",
                     CKPTIO_E_FORMAT, dup);
        expect_index("{\"weight_map\": {}, \"weight_map\": {}}", CKPTIO_E_FORMAT, dup);
        const char *const nul[] = {"JSON", NULL};
        expect_index("{\"weight_map\": {\"mask\": \"model-00001-of-00003.safetensors\\u0000x\"}}", CKPTIO_E_FORMAT,
                     nul);
        expect_index("{\"weight_map\": {\"ma\\u0000sk\": \"model-00001-of-00003.safetensors\"}}", CKPTIO_E_FORMAT,
                     nul);
        const char *const str[] = {"weight_map['mask']", "string", NULL};
        expect_index("{\"weight_map\": {\"mask\": 5}}", CKPTIO_E_FORMAT, str);
        const char *const wm[] = {"weight_map", NULL};
        expect_index("{\"metadata\": {}}", CKPTIO_E_FORMAT, wm);
        expect_index("{\"weight_map\": [\"a\"]}", CKPTIO_E_FORMAT, wm);
        const char *const md[] = {"metadata", NULL};
        expect_index("{\"metadata\": 3, \"weight_map\": {}}", CKPTIO_E_FORMAT, md);
        const char *const obj[] = {"object", NULL};
        expect_index("[1, 2]", CKPTIO_E_FORMAT, obj);
        expect_index("{\"weight_map\": {}", CKPTIO_E_FORMAT, nul);
        expect_index("", CKPTIO_E_FORMAT, nul);
    }
    /* An index with an empty weight_map names no shard: an empty model (the
     * index, not the directory listing, says what the model is). */
    {
        const char *dir = make_model_dir("emptymap");
        write_text(join2(dir, "model.safetensors.index.json"), "{\"weight_map\": {}}");
        ckptio_model *m = NULL;
        size_t n = 9;
        T_OK(ckptio_model_open(engine, dir, 0, &m));
        T_OK(ckptio_model_count(m, &n));
        T_ASSERT(n == 0);
        T_OK(ckptio_model_read(m, NULL, 0));
        T_OK(ckptio_model_close(m));
    }
}

/* ---- symlinks and special files ------------------------------------------------------------ */

static void test_symlinks(void) {
    /* A shard that is a symlink to a valid file outside the directory. */
    const char *dir = make_model_dir("symlink");
    const char *outside = t_path("outside-shard.safetensors");
    write_shard(t_tmpdir(), "outside-shard.safetensors", 1, NULL);
    T_ASSERT(unlink(join2(dir, shard_name(1))) == 0);
    T_ASSERT(symlink(outside, join2(dir, shard_name(1))) == 0);
    ckptio_model *m = NULL;
    T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("symlink");
    T_MESSAGE_HAS(shard_name(1));
    T_MESSAGE_HAS("outside");
    /* The same through a relative link climbing out. */
    T_ASSERT(unlink(join2(dir, shard_name(1))) == 0);
    T_ASSERT(symlink("../outside-shard.safetensors", join2(dir, shard_name(1))) == 0);
    T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_DISALLOWED);
    /* Allowed on request (the hub cache layout). */
    T_OK(ckptio_model_open(engine, dir, CKPTIO_MODEL_ALLOW_SYMLINKS, &m));
    check_table(m);
    T_OK(ckptio_model_close(m));
    /* A link that stays inside is fine. */
    T_ASSERT(unlink(join2(dir, shard_name(1))) == 0);
    write_shard(dir, "real-1.safetensors", 1, NULL);
    T_ASSERT(symlink("real-1.safetensors", join2(dir, shard_name(1))) == 0);
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    T_OK(ckptio_model_close(m));
    /* A dangling link is a missing shard. */
    T_ASSERT(unlink(join2(dir, shard_name(1))) == 0);
    T_ASSERT(symlink("nowhere.safetensors", join2(dir, shard_name(1))) == 0);
    T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS(shard_name(1));

    /* The index of a directory is one of its files: a link out is refused too. */
    const char *d2 = make_model_dir("symindex");
    const char *idx = join2(d2, "model.safetensors.index.json");
    T_ASSERT(rename(idx, t_path("outside-index.json")) == 0);
    T_ASSERT(symlink(t_path("outside-index.json"), idx) == 0);
    T_STATUS(ckptio_model_open(engine, d2, 0, &m), CKPTIO_E_DISALLOWED);
    /* A directory named by a symlink is resolved first: its shards are inside it. */
    const char *d3 = t_path("dirlink");
    T_ASSERT(symlink(make_model_dir("linked"), d3) == 0);
    T_OK(ckptio_model_open(engine, d3, 0, &m));
    T_OK(ckptio_model_close(m));
}

/* A FIFO named as a shard would block open(2) forever: refused first. */
static void test_special_files(void) {
    const char *dir = make_model_dir("fifo");
    T_ASSERT(unlink(join2(dir, shard_name(2))) == 0);
    T_ASSERT(mkfifo(join2(dir, shard_name(2)), 0644) == 0);
    ckptio_model *m = NULL;
    T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not a regular file");
    T_ASSERT(unlink(join2(dir, shard_name(2))) == 0);
    T_ASSERT(mkdir(join2(dir, shard_name(2)), 0755) == 0);
    T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_FORMAT);
    /* A shard that is not a valid safetensors file: its own error. */
    T_ASSERT(rmdir(join2(dir, shard_name(2))) == 0);
    write_text(join2(dir, shard_name(2)), "garbage");
    T_STATUS(ckptio_model_open(engine, dir, 0, &m), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS(shard_name(2));
}

int main(void) {
    make_data();
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_index_dir);
    T_RUN(test_read_whole);
    T_RUN(test_direct_unaligned);
    T_RUN(test_dir_forms);
    T_RUN(test_hostile_index);
    T_RUN(test_symlinks);
    T_RUN(test_special_files);
    T_OK(ckptio_engine_destroy(engine));
    free_data();
    return T_EXIT_PASS;
}
