/*
 * s3_part_pool.c - upload part buffers kept between uploads.
 *
 * A part buffer is 16 MiB or more, and a save's uploads together need a few
 * hundred MiB of them. Memory fresh from the system costs a page fault per
 * page at its first touch, about as much CPU as copying the bytes into it,
 * so the buffers of finished parts come here instead of going back to
 * malloc, and the next part (of the same upload or of a later one, on any
 * thread) takes one that is already resident. The pool keeps at most
 * `bound` bytes (the oldest buffers go first), and a buffer that no upload
 * took for `keep_ms` is freed by a thread that lives only while the pool
 * holds buffers; everything kept is freed when the pool is destroyed (with
 * its engine).
 *
 * A buffer in the pool belongs to no part: the upload gives a part's buffer
 * back only once the part is stored (no request reads it, no writer copies
 * into it; s3_upload.c).
 */
#include "objstore_private.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct kept_buffer {
    unsigned char *buf;
    size_t size;
    double since; /* ckptio__now() when it was given back */
} kept_buffer;

struct ckptio__s3_part_pool {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* the trimmer's clock: a stop, or a new buffer */
    kept_buffer *kept;   /* oldest first */
    unsigned n, cap;
    uint64_t bound;
    unsigned keep_ms;
    bool trimmer_started, trimmer_running, stopping;
    pthread_t trimmer;
    ckptio__s3_part_pool_stats stats;
};

ckptio_status ckptio__s3_part_pool_create(ckptio__s3_part_pool **out) {
    *out = NULL;
    ckptio__s3_part_pool *p = ckptio__calloc(1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the upload buffer pool");
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, &attr);
    pthread_condattr_destroy(&attr);
    *out = p;
    return CKPTIO_OK;
}

/* Removes entry i (lock held) and returns its buffer. */
static kept_buffer remove_at(ckptio__s3_part_pool *p, unsigned i) {
    const kept_buffer k = p->kept[i];
    memmove(p->kept + i, p->kept + i + 1, (p->n - i - 1) * sizeof *p->kept);
    p->n--;
    p->stats.kept_bytes -= k.size;
    return k;
}

void ckptio__s3_part_pool_configure(ckptio__s3_part_pool *p, uint64_t bound, unsigned keep_ms) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->bound = bound;
    p->keep_ms = keep_ms;
    pthread_cond_broadcast(&p->cond); /* the trimmer's deadlines moved */
    /* A smaller bound or keep_ms 0 takes effect now: the oldest buffers go. */
    while (p->n && (p->stats.kept_bytes > bound || !keep_ms)) {
        unsigned char *b = remove_at(p, 0).buf;
        p->stats.freed++;
        pthread_mutex_unlock(&p->lock);
        ckptio__free(b);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
}

unsigned char *ckptio__s3_part_pool_take(ckptio__s3_part_pool *p, size_t size) {
    if (p) {
        pthread_mutex_lock(&p->lock);
        /* The most recently given buffer first: its pages are the likeliest still in the caches. */
        for (unsigned i = p->n; i-- > 0;) {
            if (p->kept[i].size != size) continue;
            unsigned char *b = remove_at(p, i).buf;
            p->stats.reused++;
            pthread_mutex_unlock(&p->lock);
            return b;
        }
        p->stats.allocated++;
        pthread_mutex_unlock(&p->lock);
    }
    return ckptio__malloc(size);
}

static void *trimmer(void *arg);

/* Starts the trimmer when it is not running (lock held). Without it the
 * buffers stay until the pool is destroyed or taken again. */
static void start_trimmer(ckptio__s3_part_pool *p) {
    if (p->trimmer_running) return;
    if (p->trimmer_started) pthread_join(p->trimmer, NULL); /* it ended: it holds no lock any more */
    p->trimmer_started = false;
    const int err = ckptio__thread_start(&p->trimmer, NULL, trimmer, p);
    if (err) return;
    p->trimmer_started = p->trimmer_running = true;
}

void ckptio__s3_part_pool_give(ckptio__s3_part_pool *p, unsigned char *buf, size_t size) {
    if (!buf) return;
    if (!p) {
        ckptio__free(buf);
        return;
    }
    unsigned char *drop[8];
    unsigned ndrop = 0;
    pthread_mutex_lock(&p->lock);
    bool keep = !p->stopping && p->keep_ms > 0 && size <= p->bound;
    /* Room for it: the oldest buffers go (freed below, outside the lock). */
    while (keep && p->stats.kept_bytes + size > p->bound && ndrop < sizeof drop / sizeof drop[0])
        drop[ndrop++] = remove_at(p, 0).buf;
    keep = keep && p->stats.kept_bytes + size <= p->bound;
    if (keep && p->n == p->cap) {
        const unsigned cap = p->cap ? p->cap * 2 : 16;
        kept_buffer *k = ckptio__realloc(p->kept, cap * sizeof *k);
        if (k) {
            p->kept = k;
            p->cap = cap;
        } else {
            keep = false;
        }
    }
    if (keep) {
        p->kept[p->n++] = (kept_buffer){.buf = buf, .size = size, .since = ckptio__now()};
        p->stats.kept_bytes += size;
        if (p->stats.kept_bytes > p->stats.kept_peak) p->stats.kept_peak = p->stats.kept_bytes;
        start_trimmer(p);
        pthread_cond_broadcast(&p->cond);
    } else {
        p->stats.freed++;
    }
    p->stats.freed += ndrop;
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < ndrop; i++) ckptio__free(drop[i]);
    if (!keep) ckptio__free(buf);
}

/* Frees the buffers kept for keep_ms or longer; sleeps until the oldest is
 * due; ends when the pool is empty or stopping. */
static void *trimmer(void *arg) {
    ckptio__s3_part_pool *p = arg;
    pthread_mutex_lock(&p->lock);
    while (!p->stopping && p->n > 0) {
        const double now = ckptio__now(), keep = p->keep_ms / 1000.0;
        if (p->kept[0].since + keep > now) {
            const double due = p->kept[0].since + keep;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            const double wait = due - now;
            ts.tv_sec += (time_t)wait;
            ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&p->cond, &p->lock, &ts);
            continue;
        }
        unsigned char *b = remove_at(p, 0).buf;
        p->stats.freed++;
        pthread_mutex_unlock(&p->lock);
        ckptio__free(b);
        pthread_mutex_lock(&p->lock);
    }
    p->trimmer_running = false;
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

void ckptio__s3_part_pool_trim(ckptio__s3_part_pool *p) {
    if (!p) return;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        if (!p->n) {
            pthread_mutex_unlock(&p->lock);
            return;
        }
        unsigned char *b = remove_at(p, 0).buf;
        p->stats.freed++;
        pthread_mutex_unlock(&p->lock);
        ckptio__free(b);
    }
}

void ckptio__s3_part_pool_stats_get(ckptio__s3_part_pool *p, ckptio__s3_part_pool_stats *out) {
    memset(out, 0, sizeof *out);
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    *out = p->stats;
    pthread_mutex_unlock(&p->lock);
}

void ckptio__s3_part_pool_destroy(ckptio__s3_part_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    if (p->trimmer_started) pthread_join(p->trimmer, NULL);
    for (unsigned i = 0; i < p->n; i++) ckptio__free(p->kept[i].buf);
    ckptio__free(p->kept);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    ckptio__free(p);
}

void ckptio__s3_part_pool_forget(ckptio__s3_part_pool *p) {
    if (!p) return;
    /* The lock free means no thread of the parent was changing the list at
     * fork(): it is whole and its buffers (this process's copies) can go.
     * Held, the list may be half-changed: left alone (address space only;
     * the child never touched those pages), and the lock made anew (the
     * child has one thread). The pool itself stays, stopping: an upload
     * opened before the fork still gives its buffers back to it, and a
     * stopping pool frees them. */
    if (pthread_mutex_trylock(&p->lock) == 0) {
        for (unsigned i = 0; i < p->n; i++) ckptio__free(p->kept[i].buf);
        ckptio__free(p->kept);
    } else {
        pthread_mutex_init(&p->lock, NULL);
        pthread_mutex_lock(&p->lock);
    }
    p->kept = NULL;
    p->n = p->cap = 0;
    p->stats.kept_bytes = 0;
    p->stopping = true;
    p->trimmer_started = p->trimmer_running = false; /* the parent's thread: not in this process */
    pthread_mutex_unlock(&p->lock);
}
