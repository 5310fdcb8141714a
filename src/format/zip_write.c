/*
 * zip_write.c - byte layout of the zip container torch.save writes
 * (docs/FORMATS.md 1.2-1.5): local headers with the 'FB' alignment extra, data
 * descriptors, the central directory and the always-present zip64 end
 * records. Byte-compatible with PyTorch's inline_container.cc + miniz, so
 * that torch.load (including load.calculate_storage_offsets) finds every
 * record where it expects it.
 */
#include "zip_internal.h"

#include <string.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_DESCRIPTOR 0x08074b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_ZIP64_EOCD 0x06064b50u
#define SIG_ZIP64_LOCATOR 0x07064b50u
#define SIG_EOCD 0x06054b50u

#define FLAG_DESCRIPTOR 0x0008u
#define FLAG_UTF8 0x0800u

static bool size_is_large(uint64_t size) { return size >= CKPTIO_ZIP32_LIMIT; }
static bool offset_is_large(uint64_t offset) { return offset >= CKPTIO_ZIP32_LIMIT; }

/* Length of the zip64 extra (header included) that miniz writes into a
 * record's local header and central entry: present when the size or the
 * local-header offset does not fit 32 bits, holding the two sizes when the
 * size is large and the offset when the offset is large. */
static uint32_t zip64_extra_len(uint64_t header_offset, uint64_t size) {
    if (!size_is_large(size) && !offset_is_large(header_offset)) return 0;
    return 4u + (size_is_large(size) ? 16u : 0u) + (offset_is_large(header_offset) ? 8u : 0u);
}

static uint16_t alignment_pad(uint64_t header_offset, uint16_t name_len, uint64_t size, uint32_t alignment) {
    uint64_t start = header_offset + CKPTIO_ZIP_LOCAL_HEADER_SIZE + name_len + 4 +
                     zip64_extra_len(header_offset, size);
    return (uint16_t)((alignment - start % alignment) % alignment);
}

uint64_t ckptio__zip_local_header_len(uint64_t header_offset, uint16_t name_len, uint64_t size,
                                      uint32_t alignment) {
    return CKPTIO_ZIP_LOCAL_HEADER_SIZE + (uint64_t)name_len + zip64_extra_len(header_offset, size) + 4u +
           alignment_pad(header_offset, name_len, size, alignment);
}

uint32_t ckptio__zip_descriptor_len(uint64_t header_offset, uint64_t size) {
    if (size == 0) return 0;
    return zip64_extra_len(header_offset, size) ? 24u : 16u;
}

ckptio_status ckptio__zip_layout(ckptio__zip_entry *entries, size_t count, uint32_t alignment,
                                 uint64_t *cd_offset) {
    if (alignment == 0 || alignment > CKPTIO_ZIP_MAX_ALIGNMENT)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "storage alignment %u is outside 1..%u", alignment,
                           CKPTIO_ZIP_MAX_ALIGNMENT);
    uint64_t pos = 0;
    for (size_t i = 0; i < count; i++) {
        ckptio__zip_entry *e = &entries[i];
        e->header_offset = pos;
        e->flags = e->size ? (FLAG_UTF8 | FLAG_DESCRIPTOR) : FLAG_UTF8;
        e->method = 0;
        e->csize = e->size;
        uint64_t data = pos + ckptio__zip_local_header_len(pos, e->name_len, e->size, alignment);
        e->data_offset = data;
        if (ckptio__add_overflows(data, e->size, &pos) ||
            ckptio__add_overflows(pos, ckptio__zip_descriptor_len(e->header_offset, e->size), &pos))
            return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.subject = e->name, .file_offset = -1}),
                                   "record of %llu bytes overflows 64-bit file offsets",
                                   (unsigned long long)e->size);
    }
    *cd_offset = pos;
    return CKPTIO_OK;
}

/* The zip64 extra field of `e` (z64 bytes, from zip64_extra_len) at p:
 * sizes when the size needs 64 bits (the compressed one given as `csize`),
 * then the header offset when it does. Returns the end. */
static uint8_t *put_zip64_extra(uint8_t *p, const ckptio__zip_entry *e, uint32_t z64, uint64_t csize) {
    ckptio__put16(p, 0x0001);
    ckptio__put16(p + 2, (uint16_t)(z64 - 4u));
    p += 4;
    if (size_is_large(e->size)) {
        ckptio__put64(p, e->size);
        ckptio__put64(p + 8, csize);
        p += 16;
    }
    if (offset_is_large(e->header_offset)) {
        ckptio__put64(p, e->header_offset);
        p += 8;
    }
    return p;
}

void ckptio__zip_write_local_header(const ckptio__zip_entry *e, uint32_t alignment, uint8_t *out) {
    const uint32_t z64 = zip64_extra_len(e->header_offset, e->size);
    const uint16_t pad = alignment_pad(e->header_offset, e->name_len, e->size, alignment);
    uint8_t *p = out;
    ckptio__put32(p + 0, SIG_LOCAL);
    ckptio__put16(p + 4, 0);               /* version needed */
    ckptio__put16(p + 6, e->flags);
    ckptio__put16(p + 8, 0);               /* method: stored */
    ckptio__put32(p + 10, 0);              /* DOS time and date */
    ckptio__put32(p + 14, 0);              /* crc: in the data descriptor */
    ckptio__put32(p + 18, 0);              /* compressed size: in the descriptor */
    ckptio__put32(p + 22, 0);              /* uncompressed size: in the descriptor */
    ckptio__put16(p + 26, e->name_len);
    ckptio__put16(p + 28, (uint16_t)(z64 + 4u + pad));
    p += CKPTIO_ZIP_LOCAL_HEADER_SIZE;
    memcpy(p, e->name, e->name_len);
    p += e->name_len;
    if (z64) p = put_zip64_extra(p, e, z64, 0); /* miniz writes the compressed size before it is known */
    p[0] = 'F';
    p[1] = 'B';
    ckptio__put16(p + 2, pad);
    memset(p + 4, 'Z', pad);
}

void ckptio__zip_write_descriptor(const ckptio__zip_entry *e, uint8_t *out) {
    uint32_t len = ckptio__zip_descriptor_len(e->header_offset, e->size);
    if (len == 0) return;
    ckptio__put32(out, SIG_DESCRIPTOR);
    ckptio__put32(out + 4, e->crc32);
    if (len == 24) {
        ckptio__put64(out + 8, e->size);
        ckptio__put64(out + 16, e->size);
    } else {
        ckptio__put32(out + 8, (uint32_t)e->size);
        ckptio__put32(out + 12, (uint32_t)e->size);
    }
}

static uint64_t central_len(const ckptio__zip_entry *entries, size_t count) {
    uint64_t len = 0;
    for (size_t i = 0; i < count; i++)
        len += CKPTIO_ZIP_CENTRAL_HEADER_SIZE + entries[i].name_len +
               zip64_extra_len(entries[i].header_offset, entries[i].size);
    return len;
}

uint64_t ckptio__zip_trailer_len(const ckptio__zip_entry *entries, size_t count) {
    return central_len(entries, count) + CKPTIO_ZIP64_EOCD_SIZE + CKPTIO_ZIP64_LOCATOR_SIZE + CKPTIO_ZIP_EOCD_SIZE;
}

static uint32_t clamp32(uint64_t v) { return v >= CKPTIO_ZIP32_LIMIT ? 0xFFFFFFFFu : (uint32_t)v; }

void ckptio__zip_write_trailer(const ckptio__zip_entry *entries, size_t count, uint64_t cd_offset,
                               uint8_t *out) {
    uint8_t *p = out;
    for (size_t i = 0; i < count; i++) {
        const ckptio__zip_entry *e = &entries[i];
        const uint32_t z64 = zip64_extra_len(e->header_offset, e->size);
        ckptio__put32(p + 0, SIG_CENTRAL);
        ckptio__put16(p + 4, 0);  /* made by */
        ckptio__put16(p + 6, 0);  /* version needed */
        ckptio__put16(p + 8, e->flags);
        ckptio__put16(p + 10, 0); /* method */
        ckptio__put32(p + 12, 0); /* time, date */
        ckptio__put32(p + 16, e->crc32);
        ckptio__put32(p + 20, clamp32(e->size));
        ckptio__put32(p + 24, clamp32(e->size));
        ckptio__put16(p + 28, e->name_len);
        ckptio__put16(p + 30, (uint16_t)z64);
        ckptio__put16(p + 32, 0); /* comment */
        ckptio__put16(p + 34, 0); /* disk */
        ckptio__put16(p + 36, 0); /* internal attributes */
        ckptio__put32(p + 38, 0); /* external attributes */
        ckptio__put32(p + 42, clamp32(e->header_offset));
        p += CKPTIO_ZIP_CENTRAL_HEADER_SIZE;
        memcpy(p, e->name, e->name_len);
        p += e->name_len;
        if (z64) p = put_zip64_extra(p, e, z64, e->size);
    }
    const uint64_t cd_size = (uint64_t)(p - out);
    const uint64_t eocd64_offset = cd_offset + cd_size;
    ckptio__put32(p + 0, SIG_ZIP64_EOCD);
    ckptio__put64(p + 4, CKPTIO_ZIP64_EOCD_SIZE - 12u);
    ckptio__put16(p + 12, 0x031E); /* made by: unix, 3.0 */
    ckptio__put16(p + 14, 0x002D); /* needed: 4.5 (zip64) */
    ckptio__put32(p + 16, 0);      /* this disk */
    ckptio__put32(p + 20, 0);      /* disk with the central directory */
    ckptio__put64(p + 24, count);
    ckptio__put64(p + 32, count);
    ckptio__put64(p + 40, cd_size);
    ckptio__put64(p + 48, cd_offset);
    p += CKPTIO_ZIP64_EOCD_SIZE;
    ckptio__put32(p + 0, SIG_ZIP64_LOCATOR);
    ckptio__put32(p + 4, 0);
    ckptio__put64(p + 8, eocd64_offset);
    ckptio__put32(p + 16, 1);
    p += CKPTIO_ZIP64_LOCATOR_SIZE;
    const uint16_t n16 = count >= 0xFFFF ? 0xFFFF : (uint16_t)count;
    ckptio__put32(p + 0, SIG_EOCD);
    ckptio__put16(p + 4, 0);
    ckptio__put16(p + 6, 0);
    ckptio__put16(p + 8, n16);
    ckptio__put16(p + 10, n16);
    ckptio__put32(p + 12, clamp32(cd_size));
    ckptio__put32(p + 16, clamp32(cd_offset));
    ckptio__put16(p + 20, 0);
}
