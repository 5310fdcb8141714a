/*
 * steps_marker.c - the commit marker of a step directory and the commit
 * that writes it.
 *
 * The marker is the one atomic act that makes a step COMPLETE: it is
 * written after the DCP save committed every data file and .metadata, with
 * the step directory and the root fsynced first, so that once the marker's
 * rename is durable everything it vouches for is too. It records the step
 * number (a directory copied or renamed to another step's name is not that
 * step) and .metadata's size and XXH3-64 (a .metadata replaced or damaged
 * after the commit is caught without reading any data). The marker is
 * written by the DCP commit's own atomic small-file writer
 * (ckptio__dcp_write_file): there is one copy of that protocol.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"
#include "steps_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define MARKER_MAGIC "ckptio-step 1\n"

/* ---- the marker's text ---------------------------------------------------------- */

size_t ckptio__step_marker_format(const ckptio__step_marker *m, char *out, size_t cap) {
    const int n = snprintf(out, cap, MARKER_MAGIC "step %llu\nmetadata %llu %016llx\n", (unsigned long long)m->step,
                           (unsigned long long)m->metadata_size, (unsigned long long)m->metadata_xxh3);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* A decimal number at *p (no sign, no leading zero unless it is "0",
 * at most 19 digits so it cannot overflow), advancing *p. */
static bool decimal(const char **p, const char *end, uint64_t *out) {
    const char *s = *p;
    uint64_t v = 0;
    size_t digits = 0;
    while (s < end && *s >= '0' && *s <= '9' && digits < 20) {
        v = v * 10 + (uint64_t)(*s - '0');
        s++;
        digits++;
    }
    if (digits == 0 || digits > 19 || (digits > 1 && **p == '0')) return false;
    *p = s;
    *out = v;
    return true;
}

static bool hex16(const char **p, const char *end, uint64_t *out) {
    if (end - *p < 16) return false;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        const char c = (*p)[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        v = v << 4 | (uint64_t)d;
    }
    *p += 16;
    *out = v;
    return true;
}

static bool literal(const char **p, const char *end, const char *text) {
    const size_t n = strlen(text);
    if ((size_t)(end - *p) < n || memcmp(*p, text, n) != 0) return false;
    *p += n;
    return true;
}

#define MARKER_FAIL(line_, ...)                                                                             \
    CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,                                                                        \
                    &((ckptio__err_ctx){.operation = "parse step marker", .path = origin, .file_offset = -1, \
                                        .subject = (line_)}),                                               \
                    __VA_ARGS__)

ckptio_status ckptio__step_marker_parse(const char *bytes, size_t len, const char *origin, ckptio__step_marker *out) {
    CKPTIO_RETURN_IF(!out || (!bytes && len), CKPTIO_E_INVAL, "ckptio__step_marker_parse: bytes and out are required");
    memset(out, 0, sizeof *out);
    if (!origin) origin = "step marker";
    if (len > CKPTIO__STEP_MARKER_MAX) return MARKER_FAIL(NULL, "%zu bytes is too large for a step marker", len);
    const char *p = bytes, *end = bytes + len;
    ckptio__step_marker m = {0};
    if (!literal(&p, end, MARKER_MAGIC)) return MARKER_FAIL("line 1", "expected 'ckptio-step 1'");
    if (!literal(&p, end, "step ") || !decimal(&p, end, &m.step) || !literal(&p, end, "\n"))
        return MARKER_FAIL("line 2", "expected 'step N' (a decimal number)");
    if (m.step > CKPTIO_STEP_MAX)
        return MARKER_FAIL("line 2", "step %llu is larger than %llu", (unsigned long long)m.step, CKPTIO_STEP_MAX);
    if (!literal(&p, end, "metadata ") || !decimal(&p, end, &m.metadata_size) || !literal(&p, end, " ") ||
        !hex16(&p, end, &m.metadata_xxh3) || !literal(&p, end, "\n"))
        return MARKER_FAIL("line 3", "expected 'metadata SIZE XXH3' (decimal, 16 lowercase hex digits)");
    if (p != end) return MARKER_FAIL("line 4", "%zu unexpected bytes after the last line", (size_t)(end - p));
    *out = m;
    return CKPTIO_OK;
}

/* ---- names, errors ---------------------------------------------------------------- */

ckptio_status ckptio_steps_dir_name(uint64_t step, char *out, size_t cap) {
    CKPTIO_RETURN_IF(!out, CKPTIO_E_INVAL, "ckptio_steps_dir_name: out is required");
    CKPTIO_RETURN_IF(step > CKPTIO_STEP_MAX, CKPTIO_E_RANGE, "step %llu is larger than %llu",
                     (unsigned long long)step, CKPTIO_STEP_MAX);
    const int n = snprintf(out, cap, "step_%08llu", (unsigned long long)step);
    CKPTIO_RETURN_IF(n < 0 || (size_t)n >= cap, CKPTIO_E_RANGE, "ckptio_steps_dir_name: %zu bytes is too small", cap);
    return CKPTIO_OK;
}

bool ckptio__step_from_name(const char *name, uint64_t *step) {
    if (strncmp(name, "step_", 5) != 0) return false;
    const char *p = name + 5, *end = p + strlen(p);
    uint64_t v = 0;
    if (end - p < 8 || end - p > 18) return false;
    for (const char *s = p; s < end; s++) {
        if (*s < '0' || *s > '9') return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    /* Only the canonical spelling: "step_00000100", not "step_000000100". */
    char canon[32];
    if (v > CKPTIO_STEP_MAX || ckptio_steps_dir_name(v, canon, sizeof canon) != CKPTIO_OK || strcmp(canon, name) != 0)
        return false;
    *step = v;
    return true;
}

bool ckptio__step_own_name(const char *name) {
    return !strcmp(name, CKPTIO_STEP_MARKER) || !strcmp(name, CKPTIO_STEP_BEGUN) ||
           !strcmp(name, CKPTIO_DCP_LOCK_NAME) || ckptio__dcp_metadata_name(name) || ckptio__dcp_stale_name(name);
}

char *ckptio__step_dir(const char *root, uint64_t step) {
    char name[32];
    if (ckptio_steps_dir_name(step, name, sizeof name) != CKPTIO_OK) return NULL;
    char *dir = ckptio__dcp_join(root, name);
    if (!dir) CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    return dir;
}

ckptio_status ckptio__step_fail(const char *root, uint64_t step, const char *op) {
    const ckptio_error_info *e = ckptio_last_error();
    const ckptio_status status = e->status;
    const int err = e->sys_errno;
    char name[32] = "";
    ckptio_steps_dir_name(step, name, sizeof name);
    /* The old message is formatted before the record is overwritten. */
    return ckptio__fail(status, __FILE__, __LINE__,
                        &((ckptio__err_ctx){.operation = op, .path = root, .file_offset = -1, .sys_errno = err,
                                            .verbatim = true}),
                        "step %llu (%s/%s): %s: %s", (unsigned long long)step, root, name, op, e->message);
}

/* ---- the commit --------------------------------------------------------------------- */

ckptio_status ckptio__step_metadata_hash(const char *dir, uint64_t *size, uint64_t *hash) {
    char *path = ckptio__dcp_join(dir, ".metadata");
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    XXH3_state_t *state = XXH3_createState();
    char *buf = ckptio__malloc(1 << 16);
    int fd = -1;
    if (!state || !buf)
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    else
        st = ckptio__open_regular_or_fail(path, O_RDONLY | O_NOFOLLOW, CKPTIO_E_FORMAT, "reading the step's .metadata",
                                          &fd, NULL);
    if (st == CKPTIO_OK) {
        XXH3_64bits_reset(state);
        uint64_t total = 0;
        for (;;) {
            const ssize_t n = ckptio__read(fd, buf, 1 << 16);
            if (n < 0) {
                st = CKPTIO_FAIL_SYS_NOTE(errno, "read", path, "at offset %llu of the step's .metadata",
                                          (unsigned long long)total);
                break;
            }
            if (n == 0) break;
            XXH3_64bits_update(state, buf, (size_t)n);
            total += (uint64_t)n;
        }
        *size = total;
        *hash = XXH3_64bits_digest(state);
    }
    if (fd >= 0) close(fd);
    if (state) XXH3_freeState(state);
    ckptio__free(buf);
    ckptio__free(path);
    return st;
}

ckptio_status ckptio_steps_commit(const char *root, uint64_t step) {
    CKPTIO_RETURN_IF(!root || !*root, CKPTIO_E_INVAL, "ckptio_steps_commit: root is required");
    char *dir = ckptio__step_dir(root, step);
    if (!dir) return ckptio_last_error()->status;
    ckptio__step_marker m = {.step = step};
    char text[128];
    ckptio_engine *io, *owned;
    ckptio_status st = ckptio__steps_engine(NULL, root, &io, &owned);
    if (st == CKPTIO_OK && io) { /* objects: the marker is one PUT, durable when answered, after the data's */
        st = ckptio__step_object_metadata_hash(io, dir, &m.metadata_size, &m.metadata_xxh3);
        const size_t len = ckptio__step_marker_format(&m, text, sizeof text);
        if (st == CKPTIO_OK) st = ckptio__step_object_put(io, dir, CKPTIO_STEP_MARKER, text, len);
        ckptio__steps_engine_done(owned);
        ckptio__free(dir);
        return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "commit");
    }
    if (st == CKPTIO_OK) st = ckptio__step_metadata_hash(dir, &m.metadata_size, &m.metadata_xxh3);
    /* The step's files were fsynced by their save; their directory entries
     * and the step directory's own entry in ROOT become durable here, before
     * the marker that vouches for them. */
    int err = 0;
    if (st == CKPTIO_OK && (err = ckptio__dcp_fsync_dir(dir)) != 0)
        st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", dir, "flushing the step directory before its marker; the step is "
                                                     "not committed");
    if (st == CKPTIO_OK && (err = ckptio__dcp_fsync_dir(root)) != 0)
        st = CKPTIO_FAIL_SYS_NOTE(err, "fsync", root, "flushing the root before the step's marker; the step is not "
                                                      "committed");
    const size_t len = ckptio__step_marker_format(&m, text, sizeof text);
    if (st == CKPTIO_OK) st = ckptio__dcp_write_file(dir, CKPTIO_STEP_MARKER, text, len, ".metadata", CKPTIO_DCP_SYNC);
    ckptio__free(dir);
    return st == CKPTIO_OK ? st : ckptio__step_fail(root, step, "commit");
}
