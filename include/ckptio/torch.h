/*
 * ckptio/torch.h - torch.save zip checkpoints: the pickled object tree, reading,
 * verifying, writing, and conversion to and from safetensors
 * (docs/TORCH_FORMAT.md).
 *
 * Experimental before ckptio 1.0 (docs/API.md): what is declared here may
 * change or go in any minor version. It is seen only where CKPTIO_EXPERIMENTAL
 * is defined before ckptio.h (or this header) is included. The conventions
 * are those of ckptio/core.h.
 */
#ifndef CKPTIO_TORCH_H
#define CKPTIO_TORCH_H

#include "file.h"
#include "safetensors.h"

#ifndef CKPTIO_EXPERIMENTAL
#error "ckptio/torch.h is experimental before 1.0: define CKPTIO_EXPERIMENTAL to use it (docs/API.md)"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* torch.save zip checkpoints                                               */
/* ------------------------------------------------------------------------ */
/* torch.save files (zip + pickle, docs/FORMATS.md 1-2), read and written
 * without Python. Readers accept what torch 2.x writes (any storage alignment,
 * zip64, optional records missing); the pickle runs in a restricted
 * unpickler with an allowlist of globals at least as strict as
 * torch.load(weights_only=True). Writers produce files torch.load reads with
 * weights_only=True: storages 4 KiB-aligned by default, real CRC-32s for
 * host memory. Legacy (pre-1.6, non-zip) files and TorchScript archives are
 * refused with CKPTIO_E_UNSUPPORTED. docs/TORCH_FORMAT.md has the details. */

/* ---- values: the pickled object tree -------------------------------------- */

/* A node of the object tree in data.pkl. Nodes are owned by the ckptio_torch
 * (reader) or ckptio_torch_writer (writer) that made them and live as long
 * as it does. A node may be reachable along several paths (the pickle memo
 * shares objects), never in a cycle. */
typedef struct ckptio_value ckptio_value;

typedef enum ckptio_value_kind {
    CKPTIO_VALUE_NONE = 0,
    CKPTIO_VALUE_BOOL,
    CKPTIO_VALUE_INT,     /* fits int64 */
    CKPTIO_VALUE_BIGINT,  /* larger: little-endian two's complement bytes */
    CKPTIO_VALUE_FLOAT,
    CKPTIO_VALUE_STR,     /* UTF-8 */
    CKPTIO_VALUE_BYTES,
    CKPTIO_VALUE_LIST,
    CKPTIO_VALUE_TUPLE,   /* also torch.Size (ckptio_value_tuple_is_size) */
    CKPTIO_VALUE_DICT,    /* dict or collections.OrderedDict (ckptio_value_dict_ordered) */
    CKPTIO_VALUE_SET,
    CKPTIO_VALUE_TENSOR,  /* a tensor (or nn.Parameter); see ckptio_value_tensor */
    CKPTIO_VALUE_DTYPE,   /* a torch.dtype, e.g. torch.float32 */
    CKPTIO_VALUE_DEVICE,  /* a torch.device; its text ("cuda:0") via ckptio_value_str */
    CKPTIO_VALUE_OBJECT   /* an instance of an allowlisted class; see ckptio_value_object
                           * (ckptio/dcp.h): a DCP .metadata class, or in a torch.save
                           * tree a numpy value ("numpy.ndarray", "numpy.generic", "numpy.dtype") */
} ckptio_value_kind;

/*! ckptio_value_kind_of() : @return the node's kind (NONE for NULL). */
CKPTIO_API ckptio_value_kind ckptio_value_kind_of(const ckptio_value *value);

/*! ckptio_value_bool() / _int() / _float() : scalar contents. Each fails
 * with CKPTIO_E_INVAL for a node of another kind; _int() gives
 * CKPTIO_E_RANGE for a BIGINT. */
CKPTIO_API ckptio_status ckptio_value_bool(const ckptio_value *value, int *out);
CKPTIO_API ckptio_status ckptio_value_int(const ckptio_value *value, int64_t *out);
CKPTIO_API ckptio_status ckptio_value_float(const ckptio_value *value, double *out);

/*! ckptio_value_bytes() : the bytes of a STR (UTF-8, NUL-terminated too),
 * BYTES, BIGINT (little-endian two's complement, as pickle's LONG1) or
 * DEVICE ("cuda:0") node; for a DTYPE node, its torch name ("float32"). */
CKPTIO_API ckptio_status ckptio_value_bytes(const ckptio_value *value, const char **data, size_t *len);

/*! ckptio_value_len() : items of a LIST, TUPLE, SET or DICT (pairs). */
CKPTIO_API ckptio_status ckptio_value_len(const ckptio_value *value, size_t *out);

/*! ckptio_value_item() : item `index` of a LIST, TUPLE or SET. */
CKPTIO_API ckptio_status ckptio_value_item(const ckptio_value *value, size_t index, const ckptio_value **out);

/*! ckptio_value_dict_item() : pair `index` of a DICT, in insertion order. */
CKPTIO_API ckptio_status ckptio_value_dict_item(const ckptio_value *value, size_t index, const ckptio_value **key,
                                                const ckptio_value **item);

/*! ckptio_value_dict_ordered() : *out = 1 for a collections.OrderedDict. */
CKPTIO_API ckptio_status ckptio_value_dict_ordered(const ckptio_value *value, int *out);

/*! ckptio_value_tuple_is_size() : *out = 1 for a TUPLE pickled as a
 * torch.Size (its items are ints). */
CKPTIO_API ckptio_status ckptio_value_tuple_is_size(const ckptio_value *value, int *out);

/*! ckptio_value_dict_attrs() : attributes pickled with a dict (BUILD state:
 * a DICT such as {'_metadata': ...} of a module state_dict), or *out = NULL. */
CKPTIO_API ckptio_status ckptio_value_dict_attrs(const ckptio_value *value, const ckptio_value **out);

/*! ckptio_value_dtype() : the dtype of a DTYPE or TENSOR node. */
CKPTIO_API ckptio_status ckptio_value_dtype(const ckptio_value *value, ckptio_dtype *out);

/*! ckptio_value_tensor() : for a TENSOR node of a reader, the index of its
 * (first) entry in ckptio_torch_tensor(). */
CKPTIO_API ckptio_status ckptio_value_tensor(const ckptio_value *value, size_t *index);

/* ---- reading ---------------------------------------------------------------- */

typedef struct ckptio_torch ckptio_torch;

/* A tensor in a torch.save file: a view (offset, shape, stride in elements)
 * of one storage. Views and tensors sharing a storage name the same
 * storage index. */
typedef struct ckptio_torch_tensor_info {
    const char *name;         /* dotted path in the object tree ("layer.0.weight");
                               * dict keys as text, list/tuple positions as numbers */
    ckptio_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;     /* ndim entries */
    const int64_t *stride;    /* ndim entries, in elements */
    uint64_t storage_offset;  /* in elements */
    size_t storage;           /* index for ckptio_torch_storage() */
    int requires_grad;
    int is_parameter;         /* saved as torch.nn.Parameter */
    int is_contiguous;        /* C-contiguous: its bytes are one range of the file */
    uint64_t file_offset;     /* file offset of element [0,...,0] */
    uint64_t nbytes;          /* numel x element size */
    const ckptio_value *value;/* its node in the object tree */
} ckptio_torch_tensor_info;

/* A storage: one data/<key> record of raw bytes. */
typedef struct ckptio_torch_storage_info {
    const char *key;          /* "0", "1", ... */
    const char *location;     /* device it was saved from: "cpu", "cuda:0", ... */
    ckptio_dtype dtype;       /* storage class element type (U8 for UntypedStorage) */
    uint64_t nbytes;
    uint64_t file_offset;     /* first byte of the record's data */
    uint32_t crc32;           /* from the central directory (0: not computed by the writer) */
} ckptio_torch_storage_info;

/*! ckptio_torch_open() :
 * Opens a torch.save file: parses the zip directory and runs data.pkl
 * through the restricted unpickler. Globals outside the allowlist fail with
 * CKPTIO_E_DISALLOWED naming the global. Zip records that overlap each other
 * or the central directory are CKPTIO_E_FORMAT. Tensors are named by their
 * dotted path; two different tensors with one name ({'a.b': x, 'a': {'b': y}},
 * {1: x, '1': y}) are CKPTIO_E_UNSUPPORTED naming both paths (the writer
 * refuses such trees too). The engine is used for later reads and must
 * outlive the handle. */
CKPTIO_API ckptio_status ckptio_torch_open(ckptio_engine *engine, const char *path, ckptio_torch **out);

/*! ckptio_torch_parse() :
 * The same from a whole file held in memory (bytes, len). The handle lists
 * tensors and values; ckptio_torch_read() on it copies from that memory,
 * which must outlive the handle. */
CKPTIO_API ckptio_status ckptio_torch_parse(const void *bytes, size_t len, ckptio_torch **out);

/*! ckptio_torch_close() : accepts NULL. */
CKPTIO_API ckptio_status ckptio_torch_close(ckptio_torch *t);

/*! ckptio_torch_root() : the unpickled object (usually a DICT). */
CKPTIO_API ckptio_status ckptio_torch_root(const ckptio_torch *t, const ckptio_value **out);

/*! ckptio_torch_count() : number of tensors, one per path in the tree (a
 * tensor object reachable along two paths is listed twice). */
CKPTIO_API ckptio_status ckptio_torch_count(const ckptio_torch *t, size_t *out);

/*! ckptio_torch_tensor() : tensor `index`, in pickle order. Pointers live as
 * long as the handle. */
CKPTIO_API ckptio_status ckptio_torch_tensor(const ckptio_torch *t, size_t index, ckptio_torch_tensor_info *out);

/*! ckptio_torch_find() : index of the tensor named `name`, or CKPTIO_E_NOT_FOUND. */
CKPTIO_API ckptio_status ckptio_torch_find(const ckptio_torch *t, const char *name, size_t *index);

/*! ckptio_torch_storage_count() / ckptio_torch_storage() : the storages. */
CKPTIO_API ckptio_status ckptio_torch_storage_count(const ckptio_torch *t, size_t *out);
CKPTIO_API ckptio_status ckptio_torch_storage(const ckptio_torch *t, size_t index, ckptio_torch_storage_info *out);

/*! ckptio_torch_alignment() : the .storage_alignment record (64 when absent). */
CKPTIO_API ckptio_status ckptio_torch_alignment(const ckptio_torch *t, uint64_t *out);

/*! ckptio_torch_read_storages() :
 * Reads whole storages into caller memory (host or GPU), all in one engine
 * plan. targets[i].index is a storage index; capacity must be at least the
 * storage's nbytes (else CKPTIO_E_RANGE naming the storage). */
CKPTIO_API ckptio_status ckptio_torch_read_storages(ckptio_torch *t, const ckptio_tensor_target *targets,
                                                    size_t count);

/*! ckptio_torch_read() :
 * Reads tensors (targets[i].index is a tensor index) into caller memory, in
 * C order. Contiguous tensors go straight from the file (one engine plan);
 * a non-contiguous view is gathered from its storage through host memory
 * and needs a host target (CKPTIO_E_UNSUPPORTED for a GPU target). */
CKPTIO_API ckptio_status ckptio_torch_read(ckptio_torch *t, const ckptio_tensor_target *targets, size_t count);

/*! ckptio_torch_map() :
 * Maps the torch.save file of `t` (a storage is at data + its offset), as
 * ckptio_model_map() does. Handles made by ckptio_torch_parse() or for an
 * archive inside another file have none: CKPTIO_E_INVAL. */
CKPTIO_API ckptio_status ckptio_torch_map(ckptio_torch *t, ckptio_mapping **out);

/* What ckptio_torch_verify() found. */
typedef struct ckptio_torch_verify_report {
    size_t records;           /* zip records checked */
    size_t crc_checked;       /* records whose CRC-32 matched */
    size_t crc_absent;        /* records saved without a CRC (crc32 0, torch compute_crc32=False) */
    uint64_t bytes;           /* data bytes read */
} ckptio_torch_verify_report;

/*! ckptio_torch_verify() :
 * Reads every record and checks its CRC-32 against the central directory,
 * and the structure (records referenced by the pickle exist, views lie
 * inside their storages; checked at open). A mismatch is CKPTIO_E_CHECKSUM
 * naming the record. report may be NULL. */
CKPTIO_API ckptio_status ckptio_torch_verify(ckptio_torch *t, ckptio_torch_verify_report *report);

/* ---- writing ---------------------------------------------------------------- */

/* A writer holds the object tree to save, its storages (where their bytes
 * live) and, once computed, the file layout. The layout is reused by every
 * later save while the structure stays the same: between saves only rebind
 * storage memory (ckptio_torch_writer_bind). Any structural change (new
 * values, items, storages, root, other options) is tracked, and the next save
 * recomputes the layout, so a stale layout is never written. */
typedef struct ckptio_torch_writer ckptio_torch_writer;

enum ckptio_torch_save_flags {
    /* Write CRC-32 0 instead of computing it (torch's compute_crc32=False). */
    CKPTIO_TORCH_SAVE_NO_CRC = 1u << 0,
    /* Write the records in place instead of a temporary + rename. */
    CKPTIO_TORCH_SAVE_IN_PLACE = 1u << 1
};

typedef struct ckptio_torch_save_options {
    uint32_t storage_alignment;  /* 1..65536; 0 = 4096 (torch's own default is 64) */
    const char *record_prefix;   /* NULL = like torch.save: the file name without its last
                                  * extension ("m.pt" -> "m"), "archive" if that is empty */
    unsigned flags;              /* ckptio_torch_save_flags */
} ckptio_torch_save_options;

/* A tensor to add: a view of a storage of the writer. */
typedef struct ckptio_torch_tensor_spec {
    size_t storage;              /* from ckptio_torch_writer_storage() */
    ckptio_dtype dtype;          /* must equal the storage's unless the storage is untyped (U8) */
    uint32_t ndim;
    const int64_t *shape;
    const int64_t *stride;       /* NULL = C-contiguous; in elements, non-negative */
    uint64_t storage_offset;     /* in elements */
    int requires_grad;
    int is_parameter;            /* save as torch.nn.Parameter */
} ckptio_torch_tensor_spec;

/*! ckptio_torch_writer_create() / _destroy() : an empty writer (root None). */
CKPTIO_API ckptio_status ckptio_torch_writer_create(ckptio_torch_writer **out);
CKPTIO_API ckptio_status ckptio_torch_writer_destroy(ckptio_torch_writer *w);

/*! ckptio_torch_writer_storage() :
 * Declares a storage of `nbytes` bytes holding elements of `dtype`, saved
 * with location `location` (NULL = "cpu"), with its memory at `data` (may be
 * NULL until ckptio_torch_writer_bind). Tensors of dtypes that torch saves
 * through UntypedStorage (float8, uint16/32/64, complex32, ...) use a U8
 * storage or one of their own dtype. *id receives the storage's id. */
CKPTIO_API ckptio_status ckptio_torch_writer_storage(ckptio_torch_writer *w, ckptio_dtype dtype, uint64_t nbytes,
                                                     const char *location, const void *data,
                                                     ckptio_mem_kind mem_kind, size_t *id);

/*! ckptio_torch_writer_bind() : points storage `id` at new memory (same size)
 * for the next save, keeping the layout. */
CKPTIO_API ckptio_status ckptio_torch_writer_bind(ckptio_torch_writer *w, size_t id, const void *data,
                                                  ckptio_mem_kind mem_kind);

/*! ckptio_torch_writer_tensor() : a tensor node; the view must lie inside
 * its storage (CKPTIO_E_RANGE otherwise). */
CKPTIO_API ckptio_status ckptio_torch_writer_tensor(ckptio_torch_writer *w, const ckptio_torch_tensor_spec *spec,
                                                    ckptio_value **out);

/*! Scalar nodes. Strings are copied; str must be UTF-8. */
CKPTIO_API ckptio_status ckptio_torch_writer_none(ckptio_torch_writer *w, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_bool(ckptio_torch_writer *w, int v, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_int(ckptio_torch_writer *w, int64_t v, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_bigint(ckptio_torch_writer *w, const void *le_twos_complement,
                                                    size_t len, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_float(ckptio_torch_writer *w, double v, ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_str(ckptio_torch_writer *w, const char *s, size_t len,
                                                 ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_bytes(ckptio_torch_writer *w, const void *data, size_t len,
                                                   ckptio_value **out);
CKPTIO_API ckptio_status ckptio_torch_writer_dtype(ckptio_torch_writer *w, ckptio_dtype dtype, ckptio_value **out);

/*! ckptio_torch_writer_container() : an empty LIST, TUPLE, SET or DICT
 * (ordered != 0: collections.OrderedDict, as module state_dicts are). */
CKPTIO_API ckptio_status ckptio_torch_writer_container(ckptio_torch_writer *w, ckptio_value_kind kind, int ordered,
                                                       ckptio_value **out);

/*! ckptio_torch_writer_append() : adds item to a LIST, TUPLE or SET. */
CKPTIO_API ckptio_status ckptio_torch_writer_append(ckptio_torch_writer *w, ckptio_value *seq, ckptio_value *item);

/*! ckptio_torch_writer_set_item() : adds key -> item to a DICT (keys are not
 * checked for duplicates: the last one wins in Python). */
CKPTIO_API ckptio_status ckptio_torch_writer_set_item(ckptio_torch_writer *w, ckptio_value *dict,
                                                      ckptio_value *key, ckptio_value *item);

/*! ckptio_torch_writer_set_root() : the object torch.load will return. */
CKPTIO_API ckptio_status ckptio_torch_writer_set_root(ckptio_torch_writer *w, ckptio_value *root);

/*! ckptio_torch_writer_layout() :
 * Computes (or reuses) the layout for `options` (NULL = defaults): the
 * pickle, record order and offsets. *file_size may be NULL. */
CKPTIO_API ckptio_status ckptio_torch_writer_layout(ckptio_torch_writer *w, const ckptio_torch_save_options *options,
                                                    uint64_t *file_size);

/*! ckptio_torch_writer_storage_offset() : after a layout, the file offset of
 * storage `id`'s bytes and its record key ("0", "1", ..., owned by the
 * writer); CKPTIO_E_NOT_FOUND for a storage no tensor uses (not saved). */
CKPTIO_API ckptio_status ckptio_torch_writer_storage_offset(const ckptio_torch_writer *w, size_t id,
                                                            uint64_t *offset, const char **key);

/*! ckptio_torch_save() :
 * Writes the writer's tree to `path` (atomically unless IN_PLACE): the
 * storages' bytes go straight from their memory (host or GPU) through the
 * engine. The CRC-32 of every storage (unless CKPTIO_TORCH_SAVE_NO_CRC) is
 * computed from its bytes as they pass through host memory on their way to
 * the file: the caller's memory for host storages, the pinned staging copy
 * for GPU storages (no second read of the device). On failure no file
 * exists under `path` and an older one is kept. */
CKPTIO_API ckptio_status ckptio_torch_save(ckptio_engine *engine, const char *path, ckptio_torch_writer *w,
                                           const ckptio_torch_save_options *options);

/*! ckptio_torch_save_tensors() :
 * Convenience: saves a flat OrderedDict name -> tensor (each tensor its own
 * storage, C-contiguous), like torch.save(dict_of_tensors). */
CKPTIO_API ckptio_status ckptio_torch_save_tensors(ckptio_engine *engine, const char *path,
                                                   const ckptio_tensor_source *tensors, size_t count,
                                                   const ckptio_torch_save_options *options);

/* ------------------------------------------------------------------------ */
/* Conversion between torch.save and safetensors                            */
/* ------------------------------------------------------------------------ */

/*! ckptio_torch_save_safetensors() :
 * Writes tensors of an open torch.save file (ckptio_torch_open) as a new
 * safetensors file at `path`, atomically: the file ckptio_safetensors_save
 * would write for them (names are the dotted paths; F4 shapes counted in
 * values; `metadata` and `flags` (CKPTIO_SAFETENSORS_ALIGN_8) as there).
 * `tensors` lists tensor indices (NULL: all, `count` ignored). Each tensor
 * is read through the handle's engine (strided views gathered) into one
 * buffer of the largest tensor's size and written before the next is read;
 * a view reaching more bytes than its storage holds (strides of 0, torch's
 * expand) is written in runs from its storage through an 8 MiB buffer
 * instead, so the buffer never exceeds what the file holds. Memory stays
 * bounded and the input is never memory-mapped, so an input
 * that shrinks meanwhile fails with CKPTIO_E_TRUNCATED naming it (never a
 * SIGBUS). On any failure nothing appears under `path` and an older file
 * there is kept. Views that share a storage are written as copies. */
CKPTIO_API ckptio_status ckptio_torch_save_safetensors(ckptio_torch *t, const char *path, const size_t *tensors,
                                                       size_t count, const ckptio_kv *metadata,
                                                       size_t metadata_count, unsigned flags);

/*! ckptio_safetensors_save_torch() :
 * Writes every tensor of an open safetensors file (ckptio_safetensors_open)
 * as a torch.save file at `path`, atomically: the file
 * ckptio_torch_save_tensors would write (a flat OrderedDict, one storage per
 * tensor; `options` as there). Tensors are read one at a time through the
 * handle's engine into one buffer of the largest tensor's size, CRC-32s
 * computed from it; the same guarantees as ckptio_torch_save_safetensors.
 * The __metadata__ is not carried (torch.save files have none). */
CKPTIO_API ckptio_status ckptio_safetensors_save_torch(ckptio_safetensors *st, const char *path,
                                                       const ckptio_torch_save_options *options);

#ifdef __cplusplus
}
#endif

#endif /* CKPTIO_TORCH_H */
