/*
 * ckptio/dcp.h - torch.distributed.checkpoint (DCP) directories: reading and
 * checking a whole directory, the .metadata object tree, data files, single
 * stored items, and the directory commit of a save (docs/DCP.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_DCP_H
#define CKPTIO_DCP_H

#include "torch.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/dcp.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* DCP checkpoint directories                                               */
/* ------------------------------------------------------------------------ */
/* (docs/DCP.md "C API and CLI for DCP directories")
 * A whole torch.distributed.checkpoint directory, read without Python:
 * DIR/.metadata goes through the restricted unpickler
 * (ckptio_pickle_parse_dcp_metadata, below) and becomes a table of tensors (global
 * shape, chunks, where each chunk is stored) and byte items. Tensors are
 * assembled from their chunks into host memory; items are checked against
 * the ckptio manifest (.ckptio-manifest-<token>.json) when there is one. */

typedef struct ckptio_dcp ckptio_dcp;

/* Transforms applied to a stored item (its _StorageInfo.transform_descriptors). */
enum ckptio_dcp_transform {
    CKPTIO_DCP_TRANSFORM_ZSTD = 1u << 0  /* "stream.zstd/1": the item is zstd-compressed */
};

/* Where an item's bytes are. */
typedef struct ckptio_dcp_stored {
    const char *file;         /* relative path inside the directory (a plain name) */
    uint64_t offset;          /* first byte of the item in that file */
    uint64_t length;          /* stored bytes */
    unsigned transforms;      /* ckptio_dcp_transform flags */
} ckptio_dcp_stored;

/* A tensor of the checkpoint (its global view). */
typedef struct ckptio_dcp_tensor_info {
    const char *fqn;          /* "layer.0.weight" */
    ckptio_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;     /* ndim entries: the global shape */
    uint64_t nbytes;          /* bytes of the whole tensor in C order */
    size_t chunks;            /* chunks it was saved in (ckptio_dcp_chunk) */
} ckptio_dcp_tensor_info;

/* One saved chunk of a tensor: the box [offsets, offsets + sizes). */
typedef struct ckptio_dcp_chunk_info {
    const int64_t *offsets;   /* ndim entries */
    const int64_t *sizes;     /* ndim entries */
    ckptio_dcp_stored stored;
} ckptio_dcp_chunk_info;

/* A non-tensor leaf (saved with torch.save(obj), possibly zstd-compressed). */
typedef struct ckptio_dcp_bytes_info {
    const char *fqn;
    ckptio_dcp_stored stored;
} ckptio_dcp_bytes_info;

/* Bounds on what a zstd-transformed item may decompress to, enforced while it
 * decompresses through a fixed buffer (ckptio_zstd_stream below; frames
 * declaring more are refused from their headers), by this library and by
 * ckptio.dcp's FileSystemReader: a tensor item holds a torch.save archive
 * of its chunk, so at most the chunk's bytes plus
 * CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX (zip records, pickle, alignment); a byte
 * item (torch.save of a non-tensor object) at most CKPTIO_DCP_BYTE_ITEM_MAX. */
#define CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX ((uint64_t)64 << 20)
#define CKPTIO_DCP_BYTE_ITEM_MAX ((uint64_t)1 << 30)

/*! ckptio_dcp_open() :
 * Reads DIR/.metadata and builds the table. Errors name the file and the
 * field ("DIR/.metadata: state_dict_metadata['x']: chunk 2 has 3 offsets
 * for a 2-d tensor"): CKPTIO_E_DISALLOWED for globals outside the DCP
 * allowlist, CKPTIO_E_FORMAT for a malformed object graph, chunks outside
 * their tensor, sizes that overflow, a relative_path that is absolute or
 * has '/' or "..", or a tensor chunk without storage; CKPTIO_E_UNSUPPORTED
 * for a transform other than stream.zstd/1, or more than one (the message
 * says which, or how many). Data files are not opened yet. For an s3://
 * DIR the prefix is listed beside the .metadata GET: a data object listed
 * with its size and ETag opens later without a HEAD (provided the listing
 * gives .metadata the ETag its GET answered with).
 * The engine is used for every later read and must outlive the handle. */
CKPTIO_API ckptio_status ckptio_dcp_open(ckptio_engine *engine, const char *dir, ckptio_dcp **out);

/*! ckptio_dcp_close() : accepts NULL. */
CKPTIO_API ckptio_status ckptio_dcp_close(ckptio_dcp *dcp);

/*! Counts: tensors, byte items, distinct data files. */
CKPTIO_API ckptio_status ckptio_dcp_tensor_count(const ckptio_dcp *dcp, size_t *out);
CKPTIO_API ckptio_status ckptio_dcp_bytes_count(const ckptio_dcp *dcp, size_t *out);
CKPTIO_API ckptio_status ckptio_dcp_file_count(const ckptio_dcp *dcp, size_t *out);

/*! ckptio_dcp_tensor() / ckptio_dcp_chunk() / ckptio_dcp_bytes() /
 * ckptio_dcp_file() : table rows, in .metadata order (files sorted by
 * name). Pointers live as long as the handle. */
CKPTIO_API ckptio_status ckptio_dcp_tensor(const ckptio_dcp *dcp, size_t index, ckptio_dcp_tensor_info *out);
CKPTIO_API ckptio_status ckptio_dcp_chunk(const ckptio_dcp *dcp, size_t tensor, size_t chunk,
                                          ckptio_dcp_chunk_info *out);
CKPTIO_API ckptio_status ckptio_dcp_bytes(const ckptio_dcp *dcp, size_t index, ckptio_dcp_bytes_info *out);
CKPTIO_API ckptio_status ckptio_dcp_file(const ckptio_dcp *dcp, size_t index, const char **name);

/*! ckptio_dcp_find() : index of the tensor `fqn`, or CKPTIO_E_NOT_FOUND. */
CKPTIO_API ckptio_status ckptio_dcp_find(const ckptio_dcp *dcp, const char *fqn, size_t *index);

/*! ckptio_dcp_manifest() : *name = the ckptio manifest's file name
 * (".ckptio-manifest-<token>.json", owned by the handle) when it exists
 * in the directory; CKPTIO_E_NOT_FOUND (message says why) when the data
 * files carry no ckptio save token or the file is missing. */
CKPTIO_API ckptio_status ckptio_dcp_manifest(const ckptio_dcp *dcp, const char **name);

/*! ckptio_dcp_read_tensor() :
 * Assembles the whole tensor `index` from all its chunks into host memory
 * at dst (capacity >= nbytes, else CKPTIO_E_RANGE), in C order. Each chunk's
 * item is read through the engine and decoded by kind: a torch.save
 * archive (any strides), a SAFETENSORS blob, or a zstd frame around an
 * archive (bounded: CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX). Host memory used besides dst: at most one storage;
 * for a zstd item its stored frames plus its archive when that is at most 64 MiB, else 3 MiB (a larger
 * archive is never held: its storage decompresses straight into dst, whatever .metadata or the frames
 * declare). Chunks that do not tile the tensor
 * exactly (gaps, overlaps) are CKPTIO_E_FORMAT naming the tensor; an item
 * whose dtype or shape disagrees with .metadata, or that runs past the end
 * of its file (CKPTIO_E_TRUNCATED), names file, offset and tensor. */
CKPTIO_API ckptio_status ckptio_dcp_read_tensor(ckptio_dcp *dcp, size_t index, void *dst, uint64_t capacity);

/*! ckptio_dcp_read_bytes() :
 * The bytes of byte item `index` (decompressed when zstd, at most
 * CKPTIO_DCP_BYTE_ITEM_MAX), i.e. what torch.save(obj) produced. They are
 * untrusted: parse them with ckptio_torch_parse() (the restricted
 * unpickler), never with an unrestricted one. *len receives their count;
 * CKPTIO_E_RANGE (with *len set) when capacity is too small. */
CKPTIO_API ckptio_status ckptio_dcp_read_bytes(ckptio_dcp *dcp, size_t index, void *dst, uint64_t capacity,
                                               uint64_t *len);

/* What ckptio_dcp_verify() / ckptio_dcp_check() covered (up to a failure). */
typedef struct ckptio_dcp_verify_report {
    size_t items;             /* stored items examined */
    size_t checked;           /* verify: items whose XXH3-64 (whole or every part) matched;
                               * check: items whose structure was validated */
    size_t unhashed;          /* verify: manifest items without a hash (not an error) */
    uint64_t bytes;           /* bytes hashed (verify) or items' stored bytes (check) */
    size_t partial;           /* tensors saved in part: their chunks do not tile them, which only a save
                               * that is not several ranks' may hold (one process saving its own shards;
                               * torch loads them back) */
} ckptio_dcp_verify_report;

/*! ckptio_dcp_verify() :
 * Checks every stored item against the ckptio manifest: the XXH3-64 of
 * file bytes [data_offset, +nbytes), or with "parts" of each part. Items are
 * hashed in pieces of at most 64 MiB (bounded memory). No manifest:
 * CKPTIO_E_NOT_FOUND (e.g. written by torch: use ckptio_dcp_check). A
 * manifest that does not describe the items of .metadata: CKPTIO_E_FORMAT.
 * Mismatch: CKPTIO_E_CHECKSUM naming file, offset and fqn. Chunks are
 * held to the rule of ckptio_dcp_check() (tiling when several ranks saved),
 * before any item is hashed. Then every byte
 * item is parsed by the restricted unpickler (a matching hash does not make
 * a pickle safe): CKPTIO_E_DISALLOWED naming file, offset, item and global.
 * report may be NULL. */
CKPTIO_API ckptio_status ckptio_dcp_verify(ckptio_dcp *dcp, ckptio_dcp_verify_report *report);

/*! ckptio_dcp_check() :
 * Structural check without checksums: every item lies inside its file,
 * every archive / SAFETENSORS blob / zstd frame parses and matches the
 * dtype and chunk shape of .metadata, every byte item passes the restricted
 * unpickler (CKPTIO_E_DISALLOWED naming the global), and, when the data
 * files are several ranks' (ckptio_dcp_saved_by_ranks()), every tensor's
 * chunks tile it (CKPTIO_E_FORMAT naming the overlap or gap; checked in
 * O(chunks x ndim)). Otherwise a tensor may be saved in part, as one process
 * saving its own shards writes it and torch loads it back: report->partial
 * counts those tensors (ckptio.dcp's reader applies the same rule). Reading
 * such a tensor whole (ckptio_dcp_read_tensor) is still refused. zstd items are bounded as
 * CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX says and decompressed once through a fixed buffer (never held when
 * over 64 MiB); an uncompressed storage is read through a 16 MiB buffer: memory stays bounded whatever
 * the sizes .metadata declares. report may be NULL. */
CKPTIO_API ckptio_status ckptio_dcp_check(ckptio_dcp *dcp, ckptio_dcp_verify_report *report);

/*! ckptio_dcp_validate() :
 * The rule `ckptio verify DIR` and ckptio.dcp.verify share: with a ckptio
 * manifest (ckptio_dcp_manifest), ckptio_dcp_verify(); without one (torch or
 * another writer saved the directory, or the manifest is gone),
 * ckptio_dcp_check(), which is not a failure: *manifest (may be NULL)
 * receives the manifest's name, or NULL when the structure was checked and
 * the bytes were not compared with checksums. A manifest that is there but
 * is not a regular file fails as ckptio_dcp_manifest() says (CKPTIO_E_FORMAT
 * naming it), never taken as absent. Errors as those two give. */
CKPTIO_API ckptio_status ckptio_dcp_validate(ckptio_dcp *dcp, ckptio_dcp_verify_report *report,
                                             const char **manifest);

/*! ckptio_dcp_save_safetensors() :
 * Consolidates tensors of the checkpoint into one safetensors file at
 * `path` (tensor indices `tensors[0..count)`, or every tensor when tensors
 * is NULL): the header is laid out as ckptio_safetensors_save() does
 * (flags: CKPTIO_SAFETENSORS_ALIGN_8 or 0, metadata pairs in order), then
 * each tensor is assembled (ckptio_dcp_read_tensor) into one reused host
 * buffer of the largest such tensor's size and written, so memory stays
 * bounded whatever the checkpoint's size. That buffer must be justified by
 * bytes on disk: each uncompressed chunk's item holds at least the chunk's
 * bytes and shares none with another chunk's (else CKPTIO_E_FORMAT naming
 * them); a tensor over 64 MiB with zstd chunks is instead streamed from its
 * frames to the file through an 8 MiB buffer (runs of zeros left unwritten,
 * the new file reads as zeros there). The file is written atomically
 * (temporary, fsync, rename): on failure nothing appears under `path`. */
CKPTIO_API ckptio_status ckptio_dcp_save_safetensors(ckptio_dcp *dcp, const char *path, const size_t *tensors,
                                                     size_t count, const ckptio_kv *metadata, size_t metadata_count,
                                                     unsigned flags);

/* ------------------------------------------------------------------------ */
/* torch.distributed.checkpoint .metadata: the unpickled object tree        */
/* ------------------------------------------------------------------------ */

/* The object tree of a torch.distributed.checkpoint .metadata pickle
 * (docs/FORMATS.md section 4.2), read without running any code: only the
 * classes of torch.distributed.checkpoint.metadata (Metadata,
 * TensorStorageMetadata, BytesStorageMetadata, ChunkStorageMetadata,
 * TensorProperties, MetadataIndex, StorageMeta, _MEM_FORMAT_ENCODING),
 * filesystem._StorageInfo, torch.Size, torch.serialization._get_layout,
 * pathlib.PosixPath, collections.OrderedDict and torch dtypes may be named;
 * instances become OBJECT nodes, the rest plain values. Files from torch <=
 * 2.2 name TensorProperties and MEM_FORMAT_ENCODING in
 * torch.distributed._shard.sharded_tensor.metadata: the tree gives those
 * objects the current class names. */
typedef struct ckptio_pickle ckptio_pickle;

/*! ckptio_pickle_parse_dcp_metadata() :
 * Unpickles bytes[0..len) (the whole .metadata file). `origin` (may be NULL)
 * names the file in errors. Any other global fails with CKPTIO_E_DISALLOWED
 * naming it ("global 'os.system' ..."), as do opcodes outside the
 * restricted set (persistent ids, INST/OBJ, ...); malformed or cut streams
 * fail with CKPTIO_E_FORMAT / CKPTIO_E_TRUNCATED and the offset. The handle
 * copies what it keeps: bytes may be freed after the call. */
CKPTIO_API ckptio_status ckptio_pickle_parse_dcp_metadata(const void *bytes, size_t len, const char *origin,
                                                          ckptio_pickle **out);

/*! ckptio_pickle_root() : the unpickled object (a Metadata OBJECT for a real
 * file). Nodes live as long as the handle. */
CKPTIO_API ckptio_status ckptio_pickle_root(const ckptio_pickle *p, const ckptio_value **out);

/*! ckptio_pickle_close() : accepts NULL. */
CKPTIO_API ckptio_status ckptio_pickle_close(ckptio_pickle *p);

/*! ckptio_value_object() : an OBJECT node: *class_name is the allowlisted
 * class as "module.Name" (static storage), *args the constructor arguments
 * (a TUPLE: REDUCE's args, or NEWOBJ's for cls.__new__) and *state what
 * BUILD set (a DICT of fields, a TUPLE for __setstate__, or NULL when the
 * pickle had no BUILD). Any output may be NULL. numpy values of a torch.save
 * tree are OBJECT nodes rebuilt as data, with no state: "numpy.dtype" with
 * args (descr) such as "<f8", "|b1", ">i4"; "numpy.ndarray" with args
 * (dtype, shape: a TUPLE of INTs, fortran: a BOOL, data: BYTES of exactly
 * the shape's elements); "numpy.generic" (a scalar) with args (dtype, data
 * of one element). Only bool, int, uint, float and complex dtypes occur. */
CKPTIO_API ckptio_status ckptio_value_object(const ckptio_value *value, const char **class_name,
                                             const ckptio_value **args, const ckptio_value **state);

/* ------------------------------------------------------------------------ */
/* torch.distributed.checkpoint data files                                  */
/* ------------------------------------------------------------------------ */
/* (docs/DCP.md)
 * A .distcp data file of torch.distributed.checkpoint (docs/FORMATS.md
 * section 4.3) holds items at offsets named by the checkpoint's .metadata:
 * raw byte items and torch.save archives of one tensor each (offsets inside
 * an archive count from its first byte, as torch.save into a stream writes
 * them), each optionally zstd-compressed (transform descriptor
 * "stream.zstd/1"). */

enum ckptio_dcp_item_flags {
    /* Store the item zstd-compressed (one frame with its content size).
     * The item's bytes must be in host memory. */
    CKPTIO_DCP_ITEM_ZSTD = 1u << 0,
    /* Archives: compute the CRC-32 of storages in host memory (torch.save
     * does); without it they get CRC 0, which torch.load accepts. */
    CKPTIO_DCP_ITEM_CRC32 = 1u << 1,
    /* Compute the XXH3-64 of the stored bytes (after compression). An
     * archive whose storage is in GPU memory cannot be hashed as one stream
     * (its bytes pass through the staging buffers in pieces and out of
     * order): it gets `parts` instead (see ckptio_dcp_part), hashed on the
     * pinned staging copies as the bytes go to the file, with no second pass
     * over the device. */
    CKPTIO_DCP_ITEM_HASH = 1u << 2
};

/* Block size of the parts of an item hashed in parts (GPU storages, large host storages). */
#define CKPTIO_DCP_PART_BYTES (4u << 20)

/* One hashed range of an item: XXH3-64 of the stored bytes
 * [item offset + offset, + length). The parts of an item tile its stored
 * bytes in order: each metadata piece of the archive (zip headers, pickle,
 * directory) is one part, a storage hashed in blocks is cut into
 * CKPTIO_DCP_PART_BYTES blocks counted from the storage's first byte. */
typedef struct ckptio_dcp_part {
    uint64_t offset;              /* from the item's first stored byte */
    uint64_t length;
    uint64_t hash;
} ckptio_dcp_part;

/* One item to write, and where it went. */
typedef struct ckptio_dcp_item {
    ckptio_file *file;            /* data file, opened with CKPTIO_OPEN_WRITE */
    ckptio_torch_writer *archive; /* a torch.save archive, or NULL for a byte item */
    const void *bytes;            /* byte item: its bytes (host memory) */
    uint64_t nbytes;
    unsigned flags;               /* ckptio_dcp_item_flags */
    /* Filled by ckptio_dcp_write(): */
    uint64_t offset;              /* first stored byte in the file */
    uint64_t length;              /* stored bytes (the compressed size with ZSTD) */
    uint64_t hash;                /* XXH3-64 of the stored bytes when hashed */
    int hashed;
    /* Instead of `hash`, for an archive with HASH (without ZSTD) whose
     * storage is in GPU memory, or whose host storages hold at least
     * 2 x CKPTIO_DCP_PART_BYTES: nparts hashed ranges (library memory, freed by
     * ckptio_dcp_items_release() or by the next ckptio_dcp_write() on the
     * same items). NULL / 0 otherwise. Zero-initialise items before the
     * first call. */
    ckptio_dcp_part *parts;
    size_t nparts;
} ckptio_dcp_item;

/* Items in host memory with fewer stored bytes than CKPTIO_DCP_PACK_BELOW
 * (tensor storages plus a byte item's bytes) are packed by ckptio_dcp_write():
 * aligned to CKPTIO_DCP_PACK_ALIGN instead of the options' alignment. */
#define CKPTIO_DCP_PACK_BELOW (64u << 10)
#define CKPTIO_DCP_PACK_ALIGN 64u

/*! ckptio_dcp_write() :
 * Writes the items, laid out per file in array order from offset 0, each
 * item starting at a multiple of the archives' storage alignment (gaps are
 * never read: the offsets go to .metadata). Archives use `options`
 * (NULL: storage alignment 4096, record prefix "archive"), so with the
 * default their tensor bytes sit at 4 KiB-aligned file offsets and move
 * with O_DIRECT. Small items in host memory (below CKPTIO_DCP_PACK_BELOW
 * bytes) start at, and align their storages to, CKPTIO_DCP_PACK_ALIGN
 * instead (torch's own alignment), so a state dict of small tensors takes
 * about the space torch's writer gives it. CRCs, compression and hashes run in parallel on the
 * engine's workers; then every item of every file goes out in ONE engine
 * plan (host or GPU memory, no extra copy). Each archive's storages must
 * be bound and stay valid until the call returns. Each file is truncated
 * to the end of its last item but not committed: the caller commits it
 * (ckptio_file_commit).
 * Parts are hashed by the plan's observer: blocks of a large host storage
 * by the worker that writes them, right after handing them to the kernel
 * (so hashing overlaps the other workers' writes), those of GPU items on
 * the staging copies; a block the staging could not hold whole (CKPTIO_OPT_STAGING_BYTES
 * below 4 x (CKPTIO_DCP_PART_BYTES + 4 KiB)) is hashed by reading it back
 * from the (uncommitted) file.
 * @return CKPTIO_OK with offset/length/hash (or parts) filled; on failure the error
 * names the item (its index and file). */
CKPTIO_API ckptio_status ckptio_dcp_write(ckptio_engine *engine, ckptio_dcp_item *items, size_t count,
                                          const ckptio_torch_save_options *options);

/*! ckptio_dcp_items_release() :
 * Frees the `parts` that ckptio_dcp_write() left in the items (sets them to
 * NULL / 0). Accepts NULL items with count 0. */
CKPTIO_API void ckptio_dcp_items_release(ckptio_dcp_item *items, size_t count);

/*! ckptio_zstd_decompressed_size_max() :
 * Total decompressed size of the zstd frames in (src, len), bounded for
 * untrusted input: frames without a recorded content size (streaming
 * writers such as python-zstandard's stream_writer) are decompressed once
 * to count; CKPTIO_E_FORMAT naming the offset of a corrupt frame, or
 * CKPTIO_E_FORMAT ("decompression
 * bomb") as soon as the frames' declared sizes sum to more than `limit`, or,
 * for frames without a declared size, as soon as counting passes `limit`
 * (time and scratch memory bounded by `limit`, nothing allocated for the
 * output). A frame that declares less than it holds is then refused by
 * ckptio_zstd_decompress() with a buffer of the returned size. */
CKPTIO_API ckptio_status ckptio_zstd_decompressed_size_max(const void *src, size_t len, uint64_t limit,
                                                           uint64_t *out);

/*! ckptio_zstd_decompress() :
 * Decompresses all zstd frames of (src, len) into dst (capacity bytes);
 * *out_len receives the bytes produced. CKPTIO_E_RANGE when dst is too
 * small, CKPTIO_E_FORMAT for corrupt input (message names the offset). */
CKPTIO_API ckptio_status ckptio_zstd_decompress(const void *src, size_t len, void *dst, size_t capacity,
                                                size_t *out_len);

/* Receives the decompressed output of ckptio_zstd_stream() piece by piece,
 * in order: `offset` is where data[0] lies in the whole output. A status
 * other than CKPTIO_OK stops the stream and is returned as it is. */
typedef ckptio_status (*ckptio_zstd_sink)(void *ctx, const void *data, size_t len, uint64_t offset);

/*! ckptio_zstd_stream() :
 * Decompresses all zstd frames of (src, len) through one fixed buffer of
 * 1 MiB, handing each piece to sink(ctx, ...) (sink may be NULL: only
 * count). Memory is that buffer plus libzstd's context (its window, which
 * libzstd bounds at 128 MiB), never the size the frames declare; time is
 * bounded by `limit`: once the output passes it, CKPTIO_E_FORMAT
 * ("decompression bomb") and nothing more is decompressed. A corrupt or
 * truncated frame, or one whose output differs from the size its header
 * declares, is CKPTIO_E_FORMAT naming the frame's offset in src and the
 * size it declares. *total (may be NULL) receives the bytes produced. */
CKPTIO_API ckptio_status ckptio_zstd_stream(const void *src, size_t len, uint64_t limit, ckptio_zstd_sink sink,
                                            void *ctx, uint64_t *total);

/* ------------------------------------------------------------------------ */
/* DCP stored items: one data file, one item                                */
/* ------------------------------------------------------------------------ */
/* (docs/DCP.md) What ckptio.dcp's FileSystemReader decodes itself, item by
 * item, where ckptio_dcp_read_tensor() (above) assembles whole tensors. */

/*! ckptio_dcp_file_open() :
 * Opens the data file `relative_path` (a _StorageInfo.relative_path) of the
 * checkpoint directory `dir` for reading. It must be a plain file name:
 * absolute paths, '/', "..", "." and empty names are CKPTIO_E_FORMAT naming
 * it (path traversal), before anything is opened. ckptio_dcp_open() applies
 * the same rule to every relative_path of .metadata. Close the file with
 * ckptio_file_close(); the engine must outlive it. */
CKPTIO_API ckptio_status ckptio_dcp_file_open(ckptio_engine *engine, const char *dir, const char *relative_path,
                                              ckptio_file **out);

/*! ckptio_dcp_file_open_listed() :
 * ckptio_dcp_file_open() of a data file in object storage whose `size` and
 * `etag` a listing of the checkpoint's prefix gave: no request at open (no
 * HEAD). Every read names `etag` in If-Match, as after a HEAD: an object
 * replaced since the listing fails with CKPTIO_E_STALE. A NULL or empty
 * `etag`, or a local directory: exactly ckptio_dcp_file_open(). */
CKPTIO_API ckptio_status ckptio_dcp_file_open_listed(ckptio_engine *engine, const char *dir, const char *relative_path,
                                                     uint64_t size, const char *etag, ckptio_file **out);

/* Dimensions a stored DCP tensor may have (torch allows 64 at most too). */
#define CKPTIO_DCP_MAX_NDIM 64

/*! ckptio_dcp_saved_by_ranks() :
 * 1 when `relative_paths` (a .metadata's data file names, NULL entries
 * skipped) name files of at least two ranks (__RANK_..., ranks told apart
 * by their digits), else 0. torch's save planner checks that every tensor's
 * chunks tile it only when several ranks plan a save together, so only then
 * may a reader demand the tiling (ckptio_dcp_check_chunks' `whole`); a
 * process saving alone may write just its own shard of a tensor. This is
 * the rule ckptio_dcp_check(), ckptio_dcp_verify() and ckptio.dcp's reader
 * share. */
CKPTIO_API int ckptio_dcp_saved_by_ranks(const char *const *relative_paths, size_t count);

/*! ckptio_dcp_check_chunks() :
 * Checks the chunks one tensor of a DCP .metadata was saved in, as
 * ckptio_dcp_open() and ckptio_dcp_check() check a directory's: each lies
 * inside the tensor and, with `whole`, together they tile it exactly, no gap
 * and no overlap (in O(chunks x ndim): dcp_tiling.c). torch's planner places
 * chunks by their offsets without such a check; ckptio.dcp's reader calls
 * this for every tensor of the metadata it loads, with `whole` for a
 * directory's .metadata whose data files are several ranks'
 * (ckptio_dcp_saved_by_ranks) and without for a rank's own __RANK.metadata
 * (a save without collectives: it holds that rank's chunks only) or one
 * process's save.
 * @param path names the file in errors (may be NULL); fqn the tensor.
 * @param shape ndim sizes (ndim <= CKPTIO_DCP_MAX_NDIM).
 * @param offsets, sizes nchunks x ndim values, chunk after chunk.
 * @return CKPTIO_OK; CKPTIO_E_FORMAT naming the tensor and the chunk outside
 *   it, two overlapping chunks, or the gap; CKPTIO_E_INVAL for a NULL fqn or
 *   arrays. */
CKPTIO_API ckptio_status ckptio_dcp_check_chunks(const char *path, const char *fqn, uint32_t ndim,
                                                 const int64_t *shape, size_t nchunks, const int64_t *offsets,
                                                 const int64_t *sizes, int whole);

/* The parsed header of a stored tensor item: a torch.save archive of one
 * tensor, or a SAFETENSORS blob holding the tensors of a data file. */
typedef struct ckptio_dcp_header ckptio_dcp_header;

/* Where a stored tensor's bytes are: element (i0, i1, ...) is at byte
 * storage_start + (storage_offset + sum(i_k * stride[k])) * element size,
 * inside [storage_start, + storage_nbytes). */
typedef struct ckptio_dcp_layout {
    ckptio_dtype dtype;
    uint32_t ndim;
    int64_t shape[CKPTIO_DCP_MAX_NDIM];
    int64_t stride[CKPTIO_DCP_MAX_NDIM];  /* in elements */
    uint64_t storage_offset;              /* in elements */
    uint64_t storage_start;               /* file offset (ckptio_dcp_header_read) or offset in the data
                                             (ckptio_dcp_header_parse) of the storage's first byte */
    uint64_t storage_nbytes;
} ckptio_dcp_layout;

/*! ckptio_dcp_header_read() :
 * Parses the header of the untransformed item at `offset` of a data file
 * (its _StorageInfo offset and length): a torch.save archive of one tensor
 * (told by ckptio_format_detect_bytes; only its zip records and pickle are
 * read) or else the SAFETENSORS blob starting there and running to the
 * end of the file (its length prefix and JSON header), read through the
 * file's engine. Keep a blob's header for its other tensors. Errors name
 * the file, the offset and `subject` (may be NULL): an archive that is not
 * inside the file (CKPTIO_E_TRUNCATED), that holds more than one tensor,
 * or bytes that are neither (CKPTIO_E_FORMAT). *bytes_read (may be NULL)
 * counts the header bytes read. Close with ckptio_dcp_header_close; the
 * file must stay open while the header is read, not after. */
CKPTIO_API ckptio_status ckptio_dcp_header_read(ckptio_file *file, uint64_t offset, uint64_t length,
                                                const char *subject, uint64_t *bytes_read, ckptio_dcp_header **out);

/*! ckptio_dcp_header_windows() :
 * ckptio_dcp_header_read() for an item whose edges the caller has read
 * already (so that the headers of many items in object storage come in
 * one engine plan, their GETs in flight together): `head` holds the item's
 * first head_len bytes (at least min(length, CKPTIO_FORMAT_PROBE_BYTES)),
 * `tail` its last tail_len bytes, `file_size` is the size of the data file
 * `path` (named in errors). The same checks and errors as
 * ckptio_dcp_header_read; CKPTIO_E_UNSUPPORTED, with no header, when the
 * item is no torch.save archive (a SAFETENSORS blob) or a record lies
 * between the windows: read that item with ckptio_dcp_header_read. The
 * header copies the windows; close it with ckptio_dcp_header_close. */
CKPTIO_API ckptio_status ckptio_dcp_header_windows(const char *path, uint64_t file_size, uint64_t offset,
                                                   uint64_t length, const void *head, size_t head_len,
                                                   const void *tail, size_t tail_len, const char *subject,
                                                   ckptio_dcp_header **out);

/*! ckptio_dcp_header_parse() :
 * The same for a decoded item held in memory (a zstd item after
 * decompression), which must be a torch.save archive of one tensor;
 * `origin` and `offset` (the stored item's file and offset) name it in
 * errors. The data must outlive the header. */
CKPTIO_API ckptio_status ckptio_dcp_header_parse(const void *data, size_t len, const char *origin, uint64_t offset,
                                                 const char *subject, ckptio_dcp_header **out);

/*! ckptio_dcp_header_zstd() :
 * The header of a zstd-transformed tensor item whose stored frames are
 * (src, len) in memory: a torch.save archive of one tensor, as
 * ckptio_dcp_header_parse() parses one. The frames are decompressed once,
 * through a fixed buffer: an archive of at most 64 MiB is kept in the header
 * (its storage is then read from memory); a larger one is not held at all,
 * only its first and last MiB, where torch.save puts every record but the
 * storage, and its storage is decompressed again when it is read
 * (ckptio_dcp_header_read_box). Memory is bounded whatever the frames or
 * .metadata declare; the output stops at `limit` bytes (CKPTIO_E_FORMAT,
 * "decompression bomb": pass the chunk's bytes plus
 * CKPTIO_DCP_ARCHIVE_OVERHEAD_MAX), and a decoded item that does not start as
 * an archive is refused on its first bytes. `origin`, `offset` and `subject`
 * name the stored item in errors. src must outlive the header. */
CKPTIO_API ckptio_status ckptio_dcp_header_zstd(const void *src, size_t len, uint64_t limit, const char *origin,
                                                uint64_t offset, const char *subject, ckptio_dcp_header **out);

/*! ckptio_dcp_header_read_box() :
 * Copies the box [offsets, offsets + sizes) of the stored tensor `fqn` (its
 * ckptio_dcp_header_layout) into host memory: element (i0, i1, ...) of the box
 * goes to dst + sum(i_k * dst_strides[k]) * element size, within `capacity`
 * bytes (else CKPTIO_E_RANGE). For headers from ckptio_dcp_header_parse() and
 * ckptio_dcp_header_zstd() (an untransformed item's bytes are in its file:
 * CKPTIO_E_INVAL). A large zstd item is decompressed once more through a fixed
 * buffer, so no memory besides dst is taken; its storage's strides must not
 * overlap (any layout torch.save writes), else CKPTIO_E_UNSUPPORTED. */
CKPTIO_API ckptio_status ckptio_dcp_header_read_box(const ckptio_dcp_header *header, const char *fqn,
                                                    const int64_t *offsets, const int64_t *sizes, void *dst,
                                                    const int64_t *dst_strides, uint64_t capacity);

/*! ckptio_dcp_header_layout() :
 * Where tensor `fqn` is stored (an archive's one tensor, whatever `fqn`;
 * a blob's tensor of that name, else CKPTIO_E_FORMAT). A blob's float4
 * tensor is described as torch holds it (pairs packed into one element). */
CKPTIO_API ckptio_status ckptio_dcp_header_layout(const ckptio_dcp_header *header, const char *fqn,
                                                  ckptio_dcp_layout *out);

/*! ckptio_dcp_header_count() : how many tensors the header describes (an
 * archive: 1; a blob: all of its data file's). */
CKPTIO_API ckptio_status ckptio_dcp_header_count(const ckptio_dcp_header *header, size_t *count);

/*! ckptio_dcp_header_close() : accepts NULL. */
CKPTIO_API ckptio_status ckptio_dcp_header_close(ckptio_dcp_header *header);

/* ------------------------------------------------------------------------ */
/* DCP directory commit                                                     */
/* ------------------------------------------------------------------------ */
/* (docs/DCP.md "Atomic commit and overwrite", "Concurrent saves")
 * The steps by which a save makes a new checkpoint of a DCP directory the
 * current one, so that a crash at any point leaves either the old
 * checkpoint loadable or the new one complete, and two saves into one
 * directory never remove each other's files. ckptio.dcp's
 * FileSystemWriter runs them between torch's hooks (a C program that
 * writes the pickled .metadata itself commits the same way):
 *   0. ckptio_dcp_lock_acquire(DIR, ...), before any data file is written;
 *   1. the data files, under names new to the save (__{rank}_{token}_{n}.distcp,
 *      one 12-hex-digit token per save), each created first with
 *      ckptio_dcp_create_file() and written as an atomic file
 *      (ckptio_file_open(CKPTIO_OPEN_WRITE), ckptio_dcp_write(), ckptio_file_commit());
 *   2.-4. ckptio_dcp_commit(): the manifest, .metadata (the new checkpoint
 *      is current from here on), the removal of what older saves left;
 *      then ckptio_dcp_lock_release().
 * `reference`, wherever it appears, is the name of the metadata file in
 * DIR the save replaces (".metadata", or "__{rank}.metadata" for saves
 * without collectives): new files take its permission bits and, where
 * permitted, its owner and group, from their creation on, so the
 * checkpoint's bytes are never readable more widely than before. It is
 * taken only when it is a regular file (lstat: a symlink is no reference);
 * NULL or missing: new files get 0666 & ~umask.
 * Failed system calls read "PATH: OPERATION: strerror (what was being done;
 * what the failure leaves: 'NAME is unchanged', 'the new checkpoint is
 * committed', ...)", with the errno's status (CKPTIO_E_NOSPC, CKPTIO_E_IO,
 * ...). All functions are thread-safe (they share no state but the lock
 * list kept for fork()). */

/* The lock file of a checkpoint directory (empty, never removed). */
#define CKPTIO_DCP_LOCK_NAME ".ckptio-dcp.lock"
/* The turn file of CKPTIO_DCP_LOCK_QUEUED acquisitions (empty, never removed). */
#define CKPTIO_DCP_LOCK_QUEUE_NAME ".ckptio-dcp.queue"

enum ckptio_dcp_commit_flags {
    CKPTIO_DCP_SYNC = 1u << 0,        /* fsync files before their rename, and the directory after it */
    CKPTIO_DCP_RECHECK = 1u << 1,     /* ckptio_dcp_remove_files: read the metadata files again first */
    CKPTIO_DCP_LOCK_SHARED = 1u << 2, /* ckptio_dcp_lock_acquire: shared (a save that removes nothing) */
    CKPTIO_DCP_LOCK_QUEUED = 1u << 3, /* ckptio_dcp_lock_acquire: wait in turn (a holder asking again waits) */
    CKPTIO_DCP_MANIFEST = 1u << 4,    /* ckptio_dcp_commit: write the checksum manifest (step 2) */
    CKPTIO_DCP_CLEANUP = 1u << 5,     /* ckptio_dcp_commit: list and remove the files of older saves (step 4) */
    CKPTIO_DCP_CLEANUP_LATER = 1u << 6, /* ckptio_dcp_commit: list them only, for a removal later (result.stale) */
    CKPTIO_DCP_LOCK_CONFIRM_LATER = 1u << 7 /* ckptio_dcp_lock_acquire: a lease read back by the first check */
};

/*! ckptio_temporary_create() :
 * Creates and opens (O_RDWR) a temporary for the file `name` of `dir`,
 * named and flock()ed as this library's atomic saves name and lock theirs
 * (".NAME.ckptio-tmp-XXXXXX"): ckptio_cleanup_temporaries() and
 * ckptio_dcp_remove_files() never remove it while *fd is open, and remove
 * it once it is closed uncommitted (the kernel drops the flock with the
 * descriptor, also on SIGKILL). Created with the reference's attributes.
 * Writes its path into path[0..cap). The caller writes, renames it over
 * the final name or unlinks it, and closes *fd. */
CKPTIO_API ckptio_status ckptio_temporary_create(const char *dir, const char *name, const char *reference, int *fd,
                                                 char *path, size_t cap);

/*! ckptio_dcp_reference() :
 * *mode = the permission bits new files of a save into `dir` take: those
 * of the regular file `name` in it; CKPTIO_E_NOT_FOUND (and *mode = 0666)
 * when there is none (a missing name, a symlink, a directory). */
CKPTIO_API ckptio_status ckptio_dcp_reference(const char *dir, const char *name, unsigned *mode);

/*! ckptio_dcp_create_file() :
 * Before the atomic save of a data file NAME new to this save: creates
 * DIR/NAME empty (O_EXCL) with the reference's attributes, so that the
 * save's temporary takes them (an atomic save gives its temporary the mode
 * and owner of the file it replaces). A crash leaves an empty,
 * unreferenced data file that the next save removes. Without a reference
 * (a new checkpoint) nothing is created. */
CKPTIO_API ckptio_status ckptio_dcp_create_file(const char *dir, const char *name, const char *reference);

/* One item of the manifest: the stored bytes [data_offset, + nbytes) of
 * `file` that .metadata names for tensor chunk `offset` (or byte item:
 * offset NULL) of `fqn`, with their XXH3-64 (`hashed`) or per-part hashes
 * (`parts`, which tile the range in order; see ckptio_dcp_part), or
 * neither (counted as unhashed by ckptio_dcp_verify). ckptio_dcp_commit()
 * writes them to DIR/.ckptio-manifest-TOKEN.json (docs/DCP.md "Manifest and
 * verify"). */
typedef struct ckptio_dcp_manifest_item {
    const char *fqn;
    const int64_t *offset;        /* chunk offsets (ndim values); NULL for a byte item */
    uint32_t ndim;
    const char *file;             /* relative_path of its data file */
    uint64_t data_offset;
    uint64_t nbytes;
    int hashed;
    uint64_t hash;
    const ckptio_dcp_part *parts;
    size_t nparts;
    unsigned transforms;          /* ckptio_dcp_transform flags of the stored item */
} ckptio_dcp_manifest_item;

/* What a save just committed: its metadata file's name and bytes and the
 * data files they reference. Lets step 4 recognise that file unread (it
 * may hold classes the restricted unpickler refuses, e.g. a custom
 * planner's planner_data) when it is still this save's. */
typedef struct ckptio_dcp_committed {
    const char *metadata_name;
    const void *metadata;
    size_t metadata_len;
    const char *const *files;
    size_t nfiles;
} ckptio_dcp_committed;

/*! ckptio_dcp_stale_files() :
 * Step 4's list, taken now: files of older saves in `dir` that a later
 * save may remove: names a DCP writer gives (data files, manifests,
 * .metadata.tmp, temporaries) that are not in keep[0..nkeep) and that no
 * metadata file in the directory references now (.metadata and every
 * __{rank}.metadata, read with the restricted unpickler; `committed`, may
 * be NULL, spares re-reading the one just written). When one cannot be
 * read (a symlink, FIFO, garbage, a pickle outside the allowlist), it
 * might reference any file: only temporaries are listed and note[0..cap)
 * says why (else it is ""). Only regular files are listed (lstat): a
 * symlink, directory or FIFO under such a name is left alone and the note
 * names it. *names (sorted, *count of them) is freed with
 * ckptio_dcp_names_free. An I/O error fails; nothing is removed here. */
CKPTIO_API ckptio_status ckptio_dcp_stale_files(const char *dir, const char *const *keep, size_t nkeep,
                                                const ckptio_dcp_committed *committed, char ***names, size_t *count,
                                                char *note, size_t note_cap);

/*! ckptio_dcp_names_free() : frees a list ckptio_dcp_stale_files() made;
 * accepts NULL. */
CKPTIO_API void ckptio_dcp_names_free(char **names, size_t count);

/*! ckptio_dcp_remove_files() :
 * Unlinks DIR/NAME for each name (a temporary only when no live writer
 * holds it), then with CKPTIO_DCP_SYNC (when something was removed) fsyncs
 * the directory so that a power loss cannot bring them back. With
 * CKPTIO_DCP_RECHECK (a list taken earlier, e.g. removed in the
 * background after the lock was released) the metadata files are read
 * again first and whatever they reference now is kept (a writer that
 * reuses names and takes no lock, such as torch's); `note` as in
 * ckptio_dcp_stale_files. A failed unlink does not stop the others: the
 * first is returned after the directory fsync (whose own failure comes
 * first). Only a regular file is unlinked (checked with lstat): anything
 * else under a name is left where it is and named in `note`, not an error.
 * *removed (may be NULL) counts the files removed. */
CKPTIO_API ckptio_status ckptio_dcp_remove_files(const char *dir, const char *const *names, size_t count,
                                                 unsigned flags, const ckptio_dcp_committed *committed,
                                                 size_t *removed, char *note, size_t note_cap);

/* The steps of ckptio_dcp_commit(), in the order it runs them. */
typedef enum ckptio_dcp_commit_step {
    CKPTIO_DCP_STEP_MANIFEST = 0, /* DIR/.ckptio-manifest-TOKEN.json written atomically (step 2) */
    CKPTIO_DCP_STEP_METADATA = 1, /* DIR/METADATA_NAME replaced atomically: the new checkpoint is current */
    CKPTIO_DCP_STEP_LIST = 2,     /* the files of older saves listed (step 4) */
    CKPTIO_DCP_STEP_REMOVE = 3    /* and removed, the directory fsynced */
} ckptio_dcp_commit_step;

/* Called by ckptio_dcp_commit() before each step it runs (done = 0) and
 * after the step succeeded (done = 1), with the file the step writes (the
 * directory for LIST and REMOVE). A non-zero return stops the commit right
 * there: it fails with CKPTIO_E_CANCELED saying which step it stopped at
 * and what that leaves (the old checkpoint before METADATA is done, the new
 * one after). For progress reports, and for tests that stop or kill a save
 * between two steps. */
typedef int (*ckptio_dcp_commit_fn)(void *user, ckptio_dcp_commit_step step, const char *path, int done);

/* What ckptio_dcp_commit() commits. */
typedef struct ckptio_dcp_commit_options {
    const char *metadata_name;    /* ".metadata", or "__{rank}.metadata" for a save without collectives */
    const void *metadata;         /* the pickled Metadata */
    size_t metadata_len;
    const char *const *files;     /* every data file it references (relative_path), committed already */
    size_t nfiles;
    const ckptio_dcp_manifest_item *items; /* with CKPTIO_DCP_MANIFEST: the manifest's items */
    size_t nitems;
    unsigned flags;               /* CKPTIO_DCP_SYNC, _MANIFEST, _CLEANUP or _CLEANUP_LATER */
    ckptio_dcp_commit_fn on_step; /* may be NULL */
    void *user;
    /* This process's data files of `files` (in DIR), renamed but not fsynced (ckptio_file_commit_unreferenced with
     * CKPTIO_COMMIT_SYNC_LATER, else CKPTIO_E_INVAL): with CKPTIO_DCP_SYNC the commit fsyncs them and DIR
     * together with the manifest's and METADATA_NAME's temporaries, before either is renamed (one round of
     * fsyncs where fsyncing them before costs one more). Objects handed over so are completed by the commit,
     * while the manifest's PUT runs, before METADATA_NAME is written; one that fails fails the commit (the
     * checkpoint unchanged). NULL (0): every file is durable already. The caller closes them after the call. */
    ckptio_file *const *data_files;
    size_t ndata_files;
} ckptio_dcp_commit_options;

/* What ckptio_dcp_commit() did; filled also when it failed. */
typedef struct ckptio_dcp_commit_result {
    int committed;                /* 1 once METADATA is done: the new checkpoint is current */
    char **stale;                 /* CKPTIO_DCP_CLEANUP_LATER: the files of older saves (sorted), to remove later
                                   * with ckptio_dcp_remove_files(CKPTIO_DCP_RECHECK); free with
                                   * ckptio_dcp_names_free. NULL otherwise. */
    size_t nstale;
    size_t removed;               /* CKPTIO_DCP_CLEANUP: the files removed */
    char note[2048];              /* "" or why files of older saves were kept (a metadata file that cannot be
                                   * read: see ckptio_dcp_stale_files); worth a warning */
} ckptio_dcp_commit_result;

/*! ckptio_dcp_commit() :
 * Steps 2 to 4 of a save into DIR, in order, in one call, once every data
 * file of `files` is committed (step 1) and while the caller holds DIR's
 * lock (step 0, released by the caller after this returns, whatever it
 * returns):
 *  - with CKPTIO_DCP_MANIFEST and files named by one ckptio save
 *    (__{rank}_{token}_{n}.distcp; other names: no manifest), the checksum
 *    manifest of `items` (as ckptio_dcp_verify() reads it), atomically;
 *  - METADATA_NAME (".metadata" or "__{rank}.metadata", else
 *    CKPTIO_E_INVAL) replaced by `metadata`, atomically: from here on the
 *    new checkpoint is the current one (result->committed = 1);
 *  - with CKPTIO_DCP_CLEANUP (only a collective save's coordinator knows
 *    every file of the checkpoint), ckptio_dcp_stale_files() keeping
 *    `files`, METADATA_NAME and the manifest, then
 *    ckptio_dcp_remove_files() of that list; with CKPTIO_DCP_CLEANUP_LATER
 *    the list only, handed back in result->stale.
 * New files take the attributes of the METADATA_NAME they replace (see
 * "reference" above); the fsyncs run with CKPTIO_DCP_SYNC. The first
 * failure ends the commit and is returned, with the error message of the
 * step ("... is unchanged" before .metadata is replaced, "... committed"
 * after). `on_step` is called around every step (ckptio_dcp_commit_fn).
 * Thread-safe. */
CKPTIO_API ckptio_status ckptio_dcp_commit(const char *dir, const ckptio_dcp_commit_options *options,
                                           ckptio_dcp_commit_result *result);

typedef struct ckptio_dcp_lock ckptio_dcp_lock;

/* What a lock holds. */
typedef struct ckptio_dcp_lock_info {
    int locked;          /* 1: flock held; 0: the file system cannot lock (sys_errno says why): saves into
                            this directory are not serialized and the caller should say so */
    int sys_errno;
    uint64_t device;     /* st_dev / st_ino of the lock file */
    uint64_t inode;
} ckptio_dcp_lock_info;

/*! ckptio_dcp_lock_wait_fn : called by ckptio_dcp_lock_acquire() each time
 * the lock is found held by another save, with the seconds waited so far,
 * before it waits again (at most 50 ms later). A non-zero return ends the
 * wait with CKPTIO_E_CANCELED. */
typedef int (*ckptio_dcp_lock_wait_fn)(double waited_seconds, void *user);

/*! ckptio_dcp_lock_acquire() :
 * Step 0: flock(LOCK_EX, or LOCK_SH with CKPTIO_DCP_LOCK_SHARED) on
 * DIR/CKPTIO_DCP_LOCK_NAME, created empty with the reference's attributes.
 * While another save holds it: timeout_seconds < 0 waits for it, 0 fails
 * at once, more waits at most that long; then CKPTIO_E_BUSY ("DIR: another
 * save holds the directory (lock .ckptio-dcp.lock, held by pid N) [after
 * waiting S s]: this save wrote nothing and the checkpoint is unchanged;
 * ..."; the pids from /proc/locks, local holders only). `on_wait` (may be
 * NULL) runs at each busy check. With CKPTIO_DCP_LOCK_QUEUED the
 * acquisition first takes the turn, an exclusive flock on
 * DIR/CKPTIO_DCP_LOCK_QUEUE_NAME held while it waits and released once it
 * has the lock: a holder that releases and asks again at once (a
 * checkpoint manager saving in a loop) then waits behind a waiter, so two
 * contenders alternate (flock alone is not fair); the timeout covers both.
 * A file system without flock: CKPTIO_OK
 * with a lock whose info says locked = 0. A child fork()ed while the lock
 * is held closes its copy of the descriptor at once (without unlocking), so
 * the lock ends with the save that took it. Release with
 * ckptio_dcp_lock_release (also in a child: then it only frees). */
CKPTIO_API ckptio_status ckptio_dcp_lock_acquire(const char *dir, const char *reference, unsigned flags,
                                                 double timeout_seconds, ckptio_dcp_lock_wait_fn on_wait, void *user,
                                                 ckptio_dcp_lock **out);

/*! ckptio_dcp_lock_query() : what `lock` holds. */
CKPTIO_API ckptio_status ckptio_dcp_lock_query(const ckptio_dcp_lock *lock, ckptio_dcp_lock_info *out);

/*! ckptio_dcp_lock_check() :
 * CKPTIO_OK while `lock` still holds its directory. A flock is held until
 * released (always CKPTIO_OK). A directory in object storage
 * ("s3://BUCKET/PREFIX") has no flock: ckptio_dcp_lock_acquire() takes a
 * lease there instead, the object PREFIX/.ckptio-dcp.lock that a thread
 * renews while it is held (lapsing CKPTIO_OPT_S3_LEASE_MS after its last
 * renewal), created with If-None-Match where the server has conditional
 * writes and else written and read back (docs/OBJECT_STORAGE.md). This
 * reads it again: CKPTIO_E_BUSY once another save took it over or it
 * lapsed; a save calls it right before its .metadata and before removing
 * older saves' files, and stops when it fails. A shared acquisition on an
 * object store waits until no exclusive lease is held, then writes the
 * save's mark PREFIX/.ckptio-dcp-shared-OWNER, renewed the same way, which
 * an exclusive save's cleanup honours (it keeps every object written since
 * a live mark was taken); the check then reads the mark. A lease or mark
 * is never written again once it may have lapsed (gone, another's, or not
 * renewed in time): the check fails from then on.
 * CKPTIO_DCP_LOCK_QUEUED has no turn there. With
 * CKPTIO_DCP_LOCK_CONFIRM_LATER, a lease written on a server without
 * conditional writes is not read back before ckptio_dcp_lock_acquire()
 * returns: the first check is the read-back (it waits out the rest of the
 * settling time, 0.1 s after the write), so the save writes its data
 * meanwhile. Only for a save whose objects carry names no other save
 * writes (the per-save token) and that checks before its .metadata: a save
 * whose check then finds another's lease fails CKPTIO_E_BUSY having
 * committed nothing, whatever its wait option was, and removes or leaves
 * unreferenced what it wrote (docs/OBJECT_STORAGE.md 4.2). */
CKPTIO_API ckptio_status ckptio_dcp_lock_check(ckptio_dcp_lock *lock);

/*! ckptio_dcp_lock_release() : unlocks (LOCK_UN) and closes (a lease: stops
 * renewing it and deletes it when it is still this holder's; a mark: deletes
 * it); accepts NULL. */
CKPTIO_API ckptio_status ckptio_dcp_lock_release(ckptio_dcp_lock *lock);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_DCP_H */
