/*
 * io_uring.c - the io_uring backend: one ring per worker, up to
 * CKPTIO_OPT_QUEUE_DEPTH operations in flight on it, submitted in batches
 * (one io_uring_enter for everything prepared since the last wait).
 *
 * Short transfers and -EINTR/-EAGAIN completions are resubmitted for the
 * remainder inside wait(), so the engine only ever sees finished operations
 * (-EINTR is the failure once ckptio_interrupt() asked to stop). Waiting for
 * the completions of requests in the kernel goes on through signals: their
 * buffers are the caller's until they complete.
 * The worker's bounce buffer can be registered as fixed buffer 0, which
 * saves the kernel pinning its pages on every request.
 */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#define CKPTIO_MAX_RW ((uint64_t)0x7ffff000)

struct ckptio__io_queue {
    struct io_uring ring;
    unsigned depth;
    unsigned in_kernel;      /* consumed by the kernel, completion pending */
    unsigned pending;        /* prepared in the SQ ring, not yet submitted */
    unsigned fifo_head;      /* prepared operations in SQ order (pending of them) */
    int broken;              /* errno of a failed submission: submit no more */
    bool fixed;              /* buffer 0 registered */
    unsigned nready;         /* operations finished outside the ring: failed,
                                or written in the file's turn (io_pread.c) */
    ckptio__io_op **fifo;    /* depth entries */
    ckptio__io_op **ready;   /* depth entries */
};

/* ---- probe ------------------------------------------------------------- */

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_err;
static const char *probe_why = "";
static _Atomic int forced_refusal;

static void probe_run(void) {
    /* 2 = disabled for everyone; 1 = only for members of
     * kernel.io_uring_group (the real init below tells). */
    char disabled[8];
    if (ckptio__read_kernel_file("/proc/sys/kernel/io_uring_disabled", disabled, sizeof disabled) > 0 &&
        disabled[0] == '2') {
        probe_err = EPERM;
        probe_why = "io_uring is disabled by the sysctl kernel.io_uring_disabled=2";
        return;
    }
    struct io_uring ring;
    int ret = io_uring_queue_init(4, &ring, 0);
    if (ret < 0) {
        probe_err = -ret;
        probe_why = ret == -ENOSYS ? "the kernel has no io_uring"
                    : ret == -EPERM ? "io_uring is not permitted here (sysctl kernel.io_uring_disabled, seccomp or "
                                      "container policy)"
                                    : "io_uring_queue_init failed";
        return;
    }
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    if (!probe || !io_uring_opcode_supported(probe, IORING_OP_READ) ||
        !io_uring_opcode_supported(probe, IORING_OP_WRITE)) {
        probe_err = ENOSYS;
        probe_why = "the kernel's io_uring lacks IORING_OP_READ/WRITE (Linux 5.6 or newer needed)";
    }
    if (probe) io_uring_free_probe(probe);
    io_uring_queue_exit(&ring);
}

int ckptio__io_uring_probe(const char **why) {
    int forced = atomic_load(&forced_refusal);
    if (forced) {
        if (why) *why = "io_uring refused by a test hook";
        return forced;
    }
    pthread_once(&probe_once, probe_run);
    if (why) *why = probe_why;
    return probe_err;
}

void ckptio__io_uring_force_refusal(int err) { atomic_store(&forced_refusal, err); }

/* ---- queue ------------------------------------------------------------- */

static int uring_queue_create(unsigned depth, ckptio__io_queue **out) {
    if (depth == 0) depth = 1;
    int err = ckptio__io_uring_probe(NULL);
    if (err) return err;
    ckptio__io_queue *q = ckptio__calloc(1, sizeof *q);
    if (!q) return ENOMEM;
    q->fifo = ckptio__calloc(depth, sizeof *q->fifo);
    q->ready = ckptio__calloc(depth, sizeof *q->ready);
    if (!q->fifo || !q->ready) {
        err = ENOMEM;
        goto fail;
    }
    int ret = io_uring_queue_init(depth, &q->ring, 0);
    if (ret < 0) {
        err = -ret;
        goto fail;
    }
    q->depth = depth;
    *out = q;
    return 0;
fail:
    ckptio__free(q->fifo);
    ckptio__free(q->ready);
    ckptio__free(q);
    return err;
}

static void uring_queue_destroy(ckptio__io_queue *q) {
    if (!q) return;
    /* The engine drains every queue before it lets go of buffers; exit
     * would not wait for requests still in the kernel. */
    io_uring_queue_exit(&q->ring);
    ckptio__free(q->fifo);
    ckptio__free(q->ready);
    ckptio__free(q);
}

static int uring_register_buffer(ckptio__io_queue *q, void *buf, size_t len) {
    if (q->fixed) {
        io_uring_unregister_buffers(&q->ring);
        q->fixed = false;
    }
    if (!buf) return 0;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    int ret = io_uring_register_buffers(&q->ring, &iov, 1);
    if (ret < 0) return -ret; /* e.g. RLIMIT_MEMLOCK: plain buffers still work */
    q->fixed = true;
    return 0;
}

static void fail_op(ckptio__io_queue *q, ckptio__io_op *op, int err) {
    op->err = err;
    q->ready[q->nready++] = op;
}

/* Prepares the next request of `op` (its remainder) in the SQ ring. */
static void prep(ckptio__io_queue *q, ckptio__io_op *op) {
    if (q->broken) {
        fail_op(q, op, q->broken);
        return;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&q->ring);
    if (!sqe) {
        /* Cannot happen while pending + in_kernel <= depth <= SQ entries. */
        fail_op(q, op, EBUSY);
        return;
    }
    int fd = op->fd;
    if (op->direct && (op->done % CKPTIO_DIRECT_ALIGN) != 0) fd = op->buffered_fd;
    uint64_t want = op->len - op->done;
    if (want > CKPTIO_MAX_RW) want = CKPTIO_MAX_RW;
    unsigned char *buf = op->buf + op->done;
    const uint64_t off = op->offset + op->done;
    if (op->buf_index >= 0 && q->fixed) {
        if (op->dir == CKPTIO_READ) io_uring_prep_read_fixed(sqe, fd, buf, (unsigned)want, off, op->buf_index);
        else io_uring_prep_write_fixed(sqe, fd, buf, (unsigned)want, off, op->buf_index);
    } else {
        if (op->dir == CKPTIO_READ) io_uring_prep_read(sqe, fd, buf, (unsigned)want, off);
        else io_uring_prep_write(sqe, fd, buf, (unsigned)want, off);
    }
    io_uring_sqe_set_data(sqe, op);
    op->requests++;
    q->fifo[(q->fifo_head + q->pending) % q->depth] = op;
    q->pending++;
}

static void uring_submit(ckptio__io_queue *q, ckptio__io_op *op) {
    /* A write that must wait for its file's turn cannot hold it across the
     * ring: it runs here, as the pread backend runs it. */
    if (op->turn) {
        ckptio__io_sync(op);
        q->ready[q->nready++] = op;
        return;
    }
    prep(q, op);
}

/* Applies one completion to `op`. Returns true when the operation is
 * finished (done, end of file or failed), false when it was resubmitted. */
static bool complete(ckptio__io_queue *q, ckptio__io_op *op, int res) {
    const ckptio__io_kind kind = op->dir == CKPTIO_READ ? CKPTIO__IO_READ : CKPTIO__IO_WRITE;
    /* Faults are applied to the completion: the kernel did the transfer,
     * we pretend it failed or moved less, which is what the retry logic
     * must cope with anyway. */
    if (res >= 0) {
        int err = 0;
        uint64_t got = (uint64_t)res;
        if (ckptio__io_fault(kind, &err, &got)) {
            res = -err;
        } else if (got < (uint64_t)res) {
            const bool direct = op->direct && (op->done % CKPTIO_DIRECT_ALIGN) == 0;
            if (direct) got = ckptio__align_down(got, CKPTIO_DIRECT_ALIGN);
            if (got > 0) res = (int)got;
        }
    }
    if (res < 0) {
        if ((res == -EINTR && !ckptio__interrupt_requested()) || res == -EAGAIN) {
            op->retries++;
            prep(q, op);
            return false;
        }
        op->err = -res;
        return true;
    }
    if (res == 0) {
        if (op->dir == CKPTIO_READ) op->eof = true;
        else op->err = EIO;
        return true;
    }
    op->done += (uint64_t)res;
    if (op->done < op->need) {
        op->retries++;
        prep(q, op);
        return false;
    }
    return true;
}

static ckptio__io_op *uring_wait(ckptio__io_queue *q) {
    for (;;) {
        if (q->nready) return q->ready[--q->nready];
        if (q->pending == 0 && q->in_kernel == 0) return NULL;
        if (q->pending && !q->broken) {
            int ret = io_uring_submit(&q->ring);
            if (ret > 0) {
                unsigned n = (unsigned)ret > q->pending ? q->pending : (unsigned)ret;
                q->fifo_head = (q->fifo_head + n) % q->depth;
                q->pending -= n;
                q->in_kernel += n;
            } else if (ret < 0 && ret != -EINTR && ret != -EAGAIN && ret != -EBUSY) {
                /* The prepared entries stay in the SQ ring but are never
                 * entered again (only GETEVENTS waits follow), so they can
                 * be failed here without the kernel touching their buffers. */
                q->broken = -ret;
                while (q->pending) {
                    fail_op(q, q->fifo[q->fifo_head], q->broken);
                    q->fifo_head = (q->fifo_head + 1) % q->depth;
                    q->pending--;
                }
                continue;
            } else if (q->in_kernel == 0) {
                sched_yield(); /* transient: try the submission again */
                continue;
            }
        }
        if (q->in_kernel == 0) continue;
        struct io_uring_cqe *cqe = NULL;
        int ret = io_uring_wait_cqe(&q->ring, &cqe);
        if (ret == -EINTR || ret == -EAGAIN || ret == -ETIME) continue;
        if (ret < 0 || !cqe) {
            /* The ring itself is unusable; the requests in the kernel cannot
             * be accounted for. Reported as an internal error. */
            q->broken = ret < 0 ? -ret : EIO;
            return NULL;
        }
        ckptio__io_op *op = io_uring_cqe_get_data(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&q->ring, cqe);
        q->in_kernel--;
        if (complete(q, op, res)) return op;
    }
}

const ckptio__backend_ops ckptio__backend_io_uring = {
    .id = CKPTIO_BACKEND_IO_URING,
    .name = "io_uring",
    .queue_create = uring_queue_create,
    .queue_destroy = uring_queue_destroy,
    .register_buffer = uring_register_buffer,
    .submit = uring_submit,
    .wait = uring_wait,
};
