/*
 * common_internal.h - what every part of libckptio may use: error reporting,
 * allocation, small helpers. src/common depends on nothing else in ckptio.
 */
#ifndef CKPTIO_COMMON_INTERNAL_H
#define CKPTIO_COMMON_INTERNAL_H

#include "ckptio.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors ------------------------------------------------------------ */

/* Optional context of a failure; every field may be left zero/NULL. */
typedef struct ckptio__err_ctx {
    const char *operation;  /* "open", "pread", "parse", ... */
    const char *path;       /* file involved */
    int64_t file_offset;    /* -1 when not about a position; 0 is a real offset */
    const char *subject;    /* tensor name, field, record */
    int sys_errno;          /* appended as ": strerror(errno)" */
    int cuda_result;        /* CUresult, appended by the GPU layer's own text */
    /* The formatted text is the whole message: nothing is put in front of it
     * or appended (callers whose messages have a fixed shape of their own,
     * e.g. the DCP commit's "PATH: OPERATION: strerror (what it means)");
     * the fields are still recorded. */
    bool verbatim;
} ckptio__err_ctx;

/* Records a failure in the thread-local ckptio_error_info and returns
 * `status` so callers can `return ckptio__fail(...)`. The message is built as
 * "PATH: OPERATION at offset OFF: SUBJECT: <fmt...>: strerror" leaving out
 * what is absent. */
ckptio_status ckptio__fail(ckptio_status status, const char *src_file, int src_line,
                           const ckptio__err_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

ckptio_status ckptio__vfail(ckptio_status status, const char *src_file, int src_line,
                            const ckptio__err_ctx *ctx, const char *fmt, va_list ap);

/* Fails again with the current error's message and CUDA result, now placed
 * by `ctx` (file, offset, operation, subject; its cuda_result is replaced):
 * for a caller that passes on an error from below and knows where it
 * happened. */
ckptio_status ckptio__fail_again(ckptio_status status, const char *src_file, int src_line, ckptio__err_ctx ctx);

/* Plain failure with a formatted message. */
#define CKPTIO_FAIL(status, ...) ckptio__fail((status), __FILE__, __LINE__, NULL, __VA_ARGS__)

/* Failure with context: CKPTIO_FAIL_CTX(status, &(ckptio__err_ctx){...}, fmt, ...). */
#define CKPTIO_FAIL_CTX(status, ctx, ...) ckptio__fail((status), __FILE__, __LINE__, (ctx), __VA_ARGS__)

/* A failed system call: the status is derived from errno (ENOSPC -> E_NOSPC,
 * ENOENT -> E_NOT_FOUND, ...). */
#define CKPTIO_FAIL_SYS(err_, op_, path_, offset_, ...)                                   \
    ckptio__fail(ckptio__status_from_errno(err_), __FILE__, __LINE__,                       \
                 &(ckptio__err_ctx){.operation = (op_), .path = (path_),                    \
                                    .file_offset = (int64_t)(offset_), .sys_errno = (err_)},  \
                 __VA_ARGS__)

/* A failed system call reported in the shape of the commit protocols'
 * messages, "PATH: OPERATION: strerror (NOTE)": NOTE says what was being
 * done and what the failure leaves behind ("...; NAME is unchanged"). The
 * status comes from errno as with CKPTIO_FAIL_SYS. */
#define CKPTIO_FAIL_SYS_NOTE(err_, op_, path_, ...) \
    ckptio__fail_sys_note(__FILE__, __LINE__, (err_), (op_), (path_), __VA_ARGS__)
ckptio_status ckptio__fail_sys_note(const char *src_file, int src_line, int err, const char *operation,
                                    const char *path, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Return `status` with a message if `cond` holds. */
#define CKPTIO_RETURN_IF(cond, status, ...)            \
    do {                                               \
        if (cond) return CKPTIO_FAIL((status), __VA_ARGS__); \
    } while (0)

/* Propagate a failure (its error record is already set). */
#define CKPTIO_FORWARD(expr)                    \
    do {                                        \
        ckptio_status ckptio_fwd_ = (expr);     \
        if (ckptio_fwd_ != CKPTIO_OK) return ckptio_fwd_; \
    } while (0)

ckptio_status ckptio__status_from_errno(int err);

/* Saves and restores the calling thread's error record, for cleanup paths
 * that may fail themselves but must not overwrite the first error. */
typedef struct ckptio__error_saved ckptio__error_saved;
ckptio__error_saved *ckptio__error_save(void);
void ckptio__error_restore(ckptio__error_saved *saved);

/* ---- memory ------------------------------------------------------------ */

/* All library allocations go through these, so tests can inject failures. */
void *ckptio__malloc(size_t size);
void *ckptio__calloc(size_t count, size_t size);
void *ckptio__realloc(void *ptr, size_t size);
void ckptio__free(void *ptr);
char *ckptio__strdup(const char *s);
/* Aligned allocation (alignment a power of two >= sizeof(void*)); free with ckptio__free. */
void *ckptio__aligned_alloc(size_t alignment, size_t size);

/* Test hook: fail the n-th allocation from now (0 = never). */
void ckptio__alloc_fail_after(uint64_t n);

/* ---- arithmetic -------------------------------------------------------- */

static inline bool ckptio__add_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool ckptio__mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline uint64_t ckptio__align_down(uint64_t v, uint64_t a) { return v - v % a; }
static inline uint64_t ckptio__align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* qsort_r, skipped when base[0..n) is in order already (n - 1 comparisons):
 * plans built from a tensor's slice (one extent per row) arrive sorted, and
 * a column slice can have 700k rows (util.c). */
void ckptio__sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *, void *), void *arg);

/* Monotonic seconds. */
double ckptio__now(void);

/* Whether the program asked the library to stop (ckptio_interrupt,
 * interrupt.c): a loop that retries EINTR gives up instead, and transfers
 * cancel. */
bool ckptio__interrupt_requested(void);

/* zlib's CRC-32 of `len` bytes (any length: zlib's crc32 takes an unsigned
 * int, so longer buffers go in 1 GiB pieces) (hash.c). */
uint32_t ckptio__crc32(const void *data, uint64_t len);

/* ---- names (names.c) --------------------------------------------------- */

/* Longest file name component (NAME_MAX of Linux file systems). Names that
 * ckptio derives from a file's name are kept within it. */
#define CKPTIO__NAME_MAX 255

/* Writes to `out` (room for max + 1 bytes, max >= 17) `name` itself when it
 * has at most `max` bytes, else a stand-in of exactly `max` bytes or fewer:
 * the name's first bytes (cut between UTF-8 characters), '~' and the
 * XXH3-64 of the whole name as 16 lowercase hex digits. Deterministic: the
 * same name always gives the same stand-in. Returns the length written. */
size_t ckptio__bounded_name(const char *name, size_t max, char *out);

/* Fills buf with `len` random bytes: getrandom(), else (no syscall, no
 * entropy yet) a time/pid/counter mix, distinct between processes but not
 * unpredictable. */
void ckptio__random_bytes(void *buf, size_t len);

/* ---- dtype ------------------------------------------------------------- */

/* Rank used by the safetensors reference writer's order (higher first). */
int ckptio__dtype_safetensors_rank(ckptio_dtype dtype);

/* Bytes taken by `numel` elements of `dtype`, with overflow and bit-divisibility
 * checks. Returns false on overflow or when numel*bits is not a multiple of 8. */
bool ckptio__dtype_nbytes(ckptio_dtype dtype, uint64_t numel, uint64_t *out);

/* ---- fork (fork.c) ----------------------------------------------------- */

/* How many fork()s separate this process from the one that loaded the
 * library (0 there, +1 in each child). State that threads, locks, rings or
 * a device make process-specific records the generation it was made in and
 * rebuilds itself at its next use where ckptio__forked_since() says so. */
unsigned ckptio__fork_generation(void);
bool ckptio__forked_since(unsigned made_in);

/* Serialises those rebuilds; consistent in a child whatever the parent's
 * threads were doing (the fork handlers hold it across fork()). */
/* pthread_create() of a library thread: every signal a process is sent is
 * blocked in it, so that the application's handlers run on its own threads;
 * not those a fault raises on the faulting thread (SIGBUS of a mapped file
 * that shrank, which file_map.c's guards catch; SIGSEGV, SIGFPE, SIGILL),
 * which the kernel would otherwise turn into a kill. Returns its error. */
int ckptio__thread_start(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

void ckptio__fork_rebuild_lock(void);
void ckptio__fork_rebuild_unlock(void);

/* ---- environment ------------------------------------------------------- */

/* Parses "123", "64K", "8M", "8MiB", "1G", "2GB" into bytes (binary units).
 * Returns false if malformed. */
bool ckptio__parse_size(const char *text, uint64_t *out);

#endif /* CKPTIO_COMMON_INTERNAL_H */
