/*
 * ckptio/model.h - models: the safetensors files of a checkpoint (one file, a Hugging
 * Face directory or index) as one handle, and slices (docs/MODELS.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_MODEL_H
#define CKPTIO_MODEL_H

#include "file.h"
#include "safetensors.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/model.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Models: safetensors directories (Hugging Face layout) and slices          */
/* ------------------------------------------------------------------------ */
/* (docs/MODELS.md)
 * A model is one handle over the safetensors files of a checkpoint: a
 * single file, a Hugging Face directory (model-0000k-of-0000N.safetensors
 * beside model.safetensors.index.json), or the index itself. Tensors are
 * addressed by one index across all shards, and one ckptio_model_read()
 * moves any mix of whole tensors and slices (boxes [start, stop) of every
 * dimension) from all shards in ONE engine plan, so the disk and the PCIe
 * link stay busy across file boundaries. Only the bytes a slice covers are
 * read; each contiguous run goes straight to its destination (host or GPU
 * memory, any file alignment). */

typedef struct ckptio_model ckptio_model;

enum ckptio_model_open_flags {
    /* Shards of a directory may be symlinks to files outside it (as in the
     * Hugging Face hub cache, snapshots/REV/NAME -> ../../blobs/HASH). By
     * default a shard whose real path leaves the directory is refused with
     * CKPTIO_E_DISALLOWED: a checkpoint must not reach other files. Only
     * for directories you trust. */
    CKPTIO_MODEL_ALLOW_SYMLINKS = 1u << 0
};

/*! ckptio_model_open() :
 * Opens `path` and validates every file it names:
 *  - a directory: model.safetensors if present; else
 *    model.safetensors.index.json; else the only *.safetensors.index.json
 *    (several: CKPTIO_E_FORMAT listing them); else every *.safetensors file
 *    in it (a tensor name in two of them: CKPTIO_E_FORMAT naming both);
 *    none: CKPTIO_E_NOT_FOUND;
 *  - a file whose name ends in ".index.json": that index, shards beside it;
 *  - any other file: one safetensors file (as ckptio_safetensors_open).
 * An index is parsed like every other untrusted input (docs/MODELS.md):
 * shard names are plain names inside its directory (CKPTIO_E_DISALLOWED
 * otherwise, and for shards that are symlinks leaving the directory unless
 * CKPTIO_MODEL_ALLOW_SYMLINKS), every shard exists (CKPTIO_E_NOT_FOUND
 * naming the index, a tensor mapped to it and the shard) and is a valid
 * safetensors file, every tensor of the index is in its shard and every
 * tensor of a shard is mapped to that shard (CKPTIO_E_FORMAT naming the
 * index, the tensor and the shards). The engine must outlive the handle.
 * The handle keeps a bounded window of shards open (RLIMIT_NOFILE / 16, at
 * least 4): a model of more shards releases each shard's descriptors once
 * its header is read and reopens a shard when it is read or mapped
 * (docs/MODELS.md#many-shards). */
CKPTIO_API ckptio_status ckptio_model_open(ckptio_engine *engine, const char *path, unsigned flags,
                                           ckptio_model **out);

/*! ckptio_model_close() : closes every shard. Accepts NULL. */
CKPTIO_API ckptio_status ckptio_model_close(ckptio_model *model);

/*! ckptio_model_count() : number of tensors over all shards. */
CKPTIO_API ckptio_status ckptio_model_count(const ckptio_model *model, size_t *out);

/*! ckptio_model_tensor() :
 * Tensor `index` (0..count-1, ordered by shard, then by offset in its
 * shard); *shard (may be NULL) receives its shard's index. file_offset is
 * in that shard's file. Pointers live as long as the handle. */
CKPTIO_API ckptio_status ckptio_model_tensor(const ckptio_model *model, size_t index, ckptio_tensor_info *out,
                                             size_t *shard);

/*! ckptio_model_find() : index of the tensor `name`, or CKPTIO_E_NOT_FOUND. */
CKPTIO_API ckptio_status ckptio_model_find(const ckptio_model *model, const char *name, size_t *index);

/*! ckptio_model_shard_count() / ckptio_model_shard() :
 * The shards, sorted by file name (one for a single file). *path (may be
 * NULL) receives the shard's path; *st (may be NULL) its safetensors
 * handle, for the per-file functions (ckptio_safetensors_verify, ...): it
 * belongs to the model and must not be closed. */
CKPTIO_API ckptio_status ckptio_model_shard_count(const ckptio_model *model, size_t *out);
CKPTIO_API ckptio_status ckptio_model_shard(const ckptio_model *model, size_t index, const char **path,
                                            ckptio_safetensors **st);

/*! ckptio_model_index() : *path = the index file that was read, or
 * CKPTIO_E_NOT_FOUND when the model has none (a single file, or a directory
 * of files without index). *total_size (may be NULL) receives the index's
 * metadata.total_size, or -1 when it has none. */
CKPTIO_API ckptio_status ckptio_model_index(const ckptio_model *model, const char **path, int64_t *total_size);

/*! ckptio_model_metadata_count() / ckptio_model_metadata() :
 * The shards' __metadata__ pairs merged in shard order (a key several
 * shards hold keeps the first shard's value): for a single file, its own. */
CKPTIO_API ckptio_status ckptio_model_metadata_count(const ckptio_model *model, size_t *out);
CKPTIO_API ckptio_status ckptio_model_metadata(const ckptio_model *model, size_t index, ckptio_kv *out);

/*! ckptio_model_has_metadata() : *out = 1 when some shard has a __metadata__
 * object, even an empty one (safe_open's metadata() then gives {} rather
 * than None), else 0. */
CKPTIO_API ckptio_status ckptio_model_has_metadata(const ckptio_model *model, int *out);

/* A box of a C-contiguous tensor: indices [start[d], stop[d]) of every
 * dimension d, in the tensor's own terms (F4 counts 4-bit values). */
typedef struct ckptio_slice {
    ckptio_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;     /* ndim entries: the whole tensor */
    const int64_t *start;     /* ndim entries, or NULL together with stop: the whole tensor */
    const int64_t *stop;      /* ndim entries, exclusive */
} ckptio_slice;

/*! ckptio_slice_bytes() :
 * Validates a slice (0 <= start <= stop <= shape in every dimension;
 * sub-byte dtypes cut on byte boundaries; else CKPTIO_E_RANGE or
 * CKPTIO_E_INVAL naming the dimension) and gives the bytes it covers
 * (*nbytes) and the number of contiguous runs they form in the file
 * (*runs); either may be NULL. The box is stored in C order: run k goes to
 * destination offset k x (nbytes / runs). */
CKPTIO_API ckptio_status ckptio_slice_bytes(const ckptio_slice *slice, uint64_t *nbytes, uint64_t *runs);

/*! ckptio_plan_add_slice() :
 * Appends to a read plan the extents that bring the box `slice` of the
 * tensor whose first byte is at `file_offset` in `file` to `memory` (the
 * box in C order, host or GPU memory per mem_kind): one extent per
 * contiguous run. This is the run computation ckptio_model_read() uses,
 * for callers with their own plans (e.g. the chunks of a DCP checkpoint).
 * *added (may be NULL) receives the extents appended. On failure extents
 * appended so far stay in the plan. */
CKPTIO_API ckptio_status ckptio_plan_add_slice(ckptio_plan *plan, ckptio_file *file, uint64_t file_offset,
                                               const ckptio_slice *slice, void *memory, ckptio_mem_kind mem_kind,
                                               size_t *added);

/* Where one tensor, or one slice of it, should be read to. */
typedef struct ckptio_slice_target {
    size_t index;             /* tensor index in the model */
    const int64_t *start;     /* the tensor's ndim entries, or NULL together with stop: */
    const int64_t *stop;      /* the whole tensor */
    void *data;               /* destination: the box in C order */
    uint64_t capacity;        /* bytes available at data (checked) */
    ckptio_mem_kind mem_kind;
} ckptio_slice_target;

/*! ckptio_model_read() :
 * Reads every target (whole tensors and slices, from any shards) in one
 * engine plan; all targets are checked before any byte moves (index,
 * slice, capacity: CKPTIO_E_RANGE / CKPTIO_E_INVAL naming the target and
 * tensor). A slice reads only the bytes it covers, one extent per
 * contiguous run, straight into the destination. Exception, for host
 * destinations: a slice of more than 4096 runs shorter than 4 KiB each
 * (e.g. one column of a matrix) is read as its covering byte range in
 * pieces of at most 64 MiB through a host buffer and gathered, after the
 * plan. Destinations must not overlap (CKPTIO_E_INVAL). On failure they
 * may be partly written. */
CKPTIO_API ckptio_status ckptio_model_read(ckptio_model *model, const ckptio_slice_target *targets, size_t count);

/*! ckptio_model_map() :
 * Maps shard `shard` of `model` (the whole file; a tensor is at
 * data + its file_offset). The file must still have the size it had at
 * open (else CKPTIO_E_STALE); s3:// objects cannot be mapped
 * (CKPTIO_E_UNSUPPORTED). The mapping outlives the model and holds no
 * descriptor (a shard the model released is opened again to be mapped, and
 * must still be the file checked at open, else CKPTIO_E_DISALLOWED): release
 * it with ckptio_mapping_release(). It must not overlap another call on
 * the same model (it may reopen and release a shard's descriptor, as reads
 * of a model of many shards do). */
CKPTIO_API ckptio_status ckptio_model_map(ckptio_model *model, size_t shard, ckptio_mapping **out);

/* ------------------------------------------------------------------------ */
/* Saving a Hugging Face directory                                          */
/* ------------------------------------------------------------------------ */

enum ckptio_model_save_flags {
    /* `dir` may already hold a model of this layout (model.safetensors,
     * model.safetensors.index.json, model-NNNNN-of-NNNNN.safetensors): it
     * is replaced (see ckptio_model_save for the order). Without this flag
     * such a file there is CKPTIO_E_EXISTS and nothing is written. */
    CKPTIO_MODEL_SAVE_OVERWRITE = 1u << 0
};

typedef struct ckptio_model_save_options {
    uint64_t max_shard_size;   /* bytes of tensor data per shard; 0 = 5 GB (5 x 10^9), huggingface_hub's default */
    const ckptio_kv *metadata; /* extra metadata pairs (may be NULL): in the index when sharded, else in the file */
    size_t metadata_count;
    unsigned flags;            /* enum ckptio_model_save_flags */
} ckptio_model_save_options;

/*! ckptio_model_save() :
 * Saves tensors (host or GPU memory, per mem_kind) as a Hugging Face
 * directory at `dir`, a local directory (created with its parents when
 * missing) or an s3://BUCKET/PREFIX: split into shards as huggingface_hub's
 * split_torch_state_dict_into_shards does (tensors in the caller's order; a
 * new shard when the next tensor would pass max_shard_size; a larger tensor
 * alone in a shard of its own), named model-0000k-of-0000n.safetensors, or
 * model.safetensors when there is one shard (then no index). Each shard is
 * a safetensors file as ckptio_safetensors_save writes it (4 KiB-aligned
 * data) with __metadata__ {"format": "pt"} (plus the caller's pairs when
 * there is one shard); model.safetensors.index.json holds
 * {"metadata": {"total_size": sum of nbytes, caller's pairs...},
 * "weight_map": {name: shard}} with keys sorted, as transformers writes it.
 * Names are checked as by ckptio_safetensors_save before anything is
 * written (CKPTIO_E_INVAL naming the tensor).
 * Every shard is written in ONE engine plan: on s3:// several multipart
 * uploads are in flight together, their part buffers sharing the bound of
 * one object's upload (plus one part per shard); locally the engine's usual
 * pipeline into a temporary per shard. Then the shards are committed (each
 * atomic: a rename; a completed upload, those of several shards at once),
 * and only after every one the index: a reader never finds an index naming
 * a missing or partial shard. A local `dir` it creates stays (empty) after
 * a failure.
 * On failure or cancel (the engine's progress callback) before the index's
 * write, no index appears and no shard of this save stays (temporaries
 * removed, uploads aborted, committed shards deleted; a name that held an
 * older file keeps it unless this save's commit replaced it); other files
 * in `dir` are never touched. Once the index may be in place (its write
 * reached the rename, or the name holds an object), nothing is rolled back.
 * With CKPTIO_MODEL_SAVE_OVERWRITE over an older model: the new shards are
 * all written first (nothing visible changes); then, only where a new shard
 * takes the name of an old file, the old index is removed; the shards are
 * committed, the new index written, and the old model's other files
 * removed, its index first, each tried (the first failure returned). A
 * crash or failure in that last step (a few renames or small requests) can
 * leave a directory without an index; before it, the older model is
 * intact. *nshards (may be NULL) receives the shard count.
 * Thread-safe for distinct directories. */
CKPTIO_API ckptio_status ckptio_model_save(ckptio_engine *engine, const char *dir, const ckptio_tensor_source *tensors,
                                           size_t count, const ckptio_model_save_options *options, size_t *nshards);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_MODEL_H */
