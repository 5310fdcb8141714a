/*
 * test_pickle.c - the protocol-2 pickle writer's opcodes and the restricted
 * unpickler: values it builds, and every kind of hostile stream refused
 * with its own status and a message naming the offset and the cause.
 */
#include "helpers.h"
#include "pickle_internal.h"

#include <string.h>

static void expect_bytes(const ckptio__pickle_buf *b, const void *want, size_t len, int line) {
    if (b->len != len || memcmp(b->data, want, len) != 0) {
        fprintf(stderr, "got:");
        for (size_t i = 0; i < b->len; i++) fprintf(stderr, " %02x", b->data[i]);
        fprintf(stderr, "\n");
        t_fail_at(__FILE__, line, "pickle bytes differ");
    }
}
#define EXPECT(b, ...)                                                  \
    do {                                                                \
        static const uint8_t want_[] = {__VA_ARGS__};                   \
        expect_bytes((b), want_, sizeof want_, __LINE__);               \
        ckptio__pickle_buf_free(b);                                     \
    } while (0)

/* Opcodes and encodings as Python's pickle (protocol 2) writes them. */
static void test_writer_opcodes(void) {
    ckptio__pickle_buf b = {0};
    ckptio__pickle_int(&b, 0);
    ckptio__pickle_int(&b, 255);
    EXPECT(&b, 'K', 0, 'K', 255);
    ckptio__pickle_int(&b, 256);
    ckptio__pickle_int(&b, 65535);
    EXPECT(&b, 'M', 0, 1, 'M', 0xff, 0xff);
    ckptio__pickle_int(&b, 65536);
    ckptio__pickle_int(&b, -1);
    ckptio__pickle_int(&b, INT32_MIN);
    EXPECT(&b, 'J', 0, 0, 1, 0, 'J', 0xff, 0xff, 0xff, 0xff, 'J', 0, 0, 0, 0x80);
    ckptio__pickle_int(&b, 2147483648LL);   /* pickle.dumps(2**31, 2): LONG1 5 bytes */
    ckptio__pickle_int(&b, -2147483649LL);  /* LONG1 5 bytes ff ff ff 7f ff */
    ckptio__pickle_int(&b, INT64_MIN);
    EXPECT(&b, 0x8a, 5, 0, 0, 0, 0x80, 0, 0x8a, 5, 0xff, 0xff, 0xff, 0x7f, 0xff, 0x8a, 8, 0, 0, 0, 0, 0, 0, 0, 0x80);
    ckptio__pickle_float(&b, 1.5);
    EXPECT(&b, 'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0);
    ckptio__pickle_str(&b, "h\xc3\xa9", 3);
    ckptio__pickle_bool(&b, true);
    ckptio__pickle_bool(&b, false);
    EXPECT(&b, 'X', 3, 0, 0, 0, 'h', 0xc3, 0xa9, 0x88, 0x89);
    /* b'\x00\xff' exactly as torch.save pickles bytes (see docs/FORMATS.md section 2). */
    ckptio__pickle_bytes(&b, (const uint8_t *)"\x00\xff", 2);
    EXPECT(&b, 'c', '_', 'c', 'o', 'd', 'e', 'c', 's', '\n', 'e', 'n', 'c', 'o', 'd', 'e', '\n', 'X', 3, 0, 0, 0, 0,
           0xc3, 0xbf, 'X', 6, 0, 0, 0, 'l', 'a', 't', 'i', 'n', '1', 0x86, 'R');
    ckptio__pickle_proto(&b);
    ckptio__pickle_global(&b, "torch", "Size");
    EXPECT(&b, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'S', 'i', 'z', 'e', '\n');
    uint8_t big[256] = {0};
    ckptio__pickle_long1(&b, big, 256);
    T_ASSERT(b.failed);
    T_MESSAGE_HAS("exceeds LONG1");
    ckptio__pickle_buf_free(&b);
}

static ckptio__value_pool pool;

static ckptio_status run(const void *bytes, size_t len, ckptio_value **root) {
    ckptio__value_pool_free(&pool);
    return ckptio__unpickle(bytes, len, "f.pt", "f/data.pkl", 1000, &pool, root);
}
#define RUN(root, ...)                                              \
    ({                                                              \
        static const uint8_t p_[] = {__VA_ARGS__};                  \
        run(p_, sizeof p_, (root));                                 \
    })

/* What pickle.dumps(..., protocol=2) produces for plain values. */
static void test_values(void) {
    ckptio_value *root;
    /* {'a': [1, -2, 2**70], 'b': (None, True, 1.5), 'c': b'\x00\xff'} with the memo */
    T_OK(RUN(&root, 0x80, 2, '}', 'q', 0, '(', 'X', 1, 0, 0, 0, 'a', 'q', 1, ']', 'q', 2, '(', 'K', 1, 'J', 0xfe, 0xff,
             0xff, 0xff, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 'e', 'X', 1, 0, 0, 0, 'b', 'q', 3, 'N', 0x88, 'G', 0x3f,
             0xf8, 0, 0, 0, 0, 0, 0, 0x87, 'q', 4, 'X', 1, 0, 0, 0, 'c', 'c', '_', 'c', 'o', 'd', 'e', 'c', 's', '\n',
             'e', 'n', 'c', 'o', 'd', 'e', '\n', 'X', 3, 0, 0, 0, 0, 0xc3, 0xbf, 'X', 6, 0, 0, 0, 'l', 'a', 't', 'i',
             'n', '1', 0x86, 'R', 'u', '.'));
    T_ASSERT(ckptio_value_kind_of(root) == CKPTIO_VALUE_DICT);
    size_t n;
    T_OK(ckptio_value_len(root, &n));
    T_ASSERT(n == 3);
    int ordered = 1;
    T_OK(ckptio_value_dict_ordered(root, &ordered));
    T_ASSERT(!ordered);
    const ckptio_value *k, *v, *x;
    const char *s;
    size_t len;
    T_OK(ckptio_value_dict_item(root, 0, &k, &v));
    T_OK(ckptio_value_bytes(k, &s, &len));
    T_ASSERT(len == 1 && s[0] == 'a');
    T_ASSERT(ckptio_value_kind_of(v) == CKPTIO_VALUE_LIST);
    int64_t i64;
    T_OK(ckptio_value_item(v, 1, &x));
    T_OK(ckptio_value_int(x, &i64));
    T_ASSERT(i64 == -2);
    T_OK(ckptio_value_item(v, 2, &x));
    T_ASSERT(ckptio_value_kind_of(x) == CKPTIO_VALUE_BIGINT);
    T_STATUS(ckptio_value_int(x, &i64), CKPTIO_E_RANGE);
    T_OK(ckptio_value_bytes(x, &s, &len));
    T_ASSERT(len == 9 && (uint8_t)s[8] == 0x40);
    T_OK(ckptio_value_dict_item(root, 1, &k, &v));
    T_ASSERT(ckptio_value_kind_of(v) == CKPTIO_VALUE_TUPLE);
    T_OK(ckptio_value_item(v, 2, &x));
    double f;
    T_OK(ckptio_value_float(x, &f));
    T_ASSERT(f == 1.5);
    T_OK(ckptio_value_item(v, 1, &x));
    int b;
    T_OK(ckptio_value_bool(x, &b));
    T_ASSERT(b == 1);
    T_STATUS(ckptio_value_float(x, &f), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("is a bool, not a float");
    T_OK(ckptio_value_dict_item(root, 2, &k, &v));
    T_OK(ckptio_value_bytes(v, &s, &len));
    T_ASSERT(ckptio_value_kind_of(v) == CKPTIO_VALUE_BYTES && len == 2 && s[0] == 0 && (uint8_t)s[1] == 0xff);
    /* OrderedDict with BUILD state (module state_dict _metadata), protocol 4 with FRAME + MEMOIZE. */
    T_OK(RUN(&root, 0x80, 4, 0x95, 20, 0, 0, 0, 0, 0, 0, 0, 0x8c, 11, 'c', 'o', 'l', 'l', 'e', 'c', 't', 'i', 'o', 'n',
             's', 0x94, 0x8c, 11, 'O', 'r', 'd', 'e', 'r', 'e', 'd', 'D', 'i', 'c', 't', 0x93, 0x94, ')', 'R', 0x94,
             '}', 0x8c, 1, 'm', 'K', 7, 's', 'b', '.'));
    T_OK(ckptio_value_dict_ordered(root, &ordered));
    T_ASSERT(ordered);
    const ckptio_value *attrs;
    T_OK(ckptio_value_dict_attrs(root, &attrs));
    T_ASSERT(attrs && ckptio_value_kind_of(attrs) == CKPTIO_VALUE_DICT);
    /* torch.device('cuda', 1), torch.Size, torch.float8_e4m3fn, set */
    T_OK(RUN(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'd', 'e', 'v', 'i', 'c', 'e', '\n', 'X', 4, 0, 0, 0,
             'c', 'u', 'd', 'a', 'K', 1, 0x86, 'R', '.'));
    T_ASSERT(ckptio_value_kind_of(root) == CKPTIO_VALUE_DEVICE);
    T_OK(ckptio_value_bytes(root, &s, &len));
    T_ASSERT(strcmp(s, "cuda:1") == 0);
    T_OK(RUN(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'f', 'l', 'o', 'a', 't', '8', '_', 'e', '4', 'm', '3',
             'f', 'n', '\n', '.'));
    ckptio_dtype dt;
    T_OK(ckptio_value_dtype(root, &dt));
    T_ASSERT(dt == CKPTIO_DTYPE_F8_E4M3);
    T_OK(RUN(&root, 0x80, 2, 'c', '_', '_', 'b', 'u', 'i', 'l', 't', 'i', 'n', '_', '_', '\n', 's', 'e', 't', '\n', ']',
             '(', 'K', 1, 'K', 2, 'e', 0x85, 'R', '.'));
    T_ASSERT(ckptio_value_kind_of(root) == CKPTIO_VALUE_SET);
    T_OK(ckptio_value_len(root, &n));
    T_ASSERT(n == 2);
}

static void test_hostile(void) {
    ckptio_value *root;
    /* Arbitrary code: refused by name, before anything else runs. */
    T_STATUS(RUN(&root, 0x80, 2, 'c', 'o', 's', '\n', 's', 'y', 's', 't', 'e', 'm', '\n', 'X', 2, 0, 0, 0, 'l', 's',
                 0x85, 'R', '.'),
             CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("global 'os.system' is not in the allowlist");
    T_MESSAGE_HAS("f.pt: unpickle at offset 1002");
    T_MESSAGE_HAS("f/data.pkl");
    T_STATUS(RUN(&root, 0x80, 2, 'c', 'b', 'u', 'i', 'l', 't', 'i', 'n', 's', '\n', 'e', 'v', 'a', 'l', '\n', '.'),
             CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("builtins.eval");
    /* Via STACK_GLOBAL too. */
    T_STATUS(RUN(&root, 0x80, 4, 0x8c, 2, 'o', 's', 0x8c, 6, 's', 'y', 's', 't', 'e', 'm', 0x93, '.'),
             CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("os.system");
    /* Allowed by torch, not implemented here: a clear "not supported". */
    T_STATUS(RUN(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '.', '_', 'u', 't', 'i', 'l', 's', '\n', '_', 'r', 'e',
                 'b', 'u', 'i', 'l', 'd', '_', 'q', 't', 'e', 'n', 's', 'o', 'r', '\n', '.'),
             CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("_rebuild_qtensor");
    /* Opcodes outside the weights-only set. */
    T_STATUS(RUN(&root, 0x80, 2, 'i', 'o', 's', '\n', 's', 'y', 's', 't', 'e', 'm', '\n', '.'), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("opcode 'i'");
    T_STATUS(RUN(&root, 0x80, 2, ')', 0x81, '.'), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("0x81");
    /* Truncations and huge declared sizes. */
    T_STATUS(RUN(&root, 0x80, 2, 'X', 0xff, 0xff, 0xff, 0x7f, 'a', 'b'), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("2147483647 bytes needed, 2 left");
    T_STATUS(RUN(&root, 0x80, 4, 0x8d, 0, 0, 0, 0, 0, 0, 0, 0x80, '.'), CKPTIO_E_TRUNCATED);
    T_STATUS(RUN(&root, 0x80, 2, 'N'), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("without STOP");
    T_STATUS(RUN(&root, 0x80, 2, 'c', 'o', 's'), CKPTIO_E_TRUNCATED);
    T_STATUS(RUN(&root, 0x80, 7, 'N', '.'), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("protocol 7");
    /* Memo abuse: enormous indices, reading slots never written. */
    T_STATUS(RUN(&root, 0x80, 2, 'N', 'r', 0xf0, 0xff, 0xff, 0xff, '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("memo index 4294967280");
    T_STATUS(RUN(&root, 0x80, 2, 'h', 3, '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("memo slot 3 was never stored");
    /* Cycles: a list appended to itself, and two lists holding each other. */
    T_STATUS(RUN(&root, 0x80, 2, ']', 'q', 0, 'h', 0, 'a', '.'), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("itself");
    T_STATUS(RUN(&root, 0x80, 2, ']', 'q', 0, ']', 'q', 1, 'h', 0, 'a', 'a', '.'), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("recursive structure");
    /* Stack abuse. */
    T_STATUS(RUN(&root, 0x80, 2, 'a', '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("stack underflow");
    T_STATUS(RUN(&root, 0x80, 2, 'N', 'N', '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("STOP with 2 values");
    T_STATUS(RUN(&root, 0x80, 2, '(', 'N', 'u', '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("no container below the MARK");
    T_STATUS(RUN(&root, 0x80, 2, 'N', ')', 'R', '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not an allowlisted callable");
    /* A bare storage or global cannot be the result. */
    T_STATUS(RUN(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'S', 'i', 'z', 'e', '\n', '.'),
             CKPTIO_E_UNSUPPORTED);
    /* Invalid UTF-8 in a string. */
    T_STATUS(RUN(&root, 0x80, 2, 'X', 2, 0, 0, 0, 0xc3, 0x28, '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("UTF-8");
    /* Persistent ids other than storages. */
    T_STATUS(RUN(&root, 0x80, 2, 'K', 1, 'Q', '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("persistent id");
}

/* 600 nested lists exceed the depth cap. */
static void test_depth_cap(void) {
    uint8_t p[2 + 600 + 600 + 1];
    size_t n = 0;
    p[n++] = 0x80;
    p[n++] = 2;
    for (int i = 0; i < 600; i++) p[n++] = ']';
    for (int i = 0; i < 599; i++) p[n++] = 'a';
    p[n++] = '.';
    ckptio_value *root;
    T_STATUS(run(p, n, &root), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("nested deeper than 512");
    /* 500 levels are fine. */
    n = 2;
    for (int i = 0; i < 500; i++) p[n++] = ']';
    for (int i = 0; i < 499; i++) p[n++] = 'a';
    p[n++] = '.';
    T_OK(run(p, n, &root));
}


/* ---- DCP .metadata mode ----------------------------------------------------------- */

static ckptio_pickle *dcp_handle;

static ckptio_status dcp_parse(const void *bytes, size_t len, const ckptio_value **root) {
    ckptio_pickle_close(dcp_handle);
    dcp_handle = NULL;
    ckptio_status st = ckptio_pickle_parse_dcp_metadata(bytes, len, "ck/.metadata", &dcp_handle);
    if (st == CKPTIO_OK) st = ckptio_pickle_root(dcp_handle, root);
    return st;
}
#define DCP(root, lit) dcp_parse((lit), sizeof(lit) - 1, (root))

static const ckptio_value *field(const ckptio_value *obj, const char *name) {
    const ckptio_value *state = NULL, *k, *v;
    size_t n = 0;
    T_OK(ckptio_value_object(obj, NULL, NULL, &state));
    T_OK(ckptio_value_len(state, &n));
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        T_OK(ckptio_value_dict_item(state, i, &k, &v));
        T_OK(ckptio_value_bytes(k, &s, &len));
        if (strcmp(s, name) == 0) return v;
    }
    t_fail_at(__FILE__, __LINE__, "field not found");
    return NULL;
}

static void expect_class(const ckptio_value *v, const char *want) {
    const char *cls = NULL;
    T_ASSERT(ckptio_value_kind_of(v) == CKPTIO_VALUE_OBJECT);
    T_OK(ckptio_value_object(v, &cls, NULL, NULL));
    T_ASSERT_MSG(strcmp(cls, want) == 0, "class %s, want %s", cls, want);
}

/* A .metadata written by torch 2.15's FileSystemWriter (tests/data/dcp/). */
static void test_dcp_real_metadata(void) {
    const char *dir = getenv("CKPTIO_TEST_DATA");
    char path[512];
    snprintf(path, sizeof path, "%s/dcp/torch_save.metadata", dir ? dir : "tests/data");
    size_t len = 0;
    uint8_t *bytes = t_read_file(path, &len);
    const ckptio_value *root, *v, *x, *args;
    T_OK(dcp_parse(bytes, len, &root));
    expect_class(root, "torch.distributed.checkpoint.metadata.Metadata");
    T_OK(ckptio_value_object(root, NULL, &args, NULL));
    size_t n = 9;
    T_OK(ckptio_value_len(args, &n));
    T_ASSERT(n == 0); /* NEWOBJ(cls, ()) */
    const char *s;
    size_t sl;
    T_OK(ckptio_value_bytes(field(root, "version"), &s, &sl));
    T_ASSERT(strcmp(s, "1.0.0") == 0);
    const ckptio_value *sdm = field(root, "state_dict_metadata"), *k;
    T_OK(ckptio_value_len(sdm, &n));
    T_ASSERT(n == 5);
    T_OK(ckptio_value_dict_item(sdm, 0, &k, &v));
    T_OK(ckptio_value_bytes(k, &s, &sl));
    T_ASSERT(strcmp(s, "w") == 0);
    expect_class(v, "torch.distributed.checkpoint.metadata.TensorStorageMetadata");
    x = field(v, "size");
    expect_class(x, "torch.Size");
    T_OK(ckptio_value_object(x, NULL, &args, NULL));
    T_OK(ckptio_value_item(args, 0, &x));
    T_OK(ckptio_value_item(x, 0, &x));
    int64_t i64;
    T_OK(ckptio_value_int(x, &i64));
    T_ASSERT(i64 == 4);
    const ckptio_value *props = field(v, "properties"), *st;
    expect_class(props, "torch.distributed.checkpoint.metadata.TensorProperties");
    T_OK(ckptio_value_object(props, NULL, NULL, &st));
    T_ASSERT(ckptio_value_kind_of(st) == CKPTIO_VALUE_TUPLE); /* __getstate__ tuple */
    ckptio_dtype dt;
    T_OK(ckptio_value_item(st, 0, &x));
    T_OK(ckptio_value_dtype(x, &dt));
    T_ASSERT(dt == CKPTIO_DTYPE_F32);
    T_OK(ckptio_value_item(st, 1, &x));
    expect_class(x, "torch.serialization._get_layout");
    T_OK(ckptio_value_object(x, NULL, &args, NULL));
    T_OK(ckptio_value_item(args, 0, &x));
    T_OK(ckptio_value_bytes(x, &s, &sl));
    T_ASSERT(strcmp(s, "torch.strided") == 0);
    T_OK(ckptio_value_item(st, 3, &x));
    expect_class(x, "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING");
    const ckptio_value *chunks = field(v, "chunks");
    T_ASSERT(ckptio_value_kind_of(chunks) == CKPTIO_VALUE_LIST);
    T_OK(ckptio_value_item(chunks, 0, &x));
    expect_class(x, "torch.distributed.checkpoint.metadata.ChunkStorageMetadata");
    const ckptio_value *sd = field(root, "storage_data");
    T_OK(ckptio_value_dict_item(sd, 0, &k, &v));
    expect_class(k, "torch.distributed.checkpoint.metadata.MetadataIndex");
    expect_class(v, "torch.distributed.checkpoint.filesystem._StorageInfo");
    T_OK(ckptio_value_bytes(field(v, "relative_path"), &s, &sl));
    T_ASSERT(strcmp(s, "__0_0.distcp") == 0);
    x = field(field(root, "storage_meta"), "checkpoint_id");
    expect_class(x, "pathlib.PosixPath");
    /* Not an object: the accessor says so. */
    T_STATUS(ckptio_value_object(field(root, "version"), NULL, NULL, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("not an object");
    /* Every cut of the file is refused (the STOP is its last byte), never read past. */
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *part = malloc(cut ? cut : 1);
        memcpy(part, bytes, cut);
        ckptio_status got = dcp_parse(part, cut, &root);
        free(part);
        T_ASSERT_MSG(got == CKPTIO_E_TRUNCATED || got == CKPTIO_E_FORMAT, "cut at %zu: status %d", cut, (int)got);
    }
    T_STATUS(dcp_parse(bytes, len - 1, &root), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("ck/.metadata");
    T_MESSAGE_HAS("pickle ends without STOP");
    free(bytes);
}

static void test_dcp_hostile(void) {
    const ckptio_value *root;
    /* os.system('ls') by GLOBAL + REDUCE: refused at the GLOBAL, naming it and the offset. */
    T_STATUS(DCP(&root, "\x80\x02" "cos\nsystem\nX\x02\x00\x00\x00" "ls\x85R."), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("global 'os.system' is not in the DCP metadata allowlist");
    T_MESSAGE_HAS("ck/.metadata");
    T_MESSAGE_HAS("offset 2");
    /* builtins.eval by STACK_GLOBAL (protocol 4), and the Python 2 spelling. */
    T_STATUS(DCP(&root, "\x80\x04\x8c\x08" "builtins\x8c\x04" "eval\x93."), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("global 'builtins.eval'");
    T_STATUS(DCP(&root, "\x80\x02" "c__builtin__\neval\n."), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("global 'builtins.eval'");
    T_STATUS(DCP(&root, "\x80\x02" "csubprocess\nPopen\n."), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("global 'subprocess.Popen'");
    /* A neighbour of an allowlisted name, and torch.save's callables, are refused too. */
    T_STATUS(DCP(&root, "\x80\x02" "ctorch.distributed.checkpoint.metadata\n__builtins__\n."), CKPTIO_E_DISALLOWED);
    T_STATUS(DCP(&root, "\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n."), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("'torch._utils._rebuild_tensor_v2'");
    /* INST/OBJ and persistent ids. */
    T_STATUS(DCP(&root, "\x80\x02" "ios\nsystem\n."), CKPTIO_E_DISALLOWED);
    T_STATUS(DCP(&root, "\x80\x02K\x01Q."), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("BINPERSID");
    /* NEWOBJ of a value, not a class. */
    T_STATUS(DCP(&root, "\x80\x02K\x01)\x81."), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("not an allowlisted DCP class");
    /* An allowlisted class may be instantiated, not stored as a value (in a list, a nested tuple, the root). */
    T_STATUS(DCP(&root, "\x80\x02]ctorch\nSize\na."), CKPTIO_E_FORMAT);
    T_STATUS(DCP(&root, "\x80\x02]ctorch\nSize\n\x85\x85" "a."), CKPTIO_E_FORMAT);
    T_STATUS(DCP(&root, "\x80\x02" "ctorch\nSize\n."), CKPTIO_E_UNSUPPORTED);
    T_STATUS(DCP(&root, "\x80\x02" "ctorch\nSize\nctorch\nSize\n\x85\x85R."), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("hold a class or global");
    /* BUILD twice, or after the object was stored in a container (no cycles). */
    T_STATUS(DCP(&root, "\x80\x02" "ctorch.distributed.checkpoint.metadata\nMetadataIndex\n)\x81}b}b."),
             CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("second BUILD of the same torch.distributed.checkpoint.metadata.MetadataIndex");
    T_STATUS(DCP(&root, "\x80\x02" "ctorch.distributed.checkpoint.metadata\nMetadataIndex\n)\x81q\x00]h\x00" "a0}b."),
             CKPTIO_E_UNSUPPORTED);
    /* What the reader does not build, verify does not pass: state on a class that takes none, a dict's attributes. */
    T_STATUS(DCP(&root, "\x80\x02" "cpathlib\nPosixPath\n)\x81}b."), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("pathlib.PosixPath with BUILD state (the class takes none)");
    T_STATUS(DCP(&root, "\x80\x02" "ccollections\nOrderedDict\n)R}X\x01\x00\x00\x00xK\x01sb."), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("a dict with attributes (BUILD state) does not occur in DCP metadata");
    /* Allowed: REDUCE/NEWOBJ + BUILD, OrderedDict, dtypes; pathlib._local is the 3.13 name. */
    T_OK(DCP(&root, "\x80\x02" "cpathlib._local\nPosixPath\nX\x01\x00\x00\x00/\x85R."));
    expect_class(root, "pathlib.PosixPath");
    T_OK(DCP(&root, "\x80\x02" "ccollections\nOrderedDict\n)RX\x01\x00\x00\x00" "kctorch\nbfloat16\ns."));
    T_ASSERT(ckptio_value_kind_of(root) == CKPTIO_VALUE_DICT);
    /* The state-dict mode still refuses the DCP classes. */
    ckptio_value *r2;
    T_STATUS(RUN(&r2, 0x80, 2, 'c', 'p', 'a', 't', 'h', 'l', 'i', 'b', '\n',
                 'P', 'o', 's', 'i', 'x', 'P', 'a', 't', 'h', '\n', '.'),
             CKPTIO_E_DISALLOWED);
    ckptio_pickle *none = (ckptio_pickle *)&r2;
    T_STATUS(ckptio_pickle_parse_dcp_metadata(NULL, 4, NULL, &none), CKPTIO_E_INVAL);
    T_ASSERT(none == NULL);
    T_STATUS(DCP(&root, ""), CKPTIO_E_TRUNCATED);
    ckptio_pickle_close(dcp_handle);
    dcp_handle = NULL;
}

int main(void) {
    T_RUN(test_writer_opcodes);
    T_RUN(test_values);
    T_RUN(test_hostile);
    T_RUN(test_depth_cap);
    T_RUN(test_dcp_real_metadata);
    T_RUN(test_dcp_hostile);
    ckptio__value_pool_free(&pool);
    return T_EXIT_PASS;
}
