/*
 * test_torch.c - torch.save files written and read by ckptio: the object
 * tree, views sharing a storage, strides, parameters, every dtype torch
 * saves, alignment, layout reuse between saves, CRC-32 verification,
 * atomic save, and files torch itself would refuse or ckptio must refuse.
 * The files are also loaded by torch.load when python3 + torch are present
 * (tests/python/test_torch_*.py covers the other direction).
 */
#include "helpers.h"
#include "torch_internal.h"

#include <string.h>
#include <unistd.h>

static ckptio_engine *engine;

static ckptio_value *str(ckptio_torch_writer *w, const char *s) {
    ckptio_value *v;
    T_OK(ckptio_torch_writer_str(w, s, strlen(s), &v));
    return v;
}

static void put(ckptio_torch_writer *w, ckptio_value *dict, const char *key, ckptio_value *v) {
    T_OK(ckptio_torch_writer_set_item(w, dict, str(w, key), v));
}

static float base[24];
static uint16_t half[6];
static uint8_t f8[5];

/* {'a': base[0:24] as [4, 6], 'view': a.t()[1:3] (strided, offset 1),
 *  'p': Parameter(half, requires_grad), 'nested': {'f8': f8, 'meta': [1, 2**70, 'x', b'\x01', None, 1.5, (True,)]},
 *  'tied': the node of 'a' again } */
static ckptio_torch_writer *make_writer(size_t *sid) {
    for (int i = 0; i < 24; i++) base[i] = (float)i * 0.5f;
    for (int i = 0; i < 6; i++) half[i] = (uint16_t)(0x3c00 + i);
    for (int i = 0; i < 5; i++) f8[i] = (uint8_t)(0x30 + i);
    ckptio_torch_writer *w;
    T_OK(ckptio_torch_writer_create(&w));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F32, sizeof base, NULL, base, CKPTIO_MEM_HOST, &sid[0]));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F16, sizeof half, "cuda:0", half, CKPTIO_MEM_HOST, &sid[1]));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F8_E4M3, sizeof f8, NULL, f8, CKPTIO_MEM_AUTO, &sid[2]));
    ckptio_value *root, *a, *view, *p, *nested, *meta, *v, *tup;
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 1, &root));
    int64_t shape_a[2] = {4, 6};
    ckptio_torch_tensor_spec sa = {.storage = sid[0], .dtype = CKPTIO_DTYPE_F32, .ndim = 2, .shape = shape_a};
    T_OK(ckptio_torch_writer_tensor(w, &sa, &a));
    int64_t shape_v[2] = {2, 4}, stride_v[2] = {1, 6};
    ckptio_torch_tensor_spec sv = {.storage = sid[0], .dtype = CKPTIO_DTYPE_F32, .ndim = 2, .shape = shape_v,
                                   .stride = stride_v, .storage_offset = 1};
    T_OK(ckptio_torch_writer_tensor(w, &sv, &view));
    int64_t shape_p[1] = {6};
    ckptio_torch_tensor_spec sp = {.storage = sid[1], .dtype = CKPTIO_DTYPE_F16, .ndim = 1, .shape = shape_p,
                                   .requires_grad = 1, .is_parameter = 1};
    T_OK(ckptio_torch_writer_tensor(w, &sp, &p));
    put(w, root, "a", a);
    put(w, root, "view", view);
    put(w, root, "p", p);
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 0, &nested));
    int64_t shape_f8[1] = {5};
    ckptio_torch_tensor_spec s8 = {.storage = sid[2], .dtype = CKPTIO_DTYPE_F8_E4M3, .ndim = 1, .shape = shape_f8};
    T_OK(ckptio_torch_writer_tensor(w, &s8, &v));
    put(w, nested, "f8", v);
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_LIST, 0, &meta));
    T_OK(ckptio_torch_writer_int(w, 1, &v));
    T_OK(ckptio_torch_writer_append(w, meta, v));
    const uint8_t big[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0x40};
    T_OK(ckptio_torch_writer_bigint(w, big, 9, &v));
    T_OK(ckptio_torch_writer_append(w, meta, v));
    T_OK(ckptio_torch_writer_append(w, meta, str(w, "x")));
    T_OK(ckptio_torch_writer_bytes(w, "\x01", 1, &v));
    T_OK(ckptio_torch_writer_append(w, meta, v));
    T_OK(ckptio_torch_writer_none(w, &v));
    T_OK(ckptio_torch_writer_append(w, meta, v));
    T_OK(ckptio_torch_writer_float(w, 1.5, &v));
    T_OK(ckptio_torch_writer_append(w, meta, v));
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_TUPLE, 0, &tup));
    T_OK(ckptio_torch_writer_bool(w, 1, &v));
    T_OK(ckptio_torch_writer_append(w, tup, v));
    T_OK(ckptio_torch_writer_append(w, meta, tup));
    put(w, nested, "meta", meta);
    put(w, root, "nested", nested);
    put(w, root, "tied", a);
    T_OK(ckptio_torch_writer_set_root(w, root));
    return w;
}

static void check_file(const char *path, uint64_t alignment) {
    ckptio_torch *t;
    T_OK(ckptio_torch_open(engine, path, &t));
    size_t n, ns;
    T_OK(ckptio_torch_count(t, &n));
    T_OK(ckptio_torch_storage_count(t, &ns));
    T_ASSERT(n == 5 && ns == 3);
    uint64_t al;
    T_OK(ckptio_torch_alignment(t, &al));
    T_ASSERT(al == alignment);
    const char *names[] = {"a", "view", "p", "nested.f8", "tied"};
    ckptio_torch_tensor_info info[5];
    for (size_t i = 0; i < 5; i++) {
        T_OK(ckptio_torch_tensor(t, i, &info[i]));
        T_ASSERT_MSG(strcmp(info[i].name, names[i]) == 0, "tensor %zu is %s", i, info[i].name);
    }
    /* a, view and tied share storage 0 (the writer pickles a shared node
     * twice without a memo: two tensors over one storage). */
    T_ASSERT(info[0].storage == info[1].storage && info[0].storage == info[4].storage);
    T_ASSERT(info[4].file_offset == info[0].file_offset && info[4].nbytes == info[0].nbytes);
    size_t idx;
    T_OK(ckptio_value_tensor(info[4].value, &idx));
    T_ASSERT(idx == 4);
    T_ASSERT(info[1].stride[0] == 1 && info[1].stride[1] == 6 && info[1].storage_offset == 1 && !info[1].is_contiguous);
    T_ASSERT(info[0].is_contiguous && info[0].nbytes == 96);
    T_ASSERT(info[2].is_parameter && info[2].requires_grad && info[2].dtype == CKPTIO_DTYPE_F16);
    T_ASSERT(info[3].dtype == CKPTIO_DTYPE_F8_E4M3 && info[3].nbytes == 5);
    ckptio_torch_storage_info si;
    T_OK(ckptio_torch_storage(t, info[2].storage, &si));
    T_ASSERT(strcmp(si.location, "cuda:0") == 0 && si.nbytes == 12 && si.file_offset % alignment == 0);
    T_OK(ckptio_torch_storage(t, info[3].storage, &si));
    T_ASSERT(si.dtype == CKPTIO_DTYPE_U8 && strcmp(si.key, "2") == 0); /* UntypedStorage for float8 */
    /* Bytes: whole storages, contiguous tensors, and a gathered view. */
    float sbuf[24] = {0}, vbuf[8] = {0};
    ckptio_tensor_target st = {.index = info[0].storage, .data = sbuf, .capacity = sizeof sbuf};
    T_OK(ckptio_torch_read_storages(t, &st, 1));
    T_ASSERT(memcmp(sbuf, base, sizeof base) == 0);
    ckptio_tensor_target tt = {.index = 1, .data = vbuf, .capacity = sizeof vbuf};
    T_OK(ckptio_torch_read(t, &tt, 1));
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) T_ASSERT(vbuf[r * 4 + c] == base[1 + r + 6 * c]);
    tt.capacity = 16;
    T_STATUS(ckptio_torch_read(t, &tt, 1), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("view");
    /* Values. */
    const ckptio_value *root, *k, *nested, *meta, *x;
    T_OK(ckptio_torch_root(t, &root));
    int ordered;
    T_OK(ckptio_value_dict_ordered(root, &ordered));
    T_ASSERT(ordered);
    T_OK(ckptio_value_dict_item(root, 3, &k, &nested));
    T_OK(ckptio_value_dict_item(nested, 1, &k, &meta));
    size_t len;
    T_OK(ckptio_value_len(meta, &len));
    T_ASSERT(len == 7);
    const char *s;
    T_OK(ckptio_value_item(meta, 1, &x));
    T_OK(ckptio_value_bytes(x, &s, &len));
    T_ASSERT(ckptio_value_kind_of(x) == CKPTIO_VALUE_BIGINT && len == 9);
    T_OK(ckptio_value_item(meta, 3, &x));
    T_OK(ckptio_value_bytes(x, &s, &len));
    T_ASSERT(ckptio_value_kind_of(x) == CKPTIO_VALUE_BYTES && len == 1 && s[0] == 1);
    T_OK(ckptio_value_item(meta, 6, &x));
    T_ASSERT(ckptio_value_kind_of(x) == CKPTIO_VALUE_TUPLE);
    ckptio_torch_verify_report rep;
    T_OK(ckptio_torch_verify(t, &rep));
    T_ASSERT(rep.records == 9 && rep.crc_checked == 9 && rep.crc_absent == 0);
    T_OK(ckptio_torch_find(t, "nested.f8", &idx));
    T_ASSERT(idx == 3);
    T_STATUS(ckptio_torch_find(t, "nope", &idx), CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_torch_close(t));
}

static void test_roundtrip(void) {
    size_t sid[3];
    ckptio_torch_writer *w = make_writer(sid);
    T_OK(ckptio_torch_save(engine, t_path("m.pt"), w, NULL));
    check_file(t_path("m.pt"), 4096);
    ckptio_torch_save_options opt = {.storage_alignment = 64};
    T_OK(ckptio_torch_save(engine, t_path("m64.pt"), w, &opt));
    check_file(t_path("m64.pt"), 64);
    /* The pickle uses v2 with legacy classes and v3 + UntypedStorage for float8. */
    size_t len;
    char *bytes = t_read_file(t_path("m.pt"), &len);
    T_ASSERT(memmem(bytes, len, "m/data.pkl", 10) && memmem(bytes, len, "ctorch\nFloatStorage\n", 20));
    T_ASSERT(memmem(bytes, len, "ctorch.storage\nUntypedStorage\n", 30) &&
             memmem(bytes, len, "ctorch\nfloat8_e4m3fn\n", 21));
    T_ASSERT(memmem(bytes, len, "_rebuild_parameter", 18));
    free(bytes);
    T_OK(ckptio_torch_writer_destroy(w));
}

/* Layout reuse: rebinding memory keeps every offset; structural changes are
 * tracked and force a new layout. */
static void test_layout_reuse(void) {
    size_t sid[3];
    ckptio_torch_writer *w = make_writer(sid);
    uint64_t size1, size2, off1, off2;
    const char *key;
    T_OK(ckptio_torch_writer_layout(w, NULL, &size1));
    T_OK(ckptio_torch_writer_storage_offset(w, sid[1], &off1, &key));
    T_ASSERT(strcmp(key, "1") == 0 && off1 % 4096 == 0);
    T_OK(ckptio_torch_save(engine, t_path("r1.pt"), w, &(ckptio_torch_save_options){.record_prefix = "archive"}));
    float other[24];
    for (int i = 0; i < 24; i++) other[i] = -1.0f - (float)i;
    T_OK(ckptio_torch_writer_bind(w, sid[0], other, CKPTIO_MEM_HOST));
    T_OK(ckptio_torch_writer_storage_offset(w, sid[1], &off2, &key));
    T_ASSERT(off1 == off2);
    T_OK(ckptio_torch_save(engine, t_path("r2.pt"), w, &(ckptio_torch_save_options){.record_prefix = "archive"}));
    size_t l1, l2;
    uint8_t *b1 = t_read_file(t_path("r1.pt"), &l1), *b2 = t_read_file(t_path("r2.pt"), &l2);
    T_ASSERT(l1 == l2 && l1 == size1);
    ckptio_torch *t;
    T_OK(ckptio_torch_open(engine, t_path("r2.pt"), &t));
    float got[24];
    ckptio_tensor_target tg = {.index = 0, .data = got, .capacity = sizeof got};
    T_OK(ckptio_torch_read(t, &tg, 1));
    T_ASSERT(memcmp(got, other, sizeof got) == 0);
    T_OK(ckptio_torch_verify(t, NULL));
    ckptio_torch_close(t);
    free(b1);
    free(b2);
    /* A structural change invalidates the layout; the next save recomputes it. */
    ckptio_value *root = w->root, *v;
    T_OK(ckptio_torch_writer_int(w, 7, &v));
    put(w, root, "step", v);
    T_STATUS(ckptio_torch_writer_storage_offset(w, sid[1], &off2, &key), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("no current layout");
    T_OK(ckptio_torch_writer_layout(w, NULL, &size2));
    T_OK(ckptio_torch_save(engine, t_path("r3.pt"), w, NULL));
    T_OK(ckptio_torch_open(engine, t_path("r3.pt"), &t));
    const ckptio_value *r, *k, *x;
    T_OK(ckptio_torch_root(t, &r));
    T_OK(ckptio_value_dict_item(r, 5, &k, &x));
    int64_t step;
    T_OK(ckptio_value_int(x, &step));
    T_ASSERT(step == 7);
    ckptio_torch_close(t);
    /* Unbound storage: refused, nothing written, the old file kept. */
    T_OK(ckptio_torch_writer_bind(w, sid[0], NULL, CKPTIO_MEM_HOST));
    T_STATUS(ckptio_torch_save(engine, t_path("r3.pt"), w, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("no memory bound");
    T_OK(ckptio_torch_open(engine, t_path("r3.pt"), &t));
    ckptio_torch_close(t);
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
    /* Views of one storage as two dtypes: torch refuses that too. */
    ckptio_torch_tensor_spec bad = {.storage = sid[2], .dtype = CKPTIO_DTYPE_U8, .ndim = 0};
    T_STATUS(ckptio_torch_writer_tensor(w, &bad, &v), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("views a float8_e4m3fn storage");
    size_t raw;
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_U8, sizeof f8, NULL, f8, CKPTIO_MEM_HOST, &raw));
    ckptio_torch_tensor_spec as_u8 = {.storage = raw, .dtype = CKPTIO_DTYPE_U8, .ndim = 0};
    ckptio_torch_tensor_spec as_f8 = {.storage = raw, .dtype = CKPTIO_DTYPE_F8_E4M3, .ndim = 0};
    T_OK(ckptio_torch_writer_tensor(w, &as_u8, &v));
    put(w, root, "u8", v);
    T_OK(ckptio_torch_writer_tensor(w, &as_f8, &v));
    put(w, root, "f8", v);
    T_STATUS(ckptio_torch_writer_layout(w, NULL, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("one dtype per storage");
    ckptio_torch_writer_destroy(w);
}

/* A storage of 5 GiB that is never written: offsets past 4 GiB. */
static void test_zip64_offsets(void) {
    ckptio_torch_writer *w;
    T_OK(ckptio_torch_writer_create(&w));
    size_t s0, s1;
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_BF16, 5ull << 30, NULL, NULL, CKPTIO_MEM_HOST, &s0));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_BF16, 8, NULL, NULL, CKPTIO_MEM_HOST, &s1));
    ckptio_value *l, *v;
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_LIST, 0, &l));
    int64_t big = (int64_t)(5ull << 29), small = 4;
    ckptio_torch_tensor_spec a = {.storage = s0, .dtype = CKPTIO_DTYPE_BF16, .ndim = 1, .shape = &big};
    ckptio_torch_tensor_spec b = {.storage = s1, .dtype = CKPTIO_DTYPE_BF16, .ndim = 1, .shape = &small};
    T_OK(ckptio_torch_writer_tensor(w, &a, &v));
    T_OK(ckptio_torch_writer_append(w, l, v));
    T_OK(ckptio_torch_writer_tensor(w, &b, &v));
    T_OK(ckptio_torch_writer_append(w, l, v));
    T_OK(ckptio_torch_writer_set_root(w, l));
    uint64_t size, off;
    T_OK(ckptio_torch_writer_layout(w, NULL, &size));
    T_OK(ckptio_torch_writer_storage_offset(w, s1, &off, NULL));
    T_ASSERT(off > (5ull << 30) && off % 4096 == 0 && size > off);
    /* The metadata image for it is small and holds zip64 records. */
    T_ASSERT(w->meta_len < (1u << 20));
    uint8_t *meta = calloc(1, w->meta_len + CKPTIO__TORCH_META_SCRATCH);
    ckptio__torch_writer_fill_meta(w, meta);
    const struct ckptio__torch_piece *last = &w->pieces[w->npieces - 1];
    const uint8_t *end = meta + last->meta_offset + last->length;
    T_ASSERT(ckptio__le32(end - 22) == 0x06054b50 && ckptio__le32(end - 42) == 0x07064b50);
    T_ASSERT(ckptio__le32(end - 22 + 16) == 0xFFFFFFFFu); /* central directory offset past 4 GiB */
    free(meta);
    T_STATUS(ckptio_torch_save(engine, t_path("huge.pt"), w, NULL), CKPTIO_E_INVAL);
    T_ASSERT(!t_file_exists(t_path("huge.pt")));
    /* A view past its storage is refused when it is added. */
    int64_t too_many = 5;
    ckptio_torch_tensor_spec c = {.storage = s1, .dtype = CKPTIO_DTYPE_BF16, .ndim = 1, .shape = &too_many};
    T_STATUS(ckptio_torch_writer_tensor(w, &c, &v), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("reaches past its storage");
    ckptio_torch_writer_destroy(w);
}

/* Every dtype torch has, through ckptio_torch_save_tensors. */
static void test_all_dtypes(void) {
    ckptio_tensor_source src[CKPTIO_DTYPE_COUNT_];
    static uint8_t data[CKPTIO_DTYPE_COUNT_][128];
    int64_t shape[CKPTIO_DTYPE_COUNT_][2];
    char names[CKPTIO_DTYPE_COUNT_][32];
    size_t n = 0;
    for (int d = 0; d < CKPTIO_DTYPE_COUNT_; d++) {
        if (!ckptio_dtype_torch_name((ckptio_dtype)d)) continue;
        shape[n][0] = 2;
        shape[n][1] = 4;
        uint64_t nbytes = (uint64_t)8 * ckptio_dtype_bits((ckptio_dtype)d) / 8;
        t_fill_random(data[n], sizeof data[n], (uint64_t)d);
        snprintf(names[n], sizeof names[n], "t.%s", ckptio_dtype_torch_name((ckptio_dtype)d));
        src[n] = (ckptio_tensor_source){.name = names[n], .dtype = (ckptio_dtype)d, .ndim = 2, .shape = shape[n],
                                        .data = data[n], .nbytes = nbytes, .mem_kind = CKPTIO_MEM_HOST};
        n++;
    }
    T_OK(ckptio_torch_save_tensors(engine, t_path("dtypes.pt"), src, n, NULL));
    ckptio_torch *t;
    T_OK(ckptio_torch_open(engine, t_path("dtypes.pt"), &t));
    size_t count;
    T_OK(ckptio_torch_count(t, &count));
    T_ASSERT(count == n);
    for (size_t i = 0; i < n; i++) {
        ckptio_torch_tensor_info ti;
        T_OK(ckptio_torch_tensor(t, i, &ti));
        T_ASSERT(strcmp(ti.name, names[i]) == 0 && ti.dtype == src[i].dtype && ti.nbytes == src[i].nbytes);
        /* F4 is float4_e2m1fn_x2 in torch: 4 packed pairs per row. */
        T_ASSERT(ti.shape[1] == (src[i].dtype == CKPTIO_DTYPE_F4 ? 2 : 4));
        uint8_t got[128];
        ckptio_tensor_target tg = {.index = i, .data = got, .capacity = sizeof got};
        T_OK(ckptio_torch_read(t, &tg, 1));
        T_ASSERT(memcmp(got, data[i], ti.nbytes) == 0);
    }
    ckptio_torch_close(t);
}

/* Files to refuse, each with its own error. */
static void test_bad_files(void) {
    ckptio_torch *t;
    t_write_file(t_path("legacy.pt"), "\x80\x02\x8a\x0a", 4);
    T_STATUS(ckptio_torch_open(engine, t_path("legacy.pt"), &t), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("legacy torch.save format");
    T_MESSAGE_HAS("legacy.pt");
    t_write_file(t_path("text.pt"), "hello world", 11);
    T_STATUS(ckptio_torch_open(engine, t_path("text.pt"), &t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not a zip header");

    size_t sid[3], len;
    ckptio_torch_writer *w = make_writer(sid);
    T_OK(ckptio_torch_save(engine, t_path("good.pt"), w, NULL));
    ckptio_torch_writer_destroy(w);
    uint8_t *good = t_read_file(t_path("good.pt"), &len);
    /* Truncated: end records gone. */
    t_write_file(t_path("trunc.pt"), good, len - 30);
    T_STATUS(ckptio_torch_open(engine, t_path("trunc.pt"), &t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("end-of-central-directory");
    /* A flipped data byte: opens, but verify names the record. */
    T_OK(ckptio_torch_parse(good, len, &t));
    ckptio_torch_storage_info si;
    T_OK(ckptio_torch_storage(t, 0, &si));
    ckptio_torch_close(t);
    uint8_t *bad = malloc(len);
    memcpy(bad, good, len);
    bad[si.file_offset + 5] ^= 0x40;
    t_write_file(t_path("crc.pt"), bad, len);
    T_OK(ckptio_torch_open(engine, t_path("crc.pt"), &t));
    T_STATUS(ckptio_torch_verify(t, NULL), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("good/data/0");
    T_MESSAGE_HAS("CRC-32");
    ckptio_torch_close(t);
    /* The pickle made hostile in place: 'ctorch\nFloatStorage' -> 'cposix\nsystem\n...'. */
    memcpy(bad, good, len);
    uint8_t *hit = memmem(bad, len, "ctorch\nFloatStorage\n", 20);
    T_ASSERT(hit);
    memcpy(hit, "cposix\nsystem\n\n\n\n\n\n\n", 20);
    T_STATUS(ckptio_torch_parse(bad, len, &t), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("'posix.system'");
    /* A record declared past the end of the file (central directory offset patched). */
    memcpy(bad, good, len);
    uint8_t *cd = memmem(bad, len, "PK\x01\x02", 4);
    ckptio__put32(cd + 42, (uint32_t)(len - 10));
    T_STATUS(ckptio_torch_parse(bad, len, &t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("does not fit before the central directory");
    /* Storage size in the pickle disagrees with the record. */
    memcpy(bad, good, len);
    hit = memmem(bad, len, "FloatStorage\nX\x01\x00\x00\x00" "0X\x03\x00\x00\x00" "cpuK\x18", 29);
    T_ASSERT(hit);
    hit[28] = 0x19;
    T_STATUS(ckptio_torch_parse(bad, len, &t), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("holds 96 bytes but the pickle declares 100");
    /* TorchScript: a constants.pkl record. */
    memcpy(bad, good, len);
    while ((hit = memmem(bad, len, "good/version", 12))) memcpy(hit, "good/constan", 12);
    T_STATUS(ckptio_torch_parse(bad, len, &t), CKPTIO_E_FORMAT); /* no version record now */
    T_MESSAGE_HAS("no 'good/version' record");
    memcpy(bad, good, len);
    while ((hit = memmem(bad, len, "good/.format_version", 20))) memcpy(hit, "good/constants.pkl\0\0", 20);
    T_STATUS(ckptio_torch_parse(bad, len, &t), CKPTIO_E_FORMAT);
    memcpy(bad, good, len);
    while ((hit = memmem(bad, len, "good/byteorder", 14))) memcpy(hit, "good/code/x.py", 14);
    T_STATUS(ckptio_torch_parse(bad, len, &t), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("TorchScript");
    free(bad);
    free(good);
}

/* torch.load reads what ckptio wrote: values, views, sharing, Parameter. */
static void test_torch_load(void) {
    if (system("python3 -c 'import torch' >/dev/null 2>&1") != 0) {
        printf("skip test_torch_load: python3 with torch not available\n");
        return;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "python3 - '%s' <<'EOF'\n"
             "import sys, torch, collections\n"
             "for wo in (True, False):\n"
             "    d = torch.load(sys.argv[1], weights_only=wo, map_location='cpu')\n"
             "    assert type(d) is collections.OrderedDict, type(d)\n"
             "    base = torch.arange(24, dtype=torch.float32).mul(0.5).view(4, 6)\n"
             "    assert torch.equal(d['a'], base)\n"
             "    assert torch.equal(d['view'], base.t()[1:3])\n"
             "    assert d['view'].stride() == (1, 6) and d['view'].storage_offset() == 1\n"
             "    assert d['view'].untyped_storage().data_ptr() == d['a'].untyped_storage().data_ptr()\n"
             "    assert d['tied'].untyped_storage().data_ptr() == d['a'].untyped_storage().data_ptr()\n"
             "    p = d['p']\n"
             "    assert isinstance(p, torch.nn.Parameter) and p.requires_grad and p.dtype == torch.float16\n"
             "    assert p.view(torch.int16).tolist() == [0x3c00 + i for i in range(6)]\n"
             "    f8 = d['nested']['f8']\n"
             "    assert f8.dtype == torch.float8_e4m3fn and "
             "f8.view(torch.uint8).tolist() == [0x30 + i for i in range(5)]\n"
             "    assert d['nested']['meta'] == [1, 2**70, 'x', b'\\x01', None, 1.5, (True,)], d['nested']['meta']\n"
             "print('torch.load ok')\n"
             "EOF",
             t_path("m.pt"));
    T_ASSERT_MSG(system(cmd) == 0, "torch.load rejected or misread the file ckptio wrote");
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_roundtrip);
    T_RUN(test_layout_reuse);
    T_RUN(test_zip64_offsets);
    T_RUN(test_all_dtypes);
    T_RUN(test_bad_files);
    T_RUN(test_torch_load);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
