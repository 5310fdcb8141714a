/*
 * engine_private.h - the engine's own structures, shared by the files of
 * src/engine only (settings.c: the settings table; engine.c: lifetime,
 * statistics, progress; pool.c: threads; plan.c: plans and their
 * validation; exec.c: running a plan).
 */
#ifndef CKPTIO_ENGINE_PRIVATE_H
#define CKPTIO_ENGINE_PRIVATE_H

#include "engine_internal.h"
#include "io_internal.h"

#include <pthread.h>
#include <stdatomic.h>

/* ---- thread pool (pool.c) ---------------------------------------------- */

typedef struct ckptio__pool ckptio__pool;

/* Called on the waiting thread about every `tick_ms` while a job runs. */
typedef void (*ckptio__pool_tick_fn)(void *arg);

/* An empty pool (threads are added by ckptio__pool_run as needed). */
ckptio_status ckptio__pool_create(ckptio__pool **out);

/* Runs fn(arg, 0..n-1) on n pool threads at once (the pool grows so that
 * every worker of the job gets its own thread: workers may wait on each
 * other) and waits for all of them, calling tick (if not NULL) about every
 * tick_ms on the waiting thread. Thread-safe. */
ckptio_status ckptio__pool_run(ckptio__pool *pool, unsigned n, ckptio__worker_fn fn, void *arg,
                               ckptio__pool_tick_fn tick, void *tick_arg, unsigned tick_ms);

/* Stops and joins every thread. Accepts NULL. No job may be running. */
void ckptio__pool_destroy(ckptio__pool *pool);

/* A fork()ed child's copy of a pool whose threads ran in the parent: frees
 * its memory only. Its threads do not exist here, so there is nothing to
 * join, and its mutex and condition variables may be held or waited on by
 * threads that vanished, so they are not touched. Accepts NULL. */
void ckptio__pool_forget(ckptio__pool *pool);

/* ---- per-worker resources, kept between transfers ---------------------- */

typedef struct ckptio__worker_slot {
    const ckptio__backend_ops *backend; /* backend of `queue` */
    ckptio__io_queue *queue;
    unsigned depth;                     /* depth `queue` was created with */
    unsigned char *bounce;              /* CKPTIO_DIRECT_ALIGN-aligned, or NULL */
    size_t bounce_size;
    bool bounce_registered;             /* fixed buffer 0 of `queue` */
} ckptio__worker_slot;

/* ---- plans (plan.c) ---------------------------------------------------- */

struct ckptio_plan {
    ckptio_direction dir;
    ckptio_extent *ext;
    size_t count, cap;
    uint64_t total;
    ckptio__observer observer;          /* write plans only; fn NULL = none */
};

/* Checks every extent of `plan` for use by `engine` (files, ranges,
 * overlaps, end of file for reads). Errors name the extent indices. */
ckptio_status ckptio__plan_validate(ckptio_engine *engine, const ckptio_plan *plan);

/* ---- settings (settings.c: the table) ---------------------------------- */

typedef enum ckptio__setting_kind {
    CKPTIO__SETTING_INT,  /* a decimal integer */
    CKPTIO__SETTING_SIZE, /* a byte count in ckptio__parse_size's syntax ("8M") */
    CKPTIO__SETTING_ENUM, /* one of `names`, value i being names[i] */
    CKPTIO__SETTING_BOOL  /* 0/1, on/off, true/false, yes/no */
} ckptio__setting_kind;

/* One setting: a row of the table in settings.c. */
typedef struct ckptio__setting {
    const char *name;              /* ckptio_option_name(): "threads" */
    const char *env;               /* its environment variable: "CKPTIO_THREADS" */
    ckptio__setting_kind kind;
    int64_t def;                   /* the default, unless `compute` gives it */
    int64_t (*compute)(void);      /* NULL, or the default computed when an engine is created */
    const char *compute_doc;       /* how `compute` decides, for the docs */
    int64_t min, max;              /* ckptio_option_bounds() */
    int64_t multiple;              /* 0, or values must be a multiple of this */
    const char *const *names;      /* CKPTIO__SETTING_ENUM: the value names, NULL-terminated */
    const char *doc;               /* one line for docs/ENGINE.md */
} ckptio__setting;

/* A CKPTIO_* variable read outside the settings: once per process, or by the CLI. */
typedef struct ckptio__variable {
    const char *env;
    const char *doc;
} ckptio__variable;

/* The table row of `option`; NULL if invalid. */
const ckptio__setting *ckptio__setting_def(ckptio_option option);

/* The i-th variable read outside the settings; NULL past the last. */
const ckptio__variable *ckptio__variable_def(size_t i);

/* The environment variable of a setting ("CKPTIO_THREADS"); `option` valid. */
const char *ckptio__option_env(ckptio_option option);

/* Gives a new engine its settings: the defaults, the backend they resolve
 * to, then every setting's environment variable (a malformed or refused
 * value fails, naming the variable). */
ckptio_status ckptio__settings_init(ckptio_engine *engine);

/* ---- the engine -------------------------------------------------------- */

struct ckptio_engine {
    int64_t settings[CKPTIO_OPT_COUNT_];
    ckptio_backend backend;             /* resolved: PREAD or IO_URING */
    pthread_mutex_t lock;               /* stats, staging, pool creation */
    ckptio_stats stats;
    ckptio_progress_fn progress;
    void *progress_user;
    double progress_last;               /* time of the last callback */
    uint64_t progress_done, progress_total; /* what the last callback was told */
    /* While execute() runs its GPU part, GPU progress is rebased on the
     * whole plan: reported = base + done, out of plan_total. */
    bool progress_rebase;
    uint64_t progress_base, progress_plan_total;
    /* Between ckptio__engine_progress_span_begin and _end, every plan is
     * reported on the span's scale: reported = span_base + done, out of
     * span_total, span_base being the bytes of the span's plans before. */
    bool span;
    uint64_t span_base, span_total;
    _Atomic int busy;                   /* calls using the engine now */
    _Atomic int open_files;
    ckptio__pool *pool;
    ckptio__worker_slot *slots;
    unsigned nslots;
    const ckptio__device_provider *device; /* extents in device memory go here; NULL: none */
    void *gpu_state;
    void (*gpu_state_destroy)(void *state);
    ckptio__s3_part_pool *part_pool;    /* upload part buffers kept between uploads; NULL until the first */
    _Atomic(ckptio__object_peek *) peek; /* the object a probe opened, for the open after it (object_peek.c) */
    _Atomic unsigned generation;        /* ckptio__fork_generation() of the threads, rings and locks */
};

/* Call first in every function that uses the engine's pool, slots, lock or
 * GPU state: in a fork()ed child, the first call replaces what came from
 * the parent (engine.c says how). */
void ckptio__engine_fork_check(ckptio_engine *engine);

/* The user's progress callback, rate-limited unless `force`, with a plan's
 * `done` and `total` (inside a span, on the span's scale). Returns
 * CKPTIO_E_CANCELED (error record set) when the callback says stop. */
ckptio_status ckptio__engine_report(ckptio_engine *engine, uint64_t done, uint64_t total, bool force);

/* A plan's last report, after its every byte moved (done == total): its
 * answer cannot cancel anything, except inside a span before the span's
 * last plan, where an answer to stop fails the plan with
 * CKPTIO_E_CANCELED, so that the call's later plans do not run. */
ckptio_status ckptio__engine_plan_done(ckptio_engine *engine, uint64_t total);

/* The engine's pool, created on first use (thread-safe). */
ckptio_status ckptio__engine_pool(ckptio_engine *engine, ckptio__pool **out);

/* Makes sure engine->slots has at least n entries. */
ckptio_status ckptio__engine_reserve_slots(ckptio_engine *engine, unsigned n);

/* Releases a slot's queue and bounce buffer (updating staging stats). */
void ckptio__engine_slot_release(ckptio_engine *engine, ckptio__worker_slot *slot);

#endif /* CKPTIO_ENGINE_PRIVATE_H */
