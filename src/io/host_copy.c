/*
 * host_copy.c - the copies that fill new host memory: what a load of a
 * checkpoint held in memory (bytes) copies its tensors with.
 *
 * The copies run on the calling thread, and from CKPTIO__COPY_TWO_THREADS_MIN
 * bytes in all the second half of them on one more thread: one thread copies
 * at about half the memory bandwidth.
 */
#include "io_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>

/* From this many bytes in all, a second thread copies half. */
#define CKPTIO__COPY_TWO_THREADS_MIN ((uint64_t)8 << 20)

/* One thread's share of the copies: [first, last) with the first and last
 * possibly cut (start_skip bytes off the first, end_keep bytes of the last). */
typedef struct copy_share {
    const ckptio_copy *copies;
    size_t first, last;
    size_t start_skip;          /* bytes of copies[first] the other thread copies */
    size_t end_keep;            /* bytes of copies[last - 1] this share copies (SIZE_MAX: all) */
    ckptio_status status;
    ckptio__error_saved *error; /* the helper's failure, for the calling thread */
} copy_share;

static ckptio_status run_share(const copy_share *s) {
    for (size_t i = s->first; i < s->last; i++) {
        size_t from = i == s->first ? s->start_skip : 0;
        size_t to = i + 1 == s->last && s->end_keep != SIZE_MAX ? s->end_keep : s->copies[i].n;
        if (to <= from) continue;
        const ckptio_copy *c = &s->copies[i];
        CKPTIO_FORWARD(ckptio__guarded_copy((unsigned char *)c->dst + from, (const unsigned char *)c->src + from,
                                            to - from, NULL));
    }
    return CKPTIO_OK;
}

static void *run_helper(void *arg) {
    copy_share *s = arg;
    s->status = run_share(s);
    if (s->status != CKPTIO_OK) s->error = ckptio__error_save();
    return NULL;
}

static bool two_cpus(void) {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 2;
}

ckptio_status ckptio_host_copy(const ckptio_copy *copies, size_t count) {
    CKPTIO_RETURN_IF(!copies && count, CKPTIO_E_INVAL, "ckptio_host_copy: NULL copies");
    uint64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        CKPTIO_RETURN_IF((!copies[i].dst || !copies[i].src) && copies[i].n, CKPTIO_E_INVAL,
                         "ckptio_host_copy: copy %zu has a NULL buffer of %zu bytes", i, copies[i].n);
        total += copies[i].n;
    }
    copy_share mine = {copies, 0, count, 0, SIZE_MAX, CKPTIO_OK, NULL};
    if (total < CKPTIO__COPY_TWO_THREADS_MIN || !two_cpus()) return run_share(&mine);
    /* Cut where half the bytes fall: the copy holding byte total/2 is split. */
    const uint64_t half = total / 2;
    uint64_t done = 0;
    size_t cut = 0;
    while (cut < count && done + copies[cut].n <= half) done += copies[cut++].n;
    const size_t within = (size_t)(half - done); /* bytes of copies[cut] the calling thread copies */
    mine.last = cut < count ? cut + 1 : count;
    mine.end_keep = cut < count ? within : SIZE_MAX;
    copy_share other = {copies, cut, count, cut < count ? within : 0, SIZE_MAX, CKPTIO_OK, NULL};
    pthread_t helper;
    if (ckptio__thread_start(&helper, NULL, run_helper, &other) != 0) {
        mine.last = count;
        mine.end_keep = SIZE_MAX;
        return run_share(&mine); /* no thread: all of it here */
    }
    const ckptio_status st = run_share(&mine);
    pthread_join(helper, NULL);
    if (st != CKPTIO_OK) {
        free(other.error); /* the first failure is the calling thread's own */
        return st;
    }
    if (other.status != CKPTIO_OK) ckptio__error_restore(other.error);
    return other.status;
}
