/*
 * test_host_copy.c - the copies a load from bytes runs (src/io/host_copy.c):
 * on one or two threads, cut anywhere, bit for bit; bad arguments refused.
 */
#include "helpers.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

/* Copies of 9 MiB in all (two threads), laid out so that the half falls
 * inside a copy or between two, with empty copies among them. */
static void test_copies_cut_anywhere(void) {
    const size_t layouts[][5] = {
        {9 * MIB, 0, 0, 0, 0},
        {3 * MIB, 0, 3 * MIB / 2, 3 * MIB, 3 * MIB / 2},
        {4 * MIB + 4 * MIB / 8, 4 * MIB + 4 * MIB / 8, 0, 7, 13},
        {1, 2, 9 * MIB, 3, 4},
        {5, 0, 0, 0, 0},
    };
    for (size_t l = 0; l < sizeof layouts / sizeof *layouts; l++) {
        size_t total = 0;
        for (int i = 0; i < 5; i++) total += layouts[l][i];
        unsigned char *src = malloc(total), *dst = malloc(total);
        T_ASSERT(src && dst);
        t_fill_random(src, total, 100 + l);
        memset(dst, 0xEE, total);
        /* The copies in reverse memory order: each lands where its source came from. */
        ckptio_copy copies[5];
        size_t off = total;
        for (int i = 0; i < 5; i++) {
            off -= layouts[l][i];
            copies[i] = (ckptio_copy){dst + off, src + off, layouts[l][i]};
        }
        T_OK(ckptio_host_copy(copies, 5));
        T_ASSERT_MSG(memcmp(src, dst, total) == 0, "layout %zu: the bytes differ", l);
        free(src);
        free(dst);
    }
    T_OK(ckptio_host_copy(NULL, 0));
}

static void test_bad_arguments(void) {
    unsigned char byte = 0;
    const ckptio_copy bad[] = {{&byte, &byte, 1}, {NULL, &byte, 1}};
    T_STATUS(ckptio_host_copy(bad, 2), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("copy 1");
    T_STATUS(ckptio_host_copy(NULL, 1), CKPTIO_E_INVAL);
}

int main(void) {
    T_RUN(test_copies_cut_anywhere);
    T_RUN(test_bad_arguments);
    return T_EXIT_PASS;
}
