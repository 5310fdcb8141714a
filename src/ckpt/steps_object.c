/*
 * steps_object.c - a checkpoint manager's root in object storage
 * (s3://BUCKET/PREFIX): what the steps' local operations become there
 * (docs/OBJECT_STORAGE.md, "Checkpoint steps").
 *
 * The states and rules are steps_scan.c's and steps_remove.c's; only the
 * primitives differ. A step directory is the prefix ROOT/step_NNNNNNNN/,
 * there when any object is under it; its entries come from one listing
 * (objects are regular files, common prefixes subdirectories, names no
 * file can have are refused like a FIFO). The begun mark and the marker are
 * single PUTs, each durable when answered, so the fsyncs of the local
 * protocol have nothing left to do; a reader's pin is an object of its
 * own that it renews (dcp_lease.c), which removal respects while it lives.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"
#include "steps_internal.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

void ckptio__step_entries_free(ckptio__step_entries *e) {
    for (size_t i = 0; e->names && i < e->count; i++) ckptio__free(e->names[i]);
    ckptio__free(e->names);
    e->names = NULL;
}

typedef struct step_lister {
    uint64_t *steps;
    size_t count, cap;
    bool nomem;
} step_lister;

static int step_entry(void *user, const ckptio__object_entry *e) {
    step_lister *l = user;
    uint64_t step;
    if (e->kind != CKPTIO__PATH_DIR || !ckptio__step_from_name(e->name, &step)) return 0;
    if (l->count == l->cap) {
        const size_t cap = l->cap ? l->cap * 2 : 16;
        uint64_t *grown = ckptio__realloc(l->steps, cap * sizeof *grown);
        if (!grown) return l->nomem = true, 1;
        l->steps = grown;
        l->cap = cap;
    }
    l->steps[l->count++] = step;
    return 0;
}

ckptio_status ckptio__steps_object_list(ckptio_engine *e, const char *root, uint64_t **steps, size_t *count) {
    step_lister l = {0};
    ckptio_status st = ckptio__object_dir_list(e, root, step_entry, &l);
    if (st == CKPTIO_OK && l.nomem) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing the steps of %s", root);
    if (st != CKPTIO_OK) {
        ckptio__free(l.steps);
        return st;
    }
    *steps = l.steps;
    *count = l.count;
    return CKPTIO_OK;
}

typedef struct entry_lister {
    ckptio__step_entries *out;
    bool keep;
    size_t cap;
    ckptio_status st;
    const char *dir;
    ckptio_engine *engine;
    double server_now;
} entry_lister;

static int entry_one(void *user, const ckptio__object_entry *e) {
    entry_lister *l = user;
    ckptio__step_entries *out = l->out;
    if (l->keep) {
        if (out->count == l->cap) {
            const size_t cap = l->cap ? l->cap * 2 : 16;
            char **grown = ckptio__realloc(out->names, cap * sizeof *grown);
            if (!grown) return l->st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory"), 1;
            out->names = grown;
            l->cap = cap;
        }
        if (!(out->names[out->count] = ckptio__strdup(e->name)))
            return l->st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory"), 1;
    }
    out->count++;
    const bool file = e->kind == CKPTIO__PATH_FILE;
    out->marker |= file && !strcmp(e->name, CKPTIO_STEP_MARKER);
    out->begun |= file && !strcmp(e->name, CKPTIO_STEP_BEGUN);
    out->metadata |= file && !strcmp(e->name, ".metadata");
    const char *why = NULL;
    if (file) {
        out->files++;
        out->bytes += e->size;
        if (!strncmp(e->name, CKPTIO__STEP_PIN_PREFIX, sizeof CKPTIO__STEP_PIN_PREFIX - 1)) {
            char *url = ckptio__path_join(l->dir, e->name);
            if (url && ckptio__dcp_pin_live(l->engine, url, l->server_now, e->mtime)) out->pins++;
            ckptio__free(url);
        } else if (!ckptio__step_own_name(e->name)) {
            why = "a name neither the manager nor the DCP writer gives a file";
        }
    } else {
        why = e->kind == CKPTIO__PATH_DIR ? "a directory (objects under it)" : "a name no file can have";
    }
    if (why && !out->alien[0]) {
        ckptio__object_plain_name(e->name, strlen(e->name))
            ? snprintf(out->alien, sizeof out->alien, "%s", e->name)
            : snprintf(out->alien, sizeof out->alien, "(a name with control bytes, '.' or '..')");
        out->alien_why = why;
    }
    return 0;
}

ckptio_status ckptio__step_object_entries(ckptio_engine *e, const char *dir, bool keep_names,
                                          ckptio__step_entries *out) {
    memset(out, 0, sizeof *out);
    entry_lister l = {.out = out, .keep = keep_names, .st = CKPTIO_OK, .dir = dir, .engine = e};
    /* The server's clock now, for the age of readers' pins. */
    char *marker = ckptio__path_join(dir, CKPTIO_STEP_MARKER);
    if (!marker) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio__error_saved *saved = ckptio__error_save();
    const ckptio_status hs = ckptio__object_info(e, marker, NULL, NULL, NULL, &l.server_now);
    ckptio__free(marker);
    if (hs != CKPTIO_OK && hs != CKPTIO_E_NOT_FOUND) {
        ckptio__free(saved);
        return hs;
    }
    ckptio__error_restore(saved);
    ckptio_status st = ckptio__object_dir_list(e, dir, entry_one, &l);
    if (st == CKPTIO_OK) st = l.st;
    if (st != CKPTIO_OK) ckptio__step_entries_free(out);
    return st;
}
