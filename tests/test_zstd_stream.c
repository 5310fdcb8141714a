/*
 * test_zstd_stream.c - zstd items in bounded memory: the streaming codec
 * (ckptio_zstd_stream), the header of a zstd DCP item that keeps only the
 * edges of a large archive (ckptio_dcp_header_zstd) and boxes of its tensor
 * read while the frames decompress again (ckptio_dcp_header_read_box).
 *
 * The streaming path is taken with small archives by lowering the size up to
 * which an archive is held (ckptio__dcp_header_zstd_inline), so every box is
 * checked against the tensor's real values.
 */
#include "helpers.h"
#include "dcp_dir_internal.h"
#include "torch_internal.h"

#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <zstd.h>

static ckptio_engine *engine;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long max_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* What a sink saw: pieces, their sizes and order, and the bytes. */
typedef struct seen {
    uint8_t *bytes;
    size_t cap;
    uint64_t next, pieces, largest;
    ckptio_status fail_with; /* returned from the third piece on when set */
} seen;

static ckptio_status keep(void *ctx, const void *data, size_t len, uint64_t offset) {
    seen *s = ctx;
    T_ASSERT_MSG(offset == s->next, "piece at %llu, expected %llu", (unsigned long long)offset,
                 (unsigned long long)s->next);
    T_ASSERT(len > 0);
    if (s->fail_with && s->pieces >= 2) return CKPTIO_FAIL(s->fail_with, "the sink stops here");
    if (s->bytes) {
        T_ASSERT(offset + len <= s->cap);
        memcpy(s->bytes + offset, data, len);
    }
    s->next += len;
    s->pieces++;
    if (len > s->largest) s->largest = len;
    return CKPTIO_OK;
}

/* A zstd frame of `size` zero bytes in RLE blocks (4 bytes per 128 KiB):
 * with the content size `declare` in its header (not single-segment), or
 * without. The frame is honest unless declare differs from size. */
static uint8_t *rle_frame(uint64_t size, bool with_size, uint64_t declare, size_t *len) {
    const uint64_t blocks = size / (128u << 10) + 2;
    uint8_t *out = malloc(16 + blocks * 4), *p = out;
    const uint32_t magic = 0xFD2FB528;
    memcpy(p, &magic, 4), p += 4;
    *p++ = with_size ? 0xC0 : 0x00; /* 8-byte content size or none; never single segment */
    *p++ = 7 << 3;                  /* 128 KiB window */
    if (with_size) memcpy(p, &declare, 8), p += 8;
    for (uint64_t left = size; left;) {
        const uint32_t n = left < (128u << 10) ? (uint32_t)left : (128u << 10);
        left -= n;
        const uint32_t header = (n << 3) | (1u << 1) | (left == 0);
        *p++ = (uint8_t)header, *p++ = (uint8_t)(header >> 8), *p++ = (uint8_t)(header >> 16), *p++ = 0;
    }
    *len = (size_t)(p - out);
    return out;
}

static void test_stream_pieces_and_limits(void) {
    /* Three frames: 3 MiB with its size, 2 MiB without (a streaming writer's),
     * and 100 bytes: the output arrives in order, in pieces of at most 1 MiB. */
    const size_t n1 = 3u << 20, n2 = 2u << 20, n3 = 100;
    uint8_t *src = malloc(n1 + n2 + n3);
    t_fill_random(src, n1 / 2, 11);
    memset(src + n1 / 2, 'a', n1 - n1 / 2);
    t_fill_random(src + n1, n2 + n3, 12);
    const size_t cap = ZSTD_compressBound(n1) + ZSTD_compressBound(n2) + ZSTD_compressBound(n3);
    uint8_t *packed = malloc(cap);
    size_t len = ZSTD_compress(packed, cap, src, n1, 1);
    T_ASSERT(!ZSTD_isError(len));
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    T_ASSERT(!ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)));
    ZSTD_outBuffer out = {packed + len, cap - len, 0};
    ZSTD_inBuffer in = {src + n1, n2, 0};
    T_ASSERT(ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end) == 0);
    ZSTD_freeCCtx(cctx);
    len += out.pos;
    const size_t third = ZSTD_compress(packed + len, cap - len, src + n1 + n2, n3, 3);
    T_ASSERT(!ZSTD_isError(third));
    len += third;

    uint8_t *kept = malloc(n1 + n2 + n3);
    seen s = {.bytes = kept, .cap = n1 + n2 + n3};
    uint64_t total = 0;
    T_OK(ckptio_zstd_stream(packed, len, UINT64_MAX, keep, &s, &total));
    T_ASSERT(total == n1 + n2 + n3 && s.next == total);
    T_ASSERT(memcmp(s.bytes, src, total) == 0);
    T_ASSERT_MSG(s.largest <= (1u << 20), "a piece of %llu bytes", (unsigned long long)s.largest);
    T_ASSERT(s.pieces >= 5);
    /* Counting only (no sink); exactly the limit passes. */
    T_OK(ckptio_zstd_stream(packed, len, n1 + n2 + n3, NULL, NULL, &total));
    T_ASSERT(total == n1 + n2 + n3);
    /* One byte less: the first frame declares 3 MiB (fits), the second has no
     * size, so the stream stops once the output passes the limit. */
    memset(&s, 0, sizeof s);
    T_STATUS(ckptio_zstd_stream(packed, len, n1 + n2 + n3 - 1, keep, &s, &total), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("decompression bomb");
    T_MESSAGE_HAS("nothing more decompressed");
    /* Declared sizes past the limit are refused before any output. */
    memset(&s, 0, sizeof s);
    T_STATUS(ckptio_zstd_stream(packed, len, n1 - 1, keep, &s, &total), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("declares 3145728 bytes");
    T_ASSERT(s.pieces == 0);
    /* A sink's error ends the stream and comes back as it is. */
    memset(&s, 0, sizeof s);
    s.fail_with = CKPTIO_E_NOSPC;
    T_STATUS(ckptio_zstd_stream(packed, len, UINT64_MAX, keep, &s, &total), CKPTIO_E_NOSPC);
    T_MESSAGE_HAS("the sink stops here");
    T_ASSERT(s.pieces == 2);
    /* Truncated: named as such, at the offset of the frame it cuts. */
    T_STATUS(ckptio_zstd_stream(packed, len - 5, UINT64_MAX, NULL, NULL, &total), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("truncated");
    char where[64];
    snprintf(where, sizeof where, "at offset %zu", len - third);
    T_MESSAGE_HAS(where);
    T_STATUS(ckptio_zstd_stream(packed, 0, UINT64_MAX, NULL, NULL, &total), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("no frame");
    free(kept);
    free(packed);
    free(src);
}

static void test_declared_size_disagrees(void) {
    /* Frames whose headers declare another size than their blocks make. */
    const uint64_t sizes[][2] = {{100, 10}, {100, 1000}, {(uint64_t)3 << 20, (uint64_t)1 << 20}};
    for (size_t i = 0; i < 3; i++) {
        size_t len = 0;
        uint8_t *frame = rle_frame(sizes[i][0], true, sizes[i][1], &len);
        uint64_t total = 0;
        T_STATUS(ckptio_zstd_stream(frame, len, UINT64_MAX, NULL, NULL, &total), CKPTIO_E_FORMAT);
        char declares[96];
        snprintf(declares, sizeof declares, "the frame starting here declares %llu bytes",
                 (unsigned long long)sizes[i][1]);
        T_MESSAGE_HAS(declares);
        T_MESSAGE_HAS("zstd decompress at offset 0");
        free(frame);
    }
}

static void test_stream_time_and_memory_are_bounded(void) {
    /* 1 GiB of zeros in 32 KiB of frames, counted without a size in its header:
     * memory stays the 1 MiB piece, whatever the output. */
    size_t len = 0;
    uint8_t *frame = rle_frame((uint64_t)1 << 30, false, 0, &len);
    T_ASSERT(len < (40u << 10));
    const long rss = max_rss_kib();
    const double t0 = now_seconds();
    uint64_t total = 0;
    T_OK(ckptio_zstd_stream(frame, len, UINT64_MAX, NULL, NULL, &total));
    T_ASSERT(total == (uint64_t)1 << 30);
    /* Stopped at the limit: the rest is never decompressed. */
    T_STATUS(ckptio_zstd_stream(frame, len, 1u << 20, NULL, NULL, &total), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("decompression bomb");
    T_ASSERT_MSG(now_seconds() - t0 < 10, "%.1f s", now_seconds() - t0);
    T_ASSERT_MSG(max_rss_kib() - rss < (32 << 10), "peak RSS grew by %ld KiB", max_rss_kib() - rss);
    free(frame);
}

/* The torch.save archive (bytes) of one tensor of float32 `data` (storage of
 * `numel` elements) viewed with shape/stride. */
static uint8_t *archive_of(const float *data, uint64_t numel, uint32_t ndim, const int64_t *shape,
                           const int64_t *stride, size_t *len) {
    ckptio_torch_writer *w = NULL;
    size_t sid;
    ckptio_value *root;
    T_OK(ckptio_torch_writer_create(&w));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F32, numel * 4, "cpu", data, CKPTIO_MEM_HOST, &sid));
    ckptio_torch_tensor_spec spec = {.storage = sid, .dtype = CKPTIO_DTYPE_F32, .ndim = ndim, .shape = shape,
                                     .stride = stride};
    T_OK(ckptio_torch_writer_tensor(w, &spec, &root));
    T_OK(ckptio_torch_writer_set_root(w, root));
    const char *path = t_path("archive.pt");
    const ckptio_torch_save_options opts = {.storage_alignment = 64};
    T_OK(ckptio_torch_save(engine, path, w, &opts));
    ckptio_torch_writer_destroy(w);
    return t_read_file(path, len);
}

static uint8_t *compress(const uint8_t *src, size_t n, size_t *len) {
    const size_t cap = ZSTD_compressBound(n);
    uint8_t *out = malloc(cap);
    *len = ZSTD_compress(out, cap, src, n, 1);
    T_ASSERT(!ZSTD_isError(*len));
    return out;
}

/* Reads box [off, +size) of a 2-d view through the header into a C-order
 * destination and compares it with the view's elements of `data`. */
static void check_box(const ckptio_dcp_header *h, const float *data, const int64_t *stride, const int64_t *off,
                      const int64_t *size) {
    const int64_t dst_stride[2] = {size[1], 1};
    float *dst = calloc((size_t)(size[0] * size[1]) + 1, sizeof *dst);
    T_OK(ckptio_dcp_header_read_box(h, "t", off, size, dst, dst_stride, (uint64_t)(size[0] * size[1]) * 4));
    for (int64_t i = 0; i < size[0]; i++)
        for (int64_t j = 0; j < size[1]; j++) {
            const float want = data[(off[0] + i) * stride[0] + (off[1] + j) * stride[1]];
            T_ASSERT_MSG(dst[i * size[1] + j] == want, "box [%lld +%lld, %lld +%lld]: (%lld, %lld) is %g, not %g",
                         (long long)off[0], (long long)size[0], (long long)off[1], (long long)size[1], (long long)i,
                         (long long)j, dst[i * size[1] + j], want);
        }
    free(dst);
}

static void test_large_item_streams_its_boxes(void) {
    /* 1024 x 1024 float32 (4 MiB): its archive is larger than the two MiB of
     * edges kept, so the storage is not held: every box is read from the
     * frames as they decompress again, C order and transposed. */
    enum { N = 1024 };
    float *data = malloc((size_t)N * N * sizeof *data);
    for (size_t i = 0; i < (size_t)N * N; i++) data[i] = (float)i;
    const int64_t shape[2] = {N, N};
    const int64_t c_order[2] = {N, 1}, transposed[2] = {1, N};
    const int64_t *strides[2] = {c_order, transposed};
    for (int k = 0; k < 2; k++) {
        size_t alen = 0, zlen = 0;
        uint8_t *archive = archive_of(data, (uint64_t)N * N, 2, shape, strides[k], &alen);
        uint8_t *frames = compress(archive, alen, &zlen);
        ckptio_dcp_header *h = NULL;
        T_OK(ckptio__dcp_header_zstd_inline(frames, zlen, alen, 0, "item.distcp", 4096, "t", &h));
        ckptio_dcp_layout lay;
        T_OK(ckptio_dcp_header_layout(h, "t", &lay));
        T_ASSERT(lay.ndim == 2 && lay.shape[0] == N && lay.stride[0] == strides[k][0]);
        T_ASSERT(lay.storage_nbytes == (uint64_t)N * N * 4);
        T_ASSERT(memcmp(archive + lay.storage_start, data, lay.storage_nbytes) == 0);
        ckptio__dcp_archive a;
        T_OK(ckptio__dcp_header_archive(h, &a));
        T_ASSERT(a.data == NULL && a.len == alen); /* not held */
        const int64_t boxes[][4] = {{0, N, 0, N}, {0, N, 300, 37}, {511, 2, 0, N}, {1023, 1, 1023, 1}, {5, 0, 0, 3}};
        for (size_t b = 0; b < sizeof boxes / sizeof *boxes; b++) {
            const int64_t off[2] = {boxes[b][0], boxes[b][2]}, size[2] = {boxes[b][1], boxes[b][3]};
            check_box(h, data, strides[k], off, size);
        }
        /* Into a larger destination (a row-sharded tensor's place). */
        float *dst = calloc((size_t)N * N * 2, sizeof *dst);
        const int64_t zero[2] = {0, 0}, wide[2] = {2 * N, 1};
        T_OK(ckptio_dcp_header_read_box(h, "t", zero, shape, dst + N, wide, (uint64_t)N * N * 2 * 4 - N * 4));
        for (int64_t i = 0; i < N; i++) {
            T_ASSERT(dst[i * 2 * N] == 0);
            T_ASSERT(dst[i * 2 * N + N + 7] == data[i * strides[k][0] + 7 * strides[k][1]]);
        }
        /* A destination too small, a box outside the tensor. */
        const int64_t row[2] = {1, N};
        T_STATUS(ckptio_dcp_header_read_box(h, "t", zero, row, dst, c_order, N * 4 - 1), CKPTIO_E_RANGE);
        T_MESSAGE_HAS("item.distcp");
        const int64_t past[2] = {N - 1, 0}, two[2] = {2, N};
        T_STATUS(ckptio_dcp_header_read_box(h, "t", past, two, dst, c_order, (uint64_t)N * N * 8), CKPTIO_E_RANGE);
        T_MESSAGE_HAS("lies outside the stored tensor");
        free(dst);
        ckptio_dcp_header_close(h);
        /* Held whole (the default for 4 MiB): the same values, read from memory. */
        T_OK(ckptio_dcp_header_zstd(frames, zlen, alen, "item.distcp", 4096, "t", &h));
        T_OK(ckptio__dcp_header_archive(h, &a));
        T_ASSERT(a.data != NULL && a.len == alen);
        const int64_t off[2] = {3, 5}, size[2] = {700, 600};
        check_box(h, data, strides[k], off, size);
        ckptio_dcp_header_close(h);
        /* The limit stops the first pass (the chunk's bytes would be less). */
        T_STATUS(ckptio__dcp_header_zstd_inline(frames, zlen, alen - 1, 0, "item.distcp", 4096, "t", &h),
                 CKPTIO_E_FORMAT);
        T_MESSAGE_HAS("item.distcp: read DCP item at offset 4096: t: zstd item: ");
        T_MESSAGE_HAS("decompression bomb");
        free(frames);
        free(archive);
    }
    free(data);
}

static void test_overlapping_strides(void) {
    /* A view with stride 0 (an expanded row): read from memory when held,
     * refused when its elements cannot come in storage order. */
    float row[256];
    for (int i = 0; i < 256; i++) row[i] = (float)i * 0.5f;
    const int64_t shape[2] = {64, 256}, stride[2] = {0, 1};
    size_t alen = 0, zlen = 0;
    uint8_t *archive = archive_of(row, 256, 2, shape, stride, &alen);
    uint8_t *frames = compress(archive, alen, &zlen);
    ckptio_dcp_header *h = NULL;
    T_OK(ckptio_dcp_header_zstd(frames, zlen, alen, "o.distcp", 0, "t", &h));
    const int64_t off[2] = {10, 3}, size[2] = {5, 100};
    check_box(h, row, stride, off, size);
    ckptio_dcp_header_close(h);
    T_OK(ckptio__dcp_header_zstd_inline(frames, zlen, alen, 0, "o.distcp", 0, "t", &h));
    float dst[500];
    const int64_t dst_stride[2] = {100, 1};
    T_STATUS(ckptio_dcp_header_read_box(h, "t", off, size, dst, dst_stride, sizeof dst), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("strides overlap");
    ckptio_dcp_header_close(h);
    free(frames);
    free(archive);
}

static void test_not_an_archive_is_refused_on_its_first_bytes(void) {
    /* 1 GiB of zeros is no torch.save archive: refused from the first piece,
     * long before the limit (4 GiB here) would stop it. */
    size_t len = 0;
    uint8_t *frame = rle_frame((uint64_t)1 << 30, false, 0, &len);
    ckptio_dcp_header *h = NULL;
    const double t0 = now_seconds();
    T_STATUS(ckptio_dcp_header_zstd(frame, len, (uint64_t)4 << 30, "z.distcp", 0, "w", &h), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("z.distcp: read DCP item at offset 0: w: zstd item: the decoded item is not a torch.save archive");
    T_ASSERT_MSG(now_seconds() - t0 < 0.5, "%.2f s", now_seconds() - t0);
    T_ASSERT(h == NULL);
    free(frame);
}

static void test_records_outside_the_edges(void) {
    /* An archive parsed from its edges needs every record but the storage in
     * them: one outside is refused before anything is allocated for it. */
    float v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (float)i;
    const int64_t n = 1000;
    size_t alen = 0;
    uint8_t *archive = archive_of(v, 1000, 1, &n, NULL, &alen);
    ckptio_torch *t = NULL;
    /* Both edges whole: parses, the tensor is there. */
    T_OK(ckptio__torch_parse_windows(archive, alen / 2, archive + alen / 2, alen - alen / 2, alen, &t));
    size_t count = 0;
    T_OK(ckptio_torch_count(t, &count));
    T_ASSERT(count == 1);
    ckptio_torch_close(t);
    /* The last 100 bytes cannot hold the central directory of 7 records. */
    T_STATUS(ckptio__torch_parse_windows(archive, 512, archive + alen - 100, 100, alen, &t), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("lies between the first 512 and the last 100 bytes");
    /* The first 40 bytes cannot hold the pickle. */
    T_STATUS(ckptio__torch_parse_windows(archive, 40, archive + 4096, alen - 4096, alen, &t), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("lies between the first 40");
    T_ASSERT(t == NULL);
    free(archive);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_stream_pieces_and_limits);
    T_RUN(test_declared_size_disagrees);
    T_RUN(test_stream_time_and_memory_are_bounded);
    T_RUN(test_large_item_streams_its_boxes);
    T_RUN(test_overlapping_strides);
    T_RUN(test_not_an_archive_is_refused_on_its_first_bytes);
    T_RUN(test_records_outside_the_edges);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
