/*
 * helpers.c - implementation of the t_ test helpers.
 */
#include "helpers.h"
#include "vm_flags.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <ftw.h>
#include <spawn.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

void t_fail_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(T_EXIT_FAIL);
}

void t_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "SKIP: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(T_EXIT_SKIP);
}

void t_message_has(const char *file, int line, const char *needle) {
    const char *msg = ckptio_last_error_message();
    if (!strstr(msg, needle)) t_fail_at(file, line, "error message \"%s\" lacks \"%s\"", msg, needle);
}

static char tmpdir_buf[512];

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tmpdir(void) {
    if (tmpdir_buf[0] && !getenv("CKPTIO_TEST_KEEP")) nftw(tmpdir_buf, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *t_tmpdir(void) {
    if (!tmpdir_buf[0]) {
        const char *base = getenv("CKPTIO_TEST_TMPDIR");
        if (!base) base = getenv("TMPDIR");
        /* /var/tmp is usually disk-backed (O_DIRECT works), /tmp may be tmpfs. */
        if (!base) base = access("/var/tmp", W_OK) == 0 ? "/var/tmp" : "/tmp";
        snprintf(tmpdir_buf, sizeof tmpdir_buf, "%s/ckptio-test-XXXXXX", base);
        if (!mkdtemp(tmpdir_buf)) t_fail_at(__FILE__, __LINE__, "mkdtemp %s: %s", tmpdir_buf, strerror(errno));
        atexit(remove_tmpdir);
    }
    return tmpdir_buf;
}

const char *t_path(const char *name) {
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", t_tmpdir(), name);
    return b;
}

const char *t_data_path(const char *sub, const char *name) {
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    const char *dir = getenv("CKPTIO_TEST_DATA");
    snprintf(b, sizeof bufs[0], "%s/%s/%s", dir ? dir : "tests/data", sub, name);
    return b;
}

void t_fill_random(void *buf, size_t len, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    unsigned char *p = buf;
    for (size_t i = 0; i < len; i++) {
        if (i % 8 == 0) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        p[i] = (unsigned char)(x >> (8 * (i % 8)));
    }
}

void *t_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) t_fail_at(__FILE__, __LINE__, "open %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(data, 1, (size_t)n, f) != (size_t)n) t_fail_at(__FILE__, __LINE__, "read %s", path);
    fclose(f);
    *len = (size_t)n;
    return data;
}

void t_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) t_fail_at(__FILE__, __LINE__, "create %s: %s", path, strerror(errno));
    if (len && fwrite(data, 1, len, f) != len) t_fail_at(__FILE__, __LINE__, "write %s", path);
    fclose(f);
}

bool t_file_exists(const char *path) { return access(path, F_OK) == 0; }

void t_unsetenv_prefix(const char *prefix, const char *keep) {
    extern char **environ;
    for (char **env = environ; *env;) {
        if (strncmp(*env, prefix, strlen(prefix)) != 0 || (keep && strncmp(*env, keep, strlen(keep)) == 0)) {
            env++;
            continue;
        }
        char name[256];
        const size_t n = strcspn(*env, "=");
        if (n >= sizeof name) t_fail_at(__FILE__, __LINE__, "an environment variable's name is too long: %s", *env);
        memcpy(name, *env, n);
        name[n] = '\0';
        unsetenv(name);
        env = environ; /* unsetenv moved the entries */
    }
}

int t_count_entries(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strstr(e->d_name, needle)) n++;
    closedir(d);
    return n;
}

int t_page_state(const void *p) {
    unsigned char v = 0;
    void *page = (void *)((uintptr_t)p & ~(uintptr_t)4095);
    if (mincore(page, 4096, &v) != 0) return -1;
    return v & 1;
}

int t_vm_flag(const void *p, const char *flag) { return ckptio__test_vm_flag(p, flag); }

extern char **environ;

int t_run_self(const char *self, const char *arg) {
    char *argv[] = {(char *)self, (char *)arg, NULL};
    pid_t pid;
    if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0) return -1;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

void t_killed_save(const char *path) {
    const pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) {
        ckptio_engine *e;
        ckptio_file *f;
        if (ckptio_engine_create(&e) || ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &f)) _exit(3);
        raise(SIGKILL);
    }
    int ws;
    T_ASSERT(waitpid(pid, &ws, 0) == pid && WIFSIGNALED(ws));
}
