/*
 * torch_write.c - the torch.save writer's format side: building the object
 * tree (ckptio_torch_writer_*), pickling it the way torch.save does
 * (_rebuild_tensor_v2 with legacy storage classes, _rebuild_tensor_v3 +
 * UntypedStorage for newer dtypes, _rebuild_parameter), and laying out the
 * zip records (docs/FORMATS.md 1.1). No I/O: src/ckpt/torch_file_save.c writes.
 */
#include "torch_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define BATCH 1000 /* Python's pickler batches APPENDS/SETITEMS by 1000 */
#define MAX_EMIT_NODES (1ull << 26)

static void invalidate(ckptio_torch_writer *w) { w->generation++; }

ckptio_status ckptio_torch_writer_create(ckptio_torch_writer **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    ckptio_torch_writer *w = ckptio__calloc(1, sizeof *w);
    if (!w) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a torch writer");
    w->root = ckptio__value_new(&w->pool, CKPTIO_VALUE_NONE);
    if (!w->root) {
        ckptio__value_pool_free(&w->pool);
        ckptio__free(w);
        return CKPTIO_E_NOMEM;
    }
    *out = w;
    return CKPTIO_OK;
}

static void free_layout(ckptio_torch_writer *w) {
    for (size_t i = 0; i < w->nentries; i++) {
        ckptio__free(w->entries[i].name);
        if (w->entry_bytes && w->entry_bytes[i] != w->pickle.data) ckptio__free(w->entry_bytes[i]);
    }
    ckptio__free(w->entries);
    ckptio__free(w->entry_storage);
    ckptio__free(w->entry_bytes);
    ckptio__free(w->pieces);
    ckptio__free(w->layout_prefix);
    ckptio__pickle_buf_free(&w->pickle);
    w->entries = NULL;
    w->entry_storage = NULL;
    w->entry_bytes = NULL;
    w->pieces = NULL;
    w->layout_prefix = NULL;
    w->nentries = w->npieces = 0;
    w->have_layout = false;
}

ckptio_status ckptio_torch_writer_destroy(ckptio_torch_writer *w) {
    if (!w) return CKPTIO_OK;
    free_layout(w);
    for (size_t i = 0; i < w->nstorages; i++) ckptio__free(w->storages[i].location);
    ckptio__free(w->storages);
    ckptio__value_pool_free(&w->pool);
    ckptio__free(w);
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_storage(ckptio_torch_writer *w, ckptio_dtype dtype, uint64_t nbytes,
                                          const char *location, const void *data, ckptio_mem_kind mem_kind,
                                          size_t *id) {
    if (!w || !id) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer and id must not be NULL");
    if (!ckptio__torch_element_size(dtype))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "dtype %d cannot be saved in a torch.save file", (int)dtype);
    if (nbytes % ckptio__torch_element_size(dtype))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "storage of %llu bytes is not a whole number of %s elements",
                           (unsigned long long)nbytes, ckptio_dtype_torch_name(dtype));
    if (!location) location = "cpu";
    if (!*location || strlen(location) > 64)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "storage location must be 1..64 characters");
    if (w->nstorages == w->storage_cap) {
        size_t ncap = w->storage_cap ? w->storage_cap * 2 : 16;
        ckptio__torch_wstorage *grown = ckptio__realloc(w->storages, ncap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for storages");
        w->storages = grown;
        w->storage_cap = ncap;
    }
    char *loc = ckptio__strdup(location);
    if (!loc) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a storage location");
    w->storages[w->nstorages] = (ckptio__torch_wstorage){.dtype = dtype, .nbytes = nbytes, .location = loc,
                                                         .data = data, .mem_kind = mem_kind, .entry = SIZE_MAX};
    *id = w->nstorages++;
    invalidate(w);
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_bind(ckptio_torch_writer *w, size_t id, const void *data, ckptio_mem_kind mem_kind) {
    if (!w) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer must not be NULL");
    if (id >= w->nstorages)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "storage id %zu out of range (%zu storages)", id, w->nstorages);
    w->storages[id].data = data;
    w->storages[id].mem_kind = mem_kind;
    return CKPTIO_OK;
}

static ckptio_status new_value(ckptio_torch_writer *w, int kind, ckptio_value **out) {
    if (!w || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer and output must not be NULL");
    ckptio_value *v = ckptio__value_new(&w->pool, kind);
    if (!v) return CKPTIO_E_NOMEM;
    invalidate(w);
    *out = v;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_tensor(ckptio_torch_writer *w, const ckptio_torch_tensor_spec *spec,
                                         ckptio_value **out) {
    if (!w || !spec || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer, spec and output must not be NULL");
    if (spec->storage >= w->nstorages)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "storage id %zu out of range (%zu storages)", spec->storage, w->nstorages);
    const ckptio__torch_wstorage *s = &w->storages[spec->storage];
    const uint64_t esize = ckptio__torch_element_size(spec->dtype);
    if (!esize) return CKPTIO_FAIL(CKPTIO_E_INVAL, "dtype %d cannot be saved in a torch.save file", (int)spec->dtype);
    if (spec->dtype != s->dtype && s->dtype != CKPTIO_DTYPE_U8)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "tensor of %s views a %s storage (torch saves one dtype per storage)",
                           ckptio_dtype_torch_name(spec->dtype), ckptio_dtype_torch_name(s->dtype));
    if (s->nbytes % esize)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "storage of %llu bytes is not a whole number of %s elements",
                           (unsigned long long)s->nbytes, ckptio_dtype_torch_name(spec->dtype));
    if (spec->ndim > 64) return CKPTIO_FAIL(CKPTIO_E_RANGE, "tensor with %u dimensions (at most 64)", spec->ndim);
    if (spec->ndim && !spec->shape) return CKPTIO_FAIL(CKPTIO_E_INVAL, "shape must not be NULL");
    ckptio_value *v;
    CKPTIO_FORWARD(new_value(w, CKPTIO_VALUE_TENSOR, &v));
    ckptio__tensor_ref *tr = &v->u.tensor;
    tr->shape = ckptio__value_alloc(&w->pool, (spec->ndim ? spec->ndim : 1) * sizeof(int64_t));
    tr->stride = ckptio__value_alloc(&w->pool, (spec->ndim ? spec->ndim : 1) * sizeof(int64_t));
    if (!tr->shape || !tr->stride) return CKPTIO_E_NOMEM;
    int64_t expected = 1;
    bool empty = false;
    for (uint32_t d = spec->ndim; d-- > 0;) {
        if (spec->shape[d] < 0)
            return CKPTIO_FAIL(CKPTIO_E_INVAL, "shape[%u] = %lld is negative", d, (long long)spec->shape[d]);
        tr->shape[d] = spec->shape[d];
        tr->stride[d] = spec->stride ? spec->stride[d] : expected;
        if (tr->stride[d] < 0)
            return CKPTIO_FAIL(CKPTIO_E_INVAL, "stride[%u] = %lld is negative", d, (long long)tr->stride[d]);
        if (spec->shape[d] == 0) empty = true;
        uint64_t e;
        if (!spec->stride && ckptio__mul_overflows((uint64_t)expected, (uint64_t)spec->shape[d], &e))
            return CKPTIO_FAIL(CKPTIO_E_RANGE, "tensor element count overflows");
        if (!spec->stride) expected = (int64_t)e;
    }
    /* The last element must lie inside the storage. */
    uint64_t last = spec->storage_offset, step, end;
    bool overflow = false;
    for (uint32_t d = 0; d < spec->ndim; d++) {
        if (tr->shape[d] == 0) continue;
        overflow |= ckptio__mul_overflows((uint64_t)(tr->shape[d] - 1), (uint64_t)tr->stride[d], &step);
        overflow |= ckptio__add_overflows(last, step, &last);
    }
    overflow |= ckptio__add_overflows(last, 1, &end) || ckptio__mul_overflows(end, esize, &end);
    if (!empty && (overflow || end > s->nbytes))
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "tensor view (offset %llu) reaches past its storage of %llu bytes",
                           (unsigned long long)spec->storage_offset, (unsigned long long)s->nbytes);
    tr->ndim = spec->ndim;
    tr->dtype = spec->dtype;
    tr->storage_offset = spec->storage_offset;
    tr->writer_storage = spec->storage;
    tr->index = SIZE_MAX;
    if (spec->requires_grad) v->flags |= CKPTIO__VFLAG_GRAD;
    if (spec->is_parameter) v->flags |= CKPTIO__VFLAG_PARAMETER;
    *out = v;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_none(ckptio_torch_writer *w, ckptio_value **out) {
    return new_value(w, CKPTIO_VALUE_NONE, out);
}

ckptio_status ckptio_torch_writer_bool(ckptio_torch_writer *w, int v, ckptio_value **out) {
    CKPTIO_FORWARD(new_value(w, CKPTIO_VALUE_BOOL, out));
    (*out)->u.b = v != 0;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_int(ckptio_torch_writer *w, int64_t v, ckptio_value **out) {
    CKPTIO_FORWARD(new_value(w, CKPTIO_VALUE_INT, out));
    (*out)->u.i = v;
    return CKPTIO_OK;
}

static ckptio_status string_value(ckptio_torch_writer *w, int kind, const void *data, size_t len, ckptio_value **out) {
    if (len && !data) return CKPTIO_FAIL(CKPTIO_E_INVAL, "data must not be NULL");
    CKPTIO_FORWARD(new_value(w, kind, out));
    (*out)->u.s.data = ckptio__value_strdup(&w->pool, data, len);
    if (!(*out)->u.s.data) return CKPTIO_E_NOMEM;
    (*out)->u.s.len = len;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_bigint(ckptio_torch_writer *w, const void *le_twos_complement, size_t len,
                                         ckptio_value **out) {
    if (len == 0 || len > 255)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "big integer of %zu bytes (1..255 can be pickled as LONG1)", len);
    return string_value(w, CKPTIO_VALUE_BIGINT, le_twos_complement, len, out);
}

ckptio_status ckptio_torch_writer_float(ckptio_torch_writer *w, double v, ckptio_value **out) {
    CKPTIO_FORWARD(new_value(w, CKPTIO_VALUE_FLOAT, out));
    (*out)->u.f = v;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_str(ckptio_torch_writer *w, const char *s, size_t len, ckptio_value **out) {
    /* The unpickler refuses a str that is not UTF-8. */
    if (s && !ckptio__pickle_utf8_valid((const uint8_t *)s, len))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "str of %zu bytes is not valid UTF-8", len);
    return string_value(w, CKPTIO_VALUE_STR, s, len, out);
}

ckptio_status ckptio_torch_writer_bytes(ckptio_torch_writer *w, const void *data, size_t len, ckptio_value **out) {
    return string_value(w, CKPTIO_VALUE_BYTES, data, len, out);
}

ckptio_status ckptio_torch_writer_dtype(ckptio_torch_writer *w, ckptio_dtype dtype, ckptio_value **out) {
    if (!ckptio__torch_element_size(dtype))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "dtype %d is not a torch dtype", (int)dtype);
    CKPTIO_FORWARD(new_value(w, CKPTIO_VALUE_DTYPE, out));
    (*out)->u.dtype = dtype;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_container(ckptio_torch_writer *w, ckptio_value_kind kind, int ordered,
                                            ckptio_value **out) {
    if (kind != CKPTIO_VALUE_LIST && kind != CKPTIO_VALUE_TUPLE && kind != CKPTIO_VALUE_SET &&
        kind != CKPTIO_VALUE_DICT)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "kind %d is not a container (LIST, TUPLE, SET or DICT)", (int)kind);
    CKPTIO_FORWARD(new_value(w, (int)kind, out));
    if (kind == CKPTIO_VALUE_DICT && ordered) (*out)->flags |= CKPTIO__VFLAG_ORDERED;
    return CKPTIO_OK;
}

/* Writer nodes only come from this writer's pool; checking ownership is a
 * linear scan, so only the kinds are checked here. */
ckptio_status ckptio_torch_writer_append(ckptio_torch_writer *w, ckptio_value *seq, ckptio_value *item) {
    if (!w || !seq || !item) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer, container and item must not be NULL");
    if (seq->kind != CKPTIO_VALUE_LIST && seq->kind != CKPTIO_VALUE_TUPLE && seq->kind != CKPTIO_VALUE_SET)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "append needs a LIST, TUPLE or SET");
    CKPTIO_FORWARD(ckptio__value_push(seq, item));
    invalidate(w);
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_set_item(ckptio_torch_writer *w, ckptio_value *dict, ckptio_value *key,
                                           ckptio_value *item) {
    if (!w || !dict || !key || !item) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer, dict, key and item must not be NULL");
    if (dict->kind != CKPTIO_VALUE_DICT) return CKPTIO_FAIL(CKPTIO_E_INVAL, "set_item needs a DICT");
    if (key->kind == CKPTIO_VALUE_LIST || key->kind == CKPTIO_VALUE_DICT || key->kind == CKPTIO_VALUE_SET)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "dict keys must be hashable (not a list, dict or set)");
    CKPTIO_FORWARD(ckptio__value_push(dict, key));
    CKPTIO_FORWARD(ckptio__value_push(dict, item));
    invalidate(w);
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_set_root(ckptio_torch_writer *w, ckptio_value *root) {
    if (!w || !root) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer and root must not be NULL");
    w->root = root;
    invalidate(w);
    return CKPTIO_OK;
}

/* ---- pickling ------------------------------------------------------------------ */

typedef struct emitter {
    ckptio_torch_writer *w;
    ckptio__pickle_buf *b;
    size_t *order;                 /* storage ids in key order */
    size_t nused;
    ckptio_dtype *used_dtype;      /* per storage: dtype of its tensors */
    uint64_t nodes;
} emitter;

static void ordered_dict_empty(ckptio__pickle_buf *b) {
    ckptio__pickle_global(b, "collections", "OrderedDict");
    ckptio__pickle_op(b, CKPTIO__OP_EMPTY_TUPLE);
    ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
}

static void int_tuple(ckptio__pickle_buf *b, const int64_t *v, uint32_t n) {
    if (n == 0) {
        ckptio__pickle_op(b, CKPTIO__OP_EMPTY_TUPLE);
        return;
    }
    if (n > 3) ckptio__pickle_op(b, CKPTIO__OP_MARK);
    for (uint32_t i = 0; i < n; i++) ckptio__pickle_int(b, v[i]);
    ckptio__pickle_op(b, n == 1   ? CKPTIO__OP_TUPLE1
                         : n == 2 ? CKPTIO__OP_TUPLE2
                         : n == 3 ? CKPTIO__OP_TUPLE3
                                  : CKPTIO__OP_TUPLE);
}

static ckptio_status emit_tensor(emitter *e, const ckptio_value *v) {
    ckptio__pickle_buf *b = e->b;
    const ckptio__tensor_ref *tr = &v->u.tensor;
    ckptio__torch_wstorage *s = &e->w->storages[tr->writer_storage];
    /* Keys number storages in order of first use, like torch.save's id_map. */
    if (s->entry == SIZE_MAX) {
        s->entry = e->nused;
        e->order[e->nused++] = tr->writer_storage;
        e->used_dtype[tr->writer_storage] = tr->dtype;
    } else if (e->used_dtype[tr->writer_storage] != tr->dtype) {
        return CKPTIO_FAIL(CKPTIO_E_INVAL,
                           "storage %zu is viewed as %s and as %s; torch.save allows one dtype per storage",
                           tr->writer_storage, ckptio_dtype_torch_name(e->used_dtype[tr->writer_storage]),
                           ckptio_dtype_torch_name(tr->dtype));
    }
    const char *cls = ckptio__torch_storage_class(tr->dtype);
    const bool param = (v->flags & CKPTIO__VFLAG_PARAMETER) != 0;
    const bool grad = (v->flags & CKPTIO__VFLAG_GRAD) != 0;
    if (param) ckptio__pickle_global(b, "torch._utils", "_rebuild_parameter");
    ckptio__pickle_global(b, "torch._utils", cls ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    /* persistent id ('storage', class, key, location, numel) */
    ckptio__pickle_op(b, CKPTIO__OP_MARK);
    ckptio__pickle_str(b, "storage", 7);
    if (cls) ckptio__pickle_global(b, "torch", cls);
    else ckptio__pickle_global(b, "torch.storage", "UntypedStorage");
    char key[32];
    int klen = snprintf(key, sizeof key, "%zu", s->entry);
    ckptio__pickle_str(b, key, (size_t)klen);
    ckptio__pickle_str(b, s->location, strlen(s->location));
    ckptio__pickle_int(b, (int64_t)(cls ? s->nbytes / ckptio__torch_element_size(tr->dtype) : s->nbytes));
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE);
    ckptio__pickle_op(b, CKPTIO__OP_BINPERSID);
    ckptio__pickle_int(b, (int64_t)tr->storage_offset);
    int_tuple(b, tr->shape, tr->ndim);
    int_tuple(b, tr->stride, tr->ndim);
    /* Parameter.__reduce_ex__ pickles self.data, which never requires grad. */
    ckptio__pickle_bool(b, grad && !param);
    ordered_dict_empty(b);
    if (!cls) ckptio__pickle_global(b, "torch", ckptio_dtype_torch_name(tr->dtype));
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE);
    ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
    if (param) {
        ckptio__pickle_bool(b, grad);
        ordered_dict_empty(b);
        ckptio__pickle_op(b, CKPTIO__OP_TUPLE3);
        ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
    }
    return CKPTIO_OK;
}

static ckptio_status emit(emitter *e, const ckptio_value *v, unsigned depth);

static ckptio_status emit_items(emitter *e, const ckptio_value *v, unsigned depth, size_t per, uint8_t one_op,
                                uint8_t many_op) {
    const size_t n = v->u.seq.len / per;
    for (size_t start = 0; start < n; start += BATCH) {
        size_t end = start + BATCH < n ? start + BATCH : n;
        if (end - start > 1) ckptio__pickle_op(e->b, CKPTIO__OP_MARK);
        for (size_t i = start * per; i < end * per; i++) CKPTIO_FORWARD(emit(e, v->u.seq.items[i], depth + 1));
        ckptio__pickle_op(e->b, end - start > 1 ? many_op : one_op);
    }
    return CKPTIO_OK;
}

static ckptio_status emit(emitter *e, const ckptio_value *v, unsigned depth) {
    ckptio__pickle_buf *b = e->b;
    if (depth > CKPTIO__VALUE_MAX_DEPTH)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "values nested deeper than %u levels (or a container holds itself)",
                           CKPTIO__VALUE_MAX_DEPTH);
    if (++e->nodes > MAX_EMIT_NODES)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "shared values expand to more than %llu pickled nodes",
                           (unsigned long long)MAX_EMIT_NODES);
    switch (v->kind) {
    case CKPTIO_VALUE_NONE: ckptio__pickle_op(b, CKPTIO__OP_NONE); break;
    case CKPTIO_VALUE_BOOL: ckptio__pickle_bool(b, v->u.b); break;
    case CKPTIO_VALUE_INT: ckptio__pickle_int(b, v->u.i); break;
    case CKPTIO_VALUE_BIGINT: ckptio__pickle_long1(b, (const uint8_t *)v->u.s.data, v->u.s.len); break;
    case CKPTIO_VALUE_FLOAT: ckptio__pickle_float(b, v->u.f); break;
    case CKPTIO_VALUE_STR: ckptio__pickle_str(b, v->u.s.data, v->u.s.len); break;
    case CKPTIO_VALUE_BYTES: ckptio__pickle_bytes(b, (const uint8_t *)v->u.s.data, v->u.s.len); break;
    case CKPTIO_VALUE_DTYPE: ckptio__pickle_global(b, "torch", ckptio_dtype_torch_name(v->u.dtype)); break;
    case CKPTIO_VALUE_DEVICE:
        ckptio__pickle_global(b, "torch", "device");
        ckptio__pickle_str(b, v->u.s.data, v->u.s.len);
        ckptio__pickle_op(b, CKPTIO__OP_TUPLE1);
        ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
        break;
    case CKPTIO_VALUE_TENSOR: CKPTIO_FORWARD(emit_tensor(e, v)); break;
    case CKPTIO_VALUE_LIST:
        ckptio__pickle_op(b, CKPTIO__OP_EMPTY_LIST);
        CKPTIO_FORWARD(emit_items(e, v, depth, 1, CKPTIO__OP_APPEND, CKPTIO__OP_APPENDS));
        break;
    case CKPTIO_VALUE_SET:
        ckptio__pickle_global(b, "builtins", "set");
        ckptio__pickle_op(b, CKPTIO__OP_EMPTY_LIST);
        CKPTIO_FORWARD(emit_items(e, v, depth, 1, CKPTIO__OP_APPEND, CKPTIO__OP_APPENDS));
        ckptio__pickle_op(b, CKPTIO__OP_TUPLE1);
        ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
        break;
    case CKPTIO_VALUE_TUPLE: {
        const size_t n = v->u.seq.len;
        if (n == 0) {
            ckptio__pickle_op(b, CKPTIO__OP_EMPTY_TUPLE);
            break;
        }
        if (n > 3) ckptio__pickle_op(b, CKPTIO__OP_MARK);
        for (size_t i = 0; i < n; i++) CKPTIO_FORWARD(emit(e, v->u.seq.items[i], depth + 1));
        ckptio__pickle_op(b, n == 1   ? CKPTIO__OP_TUPLE1
                             : n == 2 ? CKPTIO__OP_TUPLE2
                             : n == 3 ? CKPTIO__OP_TUPLE3
                                      : CKPTIO__OP_TUPLE);
        break;
    }
    case CKPTIO_VALUE_DICT:
        if (v->flags & CKPTIO__VFLAG_ORDERED) ordered_dict_empty(b);
        else ckptio__pickle_op(b, CKPTIO__OP_EMPTY_DICT);
        CKPTIO_FORWARD(emit_items(e, v, depth, 2, CKPTIO__OP_SETITEM, CKPTIO__OP_SETITEMS));
        if (v->attrs) {
            CKPTIO_FORWARD(emit(e, v->attrs, depth + 1));
            ckptio__pickle_op(b, CKPTIO__OP_BUILD);
        }
        break;
    default: return CKPTIO_FAIL(CKPTIO_E_INTERNAL, "writer holds a node of kind %d", v->kind);
    }
    return b->failed ? ckptio_last_error()->status : CKPTIO_OK;
}

/* ---- layout ------------------------------------------------------------------- */

ckptio_status ckptio__torch_options(const ckptio_torch_save_options *options, const char *path, uint32_t *alignment,
                                    char **prefix) {
    *alignment = options && options->storage_alignment ? options->storage_alignment : 4096;
    if (*alignment > CKPTIO_ZIP_MAX_ALIGNMENT)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "storage_alignment %u is outside 1..%u", *alignment,
                           CKPTIO_ZIP_MAX_ALIGNMENT);
    const char *p = options ? options->record_prefix : NULL;
    size_t len;
    if (p) {
        len = strlen(p);
    } else if (path) {
        /* torch.save: the basename without its last extension. */
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        const char *dot = strrchr(base, '.');
        p = base;
        len = dot ? (size_t)(dot - base) : strlen(base);
    } else {
        p = "archive", len = 7;
    }
    if (len == 0 && !(options && options->record_prefix)) p = "archive", len = 7;
    /* Up to a whole file name (NAME_MAX), as torch.save takes any. One
     * made from `path` can only be longer when the file name is, which no
     * file system takes: say so as opening the file would. */
    if (len > CKPTIO__NAME_MAX && !(options && options->record_prefix))
        return CKPTIO_FAIL_SYS(ENAMETOOLONG, "create", path, -1,
                               "the file name is %zu bytes long, names may have at most %d bytes", strlen(p),
                               CKPTIO__NAME_MAX);
    if (len == 0 || len > CKPTIO__NAME_MAX || memchr(p, '/', len))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "record prefix '%.*s' must be 1..%d bytes without '/'",
                           (int)(len > CKPTIO__NAME_MAX ? CKPTIO__NAME_MAX : len), p, CKPTIO__NAME_MAX);
    *prefix = ckptio__malloc(len + 1);
    if (!*prefix) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the record prefix");
    memcpy(*prefix, p, len);
    (*prefix)[len] = '\0';
    return CKPTIO_OK;
}

static ckptio_status add_entry(ckptio_torch_writer *w, const char *prefix, const char *rel, uint64_t size,
                               size_t storage, uint8_t *bytes) {
    ckptio__zip_entry *e = &w->entries[w->nentries];
    size_t len = strlen(prefix) + 1 + strlen(rel);
    e->name = ckptio__malloc(len + 1);
    if (!e->name) {
        ckptio__free(bytes != w->pickle.data ? bytes : NULL);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a record name");
    }
    snprintf(e->name, len + 1, "%s/%s", prefix, rel);
    e->name_len = (uint16_t)len;
    e->size = size;
    w->entry_storage[w->nentries] = storage;
    w->entry_bytes[w->nentries] = bytes;
    w->nentries++;
    return CKPTIO_OK;
}

static ckptio_status add_text_entry(ckptio_torch_writer *w, const char *prefix, const char *rel, const char *text,
                                    size_t len) {
    uint8_t *copy = ckptio__malloc(len ? len : 1);
    if (!copy) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a record");
    memcpy(copy, text, len);
    return add_entry(w, prefix, rel, len, SIZE_MAX, copy);
}

/* Collects the tensors' dotted names for the uniqueness check. */
typedef struct name_list {
    ckptio__torch_tensor *items;
    size_t n, cap;
} name_list;

static ckptio_status collect_name(void *ctx, const char *spelled, const char *name, ckptio_value *tensor) {
    (void)spelled;
    name_list *l = ctx;
    if (l->n == l->cap) {
        const size_t ncap = l->cap ? l->cap * 2 : 64;
        ckptio__torch_tensor *grown = ckptio__realloc(l->items, ncap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the tensor names");
        l->items = grown;
        l->cap = ncap;
    }
    char *copy = ckptio__strdup(name);
    if (!copy) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a tensor name");
    l->items[l->n++] = (ckptio__torch_tensor){.name = copy, .node = tensor};
    return CKPTIO_OK;
}

/* The reader names tensors by their dotted paths and refuses trees it
 * cannot name (torch_names.c); the writer refuses the same trees, so that
 * what ckptio writes it can read. */
static ckptio_status check_readable_names(ckptio_torch_writer *w) {
    name_list l = {0};
    ckptio_status st = ckptio__torch_walk_names(w->root, w->save_path, "save torch file", collect_name, &l);
    if (st == CKPTIO_OK) st = ckptio__torch_check_unique_names(w->root, l.items, l.n, w->save_path, "save torch file");
    for (size_t i = 0; i < l.n; i++) ckptio__free(l.items[i].name);
    ckptio__free(l.items);
    return st;
}

static ckptio_status build_layout(ckptio_torch_writer *w, uint32_t alignment, const char *prefix) {
    ckptio_status st = CKPTIO_OK;
    emitter e = {.w = w, .b = &w->pickle};
    CKPTIO_FORWARD(check_readable_names(w));
    e.order = ckptio__malloc((w->nstorages ? w->nstorages : 1) * sizeof *e.order);
    e.used_dtype = ckptio__malloc((w->nstorages ? w->nstorages : 1) * sizeof *e.used_dtype);
    if (!e.order || !e.used_dtype) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the save layout");
        goto out;
    }
    for (size_t i = 0; i < w->nstorages; i++) w->storages[i].entry = SIZE_MAX;
    ckptio__pickle_proto(&w->pickle);
    st = emit(&e, w->root, 0);
    if (st) goto out;
    ckptio__pickle_op(&w->pickle, CKPTIO__OP_STOP);
    if (w->pickle.failed) {
        st = ckptio_last_error()->status;
        goto out;
    }
    if (w->pickle.len > CKPTIO__TORCH_MAX_PICKLE) {
        st = CKPTIO_FAIL(CKPTIO_E_RANGE, "the object tree pickles to %zu bytes, over the %llu-byte data.pkl readers "
                                         "accept (keep large data in tensors)",
                         w->pickle.len, (unsigned long long)CKPTIO__TORCH_MAX_PICKLE);
        goto out;
    }
    const size_t n = 6 + e.nused;
    w->entries = ckptio__calloc(n, sizeof *w->entries);
    w->entry_storage = ckptio__calloc(n, sizeof *w->entry_storage);
    w->entry_bytes = ckptio__calloc(n, sizeof *w->entry_bytes);
    w->layout_prefix = ckptio__strdup(prefix);
    if (!w->entries || !w->entry_storage || !w->entry_bytes || !w->layout_prefix) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the save layout");
        goto out;
    }
    char text[32];
    int tl = snprintf(text, sizeof text, "%u", alignment);
    if ((st = add_entry(w, prefix, "data.pkl", w->pickle.len, SIZE_MAX, w->pickle.data)) ||
        (st = add_text_entry(w, prefix, ".format_version", "1", 1)) ||
        (st = add_text_entry(w, prefix, ".storage_alignment", text, (size_t)tl)) ||
        (st = add_text_entry(w, prefix, "byteorder", "little", 6)))
        goto out;
    for (size_t k = 0; k < e.nused; k++) {
        const size_t id = e.order[k];
        snprintf(text, sizeof text, "data/%zu", k);
        w->storages[id].entry = w->nentries;
        if ((st = add_entry(w, prefix, text, w->storages[id].nbytes, id, NULL))) goto out;
    }
    if ((st = add_text_entry(w, prefix, "version", "3\n", 2)) ||
        (st = add_text_entry(w, prefix, ".data/serialization_id", "0000000000000000000000000000000000000000", 40)))
        goto out;
    if ((st = ckptio__zip_layout(w->entries, w->nentries, alignment, &w->cd_offset))) goto out;
    w->file_size = w->cd_offset + ckptio__zip_trailer_len(w->entries, w->nentries);
    /* Pieces: metadata between storages, storages themselves. */
    w->pieces = ckptio__calloc(2 * e.nused + 1, sizeof *w->pieces);
    if (!w->pieces) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the save layout");
        goto out;
    }
    uint64_t pos = 0, meta = 0;
    for (size_t i = 0; i < w->nentries; i++) {
        const size_t id = w->entry_storage[i];
        if (id == SIZE_MAX) continue;
        const ckptio__zip_entry *z = &w->entries[i];
        if (z->data_offset > pos) {
            w->pieces[w->npieces++] = (struct ckptio__torch_piece){.file_offset = pos, .length = z->data_offset - pos,
                                                                   .storage = SIZE_MAX, .meta_offset = meta};
            meta += z->data_offset - pos;
        }
        if (z->size)
            w->pieces[w->npieces++] = (struct ckptio__torch_piece){.file_offset = z->data_offset, .length = z->size,
                                                                   .storage = id};
        pos = z->data_offset + z->size;
    }
    w->pieces[w->npieces++] = (struct ckptio__torch_piece){.file_offset = pos, .length = w->file_size - pos,
                                                           .storage = SIZE_MAX, .meta_offset = meta};
    w->meta_len = meta + (w->file_size - pos);
    w->layout_alignment = alignment;
    w->layout_generation = w->generation;
    w->have_layout = true;
out:
    ckptio__free(e.order);
    ckptio__free(e.used_dtype);
    if (st) free_layout(w);
    return st;
}

ckptio_status ckptio__torch_writer_prepare(ckptio_torch_writer *w, uint32_t alignment, const char *prefix) {
    if (w->have_layout && w->layout_generation == w->generation && w->layout_alignment == alignment &&
        strcmp(w->layout_prefix, prefix) == 0)
        return CKPTIO_OK;
    free_layout(w);
    return build_layout(w, alignment, prefix);
}

ckptio_status ckptio__torch_writer_prepare_for(ckptio_torch_writer *w, const ckptio_torch_save_options *options,
                                               const char *path) {
    uint32_t alignment;
    char *prefix = NULL;
    CKPTIO_FORWARD(ckptio__torch_options(options, path, &alignment, &prefix));
    w->save_path = path;
    const ckptio_status st = ckptio__torch_writer_prepare(w, alignment, prefix);
    w->save_path = NULL;
    ckptio__free(prefix); /* the layout keeps its own copy */
    return st;
}

/* Copies [file_offset, +len) of the metadata into the meta buffer. Calls
 * come in increasing file order, so *cursor only moves forward. */
static void meta_put(const ckptio_torch_writer *w, uint8_t *meta, size_t *cursor, uint64_t file_offset,
                     const uint8_t *src, uint64_t len) {
    if (!len) return;
    for (; *cursor < w->npieces; ++*cursor) {
        const struct ckptio__torch_piece *pc = &w->pieces[*cursor];
        if (pc->storage == SIZE_MAX && file_offset >= pc->file_offset &&
            file_offset + len <= pc->file_offset + pc->length) {
            memcpy(meta + pc->meta_offset + (file_offset - pc->file_offset), src, len);
            return;
        }
    }
}

void ckptio__torch_writer_fill_meta(const ckptio_torch_writer *w, uint8_t *meta) {
    uint8_t *buf = meta + w->meta_len; /* scratch space the caller allocated after the buffer */
    size_t cursor = 0;
    for (size_t i = 0; i < w->nentries; i++) {
        const ckptio__zip_entry *e = &w->entries[i];
        ckptio__zip_write_local_header(e, w->layout_alignment, buf);
        meta_put(w, meta, &cursor, e->header_offset, buf, e->data_offset - e->header_offset);
        if (w->entry_storage[i] == SIZE_MAX) meta_put(w, meta, &cursor, e->data_offset, w->entry_bytes[i], e->size);
        uint8_t desc[24];
        ckptio__zip_write_descriptor(e, desc);
        meta_put(w, meta, &cursor, e->data_offset + e->size, desc,
                 ckptio__zip_descriptor_len(e->header_offset, e->size));
    }
    const struct ckptio__torch_piece *last = &w->pieces[w->npieces - 1];
    ckptio__zip_write_trailer(w->entries, w->nentries, w->cd_offset,
                              meta + last->meta_offset + (w->cd_offset - last->file_offset));
}

ckptio_status ckptio_torch_writer_layout(ckptio_torch_writer *w, const ckptio_torch_save_options *options,
                                         uint64_t *file_size) {
    if (!w) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer must not be NULL");
    CKPTIO_FORWARD(ckptio__torch_writer_prepare_for(w, options, NULL));
    if (file_size) *file_size = w->file_size;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_writer_storage_offset(const ckptio_torch_writer *w, size_t id, uint64_t *offset,
                                                 const char **key) {
    if (!w || !offset) return CKPTIO_FAIL(CKPTIO_E_INVAL, "writer and output must not be NULL");
    if (!w->have_layout || w->layout_generation != w->generation)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "no current layout: call ckptio_torch_writer_layout first");
    if (id >= w->nstorages)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "storage id %zu out of range (%zu storages)", id, w->nstorages);
    if (w->storages[id].entry == SIZE_MAX)
        return CKPTIO_FAIL(CKPTIO_E_NOT_FOUND, "storage %zu is used by no tensor, so it is not saved", id);
    const ckptio__zip_entry *e = &w->entries[w->storages[id].entry];
    *offset = e->data_offset;
    if (key) *key = strrchr(e->name, '/') + 1;
    return CKPTIO_OK;
}
