/*
 * cmd_hf_index.c - `ckptio inspect` and `ckptio verify` on a Hugging Face
 * sharded safetensors checkpoint: model.safetensors.index.json
 * ({"metadata": {"total_size"}, "weight_map": {tensor: shard file}}) and
 * its shards beside it.
 *
 * Every shard is opened and validated like a single file; the index must
 * agree with the shards (each mapped tensor in its shard, each shard tensor
 * mapped to that shard, shard names plain file names in the same
 * directory). verify also reads every shard's data.
 */
#include "cli_dcp.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_INDEX_NAME "model.safetensors.index.json"

bool cli_hf_index_path(const char *path, char *index, size_t cap) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return (size_t)snprintf(index, cap, "%s/%s", path, HF_INDEX_NAME) < cap;
    return (size_t)snprintf(index, cap, "%s", path) < cap;
}

/* The parsed index: shard names (distinct, in first-mention order) and views. */
typedef struct hf_index {
    json_t *root;
    json_t *wmap;
    size_t nshards;
    const char **shards;
    cli_view *views;
    bool *opened;
    char **paths;               /* the views point at these */
    uint64_t total_size;
    bool has_total;
} hf_index;

static void hf_close(hf_index *x) {
    for (size_t s = 0; x->views && s < x->nshards; s++)
        if (x->opened[s]) cli_view_close(&x->views[s]);
    for (size_t s = 0; x->paths && s < x->nshards; s++) free(x->paths[s]);
    free(x->paths);
    free(x->views);
    free(x->opened);
    free(x->shards);
    json_decref(x->root);
    memset(x, 0, sizeof *x);
}

static bool plain_name(const char *s) {
    return s[0] != '\0' && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int hf_open(ckptio_engine *engine, const char *index, hf_index *x) {
    memset(x, 0, sizeof *x);
    json_error_t err;
    x->root = json_load_file(index, JSON_REJECT_DUPLICATES, &err);
    if (!x->root) return cli_error("%s: not valid JSON: %s (line %d)", index, err.text, err.line), -1;
    x->wmap = json_object_get(x->root, "weight_map");
    if (!json_is_object(x->wmap)) return cli_error("%s: \"weight_map\" is missing or not an object", index), -1;
    const json_t *total = json_object_get(json_object_get(x->root, "metadata"), "total_size");
    if (json_is_integer(total)) {
        x->has_total = true;
        x->total_size = (uint64_t)json_integer_value(total);
    }
    const size_t n = json_object_size(x->wmap);
    x->shards = calloc(n + 1, sizeof *x->shards);
    if (!x->shards) return cli_error("out of memory"), -1;
    const char *key;
    json_t *val;
    json_object_foreach(x->wmap, key, val) {
        const char *f = json_string_value(val);
        if (!f || !plain_name(f))
            return cli_error("%s: weight_map['%s'] is not a shard file name in the same directory", index, key), -1;
        size_t s = 0;
        while (s < x->nshards && strcmp(x->shards[s], f) != 0) s++;
        if (s == x->nshards) x->shards[x->nshards++] = f;
    }
    x->views = calloc(x->nshards + 1, sizeof *x->views);
    x->opened = calloc(x->nshards + 1, sizeof *x->opened);
    x->paths = calloc(x->nshards + 1, sizeof *x->paths);
    if (!x->views || !x->opened || !x->paths) return cli_error("out of memory"), -1;
    /* Shards live beside the index. */
    const char *slash = strrchr(index, '/');
    const int dirlen = slash ? (int)(slash - index) : 1;
    const char *dir = slash ? index : ".";
    for (size_t s = 0; s < x->nshards; s++) {
        if (!(x->paths[s] = malloc(4096))) return cli_error("out of memory"), -1;
        snprintf(x->paths[s], 4096, "%.*s/%s", dirlen, dir, x->shards[s]);
        if (cli_view_open(engine, x->paths[s], &x->views[s]) != 0) return -1;
        x->opened[s] = true;
        /* Each shard tensor must be mapped to this shard. */
        for (size_t i = 0; i < x->views[s].count; i++) {
            const char *f = json_string_value(json_object_get(x->wmap, x->views[s].tensors[i].name));
            if (!f || strcmp(f, x->shards[s]) != 0)
                return cli_error("%s: tensor '%s' of shard %s is %s", index, x->views[s].tensors[i].name, x->shards[s],
                                 f ? "mapped to another shard" : "not in weight_map"), -1;
        }
    }
    /* Each mapped tensor must be in its shard. */
    json_object_foreach(x->wmap, key, val) {
        size_t s = 0;
        while (strcmp(x->shards[s], json_string_value(val)) != 0) s++;
        size_t i = 0;
        while (i < x->views[s].count && strcmp(x->views[s].tensors[i].name, key) != 0) i++;
        if (i == x->views[s].count)
            return cli_error("%s: weight_map names tensor '%s' in %s, which does not hold it", index, key,
                             x->shards[s]), -1;
    }
    return 0;
}

static const char *dtype_label(ckptio_dtype dtype) {
    const char *name = ckptio_dtype_name(dtype);
    return name && name[0] ? name : "?";
}

int cli_hf_inspect(ckptio_engine *engine, const char *index, bool json) {
    hf_index x;
    int rc = CLI_EXIT_FAIL;
    if (hf_open(engine, index, &x) != 0) goto out;
    uint64_t all = 0;
    size_t count = 0;
    for (size_t s = 0; s < x.nshards; s++)
        for (size_t i = 0; i < x.views[s].count; i++, count++) all += x.views[s].tensors[i].nbytes;
    if (json) {
        json_t *root = json_object(), *shards = json_array(), *tensors = json_array();
        bool oom = !root || !shards || !tensors;
        for (size_t s = 0; !oom && s < x.nshards; s++) {
            oom |= json_array_append_new(shards, json_string(x.shards[s])) != 0;
            for (size_t i = 0; !oom && i < x.views[s].count; i++) {
                const ckptio_tensor_info *t = &x.views[s].tensors[i];
                json_t *shape = json_array();
                for (uint32_t d = 0; shape && d < t->ndim; d++)
                    json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
                json_t *o = json_pack("{s:s,s:s,s:o,s:I,s:s,s:I}", "name", t->name, "dtype", dtype_label(t->dtype),
                                      "shape", shape, "nbytes", (json_int_t)t->nbytes, "shard", x.shards[s], "offset",
                                      (json_int_t)t->file_offset);
                oom |= !o || json_array_append_new(tensors, o) != 0;
            }
        }
        if (!oom) {
            json_object_set_new(root, "index", json_string(index));
            json_object_set_new(root, "format", json_string("hf-sharded-safetensors"));
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
        printf("index:      %s\n", cli_q(index));
        printf("format:     Hugging Face sharded safetensors\n");
        printf("shards:     %zu\n", x.nshards);
        if (x.has_total) printf("total_size: %llu (from the index)\n", (unsigned long long)x.total_size);
        static const char *const headers[] = {"name", "dtype", "shape", "size", "shard"};
        cli_table table;
        cli_table_init(&table, 5, headers, "lllrl");
        for (size_t s = 0; s < x.nshards; s++)
            for (size_t i = 0; i < x.views[s].count; i++) {
                const ckptio_tensor_info *t = &x.views[s].tensors[i];
                char shape[256], size[32];
                cli_format_shape(t->shape, t->ndim, shape, sizeof shape);
                cli_format_bytes(t->nbytes, size, sizeof size);
                const char *cells[] = {t->name, dtype_label(t->dtype), shape, size, x.shards[s]};
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

int cli_hf_verify(ckptio_engine *engine, const char *index, bool quiet) {
    hf_index x;
    int rc = CLI_EXIT_FAIL;
    if (hf_open(engine, index, &x) != 0) goto out;
    uint64_t all = 0;
    size_t count = 0;
    for (size_t s = 0; s < x.nshards; s++) {
        if (cli_view_read_all(engine, &x.views[s], 64u << 20) != 0) goto out;
        for (size_t i = 0; i < x.views[s].count; i++, count++) all += x.views[s].tensors[i].nbytes;
    }
    if (x.has_total && x.total_size != all) {
        cli_error("%s: metadata.total_size is %llu, the shards hold %llu tensor bytes", index,
                  (unsigned long long)x.total_size, (unsigned long long)all);
        goto out;
    }
    char a[32];
    if (!quiet)
        printf("%s: ok (Hugging Face sharded safetensors, %zu shard%s, %zu tensor%s, %s of data read)\n", cli_q(index),
               x.nshards, x.nshards == 1 ? "" : "s", count, count == 1 ? "" : "s", cli_format_bytes(all, a, sizeof a));
    rc = CLI_EXIT_OK;
out:
    hf_close(&x);
    return rc;
}
