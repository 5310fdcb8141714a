/*
 * steps_pin.c - a reader's pin on a step: retention never removes a step
 * while it is read, and a reader never blocks a save.
 *
 * The pin is a shared flock on the step's commit marker. Every removal
 * asks for that lock exclusively (without waiting) before it unlinks the
 * marker, and leaves a pinned step whole: retention keeps it until a later
 * commit. The root's lock is not involved, so a reader (an evaluation job
 * beside the training job) never holds up a save, and a save never holds
 * up a reader. A pin taken on a marker that a removal already holds, or
 * that was unlinked while the pin was being taken, is refused
 * (CKPTIO_E_NOT_FOUND): the reader picks another step.
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"
#include "steps_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static ckptio_status gone(const char *path, uint64_t step, const char *why);

struct ckptio_step_pin {
    int fd;
    ckptio__dcp_lease *object_pin; /* a step in object storage: its pin object, renewed (fd -1) */
};

/* A step in object storage: the pin is an object of its own in the step
 * (renewed while held); removal, which deletes the marker first, leaves a
 * step with a live pin alone. A pin taken while a removal deletes the
 * marker finds the marker gone afterwards and is given back. */
static ckptio_status pin_object(const char *root, uint64_t step, const char *dir, const char *marker,
                                ckptio_step_pin **out) {
    ckptio_engine *io, *owned;
    CKPTIO_FORWARD(ckptio__steps_engine(NULL, root, &io, &owned));
    ckptio__path_kind kind = CKPTIO__PATH_MISSING;
    ckptio__dcp_lease *held = NULL;
    ckptio_status st = ckptio__object_stat(io, marker, &kind, NULL);
    if (st == CKPTIO_OK && kind != CKPTIO__PATH_FILE) st = gone(marker, step, "no commit marker");
    if (st == CKPTIO_OK) st = ckptio__dcp_pin_take(io, dir, &held);
    if (st == CKPTIO_OK && (st = ckptio__object_stat(io, marker, &kind, NULL)) == CKPTIO_OK &&
        kind != CKPTIO__PATH_FILE)
        st = gone(marker, step, "its commit marker was removed meanwhile");
    ckptio_step_pin *pin = st == CKPTIO_OK ? ckptio__calloc(1, sizeof *pin) : NULL;
    if (st == CKPTIO_OK && !pin) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st != CKPTIO_OK) {
        ckptio__error_saved *saved = ckptio__error_save();
        ckptio__dcp_lease_release(held);
        ckptio__error_restore(saved);
    } else {
        pin->fd = -1;
        pin->object_pin = held;
        *out = pin;
    }
    ckptio__steps_engine_done(owned);
    return st;
}

static ckptio_status gone(const char *path, uint64_t step, const char *why) {
    return CKPTIO_FAIL_CTX(CKPTIO_E_NOT_FOUND, &((ckptio__err_ctx){.path = path, .file_offset = -1}),
                           "step %llu cannot be pinned: %s", (unsigned long long)step, why);
}

ckptio_status ckptio_steps_pin(const char *root, uint64_t step, ckptio_step_pin **out) {
    CKPTIO_RETURN_IF(!root || !*root || !out, CKPTIO_E_INVAL, "ckptio_steps_pin: root and out are required");
    *out = NULL;
    char *dir = ckptio__step_dir(root, step);
    if (!dir) return ckptio_last_error()->status;
    char *path = ckptio__dcp_join(dir, CKPTIO_STEP_MARKER);
    if (path && ckptio__s3_is_url(root)) {
        const ckptio_status st = pin_object(root, step, dir, path, out);
        ckptio__free(dir);
        ckptio__free(path);
        return st;
    }
    ckptio__free(dir);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    ckptio_status st = CKPTIO_OK;
    struct stat held, named;
    mode_t type = 0;
    /* The checked open (open_regular.c): a FIFO or device planted under the
     * marker's name is refused without being opened. */
    const int fd = ckptio__open_regular(AT_FDCWD, path, O_RDONLY | O_NOFOLLOW, &held, &type);
    int ret = 0;
    if (fd < 0) {
        char why[96];
        snprintf(why, sizeof why, "the commit marker is %s, not a regular file", ckptio__file_type_name(type));
        st = errno == ENOENT || S_ISLNK(type) ? gone(path, step, "no commit marker")
             : type                           ? gone(path, step, why)
                                              : CKPTIO_FAIL_SYS_NOTE(errno, "open", path, "pinning step %llu",
                                                                     (unsigned long long)step);
    } else {
        do ret = flock(fd, LOCK_SH | LOCK_NB);
        while (ret < 0 && errno == EINTR && !ckptio__interrupt_requested());
        /* Without flock support the pin holds nothing: the reader copes with the step going away. */
        if (ret < 0 && errno == EWOULDBLOCK) st = gone(path, step, "a removal holds it");
        else if (ret < 0 && errno == EINTR) /* the program asked to stop: CKPTIO_E_CANCELED */
            st = CKPTIO_FAIL_SYS_NOTE(EINTR, "flock", path, "pinning step %llu", (unsigned long long)step);
        else if (lstat(path, &named) != 0 || named.st_dev != held.st_dev || named.st_ino != held.st_ino)
            st = gone(path, step, "its commit marker was removed meanwhile");
    }
    ckptio_step_pin *pin = st == CKPTIO_OK ? ckptio__calloc(1, sizeof *pin) : NULL;
    if (st == CKPTIO_OK && !pin) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    if (st == CKPTIO_OK) {
        pin->fd = fd;
        *out = pin;
    } else if (fd >= 0) {
        close(fd);
    }
    ckptio__free(path);
    return st;
}

void ckptio_steps_unpin(ckptio_step_pin *pin) {
    if (!pin) return;
    if (pin->object_pin) {
        ckptio__dcp_lease_release(pin->object_pin);
        ckptio__free(pin);
        return;
    }
    /* LOCK_UN first: a forked child sharing the descriptor must not keep
     * the step pinned after its reader let go. */
    flock(pin->fd, LOCK_UN);
    close(pin->fd);
    ckptio__free(pin);
}
