/*
 * gpu_engine.c - ckptio_engine_create(): an engine with the GPU layer
 * plugged in.
 *
 * The engine (src/engine) sits below the GPU layer and knows it only as a
 * ckptio__device_provider, the table it defines in engine_internal.h. This
 * file fills that table in and hands it to every engine the public API
 * creates, so that anything that creates an engine also links the GPU layer
 * (a static link included) without the engine calling up into src/gpu.
 */
#include "engine_internal.h"
#include "gpu_internal.h"

static const ckptio__device_provider gpu_provider = {
    .classify = ckptio__gpu_classify,
    .execute = ckptio__gpu_execute_observed,
};

ckptio_status ckptio_engine_create(ckptio_engine **out) { return ckptio__engine_create(&gpu_provider, out); }
