#ifndef INFERGATE_GATEWAY_H
#define INFERGATE_GATEWAY_H

/*
 * The gateway of one region, built from its config: the instance pools
 * (supervised workers), the remote sites (probed), and the proxy that routes
 * OpenAI requests across both with one cost model. The serve command owns
 * the HTTP server and hands the OpenAI and fleet endpoints to the handlers
 * below; each handler finishes the request it is given.
 */

#include "infergate/api.h"
#include "infergate/config.h"
#include "infergate/http.h"
#include "infergate/pool.h"
#include "infergate/proxy.h"
#include "infergate/site.h"

#include <stddef.h>
#include <uv.h>

typedef struct ig_gateway_s ig_gateway_t;

/* A request header that pins a version of a model with versions (a
 * rollout, docs/config.md); the answer names the version that served in
 * the same header. */
#define IG_GATEWAY_VERSION_HEADER "x-infergate-model-version"

/*
 * Generates missing preset models, starts the pools and the site probes.
 * exe is the infergate binary the workers run; run_dir holds their sockets
 * (NULL: a fresh directory under $TMPDIR). cfg must outlive the gateway.
 * On failure returns a negative code and a one-line reason in err.
 */
int ig_gateway_start(ig_gateway_t **out, uv_loop_t *loop, const ig_config_t *cfg, const char *exe,
                     const char *run_dir, char *err, size_t errlen);

/* Stops the proxy (held requests get 503), the sites and the pools (workers
 * get SIGTERM, then SIGKILL after grace_ms), then calls cb and frees gw. */
void ig_gateway_close(ig_gateway_t *gw, uint64_t grace_ms, void (*cb)(void *data), void *data);

/* Readiness: 1 when some upstream can serve some configured model now
 * (or a pool scaled to zero can start one); otherwise 0 and the reason. */
int ig_gateway_ready(ig_gateway_t *gw, char *reason, size_t reason_len);

/*
 * The OpenAI entry (gateway/serve/openai.c), as route handlers
 * (ig_http_route_cb; data is the gateway): POST /v1/completions and
 * /v1/chat/completions are read by the api module, admitted, then routed;
 * POST /v1/embeddings and /v1/responses have the fields routing needs
 * checked, then go to an upstream that serves them.
 */
void ig_gateway_completions(ig_http_req_t *req, void *gw);
void ig_gateway_chat(ig_http_req_t *req, void *gw);
void ig_gateway_embeddings(ig_http_req_t *req, void *gw);
void ig_gateway_responses(ig_http_req_t *req, void *gw);
/* GET /v1/models: every model reachable locally or through a site; GET
 * /load: this region's aggregate, for peer gateways; GET /status: pools,
 * instances, devices and sites, as JSON; GET /: the status page, HTML with
 * a script that polls /status (serve/status.c). Route handlers too. */
void ig_gateway_models(ig_http_req_t *req, void *gw);
void ig_gateway_load(ig_http_req_t *req, void *gw);
void ig_gateway_status(ig_http_req_t *req, void *gw);
void ig_gateway_page(ig_http_req_t *req, void *gw);
/* GET /metrics: the process registry, then the infergate_worker_* metrics
 * of every ready or draining instance, pulled now (500 ms at most) and
 * labelled pool and instance (serve/metrics_endpoint.c). */
void ig_gateway_metrics(ig_gateway_t *gw, ig_http_req_t *req);

/*
 * Applies a new config to the running gateway without dropping a request
 * (gateway/serve/reload.c): prev is the config it runs (borrowed for the
 * call), next the new one, which must outlive the gateway or the next
 * reload. Routing options, autoscale parameters and unchanged sites change
 * in place; a pool whose instances must change starts new ones beside the
 * old, moves traffic once they are ready, then drains and stops the old;
 * removed pools and sites drain. Returns 0 once started (summary says what
 * changes; the outcome is logged and counted when the last old instance
 * has stopped), IG_EBUSY while a previous reload is still in progress,
 * or another negative code with the reason in err, in which case nothing
 * changed.
 */
int ig_gateway_reload(ig_gateway_t *gw, const ig_config_t *prev, const ig_config_t *next,
                      char *summary, size_t summary_len, char *err, size_t errlen);

/* 1 while a reload has pools starting or draining. */
int ig_gateway_reload_active(const ig_gateway_t *gw);

/* Registers infergate_config_reloads_total's series at 0, so that
 * increase() sees the first of each outcome (the serve command, at start). */
void ig_gateway_reload_metrics(void);

/* Counts a reload outcome in infergate_config_reloads_total (the serve
 * command's "invalid" and "busy"; the gateway counts "applied" and
 * "failed"). */
void ig_gateway_reload_count(const char *outcome);

#endif
