/*
 * cmd_inspect.c - `ckptio inspect FILE [--json]`: what a checkpoint holds.
 *
 * The text form is for people (sizes in KiB/MiB/GiB); --json is for scripts
 * and its schema is documented in docs/CLI.md: change both together.
 */
#include "cli.h"
#include "cli_dcp.h"
#include "cli_steps.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static const cli_usage usage = {
    "inspect",
    "usage: ckptio inspect [--json] FILE|DIR\n",
    "\nLists the tensors of a checkpoint file (name, dtype, shape, size, file offset),\n"
    "totals (count, bytes per dtype) and the file's metadata. The file's structure\n"
    "is validated first; no tensor data is read (see 'ckptio verify').\n"
    "\noptions:\n"
    "  --json      print one JSON object instead of tables (schema: docs/CLI.md)\n"
    "  -h, --help  show this help\n"
    "\nformats: safetensors, torch.save (zip; tensors named by their dotted path);\n"
    "DIR: a torch.distributed.checkpoint directory (.metadata: tensors with global\n"
    "shapes and chunks, byte items, data files, ckptio manifest) or a Hugging Face\n"
    "sharded checkpoint (model.safetensors.index.json, or the index file itself)\n"
    "exit status: 0 ok, 1 unreadable or invalid file, 2 bad command line,\n"
    "130/143 interrupted by SIGINT/SIGTERM\n",
};

/* Bytes and tensor counts per dtype, in dtype enum order. */
typedef struct dtype_total {
    uint64_t tensors;
    uint64_t nbytes;
} dtype_total;

static void sum_by_dtype(const cli_view *view, dtype_total totals[CKPTIO_DTYPE_COUNT_], uint64_t *all_bytes) {
    memset(totals, 0, sizeof(dtype_total) * CKPTIO_DTYPE_COUNT_);
    *all_bytes = 0;
    for (size_t i = 0; i < view->count; i++) {
        const ckptio_tensor_info *t = &view->tensors[i];
        if ((unsigned)t->dtype < CKPTIO_DTYPE_COUNT_) {
            totals[t->dtype].tensors++;
            totals[t->dtype].nbytes += t->nbytes;
        }
        *all_bytes += t->nbytes;
    }
}

static const char *dtype_label(ckptio_dtype dtype) {
    const char *name = ckptio_dtype_name(dtype);
    if (name != NULL && name[0] != '\0') return name;
    name = ckptio_dtype_torch_name(dtype);
    return name != NULL ? name : "?";
}

/* ---- text ---------------------------------------------------------------- */

static int print_text(const cli_view *view) {
    char a[32], b[32];
    dtype_total totals[CKPTIO_DTYPE_COUNT_];
    uint64_t all_bytes = 0;
    sum_by_dtype(view, totals, &all_bytes);

    printf("file:     %s\n", cli_q(view->path));
    printf("format:   %s\n", view->format);
    printf("size:     %s (%llu bytes)\n", cli_format_bytes(view->file_size, a, sizeof a),
           (unsigned long long)view->file_size);
    if (view->torch != NULL) {
        size_t nstorages = 0;
        uint64_t alignment = 0;
        ckptio_torch_storage_count(view->torch, &nstorages);
        ckptio_torch_alignment(view->torch, &alignment);
        printf("storages: %zu zip records, aligned to %llu bytes (offsets below are file offsets)\n", nstorages,
               (unsigned long long)alignment);
    } else {
        printf("header:   %s, data section at offset %llu\n", cli_format_bytes(view->data_offset, b, sizeof b),
               (unsigned long long)view->data_offset);
    }

    if (view->metadata_count == 0) {
        printf("metadata: none\n");
    } else {
        printf("metadata: %zu entr%s\n", view->metadata_count, view->metadata_count == 1 ? "y" : "ies");
        for (size_t i = 0; i < view->metadata_count; i++)
            printf("  %s = %s\n", cli_q(view->metadata[i].key), cli_q(view->metadata[i].value));
    }

    static const char *const theaders[] = {"name", "dtype", "shape", "size", "offset"};
    cli_table table;
    cli_table_init(&table, 5, theaders, "lllrr");
    for (size_t i = 0; i < view->count; i++) {
        const ckptio_tensor_info *t = &view->tensors[i];
        char shape[256], size[32], offset[32];
        cli_format_shape(t->shape, t->ndim, shape, sizeof shape);
        cli_format_bytes(t->nbytes, size, sizeof size);
        snprintf(offset, sizeof offset, "%llu", (unsigned long long)t->file_offset);
        const char *cells[] = {t->name, dtype_label(t->dtype), shape, size, offset};
        if (cli_table_add(&table, cells) != 0) {
            cli_table_cleanup(&table);
            cli_error("out of memory");
            return CLI_EXIT_FAIL;
        }
    }
    printf("\ntensors: %zu\n", view->count);
    if (view->count > 0) cli_table_print(&table, stdout, "  ");
    cli_table_cleanup(&table);

    static const char *const dheaders[] = {"dtype", "tensors", "size", "bytes"};
    cli_table_init(&table, 4, dheaders, "lrrr");
    for (int d = 0; d < CKPTIO_DTYPE_COUNT_; d++) {
        if (totals[d].tensors == 0) continue;
        char n[32], size[32], bytes[32];
        snprintf(n, sizeof n, "%llu", (unsigned long long)totals[d].tensors);
        cli_format_bytes(totals[d].nbytes, size, sizeof size);
        snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)totals[d].nbytes);
        const char *cells[] = {dtype_label((ckptio_dtype)d), n, size, bytes};
        if (cli_table_add(&table, cells) != 0) {
            cli_table_cleanup(&table);
            cli_error("out of memory");
            return CLI_EXIT_FAIL;
        }
    }
    printf("\ntotal: %zu tensor%s, %s (%llu bytes)\n", view->count, view->count == 1 ? "" : "s",
           cli_format_bytes(all_bytes, a, sizeof a), (unsigned long long)all_bytes);
    if (table.nrows > 0) cli_table_print(&table, stdout, "  ");
    cli_table_cleanup(&table);
    return CLI_EXIT_OK;
}

/* ---- JSON ---------------------------------------------------------------- */

/* json_object_set_new() etc. return -1 only when out of memory; one flag
 * collects every such failure instead of checking each call. */
static void set(json_t *obj, const char *key, json_t *value, bool *oom) {
    if (value == NULL || json_object_set_new(obj, key, value) != 0) *oom = true;
}

static void append(json_t *arr, json_t *value, bool *oom) {
    if (value == NULL || json_array_append_new(arr, value) != 0) *oom = true;
}

/* torch.save extras: a tensor's view of its storage, and the storages. */
static void add_torch_tensor(const ckptio_torch *t, size_t index, json_t *o, bool *oom) {
    ckptio_torch_tensor_info ti;
    ckptio_torch_storage_info si;
    if (ckptio_torch_tensor(t, index, &ti) != CKPTIO_OK || ckptio_torch_storage(t, ti.storage, &si) != CKPTIO_OK) {
        *oom = true;
        return;
    }
    json_t *stride = json_array();
    for (uint32_t d = 0; stride != NULL && d < ti.ndim; d++)
        append(stride, json_integer((json_int_t)ti.stride[d]), oom);
    set(o, "stride", stride, oom);
    set(o, "storage", json_string(si.key), oom);
    set(o, "storage_offset", json_integer((json_int_t)ti.storage_offset), oom);
    set(o, "contiguous", json_boolean(ti.is_contiguous), oom);
    set(o, "requires_grad", json_boolean(ti.requires_grad), oom);
    set(o, "parameter", json_boolean(ti.is_parameter), oom);
}

static void add_torch_storages(const ckptio_torch *t, json_t *root, bool *oom) {
    size_t n = 0;
    uint64_t alignment = 0;
    ckptio_torch_storage_count(t, &n);
    ckptio_torch_alignment(t, &alignment);
    set(root, "storage_alignment", json_integer((json_int_t)alignment), oom);
    json_t *arr = json_array();
    for (size_t i = 0; arr != NULL && i < n; i++) {
        ckptio_torch_storage_info si;
        json_t *o = json_object();
        if (o == NULL || ckptio_torch_storage(t, i, &si) != CKPTIO_OK) {
            json_decref(o);
            *oom = true;
            break;
        }
        set(o, "key", json_string(si.key), oom);
        set(o, "dtype", json_string(dtype_label(si.dtype)), oom);
        set(o, "location", json_string(si.location), oom);
        set(o, "nbytes", json_integer((json_int_t)si.nbytes), oom);
        set(o, "offset", json_integer((json_int_t)si.file_offset), oom);
        set(o, "crc32", json_integer((json_int_t)si.crc32), oom);
        append(arr, o, oom);
    }
    set(root, "storages", arr, oom);
}

static json_t *build_json(const cli_view *view, bool *oom) {
    dtype_total totals[CKPTIO_DTYPE_COUNT_];
    uint64_t all_bytes = 0;
    sum_by_dtype(view, totals, &all_bytes);

    json_t *root = json_object();
    if (root == NULL) return *oom = true, NULL;
    set(root, "file", json_string(view->path), oom);
    set(root, "format", json_string(view->format), oom);
    set(root, "file_size", json_integer((json_int_t)view->file_size), oom);
    set(root, "data_offset", json_integer((json_int_t)view->data_offset), oom);

    json_t *meta = json_object();
    for (size_t i = 0; meta != NULL && i < view->metadata_count; i++)
        set(meta, view->metadata[i].key, json_string(view->metadata[i].value), oom);
    set(root, "metadata", meta, oom);

    json_t *tensors = json_array();
    for (size_t i = 0; tensors != NULL && i < view->count; i++) {
        const ckptio_tensor_info *t = &view->tensors[i];
        json_t *o = json_object();
        if (o == NULL) {
            *oom = true;
            break;
        }
        set(o, "name", json_string(t->name), oom);
        set(o, "dtype", json_string(dtype_label(t->dtype)), oom);
        const char *torch = ckptio_dtype_torch_name(t->dtype);
        set(o, "torch_dtype", torch ? json_string(torch) : json_null(), oom);
        json_t *shape = json_array();
        for (uint32_t d = 0; shape != NULL && d < t->ndim; d++)
            append(shape, json_integer((json_int_t)t->shape[d]), oom);
        set(o, "shape", shape, oom);
        set(o, "nbytes", json_integer((json_int_t)t->nbytes), oom);
        set(o, "offset", json_integer((json_int_t)t->file_offset), oom);
        if (view->torch == NULL) {
            /* safetensors' own [begin, end), relative to the data section. */
            json_t *rel = json_array();
            if (rel != NULL) {
                append(rel, json_integer((json_int_t)(t->file_offset - view->data_offset)), oom);
                append(rel, json_integer((json_int_t)(t->file_offset - view->data_offset + t->nbytes)), oom);
            }
            set(o, "data_offsets", rel, oom);
        } else {
            add_torch_tensor(view->torch, i, o, oom);
        }
        append(tensors, o, oom);
    }
    set(root, "tensors", tensors, oom);

    json_t *tot = json_object();
    json_t *by = json_object();
    if (tot != NULL) {
        set(tot, "tensors", json_integer((json_int_t)view->count), oom);
        set(tot, "nbytes", json_integer((json_int_t)all_bytes), oom);
    }
    for (int d = 0; by != NULL && d < CKPTIO_DTYPE_COUNT_; d++) {
        if (totals[d].tensors == 0) continue;
        json_t *o = json_object();
        if (o != NULL) {
            set(o, "tensors", json_integer((json_int_t)totals[d].tensors), oom);
            set(o, "nbytes", json_integer((json_int_t)totals[d].nbytes), oom);
        }
        set(by, dtype_label((ckptio_dtype)d), o, oom);
    }
    if (tot != NULL) set(tot, "by_dtype", by, oom);
    else json_decref(by);
    set(root, "totals", tot, oom);
    if (view->torch != NULL) add_torch_storages(view->torch, root, oom);
    return root;
}

static int print_json(const cli_view *view) {
    bool oom = false;
    json_t *root = build_json(view, &oom);
    /* Keys keep insertion order so that the output reads like the docs. */
    char *text = (root != NULL && !oom) ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (text == NULL) {
        cli_error("out of memory building the JSON output");
        return CLI_EXIT_FAIL;
    }
    puts(text);
    free(text);
    return CLI_EXIT_OK;
}

/* ---- command ------------------------------------------------------------- */

int cli_cmd_inspect(int argc, char **argv) {
    enum { OPT_JSON = 256 };
    static const struct option longopts[] = {
        {"json", no_argument, NULL, OPT_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool json = false;
    for (int c; (c = cli_next_option(argc, argv, "h", longopts, &usage)) != CLI_OPT_END;) {
        switch (c) {
        case 'h': cli_usage_print(&usage); return CLI_EXIT_OK;
        case OPT_JSON: json = true; break;
        default: return CLI_EXIT_USAGE;
        }
    }
    if (optind >= argc) return cli_usage_error(&usage, "no FILE given");
    if (optind + 1 < argc) return cli_usage_error(&usage, "one FILE at a time (got '%s' too)", argv[optind + 1]);
    const char *path = argv[optind];

    ckptio_engine *engine = cli_engine_create();
    if (engine == NULL) return CLI_EXIT_FAIL;
    cli_view view;
    int rc = CLI_EXIT_FAIL;
    ckptio_format format;
    bool detected; /* one probe of an s3:// path, on the engine that opens it */
    if (cli_steps_is_root(engine, path, &format, &detected)) {
        rc = cli_steps_inspect(engine, path, json);
    } else if (!detected && cli_detect(engine, path, &format) != 0) {
        rc = CLI_EXIT_FAIL;
    } else if (format == CKPTIO_FORMAT_DCP) {
        rc = cli_dcp_inspect(engine, path, json);
    } else if (cli_is_model(format)) {
        rc = cli_hf_inspect(engine, path, json);
    } else if (cli_view_open(engine, path, format, &view) == 0) {
        rc = json ? print_json(&view) : print_text(&view);
        cli_view_close(&view);
    }
    ckptio_engine_destroy(engine);
    return rc;
}
