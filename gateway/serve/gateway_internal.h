#ifndef INFERGATE_GATEWAY_INTERNAL_H
#define INFERGATE_GATEWAY_INTERNAL_H

/*
 * What gateway.c (composition, the OpenAI endpoints) and status.c (the
 * /load, /status and /v1/models documents) share. Private to serve/.
 */

#include "infergate/gateway.h"
#include "infergate/metrics.h"
#include "infergate/scaler.h"
#include "infergate/chat.h"
#include "infergate/tokenizer.h"

/* A local model's tokenizer, so that the gateway hashes a prompt's blocks as
 * its workers will cache them (docs/routing.md, "Prefix-aware routing"). */
typedef struct {
    const char *model; /* borrowed from the config */
    const char *path;  /* borrowed too: a reload keeps the tokenizer of an unchanged path */
    ig_tokenizer_t *tok;
    ig_chat_style_t style;
    int block_size;    /* its pool's */
    int remote_failed; /* no path, and its workers served no tokenizer */
} gw_prefix_model_t;

/* tokenizer_fetch.c's fetch in flight. */
typedef struct ig__tok_fetch_s ig__tok_fetch_t;

/* status.c's history of the status page's chart. */
typedef struct ig__status_history_s ig__status_history_t;

/* A part that lives beside the gateway and is closed with it, known to the
 * gateway only by this hook, so that the gateway never calls its file by
 * name (reload.c's state, set by its first reload). */
typedef struct {
    /* How many times close will call cb. */
    int (*pending)(const ig_gateway_t *gw);
    void (*close)(ig_gateway_t *gw, uint64_t grace_ms, void (*cb)(void *data), void *data);
} ig__gateway_part_t;

struct ig_gateway_s {
    uv_loop_t *loop;
    const ig_config_t *cfg;
    char region[64]; /* sanitised: it goes into a header */
    char run_dir[512];
    int own_run_dir;
    ig_pool_t **pools;
    int npools;
    ig_site_t **sites;
    int nsites;
    ig_proxy_t *proxy;
    ig_scaler_t *scaler; /* NULL from ig_gateway_close on */
    int pending_closes;
    void (*close_cb)(void *data);
    void *close_data;
    ig_metric_t *m_instances;
    ig__status_history_t *history; /* NULL until started, and from its close on */
    char *exe;                  /* the infergate binary the workers run */
    struct ig_reload_s *reload; /* reload.c's state; NULL until the first reload */
    const ig__gateway_part_t *reload_part; /* closes it (NULL until the first reload) */
    uint64_t rng;               /* draws the version of a request (a rollout's split) */
    unsigned generation;        /* reloads so far: new pools' sockets get new names */
    gw_prefix_model_t *pmodels;
    int npmodels;
    ig__tok_fetch_t *tok_fetch; /* NULL when none runs */
    int tok_fetch_off;          /* the gateway closes: no more */
};

/* The status page (page.c): one HTML document with its script, served at
 * GET /. */
extern const char ig__status_page[];
extern const size_t ig__status_page_len;

/* The chart's sampler (status.c): started last in ig_gateway_start (0 or
 * IG_ENOMEM), closed by ig_gateway_close (cb at once when it never
 * started). */
int ig__status_history_start(ig_gateway_t *gw);
void ig__status_history_close(ig_gateway_t *gw, void (*cb)(void *data), void *data);

/* ---- tokenizer_fetch.c: a model's tokenizer from its workers ---- */

/* Starts fetching the tokenizer of a model without a path from a ready
 * instance of its pool, when one is wanted and none is being fetched. */
void ig__gateway_tokenizer_kick(ig_gateway_t *gw);
/* Abandons the fetch in flight, and starts no other. */
void ig__gateway_tokenizer_close(ig_gateway_t *gw);

/* ---- targets.c: the upstreams of a routing key ---- */

/* 1 when the model is served by a pool or named by a site. */
int ig__gateway_model_known(ig_gateway_t *gw, const char *model);
/* The price of a pool's instances or of a site, by its name in the config
 * (IG_PRICE_NONE when it has none). */
ig_price_t ig__gateway_price_of(const ig_gateway_t *gw, const char *name, int is_site);
/* Up to max upstreams of the routing key (a model, or model@version) into
 * out; *starting: 1 when one of them is on its way up. note: a request (the
 * scaler counts it, and a pool scaled to zero wakes up); 0 for a look. */
int ig__gateway_targets(ig_gateway_t *gw, const char *key, ig_proxy_target_t *out, int max,
                        int *starting, int note);
/* ig__gateway_targets for a request, as the proxy's ig_proxy_resolve_cb
 * (data: the gateway). */
int ig__gateway_resolve(void *data, const char *model, ig_proxy_target_t *out, int max,
                        int *starting);

/* ---- versions.c: model versions (a rollout) ---- */

/* The version of the model a routed pool serves (NULL: the model has none). */
const char *ig__gateway_pool_version(const ig_gateway_t *gw, const ig_pool_t *pool);
/* A routing key is the model's name, or "name@version" for a model with
 * versions: writes the name into buf and returns the version, or NULL. */
const char *ig__gateway_split_key(const ig_gateway_t *gw, const char *key, char *buf, size_t cap);
/* The routing key of a request for model into key: the name, or
 * "name@version" of the version it pins (x-infergate-model-version) or of
 * one drawn by weight; *version is that version (borrowed) or NULL. 0, or
 * -1 with a 404 in e when the pinned version is not served. */
int ig__gateway_route_key(ig_gateway_t *gw, ig_http_req_t *req, const char *model, char *key,
                          size_t cap, const char **version, ig_api_error_t *e);

/* ---- spend.c: what answers cost ---- */

/* Registers the cost metric families (once). */
void ig__gateway_cost_metrics_register(void);
/* Registers the upstreams' gauges, read from gw at scrape time
 * (ig_metrics_detach(gw) before gw is freed). */
void ig__gateway_upstream_gauges(ig_gateway_t *gw);
/* The proxy's report of one answer's cost, as its ig_proxy_cost_cb. */
void ig__gateway_on_cost(void *data, ig_http_req_t *req, const char *upstream, const char *model,
                         double usd);
/* Idle paid capacity and cost per 1M tokens of every upstream, each status
 * tick (docs/routing.md, "Cost per answer"). */
void ig__gateway_cost_tick(ig_gateway_t *gw);

/* Retries the held requests of the pool's model version (a model with
 * versions holds them under "name@version"). */
void ig__gateway_kick_versions(ig_gateway_t *gw, ig_pool_t *pool);

/* ---- gateway.c: what a reload needs of the gateway ---- */

/* Generates a preset model into its path when the directory lacks one. */
int ig__gateway_ensure_model(const ig_config_model_t *m, char *err, size_t errlen);

/* What the config asks of a pool's autoscaler. */
void ig__gateway_autoscale_params(const ig_config_pool_t *cp, ig_autoscale_params_t *ap);

/* Starts cfg->pools[i] (its events go to the gateway) and publishes its
 * instances; not routed until it is put in gw->pools. On failure a
 * negative code and the reason in err. */
int ig__gateway_pool_start(ig_gateway_t *gw, const ig_config_t *cfg, size_t i, ig_pool_t **out,
                           char *err, size_t errlen);

/* Starts one of cfg's sites with its TLS context and credentials, on cfg's
 * upstream options; not routed until it is put in gw->sites. On failure a
 * negative code and the reason in err. */
int ig__gateway_site_start(ig_gateway_t *gw, const ig_config_t *cfg, const ig_config_site_t *cs,
                           ig_site_t **out, char *err, size_t errlen);

/* Makes cfg the gateway's config: the proxy's options, the region's name
 * and the tokenizers of its pool models for prefix-aware routing (those
 * whose path and block size did not change are kept, the others loaded).
 * cfg must outlive the gateway or the next call. */
void ig__gateway_set_config(ig_gateway_t *gw, const ig_config_t *cfg);

#endif
