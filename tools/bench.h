/*
 * bench.h - what the parts of `ckptio bench` share: the measured rows, the
 * run record, raw-ceiling I/O and page-cache control.
 */
#ifndef CKPTIO_CLI_BENCH_H
#define CKPTIO_CLI_BENCH_H

#include "cli.h"

#define BENCH_MAX_REPEAT 16

/* Every measurement, in the order the table prints them. Raw rows are the
 * ceilings the ckptio rows are compared with. */
typedef enum bench_row {
    BENCH_RAW_WRITE = 0,     /* O_DIRECT write, 8 MiB blocks, N threads, + fsync */
    BENCH_RAW_READ_DIRECT,   /* O_DIRECT read, cold */
    BENCH_RAW_READ_BUFFERED, /* buffered read, cold (kernel readahead) */
    BENCH_RAW_READ_CACHED,   /* buffered read, file in the page cache */
    BENCH_SAVE,              /* ckptio_safetensors_save (durable) */
    BENCH_LOAD_COLD,         /* open + read_all + close, cache dropped */
    BENCH_LOAD_COLD_DIRECT,  /* the same with CKPTIO_READ_CACHE=off (only where run->cold_direct) */
    BENCH_LOAD_WARM,         /* the same, file in the page cache */
    BENCH_ROW_COUNT
} bench_row;

/* Counters of one ckptio phase (deltas of ckptio_stats). */
typedef struct bench_phase_stats {
    uint64_t bytes;
    uint64_t bytes_direct;
    uint64_t bytes_buffered;
    uint64_t bytes_bounced;
    uint64_t io_requests;
    double seconds_fsync;
} bench_phase_stats;

/* Everything one `ckptio bench` run decided and measured. */
typedef struct bench_run {
    /* what was asked */
    uint64_t size;            /* total tensor bytes */
    unsigned tensors;
    uint64_t tensor_bytes;    /* bytes of each tensor */
    unsigned repeat;
    unsigned raw_threads;
    uint64_t raw_block;
    char dir[4096];           /* the temporary directory */
    const char *fs_note;      /* NULL, or why the directory is not a disk */
    char virtual_disk[32];    /* "" or the virtio disk the directory is on ("vda") */
    /* the engine as it ran */
    const char *backend;
    int64_t threads, chunk_bytes, direct, read_cache;
    /* what happened */
    unsigned done;            /* repetitions completed */
    double seconds[BENCH_ROW_COUNT][BENCH_MAX_REPEAT];
    bool raw_write_direct, raw_read_direct;
    /* The default cold load read through the page cache (the read policy
     * caches a file that fits in memory): the same load is measured again
     * with the policy off (BENCH_LOAD_COLD_DIRECT), decided on the first
     * repetition. */
    bool cold_direct;
    const char *cache_method;
    double resident_after_drop;   /* largest fraction of a file still cached after a drop */
    double resident_before_warm;  /* smallest fraction cached before a warm load */
    bench_phase_stats phase[BENCH_ROW_COUNT]; /* ckptio rows, last repetition */
    unsigned loads_verified;
} bench_run;

/* Median seconds of a row over the completed repetitions. */
double bench_median_seconds(const bench_run *run, bench_row row);
/* GB/s (1e9 bytes per second) of a row's median. */
double bench_gbps(const bench_run *run, bench_row row);
/* Whether a row has results: every row but BENCH_LOAD_COLD_DIRECT, and that
 * one where run->cold_direct. */
bool bench_row_measured(const bench_run *run, bench_row row);
/* The raw row a ckptio row is compared with (the faster cold read for a
 * cold load, the O_DIRECT read for one with the read cache off), or
 * BENCH_ROW_COUNT for a raw row. */
bench_row bench_ceiling_of(const bench_run *run, bench_row row);
const char *bench_row_label(const bench_run *run, bench_row row);
const char *bench_row_key(bench_row row);

/* ---- raw I/O and the page cache (bench_raw.c) ----------------------------- */

/* Moves `size` bytes between `buf` and `path` in `block`-sized requests
 * taken in order by `nthreads` threads; a write creates the file, sizes it
 * first and ends with fsync. With `direct`, O_DIRECT is used unless the file
 * system refuses it (*used_direct tells). *seconds covers open to close.
 * Shows progress under `label`. Prints an error and returns -1 on failure. */
int bench_raw_transfer(const char *path, bool write, bool direct, void *buf, uint64_t size, unsigned nthreads,
                       uint64_t block, const char *label, double *seconds, bool *used_direct);

/* Evicts `path` from the page cache: fsync, posix_fadvise(DONTNEED), and
 * when permitted (root, writable) echo 1 > /proc/sys/vm/drop_caches.
 * *method names what was done; *resident is the fraction of the file's pages
 * still cached afterwards (mincore). Prints an error and returns -1. */
int bench_drop_cache(const char *path, const char **method, double *resident);

/* Reads `path` through the page cache so a warm load finds it there;
 * *resident is the fraction cached afterwards. Returns 0 or -1 (printed). */
int bench_prime_cache(const char *path, double *resident);

/* True when `dir` is on a virtio block device (a virtual machine's disk,
 * which the host may cache): `name` receives the disk's name ("vda"). */
bool bench_virtual_disk(const char *dir, char *name, size_t cap);

/* Fills `buf` with pseudo-random bytes (incompressible, never all zero). */
void bench_fill(void *buf, uint64_t size, uint64_t seed);

/* ---- a real model (bench_model.c) ------------------------------------------ */

/* `ckptio bench --model PATH`: loads the model (directory, index or file)
 * into host memory with `engine`, cold and warm, `repeat` times, beside the
 * raw ceilings of its files (read with `raw_threads` threads); prints a
 * table or JSON. Returns a CLI exit status. */
int bench_model_run(ckptio_engine *engine, const char *path, unsigned repeat, unsigned raw_threads, bool json);

/* ---- output (bench_report.c) ---------------------------------------------- */

void bench_print_table(const bench_run *run, FILE *out);
/* Why ratios above 100% happened, when some did: the rows and the causes
 * that apply to this run, in one paragraph (no newline at the end) in
 * buf; "" when every ratio is at most 100%. Returns buf. */
char *bench_ceiling_note(const bench_run *run, char *buf, size_t cap);
/* Returns 0, or -1 when out of memory (printed). */
int bench_print_json(const bench_run *run, FILE *out);

#endif /* CKPTIO_CLI_BENCH_H */
