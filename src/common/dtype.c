/*
 * dtype.c - the dtype table shared by every format.
 *
 * One row per ckptio_dtype: bits, the safetensors name, the torch name and
 * the rank the safetensors reference writer sorts by (docs/FORMATS.md section 3).
 */
#include "common_internal.h"

#include <string.h>

typedef struct dtype_row {
    unsigned bits;
    const char *st_name;    /* "" when safetensors has no name for it */
    const char *torch_name; /* NULL when torch has no such dtype */
    int st_rank;            /* higher sorts first in the reference writer: the order of
                             * safetensors' Dtype enum (safetensors/src/tensor.rs, checked
                             * against safetensors 0.8.0 output); -1 = no safetensors name */
} dtype_row;

static const dtype_row dtype_table[CKPTIO_DTYPE_COUNT_] = {
    [CKPTIO_DTYPE_BOOL] = {8, "BOOL", "bool", 0},
    [CKPTIO_DTYPE_U8] = {8, "U8", "uint8", 50},
    [CKPTIO_DTYPE_I8] = {8, "I8", "int8", 60},
    [CKPTIO_DTYPE_U16] = {16, "U16", "uint16", 110},
    [CKPTIO_DTYPE_I16] = {16, "I16", "int16", 100},
    [CKPTIO_DTYPE_U32] = {32, "U32", "uint32", 150},
    [CKPTIO_DTYPE_I32] = {32, "I32", "int32", 140},
    [CKPTIO_DTYPE_U64] = {64, "U64", "uint64", 200},
    [CKPTIO_DTYPE_I64] = {64, "I64", "int64", 190},
    [CKPTIO_DTYPE_F16] = {16, "F16", "float16", 120},
    [CKPTIO_DTYPE_BF16] = {16, "BF16", "bfloat16", 130},
    [CKPTIO_DTYPE_F32] = {32, "F32", "float32", 160},
    [CKPTIO_DTYPE_F64] = {64, "F64", "float64", 180},
    [CKPTIO_DTYPE_C32] = {32, "", "complex32", -1},
    [CKPTIO_DTYPE_C64] = {64, "C64", "complex64", 170},
    [CKPTIO_DTYPE_C128] = {128, "", "complex128", -1},
    [CKPTIO_DTYPE_F8_E5M2] = {8, "F8_E5M2", "float8_e5m2", 70},
    [CKPTIO_DTYPE_F8_E4M3] = {8, "F8_E4M3", "float8_e4m3fn", 80},
    [CKPTIO_DTYPE_F8_E5M2FNUZ] = {8, "F8_E5M2FNUZ", "float8_e5m2fnuz", 94},
    [CKPTIO_DTYPE_F8_E4M3FNUZ] = {8, "F8_E4M3FNUZ", "float8_e4m3fnuz", 92},
    [CKPTIO_DTYPE_F8_E8M0] = {8, "F8_E8M0", "float8_e8m0fnu", 90},
    [CKPTIO_DTYPE_F6_E2M3] = {6, "F6_E2M3", NULL, 30},
    [CKPTIO_DTYPE_F6_E3M2] = {6, "F6_E3M2", NULL, 40},
    [CKPTIO_DTYPE_F4] = {4, "F4", "float4_e2m1fn_x2", 20},
};

static const dtype_row *row_of(ckptio_dtype dtype) {
    if ((unsigned)dtype >= CKPTIO_DTYPE_COUNT_) return NULL;
    return &dtype_table[dtype];
}

unsigned ckptio_dtype_bits(ckptio_dtype dtype) {
    const dtype_row *row = row_of(dtype);
    return row ? row->bits : 0;
}

const char *ckptio_dtype_name(ckptio_dtype dtype) {
    const dtype_row *row = row_of(dtype);
    return row ? row->st_name : NULL;
}

const char *ckptio_dtype_torch_name(ckptio_dtype dtype) {
    const dtype_row *row = row_of(dtype);
    return row ? row->torch_name : NULL;
}

ckptio_status ckptio_dtype_from_name(const char *name, ckptio_dtype *out) {
    if (!name || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "dtype name and output must not be NULL");
    const char *bare = strncmp(name, "torch.", 6) == 0 ? name + 6 : name;
    for (int i = 0; i < CKPTIO_DTYPE_COUNT_; i++) {
        const dtype_row *row = &dtype_table[i];
        if ((row->st_name[0] && strcmp(name, row->st_name) == 0) ||
            (row->torch_name && strcmp(bare, row->torch_name) == 0)) {
            *out = (ckptio_dtype)i;
            return CKPTIO_OK;
        }
    }
    return CKPTIO_FAIL(CKPTIO_E_NOT_FOUND, "unknown dtype '%s'", name);
}

int ckptio__dtype_safetensors_rank(ckptio_dtype dtype) {
    const dtype_row *row = row_of(dtype);
    return row ? row->st_rank : -1;
}

bool ckptio__dtype_nbytes(ckptio_dtype dtype, uint64_t numel, uint64_t *out) {
    unsigned bits = ckptio_dtype_bits(dtype);
    uint64_t total_bits;
    if (bits == 0 || ckptio__mul_overflows(numel, bits, &total_bits)) return false;
    if (total_bits % 8 != 0) return false;
    *out = total_bits / 8;
    return true;
}
