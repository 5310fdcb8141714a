/*
 * test_convert.c - ckptio_torch_save_safetensors and
 * ckptio_safetensors_save_torch: the files are those of the in-memory
 * writers, strided views are gathered, and an input truncated between two
 * tensors (by the engine's progress callback, at the end of the first
 * tensor's read: deterministic) fails with CKPTIO_E_TRUNCATED naming the
 * input and leaves neither the output nor a temporary. ckptio_convert:
 * a chain through every kind of output (DCP, Hugging Face, torch.save,
 * safetensors) brings back every byte, each output read by ckptio's own
 * reader of that kind (the peers read them in tests/python/test_convert_matrix.py),
 * and what cannot be written is refused before anything is; a killed
 * conversion's directory temporary is removed by the cleaner once it is dead.
 */
#include "helpers.h"

#include <fcntl.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define N 3
#define ELEMS 20000 /* 80 KB per tensor */

static ckptio_engine *engine;
static float data[N][ELEMS];
static const char *names[N] = {"b.weight", "a.bias", "c"};

static void sources(ckptio_tensor_source *src, int64_t *shape) {
    *shape = ELEMS;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < ELEMS; j++) data[i][j] = (float)(i * ELEMS + j);
        src[i] = (ckptio_tensor_source){.name = names[i], .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = shape,
                                        .data = data[i], .nbytes = sizeof data[i], .mem_kind = CKPTIO_MEM_HOST};
    }
}

static void test_torch_to_safetensors_matches_the_writer(void) {
    ckptio_tensor_source src[N];
    int64_t shape;
    sources(src, &shape);
    const char *pt = t_path("m.pt"), *got = t_path("got.safetensors"), *want = t_path("want.safetensors");
    T_OK(ckptio_torch_save_tensors(engine, pt, src, N, NULL));
    ckptio_torch *t = NULL;
    T_OK(ckptio_torch_open(engine, pt, &t));
    const ckptio_kv meta[] = {{"format", "pt"}};
    T_OK(ckptio_torch_save_safetensors(t, got, NULL, 0, meta, 1, 0));
    T_OK(ckptio_safetensors_save(engine, want, src, N, meta, 1, 0));
    size_t a, b;
    void *x = t_read_file(got, &a), *y = t_read_file(want, &b);
    T_ASSERT(a == b && memcmp(x, y, a) == 0);
    free(x);
    free(y);
    /* A subset, by index. */
    const size_t pick[] = {2};
    T_OK(ckptio_torch_save_safetensors(t, got, pick, 1, NULL, 0, CKPTIO_SAFETENSORS_ALIGN_8));
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(engine, got, &st));
    size_t count, idx;
    T_OK(ckptio_safetensors_count(st, &count));
    T_ASSERT(count == 1);
    T_OK(ckptio_safetensors_find(st, "c", &idx));
    ckptio_safetensors_close(st);
    ckptio_torch_close(t);
    /* A handle without an engine cannot write. */
    void *bytes = t_read_file(pt, &a);
    T_OK(ckptio_torch_parse(bytes, a, &t));
    T_STATUS(ckptio_torch_save_safetensors(t, got, NULL, 0, NULL, 0, 0), CKPTIO_E_INVAL);
    ckptio_torch_close(t);
    free(bytes);
}

static void test_safetensors_to_torch_reads_back(void) {
    ckptio_tensor_source src[N];
    int64_t shape;
    sources(src, &shape);
    const char *in = t_path("in.safetensors"), *out = t_path("out.pt");
    T_OK(ckptio_safetensors_save(engine, in, src, N, NULL, 0, 0));
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(engine, in, &st));
    ckptio_torch_save_options opts = {.storage_alignment = 64};
    T_OK(ckptio_safetensors_save_torch(st, out, &opts));
    ckptio_safetensors_close(st);
    ckptio_torch *t = NULL;
    T_OK(ckptio_torch_open(engine, out, &t));
    ckptio_torch_verify_report rep;
    T_OK(ckptio_torch_verify(t, &rep)); /* every CRC-32 computed from the streamed bytes */
    T_ASSERT(rep.crc_absent == 0 && rep.crc_checked == rep.records);
    uint64_t alignment;
    T_OK(ckptio_torch_alignment(t, &alignment));
    T_ASSERT(alignment == 64);
    static float back[ELEMS];
    for (int i = 0; i < N; i++) {
        size_t idx;
        T_OK(ckptio_torch_find(t, names[i], &idx));
        ckptio_tensor_target tg = {.index = idx, .data = back, .capacity = sizeof back, .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_torch_read(t, &tg, 1));
        T_ASSERT(memcmp(back, data[i], sizeof back) == 0);
    }
    ckptio_torch_close(t);
}

/* The progress callback runs at the end of each engine plan; the first
 * plan of a streamed conversion reads the first tensor. */
static const char *shrink_path;
static off_t shrink_to;
static int shrink_calls;

static int shrink_after_first_plan(uint64_t done, uint64_t total, void *user) {
    (void)user;
    if (done == total && shrink_calls++ == 0) T_ASSERT(truncate(shrink_path, shrink_to) == 0);
    return 0;
}

static void check_truncated_input(bool torch_input) {
    ckptio_tensor_source src[N];
    int64_t shape;
    sources(src, &shape);
    const char *in = t_path(torch_input ? "shrink.pt" : "shrink.safetensors");
    const char *out = t_path(torch_input ? "shrink_out.safetensors" : "shrink_out.pt");
    if (torch_input) T_OK(ckptio_torch_save_tensors(engine, in, src, N, NULL));
    else T_OK(ckptio_safetensors_save(engine, in, src, N, NULL, 0, 0));
    size_t size;
    free(t_read_file(in, &size));
    shrink_path = in;
    shrink_to = (off_t)(size / 2);
    shrink_calls = 0;
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set_progress(e, shrink_after_first_plan, NULL));
    ckptio_status st;
    if (torch_input) {
        ckptio_torch *t = NULL;
        T_OK(ckptio_torch_open(e, in, &t));
        st = ckptio_torch_save_safetensors(t, out, NULL, 0, NULL, 0, 0);
        ckptio_torch_close(t);
    } else {
        ckptio_safetensors *s = NULL;
        T_OK(ckptio_safetensors_open(e, in, &s));
        st = ckptio_safetensors_save_torch(s, out, NULL);
        ckptio_safetensors_close(s);
    }
    T_ASSERT_MSG(st == CKPTIO_E_TRUNCATED, "got %s: %s", ckptio_status_name(st), ckptio_last_error_message());
    T_ASSERT(shrink_calls > 0);
    T_ASSERT(strcmp(ckptio_last_error()->path, in) == 0);
    T_ASSERT(!t_file_exists(out));
    T_ASSERT(t_count_entries(t_tmpdir(), ".ckptio-tmp-") == 0);
    ckptio_engine_destroy(e);
}

static void test_input_truncated_between_tensors(void) {
    check_truncated_input(false);
    check_truncated_input(true);
}

/* Every tensor of `path` (a model: safetensors file or directory) equals data[]. */
static void check_model(const char *path) {
    ckptio_model *m = NULL;
    T_OK(ckptio_model_open(engine, path, 0, &m));
    size_t count = 0;
    T_OK(ckptio_model_count(m, &count));
    T_ASSERT(count == N);
    static float got[ELEMS];
    for (int i = 0; i < N; i++) {
        size_t idx;
        T_OK(ckptio_model_find(m, names[i], &idx));
        const ckptio_slice_target tg = {.index = idx, .data = got, .capacity = sizeof got, .mem_kind = CKPTIO_MEM_HOST};
        T_OK(ckptio_model_read(m, &tg, 1));
        T_ASSERT(memcmp(got, data[i], sizeof got) == 0);
    }
    ckptio_model_close(m);
}

static void test_convert_chain_through_every_kind(void) {
    ckptio_tensor_source src[N];
    int64_t shape;
    sources(src, &shape);
    const char *in = t_path("chain.safetensors"), *dcp = t_path("chain_dcp"), *hf = t_path("chain_hf");
    const char *pt = t_path("chain.pt"), *back = t_path("back.safetensors");
    T_OK(ckptio_safetensors_save(engine, in, src, N, NULL, 0, 0));
    ckptio_convert_report r;
    ckptio_convert_options o = {.to = CKPTIO_CONVERT_DCP};
    T_OK(ckptio_convert(engine, in, dcp, &o, &r));
    T_ASSERT(r.from == CKPTIO_FORMAT_SAFETENSORS && r.to == CKPTIO_CONVERT_DCP && r.tensors == N && r.files == 1);
    /* ckptio's DCP reader takes it, the manifest matches every item. */
    ckptio_dcp *h = NULL;
    T_OK(ckptio_dcp_open(engine, dcp, &h));
    ckptio_dcp_verify_report vr;
    const char *manifest = NULL;
    T_OK(ckptio_dcp_validate(h, &vr, &manifest));
    T_ASSERT(manifest != NULL && vr.checked == N && vr.items == N);
    static float got[ELEMS];
    for (int i = 0; i < N; i++) {
        size_t idx;
        T_OK(ckptio_dcp_find(h, names[i], &idx));
        T_OK(ckptio_dcp_read_tensor(h, idx, got, sizeof got));
        T_ASSERT(memcmp(got, data[i], sizeof got) == 0);
    }
    ckptio_dcp_close(h);
    /* DCP -> Hugging Face in 3 shards (one tensor each) with an index. */
    o = (ckptio_convert_options){.shard_size = sizeof data[0]};
    T_OK(ckptio_convert(engine, dcp, hf, &o, &r));
    T_ASSERT(r.to == CKPTIO_CONVERT_HF && r.files == 3 && r.from == CKPTIO_FORMAT_DCP);
    T_ASSERT(t_count_entries(hf, ".safetensors") == 4); /* 3 shards + the index's name */
    check_model(hf);
    /* Hugging Face -> torch.save (by the name) -> safetensors. */
    T_OK(ckptio_convert(engine, hf, pt, NULL, &r));
    T_ASSERT(r.to == CKPTIO_CONVERT_TORCH && r.from == CKPTIO_FORMAT_HF_INDEX);
    T_OK(ckptio_convert(engine, pt, back, NULL, &r));
    T_ASSERT(r.to == CKPTIO_CONVERT_SAFETENSORS && r.from == CKPTIO_FORMAT_TORCH);
    check_model(back);
}

static int notes;
static void count_note(const char *note, void *user) {
    (void)note;
    (void)user;
    notes++;
}

static void test_convert_refuses_before_writing(void) {
    ckptio_tensor_source src[N];
    int64_t shape;
    sources(src, &shape);
    const char *in = t_path("r.safetensors"), *full = t_path("full");
    const ckptio_kv meta[] = {{"format", "pt"}, {"author", "someone"}};
    T_OK(ckptio_safetensors_save(engine, in, src, N, meta, 2, 0));
    T_ASSERT(mkdir(full, 0777) == 0);
    t_write_file(t_path("full/keep.txt"), "mine", 4);
    ckptio_convert_options o = {.to = CKPTIO_CONVERT_DCP, .note = count_note};
    T_STATUS(ckptio_convert(engine, in, full, &o, NULL), CKPTIO_E_EXISTS);
    T_MESSAGE_HAS("exists and is not empty");
    T_ASSERT(notes == 0 && t_count_entries(full, "") == 1);
    T_ASSERT(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0);
    /* A directory OUT for a file input: the layout must be said. */
    T_STATUS(ckptio_convert(engine, in, t_path("new_dir/"), NULL, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("say which layout");
    T_ASSERT(!t_file_exists(t_path("new_dir")));
    o = (ckptio_convert_options){.to = CKPTIO_CONVERT_TORCH, .shard_size = 1000};
    T_STATUS(ckptio_convert(engine, in, t_path("x.pt"), &o, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("shard size");
    /* The author entry cannot go into torch.save: one note ("format" tags the writer only). */
    o = (ckptio_convert_options){.note = count_note};
    ckptio_convert_report r;
    T_OK(ckptio_convert(engine, in, t_path("m.pt"), &o, &r));
    T_ASSERT(notes == 1 && r.dropped == 1);
}

static long max_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void test_expanded_views_are_written_in_bounded_memory(void) {
    /* A few hundred bytes of storage viewed with stride 0 as 128 MiB (torch's
     * expand): the output holds the 128 MiB, memory does not. */
    enum { COLS = 64 };
    const int64_t rows = (int64_t)1 << 19;
    static float row[COLS];
    for (int j = 0; j < COLS; j++) row[j] = (float)j + 0.5f;
    ckptio_torch_writer *w = NULL;
    size_t sid;
    ckptio_value *dict, *key, *a, *b;
    T_OK(ckptio_torch_writer_create(&w));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_F32, sizeof row, "cpu", row, CKPTIO_MEM_HOST, &sid));
    const int64_t shape[2] = {rows, COLS}, stride[2] = {0, 1};
    ckptio_torch_tensor_spec spec = {.storage = sid, .dtype = CKPTIO_DTYPE_F32, .ndim = 2, .shape = shape,
                                     .stride = stride};
    T_OK(ckptio_torch_writer_tensor(w, &spec, &a));
    const int64_t small = 3; /* and an ordinary tensor beside it, filled as before */
    ckptio_torch_tensor_spec plain = {.storage = sid, .dtype = CKPTIO_DTYPE_F32, .ndim = 1, .shape = &small,
                                      .storage_offset = 5};
    T_OK(ckptio_torch_writer_tensor(w, &plain, &b));
    T_OK(ckptio_torch_writer_container(w, CKPTIO_VALUE_DICT, 1, &dict));
    T_OK(ckptio_torch_writer_str(w, "expanded", 8, &key));
    T_OK(ckptio_torch_writer_set_item(w, dict, key, a));
    T_OK(ckptio_torch_writer_str(w, "plain", 5, &key));
    T_OK(ckptio_torch_writer_set_item(w, dict, key, b));
    T_OK(ckptio_torch_writer_set_root(w, dict));
    const char *in = t_path("expanded.pt"), *out = t_path("expanded.safetensors");
    T_OK(ckptio_torch_save(engine, in, w, NULL));
    ckptio_torch_writer_destroy(w);
    ckptio_torch *t = NULL;
    T_OK(ckptio_torch_open(engine, in, &t));
    const long rss = max_rss_kib();
    T_OK(ckptio_torch_save_safetensors(t, out, NULL, 0, NULL, 0, 0));
    T_ASSERT_MSG(max_rss_kib() - rss < (48 << 10), "peak RSS grew by %ld KiB for a 128 MiB view",
                 max_rss_kib() - rss);
    ckptio_torch_close(t);
    ckptio_safetensors *st = NULL;
    size_t idx = 0;
    ckptio_tensor_info ti;
    T_OK(ckptio_safetensors_open(engine, out, &st));
    T_OK(ckptio_safetensors_find(st, "expanded", &idx));
    T_OK(ckptio_safetensors_tensor(st, idx, &ti));
    T_ASSERT(ti.nbytes == (uint64_t)rows * sizeof row && ti.shape[0] == rows && ti.shape[1] == COLS);
    float got[COLS];
    const int64_t samples[] = {0, 1, 12345, rows - 1};
    const int fd = open(out, O_RDONLY | O_CLOEXEC);
    T_ASSERT(fd >= 0);
    for (size_t k = 0; k < 4; k++) {
        T_ASSERT(pread(fd, got, sizeof got, (off_t)(ti.file_offset + (uint64_t)samples[k] * sizeof row)) ==
                 (ssize_t)sizeof got);
        T_ASSERT_MSG(memcmp(got, row, sizeof row) == 0, "row %lld differs", (long long)samples[k]);
    }
    close(fd);
    T_OK(ckptio_safetensors_find(st, "plain", &idx));
    float three[3];
    ckptio_tensor_target tg = {.index = idx, .data = three, .capacity = sizeof three, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_read(st, &tg, 1));
    T_ASSERT(three[0] == row[5] && three[2] == row[7]);
    ckptio_safetensors_close(st);
    unlink(out);
}

/* A conversion killed half-way leaves its directory temporary: `ckptio
 * clean` (ckptio_cleanup_temporaries) keeps it while the converter lives
 * (its flocked lock file) and removes it once it is dead; a directory named
 * like a temporary that nothing proves is ckptio's (no lock file, a lock
 * file that is a symlink, or anything but regular files inside) is left
 * whole, and a finished output carries no lock file. */
static int ready_fd = -1, hold_fd = -1;

static int stop_after_first_plan(uint64_t done, uint64_t total, void *user) {
    (void)user;
    if (done == total) {
        char c;
        if (write(ready_fd, "x", 1) != 1) _exit(5);
        (void)!read(hold_fd, &c, 1); /* killed here, mid-conversion (or the test died: EOF) */
        _exit(6);
    }
    return 0;
}

static void plant_dir(const char *dir, const char *lock_target, bool with_subdir) {
    char p[1024];
    T_ASSERT(mkdir(dir, 0777) == 0);
    snprintf(p, sizeof p, "%s/shard.safetensors", dir);
    t_write_file(p, "precious", 8);
    snprintf(p, sizeof p, "%s/.ckptio-tmp-dir.lock", dir);
    if (lock_target) T_ASSERT(symlink(lock_target, p) == 0);
    else if (with_subdir) t_write_file(p, "", 0);
    if (with_subdir) {
        snprintf(p, sizeof p, "%s/sub", dir);
        T_ASSERT(mkdir(p, 0777) == 0);
    }
}

static void test_killed_conversion_is_cleaned_once_dead(void) {
    ckptio_tensor_source src[N];
    int64_t shape;
    sources(src, &shape);
    const char *top = t_path("killed_convert");
    T_ASSERT(mkdir(top, 0777) == 0);
    char in[1024], out[1024];
    snprintf(in, sizeof in, "%s/in.safetensors", top);
    snprintf(out, sizeof out, "%s/out_hf", top);
    T_OK(ckptio_safetensors_save(engine, in, src, N, NULL, 0, 0));
    int pipefd[2], hold[2];
    T_ASSERT(pipe(pipefd) == 0 && pipe(hold) == 0);
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        close(pipefd[0]);
        close(hold[1]);
        ready_fd = pipefd[1];
        hold_fd = hold[0];
        ckptio_engine *e = NULL;
        if (ckptio_engine_create(&e) || ckptio_engine_set_progress(e, stop_after_first_plan, NULL)) _exit(3);
        const ckptio_convert_options o = {.to = CKPTIO_CONVERT_HF, .shard_size = sizeof data[0]};
        ckptio_convert(e, in, out, &o, NULL);
        _exit(4); /* never: the progress callback waits to be killed */
    }
    close(pipefd[1]);
    close(hold[0]);
    char c;
    T_ASSERT(read(pipefd[0], &c, 1) == 1);
    close(pipefd[0]);
    T_ASSERT(t_count_entries(top, ".out_hf.ckptio-tmp-") == 1 && !t_file_exists(out));
    /* Planted beside it: directories named like temporaries that nothing proves are a dead builder's. */
    char bare[1024], linked[1024], mixed[1024], victim[1024];
    snprintf(bare, sizeof bare, "%s/.b.ckptio-tmp-BBBBBB", top);
    snprintf(linked, sizeof linked, "%s/.l.ckptio-tmp-LLLLLL", top);
    snprintf(mixed, sizeof mixed, "%s/.m.ckptio-tmp-MMMMMM", top);
    snprintf(victim, sizeof victim, "%s/victim", top);
    t_write_file(victim, "", 0);
    plant_dir(bare, NULL, false);
    plant_dir(linked, victim, false);
    plant_dir(mixed, NULL, true);
    ckptio_cleanup_report r;
    /* The converter lives: its directory is busy and kept. */
    T_OK(ckptio_cleanup_temporaries(top, NULL, 0, &r));
    T_ASSERT_MSG(r.removed == 0 && r.busy == 1 && r.ignored == 3, "removed %zu busy %zu ignored %zu", r.removed,
                 r.busy, r.ignored);
    T_ASSERT(t_count_entries(top, ".out_hf.ckptio-tmp-") == 1);
    T_ASSERT(kill(pid, SIGKILL) == 0);
    int ws;
    T_ASSERT(waitpid(pid, &ws, 0) == pid && WIFSIGNALED(ws));
    close(hold[1]);
    /* Dead: removed (the kernel may take a moment to drop a killed process's lock). */
    for (int tries = 0; tries < 200; tries++) {
        T_OK(ckptio_cleanup_temporaries(top, NULL, 0, &r));
        if (r.removed) break;
        usleep(10000);
    }
    T_ASSERT_MSG(r.removed == 1 && r.bytes_freed > 0 && r.busy == 0 && r.ignored == 3,
                 "removed %zu busy %zu ignored %zu", r.removed, r.busy, r.ignored);
    T_ASSERT(t_count_entries(top, ".out_hf.ckptio-tmp-") == 0 && !t_file_exists(out));
    /* The planted ones are whole. */
    const char *const planted[] = {bare, linked, mixed};
    for (size_t k = 0; k < 3; k++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/shard.safetensors", planted[k]);
        size_t len;
        char *kept = t_read_file(p, &len);
        T_ASSERT_MSG(len == 8 && memcmp(kept, "precious", 8) == 0, "%s", p);
        free(kept);
    }
    struct stat sb;
    char p[1100];
    snprintf(p, sizeof p, "%s/sub", mixed);
    T_ASSERT(lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode));
    snprintf(p, sizeof p, "%s/.ckptio-tmp-dir.lock", linked);
    T_ASSERT(lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode) && t_file_exists(victim));
    /* A finished conversion: its output carries no lock file, and clean leaves it alone. */
    const ckptio_convert_options o = {.to = CKPTIO_CONVERT_HF, .shard_size = sizeof data[0]};
    T_OK(ckptio_convert(engine, in, out, &o, NULL));
    T_ASSERT(t_count_entries(out, "ckptio-tmp") == 0 && t_count_entries(top, ".out_hf.ckptio-tmp-") == 0);
    check_model(out);
}

int main(void) {
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_convert_chain_through_every_kind);
    T_RUN(test_convert_refuses_before_writing);
    T_RUN(test_torch_to_safetensors_matches_the_writer);
    T_RUN(test_safetensors_to_torch_reads_back);
    T_RUN(test_input_truncated_between_tensors);
    T_RUN(test_expanded_views_are_written_in_bounded_memory);
    T_RUN(test_killed_conversion_is_cleaned_once_dead);
    ckptio_engine_destroy(engine);
    return T_EXIT_PASS;
}
