/*
 * gpu_windows.h - a GPU transfer's plan, before any byte moves: its extents
 * sorted by file and offset, neighbours in a file joined into runs, and the
 * runs cut into windows of at most one staging slot, which the pipeline's
 * workers then claim one by one (gpu_pipeline.c).
 */
#ifndef CKPTIO_GPU_WINDOWS_H
#define CKPTIO_GPU_WINDOWS_H

#include "io_internal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckptio__gpu_run {
    ckptio_file *file;
    uint64_t start, end, file_size;
    size_t first, count; /* positions in the sorted order */
    bool packed;         /* read piece by piece into packed slots (ckptio__gpu_run_packs) */
} ckptio__gpu_run;

typedef struct ckptio__gpu_window {
    size_t run, first; /* first: first sorted position that may intersect */
    uint64_t start, end;
    uint64_t packed;   /* a packed window: its extents' bytes, back to back in the slot; 0: the span */
} ckptio__gpu_window;

typedef struct ckptio__gpu_plan {
    const ckptio_extent *ext;   /* the transfer's extents */
    size_t *order;              /* indices of the non-empty ones, by file and offset */
    ckptio__gpu_run *runs;
    size_t nruns;
    ckptio__gpu_window *wins;
    size_t nwin;
    /* Reads: the span of an s3:// object's windows, whose bytes start at
     * their slot's first byte (an object has no O_DIRECT to align for);
     * 0: objects are cut as files are. */
    uint64_t object_window;
} ckptio__gpu_plan;

/* Sorts the first `count` extents of pl->ext into pl->order and joins
 * neighbours in a file into pl->runs (both allocated by the caller for
 * `count`): a read bridges holes of up to min(64 KiB, slot / 2), a write
 * joins only extents that touch. Fails on an extent whose end overflows. */
ckptio_status ckptio__gpu_plan_runs(ckptio__gpu_plan *pl, size_t count, ckptio_direction dir, uint64_t slot);

/* Whether run `rn` of a read is read piece by piece into packed slots
 * (gpu_windows.c says when). Asks the page cache about files on disk. */
bool ckptio__gpu_run_packs(const ckptio__gpu_plan *pl, const ckptio__gpu_run *rn);

/* Cuts the runs into pl->wins: windows of at most `slot` bytes of file span
 * (pl->object_window bytes for the runs of an s3:// object, when set),
 * or of extent bytes for packed runs; with an observer block size `block`
 * (writes; 0: none) a window ends at a block's start rather than cut it. */
ckptio_status ckptio__gpu_plan_windows(ckptio__gpu_plan *pl, uint64_t slot, uint64_t block);

/* Walks the extents that overlap window `w`: start with *k = w->first;
 * each call gives the next extent's plan index and its part [*lo, *hi) of
 * the window, false when none is left. */
bool ckptio__gpu_next_piece(const ckptio__gpu_plan *pl, const ckptio__gpu_window *w, size_t *k, size_t *idx,
                            uint64_t *lo, uint64_t *hi);

#endif
