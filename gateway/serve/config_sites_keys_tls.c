/*
 * Region config (docs/config.md): the sections that say whom the gateway
 * talks to and who may talk to it: sites[] (url, models, api_key, tls),
 * api_keys (strings or objects with a policy) and the listener's tls.
 * config.c parses the rest and calls these in its order; the getters and
 * messages are config_read.c's (config_internal.h).
 */
#include "infergate/config.h"
#include "infergate/error.h"
#include "infergate/proxy.h"

#include "config_internal.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* http://HOST[:PORT][/BASE]; fills host, port and base of the site. */
static int parse_url(ctx_t *c, const char *path, const char *url, ig_config_site_t *site)
{
    const char *p = url;
    site->https = strncmp(p, "https://", 8) == 0;
    if (strncmp(p, "http://", 7) != 0 && !site->https)
        return ig__config_fail(c, path, "'%s': must start with http:// or https://", url);
    p += site->https ? 8 : 7;
    if (strpbrk(p, "?#@ ") != NULL)
        return ig__config_fail(
            c, path, "'%s': must not contain a query, fragment, user info or spaces", url);
    const char *slash = strchr(p, '/');
    size_t alen = slash ? (size_t)(slash - p) : strlen(p);
    const char *host = p, *hend, *port = NULL;
    if (alen > 0 && p[0] == '[') {
        const char *rb = memchr(p, ']', alen);
        if (rb == NULL)
            return ig__config_fail(c, path, "'%s': unterminated IPv6 address", url);
        host = p + 1;
        hend = rb;
        if (rb + 1 < p + alen) {
            if (rb[1] != ':')
                return ig__config_fail(c, path, "'%s': junk after the IPv6 address", url);
            port = rb + 2;
        }
    } else {
        const char *colon = memchr(p, ':', alen);
        hend = colon ? colon : p + alen;
        port = colon ? colon + 1 : NULL;
    }
    if (hend == host)
        return ig__config_fail(c, path, "'%s': the host is empty", url);
    for (const char *h = host; h < hend; h++) {
        if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') ||
              *h == '.' || *h == '-' || (host != p && *h == ':')))
            return ig__config_fail(c, path, "'%s': invalid character in the host", url);
    }
    site->port = site->https ? 443 : 80;
    if (port != NULL) {
        long v = 0;
        const char *q = port;
        for (; q < p + alen && *q >= '0' && *q <= '9' && v <= 65535; q++)
            v = v * 10 + (*q - '0');
        if (q == port || q != p + alen || v < 1 || v > 65535)
            return ig__config_fail(c, path, "'%s': the port must be a number from 1 to 65535", url);
        site->port = (int)v;
    }
    site->host = strndup(host, (size_t)(hend - host));
    /* The base path keeps no trailing '/', so base + "/v1/..." is always right. */
    const char *base = slash ? slash : "";
    size_t blen = strlen(base);
    while (blen > 0 && base[blen - 1] == '/')
        blen--;
    site->base = strndup(base, blen);
    size_t ulen = strlen(url);
    while (ulen > (site->https ? 8u : 7u) && url[ulen - 1] == '/')
        ulen--;
    site->url = strndup(url, ulen);
    if (site->host == NULL || site->base == NULL || site->url == NULL)
        return IG_ENOMEM;
    return 0;
}

/* Checks one entry of a string array against the entries before it. */
typedef int (*check_string_fn)(ctx_t *c, const char *path, const char *s, char *const *prev,
                               size_t nprev, const ig_config_t *cfg);

/* An array of strings at path: *out gets a copy of each (and a NULL after
 * them), *n counts the copies made, for ig_config_dispose(). */
static int parse_strings(ctx_t *c, json_t *arr, const char *path, check_string_fn check,
                         const ig_config_t *cfg, char ***out, size_t *n)
{
    *out = calloc(json_array_size(arr) + 1, sizeof(char *));
    if (*out == NULL)
        return IG_ENOMEM;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        char p[PATH_MAX_LEN];
        json_t *v = json_array_get(arr, i);
        ig_jsonv_join_index(p, path, i);
        if (!json_is_string(v))
            return ig__config_fail(c, p, "must be a string");
        const char *s = json_string_value(v);
        int rc = check(c, p, s, *out, i, cfg);
        if (rc != 0)
            return rc;
        (*out)[i] = strdup(s);
        *n = i + 1;
        if ((*out)[i] == NULL)
            return IG_ENOMEM;
    }
    return 0;
}

static int check_site_model(ctx_t *c, const char *path, const char *name, char *const *prev,
                            size_t nprev, const ig_config_t *cfg)
{
    /* A site may serve models that models[] does not list: models[] is
     * for what local pools serve (and site-only names clients may ask). */
    (void)cfg;
    int rc = ig__config_check_name(c, path, name);
    if (rc != 0)
        return rc;
    for (size_t j = 0; j < nprev; j++) {
        if (strcmp(prev[j], name) == 0)
            return ig__config_fail(c, path, "duplicate model '%s'", name);
    }
    return 0;
}

/* sites[].tls {ca_file, server_name, insecure}: only for https:// urls. */
static int parse_site_tls(ctx_t *c, json_t *site_obj, const char *p, ig_config_site_t *site)
{
    static const char *const keys[] = {"ca_file", "server_name", "insecure", NULL};
    char q[PATH_MAX_LEN], r[PATH_MAX_LEN];
    char *raw = NULL;
    json_t *o;
    int rc = ig__config_get_object(c, site_obj, p, "tls", &o);
    if (rc != 0 || o == NULL)
        return rc;
    ig_jsonv_join(q, p, "tls");
    if (!site->https)
        return ig__config_fail(c, q, "needs an https:// url");
    if ((rc = ig__config_check_keys(c, o, q, keys)) ||
        (rc = ig__config_get_string(c, o, q, "server_name", STR_NONEMPTY, NULL,
                                    &site->tls.server_name)) ||
        (rc = ig__config_get_bool(c, o, q, "insecure", 0, &site->tls.insecure)) ||
        (rc = ig__config_get_string(c, o, q, "ca_file", STR_NONEMPTY, NULL, &raw)))
        return rc;
    if (raw != NULL) {
        ig_jsonv_join(r, q, "ca_file");
        rc = ig__config_expand_path(c, r, raw, &site->tls.ca_file);
        free(raw);
    }
    return rc;
}

int ig__config_parse_price(ctx_t *c, json_t *o, const char *p, ig_price_t *price)
{
    static const char *const keys[] = {"per_hour", "per_1m_input_tokens", "per_1m_output_tokens",
                                       NULL};
    json_t *po;
    char q[PATH_MAX_LEN];
    int rc;
    memset(price, 0, sizeof(*price));
    if ((rc = ig__config_get_object(c, o, p, "price", &po)) != 0 || po == NULL)
        return rc;
    ig_jsonv_join(q, p, "price");
    if ((rc = ig__config_check_keys(c, po, q, keys)) != 0)
        return rc;
    int hourly = json_object_get(po, "per_hour") != NULL;
    int in = json_object_get(po, "per_1m_input_tokens") != NULL;
    int out = json_object_get(po, "per_1m_output_tokens") != NULL;
    if (!hourly && !in && !out)
        return ig__config_fail(c, q,
                               "a price needs its unit: per_hour, or per_1m_input_tokens and "
                               "per_1m_output_tokens (USD)");
    if (hourly && (in || out))
        return ig__config_fail(c, q, "either per_hour or per-token prices, not both");
    if (!hourly && !(in && out)) {
        char k[PATH_MAX_LEN];
        ig_jsonv_join(k, q, in ? "per_1m_output_tokens" : "per_1m_input_tokens");
        return ig__config_fail(c, k, "is required with %s",
                               in ? "per_1m_input_tokens" : "per_1m_output_tokens");
    }
    if (hourly) {
        price->kind = IG_PRICE_PER_HOUR;
        return ig__config_get_number(c, po, q, "per_hour", 0, INFINITY, 0, 0, &price->per_hour);
    }
    price->kind = IG_PRICE_PER_TOKEN;
    if ((rc = ig__config_get_number(c, po, q, "per_1m_input_tokens", 0, INFINITY, 0, 0,
                                    &price->per_1m_input)) != 0)
        return rc;
    return ig__config_get_number(c, po, q, "per_1m_output_tokens", 0, INFINITY, 0, 0,
                                 &price->per_1m_output);
}

int ig__config_parse_site(ctx_t *c, json_t *o, const char *p, ig_config_t *cfg, size_t idx)
{
    static const char *const keys[] = {"name",    "url", "region", "models",
                                       "api_key", "tls", "price",  NULL};
    ig_config_site_t *site = &cfg->sites[idx];
    char q[PATH_MAX_LEN];
    char *url = NULL;
    json_t *arr;
    int rc;
    if ((rc = ig__config_check_keys(c, o, p, keys)) ||
        (rc = ig__config_get_string(c, o, p, "name", STR_REQUIRED | STR_NAME, NULL, &site->name)))
        return rc;
    /* Pools and sites are both upstreams: one namespace for the route header. */
    int prev = ig__config_find_name(&cfg->sites[0].name, sizeof(*cfg->sites), idx, site->name);
    ig_jsonv_join(q, p, "name");
    if (prev >= 0)
        return ig__config_fail(c, q, "duplicate name '%s' (also sites[%d].name)", site->name, prev);
    prev = cfg->pools == NULL ? -1
                              : ig__config_find_name(&cfg->pools[0].name, sizeof(*cfg->pools),
                                                     cfg->npools, site->name);
    if (prev >= 0)
        return ig__config_fail(c, q, "duplicate name '%s' (also pools[%d].name)", site->name, prev);
    if ((rc = ig__config_get_string(c, o, p, "url", STR_REQUIRED | STR_NONEMPTY, NULL, &url)) != 0)
        return rc;
    ig_jsonv_join(q, p, "url");
    rc = parse_url(c, q, url, site);
    free(url);
    if (rc != 0 ||
        (rc = ig__config_get_string(c, o, p, "region", STR_NAME, "", &site->region)) != 0)
        return rc;
    if ((rc = ig__config_get_array(c, o, p, "models", &arr)) != 0)
        return rc;
    ig_jsonv_join(q, p, "models");
    /* Without a list, the models are discovered from the site's /load or
     * /v1/models. */
    if (arr != NULL && json_array_size(arr) == 0)
        return ig__config_fail(c, q, "must not be empty");
    if ((arr != NULL &&
         (rc = parse_strings(c, arr, q, check_site_model, cfg, &site->models, &site->nmodels))) ||
        (rc = ig__config_get_string(c, o, p, "api_key", STR_NONEMPTY, NULL, &site->api_key)) ||
        (rc = ig__config_parse_price(c, o, p, &site->price)))
        return rc;
    if (site->api_key != NULL && strpbrk(site->api_key, "\r\n") != NULL) {
        ig_jsonv_join(q, p, "api_key");
        return ig__config_fail(c, q, "must not contain CR or LF");
    }
    return parse_site_tls(c, o, p, site);
}

static int check_api_key(ctx_t *c, const char *path, const char *key, char *const *prev,
                         size_t nprev, const ig_config_t *cfg)
{
    (void)cfg;
    int rc = ig__config_check_name(c, path, key);
    for (size_t j = 0; rc == 0 && j < nprev; j++) {
        /* The key itself never goes into a message: messages end up in logs. */
        if (strcmp(prev[j], key) == 0)
            return ig__config_fail(c, path, "duplicate key (also api_keys[%zu])", j);
    }
    return rc;
}

static int parse_key_object(ctx_t *c, json_t *o, const char *p, ig_config_t *cfg, size_t i)
{
    static const char *const keys[] = {"key",   "name",       "peer",          "requests_per_s",
                                       "burst", "models",     "priority",      "tokens_per_min",
                                       "admin", "budget_usd", "budget_period", NULL};
    static const char *const periods[] = {"hour", "day", "month", NULL};
    static const char *const prios[] = {"critical", "standard", "sheddable", NULL};
    ig_config_key_t *k = &cfg->keys[i];
    char q[PATH_MAX_LEN];
    json_t *arr;
    int rc;
    if ((rc = ig__config_check_keys(c, o, p, keys)) ||
        (rc = ig__config_get_string(c, o, p, "key", STR_REQUIRED | STR_NONEMPTY, NULL,
                                    &cfg->api_keys[i])))
        return rc;
    ig_jsonv_join(q, p, "key");
    if ((rc = check_api_key(c, q, cfg->api_keys[i], cfg->api_keys, i, cfg)) ||
        (rc = ig__config_get_string(c, o, p, "name", STR_NAME, NULL, &k->name)) ||
        (rc = ig__config_get_bool(c, o, p, "peer", 0, &k->peer)) ||
        (rc = ig__config_get_number(c, o, p, "requests_per_s", 0, INFINITY, NUM_CLOSED, 0,
                                    &k->requests_per_s)) ||
        (rc = ig__config_get_number(c, o, p, "burst", 0, INFINITY, NUM_CLOSED, 0, &k->burst)) ||
        (rc = ig__config_get_number(c, o, p, "tokens_per_min", 0, INFINITY, NUM_CLOSED, 0,
                                    &k->tokens_per_min)) ||
        (rc =
             ig__config_get_enum(c, o, p, "priority", prios, IG_PRIORITY_STANDARD, &k->priority)) ||
        (rc = ig__config_get_bool(c, o, p, "admin", 0, &k->admin)) ||
        (rc = ig__config_get_number(c, o, p, "budget_usd", 0, INFINITY, NUM_CLOSED, 0,
                                    &k->budget_usd)) ||
        (rc = ig__config_get_enum(c, o, p, "budget_period", periods, IG_BUDGET_MONTH,
                                  &k->budget_period)) ||
        (rc = ig__config_get_array(c, o, p, "models", &arr)))
        return rc;
    if (arr == NULL)
        return 0;
    ig_jsonv_join(q, p, "models");
    return parse_strings(c, arr, q, check_site_model, cfg, &k->models, &k->nmodels);
}

/* Entries are the key as a string (no limits, standard priority) or an
 * object with its policy. */
int ig__config_parse_api_keys(ctx_t *c, json_t *root, ig_config_t *cfg)
{
    json_t *arr;
    cfg->admin_open = 1;
    int rc = ig__config_get_array(c, root, "", "api_keys", &arr);
    if (rc != 0 || arr == NULL)
        return rc;
    size_t n = json_array_size(arr);
    cfg->api_keys = calloc(n + 1, sizeof(char *));
    cfg->keys = calloc(n + 1, sizeof(*cfg->keys));
    if (cfg->api_keys == NULL || cfg->keys == NULL)
        return IG_ENOMEM;
    int any_admin = 0;
    for (size_t i = 0; i < n; i++) {
        char p[PATH_MAX_LEN];
        json_t *v = json_array_get(arr, i);
        ig_config_key_t *k = &cfg->keys[i];
        ig_jsonv_join_index(p, "api_keys", i);
        cfg->napi_keys = i + 1;
        k->priority = IG_PRIORITY_STANDARD;
        if (json_is_string(v)) {
            const char *s = json_string_value(v);
            if ((rc = check_api_key(c, p, s, cfg->api_keys, i, cfg)) != 0)
                return rc;
            if ((cfg->api_keys[i] = strdup(s)) == NULL)
                return IG_ENOMEM;
        } else if (json_is_object(v)) {
            if ((rc = parse_key_object(c, v, p, cfg, i)) != 0)
                return rc;
        } else {
            return ig__config_fail(c, p, "must be a string or an object");
        }
        if (k->name == NULL) {
            char name[32];
            snprintf(name, sizeof(name), "key-%zu", i);
            if ((k->name = strdup(name)) == NULL)
                return IG_ENOMEM;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(cfg->keys[j].name, k->name) == 0)
                return ig__config_fail(c, p, "duplicate name '%s' (also api_keys[%zu])", k->name,
                                       j);
        }
        any_admin |= k->admin;
    }
    cfg->admin_open = !any_admin;
    return 0;
}

int ig__config_parse_tls(ctx_t *c, json_t *root, ig_config_t *cfg)
{
    static const char *const keys[] = {"cert_file", "key_file", "handshake_timeout_ms", NULL};
    char *raw = NULL;
    json_t *o;
    int rc = ig__config_get_object(c, root, "", "tls", &o);
    if (rc != 0 || o == NULL)
        return rc;
    if ((rc = ig__config_check_keys(c, o, "tls", keys)) ||
        (rc = ig__config_get_uint(c, o, "tls", "handshake_timeout_ms", 1, DAY_MS, 10000,
                                  &cfg->tls.handshake_timeout_ms)) ||
        (rc = ig__config_get_string(c, o, "tls", "cert_file", STR_REQUIRED | STR_NONEMPTY, NULL,
                                    &raw)) ||
        (rc = ig__config_expand_path(c, "tls.cert_file", raw, &cfg->tls.cert_file)))
        goto done;
    free(raw);
    raw = NULL;
    if ((rc = ig__config_get_string(c, o, "tls", "key_file", STR_REQUIRED | STR_NONEMPTY, NULL,
                                    &raw)) ||
        (rc = ig__config_expand_path(c, "tls.key_file", raw, &cfg->tls.key_file)))
        goto done;
    if (strncmp(cfg->listen, "unix:", 5) == 0)
        rc = ig__config_fail(c, "tls", "needs a TCP listen address, not '%s'", cfg->listen);
done:
    free(raw);
    return rc;
}
