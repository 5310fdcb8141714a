/*
 * ckptio.h - the public, stable API of libckptio.
 *
 * ckptio moves tensor checkpoints between host or GPU memory and storage at the
 * speed of the disk, in the formats PyTorch users already have (safetensors,
 * torch.save zip files, torch.distributed.checkpoint directories).
 *
 * The data path is: tensor list -> format layout -> plan -> engine -> backend
 * -> file, and back. Users normally call the format-level functions
 * (ckptio_safetensors_*, ckptio_torch_*); the plan/engine layer is public too,
 * for callers with their own layouts.
 *
 * ckptio_experimental.h adds what ckptio's Python package is built on: the
 * pieces of torch.distributed.checkpoint writing and item decoding that
 * need a Python pickler around them, and the DCP directory commit steps.
 * Those may change in any minor version; nothing declared here depends on
 * them. docs/API.md tells the two apart.
 *
 * Conventions that hold for every function below:
 *  - Every function returns a ckptio_status: CKPTIO_OK (0) on success, a
 *    negative CKPTIO_E_* code on failure. Byte counts and handles come back
 *    through out-parameters.
 *  - After a failure, ckptio_last_error() describes it (errno, path, file
 *    offset, tensor or field name, a full English message). The record is
 *    thread-local and valid until the next failing call on the same thread.
 *  - Opaque handles come in pairs: _create/_destroy, _open/_close. Destroy and
 *    close functions accept NULL.
 *  - A handle is used by one thread at a time unless its section says
 *    otherwise. Different handles may be used concurrently.
 *  - Memory passed in by the caller (tensor buffers, names) stays owned by the
 *    caller and must stay valid until the call that uses it returns.
 *  - Strings are UTF-8 and NUL-terminated. Sizes are in bytes.
 */
#ifndef CKPTIO_H
#define CKPTIO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CKPTIO_BUILDING_LIBRARY) && defined(__GNUC__)
#define CKPTIO_API __attribute__((visibility("default")))
#else
#define CKPTIO_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

/* The one place the version is written: CMakeLists.txt (project version, soname, ckptio.pc, CMake
 * package) and pyproject.toml (the Python package's version) read these three lines. */
#define CKPTIO_VERSION_MAJOR 0
#define CKPTIO_VERSION_MINOR 1
#define CKPTIO_VERSION_PATCH 0
#define CKPTIO_VERSION_NUMBER \
    (CKPTIO_VERSION_MAJOR * 10000 + CKPTIO_VERSION_MINOR * 100 + CKPTIO_VERSION_PATCH)

/*! ckptio_version() :
 * @return the library's version as "MAJOR.MINOR.PATCH" (static storage). */
CKPTIO_API const char *ckptio_version(void);

/*! ckptio_version_number() : @return MAJOR*10000 + MINOR*100 + PATCH. */
CKPTIO_API unsigned ckptio_version_number(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* X(name, value, description). Values are pinned: they never change between
 * releases, new codes are only appended. */
#define CKPTIO_STATUS_MAP(X)                                                  \
    X(OK, 0, "success")                                                       \
    X(E_INVAL, -1, "invalid argument")                                        \
    X(E_NOMEM, -2, "out of host memory")                                      \
    X(E_IO, -3, "input/output error")                                         \
    X(E_FORMAT, -4, "malformed or corrupt file")                              \
    X(E_UNSUPPORTED, -5, "not supported")                                     \
    X(E_NOT_FOUND, -6, "not found")                                           \
    X(E_NO_CUDA, -7, "CUDA driver not available")                             \
    X(E_CUDA, -8, "CUDA driver error")                                        \
    X(E_DEVICE_OOM, -9, "out of GPU memory")                                  \
    X(E_BUSY, -10, "resource busy: work still in flight")                     \
    X(E_RANGE, -11, "value out of range")                                     \
    X(E_NOSPC, -12, "no space left on device")                                \
    X(E_CHECKSUM, -13, "checksum mismatch")                                   \
    X(E_TRUNCATED, -14, "unexpected end of file")                             \
    X(E_EXISTS, -15, "already exists")                                        \
    X(E_PERMISSION, -16, "permission denied")                                 \
    X(E_DISALLOWED, -17, "refused by the safety policy")                      \
    X(E_CANCELED, -18, "canceled")                                            \
    X(E_INTERNAL, -19, "internal error (a bug in ckptio)")                   \
    X(E_STALE, -20, "stale: describes another version of the file")

typedef enum ckptio_status {
#define CKPTIO_X_ENUM_(name, value, text) CKPTIO_##name = (value),
    CKPTIO_STATUS_MAP(CKPTIO_X_ENUM_)
#undef CKPTIO_X_ENUM_
} ckptio_status;

/*! ckptio_strerror() : @return a short English description of `status`
 * (static storage; "unknown status" for values outside the map). */
CKPTIO_API const char *ckptio_strerror(ckptio_status status);

/*! ckptio_status_name() : @return the enum's name without prefix, e.g.
 * "E_FORMAT" (static storage). */
CKPTIO_API const char *ckptio_status_name(ckptio_status status);

/* Everything known about the last failure on the calling thread. */
typedef struct ckptio_error_info {
    ckptio_status status;   /* the code the failing call returned */
    int sys_errno;          /* errno of the failed system call, or 0 */
    int cuda_result;        /* CUresult of the failed driver call, or 0 */
    const char *operation;  /* "open", "pread", "fsync", "rename", "parse", ... or "" */
    const char *path;       /* file involved, or "" */
    int64_t file_offset;    /* byte offset in that file, or -1 */
    const char *subject;    /* tensor name, JSON field, record, ... or "" */
    const char *message;    /* complete human-readable message (all of the above) */
    const char *source_file;/* ckptio source file that raised it (for bug reports) */
    int source_line;
} ckptio_error_info;

/*! ckptio_last_error() :
 * @return the calling thread's last error record. Never NULL: after a success
 * nothing is cleared, so read it only right after a call that failed. The
 * strings inside stay valid until the next failing call on this thread. */
CKPTIO_API const ckptio_error_info *ckptio_last_error(void);

/*! ckptio_last_error_message() : shortcut for ckptio_last_error()->message. */
CKPTIO_API const char *ckptio_last_error_message(void);

/* ------------------------------------------------------------------------ */
/* Data types                                                               */
/* ------------------------------------------------------------------------ */

/* Element types of tensors. Names follow safetensors ("F32", "BF16", ...);
 * ckptio_dtype_torch_name() gives the torch spelling ("float32"). */
typedef enum ckptio_dtype {
    CKPTIO_DTYPE_BOOL = 0,
    CKPTIO_DTYPE_U8,
    CKPTIO_DTYPE_I8,
    CKPTIO_DTYPE_U16,
    CKPTIO_DTYPE_I16,
    CKPTIO_DTYPE_U32,
    CKPTIO_DTYPE_I32,
    CKPTIO_DTYPE_U64,
    CKPTIO_DTYPE_I64,
    CKPTIO_DTYPE_F16,
    CKPTIO_DTYPE_BF16,
    CKPTIO_DTYPE_F32,
    CKPTIO_DTYPE_F64,
    CKPTIO_DTYPE_C32,          /* torch complex32 (no safetensors name) */
    CKPTIO_DTYPE_C64,
    CKPTIO_DTYPE_C128,         /* torch complex128 (no safetensors name) */
    CKPTIO_DTYPE_F8_E5M2,
    CKPTIO_DTYPE_F8_E4M3,      /* torch float8_e4m3fn */
    CKPTIO_DTYPE_F8_E5M2FNUZ,
    CKPTIO_DTYPE_F8_E4M3FNUZ,
    CKPTIO_DTYPE_F8_E8M0,      /* torch float8_e8m0fnu */
    CKPTIO_DTYPE_F6_E2M3,      /* 6 bits; safetensors only */
    CKPTIO_DTYPE_F6_E3M2,      /* 6 bits; safetensors only */
    CKPTIO_DTYPE_F4,           /* safetensors F4 = torch float4_e2m1fn_x2 */
    CKPTIO_DTYPE_COUNT_
} ckptio_dtype;

/*! ckptio_dtype_bits() : bits per element (1..128), or 0 for an invalid dtype.
 * F4 is 4 bits per element in safetensors terms. */
CKPTIO_API unsigned ckptio_dtype_bits(ckptio_dtype dtype);

/*! ckptio_dtype_name() : safetensors name ("F32"), "" when the dtype has
 * none (C32, C128), NULL for an invalid dtype. */
CKPTIO_API const char *ckptio_dtype_name(ckptio_dtype dtype);

/*! ckptio_dtype_torch_name() : torch name without "torch." ("float32"),
 * NULL for an invalid dtype or one torch lacks (F6_*). */
CKPTIO_API const char *ckptio_dtype_torch_name(ckptio_dtype dtype);

/*! ckptio_dtype_from_name() : parses a safetensors name ("BF16") or a torch
 * name ("bfloat16", "torch.bfloat16").
 * @return CKPTIO_OK, or CKPTIO_E_NOT_FOUND for an unknown name. */
CKPTIO_API ckptio_status ckptio_dtype_from_name(const char *name, ckptio_dtype *out);

/* ------------------------------------------------------------------------ */
/* Memory kinds                                                             */
/* ------------------------------------------------------------------------ */

typedef enum ckptio_mem_kind {
    CKPTIO_MEM_HOST = 0,  /* ordinary (pageable) host memory */
    CKPTIO_MEM_PINNED,    /* page-locked host memory registered with CUDA */
    CKPTIO_MEM_CUDA,      /* CUDA device memory */
    CKPTIO_MEM_AUTO       /* ask the driver (cuPointerGetAttribute); host if no driver */
} ckptio_mem_kind;

/* ------------------------------------------------------------------------ */
/* Engine: settings, statistics, the thread pool and staging memory          */
/* ------------------------------------------------------------------------ */

typedef struct ckptio_engine ckptio_engine;

/* I/O backends. AUTO picks io_uring where the kernel allows it and falls back
 * to the pread/pwrite pool silently; a forced backend that cannot run is an
 * error at ckptio_engine_create()/ckptio_engine_set(). */
typedef enum ckptio_backend {
    CKPTIO_BACKEND_AUTO = 0,
    CKPTIO_BACKEND_PREAD = 1,
    CKPTIO_BACKEND_IO_URING = 2
} ckptio_backend;

/* O_DIRECT policy. AUTO: O_DIRECT for transfers of at least
 * CKPTIO_OPT_DIRECT_MIN_BYTES, buffered I/O where the file system refuses
 * O_DIRECT (reported through ckptio_file_is_direct, not an error). */
typedef enum ckptio_direct_mode {
    CKPTIO_DIRECT_AUTO = 0,
    CKPTIO_DIRECT_OFF = 1,
    CKPTIO_DIRECT_ON = 2  /* refusal of O_DIRECT is an error */
} ckptio_direct_mode;

/* How bytes move between files and GPU memory. */
typedef enum ckptio_gpu_path {
    CKPTIO_GPU_PATH_AUTO = 0,     /* cuFile where it accepts the file and is faster, else pipeline */
    CKPTIO_GPU_PATH_CUFILE = 1,   /* force cuFile (error if it refuses) */
    CKPTIO_GPU_PATH_PIPELINE = 2  /* force ckptio's pipeline: every byte through pinned staging */
} ckptio_gpu_path;

/* Whether the GPU pipeline's pinned staging slots use transparent huge
 * pages (docs/GPU.md#huge-slots). AUTO: while THP is enabled and the
 * kernel's free 2 MiB blocks cover twice what a load may pin, so that the
 * slots' page faults never wait for the kernel to compact memory. */
typedef enum ckptio_huge_slots {
    CKPTIO_HUGE_SLOTS_AUTO = 0,
    CKPTIO_HUGE_SLOTS_OFF = 1,
    CKPTIO_HUGE_SLOTS_ON = 2      /* whatever the free blocks (THP must still be enabled to get any) */
} ckptio_huge_slots;

/* Cold reads and the page cache, in CKPTIO_DIRECT_AUTO mode (ON forces
 * O_DIRECT, OFF the page cache; in every mode a range the page cache already
 * holds is read from it). A read through the page cache leaves the file there,
 * so the next load of it runs at memory speed; an O_DIRECT read leaves
 * nothing. AUTO: a read plan whose files together take at most a quarter of
 * the memory available (MemAvailable in /proc/meminfo) is read through the
 * page cache, larger ones with O_DIRECT (docs/ENGINE.md has the reasons and
 * the measurements). */
typedef enum ckptio_read_cache {
    CKPTIO_READ_CACHE_AUTO = 0,
    CKPTIO_READ_CACHE_ON = 1,  /* cold reads always through the page cache */
    CKPTIO_READ_CACHE_OFF = 2  /* cold reads with O_DIRECT (files stay out of the page cache) */
} ckptio_read_cache;

/* Whether a saved file stays in the page cache, in CKPTIO_DIRECT_AUTO mode.
 * O_DIRECT writes leave nothing there, so the first load after a save reads
 * the disk; writes through the page cache leave the file there, and the next
 * load runs at memory speed. AUTO: a write plan whose files together take at
 * most 128 MiB and at most a quarter of MemAvailable is written through the
 * page cache (as fast as O_DIRECT at those sizes, durable all the same: the
 * commit's fsync writes it back), larger ones with O_DIRECT (docs/ENGINE.md,
 * "The cache after a save", has the measurements). */
typedef enum ckptio_write_cache {
    CKPTIO_WRITE_CACHE_AUTO = 0,
    CKPTIO_WRITE_CACHE_ON = 1,  /* every saved file through the page cache (durable writes at its speed) */
    CKPTIO_WRITE_CACHE_OFF = 2  /* O_DIRECT whatever the size (saved files stay out of the page cache) */
} ckptio_write_cache;

/* Engine settings. Each has an environment variable read once at
 * ckptio_engine_create() (CKPTIO_ and the name after CKPTIO_OPT_, e.g.
 * CKPTIO_THREADS), a getter and a setter, and bounds from
 * ckptio_option_bounds(); docs/ENGINE.md#5-settings lists defaults and
 * bounds. */
typedef enum ckptio_option {
    CKPTIO_OPT_BACKEND = 0,        /* ckptio_backend; CKPTIO_BACKEND=auto|pread|io_uring */
    CKPTIO_OPT_THREADS,            /* I/O worker threads, 0 = run inline; CKPTIO_THREADS */
    CKPTIO_OPT_CHUNK_BYTES,        /* largest single I/O request; CKPTIO_CHUNK_BYTES */
    CKPTIO_OPT_QUEUE_DEPTH,        /* requests in flight per worker (io_uring); CKPTIO_QUEUE_DEPTH */
    CKPTIO_OPT_STAGING_BYTES,      /* bound on bounce/pinned staging memory, all workers together; CKPTIO_STAGING_BYTES */
    CKPTIO_OPT_DIRECT,             /* ckptio_direct_mode; CKPTIO_DIRECT=auto|off|on */
    CKPTIO_OPT_DIRECT_MIN_BYTES,   /* below this, transfers use buffered I/O; CKPTIO_DIRECT_MIN_BYTES */
    CKPTIO_OPT_SYNC,               /* 1: fsync files and directories on commit (default); CKPTIO_SYNC */
    CKPTIO_OPT_GPU_PATH,           /* ckptio_gpu_path; CKPTIO_GPU_PATH=auto|cufile|pipeline */
    CKPTIO_OPT_READ_CACHE,         /* ckptio_read_cache; CKPTIO_READ_CACHE=auto|on|off */
    CKPTIO_OPT_GPU_HUGE_SLOTS,     /* ckptio_huge_slots; CKPTIO_GPU_HUGE_SLOTS=auto|off|on */
    CKPTIO_OPT_NVTX,               /* 1: NVTX ranges around GPU transfers where libnvToolsExt loads; CKPTIO_NVTX */
    /* s3:// objects (docs/OBJECT_STORAGE.md) */
    CKPTIO_OPT_S3_CONCURRENCY,     /* requests in flight for one object transfer; CKPTIO_S3_CONCURRENCY */
    CKPTIO_OPT_S3_PART_BYTES,      /* smallest multipart part (grows with the object); CKPTIO_S3_PART_BYTES */
    CKPTIO_OPT_S3_RETRIES,         /* retries of a failed request; CKPTIO_S3_RETRIES */
    CKPTIO_OPT_S3_TIMEOUT_MS,      /* an attempt with no progress for this long fails; CKPTIO_S3_TIMEOUT_MS */
    CKPTIO_OPT_S3_DEADLINE_MS,     /* one request, all attempts together; CKPTIO_S3_DEADLINE_MS */
    CKPTIO_OPT_S3_BACKOFF_MS,      /* first retry waits up to this (doubling, 20 s at most); CKPTIO_S3_BACKOFF_MS */
    CKPTIO_OPT_WRITE_CACHE,        /* ckptio_write_cache; CKPTIO_WRITE_CACHE=auto|on|off */
    CKPTIO_OPT_COUNT_
} ckptio_option;

/*! ckptio_engine_create() :
 * Creates an engine with defaults, then environment overrides.
 * @return CKPTIO_OK and *out, or an error (e.g. CKPTIO_BACKEND=io_uring where
 * io_uring is not permitted). The engine owns its worker threads and staging
 * memory; both are created lazily on first use.
 * fork(): an engine created before fork() works in the child; its first use
 * there replaces the parent's threads, io_uring rings, lock and staging
 * without touching them (docs/ENGINE.md). GPU transfers in such a child fail
 * with CKPTIO_E_NO_CUDA when the device was initialised before fork(). */
CKPTIO_API ckptio_status ckptio_engine_create(ckptio_engine **out);

/*! ckptio_engine_destroy() : releases threads and staging memory.
 * @return CKPTIO_E_BUSY (and destroys nothing) while a call on another thread
 * is still using the engine, or while files opened with it are still open
 * (close them first). Accepts NULL. */
CKPTIO_API ckptio_status ckptio_engine_destroy(ckptio_engine *engine);

/*! ckptio_engine_set() / ckptio_engine_get() : change or read one setting.
 * Values outside ckptio_option_bounds() give CKPTIO_E_RANGE, as does a
 * CKPTIO_OPT_CHUNK_BYTES that is not a multiple of 4096; the setting is then
 * unchanged. Changing a setting takes effect at the next transfer. An
 * environment variable with a malformed or out-of-range value makes
 * ckptio_engine_create() fail with an error naming the variable. */
CKPTIO_API ckptio_status ckptio_engine_set(ckptio_engine *engine, ckptio_option option, int64_t value);
CKPTIO_API ckptio_status ckptio_engine_get(const ckptio_engine *engine, ckptio_option option, int64_t *value);

/*! ckptio_option_bounds() : inclusive bounds of a setting's value. */
CKPTIO_API ckptio_status ckptio_option_bounds(ckptio_option option, int64_t *min, int64_t *max);

/*! ckptio_option_name() : "threads", "chunk_bytes", ... (static), NULL if invalid. */
CKPTIO_API const char *ckptio_option_name(ckptio_option option);

/*! ckptio_option_value_name() :
 * The name of `value` of a setting that takes names ("io_uring" for
 * CKPTIO_OPT_BACKEND and CKPTIO_BACKEND_IO_URING; the names its
 * environment variable accepts), static; NULL when the setting takes
 * numbers or `value` is outside its bounds. */
CKPTIO_API const char *ckptio_option_value_name(ckptio_option option, int64_t value);

/*! ckptio_env_check() :
 * Finds environment variables named CKPTIO_* that ckptio does not read,
 * such as a misspelt setting (CKPTIO_THREDS=4 is otherwise ignored without
 * a word). Known: every setting's variable, the library's process-wide
 * variables (CKPTIO_CUDA_LIBRARY, CKPTIO_CUFILE_LIBRARY), the CLI's
 * CKPTIO_NO_PROGRESS (docs/ENGINE.md#5-settings lists them all); names
 * starting with CKPTIO_TEST_, which ckptio's own tests and benchmarks use,
 * are never reported. For each unknown name one line goes into `message`
 * (NUL-terminated, cut at `capacity`; may be NULL when capacity is 0):
 * "CKPTIO_THREDS is not a ckptio setting: did you mean CKPTIO_THREADS?\n",
 * naming the closest known variable where one is close. The library never
 * prints it: the Python package warns when it creates its first engine and
 * the CLI prints it.
 * Reads `environ`: not safe against a concurrent setenv().
 * @return CKPTIO_OK and *unknown, the number of such variables. */
CKPTIO_API ckptio_status ckptio_env_check(char *message, size_t capacity, size_t *unknown);

/*! ckptio_backend_name() : "auto", "pread" or "io_uring" (static). */
CKPTIO_API const char *ckptio_backend_name(ckptio_backend backend);

/*! ckptio_engine_backend() : the backend actually used (never AUTO). */
CKPTIO_API ckptio_status ckptio_engine_backend(ckptio_engine *engine, ckptio_backend *out);

/* Progress: called from the thread that started the transfer (never from a
 * worker, GPU transfers included) with cumulative bytes of the current
 * plan: once before any I/O (done = 0), then at most every 10 ms, and once
 * after the last byte (done = total; its return value is ignored).
 * ckptio_torch_save() and ckptio_torch_save_tensors() write the data, then
 * the archive's directory, and report both as one transfer (one total, the
 * file's size). ckptio_safetensors_save_torch() reports each storage's read
 * and write, and the metadata, as plans of their own.
 * Returning non-zero cancels the transfer: workers stop issuing requests,
 * in-flight ones finish, and the call fails with CKPTIO_E_CANCELED (a save
 * then leaves the older file and no temporary). */
typedef int (*ckptio_progress_fn)(uint64_t bytes_done, uint64_t bytes_total, void *user);

/*! ckptio_engine_set_progress() : installs (or with fn == NULL removes) a
 * progress callback for all following transfers on this engine. */
CKPTIO_API ckptio_status ckptio_engine_set_progress(ckptio_engine *engine, ckptio_progress_fn fn, void *user);

/* Counters, cumulative since engine creation (like torch.cuda.memory_stats). */
typedef struct ckptio_stats {
    uint64_t bytes_read;            /* file -> memory, all paths */
    uint64_t bytes_written;         /* memory -> file, all paths */
    uint64_t bytes_direct;          /* of those, moved with O_DIRECT */
    uint64_t bytes_buffered;        /* of those, moved through the page cache */
    uint64_t bytes_bounced;         /* of those, copied through a bounce buffer (unaligned) */
    uint64_t bytes_h2d;             /* host -> GPU copies (both kinds below) */
    uint64_t bytes_d2h;             /* GPU -> host copies */
    uint64_t bytes_cufile;          /* moved by cuFile */
    uint64_t staging_reserved;      /* staging bytes allocated now */
    uint64_t staging_in_use;        /* staging bytes holding data now */
    uint64_t staging_peak;          /* highest staging_in_use seen */
    uint64_t io_requests;           /* system-level requests issued */
    uint64_t retries;               /* EINTR / short transfers resumed */
    double seconds_io;              /* wall time inside transfers */
    double seconds_fsync;           /* wall time in fsync/fdatasync */
    double seconds_copy;            /* wall time waiting on GPU copies */
} ckptio_stats;

/*! ckptio_engine_stats() : copies the counters. Thread-safe. */
CKPTIO_API ckptio_status ckptio_engine_stats(const ckptio_engine *engine, ckptio_stats *out);

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct ckptio_file ckptio_file;

enum ckptio_open_flags {
    CKPTIO_OPEN_READ = 1u << 0,
    /* Atomic create: data goes to a temporary name in the same directory
     * (".NAME.ckptio-tmp-XXXXXX"; for a NAME of more than 236 bytes, NAME
     * there is its first bytes + '~' + 16 hex digits of its hash, so that
     * every name up to 255 bytes can be saved); ckptio_file_commit() gives
     * it the mode (and, where permitted, owner) of the NAME it replaces
     * (ckptio_inherit_mode), fsyncs it, renames it over NAME and fsyncs the
     * directory. A new NAME gets 0666 & ~umask. Closing without commit
     * removes the temporary and leaves any existing NAME untouched. A base
     * name over 255 bytes is CKPTIO_E_INVAL (errno ENAMETOOLONG) at open. */
    CKPTIO_OPEN_WRITE = 1u << 1,
    /* With WRITE: write NAME in place (no temporary, no rename). An existing
     * file keeps its content and size (trim with ckptio_file_truncate);
     * commit fsyncs it (and the directory if NAME was created). */
    CKPTIO_OPEN_IN_PLACE = 1u << 2,
    /* With WRITE: fail with CKPTIO_E_EXISTS if NAME exists (a dangling
     * symlink counts), at open and again atomically at commit
     * (renameat2(RENAME_NOREPLACE), or link() where that is missing). */
    CKPTIO_OPEN_EXCLUSIVE = 1u << 3
};

/*! ckptio_file_open() :
 * Opens `path` for the engine's transfers (flags from ckptio_open_flags).
 * Descriptors for buffered and O_DIRECT access are opened as needed.
 * @return CKPTIO_OK and *out; CKPTIO_E_NOT_FOUND, CKPTIO_E_PERMISSION, ... */
CKPTIO_API ckptio_status ckptio_file_open(ckptio_engine *engine, const char *path, unsigned flags,
                                          ckptio_file **out);

/*! ckptio_file_commit() : for an atomic write file: flush, fsync (when
 * CKPTIO_OPT_SYNC), rename over the final name, fsync the directory. The
 * file stays open for reading statistics but accepts no more writes. A
 * failed commit cannot be retried (CKPTIO_E_INVAL): after a failed fsync the
 * kernel may have dropped the data; close and write again. If only the final
 * directory fsync fails, the file is already in place under its name and
 * the error says so. */
CKPTIO_API ckptio_status ckptio_file_commit(ckptio_file *file);

/*! ckptio_file_close() : closes; an uncommitted atomic write is discarded
 * (temporary unlinked). Accepts NULL. Returns the first error of a final
 * close, if any. */
CKPTIO_API ckptio_status ckptio_file_close(ckptio_file *file);

/*! ckptio_file_size() : current size in bytes. */
CKPTIO_API ckptio_status ckptio_file_size(ckptio_file *file, uint64_t *out);

/*! ckptio_file_path() : the final path given at open (owned by the file). */
CKPTIO_API const char *ckptio_file_path(const ckptio_file *file);

/*! ckptio_file_is_direct() : *out = 1 if O_DIRECT is in use for this file,
 * 0 if the file system refused it (or CKPTIO_OPT_DIRECT is OFF). Note that
 * tmpfs accepts O_DIRECT since Linux 6.6. */
CKPTIO_API ckptio_status ckptio_file_is_direct(ckptio_file *file, int *out);

/*! ckptio_file_truncate() : sets the size of a write file (for preallocating
 * or trimming). */
CKPTIO_API ckptio_status ckptio_file_truncate(ckptio_file *file, uint64_t size);

/* ------------------------------------------------------------------------ */
/* Plans: the list of extents the engine executes                           */
/* ------------------------------------------------------------------------ */

typedef struct ckptio_plan ckptio_plan;

/* One contiguous transfer between a file range and a memory range. */
typedef struct ckptio_extent {
    ckptio_file *file;       /* the file (owned by the caller) */
    uint64_t file_offset;    /* any alignment */
    uint64_t length;         /* bytes; 0 is allowed and does nothing */
    void *memory;            /* any alignment; host or device address */
    ckptio_mem_kind mem_kind;
} ckptio_extent;

typedef enum ckptio_direction {
    CKPTIO_READ = 0,   /* file -> memory */
    CKPTIO_WRITE = 1   /* memory -> file */
} ckptio_direction;

/*! ckptio_plan_create() : an empty plan for one direction. */
CKPTIO_API ckptio_status ckptio_plan_create(ckptio_direction direction, ckptio_plan **out);

/*! ckptio_plan_destroy() : accepts NULL. */
CKPTIO_API ckptio_status ckptio_plan_destroy(ckptio_plan *plan);

/*! ckptio_plan_add() : appends an extent (copied). Extents of a write plan
 * must not overlap in a file; extents of a read plan must not overlap in
 * memory (checked at execution: CKPTIO_E_INVAL naming both extents). */
CKPTIO_API ckptio_status ckptio_plan_add(ckptio_plan *plan, const ckptio_extent *extent);

/*! ckptio_plan_count() / ckptio_plan_total_bytes() : size of the plan. */
CKPTIO_API ckptio_status ckptio_plan_count(const ckptio_plan *plan, size_t *out);
CKPTIO_API ckptio_status ckptio_plan_total_bytes(const ckptio_plan *plan, uint64_t *out);

/*! ckptio_engine_execute() :
 * Runs every extent of the plan, in parallel on the engine's workers,
 * splitting large extents into chunks, using O_DIRECT with aligned bounce
 * buffers for unaligned heads/tails/memory, and the GPU pipeline for device
 * memory. Blocks until all bytes moved or the first error.
 * On failure the error names the extent index, file and offset; memory of a
 * read plan may then be partly written. Reading past the end of a file is
 * CKPTIO_E_TRUNCATED. */
CKPTIO_API ckptio_status ckptio_engine_execute(ckptio_engine *engine, const ckptio_plan *plan);

/*! ckptio_engine_execute_extents() :
 * The usual sequence in one call: a plan of `count` extents in array order
 * (ckptio_plan_create, ckptio_plan_add for each), ckptio_engine_execute()
 * on it, then ckptio_plan_destroy(). Errors are those calls' errors; an
 * extent is named by its index in `extents`. NULL extents with count 0 is
 * an empty plan (CKPTIO_OK). */
CKPTIO_API ckptio_status ckptio_engine_execute_extents(ckptio_engine *engine, ckptio_direction direction,
                                                       const ckptio_extent *extents, size_t count);

/* ------------------------------------------------------------------------ */
/* Tensors (shared by every format)                                         */
/* ------------------------------------------------------------------------ */

/* A tensor as stored in a file (returned by readers; owned by the reader). */
typedef struct ckptio_tensor_info {
    const char *name;
    ckptio_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;     /* ndim entries */
    uint64_t file_offset;     /* absolute offset of the first byte in the file */
    uint64_t nbytes;          /* bytes in the file */
} ckptio_tensor_info;

/* A tensor to write (given by the caller; C-contiguous bytes). */
typedef struct ckptio_tensor_source {
    const char *name;
    ckptio_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;
    const void *data;
    uint64_t nbytes;          /* must equal the product of shape x dtype bits / 8 */
    ckptio_mem_kind mem_kind;
} ckptio_tensor_source;

/* Where one tensor should be read to. */
typedef struct ckptio_tensor_target {
    size_t index;             /* tensor index in the reader */
    void *data;               /* destination, at least nbytes */
    uint64_t capacity;        /* bytes available at data (checked) */
    ckptio_mem_kind mem_kind;
} ckptio_tensor_target;

/* A string key/value pair (safetensors __metadata__). */
typedef struct ckptio_kv {
    const char *key;
    const char *value;
} ckptio_kv;

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
 * CKPTIO_FORMAT_DCP when it holds a regular file ".metadata", else
 * CKPTIO_FORMAT_HF_INDEX when it holds "model.safetensors.index.json",
 * else CKPTIO_FORMAT_DIRECTORY. Symbolic links are followed. Anything else
 * (FIFO, device, socket) is CKPTIO_E_UNSUPPORTED, and is never opened for
 * reading. A path that cannot be opened or read fails with the errno's
 * status (CKPTIO_E_NOT_FOUND, CKPTIO_E_PERMISSION, ...) naming it.
 * Thread-safe. */
CKPTIO_API ckptio_status ckptio_format_detect(const char *path, ckptio_format *out);

/*! ckptio_format_name() : @return "safetensors", "torch", "torch_legacy",
 * "dcp", "hf_index", "directory" or "unknown" (static storage; "unknown"
 * for values outside the enum). */
CKPTIO_API const char *ckptio_format_name(ckptio_format format);

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
/* Hashing                                                                  */
/* ------------------------------------------------------------------------ */

/*! ckptio_hash_xxh3() :
 * XXH3-64 (seed 0, the value of xxhash's XXH3_64bits and of Python's
 * xxhash.xxh3_64_intdigest) of `len` bytes of host memory at `data`.
 * Thread-safe. @return CKPTIO_OK, or CKPTIO_E_INVAL for a NULL out, or
 * NULL data with len > 0. */
CKPTIO_API ckptio_status ckptio_hash_xxh3(const void *data, size_t len, uint64_t *out);

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

/* What ckptio_cleanup_temporaries() did. */
typedef struct ckptio_cleanup_report {
    size_t removed;        /* stale temporaries removed */
    uint64_t bytes_freed;  /* their sizes */
    size_t busy;           /* kept: a live writer holds them, or they cannot be checked */
    size_t young;          /* kept: modified less than min_age_seconds ago */
    size_t ignored;        /* names that match but are not regular files (symlinks,
                            * directories): never followed, never removed */
} ckptio_cleanup_report;

/*! ckptio_cleanup_temporaries() :
 * Removes the temporaries of atomic saves (".NAME.ckptio-tmp-XXXXXX") in
 * `dir` that no live writer holds: every writer keeps an flock on its
 * temporary until it commits or closes, and the kernel releases it when the
 * writer dies (kill -9 included), so a concurrent save never loses its
 * temporary. Also kept: those modified less than `min_age_seconds` ago
 * (0 = no age rule). `name` limits the scan to the temporaries of one file
 * (NULL = all). Symlinks are never followed; the directory is not
 * searched recursively. Every atomic save already does this for its own
 * NAME before creating its temporary. A failure to remove one temporary is
 * reported (CKPTIO_E_PERMISSION, ...) after the others were tried. When
 * something was removed, the directory is fsynced once (whatever the
 * engines' CKPTIO_OPT_SYNC), so a power loss cannot bring the files back; a
 * failed fsync is an error naming the directory ("fsync"), with the report
 * still counting what was removed. report may be NULL. Thread-safe. */
CKPTIO_API ckptio_status ckptio_cleanup_temporaries(const char *dir, const char *name, double min_age_seconds,
                                                    ckptio_cleanup_report *report);

/* ------------------------------------------------------------------------ */
/* GPU: CUDA access and the GDS file API                                    */
/* ------------------------------------------------------------------------ */
/* The CUDA driver is loaded at run time (dlopen "libcuda.so.1"); building and
 * running ckptio need no CUDA toolkit. Without a driver, the functions below
 * fail with CKPTIO_E_NO_CUDA (message says why) and host transfers keep
 * working. GPU work uses the primary context of the device owning the
 * memory (the one PyTorch uses) and leaves the caller's current context as
 * it was. Streams are passed as `void *` holding a CUstream (for PyTorch:
 * torch.cuda.current_stream().cuda_stream); NULL means the legacy default
 * stream. docs/GPU.md describes paths, settings and stream semantics. */

/* Which mechanism moved the bytes of a GPU transfer. */
typedef enum ckptio_io_path {
    CKPTIO_IO_PATH_NONE = 0,          /* nothing moved yet */
    CKPTIO_IO_PATH_CUFILE_DIRECT = 1, /* cuFile with GPUDirect Storage (nvidia-fs) */
    CKPTIO_IO_PATH_CUFILE_COMPAT = 2, /* cuFile in its POSIX compatibility mode */
    CKPTIO_IO_PATH_PIPELINE = 3,      /* ckptio's pinned-staging pipeline */
    CKPTIO_IO_PATH_HOST = 4           /* host memory: plain file I/O, no GPU */
} ckptio_io_path;

/*! ckptio_io_path_name() : "none", "cufile_direct", "cufile_compat",
 * "pipeline" or "host" (static), NULL if invalid. */
CKPTIO_API const char *ckptio_io_path_name(ckptio_io_path path);

/*! ckptio_cuda_available() :
 * Loads the driver if needed. @return CKPTIO_OK with *device_count (may be
 * NULL), or CKPTIO_E_NO_CUDA with a message naming what is missing. */
CKPTIO_API ckptio_status ckptio_cuda_available(int *device_count);

/*! ckptio_mem_classify() :
 * *out = CKPTIO_MEM_CUDA (device or managed memory), CKPTIO_MEM_PINNED
 * (page-locked host memory known to CUDA) or CKPTIO_MEM_HOST (pageable
 * memory, and every pointer when no driver is present). *device (may be
 * NULL) receives the owning device ordinal, or -1. Never fails for a
 * non-NULL out. */
CKPTIO_API ckptio_status ckptio_mem_classify(const void *ptr, ckptio_mem_kind *out, int *device);

/*! ckptio_gpu_mem_info() : free and total memory of a device (cuMemGetInfo). */
CKPTIO_API ckptio_status ckptio_gpu_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/*! ckptio_gpu_check_free() :
 * For loaders that allocate: @return CKPTIO_OK if `device` has at least
 * `needed` bytes free, else CKPTIO_E_DEVICE_OOM with a message giving the
 * bytes needed and free (and `what`, e.g. a file name, when not NULL). */
CKPTIO_API ckptio_status ckptio_gpu_check_free(int device, uint64_t needed, const char *what);

/*! ckptio_engine_gpu_path() : the path the engine's last GPU transfer took
 * (CKPTIO_IO_PATH_NONE before any). */
CKPTIO_API ckptio_status ckptio_engine_gpu_path(ckptio_engine *engine, ckptio_io_path *out);

/*! ckptio_engine_gpu_prepare() :
 * Starts pinning, on a background thread, the host staging memory the
 * engine's loads to CUDA device `device` will use (the engine keeps it for
 * later transfers; 2 slots of up to 4 MiB per worker thread: 128 MiB with
 * 16), and returns at once.
 * A process's first load otherwise pins it as it goes, which slows it
 * (docs/GPU.md#pinning): a model server calls this while it
 * builds its model, so the load that follows starts with its staging
 * ready. The driver pins and allocates device memory one at a time: GPU
 * allocations made meanwhile wait for the pinning, so call it ahead of work
 * that does not allocate GPU memory. A transfer that starts meanwhile stops
 * the pinning and pins the rest itself; an error while pinning ends it
 * silently (the transfer that needs the memory reports it). Slots of another size (after a save with checksums) are
 * kept, and nothing is pinned then. The engine's destruction waits for the
 * thread. Thread-safe.
 * @return CKPTIO_OK; CKPTIO_E_INVAL (NULL engine, negative device), the
 * error of a device CUDA cannot use (no driver, bad ordinal, forked child). */
CKPTIO_API ckptio_status ckptio_engine_gpu_prepare(ckptio_engine *engine, int device);

/* ---- GDS file API (like cuFile and torch.cuda.gds.GdsFile) ----------------
 * A file opened for transfers between it and device or host buffers at
 * explicit offsets. With CKPTIO_OPT_GPU_PATH (env CKPTIO_GPU_PATH) AUTO,
 * cuFile is used where it runs in GPUDirect mode (nvidia-fs present and the
 * handle registers); otherwise, with no user action, ckptio's pipeline.
 * CUFILE forces cuFile (a refusal is an error, message says why), PIPELINE
 * forces the pipeline. ckptio_gds_file_path() tells which path ran.
 * A handle is used by one thread at a time; async requests on one file
 * run in submission order on a background thread. */

typedef struct ckptio_gds_file ckptio_gds_file;
typedef struct ckptio_gds_request ckptio_gds_request;

/*! ckptio_gds_open() :
 * Opens `path` with the POSIX open flags `oflags` (O_RDONLY, O_WRONLY or
 * O_RDWR, optionally O_CREAT, O_EXCL, O_TRUNC), O_DIRECT added where the
 * file system accepts it (writes go to the file in place, not atomically),
 * and registers the handle (ckptio_gds_register_handle). `mode` is the
 * permission bits of a file O_CREAT creates, narrowed by the umask as
 * open(2)'s are (0: 0666); an existing file keeps its mode. The engine
 * must outlive the file. */
CKPTIO_API ckptio_status ckptio_gds_open(ckptio_engine *engine, const char *path, int oflags, unsigned mode,
                                         ckptio_gds_file **out);

/*! ckptio_gds_close() : deregisters and closes; waits for the file's async
 * requests first. Accepts NULL. */
CKPTIO_API ckptio_status ckptio_gds_close(ckptio_gds_file *file);

/*! ckptio_gds_register_handle() / ckptio_gds_deregister_handle() :
 * cuFileHandleRegister / Deregister (GdsFile.register_handle). Registering
 * decides the path for device buffers: in AUTO a cuFile refusal is not an
 * error (the pipeline is used; ckptio_gds_file_refusal() says why); with
 * CKPTIO_GPU_PATH_CUFILE it is. Deregistering makes device transfers use
 * the pipeline until the next registration. Both are idempotent. */
CKPTIO_API ckptio_status ckptio_gds_register_handle(ckptio_gds_file *file);
CKPTIO_API ckptio_status ckptio_gds_deregister_handle(ckptio_gds_file *file);

/*! ckptio_gds_file_refusal() : why cuFile is not used for this file ("" if
 * it is, or was not tried). Owned by the file. */
CKPTIO_API const char *ckptio_gds_file_refusal(const ckptio_gds_file *file);

/*! ckptio_gds_buf_register() / ckptio_gds_buf_deregister() :
 * cuFileBufRegister / Deregister for a device buffer reused across calls
 * (a no-op returning CKPTIO_OK when cuFile is not in use: the pipeline
 * needs no registration). */
CKPTIO_API ckptio_status ckptio_gds_buf_register(ckptio_gds_file *file, const void *base, uint64_t length);
CKPTIO_API ckptio_status ckptio_gds_buf_deregister(ckptio_gds_file *file, const void *base);

/*! ckptio_gds_read() :
 * Reads `size` bytes at `file_offset` into buf + buf_offset (device,
 * pinned or pageable memory; any alignment), blocking until the bytes are
 * in place. Like cuFileRead, a read reaching end of file is short:
 * *bytes_read (may be NULL) receives the count. */
CKPTIO_API ckptio_status ckptio_gds_read(ckptio_gds_file *file, void *buf, uint64_t size, uint64_t file_offset,
                                         uint64_t buf_offset, uint64_t *bytes_read);

/*! ckptio_gds_write() : writes `size` bytes from buf + buf_offset at
 * `file_offset`, blocking until they are in the file (not fsynced: see
 * ckptio_gds_sync). *bytes_written may be NULL. */
CKPTIO_API ckptio_status ckptio_gds_write(ckptio_gds_file *file, const void *buf, uint64_t size,
                                          uint64_t file_offset, uint64_t buf_offset, uint64_t *bytes_written);

/*! ckptio_gds_sync() : fsync of the file's data (durability of writes). */
CKPTIO_API ckptio_status ckptio_gds_sync(ckptio_gds_file *file);

/*! ckptio_gds_read_async() / ckptio_gds_write_async() :
 * Stream-ordered variants (like cuFileReadAsync): the transfer starts after
 * the work queued on `stream` before this call, and work queued on
 * `stream` after this call sees its result: kernels launched later on the
 * stream read the loaded bytes; kernels launched earlier have finished
 * writing the bytes a write saves. The call returns at once with a request
 * (*out); ckptio_gds_request_wait() gives its outcome. buf must stay valid
 * until then. Where the driver cannot make a stream wait for the host
 * (no cuStreamWaitValue32), the call synchronises `stream` and runs the
 * transfer before returning (same ordering, no overlap; see docs/GPU.md). */
CKPTIO_API ckptio_status ckptio_gds_read_async(ckptio_gds_file *file, void *buf, uint64_t size,
                                               uint64_t file_offset, uint64_t buf_offset, void *stream,
                                               ckptio_gds_request **out);
CKPTIO_API ckptio_status ckptio_gds_write_async(ckptio_gds_file *file, const void *buf, uint64_t size,
                                                uint64_t file_offset, uint64_t buf_offset, void *stream,
                                                ckptio_gds_request **out);

/*! ckptio_gds_request_wait() : blocks the host until the request finished;
 * @return its status (the error record describes a failure) and the bytes
 * moved in *bytes (may be NULL). May be called again (same answer). */
CKPTIO_API ckptio_status ckptio_gds_request_wait(ckptio_gds_request *request, uint64_t *bytes);

/*! ckptio_gds_request_destroy() : waits (like _wait) and frees. Accepts NULL. */
CKPTIO_API ckptio_status ckptio_gds_request_destroy(ckptio_gds_request *request);

/*! ckptio_gds_file_path() : the path the file's last transfer took. */
CKPTIO_API ckptio_status ckptio_gds_file_path(const ckptio_gds_file *file, ckptio_io_path *out);

/* ------------------------------------------------------------------------ */
/* torch.save zip checkpoints                                               */
/* ------------------------------------------------------------------------ */
/* torch.save files (zip + pickle, docs/FORMATS.md 1-2), read and written
 * without Python. Readers accept what torch 2.x writes (any storage alignment,
 * zip64, optional records missing); the pickle runs in a restricted
 * unpickler with an allowlist of globals at least as strict as
 * torch.load(weights_only=True). Writers produce files torch.load reads with
 * weights_only=True: storages 4 KiB-aligned by default, real CRC-32s for
 * host memory. Legacy (pre-1.6, non-zip) files and TorchScript archives are
 * refused with CKPTIO_E_UNSUPPORTED. docs/TORCH_FORMAT.md has the details. */

/* ---- values: the pickled object tree -------------------------------------- */

/* A node of the object tree in data.pkl. Nodes are owned by the ckptio_torch
 * (reader) or ckptio_torch_writer (writer) that made them and live as long
 * as it does. A node may be reachable along several paths (the pickle memo
 * shares objects), never in a cycle. */
typedef struct ckptio_value ckptio_value;

typedef enum ckptio_value_kind {
    CKPTIO_VALUE_NONE = 0,
    CKPTIO_VALUE_BOOL,
    CKPTIO_VALUE_INT,     /* fits int64 */
    CKPTIO_VALUE_BIGINT,  /* larger: little-endian two's complement bytes */
    CKPTIO_VALUE_FLOAT,
    CKPTIO_VALUE_STR,     /* UTF-8 */
    CKPTIO_VALUE_BYTES,
    CKPTIO_VALUE_LIST,
    CKPTIO_VALUE_TUPLE,   /* also torch.Size (ckptio_value_tuple_is_size) */
    CKPTIO_VALUE_DICT,    /* dict or collections.OrderedDict (ckptio_value_dict_ordered) */
    CKPTIO_VALUE_SET,
    CKPTIO_VALUE_TENSOR,  /* a tensor (or nn.Parameter); see ckptio_value_tensor */
    CKPTIO_VALUE_DTYPE,   /* a torch.dtype, e.g. torch.float32 */
    CKPTIO_VALUE_DEVICE,  /* a torch.device; its text ("cuda:0") via ckptio_value_str */
    CKPTIO_VALUE_OBJECT   /* an instance of an allowlisted class; see ckptio_value_object
                           * (ckptio_experimental.h): a DCP .metadata class, or in a torch.save
                           * tree a numpy value ("numpy.ndarray", "numpy.generic", "numpy.dtype") */
} ckptio_value_kind;

/*! ckptio_value_kind_of() : @return the node's kind (NONE for NULL). */
CKPTIO_API ckptio_value_kind ckptio_value_kind_of(const ckptio_value *value);

/*! ckptio_value_bool() / _int() / _float() : scalar contents. Each fails
 * with CKPTIO_E_INVAL for a node of another kind; _int() gives
 * CKPTIO_E_RANGE for a BIGINT. */
CKPTIO_API ckptio_status ckptio_value_bool(const ckptio_value *value, int *out);
CKPTIO_API ckptio_status ckptio_value_int(const ckptio_value *value, int64_t *out);
CKPTIO_API ckptio_status ckptio_value_float(const ckptio_value *value, double *out);

/*! ckptio_value_bytes() : the bytes of a STR (UTF-8, NUL-terminated too),
 * BYTES, BIGINT (little-endian two's complement, as pickle's LONG1) or
 * DEVICE ("cuda:0") node; for a DTYPE node, its torch name ("float32"). */
CKPTIO_API ckptio_status ckptio_value_bytes(const ckptio_value *value, const char **data, size_t *len);

/*! ckptio_value_len() : items of a LIST, TUPLE, SET or DICT (pairs). */
CKPTIO_API ckptio_status ckptio_value_len(const ckptio_value *value, size_t *out);

/*! ckptio_value_item() : item `index` of a LIST, TUPLE or SET. */
CKPTIO_API ckptio_status ckptio_value_item(const ckptio_value *value, size_t index, const ckptio_value **out);

/*! ckptio_value_dict_item() : pair `index` of a DICT, in insertion order. */
CKPTIO_API ckptio_status ckptio_value_dict_item(const ckptio_value *value, size_t index, const ckptio_value **key,
                                                const ckptio_value **item);

/*! ckptio_value_dict_ordered() : *out = 1 for a collections.OrderedDict. */
CKPTIO_API ckptio_status ckptio_value_dict_ordered(const ckptio_value *value, int *out);

/*! ckptio_value_tuple_is_size() : *out = 1 for a TUPLE pickled as a
 * torch.Size (its items are ints). */
CKPTIO_API ckptio_status ckptio_value_tuple_is_size(const ckptio_value *value, int *out);

/*! ckptio_value_dict_attrs() : attributes pickled with a dict (BUILD state:
 * a DICT such as {'_metadata': ...} of a module state_dict), or *out = NULL. */
CKPTIO_API ckptio_status ckptio_value_dict_attrs(const ckptio_value *value, const ckptio_value **out);

/*! ckptio_value_dtype() : the dtype of a DTYPE or TENSOR node. */
CKPTIO_API ckptio_status ckptio_value_dtype(const ckptio_value *value, ckptio_dtype *out);

/*! ckptio_value_tensor() : for a TENSOR node of a reader, the index of its
 * (first) entry in ckptio_torch_tensor(). */
CKPTIO_API ckptio_status ckptio_value_tensor(const ckptio_value *value, size_t *index);

/* ---- reading ---------------------------------------------------------------- */

typedef struct ckptio_torch ckptio_torch;

/* A tensor in a torch.save file: a view (offset, shape, stride in elements)
 * of one storage. Views and tensors sharing a storage name the same
 * storage index. */
typedef struct ckptio_torch_tensor_info {
    const char *name;         /* dotted path in the object tree ("layer.0.weight");
                               * dict keys as text, list/tuple positions as numbers */
    ckptio_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;     /* ndim entries */
    const int64_t *stride;    /* ndim entries, in elements */
    uint64_t storage_offset;  /* in elements */
    size_t storage;           /* index for ckptio_torch_storage() */
    int requires_grad;
    int is_parameter;         /* saved as torch.nn.Parameter */
    int is_contiguous;        /* C-contiguous: its bytes are one range of the file */
    uint64_t file_offset;     /* file offset of element [0,...,0] */
    uint64_t nbytes;          /* numel x element size */
    const ckptio_value *value;/* its node in the object tree */
} ckptio_torch_tensor_info;

/* A storage: one data/<key> record of raw bytes. */
typedef struct ckptio_torch_storage_info {
    const char *key;          /* "0", "1", ... */
    const char *location;     /* device it was saved from: "cpu", "cuda:0", ... */
    ckptio_dtype dtype;       /* storage class element type (U8 for UntypedStorage) */
    uint64_t nbytes;
    uint64_t file_offset;     /* first byte of the record's data */
    uint32_t crc32;           /* from the central directory (0: not computed by the writer) */
} ckptio_torch_storage_info;

/*! ckptio_torch_open() :
 * Opens a torch.save file: parses the zip directory and runs data.pkl
 * through the restricted unpickler. Globals outside the allowlist fail with
 * CKPTIO_E_DISALLOWED naming the global. Zip records that overlap each other
 * or the central directory are CKPTIO_E_FORMAT. Tensors are named by their
 * dotted path; two different tensors with one name ({'a.b': x, 'a': {'b': y}},
 * {1: x, '1': y}) are CKPTIO_E_UNSUPPORTED naming both paths (the writer
 * refuses such trees too). The engine is used for later reads and must
 * outlive the handle. */
CKPTIO_API ckptio_status ckptio_torch_open(ckptio_engine *engine, const char *path, ckptio_torch **out);

/*! ckptio_torch_parse() :
 * The same from a whole file held in memory (bytes, len). The handle lists
 * tensors and values; ckptio_torch_read() on it copies from that memory,
 * which must outlive the handle. */
CKPTIO_API ckptio_status ckptio_torch_parse(const void *bytes, size_t len, ckptio_torch **out);

/*! ckptio_torch_close() : accepts NULL. */
CKPTIO_API ckptio_status ckptio_torch_close(ckptio_torch *t);

/*! ckptio_torch_root() : the unpickled object (usually a DICT). */
CKPTIO_API ckptio_status ckptio_torch_root(const ckptio_torch *t, const ckptio_value **out);

/*! ckptio_torch_count() : number of tensors, one per path in the tree (a
 * tensor object reachable along two paths is listed twice). */
CKPTIO_API ckptio_status ckptio_torch_count(const ckptio_torch *t, size_t *out);

/*! ckptio_torch_tensor() : tensor `index`, in pickle order. Pointers live as
 * long as the handle. */
CKPTIO_API ckptio_status ckptio_torch_tensor(const ckptio_torch *t, size_t index, ckptio_torch_tensor_info *out);

/*! ckptio_torch_find() : index of the tensor named `name`, or CKPTIO_E_NOT_FOUND. */
CKPTIO_API ckptio_status ckptio_torch_find(const ckptio_torch *t, const char *name, size_t *index);

/*! ckptio_torch_storage_count() / ckptio_torch_storage() : the storages. */
CKPTIO_API ckptio_status ckptio_torch_storage_count(const ckptio_torch *t, size_t *out);
CKPTIO_API ckptio_status ckptio_torch_storage(const ckptio_torch *t, size_t index, ckptio_torch_storage_info *out);

/*! ckptio_torch_alignment() : the .storage_alignment record (64 when absent). */
CKPTIO_API ckptio_status ckptio_torch_alignment(const ckptio_torch *t, uint64_t *out);

/*! ckptio_torch_read_storages() :
 * Reads whole storages into caller memory (host or GPU), all in one engine
 * plan. targets[i].index is a storage index; capacity must be at least the
 * storage's nbytes (else CKPTIO_E_RANGE naming the storage). */
CKPTIO_API ckptio_status ckptio_torch_read_storages(ckptio_torch *t, const ckptio_tensor_target *targets,
                                                    size_t count);

/*! ckptio_torch_read() :
 * Reads tensors (targets[i].index is a tensor index) into caller memory, in
 * C order. Contiguous tensors go straight from the file (one engine plan);
 * a non-contiguous view is gathered from its storage through host memory
 * and needs a host target (CKPTIO_E_UNSUPPORTED for a GPU target). */
CKPTIO_API ckptio_status ckptio_torch_read(ckptio_torch *t, const ckptio_tensor_target *targets, size_t count);

/* What ckptio_torch_verify() found. */
typedef struct ckptio_torch_verify_report {
    size_t records;           /* zip records checked */
    size_t crc_checked;       /* records whose CRC-32 matched */
    size_t crc_absent;        /* records saved without a CRC (crc32 0, torch compute_crc32=False) */
    uint64_t bytes;           /* data bytes read */
} ckptio_torch_verify_report;

/*! ckptio_torch_verify() :
 * Reads every record and checks its CRC-32 against the central directory,
 * and the structure (records referenced by the pickle exist, views lie
 * inside their storages; checked at open). A mismatch is CKPTIO_E_CHECKSUM
 * naming the record. report may be NULL. */
CKPTIO_API ckptio_status ckptio_torch_verify(ckptio_torch *t, ckptio_torch_verify_report *report);

/* ---- writing ---------------------------------------------------------------- */

/* A writer holds the object tree to save, its storages (where their bytes
 * live) and, once computed, the file layout. The layout is reused by every
 * later save while the structure stays the same: between saves only rebind
 * storage memory (ckptio_torch_writer_bind). Any structural change (new
 * values, items, storages, root, other options) is tracked, and the next save
 * recomputes the layout, so a stale layout is never written. */
typedef struct ckptio_torch_writer ckptio_torch_writer;

enum ckptio_torch_save_flags {
    /* Write CRC-32 0 instead of computing it (torch's compute_crc32=False). */
    CKPTIO_TORCH_SAVE_NO_CRC = 1u << 0,
    /* Write the records in place instead of a temporary + rename. */
    CKPTIO_TORCH_SAVE_IN_PLACE = 1u << 1
};

typedef struct ckptio_torch_save_options {
    uint32_t storage_alignment;  /* 1..65536; 0 = 4096 (torch's own default is 64) */
    const char *record_prefix;   /* NULL = like torch.save: the file name without its last
                                  * extension ("m.pt" -> "m"), "archive" if that is empty */
    unsigned flags;              /* ckptio_torch_save_flags */
} ckptio_torch_save_options;

/* A tensor to add: a view of a storage of the writer. */
typedef struct ckptio_torch_tensor_spec {
    size_t storage;              /* from ckptio_torch_writer_storage() */
    ckptio_dtype dtype;          /* must equal the storage's unless the storage is untyped (U8) */
    uint32_t ndim;
    const int64_t *shape;
    const int64_t *stride;       /* NULL = C-contiguous; in elements, non-negative */
    uint64_t storage_offset;     /* in elements */
    int requires_grad;
    int is_parameter;            /* save as torch.nn.Parameter */
} ckptio_torch_tensor_spec;

/*! ckptio_torch_writer_create() / _destroy() : an empty writer (root None). */
CKPTIO_API ckptio_status ckptio_torch_writer_create(ckptio_torch_writer **out);
CKPTIO_API ckptio_status ckptio_torch_writer_destroy(ckptio_torch_writer *w);

/*! ckptio_torch_writer_storage() :
 * Declares a storage of `nbytes` bytes holding elements of `dtype`, saved
 * with location `location` (NULL = "cpu"), with its memory at `data` (may be
 * NULL until ckptio_torch_writer_bind). Tensors of dtypes that torch saves
 * through UntypedStorage (float8, uint16/32/64, complex32, ...) use a U8
 * storage or one of their own dtype. *id receives the storage's id. */
CKPTIO_API ckptio_status ckptio_torch_writer_storage(ckptio_torch_writer *w, ckptio_dtype dtype, uint64_t nbytes,
                                                     const char *location, const void *data,
                                                     ckptio_mem_kind mem_kind, size_t *id);

/*! ckptio_torch_writer_bind() : points storage `id` at new memory (same size)
 * for the next save, keeping the layout. */
CKPTIO_API ckptio_status ckptio_torch_writer_bind(ckptio_torch_writer *w, size_t id, const void *data,
                                                  ckptio_mem_kind mem_kind);

/*! ckptio_torch_writer_tensor() : a tensor node; the view must lie inside
 * its storage (CKPTIO_E_RANGE otherwise). */
CKPTIO_API ckptio_status ckptio_torch_writer_tensor(ckptio_torch_writer *w, const ckptio_torch_tensor_spec *spec,
                                                    ckptio_value **out);

/*! Scalar nodes. Strings are copied; str must be UTF-8. */
CKPTIO_API ckptio_status ckptio_torch_writer_none(ckptio_torch_writer *w, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_bool(ckptio_torch_writer *w, int v, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_int(ckptio_torch_writer *w, int64_t v, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_bigint(ckptio_torch_writer *w, const void *le_twos_complement,
                                                    size_t len, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_float(ckptio_torch_writer *w, double v, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_str(ckptio_torch_writer *w, const char *s, size_t len,
                                                 ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_bytes(ckptio_torch_writer *w, const void *data, size_t len,
                                                   ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_dtype(ckptio_torch_writer *w, ckptio_dtype dtype, ckptio_value **out);

/*! ckptio_torch_writer_container() : an empty LIST, TUPLE, SET or DICT
 * (ordered != 0: collections.OrderedDict, as module state_dicts are). */
CKPTIO_API ckptio_status ckptio_torch_writer_container(ckptio_torch_writer *w, ckptio_value_kind kind, int ordered,
                                                       ckptio_value **out);

/*! ckptio_torch_writer_append() : adds item to a LIST, TUPLE or SET. */
CKPTIO_API ckptio_status ckptio_torch_writer_append(ckptio_torch_writer *w, ckptio_value *seq, ckptio_value *item);

/*! ckptio_torch_writer_set_item() : adds key -> item to a DICT (keys are not
 * checked for duplicates: the last one wins in Python). */
CKPTIO_API ckptio_status ckptio_torch_writer_set_item(ckptio_torch_writer *w, ckptio_value *dict,
                                                      ckptio_value *key, ckptio_value *item);

/*! ckptio_torch_writer_set_root() : the object torch.load will return. */
CKPTIO_API ckptio_status ckptio_torch_writer_set_root(ckptio_torch_writer *w, ckptio_value *root);

/*! ckptio_torch_writer_layout() :
 * Computes (or reuses) the layout for `options` (NULL = defaults): the
 * pickle, record order and offsets. *file_size may be NULL. */
CKPTIO_API ckptio_status ckptio_torch_writer_layout(ckptio_torch_writer *w, const ckptio_torch_save_options *options,
                                                    uint64_t *file_size);

/*! ckptio_torch_writer_storage_offset() : after a layout, the file offset of
 * storage `id`'s bytes and its record key ("0", "1", ..., owned by the
 * writer); CKPTIO_E_NOT_FOUND for a storage no tensor uses (not saved). */
CKPTIO_API ckptio_status ckptio_torch_writer_storage_offset(const ckptio_torch_writer *w, size_t id,
                                                            uint64_t *offset, const char **key);

/*! ckptio_torch_save() :
 * Writes the writer's tree to `path` (atomically unless IN_PLACE): the
 * storages' bytes go straight from their memory (host or GPU) through the
 * engine. The CRC-32 of every storage (unless CKPTIO_TORCH_SAVE_NO_CRC) is
 * computed from its bytes as they pass through host memory on their way to
 * the file: the caller's memory for host storages, the pinned staging copy
 * for GPU storages (no second read of the device). On failure no file
 * exists under `path` and an older one is kept. */
CKPTIO_API ckptio_status ckptio_torch_save(ckptio_engine *engine, const char *path, ckptio_torch_writer *w,
                                           const ckptio_torch_save_options *options);

/*! ckptio_torch_save_tensors() :
 * Convenience: saves a flat OrderedDict name -> tensor (each tensor its own
 * storage, C-contiguous), like torch.save(dict_of_tensors). */
CKPTIO_API ckptio_status ckptio_torch_save_tensors(ckptio_engine *engine, const char *path,
                                                   const ckptio_tensor_source *tensors, size_t count,
                                                   const ckptio_torch_save_options *options);

/* ------------------------------------------------------------------------ */
/* Conversion between torch.save and safetensors                            */
/* ------------------------------------------------------------------------ */

/*! ckptio_torch_save_safetensors() :
 * Writes tensors of an open torch.save file (ckptio_torch_open) as a new
 * safetensors file at `path`, atomically: the file ckptio_safetensors_save
 * would write for them (names are the dotted paths; F4 shapes counted in
 * values; `metadata` and `flags` (CKPTIO_SAFETENSORS_ALIGN_8) as there).
 * `tensors` lists tensor indices (NULL: all, `count` ignored). Each tensor
 * is read through the handle's engine (strided views gathered) into one
 * buffer of the largest tensor's size and written before the next is read;
 * a view reaching more bytes than its storage holds (strides of 0, torch's
 * expand) is written in runs from its storage through an 8 MiB buffer
 * instead, so the buffer never exceeds what the file holds. Memory stays
 * bounded and the input is never memory-mapped, so an input
 * that shrinks meanwhile fails with CKPTIO_E_TRUNCATED naming it (never a
 * SIGBUS). On any failure nothing appears under `path` and an older file
 * there is kept. Views that share a storage are written as copies. */
CKPTIO_API ckptio_status ckptio_torch_save_safetensors(ckptio_torch *t, const char *path, const size_t *tensors,
                                                       size_t count, const ckptio_kv *metadata,
                                                       size_t metadata_count, unsigned flags);

/*! ckptio_safetensors_save_torch() :
 * Writes every tensor of an open safetensors file (ckptio_safetensors_open)
 * as a torch.save file at `path`, atomically: the file
 * ckptio_torch_save_tensors would write (a flat OrderedDict, one storage per
 * tensor; `options` as there). Tensors are read one at a time through the
 * handle's engine into one buffer of the largest tensor's size, CRC-32s
 * computed from it; the same guarantees as ckptio_torch_save_safetensors.
 * The __metadata__ is not carried (torch.save files have none). */
CKPTIO_API ckptio_status ckptio_safetensors_save_torch(ckptio_safetensors *st, const char *path,
                                                       const ckptio_torch_save_options *options);


/* ------------------------------------------------------------------------ */
/* DCP checkpoint directories                                               */
/* ------------------------------------------------------------------------ */
/* (docs/DCP.md "C API and CLI for DCP directories")
 * A whole torch.distributed.checkpoint directory, read without Python:
 * DIR/.metadata goes through the restricted unpickler
 * (ckptio_pickle_parse_dcp_metadata, ckptio_experimental.h) and becomes a table of tensors (global
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
 * decompresses through a fixed buffer (ckptio_zstd_stream in
 * ckptio_experimental.h; frames declaring more are refused from their
 * headers), by this library and by ckptio.dcp's FileSystemReader: a tensor
 * item holds
 * a torch.save archive of its chunk, so at most the chunk's bytes plus
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
 * says which, or how many). Data files are not opened yet.
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
 * the bytes were not compared with checksums. Errors as those two give. */
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
/* Checkpoint manager: the steps of a training run                          */
/* ------------------------------------------------------------------------ */
/* (docs/MANAGER.md)
 * A ROOT holds one DCP directory per saved step, named step_NNNNNNNN (the
 * step number in decimal, zero-padded to at least 8 digits; other names
 * are not steps and are left alone). A step is COMPLETE only once its
 * commit marker (CKPTIO_STEP_MARKER, written last, atomically, after the
 * step's files and the root are fsynced) names it; a marker that does not
 * parse, names another step, or whose step fails the check asked for is
 * DAMAGED. A step directory without a marker is PARTIAL when the manager
 * began it (CKPTIO_STEP_BEGUN, made before anything else is written into
 * it and removed last) or when it is empty: a save in progress, one that
 * crashed, or a removal that stopped half-way. Any other step directory is
 * FOREIGN: another writer's (torch's own DCP writer, a copy, a save of a
 * ckptio release that made no begun mark): listed with its reason, never
 * removed, never reused, never resumed from.
 * Removal only ever removes what the manager and the DCP writer make: the
 * whole directory is checked first (every entry a regular file under one
 * of their names, no subdirectory, nothing followed) and a directory
 * holding anything else is left whole, with the entry named.
 * A step whose bytes hold up (marker, sizes, checksums) but which ckptio's
 * reader refuses to load (a value outside the restricted unpickler's
 * allowlist, or over one of its limits: CKPTIO_E_DISALLOWED, _UNSUPPORTED,
 * _RANGE) is REFUSED: not damage, so nothing removes or replaces it.
 * Checks: CKPTIO_STEP_CHECK_MARKER reads only the marker; FAST also
 * compares .metadata with the size and XXH3-64 the marker recorded, parses
 * it and checks that every stored item lies inside its file (sizes, no
 * data read); FULL also hashes every byte against the ckptio manifest
 * (ckptio_dcp_verify; a step saved without checksums: ckptio_dcp_check).
 * Functions that change ROOT (begin, commit, remove,
 * clean, retain) expect the caller to hold ROOT's lock
 * (ckptio_dcp_lock_acquire(ROOT, NULL, CKPTIO_DCP_LOCK_QUEUED, ...)) so
 * that two managers, or `ckptio clean` and a save, never work on one root
 * at once; a reader pins the step it reads (ckptio_steps_pin) so that
 * retention leaves it for later. Failures name the step and the
 * operation: "step 100 (ROOT/step_00000100): commit: <cause>". */

/* The commit marker inside a step directory: three lines of text,
 * "ckptio-step 1\nstep N\nmetadata SIZE XXH3HEX\n". */
#define CKPTIO_STEP_MARKER ".ckptio-step"
/* The begun mark: an empty file ckptio_steps_begin creates in a new step
 * directory (durably) before anything is written into it. */
#define CKPTIO_STEP_BEGUN ".ckptio-step-begun"
/* The largest step number. */
#define CKPTIO_STEP_MAX 999999999999999999ull

typedef enum ckptio_step_state {
    CKPTIO_STEP_COMPLETE = 0,
    CKPTIO_STEP_PARTIAL = 1,
    CKPTIO_STEP_DAMAGED = 2,
    CKPTIO_STEP_FOREIGN = 3, /* no marker, no begun mark, not empty: not the manager's */
    CKPTIO_STEP_REFUSED = 4  /* intact, but ckptio's reader refuses a value in it */
} ckptio_step_state;

typedef enum ckptio_step_check {
    CKPTIO_STEP_CHECK_MARKER = 0, /* the marker only (no engine needed) */
    CKPTIO_STEP_CHECK_FAST = 1,   /* + .metadata against the marker, item bounds against file sizes */
    CKPTIO_STEP_CHECK_FULL = 2    /* + every byte against the manifest's XXH3-64 */
} ckptio_step_check;

typedef struct ckptio_step_info {
    uint64_t step;
    ckptio_step_state state;
    uint64_t bytes;      /* sizes of the regular files of the step directory */
    size_t files;        /* their count */
    char reason[1024];   /* PARTIAL / DAMAGED / FOREIGN / REFUSED: why, in one line; COMPLETE: "", or why removal
                          * leaves the step alone (it holds an entry the manager does not make) */
} ckptio_step_info;

/*! ckptio_steps_dir_name() : "step_%08llu" of `step` into out[0..cap)
 * (CKPTIO_E_RANGE when step > CKPTIO_STEP_MAX or it does not fit). */
CKPTIO_API ckptio_status ckptio_steps_dir_name(uint64_t step, char *out, size_t cap);

/*! ckptio_steps_scan() :
 * The step directories of ROOT, ascending, each classified at
 * CKPTIO_STEP_CHECK_MARKER (a directory without a marker is PARTIAL or
 * FOREIGN from what it holds) with its size. A missing ROOT has no steps
 * (*count = 0). Symlinks named like steps are not steps. Free *steps with
 * ckptio_steps_free. */
CKPTIO_API ckptio_status ckptio_steps_scan(const char *root, ckptio_step_info **steps, size_t *count);

/*! ckptio_steps_free() : frees a list of ckptio_steps_scan / _latest; accepts NULL. */
CKPTIO_API void ckptio_steps_free(ckptio_step_info *steps);

/*! ckptio_steps_check() :
 * Classifies step `step` of ROOT with `check` into *out (the state and
 * reason; the reason of a failed check is the check's error message). A
 * damaged step is a result, not a failure: CKPTIO_OK. Failures are bad
 * arguments (an engine is required for FAST and FULL), out of memory and
 * a step that does not exist (CKPTIO_E_NOT_FOUND). */
CKPTIO_API ckptio_status ckptio_steps_check(ckptio_engine *engine, const char *root, uint64_t step,
                                            ckptio_step_check check, ckptio_step_info *out);

/*! ckptio_steps_latest() :
 * The newest step of ROOT that is COMPLETE under `check` (*step); steps
 * newer than it go to *skipped (newest first, *nskipped of them, each with
 * its state and reason; free with ckptio_steps_free; both may be NULL).
 * No such step: CKPTIO_E_NOT_FOUND naming ROOT and how many were skipped. */
CKPTIO_API ckptio_status ckptio_steps_latest(ckptio_engine *engine, const char *root, ckptio_step_check check,
                                             uint64_t *step, ckptio_step_info **skipped, size_t *nskipped);

/*! ckptio_steps_begin() :
 * Before a save of `step`: creates ROOT (one level) if needed, removes the
 * PARTIAL steps (what crashed saves left; as ckptio_steps_clean), creates
 * the step directory and in it the begun mark (CKPTIO_STEP_BEGUN), the
 * directory and ROOT fsynced after, so the step is recognisably the
 * manager's before anything is written into it. A step directory that
 * holds a marker (complete or damaged), a FOREIGN one, or a partial one
 * that removal had to leave alone is never reused: CKPTIO_E_EXISTS saying
 * which. dir[0..cap) receives "ROOT/step_NNNNNNNN". */
CKPTIO_API ckptio_status ckptio_steps_begin(const char *root, uint64_t step, char *dir, size_t cap);

/*! ckptio_steps_commit() :
 * After the step's DCP save finished (every rank's data files and
 * .metadata committed): fsyncs the step directory and ROOT, then writes
 * the marker (temporary, fsync, rename, directory fsync: as
 * ckptio_dcp_write_file) recording .metadata's size and XXH3-64. The step
 * is COMPLETE from the rename on. No .metadata: CKPTIO_E_NOT_FOUND. */
CKPTIO_API ckptio_status ckptio_steps_commit(const char *root, uint64_t step);

/*! ckptio_steps_remove() :
 * Removes step `step` when it is the manager's (a marker, a begun mark, or
 * empty) and holds nothing else than the manager and the DCP writer make:
 * the whole directory is checked first, and a FOREIGN step, a
 * subdirectory, a symlink, a FIFO or a name they do not make inside leave
 * it whole (CKPTIO_E_UNSUPPORTED naming the entry; nothing is removed); a
 * step pinned by a reader (ckptio_steps_pin) too (CKPTIO_E_BUSY). Then,
 * in order: the begun mark is made if the step has none (a step of an
 * earlier release), the marker goes (the directory fsynced, so that a crash
 * can only leave a PARTIAL step, never a complete-looking one with files
 * missing), the other files, the begun mark last, the directory, ROOT
 * fsynced. A failure half-way says what was removed and what is left. */
CKPTIO_API ckptio_status ckptio_steps_remove(const char *root, uint64_t step);

/*! ckptio_steps_clean() :
 * Removes the PARTIAL steps of ROOT (ckptio_steps_remove); a partial step
 * that holds an entry removal refuses is left whole (ckptio_steps_scan's
 * reason names the entry); FOREIGN steps are never touched. *removed (may
 * be NULL; free with ckptio_steps_list_free) lists the removed steps,
 * *nremoved counts them (also after a failure: those removed before it). */
CKPTIO_API ckptio_status ckptio_steps_clean(const char *root, uint64_t **removed, size_t *nremoved);

/*! ckptio_steps_retain() :
 * Retention after a commit: of the steps holding a marker, keeps the
 * newest `keep_last` (0 = keep all), every step that is a multiple of
 * `keep_every` (0 = none), and always the newest step that passes the FAST
 * check (so damage to the newest steps never costs the last good one);
 * removes the others, oldest first. A step a reader pins, or one holding
 * an entry removal refuses, is kept this time. PARTIAL and FOREIGN steps
 * are not touched (see ckptio_steps_clean). *removed / *nremoved as for
 * ckptio_steps_clean. */
CKPTIO_API ckptio_status ckptio_steps_retain(ckptio_engine *engine, const char *root, uint64_t keep_last,
                                             uint64_t keep_every, uint64_t **removed, size_t *nremoved);

typedef struct ckptio_step_pin ckptio_step_pin;

/*! ckptio_steps_pin() :
 * A reader's hold on step `step` while it reads it: a shared flock on the
 * step's marker, which removal (retention, clean, replacement) asks for
 * exclusively first and so leaves a pinned step alone (retention removes
 * it at a later commit). CKPTIO_E_NOT_FOUND when the step has no marker
 * now or a removal holds it (pick another step). On a file system without
 * flock the pin holds nothing (the reader must cope with the step going
 * away). Readers never block a save: a pin takes no root lock. Release
 * with ckptio_steps_unpin. */
CKPTIO_API ckptio_status ckptio_steps_pin(const char *root, uint64_t step, ckptio_step_pin **out);

/*! ckptio_steps_unpin() : releases a pin (LOCK_UN, close); accepts NULL. */
CKPTIO_API void ckptio_steps_unpin(ckptio_step_pin *pin);

/*! ckptio_steps_list_free() : frees a list of step numbers; accepts NULL. */
CKPTIO_API void ckptio_steps_list_free(uint64_t *steps);


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
 * index, the tensor and the shards). The engine must outlive the handle,
 * which keeps the shards open until ckptio_model_close(). */
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

/*! ckptio_model_map() :
 * Maps shard `shard` of `model` (the whole file; a tensor is at
 * data + its file_offset). The file must still have the size it had at
 * open (else CKPTIO_E_STALE); s3:// objects cannot be mapped
 * (CKPTIO_E_UNSUPPORTED). The mapping outlives the model: release it with
 * ckptio_mapping_release(). Thread-safe against other calls on the model. */
CKPTIO_API ckptio_status ckptio_model_map(ckptio_model *model, size_t shard, ckptio_mapping **out);

/*! ckptio_torch_map() :
 * Maps the torch.save file of `t` (a storage is at data + its offset), as
 * ckptio_model_map() does. Handles made by ckptio_torch_parse() or for an
 * archive inside another file have none: CKPTIO_E_INVAL. */
CKPTIO_API ckptio_status ckptio_torch_map(ckptio_torch *t, ckptio_mapping **out);

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

/* ------------------------------------------------------------------------ */
/* Converting any checkpoint into any other                                 */
/* ------------------------------------------------------------------------ */
/* (docs/CLI.md "ckptio convert")
 * Every pair of these converts, in both directions and each into itself
 * (a re-layout, or resharding of a directory): a safetensors file, a
 * Hugging Face directory (or its *.index.json), a torch.save file and a
 * torch.distributed.checkpoint (DCP) directory. Tensors are read one at a
 * time (DCP output: in batches of at most max(largest tensor, 64 MiB))
 * through the engine, never memory-mapped, and written as their peers'
 * writers write them. What the output cannot hold (non-tensor values of a
 * torch.save file, byte items of a DCP directory going to a format without
 * them, __metadata__ going to a format without it) is named in notes before
 * anything is written; the tensors always arrive bit for bit. */

/* What ckptio_convert() writes. */
typedef enum ckptio_convert_to {
    CKPTIO_CONVERT_AUTO = 0,        /* decided by OUT's name, see ckptio_convert() */
    CKPTIO_CONVERT_SAFETENSORS = 1, /* one safetensors file */
    CKPTIO_CONVERT_HF = 2,          /* a Hugging Face directory: model.safetensors, or shards
                                     * model-0000k-of-0000n.safetensors + model.safetensors.index.json */
    CKPTIO_CONVERT_TORCH = 3,       /* a torch.save file: a flat OrderedDict name -> tensor */
    CKPTIO_CONVERT_DCP = 4          /* a DCP directory written as ckptio.dcp writes one (one process,
                                     * each tensor one chunk, with a checksum manifest) */
} ckptio_convert_to;

/* Receives one line (no newline) saying what OUT will not hold; called
 * before anything is written. The line may name tensors and keys taken from
 * the input: quote it before showing it on a terminal. */
typedef void (*ckptio_convert_note_fn)(const char *note, void *user);

typedef struct ckptio_convert_options {
    ckptio_convert_to to;
    uint64_t shard_size;            /* CKPTIO_CONVERT_HF: the largest shard in bytes; 0 = 5 GB (5 x 10^9),
                                     * huggingface_hub's default */
    uint32_t storage_alignment;     /* CKPTIO_CONVERT_TORCH: 1..65536; 0 = 4096 */
    ckptio_convert_note_fn note;    /* may be NULL */
    void *user;
} ckptio_convert_options;

/* What a conversion did. */
typedef struct ckptio_convert_report {
    ckptio_format from;             /* SAFETENSORS, TORCH, DCP or HF_INDEX (any Hugging Face directory) */
    ckptio_convert_to to;           /* what was written (AUTO resolved) */
    size_t tensors;
    uint64_t bytes;                 /* tensor bytes written */
    size_t files;                   /* files of tensor data written (shards, DCP data files; 1 for a file) */
    size_t byte_items;              /* DCP -> DCP: byte items carried */
    size_t dropped;                 /* values, byte items and __metadata__ entries OUT does not hold */
    size_t shared;                  /* torch.save input: tensors that shared a storage, written as copies */
} ckptio_convert_report;

/*! ckptio_convert() :
 * Converts the checkpoint at `in` (its format detected as
 * ckptio_format_detect() does; a directory without .metadata is opened as a
 * Hugging Face directory, ckptio_model_open) into `out`.
 * With CKPTIO_CONVERT_AUTO, OUT's name decides: "*.safetensors" a
 * safetensors file; "*.pt", "*.pth", "*.bin", "*.ckpt" a torch.save file;
 * a name ending in '/' or an existing directory a directory: the Hugging
 * Face layout for a DCP input, else CKPTIO_E_INVAL (say CKPTIO_CONVERT_HF or
 * CKPTIO_CONVERT_DCP); any other name the other kind of file (safetensors or
 * a Hugging Face directory -> torch.save, torch.save -> safetensors) or, for
 * a DCP input, a Hugging Face directory; shard_size > 0 means
 * CKPTIO_CONVERT_HF.
 * Checked before anything is written, each failing with a message that says
 * why: the input parses (its tensors' table), every dtype exists in OUT's
 * format (CKPTIO_E_UNSUPPORTED naming the tensor), a file OUT is not a
 * directory, a directory OUT does not exist or is empty (CKPTIO_E_EXISTS:
 * ckptio never writes into a directory holding other files). Output is
 * atomic: a file through a temporary renamed over OUT (an older file OUT is
 * replaced only on success); a directory is built in a new sibling
 * ".OUT.ckptio-tmp-XXXXXX" and renamed to OUT at the end (fsyncs with
 * CKPTIO_OPT_SYNC), removed on failure. `options` may be NULL, `report`
 * too. Thread-safe for distinct outputs. */
CKPTIO_API ckptio_status ckptio_convert(ckptio_engine *engine, const char *in, const char *out,
                                        const ckptio_convert_options *options, ckptio_convert_report *report);


#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_H */
