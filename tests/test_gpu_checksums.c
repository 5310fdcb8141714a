/*
 * test_gpu_checksums.c - checksums of GPU-resident tensors computed on the
 * pinned staging copies (simulated device): real CRC-32 in every record of
 * a torch.save file, the same bytes as a save from host memory; safetensors
 * manifests of GPU tensors that verify, with no read-back of the temporary
 * (engine bytes_read stays 0) unless staging is too small for whole blocks.
 */
#include "engine_internal.h"
#include "gpu_internal.h"
#include "gpu_sim.h"
#include "helpers.h"
#include "torch_internal.h"

#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

enum { NT = 5 };
static const uint64_t sizes[NT] = {9 * MIB + 8, 4096, 3 * MIB + 40, 24, 5 * MIB};

static ckptio_engine *make_engine(int64_t threads, int64_t staging) {
    ckptio_engine *e = NULL;
    T_OK(ckptio_engine_create(&e));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_THREADS, threads));
    T_OK(ckptio_engine_set(e, CKPTIO_OPT_STAGING_BYTES, staging));
    return e;
}

typedef struct tensors {
    unsigned char *host[NT];  /* the reference bytes */
    void *mem[NT];            /* where the save reads them */
    int64_t shape[NT];
    char name[NT][16];
    ckptio_tensor_source src[NT];
} tensors;

/* U8 tensors; with `gpu`, all but tensor 1 in simulated device memory. */
static void make_tensors(tensors *t, bool gpu, uint64_t seed) {
    for (size_t i = 0; i < NT; i++) {
        t->host[i] = malloc(sizes[i]);
        T_ASSERT(t->host[i]);
        t_fill_random(t->host[i], sizes[i], seed + i);
        const bool dev = gpu && i != 1;
        t->mem[i] = dev ? ckptio__gpu_sim_device_alloc(sizes[i]) : malloc(sizes[i]);
        T_ASSERT(t->mem[i]);
        memcpy(t->mem[i], t->host[i], sizes[i]);
        t->shape[i] = (int64_t)sizes[i];
        snprintf(t->name[i], sizeof t->name[i], "t%zu", i);
        t->src[i] = (ckptio_tensor_source){.name = t->name[i], .dtype = CKPTIO_DTYPE_U8, .ndim = 1,
                                           .shape = &t->shape[i], .data = t->mem[i], .nbytes = sizes[i],
                                           .mem_kind = dev ? CKPTIO_MEM_CUDA : CKPTIO_MEM_HOST};
    }
}

static void free_tensors(tensors *t) {
    for (size_t i = 0; i < NT; i++) {
        if (t->src[i].mem_kind == CKPTIO_MEM_CUDA) ckptio__gpu_sim_device_free(t->mem[i]);
        else free(t->mem[i]);
        free(t->host[i]);
    }
}

static uint32_t crc_of(const unsigned char *p, uint64_t n) {
    return (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n);
}

static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Every record: data CRC recomputed with zlib equals the central
 * directory's and the data descriptor's, and no storage lacks one. */
static void check_torch_crcs(ckptio_engine *e, const char *path, size_t want_absent) {
    size_t len = 0;
    unsigned char *file = t_read_file(path, &len);
    ckptio_torch *t = NULL;
    T_OK(ckptio_torch_open(e, path, &t));
    ckptio_torch_verify_report rep;
    T_OK(ckptio_torch_verify(t, &rep));
    T_ASSERT_MSG(rep.crc_absent == want_absent && rep.crc_checked == rep.records - want_absent,
                 "%s: %zu records, %zu CRCs checked, %zu absent (want %zu absent)", path, rep.records,
                 rep.crc_checked, rep.crc_absent, want_absent);
    for (size_t i = 0; i < t->nentries; i++) {
        const ckptio__zip_entry *z = &t->entries[i];
        T_ASSERT(z->data_offset + z->size + 16 <= len);
        const uint32_t crc = crc_of(file + z->data_offset, z->size);
        if (want_absent) continue;
        T_ASSERT_MSG(z->crc32 == crc, "%s: central directory CRC %08x of %s, data has %08x", path, z->crc32, z->name,
                     crc);
        const unsigned char *d = file + z->data_offset + z->size;
        T_ASSERT_MSG(get32(d) == 0x08074b50u && get32(d + 4) == crc,
                     "%s: data descriptor of %s has CRC %08x, data has %08x", path, z->name, get32(d + 4), crc);
    }
    T_OK(ckptio_torch_close(t));
    free(file);
}

static void test_torch(int64_t threads, int64_t staging) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = 30};
    ckptio__gpu_sim_configure(&cfg);
    ckptio_engine *e = make_engine(threads, staging);
    tensors g, h;
    make_tensors(&g, true, 11);
    make_tensors(&h, false, 11);
    const char *gpath = t_path("gpu.pt"), *hpath = t_path("host.pt");
    ckptio_torch_save_options opt = {.record_prefix = "m"};
    T_OK(ckptio_torch_save_tensors(e, gpath, g.src, NT, &opt));
    T_OK(ckptio_torch_save_tensors(e, hpath, h.src, NT, &opt));
    check_torch_crcs(e, gpath, 0);
    check_torch_crcs(e, hpath, 0);

    /* Same layout as the host save: only the serialization id record (40
     * random digits) and its CRC-32 (descriptor, central directory) differ. */
    size_t glen = 0, hlen = 0;
    unsigned char *gb = t_read_file(gpath, &glen), *hb = t_read_file(hpath, &hlen);
    T_ASSERT_MSG(glen == hlen, "GPU save is %zu bytes, host save %zu", glen, hlen);
    ckptio_torch *t = NULL;
    T_OK(ckptio_torch_open(e, gpath, &t));
    uint64_t id_lo = 0, id_hi = 0;
    for (size_t i = 0; i < t->nentries; i++)
        if (strstr(t->entries[i].name, "serialization_id")) {
            id_lo = t->entries[i].data_offset;
            id_hi = id_lo + t->entries[i].size + 16; /* data + descriptor */
        }
    T_ASSERT(id_hi > id_lo);
    size_t cd_at = glen;
    for (size_t i = 0; i + 4 <= glen; i++)
        if (get32(gb + i) == 0x02014b50u) { /* first central directory header */
            cd_at = i;
            break;
        }
    size_t diff = 0;
    for (size_t i = 0; i < glen; i++) {
        if (gb[i] == hb[i]) continue;
        diff++;
        T_ASSERT_MSG((i >= id_lo && i < id_hi) || i >= cd_at, "byte %zu differs outside the serialization id", i);
    }
    T_ASSERT_MSG(diff <= 48, "%zu bytes differ between the GPU and host saves", diff);
    T_OK(ckptio_torch_close(t));
    /* The tensors read back are the GPU bytes. */
    T_OK(ckptio_torch_open(e, gpath, &t));
    unsigned char *back = malloc(sizes[0]);
    ckptio_tensor_target tg = {.index = 0, .data = back, .capacity = sizes[0], .mem_kind = CKPTIO_MEM_HOST};
    T_OK(ckptio_torch_read(t, &tg, 1));
    T_ASSERT(memcmp(back, g.host[0], sizes[0]) == 0);
    free(back);
    T_OK(ckptio_torch_close(t));

    /* Without CRCs: one plan, every record of the tensors without one. */
    opt.flags = CKPTIO_TORCH_SAVE_NO_CRC;
    T_OK(ckptio_torch_save_tensors(e, gpath, g.src, NT, &opt));
    T_OK(ckptio_torch_open(e, gpath, &t));
    ckptio_torch_verify_report rep;
    T_OK(ckptio_torch_verify(t, &rep));
    T_ASSERT_MSG(rep.crc_absent == NT, "NO_CRC: %zu records without CRC, want %d", rep.crc_absent, NT);
    T_OK(ckptio_torch_close(t));

    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.violations == 0);
    free(gb);
    free(hb);
    free_tensors(&g);
    free_tensors(&h);
    T_OK(ckptio_engine_destroy(e));
}

static void test_safetensors(int64_t threads, int64_t staging, bool expect_readback) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = 30};
    ckptio__gpu_sim_configure(&cfg);
    ckptio_engine *e = make_engine(threads, staging);
    tensors g;
    make_tensors(&g, true, 99);
    const char *path = t_path("gpu.safetensors");
    ckptio_stats before, after;
    T_OK(ckptio_engine_stats(e, &before));
    /* ALIGN_8: tensors at unaligned file offsets, blocks straddle 4 KiB. */
    T_OK(ckptio_safetensors_save(e, path, g.src, NT, NULL, 0,
                                 CKPTIO_SAFETENSORS_CHECKSUMS | CKPTIO_SAFETENSORS_ALIGN_8));
    T_OK(ckptio_engine_stats(e, &after));
    if (expect_readback)
        T_ASSERT_MSG(after.bytes_read > before.bytes_read, "staging %lld: expected a read-back of split blocks",
                     (long long)staging);
    else
        T_ASSERT_MSG(after.bytes_read == before.bytes_read, "staging %lld: the save read %llu bytes back",
                     (long long)staging, (unsigned long long)(after.bytes_read - before.bytes_read));
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_open(e, path, &st));
    ckptio_verify_report rep;
    T_OK(ckptio_safetensors_verify(st, NULL, &rep));
    uint64_t total = 0;
    for (size_t i = 0; i < NT; i++) total += sizes[i];
    T_ASSERT_MSG(rep.tensors == NT && rep.bytes == total, "verified %zu tensors, %llu bytes", rep.tensors,
                 (unsigned long long)rep.bytes);
    T_OK(ckptio_safetensors_close(st));

    /* The manifest really describes the bytes: one flipped byte fails. */
    size_t len = 0;
    unsigned char *file = t_read_file(path, &len);
    file[len - sizes[4] / 2] ^= 0x40;
    t_write_file(path, file, len);
    free(file);
    T_OK(ckptio_safetensors_open(e, path, &st));
    T_STATUS(ckptio_safetensors_verify(st, NULL, &rep), CKPTIO_E_CHECKSUM);
    T_MESSAGE_HAS("t4");
    T_OK(ckptio_safetensors_close(st));

    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.violations == 0);
    free_tensors(&g);
    T_OK(ckptio_engine_destroy(e));
}

/* A one-tensor torch.save archive over t's tensor i (GPU or host memory). */
static ckptio_torch_writer *archive_of(const tensors *t, size_t i) {
    ckptio_torch_writer *w = NULL;
    size_t sid;
    ckptio_value *root;
    const bool dev = t->src[i].mem_kind == CKPTIO_MEM_CUDA;
    T_OK(ckptio_torch_writer_create(&w));
    T_OK(ckptio_torch_writer_storage(w, CKPTIO_DTYPE_U8, sizes[i], dev ? "cuda:0" : "cpu", t->mem[i],
                                     t->src[i].mem_kind, &sid));
    ckptio_torch_tensor_spec spec = {.storage = sid, .dtype = CKPTIO_DTYPE_U8, .ndim = 1, .shape = &t->shape[i]};
    T_OK(ckptio_torch_writer_tensor(w, &spec, &root));
    T_OK(ckptio_torch_writer_set_root(w, root));
    return w;
}

/* DCP items from GPU memory get per-part XXH3s computed on the staging
 * copies; parts tile the item and match the bytes on disk. */
static void test_dcp_parts(int64_t threads, int64_t staging, bool expect_readback) {
    ckptio__gpu_sim_config cfg = {.copy_delay_us = 30};
    ckptio__gpu_sim_configure(&cfg);
    ckptio_engine *e = make_engine(threads, staging);
    tensors g;
    make_tensors(&g, true, 7);
    const char *path = t_path("gpu.distcp");
    const char blob[] = "a byte item";
    ckptio_file *file = NULL;
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &file));
    ckptio_dcp_item items[NT + 1];
    memset(items, 0, sizeof items);
    for (size_t i = 0; i < NT; i++)
        items[i] = (ckptio_dcp_item){.file = file, .archive = archive_of(&g, i), .flags = CKPTIO_DCP_ITEM_HASH};
    items[NT] = (ckptio_dcp_item){.file = file, .bytes = blob, .nbytes = sizeof blob, .flags = CKPTIO_DCP_ITEM_HASH};
    ckptio_stats before, after;
    T_OK(ckptio_engine_stats(e, &before));
    T_OK(ckptio_dcp_write(e, items, NT + 1, NULL));
    T_OK(ckptio_engine_stats(e, &after));
    T_OK(ckptio_file_commit(file));
    T_OK(ckptio_file_close(file));
    if (expect_readback)
        T_ASSERT_MSG(after.bytes_read > before.bytes_read, "staging %lld: expected a read-back of split blocks",
                     (long long)staging);
    else
        T_ASSERT_MSG(after.bytes_read == before.bytes_read, "staging %lld: the save read %llu bytes back",
                     (long long)staging, (unsigned long long)(after.bytes_read - before.bytes_read));
    size_t len = 0;
    unsigned char *disk = t_read_file(path, &len);
    for (size_t i = 0; i <= NT; i++) {
        const ckptio_dcp_item *it = &items[i];
        const bool dev = i < NT && g.src[i].mem_kind == CKPTIO_MEM_CUDA;
        if (!dev) {
            T_ASSERT_MSG(it->hashed && !it->parts && it->nparts == 0, "item %zu: host items get one hash", i);
            T_ASSERT(it->hash == XXH3_64bits(disk + it->offset, it->length));
            continue;
        }
        T_ASSERT_MSG(!it->hashed && it->parts && it->nparts >= 2, "item %zu: %zu parts", i, it->nparts);
        uint64_t expect = 0, blocks = 0;
        for (size_t k = 0; k < it->nparts; k++) {
            const ckptio_dcp_part *pt = &it->parts[k];
            T_ASSERT_MSG(pt->offset == expect && pt->length > 0 && pt->length <= CKPTIO_DCP_PART_BYTES,
                         "item %zu part %zu: offset %llu length %llu", i, k, (unsigned long long)pt->offset,
                         (unsigned long long)pt->length);
            T_ASSERT_MSG(pt->hash == XXH3_64bits(disk + it->offset + pt->offset, pt->length),
                         "item %zu part %zu: hash differs from the file's bytes", i, k);
            blocks += pt->length == CKPTIO_DCP_PART_BYTES;
            expect += pt->length;
        }
        T_ASSERT_MSG(expect == it->length, "item %zu: parts cover %llu of %llu bytes", i,
                     (unsigned long long)expect, (unsigned long long)it->length);
        T_ASSERT(blocks == sizes[i] / CKPTIO_DCP_PART_BYTES);
        /* The archive holds the tensor's bytes. */
        ckptio_torch *t = NULL;
        ckptio_torch_tensor_info ti;
        T_OK(ckptio_torch_parse(disk + it->offset, it->length, &t));
        T_OK(ckptio_torch_tensor(t, 0, &ti));
        T_ASSERT(ti.nbytes == sizes[i] && memcmp(disk + it->offset + ti.file_offset, g.host[i], sizes[i]) == 0);
        T_OK(ckptio_torch_close(t));
    }
    free(disk);
    /* A second write on the same items replaces the parts (no leak under
     * LSan), release frees them. */
    T_OK(ckptio_file_open(e, path, CKPTIO_OPEN_WRITE, &file));
    for (size_t i = 0; i <= NT; i++) items[i].file = file;
    T_OK(ckptio_dcp_write(e, items, NT + 1, NULL));
    T_OK(ckptio_file_close(file)); /* not committed: discarded */
    ckptio_dcp_items_release(items, NT + 1);
    for (size_t i = 0; i <= NT; i++) T_ASSERT(!items[i].parts && items[i].nparts == 0);
    for (size_t i = 0; i < NT; i++) ckptio_torch_writer_destroy(items[i].archive);
    ckptio__gpu_sim_stats s;
    ckptio__gpu_sim_get_stats(&s);
    T_ASSERT(s.violations == 0);
    free_tensors(&g);
    T_OK(ckptio_engine_destroy(e));
}

int main(void) {
    ckptio__gpu_set_ops(ckptio__gpu_sim_ops());
    test_dcp_parts(2, 64 * MIB, false);
    test_dcp_parts(0, 32 * MIB, false);
    test_dcp_parts(2, 1 * MIB, true); /* staging too small for whole blocks: read back */
    test_torch(3, 4 * MIB);
    test_torch(0, 1 * MIB);
    test_safetensors(2, 64 * MIB, false);
    test_safetensors(4, 16 * MIB + 64 * KIB, false); /* fewer, larger slots for whole blocks */
    test_safetensors(2, 1 * MIB, true);              /* too small: split blocks read back */
    return T_EXIT_PASS;
}
