/*
 * bench_report.c - `ckptio bench` results as a table for people and as a
 * JSON object for bench/bench_cpu.py and other scripts (docs/CLI.md).
 */
#include "bench.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const char *const row_keys[BENCH_ROW_COUNT] = {
    "raw_write_direct", "raw_read_direct_cold", "raw_read_buffered_cold", "raw_read_page_cache",
    "ckptio_save",      "ckptio_load_cold",     "ckptio_load_cold_direct", "ckptio_load_warm",
};

const char *bench_row_key(bench_row row) {
    return (unsigned)row < BENCH_ROW_COUNT ? row_keys[row] : "?";
}

const char *bench_row_label(const bench_run *run, bench_row row) {
    switch (row) {
    case BENCH_RAW_WRITE:
        return run->raw_write_direct ? "raw write, O_DIRECT + fsync" : "raw write, buffered + fsync";
    case BENCH_RAW_READ_DIRECT:
        return run->raw_read_direct ? "raw read, O_DIRECT, cold" : "raw read, buffered, cold (O_DIRECT refused)";
    case BENCH_RAW_READ_BUFFERED: return "raw read, buffered, cold";
    case BENCH_RAW_READ_CACHED:
        return run->raw_threads > 1 ? "raw read, page cache (best of 1, N threads)" : "raw read, page cache";
    case BENCH_SAVE: return "ckptio save, durable";
    case BENCH_LOAD_COLD: return "ckptio load, cold";
    case BENCH_LOAD_COLD_DIRECT: return "ckptio load, cold, read cache off";
    case BENCH_LOAD_WARM: return "ckptio load, warm";
    default: return "?";
    }
}

/* The engine's O_DIRECT and read-cache settings by name ("?" when unknown). */
static const char *direct_name(const bench_run *run) {
    static const char *const names[] = {"auto", "off", "on"}; /* CKPTIO_DIRECT_AUTO, _OFF, _ON */
    return run->direct >= 0 && run->direct <= 2 ? names[run->direct] : "?";
}

static const char *read_cache_name(const bench_run *run) {
    static const char *const names[] = {"auto", "on", "off"}; /* CKPTIO_READ_CACHE_AUTO, _ON, _OFF */
    return run->read_cache >= 0 && run->read_cache <= 2 ? names[run->read_cache] : "?";
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median_seconds(const bench_run *run, bench_row row) {
    unsigned n = run->done;
    if (n == 0) return 0.0;
    double v[BENCH_MAX_REPEAT];
    memcpy(v, run->seconds[row], n * sizeof v[0]);
    qsort(v, n, sizeof v[0], cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

double bench_gbps(const bench_run *run, bench_row row) {
    double s = bench_median_seconds(run, row);
    return s > 0 ? (double)run->size / s / 1e9 : 0.0;
}

bool bench_row_measured(const bench_run *run, bench_row row) {
    return row != BENCH_LOAD_COLD_DIRECT || run->cold_direct;
}

bench_row bench_ceiling_of(const bench_run *run, bench_row row) {
    switch (row) {
    case BENCH_SAVE: return BENCH_RAW_WRITE;
    case BENCH_LOAD_COLD:
        /* "the best raw-read ceiling measured in the same run" */
        return bench_gbps(run, BENCH_RAW_READ_BUFFERED) > bench_gbps(run, BENCH_RAW_READ_DIRECT)
                   ? BENCH_RAW_READ_BUFFERED
                   : BENCH_RAW_READ_DIRECT;
    case BENCH_LOAD_COLD_DIRECT: return BENCH_RAW_READ_DIRECT;
    case BENCH_LOAD_WARM: return BENCH_RAW_READ_CACHED;
    default: return BENCH_ROW_COUNT;
    }
}

static double percent_of(uint64_t part, uint64_t whole) {
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static double ratio_of(const bench_run *run, bench_row row) {
    const bench_row c = bench_ceiling_of(run, row);
    const double base = c == BENCH_ROW_COUNT ? 0.0 : bench_gbps(run, c);
    return base > 0 ? bench_gbps(run, row) / base : 0.0;
}

/* A ratio above 100% says the ceiling was not the disk's limit; which reasons
 * apply depends on the rows and the machine, so the note names them. */
char *bench_ceiling_note(const bench_run *run, char *buf, size_t cap) {
    size_t used = 0;
    bool cold = false, save = false, warm = false;
    buf[0] = '\0';
#define NOTE_ADD(...)                                                                         \
    do {                                                                                      \
        int n_ = snprintf(buf + used, used < cap ? cap - used : 0, __VA_ARGS__);              \
        if (n_ > 0) used = used + (size_t)n_ < cap ? used + (size_t)n_ : cap - 1;             \
    } while (0)
    for (int r = BENCH_SAVE; r < BENCH_ROW_COUNT; r++) {
        if (!bench_row_measured(run, (bench_row)r) || ratio_of(run, (bench_row)r) <= 1.0) continue;
        NOTE_ADD("%s%s %.0f%%", used ? "; " : "ratios above 100% (", bench_row_label(run, (bench_row)r),
                 100.0 * ratio_of(run, (bench_row)r));
        save |= r == BENCH_SAVE;
        warm |= r == BENCH_LOAD_WARM;
        cold |= r == BENCH_LOAD_COLD || r == BENCH_LOAD_COLD_DIRECT;
    }
    if (!used) return buf;
    char block[32];
    cli_format_bytes(run->raw_block, block, sizeof block);
    NOTE_ADD(") do not mean ckptio beat the disk. ");
    if (save || cold)
        NOTE_ADD("A raw ceiling is one access pattern, measured once on another file: %u threads moving %s blocks "
                 "in order; ckptio's engine (%lld threads, its own chunks and queue depth) drove this disk harder "
                 "than that pattern. ", run->raw_threads, block, (long long)run->threads);
    if ((cold || save) && run->virtual_disk[0])
        NOTE_ADD("The directory is on the virtio disk %s, whose host may cache it: a write can be done before it "
                 "reaches the host's disk, and data written moments before can come back faster than a cold disk "
                 "gives it. ", run->virtual_disk);
    if (warm)
        NOTE_ADD("The page-cache ceiling is the faster of one and %u copying threads; ckptio's workers copy in "
                 "parallel chunks of their own. ", run->raw_threads);
    if (run->done == 1) NOTE_ADD("One run: --repeat 5 reports medians. ");
    NOTE_ADD("Read such a ratio as \"at the ceiling\".");
#undef NOTE_ADD
    return buf;
}

/* "PREFIX text" wrapped at `width` columns. */
static void print_wrapped(FILE *out, const char *prefix, const char *text, size_t width) {
    size_t col = strlen(prefix);
    fputs(prefix, out);
    while (*text) {
        const size_t word = strcspn(text, " ");
        if (col > 0 && col + 1 + word > width) {
            fputc('\n', out);
            col = 0;
        } else if (col > 0) {
            fputc(' ', out);
            col++;
        }
        fwrite(text, 1, word, out);
        col += word;
        text += word;
        while (*text == ' ') text++;
    }
    fputc('\n', out);
}

void bench_print_table(const bench_run *run, FILE *out) {
    char size[32], tsize[32], block[32], chunk[32];
    cli_format_bytes(run->size, size, sizeof size);
    cli_format_bytes(run->tensor_bytes, tsize, sizeof tsize);
    cli_format_bytes(run->raw_block, block, sizeof block);
    cli_format_bytes((uint64_t)(run->chunk_bytes > 0 ? run->chunk_bytes : 0), chunk, sizeof chunk);

    fprintf(out, "ckptio bench: %s in %u BF16 tensors of %s, %s%u run%s, in %s\n", size, run->tensors, tsize,
            run->done > 1 ? "median of " : "", run->done, run->done == 1 ? "" : "s", cli_q(run->dir));
    fprintf(out, "engine: %s backend, %lld threads, direct %s, read cache %s, chunk %s; raw: %u threads, %s blocks\n",
            run->backend ? run->backend : "?", (long long)run->threads, direct_name(run), read_cache_name(run), chunk,
            run->raw_threads, block);
    fprintf(out, "cold cache: %s; at most %.1f%% of a file still cached after a drop\n", run->cache_method,
            100.0 * run->resident_after_drop);
    if (run->fs_note != NULL) fprintf(out, "note: %s\n", run->fs_note);
    fputc('\n', out);

    static const char *const headers[] = {"measurement", "GB/s", "seconds", "ratio", "ceiling"};
    cli_table table;
    cli_table_init(&table, 5, headers, "lrrrl");
    for (int r = 0; r < BENCH_ROW_COUNT; r++) {
        if (!bench_row_measured(run, (bench_row)r)) continue;
        char gbps[32], secs[32], ratio[32] = "";
        const char *ceiling = "";
        snprintf(gbps, sizeof gbps, "%.2f", bench_gbps(run, (bench_row)r));
        snprintf(secs, sizeof secs, "%.3f", bench_median_seconds(run, (bench_row)r));
        bench_row c = bench_ceiling_of(run, (bench_row)r);
        if (c != BENCH_ROW_COUNT) {
            double base = bench_gbps(run, c);
            snprintf(ratio, sizeof ratio, "%.1f%%", base > 0 ? 100.0 * bench_gbps(run, (bench_row)r) / base : 0.0);
            ceiling = bench_row_label(run, c);
        }
        const char *cells[] = {bench_row_label(run, (bench_row)r), gbps, secs, ratio, ceiling};
        if (cli_table_add(&table, cells) != 0) break;
    }
    cli_table_print(&table, out, "  ");
    cli_table_cleanup(&table);
    char note[2048];
    if (bench_ceiling_note(run, note, sizeof note)[0]) {
        fputc('\n', out);
        print_wrapped(out, "note:", note, 100);
    }

    const bench_phase_stats *ps = run->phase;
    char cold_direct[64] = "";
    if (run->cold_direct)
        snprintf(cold_direct, sizeof cold_direct, " (read cache off: %.0f%%)",
                 percent_of(ps[BENCH_LOAD_COLD_DIRECT].bytes_direct, ps[BENCH_LOAD_COLD_DIRECT].bytes));
    fprintf(out,
            "\nckptio bytes moved with O_DIRECT: save %.0f%%, load cold %.0f%%%s, load warm %.0f%%; "
            "page cache %.1f%% resident before warm loads\n",
            percent_of(ps[BENCH_SAVE].bytes_direct, ps[BENCH_SAVE].bytes),
            percent_of(ps[BENCH_LOAD_COLD].bytes_direct, ps[BENCH_LOAD_COLD].bytes), cold_direct,
            percent_of(ps[BENCH_LOAD_WARM].bytes_direct, ps[BENCH_LOAD_WARM].bytes),
            100.0 * run->resident_before_warm);
    if (run->cold_direct)
        fprintf(out,
                "the cold load read through the page cache: %s, so its next load is a warm one;\n\"read cache "
                "off\" is the same load with CKPTIO_READ_CACHE=off (docs/ENGINE.md, read policy)\n",
                run->read_cache == CKPTIO_READ_CACHE_ON
                    ? "CKPTIO_READ_CACHE=on reads every cold file\nthrough the page cache"
                    : "the read policy caches a file that fits in a quarter of\nthe memory available");
    fprintf(out, "verified: all %u loads returned exactly the saved bytes\n", run->loads_verified);
}

/* ---- JSON ----------------------------------------------------------------- */

static void set(json_t *obj, const char *key, json_t *value, bool *oom) {
    if (value == NULL || json_object_set_new(obj, key, value) != 0) *oom = true;
}

static json_t *row_json(const bench_run *run, bench_row row, bool *oom) {
    json_t *o = json_object();
    if (o == NULL) return *oom = true, NULL;
    set(o, "label", json_string(bench_row_label(run, row)), oom);
    set(o, "gbps", json_real(bench_gbps(run, row)), oom);
    set(o, "seconds", json_real(bench_median_seconds(run, row)), oom);
    json_t *all = json_array();
    for (unsigned i = 0; all != NULL && i < run->done; i++)
        if (json_array_append_new(all, json_real(run->seconds[row][i])) != 0) *oom = true;
    set(o, "seconds_each", all, oom);
    bench_row c = bench_ceiling_of(run, row);
    if (c != BENCH_ROW_COUNT) {
        double base = bench_gbps(run, c);
        set(o, "ceiling", json_string(bench_row_key(c)), oom);
        set(o, "ratio", json_real(base > 0 ? bench_gbps(run, row) / base : 0.0), oom);
        const bench_phase_stats *p = &run->phase[row];
        json_t *st = json_object();
        if (st != NULL) {
            set(st, "bytes", json_integer((json_int_t)p->bytes), oom);
            set(st, "bytes_direct", json_integer((json_int_t)p->bytes_direct), oom);
            set(st, "bytes_buffered", json_integer((json_int_t)p->bytes_buffered), oom);
            set(st, "bytes_bounced", json_integer((json_int_t)p->bytes_bounced), oom);
            set(st, "io_requests", json_integer((json_int_t)p->io_requests), oom);
            set(st, "seconds_fsync", json_real(p->seconds_fsync), oom);
        }
        set(o, "engine_stats", st, oom);
    }
    return o;
}

int bench_print_json(const bench_run *run, FILE *out) {
    bool oom = false;
    json_t *root = json_object();
    if (root == NULL) oom = true;
    else {
        set(root, "version", json_string(ckptio_version()), &oom);
        set(root, "size_bytes", json_integer((json_int_t)run->size), &oom);
        set(root, "tensors", json_integer(run->tensors), &oom);
        set(root, "tensor_bytes", json_integer((json_int_t)run->tensor_bytes), &oom);
        set(root, "dtype", json_string("BF16"), &oom);
        set(root, "dir", json_string(run->dir), &oom);
        set(root, "repeat", json_integer(run->done), &oom);
        json_t *eng = json_object();
        if (eng != NULL) {
            set(eng, "backend", json_string(run->backend ? run->backend : "?"), &oom);
            set(eng, "threads", json_integer(run->threads), &oom);
            set(eng, "chunk_bytes", json_integer(run->chunk_bytes), &oom);
            set(eng, "direct", json_string(direct_name(run)), &oom);
            set(eng, "read_cache", json_string(read_cache_name(run)), &oom);
        }
        set(root, "engine", eng, &oom);
        json_t *raw = json_object();
        if (raw != NULL) {
            set(raw, "threads", json_integer(run->raw_threads), &oom);
            set(raw, "block_bytes", json_integer((json_int_t)run->raw_block), &oom);
            set(raw, "write_direct", json_boolean(run->raw_write_direct), &oom);
            set(raw, "read_direct", json_boolean(run->raw_read_direct), &oom);
        }
        set(root, "raw", raw, &oom);
        json_t *cache = json_object();
        if (cache != NULL) {
            set(cache, "method", json_string(run->cache_method ? run->cache_method : ""), &oom);
            set(cache, "resident_after_drop", json_real(run->resident_after_drop), &oom);
            set(cache, "resident_before_warm", json_real(run->resident_before_warm), &oom);
        }
        set(root, "cache", cache, &oom);
        set(root, "note", run->fs_note ? json_string(run->fs_note) : json_null(), &oom);
        char cnote[2048];
        set(root, "ceiling_note", bench_ceiling_note(run, cnote, sizeof cnote)[0] ? json_string(cnote) : json_null(),
            &oom);
        json_t *results = json_object();
        for (int r = 0; results != NULL && r < BENCH_ROW_COUNT; r++)
            if (bench_row_measured(run, (bench_row)r))
                set(results, bench_row_key((bench_row)r), row_json(run, (bench_row)r, &oom), &oom);
        set(root, "results", results, &oom);
        set(root, "loads_verified", json_integer(run->loads_verified), &oom);
    }
    char *text = (!oom) ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6)) : NULL;
    json_decref(root);
    if (text == NULL) {
        cli_error("out of memory building the JSON output");
        return -1;
    }
    fputs(text, out);
    fputc('\n', out);
    free(text);
    return 0;
}
