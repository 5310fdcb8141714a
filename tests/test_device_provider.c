/*
 * test_device_provider.c - how the engine hands device extents to the layer
 * above it (ckptio__device_provider, engine_internal.h): the provider
 * classifies AUTO extents and receives exactly the device extents of a
 * plan (after the host part, with their plan numbers), while the engine
 * moves the host extents itself; an engine without a provider takes every
 * AUTO pointer as host memory and refuses an extent given as CUDA memory.
 */
#include "engine_internal.h"
#include "helpers.h"

#include <string.h>

/* A stand-in device: one host buffer the provider calls "CUDA memory". */
static unsigned char g_device[3000];

typedef struct call_log {
    int calls;
    size_t count;
    size_t plan_index[4];
    uint64_t length[4];
    bool host_done_first; /* the host extent's bytes were already in place */
} call_log;

static call_log g_log;
static unsigned char *g_host;     /* the plan's host destination */
static unsigned char g_expect[8192];

static ckptio_mem_kind fake_classify(const void *ptr) {
    const unsigned char *p = ptr;
    return p >= g_device && p < g_device + sizeof g_device ? CKPTIO_MEM_CUDA : CKPTIO_MEM_HOST;
}

static ckptio_status fake_execute(ckptio_engine *engine, ckptio_direction dir, const ckptio_extent *ext,
                                  size_t count, const ckptio__observer *obs) {
    (void)engine;
    T_ASSERT(dir == CKPTIO_READ && obs == NULL);
    g_log.calls++;
    g_log.count = count;
    g_log.host_done_first = memcmp(g_host, g_expect, 1000) == 0;
    for (size_t i = 0; i < count && i < 4; i++) {
        T_ASSERT(ext[i].mem_kind == CKPTIO_MEM_CUDA);
        g_log.length[i] = ext[i].length;
        /* The "device copy": read the bytes as a GPU layer would. */
        CKPTIO_FORWARD(ckptio__file_io(ext[i].file, CKPTIO_READ, ext[i].memory, ext[i].length, ext[i].file_offset));
    }
    return CKPTIO_OK;
}

static const ckptio__device_provider fake = {.classify = fake_classify, .execute = fake_execute};

static void data_file(void) {
    t_fill_random(g_expect, sizeof g_expect, 19);
    t_write_file(t_path("data.bin"), g_expect, sizeof g_expect);
}

static void test_provider_gets_the_device_extents(void) {
    data_file();
    ckptio_engine *e = NULL;
    T_OK(ckptio__engine_create(&fake, &e));
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, t_path("data.bin"), CKPTIO_OPEN_READ, &f));
    unsigned char host[1000];
    g_host = host;
    memset(host, 0, sizeof host);
    memset(g_device, 0, sizeof g_device);
    memset(&g_log, 0, sizeof g_log);
    ckptio_plan *p = NULL;
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    /* 0: device (AUTO, classified by the provider); 1: host; 2: device (given as CUDA). */
    T_OK(ckptio_plan_add(p, &(ckptio_extent){.file = f, .file_offset = 5000, .length = 2000, .memory = g_device,
                                              .mem_kind = CKPTIO_MEM_AUTO}));
    T_OK(ckptio_plan_add(p, &(ckptio_extent){.file = f, .file_offset = 0, .length = 1000, .memory = host,
                                              .mem_kind = CKPTIO_MEM_AUTO}));
    T_OK(ckptio_plan_add(p, &(ckptio_extent){.file = f, .file_offset = 7000, .length = 1000,
                                              .memory = g_device + 2000, .mem_kind = CKPTIO_MEM_CUDA}));
    T_OK(ckptio_engine_execute(e, p));
    T_ASSERT(g_log.calls == 1 && g_log.count == 2);
    T_ASSERT(g_log.length[0] == 2000 && g_log.length[1] == 1000);
    T_ASSERT(g_log.host_done_first);
    T_ASSERT(memcmp(host, g_expect, 1000) == 0);
    T_ASSERT(memcmp(g_device, g_expect + 5000, 3000) == 0);
    ckptio_plan_destroy(p);
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
}

static void test_no_provider(void) {
    data_file();
    ckptio_engine *e = NULL;
    T_OK(ckptio__engine_create(NULL, &e));
    ckptio_file *f = NULL;
    T_OK(ckptio_file_open(e, t_path("data.bin"), CKPTIO_OPEN_READ, &f));
    unsigned char host[1000];
    ckptio_plan *p = NULL;
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    T_OK(ckptio_plan_add(p, &(ckptio_extent){.file = f, .file_offset = 100, .length = 1000, .memory = host,
                                              .mem_kind = CKPTIO_MEM_AUTO}));
    T_OK(ckptio_engine_execute(e, p));
    T_ASSERT(memcmp(host, g_expect + 100, 1000) == 0);
    T_OK(ckptio_plan_add(p, &(ckptio_extent){.file = f, .file_offset = 2000, .length = 10, .memory = g_device,
                                              .mem_kind = CKPTIO_MEM_CUDA}));
    T_STATUS(ckptio_engine_execute(e, p), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("extent 1 is in device memory and this engine has no GPU layer");
    ckptio_plan_destroy(p);
    T_OK(ckptio_file_close(f));
    T_OK(ckptio_engine_destroy(e));
}

int main(void) {
    T_RUN(test_provider_gets_the_device_extents);
    T_RUN(test_no_provider);
    return 0;
}
