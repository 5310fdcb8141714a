/*
 * pickle_dcp_write.c - the .metadata pickle of a torch.distributed.checkpoint
 * directory whose tensors are each stored whole (one chunk), as torch's
 * FileSystemWriter pickles its Metadata (docs/FORMATS.md section 4.2), in
 * protocol 2 without a memo.
 *
 * Only the classes the restricted unpickler allows are named, so ckptio's
 * readers take the file as they take torch's. TensorProperties gets the
 * 5-field state (dtype, layout, requires_grad, memory format, pin_memory)
 * that every torch since 2.0 reads; storage_meta is left out (None), which
 * torch's reader replaces with a fresh StorageMeta.
 */
#include "pickle_internal.h"

#include <string.h>

#define DCP_MD "torch.distributed.checkpoint.metadata"

/* cls.__new__(cls) as pickle's protocol 2 writes a dataclass: GLOBAL, (), NEWOBJ. */
static void new_object(ckptio__pickle_buf *b, const char *module, const char *name) {
    ckptio__pickle_global(b, module, name);
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_TUPLE);
    ckptio__pickle_op(b, CKPTIO__OP_NEWOBJ);
}

static void key(ckptio__pickle_buf *b, const char *s) { ckptio__pickle_str(b, s, strlen(s)); }

/* torch.Size(values): REDUCE(torch.Size, (tuple,)). */
static void torch_size(ckptio__pickle_buf *b, const int64_t *values, uint32_t n) {
    ckptio__pickle_global(b, "torch", "Size");
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    for (uint32_t d = 0; d < n; d++) ckptio__pickle_int(b, values ? values[d] : 0);
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE);
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE1);
    ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
}

/* TensorProperties with __setstate__'s 5-tuple: C-contiguous, strided, no grad, not pinned. */
static void tensor_properties(ckptio__pickle_buf *b, const char *dtype) {
    new_object(b, DCP_MD, "TensorProperties");
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    ckptio__pickle_global(b, "torch", dtype);
    ckptio__pickle_global(b, "torch.serialization", "_get_layout");
    key(b, "torch.strided");
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE1);
    ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
    ckptio__pickle_bool(b, false);
    ckptio__pickle_global(b, DCP_MD, "_MEM_FORMAT_ENCODING");
    ckptio__pickle_int(b, 0); /* TORCH_CONTIGUOUS_FORMAT */
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE1);
    ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
    ckptio__pickle_bool(b, false);
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE);
    ckptio__pickle_op(b, CKPTIO__OP_BUILD);
}

static void tensor_metadata(ckptio__pickle_buf *b, const ckptio__dcp_md_item *it, const char *dtype) {
    new_object(b, DCP_MD, "TensorStorageMetadata");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    key(b, "properties");
    tensor_properties(b, dtype);
    key(b, "size");
    torch_size(b, it->shape, it->ndim);
    key(b, "chunks");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_LIST);
    new_object(b, DCP_MD, "ChunkStorageMetadata");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    key(b, "offsets");
    torch_size(b, NULL, it->ndim);
    key(b, "sizes");
    torch_size(b, it->shape, it->ndim);
    ckptio__pickle_op(b, CKPTIO__OP_SETITEMS);
    ckptio__pickle_op(b, CKPTIO__OP_BUILD);
    ckptio__pickle_op(b, CKPTIO__OP_APPEND);
    ckptio__pickle_op(b, CKPTIO__OP_SETITEMS);
    ckptio__pickle_op(b, CKPTIO__OP_BUILD);
}

/* MetadataIndex(fqn, offset, index=0): offset is torch.Size of zeros for a tensor, None for a byte item. */
static void metadata_index(ckptio__pickle_buf *b, const ckptio__dcp_md_item *it) {
    new_object(b, DCP_MD, "MetadataIndex");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    key(b, "fqn");
    key(b, it->fqn);
    key(b, "offset");
    if (it->is_bytes) ckptio__pickle_op(b, CKPTIO__OP_NONE);
    else torch_size(b, NULL, it->ndim);
    key(b, "index");
    if (it->is_bytes) ckptio__pickle_op(b, CKPTIO__OP_NONE);
    else ckptio__pickle_int(b, 0);
    ckptio__pickle_op(b, CKPTIO__OP_SETITEMS);
    ckptio__pickle_op(b, CKPTIO__OP_BUILD);
}

static void storage_info(ckptio__pickle_buf *b, const ckptio__dcp_md_item *it) {
    new_object(b, "torch.distributed.checkpoint.filesystem", "_StorageInfo");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    key(b, "relative_path");
    key(b, it->file);
    key(b, "offset");
    ckptio__pickle_int(b, (int64_t)it->offset);
    key(b, "length");
    ckptio__pickle_int(b, (int64_t)it->length);
    ckptio__pickle_op(b, CKPTIO__OP_SETITEMS);
    ckptio__pickle_op(b, CKPTIO__OP_BUILD);
}

ckptio_status ckptio__dcp_metadata_pickle(const ckptio__dcp_md_item *items, size_t count, ckptio__pickle_buf *b) {
    for (size_t i = 0; i < count; i++) {
        const ckptio__dcp_md_item *it = &items[i];
        if (!it->fqn || !it->file || !ckptio__pickle_utf8_valid((const uint8_t *)it->fqn, strlen(it->fqn)))
            return CKPTIO_FAIL(CKPTIO_E_INVAL, "DCP metadata: item %zu needs a UTF-8 name and a file", i);
        if (it->offset > INT64_MAX || it->length > INT64_MAX)
            return CKPTIO_FAIL(CKPTIO_E_RANGE, "DCP metadata: item '%s' lies past 2^63 bytes", it->fqn);
        if (!it->is_bytes && (it->ndim > 64 || (it->ndim && !it->shape) || !ckptio_dtype_torch_name(it->dtype)))
            return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "DCP metadata: tensor '%s' has no torch dtype or too many "
                               "dimensions", it->fqn);
    }
    ckptio__pickle_proto(b);
    new_object(b, DCP_MD, "Metadata");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    ckptio__pickle_op(b, CKPTIO__OP_MARK);

    key(b, "state_dict_metadata");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    for (size_t i = 0; i < count; i++) {
        key(b, items[i].fqn);
        if (items[i].is_bytes) new_object(b, DCP_MD, "BytesStorageMetadata");
        else tensor_metadata(b, &items[i], ckptio_dtype_torch_name(items[i].dtype));
        ckptio__pickle_op(b, CKPTIO__OP_SETITEM);
    }

    /* The flat state dict's mapping: each key is its own path, as the planner
     * records a dict without nesting. */
    key(b, "planner_data");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    for (size_t i = 0; i < count; i++) {
        key(b, items[i].fqn);
        key(b, items[i].fqn);
        ckptio__pickle_op(b, CKPTIO__OP_TUPLE1);
        ckptio__pickle_op(b, CKPTIO__OP_SETITEM);
    }

    key(b, "storage_data");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
    for (size_t i = 0; i < count; i++) {
        metadata_index(b, &items[i]);
        storage_info(b, &items[i]);
        ckptio__pickle_op(b, CKPTIO__OP_SETITEM);
    }

    key(b, "version");
    key(b, "1.0.0");
    ckptio__pickle_op(b, CKPTIO__OP_SETITEMS);
    ckptio__pickle_op(b, CKPTIO__OP_BUILD);
    ckptio__pickle_op(b, CKPTIO__OP_STOP);
    return b->failed ? ckptio_last_error()->status : CKPTIO_OK;
}
