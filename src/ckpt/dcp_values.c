/*
 * dcp_values.c - reading DCP .metadata objects out of the restricted
 * unpickler's value tree (ckptio_pickle_parse_dcp_metadata): strings, dict
 * fields, an instance's fields. Shared by the table (dcp_dir.c) and the
 * commit's cleanup (dcp_cleanup.c), which must read the same graph the same
 * way.
 */
#include "dcp_dir_internal.h"

#include <string.h>

const char *ckptio__dcp_str_of(const ckptio_value *v, size_t *len) {
    const char *s = NULL;
    size_t n = 0;
    if (ckptio_value_kind_of(v) != CKPTIO_VALUE_STR || ckptio_value_bytes(v, &s, &n) != CKPTIO_OK) return NULL;
    if (len) *len = n;
    return s;
}

const ckptio_value *ckptio__dcp_dict_get(const ckptio_value *dict, const char *key) {
    size_t n = 0;
    if (ckptio_value_kind_of(dict) != CKPTIO_VALUE_DICT || ckptio_value_len(dict, &n) != CKPTIO_OK) return NULL;
    for (size_t i = 0; i < n; i++) {
        const ckptio_value *k, *v;
        if (ckptio_value_dict_item(dict, i, &k, &v) != CKPTIO_OK) continue;
        const char *s = ckptio__dcp_str_of(k, NULL);
        if (s && strcmp(s, key) == 0) return v;
    }
    return NULL;
}

const ckptio_value *ckptio__dcp_fields_of(const ckptio_value *v, const char *cls) {
    const char *name = NULL;
    const ckptio_value *state = NULL;
    if (ckptio_value_kind_of(v) != CKPTIO_VALUE_OBJECT || ckptio_value_object(v, &name, NULL, &state) != CKPTIO_OK ||
        strcmp(name, cls) != 0)
        return NULL;
    if (ckptio_value_kind_of(state) == CKPTIO_VALUE_DICT) return state;
    size_t n = 0;
    if (ckptio_value_kind_of(state) == CKPTIO_VALUE_TUPLE && ckptio_value_len(state, &n) == CKPTIO_OK && n == 2) {
        const ckptio_value *a, *b;
        ckptio_value_item(state, 0, &a);
        ckptio_value_item(state, 1, &b);
        if (ckptio_value_kind_of(b) == CKPTIO_VALUE_DICT) return b; /* slots */
        if (ckptio_value_kind_of(a) == CKPTIO_VALUE_DICT) return a;
    }
    return NULL;
}
