/*
 * dcp_dir_helpers.h - what the tests of DCP checkpoint directories through
 * the C API share (test_dcp_dir.c, test_dcp_hostile.c): the engine, the
 * fixtures of tests/data/dcp/ and copies of them to alter.
 */
#ifndef CKPTIO_TEST_DCP_DIR_HELPERS_H
#define CKPTIO_TEST_DCP_DIR_HELPERS_H

#include "helpers.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static ckptio_engine *engine;

static inline const char *data_path(const char *name) { return t_data_path("dcp", name); }

/* Copies fixture directory `name` into the test's temporary directory. */
static inline const char *copy_fixture(const char *name, const char *as) {
    static char dst[1024];
    snprintf(dst, sizeof dst, "%s/%s", t_tmpdir(), as);
    T_ASSERT(mkdir(dst, 0755) == 0);
    const char *src = data_path(name);
    DIR *d = opendir(src);
    T_ASSERT(d != NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char from[1600], to[1600];
        snprintf(from, sizeof from, "%s/%s", src, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
        size_t len = 0;
        void *bytes = t_read_file(from, &len);
        t_write_file(to, bytes, len);
        free(bytes);
    }
    closedir(d);
    return dst;
}

static inline void replace_metadata(const char *dir, const char *bad) {
    size_t len = 0;
    void *bytes = t_read_file(data_path(bad), &len);
    char to[1200];
    snprintf(to, sizeof to, "%s/.metadata", dir);
    t_write_file(to, bytes, len);
    free(bytes);
}

#endif /* CKPTIO_TEST_DCP_DIR_HELPERS_H */
