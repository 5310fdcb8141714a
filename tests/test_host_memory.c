/*
 * test_host_memory.c - new host memory filled at once and the copies into it
 * (src/io/host_memory.c): buffers of their own, 2 MiB-aligned and advised for
 * huge pages when asked (4 KiB pages otherwise, the same bytes), freed alone;
 * the guard through the THP and buddyinfo test hook; copies on one or two
 * threads, cut anywhere, bit for bit; bad arguments refused.
 */
#include "helpers.h"
#include "io_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

static void write_text(const char *path, const char *text) { t_write_file(path, text, strlen(text)); }

static void test_buffers_of_their_own(void) {
    const size_t sizes[] = {1, 4095, 2 * MIB - 1, 2 * MIB, 2 * MIB + 5, 5 * MIB};
    for (int huge = 0; huge <= 1; huge++) {
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            const size_t n = sizes[i];
            void *p = NULL;
            T_OK(ckptio_host_alloc(n, huge, &p));
            T_ASSERT(p);
            /* Advised from 2 MiB of whole pages on (2 MiB - 1 byte takes 2 MiB of pages). */
            const size_t page = (size_t)sysconf(_SC_PAGESIZE);
            const bool advised = huge && (n + page - 1) / page * page >= 2 * MIB;
            if (advised) T_ASSERT_MSG(((uintptr_t)p & (2 * MIB - 1)) == 0, "%zu bytes at %p: not 2 MiB-aligned", n, p);
            const int flag = t_vm_flag(p, "hg");
            /* MADV_HUGEPAGE shows as VmFlag "hg" where the kernel has THP; never on a buffer not advised. */
            const bool thp = ckptio__huge_pages_advisable();
            T_ASSERT_MSG(advised && thp ? flag == 1 : flag != 1, "%zu bytes, huge %d: VmFlag hg %d", n, huge, flag);
            unsigned char *want = malloc(n);
            T_ASSERT(want);
            t_fill_random(want, n, n + (size_t)huge);
            const ckptio_copy c = {p, want, n};
            T_OK(ckptio_host_copy(&c, 1));
            T_ASSERT_MSG(memcmp(p, want, n) == 0, "%zu bytes, huge %d: the bytes differ", n, huge);
            free(want);
            ckptio_host_free(p, n);
            T_ASSERT_MSG(t_page_state(p) == -1, "%zu bytes, huge %d: still mapped after ckptio_host_free", n, huge);
        }
    }
}

static void test_freed_alone(void) {
    void *a = NULL, *b = NULL;
    T_OK(ckptio_host_alloc(3 * MIB, 1, &a));
    T_OK(ckptio_host_alloc(3 * MIB, 1, &b));
    memset(a, 1, 3 * MIB);
    memset(b, 2, 3 * MIB);
    ckptio_host_free(a, 3 * MIB);
    T_ASSERT(t_page_state(a) == -1);
    T_ASSERT(t_page_state(b) == 1 && t_page_state((unsigned char *)b + 3 * MIB - 1) == 1);
    T_ASSERT(((unsigned char *)b)[0] == 2 && ((unsigned char *)b)[3 * MIB - 1] == 2);
    ckptio_host_free(b, 3 * MIB);
    ckptio_host_free(NULL, 5); /* accepted */
}

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
    void *p = (void *)1;
    T_STATUS(ckptio_host_alloc(0, 1, &p), CKPTIO_E_INVAL);
    T_STATUS(ckptio_host_alloc(5, 0, NULL), CKPTIO_E_INVAL);
    T_STATUS(ckptio_host_alloc(SIZE_MAX - 10, 1, &p), CKPTIO_E_NOMEM);
    T_ASSERT(p == NULL);
    unsigned char byte = 0;
    const ckptio_copy bad[] = {{&byte, &byte, 1}, {NULL, &byte, 1}};
    T_STATUS(ckptio_host_copy(bad, 2), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("copy 1");
    T_STATUS(ckptio_host_copy(NULL, 1), CKPTIO_E_INVAL);
}

static void test_guard(void) {
    const char *thp = t_path("enabled"), *buddy = t_path("buddyinfo");
    /* 4 blocks of 4 MiB free (order 10 of 4 KiB pages): 16 MiB. */
    write_text(buddy, "Node 0, zone   Normal      0      0      0      0      0      0      0      0      0      0"
                      "      4 \n");
    write_text(thp, "always [madvise] never\n");
    ckptio__huge_pages_set_sources(buddy, thp);
    if (sysconf(_SC_PAGESIZE) == 4096) {
        T_ASSERT(ckptio_host_huge_pages(8 * MIB) == 1);
        T_ASSERT(ckptio_host_huge_pages(8 * MIB + 1) == 0); /* twice what is asked must be free */
    }
    write_text(thp, "always madvise [never]\n");
    T_ASSERT(ckptio_host_huge_pages(1) == 0);
    ckptio__huge_pages_set_sources(buddy, t_path("no-such-file"));
    T_ASSERT(ckptio_host_huge_pages(1) == 0);
    ckptio__huge_pages_set_sources(NULL, NULL);
}

int main(void) {
    T_RUN(test_buffers_of_their_own);
    T_RUN(test_freed_alone);
    T_RUN(test_copies_cut_anywhere);
    T_RUN(test_bad_arguments);
    T_RUN(test_guard);
    return T_EXIT_PASS;
}
