/*
 * gpu_slot_range.c - the address range an engine's staging slots live in.
 *
 * Why one range: a slot is the kernel's memory (faulted in, zeroed) that the
 * driver then registers. With a mapping per slot, mmap and
 * madvise(MADV_HUGEPAGE) take the process's mmap lock for writing, which
 * waits for every fault in progress and holds off new ones, so workers
 * faulting their slots in at once would run one after the other, no faster
 * than one thread. In one range reserved and advised beforehand, faulting
 * in takes the lock for reading only, and the workers' fills run side by
 * side (docs/GPU.md#slot-range has the measurements).
 */
#include "gpu_slot_range.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

ckptio_status ckptio__slot_range_reserve(size_t bytes, bool huge, unsigned char **out) {
    *out = NULL;
    const size_t len = bytes + CKPTIO_HUGE_PAGE_BYTES;
    unsigned char *map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED)
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "reserving %zu bytes of address space for pinned staging failed: %s", len,
                           strerror(errno));
    /* Keep the 2 MiB-aligned part only: the range is then released whole by
     * its own address and length. */
    unsigned char *range =
        (unsigned char *)(((uintptr_t)map + CKPTIO_HUGE_PAGE_BYTES - 1) & ~(uintptr_t)(CKPTIO_HUGE_PAGE_BYTES - 1));
    if (range > map) munmap(map, (size_t)(range - map));
    if (map + len > range + bytes) munmap(range + bytes, (size_t)(map + len - (range + bytes)));
    (void)madvise(range, bytes, MADV_DONTFORK); /* best effort: without it a fork only copies more */
    ckptio__slot_range_advise(range, bytes, huge);
    *out = range;
    return CKPTIO_OK;
}

void ckptio__slot_range_advise(unsigned char *range, size_t bytes, bool huge) {
    /* Best effort: a kernel without THP refuses both, and its pages are 4 KiB. */
    (void)madvise(range, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
}

void ckptio__slot_range_fill(unsigned char *addr, size_t bytes) {
    /* One write per 4 KiB page faults the slot in (a whole huge page at its
     * first write). Not MADV_POPULATE_WRITE, which stops scaling with many
     * workers filling their slots at once, so that a first load's workers
     * would start copying one after another (docs/GPU.md#faulting-slots).
     * The price: where the kernel has no page to give, the OOM killer acts,
     * as for any page the process touches; the madvise returned ENOMEM. */
    for (size_t off = 0; off < bytes; off += 4096) ((volatile unsigned char *)addr)[off] = 0;
}

void ckptio__slot_range_discard(unsigned char *addr, size_t bytes) { (void)madvise(addr, bytes, MADV_DONTNEED); }

void ckptio__slot_range_release(unsigned char *range, size_t bytes) {
    if (range) munmap(range, bytes);
}
