/*
 * gpu_mapped.c - zero-copy reads of resident file windows into GPU memory
 * (the scheme and its safety rules are in gpu_mapped.h).
 */
#include "engine_internal.h"
#include "gpu_mapped.h"

#include <sys/mman.h>
#include <unistd.h>

/* A window is mapped when the page cache holds all its pages but this
 * fraction (1/64): registration would read the missing ones from the disk
 * one fault at a time, slower than the O_DIRECT read of the staged path. */
#define MISSING_PAGES_MAX_SHIFT 6

ckptio__map_policy ckptio__gpu_map_policy(ckptio_engine *engine, ckptio_direction dir, ckptio_file *file) {
    if (dir != CKPTIO_READ) return CKPTIO__MAP_NEVER;
    /* The user asked for O_DIRECT reads or for the staging copy. */
    if (ckptio__engine_setting(engine, CKPTIO_OPT_DIRECT) == CKPTIO_DIRECT_ON) return CKPTIO__MAP_NEVER;
    if (ckptio__engine_setting(engine, CKPTIO_OPT_GPU_PATH) == CKPTIO_GPU_PATH_STAGED) return CKPTIO__MAP_NEVER;
    return ckptio__file_in_memory(file) ? CKPTIO__MAP_ALWAYS : CKPTIO__MAP_IF_CACHED;
}

bool ckptio__gpu_range_resident(int fd, uint64_t start, uint64_t len) {
    uint64_t cached = 0, pages = 0;
    if (!ckptio__range_cached_pages(fd, start, len, &cached, &pages)) return false;
    return pages - (cached < pages ? cached : pages) <= pages >> MISSING_PAGES_MAX_SHIFT;
}

bool ckptio__gpu_map(const ckptio__gpu_ops *ops, int device, ckptio__map_policy policy, ckptio_file *file,
                     uint64_t start, uint64_t end, ckptio__gpu_mapping *out, bool *failed, bool *unsupported) {
    *out = (ckptio__gpu_mapping){0};
    *failed = false;
    if (policy == CKPTIO__MAP_NEVER || end <= start || !ops->host_register) return false;
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t a = ckptio__align_down(start, page);
    const uint64_t len = ckptio__align_up(end, page) - a;
    if (policy == CKPTIO__MAP_IF_CACHED && !ckptio__gpu_range_resident(file->fd, a, len)) return false;
    void *addr = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, file->fd, (off_t)a);
    if (addr == MAP_FAILED) {
        *failed = true;
        return false;
    }
    const ckptio_status st = ops->host_register(device, addr, (size_t)len);
    if (st != CKPTIO_OK) {
        munmap(addr, (size_t)len);
        *failed = true;
        if (st == CKPTIO_E_UNSUPPORTED) *unsupported = true;
        return false;
    }
    *out = (ckptio__gpu_mapping){.addr = addr, .len = (size_t)len, .offset = a};
    return true;
}

void ckptio__gpu_unmap(const ckptio__gpu_ops *ops, ckptio__gpu_mapping *m) {
    if (!m->addr) return;
    ops->host_unregister(m->addr);
    munmap(m->addr, m->len);
    *m = (ckptio__gpu_mapping){0};
}
