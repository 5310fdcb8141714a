/*
 * s3_sigv4.c - AWS Signature Version 4 for requests to S3.
 *
 * The canonical request is METHOD \n URI \n QUERY \n HEADERS \n SIGNED \n
 * PAYLOAD-HASH; the string to sign is "AWS4-HMAC-SHA256" \n DATE \n SCOPE \n
 * hex(SHA-256(canonical request)); the key is HMAC-SHA256 chained over
 * "AWS4"+secret, the day, the region, the service and "aws4_request".
 * S3's rule for the URI: each byte of the path outside the unreserved set
 * is %-encoded once, '/' kept, no dot segments removed (other services
 * encode twice and normalise). SHA-256 and HMAC are OpenSSL's.
 */
#include "objstore_internal.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const unsigned char *d, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = '\0';
}

void ckptio__sha256_hex(const void *data, size_t len, char out[CKPTIO__SHA256_HEX]) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    unsigned int n = 0;
    EVP_Digest(data, len, md, &n, EVP_sha256(), NULL);
    hex(md, SHA256_DIGEST_LENGTH, out);
}

static void hmac(const void *key, size_t key_len, const char *msg, unsigned char out[32]) {
    unsigned int n = 32;
    HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)msg, strlen(msg), out, &n);
}

/* A growable string for the canonical request. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} sbuf;

static void put(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = ckptio__realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

static void put_encoded(sbuf *b, const char *s, bool keep_slash) {
    const size_t n = strlen(s);
    char small[256];
    char *tmp = n * 3 + 1 <= sizeof small ? small : ckptio__malloc(n * 3 + 1);
    if (!tmp) {
        b->failed = true;
        return;
    }
    size_t k = ckptio__s3_uri_encode(s, n, keep_slash, tmp, n * 3 + 1);
    put(b, tmp, k);
    if (tmp != small) ckptio__free(tmp);
}

typedef struct qitem {
    char *name, *value; /* encoded */
} qitem;

static int qcmp(const void *a, const void *b) {
    const qitem *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

typedef struct hitem {
    char *name;  /* lowercased */
    char *value; /* trimmed, inner spaces folded */
    size_t index; /* repeated names keep their order */
} hitem;

static int hcmp(const void *a, const void *b) {
    const hitem *x = a, *y = b;
    const int c = strcmp(x->name, y->name);
    return c ? c : x->index < y->index ? -1 : x->index > y->index;
}

static char *encode_dup(const char *s) {
    const size_t n = strlen(s);
    char *out = ckptio__malloc(n * 3 + 1);
    if (out) ckptio__s3_uri_encode(s, n, false, out, n * 3 + 1);
    return out;
}

static char *header_value(const char *v) {
    char *out = ckptio__malloc(strlen(v) + 1);
    if (!out) return NULL;
    while (*v == ' ' || *v == '\t') v++;
    size_t k = 0;
    bool space = false;
    for (; *v; v++) {
        if (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') {
            space = true;
            continue;
        }
        if (space && k) out[k++] = ' ';
        space = false;
        out[k++] = *v;
    }
    out[k] = '\0';
    return out;
}

ckptio_status ckptio__sigv4_authorization(const ckptio__sigv4_input *in, char *out, size_t cap, char *canonical,
                                          size_t canonical_cap) {
    ckptio_status st = CKPTIO_OK;
    qitem *q = ckptio__calloc(in->nquery ? in->nquery : 1, sizeof *q);
    hitem *h = ckptio__calloc(in->nheaders ? in->nheaders : 1, sizeof *h);
    sbuf b = {0}, signed_names = {0};
    if (!q || !h) goto nomem;
    for (size_t i = 0; i < in->nquery; i++) {
        q[i].name = encode_dup(in->query[i].name);
        q[i].value = encode_dup(in->query[i].value ? in->query[i].value : "");
        if (!q[i].name || !q[i].value) goto nomem;
    }
    qsort(q, in->nquery, sizeof *q, qcmp);
    for (size_t i = 0; i < in->nheaders; i++) {
        h[i].name = ckptio__strdup(in->headers[i].name);
        h[i].value = header_value(in->headers[i].value);
        h[i].index = i;
        if (!h[i].name || !h[i].value) goto nomem;
        for (char *c = h[i].name; *c; c++)
            if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
    }
    qsort(h, in->nheaders, sizeof *h, hcmp);

    puts_(&b, in->method);
    puts_(&b, "\n");
    put_encoded(&b, in->path && *in->path ? in->path : "/", true);
    puts_(&b, "\n");
    for (size_t i = 0; i < in->nquery; i++) {
        if (i) puts_(&b, "&");
        puts_(&b, q[i].name);
        puts_(&b, "=");
        puts_(&b, q[i].value);
    }
    puts_(&b, "\n");
    /* Repeated header names are joined with commas, in the order given. */
    for (size_t i = 0; i < in->nheaders; i++) {
        const bool first = i == 0 || strcmp(h[i - 1].name, h[i].name) != 0;
        const bool last = i + 1 == in->nheaders || strcmp(h[i + 1].name, h[i].name) != 0;
        if (first) {
            puts_(&b, h[i].name);
            puts_(&b, ":");
            if (signed_names.len) puts_(&signed_names, ";");
            puts_(&signed_names, h[i].name);
        }
        puts_(&b, h[i].value);
        puts_(&b, last ? "\n" : ",");
    }
    puts_(&b, "\n");
    puts_(&b, signed_names.p ? signed_names.p : "");
    puts_(&b, "\n");
    puts_(&b, in->payload_hash);
    if (b.failed || signed_names.failed) goto nomem;
    if (canonical) {
        if (b.len + 1 > canonical_cap) {
            st = CKPTIO_FAIL(CKPTIO_E_RANGE, "the canonical request (%zu bytes) does not fit in %zu", b.len,
                             canonical_cap);
            goto out;
        }
        memcpy(canonical, b.p, b.len + 1);
    }

    char creq_hash[CKPTIO__SHA256_HEX];
    ckptio__sha256_hex(b.p, b.len, creq_hash);
    char day[9];
    snprintf(day, sizeof day, "%.8s", in->amz_date);
    char scope[160];
    snprintf(scope, sizeof scope, "%s/%s/%s/aws4_request", day, in->region, in->service);
    char to_sign[400];
    snprintf(to_sign, sizeof to_sign, "AWS4-HMAC-SHA256\n%s\n%s\n%s", in->amz_date, scope, creq_hash);

    unsigned char k1[32], k2[32], k3[32], k4[32], sig[32];
    {
        const size_t sl = strlen(in->secret_key);
        char *k0 = ckptio__malloc(sl + 5);
        if (!k0) goto nomem;
        memcpy(k0, "AWS4", 4);
        memcpy(k0 + 4, in->secret_key, sl + 1);
        hmac(k0, sl + 4, day, k1);
        OPENSSL_cleanse(k0, sl + 4);
        ckptio__free(k0);
    }
    hmac(k1, 32, in->region, k2);
    hmac(k2, 32, in->service, k3);
    hmac(k3, 32, "aws4_request", k4);
    hmac(k4, 32, to_sign, sig);
    char sig_hex[65];
    hex(sig, 32, sig_hex);
    OPENSSL_cleanse(k1, sizeof k1);
    OPENSSL_cleanse(k4, sizeof k4);
    const int n = snprintf(out, cap, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
                           in->access_key, scope, signed_names.p ? signed_names.p : "", sig_hex);
    if (n < 0 || (size_t)n >= cap) {
        if (cap) out[0] = '\0';
        st = CKPTIO_FAIL(CKPTIO_E_RANGE, "the Authorization header (%d bytes) does not fit in %zu", n, cap);
    }
    goto out;
nomem:
    st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory signing an S3 request");
out:
    for (size_t i = 0; q && i < in->nquery; i++) {
        ckptio__free(q[i].name);
        ckptio__free(q[i].value);
    }
    for (size_t i = 0; h && i < in->nheaders; i++) {
        ckptio__free(h[i].name);
        ckptio__free(h[i].value);
    }
    ckptio__free(q);
    ckptio__free(h);
    ckptio__free(b.p);
    ckptio__free(signed_names.p);
    return st;
}
