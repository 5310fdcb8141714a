/*
 * test_model_slices.c - slices of models (ckptio_model): boxes of tensors
 * of every rank and dtype (sub-byte ones cut inside a byte too) read in one
 * call to host memory and the simulated GPU, gathered and added to a plan,
 * against a bit-level reference; every target checked before any byte
 * moves.
 */
#include "gpu_ops.h"
#include "gpu_sim.h"
#include "model_dir_helpers.h"

#include <string.h>
#include <unistd.h>

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

int main(void) {
    make_data();
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_slices_host);
    T_RUN(test_slices_gpu_sim);
    T_RUN(test_neighbour_device_allocations);
    T_RUN(test_slices_gather);
    T_RUN(test_slices_subbyte);
    T_RUN(test_targets_checked_first);
    T_RUN(test_plan_add_slice);
    T_OK(ckptio_engine_destroy(engine));
    free_data();
    return T_EXIT_PASS;
}
