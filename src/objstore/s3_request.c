/*
 * s3_request.c - one S3 request: its URL (path-style or virtual-hosted), its
 * signed headers, its curl handle for each attempt, how its answer is taken
 * in (a GET's body straight into the caller's memory, bounded; XML answers
 * and error bodies into a bounded buffer), and the verdict on each attempt:
 * done, retry (5xx, 429, SlowDown, RequestTimeout, connection failures,
 * stalls, truncated bodies) or failed (with the server's Code and Message).
 * A ranged GET that was cut short resumes where its bytes stopped.
 */
#include "objstore_private.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define XML_MAX ((size_t)16 << 20)

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static void global_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }
void ckptio__s3_global_init(void) { pthread_once(&global_once, global_init_once); }

void ckptio__s3_request_init(ckptio__s3_request *r, const ckptio__s3_client *client, const char *method,
                             const char *bucket, const char *key, const char *what) {
    memset(r, 0, sizeof *r);
    r->client = client;
    r->method = method;
    r->bucket = bucket;
    r->key = key;
    r->what = what ? what : method;
}

void ckptio__s3_request_query(ckptio__s3_request *r, const char *name, const char *value) {
    if (r->nquery < CKPTIO__S3_MAX_QUERY) r->query[r->nquery++] = (ckptio__s3_pair){name, value};
}

void ckptio__s3_request_cleanup(ckptio__s3_request *r) {
    if (r->easy) curl_easy_cleanup(r->easy);
    if (r->headers) curl_slist_free_all(r->headers);
    ckptio__free(r->xml.data);
    ckptio__free(r->message);
    r->easy = r->headers = NULL;
    r->xml = (ckptio__s3_buf){0};
    r->message = NULL;
}

/* ---- the answer ---------------------------------------------------------------- */

static bool buf_append(ckptio__s3_buf *b, const char *data, size_t n) {
    if (b->len + n + 1 > b->cap) {
        if (b->len + n + 1 > XML_MAX) return false;
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        if (cap > XML_MAX) cap = XML_MAX;
        char *p = ckptio__realloc(b->data, cap);
        if (!p) return false;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

static long status_now(const ckptio__s3_request *r) {
    long code = 0;
    curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
    return code;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    ckptio__s3_request *r = user;
    const size_t n = size * nmemb;
    const long http = status_now(r);
    if (http >= 200 && http < 300 && r->dst) {
        if (http == 200 && r->ranged && r->attempt_off != 0) {
            r->ignored_range = true; /* the body starts at byte 0, not where this attempt asked */
            return 0;
        }
        const uint64_t at = r->attempt_off - r->range_off + r->attempt_received;
        if (at > r->dst_len || n > r->dst_len - at) {
            r->too_much = true;
            return 0;
        }
        memcpy(r->dst + at, data, n);
        r->attempt_received += n;
        r->received += n;
        return n;
    }
    if (!buf_append(&r->xml, data, n)) {
        r->too_much = true;
        return 0;
    }
    return n;
}

static bool header_is(const char *line, size_t n, const char *name, const char **value, size_t *vlen) {
    const size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':') return false;
    const char *v = line + k + 1;
    const char *end = line + n;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) end--;
    *value = v;
    *vlen = (size_t)(end - v);
    return true;
}

static bool parse_u64n(const char *s, size_t n, uint64_t *out) {
    uint64_t v = 0;
    if (!n) return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        if (ckptio__mul_overflows(v, 10, &v) || ckptio__add_overflows(v, (uint64_t)(s[i] - '0'), &v)) return false;
    }
    *out = v;
    return true;
}

/* "Sun, 06 Nov 1994 08:49:37 GMT" (RFC 9110's IMF-fixdate) -> seconds since the epoch; 0 if not that. */
static double http_date(const char *v, size_t n) {
    char text[64];
    struct tm tm = {0};
    if (n >= sizeof text) return 0;
    memcpy(text, v, n);
    text[n] = '\0';
    const char *end = strptime(text, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    return end && !*end ? (double)timegm(&tm) : 0;
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *user) {
    ckptio__s3_request *r = user;
    const size_t n = size * nmemb;
    const char *v;
    size_t vl;
    if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        /* A new answer (after a 100 Continue too): forget the last one's. */
        r->etag[0] = r->request_id[0] = '\0';
        r->content_length = 0;
    } else if (header_is(line, n, "ETag", &v, &vl)) {
        snprintf(r->etag, sizeof r->etag, "%.*s", (int)(vl < sizeof r->etag ? vl : sizeof r->etag - 1), v);
    } else if (header_is(line, n, "Last-Modified", &v, &vl)) {
        r->last_modified = http_date(v, vl);
    } else if (header_is(line, n, "Date", &v, &vl)) {
        r->server_date = http_date(v, vl);
    } else if (header_is(line, n, "x-amz-request-id", &v, &vl)) {
        snprintf(r->request_id, sizeof r->request_id, "%.*s", (int)(vl < 90 ? vl : 90), v);
    } else if (header_is(line, n, "Content-Length", &v, &vl)) {
        parse_u64n(v, vl, &r->content_length);
    } else if (header_is(line, n, "Content-Range", &v, &vl)) {
        const char *slash = memchr(v, '/', vl);
        uint64_t total;
        if (slash && parse_u64n(slash + 1, vl - (size_t)(slash + 1 - v), &total)) {
            r->object_size = total;
            r->has_object_size = true;
        }
    }
    return n;
}

static size_t on_read(char *out, size_t size, size_t nmemb, void *user) {
    ckptio__s3_request *r = user;
    const size_t left = r->body_len - r->attempt_sent;
    size_t n = size * nmemb;
    if (n > left) n = left;
    memcpy(out, r->body + r->attempt_sent, n);
    r->attempt_sent += n;
    return n;
}

static int on_seek(void *user, curl_off_t offset, int origin) {
    ckptio__s3_request *r = user;
    if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > r->body_len) return CURL_SEEKFUNC_CANTSEEK;
    r->attempt_sent = (size_t)offset;
    return CURL_SEEKFUNC_OK;
}

/* ---- building an attempt ------------------------------------------------------ */

static void set_failed(ckptio__s3_request *r, ckptio_status st, const char *why) {
    r->status = st;
    ckptio__free(r->message);
    r->message = ckptio__strdup(why);
}

/* "YYYYMMDDTHHMMSSZ" now. */
static void amz_now(char out[17]) {
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

bool ckptio__s3_attempt_prepare(ckptio__s3_request *r) {
    const ckptio__s3_client *c = r->client;
    ckptio__s3_global_init();
    if (!r->easy && !(r->easy = curl_easy_init())) {
        set_failed(r, CKPTIO_E_NOMEM, "libcurl could not create a handle (out of memory)");
        return false;
    }
    curl_easy_reset(r->easy);
    if (r->headers) curl_slist_free_all(r->headers);
    r->headers = NULL;
    r->xml.len = 0;
    if (r->xml.data) r->xml.data[0] = '\0';
    r->attempt_received = r->attempt_sent = 0;
    r->too_much = r->ignored_range = false;
    r->curl_error[0] = '\0';
    r->http = 0;
    r->attempt_off = r->range_off + r->received;

    const bool has_key = r->key && *r->key;
    const bool vhost = c->addressing == CKPTIO__S3_VIRTUAL_HOSTED;
    /* The raw path (signed) and its encoding (sent): identical bytes on both sides. */
    const size_t raw_cap = strlen(c->base_path) + strlen(r->bucket) + (has_key ? strlen(r->key) : 0) + 4;
    char *raw = ckptio__malloc(raw_cap);
    size_t query_len = 0;
    for (size_t i = 0; i < r->nquery; i++)
        query_len += strlen(r->query[i].name) + (r->query[i].value ? strlen(r->query[i].value) : 0) + 2;
    const size_t url_cap = (raw_cap + query_len) * 3 + strlen(c->scheme) + strlen(c->host) + strlen(r->bucket) + 16;
    char *url = ckptio__malloc(url_cap);
    if (!raw || !url) {
        ckptio__free(raw);
        ckptio__free(url);
        set_failed(r, CKPTIO_E_NOMEM, "out of memory for the request's URL");
        return false;
    }
    if (vhost) snprintf(raw, raw_cap, "%s/%s", c->base_path, has_key ? r->key : "");
    else snprintf(raw, raw_cap, "%s/%s%s%s", c->base_path, r->bucket, has_key ? "/" : "", has_key ? r->key : "");
    char host[400];
    if (vhost) snprintf(host, sizeof host, "%s.%s", r->bucket, c->host);
    else snprintf(host, sizeof host, "%s", c->host);
    size_t k = (size_t)sprintf(url, "%s://%s", c->scheme, host);
    k += ckptio__s3_uri_encode(raw, strlen(raw), true, url + k, url_cap - k);
    /* The query in its canonical order (names are distinct and sort the same encoded). */
    const ckptio__s3_pair *sorted[CKPTIO__S3_MAX_QUERY];
    for (size_t i = 0; i < r->nquery; i++) sorted[i] = &r->query[i];
    for (size_t i = 1; i < r->nquery; i++)
        for (size_t j = i; j > 0 && strcmp(sorted[j - 1]->name, sorted[j]->name) > 0; j--) {
            const ckptio__s3_pair *t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    for (size_t i = 0; i < r->nquery; i++) {
        url[k++] = i ? '&' : '?';
        k += ckptio__s3_uri_encode(sorted[i]->name, strlen(sorted[i]->name), false, url + k, url_cap - k);
        if (sorted[i]->value) {
            url[k++] = '=';
            k += ckptio__s3_uri_encode(sorted[i]->value, strlen(sorted[i]->value), false, url + k, url_cap - k);
        }
    }
    url[k] = '\0';

    char date[17];
    amz_now(date);
    const bool body = r->body_len > 0 || !strcmp(r->method, "PUT") || !strcmp(r->method, "POST");
    if (!r->payload_hash[0]) {
        /* Small bodies (XML) are always hashed: it costs nothing. */
        if (body && !c->sign_payload && r->body_len > ((size_t)1 << 20)) strcpy(r->payload_hash, "UNSIGNED-PAYLOAD");
        else ckptio__sha256_hex(r->body ? (const void *)r->body : "", r->body_len, r->payload_hash);
    }
    char range[64] = "", if_match[160] = "";
    ckptio__s3_pair h[10];
    size_t nh = 0;
    h[nh++] = (ckptio__s3_pair){"host", host};
    h[nh++] = (ckptio__s3_pair){"x-amz-content-sha256", r->payload_hash};
    h[nh++] = (ckptio__s3_pair){"x-amz-date", date};
    if (c->session_token) h[nh++] = (ckptio__s3_pair){"x-amz-security-token", c->session_token};
    if (r->ranged) {
        snprintf(range, sizeof range, "bytes=%llu-%llu", (unsigned long long)r->attempt_off,
                 (unsigned long long)(r->range_off + r->range_len - 1));
        h[nh++] = (ckptio__s3_pair){"range", range};
    }
    if (r->if_match) {
        snprintf(if_match, sizeof if_match, "%s", r->if_match);
        h[nh++] = (ckptio__s3_pair){"if-match", if_match};
    }
    if (r->if_none_match) h[nh++] = (ckptio__s3_pair){"if-none-match", "*"};
    if (r->content_type) h[nh++] = (ckptio__s3_pair){"content-type", r->content_type};
    char auth[1024];
    const ckptio__sigv4_input in = {.method = r->method, .path = raw, .query = r->query, .nquery = r->nquery,
                                    .headers = h, .nheaders = nh, .payload_hash = r->payload_hash,
                                    .amz_date = date, .region = c->region, .service = "s3",
                                    .access_key = c->access_key, .secret_key = c->secret_key};
    const ckptio_status st = ckptio__sigv4_authorization(&in, auth, sizeof auth, NULL, 0);
    ckptio__free(raw);
    if (st != CKPTIO_OK) {
        ckptio__free(url);
        set_failed(r, st, "the request could not be signed (a credential or name too long, or out of memory)");
        return false;
    }
    struct curl_slist *list = NULL;
    char line[2300];
    bool ok = true;
    for (size_t i = 0; i < nh && ok; i++) {
        snprintf(line, sizeof line, "%s: %s", h[i].name, h[i].value);
        struct curl_slist *next = curl_slist_append(list, line);
        ok = next != NULL;
        if (next) list = next;
    }
    snprintf(line, sizeof line, "authorization: %s", auth);
    explicit_bzero(auth, sizeof auth);
    const char *extra[] = {line, "Expect:", body && !r->content_type ? "Content-Type:" : NULL};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0] && ok; i++) {
        if (!extra[i]) continue;
        struct curl_slist *next = curl_slist_append(list, extra[i]);
        ok = next != NULL;
        if (next) list = next;
    }
    explicit_bzero(line, sizeof line);
    r->headers = list;
    if (!ok) {
        ckptio__free(url);
        set_failed(r, CKPTIO_E_NOMEM, "out of memory for the request's headers");
        return false;
    }

    CURL *e = r->easy;
    const ckptio__s3_settings *s = &c->settings;
    const double left_s = r->started + s->deadline_ms / 1000.0 - ckptio__now();
    long left_ms = left_s <= 0.001 ? 1 : (long)(left_s * 1000);
    curl_easy_setopt(e, CURLOPT_URL, url);
    ckptio__free(url); /* libcurl copies it */
    curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L); /* "a/../b" is a key, not a path to resolve */
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, r->headers);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->curl_error);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(s->timeout_ms < 10000 ? s->timeout_ms : 10000));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, left_ms);
    /* A stall: less than one byte per second for timeout_ms (whole seconds). */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)((s->timeout_ms + 999) / 1000));
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    if (c->ca_file) curl_easy_setopt(e, CURLOPT_CAINFO, c->ca_file);
    if (!strcmp(r->method, "HEAD")) {
        curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    } else if (!strcmp(r->method, "PUT")) {
        curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(e, CURLOPT_READDATA, r);
        curl_easy_setopt(e, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(e, CURLOPT_SEEKDATA, r);
        curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
    } else if (!strcmp(r->method, "POST")) {
        curl_easy_setopt(e, CURLOPT_POST, 1L);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, r->body ? (const char *)r->body : "");
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "GET") != 0) {
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
    }
    r->attempts++;
    return true;
}

/* ---- judging an attempt ------------------------------------------------------- */

static bool retryable_code(const char *code) {
    static const char *const codes[] = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout",
                                        "RequestTimeTooSkewed", "OperationAborted", "Throttling"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (!strcmp(code, codes[i])) return true;
    return false;
}

static ckptio_status status_of_http(const ckptio__s3_request *r) {
    switch (r->http) {
    case 400:
        return CKPTIO_E_INVAL;
    case 401:
    case 403:
        return CKPTIO_E_PERMISSION;
    case 404:
        return CKPTIO_E_NOT_FOUND;
    case 409:
        return CKPTIO_E_EXISTS;
    case 412:
        return r->if_none_match ? CKPTIO_E_EXISTS : CKPTIO_E_STALE;
    case 416:
        return CKPTIO_E_TRUNCATED;
    case 501:
        return CKPTIO_E_UNSUPPORTED;
    default:
        return CKPTIO_E_IO;
    }
}

static void server_reason(ckptio__s3_request *r) {
    ckptio__xml_error(r->xml.data, r->xml.len, r->code, sizeof r->code, r->server_message, sizeof r->server_message);
    /* The message is the server's: keep it printable. */
    for (char *p = r->server_message; *p; p++)
        if ((unsigned char)*p < 0x20) *p = ' ';
    for (char *p = r->code; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) *p = '?';
    if (r->code[0] && r->server_message[0])
        snprintf(r->reason, sizeof r->reason, "HTTP %ld %s: %s", r->http, r->code, r->server_message);
    else if (r->code[0])
        snprintf(r->reason, sizeof r->reason, "HTTP %ld %s", r->http, r->code);
    else if (r->http == 404)
        snprintf(r->reason, sizeof r->reason, "HTTP 404 Not Found (no such key, or no such bucket)");
    else if (r->http == 403)
        snprintf(r->reason, sizeof r->reason, "HTTP 403 Forbidden (wrong credentials, or no permission)");
    else
        snprintf(r->reason, sizeof r->reason, "HTTP %ld (the answer had no S3 error document)", r->http);
}

ckptio__s3_verdict ckptio__s3_attempt_finish(ckptio__s3_request *r, int code) {
    r->curl_code = code;
    r->http = status_now(r);
    r->code[0] = r->server_message[0] = '\0';
    if (code == CURLE_WRITE_ERROR && (r->too_much || r->ignored_range)) {
        snprintf(r->reason, sizeof r->reason, "%s",
                 r->ignored_range ? "the server ignored the Range header (it sent the object from byte 0)"
                                  : r->dst ? "the server sent more bytes than the range asked for"
                                           : "the server's answer is larger than 16 MiB");
        set_failed(r, CKPTIO_E_IO, r->reason);
        return CKPTIO__S3_FAILED;
    }
    if (code != CURLE_OK) {
        /* Connection refused or reset, a stall, a body cut short: transient. */
        snprintf(r->reason, sizeof r->reason, "%s (%s)", r->curl_error[0] ? r->curl_error : curl_easy_strerror(code),
                 code == CURLE_OPERATION_TIMEDOUT ? "no progress or past the deadline"
                 : code == CURLE_PARTIAL_FILE    ? "the body was cut short"
                                                 : curl_easy_strerror(code));
        if (code == CURLE_UNSUPPORTED_PROTOCOL || code == CURLE_URL_MALFORMAT || code == CURLE_OUT_OF_MEMORY ||
            code == CURLE_SSL_CACERT_BADFILE || code == CURLE_PEER_FAILED_VERIFICATION) {
            set_failed(r, code == CURLE_OUT_OF_MEMORY ? CKPTIO_E_NOMEM : CKPTIO_E_IO, r->reason);
            return CKPTIO__S3_FAILED;
        }
        return CKPTIO__S3_RETRY;
    }
    if (r->http >= 200 && r->http < 300) {
        if (!r->has_object_size && r->http == 200) {
            r->object_size = r->content_length;
            r->has_object_size = true;
        }
        const bool ends_there = r->up_to && r->has_object_size && r->range_off + r->received == r->object_size;
        if (r->dst && r->received < r->dst_len && !ends_there) {
            /* A complete answer with fewer bytes than asked: the object ends there. */
            snprintf(r->reason, sizeof r->reason,
                     "the object ended early: %llu of the %llu bytes asked for arrived (the object has %s%llu bytes)",
                     (unsigned long long)r->received, (unsigned long long)r->dst_len,
                     r->has_object_size ? "" : "at most ",
                     (unsigned long long)(r->has_object_size ? r->object_size : r->range_off + r->received));
            set_failed(r, CKPTIO_E_TRUNCATED, r->reason);
            return CKPTIO__S3_FAILED;
        }
        if (r->want_xml && r->xml.len && ckptio__xml_find(r->xml.data, r->xml.len, "Error/Code", r->code,
                                                          sizeof r->code, NULL) == 0) {
            /* CompleteMultipartUpload may answer 200 and report its failure in the body. */
            server_reason(r);
            if (retryable_code(r->code)) return CKPTIO__S3_RETRY;
            set_failed(r, CKPTIO_E_IO, r->reason);
            return CKPTIO__S3_FAILED;
        }
        r->status = CKPTIO_OK;
        return CKPTIO__S3_DONE;
    }
    if (r->http == 404 && r->allow_404) {
        r->status = CKPTIO_OK;
        return CKPTIO__S3_DONE;
    }
    server_reason(r);
    /* 501 NotImplemented and 505 will say the same again: not retried. */
    if ((r->http >= 500 && r->http != 501 && r->http != 505) || r->http == 429 || r->http == 408 ||
        retryable_code(r->code))
        return CKPTIO__S3_RETRY;
    set_failed(r, status_of_http(r), r->reason);
    return CKPTIO__S3_FAILED;
}

bool ckptio__s3_may_retry(ckptio__s3_request *r, double now, double wait) {
    const ckptio__s3_settings *s = &r->client->settings;
    const double spent = now - r->started;
    if (r->attempts <= s->retries && spent + wait < s->deadline_ms / 1000.0) return true;
    char why[700];
    snprintf(why, sizeof why, "%s; gave up after %u attempt%s over %.1f s (retries %u, deadline %.0f s)", r->reason,
             r->attempts, r->attempts == 1 ? "" : "s", spent, s->retries, s->deadline_ms / 1000.0);
    /* A 4xx retried for its code (a gateway's 400 wrapping a server fault) stays a server fault. */
    const bool client_error = r->http && r->http < 500 && r->http != 429 && r->http != 408 && !retryable_code(r->code);
    set_failed(r, client_error ? status_of_http(r) : CKPTIO_E_IO, why);
    return false;
}

ckptio_status ckptio__s3_request_fail(const ckptio__s3_request *r) {
    if (r->status == CKPTIO_OK) return CKPTIO_OK;
    char shown[400];
    ckptio__s3_display(r->bucket, r->key && *r->key ? r->key : NULL, shown, sizeof shown);
    char what[96];
    if (r->ranged)
        snprintf(what, sizeof what, "%s bytes %llu-%llu", r->what, (unsigned long long)r->range_off,
                 (unsigned long long)(r->range_off + r->range_len - 1));
    else
        snprintf(what, sizeof what, "%s", r->what);
    char rid[120] = "";
    if (r->request_id[0]) snprintf(rid, sizeof rid, " [request id %s]", r->request_id);
    return CKPTIO_FAIL_CTX(r->status, &((ckptio__err_ctx){.operation = what, .path = shown, .file_offset = -1}),
                           "%s%s", r->message ? r->message : "the request failed", rid);
}
