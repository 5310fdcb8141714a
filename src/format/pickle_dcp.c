/*
 * pickle_dcp.c - the second allowlist of the restricted unpickler: the
 * classes a torch.distributed.checkpoint .metadata pickle names
 * (docs/FORMATS.md section 4.2), and the public handle that parses
 * such a file into a value tree. Old module paths of a class map to its
 * current name, so readers of the tree see one name per class.
 *
 * torch reads .metadata with an unrestricted pickle.load, so a hostile
 * checkpoint directory runs code on load; this reader names classes only
 * from the table below and never calls anything.
 */
#include "pickle_internal.h"

#include <string.h>

typedef struct dcp_class_row {
    const char *module, *name, *canonical;
} dcp_class_row;

#define DCP_MD "torch.distributed.checkpoint.metadata"
/* torch 2.0-2.2 defined these two in the sharded-tensor module and DCP
 * pickled them from there; later torch moved them into DCP_MD (the enum
 * renamed _MEM_FORMAT_ENCODING) and still unpickles the old names into the
 * old classes, which hold the same data (state tuple of 5 fields, enum
 * members 0-2). torch 1.13's torch.distributed._shard.checkpoint classes are
 * absent on purpose: current torch cannot load those files either. */
#define SHARDED_TENSOR_MD "torch.distributed._shard.sharded_tensor.metadata"

/* Canonical names one class is known by under several module paths: the
 * rows below share these, so the tree names each class by one pointer. */
static const char tensor_properties[] = DCP_MD ".TensorProperties";
static const char mem_format_encoding[] = DCP_MD "._MEM_FORMAT_ENCODING";
static const char posix_path[] = "pathlib.PosixPath";

static const dcp_class_row dcp_classes[] = {
    {DCP_MD, "Metadata", DCP_MD ".Metadata"},
    {DCP_MD, "TensorStorageMetadata", DCP_MD ".TensorStorageMetadata"},
    {DCP_MD, "BytesStorageMetadata", DCP_MD ".BytesStorageMetadata"},
    {DCP_MD, "ChunkStorageMetadata", DCP_MD ".ChunkStorageMetadata"},
    {DCP_MD, "TensorProperties", tensor_properties},
    {SHARDED_TENSOR_MD, "TensorProperties", tensor_properties},
    {DCP_MD, "MetadataIndex", DCP_MD ".MetadataIndex"},
    {DCP_MD, "StorageMeta", DCP_MD ".StorageMeta"},
    /* TensorProperties.__getstate__ pickles the memory format as this enum (REDUCE(cls, (value,))). */
    {DCP_MD, "_MEM_FORMAT_ENCODING", mem_format_encoding},
    {SHARDED_TENSOR_MD, "MEM_FORMAT_ENCODING", mem_format_encoding},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo", "torch.distributed.checkpoint.filesystem._StorageInfo"},
    {"torch", "Size", "torch.Size"},
    /* torch.layout pickles as REDUCE(_get_layout, ('torch.strided',)). */
    {"torch.serialization", "_get_layout", "torch.serialization._get_layout"},
    /* StorageMeta.checkpoint_id; Python 3.13 moved the class to pathlib._local. */
    {"pathlib", "PosixPath", posix_path},
    {"pathlib._local", "PosixPath", posix_path},
};

const char *ckptio__dcp_class(const char *module, const char *name) {
    for (size_t i = 0; i < sizeof dcp_classes / sizeof dcp_classes[0]; i++)
        if (strcmp(module, dcp_classes[i].module) == 0 && strcmp(name, dcp_classes[i].name) == 0)
            return dcp_classes[i].canonical;
    return NULL;
}

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

ckptio_status ckptio_value_object(const ckptio_value *value, const char **class_name, const ckptio_value **args,
                                  const ckptio_value **state) {
    if (!value) return CKPTIO_FAIL(CKPTIO_E_INVAL, "value must not be NULL");
    if (value->kind != CKPTIO_VALUE_OBJECT)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "value is not an object (kind %d)", value->kind);
    if (class_name) *class_name = value->u.obj.cls;
    if (args) *args = value->u.obj.args;
    if (state) *state = value->u.obj.state;
    return CKPTIO_OK;
}

/* ---- the handle ------------------------------------------------------------------ */

struct ckptio_pickle {
    ckptio__value_pool pool;
    ckptio_value *root;         /* strings are copied into the pool: the input may go */
};

ckptio_status ckptio_pickle_parse_dcp_metadata(const void *bytes, size_t len, const char *origin,
                                               ckptio_pickle **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = NULL;
    if (!bytes && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "bytes must not be NULL");
    ckptio_pickle *p = ckptio__calloc(1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a pickle handle");
    ckptio_status st = ckptio__unpickle_mode(bytes ? bytes : (const uint8_t *)"", len, origin ? origin : "<memory>",
                                             ".metadata", 0, CKPTIO__UNPICKLE_DCP_METADATA, &p->pool, &p->root);
    if (st != CKPTIO_OK) {
        ckptio_pickle_close(p);
        return st;
    }
    *out = p;
    return CKPTIO_OK;
}

ckptio_status ckptio_pickle_root(const ckptio_pickle *p, const ckptio_value **out) {
    if (!p || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    *out = p->root;
    return CKPTIO_OK;
}

ckptio_status ckptio_pickle_close(ckptio_pickle *p) {
    if (!p) return CKPTIO_OK;
    ckptio__value_pool_free(&p->pool);
    ckptio__free(p);
    return CKPTIO_OK;
}
