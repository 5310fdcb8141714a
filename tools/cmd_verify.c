/*
 * cmd_verify.c - `ckptio verify FILE...`: is each file a valid checkpoint
 * whose data can all be read?
 *
 * Structure is checked by the format's reader (every rule it enforces,
 * errors naming the file, tensor and rule); then every tensor's bytes are
 * read through the engine, which catches truncation and unreadable sectors
 * that a header-only check misses.
 */
#include "cli.h"
#include "cli_dcp.h"
#include "cli_steps.h"

#include <string.h>

/* Host memory used for reading data back, whatever the file's size. */
#define VERIFY_WINDOW (64u << 20)

static const cli_usage usage = {
    "verify",
    "usage: ckptio verify [--quiet] [--latest] FILE|DIR|ROOT...\n",
    "\nChecks each FILE's structure (header, dtypes, shapes, offsets, bounds; for\n"
    "safetensors every rule of the reference reader) and reads all of its tensor\n"
    "data. Prints one 'FILE: ok (...)' line per valid file; the reason a file is\n"
    "invalid goes to standard error as 'ckptio: <message>'. A safetensors file\n"
    "saved with checksums (FILE.ckptio-manifest.json beside it) is also checked\n"
    "block by block against them; a mismatch names tensor and byte range.\n"
    "A torch.distributed.checkpoint DIR is checked item by item against the\n"
    "XXH3-64 checksums of its ckptio manifest (.ckptio-manifest-<token>.json); without\n"
    "one (written by torch) its structure is checked instead (items inside their\n"
    "files, every archive/blob/zstd frame parses, chunks tile every tensor when\n"
    "several ranks saved it; one process's save may hold its own shards of a tensor,\n"
    "which the line counts), and the result line says so. A Hugging Face sharded DIR (model.safetensors.index.json)\n"
    "has every shard checked and read, and the index matched against the shards.\n"
    "A checkpoint manager's ROOT (step_NNNNNNNN directories, ckptio.CheckpointManager)\n"
    "has every step checked byte by byte: damaged steps fail, partial ones (a save\n"
    "in progress or one that crashed) are listed; with --latest only the step a\n"
    "restarted job would resume from is checked, newer steps skipped with the reason.\n"
    "\noptions:\n"
    "  -q, --quiet  print nothing for valid files\n"
    "  -l, --latest for a ROOT: check the newest complete step that verifies\n"
    "  -h, --help   show this help\n"
    "\nexit status: 0 every file valid, 1 some file invalid or unreadable,\n"
    "2 bad command line, 130/143 interrupted by SIGINT/SIGTERM\n",
};

static int verify_one(ckptio_engine *engine, const char *path, bool quiet, bool latest) {
    ckptio_format format;
    bool detected; /* one probe of an s3:// path, on the engine that opens it */
    if (cli_steps_is_root(engine, path, &format, &detected)) return cli_steps_verify(engine, path, latest, quiet);
    if (latest) return cli_error("%s: --latest applies to a checkpoint manager's root (step_NNNNNNNN directories)",
                                 path), CLI_EXIT_FAIL;
    if (!detected && cli_detect(engine, path, &format) != 0) return CLI_EXIT_FAIL;
    if (format == CKPTIO_FORMAT_DCP) return cli_dcp_verify(engine, path, quiet);
    if (cli_is_model(format)) return cli_hf_verify(engine, path, quiet);
    cli_view view;
    if (cli_view_open(engine, path, format, &view) != 0) return CLI_EXIT_FAIL;
    int rc = CLI_EXIT_FAIL;
    if (view.torch != NULL) {
        /* torch.save: every zip record is read and checked against its CRC-32. */
        ckptio_torch_verify_report report;
        ckptio_status st = ckptio_torch_verify(view.torch, &report);
        char size[32];
        if (st != CKPTIO_OK) {
            cli_error_lib(path, st);
        } else {
            rc = CLI_EXIT_OK;
            if (!quiet)
                printf("%s: ok (torch.save, %zu tensor%s, %zu records, %zu CRC-32 matched, %zu without CRC, %s read)\n",
                       cli_q(path), view.count, view.count == 1 ? "" : "s", report.records, report.crc_checked,
                       report.crc_absent, cli_format_bytes(report.bytes, size, sizeof size));
        }
    } else if (cli_view_read_all(engine, &view, VERIFY_WINDOW) == 0) {
        rc = CLI_EXIT_OK;
        uint64_t bytes = 0;
        for (size_t i = 0; i < view.count; i++) bytes += view.tensors[i].nbytes;
        char size[32], sums[128] = "";
        /* A checksum manifest beside the file (CKPTIO_SAFETENSORS_CHECKSUMS)
         * is checked too; its absence is not an error. */
        ckptio_verify_report report;
        const ckptio_status st = view.st ? ckptio_safetensors_verify(view.st, NULL, &report) : CKPTIO_E_NOT_FOUND;
        if (st == CKPTIO_OK)
            snprintf(sums, sizeof sums, ", checksums of %zu tensor%s in %zu blocks matched", report.tensors,
                     report.tensors == 1 ? "" : "s", report.blocks);
        else if (st != CKPTIO_E_NOT_FOUND)
            rc = cli_error_lib(path, st);
        if (!quiet && rc == CLI_EXIT_OK)
            printf("%s: ok (%s, %zu tensor%s, %s of data read%s)\n", cli_q(path), view.format, view.count,
                   view.count == 1 ? "" : "s", cli_format_bytes(bytes, size, sizeof size), sums);
    }
    cli_view_close(&view);
    return rc;
}

int cli_cmd_verify(int argc, char **argv) {
    static const struct option longopts[] = {
        {"quiet", no_argument, NULL, 'q'},
        {"latest", no_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool quiet = false, latest = false;
    for (int c; (c = cli_next_option(argc, argv, "hql", longopts, &usage)) != CLI_OPT_END;) {
        switch (c) {
        case 'h': cli_usage_print(&usage); return CLI_EXIT_OK;
        case 'q': quiet = true; break;
        case 'l': latest = true; break;
        default: return CLI_EXIT_USAGE;
        }
    }
    if (optind >= argc) return cli_usage_error(&usage, "no FILE given");

    ckptio_engine *engine = cli_engine_create();
    if (engine == NULL) return CLI_EXIT_FAIL;
    int rc = CLI_EXIT_OK;
    for (int i = optind; i < argc && !cli_interrupted; i++)
        if (verify_one(engine, argv[i], quiet, latest) != CLI_EXIT_OK) rc = CLI_EXIT_FAIL;
    if (cli_interrupted) rc = CLI_EXIT_FAIL;
    ckptio_engine_destroy(engine);
    return rc;
}
