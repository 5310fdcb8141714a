/*
 * torch_names.c - naming the tensors of a torch.save object tree by their
 * dotted paths ("layers.0.weight"), shared by the reader (torch_read.c)
 * and the writer (torch_write.c) so that the writer refuses every tree
 * the reader would refuse: names over 64 KiB, too many paths, dict keys
 * that are tensors, and two different tensors under one name.
 *
 * A dotted name loses the key types and the nesting: {'a.b': x} and
 * {'a': {'b': y}} both name a tensor "a.b", so do {1: x} and {'1': y}.
 * ckptio's flat views (ckptio_torch_find, the Python CheckpointFile, the
 * CLI) would show one of them and hide the other; such trees are refused
 * with both paths spelled out, unless both paths hold the same view of
 * the same storage (then nothing is hidden).
 */
#include "torch_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NFAIL(n, status, subj_, ...)                                                                    \
    CKPTIO_FAIL_CTX((status),                                                                           \
                    &((ckptio__err_ctx){.operation = (n)->operation, .path = (n)->origin,               \
                                        .file_offset = -1, .subject = (subj_)}),                        \
                    __VA_ARGS__)

/* Longest spelled-out path ("['a']['b'][0]") kept for messages. */
#define MAX_SPELLED (1u << 20)

typedef struct text {
    char *s;
    size_t len, cap;
} text;

typedef struct namer {
    const char *origin, *operation;
    ckptio__torch_name_fn fn;
    void *ctx;
    text dotted;
    text spelled;                 /* only when spelling paths (collision messages) */
    bool spell;
    uint64_t visits, tensors;
} namer;

static ckptio_status text_put(namer *n, text *t, size_t limit, const char *a, size_t alen, const char *b, size_t blen,
                              const char *c, size_t clen) {
    const size_t need = t->len + alen + blen + clen + 1;
    if (need > limit)
        return NFAIL(n, CKPTIO_E_RANGE, NULL, "tensor name longer than %zu KiB (it starts '%.40s')",
                     (size_t)(CKPTIO__TORCH_MAX_NAME >> 10), n->dotted.s ? n->dotted.s : b);
    if (need > t->cap) {
        size_t ncap = t->cap ? t->cap : 256;
        while (ncap < need) ncap *= 2;
        char *grown = ckptio__realloc(t->s, ncap);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a tensor name");
        t->s = grown;
        t->cap = ncap;
    }
    memcpy(t->s + t->len, a, alen);
    memcpy(t->s + t->len + alen, b, blen);
    memcpy(t->s + t->len + alen + blen, c, clen);
    t->len += alen + blen + clen;
    t->s[t->len] = '\0';
    return CKPTIO_OK;
}

static ckptio_status walk(namer *n, ckptio_value *v);

/* Walks `child` with `seg` appended to the dotted name and, when spelling,
 * pre + seg + post to the spelled path. */
static ckptio_status walk_child(namer *n, ckptio_value *child, const char *seg, size_t seg_len, const char *pre,
                                const char *post) {
    const size_t saved = n->dotted.len, saved_spelled = n->spelled.len;
    ckptio_status st = text_put(n, &n->dotted, CKPTIO__TORCH_MAX_NAME, ".", saved ? 1 : 0, seg, seg_len, "", 0);
    if (st == CKPTIO_OK && n->spell)
        st = text_put(n, &n->spelled, MAX_SPELLED, pre, strlen(pre), seg, seg_len, post, strlen(post));
    if (st == CKPTIO_OK) st = walk(n, child);
    n->dotted.len = saved;
    if (n->dotted.s) n->dotted.s[saved] = '\0';
    n->spelled.len = saved_spelled;
    if (n->spelled.s) n->spelled.s[saved_spelled] = '\0';
    return st;
}

static ckptio_status walk(namer *n, ckptio_value *v) {
    /* Shared nodes are walked once per path; a pickle that shares nodes to
     * multiply paths exponentially is memo abuse. */
    if (++n->visits > 16 * CKPTIO__TORCH_MAX_PATHS)
        return NFAIL(n, CKPTIO_E_FORMAT, NULL, "shared objects in the pickle expand to more than %llu paths (memo abuse)",
                     (unsigned long long)(16 * CKPTIO__TORCH_MAX_PATHS));
    char seg[64];
    switch (v->kind) {
    case CKPTIO_VALUE_TENSOR:
        if (++n->tensors > CKPTIO__TORCH_MAX_PATHS)
            return NFAIL(n, CKPTIO_E_RANGE, NULL, "more than %llu tensor paths", (unsigned long long)CKPTIO__TORCH_MAX_PATHS);
        return n->fn(n->ctx, n->spell ? n->spelled.s : (n->dotted.s ? n->dotted.s : ""), n->dotted.s ? n->dotted.s : "", v);
    case CKPTIO_VALUE_LIST:
    case CKPTIO_VALUE_TUPLE:
    case CKPTIO_VALUE_SET:
        for (size_t i = 0; i < v->u.seq.len; i++) {
            const int len = snprintf(seg, sizeof seg, "%zu", i);
            CKPTIO_FORWARD(walk_child(n, v->u.seq.items[i], seg, (size_t)len, "[", "]"));
        }
        return CKPTIO_OK;
    case CKPTIO_VALUE_DICT:
        for (size_t i = 0; i + 1 < v->u.seq.len; i += 2) {
            const ckptio_value *k = v->u.seq.items[i];
            const char *key = seg, *pre = "[", *post = "]";
            size_t len;
            switch (k->kind) {
            case CKPTIO_VALUE_STR: key = k->u.s.data, len = k->u.s.len, pre = "['", post = "']"; break;
            case CKPTIO_VALUE_INT: len = (size_t)snprintf(seg, sizeof seg, "%lld", (long long)k->u.i); break;
            case CKPTIO_VALUE_BOOL: len = (size_t)snprintf(seg, sizeof seg, "%s", k->u.b ? "True" : "False"); break;
            case CKPTIO_VALUE_NONE: len = (size_t)snprintf(seg, sizeof seg, "None"); break;
            case CKPTIO_VALUE_FLOAT: len = (size_t)snprintf(seg, sizeof seg, "%.17g", k->u.f); break;
            default:
                if (k->kind >= CKPTIO__VALUE_GLOBAL || k->kind == CKPTIO_VALUE_TENSOR)
                    return NFAIL(n, CKPTIO_E_UNSUPPORTED, n->dotted.s, "dict key is a %s",
                                 k->kind == CKPTIO_VALUE_TENSOR ? "tensor" : "global or storage");
                CKPTIO_FORWARD(walk(n, (ckptio_value *)k)); /* validates nested keys (tuples) */
                len = (size_t)snprintf(seg, sizeof seg, "#%zu", i / 2);
                pre = "[<key ", post = ">]";
                break;
            }
            CKPTIO_FORWARD(walk_child(n, v->u.seq.items[i + 1], key, len, pre, post));
        }
        if (v->attrs) CKPTIO_FORWARD(walk_child(n, v->attrs, "__attrs__", 9, ".", ""));
        return CKPTIO_OK;
    case CKPTIO__VALUE_GLOBAL:
    case CKPTIO__VALUE_STORAGE:
    case CKPTIO__VALUE_STORAGE_CLASS:
        return NFAIL(n, CKPTIO_E_UNSUPPORTED, n->dotted.len ? n->dotted.s : "(root)",
                     "the object tree holds a bare %s, which ckptio cannot represent",
                     v->kind == CKPTIO__VALUE_GLOBAL ? "global" : "storage");
    default: return CKPTIO_OK;
    }
}

static ckptio_status run(ckptio_value *root, const char *origin, const char *operation, bool spell,
                         ckptio__torch_name_fn fn, void *ctx) {
    namer n = {.origin = origin, .operation = operation, .fn = fn, .ctx = ctx, .spell = spell};
    const ckptio_status st = walk(&n, root);
    ckptio__free(n.dotted.s);
    ckptio__free(n.spelled.s);
    return st;
}

ckptio_status ckptio__torch_walk_names(ckptio_value *root, const char *origin, const char *operation,
                                       ckptio__torch_name_fn fn, void *ctx) {
    return run(root, origin, operation, false, fn, ctx);
}

/* ---- one tensor per name ---------------------------------------------------------- */

/* The same bytes seen the same way: same storage (the reader's record key,
 * or the writer's storage id), dtype, offset, shape and stride. */
static bool same_view(const ckptio_value *a, const ckptio_value *b) {
    if (a == b) return true;
    const ckptio__tensor_ref *x = &a->u.tensor, *y = &b->u.tensor;
    const bool same_storage = x->storage && y->storage
                                  ? strcmp(x->storage->u.storage.key, y->storage->u.storage.key) == 0
                                  : !x->storage && !y->storage && x->writer_storage == y->writer_storage;
    return same_storage && x->dtype == y->dtype && x->ndim == y->ndim && x->storage_offset == y->storage_offset &&
           (x->ndim == 0 || (memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape) == 0 &&
                             memcmp(x->stride, y->stride, x->ndim * sizeof *x->stride) == 0));
}

static int cmp_by_name(const void *a, const void *b) {
    const ckptio__torch_tensor *x = *(const ckptio__torch_tensor *const *)a, *y = *(const ckptio__torch_tensor *const *)b;
    const int c = strcmp(x->name, y->name);
    if (c) return c;
    return x < y ? -1 : x > y; /* stable: first path first */
}

/* Spells out the paths of the two tensors named `name`. */
typedef struct spelling {
    const char *name;
    const ckptio_value *nodes[2];
    char *paths[2];
} spelling;

static ckptio_status spell_one(void *ctx, const char *spelled, const char *dotted, ckptio_value *tensor) {
    spelling *s = ctx;
    if (strcmp(dotted, s->name) != 0) return CKPTIO_OK;
    for (int i = 0; i < 2; i++)
        if (tensor == s->nodes[i] && !s->paths[i] && !(s->paths[i] = ckptio__strdup(spelled)))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a message");
    return CKPTIO_OK;
}

ckptio_status ckptio__torch_check_unique_names(ckptio_value *root, const ckptio__torch_tensor *tensors, size_t n,
                                               const char *origin, const char *operation) {
    if (n < 2) return CKPTIO_OK;
    const ckptio__torch_tensor **sorted = ckptio__malloc(n * sizeof *sorted);
    if (!sorted) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to check %zu tensor names", n);
    for (size_t i = 0; i < n; i++) sorted[i] = &tensors[i];
    qsort(sorted, n, sizeof *sorted, cmp_by_name);
    const ckptio__torch_tensor *a = NULL, *b = NULL;
    for (size_t i = 1; i < n && !a; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0 && !same_view(sorted[i - 1]->node, sorted[i]->node))
            a = sorted[i - 1], b = sorted[i];
    ckptio__free(sorted);
    if (!a) return CKPTIO_OK;
    spelling s = {.name = a->name, .nodes = {a->node, b->node}};
    ckptio_status st = run(root, origin, operation, true, spell_one, &s);
    if (st == CKPTIO_OK)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                             &((ckptio__err_ctx){.operation = operation, .path = origin, .file_offset = -1,
                                                 .subject = a->name}),
                             "two different tensors have this dotted name, at %s and at %s; ckptio names tensors "
                             "by their dotted path and could show only one of them (rename a key)",
                             s.paths[0] ? s.paths[0] : "?", s.paths[1] ? s.paths[1] : "?");
    ckptio__free(s.paths[0]);
    ckptio__free(s.paths[1]);
    return st;
}
