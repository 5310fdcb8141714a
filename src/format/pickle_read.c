/*
 * pickle_read.c - the restricted unpickler for data.pkl.
 *
 * A small stack machine over the opcodes torch.save and Python's pickler
 * emit for state dicts (protocols 2-5). Nothing is ever imported or called:
 * GLOBAL resolves only names from a fixed allowlist (no wider than
 * torch/_weights_only_unpickler.py) to tags, and REDUCE of a tag builds a
 * value node. Every length is checked against the bytes left, memo indices
 * are bounded by the stream length, containers cannot form cycles
 * (ckptio__value_adopt) and nesting is capped.
 */
#include "torch_internal.h"

#include <stdio.h>
#include <string.h>

#define MAX_NDIM 64

typedef struct vm {
    const uint8_t *data;
    size_t len, pos, op_pos;
    const char *origin, *record;
    uint64_t base;
    ckptio__value_pool *pool;
    ckptio_value **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, mark_cap;
    ckptio_value **memo;
    size_t memo_cap, memo_count;
    int mode;                   /* CKPTIO__UNPICKLE_* */
} vm;

static ckptio_status vfail_at(vm *m, ckptio_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ckptio_status vfail_at(vm *m, ckptio_status st, const char *fmt, ...) {
    ckptio__err_ctx ctx = {.operation = "unpickle", .path = m->origin, .subject = m->record,
                           .file_offset = (int64_t)(m->base + m->op_pos)};
    va_list ap;
    va_start(ap, fmt);
    ckptio__vfail(st, __FILE__, __LINE__, &ctx, fmt, ap);
    va_end(ap);
    return st;
}

/* Re-raises an error from a helper (no context) with this opcode's position. */
static ckptio_status refail(vm *m, ckptio_status st) { return vfail_at(m, st, "%s", ckptio_last_error_message()); }

static ckptio_status need(vm *m, size_t n) {
    if (m->len - m->pos < n)
        return vfail_at(m, CKPTIO_E_TRUNCATED, "pickle stream ends inside an opcode (%zu bytes needed, %zu left)", n,
                        m->len - m->pos);
    return CKPTIO_OK;
}

static ckptio_status push(vm *m, ckptio_value *v) {
    if (!v) return refail(m, CKPTIO_E_NOMEM);
    if (m->sp == m->stack_cap) {
        size_t ncap = m->stack_cap ? m->stack_cap * 2 : 64;
        ckptio_value **grown = ckptio__realloc(m->stack, ncap * sizeof *grown);
        if (!grown) return vfail_at(m, CKPTIO_E_NOMEM, "no memory for the unpickler stack");
        m->stack = grown;
        m->stack_cap = ncap;
    }
    m->stack[m->sp++] = v;
    return CKPTIO_OK;
}

static size_t floor_sp(const vm *m) { return m->nmarks ? m->marks[m->nmarks - 1] : 0; }

static ckptio_status pop(vm *m, ckptio_value **out) {
    if (m->sp <= floor_sp(m)) return vfail_at(m, CKPTIO_E_FORMAT, "stack underflow (opcode needs a value)");
    *out = m->stack[--m->sp];
    return CKPTIO_OK;
}

static ckptio_status top(vm *m, ckptio_value **out) {
    if (m->sp <= floor_sp(m)) return vfail_at(m, CKPTIO_E_FORMAT, "stack underflow (opcode needs a value)");
    *out = m->stack[m->sp - 1];
    return CKPTIO_OK;
}

/* Pops to the last MARK: items are stack[*start .. sp). */
static ckptio_status pop_mark(vm *m, size_t *start) {
    if (!m->nmarks) return vfail_at(m, CKPTIO_E_FORMAT, "opcode needs a MARK but none is open");
    *start = m->marks[--m->nmarks];
    return CKPTIO_OK;
}

static ckptio_value *new_node(vm *m, int kind) { return ckptio__value_new(m->pool, kind); }

static ckptio_status adopt(vm *m, ckptio_value *parent, ckptio_value *item) {
    if (item->kind == CKPTIO__VALUE_NUMPY_PENDING)
        return vfail_at(m, CKPTIO_E_FORMAT, "a %s is used before BUILD gave it its state", item->u.obj.cls);
    /* What Python could not build: an unhashable dict key or set item (the
     * reader would fail with a TypeError where verify passed). */
    const bool hashable = ckptio__value_hashable(item);
    const bool keyed =
        parent->kind == CKPTIO_VALUE_SET || (parent->kind == CKPTIO_VALUE_DICT && parent->u.seq.len % 2 == 0);
    if (!hashable && keyed)
        return vfail_at(m, CKPTIO_E_FORMAT, "a %s as a %s: unhashable (Python cannot build this)",
                        item->kind == CKPTIO_VALUE_OBJECT ? "numpy array" : ckptio__value_kind_name(item->kind),
                        parent->kind == CKPTIO_VALUE_SET ? "set item" : "dict key");
    if (!hashable && parent->kind == CKPTIO_VALUE_TUPLE) parent->flags |= CKPTIO__VFLAG_UNHASHABLE;
    const bool holds = item->kind >= CKPTIO__VALUE_GLOBAL || (item->flags & CKPTIO__VFLAG_HOLDS_GLOBAL);
    if ((item->kind >= CKPTIO__VALUE_GLOBAL || (m->mode && holds)) && parent->kind != CKPTIO_VALUE_TUPLE)
        return vfail_at(m, CKPTIO_E_FORMAT, "a global or storage cannot be stored in a container");
    if (m->mode && holds) parent->flags |= CKPTIO__VFLAG_HOLDS_GLOBAL;
    if (ckptio__value_adopt(parent, item) != CKPTIO_OK) return refail(m, ckptio_last_error()->status);
    if (ckptio__value_push(parent, item) != CKPTIO_OK) return refail(m, CKPTIO_E_NOMEM);
    return CKPTIO_OK;
}

static ckptio_status memo_put(vm *m, size_t idx) {
    ckptio_value *v = NULL;
    CKPTIO_FORWARD(top(m, &v));
    /* Honest pickles number memo slots from 0 upwards, one per opcode at
     * most, so an index beyond the stream length is abuse. */
    if (idx >= m->len)
        return vfail_at(m, CKPTIO_E_FORMAT, "memo index %zu is larger than the pickle (%zu bytes)", idx, m->len);
    if (idx >= m->memo_cap) {
        size_t ncap = m->memo_cap ? m->memo_cap : 64;
        while (ncap <= idx) ncap *= 2;
        if (ncap > m->len) ncap = m->len;
        ckptio_value **grown = ckptio__realloc(m->memo, ncap * sizeof *grown);
        if (!grown) return vfail_at(m, CKPTIO_E_NOMEM, "no memory for the pickle memo");
        memset(grown + m->memo_cap, 0, (ncap - m->memo_cap) * sizeof *grown);
        m->memo = grown;
        m->memo_cap = ncap;
    }
    if (!m->memo[idx]) m->memo_count++;
    m->memo[idx] = v;
    return CKPTIO_OK;
}

static ckptio_status memo_get(vm *m, size_t idx) {
    if (idx >= m->memo_cap || !m->memo[idx]) return vfail_at(m, CKPTIO_E_FORMAT, "memo slot %zu was never stored", idx);
    return push(m, m->memo[idx]);
}

static ckptio_status push_string(vm *m, int kind, size_t n) {
    CKPTIO_FORWARD(need(m, n));
    const uint8_t *s = m->data + m->pos;
    if (kind == CKPTIO_VALUE_STR && !ckptio__pickle_utf8_valid(s, n))
        return vfail_at(m, CKPTIO_E_FORMAT, "string is not valid UTF-8");
    ckptio_value *v = new_node(m, kind);
    if (!v) return refail(m, CKPTIO_E_NOMEM);
    v->u.s.data = ckptio__value_strdup(m->pool, s, n);
    if (!v->u.s.data) return refail(m, CKPTIO_E_NOMEM);
    v->u.s.len = n;
    m->pos += n;
    return push(m, v);
}

static ckptio_status push_int(vm *m, int64_t value) {
    ckptio_value *v = new_node(m, CKPTIO_VALUE_INT);
    if (v) v->u.i = value;
    return push(m, v);
}

/* LONG1/LONG4: little-endian two's complement of n bytes. */
static ckptio_status push_long(vm *m, size_t n) {
    CKPTIO_FORWARD(need(m, n));
    const uint8_t *b = m->data + m->pos;
    if (n <= 8) {
        uint64_t u = 0;
        for (size_t i = 0; i < n; i++) u |= (uint64_t)b[i] << (8 * i);
        if (n > 0 && n < 8 && (b[n - 1] & 0x80)) u |= ~0ull << (8 * n); /* sign-extend */
        m->pos += n;
        return push_int(m, (int64_t)u);
    }
    return push_string(m, CKPTIO_VALUE_BIGINT, n);
}

/* ---- globals ------------------------------------------------------------------ */

static ckptio_status push_dcp_global(vm *m, const char *module, const char *name) {
    const char *cls = ckptio__dcp_class(module, name);
    ckptio_value *v;
    if (cls) {
        if ((v = new_node(m, CKPTIO__VALUE_CLASS))) v->u.s.data = (char *)cls, v->u.s.len = strlen(cls);
        return push(m, v);
    }
    if (strcmp(module, "collections") == 0 && strcmp(name, "OrderedDict") == 0) {
        if ((v = new_node(m, CKPTIO__VALUE_GLOBAL))) v->u.global = CKPTIO__G_ORDERED_DICT;
        return push(m, v);
    }
    ckptio_dtype dt;
    if (strcmp(module, "torch") == 0 && ckptio__dtype_from_torch_name(name, &dt)) {
        if ((v = new_node(m, CKPTIO_VALUE_DTYPE))) v->u.dtype = dt;
        return push(m, v);
    }
    return vfail_at(m, CKPTIO_E_DISALLOWED, "global '%s.%s' is not in the DCP metadata allowlist (only "
                    "checkpoint metadata classes, torch.Size, dtypes, layouts, PosixPath, OrderedDict)", module, name);
}

static ckptio_status push_global(vm *m, const char *module, const char *name) {
    /* Python's protocol-2 pickler writes Python 2 module names (fix_imports). */
    if (strcmp(module, "__builtin__") == 0) module = "builtins";
    if (m->mode == CKPTIO__UNPICKLE_DCP_METADATA) return push_dcp_global(m, module, name);
    ckptio__global tag;
    if (ckptio__pickle_global_tag(module, name, &tag)) {
        ckptio_value *v = new_node(m, CKPTIO__VALUE_GLOBAL);
        if (v) v->u.global = tag;
        return push(m, v);
    }
    ckptio_dtype dtype;
    if (strcmp(module, "torch") == 0 && ckptio__torch_storage_class_dtype(name, &dtype)) {
        ckptio_value *v = new_node(m, CKPTIO__VALUE_STORAGE_CLASS);
        if (v) v->u.dtype = dtype;
        return push(m, v);
    }
    if (strcmp(module, "torch.storage") == 0 && strcmp(name, "UntypedStorage") == 0) {
        ckptio_value *v = new_node(m, CKPTIO__VALUE_STORAGE_CLASS);
        if (v) v->u.dtype = CKPTIO_DTYPE_U8, v->flags |= CKPTIO__VFLAG_UNTYPED;
        return push(m, v);
    }
    if (strcmp(module, "torch") == 0 && ckptio__dtype_from_torch_name(name, &dtype)) {
        ckptio_value *v = new_node(m, CKPTIO_VALUE_DTYPE);
        if (v) v->u.dtype = dtype;
        return push(m, v);
    }
    if (ckptio__pickle_torch_allows(module, name))
        return vfail_at(m, CKPTIO_E_UNSUPPORTED, "global '%s.%s' is allowed by torch but not supported by ckptio",
                        module, name);
    return vfail_at(m, CKPTIO_E_DISALLOWED,
                    "global '%s.%s' is not in the allowlist (only state-dict types: OrderedDict, tensors, "
                    "storages, dtypes, torch.Size, torch.device, bytes, set, numpy arrays and scalars)",
                    module, name);
}

/* GLOBAL: "module\nname\n". */
static ckptio_status op_global(vm *m) {
    const uint8_t *start = m->data + m->pos;
    const uint8_t *nl1 = memchr(start, '\n', m->len - m->pos);
    if (!nl1) return vfail_at(m, CKPTIO_E_TRUNCATED, "GLOBAL module name is not terminated");
    const uint8_t *name = nl1 + 1;
    const uint8_t *nl2 = memchr(name, '\n', (size_t)(m->data + m->len - name));
    if (!nl2) return vfail_at(m, CKPTIO_E_TRUNCATED, "GLOBAL name is not terminated");
    size_t ml = (size_t)(nl1 - start), nl = (size_t)(nl2 - name);
    if (ml == 0 || nl == 0 || ml >= 128 || nl >= 128 || memchr(start, 0, ml) || memchr(name, 0, nl))
        return vfail_at(m, CKPTIO_E_FORMAT, "GLOBAL with an empty, overlong or binary name");
    char mod[128], nm[128];
    memcpy(mod, start, ml);
    mod[ml] = '\0';
    memcpy(nm, name, nl);
    nm[nl] = '\0';
    m->pos += ml + nl + 2;
    return push_global(m, mod, nm);
}

static ckptio_status op_stack_global(vm *m) {
    ckptio_value *name = NULL, *module = NULL;
    CKPTIO_FORWARD(pop(m, &name));
    CKPTIO_FORWARD(pop(m, &module));
    if (name->kind != CKPTIO_VALUE_STR || module->kind != CKPTIO_VALUE_STR || name->u.s.len >= 128 ||
        module->u.s.len >= 128 || strlen(name->u.s.data) != name->u.s.len ||
        strlen(module->u.s.data) != module->u.s.len)
        return vfail_at(m, CKPTIO_E_FORMAT, "STACK_GLOBAL needs two short strings");
    return push_global(m, module->u.s.data, name->u.s.data);
}

/* ---- REDUCE -------------------------------------------------------------------- */

static size_t nargs(const ckptio_value *args) { return args->u.seq.len; }
static ckptio_value *arg(const ckptio_value *args, size_t i) { return args->u.seq.items[i]; }

static bool is_empty_state(const ckptio_value *v) {
    if (v->kind == CKPTIO_VALUE_NONE) return true;
    if (v->kind == CKPTIO_VALUE_DICT) return v->u.seq.len == 0;
    if (v->kind == CKPTIO_VALUE_TUPLE) {
        for (size_t i = 0; i < v->u.seq.len; i++)
            if (!is_empty_state(v->u.seq.items[i])) return false;
        return true;
    }
    return false;
}

static ckptio_status int_tuple(vm *m, const ckptio_value *v, const char *what, int64_t **out, uint32_t *n) {
    if (v->kind != CKPTIO_VALUE_TUPLE && v->kind != CKPTIO_VALUE_LIST)
        return vfail_at(m, CKPTIO_E_FORMAT, "tensor %s must be a tuple of ints", what);
    if (v->u.seq.len > MAX_NDIM)
        return vfail_at(m, CKPTIO_E_UNSUPPORTED, "tensor with %zu dimensions (at most %d)", v->u.seq.len, MAX_NDIM);
    int64_t *arr = ckptio__value_alloc(m->pool, (v->u.seq.len ? v->u.seq.len : 1) * sizeof *arr);
    if (!arr) return refail(m, CKPTIO_E_NOMEM);
    for (size_t i = 0; i < v->u.seq.len; i++) {
        const ckptio_value *x = v->u.seq.items[i];
        if (x->kind != CKPTIO_VALUE_INT || x->u.i < 0)
            return vfail_at(m, CKPTIO_E_FORMAT, "tensor %s item %zu is not a non-negative int", what, i);
        arr[i] = x->u.i;
    }
    *out = arr;
    *n = (uint32_t)v->u.seq.len;
    return CKPTIO_OK;
}

/* torch lets only floating point and complex tensors require gradients
 * (torch.load itself fails on any other). */
static ckptio_status check_grad(vm *m, ckptio_dtype dtype) {
    switch (dtype) {
    case CKPTIO_DTYPE_BOOL: case CKPTIO_DTYPE_U8: case CKPTIO_DTYPE_I8: case CKPTIO_DTYPE_U16: case CKPTIO_DTYPE_I16:
    case CKPTIO_DTYPE_U32: case CKPTIO_DTYPE_I32: case CKPTIO_DTYPE_U64: case CKPTIO_DTYPE_I64:
        return vfail_at(m, CKPTIO_E_FORMAT, "a %s tensor that requires grad (torch only lets floating point and "
                        "complex tensors require grad)", ckptio_dtype_torch_name(dtype));
    default: return CKPTIO_OK;
    }
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
 * _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype[, metadata]) */
static ckptio_status rebuild_tensor(vm *m, const ckptio_value *args, bool v3, ckptio_value **out) {
    const size_t base = v3 ? 7 : 6;
    if (nargs(args) != base && nargs(args) != base + 1)
        return vfail_at(m, CKPTIO_E_FORMAT, "_rebuild_tensor_v%d takes %zu or %zu arguments, got %zu", v3 ? 3 : 2,
                        base, base + 1, nargs(args));
    ckptio_value *storage = arg(args, 0), *offset = arg(args, 1), *grad = arg(args, 4), *hooks = arg(args, 5);
    if (storage->kind != CKPTIO__VALUE_STORAGE)
        return vfail_at(m, CKPTIO_E_FORMAT, "tensor argument 0 is not a storage reference");
    if (offset->kind != CKPTIO_VALUE_INT || offset->u.i < 0)
        return vfail_at(m, CKPTIO_E_FORMAT, "tensor storage offset is not a non-negative int");
    if (grad->kind != CKPTIO_VALUE_BOOL) return vfail_at(m, CKPTIO_E_FORMAT, "tensor requires_grad is not a bool");
    if (hooks->kind != CKPTIO_VALUE_DICT) return vfail_at(m, CKPTIO_E_FORMAT, "tensor backward_hooks is not a dict");
    ckptio_dtype dtype = storage->u.storage.dtype;
    if (v3) {
        if (arg(args, 6)->kind != CKPTIO_VALUE_DTYPE)
            return vfail_at(m, CKPTIO_E_FORMAT, "_rebuild_tensor_v3 argument 6 is not a dtype");
        dtype = arg(args, 6)->u.dtype;
        if (!storage->u.storage.untyped)
            return vfail_at(m, CKPTIO_E_FORMAT, "_rebuild_tensor_v3 needs an UntypedStorage");
    }
    if (nargs(args) == base + 1 && !is_empty_state(arg(args, base)))
        return vfail_at(m, CKPTIO_E_UNSUPPORTED,
                        "tensor metadata (conjugate or negative bit views) is not supported; "
                        "save the tensor after .resolve_conj()/.resolve_neg()");
    ckptio_value *t = new_node(m, CKPTIO_VALUE_TENSOR);
    if (!t) return refail(m, CKPTIO_E_NOMEM);
    uint32_t nshape, nstride;
    CKPTIO_FORWARD(int_tuple(m, arg(args, 2), "size", &t->u.tensor.shape, &nshape));
    CKPTIO_FORWARD(int_tuple(m, arg(args, 3), "stride", &t->u.tensor.stride, &nstride));
    if (nshape != nstride)
        return vfail_at(m, CKPTIO_E_FORMAT, "tensor size has %u dimensions but stride %u", nshape, nstride);
    t->u.tensor.ndim = nshape;
    t->u.tensor.storage = storage;
    t->u.tensor.dtype = dtype;
    t->u.tensor.storage_offset = (uint64_t)offset->u.i;
    t->u.tensor.index = SIZE_MAX;
    if (grad->u.b) {
        CKPTIO_FORWARD(check_grad(m, dtype));
        t->flags |= CKPTIO__VFLAG_GRAD;
    }
    *out = t;
    return CKPTIO_OK;
}

static ckptio_status as_parameter(vm *m, const ckptio_value *tensor, const ckptio_value *grad, ckptio_value **out) {
    if (tensor->kind != CKPTIO_VALUE_TENSOR) return vfail_at(m, CKPTIO_E_FORMAT, "Parameter data is not a tensor");
    if (grad && grad->kind != CKPTIO_VALUE_BOOL)
        return vfail_at(m, CKPTIO_E_FORMAT, "Parameter requires_grad is not a bool");
    ckptio_value *p = new_node(m, CKPTIO_VALUE_TENSOR);
    if (!p) return refail(m, CKPTIO_E_NOMEM);
    p->u.tensor = tensor->u.tensor;
    p->flags = (tensor->flags & ~(CKPTIO__VFLAG_FROZEN | CKPTIO__VFLAG_GRAD)) | CKPTIO__VFLAG_PARAMETER;
    if (grad ? grad->u.b : (tensor->flags & CKPTIO__VFLAG_GRAD) != 0) {
        CKPTIO_FORWARD(check_grad(m, tensor->u.tensor.dtype));
        p->flags |= CKPTIO__VFLAG_GRAD;
    }
    *out = p;
    return CKPTIO_OK;
}

/* Latin-1 text (as UTF-8) back to bytes: every code point must be < 256. */
static ckptio_status latin1_bytes(vm *m, const ckptio_value *s, ckptio_value **out) {
    ckptio_value *v = new_node(m, CKPTIO_VALUE_BYTES);
    if (!v) return refail(m, CKPTIO_E_NOMEM);
    char *buf = ckptio__value_alloc(m->pool, s->u.s.len + 1);
    if (!buf) return refail(m, CKPTIO_E_NOMEM);
    size_t n = 0;
    const uint8_t *p = (const uint8_t *)s->u.s.data;
    for (size_t i = 0; i < s->u.s.len; i++) {
        if (p[i] < 0x80) {
            buf[n++] = (char)p[i];
        } else if ((p[i] == 0xC2 || p[i] == 0xC3) && i + 1 < s->u.s.len) {
            buf[n++] = (char)(((p[i] & 0x03) << 6) | (p[i + 1] & 0x3F));
            i++;
        } else {
            return vfail_at(m, CKPTIO_E_FORMAT, "_codecs.encode: character beyond latin-1");
        }
    }
    buf[n] = '\0';
    v->u.s.data = buf;
    v->u.s.len = n;
    *out = v;
    return CKPTIO_OK;
}

static ckptio_status apply(vm *m, const ckptio_value *fn, const ckptio_value *args, ckptio_value **out);

/* DCP mode: REDUCE or NEWOBJ of an allowlisted class records the call; the
 * Python layer maps it to the real class by an explicit table. */
static ckptio_status make_object(vm *m, const ckptio_value *cls, ckptio_value *args, ckptio_value **out) {
    if (args->kind != CKPTIO_VALUE_TUPLE)
        return vfail_at(m, CKPTIO_E_FORMAT, "%s arguments are not a tuple", cls->u.s.data);
    if (args->flags & CKPTIO__VFLAG_HOLDS_GLOBAL)
        return vfail_at(m, CKPTIO_E_FORMAT, "%s arguments hold a class or global, not values", cls->u.s.data);
    ckptio_value *o = new_node(m, CKPTIO_VALUE_OBJECT);
    if (!o) return refail(m, CKPTIO_E_NOMEM);
    if (ckptio__value_adopt(o, args) != CKPTIO_OK) return refail(m, ckptio_last_error()->status);
    o->u.obj.cls = cls->u.s.data;
    o->u.obj.args = args;
    *out = o;
    return CKPTIO_OK;
}

static ckptio_status apply(vm *m, const ckptio_value *fn, const ckptio_value *args, ckptio_value **out) {
    if (fn->kind == CKPTIO__VALUE_CLASS) return make_object(m, fn, (ckptio_value *)args, out);
    if (fn->kind != CKPTIO__VALUE_GLOBAL)
        return vfail_at(m, CKPTIO_E_FORMAT, "REDUCE of something that is not an allowlisted callable");
    if (args->kind != CKPTIO_VALUE_TUPLE) return vfail_at(m, CKPTIO_E_FORMAT, "REDUCE arguments are not a tuple");
    const size_t n = nargs(args);
    switch (fn->u.global) {
    case CKPTIO__G_ORDERED_DICT:
        if (n != 0) return vfail_at(m, CKPTIO_E_UNSUPPORTED, "OrderedDict with constructor arguments");
        if (!(*out = new_node(m, CKPTIO_VALUE_DICT))) return refail(m, CKPTIO_E_NOMEM);
        (*out)->flags |= CKPTIO__VFLAG_ORDERED;
        return CKPTIO_OK;
    case CKPTIO__G_CODECS_ENCODE: {
        if (n != 2 || arg(args, 0)->kind != CKPTIO_VALUE_STR || arg(args, 1)->kind != CKPTIO_VALUE_STR)
            return vfail_at(m, CKPTIO_E_FORMAT, "_codecs.encode takes (str, encoding)");
        const char *enc = arg(args, 1)->u.s.data;
        if (strcmp(enc, "latin1") == 0 || strcmp(enc, "latin-1") == 0) return latin1_bytes(m, arg(args, 0), out);
        if (strcmp(enc, "utf-8") == 0 || strcmp(enc, "utf8") == 0) {
            if (!(*out = new_node(m, CKPTIO_VALUE_BYTES))) return refail(m, CKPTIO_E_NOMEM);
            (*out)->u.s = arg(args, 0)->u.s;
            return CKPTIO_OK;
        }
        return vfail_at(m, CKPTIO_E_UNSUPPORTED, "_codecs.encode with encoding '%s'", enc);
    }
    case CKPTIO__G_BUILTINS_BYTES:
        /* Only the empty bytes: torch's allowlist has no bytes(); b'' is all it makes without arguments. */
        if (n != 0) return vfail_at(m, CKPTIO_E_UNSUPPORTED, "builtins.bytes called with arguments");
        if (!(*out = new_node(m, CKPTIO_VALUE_BYTES)) || !((*out)->u.s.data = ckptio__value_strdup(m->pool, "", 0)))
            return refail(m, CKPTIO_E_NOMEM);
        return CKPTIO_OK;
    case CKPTIO__G_TORCH_SIZE:
    case CKPTIO__G_BUILTINS_SET: {
        const bool set = fn->u.global == CKPTIO__G_BUILTINS_SET;
        const ckptio_value *src = n == 1 ? arg(args, 0) : NULL;
        if (n > 1 || (src && src->kind != CKPTIO_VALUE_TUPLE && src->kind != CKPTIO_VALUE_LIST))
            return vfail_at(m, CKPTIO_E_FORMAT, "%s takes one tuple or list", set ? "set" : "torch.Size");
        ckptio_value *r = new_node(m, set ? CKPTIO_VALUE_SET : CKPTIO_VALUE_TUPLE);
        if (!r) return refail(m, CKPTIO_E_NOMEM);
        if (!set) r->flags |= CKPTIO__VFLAG_TORCH_SIZE;
        for (size_t i = 0; src && i < src->u.seq.len; i++) {
            if (!set && src->u.seq.items[i]->kind != CKPTIO_VALUE_INT)
                return vfail_at(m, CKPTIO_E_FORMAT, "torch.Size item %zu is not an int", i);
            CKPTIO_FORWARD(adopt(m, r, src->u.seq.items[i]));
        }
        *out = r;
        return CKPTIO_OK;
    }
    case CKPTIO__G_TORCH_DEVICE: {
        if (n < 1 || n > 2 || arg(args, 0)->kind != CKPTIO_VALUE_STR ||
            (n == 2 && arg(args, 1)->kind != CKPTIO_VALUE_INT))
            return vfail_at(m, CKPTIO_E_FORMAT, "torch.device takes (str[, int])");
        const ckptio_value *type = arg(args, 0);
        if (type->u.s.len > 100 || strlen(type->u.s.data) != type->u.s.len ||
            (n == 2 && (memchr(type->u.s.data, ':', type->u.s.len) || arg(args, 1)->u.i < 0)))
            return vfail_at(m, CKPTIO_E_FORMAT, "torch.device with a malformed type or index (torch.device() "
                            "refuses it)");
        char text[160];
        if (n == 2) snprintf(text, sizeof text, "%s:%lld", type->u.s.data, (long long)arg(args, 1)->u.i);
        else snprintf(text, sizeof text, "%s", type->u.s.data);
        /* What the reader's torch.device(text) accepts, so verify and the reader agree. */
        if (ckptio__pickle_check_device(text, strlen(text)) != CKPTIO_OK) return refail(m, CKPTIO_E_FORMAT);
        if (!(*out = new_node(m, CKPTIO_VALUE_DEVICE))) return refail(m, CKPTIO_E_NOMEM);
        (*out)->u.s.len = strlen(text);
        if (!((*out)->u.s.data = ckptio__value_strdup(m->pool, text, strlen(text)))) return refail(m, CKPTIO_E_NOMEM);
        return CKPTIO_OK;
    }
    case CKPTIO__G_REBUILD_TENSOR_V2: return rebuild_tensor(m, args, false, out);
    case CKPTIO__G_REBUILD_TENSOR_V3: return rebuild_tensor(m, args, true, out);
    case CKPTIO__G_REBUILD_PARAMETER:
    case CKPTIO__G_REBUILD_PARAMETER_WITH_STATE: {
        const bool with_state = fn->u.global == CKPTIO__G_REBUILD_PARAMETER_WITH_STATE;
        if (n != (with_state ? 4u : 3u))
            return vfail_at(m, CKPTIO_E_FORMAT, "%s takes %d arguments, got %zu",
                            ckptio__pickle_global_name(fn->u.global),
                            with_state ? 4 : 3, n);
        if (with_state && !is_empty_state(arg(args, 3)))
            return vfail_at(m, CKPTIO_E_UNSUPPORTED, "Parameter with Python attributes (state) is not supported");
        return as_parameter(m, arg(args, 0), arg(args, 1), out);
    }
    case CKPTIO__G_REBUILD_FROM_TYPE_V2: {
        if (n != 4 || arg(args, 1)->kind != CKPTIO__VALUE_GLOBAL)
            return vfail_at(m, CKPTIO_E_FORMAT, "_rebuild_from_type_v2 takes (func, type, args, state)");
        const ckptio__global type = arg(args, 1)->u.global;
        if (type != CKPTIO__G_TORCH_TENSOR && type != CKPTIO__G_PARAMETER)
            return vfail_at(m, CKPTIO_E_DISALLOWED, "_rebuild_from_type_v2 to type '%s' (only torch.Tensor, Parameter)",
                            ckptio__pickle_global_name(type));
        if (!is_empty_state(arg(args, 3)))
            return vfail_at(m, CKPTIO_E_UNSUPPORTED, "tensor with Python attributes (state) is not supported");
        const ckptio_value *inner = arg(args, 0);
        if (inner->kind != CKPTIO__VALUE_GLOBAL || (inner->u.global != CKPTIO__G_REBUILD_TENSOR_V2 &&
                                                    inner->u.global != CKPTIO__G_REBUILD_TENSOR_V3 &&
                                                    inner->u.global != CKPTIO__G_REBUILD_PARAMETER))
            return vfail_at(m, CKPTIO_E_DISALLOWED, "_rebuild_from_type_v2 with a function that rebuilds no tensor");
        ckptio_value *t;
        CKPTIO_FORWARD(apply(m, inner, arg(args, 2), &t));
        if (type == CKPTIO__G_PARAMETER && !(t->flags & CKPTIO__VFLAG_PARAMETER)) return as_parameter(m, t, NULL, out);
        *out = t;
        return CKPTIO_OK;
    }
    case CKPTIO__G_TORCH_TENSOR:
    case CKPTIO__G_PARAMETER:
        return vfail_at(m, CKPTIO_E_UNSUPPORTED, "calling %s directly is not supported",
                        ckptio__pickle_global_name(fn->u.global));
    case CKPTIO__G_NP_RECONSTRUCT:
    case CKPTIO__G_NP_NDARRAY:
    case CKPTIO__G_NP_DTYPE:
    case CKPTIO__G_NP_SCALAR:
        if (ckptio__numpy_reduce(m->pool, fn->u.global, (ckptio_value *)args, out) != CKPTIO_OK)
            return refail(m, ckptio_last_error()->status);
        return CKPTIO_OK;
    }
    return vfail_at(m, CKPTIO_E_INTERNAL, "unknown global tag %d", (int)fn->u.global);
}

/* BINPERSID: ('storage', storage_class, key, location, numel). */
static ckptio_status persistent_load(vm *m, const ckptio_value *pid, ckptio_value **out) {
    if (pid->kind != CKPTIO_VALUE_TUPLE || pid->u.seq.len != 5)
        return vfail_at(m, CKPTIO_E_FORMAT, "persistent id is not a 5-tuple ('storage', class, key, location, numel)");
    const ckptio_value *tag = arg(pid, 0), *cls = arg(pid, 1), *key = arg(pid, 2), *loc = arg(pid, 3),
                       *numel = arg(pid, 4);
    if (tag->kind != CKPTIO_VALUE_STR || strcmp(tag->u.s.data, "storage") != 0)
        return vfail_at(m, CKPTIO_E_DISALLOWED, "persistent id of a kind other than 'storage'");
    if (cls->kind != CKPTIO__VALUE_STORAGE_CLASS)
        return vfail_at(m, CKPTIO_E_FORMAT, "persistent id without a storage class");
    if (key->kind != CKPTIO_VALUE_STR || key->u.s.len == 0 || key->u.s.len > 64 ||
        memchr(key->u.s.data, '/', key->u.s.len) || strlen(key->u.s.data) != key->u.s.len)
        return vfail_at(m, CKPTIO_E_FORMAT, "storage key is not a short name");
    if (loc->kind != CKPTIO_VALUE_STR) return vfail_at(m, CKPTIO_E_FORMAT, "storage location is not a string");
    if (numel->kind != CKPTIO_VALUE_INT || numel->u.i < 0)
        return vfail_at(m, CKPTIO_E_FORMAT, "storage size is not a non-negative int");
    ckptio_value *s = new_node(m, CKPTIO__VALUE_STORAGE);
    if (!s) return refail(m, CKPTIO_E_NOMEM);
    s->u.storage.dtype = cls->u.dtype;
    s->u.storage.untyped = (cls->flags & CKPTIO__VFLAG_UNTYPED) != 0;
    s->u.storage.key = key->u.s.data;
    s->u.storage.location = loc->u.s.data;
    s->u.storage.numel = (uint64_t)numel->u.i;
    *out = s;
    return CKPTIO_OK;
}

static ckptio_status make_tuple(vm *m, size_t start) {
    ckptio_value *t = new_node(m, CKPTIO_VALUE_TUPLE);
    if (!t) return refail(m, CKPTIO_E_NOMEM);
    for (size_t i = start; i < m->sp; i++) CKPTIO_FORWARD(adopt(m, t, m->stack[i]));
    m->sp = start;
    return push(m, t);
}

static ckptio_status add_items(vm *m, size_t start, int want_kind) {
    if (start == 0) return vfail_at(m, CKPTIO_E_FORMAT, "no container below the MARK");
    /* The container sits right below the MARK, above any enclosing MARK. */
    if (start - 1 < floor_sp(m)) return vfail_at(m, CKPTIO_E_FORMAT, "no container below the MARK");
    ckptio_value *c = m->stack[start - 1];
    if (c->kind != want_kind)
        return vfail_at(m, CKPTIO_E_FORMAT, "%s target is not a %s",
                        want_kind == CKPTIO_VALUE_DICT ? "SETITEMS"
                        : want_kind == CKPTIO_VALUE_SET ? "ADDITEMS" : "APPENDS",
                        want_kind == CKPTIO_VALUE_DICT ? "dict" : want_kind == CKPTIO_VALUE_SET ? "set" : "list");
    if (want_kind == CKPTIO_VALUE_DICT && (m->sp - start) % 2)
        return vfail_at(m, CKPTIO_E_FORMAT, "SETITEMS with an odd number of stack items");
    for (size_t i = start; i < m->sp; i++) CKPTIO_FORWARD(adopt(m, c, m->stack[i]));
    m->sp = start;
    return CKPTIO_OK;
}

static ckptio_status step(vm *m, uint8_t op, bool *stop) {
    ckptio_value *a = NULL, *b = NULL, *c = NULL;
    size_t start = 0;
    switch (op) {
    case CKPTIO__OP_PROTO:
        CKPTIO_FORWARD(need(m, 1));
        if (m->data[m->pos] < 2 || m->data[m->pos] > 5)
            return vfail_at(m, CKPTIO_E_UNSUPPORTED, "pickle protocol %u (2 to 5 supported)", m->data[m->pos]);
        m->pos++;
        return CKPTIO_OK;
    case CKPTIO__OP_FRAME:
        CKPTIO_FORWARD(need(m, 8));
        m->pos += 8; /* framing is only a read-ahead hint */
        return CKPTIO_OK;
    case CKPTIO__OP_STOP: *stop = true; return CKPTIO_OK;
    case CKPTIO__OP_MARK:
        if (m->nmarks == m->mark_cap) {
            size_t ncap = m->mark_cap ? m->mark_cap * 2 : 16;
            size_t *grown = ckptio__realloc(m->marks, ncap * sizeof *grown);
            if (!grown) return vfail_at(m, CKPTIO_E_NOMEM, "no memory for pickle marks");
            m->marks = grown;
            m->mark_cap = ncap;
        }
        m->marks[m->nmarks++] = m->sp;
        return CKPTIO_OK;
    case CKPTIO__OP_POP: return pop(m, &a);
    case CKPTIO__OP_POP_MARK:
        CKPTIO_FORWARD(pop_mark(m, &start));
        m->sp = start;
        return CKPTIO_OK;
    case CKPTIO__OP_DUP: CKPTIO_FORWARD(top(m, &a)); return push(m, a);
    case CKPTIO__OP_NONE: return push(m, new_node(m, CKPTIO_VALUE_NONE));
    case CKPTIO__OP_NEWTRUE:
    case CKPTIO__OP_NEWFALSE:
        a = new_node(m, CKPTIO_VALUE_BOOL);
        if (a) a->u.b = op == CKPTIO__OP_NEWTRUE;
        return push(m, a);
    case CKPTIO__OP_BININT1: CKPTIO_FORWARD(need(m, 1)); return push_int(m, m->data[m->pos++]);
    case CKPTIO__OP_BININT2:
        CKPTIO_FORWARD(need(m, 2));
        m->pos += 2;
        return push_int(m, ckptio__le16(m->data + m->pos - 2));
    case CKPTIO__OP_BININT:
        CKPTIO_FORWARD(need(m, 4));
        m->pos += 4;
        return push_int(m, (int32_t)ckptio__le32(m->data + m->pos - 4));
    case CKPTIO__OP_LONG1: CKPTIO_FORWARD(need(m, 1)); return push_long(m, m->data[m->pos++]);
    case CKPTIO__OP_LONG4: {
        CKPTIO_FORWARD(need(m, 4));
        uint32_t n = ckptio__le32(m->data + m->pos);
        m->pos += 4;
        return push_long(m, n);
    }
    case CKPTIO__OP_BINFLOAT: {
        CKPTIO_FORWARD(need(m, 8));
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = u << 8 | m->data[m->pos + i];
        m->pos += 8;
        a = new_node(m, CKPTIO_VALUE_FLOAT);
        if (a) memcpy(&a->u.f, &u, sizeof u);
        return push(m, a);
    }
    case CKPTIO__OP_BINUNICODE:
    case CKPTIO__OP_BINBYTES: {
        CKPTIO_FORWARD(need(m, 4));
        uint32_t n = ckptio__le32(m->data + m->pos);
        m->pos += 4;
        return push_string(m, op == CKPTIO__OP_BINUNICODE ? CKPTIO_VALUE_STR : CKPTIO_VALUE_BYTES, n);
    }
    case CKPTIO__OP_SHORT_BINUNICODE:
    case CKPTIO__OP_SHORT_BINBYTES:
    case 'U': /* SHORT_BINSTRING */
        CKPTIO_FORWARD(need(m, 1));
        m->pos++;
        return push_string(m, op == CKPTIO__OP_SHORT_BINBYTES ? CKPTIO_VALUE_BYTES : CKPTIO_VALUE_STR,
                           m->data[m->pos - 1]);
    case CKPTIO__OP_BINUNICODE8:
    case CKPTIO__OP_BINBYTES8: {
        CKPTIO_FORWARD(need(m, 8));
        uint64_t n = ckptio__le64(m->data + m->pos);
        m->pos += 8;
        if (n > m->len - m->pos)
            return vfail_at(m, CKPTIO_E_TRUNCATED, "string of %llu bytes declared, %zu left", (unsigned long long)n,
                            m->len - m->pos);
        return push_string(m, op == CKPTIO__OP_BINUNICODE8 ? CKPTIO_VALUE_STR : CKPTIO_VALUE_BYTES, (size_t)n);
    }
    case CKPTIO__OP_EMPTY_TUPLE: return push(m, new_node(m, CKPTIO_VALUE_TUPLE));
    case CKPTIO__OP_EMPTY_LIST: return push(m, new_node(m, CKPTIO_VALUE_LIST));
    case CKPTIO__OP_EMPTY_DICT: return push(m, new_node(m, CKPTIO_VALUE_DICT));
    case CKPTIO__OP_EMPTY_SET: return push(m, new_node(m, CKPTIO_VALUE_SET));
    case CKPTIO__OP_TUPLE: CKPTIO_FORWARD(pop_mark(m, &start)); return make_tuple(m, start);
    case CKPTIO__OP_TUPLE1:
    case CKPTIO__OP_TUPLE2:
    case CKPTIO__OP_TUPLE3: {
        size_t k = (size_t)(op - CKPTIO__OP_TUPLE1 + 1);
        if (m->sp - floor_sp(m) < k) return vfail_at(m, CKPTIO_E_FORMAT, "stack underflow (TUPLE%zu)", k);
        return make_tuple(m, m->sp - k);
    }
    case CKPTIO__OP_APPEND:
        CKPTIO_FORWARD(pop(m, &a));
        CKPTIO_FORWARD(top(m, &b));
        if (b->kind != CKPTIO_VALUE_LIST) return vfail_at(m, CKPTIO_E_FORMAT, "APPEND to something that is not a list");
        return adopt(m, b, a);
    case CKPTIO__OP_APPENDS: CKPTIO_FORWARD(pop_mark(m, &start)); return add_items(m, start, CKPTIO_VALUE_LIST);
    case CKPTIO__OP_ADDITEMS: CKPTIO_FORWARD(pop_mark(m, &start)); return add_items(m, start, CKPTIO_VALUE_SET);
    case CKPTIO__OP_SETITEM:
        CKPTIO_FORWARD(pop(m, &a));
        CKPTIO_FORWARD(pop(m, &b));
        CKPTIO_FORWARD(top(m, &c));
        if (c->kind != CKPTIO_VALUE_DICT)
            return vfail_at(m, CKPTIO_E_FORMAT, "SETITEM on something that is not a dict");
        CKPTIO_FORWARD(adopt(m, c, b));
        return adopt(m, c, a);
    case CKPTIO__OP_SETITEMS: CKPTIO_FORWARD(pop_mark(m, &start)); return add_items(m, start, CKPTIO_VALUE_DICT);
    case CKPTIO__OP_BINPUT: CKPTIO_FORWARD(need(m, 1)); return memo_put(m, m->data[m->pos++]);
    case CKPTIO__OP_LONG_BINPUT:
        CKPTIO_FORWARD(need(m, 4));
        m->pos += 4;
        return memo_put(m, ckptio__le32(m->data + m->pos - 4));
    case CKPTIO__OP_MEMOIZE: return memo_put(m, m->memo_count);
    case CKPTIO__OP_BINGET: CKPTIO_FORWARD(need(m, 1)); return memo_get(m, m->data[m->pos++]);
    case CKPTIO__OP_LONG_BINGET:
        CKPTIO_FORWARD(need(m, 4));
        m->pos += 4;
        return memo_get(m, ckptio__le32(m->data + m->pos - 4));
    case CKPTIO__OP_GLOBAL: return op_global(m);
    case CKPTIO__OP_STACK_GLOBAL: return op_stack_global(m);
    case CKPTIO__OP_REDUCE:
        CKPTIO_FORWARD(pop(m, &a));
        CKPTIO_FORWARD(pop(m, &b));
        CKPTIO_FORWARD(apply(m, b, a, &c));
        return push(m, c);
    case CKPTIO__OP_NEWOBJ:
        if (!m->mode) return vfail_at(m, CKPTIO_E_DISALLOWED, "opcode 0x81 is not allowed in a weights-only pickle");
        CKPTIO_FORWARD(pop(m, &a));
        CKPTIO_FORWARD(pop(m, &b));
        if (b->kind != CKPTIO__VALUE_CLASS)
            return vfail_at(m, CKPTIO_E_DISALLOWED, "NEWOBJ of something that is not an allowlisted DCP class");
        CKPTIO_FORWARD(make_object(m, b, a, &c));
        return push(m, c);
    case CKPTIO__OP_BINPERSID:
        if (m->mode) return vfail_at(m, CKPTIO_E_DISALLOWED, "persistent id (BINPERSID) in DCP metadata");
        CKPTIO_FORWARD(pop(m, &a));
        CKPTIO_FORWARD(persistent_load(m, a, &c));
        return push(m, c);
    case CKPTIO__OP_BUILD:
        CKPTIO_FORWARD(pop(m, &a));
        CKPTIO_FORWARD(top(m, &b));
        if (ckptio__numpy_node(b)) {
            if (ckptio__numpy_build(m->pool, b, a) != CKPTIO_OK) return refail(m, ckptio_last_error()->status);
            return CKPTIO_OK;
        }
        if (b->kind == CKPTIO_VALUE_DICT && (b->flags & CKPTIO__VFLAG_ORDERED)) {
            if (a->kind != CKPTIO_VALUE_DICT)
                return vfail_at(m, CKPTIO_E_UNSUPPORTED, "BUILD of an OrderedDict with a non-dict state");
            if (m->mode == CKPTIO__UNPICKLE_DCP_METADATA)
                return vfail_at(m, CKPTIO_E_FORMAT,
                                "a dict with attributes (BUILD state) does not occur in DCP metadata");
            if (b->attrs) return vfail_at(m, CKPTIO_E_UNSUPPORTED, "second BUILD of the same OrderedDict");
            if (b->flags & CKPTIO__VFLAG_FROZEN)
                return vfail_at(m, CKPTIO_E_FORMAT, "BUILD of an OrderedDict already stored elsewhere");
            /* The reader sets these as attributes: a name setattr refuses or one that breaks the object is
             * refused here, so that whatever verify passes the reader builds. */
            for (size_t i = 0; i < a->u.seq.len; i += 2)
                if (ckptio__pickle_check_attr_name(a->u.seq.items[i]) != CKPTIO_OK)
                    return refail(m, ckptio_last_error()->status);
            if (ckptio__value_adopt(b, a) != CKPTIO_OK) return refail(m, ckptio_last_error()->status);
            b->attrs = a;
            return CKPTIO_OK;
        }
        if (b->kind == CKPTIO_VALUE_OBJECT) {
            /* What ckptio.dcp's reader refuses to build, verify refuses here too. */
            if (!ckptio__dcp_class_takes_state(b->u.obj.cls))
                return vfail_at(m, CKPTIO_E_FORMAT, "%s with BUILD state (the class takes none)", b->u.obj.cls);
            if (b->u.obj.state) return vfail_at(m, CKPTIO_E_UNSUPPORTED, "second BUILD of the same %s", b->u.obj.cls);
            if (a->flags & CKPTIO__VFLAG_HOLDS_GLOBAL || a->kind >= CKPTIO__VALUE_GLOBAL)
                return vfail_at(m, CKPTIO_E_FORMAT, "BUILD state of %s holds a class or global", b->u.obj.cls);
            if (ckptio__value_adopt(b, a) != CKPTIO_OK) return refail(m, ckptio_last_error()->status);
            b->u.obj.state = a;
            return CKPTIO_OK;
        }
        if (b->kind == CKPTIO_VALUE_TENSOR && is_empty_state(a)) return CKPTIO_OK;
        return vfail_at(m, CKPTIO_E_DISALLOWED, "BUILD is only allowed on an OrderedDict (got a %s)",
                        b->kind == CKPTIO_VALUE_TENSOR ? "tensor with state" : "other object");
    default:
        if (op >= 0x20 && op < 0x7f)
            return vfail_at(m, CKPTIO_E_DISALLOWED, "opcode '%c' (0x%02x) is not allowed in a weights-only pickle",
                            op, op);
        return vfail_at(m, CKPTIO_E_DISALLOWED, "opcode 0x%02x is not allowed in a weights-only pickle", op);
    }
}

ckptio_status ckptio__unpickle(const uint8_t *data, size_t len, const char *origin, const char *record,
                               uint64_t base_offset, ckptio__value_pool *pool, ckptio_value **root) {
    return ckptio__unpickle_mode(data, len, origin, record, base_offset, CKPTIO__UNPICKLE_STATE_DICT, pool, root);
}

ckptio_status ckptio__unpickle_mode(const uint8_t *data, size_t len, const char *origin, const char *record,
                                    uint64_t base_offset, int mode, ckptio__value_pool *pool, ckptio_value **root) {
    vm m = {.data = data, .len = len, .origin = origin, .record = record, .base = base_offset, .pool = pool,
            .mode = mode};
    ckptio_status st = CKPTIO_OK;
    bool stop = false;
    while (!stop) {
        m.op_pos = m.pos;
        if (m.pos >= m.len) {
            st = vfail_at(&m, CKPTIO_E_TRUNCATED, "pickle ends without STOP");
            goto out;
        }
        st = step(&m, m.data[m.pos++], &stop);
        if (st) goto out;
    }
    if (m.nmarks || m.sp != 1) {
        st = vfail_at(&m, CKPTIO_E_FORMAT, "STOP with %zu values and %zu marks on the stack (expected 1 and 0)", m.sp,
                      m.nmarks);
        goto out;
    }
    if (m.stack[0]->kind == CKPTIO__VALUE_NUMPY_PENDING) {
        st = vfail_at(&m, CKPTIO_E_FORMAT, "the pickled object is a %s without its BUILD state", m.stack[0]->u.obj.cls);
        goto out;
    }
    if (m.stack[0]->kind >= CKPTIO__VALUE_GLOBAL || (m.stack[0]->flags & CKPTIO__VFLAG_HOLDS_GLOBAL)) {
        st = vfail_at(&m, CKPTIO_E_UNSUPPORTED, "the pickled object is a bare global or storage, not a value");
        goto out;
    }
    *root = m.stack[0];
out:
    ckptio__free(m.stack);
    ckptio__free(m.marks);
    ckptio__free(m.memo);
    return st;
}
