/*
 * test_dcp_dir.c - DCP checkpoint directories through the C API
 * (ckptio_dcp_*): the table from .metadata, assembling tensors from chunks
 * (torch.save items with strides, SAFETENSORS blobs, zstd, 2 ranks), the
 * manifest verification (whole-item hashes and "parts"), the structural
 * check, consolidation to safetensors, and refusals (traversal, unknown
 * transforms, bad chunk dims, gaps, overlaps, truncated data files), and
 * hostile input: byte items whose pickle names a disallowed global, zstd
 * decompression bombs, the tiling check on 200k chunks and random tilings.
 *
 * Fixtures: tests/data/dcp/, made once by tests/data/make_dcp_fixtures.py
 * with stock torch and ckptio.dcp; NAME.expected.safetensors holds the
 * full tensors each directory must assemble to.
 */
#include "common_internal.h"
#include "dcp_dir_internal.h"
#include "helpers.h"

#include <dirent.h>
#include <jansson.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static ckptio_engine *engine;

static const char *data_path(const char *name) { return t_data_path("dcp", name); }

/* Copies fixture directory `name` into the test's temporary directory. */
static const char *copy_fixture(const char *name, const char *as) {
    static char dst[1024];
    snprintf(dst, sizeof dst, "%s/%s", t_tmpdir(), as);
    T_ASSERT(mkdir(dst, 0755) == 0);
    const char *src = data_path(name);
    DIR *d = opendir(src);
    T_ASSERT(d != NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char from[1600], to[1600];
        snprintf(from, sizeof from, "%s/%s", src, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
        size_t len = 0;
        void *bytes = t_read_file(from, &len);
        t_write_file(to, bytes, len);
        free(bytes);
    }
    closedir(d);
    return dst;
}

static void replace_metadata(const char *dir, const char *bad) {
    size_t len = 0;
    void *bytes = t_read_file(data_path(bad), &len);
    char to[1200];
    snprintf(to, sizeof to, "%s/.metadata", dir);
    t_write_file(to, bytes, len);
    free(bytes);
}

/* Every tensor of NAME.expected.safetensors assembles to the same bytes. */
static void check_assembles(const char *name) {
    char exp_name[256];
    snprintf(exp_name, sizeof exp_name, "%s.expected.safetensors", name);
    ckptio_safetensors *st = NULL;
    ckptio_dcp *h = NULL;
    T_OK(ckptio_safetensors_open(engine, data_path(exp_name), &st));
    T_OK(ckptio_dcp_open(engine, data_path(name), &h));
    size_t n = 0, m = 0;
    T_OK(ckptio_safetensors_count(st, &n));
    T_OK(ckptio_dcp_tensor_count(h, &m));
    T_ASSERT_MSG(n == m, "%s: %zu expected tensors, %zu in the checkpoint", name, n, m);
    for (size_t i = 0; i < n; i++) {
        ckptio_tensor_info ti;
        T_OK(ckptio_safetensors_tensor(st, i, &ti));
        void *want = malloc(ti.nbytes + 1), *got = malloc(ti.nbytes + 1);
        ckptio_tensor_target tg = {.index = i, .data = want, .capacity = ti.nbytes, .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_safetensors_read(st, &tg, 1));
        size_t idx = 0;
        T_OK(ckptio_dcp_find(h, ti.name, &idx));
        ckptio_dcp_tensor_info di;
        T_OK(ckptio_dcp_tensor(h, idx, &di));
        T_ASSERT(di.dtype == ti.dtype && di.ndim == ti.ndim && di.nbytes == ti.nbytes);
        for (uint32_t d = 0; d < di.ndim; d++) T_ASSERT(di.shape[d] == ti.shape[d]);
        memset(got, 0xAB, ti.nbytes + 1);
        T_OK(ckptio_dcp_read_tensor(h, idx, got, ti.nbytes));
        T_ASSERT_MSG(memcmp(want, got, ti.nbytes) == 0, "%s: tensor '%s' assembled wrong", name, ti.name);
        free(want);
        free(got);
    }
    ckptio_dcp_close(h);
    ckptio_safetensors_close(st);
}

static void test_table(void) {
    ckptio_dcp *h = NULL;
    T_OK(ckptio_dcp_open(engine, data_path("ts"), &h));
    size_t n = 0;
    T_OK(ckptio_dcp_tensor_count(h, &n));
    T_ASSERT(n == 5);
    T_OK(ckptio_dcp_bytes_count(h, &n));
    T_ASSERT(n == 1);
    ckptio_dcp_bytes_info bi;
    T_OK(ckptio_dcp_bytes(h, 0, &bi));
    T_ASSERT(strcmp(bi.fqn, "step") == 0 && strcmp(bi.stored.file, "__0_0.distcp") == 0 && bi.stored.offset == 0);
    T_OK(ckptio_dcp_file_count(h, &n));
    T_ASSERT(n == 1);
    size_t i = 0;
    ckptio_dcp_tensor_info ti;
    T_OK(ckptio_dcp_find(h, "w", &i));
    T_OK(ckptio_dcp_tensor(h, i, &ti));
    T_ASSERT(ti.dtype == CKPTIO_DTYPE_F32 && ti.ndim == 2 && ti.shape[0] == 3 && ti.shape[1] == 4 && ti.nbytes == 48 &&
             ti.chunks == 1);
    T_OK(ckptio_dcp_find(h, "nested.m", &i));
    T_OK(ckptio_dcp_find(h, "s", &i));
    T_OK(ckptio_dcp_tensor(h, i, &ti));
    T_ASSERT(ti.ndim == 0 && ti.nbytes == 8 && ti.dtype == CKPTIO_DTYPE_F64);
    T_STATUS(ckptio_dcp_find(h, "nope", &i), CKPTIO_E_NOT_FOUND);
    T_STATUS(ckptio_dcp_tensor(h, 99, &ti), CKPTIO_E_RANGE);
    const char *mname = NULL;
    T_STATUS(ckptio_dcp_manifest(h, &mname), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("no ckptio manifest");
    ckptio_dcp_verify_report r;
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_dcp_check(h, &r));
    T_ASSERT(r.items == 6 && r.checked == 6);
    /* The byte item is torch.save(7): a zip archive. */
    uint8_t buf[4096];
    uint64_t len = 0;
    T_OK(ckptio_dcp_read_bytes(h, 0, buf, sizeof buf, &len));
    T_ASSERT(len == bi.stored.length && memcmp(buf, "PK\x03\x04", 4) == 0);
    T_STATUS(ckptio_dcp_read_bytes(h, 0, buf, 10, &len), CKPTIO_E_RANGE);
    /* Too small a destination for a tensor. */
    T_OK(ckptio_dcp_find(h, "w", &i));
    T_STATUS(ckptio_dcp_read_tensor(h, i, buf, 47), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("w: destination holds 47 bytes, the tensor needs 48");
    ckptio_dcp_close(h);
}

static void test_sharded_table(void) {
    ckptio_dcp *h = NULL;
    T_OK(ckptio_dcp_open(engine, data_path("sharded"), &h));
    size_t i = 0, nfiles = 0;
    ckptio_dcp_tensor_info ti;
    ckptio_dcp_chunk_info ci;
    T_OK(ckptio_dcp_find(h, "A", &i));
    T_OK(ckptio_dcp_tensor(h, i, &ti));
    T_ASSERT(ti.chunks == 2 && ti.shape[0] == 5 && ti.shape[1] == 3);
    T_OK(ckptio_dcp_chunk(h, i, 1, &ci));
    T_ASSERT(ci.offsets[0] == 3 && ci.offsets[1] == 0 && ci.sizes[0] == 2 && ci.sizes[1] == 3);
    T_ASSERT(strncmp(ci.stored.file, "__1_", 4) == 0 && ci.stored.transforms == 0);
    T_STATUS(ckptio_dcp_chunk(h, i, 2, &ci), CKPTIO_E_RANGE);
    T_OK(ckptio_dcp_file_count(h, &nfiles));
    T_ASSERT(nfiles == 2);
    const char *f0 = NULL, *f1 = NULL, *mname = NULL;
    T_OK(ckptio_dcp_file(h, 0, &f0));
    T_OK(ckptio_dcp_file(h, 1, &f1));
    T_ASSERT(strcmp(f0, f1) < 0);
    T_OK(ckptio_dcp_manifest(h, &mname));
    T_ASSERT(strncmp(mname, ".ckptio-manifest-", 17) == 0 && strncmp(mname + 17, f0 + 4, 12) == 0);
    ckptio_dcp_verify_report r;
    T_OK(ckptio_dcp_verify(h, &r));
    T_ASSERT(r.items == 6 && r.checked == 6 && r.unhashed == 0 && r.bytes > 0);
    ckptio_dcp_close(h);

    /* zstd items: transforms flagged, verify and assembly work. */
    T_OK(ckptio_dcp_open(engine, data_path("zstd"), &h));
    T_OK(ckptio_dcp_find(h, "w", &i));
    T_OK(ckptio_dcp_chunk(h, i, 0, &ci));
    T_ASSERT(ci.stored.transforms == CKPTIO_DCP_TRANSFORM_ZSTD);
    T_OK(ckptio_dcp_verify(h, &r));
    T_ASSERT(r.items == 6 && r.checked == 6);
    uint8_t buf[4096];
    uint64_t len = 0;
    T_OK(ckptio_dcp_read_bytes(h, 0, buf, sizeof buf, &len));
    T_ASSERT(len > 4 && memcmp(buf, "PK\x03\x04", 4) == 0);
    ckptio_dcp_close(h);
}

static void test_assemble(void) {
    check_assembles("ts");
    check_assembles("st");
    check_assembles("zstd");
    check_assembles("sharded");
    check_assembles("sharded_torch");
    ckptio_dcp *h = NULL;
    ckptio_dcp_verify_report r;
    const char *fixtures[] = {"st", "sharded_torch", "zstd", "sharded"};
    for (size_t k = 0; k < 4; k++) {
        T_OK(ckptio_dcp_open(engine, data_path(fixtures[k]), &h));
        T_OK(ckptio_dcp_check(h, &r));
        T_ASSERT(r.items == r.checked && r.items >= 4);
        ckptio_dcp_close(h);
    }
}

/* The item of tensor `fqn` chunk `c`: its file's path and offset/length. */
static void chunk_file(ckptio_dcp *h, const char *dir, const char *fqn, size_t c, char *path, size_t cap,
                       ckptio_dcp_stored *s) {
    size_t i = 0;
    ckptio_dcp_chunk_info ci;
    T_OK(ckptio_dcp_find(h, fqn, &i));
    T_OK(ckptio_dcp_chunk(h, i, c, &ci));
    snprintf(path, cap, "%s/%s", dir, ci.stored.file);
    *s = ci.stored;
}

static void flip_byte(const char *path, uint64_t offset) {
    size_t len = 0;
    uint8_t *bytes = t_read_file(path, &len);
    T_ASSERT(offset < len);
    bytes[offset] ^= 0x5A;
    t_write_file(path, bytes, len);
    free(bytes);
}

static void test_verify_detects_flipped_byte(void) {
    const char *dir = copy_fixture("sharded", "flip");
    ckptio_dcp *h = NULL;
    char path[1200], want[1300];
    ckptio_dcp_stored s;
    T_OK(ckptio_dcp_open(engine, dir, &h));
    chunk_file(h, dir, "A", 1, path, sizeof path, &s);
    ckptio_dcp_close(h);
    flip_byte(path, s.offset + s.length / 2);
    T_OK(ckptio_dcp_open(engine, dir, &h));
    ckptio_dcp_verify_report r;
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("'A'");
    T_MESSAGE_HAS(strrchr(path, '/') + 1);
    snprintf(want, sizeof want, "offset %llu", (unsigned long long)s.offset);
    T_MESSAGE_HAS(want);
    T_ASSERT(ckptio_last_error()->file_offset == (int64_t)s.offset);
    T_ASSERT(strcmp(ckptio_last_error()->subject, "A") == 0);
    ckptio_dcp_close(h);
}

/* The path of the ckptio manifest of checkpoint `dir` (a static buffer). */
static const char *manifest_path(const char *dir) {
    static char path[1200];
    ckptio_dcp *h = NULL;
    const char *mname = NULL;
    T_OK(ckptio_dcp_open(engine, dir, &h));
    T_OK(ckptio_dcp_manifest(h, &mname));
    snprintf(path, sizeof path, "%s/%s", dir, mname);
    ckptio_dcp_close(h);
    return path;
}

/* Rewrites item `which` of the manifest: xxh3 null and, with nparts > 0,
 * "parts" cutting it in two. */
static void rewrite_manifest(const char *dir, size_t which, int with_parts) {
    const char *mpath = manifest_path(dir);
    json_error_t err;
    json_t *root = json_load_file(mpath, 0, &err);
    T_ASSERT(root != NULL);
    json_t *item = json_array_get(json_object_get(root, "items"), which);
    T_ASSERT(item != NULL);
    json_object_set_new(item, "xxh3", json_null());
    if (with_parts) {
        char fpath[1200];
        snprintf(fpath, sizeof fpath, "%s/%s", dir, json_string_value(json_object_get(item, "file")));
        size_t len = 0;
        uint8_t *bytes = t_read_file(fpath, &len);
        const uint64_t off = (uint64_t)json_integer_value(json_object_get(item, "data_offset"));
        const uint64_t n = (uint64_t)json_integer_value(json_object_get(item, "nbytes"));
        const uint64_t cut = n / 3;
        uint64_t h1 = 0, h2 = 0;
        T_OK(ckptio_hash_xxh3(bytes + off, cut, &h1));
        T_OK(ckptio_hash_xxh3(bytes + off + cut, n - cut, &h2));
        char x1[17], x2[17];
        snprintf(x1, sizeof x1, "%016llx", (unsigned long long)h1);
        snprintf(x2, sizeof x2, "%016llx", (unsigned long long)h2);
        json_object_set_new(item, "parts", json_pack("[[I,I,s],[I,I,s]]", (json_int_t)0, (json_int_t)cut, x1,
                                                     (json_int_t)cut, (json_int_t)(n - cut), x2));
        free(bytes);
    }
    T_ASSERT(json_dump_file(root, mpath, JSON_INDENT(1)) == 0);
    json_decref(root);
}

static void test_verify_parts_and_unhashed(void) {
    const char *dir = copy_fixture("sharded", "parts");
    rewrite_manifest(dir, 0, 1);
    rewrite_manifest(dir, 1, 0);
    ckptio_dcp *h = NULL;
    ckptio_dcp_verify_report r;
    T_OK(ckptio_dcp_open(engine, dir, &h));
    T_OK(ckptio_dcp_verify(h, &r));
    T_ASSERT(r.items == 6 && r.checked == 5 && r.unhashed == 1);
    /* Item 0 is A chunk 0 in rank 0's file; flip a byte in its second part. */
    char path[1200];
    ckptio_dcp_stored s;
    chunk_file(h, dir, "A", 0, path, sizeof path, &s);
    ckptio_dcp_close(h);
    flip_byte(path, s.offset + s.length - 3);
    T_OK(ckptio_dcp_open(engine, dir, &h));
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("part 1");
    T_MESSAGE_HAS("'A'");
    ckptio_dcp_close(h);
}

static void test_manifest_mismatch(void) {
    const char *dir = copy_fixture("sharded", "mismatch");
    char mpath[1200];
    snprintf(mpath, sizeof mpath, "%s", manifest_path(dir));
    ckptio_dcp *h = NULL;
    T_OK(ckptio_dcp_open(engine, dir, &h));
    json_t *root = json_load_file(mpath, 0, NULL);
    json_array_remove(json_object_get(root, "items"), 2);
    T_ASSERT(json_dump_file(root, mpath, 0) == 0);
    ckptio_dcp_verify_report r;
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("the manifest lists 5 items, .metadata 6");
    /* A manifest item pointing outside its directory is refused at parse. */
    json_object_set_new(json_array_get(json_object_get(root, "items"), 0), "file", json_string("../x"));
    T_ASSERT(json_dump_file(root, mpath, 0) == 0);
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("items[0]");
    T_MESSAGE_HAS("plain file name");
    json_decref(root);
    t_write_file(mpath, "{", 1);
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not valid JSON");
    unlink(mpath);
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS(strrchr(mpath, '/') + 1);
    ckptio_dcp_close(h);
}

static void test_truncated_data_file(void) {
    const char *dir = copy_fixture("ts", "trunc");
    char path[1200];
    snprintf(path, sizeof path, "%s/__0_0.distcp", dir);
    T_ASSERT(truncate(path, 4000) == 0);
    ckptio_dcp *h = NULL;
    T_OK(ckptio_dcp_open(engine, dir, &h)); /* data files are not read at open */
    size_t n = 0;
    ckptio_status worst = CKPTIO_OK;
    T_OK(ckptio_dcp_tensor_count(h, &n));
    uint8_t buf[256];
    for (size_t i = 0; i < n; i++) {
        ckptio_status st = ckptio_dcp_read_tensor(h, i, buf, sizeof buf);
        if (st != CKPTIO_OK) {
            T_ASSERT(st == CKPTIO_E_TRUNCATED);
            T_MESSAGE_HAS("__0_0.distcp");
            T_MESSAGE_HAS("runs past the end of the file (4000 bytes)");
            worst = st;
        }
    }
    T_ASSERT(worst == CKPTIO_E_TRUNCATED);
    ckptio_dcp_verify_report r;
    T_STATUS(ckptio_dcp_check(h, &r), CKPTIO_E_TRUNCATED);
    T_ASSERT(r.checked < r.items);
    ckptio_dcp_close(h);
}

static void expect_open_fails(const char *fixture, const char *bad, ckptio_status want, const char *needle) {
    char as[64];
    snprintf(as, sizeof as, "open-%s", bad);
    const char *dir = copy_fixture(fixture, as);
    replace_metadata(dir, bad);
    ckptio_dcp *h = (ckptio_dcp *)1;
    T_STATUS(ckptio_dcp_open(engine, dir, &h), want);
    T_ASSERT(h == NULL);
    T_MESSAGE_HAS(needle);
    T_MESSAGE_HAS("/.metadata");
}

static void test_refusals(void) {
    expect_open_fails("ts", "bad_traversal.metadata", CKPTIO_E_FORMAT, "relative_path '../evil.distcp' leaves");
    expect_open_fails("ts", "bad_absolute.metadata", CKPTIO_E_FORMAT, "relative_path '/etc/passwd' leaves");
    expect_open_fails("ts", "bad_transform.metadata", CKPTIO_E_UNSUPPORTED, "unsupported transform 'stream.gzip/1'");
    expect_open_fails("ts", "bad_dims.metadata", CKPTIO_E_FORMAT,
                      "state_dict_metadata['w']: chunk 0 has 3 offsets for a 2-d tensor");
    ckptio_dcp *h = NULL;
    T_STATUS(ckptio_dcp_open(engine, t_path("missing"), &h), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("missing/.metadata");

    /* Gaps and overlaps open (the table is valid) but do not assemble. */
    const char *dir = copy_fixture("ts", "gap");
    replace_metadata(dir, "bad_gap.metadata");
    size_t i = 0;
    uint8_t buf[256];
    ckptio_dcp_verify_report r;
    T_OK(ckptio_dcp_open(engine, dir, &h));
    T_OK(ckptio_dcp_find(h, "w", &i));
    T_STATUS(ckptio_dcp_read_tensor(h, i, buf, sizeof buf), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("w: the 1 chunks cover 8 of the tensor's 12 elements");
    T_STATUS(ckptio_dcp_check(h, &r), CKPTIO_E_FORMAT);
    ckptio_dcp_close(h);
    dir = copy_fixture("sharded", "overlap");
    replace_metadata(dir, "bad_overlap.metadata");
    T_OK(ckptio_dcp_open(engine, dir, &h));
    T_OK(ckptio_dcp_find(h, "A", &i));
    T_STATUS(ckptio_dcp_read_tensor(h, i, buf, sizeof buf), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("A: chunks 0 and 1 overlap");
    ckptio_dcp_close(h);
}

/* torch <= 2.2 pickled TensorProperties and MEM_FORMAT_ENCODING from
 * torch.distributed._shard.sharded_tensor.metadata (state tuples of 5
 * fields): written by torch 2.2.2 and, as torch's own compatibility test
 * makes one, by this torch with the old class patched in. Both read like
 * the current classes; an enum value torch does not define is refused. */
static void test_legacy_metadata(void) {
    const char *fixtures[] = {"legacy_torch22", "legacy_compat"};
    for (size_t k = 0; k < 2; k++) {
        check_assembles(fixtures[k]);
        ckptio_dcp *h = NULL;
        ckptio_dcp_verify_report r;
        size_t nt = 0, nb = 0;
        T_OK(ckptio_dcp_open(engine, data_path(fixtures[k]), &h));
        T_OK(ckptio_dcp_tensor_count(h, &nt));
        T_OK(ckptio_dcp_bytes_count(h, &nb));
        T_ASSERT_MSG(nt == 5 && nb == 1, "%s: %zu tensors, %zu byte items", fixtures[k], nt, nb);
        T_OK(ckptio_dcp_check(h, &r));
        T_ASSERT(r.items == 6 && r.checked == 6);
        ckptio_dcp_close(h);
    }
    expect_open_fails("legacy_torch22", "bad_memformat.metadata", CKPTIO_E_FORMAT,
                      "state_dict_metadata['w']: TensorProperties.memory_format 7 is not a member");
}

/* ---- hostile input ------------------------------------------------------------ */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A tensor of the table built in memory, for the tiling check. */
typedef struct tiling_case {
    ckptio__dcp_tensor t;
    ckptio_dcp h;
} tiling_case;

static void tiling_init(tiling_case *tc, uint32_t ndim, const int64_t *shape, size_t nchunks) {
    memset(tc, 0, sizeof *tc);
    tc->h.md_path = (char *)"mem/.metadata";
    tc->t.fqn = (char *)"T";
    tc->t.ndim = ndim;
    tc->t.shape = (int64_t *)shape;
    tc->t.numel = 1;
    for (uint32_t d = 0; d < ndim; d++) tc->t.numel *= (uint64_t)shape[d];
    tc->t.nchunks = nchunks;
    tc->t.offsets = calloc(nchunks * ndim + 1, sizeof *tc->t.offsets);
    tc->t.sizes = calloc(nchunks * ndim + 1, sizeof *tc->t.sizes);
    T_ASSERT(tc->t.offsets && tc->t.sizes);
}

static void tiling_free(tiling_case *tc) {
    free(tc->t.offsets);
    free(tc->t.sizes);
}

static void set_chunk(tiling_case *tc, size_t c, const int64_t *off, const int64_t *size) {
    memcpy(tc->t.offsets + c * tc->t.ndim, off, tc->t.ndim * sizeof *off);
    memcpy(tc->t.sizes + c * tc->t.ndim, size, tc->t.ndim * sizeof *size);
}

/* The pairwise definition (quadratic, for small cases): inside, disjoint, volume. */
static bool tiles_exactly(const ckptio__dcp_tensor *t) {
    const uint32_t nd = t->ndim;
    uint64_t total = 0;
    for (size_t c = 0; c < t->nchunks; c++) {
        uint64_t vol = 1;
        for (uint32_t d = 0; d < nd; d++) vol *= (uint64_t)t->sizes[c * nd + d];
        total += vol;
        for (size_t o = 0; vol && o < c; o++) {
            bool meet = true, empty = false;
            for (uint32_t d = 0; d < nd; d++) {
                const int64_t a0 = t->offsets[c * nd + d], a1 = a0 + t->sizes[c * nd + d];
                const int64_t b0 = t->offsets[o * nd + d], b1 = b0 + t->sizes[o * nd + d];
                meet = meet && a0 < b1 && b0 < a1;
                empty = empty || b0 == b1;
            }
            if (meet && !empty) return false;
        }
    }
    return total == t->numel;
}

/* Guillotine cuts: a random exact tiling of the box [lo, hi). */
static void random_tiling(tiling_case *tc, size_t *n, const int64_t *lo, const int64_t *hi, uint64_t *rng,
                          int depth) {
    const uint32_t nd = tc->t.ndim;
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t d = (uint32_t)(*rng >> 33) % nd;
    if (depth == 0 || hi[d] - lo[d] < 2) {
        int64_t size[8];
        for (uint32_t k = 0; k < nd; k++) size[k] = hi[k] - lo[k];
        set_chunk(tc, (*n)++, lo, size);
        return;
    }
    const int64_t cut = lo[d] + 1 + (int64_t)((*rng >> 13) % (uint64_t)(hi[d] - lo[d] - 1));
    int64_t mid_hi[8], mid_lo[8];
    memcpy(mid_hi, hi, nd * sizeof *hi);
    memcpy(mid_lo, lo, nd * sizeof *lo);
    mid_hi[d] = cut;
    mid_lo[d] = cut;
    random_tiling(tc, n, lo, mid_hi, rng, depth - 1);
    random_tiling(tc, n, mid_lo, hi, rng, depth - 1);
}

/* The public check ckptio.dcp's reader calls per tensor (ckptio_dcp_check_chunks): the same tiling, plus the
 * bounds ckptio_dcp_open checks, from plain arrays; without `whole` (a rank's own metadata) the bounds only. */
static void test_check_chunks_api(void) {
    static const int64_t shape[2] = {7, 10}, rows[4] = {0, 2, 3, 7}, cols[5] = {0, 1, 5, 6, 10};
    int64_t off[24], size[24];
    for (size_t r = 0; r < 3; r++)
        for (size_t c = 0; c < 4; c++) {
            const size_t i = (r * 4 + c) * 2;
            off[i] = rows[r], off[i + 1] = cols[c];
            size[i] = rows[r + 1] - rows[r], size[i + 1] = cols[c + 1] - cols[c];
        }
    T_OK(ckptio_dcp_check_chunks("d/.metadata", "T", 2, shape, 12, off, size, 1));
    off[5 * 2] -= 1;
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "T", 2, shape, 12, off, size, 1), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("d/.metadata");
    T_MESSAGE_HAS("state_dict_metadata['T']: chunks 1 and 5 overlap");
    off[5 * 2] += 1;
    size[11 * 2 + 1] -= 1;
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "T", 2, shape, 12, off, size, 1), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("state_dict_metadata['T']: the 12 chunks cover 66 of the tensor's 70 elements (a gap)");
    /* a rank's own metadata holds some chunks of the tensor: inside it is enough */
    T_OK(ckptio_dcp_check_chunks("d/__0.metadata", "T", 2, shape, 12, off, size, 0));
    T_OK(ckptio_dcp_check_chunks("d/__0.metadata", "T", 2, shape, 3, off, size, 0));
    size[11 * 2 + 1] += 1;
    off[0] = -2; /* chunk 0 starts before the tensor (torch's planner would place it there) */
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "T", 2, shape, 12, off, size, 1), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("state_dict_metadata['T']: chunk 0 spans [-2, 0) in dimension 0, outside the tensor's size 7");
    T_STATUS(ckptio_dcp_check_chunks("d/__0.metadata", "T", 2, shape, 12, off, size, 0), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("chunk 0 spans [-2, 0) in dimension 0, outside the tensor's size 7");
    off[0] = 0;
    size[11 * 2] = 5; /* the last row of chunks runs past row 7 */
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "T", 2, shape, 12, off, size, 1), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("chunk 11 spans [3, 8) in dimension 0, outside the tensor's size 7");
    size[11 * 2] = 4;
    T_OK(ckptio_dcp_check_chunks(NULL, "T", 2, shape, 12, off, size, 1));
    /* a scalar: one chunk of no dimensions */
    T_OK(ckptio_dcp_check_chunks("d/.metadata", "s", 0, NULL, 1, NULL, NULL, 1));
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "s", 0, NULL, 2, NULL, NULL, 1), CKPTIO_E_FORMAT);
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "s", 0, NULL, 0, NULL, NULL, 1), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("cover 0 of the tensor's 1 elements (a gap)");
    static const int64_t negative[1] = {-1};
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "n", 1, negative, 0, NULL, NULL, 1), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("size[0] is -1");
    int64_t big[CKPTIO_DCP_MAX_NDIM + 1] = {0};
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "b", CKPTIO_DCP_MAX_NDIM + 1, big, 0, NULL, NULL, 1),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("65 dimensions (at most 64)");
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", NULL, 2, shape, 12, off, size, 1), CKPTIO_E_INVAL);
    T_STATUS(ckptio_dcp_check_chunks("d/.metadata", "T", 2, shape, 12, NULL, size, 1), CKPTIO_E_INVAL);
}

static void test_tiling(void) {
    tiling_case tc;
    /* An uneven 3 x 4 grid tiles [7, 10]; moving one chunk by one row makes
     * an overlap and a gap of the same volume. */
    static const int64_t shape2[2] = {7, 10}, rows[4] = {0, 2, 3, 7}, cols[5] = {0, 1, 5, 6, 10};
    tiling_init(&tc, 2, shape2, 12);
    for (size_t r = 0; r < 3; r++)
        for (size_t c = 0; c < 4; c++)
            set_chunk(&tc, r * 4 + c, (int64_t[]){rows[r], cols[c]},
                      (int64_t[]){rows[r + 1] - rows[r], cols[c + 1] - cols[c]});
    T_OK(ckptio__dcp_check_tiling(&tc.h, &tc.t));
    tc.t.offsets[5 * 2] -= 1; /* chunk 5 (row 1, col 1) now starts in row 1, overlapping chunk 1 */
    T_STATUS(ckptio__dcp_check_tiling(&tc.h, &tc.t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("T: chunks 1 and 5 overlap");
    T_MESSAGE_HAS("mem/.metadata");
    tc.t.offsets[5 * 2] += 1;
    tc.t.sizes[11 * 2 + 1] -= 1; /* the last chunk is one column short */
    T_STATUS(ckptio__dcp_check_tiling(&tc.h, &tc.t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("T: the 12 chunks cover 66 of the tensor's 70 elements (a gap)");
    tiling_free(&tc);

    /* Scalars: one chunk tiles it, two overlap; empty chunks cover nothing. */
    tiling_init(&tc, 0, NULL, 2);
    tc.t.nchunks = 1;
    T_OK(ckptio__dcp_check_tiling(&tc.h, &tc.t));
    tc.t.nchunks = 2;
    T_STATUS(ckptio__dcp_check_tiling(&tc.h, &tc.t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("chunks 0 and 1 overlap");
    tiling_free(&tc);
    static const int64_t shape1[1] = {4};
    tiling_init(&tc, 1, shape1, 3);
    set_chunk(&tc, 0, (int64_t[]){0}, (int64_t[]){4});
    set_chunk(&tc, 1, (int64_t[]){2}, (int64_t[]){0});
    set_chunk(&tc, 2, (int64_t[]){4}, (int64_t[]){0});
    T_OK(ckptio__dcp_check_tiling(&tc.h, &tc.t));
    tiling_free(&tc);

    /* Random guillotine tilings in 1-4 dimensions pass; each one moved,
     * grown or shrunk by one element (staying inside) fails, as the
     * pairwise definition says. */
    uint64_t rng = 12345;
    size_t mutated = 0;
    for (int round = 0; round < 400; round++) {
        const uint32_t nd = 1 + (uint32_t)(round % 4);
        int64_t shape[8], lo[8] = {0};
        for (uint32_t d = 0; d < nd; d++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            shape[d] = 1 + (int64_t)((rng >> 35) % 9);
        }
        tiling_init(&tc, nd, shape, 64);
        size_t n = 0;
        random_tiling(&tc, &n, lo, shape, &rng, 6);
        tc.t.nchunks = n;
        T_ASSERT(tiles_exactly(&tc.t));
        T_OK(ckptio__dcp_check_tiling(&tc.h, &tc.t));
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const size_t c = (size_t)(rng >> 40) % n;
        const uint32_t d = (uint32_t)(rng >> 20) % nd;
        int64_t *off = &tc.t.offsets[c * nd + d], *size = &tc.t.sizes[c * nd + d];
        if (*off > 0) (*off)--;                 /* move down */
        else if (*off + *size < shape[d]) (*size)++; /* grow */
        else if (*size > 0) (*size)--;          /* shrink */
        const bool exact = tiles_exactly(&tc.t);
        const ckptio_status st = ckptio__dcp_check_tiling(&tc.h, &tc.t);
        T_ASSERT_MSG((st == CKPTIO_OK) == exact, "round %d: check says %d, the definition %d", round, (int)st,
                     (int)exact);
        mutated += !exact;
        tiling_free(&tc);
    }
    T_ASSERT(mutated > 300);

    /* 200k chunks (a hostile .metadata splitting one tensor into elements,
     * and a 450 x 450 grid): linear time, not the pairwise comparison. */
    static const int64_t big1[1] = {200000};
    tiling_init(&tc, 1, big1, 200000);
    for (size_t c = 0; c < 200000; c++) set_chunk(&tc, c, (int64_t[]){(int64_t)(199999 - c)}, (int64_t[]){1});
    double t0 = now_seconds();
    T_OK(ckptio__dcp_check_tiling(&tc.h, &tc.t));
    tc.t.sizes[1000] = 2;
    tc.t.sizes[0] = 0; /* same volume, chunk 1000 overlaps chunk 999 */
    T_STATUS(ckptio__dcp_check_tiling(&tc.h, &tc.t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("chunks 999 and 1000 overlap");
    T_ASSERT_MSG(now_seconds() - t0 < 5, "%.1f s for 200k chunks", now_seconds() - t0);
    tiling_free(&tc);
    static const int64_t grid[2] = {450, 900};
    tiling_init(&tc, 2, grid, 450 * 450);
    for (size_t r = 0; r < 450; r++)
        for (size_t c = 0; c < 450; c++)
            set_chunk(&tc, r * 450 + c, (int64_t[]){(int64_t)r, (int64_t)c * 2}, (int64_t[]){1, 2});
    t0 = now_seconds();
    T_OK(ckptio__dcp_check_tiling(&tc.h, &tc.t));
    T_ASSERT_MSG(now_seconds() - t0 < 5, "%.1f s for a 450 x 450 grid", now_seconds() - t0);
    tiling_free(&tc);
}

static void test_file_open(void) {
    ckptio_file *f = (ckptio_file *)1;
    const char *dir = data_path("ts");
    static const char *const bad[] = {"../ts/__0_0.distcp", "/etc/hostname", "", ".", "..", "sub/x.distcp"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_STATUS(ckptio_dcp_file_open(engine, dir, bad[i], &f), CKPTIO_E_FORMAT);
        T_ASSERT(f == NULL);
        T_MESSAGE_HAS("leaves the checkpoint directory");
    }
    T_OK(ckptio_dcp_file_open(engine, dir, "__0_0.distcp", &f));
    uint64_t size = 0;
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == 9146);
    T_OK(ckptio_file_close(f));
    T_STATUS(ckptio_dcp_file_open(engine, dir, "missing.distcp", &f), CKPTIO_E_NOT_FOUND);
}

static void test_hostile_byte_item(void) {
    ckptio_dcp *h = NULL;
    ckptio_dcp_verify_report r;
    T_OK(ckptio_dcp_open(engine, data_path("hostile_bytes"), &h));
    /* The hashes match the manifest: the bytes are the ones saved, still refused. */
    T_STATUS(ckptio_dcp_verify(h, &r), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("step: byte item (torch.save of a non-tensor value)");
    T_MESSAGE_HAS("global 'posix.system' is not in the allowlist");
    T_MESSAGE_HAS("hostile_bytes/__0_");
    T_ASSERT(r.checked == r.items && r.items == 2);
    T_STATUS(ckptio_dcp_check(h, &r), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("global 'posix.system'");
    T_MESSAGE_HAS("at offset 0: step:");
    /* The raw bytes are still readable as data (nothing is unpickled). */
    uint64_t len = 0;
    uint8_t buf[4096];
    T_OK(ckptio_dcp_read_bytes(h, 0, buf, sizeof buf, &len));
    T_ASSERT(len > 4 && memcmp(buf, "PK\x03\x04", 4) == 0);
    ckptio_dcp_close(h);
}

/* An honest zstd frame of `size` zero bytes in 128 KiB RLE blocks, with or
 * without a content size (tests/data/make_dcp_fixtures.py zstd_rle_frame). */
static uint8_t *zstd_rle_frame(uint64_t size, bool declare, size_t *len) {
    const uint64_t nblocks = (size + (128u << 10) - 1) / (128u << 10);
    uint8_t *out = malloc(16 + nblocks * 4), *p = out;
    T_ASSERT(out);
    const uint32_t magic = 0xFD2FB528u;
    memcpy(p, &magic, 4), p += 4;
    if (declare) {
        *p++ = 0xE0;
        memcpy(p, &size, 8), p += 8;
    } else {
        *p++ = 0x00;
        *p++ = 7 << 3;
    }
    for (uint64_t left = size; left;) {
        const uint32_t n = left < (128u << 10) ? (uint32_t)left : (128u << 10);
        left -= n;
        const uint32_t header = (n << 3) | (1u << 1) | (left == 0);
        *p++ = (uint8_t)header, *p++ = (uint8_t)(header >> 8), *p++ = (uint8_t)(header >> 16), *p++ = 0;
    }
    *len = (size_t)(p - out);
    return out;
}

static long max_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void test_zstd_bomb(void) {
    static const char *const cases[] = {"bad_zstd_bomb_w.metadata", "bad_zstd_bomb_w_nosize.metadata",
                                        "bad_zstd_bomb_step.metadata", "bad_zstd_bomb_step_nosize.metadata"};
    for (size_t i = 0; i < 4; i++) {
        char as[64];
        snprintf(as, sizeof as, "bomb-%zu", i);
        const char *dir = copy_fixture("zstd", as);
        replace_metadata(dir, cases[i]);
        size_t len = 0;
        uint8_t *frame = zstd_rle_frame((uint64_t)4 << 30, i % 2 == 0, &len);
        char path[1200];
        snprintf(path, sizeof path, "%s/bomb.distcp", dir);
        t_write_file(path, frame, len);
        free(frame);
        ckptio_dcp *h = NULL;
        ckptio_dcp_verify_report r;
        T_OK(ckptio_dcp_open(engine, dir, &h));
        const long rss = max_rss_kib();
        const double t0 = now_seconds();
        T_STATUS(ckptio_dcp_check(h, &r), CKPTIO_E_FORMAT);
        /* A frame of zeros without a declared size, for a tensor item, is
         * refused on its first decoded bytes (no zip header), before the
         * bound is reached. */
        const char *why = i == 1 ? "not a torch.save archive" : "decompression bomb";
        T_MESSAGE_HAS(why);
        T_MESSAGE_HAS("bomb.distcp");
        T_MESSAGE_HAS(i < 2 ? "w: zstd item" : "step: zstd byte item");
        /* Refused from the header, or after counting at most the item's bound
         * in scratch memory: 4 GiB is never allocated. */
        T_ASSERT_MSG(now_seconds() - t0 < 20, "%.1f s", now_seconds() - t0);
        T_ASSERT_MSG(max_rss_kib() - rss < (256 << 10), "peak RSS grew by %ld KiB", max_rss_kib() - rss);
        if (i < 2) {
            uint8_t out[64];
            size_t w = 0;
            T_OK(ckptio_dcp_find(h, "w", &w));
            T_STATUS(ckptio_dcp_read_tensor(h, w, out, sizeof out), CKPTIO_E_FORMAT);
            T_MESSAGE_HAS(why);
        }
        ckptio_dcp_close(h);
    }
}

static void test_save_safetensors(void) {
    ckptio_dcp *h = NULL;
    T_OK(ckptio_dcp_open(engine, data_path("sharded"), &h));
    const char *out = t_path("all.safetensors");
    const ckptio_kv meta[] = {{"format", "pt"}};
    T_OK(ckptio_dcp_save_safetensors(h, out, NULL, 0, meta, 1, 0));
    size_t expected_len = 0, got_len = 0;
    /* Same tensors, same bytes as the expected file (which safetensors wrote). */
    ckptio_safetensors *a = NULL, *b = NULL;
    T_OK(ckptio_safetensors_open(engine, out, &a));
    T_OK(ckptio_safetensors_open(engine, data_path("sharded.expected.safetensors"), &b));
    size_t na = 0, nb = 0;
    T_OK(ckptio_safetensors_count(a, &na));
    T_OK(ckptio_safetensors_count(b, &nb));
    T_ASSERT(na == 3 && nb == 3);
    for (size_t i = 0; i < na; i++) {
        ckptio_tensor_info ta, tb;
        size_t j = 0;
        T_OK(ckptio_safetensors_tensor(a, i, &ta));
        T_OK(ckptio_safetensors_find(b, ta.name, &j));
        T_OK(ckptio_safetensors_tensor(b, j, &tb));
        T_ASSERT(ta.nbytes == tb.nbytes && ta.dtype == tb.dtype);
        uint8_t x[256], y[256];
        ckptio_tensor_target tx = {.index = i, .data = x, .capacity = sizeof x};
        ckptio_tensor_target ty = {.index = j, .data = y, .capacity = sizeof y};
        T_OK(ckptio_safetensors_read(a, &tx, 1));
        T_OK(ckptio_safetensors_read(b, &ty, 1));
        T_ASSERT(memcmp(x, y, ta.nbytes) == 0);
    }
    ckptio_safetensors_close(a);
    ckptio_safetensors_close(b);
    free(t_read_file(data_path("sharded.expected.safetensors"), &expected_len));
    free(t_read_file(out, &got_len));
    T_ASSERT(got_len % 4096 == 0 || got_len > 4096); /* 4 KiB-aligned data section by default */
    /* A subset, reference alignment. */
    size_t idx = 0;
    T_OK(ckptio_dcp_find(h, "B", &idx));
    const char *one = t_path("b.safetensors");
    T_OK(ckptio_dcp_save_safetensors(h, one, &idx, 1, NULL, 0, CKPTIO_SAFETENSORS_ALIGN_8));
    T_OK(ckptio_safetensors_open(engine, one, &a));
    T_OK(ckptio_safetensors_count(a, &na));
    T_ASSERT(na == 1);
    ckptio_safetensors_close(a);
    size_t bad = 99;
    T_STATUS(ckptio_dcp_save_safetensors(h, t_path("x.safetensors"), &bad, 1, NULL, 0, 0), CKPTIO_E_RANGE);
    T_ASSERT(!t_file_exists(t_path("x.safetensors")));
    ckptio_dcp_close(h);

    /* A failed assembly leaves nothing under the name. */
    const char *dir = copy_fixture("ts", "convert-trunc");
    char path[1200];
    snprintf(path, sizeof path, "%s/__0_0.distcp", dir);
    T_ASSERT(truncate(path, 3000) == 0);
    T_OK(ckptio_dcp_open(engine, dir, &h));
    T_STATUS(ckptio_dcp_save_safetensors(h, t_path("t.safetensors"), NULL, 0, NULL, 0, 0), CKPTIO_E_TRUNCATED);
    T_ASSERT(!t_file_exists(t_path("t.safetensors")));
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
    ckptio_dcp_close(h);
}

/* Every allocation failing in turn: a clean E_NOMEM (no leak, no crash
 * under ASan), never another status or a half-built handle. */
static void test_allocation_failures(void) {
    int succeeded = 0;
    for (uint64_t n = 1; n < 20000 && !succeeded; n++) {
        ckptio_dcp *h = NULL;
        ckptio_dcp_verify_report r;
        uint8_t buf[256];
        ckptio__alloc_fail_after(n);
        ckptio_status st = ckptio_dcp_open(engine, data_path("sharded"), &h);
        if (st == CKPTIO_OK) st = ckptio_dcp_verify(h, &r);
        for (size_t i = 0; st == CKPTIO_OK && i < 3; i++) st = ckptio_dcp_read_tensor(h, i, buf, sizeof buf);
        if (st == CKPTIO_OK) st = ckptio_dcp_save_safetensors(h, t_path("nomem.safetensors"), NULL, 0, NULL, 0, 0);
        ckptio__alloc_fail_after(0);
        T_ASSERT_MSG(st == CKPTIO_OK || st == CKPTIO_E_NOMEM, "allocation %llu: %s: %s", (unsigned long long)n,
                     ckptio_status_name(st), ckptio_last_error_message());
        if (st != CKPTIO_OK) T_ASSERT(!t_file_exists(t_path("nomem.safetensors")));
        succeeded = st == CKPTIO_OK;
        ckptio_dcp_close(h);
    }
    T_ASSERT(succeeded);
}

/* Whose files a .metadata names decides whether its chunks must tile every
 * tensor: several ranks' (torch's planner checked it), or one process's,
 * which may hold its own shard of a tensor. The sharded fixtures' gap and
 * overlap cases above are several ranks'; test_cli_dcp.py has a one-process
 * shard through verify, convert and both readers. */
static void test_saved_by_ranks(void) {
    const char *two[] = {"__0_0.distcp", "__1_0.distcp"};
    const char *ckptio_two[] = {"__0_80b4e47c5ac9_0.distcp", "__1_80b4e47c5ac9_0.distcp"};
    const char *one[] = {"__0_0.distcp", "__0_1.distcp", "__0_80b4e47c5ac9_0.distcp"};
    const char *padded[] = {"__0_0.distcp", "__00_0.distcp"}; /* digits differ: two ranks, as in Python */
    const char *unnamed[] = {"data.distcp", "__x_0.distcp", "___0.distcp", "__12", NULL, "__3_0.distcp"};
    const char *mixed[] = {"model.bin", NULL, "__3_0.distcp", "__4_0.distcp"};
    T_ASSERT(ckptio_dcp_saved_by_ranks(two, 2) == 1);
    T_ASSERT(ckptio_dcp_saved_by_ranks(ckptio_two, 2) == 1);
    T_ASSERT(ckptio_dcp_saved_by_ranks(one, 3) == 0);
    T_ASSERT(ckptio_dcp_saved_by_ranks(padded, 2) == 1);
    T_ASSERT(ckptio_dcp_saved_by_ranks(unnamed, 6) == 0);
    T_ASSERT(ckptio_dcp_saved_by_ranks(mixed, 4) == 1);
    T_ASSERT(ckptio_dcp_saved_by_ranks(two, 1) == 0);
    T_ASSERT(ckptio_dcp_saved_by_ranks(NULL, 3) == 0);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_table);
    T_RUN(test_sharded_table);
    T_RUN(test_assemble);
    T_RUN(test_verify_detects_flipped_byte);
    T_RUN(test_verify_parts_and_unhashed);
    T_RUN(test_manifest_mismatch);
    T_RUN(test_truncated_data_file);
    T_RUN(test_refusals);
    T_RUN(test_legacy_metadata);
    T_RUN(test_tiling);
    T_RUN(test_file_open);
    T_RUN(test_check_chunks_api);
    T_RUN(test_saved_by_ranks);
    T_RUN(test_hostile_byte_item);
    T_RUN(test_zstd_bomb);
    T_RUN(test_save_safetensors);
    T_RUN(test_allocation_failures);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
