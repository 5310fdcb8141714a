/*
 * test_file_map.c - checkpoint files mapped into memory (src/io/file_map.c,
 * ckptio_model_map, ckptio_torch_map): the bytes, copy-on-write, a file
 * renamed over, and a file truncated under a mapping, which must be
 * CKPTIO_E_TRUNCATED naming the file in every path ckptio controls (plans
 * that read from the mapping, checksums, bounce copies, the kernel's
 * copies), never a SIGBUS. A mapping holds no descriptor: every shard of a
 * model of more shards than its window maps under a low descriptor limit, a
 * released shard opens again (the same inode, else refused) before it is
 * mapped, and a mapping finds its file by its absolute name.
 */
#include "helpers.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define COUNT 3
static const int64_t SHAPE[COUNT] = {3000, 5, 70000};

/* Saves three F32 tensors of random bytes; returns them (malloc'ed, back to back). */
static float *save_file(ckptio_engine *e, const char *path, uint64_t seed) {
    uint64_t total = 0;
    for (int i = 0; i < COUNT; i++) total += (uint64_t)SHAPE[i] * 4;
    float *data = malloc(total);
    t_fill_random(data, total, seed);
    ckptio_tensor_source src[COUNT];
    const char *names[COUNT] = {"a", "b", "c"};
    uint64_t at = 0;
    for (int i = 0; i < COUNT; i++) {
        src[i] = (ckptio_tensor_source){.name = names[i], .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = &SHAPE[i],
                                        .data = (unsigned char *)data + at, .nbytes = (uint64_t)SHAPE[i] * 4,
                                        .mem_kind = CKPTIO_MEM_HOST};
        at += src[i].nbytes;
    }
    T_OK(ckptio_safetensors_save(e, path, src, COUNT, NULL, 0, 0));
    return data;
}

/* Maps shard 0 of `path`; *model stays open for the caller. */
static unsigned char *map(ckptio_engine *e, const char *path, ckptio_model **model, ckptio_mapping **m,
                          uint64_t *len) {
    T_OK(ckptio_model_open(e, path, 0, model));
    T_OK(ckptio_model_map(*model, 0, m));
    void *data = NULL;
    T_OK(ckptio_mapping_data(*m, &data, len));
    T_ASSERT(strcmp(ckptio_mapping_path(*m), path) == 0);
    return data;
}

/* Source of the tensor `i` of a mapped model for a save. */
static ckptio_tensor_source mapped_source(ckptio_model *model, unsigned char *base, size_t i) {
    ckptio_tensor_info info;
    size_t shard;
    T_OK(ckptio_model_tensor(model, i, &info, &shard));
    return (ckptio_tensor_source){.name = info.name, .dtype = info.dtype, .ndim = info.ndim, .shape = info.shape,
                                  .data = base + info.file_offset, .nbytes = info.nbytes, .mem_kind = CKPTIO_MEM_HOST};
}

static void test_bytes_copy_on_write_and_lifetime(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("m.safetensors");
    float *want = save_file(e, path, 1);
    size_t flen;
    unsigned char *file = t_read_file(path, &flen);
    ckptio_model *model;
    ckptio_mapping *m;
    uint64_t len;
    unsigned char *data = map(e, path, &model, &m, &len);
    T_ASSERT(len == flen && memcmp(data, file, flen) == 0);
    ckptio_tensor_info info;
    size_t shard;
    T_OK(ckptio_model_tensor(model, 2, &info, &shard));
    T_ASSERT(memcmp(data + info.file_offset, (unsigned char *)want + (SHAPE[0] + SHAPE[1]) * 4, info.nbytes) == 0);
    /* The mapping outlives the model, and writes to it never reach the file. */
    T_OK(ckptio_model_close(model));
    data[info.file_offset] ^= 0xff;
    unsigned char *again = t_read_file(path, &flen);
    T_ASSERT(memcmp(again, file, flen) == 0);
    T_OK(ckptio_mapping_check(data, len));
    T_OK(ckptio_mapping_release(m));
    T_OK(ckptio_mapping_release(NULL));
    free(again);
    free(file);
    free(want);
    T_OK(ckptio_engine_destroy(e));
}

static void test_renamed_over_keeps_the_old_bytes(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("r.safetensors");
    free(save_file(e, path, 2));
    size_t flen;
    unsigned char *old = t_read_file(path, &flen);
    ckptio_model *model;
    ckptio_mapping *m;
    uint64_t len;
    unsigned char *data = map(e, path, &model, &m, &len);
    T_OK(ckptio_model_close(model));
    free(save_file(e, path, 3)); /* a new inode renamed over the name */
    T_OK(ckptio_mapping_check(data, len));
    T_ASSERT(memcmp(data, old, flen) == 0);
    T_OK(ckptio_mapping_release(m));
    free(old);
    T_OK(ckptio_engine_destroy(e));
}

static void test_changed_file_is_not_mapped(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("s.safetensors");
    free(save_file(e, path, 4));
    ckptio_model *model;
    T_OK(ckptio_model_open(e, path, 0, &model));
    T_ASSERT(truncate(path, 100) == 0);
    ckptio_mapping *m = NULL;
    T_STATUS(ckptio_model_map(model, 0, &m), CKPTIO_E_STALE);
    T_MESSAGE_HAS(path);
    T_ASSERT(m == NULL);
    T_STATUS(ckptio_model_map(model, 1, &m), CKPTIO_E_RANGE);
    T_OK(ckptio_model_close(model));
    T_OK(ckptio_engine_destroy(e));
}

/* A save whose sources are a mapped file truncated before the save. */
static void test_truncated_before_a_save(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("t.safetensors"), *out = t_path("t_out.safetensors");
    free(save_file(e, path, 5));
    ckptio_model *model;
    ckptio_mapping *m;
    uint64_t len;
    unsigned char *data = map(e, path, &model, &m, &len);
    ckptio_tensor_source src[COUNT];
    for (size_t i = 0; i < COUNT; i++) src[i] = mapped_source(model, data, i);
    T_ASSERT(truncate(path, 4096) == 0);
    T_STATUS(ckptio_mapping_check(data, len), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS(path);
    T_MESSAGE_HAS("truncated in place");
    T_OK(ckptio_mapping_check(data, 4096)); /* what the file still holds */
    T_STATUS(ckptio_safetensors_save(e, out, src, COUNT, NULL, 0, 0), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS(path);
    T_ASSERT(!t_file_exists(out));
    T_OK(ckptio_model_close(model));
    T_OK(ckptio_mapping_release(m));
    T_OK(ckptio_engine_destroy(e));
}

/* Truncated after the plan was checked: the first progress report comes
 * after validation and before any byte moves. */
typedef struct shrink {
    const char *path;
    int calls;
} shrink;

static int shrink_at_start(uint64_t done, uint64_t total, void *user) {
    shrink *s = user;
    (void)total;
    if (done == 0 && s->calls++ == 0) T_ASSERT(truncate(s->path, 8) == 0);
    return 0;
}

/* Saves tensors [first, COUNT) of a mapped file while it shrinks. */
static void save_while_shrinking(unsigned flags, int64_t direct, int64_t threads, size_t first) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, direct));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    const char *path = t_path("w.safetensors"), *out = t_path("w_out.safetensors");
    free(save_file(e, path, 6));
    free(save_file(e, out, 7));
    size_t olen;
    unsigned char *old_out = t_read_file(out, &olen);
    ckptio_model *model;
    ckptio_mapping *m;
    uint64_t len;
    unsigned char *data = map(e, path, &model, &m, &len);
    ckptio_tensor_source src[COUNT];
    for (size_t i = first; i < COUNT; i++) src[i] = mapped_source(model, data, i);
    shrink s = {path, 0};
    T_OK(ckptio_engine_set_progress(e, shrink_at_start, &s));
    T_STATUS(ckptio_safetensors_save(e, out, src + first, COUNT - first, NULL, 0, flags), CKPTIO_E_TRUNCATED);
    T_ASSERT(s.calls >= 1);
    T_MESSAGE_HAS(path);
    size_t nlen;
    unsigned char *now_out = t_read_file(out, &nlen);
    T_ASSERT(nlen == olen && memcmp(now_out, old_out, olen) == 0); /* the older file is untouched */
    T_OK(ckptio_engine_set_progress(e, NULL, NULL));
    T_OK(ckptio_model_close(model));
    T_OK(ckptio_mapping_release(m));
    free(now_out);
    free(old_out);
    T_OK(ckptio_engine_destroy(e));
}

/* O_DIRECT from unaligned memory copies through bounce buffers (guarded
 * memcpy, on the engine's threads or on the caller: tensors 1 and 2 lie at
 * unaligned offsets); buffered writes and aligned O_DIRECT let the kernel
 * copy (EFAULT); checksums hash the sources on a thread of their own. */
static void test_truncated_during_a_save(void) {
    save_while_shrinking(0, CKPTIO_DIRECT_ON, 2, 1);
    save_while_shrinking(0, CKPTIO_DIRECT_ON, 0, 1);
    save_while_shrinking(0, CKPTIO_DIRECT_ON, 2, 0);
    save_while_shrinking(0, CKPTIO_DIRECT_OFF, 2, 0);
    save_while_shrinking(CKPTIO_SAFETENSORS_CHECKSUMS, CKPTIO_DIRECT_OFF, 2, 0);
}

/* Reads into memory of a mapped file that shrank: the destination's pages
 * are gone too. */
static void test_read_into_a_truncated_mapping(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_DIRECT, CKPTIO_DIRECT_ON));
    const char *path = t_path("d.safetensors"), *src_path = t_path("d_src.safetensors");
    free(save_file(e, path, 8));
    free(save_file(e, src_path, 9));
    ckptio_model *model, *src;
    ckptio_mapping *m;
    uint64_t len;
    unsigned char *data = map(e, path, &model, &m, &len);
    T_OK(ckptio_model_open(e, src_path, 0, &src));
    ckptio_tensor_info info;
    size_t shard;
    T_OK(ckptio_model_tensor(model, 2, &info, &shard));
    T_ASSERT(truncate(path, 8) == 0);
    const ckptio_slice_target t = {.index = 2, .data = data + info.file_offset, .capacity = info.nbytes,
                                   .mem_kind = CKPTIO_MEM_HOST};
    T_STATUS(ckptio_model_read(src, &t, 1), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS(path);
    T_OK(ckptio_model_close(src));
    T_OK(ckptio_model_close(model));
    T_OK(ckptio_mapping_release(m));
    T_OK(ckptio_engine_destroy(e));
}

static void test_torch_files(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    const char *path = t_path("t.pt");
    float v[1000];
    t_fill_random(v, sizeof v, 10);
    const int64_t shape[1] = {1000};
    const ckptio_tensor_source src = {.name = "w", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape, .data = v,
                                      .nbytes = sizeof v, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_torch_save_tensors(e, path, &src, 1, NULL));
    ckptio_torch *t;
    T_OK(ckptio_torch_open(e, path, &t));
    ckptio_mapping *m;
    T_OK(ckptio_torch_map(t, &m));
    T_OK(ckptio_torch_close(t));
    ckptio_torch_storage_info s;
    T_OK(ckptio_torch_open(e, path, &t));
    T_OK(ckptio_torch_storage(t, 0, &s));
    T_OK(ckptio_torch_close(t));
    void *data;
    uint64_t len;
    T_OK(ckptio_mapping_data(m, &data, &len));
    T_ASSERT(s.nbytes == sizeof v && memcmp((unsigned char *)data + s.file_offset, v, sizeof v) == 0);
    T_OK(ckptio_mapping_release(m));
    T_STATUS(ckptio_torch_map(NULL, &m), CKPTIO_E_INVAL);
    T_OK(ckptio_engine_destroy(e));
}

static int open_descriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    T_ASSERT(d != NULL);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n - 3; /* ".", ".." and the directory's own descriptor */
}

#define MANY 64
#define PER_SHARD 300 /* floats per shard */

/* A directory of MANY shards, more than the model's window of descriptors
 * under the limit set here: every shard maps and all mappings stay live,
 * descriptors stay bounded, every byte is the file's. A released shard
 * replaced by a rename is refused, not mapped; a shard truncated in place
 * under its mapping is seen through the mapping's absolute name, also after
 * a chdir away from the relative name it was opened by. */
static void test_many_shards_mapped(void) {
    ckptio_engine *e;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, 2));
    const char *dir = t_path("many");
    T_ASSERT(mkdir(dir, 0700) == 0);
    static float data[MANY][PER_SHARD];
    const int64_t shape[] = {PER_SHARD};
    for (int s = 0; s < MANY; s++) {
        char name[16], path[512];
        for (int i = 0; i < PER_SHARD; i++) data[s][i] = (float)(s * 1000 + i);
        snprintf(name, sizeof name, "t%02d", s);
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, s + 1, MANY);
        const ckptio_tensor_source t = {.name = name, .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape,
                                        .data = data[s], .nbytes = sizeof data[s], .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_safetensors_save(e, path, &t, 1, NULL, 0, 0));
    }
    char cwd[4096];
    T_ASSERT(getcwd(cwd, sizeof cwd) != NULL);
    T_ASSERT(chdir(dir) == 0); /* shards by relative names */
    struct rlimit old, low;
    T_ASSERT(getrlimit(RLIMIT_NOFILE, &old) == 0);
    const int base = open_descriptors();
    low = old;
    low.rlim_cur = (rlim_t)base + 24; /* a window of a few shards, never all of them */
    T_ASSERT(setrlimit(RLIMIT_NOFILE, &low) == 0);
    ckptio_model *model;
    T_OK(ckptio_model_open(e, ".", 0, &model));
    static ckptio_mapping *maps[MANY];
    for (size_t s = 0; s < MANY; s++) {
        T_OK(ckptio_model_map(model, s, &maps[s]));
        T_ASSERT(open_descriptors() <= base + 24);
        void *p;
        uint64_t len;
        T_OK(ckptio_mapping_data(maps[s], &p, &len));
        ckptio_tensor_info info;
        T_OK(ckptio_model_tensor(model, s, &info, NULL));
        T_ASSERT(info.nbytes == sizeof data[s] && memcmp((unsigned char *)p + info.file_offset, data[s],
                                                         sizeof data[s]) == 0);
    }
    T_ASSERT(setrlimit(RLIMIT_NOFILE, &old) == 0);
    /* The last shard was released after its mapping; another file under its name is refused. */
    char last[64], other[80];
    snprintf(last, sizeof last, "model-%05d-of-%05d.safetensors", MANY, MANY);
    snprintf(other, sizeof other, "%s.new", last);
    T_ASSERT(link("model-00001-of-00064.safetensors", other) == 0 && rename(other, last) == 0);
    ckptio_mapping *again = NULL;
    T_STATUS(ckptio_model_map(model, MANY - 1, &again), CKPTIO_E_DISALLOWED);
    T_MESSAGE_HAS("replaced since it was opened");
    T_ASSERT(again == NULL);
    T_OK(ckptio_model_close(model));
    /* Truncated in place after a chdir: found by the absolute name. */
    T_ASSERT(chdir("/") == 0);
    char first[600];
    snprintf(first, sizeof first, "%s/model-00002-of-00064.safetensors", dir);
    void *p;
    uint64_t len;
    T_OK(ckptio_mapping_data(maps[1], &p, &len));
    T_OK(ckptio_mapping_check(p, len));
    T_ASSERT(truncate(first, 8) == 0);
    T_STATUS(ckptio_mapping_check(p, len), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("model-00002-of-00064.safetensors");
    T_ASSERT(chdir(cwd) == 0);
    for (size_t s = 0; s < MANY; s++) T_OK(ckptio_mapping_release(maps[s]));
    T_OK(ckptio_engine_destroy(e));
}

int main(void) {
    T_RUN(test_bytes_copy_on_write_and_lifetime);
    T_RUN(test_renamed_over_keeps_the_old_bytes);
    T_RUN(test_changed_file_is_not_mapped);
    T_RUN(test_truncated_before_a_save);
    T_RUN(test_truncated_during_a_save);
    T_RUN(test_read_into_a_truncated_mapping);
    T_RUN(test_torch_files);
    T_RUN(test_many_shards_mapped);
    return 0;
}
