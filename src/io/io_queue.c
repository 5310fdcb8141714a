/*
 * io_queue.c - what every executor of the engine does with the backends
 * alike: creating a worker's queue (with AUTO's fallback from io_uring to
 * pread) and counting finished operations in the statistics. The host
 * executor (src/engine/exec.c) and the GPU pipeline's file stage
 * (src/gpu/gpu_file_stage.c) both go through here, so a GPU transfer gets the
 * backend, the fallback and the counters a host transfer gets.
 */
#include "io_internal.h"

ckptio_status ckptio__io_queue_create(const ckptio__backend_ops **backend, unsigned *depth, bool forced,
                                      unsigned worker, ckptio__io_queue **out) {
    const ckptio__backend_ops *be = *backend;
    unsigned d = be == &ckptio__backend_pread ? 1 : *depth;
    int err = be->queue_create(d, out);
    if (err && be == &ckptio__backend_io_uring && !forced) {
        /* AUTO: a ring can fail where the probe passed (memlock, ring
         * limits); this worker falls back to pread. */
        be = &ckptio__backend_pread;
        d = 1;
        err = be->queue_create(d, out);
    }
    if (err)
        return CKPTIO_FAIL_SYS(err, be == &ckptio__backend_io_uring ? "io_uring_queue_init" : "queue", "", -1,
                               "creating the %s queue of worker %u (depth %u)", be->name, worker, d);
    *backend = be;
    *depth = d;
    return CKPTIO_OK;
}

void ckptio__io_op_count(const ckptio__io_op *op, uint64_t bytes, ckptio_stats *st) {
    st->io_requests += op->requests;
    st->retries += op->retries;
    if (op->err || op->done < op->need) return;
    if (op->dir == CKPTIO_READ) st->bytes_read += bytes;
    else st->bytes_written += bytes;
    if (op->direct) st->bytes_direct += bytes;
    else st->bytes_buffered += bytes;
}
