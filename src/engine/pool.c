/*
 * pool.c - the engine's persistent worker threads.
 *
 * Threads are created on first need and live until the engine is
 * destroyed: a checkpoint load of 10,000 small tensors must not pay for
 * thread creation, and neither must the next load. A job is "run fn on n
 * threads"; the pool grows until every worker of every queued job can have
 * its own thread, because workers of one job (the GPU pipeline's readers and
 * copiers) may wait on each other. The thread that submits a job waits on a
 * condition variable with a timeout so that it can report progress.
 */
#include "engine_private.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>

#define CKPTIO_POOL_MAX_THREADS 1024u

typedef struct pool_job {
    ckptio__worker_fn fn;
    void *arg;
    unsigned n, claimed, finished;
    struct pool_job *next;
} pool_job;

struct ckptio__pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* jobs queued or stop */
    pthread_cond_t done_cv;   /* a job finished (monotonic clock) */
    pthread_t *threads;
    unsigned nthreads, cap;
    unsigned running;         /* threads executing a worker now */
    pool_job *head, *tail;    /* jobs with unclaimed workers */
    bool stop;
};

static void *thread_main(void *arg) {
    ckptio__pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->head) pthread_cond_wait(&p->work_cv, &p->mu);
        if (!p->head) break; /* stop, and nothing left to claim */
        pool_job *job = p->head;
        const unsigned worker = job->claimed++;
        if (job->claimed == job->n) {
            p->head = job->next;
            if (!p->head) p->tail = NULL;
        }
        p->running++;
        pthread_mutex_unlock(&p->mu);
        job->fn(job->arg, worker);
        pthread_mutex_lock(&p->mu);
        p->running--;
        if (++job->finished == job->n) pthread_cond_broadcast(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ckptio_status ckptio__pool_create(ckptio__pool **out) {
    ckptio__pool *p = ckptio__calloc(1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory creating the worker pool");
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, &attr);
    pthread_condattr_destroy(&attr);
    *out = p;
    return CKPTIO_OK;
}

/* Adds one thread; the caller holds p->mu. Library threads block every
 * signal so that the application's handlers run on its own threads. */
static ckptio_status spawn(ckptio__pool *p) {
    if (p->nthreads == CKPTIO_POOL_MAX_THREADS)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "the worker pool already has %u threads", CKPTIO_POOL_MAX_THREADS);
    if (p->nthreads == p->cap) {
        unsigned cap = p->cap ? p->cap * 2 : 8;
        pthread_t *t = ckptio__realloc(p->threads, cap * sizeof *t);
        if (!t) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory growing the worker pool");
        p->threads = t;
        p->cap = cap;
    }
    int err = ckptio__thread_start(&p->threads[p->nthreads], NULL, thread_main, p);
    if (err) return CKPTIO_FAIL_SYS(err, "pthread_create", "", -1, "starting worker thread %u", p->nthreads + 1);
    p->nthreads++;
    return CKPTIO_OK;
}

ckptio_status ckptio__pool_run(ckptio__pool *p, unsigned n, ckptio__worker_fn fn, void *arg,
                               ckptio__pool_tick_fn tick, void *tick_arg, unsigned tick_ms) {
    if (n == 0) return CKPTIO_OK;
    pool_job job = {.fn = fn, .arg = arg, .n = n};
    pthread_mutex_lock(&p->mu);
    unsigned unclaimed = 0;
    for (pool_job *j = p->head; j; j = j->next) unclaimed += j->n - j->claimed;
    /* Free threads (not running a worker) must cover every unclaimed
     * worker, this job's included. */
    while (p->nthreads - p->running < unclaimed + n) {
        ckptio_status st = spawn(p);
        if (st != CKPTIO_OK) {
            pthread_mutex_unlock(&p->mu);
            return st;
        }
    }
    if (p->tail) p->tail->next = &job;
    else p->head = &job;
    p->tail = &job;
    pthread_cond_broadcast(&p->work_cv);
    while (job.finished < n) {
        if (!tick) {
            pthread_cond_wait(&p->done_cv, &p->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)tick_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        int rc = pthread_cond_timedwait(&p->done_cv, &p->mu, &ts);
        if (rc == ETIMEDOUT && job.finished < n) {
            pthread_mutex_unlock(&p->mu);
            tick(tick_arg);
            pthread_mutex_lock(&p->mu);
        }
    }
    pthread_mutex_unlock(&p->mu);
    return CKPTIO_OK;
}

void ckptio__pool_forget(ckptio__pool *p) {
    if (!p) return;
    ckptio__free(p->threads);
    ckptio__free(p);
}

void ckptio__pool_destroy(ckptio__pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    ckptio__free(p->threads);
    ckptio__free(p);
}
