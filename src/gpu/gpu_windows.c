/*
 * gpu_windows.c - a GPU transfer's plan: extents -> runs -> windows
 * (gpu_windows.h). A window of file span ends at most one slot past the
 * 4 KiB boundary below its start (window_end), so its bytes fit its slot at
 * their file position modulo 4 KiB (gpu_pipeline.c, "Alignment"); a packed
 * window holds at most one slot of extent bytes, back to back.
 */
#include "gpu_windows.h"

#include "common_internal.h"

#define ALIGN ((uint64_t)CKPTIO_DIRECT_ALIGN)
#define READ_GAP_MAX (64u << 10) /* read across holes up to this size */

static int cmp_extents(const void *a, const void *b, void *arg) {
    const ckptio_extent *ext = arg;
    const ckptio_extent *x = &ext[*(const size_t *)a], *y = &ext[*(const size_t *)b];
    if (x->file != y->file) return (uintptr_t)x->file < (uintptr_t)y->file ? -1 : 1;
    if (x->file_offset != y->file_offset) return x->file_offset < y->file_offset ? -1 : 1;
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

static uint64_t window_end(uint64_t pos, uint64_t end, uint64_t slot) {
    uint64_t limit = ckptio__align_down(pos, ALIGN) + slot;
    return limit < end ? limit : end;
}

/* Where the packed window starting at `pos` of run `rn` ends: once its
 * extents' bytes fill a slot (the run's extents do not overlap:
 * ckptio__gpu_run_packs).
 * *data is what it holds. *k: the first extent ending after `pos`. */
static uint64_t next_cut_packed(const ckptio__gpu_plan *pl, const ckptio__gpu_run *rn, size_t *k, uint64_t pos,
                                uint64_t slot, uint64_t *data) {
    while (pl->ext[pl->order[*k]].file_offset + pl->ext[pl->order[*k]].length <= pos) (*k)++;
    uint64_t room = slot;
    for (size_t j = *k; j < rn->first + rn->count; j++) {
        const ckptio_extent *e = &pl->ext[pl->order[j]];
        const uint64_t lo = e->file_offset > pos ? e->file_offset : pos, hi = e->file_offset + e->length;
        if (hi - lo >= room) {
            *data = slot;
            return lo + room;
        }
        room -= hi - lo;
    }
    *data = slot - room;
    return rn->end;
}

/* Where the window starting at `pos` of run `rn` ends. With an observer
 * block size, the window is pulled back to the start of the block it would
 * otherwise cut, when that block starts after `pos` (the block then goes
 * whole into the next window); a block that cannot fit anyway is cut.
 * *k is the sorted position of the extent holding the cut (only advances). */
static uint64_t next_cut(const ckptio__gpu_plan *pl, const ckptio__gpu_run *rn, size_t *k, uint64_t pos,
                         uint64_t slot, uint64_t block) {
    const uint64_t end = window_end(pos, rn->end, slot);
    if (!block || end == rn->end) return end;
    /* Write runs are contiguous, so some extent of the run holds `end`. */
    while (pl->ext[pl->order[*k]].file_offset + pl->ext[pl->order[*k]].length <= end) (*k)++;
    const ckptio_extent *e = &pl->ext[pl->order[*k]];
    const uint64_t start = e->file_offset + (end - e->file_offset) / block * block;
    return start > pos ? start : end;
}

/* Sorts the extents and joins neighbours in a file into runs (gpu_windows.h). */
ckptio_status ckptio__gpu_plan_runs(ckptio__gpu_plan *pl, size_t count, ckptio_direction dir, uint64_t slot) {
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        if (pl->ext[i].length) pl->order[n++] = i;
    ckptio__sort(pl->order, n, sizeof *pl->order, cmp_extents, (void *)pl->ext); /* a slice's rows: in order */
    const uint64_t gap = READ_GAP_MAX < slot / 2 ? READ_GAP_MAX : slot / 2;
    for (size_t k = 0; k < n; k++) {
        const ckptio_extent *e = &pl->ext[pl->order[k]];
        uint64_t end;
        if (ckptio__add_overflows(e->file_offset, e->length, &end))
            return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE,
                                   &((ckptio__err_ctx){.path = ckptio_file_path(e->file), .file_offset = -1}),
                                   "extent %zu: file offset %llu + length %llu overflows", pl->order[k],
                                   (unsigned long long)e->file_offset, (unsigned long long)e->length);
        ckptio__gpu_run *r = pl->nruns ? &pl->runs[pl->nruns - 1] : NULL;
        bool join = r && r->file == e->file &&
                    (dir == CKPTIO_READ ? e->file_offset >= r->end && e->file_offset - r->end <= gap
                                        : e->file_offset == r->end);
        if (join) {
            r->end = end;
            r->count++;
        } else {
            pl->runs[pl->nruns++] =
                (ckptio__gpu_run){.file = e->file, .start = e->file_offset, .end = end, .first = k, .count = 1};
        }
    }
    return CKPTIO_OK;
}

/* The end of the window starting at `pos`, and in *packed the bytes it
 * holds when the run is packed (0 otherwise). */
static uint64_t window_cut(const ckptio__gpu_plan *pl, const ckptio__gpu_run *rn, size_t *k, uint64_t pos,
                           uint64_t slot, uint64_t block, uint64_t *packed) {
    *packed = 0;
    if (pl->object_window && rn->file->object)
        return rn->end - pos > pl->object_window ? pos + pl->object_window : rn->end;
    return rn->packed ? next_cut_packed(pl, rn, k, pos, slot, packed) : next_cut(pl, rn, k, pos, slot, block);
}

/* Cuts the runs into windows of at most one slot: of file span, or of
 * extent bytes for packed runs. Counts them, then fills them. */
ckptio_status ckptio__gpu_plan_windows(ckptio__gpu_plan *pl, uint64_t slot, uint64_t block) {
    size_t nwin = 0;
    uint64_t packed;
    for (size_t r = 0; r < pl->nruns; r++) {
        size_t k = pl->runs[r].first;
        for (uint64_t pos = pl->runs[r].start; pos < pl->runs[r].end;
             pos = window_cut(pl, &pl->runs[r], &k, pos, slot, block, &packed))
            nwin++;
    }
    pl->wins = ckptio__calloc(nwin ? nwin : 1, sizeof *pl->wins);
    if (!pl->wins) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu GPU staging windows", nwin);
    for (size_t r = 0; r < pl->nruns; r++) {
        const ckptio__gpu_run *rn = &pl->runs[r];
        size_t k = rn->first, kc = rn->first;
        for (uint64_t pos = rn->start; pos < rn->end;) {
            const uint64_t wend = window_cut(pl, rn, &kc, pos, slot, block, &packed);
            while (pl->ext[pl->order[k]].file_offset + pl->ext[pl->order[k]].length <= pos) k++;
            pl->wins[pl->nwin++] =
                (ckptio__gpu_window){.run = r, .first = k, .start = pos, .end = wend, .packed = packed};
            pos = wend;
        }
    }
    return CKPTIO_OK;
}

/* A range is in memory when the page cache holds all its pages but this
 * fraction (1/64): reading piece by piece would fetch the missing ones from
 * the disk in small requests. */
#define MISSING_PAGES_MAX_SHIFT 6

static bool range_resident(int fd, uint64_t start, uint64_t len) {
    uint64_t cached = 0, pages = 0;
    if (!ckptio__range_cached_pages(fd, start, len, &cached, &pages)) return false;
    return pages - (cached < pages ? cached : pages) <= pages >> MISSING_PAGES_MAX_SHIFT;
}

/* Whether run `rn` of a read is read piece by piece into packed slots: its
 * extents cover at most half of the span it bridges (a column slice: one
 * run per row, TP 2 and more), in pieces of PACK_PIECE_MIN bytes or more
 * on average, none overlapping, and its pages are in memory (tmpfs, or all
 * but 1/64 in the page cache). Reading the span copies the gaps too (a TP-8
 * column slice 8x its bytes), and from memory the pieces' own reads cost
 * less than the gaps' bytes do; from the disk the span stays, since one
 * request per row would be slower than the bytes between
 * (docs/GPU.md#packed-reads). */
#define PACK_PIECE_MIN 1024u
bool ckptio__gpu_run_packs(const ckptio__gpu_plan *pl, const ckptio__gpu_run *rn) {
    uint64_t data = 0, prev_end = 0;
    for (size_t k = rn->first; k < rn->first + rn->count; k++) {
        const ckptio_extent *e = &pl->ext[pl->order[k]];
        if (k > rn->first && e->file_offset < prev_end) return false;
        prev_end = e->file_offset + e->length;
        data += e->length;
    }
    const uint64_t span = rn->end - rn->start;
    if (data > span / 2 || data / rn->count < PACK_PIECE_MIN) return false;
    if (ckptio__file_in_memory(rn->file)) return true;
    const uint64_t a = ckptio__align_down(rn->start, ALIGN);
    return range_resident(rn->file->fd, a, ckptio__align_up(rn->end, ALIGN) - a);
}

bool ckptio__gpu_next_piece(const ckptio__gpu_plan *pl, const ckptio__gpu_window *w, size_t *k, size_t *idx,
                            uint64_t *lo, uint64_t *hi) {
    const ckptio__gpu_run *rn = &pl->runs[w->run];
    for (; *k < rn->first + rn->count; (*k)++) {
        const ckptio_extent *e = &pl->ext[pl->order[*k]];
        if (e->file_offset >= w->end) return false;
        const uint64_t eend = e->file_offset + e->length;
        *lo = e->file_offset > w->start ? e->file_offset : w->start;
        *hi = eend < w->end ? eend : w->end;
        if (*hi > *lo) {
            *idx = pl->order[(*k)++];
            return true;
        }
    }
    return false;
}
