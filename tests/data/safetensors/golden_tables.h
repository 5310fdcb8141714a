/*
 * golden_tables.h - the C side of tests/data/make_safetensors_golden.py:
 * the tensors of each golden file, in the script's list order, and the
 * content formula. Included by the tests/test_safetensors_*.c programs.
 */
#ifndef CKPTIO_TEST_SAFETENSORS_GOLDEN_TABLES_H
#define CKPTIO_TEST_SAFETENSORS_GOLDEN_TABLES_H

#include "ckptio.h"

#include <stdint.h>
#include <string.h>

typedef struct golden_tensor {
    const char *name;
    ckptio_dtype dtype;
    uint32_t ndim;
    int64_t shape[3];
} golden_tensor;

static const golden_tensor golden_numpy[] = {
    {"model.embed_tokens.weight", CKPTIO_DTYPE_F32, 2, {4, 3}},
    {"layers.0.attn.q_proj.weight", CKPTIO_DTYPE_F16, 2, {2, 5}},
    {"layers.0.attn.scale", CKPTIO_DTYPE_F64, 0, {0}},
    {"layers.0.mlp.up", CKPTIO_DTYPE_I64, 1, {3}},
    {"layers.0.mlp.down", CKPTIO_DTYPE_I32, 2, {2, 2}},
    {"emb\xc3\xa9" "d", CKPTIO_DTYPE_I16, 1, {3}},
    {"quote\"back\\slash", CKPTIO_DTYPE_I8, 1, {5}},
    {"ctl\x01\x1f\t\n", CKPTIO_DTYPE_U8, 1, {7}},
    {"slash/and\x7f", CKPTIO_DTYPE_U16, 1, {2}},
    {"u32", CKPTIO_DTYPE_U32, 2, {1, 2}},
    {"u64", CKPTIO_DTYPE_U64, 1, {2}},
    {"mask", CKPTIO_DTYPE_BOOL, 2, {3, 3}},
    {"complex", CKPTIO_DTYPE_C64, 1, {2}},
    {"empty", CKPTIO_DTYPE_F32, 1, {0}},
    {"empty3d", CKPTIO_DTYPE_I16, 3, {2, 0, 3}},
};
static const ckptio_kv golden_numpy_metadata[] = {{"format", "np"}};

static const golden_tensor golden_torch[] = {
    {"bf16", CKPTIO_DTYPE_BF16, 2, {2, 3}},
    {"f8_e4m3", CKPTIO_DTYPE_F8_E4M3, 1, {5}},
    {"f8_e5m2", CKPTIO_DTYPE_F8_E5M2, 1, {4}},
    {"f8_e4m3fnuz", CKPTIO_DTYPE_F8_E4M3FNUZ, 1, {3}},
    {"f8_e5m2fnuz", CKPTIO_DTYPE_F8_E5M2FNUZ, 1, {2}},
    {"f8_e8m0", CKPTIO_DTYPE_F8_E8M0, 1, {3}},
    {"f4", CKPTIO_DTYPE_F4, 2, {2, 6}},
    {"w", CKPTIO_DTYPE_F32, 1, {2}},
    {"step", CKPTIO_DTYPE_I64, 0, {0}},
};

/* unaligned_f6.safetensors: written by hand, no padding. */
static const golden_tensor golden_f6[] = {
    {"f6a", CKPTIO_DTYPE_F6_E2M3, 1, {4}},
    {"f6b", CKPTIO_DTYPE_F6_E3M2, 2, {2, 4}},
    {"u8", CKPTIO_DTYPE_U8, 1, {2}},
};
static const ckptio_kv golden_f6_metadata[] = {{"writer", "hand"}, {"note", "unpadded"}};
#define GOLDEN_F6_DATA_OFFSET 234u

#define GOLDEN_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static inline uint64_t golden_nbytes(const golden_tensor *t) {
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n * ckptio_dtype_bits(t->dtype) / 8;
}

/* Byte j of the tensor at list position k. */
static inline void golden_fill(unsigned char *buf, uint64_t len, size_t k, ckptio_dtype dtype) {
    for (uint64_t j = 0; j < len; j++) {
        unsigned char b = (unsigned char)((j * 131 + k * 17 + 7) & 0xff);
        buf[j] = dtype == CKPTIO_DTYPE_BOOL ? (unsigned char)(b & 1) : b;
    }
}

#endif
