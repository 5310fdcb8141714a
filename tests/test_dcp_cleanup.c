/*
 * test_dcp_cleanup.c - step 4 of the DCP directory commit: which files of
 * older saves ckptio_dcp_stale_files lists and ckptio_dcp_remove_files
 * removes (src/ckpt/dcp_cleanup.c, dcp_names.c): torch's and ckptio's
 * names, temporaries (a live writer's kept), files a per-rank metadata
 * still references, unreadable metadata files (keep everything, say why),
 * the re-check of a list taken earlier, the committed metadata spared from
 * unpickling, and only regular files removed.
 */
#include "dcp_commit_helpers.h"

#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- what step 4 removes ----------------------------------------------------------- */

static void list_stale(const char *dir, const ckptio_dcp_committed *c, char *note, const char *want) {
    char **names = NULL, got[4096] = "";
    size_t n = 0;
    const char *const keep[] = {NEW_DATA, ".metadata", NEW_MANIFEST};
    T_OK(ckptio_dcp_stale_files(dir, keep, 3, c, &names, &n, note, 1024));
    for (size_t i = 0; i < n; i++) {
        strcat(got, i ? " " : "");
        strcat(got, names[i]);
    }
    ckptio_dcp_names_free(names, n);
    T_ASSERT_MSG(strcmp(got, want) == 0, "stale: got '%s', want '%s'", got, want);
}

static void test_stale_files(void) {
    const char *dir = setup("stale");
    put(dir, ".metadata", new_md, new_md_len);
    put(dir, NEW_MANIFEST, manifest_text, manifest_len);
    /* Names DCP writers give, unreferenced: listed. */
    put(dir, "__1_0123456789ab_0.distcp", "x", 1);
    put(dir, "__1_0123456789ab_0.distcp.ckptio-manifest.json", "{}", 2);
    put(dir, ".ckptio-manifest-0123456789ab.json", "{}", 2);
    put(dir, ".metadata.tmp", "x", 1);
    put(dir, "__2.metadata.tmp", "x", 1);
    /* Not a DCP name: never touched. */
    put(dir, "notes.txt", "x", 1);
    put(dir, "__x_0.distcp", "x", 1);
    /* Referenced by a per-rank metadata file: kept. */
    put(dir, "__3.metadata", old_md, old_md_len);
    char note[1024];
    const ckptio_dcp_committed c = committed();
    list_stale(dir, &c, note,
               ".ckptio-manifest-0123456789ab.json .metadata.tmp __1_0123456789ab_0.distcp "
               "__1_0123456789ab_0.distcp.ckptio-manifest.json __2.metadata.tmp");
    T_ASSERT(note[0] == '\0');
    /* Temporaries: listed; a live writer's survives the removal. */
    int live = -1, dead = -1;
    char live_path[1024], dead_path[1024];
    T_OK(ckptio_temporary_create(dir, "other.bin", NULL, &live, live_path, sizeof live_path));
    T_OK(ckptio_temporary_create(dir, ".metadata", NULL, &dead, dead_path, sizeof dead_path));
    close(dead);
    char **names = NULL;
    size_t n = 0, removed = 0;
    const char *const keep[] = {NEW_DATA, ".metadata", NEW_MANIFEST};
    T_OK(ckptio_dcp_stale_files(dir, keep, 3, &c, &names, &n, note, sizeof note));
    T_ASSERT(n == 7);
    T_OK(ckptio_dcp_remove_files(dir, (const char *const *)names, n, CKPTIO_DCP_SYNC, &c, &removed, note,
                                 sizeof note));
    ckptio_dcp_names_free(names, n);
    T_ASSERT_MSG(removed == 6 && t_file_exists(live_path) && !t_file_exists(dead_path), "removed %zu", removed);
    close(live);
    T_ASSERT(t_file_exists(in(dir, OLD_DATA)) && t_file_exists(in(dir, "notes.txt")) &&
             t_file_exists(in(dir, "__x_0.distcp")));
    /* The per-rank metadata gone, its data file is stale too; so is the
     * temporary whose writer closed it. */
    T_ASSERT(unlink(in(dir, "__3.metadata")) == 0);
    char want[1200];
    snprintf(want, sizeof want, "%s " OLD_DATA, strrchr(live_path, '/') + 1);
    list_stale(dir, &c, note, want);
}

/* A metadata file the cleanup cannot read might reference anything: only
 * temporaries are listed, and the note says which file and why. */
static void test_unreadable_metadata_keeps_everything(void) {
    static const struct {
        const char *name, *why;
    } cases[] = {{"__7.metadata", "cannot be read ("}, {"__8.metadata", "(a symlink)"},
                 {"__9.metadata", "(not a regular file)"}};
    const ckptio_dcp_committed c = committed();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *dir = setup("unreadable");
        put(dir, ".metadata", new_md, new_md_len);
        if (i == 0) put(dir, cases[i].name, "not a pickle", 12);
        if (i == 1) T_ASSERT(symlink(".metadata", in(dir, cases[i].name)) == 0);
        if (i == 2) T_ASSERT(mkfifo(in(dir, cases[i].name), 0600) == 0); /* never opened blocking */
        int fd = -1;
        char tmp[1024], note[1024];
        T_OK(ckptio_temporary_create(dir, "x", NULL, &fd, tmp, sizeof tmp));
        close(fd);
        list_stale(dir, &c, note, strrchr(tmp, '/') + 1);
        T_ASSERT_MSG(strstr(note, cases[i].name) && strstr(note, cases[i].why) && strstr(note, "keeping the files") &&
                         strstr(note, "the new checkpoint is committed"),
                     "note: %s", note);
        if (i == 2) unlink(in(dir, cases[i].name)); /* remove_dir unlinks only files it can */
        if (i == 1) unlink(in(dir, cases[i].name));
    }
}

/* The committed metadata is recognised by its bytes, unread: a planner's
 * classes that the restricted unpickler refuses do not stop the cleanup. */
static void test_committed_metadata_is_not_unpickled(void) {
    const char *dir = setup("committed");
    static const char ours[] = "pickled by a custom planner";
    put(dir, ".metadata", ours, sizeof ours);
    const ckptio_dcp_committed c = {".metadata", ours, sizeof ours, new_files, 1};
    char note[1024];
    list_stale(dir, &c, note, OLD_DATA);
    T_ASSERT(note[0] == '\0');
    /* Without it, that .metadata is unreadable: keep everything. */
    list_stale(dir, NULL, note, "");
    T_ASSERT(strstr(note, ".metadata cannot be read"));
}

/* A list taken at commit and removed later (cleanup="background") keeps
 * what a writer that reuses names (torch's, no lock) committed meanwhile. */
static void test_recheck_keeps_what_is_referenced_now(void) {
    const char *dir = setup("recheck");
    const char *const list[] = {OLD_DATA};
    size_t removed = 9;
    char note[1024];
    put(dir, ".metadata", old_md, old_md_len); /* torch's save of __0_0.distcp committed again */
    T_OK(ckptio_dcp_remove_files(dir, list, 1, CKPTIO_DCP_RECHECK, NULL, &removed, note, sizeof note));
    T_ASSERT(removed == 0 && t_file_exists(in(dir, OLD_DATA)));
    T_OK(ckptio_dcp_remove_files(dir, list, 1, 0, NULL, &removed, note, sizeof note));
    T_ASSERT(removed == 1 && !t_file_exists(in(dir, OLD_DATA)));
    /* A name that is gone already is no error. */
    T_OK(ckptio_dcp_remove_files(dir, list, 1, CKPTIO_DCP_SYNC, NULL, &removed, note, sizeof note));
    T_ASSERT(removed == 0);
}

/* Only regular files are removed: a symlink under a data file's name loses
 * nothing (neither the link nor its target), a directory or FIFO under such
 * a name stays, each is named in the note, and the commit succeeds. */
static void test_only_regular_files_are_removed(void) {
    const char *dir = setup("not_regular");
    const char *outside = t_path("not_regular_target.bin");
    t_write_file(outside, "precious", 8);
    T_ASSERT(symlink(outside, in(dir, "__5_0123456789ab_0.distcp")) == 0);
    T_ASSERT(mkdir(in(dir, "__6_0123456789ab_0.distcp"), 0755) == 0);
    put(dir, "__6_0123456789ab_0.distcp/inside", "x", 1);
    T_ASSERT(mkfifo(in(dir, ".ckptio-manifest-0123456789ab.json"), 0600) == 0);
    ckptio_dcp_commit_result r;
    T_OK(commit_with(dir, CKPTIO_DCP_SYNC | CKPTIO_DCP_CLEANUP, NULL, NULL, &r));
    T_ASSERT_MSG(strstr(r.note, "'__5_0123456789ab_0.distcp' alone: a symlink") &&
                     strstr(r.note, "'__6_0123456789ab_0.distcp' alone: a directory") &&
                     strstr(r.note, "'.ckptio-manifest-0123456789ab.json' alone: not a regular file"),
                 "note: %s", r.note);
    struct stat sb;
    T_ASSERT(lstat(in(dir, "__5_0123456789ab_0.distcp"), &sb) == 0 && S_ISLNK(sb.st_mode));
    T_ASSERT(same_file(outside, "precious", 8) && same_file(in(dir, "__6_0123456789ab_0.distcp/inside"), "x", 1));
    T_ASSERT(lstat(in(dir, ".ckptio-manifest-0123456789ab.json"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    T_ASSERT(!t_file_exists(in(dir, OLD_DATA)) && same_file(in(dir, ".metadata"), new_md, new_md_len));
    /* A list taken earlier that names them (the background removal): left alone too, no error. */
    const char *const list[] = {"__5_0123456789ab_0.distcp", "__6_0123456789ab_0.distcp"};
    size_t removed = 9;
    char note[1024];
    T_OK(ckptio_dcp_remove_files(dir, list, 2, CKPTIO_DCP_SYNC, NULL, &removed, note, sizeof note));
    T_ASSERT_MSG(removed == 0 && strstr(note, "a symlink") && strstr(note, "a directory"), "%zu: %s", removed, note);
    T_ASSERT(lstat(in(dir, "__5_0123456789ab_0.distcp"), &sb) == 0 && S_ISLNK(sb.st_mode));
    T_ASSERT(same_file(in(dir, "__6_0123456789ab_0.distcp/inside"), "x", 1));
    unlink(in(dir, "__5_0123456789ab_0.distcp"));
    unlink(in(dir, "__6_0123456789ab_0.distcp/inside"));
    rmdir(in(dir, "__6_0123456789ab_0.distcp"));
    unlink(in(dir, ".ckptio-manifest-0123456789ab.json"));
    unlink(outside);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    load_fixtures();
    T_RUN(test_stale_files);
    T_RUN(test_unreadable_metadata_keeps_everything);
    T_RUN(test_committed_metadata_is_not_unpickled);
    T_RUN(test_recheck_keeps_what_is_referenced_now);
    T_RUN(test_only_regular_files_are_removed);
    free_fixtures();
    return T_EXIT_PASS;
}
