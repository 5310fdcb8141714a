/*
 * plan.c - plans (lists of extents) and their validation before execution.
 *
 * Validation happens once, on the caller's thread, before any byte moves:
 * a plan that would write two extents over each other, or read two extents
 * into the same memory, is a bug in the caller's layout, and a read past end
 * of file is a truncated checkpoint; both are cheaper to report up front
 * than after half the memory was overwritten.
 */
#include "engine_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

ckptio_status ckptio_plan_create(ckptio_direction dir, ckptio_plan **out) {
    CKPTIO_RETURN_IF(!out, CKPTIO_E_INVAL, "ckptio_plan_create: out is NULL");
    *out = NULL;
    CKPTIO_RETURN_IF(dir != CKPTIO_READ && dir != CKPTIO_WRITE, CKPTIO_E_INVAL,
                     "ckptio_plan_create: direction %d is neither CKPTIO_READ nor CKPTIO_WRITE", (int)dir);
    ckptio_plan *p = ckptio__calloc(1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory creating a plan");
    p->dir = dir;
    *out = p;
    return CKPTIO_OK;
}

ckptio_status ckptio_plan_destroy(ckptio_plan *p) {
    if (!p) return CKPTIO_OK;
    ckptio__free(p->ext);
    ckptio__free(p);
    return CKPTIO_OK;
}

ckptio_status ckptio_plan_add(ckptio_plan *p, const ckptio_extent *x) {
    CKPTIO_RETURN_IF(!p || !x, CKPTIO_E_INVAL, "ckptio_plan_add: plan and extent are required");
    /* Cheap checks here so that the error points at the add that was
     * wrong; the cross-extent checks wait for execution. */
    CKPTIO_RETURN_IF(!x->file, CKPTIO_E_INVAL, "extent %zu: file is NULL", p->count);
    CKPTIO_RETURN_IF(!x->memory && x->length, CKPTIO_E_INVAL, "extent %zu: memory is NULL", p->count);
    CKPTIO_RETURN_IF((unsigned)x->mem_kind > CKPTIO_MEM_AUTO, CKPTIO_E_INVAL, "extent %zu: unknown memory kind %d",
                     p->count, (int)x->mem_kind);
    uint64_t end, total;
    if (ckptio__add_overflows(x->file_offset, x->length, &end) || end > (uint64_t)INT64_MAX)
        return CKPTIO_FAIL(CKPTIO_E_RANGE,
                           "extent %zu: file range at %llu of %llu bytes is beyond the largest file offset", p->count,
                           (unsigned long long)x->file_offset, (unsigned long long)x->length);
    if (ckptio__add_overflows((uint64_t)(uintptr_t)x->memory, x->length, &end))
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "extent %zu: memory range wraps around the address space", p->count);
    if (ckptio__add_overflows(p->total, x->length, &total))
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "extent %zu: plan total overflows", p->count);
    if (p->count == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        ckptio_extent *e = ckptio__realloc(p->ext, cap * sizeof *e);
        if (!e) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory growing a plan to %zu extents", cap);
        p->ext = e;
        p->cap = cap;
    }
    p->ext[p->count++] = *x;
    p->total = total;
    return CKPTIO_OK;
}

ckptio_status ckptio__plan_add_merged(ckptio_plan *p, const ckptio_extent *x) {
    if (p && x && p->count && p->dir == CKPTIO_READ && x->length) {
        ckptio_extent *last = &p->ext[p->count - 1];
        uint64_t total;
        if (ckptio__extent_continues(last, x) && !ckptio__add_overflows(p->total, x->length, &total) &&
            last->length + x->length >= last->length && x->file_offset + x->length <= (uint64_t)INT64_MAX) {
            last->length += x->length;
            p->total = total;
            return CKPTIO_OK;
        }
    }
    return ckptio_plan_add(p, x);
}

ckptio_status ckptio__plan_count(const ckptio_plan *p, size_t *out) {
    CKPTIO_RETURN_IF(!p || !out, CKPTIO_E_INVAL, "ckptio__plan_count: plan and out are required");
    *out = p->count;
    return CKPTIO_OK;
}

ckptio_status ckptio__plan_total_bytes(const ckptio_plan *p, uint64_t *out) {
    CKPTIO_RETURN_IF(!p || !out, CKPTIO_E_INVAL, "ckptio__plan_total_bytes: plan and out are required");
    *out = p->total;
    return CKPTIO_OK;
}

/* ---- validation --------------------------------------------------------- */

typedef struct span {
    uintptr_t group; /* file (write plans) or 0 (read plans: one address space) */
    uint64_t start, end;
    size_t index;
} span;

static int span_cmp(const void *a, const void *b, void *unused) {
    (void)unused;
    const span *x = a, *y = b;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static ckptio_status check_overlaps(const ckptio_plan *p) {
    size_t n = 0;
    for (size_t i = 0; i < p->count; i++) n += p->ext[i].length != 0;
    if (n < 2) return CKPTIO_OK;
    span *s = ckptio__malloc(n * sizeof *s);
    if (!s) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory checking %zu extents for overlaps", n);
    const bool write = p->dir == CKPTIO_WRITE;
    size_t k = 0;
    for (size_t i = 0; i < p->count; i++) {
        const ckptio_extent *x = &p->ext[i];
        if (!x->length) continue;
        const uint64_t start = write ? x->file_offset : (uint64_t)(uintptr_t)x->memory;
        s[k++] = (span){.group = write ? (uintptr_t)x->file : 0, .start = start, .end = start + x->length, .index = i};
    }
    ckptio__sort(s, n, sizeof *s, span_cmp, NULL); /* often in order already: a column slice's rows */
    ckptio_status st = CKPTIO_OK;
    /* `reach` is the span reaching furthest so far in this group: a long
     * extent can overlap one that is not its sorted neighbour. */
    size_t reach = 0;
    for (size_t i = 1; i < n; i++) {
        if (s[i].group != s[reach].group) {
            reach = i;
            continue;
        }
        if (s[i].start < s[reach].end) {
            const size_t a = s[reach].index < s[i].index ? s[reach].index : s[i].index;
            const size_t b = s[reach].index < s[i].index ? s[i].index : s[reach].index;
            const ckptio_extent *xa = &p->ext[a], *xb = &p->ext[b];
            if (write)
                st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                                     &((ckptio__err_ctx){.path = ckptio_file_path(xa->file),
                                                         .file_offset = (int64_t)s[i].start}),
                                     "extents %zu and %zu of a write plan overlap in the file: [%llu, %llu) and "
                                     "[%llu, %llu)",
                                     a, b, (unsigned long long)xa->file_offset,
                                     (unsigned long long)(xa->file_offset + xa->length),
                                     (unsigned long long)xb->file_offset,
                                     (unsigned long long)(xb->file_offset + xb->length));
            else
                st = CKPTIO_FAIL(CKPTIO_E_INVAL,
                                 "extents %zu and %zu of a read plan overlap in memory: %p+%llu and %p+%llu", a, b,
                                 xa->memory, (unsigned long long)xa->length, xb->memory,
                                 (unsigned long long)xb->length);
            break;
        }
        if (s[i].end > s[reach].end) reach = i;
    }
    ckptio__free(s);
    return st;
}

ckptio_status ckptio__plan_validate(ckptio_engine *engine, const ckptio_plan *p) {
    const ckptio_file *prev = NULL;
    uint64_t size = 0;
    for (size_t i = 0; i < p->count; i++) {
        const ckptio_extent *x = &p->ext[i];
        if (x->file == prev) goto range;
        prev = x->file;
        if (x->file->engine != engine)
            return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = x->file->path, .file_offset = -1}),
                                   "extent %zu: the file was opened with a different engine", i);
        char subject[48];
        snprintf(subject, sizeof subject, "extent %zu", i);
        CKPTIO_FORWARD(ckptio__file_check_transfer(x->file, p->dir, subject));
        if (p->dir == CKPTIO_READ && x->file->object) {
            CKPTIO_FORWARD(ckptio_file_size(x->file, &size));
        } else if (p->dir == CKPTIO_READ) {
            struct stat sb;
            if (fstat(x->file->fd, &sb) < 0)
                return CKPTIO_FAIL_SYS(errno, "fstat", x->file->path, -1, "extent %zu: reading the file size", i);
            size = (uint64_t)sb.st_size;
        }
    range:
        if (x->length && ckptio__mapped_check(x->memory, x->length, NULL) != CKPTIO_OK) {
            /* Memory in a mapped file that lost its bytes: again, naming the extent. */
            char what[48];
            snprintf(what, sizeof what, "extent %zu", i);
            return ckptio__mapped_check(x->memory, x->length, what);
        }
        if (p->dir == CKPTIO_READ && x->length && x->file_offset + x->length > size)
            return CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED,
                                   &((ckptio__err_ctx){.operation = "read", .path = x->file->path,
                                                       .file_offset = (int64_t)(size > x->file_offset
                                                                                ? size
                                                                                : x->file_offset)}),
                                   "extent %zu needs bytes [%llu, %llu) but the file has only %llu bytes", i,
                                   (unsigned long long)x->file_offset,
                                   (unsigned long long)(x->file_offset + x->length), (unsigned long long)size);
    }
    return check_overlaps(p);
}

/* ---- observers ------------------------------------------------------------ */

ckptio_status ckptio__plan_set_observer(ckptio_plan *p, ckptio__observe_fn fn, void *user, uint64_t block) {
    CKPTIO_RETURN_IF(!p, CKPTIO_E_INVAL, "ckptio__plan_set_observer: plan is NULL");
    CKPTIO_RETURN_IF(fn && p->dir != CKPTIO_WRITE, CKPTIO_E_INVAL,
                     "an observer sees the bytes a plan writes; this is a read plan");
    p->observer = (ckptio__observer){.fn = fn, .user = fn ? user : NULL, .block = fn ? block : 0};
    return CKPTIO_OK;
}

void ckptio__observe_range(const ckptio__observer *obs, size_t index, const ckptio_extent *x, uint64_t lo,
                           uint64_t hi, const void *bytes) {
    const size_t extent = obs->index ? obs->index[index] : index;
    const unsigned char *b = bytes;
    uint64_t off = lo - x->file_offset;
    const uint64_t end = hi - x->file_offset;
    while (off < end) {
        uint64_t next = end;
        if (obs->block) {
            const uint64_t boundary = (off / obs->block + 1) * obs->block;
            if (boundary < next) next = boundary;
        }
        obs->fn(obs->user, extent, off, b, next - off);
        b += next - off;
        off = next;
    }
}
