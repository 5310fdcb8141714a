/*
 * pickle_dcp_classes.c - the second allowlist of the restricted unpickler:
 * the classes a torch.distributed.checkpoint .metadata pickle names
 * (docs/FORMATS.md section 4.2). Old module paths of a class map to its
 * current name, so readers of the tree see one name per class.
 *
 * torch reads .metadata with an unrestricted pickle.load, so a hostile
 * checkpoint directory runs code on load; the unpickler (pickle_read.c)
 * names classes only from the table below and never calls anything.
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

bool ckptio__dcp_class_takes_state(const char *canonical) {
    static const char *const stateless[] = {"torch.Size", "torch.serialization._get_layout", posix_path,
                                            mem_format_encoding};
    for (size_t i = 0; i < sizeof stateless / sizeof stateless[0]; i++)
        if (strcmp(canonical, stateless[i]) == 0) return false;
    return true;
}

const char *ckptio__dcp_class(const char *module, const char *name) {
    for (size_t i = 0; i < sizeof dcp_classes / sizeof dcp_classes[0]; i++)
        if (strcmp(module, dcp_classes[i].module) == 0 && strcmp(name, dcp_classes[i].name) == 0)
            return dcp_classes[i].canonical;
    return NULL;
}
