/*
 * fork_check.c - fork() after CUDA was initialised, on a machine with a real
 * GPU (CI runs tests/test_fork.c on the simulated device; this checks what
 * the driver does). Built and run by tests/gpu/run_gpu_checks.sh.
 *
 *  A. ckptio initialised CUDA and loaded bytes into device memory in the
 *     parent. In the child, a GPU transfer on the inherited engine must fail
 *     at once with CKPTIO_E_NO_CUDA naming fork, ckptio_cuda_available() must
 *     refuse, device memory must classify as host, and host transfers on
 *     the same engine must work. The parent's GPU transfers still work.
 *  B. Only another user of the driver initialised it (cuInit and the
 *     primary context taken directly, as PyTorch does); ckptio never touched
 *     CUDA. The child's first ckptio CUDA call must return (the driver's
 *     refusal, with ckptio's note that the process was forked), not hang.
 * Every child runs under alarm(60): a hang is a failure.
 *
 * Usage: fork_check [DIR]. Exit 0 = passed, 1 = a failure, 77 = no GPU.
 */
#include "ckptio.h"
#include "cuda_shim.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BYTES (4u << 20)

static const char *dir = "/tmp";

#define FAIL(...)                                                  \
    do {                                                           \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);       \
        fprintf(stderr, __VA_ARGS__);                              \
        fprintf(stderr, "\n");                                     \
        return 1;                                                  \
    } while (0)
#define OK(expr)                                                                          \
    do {                                                                                  \
        if ((expr) != CKPTIO_OK) FAIL("%s: %s", #expr, ckptio_last_error_message());      \
    } while (0)

/* Reads the file's first BYTES into `mem` (of `kind`) in one plan. */
static ckptio_status read_into(ckptio_engine *e, const char *path, void *mem, ckptio_mem_kind kind) {
    ckptio_file *f = NULL;
    ckptio_plan *p = NULL;
    ckptio_status st = ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f);
    if (st == CKPTIO_OK) st = ckptio_plan_create(CKPTIO_READ, &p);
    ckptio_extent x = {.file = f, .length = BYTES, .memory = mem, .mem_kind = kind};
    if (st == CKPTIO_OK) st = ckptio_plan_add(p, &x);
    if (st == CKPTIO_OK) st = ckptio_engine_execute(e, p);
    char message[2048];
    snprintf(message, sizeof message, "%s", ckptio_last_error_message());
    ckptio_plan_destroy(p);
    ckptio_file_close(f);
    if (st != CKPTIO_OK) fprintf(stderr, "  (%s: %s)\n", ckptio_status_name(st), message);
    return st;
}

/* Waits for a child; 0 if it exited 0. */
static int wait_child(pid_t pid, const char *what) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) FAIL("%s: waitpid failed", what);
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) FAIL("%s: the child hung (killed after 60 s)", what);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) FAIL("%s: the child failed (status 0x%x)", what, status);
    printf("ok %s\n", what);
    return 0;
}

static int child_a(ckptio_engine *e, const char *path, void *dev, const unsigned char *want) {
    alarm(60);
    if (read_into(e, path, dev, CKPTIO_MEM_CUDA) != CKPTIO_E_NO_CUDA) FAIL("GPU read in the child was not refused");
    if (!strstr(ckptio_last_error_message(), "fork")) FAIL("refusal without fork: %s", ckptio_last_error_message());
    int n = -1;
    if (ckptio_cuda_available(&n) != CKPTIO_E_NO_CUDA) FAIL("ckptio_cuda_available() in the child did not refuse");
    printf("  child: %s\n", ckptio_last_error_message());
    ckptio_mem_kind kind = CKPTIO_MEM_AUTO;
    int device = 5;
    OK(ckptio_mem_classify(dev, &kind, &device));
    if (kind != CKPTIO_MEM_HOST || device != -1) FAIL("device memory classified as %d in the child", (int)kind);
    unsigned char *host = malloc(BYTES);
    if (!host) FAIL("malloc");
    OK(read_into(e, path, host, CKPTIO_MEM_HOST));
    if (memcmp(host, want, BYTES) != 0) FAIL("host bytes differ in the child");
    free(host);
    return 0;
}

static int scenario_a(void) {
    const ckptio__cuda_api *cu = NULL;
    if (ckptio__cuda_load(&cu) != CKPTIO_OK) {
        printf("SKIP: %s\n", ckptio_last_error_message());
        return 77;
    }
    CUdevice dev0;
    CUcontext ctx;
    if (cu->cuDeviceGet(&dev0, 0) != CUDA_SUCCESS || cu->cuDevicePrimaryCtxRetain(&ctx, dev0) != CUDA_SUCCESS ||
        cu->cuCtxPushCurrent(ctx) != CUDA_SUCCESS)
        FAIL("no context on device 0");
    CUdeviceptr d = 0;
    if (cu->cuMemAlloc(&d, BYTES) != CUDA_SUCCESS) FAIL("cuMemAlloc");
    void *dev = (void *)(uintptr_t)d;
    unsigned char *data = malloc(BYTES), *back = malloc(BYTES);
    if (!data || !back) FAIL("malloc");
    for (size_t i = 0; i < BYTES; i++) data[i] = (unsigned char)(i * 131u + 7u);
    char path[1024];
    snprintf(path, sizeof path, "%s/ckptio-fork-check-%d.bin", dir, (int)getpid());
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(data, 1, BYTES, fp) != BYTES || fclose(fp) != 0) FAIL("writing %s", path);
    ckptio_engine *e = NULL;
    OK(ckptio_engine_create(&e));
    OK(read_into(e, path, dev, CKPTIO_MEM_CUDA));
    if (cu->cuMemcpyDtoH(back, d, BYTES) != CUDA_SUCCESS || memcmp(back, data, BYTES) != 0)
        FAIL("parent GPU bytes differ");
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) _exit(child_a(e, path, dev, data));
    if (wait_child(pid, "A: ckptio initialised CUDA, then fork()") != 0) return 1;
    memset(back, 0, BYTES);
    if (cu->cuMemsetD8(d, 0, BYTES) != CUDA_SUCCESS) FAIL("cuMemsetD8");
    OK(read_into(e, path, dev, CKPTIO_MEM_CUDA));
    if (cu->cuMemcpyDtoH(back, d, BYTES) != CUDA_SUCCESS || memcmp(back, data, BYTES) != 0)
        FAIL("parent GPU bytes differ after the child");
    printf("ok A: the parent's GPU transfers still work\n");
    OK(ckptio_engine_destroy(e));
    cu->cuMemFree(d);
    unlink(path);
    free(data);
    free(back);
    return 0;
}

/* In a process where ckptio never loaded the driver: cuInit directly. */
static int scenario_b(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 77;
    CUresult (*init)(unsigned) = NULL;
    CUresult (*get)(CUdevice *, int) = NULL;
    CUresult (*retain)(CUcontext *, CUdevice) = NULL;
    void *s1 = dlsym(lib, "cuInit"), *s2 = dlsym(lib, "cuDeviceGet"), *s3 = dlsym(lib, "cuDevicePrimaryCtxRetain");
    memcpy(&init, &s1, sizeof s1);
    memcpy(&get, &s2, sizeof s2);
    memcpy(&retain, &s3, sizeof s3);
    CUdevice d;
    CUcontext c;
    if (!init || !get || !retain || init(0) != CUDA_SUCCESS || get(&d, 0) != CUDA_SUCCESS ||
        retain(&c, d) != CUDA_SUCCESS)
        FAIL("B: initialising the driver directly");
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        alarm(60);
        int n = -1;
        const ckptio_status st = ckptio_cuda_available(&n);
        printf("  B child: ckptio_cuda_available -> %s, %d devices: %s\n", ckptio_status_name(st), n,
               st == CKPTIO_OK ? "-" : ckptio_last_error_message());
        fflush(NULL);
        _exit(0);
    }
    return wait_child(pid, "B: another library initialised CUDA, then fork(): ckptio's first CUDA call returns");
}

int main(int argc, char **argv) {
    if (argc > 1) dir = argv[1];
    fflush(NULL);
    /* B first, in a process of its own where ckptio has not loaded the driver. */
    const pid_t pid = fork();
    if (pid == 0) _exit(scenario_b());
    int status = 0;
    waitpid(pid, &status, 0);
    const int b = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    const int a = scenario_a();
    if (a == 77 && b == 77) return 77;
    return a == 1 || b == 1 ? 1 : 0;
}
