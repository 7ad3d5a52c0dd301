#ifndef INFERGATE_SITE_H
#define INFERGATE_SITE_H

/*
 * Remote sites: OpenAI-compatible endpoints in other regions, another
 * infergate or vLLM, TGI, llama-server. Each is probed in the background:
 * GET /load first (an infergate peer answers with its region's aggregate
 * and models); otherwise GET /health and GET /v1/models, every
 * probe_interval_ms. The probe's round trip feeds the router's RTT
 * estimate; probe failures take the site out of rotation until a probe
 * succeeds again. A plain site that is idle also gets a timed GET /health
 * when ig_router_probe_due() says its RTT is stale (one probe in flight
 * per site at most, of either kind).
 */

#include "infergate/router.h"
#include "infergate/upstream.h"

#include <uv.h>

typedef struct ig_site_s ig_site_t;

typedef struct {
    const char *name;
    const char *url;           /* http://HOST:PORT[/prefix] */
    const char *region;        /* may be NULL */
    const char *const *models; /* models the config says it serves; NULL/0 = discover */
    int nmodels;
    uint64_t probe_interval_ms;         /* (1000) */
    int probe_failures_down;            /* failed probes in a row that mark it down (2) */
    const ig_router_t *router;          /* borrowed, for the RTT decay */
    const ig_upstream_opts_t *upstream; /* deadlines for proxied requests; NULL = defaults */
} ig_site_spec_t;

/* Copies the spec and starts probing at once. */
int ig_site_start(ig_site_t **out, uv_loop_t *loop, const ig_site_spec_t *spec);
void ig_site_close(ig_site_t *site, void (*cb)(void *data), void *data);

const char *ig_site_name(const ig_site_t *site);
const char *ig_site_region(const ig_site_t *site);
int ig_site_is_peer(const ig_site_t *site); /* answered /load like an infergate */
int ig_site_up(const ig_site_t *site);
int ig_site_serves(const ig_site_t *site, const char *model);
int ig_site_nmodels(const ig_site_t *site);
const char *ig_site_model(const ig_site_t *site, int i);
/* The cheap RTT probes (GET /health of an idle plain site, the router's
 * rtt_probe_s) that were sent and ended, for /status. */
uint64_t ig_site_rtt_probes(const ig_site_t *site);
/* A plain site's queue as its /metrics last gave it: the server whose
 * gauges it publishes ("vllm", "sglang", "llama.cpp", "tgi"), and the
 * requests running and waiting there and how old that is; NULL when it
 * publishes none we know (the out-values are then untouched). */
const char *ig_site_metrics(const ig_site_t *site, double *running, double *waiting,
                            double *age_s);
ig_upstream_t *ig_site_upstream(ig_site_t *site);
ig_router_upstream_t *ig_site_route(ig_site_t *site);

#endif
