/*
 * fuzz_unpickle.c - libFuzzer target for the restricted unpickler: the
 * input is a pickle stream (data.pkl).
 *
 * Beyond "no crash, no leak, no UB", an accepted stream must give a tree
 * that the public accessors can walk completely: every node has a public
 * kind, containers report consistent lengths, nesting stays under the cap.
 * A broken invariant traps. Accepted trees then go through the tensor naming
 * walk of the reader (linear in the graph however its nodes are shared).
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "pickle_internal.h"
#include "torch_internal.h"
#include "value_walk.h"

#include <stdint.h>
#include <stdlib.h>

static ckptio_status count_tensor(void *ctx, const char *spelled, const char *name, ckptio_value *tensor) {
    (void)spelled, (void)name;
    CHECK(tensor->kind == CKPTIO_VALUE_TENSOR);
    ++*(uint64_t *)ctx;
    return CKPTIO_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__value_pool pool = {0};
    ckptio_value *root = NULL;
    if (ckptio__unpickle(data, size, "fuzz", "fuzz/data.pkl", 0, &pool, &root) == CKPTIO_OK) {
        CHECK(root != NULL && (root->kind <= CKPTIO_VALUE_DEVICE || ckptio__numpy_node(root)));
        uint64_t budget = 1u << 20;
        fuzz_walk_value(root, 0, &budget, false);
        /* The reader's next step: naming tensors, each shared container once (linear in the graph). */
        uint64_t tensors = 0;
        if (ckptio__torch_walk_names(root, "fuzz", "fuzz", count_tensor, &tensors) == CKPTIO_OK)
            CHECK(tensors <= CKPTIO__TORCH_MAX_PATHS);
        else
            CHECK(ckptio_last_error_message()[0] != '\0');
    } else {
        CHECK(ckptio_last_error_message()[0] != '\0');
    }
    ckptio__value_pool_free(&pool);
    return 0;
}
