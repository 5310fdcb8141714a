/*
 * test_safetensors_header.c - safetensors header parsing and validation,
 * in memory (ckptio_safetensors_parse): the golden files written by the
 * safetensors package, then one bad header per rule, each checked for its
 * status and for a message naming the tensor or field and the rule.
 */
#include "common_internal.h"
#include "data/safetensors/golden_tables.h"
#include "helpers.h"
#include "safetensors_internal.h"

#include <string.h>

/* ---- helpers ------------------------------------------------------------------ */

static const char *data_path(const char *name) {
    static char buf[1024];
    const char *dir = getenv("CKPTIO_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/safetensors/%s", dir ? dir : "tests/data", name);
    return buf;
}

/* A file image: u64 LE length of `json`, `json`, then `data_len` bytes. */
static unsigned char *image(const char *json, size_t json_len, size_t data_len, size_t *out_len) {
    const size_t total = 8 + json_len + data_len;
    unsigned char *b = calloc(1, total);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)json_len >> (8 * i));
    memcpy(b + 8, json, json_len);
    *out_len = total;
    return b;
}

static ckptio_status parse_json(const char *json, size_t data_len, ckptio_safetensors **out) {
    size_t len;
    unsigned char *b = image(json, strlen(json), data_len, &len);
    ckptio_status st = ckptio_safetensors_parse(b, len, len, out);
    free(b);
    return st;
}

/* Expects `json` followed by `data_len` bytes to be refused. */
#define BAD(json, data_len, status, fragment)                                   \
    do {                                                                        \
        ckptio_safetensors *bad_ = NULL;                                        \
        T_STATUS(parse_json((json), (data_len), &bad_), (status));              \
        T_ASSERT(bad_ == NULL);                                                 \
        T_MESSAGE_HAS(fragment);                                                \
    } while (0)

#define GOOD(json, data_len, out) T_OK(parse_json((json), (data_len), (out)))

static size_t find(const ckptio_safetensors *st, const char *name) {
    size_t i = (size_t)-1;
    T_OK(ckptio_safetensors_find(st, name, &i));
    return i;
}

/* Checks a parsed golden file against its table, including the data bytes. */
static void check_golden(const char *file, const golden_tensor *table, size_t n, const ckptio_kv *md, size_t md_n) {
    size_t len;
    unsigned char *bytes = t_read_file(data_path(file), &len);
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_parse(bytes, len, len, &st));
    size_t count, mdc;
    T_OK(ckptio_safetensors_count(st, &count));
    T_ASSERT(count == n);
    T_OK(ckptio_safetensors_metadata_count(st, &mdc));
    T_ASSERT(mdc == md_n);
    for (size_t i = 0; i < md_n; i++) {
        ckptio_kv kv;
        T_OK(ckptio_safetensors_metadata(st, i, &kv));
        T_ASSERT(strcmp(kv.key, md[i].key) == 0 && strcmp(kv.value, md[i].value) == 0);
    }
    uint64_t data_offset, data_size, prev_end = 0;
    T_OK(ckptio_safetensors_data_offset(st, &data_offset));
    T_OK(ckptio_safetensors_data_size(st, &data_size));
    T_ASSERT(data_offset + data_size == len);
    T_ASSERT(data_offset == 8 + (bytes[0] | (uint64_t)bytes[1] << 8 | (uint64_t)bytes[2] << 16));
    /* Index order is file order, back to back. */
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_tensor(st, i, &info));
        T_ASSERT(info.file_offset == data_offset + prev_end);
        prev_end += info.nbytes;
    }
    T_ASSERT(prev_end == data_size);
    for (size_t k = 0; k < n; k++) {
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_tensor(st, find(st, table[k].name), &info));
        T_ASSERT(strcmp(info.name, table[k].name) == 0);
        T_ASSERT_MSG(info.dtype == table[k].dtype, "%s: dtype %d", table[k].name, (int)info.dtype);
        T_ASSERT(info.ndim == table[k].ndim);
        for (uint32_t d = 0; d < info.ndim; d++) T_ASSERT(info.shape[d] == table[k].shape[d]);
        T_ASSERT(info.nbytes == golden_nbytes(&table[k]));
        unsigned char want[256];
        T_ASSERT(info.nbytes <= sizeof want);
        golden_fill(want, info.nbytes, k, info.dtype);
        T_ASSERT_MSG(memcmp(bytes + info.file_offset, want, info.nbytes) == 0, "data of %s", table[k].name);
    }
    T_OK(ckptio_safetensors_close(st));
    free(bytes);
}

/* ---- valid files ----------------------------------------------------------------- */

static void test_golden_numpy(void) {
    check_golden("ref_numpy.safetensors", golden_numpy, GOLDEN_COUNT(golden_numpy), golden_numpy_metadata, 1);
}

static void test_golden_torch_dtypes(void) {
    check_golden("ref_torch.safetensors", golden_torch, GOLDEN_COUNT(golden_torch), NULL, 0);
}

static void test_golden_unaligned_f6(void) {
    check_golden("unaligned_f6.safetensors", golden_f6, GOLDEN_COUNT(golden_f6), golden_f6_metadata, 2);
    size_t len;
    unsigned char *bytes = t_read_file(data_path("unaligned_f6.safetensors"), &len);
    ckptio_safetensors *st = NULL;
    uint64_t off;
    T_OK(ckptio_safetensors_parse(bytes, len, len, &st));
    T_OK(ckptio_safetensors_data_offset(st, &off));
    T_ASSERT(off == GOLDEN_F6_DATA_OFFSET && off % 8 != 0);
    ckptio_safetensors_close(st);
    free(bytes);
}

static void test_golden_empty(void) {
    size_t len, count;
    unsigned char *bytes = t_read_file(data_path("empty.safetensors"), &len);
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_parse(bytes, len, len, &st));
    T_OK(ckptio_safetensors_count(st, &count));
    T_ASSERT(count == 0 && len == 16);
    uint64_t size;
    T_OK(ckptio_safetensors_data_size(st, &size));
    T_ASSERT(size == 0);
    ckptio_safetensors_close(st);
    free(bytes);
}

/* Every dtype with a safetensors name, with its bit width. */
static void test_every_dtype(void) {
    char json[8192];
    size_t pos = 0, n = 0;
    uint64_t off = 0;
    pos += (size_t)snprintf(json + pos, sizeof json - pos, "{");
    for (int d = 0; d < CKPTIO_DTYPE_COUNT_; d++) {
        const char *name = ckptio_dtype_name((ckptio_dtype)d);
        if (!name[0]) continue;
        const uint64_t bytes = 8 * ckptio_dtype_bits((ckptio_dtype)d) / 8; /* shape [8]: whole bytes for all */
        pos += (size_t)snprintf(json + pos, sizeof json - pos,
                                "%s\"t_%s\":{\"dtype\":\"%s\",\"shape\":[8],\"data_offsets\":[%llu,%llu]}",
                                n ? "," : "", name, name, (unsigned long long)off,
                                (unsigned long long)(off + bytes));
        off += bytes;
        n++;
    }
    snprintf(json + pos, sizeof json - pos, "}");
    T_ASSERT(n == 22); /* the safetensors Dtype enum has 22 members */
    ckptio_safetensors *st = NULL;
    GOOD(json, off, &st);
    for (int d = 0; d < CKPTIO_DTYPE_COUNT_; d++) {
        const char *name = ckptio_dtype_name((ckptio_dtype)d);
        if (!name[0]) continue;
        char tname[32];
        snprintf(tname, sizeof tname, "t_%s", name);
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_tensor(st, find(st, tname), &info));
        T_ASSERT(info.dtype == (ckptio_dtype)d);
        T_ASSERT(info.nbytes == ckptio_dtype_bits((ckptio_dtype)d));
    }
    ckptio_safetensors_close(st);
    /* Torch spellings and other cases are not safetensors names. */
    BAD("{\"a\":{\"dtype\":\"float32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CKPTIO_E_FORMAT,
        "tensor 'a': unknown dtype 'float32'");
    BAD("{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CKPTIO_E_FORMAT, "unknown dtype 'f32'");
    BAD("{\"a\":{\"dtype\":\"C128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16, CKPTIO_E_FORMAT,
        "unknown dtype 'C128'");
    BAD("{\"a\":{\"dtype\":\"F32\\u0000x\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CKPTIO_E_FORMAT,
        "unknown dtype");
}

static void test_scalars_empty_and_whitespace(void) {
    ckptio_safetensors *st = NULL;
    GOOD(" \n\t\r{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
         "\"z\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[8,8]},"
         "\"z2\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]}}  \n\r\t ",
         8, &st);
    ckptio_tensor_info info;
    T_OK(ckptio_safetensors_tensor(st, find(st, "s"), &info));
    T_ASSERT(info.ndim == 0 && info.nbytes == 8);
    T_OK(ckptio_safetensors_tensor(st, find(st, "z"), &info));
    T_ASSERT(info.ndim == 2 && info.shape[0] == 0 && info.shape[1] == 5 && info.nbytes == 0);
    ckptio_safetensors_close(st);
    /* A header of padding spaces only around an empty object. */
    GOOD("{}        ", 0, &st);
    ckptio_safetensors_close(st);
}

/* Entries are indexed by offsets whatever their order in the JSON; equal
 * offsets (zero-size tensors) keep the header's order. */
static void test_offset_order(void) {
    ckptio_safetensors *st = NULL;
    GOOD("{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
         "\"z0\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"e1\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
         4, &st);
    const char *want[] = {"z0", "e1", "a", "b"};
    for (size_t i = 0; i < 4; i++) {
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_tensor(st, i, &info));
        T_ASSERT_MSG(strcmp(info.name, want[i]) == 0, "index %zu is %s", i, info.name);
    }
    ckptio_safetensors_close(st);
}

/* Unknown fields of a tensor entry are ignored, as the reference does;
 * __metadata__: null means no metadata, as the reference does. */
static void test_reference_leniencies(void) {
    ckptio_safetensors *st = NULL;
    GOOD("{\"__metadata__\":null,\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],"
         "\"extra\":{\"x\":[1,2.5,\"s\\u0000\",null,1e-0,-0.5,\"-0\"]}}}",
         2, &st);
    size_t n;
    T_OK(ckptio_safetensors_metadata_count(st, &n));
    T_ASSERT(n == 0);
    ckptio_safetensors_close(st);
    /* An empty name is legal in the reference format. */
    GOOD("{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, &st);
    T_ASSERT(find(st, "") == 0);
    ckptio_safetensors_close(st);
}

static void test_metadata_order_and_accessors(void) {
    ckptio_safetensors *st = NULL;
    GOOD("{\"__metadata__\":{\"z\":\"1\",\"a\":\"2\",\"m\":\"\\u00e9\\n\"},"
         "\"w\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
         4, &st);
    size_t n, idx;
    T_OK(ckptio_safetensors_metadata_count(st, &n));
    T_ASSERT(n == 3);
    ckptio_kv kv;
    T_OK(ckptio_safetensors_metadata(st, 0, &kv));
    T_ASSERT(strcmp(kv.key, "z") == 0 && strcmp(kv.value, "1") == 0);
    T_OK(ckptio_safetensors_metadata(st, 2, &kv));
    T_ASSERT(strcmp(kv.key, "m") == 0 && strcmp(kv.value, "\xc3\xa9\n") == 0);
    T_STATUS(ckptio_safetensors_metadata(st, 3, &kv), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("metadata index 3 out of range");
    ckptio_tensor_info info;
    T_STATUS(ckptio_safetensors_tensor(st, 1, &info), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("tensor index 1 out of range (the file has 1)");
    T_STATUS(ckptio_safetensors_find(st, "nope", &idx), CKPTIO_E_NOT_FOUND);
    T_MESSAGE_HAS("tensor 'nope': not in the file");
    T_STATUS(ckptio_safetensors_find(st, NULL, &idx), CKPTIO_E_INVAL);
    T_STATUS(ckptio_safetensors_count(NULL, &n), CKPTIO_E_INVAL);
    ckptio_safetensors_close(st);
}

/* find() over many names (binary search over a name-sorted index). */
static void test_find_many(void) {
    enum { N = 300 };
    size_t cap = N * 80 + 16, pos = 0;
    char *json = malloc(cap);
    pos += (size_t)snprintf(json + pos, cap - pos, "{");
    for (int i = 0; i < N; i++)
        pos += (size_t)snprintf(json + pos, cap - pos,
                                "%s\"n%d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                                i ? "," : "", (i * 7919) % N, i, i + 1);
    snprintf(json + pos, cap - pos, "}");
    ckptio_safetensors *st = NULL;
    GOOD(json, N, &st);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_tensor(st, find(st, name), &info));
        T_ASSERT(strcmp(info.name, name) == 0);
    }
    ckptio_safetensors_close(st);
    free(json);
}

/* ---- invalid files: one test per rule ------------------------------------------------ */

static void test_bad_sizes(void) {
    unsigned char small[5] = {1, 0, 0, 0, 0};
    ckptio_safetensors *st = NULL;
    T_STATUS(ckptio_safetensors_parse(small, 5, 5, &st), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("file is 5 bytes, shorter than the 8-byte header length");
    T_STATUS(ckptio_safetensors_parse(small, 0, 0, &st), CKPTIO_E_TRUNCATED);

    /* N above the cap is refused before anything else, whatever the size. */
    unsigned char prefix[16] = {0};
    const uint64_t over = 100000001;
    for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)(over >> (8 * i));
    T_STATUS(ckptio_safetensors_parse(prefix, 16, 300000000, &st), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("header length 100000001 exceeds the limit of 100000000 bytes");
    T_ASSERT(ckptio_last_error()->file_offset == 0);
    /* Exactly the cap passes that rule (and then lacks bytes here). */
    const uint64_t cap = 100000000;
    for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)(cap >> (8 * i));
    T_STATUS(ckptio_safetensors_parse(prefix, 16, 300000000, &st), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("buffer holds 16 bytes but the header ends at byte 100000008");
    /* A u64 length near 2^64 must not wrap. */
    memset(prefix, 0xff, 8);
    T_STATUS(ckptio_safetensors_parse(prefix, 16, 16, &st), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("exceeds the limit");

    /* 8 + N past the end of the file. */
    size_t len;
    unsigned char *b = image("{}", 2, 0, &len);
    T_STATUS(ckptio_safetensors_parse(b, len - 1, len - 1, &st), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("header length 2 runs past the end of the file (9 bytes)");
    T_STATUS(ckptio_safetensors_parse(b, len, len - 1, &st), CKPTIO_E_INVAL);
    T_STATUS(ckptio_safetensors_parse(NULL, 4, 10, &st), CKPTIO_E_INVAL);
    free(b);
    /* An empty header is not JSON. */
    BAD("", 0, CKPTIO_E_FORMAT, "header is not valid JSON");
}

static void test_bad_utf8(void) {
    BAD("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "header is not valid UTF-8");
    BAD("{\"a\xc0\xaf\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "not valid UTF-8"); /* overlong */
    BAD("{\"a\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "not valid UTF-8"); /* surrogate */
    BAD("{\"__metadata__\":{\"k\":\"\xe2\x82\"}}", 0, CKPTIO_E_FORMAT, "not valid UTF-8"); /* cut short */
    T_ASSERT(ckptio_last_error()->file_offset > 8);
    /* An escaped lone surrogate is refused too (serde_json does). */
    BAD("{\"\\ud800\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "header is not valid JSON");
}

static void test_bad_json(void) {
    BAD("{\"a\":", 0, CKPTIO_E_FORMAT, "header is not valid JSON");
    BAD("[]", 0, CKPTIO_E_FORMAT, "header is an array, expected a JSON object");
    BAD("{} x", 0, CKPTIO_E_FORMAT, "header is not valid JSON");
    BAD("\xef\xbb\xbf{}", 0, CKPTIO_E_FORMAT, "header is not valid JSON"); /* BOM */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
        "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
        2, CKPTIO_E_FORMAT, "header repeats a key (names must be unique)");
    BAD("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "NUL character");
    /* Integers beyond int64: refused (the reference allows up to 2^64-1 in
     * shapes, but only next to a zero dim; ckptio shapes are int64). */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[0,18446744073709551615],\"data_offsets\":[0,0]}}", 0, CKPTIO_E_FORMAT,
        "not valid JSON");
}

static void test_bad_depth(void) {
    /* 127 levels pass (in a field the reference ignores), 128 do not. */
    char json[1024];
    for (int depth = 127; depth <= 128; depth++) {
        size_t pos = (size_t)snprintf(json, sizeof json,
                                      "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":");
        for (int i = 0; i < depth - 2; i++) json[pos++] = '[';
        for (int i = 0; i < depth - 2; i++) json[pos++] = ']';
        memcpy(json + pos, "}}", 3);
        ckptio_safetensors *st = NULL;
        if (depth == 127) {
            GOOD(json, 1, &st);
            ckptio_safetensors_close(st);
        } else {
            BAD(json, 1, CKPTIO_E_FORMAT, "header JSON nests deeper than 127 levels");
        }
    }
}

/* A header of 2^24 + 1 small values is refused before jansson runs. */
static void test_bad_value_count(void) {
    const size_t values = (1u << 24) + 1;
    const char head[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[", tail[] = "],\"data_offsets\":[0,0]}}";
    /* "0," per value; the entry itself adds a few more values. */
    const size_t len = sizeof head - 1 + 2 * values + sizeof tail;
    char *json = malloc(len);
    memcpy(json, head, sizeof head - 1);
    char *p = json + sizeof head - 1;
    for (size_t i = 0; i < values; i++, p += 2) memcpy(p, i ? ",0" : "00", 2);
    json[sizeof head - 1] = ' '; /* first value " 0" */
    memcpy(p, tail, sizeof tail);
    BAD(json, 0, CKPTIO_E_FORMAT, "header JSON holds more than 16777216 values");
    free(json);
}

static void test_bad_metadata(void) {
    BAD("{\"__metadata__\":{\"k\":1}}", 0, CKPTIO_E_FORMAT,
        "__metadata__ key 'k': value is an integer, expected a string");
    BAD("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0, CKPTIO_E_FORMAT, "value is an object, expected a string");
    BAD("{\"__metadata__\":[\"k\"]}", 0, CKPTIO_E_FORMAT, "__metadata__: is an array, expected an object of strings");
    BAD("{\"__metadata__\":\"k\"}", 0, CKPTIO_E_FORMAT, "__metadata__: is a string");
    BAD("{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, CKPTIO_E_FORMAT, "__metadata__ key 'k': value contains a NUL");
    BAD("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, CKPTIO_E_FORMAT, "header repeats a key");
    BAD("{\"__metadata__\":{},\"__metadata__\":{}}", 0, CKPTIO_E_FORMAT, "header repeats a key");
}

static void test_bad_entry_fields(void) {
    BAD("{\"a\":5}", 0, CKPTIO_E_FORMAT, "tensor 'a': entry is an integer, expected an object");
    BAD("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT, "tensor 'a': missing field 'dtype'");
    BAD("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT, "tensor 'a': missing field 'shape'");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, CKPTIO_E_FORMAT, "tensor 'a': missing field 'data_offsets'");
    BAD("{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "tensor 'a': 'dtype' is an integer, expected a string");
    BAD("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "header repeats a key");
}

static void test_bad_shape(void) {
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,2]}}", 2, CKPTIO_E_FORMAT,
        "tensor 'a': shape[0] is -2, expected a non-negative integer");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,2.0],\"data_offsets\":[0,2]}}", 2, CKPTIO_E_FORMAT,
        "tensor 'a': shape[1] is the real number 2, expected a non-negative integer");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2e0],\"data_offsets\":[0,2]}}", 2, CKPTIO_E_FORMAT,
        "shape[0] is the real number");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[true],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT, "shape[0] is true");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[\"2\"],\"data_offsets\":[0,2]}}", 2, CKPTIO_E_FORMAT,
        "shape[0] is a string");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":null,\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "tensor 'a': 'shape' is null, expected an array");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":{},\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT, "'shape' is an object");
    /* -0 is a float to the reference parser. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, CKPTIO_E_FORMAT,
        "the number -0, which safetensors reads as a float");
    T_ASSERT(ckptio_last_error()->file_offset == 8 + 28); /* where the '-' is */
}

static void test_bad_offsets_fields(void) {
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,2]}}", 2, CKPTIO_E_FORMAT,
        "tensor 'a': 'data_offsets' has 3 elements, expected [begin, end]");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0]}}", 0, CKPTIO_E_FORMAT, "has 1 elements");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":{\"0\":0,\"1\":2}}}", 2, CKPTIO_E_FORMAT,
        "'data_offsets' is an object, expected [begin, end]");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-1,1]}}", 2, CKPTIO_E_FORMAT,
        "tensor 'a': data_offsets[0] is -1, expected a non-negative integer");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,-0]}}", 0, CKPTIO_E_FORMAT, "the number -0");
}

static void test_bad_layout(void) {
    /* The first tensor must begin at 0. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, CKPTIO_E_FORMAT,
        "tensor 'a': data_offsets [1, 3] leave a gap at the start of the data section");
    /* Gaps between tensors. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}",
        5, CKPTIO_E_FORMAT,
        "tensor 'b': data_offsets [3, 5] leave a gap of 1 bytes after tensor 'a' (which ends at 2)");
    /* Overlaps, also two tensors at the same place. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
        4, CKPTIO_E_FORMAT, "tensor 'b': data_offsets [2, 4] overlap tensor 'a' (which ends at 4)");
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
        2, CKPTIO_E_FORMAT, "overlap tensor 'a'");
    /* end < begin. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"c\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,1]}}",
        2, CKPTIO_E_FORMAT, "tensor 'c': data_offsets [2, 1] end before they begin");
    /* Element count overflow, bit count overflow. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,0],\"data_offsets\":[0,0]}}", 0, CKPTIO_E_FORMAT,
        "tensor 'a': dtype U8 shape [4294967296, 4294967296, 0] needs more than 2^64 bits");
    BAD("{\"a\":{\"dtype\":\"U64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}", 8, CKPTIO_E_FORMAT,
        "dtype U64 shape [2305843009213693952] needs more than 2^64 bits");
    /* Sub-byte dtypes must fill whole bytes. */
    BAD("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, CKPTIO_E_FORMAT,
        "tensor 'a': dtype F4 shape [3] is 12 bits, not a whole number of bytes");
    BAD("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[2,1],\"data_offsets\":[0,2]}}", 2, CKPTIO_E_FORMAT,
        "dtype F6_E2M3 shape [2, 1] is 12 bits");
    /* The bytes covered must be what dtype x shape needs. */
    BAD("{\"layers.0.w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}", 10, CKPTIO_E_FORMAT,
        "tensor 'layers.0.w': data_offsets [0, 10] cover 10 bytes but dtype F32 shape [3] needs 12");
    T_ASSERT(strcmp(ckptio_last_error()->subject, "tensor 'layers.0.w'") == 0);
    /* Many dims in a message are cut short, not overrun. */
    BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,7],\"data_offsets\":[0,4]}}", 4,
        CKPTIO_E_FORMAT, "shape [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ...] needs 28");
}

static void test_bad_data_section(void) {
    /* Trailing bytes after the last tensor. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 3, CKPTIO_E_FORMAT,
        "1 trailing bytes after the last tensor");
    BAD("{}", 1, CKPTIO_E_FORMAT, "1 trailing bytes after the last tensor");
    /* Data running past the end of the file. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
        5, CKPTIO_E_TRUNCATED, "tensor 'b': data_offsets [2, 6] end at file offset");
    T_MESSAGE_HAS("past the end of the file");
    /* Huge offsets must not wrap the end-of-data arithmetic. */
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
        "\"b\":{\"dtype\":\"U8\",\"shape\":[1152921504606846975],\"data_offsets\":[0,1152921504606846975]}}",
        0, CKPTIO_E_TRUNCATED, "past the end of the file");
}

/* Paths appear in messages of file-level errors; parse() has none. */
static void test_message_without_path(void) {
    BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, CKPTIO_E_FORMAT,
        "tensor 'a': data_offsets [0, 1] cover 1 bytes but dtype U8 shape [2] needs 2");
    T_ASSERT(strncmp(ckptio_last_error_message(), "tensor 'a':", 11) == 0);
}

/* Every allocation failure ends in E_NOMEM (or success), never a crash or
 * a leak (ASan checks the latter). */
static void test_allocation_failures(void) {
    size_t len;
    unsigned char *bytes = t_read_file(data_path("ref_numpy.safetensors"), &len);
    int failures = 0;
    for (uint64_t k = 1; k < 50; k++) {
        ckptio_safetensors *st = NULL;
        ckptio__alloc_fail_after(k);
        ckptio_status status = ckptio_safetensors_parse(bytes, len, len, &st);
        ckptio__alloc_fail_after(0);
        if (status == CKPTIO_OK) {
            ckptio_safetensors_close(st);
            break;
        }
        T_ASSERT_MSG(status == CKPTIO_E_NOMEM, "k=%llu: %s", (unsigned long long)k, ckptio_last_error_message());
        T_ASSERT(st == NULL);
        failures++;
    }
    T_ASSERT(failures >= 5);
    free(bytes);
}

int main(void) {
    T_RUN(test_golden_numpy);
    T_RUN(test_golden_torch_dtypes);
    T_RUN(test_golden_unaligned_f6);
    T_RUN(test_golden_empty);
    T_RUN(test_every_dtype);
    T_RUN(test_scalars_empty_and_whitespace);
    T_RUN(test_offset_order);
    T_RUN(test_reference_leniencies);
    T_RUN(test_metadata_order_and_accessors);
    T_RUN(test_find_many);
    T_RUN(test_bad_sizes);
    T_RUN(test_bad_utf8);
    T_RUN(test_bad_json);
    T_RUN(test_bad_depth);
    T_RUN(test_bad_value_count);
    T_RUN(test_bad_metadata);
    T_RUN(test_bad_entry_fields);
    T_RUN(test_bad_shape);
    T_RUN(test_bad_offsets_fields);
    T_RUN(test_bad_layout);
    T_RUN(test_bad_data_section);
    T_RUN(test_message_without_path);
    T_RUN(test_allocation_failures);
    return 0;
}
