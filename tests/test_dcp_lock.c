/*
 * test_dcp_lock.c - the DCP directory lock (ckptio_dcp_lock_acquire,
 * src/ckpt/dcp_lock.c) across processes: busy (E_BUSY naming the holder's
 * pid, at once or after a timeout), shared vs exclusive, the wait callback
 * and its cancel, a holder killed with SIGKILL, and a forked child that
 * does not keep its parent's lock alive.
 */
#include "dcp_commit_helpers.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- the lock --------------------------------------------------------------------------- */

/* Waits until `fd` reaches end of file (its writer closed or died). */
static void wait_closed(int fd) {
    char c;
    while (read(fd, &c, 1) > 0) {
    }
}

/* A child that takes the lock (shared or not) and holds it until its
 * release pipe closes or it is killed; returns its pid once it holds it.
 * With `fork_worker`, it then forks a worker of its own (a DataLoader
 * worker) and holds the lock until killed; the worker tries the lock,
 * answers 'b' when it finds it busy, and lives until the release pipe
 * closes. */
static pid_t holder(const char *dir, unsigned flags, bool fork_worker, int *release_fd) {
    int ready[2], release[2];
    T_ASSERT(pipe(ready) == 0 && pipe(release) == 0);
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(release[1]);
        ckptio_dcp_lock *lock = NULL;
        if (ckptio_dcp_lock_acquire(dir, NULL, flags, -1.0, NULL, NULL, &lock) != CKPTIO_OK) _exit(2);
        if (!fork_worker) {
            if (write(ready[1], "x", 1) != 1) _exit(3);
            wait_closed(release[0]);
            ckptio_dcp_lock_release(lock);
            _exit(0);
        }
        if (fork() == 0) {
            ckptio_dcp_lock *mine = NULL;
            const ckptio_status busy = ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &mine);
            ckptio_dcp_lock_release(lock); /* the parent's handle: frees it, unlocks nothing */
            if (write(ready[1], busy == CKPTIO_E_BUSY ? "b" : "f", 1) != 1) _exit(3);
            wait_closed(release[0]);
            _exit(0);
        }
        for (;;) pause();
    }
    close(ready[1]);
    close(release[0]);
    char c = 0;
    T_ASSERT(read(ready[0], &c, 1) == 1 && c != 'f');
    close(ready[0]);
    *release_fd = release[1];
    return pid;
}

static void reap(pid_t pid, int release_fd) {
    if (release_fd >= 0) close(release_fd);
    int status;
    T_ASSERT(waitpid(pid, &status, 0) == pid);
}

static int waits;
static int count_waits(double waited, void *user) {
    (void)waited;
    waits++;
    return user != NULL && waits >= 3; /* user set: cancel at the third check */
}

static void test_lock_busy_and_shared(void) {
    const char *dir = setup("lock");
    int rel;
    pid_t pid = holder(dir, 0, false, &rel);
    ckptio_dcp_lock *lock = NULL;
    /* At once: E_BUSY naming the holder. */
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock), CKPTIO_E_BUSY);
    char want[128];
    snprintf(want, sizeof want, "(lock .ckptio-dcp.lock, held by pid %d): this save wrote nothing", (int)pid);
    T_MESSAGE_HAS(want);
    T_ASSERT(strcmp(ckptio_last_error()->operation, "lock") == 0 && ckptio_last_error()->sys_errno == EWOULDBLOCK);
    /* Shared waits for an exclusive holder too; after a timeout, saying so. */
    const double t0 = ckptio__now();
    waits = 0;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0.3, count_waits, NULL, &lock),
             CKPTIO_E_BUSY);
    T_ASSERT(ckptio__now() - t0 >= 0.3 && waits >= 3);
    T_MESSAGE_HAS(") after waiting 0.3");
    /* The callback ends the wait. */
    waits = 0;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, -1.0, count_waits, &waits, &lock), CKPTIO_E_CANCELED);
    T_ASSERT(waits == 3 && lock == NULL);
    /* Waiting: succeeds once the holder lets go. */
    close(rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, -1.0, NULL, NULL, &lock));
    ckptio_dcp_lock_info info;
    T_OK(ckptio_dcp_lock_query(lock, &info));
    T_ASSERT(info.locked == 1);
    reap(pid, -1);
    T_OK(ckptio_dcp_lock_release(lock));
    T_OK(ckptio_dcp_lock_release(NULL));
    /* Shared beside shared; exclusive waits for both. */
    pid = holder(dir, CKPTIO_DCP_LOCK_SHARED, false, &rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0.0, NULL, NULL, &lock));
    ckptio_dcp_lock *excl = NULL;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &excl), CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_release(lock));
    reap(pid, rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &excl));
    T_OK(ckptio_dcp_lock_release(excl));
    /* The lock file stays (removing it would let two saves lock two inodes). */
    T_ASSERT(t_file_exists(in(dir, CKPTIO_DCP_LOCK_NAME)));
}

static void test_lock_dies_with_its_holder(void) {
    const char *dir = setup("lock-kill");
    int rel;
    /* SIGKILL: the kernel drops the flock with the holder. */
    pid_t pid = holder(dir, 0, false, &rel);
    ckptio_dcp_lock *lock = NULL;
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock), CKPTIO_E_BUSY);
    kill(pid, SIGKILL);
    reap(pid, rel);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock));
    T_OK(ckptio_dcp_lock_release(lock));

    /* A holder forks a worker (a DataLoader worker) and is then killed: the
     * worker lives on but closed its copy of the descriptor at the fork, so
     * the lock ends with the holder. The worker found it busy. */
    pid = holder(dir, 0, true, &rel);
    T_STATUS(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock), CKPTIO_E_BUSY);
    kill(pid, SIGKILL);
    reap(pid, -1);
    /* The worker still runs (its release pipe is open): yet the lock is free. */
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.0, NULL, NULL, &lock));
    T_OK(ckptio_dcp_lock_release(lock));
    close(rel);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    load_fixtures();
    T_RUN(test_lock_busy_and_shared);
    T_RUN(test_lock_dies_with_its_holder);
    free_fixtures();
    return T_EXIT_PASS;
}
