/*
 * hash.c - XXH3-64 checksums of byte ranges (libxxhash), for manifests
 * that record what each piece of a checkpoint should hold, and the zlib
 * CRC-32 that torch.save's zip records carry.
 */
#include "common_internal.h"

#include "xxh3_fast.h"
#include <zlib.h>

uint32_t ckptio__crc32(const void *data, uint64_t len) {
    const uint64_t piece = 1ull << 30;
    uLong crc = crc32(0L, Z_NULL, 0);
    for (uint64_t done = 0; done < len;) {
        const uint64_t n = len - done > piece ? piece : len - done;
        crc = crc32(crc, (const Bytef *)data + done, (uInt)n);
        done += n;
    }
    return (uint32_t)crc;
}

ckptio_status ckptio_hash_xxh3(const void *data, size_t len, uint64_t *out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_hash_xxh3: out must not be NULL");
    if (!data && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_hash_xxh3: data is NULL but len is %zu", len);
    *out = (uint64_t)XXH3_64bits(len ? data : "", len);
    return CKPTIO_OK;
}
