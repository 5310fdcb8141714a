/*
 * fuzz_dcp_zstd_item.c - libFuzzer target for zstd-transformed DCP tensor
 * items: the input is the stored frames of one item. They go through the
 * streaming codec (ckptio_zstd_stream), then the item's header is made
 * twice (ckptio__dcp_header_zstd_inline): holding the decoded archive, and
 * keeping only its edges (the path of archives over 64 MiB, taken here
 * whatever the size), and a box of the tensor is read through each.
 *
 * Beyond "no crash, no leak, no UB": memory and time stay bounded by the
 * item's limit whatever the frames declare (run with -rss_limit_mb), the
 * codec's output arrives in order and in pieces of at most 1 MiB, both
 * headers agree on the layout (the edges-only one may refuse an archive
 * whose records lie elsewhere, never accept a different one), the storage
 * lies inside the decoded archive, and a box read from the frames as they
 * decompress again equals the one read from memory. A broken invariant
 * traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "dcp_dir_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What one item may decompress to here: bounded work per input. */
#define LIMIT ((uint64_t)16 << 20)
/* Largest box copied out (bytes). */
#define BOX_MAX ((uint64_t)4 << 20)

typedef struct order {
    uint64_t next;
} order;

static ckptio_status in_order(void *ctx, const void *data, size_t len, uint64_t offset) {
    order *o = ctx;
    CHECK(data != NULL && len > 0 && len <= (1u << 20) && offset == o->next);
    o->next += len;
    return CKPTIO_OK;
}

/* The box [shape / 3, shape) of the stored tensor, in C order, or NULL when
 * it is empty, too large to copy here, or refused. */
static uint8_t *read_box(const ckptio_dcp_header *h, const ckptio_dcp_layout *lay, uint64_t *bytes) {
    int64_t off[CKPTIO_DCP_MAX_NDIM], size[CKPTIO_DCP_MAX_NDIM], stride[CKPTIO_DCP_MAX_NDIM];
    const uint64_t es = ckptio__dcp_element_size(lay->dtype);
    uint64_t elems = 1;
    for (uint32_t d = lay->ndim; d-- > 0;) {
        off[d] = lay->shape[d] / 3;
        size[d] = lay->shape[d] - off[d];
        stride[d] = (int64_t)elems;
        if (size[d] && elems > BOX_MAX / (uint64_t)size[d]) return NULL;
        elems *= (uint64_t)size[d];
    }
    const uint64_t n = elems * es;
    if (n == 0 || n > BOX_MAX) return NULL;
    uint8_t *out = malloc(n);
    if (ckptio_dcp_header_read_box(h, "t", off, size, out, stride, n) != CKPTIO_OK) {
        CHECK(ckptio_last_error_message()[0] != '\0');
        free(out);
        return NULL;
    }
    *bytes = n;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    order o = {0};
    uint64_t total = 0;
    if (ckptio_zstd_stream(data, size, LIMIT, in_order, &o, &total) == CKPTIO_OK)
        CHECK(total == o.next && total <= LIMIT);
    else
        CHECK(ckptio_last_error_message()[0] != '\0');

    ckptio_dcp_header *whole = NULL, *edges = NULL;
    const ckptio_status sw =
        ckptio__dcp_header_zstd_inline(data, size, LIMIT, LIMIT, "item.distcp", 0, "t", &whole);
    if (sw != CKPTIO_OK) CHECK(ckptio_last_error_message()[0] != '\0' && whole == NULL);
    const ckptio_status se = ckptio__dcp_header_zstd_inline(data, size, LIMIT, 0, "item.distcp", 0, "t", &edges);
    if (se != CKPTIO_OK) CHECK(ckptio_last_error_message()[0] != '\0' && edges == NULL);
    /* The edges never accept what the whole archive refuses. */
    CHECK(sw == CKPTIO_OK || se != CKPTIO_OK);
    if (sw == CKPTIO_OK) {
        ckptio__dcp_archive a;
        ckptio_dcp_layout lay;
        CHECK(ckptio__dcp_header_archive(whole, &a) == CKPTIO_OK && a.data != NULL && a.len <= LIMIT);
        if (ckptio_dcp_header_layout(whole, "t", &lay) == CKPTIO_OK) {
            CHECK(lay.storage_start <= a.len && lay.storage_nbytes <= a.len - lay.storage_start);
            uint64_t n1 = 0, n2 = 0;
            uint8_t *b1 = read_box(whole, &lay, &n1);
            if (se == CKPTIO_OK) {
                ckptio_dcp_layout lay2;
                CHECK(ckptio_dcp_header_layout(edges, "t", &lay2) == CKPTIO_OK);
                CHECK(memcmp(&lay, &lay2, sizeof lay) == 0);
                uint8_t *b2 = read_box(edges, &lay2, &n2);
                /* From the frames as they pass, the same bytes as from memory
                 * (a layout with overlapping strides is refused there). */
                if (b1 && b2) CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0);
                if (!b1) CHECK(!b2);
                free(b2);
            }
            free(b1);
        }
    }
    ckptio_dcp_header_close(whole);
    ckptio_dcp_header_close(edges);
    return 0;
}
