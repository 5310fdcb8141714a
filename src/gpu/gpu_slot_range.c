/*
 * gpu_slot_range.c - the address range an engine's staging slots live in.
 *
 * Why one range: a slot is the kernel's memory (faulted in, zeroed) that the
 * driver then registers. With a mapping per slot, mmap and
 * madvise(MADV_HUGEPAGE) take the process's mmap lock for writing, which
 * waits for every fault in progress and holds off new ones, so workers
 * faulting their slots in at once ran one after the other: 32 slots of
 * 4 MiB on huge pages, 16 threads, took 19-22 ms to fill, no faster than
 * one thread; in one range reserved and advised beforehand, 3.9-4.2 ms, and
 * the whole pinning (fills beside each other, registrations one at a time)
 * 7.0-9.5 ms against 25-39 ms (H100 hosts, Linux 6.18, bench/probe_pin.c,
 * 2026-11-27). Faulting in takes the lock for reading only.
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
     * first write). Not MADV_POPULATE_WRITE: with 16 workers filling their
     * slots at once, 128 MiB took 15-21 ms that way against 3 ms by
     * touching, and 6-7 ms either way with 4 (H200 host, Linux 6.18.44,
     * bench/probe_new_memory.c, 2026-11-27, fifteenth session): a first
     * load's workers started copying one after another. The price: where
     * the kernel has no page to give, the OOM killer acts, as for any page
     * the process touches; the madvise returned ENOMEM. */
    for (size_t off = 0; off < bytes; off += 4096) ((volatile unsigned char *)addr)[off] = 0;
}

void ckptio__slot_range_discard(unsigned char *addr, size_t bytes) { (void)madvise(addr, bytes, MADV_DONTNEED); }

void ckptio__slot_range_release(unsigned char *range, size_t bytes) {
    if (range) munmap(range, bytes);
}
