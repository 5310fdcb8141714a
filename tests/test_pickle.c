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
    /* b'\x00\xff' exactly as torch.save pickles bytes (see FORMATS.md 2). */
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
    T_STATUS(RUN(&root, 0x80, 2, ']', 'q', 0, 'h', 0, 'a', '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("itself");
    T_STATUS(RUN(&root, 0x80, 2, ']', 'q', 0, ']', 'q', 1, 'h', 0, 'a', 'a', '.'), CKPTIO_E_FORMAT);
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
    T_STATUS(RUN(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'S', 'i', 'z', 'e', '\n', '.'), CKPTIO_E_UNSUPPORTED);
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

int main(void) {
    T_RUN(test_writer_opcodes);
    T_RUN(test_values);
    T_RUN(test_hostile);
    T_RUN(test_depth_cap);
    ckptio__value_pool_free(&pool);
    return T_EXIT_PASS;
}
