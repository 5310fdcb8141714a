/*
 * ckptio_experimental.h - the rest of libckptio's API: what the ckptio Python
 * package is built on beyond ckptio.h (the ckptio command needs only ckptio.h).
 *
 * ckptio.h is the stable API for users. The functions here are exported and
 * documented like those, follow the same conventions (ckptio.h's first
 * comment) and are tested as thoroughly, but they are building blocks of
 * ckptio's own front end, shaped by what it needs: they may change or go
 * in any minor version, without the deprecation ckptio.h's functions get.
 * What is here:
 *  - the pieces of torch.distributed.checkpoint support that need a Python
 *    pickler around them: the .metadata unpickler's object tree, the data
 *    file writer (ckptio_dcp_write), the decoding of single stored items
 *    (ckptio_dcp_header_*, zstd), and the directory commit protocol (locks,
 *    temporaries, manifests, removal of stale files) that ckptio.dcp's
 *    FileSystemWriter runs step by step. Reading a whole DCP directory from
 *    C (ckptio_dcp_open, ckptio_dcp_read_tensor, ...) is in ckptio.h;
 *  - ckptio_inherit_mode, for writers that commit files of their own;
 *  - snapshot pools (ckptio_snapshot_*): copies of training state into
 *    reused pinned memory on ckptio's own streams, for the async saves of
 *    ckptio.dcp and ckptio.CheckpointManager;
 *  - objects in S3-compatible storage: listing, deleting, small
 *    conditional writes and the cleanup of unfinished uploads, for the
 *    code that keeps checkpoint directories there.
 * docs/API.md says which header holds what and why.
 */
#ifndef CKPTIO_EXPERIMENTAL_H
#define CKPTIO_EXPERIMENTAL_H

#include "ckptio.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Files written by the caller                                              */
/* ------------------------------------------------------------------------ */

/*! ckptio_inherit_mode() :
 * For writers that replace `path` by renaming a file of their own over it
 * (ckptio_file_commit does this itself): if `path` names a regular file
 * (symlinks followed), gives the open file `fd` its permission bits (0777
 * only: no set-id or sticky bits) and, where the kernel permits (root, or
 * a group the caller belongs to), its owner and group; EPERM there is not
 * an error. Call it before the fsync and the rename. A missing `path` (a
 * new file) leaves fd as created (0666 & ~umask). @return CKPTIO_OK; an
 * fstat/fchown I/O error; or, when the mode cannot be set and fd would be
 * accessible to more than `path` was, the fchmod error. Thread-safe. */
CKPTIO_API ckptio_status ckptio_inherit_mode(int fd, const char *path);

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

/* Block size of the parts of an item hashed from GPU memory. */
#define CKPTIO_DCP_PART_BYTES (4u << 20)

/* One hashed range of an item: XXH3-64 of the stored bytes
 * [item offset + offset, + length). The parts of an item tile its stored
 * bytes in order: each host piece of the archive (zip headers, pickle,
 * directory) is one part, a GPU storage is cut into CKPTIO_DCP_PART_BYTES
 * blocks counted from the storage's first byte. */
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
    /* Instead of `hash`, for an archive with HASH whose storage is in GPU
     * memory: nparts hashed ranges (library memory, freed by
     * ckptio_dcp_items_release() or by the next ckptio_dcp_write() on the
     * same items). NULL / 0 otherwise. Zero-initialise items before the
     * first call. */
    ckptio_dcp_part *parts;
    size_t nparts;
} ckptio_dcp_item;

/*! ckptio_dcp_write() :
 * Writes the items, laid out per file in array order from offset 0, each
 * item starting at a multiple of the archives' storage alignment (gaps are
 * never read: the offsets go to .metadata). Archives use `options`
 * (NULL: storage alignment 4096, record prefix "archive"), so with the
 * default their tensor bytes sit at 4 KiB-aligned file offsets and move
 * with O_DIRECT. CRCs, compression and hashes run in parallel on the
 * engine's workers; then every item of every file goes out in ONE engine
 * plan (host or GPU memory, no extra copy). Each archive's storages must
 * be bound and stay valid until the call returns. Each file is truncated
 * to the end of its last item but not committed: the caller commits it
 * (ckptio_file_commit).
 * Parts of GPU items are hashed by the plan's observer on the staging
 * copies; a block the staging could not hold whole (CKPTIO_OPT_STAGING_BYTES
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

/*! ckptio_zstd_decompressed_size() :
 * Total decompressed size of the zstd frames in (src, len). Frames without
 * a recorded content size (streaming writers such as python-zstandard's
 * stream_writer) are decompressed once to count. @return CKPTIO_E_FORMAT
 * naming the offset of a corrupt frame. */
CKPTIO_API ckptio_status ckptio_zstd_decompressed_size(const void *src, size_t len, uint64_t *out);

/*! ckptio_zstd_decompressed_size_max() :
 * The same, bounded for untrusted input: CKPTIO_E_FORMAT ("decompression
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
 * item, where ckptio_dcp_read_tensor() (ckptio.h) assembles whole tensors. */

/*! ckptio_dcp_file_open() :
 * Opens the data file `relative_path` (a _StorageInfo.relative_path) of the
 * checkpoint directory `dir` for reading. It must be a plain file name:
 * absolute paths, '/', "..", "." and empty names are CKPTIO_E_FORMAT naming
 * it (path traversal), before anything is opened. ckptio_dcp_open() applies
 * the same rule to every relative_path of .metadata. Close the file with
 * ckptio_file_close(); the engine must outlive it. */
CKPTIO_API ckptio_status ckptio_dcp_file_open(ckptio_engine *engine, const char *dir, const char *relative_path,
                                              ckptio_file **out);

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
 * FileSystemWriter runs exactly these (a C program that writes the pickled
 * .metadata itself would commit the same way):
 *   0. ckptio_dcp_lock_acquire(DIR, ...), before any data file is written;
 *   1. the data files, under names new to the save (__{rank}_{token}_{n}.distcp,
 *      one 12-hex-digit token per save), each created first with
 *      ckptio_dcp_create_file() and written as an atomic file
 *      (ckptio_file_open(CKPTIO_OPEN_WRITE), ckptio_dcp_write(), ckptio_file_commit());
 *   2. ckptio_dcp_manifest_write() (optional: checksums for ckptio_dcp_verify);
 *   3. ckptio_dcp_write_file(DIR, ".metadata", pickled Metadata, ...): the
 *      new checkpoint is current from here on;
 *   4. ckptio_dcp_stale_files() then ckptio_dcp_remove_files(); then
 *      ckptio_dcp_lock_release().
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
    CKPTIO_DCP_LOCK_QUEUED = 1u << 3  /* ckptio_dcp_lock_acquire: wait in turn (a holder asking again waits) */
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

/*! ckptio_dcp_save_token() :
 * The token (12 hex digits and NUL) shared by `files`, the data file names
 * of one ckptio save (__{rank}_{token}_{n}.distcp); CKPTIO_E_NOT_FOUND
 * when they are not (another writer's names, two tokens, none). */
CKPTIO_API ckptio_status ckptio_dcp_save_token(const char *const *files, size_t count, char token[13]);

/*! ckptio_dcp_write_file() :
 * Writes `len` bytes as DIR/NAME atomically: a temporary
 * (ckptio_temporary_create), write (short writes resumed), fsync, rename
 * over NAME, fsync of the directory (the fsyncs with CKPTIO_DCP_SYNC). A
 * failure before the rename leaves NAME as it was and removes the
 * temporary; a failed directory fsync after it says that the new NAME is
 * in place but may not survive a power loss. */
CKPTIO_API ckptio_status ckptio_dcp_write_file(const char *dir, const char *name, const void *data, size_t len,
                                               const char *reference, unsigned flags);

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
 * neither (counted as unhashed by ckptio_dcp_verify). */
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

/*! ckptio_dcp_manifest_write() :
 * Step 2: writes DIR/.ckptio-manifest-TOKEN.json (TOKEN from `files`, the
 * save's data files, which must be named as ckptio_dcp_save_token expects:
 * else CKPTIO_E_INVAL) as ckptio_dcp_write_file() writes a file. It lists
 * `files` and the items; `metadata_name` is the metadata file it belongs
 * to. ckptio_dcp_verify() checks a directory against it. */
CKPTIO_API ckptio_status ckptio_dcp_manifest_write(const char *dir, const char *metadata_name,
                                                   const char *const *files, size_t nfiles,
                                                   const ckptio_dcp_manifest_item *items, size_t count,
                                                   const char *reference, unsigned flags);

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
 * says why (else it is ""). *names (sorted, *count of them) is freed with
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
 * first). *removed (may be NULL) counts the files removed. */
CKPTIO_API ckptio_status ckptio_dcp_remove_files(const char *dir, const char *const *names, size_t count,
                                                 unsigned flags, const ckptio_dcp_committed *committed,
                                                 size_t *removed, char *note, size_t note_cap);

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

/*! ckptio_dcp_lock_release() : unlocks (LOCK_UN) and closes; accepts NULL. */
CKPTIO_API ckptio_status ckptio_dcp_lock_release(ckptio_dcp_lock *lock);

/* ------------------------------------------------------------------------ */
/* Snapshots of training state that overlap compute                        */
/* ------------------------------------------------------------------------ */
/* (docs/SNAPSHOTS.md)
 * A snapshot pool is one block of page-locked host memory, sized once,
 * pinned on a background thread and reused, holding one snapshot at a
 * time: copies of tensors (GPU or host memory) at pool offsets the caller
 * chooses. Device-to-host copies run on ckptio's own copy stream per
 * device, never on the caller's, ordered after the work the caller's stream
 * had queued when the snapshot was taken (an event), so that compute that
 * only reads the tensors (a forward and backward pass) runs beside them;
 * whoever is about to change the tensors makes its stream wait for the
 * copies first, on the device (ckptio_snapshot_before_update). */

typedef struct ckptio_snapshot_pool ckptio_snapshot_pool;

/* One tensor's bytes to copy: [src, src + nbytes) to the pool at `offset`. */
typedef struct ckptio_snapshot_copy {
    const void *src;      /* device memory of `device`, or host memory (device -1) */
    uint64_t offset;      /* where they go in the pool */
    uint64_t nbytes;
    int device;           /* CUDA device ordinal of src, or -1: host memory, copied during the call */
    unsigned flags;       /* CKPTIO_SNAPSHOT_EARLY or 0 */
} ckptio_snapshot_copy;

/* Copied before the device's other copies, and the caller's stream waits
 * for these at once (on the device): for tensors that work the caller
 * queues next may change (buffers a forward pass updates), which no
 * ckptio_snapshot_before_update guards. */
#define CKPTIO_SNAPSHOT_EARLY 1u

/* The caller's stream on `device` (a CUstream as an integer; 0 is the
 * legacy default stream): the snapshot holds the values the work queued
 * on it so far leaves. */
typedef struct ckptio_snapshot_stream {
    int device;
    uintptr_t stream;
} ckptio_snapshot_stream;

typedef struct ckptio_snapshot_pool_info {
    void *base;            /* the pool's first byte; valid until the pool is destroyed */
    uint64_t bytes;        /* its size: the bytes asked for, rounded up to whole pieces */
    uint64_t ready_bytes;  /* bytes from base pinned so far (host pool: faulted in) */
    uint64_t piece_bytes;  /* pinned one registration at a time, in address order */
    int device;            /* the device whose context pins it, or -1 for a host pool */
    int pinned;            /* 1: page-locked for CUDA; 0: plain host memory */
    int held;              /* 1 while a snapshot is taken and not released */
} ckptio_snapshot_pool_info;

/*! ckptio_snapshot_pool_create() :
 * Reserves `bytes` of host memory (rounded up to whole 64 MiB pieces; a
 * pool under 64 MiB is one piece of whole 2 MiB pages) and
 * returns at once; a background thread faults the pieces in and page-locks
 * them for CUDA (portable, device-mapped) in the primary context of
 * `device`, in address order. `device` -1 makes a host pool: plain memory,
 * for host tensors, no driver needed. Transparent huge pages are asked for
 * wherever the kernel gives them, unless `engine`'s CKPTIO_OPT_GPU_HUGE_SLOTS
 * says off (`engine` may be NULL: the defaults; docs/SNAPSHOTS.md). The memory is held until
 * ckptio_snapshot_pool_destroy(). @return CKPTIO_E_NO_CUDA without a driver
 * (device >= 0), CKPTIO_E_INVAL for 0 bytes, CKPTIO_E_NOMEM when the
 * address space or the thread cannot be had. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_create(const ckptio_engine *engine, uint64_t bytes, int device,
                                                     ckptio_snapshot_pool **out);

/*! ckptio_snapshot_pool_query() : size, base, how much is pinned, whether a
 * snapshot is held. Thread-safe. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_query(ckptio_snapshot_pool *pool, ckptio_snapshot_pool_info *out);

/*! ckptio_snapshot_pool_wait_ready() :
 * Blocks until the pool's first `bytes` are pinned (all of it: its size).
 * If pinning failed before that (the driver refused to page-lock memory),
 * fails with that error, naming the piece, every time it is asked.
 * CKPTIO_E_RANGE for more bytes than the pool has. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_wait_ready(ckptio_snapshot_pool *pool, uint64_t bytes);

/*! ckptio_snapshot_take() :
 * Takes a snapshot: for each device with copies, records an event on that
 * device's stream in `streams` (which must name every device in
 * `copies`), makes the pool's copy stream for the device wait for it, queues
 * the device's EARLY copies, makes the caller's stream wait for them, then
 * queues the others; copies of host memory are made during the call, after
 * the device copies are queued. Copies are cut where the pool's pieces
 * meet. Returns once everything is queued: the caller's stream goes on at
 * once (after the EARLY copies), the rest run beside it. Waits first for
 * the pool's memory up to the last byte written to be pinned (normally done
 * long before). CKPTIO_E_BUSY while the pool holds a snapshot not
 * released; CKPTIO_E_RANGE for a copy past the pool's end; CKPTIO_E_INVAL for
 * device memory without a stream for its device, or into a host pool. On a
 * failure no copy is left running into the pool and none is held. */
CKPTIO_API ckptio_status ckptio_snapshot_take(ckptio_snapshot_pool *pool, const ckptio_snapshot_copy *copies,
                                              size_t count, const ckptio_snapshot_stream *streams, size_t nstreams);

/*! ckptio_snapshot_before_update() :
 * Call before queueing work on `stream` (of `device`) that changes tensors
 * the held snapshot copies: the stream waits, on the device, for the end of
 * the snapshot's copies from that device (cuStreamWaitEvent); the caller
 * does not block. Nothing to do (CKPTIO_OK) when no snapshot is held, it
 * copies nothing from `device`, or those copies are known complete.
 * Thread-safe. */
CKPTIO_API ckptio_status ckptio_snapshot_before_update(ckptio_snapshot_pool *pool, int device, uintptr_t stream);

/*! ckptio_snapshot_copied() : 1 when the held snapshot's copies have all
 * completed (or none is held), 0 while some still run; never blocks. */
CKPTIO_API int ckptio_snapshot_copied(ckptio_snapshot_pool *pool);

/*! ckptio_snapshot_wait() :
 * Blocks until the held snapshot's copies have completed: then its bytes in
 * the pool are the tensors' values at the point of the take. Reports a copy
 * that failed on the device (CKPTIO_E_CUDA with the driver's error). */
CKPTIO_API ckptio_status ckptio_snapshot_wait(ckptio_snapshot_pool *pool);

/*! ckptio_snapshot_release() :
 * Ends the held snapshot (waiting for its copies first, and reporting
 * their failure as ckptio_snapshot_wait does): the pool takes the next one.
 * The caller is done reading it. CKPTIO_OK when none is held. */
CKPTIO_API ckptio_status ckptio_snapshot_release(ckptio_snapshot_pool *pool);

/*! ckptio_snapshot_pool_destroy() :
 * Releases the held snapshot (waiting for its copies), stops the pinning,
 * destroys the copy streams and events, unpins (which synchronises the
 * device) and frees the memory. Accepts NULL. @return the release's status. */
CKPTIO_API ckptio_status ckptio_snapshot_pool_destroy(ckptio_snapshot_pool *pool);

/* ------------------------------------------------------------------------ */
/* Objects in S3-compatible storage (s3://BUCKET/KEY)                       */
/* ------------------------------------------------------------------------ */

/* ckptio_file_open() takes "s3://BUCKET/KEY" wherever it takes a path: the
 * engine reads such a file with ranged GETs and writes it as a multipart
 * upload that appears at ckptio_file_commit(), whole or not at all
 * (docs/OBJECT_STORAGE.md: endpoint, credentials, commit protocol,
 * settings). The functions here are what directory-level code (DCP
 * checkpoints, checkpoint steps, cleaners) needs beyond single objects.
 * Endpoint, region and credentials come from the AWS environment variables
 * and files; retries, timeouts and concurrency from `engine`'s
 * CKPTIO_OPT_S3_* settings. Errors name the operation, s3://BUCKET/KEY, the
 * HTTP status and the server's Code and Message, and never a credential. */

/*! ckptio_path_is_object() : 1 when `path` is an s3:// URL, else 0. */
CKPTIO_API int ckptio_path_is_object(const char *path);

/* One entry of a listing. The strings are valid during the callback only. */
typedef struct ckptio_object_info {
    const char *key;       /* the whole key (not only the part after the prefix) */
    uint64_t size;         /* bytes; 0 for a common prefix or an upload */
    const char *etag;      /* as the server sent it (quoted), "" for a prefix */
    const char *time;      /* LastModified, or an upload's Initiated (ISO 8601), or "" */
    const char *upload_id; /* an unfinished multipart upload's id, else "" */
    int is_prefix;         /* a common prefix (listing with a delimiter) */
} ckptio_object_info;

/* Called for each entry; a non-zero return stops the listing (not an error). */
typedef int (*ckptio_object_fn)(void *user, const ckptio_object_info *info);

/*! ckptio_object_list() :
 * Lists the objects of s3://BUCKET/PREFIX (PREFIX may be empty), every page,
 * in the server's order (UTF-8 binary order on S3). With a `delimiter`
 * (usually "/"), keys with the delimiter after the prefix are rolled up
 * into common prefixes, reported once each with is_prefix = 1. Keys come
 * back decoded (the listing is asked URL-encoded, so any byte survives).
 * @return CKPTIO_OK (also when fn stopped it), or the failed request's
 * error (CKPTIO_E_NOT_FOUND for a missing bucket). */
CKPTIO_API ckptio_status ckptio_object_list(ckptio_engine *engine, const char *url, const char *delimiter,
                                            ckptio_object_fn fn, void *user);

/*! ckptio_object_delete() :
 * Deletes s3://BUCKET/KEY; a missing object is no error (a missing bucket
 * is CKPTIO_E_NOT_FOUND). */
CKPTIO_API ckptio_status ckptio_object_delete(ckptio_engine *engine, const char *url);

/*! ckptio_object_put() :
 * Writes data[0..len) as the whole object s3://BUCKET/KEY with one request
 * (markers, small metadata files). With `if_absent`, only if no object of
 * that key exists, atomically on the server (If-None-Match: *):
 * CKPTIO_E_EXISTS when one does, CKPTIO_E_UNSUPPORTED where the server has
 * no conditional writes (OpenStack Swift's s3api). */
CKPTIO_API ckptio_status ckptio_object_put(ckptio_engine *engine, const char *url, const void *data, size_t len,
                                           int if_absent);

/*! ckptio_object_list_uploads() :
 * Lists the unfinished multipart uploads of keys under s3://BUCKET/PREFIX
 * (each with key, upload_id and time): what a save that was killed before
 * its commit leaves on the server, billed but invisible. */
CKPTIO_API ckptio_status ckptio_object_list_uploads(ckptio_engine *engine, const char *url, ckptio_object_fn fn,
                                                    void *user);

/*! ckptio_object_abort_uploads() :
 * Aborts the unfinished multipart uploads under s3://BUCKET/PREFIX that
 * were started at least `older_than_seconds` ago (by the server's clock
 * against this machine's; 0: all, including a save running now, which then
 * fails at its next part or at commit). *aborted (may be NULL) receives
 * how many were aborted. Objects are never touched. @return CKPTIO_OK, or
 * the first failure (the uploads before it stay aborted). */
CKPTIO_API ckptio_status ckptio_object_abort_uploads(ckptio_engine *engine, const char *url,
                                                     double older_than_seconds, uint64_t *aborted);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_EXPERIMENTAL_H */
