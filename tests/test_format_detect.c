/*
 * test_format_detect.c - the one format detector (ckptio_format_detect and
 * ckptio_format_detect_bytes): every valid safetensors file is detected as
 * safetensors whatever its first byte (a sweep over every residue of the
 * header length mod 256, 0x80 and "PK\3\4" starts included), torch files by
 * their magic, damaged files routed to the reader that explains them, and
 * paths: directories by their entries, FIFOs refused without blocking.
 */
#include "helpers.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char tensor_json[] = "{\"t\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";

/* A valid safetensors file whose header is exactly n bytes (padded with
 * spaces, optionally preceded by `lead` blanks), with 4 data bytes. */
static unsigned char *make_st(size_t n, size_t lead, size_t *len) {
    const size_t json = sizeof tensor_json - 1;
    T_ASSERT(n >= lead + json);
    *len = 8 + n + 4;
    unsigned char *b = malloc(*len);
    T_ASSERT(b != NULL);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memset(b + 8, ' ', n);
    memset(b + 8, '\n', lead);
    memcpy(b + 8 + lead, tensor_json, json);
    memcpy(b + 8 + n, "abcd", 4);
    return b;
}

static ckptio_format detect_bytes(const void *head, size_t len, uint64_t size) {
    ckptio_format f = (ckptio_format)-1;
    T_OK(ckptio_format_detect_bytes(head, len, size, &f));
    return f;
}

static ckptio_format detect_path(const char *path) {
    ckptio_format f = (ckptio_format)-1;
    T_OK(ckptio_format_detect(path, &f));
    return f;
}

/* One format detector: a header length of 128 mod 256 starts the file with
 * 0x80, the first byte of a pickle; every residue must read as safetensors,
 * from the probe bytes and from the path, and open with the reader. */
static void test_every_header_length_residue(void) {
    ckptio_engine *engine = NULL;
    T_OK(ckptio_engine_create(&engine));
    for (size_t n = 64; n < 64 + 256; n++) {
        size_t len;
        unsigned char *b = make_st(n, 0, &len);
        ckptio_safetensors *st = NULL;
        T_OK(ckptio_safetensors_parse(b, len, len, &st)); /* the file is valid */
        ckptio_safetensors_close(st);
        const size_t probe = len < CKPTIO_FORMAT_PROBE_BYTES ? len : CKPTIO_FORMAT_PROBE_BYTES;
        T_ASSERT_MSG(detect_bytes(b, probe, len) == CKPTIO_FORMAT_SAFETENSORS, "header length %zu (first byte 0x%02x)",
                     n, b[0]);
        const char *path = t_path("sweep.safetensors");
        t_write_file(path, b, len);
        T_ASSERT_MSG(detect_path(path) == CKPTIO_FORMAT_SAFETENSORS, "header length %zu from the path", n);
        T_OK(ckptio_safetensors_open(engine, path, &st));
        ckptio_safetensors_close(st);
        free(b);
    }
    ckptio_engine_destroy(engine);
}

/* Headers whose length makes the file start like a torch file. */
static void test_safetensors_that_look_like_torch(void) {
    unsigned char head[16] = {0};
    /* 0x80 0x02: a pickle protocol 2 (N = 640 + ...). */
    size_t len;
    unsigned char *b = make_st(0x280, 0, &len);
    T_ASSERT(b[0] == 0x80 && b[1] == 0x02);
    T_ASSERT(detect_bytes(b, CKPTIO_FORMAT_PROBE_BYTES, len) == CKPTIO_FORMAT_SAFETENSORS);
    free(b);
    /* "PK\3\4": N = 0x04034b50 (67 MB, under the 100 MB cap); only the head
     * and the size matter to the rule. */
    memcpy(head, "PK\x03\x04\0\0\0\0{", 9);
    T_ASSERT(detect_bytes(head, 9, 8 + 0x04034b50ull + 4) == CKPTIO_FORMAT_SAFETENSORS);
    /* The same bytes in a file too short for that header: a zip. */
    T_ASSERT(detect_bytes(head, 9, 1000) == CKPTIO_FORMAT_TORCH);
}

static void test_torch_magics(void) {
    /* A torch.save zip: local header, version 0, flags 0x0808, method 0. */
    const unsigned char zip[] = {'P', 'K', 3, 4, 0, 0, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0};
    T_ASSERT(detect_bytes(zip, sizeof zip, 4096) == CKPTIO_FORMAT_TORCH);
    T_ASSERT(detect_bytes(zip, 4, 4) == CKPTIO_FORMAT_TORCH);
    /* Legacy torch.save: protocol 2 and the magic number long; protocol 4
     * opens with a FRAME. */
    const unsigned char legacy2[] = {0x80, 0x02, 0x8a, 0x0a,
                                     0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    T_ASSERT(detect_bytes(legacy2, sizeof legacy2, 1000) == CKPTIO_FORMAT_TORCH_LEGACY);
    const unsigned char legacy4[] = {0x80, 0x04, 0x95, 0x20, 0x01, 0, 0, 0, 0, 0, 0, 0x8a, 0x0a};
    T_ASSERT(detect_bytes(legacy4, sizeof legacy4, 1000) == CKPTIO_FORMAT_TORCH_LEGACY);
    const unsigned char proto6[] = {0x80, 0x06, 0x95, 0, 0, 0, 0, 0, 0, 0};
    T_ASSERT(detect_bytes(proto6, sizeof proto6, 1000) == CKPTIO_FORMAT_UNKNOWN);
}

/* Damaged safetensors files still go to the safetensors reader, which says
 * what is wrong; other bytes are unknown. */
static void test_damaged_and_unknown(void) {
    size_t len;
    unsigned char *b = make_st(100, 0, &len);
    /* Cut inside the header: N runs past the end. */
    T_ASSERT(detect_bytes(b, 60, 60) == CKPTIO_FORMAT_SAFETENSORS);
    /* N above the 100 MB cap. */
    b[4] = 0x7f;
    T_ASSERT(detect_bytes(b, 64, len) == CKPTIO_FORMAT_SAFETENSORS);
    free(b);
    T_ASSERT(detect_bytes("", 0, 0) == CKPTIO_FORMAT_UNKNOWN);
    T_ASSERT(detect_bytes("\x01\x02", 2, 2) == CKPTIO_FORMAT_UNKNOWN);
    T_ASSERT(detect_bytes("#!/bin/sh\necho\n", 15, 15) == CKPTIO_FORMAT_UNKNOWN);
    /* N = 1 cannot hold "{}"; N = 0 neither. */
    T_ASSERT(detect_bytes("\x01\0\0\0\0\0\0\0{", 9, 9) == CKPTIO_FORMAT_SAFETENSORS); /* rule 4: damaged */
    T_ASSERT(detect_bytes("\x02\0\0\0\0\0\0\0[]", 10, 10) == CKPTIO_FORMAT_UNKNOWN);
    T_ASSERT(detect_bytes("\x02\0\0\0\0\0\0\0{}", 10, 10) == CKPTIO_FORMAT_SAFETENSORS);
    /* Arguments. */
    ckptio_format f;
    T_STATUS(ckptio_format_detect_bytes("abc", 3, 2, &f), CKPTIO_E_INVAL);
    T_STATUS(ckptio_format_detect_bytes(NULL, 3, 3, &f), CKPTIO_E_INVAL);
    T_STATUS(ckptio_format_detect_bytes("abc", 3, 3, NULL), CKPTIO_E_INVAL);
    T_STATUS(ckptio_format_detect(NULL, &f), CKPTIO_E_INVAL);
}

/* JSON allows blanks before the object, and so do the reference and the
 * reader: a blank run longer than the probe is followed on disk. */
static void test_blank_start(void) {
    ckptio_engine *engine = NULL;
    T_OK(ckptio_engine_create(&engine));
    size_t len;
    unsigned char *b = make_st(9000, 5000, &len);
    ckptio_safetensors *st = NULL;
    T_OK(ckptio_safetensors_parse(b, len, len, &st));
    ckptio_safetensors_close(st);
    /* From the probe alone the rule cannot decide: counted as safetensors. */
    T_ASSERT(detect_bytes(b, CKPTIO_FORMAT_PROBE_BYTES, len) == CKPTIO_FORMAT_SAFETENSORS);
    const char *path = t_path("blank.safetensors");
    t_write_file(path, b, len);
    T_ASSERT(detect_path(path) == CKPTIO_FORMAT_SAFETENSORS);
    T_OK(ckptio_safetensors_open(engine, path, &st));
    ckptio_safetensors_close(st);
    /* Blanks, then no object: the path reads on and says unknown. */
    b[8 + 5000] = '[';
    t_write_file(path, b, len);
    T_ASSERT(detect_path(path) == CKPTIO_FORMAT_UNKNOWN);
    free(b);
    ckptio_engine_destroy(engine);
}

static void test_paths(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", t_path("d"));
    T_ASSERT(mkdir(dir, 0755) == 0);
    T_ASSERT(detect_path(dir) == CKPTIO_FORMAT_DIRECTORY);
    char entry[1200];
    snprintf(entry, sizeof entry, "%s/model.safetensors.index.json", dir);
    t_write_file(entry, "{\"weight_map\": {}}", 18);
    T_ASSERT(detect_path(dir) == CKPTIO_FORMAT_HF_INDEX);
    T_ASSERT(detect_path(entry) == CKPTIO_FORMAT_HF_INDEX);
    snprintf(entry, sizeof entry, "%s/.metadata", dir);
    t_write_file(entry, "", 0);
    T_ASSERT(detect_path(dir) == CKPTIO_FORMAT_DCP); /* DCP wins over an index beside it */
    /* The key file decides by its name, whatever it has become: the DCP
     * reader then refuses a FIFO there, naming it. */
    T_ASSERT(unlink(entry) == 0 && mkfifo(entry, 0600) == 0);
    T_ASSERT(detect_path(dir) == CKPTIO_FORMAT_DCP);
    /* The index rule needs the name and JSON; JSON under another name is unknown. */
    const char *json = t_path("weights.json");
    t_write_file(json, "{\"weight_map\": {}}", 18);
    T_ASSERT(detect_path(json) == CKPTIO_FORMAT_UNKNOWN);
    const char *empty = t_path("empty");
    t_write_file(empty, "", 0);
    T_ASSERT(detect_path(empty) == CKPTIO_FORMAT_UNKNOWN);
    ckptio_format f;
    T_STATUS(ckptio_format_detect(t_path("missing"), &f), CKPTIO_E_NOT_FOUND);
    T_ASSERT(strstr(ckptio_last_error()->path, "missing") != NULL);
    T_ASSERT(ckptio_last_error()->sys_errno == ENOENT);
    /* A FIFO without a writer: refused at once, never read. */
    const char *fifo = t_path("fifo");
    T_ASSERT(mkfifo(fifo, 0600) == 0);
    T_STATUS(ckptio_format_detect(fifo, &f), CKPTIO_E_UNSUPPORTED);
    T_MESSAGE_HAS("is a FIFO, not a regular file or a directory");
}

static void test_names(void) {
    T_ASSERT(strcmp(ckptio_format_name(CKPTIO_FORMAT_SAFETENSORS), "safetensors") == 0);
    T_ASSERT(strcmp(ckptio_format_name(CKPTIO_FORMAT_TORCH), "torch") == 0);
    T_ASSERT(strcmp(ckptio_format_name(CKPTIO_FORMAT_TORCH_LEGACY), "torch_legacy") == 0);
    T_ASSERT(strcmp(ckptio_format_name(CKPTIO_FORMAT_DCP), "dcp") == 0);
    T_ASSERT(strcmp(ckptio_format_name(CKPTIO_FORMAT_HF_INDEX), "hf_index") == 0);
    T_ASSERT(strcmp(ckptio_format_name(CKPTIO_FORMAT_DIRECTORY), "directory") == 0);
    T_ASSERT(strcmp(ckptio_format_name(CKPTIO_FORMAT_UNKNOWN), "unknown") == 0);
    T_ASSERT(strcmp(ckptio_format_name((ckptio_format)99), "unknown") == 0);
}

int main(void) {
    T_RUN(test_every_header_length_residue);
    T_RUN(test_safetensors_that_look_like_torch);
    T_RUN(test_torch_magics);
    T_RUN(test_damaged_and_unknown);
    T_RUN(test_blank_start);
    T_RUN(test_paths);
    T_RUN(test_names);
    return T_EXIT_PASS;
}
