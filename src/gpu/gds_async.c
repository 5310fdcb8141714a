/*
 * gds_async.c - stream-ordered GDS transfers.
 *
 * How a request is ordered with the caller's stream S (device buffers):
 *   at submit:  record event E_start on S       (work queued before us)
 *               queue "wait until *gate >= 1" on S (cuStreamWaitValue32 on a
 *               word of pinned, device-mapped memory)
 *               record event E_after on S        (S has passed the gate)
 *   file thread: wait E_start -> run the transfer (pipeline or cuFile, all
 *               copies complete) -> store *gate = 1 (release)
 * Kernels the caller queues on S after the call sit behind the gate, so they
 * see the loaded bytes; kernels queued before it finished before the bytes
 * of a write were copied out. Host functions (cuLaunchHostFunc) would not do:
 * they may not call CUDA, and the transfer needs CUDA calls.
 * The gate opens also when the transfer fails, so S never hangs; the error
 * is reported by ckptio_gds_request_wait().
 * While S waits on a gate, no transfer of the engine frees its pinned
 * staging slots (it keeps them: ckptio__gpu_kept_slot_bytes): cuMemFreeHost
 * synchronises the device, so it would wait for S, which waits for the
 * transfer. A request destroyed meanwhile frees its own gate word, which
 * only waits for the other request's transfer to end.
 */
#include "cuda_shim.h"
#include "gds_internal.h"
#include "gpu_pipeline.h"
#include "io_internal.h"

#include <stdatomic.h>
#include <string.h>

struct ckptio_gds_request {
    ckptio_gds_file *file;
    ckptio_direction dir;
    void *buf;
    uint64_t size, file_offset, buf_offset;
    const ckptio__gpu_ops *ops;
    int device;
    void *ev_start, *ev_after;
    uint32_t *gate;             /* pinned word the stream waits on, or NULL */
    ckptio__gpu_state *staging; /* the engine's, counting this request's wait until the gate opens, or NULL */
    bool done;
    ckptio_status status;
    ckptio__error_saved *err;   /* the failure's error record */
    uint64_t bytes;
    struct ckptio_gds_request *next;
};

/* Frees a saved error record without disturbing the thread's current one
 * (the common layer frees saved records only by restoring them). */
static void drop_saved(ckptio__error_saved *saved) {
    ckptio__error_saved *current = ckptio__error_save();
    ckptio__error_restore(saved);
    ckptio__error_restore(current);
}

static void open_gate(ckptio_gds_request *r) {
    if (r->gate) __atomic_store_n(r->gate, 1u, __ATOMIC_RELEASE);
    if (r->staging) ckptio__gpu_stream_wait_end(r->staging);
    r->staging = NULL;
}

static void finish(ckptio_gds_request *r, ckptio_status st, uint64_t bytes) {
    r->status = st;
    r->bytes = bytes;
    if (st != CKPTIO_OK) r->err = ckptio__error_save();
}

static void *file_thread(void *arg) {
    ckptio_gds_file *f = arg;
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (!f->head && !f->stop) pthread_cond_wait(&f->cond, &f->lock);
        if (!f->head) break; /* stop, and everything queued has run */
        ckptio_gds_request *r = f->head;
        f->head = r->next;
        if (!f->head) f->tail = NULL;
        pthread_mutex_unlock(&f->lock);

        uint64_t bytes = 0;
        ckptio_status st = r->ops->ctx_enter(r->device);
        if (st == CKPTIO_OK) {
            st = r->ops->event_sync(r->ev_start);
            if (st == CKPTIO_OK)
                st = ckptio__gds_transfer(f, r->dir, r->buf, r->size, r->file_offset, r->buf_offset, &bytes);
            r->ops->ctx_leave(r->device);
        }
        finish(r, st, bytes);
        open_gate(r);

        pthread_mutex_lock(&f->lock);
        r->done = true;
        f->outstanding--;
        pthread_cond_broadcast(&f->cond);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

void ckptio__gds_async_shutdown(ckptio_gds_file *f) {
    pthread_mutex_lock(&f->lock);
    const bool started = f->thread_started;
    f->stop = true;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    if (started) pthread_join(f->thread, NULL);
    f->thread_started = false;
}

static void release(ckptio_gds_request *r) {
    if (r->ops && (r->ev_start || r->ev_after || r->gate)) {
        const bool entered = r->ops->ctx_enter(r->device) == CKPTIO_OK;
        /* The gate word must outlive the stream's wait on it. */
        if (r->ev_after) r->ops->event_sync(r->ev_after);
        if (r->ev_after) r->ops->event_destroy(r->ev_after);
        if (r->ev_start) r->ops->event_destroy(r->ev_start);
        if (r->gate) r->ops->pinned_free(r->gate);
        if (entered) r->ops->ctx_leave(r->device);
    }
    if (r->err) drop_saved(r->err);
    ckptio__free(r);
}

/* Runs the request on the calling thread after `stream` drained. */
static ckptio_status run_now(ckptio_gds_request *r, void *stream) {
    uint64_t bytes = 0;
    ckptio_status st = CKPTIO_OK;
    if (stream && r->ops) {
        const int dev = r->device >= 0 ? r->device : 0;
        st = r->ops->ctx_enter(dev);
        if (st == CKPTIO_OK) {
            st = r->ops->stream_sync(stream);
            r->ops->ctx_leave(dev);
        }
    }
    if (st == CKPTIO_OK)
        st = ckptio__gds_transfer(r->file, r->dir, r->buf, r->size, r->file_offset, r->buf_offset, &bytes);
    finish(r, st, bytes);
    r->done = true;
    return CKPTIO_OK; /* the outcome is the request's */
}

static ckptio_status submit(ckptio_gds_file *f, ckptio_direction dir, void *buf, uint64_t size, uint64_t file_offset,
                            uint64_t buf_offset, void *stream, ckptio_gds_request **out) {
    CKPTIO_RETURN_IF(!f || !out, CKPTIO_E_INVAL, "ckptio_gds_%s_async: file and out are required",
                     dir == CKPTIO_READ ? "read" : "write");
    *out = NULL;
    CKPTIO_RETURN_IF(dir == CKPTIO_WRITE && !f->file->writable, CKPTIO_E_PERMISSION,
                     "%s: GDS write on a file opened O_RDONLY", f->file->path);
    /* The request thread and its queue belong to the parent. */
    CKPTIO_RETURN_IF(ckptio__forked_since(f->generation), CKPTIO_E_INVAL,
                     "%s: this GDS file was opened before the process was fork()ed; open it again in the child",
                     f->file->path);
    ckptio_gds_request *r = ckptio__calloc(1, sizeof *r);
    if (!r) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a GDS request");
    *r = (ckptio_gds_request){.file = f, .dir = dir, .buf = buf, .size = size, .file_offset = file_offset,
                              .buf_offset = buf_offset, .device = -1};
    r->ops = ckptio__gpu_ops_try();
    ckptio_mem_kind kind = CKPTIO_MEM_HOST;
    if (r->ops && buf) kind = r->ops->classify((unsigned char *)buf + buf_offset, &r->device);
    if (kind != CKPTIO_MEM_CUDA) {
        /* Host buffers: the host is the only consumer, no gate to build. */
        run_now(r, stream);
        *out = r;
        return CKPTIO_OK;
    }
    const ckptio__gpu_ops *ops = r->ops;
    ckptio_status st = ops->ctx_enter(r->device);
    if (st != CKPTIO_OK) {
        ckptio__free(r);
        return st;
    }
    void *gate = NULL;
    if ((st = ops->pinned_alloc(sizeof(uint32_t), false, &gate)) != CKPTIO_OK) goto fail;
    r->gate = gate;
    *r->gate = 0;
    if ((st = ops->event_create(&r->ev_start)) != CKPTIO_OK) goto fail;
    if ((st = ops->event_record(r->ev_start, stream)) != CKPTIO_OK) goto fail;
    if ((st = ckptio__gpu_state_get(f->engine, ops, &r->staging)) != CKPTIO_OK) goto fail;
    ckptio__gpu_stream_wait_begin(r->staging);
    st = ops->stream_wait_word(stream, r->gate, 1);
    if (st != CKPTIO_OK) { /* no wait queued */
        ckptio__gpu_stream_wait_end(r->staging);
        r->staging = NULL;
    }
    if (st == CKPTIO_E_UNSUPPORTED) {
        /* No stream memory operations: keep the order by draining. */
        ops->ctx_leave(r->device);
        ops->pinned_free(r->gate);
        r->gate = NULL;
        run_now(r, stream);
        *out = r;
        return CKPTIO_OK;
    }
    if (st != CKPTIO_OK) goto fail;
    if ((st = ops->event_create(&r->ev_after)) != CKPTIO_OK ||
        (st = ops->event_record(r->ev_after, stream)) != CKPTIO_OK) {
        open_gate(r); /* the wait is queued: never leave the stream blocked */
        goto fail;
    }
    ops->ctx_leave(r->device);

    pthread_mutex_lock(&f->lock);
    if (!f->thread_started) {
        f->stop = false;
        if (pthread_create(&f->thread, NULL, file_thread, f) != 0) {
            pthread_mutex_unlock(&f->lock);
            open_gate(r);
            release(r);
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: cannot start the GDS request thread", f->file->path);
        }
        f->thread_started = true;
    }
    if (f->tail) f->tail->next = r;
    else f->head = r;
    f->tail = r;
    f->outstanding++;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    *out = r;
    return CKPTIO_OK;
fail:
    ops->ctx_leave(r->device);
    {
        ckptio__error_saved *saved = ckptio__error_save();
        release(r);
        ckptio__error_restore(saved);
    }
    return st;
}

ckptio_status ckptio_gds_read_async(ckptio_gds_file *f, void *buf, uint64_t size, uint64_t file_offset,
                                    uint64_t buf_offset, void *stream, ckptio_gds_request **out) {
    return submit(f, CKPTIO_READ, buf, size, file_offset, buf_offset, stream, out);
}

ckptio_status ckptio_gds_write_async(ckptio_gds_file *f, const void *buf, uint64_t size, uint64_t file_offset,
                                     uint64_t buf_offset, void *stream, ckptio_gds_request **out) {
    return submit(f, CKPTIO_WRITE, (void *)(uintptr_t)buf, size, file_offset, buf_offset, stream, out);
}

ckptio_status ckptio_gds_request_wait(ckptio_gds_request *r, uint64_t *bytes) {
    CKPTIO_RETURN_IF(!r, CKPTIO_E_INVAL, "ckptio_gds_request_wait: request is NULL");
    ckptio_gds_file *f = r->file;
    pthread_mutex_lock(&f->lock);
    while (!r->done) pthread_cond_wait(&f->cond, &f->lock);
    pthread_mutex_unlock(&f->lock);
    if (bytes) *bytes = r->bytes;
    if (r->status != CKPTIO_OK && r->err) {
        /* Restoring consumes the copy; keep one for a later wait. */
        ckptio__error_restore(r->err);
        r->err = ckptio__error_save();
    }
    return r->status;
}

ckptio_status ckptio_gds_request_destroy(ckptio_gds_request *r) {
    if (!r) return CKPTIO_OK;
    ckptio_gds_file *f = r->file;
    pthread_mutex_lock(&f->lock);
    while (!r->done) pthread_cond_wait(&f->cond, &f->lock);
    pthread_mutex_unlock(&f->lock);
    release(r);
    return CKPTIO_OK;
}
