/*
 * io_inject.h - fault injection for tests (test-only library, never shipped).
 *
 * Tests must prove that a failed write leaves no file under the final name,
 * that EINTR and short transfers are resumed, and so on. The library asks
 * its fault hook (io_internal.h: ckptio__io_fault) before each request;
 * arming a fault here installs this file's hook there.
 */
#ifndef CKPTIO_IO_INJECT_H
#define CKPTIO_IO_INJECT_H

#include "io_internal.h"

/* Makes the `nth` request of `kind` from now (1 = the next one) fail with
 * errno `err`; or, with err == 0, transfer at most `short_len` bytes (reads
 * and writes only; a short transfer, not an error). With `every` set the
 * fault repeats on every nth request after that. nth == 0 clears the kind.
 * Thread-safe; requests are counted across all threads. */
void ckptio__io_inject(ckptio__io_kind kind, uint64_t nth, int err, uint64_t short_len, bool every);

/* Sleeps `micros` before each read or write request (0 = off), so tests can
 * observe a transfer in progress. */
void ckptio__io_inject_delay(uint64_t micros);

/* Clears every injected fault and delay. */
void ckptio__io_inject_reset(void);

/* Requests of `kind` left before its armed fault fires: 0 once a one-shot
 * fault fired (or none is armed). Lets tests sweep "the nth request" until
 * n passes the last request a call makes. */
uint64_t ckptio__io_inject_countdown(ckptio__io_kind kind);

#endif /* CKPTIO_IO_INJECT_H */
