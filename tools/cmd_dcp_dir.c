/*
 * cmd_dcp_dir.c - `ckptio inspect DIR` and `ckptio verify DIR` for
 * torch.distributed.checkpoint directories (ckptio_dcp_* of the library).
 *
 * inspect lists tensors (dtype, global shape, chunks, bytes), byte items,
 * data files and whether a ckptio manifest is there; --json has the schema
 * of docs/CLI.md. verify checks every item against the manifest; without
 * one (a checkpoint torch wrote) it falls back to the structural check and
 * says so in the result line.
 */
#include "cli_dcp.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *dtype_label(ckptio_dtype dtype) {
    const char *name = ckptio_dtype_name(dtype);
    if (name != NULL && name[0] != '\0') return name;
    name = ckptio_dtype_torch_name(dtype);
    return name != NULL ? name : "?";
}

static uint64_t file_size(ckptio_engine *engine, const char *dir, const char *name) {
    char path[4096];
    return cli_join(dir, name, path, sizeof path) ? cli_file_size(engine, path) : 0;
}

/* ---- text ------------------------------------------------------------------------- */

static int print_text(ckptio_engine *engine, ckptio_dcp *h, const char *dir) {
    size_t nt = 0, nb = 0, nf = 0;
    const char *manifest = NULL;
    char a[32], b[64];
    ckptio_dcp_tensor_count(h, &nt);
    ckptio_dcp_bytes_count(h, &nb);
    ckptio_dcp_file_count(h, &nf);
    const bool has_manifest = ckptio_dcp_manifest(h, &manifest) == CKPTIO_OK;
    printf("directory: %s\n", cli_q(dir));
    printf("format:    torch.distributed.checkpoint\n");
    printf("manifest:  %s\n",
           has_manifest ? cli_q(manifest) : "none (no ckptio checksums: written by torch or without them)");
    uint64_t data_bytes = 0;
    printf("files:     %zu\n", nf);
    for (size_t i = 0; i < nf; i++) {
        const char *name = NULL;
        ckptio_dcp_file(h, i, &name);
        const uint64_t size = file_size(engine, dir, name);
        data_bytes += size;
        printf("  %s  %s\n", cli_q(name), cli_format_bytes(size, a, sizeof a));
    }
    static const char *const theaders[] = {"name", "dtype", "shape", "chunks", "size"};
    cli_table table;
    cli_table_init(&table, 5, theaders, "lllrr");
    uint64_t all = 0;
    int rc = CLI_EXIT_OK;
    for (size_t i = 0; i < nt && rc == CLI_EXIT_OK; i++) {
        ckptio_dcp_tensor_info ti;
        ckptio_dcp_tensor(h, i, &ti);
        char shape[256], chunks[32], size[32];
        cli_format_shape(ti.shape, ti.ndim, shape, sizeof shape);
        snprintf(chunks, sizeof chunks, "%zu", ti.chunks);
        cli_format_bytes(ti.nbytes, size, sizeof size);
        all += ti.nbytes;
        const char *cells[] = {ti.fqn, dtype_label(ti.dtype), shape, chunks, size};
        if (cli_table_add(&table, cells) != 0) rc = (cli_error("out of memory"), CLI_EXIT_FAIL);
    }
    printf("\ntensors: %zu\n", nt);
    if (nt > 0 && rc == CLI_EXIT_OK) cli_table_print(&table, stdout, "  ");
    cli_table_cleanup(&table);
    if (rc != CLI_EXIT_OK) return rc;
    static const char *const bheaders[] = {"name", "file", "offset", "size", "transform"};
    cli_table_init(&table, 5, bheaders, "llrrl");
    for (size_t j = 0; j < nb && rc == CLI_EXIT_OK; j++) {
        ckptio_dcp_bytes_info bi;
        ckptio_dcp_bytes(h, j, &bi);
        char off[32], size[32];
        snprintf(off, sizeof off, "%llu", (unsigned long long)bi.stored.offset);
        cli_format_bytes(bi.stored.length, size, sizeof size);
        const char *cells[] = {bi.fqn, bi.stored.file, off, size,
                               (bi.stored.transforms & CKPTIO_DCP_TRANSFORM_ZSTD) ? "stream.zstd/1" : "-"};
        if (cli_table_add(&table, cells) != 0) rc = (cli_error("out of memory"), CLI_EXIT_FAIL);
    }
    printf("\nbyte items (non-tensor values): %zu\n", nb);
    if (nb > 0 && rc == CLI_EXIT_OK) cli_table_print(&table, stdout, "  ");
    cli_table_cleanup(&table);
    snprintf(b, sizeof b, "%s", cli_format_bytes(data_bytes, a, sizeof a));
    printf("\ntotal: %zu tensor%s, %s (%llu bytes) of tensor data; data files %s\n", nt, nt == 1 ? "" : "s",
           cli_format_bytes(all, a, sizeof a), (unsigned long long)all, b);
    return rc;
}

/* ---- JSON ------------------------------------------------------------------------- */

static void set(json_t *obj, const char *key, json_t *value, bool *oom) {
    if (value == NULL || json_object_set_new(obj, key, value) != 0) *oom = true;
}

static void append(json_t *arr, json_t *value, bool *oom) {
    if (value == NULL || json_array_append_new(arr, value) != 0) *oom = true;
}

static json_t *int_array(const int64_t *v, uint32_t n, bool *oom) {
    json_t *arr = json_array();
    for (uint32_t d = 0; arr != NULL && d < n; d++) append(arr, json_integer((json_int_t)v[d]), oom);
    return arr;
}

static void add_stored(json_t *o, const ckptio_dcp_stored *s, bool *oom) {
    set(o, "file", json_string(s->file), oom);
    set(o, "offset", json_integer((json_int_t)s->offset), oom);
    set(o, "length", json_integer((json_int_t)s->length), oom);
    json_t *tr = json_array();
    if (tr && (s->transforms & CKPTIO_DCP_TRANSFORM_ZSTD)) append(tr, json_string("stream.zstd/1"), oom);
    set(o, "transforms", tr, oom);
}

static json_t *build_json(ckptio_engine *engine, ckptio_dcp *h, const char *dir, bool *oom) {
    size_t nt = 0, nb = 0, nf = 0;
    const char *manifest = NULL;
    ckptio_dcp_tensor_count(h, &nt);
    ckptio_dcp_bytes_count(h, &nb);
    ckptio_dcp_file_count(h, &nf);
    json_t *root = json_object();
    if (!root) return *oom = true, NULL;
    set(root, "directory", json_string(dir), oom);
    set(root, "format", json_string("dcp"), oom);
    set(root, "manifest", ckptio_dcp_manifest(h, &manifest) == CKPTIO_OK ? json_string(manifest) : json_null(), oom);
    json_t *files = json_array();
    for (size_t i = 0; files && i < nf; i++) {
        const char *name = NULL;
        ckptio_dcp_file(h, i, &name);
        json_t *o = json_object();
        if (o) {
            set(o, "name", json_string(name), oom);
            set(o, "size", json_integer((json_int_t)file_size(engine, dir, name)), oom);
        }
        append(files, o, oom);
    }
    set(root, "files", files, oom);
    uint64_t all = 0;
    json_t *tensors = json_array();
    for (size_t i = 0; tensors && i < nt; i++) {
        ckptio_dcp_tensor_info ti;
        ckptio_dcp_tensor(h, i, &ti);
        all += ti.nbytes;
        json_t *o = json_object();
        if (!o) {
            *oom = true;
            break;
        }
        set(o, "name", json_string(ti.fqn), oom);
        set(o, "dtype", json_string(dtype_label(ti.dtype)), oom);
        const char *torch = ckptio_dtype_torch_name(ti.dtype);
        set(o, "torch_dtype", torch ? json_string(torch) : json_null(), oom);
        set(o, "shape", int_array(ti.shape, ti.ndim, oom), oom);
        set(o, "nbytes", json_integer((json_int_t)ti.nbytes), oom);
        json_t *chunks = json_array();
        for (size_t c = 0; chunks && c < ti.chunks; c++) {
            ckptio_dcp_chunk_info ci;
            ckptio_dcp_chunk(h, i, c, &ci);
            json_t *co = json_object();
            if (co) {
                set(co, "offsets", int_array(ci.offsets, ti.ndim, oom), oom);
                set(co, "sizes", int_array(ci.sizes, ti.ndim, oom), oom);
                add_stored(co, &ci.stored, oom);
            }
            append(chunks, co, oom);
        }
        set(o, "chunks", chunks, oom);
        append(tensors, o, oom);
    }
    set(root, "tensors", tensors, oom);
    json_t *bytes = json_array();
    for (size_t j = 0; bytes && j < nb; j++) {
        ckptio_dcp_bytes_info bi;
        ckptio_dcp_bytes(h, j, &bi);
        json_t *o = json_object();
        if (o) {
            set(o, "name", json_string(bi.fqn), oom);
            add_stored(o, &bi.stored, oom);
        }
        append(bytes, o, oom);
    }
    set(root, "byte_items", bytes, oom);
    json_t *tot = json_object();
    if (tot) {
        set(tot, "tensors", json_integer((json_int_t)nt), oom);
        set(tot, "nbytes", json_integer((json_int_t)all), oom);
        set(tot, "byte_items", json_integer((json_int_t)nb), oom);
    }
    set(root, "totals", tot, oom);
    return root;
}

int cli_dcp_inspect(ckptio_engine *engine, const char *dir, bool json) {
    ckptio_dcp *h = NULL;
    ckptio_status st = ckptio_dcp_open(engine, dir, &h);
    if (st != CKPTIO_OK) return cli_error_lib(dir, st);
    int rc = CLI_EXIT_FAIL;
    if (!json) {
        rc = print_text(engine, h, dir);
    } else {
        bool oom = false;
        json_t *root = build_json(engine, h, dir, &oom);
        char *text = (root && !oom) ? json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
        json_decref(root);
        if (!text) {
            cli_error("out of memory building the JSON output");
        } else {
            puts(text);
            free(text);
            rc = CLI_EXIT_OK;
        }
    }
    ckptio_dcp_close(h);
    return rc;
}

/* ---- verify ------------------------------------------------------------------------ */

/* How the chunks cover the tensors: a save of one process may hold some in part (its own shards, which torch
 * loads back), a save of several ranks must tile every one (ckptio_dcp_check). */
static const char *describe_coverage(const ckptio_dcp_verify_report *r, char *buf, size_t cap) {
    if (!r->partial) return "chunks tile every tensor";
    snprintf(buf, cap, "%zu tensor%s saved in part (one process's own chunks), the others tiled", r->partial,
             r->partial == 1 ? "" : "s");
    return buf;
}

int cli_dcp_verify(ckptio_engine *engine, const char *dir, bool quiet) {
    ckptio_dcp *h = NULL;
    ckptio_status st = ckptio_dcp_open(engine, dir, &h);
    if (st != CKPTIO_OK) return cli_error_lib(dir, st);
    size_t nt = 0, nb = 0;
    ckptio_dcp_tensor_count(h, &nt);
    ckptio_dcp_bytes_count(h, &nb);
    const char *manifest = NULL;
    ckptio_dcp_verify_report r;
    char size[32];
    int rc = CLI_EXIT_OK;
    char coverage[128];
    /* One rule with ckptio.dcp.verify: checksums when there is a manifest, else the structure. */
    if ((st = ckptio_dcp_validate(h, &r, &manifest)) != CKPTIO_OK) {
        rc = cli_error_lib(dir, st);
    } else if (manifest) {
        if (!quiet)
            printf("%s: ok (DCP, %zu tensor%s, %zu byte item%s; %zu of %zu items matched their XXH3-64 in %s, "
                   "%zu without a checksum; %s; %s read)\n",
                   cli_q(dir), nt, nt == 1 ? "" : "s", nb, nb == 1 ? "" : "s", r.checked, r.items, cli_q(manifest),
                   r.unhashed, describe_coverage(&r, coverage, sizeof coverage),
                   cli_format_bytes(r.bytes, size, sizeof size));
    } else {
        /* No manifest (torch wrote it): what can be checked without checksums. */
        if (!quiet)
            printf("%s: ok (DCP, %zu tensor%s, %zu byte item%s; no ckptio manifest, so no checksums: structure "
                   "checked instead, %zu items parsed, %s; %s read)\n",
                   cli_q(dir), nt, nt == 1 ? "" : "s", nb, nb == 1 ? "" : "s", r.checked,
                   describe_coverage(&r, coverage, sizeof coverage), cli_format_bytes(r.bytes, size, sizeof size));
    }
    ckptio_dcp_close(h);
    return rc;
}
