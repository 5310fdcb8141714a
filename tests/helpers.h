/*
 * helpers.h - t_ helpers shared by the C test programs.
 *
 * Each test is its own program: exit 0 = pass, 1 = fail, 77 = skip
 * (ctest's SKIP_RETURN_CODE). A failing check prints file:line and the
 * library's last error, then exits 1.
 */
#ifndef CKPTIO_TEST_HELPERS_H
#define CKPTIO_TEST_HELPERS_H

/* With CKPTIO_EXPERIMENTAL (set by the build): the experimental headers are tested as the core is. */
#include "ckptio.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define T_EXIT_PASS 0
#define T_EXIT_FAIL 1
#define T_EXIT_SKIP 77

void t_fail_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
void t_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Check a condition; on failure print the expression and exit 1. */
#define T_ASSERT(cond)                                                  \
    do {                                                                \
        if (!(cond)) t_fail_at(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)

#define T_ASSERT_MSG(cond, ...)                                   \
    do {                                                          \
        if (!(cond)) t_fail_at(__FILE__, __LINE__, __VA_ARGS__);  \
    } while (0)

/* Expect a ckptio call to succeed; on failure print its error message. */
#define T_OK(expr)                                                                            \
    do {                                                                                      \
        ckptio_status t_st_ = (expr);                                                         \
        if (t_st_ != CKPTIO_OK)                                                               \
            t_fail_at(__FILE__, __LINE__, "%s returned %s: %s", #expr, ckptio_status_name(t_st_), \
                      ckptio_last_error_message());                                          \
    } while (0)

/* Expect a ckptio call to fail with `want`. */
#define T_STATUS(expr, want)                                                                  \
    do {                                                                                      \
        ckptio_status t_st_ = (expr);                                                         \
        if (t_st_ != (want))                                                                  \
            t_fail_at(__FILE__, __LINE__, "%s returned %s, expected %s (message: %s)", #expr,  \
                      ckptio_status_name(t_st_), ckptio_status_name(want),                    \
                      t_st_ == CKPTIO_OK ? "-" : ckptio_last_error_message());               \
    } while (0)

/* Expect the last error message to contain `needle`. */
#define T_MESSAGE_HAS(needle) t_message_has(__FILE__, __LINE__, (needle))
void t_message_has(const char *file, int line, const char *needle);

/* A fresh temporary directory for this test (removed at exit unless
 * CKPTIO_TEST_KEEP is set). Returned string is static. */
const char *t_tmpdir(void);

/* Joins t_tmpdir() and name into a static rotating buffer. */
const char *t_path(const char *name);

/* $CKPTIO_TEST_DATA/SUB/NAME (tests/data without it: ctest sets it), in a
 * static rotating buffer. */
const char *t_data_path(const char *sub, const char *name);

/* Deterministic pseudo-random bytes (xorshift, seeded). */
void t_fill_random(void *buf, size_t len, uint64_t seed);

/* Read/write a whole file with plain stdio (independent of ckptio). */
void *t_read_file(const char *path, size_t *len);
void t_write_file(const char *path, const void *data, size_t len);
bool t_file_exists(const char *path);

/* Unsets every environment variable whose name starts with `prefix`, except
 * those starting with `keep` (NULL: none). */
void t_unsetenv_prefix(const char *prefix, const char *keep);

/* A child process opens an atomic write of `path` (its temporary made and
 * locked) and is killed with SIGKILL: what a killed save leaves behind. */
void t_killed_save(const char *path);

/* Count directory entries whose name contains `needle` (e.g. temporaries). */
int t_count_entries(const char *dir, const char *needle);

/* The page holding p: 1 in memory, 0 mapped but not in memory, -1 not mapped
 * (mincore). */
int t_page_state(const void *p);

/* Whether the mapping holding p carries VmFlag `flag` ("dc", "hg", ...) in
 * /proc/self/smaps: 1 yes, 0 no, -1 no such mapping or no smaps. */
int t_vm_flag(const void *p, const char *flag);

/* Runs this test program again as `self ARG` (a case that must run in a
 * process of its own) and returns its exit code, or -1 when it did not
 * exit normally. */
int t_run_self(const char *self, const char *arg);

/* Run a named test case: prints "ok NAME" or exits on failure. */
#define T_RUN(fn)                              \
    do {                                       \
        fn();                                  \
        printf("ok %s\n", #fn);                \
        fflush(stdout);                        \
    } while (0)

#endif
