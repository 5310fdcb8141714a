/*
 * fuzz_unpickle.c - libFuzzer target for the restricted unpickler: the
 * input is a pickle stream (data.pkl).
 *
 * Beyond "no crash, no leak, no UB", an accepted stream must give a tree
 * that the public accessors can walk completely: every node has a public
 * kind, containers report consistent lengths, nesting stays under the cap.
 * A broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "pickle_internal.h"
#include "value_walk.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__value_pool pool = {0};
    ckptio_value *root = NULL;
    if (ckptio__unpickle(data, size, "fuzz", "fuzz/data.pkl", 0, &pool, &root) == CKPTIO_OK) {
        CHECK(root != NULL && root->kind <= CKPTIO_VALUE_DEVICE);
        uint64_t budget = 1u << 20;
        fuzz_walk_value(root, 0, &budget, false);
    } else {
        CHECK(ckptio_last_error_message()[0] != '\0');
    }
    ckptio__value_pool_free(&pool);
    return 0;
}
