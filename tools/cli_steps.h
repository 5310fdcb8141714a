/*
 * cli_steps.h - the `ckptio` subcommands' branches for a checkpoint
 * manager's root (step_NNNNNNNN directories, include/ckptio/steps.h "Checkpoint
 * manager"): inspect, verify and clean call these when their operand is one.
 */
#ifndef CKPTIO_CLI_STEPS_H
#define CKPTIO_CLI_STEPS_H

#include "cli.h"

/* True when `path` is a directory without .metadata holding at least one
 * step directory. */
bool cli_steps_is_root(const char *path);

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
