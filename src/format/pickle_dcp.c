/*
 * pickle_dcp.c - the public handle that parses a torch.distributed.checkpoint
 * .metadata pickle into a value tree (docs/FORMATS.md section 4.2), with
 * the restricted unpickler in its DCP mode, whose allowlist is
 * pickle_dcp_classes.c.
 */
#include "pickle_internal.h"

#include <string.h>

ckptio_status ckptio_value_object(const ckptio_value *value, const char **class_name, const ckptio_value **args,
                                  const ckptio_value **state) {
    if (!value) return CKPTIO_FAIL(CKPTIO_E_INVAL, "value must not be NULL");
    if (value->kind != CKPTIO_VALUE_OBJECT)
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "value is not an object (kind %d)", value->kind);
    if (class_name) *class_name = value->u.obj.cls;
    if (args) *args = value->u.obj.args;
    if (state) *state = value->u.obj.state;
    return CKPTIO_OK;
}

/* ---- the handle ------------------------------------------------------------------ */

struct ckptio_pickle {
    ckptio__value_pool pool;
    ckptio_value *root;         /* strings are copied into the pool: the input may go */
};

ckptio_status ckptio_pickle_parse_dcp_metadata(const void *bytes, size_t len, const char *origin,
                                               ckptio_pickle **out) {
    if (!out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "output must not be NULL");
    *out = NULL;
    if (!bytes && len) return CKPTIO_FAIL(CKPTIO_E_INVAL, "bytes must not be NULL");
    ckptio_pickle *p = ckptio__calloc(1, sizeof *p);
    if (!p) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "no memory for a pickle handle");
    ckptio_status st = ckptio__unpickle_mode(bytes ? bytes : (const uint8_t *)"", len, origin ? origin : "<memory>",
                                             ".metadata", 0, CKPTIO__UNPICKLE_DCP_METADATA, &p->pool, &p->root);
    if (st != CKPTIO_OK) {
        ckptio_pickle_close(p);
        return st;
    }
    *out = p;
    return CKPTIO_OK;
}

ckptio_status ckptio_pickle_root(const ckptio_pickle *p, const ckptio_value **out) {
    if (!p || !out) return CKPTIO_FAIL(CKPTIO_E_INVAL, "handle and output must not be NULL");
    *out = p->root;
    return CKPTIO_OK;
}

ckptio_status ckptio_pickle_close(ckptio_pickle *p) {
    if (!p) return CKPTIO_OK;
    ckptio__value_pool_free(&p->pool);
    ckptio__free(p);
    return CKPTIO_OK;
}
