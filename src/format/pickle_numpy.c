/*
 * pickle_numpy.c - numpy values in a state-dict pickle, rebuilt as data.
 *
 * Training loops save numpy's RNG state (np.random.get_state(): a tuple
 * holding a uint32 array), numpy scalars and small arrays. numpy pickles
 * them as calls: an array is REDUCE(_reconstruct, (ndarray, (0,), b'b'))
 * then BUILD((1, shape, dtype, is_fortran, raw bytes)); a dtype is
 * REDUCE(numpy.dtype, ('f8', False, True)) then BUILD((3, '<', None, None,
 * None, -1, -1, 0)); a scalar is REDUCE(scalar, (dtype, raw bytes)). Those
 * callables are never run: each call is checked against exactly that form
 * and becomes a node holding the dtype's text, the shape and the bytes
 * (pickle_internal.h), which the reader turns into np.frombuffer copies.
 * Only bool, int, uint, float and complex dtypes are accepted: object
 * arrays would need numpy to unpickle their items, strings, datetimes and
 * structured dtypes carry more state than a training loop saves.
 *
 * Statuses: a form numpy itself would refuse (bytes that do not match the
 * shape, a state of the wrong type) is E_FORMAT; a form numpy would load
 * but ckptio does not (another dtype, another state version) E_UNSUPPORTED.
 */
#include "pickle_internal.h"

#include <string.h>

#define NUMPY_MAX_NDIM 64 /* NPY_MAXDIMS of numpy 2 (numpy 1: 32) */

/* The element types numpy pickles as "<kind><size>" (np.dtype(x).str without the byte order). */
static const char *const plain_descrs[] = {"b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4",
                                           "u8", "f2", "f4", "f8", "c8", "c16"};

bool ckptio__numpy_node(const ckptio_value *v) {
    return v->kind == CKPTIO__VALUE_NUMPY_PENDING ||
           (v->kind == CKPTIO_VALUE_OBJECT &&
            (v->u.obj.cls == ckptio__numpy_dtype || v->u.obj.cls == ckptio__numpy_ndarray ||
             v->u.obj.cls == ckptio__numpy_generic));
}

static ckptio_value *item(const ckptio_value *tuple, size_t i) { return tuple->u.seq.items[i]; }

static bool is_tuple(const ckptio_value *v, size_t n) { return v->kind == CKPTIO_VALUE_TUPLE && v->u.seq.len == n; }

static bool is_str(const ckptio_value *v, const char *s) {
    return v->kind == CKPTIO_VALUE_STR && v->u.s.len == strlen(s) && memcmp(v->u.s.data, s, v->u.s.len) == 0;
}

static bool is_int(const ckptio_value *v, int64_t x) { return v->kind == CKPTIO_VALUE_INT && v->u.i == x; }

/* A new tuple node adopting items[0..n). */
static ckptio_status tuple_of(ckptio__value_pool *pool, ckptio_value *const *items, size_t n, ckptio_value **out) {
    ckptio_value *t = ckptio__value_new(pool, CKPTIO_VALUE_TUPLE);
    if (!t) return CKPTIO_E_NOMEM;
    for (size_t i = 0; i < n; i++) {
        CKPTIO_FORWARD(ckptio__value_adopt(t, items[i]));
        CKPTIO_FORWARD(ckptio__value_push(t, items[i]));
    }
    *out = t;
    return CKPTIO_OK;
}

/* A new node of `kind` (OBJECT or NUMPY_PENDING) of class `cls` holding `args` (may be NULL). */
static ckptio_status object_node(ckptio__value_pool *pool, int kind, const char *cls, ckptio_value *args,
                                 ckptio_value **out) {
    ckptio_value *v = ckptio__value_new(pool, kind);
    if (!v) return CKPTIO_E_NOMEM;
    if (args) CKPTIO_FORWARD(ckptio__value_adopt(v, args));
    v->u.obj.cls = cls;
    v->u.obj.args = args;
    *out = v;
    return CKPTIO_OK;
}

/* Bytes per element of a finished dtype node ("<f8" -> 8). */
static uint64_t itemsize(const ckptio_value *dtype) {
    const ckptio_value *descr = item(dtype->u.obj.args, 0);
    uint64_t n = 0;
    for (size_t i = 2; i < descr->u.s.len; i++) n = n * 10 + (uint64_t)(descr->u.s.data[i] - '0');
    return n;
}

static bool finished_dtype(const ckptio_value *v) {
    return v->kind == CKPTIO_VALUE_OBJECT && v->u.obj.cls == ckptio__numpy_dtype;
}

/* numpy.dtype(descr, align, copy): descr one of plain_descrs, align and copy bools. */
static ckptio_status reduce_dtype(ckptio__value_pool *pool, ckptio_value *args, ckptio_value **out) {
    if (!is_tuple(args, 3) || item(args, 0)->kind != CKPTIO_VALUE_STR || item(args, 1)->kind != CKPTIO_VALUE_BOOL ||
        item(args, 2)->kind != CKPTIO_VALUE_BOOL)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy.dtype called with arguments other than (str, align, copy), "
                           "as numpy pickles a dtype");
    const ckptio_value *descr = item(args, 0);
    bool plain = false;
    for (size_t i = 0; i < sizeof plain_descrs / sizeof plain_descrs[0] && !plain; i++)
        plain = is_str(descr, plain_descrs[i]);
    if (!plain)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy dtype '%.32s': only bool, int, uint, float and complex "
                           "numpy values load (store other arrays as tensors, lists or str)", descr->u.s.data);
    return object_node(pool, CKPTIO__VALUE_NUMPY_PENDING, ckptio__numpy_dtype, args, out);
}

/* BUILD of a pending dtype: (3, byteorder, None, None, None, -1, -1, 0). */
static ckptio_status build_dtype(ckptio__value_pool *pool, ckptio_value *d, const ckptio_value *state) {
    if (!is_tuple(state, 8) || item(state, 0)->kind != CKPTIO_VALUE_INT)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy dtype state is not the 8-tuple numpy writes");
    if (!is_int(item(state, 0), 3))
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy dtype state version %lld (ckptio reads version 3, that of "
                           "plain dtypes)", (long long)item(state, 0)->u.i);
    for (size_t i = 2; i <= 4; i++)
        if (item(state, i)->kind != CKPTIO_VALUE_NONE)
            return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy dtype with a subarray or fields (a structured dtype)");
    if (!is_int(item(state, 5), -1) || !is_int(item(state, 6), -1) || !is_int(item(state, 7), 0))
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy dtype state with a size, alignment or flags of its own "
                           "(not a plain dtype)");
    const ckptio_value *type = item(d->u.obj.args, 0);
    const bool one_byte = type->u.s.len == 2 && type->u.s.data[1] == '1';
    const ckptio_value *order = item(state, 1);
    const bool little = is_str(order, "<"), big = is_str(order, ">"), none = is_str(order, "|");
    if (!(little || big || none) || (none && !one_byte))
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy dtype '%s' with byte order '%.8s' (numpy writes '<' or '>', "
                           "'|' for one-byte types)", type->u.s.data,
                           order->kind == CKPTIO_VALUE_STR ? order->u.s.data : "?");
    char text[8];
    text[0] = one_byte ? '|' : little ? '<' : '>';
    memcpy(text + 1, type->u.s.data, type->u.s.len + 1); /* at most "c16" */
    ckptio_value *descr = ckptio__value_new(pool, CKPTIO_VALUE_STR);
    if (!descr || !(descr->u.s.data = ckptio__value_strdup(pool, text, strlen(text)))) return CKPTIO_E_NOMEM;
    descr->u.s.len = strlen(text);
    ckptio_value *args = NULL;
    CKPTIO_FORWARD(tuple_of(pool, &descr, 1, &args));
    CKPTIO_FORWARD(ckptio__value_adopt(d, args));
    d->kind = CKPTIO_VALUE_OBJECT;
    d->u.obj.args = args;
    return CKPTIO_OK;
}

/* _reconstruct(ndarray, (0,), b'b'): what ndarray.__reduce__ writes; its BUILD sets the real state. */
static ckptio_status reduce_array(ckptio__value_pool *pool, ckptio_value *args, ckptio_value **out) {
    if (!is_tuple(args, 3) || item(args, 0)->kind != CKPTIO__VALUE_GLOBAL ||
        item(args, 0)->u.global != CKPTIO__G_NP_NDARRAY)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy _reconstruct of a class other than numpy.ndarray (a "
                           "subclass such as a masked array or matrix is not loaded)");
    const ckptio_value *shape = item(args, 1), *code = item(args, 2);
    if (!is_tuple(shape, 1) || !is_int(item(shape, 0), 0) ||
        !((code->kind == CKPTIO_VALUE_BYTES || code->kind == CKPTIO_VALUE_STR) && code->u.s.len == 1 &&
          code->u.s.data[0] == 'b'))
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy _reconstruct with arguments other than (ndarray, (0,), b'b'), "
                           "as numpy pickles an array");
    return object_node(pool, CKPTIO__VALUE_NUMPY_PENDING, ckptio__numpy_ndarray, NULL, out);
}

/* The number of elements of a shape tuple of non-negative ints, or false on overflow or a bad item. */
static bool shape_elements(const ckptio_value *shape, uint64_t *count) {
    uint64_t n = 1;
    bool overflow = false;
    for (size_t i = 0; i < shape->u.seq.len; i++) {
        const ckptio_value *d = item(shape, i);
        if (d->kind != CKPTIO_VALUE_INT || d->u.i < 0) return false;
        overflow |= ckptio__mul_overflows(n, (uint64_t)d->u.i, &n);
    }
    *count = n;
    return !overflow;
}

/* BUILD of a pending array: (1, shape, dtype, is_fortran, raw bytes). */
static ckptio_status build_array(ckptio__value_pool *pool, ckptio_value *a, const ckptio_value *state) {
    if (!is_tuple(state, 5) || item(state, 0)->kind != CKPTIO_VALUE_INT)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy array state is not the 5-tuple (1, shape, dtype, is_fortran, "
                           "data) numpy writes");
    if (!is_int(item(state, 0), 1))
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy array state version %lld (ckptio reads version 1)",
                           (long long)item(state, 0)->u.i);
    ckptio_value *shape = item(state, 1), *dtype = item(state, 2), *fortran = item(state, 3), *data = item(state, 4);
    if (shape->kind != CKPTIO_VALUE_TUPLE || fortran->kind != CKPTIO_VALUE_BOOL)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy array state: the shape is not a tuple or is_fortran not a bool");
    if (!finished_dtype(dtype))
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy array state: the dtype is not a numpy dtype");
    if (data->kind != CKPTIO_VALUE_BYTES)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy array whose data is not bytes (an object array, whose "
                           "items numpy would unpickle one by one)");
    if (shape->u.seq.len > NUMPY_MAX_NDIM)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy array with %zu dimensions (numpy allows %d)", shape->u.seq.len,
                           NUMPY_MAX_NDIM);
    uint64_t count = 0, nbytes = 0;
    if (!shape_elements(shape, &count) || ckptio__mul_overflows(count, itemsize(dtype), &nbytes) ||
        nbytes != data->u.s.len)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy array of %s: its shape is not non-negative ints whose product "
                           "times the element size is the %zu bytes of data", item(dtype->u.obj.args, 0)->u.s.data,
                           data->u.s.len);
    ckptio_value *parts[] = {dtype, shape, fortran, data}, *args = NULL;
    CKPTIO_FORWARD(tuple_of(pool, parts, 4, &args));
    CKPTIO_FORWARD(ckptio__value_adopt(a, args));
    a->kind = CKPTIO_VALUE_OBJECT;
    a->u.obj.args = args;
    return CKPTIO_OK;
}

/* scalar(dtype, raw bytes of one element). */
static ckptio_status reduce_scalar(ckptio__value_pool *pool, ckptio_value *args, ckptio_value **out) {
    if (!is_tuple(args, 2) || !finished_dtype(item(args, 0)))
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "numpy scalar with arguments other than (dtype, data), as numpy "
                           "pickles a scalar");
    const ckptio_value *data = item(args, 1);
    if (data->kind != CKPTIO_VALUE_BYTES || data->u.s.len != itemsize(item(args, 0)))
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "numpy scalar of %s: its data is not %llu bytes",
                           item(item(args, 0)->u.obj.args, 0)->u.s.data, (unsigned long long)itemsize(item(args, 0)));
    return object_node(pool, CKPTIO_VALUE_OBJECT, ckptio__numpy_generic, args, out);
}

ckptio_status ckptio__numpy_reduce(ckptio__value_pool *pool, ckptio__global fn, ckptio_value *args,
                                   ckptio_value **out) {
    if (args->kind != CKPTIO_VALUE_TUPLE) return CKPTIO_FAIL(CKPTIO_E_FORMAT, "REDUCE arguments are not a tuple");
    switch (fn) {
    case CKPTIO__G_NP_DTYPE: return reduce_dtype(pool, args, out);
    case CKPTIO__G_NP_RECONSTRUCT: return reduce_array(pool, args, out);
    case CKPTIO__G_NP_SCALAR: return reduce_scalar(pool, args, out);
    default:
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "calling numpy.ndarray directly is not how numpy pickles an array");
    }
}

ckptio_status ckptio__numpy_build(ckptio__value_pool *pool, ckptio_value *target, ckptio_value *state) {
    if (target->kind != CKPTIO__VALUE_NUMPY_PENDING)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "BUILD of a %s that already has its state", target->u.obj.cls);
    if (target->flags & CKPTIO__VFLAG_FROZEN)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "BUILD of a %s already stored elsewhere", target->u.obj.cls);
    return target->u.obj.cls == ckptio__numpy_dtype ? build_dtype(pool, target, state)
                                                    : build_array(pool, target, state);
}
