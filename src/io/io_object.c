/*
 * io_object.c - the backend of plans that move s3:// objects: one worker's
 * queue is a curl multi handle (src/objstore/s3_session.c) that keeps up to
 * `depth` ranged GETs in flight straight into the caller's memory, with
 * their retries. Writes to an object (copied into its upload's part
 * buffers, which its own uploader sends) and operations on local files in
 * the same plan run synchronously in submit, as the pread backend's do.
 */
#include "io_internal.h"

#include <errno.h>

typedef struct slot {
    ckptio__s3_request r;
    ckptio__io_op *op;
} slot;

struct ckptio__io_queue {
    ckptio__s3_session *session;
    unsigned depth;
    slot *slots;
    unsigned *free_slots, nfree;
    ckptio__io_op **ready; /* finished in submit, handed back first */
    unsigned head, count;
};

static void object_queue_destroy(ckptio__io_queue *q) {
    if (!q) return;
    ckptio__s3_session_destroy(q->session);
    ckptio__free(q->slots);
    ckptio__free(q->free_slots);
    ckptio__free(q->ready);
    ckptio__free(q);
}

static int object_queue_create(unsigned depth, ckptio__io_queue **out) {
    if (depth == 0) depth = 1;
    ckptio__io_queue *q = ckptio__calloc(1, sizeof *q);
    if (!q) return ENOMEM;
    q->depth = depth;
    q->slots = ckptio__calloc(depth, sizeof *q->slots);
    q->free_slots = ckptio__malloc(depth * sizeof *q->free_slots);
    q->ready = ckptio__malloc(depth * sizeof *q->ready);
    if (!q->slots || !q->free_slots || !q->ready || ckptio__s3_session_create(&q->session) != CKPTIO_OK) {
        object_queue_destroy(q);
        return ENOMEM;
    }
    for (unsigned i = 0; i < depth; i++) q->free_slots[i] = depth - 1 - i;
    q->nfree = depth;
    *out = q;
    return 0;
}

static void object_submit(ckptio__io_queue *q, ckptio__io_op *op) {
    /* The engine never has more than depth operations outstanding, so a
     * free slot exists for every submit. */
    slot *s = &q->slots[q->free_slots[q->nfree - 1]];
    if (ckptio__object_async_read(op, &s->r)) {
        q->nfree--;
        s->op = op;
        s->r.user = s;
        ckptio__s3_submit(q->session, &s->r);
        return;
    }
    ckptio__io_sync(op);
    q->ready[(q->head + q->count) % q->depth] = op;
    q->count++;
}

static ckptio__io_op *object_wait(ckptio__io_queue *q) {
    if (q->count) {
        ckptio__io_op *op = q->ready[q->head];
        q->head = (q->head + 1) % q->depth;
        q->count--;
        return op;
    }
    ckptio__s3_request *r = ckptio__s3_wait(q->session);
    if (!r) return NULL;
    slot *s = r->user;
    ckptio__io_op *op = s->op;
    ckptio__object_io_done(op, r);
    q->free_slots[q->nfree++] = (unsigned)(s - q->slots);
    return op;
}

const ckptio__backend_ops ckptio__backend_object = {
    .id = CKPTIO_BACKEND_PREAD, /* reported as the portable backend: no io_uring, no O_DIRECT */
    .name = "s3",
    .queue_create = object_queue_create,
    .queue_destroy = object_queue_destroy,
    .register_buffer = NULL,
    .submit = object_submit,
    .wait = object_wait,
};
