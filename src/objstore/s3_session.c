/*
 * s3_session.c - requests in flight on one curl multi handle, driven by the
 * thread that waits for them, with retries.
 *
 * A failed attempt that may be retried waits out a backoff before the next:
 * "full jitter", a random time in [0, min(20 s, backoff_ms x 2^(attempt-1))),
 * so that many clients told to slow down do not come back in step. A request
 * gives up after `retries` retries or when the next attempt would start
 * past its deadline (deadline_ms after it was submitted); each attempt is
 * also bounded by that deadline and fails early when it stalls (no byte
 * for timeout_ms). Connections stay open in the multi handle between
 * requests; sessions for one-off requests come from a small process-wide
 * pool, so those reuse connections too. A session made before fork() is
 * never used in the child (its sockets are the parent's).
 */
#include "objstore_private.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ckptio__s3_session {
    CURLM *multi;
    ckptio__s3_request *active;  /* transfers in the multi handle (active_next) */
    ckptio__s3_request *waiting; /* backing off until r->due */
    ckptio__s3_request *done;    /* finished, not yet handed back (a queue) */
    ckptio__s3_request *done_tail;
    unsigned inflight;           /* submitted and not yet handed back */
    _Atomic int woken;
    unsigned generation;         /* ckptio__fork_generation() at creation */
    ckptio__s3_session *pool_next;
};

static _Atomic unsigned backoff_cap_ms;

void ckptio__s3_set_backoff_cap_ms(unsigned ms) { atomic_store(&backoff_cap_ms, ms); }

ckptio_status ckptio__s3_session_create(ckptio__s3_session **out) {
    ckptio__s3_global_init();
    ckptio__s3_session *s = ckptio__calloc(1, sizeof *s);
    if (!s) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for an S3 session");
    s->multi = curl_multi_init();
    if (!s->multi) {
        ckptio__free(s);
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "libcurl could not create a multi handle (out of memory)");
    }
    curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS, 64L);
    s->generation = ckptio__fork_generation();
    *out = s;
    return CKPTIO_OK;
}

void ckptio__s3_session_destroy(ckptio__s3_session *s) {
    if (!s) return;
    /* Requests still in flight belong to their owners; only detach them. */
    if (!ckptio__forked_since(s->generation)) curl_multi_cleanup(s->multi);
    ckptio__free(s);
}

unsigned ckptio__s3_inflight(const ckptio__s3_session *s) { return s->inflight; }

void ckptio__s3_session_wakeup(ckptio__s3_session *s) {
    atomic_store(&s->woken, 1);
    curl_multi_wakeup(s->multi);
}

static void push_done(ckptio__s3_session *s, ckptio__s3_request *r) {
    r->next = NULL;
    if (s->done_tail) s->done_tail->next = r;
    else s->done = r;
    s->done_tail = r;
}

static void failed(ckptio__s3_request *r, ckptio_status status, const char *message) {
    r->status = status;
    ckptio__free(r->message);
    r->message = ckptio__strdup(message);
}

static void start(ckptio__s3_session *s, ckptio__s3_request *r) {
    if (!ckptio__s3_attempt_prepare(r)) {
        push_done(s, r);
        return;
    }
    if (curl_multi_add_handle(s->multi, r->easy) != CURLM_OK) {
        failed(r, CKPTIO_E_IO, "libcurl refused the request (curl_multi_add_handle)");
        push_done(s, r);
        return;
    }
    r->active_prev = NULL;
    r->active_next = s->active;
    if (s->active) s->active->active_prev = r;
    s->active = r;
}

/* Takes r out of the multi handle and the list of transfers under way. */
static void stop_transfer(ckptio__s3_session *s, ckptio__s3_request *r) {
    curl_multi_remove_handle(s->multi, r->easy);
    if (r->active_prev) r->active_prev->active_next = r->active_next;
    else s->active = r->active_next;
    if (r->active_next) r->active_next->active_prev = r->active_prev;
    r->active_prev = r->active_next = NULL;
}

void ckptio__s3_session_cancel(ckptio__s3_session *s, const char *why) {
    while (s->active) {
        ckptio__s3_request *r = s->active;
        stop_transfer(s, r);
        failed(r, CKPTIO_E_CANCELED, why);
        push_done(s, r);
    }
    while (s->waiting) {
        ckptio__s3_request *r = s->waiting;
        s->waiting = r->next;
        failed(r, CKPTIO_E_CANCELED, why);
        push_done(s, r);
    }
}

void ckptio__s3_submit(ckptio__s3_session *s, ckptio__s3_request *r) {
    r->started = ckptio__now();
    r->attempts = 0;
    r->received = 0;
    r->status = CKPTIO_OK;
    r->payload_hash[0] = '\0';
    s->inflight++;
    start(s, r);
}

static double backoff(const ckptio__s3_request *r) {
    double ceiling = r->client->settings.backoff_ms / 1000.0;
    for (unsigned i = 1; i < r->attempts && ceiling < 20.0; i++) ceiling *= 2;
    if (ceiling > 20.0) ceiling = 20.0;
    unsigned char rnd[4];
    ckptio__random_bytes(rnd, sizeof rnd);
    const uint32_t v = (uint32_t)rnd[0] | (uint32_t)rnd[1] << 8 | (uint32_t)rnd[2] << 16 | (uint32_t)rnd[3] << 24;
    double wait = ceiling * (v / 4294967296.0);
    const unsigned cap = atomic_load(&backoff_cap_ms);
    if (cap && wait > cap / 1000.0) wait = cap / 1000.0;
    return wait;
}

/* Takes in every finished transfer. */
static void collect(ckptio__s3_session *s) {
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(s->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        CURL *e = m->easy_handle;
        const CURLcode code = m->data.result;
        ckptio__s3_request *r = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&r);
        if (!r) {
            curl_multi_remove_handle(s->multi, e);
            continue;
        }
        stop_transfer(s, r);
        const ckptio__s3_verdict v = ckptio__s3_attempt_finish(r, (int)code);
        if (v == CKPTIO__S3_RETRY) {
            const double now = ckptio__now();
            const double wait = backoff(r);
            if (ckptio__s3_may_retry(r, now, wait)) {
                r->due = now + wait;
                r->next = s->waiting;
                s->waiting = r;
                continue;
            }
        }
        push_done(s, r);
    }
}

ckptio__s3_request *ckptio__s3_wait(ckptio__s3_session *s) {
    for (;;) {
        if (s->done) {
            ckptio__s3_request *r = s->done;
            s->done = r->next;
            if (!s->done) s->done_tail = NULL;
            r->next = NULL;
            s->inflight--;
            return r;
        }
        if (!s->inflight) return NULL;
        if (atomic_exchange(&s->woken, 0)) return NULL;
        int running = 0;
        curl_multi_perform(s->multi, &running);
        collect(s);
        /* Backoffs that are over start their next attempt. */
        const double now = ckptio__now();
        double next_due = 0;
        for (ckptio__s3_request **pp = &s->waiting; *pp;) {
            ckptio__s3_request *r = *pp;
            if (r->due <= now) {
                *pp = r->next;
                start(s, r);
            } else {
                if (!next_due || r->due < next_due) next_due = r->due;
                pp = &r->next;
            }
        }
        if (s->done) continue;
        int timeout = 1000;
        if (next_due) {
            const double ms = (next_due - now) * 1000.0 + 1;
            if (ms < timeout) timeout = ms < 1 ? 1 : (int)ms;
        }
        curl_multi_poll(s->multi, NULL, 0, timeout, NULL);
    }
}

/* ---- one request on a pooled session ------------------------------------------- */

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static ckptio__s3_session *pool;
static unsigned pool_size;
#define POOL_MAX 16

ckptio_status ckptio__s3_perform(ckptio__s3_request *r) {
    ckptio__s3_session *s = NULL;
    pthread_mutex_lock(&pool_lock);
    while (pool && !s) {
        s = pool;
        pool = s->pool_next;
        pool_size--;
        if (ckptio__forked_since(s->generation)) {
            ckptio__free(s); /* the parent's connections: left alone */
            s = NULL;
        }
    }
    pthread_mutex_unlock(&pool_lock);
    if (!s) CKPTIO_FORWARD(ckptio__s3_session_create(&s));
    ckptio__s3_submit(s, r);
    while (ckptio__s3_wait(s) != r) {
    }
    pthread_mutex_lock(&pool_lock);
    if (pool_size < POOL_MAX) {
        s->pool_next = pool;
        pool = s;
        pool_size++;
        s = NULL;
    }
    pthread_mutex_unlock(&pool_lock);
    ckptio__s3_session_destroy(s);
    return ckptio__s3_request_fail(r);
}
