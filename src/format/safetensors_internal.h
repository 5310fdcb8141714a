/*
 * safetensors_internal.h - the safetensors format layer: header parsing and
 * validation (safetensors_header.c), text helpers (safetensors_text.c) and
 * the writer's layout (safetensors_layout.c). No I/O happens here; src/ckpt/
 * safetensors_file.c joins this code with the engine.
 *
 * Rules and layout: docs/SAFETENSORS.md and docs/FORMATS.md section 3; the
 * reference is huggingface/safetensors safetensors/src/tensor.rs.
 */
#ifndef CKPTIO_SAFETENSORS_INTERNAL_H
#define CKPTIO_SAFETENSORS_INTERNAL_H

#include "common_internal.h"

/* Largest header (JSON) length readers accept: safetensors' MAX_HEADER_SIZE. */
#define CKPTIO__ST_MAX_HEADER 100000000u

/* Deepest JSON nesting accepted. serde_json (the reference parser) refuses
 * 128 levels ("recursion limit exceeded"); 127 pass. */
#define CKPTIO__ST_MAX_DEPTH 127

/* Most JSON values (counted as commas plus containers) a header may hold.
 * jansson spends about 24 bytes of memory per header byte on a header of
 * small numbers (docs/SAFETENSORS.md#reading-rules-enforced); this bounds
 * that at about 1 GB, while real files stay far below it (100,000 tensors are about
 * 1.2 million values). The reference has no such limit: ckptio is stricter. */
#define CKPTIO__ST_MAX_VALUES (1u << 24)

/* Bytes before the JSON: the little-endian u64 header length. */
#define CKPTIO__ST_PREFIX 8u

/* A parsed file. Created by ckptio_safetensors_parse() (no file) or
 * ckptio_safetensors_open() (file and engine set). Everything below is
 * owned by the handle; strings and shapes live in one arena. */
struct ckptio_safetensors {
    char *path;                   /* as given to open; NULL for parse() handles */
    ckptio_engine *engine;        /* NULL for parse() handles */
    ckptio_file *file;            /* NULL for parse() handles */
    uint64_t file_size;
    uint64_t header_len;          /* N, the JSON length including padding */
    uint64_t data_offset;         /* 8 + N */
    uint64_t data_size;           /* end of the last tensor (0 when none) */
    size_t count;
    ckptio_tensor_info *tensors;  /* file offset order */
    size_t *by_name;              /* tensor indices sorted by strcmp of names */
    size_t metadata_count;
    ckptio_kv *metadata;          /* __metadata__ pairs, in file order */
    bool has_metadata;            /* __metadata__ is an object (possibly empty), not absent or null */
    char *arena;                  /* names, metadata strings and shapes */
};

/* Records a failure whose message reads "PATH: at offset OFF: KIND 'NAME':
 * text" (each part left out when NULL or -1), e.g. "m.safetensors: tensor
 * 'w': ...". Returns `status`. */
ckptio_status ckptio__st_fail(ckptio_status status, const char *src_file, int line, const char *path, int64_t offset,
                              const char *kind, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 8, 9)));
#define CKPTIO__ST_FAIL(status, path, offset, kind, name, ...) \
    ckptio__st_fail((status), __FILE__, __LINE__, (path), (offset), (kind), (name), __VA_ARGS__)

/* Checks the 8-byte prefix against the file size: file >= 8 bytes, header
 * length N <= CKPTIO__ST_MAX_HEADER, 8 + N within the file. `path` (may be
 * NULL) only labels errors. On success *header_len = N. */
ckptio_status ckptio__st_check_prefix(const unsigned char prefix[8], uint64_t file_size, const char *path,
                                      uint64_t *header_len);

/* The safetensors rule of ckptio_format_detect_bytes (include/ckptio/file.h) on
 * the first `len` bytes of a file of `file_size` bytes: the prefix is within
 * the limits of ckptio__st_check_prefix, N >= 2, and the header's first
 * non-blank byte is '{' (YES) or something else (NO); MORE when `head` ends
 * inside a header that is blank so far. Reads only head[0..len). */
typedef enum ckptio__st_probe_result {
    CKPTIO__ST_PROBE_NO,
    CKPTIO__ST_PROBE_YES,
    CKPTIO__ST_PROBE_MORE
} ckptio__st_probe_result;
ckptio__st_probe_result ckptio__st_probe(const unsigned char *head, size_t len, uint64_t file_size);

/* Parses and validates the JSON header `json` (`st->header_len` bytes) of a
 * file of `st->file_size` bytes and fills the tensor and metadata tables of
 * `st` (which must be zeroed apart from path/engine/file/file_size/
 * header_len/data_offset). Every rule of docs/FORMATS.md section 3 is checked;
 * errors are CKPTIO_E_FORMAT (or CKPTIO_E_TRUNCATED when the data section
 * runs past the end of the file) and name the file, tensor and rule.
 * On failure the partly filled tables are left for ckptio__st_destroy(). */
ckptio_status ckptio__st_index(ckptio_safetensors *st, const char *json);

/* Parses and validates like ckptio__st_index; `fast` tries the one-pass
 * parser of the writers' form first (safetensors_fast.c), else jansson
 * reads every header. The answer is the same either way (the fuzz target
 * compares them). */
ckptio_status ckptio__st_index_with(ckptio_safetensors *st, const char *json, bool fast);

/* One tensor entry of a header between parsing and the final tables. */
typedef struct ckptio__st_entry {
    const char *name;      /* NUL-terminated; owned by the parser that made it */
    size_t name_len;
    ckptio_dtype dtype;
    uint32_t ndim;
    size_t dims;           /* index of its first dimension in the parse's dims */
    uint64_t begin, end;   /* data_offsets */
    size_t json_index;     /* position in the header: entries with equal offsets keep it */
} ckptio__st_entry;

/* One __metadata__ pair, NUL-terminated strings owned by the parser. */
typedef struct ckptio__st_meta {
    const char *key, *value;
    size_t key_len, value_len;
} ckptio__st_meta;

/* What a parser found in a header, before validation of the layout. */
typedef struct ckptio__st_parsed {
    ckptio__st_entry *entries; /* header order */
    size_t count;
    int64_t *dims;             /* every entry's shape, back to back */
    size_t ndims;
    ckptio__st_meta *meta;     /* header order */
    size_t nmeta;
    bool has_metadata;         /* __metadata__ is an object (maybe empty) */
    char *text;                /* the fast parser's copies of the strings */
    size_t text_len;
    bool out_of_memory;        /* the fast parser ran out of memory */
} ckptio__st_parsed;

typedef enum ckptio__st_fast {
    CKPTIO__ST_FAST_PARSED,    /* *out is filled */
    CKPTIO__ST_FAST_NOT_MINE,  /* another form: the full parser reads it */
    CKPTIO__ST_FAST_NO_MEMORY  /* CKPTIO_E_NOMEM recorded */
} ckptio__st_fast;

/* The one-pass parser (safetensors_fast.c): PARSED with *out filled when the
 * header is in the writers' form (plain strings, the three known fields,
 * decimal integers below 10^18, metadata of strings with distinct keys);
 * NOT_MINE, with nothing left to free, for every other header, which the
 * full parser then reads. Tensor names may still repeat: the caller checks. */
ckptio__st_fast ckptio__st_parse_fast(const char *json, size_t len, ckptio__st_parsed *out);

/* Frees what ckptio__st_parse_fast allocated; zeroes *p. */
void ckptio__st_parsed_cleanup(ckptio__st_parsed *p);

/* Pre-scan of the raw JSON text for what jansson accepts but the reference
 * parser refuses: nesting deeper than CKPTIO__ST_MAX_DEPTH, and the number
 * -0 (serde_json reads it as a float); and for more than
 * CKPTIO__ST_MAX_VALUES values. Returns CKPTIO_E_FORMAT naming the byte
 * offset (relative to the file) of the first problem. */
ckptio_status ckptio__st_scan(const char *json, size_t len, const char *path);

/* Frees the tables and the handle itself (not the file: the caller closes
 * it first). Accepts NULL. */
void ckptio__st_destroy(ckptio_safetensors *st);

/* The writer's layout: the reference order, offsets and header bytes. */
typedef struct ckptio__st_layout {
    size_t count;
    size_t *order;            /* order[i]: index into the sources of the i-th tensor in the file */
    uint64_t *offsets;        /* offsets[j]: begin of source j, relative to the data section */
    unsigned char *header;    /* header_size bytes: u64 LE N, JSON, space padding */
    uint64_t header_size;     /* 8 + N: where the data section starts */
    uint64_t data_size;       /* sum of all nbytes */
} ckptio__st_layout;

/* Validates the sources and metadata (names unique, non-empty, not
 * "__metadata__", valid UTF-8 without NUL; dtype with a safetensors name;
 * dims >= 0; nbytes == shape x dtype; data non-NULL when nbytes > 0; flags
 * known; metadata keys unique) and computes the layout: tensors sorted by
 * dtype rank descending then name (bytewise), packed back to back; JSON as
 * serde_json writes it (compact, __metadata__ first in the caller's order,
 * then tensors in offset order, each as dtype, shape, data_offsets); padded
 * with spaces so that 8 + N is a multiple of 4096, or of 8 with
 * CKPTIO_SAFETENSORS_ALIGN_8. `path` only labels errors (may be NULL).
 * *out must be released with ckptio__st_layout_cleanup(), also on failure. */
ckptio_status ckptio__st_layout_build(const ckptio_tensor_source *tensors, size_t count, const ckptio_kv *metadata,
                                      size_t metadata_count, unsigned flags, const char *path,
                                      ckptio__st_layout *out);

/* Releases what ckptio__st_layout_build() allocated; zeroes *layout. */
void ckptio__st_layout_cleanup(ckptio__st_layout *layout);

/* Looks up a safetensors dtype name ("F32"), exact and case-sensitive; torch
 * spellings are not safetensors names. `len` is the name's length (the JSON
 * string may hold a NUL). Returns false for unknown names. */
bool ckptio__st_dtype_from_name(const char *name, size_t len, ckptio_dtype *out);

/* Formats a shape as "[2, 3]" into buf (truncated with "...]" if needed). */
void ckptio__st_format_shape(char *buf, size_t cap, const int64_t *shape, size_t ndim);

#endif /* CKPTIO_SAFETENSORS_INTERNAL_H */
