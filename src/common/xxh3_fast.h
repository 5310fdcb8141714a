/*
 * xxh3_fast.h - XXH3 for the library's checksums (manifests, DCP item
 * hashes, verify): libxxhash's own functions, through its x86 dispatcher
 * where the library exports one (CMakeLists.txt checks). The dispatcher
 * picks the AVX2 or AVX-512 code at run time; the shared library's plain
 * functions are built for the baseline x86-64 (SSE2) and hash at about
 * half that speed on machines that have either. The digests are the same.
 * Include this instead of <xxhash.h>; XXH3_64bits and XXH3_64bits_update
 * then name the dispatched functions, reset and digest are unchanged.
 */
#ifndef CKPTIO_XXH3_FAST_H
#define CKPTIO_XXH3_FAST_H

#include <xxhash.h>
#if defined(CKPTIO_HAVE_XXH_DISPATCH)
#include <xxh_x86dispatch.h>
#endif

#endif /* CKPTIO_XXH3_FAST_H */
