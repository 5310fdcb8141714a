/*
 * model_read.c - reading whole tensors and slices from a model
 * (ckptio_model_read), and the plan building block it rests on
 * (ckptio_plan_add_slice).
 *
 * A slice is a box of a C-contiguous tensor; src/format/slice_layout.c
 * says which runs of consecutive file bytes it covers. Each run becomes one
 * plan extent whose memory side is the next part of the destination, so
 * the bytes land in place with no copy, on the host or (through the
 * engine's GPU pipeline, which also merges nearby runs into one read) on a
 * GPU. All targets of a call share one plan.
 *
 * One case does not fit that: thousands of runs shorter than an O_DIRECT
 * block (a column of a matrix). One request per run would cost more than
 * reading the range they span, so for host destinations such slices are
 * read as their covering range, in pieces through a bounded host buffer,
 * and gathered with memcpy.
 *
 * A model of more shards than its descriptor window (model_internal.h) is
 * read a window of shards at a time instead: one plan per window, in shard
 * order, each shard's descriptors released after its window. The read
 * policy is decided once for the whole read, as for one plan, and progress
 * reports the windows as one transfer.
 */
#include "engine_internal.h"
#include "io_internal.h"
#include "model_internal.h"
#include "slice_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GATHER_MIN_RUNS 4096u      /* more runs than this ... */
#define GATHER_RUN_MAX 4096u       /* ... each shorter than this: gather (host memory) */
#define GATHER_PIECE (64u << 20)   /* bound of the gather buffer */

ckptio_status ckptio_slice_bytes(const ckptio_slice *slice, uint64_t *nbytes, uint64_t *runs) {
    ckptio__slice_runs r;
    CKPTIO_FORWARD(ckptio__slice_layout(slice, NULL, &r));
    if (nbytes) *nbytes = r.nbytes;
    if (runs) *runs = r.nruns;
    return CKPTIO_OK;
}

/* Extents collected outside a plan (a read split into windows of shards). */
typedef struct extent_list {
    ckptio_extent *v;
    size_t n, cap;
} extent_list;

static ckptio_status list_push(extent_list *l, const ckptio_extent *e) {
    if (l->n == l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 64;
        ckptio_extent *v = ckptio__realloc(l->v, cap * sizeof *v);
        if (!v) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu extents", cap);
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *e;
    return CKPTIO_OK;
}

/* Appends `e` to a list of read extents; one continuing the last in file
 * and memory lengthens it (as ckptio__plan_add_merged does in a plan). */
static ckptio_status list_push_merged(extent_list *l, const ckptio_extent *e) {
    ckptio_extent *last = l->n ? &l->v[l->n - 1] : NULL;
    if (ckptio__extent_continues(last, e)) {
        last->length += e->length;
        return CKPTIO_OK;
    }
    return list_push(l, e);
}

/* Appends the runs of `r` (a tensor at `base` in `file`) as extents, to
 * `plan` or, when it is NULL, to `list`; `merge` (reads): a run continuing
 * the last extent in file and memory lengthens it, so tensors read back to
 * back into one buffer cost the engine one extent. */
static ckptio_status add_runs_to(ckptio_plan *plan, extent_list *list, ckptio_file *file, uint64_t base,
                                 const ckptio__slice_runs *r, unsigned char *memory, ckptio_mem_kind kind,
                                 bool merge, size_t *added) {
    ckptio__slice_cursor c;
    ckptio__slice_cursor_init(r, &c);
    if (!r->run_bytes) return CKPTIO_OK;
    for (uint64_t k = 0; k < r->nruns; k++) {
        uint64_t at;
        if (ckptio__add_overflows(base, ckptio__slice_cursor_next(r, &c), &at))
            return CKPTIO_FAIL(CKPTIO_E_RANGE, "slice run %llu lies beyond the largest file offset",
                               (unsigned long long)k);
        const ckptio_extent e = {.file = file, .file_offset = at, .length = r->run_bytes,
                                 .memory = memory + k * r->run_bytes, .mem_kind = kind};
        CKPTIO_FORWARD(plan ? (merge ? ckptio__plan_add_merged(plan, &e) : ckptio_plan_add(plan, &e))
                            : merge ? list_push_merged(list, &e) : list_push(list, &e));
        if (added) (*added)++;
    }
    return CKPTIO_OK;
}

static ckptio_status add_runs(ckptio_plan *plan, ckptio_file *file, uint64_t base, const ckptio__slice_runs *r,
                              unsigned char *memory, ckptio_mem_kind kind, bool merge, size_t *added) {
    return add_runs_to(plan, NULL, file, base, r, memory, kind, merge, added);
}

ckptio_status ckptio_plan_add_slice(ckptio_plan *plan, ckptio_file *file, uint64_t file_offset,
                                    const ckptio_slice *slice, void *memory, ckptio_mem_kind mem_kind, size_t *added) {
    if (added) *added = 0;
    CKPTIO_RETURN_IF(!plan || !file, CKPTIO_E_INVAL, "ckptio_plan_add_slice: plan and file are required");
    ckptio__slice_runs r;
    CKPTIO_FORWARD(ckptio__slice_layout(slice, NULL, &r));
    CKPTIO_RETURN_IF(!memory && r.nbytes, CKPTIO_E_INVAL, "ckptio_plan_add_slice: memory is NULL for %llu bytes",
                     (unsigned long long)r.nbytes);
    return add_runs(plan, file, file_offset, &r, memory, mem_kind, false, added);
}

/* ---- ckptio_model_read ------------------------------------------------------------- */

/* The layout of a target of more than one run (a slice), and where a
 * gather has got to in it. */
typedef struct many_runs {
    ckptio__slice_runs r;
    ckptio__slice_cursor cursor; /* gather: the next run to read */
} many_runs;

/* A checked target. A target of one run (a whole tensor) keeps only the
 * scalars of its layout: the per-dimension arrays take 1.5 KiB a target,
 * which a read of 100,000 small tensors would allocate and clear. */
typedef struct prepared {
    uint64_t nbytes, nruns, run_bytes, first, span; /* as in ckptio__slice_runs */
    many_runs *many;          /* more than one run: the whole layout; else NULL */
    ckptio_file *file;
    uint64_t base;            /* file offset of the tensor's first byte */
    bool gather;
} prepared;

/* The runs of `p`: its whole layout, or `one` filled for its single run
 * (outer = 0: the per-dimension arrays are never read). */
static const ckptio__slice_runs *runs_of(const prepared *p, ckptio__slice_runs *one) {
    if (p->many) return &p->many->r;
    one->nbytes = p->nbytes;
    one->nruns = p->nruns;
    one->run_bytes = p->run_bytes;
    one->first = p->first;
    one->span = p->span;
    one->outer = 0;
    return one;
}

typedef struct span {
    uintptr_t start, end;
    size_t target;
} span;

static int cmp_span(const void *a, const void *b, void *unused) {
    (void)unused;
    const span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Destinations must not overlap: the plan would catch it for extents, not
 * for the memory gathered into after it. */
static ckptio_status check_disjoint(const ckptio_model *m, const ckptio_slice_target *t, const prepared *p,
                                    size_t count) {
    span *s = ckptio__malloc((count ? count : 1) * sizeof *s);
    if (!s) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory checking %zu targets", count);
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        if (p[i].nbytes) s[n++] = (span){(uintptr_t)t[i].data, (uintptr_t)t[i].data + p[i].nbytes, i};
    ckptio__sort(s, n, sizeof *s, cmp_span, NULL); /* in memory order already when read back to back */
    ckptio_status st = CKPTIO_OK;
    size_t reach = 0;
    for (size_t i = 1; i < n; i++) {
        if (s[i].start < s[reach].end) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = m->path, .file_offset = -1}),
                                 "targets %zu and %zu have overlapping destinations", s[reach].target < s[i].target
                                 ? s[reach].target : s[i].target, s[reach].target < s[i].target ? s[i].target
                                 : s[reach].target);
            break;
        }
        if (s[i].end > s[reach].end) reach = i;
    }
    ckptio__free(s);
    return st;
}

static ckptio_status prepare(const ckptio_model *m, const ckptio_slice_target *t, size_t i, prepared *p) {
    if (t->index >= m->count)
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.path = m->path, .file_offset = -1}),
                               "target %zu asks for tensor index %zu but the model has %zu tensors", i, t->index,
                               m->count);
    const ckptio_tensor_info *info = ckptio__model_info(m, t->index);
    const ckptio_safetensors *shard = m->shards[m->tensors[t->index].shard];
    /* What the messages call the target: formatted only when there is one
     * to write (a load of 100,000 small tensors pays for none). */
    char what[300];
    const ckptio_slice s = {.dtype = info->dtype, .ndim = info->ndim, .shape = info->shape, .start = t->start,
                            .stop = t->stop};
    ckptio__slice_runs r;
    ckptio_status st = ckptio__slice_layout(&s, NULL, &r);
    const bool bad = st != CKPTIO_OK || t->capacity < r.nbytes || (!t->data && r.nbytes);
    if (bad) {
        snprintf(what, sizeof what, "target %zu, tensor '%.256s'", i, info->name);
        if (st != CKPTIO_OK) st = ckptio__slice_layout(&s, what, &r);
    }
    if (st != CKPTIO_OK) {
        /* Re-raise with the shard's path in front. */
        const ckptio_error_info *e = ckptio_last_error();
        return CKPTIO_FAIL_CTX(st, &((ckptio__err_ctx){.path = shard->path, .file_offset = -1}), "%s", e->message);
    }
    if (t->capacity < r.nbytes)
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE,
                               &((ckptio__err_ctx){.path = shard->path, .file_offset = -1, .subject = what}),
                               "the destination has room for %llu bytes but the %s is %llu bytes",
                               (unsigned long long)t->capacity, t->start ? "slice" : "tensor",
                               (unsigned long long)r.nbytes);
    if (!t->data && r.nbytes)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                               &((ckptio__err_ctx){.path = shard->path, .file_offset = -1, .subject = what}),
                               "the destination is NULL");
    p->nbytes = r.nbytes;
    p->nruns = r.nruns;
    p->run_bytes = r.run_bytes;
    p->first = r.first;
    p->span = r.span;
    if (r.outer) {
        p->many = ckptio__malloc(sizeof *p->many);
        if (!p->many) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning target %zu", i);
        p->many->r = r;
        ckptio__slice_cursor_init(&p->many->r, &p->many->cursor);
    }
    p->file = shard->file;
    p->base = info->file_offset;
    ckptio_mem_kind kind = t->mem_kind;
    if (kind == CKPTIO_MEM_AUTO) ckptio_mem_classify(t->data, &kind, NULL);
    /* More than GATHER_MIN_RUNS runs: p->many is set. */
    p->gather = kind != CKPTIO_MEM_CUDA && r.nruns > GATHER_MIN_RUNS && r.run_bytes < GATHER_RUN_MAX;
    return CKPTIO_OK;
}

/* A piece of a gathered slice read into the buffer by the current plan. */
typedef struct piece {
    size_t target;
    uint64_t first_run, nruns;  /* runs [first_run, first_run + nruns) */
    uint64_t start;             /* tensor offset of the piece's first byte */
    size_t buf_offset;          /* where the piece sits in the buffer */
} piece;

/* Adds to `plan` the next pieces of gathered slices that fit the buffer
 * (at least one), recording them in pieces[] (*npieces). *next is the first
 * gathered target with runs left. With a window (> 0), the pieces come from
 * at most that many files. */
static ckptio_status plan_pieces(const ckptio_slice_target *t, prepared *p, size_t count, size_t *next,
                                 ckptio_plan *plan, unsigned char *buf, size_t cap, piece *pieces, size_t maxp,
                                 size_t window, size_t *npieces) {
    size_t used = 0, nfiles = 0;
    const ckptio_file *last = NULL;
    *npieces = 0;
    while (*next < count && *npieces < maxp) {
        prepared *q = &p[*next];
        if (!q->gather || q->many->cursor.done == q->nruns) {
            (*next)++;
            continue;
        }
        /* A file met again after another counts again: the count can only
         * overstate the files of the round. */
        if (window && q->file != last) {
            if (nfiles == window) break;
            nfiles++;
            last = q->file;
        }
        many_runs *g = q->many;
        piece pc = {.target = *next, .first_run = g->cursor.done, .start = g->cursor.offset, .buf_offset = used};
        uint64_t end = pc.start;
        /* Runs are in increasing file order: take them while the range fits. */
        while (g->cursor.done < g->r.nruns && g->cursor.offset + g->r.run_bytes - pc.start <= cap - used) {
            end = ckptio__slice_cursor_next(&g->r, &g->cursor) + g->r.run_bytes;
            pc.nruns++;
        }
        if (!pc.nruns) break; /* the buffer is full */
        const ckptio_extent e = {.file = q->file, .file_offset = q->base + pc.start, .length = end - pc.start,
                                 .memory = buf + used, .mem_kind = CKPTIO_MEM_HOST};
        CKPTIO_FORWARD(ckptio_plan_add(plan, &e));
        used += (size_t)(end - pc.start);
        pieces[(*npieces)++] = pc;
        (void)t;
    }
    return CKPTIO_OK;
}

static ckptio_status scatter_pieces(const ckptio_slice_target *t, const prepared *p, const unsigned char *buf,
                                    const piece *pieces, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const piece *pc = &pieces[i];
        const ckptio__slice_runs *q = &p[pc->target].many->r; /* gathered: more than one run */
        ckptio__slice_cursor c;
        ckptio__slice_cursor_init(q, &c);
        /* Position the cursor at the piece's first run (runs are equal, so the
         * mixed-radix index follows from the run number). */
        uint64_t k = pc->first_run;
        for (unsigned d = q->outer; d-- > 0;) {
            c.index[d] = k % q->count[d];
            c.offset += c.index[d] * q->stride[d];
            k /= q->count[d];
        }
        unsigned char *dst = (unsigned char *)t[pc->target].data + pc->first_run * q->run_bytes;
        for (uint64_t r = 0; r < pc->nruns; r++, dst += q->run_bytes) {
            const uint64_t off = ckptio__slice_cursor_next(q, &c);
            /* The destination may be a mapped file (ckptio__guarded_copy). */
            CKPTIO_FORWARD(ckptio__guarded_copy(dst, buf + pc->buf_offset + (off - pc->start), q->run_bytes,
                                                "a gathered slice"));
        }
    }
    return CKPTIO_OK;
}

static size_t shard_of(const ckptio_model *m, const ckptio_slice_target *t) { return m->tensors[t->index].shard; }

/* The whole-tensor and run-by-run targets of a model with a window, a
 * window of shards at a time (see the top of the file). */
static ckptio_status read_windows(ckptio_model *m, const ckptio_slice_target *t, const prepared *p, size_t count) {
    ckptio_status st = CKPTIO_OK;
    extent_list all = {0};
    /* Shard order; a counting sort keeps each shard's targets in the caller's order. */
    size_t *start = ckptio__calloc(m->nshards + 1, sizeof *start);
    size_t *sorted = ckptio__malloc((count ? count : 1) * sizeof *sorted);
    if (!start || !sorted) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu targets", count);
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        if (p[i].gather || !p[i].nbytes) continue;
        start[shard_of(m, &t[i]) + 1]++;
        n++;
    }
    for (size_t s = 0; s < m->nshards; s++) start[s + 1] += start[s];
    for (size_t i = 0; i < count; i++)
        if (!p[i].gather && p[i].nbytes) sorted[start[shard_of(m, &t[i])]++] = i;
    uint64_t total = 0;
    for (size_t k = 0; k < n && st == CKPTIO_OK; k++) {
        const size_t i = sorted[k];
        ckptio__slice_runs one;
        st = add_runs_to(NULL, &all, p[i].file, p[i].base, runs_of(&p[i], &one), t[i].data, t[i].mem_kind, true,
                         NULL);
        total += p[i].nbytes;
    }
    if (st != CKPTIO_OK || !all.n) goto out;
    /* Decided and reported as one plan of all of it would be. */
    ckptio__read_policy_hold(m->engine, all.v, all.n, total);
    ckptio__engine_progress_span_begin(m->engine, total);
    for (size_t a = 0; a < all.n && st == CKPTIO_OK;) {
        size_t b = a, files = 0; /* the next extents, from at most fd_window files */
        const ckptio_file *last = NULL;
        for (; b < all.n; b++) {
            if (all.v[b].file == last) continue;
            if (files == m->fd_window) break;
            files++;
            last = all.v[b].file;
        }
        st = ckptio_engine_execute_extents(m->engine, CKPTIO_READ, all.v + a, b - a);
        for (size_t k = a; k < b; k++) ckptio__file_release(all.v[k].file);
        a = b;
    }
    ckptio__engine_progress_span_end(m->engine);
    ckptio__read_policy_unhold(all.v, all.n);
out:
    ckptio__free(all.v);
    ckptio__free(sorted);
    ckptio__free(start);
    return st;
}

ckptio_status ckptio_model_read(ckptio_model *m, const ckptio_slice_target *targets, size_t count) {
    CKPTIO_RETURN_IF(!m, CKPTIO_E_INVAL, "ckptio_model_read: the model is NULL");
    CKPTIO_RETURN_IF(count && !targets, CKPTIO_E_INVAL, "ckptio_model_read: targets is NULL but count is %zu", count);
    ckptio_status st = CKPTIO_OK;
    ckptio_plan *plan = NULL;
    unsigned char *buf = NULL;
    piece *pieces = NULL;
    prepared *p = ckptio__calloc(count ? count : 1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory planning %zu targets", count);
    /* Every target is checked before any byte moves. */
    uint64_t gather_span = 0;
    for (size_t i = 0; st == CKPTIO_OK && i < count; i++) {
        st = prepare(m, &targets[i], i, &p[i]);
        if (st == CKPTIO_OK && p[i].gather && p[i].span > gather_span) gather_span = p[i].span;
    }
    if (st == CKPTIO_OK) st = check_disjoint(m, targets, p, count);
    if (st != CKPTIO_OK) goto out;

    size_t cap = 0, maxp = 0;
    if (gather_span) {
        cap = gather_span < GATHER_PIECE ? (size_t)gather_span : GATHER_PIECE;
        maxp = 1024;
        buf = ckptio__malloc(cap);
        pieces = ckptio__malloc(maxp * sizeof *pieces);
        if (!buf || !pieces) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a %zu-byte gather buffer", cap);
            goto out;
        }
    }
    if (m->fd_window && (st = read_windows(m, targets, p, count)) != CKPTIO_OK) goto out;
    /* Round 0 holds every direct run (without a window) and the first gather
     * pieces; further rounds only gather pieces, while any are left. */
    size_t next = 0;
    for (bool first = !m->fd_window;; first = false) {
        if ((st = ckptio_plan_create(CKPTIO_READ, &plan)) != CKPTIO_OK) goto out;
        for (size_t i = 0; first && i < count; i++) {
            ckptio__slice_runs one;
            if (!p[i].gather && (st = add_runs(plan, p[i].file, p[i].base, runs_of(&p[i], &one), targets[i].data,
                                               targets[i].mem_kind, true, NULL)) != CKPTIO_OK)
                goto out;
        }
        size_t npieces = 0;
        if (buf && (st = plan_pieces(targets, p, count, &next, plan, buf, cap, pieces, maxp, m->fd_window,
                                     &npieces)) != CKPTIO_OK)
            goto out;
        size_t extents = 0;
        ckptio__plan_count(plan, &extents);
        if (extents && (st = ckptio_engine_execute(m->engine, plan)) != CKPTIO_OK) goto out;
        if ((st = scatter_pieces(targets, p, buf, pieces, npieces)) != CKPTIO_OK) goto out;
        ckptio_plan_destroy(plan);
        plan = NULL;
        ckptio__model_release_shards(m, SIZE_MAX);
        if (!npieces) break;
    }
out:
    ckptio__model_release_shards(m, SIZE_MAX);
    ckptio_plan_destroy(plan);
    ckptio__free(pieces);
    ckptio__free(buf);
    for (size_t i = 0; i < count; i++) ckptio__free(p[i].many);
    ckptio__free(p);
    return st;
}

/* ---- ckptio_model_map ----------------------------------------------------------------- */

ckptio_status ckptio_model_map(ckptio_model *m, size_t shard, ckptio_mapping **out) {
    CKPTIO_RETURN_IF(!m || !out, CKPTIO_E_INVAL, "ckptio_model_map: model and out are required");
    *out = NULL;
    if (shard >= m->nshards)
        return CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.path = m->path, .file_offset = -1}),
                               "shard %zu out of range (the model has %zu)", shard, m->nshards);
    const ckptio_safetensors *st = m->shards[shard];
    /* A mapping holds no descriptor: a shard released for the model's window
     * of descriptors opens again to be mapped and goes again after. */
    const bool was_open = ckptio__file_is_open(st->file);
    const ckptio_status status = ckptio__file_map(st->file, st->file_size, out);
    if (m->fd_window && !was_open) ckptio__file_release(st->file);
    return status;
}
