/*
 * ckptio.h - libckptio's API: includes the headers of include/ckptio/.
 *
 *   ckptio/core.h         version, errors, dtypes, engine and settings, files,
 *                         plans, shared tensor types, hashing          stable
 *   ckptio/file.h         format detection, writers' own files, cleanup of
 *                         crashed saves' temporaries                   experimental
 *   ckptio/safetensors.h  safetensors files and their checksums        experimental
 *   ckptio/gpu.h          CUDA access, the GDS file API                experimental
 *   ckptio/torch.h        torch.save files, conversion with safetensors experimental
 *   ckptio/dcp.h          torch.distributed.checkpoint directories     experimental
 *   ckptio/model.h        models (Hugging Face directories), slices    experimental
 *   ckptio/steps.h        a checkpoint manager's steps                 experimental
 *   ckptio/object.h       s3:// objects                                experimental
 *   ckptio/snapshot.h     training state copied into a pinned pool     experimental
 *   ckptio/convert.h      any of these checkpoints into any other      experimental
 *
 * Only ckptio/core.h is declared stable before ckptio 1.0. The experimental
 * headers may change in any minor version, so a program opts in to them
 * (as zstd's ZSTD_STATIC_LINKING_ONLY does): it defines CKPTIO_EXPERIMENTAL
 * before including ckptio.h, which then includes them all; without it,
 * ckptio.h declares the core only. docs/API.md lists what each holds.
 */
#ifndef CKPTIO_H
#define CKPTIO_H

#include "ckptio/core.h"

#ifdef CKPTIO_EXPERIMENTAL
#include "ckptio/file.h"
#include "ckptio/safetensors.h"
#include "ckptio/gpu.h"
#include "ckptio/torch.h"
#include "ckptio/dcp.h"
#include "ckptio/model.h"
#include "ckptio/steps.h"
#include "ckptio/object.h"
#include "ckptio/snapshot.h"
#include "ckptio/convert.h"
#endif

#endif /* CKPTIO_H */
