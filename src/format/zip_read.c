/*
 * zip_read.c - parsing the zip container of torch.save files: the end
 * records (plain and zip64), the central directory and local headers.
 * Every length and offset read from the file is checked against the file
 * size before use; errors name the file, the offset and the record.
 */
#include "zip_internal.h"

#include <stdlib.h>
#include <string.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_ZIP64_EOCD 0x06064b50u
#define SIG_ZIP64_LOCATOR 0x07064b50u
#define SIG_EOCD 0x06054b50u

#define ZIP_FAIL(status, origin, offset, subj_, ...)                                              \
    CKPTIO_FAIL_CTX((status),                                                                       \
                    &((ckptio__err_ctx){.operation = "parse zip", .path = (origin),                 \
                                        .file_offset = (int64_t)(offset), .subject = (subj_)}),   \
                    __VA_ARGS__)

ckptio_status ckptio__zip_parse_zip64_eocd(const uint8_t *rec, uint64_t offset, uint64_t file_size,
                                           const char *origin, ckptio__zip_directory *out) {
    if (ckptio__le32(rec) != SIG_ZIP64_EOCD)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, offset, "zip64 end record",
                        "bad signature 0x%08x (expected 0x%08x)", ckptio__le32(rec), SIG_ZIP64_EOCD);
    if (ckptio__le32(rec + 16) != 0 || ckptio__le32(rec + 20) != 0)
        return ZIP_FAIL(CKPTIO_E_UNSUPPORTED, origin, offset, "zip64 end record",
                        "multi-disk archives are not supported");
    uint64_t count = ckptio__le64(rec + 32);
    if (ckptio__le64(rec + 24) != count)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, offset, "zip64 end record",
                        "entry counts disagree (%llu on this disk, %llu in total)",
                        (unsigned long long)ckptio__le64(rec + 24), (unsigned long long)count);
    out->count = count;
    out->cd_size = ckptio__le64(rec + 40);
    out->cd_offset = ckptio__le64(rec + 48);
    uint64_t end;
    if (ckptio__add_overflows(out->cd_offset, out->cd_size, &end) || end > offset || offset > file_size)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, offset, "zip64 end record",
                        "central directory [%llu, +%llu) does not end before the end record",
                        (unsigned long long)out->cd_offset, (unsigned long long)out->cd_size);
    if (count > out->cd_size / CKPTIO_ZIP_CENTRAL_HEADER_SIZE)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, offset, "zip64 end record",
                        "%llu entries cannot fit a central directory of %llu bytes",
                        (unsigned long long)count, (unsigned long long)out->cd_size);
    return CKPTIO_OK;
}

ckptio_status ckptio__zip_find_directory(const uint8_t *tail, size_t tail_len, uint64_t file_size,
                                         const char *origin, ckptio__zip_directory *out,
                                         uint64_t *need_offset) {
    const uint64_t tail_start = file_size - tail_len;
    if (tail_len < CKPTIO_ZIP_EOCD_SIZE)
        return ZIP_FAIL(CKPTIO_E_TRUNCATED, origin, file_size, NULL,
                        "file of %llu bytes is too short for a zip end record", (unsigned long long)file_size);
    /* Search backwards: the record is followed only by its comment. */
    ptrdiff_t eocd = -1;
    for (ptrdiff_t pos = (ptrdiff_t)(tail_len - CKPTIO_ZIP_EOCD_SIZE); pos >= 0; pos--) {
        if (ckptio__le32(tail + pos) == SIG_EOCD &&
            (size_t)pos + CKPTIO_ZIP_EOCD_SIZE + ckptio__le16(tail + pos + 20) == tail_len) {
            eocd = pos;
            break;
        }
    }
    if (eocd < 0)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, file_size, NULL,
                        "no zip end-of-central-directory record in the last %zu bytes (truncated or not a zip)",
                        tail_len);
    const uint8_t *e = tail + eocd;
    const uint64_t eocd_offset = tail_start + (uint64_t)eocd;
    if (ckptio__le16(e + 4) != 0 || ckptio__le16(e + 6) != 0)
        return ZIP_FAIL(CKPTIO_E_UNSUPPORTED, origin, eocd_offset, "end record",
                        "multi-disk archives are not supported");

    if (eocd >= (ptrdiff_t)CKPTIO_ZIP64_LOCATOR_SIZE &&
        ckptio__le32(e - CKPTIO_ZIP64_LOCATOR_SIZE) == SIG_ZIP64_LOCATOR) {
        const uint8_t *loc = e - CKPTIO_ZIP64_LOCATOR_SIZE;
        uint64_t z64 = ckptio__le64(loc + 8);
        uint64_t loc_offset = eocd_offset - CKPTIO_ZIP64_LOCATOR_SIZE;
        if (z64 > loc_offset || loc_offset - z64 < CKPTIO_ZIP64_EOCD_SIZE)
            return ZIP_FAIL(CKPTIO_E_FORMAT, origin, loc_offset, "zip64 locator",
                            "zip64 end record offset %llu is not before the locator", (unsigned long long)z64);
        if (z64 < tail_start) {
            *need_offset = z64;
            return CKPTIO_E_TRUNCATED;
        }
        return ckptio__zip_parse_zip64_eocd(tail + (z64 - tail_start), z64, file_size, origin, out);
    }
    out->count = ckptio__le16(e + 10);
    out->cd_size = ckptio__le32(e + 12);
    out->cd_offset = ckptio__le32(e + 16);
    if (out->count == 0xFFFF || out->cd_size == 0xFFFFFFFFu || out->cd_offset == 0xFFFFFFFFu)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, eocd_offset, "end record",
                        "fields say zip64 but there is no zip64 locator before the end record");
    if (out->cd_offset + out->cd_size > eocd_offset)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, eocd_offset, "end record",
                        "central directory [%llu, +%llu) runs past the end record",
                        (unsigned long long)out->cd_offset, (unsigned long long)out->cd_size);
    if (out->count > out->cd_size / CKPTIO_ZIP_CENTRAL_HEADER_SIZE)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, eocd_offset, "end record",
                        "%llu entries cannot fit a central directory of %llu bytes",
                        (unsigned long long)out->count, (unsigned long long)out->cd_size);
    return CKPTIO_OK;
}

/* Reads the zip64 extra of a central entry: fields appear only for the
 * 32-bit values that were saturated, in the order usize, csize, offset. */
static ckptio_status parse_zip64_extra(const uint8_t *extra, size_t len, ckptio__zip_entry *e,
                                       bool need_usize, bool need_csize, bool need_offset, uint64_t at,
                                       const char *origin) {
    size_t pos = 0;
    while (pos + 4 <= len) {
        uint16_t id = ckptio__le16(extra + pos), sz = ckptio__le16(extra + pos + 2);
        if (pos + 4 + sz > len)
            return ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, e->name, "extra field 0x%04x of %u bytes runs past the entry",
                            id, sz);
        if (id == 0x0001) {
            const uint8_t *f = extra + pos + 4;
            size_t need = (need_usize ? 8u : 0u) + (need_csize ? 8u : 0u) + (need_offset ? 8u : 0u);
            if (sz < need)
                return ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, e->name,
                                "zip64 extra holds %u bytes, %zu needed", sz, need);
            if (need_usize) e->size = ckptio__le64(f), f += 8;
            if (need_csize) e->csize = ckptio__le64(f), f += 8;
            if (need_offset) e->header_offset = ckptio__le64(f);
            return CKPTIO_OK;
        }
        pos += 4u + sz;
    }
    if (need_usize || need_csize || need_offset)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, e->name, "saturated 32-bit field but no zip64 extra");
    return CKPTIO_OK;
}

static int compare_names(const void *a, const void *b) {
    const ckptio__zip_entry *x = *(const ckptio__zip_entry *const *)a, *y = *(const ckptio__zip_entry *const *)b;
    return strcmp(x->name, y->name);
}

void ckptio__zip_entries_free(ckptio__zip_entry *entries, size_t count) {
    if (!entries) return;
    for (size_t i = 0; i < count; i++) ckptio__free(entries[i].name);
    ckptio__free(entries);
}

ckptio_status ckptio__zip_parse_central(const uint8_t *cd, const ckptio__zip_directory *dir,
                                        uint64_t file_size, const char *origin,
                                        ckptio__zip_entry **out) {
    ckptio_status st = CKPTIO_OK;
    ckptio__zip_entry **sorted = NULL;
    ckptio__zip_entry *entries = ckptio__calloc(dir->count ? dir->count : 1, sizeof *entries);
    if (!entries) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: no memory for %llu zip entries", origin,
                                     (unsigned long long)dir->count);
    size_t pos = 0;
    size_t n = 0;
    for (; n < dir->count; n++) {
        const uint64_t at = dir->cd_offset + pos;
        if (pos + CKPTIO_ZIP_CENTRAL_HEADER_SIZE > dir->cd_size) {
            st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, NULL, "central directory entry %zu runs past the directory", n);
            goto out;
        }
        const uint8_t *h = cd + pos;
        if (ckptio__le32(h) != SIG_CENTRAL) {
            st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, NULL, "central directory entry %zu: bad signature 0x%08x", n,
                          ckptio__le32(h));
            goto out;
        }
        ckptio__zip_entry *e = &entries[n];
        const uint16_t name_len = ckptio__le16(h + 28), extra_len = ckptio__le16(h + 30),
                       comment_len = ckptio__le16(h + 32);
        const size_t total = CKPTIO_ZIP_CENTRAL_HEADER_SIZE + (size_t)name_len + extra_len + comment_len;
        if (pos + total > dir->cd_size) {
            st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, NULL,
                          "central directory entry %zu (%zu bytes) runs past the directory", n, total);
            goto out;
        }
        const uint8_t *name = h + CKPTIO_ZIP_CENTRAL_HEADER_SIZE;
        if (name_len == 0 || memchr(name, 0, name_len)) {
            st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, NULL,
                          "central directory entry %zu has an empty name or a NUL byte in it", n);
            goto out;
        }
        e->name = ckptio__malloc((size_t)name_len + 1);
        if (!e->name) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: no memory for a zip entry name", origin);
            goto out;
        }
        memcpy(e->name, name, name_len);
        e->name[name_len] = '\0';
        e->name_len = name_len;
        e->flags = ckptio__le16(h + 8);
        e->method = ckptio__le16(h + 10);
        e->crc32 = ckptio__le32(h + 16);
        e->csize = ckptio__le32(h + 20);
        e->size = ckptio__le32(h + 24);
        e->header_offset = ckptio__le32(h + 42);
        st = parse_zip64_extra(name + name_len, extra_len, e, e->size == 0xFFFFFFFFu, e->csize == 0xFFFFFFFFu,
                               e->header_offset == 0xFFFFFFFFu, at, origin);
        if (st) {
            n++;
            goto out;
        }
        pos += total;
        if (e->flags & 0x0001u) {
            st = ZIP_FAIL(CKPTIO_E_UNSUPPORTED, origin, at, e->name, "record is encrypted");
        } else if (e->method == 0 && e->csize != e->size) {
            st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, e->name,
                          "stored record has compressed size %llu != size %llu", (unsigned long long)e->csize,
                          (unsigned long long)e->size);
        } else {
            uint64_t end;
            if (ckptio__add_overflows(e->header_offset, CKPTIO_ZIP_LOCAL_HEADER_SIZE + (uint64_t)name_len, &end) ||
                ckptio__add_overflows(end, e->size, &end) || end > dir->cd_offset)
                st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, e->name,
                              "record at offset %llu with %llu bytes does not fit before the central directory "
                              "at %llu (file size %llu)",
                              (unsigned long long)e->header_offset, (unsigned long long)e->size,
                              (unsigned long long)dir->cd_offset, (unsigned long long)file_size);
        }
        if (st) {
            n++;
            goto out;
        }
    }
    if (dir->count > 1) {
        sorted = ckptio__malloc(dir->count * sizeof *sorted);
        if (!sorted) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: no memory to check zip names", origin);
            goto out;
        }
        for (size_t i = 0; i < n; i++) sorted[i] = &entries[i];
        qsort(sorted, n, sizeof *sorted, compare_names);
        for (size_t i = 1; i < n; i++) {
            if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
                st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, (int64_t)sorted[i]->header_offset, sorted[i]->name,
                              "record name appears twice in the central directory");
                goto out;
            }
        }
    }
out:
    ckptio__free(sorted);
    if (st) {
        ckptio__zip_entries_free(entries, n);
        return st;
    }
    *out = entries;
    return CKPTIO_OK;
}

ckptio_status ckptio__zip_parse_local_header(ckptio__zip_entry *e, const uint8_t *hdr, size_t hdr_len,
                                             uint64_t file_size, const char *origin) {
    const uint64_t at = e->header_offset;
    if (hdr_len < CKPTIO_ZIP_LOCAL_HEADER_SIZE + (size_t)e->name_len)
        return ZIP_FAIL(CKPTIO_E_TRUNCATED, origin, at, e->name, "local header truncated");
    if (ckptio__le32(hdr) != SIG_LOCAL)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, e->name, "bad local header signature 0x%08x",
                        ckptio__le32(hdr));
    const uint16_t name_len = ckptio__le16(hdr + 26), extra_len = ckptio__le16(hdr + 28);
    if (name_len != e->name_len || memcmp(hdr + CKPTIO_ZIP_LOCAL_HEADER_SIZE, e->name, name_len) != 0)
        return ZIP_FAIL(CKPTIO_E_FORMAT, origin, at, e->name,
                        "local header names a different record than the central directory");
    if (ckptio__le16(hdr + 8) != 0)
        return ZIP_FAIL(CKPTIO_E_UNSUPPORTED, origin, at, e->name, "local header says compressed (method %u)",
                        ckptio__le16(hdr + 8));
    e->data_offset = at + CKPTIO_ZIP_LOCAL_HEADER_SIZE + name_len + extra_len;
    uint64_t end;
    if (ckptio__add_overflows(e->data_offset, e->size, &end) || end > file_size)
        return ZIP_FAIL(CKPTIO_E_TRUNCATED, origin, e->data_offset, e->name,
                        "record data of %llu bytes runs past the end of the file (%llu bytes)",
                        (unsigned long long)e->size, (unsigned long long)file_size);
    return CKPTIO_OK;
}

static int compare_offsets(const void *a, const void *b) {
    const ckptio__zip_entry *x = *(const ckptio__zip_entry *const *)a, *y = *(const ckptio__zip_entry *const *)b;
    return x->header_offset < y->header_offset ? -1 : x->header_offset > y->header_offset;
}

ckptio_status ckptio__zip_check_disjoint(const ckptio__zip_entry *entries, size_t count, uint64_t cd_offset,
                                         const char *origin) {
    if (count == 0) return CKPTIO_OK;
    const ckptio__zip_entry **sorted = ckptio__malloc(count * sizeof *sorted);
    if (!sorted) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: no memory to check %zu zip records", origin, count);
    for (size_t i = 0; i < count; i++) sorted[i] = &entries[i];
    qsort(sorted, count, sizeof *sorted, compare_offsets);
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; i < count && st == CKPTIO_OK; i++) {
        const ckptio__zip_entry *e = sorted[i];
        const uint64_t end = e->data_offset + e->size; /* no overflow: checked against the file size */
        if (i + 1 < count && sorted[i + 1]->header_offset < end)
            st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, sorted[i + 1]->header_offset, sorted[i + 1]->name,
                          "record overlaps record '%s' (bytes %llu..%llu): the records of an archive must not "
                          "share bytes",
                          e->name, (unsigned long long)e->header_offset, (unsigned long long)end);
        else if (end > cd_offset)
            st = ZIP_FAIL(CKPTIO_E_FORMAT, origin, e->header_offset, e->name,
                          "record data ends at %llu, inside the central directory at %llu", (unsigned long long)end,
                          (unsigned long long)cd_offset);
    }
    ckptio__free(sorted);
    return st;
}
