/*
 * cmd_hf_index.c - `ckptio inspect` and `ckptio verify` on a model: a
 * Hugging Face directory (model.safetensors, or model.safetensors.index.json
 * ({"metadata": {"total_size"}, "weight_map": {tensor: shard file}}) and its
 * shards beside it, or *.safetensors files), or the index file itself.
 *
 * The model is opened with ckptio_model_open, exactly as ckptio.load opens
 * it (src/format/hf_index.c parses an index): every shard validated like a
 * single file, the index agreeing with the shards (each mapped tensor in its
 * shard, each shard tensor mapped to that shard, shard names plain file
 * names in the same directory, no symlink leaving it). verify also reads
 * every shard's data.
 */
#include "cli_dcp.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

bool cli_is_model(ckptio_format format) {
    return format == CKPTIO_FORMAT_HF_INDEX || format == CKPTIO_FORMAT_DIRECTORY;
}

/* The model (ckptio_model_open validates the index against its shards:
 * one parser for the library, the Python package and this tool) and the
 * shard file names the output shows. */
typedef struct hf_index {
    ckptio_model *m;
    size_t nshards;
    const char **shards;        /* base names, shard order */
    const char *index;          /* the index read, or NULL (model.safetensors, a directory of files) */
    uint64_t total_size;
    bool has_total;
} hf_index;

static void hf_close(hf_index *x) {
    ckptio_model_close(x->m);
    free(x->shards);
    memset(x, 0, sizeof *x);
}

static int hf_open(ckptio_engine *engine, const char *model, hf_index *x) {
    memset(x, 0, sizeof *x);
    ckptio_status st = ckptio_model_open(engine, model, 0, &x->m);
    if (st != CKPTIO_OK) return cli_error_lib(model, st), -1;
    const char *path = NULL;
    int64_t total = -1;
    if ((st = ckptio_model_shard_count(x->m, &x->nshards)) != CKPTIO_OK) return cli_error_lib(model, st), -1;
    st = ckptio_model_index(x->m, &path, &total);
    if (st != CKPTIO_OK && st != CKPTIO_E_NOT_FOUND) return cli_error_lib(model, st), -1;
    x->index = st == CKPTIO_OK ? path : NULL;
    x->has_total = x->index && total >= 0;
    x->total_size = x->has_total ? (uint64_t)total : 0;
    x->shards = calloc(x->nshards + 1, sizeof *x->shards);
    if (!x->shards) return cli_error("out of memory"), -1;
    for (size_t s = 0; s < x->nshards; s++) {
        if ((st = ckptio_model_shard(x->m, s, &path, NULL)) != CKPTIO_OK) return cli_error_lib(model, st), -1;
        const char *slash = strrchr(path, '/');
        x->shards[s] = slash ? slash + 1 : path;
    }
    return 0;
}

/* What the output calls the model: sharded with an index, or not. */
static const char *model_kind(const hf_index *x, bool json) {
    if (x->index) return json ? "hf-sharded-safetensors" : "Hugging Face sharded safetensors";
    return json ? "hf-safetensors" : "Hugging Face safetensors directory";
}

/* Tensor i of the model and the base name of its shard. */
static int hf_tensor(const hf_index *x, const char *model, size_t i, ckptio_tensor_info *t, const char **shard) {
    size_t s = 0;
    ckptio_status st = ckptio_model_tensor(x->m, i, t, &s);
    if (st != CKPTIO_OK) return cli_error_lib(model, st), -1;
    *shard = x->shards[s];
    return 0;
}

static const char *dtype_label(ckptio_dtype dtype) {
    const char *name = ckptio_dtype_name(dtype);
    return name && name[0] ? name : "?";
}

int cli_hf_inspect(ckptio_engine *engine, const char *model, bool json) {
    hf_index x;
    int rc = CLI_EXIT_FAIL;
    size_t count = 0;
    uint64_t all = 0;
    if (hf_open(engine, model, &x) != 0 || ckptio_model_count(x.m, &count) != CKPTIO_OK) goto out;
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info t;
        const char *shard;
        if (hf_tensor(&x, model, i, &t, &shard) != 0) goto out;
        all += t.nbytes;
    }
    if (json) {
        json_t *root = json_object(), *shards = json_array(), *tensors = json_array();
        bool oom = !root || !shards || !tensors;
        for (size_t s = 0; !oom && s < x.nshards; s++)
            oom |= json_array_append_new(shards, json_string(x.shards[s])) != 0;
        for (size_t i = 0; !oom && i < count; i++) {
            ckptio_tensor_info t;
            const char *shard;
            if (hf_tensor(&x, model, i, &t, &shard) != 0) break;
            json_t *shape = json_array();
            for (uint32_t d = 0; shape && d < t.ndim; d++)
                json_array_append_new(shape, json_integer((json_int_t)t.shape[d]));
            json_t *o = json_pack("{s:s,s:s,s:o,s:I,s:s,s:I}", "name", t.name, "dtype", dtype_label(t.dtype), "shape",
                                  shape, "nbytes", (json_int_t)t.nbytes, "shard", shard, "offset",
                                  (json_int_t)t.file_offset);
            oom |= !o || json_array_append_new(tensors, o) != 0;
        }
        if (!oom) {
            json_object_set_new(root, "path", json_string(model));
            json_object_set_new(root, "index", x.index ? json_string(x.index) : json_null());
            json_object_set_new(root, "format", json_string(model_kind(&x, true)));
            json_object_set_new(root, "total_size", x.has_total ? json_integer((json_int_t)x.total_size) : json_null());
            json_object_set_new(root, "shards", shards);
            json_object_set_new(root, "tensors", tensors);
            json_object_set_new(root, "totals", json_pack("{s:I,s:I}", "tensors", (json_int_t)count, "nbytes",
                                                          (json_int_t)all));
            shards = tensors = NULL;
        }
        char *text = (!oom && root) ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        json_decref(root);
        json_decref(shards);
        json_decref(tensors);
        if (!text) {
            cli_error("out of memory building the JSON output");
            goto out;
        }
        puts(text);
        free(text);
    } else {
        char a[32];
        printf("path:       %s\n", cli_q(model));
        if (x.index) printf("index:      %s\n", cli_q(x.index));
        printf("format:     %s\n", model_kind(&x, false));
        printf("shards:     %zu\n", x.nshards);
        if (x.has_total) printf("total_size: %llu (from the index)\n", (unsigned long long)x.total_size);
        static const char *const headers[] = {"name", "dtype", "shape", "size", "shard"};
        cli_table table;
        cli_table_init(&table, 5, headers, "lllrl");
        for (size_t i = 0; i < count; i++) {
            ckptio_tensor_info t;
            const char *shard;
            char shape[256], size[32];
            if (hf_tensor(&x, model, i, &t, &shard) != 0) {
                cli_table_cleanup(&table);
                goto out;
            }
            cli_format_shape(t.shape, t.ndim, shape, sizeof shape);
            cli_format_bytes(t.nbytes, size, sizeof size);
            const char *cells[] = {t.name, dtype_label(t.dtype), shape, size, shard};
            if (cli_table_add(&table, cells) != 0) {
                cli_table_cleanup(&table);
                cli_error("out of memory");
                goto out;
            }
        }
        printf("\ntensors: %zu\n", count);
        if (count) cli_table_print(&table, stdout, "  ");
        cli_table_cleanup(&table);
        printf("\ntotal: %zu tensor%s, %s (%llu bytes)\n", count, count == 1 ? "" : "s",
               cli_format_bytes(all, a, sizeof a), (unsigned long long)all);
    }
    rc = CLI_EXIT_OK;
out:
    hf_close(&x);
    return rc;
}

int cli_hf_verify(ckptio_engine *engine, const char *model, bool quiet) {
    hf_index x;
    int rc = CLI_EXIT_FAIL;
    uint64_t all = 0;
    size_t count = 0;
    ckptio_tensor_info *tensors = NULL;
    if (hf_open(engine, model, &x) != 0 || ckptio_model_count(x.m, &count) != CKPTIO_OK) goto out;
    if (!(tensors = calloc(count + 1, sizeof *tensors))) {
        cli_error("out of memory");
        goto out;
    }
    /* Model order is shard by shard: each shard's tensors are one run of it,
     * read through a view of that shard. */
    for (size_t i = 0; i < count;) {
        size_t shard = 0, n = 0;
        const char *path = NULL;
        if (ckptio_model_tensor(x.m, i, &tensors[0], &shard) != CKPTIO_OK ||
            ckptio_model_shard(x.m, shard, &path, NULL) != CKPTIO_OK)
            goto lib_error;
        for (size_t s = shard; i + n < count; n++) {
            if (ckptio_model_tensor(x.m, i + n, &tensors[n], &s) != CKPTIO_OK) goto lib_error;
            if (s != shard) break;
            all += tensors[n].nbytes;
        }
        const cli_view view = {.path = path, .format = "safetensors", .count = n, .tensors = tensors};
        if (cli_view_read_all(engine, &view, 64u << 20) != 0) goto out;
        i += n;
    }
    if (x.has_total && x.total_size != all) {
        cli_error("%s: metadata.total_size is %llu, the shards hold %llu tensor bytes", x.index,
                  (unsigned long long)x.total_size, (unsigned long long)all);
        goto out;
    }
    char a[32];
    if (!quiet)
        printf("%s: ok (%s, %zu shard%s, %zu tensor%s, %s of data read)\n", cli_q(model), model_kind(&x, false),
               x.nshards, x.nshards == 1 ? "" : "s", count, count == 1 ? "" : "s", cli_format_bytes(all, a, sizeof a));
    rc = CLI_EXIT_OK;
    goto out;
lib_error:
    cli_error_lib(model, ckptio_last_error()->status);
out:
    free(tensors);
    hf_close(&x);
    return rc;
}
