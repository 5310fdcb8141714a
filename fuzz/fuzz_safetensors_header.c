/*
 * fuzz_safetensors_header.c - libFuzzer target for the safetensors header
 * parser: the input is a whole file (file_size = input size).
 *
 * Beyond "no crash, no leak, no UB", every accepted file must satisfy the
 * invariants the rest of ckptio relies on, and must survive a round trip
 * through the writer's layout: what the reader accepts, the writer can
 * write (except empty names, which only the reader allows), and the reader
 * accepts that again with the same tensors; and the format detector
 * (ckptio_format_detect_bytes) calls every accepted file safetensors. A
 * broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "safetensors_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_invariants(const ckptio_safetensors *st, size_t size) {
    size_t count, md_count;
    uint64_t data_offset, data_size, expect = 0;
    CHECK(ckptio_safetensors_count(st, &count) == CKPTIO_OK);
    CHECK(ckptio_safetensors_data_offset(st, &data_offset) == CKPTIO_OK);
    CHECK(ckptio_safetensors_data_size(st, &data_size) == CKPTIO_OK);
    CHECK(data_offset >= 8 && data_offset + data_size == size);
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        size_t found;
        CHECK(ckptio_safetensors_tensor(st, i, &info) == CKPTIO_OK);
        CHECK(info.file_offset == data_offset + expect);
        expect += info.nbytes;
        uint64_t numel = 1, nbytes;
        for (uint32_t d = 0; d < info.ndim; d++) {
            CHECK(info.shape[d] >= 0);
            CHECK(!ckptio__mul_overflows(numel, (uint64_t)info.shape[d], &numel));
        }
        CHECK(ckptio__dtype_nbytes(info.dtype, numel, &nbytes) && nbytes == info.nbytes);
        CHECK(ckptio_safetensors_find(st, info.name, &found) == CKPTIO_OK && found == i);
    }
    CHECK(expect == data_size);
    CHECK(ckptio_safetensors_metadata_count(st, &md_count) == CKPTIO_OK);
    for (size_t i = 0; i < md_count; i++) {
        ckptio_kv kv;
        CHECK(ckptio_safetensors_metadata(st, i, &kv) == CKPTIO_OK && kv.key && kv.value);
    }
}

static void check_round_trip(const ckptio_safetensors *st, const uint8_t *data) {
    size_t count, md_count;
    ckptio_safetensors_count(st, &count);
    ckptio_safetensors_metadata_count(st, &md_count);
    ckptio_tensor_source *src = calloc(count ? count : 1, sizeof *src);
    ckptio_kv *md = calloc(md_count ? md_count : 1, sizeof *md);
    CHECK(src && md);
    for (size_t i = 0; i < count; i++) {
        ckptio_tensor_info info;
        ckptio_safetensors_tensor(st, i, &info);
        if (!info.name[0]) goto out; /* the writer refuses empty names */
        src[i] = (ckptio_tensor_source){.name = info.name, .dtype = info.dtype, .ndim = info.ndim,
                                        .shape = info.shape, .data = data + info.file_offset,
                                        .nbytes = info.nbytes};
    }
    for (size_t i = 0; i < md_count; i++) ckptio_safetensors_metadata(st, i, &md[i]);

    for (unsigned flags = 0; flags <= CKPTIO_SAFETENSORS_ALIGN_8; flags++) {
        ckptio__st_layout layout;
        ckptio_status status = ckptio__st_layout_build(src, count, md, md_count, flags, NULL, &layout);
        /* Only a header grown past the cap by padding may fail. */
        if (status != CKPTIO_OK) {
            CHECK(status == CKPTIO_E_RANGE);
            continue;
        }
        const size_t total = (size_t)(layout.header_size + layout.data_size);
        unsigned char *file = calloc(1, total);
        CHECK(file);
        memcpy(file, layout.header, layout.header_size);
        ckptio_safetensors *again = NULL;
        CHECK(ckptio_safetensors_parse(file, total, total, &again) == CKPTIO_OK);
        size_t count2, md_count2;
        ckptio_safetensors_count(again, &count2);
        ckptio_safetensors_metadata_count(again, &md_count2);
        CHECK(count2 == count && md_count2 == md_count);
        for (size_t i = 0; i < count; i++) {
            size_t j;
            ckptio_tensor_info info;
            CHECK(ckptio_safetensors_find(again, src[i].name, &j) == CKPTIO_OK);
            ckptio_safetensors_tensor(again, j, &info);
            CHECK(info.dtype == src[i].dtype && info.ndim == src[i].ndim && info.nbytes == src[i].nbytes);
            CHECK(info.ndim == 0 || memcmp(info.shape, src[i].shape, info.ndim * sizeof(int64_t)) == 0);
            CHECK(info.file_offset == layout.header_size + layout.offsets[i]);
        }
        for (size_t i = 0; i < md_count; i++) {
            ckptio_kv kv;
            ckptio_safetensors_metadata(again, i, &kv);
            CHECK(strcmp(kv.key, md[i].key) == 0 && strcmp(kv.value, md[i].value) == 0);
        }
        ckptio_safetensors_close(again);
        free(file);
        ckptio__st_layout_cleanup(&layout);
    }
out:
    free(src);
    free(md);
}

/* The format detector on every input (no crash, no read past `size`), and
 * its promise: whatever the reader accepts is detected as safetensors,
 * from the probe bytes alone and from the whole file. */
static ckptio_format detect(const uint8_t *data, size_t size, size_t len) {
    ckptio_format format = CKPTIO_FORMAT_UNKNOWN;
    CHECK(ckptio_format_detect_bytes(data, len < size ? len : size, size, &format) == CKPTIO_OK);
    CHECK(format <= CKPTIO_FORMAT_TORCH_LEGACY); /* bytes never name a directory layout */
    return format;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio_safetensors *st = NULL;
    const ckptio_format probe = detect(data, size, CKPTIO_FORMAT_PROBE_BYTES), whole = detect(data, size, size);
    if (ckptio_safetensors_parse(data, size, size, &st) != CKPTIO_OK) {
        CHECK(st == NULL);
        CHECK(ckptio_last_error_message()[0] != '\0');
        return 0;
    }
    CHECK(probe == CKPTIO_FORMAT_SAFETENSORS && whole == CKPTIO_FORMAT_SAFETENSORS);
    check_invariants(st, size);
    check_round_trip(st, data);
    ckptio_safetensors_close(st);
    return 0;
}
