/*
 * test_objstore_pool.c - the pool of upload part buffers (s3_part_pool.c),
 * without a server: a buffer given back is the one the next take of its
 * size gets (no new allocation), the kept bytes never exceed the bound
 * (the oldest go first), buffers idle for keep_ms are freed by the pool's
 * own thread, keep_ms 0 keeps nothing, many threads share one pool, and
 * destroying the pool frees what it keeps (ASan's leak check).
 */
#include "helpers.h"
#include "objstore_internal.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static ckptio__s3_part_pool_stats stats_of(ckptio__s3_part_pool *p) {
    ckptio__s3_part_pool_stats s;
    ckptio__s3_part_pool_stats_get(p, &s);
    return s;
}

static void test_buffers_are_reused(void) {
    ckptio__s3_part_pool *p;
    T_OK(ckptio__s3_part_pool_create(&p));
    ckptio__s3_part_pool_configure(p, 8 * MIB, 60000);
    unsigned char *a = ckptio__s3_part_pool_take(p, 2 * MIB), *b = ckptio__s3_part_pool_take(p, 2 * MIB);
    T_ASSERT(a && b && a != b);
    memset(a, 1, 2 * MIB);
    memset(b, 2, 2 * MIB);
    ckptio__s3_part_pool_give(p, a, 2 * MIB);
    ckptio__s3_part_pool_give(p, b, 2 * MIB);
    T_ASSERT(stats_of(p).allocated == 2 && stats_of(p).kept_bytes == 4 * MIB);
    /* A second "upload" of two parts: both buffers come back, the last given first, nothing new. */
    unsigned char *c = ckptio__s3_part_pool_take(p, 2 * MIB), *d = ckptio__s3_part_pool_take(p, 2 * MIB);
    T_ASSERT(c == b && d == a);
    ckptio__s3_part_pool_stats s = stats_of(p);
    T_ASSERT_MSG(s.allocated == 2 && s.reused == 2 && s.kept_bytes == 0, "allocated %llu reused %llu",
                 (unsigned long long)s.allocated, (unsigned long long)s.reused);
    /* Another size is never served by a kept buffer of the wrong size. */
    ckptio__s3_part_pool_give(p, c, 2 * MIB);
    unsigned char *e = ckptio__s3_part_pool_take(p, 3 * MIB);
    T_ASSERT(e && e != c && stats_of(p).allocated == 3);
    memset(e, 3, 3 * MIB);
    ckptio__s3_part_pool_give(p, d, 2 * MIB);
    ckptio__s3_part_pool_give(p, e, 3 * MIB);
    ckptio__s3_part_pool_destroy(p); /* frees the three kept buffers (ASan: no leak) */
    ckptio__s3_part_pool_give(NULL, ckptio__s3_part_pool_take(NULL, MIB), MIB); /* no pool: malloc and free */
}

static void test_bound_is_kept(void) {
    ckptio__s3_part_pool *p;
    T_OK(ckptio__s3_part_pool_create(&p));
    ckptio__s3_part_pool_configure(p, 5 * MIB, 60000);
    unsigned char *b[4];
    for (int i = 0; i < 4; i++) T_ASSERT((b[i] = ckptio__s3_part_pool_take(p, 2 * MIB)) != NULL);
    for (int i = 0; i < 4; i++) {
        ckptio__s3_part_pool_give(p, b[i], 2 * MIB);
        T_ASSERT(stats_of(p).kept_bytes <= 5 * MIB);
    }
    ckptio__s3_part_pool_stats s = stats_of(p);
    T_ASSERT_MSG(s.kept_bytes == 4 * MIB && s.kept_peak == 4 * MIB && s.freed == 2, "kept %llu freed %llu",
                 (unsigned long long)s.kept_bytes, (unsigned long long)s.freed);
    /* The newest are kept: the next takes get b[3], then b[2]. */
    unsigned char *x = ckptio__s3_part_pool_take(p, 2 * MIB), *y = ckptio__s3_part_pool_take(p, 2 * MIB);
    T_ASSERT(x == b[3] && y == b[2]);
    /* A buffer larger than the bound is never kept. */
    unsigned char *big = ckptio__s3_part_pool_take(p, 6 * MIB);
    ckptio__s3_part_pool_give(p, big, 6 * MIB);
    T_ASSERT(stats_of(p).kept_bytes == 0);
    ckptio__s3_part_pool_give(p, x, 2 * MIB);
    ckptio__s3_part_pool_give(p, y, 2 * MIB);
    /* A smaller bound applies at once: the older of the two goes. */
    ckptio__s3_part_pool_configure(p, 3 * MIB, 60000);
    T_ASSERT(stats_of(p).kept_bytes == 2 * MIB);
    T_ASSERT(ckptio__s3_part_pool_take(p, 2 * MIB) == y);
    ckptio__s3_part_pool_give(p, y, 2 * MIB);
    ckptio__s3_part_pool_trim(p);
    T_ASSERT(stats_of(p).kept_bytes == 0);
    ckptio__s3_part_pool_destroy(p);
}

static void test_idle_buffers_are_freed(void) {
    ckptio__s3_part_pool *p;
    T_OK(ckptio__s3_part_pool_create(&p));
    ckptio__s3_part_pool_configure(p, 8 * MIB, 0); /* keep nothing */
    ckptio__s3_part_pool_give(p, ckptio__s3_part_pool_take(p, MIB), MIB);
    T_ASSERT(stats_of(p).kept_bytes == 0 && stats_of(p).freed == 1);
    ckptio__s3_part_pool_configure(p, 8 * MIB, 100);
    ckptio__s3_part_pool_give(p, ckptio__s3_part_pool_take(p, MIB), MIB);
    ckptio__s3_part_pool_give(p, ckptio__s3_part_pool_take(p, MIB), MIB);
    T_ASSERT(stats_of(p).kept_bytes == MIB);
    double t0 = ckptio__now();
    while (stats_of(p).kept_bytes && ckptio__now() - t0 < 10) usleep(10000);
    T_ASSERT_MSG(stats_of(p).kept_bytes == 0, "a buffer idle for 10 s is still kept");
    T_ASSERT(ckptio__now() - t0 >= 0.05); /* not before its time */
    /* The trimmer ended with the pool empty; a later buffer starts it again. */
    ckptio__s3_part_pool_give(p, ckptio__s3_part_pool_take(p, MIB), MIB);
    t0 = ckptio__now();
    while (stats_of(p).kept_bytes && ckptio__now() - t0 < 10) usleep(10000);
    T_ASSERT(stats_of(p).kept_bytes == 0);
    /* Destroyed while a buffer waits: the trimmer stops at once and the buffer is freed. */
    ckptio__s3_part_pool_configure(p, 8 * MIB, 3600 * 1000);
    ckptio__s3_part_pool_give(p, ckptio__s3_part_pool_take(p, MIB), MIB);
    t0 = ckptio__now();
    ckptio__s3_part_pool_destroy(p);
    T_ASSERT(ckptio__now() - t0 < 5);
}

typedef struct sharer {
    ckptio__s3_part_pool *pool;
    unsigned char tag;
    int bad;
} sharer;

/* Takes two buffers at a time, fills them with its tag, checks that no
 * other thread wrote into them while it held them, gives them back. */
static void *share(void *arg) {
    sharer *s = arg;
    for (int round = 0; round < 200; round++) {
        unsigned char *a = ckptio__s3_part_pool_take(s->pool, 64 << 10);
        unsigned char *b = ckptio__s3_part_pool_take(s->pool, 64 << 10);
        if (!a || !b) {
            s->bad++;
            break;
        }
        memset(a, s->tag, 64 << 10);
        memset(b, s->tag, 64 << 10);
        sched_yield();
        for (size_t i = 0; i < 64 << 10; i += 4096) s->bad += a[i] != s->tag || b[i] != s->tag;
        ckptio__s3_part_pool_give(s->pool, a, 64 << 10);
        ckptio__s3_part_pool_give(s->pool, b, 64 << 10);
    }
    return NULL;
}

static void test_threads_share_a_pool(void) {
    ckptio__s3_part_pool *p;
    T_OK(ckptio__s3_part_pool_create(&p));
    ckptio__s3_part_pool_configure(p, 8 * (64 << 10), 60000); /* what the 4 threads hold at most */
    sharer s[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (sharer){.pool = p, .tag = (unsigned char)(i + 1)};
        T_ASSERT(pthread_create(&t[i], NULL, share, &s[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        T_ASSERT_MSG(s[i].bad == 0, "thread %d saw its buffer changed %d times", i, s[i].bad);
    }
    ckptio__s3_part_pool_stats st = stats_of(p);
    T_ASSERT(st.allocated + st.reused == 4 * 200 * 2);
    T_ASSERT(st.kept_peak <= 8 * (64 << 10));
    /* 1,600 takes, at most 8 buffers held at once, all of them kept between: 8 allocations at most. */
    T_ASSERT_MSG(st.allocated <= 8 && st.freed == 0, "allocated %llu, freed %llu", (unsigned long long)st.allocated,
                 (unsigned long long)st.freed);
    ckptio__s3_part_pool_destroy(p);
}

int main(void) {
    T_RUN(test_buffers_are_reused);
    T_RUN(test_bound_is_kept);
    T_RUN(test_idle_buffers_are_freed);
    T_RUN(test_threads_share_a_pool);
    return T_EXIT_PASS;
}
