/*
 * cli_dcp.h - the `ckptio` subcommands' branches for checkpoint
 * directories: torch.distributed.checkpoint (DCP) directories (a .metadata
 * inside) and Hugging Face sharded safetensors (model.safetensors.index.json).
 * inspect and verify call these when their operand is one (convert is
 * ckptio_convert's, for every format).
 */
#ifndef CKPTIO_CLI_DCP_H
#define CKPTIO_CLI_DCP_H

#include "cli.h"

/* The index file of `path`, which ckptio_format_detect called
 * CKPTIO_FORMAT_HF_INDEX: the path itself, or DIR/model.safetensors.index.json
 * for a directory. *index receives it (cap bytes); false when it does not fit. */
bool cli_hf_index_path(const char *path, char *index, size_t cap);

/* `ckptio inspect DIR [--json]` (cmd_dcp_dir.c). */
int cli_dcp_inspect(ckptio_engine *engine, const char *dir, bool json);

/* `ckptio verify DIR`: checksums against the ckptio manifest, or without
 * one a structural check, said so in the result line (cmd_dcp_dir.c). */
int cli_dcp_verify(ckptio_engine *engine, const char *dir, bool quiet);

/* `ckptio inspect` / `ckptio verify` on a Hugging Face index: tensors across
 * shards, each shard validated and read (cmd_hf_index.c). */
int cli_hf_inspect(ckptio_engine *engine, const char *index, bool json);
int cli_hf_verify(ckptio_engine *engine, const char *index, bool quiet);

#endif /* CKPTIO_CLI_DCP_H */
