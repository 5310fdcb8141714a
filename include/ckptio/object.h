/*
 * ckptio/object.h - objects in S3-compatible storage (s3://BUCKET/KEY): listing,
 * deleting, small writes, unfinished uploads (docs/OBJECT_STORAGE.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_OBJECT_H
#define CKPTIO_OBJECT_H

#include "core.h"
#include "file.h" /* ckptio_format */

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/object.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Objects in S3-compatible storage (s3://BUCKET/KEY)                       */
/* ------------------------------------------------------------------------ */

/* ckptio_file_open() takes "s3://BUCKET/KEY" wherever it takes a path: the
 * engine reads such a file with ranged GETs and writes it as a multipart
 * upload that appears at ckptio_file_commit(), whole or not at all
 * (docs/OBJECT_STORAGE.md: endpoint, credentials, commit protocol,
 * settings). The functions here are what directory-level code (DCP
 * checkpoints, checkpoint steps, cleaners) needs beyond single objects.
 * Endpoint, region and credentials come from the AWS environment variables
 * and files; retries, timeouts and concurrency from `engine`'s
 * CKPTIO_OPT_S3_* settings. Errors name the operation, s3://BUCKET/KEY, the
 * HTTP status and the server's Code and Message, and never a credential. */

/*! ckptio_path_is_object() : 1 when `path` is an s3:// URL, else 0. */
CKPTIO_API int ckptio_path_is_object(const char *path);

/*! ckptio_format_detect_engine() :
 * ckptio_format_detect() with `engine`'s settings for the requests an
 * s3:// path needs (retries, timeouts; ckptio_format_detect makes an engine
 * of its own for them, from the environment). An object is probed with one
 * GET of its first 64 KiB (always: never an earlier probe's answer), whose
 * answer (size, ETag, bytes) the engine keeps
 * for the next open of that path for reading (within seconds): that open
 * sends no request for it and is pinned to the ETag the probe saw (an object
 * replaced in between fails its reads with CKPTIO_E_STALE). A local path,
 * or a NULL engine: exactly ckptio_format_detect(). */
CKPTIO_API ckptio_status ckptio_format_detect_engine(ckptio_engine *engine, const char *path, ckptio_format *out);

/* One entry of a listing. The strings are valid during the callback only. */
typedef struct ckptio_object_info {
    const char *key;       /* the whole key (not only the part after the prefix) */
    uint64_t size;         /* bytes; 0 for a common prefix or an upload */
    const char *etag;      /* as the server sent it (quoted), "" for a prefix */
    const char *time;      /* LastModified, or an upload's Initiated (ISO 8601), or "" */
    const char *upload_id; /* an unfinished multipart upload's id, else "" */
    int is_prefix;         /* a common prefix (listing with a delimiter) */
} ckptio_object_info;

/* Called for each entry; a non-zero return stops the listing (not an error). */
typedef int (*ckptio_object_fn)(void *user, const ckptio_object_info *info);

/*! ckptio_object_list() :
 * Lists the objects of s3://BUCKET/PREFIX (PREFIX may be empty), every page,
 * in the server's order (UTF-8 binary order on S3). With a `delimiter`
 * (usually "/"), keys with the delimiter after the prefix are rolled up
 * into common prefixes, reported once each with is_prefix = 1. Keys come
 * back decoded (the listing is asked URL-encoded, so any byte survives).
 * @return CKPTIO_OK (also when fn stopped it), or the failed request's
 * error (CKPTIO_E_NOT_FOUND for a missing bucket). */
CKPTIO_API ckptio_status ckptio_object_list(ckptio_engine *engine, const char *url, const char *delimiter,
                                            ckptio_object_fn fn, void *user);

/*! ckptio_object_delete() :
 * Deletes s3://BUCKET/KEY; a missing object is no error (a missing bucket
 * is CKPTIO_E_NOT_FOUND). */
CKPTIO_API ckptio_status ckptio_object_delete(ckptio_engine *engine, const char *url);

/*! ckptio_object_put() :
 * Writes data[0..len) as the whole object s3://BUCKET/KEY with one request
 * (markers, small metadata files). With `if_absent`, only if no object of
 * that key exists, atomically on the server (If-None-Match: *):
 * CKPTIO_E_EXISTS when one does, CKPTIO_E_UNSUPPORTED where the server has
 * no conditional writes (OpenStack Swift's s3api). */
CKPTIO_API ckptio_status ckptio_object_put(ckptio_engine *engine, const char *url, const void *data, size_t len,
                                           int if_absent);

/*! ckptio_object_list_uploads() :
 * Lists the unfinished multipart uploads of keys under s3://BUCKET/PREFIX
 * (each with key, upload_id and time): what a save that was killed before
 * its commit leaves on the server, billed but invisible. */
CKPTIO_API ckptio_status ckptio_object_list_uploads(ckptio_engine *engine, const char *url, ckptio_object_fn fn,
                                                    void *user);

/*! ckptio_object_abort_uploads() :
 * Aborts the unfinished multipart uploads under s3://BUCKET/PREFIX that
 * were started at least `older_than_seconds` ago (by the server's clock
 * against this machine's; 0: all, including a save running now, which then
 * fails at its next part or at commit). *aborted (may be NULL) receives
 * how many were aborted. Objects are never touched. @return CKPTIO_OK, or
 * the first failure (the uploads before it stay aborted). */
CKPTIO_API ckptio_status ckptio_object_abort_uploads(ckptio_engine *engine, const char *url,
                                                     double older_than_seconds, uint64_t *aborted);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_OBJECT_H */
