/*
 * error.c - status names and the thread-local error record.
 *
 * Library code never prints: it fills one record per thread that the caller
 * reads with ckptio_last_error(). The message is composed once, at failure
 * time, so that later calls on other threads cannot tear it.
 */
#include "common_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CKPTIO_MESSAGE_MAX 2048
#define CKPTIO_FIELD_MAX 1024

typedef struct error_slot {
    ckptio_error_info info;
    char operation[64];
    char path[CKPTIO_FIELD_MAX];
    char subject[CKPTIO_FIELD_MAX];
    char message[CKPTIO_MESSAGE_MAX];
} error_slot;

static _Thread_local error_slot tls_error = {
    .info = {.status = CKPTIO_OK, .operation = "", .path = "", .file_offset = -1,
             .subject = "", .message = "no error", .source_file = "", .source_line = 0},
};

const char *ckptio_strerror(ckptio_status status) {
    switch (status) {
#define CKPTIO_X_TEXT_(name, value, text) \
    case CKPTIO_##name: return text;
        CKPTIO_STATUS_MAP(CKPTIO_X_TEXT_)
#undef CKPTIO_X_TEXT_
    }
    return "unknown status";
}

const char *ckptio_status_name(ckptio_status status) {
    switch (status) {
#define CKPTIO_X_NAME_(name, value, text) \
    case CKPTIO_##name: return #name;
        CKPTIO_STATUS_MAP(CKPTIO_X_NAME_)
#undef CKPTIO_X_NAME_
    }
    return "UNKNOWN";
}

const ckptio_error_info *ckptio_last_error(void) { return &tls_error.info; }

const char *ckptio_last_error_message(void) { return tls_error.info.message; }

ckptio_status ckptio__status_from_errno(int err) {
    switch (err) {
    case 0: return CKPTIO_E_IO;
    case ENOENT:
    case ENOTDIR: return CKPTIO_E_NOT_FOUND;
    case EACCES:
    case EPERM:
    case EROFS: return CKPTIO_E_PERMISSION;
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return CKPTIO_E_NOSPC;
    case ENOMEM: return CKPTIO_E_NOMEM;
    case EEXIST: return CKPTIO_E_EXISTS;
    case EINVAL:
    case ENAMETOOLONG: return CKPTIO_E_INVAL; /* a name no file system takes is a bad argument */
    case EBUSY: return CKPTIO_E_BUSY;
    case ECANCELED:
    case EINTR: return CKPTIO_E_CANCELED; /* given up only once the program asked to stop */
    case EOPNOTSUPP: return CKPTIO_E_UNSUPPORTED;
    default: return CKPTIO_E_IO;
    }
}

/* Appends printf-style text at *pos without overrunning; keeps the message
 * NUL-terminated even when truncated. */
static void append(char *buf, size_t cap, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *pos, const char *fmt, ...) {
    if (*pos >= cap - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *pos, cap - *pos, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    *pos += (size_t)n;
    if (*pos > cap - 1) *pos = cap - 1;
}

static void copy_field(char *dst, size_t cap, const char *src) {
    if (!src) src = "";
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

ckptio_status ckptio__vfail(ckptio_status status, const char *src_file, int src_line,
                            const ckptio__err_ctx *ctx, const char *fmt, va_list ap) {
    static const ckptio__err_ctx empty = {.file_offset = -1};
    if (!ctx) ctx = &empty;
    error_slot *slot = &tls_error;
    /* Format the caller's text first: its arguments may point into the old
     * record (e.g. re-raising a previous message). */
    char text[CKPTIO_MESSAGE_MAX];
    text[0] = '\0';
    if (fmt) vsnprintf(text, sizeof text, fmt, ap);

    copy_field(slot->operation, sizeof slot->operation, ctx->operation);
    copy_field(slot->path, sizeof slot->path, ctx->path);
    copy_field(slot->subject, sizeof slot->subject, ctx->subject);

    size_t pos = 0;
    char *m = slot->message;
    const size_t cap = sizeof slot->message;
    m[0] = '\0';
    if (ctx->verbatim) {
        append(m, cap, &pos, "%s", text[0] ? text : ckptio_strerror(status));
        goto record;
    }
    if (slot->path[0]) append(m, cap, &pos, "%s: ", slot->path);
    if (slot->operation[0]) {
        append(m, cap, &pos, "%s", slot->operation);
        if (ctx->file_offset >= 0) append(m, cap, &pos, " at offset %lld", (long long)ctx->file_offset);
        append(m, cap, &pos, ": ");
    } else if (ctx->file_offset >= 0) {
        append(m, cap, &pos, "at offset %lld: ", (long long)ctx->file_offset);
    }
    if (slot->subject[0]) append(m, cap, &pos, "%s: ", slot->subject);
    if (text[0]) append(m, cap, &pos, "%s", text);
    else append(m, cap, &pos, "%s", ckptio_strerror(status));
    if (ctx->sys_errno) append(m, cap, &pos, ": %s", strerror(ctx->sys_errno));

record:
    slot->info.status = status;
    slot->info.sys_errno = ctx->sys_errno;
    slot->info.cuda_result = ctx->cuda_result;
    slot->info.operation = slot->operation;
    slot->info.path = slot->path;
    slot->info.file_offset = ctx->file_offset;
    slot->info.subject = slot->subject;
    slot->info.message = slot->message;
    slot->info.source_file = src_file ? src_file : "";
    slot->info.source_line = src_line;
    return status;
}

ckptio_status ckptio__fail(ckptio_status status, const char *src_file, int src_line,
                           const ckptio__err_ctx *ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ckptio__vfail(status, src_file, src_line, ctx, fmt, ap);
    va_end(ap);
    return status;
}

ckptio_status ckptio__fail_again(ckptio_status status, const char *src_file, int src_line, ckptio__err_ctx ctx) {
    ctx.cuda_result = tls_error.info.cuda_result;
    /* vfail formats the text before it writes the record the text is in. */
    return ckptio__fail(status, src_file, src_line, &ctx, "%s", tls_error.info.message);
}

ckptio_status ckptio__fail_sys_note(const char *src_file, int src_line, int err, const char *operation,
                                    const char *path, const char *fmt, ...) {
    char note[CKPTIO_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note, sizeof note, fmt, ap);
    va_end(ap);
    if (!err) err = EIO;
    return ckptio__fail(ckptio__status_from_errno(err), src_file, src_line,
                        &((ckptio__err_ctx){.operation = operation, .path = path, .file_offset = -1,
                                            .sys_errno = err, .verbatim = true}),
                        "%s: %s: %s (%s)", path, operation, strerror(err), note);
}

struct ckptio__error_saved {
    error_slot slot;
};

ckptio__error_saved *ckptio__error_save(void) {
    /* Plain malloc: the allocation-failure hook must not fire in cleanup. */
    ckptio__error_saved *saved = malloc(sizeof *saved);
    if (saved) saved->slot = tls_error;
    return saved;
}

void ckptio__error_restore(ckptio__error_saved *saved) {
    if (!saved) return;
    tls_error = saved->slot;
    error_slot *slot = &tls_error;
    /* Re-point the public strings at this thread's buffers. */
    slot->info.operation = slot->operation;
    slot->info.path = slot->path;
    slot->info.subject = slot->subject;
    slot->info.message = slot->message;
    free(saved);
}
