/*
 * test_dcp_items.c - ckptio_dcp_write (items of .distcp files), zstd
 * decompression and XXH3 hashing: bytes on disk, offsets, hashes, errors.
 */
#include "helpers.h"

#include <string.h>
#include <xxhash.h>
#include <zstd.h>

static ckptio_torch_writer *one_tensor_archive(const float *data, int64_t n) {
    ckptio_torch_writer *w = NULL;
    size_t sid;
    ckptio_value *root;
    T_OK(ckptio_torch_writer_create(&w));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F32, (uint64_t)n * 4, "cpu", data, CKPTIO_MEM_HOST, &sid));
    ckptio_torch_tensor_spec spec = {.storage = sid, .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = &n};
    T_OK(ckptio_torch_writer_tensor(w, &spec, &root));
    T_OK(ckptio_torch_writer_set_root(w, root));
    return w;
}

static void test_items_layout_and_hashes(ckptio_engine *engine) {
    enum { N = 20000 }; /* 80 KB: above CKPTIO_DCP_PACK_BELOW, so 4 KiB-aligned */
    static float a[N], b[N];
    t_fill_random(a, sizeof a, 1);
    t_fill_random(b, sizeof b, 2);
    const char blob[] = "pickled byte item";
    const char *path = t_path("items.distcp");
    ckptio_file *file = NULL;
    T_OK(ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE, &file));
    ckptio_dcp_item items[4] = {
        {.file = file, .bytes = blob, .nbytes = sizeof blob, .flags = CKPTIO_DCP_ITEM_HASH},
        {.file = file, .archive = one_tensor_archive(a, N), .flags = CKPTIO_DCP_ITEM_HASH | CKPTIO_DCP_ITEM_CRC32},
        {.file = file, .archive = one_tensor_archive(b, N), .flags = CKPTIO_DCP_ITEM_HASH | CKPTIO_DCP_ITEM_ZSTD},
        {.file = file, .bytes = blob, .nbytes = sizeof blob, .flags = CKPTIO_DCP_ITEM_ZSTD},
    };
    T_OK(ckptio_dcp_write(engine, items, 4, NULL));
    T_OK(ckptio_file_commit(file));
    T_OK(ckptio_file_close(file));

    size_t len = 0;
    uint8_t *disk = t_read_file(path, &len);
    T_ASSERT(items[0].offset == 0 && items[0].length == sizeof blob);
    T_ASSERT(memcmp(disk, blob, sizeof blob) == 0);
    for (int i = 1; i < 3; i++)
        T_ASSERT(items[i].offset % 4096 == 0 && items[i].offset >= items[i - 1].offset + items[i - 1].length);
    /* A small byte item is packed: the next multiple of 64 after the item before it. */
    const uint64_t end2 = items[2].offset + items[2].length;
    T_ASSERT(items[3].offset == (end2 + CKPTIO_DCP_PACK_ALIGN - 1) / CKPTIO_DCP_PACK_ALIGN * CKPTIO_DCP_PACK_ALIGN);
    T_ASSERT(items[3].offset + items[3].length == len); /* truncated to the last item */
    for (int i = 0; i < 3; i++) {
        T_ASSERT(items[i].hashed);
        T_ASSERT(items[i].hash == XXH3_64bits(disk + items[i].offset, items[i].length));
        uint64_t h = 0;
        T_OK(ckptio_hash_xxh3(disk + items[i].offset, items[i].length, &h));
        T_ASSERT(h == items[i].hash);
    }
    T_ASSERT(!items[3].hashed);

    /* Item 1: a torch.save archive (prefix "archive") whose tensor bytes are a,
     * 4 KiB-aligned in the file, with a real CRC. */
    ckptio_torch *t = NULL;
    T_OK(ckptio_torch_parse(disk + items[1].offset, items[1].length, &t));
    ckptio_torch_tensor_info ti;
    ckptio_torch_storage_info si;
    T_OK(ckptio_torch_tensor(t, 0, &ti));
    T_OK(ckptio_torch_storage(t, 0, &si));
    T_ASSERT(ti.ndim == 1 && ti.shape[0] == N && ti.dtype == CKPTIO_DTYPE_F32);
    T_ASSERT((items[1].offset + ti.file_offset) % 4096 == 0);
    T_ASSERT(memcmp(disk + items[1].offset + ti.file_offset, a, sizeof a) == 0);
    T_ASSERT(si.crc32 != 0);
    ckptio_torch_verify_report rep;
    T_OK(ckptio_torch_verify(t, &rep));
    T_OK(ckptio_torch_close(t));

    /* Item 2: one zstd frame of such an archive. */
    uint64_t size = 0;
    T_OK(ckptio_zstd_decompressed_size_max(disk + items[2].offset, items[2].length, UINT64_MAX, &size));
    uint8_t *arch = malloc(size);
    size_t got = 0;
    T_OK(ckptio_zstd_decompress(disk + items[2].offset, items[2].length, arch, size, &got));
    T_ASSERT(got == size);
    T_OK(ckptio_torch_parse(arch, got, &t));
    T_OK(ckptio_torch_tensor(t, 0, &ti));
    T_OK(ckptio_torch_storage(t, 0, &si));
    T_ASSERT(memcmp(arch + ti.file_offset, b, sizeof b) == 0);
    T_ASSERT(si.crc32 == 0); /* no CKPTIO_DCP_ITEM_CRC32 */
    T_OK(ckptio_torch_close(t));
    /* Too small a destination. */
    T_STATUS(ckptio_zstd_decompress(disk + items[2].offset, items[2].length, arch, size - 1, &got), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("more than the");
    free(arch);

    /* Item 3: compressed bytes. */
    char back[sizeof blob];
    T_OK(ckptio_zstd_decompress(disk + items[3].offset, items[3].length, back, sizeof back, &got));
    T_ASSERT(got == sizeof blob && memcmp(back, blob, got) == 0);
    free(disk);
    for (int i = 0; i < 4; i++) ckptio_torch_writer_destroy(items[i].archive);
}

static void test_zstd_streamed_frames_and_corruption(void) {
    /* A frame without a content size (as a streaming compressor writes it), then one with. */
    char src[5000];
    t_fill_random(src, 2000, 7);
    memset(src + 2000, 'x', 3000);
    uint8_t packed[16384];
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    T_ASSERT(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
    ZSTD_outBuffer out = {packed, sizeof packed, 0};
    ZSTD_inBuffer in = {src, sizeof src, 0};
    T_ASSERT(!ZSTD_isError(ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end)));
    ZSTD_freeCCtx(cctx);
    const size_t first = out.pos;
    const size_t second = ZSTD_compress(packed + first, sizeof packed - first, src, 100, 3);
    T_ASSERT(!ZSTD_isError(second));
    T_ASSERT(ZSTD_getFrameContentSize(packed, first) == ZSTD_CONTENTSIZE_UNKNOWN);
    uint64_t size = 0;
    T_OK(ckptio_zstd_decompressed_size_max(packed, first + second, UINT64_MAX, &size));
    T_ASSERT(size == sizeof src + 100);
    char dst[sizeof src + 100];
    size_t got = 0;
    T_OK(ckptio_zstd_decompress(packed, first + second, dst, sizeof dst, &got));
    T_ASSERT(got == sizeof dst && memcmp(dst, src, sizeof src) == 0 && memcmp(dst + sizeof src, src, 100) == 0);
    /* Truncated and corrupt input. */
    T_STATUS(ckptio_zstd_decompress(packed, first - 3, dst, sizeof dst, &got), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("truncated");
    uint8_t bad[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    T_STATUS(ckptio_zstd_decompressed_size_max(bad, sizeof bad, UINT64_MAX, &size), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("corrupt zstd data");
    /* Bounded: exactly the limit passes; one byte less is refused, from the
     * declared sizes (second frame) or while counting (first frame). */
    T_OK(ckptio_zstd_decompressed_size_max(packed, first + second, sizeof src + 100, &size));
    T_ASSERT(size == sizeof src + 100);
    T_STATUS(ckptio_zstd_decompressed_size_max(packed, first + second, sizeof src + 99, &size), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("decompresses to over");
    T_MESSAGE_HAS("decompression bomb");
    T_STATUS(ckptio_zstd_decompressed_size_max(packed + first, second, 99, &size), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("declares 100 bytes, more than the 99 this item may hold");
    /* A frame header claiming 2^60 bytes costs nothing to refuse. */
    uint8_t claim[13] = {0x28, 0xB5, 0x2F, 0xFD, 0xE0};
    const uint64_t huge = (uint64_t)1 << 60;
    memcpy(claim + 5, &huge, 8);
    T_STATUS(ckptio_zstd_decompressed_size_max(claim, sizeof claim, (uint64_t)1 << 30, &size), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("declares 1152921504606846976 bytes");
}

static void test_errors(ckptio_engine *engine) {
    uint64_t h;
    T_STATUS(ckptio_hash_xxh3(NULL, 3, &h), CKPTIO_E_INVAL);
    T_OK(ckptio_hash_xxh3(NULL, 0, &h));
    T_ASSERT(h == XXH3_64bits("", 0));
    ckptio_file *file = NULL;
    T_OK(ckptio_file_open(engine, t_path("bad.distcp"), CKPTIO_OPEN_WRITE, &file));
    ckptio_dcp_item item = {.file = file, .bytes = "x", .nbytes = 1, .flags = 0x80};
    T_STATUS(ckptio_dcp_write(engine, &item, 1, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("bad.distcp");
    T_MESSAGE_HAS("item 0: unknown flags 0x80");
    /* An archive whose storage has no memory. */
    ckptio_torch_writer *w = NULL;
    size_t sid;
    ckptio_value *root;
    int64_t n = 4;
    T_OK(ckptio_torch_writer_create(&w));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F32, 16, "cpu", NULL, CKPTIO_MEM_HOST, &sid));
    ckptio_torch_tensor_spec spec = {.storage = sid, .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = &n};
    T_OK(ckptio_torch_writer_tensor(w, &spec, &root));
    T_OK(ckptio_torch_writer_set_root(w, root));
    ckptio_dcp_item two[2] = {{.file = file, .bytes = "x", .nbytes = 1}, {.file = file, .archive = w}};
    T_STATUS(ckptio_dcp_write(engine, two, 2, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("item 1: storage 0 of the archive has no memory bound");
    T_OK(ckptio_file_close(file));
    T_ASSERT(!t_file_exists(t_path("bad.distcp")));
    ckptio_torch_writer_destroy(w);
}

/* An archive of a large host tensor is hashed in CKPTIO_DCP_PART_BYTES blocks while it is written (by the
 * plan's observer, on the worker that writes each block), not in a pass before the first byte: its parts tile
 * the item, each the XXH3-64 of the bytes on disk, none read back; a small one keeps its one hash. */
static void test_large_host_tensors_hashed_in_blocks_as_written(void) {
    const int64_t n = (int64_t)(2 * CKPTIO_DCP_PART_BYTES + 12345) / 4; /* two whole blocks and a tail */
    float *big = malloc((size_t)n * 4);
    T_ASSERT(big);
    t_fill_random(big, (size_t)n * 4, 5);
    static float small[1000];
    t_fill_random(small, sizeof small, 6);
    const int threads[] = {0, 3};
    for (size_t r = 0; r < sizeof threads / sizeof *threads; r++) {
        ckptio_engine *e = NULL;
        T_OK(ckptio_engine_create(&e));
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads[r]));
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 << 20)); /* blocks span several tasks */
        const char *path = t_path("blocks.distcp");
        ckptio_file *file = NULL;
        T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &file));
        ckptio_dcp_item items[2] = {
            {.file = file, .archive = one_tensor_archive(big, n), .flags = CKPTIO_DCP_ITEM_HASH},
            {.file = file, .archive = one_tensor_archive(small, 1000), .flags = CKPTIO_DCP_ITEM_HASH},
        };
        ckptio_stats before, after;
        T_OK(ckptio_engine_stats(e, &before));
        T_OK(ckptio_dcp_write(e, items, 2, NULL));
        T_OK(ckptio_engine_stats(e, &after));
        T_OK(ckptio_file_commit(file));
        T_OK(ckptio_file_close(file));
        T_ASSERT_MSG(after.bytes_read == before.bytes_read, "threads %d: %llu bytes read back", threads[r],
                     (unsigned long long)(after.bytes_read - before.bytes_read));
        size_t len = 0;
        unsigned char *disk = t_read_file(path, &len);
        const ckptio_dcp_item *it = &items[0];
        T_ASSERT_MSG(!it->hashed && it->nparts >= 4, "threads %d: %zu parts", threads[r], it->nparts);
        uint64_t at = 0, blocks = 0;
        for (size_t k = 0; k < it->nparts; k++) {
            const ckptio_dcp_part *pt = &it->parts[k];
            T_ASSERT_MSG(pt->offset == at && pt->length > 0 && pt->length <= CKPTIO_DCP_PART_BYTES,
                         "part %zu: offset %llu length %llu", k, (unsigned long long)pt->offset,
                         (unsigned long long)pt->length);
            T_ASSERT_MSG(pt->hash == XXH3_64bits(disk + it->offset + pt->offset, pt->length),
                         "threads %d part %zu: the hash is not the file's bytes'", threads[r], k);
            blocks += pt->length == CKPTIO_DCP_PART_BYTES;
            at += pt->length;
        }
        T_ASSERT(at == it->length && blocks == 2);
        T_ASSERT(items[1].hashed && items[1].nparts == 0 &&
                 items[1].hash == XXH3_64bits(disk + items[1].offset, items[1].length));
        free(disk);
        for (size_t i = 0; i < 2; i++) ckptio_torch_writer_destroy(items[i].archive);
        ckptio_dcp_items_release(items, 2);
        T_OK(ckptio_engine_destroy(e));
    }
    free(big);
}

/* The library's XXH3 (libxxhash's x86 dispatcher where it has one) gives the digests of the plain functions this
 * test links: every length class of XXH3 (0-16, 17-128, 129-240 bytes, stripes, blocks of 1 KiB, many blocks),
 * at every alignment of the first byte. */
static void test_xxh3_digests_match_the_reference(void) {
    const size_t n = (4u << 20) + 4099;
    unsigned char *b = malloc(n + 64);
    T_ASSERT(b);
    t_fill_random(b, n + 64, 5);
    const size_t lens[] = {0, 1, 3, 4, 8, 9, 16, 17, 100, 128, 129, 200, 240, 241, 255, 256, 1023, 1024, 1025,
                           4096, 65535, 65536 + 7, (1u << 20) + 13, n};
    for (size_t a = 0; a < 64; a += 7)
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            uint64_t h;
            T_OK(ckptio_hash_xxh3(b + a, lens[i], &h));
            T_ASSERT_MSG(h == XXH3_64bits(b + a, lens[i]), "%zu bytes at +%zu: %016llx", lens[i], a,
                         (unsigned long long)h);
        }
    free(b);
}

int main(void) {
    ckptio_engine *engine = NULL;
    T_OK(ckptio_engine_create(&engine));
    test_items_layout_and_hashes(engine);
    test_zstd_streamed_frames_and_corruption();
    test_errors(engine);
    test_large_host_tensors_hashed_in_blocks_as_written();
    test_xxh3_digests_match_the_reference();
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
