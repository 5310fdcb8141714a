/*
 * fuzz_dcp_manifest.c - libFuzzer target for the parser of the ckptio DCP
 * manifest (.ckptio-manifest-<token>.json, src/ckpt/dcp_manifest_verify.c):
 * the input is the manifest's text.
 *
 * Beyond "no crash, no leak, no UB": every accepted manifest must satisfy
 * what the verifier relies on before it touches a file: file names are
 * plain names (no '/', not "." or ".."), each item's file is listed in
 * "files", data_offset + nbytes does not overflow, and "parts" tile
 * [0, nbytes) in order. A broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "dcp_dir_internal.h"

#include <stdint.h>
#include <string.h>

static void check_name(const char *s) {
    CHECK(s && *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__dcp_manifest m;
    if (ckptio__dcp_manifest_parse((const char *)data, size, "fuzz.json", &m) != CKPTIO_OK) {
        CHECK(m.items == NULL && m.files == NULL && m.count == 0);
        return 0;
    }
    for (size_t f = 0; f < m.nfiles; f++) check_name(m.files[f]);
    for (size_t i = 0; i < m.count; i++) {
        const ckptio__dcp_mitem *it = &m.items[i];
        check_name(it->file);
        CHECK(it->fqn != NULL);
        size_t f = 0;
        while (f < m.nfiles && strcmp(m.files[f], it->file) != 0) f++;
        CHECK(f < m.nfiles);
        CHECK(it->data_offset + it->nbytes >= it->data_offset && it->data_offset + it->nbytes <= INT64_MAX);
        CHECK(!it->has_offset || it->ndim <= 64);
        uint64_t pos = 0;
        for (size_t p = 0; p < it->nparts; p++) {
            CHECK(it->parts[p].offset == pos);
            pos += it->parts[p].length;
            CHECK(pos <= it->nbytes);
        }
        CHECK(it->nparts == 0 || pos == it->nbytes);
    }
    ckptio__dcp_manifest_free(&m);
    return 0;
}
