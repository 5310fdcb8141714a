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

/* Holds the read and write requests of every thread but the calling one
 * (the engine's workers) once `permits` more of them have started, until
 * the next call sets new permits or ckptio__io_inject_release() lets them
 * all go. Each call replaces the count, so that permits never pile up. A
 * progress callback (which runs on the calling thread) thereby decides how
 * many requests the workers make between two of its calls, however the
 * threads are scheduled: tests of progress and cancel need no timing. The
 * calling thread itself (a transfer on 0 threads) is never held. A request
 * held for 30 s goes on and marks the hold stalled: a test whose callback
 * never comes fails (ckptio__io_inject_hold_stalled) instead of hanging. */
void ckptio__io_inject_hold(uint64_t permits);

/* Ends the hold: every held request, and every later one, goes on. */
void ckptio__io_inject_release(void);

/* Whether a held request gave up waiting since the last reset. */
bool ckptio__io_inject_hold_stalled(void);

/* Records the requests made from now on into buf[0..cap) as a
 * NUL-terminated string, one letter each (r read, w write, f fsync,
 * R rename, o open, O O_DIRECT open, u unlink, l listdir, c residency),
 * keeping only the letters in `keep`, as long as they fit: the order of a
 * protocol's system calls. Replaces the fault hook (nothing is injected)
 * until ckptio__io_record_stop(). Not thread-safe. */
void ckptio__io_record(char *buf, size_t cap, const char *keep);
void ckptio__io_record_stop(void);

/* Clears every injected fault, delay and hold. */
void ckptio__io_inject_reset(void);

/* Requests of `kind` left before its armed fault fires: 0 once a one-shot
 * fault fired (or none is armed). Lets tests sweep "the nth request" until
 * n passes the last request a call makes. */
uint64_t ckptio__io_inject_countdown(ckptio__io_kind kind);

#endif /* CKPTIO_IO_INJECT_H */
