/*
 * cmd_convert.c - `ckptio convert IN OUT`: any checkpoint ckptio reads
 * (safetensors file, Hugging Face directory, torch.save file, DCP
 * directory) into any of those.
 *
 * The library does the work (ckptio_convert): tensor by tensor through the
 * engine in bounded memory, IN never memory-mapped, OUT atomic; everything
 * it can check before writing (IN parses, OUT's kind, dtypes, OUT's path)
 * fails before anything is written, and what OUT cannot hold comes back as
 * notes, printed here as warnings before the work starts.
 */
#include "cli.h"

#include <string.h>

static const cli_usage usage = {
    "convert",
    "usage: ckptio convert [--to FORMAT] [--shard-size SIZE] [--alignment N] [--quiet] IN OUT\n",
    "\nConverts IN, any of\n"
    "  - a safetensors file,\n"
    "  - a Hugging Face directory (model.safetensors, or shards and\n"
    "    model.safetensors.index.json, or *.safetensors files: what\n"
    "    ckptio.load opens; or the index file itself),\n"
    "  - a torch.save file,\n"
    "  - a torch.distributed.checkpoint (DCP) directory (chunks assembled),\n"
    "into OUT, any of the same. IN's format is detected from its bytes. OUT's\n"
    "follows --to, else OUT's name:\n"
    "  *.safetensors                      a safetensors file\n"
    "  *.pt *.pth *.bin *.ckpt            a torch.save file (a flat dict of tensors)\n"
    "  DIR/ or an existing directory      a Hugging Face directory for a DCP IN;\n"
    "                                     otherwise say --to hf or --to dcp\n"
    "  any other name                     the other kind: torch.save for safetensors\n"
    "                                     and Hugging Face IN, safetensors for\n"
    "                                     torch.save IN, a Hugging Face directory\n"
    "                                     for DCP IN\n"
    "--shard-size means --to hf. Every pair converts, each format into itself too\n"
    "(a re-layout, or resharding); tensors arrive bit for bit.\n"
    "\nOUT is written atomically: a file through a temporary renamed over it (on\n"
    "failure no new OUT exists and an older one is left untouched); a directory\n"
    "is built beside OUT and renamed to it when complete. A directory OUT must not\n"
    "exist or be empty: ckptio never writes into a directory holding other files.\n"
    "\nWhat OUT cannot hold is named in a warning before anything is written:\n"
    "non-tensor values of a torch.save file (numbers, strings, _metadata), byte\n"
    "items of a DCP directory (except into DCP, which carries them), the\n"
    "__metadata__ of safetensors (into torch.save or DCP). Tensors that shared a\n"
    "storage (views, tied weights) are written as copies, with a warning.\n"
    "A Hugging Face OUT is split as huggingface_hub splits (tensors in order, a\n"
    "new shard when the next would pass SIZE, a larger tensor alone); one shard is\n"
    "model.safetensors without an index. A DCP OUT is what ckptio.dcp writes for\n"
    "one process: each tensor whole, one data file, a checksum manifest.\n"
    "\noptions:\n"
    "  --to FORMAT        safetensors, hf, torch or dcp\n"
    "  --shard-size SIZE  largest shard of a Hugging Face OUT (e.g. 5GB = 5*10^9,\n"
    "                     2GiB; default 5GB)\n"
    "  --alignment N      storage alignment of a torch.save OUT, 1..65536 (default 4096)\n"
    "  -q, --quiet        no warnings and no summary line\n"
    "  -h, --help         show this help\n"
    "\nexit status: 0 converted, 1 invalid input or failed write, 2 bad command line,\n"
    "130/143 interrupted by SIGINT/SIGTERM (no OUT written, an older OUT kept)\n",
};

static const char *const to_names[] = {"", "safetensors", "hf", "torch", "dcp"};

static const char *format_words(ckptio_format f) {
    switch (f) {
    case CKPTIO_FORMAT_SAFETENSORS: return "safetensors";
    case CKPTIO_FORMAT_TORCH: return "torch.save";
    case CKPTIO_FORMAT_DCP: return "DCP";
    case CKPTIO_FORMAT_HF_INDEX: return "Hugging Face";
    default: return "?";
    }
}

static const char *to_words(ckptio_convert_to to) {
    switch (to) {
    case CKPTIO_CONVERT_SAFETENSORS: return "safetensors";
    case CKPTIO_CONVERT_HF: return "Hugging Face";
    case CKPTIO_CONVERT_TORCH: return "torch.save";
    case CKPTIO_CONVERT_DCP: return "DCP";
    default: return "?";
    }
}

static void print_note(const char *note, void *user) {
    (void)user;
    cli_warning("%s", note);
}

int cli_cmd_convert(int argc, char **argv) {
    enum { OPT_ALIGNMENT = 256, OPT_SHARD_SIZE, OPT_TO };
    static const struct option longopts[] = {
        {"alignment", required_argument, NULL, OPT_ALIGNMENT},
        {"shard-size", required_argument, NULL, OPT_SHARD_SIZE},
        {"to", required_argument, NULL, OPT_TO},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool quiet = false;
    uint64_t alignment = 4096, shard_size = 0;
    ckptio_convert_to to = CKPTIO_CONVERT_AUTO;
    for (int c; (c = cli_next_option(argc, argv, "hq", longopts, &usage)) != CLI_OPT_END;) {
        switch (c) {
        case 'h': cli_usage_print(&usage); return CLI_EXIT_OK;
        case 'q': quiet = true; break;
        case OPT_ALIGNMENT:
            if (cli_parse_uint(optarg, 1, 65536, &alignment) != 0)
                return cli_usage_error(&usage, "--alignment must be a number in 1..65536, not '%s'", optarg);
            break;
        case OPT_SHARD_SIZE:
            if (cli_parse_size(optarg, &shard_size) != 0 || shard_size == 0)
                return cli_usage_error(&usage, "--shard-size must be a positive size such as 5GB, not '%s'", optarg);
            break;
        case OPT_TO:
            to = CKPTIO_CONVERT_AUTO;
            for (int k = CKPTIO_CONVERT_SAFETENSORS; k <= CKPTIO_CONVERT_DCP; k++)
                if (strcmp(optarg, to_names[k]) == 0) to = (ckptio_convert_to)k;
            if (to == CKPTIO_CONVERT_AUTO)
                return cli_usage_error(&usage, "--to must be safetensors, hf, torch or dcp, not '%s'", optarg);
            break;
        default: return CLI_EXIT_USAGE;
        }
    }
    if (argc - optind != 2) return cli_usage_error(&usage, "expected IN and OUT");
    const char *in = argv[optind], *out = argv[optind + 1];
    if (shard_size && to != CKPTIO_CONVERT_AUTO && to != CKPTIO_CONVERT_HF)
        return cli_usage_error(&usage, "--shard-size applies to a Hugging Face OUT (--to hf) only");

    /* An unreadable IN gets the words every command gives it. */
    ckptio_format format;
    if (cli_detect(NULL, in, &format) != 0) return CLI_EXIT_FAIL;
    ckptio_engine *engine = cli_engine_create();
    if (!engine) return CLI_EXIT_FAIL;
    const ckptio_convert_options opts = {.to = to, .shard_size = shard_size, .storage_alignment = (uint32_t)alignment,
                                         .note = quiet ? NULL : print_note};
    ckptio_convert_report r;
    const ckptio_status st = ckptio_convert(engine, in, out, &opts, &r);
    ckptio_engine_destroy(engine);
    if (st != CKPTIO_OK) return cli_error_lib(NULL, st);
    if (!quiet) {
        char size[32], files[64] = "";
        if (r.to == CKPTIO_CONVERT_HF)
            snprintf(files, sizeof files, " in %zu shard%s%s", r.files, r.files == 1 ? "" : "s",
                     r.files > 1 ? " + model.safetensors.index.json" : " (model.safetensors)");
        else if (r.to == CKPTIO_CONVERT_DCP && r.byte_items)
            snprintf(files, sizeof files, " and %zu byte item%s", r.byte_items, r.byte_items == 1 ? "" : "s");
        printf("%s -> %s: %zu tensor%s%s, %s (%s -> %s)\n", cli_q(in), cli_q(out), r.tensors, r.tensors == 1 ? "" : "s",
               files, cli_format_bytes(r.bytes, size, sizeof size), format_words(r.from), to_words(r.to));
    }
    return CLI_EXIT_OK;
}
