/*
 * cli_progress.c - a one-line progress bar on stderr for long transfers.
 *
 * The rule ckptio's Python bars follow too (python/ckptio/_progress.py,
 * docs/CLI.md): labelled with what moves (the path for verify), never drawn
 * before the total is known (the first update carries it), redrawn in place
 * at most every 100 ms (drawing costs nothing measurable in benchmarks), and
 * a finished transfer stays as one line, "LABEL: SIZE in S s (R GB/s)". The
 * command draws only on a terminal: its bars are not asked for, and logs
 * and pipes get the result lines alone, without carriage returns.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define CLI_PROGRESS_INTERVAL 0.1

void cli_progress_clear(void) { cli_line_clear(); }

void cli_progress_init(cli_progress *progress, const char *label) {
    memset(progress, 0, sizeof *progress);
    const char *off = getenv("CKPTIO_NO_PROGRESS");
    progress->enabled = isatty(STDERR_FILENO) && !(off != NULL && off[0] != '\0' && strcmp(off, "0") != 0);
    snprintf(progress->label, sizeof progress->label, "%s", cli_q(label));
    progress->start = cli_now();
    progress->last_draw = 0.0;
}

static unsigned terminal_columns(void) {
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
    return 80;
}

void cli_progress_update(cli_progress *progress, uint64_t done, uint64_t total) {
    if (!progress->enabled) return;
    double now = cli_now();
    if (progress->drawn && now - progress->last_draw < CLI_PROGRESS_INTERVAL && done < total) return;
    progress->last_draw = now;
    progress->drawn = true;
    progress->done = done;
    progress->total = total;

    double frac = total ? (double)done / (double)total : 1.0;
    if (frac > 1.0) frac = 1.0;
    double elapsed = now - progress->start;
    double gbps = elapsed > 0 ? (double)done / elapsed / 1e9 : 0.0;
    char d[32], t[32];
    cli_format_bytes(done, d, sizeof d);
    cli_format_bytes(total, t, sizeof t);
    char tail[96];
    snprintf(tail, sizeof tail, " %3.0f%%  %s / %s  %.2f GB/s", frac * 100.0, d, t, gbps);

    /* The bar takes what the label and the numbers (at their widest, so
     * that the bar keeps its width while they grow) leave of the line. */
    unsigned cols = terminal_columns();
    int used = (int)strlen(progress->label) + 3 + 46 + 1;
    int bar = (int)cols - used;
    if (bar > 40) bar = 40;
    char fill[41];
    int n = 0;
    if (bar >= 10) {
        int filled = (int)(frac * bar);
        for (; n < bar; n++) fill[n] = n < filled ? '#' : '.';
    }
    fill[n] = '\0';
    if (n > 0)
        fprintf(stderr, "\r\033[K%s [%s]%s", progress->label, fill, tail);
    else
        fprintf(stderr, "\r\033[K%s%s", progress->label, tail);
    fflush(stderr);
    cli_line_taken(); /* an error message printed meanwhile erases the bar first (cli_quote.c) */
}

/* "12.50 s" or, under a second, "340.0 ms". */
static void format_seconds(double s, char *buf, size_t cap) {
    if (s >= 1.0) snprintf(buf, cap, "%.2f s", s);
    else snprintf(buf, cap, "%.1f ms", s * 1e3);
}

void cli_progress_finish(cli_progress *progress, bool ok) {
    if (progress->enabled && progress->drawn) {
        cli_progress_clear();
        if (ok) {
            const double secs = cli_now() - progress->start;
            char size[32], took[32];
            format_seconds(secs, took, sizeof took);
            fprintf(stderr, "%s: %s in %s (%.2f GB/s)\n", progress->label,
                    cli_format_bytes(progress->total, size, sizeof size), took,
                    secs > 0 ? (double)progress->total / secs / 1e9 : 0.0);
            fflush(stderr);
        }
    }
    progress->drawn = false;
}

int cli_progress_engine_cb(uint64_t done, uint64_t total, void *user) {
    cli_progress_update((cli_progress *)user, done, total);
    return cli_interrupted ? 1 : 0;
}
