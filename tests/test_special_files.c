/*
 * test_special_files.c - what a checkpoint's names may hold instead of a
 * regular file, signals, and descriptors:
 *  - the one open of a checkpoint's files (src/io/open_regular.c) refuses a
 *    FIFO, a socket, a directory, a device (also behind a symlink) and, with
 *    O_NOFOLLOW, a symlink, at once and naming the type; what it opens is
 *    blocking; ckptio_file_open and ckptio_format_detect follow it;
 *  - EINTR is retried until ckptio_interrupt() asks the library to stop,
 *    then it is the failure (E_CANCELED); transfers and saves cancel too;
 *  - a released file reopens the same inode, or refuses what replaced it;
 *  - a model of more shards than its window opens and reads under a
 *    descriptor limit far below its shard count.
 * An alarm turns a hang into a failure.
 */
#include "helpers.h"
#include "io_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void make_socket(const char *path) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    T_ASSERT(strlen(path) < sizeof a.sun_path);
    strcpy(a.sun_path, path);
    const int s = socket(AF_UNIX, SOCK_STREAM, 0);
    T_ASSERT(s >= 0);
    T_ASSERT(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    close(s); /* the socket file stays */
}

/* Every kind of file under a name: refused at once with its type, a
 * regular file opened blocking. */
static void test_open_regular(void) {
    const char *reg = t_path("regular"), *fifo = t_path("fifo"), *sock = t_path("sock"), *dir = t_path("dir"),
               *dev = t_path("zero"), *to_fifo = t_path("to_fifo"), *to_reg = t_path("to_regular");
    t_write_file(reg, "abc", 3);
    T_ASSERT(mkfifo(fifo, 0600) == 0);
    make_socket(sock);
    T_ASSERT(mkdir(dir, 0700) == 0);
    T_ASSERT(symlink("/dev/zero", dev) == 0);
    T_ASSERT(symlink("fifo", to_fifo) == 0);
    T_ASSERT(symlink("regular", to_reg) == 0);
    const struct {
        const char *path;
        int flags;
        mode_t type;
        const char *name;
    } cases[] = {
        {fifo, O_RDONLY, S_IFIFO, "a FIFO"},           {fifo, O_RDWR, S_IFIFO, "a FIFO"},
        {to_fifo, O_RDONLY, S_IFIFO, "a FIFO"},        {sock, O_RDONLY, S_IFSOCK, "a socket"},
        {dir, O_RDONLY, S_IFDIR, "a directory"},       {dev, O_RDONLY, S_IFCHR, "a character device"},
        {dev, O_RDWR, S_IFCHR, "a character device"},  {to_reg, O_RDONLY | O_NOFOLLOW, S_IFLNK, "a symlink"},
        {to_fifo, O_RDONLY | O_NOFOLLOW, S_IFLNK, "a symlink"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct stat sb;
        mode_t type = 1;
        const double t0 = now();
        errno = 0;
        T_ASSERT(ckptio__open_regular(AT_FDCWD, cases[i].path, cases[i].flags, &sb, &type) == -1);
        T_ASSERT_MSG(type == cases[i].type, "%s: type %o, expected %o", cases[i].path, (unsigned)type,
                     (unsigned)cases[i].type);
        T_ASSERT(errno == (type == S_IFLNK ? ELOOP : type == S_IFDIR ? EISDIR : EINVAL));
        T_ASSERT(now() - t0 < 5.0);
        int fd = 7;
        T_STATUS(ckptio__open_regular_or_fail(cases[i].path, cases[i].flags, CKPTIO_E_FORMAT, "reading X", &fd, NULL),
                 CKPTIO_E_FORMAT);
        T_ASSERT(fd == -1);
        char want[512];
        snprintf(want, sizeof want, "%s: open: is %s, not a regular file: refused without opening it (reading X)",
                 cases[i].path, cases[i].name);
        T_MESSAGE_HAS(want);
    }
    /* A regular file, directly or through a symlink: opened, blocking. */
    for (int k = 0; k < 2; k++) {
        struct stat sb;
        mode_t type = 1;
        const int fd = ckptio__open_regular(AT_FDCWD, k ? to_reg : reg, O_RDONLY, &sb, &type);
        T_ASSERT(fd >= 0 && type == 0 && S_ISREG(sb.st_mode) && sb.st_size == 3);
        T_ASSERT((fcntl(fd, F_GETFL) & (O_NONBLOCK | O_ACCMODE)) == O_RDONLY);
        T_ASSERT((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
        char buf[4] = {0};
        T_ASSERT(read(fd, buf, sizeof buf) == 3 && memcmp(buf, "abc", 3) == 0);
        close(fd);
    }
    mode_t type = 1;
    struct stat sb;
    T_ASSERT(ckptio__open_regular(AT_FDCWD, t_path("missing"), O_RDONLY, &sb, &type) == -1 && errno == ENOENT &&
             type == 0);
    /* Relative to a directory (the temporaries' scan). */
    const int dfd = open(t_tmpdir(), O_RDONLY | O_DIRECTORY);
    T_ASSERT(ckptio__open_regular(dfd, "fifo", O_RDONLY | O_NOFOLLOW, &sb, &type) == -1 && type == S_IFIFO);
    const int fd = ckptio__open_regular(dfd, "regular", O_RDONLY | O_NOFOLLOW, &sb, &type);
    T_ASSERT(fd >= 0);
    close(fd);
    close(dfd);

    /* The public opens follow the rule. */
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    ckptio_file *f = NULL;
    const unsigned modes[] = {CKPTIO_OPEN_READ, CKPTIO_OPEN_WRITE | CKPTIO_OPEN_IN_PLACE};
    for (size_t m = 0; m < 2; m++) {
        T_STATUS(ckptio_file_open(e, fifo, modes[m], &f), CKPTIO_E_INVAL);
        T_MESSAGE_HAS("is a FIFO, not a regular file");
        T_STATUS(ckptio_file_open(e, dev, modes[m], &f), CKPTIO_E_INVAL);
        T_MESSAGE_HAS("is a character device, not a regular file");
    }
    ckptio_format format;
    T_STATUS(ckptio_format_detect(dev, &format), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("is a character device, not a regular file or a directory");
    T_STATUS(ckptio_format_detect(sock, &format), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("is a socket");
    T_OK(ckptio_format_detect(dir, &format));
    T_ASSERT(format == CKPTIO_FORMAT_DIRECTORY);
    /* A FIFO named like a stale temporary is left alone, never waited on. */
    T_ASSERT(mkfifo(t_path(".x.bin.ckptio-tmp-AAAAAA"), 0600) == 0);
    ckptio_cleanup_report r;
    T_OK(ckptio_cleanup_temporaries(t_tmpdir(), NULL, 0, &r));
    T_ASSERT(r.removed == 0 && r.ignored >= 1);
    T_ASSERT(t_file_exists(t_path(".x.bin.ckptio-tmp-AAAAAA")));
    T_OK(ckptio_engine_destroy(e));
}

/* ---- EINTR and ckptio_interrupt --------------------------------------------- */

static void on_usr1(int sig) { (void)sig; }

typedef struct opener {
    const char *path;
    _Atomic int done;
    int fd, err;
} opener;

static void *open_blocking(void *arg) {
    opener *o = arg;
    o->fd = ckptio__open(o->path, O_RDONLY | O_CLOEXEC, 0); /* a FIFO without a writer: waits */
    o->err = errno;
    atomic_store(&o->done, 1);
    return NULL;
}

static bool finished_within(opener *o, double seconds) {
    for (const double t0 = now(); now() - t0 < seconds;) {
        if (atomic_load(&o->done)) return true;
        usleep(1000);
    }
    return atomic_load(&o->done) != 0;
}

/* A signal (a handler without SA_RESTART) is retried through until the
 * program asks the library to stop; then the call fails with EINTR. */
static void test_eintr_rule(void) {
    struct sigaction sa = {.sa_handler = on_usr1}, old;
    sigemptyset(&sa.sa_mask);
    T_ASSERT(sigaction(SIGUSR1, &sa, &old) == 0);
    opener o = {.path = t_path("wait_fifo"), .fd = -2};
    T_ASSERT(mkfifo(o.path, 0600) == 0);
    pthread_t t;
    T_ASSERT(pthread_create(&t, NULL, open_blocking, &o) == 0);
    T_ASSERT(!finished_within(&o, 0.1));
    pthread_kill(t, SIGUSR1);
    T_ASSERT_MSG(!finished_within(&o, 0.3), "an interrupted open was not retried (fd %d, errno %d)", o.fd, o.err);
    T_OK(ckptio_interrupt(1));
    const double t0 = now();
    pthread_kill(t, SIGUSR1);
    T_ASSERT_MSG(finished_within(&o, 10.0), "the open went on after ckptio_interrupt(1)");
    T_ASSERT(o.fd == -1 && o.err == EINTR);
    T_ASSERT(now() - t0 < 10.0);
    pthread_join(t, NULL);
    T_OK(ckptio_interrupt(0));
    T_ASSERT(ckptio__status_from_errno(EINTR) == CKPTIO_E_CANCELED);
    sigaction(SIGUSR1, &old, NULL);
}

/* With ckptio_interrupt(1) transfers cancel before a byte moves: a save
 * leaves the older file and no temporary; withdrawn, they work again. */
static void test_interrupt_cancels(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("old.safetensors");
    static float old_data[1024], new_data[1 << 20];
    for (size_t i = 0; i < 1024; i++) old_data[i] = (float)i;
    const int64_t old_shape[] = {1024}, new_shape[] = {1 << 20};
    const ckptio_tensor_source old_t = {.name = "w", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = old_shape,
                                        .data = old_data, .nbytes = sizeof old_data, .mem_kind = CKPTIO_MEM_HOST};
    const ckptio_tensor_source new_t = {.name = "w", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = new_shape,
                                        .data = new_data, .nbytes = sizeof new_data, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_save(e, path, &old_t, 1, NULL, 0, 0));
    size_t before_len = 0;
    void *before = t_read_file(path, &before_len);
    T_OK(ckptio_interrupt(1));
    T_STATUS(ckptio_safetensors_save(e, path, &new_t, 1, NULL, 0, 0), CKPTIO_E_CANCELED);
    T_MESSAGE_HAS("interrupted");
    size_t after_len = 0;
    void *after = t_read_file(path, &after_len);
    T_ASSERT(after_len == before_len && memcmp(before, after, before_len) == 0);
    T_ASSERT(t_count_entries(t_tmpdir(), "old.safetensors.ckptio-tmp") == 0);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    char head[8];
    T_STATUS(ckptio__file_io(f, CKPTIO_READ, head, sizeof head, 0), CKPTIO_E_CANCELED);
    T_OK(ckptio_interrupt(0));
    T_OK(ckptio__file_io(f, CKPTIO_READ, head, sizeof head, 0));
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_safetensors_save(e, path, &new_t, 1, NULL, 0, 0));
    free(before);
    free(after);
    T_OK(ckptio_engine_destroy(e));
}

/* ---- descriptors ---------------------------------------------------------------- */

static int open_descriptors(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

/* A released file reopens the very inode it checked, or refuses. */
static void test_release_and_reacquire(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("data.bin"), *other = t_path("other.bin");
    t_write_file(path, "0123456789", 10);
    t_write_file(other, "abcdefghij", 10);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    const int open_before = open_descriptors();
    ckptio__file_release(f);
    T_ASSERT(!ckptio__file_is_open(f) && open_descriptors() == open_before - 1);
    char buf[4] = {0};
    T_OK(ckptio__file_io(f, CKPTIO_READ, buf, 4, 3));
    T_ASSERT(memcmp(buf, "3456", 4) == 0 && ckptio__file_is_open(f));
    uint64_t size = 0;
    ckptio__file_release(f);
    T_OK(ckptio_file_size(f, &size));
    T_ASSERT(size == 10);
    ckptio__file_release(f);
    T_ASSERT(rename(other, path) == 0); /* another file under the name */
    T_STATUS(ckptio__file_io(f, CKPTIO_READ, buf, 4, 0), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("replaced since it was opened");
    T_ASSERT(unlink(path) == 0 && mkfifo(path, 0600) == 0);
    T_STATUS(ckptio__file_io(f, CKPTIO_READ, buf, 4, 0), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("is a FIFO");
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
}

#define NSHARDS 120
#define PER 257   /* floats per shard tensor: reads of every alignment */
#define ROWS 4100 /* a [ROWS, 2] matrix per shard: a column is more runs than are read one by one */

/* A directory of NSHARDS safetensors files opens and reads under a limit of
 * a few dozen descriptors, whole tensors and gathered column slices of every
 * shard; every value checked. */
static void test_many_shards_few_descriptors(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    const char *dir = t_path("shards");
    T_ASSERT(mkdir(dir, 0700) == 0);
    static float data[NSHARDS][PER], matrix[NSHARDS][ROWS][2];
    const int64_t shape[] = {PER}, mshape[] = {ROWS, 2};
    for (int s = 0; s < NSHARDS; s++) {
        char name[64], mname[64], path[512];
        for (int i = 0; i < PER; i++) data[s][i] = (float)(s * 1000 + i);
        for (int r = 0; r < ROWS; r++) matrix[s][r][0] = -(matrix[s][r][1] = (float)(s * 10000 + r));
        snprintf(name, sizeof name, "t%03d", s);
        snprintf(mname, sizeof mname, "m%03d", s);
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, NSHARDS);
        const ckptio_tensor_source t[] = {
            {.name = name, .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape, .data = data[s],
             .nbytes = sizeof data[s], .mem_kind = CKPTIO_MEM_HOST},
            {.name = mname, .dtype = CKPTIO_DTYPE_F32, .ndim = 2, .shape = mshape, .data = matrix[s],
             .nbytes = sizeof matrix[s], .mem_kind = CKPTIO_MEM_HOST}};
        T_OK(ckptio_safetensors_save(e, path, t, 2, NULL, 0, 0));
    }
    struct rlimit old, low;
    T_ASSERT(getrlimit(RLIMIT_NOFILE, &old) == 0);
    const int base = open_descriptors();
    low = old;
    low.rlim_cur = (rlim_t)base + 40; /* room for the engine's rings and a few shards, never for all */
    T_ASSERT(setrlimit(RLIMIT_NOFILE, &low) == 0);
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(e, dir, 0, &m));
    size_t n = 0;
    T_OK(ckptio_model_count(m, &n));
    T_ASSERT(n == 2 * NSHARDS);
    static float got[NSHARDS][PER], column[NSHARDS][ROWS];
    static ckptio_slice_target targets[2 * NSHARDS];
    const int64_t col_start[] = {0, 1}, col_stop[] = {ROWS, 2};
    for (size_t i = 0; i < n; i++) {
        ckptio_tensor_info ti;
        T_OK(ckptio_model_tensor(m, i, &ti, NULL));
        const int s = atoi(ti.name + 1);
        targets[i] = ti.name[0] == 't'
                         ? (ckptio_slice_target){.index = i, .data = got[s], .capacity = sizeof got[s],
                                                 .mem_kind = CKPTIO_MEM_HOST}
                         : (ckptio_slice_target){.index = i, .start = col_start, .stop = col_stop,
                                                 .data = column[s], .capacity = sizeof column[s],
                                                 .mem_kind = CKPTIO_MEM_HOST};
    }
    memset(got, 0, sizeof got);
    T_OK(ckptio_model_read(m, targets, n));
    T_ASSERT(memcmp(got, data, sizeof data) == 0);
    for (int s = 0; s < NSHARDS; s++)
        for (int r = 0; r < ROWS; r++) T_ASSERT(column[s][r] == matrix[s][r][1]);
    T_ASSERT(open_descriptors() <= base + 40);
    /* Every shard's own handle, one after another. */
    for (size_t s = 0; s < NSHARDS; s++) {
        ckptio_safetensors *st = NULL;
        T_OK(ckptio_model_shard(m, s, NULL, &st));
        float one[PER];
        size_t at = 0;
        char name[16];
        snprintf(name, sizeof name, "t%03zu", s);
        T_OK(ckptio_safetensors_find(st, name, &at));
        const ckptio_tensor_target tg = {.index = at, .data = one, .capacity = sizeof one, .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_safetensors_read(st, &tg, 1));
        T_ASSERT(memcmp(one, data[s], sizeof one) == 0);
    }
    T_OK(ckptio_model_close(m));
    T_ASSERT(setrlimit(RLIMIT_NOFILE, &old) == 0);
    T_OK(ckptio_engine_destroy(e));
}

int main(void) {
    alarm(300); /* a hang is a failure */
    T_RUN(test_open_regular);
    T_RUN(test_eintr_rule);
    T_RUN(test_interrupt_cancels);
    T_RUN(test_release_and_reacquire);
    T_RUN(test_many_shards_few_descriptors);
    return 0;
}
