/*
 * test_writer_limits.c - what ckptio writes it can read: every limit of the
 * torch and safetensors readers is enforced by the writers too, at the
 * boundary (one under the limit saves and loads, one over is refused by the
 * writer), and a torch tree whose keys collide
 * once flattened ('a.b' beside a -> b, 1 beside '1') is refused by both,
 * naming both paths, unless both paths hold the same tensor.
 */
#include "helpers.h"
#include "safetensors_internal.h"

#include <string.h>

static ckptio_engine *engine;
static float data[4] = {1, 2, 3, 4};

/* A writer whose root is a dict; *storage is one 4-float storage. */
static ckptio_torch_writer *new_writer(ckptio_value **root, size_t *storage) {
    ckptio_torch_writer *w = NULL;
    T_OK(ckptio_torch_writer_create(&w));
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 0, root));
    T_OK(ckptio_torch_writer_set_root(w, *root));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F32, sizeof data, "cpu", data, CKPTIO_MEM_HOST, storage));
    return w;
}

static ckptio_value *tensor(ckptio_torch_writer *w, size_t storage, int64_t n, uint64_t offset) {
    ckptio_torch_tensor_spec spec = {.storage = storage, .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = &n,
                                     .storage_offset = offset};
    ckptio_value *v;
    T_OK(ckptio_torch_writer_tensor(w, &spec, &v));
    return v;
}

static void set_str(ckptio_torch_writer *w, ckptio_value *dict, const char *key, size_t len, ckptio_value *item) {
    ckptio_value *k;
    T_OK(ckptio_torch_writer_str(w, key, len, &k));
    T_OK(ckptio_torch_writer_set_item(w, dict, k, item));
}

/* Saves, and when the save succeeds opens the file again: the reader must
 * accept whatever the writer wrote. Returns the save's status. */
static ckptio_status save_then_open(ckptio_torch_writer *w, const char *name) {
    const char *path = t_path(name);
    remove(path);
    const ckptio_status st = ckptio_torch_save(engine, path, w, NULL);
    if (st == CKPTIO_OK) {
        ckptio_torch *t = NULL;
        T_OK(ckptio_torch_open(engine, path, &t));
        ckptio_torch_close(t);
    } else {
        T_ASSERT(!t_file_exists(path));
    }
    return st;
}

/* A 1 MiB key: the reader refuses it, so the writer does too. */
static void test_torch_name_length(void) {
    ckptio_value *root;
    size_t s;
    ckptio_torch_writer *w = new_writer(&root, &s);
    char *name = malloc(1u << 20);
    T_ASSERT(name != NULL);
    memset(name, 'k', 1u << 20);
    set_str(w, root, name, 1u << 20, tensor(w, s, 4, 0));
    T_STATUS(save_then_open(w, "long.pt"), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("tensor name longer than 64 KiB");
    T_MESSAGE_HAS("long.pt");
    ckptio_torch_writer_destroy(w);
    /* The longest name the reader takes (64 KiB less its NUL) saves and loads. */
    w = new_writer(&root, &s);
    set_str(w, root, name, (1u << 16) - 1, tensor(w, s, 4, 0));
    T_OK(save_then_open(w, "longest.pt"));
    ckptio_torch_writer_destroy(w);
    /* One byte more across two levels: "a." + ... */
    w = new_writer(&root, &s);
    ckptio_value *inner;
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 0, &inner));
    set_str(w, inner, name, (1u << 16) - 3, tensor(w, s, 4, 0));
    set_str(w, root, "ab", 2, inner);
    T_STATUS(save_then_open(w, "nested_long.pt"), CKPTIO_E_RANGE);
    ckptio_torch_writer_destroy(w);
    free(name);
}

/* Nesting: at every depth around the limit, what saves also loads, and
 * the deepest trees are refused by the writer. */
static void test_torch_depth(void) {
    int refused = 0, saved = 0;
    for (unsigned depth = 505; depth <= 516; depth++) {
        for (int leaf_is_tensor = 0; leaf_is_tensor < 2; leaf_is_tensor++) {
            ckptio_value *root;
            size_t s;
            ckptio_torch_writer *w = new_writer(&root, &s);
            ckptio_value *v;
            if (leaf_is_tensor) v = tensor(w, s, 4, 0);
            else T_OK(ckptio_torch_writer_int(w, 7, &v));
            for (unsigned d = 0; d < depth; d++) {
                ckptio_value *list;
                T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_LIST, 0, &list));
                T_OK(ckptio_torch_writer_append(w, list, v));
                v = list;
            }
            set_str(w, root, "x", 1, v);
            const ckptio_status st = save_then_open(w, "deep.pt");
            T_ASSERT_MSG(st == CKPTIO_OK || st == CKPTIO_E_RANGE, "depth %u: %s", depth, ckptio_status_name(st));
            if (st == CKPTIO_OK) saved++;
            else refused++;
            ckptio_torch_writer_destroy(w);
        }
    }
    T_ASSERT(saved > 0 && refused > 0);
}

/* Keys that collide once flattened: {'a.b': x, 'a': {'b': y}} and {1: x, '1': y}. */
static void test_torch_collisions(void) {
    ckptio_value *root, *inner, *key;
    size_t s;
    ckptio_torch_writer *w = new_writer(&root, &s);
    set_str(w, root, "a.b", 3, tensor(w, s, 2, 0));
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 0, &inner));
    set_str(w, inner, "b", 1, tensor(w, s, 2, 2));
    set_str(w, root, "a", 1, inner);
    T_STATUS(save_then_open(w, "dotted.pt"), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("at ['a.b'] and at ['a']['b']");
    T_ASSERT(strcmp(ckptio_last_error()->subject, "a.b") == 0);
    ckptio_torch_writer_destroy(w);

    w = new_writer(&root, &s);
    T_OK(ckptio_torch_writer_int(w, 1, &key));
    T_OK(ckptio_torch_writer_set_item(w, root, key, tensor(w, s, 2, 0)));
    set_str(w, root, "1", 1, tensor(w, s, 4, 0));
    T_STATUS(save_then_open(w, "int_str.pt"), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("at [1] and at ['1']");
    ckptio_torch_writer_destroy(w);

    /* The same view under both paths hides nothing: saved and read. */
    w = new_writer(&root, &s);
    ckptio_value *t = tensor(w, s, 4, 0);
    set_str(w, root, "a.b", 3, t);
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 0, &inner));
    set_str(w, inner, "b", 1, tensor(w, s, 4, 0));
    set_str(w, root, "a", 1, inner);
    T_OK(save_then_open(w, "same_view.pt"));
    ckptio_torch_writer_destroy(w);
}

static void test_torch_str_utf8(void) {
    ckptio_torch_writer *w = NULL;
    ckptio_value *v;
    T_OK(ckptio_torch_writer_create(&w));
    T_STATUS(ckptio_torch_writer_str(w, "a\xff", 2, &v), CKPTIO_E_INVAL);
    T_STATUS(ckptio_torch_writer_str(w, "\xc0\x80", 2, &v), CKPTIO_E_INVAL); /* overlong NUL */
    T_OK(ckptio_torch_writer_str(w, "\xed\xa0\x80", 3, &v));                 /* surrogate: pickle passes it */
    ckptio_torch_writer_destroy(w);
}

/* The safetensors reader refuses a header of more than 2^24 JSON values;
 * with 64 dimensions a tensor costs 70 of them (see the count below). */
static void test_safetensors_value_count(void) {
    enum { NDIM = 64 };
    /* '{' + per tensor: '{', '[' x2, 63 + 1 + 1 + 1 commas, one between
     * tensors; plus the count's initial 1: 70 T + 1 values. */
    const size_t under = (CKPTIO__ST_MAX_VALUES - 1) / 70, over = under + 1;
    int64_t shape[NDIM];
    for (int d = 0; d < NDIM; d++) shape[d] = 1;
    ckptio_tensor_source *src = calloc(over, sizeof *src);
    char *names = malloc(over * 8);
    T_ASSERT(src && names);
    static const uint8_t byte = 7;
    for (size_t i = 0; i < over; i++) {
        snprintf(names + i * 8, 8, "t%zu", i);
        src[i] = (ckptio_tensor_source){.name = names + i * 8, .dtype = CKPTIO_DTYPE_U8, .ndim = NDIM, .shape = shape,
                                        .data = &byte, .nbytes = 1, .mem_kind = CKPTIO_MEM_HOST};
    }
    ckptio__st_layout layout;
    T_OK(ckptio__st_layout_build(src, under, NULL, 0, 0, NULL, &layout));
    T_OK(ckptio__st_scan((const char *)layout.header + 8, (size_t)(layout.header_size - 8), NULL));
    ckptio__st_layout_cleanup(&layout);
    T_STATUS(ckptio__st_layout_build(src, over, NULL, 0, 0, "many.safetensors", &layout), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("JSON values");
    ckptio__st_layout_cleanup(&layout);
    /* Through the public save: refused, nothing written. */
    T_STATUS(ckptio_safetensors_save(engine, t_path("many.safetensors"), src, over, NULL, 0, 0), CKPTIO_E_RANGE);
    T_ASSERT(!t_file_exists(t_path("many.safetensors")));
    free(names);
    free(src);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_torch_name_length);
    T_RUN(test_torch_depth);
    T_RUN(test_torch_collisions);
    T_RUN(test_torch_str_utf8);
    T_RUN(test_safetensors_value_count);
    ckptio_engine_destroy(engine);
    return T_EXIT_PASS;
}
