/*
 * dcp_dir_internal.h - what the files of the DCP directory reader share
 * (dcp_dir.c: the table from .metadata; dcp_assemble.c: decoding items and
 * assembling tensors; dcp_manifest_verify.c: the ckptio manifest).
 */
#ifndef CKPTIO_DCP_DIR_INTERNAL_H
#define CKPTIO_DCP_DIR_INTERNAL_H

#include "common_internal.h"

typedef struct ckptio__dcp_tensor {
    char *fqn;
    ckptio_dtype dtype;
    uint32_t ndim;
    int64_t *shape;             /* ndim */
    uint64_t numel, nbytes;
    size_t nchunks;
    int64_t *offsets;           /* nchunks x ndim */
    int64_t *sizes;             /* nchunks x ndim */
    ckptio_dcp_stored *stored;  /* nchunks; file == NULL until storage_data names it */
    size_t *by_offsets;         /* chunk indices sorted by offsets (ckptio__dcp_chunk_index) */
} ckptio__dcp_tensor;

typedef struct ckptio__dcp_bytes {
    char *fqn;
    ckptio_dcp_stored stored;
} ckptio__dcp_bytes;

/* A parsed SAFETENSORS blob header, kept for the other tensors of the blob. */
typedef struct ckptio__dcp_blob {
    size_t file;
    uint64_t offset;
    ckptio_dcp_header *header;
} ckptio__dcp_blob;

struct ckptio_dcp {
    ckptio_engine *engine;
    char *dir;
    char *md_path;              /* DIR/.metadata, for error messages */
    ckptio__dcp_tensor *tensors;
    size_t ntensors;
    size_t *by_name;            /* tensor indices sorted by fqn (bsearch) */
    ckptio__dcp_bytes *bytes;
    size_t nbytes_items;
    size_t *bytes_by_name;      /* byte item indices sorted by fqn */
    char **files;               /* distinct relative paths, sorted (bsearch) */
    size_t nfiles;
    ckptio_file **handles;      /* opened on first read */
    size_t file_window;         /* ckptio__file_window(nfiles): 0, or files open at once */
    size_t handed_out;          /* files handed out since the last release of the others */
    uint64_t *file_sizes;
    char *manifest_name;        /* from the save token, or NULL */
    ckptio__dcp_blob *blobs;
    size_t nblobs;
    struct ckptio__dcp_listing *listing; /* objects: the prefix's sizes and ETags (dcp_listing.c), or NULL */
};

/* dcp_listing.c: a listing of the objects under an s3:// `dir` started on a
 * thread of its own (*out NULL for a local dir, or where it cannot start);
 * _finish waits for it and keeps its entries only if it lists `witness`
 * with `etag` (the version a GET of it answered with); _get: the size and
 * ETag of `name` as listed, false when unknown; _free waits for it too. */
typedef struct ckptio__dcp_listing ckptio__dcp_listing;
ckptio_status ckptio__dcp_listing_start(ckptio_engine *engine, const char *dir, ckptio__dcp_listing **out);
void ckptio__dcp_listing_finish(ckptio__dcp_listing *l, const char *witness, const char *etag);
bool ckptio__dcp_listing_get(const ckptio__dcp_listing *l, const char *name, uint64_t *size, const char **etag);
void ckptio__dcp_listing_free(ckptio__dcp_listing *l);

/* The table of a .metadata held in memory (`dir` names the directory in
 * messages): what ckptio_dcp_open() builds, without an engine, so the
 * handle can list but not read (fuzz/fuzz_dcp_metadata.c). */
ckptio_status ckptio__dcp_open_bytes(const char *dir, const void *data, size_t len, ckptio_dcp **out);

/* ---- the .metadata value tree (dcp_values.c) ----------------------------- */

/* Class names of torch.distributed.checkpoint.metadata. */
#define CKPTIO__DCP_MD "torch.distributed.checkpoint.metadata."

/* A STR node's text (and its length), or NULL. */
const char *ckptio__dcp_str_of(const ckptio_value *v, size_t *len);

/* The field `key` of a dict with string keys (NULL when absent). */
const ckptio_value *ckptio__dcp_dict_get(const ckptio_value *dict, const char *key);

/* The field dict of an instance of class `cls`: BUILD's dict state, or the
 * dict half of a (dict, slots) state tuple. NULL if the node is not one. */
const ckptio_value *ckptio__dcp_fields_of(const ckptio_value *v, const char *cls);

/* Element size in bytes as torch counts elements (float4_e2m1fn_x2: 1), 0
 * for dtypes DCP cannot hold. */
uint64_t ckptio__dcp_element_size(ckptio_dtype dtype);

/* Index of `name` in dcp->files, or (size_t)-1. */
size_t ckptio__dcp_file_index(const ckptio_dcp *dcp, const char *name);

/* The data file `index` opened for reading (kept open), and its size. */
ckptio_status ckptio__dcp_file(ckptio_dcp *dcp, size_t index, ckptio_file **file, uint64_t *size);

/* Checks that [offset, offset + length) of the stored item lies in its
 * file (CKPTIO_E_TRUNCATED naming file, offset and fqn otherwise). */
ckptio_status ckptio__dcp_item_bounds(ckptio_dcp *dcp, const ckptio_dcp_stored *s, const char *fqn,
                                      ckptio_file **file);

/* A blocking transfer between `file` and host memory through the engine:
 * small ones directly, large ones as a one-extent plan that the engine
 * splits into chunks and runs on its workers. */
ckptio_status ckptio__dcp_io(ckptio_file *file, ckptio_direction dir, void *buf, uint64_t len, uint64_t offset);

/* Index of the chunk of `t` whose offsets are off[0..n) (the first one when
 * several share them), or (size_t)-1: a binary search, O(ndim log chunks). */
size_t ckptio__dcp_chunk_index(const ckptio__dcp_tensor *t, const int64_t *off, uint32_t n);

/* The chunks of `t` tile the tensor exactly (no gap, no overlap), else
 * CKPTIO_E_FORMAT naming the tensor (dcp_tiling.c). O(chunks x ndim). */
ckptio_status ckptio__dcp_check_tiling(const ckptio_dcp *h, const ckptio__dcp_tensor *t);

/* The coverage rule ckptio_dcp_check() and ckptio_dcp_verify() apply, the
 * one ckptio.dcp's reader applies: when the data files are several ranks'
 * (ckptio__dcp_several_ranks), every tensor must be tiled exactly
 * (CKPTIO_E_FORMAT as ckptio__dcp_check_tiling); otherwise a tensor may be
 * saved in part (one process saving its own shards, which torch loads back)
 * and *partial counts the tensors whose chunks do not tile them. Chunks lie
 * inside their tensors already (ckptio_dcp_open). O(chunks x ndim). */
ckptio_status ckptio__dcp_check_coverage(const ckptio_dcp *h, size_t *partial);

/* The elements of a tensor of `shape`, or CKPTIO_E_FORMAT naming ctx (a
 * negative size, or more than 64 bits of them) (dcp_tiling.c). */
ckptio_status ckptio__dcp_numel(const ckptio__err_ctx *ctx, uint32_t ndim, const int64_t *shape, uint64_t *numel);

/* CKPTIO_E_FORMAT naming ctx and chunk `c` unless [off, off + size) lies
 * inside `shape` in every dimension (dcp_tiling.c). */
ckptio_status ckptio__dcp_chunk_inside(const ckptio__err_ctx *ctx, size_t c, uint32_t ndim, const int64_t *shape,
                                       const int64_t *off, const int64_t *size);

/* Reads byte item `index` (decompressed when zstd; bounded by
 * CKPTIO_DCP_BYTE_ITEM_MAX) into *out (ckptio__malloc'ed). */
ckptio_status ckptio__dcp_load_bytes(ckptio_dcp *h, size_t index, void **out, uint64_t *len);

/* Byte item `index` parses as a torch.save archive through the restricted
 * unpickler: a global outside the allowlist is CKPTIO_E_DISALLOWED naming the
 * data file, offset, item and global. Nothing is ever run. */
ckptio_status ckptio__dcp_check_bytes(ckptio_dcp *h, size_t index);

/* Tensor / byte item index of `fqn`, or (size_t)-1. */
size_t ckptio__dcp_tensor_index(const ckptio_dcp *dcp, const char *fqn);
size_t ckptio__dcp_bytes_index(const ckptio_dcp *dcp, const char *fqn);

/* ---- zstd items and boxes of stored tensors (dcp_item.c, dcp_box.c) ---------- */

/* A zstd item whose archive decompresses to at most this is held decoded in
 * memory; a larger one is never held: its first and last MiB are kept to
 * parse it and its storage is decompressed again, through a fixed buffer,
 * each time it is read (docs/DCP.md "Hostile sizes"). */
#define CKPTIO__DCP_ZSTD_INLINE_MAX ((uint64_t)64 << 20)

/* ckptio_dcp_header_zstd() with the size up to which the archive is held
 * whole as a parameter (tests take the streaming path with small items). */
ckptio_status ckptio__dcp_header_zstd_inline(const void *src, size_t len, uint64_t limit, uint64_t inline_max,
                                             const char *origin, uint64_t offset, const char *subject,
                                             ckptio_dcp_header **out);

/* Where the decoded archive of a header made by ckptio_dcp_header_parse or
 * ckptio_dcp_header_zstd is: `data` (all `len` bytes, in memory) or else the
 * stored frames to decompress again (zsrc, zlen, at most zlimit bytes). */
typedef struct ckptio__dcp_archive {
    const uint8_t *data;
    uint64_t len;
    const uint8_t *zsrc;
    size_t zlen;
    uint64_t zlimit;
    const char *path;           /* the stored item, for messages */
    uint64_t offset;
} ckptio__dcp_archive;

/* CKPTIO_E_INVAL for the header of an untransformed item (its bytes are in
 * its file). */
ckptio_status ckptio__dcp_header_archive(const ckptio_dcp_header *h, ckptio__dcp_archive *out);

/* Receives the bytes of a box of a stored tensor: n bytes that belong at byte
 * `dst` of the destination (its element strides given to the box). */
typedef ckptio_status (*ckptio__dcp_emit_fn)(void *ctx, uint64_t dst, const void *data, size_t n);

/* Every element of the box [offsets, +sizes) of tensor `fqn` of a header made
 * by ckptio_dcp_header_parse or ckptio_dcp_header_zstd, handed to emit in
 * runs contiguous in the storage and in the destination (element i of the
 * box belongs at byte sum(i_k * dst_strides[k]) * element size). A large zstd
 * item is decompressed once more, through a fixed buffer, and its runs are
 * handed over as they pass: the storage's elements must then lie in an order
 * that some order of the dimensions visits increasingly (any layout torch
 * writes; overlapping strides are CKPTIO_E_UNSUPPORTED). */
ckptio_status ckptio__dcp_header_emit_box(const ckptio_dcp_header *h, const char *fqn, const int64_t *offsets,
                                          const int64_t *sizes, const int64_t *dst_strides, ckptio__dcp_emit_fn emit,
                                          void *ctx);

/* The same for a stored tensor whose storage bytes [lay->storage_start,
 * + lay->storage_nbytes) are all in memory at `storage` (dcp_box.c). */
ckptio_status ckptio__dcp_emit_box_memory(const ckptio_dcp_layout *lay, const uint8_t *storage,
                                          const int64_t *offsets, const int64_t *sizes, const int64_t *dst_strides,
                                          ckptio__dcp_emit_fn emit, void *ctx);

/* Hands every byte of tensor `index` to emit (its byte offset in the tensor
 * in C order) chunk by chunk, in bounded memory: zstd chunks as their frames
 * decompress (ckptio__dcp_header_emit_box), others from their storage read
 * into memory. Chunks must tile the tensor (dcp_assemble.c). */
ckptio_status ckptio__dcp_emit_tensor(ckptio_dcp *h, size_t index, ckptio__dcp_emit_fn emit, void *ctx);

/* ---- the ckptio manifest (dcp_manifest_verify.c) ---------------------------- */

typedef struct ckptio__dcp_mpart {
    uint64_t offset;            /* relative to the item's data_offset */
    uint64_t length;
    uint64_t hash;
} ckptio__dcp_mpart;

typedef struct ckptio__dcp_mitem {
    char *fqn;
    int has_offset;             /* 0 for byte items ("offset": null) */
    uint32_t ndim;
    int64_t *offset;            /* ndim chunk offsets */
    char *file;
    uint64_t data_offset, nbytes;
    int hashed;                 /* "xxh3" was a hex string */
    uint64_t hash;
    size_t nparts;              /* "parts": tile [0, nbytes) in order */
    ckptio__dcp_mpart *parts;
} ckptio__dcp_mitem;

typedef struct ckptio__dcp_manifest {
    char **files;
    size_t nfiles;
    ckptio__dcp_mitem *items;
    size_t count;
} ckptio__dcp_manifest;

/* Parses a manifest's text. Guarantees on success: every "file" and every
 * item's file is a plain name (no '/', not "." or ".."), each item's file is
 * one of "files", data_offset + nbytes does not overflow, parts tile
 * [0, nbytes) in order. Errors (CKPTIO_E_FORMAT) name `origin` and the
 * field. *out is zeroed on failure; free with ckptio__dcp_manifest_free. */
ckptio_status ckptio__dcp_manifest_parse(const char *text, size_t len, const char *origin,
                                         ckptio__dcp_manifest *out);
void ckptio__dcp_manifest_free(ckptio__dcp_manifest *m);

/* A relative_path or manifest "file" that stays inside the directory. */
bool ckptio__dcp_plain_name(const char *name, size_t len);

#endif /* CKPTIO_DCP_DIR_INTERNAL_H */
