/*
 * ckptio/safetensors.h - safetensors files: read, save, checksums beside them and their
 * verification (docs/SAFETENSORS.md, docs/RELIABILITY.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_SAFETENSORS_H
#define CKPTIO_SAFETENSORS_H

#include "core.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/safetensors.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* safetensors                                                              */
/* ------------------------------------------------------------------------ */

typedef struct ckptio_safetensors ckptio_safetensors;

/*! ckptio_safetensors_open() :
 * Opens and validates a safetensors file: header size cap (100,000,000),
 * UTF-8 JSON, dtypes, shapes, offsets contiguous from 0 and in bounds, no
 * overflow, no trailing bytes (docs/SAFETENSORS.md lists every rule).
 * Errors name the file, the tensor and the rule broken: CKPTIO_E_FORMAT,
 * or CKPTIO_E_TRUNCATED when the file ends before its header or data.
 * The engine is used for later reads and must outlive the handle, which
 * keeps the file open until ckptio_safetensors_close(). */
CKPTIO_API ckptio_status ckptio_safetensors_open(ckptio_engine *engine, const char *path,
                                                 ckptio_safetensors **out);

/*! ckptio_safetensors_parse() :
 * Validates a header held in memory: `bytes` holds the first `len` bytes
 * of a file (at least 8 + header length) whose total size is `file_size`.
 * The handle can list tensors but not read data (CKPTIO_E_INVAL). */
CKPTIO_API ckptio_status ckptio_safetensors_parse(const void *bytes, size_t len, uint64_t file_size,
                                                  ckptio_safetensors **out);

/*! ckptio_safetensors_close() : accepts NULL. */
CKPTIO_API ckptio_status ckptio_safetensors_close(ckptio_safetensors *st);

/*! ckptio_safetensors_count() : number of tensors (not counting __metadata__). */
CKPTIO_API ckptio_status ckptio_safetensors_count(const ckptio_safetensors *st, size_t *out);

/*! ckptio_safetensors_tensor() : tensor `index` (0..count-1, in file offset
 * order). Pointers in *out live as long as the handle. */
CKPTIO_API ckptio_status ckptio_safetensors_tensor(const ckptio_safetensors *st, size_t index,
                                                   ckptio_tensor_info *out);

/*! ckptio_safetensors_find() : index of the tensor named `name`, or
 * CKPTIO_E_NOT_FOUND. */
CKPTIO_API ckptio_status ckptio_safetensors_find(const ckptio_safetensors *st, const char *name,
                                                 size_t *index);

/*! ckptio_safetensors_metadata_count() / _metadata() : the __metadata__
 * pairs, in file order. Strings live as long as the handle. */
CKPTIO_API ckptio_status ckptio_safetensors_metadata_count(const ckptio_safetensors *st, size_t *out);
CKPTIO_API ckptio_status ckptio_safetensors_metadata(const ckptio_safetensors *st, size_t index,
                                                     ckptio_kv *out);

/*! ckptio_safetensors_data_offset() : where the data section starts (8 + N). */
CKPTIO_API ckptio_status ckptio_safetensors_data_offset(const ckptio_safetensors *st, uint64_t *out);

/*! ckptio_safetensors_data_size() : bytes in the data section (the end of
 * the last tensor; the file is data_offset + data_size bytes). This is the
 * capacity ckptio_safetensors_read_all() needs. */
CKPTIO_API ckptio_status ckptio_safetensors_data_size(const ckptio_safetensors *st, uint64_t *out);

/*! ckptio_safetensors_read() :
 * Reads the chosen tensors into caller memory (host or GPU), all in one plan.
 * A target with capacity < nbytes is CKPTIO_E_RANGE naming the tensor. */
CKPTIO_API ckptio_status ckptio_safetensors_read(ckptio_safetensors *st, const ckptio_tensor_target *targets,
                                                 size_t count);

/*! ckptio_safetensors_read_all() :
 * Reads every tensor into one caller buffer laid out like the data section
 * (tensor i at info.file_offset - data_offset). `capacity` must be at least
 * the data section's size. */
CKPTIO_API ckptio_status ckptio_safetensors_read_all(ckptio_safetensors *st, void *data, uint64_t capacity,
                                                     ckptio_mem_kind mem_kind);

enum ckptio_safetensors_save_flags {
    /* Pad the header so the data section starts at a multiple of 4096 (default). */
    CKPTIO_SAFETENSORS_ALIGN_4K = 0,
    /* Reference layout: pad the header to a multiple of 8 only. */
    CKPTIO_SAFETENSORS_ALIGN_8 = 1u << 0,
    /* Write `path` itself, not a temporary renamed over it (as
     * CKPTIO_OPEN_IN_PLACE): for targets that cannot be renamed over, such
     * as /proc/self/fd/N of a memfd (the Python package's save to bytes).
     * Not atomic: a failure leaves a partial `path`. Not with
     * CKPTIO_SAFETENSORS_CHECKSUMS (CKPTIO_E_INVAL). */
    CKPTIO_SAFETENSORS_IN_PLACE = 1u << 1
};

/*! ckptio_safetensors_save() :
 * Writes tensors (host or GPU memory, per mem_kind) to `path` atomically:
 * reference tensor order (dtype descending, then name), compact JSON with
 * __metadata__ first (pairs in the caller's order, left out when
 * metadata_count is 0), data section 4 KiB-aligned unless flags say
 * otherwise. With CKPTIO_SAFETENSORS_ALIGN_8 the file is byte-identical to
 * what the safetensors package writes for the same tensors (and the same
 * metadata order). Names must be unique, non-empty, valid UTF-8 and not
 * "__metadata__"; nbytes must match shape x dtype (CKPTIO_E_INVAL naming
 * the tensor); C32/C128 have no safetensors name (CKPTIO_E_UNSUPPORTED).
 * On failure no file exists under `path` and an older file there is
 * untouched (except with CKPTIO_SAFETENSORS_IN_PLACE). */
CKPTIO_API ckptio_status ckptio_safetensors_save(ckptio_engine *engine, const char *path,
                                                 const ckptio_tensor_source *tensors, size_t count,
                                                 const ckptio_kv *metadata, size_t metadata_count,
                                                 unsigned flags);

/*! ckptio_safetensors_layout() :
 * The file ckptio_safetensors_save() would write for the same arguments
 * (the same checks; flags: the alignment), laid out without writing it: for
 * callers that hold the whole file in memory (a checkpoint as bytes). The
 * header - 8-byte length, JSON, padding - goes to header[0 .. *header_size)
 * when it fits `capacity` (else CKPTIO_E_RANGE; header NULL: only the sizes
 * are set); offsets[i] (count entries, may be NULL with header NULL)
 * receives the file offset of tensor i's bytes and *file_size the file's
 * size. Copying each tensor's nbytes to its offset after the header
 * gives the file byte for byte. Reads no tensor memory. */
CKPTIO_API ckptio_status ckptio_safetensors_layout(const ckptio_tensor_source *tensors, size_t count,
                                                   const ckptio_kv *metadata, size_t metadata_count, unsigned flags,
                                                   void *header, uint64_t capacity, uint64_t *header_size,
                                                   uint64_t *offsets, uint64_t *file_size);

/* ------------------------------------------------------------------------ */
/* Integrity and recovery                                                   */
/* ------------------------------------------------------------------------ */
/* Checksums beside safetensors files and their verification, and removal of
 * the temporaries that crashed saves leave behind. docs/RELIABILITY.md lists
 * every guarantee and the test that backs it. (torch.save files carry a
 * CRC-32 per record instead: ckptio_torch_verify.) */

/* The checksums of NAME live in NAME + this suffix (a "manifest"; for long
 * names see ckptio_manifest_path). */
#define CKPTIO_MANIFEST_SUFFIX ".ckptio-manifest.json"

/* The safetensors __metadata__ key holding the id that binds a file saved
 * with CKPTIO_SAFETENSORS_CHECKSUMS to its manifest (32 hex digits). */
#define CKPTIO_SAVE_ID_KEY "ckptio.save_id"

enum ckptio_integrity_flags {
    /* ckptio_safetensors_save() flag: also record XXH3-64 checksums of
     * every tensor, per 4 MiB block, in NAME.ckptio-manifest.json. The
     * manifest is written after the data: old manifest removed, data file
     * committed, then the new manifest committed, so a crash can leave a
     * file without a manifest but never a manifest describing other data.
     * Host memory is hashed while the data is written; GPU memory on the
     * pinned staging copy on its way to the file (no read-back, unless
     * CKPTIO_OPT_STAGING_BYTES is below 4 x (4 MiB + 4 KiB)).
     * The manifest is bound to its data: a random per-save id goes into
     * both (the data file's __metadata__ entry CKPTIO_SAVE_ID_KEY, the
     * manifest's "save_id"); a caller's metadata entry of that key is
     * dropped, with or without this flag.
     * Without this flag a save removes a manifest left beside NAME by an
     * earlier save (it would no longer describe the file). If the data
     * file was committed but its manifest could not be, the save fails
     * and the message says the data is in place without checksums. */
    CKPTIO_SAFETENSORS_CHECKSUMS = 1u << 8
};

/* What a verification checked. */
typedef struct ckptio_verify_report {
    size_t tensors;   /* tensors whose checksums matched */
    size_t blocks;    /* checksum blocks compared */
    uint64_t bytes;   /* data bytes hashed */
} ckptio_verify_report;

/*! ckptio_manifest_path() : writes data_path + CKPTIO_MANIFEST_SUFFIX into
 * buf (cap bytes, NUL included). A base name of more than 234 bytes (whose
 * manifest name would pass 255 bytes) is replaced in the manifest's name by
 * its first bytes (whole UTF-8 characters), '~' and the XXH3-64 of the
 * whole base name in 16 lowercase hex digits, 234 bytes at most; the
 * directory part is kept. The result is never longer than data_path +
 * CKPTIO_MANIFEST_SUFFIX. @return CKPTIO_E_RANGE if it does not fit. */
CKPTIO_API ckptio_status ckptio_manifest_path(const char *data_path, char *buf, size_t cap);

/*! ckptio_safetensors_verify() :
 * Checks an open file against its manifest (manifest_path NULL: the one
 * beside the file). The manifest must have been written by the save that
 * wrote this file: a save id (CKPTIO_SAVE_ID_KEY) in the file or in the
 * manifest that the other lacks or does not match is CKPTIO_E_STALE, never
 * CKPTIO_E_CHECKSUM (another save replaced one of the two: two processes
 * saving to one path, or a save running during the verification); no data
 * is compared then. A manifest without a save id (version 1, from earlier
 * builds) beside a file without one is checked as before, except that a
 * different size or tensor layout is CKPTIO_E_STALE. Different header
 * bytes are CKPTIO_E_CHECKSUM; so is any difference under matching ids.
 * Then every tensor's bytes are read and hashed block by block. A mismatch
 * is CKPTIO_E_CHECKSUM naming the tensor, the file and the byte range of
 * the bad block. No manifest:
 * CKPTIO_E_NOT_FOUND; a malformed one: CKPTIO_E_FORMAT naming the field.
 * report (may be NULL) says what was checked up to the failure. */
CKPTIO_API ckptio_status ckptio_safetensors_verify(ckptio_safetensors *st, const char *manifest_path,
                                                   ckptio_verify_report *report);

/*! ckptio_safetensors_read_verified() :
 * ckptio_safetensors_read(), then each target's bytes are hashed in memory
 * and compared with the manifest (a load verified on request). Targets
 * must be host or pinned memory (CKPTIO_E_UNSUPPORTED for GPU targets:
 * verify the file with ckptio_safetensors_verify instead). Errors as for
 * ckptio_safetensors_verify; after a mismatch the target holds the bytes
 * that were read. */
CKPTIO_API ckptio_status ckptio_safetensors_read_verified(ckptio_safetensors *st, const char *manifest_path,
                                                          const ckptio_tensor_target *targets, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_SAFETENSORS_H */
