/*
 * format_detect.c - which checkpoint format a file's first bytes are: the one
 * rule the library, the CLI and the Python package all use
 * (ckptio_format_detect_bytes in include/ckptio/file.h states it).
 *
 * The order matters. A safetensors file begins with its header length N as
 * a little-endian u64, so its first byte can be anything: N = 128 mod 256
 * starts with 0x80 like a pickle, N = 0x04034b50 + k * 2^32 with "PK\3\4"
 * like a zip. The exact safetensors rule (N within the file, header starts
 * with '{') therefore runs first; the magic numbers of torch files come
 * after it, and no torch file passes it. No I/O here: src/ckpt/format_probe.c
 * reads the bytes of a path.
 */
#include "safetensors_internal.h"

#include <string.h>

ckptio_status ckptio_format_detect_bytes(const void *head, size_t len, uint64_t file_size, ckptio_format *out) {
    CKPTIO_RETURN_IF(!out || (!head && len), CKPTIO_E_INVAL, "ckptio_format_detect_bytes: NULL argument");
    CKPTIO_RETURN_IF(len > file_size, CKPTIO_E_INVAL, "ckptio_format_detect_bytes: len %zu exceeds file_size %llu",
                     len, (unsigned long long)file_size);
    const unsigned char *h = head;
    if (ckptio__st_probe(h, len, file_size) != CKPTIO__ST_PROBE_NO) *out = CKPTIO_FORMAT_SAFETENSORS;
    else if (len >= 4 && memcmp(h, "PK\x03\x04", 4) == 0) *out = CKPTIO_FORMAT_TORCH;
    else if (len >= 2 && h[0] == 0x80 && h[1] >= 2 && h[1] <= 5) *out = CKPTIO_FORMAT_TORCH_LEGACY;
    else if (len > CKPTIO__ST_PREFIX && h[CKPTIO__ST_PREFIX] == '{') *out = CKPTIO_FORMAT_SAFETENSORS;
    else *out = CKPTIO_FORMAT_UNKNOWN;
    return CKPTIO_OK;
}

const char *ckptio_format_name(ckptio_format format) {
    switch (format) {
    case CKPTIO_FORMAT_SAFETENSORS: return "safetensors";
    case CKPTIO_FORMAT_TORCH: return "torch";
    case CKPTIO_FORMAT_TORCH_LEGACY: return "torch_legacy";
    case CKPTIO_FORMAT_DCP: return "dcp";
    case CKPTIO_FORMAT_HF_INDEX: return "hf_index";
    case CKPTIO_FORMAT_DIRECTORY: return "directory";
    case CKPTIO_FORMAT_UNKNOWN: break;
    }
    return "unknown";
}
