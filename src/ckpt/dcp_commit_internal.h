/*
 * dcp_commit_internal.h - what the files of the DCP directory commit share
 * (dcp_names.c: the names a save gives its files; dcp_commit.c: atomic
 * small files; dcp_cleanup.c: removing what older saves left, with
 * dcp_cleanup_objects.c for a directory in object storage; dcp_lock.c:
 * the directory lock; dcp_manifest_write.c: the checksum manifest).
 */
#ifndef CKPTIO_DCP_COMMIT_INTERNAL_H
#define CKPTIO_DCP_COMMIT_INTERNAL_H

#include "common_internal.h"

#include <stdlib.h>
#include <string.h>

/* What every error of a step after .metadata was replaced ends with. */
#define CKPTIO__DCP_COMMITTED "the new checkpoint is committed; the next save removes what is left"

/* The manifest of a save: CKPTIO__DCP_MANIFEST_PREFIX TOKEN ".json". */
#define CKPTIO__DCP_MANIFEST_PREFIX ".ckptio-manifest-"
/* Bytes of its name, the NUL included (a token has 12 hex digits). */
#define CKPTIO__DCP_MANIFEST_NAME_SIZE (sizeof CKPTIO__DCP_MANIFEST_PREFIX + 12 + sizeof ".json" - 1)

/* __{rank}_{token}_{n}.distcp, the names ckptio.dcp gives data files;
 * copies the 12 hex digits of the token into token[0..12] (NUL-terminated). */
bool ckptio__dcp_data_name(const char *name, char token[13]);

/* Whether `files` (data file names; NULL entries skipped) name at least two
 * ranks (__{rank}_..., ranks told apart by their digits): a save several
 * ranks planned together, whose chunks torch's planner checked to tile every
 * tensor (ckptio_dcp_saved_by_ranks(), dcp_tiling.c's coverage rule). */
bool ckptio__dcp_several_ranks(const char *const *files, size_t count);

/* The token all of `files` share as ckptio data file names (what
 * the manifest's name carries), or false without touching the error. */
bool ckptio__dcp_token(const char *const *files, size_t count, char token[13]);

/* The name of the manifest of the save whose data files are `files`
 * (.ckptio-manifest-TOKEN.json, TOKEN as ckptio__dcp_token finds it), or
 * false and "" when they are not the data files of one ckptio save. */
bool ckptio__dcp_manifest_name(const char *const *files, size_t count, char name[CKPTIO__DCP_MANIFEST_NAME_SIZE]);

/* .metadata (a collective save) or __{rank}.metadata (a save without
 * collectives): the metadata files a checkpoint directory can hold. */
bool ckptio__dcp_metadata_name(const char *name);

/* A name some DCP writer (torch's or ckptio's) gives a file that a later
 * save may remove once nothing references it: data files (and a SAFETENSORS
 * data file's block-hash manifest, which a crash can leave), manifests,
 * torch's .metadata.tmp, and anything holding CKPTIO__TMP_MARK (a
 * temporary: removed only when no live writer holds it). */
bool ckptio__dcp_stale_name(const char *name);

/* True when `name` holds the temporaries' mark (".ckptio-tmp-"). */
bool ckptio__dcp_temporary_name(const char *name);

/* fsync of a directory (its renames and unlinks made durable). Returns 0
 * or the errno of the open or of the fsync. */
int ckptio__dcp_fsync_dir(const char *dir);

/* The relative_path of every storage_data entry of a .metadata held in
 * memory (`origin` names it in errors), as ckptio__malloc'ed strings
 * (duplicates kept; free with ckptio_dcp_names_free). CKPTIO_E_FORMAT when
 * the object graph is no Metadata or an entry is no _StorageInfo with a
 * string relative_path: the caller cannot tell what it references. */
ckptio_status ckptio__dcp_referenced_files(const void *bytes, size_t len, const char *origin, char ***files,
                                           size_t *count);

/* ckptio__dcp_write_file() with CKPTIO_DCP_SYNC: the file is fsynced before its
 * rename, but the directory is left to a later write's directory fsync (the
 * manifest's rename is made durable by .metadata's, which follows it). */
#define CKPTIO__DCP_NO_DIR_SYNC (1u << 16)

/* Writes `len` bytes as DIR/NAME atomically: a temporary
 * (ckptio_temporary_create, with the reference's attributes), write (short
 * writes resumed), fsync, rename over NAME, fsync of the directory (the
 * fsyncs with CKPTIO_DCP_SYNC; CKPTIO__DCP_NO_DIR_SYNC skips the last). A failure before the rename
 * leaves NAME as it was and removes the temporary; a failed directory fsync
 * after it says that the new NAME is in place but may not survive a power
 * loss. (dcp_commit.c; the step markers of src/ckpt/steps_marker.c too.) */
ckptio_status ckptio__dcp_write_file(const char *dir, const char *name, const void *data, size_t len,
                                     const char *reference, unsigned flags);

/* A small file of the commit written to its temporary but not yet renamed:
 * the steps of ckptio__dcp_write_file() apart, so that the commit fsyncs its
 * files together (ckptio__fsync_many) before it renames the first. */
typedef struct ckptio__dcp_staged {
    char tmp[4096]; /* the temporary ("" once renamed or removed) */
    char *final;    /* DIR/NAME */
    int fd;         /* the temporary's descriptor, -1 once closed */
} ckptio__dcp_staged;
/* Creates the temporary of DIR/NAME (local directories only) and writes
 * `len` bytes to it; a failure removes it. */
ckptio_status ckptio__dcp_stage(const char *dir, const char *name, const void *data, size_t len,
                                const char *reference, ckptio__dcp_staged *s);
/* fsync of up to 8 staged temporaries at once; the first failure is the
 * error ("flushing NAME before its rename; NAME is unchanged"). */
ckptio_status ckptio__dcp_staged_sync(ckptio__dcp_staged *const *files, size_t n);
/* Closes the temporary and renames it over its final name; a failure
 * removes it. Either way `s` is dropped. */
ckptio_status ckptio__dcp_staged_publish(ckptio__dcp_staged *s);
/* Closes and removes a temporary not renamed yet; frees `s`'s name. */
void ckptio__dcp_staged_drop(ckptio__dcp_staged *s);
/* fsync of DIR after NAME was renamed into it; its failure says the new NAME
 * is in place but may not survive a power loss. */
ckptio_status ckptio__dcp_fsync_dir_after(const char *dir, const char *name);
/* The text of DIR/.ckptio-manifest-TOKEN.json (ckptio__malloc'ed) and its
 * name (TOKEN from `files`, checked as for ckptio__dcp_manifest_write). */
ckptio_status ckptio__dcp_manifest_text(const char *dir, const char *metadata_name, const char *const *files,
                                        size_t nfiles, const ckptio_dcp_manifest_item *items, size_t count,
                                        char **text, char name[CKPTIO__DCP_MANIFEST_NAME_SIZE]);
/* Step 2: writes DIR/.ckptio-manifest-TOKEN.json (TOKEN from `files`, the
 * save's data files, which must be ckptio data file names of one save: else
 * CKPTIO_E_INVAL) as ckptio__dcp_write_file() writes a file. It lists
 * `files` and the items; `metadata_name` is the metadata file it belongs
 * to. ckptio_dcp_verify() checks a directory against it.
 * (dcp_manifest_write.c) */
ckptio_status ckptio__dcp_manifest_write(const char *dir, const char *metadata_name, const char *const *files,
                                         size_t nfiles, const ckptio_dcp_manifest_item *items, size_t count,
                                         const char *reference, unsigned flags);

/* "DIR/NAME" (ckptio__malloc'ed), or NULL when out of memory. */
char *ckptio__dcp_join(const char *dir, const char *name);

/* ---- the lock of a directory in object storage (dcp_lease.c) ---------------------------- */

/* The text of DIR/.ckptio-dcp.lock on an object store:
 * "ckptio-lease 1\nowner HEX32\nsince SECONDS\nttl_ms MILLISECONDS\n". */
typedef struct ckptio__lease_text {
    char owner[33];    /* 32 lowercase hex digits: who holds it */
    uint64_t since;    /* the server's clock when it was taken (seconds since the epoch) */
    uint64_t ttl_ms;   /* it lapses this long after its last write */
} ckptio__lease_text;

/* The lease's text into out[0..cap); its length (0 when it does not fit). */
size_t ckptio__lease_format(const ckptio__lease_text *l, char *out, size_t cap);

/* Parses a lease's bytes (untrusted; `origin` names them in errors):
 * exactly the format above, decimal numbers without leading zeros.
 * CKPTIO_E_FORMAT otherwise. */
ckptio_status ckptio__lease_parse(const char *bytes, size_t len, const char *origin, ckptio__lease_text *out);

typedef struct ckptio__dcp_lease ckptio__dcp_lease;

/* Takes the lease of the directory s3://BUCKET/PREFIX (exclusive), or with
 * `shared` waits until no other save's lease holds it and then writes the
 * save's mark DIR/.ckptio-dcp-shared-OWNER (a lease's text, `since` the
 * server's clock before it was written, renewed like the lease): a save
 * that removes nothing runs beside others, and an exclusive save's cleanup
 * keeps every object written since a live mark's `since` (its objects come
 * after its mark). With `defer`, a lease written without a
 * conditional write is read back by the first ckptio__dcp_lease_check
 * (CKPTIO_DCP_LOCK_CONFIRM_LATER). `timeout`, `on_wait` as for
 * ckptio_dcp_lock_acquire; CKPTIO_E_BUSY names the holder. */
ckptio_status ckptio__dcp_lease_acquire(const char *dir, bool shared, bool defer, double timeout,
                                        ckptio_dcp_lock_wait_fn on_wait, void *user, ckptio__dcp_lease **out);

/* CKPTIO_OK while the lease is still this save's (read from the server);
 * CKPTIO_E_BUSY once another save took it over or it lapsed. */
ckptio_status ckptio__dcp_lease_check(ckptio__dcp_lease *l);

/* Stops renewing and deletes the lease when it is still ours; accepts NULL. */
void ckptio__dcp_lease_release(ckptio__dcp_lease *l);

/* Whether `l` holds an exclusive lease. */
bool ckptio__dcp_lease_held(const ckptio__dcp_lease *l);

/* The cleanup's requests that can run beside the .metadata PUT of a save
 * into an object directory, once its lease was checked: the listing of the
 * directory and (with abort_uploads) the abort of its killed saves'
 * uploads, on threads of their own. *out is NULL for a local directory.
 * The _listed variants of ckptio_dcp_stale_files and _remove_files take
 * the listing and the abort's outcome from it (NULL: as the public ones);
 * ckptio__dcp_prefetch_finish waits for what still runs and frees it. */
typedef struct ckptio__dcp_prefetch ckptio__dcp_prefetch;
ckptio_status ckptio__dcp_prefetch_start(const char *dir, bool abort_uploads, ckptio__dcp_prefetch **out);
ckptio_status ckptio__dcp_stale_files_listed(const char *dir, const char *const *keep, size_t nkeep,
                                             const ckptio_dcp_committed *committed, ckptio__dcp_prefetch *listed,
                                             char ***out, size_t *count, char *note, size_t note_cap);
ckptio_status ckptio__dcp_remove_files_listed(const char *dir, const char *const *list, size_t count, unsigned flags,
                                              const ckptio_dcp_committed *committed, ckptio__dcp_prefetch *prefetched,
                                              size_t *removed, char *note, size_t note_cap);
void ckptio__dcp_prefetch_finish(ckptio__dcp_prefetch *p);

/* A growable list of names (the cleanup's: a directory's entries, what is
 * kept, what goes). */
typedef struct ckptio__dcp_list {
    char **v;
    size_t n, cap;
} ckptio__dcp_list;

static inline void ckptio__dcp_list_clear(ckptio__dcp_list *l) {
    for (size_t i = 0; i < l->n; i++) ckptio__free(l->v[i]);
    ckptio__free(l->v);
    *l = (ckptio__dcp_list){0};
}

static inline bool ckptio__dcp_list_add(ckptio__dcp_list *l, const char *s) {
    if (l->n + 1 >= l->cap) {
        const size_t cap = l->cap ? 2 * l->cap : 16;
        char **v = ckptio__realloc(l->v, cap * sizeof *v);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    if (!(l->v[l->n] = ckptio__strdup(s))) return false;
    l->n++;
    return true;
}

static inline int ckptio__dcp_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static inline void ckptio__dcp_list_sort(ckptio__dcp_list *l) {
    if (l->n) qsort(l->v, l->n, sizeof *l->v, ckptio__dcp_cmp_str);
}

static inline bool ckptio__dcp_list_has(const ckptio__dcp_list *sorted, const char *s) {
    return sorted->n && bsearch(&s, sorted->v, sorted->n, sizeof *sorted->v, ckptio__dcp_cmp_str);
}

/* The objects of the directory `dir` (an s3:// prefix); with `young`, also
 * those the cleanup leaves alone: written at or after the lease held on it
 * now was taken (that save's) or a live shared save's mark was written (a
 * save without a cleanup, in progress beside it: ckptio__dcp_keep_since),
 * and those live marks themselves; a mark that lapsed may go. *keep_since
 * (may be NULL): that time (0: no lease and no mark, nothing is kept). */
ckptio_status ckptio__dcp_list_objects(ckptio_engine *engine, const char *dir, ckptio__dcp_list *out,
                                       ckptio__dcp_list *young, double *keep_since);

/* Moves the prefetched listing into all and young (sorted as
 * ckptio__dcp_list_objects leaves them); lists now when it was not started. */
ckptio_status ckptio__dcp_prefetch_take_listing(ckptio__dcp_prefetch *p, ckptio__dcp_list *all,
                                                ckptio__dcp_list *young);

/* Deletes the objects urls[0..n) (deletes are durable when answered:
 * nothing to fsync) while the directory's old uploads are aborted; the first
 * failed delete is returned, else the abort's failure. */
ckptio_status ckptio__dcp_remove_objects(ckptio_engine *engine, const char *dir, char **urls, size_t n,
                                         ckptio__dcp_prefetch *prefetched, size_t *removed);

/* When the lease held on DIR now was taken (its `since`; 0: no lease of
 * ckptio's there). Objects written after it belong to its holder's save.
 * A lease this process holds (confirmed, not lost) is answered without a
 * request. */
ckptio_status ckptio__dcp_lease_since(ckptio_engine *engine, const char *dir, double *since);

/* Whether this process holds the lease on DIR now (confirmed, not lost). */
bool ckptio__dcp_lease_held_here(const char *dir);

/* The marks of shared saves in progress (see ckptio__dcp_lease_acquire). */
#define CKPTIO__DCP_SHARED_PREFIX ".ckptio-dcp-shared-"

static inline bool ckptio__dcp_shared_mark_name(const char *name) {
    return !strncmp(name, CKPTIO__DCP_SHARED_PREFIX, sizeof CKPTIO__DCP_SHARED_PREFIX - 1);
}

/* Where the cleanup of DIR may start removing: objects last written at or
 * after *keep_since are kept. The `since` of the lease held on DIR now,
 * lowered to that of every live shared save's mark among `marks` (names in
 * DIR; each read with one GET); a mark that lapsed is added to `dead`
 * (removable). 0 when there is no lease of ckptio's. */
ckptio_status ckptio__dcp_keep_since(ckptio_engine *engine, const char *dir, char *const *marks, size_t nmarks,
                                     double *keep_since, bool *dead);

/* A reader's pin on a step in object storage: DIR/.ckptio-step-pin-OWNER,
 * holding a lease's text, renewed by a thread while the pin is held and
 * deleted by ckptio__dcp_lease_release. Removal leaves a step holding a
 * live pin alone. `engine` (may be NULL) gives the lease time. */
#define CKPTIO__STEP_PIN_PREFIX ".ckptio-step-pin-"
ckptio_status ckptio__dcp_pin_take(ckptio_engine *engine, const char *dir, ckptio__dcp_lease **out);

/* Whether the pin object `url`, last written at `mtime` (server's clock),
 * still holds at `server_now`: within its lease time (an unreadable one:
 * the engine's). */
bool ckptio__dcp_pin_live(ckptio_engine *engine, const char *url, double server_now, double mtime);

#endif /* CKPTIO_DCP_COMMIT_INTERNAL_H */
