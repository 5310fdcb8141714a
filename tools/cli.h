/*
 * cli.h - what the `ckptio` command-line tool's files share: the subcommand
 * entry points, option parsing, error printing, sizes, tables, progress.
 *
 * The tool uses only the public header (zstd's rule for programs/): it is
 * the first user of the public API and must not reach behind it. Names here
 * use the cli_ prefix, which the library never uses.
 */
#ifndef CKPTIO_CLI_H
#define CKPTIO_CLI_H

#include "ckptio.h"
#include "cli_commands.h"

#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>

/* Exit statuses of every subcommand (docs/CLI.md). */
enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_FAIL = 1,  /* the file is invalid, or the work failed */
    CLI_EXIT_USAGE = 2  /* bad command line */
};

/* One prototype per subcommand: int cli_cmd_<name>(int argc, char **argv).
 * argv[0] is the subcommand's name; options follow. */
#define CLI_X_PROTO_(name, operands, summary) int cli_cmd_##name(int argc, char **argv);
CLI_COMMAND_LIST(CLI_X_PROTO_)
#undef CLI_X_PROTO_

/* ---- messages (cli_quote.c, cli_util.c) ---------------------------------- */

/* Prints "ckptio: <message>\n" to stderr, the message quoted (cli_quote):
 * names from files can hold anything, a terminal must see only text. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same as "ckptio: warning: <message>\n". */
void cli_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Both, with the prefix after "ckptio: " given (e.g. "" or "warning: "). */
void cli_vreport(const char *kind, const char *fmt, va_list ap);

/* Writes `len` bytes of `text` into out (cap bytes, always NUL-terminated
 * when cap > 0) with control characters (C0, DEL, C1), line separators,
 * bidirectional controls, invalid UTF-8 and backslashes escaped as \n, \t,
 * \r, \\, \xHH or \uXXXX. Returns the quoted length (without the NUL),
 * which may exceed cap: call with cap 0 to size a buffer. */
size_t cli_quote(const char *text, size_t len, char *out, size_t cap);
/* Quoted copies for human output (printf arguments): valid until eight
 * more calls. cli_q(NULL) is "(null)". */
const char *cli_q(const char *s);
const char *cli_qn(const char *s, size_t len);

/* stderr's current line: cli_line_taken() says a progress bar is on it,
 * cli_line_clear() erases it if so (every message calls it first). */
void cli_line_taken(void);
void cli_line_clear(void);

/* Prints the library's last error as "ckptio: <message>", putting `path`
 * in front when the message does not already name it. Returns
 * CLI_EXIT_FAIL so callers can `return cli_error_lib(...)`. */
int cli_error_lib(const char *path, ckptio_status status);

/* A subcommand's help text: `synopsis` is the "usage: ..." line(s), `details`
 * the rest (options, exit status). */
typedef struct cli_usage {
    const char *command;
    const char *synopsis;
    const char *details;
} cli_usage;

/* Prints the full help to stdout (for --help). */
void cli_usage_print(const cli_usage *usage);

/* Prints "ckptio: <message>", the synopsis and a pointer to --help to stderr
 * and returns CLI_EXIT_USAGE. */
int cli_usage_error(const cli_usage *usage, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- option parsing (cli_util.c) ----------------------------------------- */

/* What cli_next_option() returns besides an option's `val`. */
enum { CLI_OPT_END = -1, CLI_OPT_ERROR = -2 };

/* getopt_long with the tool's conventions: options and operands may be
 * mixed, "--" ends options, unknown options and missing values are reported
 * through cli_usage_error() (then CLI_OPT_ERROR is returned; the command
 * must exit with CLI_EXIT_USAGE). optind is left on the first operand once
 * CLI_OPT_END is returned. Call cli_options_reset() before a new argv. */
int cli_next_option(int argc, char **argv, const char *shortopts, const struct option *longopts,
                    const cli_usage *usage);
void cli_options_reset(void);

/* ---- numbers and sizes (cli_util.c) -------------------------------------- */

/* Parses a byte count: "4096", "512K", "8M", "1G", "1.5GiB", "2T"; K/M/G/T
 * with or without "i"/"iB" are powers of 1024, "KB"/"MB"/"GB"/"TB" are
 * powers of 1000. Returns 0, or -1 for malformed text or overflow. */
int cli_parse_size(const char *text, uint64_t *out);

/* Parses a decimal integer in [min, max]. Returns 0, or -1. */
int cli_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* "512 B", "1.50 KiB", "8.00 MiB", "1.00 GiB", "2.00 TiB" into buf; returns buf. */
char *cli_format_bytes(uint64_t bytes, char *buf, size_t len);

/* "[2, 3, 4]" (or "[]" for a scalar) into buf, "..." at the end when it
 * does not fit; returns buf. */
char *cli_format_shape(const int64_t *shape, uint32_t ndim, char *buf, size_t len);

/* Seconds on the monotonic clock. */
double cli_now(void);

/* ---- interruption (cli_util.c) ------------------------------------------- */

/* The number of the first SIGINT/SIGTERM once cli_catch_interrupts() ran
 * (main does, for every command), else 0. The handler also asks the library
 * to stop (ckptio_interrupt); long operations poll the flag, stop and clean
 * up; main then exits with cli_interrupted_status(). A second signal exits
 * at once with 128 + its number. */
extern volatile sig_atomic_t cli_interrupted;
void cli_catch_interrupts(void);
/* Prints "ckptio: interrupted by SIGINT" (or SIGTERM) and returns the
 * conventional status 128 + the signal's number (130, 143). */
int cli_interrupted_status(void);

/* ---- files (cli_util.c) ---------------------------------------------------- */

/* Opens the regular file `path` for reading (extra open `flags`, e.g.
 * O_DIRECT), blocking, close-on-exec; what is not a regular file (a FIFO
 * swapped in for a shard the library checked) is EINVAL without waiting.
 * For the files the bench reads by name. -1 with errno on failure. */
int cli_open_regular(const char *path, int flags);

/* ---- tables (cli_table.c) ------------------------------------------------ */

/* A text table whose columns size themselves to their widest cell. */
typedef struct cli_table {
    size_t ncols;
    const char *const *headers; /* ncols entries, caller-owned */
    const char *align;          /* ncols chars: 'l' or 'r' */
    char **cells;               /* nrows * ncols owned copies */
    size_t nrows, cap;
} cli_table;

/* headers and align must outlive the table. */
void cli_table_init(cli_table *table, size_t ncols, const char *const *headers, const char *align);
/* Copies `cells` (ncols strings). Returns 0, or -1 when out of memory. */
int cli_table_add(cli_table *table, const char *const *cells);
/* Prints the header, then rows, each line prefixed by `indent`. */
void cli_table_print(const cli_table *table, FILE *out, const char *indent);
void cli_table_cleanup(cli_table *table);

/* ---- progress display (cli_progress.c) ----------------------------------- */

/* A one-line bar on stderr, redrawn at most every 100 ms, drawn only when
 * stderr is a terminal (and CKPTIO_NO_PROGRESS is unset); a finished
 * transfer leaves one line (cli_progress.c has the rule). */
typedef struct cli_progress {
    bool enabled;
    bool drawn;
    char label[256];            /* quoted copy */
    double start;
    double last_draw;
    uint64_t done, total;       /* at the last draw */
} cli_progress;

/* `label` says what moves (for a file: its path). */
void cli_progress_init(cli_progress *progress, const char *label);
void cli_progress_update(cli_progress *progress, uint64_t done, uint64_t total);
/* Ends the bar: with ok, when it was drawn, it becomes the final line
 * "LABEL: SIZE in S s (R GB/s)"; otherwise it is erased (an error follows).
 * A second call does nothing. */
void cli_progress_finish(cli_progress *progress, bool ok);
/* Erases whatever bar is drawn (cli_line_clear()). */
void cli_progress_clear(void);
/* A ckptio_progress_fn: `user` is a cli_progress. Returns non-zero (cancel)
 * once cli_interrupted is set. */
int cli_progress_engine_cb(uint64_t done, uint64_t total, void *user);

/* ---- checkpoint files seen format-independently (cli_view.c) -------------- */

/* What inspect and verify need of any checkpoint format. */
typedef struct cli_view {
    const char *path;
    const char *format;          /* "safetensors" */
    uint64_t file_size;
    uint64_t data_offset;        /* first byte after the header */
    size_t count;
    ckptio_tensor_info *tensors; /* count entries, in file-offset order */
    size_t metadata_count;
    ckptio_kv *metadata;
    ckptio_safetensors *st;      /* the format handle that owns the strings */
    ckptio_torch *torch;         /* or, for "torch.save": tensor i is ckptio_torch_tensor(torch, i) */
} cli_view;

/* ckptio_format_detect_engine(engine, path): an s3:// path's probe with
 * `engine`'s settings (NULL: a temporary engine's), its GET kept on `engine`
 * for the open that follows. The format comes from the first bytes, never
 * from the name (the library's one rule: ckptio_format_detect), so every
 * command opens a file with the reader its bytes call for. On failure prints
 * "ckptio: PATH: ..." and returns -1. */
int cli_detect(ckptio_engine *engine, const char *path, ckptio_format *format);

/* Says why `path`, detected as `format`, is not a checkpoint file the
 * command can open (a directory, an index, unknown bytes). Returns
 * CLI_EXIT_FAIL. */
int cli_refuse_format(const char *path, ckptio_format format);

/* Opens and validates `path`, whose `format` cli_detect found from its
 * first bytes on `engine`. On failure prints "ckptio: ..." and returns -1. */
int cli_view_open(ckptio_engine *engine, const char *path, ckptio_format format, cli_view *view);
void cli_view_close(cli_view *view);

/* Reads every tensor's bytes (through the engine, in windows of at most
 * `window` bytes of host memory) to prove the data is there and readable.
 * Shows progress. On failure prints "ckptio: ..." and returns -1. */
int cli_view_read_all(ckptio_engine *engine, const cli_view *view, uint64_t window);

/* The engine with CKPTIO_* environment settings; prints an error and returns
 * NULL on failure. */
ckptio_engine *cli_engine_create(void);

/* Whether `path` is an object in S3-compatible storage ("s3://BUCKET/KEY"),
 * which the library opens wherever it opens a file (docs/OBJECT_STORAGE.md). */
bool cli_is_object(const char *path);

/* Whether `path` is a directory: stat for a local path, the format probe for
 * an object (a prefix with objects under it). */
bool cli_is_dir(const char *path);

/* The size of the file or object `path` (0 when it cannot be opened). */
uint64_t cli_file_size(ckptio_engine *engine, const char *path);

/* "DIR/NAME" into out[0..cap), without doubling a '/' that ends DIR (an
 * object prefix given as "s3://b/run/"). Returns false when it does not fit. */
bool cli_join(const char *dir, const char *name, char *out, size_t cap);

#endif /* CKPTIO_CLI_H */
