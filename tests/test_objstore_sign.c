/*
 * test_objstore_sign.c - the pieces of src/objstore that need no server:
 * AWS Signature Version 4 against AWS's published test vectors (the
 * generic suite's and S3's own examples), s3:// URL parsing and URI
 * encoding, object names in messages, the endpoint/region/credential chain
 * (environment, ~/.aws/credentials, ~/.aws/config), and the XML reader of
 * server answers (errors, listings, refusals of hostile documents).
 */
#include "helpers.h"
#include "objstore_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SUITE_KEY "AKIDEXAMPLE"
#define SUITE_SECRET "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
#define UNRESERVED "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

/* One case of the generic suite (service "service", us-east-1, 20150830T123600Z). */
static void suite_case(const char *name, const char *path, const ckptio__s3_pair *query, size_t nquery,
                       const ckptio__s3_pair *extra, size_t nextra, const char *signed_headers, const char *sig) {
    ckptio__s3_pair h[8] = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", "20150830T123600Z"}};
    size_t nh = 2;
    for (size_t i = 0; i < nextra; i++) h[nh++] = extra[i];
    const ckptio__sigv4_input in = {.method = "GET", .path = path, .query = query, .nquery = nquery, .headers = h,
                                    .nheaders = nh, .payload_hash = EMPTY_SHA, .amz_date = "20150830T123600Z",
                                    .region = "us-east-1", .service = "service", .access_key = SUITE_KEY,
                                    .secret_key = SUITE_SECRET};
    char out[512], want[512];
    T_OK(ckptio__sigv4_authorization(&in, out, sizeof out, NULL, 0));
    snprintf(want, sizeof want,
             "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=%s, "
             "Signature=%s",
             signed_headers, sig);
    T_ASSERT_MSG(strcmp(out, want) == 0, "%s:\n got  %s\n want %s", name, out, want);
}

static void test_sigv4_suite(void) {
    suite_case("get-vanilla", "/", NULL, 0, NULL, 0, "host;x-amz-date",
               "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
    const ckptio__s3_pair order[] = {{"Param2", "value2"}, {"Param1", "value1"}};
    suite_case("get-vanilla-query-order-key-case", "/", order, 2, NULL, 0, "host;x-amz-date",
               "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
    const ckptio__s3_pair values[] = {{"Param1", "value2"}, {"Param1", "value1"}};
    suite_case("get-vanilla-query-order-value", "/", values, 2, NULL, 0, "host;x-amz-date",
               "5772eed61e12b33fae39ee5e7012498b51d56abc0abb7c60486157bd471c4694");
    const ckptio__s3_pair unreserved[] = {{UNRESERVED, UNRESERVED}};
    suite_case("get-vanilla-query-unreserved", "/", unreserved, 1, NULL, 0, "host;x-amz-date",
               "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197");
    const ckptio__s3_pair utf8[] = {{"\xe1\x88\xb4", "bar"}};
    suite_case("get-vanilla-utf8-query", "/", utf8, 1, NULL, 0, "host;x-amz-date",
               "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04");
    const ckptio__s3_pair empty_key[] = {{"Param1", "value1"}};
    suite_case("get-vanilla-empty-query-key", "/", empty_key, 1, NULL, 0, "host;x-amz-date",
               "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb");
    suite_case("get-unreserved", "/" UNRESERVED, NULL, 0, NULL, 0, "host;x-amz-date",
               "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f");
    suite_case("get-utf8", "/\xe1\x88\xb4", NULL, 0, NULL, 0, "host;x-amz-date",
               "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85");
    suite_case("get-space", "/example space/", NULL, 0, NULL, 0, "host;x-amz-date",
               "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741");
    /* Repeated header names: one line, values joined by commas in order. */
    const ckptio__s3_pair dup[] = {{"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}};
    suite_case("get-header-key-duplicate", "/", NULL, 0, dup, 3, "host;my-header1;x-amz-date",
               "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea");
}

#define S3_KEY "AKIAIOSFODNN7EXAMPLE"
#define S3_SECRET "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

/* S3's own examples (Amazon S3 API reference, "Signature Calculations for
 * the Authorization Header"): examplebucket, us-east-1, 20130524T000000Z. */
static void s3_case(const char *name, const char *method, const char *path, const ckptio__s3_pair *query,
                    size_t nquery, const ckptio__s3_pair *h, size_t nh, const char *payload, const char *want_sig,
                    const char *want_creq) {
    const ckptio__sigv4_input in = {.method = method, .path = path, .query = query, .nquery = nquery, .headers = h,
                                    .nheaders = nh, .payload_hash = payload, .amz_date = "20130524T000000Z",
                                    .region = "us-east-1", .service = "s3", .access_key = S3_KEY,
                                    .secret_key = S3_SECRET};
    char out[512], creq[2048];
    T_OK(ckptio__sigv4_authorization(&in, out, sizeof out, creq, sizeof creq));
    const char *sig = strstr(out, "Signature=");
    T_ASSERT(sig);
    T_ASSERT_MSG(strcmp(sig + 10, want_sig) == 0, "%s: signature %s, want %s\ncanonical request:\n%s", name,
                 sig + 10, want_sig, creq);
    if (want_creq) T_ASSERT_MSG(strcmp(creq, want_creq) == 0, "%s: canonical request\n%s", name, creq);
    T_ASSERT(strstr(out, "Credential=" S3_KEY "/20130524/us-east-1/s3/aws4_request"));
}

static void test_sigv4_s3_examples(void) {
    const ckptio__s3_pair get[] = {{"Host", "examplebucket.s3.amazonaws.com"},
                                   {"Range", "bytes=0-9"},
                                   {"x-amz-content-sha256", EMPTY_SHA},
                                   {"x-amz-date", "20130524T000000Z"}};
    s3_case("GET Object", "GET", "/test.txt", NULL, 0, get, 4, EMPTY_SHA,
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:" EMPTY_SHA "\nx-amz-date:20130524T000000Z\n\n"
            "host;range;x-amz-content-sha256;x-amz-date\n" EMPTY_SHA);
    char body_sha[CKPTIO__SHA256_HEX];
    ckptio__sha256_hex("Welcome to Amazon S3.", 21, body_sha);
    T_ASSERT(strcmp(body_sha, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072") == 0);
    const ckptio__s3_pair put[] = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                                   {"Host", "examplebucket.s3.amazonaws.com"},
                                   {"x-amz-content-sha256", body_sha},
                                   {"x-amz-date", "20130524T000000Z"},
                                   {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
    /* '$' in the key is encoded: /test%24file.text */
    s3_case("PUT Object", "PUT", "/test$file.text", NULL, 0, put, 5, body_sha,
            "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd", NULL);
    const ckptio__s3_pair plain[] = {{"Host", "examplebucket.s3.amazonaws.com"},
                                     {"x-amz-content-sha256", EMPTY_SHA},
                                     {"x-amz-date", "20130524T000000Z"}};
    const ckptio__s3_pair lifecycle[] = {{"lifecycle", ""}};
    s3_case("GET Bucket Lifecycle", "GET", "/", lifecycle, 1, plain, 3, EMPTY_SHA,
            "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543", NULL);
    const ckptio__s3_pair list[] = {{"prefix", "J"}, {"max-keys", "2"}};
    s3_case("GET Bucket (List Objects)", "GET", "/", list, 2, plain, 3, EMPTY_SHA,
            "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7", NULL);
}

static void test_uri_and_urls(void) {
    char out[64];
    T_ASSERT(ckptio__s3_uri_encode("a b/c~", 6, true, out, sizeof out) == 8);
    T_ASSERT(strcmp(out, "a%20b/c~") == 0);
    T_ASSERT(ckptio__s3_uri_encode("a/b", 3, false, out, sizeof out) == 5);
    T_ASSERT(strcmp(out, "a%2Fb") == 0);
    T_ASSERT(ckptio__s3_uri_encode("\x01..\xff", 4, true, out, sizeof out) == 8);
    T_ASSERT(strcmp(out, "%01..%FF") == 0);
    T_ASSERT(ckptio__s3_uri_encode("abc", 3, true, out, 3) == (size_t)-1); /* no room for the NUL */

    char *b, *k;
    T_OK(ckptio__s3_parse_url("s3://my-bucket.x/dir/../a b", false, &b, &k));
    T_ASSERT(strcmp(b, "my-bucket.x") == 0 && strcmp(k, "dir/../a b") == 0);
    ckptio__free(b);
    ckptio__free(k);
    T_OK(ckptio__s3_parse_url("s3://bkt", true, &b, &k));
    T_ASSERT(strcmp(b, "bkt") == 0 && strcmp(k, "") == 0);
    ckptio__free(b);
    ckptio__free(k);
    T_STATUS(ckptio__s3_parse_url("s3://bkt/", false, &b, &k), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("names a bucket but no object");
    T_STATUS(ckptio__s3_parse_url("s3://Bad_Bucket/k", false, &b, &k), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("bucket name");
    T_STATUS(ckptio__s3_parse_url("s3://ab/k", false, &b, &k), CKPTIO_E_INVAL);
    T_STATUS(ckptio__s3_parse_url("/local/path", false, &b, &k), CKPTIO_E_INVAL);
    char longkey[1100 + 8];
    memcpy(longkey, "s3://bk1/", 9);
    memset(longkey + 9, 'k', 1025);
    longkey[9 + 1025] = '\0';
    T_STATUS(ckptio__s3_parse_url(longkey, false, &b, &k), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("1025 bytes");
    longkey[9 + 1024] = '\0';
    T_OK(ckptio__s3_parse_url(longkey, false, &b, &k));
    ckptio__free(b);
    ckptio__free(k);

    char shown[400];
    ckptio__s3_display("bkt", "a\nb\x01\\c", shown, sizeof shown);
    T_ASSERT(strcmp(shown, "s3://bkt/a\\x0ab\\x01\\x5cc") == 0);
    ckptio__s3_display("bkt", longkey + 9, shown, sizeof shown);
    T_ASSERT(strstr(shown, "...(a key of 1024 bytes)"));
    T_ASSERT(strlen(shown) < 300);
    T_ASSERT(ckptio__s3_is_url("s3://x") && !ckptio__s3_is_url("S3://x") && !ckptio__s3_is_url("/s3://x"));
}

/* ---- configuration ----------------------------------------------------------- */

static const char *const aws_env[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                      "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
                                      "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
                                      "AWS_SHARED_CREDENTIALS_FILE", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
                                      "CKPTIO_S3_ADDRESSING", "AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE",
                                      "CKPTIO_S3_SIGN_PAYLOAD"};

static void clear_aws_env(const char *home) {
    for (size_t i = 0; i < sizeof aws_env / sizeof *aws_env; i++) unsetenv(aws_env[i]);
    setenv("HOME", home, 1);
}

static ckptio__s3_client *client_for(const char *bucket) {
    ckptio__s3_settings s;
    ckptio__s3_settings_default(&s);
    ckptio__s3_client *c = NULL;
    T_OK(ckptio__s3_client_create(&s, bucket, &c));
    return c;
}

static void test_config_chain(void) {
    const char *home = t_path("home");
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s/.aws", home);
    mkdir(home, 0700);
    mkdir(dir, 0700);
    clear_aws_env(home);

    /* No credentials anywhere: an error that says where it looked. */
    ckptio__s3_settings s;
    ckptio__s3_settings_default(&s);
    ckptio__s3_client *c = NULL;
    T_STATUS(ckptio__s3_client_create(&s, "bkt", &c), CKPTIO_E_PERMISSION);
    T_MESSAGE_HAS("no S3 credentials");
    T_MESSAGE_HAS("/.aws/credentials");

    snprintf(path, sizeof path, "%s/credentials", dir);
    t_write_file(path,
                 "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n"
                 "# a comment\n[work]\naws_access_key_id=WORKKEY\naws_secret_access_key=worksecret\n"
                 "aws_session_token = worktoken\n",
                 strlen("[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n"
                        "# a comment\n[work]\naws_access_key_id=WORKKEY\naws_secret_access_key=worksecret\n"
                        "aws_session_token = worktoken\n"));
    const char *config = "[default]\nregion = eu-west-3\n[profile work]\nregion = ap-south-1\n"
                         "endpoint_url = http://127.0.0.1:9/base/\ns3 =\n  addressing_style = virtual\n"
                         "[profile cfgonly]\naws_access_key_id = CFGKEY\naws_secret_access_key = cfgsecret\n";
    snprintf(path, sizeof path, "%s/config", dir);
    t_write_file(path, config, strlen(config));

    /* Default profile: AWS's endpoint for its region, virtual-hosted for a DNS-safe bucket. */
    c = client_for("bkt");
    T_ASSERT(strcmp(c->access_key, "DEFKEY") == 0 && strcmp(c->secret_key, "defsecret") == 0);
    T_ASSERT(!c->session_token);
    T_ASSERT(strcmp(c->region, "eu-west-3") == 0);
    T_ASSERT(strcmp(c->scheme, "https") == 0 && strcmp(c->host, "s3.eu-west-3.amazonaws.com") == 0);
    T_ASSERT(c->addressing == CKPTIO__S3_VIRTUAL_HOSTED && !c->sign_payload);
    T_ASSERT(strstr(c->where, "profile \"default\""));
    ckptio__s3_client_destroy(c);
    /* A bucket with dots keeps path-style (TLS wildcard certificates). */
    c = client_for("my.bucket");
    T_ASSERT(c->addressing == CKPTIO__S3_PATH_STYLE);
    ckptio__s3_client_destroy(c);

    /* AWS_PROFILE: its keys, token, region, endpoint and addressing. */
    setenv("AWS_PROFILE", "work", 1);
    c = client_for("bkt");
    T_ASSERT(strcmp(c->access_key, "WORKKEY") == 0 && strcmp(c->session_token, "worktoken") == 0);
    T_ASSERT(strcmp(c->region, "ap-south-1") == 0);
    T_ASSERT(strcmp(c->scheme, "http") == 0 && strcmp(c->host, "127.0.0.1:9") == 0);
    T_ASSERT(strcmp(c->base_path, "/base") == 0);
    T_ASSERT(c->addressing == CKPTIO__S3_VIRTUAL_HOSTED && c->sign_payload);
    ckptio__s3_client_destroy(c);
    setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true", 1);
    c = client_for("bkt");
    T_ASSERT(strcmp(c->host, "s3.ap-south-1.amazonaws.com") == 0);
    ckptio__s3_client_destroy(c);
    unsetenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");

    /* Keys in the config file only. */
    setenv("AWS_PROFILE", "cfgonly", 1);
    c = client_for("bkt");
    T_ASSERT(strcmp(c->access_key, "CFGKEY") == 0 && strstr(c->where, "profile \"cfgonly\""));
    ckptio__s3_client_destroy(c);
    setenv("AWS_PROFILE", "missing", 1);
    T_STATUS(ckptio__s3_client_create(&s, "bkt", &c), CKPTIO_E_PERMISSION);
    T_MESSAGE_HAS("profile \"missing\"");

    /* The environment comes first; AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL. */
    setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "envsecret", 1);
    setenv("AWS_SESSION_TOKEN", "envtoken", 1);
    setenv("AWS_REGION", "us-west-2", 1);
    setenv("AWS_DEFAULT_REGION", "eu-north-1", 1);
    setenv("AWS_ENDPOINT_URL", "http://general:1", 1);
    setenv("AWS_ENDPOINT_URL_S3", "HTTPS://s3only:2", 1);
    c = client_for("bkt");
    T_ASSERT(strcmp(c->access_key, "ENVKEY") == 0 && strcmp(c->session_token, "envtoken") == 0);
    T_ASSERT(strcmp(c->region, "us-west-2") == 0);
    T_ASSERT(strcmp(c->scheme, "https") == 0 && strcmp(c->host, "s3only:2") == 0);
    T_ASSERT(c->addressing == CKPTIO__S3_PATH_STYLE); /* a custom endpoint: path-style unless asked */
    T_ASSERT(!c->sign_payload);
    ckptio__s3_client_destroy(c);
    setenv("CKPTIO_S3_ADDRESSING", "virtual", 1);
    c = client_for("bkt");
    T_ASSERT(c->addressing == CKPTIO__S3_VIRTUAL_HOSTED);
    ckptio__s3_client_destroy(c);
    setenv("CKPTIO_S3_SIGN_PAYLOAD", "on", 1); /* https: unsigned unless asked */
    c = client_for("bkt");
    T_ASSERT(c->sign_payload);
    ckptio__s3_client_destroy(c);
    setenv("CKPTIO_S3_SIGN_PAYLOAD", "maybe", 1);
    T_STATUS(ckptio__s3_client_create(&s, "bkt", &c), CKPTIO_E_INVAL);
    unsetenv("CKPTIO_S3_SIGN_PAYLOAD");
    setenv("CKPTIO_S3_ADDRESSING", "sideways", 1);
    T_STATUS(ckptio__s3_client_create(&s, "bkt", &c), CKPTIO_E_INVAL);
    unsetenv("CKPTIO_S3_ADDRESSING");
    unsetenv("AWS_REGION");
    c = client_for("bkt");
    T_ASSERT(strcmp(c->region, "eu-north-1") == 0);
    ckptio__s3_client_destroy(c);

    /* Bad endpoints and regions are named; secrets never are. */
    setenv("AWS_ENDPOINT_URL_S3", "ftp://x", 1);
    T_STATUS(ckptio__s3_client_create(&s, "bkt", &c), CKPTIO_E_INVAL);
    T_MESSAGE_HAS("AWS_ENDPOINT_URL_S3");
    T_ASSERT(!strstr(ckptio_last_error_message(), "envsecret") && !strstr(ckptio_last_error_message(), "ENVKEY"));
    setenv("AWS_ENDPOINT_URL_S3", "http://user@host:1", 1);
    T_STATUS(ckptio__s3_client_create(&s, "bkt", &c), CKPTIO_E_INVAL);
    unsetenv("AWS_ENDPOINT_URL_S3");
    setenv("AWS_REGION", "us-east-1/../x", 1);
    T_STATUS(ckptio__s3_client_create(&s, "bkt", &c), CKPTIO_E_INVAL);
    clear_aws_env(home);
}

/* ---- XML ------------------------------------------------------------------------- */

typedef struct collected {
    int n;
    char keys[8][1100];
    uint64_t sizes[8];
    char uploads[8][64];
    bool prefix[8];
} collected;

static int collect(void *user, const ckptio__s3_entry *e) {
    collected *c = user;
    if (c->n < 8) {
        snprintf(c->keys[c->n], sizeof c->keys[0], "%s", e->key);
        snprintf(c->uploads[c->n], sizeof c->uploads[0], "%s", e->upload_id);
        c->sizes[c->n] = e->size;
        c->prefix[c->n] = e->is_prefix;
    }
    c->n++;
    return 0;
}

static int list_text(const char *xml, collected *c, bool *truncated, char *next, char *err) {
    memset(c, 0, sizeof *c);
    char next2[64];
    return ckptio__xml_list(xml, strlen(xml), collect, c, truncated, next, 256, next2, sizeof next2, err, 200);
}

static void test_xml(void) {
    char code[64], msg[256];
    const char *e = "<?xml version='1.0' encoding='UTF-8'?>\n<Error><Code>NoSuchKey</Code>"
                    "<Message>The specified key does not exist.</Message><Key>a&amp;b&#x41;&#66;</Key></Error>";
    ckptio__xml_error(e, strlen(e), code, sizeof code, msg, sizeof msg);
    T_ASSERT(strcmp(code, "NoSuchKey") == 0 && strcmp(msg, "The specified key does not exist.") == 0);
    char key[32];
    T_ASSERT(ckptio__xml_find(e, strlen(e), "Error/Key", key, sizeof key, NULL) == 0);
    T_ASSERT(strcmp(key, "a&bAB") == 0);
    ckptio__xml_error("not xml", 7, code, sizeof code, msg, sizeof msg);
    T_ASSERT(!code[0] && !msg[0]);
    bool cut;
    T_ASSERT(ckptio__xml_find(e, strlen(e), "Error/Message", key, 8, &cut) == 0 && cut && strlen(key) == 7);

    collected c;
    bool truncated;
    char next[256], err[200];
    const char *page = "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
                       "<Contents><Key>dir/a%0Ab+c%2B</Key><Size>12</Size><ETag>&quot;x&quot;</ETag></Contents>"
                       "<Contents><Key>dir/b</Key><Size>0</Size></Contents>"
                       "<CommonPrefixes><Prefix>dir/sub/</Prefix></CommonPrefixes>"
                       "<IsTruncated>true</IsTruncated><NextContinuationToken>tok/+=</NextContinuationToken>"
                       "<EncodingType>url</EncodingType></ListBucketResult>";
    T_ASSERT(list_text(page, &c, &truncated, next, err) == 0);
    T_ASSERT(c.n == 3 && truncated && strcmp(next, "tok/+=") == 0);
    T_ASSERT(strcmp(c.keys[0], "dir/a\nb c+") == 0 && c.sizes[0] == 12 && !c.prefix[0]);
    T_ASSERT(strcmp(c.keys[1], "dir/b") == 0 && c.sizes[1] == 0);
    T_ASSERT(strcmp(c.keys[2], "dir/sub/") == 0 && c.prefix[2]);
    /* Without EncodingType the keys are taken as they are. */
    const char *raw = "<ListBucketResult><Contents><Key>a%41+</Key><Size>1</Size></Contents>"
                      "<IsTruncated>false</IsTruncated></ListBucketResult>";
    T_ASSERT(list_text(raw, &c, &truncated, next, err) == 0 && c.n == 1 && !truncated);
    T_ASSERT(strcmp(c.keys[0], "a%41+") == 0);
    const char *uploads = "<ListMultipartUploadsResult><Upload><Key>k1</Key><UploadId>u1</UploadId>"
                          "<Initiated>2026-01-01T00:00:00.000Z</Initiated></Upload><IsTruncated>true</IsTruncated>"
                          "<NextKeyMarker>k1</NextKeyMarker><NextUploadIdMarker>u1</NextUploadIdMarker>"
                          "</ListMultipartUploadsResult>";
    T_ASSERT(list_text(uploads, &c, &truncated, next, err) == 0);
    T_ASSERT(c.n == 1 && strcmp(c.uploads[0], "u1") == 0 && truncated && strcmp(next, "k1") == 0);

    /* Refused: documents that would make the reader loop, expand or guess. */
    struct {
        const char *xml, *why;
    } bad[] = {
        {"<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>", "without the marker"},
        {"<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>", "without a Key"},
        {"<ListBucketResult><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>", "decimal"},
        {"<ListBucketResult><Contents><Key>a</Key><Size>99999999999999999999</Size></Contents></ListBucketResult>",
         "decimal"},
        {"<!DOCTYPE x [<!ENTITY a \"b\">]><ListBucketResult/>", "DOCTYPE"},
        {"<ListBucketResult><Contents></ListBucketResult>", "mismatched"},
        {"<ListBucketResult>", "ends inside"},
        {"<ListBucketResult>&bogus;</ListBucketResult>", "unknown entity"},
        {"<ListBucketResult>&#0;</ListBucketResult>", "character reference"},
        {"<ListBucketResult>&#xD800;</ListBucketResult>", "character reference"},
        {"<ListBucketResult/><ListBucketResult/>", "second root"},
        {"<ListBucketResult a=b/>", "unquoted"},
        {"<Other/>", "neither"},
        {"", "no root"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        T_ASSERT_MSG(list_text(bad[i].xml, &c, &truncated, next, err) < 0, "accepted: %s", bad[i].xml);
        T_ASSERT_MSG(strstr(err, bad[i].why), "%s: %s", bad[i].xml, err);
    }
    char deep[400] = "";
    for (int i = 0; i < 17; i++) strcat(deep, "<a>");
    for (int i = 0; i < 17; i++) strcat(deep, "</a>");
    T_ASSERT(ckptio__xml_walk(deep, strlen(deep), (ckptio__xml_fn)NULL, NULL, err, sizeof err) < 0);
    T_ASSERT(strstr(err, "too deep"));
    /* A key longer than S3 allows is refused, not cut. */
    size_t n = 1100;
    char *big = malloc(n + 200);
    strcpy(big, "<ListBucketResult><Contents><Key>");
    memset(big + strlen(big), 'k', 1025);
    strcpy(big + 33 + 1025, "</Key></Contents></ListBucketResult>");
    T_ASSERT(list_text(big, &c, &truncated, next, err) < 0 && strstr(err, "too long"));
    free(big);
}

int main(void) {
    T_RUN(test_sigv4_suite);
    T_RUN(test_sigv4_s3_examples);
    T_RUN(test_uri_and_urls);
    T_RUN(test_config_chain);
    T_RUN(test_xml);
    return T_EXIT_PASS;
}
