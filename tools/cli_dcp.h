/*
 * cli_dcp.h - the `ckptio` subcommands' branches for checkpoint
 * directories: torch.distributed.checkpoint (DCP) directories (a .metadata
 * inside) and models (Hugging Face directories and indexes, *.safetensors
 * directories). inspect and verify call these when their operand is one
 * (convert is ckptio_convert's, for every format).
 */
#ifndef CKPTIO_CLI_DCP_H
#define CKPTIO_CLI_DCP_H

#include "cli.h"

/* `ckptio inspect DIR [--json]` (cmd_dcp_dir.c). */
int cli_dcp_inspect(ckptio_engine *engine, const char *dir, bool json);

/* `ckptio verify DIR`: checksums against the ckptio manifest, or without
 * one a structural check, said so in the result line (cmd_dcp_dir.c). */
int cli_dcp_verify(ckptio_engine *engine, const char *dir, bool quiet);

/* Whether inspect and verify take a path of format `format`
 * (ckptio_format_detect) as a model: a Hugging Face index, or a directory
 * that is not DCP (the rule ckptio.load and ckptio_convert follow;
 * ckptio_model_open then decides what the directory holds: model.safetensors,
 * an index, or its *.safetensors files). */
bool cli_is_model(ckptio_format format);

/* `ckptio inspect` / `ckptio verify` on a model (a directory, an index, as
 * ckptio_model_open opens them): tensors across shards, each shard
 * validated and read (cmd_hf_index.c). */
int cli_hf_inspect(ckptio_engine *engine, const char *model, bool json);
int cli_hf_verify(ckptio_engine *engine, const char *model, bool quiet);

#endif /* CKPTIO_CLI_DCP_H */
