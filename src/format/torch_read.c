/*
 * torch_read.c - from a parsed zip directory and data.pkl to the reader's
 * tables: archive checks (prefix, TorchScript, version, byte order),
 * storages resolved to data/<key> records, tensors named by their dotted
 * path and checked to lie inside their storages; plus the public accessors
 * of ckptio_torch. No I/O: src/ckpt/torch_file.c reads the bytes.
 */
#include "torch_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TFAIL(t, status, offset, subj_, ...)                                                          \
    CKPTIO_FAIL_CTX((status),                                                                           \
                    &((ckptio__err_ctx){.operation = "load torch file", .path = (t)->path,              \
                                        .file_offset = (int64_t)(offset), .subject = (subj_)}),       \
                    __VA_ARGS__)

uint64_t ckptio__torch_element_size(ckptio_dtype dtype) {
    if (dtype == CKPTIO_DTYPE_F4) return 1; /* float4_e2m1fn_x2 packs two values per element */
    if (!ckptio_dtype_torch_name(dtype)) return 0;
    unsigned bits = ckptio_dtype_bits(dtype);
    return bits % 8 ? 0 : bits / 8;
}

ckptio_status ckptio__torch_check_archive(ckptio_torch *t, ptrdiff_t ids[CKPTIO__TREC_COUNT_]) {
    for (int i = 0; i < CKPTIO__TREC_COUNT_; i++) ids[i] = -1;
    if (t->nentries == 0) return TFAIL(t, CKPTIO_E_FORMAT, -1, NULL, "zip archive has no records");
    const char *first = t->entries[0].name;
    const char *slash = strchr(first, '/');
    if (!slash || slash == first)
        return TFAIL(t, CKPTIO_E_FORMAT, (int64_t)t->entries[0].header_offset, first,
                     "record name has no '<prefix>/' directory, so this is not a torch.save archive");
    const size_t plen = (size_t)(slash - first);
    t->prefix = ckptio__malloc(plen + 1);
    if (!t->prefix) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the record prefix");
    memcpy(t->prefix, first, plen);
    t->prefix[plen] = '\0';
    for (size_t i = 0; i < t->nentries; i++) {
        const ckptio__zip_entry *e = &t->entries[i];
        if (strncmp(e->name, first, plen + 1) != 0)
            return TFAIL(t, CKPTIO_E_FORMAT, (int64_t)e->header_offset, e->name,
                         "record is outside the archive's prefix '%s/'", t->prefix);
        const char *rel = e->name + plen + 1;
        if (strcmp(rel, "constants.pkl") == 0 || strncmp(rel, "code/", 5) == 0)
            return TFAIL(t, CKPTIO_E_UNSUPPORTED, (int64_t)e->header_offset, e->name,
                         "this is a TorchScript archive (torch.jit.save), not a torch.save checkpoint; "
                         "TorchScript is not supported");
        int which = -1;
        if (strcmp(rel, "data.pkl") == 0) which = CKPTIO__TREC_PICKLE;
        else if (strcmp(rel, "version") == 0 || (strcmp(rel, ".data/version") == 0 && ids[CKPTIO__TREC_VERSION] < 0))
            which = CKPTIO__TREC_VERSION;
        else if (strcmp(rel, ".storage_alignment") == 0) which = CKPTIO__TREC_ALIGNMENT;
        else if (strcmp(rel, "byteorder") == 0) which = CKPTIO__TREC_BYTEORDER;
        if (which >= 0) ids[which] = (ptrdiff_t)i;
    }
    for (size_t i = 0; i < t->nentries; i++) {
        const ckptio__zip_entry *e = &t->entries[i];
        if (e->method != 0)
            return TFAIL(t, CKPTIO_E_UNSUPPORTED, (int64_t)e->header_offset, e->name,
                         "record is compressed (method %u); torch.save archives store records uncompressed",
                         e->method);
    }
    if (ids[CKPTIO__TREC_PICKLE] < 0)
        return TFAIL(t, CKPTIO_E_FORMAT, -1, NULL, "archive has no '%s/data.pkl' record", t->prefix);
    if (ids[CKPTIO__TREC_VERSION] < 0)
        return TFAIL(t, CKPTIO_E_FORMAT, -1, NULL, "archive has no '%s/version' record", t->prefix);
    return CKPTIO_OK;
}

/* ---- naming tensors ------------------------------------------------------------ */

static ckptio_status add_tensor(void *ctx, const char *spelled, const char *path, ckptio_value *node) {
    (void)spelled;
    ckptio_torch *t = ctx;
    if (t->ntensors == t->tensor_cap) {
        size_t ncap = t->tensor_cap ? t->tensor_cap * 2 : 64;
        ckptio__torch_tensor *grown = ckptio__realloc(t->tensors, ncap * sizeof *grown);
        if (!grown) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the tensor list");
        t->tensors = grown;
        t->tensor_cap = ncap;
    }
    t->name_bytes += strlen(path) + 1;
    if (t->name_bytes > t->name_budget)
        return TFAIL(t, CKPTIO_E_FORMAT, -1, NULL,
                     "the names of %zu tensors take more than %llu bytes for a pickle this size (shared objects "
                     "naming long keys under many paths)",
                     t->ntensors + 1, (unsigned long long)t->name_budget);
    char *name = ckptio__strdup(path);
    if (!name) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a tensor name");
    if (node->u.tensor.index == SIZE_MAX) node->u.tensor.index = t->ntensors;
    t->tensors[t->ntensors++] = (ckptio__torch_tensor){.name = name, .node = node};
    return CKPTIO_OK;
}

/* ---- storages -------------------------------------------------------------------- */

typedef struct named_entry {
    const char *name;
    size_t index;
} named_entry;

static int cmp_named(const void *a, const void *b) {
    return strcmp(((const named_entry *)a)->name, ((const named_entry *)b)->name);
}

static ptrdiff_t find_sorted(const named_entry *sorted, size_t n, const char *name) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(sorted[mid].name, name);
        if (c == 0) return (ptrdiff_t)sorted[mid].index;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* Resolves every tensor's storage to a record and checks the view. */
static ckptio_status resolve(ckptio_torch *t) {
    ckptio_status st = CKPTIO_OK;
    const size_t name_cap = strlen(t->prefix) + 80;
    named_entry *sorted = ckptio__malloc((t->nentries ? t->nentries : 1) * sizeof *sorted);
    size_t *slot_of_entry = ckptio__malloc((t->nentries ? t->nentries : 1) * sizeof *slot_of_entry);
    char *name = ckptio__malloc(name_cap);
    /* At most one storage per tensor. */
    t->storages = ckptio__calloc(t->ntensors ? t->ntensors : 1, sizeof *t->storages);
    if (!sorted || !slot_of_entry || !t->storages || !name) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for the storage table");
        goto out;
    }
    for (size_t i = 0; i < t->nentries; i++) {
        sorted[i] = (named_entry){.name = t->entries[i].name, .index = i};
        slot_of_entry[i] = SIZE_MAX;
    }
    qsort(sorted, t->nentries, sizeof *sorted, cmp_named);
    for (size_t i = 0; i < t->ntensors; i++) {
        ckptio_value *node = t->tensors[i].node;
        const char *tname = t->tensors[i].name;
        ckptio__storage_ref *ref = &node->u.tensor.storage->u.storage;
        snprintf(name, name_cap, "%s/data/%s", t->prefix, ref->key);
        ptrdiff_t e = find_sorted(sorted, t->nentries, name);
        if (e < 0) {
            st = TFAIL(t, CKPTIO_E_FORMAT, -1, tname, "storage '%s' has no record '%s' in the archive", ref->key, name);
            goto out;
        }
        size_t slot = slot_of_entry[e];
        if (slot == SIZE_MAX) {
            uint64_t esize = ckptio__torch_element_size(ref->dtype), nbytes;
            if (!esize || ckptio__mul_overflows(ref->numel, esize, &nbytes)) {
                st = TFAIL(t, CKPTIO_E_FORMAT, -1, tname, "storage '%s' declares %llu elements: size overflows",
                           ref->key, (unsigned long long)ref->numel);
                goto out;
            }
            if (nbytes != t->entries[e].size) {
                st = TFAIL(t, CKPTIO_E_FORMAT, (int64_t)t->entries[e].header_offset, tname,
                           "record '%s' holds %llu bytes but the pickle declares %llu", name,
                           (unsigned long long)t->entries[e].size, (unsigned long long)nbytes);
                goto out;
            }
            slot = slot_of_entry[e] = t->nstorages++;
            t->storages[slot] = (ckptio__torch_storage){.ref = ref, .entry = (size_t)e, .nbytes = nbytes};
        }
        ckptio__torch_storage *s = &t->storages[slot];
        uint64_t esize = ckptio__torch_element_size(ref->dtype), nbytes;
        if (ckptio__mul_overflows(ref->numel, esize, &nbytes) || nbytes != s->nbytes) {
            st = TFAIL(t, CKPTIO_E_FORMAT, -1, tname, "storage '%s' is referenced with %llu and %llu bytes", ref->key,
                       (unsigned long long)s->nbytes, (unsigned long long)nbytes);
            goto out;
        }
        ref->index = slot;
        /* The view must lie inside the storage. */
        const ckptio__tensor_ref *tr = &node->u.tensor;
        const uint64_t tsize = ckptio__torch_element_size(tr->dtype);
        if (!tsize) {
            st = TFAIL(t, CKPTIO_E_UNSUPPORTED, -1, tname, "dtype %s has no torch element size",
                       ckptio_dtype_name(tr->dtype));
            goto out;
        }
        bool empty = false;
        uint64_t last = tr->storage_offset;
        bool overflow = false;
        for (uint32_t d = 0; d < tr->ndim; d++) {
            if (tr->shape[d] == 0) empty = true;
            uint64_t step;
            if (tr->shape[d] > 0) {
                overflow |= ckptio__mul_overflows((uint64_t)(tr->shape[d] - 1), (uint64_t)tr->stride[d], &step);
                overflow |= ckptio__add_overflows(last, step, &last);
            }
        }
        uint64_t end;
        overflow |= ckptio__add_overflows(last, 1, &end) || ckptio__mul_overflows(end, tsize, &end);
        if (!empty && (overflow || end > s->nbytes)) {
            st = TFAIL(t, CKPTIO_E_FORMAT, -1, tname,
                       "view (offset %llu, %u dimensions) reaches past its storage '%s' of %llu bytes",
                       (unsigned long long)tr->storage_offset, tr->ndim, ref->key, (unsigned long long)s->nbytes);
            goto out;
        }
    }
out:
    ckptio__free(sorted);
    ckptio__free(slot_of_entry);
    ckptio__free(name);
    return st;
}

static bool parse_small_uint(const char *text, uint64_t *out) {
    if (!text || !*text) return false;
    uint64_t v = 0;
    const char *p = text;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > 1000000) return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (p == text) return false;
    if (*p == '\n') p++;
    if (*p) return false;
    *out = v;
    return true;
}

ckptio_status ckptio__torch_build(ckptio_torch *t, const uint8_t *pickle, size_t pickle_len, uint64_t pickle_offset,
                                  const char *version, const char *alignment, const char *byteorder) {
    uint64_t v;
    if (!parse_small_uint(version, &v) || v < 1 || v > 10)
        return TFAIL(t, CKPTIO_E_UNSUPPORTED, -1, "version", "archive version '%s' is not 1..10",
                     version ? version : "");
    t->alignment = 64;
    if (alignment && (!parse_small_uint(alignment, &t->alignment) || t->alignment == 0))
        return TFAIL(t, CKPTIO_E_FORMAT, -1, ".storage_alignment", "'%s' is not a positive number", alignment);
    if (byteorder && strcmp(byteorder, "little") != 0) {
        if (strcmp(byteorder, "big") == 0)
            return TFAIL(t, CKPTIO_E_UNSUPPORTED, -1, "byteorder", "big-endian checkpoints are not supported");
        return TFAIL(t, CKPTIO_E_FORMAT, -1, "byteorder", "unknown byte order '%s'", byteorder);
    }
    char record[300];
    snprintf(record, sizeof record, "%.200s/data.pkl", t->prefix);
    CKPTIO_FORWARD(ckptio__unpickle(pickle, pickle_len, t->path, record, pickle_offset, &t->pool, &t->root));
    t->name_budget = CKPTIO__TORCH_NAME_BYTES_BASE + (uint64_t)pickle_len * CKPTIO__TORCH_NAME_BYTES_PER_PICKLE_BYTE;
    CKPTIO_FORWARD(ckptio__torch_walk_names(t->root, t->path, "load torch file", add_tensor, t));
    CKPTIO_FORWARD(ckptio__torch_check_unique_names(t->root, t->tensors, t->ntensors, t->path, "load torch file"));
    return resolve(t);
}

void ckptio__torch_free_tables(ckptio_torch *t) {
    for (size_t i = 0; i < t->ntensors; i++) ckptio__free(t->tensors[i].name);
    ckptio__free(t->tensors);
    ckptio__free(t->storages);
    ckptio__value_pool_free(&t->pool);
    ckptio__zip_entries_free(t->entries, t->nentries);
    ckptio__free(t->prefix);
    ckptio__free(t->path);
}

/* ---- public accessors ----------------------------------------------------------------- */

ckptio_status ckptio_torch_root(const ckptio_torch *t, const ckptio_value **out) {
    if (!t || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    *out = t->root;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_count(const ckptio_torch *t, size_t *out) {
    if (!t || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    *out = t->ntensors;
    return CKPTIO_OK;
}

static bool is_contiguous(const ckptio__tensor_ref *tr) {
    int64_t expected = 1;
    for (uint32_t d = tr->ndim; d-- > 0;) {
        if (tr->shape[d] == 0) return true;
        if (tr->shape[d] != 1 && tr->stride[d] != expected) return false;
        expected *= tr->shape[d];
    }
    return true;
}

ckptio_status ckptio_torch_tensor(const ckptio_torch *t, size_t index, ckptio_torch_tensor_info *out) {
    if (!t || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    if (index >= t->ntensors)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)", index, t->ntensors);
    const ckptio_value *node = t->tensors[index].node;
    const ckptio__tensor_ref *tr = &node->u.tensor;
    const ckptio__storage_ref *ref = &tr->storage->u.storage;
    const uint64_t esize = ckptio__torch_element_size(tr->dtype);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < tr->ndim; d++) numel *= (uint64_t)tr->shape[d]; /* bounded by the storage check */
    *out = (ckptio_torch_tensor_info){
        .name = t->tensors[index].name,
        .dtype = tr->dtype,
        .ndim = tr->ndim,
        .shape = tr->shape,
        .stride = tr->stride,
        .storage_offset = tr->storage_offset,
        .storage = ref->index,
        .requires_grad = (node->flags & CKPTIO__VFLAG_GRAD) != 0,
        .is_parameter = (node->flags & CKPTIO__VFLAG_PARAMETER) != 0,
        .is_contiguous = is_contiguous(tr),
        .file_offset = t->entries[t->storages[ref->index].entry].data_offset + tr->storage_offset * esize,
        .nbytes = numel * esize,
        .value = node,
    };
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_find(const ckptio_torch *t, const char *name, size_t *index) {
    if (!t || !name || !index) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle, name and output must not be NULL");
    for (size_t i = 0; i < t->ntensors; i++) {
        if (strcmp(t->tensors[i].name, name) == 0) {
            *index = i;
            return CKPTIO_OK;
        }
    }
    return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND,
                           &((ckptio__err_ctx){.path = t->path, .subject = name, .file_offset = -1}),
                           "no tensor of this name");
}

ckptio_status ckptio_torch_storage_count(const ckptio_torch *t, size_t *out) {
    if (!t || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    *out = t->nstorages;
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_storage(const ckptio_torch *t, size_t index, ckptio_torch_storage_info *out) {
    if (!t || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    if (index >= t->nstorages)
        return CKPTIO_FAIL(CKPTIO_E_RANGE, "storage index %zu out of range (%zu storages)", index, t->nstorages);
    const ckptio__torch_storage *s = &t->storages[index];
    const ckptio__zip_entry *e = &t->entries[s->entry];
    *out = (ckptio_torch_storage_info){.key = s->ref->key,
                                       .location = s->ref->location,
                                       .dtype = s->ref->dtype,
                                       .nbytes = s->nbytes,
                                       .file_offset = e->data_offset,
                                       .crc32 = e->crc32};
    return CKPTIO_OK;
}

ckptio_status ckptio_torch_alignment(const ckptio_torch *t, uint64_t *out) {
    if (!t || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    *out = t->alignment;
    return CKPTIO_OK;
}
