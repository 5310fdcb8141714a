/*
 * ckpy_engine.h - ckptio._ckptio.Engine and the module's default engine
 * (ckpy_engine.c).
 */
#ifndef CKPY_ENGINE_H
#define CKPY_ENGINE_H

#include "ckpy_call.h"

extern PyTypeObject *ckpy_engine_type;

/* Resolves an `engine=` argument: None gives the module's default engine
 * (created on first use). @return a new reference, or NULL with an error. */
ckpy_engine *ckpy_engine_resolve(PyObject *arg);

int ckpy_engine_add_to_module(PyObject *module);

/* Frees the default engine (module teardown). */
void ckpy_engine_module_free(void);

#endif /* CKPY_ENGINE_H */
