/*
 * test_env_check.c - ckptio_env_check(): CKPTIO_* variables ckptio does not
 * read are reported, with the closest known name where one is close.
 */
#include "helpers.h"

#include <stdlib.h>
#include <string.h>

/* Starts from an environment without CKPTIO_* names. */
static void clear_ckptio_env(void) { t_unsetenv_prefix("CKPTIO_", NULL); }

static void check(const char *var, const char *want_line) {
    clear_ckptio_env();
    setenv(var, "4", 1);
    char msg[512];
    size_t unknown = 99;
    T_OK(ckptio_env_check(msg, sizeof msg, &unknown));
    if (!want_line) {
        T_ASSERT_MSG(unknown == 0 && msg[0] == '\0', "%s reported: %s", var, msg);
        return;
    }
    T_ASSERT_MSG(unknown == 1, "%s: %zu unknown", var, unknown);
    T_ASSERT_MSG(strcmp(msg, want_line) == 0, "%s: got \"%s\", want \"%s\"", var, msg, want_line);
}

static void test_typos_name_the_setting(void) {
    check("CKPTIO_THREDS", "CKPTIO_THREDS is not a ckptio setting: did you mean CKPTIO_THREADS?\n");
    check("CKPTIO_threads", "CKPTIO_threads is not a ckptio setting: did you mean CKPTIO_THREADS?\n");
    check("CKPTIO_DIERCT", "CKPTIO_DIERCT is not a ckptio setting: did you mean CKPTIO_DIRECT?\n");
    check("CKPTIO_DIRECT_MIN", "CKPTIO_DIRECT_MIN is not a ckptio setting: did you mean CKPTIO_DIRECT_MIN_BYTES?\n");
    check("CKPTIO_READCACHE", "CKPTIO_READCACHE is not a ckptio setting: did you mean CKPTIO_READ_CACHE?\n");
    check("CKPTIO_CUDA_LIBARY", "CKPTIO_CUDA_LIBARY is not a ckptio setting: did you mean CKPTIO_CUDA_LIBRARY?\n");
    check("CKPTIO_FROBNICATE",
          "CKPTIO_FROBNICATE is not a ckptio setting (docs/ENGINE.md lists them: CKPTIO_THREADS, CKPTIO_DIRECT, "
          "...)\n");
}

static void test_known_names_are_quiet(void) {
    const char *known[] = {"CKPTIO_THREADS", "CKPTIO_READ_CACHE", "CKPTIO_GPU_PATH", "CKPTIO_NVTX",
                           "CKPTIO_GPU_HUGE_SLOTS", "CKPTIO_CUDA_LIBRARY", "CKPTIO_CUFILE_LIBRARY",
                           "CKPTIO_NO_PROGRESS", "CKPTIONAL", "ckptio_threads"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++) check(known[i], NULL);
}

/* Tests and benchmarks name their variables CKPTIO_TEST_*: never reported,
 * whatever follows the prefix, while a name merely like it is, and so is a
 * misspelt setting beside them. */
static void test_test_prefix_is_never_reported(void) {
    const char *quiet[] = {"CKPTIO_TEST_DATA", "CKPTIO_TEST_BUILD_DIR", "CKPTIO_TEST_SOAK_SECONDS",
                           "CKPTIO_TEST_THREDS", "CKPTIO_TEST_"};
    for (size_t i = 0; i < sizeof quiet / sizeof *quiet; i++) check(quiet[i], NULL);
    check("CKPTIO_TESTS_DATA",
          "CKPTIO_TESTS_DATA is not a ckptio setting (docs/ENGINE.md lists them: CKPTIO_THREADS, CKPTIO_DIRECT, "
          "...)\n");
    check("CKPTIO_TEST", "CKPTIO_TEST is not a ckptio setting (docs/ENGINE.md lists them: CKPTIO_THREADS, "
                         "CKPTIO_DIRECT, ...)\n");
    clear_ckptio_env();
    setenv("CKPTIO_TEST_SOAK_SECONDS", "5", 1);
    setenv("CKPTIO_THREDS", "4", 1);
    char msg[512];
    size_t unknown = 0;
    T_OK(ckptio_env_check(msg, sizeof msg, &unknown));
    const char *want = "CKPTIO_THREDS is not a ckptio setting: did you mean CKPTIO_THREADS?\n";
    T_ASSERT_MSG(unknown == 1 && strcmp(msg, want) == 0, "%zu: %s", unknown, msg);
    clear_ckptio_env();
}

/* Variables ckptio no longer reads, and test variables outside the prefix,
 * are reported like any other unknown name. */
static void test_names_ckptio_does_not_read_are_reported(void) {
    const char *unknown[] = {"CKPTIO_GPU_MAP_WORKERS", "CKPTIO_GPU_READ_SLOTS", "CKPTIO_GPU_PACK", "CKPTIO_SCATTER",
                             "CKPTIO_SOAK_SECONDS", "CKPTIO_PINNED", "CKPTIO_BUILD_DIR"};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        clear_ckptio_env();
        setenv(unknown[i], "1", 1);
        char msg[512];
        size_t n = 0;
        T_OK(ckptio_env_check(msg, sizeof msg, &n));
        T_ASSERT_MSG(n == 1 && strncmp(msg, unknown[i], strlen(unknown[i])) == 0 &&
                         strstr(msg, " is not a ckptio setting"),
                     "%s: %zu reported: %s", unknown[i], n, msg);
    }
    clear_ckptio_env();
}

static void test_several_and_truncation(void) {
    clear_ckptio_env();
    setenv("CKPTIO_THREDS", "4", 1);
    setenv("CKPTIO_SYNCH", "0", 1);
    setenv("CKPTIO_BACKEND", "pread", 1);
    size_t unknown = 0;
    T_OK(ckptio_env_check(NULL, 0, &unknown)); /* count only */
    T_ASSERT(unknown == 2);
    char msg[512];
    T_OK(ckptio_env_check(msg, sizeof msg, &unknown));
    T_ASSERT(unknown == 2);
    T_ASSERT(strstr(msg, "CKPTIO_THREDS is not a ckptio setting: did you mean CKPTIO_THREADS?\n"));
    T_ASSERT(strstr(msg, "CKPTIO_SYNCH is not a ckptio setting: did you mean CKPTIO_SYNC?\n"));
    char small[10];
    memset(small, 'x', sizeof small);
    T_OK(ckptio_env_check(small, sizeof small, &unknown));
    T_ASSERT(unknown == 2 && strlen(small) == sizeof small - 1);
    T_STATUS(ckptio_env_check(NULL, 5, &unknown), CKPTIO_E_INVAL);
    T_STATUS(ckptio_env_check(msg, sizeof msg, NULL), CKPTIO_E_INVAL);
    /* An unknown variable never stops an engine. */
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_destroy(e));
    clear_ckptio_env();
}

int main(void) {
    T_RUN(test_typos_name_the_setting);
    T_RUN(test_known_names_are_quiet);
    T_RUN(test_test_prefix_is_never_reported);
    T_RUN(test_names_ckptio_does_not_read_are_reported);
    T_RUN(test_several_and_truncation);
    return T_EXIT_PASS;
}
