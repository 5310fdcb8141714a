/*
 * alloc.c - the library's allocation functions.
 *
 * One place for every allocation so that tests can make the n-th one fail
 * (ckptio__alloc_fail_after) and prove that each error path cleans up.
 */
#include "common_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* 0 = never fail; otherwise the countdown to the failing allocation. */
static _Atomic uint64_t fail_countdown = 0;

void ckptio__alloc_fail_after(uint64_t n) { atomic_store(&fail_countdown, n); }

static bool should_fail(void) {
    uint64_t cur = atomic_load(&fail_countdown);
    while (cur != 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &cur, cur - 1)) return cur == 1;
    }
    return false;
}

void *ckptio__malloc(size_t size) {
    if (should_fail()) return NULL;
    return malloc(size ? size : 1);
}

void *ckptio__calloc(size_t count, size_t size) {
    if (should_fail()) return NULL;
    if (count == 0 || size == 0) return calloc(1, 1);
    return calloc(count, size);
}

void *ckptio__realloc(void *ptr, size_t size) {
    if (should_fail()) return NULL;
    return realloc(ptr, size ? size : 1);
}

void ckptio__free(void *ptr) { free(ptr); }

char *ckptio__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = ckptio__malloc(n);
    if (copy) memcpy(copy, s, n);
    return copy;
}

void *ckptio__aligned_alloc(size_t alignment, size_t size) {
    if (should_fail()) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, alignment, size ? size : alignment) != 0) return NULL;
    return p;
}
