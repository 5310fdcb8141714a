/*
 * fuzz_zip.c - libFuzzer target for the torch.save reader: the input is a
 * whole file, parsed from memory (zip end records, central directory, local
 * headers, small records, data.pkl through the restricted unpickler,
 * storage resolution, tensor naming).
 *
 * Beyond "no crash, no leak, no UB", every accepted file must satisfy what
 * the rest of ckptio relies on: each tensor's bytes lie inside the file and
 * inside its storage record, storages do not overlap (their sizes add up to
 * at most the file's), every storage can be read, verification either
 * passes or names a CRC mismatch, the format detector calls the file a
 * torch archive, and no two different tensors share a name. The same bytes
 * as a DCP item described from its first and last EDGE bytes only
 * (ckptio_dcp_header_windows, the object-storage header read) are never
 * accepted where the whole archive is refused, and describe the same tensor
 * when both are. A broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Edge windows small enough that inputs of a few KiB have bytes between them. */
#define EDGE 2048u

static void check_edges(const uint8_t *data, size_t size) {
    const size_t n = size < EDGE ? size : EDGE;
    ckptio_dcp_header *whole = NULL, *edges = NULL;
    const ckptio_status sw = ckptio_dcp_header_parse(data, size, "item.distcp", 0, "t", &whole);
    const ckptio_status se =
        ckptio_dcp_header_windows("item.distcp", size, 0, size, data, n, data + size - n, n, "t", &edges);
    if (se != CKPTIO_OK) CHECK(edges == NULL && ckptio_last_error_message()[0] != '\0');
    CHECK(sw == CKPTIO_OK || se != CKPTIO_OK);
    if (sw == CKPTIO_OK && se == CKPTIO_OK) {
        ckptio_dcp_layout a, b;
        memset(&a, 0, sizeof a);
        memset(&b, 0, sizeof b);
        const ckptio_status la = ckptio_dcp_header_layout(whole, "t", &a);
        CHECK(ckptio_dcp_header_layout(edges, "t", &b) == la);
        CHECK(la != CKPTIO_OK || memcmp(&a, &b, sizeof a) == 0);
    }
    ckptio_dcp_header_close(whole);
    ckptio_dcp_header_close(edges);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size) check_edges(data, size);
    ckptio_torch *t = NULL;
    if (ckptio_torch_parse(data, size, &t) != CKPTIO_OK) {
        CHECK(ckptio_last_error_message()[0] != '\0');
        return 0;
    }
    /* The format detector calls every accepted archive a torch file. */
    ckptio_format format = CKPTIO_FORMAT_UNKNOWN;
    CHECK(ckptio_format_detect_bytes(data, size < CKPTIO_FORMAT_PROBE_BYTES ? size : CKPTIO_FORMAT_PROBE_BYTES, size,
                                     &format) == CKPTIO_OK && format == CKPTIO_FORMAT_TORCH);
    size_t n = 0, ns = 0;
    CHECK(ckptio_torch_count(t, &n) == CKPTIO_OK);
    CHECK(ckptio_torch_storage_count(t, &ns) == CKPTIO_OK);
    uint64_t storage_bytes = 0;
    for (size_t i = 0; i < ns; i++) {
        ckptio_torch_storage_info si;
        CHECK(ckptio_torch_storage(t, i, &si) == CKPTIO_OK);
        CHECK(si.file_offset <= size && si.nbytes <= size - si.file_offset);
        /* Records never share bytes: the storages fit in the file together. */
        storage_bytes += si.nbytes;
        CHECK(storage_bytes <= size);
        if (si.nbytes <= (1u << 20)) {
            void *buf = malloc(si.nbytes ? si.nbytes : 1);
            ckptio_tensor_target tg = {.index = i, .data = buf, .capacity = si.nbytes, .mem_kind = CKPTIO_MEM_HOST};
            CHECK(ckptio_torch_read_storages(t, &tg, 1) == CKPTIO_OK);
            CHECK(si.nbytes == 0 || memcmp(buf, data + si.file_offset, si.nbytes) == 0);
            free(buf);
        }
    }
    for (size_t i = 0; i < n; i++) {
        ckptio_torch_tensor_info ti;
        CHECK(ckptio_torch_tensor(t, i, &ti) == CKPTIO_OK);
        CHECK(ti.storage < ns && ti.name != NULL);
        ckptio_torch_storage_info si;
        CHECK(ckptio_torch_storage(t, ti.storage, &si) == CKPTIO_OK);
        if (ti.is_contiguous && ti.nbytes > 0)
            CHECK(ti.file_offset >= si.file_offset && ti.file_offset + ti.nbytes <= si.file_offset + si.nbytes);
        size_t idx;
        CHECK(ckptio_value_tensor(ti.value, &idx) == CKPTIO_OK && idx <= i);
        if (ti.nbytes <= (1u << 20)) {
            void *buf = malloc(ti.nbytes ? ti.nbytes : 1);
            ckptio_tensor_target tg = {.index = i, .data = buf, .capacity = ti.nbytes, .mem_kind = CKPTIO_MEM_HOST};
            CHECK(ckptio_torch_read(t, &tg, 1) == CKPTIO_OK);
            free(buf);
        }
    }
    /* One tensor per name: equal names are the same view of one storage
     * (quadratic, so only for small trees). */
    for (size_t i = 0; n <= 512 && i < n; i++) {
        ckptio_torch_tensor_info a, b;
        ckptio_torch_tensor(t, i, &a);
        for (size_t j = i + 1; j < n; j++) {
            ckptio_torch_tensor(t, j, &b);
            if (strcmp(a.name, b.name) != 0) continue;
            CHECK(a.storage == b.storage && a.dtype == b.dtype && a.ndim == b.ndim &&
                  a.storage_offset == b.storage_offset);
            CHECK(a.ndim == 0 || (memcmp(a.shape, b.shape, a.ndim * sizeof *a.shape) == 0 &&
                                  memcmp(a.stride, b.stride, a.ndim * sizeof *a.stride) == 0));
        }
    }
    ckptio_torch_verify_report rep;
    ckptio_status st = ckptio_torch_verify(t, &rep);
    CHECK(st == CKPTIO_OK || st == CKPTIO_E_CHECKSUM);
    ckptio_torch_close(t);
    return 0;
}
