/*
 * cli_dcp.h - the `ckptio` subcommands' branches for checkpoint
 * directories: torch.distributed.checkpoint (DCP) directories (a .metadata
 * inside) and Hugging Face sharded safetensors (model.safetensors.index.json).
 * inspect, verify and convert call these when their operand is one.
 */
#ifndef CKPTIO_CLI_DCP_H
#define CKPTIO_CLI_DCP_H

#include "cli.h"

/* `ckptio inspect DIR [--json]` (cmd_dcp_dir.c). */
int cli_dcp_inspect(ckptio_engine *engine, const char *dir, bool json);

/* `ckptio verify DIR`: checksums against the ckptio manifest, or without
 * one a structural check, said so in the result line (cmd_dcp_dir.c). */
int cli_dcp_verify(ckptio_engine *engine, const char *dir, bool quiet);

/* `ckptio convert DIR OUT`: one safetensors file, or with shard_size > 0
 * (or an OUT without the .safetensors suffix) the Hugging Face sharded
 * layout in directory OUT (cmd_dcp_convert.c). shard_size 0 with a
 * directory OUT means 5 GB. */
int cli_dcp_convert(ckptio_engine *engine, const char *dir, const char *out, uint64_t shard_size, bool quiet);

/* Whether inspect, verify and convert take a path of format `format`
 * (ckptio_format_detect) as a model: a Hugging Face index, or a directory
 * that is not DCP (the rule ckptio.load follows; ckptio_model_open then
 * decides what the directory holds: model.safetensors, an index, or its
 * *.safetensors files). */
bool cli_is_model(ckptio_format format);

/* `ckptio inspect` / `ckptio verify` / `ckptio convert` on a model (a
 * directory, an index, as ckptio_model_open opens them): tensors across
 * shards, each shard validated and read (cmd_hf_index.c). */
int cli_hf_inspect(ckptio_engine *engine, const char *model, bool json);
int cli_hf_verify(ckptio_engine *engine, const char *model, bool quiet);
int cli_hf_convert(ckptio_engine *engine, const char *model, const char *out, uint32_t alignment, bool quiet);

#endif /* CKPTIO_CLI_DCP_H */
