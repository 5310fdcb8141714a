/*
 * test_manifest_race.c - two processes save the same layout with
 * different values to one path with checksums, in a loop (every DDP rank
 * saving the same file, a common mistake), while a third verifies it over
 * and over. Every verification must end clean (OK), with a stale manifest
 * (CKPTIO_E_STALE: the data of one save beside the manifest of the other,
 * or a save replaced the file during the check) or with no manifest (one
 * save had removed the old one and not yet committed its own): never
 * CKPTIO_E_CHECKSUM, which would call sound data corrupt. The data itself
 * must always be one writer's whole version.
 *
 * Before save ids bound a manifest to its data, a third of such
 * verifications reported a checksum mismatch.
 */
#include "helpers.h"

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SECONDS 2.0

enum { NT = 2 };
static const uint64_t sizes[NT] = {256 * 1024 + 3, 4096};
static int64_t shapes[NT][1];
static unsigned char *values[2][NT]; /* per writer */

static void sources(int writer, ckptio_tensor_source out[NT]) {
    static const char *names[NT] = {"w", "b"};
    for (int i = 0; i < NT; i++) {
        shapes[i][0] = (int64_t)sizes[i];
        out[i] = (ckptio_tensor_source){names[i], CKPTIO_DTYPE_U8, 1, shapes[i], values[writer][i], sizes[i],
                                        CKPTIO_MEM_HOST};
    }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A writer: saves until told to stop; counts its saves in *count. */
static void writer(int which, const char *path, volatile uint64_t *count, volatile int *stop) {
    ckptio_engine *e;
    if (ckptio_engine_create(&e) != CKPTIO_OK) _exit(3);
    ckptio_tensor_source src[NT];
    sources(which, src);
    while (!*stop) {
        if (ckptio_safetensors_save(e, path, src, NT, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS) != CKPTIO_OK) {
            fprintf(stderr, "writer %d: %s\n", which, ckptio_last_error_message());
            _exit(4);
        }
        (*count)++;
    }
    ckptio_engine_destroy(e);
    _exit(0);
}

/* Which writer's values the open file holds (asserting it is one). */
static int holder(ckptio_safetensors *st) {
    unsigned char *got = malloc(sizes[0]);
    ckptio_tensor_target tg = {0, got, sizes[0], CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_find(st, "w", &tg.index));
    T_OK(ckptio_safetensors_read(st, &tg, 1));
    int which = -1;
    for (int v = 0; v < 2; v++)
        if (memcmp(got, values[v][0], sizes[0]) == 0) which = v;
    free(got);
    T_ASSERT_MSG(which >= 0, "the file holds neither writer's data");
    return which;
}

static void test_two_writers_and_a_verifier(void) {
    const char *path = t_path("ddp.safetensors");
    volatile uint64_t *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    T_ASSERT(shared != MAP_FAILED);
    volatile int *stop = (volatile int *)(shared + 8);
    pid_t pids[2];
    fflush(stdout);
    for (int w = 0; w < 2; w++) {
        pids[w] = fork();
        T_ASSERT(pids[w] >= 0);
        if (pids[w] == 0) writer(w, path, &shared[w], stop);
    }
    /* The verifier's engine is made after the fork (a forked engine is not
     * the children's to use). */
    ckptio_engine *engine;
    T_OK(ckptio_engine_create(&engine));
    unsigned ok = 0, stale = 0, missing = 0, checks = 0, seen[2] = {0, 0};
    char wrong[2048] = "";
    const double t0 = now();
    while (now() - t0 < SECONDS && !wrong[0]) {
        ckptio_safetensors *st;
        const ckptio_status os = ckptio_safetensors_open(engine, path, &st);
        if (os == CKPTIO_E_NOT_FOUND) continue; /* before the first commit */
        T_OK(os);
        const ckptio_status s = ckptio_safetensors_verify(st, NULL, NULL);
        checks++;
        if (s == CKPTIO_OK) ok++;
        else if (s == CKPTIO_E_STALE) stale++;
        else if (s == CKPTIO_E_NOT_FOUND) missing++;
        else
            snprintf(wrong, sizeof wrong, "verification %u of a file two saves replace: %s: %s", checks,
                     ckptio_status_name(s), ckptio_last_error_message());
        seen[holder(st)]++;
        ckptio_safetensors_close(st);
    }
    *stop = 1;
    for (int w = 0; w < 2; w++) {
        int ws;
        T_ASSERT(waitpid(pids[w], &ws, 0) == pids[w]);
        T_ASSERT_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "writer %d failed (status 0x%x)", w, ws);
    }
    T_ASSERT_MSG(!wrong[0], "%s", wrong);
    /* After the race: a clean file or a stale manifest, never corruption. */
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    const ckptio_status last = ckptio_safetensors_verify(st, NULL, NULL);
    T_ASSERT_MSG(last == CKPTIO_OK || last == CKPTIO_E_STALE, "final verification: %s", ckptio_last_error_message());
    ckptio_safetensors_close(st);
    printf("# %.0f s: %llu + %llu saves, %u verifications: %u ok, %u stale, %u without manifest; data of "
           "writer 0/1 seen %u/%u times; final state %s\n",
           SECONDS, (unsigned long long)shared[0], (unsigned long long)shared[1], checks, ok, stale, missing, seen[0],
           seen[1], ckptio_status_name(last));
    /* The race must really have run: both writers saved, the verifier saw
     * both versions, many times. */
    T_ASSERT(shared[0] >= 10 && shared[1] >= 10 && checks >= 30 && seen[0] >= 3 && seen[1] >= 3);
    T_OK(ckptio_engine_destroy(engine));
    munmap((void *)shared, 4096);
}

int main(void) {
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < NT; i++) {
            values[v][i] = malloc(sizes[i]);
            t_fill_random(values[v][i], sizes[i], 100 + (uint64_t)(v * NT + i));
        }
    T_RUN(test_two_writers_and_a_verifier);
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < NT; i++) free(values[v][i]);
    return T_EXIT_PASS;
}
