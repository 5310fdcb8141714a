/*
 * test_save_mode.c - a save keeps the permissions (and, where permitted,
 * owner and group) of the file it replaces, as torch.save and
 * safetensors.save_file do by rewriting in place; a new file gets
 * 0666 & ~umask.
 *
 * Every writer: ckptio_safetensors_save with its checksum manifest,
 * ckptio_torch_save_tensors, and ckptio_file_open(WRITE) + commit. The
 * manifest follows its data file. Set-id bits are not copied; a symlinked
 * NAME gives the mode of its target; as root, owner and group are copied;
 * a saver that may not chown (an unprivileged child) still gets the mode
 * and no error. ckptio_inherit_mode() is checked directly too.
 */
#include "helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static ckptio_engine *engine;
static unsigned char payload[3000];
static int64_t shape[1] = {3000};

enum writer { SAFETENSORS, TORCH, RAW, WRITERS };
static const char *const writer_names[WRITERS] = {"safetensors", "torch", "raw"};

static ckptio_status save_with(ckptio_engine *e, enum writer w, const char *path) {
    const ckptio_tensor_source src = {"w", CKPTIO_DTYPE_U8, 1, shape, payload, sizeof payload, CKPTIO_MEM_HOST};
    switch (w) {
    case SAFETENSORS: return ckptio_safetensors_save(e, path, &src, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS);
    case TORCH: return ckptio_torch_save_tensors(e, path, &src, 1, NULL);
    default: break;
    }
    ckptio_file *f;
    ckptio_status st = ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f);
    if (st != CKPTIO_OK) return st;
    st = ckptio_file_commit(f);
    const ckptio_status cst = ckptio_file_close(f);
    return st != CKPTIO_OK ? st : cst;
}

static void save(enum writer w, const char *path) { T_OK(save_with(engine, w, path)); }

static mode_t mode_of(const char *path) {
    struct stat sb;
    T_ASSERT_MSG(lstat(path, &sb) == 0, "%s: %s", path, strerror(errno));
    return sb.st_mode & 07777;
}

static const char *manifest_of(const char *path) {
    static char buf[1024];
    T_OK(ckptio_manifest_path(path, buf, sizeof buf));
    return buf;
}

static void expect_mode(enum writer w, const char *path, mode_t want) {
    T_ASSERT_MSG(mode_of(path) == want, "%s save: %s has mode %04o, expected %04o", writer_names[w], path,
                 (unsigned)mode_of(path), (unsigned)want);
    if (w == SAFETENSORS)
        T_ASSERT_MSG(mode_of(manifest_of(path)) == want, "manifest of %s has mode %04o, expected %04o", path,
                     (unsigned)mode_of(manifest_of(path)), (unsigned)want);
    T_ASSERT(t_count_entries(t_tmpdir(), ".ckptio-tmp-") == 0);
}

static void test_mode_of_replaced_file_kept(void) {
    static const mode_t modes[] = {0600, 0640, 0604, 0664, 0400};
    for (int w = 0; w < WRITERS; w++) {
        char name[64];
        snprintf(name, sizeof name, "kept.%s", writer_names[w]);
        const char *path = t_path(name);
        save((enum writer)w, path);
        for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
            T_ASSERT(chmod(path, modes[i]) == 0);
            /* An old manifest with wider permissions does not leak into
             * the new one: the manifest follows its data. */
            if (w == SAFETENSORS) T_ASSERT(chmod(manifest_of(path), 0666) == 0);
            save((enum writer)w, path);
            expect_mode((enum writer)w, path, modes[i]);
            save((enum writer)w, path); /* and again: stays */
            expect_mode((enum writer)w, path, modes[i]);
        }
    }
}

static void test_new_file_follows_umask(void) {
    static const mode_t masks[] = {022, 027, 077, 002};
    const mode_t old = umask(0);
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        umask(masks[i]);
        for (int w = 0; w < WRITERS; w++) {
            char name[64];
            snprintf(name, sizeof name, "new%zu.%s", i, writer_names[w]);
            save((enum writer)w, t_path(name));
            expect_mode((enum writer)w, t_path(name), 0666 & ~masks[i]);
        }
    }
    umask(old);
}

static void test_special_bits_and_symlinks(void) {
    /* Set-id and sticky bits: a checkpoint is data, they are not copied. */
    const char *path = t_path("setid.safetensors");
    save(SAFETENSORS, path);
    T_ASSERT(chmod(path, 06755 | S_ISVTX) == 0);
    save(SAFETENSORS, path);
    expect_mode(SAFETENSORS, path, 0755);
    /* NAME a symlink: replaced by a regular file with its target's mode. */
    const char *target = t_path("target.pt"), *link_path = t_path("link.pt");
    save(TORCH, target);
    T_ASSERT(chmod(target, 0600) == 0 && symlink("target.pt", link_path) == 0);
    save(TORCH, link_path);
    struct stat sb;
    T_ASSERT(lstat(link_path, &sb) == 0 && S_ISREG(sb.st_mode) && (sb.st_mode & 0777) == 0600);
    T_ASSERT(mode_of(target) == 0600);
    /* A dangling symlink: nothing to inherit, the new file's default. */
    const char *dangling = t_path("dangling.pt");
    T_ASSERT(symlink("nowhere", dangling) == 0);
    const mode_t mask = umask(022);
    save(TORCH, dangling);
    umask(mask);
    T_ASSERT(mode_of(dangling) == 0644);
    /* EXCLUSIVE creates: nothing replaced, the default. */
    const char *excl = t_path("excl.bin");
    ckptio_file *f;
    T_OK(ckptio_file_open(engine, excl, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_EXCLUSIVE, &f));
    T_OK(ckptio_file_commit(f));
    T_OK(ckptio_file_close(f));
    T_ASSERT(mode_of(excl) == (0666 & ~mask));
}

static void test_inherit_mode_api(void) {
    const char *a = t_path("api.a"), *b = t_path("api.b");
    t_write_file(a, "a", 1);
    T_ASSERT(chmod(a, 0640) == 0);
    int fd = open(b, O_RDWR | O_CREAT | O_EXCL, 0666);
    T_ASSERT(fd >= 0 && fchmod(fd, 0666) == 0);
    T_OK(ckptio_inherit_mode(fd, a));
    T_ASSERT(mode_of(b) == 0640);
    /* Nothing to inherit from: a missing path, a directory. */
    T_ASSERT(fchmod(fd, 0666) == 0);
    T_OK(ckptio_inherit_mode(fd, t_path("missing")));
    T_OK(ckptio_inherit_mode(fd, t_tmpdir()));
    T_ASSERT(mode_of(b) == 0666);
    T_STATUS(ckptio_inherit_mode(-1, a), CKPTIO_E_INVAL);
    T_STATUS(ckptio_inherit_mode(fd, NULL), CKPTIO_E_INVAL);
    close(fd);
}

/* Owner and group: copied as root; an unprivileged saver keeps its own
 * (EPERM is not an error) and still gets the mode. */
static void test_owner(void) {
    if (geteuid() != 0) {
        printf("# not root: owner copying is not observable here, skipped\n");
        return;
    }
    for (int w = 0; w < WRITERS; w++) {
        char name[64];
        snprintf(name, sizeof name, "owned.%s", writer_names[w]);
        const char *path = t_path(name);
        save((enum writer)w, path);
        T_ASSERT(chown(path, 1234, 5678) == 0 && chmod(path, 0640) == 0);
        save((enum writer)w, path);
        struct stat sb;
        T_ASSERT(stat(path, &sb) == 0 && sb.st_uid == 1234 && sb.st_gid == 5678 && (sb.st_mode & 07777) == 0640);
        if (w == SAFETENSORS) {
            T_ASSERT(stat(manifest_of(path), &sb) == 0 && sb.st_uid == 1234 && sb.st_gid == 5678);
        }
    }
    /* An unprivileged saver (uid/gid 65534) replaces a root-owned 0640 file
     * in a directory it may write: fchown is refused, silently; the mode is
     * kept, the file is the saver's. */
    T_ASSERT(chmod(t_tmpdir(), 0755) == 0);
    const char *dir = t_path("shared");
    T_ASSERT(mkdir(dir, 0777) == 0 && chmod(dir, 0777) == 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    save(SAFETENSORS, path);
    T_ASSERT(chmod(path, 0640) == 0);
    fflush(stdout);
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
        ckptio_engine *e;
        if (ckptio_engine_create(&e) != CKPTIO_OK) _exit(4);
        const ckptio_status st = save_with(e, SAFETENSORS, path);
        if (st != CKPTIO_OK) {
            fprintf(stderr, "%s\n", ckptio_last_error_message());
            _exit(5);
        }
        ckptio_engine_destroy(e);
        _exit(0);
    }
    int ws;
    T_ASSERT(waitpid(pid, &ws, 0) == pid);
    T_ASSERT_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the unprivileged save failed (status 0x%x)", ws);
    struct stat sb;
    T_ASSERT(stat(path, &sb) == 0 && sb.st_uid == 65534 && sb.st_gid == 65534 && (sb.st_mode & 07777) == 0640);
    T_ASSERT(stat(manifest_of(path), &sb) == 0 && sb.st_uid == 65534 && (sb.st_mode & 07777) == 0640);
}

int main(void) {
    t_fill_random(payload, sizeof payload, 7);
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_mode_of_replaced_file_kept);
    T_RUN(test_new_file_follows_umask);
    T_RUN(test_special_bits_and_symlinks);
    T_RUN(test_inherit_mode_api);
    T_RUN(test_owner);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
