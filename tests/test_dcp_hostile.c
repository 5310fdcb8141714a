/*
 * test_dcp_hostile.c - hostile DCP checkpoint directories through the C
 * API: the tiling check of a tensor's chunks (gaps, overlaps, out of
 * bounds; 200k chunks and random tilings in seconds, the public
 * ckptio_dcp_check_chunks), data file names that leave the directory,
 * byte items whose pickle names a disallowed global, and zstd
 * decompression bombs.
 *
 * Fixtures: tests/data/dcp/, made once by tests/data/make_dcp_fixtures.py.
 */
#include "common_internal.h"
#include "dcp_dir_internal.h"
#include "dcp_dir_helpers.h"

#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_tiling);
    T_RUN(test_file_open);
    T_RUN(test_check_chunks_api);
    T_RUN(test_hostile_byte_item);
    T_RUN(test_zstd_bomb);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
