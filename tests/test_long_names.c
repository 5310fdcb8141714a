/*
 * test_long_names.c - every file name up to NAME_MAX (255 bytes) can be
 * saved, as torch.save and safetensors save it, although a temporary's
 * name (".NAME.ckptio-tmp-XXXXXX") and a manifest's (NAME +
 * ".ckptio-manifest.json") add 19 and 21 bytes: long names get a bounded
 * stand-in there (first bytes, '~', 16 hex digits of the name's hash).
 *
 *  - safetensors (with checksums) and torch saves of 200, 234-237, 250
 *    and 255-byte names, ASCII and multi-byte UTF-8: read back, verified,
 *    no temporary left, every name in the directory within 255 bytes;
 *  - ckptio_manifest_path's rule: unchanged up to 234 bytes, then the
 *    stand-in, deterministic, distinct for names sharing a long prefix,
 *    never cut inside a UTF-8 character;
 *  - a 256-byte name: CKPTIO_E_INVAL with errno ENAMETOOLONG, naming the
 *    file and its length;
 *  - a save of a 255-byte name killed with SIGKILL: its temporary is found
 *    by ckptio_cleanup_temporaries with the name filter (and not by the
 *    filter of another long name with the same first 236 bytes), and by
 *    the next save of that name.
 */
#include "helpers.h"
#include "io_inject.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static ckptio_engine *engine;
static unsigned char payload[5000];
static int64_t shape[1] = {5000};

/* A name of exactly `len` bytes: `fill` repeated (an ASCII letter or a
 * 2/3-byte UTF-8 character), ASCII padding at the end, then `tail`. */
static const char *long_name(size_t len, const char *fill, const char *tail) {
    static char buf[4][512];
    static int next;
    char *b = buf[next++ % 4];
    const size_t f = strlen(fill), t = strlen(tail);
    size_t n = 0;
    while (n + f + t <= len) {
        memcpy(b + n, fill, f);
        n += f;
    }
    while (n + t < len) b[n++] = 'x';
    memcpy(b + n, tail, t + 1);
    T_ASSERT(strlen(b) == len);
    return b;
}

/* Every entry of the test directory fits NAME_MAX and is valid UTF-8 where
 * the saved names are (no character cut in half). */
static void expect_names_fit(void) {
    DIR *d = opendir(t_tmpdir());
    T_ASSERT(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        T_ASSERT_MSG(strlen(e->d_name) <= 255, "%s is %zu bytes", e->d_name, strlen(e->d_name));
        const unsigned char *p = (const unsigned char *)e->d_name;
        for (size_t i = 0; p[i];) {
            size_t n = p[i] < 0x80 ? 1 : p[i] >= 0xF0 ? 4 : p[i] >= 0xE0 ? 3 : 2;
            T_ASSERT_MSG(p[i] < 0x80 || p[i] >= 0xC0, "%s: a cut UTF-8 character at byte %zu", e->d_name, i);
            for (size_t k = 1; k < n; k++) T_ASSERT_MSG((p[i + k] & 0xC0) == 0x80, "%s: bad UTF-8", e->d_name);
            i += n;
        }
    }
    closedir(d);
}

static void check_safetensors(const char *path) {
    const ckptio_tensor_source src = {"w", CKPTIO_DTYPE_U8, 1, shape, payload, sizeof payload, CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_save(engine, path, &src, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS));
    T_OK(ckptio_safetensors_save(engine, path, &src, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS)); /* over itself */
    char mpath[1024];
    T_OK(ckptio_manifest_path(path, mpath, sizeof mpath));
    T_ASSERT_MSG(t_file_exists(mpath), "no manifest %s", mpath);
    ckptio_safetensors *st;
    T_OK(ckptio_safetensors_open(engine, path, &st));
    ckptio_verify_report r;
    T_OK(ckptio_safetensors_verify(st, NULL, &r));
    T_ASSERT(r.tensors == 1 && r.bytes == sizeof payload);
    ckptio_safetensors_close(st);
    /* Without checksums the manifest of the long name is removed. */
    T_OK(ckptio_safetensors_save(engine, path, &src, 1, NULL, 0, 0));
    T_ASSERT(!t_file_exists(mpath));
}

static void check_torch(const char *path) {
    const ckptio_tensor_source src = {"w", CKPTIO_DTYPE_U8, 1, shape, payload, sizeof payload, CKPTIO_MEM_HOST};
    T_OK(ckptio_torch_save_tensors(engine, path, &src, 1, NULL));
    T_OK(ckptio_torch_save_tensors(engine, path, &src, 1, NULL));
    ckptio_torch *t;
    T_OK(ckptio_torch_open(engine, path, &t));
    T_OK(ckptio_torch_verify(t, NULL));
    unsigned char got[sizeof payload];
    ckptio_tensor_target tg = {0, got, sizeof got, CKPTIO_MEM_HOST};
    T_OK(ckptio_torch_find(t, "w", &tg.index));
    T_OK(ckptio_torch_read(t, &tg, 1));
    T_ASSERT(memcmp(got, payload, sizeof got) == 0);
    ckptio_torch_close(t);
}

static void test_long_names_save(void) {
    static const size_t lens[] = {200, 234, 235, 236, 237, 250, 254, 255};
    static const char *const fills[] = {"a", "\xc3\xa9", "\xe6\xa8\xa1"}; /* a, e-acute, a CJK character */
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
        for (size_t f = 0; f < sizeof fills / sizeof *fills; f++) {
            check_safetensors(t_path(long_name(lens[i], fills[f], ".safetensors")));
            check_torch(t_path(long_name(lens[i], fills[f], ".pt")));
            T_ASSERT_MSG(t_count_entries(t_tmpdir(), ".ckptio-tmp-") == 0, "temporaries left for %zu bytes", lens[i]);
        }
    expect_names_fit();
}

static void test_manifest_path_rule(void) {
    char buf[1024];
    /* Up to 234 bytes: NAME + suffix, as always. */
    const char *name = long_name(234, "m", ".st");
    T_OK(ckptio_manifest_path(t_path(name), buf, sizeof buf));
    char want[512];
    snprintf(want, sizeof want, "%s" CKPTIO_MANIFEST_SUFFIX, name);
    T_ASSERT(strcmp(strrchr(buf, '/') + 1, want) == 0 && strlen(want) == 255);
    /* 235 bytes: first 217 bytes, '~', 16 hex digits, suffix: 255 bytes. */
    const char *a = long_name(235, "m", ".a"), *b = long_name(235, "m", ".b");
    char ma[1024], mb[1024], ma2[1024];
    T_OK(ckptio_manifest_path(a, ma, sizeof ma)); /* no directory part */
    T_OK(ckptio_manifest_path(b, mb, sizeof mb));
    T_OK(ckptio_manifest_path(a, ma2, sizeof ma2));
    T_ASSERT(strlen(ma) == 255 && strncmp(ma, a, 217) == 0 && ma[217] == '~');
    T_ASSERT(strcmp(ma + 234, CKPTIO_MANIFEST_SUFFIX) == 0);
    for (int i = 218; i < 234; i++) T_ASSERT((ma[i] >= '0' && ma[i] <= '9') || (ma[i] >= 'a' && ma[i] <= 'f'));
    T_ASSERT(strcmp(ma, ma2) == 0);  /* deterministic */
    T_ASSERT(strcmp(ma, mb) != 0);   /* same first 234 bytes, other names */
    /* The directory part is kept as given. */
    T_OK(ckptio_manifest_path("/some/dir/../x", buf, sizeof buf));
    T_ASSERT(strcmp(buf, "/some/dir/../x" CKPTIO_MANIFEST_SUFFIX) == 0);
    char longdir[1024];
    snprintf(longdir, sizeof longdir, "%s/%s", long_name(300, "d", ""), a);
    T_OK(ckptio_manifest_path(longdir, buf, sizeof buf));
    T_ASSERT(strncmp(buf, longdir, 301) == 0 && strcmp(buf + 301, ma) == 0);
    /* Never cut inside a UTF-8 character (2-byte characters: the cut at 217
     * falls inside one and moves back to 216). */
    const char *u = long_name(250, "\xc3\xa9", "");
    T_OK(ckptio_manifest_path(u, buf, sizeof buf));
    T_ASSERT(buf[216] == '~' && strncmp(buf, u, 216) == 0 && strlen(buf) == 254);
    /* Too small a buffer: E_RANGE, buf emptied. */
    T_STATUS(ckptio_manifest_path(a, buf, 100), CKPTIO_E_RANGE);
    T_ASSERT(buf[0] == '\0');
}

static void test_too_long(void) {
    const char *path = t_path(long_name(256, "z", ".safetensors"));
    const ckptio_tensor_source src = {"w", CKPTIO_DTYPE_U8, 1, shape, payload, sizeof payload, CKPTIO_MEM_HOST};
    T_STATUS(ckptio_safetensors_save(engine, path, &src, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS), CKPTIO_E_INVAL);
    T_ASSERT(ckptio_last_error()->sys_errno == ENAMETOOLONG);
    T_MESSAGE_HAS(path);
    T_MESSAGE_HAS("the file name is 256 bytes long, names may have at most 255 bytes");
    T_MESSAGE_HAS("File name too long");
    T_STATUS(ckptio_torch_save_tensors(engine, t_path(long_name(300, "z", ".pt")), &src, 1, NULL), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("the file name is 300 bytes long");
    T_ASSERT(t_count_entries(t_tmpdir(), ".ckptio-tmp-") == 0);
}

/* ---- a killed save of a 255-byte name ----------------------------------------- */

static void wait_for_temporary(const char *stem_prefix) {
    for (int tries = 0; tries < 1000; tries++) {
        if (t_count_entries(t_tmpdir(), stem_prefix) == 1) return;
        struct timespec ms = {0, 5 * 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    t_fail_at(__FILE__, __LINE__, "the child's temporary did not appear");
}

/* As tests/test_crash.c: a dead writer's lock can outlive waitpid for a
 * moment (io_uring teardown). */
static void wait_unlocked(const char *path) {
    for (int tries = 0; tries < 500; tries++) {
        const int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        T_ASSERT(fd >= 0);
        const int ret = flock(fd, LOCK_EX | LOCK_NB);
        close(fd);
        if (ret == 0) return;
        struct timespec ms = {0, 10 * 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    t_fail_at(__FILE__, __LINE__, "a dead writer's temporary stayed locked for 5 s");
}

static char *find_temporary(void) {
    DIR *d = opendir(t_tmpdir());
    T_ASSERT(d);
    char *found = NULL;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".ckptio-tmp-")) {
            T_ASSERT(!found);
            found = strdup(e->d_name);
        }
    closedir(d);
    T_ASSERT(found);
    return found;
}

static void test_killed_save_cleaned(void) {
    const char *name = long_name(255, "k", ".safetensors");
    char keep[256];
    snprintf(keep, sizeof keep, "%s", name);
    /* Another 255-byte name with the same first 236 bytes. */
    char other[256];
    snprintf(other, sizeof other, "%s", name);
    other[240] = 'Q';
    char path[1024];
    snprintf(path, sizeof path, "%s", t_path(keep));
    const size_t big = 64u << 20;
    unsigned char *data = calloc(1, big);
    T_ASSERT(data);
    int64_t big_shape[1] = {(int64_t)big};
    fflush(stdout);
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        /* Slow writes (2 ms per request) keep the save in flight. */
        ckptio_engine *e;
        if (ckptio_engine_create(&e) != CKPTIO_OK || ckptio_engine_set(e, CKPTIO_OPT_CHUNK_BYTES, 1 << 20) != CKPTIO_OK)
            _exit(3);
        ckptio__io_inject_delay(2000);
        const ckptio_tensor_source src = {"w", CKPTIO_DTYPE_U8, 1, big_shape, data, big, CKPTIO_MEM_HOST};
        ckptio_safetensors_save(e, path, &src, 1, NULL, 0, CKPTIO_SAFETENSORS_CHECKSUMS);
        _exit(4);
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, ".%.40s", keep);
    wait_for_temporary(prefix);
    /* While the writer lives, its temporary is busy for the filter. */
    ckptio_cleanup_report r;
    T_OK(ckptio_cleanup_temporaries(t_tmpdir(), keep, 0, &r));
    T_ASSERT(r.removed == 0 && r.busy == 1);
    T_ASSERT(kill(pid, SIGKILL) == 0);
    int ws;
    T_ASSERT(waitpid(pid, &ws, 0) == pid && WIFSIGNALED(ws));
    char *tmp = find_temporary();
    /* Recognisable: the name's first bytes, the hash tail, the mark. */
    T_ASSERT(strlen(tmp) <= 255 && tmp[0] == '.' && strncmp(tmp + 1, keep, 219) == 0 && tmp[220] == '~');
    char tmp_path[1024];
    snprintf(tmp_path, sizeof tmp_path, "%s/%s", t_tmpdir(), tmp);
    wait_unlocked(tmp_path);
    /* The other name's filter leaves it; this name's filter removes it. */
    T_OK(ckptio_cleanup_temporaries(t_tmpdir(), other, 0, &r));
    T_ASSERT(r.removed == 0 && r.busy == 0 && t_file_exists(tmp_path));
    T_OK(ckptio_cleanup_temporaries(t_tmpdir(), keep, 0, &r));
    T_ASSERT_MSG(r.removed == 1 && !t_file_exists(tmp_path), "removed %zu", r.removed);
    /* Another killed temporary (a copy of the name, as a crash leaves it)
     * is removed by the next save of the name. */
    t_write_file(tmp_path, "stale", 5);
    const ckptio_tensor_source src = {"w", CKPTIO_DTYPE_U8, 1, shape, payload, sizeof payload, CKPTIO_MEM_HOST};
    T_OK(ckptio_safetensors_save(engine, path, &src, 1, NULL, 0, 0));
    T_ASSERT(!t_file_exists(tmp_path) && t_count_entries(t_tmpdir(), ".ckptio-tmp-") == 0);
    /* And the unfiltered clean (ckptio clean) finds long names' too. */
    t_write_file(tmp_path, "stale", 5);
    T_OK(ckptio_cleanup_temporaries(t_tmpdir(), NULL, 0, &r));
    T_ASSERT(r.removed == 1 && !t_file_exists(tmp_path));
    free(tmp);
    free(data);
}

int main(void) {
    t_fill_random(payload, sizeof payload, 3);
    T_OK(ckptio_engine_create(&engine));
    T_RUN(test_manifest_path_rule);
    T_RUN(test_long_names_save);
    T_RUN(test_too_long);
    T_RUN(test_killed_save_cleaned);
    T_OK(ckptio_engine_destroy(engine));
    return T_EXIT_PASS;
}
