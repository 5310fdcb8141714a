/*
 * fuzz_dcp_metadata.c - libFuzzer target for the unpickler's DCP .metadata
 * mode (ckptio_pickle_parse_dcp_metadata): the input is a .metadata file.
 * The same bytes then go through the table ckptio_dcp_open() builds from
 * them (ckptio__dcp_open_bytes), whose invariants are checked too, and
 * through what the commit's cleanup reads from them (the files they
 * reference: a superset of the table's).
 *
 * Beyond "no crash, no leak, no UB", an accepted stream must give a tree
 * the public accessors walk completely: only public kinds, never a tensor
 * or device (this mode has no tensor callables), OBJECT nodes with an
 * allowlisted class name and a tuple of arguments. The tiling check of
 * every tensor must agree with the pairwise definition (small tensors). A
 * broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "dcp_commit_internal.h"
#include "dcp_dir_internal.h"
#include "pickle_internal.h"
#include "value_walk.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A stored item's file must be a plain name inside the directory. */
static void check_stored(const ckptio_dcp_stored *s) {
    CHECK(s->file != NULL && s->file[0] != '\0' && strchr(s->file, '/') == NULL && strcmp(s->file, "..") != 0 &&
          strcmp(s->file, ".") != 0);
    CHECK(s->offset + s->length >= s->offset);
    CHECK((s->transforms & ~(unsigned)CKPTIO_DCP_TRANSFORM_ZSTD) == 0);
}

/* The pairwise definition of an exact tiling: chunks disjoint, volumes summing
 * to the tensor's (they lie inside it: checked by the table). */
static bool tiles_exactly(const ckptio__dcp_tensor *t) {
    const uint32_t nd = t->ndim;
    uint64_t total = 0;
    for (size_t c = 0; c < t->nchunks; c++) {
        uint64_t vol = 1;
        for (uint32_t d = 0; d < nd; d++) vol *= (uint64_t)t->sizes[c * nd + d];
        if (vol == 0) continue;
        if (__builtin_add_overflow(total, vol, &total)) return false;
        for (size_t o = 0; o < c; o++) { /* an empty chunk o meets nothing: its a0 < b1 && b0 < a1 fails */
            bool meet = true;
            for (uint32_t d = 0; meet && d < nd; d++) {
                const int64_t a0 = t->offsets[c * nd + d], a1 = a0 + t->sizes[c * nd + d];
                const int64_t b0 = t->offsets[o * nd + d], b1 = b0 + t->sizes[o * nd + d];
                meet = a0 < b1 && b0 < a1 && b0 < b1;
            }
            if (meet) return false;
        }
    }
    return total == t->numel;
}

/* The table ckptio_dcp_open() builds from the same bytes: every accessor
 * answers, every chunk lies inside its tensor, every file name is plain. */
static void check_table(const uint8_t *data, size_t size) {
    ckptio_dcp *h = NULL;
    if (ckptio__dcp_open_bytes("fuzz", data, size, &h) != CKPTIO_OK) {
        CHECK(h == NULL && ckptio_last_error_message()[0] != '\0');
        return;
    }
    size_t nt = 0, nb = 0, nf = 0;
    CHECK(ckptio_dcp_tensor_count(h, &nt) == CKPTIO_OK && ckptio_dcp_bytes_count(h, &nb) == CKPTIO_OK &&
          ckptio_dcp_file_count(h, &nf) == CKPTIO_OK);
    for (size_t i = 0; i < nt; i++) {
        ckptio_dcp_tensor_info t;
        CHECK(ckptio_dcp_tensor(h, i, &t) == CKPTIO_OK && t.fqn != NULL);
        size_t found = SIZE_MAX;
        CHECK(ckptio_dcp_find(h, t.fqn, &found) == CKPTIO_OK && found < nt);
        for (size_t c = 0; c < t.chunks; c++) {
            ckptio_dcp_chunk_info ch;
            CHECK(ckptio_dcp_chunk(h, i, c, &ch) == CKPTIO_OK);
            for (uint32_t d = 0; d < t.ndim; d++)
                CHECK(ch.offsets[d] >= 0 && ch.sizes[d] >= 0 && ch.offsets[d] + ch.sizes[d] <= t.shape[d]);
            check_stored(&ch.stored);
        }
        ckptio_dcp_chunk_info none;
        CHECK(ckptio_dcp_chunk(h, i, t.chunks, &none) != CKPTIO_OK);
        const ckptio__dcp_tensor *tt = &h->tensors[i];
        const ckptio_status tiling = ckptio__dcp_check_tiling(h, tt);
        CHECK(tiling == CKPTIO_OK || (tiling == CKPTIO_E_FORMAT && ckptio_last_error_message()[0] != '\0'));
        if (tt->nchunks <= 256) CHECK((tiling == CKPTIO_OK) == tiles_exactly(tt));
    }
    /* The coverage rule check and verify apply (whose names are several
     * ranks' decides it): tiling demanded of every tensor, or partial ones
     * counted; one answer whatever the names hold. */
    bool every_tiled = true;
    for (size_t i = 0; i < nt && every_tiled; i++)
        every_tiled = ckptio__dcp_check_tiling(h, &h->tensors[i]) == CKPTIO_OK;
    size_t partial = SIZE_MAX;
    const ckptio_status coverage = ckptio__dcp_check_coverage(h, &partial);
    if (ckptio__dcp_several_ranks((const char *const *)h->files, h->nfiles))
        CHECK(coverage == (every_tiled ? CKPTIO_OK : CKPTIO_E_FORMAT) && (coverage != CKPTIO_OK || partial == 0));
    else
        CHECK(coverage == CKPTIO_OK && partial <= nt && (partial == 0) == every_tiled);
    for (size_t i = 0; i < nb; i++) {
        ckptio_dcp_bytes_info b;
        CHECK(ckptio_dcp_bytes(h, i, &b) == CKPTIO_OK && b.fqn != NULL);
        check_stored(&b.stored);
    }
    /* The commit's cleanup must never remove a file this reader reads: every
     * file of the table is among those it finds referenced. */
    char **refs = NULL;
    size_t nrefs = 0;
    CHECK(ckptio__dcp_referenced_files(data, size, "fuzz", &refs, &nrefs) == CKPTIO_OK);
    for (size_t i = 0; i < nf; i++) {
        const char *name = NULL;
        CHECK(ckptio_dcp_file(h, i, &name) == CKPTIO_OK && name != NULL && strchr(name, '/') == NULL);
        bool found = false;
        for (size_t k = 0; k < nrefs && !found; k++) found = strcmp(refs[k], name) == 0;
        CHECK(found);
    }
    ckptio_dcp_names_free(refs, nrefs);
    ckptio_dcp_close(h);
}

/* What the cleanup reads from any .metadata: names, or a clear refusal. */
static void check_referenced(const uint8_t *data, size_t size) {
    char **refs = NULL;
    size_t n = 0;
    if (ckptio__dcp_referenced_files(data, size, "fuzz", &refs, &n) != CKPTIO_OK) {
        CHECK(refs == NULL && n == 0 && ckptio_last_error_message()[0] != '\0');
        return;
    }
    for (size_t i = 0; i < n; i++) CHECK(refs[i] != NULL);
    ckptio_dcp_names_free(refs, n);
}

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
    check_table(data, size);
    check_referenced(data, size);
    return 0;
}
