/*
 * cli_commands.h - the list of `ckptio` subcommands.
 *
 * Adding a subcommand is one line here plus its own file tools/cmd_<name>.c
 * defining `int cli_cmd_<name>(int argc, char **argv)`. The list expands
 * both into the prototypes (cli.h) and into the dispatch table (cli_main.c),
 * so nothing else needs editing. Order here is the order `ckptio --help`
 * prints.
 *
 * X(name, one-line summary)
 */
#ifndef CKPTIO_CLI_COMMANDS_H
#define CKPTIO_CLI_COMMANDS_H

#define CLI_COMMAND_LIST(X)                                                          \
    X(inspect, "list the tensors, dtypes, shapes, sizes, offsets and metadata of a file") \
    X(verify, "check a file's structure and read all of its data")                  \
    X(convert, "convert between torch.save and safetensors files")                  \
    X(clean, "remove temporaries that crashed saves left in a directory")           \
    X(bench, "measure save/load speed against the disk's raw ceilings")

#endif /* CKPTIO_CLI_COMMANDS_H */
