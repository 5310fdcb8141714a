/*
 * gpu_geometry.c - how a GPU transfer is laid out before it runs: how many
 * workers, how large their staging slots (and so the windows), whether the
 * slots use huge pages. Everything here comes from the engine's settings
 * (and, for huge pages, the kernel's free memory): call it on a caller's
 * thread, before the workers start.
 */
#include "engine_internal.h"
#include "gpu_pipeline.h"
#include "io_internal.h"

#include <stdint.h>

#define ALIGN ((uint64_t)CKPTIO_DIRECT_ALIGN)

bool ckptio__gpu_huge_slots(ckptio_engine *engine, uint64_t pin_bytes) {
    switch (ckptio__engine_setting(engine, CKPTIO_OPT_GPU_HUGE_SLOTS)) {
    case CKPTIO_HUGE_SLOTS_OFF: return false;
    case CKPTIO_HUGE_SLOTS_ON: return true;
    default: break;
    }
    /* Free 2 MiB blocks for twice what may be pinned: the slots' faults take
     * free blocks and leave room for others', never compacting memory. */
    const uint64_t need = pin_bytes > UINT64_MAX / 2 ? UINT64_MAX : 2 * pin_bytes;
    return ckptio__huge_pages_advisable() && ckptio__huge_page_bytes_free() >= need;
}

/* Slot size from the settings only (not from the transfer, nor its
 * direction), so that the pinned slots are reused call after call: changing
 * them frees pinned memory, and cuMemFreeHost synchronises the device,
 * which deadlocks a GDS request whose caller's stream waits on it.
 * Slots (and so windows) are at most CKPTIO_GPU_SLOT_MAX (an object read's
 * come from ckptio__gpu_object_geometry, and reads keep larger slots:
 * ckptio__gpu_read_slot), and a read worker
 * rotates through CKPTIO_GPU_READ_SLOTS of its CKPTIO_GPU_NSLOTS: large
 * enough pieces for the copies to reach the link's speed, few enough slots
 * for all of them to stay in the CPU's caches while the workers fill them
 * (docs/GPU.md#slot-geometry). Writes queue up to CKPTIO_GPU_NSLOTS copies
 * ahead. */
void ckptio__gpu_geometry(ckptio_engine *engine, bool inline_only, uint64_t block, unsigned *nworkers,
                         uint64_t *slot) {
    int64_t threads = ckptio__engine_setting(engine, CKPTIO_OPT_THREADS);
    unsigned n = 1;
    if (!inline_only && threads >= 1)
        n = (unsigned)(threads > CKPTIO_GPU_MAX_WORKERS ? CKPTIO_GPU_MAX_WORKERS : threads);
    const uint64_t staging = (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_STAGING_BYTES);
    uint64_t chunk = (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_CHUNK_BYTES);
    chunk = chunk < ALIGN ? ALIGN : ckptio__align_down(chunk, ALIGN);
    uint64_t s;
    for (;;) {
        s = ckptio__align_down(staging / ((uint64_t)n * CKPTIO_GPU_NSLOTS), ALIGN);
        if (s > chunk) s = chunk;
        if (s > CKPTIO_GPU_SLOT_MAX) s = CKPTIO_GPU_SLOT_MAX;
        if (s >= CKPTIO_GPU_MIN_SLOT || s >= chunk || n == 1) break;
        n--;
    }
    if (s < ALIGN) s = ALIGN; /* the floor: 4 slots of 4 KiB */
    if (block && s < block + ALIGN) {
        /* Whole observer blocks at any alignment need block + 4 KiB per
         * slot: fewer, larger slots within the same staging bound. */
        const uint64_t need = ckptio__align_up(block + ALIGN, ALIGN);
        unsigned m = n;
        while (m > 1 && (uint64_t)m * CKPTIO_GPU_NSLOTS * need > staging) m--;
        if ((uint64_t)m * CKPTIO_GPU_NSLOTS * need <= staging) {
            n = m;
            s = need;
        }
    }
    *nworkers = n;
    *slot = s;
}

/* Object reads: the host path's GETs (CKPTIO_OPT_CHUNK_BYTES each, up to
 * CKPTIO_OPT_S3_CONCURRENCY in flight over all workers), staged. Every GET
 * costs the server a fixed amount (signature check, segment lookup), so a
 * window is not cut finer than the chunk: a worker reads `gets` whole
 * chunks per window, all in flight, while its other read slot is copied to
 * the device. Workers x read slots x window stay within the staging bound:
 * fewer GETs per window first, then fewer workers, then smaller GETs. */
unsigned ckptio__gpu_object_geometry(ckptio_engine *engine, bool inline_only, const ckptio_extent *extents,
                                     size_t count, unsigned *nworkers, uint64_t *get_bytes) {
    size_t i = 0;
    while (i < count && !(extents[i].length && extents[i].file->object)) i++;
    if (i == count) return 0;
    const int64_t threads = ckptio__engine_setting(engine, CKPTIO_OPT_THREADS);
    int64_t c = ckptio__engine_setting(engine, CKPTIO_OPT_S3_CONCURRENCY);
    const unsigned conc = c < 1 ? 1u : c > CKPTIO_GPU_MAX_WORKERS * CKPTIO_GPU_OBJECT_GETS_MAX
                                           ? CKPTIO_GPU_MAX_WORKERS * CKPTIO_GPU_OBJECT_GETS_MAX
                                           : (unsigned)c;
    unsigned n = 1;
    if (!inline_only && threads >= 1)
        n = (unsigned)(threads > CKPTIO_GPU_MAX_WORKERS ? CKPTIO_GPU_MAX_WORKERS : threads);
    if (n > conc) n = conc;
    unsigned per = conc / n;
    if (per > CKPTIO_GPU_OBJECT_GETS_MAX) per = CKPTIO_GPU_OBJECT_GETS_MAX;
    const uint64_t staging = (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_STAGING_BYTES);
    uint64_t chunk = (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_CHUNK_BYTES);
    chunk = chunk < ALIGN ? ALIGN : ckptio__align_down(chunk, ALIGN);
    while ((uint64_t)n * CKPTIO_GPU_READ_SLOTS * per * chunk > staging && (per > 1 || n > 1)) {
        if (per > 1) per--;
        else n--;
    }
    if (CKPTIO_GPU_READ_SLOTS * chunk > staging) {
        chunk = ckptio__align_down(staging / CKPTIO_GPU_READ_SLOTS, ALIGN);
        if (chunk < ALIGN) chunk = ALIGN;
    }
    *nworkers = n;
    *get_bytes = chunk;
    return per;
}

uint64_t ckptio__gpu_read_slot(ckptio_engine *engine, const ckptio__gpu_state *st, unsigned nworkers, uint64_t slot) {
    const uint64_t staging = (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_STAGING_BYTES);
    if (st->slot_bytes > slot && (uint64_t)nworkers * CKPTIO_GPU_READ_SLOTS * st->slot_bytes <= staging &&
        ckptio__gpu_pinned_slots(st, CKPTIO_GPU_MAX_WORKERS, CKPTIO_GPU_NSLOTS) > 0)
        return st->slot_bytes;
    return slot;
}

void ckptio__gpu_load_geometry(ckptio_engine *engine, unsigned *nworkers, uint64_t *slot) {
    ckptio__gpu_geometry(engine, false, 0, nworkers, slot);
}
