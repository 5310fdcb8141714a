/*
 * object_file.c - s3://BUCKET/KEY opened as a ckptio_file.
 *
 * Reading: open asks the server for the object's size and ETag (HEAD; an
 * open with the first bytes, ckptio_file_open_window, has the GET of them
 * tell both; a listing's open, or one after a probe's GET, sends nothing);
 * every read is a ranged GET into the caller's memory that names that ETag
 * (If-Match), so an object replaced while it is read fails with
 * CKPTIO_E_STALE instead of mixing two versions. The engine's workers keep
 * many GETs in flight (io_object.c); ckptio__file_io() reads synchronously.
 *
 * Writing: the object's commit protocol is the multipart upload's
 * (src/objstore/s3_upload.c): writes fill part buffers that are uploaded in
 * parallel, ckptio_file_commit() completes the upload and only then does
 * the object exist (or, replaced, change) on the server; an error, a cancel
 * of the engine's transfer and a close without commit abort the upload, so
 * the object and any older version of it stay as they were. There is no
 * temporary name and no rename: the server makes the object appear at once.
 *
 * Local files pay nothing for this: file.c branches on `object` only in
 * open, commit, close, size and truncate, and the backends only look at
 * op->object.
 */
#include "io_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

struct ckptio__object {
    ckptio__s3_client *client;
    char *bucket, *key;
    bool write;
    uint64_t size;     /* read: the object's size */
    char etag[128];    /* read: the ETag at open */
    ckptio__s3_upload *upload;
    bool exclusive;    /* write: no object may exist at commit */
};

void ckptio__object_settings(const ckptio_engine *engine, ckptio__s3_settings *out) {
    *out = (ckptio__s3_settings){
        .concurrency = (unsigned)ckptio__io_engine_setting(engine, CKPTIO_OPT_S3_CONCURRENCY),
        .part_bytes = (uint64_t)ckptio__io_engine_setting(engine, CKPTIO_OPT_S3_PART_BYTES),
        .retries = (unsigned)ckptio__io_engine_setting(engine, CKPTIO_OPT_S3_RETRIES),
        .timeout_ms = (unsigned)ckptio__io_engine_setting(engine, CKPTIO_OPT_S3_TIMEOUT_MS),
        .deadline_ms = (unsigned)ckptio__io_engine_setting(engine, CKPTIO_OPT_S3_DEADLINE_MS),
        .backoff_ms = (unsigned)ckptio__io_engine_setting(engine, CKPTIO_OPT_S3_BACKOFF_MS),
    };
}

ckptio_status ckptio__object_client(const ckptio_engine *engine, const char *bucket, ckptio__s3_client **out) {
    ckptio__s3_settings s;
    ckptio__object_settings(engine, &s);
    return ckptio__s3_client_create(&s, bucket, out);
}

ckptio_status ckptio__object_target(const ckptio_engine *engine, const char *url, bool allow_empty_key,
                                    ckptio__s3_client **client, char **bucket, char **key) {
    *client = NULL;
    *bucket = *key = NULL;
    CKPTIO_FORWARD(ckptio__s3_parse_url(url, allow_empty_key, bucket, key));
    const ckptio_status st = ckptio__object_client(engine, *bucket, client);
    if (st != CKPTIO_OK) {
        ckptio__object_target_release(NULL, *bucket, *key);
        *bucket = *key = NULL;
    }
    return st;
}

void ckptio__object_target_release(ckptio__s3_client *client, char *bucket, char *key) {
    ckptio__s3_client_destroy(client);
    ckptio__free(bucket);
    ckptio__free(key);
}

ckptio_status ckptio__object_server(const ckptio_engine *engine, const char *url, char *out, size_t cap) {
    ckptio__s3_client *client = NULL;
    char *bucket = NULL, *key = NULL;
    CKPTIO_FORWARD(ckptio__object_target(engine, url, true, &client, &bucket, &key));
    const int n = snprintf(out, cap, "%s://%s%s %s %s", client->scheme, client->host, client->base_path,
                           client->addressing == CKPTIO__S3_PATH_STYLE ? "path" : "virtual", bucket);
    ckptio__object_target_release(client, bucket, key);
    CKPTIO_RETURN_IF(n < 0 || (size_t)n >= cap, CKPTIO_E_INVAL, "%s: the endpoint's name is too long", url);
    return CKPTIO_OK;
}

static void object_free(ckptio__object *o) {
    if (!o) return;
    ckptio__s3_client_destroy(o->client);
    ckptio__free(o->bucket);
    ckptio__free(o->key);
    ckptio__free(o);
}

/* Whether an object exists now (a failure to tell is an error). */
static ckptio_status object_exists(const ckptio__object *o, bool *exists) {
    uint64_t size;
    char etag[128];
    ckptio__error_saved *saved = ckptio__error_save();
    const ckptio_status st = ckptio__s3_head(o->client, o->bucket, o->key, &size, etag);
    *exists = st == CKPTIO_OK;
    if (st == CKPTIO_E_NOT_FOUND) {
        ckptio__error_restore(saved);
        return CKPTIO_OK;
    }
    ckptio__free(saved);
    return st == CKPTIO_OK ? CKPTIO_OK : st;
}

/* The HEAD of a read's open answered by a GET of the object's first `len`
 * bytes into `buf`: size from its Content-Range, ETag from its header. Only
 * an answer whose bytes all came in one attempt stands for it (bytes from
 * two attempts without If-Match could be two versions); *got says how many
 * bytes of `buf` it filled (min(len, size)), 0 when it cannot stand for the
 * HEAD. An empty object answers 416, which leaves the open to the HEAD. */
static ckptio_status open_by_window(ckptio__object *o, void *buf, uint64_t len, uint64_t *got) {
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, o->client, "GET", o->bucket, o->key, "GET");
    r.ranged = true;
    r.range_len = r.dst_len = len;
    r.dst = buf;
    r.up_to = true;
    ckptio__error_saved *saved = ckptio__error_save();
    ckptio_status st = ckptio__s3_perform(&r);
    if (st == CKPTIO_E_TRUNCATED && r.http == 416) {
        ckptio__error_restore(saved); /* nothing at byte 0: the HEAD says what the object is */
        saved = NULL;
        st = CKPTIO_OK;
    }
    ckptio__free(saved);
    const uint64_t want = r.has_object_size && r.object_size < len ? r.object_size : len;
    const bool whole = st == CKPTIO_OK && r.has_object_size && r.etag[0] && r.received == r.attempt_received &&
                       r.received == want;
    *got = whole ? want : 0;
    if (whole) {
        o->size = r.object_size;
        snprintf(o->etag, sizeof o->etag, "%s", r.etag);
    }
    ckptio__s3_request_cleanup(&r);
    return st;
}

/* ---- a probe's GET kept for the open after it ------------------------------------
 *
 * A reader that decides by a path's first bytes (the format probe, a model's
 * look whether a path is an object or a prefix) and then opens it would send
 * a request for each. The probe's answer (size, ETag, first bytes) stays on
 * the engine in one slot, and the next open of the same path for reading
 * takes it: that open is pinned to the ETag as if it had sent the GET itself,
 * so an object replaced in between fails its reads with CKPTIO_E_STALE, as
 * one replaced after the open does. A record older than PEEK_KEEP_S seconds
 * is not used: the open that follows a probe comes at once, and an older
 * record would pin a version the caller may have replaced since. Writes and
 * deletes through the engine drop the record of their path. The slot is one
 * atomic pointer: taking a record is an exchange, so two threads never share
 * one, and no lock is held across fork(). */
#define PEEK_KEEP_S 5.0

struct ckptio__object_peek {
    char *url;
    uint64_t size, len;
    char etag[128];
    double at; /* ckptio__now() when the answer came */
    unsigned char bytes[];
};

void ckptio__object_peek_free(ckptio__object_peek *p) {
    if (!p) return;
    ckptio__free(p->url);
    ckptio__free(p);
}

/* Puts `p` into the slot if it is empty; a record put there meanwhile by
 * another thread stays (it is the newer). */
static void peek_put_back(_Atomic(ckptio__object_peek *) *slot, ckptio__object_peek *p) {
    ckptio__object_peek *none = NULL;
    if (p && !atomic_compare_exchange_strong(slot, &none, p)) ckptio__object_peek_free(p);
}

/* The engine's fresh peek of `url`, taken off the engine, or NULL. */
static ckptio__object_peek *peek_take(ckptio_engine *engine, const char *url) {
    _Atomic(ckptio__object_peek *) *slot = ckptio__io_engine_peek_slot(engine);
    if (!atomic_load(slot)) return NULL;
    ckptio__object_peek *p = atomic_exchange(slot, NULL);
    if (p && !strcmp(p->url, url) && ckptio__now() - p->at <= PEEK_KEEP_S) return p;
    if (p && strcmp(p->url, url) != 0) peek_put_back(slot, p); /* another path's: kept for its open */
    else ckptio__object_peek_free(p);
    return NULL;
}

bool ckptio__object_peek_kept(ckptio_engine *engine, const char *url, void *buf, uint64_t len, uint64_t *got,
                              uint64_t *size) {
    ckptio__object_peek *p = peek_take(engine, url);
    if (!p) return false;
    *got = len < p->len ? len : p->len;
    if (*got) memcpy(buf, p->bytes, (size_t)*got);
    *size = p->size;
    peek_put_back(ckptio__io_engine_peek_slot(engine), p);
    return true;
}

void ckptio__object_peek_keep(ckptio_engine *engine, const char *url, uint64_t size, const char *etag,
                              const void *bytes, uint64_t len) {
    if (!etag[0]) return;
    ckptio__object_peek *p = ckptio__calloc(1, sizeof *p + (size_t)len);
    if (!p || !(p->url = ckptio__strdup(url))) { /* nothing kept: the open asks the server */
        ckptio__object_peek_free(p);
        return;
    }
    p->size = size;
    p->len = len;
    snprintf(p->etag, sizeof p->etag, "%s", etag);
    if (len) memcpy(p->bytes, bytes, (size_t)len);
    p->at = ckptio__now();
    ckptio__object_peek_free(atomic_exchange(ckptio__io_engine_peek_slot(engine), p));
}

void ckptio__object_peek_forget(ckptio_engine *engine, const char *url) {
    if (engine) ckptio__object_peek_free(peek_take(engine, url));
}

static ckptio_status object_open(ckptio_engine *engine, const char *path, unsigned flags, void *window,
                                 uint64_t window_len, uint64_t *got, const char *listed_etag,
                                 uint64_t listed_size, ckptio_file **out) {
    *out = NULL;
    if (flags & CKPTIO_OPEN_IN_PLACE)
        return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.operation = "open", .path = path,
                                                                       .file_offset = -1}),
                               "objects are never written in place (CKPTIO_OPEN_IN_PLACE): they are replaced whole "
                               "at commit");
    ckptio__object *o = ckptio__calloc(1, sizeof *o);
    ckptio_file *f = ckptio__calloc(1, sizeof *f);
    ckptio_status st = CKPTIO_OK;
    if (!o || !f || !(f->path = ckptio__strdup(path))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory opening an object");
        goto fail;
    }
    if ((st = ckptio__s3_parse_url(path, false, &o->bucket, &o->key)) != CKPTIO_OK) goto fail;
    if ((st = ckptio__object_client(engine, o->bucket, &o->client)) != CKPTIO_OK) goto fail;
    o->write = flags & CKPTIO_OPEN_WRITE;
    if (!o->write) {
        ckptio__object_peek *peek = listed_etag ? NULL : peek_take(engine, path);
        if (listed_etag) {
            o->size = listed_size;
            snprintf(o->etag, sizeof o->etag, "%s", listed_etag);
        } else if (peek) { /* a probe's GET just told it: no request */
            o->size = peek->size;
            snprintf(o->etag, sizeof o->etag, "%s", peek->etag);
            /* An open with its first bytes takes them; one without leaves them to the open that wants them. */
            if (window_len) {
                *got = window_len < peek->len ? window_len : peek->len;
                memcpy(window, peek->bytes, (size_t)*got);
                ckptio__object_peek_free(peek);
            } else {
                peek_put_back(ckptio__io_engine_peek_slot(engine), peek);
            }
        } else {
            if (window_len && (st = open_by_window(o, window, window_len, got)) != CKPTIO_OK) goto fail;
            if (!(window_len && *got) && (st = ckptio__s3_head(o->client, o->bucket, o->key, &o->size, o->etag)))
                goto fail;
        }
    } else {
        ckptio__object_peek_forget(engine, path);
        o->exclusive = flags & CKPTIO_OPEN_EXCLUSIVE;
        if (o->exclusive) {
            bool exists;
            if ((st = object_exists(o, &exists)) != CKPTIO_OK) goto fail;
            if (exists) {
                char shown[400];
                ckptio__s3_display(o->bucket, o->key, shown, sizeof shown);
                st = CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS, &((ckptio__err_ctx){.operation = "open", .path = shown,
                                                                          .file_offset = -1}),
                                     "the object already exists and CKPTIO_OPEN_EXCLUSIVE was given");
                goto fail;
            }
        }
        /* Part buffers: the uploads in flight, two more, and what the
         * engine's workers may be filling at once (threads x chunk). The
         * engine's pool keeps as many between uploads. */
        const ckptio__s3_settings *s = &o->client->settings;
        const uint64_t threads = (uint64_t)ckptio__io_engine_setting(engine, CKPTIO_OPT_THREADS);
        const uint64_t chunk = (uint64_t)ckptio__io_engine_setting(engine, CKPTIO_OPT_CHUNK_BYTES);
        const uint64_t bound = (s->concurrency + 2) * s->part_bytes + (threads ? threads : 1) * chunk;
        ckptio__s3_part_pool *pool = ckptio__io_engine_part_pool(engine);
        ckptio__s3_part_pool_configure(pool, bound,
                                       (unsigned)ckptio__io_engine_setting(engine, CKPTIO_OPT_S3_BUFFERS_KEEP_MS));
        if ((st = ckptio__s3_upload_open(o->client, o->bucket, o->key, bound, pool, &o->upload)) != CKPTIO_OK)
            goto fail;
    }
    f->engine = engine;
    f->flags = flags;
    f->fd = f->direct_fd = -1;
    f->writable = o->write;
    f->object = o;
    atomic_init(&f->direct_state, -1);
    atomic_init(&f->read_cache, -1);
    atomic_init(&f->write_cache, -1);
    atomic_init(&f->in_memory, -1);
    pthread_mutex_init(&f->lock, NULL);
    pthread_mutex_init(&f->write_turn, NULL);
    ckptio__io_engine_file_ref(engine, +1);
    *out = f;
    return CKPTIO_OK;
fail:
    if (f) ckptio__free(f->path);
    ckptio__free(f);
    object_free(o);
    return st;
}

ckptio_status ckptio__object_open(ckptio_engine *engine, const char *path, unsigned flags, ckptio_file **out) {
    return object_open(engine, path, flags, NULL, 0, NULL, NULL, 0, out);
}

ckptio_status ckptio__object_open_prefix(ckptio_engine *engine, const char *path, void *buf, uint64_t len,
                                         uint64_t *got, ckptio_file **out) {
    *got = 0;
    return object_open(engine, path, CKPTIO_OPEN_READ, buf, len, got, NULL, 0, out);
}

ckptio_status ckptio__object_open_listed(ckptio_engine *engine, const char *path, uint64_t size, const char *etag,
                                         ckptio_file **out) {
    return object_open(engine, path, CKPTIO_OPEN_READ, NULL, 0, NULL, etag, size, out);
}

const char *ckptio__object_version(const ckptio_file *f) { return f->object->write ? "" : f->object->etag; }

ckptio_status ckptio__object_size(ckptio_file *f, uint64_t *out) {
    *out = f->object->write ? ckptio__s3_upload_size(f->object->upload) : f->object->size;
    return CKPTIO_OK;
}

ckptio_status ckptio__object_truncate(ckptio_file *f, uint64_t size) {
    return ckptio__s3_upload_set_size(f->object->upload, size);
}

/* While the commit waits for the last parts: the engine's progress callback
 * may still stop it (Ctrl-C in Python): the upload is then aborted. */
static ckptio_status commit_poll(void *engine) { return ckptio__io_engine_commit_poll(engine); }

ckptio_status ckptio__object_commit(ckptio_file *f) { return ckptio__object_commit_polled(f, commit_poll, f->engine); }

ckptio_status ckptio__object_commit_polled(ckptio_file *f, ckptio__s3_poll_fn poll, void *user) {
    CKPTIO_RETURN_IF(!f->object || !f->writable || f->closed_for_write, CKPTIO_E_INVAL,
                     "%s: not an object open for writing", f->path);
    ckptio__object *o = f->object;
    f->closed_for_write = true;
    if (o->exclusive) {
        bool exists;
        CKPTIO_FORWARD(object_exists(o, &exists));
        if (exists) {
            char shown[400];
            ckptio__s3_display(o->bucket, o->key, shown, sizeof shown);
            return CKPTIO_FAIL_CTX(CKPTIO_E_EXISTS, &((ckptio__err_ctx){.operation = "commit", .path = shown,
                                                                        .file_offset = -1}),
                                   "the object appeared while it was being written and CKPTIO_OPEN_EXCLUSIVE was "
                                   "given");
        }
    }
    CKPTIO_FORWARD(ckptio__s3_upload_commit(o->upload, poll, user));
    f->committed = true;
    return CKPTIO_OK;
}

ckptio_status ckptio__object_close(ckptio_file *f) {
    ckptio__object *o = f->object;
    ckptio_status st = o->upload ? ckptio__s3_upload_close(o->upload) : CKPTIO_OK;
    ckptio__io_engine_file_ref(f->engine, -1);
    object_free(o);
    pthread_mutex_destroy(&f->lock);
    pthread_mutex_destroy(&f->write_turn);
    ckptio__free(f->mode_from);
    ckptio__free(f->path);
    ckptio__free(f);
    return st;
}

ckptio_status ckptio__object_share_buffers(ckptio_file *const *files, size_t count, uint64_t *bound) {
    ckptio__s3_budget *b = NULL;
    for (size_t i = 0; i < count; i++) {
        ckptio__object *o = files[i]->object;
        if (!o || !o->upload) continue;
        if (!b) { /* one file's own bound: the save holds no more than a save of one file */
            uint64_t peak;
            ckptio__s3_upload_buffers(o->upload, &peak, bound);
            if (!(b = ckptio__s3_budget_create(*bound)))
                return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory sharing upload buffers");
        }
        ckptio__s3_upload_share_budget(o->upload, b);
    }
    ckptio__s3_budget_release(b);
    return CKPTIO_OK;
}

uint64_t ckptio__object_shared_peak(ckptio_file *f) {
    ckptio__s3_budget *b = f->object && f->object->upload ? ckptio__s3_upload_budget(f->object->upload) : NULL;
    return b ? ckptio__s3_budget_peak(b) : 0;
}

void ckptio__object_buffers(ckptio_file *f, uint64_t *peak, uint64_t *bound) {
    *peak = *bound = 0;
    if (f->object && f->object->upload) ckptio__s3_upload_buffers(f->object->upload, peak, bound);
}

unsigned ckptio__object_writers_waiting(ckptio_file *f) {
    return f->object && f->object->upload ? ckptio__s3_upload_waiting(f->object->upload) : 0;
}

void ckptio__object_part_pool_stats(ckptio_engine *engine, ckptio__s3_part_pool_stats *out) {
    ckptio__s3_part_pool_stats_get(ckptio__io_engine_part_pool(engine), out);
}

static void op_failed(ckptio__io_op *op) {
    op->err = EIO;
    op->failure = ckptio__error_save();
}

void ckptio__object_io(ckptio__io_op *op) {
    ckptio__object *o = op->object;
    const uint64_t len = op->len - op->done;
    unsigned char *buf = op->buf + op->done;
    const uint64_t at = op->offset + op->done;
    ckptio_status st;
    op->requests++;
    if (op->dir == CKPTIO_WRITE) st = ckptio__s3_upload_write(o->upload, at, buf, len);
    else if (o->write) st = ckptio__s3_upload_read(o->upload, at, buf, len);
    else st = ckptio__s3_get(o->client, o->bucket, o->key, o->etag, at, len, buf);
    if (st != CKPTIO_OK) op_failed(op);
    else op->done = op->len;
}

bool ckptio__object_async_read(ckptio__io_op *op, ckptio__s3_request *r) {
    ckptio__object *o = op->object;
    if (!o || o->write || op->dir != CKPTIO_READ || op->done >= op->len) return false;
    ckptio__s3_request_init(r, o->client, "GET", o->bucket, o->key, "GET");
    r->ranged = true;
    r->range_off = op->offset + op->done;
    r->range_len = op->len - op->done;
    r->dst = op->buf + op->done;
    r->dst_len = r->range_len;
    r->if_match = o->etag[0] ? o->etag : NULL;
    op->requests++;
    return true;
}

void ckptio__object_io_done(ckptio__io_op *op, ckptio__s3_request *r) {
    if (r->attempts > 1) op->retries += r->attempts - 1;
    if (ckptio__s3_request_fail(r) != CKPTIO_OK) op_failed(op);
    else op->done = op->len;
    ckptio__s3_request_cleanup(r);
}
