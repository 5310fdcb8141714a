/*
 * dcp_create.c - a new torch.distributed.checkpoint directory from tensors
 * filled in batches: what ckptio.dcp's FileSystemWriter writes for one
 * process's flat state dict, so torch's reader, ckptio.dcp's reader and
 * `ckptio verify` (against the checksum manifest) take it.
 *
 * Every tensor is one chunk (offsets 0, sizes the shape), stored as a
 * torch.save archive of that tensor (storage "cpu", as torch's writer
 * stores DCP tensors) in one data file __0_<token>_0.distcp; byte items
 * follow. Tensors are filled into one host buffer of at most max(largest
 * tensor, 64 MiB) and written with ckptio_dcp_write's layout (4 KiB
 * aligned items, CRC-32 and XXH3-64 of each computed as it goes) from the
 * end of the previous batch. Then, in the commit order of a ckptio.dcp
 * save: the data file is committed, the manifest written, .metadata last,
 * so a directory with a .metadata is complete.
 */
#include "convert_internal.h"
#include "engine_internal.h"
#include "pickle_internal.h"

#include <stdio.h>
#include <string.h>

#define BATCH_MIN ((uint64_t)64 << 20)
#define ALIGN ((uint64_t)4096)

static uint64_t align_up(uint64_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

/* What the manifest and .metadata say about one stored item. */
typedef struct stored_item {
    int64_t shape[CKPTIO_DCP_MAX_NDIM]; /* torch's terms */
    uint64_t offset, length, hash;
    int hashed;
    const char *fqn;
} stored_item;

typedef struct dcp_out {
    ckptio_engine *engine;
    ckptio_file *file;
    const char *file_name;
    uint64_t end;       /* where the next batch starts */
    stored_item *items; /* tensors, then byte items */
} dcp_out;

/* One torch.save archive of tensor `t` whose bytes are at `data`. */
static ckptio_status archive_of(const ckptio_tensor_source *t, const int64_t *shape, void *data,
                                ckptio_torch_writer **out) {
    ckptio_torch_writer *w = NULL;
    ckptio_value *root = NULL;
    size_t sid = 0;
    ckptio_status st = ckptio_torch_writer_create(&w);
    if (st == CKPTIO_OK) st = ckptio_torch_writer_storage(w, t->dtype, t->nbytes, "cpu", data, CKPTIO_MEM_HOST, &sid);
    if (st == CKPTIO_OK) {
        const ckptio_torch_tensor_spec spec = {.storage = sid, .dtype = t->dtype, .ndim = t->ndim, .shape = shape};
        st = ckptio_torch_writer_tensor(w, &spec, &root);
    }
    if (st == CKPTIO_OK) st = ckptio_torch_writer_set_root(w, root);
    if (st != CKPTIO_OK) {
        ckptio_torch_writer_destroy(w);
        return st;
    }
    *out = w;
    return CKPTIO_OK;
}

/* Writes dcp items [first, first + n) of `batch` (archives or byte items) and records where they went. */
static ckptio_status write_batch(dcp_out *o, ckptio_dcp_item *batch, size_t n, size_t first) {
    const ckptio_status st = ckptio__dcp_write_from(o->engine, batch, n, NULL, o->end);
    for (size_t k = 0; st == CKPTIO_OK && k < n; k++) {
        stored_item *it = &o->items[first + k];
        it->offset = batch[k].offset;
        it->length = batch[k].length;
        it->hash = batch[k].hash;
        it->hashed = batch[k].hashed;
        o->end = batch[k].offset + batch[k].length;
    }
    ckptio_dcp_items_release(batch, n);
    return st;
}

static ckptio_status write_tensors(dcp_out *o, const ckptio_tensor_source *tensors, size_t count,
                                   ckptio__fill_fn fill, void *ctx) {
    uint64_t largest = 0;
    for (size_t i = 0; i < count; i++)
        if (tensors[i].nbytes > largest) largest = tensors[i].nbytes;
    uint64_t cap = align_up(largest) > BATCH_MIN ? align_up(largest) : BATCH_MIN, total = 0;
    for (size_t i = 0; i < count; i++) total += align_up(tensors[i].nbytes);
    if (total < cap) cap = total;
    if (cap > SIZE_MAX / 2) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "a tensor of %llu bytes does not fit in memory",
                                                (unsigned long long)largest);
    uint8_t *buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, cap ? (size_t)cap : ALIGN);
    ckptio_dcp_item *batch = ckptio__calloc(count + 1, sizeof *batch);
    ckptio_status st = CKPTIO_OK;
    if (!buf || !batch) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a batch of %llu bytes", (unsigned long long)cap);
        goto out;
    }
    for (size_t i = 0; i < count && st == CKPTIO_OK;) {
        size_t n = 0;
        uint64_t used = 0;
        while (i + n < count && (n == 0 || used + align_up(tensors[i + n].nbytes) <= cap)) {
            const ckptio_tensor_source *t = &tensors[i + n];
            stored_item *it = &o->items[i + n];
            it->fqn = t->name;
            memcpy(it->shape, t->shape, t->ndim * sizeof *it->shape);
            /* safetensors counts F4 in 4-bit values, torch in packed pairs. */
            if (t->dtype == CKPTIO_DTYPE_F4 && t->ndim > 0) it->shape[t->ndim - 1] /= 2;
            if (t->nbytes && (st = fill(ctx, i + n, buf + used, t->nbytes)) != CKPTIO_OK) break;
            batch[n] = (ckptio_dcp_item){.file = o->file, .flags = CKPTIO_DCP_ITEM_CRC32 | CKPTIO_DCP_ITEM_HASH};
            if ((st = archive_of(t, it->shape, buf + used, &batch[n].archive)) != CKPTIO_OK) break;
            used += align_up(t->nbytes);
            n++;
        }
        if (st == CKPTIO_OK) st = write_batch(o, batch, n, i);
        for (size_t k = 0; k <= n && k <= count; k++) { /* batch[n]: an archive made before a failure */
            ckptio_torch_writer_destroy(batch[k].archive);
            batch[k] = (ckptio_dcp_item){0};
        }
        i += n;
    }
out:
    ckptio__free(batch);
    ckptio__free(buf);
    return st;
}

/* Byte items one at a time (each at most CKPTIO_DCP_BYTE_ITEM_MAX). */
static ckptio_status write_bytes(dcp_out *o, size_t first, size_t nbytes, ckptio__bytes_fn bytes, void *ctx) {
    ckptio_status st = CKPTIO_OK;
    for (size_t j = 0; st == CKPTIO_OK && j < nbytes; j++) {
        void *data = NULL;
        uint64_t len = 0;
        const char *fqn = NULL;
        if ((st = bytes(ctx, j, &fqn, &data, &len)) != CKPTIO_OK) break;
        o->items[first + j].fqn = fqn;
        ckptio_dcp_item item = {.file = o->file, .bytes = data, .nbytes = len, .flags = CKPTIO_DCP_ITEM_HASH};
        st = write_batch(o, &item, 1, first + j);
        ckptio__free(data);
    }
    return st;
}

static ckptio_status write_metadata(const dcp_out *o, const char *dir, const ckptio_tensor_source *tensors,
                                    size_t count, size_t nbytes, unsigned flags) {
    static const int64_t zeros[CKPTIO_DCP_MAX_NDIM];
    const size_t n = count + nbytes;
    ckptio__dcp_md_item *md = ckptio__calloc(n + 1, sizeof *md);
    ckptio_dcp_manifest_item *man = ckptio__calloc(n + 1, sizeof *man);
    ckptio__pickle_buf pk = {0};
    ckptio_status st = CKPTIO_OK;
    if (!md || !man) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the metadata of %zu items", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const stored_item *it = &o->items[i];
        const bool tensor = i < count;
        md[i] = (ckptio__dcp_md_item){.fqn = it->fqn, .is_bytes = !tensor, .file = o->file_name,
                                      .offset = it->offset, .length = it->length};
        man[i] = (ckptio_dcp_manifest_item){.fqn = it->fqn, .file = o->file_name, .data_offset = it->offset,
                                            .nbytes = it->length, .hashed = it->hashed, .hash = it->hash};
        if (tensor) {
            md[i].dtype = tensors[i].dtype;
            md[i].ndim = tensors[i].ndim;
            md[i].shape = it->shape;
            man[i].offset = zeros;
            man[i].ndim = tensors[i].ndim;
        }
    }
    if ((st = ckptio__dcp_metadata_pickle(md, n, &pk)) != CKPTIO_OK) goto out;
    /* The manifest (when there is an item), then .metadata: a save's commit (a new directory: nothing to
     * clean up, no attributes to take). */
    const char *files[] = {o->file_name};
    const ckptio_dcp_commit_options commit = {".metadata", pk.data, pk.len, files, n > 0, man, n,
                                              flags | (n > 0 ? CKPTIO_DCP_MANIFEST : 0), NULL, NULL, NULL, 0};
    ckptio_dcp_commit_result result;
    st = ckptio_dcp_commit(dir, &commit, &result);
out:
    ckptio__pickle_buf_free(&pk);
    ckptio__free(man);
    ckptio__free(md);
    return st;
}

ckptio_status ckptio__dcp_save_streamed(ckptio_engine *engine, const char *dir, const ckptio_tensor_source *tensors,
                                        size_t count, ckptio__fill_fn fill, void *ctx, size_t nbytes,
                                        ckptio__bytes_fn bytes, void *bytes_ctx) {
    for (size_t i = 0; i < count; i++)
        CKPTIO_RETURN_IF(tensors[i].ndim > CKPTIO_DCP_MAX_NDIM, CKPTIO_E_RANGE, "tensor '%s' has %u dimensions "
                         "(at most %d)", tensors[i].name, tensors[i].ndim, CKPTIO_DCP_MAX_NDIM);
    unsigned char rnd[6];
    char name[64], path[4096];
    ckptio__random_bytes(rnd, sizeof rnd);
    snprintf(name, sizeof name, "__0_%02x%02x%02x%02x%02x%02x_0.distcp", rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
             rnd[5]);
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = dir, .file_offset = -1}), "path too long");
    const unsigned flags = ckptio__engine_setting(engine, CKPTIO_OPT_SYNC) ? CKPTIO_DCP_SYNC : 0;
    dcp_out o = {.engine = engine, .file_name = name};
    ckptio_status st = CKPTIO_OK;
    if (!(o.items = ckptio__calloc(count + nbytes + 1, sizeof *o.items)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu items", count + nbytes);
    if (count + nbytes > 0) {
        if ((st = ckptio_file_open(engine, path, CKPTIO_OPEN_WRITE, &o.file)) != CKPTIO_OK) goto out;
        if ((st = write_tensors(&o, tensors, count, fill, ctx)) != CKPTIO_OK) goto out;
        if ((st = write_bytes(&o, count, nbytes, bytes, bytes_ctx)) != CKPTIO_OK) goto out;
        if ((st = ckptio_file_commit(o.file)) != CKPTIO_OK) goto out;
    }
    st = write_metadata(&o, dir, tensors, count, nbytes, flags);
out:
    if (o.file) {
        /* Without a commit, close removes the temporary. */
        ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
        const ckptio_status cs = ckptio_file_close(o.file);
        if (saved) ckptio__error_restore(saved);
        else if (st == CKPTIO_OK) st = cs;
    }
    ckptio__free(o.items);
    return st;
}
