/*
 * fuzz_s3_xml.c - libFuzzer target for the reader of S3 servers' XML answers
 * (src/objstore/s3_xml.c): the input is an answer's body, as a server (or
 * anything on the network path) may send it.
 *
 * Beyond "no crash, no leak, no UB": element paths stay within 255 bytes and
 * each text callback gets `len` bytes with a NUL after them; an accepted
 * listing gives keys of at most 1,024 bytes without a NUL inside, decimal
 * sizes, and a next-page marker whenever it says it is truncated; single
 * values come back NUL-terminated within their buffer. A broken invariant
 * traps.
 */
#include "fuzz_check.h"
#include "objstore_internal.h"

#include <string.h>

static int walk_fn(void *user, const char *path, const char *text, size_t len) {
    CHECK(strlen(path) <= 255);
    if (text) CHECK(text[len] == '\0');
    (*(size_t *)user)++;
    return 0;
}

static int entry_fn(void *user, const ckptio__s3_entry *e) {
    CHECK(e->key && strlen(e->key) <= CKPTIO__S3_MAX_KEY);
    CHECK(e->etag && e->upload_id && e->time);
    if (e->is_prefix) CHECK(e->size == 0 && !e->etag[0]);
    (*(size_t *)user)++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *xml = (const char *)data;
    char err[200];
    size_t calls = 0;
    ckptio__xml_walk(xml, size, walk_fn, &calls, err, sizeof err);
    CHECK(strlen(err) < sizeof err);

    bool truncated = true;
    char next[2048], next2[1024];
    size_t entries = 0;
    const int r = ckptio__xml_list(xml, size, entry_fn, &entries, &truncated, next, sizeof next, next2,
                                   sizeof next2, err, sizeof err);
    CHECK(r >= -1 && r <= 1);
    if (r == 0 && truncated) CHECK(next[0] != '\0');
    CHECK(strlen(next) < sizeof next && strlen(next2) < sizeof next2);

    char value[64];
    bool cut = false;
    const int f = ckptio__xml_find(xml, size, "InitiateMultipartUploadResult/UploadId", value, sizeof value, &cut);
    CHECK(f >= -1 && f <= 1 && strlen(value) < sizeof value);
    if (f != 0) CHECK(!cut && value[0] == '\0');

    char code[64], message[256];
    ckptio__xml_error(xml, size, code, sizeof code, message, sizeof message);
    CHECK(strlen(code) < sizeof code && strlen(message) < sizeof message);
    return 0;
}
