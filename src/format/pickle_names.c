/*
 * pickle_names.c - the names a state-dict pickle may use: the globals of
 * the restricted unpickler's allowlist (no wider than torch's
 * weights_only unpickler, torch/_weights_only_unpickler.py, and its
 * add_safe_globals for numpy), the device types torch.device() accepts,
 * and the attribute names BUILD may set on an OrderedDict.
 *
 * Names are only compared here, never imported: the unpickler turns an
 * allowlisted global into a tag and builds values from tags.
 */
#include "pickle_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct global_row {
    const char *module, *name;
    ckptio__global tag;
} global_row;

static const global_row global_table[] = {
    {"collections", "OrderedDict", CKPTIO__G_ORDERED_DICT},
    {"_codecs", "encode", CKPTIO__G_CODECS_ENCODE},
    {"torch", "Size", CKPTIO__G_TORCH_SIZE},
    {"torch", "device", CKPTIO__G_TORCH_DEVICE},
    {"builtins", "set", CKPTIO__G_BUILTINS_SET},
    {"builtins", "bytes", CKPTIO__G_BUILTINS_BYTES},
    {"torch._utils", "_rebuild_tensor_v2", CKPTIO__G_REBUILD_TENSOR_V2},
    {"torch._utils", "_rebuild_tensor_v3", CKPTIO__G_REBUILD_TENSOR_V3},
    {"torch._utils", "_rebuild_parameter", CKPTIO__G_REBUILD_PARAMETER},
    {"torch._utils", "_rebuild_parameter_with_state", CKPTIO__G_REBUILD_PARAMETER_WITH_STATE},
    {"torch._tensor", "_rebuild_from_type_v2", CKPTIO__G_REBUILD_FROM_TYPE_V2},
    {"torch", "Tensor", CKPTIO__G_TORCH_TENSOR},
    {"torch.nn.parameter", "Parameter", CKPTIO__G_PARAMETER},
    /* numpy values as numpy pickles them (numpy 2 writes numpy._core, 1.x numpy.core); the
     * unpickler rebuilds them as data (pickle_numpy.c), never by calling numpy. */
    {"numpy._core.multiarray", "_reconstruct", CKPTIO__G_NP_RECONSTRUCT},
    {"numpy.core.multiarray", "_reconstruct", CKPTIO__G_NP_RECONSTRUCT},
    {"numpy", "ndarray", CKPTIO__G_NP_NDARRAY},
    {"numpy", "dtype", CKPTIO__G_NP_DTYPE},
    {"numpy._core.multiarray", "scalar", CKPTIO__G_NP_SCALAR},
    {"numpy.core.multiarray", "scalar", CKPTIO__G_NP_SCALAR},
};

bool ckptio__pickle_global_tag(const char *module, const char *name, ckptio__global *tag) {
    for (size_t i = 0; i < sizeof global_table / sizeof global_table[0]; i++) {
        if (strcmp(module, global_table[i].module) == 0 && strcmp(name, global_table[i].name) == 0) {
            *tag = global_table[i].tag;
            return true;
        }
    }
    return false;
}

const char *ckptio__pickle_global_name(ckptio__global tag) {
    for (size_t i = 0; i < sizeof global_table / sizeof global_table[0]; i++)
        if (global_table[i].tag == tag) return global_table[i].name;
    return "?";
}

bool ckptio__pickle_torch_allows(const char *module, const char *name) {
    static const char *const known[] = {"collections.Counter", "torch.serialization._get_layout",
                                        "builtins.bytearray", "builtins.complex", "torch.storage.TypedStorage",
                                        "torch._utils._rebuild_tensor", "torch._utils._rebuild_qtensor",
                                        "torch._utils._rebuild_sparse_tensor",
                                        "torch._utils._rebuild_meta_tensor_no_storage",
                                        "torch._utils._rebuild_wrapper_subclass",
                                        "torch._utils._rebuild_device_tensor_from_numpy",
                                        "torch._utils._rebuild_device_tensor_from_cpu_tensor",
                                        "torch._utils._rebuild_nested_tensor"};
    char full[256];
    snprintf(full, sizeof full, "%s.%s", module, name);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(full, known[i]) == 0) return true;
    return strcmp(module, "torch") == 0 && (strstr(name, "Storage") || strncmp(name, "int", 3) == 0 ||
                                            strncmp(name, "uint", 4) == 0 || strncmp(name, "per_", 4) == 0 ||
                                            strncmp(name, "q", 1) == 0 || strncmp(name, "float", 5) == 0 ||
                                            strncmp(name, "bits", 4) == 0 || strncmp(name, "complex", 7) == 0);
}

/* ---- torch.device ---------------------------------------------------------------- */

/* torch.device()'s device types (c10/core/DeviceType.cpp, as torch 2.15 lists them). */
static const char *const device_types[] = {"cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl",
                                           "ideep", "hip", "ve", "fpga", "maia", "xla", "lazy", "vulkan",
                                           "mps", "meta", "hpu", "mtia", "privateuseone"};

ckptio_status ckptio__pickle_check_device(const char *text, size_t len) {
    const char *colon = memchr(text, ':', len);
    const size_t tlen = colon ? (size_t)(colon - text) : len;
    bool known = false;
    for (size_t i = 0; i < sizeof device_types / sizeof device_types[0] && !known; i++)
        known = strlen(device_types[i]) == tlen && memcmp(device_types[i], text, tlen) == 0;
    if (!known)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "torch.device '%.*s': unknown device type (torch.device() refuses it)",
                           (int)(len > 64 ? 64 : len), text);
    if (!colon) return CKPTIO_OK;
    const char *digits = colon + 1;
    const size_t ndigits = len - tlen - 1;
    unsigned index = 0;
    bool ok = ndigits >= 1 && ndigits <= 3 && !(ndigits > 1 && digits[0] == '0');
    for (size_t i = 0; ok && i < ndigits; i++) {
        ok = digits[i] >= '0' && digits[i] <= '9';
        index = index * 10 + (unsigned)(digits[i] - '0');
    }
    if (!ok || index > 127)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "torch.device '%.*s': the index is not a number 0..127 (torch.device() "
                           "refuses it or wraps it around)", (int)(len > 64 ? 64 : len), text);
    return CKPTIO_OK;
}

/* ---- OrderedDict attributes --------------------------------------------------------- */

/* What an instance attribute of these names would hide: OrderedDict's own
 * methods (its __reduce__ calls self.items(), so torch.save of the built
 * object would fail). Names starting with "__" are refused as a whole. */
static const char *const dict_methods[] = {"clear", "copy", "fromkeys", "get", "items", "keys", "move_to_end",
                                           "pop", "popitem", "setdefault", "update", "values"};

ckptio_status ckptio__pickle_check_attr_name(const ckptio_value *key) {
    if (key->kind != CKPTIO_VALUE_STR)
        return CKPTIO_FAIL(CKPTIO_E_FORMAT, "OrderedDict attribute name is not a str (Python's setattr refuses it)");
    const char *s = key->u.s.data;
    const size_t n = key->u.s.len;
    bool ident = n > 0 && n <= 128 && !(s[0] >= '0' && s[0] <= '9');
    for (size_t i = 0; ident && i < n; i++)
        ident = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
                s[i] == '_';
    if (!ident)
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "OrderedDict attribute '%.64s' is not an ASCII identifier of at "
                           "most 128 characters (refused)", s);
    if (n >= 2 && s[0] == '_' && s[1] == '_')
        return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "OrderedDict attribute '%s' starts with '__': it would replace "
                           "Python's own machinery of the object (refused)", s);
    for (size_t i = 0; i < sizeof dict_methods / sizeof dict_methods[0]; i++)
        if (strcmp(s, dict_methods[i]) == 0)
            return CKPTIO_FAIL(CKPTIO_E_UNSUPPORTED, "OrderedDict attribute '%s' would hide the method of that "
                               "name (refused)", s);
    return CKPTIO_OK;
}
