/*
 * ckptio/core.h - the core of libckptio's API: version, errors, dtypes,
 * memory kinds, the engine and its settings, files, plans, the tensor types
 * every format shares, hashing.
 *
 * ckptio moves tensor checkpoints between host or GPU memory and storage at the
 * speed of the disk, in the formats PyTorch users already have (safetensors,
 * torch.save zip files, torch.distributed.checkpoint directories).
 *
 * The data path is: tensor list -> format layout -> plan -> engine -> backend
 * -> file, and back. The format-level functions (ckptio_safetensors_*,
 * ckptio_torch_*, ...) are in the other headers of include/ckptio/; the
 * plan and engine layer declared here is for callers with their own layouts.
 *
 * Stable: this is the one header declared stable before ckptio 1.0. Its
 * functions, types and values change only with a deprecation first; values
 * of its enums are pinned. The other headers are experimental (docs/API.md).
 *
 * Conventions that hold for every function of every ckptio header:
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
#ifndef CKPTIO_CORE_H
#define CKPTIO_CORE_H

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
    CKPTIO_OPT_STAGING_BYTES,      /* bound on bounce/pinned staging memory, all workers together;
                                      CKPTIO_STAGING_BYTES */
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
    CKPTIO_OPT_S3_LEASE_MS,        /* a directory's save lease lapses this long after its holder stops renewing it;
                                      CKPTIO_S3_LEASE_MS */
    CKPTIO_OPT_WRITE_CACHE,        /* ckptio_write_cache; CKPTIO_WRITE_CACHE=auto|on|off */
    CKPTIO_OPT_S3_BUFFERS_KEEP_MS, /* upload part buffers no upload uses are kept this long for the next one
                                      (0: freed at once); CKPTIO_S3_BUFFERS_KEEP_MS */
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

/*! ckptio_interrupt() :
 * For a program's SIGINT/SIGTERM handler (async-signal-safe): on != 0 asks
 * every ckptio call of the process, running or started later, to stop.
 * Transfers cancel at their next progress check (CKPTIO_E_CANCELED, at most
 * ~10 ms apart; a save leaves the older file and no temporary), and a system
 * call that a signal interrupted (EINTR) fails with CKPTIO_E_CANCELED naming
 * the call and the file instead of being retried. on == 0 withdraws the
 * request. Without it, EINTR is retried as SA_RESTART would. What the kernel
 * holds (an fsync, a read from a hung network file system) ends when the
 * kernel returns (docs/CLI.md "Signals"). */
CKPTIO_API ckptio_status ckptio_interrupt(int on);

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
/* Hashing                                                                  */
/* ------------------------------------------------------------------------ */

/*! ckptio_hash_xxh3() :
 * XXH3-64 (seed 0, the value of xxhash's XXH3_64bits and of Python's
 * xxhash.xxh3_64_intdigest) of `len` bytes of host memory at `data`.
 * Thread-safe. @return CKPTIO_OK, or CKPTIO_E_INVAL for a NULL out, or
 * NULL data with len > 0. */
CKPTIO_API ckptio_status ckptio_hash_xxh3(const void *data, size_t len, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_CORE_H */
