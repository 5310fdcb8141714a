/*
 * fuzz_hf_index.c - libFuzzer target for the Hugging Face index parser
 * (model.safetensors.index.json, src/format/hf_index.c): the input is the
 * index's text.
 *
 * Beyond "no crash, no leak, no UB": every accepted index must satisfy what
 * ckptio_model_open relies on before it opens a file: shard names are plain
 * names (no '/', no NUL, not "." or "..", 1..255 bytes), sorted and
 * distinct; entries are sorted by name, distinct, each pointing at a shard
 * that exists, and every shard is used; lookups find every entry. A failed
 * parse leaves nothing allocated. A broken invariant traps.
 */
#include "fuzz_check.h"
#include "ckptio.h"
#include "hf_index_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckptio__hf_index x;
    if (ckptio__hf_index_parse((const char *)data, size, "fuzz.index.json", &x) != CKPTIO_OK) {
        CHECK(x.shards == NULL && x.entries == NULL && x.count == 0 && x.nshards == 0);
        return 0;
    }
    for (size_t s = 0; s < x.nshards; s++) {
        const char *n = x.shards[s];
        CHECK(n && ckptio__hf_plain_name(n, strlen(n)));
        CHECK(s == 0 || strcmp(x.shards[s - 1], n) < 0);
    }
    unsigned char *used = calloc(x.nshards ? x.nshards : 1, 1);
    CHECK(used != NULL);
    for (size_t i = 0; i < x.count; i++) {
        const ckptio__hf_entry *e = &x.entries[i];
        CHECK(e->name != NULL && e->shard < x.nshards);
        CHECK(i == 0 || strcmp(x.entries[i - 1].name, e->name) < 0);
        CHECK(ckptio__hf_index_find(&x, e->name) == e);
        used[e->shard] = 1;
    }
    for (size_t s = 0; s < x.nshards; s++) CHECK(used[s]);
    CHECK(x.count > 0 || x.nshards == 0);
    free(used);
    ckptio__hf_index_free(&x);
    return 0;
}
