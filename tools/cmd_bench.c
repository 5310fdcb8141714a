/*
 * cmd_bench.c - `ckptio bench`: in one run, on the same bytes, measure the
 * disk's raw ceilings and ckptio's safetensors save and load (cold and
 * warm), and report each ckptio number as a fraction of its ceiling.
 *
 * Every load is compared byte for byte with what was saved, so a fast but
 * wrong result can never be reported.
 */
#include "bench.h"

#include <errno.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#define BENCH_ALIGN 4096u
/* Tensors are 2-D BF16 [rows, BENCH_COLS]: one row is one 4 KiB block, so
 * every tensor, and the data section, stays O_DIRECT-aligned. */
#define BENCH_COLS 2048
#define BENCH_NAME_FMT "layers.%06u.weight"

static const cli_usage usage = {
    "bench",
    "usage: ckptio bench [--size SIZE] [--dir DIR] [--tensors N] [--threads N]\n"
    "                    [--backend auto|pread|io_uring] [--direct auto|on|off]\n"
    "                    [--raw-threads N] [--repeat N] [--json] [--keep]\n"
    "       ckptio bench --model DIR [--device cpu] [--threads N] [--backend B] [--direct D]\n"
    "                    [--raw-threads N] [--repeat N] [--json]\n",
    "\nMeasures, in one run on the same bytes in host memory:\n"
    "  raw ceilings   O_DIRECT write of 8 MiB blocks on several threads + fsync (dd-style),\n"
    "                 O_DIRECT read and buffered read with the file's pages dropped,\n"
    "                 buffered read from the page cache\n"
    "  ckptio         safetensors save (durable: fsync + atomic rename), load cold (pages\n"
    "                 dropped) and load warm (file in the page cache); where the cold load\n"
    "                 read through the page cache (the read policy caches a file that fits\n"
    "                 in memory), the cold load again with CKPTIO_READ_CACHE=off (O_DIRECT)\n"
    "and prints GB/s (1e9 bytes/s) and each ckptio number's ratio to its ceiling\n"
    "(cold load: the faster of the two cold raw reads; with the read cache off: the\n"
    "O_DIRECT read). Every load is compared with the saved bytes. Cold means: fsync,\n"
    "posix_fadvise(DONTNEED), and when running as root also /proc/sys/vm/drop_caches;\n"
    "the output says which ran.\n"
    "\noptions:\n"
    "  --size SIZE        bytes of tensor data (default 1G; K/M/G/T = KiB/MiB/GiB/TiB)\n"
    "  --dir DIR          where the temporary directory goes (default /var/tmp: a disk,\n"
    "                     where /tmp may be memory)\n"
    "  --tensors N        number of BF16 tensors (default 16)\n"
    "  --threads N        ckptio engine I/O threads (default: the engine's, CKPTIO_THREADS)\n"
    "  --backend B        auto, pread or io_uring (default: the engine's, CKPTIO_BACKEND)\n"
    "  --direct D         O_DIRECT policy auto, on or off (default: the engine's)\n"
    "  --raw-threads N    threads of the raw ceiling measurements (default 4)\n"
    "  --repeat N         runs of everything, medians reported (default 1, at most 16)\n"
    "  --json             print one JSON object (schema: docs/CLI.md) instead of the table\n"
    "  --keep             keep the temporary directory and its files\n"
    "  --model PATH       instead: load this model (a Hugging Face directory, its index or a\n"
    "                     safetensors file; all shards in one plan) cold and warm, beside the\n"
    "                     raw O_DIRECT and page-cache reads of its files; every load is\n"
    "                     compared with the files' bytes. Nothing is written.\n"
    "  --device DEV       where --model loads to: cpu (host memory; the only one so far)\n"
    "  -h, --help         show this help\n"
    "\nNeeds twice SIZE of host memory and twice SIZE of free space in DIR.\n"
    "exit status: 0 ok, 1 failure (I/O error, wrong bytes loaded), 2 bad command line,\n"
    "130/143 interrupted by SIGINT/SIGTERM (temporary files removed)\n",
};

typedef struct bench_options {
    uint64_t size;
    const char *dir;
    uint64_t tensors;
    int64_t threads;  /* -1: leave the engine's */
    int64_t backend;  /* -1: leave the engine's */
    int64_t direct;   /* -1: leave the engine's */
    uint64_t raw_threads;
    uint64_t repeat;
    bool json, keep;
    const char *model;  /* --model: a real model instead of generated data */
} bench_options;

/* State of one run: buffers, files, engine. */
typedef struct bench_ctx {
    bench_run *run;
    ckptio_engine *engine;
    unsigned char *src;   /* the tensors, back to back */
    unsigned char *dst;   /* where every read lands */
    ckptio_tensor_source *sources;
    char *names;
    int64_t shape[2];
    char raw_path[4200];
    char st_path[4200];
    cli_progress progress;
    bool keep;            /* --keep: leave the last raw file too */
} bench_ctx;

/* ---- ckptio phases ------------------------------------------------------ */

static void stats_delta(const ckptio_stats *a, const ckptio_stats *b, bench_phase_stats *out) {
    out->bytes = (b->bytes_read - a->bytes_read) + (b->bytes_written - a->bytes_written);
    out->bytes_direct = b->bytes_direct - a->bytes_direct;
    out->bytes_buffered = b->bytes_buffered - a->bytes_buffered;
    out->bytes_bounced = b->bytes_bounced - a->bytes_bounced;
    out->io_requests = b->io_requests - a->io_requests;
    out->seconds_fsync = b->seconds_fsync - a->seconds_fsync;
}

static int take_stats(bench_ctx *ctx, ckptio_stats *out) {
    ckptio_status st = ckptio_engine_stats(ctx->engine, out);
    if (st == CKPTIO_OK) return 0;
    cli_error_lib(NULL, st);
    return -1;
}

static int phase_save(bench_ctx *ctx, unsigned rep) {
    bench_run *run = ctx->run;
    ckptio_stats before, after;
    if (take_stats(ctx, &before) != 0) return -1;
    cli_progress_init(&ctx->progress, "save");
    double t0 = cli_now();
    ckptio_status st = ckptio_safetensors_save(ctx->engine, ctx->st_path, ctx->sources, run->tensors, NULL, 0,
                                               CKPTIO_SAFETENSORS_ALIGN_4K);
    double t1 = cli_now();
    cli_progress_finish(&ctx->progress, st == CKPTIO_OK);
    if (st != CKPTIO_OK) return cli_error_lib(ctx->st_path, st), -1;
    if (take_stats(ctx, &after) != 0) return -1;
    run->seconds[BENCH_SAVE][rep] = t1 - t0;
    stats_delta(&before, &after, &run->phase[BENCH_SAVE]);
    return 0;
}

/* Checks every tensor the file lists against the bytes it was saved from. */
static int check_loaded(bench_ctx *ctx, ckptio_safetensors *st, uint64_t data_offset, const char *what) {
    const bench_run *run = ctx->run;
    size_t count = 0;
    ckptio_status s = ckptio_safetensors_count(st, &count);
    if (s != CKPTIO_OK) return cli_error_lib(ctx->st_path, s), -1;
    if (count != run->tensors)
        return cli_error("%s: %s: file lists %zu tensors, %u were saved", ctx->st_path, what, count, run->tensors),
               -1;
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        if ((s = ckptio_safetensors_tensor(st, i, &info)) != CKPTIO_OK) return cli_error_lib(ctx->st_path, s), -1;
        unsigned idx = 0;
        char expect[64];
        if (sscanf(info.name, "layers.%u.weight", &idx) != 1 || idx >= run->tensors ||
            (snprintf(expect, sizeof expect, BENCH_NAME_FMT, idx), strcmp(expect, info.name) != 0))
            return cli_error("%s: %s: unexpected tensor name '%s'", ctx->st_path, what, info.name), -1;
        if (info.dtype != CKPTIO_DTYPE_BF16 || info.ndim != 2 || info.shape[0] != ctx->shape[0] ||
            info.shape[1] != ctx->shape[1] || info.nbytes != run->tensor_bytes)
            return cli_error("%s: %s: tensor '%s' has the wrong dtype, shape or size", ctx->st_path, what,
                             info.name),
                   -1;
        const unsigned char *got = ctx->dst + (info.file_offset - data_offset);
        const unsigned char *want = ctx->src + (uint64_t)idx * run->tensor_bytes;
        if (memcmp(got, want, run->tensor_bytes) != 0) {
            uint64_t at = 0;
            while (got[at] == want[at]) at++;
            return cli_error("%s: %s: tensor '%s' differs from the saved bytes at byte %llu (file offset %llu)",
                             ctx->st_path, what, info.name, (unsigned long long)at,
                             (unsigned long long)(info.file_offset + at)),
                   -1;
        }
    }
    return 0;
}

static int phase_load(bench_ctx *ctx, bench_row row, unsigned rep) {
    bench_run *run = ctx->run;
    const char *what = row == BENCH_LOAD_COLD          ? "load cold"
                       : row == BENCH_LOAD_COLD_DIRECT ? "load cold, read cache off"
                                                       : "load warm";
    ckptio_safetensors *st = NULL;
    ckptio_stats before, after;
    uint64_t data_offset = 0;
    int rc = -1;

    /* Zeroed (and faulted in) outside the timing, so a load that writes
     * nothing cannot pass the comparison and page faults are not timed. */
    memset(ctx->dst, 0, run->size);
    if (take_stats(ctx, &before) != 0) return -1;
    cli_progress_init(&ctx->progress, what);
    double t0 = cli_now();
    ckptio_status s = ckptio_safetensors_open(ctx->engine, ctx->st_path, &st);
    if (s == CKPTIO_OK) s = ckptio_safetensors_data_offset(st, &data_offset);
    if (s == CKPTIO_OK) s = ckptio_safetensors_read_all(st, ctx->dst, run->size, CKPTIO_MEM_HOST);
    double t1 = cli_now();
    cli_progress_finish(&ctx->progress, s == CKPTIO_OK);
    if (s != CKPTIO_OK) {
        cli_error_lib(ctx->st_path, s);
        goto out;
    }
    if (take_stats(ctx, &after) != 0) goto out;
    run->seconds[row][rep] = t1 - t0;
    stats_delta(&before, &after, &run->phase[row]);
    if (check_loaded(ctx, st, data_offset, what) != 0) goto out;
    run->loads_verified++;
    rc = 0;
out:
    ckptio_safetensors_close(st);
    return rc;
}

/* ---- raw phases ----------------------------------------------------------- */

static int raw_read(bench_ctx *ctx, bench_row row, bool direct, const char *label, unsigned threads,
                    unsigned rep) {
    bench_run *run = ctx->run;
    bool used_direct = false;
    double seconds = 0.0;
    memset(ctx->dst, 0, run->size);
    if (bench_raw_transfer(ctx->raw_path, false, direct, ctx->dst, run->size, threads, run->raw_block, label,
                           &seconds, &used_direct) != 0)
        return -1;
    /* A row measured more than once in a repetition keeps its best time. */
    if (run->seconds[row][rep] == 0.0 || seconds < run->seconds[row][rep]) run->seconds[row][rep] = seconds;
    if (row == BENCH_RAW_READ_DIRECT) run->raw_read_direct = used_direct;
    /* A ceiling is only meaningful if it moved the right bytes. */
    if (memcmp(ctx->dst, ctx->src, run->size) != 0)
        return cli_error("%s: raw read returned different bytes than were written", ctx->raw_path), -1;
    return 0;
}

static int drop(bench_ctx *ctx, const char *path) {
    double resident = 0.0;
    if (bench_drop_cache(path, &ctx->run->cache_method, &resident) != 0) return -1;
    if (resident > ctx->run->resident_after_drop) ctx->run->resident_after_drop = resident;
    return 0;
}

/* Whether the default cold load went through the page cache because the
 * read policy chose to (DIRECT=auto, a file on a disk, the policy not off):
 * then O_DIRECT is measured too, or a reader comparing the cold load with
 * the O_DIRECT ceiling would see only the policy's price. */
static bool cold_load_was_cached(const bench_run *run) {
    const bench_phase_stats *cold = &run->phase[BENCH_LOAD_COLD];
    return run->direct == CKPTIO_DIRECT_AUTO && run->fs_note == NULL &&
           (run->read_cache == CKPTIO_READ_CACHE_AUTO || run->read_cache == CKPTIO_READ_CACHE_ON) &&
           cold->bytes_buffered > cold->bytes_direct;
}

/* The cold load again with the read policy off (CKPTIO_READ_CACHE=off),
 * the engine's setting (run->read_cache) restored afterwards. */
static int load_cold_direct(bench_ctx *ctx, unsigned rep) {
    ckptio_status st = ckptio_engine_set(ctx->engine, CKPTIO_OPT_READ_CACHE, CKPTIO_READ_CACHE_OFF);
    if (st != CKPTIO_OK) return cli_error_lib(NULL, st), -1;
    int rc = drop(ctx, ctx->st_path) != 0 || phase_load(ctx, BENCH_LOAD_COLD_DIRECT, rep) != 0 ? -1 : 0;
    st = ckptio_engine_set(ctx->engine, CKPTIO_OPT_READ_CACHE, ctx->run->read_cache);
    if (st != CKPTIO_OK) return cli_error_lib(NULL, st), -1;
    return rc;
}

static int one_repetition(bench_ctx *ctx, unsigned rep) {
    bench_run *run = ctx->run;
    bool used_direct = false;
    double resident = 0.0;

    if (bench_raw_transfer(ctx->raw_path, true, true, ctx->src, run->size, run->raw_threads, run->raw_block,
                           "raw write", &run->seconds[BENCH_RAW_WRITE][rep], &used_direct) != 0)
        return -1;
    run->raw_write_direct = used_direct;
    if (drop(ctx, ctx->raw_path) != 0 ||
        raw_read(ctx, BENCH_RAW_READ_DIRECT, true, "raw read direct", run->raw_threads, rep) != 0 ||
        drop(ctx, ctx->raw_path) != 0 ||
        raw_read(ctx, BENCH_RAW_READ_BUFFERED, false, "raw read buffered", run->raw_threads, rep) != 0 ||
        /* The buffered read just filled the cache: this one is warm. Copying
         * from the cache is CPU-bound, and on a machine with few cores one
         * thread can beat several: the ceiling is the better of both. */
        bench_prime_cache(ctx->raw_path, &resident) != 0 ||
        raw_read(ctx, BENCH_RAW_READ_CACHED, false, "raw read cached", run->raw_threads, rep) != 0 ||
        (run->raw_threads > 1 && raw_read(ctx, BENCH_RAW_READ_CACHED, false, "raw read cached", 1, rep) != 0))
        return -1;
    /* Room on the disk and in the cache for ckptio's file. */
    bool last = rep + 1 == run->repeat;
    if (!(ctx->keep && last) && unlink(ctx->raw_path) != 0)
        return cli_error("%s: unlink: %s", ctx->raw_path, strerror(errno)), -1;
    if (cli_interrupted) return cli_error("interrupted"), -1;

    if (phase_save(ctx, rep) != 0 || drop(ctx, ctx->st_path) != 0 || phase_load(ctx, BENCH_LOAD_COLD, rep) != 0)
        return -1;
    if (bench_prime_cache(ctx->st_path, &resident) != 0) return -1;
    if (rep == 0 || resident < run->resident_before_warm) run->resident_before_warm = resident;
    if (phase_load(ctx, BENCH_LOAD_WARM, rep) != 0) return -1;
    if (rep == 0) run->cold_direct = cold_load_was_cached(run);
    if (run->cold_direct && load_cold_direct(ctx, rep) != 0) return -1;
    if (cli_interrupted) return cli_error("interrupted"), -1;
    return 0;
}

/* ---- setup ---------------------------------------------------------------- */

static int configure_engine(bench_ctx *ctx, const bench_options *opt) {
    static const struct {
        ckptio_option option;
        size_t field;
    } wanted[] = {
        {CKPTIO_OPT_THREADS, offsetof(bench_options, threads)},
        {CKPTIO_OPT_BACKEND, offsetof(bench_options, backend)},
        {CKPTIO_OPT_DIRECT, offsetof(bench_options, direct)},
    };
    for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
        int64_t v = *(const int64_t *)((const char *)opt + wanted[i].field);
        if (v < 0) continue;
        ckptio_status st = ckptio_engine_set(ctx->engine, wanted[i].option, v);
        if (st != CKPTIO_OK) return cli_error_lib(NULL, st), -1;
    }
    ckptio_status st = ckptio_engine_set_progress(ctx->engine, cli_progress_engine_cb, &ctx->progress);
    if (st != CKPTIO_OK) return cli_error_lib(NULL, st), -1;
    return 0;
}

static void describe_engine(bench_ctx *ctx) {
    bench_run *run = ctx->run;
    ckptio_backend b = CKPTIO_BACKEND_AUTO;
    run->backend = ckptio_engine_backend(ctx->engine, &b) == CKPTIO_OK ? ckptio_backend_name(b) : "?";
    if (ckptio_engine_get(ctx->engine, CKPTIO_OPT_THREADS, &run->threads) != CKPTIO_OK) run->threads = -1;
    if (ckptio_engine_get(ctx->engine, CKPTIO_OPT_CHUNK_BYTES, &run->chunk_bytes) != CKPTIO_OK) run->chunk_bytes = -1;
    if (ckptio_engine_get(ctx->engine, CKPTIO_OPT_DIRECT, &run->direct) != CKPTIO_OK) run->direct = -1;
    if (ckptio_engine_get(ctx->engine, CKPTIO_OPT_READ_CACHE, &run->read_cache) != CKPTIO_OK) run->read_cache = -1;
}

static int make_tensors(bench_ctx *ctx) {
    bench_run *run = ctx->run;
    size_t name_len = 32;
    ctx->sources = calloc(run->tensors, sizeof *ctx->sources);
    ctx->names = malloc((size_t)run->tensors * name_len);
    if (ctx->sources == NULL || ctx->names == NULL) return cli_error("out of memory"), -1;
    ctx->shape[0] = (int64_t)(run->tensor_bytes / (BENCH_COLS * 2));
    ctx->shape[1] = BENCH_COLS;
    for (unsigned i = 0; i < run->tensors; i++) {
        char *name = ctx->names + (size_t)i * name_len;
        snprintf(name, name_len, BENCH_NAME_FMT, i);
        ctx->sources[i] = (ckptio_tensor_source){name, CKPTIO_DTYPE_BF16, 2, ctx->shape,
                                                 ctx->src + (uint64_t)i * run->tensor_bytes, run->tensor_bytes,
                                                 CKPTIO_MEM_HOST};
    }
    return 0;
}

static int run_bench(const bench_options *opt, bench_run *run) {
    int rc = CLI_EXIT_FAIL;
    bench_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.run = run;
    ctx.keep = opt->keep;
    bool made_dir = false;

    snprintf(run->dir, sizeof run->dir, "%s/ckptio-bench-XXXXXX", opt->dir);
    if (mkdtemp(run->dir) == NULL) {
        cli_error("%s: cannot create a temporary directory: %s", opt->dir, strerror(errno));
        goto out;
    }
    made_dir = true;
    snprintf(ctx.raw_path, sizeof ctx.raw_path, "%s/raw.bin", run->dir);
    snprintf(ctx.st_path, sizeof ctx.st_path, "%s/bench.safetensors", run->dir);
    struct statfs fs;
    if (statfs(run->dir, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC))
        run->fs_note = "the directory is in memory (tmpfs/ramfs), not on a disk: use --dir on a disk";
    bench_virtual_disk(run->dir, run->virtual_disk, sizeof run->virtual_disk);

    if (posix_memalign((void **)&ctx.src, BENCH_ALIGN, (size_t)run->size) != 0 ||
        posix_memalign((void **)&ctx.dst, BENCH_ALIGN, (size_t)run->size) != 0) {
        cli_error("cannot allocate 2 x %llu bytes of host memory", (unsigned long long)run->size);
        goto out;
    }
    bench_fill(ctx.src, run->size, 0xC4E7u);
    if (make_tensors(&ctx) != 0) goto out;
    if ((ctx.engine = cli_engine_create()) == NULL || configure_engine(&ctx, opt) != 0) goto out;
    /* Before the repetitions, which decide by the settings (cold_load_was_cached) and restore them
     * (load_cold_direct); after them again for the backend that ran (io_uring may have fallen back). */
    describe_engine(&ctx);
    for (unsigned rep = 0; rep < run->repeat; rep++) {
        if (one_repetition(&ctx, rep) != 0) goto out;
        run->done = rep + 1;
    }
    describe_engine(&ctx);
    if (opt->json) {
        if (bench_print_json(run, stdout) != 0) goto out;
    } else {
        bench_print_table(run, stdout);
    }
    rc = CLI_EXIT_OK;
out:
    cli_progress_finish(&ctx.progress, false);
    ckptio_engine_destroy(ctx.engine);
    free(ctx.src);
    free(ctx.dst);
    free(ctx.sources);
    free(ctx.names);
    if (made_dir && !opt->keep) {
        /* Only files this run created; never a recursive delete. */
        unlink(ctx.raw_path);
        unlink(ctx.st_path);
        if (rmdir(run->dir) != 0 && rc == CLI_EXIT_OK)
            cli_error("%s: could not remove the temporary directory: %s", run->dir, strerror(errno));
    } else if (made_dir) {
        fprintf(opt->json ? stderr : stdout, "kept: %s\n", cli_q(run->dir));
    }
    return rc;
}

/* ---- command line --------------------------------------------------------- */

static int parse_choice(const char *text, const char *const *names, size_t n, int64_t *out) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(text, names[i]) == 0) return *out = (int64_t)i, 0;
    return -1;
}

int cli_cmd_bench(int argc, char **argv) {
    enum { O_SIZE = 256, O_DIR, O_TENSORS, O_THREADS, O_BACKEND, O_DIRECT_, O_RAW_THREADS, O_REPEAT, O_JSON, O_KEEP,
           O_MODEL, O_DEVICE };
    static const struct option longopts[] = {
        {"size", required_argument, NULL, O_SIZE},
        {"dir", required_argument, NULL, O_DIR},
        {"tensors", required_argument, NULL, O_TENSORS},
        {"threads", required_argument, NULL, O_THREADS},
        {"backend", required_argument, NULL, O_BACKEND},
        {"direct", required_argument, NULL, O_DIRECT_},
        {"raw-threads", required_argument, NULL, O_RAW_THREADS},
        {"repeat", required_argument, NULL, O_REPEAT},
        {"json", no_argument, NULL, O_JSON},
        {"keep", no_argument, NULL, O_KEEP},
        {"model", required_argument, NULL, O_MODEL},
        {"device", required_argument, NULL, O_DEVICE},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    /* Indexed by the enum values: ckptio_backend and ckptio_direct_mode. */
    static const char *const backends[] = {"auto", "pread", "io_uring"};
    static const char *const directs[] = {"auto", "off", "on"};
    bench_options opt = {1ull << 30, "/var/tmp", 16, -1, -1, -1, 4, 1, false, false, NULL};
    uint64_t v = 0;
    for (int c; (c = cli_next_option(argc, argv, "h", longopts, &usage)) != CLI_OPT_END;) {
        switch (c) {
        case 'h': cli_usage_print(&usage); return CLI_EXIT_OK;
        case O_SIZE:
            if (cli_parse_size(optarg, &opt.size) != 0 || opt.size == 0)
                return cli_usage_error(&usage, "--size: '%s' is not a size like 512M or 1G", optarg);
            break;
        case O_DIR: opt.dir = optarg; break;
        case O_TENSORS:
            if (cli_parse_uint(optarg, 1, 1000000, &opt.tensors) != 0)
                return cli_usage_error(&usage, "--tensors: '%s' is not a count from 1 to 1000000", optarg);
            break;
        case O_THREADS: {
            /* The engine's own bounds, so the message can say what is allowed. */
            int64_t lo = 0, hi = 0;
            if (ckptio_option_bounds(CKPTIO_OPT_THREADS, &lo, &hi) != CKPTIO_OK) lo = 0, hi = 0;
            if (cli_parse_uint(optarg, (uint64_t)lo, (uint64_t)hi, &v) != 0)
                return cli_usage_error(&usage, "--threads: '%s' is not a count from %lld to %lld", optarg,
                                       (long long)lo, (long long)hi);
            opt.threads = (int64_t)v;
            break;
        }
        case O_BACKEND:
            if (parse_choice(optarg, backends, 3, &opt.backend) != 0)
                return cli_usage_error(&usage, "--backend: '%s' is not auto, pread or io_uring", optarg);
            break;
        case O_DIRECT_:
            if (parse_choice(optarg, directs, 3, &opt.direct) != 0)
                return cli_usage_error(&usage, "--direct: '%s' is not auto, on or off", optarg);
            break;
        case O_RAW_THREADS:
            if (cli_parse_uint(optarg, 1, 256, &opt.raw_threads) != 0)
                return cli_usage_error(&usage, "--raw-threads: '%s' is not a count from 1 to 256", optarg);
            break;
        case O_REPEAT:
            if (cli_parse_uint(optarg, 1, BENCH_MAX_REPEAT, &opt.repeat) != 0)
                return cli_usage_error(&usage, "--repeat: '%s' is not a count from 1 to %d", optarg,
                                       BENCH_MAX_REPEAT);
            break;
        case O_JSON: opt.json = true; break;
        case O_KEEP: opt.keep = true; break;
        case O_MODEL: opt.model = optarg; break;
        case O_DEVICE:
            if (strcmp(optarg, "cpu") != 0)
                return cli_usage_error(&usage, "--device: '%s': the CLI loads to host memory (cpu) only. To time "
                                       "a GPU load, time ckptio.load(path, device=\"cuda\") in Python (the "
                                       "source repository's bench/bench_model_gpu.py measures it beside its peers)",
                                       optarg);
            break;
        default: return CLI_EXIT_USAGE;
        }
    }
    if (optind < argc) return cli_usage_error(&usage, "unexpected argument '%s'", argv[optind]);
    if (strlen(opt.dir) > 3000) return cli_usage_error(&usage, "--dir: path too long");
    if (opt.model) {
        bench_ctx ctx;
        memset(&ctx, 0, sizeof ctx);
        if ((ctx.engine = cli_engine_create()) == NULL) return CLI_EXIT_FAIL;
        int rc = configure_engine(&ctx, &opt) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
        /* No progress bar: the table follows the loads directly. */
        ckptio_engine_set_progress(ctx.engine, NULL, NULL);
        cli_catch_interrupts();
        if (rc == CLI_EXIT_OK)
            rc = bench_model_run(ctx.engine, opt.model, (unsigned)opt.repeat, (unsigned)opt.raw_threads, opt.json);
        ckptio_engine_destroy(ctx.engine);
        return rc;
    }

    /* Whole 4 KiB rows per tensor, so the sizes the table reports are the
     * sizes moved. */
    uint64_t per = opt.size / opt.tensors / BENCH_ALIGN * BENCH_ALIGN;
    if (per == 0)
        return cli_usage_error(&usage, "--size must give each of the %llu tensors at least 4 KiB",
                               (unsigned long long)opt.tensors);
    if (per * opt.tensors > (uint64_t)SIZE_MAX / 2)
        return cli_usage_error(&usage, "--size is larger than this machine can address");

    bench_run *run = calloc(1, sizeof *run);
    if (run == NULL) return cli_error("out of memory"), CLI_EXIT_FAIL;
    run->tensors = (unsigned)opt.tensors;
    run->tensor_bytes = per;
    run->size = per * opt.tensors;
    run->repeat = (unsigned)opt.repeat;
    run->raw_threads = (unsigned)opt.raw_threads;
    run->raw_block = 8u << 20;
    run->cache_method = "none";
    cli_catch_interrupts();
    int rc = run_bench(&opt, run);
    free(run);
    return rc;
}
