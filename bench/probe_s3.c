/*
 * probe_s3.c - ckptio's object backend against an S3 endpoint: writes one
 * object of SIZE_MIB from host memory (multipart upload through the engine,
 * committed), then reads it back REPS times (ranged GETs through the
 * engine), and prints GB/s and CPU seconds per GB of each pass.
 *
 *   cc -O2 bench/probe_s3.c -Lbuild -lckptio -Wl,-rpath,$PWD/build -o /tmp/probe_s3
 *   eval "$(scripts/s3_server.sh start)"
 *   /tmp/probe_s3 s3://ckptio-test/bench/obj 256 3
 *
 * The endpoint and credentials come from the AWS_* variables; the engine's
 * settings from CKPTIO_* (CKPTIO_S3_CONCURRENCY, CKPTIO_S3_PART_BYTES,
 * CKPTIO_THREADS, CKPTIO_CHUNK_BYTES). The object is deleted at the end.
 */
#define CKPTIO_EXPERIMENTAL /* s3:// objects: ckptio/object.h */
#include "../include/ckptio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static int fail(const char *what, ckptio_status st) {
    fprintf(stderr, "%s: %s (%s)\n", what, ckptio_last_error_message(), ckptio_status_name(st));
    return 1;
}

static void report(const char *what, uint64_t bytes, double wall, double cpus) {
    const double gb = bytes / 1e9;
    printf("%-6s %8.1f MiB  %6.3f s  %7.3f GB/s  %6.2f CPU s/GB\n", what, bytes / 1048576.0, wall, gb / wall,
           cpus / gb);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s s3://BUCKET/KEY SIZE_MIB [REPS]\n", argv[0]);
        return 2;
    }
    const char *url = argv[1];
    const uint64_t size = strtoull(argv[2], NULL, 10) << 20;
    const int reps = argc > 3 ? atoi(argv[3]) : 3;
    unsigned char *data = malloc(size), *back = malloc(size);
    if (!data || !back) return 1;
    for (uint64_t i = 0; i < size; i += 8) {
        uint64_t v = i * 0x9E3779B97F4A7C15ull;
        memcpy(data + i, &v, size - i < 8 ? size - i : 8);
    }
    memset(back, 0, size); /* fault the pages in before the clock runs */
    ckptio_engine *e;
    ckptio_status st = ckptio_engine_create(&e);
    if (st != CKPTIO_OK) return fail("engine", st);
    for (int r = 0; r < reps; r++) {
        ckptio_file *f;
        double t0 = now(), c0 = cpu();
        if ((st = ckptio_file_open(e, url, CKPTIO_OPEN_WRITE, &f)) != CKPTIO_OK) return fail("open", st);
        if ((st = ckptio_file_truncate(f, size)) != CKPTIO_OK) return fail("truncate", st);
        const ckptio_extent w = {.file = f, .length = size, .memory = data, .mem_kind = CKPTIO_MEM_HOST};
        if ((st = ckptio_engine_execute_extents(e, CKPTIO_WRITE, &w, 1)) != CKPTIO_OK) return fail("write", st);
        if ((st = ckptio_file_commit(f)) != CKPTIO_OK) return fail("commit", st);
        ckptio_file_close(f);
        report("put", size, now() - t0, cpu() - c0);
    }
    for (int r = 0; r < reps; r++) {
        ckptio_file *f;
        double t0 = now(), c0 = cpu();
        if ((st = ckptio_file_open(e, url, CKPTIO_OPEN_READ, &f)) != CKPTIO_OK) return fail("open", st);
        const ckptio_extent x = {.file = f, .length = size, .memory = back, .mem_kind = CKPTIO_MEM_HOST};
        if ((st = ckptio_engine_execute_extents(e, CKPTIO_READ, &x, 1)) != CKPTIO_OK) return fail("read", st);
        ckptio_file_close(f);
        report("get", size, now() - t0, cpu() - c0);
        if (memcmp(back, data, size) != 0) {
            fprintf(stderr, "read back differs\n");
            return 1;
        }
    }
    ckptio_object_delete(e, url);
    ckptio_engine_destroy(e);
    free(data);
    free(back);
    return 0;
}
