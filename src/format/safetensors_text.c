/*
 * safetensors_text.c - text-level helpers of the safetensors format: error
 * messages, the pre-scan of raw header JSON, dtype names, shape formatting.
 *
 * jansson parses the header (safetensors_header.c). The pre-scan exists only
 * for two things jansson accepts but the reference parser (serde_json inside
 * huggingface/safetensors) refuses, so that ckptio is never more lenient:
 *  - nesting of 128 levels or more ("recursion limit exceeded");
 *  - the number -0, which serde_json reads as the float -0.0 and then refuses
 *    as a shape or offset, while jansson turns it into the integer 0.
 * ckptio refuses -0 anywhere outside strings, also under keys the reference
 * ignores: stricter, never more lenient. The scan also caps the number of
 * JSON values (CKPTIO__ST_MAX_VALUES) before jansson builds its tree.
 */
#include "safetensors_internal.h"

#include <stdio.h>
#include <string.h>

ckptio_status ckptio__st_fail(ckptio_status status, const char *src_file, int line, const char *path, int64_t offset,
                              const char *kind, const char *name, const char *fmt, ...) {
    char subject[1024];
    subject[0] = '\0';
    if (kind && name) snprintf(subject, sizeof subject, "%s '%s'", kind, name);
    else if (kind) snprintf(subject, sizeof subject, "%s", kind);
    const ckptio__err_ctx ctx = {.path = path, .file_offset = offset, .subject = subject};
    va_list ap;
    va_start(ap, fmt);
    ckptio__vfail(status, src_file, line, &ctx, fmt, ap);
    va_end(ap);
    return status;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

ckptio_status ckptio__st_scan(const char *json, size_t len, const char *path) {
    unsigned depth = 0;
    uint64_t values = 1;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        const char c = json[i];
        if (in_string) {
            if (c == '\\') i++; /* the escaped character cannot end the string */
            else if (c == '"') in_string = false;
            continue;
        }
        if ((c == ',' || c == '{' || c == '[') && ++values > CKPTIO__ST_MAX_VALUES)
            return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                                   &((ckptio__err_ctx){.path = path, .file_offset = (int64_t)(CKPTIO__ST_PREFIX + i)}),
                                   "header JSON holds more than %u values (ckptio's limit, which bounds the "
                                   "parser's memory)",
                                   CKPTIO__ST_MAX_VALUES);
        switch (c) {
        case '"': in_string = true; break;
        case '{':
        case '[':
            if (++depth > CKPTIO__ST_MAX_DEPTH)
                return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                                       &((ckptio__err_ctx){.path = path,
                                                           .file_offset = (int64_t)(CKPTIO__ST_PREFIX + i)}),
                                       "header JSON nests deeper than %d levels (the reference parser's limit)",
                                       CKPTIO__ST_MAX_DEPTH);
            break;
        case '}':
        case ']':
            if (depth > 0) depth--; /* unbalanced input is left for jansson to report */
            break;
        case '-':
            /* "-0" not followed by a fraction or exponent is the integer -0
             * (after an 'e' it is an exponent, as in 1e-0). */
            if (i + 1 < len && json[i + 1] == '0' && !(i > 0 && (json[i - 1] == 'e' || json[i - 1] == 'E')) &&
                (i + 2 == len || !(json[i + 2] == '.' || json[i + 2] == 'e' || json[i + 2] == 'E' ||
                                   is_digit(json[i + 2]))))
                return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                                       &((ckptio__err_ctx){.path = path,
                                                           .file_offset = (int64_t)(CKPTIO__ST_PREFIX + i)}),
                                       "header JSON holds the number -0, which safetensors reads as a "
                                       "float, not an integer");
            break;
        default: break;
        }
    }
    return CKPTIO_OK;
}

bool ckptio__st_dtype_from_name(const char *name, size_t len, ckptio_dtype *out) {
    for (int i = 0; i < CKPTIO_DTYPE_COUNT_; i++) {
        const char *st_name = ckptio_dtype_name((ckptio_dtype)i);
        if (st_name[0] && strlen(st_name) == len && memcmp(st_name, name, len) == 0) {
            *out = (ckptio_dtype)i;
            return true;
        }
    }
    return false;
}

void ckptio__st_format_shape(char *buf, size_t cap, const int64_t *shape, size_t ndim) {
    if (cap < 8) {
        if (cap) buf[0] = '\0';
        return;
    }
    size_t pos = 0;
    buf[pos++] = '[';
    for (size_t d = 0; d < ndim; d++) {
        char item[32];
        int n = snprintf(item, sizeof item, "%s%lld", d ? ", " : "", (long long)shape[d]);
        /* Leave room for "...]" and the NUL. */
        if (n < 0 || pos + (size_t)n + 5 > cap) {
            memcpy(buf + pos, "...", 3);
            pos += 3;
            break;
        }
        memcpy(buf + pos, item, (size_t)n);
        pos += (size_t)n;
    }
    buf[pos++] = ']';
    buf[pos] = '\0';
}
