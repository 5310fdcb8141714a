/* consumer.c - a program outside the tree that uses an installed ckptio:
 * built by scripts/test.sh through pkg-config and through find_package(ckptio). */
#include <ckptio.h>
#include <stdio.h>

int main(void) {
    ckptio_engine *engine;
    if (ckptio_engine_create(&engine) != CKPTIO_OK) {
        fprintf(stderr, "%s\n", ckptio_last_error_message());
        return 1;
    }
    ckptio_backend backend;
    if (ckptio_engine_backend(engine, &backend) != CKPTIO_OK) return 1;
    printf("ckptio %s, backend %s\n", ckptio_version(), ckptio_backend_name(backend));
    return ckptio_engine_destroy(engine) == CKPTIO_OK ? 0 : 1;
}
