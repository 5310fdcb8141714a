/*
 * env_check.c - CKPTIO_* environment variables that ckptio does not read.
 *
 * Settings come from the environment (settings.c reads each setting's
 * variable once per engine), so a misspelt name, CKPTIO_THREDS=4, would be
 * ignored without a word. ckptio_env_check() lists such names with the
 * closest name ckptio does read, both taken from the settings table; names
 * starting with CKPTIO_TEST_ (the project's tests and benchmarks) are never
 * listed. The library itself never prints: the Python package turns each
 * line into a warning at its first engine and the CLI prints them on stderr.
 *
 * "Closest": the optimal-string-alignment distance (insertions, deletions,
 * substitutions, transpositions of neighbours) of the parts after CKPTIO_,
 * case ignored; a suggestion is made when it is at most a third of the
 * longer name (at least 2), or when the name is a known one cut short.
 */
#include "engine_private.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

extern char **environ;

#define PREFIX "CKPTIO_"
#define MAX_NAME 64 /* longer names get no suggestion */

/* Never reported: the prefix of the variables ckptio's own tests and
 * benchmarks use (the library reads none of them). */
#define TEST_PREFIX "CKPTIO_TEST_"

/* Names ckptio reads: the settings, then the variables read outside them
 * (settings.c has both); NULL past the end. */
static const char *candidate(size_t i) {
    if (i < CKPTIO_OPT_COUNT_) return ckptio__option_env((ckptio_option)i);
    const ckptio__variable *v = ckptio__variable_def(i - CKPTIO_OPT_COUNT_);
    return v ? v->env : NULL;
}

static bool known(const char *name, size_t len) {
    if (len >= sizeof TEST_PREFIX - 1 && memcmp(name, TEST_PREFIX, sizeof TEST_PREFIX - 1) == 0) return true;
    const char *c;
    for (size_t i = 0; (c = candidate(i)) != NULL; i++)
        if (strlen(c) == len && memcmp(c, name, len) == 0) return true;
    return false;
}

/* Optimal string alignment distance of a[0..n) and b[0..m), case ignored. */
static size_t distance(const char *a, size_t n, const char *b, size_t m) {
    size_t rows[3][MAX_NAME + 1];
    size_t *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= m; j++) prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            const int ai = toupper((unsigned char)a[i - 1]), bj = toupper((unsigned char)b[j - 1]);
            size_t d = prev[j - 1] + (ai != bj);
            if (prev[j] + 1 < d) d = prev[j] + 1;
            if (cur[j - 1] + 1 < d) d = cur[j - 1] + 1;
            if (i > 1 && j > 1 && ai == toupper((unsigned char)b[j - 2]) && toupper((unsigned char)a[i - 2]) == bj &&
                prev2[j - 2] + 1 < d)
                d = prev2[j - 2] + 1;
            cur[j] = d;
        }
        size_t *t = prev2;
        prev2 = prev, prev = cur, cur = t;
    }
    return prev[m];
}

static bool starts_with_nocase(const char *s, size_t n, const char *prefix, size_t p) {
    if (p > n || p < 4) return false;
    for (size_t i = 0; i < p; i++)
        if (toupper((unsigned char)s[i]) != toupper((unsigned char)prefix[i])) return false;
    return true;
}

/* The known name closest to `name` (its first `len` characters), or NULL. */
static const char *closest(const char *name, size_t len) {
    const size_t skip = sizeof PREFIX - 1;
    const char *s = name + skip;
    const size_t n = len - skip;
    if (n > MAX_NAME) return NULL;
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    const char *cand;
    for (size_t i = 0; (cand = candidate(i)) != NULL; i++) {
        const char *c = cand + skip;
        const size_t m = strlen(c);
        size_t limit = (n > m ? n : m) / 3;
        if (limit < 2) limit = 2;
        size_t d = distance(s, n, c, m);
        /* A name cut short: CKPTIO_DIRECT_MIN for CKPTIO_DIRECT_MIN_BYTES. */
        if (d > limit && starts_with_nocase(c, m, s, n)) d = limit;
        if (d <= limit && d < best_d) best = cand, best_d = d;
    }
    return best;
}

/* Appends to message[*used..capacity), keeping it NUL-terminated (truncated). */
static void append(char *message, size_t capacity, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *message, size_t capacity, size_t *used, const char *fmt, ...) {
    if (!message || *used + 1 >= capacity) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(message + *used, capacity - *used, fmt, ap);
    va_end(ap);
    if (n > 0) *used += (size_t)n < capacity - *used ? (size_t)n : capacity - *used - 1;
}

ckptio_status ckptio_env_check(char *message, size_t capacity, size_t *unknown) {
    CKPTIO_RETURN_IF(!unknown, CKPTIO_E_INVAL, "ckptio_env_check: unknown is NULL");
    CKPTIO_RETURN_IF(!message && capacity, CKPTIO_E_INVAL, "ckptio_env_check: message is NULL with capacity %zu",
                     capacity);
    size_t used = 0, count = 0;
    if (message && capacity) message[0] = '\0';
    for (char **env = environ; env && *env; env++) {
        const char *entry = *env;
        if (strncmp(entry, PREFIX, sizeof PREFIX - 1) != 0) continue;
        const char *eq = strchr(entry, '=');
        const size_t len = eq ? (size_t)(eq - entry) : strlen(entry);
        if (known(entry, len)) continue;
        count++;
        const char *near = closest(entry, len);
        if (near)
            append(message, capacity, &used, "%.*s is not a ckptio setting: did you mean %s?\n", (int)len, entry,
                   near);
        else
            append(message, capacity, &used,
                   "%.*s is not a ckptio setting (docs/ENGINE.md lists them: CKPTIO_THREADS, CKPTIO_DIRECT, ...)\n",
                   (int)len, entry);
    }
    *unknown = count;
    return CKPTIO_OK;
}
