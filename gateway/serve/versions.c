/*
 * Model versions (a rollout): which version of a model a request gets, the
 * routing key "name@version" it waits under, and the held requests an
 * instance of a version that became ready retries (docs/config.md).
 */
#include "gateway_internal.h"

#include "infergate/strbuf.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The version of the model a routed pool serves (NULL: the model has none). */
const char *ig__gateway_pool_version(const ig_gateway_t *gw, const ig_pool_t *pool)
{
    const ig_config_t *cfg = gw->cfg;
    for (size_t i = 0; i < cfg->npools; i++) {
        if (strcmp(cfg->pools[i].name, ig_pool_name(pool)) == 0)
            return cfg->pools[i].version;
    }
    return NULL;
}

/* 1 when the config gives the model versions. */
static int has_versions(const ig_gateway_t *gw, const char *model)
{
    for (size_t i = 0; i < gw->cfg->nmodels; i++) {
        const ig_config_model_t *m = &gw->cfg->models[i];
        if (m->version != NULL && strcmp(m->name, model) == 0)
            return 1;
    }
    return 0;
}

/* A routing key is the model's name, or "name@version" for a model with
 * versions (names of such models have no '@'). Writes the name into buf
 * and returns the version, or NULL. */
const char *ig__gateway_split_key(const ig_gateway_t *gw, const char *key, char *buf, size_t cap)
{
    const char *at = strrchr(key, '@');
    size_t n = strlen(key), m = at != NULL ? (size_t)(at - key) : n;
    if (cap == 0)
        return NULL;
    if (m >= cap)
        m = cap - 1;
    memcpy(buf, key, m);
    buf[m] = '\0';
    if (at == NULL || !has_versions(gw, buf)) {
        if (n >= cap)
            n = cap - 1;
        memcpy(buf, key, n);
        buf[n] = '\0';
        return NULL;
    }
    return at + 1;
}

/* 1 when a routed pool serves this version of the model. */
static int version_routed(const ig_gateway_t *gw, const char *model, const char *version)
{
    for (int p = 0; p < gw->npools; p++) {
        const char *v = ig__gateway_pool_version(gw, gw->pools[p]);
        if (v != NULL && strcmp(v, version) == 0 && strcmp(ig_pool_model(gw->pools[p]), model) == 0)
            return 1;
    }
    return 0;
}

static double draw_unit(ig_gateway_t *gw)
{
    /* xorshift64*: a split by weight needs no more than this */
    uint64_t x = gw->rng ? gw->rng : (uv_hrtime() | 1);
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    gw->rng = x;
    return (double)((x * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

/* "model@version" into key[cap], or the model alone when version is NULL;
 * cut to fit as snprintf would, without its cost on every request. */
static void version_key(char *key, size_t cap, const char *model, const char *version)
{
    size_t n = ig_str_copy(key, cap, model);
    if (version != NULL && n + 1 < cap) {
        key[n++] = '@';
        ig_str_copy(key + n, cap - n, version);
    }
}

/*
 * The routing key of a request for model: the name, or for a model with
 * versions "name@version" of the version the request pins with the
 * x-infergate-model-version header, else of one drawn by weight among
 * the versions a routed pool serves (all weights 0: evenly). *version
 * is that version (borrowed from the config) or NULL. 0, or -1 with a 404
 * in e when the pinned version is not served.
 */
int ig__gateway_route_key(ig_gateway_t *gw, ig_http_req_t *req, const char *model, char *key,
                          size_t cap, const char **version, ig_api_error_t *e)
{
    const ig_config_t *cfg = gw->cfg;
    const char *pin = ig_http_req_header(req, IG_GATEWAY_VERSION_HEADER);
    const ig_config_model_t *cand[64];
    int n = 0;
    double total = 0;
    *version = NULL;
    version_key(key, cap, model, NULL);
    for (size_t i = 0; i < cfg->nmodels && n < 64; i++) {
        const ig_config_model_t *m = &cfg->models[i];
        if (m->version == NULL || strcmp(m->name, model) != 0 ||
            !version_routed(gw, model, m->version))
            continue;
        if (pin != NULL && strcmp(pin, m->version) == 0) {
            *version = m->version;
            version_key(key, cap, model, m->version);
            return 0;
        }
        cand[n++] = m;
        total += m->weight;
    }
    if (pin != NULL) {
        ig_api_error(e, 404, "model", "the model '%s' has no version '%s' that is served", model,
                     pin);
        e->code = "model_version_not_found";
        return -1;
    }
    if (n == 0)
        return 0;
    double x = draw_unit(gw) * (total > 0 ? total : n);
    int k = 0;
    for (; k < n - 1; k++) {
        x -= total > 0 ? cand[k]->weight : 1;
        if (x < 0)
            break;
    }
    *version = cand[k]->version;
    version_key(key, cap, model, cand[k]->version);
    return 0;
}

/* Held requests of a versioned model wait under their version's key: an
 * instance that became ready retries those too. */
static void kick_versions(ig_gateway_t *gw, ig_pool_t *pool)
{
    const char *v = ig__gateway_pool_version(gw, pool);
    if (v == NULL)
        return;
    char key[512];
    snprintf(key, sizeof(key), "%s@%s", ig_pool_model(pool), v);
    ig_proxy_kick(gw->proxy, key);
}

void ig__gateway_kick_versions(ig_gateway_t *gw, ig_pool_t *pool)
{
    kick_versions(gw, pool);
}
