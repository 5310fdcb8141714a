/*
 * ckpy_internal.h - the ground every file of the ckptio._ckptio extension
 * stands on: CPython's limited API and libckptio's public header. Each file
 * then includes the headers of the files it uses, which sit below it
 * (scripts/check_layers.py keeps it so, docs/ARCHITECTURE.md draws it):
 *
 *   ckpy_module.c                     the module: gathers the parts (ckpy_parts.h)
 *   ckpy_safetensors.c, ckpy_torch*.c, ckpy_pickle.c, ckpy_model.c, ckpy_gds.c,
 *   ckpy_steps.c, ckpy_dcp.c, ckpy_dcp_commit.c, ckpy_convert.c,
 *   ckpy_snapshot.c                   the parts, one per area
 *   ckpy_file.c                       File objects (ckpy_file.h: for ckpy_dcp.c)
 *   ckpy_handle.c                     objects wrapping one C handle
 *   ckpy_engine.c                     Engine objects, the default engine
 *   ckpy_call.c                       a C call: GIL released, locks, signals, fork
 *   ckpy_values.c                     errors as exceptions, Python <-> C values
 *
 * The extension is built against CPython's stable ABI (Py_LIMITED_API
 * 3.8, an abi3 module), so one binary imports on every CPython >= 3.8. That
 * rules out the buffer protocol (limited API only from 3.11): Python code
 * hands memory over as integer addresses (tensor.data_ptr(),
 * ndarray.ctypes.data) and keeps the owning objects alive for the call.
 *
 * Every call that does I/O drops the GIL (Py_BEGIN_ALLOW_THREADS) and
 * serialises on the locks of the handles it uses instead, because a ckptio
 * handle is used by one thread at a time. Locks are only ever taken with the
 * GIL released and released before taking the GIL back, so the GIL and
 * these locks cannot deadlock. Order: reader/file lock, then engine lock.
 *
 * Such a call stays interruptible (Ctrl-C cancels a save or load instead of
 * letting it finish) and survives fork(): ckpy_call.c has both.
 */
#ifndef CKPY_INTERNAL_H
#define CKPY_INTERNAL_H

#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x03080000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The package is built on the whole API, the experimental headers included (CKPTIO_EXPERIMENTAL, set
 * by the build for everything that ships with the library). */
#include "ckptio.h"

#include <stdatomic.h>
#include <stdint.h>

#endif /* CKPY_INTERNAL_H */
