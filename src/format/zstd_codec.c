/*
 * zstd_codec.c - decompression of zstd-transformed items (the
 * "stream.zstd/1" transform of torch.distributed.checkpoint) with libzstd:
 * one or more frames, with or without a recorded content size, into a
 * buffer the caller sized, or streamed through a fixed one to a sink
 * (ckptio_zstd_stream), so that nothing is sized by what frames declare.
 */
#include "common_internal.h"

#include <zstd.h>

#define SCRATCH_BYTES (128u * 1024u)

static ckptio_status corrupt(size_t offset, const char *what) {
    return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                           &((ckptio__err_ctx){.operation = "zstd decompress", .file_offset = (int64_t)offset}),
                           "corrupt zstd data: %s", what);
}

/* More output than the caller allows: refused from the frame headers'
 * declared sizes, or while counting (scratch memory only), before any
 * output buffer exists. */
static ckptio_status too_large(uint64_t size, uint64_t limit, bool declared) {
    return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.operation = "zstd decompress", .file_offset = -1}),
                           "zstd data %s %llu bytes, more than the %llu this item may hold (%s: a decompression "
                           "bomb or a lying frame header)",
                           declared ? "declares" : "decompresses to over", (unsigned long long)size,
                           (unsigned long long)limit,
                           declared ? "refused before decompressing it" : "refused there, nothing more decompressed");
}

/* Streams (src, len) through the decompressor, into dst when it is not
 * NULL (capacity bytes), else into scratch memory only to count, stopping
 * (CKPTIO_E_FORMAT) as soon as the count passes `limit`. */
static ckptio_status run(const void *src, size_t len, void *dst, size_t capacity, uint64_t limit,
                         uint64_t *produced) {
    ckptio_status st = CKPTIO_OK;
    uint8_t *scratch = NULL;
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    *produced = 0;
    if (!dctx) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a zstd decompression context");
    if (!dst && !(scratch = ckptio__malloc(SCRATCH_BYTES))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for zstd scratch space");
        goto out;
    }
    ZSTD_inBuffer in = {src, len, 0};
    size_t last = 1; /* 0 once the current frame is complete */
    while (in.pos < in.size || last != 0) {
        uint8_t probe;
        const bool full = dst && *produced == capacity;
        ZSTD_outBuffer out = !dst ? (ZSTD_outBuffer){scratch, SCRATCH_BYTES, 0}
                             : full ? (ZSTD_outBuffer){&probe, 1, 0}
                                    : (ZSTD_outBuffer){(uint8_t *)dst + *produced, capacity - (size_t)*produced, 0};
        const size_t before = in.pos;
        last = ZSTD_decompressStream(dctx, &out, &in);
        if (ZSTD_isError(last)) {
            st = corrupt(before, ZSTD_getErrorName(last));
            goto out;
        }
        if (full && out.pos) {
            st = CKPTIO_FAIL(CKPTIO_E_RANGE, "zstd data decompresses to more than the %zu bytes available", capacity);
            goto out;
        }
        *produced += out.pos;
        if (!dst && *produced > limit) {
            st = too_large(*produced, limit, false);
            goto out;
        }
        if (in.pos == before && out.pos == 0) {
            st = in.pos == in.size ? corrupt(len, "the last frame is truncated")
                                   : corrupt(in.pos, "the decoder makes no progress");
            goto out;
        }
    }
out:
    ckptio__free(scratch);
    ZSTD_freeDCtx(dctx);
    return st;
}

/* Output handed to a sink per call: bounded memory whatever the frames hold
 * (libzstd's own window, at most 128 MiB by its default limit, aside). */
#define STREAM_PIECE ((size_t)1 << 20)

/* A corrupt frame named by where it starts and, when its header records one,
 * the size it declares: a frame that decompresses to more or less than that
 * is refused by libzstd ("Data corruption detected"). */
static ckptio_status frame_corrupt(size_t frame_start, unsigned long long declared, uint64_t frame_out,
                                   const char *what) {
    const ckptio__err_ctx at = {.operation = "zstd decompress", .file_offset = (int64_t)frame_start};
    if (declared == ZSTD_CONTENTSIZE_UNKNOWN || declared == ZSTD_CONTENTSIZE_ERROR)
        return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &at,
                               "corrupt zstd data: %s (the frame starting here, after %llu bytes of its output)",
                               what, (unsigned long long)frame_out);
    return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &at,
                           "corrupt zstd data: %s (the frame starting here declares %llu bytes; %llu decompressed "
                           "before the error)",
                           what, declared, (unsigned long long)frame_out);
}

ckptio_status ckptio_zstd_stream(const void *src, size_t len, uint64_t limit, ckptio_zstd_sink sink, void *ctx,
                                 uint64_t *total) {
    if (total) *total = 0;
    if (!src && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_zstd_stream: bad arguments");
    if (len == 0) return corrupt(0, "no frame");
    /* Frame headers cost nothing to read: sizes they declare past the limit
     * are refused before anything is decompressed (a corrupt frame is left
     * for the decoder to name). */
    uint64_t declared_sum = 0;
    for (size_t pos = 0; pos < len;) {
        const unsigned long long size = ZSTD_getFrameContentSize((const uint8_t *)src + pos, len - pos);
        const size_t frame = ZSTD_findFrameCompressedSize((const uint8_t *)src + pos, len - pos);
        if (size == ZSTD_CONTENTSIZE_ERROR || ZSTD_isError(frame)) break;
        if (size != ZSTD_CONTENTSIZE_UNKNOWN) {
            if (size > limit - declared_sum) return too_large(declared_sum + size, limit, true);
            declared_sum += size;
        }
        pos += frame;
    }
    ckptio_status st = CKPTIO_OK;
    ZSTD_DCtx *dctx = ZSTD_createDCtx();
    uint8_t *piece = ckptio__malloc(STREAM_PIECE);
    if (!dctx || !piece) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for zstd decompression");
        goto out;
    }
    ZSTD_inBuffer in = {src, len, 0};
    uint64_t produced = 0, frame_out = 0;
    size_t frame_start = 0;
    unsigned long long declared = ZSTD_CONTENTSIZE_UNKNOWN;
    size_t last = 0; /* 0 between frames */
    while (in.pos < in.size || last != 0) {
        if (last == 0) { /* a frame starts here */
            frame_start = in.pos;
            frame_out = 0;
            declared = ZSTD_getFrameContentSize((const uint8_t *)src + in.pos, len - in.pos);
        }
        ZSTD_outBuffer out = {piece, STREAM_PIECE, 0};
        const size_t before = in.pos;
        last = ZSTD_decompressStream(dctx, &out, &in);
        if (ZSTD_isError(last)) {
            st = frame_corrupt(frame_start, declared, frame_out, ZSTD_getErrorName(last));
            goto out;
        }
        if (out.pos > limit - produced) {
            st = too_large(produced + out.pos, limit, false);
            goto out;
        }
        if (out.pos && sink && (st = sink(ctx, piece, out.pos, produced)) != CKPTIO_OK) goto out;
        produced += out.pos;
        frame_out += out.pos;
        if (in.pos == before && out.pos == 0) {
            st = in.pos == in.size ? frame_corrupt(frame_start, declared, frame_out, "the frame is truncated")
                                   : corrupt(in.pos, "the decoder makes no progress");
            goto out;
        }
    }
    if (total) *total = produced;
out:
    ckptio__free(piece);
    ZSTD_freeDCtx(dctx);
    return st;
}

ckptio_status ckptio_zstd_decompressed_size_max(const void *src, size_t len, uint64_t limit, uint64_t *out) {
    if (!out || (!src && len)) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_zstd_decompressed_size_max: bad arguments");
    *out = 0;
    if (len == 0) return corrupt(0, "no frame");
    /* Sum the frames' recorded sizes, refusing as soon as the sum passes the
     * limit (a frame header costs nothing to read, its claim may be a lie);
     * one frame without a size means counting, which stops at the limit too. */
    const uint8_t *p = src;
    size_t left = len;
    uint64_t total = 0;
    while (left) {
        const unsigned long long size = ZSTD_getFrameContentSize(p, left);
        if (size == ZSTD_CONTENTSIZE_ERROR) return corrupt(len - left, "not a zstd frame");
        if (size == ZSTD_CONTENTSIZE_UNKNOWN) return run(src, len, NULL, 0, limit, out);
        if (size > limit || total > limit - size) return too_large(size > limit ? size : total + size, limit, true);
        const size_t frame = ZSTD_findFrameCompressedSize(p, left);
        if (ZSTD_isError(frame)) return corrupt(len - left, ZSTD_getErrorName(frame));
        total += size;
        p += frame;
        left -= frame;
    }
    *out = total;
    return CKPTIO_OK;
}

ckptio_status ckptio_zstd_decompress(const void *src, size_t len, void *dst, size_t capacity, size_t *out_len) {
    if (!out_len || (!src && len) || (!dst && capacity))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_zstd_decompress: bad arguments");
    *out_len = 0;
    if (len == 0) return corrupt(0, "no frame");
    uint8_t dummy;
    uint64_t produced = 0;
    CKPTIO_FORWARD(run(src, len, dst ? dst : &dummy, dst ? capacity : 0, UINT64_MAX, &produced));
    *out_len = (size_t)produced;
    return CKPTIO_OK;
}
