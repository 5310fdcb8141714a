/*
 * fuzz_unpickle.c - libFuzzer target for the restricted unpickler: the
 * input is a pickle stream (data.pkl).
 *
 * Beyond "no crash, no leak, no UB", an accepted stream must give a tree
 * that the public accessors can walk completely: every node has a public
 * kind, containers report consistent lengths, nesting stays under the cap.
 * A broken invariant traps.
 */
#include "ckptio.h"
#include "pickle_internal.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                    \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

/* Walks the tree; shared nodes are revisited, so the budget bounds the work. */
static void walk(const ckptio_value *v, unsigned depth, uint64_t *budget) {
    CHECK(depth <= CKPTIO__VALUE_MAX_DEPTH + 1);
    if (*budget == 0) return;
    --*budget;
    CHECK(v->kind <= CKPTIO_VALUE_DEVICE || depth > 0); /* internal kinds only inside tuples */
    size_t len = 0;
    switch (ckptio_value_kind_of(v)) {
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_TUPLE:
    case CKPTIO_VALUE_SET:
        CHECK(ckptio_value_len(v, &len) == CKPTIO_OK);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *item;
            CHECK(ckptio_value_item(v, i, &item) == CKPTIO_OK);
            walk(item, depth + 1, budget);
        }
        break;
    case CKPTIO_VALUE_DICT: {
        CHECK(ckptio_value_len(v, &len) == CKPTIO_OK);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *key, *item;
            CHECK(ckptio_value_dict_item(v, i, &key, &item) == CKPTIO_OK);
            walk(key, depth + 1, budget);
            walk(item, depth + 1, budget);
        }
        const ckptio_value *attrs;
        CHECK(ckptio_value_dict_attrs(v, &attrs) == CKPTIO_OK);
        if (attrs) walk(attrs, depth + 1, budget);
        break;
    }
    case CKPTIO_VALUE_STR:
    case CKPTIO_VALUE_BYTES:
    case CKPTIO_VALUE_BIGINT:
    case CKPTIO_VALUE_DEVICE:
    case CKPTIO_VALUE_DTYPE: {
        const char *s;
        CHECK(ckptio_value_bytes(v, &s, &len) == CKPTIO_OK && s != NULL);
        break;
    }
    case CKPTIO_VALUE_TENSOR:
        CHECK(v->u.tensor.storage && v->u.tensor.storage->kind == CKPTIO__VALUE_STORAGE);
        CHECK(v->u.tensor.ndim <= 64);
        break;
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__value_pool pool = {0};
    ckptio_value *root = NULL;
    if (ckptio__unpickle(data, size, "fuzz", "fuzz/data.pkl", 0, &pool, &root) == CKPTIO_OK) {
        CHECK(root != NULL && root->kind <= CKPTIO_VALUE_DEVICE);
        uint64_t budget = 1u << 20;
        walk(root, 0, &budget);
    } else {
        CHECK(ckptio_last_error_message()[0] != '\0');
    }
    ckptio__value_pool_free(&pool);
    return 0;
}
