/*
 * ckptio/file.h - files beyond the engine's data path: format detection, the mode a
 * writer's own files take, the temporaries crashed saves leave behind.
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_FILE_H
#define CKPTIO_FILE_H

#include "core.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/file.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Format detection                                                         */
/* ------------------------------------------------------------------------ */

/* What a path holds, recognised from its bytes (files) or entries
 * (directories), never from a file name's extension (the one exception:
 * CKPTIO_FORMAT_HF_INDEX for a file, see ckptio_format_detect). Values are
 * pinned; new ones are only appended. */
typedef enum ckptio_format {
    CKPTIO_FORMAT_UNKNOWN = 0,      /* none of the below */
    CKPTIO_FORMAT_SAFETENSORS = 1,  /* a safetensors file (ckptio_safetensors_open) */
    CKPTIO_FORMAT_TORCH = 2,        /* a torch.save zip archive (ckptio_torch_open) */
    CKPTIO_FORMAT_TORCH_LEGACY = 3, /* a pre-1.6 torch.save bare pickle (not supported) */
    CKPTIO_FORMAT_DCP = 4,          /* a torch.distributed.checkpoint directory (ckptio_dcp_open) */
    CKPTIO_FORMAT_HF_INDEX = 5,     /* a Hugging Face sharded checkpoint: its index file or directory */
    CKPTIO_FORMAT_DIRECTORY = 6     /* some other directory */
} ckptio_format;

/* Bytes from the start of a file that ckptio_format_detect_bytes needs to
 * decide in every case but one (a safetensors header that begins with more
 * JSON whitespace than that). */
#define CKPTIO_FORMAT_PROBE_BYTES 64u

/*! ckptio_format_detect_bytes() :
 * Names the format of a file from its first bytes. `head` holds the first
 * `len` bytes of a file of `file_size` bytes (len <= file_size; give
 * min(file_size, CKPTIO_FORMAT_PROBE_BYTES) or more). The rules, in this
 * order (the first that holds wins):
 *  1. SAFETENSORS: len >= 9; the little-endian u64 N in bytes 0..7 has
 *     2 <= N <= 100,000,000 and N <= file_size - 8; the first byte of
 *     bytes 8..8+N-1 that is not JSON whitespace (space, \t, \n, \r) is
 *     '{' (when `head` ends before such a byte, the file counts as
 *     safetensors: its reader decides).
 *  2. TORCH: starts with "PK\x03\x04" (a zip local header).
 *  3. TORCH_LEGACY: byte 0 is 0x80 (pickle PROTO) and byte 1 is 2..5.
 *  4. SAFETENSORS: byte 8 is '{' though rule 1 failed (a safetensors file
 *     whose length field is damaged or that was cut inside its header), so
 *     that its reader reports what is wrong.
 *  5. UNKNOWN.
 * No valid safetensors file is taken for another format: rule 1 comes first
 * and holds for every file the safetensors reader accepts; no torch.save
 * file (zip or legacy) satisfies rule 1 or 4 (byte 8 of a torch zip is its
 * compression method, 0; of a legacy file, inside the pickled magic number).
 * Never reads outside head[0..len). Returns CKPTIO_E_INVAL for NULL
 * arguments or len > file_size. Thread-safe. */
CKPTIO_API ckptio_status ckptio_format_detect_bytes(const void *head, size_t len, uint64_t file_size,
                                                    ckptio_format *out);

/*! ckptio_format_detect() :
 * Names the format of `path`. A regular file: its first bytes by the rules
 * of ckptio_format_detect_bytes (reading further when a safetensors header
 * begins with much whitespace); a file whose name ends in ".index.json"
 * and whose first non-blank byte is '{', and that is neither safetensors
 * nor a torch file by its bytes, is CKPTIO_FORMAT_HF_INDEX. A directory:
 * CKPTIO_FORMAT_DCP when it holds an entry ".metadata", else
 * CKPTIO_FORMAT_HF_INDEX when it holds "model.safetensors.index.json",
 * else CKPTIO_FORMAT_DIRECTORY (the entry may be anything: the reader
 * refuses a key file that is not a regular file, naming it). The ckptio
 * command and ckptio.load take both of the last as a model
 * (ckptio_model_open decides what the directory holds). Symbolic links are
 * followed. Anything else (FIFO, device, socket) is CKPTIO_E_UNSUPPORTED
 * naming its type, and is never opened (its driver's open never runs). A
 * path that cannot be opened or read fails with the errno's status
 * (CKPTIO_E_NOT_FOUND, CKPTIO_E_PERMISSION, ...) naming it.
 * "s3://BUCKET/KEY": an object is judged by its first bytes as a file; a
 * key with objects under KEY/ (or a URL ending in '/') is a directory,
 * judged by the objects ".metadata" and "model.safetensors.index.json"
 * under it; neither is CKPTIO_E_NOT_FOUND (docs/OBJECT_STORAGE.md).
 * Thread-safe. */
CKPTIO_API ckptio_status ckptio_format_detect(const char *path, ckptio_format *out);

/*! ckptio_format_name() : @return "safetensors", "torch", "torch_legacy",
 * "dcp", "hf_index", "directory" or "unknown" (static storage; "unknown"
 * for values outside the enum). */
CKPTIO_API const char *ckptio_format_name(ckptio_format format);

/* ------------------------------------------------------------------------ */
/* Files written by the caller                                              */
/* ------------------------------------------------------------------------ */

/*! ckptio_file_open_window() :
 * ckptio_file_open(CKPTIO_OPEN_READ) that also reads the file's first
 * min(`len`, size) bytes into `buf`; *got: how many. For an s3:// object one
 * ranged GET does both (its Content-Range tells the size, its ETag pins the
 * version every later read names in If-Match) where ckptio_file_open would
 * send a HEAD and the read a GET: a small file (a .metadata, a manifest) is
 * then read in one round trip. Where that answer cannot stand for the HEAD
 * (its bytes came in two attempts, the object is empty) the HEAD is sent and
 * the bytes read as usual. On failure *out is NULL. */
CKPTIO_API ckptio_status ckptio_file_open_window(ckptio_engine *engine, const char *path, void *buf, uint64_t len,
                                                 uint64_t *got, ckptio_file **out);

/*! ckptio_file_read_all() :
 * The whole file or s3:// object `path`, of at most `max_bytes` bytes, into
 * *data (allocated by ckptio, NUL-terminated after its *len bytes; release
 * it with ckptio_file_data_free). Opened with its first MiB
 * (ckptio_file_open_window: in object storage one GET, no HEAD, which is
 * all of most small files); a larger file's rest is one more read, pinned to
 * the version of the first. @return CKPTIO_OK; CKPTIO_E_NOT_FOUND when
 * missing; CKPTIO_E_FORMAT when larger than max_bytes (*data is then NULL
 * and *len the file's size); the open's and reads' errors. Thread-safe. */
CKPTIO_API ckptio_status ckptio_file_read_all(ckptio_engine *engine, const char *path, uint64_t max_bytes,
                                              void **data, size_t *len);

/*! ckptio_file_data_free() :
 * Releases what ckptio_file_read_all gave; NULL is a no-op. */
CKPTIO_API void ckptio_file_data_free(void *data);

/*! ckptio_file_version() :
 * The version every read of `file` is pinned to: for an s3:// object open
 * for reading, the ETag (as the server sent it) its GETs name in If-Match;
 * "" for a local file or an object open for writing. A reader compares it
 * with what a listing gave for the same object to tell whether that
 * listing's ETags are the server's GET ETags (some gateways and encryption
 * modes list others). Valid while `file` is open. */
CKPTIO_API const char *ckptio_file_version(const ckptio_file *file);

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

/*! ckptio_file_commit_unreferenced() :
 * Commits atomic write files (ckptio_file_open(CKPTIO_OPEN_WRITE)) whose
 * final names nothing references yet, as a DCP save's data files, which no
 * .metadata names before they are durable: each file's mode is set as
 * ckptio_file_commit sets it and its temporary renamed over its name, then
 * (with CKPTIO_OPT_SYNC) every file and each of their directories are
 * fsynced together (up to 16 at a time), one journal commit for all where
 * ckptio_file_commit costs two a file. When it returns CKPTIO_OK, every file's data and name are
 * durable. Unlike ckptio_file_commit the names appear before the data is
 * flushed: a crash can leave a file under its name with only part of its
 * data, which is why the names must be unreferenced until this returns (a
 * DCP save's next save removes such files). On a failure some files may be
 * renamed but not durable: the caller must not reference any of them. A
 * file without a temporary (CKPTIO_OPEN_IN_PLACE, an object) is committed
 * by ckptio_file_commit (an object with CKPTIO_COMMIT_SYNC_LATER: later, by
 * ckptio_dcp_commit). Files are committed in order, in groups of 32 (the
 * fsyncs of one group before the next is renamed); the first failure ends it. Not thread-safe for
 * one file (as ckptio_file_commit). */
CKPTIO_API ckptio_status ckptio_file_commit_unreferenced(ckptio_file *const *files, size_t count, unsigned flags);

/* Flags of ckptio_file_commit_unreferenced(). */
enum {
    /* Rename only: the fsyncs are left to ckptio_dcp_commit(), which runs
     * them with its own (its options' data_files). An object (s3://) is not
     * completed here: its last parts go on uploading and ckptio_dcp_commit()
     * completes it beside the manifest's PUT, a round trip fewer before
     * .metadata. Keep the files open until then; closing one first aborts
     * its upload. */
    CKPTIO_COMMIT_SYNC_LATER = 1u << 0
};

/* ------------------------------------------------------------------------ */
/* Temporaries left by crashed saves                                        */
/* ------------------------------------------------------------------------ */
/* What ckptio_cleanup_temporaries() did. */
typedef struct ckptio_cleanup_report {
    size_t removed;        /* stale temporaries removed */
    uint64_t bytes_freed;  /* their sizes */
    size_t busy;           /* kept: a live writer holds them, or they cannot be checked */
    size_t young;          /* kept: modified less than min_age_seconds ago */
    size_t ignored;        /* names that match but are not regular files (symlinks,
                            * directories not proven a dead conversion's): never followed, never removed */
} ckptio_cleanup_report;

/*! ckptio_cleanup_temporaries() :
 * Removes the temporaries of atomic saves (".NAME.ckptio-tmp-XXXXXX") in
 * `dir` that no live writer holds: every writer keeps an flock on its
 * temporary until it commits or closes, and the kernel releases it when the
 * writer dies (kill -9 included), so a concurrent save never loses its
 * temporary. Also kept: those modified less than `min_age_seconds` ago
 * (0 = no age rule). `name` limits the scan to the temporaries of one file
 * (NULL = all). Symlinks are never followed; the directory is not
 * searched recursively. One kind of directory is removed: the directory
 * temporary of a directory output (ckptio_convert), once the lock file its
 * builder flocks proves the builder dead and it holds only regular files.
 * An atomic save does this for its own NAME when one of the four names its
 * temporary may take (".NAME.ckptio-tmp-000000" to "-000003") shows a killed
 * or concurrent save (docs/RELIABILITY.md, "A save's temporary"). A failure to remove one temporary is
 * reported (CKPTIO_E_PERMISSION, ...) after the others were tried. When
 * something was removed, the directory is fsynced once (whatever the
 * engines' CKPTIO_OPT_SYNC), so a power loss cannot bring the files back; a
 * failed fsync is an error naming the directory ("fsync"), with the report
 * still counting what was removed. report may be NULL. Thread-safe. */
CKPTIO_API ckptio_status ckptio_cleanup_temporaries(const char *dir, const char *name, double min_age_seconds,
                                                    ckptio_cleanup_report *report);

/* ---- mapped loads ------------------------------------------------------------
 * A checkpoint file mapped into memory: tensors read in place, zero-copy, as
 * safetensors' safe_open and torch.load(mmap=True) give them to the CPU. The
 * mapping is private (MAP_PRIVATE): readable and writable, writes copy the
 * page and never reach the file. It keeps the bytes of the file it was made
 * from when another file is renamed over that name. A file truncated in
 * place takes the pages away: ckptio's plans check the mappings their memory
 * lies in (CKPTIO_E_TRUNCATED naming the file) and what ckptio copies or
 * hashes itself is guarded against SIGBUS; code outside ckptio touching such
 * a page gets the signal (docs/RELIABILITY.md, "Mapped loads"). */
typedef struct ckptio_mapping ckptio_mapping;

/*! ckptio_mapping_data() :
 * The mapped bytes: *data (NULL for an empty file) and *length, the file's
 * size when it was mapped. */
CKPTIO_API ckptio_status ckptio_mapping_data(const ckptio_mapping *mapping, void **data, uint64_t *length);

/*! ckptio_mapping_path() :
 * The path of the mapped file (owned by the mapping), NULL for NULL. */
CKPTIO_API const char *ckptio_mapping_path(const ckptio_mapping *mapping);

/*! ckptio_mapping_check() :
 * CKPTIO_E_TRUNCATED, naming the file and offset, when part of
 * [memory, memory + length) lies in a live ckptio mapping whose file no
 * longer holds those bytes (truncated in place); CKPTIO_OK otherwise, also
 * for memory no mapping covers. Every plan runs this on its memory. */
CKPTIO_API ckptio_status ckptio_mapping_check(const void *memory, uint64_t length);

/*! ckptio_mapping_copy() :
 * memcpy(dst, src, n), for memory that may lie in a mapped file: a page the
 * file lost to a truncation is CKPTIO_E_TRUNCATED naming the file (after
 * ckptio mapped a first file in the process; dst then holds an unspecified
 * part of the bytes), never a SIGBUS. */
CKPTIO_API ckptio_status ckptio_mapping_copy(void *dst, const void *src, size_t n);

/*! ckptio_mapping_release() :
 * Unmaps: tensors over the mapping must be gone. Accepts NULL. */
CKPTIO_API ckptio_status ckptio_mapping_release(ckptio_mapping *mapping);

/* ---- copies into host memory ------------------------------------------------
 * What a load of a checkpoint held in memory (bytes) copies its tensors with. */

/* One copy of ckptio_host_copy(): n bytes from src to dst. */
typedef struct ckptio_copy {
    void *dst;
    const void *src;
    size_t n;
} ckptio_copy;

/*! ckptio_host_copy() :
 * Runs `count` copies as ckptio_mapping_copy() does (memory of a mapped file
 * that lost its bytes is CKPTIO_E_TRUNCATED, never a SIGBUS): on the calling
 * thread, and from 8 MiB in all, with two CPUs in the process's affinity
 * mask, the second half of the bytes (a copy cut where the half falls) on
 * one more thread: one thread copies at about half the memory bandwidth.
 * The copies must not overlap. */
CKPTIO_API ckptio_status ckptio_host_copy(const ckptio_copy *copies, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_FILE_H */
