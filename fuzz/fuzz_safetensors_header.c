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
 *
 * Every input is also indexed by the full (jansson) parser alone: the
 * one-pass parser of the writers' form must give the same answer - the
 * same status and message, or the same tables.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "safetensors_internal.h"

#include <stdint.h>
#include <stdio.h>
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

/* ckptio_safetensors_parse with the full parser only: NULL on failure,
 * the message in `message`. */
static ckptio_safetensors *parse_full(const uint8_t *data, size_t size, ckptio_status *status, char *message,
                                      size_t cap) {
    static const unsigned char zero_prefix[8];
    uint64_t n = 0;
    *status = ckptio__st_check_prefix(size >= 8 ? data : zero_prefix, size, NULL, &n);
    ckptio_safetensors *st = NULL;
    if (*status == CKPTIO_OK) {
        st = ckptio__calloc(1, sizeof *st);
        CHECK(st);
        st->file_size = size;
        st->header_len = n;
        st->data_offset = 8 + n;
        *status = ckptio__st_index_with(st, (const char *)data + 8, false);
        if (*status != CKPTIO_OK) {
            ckptio__st_destroy(st);
            st = NULL;
        }
    }
    snprintf(message, cap, "%s", ckptio_last_error_message());
    return st;
}

static void check_same_tables(const ckptio_safetensors *a, const ckptio_safetensors *b) {
    CHECK(a->count == b->count && a->metadata_count == b->metadata_count && a->has_metadata == b->has_metadata);
    CHECK(a->data_offset == b->data_offset && a->data_size == b->data_size);
    for (size_t i = 0; i < a->count; i++) {
        const ckptio_tensor_info *x = &a->tensors[i], *y = &b->tensors[i];
        CHECK(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim);
        CHECK(x->file_offset == y->file_offset && x->nbytes == y->nbytes);
        CHECK(x->ndim == 0 || memcmp(x->shape, y->shape, x->ndim * sizeof *x->shape) == 0);
        CHECK(a->by_name[i] == b->by_name[i]);
    }
    for (size_t i = 0; i < a->metadata_count; i++)
        CHECK(strcmp(a->metadata[i].key, b->metadata[i].key) == 0 &&
              strcmp(a->metadata[i].value, b->metadata[i].value) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio_safetensors *st = NULL;
    const ckptio_format probe = detect(data, size, CKPTIO_FORMAT_PROBE_BYTES), whole = detect(data, size, size);
    static char full_message[4096];
    ckptio_status full_status;
    ckptio_safetensors *full = parse_full(data, size, &full_status, full_message, sizeof full_message);
    const ckptio_status status = ckptio_safetensors_parse(data, size, size, &st);
    CHECK(status == full_status);
    if (status != CKPTIO_OK) {
        CHECK(st == NULL);
        CHECK(ckptio_last_error_message()[0] != '\0');
        CHECK(strcmp(ckptio_last_error_message(), full_message) == 0);
        return 0;
    }
    check_same_tables(st, full);
    ckptio__st_destroy(full);
    CHECK(probe == CKPTIO_FORMAT_SAFETENSORS && whole == CKPTIO_FORMAT_SAFETENSORS);
    check_invariants(st, size);
    check_round_trip(st, data);
    ckptio_safetensors_close(st);
    return 0;
}
