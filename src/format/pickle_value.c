/*
 * pickle_value.c - the value tree of data.pkl: node allocation in a pool,
 * the no-cycle rule, and the public read accessors (ckptio_value_*).
 */
#include "pickle_internal.h"

#include <string.h>

static ckptio_status track(void ***arr, size_t *count, size_t *cap, void *p) {
    if (*count == *cap) {
        size_t ncap = *cap ? *cap * 2 : 64;
        void **grown = ckptio__realloc(*arr, ncap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the pickle value tree");
        *arr = grown;
        *cap = ncap;
    }
    (*arr)[(*count)++] = p;
    return CKPTIO_OK;
}

void ckptio__value_pool_free(ckptio__value_pool *pool) {
    if (!pool) return;
    for (size_t i = 0; i < pool->count; i++) {
        ckptio_value *v = pool->nodes[i];
        if (v->kind == CKPTIO_VALUE_LIST || v->kind == CKPTIO_VALUE_TUPLE || v->kind == CKPTIO_VALUE_SET ||
            v->kind == CKPTIO_VALUE_DICT)
            ckptio__free(v->u.seq.items);
        ckptio__free(v);
    }
    for (size_t i = 0; i < pool->nblobs; i++) ckptio__free(pool->blobs[i]);
    ckptio__free(pool->nodes);
    ckptio__free(pool->blobs);
    memset(pool, 0, sizeof *pool);
}

ckptio_value *ckptio__value_new(ckptio__value_pool *pool, int kind) {
    ckptio_value *v = ckptio__calloc(1, sizeof *v);
    if (!v) {
        CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the pickle value tree");
        return NULL;
    }
    if (track((void ***)&pool->nodes, &pool->count, &pool->cap, v) != CKPTIO_OK) {
        ckptio__free(v);
        return NULL;
    }
    v->kind = kind;
    return v;
}

void *ckptio__value_alloc(ckptio__value_pool *pool, size_t size) {
    void *p = ckptio__malloc(size ? size : 1);
    if (!p) {
        CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the pickle value tree (%zu bytes)", size);
        return NULL;
    }
    if (track(&pool->blobs, &pool->nblobs, &pool->blob_cap, p) != CKPTIO_OK) {
        ckptio__free(p);
        return NULL;
    }
    return p;
}

char *ckptio__value_strdup(ckptio__value_pool *pool, const void *data, size_t len) {
    if (len == SIZE_MAX) {
        CKPTIO_FAIL(CKPTIO_E_NOMEM, "string too long");
        return NULL;
    }
    char *s = ckptio__value_alloc(pool, len + 1);
    if (!s) return NULL;
    if (len) memcpy(s, data, len);
    s[len] = '\0';
    return s;
}

ckptio_status ckptio__value_push(ckptio_value *seq, ckptio_value *item) {
    if (seq->u.seq.len == seq->u.seq.cap) {
        size_t ncap = seq->u.seq.cap ? seq->u.seq.cap * 2 : 4;
        ckptio_value **grown = ckptio__realloc(seq->u.seq.items, ncap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the pickle value tree");
        seq->u.seq.items = grown;
        seq->u.seq.cap = ncap;
    }
    seq->u.seq.items[seq->u.seq.len++] = item;
    return CKPTIO_OK;
}

/* Containers are mutated only before they are put inside another container
 * (every pickler builds inner objects first). Freezing on adoption and
 * refusing to mutate frozen containers therefore costs legitimate pickles
 * nothing and makes cycles impossible: a frozen container's height is final,
 * so the parent's height is exact and bounds recursion in every walker. */
ckptio_status ckptio__value_adopt(ckptio_value *parent, ckptio_value *item) {
    /* Python builds recursive structures (torch loads them): refusing one is
     * a policy, so it is E_UNSUPPORTED, not a malformed stream. */
    if (parent->flags & CKPTIO__VFLAG_FROZEN)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED,
                           "container modified after it was stored inside another object "
                           "(a recursive structure; refused)");
    if (item == parent)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "container inserted into itself (recursive structure; refused)");
    item->flags |= CKPTIO__VFLAG_FROZEN;
    if (item->height + 1 > parent->height) parent->height = item->height + 1;
    if (parent->height > CKPTIO__VALUE_MAX_DEPTH)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "objects nested deeper than %u levels", CKPTIO__VALUE_MAX_DEPTH);
    return CKPTIO_OK;
}

/* The classes of numpy nodes (pickle_numpy.c builds them): compared by address. */
const char ckptio__numpy_dtype[] = "numpy.dtype";
const char ckptio__numpy_ndarray[] = "numpy.ndarray";
const char ckptio__numpy_generic[] = "numpy.generic";

bool ckptio__value_hashable(const ckptio_value *v) {
    switch (v->kind) {
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_DICT:
    case CKPTIO_VALUE_SET: return false;
    case CKPTIO_VALUE_TUPLE: return !(v->flags & CKPTIO__VFLAG_UNHASHABLE);
    case CKPTIO_VALUE_OBJECT: return v->u.obj.cls != ckptio__numpy_ndarray;
    default: return true;
    }
}

bool ckptio__pickle_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) k = 1, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0) k = 2, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0) k = 3, cp = c & 0x07;
        else return false;
        if (n - i <= k) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += k + 1;
    }
    return true;
}

/* ---- public accessors -------------------------------------------------------- */

const char *ckptio__value_kind_name(int kind) {
    static const char *const names[] = {"None", "bool", "int", "bigint", "float", "str", "bytes",
                                        "list", "tuple", "dict", "set", "tensor", "dtype", "device", "object"};
    if (kind >= 0 && kind <= CKPTIO_VALUE_OBJECT) return names[kind];
    return "internal";
}

static ckptio_status want(const ckptio_value *v, int kind) {
    if (!v) return CKPTIO_FAIL(CKPTIO_E_INVAL, "value must not be NULL");
    if (v->kind != kind)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "value is a %s, not a %s", ckptio__value_kind_name(v->kind),
                           ckptio__value_kind_name(kind));
    return CKPTIO_OK;
}

ckptio_value_kind ckptio_value_kind_of(const ckptio_value *value) {
    if (!value || value->kind > CKPTIO_VALUE_OBJECT) return CKPTIO_VALUE_NONE;
    return (ckptio_value_kind)value->kind;
}

ckptio_status ckptio_value_bool(const ckptio_value *value, int *out) {
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_BOOL));
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = value->u.b;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_int(const ckptio_value *value, int64_t *out) {
    if (value && value->kind == CKPTIO_VALUE_BIGINT)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "integer of %zu bytes does not fit int64; use ckptio_value_bytes",
                           value->u.s.len);
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_INT));
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = value->u.i;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_float(const ckptio_value *value, double *out) {
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_FLOAT));
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = value->u.f;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_bytes(const ckptio_value *value, const char **data, size_t *len) {
    if (!value || !data || !len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "value and outputs must not be NULL");
    switch (value->kind) {
    case CKPTIO_VALUE_STR:
    case CKPTIO_VALUE_BYTES:
    case CKPTIO_VALUE_BIGINT:
    case CKPTIO_VALUE_DEVICE:
        *data = value->u.s.data;
        *len = value->u.s.len;
        return CKPTIO_OK;
    case CKPTIO_VALUE_DTYPE:
        *data = ckptio_dtype_torch_name(value->u.dtype);
        *len = strlen(*data);
        return CKPTIO_OK;
    default:
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "value is a %s, which has no bytes", ckptio__value_kind_name(value->kind));
    }
}

static bool is_seq(const ckptio_value *v) {
    return v && (v->kind == CKPTIO_VALUE_LIST || v->kind == CKPTIO_VALUE_TUPLE || v->kind == CKPTIO_VALUE_SET);
}

ckptio_status ckptio_value_len(const ckptio_value *value, size_t *out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    if (is_seq(value)) {
        *out = value->u.seq.len;
        return CKPTIO_OK;
    }
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_DICT));
    *out = value->u.seq.len / 2;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_item(const ckptio_value *value, size_t index, const ckptio_value **out) {
    if (!is_seq(value))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "value is a %s, not a list, tuple or set",
                           value ? ckptio__value_kind_name(value->kind) : "NULL");
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    if (index >= value->u.seq.len)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "index %zu out of range (%zu items)", index, value->u.seq.len);
    *out = value->u.seq.items[index];
    return CKPTIO_OK;
}

ckptio_status ckptio_value_dict_item(const ckptio_value *value, size_t index, const ckptio_value **key,
                                     const ckptio_value **item) {
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_DICT));
    if (!key || !item) return CKPTIO_FAIL(CKPTIO_E_INVAL, "outputs must not be NULL");
    if (index >= value->u.seq.len / 2)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "index %zu out of range (%zu items)", index, value->u.seq.len / 2);
    *key = value->u.seq.items[2 * index];
    *item = value->u.seq.items[2 * index + 1];
    return CKPTIO_OK;
}

ckptio_status ckptio_value_dict_ordered(const ckptio_value *value, int *out) {
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_DICT));
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = (value->flags & CKPTIO__VFLAG_ORDERED) != 0;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_tuple_is_size(const ckptio_value *value, int *out) {
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_TUPLE));
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = (value->flags & CKPTIO__VFLAG_TORCH_SIZE) != 0;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_dict_attrs(const ckptio_value *value, const ckptio_value **out) {
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_DICT));
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = value->attrs;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_dtype(const ckptio_value *value, ckptio_dtype *out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    if (value && value->kind == CKPTIO_VALUE_TENSOR) {
        *out = value->u.tensor.dtype;
        return CKPTIO_OK;
    }
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_DTYPE));
    *out = value->u.dtype;
    return CKPTIO_OK;
}

ckptio_status ckptio_value_tensor(const ckptio_value *value, size_t *index) {
    CKPTIO_FORWARD(want(value, CKPTIO_VALUE_TENSOR));
    if (!index) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    if (value->u.tensor.index == SIZE_MAX)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "tensor node belongs to a writer, not a reader");
    *index = value->u.tensor.index;
    return CKPTIO_OK;
}
