/*
 * test_model_dir.c - models (ckptio_model): Hugging Face directories, their
 * index and single files as one handle; whole tensors and slices of every
 * rank read in one call (host, simulated GPU, O_DIRECT on unaligned data)
 * against a bit-level reference; and hostile directories and indexes
 * (missing shard, a tensor in two shards, traversal names, absent tensors,
 * duplicate keys, symlinks leaving the directory, a FIFO shard).
 *
 * Shards are written with CKPTIO_SAFETENSORS_ALIGN_8, i.e. byte for byte
 * what the safetensors package writes: data NOT 4 KiB-aligned.
 */
#include "gpu_ops.h"
#include "gpu_sim.h"
#include "helpers.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static ckptio_engine *engine;

#define NSHARDS 3

typedef struct ttensor {
    const char *name;
    ckptio_dtype dtype;
    uint32_t ndim;
    int64_t shape[4];
    int shard;
    unsigned char *data;
    uint64_t nbytes;
} ttensor;

static ttensor T[] = {
    {"embed.weight", CKPTIO_DTYPE_BF16, 2, {37, 24}, 0, NULL, 0},
    {"layers.0.q.weight", CKPTIO_DTYPE_F32, 2, {24, 24}, 0, NULL, 0},
    {"mask", CKPTIO_DTYPE_BOOL, 1, {13}, 0, NULL, 0},
    {"layers.0.q.bias", CKPTIO_DTYPE_F32, 1, {24}, 1, NULL, 0},
    {"layers.0.up", CKPTIO_DTYPE_F16, 3, {5, 7, 9}, 1, NULL, 0},
    {"layers.0.norm", CKPTIO_DTYPE_F64, 1, {3}, 1, NULL, 0},
    {"layers.1.w", CKPTIO_DTYPE_I8, 4, {3, 4, 5, 6}, 2, NULL, 0},
    {"layers.1.scalar", CKPTIO_DTYPE_U8, 0, {0}, 2, NULL, 0},
    {"layers.1.empty", CKPTIO_DTYPE_I64, 2, {0, 5}, 2, NULL, 0},
    {"layers.1.f4", CKPTIO_DTYPE_F4, 2, {4, 6}, 2, NULL, 0},
    {"layers.1.columns", CKPTIO_DTYPE_I16, 2, {10000, 8}, 2, NULL, 0},
    {"layers.1.f8", CKPTIO_DTYPE_F8_E4M3, 3, {2, 3, 17}, 2, NULL, 0},
};
#define NT (sizeof T / sizeof T[0])

static uint64_t numel(const ttensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

static void make_data(void) {
    for (size_t i = 0; i < NT; i++) {
        T[i].nbytes = numel(&T[i]) * ckptio_dtype_bits(T[i].dtype) / 8;
        T[i].data = malloc(T[i].nbytes ? T[i].nbytes : 1);
        t_fill_random(T[i].data, T[i].nbytes, 100 + i);
    }
}

static const char *shard_name(int s) {
    static char buf[4][64];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 64, "model-%05d-of-%05d.safetensors", s + 1, NSHARDS);
    return b;
}

static char *join2(const char *a, const char *b) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 1024, "%s/%s", a, b);
    return p;
}

/* Writes shard s of T (those with shard == s, plus `extra` tensors of other
 * shards when given) into dir. */
static void write_shard(const char *dir, const char *name, int s, const char *also) {
    ckptio_tensor_source src[NT];
    size_t n = 0;
    for (size_t i = 0; i < NT; i++)
        if (T[i].shard == s || (also && strcmp(also, T[i].name) == 0))
            src[n++] = (ckptio_tensor_source){T[i].name, T[i].dtype, T[i].ndim, T[i].shape, T[i].data, T[i].nbytes,
                                              CKPTIO_MEM_HOST};
    const ckptio_kv md[] = {{"format", "pt"}};
    T_OK(ckptio_safetensors_save(engine, join2(dir, name), src, n, md, 1, CKPTIO_SAFETENSORS_ALIGN_8));
}

static void write_text(const char *path, const char *text) { t_write_file(path, text, strlen(text)); }

/* The index for T; `extra` is appended inside weight_map (may be ""). */
static void write_index(const char *dir, const char *extra) {
    char json[8192];
    size_t pos = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < NT; i++) total += T[i].nbytes;
    pos += (size_t)snprintf(json + pos, sizeof json - pos, "{\"metadata\": {\"total_size\": %llu}, \"weight_map\": {",
                            (unsigned long long)total);
    for (size_t i = 0; i < NT; i++)
        pos += (size_t)snprintf(json + pos, sizeof json - pos, "%s\"%s\": \"%s\"", i ? ", " : "", T[i].name,
                                shard_name(T[i].shard));
    snprintf(json + pos, sizeof json - pos, "%s}}", extra);
    write_text(join2(dir, "model.safetensors.index.json"), json);
}

static const char *make_model_dir(const char *name) {
    static char dirs[8][1024];
    static int k;
    char *dir = dirs[k++ % 8];
    snprintf(dir, 1024, "%s", t_path(name));
    T_ASSERT(mkdir(dir, 0755) == 0);
    for (int s = 0; s < NSHARDS; s++) write_shard(dir, shard_name(s), s, NULL);
    write_index(dir, "");
    return dir;
}

static size_t find_t(const char *name) {
    for (size_t i = 0; i < NT; i++)
        if (strcmp(T[i].name, name) == 0) return i;
    t_fail_at(__FILE__, __LINE__, "no test tensor %s", name);
}

/* ---- the bit-level reference ---------------------------------------------------------- */

static int get_bit(const unsigned char *p, uint64_t b) { return (p[b / 8] >> (b % 8)) & 1; }
static void set_bit(unsigned char *p, uint64_t b, int v) {
    if (v) p[b / 8] |= (unsigned char)(1u << (b % 8));
    else p[b / 8] &= (unsigned char)~(1u << (b % 8));
}

/* The box of t in C order, element by element, bit by bit. */
static unsigned char *reference_box(const ttensor *t, const int64_t *start, const int64_t *stop, uint64_t *nbytes) {
    const unsigned bits = ckptio_dtype_bits(t->dtype);
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++) n *= (uint64_t)(stop[d] - start[d]);
    *nbytes = n * bits / 8;
    unsigned char *out = calloc(*nbytes + 1, 1);
    int64_t idx[4];
    for (uint32_t d = 0; d < t->ndim; d++) idx[d] = start[d];
    for (uint64_t e = 0; e < n; e++) {
        uint64_t flat = 0;
        for (uint32_t d = 0; d < t->ndim; d++) flat = flat * (uint64_t)t->shape[d] + (uint64_t)idx[d];
        for (unsigned b = 0; b < bits; b++) set_bit(out, e * bits + b, get_bit(t->data, flat * bits + b));
        for (uint32_t d = t->ndim; d-- > 0;) {
            if (++idx[d] < stop[d]) break;
            idx[d] = start[d];
        }
    }
    return out;
}

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

/* ---- slices ---------------------------------------------------------------------------- */

static uint64_t rnd_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(uint64_t n) {
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return n ? rnd_state % n : 0;
}

typedef struct wanted {
    size_t t;
    int64_t start[4], stop[4];
    unsigned char *buf, *ref;
    uint64_t nbytes;
} wanted;

/* Random boxes of random byte-sized tensors, 8 per call, against the reference. */
static void random_slices(ckptio_model *m, ckptio_mem_kind kind, unsigned char *(*alloc)(size_t),
                          void (*release)(unsigned char *), int rounds) {
    for (int round = 0; round < rounds; round++) {
        enum { K = 8 };
        wanted w[K];
        ckptio_slice_target targets[K];
        for (int k = 0; k < K; k++) {
            size_t t;
            do t = rnd(NT);
            while (ckptio_dtype_bits(T[t].dtype) % 8);
            w[k].t = t;
            for (uint32_t d = 0; d < T[t].ndim; d++) {
                const int64_t n = T[t].shape[d];
                const uint64_t mode = rnd(4);
                if (mode == 0) { /* whole */
                    w[k].start[d] = 0;
                    w[k].stop[d] = n;
                } else if (mode == 1) { /* one index */
                    w[k].start[d] = n ? (int64_t)rnd((uint64_t)n) : 0;
                    w[k].stop[d] = n ? w[k].start[d] + 1 : 0;
                } else { /* any range, empty included */
                    int64_t a = (int64_t)rnd((uint64_t)n + 1), b = (int64_t)rnd((uint64_t)n + 1);
                    w[k].start[d] = a < b ? a : b;
                    w[k].stop[d] = a < b ? b : a;
                }
            }
            w[k].ref = reference_box(&T[t], w[k].start, w[k].stop, &w[k].nbytes);
            w[k].buf = alloc(w[k].nbytes + 1);
            size_t index;
            T_OK(ckptio_model_find(m, T[t].name, &index));
            targets[k] = (ckptio_slice_target){.index = index, .start = w[k].start, .stop = w[k].stop,
                                               .data = w[k].buf, .capacity = w[k].nbytes, .mem_kind = kind};
            ckptio_slice sl = {T[t].dtype, T[t].ndim, T[t].shape, w[k].start, w[k].stop};
            uint64_t nb = 0;
            T_OK(ckptio_slice_bytes(&sl, &nb, NULL));
            T_ASSERT(nb == w[k].nbytes);
        }
        T_OK(ckptio_model_read(m, targets, K));
        for (int k = 0; k < K; k++) {
            T_ASSERT_MSG(memcmp(w[k].buf, w[k].ref, w[k].nbytes) == 0, "round %d: slice of %s (dims %u) differs",
                         round, T[w[k].t].name, T[w[k].t].ndim);
            release(w[k].buf);
            free(w[k].ref);
        }
    }
}

static unsigned char *host_alloc(size_t n) {
    unsigned char *p = malloc(n);
    memset(p, 0xEE, n);
    return p;
}
static void host_free(unsigned char *p) { free(p); }
static unsigned char *sim_alloc(size_t n) { return ckptio__gpu_sim_device_alloc(n); }
static void sim_free(unsigned char *p) { ckptio__gpu_sim_device_free(p); }

static void test_slices_host(void) {
    const char *dir = make_model_dir("slices");
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    random_slices(m, CKPTIO_MEM_HOST, host_alloc, host_free, 150);
    T_OK(ckptio_model_close(m));
}

/* Slices into (simulated) GPU memory go through the engine's GPU path. */
static void test_slices_gpu_sim(void) {
    const char *dir = make_model_dir("slices_gpu");
    ckptio__gpu_sim_configure(NULL);
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(engine, &a));
    random_slices(m, CKPTIO_MEM_CUDA, sim_alloc, sim_free, 40);
    T_OK(ckptio_engine_stats(engine, &b));
    T_ASSERT(b.bytes_h2d > a.bytes_h2d);
    /* A column slice of many short runs stays one extent per run on the GPU path. */
    const size_t c = find_t("layers.1.columns");
    const int64_t start[2] = {0, 3}, stop[2] = {10000, 5};
    uint64_t nb;
    unsigned char *ref = reference_box(&T[c], start, stop, &nb);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(nb);
    size_t index;
    T_OK(ckptio_model_find(m, T[c].name, &index));
    ckptio_slice_target t = {index, start, stop, dev, nb, CKPTIO_MEM_CUDA};
    T_OK(ckptio_model_read(m, &t, 1));
    T_ASSERT(memcmp(dev, ref, nb) == 0);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.violations == 0);
    ckptio__gpu_sim_device_free(dev);
    free(ref);
    T_OK(ckptio_model_close(m));
    ckptio__gpu_set_ops(NULL);
}

/* Two tensors back to back in a shard, read into two device allocations that
 * happen to lie back to back (as cudaMalloc may place them): each is its own
 * allocation, so the reads must not become one extent spanning both, which
 * the device range check refuses. */
static void test_neighbour_device_allocations(void) {
    const char *dir = make_model_dir("neighbours_gpu");
    ckptio__gpu_sim_configure(NULL);
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    size_t count, first = SIZE_MAX;
    T_OK(ckptio_model_count(m, &count));
    ckptio_tensor_info a, b;
    size_t sa, sb;
    for (size_t i = 0; i + 1 < count && first == SIZE_MAX; i++) {
        T_OK(ckptio_model_tensor(m, i, &a, &sa));
        T_OK(ckptio_model_tensor(m, i + 1, &b, &sb));
        if (sa == sb && a.nbytes && b.nbytes && b.nbytes <= a.nbytes && a.file_offset + a.nbytes == b.file_offset)
            first = i;
    }
    T_ASSERT_MSG(first != SIZE_MAX, "no two neighbouring tensors in one shard");
    unsigned char *dev = ckptio__gpu_sim_device_alloc_pieces(a.nbytes + b.nbytes, a.nbytes, false);
    T_ASSERT(dev);
    ckptio_slice_target t[2] = {{first, NULL, NULL, dev, a.nbytes, CKPTIO_MEM_CUDA},
                                {first + 1, NULL, NULL, dev + a.nbytes, b.nbytes, CKPTIO_MEM_CUDA}};
    T_OK(ckptio_model_read(m, t, 2));
    T_ASSERT(memcmp(dev, T[find_t(a.name)].data, a.nbytes) == 0);
    T_ASSERT(memcmp(dev + a.nbytes, T[find_t(b.name)].data, b.nbytes) == 0);
    ckptio__gpu_sim_device_free(dev);
    T_OK(ckptio_model_close(m));
    ckptio__gpu_set_ops(NULL);
}

/* One column of a 10000 x 8 int16 matrix: 10000 runs of 4 bytes, read as the
 * covering range and gathered (host), next to direct targets in one call. */
static void test_slices_gather(void) {
    const char *dir = make_model_dir("gather");
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    const size_t c = find_t("layers.1.columns"), q = find_t("layers.0.q.weight");
    const int64_t start[2] = {17, 2}, stop[2] = {9999, 4};
    const int64_t qs[2] = {3, 0}, qe[2] = {9, 24};
    uint64_t nb, qnb, runs;
    unsigned char *ref = reference_box(&T[c], start, stop, &nb);
    unsigned char *qref = reference_box(&T[q], qs, qe, &qnb);
    const ckptio_slice sl = {T[c].dtype, 2, T[c].shape, start, stop};
    T_OK(ckptio_slice_bytes(&sl, NULL, &runs));
    T_ASSERT(runs == 9982);
    unsigned char *buf = host_alloc(nb + 1), *qbuf = host_alloc(qnb + 1);
    ckptio_slice_target t[2];
    T_OK(ckptio_model_find(m, T[c].name, &t[0].index));
    T_OK(ckptio_model_find(m, T[q].name, &t[1].index));
    t[0] = (ckptio_slice_target){t[0].index, start, stop, buf, nb, CKPTIO_MEM_HOST};
    t[1] = (ckptio_slice_target){t[1].index, qs, qe, qbuf, qnb, CKPTIO_MEM_AUTO};
    ckptio_stats a, b;
    T_OK(ckptio_engine_stats(engine, &a));
    T_OK(ckptio_model_read(m, t, 2));
    T_OK(ckptio_engine_stats(engine, &b));
    T_ASSERT(memcmp(buf, ref, nb) == 0 && buf[nb] == 0xEE);
    T_ASSERT(memcmp(qbuf, qref, qnb) == 0 && qbuf[qnb] == 0xEE);
    /* Gathered: far fewer requests than runs. */
    T_ASSERT_MSG(b.io_requests - a.io_requests < 1000, "%llu requests for a gathered slice",
                 (unsigned long long)(b.io_requests - a.io_requests));
    free(buf);
    free(qbuf);
    free(ref);
    free(qref);
    T_OK(ckptio_model_close(m));
}

/* F4 packs two values per byte: cuts on byte boundaries only. */
static void test_slices_subbyte(void) {
    const char *dir = make_model_dir("f4");
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    const size_t f = find_t("layers.1.f4");
    size_t index;
    T_OK(ckptio_model_find(m, T[f].name, &index));
    static const int64_t ok[][4] = {{1, 3, 2, 6}, {1, 2, 0, 6}, {0, 4, 0, 6}, {2, 4, 4, 6}, {0, 4, 2, 4}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        const int64_t start[2] = {ok[i][0], ok[i][2]}, stop[2] = {ok[i][1], ok[i][3]};
        uint64_t nb;
        unsigned char *ref = reference_box(&T[f], start, stop, &nb);
        unsigned char *buf = host_alloc(nb + 1);
        ckptio_slice_target t = {index, start, stop, buf, nb, CKPTIO_MEM_HOST};
        T_OK(ckptio_model_read(m, &t, 1));
        T_ASSERT_MSG(memcmp(buf, ref, nb) == 0, "F4 slice %zu", i);
        free(buf);
        free(ref);
    }
    /* Rows of 6 values are 3 bytes: column 1 starts mid-byte; [1:2, 0:3]
     * ends mid-byte. */
    static const int64_t bad[][4] = {{0, 4, 1, 3}, {1, 2, 0, 3}, {0, 1, 3, 4}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int64_t start[2] = {bad[i][0], bad[i][2]}, stop[2] = {bad[i][1], bad[i][3]};
        unsigned char buf[16];
        ckptio_slice_target t = {index, start, stop, buf, sizeof buf, CKPTIO_MEM_HOST};
        T_STATUS(ckptio_model_read(m, &t, 1), CKPTIO_E_INVAL);
        T_MESSAGE_HAS("byte");
        T_MESSAGE_HAS("layers.1.f4");
    }
    T_OK(ckptio_model_close(m));
}

/* Every target is checked before a byte moves. */
static void test_targets_checked_first(void) {
    const char *dir = make_model_dir("checks");
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    size_t a, b;
    T_OK(ckptio_model_find(m, "embed.weight", &a));
    T_OK(ckptio_model_find(m, "layers.0.up", &b));
    unsigned char *x = host_alloc(4096), *y = host_alloc(4096);
    const int64_t s3[3] = {0, 0, 0}, e3[3] = {5, 7, 10}, s3b[3] = {2, 1, 0}, e3ok[3] = {3, 7, 9};
    ckptio_slice_target t[2] = {{a, NULL, NULL, x, 37 * 24 * 2, CKPTIO_MEM_HOST},
                                {b, s3, e3, y, 4096, CKPTIO_MEM_HOST}};
    T_STATUS(ckptio_model_read(m, t, 2), CKPTIO_E_RANGE); /* stop 10 > 9 */
    T_MESSAGE_HAS("target 1");
    T_MESSAGE_HAS("layers.0.up");
    T_MESSAGE_HAS("dimension 2");
    t[1].stop = e3ok;
    t[1].start = s3b;
    t[1].capacity = 10;
    T_STATUS(ckptio_model_read(m, t, 2), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("room for 10 bytes");
    t[1].capacity = 4096;
    t[1].start = NULL;
    T_STATUS(ckptio_model_read(m, t, 2), CKPTIO_E_INVAL); /* stop without start */
    t[1].start = s3;
    t[1].index = 1000;
    T_STATUS(ckptio_model_read(m, t, 2), CKPTIO_E_RANGE);
    t[1].index = b;
    t[1].data = x + 100; /* overlaps target 0 */
    T_STATUS(ckptio_model_read(m, t, 2), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("overlapping");
    for (int i = 0; i < 4096; i++) T_ASSERT(x[i] == 0xEE && y[i] == 0xEE);
    t[1].data = y;
    T_OK(ckptio_model_read(m, t, 2));
    T_ASSERT(memcmp(x, T[find_t("embed.weight")].data, 37 * 24 * 2) == 0);
    free(x);
    free(y);
    T_OK(ckptio_model_close(m));
}

/* The building block on its own: a plan of runs any caller can execute. */
static void test_plan_add_slice(void) {
    const char *dir = make_model_dir("plan");
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, dir, 0, &m));
    const size_t u = find_t("layers.0.up");
    size_t index, shard;
    ckptio_tensor_info info;
    ckptio_safetensors *st;
    T_OK(ckptio_model_find(m, T[u].name, &index));
    T_OK(ckptio_model_tensor(m, index, &info, &shard));
    T_OK(ckptio_model_shard(m, shard, NULL, &st));
    ckptio_file *file = NULL;
    const char *path;
    T_OK(ckptio_model_shard(m, shard, &path, NULL));
    T_OK(ckptio_file_open(engine, path, CKPTIO_OPEN_READ, &file));
    const int64_t start[3] = {1, 2, 0}, stop[3] = {4, 5, 9};
    const ckptio_slice sl = {T[u].dtype, 3, T[u].shape, start, stop};
    uint64_t nb, runs;
    T_OK(ckptio_slice_bytes(&sl, &nb, &runs));
    T_ASSERT(runs == 3 && nb == 3 * 3 * 9 * 2); /* dims 1..2 merge into runs of 3 x 9 */
    unsigned char *ref = reference_box(&T[u], start, stop, &nb), *buf = host_alloc(nb);
    ckptio_plan *plan;
    size_t added = 0;
    T_OK(ckptio_plan_create(CKPTIO_READ, &plan));
    T_OK(ckptio_plan_add_slice(plan, file, info.file_offset, &sl, buf, CKPTIO_MEM_HOST, &added));
    T_ASSERT(added == 3);
    T_OK(ckptio_engine_execute(engine, plan));
    T_ASSERT(memcmp(buf, ref, nb) == 0);
    T_OK(ckptio_plan_destroy(plan));
    /* Malformed slices. */
    const int64_t neg[3] = {-1, 0, 0}, rev[3] = {3, 0, 0}, two[3] = {2, 7, 9};
    ckptio_slice b1 = {T[u].dtype, 3, T[u].shape, neg, stop};
    T_STATUS(ckptio_slice_bytes(&b1, NULL, NULL), CKPTIO_E_RANGE);
    ckptio_slice b2 = {T[u].dtype, 3, T[u].shape, rev, two};
    T_STATUS(ckptio_slice_bytes(&b2, NULL, NULL), CKPTIO_E_RANGE);
    ckptio_slice b3 = {T[u].dtype, 3, T[u].shape, start, NULL};
    T_STATUS(ckptio_slice_bytes(&b3, NULL, NULL), CKPTIO_E_INVAL);
    ckptio_slice b4 = {(ckptio_dtype)99, 3, T[u].shape, NULL, NULL};
    T_STATUS(ckptio_slice_bytes(&b4, NULL, NULL), CKPTIO_E_INVAL);
    const int64_t huge[3] = {INT64_MAX, INT64_MAX, 2};
    ckptio_slice b5 = {CKPTIO_DTYPE_F32, 3, huge, NULL, NULL};
    T_STATUS(ckptio_slice_bytes(&b5, NULL, NULL), CKPTIO_E_RANGE);
    const int64_t zero[3] = {0, INT64_MAX, INT64_MAX};
    ckptio_slice b6 = {CKPTIO_DTYPE_F32, 3, zero, NULL, NULL};
    T_OK(ckptio_slice_bytes(&b6, &nb, &runs)); /* empty: no product to overflow */
    T_ASSERT(nb == 0 && runs == 0);
    free(ref);
    free(buf);
    T_OK(ckptio_file_close(file));
    T_OK(ckptio_model_close(m));
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
    T_RUN(test_slices_host);
    T_RUN(test_slices_gpu_sim);
    T_RUN(test_neighbour_device_allocations);
    T_RUN(test_slices_gather);
    T_RUN(test_slices_subbyte);
    T_RUN(test_targets_checked_first);
    T_RUN(test_plan_add_slice);
    T_RUN(test_dir_forms);
    T_RUN(test_hostile_index);
    T_RUN(test_symlinks);
    T_RUN(test_special_files);
    T_OK(ckptio_engine_destroy(engine));
    for (size_t i = 0; i < NT; i++) free(T[i].data);
    return T_EXIT_PASS;
}
