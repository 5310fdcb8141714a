/*
 * dcp_cleanup.c - step 4 of a DCP directory commit: removing what older
 * saves left (docs/DCP.md "Atomic commit and overwrite").
 *
 * Which files go is decided when the new .metadata is in place, under the
 * directory's lock: DCP-named files (dcp_names.c) outside the new
 * checkpoint that no metadata file in the directory references now. The
 * metadata files are read again with the restricted unpickler (the one
 * just committed is not: its bytes are compared with what the save wrote),
 * because torch's own writer reuses names such as __0_0.distcp and takes no
 * lock. One that cannot be read (a symlink, a FIFO, a pickle outside the
 * allowlist, garbage) might reference any file: then only temporaries are
 * removed and the caller is told why, so it can warn. Temporaries are
 * removed only when no live writer holds them (the flock rule of
 * temporaries.c). Nothing is ever followed: metadata files are opened
 * O_NOFOLLOW | O_NONBLOCK, and only regular files are read. Only regular
 * files are removed: a symlink, a directory or a FIFO under a DCP writer's
 * name is no writer's file (a link's target may be anyone's); it is left
 * where it is and the note names it, and the commit still succeeds.
 *
 * A background removal lists the files at commit and removes them later,
 * without the lock: by then a later save may have committed; it reads the
 * metadata files again right before and keeps whatever they reference
 * (CKPTIO_DCP_RECHECK). Its list names only files older than its commit,
 * which no later ckptio save reuses (new token, new temporary names).
 *
 * A directory in object storage is listed, and its objects deleted, by
 * dcp_cleanup_objects.c; the decision and its reading of the metadata
 * files are the same for both.
 */
#include "dcp_commit_internal.h"
#include "dcp_dir_internal.h"
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

void ckptio_dcp_names_free(char **list, size_t count) {
    ckptio__dcp_list l = {.v = list, .n = list ? count : 0};
    ckptio__dcp_list_clear(&l);
}

/* An engine for the object store's settings (CKPTIO_S3_* from the
 * environment), or NULL for a local directory. */
static ckptio_status object_engine(const char *dir, ckptio_engine **engine) {
    *engine = NULL;
    return ckptio__s3_is_url(dir) ? ckptio_engine_create(engine) : CKPTIO_OK;
}

/* The entries of `dir` (without . and ..). */
static ckptio_status list_dir(ckptio_engine *engine, const char *dir, ckptio__dcp_list *out) {
    if (engine) return ckptio__dcp_list_objects(engine, dir, out, NULL, NULL);
    DIR *d = ckptio__opendir(dir);
    if (!d)
        return CKPTIO_FAIL_SYS_NOTE(errno, "listdir", dir, "looking for files of older saves; %s",
                                    CKPTIO__DCP_COMMITTED);
    ckptio_status st = CKPTIO_OK;
    for (;;) {
        errno = 0;
        const struct dirent *e = readdir(d);
        if (!e) {
            if (errno)
                st = CKPTIO_FAIL_SYS_NOTE(errno, "listdir", dir, "looking for files of older saves; %s",
                                          CKPTIO__DCP_COMMITTED);
            break;
        }
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!ckptio__dcp_list_add(out, e->d_name)) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory listing %s", dir);
            break;
        }
    }
    closedir(d);
    return st;
}

/* ---- what the metadata files reference now ------------------------------------------ */

ckptio_status ckptio__dcp_referenced_files(const void *bytes, size_t len, const char *origin, char ***out,
                                           size_t *count) {
    *out = NULL;
    *count = 0;
    ckptio_pickle *p = NULL;
    CKPTIO_FORWARD(ckptio_pickle_parse_dcp_metadata(bytes, len, origin, &p));
    const ckptio_value *root = NULL;
    ckptio_pickle_root(p, &root);
    const ckptio_value *md = ckptio__dcp_fields_of(root, CKPTIO__DCP_MD "Metadata");
    const ckptio_value *sd = md ? ckptio__dcp_dict_get(md, "storage_data") : NULL;
    const ckptio_value_kind kind = ckptio_value_kind_of(sd);
    size_t n = 0;
    char **list = NULL;
    ckptio_status st = CKPTIO_OK;
    const ckptio__err_ctx ctx = {.path = origin, .file_offset = -1, .subject = "storage_data"};
    if (!md)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = origin, .file_offset = -1}),
                             "the pickled object is not a Metadata");
    else if (sd && kind != CKPTIO_VALUE_NONE && (kind != CKPTIO_VALUE_DICT || ckptio_value_len(sd, &n) != CKPTIO_OK))
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "not a dict");
    else if (!(list = ckptio__calloc(n + 1, sizeof *list)))
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    /* Anything but a _StorageInfo with a string relative_path might name a
     * file in some other way: the caller then keeps every file. */
    for (size_t i = 0; st == CKPTIO_OK && i < n; i++) {
        const ckptio_value *k, *v;
        ckptio_value_dict_item(sd, i, &k, &v);
        const ckptio_value *f = ckptio__dcp_fields_of(v, "torch.distributed.checkpoint.filesystem._StorageInfo");
        size_t plen = 0;
        const char *path = f ? ckptio__dcp_str_of(ckptio__dcp_dict_get(f, "relative_path"), &plen) : NULL;
        if (!path || memchr(path, '\0', plen))
            st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &ctx, "entry %zu is not a _StorageInfo with a relative_path", i);
        else if (!(list[*count] = ckptio__strdup(path)))
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        else
            ++*count;
    }
    ckptio_pickle_close(p);
    if (st != CKPTIO_OK) {
        ckptio_dcp_names_free(list, *count);
        *count = 0;
        return st;
    }
    *out = list;
    return CKPTIO_OK;
}

typedef enum { READ_OK, READ_MISSING, READ_UNREADABLE } read_outcome;

/* The bytes of metadata file `path`. A symlink, FIFO or other non-regular
 * file is READ_UNREADABLE with `why` (never followed or waited on); an I/O
 * error fails (nothing was removed yet). */
static ckptio_status read_metadata_file(ckptio_engine *engine, const char *path, void **data, size_t *len,
                                        read_outcome *outcome, const char **why) {
    static const char what[] = "reading it to find the files it references: nothing was removed; "
                               CKPTIO__DCP_COMMITTED;
    *data = NULL;
    *len = 0;
    *outcome = READ_OK;
    if (engine) { /* an object: no symlinks, no FIFOs */
        ckptio__error_saved *saved = ckptio__error_save();
        const ckptio_status st = ckptio__object_read_all(engine, path, (uint64_t)1 << 31, data, len);
        if (st == CKPTIO_E_NOT_FOUND) {
            ckptio__error_restore(saved);
            *outcome = READ_MISSING;
            return CKPTIO_OK;
        }
        ckptio__free(saved);
        return st;
    }
    struct stat sb;
    mode_t type = 0;
    const int fd = ckptio__open_regular(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW, &sb, &type);
    if (fd < 0 && type) { /* a symlink (never followed), FIFO, device: never opened */
        *outcome = READ_UNREADABLE;
        *why = type == S_IFLNK ? "a symlink" : "not a regular file";
        return CKPTIO_OK;
    }
    if (fd < 0 && errno == ENOENT) {
        *outcome = READ_MISSING;
        return CKPTIO_OK;
    }
    if (fd < 0) return CKPTIO_FAIL_SYS_NOTE(errno, "open", path, "%s", what);
    ckptio_status st = CKPTIO_OK;
    size_t cap = 0;
    char *buf = NULL;
    for (;;) {
        if (*len == cap) {
            cap = cap ? 2 * cap : (size_t)sb.st_size + 4096;
            char *more = ckptio__realloc(buf, cap);
            if (!more) {
                st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory reading %s", path);
                goto out;
            }
            buf = more;
        }
        const ssize_t n = ckptio__read(fd, buf + *len, cap - *len);
        if (n < 0) {
            st = CKPTIO_FAIL_SYS_NOTE(errno, "read", path, "%s", what);
            goto out;
        }
        if (n == 0) break;
        *len += (size_t)n;
    }
out:
    close(fd);
    if (st != CKPTIO_OK || *outcome != READ_OK) {
        ckptio__free(buf);
        *len = 0;
    } else {
        *data = buf;
    }
    return st;
}

/* Appends "left NAME alone (WHAT)" to the note, after what it holds. */
static void note_left_alone(char *note, size_t cap, const char *dir, const char *name, mode_t mode) {
    if (!note || !cap) return;
    const size_t len = strnlen(note, cap);
    if (len + 1 >= cap) return;
    snprintf(note + len, cap - len, "%s%s: left '%s' alone: %s under a name a DCP writer gives its files, which "
             "are regular files; it is not removed", len ? "; " : "", dir, name,
             S_ISLNK(mode) ? "a symlink" : S_ISDIR(mode) ? "a directory" : "not a regular file");
}

/* The type of `name` in `dir` (lstat: nothing followed); 0 when it is gone or cannot be checked. */
static mode_t entry_type(const char *dir, const char *name) {
    char *path = ckptio__dcp_join(dir, name);
    struct stat sb;
    const mode_t type = path && lstat(path, &sb) == 0 ? (sb.st_mode & S_IFMT) : 0;
    ckptio__free(path);
    return type;
}

static void set_note(char *note, size_t cap, const char *dir, const char *name, const char *why) {
    if (note && cap)
        snprintf(note, cap, "%s: keeping the files of older saves: %s cannot be read (%s); %s", dir, name, why,
                 CKPTIO__DCP_COMMITTED);
}

/* Adds to `out` every data file the metadata files among `entries` reference
 * now. *known = false (and the note says why) when one cannot be read: it
 * might reference any file. */
static ckptio_status referenced_now(ckptio_engine *engine, const char *dir, const ckptio__dcp_list *entries,
                                    const ckptio_dcp_committed *committed, ckptio__dcp_list *out, bool *known,
                                    char *note, size_t note_cap) {
    *known = true;
    for (size_t i = 0; i < entries->n; i++) {
        const char *name = entries->v[i];
        if (!ckptio__dcp_metadata_name(name)) continue;
        char *path = ckptio__dcp_join(dir, name);
        if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        void *data = NULL;
        size_t len = 0;
        read_outcome outcome;
        const char *why = NULL;
        ckptio_status st = read_metadata_file(engine, path, &data, &len, &outcome, &why);
        if (st == CKPTIO_OK && outcome == READ_OK) {
            const bool same = committed && committed->metadata_name && strcmp(name, committed->metadata_name) == 0 &&
                              committed->metadata_len == len &&
                              (len == 0 || memcmp(committed->metadata, data, len) == 0);
            if (same) { /* what this save wrote: no second unpickling */
                for (size_t k = 0; st == CKPTIO_OK && k < committed->nfiles; k++)
                    if (!ckptio__dcp_list_add(out, committed->files[k]))
                        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
            } else {
                char **files = NULL;
                size_t n = 0;
                if (ckptio__dcp_referenced_files(data, len, path, &files, &n) != CKPTIO_OK) {
                    outcome = READ_UNREADABLE;
                    why = ckptio_last_error_message();
                }
                for (size_t k = 0; st == CKPTIO_OK && k < n; k++)
                    if (!ckptio__dcp_list_add(out, files[k])) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
                ckptio_dcp_names_free(files, n);
            }
        }
        if (st == CKPTIO_OK && outcome == READ_UNREADABLE) {
            set_note(note, note_cap, dir, name, why);
            *known = false;
        }
        ckptio__free(data);
        ckptio__free(path);
        if (st != CKPTIO_OK || !*known) return st;
    }
    ckptio__dcp_list_sort(out);
    return CKPTIO_OK;
}

/* ---- listing ------------------------------------------------------------------------ */

/* The manifests (.ckptio-manifest-TOKEN.json) of the ckptio saves whose
 * data files are among `referenced`: a checkpoint that another metadata
 * file names (a save without collectives beside .metadata) keeps its
 * manifest with its data files. Sorted. */
static ckptio_status manifests_of(const ckptio__dcp_list *referenced, ckptio__dcp_list *out) {
    for (size_t i = 0; i < referenced->n; i++) {
        char name[CKPTIO__DCP_MANIFEST_NAME_SIZE];
        if (ckptio__dcp_manifest_name((const char *const *)&referenced->v[i], 1, name) &&
            !ckptio__dcp_list_add(out, name))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    ckptio__dcp_list_sort(out);
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_stale_files(const char *dir, const char *const *keep, size_t nkeep,
                                     const ckptio_dcp_committed *committed, char ***out, size_t *count, char *note,
                                     size_t note_cap) {
    if (out) *out = NULL;
    if (count) *count = 0;
    if (note && note_cap) note[0] = '\0';
    CKPTIO_RETURN_IF(!dir || !*dir || !out || !count || (!keep && nkeep), CKPTIO_E_INVAL,
                     "ckptio_dcp_stale_files: dir, out and count are required");
    return ckptio__dcp_stale_files_listed(dir, keep, nkeep, committed, NULL, out, count, note, note_cap);
}

ckptio_status ckptio__dcp_stale_files_listed(const char *dir, const char *const *keep, size_t nkeep,
                                             const ckptio_dcp_committed *committed, ckptio__dcp_prefetch *listed,
                                             char ***out, size_t *count, char *note, size_t note_cap) {
    ckptio__dcp_list entries = {0}, kept = {0}, candidates = {0}, referenced = {0}, young = {0};
    ckptio_engine *engine = NULL;
    ckptio_status st = object_engine(dir, &engine);
    if (st == CKPTIO_OK && engine && listed) st = ckptio__dcp_prefetch_take_listing(listed, &entries, &young);
    else if (st == CKPTIO_OK)
        st = engine ? ckptio__dcp_list_objects(engine, dir, &entries, &young, NULL) : list_dir(NULL, dir, &entries);
    for (size_t i = 0; st == CKPTIO_OK && i < nkeep; i++)
        if (!ckptio__dcp_list_add(&kept, keep[i])) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) ckptio__dcp_list_sort(&kept);
    for (size_t i = 0; st == CKPTIO_OK && i < entries.n; i++) {
        const char *name = entries.v[i];
        /* A shared save's mark that lapsed goes too (a live one is among the young). */
        if (ckptio__dcp_list_has(&kept, name) || ckptio__dcp_list_has(&young, name) ||
            !(ckptio__dcp_stale_name(name) || (engine && ckptio__dcp_shared_mark_name(name))))
            continue;
        if (!engine) { /* on a file system (objects are all plain files) */
            const mode_t type = entry_type(dir, name);
            if (!type) continue; /* gone meanwhile */
            if (type != S_IFREG) {
                /* Temporaries that are not regular files are the cleaner's rule to leave (temporaries.c). */
                if (!ckptio__dcp_temporary_name(name)) note_left_alone(note, note_cap, dir, name, type);
                continue;
            }
        }
        if (!ckptio__dcp_list_add(&candidates, name)) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    bool known = true;
    if (st == CKPTIO_OK && candidates.n)
        st = referenced_now(engine, dir, &entries, committed, &referenced, &known, note, note_cap);
    ckptio__dcp_list victims = {0}, tokens = {0};
    if (st == CKPTIO_OK && known) st = manifests_of(&referenced, &tokens);
    for (size_t i = 0; st == CKPTIO_OK && i < candidates.n; i++) {
        const char *name = candidates.v[i];
        /* Not knowing what a metadata file references, only temporaries go. */
        const bool go = known ? !ckptio__dcp_list_has(&referenced, name) && !ckptio__dcp_list_has(&tokens, name)
                              : ckptio__dcp_temporary_name(name);
        if (go && !ckptio__dcp_list_add(&victims, name)) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    }
    if (st == CKPTIO_OK) {
        ckptio__dcp_list_sort(&victims);
        *out = victims.v;
        *count = victims.n;
        if (!victims.v && !(*out = ckptio__calloc(1, sizeof **out))) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    } else {
        ckptio__dcp_list_clear(&victims);
    }
    ckptio__dcp_list_clear(&entries);
    ckptio__dcp_list_clear(&kept);
    ckptio__dcp_list_clear(&candidates);
    ckptio__dcp_list_clear(&referenced);
    ckptio__dcp_list_clear(&tokens);
    ckptio__dcp_list_clear(&young);
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_engine_destroy(engine);
    if (saved) ckptio__error_restore(saved);
    return st;
}

/* ---- removing ----------------------------------------------------------------------- */

/* Unlinks the temporary `path` when no live writer holds it, as
 * ckptio_cleanup_temporaries does: a regular file we can flock, still under
 * its name (a writer holds its flock until it commits or closes; the kernel
 * drops it when the writer dies). Returns 1 when removed, 0 when kept, -1
 * with errno when the unlink failed. */
static int remove_temporary(const char *path) {
    struct stat mine, named;
    mode_t type = 0;
    const int fd = ckptio__open_regular(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW, &mine, &type);
    if (fd < 0) return 0; /* gone, a symlink, a FIFO or device, or not ours to check: keep */
    int ret = 0;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        lstat(path, &named) == 0 && named.st_dev == mine.st_dev && named.st_ino == mine.st_ino)
        ret = ckptio__unlink(path) == 0 ? 1 : -1;
    const int err = errno;
    close(fd); /* after the unlink: the lock covers it */
    errno = err;
    return ret;
}

ckptio_status ckptio_dcp_remove_files(const char *dir, const char *const *list, size_t count, unsigned flags,
                                      const ckptio_dcp_committed *committed, size_t *removed_out, char *note,
                                      size_t note_cap) {
    return ckptio__dcp_remove_files_listed(dir, list, count, flags, committed, NULL, removed_out, note, note_cap);
}

ckptio_status ckptio__dcp_remove_files_listed(const char *dir, const char *const *list, size_t count, unsigned flags,
                                              const ckptio_dcp_committed *committed, ckptio__dcp_prefetch *prefetched,
                                              size_t *removed_out, char *note, size_t note_cap) {
    if (removed_out) *removed_out = 0;
    if (note && note_cap) note[0] = '\0';
    CKPTIO_RETURN_IF(!dir || !*dir || (!list && count), CKPTIO_E_INVAL, "ckptio_dcp_remove_files: dir is required");
    CKPTIO_RETURN_IF(flags & ~(unsigned)(CKPTIO_DCP_SYNC | CKPTIO_DCP_RECHECK), CKPTIO_E_INVAL,
                     "ckptio_dcp_remove_files: unknown flags 0x%x", flags);
    for (size_t i = 0; i < count; i++)
        CKPTIO_RETURN_IF(!list[i] || !*list[i] || strchr(list[i], '/'), CKPTIO_E_INVAL,
                         "ckptio_dcp_remove_files: '%s' is not a file name", list[i] ? list[i] : "(null)");
    ckptio__dcp_list referenced = {0};
    bool known = true, recheck = false;
    ckptio_engine *engine = NULL;
    CKPTIO_FORWARD(object_engine(dir, &engine));
    for (size_t i = 0; (flags & CKPTIO_DCP_RECHECK) && i < count; i++)
        if (!ckptio__dcp_temporary_name(list[i])) recheck = true;
    if (recheck) {
        ckptio__dcp_list entries = {0};
        ckptio_status st = list_dir(engine, dir, &entries);
        if (st == CKPTIO_OK) st = referenced_now(engine, dir, &entries, committed, &referenced, &known, note, note_cap);
        ckptio__dcp_list_clear(&entries);
        if (st != CKPTIO_OK) {
            ckptio__dcp_list_clear(&referenced);
            ckptio__error_saved *saved = ckptio__error_save();
            ckptio_engine_destroy(engine);
            ckptio__error_restore(saved);
            return st;
        }
    }
    size_t removed = 0;
    ckptio_status first = CKPTIO_OK;
    ckptio__dcp_list urls = {0}; /* objects: deleted together below (no temporaries there: uploads appear whole) */
    for (size_t i = 0; i < count; i++) {
        const char *name = list[i];
        const bool temporary = ckptio__dcp_temporary_name(name);
        if (recheck && !temporary && (!known || ckptio__dcp_list_has(&referenced, name))) continue;
        char *path = ckptio__dcp_join(dir, name);
        if (!path || (engine && !ckptio__dcp_list_add(&urls, path))) {
            if (first == CKPTIO_OK) first = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
            ckptio__free(path);
            continue;
        }
        if (engine) {
            ckptio__free(path);
            continue;
        }
        struct stat sb;
        int ret = 0;
        if (temporary) ret = remove_temporary(path);
        else if (lstat(path, &sb) != 0) ret = errno == ENOENT ? 0 : -1;
        else if (!S_ISREG(sb.st_mode)) note_left_alone(note, note_cap, dir, name, sb.st_mode);
        else ret = ckptio__unlink(path) == 0 ? 1 : -1;
        if (ret > 0) removed++;
        else if (ret < 0 && errno != ENOENT && first == CKPTIO_OK)
            first = CKPTIO_FAIL_SYS_NOTE(errno, "unlink", path, "removing a file of an older save; %s",
                                         CKPTIO__DCP_COMMITTED);
        ckptio__free(path);
    }
    ckptio__dcp_list_clear(&referenced);
    if (engine) {
        if (first == CKPTIO_OK) first = ckptio__dcp_remove_objects(engine, dir, urls.v, urls.n, prefetched, &removed);
        ckptio__dcp_list_clear(&urls);
        if (removed_out) *removed_out = removed;
        ckptio__error_saved *saved = first != CKPTIO_OK ? ckptio__error_save() : NULL;
        ckptio_engine_destroy(engine);
        if (saved) ckptio__error_restore(saved);
        return first;
    }
    if (removed_out) *removed_out = removed;
    if (removed && (flags & CKPTIO_DCP_SYNC)) {
        /* Also after a failed unlink: what was removed must stay removed. */
        const int err = ckptio__dcp_fsync_dir(dir);
        if (err)
            return CKPTIO_FAIL_SYS_NOTE(err, "fsync", dir,
                                        "flushing the directory after removing %zu files of older saves (a power loss "
                                        "may bring them back); %s",
                                        removed, CKPTIO__DCP_COMMITTED);
    }
    return first;
}
