/*
 * dcp_names.c - the names of the files in a DCP checkpoint directory, as
 * the commit (ckptio.dcp's writer, this library) gives and recognises them.
 *
 * One save's data files share a token: __{rank}_{token}_{n}.distcp with 12
 * hex digits chosen per save, so a save never reuses an older save's name
 * (its files can be committed beside the old checkpoint and the old ones
 * removed afterwards), and the manifest .ckptio-manifest-{token}.json is
 * found from the data file names alone (dcp_manifest_verify.c).
 */
#include "dcp_commit_internal.h"
#include "io_internal.h"

#include <stdio.h>
#include <string.h>

static const char *digits(const char *p) {
    while (*p >= '0' && *p <= '9') p++;
    return p;
}

static bool hex_lower(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

bool ckptio__dcp_data_name(const char *name, char token[13]) {
    if (name[0] != '_' || name[1] != '_') return false;
    const char *p = digits(name + 2);
    if (p == name + 2 || *p != '_') return false;
    const char *tok = ++p;
    for (int k = 0; k < 12; k++, p++)
        if (!hex_lower(*p)) return false;
    if (*p != '_') return false;
    const char *num = ++p;
    p = digits(p);
    if (p == num || strcmp(p, ".distcp") != 0) return false;
    memcpy(token, tok, 12);
    token[12] = '\0';
    return true;
}

bool ckptio__dcp_token(const char *const *files, size_t count, char token[13]) {
    token[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        char t[13];
        if (!files[i] || !ckptio__dcp_data_name(files[i], t) || (token[0] && strcmp(token, t) != 0)) {
            token[0] = '\0';
            return false;
        }
        memcpy(token, t, sizeof t);
    }
    return token[0] != '\0';
}

bool ckptio__dcp_manifest_name(const char *const *files, size_t count, char name[CKPTIO__DCP_MANIFEST_NAME_SIZE]) {
    char token[13];
    name[0] = '\0';
    if (!ckptio__dcp_token(files, count, token)) return false;
    snprintf(name, CKPTIO__DCP_MANIFEST_NAME_SIZE, CKPTIO__DCP_MANIFEST_PREFIX "%s.json", token);
    return true;
}

/* The rank in a data file name __{rank}_... (torch's and ckptio's), as the
 * digits' length; 0 when the name has none. */
static size_t rank_digits(const char *name) {
    if (!name || name[0] != '_' || name[1] != '_') return 0;
    const char *p = digits(name + 2);
    return p != name + 2 && *p == '_' ? (size_t)(p - (name + 2)) : 0;
}

bool ckptio__dcp_several_ranks(const char *const *files, size_t count) {
    const char *first = NULL;
    size_t first_len = 0;
    for (size_t i = 0; i < count; i++) {
        const size_t n = rank_digits(files[i]);
        if (!n) continue;
        if (!first) {
            first = files[i] + 2;
            first_len = n;
        } else if (n != first_len || memcmp(files[i] + 2, first, n) != 0) {
            return true;
        }
    }
    return false;
}

int ckptio_dcp_saved_by_ranks(const char *const *relative_paths, size_t count) {
    return relative_paths && ckptio__dcp_several_ranks(relative_paths, count);
}

bool ckptio__dcp_metadata_name(const char *name) {
    if (strcmp(name, ".metadata") == 0) return true;
    if (name[0] != '_' || name[1] != '_') return false;
    const char *p = digits(name + 2);
    return p != name + 2 && strcmp(p, ".metadata") == 0;
}

bool ckptio__dcp_temporary_name(const char *name) { return strstr(name, CKPTIO__TMP_MARK) != NULL; }

/* __{digits}_ ... .distcp, optionally followed by the block-hash manifest's
 * suffix (torch names its data files __{rank}_{n}.distcp). */
static bool any_data_name(const char *name) {
    if (name[0] != '_' || name[1] != '_') return false;
    const char *p = digits(name + 2);
    if (p == name + 2 || *p != '_') return false;
    const size_t len = strlen(p);
    static const char ext[] = ".distcp", man[] = ".distcp" CKPTIO_MANIFEST_SUFFIX;
    const size_t e = sizeof ext - 1, m = sizeof man - 1;
    return (len >= 1 + e && strcmp(p + len - e, ext) == 0) || (len >= 1 + m && strcmp(p + len - m, man) == 0);
}

/* .ckptio-manifest-{hex}.json */
static bool manifest_name(const char *name) {
    const size_t n = sizeof CKPTIO__DCP_MANIFEST_PREFIX - 1;
    if (strncmp(name, CKPTIO__DCP_MANIFEST_PREFIX, n) != 0) return false;
    const char *p = name + n, *q = p;
    while (hex_lower(*q)) q++;
    return q != p && strcmp(q, ".json") == 0;
}

bool ckptio__dcp_stale_name(const char *name) {
    if (ckptio__dcp_temporary_name(name) || any_data_name(name) || manifest_name(name)) return true;
    if (strcmp(name, ".metadata.tmp") == 0) return true;
    if (name[0] != '_' || name[1] != '_') return false;
    const char *p = digits(name + 2);
    return p != name + 2 && strcmp(p, ".metadata.tmp") == 0;
}

char *ckptio__dcp_join(const char *dir, const char *name) { return ckptio__path_join(dir, name); }
