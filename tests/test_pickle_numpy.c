/*
 * test_pickle_numpy.c - numpy values in a state-dict pickle: arrays,
 * scalars and dtypes as numpy pickles them (both module spellings,
 * protocols 2 and 4) become data nodes with their exact bytes; every other
 * numpy form is refused with its own status. Also what Python could not
 * build (unhashable keys and set items, bad devices, OrderedDict attributes
 * that break the object) and the linear walk over shared references.
 */
#include "helpers.h"
#include "pickle_internal.h"
#include "torch_internal.h"

#include <string.h>

/* Pickles made by numpy 2.4 (pickle.dumps, pickletools.optimize), kept as bytes. */
/* scalar_f8 */
static const char scalar_f8[] =
    "\x80\x02" "cnumpy._core.multiarray\x0ascalar\x0a" "cnumpy\x0a" "dtype\x0aX\x02\x00\x00\x00" "f8\x89\x88"
    "\x87R(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tbc_codecs\x0a" "encode\x0aX\x09"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x00\xc3\xb8\x3fX\x06\x00\x00\x00latin1\x86R\x86R.";

/* array_be_i4 */
static const char array_be_i4[] =
    "\x80\x02" "cnumpy.core.multiarray\x0a_reconstruct\x0a" "cnumpy\x0andarray\x0aK\x00\x85" "c_codecs\x0a"
    "encode\x0aq\x00X\x01\x00\x00\x00" "bX\x06\x00\x00\x00latin1q\x01\x86R\x87R(K\x01K\x02K\x03\x86" "cnu"
    "mpy\x0a" "dtype\x0aX\x02\x00\x00\x00i4\x89\x88\x87R(K\x03X\x01\x00\x00\x00>NNNJ\xff\xff\xff\xffJ\xff"
    "\xff\xff\xffK\x00tb\x89h\x00X\x18\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00"
    "\x00\x03\x00\x00\x00\x04\x00\x00\x00\x05h\x01\x86Rtb.";

/* fortran_f2_p4 */
static const char fortran_f2_p4[] =
    "\x80\x04\x95\x84\x00\x00\x00\x00\x00\x00\x00\x8c\x16numpy._core.multiarray\x8c\x0c_reconstruct\x93\x8c"
    "\x05numpy\x94\x8c\x07ndarray\x93K\x00\x85" "C\x01" "b\x87R(K\x01K\x03K\x02\x86h\x00\x8c\x05" "dtype\x93"
    "\x8c\x02" "f2\x89\x88\x87R(K\x03\x8c\x01<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x88" "C\x0c\x00"
    "\x00\x00<\x00@\x00" "B\x00" "D\x00" "Etb.";

/* empty_u2 */
static const char empty_u2[] =
    "\x80\x02" "cnumpy._core.multiarray\x0a_reconstruct\x0a" "cnumpy\x0andarray\x0aK\x00\x85" "c_codecs\x0a"
    "encode\x0aX\x01\x00\x00\x00" "bX\x06\x00\x00\x00latin1\x86R\x87R(K\x01K\x00K\x03\x86" "cnumpy\x0a" "d"
    "type\x0aX\x02\x00\x00\x00u2\x89\x88\x87R(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xff"
    "K\x00tb\x89" "c__builtin__\x0a" "bytes\x0a)Rtb.";

/* object_array */
static const char object_array[] =
    "\x80\x02" "cnumpy._core.multiarray\x0a_reconstruct\x0a" "cnumpy\x0andarray\x0aK\x00\x85" "c_codecs\x0a"
    "encode\x0aX\x01\x00\x00\x00" "bX\x06\x00\x00\x00latin1\x86R\x87R(K\x01K\x02\x85" "cnumpy\x0a" "dtype"
    "\x0aX\x02\x00\x00\x00O8\x89\x88\x87R(K\x03X\x01\x00\x00\x00|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x3f"
    "tb\x89](NK\x01" "etb.";

/* str_array */
static const char str_array[] =
    "\x80\x02" "cnumpy._core.multiarray\x0a_reconstruct\x0a" "cnumpy\x0andarray\x0aK\x00\x85" "c_codecs\x0a"
    "encode\x0aq\x00X\x01\x00\x00\x00" "bX\x06\x00\x00\x00latin1q\x01\x86R\x87R(K\x01K\x01\x85" "cnumpy\x0a"
    "dtype\x0aX\x02\x00\x00\x00U2\x89\x88\x87R(K\x03X\x01\x00\x00\x00<NNNK\x08K\x04K\x08tb\x89h\x00X\x08\x00"
    "\x00\x00" "a\x00\x00\x00" "b\x00\x00\x00h\x01\x86Rtb.";

/* datetime */
static const char datetime[] =
    "\x80\x02" "cnumpy._core.multiarray\x0ascalar\x0a" "cnumpy\x0a" "dtype\x0aX\x02\x00\x00\x00M8\x89\x88"
    "\x87R(K\x04X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00N(c_codecs\x0a" "encode\x0aq\x00"
    "X\x01\x00\x00\x00" "DX\x06\x00\x00\x00latin1q\x01\x86RK\x01K\x01K\x01t\x86tbh\x00X\x08\x00\x00\x00VG"
    "\x00\x00\x00\x00\x00\x00h\x01\x86R\x86R.";

/* key_array */
static const char key_array[] =
    "\x80\x02}cnumpy._core.multiarray\x0a_reconstruct\x0a" "cnumpy\x0andarray\x0aK\x00\x85" "c_codecs\x0a"
    "encode\x0aq\x00X\x01\x00\x00\x00" "bX\x06\x00\x00\x00latin1q\x01\x86R\x87R(K\x01K\x01\x85" "cnumpy\x0a"
    "dtype\x0aX\x02\x00\x00\x00u1\x89\x88\x87R(K\x03X\x01\x00\x00\x00|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xff"
    "K\x00tb\x89h\x00X\x01\x00\x00\x00\x00h\x01\x86RtbK\x01s.";

static ckptio__value_pool pool;

static ckptio_status run_len(const char *bytes, size_t len, ckptio_value **root) {
    ckptio__value_pool_free(&pool);
    return ckptio__unpickle((const uint8_t *)bytes, len, "f.pt", "f/data.pkl", 0, &pool, root);
}
#define RUN(lit, root) run_len((lit), sizeof(lit) - 1, (root))
#define RUNB(root, ...)                                             \
    ({                                                              \
        static const uint8_t p_[] = {__VA_ARGS__};                  \
        run_len((const char *)p_, sizeof p_, (root));               \
    })

static const ckptio_value *arg(const ckptio_value *obj, size_t i) {
    const ckptio_value *args = NULL, *item = NULL;
    T_OK(ckptio_value_object(obj, NULL, &args, NULL));
    T_OK(ckptio_value_item(args, i, &item));
    return item;
}

static void expect_object(const ckptio_value *v, const char *cls) {
    const char *name = NULL;
    T_ASSERT(ckptio_value_kind_of(v) == CKPTIO_VALUE_OBJECT);
    T_OK(ckptio_value_object(v, &name, NULL, NULL));
    T_ASSERT_MSG(strcmp(name, cls) == 0, "class %s, expected %s", name, cls);
}

static void expect_str(const ckptio_value *v, const char *want) {
    const char *s = NULL;
    size_t n = 0;
    T_OK(ckptio_value_bytes(v, &s, &n));
    T_ASSERT_MSG(n == strlen(want) && memcmp(s, want, n) == 0, "got '%.*s', expected '%s'", (int)n, s, want);
}

static void expect_bytes(const ckptio_value *v, const void *want, size_t len) {
    const char *s = NULL;
    size_t n = 0;
    T_ASSERT(ckptio_value_kind_of(v) == CKPTIO_VALUE_BYTES);
    T_OK(ckptio_value_bytes(v, &s, &n));
    T_ASSERT(n == len && memcmp(s, want, len) == 0);
}

/* The dtype node of an array or scalar: its text with the byte order. */
static void expect_dtype(const ckptio_value *dtype, const char *descr) {
    expect_object(dtype, "numpy.dtype");
    expect_str(arg(dtype, 0), descr);
}

static void expect_shape(const ckptio_value *shape, size_t ndim, const int64_t *dims) {
    size_t n = 0;
    T_OK(ckptio_value_len(shape, &n));
    T_ASSERT(n == ndim);
    for (size_t i = 0; i < n; i++) {
        const ckptio_value *d = NULL;
        int64_t x = -1;
        T_OK(ckptio_value_item(shape, i, &d));
        T_OK(ckptio_value_int(d, &x));
        T_ASSERT(x == dims[i]);
    }
}

static void test_values(void) {
    ckptio_value *root;
    /* np.float64(1.5): a scalar holding its 8 bytes. */
    T_OK(RUN(scalar_f8, &root));
    expect_object(root, "numpy.generic");
    expect_dtype(arg(root, 0), "<f8");
    const double x = 1.5;
    expect_bytes(arg(root, 1), &x, 8);
    /* A big-endian int32 array, spelled numpy.core (numpy 1.x). */
    T_OK(RUN(array_be_i4, &root));
    expect_object(root, "numpy.ndarray");
    expect_dtype(arg(root, 0), ">i4");
    expect_shape(arg(root, 1), 2, (const int64_t[]){2, 3});
    int fortran = 1;
    T_OK(ckptio_value_bool(arg(root, 2), &fortran));
    T_ASSERT(!fortran);
    expect_bytes(arg(root, 3), "\0\0\0\0\0\0\0\1\0\0\0\2\0\0\0\3\0\0\0\4\0\0\0\5", 24);
    /* Protocol 4 (bytes as BINBYTES), a Fortran-ordered float16 array. */
    T_OK(RUN(fortran_f2_p4, &root));
    expect_dtype(arg(root, 0), "<f2");
    expect_shape(arg(root, 1), 2, (const int64_t[]){3, 2});
    T_OK(ckptio_value_bool(arg(root, 2), &fortran));
    T_ASSERT(fortran);
    expect_bytes(arg(root, 3), "\0\0\0\x3c\0\x40\0\x42\0\x44\0\x45", 12);
    /* An empty array: protocol 2 pickles b'' as builtins.bytes(). */
    T_OK(RUN(empty_u2, &root));
    expect_dtype(arg(root, 0), "<u2");
    expect_shape(arg(root, 1), 2, (const int64_t[]){0, 3});
    expect_bytes(arg(root, 3), "", 0);
}

/* Patches the first occurrence of `from` in a copy of a pickle (same length; no NUL in either). */
static ckptio_status run_patched(const char *lit, size_t len, const char *from, const char *to, ckptio_value **root) {
    static char buf[4096];
    T_ASSERT(len <= sizeof buf && strlen(from) == strlen(to));
    memcpy(buf, lit, len);
    size_t at = 0;
    while (at + strlen(from) <= len && memcmp(buf + at, from, strlen(from)) != 0) at++;
    T_ASSERT(at + strlen(from) <= len);
    memcpy(buf + at, to, strlen(to));
    return run_len(buf, len, root);
}
#define PATCHED(lit, from, to, root) run_patched((lit), sizeof(lit) - 1, (from), (to), (root))

static void test_refused(void) {
    ckptio_value *root;
    /* Dtypes other than bool/int/uint/float/complex: object, str, datetime. */
    T_STATUS(RUN(object_array, &root), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("numpy dtype 'O8'");
    T_STATUS(RUN(str_array, &root), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("numpy dtype 'U2'");
    T_STATUS(RUN(datetime, &root), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("numpy dtype 'M8'");
    /* Data that does not match the shape: numpy refuses it too. */
    T_STATUS(PATCHED(array_be_i4, "K\x02K\x03\x86", "K\x02K\x04\x86", &root), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("24 bytes of data");
    T_MESSAGE_HAS("f.pt: unpickle at offset");
    /* A scalar whose data is not one element. */
    T_STATUS(PATCHED(scalar_f8, "f8\x89", "f4\x89", &root), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("its data is not 4 bytes");
    /* Another byte order than numpy writes, another dtype state version. */
    T_STATUS(PATCHED(scalar_f8, "<NNN", "|NNN", &root), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("byte order '|'");
    T_STATUS(PATCHED(scalar_f8, "R(K\x03", "R(K\x04", &root), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("state version 4");
    /* Subclasses and other numpy callables are not on the allowlist. */
    T_STATUS(PATCHED(array_be_i4, "cnumpy\x0andarray", "cnumpy\x0amatrix ", &root), CKPTIO_E_DISALLOWED);
    T_STATUS(PATCHED(scalar_f8, "multiarray\x0ascalar", "multiarray\x0ascala_", &root), CKPTIO_E_DISALLOWED);
    /* _reconstruct of anything but (ndarray, (0,), b'b'). */
    T_STATUS(PATCHED(array_be_i4, "bX\x06", "cX\x06", &root), CKPTIO_E_UNSUPPORTED);
    /* An array is unhashable: not a dict key. */
    T_STATUS(RUN(key_array, &root), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("numpy array as a dict key");
    /* An array used before its BUILD: _reconstruct(...) put in a list. */
    T_STATUS(RUNB(&root, 0x80, 2, ']', 'c', 'n', 'u', 'm', 'p', 'y', '.', 'c', 'o', 'r', 'e', '.', 'm', 'u', 'l', 't',
                  'i', 'a', 'r', 'r', 'a', 'y', '\n', '_', 'r', 'e', 'c', 'o', 'n', 's', 't', 'r', 'u', 'c', 't', '\n',
                  'c', 'n', 'u', 'm', 'p', 'y', '\n', 'n', 'd', 'a', 'r', 'r', 'a', 'y', '\n', 'K', 0, 0x85, 'C', 1,
                  'b', 0x87, 'R', 'a', '.'),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("numpy.ndarray is used before BUILD");
    /* A second BUILD of a finished scalar. */
    T_STATUS(RUNB(&root, 0x80, 2, 'c', 'n', 'u', 'm', 'p', 'y', '\n', 'd', 't', 'y', 'p', 'e', '\n', 'X', 2, 0, 0, 0,
                  'u', '1', 0x89, 0x88, 0x87, 'R', '(', 'K', 3, 'X', 1, 0, 0, 0, '|', 'N', 'N', 'N', 'J', 0xff, 0xff,
                  0xff, 0xff, 'J', 0xff, 0xff, 0xff, 0xff, 'K', 0, 't', 'b', 'N', 'b', '.'),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("already has its state");
}

/* What Python or torch could not build is refused, so that whatever passes
 * here the reader builds. */
static void test_unbuildable(void) {
    ckptio_value *root;
    /* {[]: 1} and set([[]]) */
    T_STATUS(RUNB(&root, 0x80, 2, '}', ']', 'K', 1, 's', '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("a list as a dict key: unhashable");
    T_STATUS(RUNB(&root, 0x80, 4, 0x8f, '(', ')', ']', 0x86, 0x90, '.'), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("a tuple as a set item");
    /* ((1, {}),) as a key: a tuple holding a dict at depth 2. */
    T_STATUS(RUNB(&root, 0x80, 2, '}', 'K', 1, '}', 0x86, 0x85, 'K', 1, 's', '.'), CKPTIO_E_FORMAT);
    /* Tuples of hashables are keys. */
    T_OK(RUNB(&root, 0x80, 2, '}', 'K', 1, 'K', 2, 0x86, 'K', 1, 's', '.'));
    /* torch.device: a type torch.device() knows, an index 0..127. */
    T_OK(RUNB(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'd', 'e', 'v', 'i', 'c', 'e', '\n', 'X', 4, 0, 0, 0,
              'c', 'u', 'd', 'a', 'K', 3, 0x86, 'R', '.'));
    T_STATUS(RUNB(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'd', 'e', 'v', 'i', 'c', 'e', '\n', 'X', 3, 0, 0,
                  0, 'n', 'p', 'u', 0x85, 'R', '.'),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("unknown device type");
    T_STATUS(RUNB(&root, 0x80, 2, 'c', 't', 'o', 'r', 'c', 'h', '\n', 'd', 'e', 'v', 'i', 'c', 'e', '\n', 'X', 4, 0, 0,
                  0, 'c', 'u', 'd', 'a', 'M', 200, 0, 0x86, 'R', '.'),
             CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("0..127");
    /* OrderedDict attributes: '_metadata' is what torch sets; '__reduce_ex__', 'items' and 7 are refused. */
    static const char od[] = "\x80\x02" "ccollections\nOrderedDict\n)R}X\x09\x00\x00\x00_metadataK\x01sb.";
    T_OK(RUN(od, &root));
    T_STATUS(PATCHED(od, "_metadata", "__reduce_", &root), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("OrderedDict attribute '__reduce_' starts with '__'");
    static const char od_items[] = "\x80\x02" "ccollections\nOrderedDict\n)R}X\x05\x00\x00\x00itemsK\x01sb.";
    T_STATUS(RUN(od_items, &root), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("would hide the method");
    static const char od_int[] = "\x80\x02" "ccollections\nOrderedDict\n)R}K\x07K\x01sb.";
    T_STATUS(RUN(od_int, &root), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("not a str");
}

/* L[i+1] = [L[i], L[i], {'k': L[i]}] for 60 levels: 3^60 paths, ~1 KB. */
static void test_shared_references_are_linear(void) {
    static uint8_t p[4096];
    size_t n = 0;
    p[n++] = 0x80, p[n++] = 2, p[n++] = ']', p[n++] = 'r', n += 4, p[n++] = '0'; /* LONG_BINPUT 0, POP */
    for (uint32_t i = 1; i <= 60; i++) {
        const uint8_t get[] = {'j', (uint8_t)(i - 1), 0, 0, 0}; /* LONG_BINGET i-1 */
        p[n++] = ']', p[n++] = '(';
        memcpy(p + n, get, 5), n += 5;
        memcpy(p + n, get, 5), n += 5;
        p[n++] = '}', p[n++] = 'X', p[n++] = 1, n += 3, p[n++] = 'k';
        memcpy(p + n, get, 5), n += 5;
        p[n++] = 's', p[n++] = 'e', p[n++] = 'r';
        memcpy(p + n, (const uint8_t[]){(uint8_t)i, 0, 0, 0}, 4), n += 4;
        if (i < 60) p[n++] = '0';
    }
    p[n++] = '.';
    ckptio_value *root;
    T_OK(run_len((const char *)p, n, &root));
    /* Every container is checked once: no tensor below, so nothing is named (fn never runs). */
    T_OK(ckptio__torch_walk_names(root, "f.pt", "load torch file", NULL, NULL));
}

int main(void) {
    T_RUN(test_values);
    T_RUN(test_refused);
    T_RUN(test_unbuildable);
    T_RUN(test_shared_references_are_linear);
    ckptio__value_pool_free(&pool);
    return T_EXIT_PASS;
}
