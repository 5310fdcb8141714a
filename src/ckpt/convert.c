/*
 * convert.c - ckptio_convert(): any checkpoint ckptio reads into any format
 * it writes (safetensors file, Hugging Face directory, torch.save file, DCP
 * directory), tensor bytes through the engine in bounded memory.
 *
 * Everything that can be known before writing is checked before writing:
 * the input parses, OUT's kind, every dtype exists in OUT's format, OUT's
 * path can take the result; what OUT cannot hold is said in notes. Then
 * the output appears atomically: a file by the usual temporary and rename;
 * a directory is built under a new hidden name beside OUT and renamed to
 * OUT at the end (rename(2) replaces an empty directory; a directory with
 * files in it is never written into, so nothing of the user's is mixed
 * with or lost to a conversion).
 */
#include "convert_internal.h"
#include "engine_internal.h"
#include "io_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_DEFAULT_SHARD ((uint64_t)5000000000u) /* "5GB", huggingface_hub's default */
#define OUT_FAIL(status, out, ...) \
    CKPTIO_FAIL_CTX((status), &((ckptio__err_ctx){.path = (out), .file_offset = -1}), __VA_ARGS__)

static bool has_suffix(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool is_dir(ckptio_engine *engine, const char *path) {
    if (ckptio__s3_is_url(path)) { /* a prefix with objects under it */
        ckptio__path_kind kind = CKPTIO__PATH_MISSING;
        ckptio__error_saved *saved = ckptio__error_save();
        const bool yes = ckptio__object_stat(engine, path, &kind, NULL) == CKPTIO_OK && kind == CKPTIO__PATH_DIR;
        ckptio__error_restore(saved);
        return yes;
    }
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static const char *target_name(ckptio_convert_to to) {
    switch (to) {
    case CKPTIO_CONVERT_SAFETENSORS: return "safetensors";
    case CKPTIO_CONVERT_HF: return "a Hugging Face directory";
    case CKPTIO_CONVERT_TORCH: return "the torch.save file (a flat dict of tensors)";
    case CKPTIO_CONVERT_DCP: return "the DCP directory";
    default: return "?";
    }
}

/* OUT's kind when the caller left it to OUT's name (rules in ckptio.h). */
static ckptio_status resolve_to(ckptio_engine *engine, const ckptio_convert_options *o, ckptio_format from,
                                const char *out, ckptio_convert_to *to) {
    if (o->to != CKPTIO_CONVERT_AUTO) {
        CKPTIO_RETURN_IF(o->to < CKPTIO_CONVERT_SAFETENSORS || o->to > CKPTIO_CONVERT_DCP, CKPTIO_E_INVAL,
                         "ckptio_convert: unknown output kind %d", (int)o->to);
        *to = o->to;
    } else if (o->shard_size > 0) {
        *to = CKPTIO_CONVERT_HF;
    } else if (has_suffix(out, "/") || is_dir(engine, out)) {
        if (from != CKPTIO_FORMAT_DCP)
            return OUT_FAIL(CKPTIO_E_INVAL, out, "names a directory: say which layout to write into it, a Hugging Face "
                            "directory (sharded safetensors) or a torch.distributed.checkpoint directory "
                            "(ckptio convert --to hf | --to dcp)");
        *to = CKPTIO_CONVERT_HF;
    } else if (has_suffix(out, ".safetensors")) {
        *to = CKPTIO_CONVERT_SAFETENSORS;
    } else if (has_suffix(out, ".pt") || has_suffix(out, ".pth") || has_suffix(out, ".bin") ||
               has_suffix(out, ".ckpt")) {
        *to = CKPTIO_CONVERT_TORCH;
    } else {
        *to = from == CKPTIO_FORMAT_DCP ? CKPTIO_CONVERT_HF
              : from == CKPTIO_FORMAT_TORCH ? CKPTIO_CONVERT_SAFETENSORS
                                            : CKPTIO_CONVERT_TORCH;
    }
    if (o->shard_size > 0 && *to != CKPTIO_CONVERT_HF)
        return OUT_FAIL(CKPTIO_E_INVAL, out, "a shard size applies to a Hugging Face directory output only");
    return CKPTIO_OK;
}

/* Every tensor's dtype exists in OUT's format. */
static ckptio_status check_dtypes(const ckptio__convert_source *s, const char *in, ckptio_convert_to to) {
    const bool safetensors = to == CKPTIO_CONVERT_SAFETENSORS || to == CKPTIO_CONVERT_HF;
    for (size_t i = 0; i < s->count; i++) {
        const ckptio_tensor_source *t = &s->tensors[i];
        const char *st_name = ckptio_dtype_name(t->dtype), *torch_name = ckptio_dtype_torch_name(t->dtype);
        if (safetensors ? (!st_name || !st_name[0]) : !torch_name)
            return CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                   &((ckptio__err_ctx){.path = in, .subject = t->name, .file_offset = -1}),
                                   "tensor '%s' has dtype %s, which %s cannot store", t->name,
                                   safetensors ? (torch_name ? torch_name : "?") : (st_name ? st_name : "?"),
                                   safetensors ? "safetensors" : "torch");
    }
    return CKPTIO_OK;
}

/* check_out for an object store: a file OUT must not be a prefix with
 * objects under it; a directory OUT must be a prefix with nothing under it
 * (and no object of its name). */
static ckptio_status check_out_object(ckptio_engine *engine, const char *out, bool directory) {
    ckptio__path_kind kind = CKPTIO__PATH_MISSING;
    CKPTIO_FORWARD(ckptio__object_stat(engine, out, &kind, NULL));
    if (!directory && (kind == CKPTIO__PATH_DIR || has_suffix(out, "/")))
        return OUT_FAIL(CKPTIO_E_INVAL, out, "names a prefix with objects under it; the output is a file here: give "
                        "an object name");
    if (directory && kind == CKPTIO__PATH_FILE)
        return OUT_FAIL(CKPTIO_E_EXISTS, out, "is an object; the output is a directory (a prefix): remove it or give "
                        "another name (nothing was written)");
    if (directory) {
        char *asked = ckptio__path_join(out, "");
        if (!asked) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        const ckptio_status st = ckptio__object_stat(engine, asked, &kind, NULL);
        ckptio__free(asked);
        CKPTIO_FORWARD(st);
        if (kind == CKPTIO__PATH_DIR)
            return OUT_FAIL(CKPTIO_E_EXISTS, out, "has objects under it: ckptio writes a directory output only under "
                            "a prefix that holds nothing; remove them or give another name (nothing was written)");
    }
    return CKPTIO_OK;
}

typedef struct written {
    ckptio_engine *engine;
    const char *dir;
} written;

static int remove_written(void *user, const ckptio__object_entry *e) {
    const written *w = user;
    if (e->kind != CKPTIO__PATH_FILE) return 0;
    char *url = ckptio__path_join(w->dir, e->name);
    if (url) ckptio__object_remove(w->engine, url); /* best effort: the conversion's own error is reported */
    ckptio__free(url);
    return 0;
}

/* A directory output in object storage has no temporary name to rename:
 * it is written where it goes (into an empty prefix), the file that makes
 * it a checkpoint last (the index, .metadata), and on failure whatever was
 * written under the prefix is deleted again. */
static ckptio_status write_object_dir(ckptio_engine *engine, ckptio__convert_source *s, const char *dir,
                                      ckptio_convert_to to, const ckptio_convert_options *o, ckptio_convert_report *r);

/* A file OUT must not be a directory; a directory OUT must be new or empty. */
static ckptio_status check_out(ckptio_engine *engine, const char *out, bool directory) {
    if (ckptio__s3_is_url(out)) return check_out_object(engine, out, directory);
    struct stat sb;
    if (stat(out, &sb) != 0) {
        if (errno == ENOENT && !(!directory && has_suffix(out, "/"))) return CKPTIO_OK;
        return errno == ENOENT ? OUT_FAIL(CKPTIO_E_INVAL, out, "names a directory (it ends in '/'), not a file")
                               : CKPTIO_FAIL_SYS(errno, "stat", out, -1, "cannot look at the output path");
    }
    if (!directory)
        return S_ISDIR(sb.st_mode) ? OUT_FAIL(CKPTIO_E_INVAL, out, "is a directory; the output is a file here: "
                                              "give a file name") : CKPTIO_OK;
    if (!S_ISDIR(sb.st_mode))
        return OUT_FAIL(CKPTIO_E_EXISTS, out, "exists and is not a directory; the output is a directory: remove "
                        "it or give another name (nothing was written)");
    DIR *d = opendir(out);
    if (!d) return CKPTIO_FAIL_SYS(errno, "opendir", out, -1, "cannot read the output directory");
    const struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)) != NULL) empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty ? CKPTIO_OK
                 : OUT_FAIL(CKPTIO_E_EXISTS, out, "exists and is not empty: ckptio writes a directory output only "
                            "where there is none or an empty one; remove it or give another name (nothing was "
                            "written)");
}

static void note(const ckptio_convert_options *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const ckptio_convert_options *o, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->note(line, o->user);
}

/* Says what OUT will not hold; returns how many values, items and entries that is. */
static size_t tell_losses(const ckptio__convert_source *s, const char *in, ckptio_convert_to to,
                          const ckptio_convert_options *o) {
    const bool dcp_out = to == CKPTIO_CONVERT_DCP, file_out = to == CKPTIO_CONVERT_TORCH || dcp_out;
    const size_t bytes_lost = dcp_out ? 0 : s->byte_items;
    /* "format" only tags the framework that wrote the file, and the save id binds it to a manifest
     * the output does not have: neither is information the output loses. */
    size_t meta_lost = 0;
    for (size_t i = 0; file_out && i < s->metadata_count; i++)
        meta_lost += strcmp(s->metadata[i].key, "format") != 0 && strcmp(s->metadata[i].key, "ckptio.save_id") != 0;
    if (!o->note) return s->values + bytes_lost + meta_lost;
    if (s->shared)
        note(o, "%zu tensors share a storage with another tensor (views, tied weights); %s, so each is written "
             "as its own copy", s->shared, to == CKPTIO_CONVERT_TORCH ? "the flat torch.save file gives each "
             "tensor its own storage" : dcp_out ? "DCP stores each tensor on its own" : "safetensors cannot share "
             "bytes");
    if (s->values)
        note(o, "%zu non-tensor value%s (numbers, strings, _metadata, ...) cannot be stored in %s and %s dropped",
             s->values, s->values == 1 ? "" : "s", target_name(to), s->values == 1 ? "is" : "are");
    if (bytes_lost) {
        char names[768] = "";
        size_t used = 0;
        for (size_t j = 0; j < s->byte_items && used < sizeof names - 1; j++) {
            ckptio_dcp_bytes_info bi;
            if (ckptio_dcp_bytes(s->dcp, j, &bi) != CKPTIO_OK) break;
            int n = snprintf(names + used, sizeof names - used, "%s '%s'", j ? "," : "", bi.fqn);
            if (n < 0 || (size_t)n >= sizeof names - used) {
                snprintf(names + sizeof names - 5, 5, " ...");
                break;
            }
            used += (size_t)n;
        }
        note(o, "%zu byte item%s (non-tensor values) cannot be stored in %s and %s skipped:%s", bytes_lost,
             bytes_lost == 1 ? "" : "s", target_name(to), bytes_lost == 1 ? "is" : "are", names);
    }
    if (meta_lost)
        note(o, "%zu __metadata__ entr%s of %s %s not carried: %s has no such field", meta_lost,
             meta_lost == 1 ? "y" : "ies", in, meta_lost == 1 ? "is" : "are",
             dcp_out ? "a DCP directory" : "a torch.save file");
    return s->values + bytes_lost + meta_lost;
}

/* The directory temporary ".STEM.ckptio-tmp-XXXXXX" beside `out` (no
 * trailing '/'), created empty but for its flocked lock file (0777 & ~umask,
 * like the mkdir a user would run): `ckptio clean` removes it once the
 * conversion is dead (killed), never while it runs. */
static ckptio_status make_temp_dir(const char *out, char *tmp, size_t cap, int *lock_fd) {
    const int err = ckptio__temporary_dir_create(out, tmp, cap, lock_fd);
    if (err == ENAMETOOLONG) return OUT_FAIL(CKPTIO_E_INVAL, out, "path too long");
    if (err == EEXIST) return OUT_FAIL(CKPTIO_E_EXISTS, out, "no free temporary name beside it");
    if (err)
        return CKPTIO_FAIL_SYS(err, "mkdir", tmp, -1, "cannot create the directory the output is built in (nothing "
                               "was written)");
    return CKPTIO_OK;
}

/* Removes the regular files of a temporary directory ckptio made, then the directory. */
static void remove_temp_dir(const char *tmp) {
    DIR *d = opendir(tmp);
    if (d) {
        const struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(tmp);
}

/* The parent directory of `path`, fsynced so that a rename in it survives a power loss. */
static ckptio_status sync_parent(const char *path) {
    char parent[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == path) snprintf(parent, sizeof parent, "/");
    else snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
    const int fd = ckptio__open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0 || ckptio__fsync(fd) != 0) {
        const int err = errno;
        if (fd >= 0) close(fd);
        return CKPTIO_FAIL_SYS_NOTE(err, "fsync", parent, "flushing the directory after renaming the output into "
                                    "place: %s is complete but may not survive a power loss", path);
    }
    close(fd);
    return CKPTIO_OK;
}

/* What a safetensors file or shard is written from: the source, and the metadata it gets. */
typedef struct shard_out {
    ckptio_engine *engine;
    ckptio__convert_source *s;
    const ckptio_kv *meta;
    size_t nmeta;
    const size_t *members; /* for fill_member */
} shard_out;

static ckptio_status fill_member(void *ctx, size_t i, void *buf, uint64_t nbytes) {
    const shard_out *o = ctx;
    return ckptio__convert_source_fill(o->s, o->members[i], buf, nbytes);
}

/* One safetensors file of source tensors members[0..n): a torch.save or DCP
 * source through its own bounded writer (expanded views written in runs,
 * large zstd tensors streamed from their frames), a safetensors one tensor
 * by tensor. */
static ckptio_status save_shard(void *ctx, const char *path, const size_t *members, size_t n) {
    shard_out *o = ctx;
    ckptio__convert_source *s = o->s;
    size_t *index = ckptio__calloc(n + 1, sizeof *index);
    ckptio_tensor_source *sub = ckptio__calloc(n + 1, sizeof *sub);
    ckptio_status st = CKPTIO_OK;
    if (!index || !sub) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", n);
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        index[k] = s->index[members[k]];
        sub[k] = s->tensors[members[k]];
    }
    if (s->dcp) {
        st = ckptio_dcp_save_safetensors(s->dcp, path, index, n, o->meta, o->nmeta, 0);
    } else if (s->torch) {
        st = ckptio_torch_save_safetensors(s->torch, path, index, n, o->meta, o->nmeta, 0);
    } else {
        o->members = members;
        st = ckptio__st_save_streamed(o->engine, path, sub, n, o->meta, o->nmeta, 0, fill_member, NULL, NULL, o);
    }
out:
    ckptio__free(sub);
    ckptio__free(index);
    return st;
}

static ckptio_status write_out(ckptio_engine *engine, ckptio__convert_source *s, const char *path,
                               ckptio_convert_to to, const ckptio_convert_options *o, ckptio_convert_report *r) {
    /* A safetensors input's metadata goes on (less the save id that binds it to a
     * manifest this output has not); otherwise the metadata torch writers give. */
    ckptio_kv *meta = ckptio__calloc(s->metadata_count + 1, sizeof *meta);
    size_t *all = ckptio__calloc(s->count + 1, sizeof *all);
    ckptio_status st = CKPTIO_OK;
    if (!meta || !all) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu tensors", s->count);
        goto out;
    }
    size_t nmeta = 0;
    for (size_t i = 0; i < s->metadata_count; i++)
        if (strcmp(s->metadata[i].key, "ckptio.save_id") != 0) meta[nmeta++] = s->metadata[i];
    if (s->format != CKPTIO_FORMAT_SAFETENSORS && s->format != CKPTIO_FORMAT_HF_INDEX)
        meta[nmeta++] = (ckptio_kv){"format", "pt"};
    for (size_t i = 0; i < s->count; i++) all[i] = i;
    shard_out so = {.engine = engine, .s = s, .meta = meta, .nmeta = nmeta};
    const unsigned sync = ckptio__engine_setting(engine, CKPTIO_OPT_SYNC) ? CKPTIO_DCP_SYNC : 0;
    r->files = 1;
    switch (to) {
    case CKPTIO_CONVERT_SAFETENSORS: st = save_shard(&so, path, all, s->count); break;
    case CKPTIO_CONVERT_HF:
        st = ckptio__hf_save(path, s->tensors, s->count, o->shard_size ? o->shard_size : HF_DEFAULT_SHARD, sync,
                             save_shard, &so, &r->files);
        break;
    case CKPTIO_CONVERT_TORCH: {
        ckptio_torch_writer *w = NULL;
        const ckptio_torch_save_options opts = {.storage_alignment = o->storage_alignment};
        if ((st = ckptio__torch_flat_writer(path, s->tensors, s->count, &w)) == CKPTIO_OK)
            st = ckptio__torch_save_streamed(engine, path, w, &opts, ckptio__convert_source_fill, s);
        ckptio_torch_writer_destroy(w);
        break;
    }
    default:
        r->byte_items = s->byte_items;
        r->files = s->count + s->byte_items > 0;
        st = ckptio__dcp_save_streamed(engine, path, s->tensors, s->count, ckptio__convert_source_fill, s,
                                       s->byte_items, ckptio__convert_source_bytes, s);
    }
out:
    ckptio__free(all);
    ckptio__free(meta);
    return st;
}

static ckptio_status write_object_dir(ckptio_engine *engine, ckptio__convert_source *s, const char *dir,
                                      ckptio_convert_to to, const ckptio_convert_options *o, ckptio_convert_report *r) {
    const ckptio_status st = write_out(engine, s, dir, to, o, r);
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        written w = {engine, dir};
        ckptio__object_dir_list(engine, dir, remove_written, &w);
        ckptio__error_restore(saved);
    }
    return st;
}

ckptio_status ckptio_convert(ckptio_engine *engine, const char *in, const char *out,
                             const ckptio_convert_options *options, ckptio_convert_report *report) {
    CKPTIO_RETURN_IF(!engine || !in || !out || !*out, CKPTIO_E_INVAL,
                     "ckptio_convert: engine, input and output paths are required");
    const ckptio_convert_options defaults = {0};
    const ckptio_convert_options *o = options ? options : &defaults;
    CKPTIO_RETURN_IF(o->storage_alignment > 65536, CKPTIO_E_RANGE,
                     "ckptio_convert: storage alignment %u is outside 1..65536", o->storage_alignment);
    ckptio_convert_report r = {0};
    ckptio__convert_source s;
    CKPTIO_FORWARD(ckptio__convert_source_open(engine, in, &s));
    ckptio_status st;
    ckptio_convert_to to = CKPTIO_CONVERT_AUTO;
    char final[4096], tmp[4096];
    /* OUT without its trailing slashes names the directory. */
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    if (n >= sizeof final) {
        st = OUT_FAIL(CKPTIO_E_INVAL, out, "path too long");
        goto out;
    }
    memcpy(final, out, n);
    final[n] = '\0';
    if ((st = resolve_to(engine, o, s.format, out, &to)) != CKPTIO_OK) goto out;
    const bool directory = to == CKPTIO_CONVERT_HF || to == CKPTIO_CONVERT_DCP;
    if ((st = check_dtypes(&s, in, to)) != CKPTIO_OK) goto out;
    /* A torch.save or DCP output holds each tensor whole: only where bytes on disk justify it. */
    if ((to == CKPTIO_CONVERT_TORCH || to == CKPTIO_CONVERT_DCP) &&
        (st = ckptio__convert_source_check_held(&s, in)) != CKPTIO_OK)
        goto out;
    if ((st = check_out(engine, directory ? final : out, directory)) != CKPTIO_OK) goto out;
    r = (ckptio_convert_report){.from = s.format, .to = to, .tensors = s.count, .bytes = s.total, .shared = s.shared};
    r.dropped = tell_losses(&s, in, to, o);
    if (!directory) {
        st = write_out(engine, &s, out, to, o, &r);
        goto out;
    }
    if (ckptio__s3_is_url(final)) {
        st = write_object_dir(engine, &s, final, to, o, &r);
        goto out;
    }
    int lock_fd = -1;
    if ((st = make_temp_dir(final, tmp, sizeof tmp, &lock_fd)) != CKPTIO_OK) goto out;
    st = write_out(engine, &s, tmp, to, o, &r);
    int err = 0;
    if (st == CKPTIO_OK && (err = ckptio__temporary_dir_unlock(tmp)) != 0)
        st = CKPTIO_FAIL_SYS(err, "unlink", tmp, -1, "removing the lock file of the finished output before it is "
                             "moved into place (nothing was written under %s)", final);
    if (st == CKPTIO_OK && ckptio__rename(tmp, final) != 0)
        st = CKPTIO_FAIL_SYS(errno, "rename", final, -1, "moving the finished output %s into place (nothing was "
                             "written under its name)", tmp);
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        remove_temp_dir(tmp);
        ckptio__error_restore(saved);
    }
    close(lock_fd); /* after the rename or the removal: until then the lock says the directory is in use */
    if (st != CKPTIO_OK) goto out;
    if (ckptio__engine_setting(engine, CKPTIO_OPT_SYNC)) st = sync_parent(final);
out:;
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio__convert_source_close(&s);
    if (saved) ckptio__error_restore(saved);
    if (st == CKPTIO_OK && report) *report = r;
    return st;
}
