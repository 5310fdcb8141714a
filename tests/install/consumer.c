/* consumer.c - a program outside the tree that uses an installed ckptio, both of its headers:
 * built by scripts/test.sh through pkg-config and through find_package(ckptio). */
#include <ckptio.h>
#include <ckptio_experimental.h>
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
    const char *const files[] = {"__0_0123456789ab_0.distcp"};
    char token[13];
    if (ckptio_dcp_save_token(files, 1, token) != CKPTIO_OK || strcmp(token, "0123456789ab") != 0) {
        fprintf(stderr, "ckptio_dcp_save_token: %s\n", ckptio_last_error_message());
        return 1;
    }
    return ckptio_engine_destroy(engine) == CKPTIO_OK ? 0 : 1;
}
