/*
 * value_walk.h - the tree check shared by the unpickler fuzz targets.
 *
 * An accepted stream must give a tree the public accessors walk completely:
 * containers report consistent lengths, nesting stays under the cap, string
 * nodes have bytes. The modes differ in what may appear: a torch.save pickle
 * (data.pkl) may hold tensors and devices but no objects; a DCP .metadata may
 * hold objects of allowlisted classes but never a tensor or device. A broken
 * invariant traps.
 */
#ifndef CKPTIO_FUZZ_VALUE_WALK_H
#define CKPTIO_FUZZ_VALUE_WALK_H

#include "fuzz_check.h"
#include "ckptio.h"
#include "pickle_internal.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Walks the tree; shared nodes are revisited, so the budget bounds the work. */
static void fuzz_walk_value(const ckptio_value *v, unsigned depth, uint64_t *budget, bool dcp) {
    CHECK(v != NULL && depth <= CKPTIO__VALUE_MAX_DEPTH + 1);
    if (*budget == 0) return;
    --*budget;
    if (dcp) CHECK(v->kind <= CKPTIO_VALUE_OBJECT); /* no global, class or storage escapes into the tree */
    else CHECK(v->kind <= CKPTIO_VALUE_DEVICE || depth > 0); /* internal kinds only inside tuples */
    size_t len = 0;
    switch (ckptio_value_kind_of(v)) {
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_TUPLE:
    case CKPTIO_VALUE_SET: {
        int is_size = 0;
        const bool tuple = ckptio_value_kind_of(v) == CKPTIO_VALUE_TUPLE;
        CHECK((ckptio_value_tuple_is_size(v, &is_size) == CKPTIO_OK) == tuple);
        CHECK(ckptio_value_len(v, &len) == CKPTIO_OK);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *item;
            CHECK(ckptio_value_item(v, i, &item) == CKPTIO_OK);
            CHECK(!is_size || ckptio_value_kind_of(item) == CKPTIO_VALUE_INT); /* a torch.Size holds ints */
            fuzz_walk_value(item, depth + 1, budget, dcp);
        }
        break;
    }
    case CKPTIO_VALUE_DICT: {
        CHECK(ckptio_value_len(v, &len) == CKPTIO_OK);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *key, *item;
            CHECK(ckptio_value_dict_item(v, i, &key, &item) == CKPTIO_OK);
            fuzz_walk_value(key, depth + 1, budget, dcp);
            fuzz_walk_value(item, depth + 1, budget, dcp);
        }
        const ckptio_value *attrs;
        CHECK(ckptio_value_dict_attrs(v, &attrs) == CKPTIO_OK);
        if (attrs) fuzz_walk_value(attrs, depth + 1, budget, dcp);
        break;
    }
    case CKPTIO_VALUE_OBJECT: {
        CHECK(dcp);
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
        fuzz_walk_value(args, depth + 1, budget, dcp);
        if (state) fuzz_walk_value(state, depth + 1, budget, dcp);
        break;
    }
    case CKPTIO_VALUE_TENSOR:
        CHECK(!dcp); /* the DCP mode has no tensor callables */
        CHECK(v->u.tensor.storage && v->u.tensor.storage->kind == CKPTIO__VALUE_STORAGE);
        CHECK(v->u.tensor.ndim <= 64);
        break;
    case CKPTIO_VALUE_DEVICE:
        CHECK(!dcp); /* a device is a string node: checked below */
        __attribute__((fallthrough));
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

#endif
