/*
 * io_pread.c - the portable backend: pread/pwrite, one request at a time per
 * worker; the parallelism comes from the engine's worker threads.
 */
#include "io_internal.h"

#include <errno.h>
#include <unistd.h>

/* Linux moves at most this much per read/write call (MAX_RW_COUNT); asking
 * for less keeps O_DIRECT requests aligned. */
#define CKPTIO_MAX_RW ((uint64_t)0x7ffff000)

static void io_sync_calls(ckptio__io_op *op) {
    const ckptio__io_kind kind = op->dir == CKPTIO_READ ? CKPTIO__IO_READ : CKPTIO__IO_WRITE;
    while (op->done < op->need) {
        int fd = op->fd;
        bool direct = op->direct;
        /* A short O_DIRECT transfer can leave an unaligned remainder, which
         * O_DIRECT would refuse: finish it through the page cache. */
        if (direct && (op->done % CKPTIO_DIRECT_ALIGN) != 0) {
            fd = op->buffered_fd;
            direct = false;
        }
        uint64_t want = op->len - op->done;
        if (want > CKPTIO_MAX_RW) want = CKPTIO_MAX_RW;
        uint64_t ask = want;
        int err = 0;
        ssize_t n;
        op->requests++;
        if (ckptio__io_fault(kind, &err, &ask)) {
            n = -1;
            errno = err;
        } else {
            if (direct && ask < want) {
                ask = ckptio__align_down(ask, CKPTIO_DIRECT_ALIGN);
                if (ask == 0) ask = want < CKPTIO_DIRECT_ALIGN ? want : CKPTIO_DIRECT_ALIGN;
            }
            n = op->dir == CKPTIO_READ ? pread(fd, op->buf + op->done, (size_t)ask, (off_t)(op->offset + op->done))
                                       : pwrite(fd, op->buf + op->done, (size_t)ask, (off_t)(op->offset + op->done));
        }
        if (n < 0) {
            /* EINTR is given up once the program asked the library to stop
             * (ckptio_interrupt); the operation then fails with it. */
            if ((errno == EINTR && !ckptio__interrupt_requested()) || errno == EAGAIN) {
                op->retries++;
                continue;
            }
            op->err = errno;
            return;
        }
        if (n == 0) {
            if (op->dir == CKPTIO_READ) op->eof = true;
            else op->err = EIO; /* a write that makes no progress would loop forever */
            return;
        }
        op->done += (uint64_t)n;
        if (op->done < op->need) op->retries++;
    }
}

void ckptio__io_sync(ckptio__io_op *op) {
    if (op->object) { /* s3:// (object_file.c) */
        ckptio__object_io(op);
        return;
    }
    if (op->turn) pthread_mutex_lock(op->turn);
    io_sync_calls(op);
    if (op->turn) pthread_mutex_unlock(op->turn);
}

/* Operations finish inside submit(); the queue only hands them back in
 * order, so that the engine's worker loop is the same for both backends. */
struct ckptio__io_queue {
    unsigned depth;
    unsigned head, count;
    ckptio__io_op *done[];
};

static int pread_queue_create(unsigned depth, ckptio__io_queue **out) {
    if (depth == 0) depth = 1;
    ckptio__io_queue *q = ckptio__malloc(sizeof *q + depth * sizeof(ckptio__io_op *));
    if (!q) return ENOMEM;
    q->depth = depth;
    q->head = q->count = 0;
    *out = q;
    return 0;
}

static void pread_queue_destroy(ckptio__io_queue *q) { ckptio__free(q); }

static void pread_submit(ckptio__io_queue *q, ckptio__io_op *op) {
    ckptio__io_sync(op);
    /* The engine never has more than depth operations outstanding. */
    q->done[(q->head + q->count) % q->depth] = op;
    q->count++;
}

static ckptio__io_op *pread_wait(ckptio__io_queue *q) {
    if (q->count == 0) return NULL;
    ckptio__io_op *op = q->done[q->head];
    q->head = (q->head + 1) % q->depth;
    q->count--;
    return op;
}

const ckptio__backend_ops ckptio__backend_pread = {
    .id = CKPTIO_BACKEND_PREAD,
    .name = "pread",
    .queue_create = pread_queue_create,
    .queue_destroy = pread_queue_destroy,
    .register_buffer = NULL,
    .submit = pread_submit,
    .wait = pread_wait,
};
