/*
 * ckpy_mapping.h - what ckpy_mapping.c (Mapping objects: a file mapped into
 * memory) offers the parts above it (ckpy_model.c, ckpy_torch.c).
 */
#ifndef CKPY_MAPPING_H
#define CKPY_MAPPING_H

#include "ckpy_internal.h"

/* A Mapping object owning `mapping` (released on failure too). */
PyObject *ckpy_mapping_wrap(ckptio_mapping *mapping);

#endif /* CKPY_MAPPING_H */
