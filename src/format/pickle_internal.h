/*
 * pickle_internal.h - the value tree shared by the pickle writer and the
 * restricted unpickler (docs/FORMATS.md section 2), and their entry points.
 *
 * A tree is a set of ckptio_value nodes owned by one ckptio__value_pool;
 * the public accessors (ckptio_value_*) read them. Format code only: no I/O.
 */
#ifndef CKPTIO_PICKLE_INTERNAL_H
#define CKPTIO_PICKLE_INTERNAL_H

#include "common_internal.h"

/* Kinds that never appear in a finished tree: callables and storages the
 * unpickler holds while it runs. */
enum {
    CKPTIO__VALUE_GLOBAL = 100, /* an allowlisted global; u.global */
    CKPTIO__VALUE_STORAGE,      /* a persistent storage reference; u.storage */
    CKPTIO__VALUE_STORAGE_CLASS,/* torch.<X>Storage or UntypedStorage; u.dtype */
    CKPTIO__VALUE_CLASS,        /* DCP mode: an allowlisted class; u.s.data its "module.Name" (static) */
    CKPTIO__VALUE_NUMPY_PENDING /* a numpy array or dtype awaiting its BUILD state; u.obj (pickle_numpy.c) */
};

/* Node flags. */
enum {
    CKPTIO__VFLAG_ORDERED = 1u << 0,  /* dict: OrderedDict */
    CKPTIO__VFLAG_FROZEN = 1u << 1,   /* container was put inside another: no more mutation */
    CKPTIO__VFLAG_PARAMETER = 1u << 2,/* tensor: nn.Parameter */
    CKPTIO__VFLAG_GRAD = 1u << 3,     /* tensor: requires_grad */
    CKPTIO__VFLAG_UNTYPED = 1u << 4,  /* storage class: UntypedStorage */
    CKPTIO__VFLAG_HOLDS_GLOBAL = 1u << 5, /* DCP mode: tuple holding a global or class at some depth */
    CKPTIO__VFLAG_TORCH_SIZE = 1u << 6,   /* tuple: made by torch.Size(...) */
    CKPTIO__VFLAG_UNHASHABLE = 1u << 7    /* tuple: holds a list, dict, set or array at some depth */
};

/* The allowlisted globals (docs/FORMATS.md section 2; torch/_weights_only_unpickler.py). */
typedef enum ckptio__global {
    CKPTIO__G_ORDERED_DICT,
    CKPTIO__G_CODECS_ENCODE,
    CKPTIO__G_TORCH_SIZE,
    CKPTIO__G_TORCH_DEVICE,
    CKPTIO__G_BUILTINS_SET,
    CKPTIO__G_REBUILD_TENSOR_V2,
    CKPTIO__G_REBUILD_TENSOR_V3,
    CKPTIO__G_REBUILD_PARAMETER,
    CKPTIO__G_REBUILD_PARAMETER_WITH_STATE,
    CKPTIO__G_REBUILD_FROM_TYPE_V2,
    CKPTIO__G_TORCH_TENSOR,
    CKPTIO__G_PARAMETER,
    CKPTIO__G_BUILTINS_BYTES,   /* builtins.bytes(): protocol 2 pickles b'' so (an empty array's data) */
    CKPTIO__G_NP_RECONSTRUCT,   /* numpy.core.multiarray._reconstruct (or numpy._core.) */
    CKPTIO__G_NP_NDARRAY,       /* numpy.ndarray: only as _reconstruct's first argument */
    CKPTIO__G_NP_DTYPE,         /* numpy.dtype */
    CKPTIO__G_NP_SCALAR         /* numpy.core.multiarray.scalar (or numpy._core.) */
} ckptio__global;

typedef struct ckptio__storage_ref {
    ckptio_dtype dtype;         /* element type of the storage class (U8 for UntypedStorage) */
    bool untyped;
    const char *key;            /* record name under data/ */
    const char *location;       /* "cpu", "cuda:0", ... */
    uint64_t numel;             /* elements of dtype */
    size_t index;               /* slot assigned by the torch layer */
} ckptio__storage_ref;

typedef struct ckptio__tensor_ref {
    ckptio_value *storage;      /* CKPTIO__VALUE_STORAGE node */
    ckptio_dtype dtype;
    uint32_t ndim;
    int64_t *shape;
    int64_t *stride;
    uint64_t storage_offset;    /* in elements of dtype */
    size_t index;               /* first entry in the torch handle's tensor list */
    size_t writer_storage;      /* writer: storage id */
} ckptio__tensor_ref;

struct ckptio_value {
    int kind;                   /* ckptio_value_kind or CKPTIO__VALUE_* */
    unsigned flags;
    unsigned height;            /* nesting depth below this node (0 for leaves) */
    ckptio_value *attrs;        /* dict: state set by BUILD (OrderedDict attributes) or NULL */
    union {
        bool b;
        int64_t i;
        double f;
        ckptio_dtype dtype;                     /* DTYPE, STORAGE_CLASS */
        ckptio__global global;
        struct { char *data; size_t len; } s;   /* STR, BYTES, BIGINT (LE two's complement), DEVICE */
        struct { ckptio_value **items; size_t len, cap; } seq; /* LIST/TUPLE/SET; DICT: key, value pairs */
        ckptio__storage_ref storage;
        ckptio__tensor_ref tensor;
        struct { const char *cls; ckptio_value *args, *state; } obj; /* OBJECT */
    } u;
};

/* Owner of a tree's nodes and strings. */
typedef struct ckptio__value_pool {
    ckptio_value **nodes;
    size_t count, cap;
    void **blobs;               /* strings and arrays, freed with the pool */
    size_t nblobs, blob_cap;
} ckptio__value_pool;

void ckptio__value_pool_free(ckptio__value_pool *pool);
/* A new zeroed node of `kind`, or NULL (no memory; error set). */
ckptio_value *ckptio__value_new(ckptio__value_pool *pool, int kind);
/* Copies len bytes (plus a NUL) into the pool. NULL on no memory (error set). */
char *ckptio__value_strdup(ckptio__value_pool *pool, const void *data, size_t len);
void *ckptio__value_alloc(ckptio__value_pool *pool, size_t size);
/* Appends an item to a LIST/TUPLE/SET/DICT node (for DICT: key then value). */
ckptio_status ckptio__value_push(ckptio_value *seq, ckptio_value *item);
/* Maximum nesting depth accepted by the unpickler and the writer. */
#define CKPTIO__VALUE_MAX_DEPTH 512u
/* Marks item as held by a container and updates parent's height; refuses
 * inserting into a frozen container (so no cycles can form). */
ckptio_status ckptio__value_adopt(ckptio_value *parent, ckptio_value *item);
/* True when v may be a dict key or set item (as hash(v) succeeds in Python):
 * not a list, dict, set, array, nor a tuple holding one. */
bool ckptio__value_hashable(const ckptio_value *v);
/* "list", "dict", ... of a public kind, for messages ("internal" otherwise). */
const char *ckptio__value_kind_name(int kind);

/* True when s[0..n) is UTF-8 as pickle's BINUNICODE reads it ('surrogatepass':
 * encoded surrogates pass, overlongs and code points past U+10FFFF do not).
 * The unpickler refuses other strs; the writer too. */
bool ckptio__pickle_utf8_valid(const uint8_t *s, size_t n);

/* ---- names a pickle may use (pickle_names.c) ----------------------------- */

/* The tag of an allowlisted global of a state-dict pickle; false if none. */
bool ckptio__pickle_global_tag(const char *module, const char *name, ckptio__global *tag);
/* "module.name" of a tag, for messages (static). */
const char *ckptio__pickle_global_name(ckptio__global tag);
/* Globals torch's weights_only unpickler allows that ckptio does not implement. */
bool ckptio__pickle_torch_allows(const char *module, const char *name);
/* Checks a torch.device's text ("cuda", "cuda:1") as torch.device() would
 * parse it: a known device type and an index 0..127 without leading zeros.
 * CKPTIO_E_FORMAT naming what is wrong (no context). */
ckptio_status ckptio__pickle_check_device(const char *text, size_t len);
/* Checks an attribute name BUILD sets on an OrderedDict: an ASCII identifier
 * that neither starts with "__" nor names a method of OrderedDict, so the
 * object the reader builds behaves (and pickles again) as a dict.
 * CKPTIO_E_FORMAT / CKPTIO_E_UNSUPPORTED naming it (no context). */
ckptio_status ckptio__pickle_check_attr_name(const ckptio_value *key);

/* ---- numpy values (pickle_numpy.c) ---------------------------------------- */

/* Class names of the finished numpy nodes (CKPTIO_VALUE_OBJECT), static:
 *   "numpy.dtype"   args (descr,): "<f8", ">i4", "|b1", ...
 *   "numpy.ndarray" args (dtype, shape, fortran, data): a dtype node, a tuple
 *                   of ints, a bool (data in Fortran order), bytes of
 *                   exactly prod(shape) elements
 *   "numpy.generic" args (dtype, data): a numpy scalar, data one element
 * Only bool, int, uint, float and complex dtypes are built. */
extern const char ckptio__numpy_dtype[], ckptio__numpy_ndarray[], ckptio__numpy_generic[];

/* REDUCE of a numpy tag: a pending array (_reconstruct) or dtype, or a
 * finished scalar. Errors have no context (the caller adds the offset). */
ckptio_status ckptio__numpy_reduce(ckptio__value_pool *pool, ckptio__global fn, ckptio_value *args,
                                   ckptio_value **out);
/* BUILD of a numpy node `target` with `state`: a pending dtype or array
 * becomes a finished one; anything else is refused. */
ckptio_status ckptio__numpy_build(ckptio__value_pool *pool, ckptio_value *target, ckptio_value *state);
/* True for a finished or pending numpy node. */
bool ckptio__numpy_node(const ckptio_value *v);

/* ---- pickle writer (protocol 2) ------------------------------------------ */

typedef struct ckptio__pickle_buf {
    uint8_t *data;
    size_t len, cap;
    bool failed;                /* an allocation failed (error already set) */
} ckptio__pickle_buf;

void ckptio__pickle_buf_free(ckptio__pickle_buf *b);
void ckptio__pickle_raw(ckptio__pickle_buf *b, const void *data, size_t len);
void ckptio__pickle_op(ckptio__pickle_buf *b, uint8_t op);
void ckptio__pickle_proto(ckptio__pickle_buf *b);
void ckptio__pickle_global(ckptio__pickle_buf *b, const char *module, const char *name);
void ckptio__pickle_int(ckptio__pickle_buf *b, int64_t v);
/* LONG1 of `len` bytes of little-endian two's complement. */
void ckptio__pickle_long1(ckptio__pickle_buf *b, const uint8_t *bytes, size_t len);
void ckptio__pickle_float(ckptio__pickle_buf *b, double v);
void ckptio__pickle_str(ckptio__pickle_buf *b, const char *s, size_t len);
/* bytes as torch.save writes them: _codecs.encode(latin-1 text, 'latin1'). */
void ckptio__pickle_bytes(ckptio__pickle_buf *b, const uint8_t *data, size_t len);
void ckptio__pickle_bool(ckptio__pickle_buf *b, bool v);

/* One entry of a DCP .metadata written whole: a tensor stored as one chunk
 * (its global shape in torch's terms) or a byte item, at [offset, +length)
 * of data file `file`. */
typedef struct ckptio__dcp_md_item {
    const char *fqn;
    int is_bytes;
    ckptio_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;
    const char *file;
    uint64_t offset, length;
} ckptio__dcp_md_item;

/* Appends the pickled Metadata of `items` (in order) to b, as torch's writer
 * pickles it (pickle_dcp_write.c). */
ckptio_status ckptio__dcp_metadata_pickle(const ckptio__dcp_md_item *items, size_t count, ckptio__pickle_buf *b);

/* Pickle opcodes used by the writer and the reader. */
enum {
    CKPTIO__OP_MARK = '(', CKPTIO__OP_STOP = '.', CKPTIO__OP_POP = '0', CKPTIO__OP_POP_MARK = '1',
    CKPTIO__OP_DUP = '2', CKPTIO__OP_BINFLOAT = 'G', CKPTIO__OP_BININT = 'J', CKPTIO__OP_BININT1 = 'K',
    CKPTIO__OP_BININT2 = 'M', CKPTIO__OP_NONE = 'N', CKPTIO__OP_BINPERSID = 'Q', CKPTIO__OP_REDUCE = 'R',
    CKPTIO__OP_BINUNICODE = 'X', CKPTIO__OP_EMPTY_LIST = ']', CKPTIO__OP_APPEND = 'a',
    CKPTIO__OP_BUILD = 'b', CKPTIO__OP_GLOBAL = 'c', CKPTIO__OP_APPENDS = 'e', CKPTIO__OP_BINGET = 'h',
    CKPTIO__OP_LONG_BINGET = 'j', CKPTIO__OP_BINPUT = 'q', CKPTIO__OP_LONG_BINPUT = 'r',
    CKPTIO__OP_SETITEM = 's', CKPTIO__OP_TUPLE = 't', CKPTIO__OP_SETITEMS = 'u', CKPTIO__OP_EMPTY_DICT = '}',
    CKPTIO__OP_EMPTY_TUPLE = ')', CKPTIO__OP_BINBYTES = 'B', CKPTIO__OP_SHORT_BINBYTES = 'C',
    CKPTIO__OP_PROTO = 0x80, CKPTIO__OP_NEWOBJ = 0x81, CKPTIO__OP_TUPLE1 = 0x85, CKPTIO__OP_TUPLE2 = 0x86,
    CKPTIO__OP_TUPLE3 = 0x87, CKPTIO__OP_NEWTRUE = 0x88, CKPTIO__OP_NEWFALSE = 0x89, CKPTIO__OP_LONG1 = 0x8a,
    CKPTIO__OP_LONG4 = 0x8b, CKPTIO__OP_SHORT_BINUNICODE = 0x8c, CKPTIO__OP_BINUNICODE8 = 0x8d,
    CKPTIO__OP_BINBYTES8 = 0x8e, CKPTIO__OP_EMPTY_SET = 0x8f, CKPTIO__OP_ADDITEMS = 0x90,
    CKPTIO__OP_STACK_GLOBAL = 0x93, CKPTIO__OP_MEMOIZE = 0x94, CKPTIO__OP_FRAME = 0x95
};

/* ---- restricted unpickler ------------------------------------------------- */

/* Runs the pickle in data[0..len) with the allowlist above and returns the
 * root in *root (nodes owned by pool). Storage references become
 * CKPTIO__VALUE_STORAGE nodes, tensors CKPTIO_VALUE_TENSOR nodes.
 * Errors name `origin` (the file), `record` ("m/data.pkl") and the absolute file offset
 * base_offset + position of the offending opcode: E_DISALLOWED for a global
 * or opcode outside the allowlist (naming it), E_FORMAT / E_TRUNCATED for
 * malformed streams, E_UNSUPPORTED for allowlisted but unimplemented uses. */
ckptio_status ckptio__unpickle(const uint8_t *data, size_t len, const char *origin, const char *record,
                               uint64_t base_offset, ckptio__value_pool *pool, ckptio_value **root);

/* Unpickler modes. DCP_METADATA swaps the allowlist for the classes of a DCP
 * .metadata file (ckptio__dcp_class): REDUCE/NEWOBJ of them make OBJECT
 * nodes, BUILD sets an OBJECT's state once; tensors, storages, persistent
 * ids and the torch.save callables are refused. */
enum { CKPTIO__UNPICKLE_STATE_DICT = 0, CKPTIO__UNPICKLE_DCP_METADATA = 1 };
ckptio_status ckptio__unpickle_mode(const uint8_t *data, size_t len, const char *origin, const char *record,
                                    uint64_t base_offset, int mode, ckptio__value_pool *pool, ckptio_value **root);
/* The canonical "module.Name" (static) of a class allowed in DCP metadata,
 * or NULL (pickle_dcp_classes.c). */
const char *ckptio__dcp_class(const char *module, const char *name);
/* Whether instances of that class (a canonical name) take a BUILD state:
 * the dataclasses and TensorProperties do; torch.Size, PosixPath, the
 * memory-format enum and _get_layout are made whole by their call. */
bool ckptio__dcp_class_takes_state(const char *canonical);
/* The dtype whose torch name (without "torch.") is `name` (torch_dtype.c). */
bool ckptio__dtype_from_torch_name(const char *name, ckptio_dtype *out);

#endif /* CKPTIO_PICKLE_INTERNAL_H */
