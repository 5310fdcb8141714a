/*
 * test_safetensors_layout.c - the safetensors writer's layout, in memory:
 * byte-identical headers and files versus the golden files the safetensors
 * package wrote (CKPTIO_SAFETENSORS_ALIGN_8), the 4096-byte default, the
 * reference tensor order, JSON escapes, and refusal of bad inputs.
 */
#include "common_internal.h"
#include "data/safetensors/golden_tables.h"
#include "helpers.h"
#include "safetensors_internal.h"

#include <string.h>

static const char *data_path(const char *name) {
    static char buf[1024];
    const char *dir = getenv("CKPTIO_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/safetensors/%s", dir ? dir : "tests/data", name);
    return buf;
}

/* Sources for a golden table, with the golden content formula. */
typedef struct sources {
    ckptio_tensor_source *t;
    unsigned char **data;
    size_t n;
} sources;

static sources make_sources(const golden_tensor *table, size_t n) {
    sources s = {calloc(n, sizeof *s.t), calloc(n, sizeof *s.data), n};
    for (size_t k = 0; k < n; k++) {
        const uint64_t nb = golden_nbytes(&table[k]);
        s.data[k] = malloc(nb ? nb : 1);
        golden_fill(s.data[k], nb, k, table[k].dtype);
        s.t[k] = (ckptio_tensor_source){.name = table[k].name, .dtype = table[k].dtype, .ndim = table[k].ndim,
                                        .shape = table[k].shape, .data = s.data[k], .nbytes = nb,
                                        .mem_kind = CKPTIO_MEM_HOST};
    }
    return s;
}

static void free_sources(sources *s) {
    for (size_t k = 0; k < s->n; k++) free(s->data[k]);
    free(s->data);
    free(s->t);
}

/* The whole file the layout describes: header, then each tensor's bytes. */
static unsigned char *assemble(const ckptio__st_layout *l, const ckptio_tensor_source *t, size_t *len) {
    *len = (size_t)(l->header_size + l->data_size);
    unsigned char *out = malloc(*len);
    memcpy(out, l->header, l->header_size);
    for (size_t i = 0; i < l->count; i++)
        if (t[i].nbytes) memcpy(out + l->header_size + l->offsets[i], t[i].data, t[i].nbytes);
    return out;
}

static void check_identical(const char *golden, const golden_tensor *table, size_t n, const ckptio_kv *md,
                            size_t md_n) {
    size_t glen, len;
    unsigned char *want = t_read_file(data_path(golden), &glen);
    sources s = make_sources(table, n);
    ckptio__st_layout l;
    T_OK(ckptio__st_layout_build(s.t, n, md, md_n, CKPTIO_SAFETENSORS_ALIGN_8, "x.safetensors", &l));
    T_ASSERT(l.header_size % 8 == 0);
    T_ASSERT_MSG(l.header_size <= glen && memcmp(l.header, want, l.header_size) == 0,
                 "%s: header differs:\n got  %.*s\n want %.*s", golden, (int)l.header_size - 8, l.header + 8,
                 (int)l.header_size - 8, want + 8);
    unsigned char *got = assemble(&l, s.t, &len);
    T_ASSERT_MSG(len == glen && memcmp(got, want, len) == 0, "%s: file bytes differ", golden);
    free(got);
    ckptio__st_layout_cleanup(&l);
    T_ASSERT(l.header == NULL && l.order == NULL);
    free_sources(&s);
    free(want);
}

static void test_identical_to_reference_numpy(void) {
    check_identical("ref_numpy.safetensors", golden_numpy, GOLDEN_COUNT(golden_numpy), golden_numpy_metadata, 1);
}

static void test_identical_to_reference_torch(void) {
    check_identical("ref_torch.safetensors", golden_torch, GOLDEN_COUNT(golden_torch), NULL, 0);
}

static void test_identical_to_reference_empty(void) {
    check_identical("empty.safetensors", NULL, 0, NULL, 0);
}

/* Default: 8 + N is a multiple of 4096, padding is spaces, and the result
 * parses back to the same tensors and metadata. */
static void test_align_4k_round_trip(void) {
    sources s = make_sources(golden_numpy, GOLDEN_COUNT(golden_numpy));
    const ckptio_kv md[] = {{"zeta", "1"}, {"alpha", "two\n\"q\""}, {"", ""}};
    ckptio__st_layout l;
    T_OK(ckptio__st_layout_build(s.t, s.n, md, 3, 0, NULL, &l));
    T_ASSERT(l.header_size == 4096);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | l.header[i];
    T_ASSERT(n == 4096 - 8);
    const char *json = (const char *)l.header + 8;
    /* The header is not NUL-terminated: find the closing brace by hand. */
    size_t json_len = (size_t)n;
    while (json_len > 0 && json[json_len - 1] == ' ') json_len--;
    T_ASSERT(json_len > 1000 && json[json_len - 1] == '}');
    for (size_t i = json_len; i < n; i++) T_ASSERT(json[i] == ' ');
    /* Metadata first, in the caller's order. */
    T_ASSERT(strncmp(json, "{\"__metadata__\":{\"zeta\":\"1\",\"alpha\":\"two\\n\\\"q\\\"\",\"\":\"\"},", 56) == 0);

    size_t len;
    unsigned char *file = assemble(&l, s.t, &len);
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_parse(file, len, len, &st));
    size_t count, mdc;
    T_OK(ckptio_safetensors_count(st, &count));
    T_ASSERT(count == s.n);
    T_OK(ckptio_safetensors_metadata_count(st, &mdc));
    T_ASSERT(mdc == 3);
    for (size_t i = 0; i < 3; i++) {
        ckptio_kv kv;
        T_OK(ckptio_safetensors_metadata(st, i, &kv));
        T_ASSERT(strcmp(kv.key, md[i].key) == 0 && strcmp(kv.value, md[i].value) == 0);
    }
    for (size_t k = 0; k < s.n; k++) {
        size_t idx;
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_find(st, s.t[k].name, &idx));
        T_OK(ckptio_safetensors_tensor(st, idx, &info));
        T_ASSERT(info.dtype == s.t[k].dtype && info.ndim == s.t[k].ndim && info.nbytes == s.t[k].nbytes);
        T_ASSERT(info.file_offset == 4096 + l.offsets[k]);
        T_ASSERT(memcmp(file + info.file_offset, s.t[k].data, info.nbytes) == 0);
    }
    ckptio_safetensors_close(st);
    free(file);
    ckptio__st_layout_cleanup(&l);
    free_sources(&s);
}

/* A header longer than 4088 bytes goes to the next multiple of 4096. */
static void test_align_4k_large_header(void) {
    enum { N = 60 }; /* about 100 header bytes each */
    ckptio_tensor_source t[N];
    char names[N][64];
    static const int64_t shape[1] = {1};
    static const unsigned char byte = 7;
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "a.rather.long.tensor.name.to.grow.the.header.%03d", i);
        t[i] = (ckptio_tensor_source){.name = names[i], .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = shape,
                                      .data = &byte, .nbytes = 1};
    }
    ckptio__st_layout l;
    T_OK(ckptio__st_layout_build(t, N, NULL, 0, CKPTIO_SAFETENSORS_ALIGN_4K, NULL, &l));
    T_ASSERT(l.header_size == 8192 && l.data_size == N);
    /* Same names: sorted by name, so tensor 0 first. */
    for (int i = 0; i < N; i++) T_ASSERT(l.order[i] == (size_t)i && l.offsets[i] == (uint64_t)i);
    ckptio__st_layout_cleanup(&l);
}

/* Order: the safetensors Dtype enum descending, then name. */
static void test_reference_order(void) {
    static const ckptio_dtype want[] = {
        CKPTIO_DTYPE_U64, CKPTIO_DTYPE_I64, CKPTIO_DTYPE_F64, CKPTIO_DTYPE_C64, CKPTIO_DTYPE_F32,
        CKPTIO_DTYPE_U32, CKPTIO_DTYPE_I32, CKPTIO_DTYPE_BF16, CKPTIO_DTYPE_F16, CKPTIO_DTYPE_U16,
        CKPTIO_DTYPE_I16, CKPTIO_DTYPE_F8_E5M2FNUZ, CKPTIO_DTYPE_F8_E4M3FNUZ, CKPTIO_DTYPE_F8_E8M0,
        CKPTIO_DTYPE_F8_E4M3, CKPTIO_DTYPE_F8_E5M2, CKPTIO_DTYPE_I8, CKPTIO_DTYPE_U8, CKPTIO_DTYPE_F6_E3M2,
        CKPTIO_DTYPE_F6_E2M3, CKPTIO_DTYPE_F4, CKPTIO_DTYPE_BOOL};
    enum { N = sizeof want / sizeof want[0] };
    ckptio_tensor_source t[N + 1];
    static const int64_t shape[1] = {4};
    static unsigned char buf[32];
    char names[N + 1][8];
    /* Given in ascending order, named so that names alone would sort them
     * the other way. */
    for (int i = 0; i < N; i++) {
        const ckptio_dtype d = want[N - 1 - i];
        snprintf(names[i], sizeof names[i], "t%02d", i + 1);
        t[i] = (ckptio_tensor_source){.name = names[i], .dtype = d, .ndim = 1, .shape = shape, .data = buf,
                                      .nbytes = 4 * ckptio_dtype_bits(d) / 8};
    }
    /* Same dtype as the first U64: goes after it by name ("t22" < "u"). */
    snprintf(names[N], sizeof names[N], "u");
    t[N] = (ckptio_tensor_source){.name = names[N], .dtype = CKPTIO_DTYPE_U64, .ndim = 1, .shape = shape,
                                  .data = buf, .nbytes = 32};
    ckptio__st_layout l;
    T_OK(ckptio__st_layout_build(t, N + 1, NULL, 0, CKPTIO_SAFETENSORS_ALIGN_8, NULL, &l));
    T_ASSERT(t[l.order[0]].dtype == CKPTIO_DTYPE_U64 && strcmp(t[l.order[0]].name, "t22") == 0);
    T_ASSERT(strcmp(t[l.order[1]].name, "u") == 0);
    for (int i = 1; i < N; i++)
        T_ASSERT_MSG(t[l.order[i + 1]].dtype == want[i], "position %d has dtype %s, want %s", i + 1,
                     ckptio_dtype_name(t[l.order[i + 1]].dtype), ckptio_dtype_name(want[i]));
    /* Offsets follow the order, back to back. */
    uint64_t off = 0;
    for (int i = 0; i <= N; i++) {
        T_ASSERT(l.offsets[l.order[i]] == off);
        off += t[l.order[i]].nbytes;
    }
    T_ASSERT(l.data_size == off);
    ckptio__st_layout_cleanup(&l);
}

/* serde_json's escapes: short forms, lowercase \u00xx, DEL and '/' raw. */
static void test_json_escapes(void) {
    char name[40];
    for (int c = 1; c < 32; c++) name[c - 1] = (char)c;
    memcpy(name + 31, "/\x7f\"\\", 5);
    const int64_t shape[1] = {0};
    const ckptio_tensor_source t = {.name = name, .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = shape};
    ckptio__st_layout l;
    T_OK(ckptio__st_layout_build(&t, 1, NULL, 0, CKPTIO_SAFETENSORS_ALIGN_8, NULL, &l));
    const char *want = "{\"\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f"
                       "\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b"
                       "\\u001c\\u001d\\u001e\\u001f/\x7f\\\"\\\\\":{\"dtype\":\"U8\",\"shape\":[0],"
                       "\"data_offsets\":[0,0]}}";
    T_ASSERT_MSG(strncmp((const char *)l.header + 8, want, strlen(want)) == 0, "got %.*s",
                 (int)(l.header_size - 8), l.header + 8);
    /* And it parses back to the same name. */
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_parse(l.header, l.header_size, l.header_size, &st));
    ckptio_tensor_info info;
    T_OK(ckptio_safetensors_tensor(st, 0, &info));
    T_ASSERT(strcmp(info.name, name) == 0);
    ckptio_safetensors_close(st);
    ckptio__st_layout_cleanup(&l);
}

#define BAD_LAYOUT(t, n, md, mdn, flags, status, fragment)                                  \
    do {                                                                                    \
        ckptio__st_layout l_;                                                               \
        T_STATUS(ckptio__st_layout_build((t), (n), (md), (mdn), (flags), "out.safetensors", &l_), (status)); \
        T_MESSAGE_HAS(fragment);                                                            \
        T_ASSERT(l_.header == NULL && l_.order == NULL && l_.offsets == NULL);              \
    } while (0)

static void test_bad_inputs(void) {
    const int64_t shape3[1] = {3}, neg[2] = {2, -1}, odd[1] = {3};
    static const unsigned char buf[64];
    ckptio_tensor_source ok = {.name = "w", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape3, .data = buf,
                               .nbytes = 12};
    ckptio_tensor_source t[2] = {ok, ok};

    t[0].name = "";
    BAD_LAYOUT(t, 1, NULL, 0, 0, CKPTIO_E_INVAL, "out.safetensors: tensor 0 has an empty name");
    t[0].name = NULL;
    BAD_LAYOUT(t, 1, NULL, 0, 0, CKPTIO_E_INVAL, "tensor 0 has a NULL name");
    t[0].name = "__metadata__";
    BAD_LAYOUT(t, 1, NULL, 0, 0, CKPTIO_E_INVAL, "tensor '__metadata__': the name is reserved");
    t[0].name = "bad\xff";
    BAD_LAYOUT(t, 1, NULL, 0, 0, CKPTIO_E_INVAL, "the name is not valid UTF-8");
    t[0] = ok;
    /* Duplicates, also with different dtypes (not adjacent in file order). */
    t[1].dtype = CKPTIO_DTYPE_I32;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_INVAL, "tensor 'w': the name appears more than once");
    t[1] = ok;
    t[1].name = "v";
    t[1].dtype = CKPTIO_DTYPE_C128;
    t[1].nbytes = 48;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_UNSUPPORTED, "tensor 'v': dtype complex128 has no safetensors equivalent");
    t[1].dtype = (ckptio_dtype)99;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_INVAL, "tensor 'v': invalid dtype 99");
    t[1] = ok;
    t[1].name = "v";
    t[1].shape = neg;
    t[1].ndim = 2;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_INVAL, "tensor 'v': shape[1] is -1, must be >= 0");
    t[1].shape = NULL;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_INVAL, "tensor 'v': shape is NULL but ndim is 2");
    t[1] = ok;
    t[1].name = "v";
    t[1].nbytes = 13;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_INVAL, "tensor 'v': nbytes is 13 but dtype F32 shape [3] needs 12");
    t[1].nbytes = 12;
    t[1].data = NULL;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_INVAL, "tensor 'v': data is NULL but nbytes is 12");
    t[1] = ok;
    t[1].name = "v";
    t[1].dtype = CKPTIO_DTYPE_F4;
    t[1].shape = odd;
    t[1].nbytes = 2;
    BAD_LAYOUT(t, 2, NULL, 0, 0, CKPTIO_E_INVAL, "dtype F4 shape [3] is not a whole number of bytes");

    BAD_LAYOUT(&ok, 1, NULL, 0, 4u, CKPTIO_E_INVAL, "unknown save flags 0x4");
    BAD_LAYOUT(NULL, 1, NULL, 0, 0, CKPTIO_E_INVAL, "tensors is NULL but count is 1");
    const ckptio_kv dup[] = {{"k", "1"}, {"j", "0"}, {"k", "2"}};
    BAD_LAYOUT(&ok, 1, dup, 3, 0, CKPTIO_E_INVAL, "__metadata__ key 'k': appears more than once");
    const ckptio_kv null_value[] = {{"k", NULL}};
    BAD_LAYOUT(&ok, 1, null_value, 1, 0, CKPTIO_E_INVAL, "metadata pair 0 has a NULL key or value");
    const ckptio_kv bad_utf8[] = {{"k", "\xc3"}};
    BAD_LAYOUT(&ok, 1, bad_utf8, 1, 0, CKPTIO_E_INVAL, "__metadata__ key 'k': key or value is not valid UTF-8");
    BAD_LAYOUT(&ok, 1, NULL, 2, 0, CKPTIO_E_INVAL, "metadata is NULL but metadata_count is 2");

    /* Zero-byte tensors may have no data; no tensors at all is fine. */
    const int64_t zero[1] = {0};
    ckptio_tensor_source z = {.name = "z", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = zero};
    ckptio__st_layout l;
    T_OK(ckptio__st_layout_build(&z, 1, NULL, 0, 0, NULL, &l));
    T_ASSERT(l.data_size == 0 && l.header_size == 4096);
    ckptio__st_layout_cleanup(&l);
    T_OK(ckptio__st_layout_build(NULL, 0, NULL, 0, CKPTIO_SAFETENSORS_ALIGN_8, NULL, &l));
    T_ASSERT(l.header_size == 16 && memcmp(l.header + 8, "{}      ", 8) == 0);
    ckptio__st_layout_cleanup(&l);
}

static void test_allocation_failures(void) {
    sources s = make_sources(golden_numpy, GOLDEN_COUNT(golden_numpy));
    int failures = 0;
    for (uint64_t k = 1; k < 100; k++) {
        ckptio__st_layout l;
        ckptio__alloc_fail_after(k);
        ckptio_status status = ckptio__st_layout_build(s.t, s.n, golden_numpy_metadata, 1, 0, NULL, &l);
        ckptio__alloc_fail_after(0);
        ckptio__st_layout_cleanup(&l);
        if (status == CKPTIO_OK) break;
        T_ASSERT_MSG(status == CKPTIO_E_NOMEM, "k=%llu: %s", (unsigned long long)k, ckptio_last_error_message());
        failures++;
    }
    T_ASSERT(failures >= 3);
    free_sources(&s);
}

int main(void) {
    T_RUN(test_identical_to_reference_numpy);
    T_RUN(test_identical_to_reference_torch);
    T_RUN(test_identical_to_reference_empty);
    T_RUN(test_align_4k_round_trip);
    T_RUN(test_align_4k_large_header);
    T_RUN(test_reference_order);
    T_RUN(test_json_escapes);
    T_RUN(test_bad_inputs);
    T_RUN(test_allocation_failures);
    return 0;
}
