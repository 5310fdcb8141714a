/*
 * model_internal.h - the model handle (ckptio_model): a set of safetensors
 * shards opened through one engine, with one tensor table across them.
 * model_dir.c opens and validates it; model_read.c reads from it.
 */
#ifndef CKPTIO_MODEL_INTERNAL_H
#define CKPTIO_MODEL_INTERNAL_H

#include "safetensors_internal.h"

typedef struct ckptio__model_tensor {
    size_t shard;             /* index into shards */
    size_t local;             /* tensor index inside that shard */
} ckptio__model_tensor;

struct ckptio_model {
    ckptio_engine *engine;
    char *path;               /* as given to open */
    char *index_path;         /* the index read, or NULL */
    int64_t total_size;       /* the index's metadata.total_size, or -1 */
    size_t nshards;
    char **shard_paths;       /* nshards, sorted by file name */
    ckptio_safetensors **shards;
    size_t count;
    ckptio__model_tensor *tensors; /* shard order, then offset order */
    size_t *by_name;          /* tensor indices sorted by name (strcmp) */
    size_t nmeta;
    ckptio_kv *meta;          /* merged __metadata__ (strings owned by the shards) */
    /* Shards whose descriptors are open at once, at most; 0: all of them
     * (ckptio__file_window). Past the first window each shard's descriptors
     * go once its header is read (ckptio__file_release); reads reopen them a
     * window at a time and release them after, and ckptio_model_shard()
     * releases the others' when it hands out a shard's handle. */
    size_t fd_window;
};

/* With a window: releases the descriptors of every shard but `keep`
 * (SIZE_MAX: all of them). No transfer of the model may be in flight. */
void ckptio__model_release_shards(const ckptio_model *m, size_t keep);

/* The tensor description of model tensor `i` (owned by its shard). */
static inline const ckptio_tensor_info *ckptio__model_info(const ckptio_model *m, size_t i) {
    return &m->shards[m->tensors[i].shard]->tensors[m->tensors[i].local];
}

#endif /* CKPTIO_MODEL_INTERNAL_H */
