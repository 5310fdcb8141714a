/*
 * dcp_convert.c - consolidating a DCP directory's tensors into one
 * safetensors file in bounded memory.
 *
 * ckptio_safetensors_save() takes every tensor's memory at once; a
 * checkpoint larger than host memory cannot be handed over that way. Here
 * the header comes from the same layout code (so the file is what
 * ckptio_safetensors_save would write for these tensors), and the tensors
 * are assembled one at a time into a single buffer and written at their
 * offsets in the atomic temporary, which is committed at the end.
 */
#include "dcp_dir_internal.h"
#include "engine_internal.h"
#include "safetensors_internal.h"

#include <string.h>

ckptio_status ckptio_dcp_save_safetensors(ckptio_dcp *h, const char *path, const size_t *tensors, size_t count,
                                          const ckptio_kv *metadata, size_t metadata_count, unsigned flags) {
    CKPTIO_RETURN_IF(!h || !path, CKPTIO_E_INVAL, "ckptio_dcp_save_safetensors: handle and path are required");
    CKPTIO_RETURN_IF(flags & ~(unsigned)CKPTIO_SAFETENSORS_ALIGN_8, CKPTIO_E_INVAL,
                     "ckptio_dcp_save_safetensors: unknown flags 0x%x", flags);
    if (!tensors) count = h->ntensors;
    for (size_t i = 0; tensors && i < count; i++)
        CKPTIO_RETURN_IF(tensors[i] >= h->ntensors, CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)",
                         tensors[i], h->ntensors);
    static const uint8_t placeholder = 0; /* the layout checks data != NULL; it is never read */
    ckptio__st_layout layout = {0};
    ckptio_tensor_source *src = ckptio__calloc(count + 1, sizeof *src);
    int64_t *shapes = ckptio__calloc(count * 64 + 1, sizeof *shapes);
    ckptio_file *file = NULL;
    void *buf = NULL;
    ckptio_status st = CKPTIO_OK;
    if (!src || !shapes) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", count);
        goto out;
    }
    uint64_t largest = 0;
    for (size_t i = 0; i < count; i++) {
        const ckptio__dcp_tensor *t = &h->tensors[tensors ? tensors[i] : i];
        int64_t *shape = shapes + i * 64;
        memcpy(shape, t->shape, t->ndim * sizeof *shape);
        /* torch counts float4_e2m1fn_x2 in packed pairs, safetensors F4 in values. */
        if (t->dtype == CKPTIO_DTYPE_F4 && t->ndim > 0) shape[t->ndim - 1] *= 2;
        src[i] = (ckptio_tensor_source){.name = t->fqn, .dtype = t->dtype, .ndim = t->ndim, .shape = shape,
                                        .data = &placeholder, .nbytes = t->nbytes, .mem_kind = CKPTIO_MEM_HOST};
        if (t->nbytes > largest) largest = t->nbytes;
    }
    if ((st = ckptio__st_layout_build(src, count, metadata, metadata_count, flags, path, &layout)) != CKPTIO_OK)
        goto out;
    if (largest > SIZE_MAX / 2 || !(buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, largest ? largest : 1))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the largest tensor (%llu bytes)", (unsigned long long)largest);
        goto out;
    }
    if ((st = ckptio_file_open(h->engine, path, CKPTIO_OPEN_WRITE, &file)) != CKPTIO_OK) goto out;
    if ((st = ckptio_file_truncate(file, layout.header_size + layout.data_size)) != CKPTIO_OK) goto out;
    if ((st = ckptio__file_io(file, CKPTIO_WRITE, layout.header, layout.header_size, 0)) != CKPTIO_OK) goto out;
    for (size_t i = 0; i < count; i++) {
        const size_t ti = tensors ? tensors[i] : i;
        if ((st = ckptio_dcp_read_tensor(h, ti, buf, largest)) != CKPTIO_OK) goto out;
        st = ckptio__dcp_io(file, CKPTIO_WRITE, buf, h->tensors[ti].nbytes, layout.header_size + layout.offsets[i]);
        if (st != CKPTIO_OK) goto out;
    }
    st = ckptio_file_commit(file);
out:
    if (file) {
        /* Without a commit, close removes the temporary: nothing appears under `path`. */
        ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
        const ckptio_status cs = ckptio_file_close(file);
        if (saved) ckptio__error_restore(saved);
        else if (st == CKPTIO_OK) st = cs;
    }
    ckptio__free(buf);
    ckptio__free(shapes);
    ckptio__free(src);
    ckptio__st_layout_cleanup(&layout);
    return st;
}
