/*
 * ckptio/convert.h - converting any checkpoint into any other: a safetensors
 * file, a Hugging Face directory, a torch.save file, a DCP directory
 * (docs/CLI.md "ckptio convert").
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_CONVERT_H
#define CKPTIO_CONVERT_H

#include "file.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/convert.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Converting any checkpoint into any other                                 */
/* ------------------------------------------------------------------------ */
/* (docs/CLI.md "ckptio convert")
 * Every pair of these converts, in both directions and each into itself
 * (a re-layout, or resharding of a directory): a safetensors file, a
 * Hugging Face directory (or its *.index.json), a torch.save file and a
 * torch.distributed.checkpoint (DCP) directory. Tensors are read one at a
 * time (DCP output: in batches of at most max(largest tensor, 64 MiB))
 * through the engine, never memory-mapped, and written as their peers'
 * writers write them. What the output cannot hold (non-tensor values of a
 * torch.save file, byte items of a DCP directory going to a format without
 * them, __metadata__ going to a format without it) is named in notes before
 * anything is written; the tensors always arrive bit for bit. */

/* What ckptio_convert() writes. */
typedef enum ckptio_convert_to {
    CKPTIO_CONVERT_AUTO = 0,        /* decided by OUT's name, see ckptio_convert() */
    CKPTIO_CONVERT_SAFETENSORS = 1, /* one safetensors file */
    CKPTIO_CONVERT_HF = 2,          /* a Hugging Face directory: model.safetensors, or shards
                                     * model-0000k-of-0000n.safetensors + model.safetensors.index.json */
    CKPTIO_CONVERT_TORCH = 3,       /* a torch.save file: a flat OrderedDict name -> tensor */
    CKPTIO_CONVERT_DCP = 4          /* a DCP directory written as ckptio.dcp writes one (one process,
                                     * each tensor one chunk, with a checksum manifest) */
} ckptio_convert_to;

/* Receives one line (no newline) saying what OUT will not hold; called
 * before anything is written. The line may name tensors and keys taken from
 * the input: quote it before showing it on a terminal. */
typedef void (*ckptio_convert_note_fn)(const char *note, void *user);

typedef struct ckptio_convert_options {
    ckptio_convert_to to;
    uint64_t shard_size;            /* CKPTIO_CONVERT_HF: the largest shard in bytes; 0 = 5 GB (5 x 10^9),
                                     * huggingface_hub's default */
    uint32_t storage_alignment;     /* CKPTIO_CONVERT_TORCH: 1..65536; 0 = 4096 */
    ckptio_convert_note_fn note;    /* may be NULL */
    void *user;
} ckptio_convert_options;

/* What a conversion did. */
typedef struct ckptio_convert_report {
    ckptio_format from;             /* SAFETENSORS, TORCH, DCP or HF_INDEX (any Hugging Face directory) */
    ckptio_convert_to to;           /* what was written (AUTO resolved) */
    size_t tensors;
    uint64_t bytes;                 /* tensor bytes written */
    size_t files;                   /* files of tensor data written (shards, DCP data files; 1 for a file) */
    size_t byte_items;              /* DCP -> DCP: byte items carried */
    size_t dropped;                 /* values, byte items and __metadata__ entries OUT does not hold */
    size_t shared;                  /* torch.save input: tensors that shared a storage, written as copies */
} ckptio_convert_report;

/*! ckptio_convert() :
 * Converts the checkpoint at `in` (its format detected as
 * ckptio_format_detect() does; a directory without .metadata is opened as a
 * Hugging Face directory, ckptio_model_open) into `out`.
 * With CKPTIO_CONVERT_AUTO, OUT's name decides: "*.safetensors" a
 * safetensors file; "*.pt", "*.pth", "*.bin", "*.ckpt" a torch.save file;
 * a name ending in '/' or an existing directory a directory: the Hugging
 * Face layout for a DCP input, else CKPTIO_E_INVAL (say CKPTIO_CONVERT_HF or
 * CKPTIO_CONVERT_DCP); any other name the other kind of file (safetensors or
 * a Hugging Face directory -> torch.save, torch.save -> safetensors) or, for
 * a DCP input, a Hugging Face directory; shard_size > 0 means
 * CKPTIO_CONVERT_HF.
 * Checked before anything is written, each failing with a message that says
 * why: the input parses (its tensors' table), every dtype exists in OUT's
 * format (CKPTIO_E_UNSUPPORTED naming the tensor), a file OUT is not a
 * directory, a directory OUT does not exist or is empty (CKPTIO_E_EXISTS:
 * ckptio never writes into a directory holding other files). Output is
 * atomic: a file through a temporary renamed over OUT (an older file OUT is
 * replaced only on success); a directory is built in a new sibling
 * ".OUT.ckptio-tmp-XXXXXX" and renamed to OUT at the end (fsyncs with
 * CKPTIO_OPT_SYNC), removed on failure. `options` may be NULL, `report`
 * too. Thread-safe for distinct outputs. */
CKPTIO_API ckptio_status ckptio_convert(ckptio_engine *engine, const char *in, const char *out,
                                        const ckptio_convert_options *options, ckptio_convert_report *report);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_CONVERT_H */
