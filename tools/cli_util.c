/*
 * cli_util.c - messages, option parsing, sizes, clocks and interruption for
 * the `ckptio` tool.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t cli_interrupted = 0;

/* ---- messages -------------------------------------------------------------- */

int cli_error_lib(const char *path, ckptio_status status) {
    const char *msg = ckptio_last_error_message();
    if (msg == NULL || msg[0] == '\0') msg = ckptio_strerror(status);
    if (path != NULL && path[0] != '\0' && strstr(msg, path) == NULL)
        cli_error("%s: %s", path, msg);
    else
        cli_error("%s", msg);
    return CLI_EXIT_FAIL;
}

void cli_usage_print(const cli_usage *usage) {
    fputs(usage->synopsis, stdout);
    fputs(usage->details, stdout);
}

int cli_usage_error(const cli_usage *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_vreport("", fmt, ap);
    va_end(ap);
    fputs(usage->synopsis, stderr);
    if (usage->command != NULL)
        fprintf(stderr, "Run 'ckptio %s --help' for details.\n", usage->command);
    else
        fputs("Run 'ckptio --help' for details.\n", stderr);
    return CLI_EXIT_USAGE;
}

/* ---- options --------------------------------------------------------------- */

void cli_options_reset(void) {
    /* glibc: 0 re-initialises getopt completely (permutation state included). */
    optind = 0;
}

/* The long option whose `val` is `val`, for naming it in messages. */
static const char *long_name_of(const struct option *longopts, int val) {
    for (const struct option *o = longopts; o != NULL && o->name != NULL; o++)
        if (o->val == val) return o->name;
    return NULL;
}

int cli_next_option(int argc, char **argv, const char *shortopts, const struct option *longopts,
                    const cli_usage *usage) {
    /* A leading ':' makes getopt report a missing value as ':' instead of
     * '?', and opterr = 0 keeps its own messages (which name argv[0]) quiet. */
    char spec[64];
    snprintf(spec, sizeof spec, ":%s", shortopts);
    opterr = 0;
    int c = getopt_long(argc, argv, spec, longopts, NULL);
    if (c == -1) return CLI_OPT_END;
    if (c == '?') {
        const char *arg = (optind > 0 && optind <= argc) ? argv[optind - 1] : "?";
        if (optopt != 0 && strncmp(arg, "--", 2) != 0)
            cli_usage_error(usage, "unknown option '-%c'", optopt);
        else
            cli_usage_error(usage, "unknown option '%s'", arg);
        return CLI_OPT_ERROR;
    }
    if (c == ':') {
        const char *name = long_name_of(longopts, optopt);
        if (name != NULL)
            cli_usage_error(usage, "option '--%s' needs a value", name);
        else
            cli_usage_error(usage, "option '-%c' needs a value", optopt);
        return CLI_OPT_ERROR;
    }
    return c;
}

/* ---- numbers --------------------------------------------------------------- */

int cli_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out) {
    if (text == NULL || *text < '0' || *text > '9') return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_size(const char *text, uint64_t *out) {
    if (text == NULL || !((*text >= '0' && *text <= '9') || *text == '.')) return -1;
    errno = 0;
    char *end = NULL;
    double v = strtod(text, &end);
    if (errno != 0 || end == text || !isfinite(v) || v < 0) return -1;

    static const struct {
        const char *suffix;
        double mult;
    } units[] = {
        {"", 1.0},          {"B", 1.0},
        {"K", 0x1p10},      {"Ki", 0x1p10},     {"KiB", 0x1p10},    {"KB", 1e3},
        {"M", 0x1p20},      {"Mi", 0x1p20},     {"MiB", 0x1p20},    {"MB", 1e6},
        {"G", 0x1p30},      {"Gi", 0x1p30},     {"GiB", 0x1p30},    {"GB", 1e9},
        {"T", 0x1p40},      {"Ti", 0x1p40},     {"TiB", 0x1p40},    {"TB", 1e12},
    };
    /* A lower-case unit letter is accepted as a courtesy ("8m" = "8M"). */
    char suffix[8];
    if (strlen(end) >= sizeof suffix) return -1;
    strcpy(suffix, end);
    if (strchr("kmgt", suffix[0]) != NULL && suffix[0] != '\0') suffix[0] = (char)(suffix[0] - 'a' + 'A');
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(suffix, units[i].suffix) != 0) continue;
        double bytes = v * units[i].mult;
        if (bytes >= 0x1p64) return -1;
        if (bytes != floor(bytes)) return -1; /* "1.3K" is not a whole number of bytes */
        *out = (uint64_t)bytes;
        return 0;
    }
    return -1;
}

char *cli_format_bytes(uint64_t bytes, char *buf, size_t len) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

char *cli_format_shape(const int64_t *shape, uint32_t ndim, char *buf, size_t len) {
    if (len == 0) return buf;
    size_t pos = 0;
    bool cut = false;
    buf[0] = '\0';
    int n = snprintf(buf, len, "[");
    pos = (size_t)n;
    for (uint32_t i = 0; i < ndim && !cut; i++) {
        n = snprintf(buf + pos, len - pos, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (n < 0 || (size_t)n >= len - pos) cut = true;
        else pos += (size_t)n;
    }
    if (!cut && pos + 1 < len) {
        buf[pos++] = ']';
        buf[pos] = '\0';
    } else if (len >= 5) {
        /* Mark the cut so a truncated shape is never mistaken for a real one. */
        memcpy(buf + len - 5, "...]", 5);
    }
    return buf;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- interruption ---------------------------------------------------------- */

/* The first SIGINT/SIGTERM asks the work in flight to stop (the library
 * cancels its transfers and gives up a system call the signal interrupted:
 * ckptio_interrupt) so that the command ends with its cleanup done; a
 * second one ends the process at once. No SA_RESTART: a blocking call
 * returns EINTR instead of waiting on. */
static void on_interrupt(int sig) {
    if (cli_interrupted) _exit(128 + sig);
    cli_interrupted = sig;
    ckptio_interrupt(1);
}

void cli_catch_interrupts(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int cli_interrupted_status(void) {
    const int sig = cli_interrupted;
    cli_error("interrupted by %s", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal");
    return 128 + sig;
}

/* ---- files --------------------------------------------------------------------- */

int cli_open_regular(const char *path, int flags) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | flags);
    if (fd < 0) return -1;
    struct stat sb;
    int err = 0;
    if (fstat(fd, &sb) != 0) err = errno;
    else if (!S_ISREG(sb.st_mode)) err = EINVAL;
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) err = errno;
    if (err) {
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}
