/*
 * cli_view.c - one view of a checkpoint file for inspect and verify,
 * whatever its format: the tensor list, metadata and data section.
 *
 * A new format (torch.save zip, ...) adds one opener here; the commands
 * stay the same.
 */
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

ckptio_engine *cli_engine_create(void) {
    ckptio_engine *engine = NULL;
    ckptio_status st = ckptio_engine_create(&engine);
    if (st != CKPTIO_OK) {
        cli_error_lib(NULL, st);
        return NULL;
    }
    return engine;
}

static int open_safetensors(ckptio_engine *engine, cli_view *view) {
    ckptio_status st = ckptio_safetensors_open(engine, view->path, &view->st);
    if (st != CKPTIO_OK) return cli_error_lib(view->path, st), -1;
    if ((st = ckptio_safetensors_count(view->st, &view->count)) != CKPTIO_OK ||
        (st = ckptio_safetensors_metadata_count(view->st, &view->metadata_count)) != CKPTIO_OK ||
        (st = ckptio_safetensors_data_offset(view->st, &view->data_offset)) != CKPTIO_OK)
        return cli_error_lib(view->path, st), -1;

    view->tensors = calloc(view->count ? view->count : 1, sizeof *view->tensors);
    view->metadata = calloc(view->metadata_count ? view->metadata_count : 1, sizeof *view->metadata);
    if (view->tensors == NULL || view->metadata == NULL) return cli_error("out of memory"), -1;
    for (size_t i = 0; i < view->count; i++)
        if ((st = ckptio_safetensors_tensor(view->st, i, &view->tensors[i])) != CKPTIO_OK)
            return cli_error_lib(view->path, st), -1;
    for (size_t i = 0; i < view->metadata_count; i++)
        if ((st = ckptio_safetensors_metadata(view->st, i, &view->metadata[i])) != CKPTIO_OK)
            return cli_error_lib(view->path, st), -1;
    view->format = "safetensors";
    return 0;
}

/* torch.save: one entry per tensor path; data_offset is 0 (storages are
 * separate records, each at its own offset). */
static int open_torch(ckptio_engine *engine, cli_view *view) {
    ckptio_status st = ckptio_torch_open(engine, view->path, &view->torch);
    if (st != CKPTIO_OK) return cli_error_lib(view->path, st), -1;
    if ((st = ckptio_torch_count(view->torch, &view->count)) != CKPTIO_OK) return cli_error_lib(view->path, st), -1;
    view->tensors = calloc(view->count ? view->count : 1, sizeof *view->tensors);
    if (view->tensors == NULL) return cli_error("out of memory"), -1;
    for (size_t i = 0; i < view->count; i++) {
        ckptio_torch_tensor_info ti;
        if ((st = ckptio_torch_tensor(view->torch, i, &ti)) != CKPTIO_OK) return cli_error_lib(view->path, st), -1;
        view->tensors[i] = (ckptio_tensor_info){.name = ti.name, .dtype = ti.dtype, .ndim = ti.ndim,
                                                .shape = ti.shape, .file_offset = ti.file_offset, .nbytes = ti.nbytes};
    }
    view->format = "torch.save";
    return 0;
}

bool cli_is_object(const char *path) { return strncmp(path, "s3://", 5) == 0; }

bool cli_is_dir(const char *path) {
    if (cli_is_object(path)) {
        ckptio_format format;
        if (ckptio_format_detect(path, &format) != CKPTIO_OK) return false;
        const size_t n = strlen(path);
        return format == CKPTIO_FORMAT_DCP || format == CKPTIO_FORMAT_DIRECTORY ||
               (format == CKPTIO_FORMAT_HF_INDEX && !(n > 5 && strcmp(path + n - 5, ".json") == 0));
    }
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

uint64_t cli_file_size(ckptio_engine *engine, const char *path) {
    if (!cli_is_object(path)) {
        struct stat sb;
        return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    }
    ckptio_file *f = NULL;
    uint64_t size = 0;
    if (ckptio_file_open(engine, path, CKPTIO_OPEN_READ, &f) == CKPTIO_OK && ckptio_file_size(f, &size) != CKPTIO_OK)
        size = 0;
    ckptio_file_close(f);
    return size;
}

bool cli_join(const char *dir, const char *name, char *out, size_t cap) {
    const size_t n = strlen(dir);
    const char *sep = n && dir[n - 1] == '/' ? "" : "/";
    const int k = snprintf(out, cap, "%s%s%s", dir, sep, name);
    return k >= 0 && (size_t)k < cap;
}

int cli_detect(ckptio_engine *engine, const char *path, ckptio_format *format) {
    const ckptio_status st = ckptio_format_detect_engine(engine, path, format);
    if (st == CKPTIO_OK) return 0;
    const ckptio_error_info *e = ckptio_last_error();
    if (e->sys_errno != 0)
        cli_error("%s: cannot %s: %s", path, strcmp(e->operation, "open") == 0 ? "open" : "read",
                  strerror(e->sys_errno));
    else
        cli_error_lib(path, st);
    return -1;
}

int cli_refuse_format(const char *path, ckptio_format format) {
    struct stat sb = {0};
    const bool object = cli_is_object(path);
    const bool dir = object ? format == CKPTIO_FORMAT_DIRECTORY || format == CKPTIO_FORMAT_DCP
                            : stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (object && !dir) {
        ckptio_engine *engine = NULL;
        if (ckptio_engine_create(&engine) == CKPTIO_OK) sb.st_size = (off_t)cli_file_size(engine, path);
        ckptio_engine_destroy(engine);
    }
    if (dir) cli_error("%s: is a directory, not a checkpoint file", path);
    else if (format == CKPTIO_FORMAT_HF_INDEX) cli_error("%s: is a Hugging Face index, not a checkpoint file", path);
    else
        cli_error("%s: not a checkpoint ckptio can read: neither a safetensors file nor a torch.save archive "
                  "(%llu bytes)", path, (unsigned long long)sb.st_size);
    return CLI_EXIT_FAIL;
}

int cli_view_open(ckptio_engine *engine, const char *path, ckptio_format format, cli_view *view) {
    memset(view, 0, sizeof *view);
    view->path = path;
    struct stat sb;
    if (cli_is_object(path)) sb.st_size = (off_t)cli_file_size(engine, path);
    else if (stat(path, &sb) != 0) return cli_error("%s: cannot open: %s", path, strerror(errno)), -1;
    view->file_size = (uint64_t)sb.st_size;
    int rc;
    switch (format) {
    case CKPTIO_FORMAT_SAFETENSORS: rc = open_safetensors(engine, view); break;
    /* A legacy file too: the torch reader explains why it refuses it. */
    case CKPTIO_FORMAT_TORCH:
    case CKPTIO_FORMAT_TORCH_LEGACY: rc = open_torch(engine, view); break;
    default: return cli_refuse_format(path, format), -1;
    }
    if (rc != 0) cli_view_close(view);
    return rc;
}

void cli_view_close(cli_view *view) {
    free(view->tensors);
    free(view->metadata);
    ckptio_safetensors_close(view->st);
    ckptio_torch_close(view->torch);
    const char *path = view->path;
    memset(view, 0, sizeof *view);
    view->path = path;
}

/* Executes the extents gathered in `*plan` and starts a new plan. */
static int flush_window(ckptio_engine *engine, const cli_view *view, ckptio_plan **plan) {
    ckptio_status st = ckptio_engine_execute(engine, *plan);
    ckptio_plan_destroy(*plan);
    *plan = NULL;
    if (st == CKPTIO_OK) st = ckptio_plan_create(CKPTIO_READ, plan);
    return st == CKPTIO_OK ? 0 : (cli_error_lib(view->path, st), -1);
}

int cli_view_read_all(ckptio_engine *engine, const cli_view *view, uint64_t window) {
    int rc = -1;
    ckptio_status st = CKPTIO_OK;
    ckptio_file *file = NULL;
    ckptio_plan *plan = NULL;
    void *buf = NULL;
    uint64_t total = 0, done = 0, used = 0;
    cli_progress progress;
    cli_progress_init(&progress, view->path);

    for (size_t i = 0; i < view->count; i++) total += view->tensors[i].nbytes;
    /* A small file needs no more memory than its data (in whole 4 KiB pages). */
    if (total < window) window = total < 4096 ? 4096 : (total + 4095) / 4096 * 4096;
    /* 4 KiB-aligned host memory lets the engine use O_DIRECT straight into it. */
    if (posix_memalign(&buf, 4096, (size_t)window) != 0) {
        buf = NULL;
        cli_error("out of memory (%llu bytes for the read window)", (unsigned long long)window);
        goto out;
    }
    if ((st = ckptio_file_open(engine, view->path, CKPTIO_OPEN_READ, &file)) != CKPTIO_OK ||
        (st = ckptio_plan_create(CKPTIO_READ, &plan)) != CKPTIO_OK) {
        cli_error_lib(view->path, st);
        goto out;
    }
    /* Tensors are packed into the window one after another; a tensor larger
     * than what is left is split at the window's end. Each full window is
     * one plan, executed in parallel by the engine. */
    for (size_t i = 0; i < view->count; i++) {
        const ckptio_tensor_info *t = &view->tensors[i];
        for (uint64_t off = 0; off < t->nbytes;) {
            uint64_t n = t->nbytes - off;
            if (n > window - used) n = window - used;
            ckptio_extent ext = {file, t->file_offset + off, n, (char *)buf + used, CKPTIO_MEM_HOST};
            if ((st = ckptio_plan_add(plan, &ext)) != CKPTIO_OK) {
                cli_error_lib(view->path, st);
                goto out;
            }
            used += n;
            off += n;
            if (used < window) continue;
            if (flush_window(engine, view, &plan) != 0) goto out;
            done += used;
            used = 0;
            cli_progress_update(&progress, done, total);
            if (cli_interrupted) {
                cli_error("interrupted");
                goto out;
            }
        }
    }
    if (used > 0 && flush_window(engine, view, &plan) != 0) goto out;
    rc = 0;
out:
    cli_progress_finish(&progress, rc == 0);
    ckptio_plan_destroy(plan);
    ckptio_file_close(file);
    free(buf);
    return rc;
}
