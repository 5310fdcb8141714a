/*
 * fuzz_lease.c - libFuzzer target for the parser of a directory's lease in
 * object storage (.ckptio-dcp.lock there, src/ckpt/dcp_lease.c): the input
 * is the object's bytes, which another writer (or anyone with access to
 * the bucket) may have written.
 *
 * Beyond "no crash, no leak, no UB": an accepted lease has a 32-hex-digit
 * owner and formats back to exactly the input bytes (one spelling per
 * lease). A broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "dcp_commit_internal.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__lease_text l;
    if (ckptio__lease_parse((const char *)data, size, "fuzz.lease", &l) != CKPTIO_OK) return 0;
    CHECK(strlen(l.owner) == 32);
    char out[256];
    const size_t n = ckptio__lease_format(&l, out, sizeof out);
    CHECK(n == size && memcmp(out, data, n) == 0);
    return 0;
}
