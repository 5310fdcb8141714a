/*
 * format_probe.c - ckptio_format_detect(): the format of a path, for the
 * CLI, the Python package and anyone choosing a reader.
 *
 * A file's bytes are judged by ckptio_format_detect_bytes (format_detect.c),
 * a directory by the entries it holds (dir_probes below: add a layout there).
 * The path is opened once with O_PATH (src/io/open_regular.c: no driver's
 * open runs, nothing waits) and everything after that is asked of that
 * descriptor, so a FIFO or a device is never opened or read from and a path
 * swapped between the checks cannot mislead them. An object is judged by
 * one GET of its first bytes, which the engine keeps for the open that
 * follows the probe (src/io/object_file.c): probe and open cost that GET.
 */
#include "io_internal.h"
#include "safetensors_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Directory layouts, in the order they are tried: the first entry present
 * names the format, whatever the entry is (the format's reader then refuses
 * a FIFO or a directory there with its type; a layout never turns into
 * another one because of what its key file has become). */
static const struct {
    const char *entry;
    ckptio_format format;
} dir_probes[] = {
    {".metadata", CKPTIO_FORMAT_DCP},
    {"model.safetensors.index.json", CKPTIO_FORMAT_HF_INDEX},
};

static ckptio_format probe_directory(int dirfd) {
    for (size_t i = 0; i < sizeof dir_probes / sizeof dir_probes[0]; i++) {
        struct stat sb;
        if (fstatat(dirfd, dir_probes[i].entry, &sb, AT_SYMLINK_NOFOLLOW) == 0) return dir_probes[i].format;
    }
    return CKPTIO_FORMAT_DIRECTORY;
}

/* Where the probe reads: a descriptor, or an object's first bytes (its peek,
 * which the open after the probe takes) and past them the object, opened
 * when a read goes there. */
typedef struct source {
    int fd;
    ckptio_engine *engine;
    const unsigned char *head; /* an object's first head_len bytes */
    uint64_t head_len, size;
    ckptio_file *object;
} source;

static ckptio_status read_at(source *src, void *buf, size_t len, uint64_t offset, const char *path,
                             size_t *got) {
    if (src->engine) {
        const uint64_t n = offset >= src->size ? 0 : src->size - offset < len ? src->size - offset : len;
        *got = (size_t)n;
        if (n && offset + n <= src->head_len) {
            memcpy(buf, src->head + offset, (size_t)n);
            return CKPTIO_OK;
        }
        if (n && !src->object) CKPTIO_FORWARD(ckptio_file_open(src->engine, path, CKPTIO_OPEN_READ, &src->object));
        return n ? ckptio__file_io(src->object, CKPTIO_READ, buf, n, offset) : CKPTIO_OK;
    }
    const int fd = src->fd;
    ssize_t n;
    do {
        n = pread(fd, buf, len, (off_t)offset);
    } while (n < 0 && errno == EINTR && !ckptio__interrupt_requested());
    if (n < 0) return CKPTIO_FAIL_SYS(errno, "pread", path, offset, "cannot read the first bytes");
    *got = (size_t)n;
    return CKPTIO_OK;
}

/* Past a blank start of a safetensors header longer than the probe: reads
 * on to its first non-blank byte (the header is at most 100 MB, the reads
 * stop at its end). */
static ckptio_status blank_header_opens_object(source *fd, const unsigned char *head, uint64_t from,
                                               const char *path, bool *yes) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | head[i];
    const uint64_t end = CKPTIO__ST_PREFIX + n; /* within the file: checked by the probe */
    unsigned char buf[4096];
    *yes = false;
    for (uint64_t at = from; at < end;) {
        size_t got = 0;
        const size_t want = end - at < sizeof buf ? (size_t)(end - at) : sizeof buf;
        CKPTIO_FORWARD(read_at(fd, buf, want, at, path, &got));
        if (got == 0) return CKPTIO_OK; /* shrank meanwhile: not a whole header */
        for (size_t i = 0; i < got; i++) {
            const unsigned char c = buf[i];
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                *yes = c == '{';
                return CKPTIO_OK;
            }
        }
        at += got;
    }
    return CKPTIO_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* A Hugging Face index is JSON: an object, perhaps after blanks. */
static bool starts_json_object(const unsigned char *head, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (head[i] != ' ' && head[i] != '\t' && head[i] != '\n' && head[i] != '\r') return head[i] == '{';
    return false;
}

static ckptio_status probe_file(source *fd, uint64_t size, const char *path, ckptio_format *out) {
    unsigned char head[CKPTIO_FORMAT_PROBE_BYTES];
    const size_t want = size < sizeof head ? (size_t)size : sizeof head;
    size_t got = 0;
    CKPTIO_FORWARD(read_at(fd, head, want, 0, path, &got));
    /* A file that shrank since fstat is judged by what it still holds. */
    CKPTIO_FORWARD(ckptio_format_detect_bytes(head, got, got < want ? got : size, out));
    if (*out == CKPTIO_FORMAT_SAFETENSORS && ckptio__st_probe(head, got, size) == CKPTIO__ST_PROBE_MORE) {
        bool yes = false;
        CKPTIO_FORWARD(blank_header_opens_object(fd, head, got, path, &yes));
        if (!yes) *out = got > CKPTIO__ST_PREFIX && head[CKPTIO__ST_PREFIX] == '{' ? CKPTIO_FORMAT_SAFETENSORS
                                                                                   : CKPTIO_FORMAT_UNKNOWN;
    }
    if (*out == CKPTIO_FORMAT_UNKNOWN && ends_with(path, ".index.json") && starts_json_object(head, got))
        *out = CKPTIO_FORMAT_HF_INDEX;
    return CKPTIO_OK;
}

/* What a prefix's listing says of the layouts of dir_probes: the first
 * entry present (SIZE_MAX: none), and whether anything is under it. */
typedef struct probe_listing {
    size_t found;
    bool any;
} probe_listing;

static int probe_entry(void *user, const ckptio__object_entry *e) {
    probe_listing *p = user;
    const size_t n = sizeof dir_probes / sizeof dir_probes[0];
    bool past = true; /* past every probe's name: keys come in order, none can follow */
    p->any = true;
    for (size_t i = 0; i < n; i++) {
        if (e->kind == CKPTIO__PATH_FILE && !strcmp(e->name, dir_probes[i].entry) && i < p->found) p->found = i;
        past &= strcmp(e->name, dir_probes[i].entry) > 0;
    }
    return p->found == 0 || past;
}

/* An object is judged by its first bytes like a file; a prefix with keys
 * under it is a directory, judged by the objects dir_probes name. Those come
 * from the prefix's one listing (in key order, stopped past the last probe's
 * name): a HEAD per probe would be a round trip each. */
static ckptio_status probe_object(ckptio_engine *engine, const char *path, ckptio_format *out) {
    char *bucket = NULL, *key = NULL;
    CKPTIO_FORWARD(ckptio__s3_parse_url(path, true, &bucket, &key));
    const bool bucket_only = !*key, as_dir = bucket_only || path[strlen(path) - 1] == '/';
    ckptio__free(bucket);
    ckptio__free(key);
    if (!as_dir) {
        /* One GET of its first bytes, kept on the engine for the open that follows (ckptio__object_peek_first);
         * the probe itself always asks the server, never an earlier probe's answer. */
        unsigned char *head = ckptio__malloc((size_t)CKPTIO__PEEK_BYTES);
        if (!head) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory probing %s", path);
        source src = {.fd = -1, .engine = engine, .head = head};
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio__object_peek_forget(engine, path);
        ckptio_status st = ckptio__object_peek_first(engine, path, head, CKPTIO__PEEK_BYTES, &src.head_len, &src.size);
        if (st != CKPTIO_E_NOT_FOUND) ckptio__free(saved);
        if (st == CKPTIO_OK) st = probe_file(&src, src.size, path, out);
        if (src.object) {
            ckptio__error_saved *failed = st != CKPTIO_OK ? ckptio__error_save() : NULL;
            ckptio_file_close(src.object);
            if (failed) ckptio__error_restore(failed);
        }
        ckptio__free(head);
        if (st != CKPTIO_E_NOT_FOUND) return st;
        ckptio__error_restore(saved);
    }
    probe_listing p = {.found = SIZE_MAX};
    const ckptio_status st = ckptio__object_dir_list(engine, path, probe_entry, &p);
    if (st != CKPTIO_OK) /* the listing names the bucket only: say which prefix was asked for */
        return ckptio__fail(st, __FILE__, __LINE__,
                            &((ckptio__err_ctx){.operation = "open", .path = path, .file_offset = -1,
                                                .verbatim = true}),
                            "%s: %s", path, ckptio_last_error_message());
    if (!p.any && !bucket_only)
        return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.operation = "open", .path = path,
                                                                      .file_offset = -1}),
                               "no object of that key and nothing under it as a prefix");
    *out = p.found == SIZE_MAX ? CKPTIO_FORMAT_DIRECTORY : dir_probes[p.found].format;
    return CKPTIO_OK;
}

ckptio_status ckptio_format_detect_engine(ckptio_engine *engine, const char *path, ckptio_format *out) {
    CKPTIO_RETURN_IF(!path || !out, CKPTIO_E_INVAL, "ckptio_format_detect_engine: path and out are required");
    *out = CKPTIO_FORMAT_UNKNOWN;
    if (!engine || !ckptio__s3_is_url(path)) return ckptio_format_detect(path, out);
    return probe_object(engine, path, out);
}

/* Objects need an engine for the S3 settings (CKPTIO_S3_* from the environment): a temporary one. */
static ckptio_status detect_object(const char *path, ckptio_format *out) {
    ckptio_engine *engine = NULL;
    CKPTIO_FORWARD(ckptio_engine_create(&engine));
    const ckptio_status st = probe_object(engine, path, out);
    ckptio__error_saved *saved = st != CKPTIO_OK ? ckptio__error_save() : NULL;
    ckptio_engine_destroy(engine);
    if (saved) ckptio__error_restore(saved);
    return st;
}

ckptio_status ckptio_format_detect(const char *path, ckptio_format *out) {
    CKPTIO_RETURN_IF(!path || !out, CKPTIO_E_INVAL, "ckptio_format_detect: path and out are required");
    *out = CKPTIO_FORMAT_UNKNOWN;
    if (ckptio__s3_is_url(path)) return detect_object(path, out);
    struct stat sb;
    const int pfd = ckptio__open_path(AT_FDCWD, path, 0, &sb);
    if (pfd < 0) return CKPTIO_FAIL_SYS(errno, "open", path, -1, "cannot open the checkpoint");
    ckptio_status st = CKPTIO_OK;
    if (S_ISDIR(sb.st_mode)) {
        *out = probe_directory(pfd);
    } else if (S_ISREG(sb.st_mode)) {
        const int fd = ckptio__reopen_regular(pfd, AT_FDCWD, path, O_RDONLY, &sb);
        if (fd < 0) {
            st = CKPTIO_FAIL_SYS(errno, "open", path, -1, "cannot open the checkpoint");
        } else {
            st = probe_file(&((source){.fd = fd}), (uint64_t)sb.st_size, path, out);
            close(fd);
        }
    } else {
        st = CKPTIO_FAIL_CTX(CKPTIO_E_UNSUPPORTED, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                             "is %s, not a regular file or a directory: refused without opening it",
                             ckptio__file_type_name(sb.st_mode));
    }
    close(pfd);
    return st;
}
