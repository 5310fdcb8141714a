/*
 * io_inject.c - fault injection for tests (see io_inject.h): the library's
 * fault hook, installed by the first fault, delay or hold a test arms. The state
 * is process-wide on purpose: the failing request may be issued by any
 * worker thread.
 */
#include "io_inject.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#define HOLD_STALL_SECONDS 30

typedef struct fault {
    _Atomic uint64_t countdown; /* requests until the fault; 0 = off */
    uint64_t period;            /* re-arm value when repeating, else 0 */
    int err;
    uint64_t short_len;
} fault;

static fault faults[CKPTIO__IO_KIND_COUNT_];
static _Atomic int any_armed;       /* fast path: nothing injected */
static _Atomic uint64_t delay_micros;
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;

/* The hold (ckptio__io_inject_hold): guarded by hold_lock, waited on with
 * hold_cv; hold_on is also read without the lock by update_armed. */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static _Atomic bool hold_on;
static pthread_t hold_owner;
static uint64_t hold_permits;
static bool hold_stalled;

static void update_armed(void) {
    int armed = atomic_load(&delay_micros) != 0 || atomic_load(&hold_on);
    for (int k = 0; k < CKPTIO__IO_KIND_COUNT_; k++)
        if (atomic_load(&faults[k].countdown) != 0) armed = 1;
    atomic_store(&any_armed, armed);
}

static bool inject_fault(ckptio__io_kind kind, int *err, uint64_t *len);

void ckptio__io_inject(ckptio__io_kind kind, uint64_t nth, int err, uint64_t short_len, bool every) {
    if ((unsigned)kind >= CKPTIO__IO_KIND_COUNT_) return;
    ckptio__io_set_fault_hook(inject_fault);
    pthread_mutex_lock(&fault_lock);
    faults[kind].err = err;
    faults[kind].short_len = short_len;
    faults[kind].period = every ? nth : 0;
    atomic_store(&faults[kind].countdown, nth);
    update_armed();
    pthread_mutex_unlock(&fault_lock);
}

void ckptio__io_inject_delay(uint64_t micros) {
    ckptio__io_set_fault_hook(inject_fault);
    pthread_mutex_lock(&fault_lock);
    atomic_store(&delay_micros, micros);
    update_armed();
    pthread_mutex_unlock(&fault_lock);
}

static void hold_set(bool on, uint64_t permits, bool clear_stalled) {
    pthread_mutex_lock(&hold_lock);
    atomic_store(&hold_on, on);
    hold_owner = pthread_self();
    hold_permits = permits;
    if (clear_stalled) hold_stalled = false;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_lock);
    pthread_mutex_lock(&fault_lock);
    update_armed();
    pthread_mutex_unlock(&fault_lock);
}

void ckptio__io_inject_hold(uint64_t permits) {
    ckptio__io_set_fault_hook(inject_fault);
    hold_set(true, permits, false);
}

void ckptio__io_inject_release(void) { hold_set(false, 0, false); }

bool ckptio__io_inject_hold_stalled(void) {
    pthread_mutex_lock(&hold_lock);
    const bool stalled = hold_stalled;
    pthread_mutex_unlock(&hold_lock);
    return stalled;
}

/* A read or write request on a thread other than the holder's takes a
 * permit, waiting for one while the hold lasts. */
static void take_permit(void) {
    pthread_mutex_lock(&hold_lock);
    if (atomic_load(&hold_on) && !pthread_equal(pthread_self(), hold_owner)) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline); /* hold_cv's clock */
        deadline.tv_sec += HOLD_STALL_SECONDS;
        while (atomic_load(&hold_on) && hold_permits == 0) {
            if (pthread_cond_timedwait(&hold_cv, &hold_lock, &deadline) == ETIMEDOUT) {
                hold_stalled = true;
                atomic_store(&hold_on, false);
                pthread_cond_broadcast(&hold_cv);
            }
        }
        if (atomic_load(&hold_on)) hold_permits--;
    }
    pthread_mutex_unlock(&hold_lock);
}

void ckptio__io_inject_reset(void) {
    hold_set(false, 0, true);
    pthread_mutex_lock(&fault_lock);
    for (int k = 0; k < CKPTIO__IO_KIND_COUNT_; k++) atomic_store(&faults[k].countdown, 0);
    atomic_store(&delay_micros, 0);
    update_armed();
    pthread_mutex_unlock(&fault_lock);
}

static bool inject_fault(ckptio__io_kind kind, int *err, uint64_t *len) {
    if (!atomic_load_explicit(&any_armed, memory_order_relaxed)) return false;
    if (kind == CKPTIO__IO_READ || kind == CKPTIO__IO_WRITE) take_permit();
    uint64_t micros = atomic_load(&delay_micros);
    if (micros && (kind == CKPTIO__IO_READ || kind == CKPTIO__IO_WRITE)) {
        struct timespec ts = {.tv_sec = (time_t)(micros / 1000000), .tv_nsec = (long)(micros % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    fault *f = &faults[kind];
    uint64_t cur = atomic_load(&f->countdown);
    for (;;) {
        if (cur == 0) return false;
        uint64_t next = cur - 1;
        if (next == 0 && f->period) next = f->period;
        if (atomic_compare_exchange_weak(&f->countdown, &cur, next)) break;
    }
    if (cur != 1) return false;
    if (f->period == 0) {
        pthread_mutex_lock(&fault_lock);
        update_armed();
        pthread_mutex_unlock(&fault_lock);
    }
    if (f->err) {
        *err = f->err;
        return true;
    }
    /* Zero would read as end of file; the smallest short transfer is 1 byte. */
    uint64_t cap = f->short_len ? f->short_len : 1;
    if (len && *len > cap) *len = cap;
    return false;
}

uint64_t ckptio__io_inject_countdown(ckptio__io_kind kind) {
    if ((unsigned)kind >= CKPTIO__IO_KIND_COUNT_) return 0;
    return atomic_load(&faults[kind].countdown);
}

/* ---- recording ------------------------------------------------------------------------- */

static char *record_buf;
static size_t record_cap;
static const char *record_keep;

static bool record_request(ckptio__io_kind kind, int *err, uint64_t *len) {
    (void)err;
    (void)len;
    static const char letter[CKPTIO__IO_KIND_COUNT_ + 1] = "rwfRoOulc";
    const size_t n = strlen(record_buf);
    if (n + 1 < record_cap && strchr(record_keep, letter[kind])) {
        record_buf[n] = letter[kind];
        record_buf[n + 1] = '\0';
    }
    return false;
}

void ckptio__io_record(char *buf, size_t cap, const char *keep) {
    record_buf = buf;
    record_cap = cap;
    record_keep = keep;
    if (cap) buf[0] = '\0';
    ckptio__io_set_fault_hook(record_request);
}

void ckptio__io_record_stop(void) { ckptio__io_set_fault_hook(NULL); }
