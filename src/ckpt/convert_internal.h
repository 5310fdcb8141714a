/*
 * convert_internal.h - writing a checkpoint whose tensor bytes are read from
 * another checkpoint one tensor at a time (bounded memory, every byte
 * through the engine): the shared core of ckptio_dcp_save_safetensors,
 * ckptio_torch_save_safetensors and ckptio_safetensors_save_torch.
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

#endif /* CKPTIO_CONVERT_INTERNAL_H */
