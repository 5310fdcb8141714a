/*
 * page_cache.c - is a file range already in the page cache?
 *
 * O_DIRECT is right for cold data (no double copy, no cache pollution) but
 * wrong for data the page cache already holds: an O_DIRECT read goes to the
 * disk again, where a buffered read copies from memory, an order of
 * magnitude faster (docs/ENGINE.md#page-cache-probe). So reads in DIRECT=AUTO mode
 * ask first. cachestat(2)
 * (Linux 6.5+) answers for a descriptor range in one call; older kernels get
 * mincore(2) over a temporary mapping. Any failure answers "not cached",
 * which keeps the O_DIRECT behaviour.
 */
#include "io_internal.h"

#include <errno.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#ifndef SYS_cachestat
#define SYS_cachestat 451 /* same number on every architecture (generic table) */
#endif

struct cachestat_range_abi {
    uint64_t off;
    uint64_t len;
};
struct cachestat_abi {
    uint64_t nr_cache;
    uint64_t nr_dirty;
    uint64_t nr_writeback;
    uint64_t nr_evicted;
    uint64_t nr_recently_evicted;
};

static _Atomic int cachestat_missing = 0;

/* A file on tmpfs or ramfs is in memory by definition (shmem pages that
 * were swapped out come back through the same buffered read), and asking
 * there costs the most, relative to a read that fast
 * (docs/ENGINE.md#page-cache-probe). So the answer is fixed once per file. */
bool ckptio__file_in_memory(ckptio_file *f) {
    int known = atomic_load_explicit(&f->in_memory, memory_order_relaxed);
    if (known == 0) {
        struct statfs sb;
        const bool mem = fstatfs(f->fd, &sb) == 0 && (sb.f_type == TMPFS_MAGIC || sb.f_type == RAMFS_MAGIC);
        known = mem ? 1 : -1;
        atomic_store_explicit(&f->in_memory, known, memory_order_relaxed);
    }
    return known > 0;
}

static bool resident_by_mincore(int fd, uint64_t offset, uint64_t len, uint64_t *pages_cached) {
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t start = ckptio__align_down(offset, page);
    const uint64_t span = ckptio__align_up(offset + len, page) - start;
    void *map = mmap(NULL, span, PROT_READ, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED) return false;
    const size_t npages = span / page;
    unsigned char small[2048];
    unsigned char *vec = npages <= sizeof small ? small : ckptio__malloc(npages);
    bool ok = false;
    if (vec && mincore(map, span, vec) == 0) {
        uint64_t n = 0;
        for (size_t i = 0; i < npages; i++) n += vec[i] & 1;
        *pages_cached = n;
        ok = true;
    }
    if (vec != small) ckptio__free(vec);
    munmap(map, span);
    return ok;
}

bool ckptio__range_cached_pages(int fd, uint64_t offset, uint64_t len, uint64_t *cached_out, uint64_t *pages_out) {
    if (len == 0) return false;
    int err = 0;
    if (ckptio__io_fault(CKPTIO__IO_RESIDENCY, &err, NULL)) return false; /* tests: "unknown" */
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t npages = (ckptio__align_up(offset + len, page) - ckptio__align_down(offset, page)) / page;
    uint64_t cached = 0;
    bool known = false;
    if (!cachestat_missing) {
        struct cachestat_range_abi range = {ckptio__align_down(offset, page), npages * page};
        struct cachestat_abi cs = {0};
        if (syscall(SYS_cachestat, fd, &range, &cs, 0) == 0) {
            cached = cs.nr_cache;
            known = true;
        } else if (errno == ENOSYS) {
            cachestat_missing = 1;
        }
    }
    if (!known && !resident_by_mincore(fd, offset, len, &cached)) return false;
    *cached_out = cached;
    *pages_out = npages;
    return true;
}

bool ckptio__range_cached(int fd, uint64_t offset, uint64_t len) {
    uint64_t cached = 0, npages = 0;
    if (!ckptio__range_cached_pages(fd, offset, len, &cached, &npages)) return false;
    /* Mostly cached: a buffered read costs at most the few missing pages,
     * an O_DIRECT read would fetch all of them from the disk again. */
    return cached * 2 >= npages;
}
