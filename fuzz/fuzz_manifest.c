/*
 * fuzz_manifest.c - libFuzzer target for the checksum manifest parser
 * (src/format/manifest_json.c): the input is the manifest's text.
 *
 * Beyond "no crash, no leak, no UB": every accepted manifest must satisfy
 * what the verifier relies on (tensors inside [data_offset, file_size),
 * block counts implied by sizes, unique names, "file" a plain name, a save
 * id of 32 hex digits or none), and
 * must survive a round trip through the writer: dumped and parsed again,
 * it is the same manifest. A broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "manifest_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(const ckptio__manifest *m) {
    CHECK(m->file && *m->file && !strchr(m->file, '/') && strcmp(m->file, "..") != 0);
    /* The save id: none (version 1) or 32 lowercase hex digits. */
    const size_t id_len = strlen(m->save_id);
    CHECK(id_len == 0 || id_len == CKPTIO__SAVE_ID_HEX);
    for (size_t i = 0; i < id_len; i++)
        CHECK((m->save_id[i] >= '0' && m->save_id[i] <= '9') || (m->save_id[i] >= 'a' && m->save_id[i] <= 'f'));
    CHECK(m->data_offset <= m->file_size);
    CHECK(m->block_bytes >= CKPTIO__MANIFEST_MIN_BLOCK && (m->block_bytes & (m->block_bytes - 1)) == 0);
    for (size_t i = 0; i < m->count; i++) {
        const ckptio__manifest_tensor *t = &m->tensors[i];
        CHECK(t->offset >= m->data_offset && t->nbytes <= m->file_size - t->offset);
        CHECK(t->nblocks == ckptio__manifest_nblocks(t->nbytes, m->block_bytes));
        CHECK(ckptio__manifest_find(m, t->name) == i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__manifest m, again;
    if (ckptio__manifest_parse((const char *)data, size, "fuzz.json", &m) != CKPTIO_OK) return 0;
    check(&m);
    size_t len = 0;
    char *text = ckptio__manifest_dump(&m, &len);
    if (text) {
        CHECK(ckptio__manifest_parse(text, len, "again.json", &again) == CKPTIO_OK);
        CHECK(again.count == m.count && again.file_size == m.file_size && again.header_hash == m.header_hash &&
              strcmp(again.file, m.file) == 0 && again.block_bytes == m.block_bytes &&
              strcmp(again.save_id, m.save_id) == 0);
        for (size_t i = 0; i < m.count; i++) {
            CHECK(strcmp(again.tensors[i].name, m.tensors[i].name) == 0);
            CHECK(again.tensors[i].nblocks == m.tensors[i].nblocks);
            CHECK(m.tensors[i].nblocks == 0 ||
                  memcmp(again.tensors[i].blocks, m.tensors[i].blocks, m.tensors[i].nblocks * 8) == 0);
        }
        ckptio__manifest_cleanup(&again);
        ckptio__free(text);
    }
    ckptio__manifest_cleanup(&m);
    return 0;
}
