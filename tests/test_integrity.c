/*
 * test_integrity.c - checksum manifests beside safetensors files: what the
 * save writes, verification of good files, a flipped bit and a truncated
 * file named by tensor, file and byte range, stale and foreign manifests
 * (CKPTIO_E_STALE, also for a manifest of another save of the same layout,
 * bound by the save id), version 1 manifests without a save id, the save
 * id in the header, loads verified on request, GPU (simulated) sources,
 * and the manifest
 * parser's refusals of hostile text (path traversal, absolute paths,
 * overflowing offsets, allocation bombs, oversized files).
 */
#include "gpu_sim.h"
#include "helpers.h"
#include "manifest_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MIB (1024u * 1024u)

static ckptio_engine *engine;

/* Three tensors: 9 MiB + 5 bytes (three blocks, the last short), 4 KiB,
 * and an empty one. */
static const size_t big_n = 9 * MIB + 5;
static unsigned char *big, *small;
static int64_t big_shape[1] = {9 * MIB + 5}, small_shape[2] = {64, 64}, empty_shape[1] = {0};

static void sources(ckptio_tensor_source src[3], uint64_t seed) {
    t_fill_random(big, big_n, seed);
    t_fill_random(small, 4096, seed + 1);
    src[0] = (ckptio_tensor_source){"big", CKPTIO_DTYPE_U8, 1, big_shape, big, big_n, CKPTIO_MEM_HOST};
    src[1] = (ckptio_tensor_source){"small", CKPTIO_DTYPE_U8, 2, small_shape, small, 4096, CKPTIO_MEM_HOST};
    src[2] = (ckptio_tensor_source){"empty", CKPTIO_DTYPE_F32, 1, empty_shape, NULL, 0, CKPTIO_MEM_HOST};
}

static const char *manifest_of(const char *path) {
    static char buf[1024];
    T_OK(ckptio_manifest_path(path, buf, sizeof buf));
    return buf;
}

static void save(const char *path, uint64_t seed, unsigned flags) {
    ckptio_tensor_source src[3];
    sources(src, seed);
    T_OK(ckptio_safetensors_save(engine, path, src, 3, NULL, 0, flags));
}

static ckptio_status verify(const char *path, ckptio_verify_report *r) {
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    ckptio_status s = ckptio_safetensors_verify(st, NULL, r);
    ckptio_safetensors_close(st);
    return s;
}

static void test_manifest_written_and_verified(void) {
    const char *path = t_path("m.safetensors");
    save(path, 1, CKPTIO_SAFETENSORS_CHECKSUMS);
    T_ASSERT(t_file_exists(manifest_of(path)));
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
    /* The manifest is parseable and says what the file holds. */
    size_t len;
    char *text = t_read_file(manifest_of(path), &len);
    ckptio__manifest m;
    T_OK(ckptio__manifest_parse(text, len, "m", &m));
    T_ASSERT(strcmp(m.file, "m.safetensors") == 0 && m.count == 3 && m.block_bytes == 4 * MIB);
    struct stat sb;
    T_ASSERT(stat(path, &sb) == 0 && m.file_size == (uint64_t)sb.st_size && m.data_offset == 4096);
    const size_t b = ckptio__manifest_find(&m, "big");
    T_ASSERT(b != SIZE_MAX && m.tensors[b].nblocks == 3 && m.tensors[b].nbytes == big_n);
    T_ASSERT(m.tensors[ckptio__manifest_find(&m, "empty")].nblocks == 0);
    ckptio__manifest_cleanup(&m);
    free(text);

    ckptio_verify_report r;
    T_OK(verify(path, &r));
    T_ASSERT(r.tensors == 3 && r.blocks == 4 && r.bytes == big_n + 4096);

    /* Verified load into host memory. */
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    size_t ib, is;
    T_OK(ckptio_safetensors_find(st, "big", &ib));
    T_OK(ckptio_safetensors_find(st, "small", &is));
    unsigned char *got = malloc(big_n), *got2 = malloc(4096);
    ckptio_tensor_target tg[2] = {{ib, got, big_n, CKPTIO_MEM_HOST}, {is, got2, 4096, CKPTIO_MEM_HOST}};
    T_OK(ckptio_safetensors_read_verified(st, NULL, tg, 2));
    T_ASSERT(memcmp(got, big, big_n) == 0 && memcmp(got2, small, 4096) == 0);
    /* GPU targets are refused before any byte moves. */
    tg[1].mem_kind = CKPTIO_MEM_CUDA;
    T_STATUS(ckptio_safetensors_read_verified(st, NULL, tg, 2), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("verify: small: target 1 is GPU memory");
    T_MESSAGE_HAS("host memory only");
    ckptio_safetensors_close(st);
    free(got);
    free(got2);
}

static void test_flipped_bit_and_truncation(void) {
    const char *path = t_path("flip.safetensors");
    save(path, 2, CKPTIO_SAFETENSORS_CHECKSUMS);
    /* One bit in the second block of "big": named with its byte range. */
    const off_t at = 4096 + 4 * MIB + 12345;
    int fd = open(path, O_RDWR);
    unsigned char c;
    T_ASSERT(pread(fd, &c, 1, at) == 1);
    c ^= 0x10;
    T_ASSERT(pwrite(fd, &c, 1, at) == 1);
    ckptio_verify_report r;
    T_STATUS(verify(path, &r), CKPTIO_E_CHECKSUM);
    const ckptio_error_info *e = ckptio_last_error();
    T_ASSERT(strcmp(e->path, path) == 0 && strcmp(e->subject, "big") == 0);
    T_ASSERT(e->file_offset == 4096 + 4 * MIB);
    T_MESSAGE_HAS("flip.safetensors: verify at offset 4198400: big: checksum mismatch in file bytes [4198400, 8392704) "
                  "(block 1 of 3)");
    T_ASSERT(r.blocks == 1); /* the first block was fine */
    /* A verified load of the damaged tensor fails too; the other passes. */
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    unsigned char *got = malloc(big_n);
    ckptio_tensor_target tg = {0, got, big_n, CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_find(st, "big", &tg.index));
    T_STATUS(ckptio_safetensors_read_verified(st, NULL, &tg, 1), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("block 1 of 3");
    T_OK(ckptio_safetensors_find(st, "small", &tg.index));
    T_OK(ckptio_safetensors_read_verified(st, NULL, &tg, 1));
    ckptio_safetensors_close(st);
    free(got);
    /* Restore it, then damage the header (a shape byte): the manifest no
     * longer describes the file. */
    c ^= 0x10;
    T_ASSERT(pwrite(fd, &c, 1, at) == 1);
    T_OK(verify(path, NULL));
    size_t len;
    char *img = t_read_file(path, &len);
    char *hit = memmem(img, 4096, "[64,64]", 7);
    T_ASSERT(hit);
    T_ASSERT(pwrite(fd, "[8,512]", 7, hit - img) == 7);
    close(fd);
    free(img);
    T_STATUS(verify(path, NULL), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("header: bytes [0, 4096) hash to");
    /* Truncated: the format reader refuses it and names the file. */
    save(path, 2, CKPTIO_SAFETENSORS_CHECKSUMS);
    T_ASSERT(truncate(path, 4096 + 5 * MIB) == 0);
    ckptio_safetensors *bad;
    T_STATUS(ckptio_safetensors_open(engine, path, &bad), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("flip.safetensors");
}

static void test_stale_and_missing_manifests(void) {
    const char *path = t_path("stale.safetensors");
    save(path, 3, CKPTIO_SAFETENSORS_CHECKSUMS);
    size_t len;
    char *old = t_read_file(manifest_of(path), &len);
    /* A save without checksums removes the old manifest. */
    save(path, 4, 0);
    T_ASSERT(!t_file_exists(manifest_of(path)));
    T_STATUS(verify(path, NULL), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("no checksum manifest");
    T_MESSAGE_HAS("stale.safetensors.ckptio-manifest.json");
    /* Same layout, other data (saved without checksums): the old manifest
     * is stale, not the data corrupt. */
    t_write_file(manifest_of(path), old, len);
    T_STATUS(verify(path, NULL), CKPTIO_E_STALE);
    T_MESSAGE_HAS("was written by another save (save id ");
    T_MESSAGE_HAS(") than this file (save id none): the manifest is stale or belongs to another file");
    /* Another file's manifest: refused as stale, not as corrupt data. */
    const char *other = t_path("other.safetensors");
    ckptio_tensor_source one = {"x", CKPTIO_DTYPE_U8, 1, small_shape, small, 64, CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_save(engine, other, &one, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS));
    save(path, 4, CKPTIO_SAFETENSORS_CHECKSUMS);
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    T_STATUS(ckptio_safetensors_verify(st, manifest_of(other), NULL), CKPTIO_E_STALE);
    T_MESSAGE_HAS("the manifest is stale or belongs to another file");
    ckptio_safetensors_close(st);
    free(old);
}

static char *save_id_of(const char *path) {
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    size_t n;
    T_OK(ckptio_safetensors_metadata_count(st, &n));
    char *id = NULL;
    for (size_t i = 0; i < n; i++) {
        ckptio_kv kv;
        T_OK(ckptio_safetensors_metadata(st, i, &kv));
        if (strcmp(kv.key, CKPTIO_SAVE_ID_KEY) == 0) {
            T_ASSERT(!id);
            id = strdup(kv.value);
        }
    }
    ckptio_safetensors_close(st);
    return id;
}

/* Two saves of one layout to one path (every DDP rank saving the same
 * file): data of one beside the manifest of the other is a stale manifest,
 * never corrupt data; each save's own pair verifies. */
static void test_foreign_save_of_same_layout(void) {
    const char *path = t_path("ddp.safetensors");
    const char *data_a = t_path("data_a"), *man_a = t_path("man_a"), *data_b = t_path("data_b"),
               *man_b = t_path("man_b");
    size_t len;
    void *bytes;
    save(path, 10, CKPTIO_SAFETENSORS_CHECKSUMS);
    bytes = t_read_file(path, &len), t_write_file(data_a, bytes, len), free(bytes);
    bytes = t_read_file(manifest_of(path), &len), t_write_file(man_a, bytes, len), free(bytes);
    save(path, 11, CKPTIO_SAFETENSORS_CHECKSUMS);
    bytes = t_read_file(path, &len), t_write_file(data_b, bytes, len), free(bytes);
    bytes = t_read_file(manifest_of(path), &len), t_write_file(man_b, bytes, len), free(bytes);
    char *id_a = save_id_of(data_a), *id_b = save_id_of(data_b);
    T_ASSERT(id_a && id_b && strlen(id_a) == 32 && strcmp(id_a, id_b) != 0);
    const char *cases[4][2] = {{data_a, man_b}, {data_b, man_a}, {data_a, man_a}, {data_b, man_b}};
    for (int i = 0; i < 4; i++) {
        bytes = t_read_file(cases[i][0], &len), t_write_file(path, bytes, len), free(bytes);
        bytes = t_read_file(cases[i][1], &len), t_write_file(manifest_of(path), bytes, len), free(bytes);
        ckptio_verify_report r;
        if (i < 2) {
            T_STATUS(verify(path, &r), CKPTIO_E_STALE);
            T_MESSAGE_HAS(i == 0 ? id_a : id_b);
            T_MESSAGE_HAS(i == 0 ? id_b : id_a);
            T_MESSAGE_HAS("the data was not checked");
            T_ASSERT(r.blocks == 0);
            /* A verified load says the same. */
            ckptio_safetensors *st;
            T_OK(ckptio_safetensors_open(engine, path, &st));
            unsigned char *got = malloc(4096);
            ckptio_tensor_target tg = {0, got, 4096, CKPTIO_MEM_HOST};
            T_OK(ckptio_safetensors_find(st, "small", &tg.index));
            T_STATUS(ckptio_safetensors_read_verified(st, NULL, &tg, 1), CKPTIO_E_STALE);
            ckptio_safetensors_close(st);
            free(got);
        } else {
            T_OK(verify(path, &r));
            T_ASSERT(r.tensors == 3);
        }
    }
    /* With matching ids a damaged block is still corruption. */
    int fd = open(path, O_RDWR);
    T_ASSERT(fd >= 0 && pwrite(fd, "\xff\x00\xff", 3, 4096 + 100) == 3);
    close(fd);
    T_STATUS(verify(path, NULL), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("checksum mismatch");
    free(id_a);
    free(id_b);
}

/* The id goes into __metadata__ with checksums only, once, and a caller's
 * value for its key never reaches the file. */
static void test_save_id_in_header(void) {
    const char *path = t_path("meta.safetensors");
    ckptio_tensor_source src[3];
    sources(src, 12);
    const ckptio_kv meta[] = {{"format", "pt"}, {CKPTIO_SAVE_ID_KEY, "0123456789abcdef0123456789abcdef"}, {"z", "y"}};
    T_OK(ckptio_safetensors_save(engine, path, src, 3, meta, 3, CKPTIO_SAFETENSORS_CHECKSUMS));
    char *id = save_id_of(path);
    T_ASSERT(id && strcmp(id, meta[1].value) != 0 && strlen(id) == 32);
    size_t len;
    char *text = t_read_file(manifest_of(path), &len);
    ckptio__manifest m;
    T_OK(ckptio__manifest_parse(text, len, "m", &m));
    T_ASSERT(strcmp(m.save_id, id) == 0);
    T_ASSERT(memmem(text, len, "\"version\":2", 11));
    ckptio__manifest_cleanup(&m);
    free(text);
    free(id);
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    size_t n;
    ckptio_kv kv;
    T_OK(ckptio_safetensors_metadata_count(st, &n));
    T_ASSERT(n == 3);
    T_OK(ckptio_safetensors_metadata(st, 0, &kv));
    T_ASSERT(strcmp(kv.key, "format") == 0);
    T_OK(ckptio_safetensors_metadata(st, 1, &kv));
    T_ASSERT(strcmp(kv.key, "z") == 0);
    ckptio_safetensors_close(st);
    T_OK(verify(path, NULL));
    /* Without checksums: no id at all, the caller's dropped too. */
    T_OK(ckptio_safetensors_save(engine, path, src, 3, meta, 3, 0));
    T_ASSERT(save_id_of(path) == NULL);
    T_OK(ckptio_safetensors_open(engine, path, &st));
    T_OK(ckptio_safetensors_metadata_count(st, &n));
    T_ASSERT(n == 2);
    ckptio_safetensors_close(st);
    /* Malformed metadata is still refused by the layout. */
    const ckptio_kv bad[] = {{NULL, "v"}};
    T_STATUS(ckptio_safetensors_save(engine, path, src, 3, bad, 1, CKPTIO_SAFETENSORS_CHECKSUMS), CKPTIO_E_INVAL);
    T_STATUS(ckptio_safetensors_save(engine, path, src, 3, NULL, 1, CKPTIO_SAFETENSORS_CHECKSUMS), CKPTIO_E_INVAL);
}

/* Manifests of version 1 (no save id) beside files without one keep
 * working: they verify, find damage, and call a layout change stale. */
static void test_version1_manifests(void) {
    const char *with = t_path("v1_src.safetensors"), *path = t_path("v1.safetensors");
    save(with, 13, CKPTIO_SAFETENSORS_CHECKSUMS);
    save(path, 13, 0); /* same bytes, no id in the header */
    T_ASSERT(save_id_of(path) == NULL);
    size_t len;
    char *text = t_read_file(manifest_of(with), &len);
    ckptio__manifest m;
    T_OK(ckptio__manifest_parse(text, len, "m", &m));
    free(text);
    /* What an older ckptio wrote for `path`: no id, its header's hash. */
    m.save_id[0] = '\0';
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    uint64_t data_offset = 0;
    T_OK(ckptio_safetensors_data_offset(st, &data_offset));
    ckptio_safetensors_close(st);
    unsigned char *img = t_read_file(path, &len);
    T_OK(ckptio_hash_xxh3(img, data_offset, &m.header_hash));
    T_ASSERT(m.data_offset == data_offset && m.file_size == len);
    free(img);
    text = ckptio__manifest_dump(&m, &len);
    T_ASSERT(text && memmem(text, len, "\"version\":1", 11) && !memmem(text, len, "save_id", 7));
    t_write_file(manifest_of(path), text, len);
    ckptio__free(text);
    ckptio__manifest_cleanup(&m);
    ckptio_verify_report r;
    T_OK(verify(path, &r));
    T_ASSERT(r.tensors == 3 && r.blocks == 4);
    int fd = open(path, O_RDWR);
    T_ASSERT(fd >= 0 && pwrite(fd, "\x01", 1, (off_t)data_offset + 10) == 1);
    close(fd);
    T_STATUS(verify(path, NULL), CKPTIO_E_CHECKSUM);
    /* A v1 manifest beside a file saved with an id: stale. */
    char *v1 = t_read_file(manifest_of(path), &len);
    save(path, 13, CKPTIO_SAFETENSORS_CHECKSUMS);
    t_write_file(manifest_of(path), v1, len);
    T_STATUS(verify(path, NULL), CKPTIO_E_STALE);
    T_MESSAGE_HAS("(save id none) than this file (save id ");
    /* A v1 manifest beside another layout without ids: stale, as always. */
    const char *other = t_path("v1_other.safetensors");
    ckptio_tensor_source one = {"x", CKPTIO_DTYPE_U8, 1, small_shape, small, 64, CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_save(engine, other, &one, 1, NULL, 0, 0));
    T_OK(ckptio_safetensors_open(engine, other, &st));
    T_STATUS(ckptio_safetensors_verify(st, manifest_of(path), NULL), CKPTIO_E_STALE);
    T_MESSAGE_HAS("the manifest is stale or belongs to another file");
    ckptio_safetensors_close(st);
    free(v1);
}

static void test_gpu_sources(void) {
    ckptio__gpu_sim_configure(NULL);
    const char *path = t_path("gpu.safetensors");
    unsigned char *dev = ckptio__gpu_sim_device_alloc(big_n);
    T_ASSERT(dev);
    ckptio_tensor_source src[3];
    sources(src, 5);
    memcpy(dev, big, big_n);
    src[0].data = dev;
    src[0].mem_kind = CKPTIO_MEM_CUDA;
    T_OK(ckptio_safetensors_save(engine, path, src, 3, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS));
    ckptio_verify_report r;
    T_OK(verify(path, &r));
    T_ASSERT(r.tensors == 3 && r.bytes == big_n + 4096);
    ckptio__gpu_sim_device_free(dev);
}

/* ---- the parser on hostile text ---------------------------------------------- */

static ckptio_status parse(const char *text) {
    ckptio__manifest m;
    ckptio_status s = ckptio__manifest_parse(text, strlen(text), "evil.json", &m);
    if (s == CKPTIO_OK) ckptio__manifest_cleanup(&m);
    return s;
}

#define HEAD "{\"format\":\"ckptio-manifest\",\"version\":1,\"hash\":\"xxh3-64\",\"header_xxh3\":\"0123456789abcdef\","
#define H "\"0123456789abcdef\""

static void test_parser_refusals(void) {
    T_OK(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":8,\"block_bytes\":4096,\"tensors\":["
                    "{\"name\":\"t\",\"offset\":8,\"nbytes\":92,\"blocks\":[" H "]}]}"));
    /* Path traversal and absolute paths. */
    T_STATUS(parse(HEAD "\"file\":\"../../etc/passwd\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,"
                        "\"tensors\":[]}"),
             CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("evil.json: parse manifest: file: path '../../etc/passwd' refused");
    T_STATUS(parse(HEAD "\"file\":\"/etc/passwd\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,"
                        "\"tensors\":[]}"),
             CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("absolute path '/etc/passwd' refused");
    T_STATUS(parse(HEAD "\"file\":\"..\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[]}"),
             CKPTIO_E_DISALLOWED);
    T_STATUS(parse(HEAD "\"file\":\"a\\u0000b\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,"
                        "\"tensors\":[]}"),
             CKPTIO_E_FORMAT);
    /* Offsets that overflow or leave the data section. */
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":8,\"block_bytes\":4096,\"tensors\":["
                        "{\"name\":\"t\",\"offset\":9223372036854775807,"
                        "\"nbytes\":9223372036854775807,\"blocks\":[]}]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("outside the data section");
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":8,\"block_bytes\":4096,\"tensors\":["
                        "{\"name\":\"t\",\"offset\":4,\"nbytes\":1,\"blocks\":[" H "]}]}"),
             CKPTIO_E_FORMAT);
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":5,\"data_offset\":8,\"block_bytes\":4096,\"tensors\":[]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("data_offset: 8 is past the file size 5");
    /* Allocation bomb: 2^62 bytes declared, checked against the block list
     * (and the file size) before anything is allocated. */
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":4611686018427387904,\"data_offset\":0,\"block_bytes\":4096,"
                        "\"tensors\":[{\"name\":\"t\",\"offset\":0,\"nbytes\":4611686018427387904,"
                        "\"blocks\":[" H "]}]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("1 block checksums for 4611686018427387904 bytes in 4096-byte blocks (1125899906842624 expected)");
    /* Overlaps, duplicates, unknown keys, bad hex, bad block sizes, versions. */
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":["
                        "{\"name\":\"t\",\"offset\":0,\"nbytes\":10,\"blocks\":[" H "]},"
                        "{\"name\":\"u\",\"offset\":5,\"nbytes\":10,\"blocks\":[" H "]}]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("overlap tensor 't'");
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":["
                        "{\"name\":\"t\",\"offset\":0,\"nbytes\":10,\"blocks\":[" H "]},"
                        "{\"name\":\"t\",\"offset\":10,\"nbytes\":10,\"blocks\":[" H "]}]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("tensor listed twice");
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,"
                        "\"tensors\":[],\"x\":1}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("x: unknown key");
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file\":\"b\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,"
                        "\"tensors\":[]}"),
             CKPTIO_E_FORMAT);
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":["
                        "{\"name\":\"t\",\"offset\":0,\"nbytes\":10,\"blocks\":[\"0123456789ABCDEF\"]}]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("16 lowercase hex digits");
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":5000,\"tensors\":[]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not a power of two");
    T_STATUS(parse("{\"format\":\"ckptio-manifest\",\"version\":3}"), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("version 3 is not supported (this reader knows 1 and 2)");
    /* The save id: required by version 2 (32 lowercase hex digits), not
     * part of version 1. */
#define TAIL "\"file\":\"a\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[]}"
#define V2 "{\"format\":\"ckptio-manifest\",\"version\":2,\"hash\":\"xxh3-64\",\"header_xxh3\":\"0123456789abcdef\","
    T_OK(parse(V2 "\"save_id\":\"0123456789abcdef0123456789abcdef\"," TAIL));
    T_STATUS(parse(V2 TAIL), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("save_id: missing");
    T_STATUS(parse(V2 "\"save_id\":\"0123456789ABCDEF0123456789abcdef\"," TAIL), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("save_id: must be 32 lowercase hex digits");
    T_STATUS(parse(V2 "\"save_id\":\"0123456789abcdef\"," TAIL), CKPTIO_E_FORMAT);
    T_STATUS(parse(V2 "\"save_id\":\"0123456789abcdef0123456789abcde\\u0000\"," TAIL), CKPTIO_E_FORMAT);
    T_STATUS(parse(V2 "\"save_id\":7," TAIL), CKPTIO_E_FORMAT);
    T_STATUS(parse(HEAD "\"save_id\":\"0123456789abcdef0123456789abcdef\"," TAIL), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("save_id: not part of version 1");
#undef TAIL
#undef V2
    T_STATUS(parse("{\"format\":\"ckptio-manifest\",\"version\":-1}"), CKPTIO_E_FORMAT);
    T_STATUS(parse("[1,2]"), CKPTIO_E_FORMAT);
    T_STATUS(parse("{\"format\":"), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not valid JSON");
    T_STATUS(parse(""), CKPTIO_E_FORMAT);
}

/* A manifest file over the size limit is refused from its size alone
 * (a sparse file: nothing of it is read or allocated). */
static void test_oversized_manifest_file(void) {
    const char *path = t_path("huge.safetensors");
    save(path, 6, 0);
    int fd = open(manifest_of(path), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    T_ASSERT(fd >= 0 && ftruncate(fd, (off_t)CKPTIO__MANIFEST_MAX_BYTES + 1) == 0);
    close(fd);
    T_STATUS(verify(path, NULL), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("exceeds the limit of 268435456 bytes");
    unlink(manifest_of(path));
}

int main(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    big = malloc(big_n);
    small = malloc(4096);
    T_OK(ckptio_engine_create(&engine));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_THREADS, 2));
    T_RUN(test_manifest_written_and_verified);
    T_RUN(test_flipped_bit_and_truncation);
    T_RUN(test_stale_and_missing_manifests);
    T_RUN(test_foreign_save_of_same_layout);
    T_RUN(test_save_id_in_header);
    T_RUN(test_version1_manifests);
    T_RUN(test_gpu_sources);
    T_RUN(test_parser_refusals);
    T_RUN(test_oversized_manifest_file);
    T_OK(ckptio_engine_destroy(engine));
    free(big);
    free(small);
    return T_EXIT_PASS;
}
