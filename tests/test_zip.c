/*
 * test_zip.c - the zip container of torch.save files (src/format/zip_*.c):
 * layout offsets equal to what torch 2.x writes, header and trailer bytes
 * as docs/FORMATS.md 1.2-1.5 describe them, zip64 for records and offsets past
 * 4 GiB (computed, never written), and the reader's checks.
 */
#include "helpers.h"
#include "zip_internal.h"

#include <string.h>

static ckptio__zip_entry entry(const char *name, uint64_t size) {
    ckptio__zip_entry e = {0};
    e.name = (char *)name;
    e.name_len = (uint16_t)strlen(name);
    e.size = size;
    return e;
}

/* torch.save of a small state dict (alignment 64), as observed with torch
 * 2.15: records, sizes and local-header offsets read with Python's zipfile. */
static void test_layout_matches_torch(void) {
    const char *names[] = {"m/data.pkl", "m/.format_version", "m/.storage_alignment", "m/byteorder", "m/data/0",
                           "m/data/1", "m/data/2", "m/data/3", "m/version", "m/.data/serialization_id"};
    const uint64_t sizes[] = {767, 1, 2, 6, 48, 4, 3, 6, 2, 40};
    const uint64_t offsets[] = {0, 847, 977, 1106, 1174, 1280, 1364, 1427, 1494, 1618};
    ckptio__zip_entry e[10];
    for (int i = 0; i < 10; i++) e[i] = entry(names[i], sizes[i]);
    uint64_t cd;
    T_OK(ckptio__zip_layout(e, 10, 64, &cd));
    for (int i = 0; i < 10; i++) {
        T_ASSERT_MSG(e[i].header_offset == offsets[i], "record %s at %llu, torch puts it at %llu", names[i],
                     (unsigned long long)e[i].header_offset, (unsigned long long)offsets[i]);
        T_ASSERT(e[i].data_offset % 64 == 0);
    }
    /* Observed: the central directory starts at 0x6f8 and holds 0x247 bytes. */
    T_ASSERT(cd == 0x6f8);
    T_ASSERT(ckptio__zip_trailer_len(e, 10) - 56 - 20 - 22 == 0x247);
}

static void test_local_header_bytes(void) {
    ckptio__zip_entry e = entry("m/data.pkl", 767);
    uint64_t cd;
    T_OK(ckptio__zip_layout(&e, 1, 64, &cd));
    static uint8_t buf[8192];
    const uint64_t hlen = e.data_offset - e.header_offset;
    T_ASSERT(hlen == 64); /* 30 + 10 + 4 + 20 padding */
    ckptio__zip_write_local_header(&e, 64, buf);
    static const uint8_t want[] = {0x50, 0x4b, 0x03, 0x04, 0x00, 0x00, 0x08, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                                   0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00,
                                   0x18, 0x00, 'm', '/', 'd', 'a', 't', 'a', '.', 'p', 'k', 'l', 'F', 'B', 0x14, 0x00};
    T_ASSERT(memcmp(buf, want, sizeof want) == 0);
    for (uint64_t i = sizeof want; i < hlen; i++) T_ASSERT(buf[i] == 'Z');
    e.crc32 = 0x8c3e6ec5;
    uint8_t desc[24];
    T_ASSERT(ckptio__zip_descriptor_len(e.header_offset, e.size) == 16);
    ckptio__zip_write_descriptor(&e, desc);
    static const uint8_t want_desc[] = {0x50, 0x4b, 0x07, 0x08, 0xc5, 0x6e, 0x3e, 0x8c,
                                        0xff, 0x02, 0x00, 0x00, 0xff, 0x02, 0x00, 0x00};
    T_ASSERT(memcmp(desc, want_desc, 16) == 0);

    /* An empty record: UTF-8 flag only, no descriptor, the FB extra still there. */
    ckptio__zip_entry z = entry("a/x", 0);
    T_OK(ckptio__zip_layout(&z, 1, 4096, &cd));
    ckptio__zip_write_local_header(&z, 4096, buf);
    T_ASSERT(ckptio__le16(buf + 6) == 0x0800);
    T_ASSERT(ckptio__zip_descriptor_len(0, 0) == 0);
    T_ASSERT(z.data_offset == 4096 && cd == 4096);
    /* Alignment 1: pad 0, but "FB 00 00" is still written. */
    ckptio__zip_entry one = entry("a/y", 3);
    T_OK(ckptio__zip_layout(&one, 1, 1, &cd));
    ckptio__zip_write_local_header(&one, 1, buf);
    T_ASSERT(one.data_offset == 30 + 3 + 4);
    T_ASSERT(buf[33] == 'F' && buf[34] == 'B' && buf[35] == 0 && buf[36] == 0);
    T_STATUS(ckptio__zip_layout(&one, 1, 65537, &cd), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("alignment 65537");
}

static void test_trailer_bytes_and_reader(void) {
    ckptio__zip_entry e[3] = {entry("ar/data.pkl", 100), entry("ar/data/0", 4096), entry("ar/version", 2)};
    e[0].crc32 = 0x11111111;
    e[1].crc32 = 0x22222222;
    e[2].crc32 = 0x33333333;
    uint64_t cd;
    T_OK(ckptio__zip_layout(e, 3, 4096, &cd));
    const uint64_t tlen = ckptio__zip_trailer_len(e, 3);
    uint8_t *tail = malloc(tlen);
    ckptio__zip_write_trailer(e, 3, cd, tail);
    const uint64_t cd_size = tlen - 98;
    /* Central entry 1: signature, flags, crc, sizes, offset, no extra. */
    const uint8_t *c1 = tail + 46 + 11;
    T_ASSERT(ckptio__le32(c1) == 0x02014b50);
    T_ASSERT(ckptio__le16(c1 + 8) == 0x0808 && ckptio__le32(c1 + 16) == 0x22222222);
    T_ASSERT(ckptio__le32(c1 + 20) == 4096 && ckptio__le32(c1 + 24) == 4096 && ckptio__le16(c1 + 30) == 0);
    T_ASSERT(ckptio__le32(c1 + 42) == e[1].header_offset);
    /* Zip64 EOCD, locator, EOCD. */
    const uint8_t *z = tail + cd_size;
    T_ASSERT(ckptio__le32(z) == 0x06064b50 && ckptio__le64(z + 4) == 44 && ckptio__le16(z + 12) == 0x031e &&
             ckptio__le16(z + 14) == 0x002d && ckptio__le64(z + 24) == 3 && ckptio__le64(z + 32) == 3 &&
             ckptio__le64(z + 40) == cd_size && ckptio__le64(z + 48) == cd);
    T_ASSERT(ckptio__le32(z + 56) == 0x07064b50 && ckptio__le64(z + 64) == cd + cd_size && ckptio__le32(z + 72) == 1);
    const uint8_t *eocd = z + 76;
    T_ASSERT(ckptio__le32(eocd) == 0x06054b50 && ckptio__le16(eocd + 8) == 3 && ckptio__le16(eocd + 10) == 3 &&
             ckptio__le32(eocd + 12) == cd_size && ckptio__le32(eocd + 16) == cd && ckptio__le16(eocd + 20) == 0);

    /* The reader finds it again from the tail alone. */
    ckptio__zip_directory dir;
    uint64_t need = 0;
    const uint64_t file_size = cd + tlen;
    T_OK(ckptio__zip_find_directory(tail, tlen, file_size, "t.pt", &dir, &need));
    T_ASSERT(dir.count == 3 && dir.cd_offset == cd && dir.cd_size == cd_size);
    ckptio__zip_entry *parsed;
    T_OK(ckptio__zip_parse_central(tail, &dir, file_size, "t.pt", &parsed));
    for (int i = 0; i < 3; i++) {
        T_ASSERT(strcmp(parsed[i].name, e[i].name) == 0);
        T_ASSERT(parsed[i].size == e[i].size && parsed[i].crc32 == e[i].crc32);
        T_ASSERT(parsed[i].header_offset == e[i].header_offset);
    }
    ckptio__zip_entries_free(parsed, 3);

    /* A local header for record 1, checked against its central entry. */
    uint8_t hdr[8192];
    ckptio__zip_entry copy = e[1];
    ckptio__zip_write_local_header(&e[1], 4096, hdr);
    copy.data_offset = 0;
    T_OK(ckptio__zip_parse_local_header(&copy, hdr, 30 + copy.name_len, file_size, "t.pt"));
    T_ASSERT(copy.data_offset == e[1].data_offset && copy.data_offset % 4096 == 0);
    hdr[30] = 'X';
    T_STATUS(ckptio__zip_parse_local_header(&copy, hdr, 30 + copy.name_len, file_size, "t.pt"), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("different record");

    /* Damage: compressed method, entry past the directory, bad signature, duplicate names. */
    uint8_t *bad = malloc(tlen);
    memcpy(bad, tail, tlen);
    ckptio__put16(bad + 10, 8); /* listed: the torch layer refuses it after spotting TorchScript */
    T_OK(ckptio__zip_parse_central(bad, &dir, file_size, "t.pt", &parsed));
    T_ASSERT(parsed[0].method == 8);
    ckptio__zip_entries_free(parsed, 3);
    ckptio__put16(bad + 8, 0x0809); /* encrypted */
    T_STATUS(ckptio__zip_parse_central(bad, &dir, file_size, "t.pt", &parsed), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("ar/data.pkl");
    T_MESSAGE_HAS("encrypted");
    memcpy(bad, tail, tlen);
    ckptio__put32(bad + 57 + 42, (uint32_t)cd); /* record 1 now starts at the directory */
    T_STATUS(ckptio__zip_parse_central(bad, &dir, file_size, "t.pt", &parsed), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("does not fit before the central directory");
    memcpy(bad, tail, tlen);
    bad[46 + 11] = 0;
    T_STATUS(ckptio__zip_parse_central(bad, &dir, file_size, "t.pt", &parsed), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("bad signature");
    /* Two records of one name. */
    ckptio__zip_entry dup[2] = {entry("d/x", 1), entry("d/x", 1)};
    uint64_t dcd;
    T_OK(ckptio__zip_layout(dup, 2, 64, &dcd));
    uint8_t dtail[512];
    ckptio__zip_write_trailer(dup, 2, dcd, dtail);
    ckptio__zip_directory ddir = {.cd_offset = dcd, .cd_size = 2 * (46 + 3), .count = 2};
    T_STATUS(ckptio__zip_parse_central(dtail, &ddir, dcd + ckptio__zip_trailer_len(dup, 2), "d.pt", &parsed),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("appears twice");
    /* Truncated: the end record is gone. */
    T_STATUS(ckptio__zip_find_directory(tail, tlen - 22, file_size - 22, "t.pt", &dir, &need), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("no zip end-of-central-directory record");
    T_MESSAGE_HAS("t.pt");
    /* Zip64 record pointing past the locator. */
    memcpy(bad, tail, tlen);
    ckptio__put64(bad + cd_size + 48, file_size);
    T_STATUS(ckptio__zip_find_directory(bad, tlen, file_size, "t.pt", &dir, &need), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("central directory");
    free(bad);
    free(tail);
}

/* Zip64: a 5 GiB record and a record whose header lies past 4 GiB, laid
 * out and encoded without writing any data. */
static void test_zip64_layout(void) {
    const uint64_t big = 5ull << 30;
    ckptio__zip_entry e[3] = {entry("p/data/0", big), entry("p/data/1", 10), entry("p/version", 2)};
    e[0].crc32 = 0xabcdef01;
    uint64_t cd;
    T_OK(ckptio__zip_layout(e, 3, 4096, &cd));
    /* Record 0: sizes in a zip64 extra (4 + 16), 24-byte descriptor. */
    T_ASSERT(e[0].data_offset == 4096);
    T_ASSERT(ckptio__zip_local_header_len(0, 8, big, 4096) == 4096);
    T_ASSERT(ckptio__zip_descriptor_len(0, big) == 24);
    T_ASSERT(e[1].header_offset == 4096 + big + 24);
    /* Record 1: header offset past 4 GiB -> zip64 extra with the offset. */
    T_ASSERT(e[1].header_offset >= CKPTIO_ZIP32_LIMIT);
    T_ASSERT(ckptio__zip_descriptor_len(e[1].header_offset, 10) == 24);
    T_ASSERT(e[1].data_offset % 4096 == 0);
    uint8_t hdr[8192];
    ckptio__zip_write_local_header(&e[0], 4096, hdr);
    T_ASSERT(ckptio__le16(hdr + 28) == 4096 - 38);            /* extra length */
    T_ASSERT(ckptio__le16(hdr + 38) == 1 && ckptio__le16(hdr + 40) == 16);
    T_ASSERT(ckptio__le64(hdr + 42) == big && ckptio__le64(hdr + 50) == 0);
    T_ASSERT(hdr[58] == 'F' && hdr[59] == 'B');
    ckptio__zip_write_local_header(&e[1], 4096, hdr);
    T_ASSERT(ckptio__le16(hdr + 38) == 1 && ckptio__le16(hdr + 40) == 8);
    T_ASSERT(ckptio__le64(hdr + 42) == e[1].header_offset);
    uint8_t desc[24];
    ckptio__zip_write_descriptor(&e[0], desc);
    T_ASSERT(ckptio__le32(desc + 4) == 0xabcdef01 && ckptio__le64(desc + 8) == big && ckptio__le64(desc + 16) == big);

    /* Central directory: saturated 32-bit fields, zip64 extras; EOCD offset saturated. */
    const uint64_t tlen = ckptio__zip_trailer_len(e, 3);
    uint8_t *tail = malloc(tlen);
    ckptio__zip_write_trailer(e, 3, cd, tail);
    T_ASSERT(ckptio__le32(tail + 20) == 0xFFFFFFFFu && ckptio__le32(tail + 24) == 0xFFFFFFFFu);
    T_ASSERT(ckptio__le16(tail + 30) == 20);
    const uint8_t *eocd = tail + tlen - 22;
    T_ASSERT(ckptio__le32(eocd + 16) == 0xFFFFFFFFu);
    ckptio__zip_directory dir;
    uint64_t need = 0;
    const uint64_t file_size = cd + tlen;
    T_OK(ckptio__zip_find_directory(tail, tlen, file_size, "big.pt", &dir, &need));
    T_ASSERT(dir.cd_offset == cd && dir.count == 3);
    ckptio__zip_entry *parsed;
    T_OK(ckptio__zip_parse_central(tail, &dir, file_size, "big.pt", &parsed));
    T_ASSERT(parsed[0].size == big && parsed[0].csize == big && parsed[0].header_offset == 0);
    T_ASSERT(parsed[1].size == 10 && parsed[1].header_offset == e[1].header_offset);
    T_ASSERT(parsed[2].header_offset == e[2].header_offset);
    ckptio__zip_entries_free(parsed, 3);
    /* The reader asks for the zip64 EOCD when the tail it got does not hold it. */
    T_STATUS(ckptio__zip_find_directory(tail + tlen - 42, 42, file_size, "big.pt", &dir, &need), CKPTIO_E_TRUNCATED);
    T_ASSERT(need == cd + (tlen - 98));
    T_OK(ckptio__zip_parse_zip64_eocd(tail + tlen - 98, need, file_size, "big.pt", &dir));
    T_ASSERT(dir.cd_offset == cd);
    free(tail);
}

/* Records must not share bytes: a local header inside
 * another record's data is how 400 records of 1 MiB fit in 1.1 MB. */
static void test_overlapping_records_refused(void) {
    ckptio__zip_entry e[3] = {entry("m/data/0", 100), entry("m/data/1", 100), entry("m/data/2", 0)};
    /* Back to back, in any order in the directory: fine. */
    e[0].header_offset = 200, e[0].data_offset = 200 + 38;   /* ends at 338 */
    e[1].header_offset = 0, e[1].data_offset = 38;           /* ends at 138 */
    e[2].header_offset = 338, e[2].data_offset = 338 + 38;   /* empty record, ends at 376 */
    T_OK(ckptio__zip_check_disjoint(e, 3, 376, "x.pt"));
    /* A header inside the previous record's data. */
    e[2].header_offset = 337, e[2].data_offset = 337 + 38;
    T_STATUS(ckptio__zip_check_disjoint(e, 3, 400, "x.pt"), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("record overlaps record 'm/data/0'");
    T_ASSERT(strcmp(ckptio_last_error()->subject, "m/data/2") == 0 && ckptio_last_error()->file_offset == 337);
    /* Two records at one offset. */
    e[2].header_offset = 200, e[2].data_offset = 238;
    T_STATUS(ckptio__zip_check_disjoint(e, 3, 400, "x.pt"), CKPTIO_E_FORMAT);
    /* Data running into the central directory. */
    e[2].header_offset = 338, e[2].data_offset = 376;
    T_STATUS(ckptio__zip_check_disjoint(e, 3, 375, "x.pt"), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("inside the central directory");
    T_OK(ckptio__zip_check_disjoint(e, 0, 0, "x.pt"));
}

int main(void) {
    T_RUN(test_layout_matches_torch);
    T_RUN(test_local_header_bytes);
    T_RUN(test_trailer_bytes_and_reader);
    T_RUN(test_zip64_layout);
    T_RUN(test_overlapping_records_refused);
    return T_EXIT_PASS;
}
