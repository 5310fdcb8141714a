/*
 * fuzz_step_marker.c - libFuzzer target for the parser of a step's commit
 * marker (.ckptio-step, src/ckpt/steps_marker.c): the input is the file.
 *
 * Beyond "no crash, no leak, no UB": an accepted marker names a step no
 * larger than CKPTIO_STEP_MAX and formats back to exactly the input bytes
 * (the format is canonical: one spelling per marker). A broken invariant
 * traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "steps_internal.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__step_marker m;
    if (ckptio__step_marker_parse((const char *)data, size, "fuzz.marker", &m) != CKPTIO_OK) return 0;
    CHECK(m.step <= CKPTIO_STEP_MAX);
    char out[128];
    const size_t n = ckptio__step_marker_format(&m, out, sizeof out);
    CHECK(n == size && memcmp(out, data, n) == 0);
    return 0;
}
