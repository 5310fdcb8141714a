/*
 * dcp_write.c - writing the items of torch.distributed.checkpoint .distcp
 * data files: torch.save archives of one tensor each and raw byte items,
 * optionally zstd-compressed, with CRC-32s and XXH3-64 hashes computed in
 * parallel on the engine's workers, then every item of every file in one
 * engine plan (tensor bytes straight from host or GPU memory).
 *
 * An archive whose storage is in GPU memory is hashed in parts (its host
 * pieces whole, the storage in CKPTIO_DCP_PART_BYTES blocks) by the plan's
 * observer, on the pinned staging copies the bytes pass through: XXH3 has
 * no combine step, and the pipeline moves one tensor's blocks out of order.
 * So is an archive whose storages in host memory reach HOST_PARTS_MIN bytes:
 * each block is hashed by the worker that writes it, beside the other
 * workers' writes, instead of in a pass over the whole state before the
 * first byte is written.
 */
#include "convert_internal.h"
#include "engine_internal.h"
#include "gpu_internal.h"
#include "torch_internal.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "xxh3_fast.h"
#include <zstd.h>

/* Host storages of at least this many bytes in one archive are hashed in blocks as they are written. */
#define HOST_PARTS_MIN (2 * (uint64_t)CKPTIO_DCP_PART_BYTES)

typedef struct item_job {
    ckptio_dcp_item *item;
    ckptio_torch_writer *w;  /* the archive, or NULL for a byte item */
    bool host;               /* every byte of the item is in host memory */
    bool host_blocks;        /* its host storages are hashed in blocks by the plan's observer */
    uint64_t size;           /* uncompressed item size */
    uint32_t align;          /* the item's start (and its archive's storage) alignment */
    uint8_t *meta;           /* archive: metadata image (meta_len + scratch bytes) */
    uint8_t *image;          /* ZSTD archive: the whole uncompressed archive */
    uint8_t *packed;         /* ZSTD: the compressed frame */
    size_t packed_cap, packed_len;
    size_t zstd_error;       /* a ZSTD error code set by a worker, else 0 */
    unsigned char *seen;     /* parts: 1 once hashed (host pieces by run_job, GPU blocks by the observer) */
} item_job;

typedef struct job_list {
    item_job *jobs;
    size_t count;
    _Atomic size_t next;
} job_list;

static bool storage_on_host(const ckptio__torch_wstorage *s) {
    ckptio_mem_kind kind = s->mem_kind == CKPTIO_MEM_AUTO ? ckptio__gpu_classify(s->data) : s->mem_kind;
    return kind == CKPTIO_MEM_HOST || kind == CKPTIO_MEM_PINNED;
}

/* A small item in host memory is packed: it starts at the next multiple of CKPTIO_DCP_PACK_ALIGN and its
 * archive aligns storages to that, as torch's writer does. Padding every item to 4 KiB made a tiny state
 * dict several times larger than torch's; such items are read and written through the page cache anyway
 * (below CKPTIO_OPT_DIRECT_MIN_BYTES), while large and GPU items keep the alignment O_DIRECT needs. */
static uint32_t item_alignment(const ckptio_dcp_item *it, uint32_t alignment) {
    if (alignment <= CKPTIO_DCP_PACK_ALIGN) return alignment;
    uint64_t bytes = it->nbytes;
    const ckptio_torch_writer *w = it->archive;
    for (size_t i = 0; w && i < w->nstorages; i++) {
        if (!storage_on_host(&w->storages[i])) return alignment;
        bytes += w->storages[i].nbytes;
    }
    return bytes < CKPTIO_DCP_PACK_BELOW ? CKPTIO_DCP_PACK_ALIGN : alignment;
}


/* The bytes of piece p of an archive: from the metadata image or the storage. */
static const uint8_t *piece_bytes(const item_job *j, const struct ckptio__torch_piece *pc) {
    if (pc->storage == SIZE_MAX) return j->meta + pc->meta_offset;
    return j->w->storages[pc->storage].data;
}

/* Whether piece pc of archive w is (part of) a storage in GPU memory. */
static bool piece_on_gpu(const ckptio_torch_writer *w, const struct ckptio__torch_piece *pc) {
    return pc->storage != SIZE_MAX && !storage_on_host(&w->storages[pc->storage]);
}

/* Whether piece pc is hashed in CKPTIO_DCP_PART_BYTES blocks by the plan's observer: a storage in GPU memory,
 * or any storage of an item whose host storages are (host_blocks). */
static bool piece_in_blocks(const item_job *j, const struct ckptio__torch_piece *pc) {
    return pc->storage != SIZE_MAX && (j->host_blocks || piece_on_gpu(j->w, pc));
}

/* Parts of a piece when its item is hashed in parts: none when empty, one
 * per block of a piece hashed in blocks, one for any other piece. */
static size_t piece_nparts(const item_job *j, const struct ckptio__torch_piece *pc) {
    if (!pc->length) return 0;
    return piece_in_blocks(j, pc) ? (size_t)((pc->length + CKPTIO_DCP_PART_BYTES - 1) / CKPTIO_DCP_PART_BYTES) : 1;
}

/* CRCs, the metadata image, compression and the hash of one item. Runs on a
 * worker: it only computes, and reports a compression failure through
 * j->zstd_error (error records are per thread). */
static void run_job(item_job *j) {
    ckptio_dcp_item *it = j->item;
    ckptio_torch_writer *w = j->w;
    if (w) {
        for (size_t i = 0; i < w->nentries; i++) {
            ckptio__zip_entry *e = &w->entries[i];
            const size_t id = w->entry_storage[i];
            if (id == SIZE_MAX)
                e->crc32 = ckptio__crc32(w->entry_bytes[i], e->size);
            else if ((it->flags & CKPTIO_DCP_ITEM_CRC32) && storage_on_host(&w->storages[id]))
                e->crc32 = ckptio__crc32(w->storages[id].data, e->size);
            else
                e->crc32 = 0;
        }
        ckptio__torch_writer_fill_meta(w, j->meta);
    }
    const uint8_t *stored = it->bytes;
    uint64_t stored_len = it->nbytes;
    if (it->flags & CKPTIO_DCP_ITEM_ZSTD) {
        const uint8_t *src = it->bytes;
        if (w) {
            for (size_t p = 0; p < w->npieces; p++) {
                const struct ckptio__torch_piece *pc = &w->pieces[p];
                if (pc->length) memcpy(j->image + pc->file_offset, piece_bytes(j, pc), pc->length);
            }
            src = j->image;
        }
        const size_t r = ZSTD_compress(j->packed, j->packed_cap, j->size ? src : (const uint8_t *)"", (size_t)j->size,
                                       ZSTD_CLEVEL_DEFAULT);
        if (ZSTD_isError(r)) {
            j->zstd_error = r;
            return;
        }
        j->packed_len = r;
        stored = j->packed;
        stored_len = r;
        ckptio__free(j->image); /* the frame is all that is written */
        j->image = NULL;
    }
    it->length = (it->flags & CKPTIO_DCP_ITEM_ZSTD) || !w ? stored_len : j->size;
    it->hashed = 0;
    if (!(it->flags & CKPTIO_DCP_ITEM_HASH)) return;
    if ((it->flags & CKPTIO_DCP_ITEM_ZSTD) || !w) {
        it->hash = (uint64_t)XXH3_64bits(stored_len ? (const void *)stored : "", (size_t)stored_len);
        it->hashed = 1;
        return;
    }
    if (it->nparts) {
        /* Parts: the other pieces now; blocks as they are written (GPU ones through staging). */
        size_t k = 0;
        for (size_t p = 0; p < w->npieces && k < it->nparts; p++) {
            const struct ckptio__torch_piece *pc = &w->pieces[p];
            if (!pc->length || piece_in_blocks(j, pc)) {
                k += piece_nparts(j, pc);
                continue;
            }
            it->parts[k].hash = (uint64_t)XXH3_64bits(piece_bytes(j, pc), (size_t)pc->length);
            j->seen[k++] = 1;
        }
        return;
    }
    XXH3_state_t *state = XXH3_createState();
    if (!state) return; /* no memory: the item simply goes without a hash */
    XXH3_64bits_reset(state);
    for (size_t p = 0; p < w->npieces; p++) {
        const struct ckptio__torch_piece *pc = &w->pieces[p];
        if (pc->length) XXH3_64bits_update(state, piece_bytes(j, pc), (size_t)pc->length);
    }
    it->hash = (uint64_t)XXH3_64bits_digest(state);
    it->hashed = 1;
    XXH3_freeState(state);
}

static void job_worker(void *arg, unsigned worker) {
    (void)worker;
    job_list *list = arg;
    for (;;) {
        const size_t i = atomic_fetch_add(&list->next, 1);
        if (i >= list->count) return;
        run_job(&list->jobs[i]);
    }
}

/* Fails naming the item's index and its file. */
static ckptio_status item_fail(ckptio_status status, size_t index, const ckptio_dcp_item *item, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static ckptio_status item_fail(ckptio_status status, size_t index, const ckptio_dcp_item *item, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return CKPTIO_FAIL_CTX(status, &((ckptio__err_ctx){.operation = "write DCP item", .file_offset = -1,
                                                       .path = ckptio_file_path(item->file)}),
                           "item %zu: %s", index, what);
}

/* The parts of an archive hashed in parts, in file order: one per block of
 * a piece hashed in blocks, one per other piece. */
static ckptio_status prepare_parts(item_job *j, size_t index) {
    ckptio_dcp_item *it = j->item;
    const ckptio_torch_writer *w = j->w;
    size_t n = 0;
    for (size_t p = 0; p < w->npieces; p++) n += piece_nparts(j, &w->pieces[p]);
    if (!(it->parts = ckptio__calloc(n ? n : 1, sizeof *it->parts)) || !(j->seen = ckptio__calloc(n ? n : 1, 1)))
        return item_fail(CKPTIO_E_NOMEM, index, it, "no memory for the hashes of %zu parts", n);
    it->nparts = n;
    size_t k = 0;
    for (size_t p = 0; p < w->npieces; p++) {
        const struct ckptio__torch_piece *pc = &w->pieces[p];
        if (!pc->length) continue;
        const uint64_t step = piece_in_blocks(j, pc) ? CKPTIO_DCP_PART_BYTES : pc->length;
        for (uint64_t off = 0; off < pc->length; off += step) {
            it->parts[k].offset = pc->file_offset + off;
            it->parts[k].length = pc->length - off < step ? pc->length - off : step;
            k++;
        }
    }
    return CKPTIO_OK;
}

/* Serial preparation of one item: the archive's layout and the buffers
 * the worker fills. */
static ckptio_status prepare_job(item_job *j, size_t index, uint32_t alignment, const char *prefix) {
    ckptio_dcp_item *it = j->item;
    if (!it->file) return CKPTIO_FAIL(CKPTIO_E_INVAL, "DCP item %zu has no file", index);
    if (it->flags & ~(unsigned)(CKPTIO_DCP_ITEM_ZSTD | CKPTIO_DCP_ITEM_CRC32 | CKPTIO_DCP_ITEM_HASH))
        return item_fail(CKPTIO_E_INVAL, index, it, "unknown flags 0x%x", it->flags);
    j->w = it->archive;
    j->host = true;
    j->align = item_alignment(it, alignment);
    if (!j->w) {
        if (!it->bytes && it->nbytes) return item_fail(CKPTIO_E_INVAL, index, it, "byte item without bytes");
        j->size = it->nbytes;
    } else {
        ckptio_torch_writer *w = j->w;
        CKPTIO_FORWARD(ckptio__torch_writer_prepare(w, j->align, prefix));
        uint64_t host_bytes = 0;
        for (size_t i = 0; i < w->nentries; i++) {
            const size_t id = w->entry_storage[i];
            if (id == SIZE_MAX) continue;
            if (w->storages[id].nbytes && !w->storages[id].data)
                return item_fail(CKPTIO_E_INVAL, index, it, "storage %zu of the archive has no memory bound", id);
            if (!storage_on_host(&w->storages[id])) j->host = false;
            else host_bytes += w->storages[id].nbytes;
        }
        j->size = w->file_size;
        const bool hashed = (it->flags & CKPTIO_DCP_ITEM_HASH) && !(it->flags & CKPTIO_DCP_ITEM_ZSTD);
        j->host_blocks = hashed && host_bytes >= HOST_PARTS_MIN;
        if (hashed && (!j->host || j->host_blocks)) CKPTIO_FORWARD(prepare_parts(j, index));
        if (!(j->meta = ckptio__malloc(w->meta_len + CKPTIO__TORCH_META_SCRATCH)))
            return item_fail(CKPTIO_E_NOMEM, index, it, "no memory for %llu bytes of archive metadata",
                             (unsigned long long)w->meta_len);
    }
    if (it->flags & CKPTIO_DCP_ITEM_ZSTD) {
        if (!j->host)
            return item_fail(CKPTIO_E_UNSUPPORTED, index, it,
                             "zstd compression needs the tensor in host memory (it is in GPU memory)");
        if (j->size > SIZE_MAX / 2) return item_fail(CKPTIO_E_RANGE, index, it, "item too large to compress");
        j->packed_cap = ZSTD_compressBound((size_t)j->size);
        if (!(j->packed = ckptio__malloc(j->packed_cap ? j->packed_cap : 1)))
            return item_fail(CKPTIO_E_NOMEM, index, it, "no memory for a %zu-byte compression buffer", j->packed_cap);
        if (j->w && !(j->image = ckptio__malloc(j->size ? (size_t)j->size : 1)))
            return item_fail(CKPTIO_E_NOMEM, index, it, "no memory to assemble a %llu-byte archive",
                             (unsigned long long)j->size);
    }
    return CKPTIO_OK;
}

/* Files met so far and the end of the last item placed in each. */
typedef struct file_end {
    ckptio_file *file;
    uint64_t end;
} file_end;

static uint64_t align_up(uint64_t v, uint64_t a) { return a <= 1 ? v : (v + a - 1) / a * a; }

/* Per plan extent: the job and first part of a GPU storage hashed in parts,
 * or job SIZE_MAX for extents the observer ignores. */
typedef struct part_ref {
    size_t job;
    size_t part;
} part_ref;

typedef struct part_observer {
    item_job *jobs;
    part_ref *refs;
} part_observer;

static void observe_parts(void *user, size_t extent, uint64_t offset, const void *bytes, uint64_t len) {
    const part_observer *o = user;
    const part_ref *r = &o->refs[extent];
    if (r->job == SIZE_MAX) return;
    item_job *j = &o->jobs[r->job];
    const size_t k = r->part + (size_t)(offset / CKPTIO_DCP_PART_BYTES);
    ckptio_dcp_part *pt = &j->item->parts[k];
    /* A piece of a block is left to the read-back; whole blocks are distinct
     * memory, so these writes never race. */
    if (offset % CKPTIO_DCP_PART_BYTES != 0 || len != pt->length) return;
    pt->hash = (uint64_t)XXH3_64bits(bytes, (size_t)len);
    j->seen[k] = 1;
}

/* Parts the observer did not see whole, hashed from what the file now holds. */
static ckptio_status hash_unseen_parts(item_job *jobs, size_t count) {
    unsigned char *buf = NULL;
    ckptio_status st = CKPTIO_OK;
    for (size_t i = 0; st == CKPTIO_OK && i < count; i++) {
        ckptio_dcp_item *it = jobs[i].item;
        for (size_t k = 0; st == CKPTIO_OK && k < it->nparts; k++) {
            if (jobs[i].seen[k]) continue;
            if (!buf && !(buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, CKPTIO_DCP_PART_BYTES)))
                return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a %u-byte hash buffer", CKPTIO_DCP_PART_BYTES);
            ckptio_dcp_part *pt = &it->parts[k];
            /* Other pieces are hashed by run_job; only blocks get here, never longer than a block. */
            st = ckptio__file_io(it->file, CKPTIO_READ, buf, pt->length, it->offset + pt->offset);
            if (st == CKPTIO_OK) pt->hash = (uint64_t)XXH3_64bits(buf, (size_t)pt->length);
        }
    }
    ckptio__free(buf);
    return st;
}

/* Extents the plan will hold: one per byte item, one per archive piece, and before each item in an object the
 * padding of its alignment (pad_extent). */
static size_t extent_count(const item_job *jobs, size_t count) {
    size_t n = 0;
    for (size_t i = 0; i < count; i++) n += (jobs[i].packed || !jobs[i].w ? 1 : jobs[i].w->npieces) + 1;
    return n;
}

/* The zeros an item's alignment leaves before it in an object are written, not left as a hole: an upload part
 * is sent once every byte of it has arrived, and a hole is filled only at the commit, so each part holding the
 * gap between two items would wait there, its buffer held, the upload of a file of whole-part items not starting
 * before the file was written whole (or, with few buffers, failing "roughly in order"). Local files keep the
 * hole (sparse, nothing written). A gap is shorter than its alignment (at most CKPTIO_ZIP_MAX_ALIGNMENT), so one
 * extent of these zeros covers it. */
static const uint8_t zero_pad[CKPTIO_ZIP_MAX_ALIGNMENT];

static ckptio_status pad_extent(ckptio_plan *plan, ckptio_file *file, uint64_t from, uint64_t to,
                                part_observer *obs, size_t *nextents) {
    if (to - from > sizeof zero_pad)
        return CKPTIO_FAIL(CKPTIO_E_INTERNAL, "an alignment gap of %llu bytes exceeds %zu",
                           (unsigned long long)(to - from), sizeof zero_pad);
    const ckptio_extent ex = {.file = file, .file_offset = from, .length = to - from, .memory = (void *)zero_pad,
                              .mem_kind = CKPTIO_MEM_HOST};
    if (obs->refs) obs->refs[(*nextents)++].job = SIZE_MAX;
    return ckptio_plan_add(plan, &ex);
}

static ckptio_status place_and_write(ckptio_engine *engine, item_job *jobs, size_t count, uint64_t start) {
    ckptio_status st = CKPTIO_OK;
    file_end *ends = ckptio__calloc(count ? count : 1, sizeof *ends);
    ckptio_plan *plan = NULL;
    size_t nfiles = 0, nextents = 0;
    bool any_parts = false;
    part_observer obs = {.jobs = jobs};
    for (size_t i = 0; i < count; i++) any_parts |= jobs[i].item->nparts > 0;
    if (!ends) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %zu DCP items", count);
    if (any_parts && !(obs.refs = ckptio__calloc(extent_count(jobs, count) + 1, sizeof *obs.refs))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %zu DCP items", count);
        goto out;
    }
    if ((st = ckptio_plan_create(CKPTIO_WRITE, &plan))) goto out;
    for (size_t i = 0; i < count; i++) {
        item_job *j = &jobs[i];
        ckptio_dcp_item *it = j->item;
        size_t f = 0;
        while (f < nfiles && ends[f].file != it->file) f++;
        if (f == nfiles) ends[nfiles++] = (file_end){.file = it->file, .end = start};
        it->offset = align_up(ends[f].end, j->align);
        if (it->offset > ends[f].end && ckptio__s3_is_url(ckptio_file_path(it->file)) &&
            (st = pad_extent(plan, it->file, ends[f].end, it->offset, &obs, &nextents)))
            goto out;
        ends[f].end = it->offset + it->length;
        ckptio_extent ex = {.file = it->file, .file_offset = it->offset, .mem_kind = CKPTIO_MEM_HOST};
        if (j->packed) {
            ex.memory = j->packed;
            ex.length = j->packed_len;
            if (obs.refs) obs.refs[nextents++].job = SIZE_MAX;
            st = ckptio_plan_add(plan, &ex);
        } else if (!j->w) {
            ex.memory = (void *)it->bytes;
            ex.length = it->nbytes;
            if (obs.refs) obs.refs[nextents++].job = SIZE_MAX;
            st = ckptio_plan_add(plan, &ex);
        } else {
            size_t part = 0; /* the piece's first part */
            for (size_t p = 0; st == CKPTIO_OK && p < j->w->npieces; p++) {
                const struct ckptio__torch_piece *pc = &j->w->pieces[p];
                ex.file_offset = it->offset + pc->file_offset;
                ex.length = pc->length;
                ex.memory = (void *)piece_bytes(j, pc);
                ex.mem_kind = pc->storage == SIZE_MAX ? CKPTIO_MEM_HOST : j->w->storages[pc->storage].mem_kind;
                if (obs.refs) {
                    const bool blocks = piece_in_blocks(j, pc);
                    obs.refs[nextents++] = (part_ref){.job = it->nparts && blocks ? i : SIZE_MAX, .part = part};
                    if (it->nparts) part += piece_nparts(j, pc);
                }
                st = ckptio_plan_add(plan, &ex);
            }
        }
        if (st) goto out;
    }
    for (size_t f = 0; f < nfiles; f++)
        if ((st = ckptio_file_truncate(ends[f].file, ends[f].end))) goto out;
    if (obs.refs && (st = ckptio__plan_set_observer(plan, observe_parts, &obs, CKPTIO_DCP_PART_BYTES))) goto out;
    st = ckptio_engine_execute(engine, plan);
    if (st == CKPTIO_OK && any_parts) st = hash_unseen_parts(jobs, count);
out:
    ckptio_plan_destroy(plan);
    ckptio__free(obs.refs);
    ckptio__free(ends);
    return st;
}

ckptio_status ckptio_dcp_write(ckptio_engine *engine, ckptio_dcp_item *items, size_t count,
                               const ckptio_torch_save_options *options) {
    return ckptio__dcp_write_from(engine, items, count, options, 0);
}

ckptio_status ckptio__dcp_write_from(ckptio_engine *engine, ckptio_dcp_item *items, size_t count,
                                     const ckptio_torch_save_options *options, uint64_t start) {
    if (!engine || (count && !items))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_dcp_write: engine and items are required");
    if (count == 0) return CKPTIO_OK;
    ckptio_status st = CKPTIO_OK;
    char *prefix = NULL;
    uint32_t alignment = 0;
    job_list list = {.count = count};
    if ((st = ckptio__torch_options(options, NULL, &alignment, &prefix))) return st;
    if (!(list.jobs = ckptio__calloc(count, sizeof *list.jobs))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for %zu DCP items", count);
        goto out;
    }
    ckptio_dcp_items_release(items, count);
    for (size_t i = 0; i < count; i++) {
        list.jobs[i].item = &items[i];
        items[i].offset = items[i].length = items[i].hash = 0;
        items[i].hashed = 0;
        if ((st = prepare_job(&list.jobs[i], i, alignment, prefix))) goto out;
    }
    int64_t threads = ckptio__engine_setting(engine, CKPTIO_OPT_THREADS);
    unsigned nworkers = threads < 1 ? 1 : (unsigned)threads;
    if (nworkers > count) nworkers = (unsigned)count;
    if ((st = ckptio__engine_parallel(engine, nworkers, job_worker, &list))) goto out;
    for (size_t i = 0; i < count; i++) {
        if (list.jobs[i].zstd_error) {
            st = item_fail(CKPTIO_E_INTERNAL, i, &items[i], "zstd compression failed: %s",
                           ZSTD_getErrorName(list.jobs[i].zstd_error));
            goto out;
        }
    }
    st = place_and_write(engine, list.jobs, count, start);
out:
    if (st != CKPTIO_OK) ckptio_dcp_items_release(items, count);
    for (size_t i = 0; list.jobs && i < count; i++) {
        ckptio__free(list.jobs[i].seen);
        ckptio__free(list.jobs[i].meta);
        ckptio__free(list.jobs[i].image);
        ckptio__free(list.jobs[i].packed);
    }
    ckptio__free(list.jobs);
    ckptio__free(prefix);
    return st;
}

void ckptio_dcp_items_release(ckptio_dcp_item *items, size_t count) {
    for (size_t i = 0; items && i < count; i++) {
        ckptio__free(items[i].parts);
        items[i].parts = NULL;
        items[i].nparts = 0;
    }
}
