/*
 * cli_steps.h - the `ckptio` subcommands' branches for a checkpoint
 * manager's root (step_NNNNNNNN directories, include/ckptio/steps.h "Checkpoint
 * manager"): inspect, verify and clean call these when their operand is one.
 */
#ifndef CKPTIO_CLI_STEPS_H
#define CKPTIO_CLI_STEPS_H

#include "cli.h"

/* True when `path` is a directory without .metadata holding at least one
 * step directory. An s3:// path's format is detected on `engine` (NULL: a
 * temporary engine), which keeps the probe's GET for the open that follows;
 * *detected says whether `*format` holds it (both may be NULL), so that the
 * caller does not ask the server again. */
bool cli_steps_is_root(ckptio_engine *engine, const char *path, ckptio_format *format, bool *detected);

/* `ckptio inspect ROOT [--json]`: every step, its state (fast check), files
 * and size. */
int cli_steps_inspect(ckptio_engine *engine, const char *root, bool json);

/* `ckptio verify ROOT [--latest]`: every step fully checked; with latest
 * only the newest complete step that verifies (and why newer ones do not). */
int cli_steps_verify(ckptio_engine *engine, const char *root, bool latest, bool quiet);

/* `ckptio clean ROOT`: removes the partial steps, unless a save holds the
 * root's lock. */
int cli_steps_clean(const char *root, bool quiet);

#endif /* CKPTIO_CLI_STEPS_H */
