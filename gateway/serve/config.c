/*
 * Region config: JSON (jansson) into ig_config_t, with every key checked.
 *
 * Each parse_* function handles one JSON object: it rejects unknown keys
 * first, then reads each known key with a default, then checks the
 * relations between keys. The first error wins: it is formatted as
 * "FILE: JSON.PATH: problem" into the caller's buffer and IG_ECONFIG is
 * returned all the way up, where the half-built struct is disposed.
 */
#include "infergate/autoscale.h"
#include "infergate/config.h"
#include "infergate/engine.h" /* ig_engine_kv_dtype_parse */
#include "infergate/error.h"
#include "infergate/jsonv.h"
#include "infergate/log.h"
#include "infergate/proxy.h"
#include "infergate/scheduler.h" /* IG_SCHED_ITL_TARGET_MS */

#include "config_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

/* ig__config_fail at PATH.KEY: for a value the getters read and a later
 * check refused. */
static int fail_at(ctx_t *c, const char *path, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_at(ctx_t *c, const char *path, const char *key, const char *fmt, ...)
{
    char q[PATH_MAX_LEN], msg[512];
    ig_jsonv_join(q, path, key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return ig__config_fail(c, q, "%s", msg);
}

/* ---- addresses ---------------------------------------------------------- */

int ig_config_check_listen(const char *listen, char *err, size_t errlen)
{
    char host[64];
    if (strncmp(listen, "unix:", 5) == 0) {
        size_t n = strlen(listen + 5);
        if (n == 0) {
            snprintf(err, errlen, "'%s': the unix socket path is empty", listen);
            return IG_EINVAL;
        }
        if (n >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            snprintf(err, errlen, "'%s': the unix socket path is longer than %zu bytes", listen,
                     sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
            return IG_EINVAL;
        }
        return 0;
    }
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || colon == listen || colon[1] == '\0') {
        snprintf(err, errlen, "'%s': must be HOST:PORT or unix:PATH", listen);
        return IG_EINVAL;
    }
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end != '\0' || colon[1] < '0' || colon[1] > '9' || errno != 0 || port > 65535) {
        snprintf(err, errlen, "'%s': the port must be a number from 0 to 65535", listen);
        return IG_EINVAL;
    }
    size_t hlen = (size_t)(colon - listen);
    unsigned char buf[16];
    int ok;
    if (listen[0] == '[') {
        ok = hlen >= 3 && listen[hlen - 1] == ']' && hlen - 2 < sizeof(host);
        if (ok) {
            memcpy(host, listen + 1, hlen - 2);
            host[hlen - 2] = '\0';
            ok = inet_pton(AF_INET6, host, buf) == 1;
        }
    } else {
        ok = hlen < sizeof(host);
        if (ok) {
            memcpy(host, listen, hlen);
            host[hlen] = '\0';
            ok = inet_pton(AF_INET, host, buf) == 1;
        }
    }
    if (!ok) {
        snprintf(err, errlen, "'%s': the host must be an IPv4 address or a bracketed IPv6 address",
                 listen);
        return IG_EINVAL;
    }
    return 0;
}

/* ---- sections ----------------------------------------------------------- */

/* A section: *out is a new reference to the object at key, or to an empty
 * object where the key is absent, so that every default applies; its keys
 * must be among allowed. Its path goes into sp (PATH_MAX_LEN bytes). */
static int get_section(ctx_t *c, json_t *obj, const char *path, const char *key,
                       const char *const *allowed, char *sp, json_t **out)
{
    json_t *o;
    ig_jsonv_join(sp, path, key);
    int rc = ig__config_get_object(c, obj, path, key, &o);
    *out = NULL;
    if (rc != 0)
        return rc;
    *out = o == NULL ? json_object() : json_incref(o);
    if (*out == NULL)
        return IG_ENOMEM;
    if ((rc = ig__config_check_keys(c, *out, sp, allowed)) != 0) {
        json_decref(*out);
        *out = NULL;
    }
    return rc;
}

static int get_unsigned(ctx_t *c, json_t *obj, const char *path, const char *key, unsigned lo,
                        unsigned hi, unsigned def, unsigned *out)
{
    uint64_t x;
    int rc = ig__config_get_uint(c, obj, path, key, lo, hi, def, &x);
    *out = (unsigned)x;
    return rc;
}

static int get_size(ctx_t *c, json_t *obj, const char *path, const char *key, size_t lo, size_t hi,
                    size_t def, size_t *out)
{
    uint64_t x;
    int rc = ig__config_get_uint(c, obj, path, key, lo, hi, def, &x);
    *out = (size_t)x;
    return rc;
}

static int parse_log(ctx_t *c, json_t *root, ig_config_t *cfg)
{
    static const char *const keys[] = {"level", "format", NULL};
    static const char *const levels[] = {"debug", "info", "warn", "error", NULL};
    static const char *const formats[] = {"text", "json", NULL};
    json_t *o;
    int rc = ig__config_get_object(c, root, "", "log", &o);
    cfg->log.level = IG_LOG_INFO;
    cfg->log.format = IG_LOG_TEXT;
    if (rc != 0 || o == NULL)
        return rc;
    if ((rc = ig__config_check_keys(c, o, "log", keys)) != 0 ||
        (rc = ig__config_get_enum(c, o, "log", "level", levels, IG_LOG_INFO, &cfg->log.level)) !=
            0 ||
        (rc = ig__config_get_enum(c, o, "log", "format", formats, IG_LOG_TEXT, &cfg->log.format)) !=
            0)
        return rc;
    return 0;
}

/* limits.max_queue_wait_ms: one number for every priority, or an object
 * {critical, standard, sheddable}. */
static int parse_queue_wait(ctx_t *c, json_t *limits, ig_config_limits_t *l)
{
    static const char *const prios[] = {"critical", "standard", "sheddable", NULL};
    const char *p = "limits.max_queue_wait_ms";
    json_t *v = json_object_get(limits, "max_queue_wait_ms");
    int rc;
    if (v == NULL || !json_is_object(v)) {
        uint64_t all;
        rc = ig__config_get_uint(c, limits, "limits", "max_queue_wait_ms", 0, DAY_MS, 0, &all);
        for (int i = 0; i < 3; i++)
            l->max_queue_wait_ms[i] = all;
        return rc;
    }
    if ((rc = ig__config_check_keys(c, v, p, prios)) != 0)
        return rc;
    for (int i = 0; i < 3; i++) {
        if ((rc = ig__config_get_uint(c, v, p, prios[i], 0, DAY_MS, 0, &l->max_queue_wait_ms[i])) !=
            0)
            return rc;
    }
    return 0;
}

static int parse_limits(ctx_t *c, json_t *root, ig_config_t *cfg)
{
    static const char *const keys[] = {
        "max_request_line",    "max_header_bytes",   "max_headers",
        "max_body_bytes",      "header_timeout_ms",  "body_timeout_ms",
        "idle_timeout_ms",     "max_connections",    "max_pipeline",
        "write_buffer_bytes",  "max_buffered_bytes", "max_chunk_ext_bytes",
        "max_chunk_ext_total", "drain_timeout_ms",   "drain_grace_ms",
        "max_prompt_tokens",   "max_queue_wait_ms",  NULL};
    ig_config_limits_t *l = &cfg->limits;
    ig_http_limits_t *h = &l->http;
    char p[PATH_MAX_LEN];
    json_t *o;
    int rc = get_section(c, root, "", "limits", keys, p, &o);
    if (rc != 0)
        return rc;
    /* The HTTP defaults are ig_http_limits_default()'s; nothing else says them. */
    ig_http_limits_t d;
    ig_http_limits_default(&d);
    if ((rc = get_size(c, o, p, "max_request_line", 64, 1u << 20, d.max_request_line,
                       &h->max_request_line)) ||
        (rc = get_size(c, o, p, "max_header_bytes", 256, 16u << 20, d.max_header_bytes,
                       &h->max_header_bytes)) ||
        (rc = get_unsigned(c, o, p, "max_headers", 1, 10000, d.max_headers, &h->max_headers)) ||
        (rc = get_size(c, o, p, "max_body_bytes", 1, 1u << 30, d.max_body_bytes,
                       &h->max_body_bytes)) ||
        (rc = ig__config_get_uint(c, o, p, "header_timeout_ms", 1, DAY_MS, d.header_timeout_ms,
                                  &h->header_timeout_ms)) ||
        (rc = ig__config_get_uint(c, o, p, "body_timeout_ms", 1, DAY_MS, d.body_timeout_ms,
                                  &h->body_timeout_ms)) ||
        (rc = ig__config_get_uint(c, o, p, "idle_timeout_ms", 1, DAY_MS, d.idle_timeout_ms,
                                  &h->idle_timeout_ms)) ||
        (rc = get_unsigned(c, o, p, "max_connections", 1, 1000000, d.max_connections,
                           &h->max_connections)) ||
        (rc = get_unsigned(c, o, p, "max_pipeline", 1, 1024, d.max_pipeline, &h->max_pipeline)) ||
        (rc = get_size(c, o, p, "write_buffer_bytes", 1024, 1u << 30, d.write_buffer_bytes,
                       &h->write_buffer_bytes)) ||
        (rc = get_size(c, o, p, "max_buffered_bytes", 1u << 20, 1ull << 40, d.max_buffered_bytes,
                       &h->max_buffered_bytes)) ||
        (rc = get_size(c, o, p, "max_chunk_ext_bytes", 1, 65536, d.max_chunk_ext_bytes,
                       &h->max_chunk_ext_bytes)) ||
        (rc = get_size(c, o, p, "max_chunk_ext_total", 1, 16u << 20, d.max_chunk_ext_total,
                       &h->max_chunk_ext_total)) ||
        (rc = ig__config_get_uint(c, o, p, "drain_timeout_ms", 0, DAY_MS, 30000,
                                  &l->drain_timeout_ms)) ||
        (rc =
             ig__config_get_uint(c, o, p, "drain_grace_ms", 0, DAY_MS, 5000, &l->drain_grace_ms)) ||
        (rc = get_unsigned(c, o, p, "max_prompt_tokens", 0, 1u << 24, 0, &l->max_prompt_tokens)) ||
        (rc = parse_queue_wait(c, o, l)))
        goto done;
done:
    json_decref(o);
    return rc;
}

/*
 * The routing defaults are those of the modules that use them:
 * ig_router_opts_default(), ig_proxy_opts_default() and
 * ig_upstream_opts_default(). Three are the gateway's own and are said
 * here only (docs/config.md lists them): routing.eject.base_ejection_s
 * (30 s; the router's library default is 2 s), routing.idle_timeout_ms
 * (60 s for pooled upstream connections; the client's is 30 s) and
 * routing.queue_size (1024 held per model; the proxy's is 64).
 */
#define GATEWAY_EJECT_BASE_S 30.0
#define GATEWAY_KEEPALIVE_IDLE_MS 60000
#define GATEWAY_QUEUE_SIZE 1024

/* routing.concurrency_limit: {enabled, initial, min, max}, defaults from
 * the router's (ig_router_opts_default()); min <= initial <= max. */
static int parse_concurrency_limit(ctx_t *c, json_t *o, const ig_router_opts_t *ro,
                                   ig_config_routing_t *r)
{
    static const char *const keys[] = {"enabled", "initial", "min", "max", NULL};
    const char *p = "routing.concurrency_limit";
    json_t *l = NULL;
    int rc = ig__config_get_object(c, o, "routing", "concurrency_limit", &l);
    r->concurrency_limit.enabled = ro->limit_max > 0;
    r->concurrency_limit.initial = (unsigned)ro->limit_initial;
    r->concurrency_limit.min = (unsigned)ro->limit_min;
    /* Off by default (limit_max 0); enabled, its cap is IG_ROUTER_LIMIT_MAX. */
    unsigned max = ro->limit_max > 0 ? (unsigned)ro->limit_max : IG_ROUTER_LIMIT_MAX;
    r->concurrency_limit.max = max;
    if (rc != 0 || l == NULL)
        return rc;
    if ((rc = ig__config_check_keys(c, l, p, keys)) ||
        (rc = ig__config_get_bool(c, l, p, "enabled", ro->limit_max > 0,
                                  &r->concurrency_limit.enabled)) ||
        (rc = get_unsigned(c, l, p, "min", 1, 1000000, (unsigned)ro->limit_min,
                           &r->concurrency_limit.min)) ||
        (rc = get_unsigned(c, l, p, "max", 1, 1000000, max, &r->concurrency_limit.max)) ||
        (rc = get_unsigned(c, l, p, "initial", 1, 1000000, (unsigned)ro->limit_initial,
                           &r->concurrency_limit.initial)))
        return rc;
    if (r->concurrency_limit.min > r->concurrency_limit.max)
        return ig__config_fail(c, "routing.concurrency_limit.min", "must be <= max (%u)",
                               r->concurrency_limit.max);
    if (r->concurrency_limit.initial < r->concurrency_limit.min ||
        r->concurrency_limit.initial > r->concurrency_limit.max)
        return ig__config_fail(c, "routing.concurrency_limit.initial",
                               "must be between min (%u) and max (%u)", r->concurrency_limit.min,
                               r->concurrency_limit.max);
    return 0;
}

static int parse_routing(ctx_t *c, json_t *root, ig_config_t *cfg)
{
    static const char *const keys[] = {"policy",
                                       "objective",
                                       "slo_ttft_ms",
                                       "retry_budget",
                                       "max_retries",
                                       "hedge",
                                       "eject",
                                       "connect_timeout_ms",
                                       "first_token_timeout_ms",
                                       "idle_timeout_ms",
                                       "total_timeout_ms",
                                       "queue_size",
                                       "queue_timeout_ms",
                                       "concurrency_limit",
                                       "rtt_probe_ms",
                                       "explore_ratio",
                                       "tail_weight",
                                       NULL};
    static const char *const hedge_keys[] = {"enabled", "budget", "delay_quantile", NULL};
    static const char *const eject_keys[] = {"consecutive_failures", "base_ejection_s", NULL};
    static const char *const policies[] = {"latency", "round_robin", "least_inflight", "random",
                                           NULL};
    static const char *const objectives[] = {"latency", "cost", NULL};
    ig_config_routing_t *r = &cfg->routing;
    ig_router_opts_t ro;
    ig_proxy_opts_t po;
    ig_upstream_opts_t uo;
    ig_router_opts_default(&ro);
    ig_proxy_opts_default(&po);
    ig_upstream_opts_default(&uo);
    char p[PATH_MAX_LEN];
    json_t *o, *hedge = NULL, *eject = NULL;
    int policy, rc = get_section(c, root, "", "routing", keys, p, &o);
    if (rc != 0)
        return rc;
    if ((rc = ig__config_get_enum(c, o, p, "policy", policies, IG_ROUTE_LATENCY, &policy)) ||
        (rc = ig__config_get_enum(c, o, p, "objective", objectives, 0, &r->objective_cost)) ||
        (rc = ig__config_get_number(c, o, p, "slo_ttft_ms", 0, 86400000, NUM_CLOSED, 0,
                                    &r->slo_ttft_ms)) ||
        (rc = ig__config_get_number(c, o, p, "retry_budget", 0, 1, NUM_CLOSED, ro.retry_ratio,
                                    &r->retry_budget)) ||
        (rc = ig__config_get_number(c, o, p, "explore_ratio", 0, 0.1, NUM_CLOSED, ro.explore_ratio,
                                    &r->explore_ratio)) ||
        (rc = ig__config_get_number(c, o, p, "tail_weight", 0, 4, NUM_CLOSED, ro.tail_weight,
                                    &r->tail_weight)) ||
        (rc = get_unsigned(c, o, p, "max_retries", 0, 10, (unsigned)ro.max_retries,
                           &r->max_retries)) ||
        (rc = ig__config_get_object(c, o, p, "hedge", &hedge)) ||
        (rc = ig__config_get_object(c, o, p, "eject", &eject)))
        goto done;
    r->policy = (ig_route_policy_t)policy;
    r->hedge.enabled = po.hedge;
    r->hedge.budget = po.hedge_budget;
    r->hedge.delay_quantile = po.hedge_quantile;
    if (hedge != NULL &&
        ((rc = ig__config_check_keys(c, hedge, "routing.hedge", hedge_keys)) ||
         (rc = ig__config_get_bool(c, hedge, "routing.hedge", "enabled", po.hedge,
                                   &r->hedge.enabled)) ||
         (rc = ig__config_get_number(c, hedge, "routing.hedge", "budget", 0, 1, NUM_CLOSED,
                                     po.hedge_budget, &r->hedge.budget)) ||
         (rc = ig__config_get_number(c, hedge, "routing.hedge", "delay_quantile", 0, 1,
                                     NUM_LO_OPEN | NUM_HI_OPEN, po.hedge_quantile,
                                     &r->hedge.delay_quantile))))
        goto done;
    r->eject.consecutive_failures = (unsigned)ro.eject_consecutive;
    r->eject.base_ejection_s = GATEWAY_EJECT_BASE_S;
    if (eject != NULL &&
        ((rc = ig__config_check_keys(c, eject, "routing.eject", eject_keys)) ||
         (rc = get_unsigned(c, eject, "routing.eject", "consecutive_failures", 1, 1000,
                            (unsigned)ro.eject_consecutive, &r->eject.consecutive_failures)) ||
         (rc =
              ig__config_get_number(c, eject, "routing.eject", "base_ejection_s", 0, INFINITY,
                                    NUM_LO_OPEN, GATEWAY_EJECT_BASE_S, &r->eject.base_ejection_s))))
        goto done;
    if ((rc = ig__config_get_uint(c, o, p, "connect_timeout_ms", 1, DAY_MS, uo.connect_timeout_ms,
                                  &r->connect_timeout_ms)) ||
        (rc = ig__config_get_uint(c, o, p, "first_token_timeout_ms", 1, DAY_MS,
                                  uo.first_byte_timeout_ms, &r->first_token_timeout_ms)) ||
        (rc = ig__config_get_uint(c, o, p, "idle_timeout_ms", 1, DAY_MS, GATEWAY_KEEPALIVE_IDLE_MS,
                                  &r->idle_timeout_ms)) ||
        (rc = ig__config_get_uint(c, o, p, "total_timeout_ms", 1, DAY_MS, uo.total_timeout_ms,
                                  &r->total_timeout_ms)) ||
        (rc =
             get_unsigned(c, o, p, "queue_size", 0, 1000000, GATEWAY_QUEUE_SIZE, &r->queue_size)) ||
        (rc = ig__config_get_uint(c, o, p, "queue_timeout_ms", 1, DAY_MS, po.queue_timeout_ms,
                                  &r->queue_timeout_ms)) ||
        (rc = ig__config_get_uint(c, o, p, "rtt_probe_ms", 0, DAY_MS,
                                  (uint64_t)(ro.rtt_probe_s * 1000.0 + 0.5), &r->rtt_probe_ms)) ||
        (rc = parse_concurrency_limit(c, o, &ro, r)))
        goto done;
    const struct {
        const char *path;
        uint64_t ms;
    } within_total[] = {
        {"routing.connect_timeout_ms", r->connect_timeout_ms},
        {"routing.first_token_timeout_ms", r->first_token_timeout_ms},
    };
    for (size_t i = 0; i < sizeof(within_total) / sizeof(within_total[0]); i++) {
        if (within_total[i].ms > r->total_timeout_ms) {
            rc = ig__config_fail(c, within_total[i].path, "must be <= total_timeout_ms (%llu)",
                                 (unsigned long long)r->total_timeout_ms);
            goto done;
        }
    }
done:
    json_decref(o);
    return rc;
}

/* Parses one entry of models[], pools[] or sites[] into cfg's array at idx. */
typedef int (*parse_item_fn)(ctx_t *c, json_t *o, const char *path, ig_config_t *cfg, size_t idx);

/* The top-level array at key: *arr (NULL when the key is absent) and *items,
 * room for every entry and one more (zeroed), which the caller stores in cfg
 * before parse_items() fills it. */
static int list_begin(ctx_t *c, json_t *root, const char *key, size_t size, json_t **arr,
                      void **items)
{
    *items = NULL;
    int rc = ig__config_get_array(c, root, "", key, arr);
    if (rc != 0 || *arr == NULL)
        return rc;
    *items = calloc(json_array_size(*arr) + 1, size);
    return *items == NULL ? IG_ENOMEM : 0;
}

/* Parses every entry of arr (at key) with parse_item; *n counts the entries
 * begun, so that ig_config_dispose() frees what a failure leaves half built.
 * Each entry must be an object. */
static int parse_items(ctx_t *c, json_t *arr, const char *key, size_t *n, parse_item_fn parse_item,
                       ig_config_t *cfg)
{
    json_t *o;
    size_t i;
    int rc;
    json_array_foreach(arr, i, o)
    {
        char p[PATH_MAX_LEN];
        ig_jsonv_join_index(p, key, i);
        *n = i + 1;
        if (!json_is_object(o))
            return ig__config_fail(c, p, "must be an object");
        if ((rc = parse_item(c, o, p, cfg, i)) != 0)
            return rc;
    }
    return 0;
}

static int parse_model(ctx_t *c, json_t *m, const char *p, ig_config_t *cfg, size_t idx);
static int parse_pool(ctx_t *c, json_t *o, const char *p, ig_config_t *cfg, size_t idx);

/* models[], pools[] and sites[], in that order (the first error wins). */
static int parse_lists(ctx_t *c, json_t *root, ig_config_t *cfg)
{
    json_t *arr;
    void *items;
    int rc;
    if ((rc = list_begin(c, root, "models", sizeof(*cfg->models), &arr, &items)) != 0)
        return rc;
    cfg->models = items;
    if (arr && (rc = parse_items(c, arr, "models", &cfg->nmodels, parse_model, cfg)) != 0)
        return rc;
    if ((rc = list_begin(c, root, "pools", sizeof(*cfg->pools), &arr, &items)) != 0)
        return rc;
    cfg->pools = items;
    if (arr && (rc = parse_items(c, arr, "pools", &cfg->npools, parse_pool, cfg)) != 0)
        return rc;
    if ((rc = list_begin(c, root, "sites", sizeof(*cfg->sites), &arr, &items)) != 0)
        return rc;
    cfg->sites = items;
    if (arr && (rc = parse_items(c, arr, "sites", &cfg->nsites, ig__config_parse_site, cfg)) != 0)
        return rc;
    return 0;
}

static int parse_model(ctx_t *c, json_t *m, const char *p, ig_config_t *cfg, size_t idx)
{
    static const char *const keys[] = {"name",   "path",     "preset", "version",
                                       "weight", "quantize", NULL};
    ig_config_model_t *mod = &cfg->models[idx];
    char q[PATH_MAX_LEN];
    char *raw = NULL;
    int rc;
    if ((rc = ig__config_check_keys(c, m, p, keys)) ||
        (rc = ig__config_get_string(c, m, p, "name", STR_REQUIRED | STR_NAME, NULL, &mod->name)) ||
        (rc = ig__config_get_string(c, m, p, "path", STR_NONEMPTY, NULL, &raw)) ||
        (rc = ig__config_get_string(c, m, p, "preset", STR_NAME, NULL, &mod->preset)) ||
        (rc = ig__config_get_string(c, m, p, "version", STR_NAME, NULL, &mod->version)) ||
        (rc = ig__config_get_number(c, m, p, "weight", 0, 1e6, 0, 1, &mod->weight)) ||
        (rc = ig__config_get_string(c, m, p, "quantize", STR_NONEMPTY, NULL, &mod->quantize)))
        goto fail;
    if (mod->quantize != NULL && strcmp(mod->quantize, "q8_0") != 0 &&
        strcmp(mod->quantize, "q4_0") != 0) {
        rc = fail_at(c, p, "quantize", "'%s' is not supported (q8_0, q4_0)", mod->quantize);
        goto fail;
    }
    if (mod->version != NULL && strchr(mod->version, '@') != NULL) {
        rc = fail_at(c, p, "version", "must not contain '@'");
        goto fail;
    }
    if (mod->version != NULL && strchr(mod->name, '@') != NULL) {
        rc = fail_at(c, p, "name", "a model with versions must not have '@' in its name");
        goto fail;
    }
    /* One name, several entries: the versions of a rollout, each named. */
    for (size_t i = 0; i < idx; i++) {
        const ig_config_model_t *o = &cfg->models[i];
        if (strcmp(o->name, mod->name) != 0)
            continue;
        if (o->version == NULL && mod->version == NULL) {
            rc = fail_at(c, p, "name", "duplicate name '%s' (also models[%zu].name)", mod->name, i);
            goto fail;
        }
        if (o->version == NULL) {
            rc = fail_at(c, p, "name",
                         "duplicate name '%s' (also models[%zu].name, which has no version)",
                         mod->name, i);
            goto fail;
        }
        if (mod->version == NULL) {
            rc = fail_at(c, p, "version",
                         "is required: models[%zu] has the name '%s' too (two entries of one model "
                         "are versions)",
                         i, mod->name);
            goto fail;
        }
        if (strcmp(o->version, mod->version) == 0) {
            rc = fail_at(c, p, "version", "duplicate version '%s' of model '%s' (also models[%zu])",
                         mod->version, mod->name, i);
            goto fail;
        }
    }
    if (mod->version != NULL && raw == NULL) {
        rc = fail_at(c, p, "path", "is required for a version (sites serve models, not versions)");
        goto fail;
    }
    if (mod->preset != NULL && raw == NULL) {
        rc = fail_at(c, p, "preset", "needs a path to generate the model into");
        goto fail;
    }
    if (raw != NULL) {
        ig_jsonv_join(q, p, "path");
        rc = ig__config_expand_path(c, q, raw, &mod->path);
    }
fail:
    free(raw);
    return rc;
}

/* The models[] entry a pool serves: by name, and by version when the name
 * has several. -1 with the message written when there is none. */
static int find_pool_model(ctx_t *c, const char *p, const ig_config_t *cfg,
                           const ig_config_pool_t *pool)
{
    int found = -1, versions = 0;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const ig_config_model_t *m = &cfg->models[i];
        if (strcmp(m->name, pool->model) != 0)
            continue;
        versions += m->version != NULL;
        if (pool->version == NULL ? m->version == NULL
                                  : m->version != NULL && strcmp(m->version, pool->version) == 0)
            found = (int)i;
    }
    if (found >= 0)
        return found;
    if (pool->version != NULL && versions == 0) {
        fail_at(c, p, "version", "model '%s' has no versions", pool->model);
    } else if (pool->version != NULL) {
        fail_at(c, p, "version", "model '%s' has no version '%s'", pool->model, pool->version);
    } else if (versions > 0) {
        fail_at(c, p, "version", "is required: model '%s' has %d versions", pool->model, versions);
    } else {
        fail_at(c, p, "model", "unknown model '%s' (not in models[])", pool->model);
    }
    return -1;
}

/* "cpu", "cpu:THREADS", "cuda:N" or "MIG-<uuid>". */
static int parse_device(ctx_t *c, const char *path, json_t *v, ig_config_device_t *d)
{
    if (!json_is_string(v))
        return ig__config_fail(c, path, "must be a string");
    const char *s = json_string_value(v);
    unsigned long n = 0;
    char *end;
    if (strcmp(s, "cpu") == 0) {
        d->kind = IG_DEVICE_CPU;
        d->index = 0;
    } else if (strncmp(s, "cpu:", 4) == 0 || strncmp(s, "cuda:", 5) == 0) {
        int cpu = s[1] == 'p';
        const char *num = s + (cpu ? 4 : 5);
        errno = 0;
        n = strtoul(num, &end, 10);
        if (num[0] < '0' || num[0] > '9' || *end != '\0' || errno != 0 ||
            n > (cpu ? 4096ul : 255ul) || (cpu && n == 0))
            return ig__config_fail(c, path, "'%s': %s", s,
                                   cpu ? "THREADS must be a number from 1 to 4096"
                                       : "N must be a number from 0 to 255");
        d->kind = cpu ? IG_DEVICE_CPU : IG_DEVICE_CUDA;
        d->index = (int)n;
    } else if (strncmp(s, "MIG-", 4) == 0) {
        /* MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as nvidia-smi -L prints it. */
        const char *u = s + 4;
        static const int groups[] = {8, 4, 4, 4, 12};
        int ok = 1;
        for (int g = 0; g < 5 && ok; g++) {
            for (int k = 0; k < groups[g] && ok; k++, u++)
                ok = (*u >= '0' && *u <= '9') || (*u >= 'a' && *u <= 'f') ||
                     (*u >= 'A' && *u <= 'F');
            if (ok)
                ok = g < 4 ? *u++ == '-' : *u == '\0';
        }
        if (!ok)
            return ig__config_fail(c, path, "'%s': must be MIG-<uuid> as nvidia-smi -L prints it",
                                   s);
        d->kind = IG_DEVICE_MIG;
        d->index = 0;
    } else {
        return ig__config_fail(c, path, "'%s': must be cpu, cpu:THREADS, cuda:N or MIG-<uuid>", s);
    }
    d->spec = strdup(s);
    return d->spec == NULL ? IG_ENOMEM : 0;
}

/* A section of a pool: fields(c, o, p, out) reads the object o at key (an
 * empty one when absent, its keys among allowed), whose path is p. */
static int parse_section(ctx_t *c, json_t *obj, const char *path, const char *key,
                         const char *const *allowed,
                         int (*fields)(ctx_t *c, json_t *o, const char *p, void *out), void *out)
{
    char p[PATH_MAX_LEN];
    json_t *o;
    int rc = get_section(c, obj, path, key, allowed, p, &o);
    if (rc == 0)
        rc = fields(c, o, p, out);
    json_decref(o);
    return rc;
}

static const char *const batching_keys[] = {
    "max_batched_tokens", "max_num_seqs", "kv_blocks",     "block_size",
    "max_waiting",        "kv_dtype",     "itl_target_ms", NULL};

/* pools[].batching, into an ig_config_batching_t. */
static int batching_fields(ctx_t *c, json_t *o, const char *p, void *out)
{
    ig_config_batching_t *b = out;
    int rc;
    if ((rc = get_unsigned(c, o, p, "max_batched_tokens", 1, 1u << 20, 2048,
                           &b->max_batched_tokens)) ||
        (rc = get_unsigned(c, o, p, "max_num_seqs", 1, 4096, 64, &b->max_num_seqs)) ||
        (rc = get_unsigned(c, o, p, "kv_blocks", 0, 1u << 24, 0, &b->kv_blocks)) ||
        (rc = get_unsigned(c, o, p, "block_size", 1, 256, 16, &b->block_size)) ||
        (rc = get_unsigned(c, o, p, "max_waiting", 0, 1u << 20, 256, &b->max_waiting)) ||
        (rc = get_unsigned(c, o, p, "itl_target_ms", 0, 60000, (unsigned)IG_SCHED_ITL_TARGET_MS,
                           &b->itl_target_ms)))
        return rc;
    char *kvd = NULL;
    if ((rc = ig__config_get_string(c, o, p, "kv_dtype", STR_NONEMPTY, "f32", &kvd)) != 0)
        return rc;
    if (kvd != NULL && ig_engine_kv_dtype_parse(kvd, &b->kv_dtype) != 0)
        rc = fail_at(c, p, "kv_dtype", "'%s' is not one of f32, f16, bf16", kvd);
    free(kvd);
    if (rc != 0)
        return rc;
    if ((b->block_size & (b->block_size - 1)) != 0)
        return fail_at(c, p, "block_size", "must be a power of two");
    /* Every running sequence decodes one token per step, so one step must fit them all. */
    if (b->max_batched_tokens < b->max_num_seqs)
        return fail_at(c, p, "max_batched_tokens", "must be >= max_num_seqs (%u)", b->max_num_seqs);
    return 0;
}

static const char *const autoscale_keys[] = {
    "target_queue_depth", "stable_window_s",    "panic_window_s",        "panic_threshold",
    "max_scale_up_rate",  "scale_down_delay_s", "scale_to_zero_after_s", NULL};

/* pools[].autoscale, into an ig_config_autoscale_t. */
static int autoscale_fields(ctx_t *c, json_t *o, const char *p, void *out)
{
    ig_config_autoscale_t *a = out;
    int rc;
    /* The defaults and why: docs/autoscale.md. The windows and the delay
     * are kept as one sample a second in rings of IG_AUTOSCALE_SAMPLES. */
    double most = IG_AUTOSCALE_SAMPLES - 24;
    if ((rc = ig__config_get_number(c, o, p, "target_queue_depth", 0, INFINITY, NUM_LO_OPEN,
                                    IG_AUTOSCALE_DEFAULT_TARGET, &a->target_queue_depth)) ||
        (rc = ig__config_get_number(c, o, p, "stable_window_s", 0, most, NUM_LO_OPEN,
                                    IG_AUTOSCALE_DEFAULT_STABLE_S, &a->stable_window_s)) ||
        (rc = ig__config_get_number(c, o, p, "panic_window_s", 0, most, NUM_LO_OPEN,
                                    IG_AUTOSCALE_DEFAULT_PANIC_S, &a->panic_window_s)) ||
        (rc = ig__config_get_number(c, o, p, "panic_threshold", 1, INFINITY, NUM_CLOSED,
                                    IG_AUTOSCALE_DEFAULT_PANIC_THRESHOLD, &a->panic_threshold)) ||
        (rc = ig__config_get_number(c, o, p, "max_scale_up_rate", 1, INFINITY, NUM_CLOSED,
                                    IG_AUTOSCALE_DEFAULT_MAX_UP_RATE, &a->max_scale_up_rate)) ||
        (rc = ig__config_get_number(c, o, p, "scale_down_delay_s", 0, most, NUM_CLOSED,
                                    IG_AUTOSCALE_DEFAULT_DOWN_DELAY_S, &a->scale_down_delay_s)) ||
        (rc = ig__config_get_number(c, o, p, "scale_to_zero_after_s", 0, INFINITY, NUM_CLOSED,
                                    IG_AUTOSCALE_DEFAULT_TO_ZERO_S, &a->scale_to_zero_after_s)))
        return rc;
    if (a->panic_window_s > a->stable_window_s)
        return fail_at(c, p, "panic_window_s", "must be <= stable_window_s (%g)",
                       a->stable_window_s);
    return 0;
}

/* pools[].discover: instances from a DNS name's A/AAAA records at port,
 * or, without a port, from its SRV records. */
static int parse_discover(ctx_t *c, json_t *pool, const char *pp, ig_config_discover_t *d)
{
    static const char *const keys[] = {"dns", "port", "interval_s", "resolver", NULL};
    json_t *o;
    char p[PATH_MAX_LEN];
    unsigned port;
    int rc = ig__config_get_object(c, pool, pp, "discover", &o);
    if (rc != 0 || o == NULL)
        return rc;
    ig_jsonv_join(p, pp, "discover");
    if ((rc = ig__config_check_keys(c, o, p, keys)) ||
        (rc = ig__config_get_string(c, o, p, "dns", STR_REQUIRED | STR_NAME, NULL, &d->dns)) ||
        (rc = get_unsigned(c, o, p, "port", 1, 65535, 0, &port)) ||
        (rc = ig__config_get_number(c, o, p, "interval_s", 0.05, 3600, 0, 10, &d->interval_s)) ||
        (rc = ig__config_get_string(c, o, p, "resolver", STR_NAME, NULL, &d->resolver)))
        return rc;
    d->port = (int)port; /* 0: from SRV records */
    char err[256];
    if (d->resolver != NULL && (strncmp(d->resolver, "unix:", 5) == 0 ||
                                ig_config_check_listen(d->resolver, err, sizeof(err)) != 0)) {
        return fail_at(c, p, "resolver", "'%s': must be IP:PORT of a DNS server (IPv4 or [IPv6])",
                       d->resolver);
    }
    return 0;
}

static int parse_pool(ctx_t *c, json_t *o, const char *p, ig_config_t *cfg, size_t idx)
{
    static const char *const keys[] = {"name",          "model",         "devices",  "threads",
                                       "min_instances", "max_instances", "batching", "autoscale",
                                       "version",       "discover",      "price",    NULL};
    ig_config_pool_t *pool = &cfg->pools[idx];
    char q[PATH_MAX_LEN];
    json_t *devs;
    int rc;
    if ((rc = ig__config_check_keys(c, o, p, keys)) ||
        (rc = ig__config_get_string(c, o, p, "name", STR_REQUIRED | STR_NAME, NULL, &pool->name)) ||
        (rc = ig__config_get_string(c, o, p, "model", STR_REQUIRED | STR_NAME, NULL,
                                    &pool->model)) ||
        (rc = ig__config_get_string(c, o, p, "version", STR_NAME, NULL, &pool->version)) ||
        (rc = ig__config_parse_price(c, o, p, &pool->price)))
        return rc;
    int prev = ig__config_find_name(&cfg->pools[0].name, sizeof(*cfg->pools), idx, pool->name);
    if (prev >= 0)
        return fail_at(c, p, "name", "duplicate name '%s' (also pools[%d].name)", pool->name, prev);
    int m = find_pool_model(c, p, cfg, pool);
    if (m < 0)
        return IG_ECONFIG;
    if ((rc = parse_discover(c, o, p, &pool->discover)) != 0)
        return rc;
    if (pool->discover.dns != NULL) {
        /* Its instances run elsewhere (a headless Service's pods): what
         * starts a local worker has no meaning here. */
        static const char *const local_only[] = {"devices", "threads", "min_instances", "autoscale",
                                                 NULL};
        for (int k = 0; local_only[k] != NULL; k++) {
            if (json_object_get(o, local_only[k]) != NULL)
                return fail_at(c, p, local_only[k],
                               "not with discover (its instances are not started here)");
        }
        pool->model_index = (size_t)m;
        pool->min_instances = 0;
        if ((rc = get_unsigned(c, o, p, "max_instances", 1, 1024, 64, &pool->max_instances)) ||
            (rc = parse_section(c, o, p, "batching", batching_keys, batching_fields,
                                &pool->batching)))
            return rc;
        return 0;
    }
    ig_jsonv_join(q, p, "model");
    if (cfg->models[m].path == NULL)
        return ig__config_fail(c, q, "model '%s' has no path (only sites serve it)", pool->model);
    pool->model_index = (size_t)m;

    if ((rc = ig__config_get_array(c, o, p, "devices", &devs)) != 0)
        return rc;
    ig_jsonv_join(q, p, "devices");
    if (devs != NULL && json_array_size(devs) == 0)
        return ig__config_fail(c, q, "must not be empty");
    size_t n = devs ? json_array_size(devs) : 1;
    pool->devices = calloc(n, sizeof(*pool->devices));
    if (pool->devices == NULL)
        return IG_ENOMEM;
    if (devs == NULL) {
        pool->ndevices = 1;
        pool->devices[0].kind = IG_DEVICE_CPU;
        pool->devices[0].spec = strdup("cpu");
        if (pool->devices[0].spec == NULL)
            return IG_ENOMEM;
    }
    for (size_t i = 0; devs != NULL && i < n; i++) {
        char d[PATH_MAX_LEN];
        ig_jsonv_join_index(d, q, i);
        pool->ndevices = i + 1;
        if ((rc = parse_device(c, d, json_array_get(devs, i), &pool->devices[i])) != 0)
            return rc;
        ig_config_device_t *dev = &pool->devices[i];
        if (dev->kind == IG_DEVICE_CPU)
            continue; /* CPU instances may share the cores */
        for (size_t j = 0; j < i; j++) {
            if (strcmp(pool->devices[j].spec, dev->spec) == 0)
                return ig__config_fail(c, d, "duplicate device '%s' (also %s[%zu])", dev->spec, q,
                                       j);
        }
        /* A MIG slice is one process's: CUDA enumerates one slice per process. */
        for (size_t k = 0; dev->kind == IG_DEVICE_MIG && k < idx; k++) {
            for (size_t j = 0; j < cfg->pools[k].ndevices; j++) {
                if (strcmp(cfg->pools[k].devices[j].spec, dev->spec) == 0)
                    return ig__config_fail(c, d, "MIG slice '%s' is already used by pools[%zu]",
                                           dev->spec, k);
            }
        }
    }

    json_t *maxv = json_object_get(o, "max_instances");
    if ((rc = get_unsigned(c, o, p, "threads", 0, 4096, 0, &pool->threads)) ||
        (rc = get_unsigned(c, o, p, "min_instances", 0, 1024, 1, &pool->min_instances)) ||
        (rc = get_unsigned(c, o, p, "max_instances", 0, 1024, (unsigned)pool->ndevices,
                           &pool->max_instances)))
        return rc;
    ig_jsonv_join(q, p, "max_instances");
    if (maxv != NULL && pool->max_instances < pool->min_instances)
        return ig__config_fail(c, q, "must be >= min_instances (%u)", pool->min_instances);
    if (pool->max_instances == 0)
        return ig__config_fail(c, q, "must be >= 1");
    const struct {
        const char *key;
        unsigned n;
    } per_device[] = {{"min_instances", pool->min_instances},
                      {"max_instances", pool->max_instances}};
    for (size_t i = 0; i < sizeof(per_device) / sizeof(per_device[0]); i++) {
        if (per_device[i].n > pool->ndevices)
            return fail_at(c, p, per_device[i].key, "must be <= the number of devices (%zu)",
                           pool->ndevices);
    }
    if ((rc =
             parse_section(c, o, p, "batching", batching_keys, batching_fields, &pool->batching)) ||
        (rc = parse_section(c, o, p, "autoscale", autoscale_keys, autoscale_fields,
                            &pool->autoscale)))
        return rc;
    return 0;
}

/* Relations that span sections. */
static int check_models_served(ctx_t *c, ig_config_t *cfg)
{
    for (size_t i = 0; i < cfg->nmodels; i++) {
        if (cfg->models[i].path != NULL)
            continue;
        int served = 0;
        for (size_t k = 0; k < cfg->npools && !served; k++)
            served = cfg->pools[k].discover.dns != NULL && cfg->pools[k].model_index == i;
        for (size_t s = 0; s < cfg->nsites && !served; s++) {
            served = cfg->sites[s].nmodels == 0; /* it may discover the model */
            for (size_t k = 0; k < cfg->sites[s].nmodels && !served; k++)
                served = strcmp(cfg->sites[s].models[k], cfg->models[i].name) == 0;
        }
        if (!served) {
            char p[PATH_MAX_LEN];
            ig_jsonv_join_index(p, "models", i);
            return ig__config_fail(
                c, p, "model '%s' has no path and no site or discovered pool serves it",
                cfg->models[i].name);
        }
    }
    return 0;
}

static int parse_root(ctx_t *c, json_t *root, ig_config_t *cfg)
{
    static const char *const keys[] = {"region", "listen",   "models", "pools", "sites", "routing",
                                       "limits", "api_keys", "log",    "tls",   NULL};
    char msg[256];
    int rc;
    if (!json_is_object(root))
        return ig__config_fail(c, "", "must be a JSON object");
    if ((rc = ig__config_check_keys(c, root, "", keys)) ||
        (rc = ig__config_get_string(c, root, "", "region", STR_NAME, "local", &cfg->region)) ||
        (rc = ig__config_get_string(c, root, "", "listen", STR_NONEMPTY, "127.0.0.1:8080",
                                    &cfg->listen)))
        return rc;
    if (ig_config_check_listen(cfg->listen, msg, sizeof(msg)) != 0)
        return ig__config_fail(c, "listen", "%s", msg);
    if ((rc = parse_log(c, root, cfg)) || (rc = parse_limits(c, root, cfg)) ||
        (rc = parse_routing(c, root, cfg)) || (rc = parse_lists(c, root, cfg)) ||
        (rc = ig__config_parse_api_keys(c, root, cfg)) || (rc = check_models_served(c, cfg)) ||
        (rc = ig__config_parse_tls(c, root, cfg)))
        return rc;
    return 0;
}

/* ---- entry points ------------------------------------------------------- */

static int load(ig_config_t *cfg, json_t *root, ctx_t *c)
{
    int rc;
    c->jv.data = c;
    memset(cfg, 0, sizeof(*cfg));
    cfg->source = strdup(c->file);
    if (cfg->source == NULL) {
        rc = IG_ENOMEM;
        goto fail;
    }
    if ((rc = parse_root(c, root, cfg)) != 0)
        goto fail;
    return 0;
fail:
    if (rc == IG_ENOMEM && c->err != NULL && c->errlen > 0)
        snprintf(c->err, c->errlen, "%s: out of memory", c->file);
    ig_config_dispose(cfg);
    return rc;
}

static int syntax_error(ctx_t *c, const json_error_t *e)
{
    if (c->err != NULL && c->errlen > 0) {
        /* jansson points at the end of the offending token; column 0 means
         * "before the first character" (end of file on an empty line). */
        if (e->line > 0)
            snprintf(c->err, c->errlen, "%s:%d:%d: %s", c->file, e->line,
                     e->column > 0 ? e->column : 1, e->text);
        else
            snprintf(c->err, c->errlen, "%s: %s", c->file, e->text);
    }
    return IG_ECONFIG;
}

int ig_config_load_file(ig_config_t *cfg, const char *path, char *err, size_t errlen)
{
    ctx_t c = {.file = path, .err = err, .errlen = errlen, .jv = {.fail = ig__config_on_fault}};
    json_error_t e;
    char dir[4096];
    memset(cfg, 0, sizeof(*cfg));
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) {
        int rc = errno == ENOENT ? IG_ENOENT : IG_EIO;
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return rc;
    }
    json_t *root = ig_jsonv_loadf(fp, &e);
    fclose(fp);
    if (root == NULL)
        return syntax_error(&c, &e);
    const char *slash = strrchr(path, '/');
    if (slash != NULL && (size_t)(slash - path) < sizeof(dir)) {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, n);
        dir[n] = '\0';
        c.basedir = dir;
    }
    int rc = load(cfg, root, &c);
    json_decref(root);
    return rc;
}

int ig_config_load_string(ig_config_t *cfg, const char *json, const char *name, char *err,
                          size_t errlen)
{
    ctx_t c = {
        .file = name ? name : "(string)", .err = err, .errlen = errlen, .jv = {.fail = ig__config_on_fault}};
    json_error_t e;
    memset(cfg, 0, sizeof(*cfg));
    json_t *root = ig_jsonv_loadb(json, strlen(json), &e);
    if (root == NULL)
        return syntax_error(&c, &e);
    int rc = load(cfg, root, &c);
    json_decref(root);
    return rc;
}

int ig_config_load_default(ig_config_t *cfg, char *err, size_t errlen)
{
    return ig_config_load_string(cfg, ig_config_default_json, "(embedded default)", err, errlen);
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++)
        free(v[i]);
    free(v);
}

void ig_config_dispose(ig_config_t *cfg)
{
    for (size_t i = 0; cfg->models != NULL && i < cfg->nmodels; i++) {
        free(cfg->models[i].name);
        free(cfg->models[i].path);
        free(cfg->models[i].preset);
        free(cfg->models[i].version);
        free(cfg->models[i].quantize);
    }
    free(cfg->models);
    for (size_t i = 0; cfg->pools != NULL && i < cfg->npools; i++) {
        ig_config_pool_t *p = &cfg->pools[i];
        free(p->name);
        free(p->model);
        free(p->version);
        free(p->discover.dns);
        free(p->discover.resolver);
        for (size_t d = 0; p->devices != NULL && d < p->ndevices; d++)
            free(p->devices[d].spec);
        free(p->devices);
    }
    free(cfg->pools);
    for (size_t i = 0; cfg->sites != NULL && i < cfg->nsites; i++) {
        ig_config_site_t *s = &cfg->sites[i];
        free(s->name);
        free(s->url);
        free(s->host);
        free(s->base);
        free(s->region);
        free_strings(s->models, s->nmodels);
        free(s->api_key);
        free(s->tls.ca_file);
        free(s->tls.server_name);
    }
    free(cfg->sites);
    for (size_t i = 0; cfg->keys != NULL && i < cfg->napi_keys; i++) {
        free(cfg->keys[i].name);
        free_strings(cfg->keys[i].models, cfg->keys[i].nmodels);
    }
    free(cfg->keys);
    free_strings(cfg->api_keys, cfg->napi_keys);
    free(cfg->tls.cert_file);
    free(cfg->tls.key_file);
    free(cfg->source);
    free(cfg->region);
    free(cfg->listen);
    memset(cfg, 0, sizeof(*cfg));
}

int ig_config_find_model(const ig_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nmodels; i++) {
        if (cfg->models[i].name != NULL && strcmp(cfg->models[i].name, name) == 0)
            return (int)i;
    }
    return -1;
}

/* ---- reload: what changed ----------------------------------------------- */

static int same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

int ig_config_pool_diff(const ig_config_t *a, const ig_config_pool_t *pa, const ig_config_t *b,
                        const ig_config_pool_t *pb)
{
    const ig_config_model_t *ma = &a->models[pa->model_index];
    const ig_config_model_t *mb = &b->models[pb->model_index];
    if (!same_str(pa->name, pb->name) || !same_str(pa->model, pb->model) ||
        !same_str(pa->version, pb->version) || !same_str(ma->path, mb->path) ||
        !same_str(ma->quantize, mb->quantize) || pa->ndevices != pb->ndevices ||
        pa->threads != pb->threads || pa->min_instances != pb->min_instances ||
        pa->max_instances != pb->max_instances ||
        memcmp(&pa->batching, &pb->batching, sizeof(pa->batching)) != 0 ||
        a->limits.max_prompt_tokens != b->limits.max_prompt_tokens)
        return IG_CONFIG_POOL_RESTART;
    for (size_t d = 0; d < pa->ndevices; d++) {
        if (!same_str(pa->devices[d].spec, pb->devices[d].spec))
            return IG_CONFIG_POOL_RESTART;
    }
    if (!same_str(pa->discover.dns, pb->discover.dns) || pa->discover.port != pb->discover.port ||
        pa->discover.interval_s != pb->discover.interval_s ||
        !same_str(pa->discover.resolver, pb->discover.resolver))
        return IG_CONFIG_POOL_RESTART;
    if (memcmp(&pa->autoscale, &pb->autoscale, sizeof(pa->autoscale)) != 0)
        return IG_CONFIG_POOL_AUTOSCALE;
    return IG_CONFIG_POOL_SAME;
}

int ig_config_site_same(const ig_config_site_t *a, const ig_config_site_t *b)
{
    if (!same_str(a->name, b->name) || !same_str(a->url, b->url) ||
        !same_str(a->region, b->region) || a->nmodels != b->nmodels ||
        !same_str(a->api_key, b->api_key) || !same_str(a->tls.ca_file, b->tls.ca_file) ||
        !same_str(a->tls.server_name, b->tls.server_name) || a->tls.insecure != b->tls.insecure)
        return 0;
    for (size_t i = 0; i < a->nmodels; i++) {
        if (!same_str(a->models[i], b->models[i]))
            return 0;
    }
    return 1;
}
