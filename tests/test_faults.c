/*
 * test_faults.c - systematic fault injection over every save and load path.
 *
 * For each path (safetensors save with and without checksums, safetensors
 * load + verify, torch.save save, torch load + verify, a raw plan write +
 * commit, a raw plan read, and the GPU pipeline on the simulated device,
 * both directions) and each kind of request (open, O_DIRECT open, read,
 * write, fsync, rename), the nth request is made to fail, for n = 1, 2, ...
 * until n passes the last request the path makes. Every run must:
 *  - with ENOSPC/EIO: fail, with a message naming the file and strerror;
 *    with EINTR or a short transfer: succeed with the right bytes;
 *  - leave under the final name either the old checkpoint or the new one,
 *    complete (loaded and compared tensor by tensor, its manifest verified
 *    when one exists), and no temporary;
 *  - leak no descriptor (counted in /proc/self/fd) and no memory
 *    (LeakSanitizer in the ASan build), and leave the library usable: the
 *    same path then runs clean.
 * GPU paths also sweep the simulator's copy failures (at queue and at run
 * time) and check that staging memory is returned. The directory is on
 * /dev/shm when possible so that the many fsyncs cost nothing.
 */
#include "gpu_sim.h"
#include "helpers.h"
#include "io_inject.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KIB 1024u

static ckptio_engine *engine;

/* Two versions of a 3-tensor checkpoint; "old" is on disk before a save
 * writes "new". Sizes make several 64 KiB requests and unaligned ends. */
enum { NT = 3 };
static const uint64_t sizes[NT] = {200 * KIB + 3, 64 * KIB + 1, 0};
static int64_t shapes[NT][1];
static unsigned char *host[2][NT];
static unsigned char *dev[2]; /* simulated device copies of tensor 0 */
static unsigned char *dev_load; /* simulated device memory loads go to */
static const char *names[NT] = {"alpha", "beta", "empty"};

static void make_sources(int version, bool gpu, ckptio_tensor_source out[NT]) {
    for (int i = 0; i < NT; i++) {
        shapes[i][0] = (int64_t)sizes[i];
        out[i] = (ckptio_tensor_source){names[i], CKPTIO_DTYPE_U8, 1, shapes[i], sizes[i] ? host[version][i] : NULL,
                                        sizes[i], CKPTIO_MEM_HOST};
    }
    if (gpu) {
        out[0].data = dev[version];
        out[0].mem_kind = CKPTIO_MEM_CUDA;
    }
}

/* ---- what is under a final name --------------------------------------------------- */

/* Which version the safetensors file holds (-1: missing or neither); its
 * manifest, if any, must verify. */
static int st_version(const char *path) {
    ckptio_safetensors *st;
    if (ckptio_safetensors_open(engine, path, &st) != CKPTIO_OK) return -1;
    int which = -1;
    size_t n;
    T_OK(ckptio_safetensors_count(st, &n));
    for (int v = 0; v < 2 && which < 0 && n == NT; v++) {
        bool same = true;
        for (int i = 0; i < NT && same; i++) {
            size_t idx;
            T_OK(ckptio_safetensors_find(st, names[i], &idx));
            unsigned char *got = malloc(sizes[i] + 1);
            ckptio_tensor_target tg = {idx, got, sizes[i], CKPTIO_MEM_HOST};
            same = ckptio_safetensors_read(st, &tg, 1) == CKPTIO_OK && memcmp(got, host[v][i], sizes[i]) == 0;
            free(got);
        }
        if (same) which = v;
    }
    char mpath[1024];
    T_OK(ckptio_manifest_path(path, mpath, sizeof mpath));
    if (which >= 0 && t_file_exists(mpath)) T_OK(ckptio_safetensors_verify(st, NULL, NULL));
    ckptio_safetensors_close(st);
    return which;
}

static int torch_version(const char *path) {
    ckptio_torch *t;
    if (ckptio_torch_open(engine, path, &t) != CKPTIO_OK) return -1;
    T_OK(ckptio_torch_verify(t, NULL));
    int which = -1;
    for (int v = 0; v < 2 && which < 0; v++) {
        bool same = true;
        for (int i = 0; i < NT && same; i++) {
            size_t idx;
            T_OK(ckptio_torch_find(t, names[i], &idx));
            unsigned char *got = malloc(sizes[i] + 1);
            ckptio_tensor_target tg = {idx, got, sizes[i], CKPTIO_MEM_HOST};
            same = ckptio_torch_read(t, &tg, 1) == CKPTIO_OK && memcmp(got, host[v][i], sizes[i]) == 0;
            free(got);
        }
        if (same) which = v;
    }
    ckptio_torch_close(t);
    return which;
}

static int raw_version(const char *path) {
    size_t len;
    if (!t_file_exists(path)) return -1;
    unsigned char *img = t_read_file(path, &len);
    int which = -1;
    for (int v = 0; v < 2; v++)
        if (len == sizes[0] && memcmp(img, host[v][0], len) == 0) which = v;
    free(img);
    return which;
}

/* ---- the paths ------------------------------------------------------------------------ */

static ckptio_status st_save(int version, bool gpu, unsigned flags) {
    ckptio_tensor_source src[NT];
    make_sources(version, gpu, src);
    return ckptio_safetensors_save(engine, t_path("st.safetensors"), src, NT, NULL, 0, flags);
}
static ckptio_status run_st_save(int v) { return st_save(v, false, CKPTIO_SAFETENSORS_CHECKSUMS); }
static ckptio_status run_st_save_plain(int v) { return st_save(v, false, 0); }
static ckptio_status run_st_save_gpu(int v) { return st_save(v, true, CKPTIO_SAFETENSORS_CHECKSUMS); }

static ckptio_status run_torch_save(int version) {
    ckptio_tensor_source src[NT];
    make_sources(version, false, src);
    return ckptio_torch_save_tensors(engine, t_path("t.pt"), src, NT, NULL);
}

static ckptio_status run_raw_save(int version) {
    ckptio_file *f = NULL;
    ckptio_plan *p = NULL;
    ckptio_status st = ckptio_file_open(engine, t_path("raw.bin"), CKPTIO_OPEN_WRITE, &f);
    if (st == CKPTIO_OK) st = ckptio_plan_create(CKPTIO_WRITE, &p);
    ckptio_extent x = {.file = f, .length = sizes[0], .memory = host[version][0], .mem_kind = CKPTIO_MEM_HOST};
    if (st == CKPTIO_OK) st = ckptio_plan_add(p, &x);
    if (st == CKPTIO_OK) st = ckptio_engine_execute(engine, p);
    if (st == CKPTIO_OK) st = ckptio_file_commit(f);
    ckptio_plan_destroy(p);
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_status cst = ckptio_file_close(f);
    if (saved) ckptio__error_restore(saved);
    return st != CKPTIO_OK ? st : cst;
}

/* Loads: read version 1 (on disk) and compare. */
static ckptio_status run_st_load(int gpu) {
    ckptio_safetensors *st;
    CKPTIO_FORWARD(ckptio_safetensors_open(engine, t_path("st.safetensors"), &st));
    ckptio_tensor_target tg[NT];
    unsigned char *got[NT];
    for (int i = 0; i < NT; i++) {
        got[i] = calloc(1, sizes[i] + 1);
        T_OK(ckptio_safetensors_find(st, names[i], &tg[i].index));
        tg[i] = (ckptio_tensor_target){tg[i].index, got[i], sizes[i], CKPTIO_MEM_HOST};
    }
    if (gpu) {
        memset(dev_load, 0, sizes[0]);
        tg[0].data = dev_load;
        tg[0].mem_kind = CKPTIO_MEM_CUDA;
    }
    ckptio_status s = ckptio_safetensors_read(st, tg, NT);
    if (s == CKPTIO_OK && !gpu) s = ckptio_safetensors_verify(st, NULL, NULL);
    if (s == CKPTIO_OK) {
        T_ASSERT(memcmp(gpu ? dev_load : got[0], host[1][0], sizes[0]) == 0);
        T_ASSERT(memcmp(got[1], host[1][1], sizes[1]) == 0);
    }
    for (int i = 0; i < NT; i++) free(got[i]);
    ckptio__error_saved *saved = s != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_safetensors_close(st);
    if (saved) ckptio__error_restore(saved);
    return s;
}
static ckptio_status run_st_load_host(int v) { (void)v; return run_st_load(0); }
static ckptio_status run_st_load_gpu(int v) { (void)v; return run_st_load(1); }

static ckptio_status run_torch_load(int v) {
    (void)v;
    ckptio_torch *t;
    CKPTIO_FORWARD(ckptio_torch_open(engine, t_path("t.pt"), &t));
    ckptio_status s = ckptio_torch_verify(t, NULL);
    unsigned char *got = malloc(sizes[0]);
    ckptio_tensor_target tg = {0, got, sizes[0], CKPTIO_MEM_HOST};
    if (s == CKPTIO_OK) s = ckptio_torch_find(t, names[0], &tg.index);
    if (s == CKPTIO_OK) s = ckptio_torch_read(t, &tg, 1);
    if (s == CKPTIO_OK) T_ASSERT(memcmp(got, host[1][0], sizes[0]) == 0);
    free(got);
    ckptio__error_saved *saved = s != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_torch_close(t);
    if (saved) ckptio__error_restore(saved);
    return s;
}

static ckptio_status run_raw_load(int v) {
    (void)v;
    ckptio_file *f;
    CKPTIO_FORWARD(ckptio_file_open(engine, t_path("raw.bin"), CKPTIO_OPEN_READ, &f));
    unsigned char *got = malloc(sizes[0]);
    ckptio_plan *p;
    T_OK(ckptio_plan_create(CKPTIO_READ, &p));
    ckptio_extent x = {.file = f, .length = sizes[0], .memory = got, .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_plan_add(p, &x));
    ckptio_status s = ckptio_engine_execute(engine, p);
    if (s == CKPTIO_OK) T_ASSERT(memcmp(got, host[1][0], sizes[0]) == 0);
    ckptio_plan_destroy(p);
    free(got);
    ckptio__error_saved *saved = s != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_file_close(f);
    if (saved) ckptio__error_restore(saved);
    return s;
}

typedef struct path_case {
    const char *name;
    ckptio_status (*run)(int version); /* saves write `version`; loads read version 1 */
    bool save;
    const char *file;                  /* final name */
    int (*version_of)(const char *path);
    bool gpu;
} path_case;

static const path_case cases[] = {
    {"safetensors save + checksums", run_st_save, true, "st.safetensors", st_version, false},
    {"safetensors save", run_st_save_plain, true, "st.safetensors", st_version, false},
    {"safetensors save from GPU", run_st_save_gpu, true, "st.safetensors", st_version, true},
    {"safetensors load + verify", run_st_load_host, false, "st.safetensors", st_version, false},
    {"safetensors load to GPU", run_st_load_gpu, false, "st.safetensors", st_version, true},
    {"torch save", run_torch_save, true, "t.pt", torch_version, false},
    {"torch load + verify", run_torch_load, false, "t.pt", torch_version, false},
    {"raw plan write + commit", run_raw_save, true, "raw.bin", raw_version, false},
    {"raw plan read", run_raw_load, false, "raw.bin", raw_version, false},
};

static int g_config; /* 0: pread with 2 workers; 1: io_uring run inline */

static void new_engine(void) {
    T_OK(ckptio_engine_create(&engine));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_BACKEND, g_config ? CKPTIO_BACKEND_IO_URING : CKPTIO_BACKEND_PREAD));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_THREADS, g_config ? 0 : 2));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_CHUNK_BYTES, 64 * KIB));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_STAGING_BYTES, 1024 * KIB));
    T_OK(ckptio_engine_set(engine, CKPTIO_OPT_DIRECT_MIN_BYTES, 0));
}

/* ---- invariants ------------------------------------------------------------------------ */

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    T_ASSERT(d);
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

static void check_staging_returned(void) {
    ckptio_stats s;
    T_OK(ckptio_engine_stats(engine, &s));
    T_ASSERT_MSG(s.staging_in_use == 0, "staging still in use: %llu", (unsigned long long)s.staging_in_use);
    ckptio__gpu_sim_stats g;
    ckptio__gpu_sim_get_stats(&g);
    T_ASSERT(g.ctx_depth == 0 && g.violations == 0);
}

/* Puts version 1 on disk for loads, version 0 before a save writes 1. */
static void set_stage(const path_case *c) {
    ckptio__io_inject_reset();
    ckptio__gpu_sim_configure(NULL);
    T_OK(c->run == run_st_load_host || c->run == run_st_load_gpu ? run_st_save(1)
         : c->run == run_torch_load                              ? run_torch_save(1)
         : c->run == run_raw_load                                ? run_raw_save(1)
                                                                 : c->run(0));
    T_ASSERT(c->version_of(t_path(c->file)) == (c->save ? 0 : 1));
}

/* After one injected run: the state rules of the file header comment. */
static void check_after(const path_case *c, ckptio_status st, int err, bool must_fail, const char *what) {
    if (must_fail) {
        T_ASSERT_MSG(st != CKPTIO_OK, "%s: %s: the injected fault was swallowed", c->name, what);
        const char *msg = ckptio_last_error_message();
        T_ASSERT_MSG(strstr(msg, c->file) != NULL, "%s: %s: message \"%s\" does not name %s", c->name, what, msg,
                     c->file);
        if (err) T_ASSERT_MSG(strstr(msg, strerror(err)) != NULL, "%s: %s: message \"%s\" lacks \"%s\"", c->name, what,
                              msg, strerror(err));
        T_ASSERT_MSG(ckptio_last_error()->operation[0] != '\0', "%s: %s: no operation in the error", c->name, what);
    } else {
        T_ASSERT_MSG(st == CKPTIO_OK, "%s: %s: failed: %s", c->name, what, ckptio_last_error_message());
    }
    ckptio__io_inject_reset();
    const int v = c->version_of(t_path(c->file));
    if (c->save) {
        T_ASSERT_MSG(v == 0 || v == 1, "%s: %s: the final name holds neither checkpoint", c->name, what);
        if (st == CKPTIO_OK) T_ASSERT_MSG(v == 1, "%s: %s: success but the old data is in place", c->name, what);
    } else {
        T_ASSERT(v == 1);
    }
    T_ASSERT_MSG(t_count_entries(t_tmpdir(), "ckptio-tmp") == 0, "%s: %s: temporaries left", c->name, what);
    check_staging_returned();
    /* Usable afterwards: the same path runs clean. */
    set_stage(c);
    T_OK(c->run(1));
    set_stage(c);
}

typedef struct fault_spec {
    ckptio__io_kind kind;
    int err;            /* 0: short transfer */
    bool must_fail;
    const char *label;
} fault_spec;

static const fault_spec specs[] = {
    {CKPTIO__IO_OPEN, ENOSPC, true, "open ENOSPC"},
    {CKPTIO__IO_OPEN, EINTR, false, "open EINTR"},
    {CKPTIO__IO_OPEN_DIRECT, EINVAL, false, "O_DIRECT refused"},
    {CKPTIO__IO_READ, EIO, true, "read EIO"},
    {CKPTIO__IO_READ, EINTR, false, "read EINTR"},
    {CKPTIO__IO_READ, 0, false, "short read"},
    {CKPTIO__IO_WRITE, ENOSPC, true, "write ENOSPC"},
    {CKPTIO__IO_WRITE, EIO, true, "write EIO"},
    {CKPTIO__IO_WRITE, EINTR, false, "write EINTR"},
    {CKPTIO__IO_WRITE, 0, false, "short write"},
    {CKPTIO__IO_FSYNC, EIO, true, "fsync EIO"},
    {CKPTIO__IO_FSYNC, EINTR, false, "fsync EINTR"},
    {CKPTIO__IO_RENAME, ENOSPC, true, "rename ENOSPC"},
};

static unsigned sweep_io(const path_case *c) {
    unsigned runs = 0;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        const fault_spec *f = &specs[k];
        for (uint64_t nth = 1;; nth++) {
            T_ASSERT_MSG(nth < 1000, "%s: %s: no end to the requests", c->name, f->label);
            ckptio__io_inject(f->kind, nth, f->err, 1000, false);
            const ckptio_status st = c->run(1);
            const bool fired = ckptio__io_inject_countdown(f->kind) == 0;
            char what[96];
            snprintf(what, sizeof what, "%s at request %llu", f->label, (unsigned long long)nth);
            runs++;
            check_after(c, st, f->err, fired && f->must_fail, what);
            if (!fired) break;
        }
    }
    return runs;
}

/* The simulator's copy failures: when queued, and when run (surfacing at
 * the event sync). */
static unsigned sweep_gpu(const path_case *c) {
    unsigned runs = 0;
    for (int at_run = 0; at_run < 2; at_run++) {
        for (uint64_t nth = 1;; nth++) {
            T_ASSERT(nth < 1000);
            ckptio__gpu_sim_config cfg = {.fail_enqueue_at = at_run ? 0 : nth, .fail_run_at = at_run ? nth : 0};
            ckptio__gpu_sim_configure(&cfg);
            const ckptio_status st = c->run(1);
            ckptio__gpu_sim_stats g;
            ckptio__gpu_sim_get_stats(&g);
            const bool fired = g.copies >= nth;
            char what[96];
            snprintf(what, sizeof what, "GPU copy %llu failing at %s", (unsigned long long)nth,
                     at_run ? "run" : "queue");
            runs++;
            /* Like CUDA's, an asynchronous copy error is sticky for the
             * streams that saw it: only a new engine (new streams) runs
             * again. The error itself must still come back cleanly. */
            if (fired && at_run) {
                T_ASSERT_MSG(st != CKPTIO_OK, "%s: %s: swallowed", c->name, what);
                T_ASSERT(ckptio_last_error()->status == CKPTIO_E_CUDA);
                T_OK(ckptio_engine_destroy(engine));
                new_engine();
            }
            check_after(c, st, 0, fired, what);
            if (!fired) break;
        }
    }
    return runs;
}

int main(void) {
    /* /dev/shm: thousands of fsyncs for free (the paths, not the disk, are tested). */
    if (!getenv("CKPTIO_TEST_TMPDIR") && access("/dev/shm", W_OK) == 0) setenv("CKPTIO_TEST_TMPDIR", "/dev/shm", 1);
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < NT; i++) {
            host[v][i] = malloc(sizes[i] + 1);
            t_fill_random(host[v][i], sizes[i], (uint64_t)(10 * v + i + 1));
        }
        dev[v] = ckptio__gpu_sim_device_alloc(sizes[0]);
        T_ASSERT(dev[v]);
        memcpy(dev[v], host[v][0], sizes[0]);
    }
    dev_load = ckptio__gpu_sim_device_alloc(sizes[0]);
    T_ASSERT(dev_load);
    const char *why = NULL;
    const bool uring = ckptio__io_uring_probe(&why) == 0;
    const int fds = count_fds();
    for (int config = 0; config < (uring ? 2 : 1); config++) {
        g_config = config;
        new_engine();
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const path_case *c = &cases[i];
            set_stage(c);
            unsigned runs = sweep_io(c);
            if (c->gpu) runs += sweep_gpu(c);
            printf("ok %s (%s): %u injected runs\n", c->name, config ? "io_uring" : "pread", runs);
            fflush(stdout);
        }
        T_OK(ckptio_engine_destroy(engine));
        T_ASSERT_MSG(count_fds() == fds, "descriptors leaked: %d open, %d before", count_fds(), fds);
    }
    if (!uring) printf("# io_uring skipped: %s\n", why);
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < NT; i++) free(host[v][i]);
        ckptio__gpu_sim_device_free(dev[v]);
    }
    ckptio__gpu_sim_device_free(dev_load);
    return T_EXIT_PASS;
}
