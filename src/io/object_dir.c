/*
 * object_dir.c - s3://BUCKET/PREFIX/ as a directory for the code above the
 * file layer (format detection, model directories, DCP checkpoints,
 * checkpoint steps): what a path is, the entries under a prefix, small
 * objects read and written whole, removal.
 *
 * An object store has no directories: a "directory" is the set of keys
 * that start with PREFIX/. Its entries come from one listing with the
 * delimiter '/': objects are files, common prefixes subdirectories. Names
 * are the bytes after PREFIX/ and are checked here, once, for everyone
 * above: a key outside the prefix (a listing that does not answer the
 * question asked) fails the listing, and a name that no file could have
 * ('.', '..', empty, control bytes) is reported as OTHER, which every
 * caller refuses or skips. Nothing in a name is ever used as a local path.
 */
#include "io_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

double ckptio__iso_time(const char *t) {
    struct tm tm = {0};
    const char *end = t ? strptime(t, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
    if (!end) return -1;
    double frac = 0;
    if (*end == '.') {
        double scale = 0.1;
        for (end++; *end >= '0' && *end <= '9'; end++, scale /= 10) frac += (*end - '0') * scale;
    }
    return (double)timegm(&tm) + frac;
}

char *ckptio__path_join(const char *dir, const char *name) {
    const size_t a = strlen(dir), b = strlen(name);
    const bool slash = a > 0 && dir[a - 1] == '/';
    char *p = ckptio__malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (!slash) p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

/* A client for `url`'s bucket, and its bucket and key without trailing '/' ("" for the bucket itself). */
static ckptio_status client_for(ckptio_engine *engine, const char *url, ckptio__s3_client **c, char **bucket,
                                char **key) {
    *c = NULL;
    *bucket = *key = NULL;
    CKPTIO_RETURN_IF(!engine, CKPTIO_E_INVAL, "%s: an engine is required for objects", url);
    CKPTIO_FORWARD(ckptio__object_target(engine, url, true, c, bucket, key));
    size_t n = strlen(*key);
    while (n > 0 && (*key)[n - 1] == '/') (*key)[--n] = '\0';
    return CKPTIO_OK;
}

bool ckptio__object_plain_name(const char *name, size_t len) {
    if (len == 0 || (len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.')) return false;
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)name[i];
        if (c < 0x20 || c == 0x7f || c == '/' || c == '\\') return false;
    }
    return true;
}

typedef struct lister {
    const char *prefix; /* what the listing asked for: "KEY/" or "" and the names' start */
    size_t plen;
    size_t dlen;        /* "KEY/": what the names are relative to */
    const char *bucket;
    ckptio__object_entry_fn fn;
    void *user;
    bool outside;       /* the server listed a key outside the prefix */
    char outside_key[200];
    char *name;         /* scratch for the entry's name */
} lister;

static int list_one(void *user, const ckptio__s3_entry *e) {
    lister *l = user;
    const size_t klen = strlen(e->key);
    if (klen < l->plen || memcmp(e->key, l->prefix, l->plen) != 0) {
        l->outside = true;
        ckptio__s3_display(l->bucket, e->key, l->outside_key, sizeof l->outside_key);
        return 1;
    }
    size_t nlen = klen - l->dlen;
    if (e->is_prefix && nlen > 0 && e->key[klen - 1] == '/') nlen--;
    if (nlen == 0 && !e->is_prefix) return 0; /* the "PREFIX/" placeholder some consoles make: not an entry */
    memcpy(l->name, e->key + l->dlen, nlen);
    l->name[nlen] = '\0';
    ckptio__object_entry entry = {.name = l->name, .size = e->size, .etag = e->etag,
                                  .mtime = ckptio__iso_time(e->time)};
    if (entry.mtime < 0) entry.mtime = 0;
    if (!ckptio__object_plain_name(l->name, nlen) || memchr(e->key + l->dlen, '/', nlen))
        entry.kind = CKPTIO__PATH_OTHER;
    else
        entry.kind = e->is_prefix ? CKPTIO__PATH_DIR : CKPTIO__PATH_FILE;
    return l->fn(l->user, &entry);
}

ckptio_status ckptio__object_dir_list(ckptio_engine *engine, const char *dir, ckptio__object_entry_fn fn,
                                      void *user) {
    return ckptio__object_dir_list_starting(engine, dir, "", fn, user);
}

ckptio_status ckptio__object_dir_list_starting(ckptio_engine *engine, const char *dir, const char *start,
                                               ckptio__object_entry_fn fn, void *user) {
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(client_for(engine, dir, &c, &bucket, &key));
    size_t klen = strlen(key);
    const size_t slen = strlen(start);
    char *prefix = ckptio__malloc(klen + slen + 2);
    char *name = ckptio__malloc(CKPTIO__S3_MAX_KEY + 2);
    ckptio_status st = CKPTIO_OK;
    if (!prefix || !name) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
    } else {
        memcpy(prefix, key, klen);
        if (klen) prefix[klen++] = '/';
        memcpy(prefix + klen, start, slen + 1);
        lister l = {.prefix = prefix, .plen = klen + slen, .dlen = klen, .bucket = bucket, .fn = fn, .user = user,
                    .name = name};
        st = ckptio__s3_list(c, bucket, prefix, "/", list_one, &l);
        if (st == CKPTIO_OK && l.outside) {
            char shown[400];
            ckptio__s3_display(bucket, prefix, shown, sizeof shown);
            st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                                 &((ckptio__err_ctx){.operation = "list", .path = shown, .file_offset = -1}),
                                 "the server's listing names %s, which is not under the prefix asked for: the "
                                 "listing is refused and nothing it names is used",
                                 l.outside_key);
        }
    }
    ckptio__free(prefix);
    ckptio__free(name);
    ckptio__object_target_release(c, bucket, key);
    return st;
}

typedef struct any_entry {
    bool found;
} any_entry;

static int first_entry(void *user, const ckptio__s3_entry *e) {
    (void)e;
    ((any_entry *)user)->found = true;
    return 1;
}

ckptio_status ckptio__object_stat(ckptio_engine *engine, const char *url, ckptio__path_kind *kind, uint64_t *size) {
    *kind = CKPTIO__PATH_MISSING;
    if (size) *size = 0;
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(client_for(engine, url, &c, &bucket, &key));
    const size_t url_len = strlen(url);
    const bool as_dir = url[url_len - 1] == '/' || !*key;
    ckptio_status st = CKPTIO_OK;
    if (!as_dir) {
        uint64_t n = 0;
        char etag[128];
        ckptio__error_saved *saved = ckptio__error_save();
        st = ckptio__s3_head(c, bucket, key, &n, etag);
        if (st == CKPTIO_OK) {
            ckptio__free(saved);
            *kind = CKPTIO__PATH_FILE;
            if (size) *size = n;
            ckptio__object_target_release(c, bucket, key);
            return CKPTIO_OK;
        }
        if (st != CKPTIO_E_NOT_FOUND) {
            ckptio__free(saved);
            ckptio__object_target_release(c, bucket, key);
            return st;
        }
        ckptio__error_restore(saved);
    }
    /* A "directory": anything under KEY/ (a missing bucket fails here). */
    const size_t klen = strlen(key);
    char *prefix = ckptio__malloc(klen + 2);
    if (!prefix) {
        ckptio__object_target_release(c, bucket, key);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    memcpy(prefix, key, klen);
    prefix[klen] = klen ? '/' : '\0';
    prefix[klen + (klen ? 1 : 0)] = '\0';
    any_entry any = {0};
    st = ckptio__s3_list(c, bucket, prefix, "/", first_entry, &any);
    if (st == CKPTIO_OK && (any.found || !*key)) *kind = CKPTIO__PATH_DIR;
    if (st != CKPTIO_OK && *key) { /* the listing names the bucket only: say which object was asked for */
        char shown[400];
        ckptio__s3_display(bucket, key, shown, sizeof shown);
        st = ckptio__fail(st, __FILE__, __LINE__,
                          &((ckptio__err_ctx){.operation = "open", .path = shown, .file_offset = -1, .verbatim = true}),
                          "%s: %s", shown, ckptio_last_error_message());
    }
    ckptio__free(prefix);
    ckptio__object_target_release(c, bucket, key);
    return st;
}

ckptio_status ckptio__object_read_all(ckptio_engine *engine, const char *url, uint64_t max, void **data,
                                      size_t *len) {
    return ckptio__object_read_all_pinned(engine, url, max, data, len, NULL, 0);
}

ckptio_status ckptio__object_read_all_pinned(ckptio_engine *engine, const char *url, uint64_t max, void **data,
                                             size_t *len, char *version, size_t version_cap) {
    *data = NULL;
    *len = 0;
    if (version_cap) version[0] = '\0';
    ckptio_file *f = NULL;
    uint64_t size = 0, got = 0;
    /* The first GET opens the object and brings its first bytes (most such
     * files whole); a larger one's rest is a second GET. */
    const uint64_t window = max < CKPTIO__SMALL_WINDOW ? max + 1 : CKPTIO__SMALL_WINDOW;
    char *buf = ckptio__malloc((size_t)window + 1);
    if (!buf) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading %s", url);
    ckptio_status st = ckptio_file_open_window(engine, url, buf, window, &got, &f);
    if (st != CKPTIO_OK) {
        ckptio__free(buf);
        return st;
    }
    if (version_cap) snprintf(version, version_cap, "%s", ckptio_file_version(f));
    st = ckptio_file_size(f, &size);
    if (st == CKPTIO_OK && size > max) *len = (size_t)size;
    if (st == CKPTIO_OK && size > max)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = url, .file_offset = -1}),
                             "%llu bytes, more than the %llu a file of its kind may have", (unsigned long long)size,
                             (unsigned long long)max);
    if (st == CKPTIO_OK && size > got) {
        char *grown = ckptio__realloc(buf, (size_t)size + 1);
        if (!grown) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading %s", url);
        else st = ckptio__file_io(f, CKPTIO_READ, (buf = grown) + got, size - got, got);
    }
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_file_close(f);
    if (saved) ckptio__error_restore(saved);
    if (st != CKPTIO_OK) {
        ckptio__free(buf);
        return st;
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return CKPTIO_OK;
}

ckptio_status ckptio__object_peek_first(ckptio_engine *engine, const char *url, void *buf, uint64_t len, uint64_t *got,
                                        uint64_t *size) {
    *got = *size = 0;
    if (ckptio__object_peek_kept(engine, url, buf, len, got, size)) return CKPTIO_OK;
    unsigned char *head = ckptio__malloc((size_t)CKPTIO__PEEK_BYTES);
    if (!head) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening %s", url);
    ckptio_file *f = NULL;
    uint64_t n = 0;
    ckptio_status st = ckptio_file_open_window(engine, url, head, CKPTIO__PEEK_BYTES, &n, &f);
    if (st == CKPTIO_OK) st = ckptio_file_size(f, size);
    if (st == CKPTIO_OK) {
        ckptio__object_peek_keep(engine, url, *size, ckptio_file_version(f), head, n);
        *got = len < n ? len : n;
        if (*got) memcpy(buf, head, (size_t)*got);
    }
    if (f) {
        ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
        ckptio_file_close(f);
        if (saved) ckptio__error_restore(saved);
    }
    ckptio__free(head);
    return st;
}

ckptio_status ckptio_file_read_all(ckptio_engine *engine, const char *path, uint64_t max_bytes, void **data,
                                   size_t *len) {
    CKPTIO_RETURN_IF(!data || !len, CKPTIO_E_INVAL, "ckptio_file_read_all: data and len are required");
    *data = NULL;
    *len = 0;
    CKPTIO_RETURN_IF(!engine || !path, CKPTIO_E_INVAL, "ckptio_file_read_all: engine and path are required");
    return ckptio__object_read_all(engine, path, max_bytes, data, len);
}

void ckptio_file_data_free(void *data) { ckptio__free(data); }

ckptio_status ckptio__object_write_all(ckptio_engine *engine, const char *url, const void *data, size_t len,
                                       bool if_absent) {
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(client_for(engine, url, &c, &bucket, &key));
    ckptio__object_peek_forget(engine, url);
    const ckptio_status st = ckptio__s3_put(c, bucket, key, data, len, if_absent);
    ckptio__object_target_release(c, bucket, key);
    return st;
}

ckptio_status ckptio__object_remove(ckptio_engine *engine, const char *url) {
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(client_for(engine, url, &c, &bucket, &key));
    ckptio__object_peek_forget(engine, url);
    const ckptio_status st = ckptio__s3_delete(c, bucket, key);
    ckptio__object_target_release(c, bucket, key);
    return st;
}

ckptio_status ckptio__object_get_small(ckptio_engine *engine, const char *url, size_t max, void **data, size_t *len,
                                       double *mtime, double *server_now) {
    *data = NULL;
    *len = 0;
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(client_for(engine, url, &c, &bucket, &key));
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "GET", bucket, key, "GET");
    r.want_xml = true; /* the body, bounded, in r.xml */
    r.allow_404 = true;
    ckptio_status st = ckptio__s3_perform(&r);
    if (server_now) *server_now = r.server_date > 0 ? r.server_date : (double)time(NULL);
    if (mtime) *mtime = r.last_modified;
    char shown[400];
    ckptio__s3_display(bucket, key, shown, sizeof shown);
    if (st == CKPTIO_OK && r.http == 404)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.operation = "GET", .path = shown,
                                                                    .file_offset = -1}),
                             "no such object");
    else if (st == CKPTIO_OK && r.xml.len > max)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = shown, .file_offset = -1}),
                             "%zu bytes, more than the %zu a file of its kind may have", r.xml.len, max);
    else if (st == CKPTIO_OK && !(*data = ckptio__malloc(r.xml.len + 1)))
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) {
        if (r.xml.len) memcpy(*data, r.xml.data, r.xml.len);
        ((char *)*data)[r.xml.len] = '\0';
        *len = r.xml.len;
    }
    ckptio__s3_request_cleanup(&r);
    ckptio__object_target_release(c, bucket, key);
    return st;
}

ckptio_status ckptio__object_info(ckptio_engine *engine, const char *url, uint64_t *size, char etag[128],
                                  double *mtime, double *server_now) {
    ckptio__s3_client *c;
    char *bucket, *key;
    CKPTIO_FORWARD(client_for(engine, url, &c, &bucket, &key));
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "HEAD", bucket, key, "HEAD");
    ckptio_status st = ckptio__s3_perform(&r);
    if (server_now) *server_now = r.server_date > 0 ? r.server_date : (double)time(NULL);
    if (st == CKPTIO_OK) {
        if (size) *size = r.object_size;
        if (etag) snprintf(etag, 128, "%s", r.etag);
        if (mtime) *mtime = r.last_modified;
    }
    ckptio__s3_request_cleanup(&r);
    ckptio__object_target_release(c, bucket, key);
    return st;
}
