/*
 * s3_upload.c - an object written at any offsets, by any number of threads,
 * that appears on the server whole or not at all.
 *
 * The object is cut into parts of one size (at least the part_bytes
 * setting, and large enough that the object fits in S3's 10,000 parts when
 * its size is known first; then also a little larger where a short last
 * part would go out alone after rounds of concurrent parts). Writes are copied into the buffer of the part
 * they fall in; a part whose every byte has arrived is queued, and one
 * uploader thread per object sends queued parts as UploadPart requests, up
 * to `concurrency` at once on its own curl multi handle, giving each
 * buffer back to the engine's part pool (s3_part_pool.c) when its part is
 * stored, where the next part finds it. At most max_buffered bytes of
 * buffers are held at a time: a writer that needs a new one waits for an upload to
 * finish; if every buffer is waiting for bytes that have not come (writes
 * far out of order), the write fails instead of waiting forever. Commit
 * fills the holes with zeros, sends the rest, and completes the multipart
 * upload (an object of one part is sent with one PUT and no multipart
 * upload at all). Any failure, and a close without commit, aborts the
 * multipart upload: the server then holds neither the object nor its parts.
 */
#include "objstore_private.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB ((uint64_t)1 << 20)

typedef struct cover {
    uint64_t lo, hi;
} cover;

enum { P_EMPTY, P_FILLING, P_QUEUED, P_SENDING, P_DONE };

typedef struct part {
    unsigned char *buf;
    cover *cov; /* written ranges of the part, sorted and merged */
    unsigned ncov, capcov;
    unsigned writers; /* threads copying into buf now */
    int state;
    char etag[80];
} part;

struct ckptio__s3_budget {
    pthread_mutex_t lock; /* taken after an upload's lock, never before */
    uint64_t used, max, peak;
    uint64_t gives;       /* buffers given back so far: a waiter sees the uploads move */
    unsigned sending;     /* parts of its uploads in flight: each will give its buffer back, or fail */
    unsigned refs;
};

struct ckptio__s3_upload {
    ckptio__s3_budget *budget; /* shared with other uploads, or NULL */
    uint64_t budget_held;      /* bytes of buffers taken from it */
    const ckptio__s3_client *c;
    char *bucket, *key;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a buffer freed, a part finished, a failure */
    uint64_t part_size;  /* 0 until decided */
    uint64_t size;       /* the size set (size_set) */
    bool size_set;
    uint64_t end;        /* end of the furthest write */
    part *parts;
    unsigned nparts;     /* entries of parts[] */
    uint64_t buffered, max_buffered, peak;
    unsigned waiting;    /* writers waiting in part_buffer for a buffer */
    unsigned inflight;
    bool sent_any;       /* a part was queued: the part size is fixed */
    bool create_now;     /* the multipart upload is created without waiting for a queued part */
    char upload_id[1024];
    bool thread_started, closing, committed;
    pthread_t thread;
    ckptio__s3_session *session;
    ckptio__s3_part_pool *pool; /* where buffers come from and go back to */
    ckptio_status fail_status;
    char fail_message[1400];
};

static void shown(const ckptio__s3_upload *u, char *out, size_t cap) {
    ckptio__s3_display(u->bucket, u->key, out, cap);
}

/* Records the calling thread's last error as the upload's failure (first wins). */
static void set_failure(ckptio__s3_upload *u, ckptio_status st) {
    if (u->fail_status != CKPTIO_OK) return;
    u->fail_status = st;
    snprintf(u->fail_message, sizeof u->fail_message, "%s", ckptio_last_error_message());
    pthread_cond_broadcast(&u->cond);
}

/* The upload's failure, recorded again on the calling thread. */
static ckptio_status failure(const ckptio__s3_upload *u) {
    return CKPTIO_FAIL_CTX(u->fail_status, &((ckptio__err_ctx){.file_offset = -1, .verbatim = true}), "%s",
                           u->fail_message);
}

ckptio__s3_budget *ckptio__s3_budget_create(uint64_t max_bytes) {
    ckptio__s3_budget *b = ckptio__calloc(1, sizeof *b);
    if (!b) return NULL;
    pthread_mutex_init(&b->lock, NULL);
    b->max = max_bytes;
    b->refs = 1;
    return b;
}

void ckptio__s3_budget_release(ckptio__s3_budget *b) {
    if (!b) return;
    pthread_mutex_lock(&b->lock);
    const bool last = --b->refs == 0;
    pthread_mutex_unlock(&b->lock);
    if (!last) return;
    pthread_mutex_destroy(&b->lock);
    ckptio__free(b);
}

uint64_t ckptio__s3_budget_peak(ckptio__s3_budget *b) {
    pthread_mutex_lock(&b->lock);
    const uint64_t peak = b->peak;
    pthread_mutex_unlock(&b->lock);
    return peak;
}

ckptio__s3_budget *ckptio__s3_upload_budget(ckptio__s3_upload *u) { return u->budget; }

void ckptio__s3_upload_share_budget(ckptio__s3_upload *u, ckptio__s3_budget *b) {
    pthread_mutex_lock(&b->lock);
    b->refs++;
    pthread_mutex_unlock(&b->lock);
    pthread_mutex_lock(&u->lock);
    ckptio__s3_budget_release(u->budget);
    u->budget = b;
    pthread_mutex_unlock(&u->lock);
}

/* Takes n bytes from the shared budget (lock of u held): within its bound,
 * or always when `force` or when the upload holds no buffer yet. An upload's
 * first buffer is never refused: a part that waits for its commit (an
 * object of one part, sent by one PUT) must not starve the others, so the
 * uploads together hold at most the bound plus one part each. */
static bool budget_take(ckptio__s3_upload *u, uint64_t n, bool force) {
    ckptio__s3_budget *b = u->budget;
    if (!b) return true;
    pthread_mutex_lock(&b->lock);
    const bool ok = force || u->buffered == 0 || b->used == 0 || b->used + n <= b->max;
    if (ok) {
        b->used += n;
        if (b->used > b->peak) b->peak = b->used;
        u->budget_held += n;
    }
    pthread_mutex_unlock(&b->lock);
    return ok;
}

static void budget_give(ckptio__s3_upload *u, uint64_t n) {
    ckptio__s3_budget *b = u->budget;
    if (!b) return;
    if (n > u->budget_held) n = u->budget_held;
    pthread_mutex_lock(&b->lock);
    b->used -= n;
    b->gives++;
    pthread_mutex_unlock(&b->lock);
    u->budget_held -= n;
}

/* Buffers given back so far, and whether parts are in flight (on a slow link a part may take longer than
 * the request timeout, which counts only time without bytes moving). */
static uint64_t budget_gives(ckptio__s3_budget *b, bool *sending) {
    pthread_mutex_lock(&b->lock);
    const uint64_t g = b->gives;
    *sending = b->sending > 0;
    pthread_mutex_unlock(&b->lock);
    return g;
}

/* A part of `u` goes into flight (+1) or comes back (-1). */
static void budget_sending(ckptio__s3_upload *u, int delta) {
    if (!u->budget) return;
    pthread_mutex_lock(&u->budget->lock);
    u->budget->sending = (unsigned)((int)u->budget->sending + delta);
    pthread_mutex_unlock(&u->budget->lock);
}

/* The smallest part size an object of `size` bytes can have (0: not known yet): the part_bytes setting, larger
 * where 10,000 parts would not hold it. */
static uint64_t needed_part_size(const ckptio__s3_upload *u, uint64_t size) {
    uint64_t p = u->c->settings.part_bytes;
    if (p < CKPTIO__S3_MIN_PART) p = CKPTIO__S3_MIN_PART;
    const uint64_t need = (size + CKPTIO__S3_MAX_PARTS - 1) / CKPTIO__S3_MAX_PARTS;
    if (need > p) p = ckptio__align_up(need, MIB);
    if (p > CKPTIO__S3_MAX_PART) p = CKPTIO__S3_MAX_PART;
    return p;
}

/* The part size an object of `size` bytes is cut into: needed_part_size(), grown by whole MiB (an eighth of it
 * at most) where the whole parts fill rounds of `concurrency` requests exactly and a short rest would be a part
 * alone in a round of its own (a file of 16 MiB tensors and their archives' headers): a round trip after the
 * others for a few bytes, which spread over the others cost nothing. */
static uint64_t choose_part_size(const ckptio__s3_upload *u, uint64_t size) {
    const uint64_t p = needed_part_size(u, size);
    const uint64_t n = size / p, rest = size % p;
    const unsigned concurrency = u->c->settings.concurrency ? u->c->settings.concurrency : 1;
    if (!n || !rest || n % concurrency) return p;
    const uint64_t grow = ckptio__align_up((rest + n - 1) / n, MIB);
    return grow <= p / 8 && p + grow <= CKPTIO__S3_MAX_PART ? p + grow : p;
}

ckptio_status ckptio__s3_upload_open(const ckptio__s3_client *c, const char *bucket, const char *key,
                                     uint64_t max_buffered, ckptio__s3_part_pool *pool, ckptio__s3_upload **out) {
    *out = NULL;
    ckptio__s3_upload *u = ckptio__calloc(1, sizeof *u);
    if (!u) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory starting an upload");
    u->c = c;
    u->bucket = ckptio__strdup(bucket);
    u->key = ckptio__strdup(key);
    u->max_buffered = max_buffered;
    u->pool = pool;
    if (!u->bucket || !u->key) {
        ckptio__free(u->bucket);
        ckptio__free(u->key);
        ckptio__free(u);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory starting an upload");
    }
    pthread_mutex_init(&u->lock, NULL);
    pthread_cond_init(&u->cond, NULL);
    *out = u;
    return CKPTIO_OK;
}

const char *ckptio__s3_upload_id(ckptio__s3_upload *u) { return u->upload_id; }

void ckptio__s3_upload_buffers(ckptio__s3_upload *u, uint64_t *peak, uint64_t *bound) {
    pthread_mutex_lock(&u->lock);
    *peak = u->peak;
    *bound = u->max_buffered;
    pthread_mutex_unlock(&u->lock);
}

unsigned ckptio__s3_upload_waiting(ckptio__s3_upload *u) {
    pthread_mutex_lock(&u->lock);
    const unsigned n = u->waiting;
    pthread_mutex_unlock(&u->lock);
    return n;
}

uint64_t ckptio__s3_upload_size(ckptio__s3_upload *u) {
    pthread_mutex_lock(&u->lock);
    const uint64_t s = u->size_set && u->size > u->end ? u->size : u->end;
    pthread_mutex_unlock(&u->lock);
    return s;
}

/* Bytes of part i: the whole part size, except the last one of a known size. */
static uint64_t part_len(const ckptio__s3_upload *u, unsigned i) {
    const uint64_t start = (uint64_t)i * u->part_size;
    if (u->size_set && u->size > start && u->size - start < u->part_size) return u->size - start;
    return u->part_size;
}

static bool grow_parts(ckptio__s3_upload *u, unsigned n) {
    if (n <= u->nparts) return true;
    unsigned cap = u->nparts ? u->nparts : 16;
    while (cap < n) cap *= 2;
    if (cap > CKPTIO__S3_MAX_PARTS) cap = CKPTIO__S3_MAX_PARTS;
    part *p = ckptio__realloc(u->parts, cap * sizeof *p);
    if (!p) return false;
    memset(p + u->nparts, 0, (cap - u->nparts) * sizeof *p);
    u->parts = p;
    u->nparts = cap;
    return true;
}

static bool add_cover(part *p, uint64_t lo, uint64_t hi) {
    if (p->ncov == p->capcov) {
        unsigned cap = p->capcov ? p->capcov * 2 : 4;
        cover *c = ckptio__realloc(p->cov, cap * sizeof *c);
        if (!c) return false;
        p->cov = c;
        p->capcov = cap;
    }
    unsigned i = 0;
    while (i < p->ncov && p->cov[i].lo < lo) i++;
    memmove(p->cov + i + 1, p->cov + i, (p->ncov - i) * sizeof *p->cov);
    p->cov[i] = (cover){lo, hi};
    p->ncov++;
    /* Merge neighbours that touch or overlap. */
    unsigned k = 0;
    for (unsigned j = 1; j < p->ncov; j++) {
        if (p->cov[j].lo <= p->cov[k].hi) {
            if (p->cov[j].hi > p->cov[k].hi) p->cov[k].hi = p->cov[j].hi;
        } else {
            p->cov[++k] = p->cov[j];
        }
    }
    p->ncov = k + 1;
    return true;
}

static bool full(const part *p, uint64_t len) { return p->ncov == 1 && p->cov[0].lo == 0 && p->cov[0].hi >= len; }

/* The object's parts if its size is `size`. */
static unsigned parts_for(const ckptio__s3_upload *u, uint64_t size) {
    return (unsigned)((size + u->part_size - 1) / u->part_size);
}

static void *uploader(void *arg);

static ckptio_status start_uploader(ckptio__s3_upload *u) {
    if (u->thread_started) return CKPTIO_OK;
    if (!u->session) CKPTIO_FORWARD(ckptio__s3_session_create(&u->session));
    const int err = ckptio__thread_start(&u->thread, NULL, uploader, u);
    if (err) {
        char s[400];
        shown(u, s, sizeof s);
        return CKPTIO_FAIL_SYS(err, "pthread_create", s, -1, "starting the upload thread");
    }
    u->thread_started = true;
    return CKPTIO_OK;
}

/* Queues part i when all its bytes are there (lock held). A lone part of an
 * object of known size waits for commit, which sends it with one PUT. */
static ckptio_status maybe_queue(ckptio__s3_upload *u, unsigned i) {
    part *p = &u->parts[i];
    if (p->state != P_FILLING || p->writers || !full(p, part_len(u, i))) return CKPTIO_OK;
    if (u->size_set && parts_for(u, u->size) <= 1) return CKPTIO_OK;
    p->state = P_QUEUED;
    u->sent_any = true;
    CKPTIO_FORWARD(start_uploader(u));
    pthread_cond_broadcast(&u->cond);
    ckptio__s3_session_wakeup(u->session);
    return CKPTIO_OK;
}

ckptio_status ckptio__s3_upload_set_size(ckptio__s3_upload *u, uint64_t size) {
    ckptio_status st = CKPTIO_OK;
    char s[400];
    pthread_mutex_lock(&u->lock);
    const uint64_t want = choose_part_size(u, size);
    part *p0 = u->nparts ? &u->parts[0] : NULL;
    /* Bigger parts: possible while only the first part holds bytes and no writer is copying into it (its
     * buffer is about to move). Where they are not needed, only preferred (choose_part_size), the parts stay. */
    const bool movable = !(u->sent_any || u->end > u->part_size || (p0 && p0->writers));
    if (!u->part_size) {
        u->part_size = want;
    } else if (want > u->part_size && (movable || needed_part_size(u, size) > u->part_size)) {
        if (!movable) {
            shown(u, s, sizeof s);
            st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.operation = "truncate", .path = s,
                                                                           .file_offset = (int64_t)size}),
                                 "an object of %llu bytes needs parts of %llu bytes, and parts of %llu were "
                                 "written already (give the size before the data)",
                                 (unsigned long long)size, (unsigned long long)needed_part_size(u, size),
                                 (unsigned long long)u->part_size);
            goto out;
        }
        if (p0 && p0->buf) {
            unsigned char *b = ckptio__realloc(p0->buf, (size_t)want);
            if (!b) {
                st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a %llu-byte part", (unsigned long long)want);
                goto out;
            }
            p0->buf = b;
            u->buffered += want - u->part_size;
            /* The shared bound counts what the buffer holds now. */
            if (want > u->part_size)
                budget_take(u, want - u->part_size, true);
            else
                budget_give(u, u->part_size - want);
        }
        u->part_size = want;
    }
    if (u->sent_any && size < u->end) {
        shown(u, s, sizeof s);
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                             &((ckptio__err_ctx){.operation = "truncate", .path = s, .file_offset = (int64_t)size}),
                             "an object being uploaded cannot shrink below the %llu bytes written",
                             (unsigned long long)u->end);
        goto out;
    }
    u->size = size;
    u->size_set = true;
    if (u->end > size) u->end = size;
    for (unsigned i = 0; i < u->nparts && st == CKPTIO_OK; i++) st = maybe_queue(u, i);
    if (st == CKPTIO_OK && parts_for(u, size) > 1 && !u->create_now) {
        /* Several parts: the multipart upload is created now, its round trip beside the filling of the first
         * part rather than after it. */
        u->create_now = true;
        st = start_uploader(u);
        pthread_cond_broadcast(&u->cond);
    }
out:
    pthread_mutex_unlock(&u->lock);
    return st;
}

/* A buffer for part i (lock held; may wait for uploads to free memory). The
 * part is looked up again after each wait: another writer may have grown the
 * table (grow_parts moves it) while the lock was free. */
static ckptio_status part_buffer(ckptio__s3_upload *u, unsigned i) {
    uint64_t seen_gives = UINT64_MAX;
    struct timespec since = {0};
    for (part *p = &u->parts[i]; !p->buf; p = &u->parts[i]) {
        if (u->fail_status != CKPTIO_OK) return failure(u);
        if (p->state >= P_QUEUED) { /* sent while this writer waited: a second write of its bytes */
            char s[400];
            shown(u, s, sizeof s);
            return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                   &((ckptio__err_ctx){.operation = "write", .path = s,
                                                       .file_offset = (int64_t)((uint64_t)i * u->part_size)}),
                                   "bytes of part %u were written again after the part was sent", i + 1);
        }
        const bool own_room = u->buffered + u->part_size <= u->max_buffered || u->buffered == 0;
        if (own_room && budget_take(u, u->part_size, false)) {
            p->buf = ckptio__s3_part_pool_take(u->pool, (size_t)u->part_size);
            if (!p->buf) {
                budget_give(u, u->part_size);
                return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a %llu-byte upload part",
                                   (unsigned long long)u->part_size);
            }
            u->buffered += u->part_size;
            if (u->buffered > u->peak) u->peak = u->buffered;
            p->state = P_FILLING;
            return CKPTIO_OK;
        }
        bool moving = u->inflight > 0;
        for (unsigned k = 0; k < u->nparts && !moving; k++) moving = u->parts[k].state == P_QUEUED;
        if (own_room) {
            /* The shared bound is reached by the other uploads: their parts free it, and they do not
             * signal this upload's condition, so look again shortly. Buffers that all wait for bytes
             * nobody writes free nothing: after the request timeout without one given back and with no
             * part of theirs in flight, fail. */
            struct timespec now, due;
            clock_gettime(CLOCK_MONOTONIC, &now);
            bool sending;
            const uint64_t gives = budget_gives(u->budget, &sending);
            if (gives != seen_gives || sending) {
                seen_gives = gives;
                since = now;
            } else if ((now.tv_sec - since.tv_sec) * 1000 + (now.tv_nsec - since.tv_nsec) / 1000000 >
                       (long)u->c->settings.timeout_ms) {
                char s[400];
                shown(u, s, sizeof s);
                return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                       &((ckptio__err_ctx){.operation = "write", .path = s,
                                                           .file_offset = (int64_t)((uint64_t)i * u->part_size)}),
                                       "the upload buffers shared with other objects all wait for bytes that have "
                                       "not been written (writes to the objects must come roughly in order)");
            }
            clock_gettime(CLOCK_REALTIME, &due);
            due.tv_nsec += 2 * 1000 * 1000;
            if (due.tv_nsec >= 1000000000L) due.tv_sec++, due.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&u->cond, &u->lock, &due);
            continue;
        }
        if (!moving) {
            char s[400];
            shown(u, s, sizeof s);
            return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                   &((ckptio__err_ctx){.operation = "write", .path = s,
                                                       .file_offset = (int64_t)((uint64_t)i * u->part_size)}),
                                   "the %llu bytes of upload buffers all wait for bytes that have not been written "
                                   "(writes to an object must come roughly in order)",
                                   (unsigned long long)u->buffered);
        }
        u->waiting++;
        pthread_cond_wait(&u->cond, &u->lock);
        u->waiting--;
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__s3_upload_write(ckptio__s3_upload *u, uint64_t off, const void *data, uint64_t len) {
    if (!len) return CKPTIO_OK;
    char s[400];
    uint64_t end;
    pthread_mutex_lock(&u->lock);
    ckptio_status st = CKPTIO_OK;
    if (u->fail_status != CKPTIO_OK) {
        st = failure(u);
        goto out;
    }
    if (!u->part_size) u->part_size = choose_part_size(u, 0);
    if (ckptio__add_overflows(off, len, &end) || end > u->part_size * CKPTIO__S3_MAX_PARTS) {
        shown(u, s, sizeof s);
        st = CKPTIO_FAIL_CTX(CKPTIO_E_RANGE, &((ckptio__err_ctx){.operation = "write", .path = s,
                                                                 .file_offset = (int64_t)off}),
                             "the object would exceed %u parts of %llu bytes (give its size first: the part size "
                             "then grows with it)",
                             CKPTIO__S3_MAX_PARTS, (unsigned long long)u->part_size);
        goto out;
    }
    if (u->size_set && end > u->size) {
        const unsigned last = parts_for(u, u->size) - 1;
        if (u->size && u->parts && last < u->nparts && u->parts[last].state >= P_QUEUED &&
            part_len(u, last) < u->part_size) {
            shown(u, s, sizeof s);
            st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.operation = "write", .path = s,
                                                                           .file_offset = (int64_t)off}),
                                 "a write past the object's size of %llu bytes after its last part was sent",
                                 (unsigned long long)u->size);
            goto out;
        }
        u->size = end;
    }
    const unsigned first = (unsigned)(off / u->part_size), lastp = (unsigned)((end - 1) / u->part_size);
    if (!grow_parts(u, lastp + 1)) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %u upload parts", lastp + 1);
        goto out;
    }
    for (unsigned i = first; i <= lastp && st == CKPTIO_OK; i++) {
        part *p = &u->parts[i];
        const uint64_t pstart = (uint64_t)i * u->part_size;
        const uint64_t lo = off > pstart ? off - pstart : 0;
        const uint64_t hi = end - pstart < u->part_size ? end - pstart : u->part_size;
        if (p->state >= P_QUEUED) {
            shown(u, s, sizeof s);
            st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.operation = "write", .path = s,
                                                                           .file_offset = (int64_t)(pstart + lo)}),
                                 "bytes of part %u were written again after the part was sent", i + 1);
            break;
        }
        if ((st = part_buffer(u, i)) != CKPTIO_OK) break;
        /* Entries are reached by index after every unlock: another writer may move the table (grow_parts);
         * the part's buffer stays where it is while it has writers. */
        p = &u->parts[i];
        p->writers++;
        unsigned char *dst = p->buf + lo;
        pthread_mutex_unlock(&u->lock);
        memcpy(dst, (const unsigned char *)data + (pstart + lo - off), (size_t)(hi - lo));
        pthread_mutex_lock(&u->lock);
        p = &u->parts[i];
        p->writers--;
        if (!add_cover(p, lo, hi)) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory tracking an upload part");
            break;
        }
        st = maybe_queue(u, i);
    }
    if (st == CKPTIO_OK && end > u->end) u->end = end;
out:
    pthread_mutex_unlock(&u->lock);
    return st;
}

ckptio_status ckptio__s3_upload_read(ckptio__s3_upload *u, uint64_t off, void *buf, uint64_t len) {
    ckptio_status st = CKPTIO_OK;
    pthread_mutex_lock(&u->lock);
    uint64_t done = 0;
    while (done < len && u->part_size) {
        const uint64_t at = off + done;
        const unsigned i = (unsigned)(at / u->part_size);
        const uint64_t in = at - (uint64_t)i * u->part_size;
        uint64_t n = u->part_size - in < len - done ? u->part_size - in : len - done;
        if (i >= u->nparts || !u->parts[i].buf || u->parts[i].state > P_QUEUED) break;
        memcpy((unsigned char *)buf + done, u->parts[i].buf + in, (size_t)n);
        done += n;
    }
    if (done < len) {
        char s[400];
        shown(u, s, sizeof s);
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                             &((ckptio__err_ctx){.operation = "read", .path = s, .file_offset = (int64_t)(off + done)}),
                             "an object being written can be read back only from parts not sent yet");
    }
    pthread_mutex_unlock(&u->lock);
    return st;
}

/* ---- the uploader thread ------------------------------------------------------- */

typedef struct part_request {
    ckptio__s3_request r;
    unsigned index;
    char number[16];
} part_request;

/* CreateMultipartUpload (lock held, released during the request); false when it failed (recorded). */
static bool create_upload(ckptio__s3_upload *u) {
    pthread_mutex_unlock(&u->lock);
    char id[sizeof u->upload_id];
    const ckptio_status st = ckptio__s3_mpu_create(u->c, u->bucket, u->key, id, sizeof id);
    pthread_mutex_lock(&u->lock);
    if (st != CKPTIO_OK) {
        set_failure(u, st);
        return false;
    }
    memcpy(u->upload_id, id, sizeof id);
    return true;
}

static void *uploader(void *arg) {
    ckptio__s3_upload *u = arg;
    const unsigned concurrency = u->c->settings.concurrency ? u->c->settings.concurrency : 1;
    unsigned scan = 0;
    pthread_mutex_lock(&u->lock);
    for (;;) {
        if (u->create_now && !u->upload_id[0] && u->fail_status == CKPTIO_OK) {
            create_upload(u);
            continue;
        }
        while (u->fail_status == CKPTIO_OK && u->inflight < concurrency) {
            while (scan < u->nparts && u->parts[scan].state != P_QUEUED) scan++;
            unsigned i = scan;
            if (i >= u->nparts) { /* a part before scan may have been queued later (out of order) */
                for (i = 0; i < u->nparts && u->parts[i].state != P_QUEUED; i++) {
                }
                if (i >= u->nparts) break;
                scan = i;
            }
            if (!u->upload_id[0]) {
                if (!create_upload(u)) break;
                continue;
            }
            part_request *pr = ckptio__malloc(sizeof *pr);
            if (!pr) {
                set_failure(u, CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for an upload request"));
                break;
            }
            part *p = &u->parts[i];
            p->state = P_SENDING;
            pr->index = i;
            ckptio__s3_mpu_part_request(&pr->r, u->c, u->bucket, u->key, u->upload_id, i + 1, pr->number, p->buf,
                                        (size_t)part_len(u, i));
            pr->r.user = pr;
            ckptio__s3_submit(u->session, &pr->r);
            u->inflight++;
            budget_sending(u, +1);
        }
        if (!u->inflight) {
            if (u->closing || u->fail_status != CKPTIO_OK) break;
            pthread_cond_wait(&u->cond, &u->lock);
            continue;
        }
        /* Failed, stopped or closed before its commit: no part in flight is of use any more, and one that
         * stalls would hold the abort (and a Ctrl-C) up until its timeout. */
        if (u->fail_status != CKPTIO_OK)
            ckptio__s3_session_cancel(u->session, "stopped: the upload failed, or was stopped or closed first");
        pthread_mutex_unlock(&u->lock);
        ckptio__s3_request *r = ckptio__s3_wait(u->session);
        ckptio_status st = r ? ckptio__s3_request_fail(r) : CKPTIO_OK;
        pthread_mutex_lock(&u->lock);
        if (!r) continue;
        part_request *pr = r->user;
        part *p = &u->parts[pr->index];
        if (st == CKPTIO_OK && (!r->etag[0] || strlen(r->etag) >= sizeof p->etag)) {
            r->status = CKPTIO_E_IO;
            r->message = ckptio__strdup("the answer to UploadPart has no usable ETag");
            st = ckptio__s3_request_fail(r);
        }
        if (st == CKPTIO_OK) {
            memcpy(p->etag, r->etag, strlen(r->etag) + 1); /* fits: checked above */
            /* Stored: no request reads the buffer, and writers never copy into a part past P_FILLING. */
            ckptio__s3_part_pool_give(u->pool, p->buf, (size_t)u->part_size);
            p->buf = NULL;
            u->buffered -= u->part_size;
            budget_give(u, u->part_size);
            p->state = P_DONE;
        } else {
            set_failure(u, st);
        }
        ckptio__s3_request_cleanup(r);
        ckptio__free(pr);
        u->inflight--;
        budget_sending(u, -1);
        pthread_cond_broadcast(&u->cond);
    }
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->lock);
    return NULL;
}

static void stop_uploader(ckptio__s3_upload *u) {
    pthread_mutex_lock(&u->lock);
    u->closing = true;
    pthread_cond_broadcast(&u->cond);
    pthread_mutex_unlock(&u->lock);
    if (u->thread_started) {
        ckptio__s3_session_wakeup(u->session);
        pthread_join(u->thread, NULL);
        u->thread_started = false;
    }
}

/* Fills the holes of part i with zeros (lock held). */
static void zero_holes(part *p, uint64_t len) {
    uint64_t at = 0;
    for (unsigned k = 0; k < p->ncov && at < len; k++) {
        if (p->cov[k].lo > at) memset(p->buf + at, 0, (size_t)((p->cov[k].lo < len ? p->cov[k].lo : len) - at));
        if (p->cov[k].hi > at) at = p->cov[k].hi;
    }
    if (at < len) memset(p->buf + at, 0, (size_t)(len - at));
}

ckptio_status ckptio__s3_upload_commit(ckptio__s3_upload *u, ckptio__s3_poll_fn poll, void *user) {
    ckptio_status st = CKPTIO_OK;
    char **etags = NULL;
    pthread_mutex_lock(&u->lock);
    if (u->fail_status != CKPTIO_OK) {
        st = failure(u);
        pthread_mutex_unlock(&u->lock);
        return st;
    }
    const uint64_t size = u->size_set && u->size > u->end ? u->size : u->end;
    if (!u->part_size) u->part_size = choose_part_size(u, size);
    u->size = size;
    u->size_set = true;
    const unsigned n = parts_for(u, size);
    if (!grow_parts(u, n ? n : 1)) {
        pthread_mutex_unlock(&u->lock);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %u upload parts", n);
    }
    /* Every part not sent yet gets a buffer (a part never written is all zeros). */
    for (unsigned i = 0; i < n && st == CKPTIO_OK; i++) {
        part *p = &u->parts[i];
        if (p->state >= P_QUEUED) continue;
        if (!p->buf) {
            p->buf = ckptio__s3_part_pool_take(u->pool, (size_t)u->part_size);
            if (!p->buf) {
                st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a %llu-byte upload part",
                                 (unsigned long long)u->part_size);
                break;
            }
            budget_take(u, u->part_size, true); /* the holes at commit: counted, never waited for */
            u->buffered += u->part_size;
            p->state = P_FILLING;
        }
        zero_holes(p, part_len(u, i));
    }
    if (st == CKPTIO_OK && n <= 1 && !u->sent_any) {
        /* One part or none: a single PUT, no multipart upload. One created for a larger size given before is
         * aborted after it (the object is in place whatever that abort answers). */
        pthread_mutex_unlock(&u->lock);
        stop_uploader(u);
        st = ckptio__s3_put(u->c, u->bucket, u->key, n ? u->parts[0].buf : NULL, (size_t)size, false);
        if (st == CKPTIO_OK) u->committed = true;
        if (st == CKPTIO_OK && u->upload_id[0]) {
            ckptio__error_saved *saved = ckptio__error_save();
            ckptio__s3_mpu_abort(u->c, u->bucket, u->key, u->upload_id);
            ckptio__error_restore(saved);
        }
        return st;
    }
    for (unsigned i = 0; i < n && st == CKPTIO_OK; i++)
        if (u->parts[i].state == P_FILLING) {
            u->parts[i].state = P_QUEUED;
            u->sent_any = true;
        }
    if (st == CKPTIO_OK) st = start_uploader(u);
    if (st == CKPTIO_OK) {
        pthread_cond_broadcast(&u->cond);
        ckptio__s3_session_wakeup(u->session);
        for (;;) {
            bool all = true;
            for (unsigned i = 0; i < n && all; i++) all = u->parts[i].state == P_DONE;
            if (all || u->fail_status != CKPTIO_OK) break;
            if (!poll) {
                pthread_cond_wait(&u->cond, &u->lock);
                continue;
            }
            struct timespec due;
            clock_gettime(CLOCK_REALTIME, &due);
            due.tv_nsec += 20 * 1000 * 1000;
            if (due.tv_nsec >= 1000000000L) due.tv_sec++, due.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&u->cond, &u->lock, &due);
            pthread_mutex_unlock(&u->lock);
            const ckptio_status ps = poll(user);
            pthread_mutex_lock(&u->lock);
            if (ps != CKPTIO_OK) {
                set_failure(u, ps);
                break;
            }
        }
        if (u->fail_status != CKPTIO_OK) st = failure(u);
    }
    pthread_mutex_unlock(&u->lock);
    stop_uploader(u);
    if (st != CKPTIO_OK) return st;
    etags = ckptio__malloc(n * sizeof *etags);
    if (!etags) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory completing an upload");
    for (unsigned i = 0; i < n; i++) etags[i] = u->parts[i].etag;
    st = ckptio__s3_mpu_complete(u->c, u->bucket, u->key, u->upload_id, etags, n);
    ckptio__free(etags);
    if (st == CKPTIO_OK) u->committed = true;
    return st;
}

ckptio_status ckptio__s3_upload_close(ckptio__s3_upload *u) {
    if (!u) return CKPTIO_OK;
    pthread_mutex_lock(&u->lock);
    if (!u->committed && u->fail_status == CKPTIO_OK) {
        u->fail_status = CKPTIO_E_CANCELED;
        snprintf(u->fail_message, sizeof u->fail_message, "the upload was closed before its commit");
    }
    pthread_mutex_unlock(&u->lock);
    stop_uploader(u);
    ckptio_status st = CKPTIO_OK;
    if (!u->committed && u->upload_id[0]) {
        /* Keep the caller's error (the reason for closing) over the abort's. */
        ckptio__error_saved *saved = ckptio__error_save();
        st = ckptio__s3_mpu_abort(u->c, u->bucket, u->key, u->upload_id);
        if (st == CKPTIO_OK) ckptio__error_restore(saved);
        else ckptio__free(saved);
    }
    /* The uploader has stopped and no writer is left (a file is closed after its transfers): no buffer is in use. */
    for (unsigned i = 0; i < u->nparts; i++) {
        ckptio__s3_part_pool_give(u->pool, u->parts[i].buf, (size_t)u->part_size);
        ckptio__free(u->parts[i].cov);
    }
    budget_give(u, u->budget_held);
    ckptio__s3_budget_release(u->budget);
    ckptio__free(u->parts);
    ckptio__s3_session_destroy(u->session);
    pthread_mutex_destroy(&u->lock);
    pthread_cond_destroy(&u->cond);
    ckptio__free(u->bucket);
    ckptio__free(u->key);
    ckptio__free(u);
    return st;
}
