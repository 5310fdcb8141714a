/*
 * plan_run.c - ckptio_engine_execute_extents(): a plan built, executed and
 * destroyed in one call, the sequence most callers of the engine need
 * (the formats' reads and writes, the GDS API's host path, the Python
 * extension, the CLI), written once.
 */
#include "engine_internal.h"

ckptio_status ckptio_engine_execute_extents(ckptio_engine *engine, ckptio_direction direction,
                                            const ckptio_extent *extents, size_t count) {
    CKPTIO_RETURN_IF(count && !extents, CKPTIO_E_INVAL,
                     "ckptio_engine_execute_extents: extents is NULL but count is %zu", count);
    ckptio_plan *plan = NULL;
    ckptio_status st = ckptio_plan_create(direction, &plan);
    for (size_t i = 0; st == CKPTIO_OK && i < count; i++) st = ckptio_plan_add(plan, &extents[i]);
    if (st == CKPTIO_OK) st = ckptio_engine_execute(engine, plan);
    ckptio_plan_destroy(plan); /* the first error stands: destroying a valid plan does not fail */
    return st;
}
