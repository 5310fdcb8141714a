/*
 * manifest_internal.h - the checksum manifest kept beside a safetensors
 * file (NAME.ckptio-manifest.json): its in-memory form, the parser that
 * validates hostile text, and the writer. No I/O here; src/ckpt/manifest_*.c
 * join it with files and the engine. docs/RELIABILITY.md describes the
 * format:
 *
 *   {"format":"ckptio-manifest","version":2,"save_id":"<32 hex>",
 *    "file":"m.safetensors","file_size":N,"data_offset":D,
 *    "header_xxh3":"<16 hex>","hash":"xxh3-64","block_bytes":4194304,
 *    "tensors":[{"name":"w","offset":O,"nbytes":B,"blocks":["<16 hex>",...]}]}
 *
 * "save_id" is random per save and also written into the data file's
 * __metadata__ (CKPTIO_SAVE_ID_KEY): it binds the manifest to the data of
 * the same save, so that a manifest beside data of another save (two
 * processes saving to one path) is told apart from damaged data. Version 1
 * manifests (no "save_id") are still read.
 *
 * A tensor's bytes [O, O+B) are cut into blocks of block_bytes from O on
 * (the last one shorter); each block's XXH3-64 is listed in order. Blocks
 * let hashing run in parallel and in any order, and let a mismatch be
 * named by its byte range.
 */
#ifndef CKPTIO_MANIFEST_INTERNAL_H
#define CKPTIO_MANIFEST_INTERNAL_H

#include "common_internal.h"

#define CKPTIO__MANIFEST_FORMAT "ckptio-manifest"
#define CKPTIO__MANIFEST_VERSION 2    /* written; with "save_id" */
#define CKPTIO__MANIFEST_VERSION_V1 1 /* still read; without "save_id" */
/* Lowercase hex digits of a save id (128 random bits). */
#define CKPTIO__SAVE_ID_HEX 32
#define CKPTIO__MANIFEST_HASH "xxh3-64"
/* Block size the writer uses. Readers accept powers of two in
 * [CKPTIO__MANIFEST_MIN_BLOCK, CKPTIO__MANIFEST_MAX_BLOCK]. */
#define CKPTIO__MANIFEST_BLOCK (4u << 20)
#define CKPTIO__MANIFEST_MIN_BLOCK 4096u
#define CKPTIO__MANIFEST_MAX_BLOCK (1u << 30)
/* Largest manifest text read (an 8 TiB checkpoint in 4 MiB blocks needs
 * about 45 MB). Bounds jansson's memory, which is a multiple of the text. */
#define CKPTIO__MANIFEST_MAX_BYTES (256u << 20)
/* Longest "file" value. */
#define CKPTIO__MANIFEST_MAX_NAME 4096u

typedef struct ckptio__manifest_tensor {
    char *name;
    uint64_t offset;  /* absolute file offset of the first byte */
    uint64_t nbytes;
    size_t nblocks;   /* ceil(nbytes / block_bytes) */
    uint64_t *blocks; /* XXH3-64 of each block */
} ckptio__manifest_tensor;

typedef struct ckptio__manifest {
    char save_id[CKPTIO__SAVE_ID_HEX + 1]; /* "" for a version 1 manifest */
    char *file;           /* base name of the data file (no '/', not "." or "..") */
    uint64_t file_size;
    uint64_t data_offset; /* where tensor data starts (the header is [0, data_offset)) */
    uint64_t header_hash; /* XXH3-64 of the header bytes */
    uint64_t block_bytes;
    size_t count;
    ckptio__manifest_tensor *tensors;
} ckptio__manifest;

/* Blocks of a tensor of `nbytes` bytes. */
static inline size_t ckptio__manifest_nblocks(uint64_t nbytes, uint64_t block_bytes) {
    return (size_t)(nbytes / block_bytes + (nbytes % block_bytes != 0));
}

/* Parses and validates manifest text (`len` bytes, need not be
 * NUL-terminated). Errors name `path` (may be NULL) and the field:
 * CKPTIO_E_FORMAT (malformed, inconsistent, too large; "save_id" missing
 * from version 2 or present in version 1), CKPTIO_E_UNSUPPORTED
 * (another version or hash), CKPTIO_E_DISALLOWED ("file" holding a path:
 * '/', "..", absolute). Tensors must lie inside [data_offset, file_size)
 * without overlapping; names unique. On success *out must be released with
 * ckptio__manifest_cleanup(); on failure *out is zeroed. */
ckptio_status ckptio__manifest_parse(const char *text, size_t len, const char *path, ckptio__manifest *out);

/* The manifest as compact JSON, NUL-terminated, in memory from
 * ckptio__malloc (free with ckptio__free): version 2 with its save_id, or
 * version 1 when save_id is "". NULL when out of memory (error record
 * set). */
char *ckptio__manifest_dump(const ckptio__manifest *m, size_t *len);

/* Frees what the manifest owns and zeroes it. Accepts a zeroed manifest. */
void ckptio__manifest_cleanup(ckptio__manifest *m);

/* Index of the tensor named `name`, or SIZE_MAX. */
size_t ckptio__manifest_find(const ckptio__manifest *m, const char *name);

/* ---- with files (src/ckpt/manifest_save.c, manifest_verify.c) ----------- */

/* A fresh random save id: CKPTIO__SAVE_ID_HEX lowercase hex digits. */
void ckptio__manifest_new_save_id(char out[CKPTIO__SAVE_ID_HEX + 1]);

/* The end of a safetensors save: writes `extents` (extents[0] the header,
 * extents[i + 1] the bytes of tensors[i]; zero-length ones skipped) to the
 * uncommitted atomic write `file` in one plan, then commits. With
 * `checksums` the tensors are hashed (host memory on a helper thread while
 * the plan runs, other memory read back from the file before the commit)
 * and the manifest is committed after the data; in every case a manifest
 * already beside `path` is removed before the data commit (directory
 * fsynced), so no manifest ever describes data it was not made for. The
 * caller closes `file` (discarding it on failure). `save_id` (checksums
 * only) is the id the header in extents[0] carries under
 * CKPTIO_SAVE_ID_KEY; the manifest records it. The manifest takes its mode
 * and owner from the data file. */
ckptio_status ckptio__manifest_write_and_commit(ckptio_engine *engine, ckptio_file *file, const char *path,
                                                const ckptio_extent *extents, const ckptio_tensor_source *tensors,
                                                size_t count, const char *save_id);

#endif /* CKPTIO_MANIFEST_INTERNAL_H */
