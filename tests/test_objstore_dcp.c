/*
 * test_objstore_dcp.c - DCP checkpoints in object storage
 * (s3://BUCKET/PREFIX/) against a real S3 server (skipped, exit 77, without
 * one): the reader and the open's requests, and the commit steps (small
 * files, stale files of older saves, the lease that keeps two savers apart,
 * the cleanup guard for a later save's objects).
 */
#include "dcp_commit_internal.h"
#include "objstore_helpers.h"
#include "steps_fixture.h"
#include "steps_internal.h"

#include <errno.h>
#include <sys/stat.h>
#include <time.h>

/* The fixture's checkpoint copied under `dir`. */
static void put_fixture(ckptio_engine *e, const char *dir) {
    s3_put_files(e, dir, "dcp/sharded", fixture_files, NFIXTURE);
}

/* ckptio_dcp_open of a prefix lists it beside the .metadata GET: its data
 * objects open with the listed sizes and ETags, no HEAD, and one replaced
 * after the listing fails its read E_STALE. Where the listing gives other
 * ETags than the GETs (the proxy's etags action) each data object opens
 * with its HEAD and the checkpoint reads whole. */
static void test_dcp_open_lists_the_prefix(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-listed");
    put_fixture(e, dir);
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    s3_request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    const char *const no_rules[] = {NULL}, *const other_etags[] = {"GET:list-type=2:etags:100", NULL};
    ckptio_dcp *h;
    ckptio_dcp_verify_report r;
    for (size_t lying = 0; lying < 2; lying++) {
        proxy_start(lying ? other_etags : no_rules);
        T_OK(ckptio_dcp_open(e, dir, &h));
        T_OK(ckptio_dcp_verify(h, &r));
        T_ASSERT(r.items > 0 && r.unhashed == 0);
        T_OK(ckptio_dcp_close(h));
        s3_read_requests(g);
        T_ASSERT_MSG(s3_count_requests(g, "GET", "list-type=2") == 1 &&
                         s3_count_requests(g, "HEAD", ".distcp") == 2 * lying,
                     "%s listing: %zu listings, %zu HEADs of data objects", lying ? "a lying" : "an honest",
                     s3_count_requests(g, "GET", "list-type=2"), s3_count_requests(g, "HEAD", ".distcp"));
        /* The verify's manifest: one GET, no HEAD. */
        T_ASSERT_MSG(s3_count_requests(g, "GET", ".ckptio-manifest-") == 1 &&
                         s3_count_requests(g, "HEAD", ".ckptio-manifest-") == 0,
                     "the manifest: %zu GETs, %zu HEADs", s3_count_requests(g, "GET", ".ckptio-manifest-"),
                     s3_count_requests(g, "HEAD", ".ckptio-manifest-"));
        proxy_stop(lying ? "etags" : "pass");
    }
    T_OK(ckptio_dcp_open(e, dir, &h));
    size_t len = 0;
    unsigned char *data = t_read_file(t_data_path("dcp/sharded", DATA0), &len);
    data[len - 10] ^= 1;
    s3_put_bytes(e, s3_in(dir, DATA0), data, len);
    free(data);
    T_ASSERT(ckptio_dcp_verify(h, &r) == CKPTIO_E_STALE);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), DATA0), "%s", ckptio_last_error_message());
    T_OK(ckptio_dcp_close(h));
    free(g);
    ckptio_engine_destroy(e);
}

static void test_dcp_reader(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-read");
    put_fixture(e, dir);
    ckptio_dcp *h;
    T_OK(ckptio_dcp_open(e, dir, &h));
    const char *manifest = NULL;
    T_OK(ckptio_dcp_manifest(h, &manifest));
    ckptio_dcp_verify_report r;
    T_OK(ckptio_dcp_verify(h, &r));
    T_ASSERT(r.items > 0 && r.unhashed == 0);
    T_OK(ckptio_dcp_close(h));
    /* A flipped byte in a data object: verify names the item. */
    size_t len = 0;
    unsigned char *data = t_read_file(t_data_path("dcp/sharded", DATA0), &len);
    data[len - 10] ^= 1;
    s3_put_bytes(e, s3_in(dir, DATA0), data, len);
    free(data);
    T_OK(ckptio_dcp_open(e, dir, &h));
    T_ASSERT(ckptio_dcp_verify(h, &r) == CKPTIO_E_CHECKSUM);
    T_ASSERT_MSG(strstr(ckptio_last_error_message(), DATA0), "%s", ckptio_last_error_message());
    T_OK(ckptio_dcp_close(h));
    /* The manifest gone: the reader says there is none. */
    T_OK(ckptio_object_delete(e, s3_in(dir, fixture_files[1])));
    T_OK(ckptio_dcp_open(e, dir, &h));
    T_ASSERT(ckptio_dcp_manifest(h, &manifest) == CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_dcp_close(h));
    ckptio_engine_destroy(e);
}

static void test_dcp_commit_steps(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-commit");
    /* Small files: one PUT each, no temporary, no attributes. */
    T_OK(ckptio__dcp_write_file(dir, ".metadata", "old", 3, NULL, CKPTIO_DCP_SYNC));
    T_ASSERT(s3_object_exists(e, s3_in(dir, ".metadata")));
    unsigned mode = 0;
    T_ASSERT(ckptio_dcp_reference(dir, ".metadata", &mode) == CKPTIO_E_NOT_FOUND);
    T_OK(ckptio_dcp_create_file(dir, "__0_000000000001_0.distcp", ".metadata"));
    T_ASSERT(!s3_object_exists(e, s3_in(dir, "__0_000000000001_0.distcp")));
    int fd = -1;
    char tmp[512];
    T_ASSERT(ckptio_temporary_create(dir, "x", NULL, &fd, tmp, sizeof tmp) == CKPTIO_E_UNSUPPORTED);
    /* Stale files: an older save's data objects that no metadata references are listed and removed; what
     * the current .metadata references stays; names no DCP writer gives are never touched. */
    put_fixture(e, dir);
    s3_put_bytes(e, s3_in(dir, "__0_0123456789ab_0.distcp"), "old data", 8);
    s3_put_bytes(e, s3_in(dir, ".ckptio-manifest-0123456789ab.json"), "{}", 2);
    s3_put_bytes(e, s3_in(dir, "notes.txt"), "mine", 4);
    char **names = NULL;
    size_t n = 0;
    char note[512];
    const char *keep[] = {".metadata", ".ckptio-manifest-80b4e47c5ac9.json"};
    T_OK(ckptio_dcp_stale_files(dir, keep, 2, NULL, &names, &n, note, sizeof note));
    T_ASSERT_MSG(n == 2 && !strcmp(names[0], ".ckptio-manifest-0123456789ab.json") &&
                     !strcmp(names[1], "__0_0123456789ab_0.distcp"),
                 "%zu stale: %s %s %s", n, n ? names[0] : "", n > 1 ? names[1] : "", n > 2 ? names[2] : "");
    size_t removed = 0;
    T_OK(ckptio_dcp_remove_files(dir, (const char *const *)names, n, CKPTIO_DCP_SYNC | CKPTIO_DCP_RECHECK, NULL,
                                 &removed, note, sizeof note));
    T_ASSERT(removed == 2);
    ckptio_dcp_names_free(names, n);
    T_ASSERT(!s3_object_exists(e, s3_in(dir, "__0_0123456789ab_0.distcp")) && s3_object_exists(e, s3_in(dir, DATA0)) &&
             s3_object_exists(e, s3_in(dir, "notes.txt")));
    ckptio_dcp *h;
    T_OK(ckptio_dcp_open(e, dir, &h));
    T_OK(ckptio_dcp_verify(h, NULL));
    T_OK(ckptio_dcp_close(h));
    ckptio_engine_destroy(e);
}

/* Two savers of one prefix: the second is kept out while the first's
 * lease lives; a lease whose holder stopped renewing lapses and is taken
 * over, and the first's check then fails; the cleanup under the new lease
 * leaves the objects written after it alone. */
static void test_dcp_lease(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-lease");
    ckptio_dcp_lock *a = NULL, *b = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &a));
    ckptio_dcp_lock_info info;
    T_OK(ckptio_dcp_lock_query(a, &info));
    T_ASSERT(info.locked == 1);
    T_ASSERT(s3_object_exists(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME)));
    T_OK(ckptio_dcp_lock_check(a));
    const double t0 = ckptio__now();
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, 0, 0.5, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_ASSERT(ckptio__now() - t0 >= 0.4);
    const char *msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "another save holds the directory") && strstr(msg, "wrote nothing"), "%s", msg);
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_release(a));
    T_ASSERT(!s3_object_exists(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME)));
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &b));
    T_OK(ckptio_dcp_lock_release(b));

    /* A holder that stops renewing: a lease of 2 s written by hand, as a killed saver leaves it. */
    char text[256];
    ckptio__lease_text dead = {.owner = "0123456789abcdef0123456789abcdef", .since = 1, .ttl_ms = 2000};
    const size_t len = ckptio__lease_format(&dead, text, sizeof text);
    s3_put_bytes(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME), text, len);
    s3_put_bytes(e, s3_in(dir, "__0_aaaaaaaaaaaa_0.distcp"), "older", 5);
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 10, NULL, NULL, &b)); /* waits until it lapses */
    T_OK(ckptio_dcp_lock_check(b));
    /* Objects written after b's lease was taken belong to b's save: a cleanup keeps them. */
    s3_put_bytes(e, s3_in(dir, "__0_bbbbbbbbbbbb_0.distcp"), "newer", 5);
    char **names = NULL;
    size_t n = 0;
    char note[256];
    T_OK(ckptio_dcp_stale_files(dir, NULL, 0, NULL, &names, &n, note, sizeof note));
    T_ASSERT_MSG(n == 1 && !strcmp(names[0], "__0_aaaaaaaaaaaa_0.distcp"), "%zu stale", n);
    ckptio_dcp_names_free(names, n);
    /* Someone overwrites b's lease: b's check fails, and its release leaves the other's lease. */
    s3_put_bytes(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME), text, len);
    T_ASSERT(ckptio_dcp_lock_check(b) == CKPTIO_E_BUSY);
    msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "no longer this save's") && strstr(msg, "commits nothing more"), "%s", msg);
    T_OK(ckptio_dcp_lock_release(b));
    T_ASSERT(s3_object_exists(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME)));
    s3_no_secret_in_message();
    ckptio_engine_destroy(e);
}

/* A lease read back by its first check (CKPTIO_DCP_LOCK_CONFIRM_LATER): the
 * check waits out the settling time and is the read-back; a write of another
 * saver that came after this one's (the race on a server without conditional
 * writes) fails the check, and the release leaves the other's lease. */
static void test_dcp_lease_confirmed_later(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-lease-later");
    ckptio_dcp_lock *a = NULL, *b = NULL;
    const double before = ckptio__now(); /* the lease's write comes after this */
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &a));
    T_ASSERT(s3_object_exists(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME)));
    T_ASSERT(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &b) == CKPTIO_E_BUSY);
    T_OK(ckptio_dcp_lock_check(a));
    T_ASSERT(ckptio__now() - before >= 0.099); /* not read back before its write could settle */
    T_OK(ckptio_dcp_lock_check(a));
    T_OK(ckptio_dcp_lock_release(a));
    T_ASSERT(!s3_object_exists(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME)));

    /* Another saver's write lands right after this one's: this one's first check finds it. */
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &a));
    char text[256];
    ckptio__lease_text other = {.owner = "fedcba9876543210fedcba9876543210", .since = 1, .ttl_ms = 60000};
    const size_t len = ckptio__lease_format(&other, text, sizeof text);
    s3_put_bytes(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME), text, len);
    T_ASSERT(ckptio_dcp_lock_check(a) == CKPTIO_E_BUSY);
    const char *msg = ckptio_last_error_message();
    T_ASSERT_MSG(strstr(msg, "no longer this save's") && strstr(msg, "owner fedcba987654") &&
                     strstr(msg, "commits nothing more"),
                 "%s", msg);
    T_ASSERT(ckptio_dcp_lock_check(a) == CKPTIO_E_BUSY); /* lost stays lost */
    T_OK(ckptio_dcp_lock_release(a));
    void *back = NULL;
    size_t back_len = 0;
    T_OK(ckptio__object_read_all(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME), 4096, &back, &back_len));
    T_ASSERT(back_len == len && !memcmp(back, text, len)); /* the other's lease, untouched */
    ckptio__free(back);
    s3_no_secret_in_message();
    ckptio_engine_destroy(e);
}

/* The commit's step callback of test_dcp_commit_cleanup: the lease checked before .metadata. */
static int check_before_metadata(void *user, ckptio_dcp_commit_step step, const char *path, int done) {
    (void)path;
    if (step == CKPTIO_DCP_STEP_METADATA && !done) return ckptio_dcp_lock_check(user) != CKPTIO_OK;
    return 0;
}

/* A new save's data object and its commit with the cleanup, the lease checked before .metadata. */
#define NEW_OBJECT "__0_bbbbbbbbbbbb_0.distcp"
/* A killed save's multipart upload under `dir`: parts stored, never
 * completed, begun longer before the lease than the server's whole seconds
 * can hide. The caller closes the file once it checked the abort. */
static ckptio_file *killed_saves_upload(ckptio_engine *e, const char *dir) {
    ckptio_file *f;
    T_OK(ckptio_file_open(e, s3_in(dir, "__0_cccccccccccc_0.distcp"), CKPTIO_OPEN_WRITE, &f));
    void *big = calloc(1, 12 << 20);
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, big, 12 << 20, 0));
    free(big);
    struct timespec older = {2, 100000000};
    nanosleep(&older, NULL);
    return f;
}

static void commit_new_save(ckptio_engine *e, const char *dir, ckptio_dcp_lock *lock, ckptio_dcp_commit_result *r) {
    s3_put_bytes(e, s3_in(dir, NEW_OBJECT), "new", 3);
    static const char *const files[] = {NEW_OBJECT};
    ckptio_dcp_commit_options o = {.metadata_name = ".metadata", .metadata = "new metadata", .metadata_len = 12,
                                   .files = files, .nfiles = 1, .flags = CKPTIO_DCP_CLEANUP,
                                   .on_step = check_before_metadata, .user = lock};
    T_OK(ckptio_dcp_commit(dir, &o, r));
}

/* ckptio_dcp_commit in object storage over an older save: the listing and
 * the abort of a killed save's upload run beside the .metadata PUT, the
 * metadata object is read after it (the new one, so the older save's
 * objects go, all of them, deleted together), the new save's objects stay. */
static void test_dcp_commit_cleanup(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-commit-run");
    char name[64];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "__0_0123456789ab_%d.distcp", i);
        s3_put_bytes(e, s3_in(dir, name), "old", 3);
    }
    s3_put_bytes(e, s3_in(dir, ".ckptio-manifest-0123456789ab.json"), "{}", 2);
    s3_put_bytes(e, s3_in(dir, ".metadata"), "not a pickle", 12); /* read after the commit, it would keep everything */
    ckptio_file *f = killed_saves_upload(e, dir);
    ckptio_dcp_lock *lock = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_CONFIRM_LATER, 0, NULL, NULL, &lock));
    ckptio_dcp_commit_result r;
    commit_new_save(e, dir, lock, &r);
    T_ASSERT_MSG(r.committed && r.removed == 7, "removed %zu: %s", r.removed, r.note);
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "__0_0123456789ab_%d.distcp", i);
        T_ASSERT(!s3_object_exists(e, s3_in(dir, name)));
    }
    T_ASSERT(!s3_object_exists(e, s3_in(dir, ".ckptio-manifest-0123456789ab.json")) &&
             s3_object_exists(e, s3_in(dir, NEW_OBJECT)));
    uint64_t aborted = 99;
    T_OK(ckptio_object_abort_uploads(e, s3_in(dir, ""), 0, &aborted));
    T_ASSERT_MSG(aborted == 0, "%llu unfinished uploads were left", (unsigned long long)aborted);
    ckptio_file_close(f); /* its abort finds the upload gone: no error */
    T_OK(ckptio_dcp_lock_release(lock));
    T_ASSERT(!s3_object_exists(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME)));
    ckptio_engine_destroy(e);
}

/* Data objects handed over to the commit (ckptio_file_commit_unreferenced
 * with CKPTIO_COMMIT_SYNC_LATER) are completed by ckptio_dcp_commit while
 * the manifest's PUT runs: none is visible before the commit and every
 * byte is after it, the manifest's PUT is under way before the
 * CompleteMultipartUpload is answered (the proxy holds that answer back),
 * and .metadata goes after both. A completion the server refuses fails the
 * commit with the server's code: no .metadata, no data object and no
 * manifest are left, and the close aborts the upload. */
static void test_dcp_commit_completes_the_data_objects(void) {
    ckptio_engine *e = s3_test_engine();
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    static const char *const files[] = {"__0_0123456789ab_0.distcp"};
    const size_t len = 12 << 20;
    unsigned char *data = malloc(len);
    T_ASSERT(data);
    t_fill_random(data, len, 7);
    const ckptio_dcp_manifest_item item = {.fqn = "blob", .file = files[0], .nbytes = len, .hashed = 1, .hash = 1};
    s3_request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    for (int refused = 0; refused < 2; refused++) {
        char dir[1400];
        snprintf(dir, sizeof dir, "%s", s3_url(refused ? "dcp-complete-refused" : "dcp-complete"));
        const char *const rules[] = {refused ? "POST:uploadId=:error:400/InvalidPart:1" : "POST:uploadId=:delay:0.5:1",
                                     NULL};
        proxy_start(rules);
        ckptio_file *f;
        T_OK(ckptio_file_open(e, s3_in(dir, files[0]), CKPTIO_OPEN_WRITE, &f));
        T_OK(ckptio__file_io(f, CKPTIO_WRITE, data, len, 0));
        T_OK(ckptio_file_commit_unreferenced(&f, 1, CKPTIO_COMMIT_SYNC_LATER));
        T_ASSERT_MSG(!s3_object_exists(e, s3_in(dir, files[0])), "the data object appeared before the commit");
        ckptio_dcp_commit_options o = {.metadata_name = ".metadata", .metadata = "new metadata", .metadata_len = 12,
                                       .files = files, .nfiles = 1, .items = &item, .nitems = 1,
                                       .flags = CKPTIO_DCP_MANIFEST, .data_files = &f, .ndata_files = 1};
        ckptio_dcp_commit_result r;
        const ckptio_status st = ckptio_dcp_commit(dir, &o, &r);
        char message[2048];
        snprintf(message, sizeof message, "%s", ckptio_last_error_message());
        T_OK(ckptio_file_close(f)); /* its upload's client goes through the proxy */
        s3_read_requests(g);
        proxy_stop(refused ? "error" : "delay");
        if (refused) {
            T_ASSERT_MSG(st != CKPTIO_OK && !r.committed && strstr(message, "InvalidPart") && strstr(message, files[0]),
                         "%d: %s", st, message);
            T_ASSERT(!s3_object_exists(e, s3_in(dir, ".metadata")) && !s3_object_exists(e, s3_in(dir, files[0])) &&
                     !s3_object_exists(e, s3_in(dir, ".ckptio-manifest-0123456789ab.json")));
            uint64_t left = 99;
            T_OK(ckptio_object_abort_uploads(e, s3_in(dir, ""), 0, &left));
            T_ASSERT_MSG(left == 0, "%llu unfinished uploads were left", (unsigned long long)left);
            continue;
        }
        T_ASSERT_MSG(st == CKPTIO_OK && r.committed, "%d: %s", st, message);
        size_t got_len = 0;
        unsigned char *got = s3_object_bytes(e, s3_in(dir, files[0]), &got_len);
        T_ASSERT(got && got_len == len && !memcmp(got, data, len));
        free(got);
        size_t complete = g->n, manifest = g->n, metadata = g->n;
        for (size_t i = 0; i < g->n; i++) {
            if (!strcmp(g->method[i], "POST") && strstr(g->target[i], "uploadId=")) complete = i;
            if (!strcmp(g->method[i], "PUT") && strstr(g->target[i], ".ckptio-manifest-0123456789ab")) manifest = i;
            if (!strcmp(g->method[i], "PUT") && strstr(g->target[i], "/.metadata")) metadata = i;
        }
        T_ASSERT_MSG(complete < g->n && manifest < g->n && metadata < g->n, "%zu requests: no Complete, manifest "
                     "or .metadata", g->n);
        T_ASSERT_MSG(g->start[manifest] < g->end[complete], "the manifest's PUT began %.3f s after the Complete's "
                     "answer", g->start[manifest] - g->end[complete]);
        T_ASSERT_MSG(g->start[metadata] >= g->end[complete] && g->start[metadata] >= g->end[manifest],
                     ".metadata's PUT began before the data object or the manifest was stored");
    }
    free(g);
    free(data);
    ckptio_engine_destroy(e);
}

/* The removal of older saves' objects under a lease held here aborts the
 * killed saves' uploads begun before the lease; what it needs to know of the
 * directory is its shared saves' marks, which it lists alone (the listing's
 * prefix is theirs), not every object of the directory. */
static void test_dcp_abort_lists_the_marks_only(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-abort-marks");
    const char *names[4];
    char name[4][64];
    for (int i = 0; i < 4; i++) {
        snprintf(name[i], sizeof name[i], "__0_0123456789ab_%d.distcp", i);
        names[i] = name[i];
        s3_put_bytes(e, s3_in(dir, name[i]), "old", 3);
    }
    s3_put_bytes(e, s3_in(dir, "__0_fedcba987654_0.distcp"), "kept", 4);
    ckptio_file *f = killed_saves_upload(e, dir);
    ckptio_dcp_lock *lock = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &lock));
    snprintf(upstream, sizeof upstream, "%s", getenv("AWS_ENDPOINT_URL"));
    const char *const no_rules[] = {NULL};
    s3_request_log *g = calloc(1, sizeof *g);
    T_ASSERT(g);
    proxy_start(no_rules);
    size_t removed = 0;
    char note[512];
    T_OK(ckptio_dcp_remove_files(dir, names, 4, 0, NULL, &removed, note, sizeof note));
    T_ASSERT_MSG(removed == 4, "removed %zu: %s", removed, note);
    s3_read_requests(g);
    proxy_stop("pass");
    size_t listings = 0, bounded = 0;
    for (size_t i = 0; i < g->n; i++)
        if (!strcmp(g->method[i], "GET") && strstr(g->target[i], "list-type=2")) {
            listings++;
            bounded += strstr(g->target[i], "prefix=") && strstr(g->target[i], "ckptio-dcp-shared-") != NULL;
        }
    T_ASSERT_MSG(listings == 1 && bounded == 1, "%zu listings, %zu of them of the marks alone", listings, bounded);
    T_ASSERT_MSG(s3_count_requests(g, "DELETE", "uploadId") == 1, "%zu uploads aborted",
                 s3_count_requests(g, "DELETE", "uploadId"));
    uint64_t aborted = 99;
    T_OK(ckptio_object_abort_uploads(e, s3_in(dir, ""), 0, &aborted));
    T_ASSERT_MSG(aborted == 0, "%llu unfinished uploads were left", (unsigned long long)aborted);
    T_ASSERT(s3_object_exists(e, s3_in(dir, "__0_fedcba987654_0.distcp")) && !s3_object_exists(e, s3_in(dir, name[0])));
    ckptio_file_close(f);
    T_OK(ckptio_dcp_lock_release(lock));
    free(g);
    ckptio_engine_destroy(e);
}

/* The shared saves' marks under `dir`. */
static int count_mark(void *user, const ckptio__object_entry *e) {
    if (!strncmp(e->name, CKPTIO__DCP_SHARED_PREFIX, sizeof CKPTIO__DCP_SHARED_PREFIX - 1)) ++*(int *)user;
    return 0;
}
static int marks_under(ckptio_engine *e, const char *dir) {
    int n = 0;
    T_OK(ckptio__object_dir_list(e, dir, count_mark, &n));
    return n;
}

/* A save without collectives (the lock taken shared) in progress while a
 * save with a cleanup takes the lease and commits: the shared save's mark
 * keeps its data objects and its unfinished upload (begun before the lease)
 * from that cleanup, which still removes the older save's objects and a
 * mark that lapsed; the mark goes with the shared save's release. */
static void test_dcp_shared_save_beside_a_cleanup(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-shared");
    s3_put_bytes(e, s3_in(dir, "__0_0123456789ab_0.distcp"), "old", 3);
    s3_put_bytes(e, s3_in(dir, ".metadata"), "not a pickle", 12); /* replaced below, before the cleanup reads it */
    char text[256];
    ckptio__lease_text dead = {.owner = "0123456789abcdef0123456789abcdef", .since = 1, .ttl_ms = 1000};
    const size_t len = ckptio__lease_format(&dead, text, sizeof text);
    /* a killed one's */
    s3_put_bytes(e, s3_in(dir, CKPTIO__DCP_SHARED_PREFIX "0123456789abcdef0123456789abcdef"), text, len);
    struct timespec older = {2, 100000000}; /* older by the server's whole seconds (listings round up) */
    nanosleep(&older, NULL);
    ckptio_dcp_lock *shared = NULL, *lock = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, CKPTIO_DCP_LOCK_SHARED, 0, NULL, NULL, &shared));
    T_ASSERT_MSG(marks_under(e, dir) == 2, "%d marks", marks_under(e, dir));
    s3_put_bytes(e, s3_in(dir, "__0_dddddddddddd_0.distcp"), "shared", 6);
    ckptio_file *f;
    T_OK(ckptio_file_open(e, s3_in(dir, "__0_dddddddddddd_1.distcp"), CKPTIO_OPEN_WRITE, &f));
    const size_t big_len = 12 << 20;
    unsigned char *big = malloc(big_len);
    for (size_t i = 0; i < big_len; i++) big[i] = (unsigned char)(i * 31 + 7);
    T_OK(ckptio__file_io(f, CKPTIO_WRITE, big, big_len, 0)); /* its parts are sent; the upload is open */
    nanosleep(&older, NULL);
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &lock));
    ckptio_dcp_commit_result r;
    commit_new_save(e, dir, lock, &r);
    T_ASSERT_MSG(r.committed && r.removed == 2, "removed %zu: %s", r.removed, r.note);
    T_ASSERT(!s3_object_exists(e, s3_in(dir, "__0_0123456789ab_0.distcp")) &&
             s3_object_exists(e, s3_in(dir, NEW_OBJECT)));
    T_ASSERT(s3_object_exists(e, s3_in(dir, "__0_dddddddddddd_0.distcp")));
    T_ASSERT_MSG(marks_under(e, dir) == 1, "%d marks", marks_under(e, dir)); /* the lapsed one went */
    T_OK(ckptio_dcp_lock_release(lock));
    T_OK(ckptio_dcp_lock_check(shared));
    T_OK(ckptio_file_commit(f)); /* its upload was not aborted */
    T_OK(ckptio_file_close(f));
    void *back = NULL;
    size_t back_len = 0;
    T_OK(ckptio__object_read_all(e, s3_in(dir, "__0_dddddddddddd_1.distcp"), big_len, &back, &back_len));
    T_ASSERT(back_len == big_len && !memcmp(back, big, big_len));
    ckptio__free(back);
    free(big);
    T_OK(ckptio_dcp_lock_release(shared));
    T_ASSERT(marks_under(e, dir) == 0);
    ckptio_engine_destroy(e);
}

/* A lease that another save took over and released (the object is gone)
 * is lost: its renewal never writes it again and the check fails. */
static void test_dcp_lease_gone_is_lost(void) {
    ckptio_engine *e = s3_test_engine();
    const char *dir = s3_url("dcp-lease-gone");
    setenv("CKPTIO_S3_LEASE_MS", "1200", 1); /* renewed every 0.4 s */
    ckptio_dcp_lock *a = NULL;
    T_OK(ckptio_dcp_lock_acquire(dir, NULL, 0, 0, NULL, NULL, &a));
    unsetenv("CKPTIO_S3_LEASE_MS");
    T_OK(ckptio_object_delete(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME)));
    struct timespec renewals = {1, 0};
    nanosleep(&renewals, NULL);
    T_ASSERT(!s3_object_exists(e, s3_in(dir, CKPTIO_DCP_LOCK_NAME))); /* not written again */
    T_ASSERT(ckptio_dcp_lock_check(a) == CKPTIO_E_BUSY);
    T_MESSAGE_HAS("commits nothing more");
    T_OK(ckptio_dcp_lock_release(a));
    ckptio_engine_destroy(e);
}

int main(void) {
    s3_test_bucket();
    T_RUN(test_dcp_reader);
    T_RUN(test_dcp_open_lists_the_prefix);
    T_RUN(test_dcp_commit_steps);
    T_RUN(test_dcp_lease);
    T_RUN(test_dcp_lease_confirmed_later);
    T_RUN(test_dcp_commit_cleanup);
    T_RUN(test_dcp_commit_completes_the_data_objects);
    T_RUN(test_dcp_abort_lists_the_marks_only);
    T_RUN(test_dcp_shared_save_beside_a_cleanup);
    T_RUN(test_dcp_lease_gone_is_lost);
    return T_EXIT_PASS;
}
