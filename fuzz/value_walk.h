/*
 * value_walk.h - the tree check shared by the unpickler fuzz targets.
 *
 * An accepted stream must give a tree the public accessors walk completely:
 * containers report consistent lengths, nesting stays under the cap, string
 * nodes have bytes. The modes differ in what may appear: a torch.save pickle
 * (data.pkl) may hold tensors, devices and numpy values (objects whose bytes
 * match their dtype and shape) but no other objects; a DCP .metadata may
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

/* A numpy node (pickle_numpy.c): a dtype's text is one of the plain ones with
 * its byte order; an array's or scalar's bytes are exactly its elements. */
static uint64_t fuzz_numpy_itemsize(const ckptio_value *dtype) {
    const char *cls = NULL, *s = NULL;
    const ckptio_value *args = NULL, *descr = NULL;
    size_t n = 0;
    CHECK(ckptio_value_object(dtype, &cls, &args, NULL) == CKPTIO_OK && cls == ckptio__numpy_dtype);
    CHECK(ckptio_value_len(args, &n) == CKPTIO_OK && n == 1 && ckptio_value_item(args, 0, &descr) == CKPTIO_OK);
    CHECK(ckptio_value_bytes(descr, &s, &n) == CKPTIO_OK && n >= 3 && n <= 4);
    CHECK(s[0] == '<' || s[0] == '>' || s[0] == '|');
    CHECK(strchr("biufc", s[1]) != NULL);
    uint64_t size = 0;
    for (size_t i = 2; i < n; i++) {
        CHECK(s[i] >= '0' && s[i] <= '9');
        size = size * 10 + (uint64_t)(s[i] - '0');
    }
    CHECK(size >= 1 && size <= 16 && (s[0] == '|') == (size == 1));
    return size;
}

static void fuzz_walk_numpy(const ckptio_value *v, const char *cls, const ckptio_value *args) {
    const ckptio_value *items[4] = {0};
    size_t n = 0, len = 0;
    const char *data = NULL;
    CHECK(ckptio_value_len(args, &n) == CKPTIO_OK && n <= 4);
    for (size_t i = 0; i < n; i++) CHECK(ckptio_value_item(args, i, &items[i]) == CKPTIO_OK);
    if (cls == ckptio__numpy_dtype) {
        fuzz_numpy_itemsize(v);
    } else if (cls == ckptio__numpy_generic) {
        CHECK(n == 2 && ckptio_value_bytes(items[1], &data, &len) == CKPTIO_OK);
        CHECK(len == fuzz_numpy_itemsize(items[0]));
    } else {
        CHECK(cls == ckptio__numpy_ndarray && n == 4);
        uint64_t count = 1;
        size_t ndim = 0;
        CHECK(ckptio_value_len(items[1], &ndim) == CKPTIO_OK && ndim <= 64);
        for (size_t i = 0; i < ndim; i++) {
            const ckptio_value *d = NULL;
            int64_t x = -1;
            CHECK(ckptio_value_item(items[1], i, &d) == CKPTIO_OK && ckptio_value_int(d, &x) == CKPTIO_OK && x >= 0);
            CHECK(!ckptio__mul_overflows(count, (uint64_t)x, &count));
        }
        int fortran = 0;
        CHECK(ckptio_value_bool(items[2], &fortran) == CKPTIO_OK);
        CHECK(ckptio_value_kind_of(items[3]) == CKPTIO_VALUE_BYTES);
        CHECK(ckptio_value_bytes(items[3], &data, &len) == CKPTIO_OK);
        CHECK(len == count * fuzz_numpy_itemsize(items[0]));
    }
}

/* Walks the tree; shared nodes are revisited, so the budget bounds the work. */
static void fuzz_walk_value(const ckptio_value *v, unsigned depth, uint64_t *budget, bool dcp) {
    CHECK(v != NULL && depth <= CKPTIO__VALUE_MAX_DEPTH + 1);
    if (*budget == 0) return;
    --*budget;
    if (dcp) CHECK(v->kind <= CKPTIO_VALUE_OBJECT); /* no global, class or storage escapes into the tree */
    else CHECK(v->kind <= CKPTIO_VALUE_OBJECT || depth > 0); /* internal kinds only inside tuples; objects: numpy */
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
            CHECK(ckptio_value_kind_of(v) != CKPTIO_VALUE_SET || ckptio__value_hashable(item));
            fuzz_walk_value(item, depth + 1, budget, dcp);
        }
        break;
    }
    case CKPTIO_VALUE_DICT: {
        CHECK(ckptio_value_len(v, &len) == CKPTIO_OK);
        for (size_t i = 0; i < len; i++) {
            const ckptio_value *key, *item;
            CHECK(ckptio_value_dict_item(v, i, &key, &item) == CKPTIO_OK);
            CHECK(ckptio__value_hashable(key)); /* what Python could not build is refused */
            fuzz_walk_value(key, depth + 1, budget, dcp);
            fuzz_walk_value(item, depth + 1, budget, dcp);
        }
        const ckptio_value *attrs;
        CHECK(ckptio_value_dict_attrs(v, &attrs) == CKPTIO_OK);
        if (attrs) fuzz_walk_value(attrs, depth + 1, budget, dcp);
        break;
    }
    case CKPTIO_VALUE_OBJECT: {
        const char *cls = NULL;
        const ckptio_value *args = NULL, *state = NULL;
        CHECK(ckptio_value_object(v, &cls, &args, &state) == CKPTIO_OK);
        CHECK(cls != NULL && args != NULL && ckptio_value_kind_of(args) == CKPTIO_VALUE_TUPLE);
        if (!dcp) { /* a torch.save pickle holds objects only as numpy values, checked as data */
            fuzz_walk_numpy(v, cls, args);
            break;
        }
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
