/*
 * fuzz_dcp_metadata.c - libFuzzer target for the unpickler's DCP .metadata
 * mode (ckptio_pickle_parse_dcp_metadata): the input is a .metadata file.
 *
 * Beyond "no crash, no leak, no UB", an accepted stream must give a tree
 * the public accessors walk completely: only public kinds, never a tensor
 * or device (this mode has no tensor callables), OBJECT nodes with an
 * allowlisted class name and a tuple of arguments. A broken invariant traps.
 */
#include "ckptio.h"
#include "pickle_internal.h"
#include "value_walk.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio_pickle *p = NULL;
    if (ckptio_pickle_parse_dcp_metadata(data, size, "fuzz/.metadata", &p) == CKPTIO_OK) {
        const ckptio_value *root = NULL;
        CHECK(ckptio_pickle_root(p, &root) == CKPTIO_OK && root != NULL);
        uint64_t budget = 1u << 20;
        fuzz_walk_value(root, 0, &budget, true);
    } else {
        CHECK(p == NULL && ckptio_last_error_message()[0] != '\0');
    }
    ckptio_pickle_close(p);
    return 0;
}
