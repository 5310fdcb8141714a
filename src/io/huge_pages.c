/*
 * huge_pages.c - can memory advised for transparent huge pages get them
 * without a stall?
 *
 * The GPU pipeline backs its pinned staging slots with transparent huge
 * pages (MADV_HUGEPAGE; src/gpu/gpu_cuda_ops.c): a process's first load
 * runs faster that way (docs/GPU.md#huge-slots). The risk: with THP's `defrag` in
 * `madvise` mode (the kernel's default), a fault in an advised range that
 * finds no free 2 MiB block compacts memory first, a stall a busy host
 * would pay on its first load. So the slots are advised only while
 *
 *   THP is enabled (`[always]` or `[madvise]`), and the buddy allocator's
 *   free blocks of 2 MiB and more (/proc/buddyinfo) cover what may be pinned
 *   (the caller asks for twice that: src/gpu/gpu_geometry.c),
 *
 * so the faults take free blocks and have nothing to compact. The answer is
 * a snapshot: another process may take the blocks meanwhile; then a fault
 * falls back to compaction or to 4 KiB pages, as it would have anyway.
 *
 * The files are read with ckptio__read_kernel_file (kernel_files.c), on a
 * caller's thread before a transfer pins.
 */
#include "io_internal.h"

#include <string.h>
#include <unistd.h>

#define BUDDYINFO_PATH "/proc/buddyinfo"
#define THP_ENABLED_PATH "/sys/kernel/mm/transparent_hugepage/enabled"
/* More columns than any kernel's orders (MAX_ORDER is 10-13): a longer line
 * is not buddyinfo, and its shifts could overflow. */
#define MAX_ORDERS 32

/* Test hooks; NULL = the real files. */
static _Atomic(const char *) buddyinfo_source;
static _Atomic(const char *) thp_enabled_source;

void ckptio__huge_pages_set_sources(const char *buddyinfo_path, const char *thp_enabled_path) {
    buddyinfo_source = buddyinfo_path;
    thp_enabled_source = thp_enabled_path;
}

static const char *skip_blanks(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    return p;
}

/* A decimal number at *p (no sign), saturating; false when there is none. */
static bool parse_count(const char **p, const char *end, uint64_t *out) {
    const char *q = *p;
    uint64_t v = 0;
    while (q < end && *q >= '0' && *q <= '9') {
        const unsigned d = (unsigned)(*q - '0');
        v = v > (UINT64_MAX - d) / 10 ? UINT64_MAX : v * 10 + d;
        q++;
    }
    if (q == *p) return false;
    *p = q;
    *out = v;
    return true;
}

static bool take_word(const char **p, const char *end, const char *word) {
    const size_t n = strlen(word);
    if ((size_t)(end - *p) < n || memcmp(*p, word, n) != 0) return false;
    *p += n;
    return true;
}

static uint64_t add_sat(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* The bytes in free blocks of order >= min_order on one line
 * [p, end) ("Node 0, zone   Normal  c0 c1 ..."); false when the line is
 * not of that form (then it counts for nothing). */
static bool parse_line(const char *p, const char *end, size_t page_bytes, unsigned min_order, uint64_t *bytes) {
    uint64_t node;
    p = skip_blanks(p, end);
    if (!take_word(&p, end, "Node")) return false;
    p = skip_blanks(p, end);
    if (!parse_count(&p, end, &node) || !take_word(&p, end, ",")) return false;
    p = skip_blanks(p, end);
    if (!take_word(&p, end, "zone")) return false;
    const char *name = p = skip_blanks(p, end);
    while (p < end && *p != ' ' && *p != '\t') p++;
    if (p == name) return false;
    uint64_t sum = 0;
    unsigned order = 0;
    for (p = skip_blanks(p, end); p < end; p = skip_blanks(p, end), order++) {
        uint64_t count;
        if (order >= MAX_ORDERS || !parse_count(&p, end, &count)) return false;
        if (p < end && *p != ' ' && *p != '\t') return false; /* "12x" */
        if (order < min_order || count == 0) continue;
        const uint64_t block = (uint64_t)page_bytes << order; /* order < 32, page_bytes < 2^32: no overflow */
        sum = add_sat(sum, count > UINT64_MAX / block ? UINT64_MAX : count * block);
    }
    if (order == 0) return false; /* no counts at all */
    *bytes = sum;
    return true;
}

uint64_t ckptio__buddyinfo_free_bytes(const char *text, size_t page_bytes, unsigned min_order) {
    if (!text || page_bytes == 0 || page_bytes > UINT32_MAX) return 0;
    uint64_t total = 0;
    const char *p = text;
    for (;;) {
        const char *nl = strchr(p, '\n');
        /* A last line without its newline was cut short (the file was longer
         * than what was read): its last count may be cut in two, so the
         * line counts for nothing. Undercounting only turns huge pages off. */
        if (!nl) break;
        uint64_t bytes;
        if (parse_line(p, nl, page_bytes, min_order, &bytes)) total = add_sat(total, bytes);
        p = nl + 1;
    }
    return total;
}

uint64_t ckptio__huge_page_bytes_free(void) {
    const long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return 0;
    unsigned min_order = 0;
    while (((uint64_t)page << min_order) < CKPTIO_HUGE_PAGE_BYTES) min_order++;
    /* A few nodes of 3-4 zones take ~100 bytes a line; a longer file is
     * parsed as far as it was read. */
    char buf[4096];
    const char *source = buddyinfo_source;
    if (ckptio__read_kernel_file(source ? source : BUDDYINFO_PATH, buf, sizeof buf) <= 0) return 0;
    return ckptio__buddyinfo_free_bytes(buf, (size_t)page, min_order);
}

bool ckptio__huge_pages_advisable(void) {
    char buf[128]; /* "always [madvise] never\n" */
    const char *source = thp_enabled_source;
    if (ckptio__read_kernel_file(source ? source : THP_ENABLED_PATH, buf, sizeof buf) <= 0) return false;
    return strstr(buf, "[always]") != NULL || strstr(buf, "[madvise]") != NULL;
}
