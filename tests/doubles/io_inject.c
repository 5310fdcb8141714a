/*
 * io_inject.c - fault injection for tests (see io_inject.h): the library's
 * fault hook, installed by the first fault or delay a test arms. The state
 * is process-wide on purpose: the failing request may be issued by any
 * worker thread.
 */
#include "io_inject.h"

#include <time.h>

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

static void update_armed(void) {
    int armed = atomic_load(&delay_micros) != 0;
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

void ckptio__io_inject_reset(void) {
    pthread_mutex_lock(&fault_lock);
    for (int k = 0; k < CKPTIO__IO_KIND_COUNT_; k++) atomic_store(&faults[k].countdown, 0);
    atomic_store(&delay_micros, 0);
    update_armed();
    pthread_mutex_unlock(&fault_lock);
}

static bool inject_fault(ckptio__io_kind kind, int *err, uint64_t *len) {
    if (!atomic_load_explicit(&any_armed, memory_order_relaxed)) return false;
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
