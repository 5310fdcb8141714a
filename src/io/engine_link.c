/*
 * engine_link.c - how files reach the engine they were opened with.
 *
 * src/io sits below src/engine: a file needs its engine's settings (direct
 * mode, read cache, sync), counts its transfers in the engine's statistics
 * and keeps the engine from being destroyed while it is open, but must not
 * call the engine. src/engine registers a ckptio__engine_link table when it
 * creates an engine; these wrappers call through it.
 */
#include "io_internal.h"

static const ckptio__engine_link *_Atomic registered;

void ckptio__io_set_engine_link(const ckptio__engine_link *link) {
    atomic_store_explicit(&registered, link, memory_order_release);
}

/* Files exist only after an engine was created, which registered the table. */
static const ckptio__engine_link *current(void) { return atomic_load_explicit(&registered, memory_order_acquire); }

int64_t ckptio__io_engine_setting(const ckptio_engine *engine, ckptio_option option) {
    return current()->setting(engine, option);
}

void ckptio__io_engine_stats_add(ckptio_engine *engine, const ckptio_stats *delta) {
    current()->stats_add(engine, delta);
}

void ckptio__io_engine_file_ref(ckptio_engine *engine, int delta) { current()->file_ref(engine, delta); }

ckptio_status ckptio__io_engine_commit_poll(ckptio_engine *engine) { return current()->commit_poll(engine); }

ckptio__s3_part_pool *ckptio__io_engine_part_pool(ckptio_engine *engine) { return current()->part_pool(engine); }

_Atomic(struct ckptio__object_peek *) *ckptio__io_engine_peek_slot(ckptio_engine *engine) {
    return current()->peek_slot(engine);
}
