/*
 * test_common.c - status names, error records, dtype table, size parsing.
 */
#include "common_internal.h"
#include "helpers.h"

#include <errno.h>
#include <string.h>

static void test_status_names(void) {
    T_ASSERT(strcmp(ckptio_status_name(CKPTIO_E_FORMAT), "E_FORMAT") == 0);
    T_ASSERT(strcmp(ckptio_strerror(CKPTIO_OK), "success") == 0);
    T_ASSERT(strcmp(ckptio_strerror((ckptio_status)-999), "unknown status") == 0);
    T_ASSERT(CKPTIO_E_INTERNAL == -19); /* pinned */
    T_ASSERT(CKPTIO_E_STALE == -20);
    T_ASSERT(strcmp(ckptio_status_name(CKPTIO_E_STALE), "E_STALE") == 0);
}

static void test_error_message_composition(void) {
    ckptio_status st = CKPTIO_FAIL_SYS(ENOSPC, "pwrite", "/x/model.safetensors", 4096, "writing tensor data");
    T_ASSERT(st == CKPTIO_E_NOSPC);
    const ckptio_error_info *e = ckptio_last_error();
    T_ASSERT(e->sys_errno == ENOSPC);
    T_ASSERT(e->file_offset == 4096);
    T_ASSERT(strcmp(e->path, "/x/model.safetensors") == 0);
    T_ASSERT(strcmp(e->operation, "pwrite") == 0);
    T_MESSAGE_HAS("/x/model.safetensors: pwrite at offset 4096: writing tensor data: No space left on device");

    st = CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT, &((ckptio__err_ctx){.subject = "tensor 'w'", .file_offset = -1}),
                         "shape has %d dims", 3);
    T_ASSERT(st == CKPTIO_E_FORMAT);
    T_ASSERT(strcmp(ckptio_last_error_message(), "tensor 'w': shape has 3 dims") == 0);
}

static void test_error_save_restore(void) {
    CKPTIO_FAIL(CKPTIO_E_IO, "first");
    ckptio__error_saved *saved = ckptio__error_save();
    CKPTIO_FAIL(CKPTIO_E_NOMEM, "second");
    ckptio__error_restore(saved);
    T_ASSERT(ckptio_last_error()->status == CKPTIO_E_IO);
    T_ASSERT(strcmp(ckptio_last_error_message(), "first") == 0);
}

static void test_dtypes(void) {
    ckptio_dtype d;
    T_OK(ckptio_dtype_from_name("BF16", &d));
    T_ASSERT(d == CKPTIO_DTYPE_BF16);
    T_OK(ckptio_dtype_from_name("torch.float8_e4m3fn", &d));
    T_ASSERT(d == CKPTIO_DTYPE_F8_E4M3);
    T_STATUS(ckptio_dtype_from_name("F128", &d), CKPTIO_E_NOT_FOUND);
    T_ASSERT(ckptio_dtype_bits(CKPTIO_DTYPE_F6_E2M3) == 6);
    T_ASSERT(ckptio_dtype_bits(CKPTIO_DTYPE_COUNT_) == 0);
    uint64_t n;
    T_ASSERT(ckptio__dtype_nbytes(CKPTIO_DTYPE_F6_E2M3, 4, &n) && n == 3);
    T_ASSERT(!ckptio__dtype_nbytes(CKPTIO_DTYPE_F6_E2M3, 3, &n)); /* 18 bits */
    T_ASSERT(!ckptio__dtype_nbytes(CKPTIO_DTYPE_F64, UINT64_MAX / 8, &n));
    /* Reference order: every safetensors dtype has a distinct rank. */
    for (int i = 0; i < CKPTIO_DTYPE_COUNT_; i++)
        for (int j = i + 1; j < CKPTIO_DTYPE_COUNT_; j++)
            if (ckptio__dtype_safetensors_rank(i) >= 0)
                T_ASSERT(ckptio__dtype_safetensors_rank(i) != ckptio__dtype_safetensors_rank(j));
}

static void test_parse_size(void) {
    uint64_t v;
    T_ASSERT(ckptio__parse_size("8M", &v) && v == 8u << 20);
    T_ASSERT(ckptio__parse_size("64KiB", &v) && v == 64u << 10);
    T_ASSERT(ckptio__parse_size("1G", &v) && v == 1u << 30);
    T_ASSERT(ckptio__parse_size("123", &v) && v == 123);
    T_ASSERT(!ckptio__parse_size("12X", &v));
    T_ASSERT(!ckptio__parse_size("", &v));
    T_ASSERT(!ckptio__parse_size("99999999999999999999T", &v));
}

static void test_alloc_failure_hook(void) {
    ckptio__alloc_fail_after(2);
    void *a = ckptio__malloc(10);
    void *b = ckptio__malloc(10);
    void *c = ckptio__malloc(10);
    T_ASSERT(a != NULL && b == NULL && c != NULL);
    ckptio__free(a);
    ckptio__free(c);
}

int main(void) {
    T_RUN(test_status_names);
    T_RUN(test_error_message_composition);
    T_RUN(test_error_save_restore);
    T_RUN(test_dtypes);
    T_RUN(test_parse_size);
    T_RUN(test_alloc_failure_hook);
    printf("version %s\n", ckptio_version());
    return 0;
}
