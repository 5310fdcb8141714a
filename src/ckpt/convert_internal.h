/*
 * convert_internal.h - writing a checkpoint whose tensor bytes are read from
 * another checkpoint one tensor at a time (bounded memory, every byte
 * through the engine): the shared core of ckptio_convert(),
 * ckptio_dcp_save_safetensors, ckptio_torch_save_safetensors and
 * ckptio_safetensors_save_torch.
 *
 * Files, each using only those listed after it: convert.c (ckptio_convert:
 * OUT's kind, the checks, the directory temporary) -> convert_source.c (any
 * input as a list of tensors) and the writers model_write.c (Hugging Face
 * directory), dcp_create.c (DCP directory), torch_file_save.c (torch.save)
 * -> checkpoint_convert.c (safetensors).
 */
#ifndef CKPTIO_CONVERT_INTERNAL_H
#define CKPTIO_CONVERT_INTERNAL_H

#include "common_internal.h"

/* Fills buf with the `nbytes` bytes of item `index` (a source tensor, or a
 * writer storage id); errors name the input file. */
typedef ckptio_status (*ckptio__fill_fn)(void *ctx, size_t index, void *buf, uint64_t nbytes);

/* Writes the `nbytes` bytes of item `index` to `file` at `file_offset` itself,
 * in bounded memory. The file is new and has its final size: bytes never
 * written read as zeros. */
typedef ckptio_status (*ckptio__write_fn)(void *ctx, size_t index, ckptio_file *file, uint64_t file_offset,
                                          uint64_t nbytes);

/* Receives n bytes of a tensor being written that belong at its byte `dst`. */
typedef ckptio_status (*ckptio__emit_fn)(void *ctx, uint64_t dst, const void *data, size_t n);

/* Hands every byte of one tensor to emit(emit_ctx, ...), in any pieces. */
typedef ckptio_status (*ckptio__produce_fn)(void *ctx, ckptio__emit_fn emit, void *emit_ctx);

/* Writes what produce() emits to `file` at base + dst through one staging
 * buffer of 8 MiB: runs adjacent in the file and in the buffer become one
 * write, and a staged run of zeros is not written at all, so `file` must
 * read as zeros wherever nothing is written (a ckptio__write_fn's file).
 * Host memory is the buffer, whatever the tensor's size
 * (checkpoint_convert.c). */
ckptio_status ckptio__write_staged(ckptio_file *file, uint64_t base, ckptio__produce_fn produce, void *ctx);

/* Writes the safetensors file ckptio_safetensors_save would write for
 * `tensors` (their `data` is ignored), atomically at `path`, filling each
 * tensor's bytes with fill(ctx, i, ...) into one buffer of the largest such
 * tensor's size; a tensor with self_written[i] (self_written may be NULL) is
 * written by write(ctx, i, ...) instead and takes no part in the buffer's
 * size. On any failure nothing appears under `path` (checkpoint_convert.c). */
ckptio_status ckptio__st_save_streamed(ckptio_engine *engine, const char *path, const ckptio_tensor_source *tensors,
                                       size_t count, const ckptio_kv *metadata, size_t metadata_count, unsigned flags,
                                       ckptio__fill_fn fill, const bool *self_written, ckptio__write_fn write,
                                       void *ctx);

/* ckptio_torch_save with every storage filled by fill(ctx, storage id, ...)
 * instead of bound memory, one storage at a time into a buffer of the
 * largest one; CRCs are computed from that buffer (torch_file_save.c). */
ckptio_status ckptio__torch_save_streamed(ckptio_engine *engine, const char *path, ckptio_torch_writer *w,
                                          const ckptio_torch_save_options *options, ckptio__fill_fn fill, void *ctx);

/* The writer ckptio_torch_save_tensors saves: a flat OrderedDict name ->
 * tensor, one storage per tensor (storage id i is tensor i), F4 counted in
 * packed pairs. `path` labels errors. */
ckptio_status ckptio__torch_flat_writer(const char *path, const ckptio_tensor_source *tensors, size_t count,
                                        ckptio_torch_writer **out);

/* Gives the `index`-th byte item of a source: its name and its bytes
 * (*data ckptio__malloc'ed, freed by the caller). */
typedef ckptio_status (*ckptio__bytes_fn)(void *ctx, size_t index, const char **fqn, void **data, uint64_t *len);

/* ---- inputs (convert_source.c) ----------------------------------------------------------- */

/* An input checkpoint seen as a list of tensors in safetensors terms (F4
 * counted in 4-bit values; `data` unused), filled one at a time by
 * ckptio__convert_source_fill, plus what a conversion may lose. */
typedef struct ckptio__convert_source {
    ckptio_format format;            /* SAFETENSORS, HF_INDEX (any model directory), TORCH or DCP */
    ckptio_model *model;             /* a safetensors file or a Hugging Face directory */
    ckptio_torch *torch;
    ckptio_dcp *dcp;
    size_t count;
    ckptio_tensor_source *tensors;   /* names owned by the handle */
    int64_t *shapes;                 /* count x 64 */
    size_t *index;                   /* tensor i is tensor index[i] of the handle */
    uint64_t total, largest;         /* bytes of all tensors / of the largest */
    size_t values;                   /* torch.save: non-tensor leaves of the object tree */
    size_t shared;                   /* torch.save: tensors whose storage another tensor also views */
    size_t byte_items;               /* DCP: byte items */
    size_t metadata_count;           /* safetensors / HF: __metadata__ entries */
    ckptio_kv *metadata;             /* safetensors / HF: the entries (strings owned by the handle) */
} ckptio__convert_source;

/* Opens `path` (format detected from its bytes; a directory without
 * .metadata is a Hugging Face directory). On failure *out is zeroed. */
ckptio_status ckptio__convert_source_open(ckptio_engine *engine, const char *path, ckptio__convert_source *out);
/* A ckptio__fill_fn over the source (ctx: the ckptio__convert_source). */
ckptio_status ckptio__convert_source_fill(void *ctx, size_t i, void *buf, uint64_t nbytes);
/* A ckptio__bytes_fn over a DCP source's byte items, each checked by the
 * restricted unpickler first (a converted checkpoint carries no pickle
 * ckptio's readers would refuse). */
ckptio_status ckptio__convert_source_bytes(void *ctx, size_t j, const char **fqn, void **data, uint64_t *len);
void ckptio__convert_source_close(ckptio__convert_source *s);

/* ---- outputs ------------------------------------------------------------------------------ */

/* Writes the safetensors file `path` (atomically) holding tensors
 * members[0..count), indices into the list ckptio__hf_save was given. */
typedef ckptio_status (*ckptio__shard_fn)(void *ctx, const char *path, const size_t *members, size_t count);

/* The layout of a Hugging Face directory (model_write.c). */
#define CKPTIO__HF_INDEX_NAME "model.safetensors.index.json"
#define CKPTIO__HF_SINGLE_NAME "model.safetensors"
typedef struct ckptio__hf_layout {
    size_t nshards;           /* at least 1 */
    size_t *shard_of;         /* shard_of[i]: the shard of tensor i */
    char (*names)[64];        /* the shards' file names: model.safetensors, or model-0000k-of-0000n.safetensors */
    uint64_t total;           /* sum of the tensors' nbytes: the index's metadata.total_size */
} ckptio__hf_layout;

/* Splits tensors into shards as huggingface_hub's
 * split_torch_state_dict_into_shards does (in order; a new shard when the
 * next tensor would pass shard_size; a larger tensor alone) and names them.
 * *out is released with ckptio__hf_layout_free (also on failure). */
ckptio_status ckptio__hf_layout_make(const ckptio_tensor_source *tensors, size_t count, uint64_t shard_size,
                                     ckptio__hf_layout *out);
void ckptio__hf_layout_free(ckptio__hf_layout *l);

/* Writes model.safetensors.index.json into `dir` (a directory or an s3://
 * prefix) atomically, the metadata pairs beside total_size (fsynced with
 * CKPTIO_DCP_SYNC in sync_flags); nothing for a layout of one shard. */
ckptio_status ckptio__hf_index_write(const char *dir, const ckptio__hf_layout *l, const ckptio_tensor_source *tensors,
                                     size_t count, const ckptio_kv *metadata, size_t metadata_count,
                                     unsigned sync_flags);

/* A Hugging Face directory in the existing directory `dir`: tensors split
 * into shards as huggingface_hub's split_torch_state_dict_into_shards does
 * (in order; a new shard when the next tensor would pass shard_size; a
 * larger tensor alone), each written by save_shard, then
 * model.safetensors.index.json (fsynced with CKPTIO_DCP_SYNC in
 * sync_flags); one shard is model.safetensors without an index. *nshards
 * receives the shard count (model_write.c). */
ckptio_status ckptio__hf_save(const char *dir, const ckptio_tensor_source *tensors, size_t count, uint64_t shard_size,
                             unsigned sync_flags, ckptio__shard_fn save_shard, void *ctx, size_t *nshards);

/* A DCP directory in the existing empty directory `dir`, as ckptio.dcp's
 * writer saves one process's state dict: tensors (safetensors terms) each
 * one torch.save archive of one chunk, then `nbytes` byte items, in the
 * data file __0_<token>_0.distcp; the checksum manifest; .metadata last.
 * Tensors are filled in batches of at most max(largest, 64 MiB)
 * (dcp_create.c). */
ckptio_status ckptio__dcp_save_streamed(ckptio_engine *engine, const char *dir, const ckptio_tensor_source *tensors,
                                        size_t count, ckptio__fill_fn fill, void *ctx, size_t nbytes,
                                        ckptio__bytes_fn bytes, void *bytes_ctx);

/* Whether tensor `index` of a DCP directory is written by streaming from its
 * zstd frames (*streamed: too large to hold), else that holding it whole is
 * justified by bytes on disk (its uncompressed chunks' items hold their
 * bytes and share none); CKPTIO_E_FORMAT naming the chunks otherwise
 * (dcp_convert.c, the rule of ckptio_dcp_save_safetensors). */
ckptio_status ckptio__dcp_convert_plan(ckptio_dcp *h, size_t index, bool *streamed);

/* Every tensor of the source can be held whole in a buffer its bytes on disk
 * justify, as a torch.save or DCP output needs: not a view larger than its
 * storage (torch.save), not a zstd tensor too large to hold (DCP); the
 * refusal names the tensor and the outputs that stream it (convert_source.c). */
ckptio_status ckptio__convert_source_check_held(const ckptio__convert_source *s, const char *path);

/* ckptio_dcp_write() placing the items of each file from offset `start`
 * instead of 0, so that a file can be written in several calls (dcp_write.c). */
ckptio_status ckptio__dcp_write_from(ckptio_engine *engine, ckptio_dcp_item *items, size_t count,
                                     const ckptio_torch_save_options *options, uint64_t start);

#endif /* CKPTIO_CONVERT_INTERNAL_H */
