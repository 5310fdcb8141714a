/*
 * cmd_dcp_convert.c - `ckptio convert DIR OUT` for torch.distributed
 * .checkpoint directories: consolidation into one safetensors file, or the
 * Hugging Face sharded layout.
 *
 * Tensors are assembled one at a time by the library
 * (ckptio_dcp_save_safetensors), so memory is bounded by the largest
 * tensor whatever the checkpoint's size; every file is written atomically.
 * Byte items (non-tensor values) cannot be stored and are named in a
 * warning. Sharding follows huggingface_hub's split_torch_state_dict_into_shards:
 * tensors in order, a new shard when the next tensor would exceed the
 * limit, a tensor larger than the limit alone in its shard; one shard is
 * written as model.safetensors without an index, several as
 * model-0000k-of-0000n.safetensors plus model.safetensors.index.json
 * ({"metadata": {"total_size"}, "weight_map"}, keys sorted, indent 2, as
 * transformers' save_pretrained writes it).
 */
#include "cli_dcp.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define HF_DEFAULT_SHARD ((uint64_t)5000000000u) /* "5GB", huggingface's default */

static bool has_suffix(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void warn_byte_items(ckptio_dcp *h, bool quiet) {
    size_t nb = 0;
    ckptio_dcp_bytes_count(h, &nb);
    if (quiet || nb == 0) return;
    cli_progress_clear();
    fprintf(stderr, "ckptio: warning: %zu byte item%s (non-tensor values) cannot be stored in safetensors and %s "
                    "skipped:", nb, nb == 1 ? "" : "s", nb == 1 ? "is" : "are");
    for (size_t j = 0; j < nb; j++) {
        ckptio_dcp_bytes_info bi;
        ckptio_dcp_bytes(h, j, &bi);
        fprintf(stderr, "%s '%s'", j ? "," : "", cli_q(bi.fqn));
    }
    fputc('\n', stderr);
}

/* Writes `text` to `path` atomically through the library. */
static ckptio_status write_atomic(ckptio_engine *engine, const char *path, const char *text) {
    ckptio_file *f = NULL;
    ckptio_status st = ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE, &f);
    if (st == CKPTIO_OK) {
        const ckptio_extent x = {.file = f, .file_offset = 0, .length = strlen(text), .memory = (void *)text,
                                 .mem_kind = CKPTIO_MEM_HOST};
        st = ckptio_engine_execute_extents(engine, CKPTIO_WRITE, &x, 1);
    }
    if (st == CKPTIO_OK) st = ckptio_file_commit(f);
    const ckptio_status cs = ckptio_file_close(f);
    return st != CKPTIO_OK ? st : cs;
}

static int to_shards(ckptio_engine *engine, ckptio_dcp *h, const char *dir, const char *out, uint64_t limit,
                     bool quiet) {
    size_t nt = 0;
    ckptio_dcp_tensor_count(h, &nt);
    int rc = CLI_EXIT_FAIL;
    size_t *shard_of = calloc(nt + 1, sizeof *shard_of), *members = calloc(nt + 1, sizeof *members);
    json_t *index = NULL, *wmap = NULL;
    char *text = NULL;
    if (!shard_of || !members) {
        cli_error("out of memory");
        goto out;
    }
    if (!cli_is_object(out) && mkdir(out, 0777) != 0 && errno != EEXIST) { /* a prefix needs no creating */
        cli_error("%s: cannot create the output directory: %s", out, strerror(errno));
        goto out;
    }
    /* huggingface_hub's split: tensors in order into the current shard; a
     * tensor that would tip it over the limit closes it first; a tensor over
     * the limit goes alone. Shards are numbered in the order the reference
     * appends them to its list: an oversize tensor's shard at once, the
     * current one when it closes (or at the end). */
    size_t nshards = 0, ngroups = 0, cur = (size_t)-1;
    uint64_t cur_size = 0, total = 0;
    size_t *number = calloc(nt + 1, sizeof *number);
    if (!number) {
        cli_error("out of memory");
        goto out;
    }
    for (size_t i = 0; i < nt; i++) {
        ckptio_dcp_tensor_info ti;
        ckptio_dcp_tensor(h, i, &ti);
        total += ti.nbytes;
        if (ti.nbytes > limit) {
            number[ngroups] = nshards++;
            shard_of[i] = ngroups++;
            continue;
        }
        if (cur != (size_t)-1 && cur_size + ti.nbytes > limit) {
            number[cur] = nshards++;
            cur = (size_t)-1;
        }
        if (cur == (size_t)-1) {
            cur = ngroups++;
            cur_size = 0;
        }
        shard_of[i] = cur;
        cur_size += ti.nbytes;
    }
    if (cur != (size_t)-1) number[cur] = nshards++;
    for (size_t i = 0; i < nt; i++) shard_of[i] = number[shard_of[i]];
    free(number);
    if (nshards == 0) nshards = 1; /* no tensors: one empty model.safetensors */
    index = json_object();
    wmap = json_object();
    if (!index || !wmap) {
        cli_error("out of memory");
        goto out;
    }
    const ckptio_kv meta[] = {{"format", "pt"}};
    char path[4096], name[64];
    for (size_t s = 0; s < nshards; s++) {
        size_t count = 0;
        for (size_t i = 0; i < nt; i++)
            if (shard_of[i] == s) members[count++] = i;
        if (nshards == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, nshards);
        cli_join(out, name, path, sizeof path);
        ckptio_status st = ckptio_dcp_save_safetensors(h, path, members, count, meta, 1, 0);
        if (st != CKPTIO_OK) {
            cli_error_lib(path, st);
            goto out;
        }
        for (size_t k = 0; k < count; k++) {
            ckptio_dcp_tensor_info ti;
            ckptio_dcp_tensor(h, members[k], &ti);
            if (json_object_set_new(wmap, ti.fqn, json_string(name)) != 0) {
                cli_error("out of memory");
                goto out;
            }
        }
    }
    if (nshards > 1) {
        json_t *md = json_pack("{s:I}", "total_size", (json_int_t)total);
        if (!md || json_object_set_new(index, "metadata", md) != 0 || json_object_set(index, "weight_map", wmap) != 0 ||
            !(text = json_dumps(index, JSON_INDENT(2) | JSON_SORT_KEYS))) {
            cli_error("out of memory");
            goto out;
        }
        const size_t n = strlen(text);
        char *nl = realloc(text, n + 2);
        if (!nl) {
            cli_error("out of memory");
            goto out;
        }
        text = nl;
        memcpy(text + n, "\n", 2);
        cli_join(out, "model.safetensors.index.json", path, sizeof path);
        ckptio_status st = write_atomic(engine, path, text);
        if (st != CKPTIO_OK) {
            cli_error_lib(path, st);
            goto out;
        }
    }
    warn_byte_items(h, quiet);
    if (!quiet)
        printf("%s -> %s: %zu tensors in %zu shard%s%s (DCP -> Hugging Face safetensors)\n", cli_q(dir), cli_q(out), nt, nshards,
               nshards == 1 ? "" : "s", nshards > 1 ? " + model.safetensors.index.json" : " (model.safetensors)");
    rc = CLI_EXIT_OK;
out:
    free(text);
    json_decref(index);
    json_decref(wmap);
    free(shard_of);
    free(members);
    return rc;
}

int cli_dcp_convert(ckptio_engine *engine, const char *dir, const char *out, uint64_t shard_size, bool quiet) {
    ckptio_dcp *h = NULL;
    ckptio_status st = ckptio_dcp_open(engine, dir, &h);
    if (st != CKPTIO_OK) return cli_error_lib(dir, st);
    int rc = CLI_EXIT_FAIL;
    const bool out_is_dir = cli_is_object(out) ? out[strlen(out) - 1] == '/' : cli_is_dir(out);
    if (shard_size > 0 || out_is_dir || !has_suffix(out, ".safetensors")) {
        rc = to_shards(engine, h, dir, out, shard_size ? shard_size : HF_DEFAULT_SHARD, quiet);
    } else {
        const ckptio_kv meta[] = {{"format", "pt"}};
        size_t nt = 0;
        ckptio_dcp_tensor_count(h, &nt);
        if ((st = ckptio_dcp_save_safetensors(h, out, NULL, 0, meta, 1, 0)) != CKPTIO_OK) {
            cli_error_lib(out, st);
        } else {
            warn_byte_items(h, quiet);
            if (!quiet) printf("%s -> %s: %zu tensors (DCP -> safetensors, chunks assembled)\n", cli_q(dir), cli_q(out), nt);
            rc = CLI_EXIT_OK;
        }
    }
    ckptio_dcp_close(h);
    return rc;
}
