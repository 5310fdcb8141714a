/*
 * torch_internal.h - torch.save specifics shared by src/format/torch_*,
 * the unpickler and src/ckpt/torch_file*.c: storage classes, the reader's
 * and writer's handles, and the layout of a save.
 */
#ifndef CKPTIO_TORCH_INTERNAL_H
#define CKPTIO_TORCH_INTERNAL_H

#include "pickle_internal.h"
#include "zip_internal.h"

/* Legacy storage class of a dtype ("FloatStorage"), or NULL for dtypes torch
 * saves through UntypedStorage + a dtype global (_rebuild_tensor_v3). */
const char *ckptio__torch_storage_class(ckptio_dtype dtype);
/* The dtype of a legacy storage class name; false if unknown. */
bool ckptio__torch_storage_class_dtype(const char *name, ckptio_dtype *out);

/* Largest data.pkl the reader accepts (protects against huge declared sizes). */
#define CKPTIO__TORCH_MAX_PICKLE (1ull << 30)
/* Largest number of tensor paths the reader lists (shared-node blowup guard). */
#define CKPTIO__TORCH_MAX_PATHS (1ull << 22)
/* Bytes of tensor names the reader keeps at most: this plus
 * CKPTIO__TORCH_NAME_BYTES_PER_PICKLE_BYTE per byte of data.pkl. Honest names
 * repeat a key's bytes once per tensor below it; shared objects let a 100 KB
 * pickle name one dict with a 60 KB key under 20000 paths (1.2 GB). */
#define CKPTIO__TORCH_NAME_BYTES_BASE ((uint64_t)64 << 20)
#define CKPTIO__TORCH_NAME_BYTES_PER_PICKLE_BYTE 16u

typedef struct ckptio__torch_storage {
    ckptio__storage_ref *ref;     /* first reference in the pickle */
    size_t entry;                 /* zip entry holding its bytes */
    uint64_t nbytes;
} ckptio__torch_storage;

typedef struct ckptio__torch_tensor {
    char *name;
    ckptio_value *node;
} ckptio__torch_tensor;

struct ckptio_torch {
    ckptio_engine *engine;        /* NULL for ckptio_torch_parse */
    ckptio_file *file;
    bool file_borrowed;           /* an archive inside a file the caller owns (a DCP item) */
    uint64_t base;                /* file offset of the archive's first byte (0 but for DCP items) */
    uint64_t bytes_read;          /* bytes read from `file` (headers, pickle) */
    const uint8_t *memory;        /* ckptio_torch_parse: the whole file; parse_windows: its first head_len bytes */
    const uint8_t *tail;          /* parse_windows: bytes [tail_offset, file_size) */
    uint64_t head_len, tail_offset;
    char *path;                   /* for messages ("<memory>" for parse) */
    uint64_t file_size;           /* the archive's size */
    char *prefix;                 /* record prefix without the slash */
    uint64_t alignment;
    ckptio__zip_entry *entries;
    size_t nentries;
    ckptio__value_pool pool;
    ckptio_value *root;
    ckptio__torch_storage *storages;
    size_t nstorages;
    ckptio__torch_tensor *tensors;
    size_t ntensors, tensor_cap;
    uint64_t name_bytes, name_budget; /* of the tensors' names (CKPTIO__TORCH_NAME_BYTES_BASE) */
    /* An archive in object storage: the headers' small reads (tail, central
     * directory, local headers, records, pickle) served from two read-ahead
     * windows, so opening one takes a few GETs instead of one per record. */
    uint8_t *ahead[2];
    uint64_t ahead_off[2], ahead_len[2];
    unsigned ahead_next;
};

/* Records of the archive the reader looks at (index into the ids array). */
enum {
    CKPTIO__TREC_PICKLE = 0,   /* data.pkl (required) */
    CKPTIO__TREC_VERSION,      /* version or .data/version (required, 1..10) */
    CKPTIO__TREC_ALIGNMENT,    /* .storage_alignment (optional, 64 when absent) */
    CKPTIO__TREC_BYTEORDER,    /* byteorder (optional, little when absent) */
    CKPTIO__TREC_COUNT_
};

/* Longest small text record (version, byteorder, alignment) accepted. */
#define CKPTIO__TORCH_MAX_SMALL_RECORD 64u

/* Once t->entries holds the central directory: finds the common prefix,
 * refuses TorchScript archives, and sets ids[CKPTIO__TREC_*] to the entry
 * index of each record (-1 when absent). */
ckptio_status ckptio__torch_check_archive(ckptio_torch *t, ptrdiff_t ids[CKPTIO__TREC_COUNT_]);

/* Builds the reader's tables: checks the small records' texts
 * (NUL-terminated; NULL when absent), runs the pickle (whose data starts at
 * file offset pickle_offset) through the unpickler, resolves storages to
 * records (their data_offset must be known for every data/ entry) and
 * names the tensors. */
ckptio_status ckptio__torch_build(ckptio_torch *t, const uint8_t *pickle, size_t pickle_len, uint64_t pickle_offset,
                                  const char *version, const char *alignment, const char *byteorder);

/* (src/ckpt/torch_file.c) The torch.save archive stored at [offset,
 * +length) of `file` (a DCP item), opened as ckptio_torch_open opens a file:
 * only its zip records and pickle are read, through the file's engine; the
 * file stays the caller's (closing the handle leaves it open) and offsets in
 * the tables count from the archive's first byte. Messages name "<item>". */
ckptio_status ckptio__torch_open_range(ckptio_file *file, uint64_t offset, uint64_t length, ckptio_torch **out);

/* (src/ckpt/torch_file.c) An archive of `size` bytes of which only the first
 * head_len and the last tail_len bytes are in memory (a large decoded DCP
 * item, whose storage streamed past): parsed as ckptio_torch_parse parses a
 * whole one, which succeeds when every record but the storages' lies in
 * those bytes (as torch.save lays out an archive of one tensor); a record
 * outside them is CKPTIO_E_UNSUPPORTED. Storages cannot be read through the
 * handle. Both windows must outlive it. Messages name "<memory>". */
ckptio_status ckptio__torch_parse_windows(const uint8_t *head, size_t head_len, const uint8_t *tail, size_t tail_len,
                                          uint64_t size, ckptio_torch **out);

/* Bytes per element as torch counts them (float4_e2m1fn_x2: 1), 0 if torch
 * has no such dtype. */
uint64_t ckptio__torch_element_size(ckptio_dtype dtype);

/* Longest dotted tensor name, NUL included (reader and writer). */
#define CKPTIO__TORCH_MAX_NAME (1u << 16)

/* Called for each tensor of a tree, in pickle order, with its dotted name
 * (`spelled` is a Python-like path such as ['a'][0], or the dotted name
 * outside the collision check). */
typedef ckptio_status (*ckptio__torch_name_fn)(void *ctx, const char *spelled, const char *name, ckptio_value *tensor);

/* Names every tensor of the tree at `root` by its dotted path (torch_names.c)
 * and refuses what neither the reader nor the writer accepts: a name of
 * CKPTIO__TORCH_MAX_NAME bytes or more, more than CKPTIO__TORCH_MAX_PATHS
 * tensor paths, shared nodes expanding past 16x that, dict keys that are
 * tensors, bare globals or storages. `origin` and `operation` label errors. */
ckptio_status ckptio__torch_walk_names(ckptio_value *root, const char *origin, const char *operation,
                                       ckptio__torch_name_fn fn, void *ctx);

/* Refuses two tensors (n entries named by ckptio__torch_walk_names) with one
 * name that are not the same view of the same storage, naming both paths
 * (CKPTIO_E_UNSUPPORTED). O(n log n). */
ckptio_status ckptio__torch_check_unique_names(ckptio_value *root, const ckptio__torch_tensor *tensors, size_t n,
                                               const char *origin, const char *operation);

/* Frees everything the handle owns but the file (torch_read.c). */
void ckptio__torch_free_tables(ckptio_torch *t);

/* ---- writer ---------------------------------------------------------------- */

typedef struct ckptio__torch_wstorage {
    ckptio_dtype dtype;
    uint64_t nbytes;
    char *location;
    const void *data;
    ckptio_mem_kind mem_kind;
    size_t entry;                 /* zip entry in the layout, SIZE_MAX if unused */
    uint32_t crc32;
} ckptio__torch_wstorage;

struct ckptio_torch_writer {
    ckptio__value_pool pool;
    ckptio_value *root;
    ckptio__torch_wstorage *storages;
    size_t nstorages, storage_cap;
    uint64_t generation;          /* bumped by every structural change */
    /* Layout, valid while layout_generation == generation and the options match. */
    bool have_layout;
    uint64_t layout_generation;
    uint32_t layout_alignment;
    char *layout_prefix;
    ckptio__pickle_buf pickle;
    ckptio__zip_entry *entries;   /* records in write order */
    size_t nentries;
    size_t *entry_storage;        /* per entry: storage id, or SIZE_MAX for small records */
    uint8_t **entry_bytes;        /* per entry: contents of small records (NULL for storages) */
    char serialization_id[41];    /* filled by each save */
    const char *save_path;        /* labels layout errors during ckptio_torch_save, else NULL */
    uint64_t cd_offset;
    uint64_t file_size;
    /* The file as pieces in order: metadata (headers, small records,
     * descriptors, central directory) from one host buffer of meta_len
     * bytes, and storage bytes straight from the storages' memory. */
    struct ckptio__torch_piece {
        uint64_t file_offset;
        uint64_t length;
        size_t storage;           /* storage id, or SIZE_MAX for metadata */
        uint64_t meta_offset;     /* metadata: offset in the meta buffer */
    } *pieces;
    size_t npieces;
    uint64_t meta_len;
};

/* Scratch bytes the meta buffer needs after its meta_len bytes (for
 * composing one local header). */
#define CKPTIO__TORCH_META_SCRATCH (CKPTIO_ZIP_LOCAL_HEADER_SIZE + 0xFFFFu + 32u + CKPTIO_ZIP_MAX_ALIGNMENT)

/* Fills the meta buffer (w->meta_len + CKPTIO__TORCH_META_SCRATCH bytes)
 * for the current layout; each entry's crc32 must be set first. */
void ckptio__torch_writer_fill_meta(const ckptio_torch_writer *w, uint8_t *meta);

/* Resolves options: alignment and record prefix for `path` (may be NULL). */
ckptio_status ckptio__torch_options(const ckptio_torch_save_options *options, const char *path,
                                    uint32_t *alignment, char **prefix);

/* Computes the layout (pickle, records, offsets) if it is stale. */
ckptio_status ckptio__torch_writer_prepare(ckptio_torch_writer *w, uint32_t alignment, const char *prefix);

/* Both: the layout for `options` and a save to `path` (may be NULL; it
 * names layout errors and gives the record prefix). */
ckptio_status ckptio__torch_writer_prepare_for(ckptio_torch_writer *w, const ckptio_torch_save_options *options,
                                               const char *path);

#endif /* CKPTIO_TORCH_INTERNAL_H */
