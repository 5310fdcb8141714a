/*
 * gpu_slot_range.h - the address range the staging slots of an engine live
 * in (gpu_staging.c): reserved once, so that workers fault their slots in at
 * the same time (gpu_slot_range.c says why).
 */
#ifndef CKPTIO_GPU_SLOT_RANGE_H
#define CKPTIO_GPU_SLOT_RANGE_H

#include "io_internal.h" /* CKPTIO_HUGE_PAGE_BYTES */

/* Address space for `bytes` (a multiple of 2 MiB) on a 2 MiB boundary, no
 * memory behind it yet (MAP_NORESERVE), not inherited by a forked child
 * (MADV_DONTFORK), advised as ckptio__slot_range_advise says. */
ckptio_status ckptio__slot_range_reserve(size_t bytes, bool huge, unsigned char **out);

/* Asks for transparent huge pages in the range (`huge`) or none: the faults
 * that follow take 2 MiB pages, or 4 KiB ones whatever THP's mode. */
void ckptio__slot_range_advise(unsigned char *range, size_t bytes, bool huge);

/* Faults [addr, addr + bytes) in, writable, by touching each page (the
 * contents are left unspecified). Cheap where the pages are there already. */
void ckptio__slot_range_fill(unsigned char *addr, size_t bytes);

/* Gives the memory of [addr, addr + bytes) back; the range stays reserved. */
void ckptio__slot_range_discard(unsigned char *addr, size_t bytes);

void ckptio__slot_range_release(unsigned char *range, size_t bytes);

#endif /* CKPTIO_GPU_SLOT_RANGE_H */
