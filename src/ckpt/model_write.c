/*
 * model_write.c - the layout of a Hugging Face directory (sharded
 * safetensors and model.safetensors.index.json): which tensor goes into
 * which shard, the shards' names, and the index written last. Shared by
 * the conversion (one shard after another, each by the format's own bounded
 * writer) and ckptio_model_save (every shard in one engine plan).
 *
 * The split is huggingface_hub's split_torch_state_dict_into_shards: tensors
 * in order into the current shard; a tensor that would tip it over the
 * limit closes it first; a tensor over the limit goes alone. Shards are
 * numbered in the order the reference appends them to its list (an
 * oversize tensor's shard at once, the current one when it closes or at the
 * end). The index comes last, so a reader never finds an index naming a
 * shard that is not complete.
 */
#include "convert_internal.h"
#include "dcp_commit_internal.h"
#include "hf_index_internal.h"

#include <stdio.h>
#include <string.h>

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

void ckptio__hf_layout_free(ckptio__hf_layout *l) {
    ckptio__free(l->shard_of);
    ckptio__free(l->names);
    *l = (ckptio__hf_layout){0};
}

ckptio_status ckptio__hf_layout_make(const ckptio_tensor_source *tensors, size_t count, uint64_t shard_size,
                                     ckptio__hf_layout *out) {
    *out = (ckptio__hf_layout){0};
    CKPTIO_RETURN_IF(shard_size == 0, CKPTIO_E_INVAL, "the shard size must be positive");
    size_t *number = ckptio__calloc(count + 1, sizeof *number);
    out->shard_of = ckptio__calloc(count + 1, sizeof *out->shard_of);
    if (!number || !out->shard_of) {
        ckptio__free(number);
        ckptio__hf_layout_free(out);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the shards of %zu tensors", count);
    }
    out->nshards = split(tensors, count, shard_size, out->shard_of, number);
    ckptio__free(number);
    if (!(out->names = ckptio__calloc(out->nshards, sizeof *out->names))) {
        ckptio__hf_layout_free(out);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for shard names");
    }
    for (size_t s = 0; s < out->nshards; s++) {
        if (out->nshards == 1) snprintf(out->names[s], sizeof out->names[s], "%s", CKPTIO__HF_SINGLE_NAME);
        else snprintf(out->names[s], sizeof out->names[s], "model-%05zu-of-%05zu.safetensors", s + 1, out->nshards);
    }
    for (size_t i = 0; i < count; i++) out->total += tensors[i].nbytes;
    return CKPTIO_OK;
}

ckptio_status ckptio__hf_index_write(const char *dir, const ckptio__hf_layout *l, const ckptio_tensor_source *tensors,
                                     size_t count, const ckptio_kv *metadata, size_t metadata_count,
                                     unsigned sync_flags) {
    if (l->nshards <= 1) return CKPTIO_OK; /* one model.safetensors: no index, as huggingface_hub */
    const char **names = ckptio__calloc(count + 1, sizeof *names), **files = ckptio__calloc(count + 1, sizeof *files);
    char *index = NULL;
    ckptio_status st = CKPTIO_OK;
    if (!names || !files) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the index of %zu tensors", count);
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        names[i] = tensors[i].name;
        files[i] = l->names[l->shard_of[i]];
    }
    if (!(index = ckptio__hf_index_json(names, files, count, l->total, metadata, metadata_count))) {
        st = ckptio_last_error()->status;
        goto out;
    }
    /* The library's one writer of a small file committed atomically beside others. */
    st = ckptio__dcp_write_file(dir, CKPTIO__HF_INDEX_NAME, index, strlen(index), NULL, sync_flags);
out:
    ckptio__free(index);
    ckptio__free(files);
    ckptio__free(names);
    return st;
}

ckptio_status ckptio__hf_save(const char *dir, const ckptio_tensor_source *tensors, size_t count, uint64_t shard_size,
                             unsigned sync_flags, ckptio__shard_fn save_shard, void *ctx, size_t *nshards_out) {
    ckptio__hf_layout l;
    CKPTIO_FORWARD(ckptio__hf_layout_make(tensors, count, shard_size, &l));
    ckptio_status st = CKPTIO_OK;
    size_t *members = ckptio__calloc(count + 1, sizeof *members);
    char path[4096];
    if (!members) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the shards of %zu tensors", count);
        goto out;
    }
    for (size_t s = 0; s < l.nshards; s++) {
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, l.names[s]) >= sizeof path) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = dir, .file_offset = -1}), "path too long");
            goto out;
        }
        size_t n = 0;
        for (size_t i = 0; i < count; i++)
            if (l.shard_of[i] == s) members[n++] = i;
        if ((st = save_shard(ctx, path, members, n)) != CKPTIO_OK) goto out;
    }
    if ((st = ckptio__hf_index_write(dir, &l, tensors, count, NULL, 0, sync_flags)) != CKPTIO_OK) goto out;
    if (nshards_out) *nshards_out = l.nshards;
out:
    ckptio__free(members);
    ckptio__hf_layout_free(&l);
    return st;
}
