/*
 * dcp_convert.c - consolidating a DCP directory's tensors into one
 * safetensors file in bounded memory.
 *
 * ckptio_safetensors_save() takes every tensor's memory at once; a
 * checkpoint larger than host memory cannot be handed over that way. The
 * streamed writer of checkpoint_convert.c lays the file out with the same
 * code and asks for the tensors one at a time: each is assembled from its
 * chunks into a single buffer and written at its offset in the atomic
 * temporary, which is committed at the end.
 */
#include "convert_internal.h"
#include "dcp_dir_internal.h"

#include <string.h>

typedef struct dcp_source {
    ckptio_dcp *h;
    const size_t *tensors; /* NULL: source i is tensor i */
} dcp_source;

static ckptio_status fill_from_dcp(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const dcp_source *s = ctx;
    return ckptio_dcp_read_tensor(s->h, s->tensors ? s->tensors[i] : i, buf, nbytes);
}

ckptio_status ckptio_dcp_save_safetensors(ckptio_dcp *h, const char *path, const size_t *tensors, size_t count,
                                          const ckptio_kv *metadata, size_t metadata_count, unsigned flags) {
    CKPTIO_RETURN_IF(!h || !path, CKPTIO_E_INVAL, "ckptio_dcp_save_safetensors: handle and path are required");
    CKPTIO_RETURN_IF(flags & ~(unsigned)CKPTIO_SAFETENSORS_ALIGN_8, CKPTIO_E_INVAL,
                     "ckptio_dcp_save_safetensors: unknown flags 0x%x", flags);
    if (!tensors) count = h->ntensors;
    for (size_t i = 0; tensors && i < count; i++)
        CKPTIO_RETURN_IF(tensors[i] >= h->ntensors, CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)",
                         tensors[i], h->ntensors);
    ckptio_tensor_source *src = ckptio__calloc(count + 1, sizeof *src);
    int64_t *shapes = ckptio__calloc(count * 64 + 1, sizeof *shapes);
    ckptio_status st = CKPTIO_OK;
    if (!src || !shapes) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", count);
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        const ckptio__dcp_tensor *t = &h->tensors[tensors ? tensors[i] : i];
        int64_t *shape = shapes + i * 64;
        memcpy(shape, t->shape, t->ndim * sizeof *shape);
        /* torch counts float4_e2m1fn_x2 in packed pairs, safetensors F4 in values. */
        if (t->dtype == CKPTIO_DTYPE_F4 && t->ndim > 0) shape[t->ndim - 1] *= 2;
        src[i] = (ckptio_tensor_source){.name = t->fqn, .dtype = t->dtype, .ndim = t->ndim, .shape = shape,
                                        .nbytes = t->nbytes, .mem_kind = CKPTIO_MEM_HOST};
    }
    dcp_source ctx = {.h = h, .tensors = tensors};
    st = ckptio__st_save_streamed(h->engine, path, src, count, metadata, metadata_count, flags, fill_from_dcp, &ctx);
out:
    ckptio__free(shapes);
    ckptio__free(src);
    return st;
}
