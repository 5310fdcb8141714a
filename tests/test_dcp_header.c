/*
 * test_dcp_header.c - what a stored DCP tensor item is and where its bytes
 * lie (ckptio_dcp_header_*, src/ckpt/dcp_item.c), the one description both
 * readers use: this library's (ckptio_dcp_read_tensor) and ckptio.dcp's
 * FileSystemReader, which reads only the slices it needs from there.
 *
 * On the fixtures of tests/data/dcp: a torch.save archive per item (ts/,
 * written by stock torch), SAFETENSORS blobs (st/), zstd items decoded in
 * memory (zstd/). Each layout must locate exactly the bytes of the tensor
 * in NAME.expected.safetensors; only headers are read (a few KiB, not the
 * item); bad items are refused naming file and offset.
 */
#include "helpers.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ckptio_engine *engine;

static const char *data_path(const char *name) { return t_data_path("dcp", name); }

/* Fixture `name` opened on engine `e`, with tensor `fqn` and its first chunk. */
static ckptio_dcp *chunk_of(ckptio_engine *e, const char *name, const char *fqn, ckptio_dcp_tensor_info *ti,
                            ckptio_dcp_chunk_info *ci) {
    ckptio_dcp *h = NULL;
    size_t i = 0;
    T_OK(ckptio_dcp_open(e, data_path(name), &h));
    T_OK(ckptio_dcp_find(h, fqn, &i));
    T_OK(ckptio_dcp_tensor(h, i, ti));
    T_OK(ckptio_dcp_chunk(h, i, 0, ci));
    return h;
}

/* The expected bytes of tensor `fqn` of fixture `name`. */
static void *expected(const char *name, const char *fqn, uint64_t *len) {
    char exp[256];
    snprintf(exp, sizeof exp, "%s.expected.safetensors", name);
    ckptio_safetensors *st = NULL;
    size_t idx = 0;
    ckptio_tensor_info ti;
    T_OK(ckptio_safetensors_open(engine, data_path(exp), &st));
    T_OK(ckptio_safetensors_find(st, fqn, &idx));
    T_OK(ckptio_safetensors_tensor(st, idx, &ti));
    void *out = malloc(ti.nbytes + 1);
    ckptio_tensor_target tg = {.index = idx, .data = out, .capacity = ti.nbytes, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_read(st, &tg, 1));
    ckptio_safetensors_close(st);
    *len = ti.nbytes;
    return out;
}

/* The C-order bytes of the view `lay` describes, gathered from `storage`
 * (the storage's bytes). */
static void *gather(const ckptio_dcp_layout *lay, const uint8_t *storage, uint64_t esize, uint64_t numel) {
    uint8_t *out = malloc(numel * esize + 1);
    int64_t idx[CKPTIO_DCP_MAX_NDIM] = {0};
    for (uint64_t n = 0; n < numel; n++) {
        uint64_t el = lay->storage_offset;
        for (uint32_t d = 0; d < lay->ndim; d++) el += (uint64_t)(idx[d] * lay->stride[d]);
        T_ASSERT((el + 1) * esize <= lay->storage_nbytes);
        memcpy(out + n * esize, storage + el * esize, esize);
        for (uint32_t d = lay->ndim; d-- > 0;) {
            if (++idx[d] < lay->shape[d]) break;
            idx[d] = 0;
        }
    }
    return out;
}

static uint64_t element_size(ckptio_dtype dtype) { return ckptio_dtype_bits(dtype) / 8; }

/* Every tensor of fixture `name` (untransformed items) is found where its
 * header says, reading only headers there. */
static void check_fixture(const char *name, size_t want_count) {
    ckptio_dcp *h = NULL;
    T_OK(ckptio_dcp_open(engine, data_path(name), &h));
    size_t n = 0;
    T_OK(ckptio_dcp_tensor_count(h, &n));
    for (size_t i = 0; i < n; i++) {
        ckptio_dcp_tensor_info ti;
        ckptio_dcp_chunk_info ci;
        T_OK(ckptio_dcp_tensor(h, i, &ti));
        T_OK(ckptio_dcp_chunk(h, i, 0, &ci));
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", data_path(name), ci.stored.file);
        ckptio_file *f = NULL;
        T_OK(ckptio_file_open(engine, path, CKPTIO_OPEN_READ, &f));
        ckptio_dcp_header *hd = NULL;
        uint64_t header_bytes = 0, size = 0;
        size_t count = 0;
        T_OK(ckptio_dcp_header_read(f, ci.stored.offset, ci.stored.length, ti.fqn, &header_bytes, &hd));
        T_OK(ckptio_dcp_header_count(hd, &count));
        T_ASSERT_MSG(count == want_count, "%s: %s: header of %zu tensors", name, ti.fqn, count);
        T_OK(ckptio_file_size(f, &size));
        /* Headers only: an archive's zip records and pickle, a blob's JSON. */
        T_ASSERT_MSG(header_bytes > 0 && header_bytes < 4096, "%s: %s: %llu header bytes", name, ti.fqn,
                     (unsigned long long)header_bytes);
        ckptio_dcp_layout lay;
        T_OK(ckptio_dcp_header_layout(hd, ti.fqn, &lay));
        T_ASSERT(lay.dtype == ti.dtype && lay.ndim == ti.ndim);
        for (uint32_t d = 0; d < ti.ndim; d++) T_ASSERT(lay.shape[d] == ti.shape[d]);
        T_ASSERT(lay.storage_start + lay.storage_nbytes <= size);
        uint8_t *storage = malloc(lay.storage_nbytes + 1);
        ckptio_extent ex = {.file = f, .file_offset = lay.storage_start, .length = lay.storage_nbytes,
                            .memory = storage, .mem_kind = CKPTIO_MEM_HOST};
        ckptio_plan *plan = NULL;
        T_OK(ckptio_plan_create(CKPTIO_READ, &plan));
        T_OK(ckptio_plan_add(plan, &ex));
        T_OK(ckptio_engine_execute(engine, plan));
        ckptio_plan_destroy(plan);
        uint64_t want_len = 0;
        void *want = expected(name, ti.fqn, &want_len);
        void *got = gather(&lay, storage, element_size(ti.dtype), ti.nbytes / element_size(ti.dtype));
        T_ASSERT_MSG(want_len == ti.nbytes && memcmp(want, got, want_len) == 0, "%s: %s: wrong bytes", name, ti.fqn);
        free(want);
        free(got);
        free(storage);
        T_OK(ckptio_dcp_header_close(hd));
        T_OK(ckptio_file_close(f));
    }
    ckptio_dcp_close(h);
}

static void test_archives(void) { check_fixture("ts", 1); }

static void test_blobs(void) {
    check_fixture("st", 5);
    /* A blob's header answers for its tensors by name, and only for them. */
    ckptio_dcp_tensor_info ti;
    ckptio_dcp_chunk_info ci;
    ckptio_dcp *h = chunk_of(engine, "st", "w", &ti, &ci);
    char path[1200], where[1300];
    snprintf(path, sizeof path, "%s/%s", data_path("st"), ci.stored.file);
    ckptio_file *f = NULL;
    ckptio_dcp_header *hd = NULL;
    ckptio_dcp_layout lay;
    T_OK(ckptio_file_open(engine, path, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_dcp_header_read(f, ci.stored.offset, ci.stored.length, NULL, NULL, &hd));
    T_STATUS(ckptio_dcp_header_layout(hd, "nope", &lay), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("the safetensors blob has no tensor 'nope'");
    snprintf(where, sizeof where, "%s: read DCP item at offset %llu", path, (unsigned long long)ci.stored.offset);
    T_MESSAGE_HAS(where);
    ckptio_dcp_header_close(hd);
    ckptio_file_close(f);
    ckptio_dcp_close(h);
}

/* A zstd item decoded in memory: the layout counts from the data's start. */
static void test_decoded_item(void) {
    ckptio_dcp_tensor_info ti;
    ckptio_dcp_chunk_info ci;
    ckptio_dcp *h = chunk_of(engine, "zstd", "w", &ti, &ci);
    T_ASSERT(ci.stored.transforms & CKPTIO_DCP_TRANSFORM_ZSTD);
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", data_path("zstd"), ci.stored.file);
    size_t flen = 0;
    uint8_t *file = t_read_file(path, &flen);
    uint64_t raw_len = 0;
    T_OK(ckptio_zstd_decompressed_size_max(file + ci.stored.offset, ci.stored.length, UINT64_MAX, &raw_len));
    uint8_t *raw = malloc(raw_len);
    size_t got_len = 0;
    T_OK(ckptio_zstd_decompress(file + ci.stored.offset, ci.stored.length, raw, raw_len, &got_len));
    ckptio_dcp_header *hd = NULL;
    ckptio_dcp_layout lay;
    T_OK(ckptio_dcp_header_parse(raw, got_len, path, ci.stored.offset, "w", &hd));
    T_OK(ckptio_dcp_header_layout(hd, "ignored: an archive holds one tensor", &lay));
    uint64_t want_len = 0;
    void *want = expected("zstd", "w", &want_len);
    void *got = gather(&lay, raw + lay.storage_start, element_size(ti.dtype), ti.nbytes / element_size(ti.dtype));
    T_ASSERT(memcmp(want, got, want_len) == 0);
    free(want);
    free(got);
    ckptio_dcp_header_close(hd);
    /* The compressed bytes themselves are no archive. */
    T_STATUS(ckptio_dcp_header_parse(file + ci.stored.offset, ci.stored.length, path, ci.stored.offset, "w", &hd),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("is not a torch.save archive");
    T_MESSAGE_HAS("read DCP item at offset");
    T_ASSERT(hd == NULL);
    free(raw);
    free(file);
    ckptio_dcp_close(h);
}

/* Items that are not what .metadata says: refused, naming file and offset. */
static void test_bad_items(void) {
    char src[1200];
    snprintf(src, sizeof src, "%s/__0_0.distcp", data_path("ts"));
    size_t len = 0;
    uint8_t *bytes = t_read_file(src, &len);
    const char *path = t_path("cut.distcp");
    ckptio_file *f = NULL;
    ckptio_dcp_header *hd = NULL;
    /* The archive runs past a cut file. */
    ckptio_dcp_tensor_info ti;
    ckptio_dcp_chunk_info ci;
    ckptio_dcp *h = chunk_of(engine, "ts", "w", &ti, &ci);
    t_write_file(path, bytes, ci.stored.offset + ci.stored.length - 1);
    T_OK(ckptio_file_open(engine, path, CKPTIO_OPEN_READ, &f));
    T_STATUS(ckptio_dcp_header_read(f, ci.stored.offset, ci.stored.length, NULL, NULL, &hd), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("cut.distcp: parse DCP item at offset");
    T_MESSAGE_HAS("bytes does not lie inside the file");
    T_ASSERT(hd == NULL);
    /* Garbage where an item should start: neither an archive nor a blob. */
    T_STATUS(ckptio_dcp_header_read(f, 1, 10, "w", NULL, &hd), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("at offset 1: w: neither a torch.save archive nor a safetensors blob");
    T_STATUS(ckptio_dcp_header_read(f, len + 5, 10, "w", NULL, &hd), CKPTIO_E_TRUNCATED);
    ckptio_file_close(f);
    ckptio_dcp_close(h);
    free(bytes);
}

/* An item's header from its edges (read by the caller) is the one read from
 * the file, under the same checks; what the edges cannot describe is left
 * to ckptio_dcp_header_read (CKPTIO_E_UNSUPPORTED, no header). */
static void test_header_from_edges(void) {
    char src[1200];
    snprintf(src, sizeof src, "%s/__0_0.distcp", data_path("ts"));
    size_t len = 0;
    uint8_t *bytes = t_read_file(src, &len);
    ckptio_dcp_tensor_info ti;
    ckptio_dcp_chunk_info ci;
    ckptio_dcp *h = chunk_of(engine, "ts", "w", &ti, &ci);
    const uint64_t off = ci.stored.offset, n = ci.stored.length;
    const uint8_t *item = bytes + off;
    ckptio_file *f = NULL;
    ckptio_dcp_header *read = NULL, *edges = NULL;
    ckptio_dcp_layout want, got;
    T_OK(ckptio_file_open(engine, src, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_dcp_header_read(f, off, n, "w", NULL, &read));
    T_OK(ckptio_dcp_header_layout(read, "w", &want));
    /* The whole item as both windows, then its first and last KiB. */
    const size_t edge = n < 1024 ? (size_t)n : 1024;
    T_OK(ckptio_dcp_header_windows(src, len, off, n, item, (size_t)n, item, (size_t)n, "w", &edges));
    T_OK(ckptio_dcp_header_layout(edges, "w", &got));
    T_ASSERT(memcmp(&want, &got, sizeof want) == 0 && got.storage_start >= off);
    ckptio_dcp_header_close(edges);
    T_OK(ckptio_dcp_header_windows(src, len, off, n, item, edge, item + n - edge, edge, "w", &edges));
    T_OK(ckptio_dcp_header_layout(edges, "w", &got));
    T_ASSERT(memcmp(&want, &got, sizeof want) == 0);
    ckptio_dcp_header_close(edges);
    edges = NULL;
    /* Windows of the probe's size leave records between them. */
    T_STATUS(ckptio_dcp_header_windows(src, len, off, n, item, 64, item + n - 64, 64, "w", &edges),
             CKPTIO_E_UNSUPPORTED);
    T_ASSERT(edges == NULL);
    /* The file's size bounds the item, as for a header read from the file. */
    T_STATUS(ckptio_dcp_header_windows(src, off + n - 1, off, n, item, edge, item + n - edge, edge, "w", &edges),
             CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("__0_0.distcp: parse DCP item at offset");
    T_MESSAGE_HAS("bytes does not lie inside the file");
    T_STATUS(ckptio_dcp_header_windows(src, len, len + 5, 10, item, 10, item, 10, "w", &edges), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("the item starts past the end of the file");
    /* Garbage where the archive starts is refused as it is by a read; zip
     * records broken in the tail window are named as such. */
    uint8_t *bad = malloc((size_t)n);
    memcpy(bad, item, (size_t)n);
    memset(bad + n - 22, 0xAB, 22);
    T_STATUS(ckptio_dcp_header_windows(src, len, off, n, bad, edge, bad + n - edge, edge, "w", &edges),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("torch.save item");
    T_ASSERT(edges == NULL);
    free(bad);
    ckptio_dcp_header_close(read);
    ckptio_file_close(f);
    ckptio_dcp_close(h);
    /* A SAFETENSORS blob is not read from edges. */
    h = chunk_of(engine, "st", "w", &ti, &ci);
    snprintf(src, sizeof src, "%s/%s", data_path("st"), ci.stored.file);
    free(bytes);
    bytes = t_read_file(src, &len);
    T_STATUS(ckptio_dcp_header_windows(src, len, ci.stored.offset, len - ci.stored.offset, bytes + ci.stored.offset,
                                       64, bytes + len - 64, 64, "w", &edges),
             CKPTIO_E_UNSUPPORTED);
    T_ASSERT(edges == NULL);
    ckptio_dcp_close(h);
    free(bytes);
}

/* ckptio_dcp_read_tensor reads a chunk's storage, not its whole archive. */
static void test_read_tensor_reads_the_storage_only(void) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    ckptio_dcp_tensor_info ti;
    ckptio_dcp_chunk_info ci;
    ckptio_dcp *h = chunk_of(e, "ts", "w", &ti, &ci);
    size_t i = 0;
    T_OK(ckptio_dcp_find(h, "w", &i));
    ckptio_stats before, after;
    T_OK(ckptio_engine_stats(e, &before));
    uint8_t buf[64];
    T_OK(ckptio_dcp_read_tensor(h, i, buf, sizeof buf));
    T_OK(ckptio_engine_stats(e, &after));
    const uint64_t read = after.bytes_read - before.bytes_read;
    /* Its headers (what ckptio_dcp_header_read reads), then the 48 bytes of
     * the storage: never the item as a whole, whatever its size. */
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", data_path("ts"), ci.stored.file);
    ckptio_file *f = NULL;
    ckptio_dcp_header *hd = NULL;
    uint64_t header_bytes = 0;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_dcp_header_read(f, ci.stored.offset, ci.stored.length, NULL, &header_bytes, &hd));
    ckptio_dcp_header_close(hd);
    ckptio_file_close(f);
    T_ASSERT_MSG(read == header_bytes + ti.nbytes, "read %llu bytes: %llu of headers + %llu of data expected",
                 (unsigned long long)read, (unsigned long long)header_bytes, (unsigned long long)ti.nbytes);
    ckptio_dcp_close(h);
    ckptio_engine_destroy(e);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_archives);
    T_RUN(test_blobs);
    T_RUN(test_decoded_item);
    T_RUN(test_bad_items);
    T_RUN(test_header_from_edges);
    T_RUN(test_read_tensor_reads_the_storage_only);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
