/*
 * gds_internal.h - the GDS file handle, shared by gds_file.c (open,
 * registration, close), gds_transfer.c (the transfers) and gds_async.c
 * (stream-ordered requests and the file's background thread). Calls go one
 * way: gds_file.c -> gds_async.c -> gds_transfer.c.
 */
#ifndef CKPTIO_GDS_INTERNAL_H
#define CKPTIO_GDS_INTERNAL_H

#include "cufile_shim.h"
#include "gpu_ops.h"

#include <pthread.h>

struct ckptio_gds_file {
    ckptio_engine *engine;
    ckptio_file *file;
    bool registered;               /* cuFile handle registered and used for device buffers */
    ckptio__cufile_handle handle;
    char refusal[640];             /* why cuFile is not used ("" if it is / not tried) */
    _Atomic int last_path;         /* ckptio_io_path */
    /* async requests: FIFO run by one background thread, started on first use */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct ckptio_gds_request *head, *tail;
    unsigned outstanding;          /* submitted and not yet finished */
    bool thread_started, stop;
    pthread_t thread;
    unsigned generation;           /* ckptio__fork_generation() at open */
};

/* One synchronous transfer (gds_transfer.c) (the work function of both the synchronous and
 * the asynchronous calls). *bytes receives the count moved. */
ckptio_status ckptio__gds_transfer(ckptio_gds_file *f, ckptio_direction dir, void *buf, uint64_t size,
                                   uint64_t file_offset, uint64_t buf_offset, uint64_t *bytes);

/* Stops the background thread (gds_async.c) after the queued requests ran (close). */
void ckptio__gds_async_shutdown(ckptio_gds_file *f);

#endif /* CKPTIO_GDS_INTERNAL_H */
