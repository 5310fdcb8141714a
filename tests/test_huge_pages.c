/*
 * test_huge_pages.c - the guard for huge-page staging slots
 * (src/io/huge_pages.c): the /proc/buddyinfo parser on kernels' texts
 * (exact byte totals; malformed and cut-short lines count for nothing,
 * nothing is read past the text), the THP `enabled` file's modes, and both
 * readers through the test hook on files of this test's own.
 */
#include "helpers.h"
#include "io_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)

/* The parser on a heap copy of exactly strlen + 1 bytes: under ASan a read
 * past the text's end fails the test. */
static uint64_t parse(const char *text, size_t page_bytes, unsigned min_order) {
    const size_t n = strlen(text) + 1;
    char *copy = malloc(n);
    T_ASSERT(copy);
    memcpy(copy, text, n);
    const uint64_t bytes = ckptio__buddyinfo_free_bytes(copy, page_bytes, min_order);
    free(copy);
    return bytes;
}

#define EXPECT_BYTES(got, want)                                                                         \
    do {                                                                                                \
        const uint64_t g_ = (got), w_ = (want);                                                         \
        T_ASSERT_MSG(g_ == w_, "%s: %llu bytes, want %llu", #got, (unsigned long long)g_, (unsigned long long)w_); \
    } while (0)

/* Two nodes, DMA/DMA32/Normal, orders 0-10 (x86-64, 4 KiB pages), as the
 * kernel prints it ("%6lu " per order, a space before the newline). */
static const char two_nodes[] =
    "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3 \n"
    "Node 0, zone    DMA32      5      4      6      5      6      5      5      6      4      5    428 \n"
    "Node 0, zone   Normal   2197   1840   1122    815    534    263    118     51     27     14  14906 \n"
    "Node 1, zone   Normal   3011   2212   1509    902    478    225     96     40     19     11  15432 \n";

static void test_two_nodes_three_zones(void) {
    /* Order 9 (2 MiB) and 10 (4 MiB) of each zone. */
    const uint64_t order9 = 1 + 5 + 14 + 11, order10 = 3 + 428 + 14906 + 15432;
    EXPECT_BYTES(parse(two_nodes, 4096, 9), (order9 * 2 + order10 * 4) * MIB);
    EXPECT_BYTES(parse(two_nodes, 4096, 9), 123138 * MIB);
    EXPECT_BYTES(parse(two_nodes, 4096, 10), 123076 * MIB);
    /* Every order: count * 4 KiB << order. */
    const unsigned counts[4][11] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 3},
                                    {5, 4, 6, 5, 6, 5, 5, 6, 4, 5, 428},
                                    {2197, 1840, 1122, 815, 534, 263, 118, 51, 27, 14, 14906},
                                    {3011, 2212, 1509, 902, 478, 225, 96, 40, 19, 11, 15432}};
    uint64_t all = 0, from8 = 0;
    for (int z = 0; z < 4; z++)
        for (unsigned o = 0; o < 11; o++) {
            all += (uint64_t)counts[z][o] * (4096ull << o);
            if (o >= 8) from8 += (uint64_t)counts[z][o] * (4096ull << o);
        }
    EXPECT_BYTES(parse(two_nodes, 4096, 0), all);
    EXPECT_BYTES(parse(two_nodes, 4096, 8), from8);
    EXPECT_BYTES(parse(two_nodes, 4096, 11), 0); /* no order that high */
    /* 64 KiB pages: 2 MiB is order 5. */
    const char arm[] = "Node 0, zone   Normal     10      9      8      7      6      5      4      3 \n";
    EXPECT_BYTES(parse(arm, 65536, 5), 5 * 2 * MIB + 4 * 4 * MIB + 3 * 8 * MIB);
}

/* A kernel with more orders (MAX_ORDER raised, 13 of them): every order
 * counts. */
static void test_more_orders(void) {
    const char text[] =
        "Node 0, zone    DMA32      1      1      1      1      1      1      1      1      1      2"
        "      3      4      5 \n"
        "Node 0, zone   Normal      0      0      0      0      0      0      0      0      0      0"
        "      0      1      1 \n";
    EXPECT_BYTES(parse(text, 4096, 9), (2 * 2 + 3 * 4 + 4 * 8 + 5 * 16) * MIB + (8 + 16) * MIB);
    EXPECT_BYTES(parse(text, 4096, 12), (5 + 1) * 16 * MIB);
    /* Tabs between the columns, no space before the newline. */
    EXPECT_BYTES(parse("Node 3, zone\tNormal\t0\t0\t0\t0\t0\t0\t0\t0\t0\t7\t1\n", 4096, 9), (7 * 2 + 4) * MIB);
}

/* The file was longer than the buffer read: its last line ends without a
 * newline, and counts for nothing (its last count may be cut: "15432"
 * read as "15"). */
static void test_truncated_last_line(void) {
    char text[sizeof two_nodes];
    memcpy(text, two_nodes, sizeof two_nodes);
    char *cut = strstr(text, "15432");
    T_ASSERT(cut);
    cut[2] = '\0';
    const uint64_t first_three = (1 * 2 + 3 * 4 + 5 * 2 + 428 * 4 + 14 * 2 + 14906 * 4) * MIB;
    EXPECT_BYTES(parse(text, 4096, 9), first_three);
    /* Cut anywhere: never more than the whole, and every complete line counts. */
    const uint64_t whole = parse(two_nodes, 4096, 9);
    for (size_t n = 0; n <= strlen(two_nodes); n++) {
        char *part = malloc(n + 1);
        T_ASSERT(part);
        memcpy(part, two_nodes, n);
        part[n] = '\0';
        const uint64_t got = ckptio__buddyinfo_free_bytes(part, 4096, 9);
        free(part);
        const char *nl = NULL;
        for (size_t i = 0; i < n; i++)
            if (two_nodes[i] == '\n') nl = two_nodes + i;
        char *complete = strndup(two_nodes, nl ? (size_t)(nl - two_nodes) + 1 : 0);
        T_ASSERT(complete);
        const uint64_t want = parse(complete, 4096, 9);
        free(complete);
        T_ASSERT_MSG(got == want && got <= whole, "cut after %zu bytes: %llu, want %llu", n,
                     (unsigned long long)got, (unsigned long long)want);
    }
}

/* Lines of any other form count for nothing; the good lines among them do. */
static void test_garbage_lines(void) {
    const char text[] = "garbage\n"
                        "\n"
                        "Node\n"
                        "Node 0, zone\n"
                        "Node 0, zone   Normal\n"                        /* no counts */
                        "Node x, zone   Normal 0 0 0 0 0 0 0 0 0 100 100\n" /* no node number */
                        "Node 0 zone   Normal 0 0 0 0 0 0 0 0 0 100 100\n"  /* no comma */
                        "Node 0, zonk  Normal 0 0 0 0 0 0 0 0 0 100 100\n"
                        "Node 0, zone   Normal 0 0 0 0 0 0 0 0 0 10x 100\n" /* a bad count */
                        "Node 0, zone   Normal 0 0 0 0 0 0 0 0 0 -1 100\n"
                        "Node 0, zone   Normal 0 0 0 0 0 0 0 0 0 100 100 junk\n"
                        "Node 0, zone   Normal 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 "
                        "26 27 28 29 30 31 32 33\n" /* more orders than any kernel */
                        "Node 1, zone   Normal      0      0      0      0      0      0      0      0      0"
                        "      1      2 \n"
                        "Node 1, zone   Movable 0 0 0 0 0 0 0 0 0 0 1\r\n" /* \r: not the kernel's */
                        "\x01\xff\n";
    EXPECT_BYTES(parse(text, 4096, 9), (1 * 2 + 2 * 4) * MIB);
    /* Counts too big for 64 bits saturate rather than wrap. */
    EXPECT_BYTES(parse("Node 0, zone Normal 0 0 0 0 0 0 0 0 0 0 99999999999999999999999\n"
                       "Node 1, zone Normal 0 0 0 0 0 0 0 0 0 0 4398046511104\n",
                       4096, 9),
                 UINT64_MAX);
}

static void test_empty(void) {
    EXPECT_BYTES(parse("", 4096, 9), 0);
    EXPECT_BYTES(parse("\n\n", 4096, 9), 0);
    EXPECT_BYTES(ckptio__buddyinfo_free_bytes(NULL, 4096, 9), 0);
    EXPECT_BYTES(parse(two_nodes, 0, 9), 0);
}

static void write_text(const char *path, const char *text) { t_write_file(path, text, strlen(text)); }

static void test_thp_modes(void) {
    const char *path = t_path("enabled");
    const struct {
        const char *text;
        bool advisable;
    } modes[] = {
        {"always [madvise] never\n", true},
        {"[always] madvise never\n", true},
        {"always madvise [never]\n", false},
        {"always madvise never\n", false},
        {"", false},
    };
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        write_text(path, modes[i].text);
        ckptio__huge_pages_set_sources(NULL, path);
        T_ASSERT_MSG(ckptio__huge_pages_advisable() == modes[i].advisable, "THP enabled \"%s\": advisable %d",
                     modes[i].text, !modes[i].advisable);
    }
    ckptio__huge_pages_set_sources(NULL, t_path("no-such-file"));
    T_ASSERT_MSG(!ckptio__huge_pages_advisable(), "a kernel without THP (no file) is advisable");
    ckptio__huge_pages_set_sources(NULL, NULL);
}

static void test_free_bytes_from_a_file(void) {
    const long page = sysconf(_SC_PAGESIZE);
    T_ASSERT(page > 0);
    unsigned order2m = 0;
    while (((uint64_t)page << order2m) < 2 * MIB) order2m++;
    /* One line: 1000 blocks of each order below 2 MiB (not counted), 3 of
     * 2 MiB, 5 of 4 MiB. */
    char line[256];
    int n = snprintf(line, sizeof line, "Node 0, zone   Normal");
    for (unsigned o = 0; o <= order2m + 1; o++)
        n += snprintf(line + n, sizeof line - (size_t)n, " %6u", o < order2m ? 1000u : o == order2m ? 3u : 5u);
    n += snprintf(line + n, sizeof line - (size_t)n, " \n");
    const uint64_t per_line = 3 * 2 * MIB + 5 * 4 * MIB;
    const char *path = t_path("buddyinfo");
    write_text(path, line);
    ckptio__huge_pages_set_sources(path, NULL);
    EXPECT_BYTES(ckptio__huge_page_bytes_free(), per_line);
    /* A file longer than the 4096 bytes read: the lines read whole count. */
    char *big = malloc(100 * (size_t)n + 1);
    T_ASSERT(big);
    for (int i = 0; i < 100; i++) memcpy(big + (size_t)i * (size_t)n, line, (size_t)n);
    big[100 * (size_t)n] = '\0';
    write_text(path, big);
    free(big);
    EXPECT_BYTES(ckptio__huge_page_bytes_free(), (uint64_t)(4095 / n) * per_line);
    ckptio__huge_pages_set_sources(t_path("no-such-file"), NULL);
    EXPECT_BYTES(ckptio__huge_page_bytes_free(), 0);
    ckptio__huge_pages_set_sources(NULL, NULL);
    /* This host's own: at most its memory. */
    const long pages = sysconf(_SC_PHYS_PAGES);
    const uint64_t host = ckptio__huge_page_bytes_free();
    T_ASSERT_MSG(pages <= 0 || host <= (uint64_t)pages * (uint64_t)page, "%llu bytes free in 2 MiB blocks",
                 (unsigned long long)host);
    printf("# this host: %llu MiB free in blocks of 2 MiB and more, THP advisable: %d\n",
           (unsigned long long)(host / MIB), ckptio__huge_pages_advisable());
}

int main(void) {
    T_RUN(test_two_nodes_three_zones);
    T_RUN(test_more_orders);
    T_RUN(test_truncated_last_line);
    T_RUN(test_garbage_lines);
    T_RUN(test_empty);
    T_RUN(test_thp_modes);
    T_RUN(test_free_bytes_from_a_file);
    return T_EXIT_PASS;
}
