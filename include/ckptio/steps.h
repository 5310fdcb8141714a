/*
 * ckptio/steps.h - a checkpoint manager's root of steps: one DCP directory per step,
 * commit markers, checks, retention, pins (docs/MANAGER.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_STEPS_H
#define CKPTIO_STEPS_H

#include "core.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/steps.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Checkpoint manager: the steps of a training run                          */
/* ------------------------------------------------------------------------ */
/* (docs/MANAGER.md)
 * A ROOT holds one DCP directory per saved step, named step_NNNNNNNN (the
 * step number in decimal, zero-padded to at least 8 digits; other names
 * are not steps and are left alone). A step is COMPLETE only once its
 * commit marker (CKPTIO_STEP_MARKER, written last, atomically, after the
 * step's files and the root are fsynced) names it; a marker that does not
 * parse, names another step, or whose step fails the check asked for is
 * DAMAGED. A step directory without a marker is PARTIAL when the manager
 * began it (CKPTIO_STEP_BEGUN, made before anything else is written into
 * it and removed last) or when it is empty: a save in progress, one that
 * crashed, or a removal that stopped half-way. Any other step directory is
 * FOREIGN: another writer's (torch's own DCP writer, a copy, a save of a
 * ckptio release that made no begun mark): listed with its reason, never
 * removed, never reused, never resumed from.
 * Removal only ever removes what the manager and the DCP writer make: the
 * whole directory is checked first (every entry a regular file under one
 * of their names, no subdirectory, nothing followed) and a directory
 * holding anything else is left whole, with the entry named.
 * A step whose bytes hold up (marker, sizes, checksums) but which ckptio's
 * reader refuses to load (a value outside the restricted unpickler's
 * allowlist, or over one of its limits: CKPTIO_E_DISALLOWED, _UNSUPPORTED,
 * _RANGE) is REFUSED: not damage, so nothing removes or replaces it.
 * Checks: CKPTIO_STEP_CHECK_MARKER reads only the marker; FAST also
 * compares .metadata with the size and XXH3-64 the marker recorded, parses
 * it and checks that every stored item lies inside its file (sizes, no
 * data read); FULL also hashes every byte against the ckptio manifest
 * (ckptio_dcp_verify; a step saved without checksums: ckptio_dcp_check).
 * Functions that change ROOT (begin, commit, remove,
 * clean, retain) expect the caller to hold ROOT's lock
 * (ckptio_dcp_lock_acquire(ROOT, NULL, CKPTIO_DCP_LOCK_QUEUED, ...)) so
 * that two managers, or `ckptio clean` and a save, never work on one root
 * at once; a reader pins the step it reads (ckptio_steps_pin) so that
 * retention leaves it for later. Failures name the step and the
 * operation: "step 100 (ROOT/step_00000100): commit: <cause>". */

/* The commit marker inside a step directory: three lines of text,
 * "ckptio-step 1\nstep N\nmetadata SIZE XXH3HEX\n". */
#define CKPTIO_STEP_MARKER ".ckptio-step"
/* The begun mark: an empty file ckptio_steps_begin creates in a new step
 * directory (durably) before anything is written into it. */
#define CKPTIO_STEP_BEGUN ".ckptio-step-begun"
/* The largest step number. */
#define CKPTIO_STEP_MAX 999999999999999999ull

typedef enum ckptio_step_state {
    CKPTIO_STEP_COMPLETE = 0,
    CKPTIO_STEP_PARTIAL = 1,
    CKPTIO_STEP_DAMAGED = 2,
    CKPTIO_STEP_FOREIGN = 3, /* no marker, no begun mark, not empty: not the manager's */
    CKPTIO_STEP_REFUSED = 4  /* intact, but ckptio's reader refuses a value in it */
} ckptio_step_state;

typedef enum ckptio_step_check {
    CKPTIO_STEP_CHECK_MARKER = 0, /* the marker only (no engine needed) */
    CKPTIO_STEP_CHECK_FAST = 1,   /* + .metadata against the marker, item bounds against file sizes */
    CKPTIO_STEP_CHECK_FULL = 2    /* + every byte against the manifest's XXH3-64 */
} ckptio_step_check;

typedef struct ckptio_step_info {
    uint64_t step;
    ckptio_step_state state;
    uint64_t bytes;      /* sizes of the regular files of the step directory */
    size_t files;        /* their count */
    char reason[1024];   /* PARTIAL / DAMAGED / FOREIGN / REFUSED: why, in one line; COMPLETE: "", or why removal
                          * leaves the step alone (it holds an entry the manager does not make) */
    ckptio_status status; /* DAMAGED: what the failed check found (CKPTIO_E_FORMAT, _CHECKSUM, _TRUNCATED,
                           * _STALE, _NOT_FOUND); REFUSED: the reader's refusal (CKPTIO_E_DISALLOWED, _UNSUPPORTED,
                           * _RANGE); otherwise CKPTIO_OK */
} ckptio_step_info;

/*! ckptio_steps_dir_name() : "step_%08llu" of `step` into out[0..cap)
 * (CKPTIO_E_RANGE when step > CKPTIO_STEP_MAX or it does not fit). */
CKPTIO_API ckptio_status ckptio_steps_dir_name(uint64_t step, char *out, size_t cap);

/*! ckptio_steps_scan() :
 * The step directories of ROOT, ascending, each classified at
 * CKPTIO_STEP_CHECK_MARKER (a directory without a marker is PARTIAL or
 * FOREIGN from what it holds) with its size. A missing ROOT has no steps
 * (*count = 0). Symlinks named like steps are not steps. Free *steps with
 * ckptio_steps_free. */
CKPTIO_API ckptio_status ckptio_steps_scan(const char *root, ckptio_step_info **steps, size_t *count);

/*! ckptio_steps_free() : frees a list of ckptio_steps_scan / _latest; accepts NULL. */
CKPTIO_API void ckptio_steps_free(ckptio_step_info *steps);

/*! ckptio_steps_check() :
 * Classifies step `step` of ROOT with `check` into *out (the state and
 * reason; the reason of a failed check is the check's error message). A
 * damaged step is a result, not a failure: CKPTIO_OK. Only proven damage
 * is DAMAGED (a marker, .metadata or item that does not parse or match, a
 * size, a checksum, a file missing or not a regular file); a check that
 * fails for any other reason (an I/O error, out of memory, a cancel through
 * ckptio_interrupt, a permission) says nothing about the step and fails with
 * that error. Failures are also bad arguments (an engine is required for
 * FAST and FULL) and a step that does not exist (CKPTIO_E_NOT_FOUND). */
CKPTIO_API ckptio_status ckptio_steps_check(ckptio_engine *engine, const char *root, uint64_t step,
                                            ckptio_step_check check, ckptio_step_info *out);

/*! ckptio_steps_latest() :
 * The newest step of ROOT that is COMPLETE under `check` (*step); steps
 * newer than it go to *skipped (newest first, *nskipped of them, each with
 * its state and reason; free with ckptio_steps_free; both may be NULL).
 * No such step: CKPTIO_E_NOT_FOUND naming ROOT and how many were skipped.
 * A check that fails without proving damage (ckptio_steps_check) ends the
 * walk with its error: no older step is taken on its account. */
CKPTIO_API ckptio_status ckptio_steps_latest(ckptio_engine *engine, const char *root, ckptio_step_check check,
                                             uint64_t *step, ckptio_step_info **skipped, size_t *nskipped);

/*! ckptio_steps_begin() :
 * Before a save of `step`: creates ROOT (one level) if needed, removes the
 * PARTIAL steps (what crashed saves left; as ckptio_steps_clean), creates
 * the step directory and in it the begun mark (CKPTIO_STEP_BEGUN), the
 * directory and ROOT fsynced after, so the step is recognisably the
 * manager's before anything is written into it. A step directory that
 * holds a marker (complete or damaged), a FOREIGN one, or a partial one
 * that removal had to leave alone is never reused: CKPTIO_E_EXISTS saying
 * which. dir[0..cap) receives "ROOT/step_NNNNNNNN". */
CKPTIO_API ckptio_status ckptio_steps_begin(const char *root, uint64_t step, char *dir, size_t cap);

/*! ckptio_steps_commit() :
 * After the step's DCP save finished (every rank's data files and
 * .metadata committed): fsyncs the step directory and ROOT, then writes
 * the marker (temporary, fsync, rename, directory fsync: as
 * ckptio_dcp_commit() writes .metadata) recording .metadata's size and XXH3-64. The step
 * is COMPLETE from the rename on. No .metadata: CKPTIO_E_NOT_FOUND. */
CKPTIO_API ckptio_status ckptio_steps_commit(const char *root, uint64_t step);

/*! ckptio_steps_remove() :
 * Removes step `step` when it is the manager's (a marker, a begun mark, or
 * empty) and holds nothing else than the manager and the DCP writer make:
 * the whole directory is checked first, and a FOREIGN step, a
 * subdirectory, a symlink, a FIFO or a name they do not make inside leave
 * it whole (CKPTIO_E_UNSUPPORTED naming the entry; nothing is removed); a
 * step pinned by a reader (ckptio_steps_pin) too (CKPTIO_E_BUSY). Then,
 * in order: the begun mark is made if the step has none (a step of an
 * earlier release), the marker goes (the directory fsynced, so that a crash
 * can only leave a PARTIAL step, never a complete-looking one with files
 * missing), the other files, the begun mark last, the directory, ROOT
 * fsynced. A failure half-way says what was removed and what is left. */
CKPTIO_API ckptio_status ckptio_steps_remove(const char *root, uint64_t step);

/*! ckptio_steps_clean() :
 * Removes the PARTIAL steps of ROOT (ckptio_steps_remove); a partial step
 * that holds an entry removal refuses is left whole (ckptio_steps_scan's
 * reason names the entry); FOREIGN steps are never touched. *removed (may
 * be NULL; free with ckptio_steps_list_free) lists the removed steps,
 * *nremoved counts them (also after a failure: those removed before it). */
CKPTIO_API ckptio_status ckptio_steps_clean(const char *root, uint64_t **removed, size_t *nremoved);

/*! ckptio_steps_retain() :
 * Retention after a commit: of the steps holding a marker, keeps the
 * newest `keep_last` (0 = keep all), every step that is a multiple of
 * `keep_every` (0 = none), and always the newest step that passes the FAST
 * check (so damage to the newest steps never costs the last good one);
 * removes the others, oldest first. A step a reader pins, or one holding
 * an entry removal refuses, is kept this time. PARTIAL and FOREIGN steps
 * are not touched (see ckptio_steps_clean). *removed / *nremoved as for
 * ckptio_steps_clean. */
CKPTIO_API ckptio_status ckptio_steps_retain(ckptio_engine *engine, const char *root, uint64_t keep_last,
                                             uint64_t keep_every, uint64_t **removed, size_t *nremoved);

typedef struct ckptio_step_pin ckptio_step_pin;

/*! ckptio_steps_pin() :
 * A reader's hold on step `step` while it reads it: a shared flock on the
 * step's marker, which removal (retention, clean, replacement) asks for
 * exclusively first and so leaves a pinned step alone (retention removes
 * it at a later commit). CKPTIO_E_NOT_FOUND when the step has no marker
 * now or a removal holds it (pick another step). On a file system without
 * flock the pin holds nothing (the reader must cope with the step going
 * away). Readers never block a save: a pin takes no root lock. Release
 * with ckptio_steps_unpin. */
CKPTIO_API ckptio_status ckptio_steps_pin(const char *root, uint64_t step, ckptio_step_pin **out);

/*! ckptio_steps_unpin() : releases a pin (LOCK_UN, close); accepts NULL. */
CKPTIO_API void ckptio_steps_unpin(ckptio_step_pin *pin);

/*! ckptio_steps_list_free() : frees a list of step numbers; accepts NULL. */
CKPTIO_API void ckptio_steps_list_free(uint64_t *steps);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_STEPS_H */
