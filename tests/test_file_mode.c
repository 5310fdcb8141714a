/*
 * test_file_mode.c - while an atomic save writes, its temporary is never
 * readable wider than the file it replaces (created with that file's bits,
 * which the umask may only narrow); the committed file keeps the mode, for
 * 0600 and for bits the umask would remove (0666); a new name gets
 * 0666 & ~umask; owner and group are taken when running as root.
 * Symlinks and the public ckptio_inherit_mode(): tests/test_save_mode.c.
 */
#include "helpers.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The path of the one temporary of `name` in the test directory. */
static char *temporary_of(const char *name) {
    char prefix[256];
    snprintf(prefix, sizeof prefix, ".%s.ckptio-tmp-", name);
    DIR *d = opendir(t_tmpdir());
    T_ASSERT(d != NULL);
    char *found = NULL;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        T_ASSERT_MSG(found == NULL, "two temporaries of %s", name);
        found = strdup(t_path(e->d_name));
    }
    closedir(d);
    T_ASSERT_MSG(found != NULL, "no temporary of %s", name);
    return found;
}

static mode_t mode_of(const char *path) {
    struct stat sb;
    T_ASSERT(lstat(path, &sb) == 0);
    return sb.st_mode & 07777;
}

/* Saves `name` (existing or not) and checks the temporary's and the
 * committed file's mode (want) and, with uid >= 0, owner and group. */
static void save_and_check(const char *name, mode_t want, long uid, long gid) {
    const char *path = t_path(name);
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f));
    char *tmp = temporary_of(name);
    T_ASSERT_MSG((mode_of(tmp) & ~want) == 0, "%s: temporary mode %o, wider than %o", name, (unsigned)mode_of(tmp),
                 (unsigned)want);
    struct stat sb;
    free(tmp);
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_ASSERT_MSG(mode_of(path) == want, "%s: mode %o, want %o", name, (unsigned)mode_of(path), (unsigned)want);
    if (uid >= 0) {
        T_ASSERT(stat(path, &sb) == 0);
        T_ASSERT((long)sb.st_uid == uid && (long)sb.st_gid == gid);
    }
    T_OK(ckptio_engine_destroy(e));
}

static void test_keeps_mode(void) {
    const mode_t mask = umask(022);
    const char *path = t_path("private.bin");
    t_write_file(path, "old", 3);
    T_ASSERT(chmod(path, 0600) == 0);
    save_and_check("private.bin", 0600, -1, -1);
    save_and_check("private.bin", 0600, -1, -1); /* and again */
    T_ASSERT(chmod(path, 0666) == 0);            /* wider than the umask allows a new file */
    save_and_check("private.bin", 0666, -1, -1);
    T_ASSERT(chmod(path, 04750) == 0); /* set-id bits are not copied */
    save_and_check("private.bin", 0750, -1, -1);
    unlink(path);
    save_and_check("new.bin", 0644, -1, -1); /* a new name: 0666 & ~umask */
    unlink(t_path("new.bin"));
    umask(mask);
}

static void test_keeps_owner(void) {
    if (geteuid() != 0) {
        printf("# owner: not root, skipped\n");
        return;
    }
    const char *path = t_path("theirs.bin");
    t_write_file(path, "old", 3);
    T_ASSERT(chown(path, 4321, 4322) == 0 && chmod(path, 0640) == 0);
    save_and_check("theirs.bin", 0640, 4321, 4322);
    unlink(path);
}

int main(void) {
    T_RUN(test_keeps_mode);
    T_RUN(test_keeps_owner);
    return 0;
}
