/*
 * cmd_convert.c - `ckptio convert IN OUT`: torch.save <-> safetensors.
 *
 * The direction follows IN's format (ckptio_format_detect). The library
 * converts tensor by tensor through the engine in bounded memory (the
 * largest tensor); IN is never memory-mapped, so an IN that is truncated
 * while it is read is an error naming it, not a SIGBUS, and OUT is never
 * left half-written.
 *
 * torch.save -> safetensors: safetensors cannot share bytes between
 * tensors, so every tensor (including views of a shared storage and tied
 * weights) is written as its own copy, with a warning that says how many
 * tensors shared a storage. Non-tensor values (ints, strings, the
 * _metadata of a module state_dict) cannot be stored and are reported.
 * Tensor names are their dotted paths in the object tree.
 * safetensors -> torch.save: a flat OrderedDict name -> tensor, each tensor
 * its own storage, storages aligned to --alignment (default 4096).
 */
#include "cli.h"
#include "cli_dcp.h"

#include <stdlib.h>
#include <string.h>

static const cli_usage usage = {
    "convert",
    "usage: ckptio convert [--alignment N] [--quiet] IN|MODEL_DIR OUT\n"
    "       ckptio convert [--shard-size SIZE] [--quiet] DCP_DIR OUT.safetensors|OUT_DIR\n",
    "\nConverts a torch.save checkpoint to safetensors or a safetensors file to a\n"
    "torch.save checkpoint (the direction follows IN's format). OUT is written\n"
    "atomically: on failure no OUT exists and an older OUT is left untouched.\n"
    "\ntorch.save -> safetensors: every tensor is written as its own copy, named by\n"
    "its dotted path (e.g. 'layer.0.weight'); tensors that shared a storage (views,\n"
    "tied weights) are copied with a warning, because safetensors cannot share bytes.\n"
    "Non-tensor values (numbers, strings, _metadata) are dropped with a warning.\n"
    "safetensors -> torch.save: a flat OrderedDict of the tensors, which\n"
    "torch.load(..., weights_only=True) loads; metadata is dropped with a warning.\n"
    "A model directory (model.safetensors, a Hugging Face index and its shards, or\n"
    "*.safetensors files: what ckptio.load opens) or an index -> one torch.save file\n"
    "of every tensor of every shard, read one tensor at a time.\n"
    "DCP_DIR (torch.distributed.checkpoint) -> safetensors: every tensor is assembled\n"
    "from its chunks, one at a time (memory: the largest tensor), into OUT.safetensors;\n"
    "with --shard-size, or an OUT without the .safetensors suffix, into the Hugging Face\n"
    "sharded layout in directory OUT (model-00001-of-0000N.safetensors and\n"
    "model.safetensors.index.json; one shard: model.safetensors). Byte items\n"
    "(non-tensor values) are skipped with a warning naming them.\n"
    "\noptions:\n"
    "  --alignment N  storage alignment of a torch.save OUT, 1..65536 (default 4096)\n"
    "  --shard-size SIZE  largest shard of a sharded OUT (e.g. 5GB = 5*10^9, 2GiB; default 5GB)\n"
    "  -q, --quiet    no warnings and no summary line\n"
    "  -h, --help     show this help\n"
    "\nexit status: 0 converted, 1 invalid input or failed write, 2 bad command line,\n"
    "130/143 interrupted by SIGINT/SIGTERM (no OUT written, an older OUT kept)\n",
};

/* Counts the non-tensor leaves of the object tree (what safetensors loses). */
static size_t count_values(const ckptio_value *v, unsigned depth) {
    if (depth > 600) return 0; /* the reader bounds nesting; this is belt and braces */
    size_t n = 0, len = 0;
    switch (ckptio_value_kind_of(v)) {
    case CKPTIO_VALUE_TENSOR: return 0;
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_TUPLE:
    case CKPTIO_VALUE_SET:
        ckptio_value_len(v, &len);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *item;
            if (ckptio_value_item(v, i, &item) == CKPTIO_OK) n += count_values(item, depth + 1);
        }
        return n;
    case CKPTIO_VALUE_DICT: {
        ckptio_value_len(v, &len);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *key, *item;
            if (ckptio_value_dict_item(v, i, &key, &item) == CKPTIO_OK) n += count_values(item, depth + 1);
        }
        const ckptio_value *attrs = NULL;
        if (ckptio_value_dict_attrs(v, &attrs) == CKPTIO_OK && attrs) n += 1;
        return n;
    }
    default: return 1;
    }
}

static int torch_to_safetensors(ckptio_engine *engine, const char *in, const char *out, bool quiet) {
    int rc = CLI_EXIT_FAIL;
    ckptio_torch *t = NULL;
    size_t n = 0, nstorages = 0;
    size_t *users = NULL;
    ckptio_status st = ckptio_torch_open(engine, in, &t);
    if (st != CKPTIO_OK) return cli_error_lib(in, st);
    ckptio_torch_count(t, &n);
    ckptio_torch_storage_count(t, &nstorages);
    if (!(users = calloc(nstorages ? nstorages : 1, sizeof *users))) {
        cli_error("out of memory");
        goto out;
    }
    size_t strided = 0, shared = 0;
    for (size_t i = 0; i < n; i++) {
        ckptio_torch_tensor_info ti;
        if ((st = ckptio_torch_tensor(t, i, &ti)) != CKPTIO_OK) {
            cli_error_lib(in, st);
            goto out;
        }
        const char *stname = ckptio_dtype_name(ti.dtype);
        if (!stname || !stname[0]) {
            cli_error("%s: tensor '%s' has dtype %s, which safetensors cannot store", in, ti.name,
                      ckptio_dtype_torch_name(ti.dtype));
            goto out;
        }
        users[ti.storage]++;
        strided += !ti.is_contiguous;
    }
    for (size_t i = 0; i < n; i++) {
        ckptio_torch_tensor_info ti;
        ckptio_torch_tensor(t, i, &ti);
        if (users[ti.storage] > 1) shared++;
    }
    const ckptio_value *root = NULL;
    ckptio_torch_root(t, &root);
    const size_t dropped = count_values(root, 0);
    if (!quiet && shared)
        cli_warning("%zu tensors share a storage with another tensor; safetensors cannot share bytes, so each is "
                    "written as its own copy", shared);
    if (!quiet && dropped)
        cli_warning("%zu non-tensor value%s (numbers, strings, _metadata, ...) cannot be stored in safetensors and %s "
                    "dropped", dropped, dropped == 1 ? "" : "s", dropped == 1 ? "is" : "are");
    /* Tensor by tensor through the engine, never a mapping of IN: an IN
     * that shrinks meanwhile is an error naming it, and OUT is not left. */
    const ckptio_kv meta[] = {{"format", "pt"}};
    if ((st = ckptio_torch_save_safetensors(t, out, NULL, 0, meta, 1, 0)) != CKPTIO_OK) {
        cli_error_lib(NULL, st);
        goto out;
    }
    if (!quiet)
        printf("%s -> %s: %zu tensors (torch.save -> safetensors, %zu gathered from strided views)\n", cli_q(in),
               cli_q(out), n, strided);
    rc = CLI_EXIT_OK;
out:
    free(users);
    ckptio_torch_close(t);
    return rc;
}

static int safetensors_to_torch(ckptio_engine *engine, const char *in, const char *out, uint32_t alignment, bool quiet) {
    int rc = CLI_EXIT_FAIL;
    ckptio_safetensors *s = NULL;
    size_t n = 0, nmeta = 0;
    ckptio_status st = ckptio_safetensors_open(engine, in, &s);
    if (st != CKPTIO_OK) return cli_error_lib(in, st);
    ckptio_safetensors_count(s, &n);
    ckptio_safetensors_metadata_count(s, &nmeta);
    for (size_t i = 0; i < n; i++) {
        ckptio_tensor_info ti;
        if ((st = ckptio_safetensors_tensor(s, i, &ti)) != CKPTIO_OK) {
            cli_error_lib(in, st);
            goto out;
        }
        if (!ckptio_dtype_torch_name(ti.dtype)) {
            cli_error("%s: tensor '%s' has dtype %s, which torch cannot store", in, ti.name, ckptio_dtype_name(ti.dtype));
            goto out;
        }
    }
    if (!quiet && nmeta)
        cli_warning("%zu __metadata__ entr%s of %s %s not carried into the torch.save file", nmeta,
                    nmeta == 1 ? "y" : "ies", in, nmeta == 1 ? "is" : "are");
    /* Tensor by tensor through the engine (see torch_to_safetensors). */
    ckptio_torch_save_options opts = {.storage_alignment = alignment};
    if ((st = ckptio_safetensors_save_torch(s, out, &opts)) != CKPTIO_OK) {
        cli_error_lib(NULL, st);
        goto out;
    }
    if (!quiet)
        printf("%s -> %s: %zu tensors (safetensors -> torch.save, alignment %u)\n", cli_q(in), cli_q(out), n,
               alignment);
    rc = CLI_EXIT_OK;
out:
    ckptio_safetensors_close(s);
    return rc;
}

int cli_cmd_convert(int argc, char **argv) {
    enum { OPT_ALIGNMENT = 256, OPT_SHARD_SIZE };
    static const struct option longopts[] = {
        {"alignment", required_argument, NULL, OPT_ALIGNMENT},
        {"shard-size", required_argument, NULL, OPT_SHARD_SIZE},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool quiet = false;
    uint64_t alignment = 4096, shard_size = 0;
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
        default: return CLI_EXIT_USAGE;
        }
    }
    if (argc - optind != 2) return cli_usage_error(&usage, "expected IN and OUT");
    const char *in = argv[optind], *out = argv[optind + 1];
    ckptio_format format;
    if (cli_detect(in, &format) != 0) return CLI_EXIT_FAIL;
    if (format == CKPTIO_FORMAT_DCP) {
        ckptio_engine *engine = cli_engine_create();
        if (!engine) return CLI_EXIT_FAIL;
        const int rc = cli_dcp_convert(engine, in, out, shard_size, quiet);
        ckptio_engine_destroy(engine);
        return rc;
    }
    if (shard_size) return cli_usage_error(&usage, "--shard-size applies to a DCP directory IN only");
    if (cli_is_model(format)) {
        ckptio_engine *engine = cli_engine_create();
        if (!engine) return CLI_EXIT_FAIL;
        const int rc = cli_hf_convert(engine, in, out, (uint32_t)alignment, quiet);
        ckptio_engine_destroy(engine);
        return rc;
    }
    if (format != CKPTIO_FORMAT_SAFETENSORS && format != CKPTIO_FORMAT_TORCH && format != CKPTIO_FORMAT_TORCH_LEGACY)
        return cli_refuse_format(in, format);

    ckptio_engine *engine = cli_engine_create();
    if (!engine) return CLI_EXIT_FAIL;
    /* A legacy torch file goes to the torch reader, which says why it refuses it. */
    int rc = format == CKPTIO_FORMAT_SAFETENSORS ? safetensors_to_torch(engine, in, out, (uint32_t)alignment, quiet)
                                                 : torch_to_safetensors(engine, in, out, quiet);
    ckptio_engine_destroy(engine);
    return rc;
}
