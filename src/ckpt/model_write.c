/*
 * model_write.c - writing a Hugging Face directory (sharded safetensors and
 * model.safetensors.index.json).
 *
 * The split is huggingface_hub's split_torch_state_dict_into_shards: tensors
 * in order into the current shard; a tensor that would tip it over the
 * limit closes it first; a tensor over the limit goes alone. Shards are
 * numbered in the order the reference appends them to its list (an
 * oversize tensor's shard at once, the current one when it closes or at the
 * end). Each shard is written atomically by the caller's function (the
 * format's own bounded writer); the index comes last, so a reader never
 * finds an index naming a shard that is not complete.
 */
#include "convert_internal.h"
#include "dcp_commit_internal.h"
#include "hf_index_internal.h"

#include <stdio.h>
#include <string.h>

#define INDEX_NAME "model.safetensors.index.json"

/* shard_of[i] = the shard of tensor i; returns the shard count (at least 1). */
static size_t split(const ckptio_tensor_source *tensors, size_t count, uint64_t limit, size_t *shard_of,
                    size_t *number) {
    size_t nshards = 0, ngroups = 0, cur = SIZE_MAX;
    uint64_t cur_size = 0;
    for (size_t i = 0; i < count; i++) {
        const uint64_t n = tensors[i].nbytes;
        if (n > limit) {
            number[ngroups] = nshards++;
            shard_of[i] = ngroups++;
            continue;
        }
        if (cur != SIZE_MAX && cur_size + n > limit) {
            number[cur] = nshards++;
            cur = SIZE_MAX;
        }
        if (cur == SIZE_MAX) {
            cur = ngroups++;
            cur_size = 0;
        }
        shard_of[i] = cur;
        cur_size += n;
    }
    if (cur != SIZE_MAX) number[cur] = nshards++;
    for (size_t i = 0; i < count; i++) shard_of[i] = number[shard_of[i]];
    return nshards ? nshards : 1; /* no tensors: one empty model.safetensors */
}

ckptio_status ckptio__hf_save(const char *dir, const ckptio_tensor_source *tensors, size_t count, uint64_t shard_size,
                             unsigned sync_flags, ckptio__shard_fn save_shard, void *ctx, size_t *nshards_out) {
    CKPTIO_RETURN_IF(shard_size == 0, CKPTIO_E_INVAL, "the shard size must be positive");
    ckptio_status st = CKPTIO_OK;
    size_t *shard_of = ckptio__calloc(count + 1, sizeof *shard_of), *number = ckptio__calloc(count + 1, sizeof *number);
    size_t *members = ckptio__calloc(count + 1, sizeof *members);
    const char **names = ckptio__calloc(count + 1, sizeof *names), **files = ckptio__calloc(count + 1, sizeof *files);
    char *shard_names = NULL, *index = NULL, path[4096];
    if (!shard_of || !number || !members || !names || !files) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the shards of %zu tensors", count);
        goto out;
    }
    const size_t nshards = split(tensors, count, shard_size, shard_of, number);
    enum { NAME_CAP = 64 };
    if (!(shard_names = ckptio__calloc(nshards, NAME_CAP))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu shard names", nshards);
        goto out;
    }
    uint64_t total = 0;
    for (size_t s = 0; s < nshards; s++) {
        char *name = shard_names + s * NAME_CAP;
        if (nshards == 1) snprintf(name, NAME_CAP, "model.safetensors");
        else snprintf(name, NAME_CAP, "model-%05zu-of-%05zu.safetensors", s + 1, nshards);
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = dir, .file_offset = -1}), "path too long");
            goto out;
        }
        size_t n = 0;
        for (size_t i = 0; i < count; i++) {
            if (shard_of[i] != s) continue;
            members[n++] = i;
            names[i] = tensors[i].name;
            files[i] = name;
            total += tensors[i].nbytes;
        }
        if ((st = save_shard(ctx, path, members, n)) != CKPTIO_OK) goto out;
    }
    if (nshards > 1) {
        if (!(index = ckptio__hf_index_json(names, files, count, total))) {
            st = ckptio_last_error()->status;
            goto out;
        }
        /* The library's one writer of a small file committed atomically beside others. */
        if ((st = ckptio__dcp_write_file(dir, INDEX_NAME, index, strlen(index), NULL, sync_flags)) != CKPTIO_OK)
            goto out;
    }
    if (nshards_out) *nshards_out = nshards;
out:
    ckptio__free(index);
    ckptio__free(shard_names);
    ckptio__free(files);
    ckptio__free(names);
    ckptio__free(members);
    ckptio__free(number);
    ckptio__free(shard_of);
    return st;
}
