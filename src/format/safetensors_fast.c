/*
 * safetensors_fast.c - the header shape every writer produces, parsed in
 * one pass without building a JSON tree.
 *
 * jansson builds a tree of about ten allocations per tensor and frees it
 * again: for a header of 100,000 tensors that is most of an open (0.45 s to
 * parse and 0.2-0.4 s to free on the 2-core development machine). This
 * parser reads the form the writers emit - a top-level object of names to
 * {"dtype": "..", "shape": [..], "data_offsets": [b, e]} in any field
 * order, and "__metadata__" as an object of strings - straight into the
 * entry list the validation runs on.
 *
 * It accepts a strict subset of what the full path accepts and answers
 * "not mine" for everything else: escapes in strings, unknown fields,
 * numbers that are not plain decimal integers below 10^18, a field or
 * name seen twice, a null __metadata__, any syntax it does not expect.
 * The full path (jansson, safetensors_header.c) then reads the header
 * again and says what is wrong, so every error message, and every
 * decision on a header outside that form, stays the full path's.
 * fuzz/fuzz_safetensors_header.c parses every input both ways and traps
 * on any difference.
 */
#include "safetensors_internal.h"

#include <string.h>

typedef struct cursor {
    const unsigned char *p, *end;
} cursor;

static void skip_blank(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static bool take(cursor *c, unsigned char ch) {
    skip_blank(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

static bool continuation(const unsigned char *q, size_t n) {
    for (size_t i = 1; i < n; i++)
        if ((q[i] & 0xC0) != 0x80) return false;
    return true;
}

/* Length of the well-formed UTF-8 sequence at q (no overlongs, surrogates
 * or code points past U+10FFFF, as jansson checks), 0 if it is not one. */
static size_t utf8_sequence(const unsigned char *q, const unsigned char *end) {
    const unsigned char b = q[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (b >= 0xC2 && b <= 0xDF) n = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if ((size_t)(end - q) < n || q[1] < lo || q[1] > hi || !continuation(q, n)) return 0;
    return n;
}

/* A string of plain characters (no escape, no control character) into
 * *s / *n, pointing into the JSON. */
static bool plain_string(cursor *c, const unsigned char **s, size_t *n) {
    if (!take(c, '"')) return false;
    const unsigned char *q = c->p;
    while (q < c->end) {
        const unsigned char ch = *q;
        if (ch == '"') {
            *s = c->p;
            *n = (size_t)(q - c->p);
            c->p = q + 1;
            return true;
        }
        if (ch < 0x20 || ch == '\\') return false;
        if (ch < 0x80) {
            q++;
            continue;
        }
        const size_t k = utf8_sequence(q, c->end);
        if (!k) return false;
        q += k;
    }
    return false;
}

/* A decimal integer of at most 18 digits, so below 10^18 < 2^63. */
static bool small_uint(cursor *c, uint64_t *v) {
    skip_blank(c);
    const unsigned char *q = c->p;
    if (q == c->end || *q < '0' || *q > '9') return false;
    uint64_t x = 0;
    if (*q == '0') {
        q++;
    } else {
        for (int digits = 0; q < c->end && *q >= '0' && *q <= '9'; q++)
            if (++digits > 18) return false;
            else x = x * 10 + (uint64_t)(*q - '0');
    }
    /* A fraction, an exponent or a digit after a leading 0 is for the full path. */
    if (q < c->end && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E')) return false;
    c->p = q;
    *v = x;
    return true;
}

static bool is_key(const unsigned char *s, size_t n, const char *key) {
    return n == strlen(key) && memcmp(s, key, n) == 0;
}

/* Growing arrays owned by the result; a failure marks it out of memory. */
static bool reserve(ckptio__st_parsed *out, void **items, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return true;
    size_t n = *cap ? *cap * 2 : 64;
    while (n < need) n *= 2;
    void *grown = ckptio__realloc(*items, n * size);
    if (!grown) {
        out->out_of_memory = true;
        return false;
    }
    *items = grown;
    *cap = n;
    return true;
}

/* Copies a string into the text buffer, NUL-terminated. The buffer never
 * moves, and has room: every string of the JSON has two quotes, which pay
 * for its NUL. */
static const char *keep_text(ckptio__st_parsed *out, const unsigned char *s, size_t n) {
    char *at = out->text + out->text_len;
    memcpy(at, s, n);
    at[n] = '\0';
    out->text_len += n + 1;
    return at;
}

static bool dims(cursor *c, ckptio__st_parsed *out, size_t *cap, uint32_t *ndim) {
    if (!take(c, '[')) return false;
    *ndim = 0;
    if (take(c, ']')) return true;
    do {
        uint64_t d;
        if (!small_uint(c, &d) || !reserve(out, (void **)&out->dims, cap, out->ndims + 1, sizeof *out->dims))
            return false;
        out->dims[out->ndims++] = (int64_t)d;
        (*ndim)++;
    } while (take(c, ','));
    return take(c, ']');
}

static bool entry(cursor *c, ckptio__st_parsed *out, size_t *dims_cap, ckptio__st_entry *e) {
    if (!take(c, '{')) return false;
    bool dtype = false, shape = false, offsets = false;
    e->dims = out->ndims;
    do {
        const unsigned char *k;
        size_t kn;
        if (!plain_string(c, &k, &kn) || !take(c, ':')) return false;
        if (is_key(k, kn, "dtype") && !dtype) {
            const unsigned char *v;
            size_t vn;
            if (!plain_string(c, &v, &vn) || !ckptio__st_dtype_from_name((const char *)v, vn, &e->dtype)) return false;
            dtype = true;
        } else if (is_key(k, kn, "shape") && !shape) {
            e->dims = out->ndims;
            if (!dims(c, out, dims_cap, &e->ndim)) return false;
            shape = true;
        } else if (is_key(k, kn, "data_offsets") && !offsets) {
            if (!take(c, '[') || !small_uint(c, &e->begin) || !take(c, ',') || !small_uint(c, &e->end) ||
                !take(c, ']'))
                return false;
            offsets = true;
        } else {
            return false; /* another field, or one seen twice */
        }
    } while (take(c, ','));
    return take(c, '}') && dtype && shape && offsets;
}

static bool metadata(cursor *c, ckptio__st_parsed *out, size_t *cap) {
    if (!take(c, '{')) return false;
    out->has_metadata = true;
    if (take(c, '}')) return true;
    do {
        const unsigned char *k, *v;
        size_t kn, vn;
        if (!plain_string(c, &k, &kn) || !take(c, ':') || !plain_string(c, &v, &vn) ||
            !reserve(out, (void **)&out->meta, cap, out->nmeta + 1, sizeof *out->meta))
            return false;
        ckptio__st_meta *m = &out->meta[out->nmeta++];
        m->key = keep_text(out, k, kn);
        m->key_len = kn;
        m->value = keep_text(out, v, vn);
        m->value_len = vn;
    } while (take(c, ','));
    return take(c, '}');
}

static int meta_key_cmp(const void *a, const void *b, void *unused) {
    (void)unused;
    return strcmp(((const ckptio__st_meta *)a)->key, ((const ckptio__st_meta *)b)->key);
}

/* Whether two metadata pairs share a key (sorted on a copy: the pairs keep
 * their header order). */
static bool metadata_repeats(ckptio__st_parsed *p, bool *repeats) {
    *repeats = false;
    if (p->nmeta < 2) return true;
    ckptio__st_meta *sorted = ckptio__malloc(p->nmeta * sizeof *sorted);
    if (!sorted) {
        p->out_of_memory = true;
        return false;
    }
    memcpy(sorted, p->meta, p->nmeta * sizeof *sorted);
    ckptio__sort(sorted, p->nmeta, sizeof *sorted, meta_key_cmp, NULL);
    for (size_t i = 1; i < p->nmeta && !*repeats; i++) *repeats = strcmp(sorted[i - 1].key, sorted[i].key) == 0;
    ckptio__free(sorted);
    return true;
}

ckptio__st_fast ckptio__st_parse_fast(const char *json, size_t len, ckptio__st_parsed *out) {
    memset(out, 0, sizeof *out);
    cursor c = {(const unsigned char *)json, (const unsigned char *)json + len};
    size_t entries_cap = 0, dims_cap = 0, meta_cap = 0;
    bool seen_metadata = false;
    out->text = ckptio__malloc(len + 1);
    out->out_of_memory = !out->text;
    if (!out->text || !take(&c, '{')) goto fail;
    if (!take(&c, '}')) {
        do {
            const unsigned char *k;
            size_t kn;
            if (!plain_string(&c, &k, &kn) || !take(&c, ':')) goto fail;
            if (is_key(k, kn, "__metadata__")) {
                if (seen_metadata || !metadata(&c, out, &meta_cap)) goto fail;
                seen_metadata = true;
                continue;
            }
            if (!reserve(out, (void **)&out->entries, &entries_cap, out->count + 1, sizeof *out->entries)) goto fail;
            ckptio__st_entry *e = &out->entries[out->count];
            memset(e, 0, sizeof *e);
            e->name = keep_text(out, k, kn);
            e->name_len = kn;
            e->json_index = out->count;
            if (!entry(&c, out, &dims_cap, e)) goto fail;
            out->count++;
        } while (take(&c, ','));
        if (!take(&c, '}')) goto fail;
    }
    skip_blank(&c);
    bool repeats = false;
    if (c.p == c.end && metadata_repeats(out, &repeats) && !repeats) return CKPTIO__ST_FAST_PARSED;
fail:;
    const bool out_of_memory = out->out_of_memory;
    ckptio__st_parsed_cleanup(out);
    if (!out_of_memory) return CKPTIO__ST_FAST_NOT_MINE;
    CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading a %zu-byte header", len);
    return CKPTIO__ST_FAST_NO_MEMORY;
}

void ckptio__st_parsed_cleanup(ckptio__st_parsed *p) {
    ckptio__free(p->entries);
    ckptio__free(p->dims);
    ckptio__free(p->meta);
    ckptio__free(p->text);
    memset(p, 0, sizeof *p);
}
