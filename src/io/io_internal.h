/*
 * io_internal.h - files and the I/O backends (src/io).
 *
 * A ckptio_file holds up to two descriptors for one open file: a buffered one
 * (always) and an O_DIRECT one (opened on first need, where the file system
 * accepts it). The backends move bytes for one "operation" (ckptio__io_op):
 * one contiguous range, one descriptor, one buffer. They retry EINTR and
 * resume short transfers themselves and report the outcome on the operation;
 * turning an outcome into an error message is the engine's job, because only
 * it knows the extent.
 */
#ifndef CKPTIO_IO_INTERNAL_H
#define CKPTIO_IO_INTERNAL_H

#include "common_internal.h"
#include "objstore_internal.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Alignment O_DIRECT needs for offsets, lengths and buffer addresses. */
#define CKPTIO_DIRECT_ALIGN 4096u

/* Whether a transfer of len bytes at offset from or to buf could use
 * O_DIRECT: all three CKPTIO_DIRECT_ALIGN-aligned. */
static inline bool ckptio__direct_aligned(const void *buf, uint64_t len, uint64_t offset) {
    return (uintptr_t)buf % CKPTIO_DIRECT_ALIGN == 0 && offset % CKPTIO_DIRECT_ALIGN == 0 &&
           len % CKPTIO_DIRECT_ALIGN == 0;
}

/* ---- the engine a file belongs to (engine_link.c) ------------------------
 * src/io sits below src/engine and calls nothing of it. A file keeps the
 * engine it was opened with as an opaque pointer and reaches it through
 * this table, which src/engine registers when it creates an engine, so
 * before any file can be opened. */
typedef struct ckptio__engine_link {
    /* The value of a (valid) setting. */
    int64_t (*setting)(const ckptio_engine *engine, ckptio_option option);
    /* Adds to the engine's counters (thread-safe; non-zero fields matter). */
    void (*stats_add)(ckptio_engine *engine, const ckptio_stats *delta);
    /* Files opened with the engine: +1 at open, -1 at close
     * (ckptio_engine_destroy() refuses while any is open). */
    void (*file_ref)(ckptio_engine *engine, int delta);
    /* A commit that waits for the server: whether to go on (CKPTIO_OK) or
     * stop (CKPTIO_E_CANCELED, the progress callback's answer). */
    ckptio_status (*commit_poll)(ckptio_engine *engine);
    /* The engine's pool of upload part buffers, created on first need and
     * destroyed with the engine; NULL when it cannot be created (uploads
     * then allocate their own). */
    ckptio__s3_part_pool *(*part_pool)(ckptio_engine *engine);
    /* The engine's slot for the object a probe opened (object_file.c):
     * NULL or a record that ckptio__object_peek_free releases. */
    _Atomic(struct ckptio__object_peek *) *(*peek_slot)(ckptio_engine *engine);
} ckptio__engine_link;

/* Registers the table (the same one every time; thread-safe). */
void ckptio__io_set_engine_link(const ckptio__engine_link *link);

/* The registered table's functions, for src/io. */
int64_t ckptio__io_engine_setting(const ckptio_engine *engine, ckptio_option option);
void ckptio__io_engine_stats_add(ckptio_engine *engine, const ckptio_stats *delta);
void ckptio__io_engine_file_ref(ckptio_engine *engine, int delta);
ckptio_status ckptio__io_engine_commit_poll(ckptio_engine *engine);
ckptio__s3_part_pool *ckptio__io_engine_part_pool(ckptio_engine *engine);
_Atomic(struct ckptio__object_peek *) *ckptio__io_engine_peek_slot(ckptio_engine *engine);

/* ---- files ------------------------------------------------------------- */

/* An s3:// object opened as a file (object_file.c). */
typedef struct ckptio__object ckptio__object;

struct ckptio_file {
    ckptio_engine *engine;
    char *path;             /* final name, as given */
    char *tmp_path;         /* temporary name of an atomic write, or NULL */
    char *dir_path;         /* directory of `path` (for its fsync), or NULL */
    char *mode_from;        /* file whose mode the commit copies; NULL: `path` */
    unsigned flags;         /* ckptio_open_flags */
    int fd;                 /* buffered descriptor; -1 while released */
    int direct_fd;          /* O_DIRECT descriptor, or -1 */
    dev_t dev;              /* the inode opened for reading, which a reopen */
    ino_t ino;              /* after ckptio__file_release() must find again */
    uint64_t opened_size;   /* its size then (the read policy's, while released) */
    /* 0: O_DIRECT not tried yet; 1: open; -1: refused by the file system.
     * Guarded by `lock`; read with acquire ordering by workers. */
    _Atomic int direct_state;
    int direct_errno;       /* why O_DIRECT was refused */
    /* Cold reads (read_policy.c): 1 through the page cache, -1 O_DIRECT,
     * 0 not decided yet; 2 and -2 held by a read of several plans. Set by
     * the caller's thread before workers run. */
    _Atomic int read_cache;
    /* Writes (read_policy.c, the write half): 1 through the page cache, -1
     * O_DIRECT, 0 not decided yet. Set by the caller's thread before workers run. */
    _Atomic int write_cache;
    /* On tmpfs or ramfs (page_cache.c): 1 yes, -1 no, 0 not asked yet. */
    _Atomic int in_memory;
    bool writable;          /* opened with CKPTIO_OPEN_WRITE */
    bool created;           /* IN_PLACE write that created the file */
    bool committed;         /* ckptio_file_commit() succeeded */
    bool closed_for_write;  /* commit done or failed half-way: no more writes */
    bool sync_owed;         /* handed over by ckptio_file_commit_unreferenced(CKPTIO_COMMIT_SYNC_LATER): a
                             * local file renamed, the fsyncs of its data and name left to
                             * ckptio_dcp_commit(); an object whose last parts still upload, its completion
                             * left to ckptio_dcp_commit() */
    pthread_mutex_t lock;
    /* Writes to a file on tmpfs or ramfs take turns (ckptio__file_op_init):
     * the kernel lets one writer of an inode in at a time anyway, and its
     * waiters spin, so more writers only burn CPU for the same speed
     * (docs/ENGINE.md#write-turns). */
    pthread_mutex_t write_turn;
    /* s3://BUCKET/KEY: the object behind the file, NULL for a local file.
     * An object file has no descriptors (fd and direct_fd are -1); every
     * transfer and the commit go through object_file.c. */
    ckptio__object *object;
};

/* Blocking, complete transfer of [offset, offset + len) between `file` and
 * the host buffer `buf`: retries EINTR and short transfers, uses O_DIRECT
 * when buf, offset and len are CKPTIO_DIRECT_ALIGN-aligned and the file has
 * a direct descriptor, buffered I/O otherwise. Reads past end of file fail
 * with CKPTIO_E_TRUNCATED. Safe to call from several threads at once on one
 * file. Errors name the file, operation and offset. Updates engine stats. */
ckptio_status ckptio__file_io(ckptio_file *file, ckptio_direction dir, void *buf, uint64_t len,
                              uint64_t offset);

/* ckptio_file_open, where a CKPTIO_OPEN_IN_PLACE write that creates the
 * file creates it with `create_mode` (& ~umask, by the kernel) instead of
 * 0666. */
ckptio_status ckptio__file_open_created(ckptio_engine *engine, const char *path, unsigned flags, mode_t create_mode,
                                        ckptio_file **out);

/* The engine a file was opened with. */
ckptio_engine *ckptio__file_engine(const ckptio_file *file);

/* Opens the O_DIRECT descriptor if the engine's direct mode asks for it and
 * it was not tried yet (a file opens it at open in mode ON only, so that a
 * file read through the page cache holds one descriptor). Returns CKPTIO_OK
 * also when the file system refuses O_DIRECT in AUTO mode (the file then
 * stays buffered); in ON mode a refusal is CKPTIO_E_UNSUPPORTED naming the
 * file. Reopens a released file first. Call from the caller's thread. */
ckptio_status ckptio__file_prepare_direct(ckptio_file *file);

/* The O_DIRECT descriptor for transfers now, or -1 (not open, refused, or
 * the engine's direct mode is OFF). */
int ckptio__file_direct_fd(const ckptio_file *file);

/* Checks that `file` accepts transfers in direction `dir` (writes need an
 * uncommitted write file) and opens its descriptor again if it was released
 * (ckptio__file_acquire). `subject` (may be NULL) goes into the error, e.g.
 * "extent 3". Caller's thread, before any worker uses the file. */
ckptio_status ckptio__file_check_transfer(ckptio_file *file, ckptio_direction dir, const char *subject);

/* Closes the descriptors of a file opened for reading and keeps the rest
 * (path, the inode, what the read policy decided); the next use reopens it
 * (ckptio__file_acquire). A reader of many files (a model of many shards)
 * thereby holds a bounded number of descriptors. No transfer of the file
 * may be in flight; a file opened for writing is left as it is. */
void ckptio__file_release(ckptio_file *file);

/* Opens a released file again: the same inode (a name replaced meanwhile
 * fails with CKPTIO_E_DISALLOWED naming it), through the one open of a
 * checkpoint's files (open_regular.c). CKPTIO_OK at once when it is open.
 * Caller's thread, before any worker uses the file. */
ckptio_status ckptio__file_acquire(ckptio_file *file);

/* Whether `file` holds its descriptor now (not released). */
bool ckptio__file_is_open(const ckptio_file *file);

/* How many of its files a reader of `nfiles` files (a model's shards, a DCP
 * directory's data files) keeps open at once: 0 (all of them) when nfiles
 * is at most min(256, RLIMIT_NOFILE / 16), else that bound (at least 4).
 * Each open file takes one descriptor, two while O_DIRECT is in use. */
size_t ckptio__file_window(size_t nfiles);

/* Makes the commit of an atomic write take mode and owner from `path`
 * instead of the file it replaces (a manifest follows its data file). */
ckptio_status ckptio__file_set_mode_source(ckptio_file *file, const char *path);

/* For error messages: " (temporary NAME)" for an atomic write, else "". */
const char *ckptio__file_tmp_note(const ckptio_file *file, char *buf, size_t cap);

/* True when at least half of the pages of [offset, offset + len) of `fd`
 * are in the page cache (cachestat(2), else mincore(2)); false when unknown.
 * Reads in DIRECT=AUTO mode then go through the page cache instead of
 * O_DIRECT, which would fetch cached data from the disk again. */
bool ckptio__range_cached(int fd, uint64_t offset, uint64_t len);

/* How many of the pages of [offset, offset + len) the page cache holds
 * (*cached of *pages); false when that cannot be told (then nothing is
 * written). */
bool ckptio__range_cached_pages(int fd, uint64_t offset, uint64_t len, uint64_t *cached, uint64_t *pages);

/* True when `f` lives on a memory file system (tmpfs, ramfs): all its data
 * is in memory, so reads never ask the page cache per range there. Asked
 * once per file (fstatfs), then remembered; thread-safe. */
bool ckptio__file_in_memory(ckptio_file *f);

/* ---- cold reads: page cache or O_DIRECT (read_policy.c) ---------------- */

/* Whether cold reads of files that together take `footprint` bytes go
 * through the page cache, by the engine's CKPTIO_OPT_READ_CACHE (AUTO: at
 * most a quarter of MemAvailable). */
bool ckptio__read_policy_cache(const ckptio_engine *engine, uint64_t footprint);

/* Decides for a read plan: the sizes of its distinct files are the
 * footprint; the answer is stored on each file, unless every file holds
 * the decision of a read that spans several plans (ckptio__read_policy_hold).
 * Caller's thread, before any worker runs. */
void ckptio__read_policy_apply(ckptio_engine *engine, const ckptio_extent *ext, size_t count);

/* Decides once for a read made of several plans (a model read a window of
 * shards at a time), as ckptio_engine_execute would for one plan of all the
 * extents (`total` bytes), and holds the answer on each file until
 * ckptio__read_policy_unhold(), so the plans' own decisions keep it. */
void ckptio__read_policy_hold(ckptio_engine *engine, const ckptio_extent *ext, size_t count, uint64_t total);
void ckptio__read_policy_unhold(const ckptio_extent *ext, size_t count);

/* Should a read of [offset, offset + len) of `f` that could use O_DIRECT
 * (CKPTIO_DIRECT_AUTO) go through the page cache? True when the file's
 * cold reads do (decided by its plan, else now by its own size) or when the
 * page cache already holds most of the range (ckptio__range_cached). */
bool ckptio__read_buffered(ckptio_file *f, uint64_t offset, uint64_t len);

/* Decides for a write plan whether its files are written through the page
 * cache (CKPTIO_OPT_WRITE_CACHE; AUTO: their sizes together at most
 * CKPTIO__WRITE_CACHE_MAX and a quarter of MemAvailable); the answer is
 * stored on each file. Caller's thread, before any worker runs, after the
 * files were sized. */
void ckptio__write_policy_apply(ckptio_engine *engine, const ckptio_extent *ext, size_t count);

/* Largest write plan (its files together) AUTO writes through the page cache. */
#define CKPTIO__WRITE_CACHE_MAX ((uint64_t)128 << 20)

/* Should a write to `f` that could use O_DIRECT (CKPTIO_DIRECT_AUTO) go
 * through the page cache? What its plan decided; outside a plan, by the
 * file's own size. */
bool ckptio__write_buffered(ckptio_file *f);

/* MemAvailable of /proc/meminfo in bytes; 0 when unknown. */
uint64_t ckptio__mem_available(void);

/* Calls of ckptio__mem_available() (for tests). */
extern _Atomic uint64_t ckptio__mem_available_lookups;

/* Test hook: ckptio__mem_available() answers `bytes` (0: the real value). */
void ckptio__read_policy_set_mem_available(uint64_t bytes);

/* ---- files mapped into memory (file_map.c) ---------------------------- */

/* Maps all of `file` (a local file open for reading) privately: readable,
 * writable copy-on-write, the file never written. `expect_size` is the size
 * the caller validated at open; a file of another size now is
 * CKPTIO_E_STALE (a released file is opened again first). The mapping is
 * registered for the checks below and holds no descriptor: it outlives
 * `file`. */
ckptio_status ckptio__file_map(ckptio_file *file, uint64_t expect_size, ckptio_mapping **out);

/* CKPTIO_E_TRUNCATED naming the file when part of [memory, memory + length)
 * lies in a registered mapping whose file no longer holds those bytes (one
 * atomic load when nothing is mapped). `subject` (may be NULL) names what
 * the memory is ("extent 3"). */
ckptio_status ckptio__mapped_check(const void *memory, uint64_t length, const char *subject);

/* Records CKPTIO_E_TRUNCATED for a SIGBUS at `address`, naming the mapped
 * file and offset when ckptio mapped it. */
ckptio_status ckptio__mapped_lost(const void *address, const char *subject);

/* Installs the SIGBUS handler of the guards below (once per process). */
ckptio_status ckptio__mapped_guard_install(void);

/* memcpy(dst, src, n), or CKPTIO_E_TRUNCATED (ckptio__mapped_lost) when a
 * page of either side is gone from a truncated mapped file. */
ckptio_status ckptio__guarded_copy(void *dst, const void *src, size_t n, const char *subject);

/* fn(arg), which reads [memory, memory + length) and nothing else that may
 * be mapped, or CKPTIO_E_TRUNCATED as above (fn is abandoned half-way: it
 * must hold no lock and own nothing while it touches that memory). */
ckptio_status ckptio__guarded_call(void (*fn)(void *arg), void *arg, const void *memory, uint64_t length,
                                   const char *subject);

/* ---- opening what a checkpoint names (open_regular.c) ------------------ */

/* The one way to open an existing file whose name comes from a checkpoint
 * (markers, .metadata, manifests, data files, indexes, shards, lock files,
 * temporaries): a FIFO, device, socket or directory under the name is
 * refused without being opened (no wait, no driver's open runs). */

/* "a FIFO", "a directory", "a character device", ... for messages. */
const char *ckptio__file_type_name(mode_t mode);

/* Opens `path` (relative to `dirfd` as openat(2) does; AT_FDCWD) with
 * O_PATH (O_NOFOLLOW from `flags`: a symlink is then the object itself) and
 * fstat()s it into *sb: no driver's open runs, nothing waits. The
 * descriptor serves fstatat() and ckptio__reopen_regular(); -1 with errno
 * on failure. */
int ckptio__open_path(int dirfd, const char *path, int flags, struct stat *sb);

/* Opens for I/O the regular file `path_fd` (an O_PATH descriptor of
 * dirfd/path whose fstat is *sb) with the access mode of `flags` (O_RDONLY,
 * O_RDWR), O_CLOEXEC, blocking: through /proc/self/fd, else by name
 * (O_NOFOLLOW from `flags`). -1 with errno on failure, ESTALE when what
 * opened is no longer the inode of *sb. */
int ckptio__reopen_regular(int path_fd, int dirfd, const char *path, int flags, const struct stat *sb);

/* Both: the descriptor and *sb, or -1 with errno. A name that is not a
 * regular file gives -1 with *type its S_IFMT type (errno ELOOP for a
 * symlink under O_NOFOLLOW, EISDIR, else EINVAL); *type is 0 otherwise. */
int ckptio__open_regular(int dirfd, const char *path, int flags, struct stat *sb, mode_t *type);

/* The same with the failure recorded: "PATH: open: is a FIFO, not a regular
 * file (NOTE): refused without opening it" with status `refuse`, or the
 * errno's status and text. `note` (may be NULL) says what the file is opened
 * for; `sb` may be NULL. */
ckptio_status ckptio__open_regular_or_fail(const char *path, int flags, ckptio_status refuse, const char *note,
                                           int *fd, struct stat *sb);

/* ---- the kernel's small status files (kernel_files.c) ------------------ */

/* Reads up to cap - 1 bytes of the file at `path` into buf, NUL-terminated
 * (several reads until EOF or a full buffer, EINTR retried; no allocation);
 * the byte count, or -1 when it cannot be opened or read. */
ssize_t ckptio__read_kernel_file(const char *path, char *buf, size_t cap);

/* ---- transparent huge pages without a stall (huge_pages.c) ------------- */

/* The size of a transparent huge page on x86-64 (a PMD). */
#define CKPTIO_HUGE_PAGE_BYTES ((size_t)2 << 20)

/* Bytes in free blocks of order >= min_order in /proc/buddyinfo text `text`
 * (NUL-terminated; lines "Node N, zone NAME c0 c1 ...", one count of free
 * blocks of page_bytes << order per order), summed over every node and
 * zone. Lines of another form count for nothing, and so does a last line
 * without its newline (cut short: its last count may be too). Pure: the
 * tests give it kernels' texts. */
uint64_t ckptio__buddyinfo_free_bytes(const char *text, size_t page_bytes, unsigned min_order);

/* Bytes the kernel holds in free blocks of 2 MiB or more, from
 * /proc/buddyinfo: what faults in MADV_HUGEPAGE memory can take without
 * compacting memory first (THP's `defrag` in `madvise` mode would stall
 * them for that). 0 when unreadable. */
uint64_t ckptio__huge_page_bytes_free(void);

/* Whether advising memory for transparent huge pages can get them:
 * /sys/kernel/mm/transparent_hugepage/enabled is [always] or [madvise]
 * (not [never], not missing). */
bool ckptio__huge_pages_advisable(void);

/* Test hook: the two functions above read these files instead (NULL: the
 * real /proc/buddyinfo and /sys/kernel/mm/transparent_hugepage/enabled).
 * The strings are not copied: they must stay valid until the next call. */
void ckptio__huge_pages_set_sources(const char *buddyinfo_path, const char *thp_enabled_path);

/* ---- temporaries (temporaries.c) -------------------------------------- */

/* The part of a temporary's name after ".STEM": ".STEM" + this + 6 random
 * characters from [A-Za-z0-9]. */
#define CKPTIO__TMP_MARK ".ckptio-tmp-"

/* Longest STEM: a temporary's name stays within CKPTIO__NAME_MAX. */
#define CKPTIO__TMP_STEM_MAX (CKPTIO__NAME_MAX - 1 - (sizeof CKPTIO__TMP_MARK - 1) - 6)

/* The STEM of the temporaries of file name `name` (at most
 * CKPTIO__NAME_MAX bytes): `name` itself up to CKPTIO__TMP_STEM_MAX (236)
 * bytes, else its ckptio__bounded_name() stand-in of that length. */
void ckptio__temporary_stem(const char *name, char out[CKPTIO__NAME_MAX + 1]);

/* Attempts at a free temporary name before giving up with EEXIST. */
#define CKPTIO__TMP_TRIES 100

/* Creates the temporary ".STEM.ckptio-tmp-XXXXXX" of file name `name` in
 * `dir` (O_RDWR|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, `mode`, which the umask
 * may narrow) and flocks it, so that cleaners (ckptio_cleanup_temporaries)
 * know a live writer holds it until its descriptor is closed. Returns 0
 * with *fd and *path (ckptio__malloc'ed); else the errno of the failure
 * (EEXIST: no free name after CKPTIO__TMP_TRIES tries) with *fd = -1 and
 * *path the last name tried (the caller frees it; NULL when out of memory). */
int ckptio__temporary_create(const char *dir, const char *name, mode_t mode, int *fd, char **path);

/* The lock file inside a directory temporary: a directory output (a
 * conversion's) is built in ".STEM.ckptio-tmp-XXXXXX/" beside its final
 * name, and its builder holds flock(LOCK_EX) on this file while it works. */
#define CKPTIO__TMP_DIR_LOCK ".ckptio-tmp-dir.lock"

/* Creates the directory temporary of the path `out` (its STEM from out's
 * last component) beside it, 0777 & ~umask, with its lock file created and
 * flocked: cleaners remove the directory only once they can lock that file
 * (its builder died). Returns 0 with tmp[0..cap) and *lock_fd (closed by the
 * caller once the directory is renamed into place or removed), else errno
 * (EEXIST: no free name). */
int ckptio__temporary_dir_create(const char *out, char *tmp, size_t cap, int *lock_fd);

/* Right before the directory temporary `tmp` is renamed into place: its
 * lock file is unlinked (the caller still holds the lock through its
 * descriptor), so the output carries no trace of it; a cleaner never
 * removes a directory without the file. Returns 0 or errno. */
int ckptio__temporary_dir_unlock(const char *tmp);

/* Slots of an atomic save's temporary: ".STEM.ckptio-tmp-000000" to
 * "-000003", taken in order (a slot is held by a live save of the same NAME). */
#define CKPTIO__TMP_SLOTS 4

/* The temporary of an atomic save of file name `name` in `dir`, as
 * ckptio__temporary_create makes one (same arguments and results), in the
 * first free slot: a killed save's temporary is then found by name, without
 * listing the directory. The stale temporaries of `name` (see
 * ckptio_cleanup_temporaries) are removed, with one listing, when a slot is
 * taken or a later slot than the one used exists: what a killed save leaves.
 * With every slot held by a live save, a random name. The removals are best
 * effort (errors ignored, the error record left alone) and made durable by
 * the commit's directory fsync. */
int ckptio__temporary_create_for_save(const char *dir, const char *name, mode_t mode, int *fd, char **path);

/* Listings made by ckptio__temporary_create_for_save (for tests). */
extern _Atomic uint64_t ckptio__temporary_sweeps;

/* ---- attributes of a saved file (inherit_mode.c) --------------------- */

/* The mode to create the temporary that will replace `path` with: the
 * permission bits of the regular file `path` resolves to, or 0666 when
 * there is none (the umask applies either way). ckptio_inherit_mode() then
 * sets owner, group and exact bits at commit. */
mode_t ckptio__inherited_create_mode(const char *path);

/* The attributes a file written into `dir` takes from the file `name` in it
 * (the metadata file a DCP save replaces): lstat of DIR/NAME, true when it
 * is a regular file (a symlink, a missing or NULL name: false, no
 * reference: new files get 0666 & ~umask). */
bool ckptio__reference_stat(const char *dir, const char *name, struct stat *out);

/* What ckptio_inherit_mode() does with the attributes `old` of the file
 * `path` (named in errors) that the file open as `fd` replaces. */
ckptio_status ckptio__inherit_from(int fd, const struct stat *old, const char *path);

/* ---- operations -------------------------------------------------------- */

/* One contiguous transfer handed to a backend. The backend moves bytes until
 * at least `need` of the `len` requested are done (a read that reaches end of
 * file earlier stops with eof set), retrying EINTR/EAGAIN and resuming short
 * transfers. `need` < `len` only for reads of a whole aligned block of which
 * only the first `need` bytes matter (O_DIRECT tail blocks). */
typedef struct ckptio__io_op {
    int fd;                 /* descriptor to use */
    int buffered_fd;        /* used instead of fd for a remainder that a short
                               O_DIRECT transfer left unaligned */
    bool direct;            /* fd is an O_DIRECT descriptor */
    ckptio_direction dir;
    unsigned char *buf;
    uint64_t len;           /* bytes requested */
    uint64_t need;          /* bytes that must be moved (<= len) */
    uint64_t offset;        /* file offset of buf[0] */
    int buf_index;          /* io_uring registered buffer index, or -1 */
    pthread_mutex_t *turn;  /* held while the operation's system calls run
                               (the file's write_turn), or NULL */
    /* outcome, filled by the backend */
    uint64_t done;          /* bytes moved */
    int err;                /* errno of the failure, 0 if none */
    bool eof;               /* a read returned 0 before `need` bytes */
    uint32_t requests;      /* system calls / submissions issued */
    uint32_t retries;       /* EINTR, EAGAIN and short transfers resumed */
    /* s3:// objects: the file's object (in), and a failure's error record
     * (out; err is EIO then), which ckptio__file_op_status() reports. */
    ckptio__object *object;
    ckptio__error_saved *failure;
} ckptio__io_op;

/* Fills `op` for moving [offset, offset + len) of `file` to or from `buf`,
 * by the rules every transfer follows: O_DIRECT when buf, offset and len
 * are CKPTIO_DIRECT_ALIGN-aligned and the file has a direct descriptor,
 * except reads that the read policy sends through the page cache
 * (ckptio__read_buffered, DIRECT=AUTO); buffered otherwise. A write to a
 * file in memory (tmpfs, ramfs) waits for the file's write turn. The
 * O_DIRECT descriptor must have been prepared (ckptio__file_prepare_direct). */
void ckptio__file_op_init(ckptio__io_op *op, ckptio_file *file, ckptio_direction dir, void *buf, uint64_t len,
                          uint64_t offset);

/* The lock a write to `file` holds while its system calls run (the file's
 * write_turn when it lives in memory: tmpfs, ramfs), or NULL. For callers
 * that fill ckptio__io_op themselves. */
pthread_mutex_t *ckptio__file_write_turn(ckptio_file *file);

/* Adds a finished operation to *st: its requests and retries and, when it
 * succeeded, `bytes` (the bytes of the caller's data it carried, which
 * excludes alignment padding) as read or written, direct or buffered. */
void ckptio__io_op_count(const ckptio__io_op *op, uint64_t bytes, ckptio_stats *st);

/* Turns a finished operation into a status: CKPTIO_OK, the errno's status
 * or CKPTIO_E_TRUNCATED, with a message naming the file, the operation, the
 * offset where it stopped and `what` (e.g. "extent 3 (io_uring, O_DIRECT)"). */
ckptio_status ckptio__file_op_status(const ckptio_file *file, const ckptio__io_op *op, const char *what);

/* ---- backends ---------------------------------------------------------- */

/* A per-worker queue of operations. At most `depth` operations are in flight
 * (submitted and not yet returned by wait). */
typedef struct ckptio__io_queue ckptio__io_queue;

typedef struct ckptio__backend_ops {
    ckptio_backend id;
    const char *name;
    /* Creates a queue for one worker; returns an errno-style code (0 = ok)
     * so that AUTO can fall back without touching the error record. */
    int (*queue_create)(unsigned depth, ckptio__io_queue **out);
    void (*queue_destroy)(ckptio__io_queue *q);
    /* Optional (may be NULL): registers [buf, buf+len) as fixed buffer 0;
     * returns 0 or an errno (then operations just use plain buffers). */
    int (*register_buffer)(ckptio__io_queue *q, void *buf, size_t len);
    /* Starts an operation. Never fails: failures are reported on the
     * operation when wait() returns it. */
    void (*submit)(ckptio__io_queue *q, ckptio__io_op *op);
    /* Blocks until one submitted operation is finished (success or failure)
     * and returns it; NULL when nothing is in flight. */
    ckptio__io_op *(*wait)(ckptio__io_queue *q);
} ckptio__backend_ops;

extern const ckptio__backend_ops ckptio__backend_pread;
extern const ckptio__backend_ops ckptio__backend_io_uring;
/* Plans that move bytes of s3:// objects (io_object.c): each worker's
 * queue keeps up to `depth` ranged GETs in flight on one curl multi
 * handle; writes, and operations on local files, run synchronously. */
extern const ckptio__backend_ops ckptio__backend_object;

/* Creates one worker's queue of *backend with room for *depth operations
 * (pread: 1), for every executor of the engine (io_queue.c). An io_uring
 * ring that cannot be created although the probe passed (RLIMIT_MEMLOCK,
 * ring limits) falls back to pread unless io_uring was asked for explicitly
 * (`forced`); *backend and *depth then name what was created. Errors name
 * the backend and `worker`. */
ckptio_status ckptio__io_queue_create(const ckptio__backend_ops **backend, unsigned *depth, bool forced,
                                      unsigned worker, ckptio__io_queue **out);

/* Synchronous transfer of one operation with pread/pwrite (what the pread
 * backend does, offered to ckptio__file_io for callers outside the pool). */
void ckptio__io_sync(ckptio__io_op *op);

/* Whether io_uring can run here. Probed once per process (the
 * io_uring_disabled sysctl, then a real io_uring_queue_init and an opcode
 * probe). Returns 0 when usable, else the errno that refused it; `why`
 * (optional) receives a static explanation. */
int ckptio__io_uring_probe(const char **why);

/* Test hook: pretend io_uring is refused with `err` (0 restores the probe). */
void ckptio__io_uring_force_refusal(int err);

/* ---- s3:// objects as files (object_file.c) ------------------------------- */

/* Opens s3://BUCKET/KEY (ckptio_file_open's flags): READ asks the server
 * for its size and ETag (later reads refuse an object that changed:
 * CKPTIO_E_STALE); WRITE starts an upload that appears at commit, whole or
 * not at all (IN_PLACE is refused: an object is never modified in place;
 * EXCLUSIVE checks that no object exists at open and again at commit, which
 * servers without conditional writes cannot make atomic). */
ckptio_status ckptio__object_open(ckptio_engine *engine, const char *path, unsigned flags, ckptio_file **out);
/* Opens the object `path` for reading with one GET of its first `len` bytes
 * (its size unknown) into `buf` in place of the HEAD; *got: how many bytes of
 * `buf` that GET filled (min(len, size)), or 0 when the answer could not stand
 * for the HEAD, which was then sent. An open that takes the engine's peek of
 * `path` sends nothing and fills what the peek holds (*got may then be less
 * than min(len, size)). */
ckptio_status ckptio__object_open_prefix(ckptio_engine *engine, const char *path, void *buf, uint64_t len,
                                         uint64_t *got, ckptio_file **out);

/* Opens the object `path` for reading as the version a listing named (its
 * `size` and non-empty `etag`), with no request: every read names `etag` in
 * If-Match, so an object replaced since the listing fails with E_STALE. */
ckptio_status ckptio__object_open_listed(ckptio_engine *engine, const char *path, uint64_t size, const char *etag,
                                         ckptio_file **out);

/* ---- an object's first bytes kept for its open --------------------------- */

/* What one GET of an object's first bytes told: its size, its ETag and
 * those bytes. A probe (ckptio_format_detect_engine, ckptio_model_open's
 * look at a path) keeps it on the engine, and the next open of that path for
 * reading takes it (object_file.c): probe and open together cost the one
 * GET. */
typedef struct ckptio__object_peek ckptio__object_peek;

/* Bytes a peek brings: a safetensors open's first GET. */
#define CKPTIO__PEEK_BYTES ((uint64_t)64 << 10)

/* What the object `url` holds: its size (*size) and first min(len,
 * CKPTIO__PEEK_BYTES, size) bytes into `buf` (*got), from the engine's kept
 * peek of `url` if there is a fresh one, else from one GET (no HEAD) whose
 * answer the engine then keeps (object_dir.c). CKPTIO_E_NOT_FOUND when there
 * is no object of that key (the error then names it). */
ckptio_status ckptio__object_peek_first(ckptio_engine *engine, const char *url, void *buf, uint64_t len, uint64_t *got,
                                        uint64_t *size);
/* Copies from the engine's fresh peek of `url` (left there) as
 * ckptio__object_peek_first does; false when there is none. */
bool ckptio__object_peek_kept(ckptio_engine *engine, const char *url, void *buf, uint64_t len, uint64_t *got,
                              uint64_t *size);
/* Keeps what a GET of `url` told (its first `len` bytes) on the engine, in
 * place of any other peek; nothing without an ETag to pin the open to. */
void ckptio__object_peek_keep(ckptio_engine *engine, const char *url, uint64_t size, const char *etag,
                              const void *bytes, uint64_t len);
/* Drops the engine's peek of `url` (an object this engine writes or
 * deletes: its next open asks the server). */
void ckptio__object_peek_forget(ckptio_engine *engine, const char *url);
void ckptio__object_peek_free(ckptio__object_peek *p);

/* The ETag an object open for reading is pinned to ("" when written). */
const char *ckptio__object_version(const ckptio_file *f);

/* ckptio_file_size, _truncate, _commit and _close of an object file. */
ckptio_status ckptio__object_size(ckptio_file *f, uint64_t *out);
ckptio_status ckptio__object_truncate(ckptio_file *f, uint64_t size);
ckptio_status ckptio__object_commit(ckptio_file *f);
ckptio_status ckptio__object_close(ckptio_file *f);
/* ckptio_file_commit of an object file whose wait for its last parts asks
 * `poll` (not the engine's progress callback): for commits run on threads
 * other than the caller's, which polls the engine itself. */
ckptio_status ckptio__object_commit_polled(ckptio_file *f, ckptio__s3_poll_fn poll, void *user);

/* Moves one operation of an object file, blocking: a read is a ranged GET
 * (retried as the settings say), a write is copied into the upload's part
 * buffers. Fills op->done, or op->err = EIO and op->failure. */
void ckptio__object_io(ckptio__io_op *op);

/* For the object backend: whether op is a read of an object that can go to
 * the network asynchronously; then fills *req for it (a ranged GET into
 * op's buffer). ckptio__object_io_done() takes in the request's outcome
 * and cleans it up. */
bool ckptio__object_async_read(ckptio__io_op *op, ckptio__s3_request *req);
void ckptio__object_io_done(ckptio__io_op *op, ckptio__s3_request *req);

/* An object being written: the most bytes its part buffers held at once,
 * and their bound (0, 0 for other files); for tests. */
void ckptio__object_buffers(ckptio_file *f, uint64_t *peak, uint64_t *bound);
/* How many writers of `f` wait for an upload part's buffer now (0 for other files); for tests. */
unsigned ckptio__object_writers_waiting(ckptio_file *f);

/* The object uploads among files[0..count) (before their first write)
 * share one bound on their part buffers: that of one of them alone (*bound
 * receives it; other files are left as they are). */
ckptio_status ckptio__object_share_buffers(ckptio_file *const *files, size_t count, uint64_t *bound);
/* The most part-buffer bytes the uploads sharing f's bound held at once (0 without one); for tests. */
uint64_t ckptio__object_shared_peak(ckptio_file *f);

/* The counters of the engine's pool of upload part buffers (all zero
 * before its first upload); for tests. */
void ckptio__object_part_pool_stats(ckptio_engine *engine, ckptio__s3_part_pool_stats *out);

/* The objstore settings of an engine (its CKPTIO_OPT_S3_* values). */
void ckptio__object_settings(const ckptio_engine *engine, ckptio__s3_settings *out);

/* A client for `bucket` with the engine's settings (s3_config.c's chain). */
ckptio_status ckptio__object_client(const ckptio_engine *engine, const char *bucket, ckptio__s3_client **out);

/* The bucket and key of `url` (s3://BUCKET/KEY; an empty key only with `allow_empty_key`) and a client for
 * that bucket; on failure nothing is left to free. ckptio__object_target_release frees all three. */
ckptio_status ckptio__object_target(const ckptio_engine *engine, const char *url, bool allow_empty_key,
                                    ckptio__s3_client **client, char **bucket, char **key);
void ckptio__object_target_release(ckptio__s3_client *client, char *bucket, char *key);
/* Which server and bucket `url` reaches with the engine's settings: "SCHEME://HOST[/BASE] STYLE BUCKET"
 * into out[0..cap) (what a server answered about itself holds for that one only). */
ckptio_status ckptio__object_server(const ckptio_engine *engine, const char *url, char *out, size_t cap);

/* ---- s3://BUCKET/PREFIX/ as a directory (object_dir.c) ------------------- */

/* What a path names. */
typedef enum ckptio__path_kind {
    CKPTIO__PATH_MISSING = 0,
    CKPTIO__PATH_FILE,  /* an object */
    CKPTIO__PATH_DIR,   /* a prefix with objects under it (a common prefix of a listing) */
    CKPTIO__PATH_OTHER  /* a name no file can have: '.', '..', empty, control bytes, '\\' */
} ckptio__path_kind;

/* One entry of a prefix. The strings are valid during the callback only. */
typedef struct ckptio__object_entry {
    const char *name;        /* the bytes after PREFIX/ (for a subdirectory, without its '/') */
    ckptio__path_kind kind;  /* FILE, DIR or OTHER */
    uint64_t size;           /* FILE: bytes */
    const char *etag;        /* FILE: as the server sent it */
    double mtime;            /* FILE: LastModified (the server's clock, seconds since the epoch), 0 unknown */
} ckptio__object_entry;

/* Called for each entry; a non-zero return stops the listing (not an error). */
typedef int (*ckptio__object_entry_fn)(void *user, const ckptio__object_entry *e);

/* "dir/name", without doubling a '/' that ends dir (ckptio__malloc'ed, NULL when out of memory). */
char *ckptio__path_join(const char *dir, const char *name);

/* Whether name[0..len) can name a file of a directory: not empty, not "."
 * or "..", no '/', '\\' or control bytes. */
bool ckptio__object_plain_name(const char *name, size_t len);

/* "2026-11-29T02:27:53.000Z" (a listing's time) -> seconds since the epoch; -1 if not that. */
double ckptio__iso_time(const char *text);

/* The entries directly under the directory s3://BUCKET/PREFIX (a trailing
 * '/' or none), from one listing with delimiter '/', every page. A key the
 * server lists outside the prefix fails the listing (CKPTIO_E_FORMAT,
 * naming it): nothing of such a listing reaches the caller past that key.
 * A missing bucket is CKPTIO_E_NOT_FOUND; a prefix with nothing under it
 * lists nothing. */
ckptio_status ckptio__object_dir_list(ckptio_engine *engine, const char *dir, ckptio__object_entry_fn fn, void *user);
/* ckptio__object_dir_list of the entries whose names start with `start`
 * only: the listing's prefix says so, and the server pages through those
 * alone (a directory's few files of one kind among many others). */
ckptio_status ckptio__object_dir_list_starting(ckptio_engine *engine, const char *dir, const char *start,
                                               ckptio__object_entry_fn fn, void *user);

/* What s3://BUCKET/KEY is: FILE (an object of that key; *size) or DIR
 * (keys under KEY/; also the bucket itself), else MISSING. A URL ending in
 * '/' is only ever a directory. Errors: the requests' (a missing bucket). */
ckptio_status ckptio__object_stat(ckptio_engine *engine, const char *url, ckptio__path_kind *kind, uint64_t *size);

/* The first bytes a reader of a small whole file (a .metadata, a manifest)
 * asks for with its open (ckptio_file_open_window): most such files in one
 * GET, the rest of a larger one in a second. */
#define CKPTIO__SMALL_WINDOW ((uint64_t)1 << 20)

/* A whole object (or local file) of at most `max` bytes into *data
 * (ckptio__malloc'ed, NUL-terminated) and *len. CKPTIO_E_NOT_FOUND when
 * missing, CKPTIO_E_FORMAT when larger (*len is then its size). */
ckptio_status ckptio__object_read_all(ckptio_engine *engine, const char *url, uint64_t max, void **data, size_t *len);
/* ckptio__object_read_all that also gives the version its bytes are of
 * (ckptio_file_version: an object's ETag, "" for a local file) in
 * `version` (version_cap bytes, truncated to fit). */
ckptio_status ckptio__object_read_all_pinned(ckptio_engine *engine, const char *url, uint64_t max, void **data,
                                             size_t *len, char *version, size_t version_cap);

/* A small object (at most `max` bytes) in one GET, with its Last-Modified
 * and the server's clock of the answer (Date; this machine's without one),
 * set also for a missing object (CKPTIO_E_NOT_FOUND). *data is
 * NUL-terminated. */
ckptio_status ckptio__object_get_small(ckptio_engine *engine, const char *url, size_t max, void **data, size_t *len,
                                       double *mtime, double *server_now);

/* Writes the object whole with one PUT (if_absent: If-None-Match: *). */
ckptio_status ckptio__object_write_all(ckptio_engine *engine, const char *url, const void *data, size_t len,
                                       bool if_absent);

/* Deletes the object (a missing one is no error). */
ckptio_status ckptio__object_remove(ckptio_engine *engine, const char *url);

/* Aborts the unfinished multipart uploads under s3://BUCKET/PREFIX started
 * at or before `cutoff` (seconds since the epoch, compared with the
 * server's Initiated; 0: all). *aborted (may be NULL) counts them. */
ckptio_status ckptio__object_abort_uploads_before(ckptio_engine *engine, const char *url, double cutoff,
                                                  uint64_t *aborted);

/* ckptio__object_abort_uploads_before with the cutoff asked of cutoff_fn(user) once the uploads are listed (it
 * may wait for what decides it; a negative cutoff aborts none): the listing runs while the cutoff is found. */
ckptio_status ckptio__object_abort_uploads_listed(ckptio_engine *engine, const char *url,
                                                  double (*cutoff_fn)(void *user), void *user, uint64_t *aborted);

/* HEAD: size, ETag and Last-Modified, and the server's clock when it
 * answered (its Date; this machine's clock without one), set also when the
 * object is missing (CKPTIO_E_NOT_FOUND). Any output may be NULL. */
ckptio_status ckptio__object_info(ckptio_engine *engine, const char *url, uint64_t *size, char etag[128],
                                  double *mtime, double *server_now);

/* ---- fault hook (tests) ------------------------------------------------- */

/* The library itself injects no faults: it asks this hook before each
 * request, and the test-only library (tests/doubles/io_inject.c, never
 * shipped) installs one that fails the requests a test armed. */

typedef enum ckptio__io_kind {
    CKPTIO__IO_READ = 0,     /* every read request (pread, io_uring read) */
    CKPTIO__IO_WRITE,        /* every write request */
    CKPTIO__IO_FSYNC,        /* fsync of files and directories */
    CKPTIO__IO_RENAME,       /* the commit rename/link */
    CKPTIO__IO_OPEN,         /* opening files and creating temporaries */
    CKPTIO__IO_OPEN_DIRECT,  /* opening the O_DIRECT descriptor (EINVAL = refused) */
    CKPTIO__IO_UNLINK,       /* removing a file (the DCP commit's cleanup) */
    CKPTIO__IO_LISTDIR,      /* opening a directory to list it (opendir) */
    CKPTIO__IO_RESIDENCY,    /* a page-cache residency question (cachestat/mincore): a fault answers "unknown" */
    CKPTIO__IO_KIND_COUNT_
} ckptio__io_kind;

/* Returns true when this request of `kind` must fail with *err; otherwise
 * may lower *len for a short transfer. */
typedef bool (*ckptio__io_fault_fn)(ckptio__io_kind kind, int *err, uint64_t *len);

/* Test seam: route every request's fault check through `fn` (NULL removes it).
 * Process-wide; the hook runs on whatever thread issues the request. */
void ckptio__io_set_fault_hook(ckptio__io_fault_fn fn);

/* Called by the backends before each request of `kind`: the installed
 * hook's answer, false without one. Cheap (one atomic load) when none is. */
bool ckptio__io_fault(ckptio__io_kind kind, int *err, uint64_t *len);

/* The buffered descriptor of a local file committed by
 * ckptio_file_commit_unreferenced(CKPTIO_COMMIT_SYNC_LATER), for the fsync
 * it still needs; -1 for any other file (not committed, committed with its
 * fsyncs, an object). (file.c) */
int ckptio__file_renamed_fd(const ckptio_file *f);
/* Whether f is an object handed over by
 * ckptio_file_commit_unreferenced(CKPTIO_COMMIT_SYNC_LATER) whose upload
 * ckptio_dcp_commit() is still to complete (ckptio_file_commit). (file.c) */
bool ckptio__file_completion_owed(const ckptio_file *f);
/* Whether the local file f lies in the directory `dir` (the same inode as
 * its own directory; false for an object or a directory that cannot be
 * stat'ed). (file.c) */
bool ckptio__file_in_dir(const ckptio_file *f, const char *dir);

/* ---- system calls of the commit protocols (syscalls.c) ------------------ */

/* Each behaves as the system call of its name (-1 or NULL with errno on
 * failure; EINTR retried unless ckptio_interrupt() asked to stop, then it is
 * the failure) but fails where a fault of its kind is injected:
 * open (CKPTIO__IO_OPEN), fsync and fdatasync (FSYNC), rename
 * (RENAME), unlink (UNLINK), opendir (LISTDIR); write and read (WRITE, READ)
 * may also be cut short by an injected short transfer. */
int ckptio__open(const char *path, int flags, mode_t mode);
int ckptio__openat(int dirfd, const char *path, int flags, mode_t mode);
int ckptio__fsync(int fd);
int ckptio__fdatasync(int fd);
/* fsync of every fds[i] at once (threads; up to 16 at a time): a file system
 * that journals, such as ext4, flushes them with one journal commit where one
 * after another each waits for a commit of its own. The fault of each is
 * checked in order of fds before any runs. errs[i] is 0 or the errno of
 * fds[i]'s fsync; @return how many failed. */
int ckptio__fsync_many(const int *fds, size_t n, int *errs);
int ckptio__rename(const char *from, const char *to);
int ckptio__unlink(const char *path);
DIR *ckptio__opendir(const char *path);
ssize_t ckptio__write(int fd, const void *buf, size_t len);
ssize_t ckptio__read(int fd, void *buf, size_t len);

#endif /* CKPTIO_IO_INTERNAL_H */
