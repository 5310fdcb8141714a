/*
 * cli_main.c - `ckptio`: entry point, global options, subcommand dispatch.
 *
 * The subcommands come from CLI_COMMAND_LIST (cli_commands.h); this file
 * never needs editing to add one.
 */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

typedef struct cli_command {
    const char *name;
    const char *operands;
    const char *summary;
    int (*run)(int argc, char **argv);
} cli_command;

static const cli_command commands[] = {
#define CLI_X_ENTRY_(name, operands, summary) {#name, operands, summary, cli_cmd_##name},
    CLI_COMMAND_LIST(CLI_X_ENTRY_)
#undef CLI_X_ENTRY_
};

static const cli_usage main_usage = {
    NULL,
    "usage: ckptio [--help | --version] COMMAND [OPTIONS] [ARGS]\n",
    NULL, /* built by print_help() from the command table */
};

static void print_help(void) {
    fputs(main_usage.synopsis, stdout);
    fputs("\nckptio moves tensor checkpoints between memory and storage at disk speed.\n"
          "\ncommands:\n",
          stdout);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        printf("  %-8s %-17s %s\n", commands[i].name, commands[i].operands, commands[i].summary);
    fputs("\nFILE: a safetensors or torch.save file; DIR: a torch.distributed.checkpoint\n"
          "(DCP) directory or a Hugging Face directory; ROOT: a checkpoint manager's root\n"
          "(step_NNNNNNNN directories); IN, OUT: any FILE or DIR.\n"
          "\noptions:\n"
          "  -h, --help     show this help (or 'ckptio COMMAND --help' for a command)\n"
          "  -V, --version  show the version of ckptio and of the library it runs\n"
          "\nexit status: 0 success, 1 failure (invalid file, I/O error), 2 bad command line,\n"
          "130 / 143 interrupted by SIGINT / SIGTERM (the work in flight canceled and\n"
          "cleaned up).\n"
          "Engine settings come from the environment: CKPTIO_THREADS, CKPTIO_BACKEND,\n"
          "CKPTIO_DIRECT, CKPTIO_CHUNK_BYTES, ... (docs/CLI.md).\n",
          stdout);
}

/* A misspelt setting (CKPTIO_THREDS=4) would be ignored without a word. */
static void warn_unknown_env(void) {
    char text[2048];
    size_t unknown = 0;
    if (ckptio_env_check(text, sizeof text, &unknown) != CKPTIO_OK || unknown == 0) return;
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) break; /* cut short: the rest did not fit */
        *nl = '\0';
        cli_warning("%s", cli_q(line));
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return cli_usage_error(&main_usage, "no command given");
    const char *first = argv[1];
    if (strcmp(first, "-h") == 0 || strcmp(first, "--help") == 0 || strcmp(first, "help") == 0) {
        /* "ckptio help CMD" is "ckptio CMD --help". */
        if (strcmp(first, "help") == 0 && argc >= 3) {
            for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
                if (strcmp(argv[2], commands[i].name) == 0) {
                    char *help_argv[] = {argv[2], (char *)"--help", NULL};
                    cli_options_reset();
                    return commands[i].run(2, help_argv);
                }
            return cli_usage_error(&main_usage, "unknown command '%s'", argv[2]);
        }
        print_help();
        return CLI_EXIT_OK;
    }
    if (strcmp(first, "-V") == 0 || strcmp(first, "--version") == 0) {
        /* The tool and the shared library can come from different builds. */
        printf("ckptio %d.%d.%d (libckptio %s)\n", CKPTIO_VERSION_MAJOR, CKPTIO_VERSION_MINOR,
               CKPTIO_VERSION_PATCH, ckptio_version());
        return CLI_EXIT_OK;
    }
    if (first[0] == '-') return cli_usage_error(&main_usage, "unknown option '%s'", first);

    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(first, commands[i].name) == 0) {
            warn_unknown_env();
            cli_options_reset();
            cli_catch_interrupts();
            int rc = commands[i].run(argc - 1, argv + 1);
            if (fflush(stdout) != 0 && rc == CLI_EXIT_OK) {
                cli_error("writing to standard output failed");
                rc = CLI_EXIT_FAIL;
            }
            return cli_interrupted ? cli_interrupted_status() : rc;
        }
    }
    return cli_usage_error(&main_usage, "unknown command '%s'", first);
}
