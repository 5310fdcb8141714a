/*
 * torch_file_save.c - writing torch.save files: CRC-32 of every record, the
 * metadata image, and the engine plans that write metadata and storage
 * bytes straight from where they live (host or GPU), into a temporary file
 * renamed into place on success.
 *
 * CRCs of storages are computed by the data plan's observer
 * (ckptio__plan_set_observer) from the bytes as they pass through host
 * memory: the pinned staging copy for GPU storages, the caller's memory for
 * host storages (overlapping the writes in flight); per-call CRCs are folded
 * in offset order with zlib's crc32_combine. The CRC is stored only in each
 * record's data descriptor and in the central directory, so those ranges are
 * left out of the data plan and written by a second, tiny plan once every
 * CRC is known; every other byte is final from the start.
 */
#include "convert_internal.h"
#include "engine_internal.h"
#include "torch_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#include <zlib.h>

/* Sets the CRC-32 of the small records; storages' records get 0 here and
 * their real CRC from the data plan's observer (finish_crcs), unless CRCs
 * are off: computed as the bytes pass to the file, the CRCs overlap the
 * writes, where a separate pass before them made saves slower
 * (docs/TORCH_FORMAT.md#measured). */
static void compute_crcs(ckptio_torch_writer *w) {
    for (size_t i = 0; i < w->nentries; i++) {
        ckptio__zip_entry *e = &w->entries[i];
        e->crc32 = w->entry_storage[i] == SIZE_MAX
                       ? (uint32_t)crc32(crc32(0L, Z_NULL, 0), w->entry_bytes[i], (uInt)e->size)
                       : 0;
    }
}

/* ---- CRCs through the data plan's observer ---------------------------------------------- */

typedef struct crc_piece {
    size_t entry;
    uint64_t offset, len;
    uint32_t crc;
} crc_piece;

typedef struct crc_observer {
    const size_t *plan_entry; /* per plan extent: the entry it is data of, or SIZE_MAX */
    pthread_mutex_t lock;     /* the pieces */
    crc_piece *pieces;
    size_t npieces, cap;
    bool nomem;
} crc_observer;

/* Observer: CRC of one piece of a record, kept for finish_crcs(). */
static void crc_observe(void *user, size_t extent, uint64_t offset, const void *bytes, uint64_t len) {
    crc_observer *o = user;
    const size_t entry = o->plan_entry[extent];
    if (entry == SIZE_MAX) return;
    const uint32_t crc = ckptio__crc32(bytes, len);
    pthread_mutex_lock(&o->lock);
    if (o->npieces == o->cap && !o->nomem) {
        const size_t cap = o->cap ? o->cap * 2 : 256;
        crc_piece *p = ckptio__realloc(o->pieces, cap * sizeof *p);
        if (p) {
            o->pieces = p;
            o->cap = cap;
        } else {
            o->nomem = true;
        }
    }
    if (o->npieces < o->cap) o->pieces[o->npieces++] = (crc_piece){entry, offset, len, (uint32_t)crc};
    pthread_mutex_unlock(&o->lock);
}

static int cmp_piece(const void *a, const void *b) {
    const crc_piece *x = a, *y = b;
    if (x->entry != y->entry) return x->entry < y->entry ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Folds the observed pieces into each observed entry's crc32, checking that
 * they cover every byte of the record exactly once. */
static ckptio_status finish_crcs(ckptio_torch_writer *w, crc_observer *o, const bool *observed_entry,
                                 const char *path) {
    if (o->nomem) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory recording CRC-32 pieces", path);
    qsort(o->pieces, o->npieces, sizeof *o->pieces, cmp_piece);
    size_t k = 0;
    for (size_t i = 0; i < w->nentries; i++) {
        if (!observed_entry[i]) continue;
        ckptio__zip_entry *e = &w->entries[i];
        uLong crc = crc32(0L, Z_NULL, 0);
        uint64_t covered = 0;
        while (k < o->npieces && o->pieces[k].entry < i) k++;
        for (; k < o->npieces && o->pieces[k].entry == i; k++) {
            const crc_piece *pc = &o->pieces[k];
            if (pc->offset != covered) break;
            crc = crc32_combine(crc, pc->crc, (z_off_t)pc->len);
            covered += pc->len;
        }
        if (covered != e->size)
            return CKPTIO_FAIL_CTX(CKPTIO_E_INTERNAL,
                                   &((ckptio__err_ctx){.path = path, .subject = e->name,
                                                       .file_offset = (int64_t)(e->data_offset + covered)}),
                                   "the write observer covered %llu of the record's %llu bytes contiguously",
                                   (unsigned long long)covered, (unsigned long long)e->size);
        e->crc32 = (uint32_t)crc;
    }
    return CKPTIO_OK;
}

/* A range of metadata written only after the data (it holds CRCs). */
typedef struct deferred {
    uint64_t file_offset, length, meta_offset;
} deferred;

/* Builds the data plan: every piece but the deferred ranges, with
 * plan_entry[] naming the entry of each observed storage extent. Also
 * resolves each deferred range's place in the meta buffer. */
static ckptio_status build_data_plan(const ckptio_torch_writer *w, ckptio_file *file, uint8_t *meta,
                                     const bool *observed_entry, deferred *d, size_t nd, size_t *plan_entry,
                                     ckptio_plan *plan) {
    size_t k = 0, n = 0;
    for (size_t p = 0; p < w->npieces; p++) {
        const struct ckptio__torch_piece *pc = &w->pieces[p];
        if (pc->storage != SIZE_MAX) {
            const size_t entry = w->storages[pc->storage].entry;
            ckptio_extent ex = {.file = file, .file_offset = pc->file_offset, .length = pc->length,
                                .memory = (void *)w->storages[pc->storage].data,
                                .mem_kind = w->storages[pc->storage].mem_kind};
            plan_entry[n++] = observed_entry[entry] ? entry : SIZE_MAX;
            CKPTIO_FORWARD(ckptio_plan_add(plan, &ex));
            continue;
        }
        uint64_t pos = pc->file_offset;
        const uint64_t end = pc->file_offset + pc->length;
        while (pos < end) {
            uint64_t stop = end;
            const bool defer = k < nd && d[k].file_offset < end;
            if (defer) {
                if (d[k].file_offset < pos || d[k].file_offset + d[k].length > end)
                    return CKPTIO_FAIL(CKPTIO_E_INTERNAL,
                                       "zip metadata at %llu (%llu bytes) is not inside one metadata piece",
                                       (unsigned long long)d[k].file_offset, (unsigned long long)d[k].length);
                stop = d[k].file_offset;
            }
            if (stop > pos) {
                ckptio_extent ex = {.file = file, .file_offset = pos, .length = stop - pos,
                                    .memory = meta + pc->meta_offset + (pos - pc->file_offset),
                                    .mem_kind = CKPTIO_MEM_HOST};
                plan_entry[n++] = SIZE_MAX;
                CKPTIO_FORWARD(ckptio_plan_add(plan, &ex));
            }
            if (!defer) break;
            d[k].meta_offset = pc->meta_offset + (d[k].file_offset - pc->file_offset);
            pos = d[k].file_offset + d[k].length;
            k++;
        }
    }
    if (k != nd)
        return CKPTIO_FAIL(CKPTIO_E_INTERNAL, "zip metadata at %llu is not inside a metadata piece",
                           (unsigned long long)d[k].file_offset);
    return CKPTIO_OK;
}

/* Writes the file: one plan when every CRC is known up front; otherwise the
 * data plan (with the observer), the CRCs, then the deferred metadata. */
static ckptio_status write_file(ckptio_engine *engine, ckptio_torch_writer *w, ckptio_file *file, uint8_t *meta,
                                bool want_crc, const char *path) {
    ckptio_status st = CKPTIO_OK;
    ckptio_plan *plan = NULL;
    bool span = false;
    bool *observed_entry = ckptio__calloc(w->nentries ? w->nentries : 1, sizeof *observed_entry);
    deferred *d = ckptio__calloc(w->nentries + 1, sizeof *d);
    size_t *plan_entry = ckptio__calloc(w->npieces + w->nentries + 2, sizeof *plan_entry);
    crc_observer o = {.plan_entry = plan_entry};
    pthread_mutex_init(&o.lock, NULL);
    if (!observed_entry || !d || !plan_entry) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "%s: out of memory planning %zu records", path, w->nentries);
        goto out;
    }
    size_t nd = 0;
    for (size_t i = 0; i < w->nentries; i++) {
        const size_t id = w->entry_storage[i];
        if (id == SIZE_MAX || !want_crc) continue;
        const ckptio__zip_entry *e = &w->entries[i];
        observed_entry[i] = true;
        d[nd++] = (deferred){.file_offset = e->data_offset + e->size,
                             .length = ckptio__zip_descriptor_len(e->header_offset, e->size)};
    }
    const bool two_plans = nd > 0;
    if (two_plans) d[nd++] = (deferred){.file_offset = w->cd_offset, .length = w->file_size - w->cd_offset};
    if ((st = ckptio_plan_create(CKPTIO_WRITE, &plan))) goto out;
    if ((st = build_data_plan(w, file, meta, observed_entry, d, nd, plan_entry, plan))) goto out;
    if (two_plans) {
        if ((st = ckptio__plan_set_observer(plan, crc_observe, &o, 0))) goto out;
        /* Progress sees one save, not a data plan then a directory plan. */
        uint64_t total = 0;
        if ((st = ckptio__plan_total_bytes(plan, &total))) goto out;
        for (size_t k = 0; k < nd; k++) total += d[k].length;
        ckptio__engine_progress_span_begin(engine, total);
        span = true;
    }
    if ((st = ckptio_engine_execute(engine, plan))) goto out;
    if (!two_plans) goto out;
    if ((st = finish_crcs(w, &o, observed_entry, path))) goto out;
    ckptio__torch_writer_fill_meta(w, meta);
    ckptio_plan_destroy(plan);
    if ((st = ckptio_plan_create(CKPTIO_WRITE, &plan))) goto out;
    for (size_t k = 0; k < nd && st == CKPTIO_OK; k++) {
        ckptio_extent ex = {.file = file, .file_offset = d[k].file_offset, .length = d[k].length,
                            .memory = meta + d[k].meta_offset, .mem_kind = CKPTIO_MEM_HOST};
        st = ckptio_plan_add(plan, &ex);
    }
    if (st == CKPTIO_OK) st = ckptio_engine_execute(engine, plan);
out:
    if (span) ckptio__engine_progress_span_end(engine);
    ckptio_plan_destroy(plan);
    pthread_mutex_destroy(&o.lock);
    ckptio__free(o.pieces);
    ckptio__free(plan_entry);
    ckptio__free(d);
    ckptio__free(observed_entry);
    return st;
}

/* 40 ASCII digits; torch only logs it. Derived from the time, the process
 * and the pickle so that two saves rarely share one. */
static void make_serialization_id(ckptio_torch_writer *w) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    XXH64_hash_t a = XXH64(w->pickle.data, w->pickle.len, (XXH64_hash_t)ts.tv_nsec);
    XXH64_hash_t b = XXH64(&ts, sizeof ts, (XXH64_hash_t)(uintptr_t)w);
    char id[48];
    snprintf(id, sizeof id, "%020llu%020llu", (unsigned long long)(a % 10000000000000000000ull),
             (unsigned long long)(b % 10000000000000000000ull));
    memcpy(w->serialization_id, id, 40);
    w->serialization_id[40] = '\0';
    uint8_t *rec = w->entry_bytes[w->nentries - 1];
    memcpy(rec, id, 40);
}

/* The start of both saves: serialization id and CRCs of the small records,
 * the metadata buffer (*meta, with the writer's scratch space), and the
 * file opened (a temporary unless IN_PLACE) at its final size. The caller
 * frees *meta and closes *file, also on failure. */
static ckptio_status start_save(ckptio_engine *engine, const char *path, ckptio_torch_writer *w, unsigned flags,
                                uint8_t **meta, ckptio_file **file) {
    make_serialization_id(w);
    compute_crcs(w);
    if (!(*meta = ckptio__malloc(w->meta_len + CKPTIO__TORCH_META_SCRATCH)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %llu bytes of zip metadata", (unsigned long long)w->meta_len);
    const unsigned open_flags = CKPTIO_OPEN_WRITE | ((flags & CKPTIO_TORCH_SAVE_IN_PLACE) ? CKPTIO_OPEN_IN_PLACE : 0);
    CKPTIO_FORWARD(ckptio_file_open(engine, path, open_flags, file));
    return ckptio_file_truncate(*file, w->file_size);
}

ckptio_status ckptio_torch_save(ckptio_engine *engine, const char *path, ckptio_torch_writer *w,
                                const ckptio_torch_save_options *options) {
    if (!engine || !path || !w)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_torch_save: engine, path and writer are required");
    ckptio_status st = CKPTIO_OK;
    uint8_t *meta = NULL;
    ckptio_file *file = NULL;
    const unsigned flags = options ? options->flags : 0;
    if ((st = ckptio__torch_writer_prepare_for(w, options, path))) goto out;
    for (size_t i = 0; i < w->nentries; i++) {
        const size_t id = w->entry_storage[i];
        if (id != SIZE_MAX && w->storages[id].nbytes && !w->storages[id].data) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                                 &((ckptio__err_ctx){.path = path, .subject = w->entries[i].name, .file_offset = -1}),
                                 "storage %zu has no memory bound (ckptio_torch_writer_bind)", id);
            goto out;
        }
    }
    if ((st = start_save(engine, path, w, flags, &meta, &file))) goto out;
    ckptio__torch_writer_fill_meta(w, meta);
    if ((st = write_file(engine, w, file, meta, !(flags & CKPTIO_TORCH_SAVE_NO_CRC), path))) goto out;
    st = ckptio_file_commit(file);
out:
    if (file) {
        ckptio__error_saved *saved = st ? ckptio__error_save() : NULL;
        ckptio_status cst = ckptio_file_close(file);
        if (saved) ckptio__error_restore(saved);
        else st = cst;
    }
    ckptio__free(meta);
    return st;
}

ckptio_status ckptio__torch_flat_writer(const char *path, const ckptio_tensor_source *tensors, size_t count,
                                        ckptio_torch_writer **out) {
    if (count && !tensors) return CKPTIO_FAIL(CKPTIO_E_INVAL, "tensors must not be NULL");
    ckptio_torch_writer *w = NULL;
    ckptio_value *dict, *key, *value;
    CKPTIO_FORWARD(ckptio_torch_writer_create(&w));
    ckptio_status st = ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 1, &dict);
    for (size_t i = 0; st == CKPTIO_OK && i < count; i++) {
        const ckptio_tensor_source *src = &tensors[i];
        const uint64_t esize = ckptio__torch_element_size(src->dtype);
        uint64_t numel = 1, nbytes = 0;
        for (uint32_t d = 0; d < src->ndim && src->shape; d++) numel *= (uint64_t)src->shape[d];
        if (src->name && !esize) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED,
                                 &((ckptio__err_ctx){.path = path, .subject = src->name, .file_offset = -1}),
                                 "dtype %s has no torch equivalent", ckptio_dtype_name(src->dtype));
            break;
        }
        if (!src->name || (src->ndim && !src->shape) || !ckptio__dtype_nbytes(src->dtype, numel, &nbytes) ||
            nbytes != src->nbytes) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL,
                                 &((ckptio__err_ctx){.path = path, .subject = src->name ? src->name : "",
                                                     .file_offset = -1}),
                                 "tensor needs a name, a torch dtype and nbytes == numel x element size "
                                 "(%llu bytes given)", (unsigned long long)src->nbytes);
            break;
        }
        /* ckptio counts F4 in 4-bit values (safetensors), torch in packed
         * pairs (float4_e2m1fn_x2): halve the last dimension. */
        int64_t shape[64];
        if (src->ndim > 64) {
            st = CKPTIO_FAIL(CKPTIO_E_RANGE, "tensor %s has %u dimensions (at most 64)", src->name, src->ndim);
            break;
        }
        for (uint32_t d = 0; d < src->ndim; d++) shape[d] = src->shape[d];
        if (src->dtype == CKPTIO_DTYPE_F4) {
            if (src->ndim == 0 || shape[src->ndim - 1] % 2) {
                st = CKPTIO_FAIL(CKPTIO_E_INVAL, "F4 tensor %s needs an even last dimension", src->name);
                break;
            }
            shape[src->ndim - 1] /= 2;
        }
        size_t sid;
        st = ckptio_torch_writer_storage(w, src->dtype, src->nbytes, "cpu", src->data, src->mem_kind, &sid);
        ckptio_torch_tensor_spec spec = {.storage = sid, .dtype = src->dtype, .ndim = src->ndim, .shape = shape};
        if (st == CKPTIO_OK) st = ckptio_torch_writer_tensor(w, &spec, &value);
        if (st == CKPTIO_OK) st = ckptio_torch_writer_str(w, src->name, strlen(src->name), &key);
        if (st == CKPTIO_OK) st = ckptio_torch_writer_set_item(w, dict, key, value);
    }
    if (st == CKPTIO_OK) st = ckptio_torch_writer_set_root(w, dict);
    if (st != CKPTIO_OK) {
        ckptio_torch_writer_destroy(w);
        return st;
    }
    *out = w;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_save_tensors(ckptio_engine *engine, const char *path, const ckptio_tensor_source *tensors,
                                        size_t count, const ckptio_torch_save_options *options) {
    ckptio_torch_writer *w = NULL;
    CKPTIO_FORWARD(ckptio__torch_flat_writer(path, tensors, count, &w));
    const ckptio_status st = ckptio_torch_save(engine, path, w, options);
    ckptio_torch_writer_destroy(w);
    return st;
}

/* ---- streamed save ---------------------------------------------------------------------- */

ckptio_status ckptio__torch_save_streamed(ckptio_engine *engine, const char *path, ckptio_torch_writer *w,
                                          const ckptio_torch_save_options *options, ckptio__fill_fn fill, void *ctx) {
    ckptio_status st = CKPTIO_OK;
    uint8_t *meta = NULL, *buf = NULL;
    ckptio_file *file = NULL;
    ckptio_plan *plan = NULL;
    const unsigned flags = options ? options->flags : 0;
    if ((st = ckptio__torch_writer_prepare_for(w, options, path))) goto out;
    uint64_t largest = 0;
    for (size_t i = 0; i < w->nstorages; i++)
        if (w->storages[i].nbytes > largest) largest = w->storages[i].nbytes;
    if (largest > SIZE_MAX / 2 || !(buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, largest ? (size_t)largest : 1))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the largest storage (%llu bytes)",
                         (unsigned long long)largest);
        goto out;
    }
    if ((st = start_save(engine, path, w, flags, &meta, &file))) goto out;
    /* Storages first: their CRCs go into the metadata written after them. */
    for (size_t i = 0; i < w->nentries; i++) {
        const size_t id = w->entry_storage[i];
        ckptio__zip_entry *e = &w->entries[i];
        if (id == SIZE_MAX || e->size == 0) continue;
        if ((st = fill(ctx, id, buf, e->size))) goto out;
        const ckptio_extent x = {.file = file, .file_offset = e->data_offset, .length = e->size, .memory = buf,
                                 .mem_kind = CKPTIO_MEM_HOST};
        if ((st = ckptio_engine_execute_extents(engine, CKPTIO_WRITE, &x, 1))) goto out;
        if (!(flags & CKPTIO_TORCH_SAVE_NO_CRC)) e->crc32 = ckptio__crc32(buf, e->size);
    }
    ckptio__torch_writer_fill_meta(w, meta);
    if ((st = ckptio_plan_create(CKPTIO_WRITE, &plan))) goto out;
    for (size_t p = 0; p < w->npieces && st == CKPTIO_OK; p++) {
        const struct ckptio__torch_piece *pc = &w->pieces[p];
        if (pc->storage != SIZE_MAX || pc->length == 0) continue;
        st = ckptio_plan_add(plan, &(ckptio_extent){.file = file, .file_offset = pc->file_offset, .length = pc->length,
                                                    .memory = meta + pc->meta_offset, .mem_kind = CKPTIO_MEM_HOST});
    }
    if (st == CKPTIO_OK) st = ckptio_engine_execute(engine, plan);
    if (st == CKPTIO_OK) st = ckptio_file_commit(file);
out:
    ckptio_plan_destroy(plan);
    if (file) {
        /* Without a commit, close removes the temporary. */
        ckptio__error_saved *saved = st ? ckptio__error_save() : NULL;
        ckptio_status cst = ckptio_file_close(file);
        if (saved) ckptio__error_restore(saved);
        else st = cst;
    }
    ckptio__free(buf);
    ckptio__free(meta);
    return st;
}
