/*
 * test_dcp_dir.c - DCP checkpoint directories through the C API
 * (ckptio_dcp_*): the table from .metadata, assembling tensors from chunks
 * (torch.save items with strides, SAFETENSORS blobs, zstd, 2 ranks), the
 * manifest verification (whole-item hashes and "parts"), the structural
 * check, consolidation to safetensors, and refusals (traversal, unknown
 * transforms, bad chunk dims, gaps, overlaps, truncated data files).
 * Hostile input (byte items, zstd bombs, the tiling check at scale):
 * test_dcp_hostile.c.
 *
 * Fixtures: tests/data/dcp/, made once by tests/data/make_dcp_fixtures.py
 * with stock torch and ckptio.dcp; NAME.expected.safetensors holds the
 * full tensors each directory must assemble to.
 */
#include "common_internal.h"
#include "dcp_dir_internal.h"
#include "dcp_dir_helpers.h"

#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    T_RUN(test_saved_by_ranks);
    T_RUN(test_save_safetensors);
    T_RUN(test_allocation_failures);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
