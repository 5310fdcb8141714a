/*
 * cli_commands.h - the list of `ckptio` subcommands.
 *
 * Adding a subcommand is one line here plus its own file tools/cmd_<name>.c
 * defining `int cli_cmd_<name>(int argc, char **argv)`. The list expands
 * both into the prototypes (cli.h) and into the dispatch table (cli_main.c),
 * so nothing else needs editing. Order here is the order `ckptio --help`
 * prints.
 *
 * X(name, operands, one-line summary): the operands as the command's own
 * usage line ends them, and a summary that fits an 80-column line
 * (tests/python/test_cli.py checks both).
 */
#ifndef CKPTIO_CLI_COMMANDS_H
#define CKPTIO_CLI_COMMANDS_H

#define CLI_COMMAND_LIST(X)                                                              \
    X(inspect, "FILE|DIR", "list tensors, dtypes, shapes, offsets and metadata")      \
    X(verify, "FILE|DIR|ROOT...", "check structure and read every byte (checksums)")  \
    X(convert, "IN OUT", "any pair of safetensors, torch.save, HF and DCP")            \
    X(clean, "DIR...", "remove what crashed saves left behind")                       \
    X(bench, "[OPTIONS]", "measure save/load speed against the disk's ceilings")

#endif /* CKPTIO_CLI_COMMANDS_H */
