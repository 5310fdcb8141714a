/*
 * util.c - version, clock, sorting and size parsing.
 */
#include "common_internal.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define CKPTIO_STR2_(x) #x
#define CKPTIO_STR_(x) CKPTIO_STR2_(x)

void ckptio__sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *, void *), void *arg) {
    const unsigned char *b = base;
    size_t i = 1;
    while (i < n && cmp(b + (i - 1) * size, b + i * size, arg) < 0) i++;
    if (i < n) qsort_r(base, n, size, cmp, arg);
}

const char *ckptio_version(void) {
    return CKPTIO_STR_(CKPTIO_VERSION_MAJOR) "." CKPTIO_STR_(CKPTIO_VERSION_MINOR) "." CKPTIO_STR_(
        CKPTIO_VERSION_PATCH);
}

unsigned ckptio_version_number(void) { return CKPTIO_VERSION_NUMBER; }

double ckptio__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool ckptio__parse_size(const char *text, uint64_t *out) {
    if (!text || !*text) return false;
    while (isspace((unsigned char)*text)) text++;
    if (!isdigit((unsigned char)*text)) return false;
    errno = 0;
    char *end = NULL;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno) return false;
    while (isspace((unsigned char)*end)) end++;
    uint64_t mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mult = 1ull << 10; break;
        case 'M': mult = 1ull << 20; break;
        case 'G': mult = 1ull << 30; break;
        case 'T': mult = 1ull << 40; break;
        case 'B': mult = 1; end--; break; /* plain "B" suffix */
        default: return false;
        }
        end++;
        /* Accept K, KB, KiB, Ki (binary units throughout). */
        if (strcasecmp(end, "") != 0 && strcasecmp(end, "b") != 0 && strcasecmp(end, "ib") != 0 &&
            strcasecmp(end, "i") != 0)
            return false;
    }
    uint64_t bytes;
    if (ckptio__mul_overflows(value, mult, &bytes)) return false;
    *out = bytes;
    return true;
}

int ckptio__thread_start(pthread_t *thread, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int err = pthread_create(thread, attr, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return err;
}
