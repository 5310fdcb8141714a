/*
 * hash.c - XXH3-64 checksums of byte ranges (libxxhash), for manifests
 * that record what each piece of a checkpoint should hold.
 */
#include "common_internal.h"

#include <xxhash.h>

ckptio_status ckptio_hash_xxh3(const void *data, size_t len, uint64_t *out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_hash_xxh3: out must not be NULL");
    if (!data && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_hash_xxh3: data is NULL but len is %zu", len);
    *out = (uint64_t)XXH3_64bits(len ? data : "", len);
    return CKPTIO_OK;
}
