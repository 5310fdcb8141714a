/*
 * cmd_steps.c - `ckptio inspect|verify|clean ROOT` for the root of a
 * checkpoint manager (ckptio.CheckpointManager): its steps, their states
 * (complete, partial, damaged, foreign, refused) and sizes; which step a restarted
 * job would resume from; removing what crashed saves left, and saying what
 * was left alone and why.
 */
#include "cli_steps.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *state_name(ckptio_step_state s) {
    return s == CKPTIO_STEP_COMPLETE  ? "complete"
           : s == CKPTIO_STEP_PARTIAL ? "partial"
           : s == CKPTIO_STEP_FOREIGN ? "foreign"
           : s == CKPTIO_STEP_REFUSED ? "refused"
                                      : "damaged";
}

bool cli_steps_is_root(ckptio_engine *engine, const char *path, ckptio_format *format, bool *detected) {
    struct stat sb;
    char md[4096];
    ckptio_format found;
    if (detected) *detected = false;
    if (cli_is_object(path)) { /* a prefix (not a DCP checkpoint itself) with step_NNNNNNNN prefixes under it */
        if (ckptio_format_detect_engine(engine, path, &found) != CKPTIO_OK) return false;
        if (format) *format = found;
        if (detected) *detected = true;
        if (found != CKPTIO_FORMAT_DIRECTORY) return false;
    } else {
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return false;
        if (snprintf(md, sizeof md, "%s/.metadata", path) >= (int)sizeof md || lstat(md, &sb) == 0) return false;
    }
    ckptio_step_info *steps = NULL;
    size_t n = 0;
    const bool root = ckptio_steps_scan(path, &steps, &n) == CKPTIO_OK && n > 0;
    ckptio_steps_free(steps);
    return root;
}

/* Every step of ROOT checked with `check`, ascending. */
static int check_all(ckptio_engine *engine, const char *root, ckptio_step_check check, ckptio_step_info **out,
                     size_t *count) {
    ckptio_status st = ckptio_steps_scan(root, out, count);
    if (st != CKPTIO_OK) return cli_error_lib(root, st);
    for (size_t i = 0; i < *count; i++) {
        ckptio_step_info info;
        st = ckptio_steps_check(engine, root, (*out)[i].step, check, &info);
        if (cli_interrupted) { /* a check the signal cut short says nothing about the step */
            ckptio_steps_free(*out);
            return CLI_EXIT_FAIL;
        }
        if (st == CKPTIO_OK) (*out)[i] = info;
        else if (st != CKPTIO_E_NOT_FOUND) { /* removed meanwhile: keep what the scan saw */
            ckptio_steps_free(*out);
            return cli_error_lib(root, st);
        }
    }
    return CLI_EXIT_OK;
}

static int print_json(const char *root, const ckptio_step_info *steps, size_t n) {
    json_t *doc = json_object(), *arr = json_array();
    bool oom = !doc || !arr;
    for (size_t i = 0; !oom && i < n; i++) {
        json_t *o = json_pack("{s:I,s:s,s:I,s:I,s:s}", "step", (json_int_t)steps[i].step, "state",
                              state_name(steps[i].state), "bytes", (json_int_t)steps[i].bytes, "files",
                              (json_int_t)steps[i].files, "reason", steps[i].reason);
        oom = !o || json_array_append_new(arr, o) != 0;
    }
    if (!oom) oom = json_object_set_new(doc, "root", json_string(root)) != 0 ||
                    json_object_set_new(doc, "format", json_string("steps")) != 0 ||
                    json_object_set(doc, "steps", arr) != 0;
    char *text = oom ? NULL : json_dumps(doc, JSON_INDENT(2));
    json_decref(arr);
    json_decref(doc);
    if (!text) return cli_error("out of memory"), CLI_EXIT_FAIL;
    printf("%s\n", text);
    free(text);
    return CLI_EXIT_OK;
}

int cli_steps_inspect(ckptio_engine *engine, const char *root, bool json) {
    ckptio_step_info *steps = NULL;
    size_t n = 0, counts[5] = {0};
    uint64_t total = 0;
    if (check_all(engine, root, CKPTIO_STEP_CHECK_FAST, &steps, &n) != CLI_EXIT_OK) return CLI_EXIT_FAIL;
    if (json) {
        const int rc = print_json(root, steps, n);
        ckptio_steps_free(steps);
        return rc;
    }
    static const char *const headers[] = {"step", "state", "files", "size", "why"};
    cli_table table;
    cli_table_init(&table, 5, headers, "rlrrl");
    int rc = CLI_EXIT_OK;
    for (size_t i = 0; i < n; i++) {
        char step[32], files[32], size[32];
        snprintf(step, sizeof step, "%llu", (unsigned long long)steps[i].step);
        snprintf(files, sizeof files, "%zu", steps[i].files);
        cli_format_bytes(steps[i].bytes, size, sizeof size);
        const char *cells[] = {step, state_name(steps[i].state), files, size, cli_q(steps[i].reason)};
        if (cli_table_add(&table, cells) != 0) rc = CLI_EXIT_FAIL;
        if ((unsigned)steps[i].state < 5) counts[steps[i].state]++;
        total += steps[i].bytes;
    }
    char size[32];
    char refused[48] = ""; /* shown when there are any */
    if (counts[CKPTIO_STEP_REFUSED]) snprintf(refused, sizeof refused, ", %zu refused", counts[CKPTIO_STEP_REFUSED]);
    printf("%s: checkpoint manager root, %zu step%s (%zu complete, %zu partial, %zu damaged, %zu foreign%s), %s\n",
           cli_q(root), n, n == 1 ? "" : "s", counts[CKPTIO_STEP_COMPLETE], counts[CKPTIO_STEP_PARTIAL],
           counts[CKPTIO_STEP_DAMAGED], counts[CKPTIO_STEP_FOREIGN], refused,
           cli_format_bytes(total, size, sizeof size));
    cli_table_print(&table, stdout, "  ");
    cli_table_cleanup(&table);
    ckptio_steps_free(steps);
    return rc;
}

int cli_steps_verify(ckptio_engine *engine, const char *root, bool latest, bool quiet) {
    if (latest) {
        uint64_t step = 0;
        ckptio_step_info *skipped = NULL;
        size_t nskipped = 0;
        const ckptio_status st = ckptio_steps_latest(engine, root, CKPTIO_STEP_CHECK_FULL, &step, &skipped, &nskipped);
        if (cli_interrupted) { /* checks the signal cut short say nothing about the steps */
            ckptio_steps_free(skipped);
            return CLI_EXIT_FAIL;
        }
        for (size_t i = 0; i < nskipped; i++)
            cli_warning("%s: step %llu skipped (%s): %s", root, (unsigned long long)skipped[i].step,
                        state_name(skipped[i].state), skipped[i].reason);
        ckptio_steps_free(skipped);
        if (st != CKPTIO_OK) return cli_error_lib(root, st);
        if (!quiet)
            printf("%s: ok (step %llu is the newest complete step and every byte matches its checksums; %zu newer "
                   "step%s skipped)\n",
                   cli_q(root), (unsigned long long)step, nskipped, nskipped == 1 ? "" : "s");
        return CLI_EXIT_OK;
    }
    ckptio_step_info *steps = NULL;
    size_t n = 0, good = 0;
    if (check_all(engine, root, CKPTIO_STEP_CHECK_FULL, &steps, &n) != CLI_EXIT_OK) return CLI_EXIT_FAIL;
    int rc = CLI_EXIT_OK;
    for (size_t i = 0; i < n; i++) {
        if (steps[i].state == CKPTIO_STEP_COMPLETE) {
            good++;
            if (!quiet) printf("%s: step %llu: ok\n", cli_q(root), (unsigned long long)steps[i].step);
        } else if (steps[i].state == CKPTIO_STEP_PARTIAL || steps[i].state == CKPTIO_STEP_FOREIGN) {
            /* A save in progress, one that crashed, another writer's directory: not damage. */
            if (!quiet) printf("%s: step %llu: %s (%s)\n", cli_q(root), (unsigned long long)steps[i].step,
                               state_name(steps[i].state), cli_q(steps[i].reason));
        } else {
            cli_error("%s: step %llu: %s: %s", root, (unsigned long long)steps[i].step, state_name(steps[i].state),
                      steps[i].reason);
            rc = CLI_EXIT_FAIL;
        }
    }
    if (!quiet) printf("%s: %zu of %zu steps complete and verified\n", cli_q(root), good, n);
    ckptio_steps_free(steps);
    return rc;
}

int cli_steps_clean(const char *root, bool quiet) {
    ckptio_dcp_lock *lock = NULL;
    ckptio_status st = ckptio_dcp_lock_acquire(root, NULL, CKPTIO_DCP_LOCK_QUEUED, 0.0, NULL, NULL, &lock);
    if (st != CKPTIO_OK) return cli_error_lib(root, st);
    uint64_t *removed = NULL;
    size_t n = 0, nleft = 0;
    st = ckptio_steps_clean(root, &removed, &n);
    /* What is left that is not complete, as the root holds it now (under the lock): never removed without a
     * reason said. */
    ckptio_step_info *left = NULL;
    const ckptio_status scanned = st == CKPTIO_OK ? ckptio_steps_scan(root, &left, &nleft) : st;
    ckptio_dcp_lock_release(lock);
    if (st != CKPTIO_OK) cli_error_lib(root, st);
    else if (scanned != CKPTIO_OK) cli_error_lib(root, scanned);
    if (!quiet || st != CKPTIO_OK) {
        printf("%s: removed %zu partial step%s", cli_q(root), n, n == 1 ? "" : "s");
        for (size_t i = 0; i < n; i++) printf("%s%llu", i ? ", " : " (", (unsigned long long)removed[i]);
        printf("%s\n", n ? ")" : "");
    }
    for (size_t i = 0; !quiet && i < nleft; i++) {
        /* Partial steps still here, other writers' directories, complete steps holding something else. */
        const ckptio_step_state s = left[i].state;
        if (s == CKPTIO_STEP_PARTIAL || s == CKPTIO_STEP_FOREIGN || (s == CKPTIO_STEP_COMPLETE && left[i].reason[0]))
            printf("%s: left step %llu alone (%s): %s\n", cli_q(root), (unsigned long long)left[i].step,
                   state_name(s), cli_q(left[i].reason));
    }
    ckptio_steps_free(left);
    ckptio_steps_list_free(removed);
    return st == CKPTIO_OK && scanned == CKPTIO_OK ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
