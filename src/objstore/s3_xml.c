/*
 * s3_xml.c - reads the XML that S3 servers answer with: errors, listings and
 * the results of multipart uploads. The bytes come from the network, so the
 * reader is strict and bounded: it never reads outside the input, nests at
 * most 16 elements, decodes only the five named entities and numeric
 * references, and refuses DOCTYPE declarations (no entity expansion of any
 * kind). fuzz/fuzz_s3_xml.c runs it on arbitrary bytes.
 */
#include "objstore_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 16
#define MAX_PATH 255

typedef struct walker {
    const char *x;
    size_t len, pos;
    char path[MAX_PATH + 1];
    size_t plen;
    size_t mark[MAX_DEPTH + 1]; /* path length before each open element */
    bool child[MAX_DEPTH + 1];  /* the element has child elements */
    unsigned depth;
    char *text;
    size_t tlen;
    bool root_seen;
    char *err;
    size_t errcap;
} walker;

static int fail(walker *w, const char *what) {
    if (w->errcap) snprintf(w->err, w->errcap, "%s at byte %zu", what, w->pos);
    return -1;
}

static bool starts(const walker *w, const char *s) {
    const size_t n = strlen(s);
    return w->len - w->pos >= n && memcmp(w->x + w->pos, s, n) == 0;
}

/* Moves past the next `end`; false when it never comes. */
static bool skip_past(walker *w, const char *end) {
    const size_t n = strlen(end);
    while (w->len - w->pos >= n) {
        if (memcmp(w->x + w->pos, end, n) == 0) {
            w->pos += n;
            return true;
        }
        w->pos++;
    }
    return false;
}

static bool space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static bool name_char(char c) {
    return !space(c) && c != '>' && c != '/' && c != '=' && c != '<' && c != '"' && c != '\'';
}

static void put_utf8(walker *w, unsigned long cp) {
    char *t = w->text + w->tlen;
    if (cp < 0x80) {
        t[0] = (char)cp;
        w->tlen += 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xc0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3f));
        w->tlen += 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xe0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[2] = (char)(0x80 | (cp & 0x3f));
        w->tlen += 3;
    } else {
        t[0] = (char)(0xf0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[3] = (char)(0x80 | (cp & 0x3f));
        w->tlen += 4;
    }
}

/* Decodes the reference at w->pos ('&') into the text. The text buffer
 * has room: a reference's UTF-8 is never longer than the reference. */
static int entity(walker *w) {
    static const struct {
        const char *name;
        char c;
    } named[] = {{"&lt;", '<'}, {"&gt;", '>'}, {"&amp;", '&'}, {"&quot;", '"'}, {"&apos;", '\''}};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (starts(w, named[i].name)) {
            w->text[w->tlen++] = named[i].c;
            w->pos += strlen(named[i].name);
            return 0;
        }
    if (!starts(w, "&#")) return fail(w, "unknown entity reference");
    size_t p = w->pos + 2;
    const bool hexd = p < w->len && w->x[p] == 'x';
    if (hexd) p++;
    unsigned long cp = 0;
    size_t digits = 0;
    for (; p < w->len && w->x[p] != ';'; p++, digits++) {
        const char c = w->x[p];
        int d = c >= '0' && c <= '9' ? c - '0' : hexd && c >= 'a' && c <= 'f' ? c - 'a' + 10
                                               : hexd && c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0 || digits >= 8) return fail(w, "malformed character reference");
        cp = cp * (hexd ? 16 : 10) + (unsigned long)d;
    }
    if (p >= w->len || !digits || cp == 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return fail(w, "malformed character reference");
    put_utf8(w, cp);
    w->pos = p + 1;
    return 0;
}

static int open_element(walker *w, const char *name, size_t n) {
    if (w->depth == 0 && w->root_seen) return fail(w, "a second root element");
    if (w->depth >= MAX_DEPTH) return fail(w, "elements nested too deep");
    const char *colon = memchr(name, ':', n);
    if (colon) {
        n -= (size_t)(colon + 1 - name);
        name = colon + 1;
    }
    if (!n) return fail(w, "an element without a name");
    if (w->plen + (w->depth ? 1 : 0) + n > MAX_PATH) return fail(w, "element path too long");
    if (w->depth) w->child[w->depth - 1] = true;
    w->mark[w->depth] = w->plen;
    if (w->depth) w->path[w->plen++] = '/';
    memcpy(w->path + w->plen, name, n);
    w->plen += n;
    w->path[w->plen] = '\0';
    w->child[w->depth] = false;
    w->depth++;
    w->root_seen = true;
    w->tlen = 0;
    return 0;
}

static int close_element(walker *w, ckptio__xml_fn fn, void *user) {
    int stop = 0;
    w->depth--;
    if (!w->child[w->depth]) {
        w->text[w->tlen] = '\0';
        stop = fn(user, w->path, w->text, w->tlen);
    }
    if (!stop) stop = fn(user, w->path, NULL, 0);
    w->plen = w->mark[w->depth];
    w->path[w->plen] = '\0';
    w->tlen = 0;
    return stop ? 1 : 0;
}

static int tag(walker *w, ckptio__xml_fn fn, void *user) {
    if (starts(w, "<?")) return skip_past(w, "?>") ? 0 : fail(w, "unterminated processing instruction");
    if (starts(w, "<!--")) return skip_past(w, "-->") ? 0 : fail(w, "unterminated comment");
    if (starts(w, "<![CDATA[")) {
        if (!w->depth) return fail(w, "character data outside the root element");
        const size_t from = w->pos + 9;
        w->pos = from;
        if (!skip_past(w, "]]>")) return fail(w, "unterminated CDATA section");
        const size_t n = w->pos - 3 - from;
        memcpy(w->text + w->tlen, w->x + from, n);
        w->tlen += n;
        return 0;
    }
    if (starts(w, "<!")) return fail(w, "a DOCTYPE or other declaration (not accepted)");
    const bool closing = starts(w, "</");
    w->pos += closing ? 2 : 1;
    const size_t name_at = w->pos;
    while (w->pos < w->len && name_char(w->x[w->pos])) w->pos++;
    const size_t name_len = w->pos - name_at;
    if (closing) {
        while (w->pos < w->len && space(w->x[w->pos])) w->pos++;
        if (w->pos >= w->len || w->x[w->pos] != '>') return fail(w, "malformed closing tag");
        w->pos++;
        if (!w->depth) return fail(w, "a closing tag without an open element");
        const char *name = w->x + name_at;
        size_t n = name_len;
        const char *colon = memchr(name, ':', n);
        if (colon) {
            n -= (size_t)(colon + 1 - name);
            name = colon + 1;
        }
        const size_t top = w->mark[w->depth - 1] + (w->depth > 1 ? 1 : 0);
        if (w->plen - top != n || memcmp(w->path + top, name, n) != 0) return fail(w, "mismatched closing tag");
        return close_element(w, fn, user);
    }
    int r = open_element(w, w->x + name_at, name_len);
    if (r) return r;
    /* Attributes: name="value" or name='value', skipped. */
    for (;;) {
        while (w->pos < w->len && space(w->x[w->pos])) w->pos++;
        if (w->pos >= w->len) return fail(w, "unterminated tag");
        const char c = w->x[w->pos];
        if (c == '>') {
            w->pos++;
            return 0;
        }
        if (c == '/') {
            if (w->pos + 1 >= w->len || w->x[w->pos + 1] != '>') return fail(w, "malformed empty-element tag");
            w->pos += 2;
            return close_element(w, fn, user);
        }
        const size_t at = w->pos;
        while (w->pos < w->len && name_char(w->x[w->pos])) w->pos++;
        if (w->pos == at) return fail(w, "malformed attribute");
        while (w->pos < w->len && space(w->x[w->pos])) w->pos++;
        if (w->pos >= w->len || w->x[w->pos] != '=') return fail(w, "attribute without a value");
        w->pos++;
        while (w->pos < w->len && space(w->x[w->pos])) w->pos++;
        if (w->pos >= w->len || (w->x[w->pos] != '"' && w->x[w->pos] != '\'')) return fail(w, "unquoted attribute");
        const char q = w->x[w->pos++];
        const char *end = memchr(w->x + w->pos, q, w->len - w->pos);
        if (!end) return fail(w, "unterminated attribute value");
        w->pos = (size_t)(end - w->x) + 1;
    }
}

int ckptio__xml_walk(const char *xml, size_t len, ckptio__xml_fn fn, void *user, char *err, size_t errcap) {
    walker w = {.x = xml, .len = len, .err = err, .errcap = errcap};
    if (errcap) err[0] = '\0';
    w.text = ckptio__malloc(len + 1);
    if (!w.text) return fail(&w, "out of memory");
    int r = 0;
    while (r == 0 && w.pos < w.len) {
        const char c = w.x[w.pos];
        if (c == '<') {
            r = tag(&w, fn, user);
        } else if (!w.depth) {
            if (!space(c) && !(c == '\xef' && w.pos == 0 && w.len >= 3 && memcmp(w.x, "\xef\xbb\xbf", 3) == 0)) {
                r = fail(&w, "text outside the root element");
            } else {
                w.pos += c == '\xef' ? 3 : 1;
            }
        } else if (c == '&') {
            r = entity(&w);
        } else {
            w.text[w.tlen++] = c;
            w.pos++;
        }
    }
    if (r == 0 && (w.depth || !w.root_seen)) r = fail(&w, w.root_seen ? "the document ends inside an element"
                                                                       : "no root element");
    ckptio__free(w.text);
    return r < 0 ? -1 : r;
}

/* ---- errors and single values ---------------------------------------------- */

typedef struct find_state {
    const char *path;
    char *out;
    size_t cap;
    bool found, cut;
} find_state;

static int find_fn(void *user, const char *path, const char *text, size_t len) {
    find_state *f = user;
    if (!text || strcmp(path, f->path) != 0) return 0;
    f->found = true;
    f->cut = len >= f->cap;
    const size_t n = len < f->cap ? len : f->cap - 1;
    memcpy(f->out, text, n);
    f->out[n] = '\0';
    return 1;
}

int ckptio__xml_find(const char *xml, size_t len, const char *path, char *out, size_t cap, bool *cut) {
    if (cap) out[0] = '\0';
    if (cut) *cut = false;
    if (!cap) return -1;
    find_state f = {.path = path, .out = out, .cap = cap};
    char err[8];
    const int r = ckptio__xml_walk(xml, len, find_fn, &f, err, sizeof err);
    if (cut) *cut = f.cut;
    if (f.found) return 0;
    return r < 0 ? -1 : 1;
}

void ckptio__xml_error(const char *xml, size_t len, char *code, size_t code_cap, char *message, size_t message_cap) {
    if (code_cap) code[0] = '\0';
    if (message_cap) message[0] = '\0';
    if (!xml || !len) return;
    if (code_cap) ckptio__xml_find(xml, len, "Error/Code", code, code_cap, NULL);
    if (message_cap) ckptio__xml_find(xml, len, "Error/Message", message, message_cap, NULL);
}

/* ---- listings ---------------------------------------------------------------- */

typedef struct list_state {
    ckptio__s3_entry_fn fn;
    void *user;
    bool url_encoded;
    bool uploads;       /* ListMultipartUploadsResult */
    char key[CKPTIO__S3_MAX_KEY + 1];
    char etag[128];
    char upload_id[1024];
    char time[64];
    uint64_t size;
    bool have_key;
    bool truncated;
    char *next;
    size_t next_cap;
    char *next_upload;
    size_t next_upload_cap;
    const char *problem;
    bool stopped;
} list_state;

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* Copies text into out (cap bytes), %-decoding (and '+' as space) when the
 * listing is URL-encoded. False when it does not fit or is malformed. */
static bool take(const list_state *s, const char *text, size_t len, char *out, size_t cap, bool decode) {
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (decode && s->url_encoded) {
            if (c == '+') {
                c = ' ';
            } else if (c == '%') {
                if (i + 2 >= len) return false;
                const int a = hexval(text[i + 1]), b = hexval(text[i + 2]);
                if (a < 0 || b < 0) return false;
                c = (char)(a * 16 + b);
                i += 2;
            }
        }
        if (k + 1 >= cap || c == '\0') return false;
        out[k++] = c;
    }
    out[k] = '\0';
    return true;
}

static bool parse_u64(const char *t, uint64_t *out) {
    uint64_t v = 0;
    if (!*t) return false;
    for (; *t; t++) {
        if (*t < '0' || *t > '9') return false;
        if (ckptio__mul_overflows(v, 10, &v) || ckptio__add_overflows(v, (uint64_t)(*t - '0'), &v)) return false;
    }
    *out = v;
    return true;
}

static const char *leaf(const char *path, const char *root) {
    const size_t n = strlen(root);
    return strncmp(path, root, n) == 0 && path[n] == '/' ? path + n + 1 : NULL;
}

static int emit(list_state *s, bool prefix) {
    if (!s->have_key) {
        s->problem = prefix ? "a CommonPrefixes entry without a Prefix" : "an entry without a Key";
        return 1;
    }
    ckptio__s3_entry e = {.key = s->key, .size = prefix ? 0 : s->size, .etag = prefix ? "" : s->etag,
                          .upload_id = s->uploads && !prefix ? s->upload_id : "", .time = prefix ? "" : s->time,
                          .is_prefix = prefix};
    const int stop = s->fn(s->user, &e);
    s->have_key = false;
    s->size = 0;
    s->etag[0] = s->upload_id[0] = s->time[0] = '\0';
    if (stop) s->stopped = true;
    return stop ? 1 : 0;
}

static int list_fn(void *user, const char *path, const char *text, size_t len) {
    list_state *s = user;
    const char *root = s->uploads ? "ListMultipartUploadsResult" : "ListBucketResult";
    const char *rest = leaf(path, root);
    if (!rest) return 0;
    const char *item = s->uploads ? "Upload" : "Contents";
    const size_t il = strlen(item);
    const bool in_item = strncmp(rest, item, il) == 0 && (rest[il] == '/' || rest[il] == '\0');
    const bool in_prefixes = strncmp(rest, "CommonPrefixes", 14) == 0 && (rest[14] == '/' || rest[14] == '\0');
    if (!text) {
        if (in_item && rest[il] == '\0') return emit(s, false);
        if (in_prefixes && rest[14] == '\0') return emit(s, true);
        return 0;
    }
    if (in_item) {
        const char *f = rest + il + 1;
        if (strcmp(f, "Key") == 0) {
            if (!take(s, text, len, s->key, sizeof s->key, true))
                return s->problem = "a key that is too long or malformed", 1;
            s->have_key = true;
        } else if (strcmp(f, "Size") == 0) {
            if (!parse_u64(text, &s->size)) return s->problem = "a Size that is not a decimal number", 1;
        } else if (strcmp(f, "ETag") == 0) {
            if (!take(s, text, len, s->etag, sizeof s->etag, false)) return s->problem = "an ETag that is too long", 1;
        } else if (strcmp(f, "UploadId") == 0) {
            if (!take(s, text, len, s->upload_id, sizeof s->upload_id, false))
                return s->problem = "an UploadId that is too long", 1;
        } else if (strcmp(f, "LastModified") == 0 || strcmp(f, "Initiated") == 0) {
            if (!take(s, text, len, s->time, sizeof s->time, false)) return s->problem = "a time that is too long", 1;
        }
    } else if (in_prefixes && strcmp(rest, "CommonPrefixes/Prefix") == 0) {
        if (!take(s, text, len, s->key, sizeof s->key, true)) return s->problem = "a prefix that is too long", 1;
        s->have_key = true;
    } else if (strcmp(rest, "IsTruncated") == 0) {
        s->truncated = strcmp(text, "true") == 0;
    } else if (strcmp(rest, s->uploads ? "NextKeyMarker" : "NextContinuationToken") == 0) {
        if (!take(s, text, len, s->next, s->next_cap, false)) return s->problem = "a marker that is too long", 1;
    } else if (s->uploads && strcmp(rest, "NextUploadIdMarker") == 0) {
        if (!take(s, text, len, s->next_upload, s->next_upload_cap, false))
            return s->problem = "an upload id marker that is too long", 1;
    }
    return 0;
}

typedef struct kind_state {
    bool bucket, uploads, url;
} kind_state;

static int kind_fn(void *user, const char *path, const char *text, size_t len) {
    kind_state *k = user;
    if (strcmp(path, "ListBucketResult") == 0) k->bucket = true;
    if (strcmp(path, "ListMultipartUploadsResult") == 0) k->uploads = true;
    if (text && (strcmp(path, "ListBucketResult/EncodingType") == 0) && strcmp(text, "url") == 0) k->url = true;
    return 0;
}

int ckptio__xml_list(const char *xml, size_t len, ckptio__s3_entry_fn fn, void *user, bool *truncated, char *next,
                     size_t next_cap, char *next_upload, size_t next_upload_cap, char *err, size_t errcap) {
    *truncated = false;
    if (next_cap) next[0] = '\0';
    if (next_upload_cap) next_upload[0] = '\0';
    /* First pass: which listing, and whether its keys are URL-encoded
     * (EncodingType may come after the entries). */
    kind_state k = {0};
    if (ckptio__xml_walk(xml, len, kind_fn, &k, err, errcap) < 0) return -1;
    if (!k.bucket && !k.uploads) {
        snprintf(err, errcap, "neither a ListBucketResult nor a ListMultipartUploadsResult");
        return -1;
    }
    list_state *s = ckptio__calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    *s = (list_state){.fn = fn, .user = user, .url_encoded = k.url, .uploads = k.uploads, .next = next,
                      .next_cap = next_cap, .next_upload = next_upload, .next_upload_cap = next_upload_cap};
    int r = ckptio__xml_walk(xml, len, list_fn, s, err, errcap);
    if (r >= 0 && s->problem) {
        snprintf(err, errcap, "%s", s->problem);
        r = -1;
    } else if (r >= 0 && s->stopped) {
        r = 1;
    } else if (r >= 0) {
        *truncated = s->truncated;
        if (s->truncated && !(next_cap && next[0])) {
            snprintf(err, errcap, "a truncated listing without the marker of its next page");
            r = -1;
        }
    }
    ckptio__free(s);
    return r;
}
