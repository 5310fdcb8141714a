/*
 * cmd_clean.c - `ckptio clean DIR...`: remove the temporaries
 * (".NAME.ckptio-tmp-XXXXXX") that crashed or killed saves left behind.
 *
 * Only temporaries no live writer holds are removed (every writer keeps an
 * flock on its temporary until it commits or closes, and the kernel drops
 * it when the writer dies), so running this next to a save in progress is
 * safe. Symlinks and directories with such names are never touched.
 */
#include "cli.h"
#include "cli_steps.h"

#include "ckptio.h" /* ckptio_object_abort_uploads (ckptio/object.h) */

#include <stdlib.h>
#include <string.h>

/* An object store cannot tell a live upload from a dead one: by default
 * only uploads begun this long ago are aborted (a save's upload that runs
 * longer is aborted too: give --min-age when saves take longer). */
#define OBJECT_MIN_AGE 3600.0

/* `ckptio clean s3://BUCKET/PREFIX`: the unfinished multipart uploads under
 * the prefix (killed saves' parts: invisible, billed) are aborted; objects
 * are never touched. */
static int clean_uploads(const char *url, double min_age, bool quiet) {
    ckptio_engine *engine = cli_engine_create();
    if (!engine) return CLI_EXIT_FAIL;
    char prefix[4096];
    const size_t n = strlen(url);
    /* "s3://b/run" means the directory run/: not run2/ too */
    const bool bucket_only = strchr(url + 5, '/') == NULL || strchr(url + 5, '/') == url + n - 1;
    if ((size_t)snprintf(prefix, sizeof prefix, "%s%s", url, bucket_only || url[n - 1] == '/' ? "" : "/") >=
        sizeof prefix) {
        ckptio_engine_destroy(engine);
        return cli_error("%s: too long", url), CLI_EXIT_FAIL;
    }
    uint64_t aborted = 0;
    const ckptio_status st = ckptio_object_abort_uploads(engine, prefix, min_age, &aborted);
    ckptio_engine_destroy(engine);
    if (st != CKPTIO_OK) return cli_error_lib(url, st);
    if (!quiet)
        printf("%s: aborted %llu unfinished upload%s begun at least %.0f s ago (objects are not touched)\n", cli_q(url),
               (unsigned long long)aborted, aborted == 1 ? "" : "s", min_age);
    return CLI_EXIT_OK;
}

static const cli_usage usage = {
    "clean",
    "usage: ckptio clean [--min-age SECONDS] [--quiet] DIR...\n",
    "\nRemoves from each DIR (not recursively) the temporaries of atomic saves\n"
    "(.NAME.ckptio-tmp-XXXXXX) that no running save holds: those left by a save\n"
    "that crashed or was killed. A save in progress keeps its temporary.\n"
    "A checkpoint manager's ROOT (step_NNNNNNNN directories) also has its partial\n"
    "steps removed (saves the manager began that crashed before their commit\n"
    "marker), unless a save holds the root's lock (then nothing is removed and the\n"
    "exit status is 1). Step directories the manager did not begin (torch's own\n"
    "DCP writer's, copies) and steps holding anything the manager does not write\n"
    "are never removed: each is listed with the reason it was left alone.\n"
    "Prints one line per DIR: removed, bytes freed, and what was kept.\n"
    "An object store prefix (s3://BUCKET/PREFIX) has the unfinished multipart\n"
    "uploads under it aborted (what killed saves leave: invisible, billed) that\n"
    "began at least --min-age seconds ago (default 3600 there: a store cannot tell\n"
    "a live upload from a dead one); objects are never touched. A manager's ROOT\n"
    "there has its partial steps removed (and their uploads aborted) under the\n"
    "root's lease, as on a file system.\n"
    "\noptions:\n"
    "  -a, --min-age SECONDS  also keep temporaries modified less than SECONDS ago\n"
    "                         (default 0: liveness is decided by the writer's lock)\n"
    "  -q, --quiet            print nothing when all went well\n"
    "  -h, --help             show this help\n"
    "\nexit status: 0 done, 1 a directory could not be read or a temporary could not\n"
    "be removed, 2 bad command line, 130/143 interrupted by SIGINT/SIGTERM\n",
};

int cli_cmd_clean(int argc, char **argv) {
    static const struct option longopts[] = {
        {"min-age", required_argument, NULL, 'a'},
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool quiet = false, age_given = false;
    uint64_t min_age = 0;
    for (int c; (c = cli_next_option(argc, argv, "a:qh", longopts, &usage)) != CLI_OPT_END;) {
        switch (c) {
        case 'h': cli_usage_print(&usage); return CLI_EXIT_OK;
        case 'q': quiet = true; break;
        case 'a':
            if (cli_parse_uint(optarg, 0, 100u * 365 * 86400, &min_age) != 0)
                return cli_usage_error(&usage, "--min-age wants whole seconds, got '%s'", optarg);
            age_given = true;
            break;
        default: return CLI_EXIT_USAGE;
        }
    }
    if (optind >= argc) return cli_usage_error(&usage, "no DIR given");
    int rc = CLI_EXIT_OK;
    for (int i = optind; i < argc; i++) {
        if (cli_steps_is_root(NULL, argv[i], NULL, NULL) && cli_steps_clean(argv[i], quiet) != CLI_EXIT_OK)
            rc = CLI_EXIT_FAIL;
        if (cli_is_object(argv[i])) {
            if (clean_uploads(argv[i], age_given ? (double)min_age : OBJECT_MIN_AGE, quiet) != CLI_EXIT_OK)
                rc = CLI_EXIT_FAIL;
            continue;
        }
        ckptio_cleanup_report r;
        const ckptio_status st = ckptio_cleanup_temporaries(argv[i], NULL, (double)min_age, &r);
        if (st != CKPTIO_OK) {
            /* A directory that could not be read: the error is the whole answer.
             * A scan that removed some files before one failed also says what it did. */
            cli_error_lib(argv[i], st);
            rc = CLI_EXIT_FAIL;
            if (r.removed == 0) continue;
        }
        if (!quiet || st != CKPTIO_OK) {
            char freed[32];
            printf("%s: removed %zu stale temporar%s (%s); kept %zu in use, %zu younger than %llu s; %zu not regular "
                   "files left alone\n",
                   cli_q(argv[i]), r.removed, r.removed == 1 ? "y" : "ies",
                   cli_format_bytes(r.bytes_freed, freed, sizeof freed), r.busy, r.young, (unsigned long long)min_age,
                   r.ignored);
        }
    }
    return rc;
}
