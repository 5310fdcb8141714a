/*
 * read_policy.c - does a cold read go through the page cache or O_DIRECT?
 *
 * O_DIRECT reads leave nothing behind: a notebook or an evaluation loop that
 * loads the same checkpoint again pays the disk every time, where torch.load
 * and safetensors (buffered reads, mmap) find the file in memory. A buffered
 * read costs about the same as O_DIRECT on a cold file (docs/ENGINE.md has
 * the numbers) and keeps it, so in CKPTIO_DIRECT_AUTO mode reads go through
 * the page cache when the files read fit comfortably in memory:
 *
 *   the files of a read plan together take at most a quarter of MemAvailable.
 *
 * A quarter, because a load to host memory needs the file's size again for
 * the tensors, and the cached copy should not push out the memory the process
 * and its neighbours use; above that the page cache would evict the file's
 * own first pages before the next load could use them, and the copy through
 * it is pure overhead. A plan whose files are bigger keeps O_DIRECT (and
 * still reads ranges the page cache happens to hold from it: page_cache.c).
 * So does a plan whose bytes go mostly to GPU memory: through the page
 * cache it runs slower and costs many times the CPU (every byte is copied
 * into the page cache and out again), and the cold start of a model server
 * is the load that counts there (docs/ENGINE.md#read-policy).
 * CKPTIO_OPT_READ_CACHE forces either way.
 *
 * The decision is made per plan (ckptio_engine_execute, over all the plan's
 * files, so a directory of many shards counts as a whole) and stored on each
 * file, where the engine's host workers, the GPU pipeline's workers and
 * ckptio__file_io (header and manifest reads) find it, through
 * ckptio__file_op_init; a file read outside any
 * plan is judged by its own size.
 *
 * Writes have the same question the other way round: an O_DIRECT save leaves
 * nothing in the page cache, so the first load after it reads the disk, where
 * torch.save and safetensors files are found in memory. Durable writes
 * through the page cache cost what O_DIRECT writes cost up to a few hundred
 * MiB and several times more for large files (docs/ENGINE.md, "The cache
 * after a save"), so in CKPTIO_DIRECT_AUTO mode a write plan goes through the
 * page cache when its files together take at most CKPTIO__WRITE_CACHE_MAX
 * and a quarter of MemAvailable; larger saves - a GPU host's, durable at the
 * disk's speed - keep O_DIRECT. CKPTIO_OPT_WRITE_CACHE forces either way. A
 * plan below CKPTIO_OPT_DIRECT_MIN_BYTES goes through the page cache whatever
 * the policy says (no extent of it is big enough for O_DIRECT), so the
 * policy, and /proc/meminfo, is not consulted for it (exec.c).
 */
#include "io_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Cold reads go buffered while the files take at most 1/CACHE_SHARE of
 * the memory available. */
#define CACHE_SHARE 4

static _Atomic uint64_t mem_available_override; /* test hook; 0 = /proc/meminfo */

void ckptio__read_policy_set_mem_available(uint64_t bytes) { mem_available_override = bytes; }

_Atomic uint64_t ckptio__mem_available_lookups;

uint64_t ckptio__mem_available(void) {
    atomic_fetch_add_explicit(&ckptio__mem_available_lookups, 1, memory_order_relaxed);
    const uint64_t forced = mem_available_override;
    if (forced) return forced;
    char buf[1024]; /* the field is near the top of the file */
    if (ckptio__read_kernel_file("/proc/meminfo", buf, sizeof buf) <= 0) return 0;
    const char *p = strstr(buf, "\nMemAvailable:");
    if (!p) return 0;
    char *end;
    const unsigned long long kib = strtoull(p + sizeof "\nMemAvailable:" - 1, &end, 10);
    if (end == p || kib == 0) return 0;
    return (uint64_t)kib * 1024;
}

bool ckptio__read_policy_cache(const ckptio_engine *engine, uint64_t footprint) {
    switch (ckptio__io_engine_setting(engine, CKPTIO_OPT_READ_CACHE)) {
    case CKPTIO_READ_CACHE_ON: return true;
    case CKPTIO_READ_CACHE_OFF: return false;
    default: break;
    }
    const uint64_t available = ckptio__mem_available();
    /* Unknown memory: keep O_DIRECT, the behaviour that cannot crowd anyone out. */
    return available != 0 && footprint <= available / CACHE_SHARE;
}

/* A released file (ckptio__file_release) counts by its size at open. */
static uint64_t file_size(const ckptio_file *f) {
    struct stat sb;
    if (f->fd < 0) return f->opened_size;
    return fstat(f->fd, &sb) == 0 && sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
}

/* The bytes a plan's files take: each distinct file's size once (the
 * first 64; further files count by the bytes the plan moves). */
static uint64_t plan_footprint(const ckptio_extent *ext, size_t count) {
    enum { MAX_FILES = 64 };
    const ckptio_file *files[MAX_FILES];
    size_t nfiles = 0;
    uint64_t footprint = 0;
    for (size_t i = 0; i < count; i++) {
        const ckptio_file *f = ext[i].file;
        if (!ext[i].length) continue;
        size_t k = 0;
        while (k < nfiles && files[k] != f) k++;
        if (k < nfiles) continue;
        if (nfiles == MAX_FILES) {
            footprint += ext[i].length;
            continue;
        }
        files[nfiles++] = f;
        footprint += file_size(f);
    }
    return footprint;
}

/* 1: the cold reads of these extents go through the page cache; -1: O_DIRECT. */
static int decide(ckptio_engine *engine, const ckptio_extent *ext, size_t count) {
    uint64_t gpu_bytes = 0, all_bytes = 0;
    for (size_t i = 0; i < count; i++) {
        all_bytes += ext[i].length;
        if (ext[i].mem_kind == CKPTIO_MEM_CUDA) gpu_bytes += ext[i].length;
    }
    const bool mostly_gpu = gpu_bytes * 2 > all_bytes;
    const bool forced_on = ckptio__io_engine_setting(engine, CKPTIO_OPT_READ_CACHE) == CKPTIO_READ_CACHE_ON;
    return (forced_on || !mostly_gpu) && ckptio__read_policy_cache(engine, plan_footprint(ext, count)) ? 1 : -1;
}

static void store(const ckptio_extent *ext, size_t count, int cache) {
    for (size_t i = 0; i < count; i++)
        if (ext[i].length) atomic_store_explicit(&ext[i].file->read_cache, cache, memory_order_relaxed);
}

/* A decision held for a read of several plans: +-2 (+-1 once released). */
#define HELD 2

void ckptio__read_policy_apply(ckptio_engine *engine, const ckptio_extent *ext, size_t count) {
    bool held = true;
    for (size_t i = 0; held && i < count; i++)
        if (ext[i].length) held = abs(atomic_load_explicit(&ext[i].file->read_cache, memory_order_relaxed)) == HELD;
    if (!held) store(ext, count, decide(engine, ext, count));
}

void ckptio__read_policy_hold(ckptio_engine *engine, const ckptio_extent *ext, size_t count, uint64_t total) {
    if (ckptio__io_engine_setting(engine, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_AUTO &&
        total >= (uint64_t)ckptio__io_engine_setting(engine, CKPTIO_OPT_DIRECT_MIN_BYTES))
        store(ext, count, HELD * decide(engine, ext, count));
}

void ckptio__read_policy_unhold(const ckptio_extent *ext, size_t count) {
    for (size_t i = 0; i < count; i++) {
        const int d = atomic_load_explicit(&ext[i].file->read_cache, memory_order_relaxed);
        if (ext[i].length && abs(d) == HELD)
            atomic_store_explicit(&ext[i].file->read_cache, d / HELD, memory_order_relaxed);
    }
}

bool ckptio__read_buffered(ckptio_file *f, uint64_t offset, uint64_t len) {
    int decided = atomic_load_explicit(&f->read_cache, memory_order_relaxed);
    if (decided == 0) {
        decided = ckptio__read_policy_cache(f->engine, file_size(f)) ? 1 : -1;
        atomic_store_explicit(&f->read_cache, decided, memory_order_relaxed);
    }
    return decided > 0 || ckptio__file_in_memory(f) || ckptio__range_cached(f->fd, offset, len);
}

/* ---- writes ------------------------------------------------------------------------ */

static bool write_policy_cache(const ckptio_engine *engine, uint64_t footprint) {
    switch (ckptio__io_engine_setting(engine, CKPTIO_OPT_WRITE_CACHE)) {
    case CKPTIO_WRITE_CACHE_ON: return true;
    case CKPTIO_WRITE_CACHE_OFF: return false;
    default: break;
    }
    const uint64_t available = ckptio__mem_available();
    return footprint <= CKPTIO__WRITE_CACHE_MAX && available != 0 && footprint <= available / CACHE_SHARE;
}

void ckptio__write_policy_apply(ckptio_engine *engine, const ckptio_extent *ext, size_t count) {
    const int cache = write_policy_cache(engine, plan_footprint(ext, count)) ? 1 : -1;
    for (size_t i = 0; i < count; i++)
        if (ext[i].length) atomic_store_explicit(&ext[i].file->write_cache, cache, memory_order_relaxed);
}

bool ckptio__write_buffered(ckptio_file *f) {
    int decided = atomic_load_explicit(&f->write_cache, memory_order_relaxed);
    if (decided == 0) {
        decided = write_policy_cache(f->engine, file_size(f)) ? 1 : -1;
        atomic_store_explicit(&f->write_cache, decided, memory_order_relaxed);
    }
    return decided > 0;
}
