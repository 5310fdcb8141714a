/*
 * manifest_verify.c - checking a safetensors file, or tensors just read
 * from it, against the checksum manifest beside it.
 *
 * First the manifest must come from the save that wrote this file (the
 * same save id in both, manifest_save.c) and describe it: same size, same
 * header bytes (hashed), same tensors at the same offsets. Only then are
 * data blocks compared, so that a stale or foreign manifest is reported as
 * such (CKPTIO_E_STALE), never as corrupt data. A mismatch names the
 * tensor, the file and the byte range of the block.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "manifest_internal.h"
#include "safetensors_internal.h"

#include <stdio.h>
#include <string.h>
#include "xxh3_fast.h"

#define READ_PIECE (8u << 20) /* file bytes read per request while hashing */

#define VFAIL(status_, path_, offset_, subject_, ...)                                                          \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.operation = "verify", .path = (path_),                      \
                                                   .file_offset = (int64_t)(offset_), .subject = (subject_)}),  \
                    __VA_ARGS__)

/* Reads and parses the manifest. *mpath receives its path (caller frees). */
static ckptio_status load(ckptio_safetensors *st, const char *manifest_path, ckptio__manifest *m, char **mpath) {
    const size_t cap = strlen(st->path) + strlen(CKPTIO_MANIFEST_SUFFIX) + 1;
    *mpath = manifest_path ? ckptio__strdup(manifest_path) : ckptio__malloc(cap);
    if (!*mpath) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory", st->path);
    if (!manifest_path) CKPTIO_FORWARD(ckptio_manifest_path(st->path, *mpath, cap));
    ckptio_file *f = NULL;
    char *text = NULL;
    uint64_t size = 0;
    ckptio_status s = ckptio_file_open(st->engine, *mpath, CKPTIO_OPEN_READ, &f);
    if (s == CKPTIO_E_NOT_FOUND)
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND,
                               &((ckptio__err_ctx){.operation = "verify", .path = st->path, .file_offset = -1}),
                               "no checksum manifest %s (the file was saved without CKPTIO_SAFETENSORS_CHECKSUMS, or "
                               "a crash came before its manifest was committed)",
                               *mpath);
    if (s != CKPTIO_OK) return s;
    if ((s = ckptio_file_size(f, &size)) != CKPTIO_OK) goto out;
    /* The size bounds the allocation, not anything the file says. */
    if (size > CKPTIO__MANIFEST_MAX_BYTES) {
        s = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                            &((ckptio__err_ctx){.operation = "parse manifest", .path = *mpath, .file_offset = -1}),
                            "manifest of %llu bytes exceeds the limit of %u bytes", (unsigned long long)size,
                            CKPTIO__MANIFEST_MAX_BYTES);
        goto out;
    }
    if (!(text = ckptio__malloc((size_t)size + 1))) {
        s = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for a %llu-byte manifest", *mpath, (unsigned long long)size);
        goto out;
    }
    if ((s = ckptio__file_io(f, CKPTIO_READ, text, size, 0)) != CKPTIO_OK) goto out;
    s = ckptio__manifest_parse(text, (size_t)size, *mpath, m);
out:
    ckptio__free(text);
    if (f) {
        ckptio__error_saved *saved = s != CKPTIO_OK ? ckptio__error_save() : NULL;
        const ckptio_status cst = ckptio_file_close(f);
        if (saved) ckptio__error_restore(saved);
        else if (s == CKPTIO_OK) s = cst;
    }
    return s;
}

/* The manifest must come from the save that wrote the file: the same save
 * id in both, or (version 1) in neither. *bound says whether ids matched. */
static ckptio_status check_save_id(const ckptio_safetensors *st, const ckptio__manifest *m, const char *mpath,
                                   bool *bound) {
    const char *id = NULL;
    for (size_t i = 0; i < st->metadata_count; i++)
        if (strcmp(st->metadata[i].key, CKPTIO_SAVE_ID_KEY) == 0) id = st->metadata[i].value;
    *bound = id && m->save_id[0] && strcmp(id, m->save_id) == 0;
    if (*bound || (!id && !m->save_id[0])) return CKPTIO_OK;
    return VFAIL(CKPTIO_E_STALE, st->path, -1, NULL,
                 "the manifest %s was written by another save (save id %s) than this file (save id %.64s%s): the "
                 "manifest is stale or belongs to another file (two saves to one path, or a save that replaced the "
                 "file during this check); the data was not checked",
                 mpath, m->save_id[0] ? m->save_id : "none", id ? id : "none", id && strlen(id) > 64 ? "..." : "");
}

/* The manifest must describe this file; out[i] = manifest index of the
 * file's tensor i. A difference is a stale manifest, unless the save ids
 * say both come from one save (`bound`): then the file changed since. */
static ckptio_status check_describes(ckptio_safetensors *st, const ckptio__manifest *m, const char *mpath, bool bound,
                                     size_t *out) {
    const ckptio_status status = bound ? CKPTIO_E_CHECKSUM : CKPTIO_E_STALE;
    const char *why = bound ? "the file changed after the save that wrote both"
                            : "the manifest is stale or belongs to another file";
    if (m->file_size != st->file_size || m->data_offset != st->data_offset)
        return VFAIL(status, st->path, -1, NULL,
                     "the manifest %s describes a file of %llu bytes with data from byte %llu, this one has %llu bytes "
                     "with data from byte %llu: %s",
                     mpath, (unsigned long long)m->file_size, (unsigned long long)m->data_offset,
                     (unsigned long long)st->file_size, (unsigned long long)st->data_offset, why);
    if (m->count != st->count)
        return VFAIL(status, st->path, -1, NULL, "the manifest %s lists %zu tensors, the file has %zu: %s", mpath,
                     m->count, st->count, why);
    for (size_t i = 0; i < st->count; i++) {
        const ckptio_tensor_info *t = &st->tensors[i];
        const size_t k = ckptio__manifest_find(m, t->name);
        if (k == SIZE_MAX)
            return VFAIL(status, st->path, (int64_t)t->file_offset, t->name, "tensor missing from the manifest %s: %s",
                         mpath, why);
        if (m->tensors[k].offset != t->file_offset || m->tensors[k].nbytes != t->nbytes)
            return VFAIL(status, st->path, (int64_t)t->file_offset, t->name,
                         "the manifest %s places it at bytes [%llu, +%llu), the file at [%llu, +%llu): %s", mpath,
                         (unsigned long long)m->tensors[k].offset, (unsigned long long)m->tensors[k].nbytes,
                         (unsigned long long)t->file_offset, (unsigned long long)t->nbytes, why);
        out[i] = k;
    }
    /* The header: same names and offsets could still differ in dtype,
     * shape or metadata. */
    unsigned char *header = ckptio__malloc(st->data_offset ? (size_t)st->data_offset : 1);
    if (!header) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for the header", st->path);
    ckptio_status s = ckptio__file_io(st->file, CKPTIO_READ, header, st->data_offset, 0);
    const uint64_t h = XXH3_64bits(header, (size_t)st->data_offset);
    ckptio__free(header);
    CKPTIO_FORWARD(s);
    if (h != m->header_hash)
        return VFAIL(CKPTIO_E_CHECKSUM, st->path, 0, "header",
                     "bytes [0, %llu) hash to %016llx, the manifest %s recorded %016llx",
                     (unsigned long long)st->data_offset, (unsigned long long)h, mpath,
                     (unsigned long long)m->header_hash);
    return CKPTIO_OK;
}

static ckptio_status mismatch(const char *path, const char *mpath, const ckptio__manifest_tensor *t, uint64_t block,
                              uint64_t block_bytes, uint64_t got) {
    const uint64_t begin = t->offset + block * block_bytes;
    const uint64_t end =
        begin + (t->nbytes - block * block_bytes < block_bytes ? t->nbytes - block * block_bytes : block_bytes);
    return VFAIL(CKPTIO_E_CHECKSUM, path, (int64_t)begin, t->name,
                 "checksum mismatch in file bytes [%llu, %llu) (block %llu of %zu): XXH3-64 %016llx, the manifest %s "
                 "recorded %016llx",
                 (unsigned long long)begin, (unsigned long long)end, (unsigned long long)block, t->nblocks,
                 (unsigned long long)got, mpath, (unsigned long long)t->blocks[block]);
}

/* Hashes each block of tensor t, taken from the file (mem NULL) or from
 * memory. */
static ckptio_status check_tensor(ckptio_safetensors *st, const char *mpath, const ckptio__manifest *m,
                                  const ckptio__manifest_tensor *t, const unsigned char *mem, unsigned char *buf,
                                  XXH3_state_t *state, ckptio_verify_report *r) {
    for (size_t b = 0; b < t->nblocks; b++) {
        const uint64_t off = (uint64_t)b * m->block_bytes;
        const uint64_t len = t->nbytes - off < m->block_bytes ? t->nbytes - off : m->block_bytes;
        uint64_t h;
        if (mem) {
            h = XXH3_64bits(mem + off, (size_t)len);
        } else {
            XXH3_64bits_reset(state);
            for (uint64_t done = 0; done < len;) {
                const uint64_t n = len - done < READ_PIECE ? len - done : READ_PIECE;
                CKPTIO_FORWARD(ckptio__file_io(st->file, CKPTIO_READ, buf, n, t->offset + off + done));
                XXH3_64bits_update(state, buf, (size_t)n);
                done += n;
            }
            h = XXH3_64bits_digest(state);
        }
        if (h != t->blocks[b]) return mismatch(st->path, mpath, t, b, m->block_bytes, h);
        r->blocks++;
        r->bytes += len;
    }
    r->tensors++;
    return CKPTIO_OK;
}

/* Shared by verify (targets NULL: every tensor from the file) and
 * read_verified (the targets' memory). */
static ckptio_status run_check(ckptio_safetensors *st, const char *manifest_path, const ckptio_tensor_target *targets,
                               size_t count, ckptio_verify_report *report) {
    ckptio_verify_report r = {0};
    ckptio__manifest m = {0};
    char *mpath = NULL;
    size_t *index = NULL;
    unsigned char *buf = NULL;
    XXH3_state_t *state = NULL;
    bool bound = false;
    ckptio_status s = load(st, manifest_path, &m, &mpath);
    if (s != CKPTIO_OK) goto out;
    if (!(index = ckptio__calloc(st->count ? st->count : 1, sizeof *index))) {
        s = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory", st->path);
        goto out;
    }
    if ((s = check_save_id(st, &m, mpath, &bound)) != CKPTIO_OK) goto out;
    if ((s = check_describes(st, &m, mpath, bound, index)) != CKPTIO_OK) goto out;
    if (!targets) {
        buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, READ_PIECE);
        state = XXH3_createState();
        if (!buf || !state) {
            s = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory for verification", st->path);
            goto out;
        }
        for (size_t i = 0; i < st->count && s == CKPTIO_OK; i++)
            s = check_tensor(st, mpath, &m, &m.tensors[index[i]], NULL, buf, state, &r);
    } else {
        for (size_t i = 0; i < count && s == CKPTIO_OK; i++)
            s = check_tensor(st, mpath, &m, &m.tensors[index[targets[i].index]], targets[i].data, NULL, NULL, &r);
    }
out:
    if (report) *report = r;
    XXH3_freeState(state);
    ckptio__free(buf);
    ckptio__free(index);
    ckptio__free(mpath);
    ckptio__manifest_cleanup(&m);
    return s;
}

static ckptio_status need_file(const ckptio_safetensors *st, const char *fn) {
    if (!st) return CKPTIO_FAIL(CKPTIO_E_INVAL, "%s: the handle is NULL", fn);
    if (!st->file)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "%s: the handle was made by ckptio_safetensors_parse and has no file", fn);
    return CKPTIO_OK;
}

ckptio_status ckptio_safetensors_verify(ckptio_safetensors *st, const char *manifest_path,
                                        ckptio_verify_report *report) {
    if (report) *report = (ckptio_verify_report){0};
    CKPTIO_FORWARD(need_file(st, "ckptio_safetensors_verify"));
    return run_check(st, manifest_path, NULL, 0, report);
}

ckptio_status ckptio_safetensors_read_verified(ckptio_safetensors *st, const char *manifest_path,
                                               const ckptio_tensor_target *targets, size_t count) {
    CKPTIO_FORWARD(need_file(st, "ckptio_safetensors_read_verified"));
    if (count && !targets)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_safetensors_read_verified: targets is NULL but count is %zu", count);
    /* Refuse GPU targets before moving a byte. */
    for (size_t i = 0; i < count; i++) {
        ckptio_mem_kind kind = targets[i].mem_kind;
        if (kind == CKPTIO_MEM_AUTO) kind = ckptio__gpu_classify(targets[i].data);
        if (kind != CKPTIO_MEM_HOST && kind != CKPTIO_MEM_PINNED) {
            const char *name = targets[i].index < st->count ? st->tensors[targets[i].index].name : NULL;
            return VFAIL(CKPTIO_E_UNSUPPORTED, st->path, -1, name,
                         "target %zu is GPU memory: checksums are checked on host memory only (verify the file with "
                         "ckptio_safetensors_verify)",
                         i);
        }
    }
    CKPTIO_FORWARD(ckptio_safetensors_read(st, targets, count));
    return run_check(st, manifest_path, targets, count, NULL);
}
