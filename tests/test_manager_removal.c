/*
 * test_manager_removal.c - what the checkpoint manager may remove
 * (src/ckpt/steps_remove.c, steps_pin.c) and how two managers share a root
 * (src/ckpt/dcp_lock.c, CKPTIO_DCP_LOCK_QUEUED):
 *
 *  - step directories the manager did not begin (another writer's DCP
 *    checkpoint) are FOREIGN: clean, begin, retention and remove leave
 *    every byte of them;
 *  - a step holding anything the manager and the DCP writer do not make (a
 *    subdirectory, a symlink, a FIFO, another name) is left whole, and the
 *    message says so and names the entry;
 *  - a removal that fails half-way says what it removed and what is left,
 *    and leaves a step still recognisably the manager's (partial), also
 *    for a step saved without a begun mark;
 *  - a step removed while a check reads it is partial or gone, not damaged;
 *  - a pinned step is kept by retention and refused by remove;
 *  - a lock holder that releases and asks again at once never keeps a
 *    queued waiter out.
 */
#include "helpers.h"
#include "io_inject.h"
#include "io_internal.h"
#include "steps_fixture.h"
#include "steps_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static ckptio_engine *engine;

/* A new root, created. */
static const char *make_root(void) {
    const char *root = new_root();
    T_ASSERT(mkdir(root, 0777) == 0);
    return root;
}

/* A step the manager saved. */
static void save_step(const char *root, uint64_t step) {
    char dir[4096];
    T_OK(ckptio_steps_begin(root, step, dir, sizeof dir));
    copy_fixture(root, step);
    T_OK(ckptio_steps_commit(root, step));
}

/* A DCP checkpoint another writer put under a step's name: no marker, no begun mark. */
static void foreign_step(const char *root, uint64_t step) {
    T_ASSERT(mkdir(step_file(root, step, ""), 0777) == 0);
    copy_fixture(root, step);
}

/* Every entry of DIR (name, type, bytes) in one string, to compare before and after. */
static char *snapshot(const char *dir) {
    char *names[64];
    size_t n = 0, len = 0;
    DIR *d = opendir(dir);
    T_ASSERT(d != NULL);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
    closedir(d);
    for (size_t i = 0; i + 1 < n; i++) /* sorted, so the order of readdir does not matter */
        for (size_t j = i + 1; j < n; j++)
            if (strcmp(names[i], names[j]) > 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    char *out = calloc(1, 1);
    for (size_t i = 0; i < n; i++) {
        char path[8300];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat sb;
        T_ASSERT(lstat(path, &sb) == 0);
        size_t flen = 0;
        void *data = S_ISREG(sb.st_mode) ? t_read_file(path, &flen) : NULL;
        out = realloc(out, len + strlen(names[i]) + 32 + flen);
        len += (size_t)sprintf(out + len, "%s:%o:%zu:", names[i], (unsigned)(sb.st_mode & S_IFMT), flen);
        memcpy(out + len, data ? data : "", flen);
        len += flen;
        out[len] = '\0';
        free(data);
        free(names[i]);
    }
    return out;
}

static ckptio_step_info scan_one(const char *root, uint64_t step) {
    ckptio_step_info *steps = NULL, info = {0};
    size_t n = 0;
    bool found = false;
    T_OK(ckptio_steps_scan(root, &steps, &n));
    for (size_t i = 0; i < n; i++)
        if (steps[i].step == step) info = steps[i], found = true;
    ckptio_steps_free(steps);
    T_ASSERT_MSG(found, "step %llu not in the scan", (unsigned long long)step);
    return info;
}

static bool has(const char *text, const char *needle) { return strstr(text, needle) != NULL; }

/* ---- other writers' steps ---------------------------------------------------------------- */

static void test_foreign_steps_survive(void) {
    const char *root = make_root();
    save_step(root, 10);
    save_step(root, 20);
    foreign_step(root, 100);
    foreign_step(root, 200);
    char *before100 = snapshot(step_file(root, 100, "")), *before200 = snapshot(step_file(root, 200, ""));

    ckptio_step_info info = scan_one(root, 100);
    T_ASSERT(info.state == CKPTIO_STEP_FOREIGN && info.files == NFIXTURE);
    T_ASSERT_MSG(has(info.reason, "not started by this manager") && has(info.reason, "DCP checkpoint"), "%s",
                 info.reason);
    /* clean, begin of another step, retention: nothing of them goes. */
    uint64_t *removed = NULL;
    size_t n = 9;
    T_OK(ckptio_steps_clean(root, &removed, &n));
    T_ASSERT(n == 0);
    ckptio_steps_list_free(removed);
    save_step(root, 300);
    T_OK(ckptio_steps_retain(engine, root, 1, 0, &removed, &n));
    T_ASSERT(n == 2 && removed[0] == 10 && removed[1] == 20);
    ckptio_steps_list_free(removed);
    /* begin of their number refuses, saying why; remove refuses. */
    char dir[4096];
    T_STATUS(ckptio_steps_begin(root, 100, dir, sizeof dir), CKPTIO_E_EXISTS);
    T_MESSAGE_HAS("not the manager's");
    T_STATUS(ckptio_steps_remove(root, 200), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("not the manager's step");
    T_MESSAGE_HAS("nothing is removed");
    /* Resume never picks them: the newest complete step is 300; with 300 gone, none. */
    uint64_t step = 0;
    ckptio_step_info *skipped = NULL;
    T_OK(ckptio_steps_remove(root, 300));
    T_STATUS(ckptio_steps_latest(engine, root, CKPTIO_STEP_CHECK_FULL, &step, &skipped, &n), CKPTIO_E_NOT_FOUND);
    T_ASSERT(n == 2 && skipped[0].step == 200 && skipped[0].state == CKPTIO_STEP_FOREIGN);
    ckptio_steps_free(skipped);
    char *after100 = snapshot(step_file(root, 100, "")), *after200 = snapshot(step_file(root, 200, ""));
    T_ASSERT(strcmp(before100, after100) == 0 && strcmp(before200, after200) == 0);
    free(before100), free(before200), free(after100), free(after200);

    /* A directory of neither kind that holds only files of DCP names and no .metadata: foreign too. */
    T_ASSERT(mkdir(step_file(root, 400, ""), 0777) == 0);
    t_write_file(step_file(root, 400, "__0_0.distcp"), "data", 4);
    T_ASSERT(scan_one(root, 400).state == CKPTIO_STEP_FOREIGN);
    T_OK(ckptio_steps_clean(root, NULL, NULL));
    T_ASSERT(t_file_exists(step_file(root, 400, "__0_0.distcp")));
}

/* ---- what removal refuses ------------------------------------------------------------------ */

typedef enum alien_kind { SUBDIR, OTHER_NAME, SYMLINK, FIFO } alien_kind;

/* Puts an entry of `kind` into the step; returns its name and what the message calls it. */
static const char *plant(const char *root, uint64_t step, alien_kind kind, const char **why) {
    const char *path;
    switch (kind) {
    case SUBDIR:
        path = step_file(root, step, "zz-sub");
        T_ASSERT(mkdir(path, 0777) == 0);
        t_write_file(step_file(root, step, "zz-sub/kept.txt"), "kept", 4);
        *why = "a directory";
        return "zz-sub";
    case OTHER_NAME:
        t_write_file(step_file(root, step, "notes.txt"), "notes", 5);
        *why = "a name neither the manager nor the DCP writer gives a file";
        return "notes.txt";
    case SYMLINK:
        t_write_file(t_path("outside.txt"), "outside", 7);
        T_ASSERT(symlink(t_path("outside.txt"), step_file(root, step, "__0_0.distcp")) == 0);
        *why = "a symlink";
        return "__0_0.distcp";
    case FIFO:
        T_ASSERT(mkfifo(step_file(root, step, "__9_9.distcp"), 0600) == 0);
        *why = "not a regular file";
        return "__9_9.distcp";
    }
    return NULL;
}

static void test_removal_leaves_whole(void) {
    for (int kind = SUBDIR; kind <= FIFO; kind++) {
        /* A partial step (a crashed save) holding the entry: clean and remove leave every byte. */
        const char *root = make_root();
        save_step(root, 5);
        char dir[4096];
        T_OK(ckptio_steps_begin(root, 10, dir, sizeof dir));
        copy_fixture(root, 10);
        const char *why = NULL, *name = plant(root, 10, (alien_kind)kind, &why);
        char *before = snapshot(dir);
        uint64_t *removed = NULL;
        size_t n = 9;
        T_OK(ckptio_steps_clean(root, &removed, &n));
        T_ASSERT_MSG(n == 0, "kind %d: clean removed %zu steps", kind, n);
        ckptio_steps_list_free(removed);
        ckptio_step_info info = scan_one(root, 10);
        T_ASSERT(info.state == CKPTIO_STEP_PARTIAL);
        T_ASSERT_MSG(has(info.reason, name) && has(info.reason, why) && has(info.reason, "leaves this step whole"),
                     "kind %d: %s", kind, info.reason);
        T_STATUS(ckptio_steps_remove(root, 10), CKPTIO_E_UNSUPPORTED);
        T_MESSAGE_HAS(name);
        T_MESSAGE_HAS(why);
        T_MESSAGE_HAS("nothing in the step is removed");
        /* begin of that number refuses it, saying why. */
        T_STATUS(ckptio_steps_begin(root, 10, dir, sizeof dir), CKPTIO_E_EXISTS);
        T_MESSAGE_HAS("removal leaves whole");
        char *after = snapshot(step_file(root, 10, ""));
        T_ASSERT_MSG(strcmp(before, after) == 0, "kind %d: the step changed", kind);
        free(before);
        free(after);
        if (kind == SUBDIR) T_ASSERT(t_file_exists(step_file(root, 10, "zz-sub/kept.txt")));
        if (kind == SYMLINK) T_ASSERT(t_file_exists(t_path("outside.txt")));

        /* A complete step holding it: retention keeps it, and it still loads. */
        const char *r2 = make_root();
        save_step(r2, 10);
        name = plant(r2, 10, (alien_kind)kind, &why);
        save_step(r2, 20);
        save_step(r2, 30);
        T_OK(ckptio_steps_retain(engine, r2, 1, 0, &removed, &n));
        T_ASSERT_MSG(n == 1 && removed[0] == 20, "kind %d: retention removed %zu", kind, n);
        ckptio_steps_list_free(removed);
        info = scan_one(r2, 10);
        T_ASSERT(info.state == CKPTIO_STEP_COMPLETE && has(info.reason, name));
        ckptio_step_info full;
        T_OK(ckptio_steps_check(engine, r2, 10, CKPTIO_STEP_CHECK_FULL, &full));
        T_ASSERT(full.state == CKPTIO_STEP_COMPLETE);
    }
}

/* ---- a removal that stops half-way ---------------------------------------------------------- */

static void test_removal_failing_half_way(void) {
    /* The third unlink fails: the marker and one data file are gone. */
    const char *root = make_root();
    save_step(root, 10);
    ckptio__io_inject(CKPTIO__IO_UNLINK, 3, EIO, 0, false);
    const ckptio_status st = ckptio_steps_remove(root, 10);
    ckptio__io_inject_reset();
    T_STATUS(st, CKPTIO_E_IO);
    T_MESSAGE_HAS("step 10 (");
    T_MESSAGE_HAS("the marker and 1 of 4 files removed; 3 files, the begun mark and the directory left");
    T_ASSERT(scan_one(root, 10).state == CKPTIO_STEP_PARTIAL);
    T_ASSERT(t_file_exists(step_file(root, 10, CKPTIO_STEP_BEGUN)));
    uint64_t *removed = NULL;
    size_t n = 0;
    T_OK(ckptio_steps_clean(root, &removed, &n));
    T_ASSERT(n == 1 && removed[0] == 10 && !t_file_exists(step_file(root, 10, "")));
    ckptio_steps_list_free(removed);

    /* A step saved without a begun mark (an earlier release): the mark is made before the marker goes,
     * so a removal stopped half-way leaves a partial step, not one that looks like another writer's. */
    save_step(root, 20);
    T_ASSERT(unlink(step_file(root, 20, CKPTIO_STEP_BEGUN)) == 0);
    T_ASSERT(scan_one(root, 20).state == CKPTIO_STEP_COMPLETE);
    ckptio__io_inject(CKPTIO__IO_UNLINK, 2, EIO, 0, false);
    T_STATUS(ckptio_steps_remove(root, 20), CKPTIO_E_IO);
    ckptio__io_inject_reset();
    T_ASSERT(scan_one(root, 20).state == CKPTIO_STEP_PARTIAL);
    T_OK(ckptio_steps_clean(root, NULL, &n));
    T_ASSERT(n == 1 && !t_file_exists(step_file(root, 20, "")));
    /* And without a fault, such a step goes whole. */
    save_step(root, 30);
    T_ASSERT(unlink(step_file(root, 30, CKPTIO_STEP_BEGUN)) == 0);
    T_OK(ckptio_steps_remove(root, 30));
    T_ASSERT(!t_file_exists(step_file(root, 30, "")));
    /* A step that is not there: nothing to remove, said so. */
    T_STATUS(ckptio_steps_remove(root, 40), CKPTIO_E_NOT_FOUND);
}

/* ---- a removal while a check reads ---------------------------------------------------------- */

/* What the open hook does at the check's first open of .metadata (to hash
 * it), after the marker's: another process's removal takes the marker (and
 * with `whole` the directory) away, and that open fails. Each file is opened
 * by the checked open (open_regular.c) in two opens, O_PATH and the reopen
 * for reading, so that is the third open. */
static struct {
    const char *root;
    uint64_t step;
    bool whole;
    atomic_int opens;
} removal_at_read;

static bool remove_during_read(ckptio__io_kind kind, int *err, uint64_t *len) {
    (void)len;
    if (kind != CKPTIO__IO_OPEN || atomic_fetch_add(&removal_at_read.opens, 1) != 2) return false;
    T_ASSERT(unlink(step_file(removal_at_read.root, removal_at_read.step, CKPTIO_STEP_MARKER)) == 0);
    if (removal_at_read.whole) {
        char dir[4200], moved[4300];
        snprintf(dir, sizeof dir, "%.4000s/step_%08llu", removal_at_read.root,
                 (unsigned long long)removal_at_read.step);
        snprintf(moved, sizeof moved, "%s.gone", dir);
        T_ASSERT(rename(dir, moved) == 0);
    }
    *err = EIO;
    return true;
}

static void test_removal_during_a_check(void) {
    /* A FULL check whose step is removed while it reads: not damage, but partial or gone. */
    const char *root = make_root();
    save_step(root, 10);
    save_step(root, 20);
    removal_at_read.root = root;
    removal_at_read.step = 20;
    ckptio__io_set_fault_hook(remove_during_read);
    ckptio_step_info info;
    const ckptio_status st = ckptio_steps_check(engine, root, 20, CKPTIO_STEP_CHECK_FULL, &info);
    ckptio__io_set_fault_hook(NULL);
    T_OK(st);
    T_ASSERT(atomic_load(&removal_at_read.opens) > 2);
    T_ASSERT_MSG(info.state == CKPTIO_STEP_PARTIAL && has(info.reason, "removed while it was checked"), "%d: %s",
                 (int)info.state, info.reason);
    removal_at_read.step = 10;
    removal_at_read.whole = true;
    atomic_store(&removal_at_read.opens, 0);
    ckptio__io_set_fault_hook(remove_during_read);
    const ckptio_status gone = ckptio_steps_check(engine, root, 10, CKPTIO_STEP_CHECK_FULL, &info);
    ckptio__io_set_fault_hook(NULL);
    T_STATUS(gone, CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("removed while it was checked");
}

/* ---- pins ----------------------------------------------------------------------------------- */

static void test_pins(void) {
    const char *root = make_root();
    for (uint64_t s = 10; s <= 30; s += 10) save_step(root, s);
    ckptio_step_pin *pin = NULL, *other = NULL;
    T_OK(ckptio_steps_pin(root, 10, &pin));
    T_OK(ckptio_steps_pin(root, 10, &other)); /* readers share */
    uint64_t *removed = NULL;
    size_t n = 0;
    T_OK(ckptio_steps_retain(engine, root, 1, 0, &removed, &n));
    T_ASSERT(n == 1 && removed[0] == 20); /* 10 is read: kept this time */
    ckptio_steps_list_free(removed);
    T_ASSERT(scan_one(root, 10).state == CKPTIO_STEP_COMPLETE);
    T_STATUS(ckptio_steps_remove(root, 10), CKPTIO_E_BUSY);
    T_MESSAGE_HAS("a reader holds step 10");
    ckptio_steps_unpin(pin);
    T_STATUS(ckptio_steps_remove(root, 10), CKPTIO_E_BUSY);
    ckptio_steps_unpin(other);
    T_OK(ckptio_steps_retain(engine, root, 1, 0, &removed, &n));
    T_ASSERT(n == 1 && removed[0] == 10);
    ckptio_steps_list_free(removed);
    ckptio_steps_unpin(NULL);

    /* No step, no marker, a removal holding the marker, a FIFO under its name: refused, nothing blocks. */
    T_STATUS(ckptio_steps_pin(root, 10, &pin), CKPTIO_E_NOT_FOUND);
    T_ASSERT(pin == NULL);
    char dir[4096];
    T_OK(ckptio_steps_begin(root, 40, dir, sizeof dir));
    T_STATUS(ckptio_steps_pin(root, 40, &pin), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("no commit marker");
    const int fd = open(step_file(root, 30, CKPTIO_STEP_MARKER), O_RDONLY);
    T_ASSERT(fd >= 0 && flock(fd, LOCK_EX) == 0);
    T_STATUS(ckptio_steps_pin(root, 30, &pin), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("a removal holds it");
    close(fd);
    T_OK(ckptio_steps_pin(root, 30, &pin));
    ckptio_steps_unpin(pin);
    T_ASSERT(mkfifo(step_file(root, 40, CKPTIO_STEP_MARKER), 0600) == 0);
    T_STATUS(ckptio_steps_pin(root, 40, &pin), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("not a regular file");
    T_MESSAGE_HAS("the commit marker is a FIFO"); /* the checked open names the type, never opening it */
}

/* ---- two holders of one root ---------------------------------------------------------------- */

typedef struct looper {
    const char *root;
    atomic_bool stop;
    atomic_int held;
} looper;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) { nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = ms * 1000000L}, NULL); }

/* A manager saving in a loop: the lock taken again right after each release. */
static void *hold_in_a_loop(void *arg) {
    looper *l = arg;
    while (!atomic_load(&l->stop)) {
        ckptio_dcp_lock *lock = NULL;
        if (ckptio_dcp_lock_acquire(l->root, NULL, CKPTIO_DCP_LOCK_QUEUED, -1.0, NULL, NULL, &lock) != CKPTIO_OK)
            break;
        atomic_fetch_add(&l->held, 1);
        sleep_ms(5);
        ckptio_dcp_lock_release(lock);
    }
    return NULL;
}

static void test_queued_lock_takes_turns(void) {
    const char *root = make_root();
    looper l = {.root = root};
    pthread_t t;
    T_ASSERT(pthread_create(&t, NULL, hold_in_a_loop, &l) == 0);
    while (atomic_load(&l.held) < 3) sleep_ms(1);
    /* While the loop runs, a second holder gets the lock 20 times, each within a bounded wait. */
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        ckptio_dcp_lock *lock = NULL;
        const double t0 = now_s();
        T_OK(ckptio_dcp_lock_acquire(root, NULL, CKPTIO_DCP_LOCK_QUEUED, 10.0, NULL, NULL, &lock));
        const double waited = now_s() - t0;
        worst = waited > worst ? waited : worst;
        sleep_ms(5);
        ckptio_dcp_lock_release(lock);
    }
    const int loop_held = atomic_load(&l.held);
    /* Busy at once with timeout 0 while the loop holds it. */
    ckptio_dcp_lock *lock = NULL;
    ckptio_status st = CKPTIO_OK;
    for (int i = 0; i < 200 && st == CKPTIO_OK; i++) {
        st = ckptio_dcp_lock_acquire(root, NULL, CKPTIO_DCP_LOCK_QUEUED, 0.0, NULL, NULL, &lock);
        if (st == CKPTIO_OK) ckptio_dcp_lock_release(lock);
    }
    T_STATUS(st, CKPTIO_E_BUSY);
    T_MESSAGE_HAS("another save holds the directory");
    atomic_store(&l.stop, true);
    pthread_join(t, NULL);
    printf("# the loop held the lock %d times; the second holder's longest wait %.3f s\n", loop_held, worst);
    /* Each wait is one 5 ms hold of the loop and a poll; the bound leaves room for a loaded machine. */
    T_ASSERT_MSG(worst < 2.5, "a queued waiter waited %.3f s beside a holder in a loop", worst);
    T_ASSERT_MSG(loop_held >= 13, "the loop held the lock %d times", loop_held); /* it went on meanwhile */
    T_ASSERT(t_file_exists(t_path("")) && t_count_entries(root, CKPTIO_DCP_LOCK_QUEUE_NAME) == 1);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_foreign_steps_survive);
    T_RUN(test_removal_leaves_whole);
    T_RUN(test_removal_failing_half_way);
    T_RUN(test_removal_during_a_check);
    T_RUN(test_pins);
    T_RUN(test_queued_lock_takes_turns);
    ckptio_engine_destroy(engine);
    return T_EXIT_PASS;
}
