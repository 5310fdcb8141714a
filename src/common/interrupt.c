/*
 * interrupt.c - ckptio_interrupt(): a program's SIGINT/SIGTERM handler asks
 * the library to stop the work in flight.
 *
 * A signal handler installed without SA_RESTART makes a blocking system call
 * return EINTR; the library retries those (the call was not asked to stop),
 * unless the program has said through this flag that the signal means "stop":
 * then the call fails with CKPTIO_E_CANCELED, and transfers cancel at their
 * next progress check. One lock-free atomic: safe to set from a handler.
 */
#include "common_internal.h"

#include <stdatomic.h>

static atomic_int requested;

ckptio_status ckptio_interrupt(int on) {
    atomic_store_explicit(&requested, on != 0, memory_order_relaxed);
    return CKPTIO_OK;
}

bool ckptio__interrupt_requested(void) { return atomic_load_explicit(&requested, memory_order_relaxed) != 0; }
