/*
 * test_safetensors_file.c - safetensors files through the engine: open and
 * read the golden files, save byte-identical to the reference writer
 * (ALIGN_8), the 4096-byte default on disk, round trips with many tensors,
 * simulated GPU memory on both sides, capacity checks, and atomic saves
 * that leave nothing behind when a write, fsync or rename fails.
 */
#include "common_internal.h"
#include "data/safetensors/golden_tables.h"
#include "gpu_ops.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"
#include "safetensors_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static ckptio_engine *engine;

static const char *data_path(const char *name) {
    static char buf[1024];
    const char *dir = getenv("CKPTIO_TEST_DATA");
    snprintf(buf, sizeof buf, "%s/safetensors/%s", dir ? dir : "tests/data", name);
    return buf;
}

/* ---- reading ---------------------------------------------------------------------- */

static void check_read_golden(const char *file, const golden_tensor *table, size_t n) {
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(engine, data_path(file), &st));
    size_t len, count;
    unsigned char *want = t_read_file(data_path(file), &len);
    T_OK(ckptio_safetensors_count(st, &count));
    T_ASSERT(count == n);

    /* All tensors in one read call, each into its own buffer. */
    ckptio_tensor_target *targets = calloc(n ? n : 1, sizeof *targets);
    unsigned char (*bufs)[256] = calloc(n ? n : 1, 256);
    for (size_t k = 0; k < n; k++) {
        T_OK(ckptio_safetensors_find(st, table[k].name, &targets[k].index));
        memset(bufs[k], 0xEE, 256);
        targets[k].data = bufs[k];
        targets[k].capacity = golden_nbytes(&table[k]);
        targets[k].mem_kind = CKPTIO_MEM_HOST;
    }
    T_OK(ckptio_safetensors_read(st, targets, n));
    for (size_t k = 0; k < n; k++) {
        unsigned char expect[256];
        const uint64_t nb = golden_nbytes(&table[k]);
        golden_fill(expect, nb, k, table[k].dtype);
        T_ASSERT_MSG(memcmp(bufs[k], expect, nb) == 0, "%s: data of %s", file, table[k].name);
        T_ASSERT_MSG(nb == 256 || bufs[k][nb] == 0xEE, "%s: wrote past %s", file, table[k].name);
    }

    /* The whole data section into one buffer. */
    uint64_t off, size;
    T_OK(ckptio_safetensors_data_offset(st, &off));
    T_OK(ckptio_safetensors_data_size(st, &size));
    T_ASSERT(off + size == len);
    unsigned char *all = malloc(size + 1);
    all[size] = 0x5A;
    T_OK(ckptio_safetensors_read_all(st, all, size + 1, CKPTIO_MEM_HOST));
    T_ASSERT(memcmp(all, want + off, size) == 0 && all[size] == 0x5A);
    if (size > 0) {
        T_STATUS(ckptio_safetensors_read_all(st, all, size - 1, CKPTIO_MEM_HOST), CKPTIO_E_RANGE);
        T_MESSAGE_HAS("the data section is");
    }
    free(all);
    free(targets);
    free(bufs);
    free(want);
    T_OK(ckptio_safetensors_close(st));
}

static void test_read_golden_files(void) {
    check_read_golden("ref_numpy.safetensors", golden_numpy, GOLDEN_COUNT(golden_numpy));
    check_read_golden("ref_torch.safetensors", golden_torch, GOLDEN_COUNT(golden_torch));
    check_read_golden("unaligned_f6.safetensors", golden_f6, GOLDEN_COUNT(golden_f6));
    check_read_golden("empty.safetensors", NULL, 0);
}

static void test_read_checks(void) {
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(engine, data_path("ref_numpy.safetensors"), &st));
    size_t idx;
    T_OK(ckptio_safetensors_find(st, "model.embed_tokens.weight", &idx));
    unsigned char buf[64];
    ckptio_tensor_target t = {.index = idx, .data = buf, .capacity = 47, .mem_kind = CKPTIO_MEM_HOST};
    T_STATUS(ckptio_safetensors_read(st, &t, 1), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("ref_numpy.safetensors: tensor 'model.embed_tokens.weight': target 0 has room for 47 bytes "
                  "but the tensor is 48 bytes");
    t.index = 99;
    T_STATUS(ckptio_safetensors_read(st, &t, 1), CKPTIO_E_RANGE);
    T_MESSAGE_HAS("target 0 asks for tensor index 99 but the file has 15 tensors");
    t.index = idx;
    t.capacity = 48;
    t.data = NULL;
    T_STATUS(ckptio_safetensors_read(st, &t, 1), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("target 0 has a NULL data pointer");
    T_STATUS(ckptio_safetensors_read(st, NULL, 1), CKPTIO_E_INVAL);
    T_OK(ckptio_safetensors_read(st, NULL, 0));
    T_OK(ckptio_safetensors_close(st));

    /* A parse() handle has no file. */
    size_t len;
    unsigned char *bytes = t_read_file(data_path("ref_numpy.safetensors"), &len);
    T_OK(ckptio_safetensors_parse(bytes, len, len, &st));
    t.data = buf;
    T_STATUS(ckptio_safetensors_read(st, &t, 1), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("made by ckptio_safetensors_parse and has no file");
    T_STATUS(ckptio_safetensors_read_all(st, buf, sizeof buf, CKPTIO_MEM_HOST), CKPTIO_E_INVAL);
    ckptio_safetensors_close(st);
    free(bytes);
}

static void test_open_errors(void) {
    ckptio_safetensors *st = (ckptio_safetensors *)1;
    T_STATUS(ckptio_safetensors_open(engine, t_path("missing.safetensors"), &st), CKPTIO_E_NOT_FOUND);
    T_ASSERT(st == NULL);
    T_STATUS(ckptio_safetensors_open(NULL, "x", &st), CKPTIO_E_INVAL);

    t_write_file(t_path("short.safetensors"), "\x02\0\0", 3);
    T_STATUS(ckptio_safetensors_open(engine, t_path("short.safetensors"), &st), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("short.safetensors: file is 3 bytes, shorter than the 8-byte header length");

    /* A length that claims nearly the cap, in a 20-byte file: refused
     * before any header allocation. */
    unsigned char claim[20] = {0xff, 0xe0, 0xf5, 0x05}; /* 99,999,999 */
    t_write_file(t_path("claim.safetensors"), claim, sizeof claim);
    T_STATUS(ckptio_safetensors_open(engine, t_path("claim.safetensors"), &st), CKPTIO_E_TRUNCATED);
    T_MESSAGE_HAS("claim.safetensors: at offset 0: header length 99999999 runs past the end of the file (20 bytes)");

    const char bad[] = "\x05\0\0\0\0\0\0\0{\"a\":";
    t_write_file(t_path("bad.safetensors"), bad, sizeof bad - 1);
    T_STATUS(ckptio_safetensors_open(engine, t_path("bad.safetensors"), &st), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("bad.safetensors: at offset");
    T_MESSAGE_HAS("header is not valid JSON");
    T_ASSERT(strstr(ckptio_last_error()->path, "bad.safetensors") != NULL);

    const char gap[] = "\x37\0\0\0\0\0\0\0{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,10]}}0123456789";
    t_write_file(t_path("gap.safetensors"), gap, sizeof gap - 1);
    T_STATUS(ckptio_safetensors_open(engine, t_path("gap.safetensors"), &st), CKPTIO_E_FORMAT);
    T_MESSAGE_HAS("gap.safetensors: tensor 'w': data_offsets [0, 10] cover 10 bytes but dtype F32 shape [3] needs 12");
}

/* ---- saving ----------------------------------------------------------------------- */

typedef struct sources {
    ckptio_tensor_source *t;
    unsigned char **data;
    size_t n;
} sources;

static sources golden_sources(const golden_tensor *table, size_t n) {
    sources s = {calloc(n ? n : 1, sizeof *s.t), calloc(n ? n : 1, sizeof *s.data), n};
    for (size_t k = 0; k < n; k++) {
        const uint64_t nb = golden_nbytes(&table[k]);
        s.data[k] = malloc(nb ? nb : 1);
        golden_fill(s.data[k], nb, k, table[k].dtype);
        s.t[k] = (ckptio_tensor_source){.name = table[k].name, .dtype = table[k].dtype, .ndim = table[k].ndim,
                                        .shape = table[k].shape, .data = s.data[k], .nbytes = nb,
                                        .mem_kind = CKPTIO_MEM_HOST};
    }
    return s;
}

static void free_sources(sources *s) {
    for (size_t k = 0; k < s->n; k++) free(s->data[k]);
    free(s->data);
    free(s->t);
}

static void check_save_identical(const char *golden, const golden_tensor *table, size_t n, const ckptio_kv *md,
                                 size_t md_n) {
    sources s = golden_sources(table, n);
    const char *out = t_path(golden);
    T_OK(ckptio_safetensors_save(engine, out, s.t, n, md, md_n, CKPTIO_SAFETENSORS_ALIGN_8));
    size_t glen, len;
    unsigned char *want = t_read_file(data_path(golden), &glen);
    unsigned char *got = t_read_file(out, &len);
    T_ASSERT_MSG(len == glen && memcmp(got, want, len) == 0, "%s: saved bytes differ from the reference", golden);
    free(got);
    free(want);
    free_sources(&s);
}

static void test_save_identical_to_reference(void) {
    check_save_identical("ref_numpy.safetensors", golden_numpy, GOLDEN_COUNT(golden_numpy), golden_numpy_metadata, 1);
    check_save_identical("ref_torch.safetensors", golden_torch, GOLDEN_COUNT(golden_torch), NULL, 0);
    check_save_identical("empty.safetensors", NULL, 0, NULL, 0);
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
}

/* Random tensors of every safetensors dtype, some large enough to be split
 * into several chunks by the engine; saved with the default alignment,
 * opened and read back. */
static void test_save_round_trip(void) {
    enum { N = 30 };
    ckptio_tensor_source t[N];
    unsigned char *data[N];
    int64_t shapes[N][2];
    char names[N][32];
    int d = 0;
    for (int i = 0; i < N; i++) {
        while (!ckptio_dtype_name((ckptio_dtype)(d % CKPTIO_DTYPE_COUNT_))[0]) d++;
        const ckptio_dtype dt = (ckptio_dtype)(d++ % CKPTIO_DTYPE_COUNT_);
        shapes[i][0] = i == 7 ? 0 : (i % 5 + 1) * 2;
        shapes[i][1] = i % 4 == 0 ? 300000 + i : 6 * (i + 1);
        uint64_t nb = (uint64_t)shapes[i][0] * (uint64_t)shapes[i][1] * ckptio_dtype_bits(dt) / 8;
        data[i] = malloc(nb ? nb : 1);
        t_fill_random(data[i], nb, (uint64_t)i + 1);
        snprintf(names[i], sizeof names[i], "layer.%d.%s", i, ckptio_dtype_name(dt));
        t[i] = (ckptio_tensor_source){.name = names[i], .dtype = dt, .ndim = 2, .shape = shapes[i],
                                      .data = data[i], .nbytes = nb, .mem_kind = CKPTIO_MEM_HOST};
    }
    const ckptio_kv md[] = {{"format", "pt"}, {"producer", "ckptio test"}};
    const char *path = t_path("round.safetensors");
    T_OK(ckptio_safetensors_save(engine, path, t, N, md, 2, 0));

    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    uint64_t off, size;
    T_OK(ckptio_safetensors_data_offset(st, &off));
    T_OK(ckptio_safetensors_data_size(st, &size));
    T_ASSERT(off == 4096);
    ckptio_tensor_target targets[N];
    unsigned char *back[N];
    for (int i = 0; i < N; i++) {
        T_OK(ckptio_safetensors_find(st, names[i], &targets[i].index));
        back[i] = malloc(t[i].nbytes ? t[i].nbytes : 1);
        targets[i].data = back[i];
        targets[i].capacity = t[i].nbytes;
        targets[i].mem_kind = CKPTIO_MEM_HOST;
    }
    T_OK(ckptio_safetensors_read(st, targets, N));
    for (int i = 0; i < N; i++) {
        T_ASSERT_MSG(memcmp(back[i], data[i], t[i].nbytes) == 0, "tensor %s", names[i]);
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_tensor(st, targets[i].index, &info));
        T_ASSERT(info.dtype == t[i].dtype && info.shape[0] == shapes[i][0] && info.shape[1] == shapes[i][1]);
        free(back[i]);
    }
    size_t mdc;
    ckptio_kv kv;
    T_OK(ckptio_safetensors_metadata_count(st, &mdc));
    T_OK(ckptio_safetensors_metadata(st, 1, &kv));
    T_ASSERT(mdc == 2 && strcmp(kv.key, "producer") == 0 && strcmp(kv.value, "ckptio test") == 0);
    T_OK(ckptio_safetensors_close(st));
    size_t len;
    unsigned char *file = t_read_file(path, &len);
    T_ASSERT(len == off + size);
    free(file);
    for (int i = 0; i < N; i++) free(data[i]);
}

/* Saving over an existing file replaces it whole. */
static void test_save_replaces(void) {
    const char *path = t_path("replace.safetensors");
    t_write_file(path, "old contents", 12);
    const int64_t shape[1] = {4};
    const float values[4] = {1, 2, 3, 4};
    const ckptio_tensor_source t = {.name = "v", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape,
                                    .data = values, .nbytes = 16};
    T_OK(ckptio_safetensors_save(engine, path, &t, 1, NULL, 0, CKPTIO_SAFETENSORS_ALIGN_8));
    size_t len;
    unsigned char *got = t_read_file(path, &len);
    const char header[] = "{\"v\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    T_ASSERT(sizeof header - 1 == 55); /* padded with one space to 56 */
    T_ASSERT(len == 8 + 56 + 16);
    T_ASSERT(got[0] == 56 && memcmp(got + 8, header, 55) == 0 && got[8 + 55] == ' ');
    T_ASSERT(memcmp(got + 64, values, 16) == 0);
    free(got);
}

/* IN_PLACE writes the path itself (a memfd's /proc/self/fd/N, which cannot
 * be renamed over), cut to the new size; never with checksums. */
static void test_save_in_place(void) {
    const int64_t shape[1] = {4};
    const float values[4] = {1, 2, 3, 4};
    const ckptio_tensor_source t = {.name = "v", .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape,
                                    .data = values, .nbytes = 16};
    const int fd = memfd_create("ckptio-test", MFD_CLOEXEC);
    T_ASSERT(fd >= 0);
    char longer[200];
    memset(longer, 'x', sizeof longer);
    T_ASSERT(write(fd, longer, sizeof longer) == (ssize_t)sizeof longer);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    /* An atomic save cannot create its temporary beside it. */
    T_STATUS(ckptio_safetensors_save(engine, path, &t, 1, NULL, 0, 0), CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_safetensors_save(engine, path, &t, 1, NULL, 0,
                                 CKPTIO_SAFETENSORS_ALIGN_8 | CKPTIO_SAFETENSORS_IN_PLACE));
    unsigned char got[128];
    T_ASSERT(pread(fd, got, sizeof got, 0) == 8 + 56 + 16); /* the 200 old bytes cut */
    T_ASSERT(got[0] == 56 && memcmp(got + 64, values, 16) == 0);
    T_STATUS(ckptio_safetensors_save(engine, path, &t, 1, NULL, 0,
                                     CKPTIO_SAFETENSORS_IN_PLACE | CKPTIO_SAFETENSORS_CHECKSUMS),
             CKPTIO_E_INVAL);
    T_MESSAGE_HAS("cannot be combined with an in-place write");
    close(fd);
}

/* A failure at any step leaves the old file as it was and no temporary. */
static void test_save_atomic_failures(void) {
    const char *path = t_path("atomic.safetensors");
    t_write_file(path, "previous", 8);
    const int64_t shape[1] = {1 << 20};
    unsigned char *big = malloc(1 << 20);
    t_fill_random(big, 1 << 20, 3);
    const ckptio_tensor_source t[2] = {
        {.name = "a", .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = shape, .data = big, .nbytes = 1 << 20},
        {.name = "b", .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = shape, .data = big, .nbytes = 1 << 20}};
    const struct {
        ckptio__io_kind kind;
        uint64_t nth;
        int err;
        ckptio_status want;
    } faults[] = {
        {CKPTIO__IO_WRITE, 1, ENOSPC, CKPTIO_E_NOSPC},
        {CKPTIO__IO_WRITE, 3, EIO, CKPTIO_E_IO},
        {CKPTIO__IO_FSYNC, 1, EIO, CKPTIO_E_IO},
        {CKPTIO__IO_RENAME, 1, EACCES, CKPTIO_E_PERMISSION},
        {CKPTIO__IO_OPEN, 1, EACCES, CKPTIO_E_PERMISSION},
    };
    for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++) {
        ckptio__io_inject(faults[f].kind, faults[f].nth, faults[f].err, 0, false);
        const ckptio_status st = ckptio_safetensors_save(engine, path, t, 2, NULL, 0, 0);
        ckptio__io_inject_reset();
        T_ASSERT_MSG(st == faults[f].want, "fault %zu: got %s: %s", f, ckptio_status_name(st),
                     ckptio_last_error_message());
        size_t len;
        unsigned char *got = t_read_file(path, &len);
        T_ASSERT_MSG(len == 8 && memcmp(got, "previous", 8) == 0, "fault %zu changed the old file", f);
        free(got);
        T_ASSERT_MSG(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0, "fault %zu left a temporary", f);
    }
    /* Without an older file, a failure leaves no file at all. */
    const char *fresh = t_path("fresh.safetensors");
    ckptio__io_inject(CKPTIO__IO_WRITE, 2, ENOSPC, 0, false);
    T_STATUS(ckptio_safetensors_save(engine, fresh, t, 2, NULL, 0, 0), CKPTIO_E_NOSPC);
    ckptio__io_inject_reset();
    T_ASSERT(!t_file_exists(fresh));
    /* Invalid input: nothing is created either. */
    const ckptio_tensor_source dup[2] = {t[0], t[0]};
    T_STATUS(ckptio_safetensors_save(engine, fresh, dup, 2, NULL, 0, 0), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("fresh.safetensors: tensor 'a': the name appears more than once");
    T_ASSERT(!t_file_exists(fresh));
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
    T_STATUS(ckptio_safetensors_save(NULL, fresh, t, 2, NULL, 0, 0), CKPTIO_E_INVAL);
    free(big);
}

/* Tensors in (simulated) GPU memory are saved and read back through the
 * engine's GPU path: mem_kind reaches the plan on both sides. */
static void test_gpu_memory(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    ckptio__gpu_sim_configure(NULL);
    enum { N = 3 };
    const uint64_t sizes[N] = {3 << 20, 4096, 12345};
    unsigned char *host[N], *dev[N];
    int64_t shapes[N][1];
    ckptio_tensor_source t[N];
    static const char *names[N] = {"gpu.big", "gpu.page", "gpu.odd"};
    for (int i = 0; i < N; i++) {
        host[i] = malloc(sizes[i]);
        t_fill_random(host[i], sizes[i], 40 + (uint64_t)i);
        dev[i] = ckptio__gpu_sim_device_alloc(sizes[i]);
        T_ASSERT(dev[i] != NULL);
        memcpy(dev[i], host[i], sizes[i]);
        shapes[i][0] = (int64_t)sizes[i];
        t[i] = (ckptio_tensor_source){.name = names[i], .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = shapes[i],
                                      .data = dev[i], .nbytes = sizes[i], .mem_kind = CKPTIO_MEM_CUDA};
    }
    const char *path = t_path("gpu.safetensors");
    T_OK(ckptio_safetensors_save(engine, path, t, N, NULL, 0, 0));
    ckptio__gpu_sim_stats stats;
    ckptio__gpu_sim_get_stats(&stats);
    T_ASSERT(stats.bytes_d2h == sizes[0] + sizes[1] + sizes[2]);

    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    ckptio_tensor_target targets[N];
    for (int i = 0; i < N; i++) {
        memset(dev[i], 0, sizes[i]);
        T_OK(ckptio_safetensors_find(st, names[i], &targets[i].index));
        targets[i].data = dev[i];
        targets[i].capacity = sizes[i];
        targets[i].mem_kind = CKPTIO_MEM_CUDA;
    }
    T_OK(ckptio_safetensors_read(st, targets, N));
    for (int i = 0; i < N; i++) T_ASSERT_MSG(memcmp(dev[i], host[i], sizes[i]) == 0, "tensor %s", names[i]);
    uint64_t size;
    T_OK(ckptio_safetensors_data_size(st, &size));
    unsigned char *all = ckptio__gpu_sim_device_alloc(size);
    T_OK(ckptio_safetensors_read_all(st, all, size, CKPTIO_MEM_CUDA));
    for (int i = 0; i < N; i++) {
        ckptio_tensor_info info;
        T_OK(ckptio_safetensors_tensor(st, targets[i].index, &info));
        T_ASSERT(memcmp(all + info.file_offset - 4096, host[i], sizes[i]) == 0);
    }
    ckptio__gpu_sim_get_stats(&stats);
    T_ASSERT(stats.violations == 0);
    T_OK(ckptio_safetensors_close(st));
    ckptio__gpu_sim_device_free(all);
    for (int i = 0; i < N; i++) {
        ckptio__gpu_sim_device_free(dev[i]);
        free(host[i]);
    }
    ckptio__gpu_set_ops(NULL);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_THREADS, 4));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_CHUNK_BYTES, 1 << 20));
    T_RUN(test_read_golden_files);
    T_RUN(test_read_checks);
    T_RUN(test_open_errors);
    T_RUN(test_save_identical_to_reference);
    T_RUN(test_save_round_trip);
    T_RUN(test_save_replaces);
    T_RUN(test_save_in_place);
    T_RUN(test_save_atomic_failures);
    T_RUN(test_gpu_memory);
    T_OK(ckptio_engine_destroy(engine));
    return 0;
}
