/*
 * dcp_commit_helpers.h - what the tests of the DCP directory commit share
 * (test_dcp_commit.c, test_dcp_cleanup.c, test_dcp_lock.c): the fixtures,
 * a checkpoint stock torch wrote (tests/data/dcp/ts: .metadata,
 * __0_0.distcp) and one ckptio.dcp wrote (tests/data/dcp/zstd: its data
 * file, manifest and .metadata); a directory holding the old one with the
 * new data file committed (setup); the commit as ckptio.dcp's writer runs
 * it; and the checks of what a commit leaves.
 */
#ifndef CKPTIO_TEST_DCP_COMMIT_HELPERS_H
#define CKPTIO_TEST_DCP_COMMIT_HELPERS_H

#include "helpers.h"
#include "dcp_commit_internal.h"
#include "io_internal.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OLD_DATA "__0_0.distcp"
#define NEW_DATA "__0_ee16d53c3f1b_0.distcp"
#define NEW_MANIFEST ".ckptio-manifest-ee16d53c3f1b.json"

static ckptio_engine *engine;
static void *old_md, *new_md, *old_data, *new_data, *manifest_text;
static size_t old_md_len, new_md_len, old_data_len, new_data_len, manifest_len;

/* The items of the fixture's manifest, as the writer hands them over. */
enum { MAX_ITEMS = 16 };
static ckptio_dcp_manifest_item items[MAX_ITEMS];
static int64_t item_offsets[MAX_ITEMS][8];
static size_t nitems;
static json_t *manifest_json;

static inline const char *fixture(const char *rel) { return t_data_path("dcp", rel); }

static inline uint64_t hex64(const char *s) { return strtoull(s, NULL, 16); }

static inline void load_fixtures(void) {
    old_md = t_read_file(fixture("ts/.metadata"), &old_md_len);
    old_data = t_read_file(fixture("ts/" OLD_DATA), &old_data_len);
    new_md = t_read_file(fixture("zstd/.metadata"), &new_md_len);
    new_data = t_read_file(fixture("zstd/" NEW_DATA), &new_data_len);
    manifest_text = t_read_file(fixture("zstd/" NEW_MANIFEST), &manifest_len);
    json_error_t err;
    manifest_json = json_loadb(manifest_text, manifest_len, 0, &err);
    T_ASSERT(manifest_json != NULL);
    const json_t *list = json_object_get(manifest_json, "items");
    nitems = json_array_size(list);
    T_ASSERT(nitems > 0 && nitems <= MAX_ITEMS);
    for (size_t i = 0; i < nitems; i++) {
        const json_t *o = json_array_get(list, i), *off = json_object_get(o, "offset");
        ckptio_dcp_manifest_item *it = &items[i];
        it->fqn = json_string_value(json_object_get(o, "fqn"));
        it->file = json_string_value(json_object_get(o, "file"));
        it->data_offset = (uint64_t)json_integer_value(json_object_get(o, "data_offset"));
        it->nbytes = (uint64_t)json_integer_value(json_object_get(o, "nbytes"));
        it->hashed = json_is_string(json_object_get(o, "xxh3"));
        if (it->hashed) it->hash = hex64(json_string_value(json_object_get(o, "xxh3")));
        it->transforms = json_array_size(json_object_get(o, "transform")) ? CKPTIO_DCP_TRANSFORM_ZSTD : 0;
        if (json_is_array(off)) {
            it->ndim = (uint32_t)json_array_size(off);
            for (uint32_t d = 0; d < it->ndim; d++) item_offsets[i][d] = json_integer_value(json_array_get(off, d));
            it->offset = item_offsets[i];
        }
    }
}

/* ---- directories -------------------------------------------------------------------- */

static inline void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        T_ASSERT(unlink(p) == 0);
    }
    closedir(d);
    rmdir(dir);
}

static inline void put(const char *dir, const char *name, const void *data, size_t len) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    t_write_file(p, data, len);
}

static inline const char *in(const char *dir, const char *name) {
    static char buf[4][2048];
    static int slot;
    char *b = buf[slot++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

/* The old checkpoint, with step 1 of the new save done (its data file
 * committed under its new name). */
static inline const char *setup(const char *name) {
    const char *dir = t_path(name);
    remove_dir(dir);
    T_ASSERT(mkdir(dir, 0755) == 0);
    put(dir, ".metadata", old_md, old_md_len);
    put(dir, OLD_DATA, old_data, old_data_len);
    put(dir, NEW_DATA, new_data, new_data_len);
    return dir;
}

static inline bool same_file(const char *path, const void *want, size_t len) {
    if (!t_file_exists(path)) return false;
    size_t n = 0;
    void *got = t_read_file(path, &n);
    const bool same = n == len && memcmp(got, want, len) == 0;
    free(got);
    return same;
}

/* Sorted names of the entries of dir, joined by ' '. */
static inline const char *entries(const char *dir) {
    static char out[4096];
    char *names[64];
    int n = 0;
    DIR *d = opendir(dir);
    T_ASSERT(d != NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL && n < 64;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        strcat(out, i ? " " : "");
        strcat(out, names[i]);
        free(names[i]);
    }
    return out;
}

static inline int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* ---- the commit ---------------------------------------------------------------------- */

static const char *const new_files[] = {NEW_DATA};

static inline ckptio_dcp_committed committed(void) {
    return (ckptio_dcp_committed){".metadata", new_md, new_md_len, new_files, 1};
}

/* Steps 0 and 2-4 as ckptio.dcp's writer runs them: the lock, then
 * ckptio_dcp_commit() with `extra` flags; the first failure ends it (the lock
 * is released either way). */
static inline ckptio_status commit_with(const char *dir, unsigned flags, ckptio_dcp_commit_fn on_step, void *user,
                                 ckptio_dcp_commit_result *r) {
    ckptio_dcp_lock *lock = NULL;
    ckptio_status st = ckptio_dcp_lock_acquire(dir, ".metadata", 0, 0.0, NULL, NULL, &lock);
    const ckptio_dcp_commit_options o = {".metadata", new_md, new_md_len, new_files, 1, items, nitems,
                                         flags | CKPTIO_DCP_MANIFEST, on_step, user, NULL, 0};
    if (st == CKPTIO_OK) st = ckptio_dcp_commit(dir, &o, r);
    ckptio__error_saved *saved = ckptio__error_save();
    T_OK(ckptio_dcp_lock_release(lock));
    ckptio__error_restore(saved);
    return st;
}

static inline ckptio_status commit(const char *dir, unsigned flags) {
    ckptio_dcp_commit_result r;
    const ckptio_status st = commit_with(dir, flags | CKPTIO_DCP_CLEANUP, NULL, NULL, &r);
    if (st == CKPTIO_OK) T_ASSERT_MSG(r.note[0] == '\0' && !r.stale, "unexpected note: %s", r.note);
    return st;
}

/* The version under .metadata (0 old, 1 new), checked complete: its files
 * are there, the new one verifies against its manifest; no temporary is
 * left and nothing but the two checkpoints' files and the lock. */
static inline int check_state(const char *dir, const char *what) {
    const int v = same_file(in(dir, ".metadata"), new_md, new_md_len)   ? 1
                  : same_file(in(dir, ".metadata"), old_md, old_md_len) ? 0
                                                                         : -1;
    T_ASSERT_MSG(v >= 0, "%s: .metadata is neither version (%s)", what, entries(dir));
    T_ASSERT_MSG(t_count_entries(dir, CKPTIO__TMP_MARK) == 0, "%s: a temporary is left: %s", what, entries(dir));
    if (v == 0) T_ASSERT_MSG(same_file(in(dir, OLD_DATA), old_data, old_data_len), "%s: old data gone", what);
    if (v == 1) {
        T_ASSERT_MSG(same_file(in(dir, NEW_DATA), new_data, new_data_len), "%s: new data gone", what);
        ckptio_dcp *h = NULL;
        ckptio_dcp_verify_report r;
        T_OK(ckptio_dcp_open(engine, dir, &h));
        T_OK(ckptio_dcp_verify(h, &r));
        T_ASSERT(r.checked == r.items && r.items == nitems);
        ckptio_dcp_close(h);
    }
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        const char *n = e->d_name;
        T_ASSERT_MSG(!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, ".metadata") || !strcmp(n, OLD_DATA) ||
                         !strcmp(n, NEW_DATA) || !strcmp(n, NEW_MANIFEST) || !strcmp(n, CKPTIO_DCP_LOCK_NAME),
                     "%s: unexpected %s", what, n);
    }
    closedir(d);
    return v;
}

static inline void check_clean(const char *dir, const char *what) {
    T_ASSERT_MSG(check_state(dir, what) == 1, "%s: not the new checkpoint", what);
    T_ASSERT_MSG(strcmp(entries(dir), ".ckptio-dcp.lock .ckptio-manifest-ee16d53c3f1b.json .metadata " NEW_DATA) == 0,
                 "%s: %s", what, entries(dir));
}

/* Frees what load_fixtures read and the engine. */
static inline void free_fixtures(void) {
    json_decref(manifest_json);
    free(old_md);
    free(new_md);
    free(old_data);
    free(new_data);
    free(manifest_text);
    T_OK(ckptio_engine_destroy(engine));
}

#endif /* CKPTIO_TEST_DCP_COMMIT_HELPERS_H */
