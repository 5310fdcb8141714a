/*
 * cli_progress.c - a one-line progress bar on stderr for long transfers.
 *
 * Drawn only on a terminal so that logs and pipes stay clean; redrawn at
 * most every 100 ms so that drawing costs nothing measurable in benchmarks.
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
    progress->label = label;
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

void cli_progress_finish(cli_progress *progress) {
    if (progress->enabled && progress->drawn) cli_progress_clear();
    progress->drawn = false;
}

int cli_progress_engine_cb(uint64_t done, uint64_t total, void *user) {
    cli_progress_update((cli_progress *)user, done, total);
    return cli_interrupted ? 1 : 0;
}
