/*
 * s3_config.c - where requests go and who signs them: the endpoint, the
 * region, the addressing style and the credentials, resolved from the
 * environment and the AWS configuration files in the order the AWS CLI and
 * SDKs use (objstore_internal.h lists it). Secrets are copied into the
 * client only; messages say where the credentials came from, never what
 * they are.
 */
#include "objstore_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

void ckptio__s3_settings_default(ckptio__s3_settings *out) {
    *out = (ckptio__s3_settings){.concurrency = 16, .part_bytes = (uint64_t)16 << 20, .retries = 8,
                                 .timeout_ms = 30000, .deadline_ms = 300000, .backoff_ms = 200};
}

/* The AWS files are small; a larger one is not read (as if absent). */
#define INI_MAX (1u << 20)

/* Only a regular file is read: O_NONBLOCK so that a FIFO under the name is
 * never waited on (its fstat then refuses it). An EINTR is retried unless
 * the program asked the library to stop (ckptio_interrupt). */
static char *read_small_file(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return NULL;
    struct stat sb;
    char *text = NULL;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size < INI_MAX) {
        text = ckptio__malloc((size_t)sb.st_size + 1);
        size_t got = 0;
        while (text && got < (size_t)sb.st_size) {
            ssize_t n = read(fd, text + got, (size_t)sb.st_size - got);
            if (n < 0 && errno == EINTR && !ckptio__interrupt_requested()) continue;
            if (n <= 0) break;
            got += (size_t)n;
        }
        if (text) text[got] = '\0';
    }
    close(fd);
    return text;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = '\0';
    return s;
}

/* The value of `key` in section `section` of INI text (copied), or NULL.
 * An indented "k = v" under "parent =" is found as "parent.k". */
static char *ini_get(const char *text, const char *section, const char *key) {
    if (!text) return NULL;
    char *copy = ckptio__strdup(text);
    if (!copy) return NULL;
    char *result = NULL;
    bool in_section = false;
    char parent[64] = "";
    char *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line && !result; line = strtok_r(NULL, "\n", &save)) {
        const bool indented = *line == ' ' || *line == '\t';
        char *t = trim(line);
        if (!*t || *t == '#' || *t == ';') continue;
        if (*t == '[') {
            char *end = strchr(t, ']');
            if (end) *end = '\0';
            in_section = strcmp(trim(t + 1), section) == 0;
            parent[0] = '\0';
            continue;
        }
        char *eq = strchr(t, '=');
        if (!eq || !in_section) continue;
        *eq = '\0';
        char *name = trim(t), *value = trim(eq + 1);
        char full[160];
        if (indented && parent[0]) snprintf(full, sizeof full, "%s.%s", parent, name);
        else snprintf(full, sizeof full, "%s", name);
        if (!indented) snprintf(parent, sizeof parent, "%s", *value ? "" : name);
        if (strcmp(full, key) == 0) result = ckptio__strdup(value);
    }
    ckptio__free(copy);
    return result;
}

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

typedef struct profile_files {
    char *cred_path, *config_path;
    char *cred, *config; /* texts, or NULL */
    char profile[128];
    char config_section[160];
} profile_files;

static void files_load(profile_files *p) {
    const char *home = env("HOME");
    const char *cp = env("AWS_SHARED_CREDENTIALS_FILE"), *fp = env("AWS_CONFIG_FILE");
    char buf[4096];
    if (cp) p->cred_path = ckptio__strdup(cp);
    else if (home && snprintf(buf, sizeof buf, "%s/.aws/credentials", home) < (int)sizeof buf)
        p->cred_path = ckptio__strdup(buf);
    if (fp) p->config_path = ckptio__strdup(fp);
    else if (home && snprintf(buf, sizeof buf, "%s/.aws/config", home) < (int)sizeof buf)
        p->config_path = ckptio__strdup(buf);
    if (p->cred_path) p->cred = read_small_file(p->cred_path);
    if (p->config_path) p->config = read_small_file(p->config_path);
    const char *name = env("AWS_PROFILE");
    if (!name) name = env("AWS_DEFAULT_PROFILE");
    if (!name) name = "default";
    snprintf(p->profile, sizeof p->profile, "%s", name);
    if (strcmp(p->profile, "default") == 0) snprintf(p->config_section, sizeof p->config_section, "default");
    else snprintf(p->config_section, sizeof p->config_section, "profile %s", p->profile);
}

static void files_free(profile_files *p) {
    if (p->cred) explicit_bzero(p->cred, strlen(p->cred));
    ckptio__free(p->cred);
    ckptio__free(p->config);
    ckptio__free(p->cred_path);
    ckptio__free(p->config_path);
}

/* The profile's setting from the config file. */
static char *config_get(const profile_files *p, const char *key) {
    return ini_get(p->config, p->config_section, key);
}

void ckptio__s3_client_destroy(ckptio__s3_client *c) {
    if (!c) return;
    if (c->secret_key) explicit_bzero(c->secret_key, strlen(c->secret_key));
    if (c->session_token) explicit_bzero(c->session_token, strlen(c->session_token));
    ckptio__free(c->scheme);
    ckptio__free(c->host);
    ckptio__free(c->base_path);
    ckptio__free(c->access_key);
    ckptio__free(c->secret_key);
    ckptio__free(c->session_token);
    ckptio__free(c->ca_file);
    ckptio__free(c->where);
    ckptio__free(c);
}

static char tolower_ascii(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

/* Splits "scheme://host[:port][/base]" into the client. */
static ckptio_status set_endpoint(ckptio__s3_client *c, const char *url, const char *from) {
    const char *sep = strstr(url, "://");
    if (!sep || (strncasecmp(url, "http", 4) != 0) || (sep - url != 4 && sep - url != 5) ||
        (sep - url == 5 && tolower_ascii(url[4]) != 's'))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "the S3 endpoint \"%.200s\" (from %s) is not an http:// or https:// URL",
                           url, from);
    const char *host = sep + 3;
    const char *path = strchr(host, '/');
    const size_t hlen = path ? (size_t)(path - host) : strlen(host);
    if (!hlen || hlen > 255 || memchr(host, '@', hlen) || strpbrk(url, " \t\r\n"))
        return CKPTIO_FAIL(CKPTIO_E_INVAL, "the S3 endpoint \"%.200s\" (from %s) has no valid host", url, from);
    c->scheme = ckptio__malloc((size_t)(sep - url) + 1);
    c->host = ckptio__malloc(hlen + 1);
    c->base_path = ckptio__strdup(path ? path : "");
    if (!c->scheme || !c->host || !c->base_path) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
    for (size_t i = 0; i < (size_t)(sep - url); i++) c->scheme[i] = tolower_ascii(url[i]);
    c->scheme[sep - url] = '\0';
    memcpy(c->host, host, hlen);
    c->host[hlen] = '\0';
    size_t bl = strlen(c->base_path);
    while (bl && c->base_path[bl - 1] == '/') c->base_path[--bl] = '\0';
    return CKPTIO_OK;
}

static bool dns_safe(const char *bucket) {
    if (!bucket) return false;
    for (const char *b = bucket; *b; b++)
        if (*b == '.') return false; /* dots break the TLS certificate's wildcard */
    return true;
}

ckptio_status ckptio__s3_client_create(const ckptio__s3_settings *settings, const char *bucket,
                                       ckptio__s3_client **out) {
    *out = NULL;
    ckptio__s3_client *c = ckptio__calloc(1, sizeof *c);
    if (!c) return CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for an S3 client");
    c->settings = *settings;
    profile_files p = {0};
    files_load(&p);
    ckptio_status st = CKPTIO_OK;
    char *v = NULL;

    /* Region. */
    const char *region = env("AWS_REGION");
    if (!region) region = env("AWS_DEFAULT_REGION");
    if (!region) region = v = config_get(&p, "region");
    snprintf(c->region, sizeof c->region, "%s", region ? region : "us-east-1");
    ckptio__free(v);
    v = NULL;
    for (const char *r = c->region; *r; r++)
        if (!((*r >= 'a' && *r <= 'z') || (*r >= '0' && *r <= '9') || *r == '-')) {
            st = CKPTIO_FAIL(CKPTIO_E_INVAL, "the AWS region \"%s\" is not a region name ([a-z0-9-])", c->region);
            goto out;
        }

    /* Endpoint. */
    const char *ignore = env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS");
    const bool use_configured = !(ignore && strcasecmp(ignore, "true") == 0);
    const char *endpoint = NULL, *from = NULL;
    if (use_configured && (endpoint = env("AWS_ENDPOINT_URL_S3"))) from = "AWS_ENDPOINT_URL_S3";
    else if (use_configured && (endpoint = env("AWS_ENDPOINT_URL"))) from = "AWS_ENDPOINT_URL";
    else if (use_configured && (endpoint = v = config_get(&p, "endpoint_url"))) from = "the profile's endpoint_url";
    bool aws = false;
    char def[160];
    if (!endpoint) {
        snprintf(def, sizeof def, "https://s3.%s.amazonaws.com", c->region);
        endpoint = def;
        from = "the region";
        aws = true;
    }
    if ((st = set_endpoint(c, endpoint, from)) != CKPTIO_OK) goto out;
    ckptio__free(v);
    v = NULL;
    /* Bodies are hashed into the signature over plain HTTP (integrity without
     * TLS, as the AWS SDKs do); CKPTIO_S3_SIGN_PAYLOAD=on|off overrides. */
    const char *sign = env("CKPTIO_S3_SIGN_PAYLOAD");
    if (sign && strcasecmp(sign, "on") && strcasecmp(sign, "off") && strcasecmp(sign, "auto")) {
        st = CKPTIO_FAIL(CKPTIO_E_INVAL, "CKPTIO_S3_SIGN_PAYLOAD=\"%.40s\" is not auto, on or off", sign);
        goto out;
    }
    c->sign_payload = sign && !strcasecmp(sign, "on")    ? true
                      : sign && !strcasecmp(sign, "off") ? false
                                                         : strcmp(c->scheme, "http") == 0;

    /* Addressing. */
    const char *style = env("CKPTIO_S3_ADDRESSING");
    if (!style) style = v = config_get(&p, "s3.addressing_style");
    if (style && strcasecmp(style, "path") == 0) c->addressing = CKPTIO__S3_PATH_STYLE;
    else if (style && strcasecmp(style, "virtual") == 0) c->addressing = CKPTIO__S3_VIRTUAL_HOSTED;
    else if (style && *style && strcasecmp(style, "auto") != 0) {
        st = CKPTIO_FAIL(CKPTIO_E_INVAL, "the S3 addressing style \"%.40s\" is not path, virtual or auto", style);
        goto out;
    } else
        c->addressing = aws && dns_safe(bucket) ? CKPTIO__S3_VIRTUAL_HOSTED : CKPTIO__S3_PATH_STYLE;
    ckptio__free(v);
    v = NULL;

    /* Credentials. */
    const char *ak = env("AWS_ACCESS_KEY_ID"), *sk = env("AWS_SECRET_ACCESS_KEY");
    char where[600];
    if (ak && sk) {
        c->access_key = ckptio__strdup(ak);
        c->secret_key = ckptio__strdup(sk);
        const char *tok = env("AWS_SESSION_TOKEN");
        if (tok) c->session_token = ckptio__strdup(tok);
        snprintf(where, sizeof where, "the environment (AWS_ACCESS_KEY_ID)");
    } else {
        const char *text = NULL, *path = NULL, *section = NULL;
        char *a = ini_get(p.cred, p.profile, "aws_access_key_id");
        if (a) {
            text = p.cred, path = p.cred_path, section = p.profile;
        } else if ((a = ini_get(p.config, p.config_section, "aws_access_key_id"))) {
            text = p.config, path = p.config_path, section = p.config_section;
        }
        if (!a) {
            st = CKPTIO_FAIL(CKPTIO_E_PERMISSION,
                             "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile "
                             "\"%s\" an aws_access_key_id in %s or %s",
                             p.profile, p.cred_path ? p.cred_path : "~/.aws/credentials",
                             p.config_path ? p.config_path : "~/.aws/config");
            goto out;
        }
        c->access_key = a;
        c->secret_key = ini_get(text, section, "aws_secret_access_key");
        c->session_token = ini_get(text, section, "aws_session_token");
        if (!c->secret_key) {
            st = CKPTIO_FAIL(CKPTIO_E_PERMISSION, "profile \"%s\" in %s has an access key but no aws_secret_access_key",
                             p.profile, path);
            goto out;
        }
        snprintf(where, sizeof where, "profile \"%s\" in %s", p.profile, path);
    }
    c->where = ckptio__strdup(where);
    if (!c->access_key || !c->secret_key || !c->where) {
        st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory for S3 credentials");
        goto out;
    }
    const char *ca = env("AWS_CA_BUNDLE");
    if (!ca) ca = env("CURL_CA_BUNDLE");
    if (!ca) ca = env("SSL_CERT_FILE");
    /* The wheel's libcurl was built for Debian's bundle path; other
     * distributions keep theirs elsewhere. */
    static const char *const bundles[] = {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                                          "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"};
    for (size_t i = 0; !ca && strcmp(c->scheme, "https") == 0 && i < sizeof bundles / sizeof *bundles; i++)
        if (access(bundles[i], R_OK) == 0) ca = bundles[i];
    if (ca && !(c->ca_file = ckptio__strdup(ca))) st = CKPTIO_FAIL(CKPTIO_E_NOMEM, "out of memory");
out:
    ckptio__free(v);
    files_free(&p);
    if (st != CKPTIO_OK) {
        ckptio__s3_client_destroy(c);
        return st;
    }
    *out = c;
    return CKPTIO_OK;
}
