/*
 * test_gpu_nodriver.c - without a CUDA driver, GPU calls fail with
 * CKPTIO_E_NO_CUDA and a message saying why, memory is classified as host,
 * and host transfers through the GDS file API keep working (a file it
 * creates gets its mode narrowed by the umask). The driver is
 * made unavailable with CKPTIO_CUDA_LIBRARY pointing at a missing file, so
 * the test means the same on machines that have a GPU.
 */
#include "gpu_internal.h"
#include "helpers.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

int main(void) {
    setenv("CKPTIO_CUDA_LIBRARY", "/nonexistent/ckptio-test/libcuda.so.1", 1);
    setenv("CKPTIO_CUFILE_LIBRARY", "/nonexistent/ckptio-test/libcufile.so.0", 1);

    int n = -1;
    T_STATUS(ckptio_cuda_available(&n), CKPTIO_E_NO_CUDA);
    T_MESSAGE_HAS("no CUDA driver");
    T_MESSAGE_HAS("/nonexistent/ckptio-test/libcuda.so.1");
    T_ASSERT(n == -1);
    /* the same answer every time (the load is attempted once) */
    T_STATUS(ckptio_cuda_available(NULL), CKPTIO_E_NO_CUDA);
    T_MESSAGE_HAS("dlopen");

    unsigned char host[64];
    ckptio_mem_kind kind = CKPTIO_MEM_CUDA;
    int dev = 5;
    T_OK(ckptio_mem_classify(host, &kind, &dev));
    T_ASSERT(kind == CKPTIO_MEM_HOST && dev == -1);
    T_ASSERT(ckptio__gpu_classify(host) == CKPTIO_MEM_HOST);

    uint64_t fr = 0, tot = 0;
    T_STATUS(ckptio__gpu_mem_info(0, &fr, &tot), CKPTIO_E_NO_CUDA);
    T_MESSAGE_HAS("no CUDA driver");
    T_STATUS(ckptio_gpu_check_free(0, 1, NULL), CKPTIO_E_NO_CUDA);

    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("nodriver.bin");
    unsigned char data[10000];
    t_fill_random(data, sizeof data, 1);
    t_write_file(path, data, sizeof data);
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_READ, &f));
    ckptio_extent ex = {.file = f, .file_offset = 0, .length = 16, .memory = host, .mem_kind = CKPTIO_MEM_CUDA};
    T_STATUS(ckptio__gpu_execute(e, CKPTIO_READ, &ex, 1), CKPTIO_E_NO_CUDA);
    T_MESSAGE_HAS("no CUDA driver");
    T_OK(ckptio_file_close(f));

    /* The GDS file API works for host memory; cuFile is simply not used. */
    ckptio_gds_file *g = NULL;
    T_OK(ckptio_gds_open(e, path, O_RDONLY, 0, &g));
    T_ASSERT(strcmp(ckptio_gds_file_refusal(g), "no CUDA driver") == 0);
    unsigned char buf[5000];
    uint64_t got = 0;
    T_OK(ckptio_gds_read(g, buf, 4000, 4097, 3, &got));
    T_ASSERT(got == 4000 && memcmp(buf + 3, data + 4097, 4000) == 0);
    ckptio_io_path p;
    T_OK(ckptio_gds_file_path(g, &p));
    T_ASSERT(p == CKPTIO_IO_PATH_HOST);
    T_ASSERT(strcmp(ckptio_io_path_name(p), "host") == 0);
    ckptio_gds_request *r = NULL;
    T_OK(ckptio_gds_read_async(g, buf, 100, 0, 0, NULL, &r));
    T_OK(ckptio_gds_request_wait(r, &got));
    T_ASSERT(got == 100 && memcmp(buf, data, 100) == 0);
    T_OK(ckptio_gds_request_destroy(r));
    T_OK(ckptio_gds_close(g));

    /* A file ckptio_gds_open creates gets `mode` narrowed by the umask, as
     * open(2) gives it (0: 0666); a file that exists keeps its mode. */
    static const struct {
        mode_t umask;
        unsigned mode, want;
    } modes[] = {{022, 0666, 0644}, {077, 0666, 0600}, {077, 0640, 0600}, {022, 0, 0644}, {027, 0660, 0640}};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        char name[64];
        snprintf(name, sizeof name, "created-%zu.bin", i);
        const char *created = t_path(name);
        const mode_t old = umask(modes[i].umask);
        const ckptio_status st = ckptio_gds_open(e, created, O_RDWR | O_CREAT, modes[i].mode, &g);
        umask(old);
        T_OK(st);
        T_OK(ckptio_gds_close(g));
        struct stat sb;
        T_ASSERT(stat(created, &sb) == 0);
        T_ASSERT_MSG((sb.st_mode & 0777) == modes[i].want, "umask %03o, mode %03o: %03o, expected %03o",
                     (unsigned)modes[i].umask, modes[i].mode, (unsigned)(sb.st_mode & 0777), modes[i].want);
    }
    T_ASSERT(chmod(path, 0604) == 0);
    T_OK(ckptio_gds_open(e, path, O_RDWR | O_CREAT, 0600, &g));
    T_OK(ckptio_gds_close(g));
    struct stat psb;
    T_ASSERT(stat(path, &psb) == 0 && (psb.st_mode & 0777) == 0604);

    /* Forcing cuFile without a driver names the missing driver. */
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, CKPTIO_GPU_PATH_CUFILE));
    T_STATUS(ckptio_gds_open(e, path, O_RDONLY, 0, &g), CKPTIO_E_NO_CUDA);
    T_MESSAGE_HAS("no CUDA driver");
    T_OK(ckptio_engine_destroy(e));
    printf("ok no-driver behaviour\n");
    return T_EXIT_PASS;
}
