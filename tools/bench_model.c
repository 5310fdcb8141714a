/*
 * bench_model.c - `ckptio bench --model DIR`: load a real model (a Hugging
 * Face directory, its index or one safetensors file) with ckptio_model_read
 * (all shards, one plan) into host memory, cold and warm, beside the raw
 * ceilings of the same files measured in the same run: the O_DIRECT read of
 * their aligned bytes (cold) and the buffered read from the page cache
 * (warm). Every load is compared with the files' bytes read without ckptio.
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { M_RAW_COLD, M_RAW_WARM, M_LOAD_COLD, M_LOAD_WARM, M_ROWS };

static const char *const row_label[M_ROWS] = {
    "raw read O_DIRECT (cold)", "raw read page cache (warm)", "ckptio model load, cold", "ckptio model load, warm"};
static const char *const row_key[M_ROWS] = {"raw_read_direct", "raw_read_cached", "load_cold", "load_warm"};

typedef struct model_ctx {
    const char *path;
    ckptio_engine *engine;
    ckptio_model *m;
    size_t count, nshards;
    uint64_t bytes;            /* tensor bytes of the model */
    uint64_t file_bytes;       /* bytes of the shard files */
    uint64_t max_file;
    unsigned char *dst;        /* every tensor, packed in model order */
    uint64_t *at;              /* tensor i at dst + at[i] */
    unsigned char *scratch;    /* one shard file, for the raw reads */
    double seconds[M_ROWS][BENCH_MAX_REPEAT];
    uint64_t raw_direct_bytes; /* bytes the O_DIRECT ceiling moves (aligned part of each file) */
    bool raw_direct;
    const char *cache_method;
} model_ctx;

static int shard_size(const char *path, uint64_t *size) {
    struct stat sb;
    if (stat(path, &sb) != 0) return cli_error("%s: stat: %s", path, strerror(errno)), -1;
    *size = (uint64_t)sb.st_size;
    return 0;
}

static int drop_all(model_ctx *c) {
    for (size_t s = 0; s < c->nshards; s++) {
        const char *path;
        double resident = 0;
        if (ckptio_model_shard(c->m, s, &path, NULL) != CKPTIO_OK) return cli_error_lib(c->path, CKPTIO_E_INTERNAL), -1;
        if (bench_drop_cache(path, &c->cache_method, &resident) != 0) return -1;
    }
    return 0;
}

static int prime_all(model_ctx *c) {
    for (size_t s = 0; s < c->nshards; s++) {
        const char *path;
        double resident = 0;
        if (ckptio_model_shard(c->m, s, &path, NULL) != CKPTIO_OK) return -1;
        if (bench_prime_cache(path, &resident) != 0) return -1;
    }
    return 0;
}

/* Raw reads of every shard file; with `check`, every tensor loaded into
 * dst is compared with the file's bytes. */
static int raw_pass(model_ctx *c, bool direct, unsigned threads, double *seconds, bool check) {
    *seconds = 0;
    for (size_t s = 0; s < c->nshards; s++) {
        const char *path;
        uint64_t size;
        ckptio_safetensors *st;
        if (ckptio_model_shard(c->m, s, &path, &st) != CKPTIO_OK || shard_size(path, &size) != 0) return -1;
        const uint64_t n = direct ? size / 4096 * 4096 : size;
        double t = 0;
        bool used = false;
        if (n && bench_raw_transfer(path, false, direct, c->scratch, n, threads, 8u << 20,
                                    direct ? "raw read direct" : "raw read cached", &t, &used) != 0)
            return -1;
        *seconds += t;
        if (direct && n && !used) c->raw_direct = false;
        if (!check) continue;
        if (n < size && bench_raw_transfer(path, false, false, c->scratch, size, 1, 8u << 20, "check", &t, &used) != 0)
            return -1;
        for (size_t i = 0; i < c->count; i++) {
            ckptio_tensor_info info;
            size_t shard;
            if (ckptio_model_tensor(c->m, i, &info, &shard) != CKPTIO_OK) return -1;
            if (shard == s && memcmp(c->dst + c->at[i], c->scratch + info.file_offset, info.nbytes) != 0)
                return cli_error("%s: tensor '%s' loaded by ckptio differs from the file's bytes", path, info.name),
                       -1;
        }
    }
    return 0;
}

static int load(model_ctx *c, double *seconds) {
    ckptio_slice_target *t = calloc(c->count + 1, sizeof *t);
    if (!t) return cli_error("out of memory"), -1;
    memset(c->dst, 0, c->bytes); /* a load that writes nothing cannot pass the check */
    for (size_t i = 0; i < c->count; i++) {
        ckptio_tensor_info info;
        ckptio_model_tensor(c->m, i, &info, NULL);
        t[i] = (ckptio_slice_target){.index = i, .data = c->dst + c->at[i], .capacity = info.nbytes,
                                     .mem_kind = CKPTIO_MEM_HOST};
    }
    const double t0 = cli_now();
    ckptio_status st = ckptio_model_read(c->m, t, c->count);
    *seconds = cli_now() - t0;
    free(t);
    if (st != CKPTIO_OK) return cli_error_lib(c->path, st), -1;
    return 0;
}

static double median(const double *v, unsigned n) {
    double s[BENCH_MAX_REPEAT];
    memcpy(s, v, n * sizeof *s);
    for (unsigned i = 1; i < n; i++)
        for (unsigned j = i; j > 0 && s[j] < s[j - 1]; j--) {
            const double x = s[j];
            s[j] = s[j - 1];
            s[j - 1] = x;
        }
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

int bench_model_run(ckptio_engine *engine, const char *path, unsigned repeat, unsigned raw_threads, bool json) {
    model_ctx c;
    memset(&c, 0, sizeof c);
    c.path = path;
    c.engine = engine;
    c.cache_method = "none";
    c.raw_direct = true;
    int rc = CLI_EXIT_FAIL;
    ckptio_status st = ckptio_model_open(engine, path, 0, &c.m);
    if (st != CKPTIO_OK) return cli_error_lib(path, st);
    ckptio_model_count(c.m, &c.count);
    ckptio_model_shard_count(c.m, &c.nshards);
    if (!(c.at = calloc(c.count + 1, sizeof *c.at))) goto oom;
    for (size_t i = 0; i < c.count; i++) {
        ckptio_tensor_info info;
        ckptio_model_tensor(c.m, i, &info, NULL);
        c.at[i] = c.bytes;
        c.bytes += (info.nbytes + 63) / 64 * 64; /* 64-byte aligned, like allocator-made tensors */
    }
    for (size_t s = 0; s < c.nshards; s++) {
        const char *p;
        uint64_t size;
        ckptio_model_shard(c.m, s, &p, NULL);
        if (shard_size(p, &size) != 0) goto out;
        c.file_bytes += size;
        c.raw_direct_bytes += size / 4096 * 4096;
        if (size > c.max_file) c.max_file = size;
    }
    if (posix_memalign((void **)&c.dst, 4096, c.bytes ? c.bytes : 1) != 0 ||
        posix_memalign((void **)&c.scratch, 4096, (c.max_file + 4095) / 4096 * 4096 + 4096) != 0)
        goto oom;
    uint64_t tensor_bytes = 0;
    for (size_t i = 0; i < c.count; i++) {
        ckptio_tensor_info info;
        ckptio_model_tensor(c.m, i, &info, NULL);
        tensor_bytes += info.nbytes;
    }
    for (unsigned r = 0; r < repeat; r++) {
        if (drop_all(&c) != 0 || raw_pass(&c, true, raw_threads, &c.seconds[M_RAW_COLD][r], false) != 0) goto out;
        if (prime_all(&c) != 0 || raw_pass(&c, false, raw_threads, &c.seconds[M_RAW_WARM][r], false) != 0) goto out;
        if (drop_all(&c) != 0 || load(&c, &c.seconds[M_LOAD_COLD][r]) != 0 ||
            raw_pass(&c, false, 1, &(double){0}, true) != 0)
            goto out;
        if (prime_all(&c) != 0 || load(&c, &c.seconds[M_LOAD_WARM][r]) != 0 ||
            raw_pass(&c, false, 1, &(double){0}, true) != 0)
            goto out;
        if (cli_interrupted) {
            cli_error("interrupted");
            goto out;
        }
    }
    const uint64_t moved[M_ROWS] = {c.raw_direct_bytes, c.file_bytes, tensor_bytes, tensor_bytes};
    double gbps[M_ROWS];
    for (int k = 0; k < M_ROWS; k++) {
        const double sec = median(c.seconds[k], repeat);
        gbps[k] = sec > 0 ? (double)moved[k] / sec / 1e9 : 0;
    }
    char a[32];
    if (json) {
        printf("{\"model\": \"%s\", \"device\": \"cpu\", \"shards\": %zu, \"tensors\": %zu, \"tensor_bytes\": %llu, "
               "\"repeat\": %u, \"cache_method\": \"%s\", \"raw_read_direct_used_o_direct\": %s, \"gbps\": {",
               path, c.nshards, c.count, (unsigned long long)tensor_bytes, repeat, c.cache_method,
               c.raw_direct ? "true" : "false");
        for (int k = 0; k < M_ROWS; k++) printf("%s\"%s\": %.3f", k ? ", " : "", row_key[k], gbps[k]);
        printf("}, \"loads_verified\": %u}\n", 2 * repeat);
    } else {
        printf("ckptio bench --model: %s, %zu shard%s, %zu tensors, %s, to host memory, %u run%s\n", path,
               c.nshards, c.nshards == 1 ? "" : "s", c.count, cli_format_bytes(tensor_bytes, a, sizeof a), repeat,
               repeat == 1 ? "" : "s");
        printf("cold = page cache dropped (%s)%s\n\n", c.cache_method,
               c.raw_direct ? "" : "; the file system refused O_DIRECT: the raw cold row is buffered");
        printf("  %-30s %8s  %s\n", "", "GB/s", "vs ceiling");
        for (int k = 0; k < M_ROWS; k++) {
            const int ceiling = k == M_LOAD_COLD ? M_RAW_COLD : k == M_LOAD_WARM ? M_RAW_WARM : -1;
            if (ceiling >= 0 && gbps[ceiling] > 0)
                printf("  %-30s %8.2f  %5.0f%%\n", row_label[k], gbps[k], 100.0 * gbps[k] / gbps[ceiling]);
            else
                printf("  %-30s %8.2f\n", row_label[k], gbps[k]);
        }
        printf("\nevery load compared byte for byte with the files (%u loads)\n", 2 * repeat);
    }
    rc = CLI_EXIT_OK;
    goto out;
oom:
    cli_error("out of memory for a %llu-byte model", (unsigned long long)c.bytes);
out:
    ckptio_model_close(c.m);
    free(c.at);
    free(c.dst);
    free(c.scratch);
    return rc;
}
