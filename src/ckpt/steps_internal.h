/*
 * steps_internal.h - what the checkpoint manager's files share
 * (steps_marker.c: the commit marker; steps_scan.c: finding and
 * classifying steps; steps_remove.c: removal, cleaning, retention;
 * steps_pin.c: a reader's pin on a step).
 */
#ifndef CKPTIO_STEPS_INTERNAL_H
#define CKPTIO_STEPS_INTERNAL_H

#include "common_internal.h"
#include "io_internal.h"

/* Largest marker read: the three lines take under 80 bytes. */
#define CKPTIO__STEP_MARKER_MAX 4096

/* The content of a commit marker. */
typedef struct ckptio__step_marker {
    uint64_t step;
    uint64_t metadata_size;  /* .metadata's size at commit */
    uint64_t metadata_xxh3;  /* and its XXH3-64 */
} ckptio__step_marker;

/* Parses marker bytes (untrusted; `origin` names them in errors):
 * exactly "ckptio-step 1\nstep N\nmetadata SIZE HEX16\n", decimal numbers
 * without sign or leading zeros, step <= CKPTIO_STEP_MAX, HEX16 16
 * lowercase hex digits. CKPTIO_E_FORMAT naming the line otherwise. */
ckptio_status ckptio__step_marker_parse(const char *bytes, size_t len, const char *origin, ckptio__step_marker *out);

/* The marker's text into out[0..cap); returns its length (0 when it does
 * not fit). */
size_t ckptio__step_marker_format(const ckptio__step_marker *m, char *out, size_t cap);

/* Step number of a step directory's name, when `name` is exactly what
 * ckptio_steps_dir_name gives for some step. */
bool ckptio__step_from_name(const char *name, uint64_t *step);

/* "ROOT/step_NNNNNNNN" (ckptio__malloc'ed) or NULL (out of memory / step
 * out of range: the error is set). */
char *ckptio__step_dir(const char *root, uint64_t step);

/* Re-raises the current error prefixed with "step N (DIR): OP: ", keeping
 * its status and errno. Returns the status. */
ckptio_status ckptio__step_fail(const char *root, uint64_t step, const char *op);

/* What one step directory holds, from one listing (lstat of every entry,
 * nothing followed). */
typedef struct ckptio__step_entries {
    bool marker;           /* an entry named CKPTIO_STEP_MARKER */
    bool begun;            /* an entry named CKPTIO_STEP_BEGUN */
    bool metadata;         /* an entry named .metadata */
    size_t count;          /* entries but . and .. */
    size_t files;          /* regular files among them */
    uint64_t bytes;        /* and their sizes */
    char alien[256];       /* the first entry removal refuses ("" when none) */
    const char *alien_why; /* what it is ("a directory", "a symlink", ...) */
    char **names;          /* with keep_names: every entry (free with ckptio__step_entries_free) */
    size_t pins;           /* an object store's step: readers' live pins (a local step's are flocks) */
} ckptio__step_entries;

/* Lists DIR into *out. `for_removal`: through ckptio__opendir (a request
 * fault injection can fail) and every name kept in out->names. Errors:
 * the opendir's (ENOENT included), out of memory. */
ckptio_status ckptio__step_entries_read(const char *dir, bool for_removal, ckptio__step_entries *out);
void ckptio__step_entries_free(ckptio__step_entries *e);

/* Whether `name` is one the manager or a DCP writer gives a file of a step
 * directory (the marker, the begun mark, its temporaries, the DCP lock,
 * metadata files, data files, manifests, temporaries). */
bool ckptio__step_own_name(const char *name);

/* Size and XXH3-64 of DIR/.metadata. */
ckptio_status ckptio__step_metadata_hash(const char *dir, uint64_t *size, uint64_t *hash);

/* ---- a root in object storage (steps_object.c) ---------------------------------------- */

/* The engine for ROOT's objects: `given`, or for an object root without
 * one a temporary engine (*owned: hand it to ckptio__steps_engine_done);
 * *use is NULL for a local root. */
ckptio_status ckptio__steps_engine(ckptio_engine *given, const char *root, ckptio_engine **use, ckptio_engine **owned);
void ckptio__steps_engine_done(ckptio_engine *owned);

/* The step numbers of an object root (common prefixes named as steps), unsorted. */
ckptio_status ckptio__steps_object_list(ckptio_engine *e, const char *root, uint64_t **steps, size_t *count);

/* What an object step directory holds (as ckptio__step_entries_read; live
 * readers' pins counted in `pins`, not refused). */
ckptio_status ckptio__step_object_entries(ckptio_engine *e, const char *dir, bool keep_names,
                                          ckptio__step_entries *out);

/* What `path` is in the object store (ckptio__object_stat). */
ckptio_status ckptio__step_object_kind(ckptio_engine *e, const char *path, ckptio__path_kind *kind, uint64_t *size);

/* A small object (at most cap bytes) into buf; CKPTIO_E_NOT_FOUND when missing. */
ckptio_status ckptio__step_object_read(ckptio_engine *e, const char *path, char *buf, size_t cap, size_t *len);

/* Size and XXH3-64 of the object DIR/.metadata. */
ckptio_status ckptio__step_object_metadata_hash(ckptio_engine *e, const char *dir, uint64_t *size, uint64_t *hash);

/* One PUT of DIR/NAME (durable when answered); one DELETE of it (a missing one is no error). */
ckptio_status ckptio__step_object_put(ckptio_engine *e, const char *dir, const char *name, const void *data,
                                      size_t len);
ckptio_status ckptio__step_object_delete(ckptio_engine *e, const char *dir, const char *name);

/* Aborts every unfinished upload under DIR/ (a removed step's killed save's). */
ckptio_status ckptio__step_object_abort_uploads(ckptio_engine *e, const char *dir);

#endif /* CKPTIO_STEPS_INTERNAL_H */
