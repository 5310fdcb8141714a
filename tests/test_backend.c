/*
 * test_backend.c - the backend contract, below the engine: a queue of up to
 * `depth` operations, each finished completely (or failed, or stopped at end
 * of file) before wait() returns it; `need` < `len` for whole-block reads at
 * the end of a file; a short O_DIRECT transfer finishing through the
 * buffered descriptor; errors carried on the operation; registered buffers
 * (io_uring). Runs on pread and, where the kernel allows it, io_uring.
 */
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define DEPTH 8

static const ckptio__backend_ops *g_be;

static ckptio__io_queue *queue(unsigned depth) {
    ckptio__io_queue *q = NULL;
    int err = g_be->queue_create(depth, &q);
    T_ASSERT_MSG(err == 0, "%s queue_create: %s", g_be->name, strerror(err));
    return q;
}

static ckptio__io_op op_for(int fd, ckptio_direction dir, void *buf, uint64_t len, uint64_t off) {
    return (ckptio__io_op){.fd = fd, .buffered_fd = fd, .dir = dir, .buf = buf, .len = len, .need = len,
                           .offset = off, .buf_index = -1};
}

static void test_queue_roundtrip(void) {
    const char *path = t_path("q.bin");
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    T_ASSERT(fd >= 0);
    enum { OPS = 40, LEN = 5000 };
    unsigned char *src = malloc(OPS * LEN), *dst = malloc(OPS * LEN);
    t_fill_random(src, OPS * LEN, 6);
    ckptio__io_queue *q = queue(DEPTH);
    ckptio__io_op ops[OPS];
    /* Keep DEPTH in flight, hand out the next as each finishes. */
    for (int dir = 0; dir < 2; dir++) {
        const ckptio_direction d = dir == 0 ? CKPTIO_WRITE : CKPTIO_READ;
        int next = 0, inflight = 0, finished = 0;
        bool seen[OPS] = {false};
        while (finished < OPS) {
            while (inflight < DEPTH && next < OPS) {
                /* Reverse order: the file grows out of order. */
                const int i = OPS - 1 - next++;
                ops[i] = op_for(fd, d, (d == CKPTIO_WRITE ? src : dst) + (size_t)i * LEN, LEN, (uint64_t)i * LEN);
                g_be->submit(q, &ops[i]);
                inflight++;
            }
            ckptio__io_op *o = g_be->wait(q);
            T_ASSERT(o != NULL);
            const int i = (int)(o - ops);
            T_ASSERT(i >= 0 && i < OPS && !seen[i]);
            seen[i] = true;
            T_ASSERT(o->err == 0 && !o->eof && o->done == LEN && o->requests >= 1);
            inflight--;
            finished++;
        }
        T_ASSERT(g_be->wait(q) == NULL); /* nothing in flight */
    }
    T_ASSERT(memcmp(src, dst, OPS * LEN) == 0);
    g_be->queue_destroy(q);
    close(fd);
    free(src);
    free(dst);
}

static void test_eof_and_need(void) {
    const char *path = t_path("eof.bin");
    unsigned char data[5000];
    t_fill_random(data, sizeof data, 7);
    t_write_file(path, data, sizeof data);
    int fd = open(path, O_RDONLY);
    int dfd = open(path, O_RDONLY | O_DIRECT);
    T_ASSERT(fd >= 0 && dfd >= 0);
    unsigned char *blk;
    T_ASSERT(posix_memalign((void **)&blk, 4096, 8192) == 0);
    ckptio__io_queue *q = queue(4);

    /* Whole last block, only 904 bytes needed: done, no end of file. */
    ckptio__io_op o = op_for(dfd, CKPTIO_READ, blk, 4096, 4096);
    o.direct = true, o.buffered_fd = fd, o.need = 904;
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o);
    T_ASSERT(o.err == 0 && !o.eof && o.done == 904);
    T_ASSERT(memcmp(blk, data + 4096, 904) == 0);

    /* Needing more than the file has: a short O_DIRECT read leaves an
     * unaligned remainder, finished buffered, which meets end of file. */
    o = op_for(dfd, CKPTIO_READ, blk, 8192, 0);
    o.direct = true, o.buffered_fd = fd;
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o);
    T_ASSERT(o.err == 0 && o.eof && o.done == 5000);
    T_ASSERT(memcmp(blk, data, 5000) == 0);

    /* Errors travel on the operation. */
    o = op_for(-1, CKPTIO_READ, blk, 10, 0);
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o);
    T_ASSERT(o.err == EBADF);
    o = op_for(fd, CKPTIO_WRITE, blk, 10, 0); /* fd is read-only */
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o);
    T_ASSERT(o.err == EBADF);
    /* Injected: ENOSPC on the first request; EINTR then success. */
    ckptio__io_inject(CKPTIO__IO_READ, 1, ENOSPC, 0, false);
    o = op_for(fd, CKPTIO_READ, blk, 100, 0);
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o && o.err == ENOSPC);
    ckptio__io_inject(CKPTIO__IO_READ, 1, EINTR, 0, false);
    o = op_for(fd, CKPTIO_READ, blk, 100, 0);
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o && o.err == 0 && o.done == 100 && o.retries == 1 && o.requests == 2);
    /* A short transfer of 30 bytes is resumed. */
    ckptio__io_inject(CKPTIO__IO_READ, 1, 0, 30, false);
    o = op_for(fd, CKPTIO_READ, blk, 100, 10);
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o && o.err == 0 && o.done == 100 && o.retries == 1);
    T_ASSERT(memcmp(blk, data + 10, 100) == 0);
    ckptio__io_inject_reset();

    g_be->queue_destroy(q);
    close(fd);
    close(dfd);
    free(blk);
}

static void test_registered_buffer(void) {
    if (!g_be->register_buffer) return;
    const char *path = t_path("fixed.bin");
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    int dfd = open(path, O_RDWR | O_DIRECT);
    T_ASSERT(fd >= 0 && dfd >= 0);
    unsigned char *region;
    T_ASSERT(posix_memalign((void **)&region, 4096, 64 << 10) == 0);
    t_fill_random(region, 64 << 10, 9);
    ckptio__io_queue *q = queue(4);
    if (g_be->register_buffer(q, region, 64 << 10) != 0) {
        printf("# buffer registration refused (memlock limit?): part skipped\n");
        goto out;
    }
    ckptio__io_op o = op_for(dfd, CKPTIO_WRITE, region + 8192, 16384, 4096);
    o.direct = true, o.buffered_fd = fd, o.buf_index = 0;
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o && o.err == 0 && o.done == 16384);
    unsigned char back[16384];
    T_ASSERT(pread(fd, back, sizeof back, 4096) == (ssize_t)sizeof back);
    T_ASSERT(memcmp(back, region + 8192, sizeof back) == 0);
    memset(region, 0, 64 << 10);
    o = op_for(dfd, CKPTIO_READ, region, 16384, 4096);
    o.direct = true, o.buffered_fd = fd, o.buf_index = 0;
    g_be->submit(q, &o);
    T_ASSERT(g_be->wait(q) == &o && o.err == 0 && o.done == 16384);
    T_ASSERT(memcmp(back, region, sizeof back) == 0);
    T_ASSERT(g_be->register_buffer(q, NULL, 0) == 0);
out:
    g_be->queue_destroy(q);
    close(fd);
    close(dfd);
    free(region);
}

static void test_probe(void) {
    const char *why = NULL;
    ckptio__io_uring_force_refusal(EPERM);
    T_ASSERT(ckptio__io_uring_probe(&why) == EPERM);
    T_ASSERT(strstr(why, "refused by a test hook") != NULL);
    ckptio__io_queue *q = NULL;
    T_ASSERT(ckptio__backend_io_uring.queue_create(4, &q) == EPERM && q == NULL);
    ckptio__io_uring_force_refusal(0);
}

int main(void) {
    T_RUN(test_probe);
    g_be = &ckptio__backend_pread;
    printf("# backend pread\n");
    T_RUN(test_queue_roundtrip);
    T_RUN(test_eof_and_need);
    const char *why;
    int err = ckptio__io_uring_probe(&why);
    if (err) {
        printf("# io_uring skipped: %s (%s)\n", why, strerror(err));
        return 0;
    }
    g_be = &ckptio__backend_io_uring;
    printf("# backend io_uring\n");
    T_RUN(test_queue_roundtrip);
    T_RUN(test_eof_and_need);
    T_RUN(test_registered_buffer);
    return 0;
}
