/*
 * gpu_geometry.c - how a GPU transfer is laid out before it runs: how many
 * workers, how large their staging slots (and so the windows), whether the
 * slots use huge pages, with the experiment knobs that change them
 * (CKPTIO_GPU_READ_SLOTS, _READ_WORKERS, _SLOT_MAX_BYTES, _HUGE_SLOTS;
 * docs/GPU.md) and the reader of every GPU knob, ckptio__gpu_env_size.
 * Everything here reads the engine's settings or the environment: call it
 * on a caller's thread, never on a pipeline worker, which could race a
 * setenv.
 */
#include "engine_internal.h"
#include "gpu_pipeline.h"
#include "io_internal.h"

#include <stdint.h>
#include <stdlib.h>

#define ALIGN ((uint64_t)CKPTIO_DIRECT_ALIGN)

size_t ckptio__gpu_env_size(const char *name, size_t fallback) {
    uint64_t n;
    return ckptio__parse_size(getenv(name), &n) && n <= SIZE_MAX ? (size_t)n : fallback;
}

/* An experiment knob: the variable's value when it is 1..max, else `fallback`. */
static unsigned env_knob(const char *name, unsigned max, unsigned fallback) {
    const size_t n = ckptio__gpu_env_size(name, fallback);
    return n >= 1 && n <= max ? (unsigned)n : fallback;
}

unsigned ckptio__gpu_read_slots(void) {
    return env_knob("CKPTIO_GPU_READ_SLOTS", CKPTIO_GPU_NSLOTS, CKPTIO_GPU_READ_SLOTS);
}

unsigned ckptio__gpu_read_workers(void) {
    return env_knob("CKPTIO_GPU_READ_WORKERS", CKPTIO_GPU_MAX_WORKERS, CKPTIO_GPU_MAX_WORKERS);
}

bool ckptio__gpu_huge_slots(uint64_t pin_bytes) {
    switch (ckptio__gpu_env_size("CKPTIO_GPU_HUGE_SLOTS", 2)) { /* unset, empty or not a number: 2, auto */
    case 0: return false;
    case 1: return true;
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
 * Slots (and so windows) are at most 4 MiB, and a read worker rotates
 * through 2 of its 4 (CKPTIO_GPU_READ_SLOTS). Measured from the page cache
 * and tmpfs on an H200 host with 300 MiB of L3 (bench/probe_pipeline.c,
 * docs/GPU.md): the copies to the GPU reach 51 GB/s in 2 MiB pieces and 53
 * in 4 MiB ones, and the CPU copies into the slots keep pace only while
 * all slots together stay in the CPU caches: 16 workers x 2 slots x 4 MiB
 * (128 MiB) staged at 53.1 GB/s, x 4 slots x 2 MiB (128 MiB) at 51.3,
 * x 4 slots x 4 MiB (256 MiB) at 42.5. A process's first load pins those
 * 128 MiB, as before. Writes queue up to 4 copies ahead in 4 slots. (12
 * read workers matched 16 in the probe with a quarter less CPU; in ckptio
 * they lost 3% from tmpfs: CKPTIO_GPU_READ_WORKERS is there to measure.) */
void ckptio__gpu_geometry(ckptio_engine *engine, bool inline_only, uint64_t block, unsigned *nworkers,
                         uint64_t *slot) {
    int64_t threads = ckptio__engine_setting(engine, CKPTIO_OPT_THREADS);
    unsigned n = 1;
    if (!inline_only && threads >= 1)
        n = (unsigned)(threads > CKPTIO_GPU_MAX_WORKERS ? CKPTIO_GPU_MAX_WORKERS : threads);
    const uint64_t staging = (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_STAGING_BYTES);
    uint64_t chunk = (uint64_t)ckptio__engine_setting(engine, CKPTIO_OPT_CHUNK_BYTES);
    chunk = chunk < ALIGN ? ALIGN : ckptio__align_down(chunk, ALIGN);
    /* CKPTIO_GPU_SLOT_MAX_BYTES: an experiment knob, kept 4 KiB-aligned like every slot. */
    const uint64_t slot_max =
        ckptio__align_down(ckptio__gpu_env_size("CKPTIO_GPU_SLOT_MAX_BYTES", CKPTIO_GPU_SLOT_MAX), ALIGN);
    uint64_t s;
    for (;;) {
        s = ckptio__align_down(staging / ((uint64_t)n * CKPTIO_GPU_NSLOTS), ALIGN);
        if (s > chunk) s = chunk;
        if (s > slot_max) s = slot_max;
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

unsigned ckptio__gpu_read_worker_cap(unsigned nworkers) {
    const unsigned cap = ckptio__gpu_read_workers();
    return nworkers > cap ? cap : nworkers;
}

void ckptio__gpu_load_geometry(ckptio_engine *engine, unsigned *nworkers, uint64_t *slot) {
    ckptio__gpu_geometry(engine, false, 0, nworkers, slot);
    *nworkers = ckptio__gpu_read_worker_cap(*nworkers);
}
