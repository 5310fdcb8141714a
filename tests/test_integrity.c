/*
 * test_integrity.c - checksum manifests beside safetensors files: what the
 * save writes, verification of good files, a flipped bit and a truncated
 * file named by tensor, file and byte range, stale and foreign manifests,
 * loads verified on request, GPU (simulated) sources, and the manifest
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
    /* Same layout, other data: blocks mismatch (the header is the same). */
    t_write_file(manifest_of(path), old, len);
    T_STATUS(verify(path, NULL), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("block 0 of 3");
    /* Another file's manifest: refused as stale, not as corrupt data. */
    const char *other = t_path("other.safetensors");
    ckptio_tensor_source one = {"x", CKPTIO_DTYPE_U8, 1, small_shape, small, 64, CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_save(engine, other, &one, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS));
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    T_STATUS(ckptio_safetensors_verify(st, manifest_of(other), NULL), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("the manifest is stale or belongs to another file");
    ckptio_safetensors_close(st);
    free(old);
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
    T_STATUS(parse(HEAD "\"file\":\"../../etc/passwd\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[]}"),
             CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("evil.json: parse manifest: file: path '../../etc/passwd' refused");
    T_STATUS(parse(HEAD "\"file\":\"/etc/passwd\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[]}"),
             CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("absolute path '/etc/passwd' refused");
    T_STATUS(parse(HEAD "\"file\":\"..\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[]}"),
             CKPTIO_E_DISALLOWED);
    T_STATUS(parse(HEAD "\"file\":\"a\\u0000b\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[]}"),
             CKPTIO_E_FORMAT);
    /* Offsets that overflow or leave the data section. */
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":8,\"block_bytes\":4096,\"tensors\":["
                        "{\"name\":\"t\",\"offset\":9223372036854775807,\"nbytes\":9223372036854775807,\"blocks\":[]}]}"),
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
                        "\"tensors\":[{\"name\":\"t\",\"offset\":0,\"nbytes\":4611686018427387904,\"blocks\":[" H "]}]}"),
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
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[],\"x\":1}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("x: unknown key");
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file\":\"b\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":[]}"),
             CKPTIO_E_FORMAT);
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":100,\"data_offset\":0,\"block_bytes\":4096,\"tensors\":["
                        "{\"name\":\"t\",\"offset\":0,\"nbytes\":10,\"blocks\":[\"0123456789ABCDEF\"]}]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("16 lowercase hex digits");
    T_STATUS(parse(HEAD "\"file\":\"a\",\"file_size\":0,\"data_offset\":0,\"block_bytes\":5000,\"tensors\":[]}"),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not a power of two");
    T_STATUS(parse("{\"format\":\"ckptio-manifest\",\"version\":2}"), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("version 2 is not supported");
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
    T_RUN(test_gpu_sources);
    T_RUN(test_parser_refusals);
    T_RUN(test_oversized_manifest_file);
    T_OK(ckptio_engine_destroy(engine));
    free(big);
    free(small);
    return T_EXIT_PASS;
}
