/*
 * objstore_internal.h - S3-compatible object storage (src/objstore): what the
 * file layer (src/io) builds `s3://bucket/key` files on.
 *
 * Below src/io, above src/common. HTTP is libcurl's (multi interface: many
 * requests in flight on one thread, connections kept between requests),
 * hashing and HMAC are OpenSSL's; nothing here writes HTTP, TLS or a hash of
 * its own. The pieces, one file each:
 *   s3_sigv4.c    AWS Signature Version 4 (canonical request, signing key)
 *   s3_uri.c      s3:// URLs, URI encoding, request URLs (path-style and
 *                 virtual-hosted addressing)
 *   s3_config.c   the endpoint, region and credential chain (environment,
 *                 ~/.aws/credentials and ~/.aws/config)
 *   s3_xml.c      a small bounded XML reader for the server's answers
 *                 (errors, listings, multipart results); fuzzed
 *   s3_request.c  one request: headers, signing, curl handle, outcome and the
 *                 error message (bucket, key, HTTP status, Code, Message)
 *   s3_session.c  requests in flight on a curl multi handle, with retries
 *                 (backoff with jitter) and a deadline per request
 *   s3_ops.c      the S3 operations: HEAD, ranged GET, PUT, DELETE, listings,
 *                 multipart create/complete/abort
 *   s3_part_pool.c  part buffers kept between uploads (bounded, freed when
 *                 idle), so that successive parts and uploads reuse memory
 *                 already touched
 *   s3_upload.c   an object written at any offsets by many threads: part
 *                 buffers uploaded in parallel as a multipart upload that
 *                 completes at commit (the object appears whole or not at all)
 * No error message, log line or saved record ever holds the access key id,
 * the secret, the session token or a signature.
 */
#ifndef CKPTIO_OBJSTORE_INTERNAL_H
#define CKPTIO_OBJSTORE_INTERNAL_H

#include "common_internal.h"

#include <stddef.h>
#include <stdint.h>

/* ---- settings (the engine's CKPTIO_OPT_S3_* values, handed down by src/io) */

typedef struct ckptio__s3_settings {
    unsigned concurrency;   /* requests in flight for one transfer */
    uint64_t part_bytes;    /* smallest multipart part (the size grows with the object) */
    unsigned retries;       /* attempts after the first one */
    unsigned timeout_ms;    /* an attempt that moves no byte for this long fails (and is retried) */
    unsigned deadline_ms;   /* one request, all its attempts and waits together */
    unsigned backoff_ms;    /* first retry's backoff ceiling; doubles per attempt, 20 s at most */
} ckptio__s3_settings;

/* Defaults, for callers without an engine (tests, the fuzzer). */
void ckptio__s3_settings_default(ckptio__s3_settings *out);

/* S3's limits on multipart uploads (AWS, MinIO, GCS's XML API, Ceph). */
#define CKPTIO__S3_MIN_PART ((uint64_t)5 << 20)
#define CKPTIO__S3_MAX_PART ((uint64_t)5 << 30)
#define CKPTIO__S3_MAX_PARTS 10000u
/* Longest object key S3 accepts (bytes of UTF-8). */
#define CKPTIO__S3_MAX_KEY 1024u

/* ---- URLs and names (s3_uri.c) ------------------------------------------- */

/* True when `path` starts with "s3://". */
bool ckptio__s3_is_url(const char *path);

/* Splits "s3://BUCKET/KEY" into *bucket and *key (ckptio__malloc'ed; the key
 * may be empty when allow_empty_key, e.g. a prefix to list). The bucket must
 * follow S3's naming rules (3-63 of [a-z0-9.-]); the key may hold any bytes
 * except NUL, up to CKPTIO__S3_MAX_KEY. Errors name the URL (printable). */
ckptio_status ckptio__s3_parse_url(const char *url, bool allow_empty_key, char **bucket, char **key);

/* Appends the URI encoding of s[0..len) to out (RFC 3986 unreserved bytes
 * stay, every other byte becomes %XX); '/' stays when keep_slash. Returns
 * the bytes written (without the NUL), or (size_t)-1 when cap is too small. */
size_t ckptio__s3_uri_encode(const char *s, size_t len, bool keep_slash, char *out, size_t cap);

/* "s3://BUCKET/KEY" for messages: control and non-ASCII bytes as \xNN, and a
 * key longer than 200 bytes cut with its full length noted. */
void ckptio__s3_display(const char *bucket, const char *key, char *out, size_t cap);

/* ---- endpoint and credentials (s3_config.c) ------------------------------- */

typedef struct ckptio__s3_client ckptio__s3_client;

struct ckptio__s3_client {
    char *scheme;           /* "https" or "http" */
    char *host;             /* "s3.us-east-1.amazonaws.com" or "127.0.0.1:18480" */
    char *base_path;        /* path of the endpoint URL without its trailing '/', often "" */
    char region[64];
    int addressing;         /* CKPTIO__S3_PATH_STYLE or CKPTIO__S3_VIRTUAL_HOSTED */
    bool sign_payload;      /* hash bodies into the signature (plain HTTP); TLS: UNSIGNED-PAYLOAD */
    char *access_key;       /* never printed */
    char *secret_key;       /* never printed */
    char *session_token;    /* never printed; NULL when none */
    char *ca_file;          /* CA bundle for TLS, or NULL for libcurl's own */
    char *where;            /* where the credentials came from ("environment", "profile x in FILE") */
    ckptio__s3_settings settings;
};

#define CKPTIO__S3_PATH_STYLE 0
#define CKPTIO__S3_VIRTUAL_HOSTED 1

/* Resolves the endpoint, region, addressing style and credentials from the
 * environment and the AWS configuration files, the way the AWS CLI does:
 *   endpoint    AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
 *               endpoint_url (ignored with AWS_IGNORE_CONFIGURED_ENDPOINT_URLS
 *               = true), else https://s3.REGION.amazonaws.com;
 *   region      AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else
 *               us-east-1;
 *   credentials AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
 *               else the profile (AWS_PROFILE, AWS_DEFAULT_PROFILE, "default")
 *               in AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), then in
 *               AWS_CONFIG_FILE (~/.aws/config, "[profile NAME]");
 *   addressing  CKPTIO_S3_ADDRESSING=path|virtual|auto or the profile's
 *               s3 addressing_style; auto: virtual-hosted on AWS's own
 *               endpoints for DNS-safe buckets, path-style elsewhere;
 *   payloads    hashed into the signature over http://, UNSIGNED-PAYLOAD
 *               over https:// (TLS protects them); CKPTIO_S3_SIGN_PAYLOAD=
 *               on|off|auto overrides;
 *   CA bundle   AWS_CA_BUNDLE, CURL_CA_BUNDLE, SSL_CERT_FILE, else the first
 *               of the usual system bundles (Debian, RHEL, SUSE, Alpine).
 * `bucket` decides the auto addressing. */
ckptio_status ckptio__s3_client_create(const ckptio__s3_settings *settings, const char *bucket,
                                       ckptio__s3_client **out);
void ckptio__s3_client_destroy(ckptio__s3_client *client);

/* ---- AWS Signature Version 4 (s3_sigv4.c) --------------------------------- */

#define CKPTIO__SHA256_HEX 65 /* 64 hex digits and a NUL */

/* Lowercase hex SHA-256 of data[0..len). */
void ckptio__sha256_hex(const void *data, size_t len, char out[CKPTIO__SHA256_HEX]);

/* A header or a query parameter, as given (not yet encoded). */
typedef struct ckptio__s3_pair {
    const char *name;
    const char *value; /* NULL: a query parameter without '=' ("?uploads") */
} ckptio__s3_pair;

typedef struct ckptio__sigv4_input {
    const char *method;
    const char *path;             /* the raw (decoded) path, '/'-separated: encoded here */
    const ckptio__s3_pair *query; /* raw names and values */
    size_t nquery;
    const ckptio__s3_pair *headers; /* every header to sign, any case; host included */
    size_t nheaders;
    const char *payload_hash;     /* hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" */
    const char *amz_date;         /* "YYYYMMDDTHHMMSSZ" */
    const char *region;
    const char *service;          /* "s3" */
    const char *access_key;
    const char *secret_key;
} ckptio__sigv4_input;

/* The Authorization header's value for `in`:
 * "AWS4-HMAC-SHA256 Credential=AK/DATE/REGION/SERVICE/aws4_request,
 * SignedHeaders=a;b, Signature=HEX". Header values are trimmed and inner
 * runs of spaces folded; names are lowercased and sorted; query parameters
 * sorted by encoded name, then value. CKPTIO_E_RANGE when out is too small,
 * CKPTIO_E_NOMEM. If `canonical` is not NULL, the canonical request is
 * copied there too (tests compare it with published vectors). */
ckptio_status ckptio__sigv4_authorization(const ckptio__sigv4_input *in, char *out, size_t cap, char *canonical,
                                          size_t canonical_cap);

/* ---- XML answers (s3_xml.c) ---------------------------------------------- */

/* Called for each element holding text: `path` is the '/'-joined element
 * names from the root ("ListBucketResult/Contents/Key", namespace prefixes
 * dropped), `text` the decoded text (NUL-terminated, `len` bytes). Also
 * called with text NULL when an element closes, so records can be told
 * apart. Return non-zero to stop. */
typedef int (*ckptio__xml_fn)(void *user, const char *path, const char *text, size_t len);

/* Walks the XML document xml[0..len): elements nested at most 16 deep,
 * paths of at most 255 bytes, the five named entities and numeric character
 * references, comments, CDATA and the XML declaration; a DOCTYPE (entity
 * definitions) is refused. Returns 0, or -1 with a reason in err (what was
 * wrong and at which byte). Never reads outside the input. */
int ckptio__xml_walk(const char *xml, size_t len, ckptio__xml_fn fn, void *user, char *err, size_t errcap);

/* Code and Message of an S3 <Error> document (empty strings when absent or
 * not XML). */
void ckptio__xml_error(const char *xml, size_t len, char *code, size_t code_cap, char *message, size_t message_cap);

/* One entry of a listing. */
typedef struct ckptio__s3_entry {
    const char *key;      /* an object's key, or a common prefix */
    uint64_t size;        /* 0 for a prefix */
    const char *etag;     /* "" for a prefix */
    const char *upload_id;/* a multipart upload's id (upload listings), else "" */
    const char *time;     /* LastModified or Initiated as sent (ISO 8601), "" when absent */
    bool is_prefix;
} ckptio__s3_entry;

typedef int (*ckptio__s3_entry_fn)(void *user, const ckptio__s3_entry *entry);

/* A page of ListObjectsV2 (ListBucketResult) or ListMultipartUploads
 * (ListMultipartUploadsResult): fn for each object, prefix or upload, then
 * whether it is truncated and the marker(s) of the next page (continuation
 * token; or key and upload-id markers), each cut to cap bytes (a longer one
 * is an error). Keys longer than CKPTIO__S3_MAX_KEY, sizes that are not
 * decimal numbers and a truncated page without a marker are errors. fn's
 * non-zero return stops the walk (returned as 1). Returns 0, 1, or -1 with
 * err. */
int ckptio__xml_list(const char *xml, size_t len, ckptio__s3_entry_fn fn, void *user, bool *truncated, char *next,
                     size_t next_cap, char *next_upload, size_t next_upload_cap, char *err, size_t errcap);

/* The first text of element `path` ("InitiateMultipartUploadResult/UploadId")
 * into out (cut to cap - 1 bytes; *cut set when it was longer). Returns 0
 * when found, 1 when absent, -1 when the document is malformed. */
int ckptio__xml_find(const char *xml, size_t len, const char *path, char *out, size_t cap, bool *cut);

/* ---- one request (s3_request.c) ------------------------------------------ */

typedef struct ckptio__s3_request ckptio__s3_request;
typedef struct ckptio__s3_session ckptio__s3_session;

/* A growable buffer for XML answers (bounded: 16 MiB). */
typedef struct ckptio__s3_buf {
    char *data;
    size_t len, cap;
} ckptio__s3_buf;

#define CKPTIO__S3_MAX_QUERY 6

struct ckptio__s3_request {
    /* --- what to do (set by the caller) --- */
    const ckptio__s3_client *client;
    const char *method;           /* GET, HEAD, PUT, POST, DELETE */
    const char *bucket;
    const char *key;              /* NULL or "" for the bucket itself */
    const char *what;             /* for messages: "GET", "UploadPart 3", ... */
    ckptio__s3_pair query[CKPTIO__S3_MAX_QUERY];
    size_t nquery;
    bool ranged;                  /* Range: bytes=range_off-(range_off+range_len-1) */
    uint64_t range_off, range_len;
    const char *if_match;         /* ETag the object must still have (GET), or NULL */
    bool if_none_match;           /* If-None-Match: * (create only) */
    const unsigned char *body;    /* PUT/POST body, resent whole on each attempt */
    size_t body_len;
    const char *content_type;     /* or NULL */
    unsigned char *dst;           /* GET: the body goes here, exactly dst_len bytes expected */
    uint64_t dst_len;
    bool up_to;                   /* GET: fewer bytes than dst_len are the object's end (Content-Range), not an error */
    bool want_xml;                /* collect the body in `xml` (bounded) */
    bool allow_404;               /* a 404 is an outcome, not a failure (HEAD, DELETE) */
    void *user;                   /* the caller's */

    /* --- outcome --- */
    ckptio_status status;         /* CKPTIO_OK or the failure's status */
    long http;                    /* last HTTP status (0: none came) */
    char etag[128];               /* ETag header of the answer */
    double last_modified;         /* its Last-Modified, seconds since the epoch (0: none) */
    double server_date;           /* its Date: the server's clock (0: none) */
    uint64_t content_length;      /* Content-Length of the answer */
    uint64_t object_size;         /* from Content-Range's total, or Content-Length of a 200 */
    bool has_object_size;
    ckptio__s3_buf xml;           /* the body of an XML answer or of an error */
    char *message;                /* the failure's message, ckptio__malloc'ed (see ckptio__s3_request_fail) */
    unsigned attempts;
    uint64_t received;            /* body bytes that arrived into dst (all attempts) */

    /* --- the request's own (s3_request.c, s3_session.c) --- */
    void *easy;                   /* CURL * */
    void *headers;                /* struct curl_slist * */
    char payload_hash[CKPTIO__SHA256_HEX];
    uint64_t attempt_received;    /* bytes of the current attempt */
    uint64_t attempt_off;         /* where the current attempt's range starts */
    double started, due;
    size_t attempt_sent;          /* body bytes sent in the current attempt */
    int curl_code;                /* CURLcode of the last attempt */
    char curl_error[256];
    bool too_much;                /* the server sent more than asked */
    bool ignored_range;           /* the server answered 200 to a range not starting at 0 */
    char code[64];                /* the server's error Code, or "" */
    char server_message[256];     /* the server's error Message, or "" */
    char request_id[96];          /* x-amz-request-id of the last answer */
    char reason[512];             /* why the last attempt failed */
    ckptio__s3_request *next;
    ckptio__s3_request *active_prev, *active_next; /* the session's transfers under way (s3_session.c) */
};

/* Sets every field to its empty state and the three given. */
void ckptio__s3_request_init(ckptio__s3_request *r, const ckptio__s3_client *client, const char *method,
                             const char *bucket, const char *key, const char *what);

/* Adds a query parameter (value NULL: no '='). The strings must outlive the request. */
void ckptio__s3_request_query(ckptio__s3_request *r, const char *name, const char *value);

/* Frees what the request holds (curl handle, buffers, message); the request
 * may be initialised again. */
void ckptio__s3_request_cleanup(ckptio__s3_request *r);

/* Records the request's failure as the calling thread's error and returns
 * its status (CKPTIO_OK when it did not fail). The message names the
 * operation, "s3://BUCKET/KEY" (printable, bounded), the HTTP status and the
 * server's Code and Message, the attempts made and the request id. */
ckptio_status ckptio__s3_request_fail(const ckptio__s3_request *r);

/* ---- requests in flight (s3_session.c) ----------------------------------- */

/* One thread's set of requests in flight on one curl multi handle (and its
 * connections, kept between requests). Not thread-safe, except
 * ckptio__s3_session_wakeup. */
ckptio_status ckptio__s3_session_create(ckptio__s3_session **out);
void ckptio__s3_session_destroy(ckptio__s3_session *s);

/* Starts `r` (never fails here: failures come back from wait with r->status). */
void ckptio__s3_submit(ckptio__s3_session *s, ckptio__s3_request *r);

/* Blocks until one submitted request is finished - done, or failed after its
 * retries or deadline - and returns it; NULL when none is in flight, or when
 * ckptio__s3_session_wakeup was called (from any thread). */
ckptio__s3_request *ckptio__s3_wait(ckptio__s3_session *s);

/* Makes a wait in progress (or the next one) return NULL early. Thread-safe. */
void ckptio__s3_session_wakeup(ckptio__s3_session *s);

/* Requests in flight. */
unsigned ckptio__s3_inflight(const ckptio__s3_session *s);

/* Ends every request in flight at once, each failed with CKPTIO_E_CANCELED
 * and `why` (their connections closed), for ckptio__s3_wait to hand back:
 * once the transfer they belong to has failed or was stopped, a stalled
 * one no longer holds it up until its timeout. On the session's thread. */
void ckptio__s3_session_cancel(ckptio__s3_session *s, const char *why);

/* Runs one request to its end on a session from a process-wide pool (the
 * pool keeps connections open between calls). Returns r->status, with the
 * error recorded on the calling thread when it failed. */
ckptio_status ckptio__s3_perform(ckptio__s3_request *r);

/* Test hook: every backoff wait lasts at most this many milliseconds (0: as computed). */
void ckptio__s3_set_backoff_cap_ms(unsigned ms);

/* ---- operations (s3_ops.c); each returns CKPTIO_OK or records the error --- */

/* Size and ETag of an object. A missing object is CKPTIO_E_NOT_FOUND. */
ckptio_status ckptio__s3_head(const ckptio__s3_client *c, const char *bucket, const char *key, uint64_t *size,
                              char etag[128]);

/* Reads [off, off + len) of the object into dst (ranged GET), refusing an
 * object whose ETag is no longer `etag` (CKPTIO_E_STALE; NULL: any). */
ckptio_status ckptio__s3_get(const ckptio__s3_client *c, const char *bucket, const char *key, const char *etag,
                             uint64_t off, uint64_t len, void *dst);

/* Puts data[0..len) as the whole object; if_none_match: only if there is no
 * object yet (CKPTIO_E_EXISTS when there is; CKPTIO_E_UNSUPPORTED where the
 * server cannot do conditional writes). */
ckptio_status ckptio__s3_put(const ckptio__s3_client *c, const char *bucket, const char *key, const void *data,
                             size_t len, bool if_none_match);

/* Deletes an object; a missing one is no error. */
ckptio_status ckptio__s3_delete(const ckptio__s3_client *c, const char *bucket, const char *key);

/* Lists the objects under `prefix` (ListObjectsV2, every page), and with a
 * delimiter the common prefixes. fn's non-zero return stops (CKPTIO_OK). */
ckptio_status ckptio__s3_list(const ckptio__s3_client *c, const char *bucket, const char *prefix,
                              const char *delimiter, ckptio__s3_entry_fn fn, void *user);

/* Test hook: listings ask for pages of at most `keys` entries (0: the server's default). */
void ckptio__s3_set_list_page(unsigned keys);

/* Lists the unfinished multipart uploads under `prefix` (every page). */
ckptio_status ckptio__s3_list_uploads(const ckptio__s3_client *c, const char *bucket, const char *prefix,
                                      ckptio__s3_entry_fn fn, void *user);

/* Multipart upload: create (the id into upload_id), complete with the parts'
 * ETags (etags[i] is part i + 1's), abort. A complete whose answer was lost
 * and whose retry finds the upload gone checks the object's ETag against
 * the one the parts make (MD5 of their MD5s) before calling it done. */
ckptio_status ckptio__s3_mpu_create(const ckptio__s3_client *c, const char *bucket, const char *key,
                                    char *upload_id, size_t cap);
ckptio_status ckptio__s3_mpu_complete(const ckptio__s3_client *c, const char *bucket, const char *key,
                                      const char *upload_id, char *const *etags, unsigned nparts);
ckptio_status ckptio__s3_mpu_abort(const ckptio__s3_client *c, const char *bucket, const char *key,
                                   const char *upload_id);

/* Fills `r` for UploadPart `part` (1-based) of data[0..len). */
void ckptio__s3_mpu_part_request(ckptio__s3_request *r, const ckptio__s3_client *c, const char *bucket,
                                 const char *key, const char *upload_id, unsigned part, char part_text[16],
                                 const void *data, size_t len);

/* ---- part buffers kept between uploads (s3_part_pool.c) ------------------ */

/* Buffers of stored parts, kept for the next part of any upload that uses
 * the pool (one per engine). Thread-safe. */
typedef struct ckptio__s3_part_pool ckptio__s3_part_pool;

typedef struct ckptio__s3_part_pool_stats {
    uint64_t allocated;  /* takes that found no kept buffer of their size (a new one was allocated) */
    uint64_t reused;     /* takes served by a kept buffer */
    uint64_t freed;      /* buffers freed: over the bound, idle for keep_ms, trimmed */
    uint64_t kept_bytes; /* bytes kept now */
    uint64_t kept_peak;  /* the most bytes kept at once */
} ckptio__s3_part_pool_stats;

ckptio_status ckptio__s3_part_pool_create(ckptio__s3_part_pool **out);

/* At most `bound` bytes are kept (the oldest buffers are freed first), each
 * buffer at most keep_ms after it was given back (0: none is kept). */
void ckptio__s3_part_pool_configure(ckptio__s3_part_pool *pool, uint64_t bound, unsigned keep_ms);

/* A buffer of `size` bytes (contents undefined): a kept one, else a new
 * one; NULL when out of memory. pool NULL: always a new one. */
unsigned char *ckptio__s3_part_pool_take(ckptio__s3_part_pool *pool, size_t size);

/* Gives back a buffer of `size` bytes that nothing uses any more: kept, or
 * freed when the bound or keep_ms says so (pool NULL: freed). */
void ckptio__s3_part_pool_give(ckptio__s3_part_pool *pool, unsigned char *buf, size_t size);

/* Frees every kept buffer now. */
void ckptio__s3_part_pool_trim(ckptio__s3_part_pool *pool);

void ckptio__s3_part_pool_stats_get(ckptio__s3_part_pool *pool, ckptio__s3_part_pool_stats *out);

/* Frees the pool and every kept buffer. No upload may use it any more. Accepts NULL. */
void ckptio__s3_part_pool_destroy(ckptio__s3_part_pool *pool);

/* A fork()ed child's copy of a pool: frees what can be freed without the
 * parent's threads (its trimmer does not exist here) and leaves the pool
 * stopping, never freed: an upload opened before the fork gives its buffers
 * back to it (and they are freed). Accepts NULL. */
void ckptio__s3_part_pool_forget(ckptio__s3_part_pool *pool);

/* ---- an object written in parts (s3_upload.c) ---------------------------- */

typedef struct ckptio__s3_upload ckptio__s3_upload;

/* Starts writing `key` (nothing is sent before the first part is full).
 * At most max_buffered bytes of part buffers are held at once: writers wait
 * for uploads to finish, and writes so far out of order that every buffer
 * waits for bytes that have not come fail (CKPTIO_E_UNSUPPORTED). Part
 * buffers come from `pool` and go back to it once their part is stored
 * (NULL: malloc and free). */
ckptio_status ckptio__s3_upload_open(const ckptio__s3_client *c, const char *bucket, const char *key,
                                     uint64_t max_buffered, ckptio__s3_part_pool *pool, ckptio__s3_upload **out);

/* The object's final size, when known before its bytes (sets the part size:
 * at least settings.part_bytes, and large enough for 10,000 parts).
 * Refused once a part of another size was uploaded, or below bytes already
 * uploaded. */
ckptio_status ckptio__s3_upload_set_size(ckptio__s3_upload *u, uint64_t size);

/* Copies data[0..len) to offset `off` of the object. Thread-safe; blocks
 * while the buffers are full. Fails once the upload failed (the first
 * failure's message). */
ckptio_status ckptio__s3_upload_write(ckptio__s3_upload *u, uint64_t off, const void *data, uint64_t len);

/* Reads back [off, off + len) from the buffers not yet uploaded
 * (CKPTIO_E_UNSUPPORTED for bytes already sent). */
ckptio_status ckptio__s3_upload_read(ckptio__s3_upload *u, uint64_t off, void *buf, uint64_t len);

/* The object's size so far: the set size, or the end of the last write. */
uint64_t ckptio__s3_upload_size(ckptio__s3_upload *u);

/* Asked every few milliseconds while a commit waits for its parts: non-zero
 * stops the commit (CKPTIO_E_CANCELED, the error recorded by the callback
 * kept), and the object is not made. */
typedef ckptio_status (*ckptio__s3_poll_fn)(void *user);

/* Sends what is left and makes the object appear: one PUT when it fits in
 * one part, else CompleteMultipartUpload. On failure, or when `poll` (may be
 * NULL) stops it, the multipart upload is aborted (at close) and the object
 * is as it was before. */
ckptio_status ckptio__s3_upload_commit(ckptio__s3_upload *u, ckptio__s3_poll_fn poll, void *user);

/* Ends the upload: after a commit only frees; otherwise aborts the
 * multipart upload (nothing appears) and frees. Returns CKPTIO_OK, or the
 * abort's failure (the upload then stays until a cleaner aborts it). */
ckptio_status ckptio__s3_upload_close(ckptio__s3_upload *u);

/* A bound on the part buffers of several uploads together (the shards of
 * one model saved at once): an upload given one takes each buffer from it
 * as well as from its own max_buffered, and a writer waits while the shared
 * bound is reached by the others. Reference-counted: each upload holds it
 * until its close. */
typedef struct ckptio__s3_budget ckptio__s3_budget;
ckptio__s3_budget *ckptio__s3_budget_create(uint64_t max_bytes); /* NULL: out of memory */
void ckptio__s3_budget_release(ckptio__s3_budget *b);             /* drops the creator's reference; NULL ok */
/* Before the first write: the upload draws its buffers from `b` too. */
void ckptio__s3_upload_share_budget(ckptio__s3_upload *u, ckptio__s3_budget *b);
/* The most bytes the budget's uploads held at once; for tests. */
uint64_t ckptio__s3_budget_peak(ckptio__s3_budget *b);
/* The budget an upload shares (NULL: none). */
ckptio__s3_budget *ckptio__s3_upload_budget(ckptio__s3_upload *u);

/* The multipart upload's id ("" before one was created); for tests. */
const char *ckptio__s3_upload_id(ckptio__s3_upload *u);

/* The most part-buffer bytes held at once so far, and the bound; for tests. */
void ckptio__s3_upload_buffers(ckptio__s3_upload *u, uint64_t *peak, uint64_t *bound);
/* How many writers wait for a part buffer now (for tests). */
unsigned ckptio__s3_upload_waiting(ckptio__s3_upload *u);

#endif /* CKPTIO_OBJSTORE_INTERNAL_H */
