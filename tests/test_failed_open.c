/*
 * test_failed_open.c - an atomic save whose open fails after its temporary
 * was created (O_DIRECT refused with CKPTIO_OPT_DIRECT ON; a temporary's
 * name longer than the caller's buffer) removes that temporary while its
 * descriptors still hold its lock: once they are closed, a cleaner may take
 * the temporary for a dead save's and another save of the name its slot,
 * which a later unlink would remove.
 *
 * This program's unlink() stands in front of the C library's for the
 * library's calls (a definition in the program wins at link time). At the
 * moment the temporary is removed it checks that its writer still locks it
 * and, for the save, opens a second save of the same name there, as a
 * concurrent save would; that save's temporary must survive, and it commits
 * its bytes. No timing: the second save runs exactly in the gap.
 */
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

static bool armed;          /* the next removal of a temporary is the one under test */
static bool was_locked;     /* whether its writer still held its lock then */
static ckptio_engine *other_engine;
static const char *other_path; /* the concurrent save's name (NULL: none) */
static ckptio_file *other;  /* the concurrent save, opened at that moment */

int unlink(const char *path) {
    if (armed && strstr(path, ".ckptio-tmp-")) {
        armed = false;
        const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        was_locked = fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
        if (fd >= 0) close(fd);
        if (other_path) T_OK(ckptio_file_open(other_engine, other_path, CKPTIO_OPEN_WRITE, &other));
    }
    return (int)syscall(SYS_unlinkat, AT_FDCWD, path, 0);
}

static void expect_no_temporaries(void) {
    T_ASSERT_MSG(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0, "temporaries left in %s", t_tmpdir());
}

/* The save's open fails on its O_DIRECT descriptor after its temporary took
 * the name's first slot; a second save of the name opens in the instant the
 * temporary is removed. */
static void test_refused_direct_open_keeps_the_other_save(void) {
    const char *path = t_path("model.bin");
    ckptio_engine *e, *e2;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_ON));
    T_OK(ckptio_engine_create(&e2));
    ckptio__io_inject(CKPTIO__IO_OPEN_DIRECT, 1, EINVAL, 0, false);
    other_engine = e2;
    other_path = path;
    other = NULL;
    armed = true;
    ckptio_file *f = NULL;
    T_STATUS(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("O_DIRECT was refused");
    ckptio__io_inject_reset();
    T_ASSERT_MSG(!armed && other, "the failed open removed no temporary");
    T_ASSERT_MSG(was_locked, "the failed open's temporary was unlocked before it was removed");
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 1); /* the second save's, whole */
    static const char bytes[] = "the second save's bytes";
    T_OK(ckptio__file_io(other, CKPTIO_WRITE, (void *)bytes, sizeof bytes, 0));
    T_OK(ckptio_file_commit(other));
    T_OK(ckptio_file_close(other));
    size_t len = 0;
    char *got = t_read_file(path, &len);
    T_ASSERT(got && len == sizeof bytes && memcmp(got, bytes, len) == 0);
    free(got);
    expect_no_temporaries();
    T_ASSERT(unlink(path) == 0);
    T_OK(ckptio_engine_destroy(e));
    T_OK(ckptio_engine_destroy(e2));
}

/* ckptio_temporary_create with a buffer too small for the name it made:
 * E_RANGE, and the temporary removed while still locked. */
static void test_too_long_temporary_name_removed_locked(void) {
    other_path = NULL;
    armed = true;
    int fd = 0;
    char path[8];
    T_STATUS(ckptio_temporary_create(t_tmpdir(), "weights.bin", NULL, &fd, path, sizeof path), CKPTIO_E_RANGE);
    T_ASSERT(fd == -1);
    T_ASSERT_MSG(!armed, "the failed create removed no temporary");
    T_ASSERT_MSG(was_locked, "the temporary was unlocked before it was removed");
    expect_no_temporaries();
}

int main(void) {
    T_RUN(test_refused_direct_open_keeps_the_other_save);
    T_RUN(test_too_long_temporary_name_removed_locked);
    return 0;
}
