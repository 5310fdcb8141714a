/*
 * s3_ops.c - the S3 operations ckptio uses, each one request (or a few)
 * through ckptio__s3_perform, which retries and records failures.
 */
#include "objstore_private.h"

#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ckptio_status ckptio__s3_head(const ckptio__s3_client *c, const char *bucket, const char *key, uint64_t *size,
                              char etag[128]) {
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "HEAD", bucket, key, "HEAD");
    ckptio_status st = ckptio__s3_perform(&r);
    if (st == CKPTIO_OK && !r.has_object_size) {
        r.status = CKPTIO_E_IO;
        r.message = ckptio__strdup("the answer to HEAD has no Content-Length");
        st = ckptio__s3_request_fail(&r);
    }
    if (st == CKPTIO_OK) {
        *size = r.object_size;
        if (etag) snprintf(etag, 128, "%s", r.etag);
    }
    ckptio__s3_request_cleanup(&r);
    return st;
}

ckptio_status ckptio__s3_get(const ckptio__s3_client *c, const char *bucket, const char *key, const char *etag,
                             uint64_t off, uint64_t len, void *dst) {
    if (!len) return CKPTIO_OK;
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "GET", bucket, key, "GET");
    r.ranged = true;
    r.range_off = off;
    r.range_len = len;
    r.dst = dst;
    r.dst_len = len;
    r.if_match = etag && *etag ? etag : NULL;
    const ckptio_status st = ckptio__s3_perform(&r);
    ckptio__s3_request_cleanup(&r);
    return st;
}

ckptio_status ckptio__s3_put(const ckptio__s3_client *c, const char *bucket, const char *key, const void *data,
                             size_t len, bool if_none_match) {
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "PUT", bucket, key, "PUT");
    r.body = data;
    r.body_len = len;
    r.if_none_match = if_none_match;
    const ckptio_status st = ckptio__s3_perform(&r);
    ckptio__s3_request_cleanup(&r);
    return st;
}

ckptio_status ckptio__s3_delete(const ckptio__s3_client *c, const char *bucket, const char *key) {
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "DELETE", bucket, key, "DELETE");
    r.allow_404 = true;
    ckptio_status st = ckptio__s3_perform(&r);
    if (st == CKPTIO_OK && r.http == 404) {
        /* No such key: done. No such bucket: an error. */
        ckptio__xml_error(r.xml.data, r.xml.len, r.code, sizeof r.code, r.server_message, sizeof r.server_message);
        if (!strcmp(r.code, "NoSuchBucket")) {
            r.status = CKPTIO_E_NOT_FOUND;
            r.message = ckptio__strdup("HTTP 404 NoSuchBucket: the bucket does not exist");
            st = ckptio__s3_request_fail(&r);
        }
    }
    ckptio__s3_request_cleanup(&r);
    return st;
}

/* Fails `r` (which succeeded at HTTP level) because its answer made no sense. */
static ckptio_status bad_answer(ckptio__s3_request *r, const char *why) {
    r->status = CKPTIO_E_IO;
    ckptio__free(r->message);
    char msg[400];
    snprintf(msg, sizeof msg, "the server's answer is not a valid S3 document: %s", why);
    r->message = ckptio__strdup(msg);
    return ckptio__s3_request_fail(r);
}

static _Atomic unsigned list_page;

void ckptio__s3_set_list_page(unsigned keys) { atomic_store(&list_page, keys); }

static ckptio_status list_pages(const ckptio__s3_client *c, const char *bucket, const char *prefix,
                                const char *delimiter, bool uploads, ckptio__s3_entry_fn fn, void *user) {
    char *marker = ckptio__calloc(1, 2048), *marker2 = ckptio__calloc(1, 1024);
    char *next = ckptio__calloc(1, 2048), *next2 = ckptio__calloc(1, 1024);
    ckptio_status st = CKPTIO_OK;
    if (!marker || !marker2 || !next || !next2) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing s3://%s", bucket);
        goto out;
    }
    for (unsigned page = 0;; page++) {
        ckptio__s3_request r;
        ckptio__s3_request_init(&r, c, "GET", bucket, NULL, uploads ? "ListMultipartUploads" : "ListObjectsV2");
        r.want_xml = true;
        if (uploads) {
            ckptio__s3_request_query(&r, "uploads", "");
            if (page) {
                ckptio__s3_request_query(&r, "key-marker", marker);
                ckptio__s3_request_query(&r, "upload-id-marker", marker2);
            }
        } else {
            ckptio__s3_request_query(&r, "list-type", "2");
            ckptio__s3_request_query(&r, "encoding-type", "url");
            if (page) ckptio__s3_request_query(&r, "continuation-token", marker);
        }
        char page_keys[16];
        const unsigned max_keys = atomic_load(&list_page);
        if (max_keys) {
            snprintf(page_keys, sizeof page_keys, "%u", max_keys);
            ckptio__s3_request_query(&r, uploads ? "max-uploads" : "max-keys", page_keys);
        }
        if (prefix && *prefix) ckptio__s3_request_query(&r, "prefix", prefix);
        if (delimiter && *delimiter) ckptio__s3_request_query(&r, "delimiter", delimiter);
        st = ckptio__s3_perform(&r);
        bool truncated = false;
        char err[200];
        int k = 0;
        if (st == CKPTIO_OK) {
            k = ckptio__xml_list(r.xml.data ? r.xml.data : "", r.xml.len, fn, user, &truncated, next, 2048, next2, 1024,
                                 err, sizeof err);
            if (k < 0) st = bad_answer(&r, err);
        }
        ckptio__s3_request_cleanup(&r);
        if (st != CKPTIO_OK || k == 1 || !truncated) break;
        if (!strcmp(next, marker) && !strcmp(next2, marker2)) {
            st = CKPTIO_FAIL(CKPTIO_E_IO, "s3://%s: the listing's next page marker repeats the last one", bucket);
            break;
        }
        memcpy(marker, next, 2048);
        memcpy(marker2, next2, 1024);
    }
out:
    ckptio__free(marker);
    ckptio__free(marker2);
    ckptio__free(next);
    ckptio__free(next2);
    return st;
}

ckptio_status ckptio__s3_list(const ckptio__s3_client *c, const char *bucket, const char *prefix,
                              const char *delimiter, ckptio__s3_entry_fn fn, void *user) {
    return list_pages(c, bucket, prefix, delimiter, false, fn, user);
}

ckptio_status ckptio__s3_list_uploads(const ckptio__s3_client *c, const char *bucket, const char *prefix,
                                      ckptio__s3_entry_fn fn, void *user) {
    return list_pages(c, bucket, prefix, NULL, true, fn, user);
}

ckptio_status ckptio__s3_mpu_create(const ckptio__s3_client *c, const char *bucket, const char *key,
                                    char *upload_id, size_t cap) {
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "POST", bucket, key, "CreateMultipartUpload");
    ckptio__s3_request_query(&r, "uploads", "");
    r.want_xml = true;
    ckptio_status st = ckptio__s3_perform(&r);
    if (st == CKPTIO_OK) {
        bool cut = false;
        const int k = ckptio__xml_find(r.xml.data ? r.xml.data : "", r.xml.len,
                                       "InitiateMultipartUploadResult/UploadId", upload_id, cap, &cut);
        if (k != 0 || cut || !upload_id[0]) st = bad_answer(&r, k < 0 ? "malformed XML" : "no usable UploadId");
    }
    ckptio__s3_request_cleanup(&r);
    return st;
}

void ckptio__s3_mpu_part_request(ckptio__s3_request *r, const ckptio__s3_client *c, const char *bucket,
                                 const char *key, const char *upload_id, unsigned part, char part_text[16],
                                 const void *data, size_t len) {
    snprintf(part_text, 16, "%u", part);
    ckptio__s3_request_init(r, c, "PUT", bucket, key, "UploadPart");
    ckptio__s3_request_query(r, "partNumber", part_text);
    ckptio__s3_request_query(r, "uploadId", upload_id);
    r->body = data;
    r->body_len = len;
}

/* The ETag S3 gives a multipart object: MD5 of the parts' binary MD5s, "-N". */
static bool multipart_etag(char *const *etags, unsigned n, char out[64]) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_md5(), NULL)) {
        EVP_MD_CTX_free(ctx);
        return false;
    }
    bool ok = true;
    for (unsigned i = 0; i < n && ok; i++) {
        const char *e = etags[i];
        if (*e == '"') e++;
        unsigned char md[16];
        for (int k = 0; k < 16 && ok; k++) {
            unsigned v;
            ok = sscanf(e + 2 * k, "%2x", &v) == 1;
            md[k] = (unsigned char)v;
        }
        ok = ok && EVP_DigestUpdate(ctx, md, 16);
    }
    unsigned char d[16];
    unsigned int dl = 0;
    ok = ok && EVP_DigestFinal_ex(ctx, d, &dl);
    EVP_MD_CTX_free(ctx);
    if (!ok) return false;
    for (int k = 0; k < 16; k++) sprintf(out + 2 * k, "%02x", d[k]);
    sprintf(out + 32, "-%u", n);
    return true;
}

ckptio_status ckptio__s3_mpu_complete(const ckptio__s3_client *c, const char *bucket, const char *key,
                                      const char *upload_id, char *const *etags, unsigned nparts) {
    size_t cap = 128 + (size_t)nparts * 200;
    char *body = ckptio__malloc(cap);
    if (!body) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory completing an upload of %u parts", nparts);
    size_t k = (size_t)snprintf(body, cap, "<CompleteMultipartUpload>");
    for (unsigned i = 0; i < nparts; i++)
        k += (size_t)snprintf(body + k, cap - k, "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>", i + 1,
                              etags[i]);
    k += (size_t)snprintf(body + k, cap - k, "</CompleteMultipartUpload>");
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "POST", bucket, key, "CompleteMultipartUpload");
    ckptio__s3_request_query(&r, "uploadId", upload_id);
    r.body = (const unsigned char *)body;
    r.body_len = k;
    r.content_type = "application/xml";
    r.want_xml = true;
    ckptio_status st = ckptio__s3_perform(&r);
    if (st == CKPTIO_E_NOT_FOUND && r.attempts > 1 && !strcmp(r.code, "NoSuchUpload")) {
        /* An earlier attempt may have completed it and its answer been
         * lost: the object then carries the ETag these parts make. */
        char want[64], have[128];
        uint64_t size;
        ckptio__error_saved *saved = ckptio__error_save();
        if (multipart_etag(etags, nparts, want) && ckptio__s3_head(c, bucket, key, &size, have) == CKPTIO_OK) {
            const char *h = have[0] == '"' ? have + 1 : have;
            if (!strncmp(h, want, strlen(want)) && (h[strlen(want)] == '"' || !h[strlen(want)])) {
                ckptio__free(saved);
                saved = NULL;
                st = CKPTIO_OK;
            }
        }
        if (saved) ckptio__error_restore(saved);
    }
    ckptio__s3_request_cleanup(&r);
    ckptio__free(body);
    return st;
}

ckptio_status ckptio__s3_mpu_abort(const ckptio__s3_client *c, const char *bucket, const char *key,
                                   const char *upload_id) {
    ckptio__s3_request r;
    ckptio__s3_request_init(&r, c, "DELETE", bucket, key, "AbortMultipartUpload");
    ckptio__s3_request_query(&r, "uploadId", upload_id);
    r.allow_404 = true; /* already gone: nothing left to abort */
    const ckptio_status st = ckptio__s3_perform(&r);
    ckptio__s3_request_cleanup(&r);
    return st;
}
