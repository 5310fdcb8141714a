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
/* Bytes of all tensor names together (a tensor shared along many paths has a
 * name per path: the flat view's size, bounded before it is built). */
#define MAX_NAME_BYTES (256ull << 20)
/* Tensor paths allowed per reference to a tensor in the pickle (plus 1024):
 * the expanded tree stays within a small multiple of the graph. */
#define SHARED_PATHS_PER_REF 16u
/* Longest path kept to name where pass 1 refused something. */
#define WHERE_MAX 1024u

typedef struct text {
    char *s;
    size_t len, cap;
} text;

/* A container's entry in the walk's memo: the tensor paths below it
 * (saturated past CKPTIO__TORCH_MAX_PATHS) and the positions of its items
 * that have any (dict: 2i key, 2i+1 value; ATTRS_POS the attributes). */
#define ATTRS_POS SIZE_MAX
typedef struct node_entry {
    const ckptio_value *node;
    uint64_t paths;
    size_t *live;
    size_t nlive;
} node_entry;

typedef struct node_memo {
    node_entry *slots;
    size_t cap, count;          /* cap: a power of two */
} node_memo;

typedef struct namer {
    const char *origin, *operation;
    ckptio__torch_name_fn fn;
    void *ctx;
    text dotted;
    text spelled;                 /* only when spelling paths (collision messages) */
    text where;                   /* pass 1: the path being checked, cut at WHERE_MAX (messages) */
    bool spell;
    uint64_t tensors, name_bytes;
    uint64_t tensor_refs;         /* pass 1: references to tensors in the graph (items of containers) */
    node_memo memo;
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

/* ---- the memo: one entry per container, so shared nodes cost once ---------------- */

static size_t slot_of(const node_memo *m, const ckptio_value *v) {
    size_t h = (size_t)((uintptr_t)v >> 4) * (size_t)0x9E3779B97F4A7C15ull;
    size_t i = h & (m->cap - 1);
    while (m->slots[i].node && m->slots[i].node != v) i = (i + 1) & (m->cap - 1);
    return i;
}

static const node_entry *memo_find(const node_memo *m, const ckptio_value *v) {
    if (!m->cap) return NULL;
    const node_entry *e = &m->slots[slot_of(m, v)];
    return e->node ? e : NULL;
}

static ckptio_status memo_add(node_memo *m, const node_entry *e) {
    if (2 * (m->count + 1) > m->cap) {
        node_memo grown = {.cap = m->cap ? 2 * m->cap : 64};
        if (!(grown.slots = ckptio__calloc(grown.cap, sizeof *grown.slots)))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to walk the object tree");
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].node) grown.slots[slot_of(&grown, m->slots[i].node)] = m->slots[i];
        grown.count = m->count;
        ckptio__free(m->slots);
        *m = grown;
    }
    m->slots[slot_of(m, e->node)] = *e;
    m->count++;
    return CKPTIO_OK;
}

static void memo_free(node_memo *m) {
    for (size_t i = 0; i < m->cap; i++) ckptio__free(m->slots[i].live);
    ckptio__free(m->slots);
}

/* The name segment of dict item `pos` (a value: odd) keyed by k: the key's
 * text for str, int, bool, None and float keys, "#i" for others. */
typedef struct segment {
    char buf[64];
    const char *text, *pre, *post;
    size_t len;
} segment;

static void key_segment(const ckptio_value *k, size_t pos, segment *g) {
    g->text = g->buf, g->pre = "[", g->post = "]";
    switch (k->kind) {
    case CKPTIO_VALUE_STR: g->text = k->u.s.data, g->len = k->u.s.len, g->pre = "['", g->post = "']"; break;
    case CKPTIO_VALUE_INT: g->len = (size_t)snprintf(g->buf, sizeof g->buf, "%lld", (long long)k->u.i); break;
    case CKPTIO_VALUE_BOOL: g->len = (size_t)snprintf(g->buf, sizeof g->buf, "%s", k->u.b ? "True" : "False"); break;
    case CKPTIO_VALUE_NONE: g->len = (size_t)snprintf(g->buf, sizeof g->buf, "None"); break;
    case CKPTIO_VALUE_FLOAT: g->len = (size_t)snprintf(g->buf, sizeof g->buf, "%.17g", k->u.f); break;
    default:
        g->len = (size_t)snprintf(g->buf, sizeof g->buf, "#%zu", pos / 2);
        g->pre = "[<key ", g->post = ">]";
        break;
    }
}

/* ---- pass 1: check every node once and count the tensor paths ----------------------- */

static bool is_container(const ckptio_value *v) {
    return v->kind == CKPTIO_VALUE_LIST || v->kind == CKPTIO_VALUE_TUPLE || v->kind == CKPTIO_VALUE_SET ||
           v->kind == CKPTIO_VALUE_DICT;
}

static ckptio_status count_paths(namer *n, const ckptio_value *v, uint64_t *paths);

/* Counts item `pos` of container v into e (its paths, and its position when it has any). */
static ckptio_status count_item(namer *n, const ckptio_value *v, size_t pos, node_entry *e, size_t *cap) {
    const ckptio_value *item = pos == ATTRS_POS ? v->attrs : v->u.seq.items[pos];
    segment g = {.text = "__attrs__", .len = 9};
    if (pos != ATTRS_POS && v->kind == CKPTIO_VALUE_DICT && pos % 2) key_segment(v->u.seq.items[pos - 1], pos, &g);
    else if (pos != ATTRS_POS && v->kind != CKPTIO_VALUE_DICT)
        g.text = g.buf, g.len = (size_t)snprintf(g.buf, sizeof g.buf, "%zu", pos);
    else if (pos != ATTRS_POS) g.len = 0; /* a key: checked under the dict's path */
    const size_t saved = n->where.len;
    if (g.len && saved + g.len + 1 < WHERE_MAX) {
        ckptio_status st = text_put(n, &n->where, WHERE_MAX, ".", saved ? 1 : 0, g.text, g.len, "", 0);
        if (st != CKPTIO_OK) return st;
    }
    uint64_t p = 0;
    if (item->kind == CKPTIO_VALUE_TENSOR) n->tensor_refs++;
    ckptio_status st = count_paths(n, item, &p);
    n->where.len = saved;
    if (n->where.s) n->where.s[saved] = '\0';
    CKPTIO_FORWARD(st);
    if (!p) return CKPTIO_OK;
    if (e->nlive == *cap) {
        *cap = *cap ? 2 * *cap : 4;
        size_t *grown = ckptio__realloc(e->live, *cap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory to walk the object tree");
        e->live = grown;
    }
    e->live[e->nlive++] = pos;
    e->paths = e->paths + p > CKPTIO__TORCH_MAX_PATHS ? CKPTIO__TORCH_MAX_PATHS + 1 : e->paths + p;
    return CKPTIO_OK;
}

/* Checks v and everything below it (what neither the reader nor the writer
 * accepts) and sets *paths to the number of tensor paths below it. Each
 * container is checked once however often it is shared (the memo), so this
 * is linear in the size of the graph, not of the tree it expands to.
 * Messages name the first path that reached v. */
static ckptio_status count_paths(namer *n, const ckptio_value *v, uint64_t *paths) {
    const char *where = n->where.len ? n->where.s : "(root)";
    *paths = 0;
    if (v->kind == CKPTIO_VALUE_TENSOR) {
        *paths = 1;
        return CKPTIO_OK;
    }
    if (v->kind == CKPTIO__VALUE_GLOBAL || v->kind == CKPTIO__VALUE_STORAGE || v->kind == CKPTIO__VALUE_STORAGE_CLASS)
        return NFAIL(n, CKPTIO_E_UNSUPPORTED, where, "the object tree holds a bare %s, which ckptio cannot represent",
                     v->kind == CKPTIO__VALUE_GLOBAL ? "global" : "storage");
    if (!is_container(v)) return CKPTIO_OK;
    const node_entry *seen = memo_find(&n->memo, v);
    if (seen) {
        *paths = seen->paths;
        return CKPTIO_OK;
    }
    node_entry e = {.node = v};
    size_t cap = 0;
    ckptio_status st = CKPTIO_OK;
    if (v->kind != CKPTIO_VALUE_DICT) {
        for (size_t i = 0; i < v->u.seq.len && st == CKPTIO_OK; i++) st = count_item(n, v, i, &e, &cap);
    } else {
        for (size_t i = 0; i + 1 < v->u.seq.len && st == CKPTIO_OK; i += 2) {
            const ckptio_value *k = v->u.seq.items[i];
            if (k->kind >= CKPTIO__VALUE_GLOBAL || k->kind == CKPTIO_VALUE_TENSOR)
                st = NFAIL(n, CKPTIO_E_UNSUPPORTED, where, "dict key is a %s",
                           k->kind == CKPTIO_VALUE_TENSOR ? "tensor" : "global or storage");
            if (st == CKPTIO_OK) st = count_item(n, v, i, &e, &cap); /* checks nested keys (tuples) */
            if (st == CKPTIO_OK) st = count_item(n, v, i + 1, &e, &cap);
        }
        if (st == CKPTIO_OK && v->attrs) st = count_item(n, v, ATTRS_POS, &e, &cap);
    }
    if (st == CKPTIO_OK) st = memo_add(&n->memo, &e);
    if (st != CKPTIO_OK) {
        ckptio__free(e.live);
        return st;
    }
    *paths = e.paths;
    return CKPTIO_OK;
}

/* ---- pass 2: name the tensors, along the items that hold any --------------------------- */

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

/* Item `pos` of dict v under its key's name. */
static ckptio_status walk_dict_item(namer *n, ckptio_value *v, size_t pos) {
    if (pos == ATTRS_POS) return walk_child(n, v->attrs, "__attrs__", 9, ".", "");
    if (pos % 2 == 0) return walk(n, v->u.seq.items[pos]); /* tensors inside a tuple key: the dict's name */
    segment g;
    key_segment(v->u.seq.items[pos - 1], pos, &g);
    return walk_child(n, v->u.seq.items[pos], g.text, g.len, g.pre, g.post);
}

static ckptio_status walk(namer *n, ckptio_value *v) {
    if (v->kind == CKPTIO_VALUE_TENSOR) {
        if (++n->tensors > CKPTIO__TORCH_MAX_PATHS)
            return NFAIL(n, CKPTIO_E_RANGE, NULL, "more than %llu tensor paths",
                         (unsigned long long)CKPTIO__TORCH_MAX_PATHS);
        n->name_bytes += n->dotted.len + 1;
        if (n->name_bytes > MAX_NAME_BYTES)
            return NFAIL(n, CKPTIO_E_RANGE, NULL, "the names of the %llu tensor paths take more than %llu MiB "
                         "(a tensor shared along many long paths)", (unsigned long long)n->tensors,
                         (unsigned long long)(MAX_NAME_BYTES >> 20));
        return n->fn(n->ctx, n->spell ? n->spelled.s : (n->dotted.s ? n->dotted.s : ""),
                     n->dotted.s ? n->dotted.s : "", v);
    }
    const node_entry *e = memo_find(&n->memo, v);
    for (size_t j = 0; e && j < e->nlive; j++) {
        const size_t pos = e->live[j];
        if (v->kind == CKPTIO_VALUE_DICT) {
            CKPTIO_FORWARD(walk_dict_item(n, v, pos));
        } else {
            char seg[32];
            const int len = snprintf(seg, sizeof seg, "%zu", pos);
            CKPTIO_FORWARD(walk_child(n, v->u.seq.items[pos], seg, (size_t)len, "[", "]"));
        }
    }
    return CKPTIO_OK;
}

static ckptio_status run(ckptio_value *root, const char *origin, const char *operation, bool spell,
                         ckptio__torch_name_fn fn, void *ctx) {
    namer n = {.origin = origin, .operation = operation, .fn = fn, .ctx = ctx, .spell = spell};
    uint64_t paths = 0;
    ckptio_status st = count_paths(&n, root, &paths);
    /* Sharing a container names its tensors once per path; a pickle does that
     * a few times at most, not 2^k times for k shared levels. */
    if (st == CKPTIO_OK && (paths > CKPTIO__TORCH_MAX_PATHS || paths > SHARED_PATHS_PER_REF * n.tensor_refs + 1024))
        st = NFAIL(&n, CKPTIO_E_RANGE, NULL, "shared objects in the pickle name its %llu tensor references along "
                   "%s%llu paths (at most %u per reference and %llu in all)", (unsigned long long)n.tensor_refs,
                   paths > CKPTIO__TORCH_MAX_PATHS ? "more than " : "",
                   (unsigned long long)(paths > CKPTIO__TORCH_MAX_PATHS ? CKPTIO__TORCH_MAX_PATHS : paths),
                   SHARED_PATHS_PER_REF, (unsigned long long)CKPTIO__TORCH_MAX_PATHS);
    if (st == CKPTIO_OK) st = walk(&n, root);
    memo_free(&n.memo);
    ckptio__free(n.where.s);
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
    const ckptio__torch_tensor *x = *(const ckptio__torch_tensor *const *)a,
                               *y = *(const ckptio__torch_tensor *const *)b;
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
