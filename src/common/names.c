/*
 * names.c - names ckptio derives from a file's name (a temporary's, a
 * checksum manifest's) that must stay within NAME_MAX, and the random bytes
 * behind temporaries' suffixes and per-save ids.
 *
 * A derived name adds a fixed prefix/suffix to the data file's base name.
 * For a base name near NAME_MAX (255 bytes: legal, and saved by torch.save
 * and safetensors) the result would not fit, so the base name is replaced
 * by a bounded stand-in: its first bytes (whole UTF-8 characters), '~' and
 * the XXH3-64 of the whole name in 16 hex digits. The stand-in depends on
 * the name alone, so whoever knows the data file's name (the cleaner's
 * `name` filter, ckptio_manifest_path) derives the same one; the prefix
 * keeps it recognisable in a listing.
 */
#include "common_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define HASH_TAIL 17 /* '~' + 16 hex digits */

size_t ckptio__bounded_name(const char *name, size_t max, char *out) {
    const size_t len = strlen(name);
    if (len <= max) {
        memcpy(out, name, len + 1);
        return len;
    }
    size_t keep = max > HASH_TAIL ? max - HASH_TAIL : 0;
    /* Cut before a UTF-8 continuation byte, never inside a character. */
    while (keep > 0 && ((unsigned char)name[keep] & 0xC0) == 0x80) keep--;
    memcpy(out, name, keep);
    snprintf(out + keep, HASH_TAIL + 1, "~%016llx", (unsigned long long)XXH3_64bits(name, len));
    return keep + HASH_TAIL;
}

void ckptio__random_bytes(void *buf, size_t len) {
    unsigned char *p = buf;
    size_t done = 0;
    while (done < len) {
        const ssize_t n = getrandom(p + done, len - done, GRND_NONBLOCK);
        if (n > 0) done += (size_t)n;
        else if (n < 0 && errno == EINTR) continue;
        else break;
    }
    if (done == len) return;
    /* No getrandom (old kernel, seccomp) or no entropy yet at early boot: a
     * time/pid/counter mix. Callers enforce uniqueness themselves (O_EXCL)
     * or only need distinct values across concurrent processes. */
    static _Atomic uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^
                 (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    for (; done < len; done++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[done] = (unsigned char)(x >> 24);
    }
}
