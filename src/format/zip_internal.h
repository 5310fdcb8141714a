/*
 * zip_internal.h - the stored (uncompressed) zip container of torch.save
 * files: layout and bytes of local headers, data descriptors, the central
 * directory and the zip64 end records (writer), and parsing of the end
 * records and central directory (reader). docs/FORMATS.md section 1.
 *
 * Format code only: these functions compute offsets and fill or parse byte
 * buffers handed to them; the callers in src/ckpt do the I/O.
 */
#ifndef CKPTIO_ZIP_INTERNAL_H
#define CKPTIO_ZIP_INTERNAL_H

#include "common_internal.h"

#define CKPTIO_ZIP_LOCAL_HEADER_SIZE 30u
#define CKPTIO_ZIP_CENTRAL_HEADER_SIZE 46u
#define CKPTIO_ZIP_EOCD_SIZE 22u
#define CKPTIO_ZIP64_EOCD_SIZE 56u
#define CKPTIO_ZIP64_LOCATOR_SIZE 20u
/* Sizes and offsets at or above this need the zip64 extra field. */
#define CKPTIO_ZIP32_LIMIT 0xFFFFFFFFull
/* Largest storage alignment the 16-bit length of the 'FB' extra allows. */
#define CKPTIO_ZIP_MAX_ALIGNMENT 65536u
/* Longest EOCD comment a reader must skip over when searching backwards. */
#define CKPTIO_ZIP_MAX_TAIL (CKPTIO_ZIP_EOCD_SIZE + 0xFFFFu)

/* One record of the archive. */
typedef struct ckptio__zip_entry {
    char *name;              /* full name ("m/data/0"), NUL-terminated, owned by the entry list */
    uint16_t name_len;
    uint16_t flags;          /* general purpose flags */
    uint16_t method;         /* 0 = stored */
    uint32_t crc32;
    uint64_t size;           /* uncompressed size (== compressed size when stored) */
    uint64_t csize;          /* compressed size from the central directory */
    uint64_t header_offset;  /* offset of the local header */
    uint64_t data_offset;    /* offset of the first data byte (writer: computed; reader:
                              * set once the local header was read, else 0) */
} ckptio__zip_entry;

/* ---- writer ---------------------------------------------------------------- */

/* Bytes from a record's local header to its first data byte: 30 + name +
 * zip64 extra (when needed) + alignment extra, so that the data starts on a
 * multiple of `alignment` (inline_container.cc getPadding). */
uint64_t ckptio__zip_local_header_len(uint64_t header_offset, uint16_t name_len, uint64_t size,
                                      uint32_t alignment);

/* Data descriptor length after a record's data: 0 for an empty record, 24
 * when the record uses a zip64 extra, else 16. */
uint32_t ckptio__zip_descriptor_len(uint64_t header_offset, uint64_t size);

/* Lays the records out back to back from offset 0 in the given order: sets
 * header_offset, data_offset and flags of each, and *cd_offset to where the
 * central directory starts. Fails with CKPTIO_E_RANGE on offset overflow. */
ckptio_status ckptio__zip_layout(ckptio__zip_entry *entries, size_t count, uint32_t alignment,
                                 uint64_t *cd_offset);

/* Writes entry e's local header, name and extras (exactly
 * data_offset - header_offset bytes) to out. */
void ckptio__zip_write_local_header(const ckptio__zip_entry *e, uint32_t alignment, uint8_t *out);

/* Writes e's data descriptor (ckptio__zip_descriptor_len bytes) to out. */
void ckptio__zip_write_descriptor(const ckptio__zip_entry *e, uint8_t *out);

/* Bytes of the central directory plus zip64 EOCD, locator and EOCD. */
uint64_t ckptio__zip_trailer_len(const ckptio__zip_entry *entries, size_t count);

/* Writes the central directory and end records (ckptio__zip_trailer_len
 * bytes) for a central directory starting at cd_offset. */
void ckptio__zip_write_trailer(const ckptio__zip_entry *entries, size_t count, uint64_t cd_offset,
                               uint8_t *out);

/* ---- reader ---------------------------------------------------------------- */

/* Where the central directory is, from the end records. */
typedef struct ckptio__zip_directory {
    uint64_t cd_offset;
    uint64_t cd_size;
    uint64_t count;
} ckptio__zip_directory;

/* Finds the end records in `tail`, the last tail_len bytes of a file of
 * file_size bytes (tail_len = min(file_size, CKPTIO_ZIP_MAX_TAIL +
 * CKPTIO_ZIP64_LOCATOR_SIZE + CKPTIO_ZIP64_EOCD_SIZE) is always enough when
 * the zip64 EOCD sits right before its locator, as every writer puts it).
 * When the zip64 EOCD lies before the tail, *need_offset is set to the
 * offset to read CKPTIO_ZIP64_EOCD_SIZE bytes from and the call returns
 * CKPTIO_E_TRUNCATED without an error record; call
 * ckptio__zip_parse_zip64_eocd() with those bytes then.
 * `origin` names the file in error messages. */
ckptio_status ckptio__zip_find_directory(const uint8_t *tail, size_t tail_len, uint64_t file_size,
                                         const char *origin, ckptio__zip_directory *out,
                                         uint64_t *need_offset);

/* Parses a zip64 EOCD record read from `offset`. */
ckptio_status ckptio__zip_parse_zip64_eocd(const uint8_t *rec, uint64_t offset, uint64_t file_size,
                                           const char *origin, ckptio__zip_directory *out);

/* Parses `dir.count` central directory entries from cd (dir.cd_size bytes).
 * Checks every entry lies inside the file and is not encrypted, and that no
 * two names repeat. Compressed entries are listed (method != 0): the caller
 * refuses them once it knows what the archive is. On success *out holds a
 * ckptio__malloc'ed array (free with ckptio__zip_entries_free). */
ckptio_status ckptio__zip_parse_central(const uint8_t *cd, const ckptio__zip_directory *dir,
                                        uint64_t file_size, const char *origin,
                                        ckptio__zip_entry **out);

/* Checks the local header `hdr` (at least 30 + name_len bytes read at
 * e->header_offset) against central entry e and sets e->data_offset. */
ckptio_status ckptio__zip_parse_local_header(ckptio__zip_entry *e, const uint8_t *hdr, size_t hdr_len,
                                             uint64_t file_size, const char *origin);

/* Once every local header is parsed (data_offset set): refuses records
 * whose bytes (local header through data) overlap another record's or run
 * into the central directory at cd_offset. Overlapping records let a small
 * archive describe far more data than it holds (400 records sharing one
 * 1 MB range expand to 400 MB); torch.save never writes them. Sorts a copy
 * of the offsets: O(n log n). */
ckptio_status ckptio__zip_check_disjoint(const ckptio__zip_entry *entries, size_t count, uint64_t cd_offset,
                                         const char *origin);

void ckptio__zip_entries_free(ckptio__zip_entry *entries, size_t count);

/* ---- little-endian helpers ------------------------------------------------ */

static inline uint16_t ckptio__le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t ckptio__le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t ckptio__le64(const uint8_t *p) {
    return (uint64_t)ckptio__le32(p) | (uint64_t)ckptio__le32(p + 4) << 32;
}
static inline void ckptio__put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void ckptio__put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void ckptio__put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif /* CKPTIO_ZIP_INTERNAL_H */
