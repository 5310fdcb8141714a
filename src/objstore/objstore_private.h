/*
 * objstore_private.h - what the files of src/objstore share among themselves
 * (s3_session.c runs the attempts that s3_request.c prepares and judges).
 */
#ifndef CKPTIO_OBJSTORE_PRIVATE_H
#define CKPTIO_OBJSTORE_PRIVATE_H

#include "objstore_internal.h"

/* Sets up the request's curl handle for its next attempt: URL, signed
 * headers, body and answer handling, timeouts from the deadline. False when
 * it cannot (out of memory, a URL too long): the request has then failed
 * (r->status, r->message). */
bool ckptio__s3_attempt_prepare(ckptio__s3_request *r);

/* What to do after an attempt ended with curl's `code`. */
typedef enum ckptio__s3_verdict {
    CKPTIO__S3_DONE,   /* succeeded: r->status is CKPTIO_OK */
    CKPTIO__S3_RETRY,  /* a transient failure: try again after a backoff */
    CKPTIO__S3_FAILED, /* failed for good: r->status and r->message say why */
} ckptio__s3_verdict;

ckptio__s3_verdict ckptio__s3_attempt_finish(ckptio__s3_request *r, int code);

/* Turns a pending retry into a failure when the retry budget or the deadline
 * is spent (the last attempt's reason becomes the message). Returns false
 * then; true when the request may try again. */
bool ckptio__s3_may_retry(ckptio__s3_request *r, double now, double wait);

/* Makes libcurl ready (once per process). */
void ckptio__s3_global_init(void);

#endif /* CKPTIO_OBJSTORE_PRIVATE_H */
