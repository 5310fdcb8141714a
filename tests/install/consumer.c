/* consumer.c - a program outside the tree that uses an installed ckptio, its stable core and (opting
 * in) its experimental headers: built by scripts/test.sh through pkg-config and through
 * find_package(ckptio). */
#define CKPTIO_EXPERIMENTAL
#include <ckptio.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    ckptio_engine *engine;
    if (ckptio_engine_create(&engine) != CKPTIO_OK) {
        fprintf(stderr, "%s\n", ckptio_last_error_message());
        return 1;
    }
    ckptio_backend backend;
    if (ckptio_engine_backend(engine, &backend) != CKPTIO_OK) return 1;
    printf("ckptio %s, backend %s\n", ckptio_version(), ckptio_backend_name(backend));
    /* The experimental header is installed and its functions link. */
    const char *const files[] = {"__0_0123456789ab_0.distcp", "__1_0123456789ab_0.distcp"};
    if (ckptio_dcp_saved_by_ranks(files, 2) != 1 || ckptio_dcp_saved_by_ranks(files, 1) != 0) {
        fprintf(stderr, "ckptio_dcp_saved_by_ranks: wrong answer\n");
        return 1;
    }
    return ckptio_engine_destroy(engine) == CKPTIO_OK ? 0 : 1;
}
