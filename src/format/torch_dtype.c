/*
 * torch_dtype.c - torch's legacy storage classes (torch/storage.py
 * _dtype_to_storage_type_map): which dtypes torch.save pickles as
 * torch.<X>Storage with _rebuild_tensor_v2, the others going through
 * torch.storage.UntypedStorage + a dtype global with _rebuild_tensor_v3.
 */
#include "torch_internal.h"

#include <string.h>

typedef struct storage_class {
    ckptio_dtype dtype;
    const char *name;
} storage_class;

static const storage_class classes[] = {
    {CKPTIO_DTYPE_F64, "DoubleStorage"},         {CKPTIO_DTYPE_F32, "FloatStorage"},
    {CKPTIO_DTYPE_F16, "HalfStorage"},           {CKPTIO_DTYPE_BF16, "BFloat16Storage"},
    {CKPTIO_DTYPE_I64, "LongStorage"},           {CKPTIO_DTYPE_I32, "IntStorage"},
    {CKPTIO_DTYPE_I16, "ShortStorage"},          {CKPTIO_DTYPE_I8, "CharStorage"},
    {CKPTIO_DTYPE_U8, "ByteStorage"},            {CKPTIO_DTYPE_BOOL, "BoolStorage"},
    {CKPTIO_DTYPE_C128, "ComplexDoubleStorage"}, {CKPTIO_DTYPE_C64, "ComplexFloatStorage"},
};

const char *ckptio__torch_storage_class(ckptio_dtype dtype) {
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        if (classes[i].dtype == dtype) return classes[i].name;
    return NULL;
}

bool ckptio__torch_storage_class_dtype(const char *name, ckptio_dtype *out) {
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        if (strcmp(classes[i].name, name) == 0) {
            *out = classes[i].dtype;
            return true;
        }
    }
    return false;
}

/* The dtype globals of pickles (torch.float32 is "float32"). */
bool ckptio__dtype_from_torch_name(const char *name, ckptio_dtype *out) {
    for (int d = 0; d < CKPTIO_DTYPE_COUNT_; d++) {
        const char *tn = ckptio_dtype_torch_name((ckptio_dtype)d);
        if (tn && strcmp(tn, name) == 0) {
            *out = (ckptio_dtype)d;
            return true;
        }
    }
    return false;
}
