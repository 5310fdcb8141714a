/*
 * dcp_manifest_verify.c - checking a DCP directory against the ckptio
 * manifest (.ckptio-manifest-<token>.json) that ckptio.dcp writes beside
 * .metadata: {"format": "ckptio-dcp-manifest", "version": 1, "files",
 * "items": [{fqn, offset, file, data_offset, nbytes, xxh3, transform,
 * parts?}]}. An item's hash is the XXH3-64 of file bytes
 * [data_offset, data_offset + nbytes); items saved from GPU memory carry
 * "parts" [[rel_offset, length, hex], ...] instead, each hashing its own
 * range. The manifest is untrusted input like .metadata: every field is
 * checked, and it must describe exactly the items .metadata names.
 */
#include "dcp_dir_internal.h"
#include "engine_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include "xxh3_fast.h"

/* Bytes hashed per read: bounded memory whatever the item size. */
#define HASH_PIECE ((uint64_t)64 << 20)
/* Largest manifest read (about 200 bytes per item). */
#define MANIFEST_MAX ((uint64_t)1 << 30)

#define MFAIL(origin_, subject_, ...)                                                                       \
    CKPTIO_FAIL_CTX(CKPTIO_E_FORMAT,                                                                        \
                    &((ckptio__err_ctx){.operation = "parse manifest", .path = (origin_), .file_offset = -1, \
                                        .subject = (subject_)}),                                            \
                    __VA_ARGS__)

/* ---- parsing ------------------------------------------------------------------------ */

static bool hex64(const json_t *v, uint64_t *out) {
    const char *s = json_string_value(v);
    if (!s || json_string_length(v) != 16) return false;
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return false;
        x = x << 4 | (uint64_t)d;
    }
    *out = x;
    return true;
}

static bool uint_field(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

void ckptio__dcp_manifest_free(ckptio__dcp_manifest *m) {
    if (!m) return;
    for (size_t i = 0; i < m->nfiles; i++) ckptio__free(m->files[i]);
    ckptio__free(m->files);
    for (size_t i = 0; i < m->count; i++) {
        ckptio__free(m->items[i].fqn);
        ckptio__free(m->items[i].offset);
        ckptio__free(m->items[i].file);
        ckptio__free(m->items[i].parts);
    }
    ckptio__free(m->items);
    memset(m, 0, sizeof *m);
}

static ckptio_status parse_item(const json_t *o, const ckptio__dcp_manifest *m, const char *origin, size_t i,
                                ckptio__dcp_mitem *it) {
    char subj[64];
    snprintf(subj, sizeof subj, "items[%zu]", i);
    if (!json_is_object(o)) return MFAIL(origin, subj, "not an object");
    const json_t *fqn = json_object_get(o, "fqn"), *file = json_object_get(o, "file");
    if (!json_is_string(fqn) || strlen(json_string_value(fqn)) != json_string_length(fqn))
        return MFAIL(origin, subj, "\"fqn\" is not a string");
    if (!json_is_string(file) || !ckptio__dcp_plain_name(json_string_value(file), json_string_length(file)))
        return MFAIL(origin, subj, "\"file\" is not a plain file name");
    size_t k = 0;
    while (k < m->nfiles && strcmp(m->files[k], json_string_value(file)) != 0) k++;
    if (k == m->nfiles) return MFAIL(origin, subj, "\"file\" '%s' is not listed in \"files\"", json_string_value(file));
    if (!(it->fqn = ckptio__strdup(json_string_value(fqn))) || !(it->file = ckptio__strdup(json_string_value(file))))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    const json_t *off = json_object_get(o, "offset");
    if (json_is_array(off)) {
        const size_t n = json_array_size(off);
        if (n > 64) return MFAIL(origin, subj, "\"offset\" has %zu entries", n);
        if (!(it->offset = ckptio__calloc(n + 1, sizeof *it->offset)))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        for (size_t d = 0; d < n; d++) {
            const json_t *x = json_array_get(off, d);
            if (!json_is_integer(x)) return MFAIL(origin, subj, "\"offset\"[%zu] is not an integer", d);
            it->offset[d] = json_integer_value(x);
        }
        it->has_offset = 1;
        it->ndim = (uint32_t)n;
    } else if (off && !json_is_null(off)) {
        return MFAIL(origin, subj, "\"offset\" is neither a list nor null");
    }
    uint64_t end;
    if (!uint_field(json_object_get(o, "data_offset"), &it->data_offset) ||
        !uint_field(json_object_get(o, "nbytes"), &it->nbytes) ||
        ckptio__add_overflows(it->data_offset, it->nbytes, &end) || end > INT64_MAX)
        return MFAIL(origin, subj, "\"data_offset\" / \"nbytes\" are not non-negative integers within range");
    const json_t *x = json_object_get(o, "xxh3");
    if (x && !json_is_null(x)) {
        if (!hex64(x, &it->hash)) return MFAIL(origin, subj, "\"xxh3\" is not 16 lowercase hex digits or null");
        it->hashed = 1;
    }
    const json_t *parts = json_object_get(o, "parts");
    if (parts && !json_is_null(parts)) {
        const size_t n = json_array_size(parts);
        if (!json_is_array(parts)) return MFAIL(origin, subj, "\"parts\" is not a list");
        if (!(it->parts = ckptio__calloc(n + 1, sizeof *it->parts)))
            return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
        uint64_t pos = 0;
        for (size_t p = 0; p < n; p++) {
            const json_t *e = json_array_get(parts, p);
            ckptio__dcp_mpart *q = &it->parts[p];
            if (!json_is_array(e) || json_array_size(e) != 3 || !uint_field(json_array_get(e, 0), &q->offset) ||
                !uint_field(json_array_get(e, 1), &q->length) || !hex64(json_array_get(e, 2), &q->hash))
                return MFAIL(origin, subj, "\"parts\"[%zu] is not [offset, length, \"16 hex digits\"]", p);
            if (q->offset != pos || q->length > it->nbytes - pos)
                return MFAIL(origin, subj, "\"parts\"[%zu] [%llu, +%llu) does not continue at %llu inside the item's "
                             "%llu bytes", p, (unsigned long long)q->offset, (unsigned long long)q->length,
                             (unsigned long long)pos, (unsigned long long)it->nbytes);
            pos += q->length;
        }
        if (pos != it->nbytes)
            return MFAIL(origin, subj, "\"parts\" cover %llu of the item's %llu bytes", (unsigned long long)pos,
                         (unsigned long long)it->nbytes);
        it->nparts = n;
    }
    return CKPTIO_OK;
}

ckptio_status ckptio__dcp_manifest_parse(const char *text, size_t len, const char *origin, ckptio__dcp_manifest *out) {
    memset(out, 0, sizeof *out);
    if (!origin) origin = "<manifest>";
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return MFAIL(origin, NULL, "not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    ckptio_status st = CKPTIO_OK;
    const json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "version");
    const json_t *hash = json_object_get(root, "hash");
    const json_t *files = json_object_get(root, "files"), *items = json_object_get(root, "items");
    if (!json_is_object(root) || !json_is_string(fmt) || strcmp(json_string_value(fmt), "ckptio-dcp-manifest") != 0) {
        st = MFAIL(origin, "format", "not a ckptio DCP manifest (\"format\" must be \"ckptio-dcp-manifest\")");
        goto out;
    }
    if (!json_is_integer(ver) || json_integer_value(ver) != 1) {
        st = MFAIL(origin, "version", "unsupported manifest version (this reader knows 1)");
        goto out;
    }
    if (hash && (!json_is_string(hash) || strcmp(json_string_value(hash), "xxh3-64") != 0)) {
        st = MFAIL(origin, "hash", "unsupported hash (this reader knows \"xxh3-64\")");
        goto out;
    }
    if (!json_is_array(files) || !json_is_array(items)) {
        st = MFAIL(origin, NULL, "\"files\" and \"items\" must be lists");
        goto out;
    }
    const size_t nf = json_array_size(files), ni = json_array_size(items);
    if (!(out->files = ckptio__calloc(nf + 1, sizeof *out->files)) ||
        !(out->items = ckptio__calloc(ni + 1, sizeof *out->items))) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for a manifest of %zu items", ni);
        goto out;
    }
    for (size_t i = 0; i < nf; i++) {
        const json_t *f = json_array_get(files, i);
        if (!json_is_string(f) || !ckptio__dcp_plain_name(json_string_value(f), json_string_length(f))) {
            st = MFAIL(origin, "files", "entry %zu is not a plain file name", i);
            goto out;
        }
        if (!(out->files[i] = ckptio__strdup(json_string_value(f)))) {
            st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
            goto out;
        }
        out->nfiles++;
    }
    for (size_t i = 0; i < ni; i++) {
        out->count++;
        if ((st = parse_item(json_array_get(items, i), out, origin, i, &out->items[i])) != CKPTIO_OK) goto out;
    }
out:
    json_decref(root);
    if (st != CKPTIO_OK) ckptio__dcp_manifest_free(out);
    return st;
}

/* ---- verification ------------------------------------------------------------------- */

/* The manifest's open brings its bytes (in object storage one GET, no HEAD). */
static ckptio_status load_manifest(ckptio_dcp *h, const char *name, ckptio__dcp_manifest *m) {
    char *path = ckptio__path_join(h->dir, name);
    if (!path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    void *text = NULL;
    size_t size = 0;
    ckptio_status st = ckptio__object_read_all(h->engine, path, MANIFEST_MAX, &text, &size);
    if (st == CKPTIO_OK) st = ckptio__dcp_manifest_parse(text, size, path, m);
    ckptio__free(text);
    ckptio__free(path);
    return st;
}

/* The stored item a manifest item describes (by fqn and chunk offsets), or
 * NULL; *slot numbers stored items: byte items first, then chunks
 * (chunk_base[t] is the slot of tensor t's first chunk). */
static const ckptio_dcp_stored *match(const ckptio_dcp *h, const size_t *chunk_base, const ckptio__dcp_mitem *it,
                                      size_t *slot) {
    if (!it->has_offset) {
        const size_t j = ckptio__dcp_bytes_index(h, it->fqn);
        if (j == (size_t)-1) return NULL;
        *slot = j;
        return &h->bytes[j].stored;
    }
    const size_t ti = ckptio__dcp_tensor_index(h, it->fqn);
    if (ti == (size_t)-1) return NULL;
    const ckptio__dcp_tensor *t = &h->tensors[ti];
    const size_t c = ckptio__dcp_chunk_index(t, it->offset, it->ndim);
    if (c == (size_t)-1) return NULL;
    *slot = chunk_base[ti] + c;
    return &t->stored[c];
}

static ckptio_status hash_range(ckptio_file *f, void *buf, uint64_t piece, uint64_t offset, uint64_t len,
                                XXH3_state_t *state, uint64_t *out) {
    XXH3_64bits_reset(state);
    for (uint64_t done = 0; done < len;) {
        const uint64_t n = len - done < piece ? len - done : piece;
        CKPTIO_FORWARD(ckptio__dcp_io(f, CKPTIO_READ, buf, n, offset + done));
        XXH3_64bits_update(state, buf, (size_t)n);
        done += n;
    }
    *out = XXH3_64bits_digest(state);
    return CKPTIO_OK;
}

/* A range of one file to hash against the manifest: an item, or one of its parts (part < 0: the item). */
typedef struct hash_job {
    const ckptio__dcp_mitem *it;
    long part;
    uint64_t at, len, want;
} hash_job;

/* Ranges of one file read together, in one engine plan, into one buffer of at most HASH_PIECE bytes that
 * mirrors a window of the file (a range at file offset `at` lies at buf + at - lo), then hashed in their
 * order: in object storage each read is a request, and a plan keeps S3_CONCURRENCY of them in flight where
 * reading range after range would keep one. Ranges at most MERGE_GAP apart (an item's
 * parts, the padding between items) are one extent, cut by the engine into chunk-sized GETs. */
#define MERGE_GAP ((uint64_t)64 << 10)

typedef struct hash_batch {
    ckptio_file *file;
    unsigned char *buf;
    uint64_t size;        /* bytes of buf */
    uint64_t lo, hi;      /* the window of the file the batch mirrors: [lo, hi) */
    hash_job *jobs;       /* njobs ranges, in order */
    size_t njobs, jcap;
    ckptio_extent *ext;   /* the reads: runs of ranges */
    size_t next, ecap;
} hash_batch;

static ckptio_status mismatch(ckptio_file *f, const hash_job *j, uint64_t got) {
    const char *path = ckptio_file_path(f);
    const ckptio__dcp_mitem *it = j->it;
    if (j->part < 0)
        return CKPTIO_FAIL_CTX(CKPTIO_E_CHECKSUM,
                               &((ckptio__err_ctx){.operation = "verify", .path = path,
                                                   .file_offset = (int64_t)j->at, .subject = it->fqn}),
                               "item '%s' (%llu bytes at offset %llu) has XXH3-64 %016llx, the manifest says %016llx",
                               it->fqn, (unsigned long long)j->len, (unsigned long long)j->at,
                               (unsigned long long)got, (unsigned long long)j->want);
    return CKPTIO_FAIL_CTX(CKPTIO_E_CHECKSUM,
                           &((ckptio__err_ctx){.operation = "verify", .path = path, .file_offset = (int64_t)j->at,
                                               .subject = it->fqn}),
                           "item '%s': part %ld (%llu bytes at offset %llu) has XXH3-64 %016llx, the manifest "
                           "says %016llx", it->fqn, j->part, (unsigned long long)j->len, (unsigned long long)j->at,
                           (unsigned long long)got, (unsigned long long)j->want);
}

/* Reads and hashes what the batch holds; the first mismatch in order is the error. */
static ckptio_status flush(hash_batch *b, XXH3_state_t *state) {
    if (!b->njobs) return CKPTIO_OK;
    const size_t n = b->njobs, next = b->next;
    b->njobs = b->next = 0;
    if (next) CKPTIO_FORWARD(ckptio_engine_execute_extents(ckptio__file_engine(b->file), CKPTIO_READ, b->ext, next));
    for (size_t i = 0; i < n; i++) {
        const hash_job *j = &b->jobs[i];
        XXH3_64bits_reset(state);
        XXH3_64bits_update(state, b->buf + (j->at - b->lo), (size_t)j->len);
        const uint64_t got = XXH3_64bits_digest(state);
        if (got != j->want) return mismatch(b->file, j, got);
    }
    return CKPTIO_OK;
}

static bool grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return true;
    const size_t n = *cap ? 2 * *cap : 64;
    void *q = ckptio__realloc(*p, n * size);
    if (!q) return false;
    *p = q;
    *cap = n;
    return true;
}

/* Hashes the range `j` of `f`: with the others of its batch, or alone in pieces when larger than it. */
static ckptio_status hash_job_add(hash_batch *b, ckptio_file *f, const hash_job *j, XXH3_state_t *state) {
    /* Joins the batch when in the same file, at or after its last range (a manifest's ranges ascend) and
     * inside the buffer's window. */
    if (b->njobs && (b->file != f || j->at < b->hi || j->at + j->len - b->lo > b->size))
        CKPTIO_FORWARD(flush(b, state));
    if (j->len > b->size) {
        uint64_t got = 0;
        CKPTIO_FORWARD(hash_range(f, b->buf, b->size, j->at, j->len, state, &got));
        return got == j->want ? CKPTIO_OK : mismatch(f, j, got);
    }
    if (!grow((void **)&b->jobs, &b->jcap, b->njobs + 1, sizeof *b->jobs) ||
        !grow((void **)&b->ext, &b->ecap, b->next + 1, sizeof *b->ext))
        return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for verification");
    if (!b->njobs) {
        b->file = f;
        b->lo = b->hi = j->at;
    }
    b->jobs[b->njobs++] = *j;
    if (j->len == 0) return CKPTIO_OK; /* hashed from no bytes */
    if (b->next && j->at <= b->hi + MERGE_GAP) {
        ckptio_extent *e = &b->ext[b->next - 1];
        e->length = j->at + j->len - e->file_offset;
    } else {
        b->ext[b->next++] = (ckptio_extent){.file = f, .file_offset = j->at, .length = j->len,
                                            .memory = b->buf + (j->at - b->lo), .mem_kind = CKPTIO_MEM_HOST};
    }
    b->hi = j->at + j->len;
    return CKPTIO_OK;
}

static ckptio_status check_item(ckptio_dcp *h, const ckptio__dcp_mitem *it, hash_batch *b, XXH3_state_t *state,
                                ckptio_dcp_verify_report *r) {
    ckptio_file *f = NULL;
    uint64_t size = 0;
    /* What is pending is of the file open now: hashed before another is handed out (a window of files may
     * release it) and before an error of this item, so that errors come in the items' order. */
    const size_t index = ckptio__dcp_file_index(h, it->file);
    if (b->njobs && (index == (size_t)-1 || h->handles[index] != b->file)) CKPTIO_FORWARD(flush(b, state));
    CKPTIO_FORWARD(ckptio__dcp_file(h, index, &f, &size));
    const char *path = ckptio_file_path(f);
    if (it->data_offset > size || it->nbytes > size - it->data_offset) {
        CKPTIO_FORWARD(flush(b, state));
        return CKPTIO_FAIL_CTX(CKPTIO_E_TRUNCATED,
                               &((ckptio__err_ctx){.operation = "verify", .path = path,
                                                   .file_offset = (int64_t)it->data_offset, .subject = it->fqn}),
                               "item '%s' of %llu bytes runs past the end of the file (%llu bytes)", it->fqn,
                               (unsigned long long)it->nbytes, (unsigned long long)size);
    }
    if (it->hashed) {
        const hash_job j = {.it = it, .part = -1, .at = it->data_offset, .len = it->nbytes, .want = it->hash};
        CKPTIO_FORWARD(hash_job_add(b, f, &j, state));
        r->bytes += it->nbytes;
    }
    for (size_t p = 0; p < it->nparts; p++) {
        const ckptio__dcp_mpart *q = &it->parts[p];
        const hash_job j = {.it = it, .part = (long)p, .at = it->data_offset + q->offset, .len = q->length,
                            .want = q->hash};
        CKPTIO_FORWARD(hash_job_add(b, f, &j, state));
        r->bytes += q->length;
    }
    if (it->hashed || it->nparts) r->checked++;
    else r->unhashed++;
    return CKPTIO_OK;
}

ckptio_status ckptio_dcp_verify(ckptio_dcp *h, ckptio_dcp_verify_report *report) {
    CKPTIO_RETURN_IF(!h, CKPTIO_E_INVAL, "ckptio_dcp_verify: handle is required");
    ckptio_dcp_verify_report r = {0};
    ckptio__dcp_manifest m = {0};
    bool *seen = NULL;
    size_t *chunk_base = NULL;
    void *buf = NULL;
    XXH3_state_t *state = NULL;
    const char *name = NULL;
    if (report) *report = r;
    CKPTIO_FORWARD(ckptio_dcp_manifest(h, &name));
    ckptio_status st = load_manifest(h, name, &m);
    if (st != CKPTIO_OK) goto out;
    const char *mpath = name; /* errors below name the manifest by its file name */
    size_t nstored = h->nbytes_items;
    for (size_t i = 0; i < h->ntensors; i++) nstored += h->tensors[i].nchunks;
    bool same_files = m.nfiles == h->nfiles;
    for (size_t i = 0; same_files && i < m.nfiles; i++)
        same_files = ckptio__dcp_file_index(h, m.files[i]) != (size_t)-1;
    if (!same_files) {
        st = MFAIL(mpath, "files", "the manifest lists %zu files that are not the %zu files .metadata names", m.nfiles,
                   h->nfiles);
        goto out;
    }
    if (m.count != nstored) {
        st = MFAIL(mpath, "items", "the manifest lists %zu items, .metadata %zu", m.count, nstored);
        goto out;
    }
    /* The batch buffer: HASH_PIECE, or all the bytes to hash when fewer (the manifest's sizes are bounded by
     * int64 each; the sum saturates at HASH_PIECE). */
    uint64_t total = 0;
    for (size_t i = 0; i < m.count && total < HASH_PIECE; i++)
        total += m.items[i].nbytes < HASH_PIECE ? m.items[i].nbytes : HASH_PIECE;
    const uint64_t buf_size = total < HASH_PIECE ? (total ? total : 1) : HASH_PIECE;
    if (!(seen = ckptio__calloc(nstored + 1, sizeof *seen)) ||
        !(chunk_base = ckptio__calloc(h->ntensors + 1, sizeof *chunk_base)) ||
        !(buf = ckptio__aligned_alloc(CKPTIO_DIRECT_ALIGN, buf_size)) ||
        !(state = XXH3_createState())) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for verification");
        goto out;
    }
    for (size_t i = 0, base = h->nbytes_items; i < h->ntensors; i++) {
        chunk_base[i] = base;
        base += h->tensors[i].nchunks;
    }
    /* Every manifest item must be one stored item of .metadata, in the same file. */
    for (size_t i = 0; i < m.count; i++) {
        size_t slot = 0;
        const ckptio_dcp_stored *s = match(h, chunk_base, &m.items[i], &slot);
        char subj[64];
        snprintf(subj, sizeof subj, "items[%zu]", i);
        if (!s || seen[slot] || strcmp(s->file, m.items[i].file) != 0) {
            st = MFAIL(mpath, subj, "item '%s' in '%s' %s", m.items[i].fqn, m.items[i].file,
                       !s           ? "is not an item of .metadata"
                       : seen[slot] ? "is listed twice"
                                    : "is in another file there");
            goto out;
        }
        seen[slot] = true;
    }
    if ((st = ckptio__dcp_check_coverage(h, &r.partial)) != CKPTIO_OK) goto out;
    hash_batch batch = {.buf = buf, .size = buf_size};
    for (size_t i = 0; i < m.count && st == CKPTIO_OK; i++) {
        r.items++;
        st = check_item(h, &m.items[i], &batch, state, &r);
    }
    if (st == CKPTIO_OK) st = flush(&batch, state);
    ckptio__free(batch.jobs);
    ckptio__free(batch.ext);
    if (st != CKPTIO_OK) goto out;
    /* Matching hashes say the bytes are the ones saved, not that they are
     * safe to load: byte items also go through the restricted unpickler. */
    for (size_t j = 0; j < h->nbytes_items; j++)
        if ((st = ckptio__dcp_check_bytes(h, j)) != CKPTIO_OK) goto out;
out:
    if (state) XXH3_freeState(state);
    ckptio__free(buf);
    ckptio__free(seen);
    ckptio__free(chunk_base);
    ckptio__dcp_manifest_free(&m);
    if (report) *report = r;
    return st;
}
