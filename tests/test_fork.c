/*
 * test_fork.c - engines in a fork()ed child (multiprocessing's default start
 * method and DataLoader workers fork a process that already used ckptio).
 *
 * The child inherits the parent's engines without their worker threads,
 * with locks a vanished thread may hold, io_uring rings it shares with the
 * parent and a device it must not use. Each case forks, runs ckptio in the
 * child under alarm() (a hang kills the child with SIGALRM, which fails the
 * test instead of blocking ctest), and checks the bytes the child moved:
 *  - an engine whose pool ran in the parent loads and saves in the child;
 *  - the same while another parent thread was in the middle of a transfer
 *    (the engine was busy, its locks possibly held);
 *  - destroying the inherited engine in the child neither joins the
 *    parent's threads nor touches its rings;
 *  - a GPU transfer in the child fails at once with CKPTIO_E_NO_CUDA naming
 *    fork (the simulated device stands in for CUDA, which a forked child
 *    cannot use), while host transfers on the same engine still work.
 * Every case runs on pread and, where the kernel allows, io_uring.
 */
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILD_TIMEOUT_S 30
#define FILE_BYTES (3u << 20)

static ckptio_backend g_backend = CKPTIO_BACKEND_PREAD;

static ckptio_engine *new_engine(int64_t threads, int64_t chunk) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_BACKEND, g_backend));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, chunk));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_SYNC, 0));
    return e;
}

/* Runs fn(arg) in a child and fails unless it exits 0 within the timeout. */
static void in_child(const char *what, void (*fn)(void *arg), void *arg) {
    fflush(NULL);
    const pid_t pid = fork();
    T_ASSERT_MSG(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        setenv("CKPTIO_TEST_KEEP", "1", 1); /* the parent owns the temporary directory */
        alarm(CHILD_TIMEOUT_S);
        fn(arg);
        fflush(NULL);
        _exit(T_EXIT_PASS);
    }
    int status = 0;
    pid_t got;
    do {
        got = waitpid(pid, &status, 0);
    } while (got < 0 && errno == EINTR);
    T_ASSERT_MSG(got == pid, "waitpid: %s", strerror(errno));
    T_ASSERT_MSG(!(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM),
                 "%s: the child hung (killed after %d s)", what, CHILD_TIMEOUT_S);
    T_ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the child failed (status 0x%x)", what, status);
}

/* Reads the whole file through `e` in one plan and compares it with `want`. */
static void read_and_compare(ckptio_engine *e, const char *path, const unsigned char *want, size_t n) {
    unsigned char *got = malloc(n);
    T_ASSERT(got);
    memset(got, 0, n);
    ckptio_file *f = NULL;
    ckptio_plan *p = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    ckptio_extent x = {.file = f, .length = n, .memory = got, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_plan_add(p, &x));
    T_OK(ckptio_engine_execute(e, p));
    T_ASSERT_MSG(memcmp(got, want, n) == 0, "%s: bytes differ", path);
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_close(f));
    free(got);
}

/* Saves `data` as a one-tensor safetensors file through `e`. */
static void save_tensor(ckptio_engine *e, const char *path, const unsigned char *data, size_t n) {
    const int64_t shape[1] = {(int64_t)n};
    const ckptio_tensor_source t = {.name = "w", .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = shape,
                                    .data = data, .nbytes = n, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_save(e, path, &t, 1, NULL, 0, 0));
}

/* Loads the tensor save_tensor() wrote and compares it with `want`. */
static void load_tensor(ckptio_engine *e, const char *path, const unsigned char *want, size_t n) {
    unsigned char *got = malloc(n);
    T_ASSERT(got);
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(e, path, &st));
    const ckptio_tensor_target t = {.index = 0, .data = got, .capacity = n, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_read(st, &t, 1));
    T_OK(ckptio_safetensors_close(st));
    T_ASSERT_MSG(memcmp(got, want, n) == 0, "%s: tensor bytes differ", path);
    free(got);
}

typedef struct child_io {
    ckptio_engine *engine;
    const char *in, *out;
    const unsigned char *data, *data2;
    size_t n;
    bool destroy; /* false: a parent thread had a file of the engine open at fork() */
} child_io;

/* The child loads what the parent saved and saves something of its own,
 * on the engine it inherited and on a new one; then frees both. */
static void child_load_save(void *arg) {
    child_io *c = arg;
    ckptio__io_inject_reset(); /* a parent's slow-down does not belong to the child */
    load_tensor(c->engine, c->in, c->data, c->n);
    save_tensor(c->engine, c->out, c->data2, c->n);
    load_tensor(c->engine, c->out, c->data2, c->n);
    ckptio_engine *fresh = new_engine(4, 64 << 10);
    load_tensor(fresh, c->in, c->data, c->n);
    T_OK(ckptio_engine_destroy(fresh));
    ckptio_stats s;
    T_OK(ckptio_engine_stats(c->engine, &s));
    T_ASSERT_MSG(s.staging_in_use == 0, "staging in use in the child: %llu", (unsigned long long)s.staging_in_use);
    if (c->destroy) T_OK(ckptio_engine_destroy(c->engine));
    else T_STATUS(ckptio_engine_destroy(c->engine), CKPTIO_E_BUSY);
}

static unsigned char *random_bytes(size_t n, uint64_t seed) {
    unsigned char *b = malloc(n);
    T_ASSERT(b);
    t_fill_random(b, n, seed);
    return b;
}

static void test_child_after_parent_used_engine(void) {
    unsigned char *data = random_bytes(FILE_BYTES, 1), *data2 = random_bytes(FILE_BYTES, 2);
    const char *in = t_path("parent.safetensors"), *out = t_path("child.safetensors");
    ckptio_engine *e = new_engine(4, 64 << 10); /* 48 chunks: every pool thread works */
    save_tensor(e, in, data, FILE_BYTES);
    load_tensor(e, in, data, FILE_BYTES);
    child_io c = {.engine = e, .in = in, .out = out, .data = data, .data2 = data2, .n = FILE_BYTES, .destroy = true};
    in_child("load and save after the parent used the engine", child_load_save, &c);
    /* The parent's engine, threads and rings are untouched by the child. */
    load_tensor(e, out, data2, FILE_BYTES);
    load_tensor(e, in, data, FILE_BYTES);
    T_OK(ckptio_engine_destroy(e));
    free(data);
    free(data2);
}

/* ---- fork while another thread is inside a transfer ---------------------------- */

typedef struct busy_load {
    ckptio_engine *engine;
    const char *path;
    const unsigned char *want;
    atomic_int started; /* the transfer moved bytes: fork now */
} busy_load;

static int note_progress(uint64_t done, uint64_t total, void *user) {
    (void)total;
    busy_load *b = user;
    if (done > 0) atomic_store(&b->started, 1);
    return 0;
}

static void *busy_thread(void *arg) {
    busy_load *b = arg;
    load_tensor(b->engine, b->path, b->want, FILE_BYTES);
    return NULL;
}

static void test_fork_during_transfer(void) {
    unsigned char *data = random_bytes(FILE_BYTES, 3), *data2 = random_bytes(FILE_BYTES, 4);
    const char *in = t_path("busy.safetensors"), *out = t_path("busy-child.safetensors");
    ckptio_engine *e = new_engine(4, 16 << 10); /* 192 requests */
    save_tensor(e, in, data, FILE_BYTES);
    busy_load b = {.engine = e, .path = in, .want = data};
    T_OK(ckptio_engine_set_progress(e, note_progress, &b));
    ckptio__io_inject_delay(2000); /* 2 ms per request: ~100 ms on 4 threads */
    pthread_t t;
    T_ASSERT(pthread_create(&t, NULL, busy_thread, &b) == 0);
    while (!atomic_load(&b.started)) usleep(100);
    child_io c = {.engine = e, .in = in, .out = out, .data = data, .data2 = data2, .n = FILE_BYTES};
    in_child("load and save while the parent was mid-transfer", child_load_save, &c);
    T_ASSERT(pthread_join(t, NULL) == 0);
    ckptio__io_inject_reset();
    T_OK(ckptio_engine_set_progress(e, NULL, NULL));
    load_tensor(e, out, data2, FILE_BYTES);
    T_OK(ckptio_engine_destroy(e));
    free(data);
    free(data2);
}

/* ---- destroying an inherited engine ---------------------------------------------- */

static void child_destroy(void *arg) { T_OK(ckptio_engine_destroy(arg)); }

static void test_destroy_in_child(void) {
    unsigned char *data = random_bytes(FILE_BYTES, 5);
    const char *in = t_path("destroy.safetensors");
    ckptio_engine *e = new_engine(4, 64 << 10);
    save_tensor(e, in, data, FILE_BYTES);
    in_child("destroying an engine whose threads ran in the parent", child_destroy, e);
    load_tensor(e, in, data, FILE_BYTES);
    T_OK(ckptio_engine_destroy(e));
    free(data);
}

/* ---- the device in the child --------------------------------------------------------- */

typedef struct child_gpu {
    ckptio_engine *engine;
    const char *path;
    unsigned char *device;
    const unsigned char *want;
} child_gpu;

static ckptio_status gpu_read(ckptio_engine *e, const char *path, void *dst, ckptio_mem_kind kind) {
    ckptio_file *f = NULL;
    ckptio_plan *p = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    ckptio_extent x = {.file = f, .length = FILE_BYTES, .memory = dst, .mem_kind = kind};
    T_OK(ckptio_plan_add(p, &x));
    const ckptio_status st = ckptio_engine_execute(e, p);
    char message[2048];
    snprintf(message, sizeof message, "%s", ckptio_last_error_message());
    T_OK(ckptio_plan_destroy(p));
    T_OK(ckptio_file_close(f));
    if (st != CKPTIO_OK) {
        T_ASSERT_MSG(strstr(message, "fork") != NULL, "the refusal does not mention fork: %s", message);
        T_ASSERT_MSG(strstr(message, "spawn") != NULL, "the refusal does not say what to do: %s", message);
    }
    return st;
}

static void child_gpu_refused(void *arg) {
    child_gpu *c = arg;
    T_STATUS(gpu_read(c->engine, c->path, c->device, CKPTIO_MEM_CUDA), CKPTIO_E_NO_CUDA);
    /* CKPTIO_MEM_AUTO classifies without the device: host memory. */
    ckptio_mem_kind kind = CKPTIO_MEM_AUTO;
    int device = 7;
    T_OK(ckptio_mem_classify(c->device, &kind, &device));
    T_ASSERT(kind == CKPTIO_MEM_HOST && device == -1);
    read_and_compare(c->engine, c->path, c->want, FILE_BYTES);
    T_OK(ckptio_engine_destroy(c->engine)); /* leaves the parent's device state alone */
}

static void test_gpu_in_child(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio__gpu_sim_configure(NULL);
    unsigned char *data = random_bytes(FILE_BYTES, 6);
    const char *path = t_path("gpu.bin");
    t_write_file(path, data, FILE_BYTES);
    ckptio_engine *e = new_engine(2, 64 << 10);
    unsigned char *dev = ckptio__gpu_sim_device_alloc(FILE_BYTES);
    T_ASSERT(dev);
    T_OK(gpu_read(e, path, dev, CKPTIO_MEM_CUDA));
    T_ASSERT(memcmp(dev, data, FILE_BYTES) == 0);
    child_gpu c = {.engine = e, .path = path, .device = dev, .want = data};
    in_child("a GPU transfer in the child", child_gpu_refused, &c);
    /* The parent's device state still works. */
    memset(dev, 0, FILE_BYTES);
    T_OK(gpu_read(e, path, dev, CKPTIO_MEM_CUDA));
    T_ASSERT(memcmp(dev, data, FILE_BYTES) == 0);
    T_OK(ckptio_engine_destroy(e));
    ckptio__gpu_sim_device_free(dev);
    ckptio__gpu_set_ops(NULL);
    free(data);
}

static void run_all(void) {
    T_RUN(test_child_after_parent_used_engine);
    T_RUN(test_fork_during_transfer);
    T_RUN(test_destroy_in_child);
    T_RUN(test_gpu_in_child);
}

int main(void) {
    g_backend = CKPTIO_BACKEND_PREAD;
    printf("# backend pread\n");
    run_all();
    const char *why = "";
    if (ckptio__io_uring_probe(&why) == 0) {
        g_backend = CKPTIO_BACKEND_IO_URING;
        printf("# backend io_uring\n");
        run_all();
    } else {
        printf("# io_uring unavailable (%s): pread only\n", why);
    }
    return T_EXIT_PASS;
}
