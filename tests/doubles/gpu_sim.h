/*
 * gpu_sim.h - a simulated GPU for tests on machines without one (test-only
 * library, tests/doubles: never part of the shipped libckptio).
 *
 * "Device" memory is host memory handed out by ckptio__gpu_sim_device_alloc;
 * each stream is a thread executing its queue in order, with an optional
 * random delay before every copy, so completion is really asynchronous.
 * The simulator checks the pipeline's discipline and records what it saw:
 *  - the source of every copy is hashed when the copy is queued and again
 *    when it runs; a difference (a staging slot reused too early) counts a
 *    violation;
 *  - the destination of a device-to-host copy is poisoned when the copy is
 *    queued and the source of a host-to-device copy after it ran, so code
 *    that reads staging memory before the copy finished, or after it was
 *    consumed, moves poison bytes that byte comparisons catch;
 *  - copy failures can be injected at queue time or at run time (the latter
 *    surfaces at event_sync, like a real asynchronous error).
 * Install it with ckptio__gpu_set_ops(ckptio__gpu_sim_ops()).
 */
#ifndef CKPTIO_GPU_SIM_H
#define CKPTIO_GPU_SIM_H

#include "gpu_ops.h"

#define CKPTIO_SIM_POISON_D2H 0xDB /* dst of a queued device-to-host copy */
#define CKPTIO_SIM_POISON_USED 0xA5 /* src of a completed host-to-device copy */

typedef struct ckptio__gpu_sim_config {
    unsigned copy_delay_us;    /* each copy waits 0..copy_delay_us before running */
    uint64_t fail_enqueue_at;  /* the n-th copy (1-based) fails when queued; 0 = never */
    uint64_t fail_run_at;      /* the n-th copy fails when it runs; 0 = never */
    uint64_t device_free;      /* what mem_info reports free (default 1 GiB) */
    bool no_register;          /* slot_pin is CKPTIO_E_UNSUPPORTED (a device that cannot register host memory) */
    unsigned pinned_delay_us;  /* each pinned allocation takes this long */
    uint64_t fail_pinned_at;   /* the n-th pinned allocation (1-based) fails; 0 = never */
    bool events_busy;          /* event_done says "not yet" whatever the copies did (a slow device) */
    bool events_settle;        /* event_done waits for the copies, then says "done" (a fast device) */
} ckptio__gpu_sim_config;

typedef struct ckptio__gpu_sim_stats {
    uint64_t copies;             /* copies queued (a pitched copy counts once) */
    uint64_t copies_2d;          /* of those, pitched copies of 2 or more rows */
    uint64_t bytes_h2d, bytes_d2h;
    uint64_t violations;         /* copy sources modified while the copy was in flight */
    uint64_t max_pending;        /* most copies queued but not yet run, at any moment */
    uint64_t pinned_now, pinned_peak; /* pinned bytes allocated */
    uint64_t pinned_allocs;      /* pinned allocations made */
    uint64_t pinned_huge_allocs; /* of those, asked for huge pages */
    uint64_t pinned_frees;       /* pinned allocations freed */
    uint64_t pinned_frees_while_waiting; /* of those, freed (or unpinned) while a stream waited on a host word
                                          * not written yet: cuMemFreeHost synchronises a real device, which
                                          * would wait for that stream: a deadlock when the host writes the
                                          * word after the free */
    int64_t ctx_depth;           /* ctx_enter minus ctx_leave (0 when balanced) */
    uint64_t streams_live, events_live;
    uint64_t stream_waits;       /* stream_wait_event calls (a stream made to wait for an event) */
} ckptio__gpu_sim_stats;

/* The simulated device's operations table, for ckptio__gpu_set_ops(). */
const ckptio__gpu_ops *ckptio__gpu_sim_ops(void);

/* Resets counters and applies `cfg` (NULL = defaults). Call with no work in flight. */
void ckptio__gpu_sim_configure(const ckptio__gpu_sim_config *cfg);
void ckptio__gpu_sim_get_stats(ckptio__gpu_sim_stats *out);

/* Simulated device memory (device 0), zero-filled; NULL on failure. */
void *ckptio__gpu_sim_device_alloc(size_t bytes);
void ckptio__gpu_sim_device_free(void *ptr);
/* As above, but the driver knows it as separate allocations of `piece` bytes back to back (the last one
 * shorter): with `mapped`, pieces of one reservation mapped with cuMemMap (torch's expandable_segments),
 * without, cudaMalloc allocations that happen to be neighbours. Freed with ckptio__gpu_sim_device_free. */
void *ckptio__gpu_sim_device_alloc_pieces(size_t bytes, size_t piece, bool mapped);

/* Queues fn(arg) on a simulated stream, like a kernel launch. */
ckptio_status ckptio__gpu_sim_launch(void *stream, void (*fn)(void *arg), void *arg);

#endif /* CKPTIO_GPU_SIM_H */
