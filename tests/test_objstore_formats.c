/*
 * test_objstore_formats.c - the existing format code on s3:// objects,
 * through the file layer only (skipped, exit 77, without an S3 server): a
 * safetensors file (with its checksum manifest) and a torch.save file saved
 * to S3 are the bytes the same saves write on local disk, load back
 * bit-exact through ckptio_safetensors_open / ckptio_torch_open, and verify;
 * a save that fails (a tensor refused half-way) leaves the older object;
 * saves from and loads into GPU memory (the simulated device) go through
 * the staging pipeline.
 */
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "objstore_helpers.h"

static const int64_t shape_a[] = {1024, 2048};
static const int64_t shape_b[] = {3000001};
static const int64_t shape_c[] = {64, 9999};

typedef struct model {
    unsigned char *a, *b, *c;
    ckptio_tensor_source src[3];
} model;

static void make_model(model *m, uint64_t seed) {
    m->a = malloc(1024 * 2048 * 4);
    m->b = malloc(3000001);
    m->c = malloc(64 * 9999 * 2);
    t_fill_random(m->a, 1024 * 2048 * 4, seed);
    t_fill_random(m->b, 3000001, seed + 1);
    t_fill_random(m->c, 64 * 9999 * 2, seed + 2);
    m->src[0] = (ckptio_tensor_source){"layer.weight", CKPTIO_DTYPE_F32, 2, shape_a, m->a, 1024 * 2048 * 4,
                                       CKPTIO_MEM_HOST};
    m->src[1] = (ckptio_tensor_source){"bytes", CKPTIO_DTYPE_U8, 1, shape_b, m->b, 3000001, CKPTIO_MEM_HOST};
    m->src[2] = (ckptio_tensor_source){"emb", CKPTIO_DTYPE_BF16, 2, shape_c, m->c, 64 * 9999 * 2, CKPTIO_MEM_HOST};
}

static void free_model(model *m) {
    free(m->a);
    free(m->b);
    free(m->c);
}

static void same_as_local(ckptio_engine *e, const char *url, const char *local) {
    size_t n_obj, n_loc;
    unsigned char *obj = s3_object_bytes(e, url, &n_obj);
    unsigned char *loc = t_read_file(local, &n_loc);
    size_t at = 0;
    while (at < n_obj && at < n_loc && obj[at] == loc[at]) at++;
    T_ASSERT_MSG(n_obj == n_loc && at == n_loc, "%s differs from %s at byte %zu (%zu vs %zu bytes)", url, local, at,
                 n_obj, n_loc);
    free(obj);
    free(loc);
}

static void test_safetensors(void) {
    ckptio_engine *e = s3_test_engine();
    model m;
    make_model(&m, 21);
    const char *url = s3_url("model.safetensors");
    const char *local = t_path("model.safetensors");
    const ckptio_kv meta[] = {{"format", "pt"}};
    T_OK(ckptio_safetensors_save(e, url, m.src, 3, meta, 1, 0));
    T_OK(ckptio_safetensors_save(e, local, m.src, 3, meta, 1, 0));
    same_as_local(e, url, local);
    /* With checksums: the header carries the save's own manifest id, so only sizes compare. */
    T_OK(ckptio_safetensors_save(e, url, m.src, 3, meta, 1, CKPTIO_SAFETENSORS_CHECKSUMS));
    T_OK(ckptio_safetensors_save(e, local, m.src, 3, meta, 1, CKPTIO_SAFETENSORS_CHECKSUMS));
    char murl[1500], mlocal[1500];
    T_OK(ckptio_manifest_path(url, murl, sizeof murl));
    T_OK(ckptio_manifest_path(local, mlocal, sizeof mlocal));
    size_t n_obj, n_loc;
    unsigned char *obj = s3_object_bytes(e, murl, &n_obj), *loc = t_read_file(mlocal, &n_loc);
    T_ASSERT(n_obj == n_loc && n_obj > 0); /* same layout; its ids are the save's own */
    free(obj);
    free(loc);

    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(e, url, &st));
    size_t count;
    T_OK(ckptio_safetensors_count(st, &count));
    T_ASSERT(count == 3);
    unsigned char *a = calloc(1, 1024 * 2048 * 4), *b = calloc(1, 3000001), *c = calloc(1, 64 * 9999 * 2);
    size_t ia, ib, ic;
    T_OK(ckptio_safetensors_find(st, "layer.weight", &ia));
    T_OK(ckptio_safetensors_find(st, "bytes", &ib));
    T_OK(ckptio_safetensors_find(st, "emb", &ic));
    const ckptio_tensor_target targets[] = {{ia, a, 1024 * 2048 * 4, CKPTIO_MEM_HOST},
                                            {ib, b, 3000001, CKPTIO_MEM_HOST},
                                            {ic, c, 64 * 9999 * 2, CKPTIO_MEM_AUTO}};
    T_OK(ckptio_safetensors_read(st, targets, 3));
    T_ASSERT(memcmp(a, m.a, 1024 * 2048 * 4) == 0 && memcmp(b, m.b, 3000001) == 0 &&
             memcmp(c, m.c, 64 * 9999 * 2) == 0);
    ckptio_verify_report report;
    T_OK(ckptio_safetensors_verify(st, murl, &report));
    memset(a, 0, 1024 * 2048 * 4);
    T_OK(ckptio_safetensors_read_verified(st, murl, targets, 1));
    T_ASSERT(memcmp(a, m.a, 1024 * 2048 * 4) == 0);
    T_OK(ckptio_safetensors_close(st));

    /* A save that fails half-way (a tensor whose size does not match its shape) keeps the older object. */
    model m2;
    make_model(&m2, 99);
    m2.src[2].nbytes -= 2;
    size_t before_n, after_n;
    unsigned char *before = s3_object_bytes(e, url, &before_n);
    T_STATUS(ckptio_safetensors_save(e, url, m2.src, 3, NULL, 0, 0), CKPTIO_E_INVAL);
    unsigned char *after = s3_object_bytes(e, url, &after_n);
    T_ASSERT(before_n == after_n && memcmp(before, after, after_n) == 0);
    free(before);
    free(after);
    free_model(&m2);
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_object_delete(e, murl));
    free(a);
    free(b);
    free(c);
    free_model(&m);
    T_OK(ckptio_engine_destroy(e));
}

static void test_torch_save(void) {
    ckptio_engine *e = s3_test_engine();
    model m;
    make_model(&m, 31);
    const char *url = s3_url("model.pt");
    const char *local = t_path("model.pt");
    T_OK(ckptio_torch_save_tensors(e, url, m.src, 3, NULL));
    T_OK(ckptio_torch_save_tensors(e, local, m.src, 3, NULL));
    /* Byte for byte up to the archive's serialization id, which every save draws anew. */
    size_t n_obj, n_loc;
    unsigned char *obj = s3_object_bytes(e, url, &n_obj), *loc = t_read_file(local, &n_loc);
    T_ASSERT(n_obj == n_loc && memcmp(obj, loc, (1024 * 2048 * 4) + 3000001 + (64 * 9999 * 2)) == 0);
    free(obj);
    free(loc);
    ckptio_torch *t;
    T_OK(ckptio_torch_open(e, url, &t));
    size_t count;
    T_OK(ckptio_torch_count(t, &count));
    T_ASSERT(count == 3);
    ckptio_torch_verify_report report;
    T_OK(ckptio_torch_verify(t, &report));
    size_t i;
    T_OK(ckptio_torch_find(t, "bytes", &i));
    unsigned char *b = calloc(1, 3000001);
    const ckptio_tensor_target target = {i, b, 3000001, CKPTIO_MEM_HOST};
    T_OK(ckptio_torch_read(t, &target, 1));
    T_ASSERT(memcmp(b, m.b, 3000001) == 0);
    T_OK(ckptio_torch_close(t));
    T_OK(ckptio_object_delete(e, url));
    free(b);
    free_model(&m);
    T_OK(ckptio_engine_destroy(e));
}

/* GPU memory (the simulated device): a save from device memory goes through
 * the staging pipeline into the object's parts, and a load into device
 * memory reads the object's ranges into staging, one GET per chunk, several
 * per window at once, and copies them over. */
static void test_gpu_memory(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    model m;
    make_model(&m, 41);
    const char *url = s3_url("gpu.safetensors");
    const ckptio_gpu_path paths[] = {CKPTIO_GPU_PATH_AUTO, CKPTIO_GPU_PATH_PIPELINE};
    for (size_t p = 0; p < 2; p++) {
        ckptio_engine *e = s3_test_engine();
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_GPU_PATH, paths[p]));
        ckptio_tensor_source dev[3];
        for (int i = 0; i < 3; i++) {
            dev[i] = m.src[i];
            void *d = ckptio__gpu_sim_device_alloc(m.src[i].nbytes);
            memcpy(d, m.src[i].data, m.src[i].nbytes);
            dev[i].data = d;
            dev[i].mem_kind = CKPTIO_MEM_CUDA;
        }
        T_OK(ckptio_safetensors_save(e, url, dev, 3, NULL, 0, 0));
        ckptio_safetensors *st;
        T_OK(ckptio_safetensors_open(e, url, &st));
        uint64_t data_size;
        T_OK(ckptio_safetensors_data_size(st, &data_size));
        unsigned char *d = ckptio__gpu_sim_device_alloc(data_size);
        /* One worker, 2 MiB chunks, 16 MiB of staging: windows of 4 chunks (two slots of 8 MiB), each read as
         * 4 ranged GETs of one chunk at once (the host path's GETs), never cut finer. */
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 1));
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, 16 << 20));
        T_OK(ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 2 << 20));
        ckptio_stats before, after;
        T_OK(ckptio_engine_stats(e, &before));
        T_OK(ckptio_safetensors_read_all(st, d, data_size, CKPTIO_MEM_CUDA));
        T_OK(ckptio_engine_stats(e, &after));
        const uint64_t gets = after.io_requests - before.io_requests, chunks = (data_size + (2 << 20) - 1) / (2 << 20);
        T_ASSERT_MSG(gets == chunks, "%llu GETs for %llu bytes", (unsigned long long)gets,
                     (unsigned long long)data_size);
        for (int i = 0; i < 3; i++) {
            size_t index;
            ckptio_tensor_info info;
            uint64_t base;
            T_OK(ckptio_safetensors_find(st, m.src[i].name, &index));
            T_OK(ckptio_safetensors_tensor(st, index, &info));
            T_OK(ckptio_safetensors_data_offset(st, &base));
            T_ASSERT_MSG(memcmp(d + (info.file_offset - base), m.src[i].data, m.src[i].nbytes) == 0,
                         "tensor %s differs (path %zu)", m.src[i].name, p);
        }
        T_OK(ckptio_safetensors_close(st));
        ckptio__gpu_sim_device_free(d);
        for (int i = 0; i < 3; i++) ckptio__gpu_sim_device_free((void *)dev[i].data);
        T_OK(ckptio_engine_destroy(e));
    }
    ckptio_engine *e = s3_test_engine();
    T_OK(ckptio_object_delete(e, url));
    T_OK(ckptio_engine_destroy(e));
    free_model(&m);
    ckptio__gpu_set_ops(NULL);
}

int main(void) {
    s3_test_bucket();
    T_RUN(test_safetensors);
    T_RUN(test_torch_save);
    T_RUN(test_gpu_memory);
    return T_EXIT_PASS;
}
