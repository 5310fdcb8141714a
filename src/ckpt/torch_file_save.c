/*
 * torch_file_save.c - writing torch.save files: CRC-32 of every record
 * (storages in host memory in parallel on the engine's workers, with
 * zlib's crc32 and crc32_combine), the metadata image, and one engine plan
 * that writes metadata and storage bytes straight from where they live
 * (host or GPU), into a temporary file renamed into place on success.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "torch_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>
#include <zlib.h>

#define CRC_CHUNK (4ull << 20)

typedef struct crc_job {
    const uint8_t *data;
    uint64_t len;
    size_t storage;
    uint32_t crc;
} crc_job;

typedef struct crc_work {
    crc_job *jobs;
    size_t njobs;
    _Atomic size_t next;
} crc_work;

static void crc_worker(void *arg, unsigned worker) {
    (void)worker;
    crc_work *cw = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&cw->next, 1);
        if (i >= cw->njobs) return;
        crc_job *j = &cw->jobs[i];
        uLong crc = crc32(0L, Z_NULL, 0);
        for (uint64_t done = 0; done < j->len;) {
            uint64_t n = j->len - done > (1u << 30) ? (1u << 30) : j->len - done;
            crc = crc32(crc, j->data + done, (uInt)n);
            done += n;
        }
        j->crc = (uint32_t)crc;
    }
}

static bool host_memory(const ckptio__torch_wstorage *s) {
    ckptio_mem_kind kind = s->mem_kind == CKPTIO_MEM_AUTO ? ckptio__gpu_classify(s->data) : s->mem_kind;
    return kind == CKPTIO_MEM_HOST || kind == CKPTIO_MEM_PINNED;
}

/* Sets every zip entry's crc32. */
static ckptio_status compute_crcs(ckptio_engine *engine, ckptio_torch_writer *w, bool want_crc) {
    crc_work cw = {0};
    size_t njobs = 0;
    for (size_t i = 0; i < w->nentries; i++) {
        const size_t id = w->entry_storage[i];
        ckptio__zip_entry *e = &w->entries[i];
        if (id == SIZE_MAX) {
            e->crc32 = (uint32_t)crc32(crc32(0L, Z_NULL, 0), w->entry_bytes[i], (uInt)e->size);
            continue;
        }
        e->crc32 = 0;
        if (want_crc && host_memory(&w->storages[id])) njobs += (e->size + CRC_CHUNK - 1) / CRC_CHUNK;
    }
    if (njobs == 0) return CKPTIO_OK;
    cw.jobs = ckptio__calloc(njobs, sizeof *cw.jobs);
    if (!cw.jobs) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %zu CRC jobs", njobs);
    for (size_t i = 0; i < w->nentries; i++) {
        const size_t id = w->entry_storage[i];
        if (id == SIZE_MAX || !want_crc || !host_memory(&w->storages[id])) continue;
        const uint8_t *data = w->storages[id].data;
        for (uint64_t off = 0; off < w->entries[i].size; off += CRC_CHUNK) {
            uint64_t len = w->entries[i].size - off < CRC_CHUNK ? w->entries[i].size - off : CRC_CHUNK;
            cw.jobs[cw.njobs++] = (crc_job){.data = data + off, .len = len, .storage = i};
        }
    }
    int64_t threads = ckptio__engine_setting(engine, CKPTIO_OPT_THREADS);
    unsigned nworkers = threads < 1 ? 1 : (unsigned)threads;
    if (nworkers > cw.njobs) nworkers = (unsigned)cw.njobs;
    ckptio_status st = ckptio__engine_parallel(engine, nworkers, crc_worker, &cw);
    if (st == CKPTIO_OK) {
        /* Chunks of one record are consecutive jobs: fold them in order. */
        for (size_t j = 0; j < cw.njobs; j++) {
            ckptio__zip_entry *e = &w->entries[cw.jobs[j].storage];
            const bool first = j == 0 || cw.jobs[j - 1].storage != cw.jobs[j].storage;
            e->crc32 = first ? cw.jobs[j].crc
                             : (uint32_t)crc32_combine(e->crc32, cw.jobs[j].crc, (z_off_t)cw.jobs[j].len);
        }
    }
    ckptio__free(cw.jobs);
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

ckptio_status ckptio_torch_save(ckptio_engine *engine, const char *path, ckptio_torch_writer *w,
                                const ckptio_torch_save_options *options) {
    if (!engine || !path || !w) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_torch_save: engine, path and writer are required");
    ckptio_status st = CKPTIO_OK;
    char *prefix = NULL;
    uint8_t *meta = NULL;
    ckptio_file *file = NULL;
    ckptio_plan *plan = NULL;
    const unsigned flags = options ? options->flags : 0;
    uint32_t alignment;
    if ((st = ckptio__torch_options(options, path, &alignment, &prefix))) goto out;
    if ((st = ckptio__torch_writer_prepare(w, alignment, prefix))) goto out;
    for (size_t i = 0; i < w->nentries; i++) {
        const size_t id = w->entry_storage[i];
        if (id != SIZE_MAX && w->storages[id].nbytes && !w->storages[id].data) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = path, .subject = w->entries[i].name, .file_offset = -1}),
                                 "storage %zu has no memory bound (ckptio_torch_writer_bind)", id);
            goto out;
        }
    }
    make_serialization_id(w);
    if ((st = compute_crcs(engine, w, !(flags & CKPTIO_TORCH_SAVE_NO_CRC)))) goto out;
    if (!(meta = ckptio__malloc(w->meta_len + CKPTIO__TORCH_META_SCRATCH))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %llu bytes of zip metadata", (unsigned long long)w->meta_len);
        goto out;
    }
    ckptio__torch_writer_fill_meta(w, meta);
    unsigned open_flags = CKPTIO_OPEN_WRITE | ((flags & CKPTIO_TORCH_SAVE_IN_PLACE) ? CKPTIO_OPEN_IN_PLACE : 0);
    if ((st = ckptio_file_open(engine, path, open_flags, &file))) goto out;
    if ((st = ckptio_file_truncate(file, w->file_size))) goto out;
    if ((st = ckptio_plan_create(CKPTIO_WRITE, &plan))) goto out;
    for (size_t p = 0; p < w->npieces; p++) {
        const struct ckptio__torch_piece *pc = &w->pieces[p];
        ckptio_extent ex = {.file = file, .file_offset = pc->file_offset, .length = pc->length};
        if (pc->storage == SIZE_MAX) {
            ex.memory = meta + pc->meta_offset;
            ex.mem_kind = CKPTIO_MEM_HOST;
        } else {
            ex.memory = (void *)w->storages[pc->storage].data;
            ex.mem_kind = w->storages[pc->storage].mem_kind;
        }
        if ((st = ckptio_plan_add(plan, &ex))) goto out;
    }
    if ((st = ckptio_engine_execute(engine, plan))) goto out;
    st = ckptio_file_commit(file);
out:
    if (file) {
        ckptio__error_saved *saved = st ? ckptio__error_save() : NULL;
        ckptio_status cst = ckptio_file_close(file);
        if (saved) ckptio__error_restore(saved);
        else st = cst;
    }
    ckptio_plan_destroy(plan);
    ckptio__free(meta);
    ckptio__free(prefix);
    return st;
}

ckptio_status ckptio_torch_save_tensors(ckptio_engine *engine, const char *path, const ckptio_tensor_source *tensors,
                                        size_t count, const ckptio_torch_save_options *options) {
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
        if (!src->name || !esize || (src->ndim && !src->shape) || !ckptio__dtype_nbytes(src->dtype, numel, &nbytes) ||
            nbytes != src->nbytes) {
            st = CKPTIO_FAIL_CTX(CKPTIO_E_INVAL, &((ckptio__err_ctx){.path = path, .subject = src->name ? src->name : "", .file_offset = -1}),
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
    if (st == CKPTIO_OK) st = ckptio_torch_save(engine, path, w, options);
    ckptio_torch_writer_destroy(w);
    return st;
}
