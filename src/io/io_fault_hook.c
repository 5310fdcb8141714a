/*
 * io_fault_hook.c - the seam through which tests fail I/O requests.
 *
 * Real disks do not fail on request, so the backends and the commit
 * protocols' system calls ask ckptio__io_fault() before each request. The
 * shipped library holds only this hook; what a test arms (the nth write
 * fails with ENOSPC, a short read, ...) lives in the test-only library
 * (tests/doubles/io_inject.c), which installs itself here.
 */
#include "io_internal.h"

static _Atomic(ckptio__io_fault_fn) hook;

void ckptio__io_set_fault_hook(ckptio__io_fault_fn fn) { atomic_store(&hook, fn); }

bool ckptio__io_fault(ckptio__io_kind kind, int *err, uint64_t *len) {
    const ckptio__io_fault_fn fn = atomic_load_explicit(&hook, memory_order_acquire);
    return fn && fn(kind, err, len);
}
