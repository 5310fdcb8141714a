/*
 * fuzz_dcp_metadata.c - libFuzzer target for the unpickler's DCP .metadata
 * mode (ckptio_pickle_parse_dcp_metadata): the input is a .metadata file.
 *
 * Beyond "no crash, no leak, no UB", an accepted stream must give a tree
 * the public accessors walk completely: only public kinds, never a tensor
 * or device (this mode has no tensor callables), OBJECT nodes with an
 * allowlisted class name and a tuple of arguments. A broken invariant traps.
 */
#include "ckptio.h"
#include "pickle_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                    \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

static void walk(const ckptio_value *v, unsigned depth, uint64_t *budget) {
    CHECK(v != NULL && depth <= CKPTIO__VALUE_MAX_DEPTH + 1);
    if (*budget == 0) return;
    --*budget;
    CHECK(v->kind <= CKPTIO_VALUE_OBJECT); /* no global, class or storage escapes into the tree */
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
    case CKPTIO_VALUE_OBJECT: {
        const char *cls = NULL;
        const ckptio_value *args = NULL, *state = NULL;
        CHECK(ckptio_value_object(v, &cls, &args, &state) == CKPTIO_OK);
        CHECK(cls != NULL && args != NULL && ckptio_value_kind_of(args) == CKPTIO_VALUE_TUPLE);
        const char *dot = strrchr(cls, '.');
        CHECK(dot != NULL);
        char module[128];
        CHECK((size_t)(dot - cls) < sizeof module);
        memcpy(module, cls, (size_t)(dot - cls));
        module[dot - cls] = '\0';
        CHECK(ckptio__dcp_class(module, dot + 1) == cls); /* canonical, allowlisted */
        walk(args, depth + 1, budget);
        if (state) walk(state, depth + 1, budget);
        break;
    }
    case CKPTIO_VALUE_TENSOR:
    case CKPTIO_VALUE_DEVICE: CHECK(0); break;
    case CKPTIO_VALUE_STR:
    case CKPTIO_VALUE_BYTES:
    case CKPTIO_VALUE_BIGINT:
    case CKPTIO_VALUE_DTYPE: {
        const char *s;
        CHECK(ckptio_value_bytes(v, &s, &len) == CKPTIO_OK && s != NULL);
        break;
    }
    default: break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio_pickle *p = NULL;
    if (ckptio_pickle_parse_dcp_metadata(data, size, "fuzz/.metadata", &p) == CKPTIO_OK) {
        const ckptio_value *root = NULL;
        CHECK(ckptio_pickle_root(p, &root) == CKPTIO_OK && root != NULL);
        uint64_t budget = 1u << 20;
        walk(root, 0, &budget);
    } else {
        CHECK(p == NULL && ckptio_last_error_message()[0] != '\0');
    }
    ckptio_pickle_close(p);
    return 0;
}
