/*
 * steps_fixture.h - what the checkpoint manager's C tests share: roots under
 * the test's directory, paths inside a step, and a step's DCP files copied
 * from a real ckptio.dcp checkpoint (tests/data/dcp/sharded, with its
 * checksum manifest).
 */
#ifndef CKPTIO_TESTS_STEPS_FIXTURE_H
#define CKPTIO_TESTS_STEPS_FIXTURE_H

#include "helpers.h"

#include <stdio.h>
#include <stdlib.h>

static const char *const fixture_files[] = {
    ".metadata", ".ckptio-manifest-80b4e47c5ac9.json", "__0_80b4e47c5ac9_0.distcp", "__1_80b4e47c5ac9_0.distcp"};
#define NFIXTURE (sizeof fixture_files / sizeof *fixture_files)
#define DATA0 "__0_80b4e47c5ac9_0.distcp"

/* A new root's path (not created). */
static inline const char *new_root(void) {
    static char root[4096];
    static int counter;
    snprintf(root, sizeof root, "%s/root%d", t_tmpdir(), counter++);
    return root;
}

/* "ROOT/step_NNNNNNNN/NAME" in a rotating buffer (four at a time). */
static inline const char *step_file(const char *root, uint64_t step, const char *name) {
    static char path[4][8300];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%.4000s/step_%08llu/%.4000s", root, (unsigned long long)step, name);
    return p;
}

/* The fixture's files copied into the step's directory (which exists). */
static inline void copy_fixture(const char *root, uint64_t step) {
    for (size_t i = 0; i < NFIXTURE; i++) {
        size_t len = 0;
        void *data = t_read_file(t_data_path("dcp/sharded", fixture_files[i]), &len);
        t_write_file(step_file(root, step, fixture_files[i]), data, len);
        free(data);
    }
}

#endif /* CKPTIO_TESTS_STEPS_FIXTURE_H */
