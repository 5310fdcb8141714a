/*
 * cli_quote.c - text from checkpoints and file systems made safe for a
 * terminal: the `ckptio` commands' human output (tables, result lines,
 * errors, warnings) passes every untrusted string through here.
 *
 * A tensor name, metadata value or file name is data: printed raw, an
 * escape sequence in it would move the cursor, recolour or retitle the
 * terminal, and a newline would forge output lines. Control characters
 * (C0, DEL, and the C1 range U+0080..U+009F that terminals also obey), the
 * Unicode line separators and bidirectional overrides (which reorder what
 * is shown), bytes that are not UTF-8, and the backslash itself (so the
 * quoting stays unambiguous) are written as \n, \t, \r, \\, \xHH or \uXXXX.
 * Everything else, including non-ASCII letters, prints as it is. --json
 * output is escaped by jansson and does not come here.
 */
#include "cli.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Length of the UTF-8 sequence at s[0..n) and its code point, or 0 when
 * it is not well formed (overlong, surrogate, past U+10FFFF, cut short). */
static size_t utf8_sequence(const unsigned char *s, size_t n, uint32_t *cp) {
    size_t k;
    uint32_t c;
    if (s[0] < 0x80) return *cp = s[0], 1;
    if ((s[0] & 0xE0) == 0xC0) k = 2, c = s[0] & 0x1F;
    else if ((s[0] & 0xF0) == 0xE0) k = 3, c = s[0] & 0x0F;
    else if ((s[0] & 0xF8) == 0xF0) k = 4, c = s[0] & 0x07;
    else return 0;
    if (n < k) return 0;
    for (size_t j = 1; j < k; j++) {
        if ((s[j] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[j] & 0x3F);
    }
    if ((k == 2 && c < 0x80) || (k == 3 && c < 0x800) || (k == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
        (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    *cp = c;
    return k;
}

/* Code points shown as \uXXXX although well formed: C1 controls, line and
 * paragraph separators, bidirectional marks, embeddings, overrides and
 * isolates. */
static bool escaped_code_point(uint32_t c) {
    return (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || c == 0x200E || c == 0x200F ||
           (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) || c == 0x061C;
}

size_t cli_quote(const char *text, size_t len, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)text;
    size_t w = 0;
#define PUT(ch)                                \
    do {                                       \
        if (w + 1 < cap) out[w] = (char)(ch);  \
        w++;                                   \
    } while (0)
    for (size_t i = 0; i < len;) {
        uint32_t cp = 0;
        const size_t k = utf8_sequence(s + i, len - i, &cp);
        if (k == 0 || (k == 1 && (cp < 0x20 || cp == 0x7F || cp == '\\'))) {
            const unsigned char c = s[i++];
            PUT('\\');
            if (c == '\n') PUT('n');
            else if (c == '\t') PUT('t');
            else if (c == '\r') PUT('r');
            else if (c == '\\') PUT('\\');
            else {
                PUT('x');
                PUT(hex[c >> 4]);
                PUT(hex[c & 15]);
            }
        } else if (escaped_code_point(cp)) {
            PUT('\\');
            PUT('u');
            for (int shift = 12; shift >= 0; shift -= 4) PUT(hex[(cp >> shift) & 15]);
            i += k;
        } else {
            for (size_t j = 0; j < k; j++) PUT(s[i + j]);
            i += k;
        }
    }
#undef PUT
    if (cap) out[w < cap ? w : cap - 1] = '\0';
    return w;
}

/* cli_q's results live in a ring of buffers, enough for every string of
 * one printf; they are reused, never freed before exit. */
#define RING 8
static char *ring[RING];
static size_t ring_cap[RING], ring_next;

const char *cli_qn(const char *s, size_t len) {
    const size_t need = cli_quote(s, len, NULL, 0) + 1;
    const size_t slot = ring_next++ % RING;
    if (need > ring_cap[slot]) {
        char *grown = realloc(ring[slot], need);
        if (!grown) return "(out of memory)";
        ring[slot] = grown;
        ring_cap[slot] = need;
    }
    cli_quote(s, len, ring[slot], need);
    return ring[slot];
}

const char *cli_q(const char *s) { return s ? cli_qn(s, strlen(s)) : "(null)"; }

/* Whether a progress bar (cli_progress.c) is on stderr's current line. The
 * messages own this state, since they are what prints over the bar: a
 * message erases it first and starts on a clean line. */
static bool bar_on_line = false;

void cli_line_taken(void) { bar_on_line = true; }

void cli_line_clear(void) {
    if (bar_on_line) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        bar_on_line = false;
    }
}

/* "ckptio: [warning: ]MESSAGE\n" on stderr, the message quoted whole. */
void cli_vreport(const char *kind, const char *fmt, va_list ap) {
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
    cli_line_clear();
    fprintf(stderr, "ckptio: %s%s\n", kind, msg ? cli_q(msg) : "(out of memory formatting a message)");
    free(msg);
}

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_vreport("", fmt, ap);
    va_end(ap);
}

void cli_warning(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_vreport("warning: ", fmt, ap);
    va_end(ap);
}
