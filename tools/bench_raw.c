/*
 * bench_raw.c - the ceilings `ckptio bench` compares with: plain
 * multi-threaded pread/pwrite of 8 MiB blocks (dd-style O_DIRECT), and the
 * page-cache control that makes "cold" and "warm" mean what they say.
 *
 * This code deliberately shares nothing with the library: a ceiling measured
 * with ckptio's own I/O path could not show ckptio's overheads.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

typedef struct raw_job {
    int fd;
    bool write;
    char *buf;
    uint64_t size, block;
    atomic_uint_fast64_t next_block;
    atomic_uint_fast64_t bytes_done;
    pthread_mutex_t lock;
    pthread_cond_t cond;  /* signalled as each worker finishes */
    unsigned finished;    /* under lock */
    atomic_int failed;
    int err;              /* first failure's errno (0: interrupted / short) */
    uint64_t err_offset;
} raw_job;

/* One block, resuming after EINTR and short transfers. On failure *err is
 * the errno (0 for an unexpected end of file) and *err_offset where. */
static int raw_block(const raw_job *job, uint64_t off, uint64_t len, int *err, uint64_t *err_offset) {
    uint64_t pos = 0;
    while (pos < len) {
        ssize_t n = job->write ? pwrite(job->fd, job->buf + off + pos, len - pos, (off_t)(off + pos))
                               : pread(job->fd, job->buf + off + pos, len - pos, (off_t)(off + pos));
        if (n < 0 && errno == EINTR && !cli_interrupted) continue;
        if (n <= 0) {
            *err = n < 0 ? errno : 0;
            *err_offset = off + pos;
            return -1;
        }
        pos += (uint64_t)n;
    }
    return 0;
}

static void *raw_worker(void *arg) {
    raw_job *job = arg;
    for (;;) {
        if (atomic_load(&job->failed) || cli_interrupted) break;
        uint64_t b = atomic_fetch_add(&job->next_block, 1);
        uint64_t off = b * job->block;
        if (off >= job->size) break;
        uint64_t len = job->size - off < job->block ? job->size - off : job->block;
        int err = 0;
        uint64_t err_offset = 0;
        if (raw_block(job, off, len, &err, &err_offset) != 0) {
            /* Only the first failure is kept; the main thread reads it
             * after joining every worker. */
            int expected = 0;
            if (atomic_compare_exchange_strong(&job->failed, &expected, 1)) {
                job->err = err;
                job->err_offset = err_offset;
            }
            break;
        }
        atomic_fetch_add(&job->bytes_done, len);
    }
    pthread_mutex_lock(&job->lock);
    job->finished++;
    pthread_cond_signal(&job->cond);
    pthread_mutex_unlock(&job->lock);
    return NULL;
}

int bench_raw_transfer(const char *path, bool write, bool direct, void *buf, uint64_t size, unsigned nthreads,
                       uint64_t block, const char *label, double *seconds, bool *used_direct) {
    const char *what = write ? "write" : "read";
    int base = write ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY;
    base |= O_CLOEXEC;
    pthread_t *threads = calloc(nthreads, sizeof *threads);
    raw_job *job = calloc(1, sizeof *job);
    if (threads == NULL || job == NULL) {
        free(threads);
        free(job);
        cli_error("out of memory");
        return -1;
    }
    pthread_mutex_init(&job->lock, NULL);
    pthread_cond_init(&job->cond, NULL);
    int rc = -1;
    unsigned started = 0;
    cli_progress progress;
    cli_progress_init(&progress, label);

    double t0 = cli_now();
    *used_direct = direct;
    int fd = write ? open(path, base | (direct ? O_DIRECT : 0), 0644) : cli_open_regular(path, direct ? O_DIRECT : 0);
    if (fd < 0 && direct && errno == EINVAL) {
        /* tmpfs and some FUSE file systems refuse O_DIRECT: measure buffered. */
        *used_direct = false;
        fd = write ? open(path, base, 0644) : cli_open_regular(path, 0);
    }
    if (fd < 0) {
        cli_error("%s: cannot open for raw %s: %s", path, what, strerror(errno));
        goto out;
    }
    /* Sized first like the peers' ceiling scripts, so threads writing out of
     * order never extend the file one block at a time. */
    if (write && ftruncate(fd, (off_t)size) != 0) {
        cli_error("%s: ftruncate to %llu bytes: %s", path, (unsigned long long)size, strerror(errno));
        goto out;
    }
    job->fd = fd;
    job->write = write;
    job->buf = buf;
    job->size = size;
    job->block = block;
    bool spawn_failed = false;
    for (; started < nthreads; started++)
        if (pthread_create(&threads[started], NULL, raw_worker, job) != 0) {
            /* Stops the workers already running; reported below. */
            spawn_failed = true;
            atomic_store(&job->failed, 2);
            break;
        }
    /* The main thread only draws progress; workers do all the I/O. It
     * wakes when the last worker ends, so no polling delay is timed. */
    pthread_mutex_lock(&job->lock);
    while (job->finished < started) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&job->cond, &job->lock, &until);
        pthread_mutex_unlock(&job->lock);
        cli_progress_update(&progress, atomic_load(&job->bytes_done), size);
        pthread_mutex_lock(&job->lock);
    }
    pthread_mutex_unlock(&job->lock);
    for (unsigned i = 0; i < started; i++) pthread_join(threads[i], NULL);
    started = 0;
    cli_progress_finish(&progress, !spawn_failed && atomic_load(&job->bytes_done) == size);
    if (spawn_failed) {
        cli_error("cannot start %u raw %s threads", nthreads, what);
        goto out;
    }
    if (atomic_load(&job->failed)) {
        if (job->err != 0)
            cli_error("%s: raw %s at offset %llu: %s", path, what, (unsigned long long)job->err_offset,
                      strerror(job->err));
        else
            cli_error("%s: raw %s at offset %llu: unexpected end of file", path, what,
                      (unsigned long long)job->err_offset);
        goto out;
    }
    if (cli_interrupted) {
        cli_error("interrupted");
        goto out;
    }
    if (write && fsync(fd) != 0) {
        cli_error("%s: fsync after raw write: %s", path, strerror(errno));
        goto out;
    }
    if (close(fd) != 0) {
        fd = -1;
        cli_error("%s: close after raw %s: %s", path, what, strerror(errno));
        goto out;
    }
    fd = -1;
    *seconds = cli_now() - t0;
    rc = 0;
out:
    for (unsigned i = 0; i < started; i++) pthread_join(threads[i], NULL);
    if (fd >= 0) close(fd);
    cli_progress_finish(&progress, false);
    pthread_cond_destroy(&job->cond);
    pthread_mutex_destroy(&job->lock);
    free(threads);
    free(job);
    return rc;
}

/* Fraction of the file's pages in the page cache, from mincore(2). */
static int resident_fraction(const char *path, double *out) {
    int fd = cli_open_regular(path, 0);
    if (fd < 0) return cli_error("%s: open: %s", path, strerror(errno)), -1;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return cli_error("%s: fstat: %s", path, strerror(e)), -1;
    }
    *out = 0.0;
    if (sb.st_size == 0) {
        close(fd);
        return 0;
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t len = (size_t)sb.st_size;
    size_t pages = (len + (size_t)page - 1) / (size_t)page;
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return cli_error("%s: mmap for mincore: %s", path, strerror(errno)), -1;
    unsigned char *vec = malloc(pages);
    int rc = -1;
    if (vec == NULL) cli_error("out of memory");
    else if (mincore(map, len, vec) != 0) cli_error("%s: mincore: %s", path, strerror(errno));
    else {
        size_t in = 0;
        for (size_t i = 0; i < pages; i++) in += vec[i] & 1;
        *out = (double)in / (double)pages;
        rc = 0;
    }
    free(vec);
    munmap(map, len);
    return rc;
}

int bench_drop_cache(const char *path, const char **method, double *resident) {
    int fd = cli_open_regular(path, 0);
    if (fd < 0) return cli_error("%s: open to drop its cached pages: %s", path, strerror(errno)), -1;
    /* Dirty pages cannot be dropped: write them back first. */
    int err = 0;
    if (fsync(fd) != 0) err = errno;
    else err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    if (err != 0) return cli_error("%s: dropping cached pages: %s", path, strerror(err)), -1;
    *method = "posix_fadvise(DONTNEED)";

    /* The global drop also empties caches fadvise cannot reach (the block
     * device's, metadata); only root may, and containers may forbid it. */
    if (geteuid() == 0 && access("/proc/sys/vm/drop_caches", W_OK) == 0) {
        sync();
        int dfd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
        if (dfd >= 0) {
            if (write(dfd, "1\n", 2) == 2) *method = "posix_fadvise(DONTNEED) + /proc/sys/vm/drop_caches";
            close(dfd);
        }
    }
    return resident_fraction(path, resident);
}

int bench_prime_cache(const char *path, double *resident) {
    int fd = cli_open_regular(path, 0);
    if (fd < 0) return cli_error("%s: open to cache it: %s", path, strerror(errno)), -1;
    size_t len = 8u << 20;
    char *buf = malloc(len);
    int rc = -1;
    if (buf == NULL) {
        cli_error("out of memory");
        goto out;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (;;) {
        ssize_t n = read(fd, buf, len);
        if (n < 0 && errno == EINTR && !cli_interrupted) continue;
        if (n < 0) {
            cli_error("%s: read to cache it: %s", path, strerror(errno));
            goto out;
        }
        if (n == 0) break;
    }
    rc = resident_fraction(path, resident);
out:
    free(buf);
    close(fd);
    return rc;
}

void bench_fill(void *buf, uint64_t size, uint64_t seed) {
    /* xorshift64*: fast enough for GiBs and incompressible, so no layer
     * below can shortcut zeros or repeats. */
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    unsigned char *p = buf;
    uint64_t i = 0;
    for (; i + 8 <= size; i += 8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = x * 0x2545F4914F6CDD1Dull;
        memcpy(p + i, &v, 8);
    }
    for (; i < size; i++) p[i] = (unsigned char)(i * 131u + 7u);
}

bool bench_virtual_disk(const char *dir, char *name, size_t cap) {
    struct stat sb;
    char link[64], real[4096];
    if (cap == 0 || stat(dir, &sb) != 0) return false;
    snprintf(link, sizeof link, "/sys/dev/block/%u:%u", major(sb.st_dev), minor(sb.st_dev));
    if (!realpath(link, real) || !strstr(real, "/virtio")) return false;
    /* .../virtio1/block/vda or .../block/vda/vda1: the disk is the name after "block/". */
    const char *b = strstr(real, "/block/");
    b = b ? b + 7 : strrchr(real, '/') + 1;
    snprintf(name, cap, "%.*s", (int)strcspn(b, "/"), b);
    return true;
}
