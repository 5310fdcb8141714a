/*
 * dcp_dir.c - a torch.distributed.checkpoint directory as a table: the
 * tensors (global shape, chunks, where each chunk is stored) and byte items
 * that DIR/.metadata describes, read through the restricted unpickler.
 *
 * .metadata is untrusted input: every field is checked for its type and
 * range before it is used, relative paths must stay inside the directory,
 * and errors name the file and the field (state_dict_metadata['x'] ...).
 * Decoding items and assembling tensors is dcp_assemble.c; the ckptio
 * manifest is dcp_manifest_verify.c.
 */
#include "dcp_commit_internal.h"
#include "dcp_dir_internal.h"
#include "engine_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DCP_MD CKPTIO__DCP_MD

/* Largest .metadata read (torch writes a few hundred bytes per chunk). */
#define METADATA_MAX ((uint64_t)1 << 31)


/* Error about a field of .metadata: "DIR/.metadata: SUBJECT: message". */
#define MDFAIL(status_, h_, subject_, ...)                                                                      \
    CKPTIO_FAIL_CTX((status_), &((ckptio__err_ctx){.path = (h_)->md_path, .file_offset = -1, .subject = (subject_)}), \
                    __VA_ARGS__)

uint64_t ckptio__dcp_element_size(ckptio_dtype dtype) {
    if (dtype == CKPTIO_DTYPE_F4) return 1; /* float4_e2m1fn_x2: two values per torch element */
    if (!ckptio_dtype_torch_name(dtype)) return 0;
    const unsigned bits = ckptio_dtype_bits(dtype);
    return bits % 8 ? 0 : bits / 8;
}

bool ckptio__dcp_plain_name(const char *name, size_t len) {
    if (!name || len == 0 || memchr(name, '\0', len) || memchr(name, '/', len)) return false;
    if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.')) return false;
    return true;
}

/* ---- value-tree helpers ---------------------------------------------------------- */

static bool class_is(const ckptio_value *v, const char *cls) {
    const char *name = NULL;
    return ckptio_value_kind_of(v) == CKPTIO_VALUE_OBJECT && ckptio_value_object(v, &name, NULL, NULL) == CKPTIO_OK &&
           strcmp(name, cls) == 0;
}

/* A torch.Size (OBJECT with one tuple argument), tuple or list of ints into
 * out[CKPTIO_DCP_MAX_NDIM]. Returns false if it is none of these. */
static bool int_list(const ckptio_value *v, int64_t *out, uint32_t *n) {
    const ckptio_value *args = NULL;
    if (class_is(v, "torch.Size")) {
        size_t na = 0;
        ckptio_value_object(v, NULL, &args, NULL);
        if (ckptio_value_len(args, &na) != CKPTIO_OK) return false;
        if (na == 0) {
            *n = 0;
            return true;
        }
        if (na != 1 || ckptio_value_item(args, 0, &v) != CKPTIO_OK) return false;
    }
    const ckptio_value_kind k = ckptio_value_kind_of(v);
    size_t len = 0;
    if ((k != CKPTIO_VALUE_TUPLE && k != CKPTIO_VALUE_LIST) || ckptio_value_len(v, &len) != CKPTIO_OK ||
        len > CKPTIO_DCP_MAX_NDIM)
        return false;
    for (size_t i = 0; i < len; i++) {
        const ckptio_value *item;
        if (ckptio_value_item(v, i, &item) != CKPTIO_OK || ckptio_value_kind_of(item) != CKPTIO_VALUE_INT ||
            ckptio_value_int(item, &out[i]) != CKPTIO_OK)
            return false;
    }
    *n = (uint32_t)len;
    return true;
}

static bool uint_of(const ckptio_value *v, uint64_t *out) {
    int64_t x;
    if (ckptio_value_kind_of(v) != CKPTIO_VALUE_INT || ckptio_value_int(v, &x) != CKPTIO_OK || x < 0) return false;
    *out = (uint64_t)x;
    return true;
}

/* ---- state_dict_metadata ----------------------------------------------------------- */

/* The fields of a TensorProperties state tuple other than dtype and layout,
 * checked as torch's __setstate__ and the Python reader (_metadata.py) take
 * them: requires_grad and pin_memory bools, the memory format one of the 3
 * members of _MEM_FORMAT_ENCODING (torch <= 2.2: MEM_FORMAT_ENCODING, same
 * class here), strides None or a tuple of ints. */
static ckptio_status check_properties_tuple(ckptio_dcp *h, const char *subj, const ckptio_value *state, size_t n) {
    const ckptio_value *requires_grad = NULL, *mem = NULL, *pin = NULL, *strides = NULL, *args = NULL, *member = NULL;
    ckptio_value_item(state, 2, &requires_grad);
    ckptio_value_item(state, 3, &mem);
    ckptio_value_item(state, 4, &pin);
    if (n == 6) ckptio_value_item(state, 5, &strides);
    if (ckptio_value_kind_of(requires_grad) != CKPTIO_VALUE_BOOL || ckptio_value_kind_of(pin) != CKPTIO_VALUE_BOOL)
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "TensorProperties.requires_grad or pin_memory is not a bool");
    size_t na = 0;
    int64_t code = -1;
    if (!class_is(mem, DCP_MD "_MEM_FORMAT_ENCODING") || ckptio_value_object(mem, NULL, &args, NULL) != CKPTIO_OK ||
        ckptio_value_len(args, &na) != CKPTIO_OK || na != 1 || ckptio_value_item(args, 0, &member) != CKPTIO_OK ||
        ckptio_value_kind_of(member) != CKPTIO_VALUE_INT || ckptio_value_int(member, &code) != CKPTIO_OK)
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "TensorProperties.memory_format is not a _MEM_FORMAT_ENCODING");
    if (code < 0 || code > 2)
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "TensorProperties.memory_format %lld is not a member of "
                      "_MEM_FORMAT_ENCODING (0-2)", (long long)code);
    int64_t dims[CKPTIO_DCP_MAX_NDIM];
    uint32_t nd = 0;
    if (strides && ckptio_value_kind_of(strides) != CKPTIO_VALUE_NONE &&
        (ckptio_value_kind_of(strides) == CKPTIO_VALUE_LIST || !int_list(strides, dims, &nd)))
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "TensorProperties.strides is not None or a tuple of ints");
    return CKPTIO_OK;
}

/* The dtype of a TensorProperties: state tuple (dtype, layout, requires_grad,
 * memory_format, pin_memory[, strides]) or an older dict state. */
static ckptio_status tensor_dtype(ckptio_dcp *h, const char *subj, const ckptio_value *props, ckptio_dtype *out) {
    const char *cls = NULL;
    const ckptio_value *state = NULL;
    if (ckptio_value_kind_of(props) != CKPTIO_VALUE_OBJECT ||
        ckptio_value_object(props, &cls, NULL, &state) != CKPTIO_OK || strcmp(cls, DCP_MD "TensorProperties") != 0)
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "properties is not a TensorProperties");
    const ckptio_value *dtype = NULL, *layout = NULL;
    size_t n = 0;
    if (ckptio_value_kind_of(state) == CKPTIO_VALUE_TUPLE && ckptio_value_len(state, &n) == CKPTIO_OK) {
        if (n != 5 && n != 6)
            return MDFAIL(CKPTIO_E_FORMAT, h, subj, "TensorProperties state has %zu fields (want 5 or 6)", n);
        CKPTIO_FORWARD(check_properties_tuple(h, subj, state, n));
        ckptio_value_item(state, 0, &dtype);
        ckptio_value_item(state, 1, &layout);
    } else if (ckptio_value_kind_of(state) == CKPTIO_VALUE_DICT) {
        dtype = ckptio__dcp_dict_get(state, "dtype");
        layout = ckptio__dcp_dict_get(state, "layout");
    }
    if (ckptio_value_kind_of(dtype) != CKPTIO_VALUE_DTYPE || ckptio_value_dtype(dtype, out) != CKPTIO_OK)
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "TensorProperties has no dtype");
    if (layout) {
        const ckptio_value *args = NULL, *first = NULL;
        size_t na = 0;
        const char *lname = NULL;
        if (!class_is(layout, "torch.serialization._get_layout") ||
            ckptio_value_object(layout, NULL, &args, NULL) != CKPTIO_OK || ckptio_value_len(args, &na) != CKPTIO_OK ||
            na != 1 || ckptio_value_item(args, 0, &first) != CKPTIO_OK || !(lname = ckptio__dcp_str_of(first, NULL)))
            return MDFAIL(CKPTIO_E_FORMAT, h, subj, "TensorProperties.layout is not a torch.layout");
        if (strcmp(lname, "torch.strided") != 0)
            return MDFAIL(CKPTIO_E_UNSUPPORTED, h, subj, "layout %s (only torch.strided tensors are supported)", lname);
    }
    if (ckptio__dcp_element_size(*out) == 0)
        return MDFAIL(CKPTIO_E_UNSUPPORTED, h, subj, "dtype %s cannot be read", ckptio_dtype_name(*out));
    return CKPTIO_OK;
}

static int cmp_offsets(const int64_t *a, const int64_t *b, uint32_t n) {
    for (uint32_t d = 0; d < n; d++)
        if (a[d] != b[d]) return a[d] < b[d] ? -1 : 1;
    return 0;
}

/* Chunk order for the index: offsets, then position (a stable order, so the
 * lookup finds the first of chunks that share offsets). */
static int cmp_chunk_offsets(const void *a, const void *b, void *arg) {
    const ckptio__dcp_tensor *t = arg;
    const size_t ca = *(const size_t *)a, cb = *(const size_t *)b;
    const int c = cmp_offsets(t->offsets + ca * t->ndim, t->offsets + cb * t->ndim, t->ndim);
    return c ? c : (ca < cb ? -1 : ca > cb);
}

static ckptio_status add_tensor(ckptio_dcp *h, const char *fqn, const char *subj, const ckptio_value *fields,
                                ckptio__dcp_tensor *t) {
    int64_t shape[CKPTIO_DCP_MAX_NDIM];
    uint32_t ndim = 0;
    CKPTIO_FORWARD(tensor_dtype(h, subj, ckptio__dcp_dict_get(fields, "properties"), &t->dtype));
    if (!int_list(ckptio__dcp_dict_get(fields, "size"), shape, &ndim))
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "size is not a torch.Size of at most %u ints", CKPTIO_DCP_MAX_NDIM);
    const ckptio__err_ctx ctx = {.path = h->md_path, .file_offset = -1, .subject = subj};
    uint64_t numel = 0;
    CKPTIO_FORWARD(ckptio__dcp_numel(&ctx, ndim, shape, &numel));
    if (ckptio__mul_overflows(numel, ckptio__dcp_element_size(t->dtype), &t->nbytes))
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "the size in bytes overflows 64 bits");
    t->numel = numel;
    t->ndim = ndim;
    const ckptio_value *chunks = ckptio__dcp_dict_get(fields, "chunks");
    size_t nchunks = 0;
    const ckptio_value_kind ck = ckptio_value_kind_of(chunks);
    if ((ck != CKPTIO_VALUE_LIST && ck != CKPTIO_VALUE_TUPLE) || ckptio_value_len(chunks, &nchunks) != CKPTIO_OK)
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "chunks is not a list");
    if (!(t->fqn = ckptio__strdup(fqn)) || !(t->shape = ckptio__calloc(ndim ? ndim : 1, sizeof *t->shape)) ||
        !(t->offsets = ckptio__calloc(nchunks * ndim + 1, sizeof *t->offsets)) ||
        !(t->sizes = ckptio__calloc(nchunks * ndim + 1, sizeof *t->sizes)) ||
        !(t->stored = ckptio__calloc(nchunks + 1, sizeof *t->stored)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the table of tensor '%s'", fqn);
    memcpy(t->shape, shape, ndim * sizeof *shape);
    t->nchunks = nchunks;
    for (size_t c = 0; c < nchunks; c++) {
        const ckptio_value *chunk = NULL;
        ckptio_value_item(chunks, c, &chunk);
        const ckptio_value *cf = ckptio__dcp_fields_of(chunk, DCP_MD "ChunkStorageMetadata");
        if (!cf) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "chunk %zu is not a ChunkStorageMetadata", c);
        int64_t off[CKPTIO_DCP_MAX_NDIM], size[CKPTIO_DCP_MAX_NDIM];
        uint32_t no = 0, ns = 0;
        if (!int_list(ckptio__dcp_dict_get(cf, "offsets"), off, &no) ||
            !int_list(ckptio__dcp_dict_get(cf, "sizes"), size, &ns))
            return MDFAIL(CKPTIO_E_FORMAT, h, subj, "chunk %zu: offsets or sizes is not a torch.Size", c);
        if (no != ndim)
            return MDFAIL(CKPTIO_E_FORMAT, h, subj, "chunk %zu has %u offsets for a %u-d tensor", c, no, ndim);
        if (ns != ndim)
            return MDFAIL(CKPTIO_E_FORMAT, h, subj, "chunk %zu has %u sizes for a %u-d tensor", c, ns, ndim);
        CKPTIO_FORWARD(ckptio__dcp_chunk_inside(&ctx, c, ndim, shape, off, size));
        memcpy(t->offsets + c * ndim, off, ndim * sizeof *off);
        memcpy(t->sizes + c * ndim, size, ndim * sizeof *size);
    }
    /* storage_data names chunks by their offsets: an index keeps that lookup
     * O(log n) (a hostile .metadata may split one tensor into 100k+ chunks). */
    if (!(t->by_offsets = ckptio__calloc(nchunks + 1, sizeof *t->by_offsets)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for the table of tensor '%s'", fqn);
    for (size_t c = 0; c < nchunks; c++) t->by_offsets[c] = c;
    qsort_r(t->by_offsets, nchunks, sizeof *t->by_offsets, cmp_chunk_offsets, t);
    return CKPTIO_OK;
}

size_t ckptio__dcp_chunk_index(const ckptio__dcp_tensor *t, const int64_t *off, uint32_t n) {
    if (n != t->ndim) return (size_t)-1;
    size_t lo = 0, hi = t->nchunks;
    while (lo < hi) { /* lower bound: the first chunk with these offsets */
        const size_t mid = lo + (hi - lo) / 2;
        if (cmp_offsets(t->offsets + t->by_offsets[mid] * n, off, n) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < t->nchunks && cmp_offsets(t->offsets + t->by_offsets[lo] * n, off, n) == 0) return t->by_offsets[lo];
    return (size_t)-1;
}

static int cmp_by_name(const void *a, const void *b, void *arg) {
    const ckptio_dcp *h = arg;
    return strcmp(h->tensors[*(const size_t *)a].fqn, h->tensors[*(const size_t *)b].fqn);
}

static int cmp_bytes_by_name(const void *a, const void *b, void *arg) {
    const ckptio_dcp *h = arg;
    return strcmp(h->bytes[*(const size_t *)a].fqn, h->bytes[*(const size_t *)b].fqn);
}

static const char *tensor_name(const ckptio_dcp *h, size_t i) { return h->tensors[i].fqn; }
static const char *bytes_name(const ckptio_dcp *h, size_t i) { return h->bytes[i].fqn; }

/* Binary search of `fqn` in `index` (n entries sorted by name_of). */
static size_t find_sorted(const ckptio_dcp *h, const size_t *index, size_t n,
                          const char *(*name_of)(const ckptio_dcp *, size_t), const char *fqn) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const int c = strcmp(name_of(h, index[mid]), fqn);
        if (c == 0) return index[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return (size_t)-1;
}

/* Sorts index[0..n) (the identity at first) by name: each name once, else
 * CKPTIO_E_FORMAT naming the one that appears twice. */
static ckptio_status index_by_name(ckptio_dcp *h, size_t *index, size_t n,
                                   int (*cmp)(const void *, const void *, void *),
                                   const char *(*name_of)(const ckptio_dcp *, size_t), const char *what) {
    for (size_t i = 0; i < n; i++) index[i] = i;
    qsort_r(index, n, sizeof *index, cmp, h);
    for (size_t i = 1; i < n; i++)
        if (strcmp(name_of(h, index[i]), name_of(h, index[i - 1])) == 0)
            return MDFAIL(CKPTIO_E_FORMAT, h, "state_dict_metadata", "%s '%s' appears twice", what,
                          name_of(h, index[i]));
    return CKPTIO_OK;
}

size_t ckptio__dcp_tensor_index(const ckptio_dcp *h, const char *fqn) {
    return find_sorted(h, h->by_name, h->ntensors, tensor_name, fqn);
}

size_t ckptio__dcp_bytes_index(const ckptio_dcp *h, const char *fqn) {
    return find_sorted(h, h->bytes_by_name, h->nbytes_items, bytes_name, fqn);
}

static ckptio_status read_state_dict(ckptio_dcp *h, const ckptio_value *sdm) {
    size_t n = 0;
    if (ckptio_value_kind_of(sdm) != CKPTIO_VALUE_DICT || ckptio_value_len(sdm, &n) != CKPTIO_OK)
        return MDFAIL(CKPTIO_E_FORMAT, h, "state_dict_metadata", "missing or not a dict");
    if (!(h->tensors = ckptio__calloc(n + 1, sizeof *h->tensors)) ||
        !(h->bytes = ckptio__calloc(n + 1, sizeof *h->bytes)) ||
        !(h->by_name = ckptio__calloc(n + 1, sizeof *h->by_name)) ||
        !(h->bytes_by_name = ckptio__calloc(n + 1, sizeof *h->bytes_by_name)))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for %zu entries of %s", n, h->md_path);
    for (size_t i = 0; i < n; i++) {
        const ckptio_value *k, *v;
        ckptio_value_dict_item(sdm, i, &k, &v);
        const char *fqn = ckptio__dcp_str_of(k, NULL);
        char subj[256];
        if (!fqn) return MDFAIL(CKPTIO_E_FORMAT, h, "state_dict_metadata", "key %zu is not a string", i);
        snprintf(subj, sizeof subj, "state_dict_metadata['%s']", fqn);
        if (class_is(v, DCP_MD "BytesStorageMetadata")) {
            if (!(h->bytes[h->nbytes_items].fqn = ckptio__strdup(fqn)))
                return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
            h->nbytes_items++;
            continue;
        }
        const ckptio_value *fields = ckptio__dcp_fields_of(v, DCP_MD "TensorStorageMetadata");
        if (!fields)
            return MDFAIL(CKPTIO_E_FORMAT, h, subj, "neither a TensorStorageMetadata nor a BytesStorageMetadata");
        h->ntensors++; /* counted first: close frees what add_tensor allocated */
        CKPTIO_FORWARD(add_tensor(h, fqn, subj, fields, &h->tensors[h->ntensors - 1]));
    }
    CKPTIO_FORWARD(index_by_name(h, h->by_name, h->ntensors, cmp_by_name, tensor_name, "tensor"));
    CKPTIO_FORWARD(index_by_name(h, h->bytes_by_name, h->nbytes_items, cmp_bytes_by_name, bytes_name, "byte item"));
    for (size_t j = 0; j < h->nbytes_items; j++)
        if (ckptio__dcp_tensor_index(h, h->bytes[j].fqn) != (size_t)-1)
            return MDFAIL(CKPTIO_E_FORMAT, h, "state_dict_metadata", "'%s' is both a tensor and a byte item",
                          h->bytes[j].fqn);
    return CKPTIO_OK;
}

/* ---- storage_data ------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

size_t ckptio__dcp_file_index(const ckptio_dcp *h, const char *name) {
    char *const *hit = bsearch(&name, h->files, h->nfiles, sizeof *h->files, cmp_str);
    return hit ? (size_t)(hit - h->files) : (size_t)-1;
}

static ckptio_status storage_info(ckptio_dcp *h, const char *subj, const ckptio_value *info, ckptio_dcp_stored *out) {
    const ckptio_value *f = ckptio__dcp_fields_of(info, "torch.distributed.checkpoint.filesystem._StorageInfo");
    if (!f) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "the value is not a _StorageInfo");
    size_t plen = 0;
    const char *path = ckptio__dcp_str_of(ckptio__dcp_dict_get(f, "relative_path"), &plen);
    if (!path) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "relative_path is not a string");
    if (!ckptio__dcp_plain_name(path, plen))
        return MDFAIL(CKPTIO_E_FORMAT, h, subj,
                      "relative_path '%s' leaves the checkpoint directory (absolute, '/', '..' or empty)", path);
    if (!uint_of(ckptio__dcp_dict_get(f, "offset"), &out->offset) ||
        !uint_of(ckptio__dcp_dict_get(f, "length"), &out->length))
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "offset or length is not a non-negative int");
    uint64_t end;
    if (ckptio__add_overflows(out->offset, out->length, &end) || end > INT64_MAX)
        return MDFAIL(CKPTIO_E_FORMAT, h, subj, "offset + length overflows");
    out->transforms = 0;
    const ckptio_value *tds = ckptio__dcp_dict_get(f, "transform_descriptors");
    const ckptio_value_kind tk = ckptio_value_kind_of(tds);
    if (tds && tk != CKPTIO_VALUE_NONE) {
        size_t n = 0;
        if ((tk != CKPTIO_VALUE_LIST && tk != CKPTIO_VALUE_TUPLE) || ckptio_value_len(tds, &n) != CKPTIO_OK)
            return MDFAIL(CKPTIO_E_FORMAT, h, subj, "transform_descriptors is not a list");
        /* ckptio applies stream.zstd/1 (or a compatible 1.x) and nothing else,
         * at most once: the whole list is looked at first (one pass), so the
         * error says what is wrong with it rather than with one descriptor. */
        size_t nzstd = 0;
        for (size_t i = 0; i < n; i++) {
            const ckptio_value *d;
            ckptio_value_item(tds, i, &d);
            const char *s = ckptio__dcp_str_of(d, NULL);
            if (!s) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "transform descriptor %zu is not a string", i);
            if (strncmp(s, "stream.zstd/1", 13) == 0 && (s[13] == '\0' || s[13] == '.')) {
                nzstd++;
                continue;
            }
            return MDFAIL(CKPTIO_E_UNSUPPORTED, h, subj,
                          "unsupported transform '%s' (descriptor %zu of %zu): ckptio reads only 'stream.zstd/1'", s,
                          i + 1, n);
        }
        if (nzstd > 1)
            return MDFAIL(CKPTIO_E_UNSUPPORTED, h, subj,
                          "the item has %zu transforms, all 'stream.zstd/1'; ckptio reads at most one 'stream.zstd/1'",
                          n);
        if (nzstd) out->transforms |= CKPTIO_DCP_TRANSFORM_ZSTD;
    }
    out->file = path; /* borrowed from the pickle; collect_files() makes it the table's copy */
    return CKPTIO_OK;
}

static ckptio_status read_storage_data(ckptio_dcp *h, const ckptio_value *sd) {
    size_t n = 0;
    if (ckptio_value_kind_of(sd) != CKPTIO_VALUE_DICT || ckptio_value_len(sd, &n) != CKPTIO_OK)
        return MDFAIL(CKPTIO_E_FORMAT, h, "storage_data", "missing or not a dict");
    for (size_t i = 0; i < n; i++) {
        const ckptio_value *k, *v;
        ckptio_value_dict_item(sd, i, &k, &v);
        const ckptio_value *mi = ckptio__dcp_fields_of(k, DCP_MD "MetadataIndex");
        const char *fqn = mi ? ckptio__dcp_str_of(ckptio__dcp_dict_get(mi, "fqn"), NULL) : NULL;
        if (!fqn) return MDFAIL(CKPTIO_E_FORMAT, h, "storage_data", "key %zu is not a MetadataIndex with an fqn", i);
        char subj[256];
        const ckptio_value *offv = ckptio__dcp_dict_get(mi, "offset");
        if (!offv || ckptio_value_kind_of(offv) == CKPTIO_VALUE_NONE) {
            snprintf(subj, sizeof subj, "storage_data['%s']", fqn);
            const size_t bj = ckptio__dcp_bytes_index(h, fqn);
            ckptio__dcp_bytes *b = bj == (size_t)-1 ? NULL : &h->bytes[bj];
            if (!b) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "names no byte item of state_dict_metadata");
            if (b->stored.file) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "stored twice");
            CKPTIO_FORWARD(storage_info(h, subj, v, &b->stored));
            continue;
        }
        int64_t off[CKPTIO_DCP_MAX_NDIM];
        uint32_t no = 0;
        snprintf(subj, sizeof subj, "storage_data['%s']", fqn);
        if (!int_list(offv, off, &no)) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "offset is not a torch.Size");
        const size_t ti = ckptio__dcp_tensor_index(h, fqn);
        if (ti == (size_t)-1) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "names no tensor of state_dict_metadata");
        ckptio__dcp_tensor *t = &h->tensors[ti];
        const size_t c = ckptio__dcp_chunk_index(t, off, no);
        if (c == (size_t)-1) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "its offset names no chunk of the tensor");
        snprintf(subj, sizeof subj, "storage_data['%s'] chunk %zu", fqn, c);
        if (t->stored[c].file) return MDFAIL(CKPTIO_E_FORMAT, h, subj, "stored twice");
        CKPTIO_FORWARD(storage_info(h, subj, v, &t->stored[c]));
    }
    for (size_t i = 0; i < h->ntensors; i++)
        for (size_t c = 0; c < h->tensors[i].nchunks; c++)
            if (!h->tensors[i].stored[c].file)
                return MDFAIL(CKPTIO_E_FORMAT, h, "storage_data", "chunk %zu of tensor '%s' has no entry", c,
                              h->tensors[i].fqn);
    for (size_t j = 0; j < h->nbytes_items; j++)
        if (!h->bytes[j].stored.file)
            return MDFAIL(CKPTIO_E_FORMAT, h, "storage_data", "byte item '%s' has no entry", h->bytes[j].fqn);
    return CKPTIO_OK;
}

static void stored_each(ckptio_dcp *h, void (*fn)(ckptio_dcp *, ckptio_dcp_stored *, size_t *), size_t *n) {
    for (size_t i = 0; i < h->ntensors; i++)
        for (size_t c = 0; c < h->tensors[i].nchunks; c++) fn(h, &h->tensors[i].stored[c], n);
    for (size_t j = 0; j < h->nbytes_items; j++) fn(h, &h->bytes[j].stored, n);
}

static void gather_name(ckptio_dcp *h, ckptio_dcp_stored *s, size_t *n) { h->files[(*n)++] = (char *)s->file; }

static void point_at_copy(ckptio_dcp *h, ckptio_dcp_stored *s, size_t *n) {
    s->file = h->files[ckptio__dcp_file_index(h, s->file)];
}

/* The distinct data file names, sorted, as the table's own copies; every
 * stored item is re-pointed at its copy. Sorting all names once keeps this
 * O(n log n) however many files a hostile .metadata names. */
static ckptio_status collect_files(ckptio_dcp *h) {
    size_t n = 0;
    for (size_t i = 0; i < h->ntensors; i++) n += h->tensors[i].nchunks;
    n += h->nbytes_items;
    if (!(h->files = ckptio__calloc(n + 1, sizeof *h->files))) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    size_t got = 0;
    stored_each(h, gather_name, &got);
    qsort(h->files, n, sizeof *h->files, cmp_str);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++)
        if (distinct == 0 || strcmp(h->files[distinct - 1], h->files[i]) != 0) h->files[distinct++] = h->files[i];
    for (size_t i = 0; i < distinct; i++) { /* h->nfiles counts the copies made, for close on failure */
        char *copy = ckptio__strdup(h->files[i]);
        if (!copy) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        h->files[i] = copy;
        h->nfiles = i + 1;
    }
    h->nfiles = distinct;
    h->file_window = ckptio__file_window(distinct);
    stored_each(h, point_at_copy, NULL);
    return CKPTIO_OK;
}

/* ---- open / close ---------------------------------------------------------------------- */

/* Opened with its first bytes (in object storage one GET, no HEAD); only a
 * larger file's rest is read after its size was checked. */
static ckptio_status read_metadata(ckptio_dcp *h, void **data, size_t *len, char version[static 160]) {
    return ckptio__object_read_all_pinned(h->engine, h->md_path, METADATA_MAX, data, len, version, 160);
}

/* The handle for `dir` with its table built from `data` (the .metadata
 * bytes, or NULL to read DIR/.metadata through the engine). */
static ckptio_status open_handle(ckptio_engine *engine, const char *dir, const void *bytes, size_t nbytes,
                                 ckptio_dcp **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_dcp_open: out must not be NULL");
    *out = NULL;
    if ((!engine && !bytes) || !dir || !*dir)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_dcp_open: engine and dir are required");
    ckptio_dcp *h = ckptio__calloc(1, sizeof *h);
    void *data = NULL;
    size_t len = nbytes;
    ckptio_pickle *p = NULL;
    ckptio_status st = CKPTIO_OK;
    if (!h) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a DCP handle");
    h->engine = engine;
    if (!(h->dir = ckptio__strdup(dir)) || !(h->md_path = ckptio__path_join(dir, ".metadata"))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        goto out;
    }
    char version[160] = "";
    if (!bytes && (st = ckptio__dcp_listing_start(engine, dir, &h->listing)) != CKPTIO_OK) goto out;
    if (!bytes && (st = read_metadata(h, &data, &len, version)) != CKPTIO_OK) goto out;
    ckptio__dcp_listing_finish(h->listing, ".metadata", version);
    if ((st = ckptio_pickle_parse_dcp_metadata(bytes ? bytes : data, len, h->md_path, &p)) != CKPTIO_OK) goto out;
    const ckptio_value *root = NULL;
    ckptio_pickle_root(p, &root);
    const ckptio_value *md = ckptio__dcp_fields_of(root, DCP_MD "Metadata");
    if (!md) {
        st = MDFAIL(CKPTIO_E_FORMAT, h, NULL, "the pickled object is not a Metadata");
        goto out;
    }
    if ((st = read_state_dict(h, ckptio__dcp_dict_get(md, "state_dict_metadata"))) != CKPTIO_OK) goto out;
    if ((st = read_storage_data(h, ckptio__dcp_dict_get(md, "storage_data"))) != CKPTIO_OK) goto out;
    if ((st = collect_files(h)) != CKPTIO_OK) goto out;
    if (!(h->handles = ckptio__calloc(h->nfiles + 1, sizeof *h->handles)) ||
        !(h->file_sizes = ckptio__calloc(h->nfiles + 1, sizeof *h->file_sizes))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        goto out;
    }
    char manifest[CKPTIO__DCP_MANIFEST_NAME_SIZE];
    if (ckptio__dcp_manifest_name((const char *const *)h->files, h->nfiles, manifest) &&
        !(h->manifest_name = ckptio__strdup(manifest))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        goto out;
    }
out:
    ckptio_pickle_close(p);
    ckptio__free(data);
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio_dcp_close(h);
        ckptio__error_restore(saved);
        return st;
    }
    *out = h;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_open(ckptio_engine *engine, const char *dir, ckptio_dcp **out) {
    if (!engine) {
        if (out) *out = NULL;
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio_dcp_open: engine and dir are required");
    }
    return open_handle(engine, dir, NULL, 0, out);
}

ckptio_status ckptio__dcp_open_bytes(const char *dir, const void *data, size_t len, ckptio_dcp **out) {
    if (!data && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "ckptio__dcp_open_bytes: no data");
    return open_handle(NULL, dir, data ? data : "", len, out);
}

ckptio_status ckptio_dcp_close(ckptio_dcp *h) {
    if (!h) return CKPTIO_OK;
    for (size_t i = 0; i < h->nblobs; i++) ckptio_dcp_header_close(h->blobs[i].header);
    ckptio__free(h->blobs);
    ckptio__dcp_listing_free(h->listing);
    for (size_t i = 0; h->handles && i < h->nfiles; i++) ckptio_file_close(h->handles[i]);
    ckptio__free(h->handles);
    ckptio__free(h->file_sizes);
    for (size_t i = 0; i < h->nfiles; i++) ckptio__free(h->files[i]);
    ckptio__free(h->files);
    for (size_t i = 0; i < h->ntensors; i++) {
        ckptio__dcp_tensor *t = &h->tensors[i];
        ckptio__free(t->fqn);
        ckptio__free(t->shape);
        ckptio__free(t->offsets);
        ckptio__free(t->sizes);
        ckptio__free(t->stored);
        ckptio__free(t->by_offsets);
    }
    ckptio__free(h->tensors);
    ckptio__free(h->by_name);
    ckptio__free(h->bytes_by_name);
    for (size_t j = 0; j < h->nbytes_items; j++) ckptio__free(h->bytes[j].fqn);
    ckptio__free(h->bytes);
    ckptio__free(h->manifest_name);
    ckptio__free(h->md_path);
    ckptio__free(h->dir);
    ckptio__free(h);
    return CKPTIO_OK;
}

/* ---- files ------------------------------------------------------------------------------- */

ckptio_status ckptio_dcp_file_open_listed(ckptio_engine *engine, const char *dir, const char *relative_path,
                                          uint64_t size, const char *etag, ckptio_file **out) {
    if (out) *out = NULL;
    CKPTIO_RETURN_IF(!engine || !dir || !*dir || !relative_path || !out, CKPTIO_E_INVAL,
                     "ckptio_dcp_file_open: engine, dir, relative_path and out are required");
    /* The one rule for every reader of a DCP directory (this library's table,
     * ckptio.dcp's FileSystemReader): a data file is a plain name inside it. */
    if (!ckptio__dcp_plain_name(relative_path, strlen(relative_path)))
        return CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,
                               &((ckptio__err_ctx){.operation = "open DCP data file", .path = dir, .file_offset = -1,
                                                   .subject = relative_path}),
                               "relative_path '%s' leaves the checkpoint directory (absolute, '/', '..' or empty): "
                               "refused, nothing outside the directory is opened", relative_path);
    char *path = ckptio__path_join(dir, relative_path);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    const bool listed = etag && *etag && ckptio__s3_is_url(path);
    ckptio_status st = listed ? ckptio__object_open_listed(engine, path, size, etag, out)
                              : ckptio_file_open(engine, path, CKPTIO_OPEN_READ, out);
    ckptio__free(path);
    return st;
}

ckptio_status ckptio_dcp_file_open(ckptio_engine *engine, const char *dir, const char *relative_path,
                                   ckptio_file **out) {
    return ckptio_dcp_file_open_listed(engine, dir, relative_path, 0, NULL, out);
}

ckptio_status ckptio__dcp_file(ckptio_dcp *h, size_t index, ckptio_file **file, uint64_t *size) {
    /* A directory of many data files keeps a bounded number open: every
     * window's worth of files handed out, the others' descriptors go (a
     * later read reopens them: ckptio__file_acquire). Nothing is in flight
     * between two reads of the handle. */
    if (h->file_window && ++h->handed_out > h->file_window) {
        for (size_t i = 0; i < h->nfiles; i++)
            if (i != index && h->handles[i]) ckptio__file_release(h->handles[i]);
        h->handed_out = 0;
    }
    if (!h->handles[index]) {
        ckptio_file *f = NULL;
        uint64_t listed_size = 0;
        const char *etag = NULL; /* from the prefix's listing: no HEAD */
        ckptio__dcp_listing_get(h->listing, h->files[index], &listed_size, &etag);
        ckptio_status st = ckptio_dcp_file_open_listed(h->engine, h->dir, h->files[index], listed_size, etag, &f);
        if (st != CKPTIO_OK) return st;
        if ((st = ckptio_file_size(f, &h->file_sizes[index])) != CKPTIO_OK) {
            ckptio_file_close(f);
            return st;
        }
        h->handles[index] = f;
    }
    *file = h->handles[index];
    if (size) *size = h->file_sizes[index];
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_item_bounds(ckptio_dcp *h, const ckptio_dcp_stored *s, const char *fqn,
                                      ckptio_file **file) {
    uint64_t size = 0;
    CKPTIO_FORWARD(ckptio__dcp_file(h, ckptio__dcp_file_index(h, s->file), file, &size));
    if (s->offset > size || s->length > size - s->offset)
        return CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED,
                               &((ckptio__err_ctx){.operation = "read DCP item", .path = ckptio_file_path(*file),
                                                   .file_offset = (int64_t)s->offset, .subject = fqn}),
                               "item of %llu bytes runs past the end of the file (%llu bytes)",
                               (unsigned long long)s->length, (unsigned long long)size);
    return CKPTIO_OK;
}

/* Below this a plan's setup costs more than it saves. */
#define DIRECT_IO_MAX ((uint64_t)8 << 20)

ckptio_status ckptio__dcp_io(ckptio_file *file, ckptio_direction dir, void *buf, uint64_t len, uint64_t offset) {
    if (len == 0) return CKPTIO_OK;
    if (len < DIRECT_IO_MAX) return ckptio__file_io(file, dir, buf, len, offset);
    const ckptio_extent x = {.file = file, .file_offset = offset, .length = len, .memory = buf,
                             .mem_kind = CKPTIO_MEM_HOST};
    return ckptio_engine_execute_extents(ckptio__file_engine(file), dir, &x, 1);
}

/* ---- accessors ----------------------------------------------------------------------------- */

#define CHECK_HANDLE(h, o) \
    CKPTIO_RETURN_IF(!(h) || !(o), CKPTIO_E_INVAL, "%s: handle and output are required", __func__)

ckptio_status ckptio_dcp_tensor_count(const ckptio_dcp *h, size_t *out) {
    CHECK_HANDLE(h, out);
    *out = h->ntensors;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_bytes_count(const ckptio_dcp *h, size_t *out) {
    CHECK_HANDLE(h, out);
    *out = h->nbytes_items;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_file_count(const ckptio_dcp *h, size_t *out) {
    CHECK_HANDLE(h, out);
    *out = h->nfiles;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_tensor(const ckptio_dcp *h, size_t index, ckptio_dcp_tensor_info *out) {
    CHECK_HANDLE(h, out);
    CKPTIO_RETURN_IF(index >= h->ntensors, CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)", index,
                     h->ntensors);
    const ckptio__dcp_tensor *t = &h->tensors[index];
    *out = (ckptio_dcp_tensor_info){.fqn = t->fqn, .dtype = t->dtype, .ndim = t->ndim, .shape = t->shape,
                                    .nbytes = t->nbytes, .chunks = t->nchunks};
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_chunk(const ckptio_dcp *h, size_t tensor, size_t chunk, ckptio_dcp_chunk_info *out) {
    CHECK_HANDLE(h, out);
    CKPTIO_RETURN_IF(tensor >= h->ntensors, CKPTIO_E_RANGE, "tensor index %zu out of range (%zu tensors)", tensor,
                     h->ntensors);
    const ckptio__dcp_tensor *t = &h->tensors[tensor];
    CKPTIO_RETURN_IF(chunk >= t->nchunks, CKPTIO_E_RANGE, "chunk %zu out of range: tensor '%s' has %zu", chunk,
                     t->fqn, t->nchunks);
    *out = (ckptio_dcp_chunk_info){.offsets = t->offsets + chunk * t->ndim, .sizes = t->sizes + chunk * t->ndim,
                                   .stored = t->stored[chunk]};
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_bytes(const ckptio_dcp *h, size_t index, ckptio_dcp_bytes_info *out) {
    CHECK_HANDLE(h, out);
    CKPTIO_RETURN_IF(index >= h->nbytes_items, CKPTIO_E_RANGE, "byte item %zu out of range (%zu items)", index,
                     h->nbytes_items);
    *out = (ckptio_dcp_bytes_info){.fqn = h->bytes[index].fqn, .stored = h->bytes[index].stored};
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_file(const ckptio_dcp *h, size_t index, const char **name) {
    CHECK_HANDLE(h, name);
    CKPTIO_RETURN_IF(index >= h->nfiles, CKPTIO_E_RANGE, "file index %zu out of range (%zu files)", index, h->nfiles);
    *name = h->files[index];
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_find(const ckptio_dcp *h, const char *fqn, size_t *index) {
    CHECK_HANDLE(h, index);
    CKPTIO_RETURN_IF(!fqn, CKPTIO_E_INVAL, "ckptio_dcp_find: fqn is required");
    const size_t i = ckptio__dcp_tensor_index(h, fqn);
    if (i == (size_t)-1)
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND,
                               &((ckptio__err_ctx){.path = h->dir, .file_offset = -1, .subject = fqn}),
                               "no tensor of that name in the checkpoint");
    *index = i;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_manifest(const ckptio_dcp *h, const char **name) {
    CHECK_HANDLE(h, name);
    *name = NULL;
    if (!h->manifest_name)
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = h->dir, .file_offset = -1}),
                               "no ckptio manifest for this checkpoint: its data files are not named "
                               "__{rank}_{token}_{n}.distcp with one save token (written by torch or another writer)");
    char *path = ckptio__path_join(h->dir, h->manifest_name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    struct stat sb;
    int rc, err;
    if (ckptio__s3_is_url(path)) {
        /* The GET of the object's first bytes, which the engine keeps for the
         * manifest's read that follows (ckptio__object_peek_first): there or
         * not, never anything else. */
        uint64_t got = 0, size = 0;
        ckptio__error_saved *saved = ckptio__error_save();
        const ckptio_status look = ckptio__object_peek_first(h->engine, path, NULL, 0, &got, &size);
        if (look != CKPTIO_OK && look != CKPTIO_E_NOT_FOUND) {
            ckptio__free(saved);
            ckptio__free(path);
            return look;
        }
        ckptio__error_restore(saved);
        rc = look == CKPTIO_OK ? 0 : -1;
        err = ENOENT;
        sb.st_mode = S_IFREG;
    } else {
        rc = stat(path, &sb);
        err = errno;
    }
    ckptio_status st = CKPTIO_OK;
    if (rc != 0 && err == ENOENT)
        st = CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                             "no ckptio manifest for this checkpoint (saved without checksums, or the save did not "
                             "finish)");
    else if (rc != 0)
        st = CKPTIO_FAIL_SYS(err, "stat", path, -1, "cannot check for the manifest");
    else if (!S_ISREG(sb.st_mode))
        st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                             "the manifest is not a regular file");
    ckptio__free(path);
    if (st == CKPTIO_OK) *name = h->manifest_name;
    return st;
}
