#ifndef INFERGATE_PROXY_H
#define INFERGATE_PROXY_H

/*
 * The gateway's request path after the API module has validated a request:
 * admission (a bounded queue per model), the router's pick, the attempt on
 * an upstream, retries before the first byte reaches the client, optional
 * hedging, and streaming the answer back with backpressure.
 *
 * Every request handed to ig_proxy_handle() is finished: with the
 * upstream's answer, or with an explicit error (OpenAI shape; an SSE error
 * event when a stream breaks midway).
 */

#include "infergate/http.h"
#include "infergate/router.h"
#include "infergate/upstream.h"

#include <uv.h>

typedef struct ig_proxy_s ig_proxy_t;

/* One upstream that can serve a model, as the resolver reports it. */
typedef struct {
    ig_upstream_t *client;
    ig_router_upstream_t *route;
    int is_site; /* a remote site: requests to it are marked as forwarded */
    ig_price_t price; /* its price (IG_PRICE_NONE: unpriced) */
} ig_proxy_target_t;

/*
 * Fills out[0..max) with the upstreams that serve `model` (ready or not) and
 * returns how many. `starting` is set to 1 when some instance for the model
 * is on its way up (starting, or scaled to zero and being started), so that
 * a request is held rather than refused.
 */
typedef int (*ig_proxy_resolve_cb)(void *data, const char *model, ig_proxy_target_t *out, int max,
                                   int *starting);

/* The defaults are ig_proxy_opts_default()'s (gateway/route/proxy.c); a
 * gateway's come from its config (docs/config.md). */
typedef struct {
    ig_router_opts_t router;
    int queue_size;            /* requests held per model when all are saturated */
    uint64_t queue_timeout_ms; /* the longest a request is held */
    int max_inflight;          /* per upstream before it counts as saturated; 0 =
                                  2 x its reported slots, or 64 */
    int hedge;                 /* send a copy when the first token is late */
    double hedge_budget;       /* hedges per request at most, on average */
    double hedge_quantile;     /* hedge when the first token is later than this
                                  quantile of the upstream's TTFT */
    size_t max_response_bytes; /* a non-streamed answer larger than this is an
                                  error */
    size_t max_held_bytes;     /* a stream's events held before its first
                                  content token; past this the stream is
                                  committed as it is */
    /* A stream attempt with no content token by then times out (and is
     * retried before the commit). 0 = none (the default): the upstream's
     * first-byte deadline then covers the headers only. */
    uint64_t first_token_timeout_ms;
    /* The cost objective (docs/routing.md, "The cost objective"): of the
     * upstreams predicted to meet slo_ttft_s, the cheapest; 0: latency. */
    int objective_cost;
    double slo_ttft_s; /* 0: none */
} ig_proxy_opts_t;

void ig_proxy_opts_default(ig_proxy_opts_t *opts);

/* Creates the proxy on the loop; resolve (with data) names the upstreams
 * of a model. ig_proxy_close() is its pair. 0 or IG_ENOMEM. */
int ig_proxy_start(ig_proxy_t **out, uv_loop_t *loop, const ig_proxy_opts_t *opts,
                   ig_proxy_resolve_cb resolve, void *data);

/* Ends every held request with 503 and frees the proxy once the requests in
 * flight are done (they end when their upstreams are closed). */
void ig_proxy_close(ig_proxy_t *px, void (*cb)(void *data), void *data);

/* The optional endpoints: an upstream that answers 404 for one is not
 * asked for it again for a while (ig_router_upstream_t.lacks), and a
 * request none serves gets 404 endpoint_not_served. */
enum { IG_PROXY_EP_EMBEDDINGS = 1, IG_PROXY_EP_RESPONSES = 2 };

/* What the API module extracted from a valid request. */
typedef struct {
    const char *model;
    const char *path;  /* the client's: /v1/completions, /v1/chat/completions,
                          /v1/embeddings or /v1/responses */
    int stream;
    int prompt_tokens; /* an estimate, for the cost model */
    const char *body;  /* sent upstream as it is: the client's body (docs/routing.md,
                          "What the gateway changes in a forwarded body") */
    size_t len;
    int local_only;     /* forwarded by a peer gateway: never forward again, so
                           that two regions naming each other cannot loop */
    const char *region; /* ours, named in the forwarded mark; may be NULL */
    /* Prefix-aware routing (docs/routing.md): the prompt's block hashes
     * (copied; NULL when the gateway has no tokenizer for the model), the
     * block size they were cut with, and the x-session-id header (NULL). */
    const uint64_t *prefix_hashes;
    int nprefix;
    int block_size;
    const char *session_id;
    int priority;       /* 0 critical, 1 standard, 2 sheddable: the queue serves the
                           lower first, and a full queue sheds the highest */
    uint64_t max_queue_ms; /* held at most this long (0: queue_timeout_ms) */
    int output_tokens;     /* tokens it may generate, for the cost objective (0: unknown) */
    double slo_ttft_s;     /* a tighter TTFT SLO of its own (x-infergate-slo-ttft-ms; 0: none) */
} ig_proxy_call_t;

/* Takes over the request: the proxy finishes it. call's strings are copied. */
void ig_proxy_handle(ig_proxy_t *px, ig_http_req_t *req, const ig_proxy_call_t *call);

/* Called with each charge in USD, the upstream's name and the model: once
 * per answered request with its answer's cost (NAN when the upstream is
 * unpriced), and once per attempt that gave no answer but cost something (a
 * hedge that lost, a failed or retried attempt, a broken stream;
 * ig_cost_attempt). req is NULL when the client went away. */
typedef void (*ig_proxy_cost_cb)(void *data, ig_http_req_t *req, const char *upstream,
                                 const char *model, double usd);
void ig_proxy_on_cost(ig_proxy_t *px, ig_proxy_cost_cb cb, void *data);

/* Aggregates for /load and /ready. */
int ig_proxy_inflight(const ig_proxy_t *px);
int ig_proxy_queued(const ig_proxy_t *px);
int ig_proxy_queued_model(const ig_proxy_t *px, const char *model);
/* The sum and count of every time to first token observed (seconds), as
 * infergate_time_to_first_token_seconds has them, all models together. */
void ig_proxy_ttft_totals(const ig_proxy_t *px, double *sum, long long *count);
/* Requests of model held now that a new one of priority would wait behind
 * (those of the same or a more urgent priority). */
int ig_proxy_queued_ahead(const ig_proxy_t *px, const char *model, int priority);
ig_router_t *ig_proxy_router(ig_proxy_t *px);
/* The attempts the proxy lets be in flight on u now: its adaptive limit,
 * capped by max_inflight. */
int ig_proxy_upstream_limit(const ig_proxy_t *px, const ig_router_upstream_t *u);

/* Replaces the options in place (a config reload): requests in flight and
 * held keep going; what they decide next uses the new values. */
void ig_proxy_set_opts(ig_proxy_t *px, const ig_proxy_opts_t *opts);

/* Calls the held requests of `model` again, e.g. after an instance became
 * ready. */
void ig_proxy_kick(ig_proxy_t *px, const char *model);

#endif
