/*
 * s3_uri.c - s3:// URLs, URI encoding and object names in messages.
 *
 * A key is a name on the server, never a path here: it is sent %-encoded
 * (every byte outside RFC 3986's unreserved set, '/' kept), so "..", "."
 * and control characters reach the server as bytes of a name, and nothing
 * derived from a key is ever opened locally.
 */
#include "objstore_internal.h"

#include <stdio.h>
#include <string.h>

bool ckptio__s3_is_url(const char *path) { return path && strncmp(path, "s3://", 5) == 0; }

static bool unreserved(unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
           c == '_' || c == '~';
}

size_t ckptio__s3_uri_encode(const char *s, size_t len, bool keep_slash, char *out, size_t cap) {
    static const char digits[] = "0123456789ABCDEF";
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (unreserved(c) || (keep_slash && c == '/')) {
            if (k + 1 >= cap) return (size_t)-1;
            out[k++] = (char)c;
        } else {
            if (k + 3 >= cap) return (size_t)-1;
            out[k++] = '%';
            out[k++] = digits[c >> 4];
            out[k++] = digits[c & 15];
        }
    }
    if (k >= cap) return (size_t)-1;
    out[k] = '\0';
    return k;
}

/* Printable copy of s[0..n) into out at *k (cap - 1 bytes at most). */
static void printable(const char *s, size_t n, char *out, size_t cap, size_t *k) {
    for (size_t i = 0; i < n && *k + 5 < cap; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out[(*k)++] = (char)c;
        } else {
            *k += (size_t)snprintf(out + *k, cap - *k, "\\x%02x", c);
        }
    }
    out[*k] = '\0';
}

void ckptio__s3_display(const char *bucket, const char *key, char *out, size_t cap) {
    if (!cap) return;
    size_t k = 0;
    out[0] = '\0';
    printable("s3://", 5, out, cap, &k);
    printable(bucket ? bucket : "", bucket ? strlen(bucket) : 0, out, cap, &k);
    if (!key) return;
    printable("/", 1, out, cap, &k);
    const size_t n = strlen(key);
    enum { SHOWN = 200 };
    printable(key, n > SHOWN ? SHOWN : n, out, cap, &k);
    if (n > SHOWN && k + 1 < cap) snprintf(out + k, cap - k, "...(a key of %zu bytes)", n);
}

static bool bucket_ok(const char *b, size_t n) {
    if (n < 3 || n > 63) return false;
    for (size_t i = 0; i < n; i++) {
        const char c = b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
    }
    const char first = b[0], last = b[n - 1];
    return first != '.' && first != '-' && last != '.' && last != '-';
}

ckptio_status ckptio__s3_parse_url(const char *url, bool allow_empty_key, char **bucket, char **key) {
    *bucket = *key = NULL;
    char shown[320];
    if (!ckptio__s3_is_url(url)) return CKPTIO_FAIL(CKPTIO_E_INVAL, "not an s3:// URL");
    const char *b = url + 5;
    const char *slash = strchr(b, '/');
    const size_t blen = slash ? (size_t)(slash - b) : strlen(b);
    const char *k = slash ? slash + 1 : "";
    {
        size_t pos = 0;
        shown[0] = '\0';
        const size_t n = strlen(url);
        printable(url, n > 250 ? 250 : n, shown, sizeof shown, &pos);
    }
    if (!bucket_ok(b, blen))
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = shown, .file_offset = -1}),
                               "the bucket name must have 3 to 63 characters of a-z, 0-9, '.' and '-', starting "
                               "and ending with a letter or digit (URLs look like s3://BUCKET/KEY)");
    const size_t klen = strlen(k);
    if (!klen && !allow_empty_key)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = shown, .file_offset = -1}),
                               "the URL names a bucket but no object (s3://BUCKET/KEY)");
    if (klen > CKPTIO__S3_MAX_KEY)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = shown, .file_offset = -1}),
                               "the object key has %zu bytes; S3 keys have at most %u", klen, CKPTIO__S3_MAX_KEY);
    *bucket = ckptio__malloc(blen + 1);
    *key = ckptio__strdup(k);
    if (!*bucket || !*key) {
        ckptio__free(*bucket);
        ckptio__free(*key);
        *bucket = *key = NULL;
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory parsing an s3:// URL");
    }
    memcpy(*bucket, b, blen);
    (*bucket)[blen] = '\0';
    return CKPTIO_OK;
}
