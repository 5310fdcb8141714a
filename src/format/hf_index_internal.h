/*
 * hf_index_internal.h - the Hugging Face sharded-safetensors index
 * (model.safetensors.index.json): {"metadata": {"total_size": N, ...},
 * "weight_map": {tensor name: shard file name, ...}}.
 *
 * A pure parser (no I/O): src/ckpt/model_dir.c reads the file, opens the
 * shards and checks the index against their headers. docs/MODELS.md lists
 * the rules.
 */
#ifndef CKPTIO_HF_INDEX_INTERNAL_H
#define CKPTIO_HF_INDEX_INTERNAL_H

#include "common_internal.h"

/* Largest index file read (bytes). Real indexes are a few hundred KiB; the
 * cap bounds jansson's memory like CKPTIO__ST_MAX_HEADER does for headers. */
#define CKPTIO__HF_INDEX_MAX_BYTES 100000000u

/* Longest shard file name accepted (NAME_MAX of Linux file systems). */
#define CKPTIO__HF_INDEX_MAX_NAME 255u

/* One weight_map entry. */
typedef struct ckptio__hf_entry {
    char *name;     /* tensor name (UTF-8, no NUL) */
    size_t shard;   /* index into ckptio__hf_index.shards */
} ckptio__hf_entry;

typedef struct ckptio__hf_index {
    size_t nshards;
    char **shards;              /* distinct shard file names, sorted (strcmp) */
    size_t count;
    ckptio__hf_entry *entries;  /* sorted by name (strcmp); names unique */
    bool has_total_size;
    uint64_t total_size;        /* metadata.total_size when it is a non-negative integer */
} ckptio__hf_index;

/* Parses and validates `len` bytes of index JSON. `path` only labels
 * errors (may be NULL). Rules: one JSON object (UTF-8, duplicate keys
 * anywhere refused, no "\u0000" in any string); "weight_map" present and an
 * object whose values are strings; every shard name a plain file name in
 * the index's directory: 1..CKPTIO__HF_INDEX_MAX_NAME bytes, no '/', not
 * "." or ".." (an absolute path or one with a directory is
 * CKPTIO_E_DISALLOWED naming the tensor); "metadata", when present and not
 * null, an object; other keys ignored. Errors are CKPTIO_E_FORMAT naming
 * the file and the field. On failure *out is zeroed (nothing to free). */
ckptio_status ckptio__hf_index_parse(const char *json, size_t len, const char *path, ckptio__hf_index *out);

/* The entry named `name`, or NULL (binary search). */
const ckptio__hf_entry *ckptio__hf_index_find(const ckptio__hf_index *x, const char *name);

/* Frees what the parser allocated and zeroes *x. Accepts a zeroed index. */
void ckptio__hf_index_free(ckptio__hf_index *x);

/* True when `name` (len bytes) is a plain file name: not empty, at most
 * CKPTIO__HF_INDEX_MAX_NAME bytes, no '/' and no NUL, not "." or "..". */
bool ckptio__hf_plain_name(const char *name, size_t len);

/* The index text of `count` tensors (names[i] is in shard file shards[i];
 * names unique, UTF-8): {"metadata": {"total_size", the `metadata` pairs
 * (string values; a "total_size" among them is replaced)}, "weight_map"} with
 * keys sorted, indent 2 and non-ASCII escaped, plus a newline, as
 * transformers' save_pretrained writes it. Free with ckptio__free; NULL
 * (error set) when out of memory or a name is not UTF-8. */
char *ckptio__hf_index_json(const char *const *names, const char *const *shards, size_t count, uint64_t total_size,
                           const ckptio_kv *metadata, size_t metadata_count);

#endif /* CKPTIO_HF_INDEX_INTERNAL_H */
