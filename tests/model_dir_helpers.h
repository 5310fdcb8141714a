/*
 * model_dir_helpers.h - what the tests of models (ckptio_model) share
 * (test_model_dir.c, test_model_slices.c): the engine, the test tensors T
 * (every dtype and rank, some empty, one of 10000 rows) with random data,
 * and a Hugging Face directory of NSHARDS shards and its index written
 * from them.
 *
 * Shards are written with CKPTIO_SAFETENSORS_ALIGN_8, i.e. byte for byte
 * what the safetensors package writes: data NOT 4 KiB-aligned.
 */
#ifndef CKPTIO_TEST_MODEL_DIR_HELPERS_H
#define CKPTIO_TEST_MODEL_DIR_HELPERS_H

#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

static inline uint64_t numel(const ttensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

static inline void make_data(void) {
    for (size_t i = 0; i < NT; i++) {
        T[i].nbytes = numel(&T[i]) * ckptio_dtype_bits(T[i].dtype) / 8;
        T[i].data = malloc(T[i].nbytes ? T[i].nbytes : 1);
        t_fill_random(T[i].data, T[i].nbytes, 100 + i);
    }
}

static inline const char *shard_name(int s) {
    static char buf[4][64];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 64, "model-%05d-of-%05d.safetensors", s + 1, NSHARDS);
    return b;
}

static inline char *join2(const char *a, const char *b) {
    static char buf[8][1024];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 1024, "%s/%s", a, b);
    return p;
}

/* Writes shard s of T (those with shard == s, plus `extra` tensors of other
 * shards when given) into dir. */
static inline void write_shard(const char *dir, const char *name, int s, const char *also) {
    ckptio_tensor_source src[NT];
    size_t n = 0;
    for (size_t i = 0; i < NT; i++)
        if (T[i].shard == s || (also && strcmp(also, T[i].name) == 0))
            src[n++] = (ckptio_tensor_source){T[i].name, T[i].dtype, T[i].ndim, T[i].shape, T[i].data, T[i].nbytes,
                                              CKPTIO_MEM_HOST};
    const ckptio_kv md[] = {{"format", "pt"}};
    T_OK(ckptio_safetensors_save(engine, join2(dir, name), src, n, md, 1, CKPTIO_SAFETENSORS_ALIGN_8));
}

static inline void write_text(const char *path, const char *text) { t_write_file(path, text, strlen(text)); }

/* The index for T; `extra` is appended inside weight_map (may be ""). */
static inline void write_index(const char *dir, const char *extra) {
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

static inline const char *make_model_dir(const char *name) {
    static char dirs[8][1024];
    static int k;
    char *dir = dirs[k++ % 8];
    snprintf(dir, 1024, "%s", t_path(name));
    T_ASSERT(mkdir(dir, 0755) == 0);
    for (int s = 0; s < NSHARDS; s++) write_shard(dir, shard_name(s), s, NULL);
    write_index(dir, "");
    return dir;
}

static inline size_t find_t(const char *name) {
    for (size_t i = 0; i < NT; i++)
        if (strcmp(T[i].name, name) == 0) return i;
    t_fail_at(__FILE__, __LINE__, "no test tensor %s", name);
}

/* Frees the test tensors' data. */
static inline void free_data(void) {
    for (size_t i = 0; i < NT; i++) free(T[i].data);
}

#endif /* CKPTIO_TEST_MODEL_DIR_HELPERS_H */
