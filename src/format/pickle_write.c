/*
 * pickle_write.c - protocol-2 pickle opcodes, the subset torch.save emits
 * and torch.load(weights_only=True) accepts (docs/FORMATS.md section 2). No
 * memo: torch's loader does not need one and it keeps the writer simple.
 * Allocation failure is sticky (b->failed) so callers check once at the end.
 */
#include "pickle_internal.h"

#include <string.h>

void ckptio__pickle_buf_free(ckptio__pickle_buf *b) {
    ckptio__free(b->data);
    memset(b, 0, sizeof *b);
}

void ckptio__pickle_raw(ckptio__pickle_buf *b, const void *data, size_t len) {
    if (b->failed) return;
    if (b->cap - b->len < len) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap - b->len < len) {
            if (ncap > SIZE_MAX / 2) {
                b->failed = true;
                CKPTIO_FAIL(CKPTIO_E_NOMEM, "pickle too large");
                return;
            }
            ncap *= 2;
        }
        uint8_t *grown = ckptio__realloc(b->data, ncap);
        if (!grown) {
            b->failed = true;
            CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the pickle (%zu bytes)", ncap);
            return;
        }
        b->data = grown;
        b->cap = ncap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

void ckptio__pickle_op(ckptio__pickle_buf *b, uint8_t op) { ckptio__pickle_raw(b, &op, 1); }

void ckptio__pickle_proto(ckptio__pickle_buf *b) {
    const uint8_t bytes[2] = {CKPTIO__OP_PROTO, 2};
    ckptio__pickle_raw(b, bytes, 2);
}

void ckptio__pickle_global(ckptio__pickle_buf *b, const char *module, const char *name) {
    ckptio__pickle_op(b, CKPTIO__OP_GLOBAL);
    ckptio__pickle_raw(b, module, strlen(module));
    ckptio__pickle_op(b, '\n');
    ckptio__pickle_raw(b, name, strlen(name));
    ckptio__pickle_op(b, '\n');
}

void ckptio__pickle_int(ckptio__pickle_buf *b, int64_t v) {
    uint8_t buf[9];
    if (v >= 0 && v <= 0xFF) {
        buf[0] = CKPTIO__OP_BININT1;
        buf[1] = (uint8_t)v;
        ckptio__pickle_raw(b, buf, 2);
    } else if (v >= 0 && v <= 0xFFFF) {
        buf[0] = CKPTIO__OP_BININT2;
        buf[1] = (uint8_t)v;
        buf[2] = (uint8_t)(v >> 8);
        ckptio__pickle_raw(b, buf, 3);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        buf[0] = CKPTIO__OP_BININT;
        uint32_t u = (uint32_t)(int32_t)v;
        for (int i = 0; i < 4; i++) buf[1 + i] = (uint8_t)(u >> (8 * i));
        ckptio__pickle_raw(b, buf, 5);
    } else {
        /* Python's encode_long: the shortest little-endian two's complement. */
        uint8_t le[8];
        uint64_t u = (uint64_t)v;
        for (int i = 0; i < 8; i++) le[i] = (uint8_t)(u >> (8 * i));
        size_t n = 8;
        while (n > 1) {
            uint8_t top = le[n - 1], next_sign = le[n - 2] & 0x80;
            if ((top == 0x00 && !next_sign) || (top == 0xFF && next_sign)) n--;
            else break;
        }
        ckptio__pickle_long1(b, le, n);
    }
}

void ckptio__pickle_long1(ckptio__pickle_buf *b, const uint8_t *bytes, size_t len) {
    if (len > 255) {
        /* LONG4 is outside torch's weights_only opcode set. */
        if (!b->failed) CKPTIO_FAIL(CKPTIO_E_RANGE, "integer of %zu bytes exceeds LONG1 (255 bytes)", len);
        b->failed = true;
        return;
    }
    uint8_t hdr[2] = {CKPTIO__OP_LONG1, (uint8_t)len};
    ckptio__pickle_raw(b, hdr, 2);
    ckptio__pickle_raw(b, bytes, len);
}

void ckptio__pickle_float(ckptio__pickle_buf *b, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    uint8_t buf[9] = {CKPTIO__OP_BINFLOAT};
    for (int i = 0; i < 8; i++) buf[1 + i] = (uint8_t)(u >> (56 - 8 * i)); /* big-endian */
    ckptio__pickle_raw(b, buf, 9);
}

void ckptio__pickle_str(ckptio__pickle_buf *b, const char *s, size_t len) {
    if (len > UINT32_MAX) {
        if (!b->failed) CKPTIO_FAIL(CKPTIO_E_RANGE, "string of %zu bytes exceeds BINUNICODE", len);
        b->failed = true;
        return;
    }
    uint8_t hdr[5] = {CKPTIO__OP_BINUNICODE};
    for (int i = 0; i < 4; i++) hdr[1 + i] = (uint8_t)((uint32_t)len >> (8 * i));
    ckptio__pickle_raw(b, hdr, 5);
    ckptio__pickle_raw(b, s, len);
}

void ckptio__pickle_bytes(ckptio__pickle_buf *b, const uint8_t *data, size_t len) {
    /* Protocol 2 has no bytes opcode: Python writes
     * _codecs.encode(<bytes decoded as latin-1>, 'latin1'), so each byte
     * >= 0x80 becomes two UTF-8 bytes in the string. */
    ckptio__pickle_global(b, "_codecs", "encode");
    size_t n = len;
    for (size_t i = 0; i < len; i++) n += data[i] >= 0x80;
    if (n > UINT32_MAX) {
        if (!b->failed) CKPTIO_FAIL(CKPTIO_E_RANGE, "bytes value of %zu bytes is too long", len);
        b->failed = true;
        return;
    }
    uint8_t hdr[5] = {CKPTIO__OP_BINUNICODE};
    for (int i = 0; i < 4; i++) hdr[1 + i] = (uint8_t)((uint32_t)n >> (8 * i));
    ckptio__pickle_raw(b, hdr, 5);
    for (size_t i = 0; i < len; i++) {
        if (data[i] < 0x80) {
            ckptio__pickle_raw(b, &data[i], 1);
        } else {
            uint8_t two[2] = {(uint8_t)(0xC0 | data[i] >> 6), (uint8_t)(0x80 | (data[i] & 0x3F))};
            ckptio__pickle_raw(b, two, 2);
        }
    }
    ckptio__pickle_str(b, "latin1", 6);
    ckptio__pickle_op(b, CKPTIO__OP_TUPLE2);
    ckptio__pickle_op(b, CKPTIO__OP_REDUCE);
}

void ckptio__pickle_bool(ckptio__pickle_buf *b, bool v) {
    ckptio__pickle_op(b, v ? CKPTIO__OP_NEWTRUE : CKPTIO__OP_NEWFALSE);
}
