/*
 * dcp_lease.c - the lock of a DCP checkpoint directory (and of a checkpoint
 * manager's root) in object storage: a lease (docs/OBJECT_STORAGE.md,
 * "Two writers of one prefix").
 *
 * An object store has no flock. A save that would hold the directory's
 * lock writes the object DIR/.ckptio-dcp.lock instead, holding a random
 * owner id, the server's time when it was taken and how long it lasts
 * without renewal. A thread renews it (writes it again) every third of
 * that time while the save runs; a holder that dies stops renewing, and
 * its lease lapses when the object's Last-Modified is that long ago by the
 * server's own clock (the Date of its answers: this machine's clock never
 * enters), after which another save may take it over.
 *
 * Taking it: where the server has conditional writes, the object is
 * created with If-None-Match: * (a lapsed one deleted first), so of two
 * savers exactly one succeeds. Where it has none (OpenStack Swift's
 * s3api), the saver writes it, waits a moment and reads it back: the last
 * write wins and both see which; two writes within one round trip of each
 * other can still both read back their own - the window the documented
 * fallback cannot close. A save whose data objects carry names no other
 * save writes may take the lease "to be confirmed" (defer): the write
 * returns at once and the save's first check after the settling time is
 * the read-back, so the wait runs while its data upload; every object the
 * save writes comes after its lease object, as before, which is what keeps
 * other saves' cleanups off them. Before its .metadata (and before removing the
 * files of older saves) a save checks that the lease is still its own
 * (ckptio_dcp_lock_check): a save whose lease was taken over stops there,
 * so the two never both commit a checkpoint that names the other's files.
 * The cleanup after the commit removes only objects older than the lease
 * now held (its `since`), so it never removes what a later save wrote.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LEASE_MAGIC "ckptio-lease 1\n"
#define LEASE_MAX 4096
/* After an unconditional write, how long before reading the lease back. */
#define SETTLE_SECONDS 0.1

/* ---- the lease's text ------------------------------------------------------------------- */

size_t ckptio__lease_format(const ckptio__lease_text *l, char *out, size_t cap) {
    const int n = snprintf(out, cap, LEASE_MAGIC "owner %s\nsince %llu\nttl_ms %llu\n", l->owner,
                           (unsigned long long)l->since, (unsigned long long)l->ttl_ms);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

static bool take_literal(const char **p, const char *end, const char *text) {
    const size_t n = strlen(text);
    if ((size_t)(end - *p) < n || memcmp(*p, text, n) != 0) return false;
    *p += n;
    return true;
}

static bool take_decimal(const char **p, const char *end, uint64_t *out) {
    const char *s = *p;
    uint64_t v = 0;
    size_t digits = 0;
    while (s < end && *s >= '0' && *s <= '9' && digits < 20) v = v * 10 + (uint64_t)(*s++ - '0'), digits++;
    if (digits == 0 || digits > 19 || (digits > 1 && **p == '0')) return false;
    *p = s;
    *out = v;
    return true;
}

#define LEASE_FAIL(...)                                                                                          \
    CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,                                                                             \
                    &((ckptio__err_ctx){.operation = "parse lease", .path = origin, .file_offset = -1}), __VA_ARGS__)

ckptio_status ckptio__lease_parse(const char *bytes, size_t len, const char *origin, ckptio__lease_text *out) {
    CKPTIO_RETURN_IF(!out || (!bytes && len), CKPTIO_E_INVAL, "ckptio__lease_parse: bytes and out are required");
    memset(out, 0, sizeof *out);
    if (!origin) origin = "lease";
    if (len > LEASE_MAX) return LEASE_FAIL("%zu bytes is too large for a lease", len);
    const char *p = bytes, *end = bytes + len;
    ckptio__lease_text l = {0};
    if (!take_literal(&p, end, LEASE_MAGIC) || !take_literal(&p, end, "owner ") || end - p < 32)
        return LEASE_FAIL("expected 'ckptio-lease 1' and 'owner' followed by 32 hex digits");
    for (int i = 0; i < 32; i++) {
        const char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return LEASE_FAIL("the owner is not 32 hex digits");
        l.owner[i] = c;
    }
    p += 32;
    if (!take_literal(&p, end, "\nsince ") || !take_decimal(&p, end, &l.since) || !take_literal(&p, end, "\nttl_ms ") ||
        !take_decimal(&p, end, &l.ttl_ms) || !take_literal(&p, end, "\n"))
        return LEASE_FAIL("expected 'since SECONDS' and 'ttl_ms MILLISECONDS' lines");
    if (p != end) return LEASE_FAIL("%zu unexpected bytes after the last line", (size_t)(end - p));
    *out = l;
    return CKPTIO_OK;
}

/* ---- reading the lease that is there now -------------------------------------------------- */

/* What DIR/.ckptio-dcp.lock holds now. */
typedef struct seen {
    bool exists;
    bool parsed;             /* exists and holds a lease of this format */
    ckptio__lease_text text;
    double age;              /* seconds since it was last written, by the server's clock */
    double server_now;
} seen;

/* One GET: the lease's bytes, when it was last written and the server's clock now. */
static ckptio_status look(ckptio_engine *engine, const char *url, seen *out) {
    memset(out, 0, sizeof *out);
    double mtime = 0;
    void *data = NULL;
    size_t len = 0;
    ckptio__error_saved *saved = ckptio__error_save();
    ckptio_status st = ckptio__object_get_small(engine, url, LEASE_MAX, &data, &len, &mtime, &out->server_now);
    if (st == CKPTIO_E_NOT_FOUND) {
        ckptio__error_restore(saved);
        return CKPTIO_OK;
    }
    out->exists = true;
    out->age = mtime > 0 ? out->server_now - mtime : 0;
    if (st == CKPTIO_E_FORMAT) { /* too large: not a lease of ours, but it holds the name */
        ckptio__error_restore(saved);
        return CKPTIO_OK;
    }
    ckptio__free(saved);
    CKPTIO_FORWARD(st);
    saved = ckptio__error_save();
    out->parsed = ckptio__lease_parse(data, len, url, &out->text) == CKPTIO_OK;
    ckptio__error_restore(saved);
    ckptio__free(data);
    return CKPTIO_OK;
}

/* Whether `s` is a lease that still holds (nobody else may take it). */
static bool live(const seen *s, double default_ttl) {
    if (!s->exists) return false;
    const double ttl = s->parsed ? (double)s->text.ttl_ms / 1000 : default_ttl;
    return s->age <= ttl;
}

/* ---- holding it ---------------------------------------------------------------------------- */

typedef struct ckptio__dcp_lease lease_t;
static ckptio_status start_renewing(lease_t *l);

struct ckptio__dcp_lease {
    ckptio_engine *engine;
    char *dir, *url;
    ckptio__lease_text mine;
    size_t len;
    char text[256];
    bool held;                /* an exclusive lease written by this process */
    bool pin;                 /* a reader's pin or a shared save's mark: its own object, written
                                 unconditionally, renewed */
    char server[1024];        /* ckptio__object_server of the lease */
    bool conditional;         /* taken with If-None-Match: the server has conditional writes */
    pid_t pid;
    double ttl;               /* seconds */
    pthread_t renewer;
    bool renewing;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    bool lost;
    char lost_why[512];
    double renewed;           /* this machine's monotonic clock at the last good renewal */
    bool defer;               /* the read-back of an unconditional write is left to the first check */
    bool unconfirmed;         /* written unconditionally, not read back yet */
    double settle_until;      /* this machine's monotonic clock: when the read-back may run */
    ckptio__dcp_lease *next_held; /* the process's held leases (held_list) */
};

/* The exclusive leases this process holds, so that the cleanup of a save
 * knows the `since` of its own lease without reading it from the server. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static ckptio__dcp_lease *held_list;

/* A forked child holds none of its parent's leases, and must not inherit a
 * mutex another thread of the parent held at the fork. */
static pthread_mutex_t unconditional_mu = PTHREAD_MUTEX_INITIALIZER;
static void forget_in_child(void) {
    pthread_mutex_init(&held_mu, NULL);
    pthread_mutex_init(&unconditional_mu, NULL);
    held_list = NULL;
}
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void watch_forks(void) { pthread_atfork(NULL, NULL, forget_in_child); }

static void held_add(ckptio__dcp_lease *l) {
    pthread_once(&fork_once, watch_forks);
    pthread_mutex_lock(&held_mu);
    l->next_held = held_list;
    held_list = l;
    pthread_mutex_unlock(&held_mu);
}

static void held_remove(ckptio__dcp_lease *l) {
    pthread_mutex_lock(&held_mu);
    for (ckptio__dcp_lease **p = &held_list; *p; p = &(*p)->next_held)
        if (*p == l) {
            *p = l->next_held;
            break;
        }
    pthread_mutex_unlock(&held_mu);
}

/* The `since` of the lease this process holds at `url`, confirmed and not
 * lost; false when it holds none there. */
static bool held_since(const char *url, double *since) {
    bool found = false;
    pthread_mutex_lock(&held_mu);
    for (ckptio__dcp_lease *l = held_list; l && !found; l = l->next_held) {
        if (l->pid != getpid() || strcmp(l->url, url) != 0) continue;
        pthread_mutex_lock(&l->mu);
        if (!l->lost && !l->unconfirmed) {
            *since = (double)l->mine.since;
            found = true;
        }
        pthread_mutex_unlock(&l->mu);
    }
    pthread_mutex_unlock(&held_mu);
    return found;
}

bool ckptio__dcp_lease_held_here(const char *dir) {
    char *url = ckptio__path_join(dir, CKPTIO_DCP_LOCK_NAME);
    double since = 0;
    const bool held = url && held_since(url, &since);
    ckptio__free(url);
    return held;
}

ckptio_status ckptio__dcp_lease_since(ckptio_engine *engine, const char *dir, double *since) {
    *since = 0;
    char *url = ckptio__path_join(dir, CKPTIO_DCP_LOCK_NAME);
    if (!url) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (held_since(url, since)) { /* our own lease: its since is known here */
        ckptio__free(url);
        return CKPTIO_OK;
    }
    seen s;
    const ckptio_status st = look(engine, url, &s);
    if (st == CKPTIO_OK && s.parsed) *since = (double)s.text.since;
    ckptio__free(url);
    return st;
}

/* Whether the last good renewal is so long ago (by this machine's clock)
 * that the server may count the lease as lapsed: from then on it is never
 * written again (another save may have taken it over, saved and released
 * it) and the save's checks fail. The margin covers the request's own time
 * and the server's whole seconds. `renewed` is written under l->mu by the
 * renewer alone (by the acquire before it starts): the renewer reads it
 * without the lock, every other thread with l->mu held. */
static bool overdue(const ckptio__dcp_lease *l) {
    const double margin = l->ttl / 6 < 2 ? l->ttl / 6 : 2;
    return ckptio__now() - l->renewed > l->ttl - margin;
}

static void lose(ckptio__dcp_lease *l, const char *why) {
    pthread_mutex_lock(&l->mu);
    if (!l->lost) {
        l->lost = true;
        snprintf(l->lost_why, sizeof l->lost_why, "%s", why);
    }
    pthread_mutex_unlock(&l->mu);
}

static void describe_other(const seen *s, char *out, size_t cap) {
    if (s->parsed)
        snprintf(out, cap, "held by owner %.12s, written %.0f s ago, lapsing after %.0f s without renewal",
                 s->text.owner, s->age, (double)s->text.ttl_ms / 1000);
    else
        snprintf(out, cap, "an object of that name not written by ckptio, written %.0f s ago", s->age);
}

/* Renews the lease every third of its time until stopped; a renewal that
 * finds another owner's lease, or none for longer than the lease lasts,
 * loses it (the save's check then fails). */
static void *renew(void *arg) {
    ckptio__dcp_lease *l = arg;
    const double period = l->ttl / 3;
    pthread_mutex_lock(&l->mu);
    while (!l->stop && !l->lost) {
        struct timespec due;
        clock_gettime(CLOCK_REALTIME, &due);
        const double t = (double)due.tv_sec + due.tv_nsec / 1e9 + period;
        due.tv_sec = (time_t)t;
        due.tv_nsec = (long)((t - (double)due.tv_sec) * 1e9);
        pthread_cond_timedwait(&l->cv, &l->mu, &due);
        if (l->stop || l->lost) break;
        pthread_mutex_unlock(&l->mu);
        seen s = {0};
        char why[512] = "", other[200];
        ckptio_status st = CKPTIO_OK;
        if (!l->pin) st = look(l->engine, l->url, &s);
        if (overdue(l)) { /* never written again once another save may have taken it (after a slow look too) */
            snprintf(why, sizeof why, "the lease %s was last renewed %.1f s ago: it may have lapsed and been "
                     "taken over", l->url, ckptio__now() - l->renewed);
        } else if (!l->pin && st == CKPTIO_OK && !s.exists) {
            snprintf(why, sizeof why, "the lease %s is gone (another save took it over and released it)", l->url);
        } else if (!l->pin && st == CKPTIO_OK && (!s.parsed || strcmp(s.text.owner, l->mine.owner) != 0)) {
            describe_other(&s, other, sizeof other);
            snprintf(why, sizeof why, "the lease %s was taken over (%s)", l->url, other);
        }
        const double before = ckptio__now() - l->renewed;
        if (!why[0] && st == CKPTIO_OK) st = ckptio__object_write_all(l->engine, l->url, l->text, l->len, false);
        /* A write that lands after the lease may have lapsed (retried inside the request) renews nothing: a
         * cleanup may already have counted it as lapsed. A mark or pin so rewritten is removed at once, so
         * that it claims no objects. */
        const bool late = !why[0] && st == CKPTIO_OK && overdue(l);
        if (late) {
            snprintf(why, sizeof why, "the lease %s was last renewed %.1f s before its renewal completed (%.1f s "
                     "after it began): it may have lapsed meanwhile", l->url, ckptio__now() - l->renewed, before);
            if (l->pin) {
                ckptio__error_saved *saved = ckptio__error_save();
                ckptio__object_remove(l->engine, l->url);
                ckptio__error_restore(saved);
            }
        }
        pthread_mutex_lock(&l->mu);
        if (why[0]) {
            l->lost = true;
            snprintf(l->lost_why, sizeof l->lost_why, "%s", why);
        } else if (st == CKPTIO_OK) {
            l->renewed = ckptio__now();
        } else if (ckptio__now() - l->renewed > l->ttl) {
            l->lost = true;
            snprintf(l->lost_why, sizeof l->lost_why, "the lease %s could not be renewed for %.0f s (%s): it may "
                     "have lapsed", l->url, ckptio__now() - l->renewed, ckptio_last_error_message());
        }
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static void lease_free(ckptio__dcp_lease *l) {
    if (!l) return;
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    ckptio_engine_destroy(l->engine);
    ckptio__free(l->dir);
    ckptio__free(l->url);
    ckptio__free(l);
}

static ckptio_status busy(const ckptio__dcp_lease *l, const seen *s, double waited) {
    char other[200], after[64] = "";
    describe_other(s, other, sizeof other);
    if (waited > 0) snprintf(after, sizeof after, " after waiting %.1f s", waited);
    return CKPTIO_FAIL_CTX(CKPTIO_E_BUSY, &((ckptio__err_ctx){.operation = "lock", .path = l->dir, .file_offset = -1}),
                           "another save holds the directory (lease " CKPTIO_DCP_LOCK_NAME ", %s)%s: this save wrote "
                           "nothing and the checkpoint is unchanged",
                           other, after);
}

/* The buckets whose server answered a conditional write with 501, each
 * named by the endpoint, the addressing style and the bucket
 * (ckptio__object_server: two servers may both have a bucket of one name):
 * later leases there go straight to the fallback instead of asking again (a
 * server that can after all only gets the fallback). The oldest is
 * forgotten first. */
#define UNCONDITIONAL_KEEP 8
static char unconditional[UNCONDITIONAL_KEEP][1024];
static unsigned unconditional_next;

static bool known_unconditional(const char *server) {
    bool known = false;
    pthread_mutex_lock(&unconditional_mu);
    for (unsigned i = 0; i < UNCONDITIONAL_KEEP && !known; i++) known = !strcmp(unconditional[i], server);
    pthread_mutex_unlock(&unconditional_mu);
    return known;
}

static void note_unconditional(const char *server) {
    pthread_once(&fork_once, watch_forks);
    pthread_mutex_lock(&unconditional_mu);
    snprintf(unconditional[unconditional_next++ % UNCONDITIONAL_KEEP], sizeof unconditional[0], "%s", server);
    pthread_mutex_unlock(&unconditional_mu);
}

/* One attempt to write our lease where `s` says there is none, or a lapsed
 * one. *won: it is ours now. */
static ckptio_status try_take(ckptio__dcp_lease *l, const seen *s, bool *won) {
    *won = false;
    l->mine.since = (uint64_t)s->server_now;
    l->len = ckptio__lease_format(&l->mine, l->text, sizeof l->text);
    if (l->conditional) {
        if (s->exists) CKPTIO_FORWARD(ckptio__object_remove(l->engine, l->url)); /* lapsed */
        ckptio__error_saved *saved = ckptio__error_save();
        const ckptio_status st = ckptio__object_write_all(l->engine, l->url, l->text, l->len, true);
        if (st == CKPTIO_OK) {
            ckptio__free(saved);
            *won = true;
            return CKPTIO_OK;
        }
        if (st == CKPTIO_E_EXISTS || st == CKPTIO_E_STALE) { /* another saver created it first */
            ckptio__error_restore(saved);
            return CKPTIO_OK;
        }
        if (st != CKPTIO_E_UNSUPPORTED) {
            ckptio__free(saved);
            return st;
        }
        ckptio__error_restore(saved);
        l->conditional = false; /* the documented fallback from here on */
        note_unconditional(l->server);
    }
    CKPTIO_FORWARD(ckptio__object_write_all(l->engine, l->url, l->text, l->len, false));
    if (l->defer) { /* read back by the first check, once the settling time has passed */
        l->unconfirmed = true;
        l->settle_until = ckptio__now() + SETTLE_SECONDS;
        *won = true;
        return CKPTIO_OK;
    }
    struct timespec settle = {0, (long)(SETTLE_SECONDS * 1e9)};
    nanosleep(&settle, NULL);
    seen back;
    CKPTIO_FORWARD(look(l->engine, l->url, &back));
    *won = back.parsed && strcmp(back.text.owner, l->mine.owner) == 0;
    return CKPTIO_OK;
}

/* A shared save's mark, DIR/.ckptio-dcp-shared-OWNER, since the server's
 * clock of `s` (read before it is written, so every object the save writes
 * afterwards is at least that new), renewed like a pin until released. */
static ckptio_status write_mark(ckptio__dcp_lease *l, const seen *s) {
    char name[sizeof CKPTIO__DCP_SHARED_PREFIX + 32];
    snprintf(name, sizeof name, "%s%s", CKPTIO__DCP_SHARED_PREFIX, l->mine.owner);
    char *url = ckptio__path_join(l->dir, name);
    if (!url) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio__free(l->url);
    l->url = url;
    l->mine.since = (uint64_t)s->server_now;
    l->len = ckptio__lease_format(&l->mine, l->text, sizeof l->text);
    CKPTIO_FORWARD(ckptio__object_write_all(l->engine, l->url, l->text, l->len, false));
    l->pin = l->held = true;
    return CKPTIO_OK;
}

/* The end of taking a lease or a pin: renewed from now on when written
 * (`st` OK), else deleted again and freed. */
static ckptio_status hand_over(lease_t *l, ckptio_status st, lease_t **out) {
    if (st == CKPTIO_OK && l->held && (st = start_renewing(l)) != CKPTIO_OK) ckptio__object_remove(l->engine, l->url);
    if (st == CKPTIO_OK && l->held && !l->pin) held_add(l);
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        lease_free(l);
        ckptio__error_restore(saved);
        return st;
    }
    *out = l;
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_lease_acquire(const char *dir, bool shared, bool defer, double timeout,
                                        ckptio_dcp_lock_wait_fn on_wait, void *user, ckptio__dcp_lease **out) {
    *out = NULL;
    ckptio__dcp_lease *l = ckptio__calloc(1, sizeof *l);
    if (!l) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->pid = getpid();
    l->defer = defer;
    ckptio_status st = ckptio_engine_create(&l->engine);
    if (st == CKPTIO_OK &&
        (!(l->dir = ckptio__strdup(dir)) || !(l->url = ckptio__path_join(dir, CKPTIO_DCP_LOCK_NAME))))
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) st = ckptio__object_server(l->engine, l->url, l->server, sizeof l->server);
    if (st == CKPTIO_OK) l->conditional = !known_unconditional(l->server);
    if (st == CKPTIO_OK) {
        int64_t ttl_ms = 60000;
        ckptio_engine_get(l->engine, CKPTIO_OPT_S3_LEASE_MS, &ttl_ms);
        l->ttl = (double)ttl_ms / 1000;
        l->mine.ttl_ms = (uint64_t)ttl_ms;
        unsigned char id[16];
        ckptio__random_bytes(id, sizeof id);
        for (int i = 0; i < 16; i++) snprintf(l->mine.owner + 2 * i, 3, "%02x", id[i]);
    }
    const double start = ckptio__now();
    double pause = 0.05;
    while (st == CKPTIO_OK) {
        seen s;
        if ((st = look(l->engine, l->url, &s)) != CKPTIO_OK) break;
        const bool held_by_other = live(&s, l->ttl) && !(s.parsed && !strcmp(s.text.owner, l->mine.owner));
        if (!held_by_other) {
            if (shared) { /* saves that remove nothing run beside each other, marked for the cleanups */
                st = write_mark(l, &s);
                break;
            }
            bool won = false;
            if ((st = try_take(l, &s, &won)) != CKPTIO_OK) break;
            if (won) {
                l->held = true;
                break;
            }
            continue; /* another saver won the race: its lease is there now */
        }
        const double waited = ckptio__now() - start;
        if (timeout == 0 || (timeout > 0 && waited >= timeout)) {
            st = busy(l, &s, waited);
            break;
        }
        if (on_wait && on_wait(waited, user) != 0) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_CANCELED, &((ckptio__err_ctx){.path = dir, .file_offset = -1}),
                                 "waiting for another save's lease was canceled; this save wrote nothing");
            break;
        }
        double nap = pause;
        if (timeout > 0 && waited + nap > timeout) nap = timeout - waited;
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        nanosleep(&ts, NULL);
        pause = pause * 2 > 1.0 ? 1.0 : pause * 2;
    }
    return hand_over(l, st, out);
}

ckptio_status ckptio__dcp_lease_check(ckptio__dcp_lease *l) {
    if (!l->held) return CKPTIO_OK;
    const ckptio__err_ctx ctx = {.operation = "check lease", .path = l->dir, .file_offset = -1};
    pthread_mutex_lock(&l->mu);
    const bool unconfirmed = l->unconfirmed;
    const double wait = l->settle_until - ckptio__now();
    pthread_mutex_unlock(&l->mu);
    if (unconfirmed && wait > 0) { /* this look is the read-back: not before the settling time */
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
    }
    seen s;
    ckptio_status st = look(l->engine, l->url, &s);
    if (st != CKPTIO_OK) return st;
    pthread_mutex_lock(&l->mu);
    const bool late = overdue(l);
    const double last = ckptio__now() - l->renewed;
    pthread_mutex_unlock(&l->mu);
    if (late) {
        char why[512];
        snprintf(why, sizeof why, "the lease %s was last renewed %.1f s ago: it may have lapsed and been taken "
                 "over meanwhile", l->url, last);
        lose(l, why);
    } else if (!s.parsed || strcmp(s.text.owner, l->mine.owner) != 0) {
        char other[200], why[512];
        if (!s.exists) snprintf(other, sizeof other, "no lease object is there now");
        else describe_other(&s, other, sizeof other);
        snprintf(why, sizeof why, "the lease %s is no longer this save's (%s%s)", l->url, other,
                 unconfirmed ? "; read back after this save's data were written" : "");
        lose(l, why);
    } else if (s.age > l->ttl) {
        char why[512];
        snprintf(why, sizeof why, "the lease %s was last renewed %.0f s ago and has lapsed", l->url, s.age);
        lose(l, why);
    }
    pthread_mutex_lock(&l->mu);
    if (!l->lost) l->unconfirmed = false; /* read back as ours */
    if (l->lost)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_BUSY, &ctx,
                             "%s: another save may be writing the directory, so this save commits nothing more (its "
                             "data objects are not named by any .metadata and a later save removes them)",
                             l->lost_why);
    pthread_mutex_unlock(&l->mu);
    return st;
}

void ckptio__dcp_lease_release(ckptio__dcp_lease *l) {
    if (!l) return;
    if (l->pid != getpid()) { /* a forked child: the lease is the parent's, and so is the thread */
        return;
    }
    if (l->renewing) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->renewer, NULL);
    }
    held_remove(l);
    if (l->pin) {
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio__object_remove(l->engine, l->url);
        ckptio__error_restore(saved);
    } else if (l->held && !l->lost) {
        /* Only our own lease goes; a failure leaves it to lapse. */
        ckptio__error_saved *saved = ckptio__error_save();
        seen s;
        if (look(l->engine, l->url, &s) == CKPTIO_OK && s.parsed && !strcmp(s.text.owner, l->mine.owner))
            ckptio__object_remove(l->engine, l->url);
        ckptio__error_restore(saved);
    }
    lease_free(l);
}

bool ckptio__dcp_lease_held(const ckptio__dcp_lease *l) { return l && l->held; }

static ckptio_status start_renewing(ckptio__dcp_lease *l) {
    l->renewed = ckptio__now();
    if (pthread_create(&l->renewer, NULL, renew, l) != 0)
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: cannot start the thread that renews it", l->url);
    l->renewing = true;
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_keep_since(ckptio_engine *engine, const char *dir, char *const *marks, size_t nmarks,
                                     double *keep_since, bool *dead) {
    CKPTIO_FORWARD(ckptio__dcp_lease_since(engine, dir, keep_since));
    int64_t ttl_ms = 60000;
    if (engine) ckptio_engine_get(engine, CKPTIO_OPT_S3_LEASE_MS, &ttl_ms);
    for (size_t i = 0; i < nmarks; i++) {
        dead[i] = false;
        char *url = ckptio__path_join(dir, marks[i]);
        if (!url) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        seen s;
        const ckptio_status st = look(engine, url, &s);
        ckptio__free(url);
        CKPTIO_FORWARD(st);
        if (!s.exists) {
            /* Released since the listing: that save committed, and its metadata object may be newer than the
             * listing, which then does not show it referencing its data. Everything is kept this round; the
             * next cleanup, whose listing shows that metadata, removes what is really stale. */
            *keep_since = 1;
            continue;
        }
        /* A mark that cannot be read holds for the lease time, and keeps every object. */
        const double since = s.parsed && s.text.since > 0 ? (double)s.text.since : 1;
        if (!live(&s, (double)ttl_ms / 1000))
            dead[i] = true;
        else if (*keep_since <= 0 || since < *keep_since)
            *keep_since = since;
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_pin_take(ckptio_engine *engine, const char *dir, ckptio__dcp_lease **out) {
    *out = NULL;
    ckptio__dcp_lease *l = ckptio__calloc(1, sizeof *l);
    if (!l) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->pid = getpid();
    l->pin = l->held = true;
    ckptio_status st = ckptio_engine_create(&l->engine);
    int64_t ttl_ms = 60000;
    if (st == CKPTIO_OK) {
        ckptio_engine_get(engine ? engine : l->engine, CKPTIO_OPT_S3_LEASE_MS, &ttl_ms);
        l->ttl = (double)ttl_ms / 1000;
        l->mine.ttl_ms = (uint64_t)ttl_ms;
        unsigned char id[16];
        ckptio__random_bytes(id, sizeof id);
        for (int i = 0; i < 16; i++) snprintf(l->mine.owner + 2 * i, 3, "%02x", id[i]);
        char name[64];
        snprintf(name, sizeof name, "%s%s", CKPTIO__STEP_PIN_PREFIX, l->mine.owner);
        if (!(l->dir = ckptio__strdup(dir)) || !(l->url = ckptio__path_join(dir, name)))
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    if (st == CKPTIO_OK) {
        l->mine.since = (uint64_t)time(NULL);
        l->len = ckptio__lease_format(&l->mine, l->text, sizeof l->text);
        st = ckptio__object_write_all(l->engine, l->url, l->text, l->len, false);
    }
    return hand_over(l, st, out);
}

bool ckptio__dcp_pin_live(ckptio_engine *engine, const char *url, double server_now, double mtime) {
    void *data = NULL;
    size_t len = 0;
    ckptio__lease_text t;
    ckptio__error_saved *saved = ckptio__error_save();
    double ttl = 60;
    if (ckptio__object_read_all(engine, url, LEASE_MAX, &data, &len) == CKPTIO_OK &&
        ckptio__lease_parse(data, len, url, &t) == CKPTIO_OK)
        ttl = (double)t.ttl_ms / 1000;
    else if (!data) { /* gone meanwhile, or unreadable: a pin only while we cannot tell */
        int64_t ms = 60000;
        ckptio_engine_get(engine, CKPTIO_OPT_S3_LEASE_MS, &ms);
        ttl = (double)ms / 1000;
    }
    ckptio__free(data);
    ckptio__error_restore(saved);
    return mtime <= 0 || server_now - mtime <= ttl;
}
