/*
 * The OpenAI entry of the gateway: POST /v1/completions,
 * /v1/chat/completions, /v1/embeddings and /v1/responses. A request is
 * read (ig_api_peek, or the whole parse where the gateway needs the
 * prompt), admitted (the key's model list and tokens, the prompt limit,
 * the forwarded mark, the priority, the predicted wait, the version, the
 * prefix hashes) and handed to the proxy (docs/gateway.md, "One request,
 * step by step").
 */
#include "gateway_internal.h"
#include "infergate/api.h"
#include "infergate/error.h"
#include "infergate/keys.h"
#include "infergate/kv_feed.h"
#include "infergate/prefix.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- the prompt's tokens ------------------------------------------------- */

/* The block size a model's workers report in their KV event snapshots (the
 * first live one: what their caches are cut at), else the pool's config. */
static int prefix_block_size(const ig_gateway_t *gw, const gw_prefix_model_t *pm)
{
    for (int p = 0; p < gw->npools; p++) {
        if (strcmp(ig_pool_model(gw->pools[p]), pm->model) != 0)
            continue;
        for (int i = 0; i < ig_pool_size(gw->pools[p]); i++) {
            const ig_kv_feed_t *f = ig_instance_kv_feed(ig_pool_instance(gw->pools[p], i));
            ig_kv_feed_info_t fi;
            if (f == NULL)
                continue;
            ig_kv_feed_info(f, &fi);
            if (fi.live && fi.block_size > 0)
                return fi.block_size;
        }
    }
    return pm->block_size;
}

static const gw_prefix_model_t *prefix_model(const ig_gateway_t *gw, const char *model)
{
    for (int i = 0; i < gw->npmodels; i++)
        if (strcmp(gw->pmodels[i].model, model) == 0)
            return &gw->pmodels[i];
    return NULL;
}

/* ---- admission ----------------------------------------------------------- */

/* A cheap prompt-length estimate for the cost model: about four bytes a
 * token for text; exact for token ids. The worker counts for real. */
static int estimate_tokens(const ig_api_request_t *r)
{
    size_t n = 0;
    for (int i = 0; i < r->nprompts; i++)
        n += r->prompts[i].text ? r->prompts[i].text_len / 4 + 1 : (size_t)r->prompts[i].nids;
    for (int i = 0; i < r->nmessages; i++)
        n += strlen(r->messages[i].content) / 4 + 4;
    return n > 1 << 20 ? 1 << 20 : (int)n;
}

/* ---- priority and admission by predicted wait --------------------------- */

/* The request's priority: its key's (standard without keys), or a less
 * urgent one named by x-infergate-priority; a header never raises it. */
static int request_priority(ig_http_req_t *req, const ig_key_t *key)
{
    static const char *const names[] = {"critical", "standard", "sheddable"};
    int prio = key != NULL ? ig_key_policy(key)->priority : IG_PRIORITY_STANDARD;
    const char *h = ig_http_req_header(req, "x-infergate-priority");
    for (int i = 0; h != NULL && i < 3; i++) {
        if (strcasecmp(h, names[i]) == 0 && i > prio)
            prio = i;
    }
    return prio;
}

/*
 * The shortest wait, in seconds, a new request of priority for model can
 * expect: the router's predicted wait of the best eligible upstream, plus
 * the requests the gateway holds ahead of it over the upstreams' combined
 * service rate (slots over the time a request holds one). Negative when
 * nothing is known yet (no eligible upstream, or none measured): then
 * nothing is refused on a guess.
 */
static double predicted_wait(ig_gateway_t *gw, const char *model, int priority, int local_only)
{
    ig_proxy_target_t t[64];
    int starting = 0;
    int n = ig__gateway_targets(gw, model, t, 64, &starting, 0); /* a look, not a request */
    ig_router_t *router = ig_proxy_router(gw->proxy);
    uint64_t now = uv_hrtime();
    double best = -1, rate = 0;
    for (int i = 0; i < n; i++) {
        const ig_router_upstream_t *u = t[i].route;
        if ((local_only && t[i].is_site) || !ig_router_eligible(u, now))
            continue;
        double w = ig_router_wait(router, u, now);
        if (best < 0 || w < best)
            best = w;
        double hold = u->occupancy_s > 0 ? u->occupancy_s : u->svc_s;
        if (hold > 0)
            rate += (u->slots > 0 ? u->slots : 1) / hold;
    }
    int ahead = ig_proxy_queued_ahead(gw->proxy, model, priority);
    if (best >= 0 && ahead > 0) {
        if (rate <= 0)
            return -1;
        best += ahead / rate;
    }
    return best;
}

/* The request's queueing budget in ms: limits.max_queue_wait_ms of its
 * priority, or the x-infergate-deadline-ms it carries when shorter (0:
 * none). */
static uint64_t queue_budget_ms(ig_gateway_t *gw, ig_http_req_t *req, int priority)
{
    uint64_t budget = gw->cfg->limits.max_queue_wait_ms[priority];
    const char *h = ig_http_req_header(req, "x-infergate-deadline-ms");
    if (h != NULL) {
        char *end;
        unsigned long long d = strtoull(h, &end, 10);
        if (end != h && *end == '\0' && d > 0 && (budget == 0 || d < budget))
            budget = d;
    }
    return budget;
}

static ig_metric_t *m_admission;


/*
 * What the gateway reads of one API request to admit and route it; the
 * body itself goes upstream as the client sent it (docs/routing.md, "What
 * the gateway changes in a forwarded body").
 */
typedef struct {
    const char *path;  /* the client's path, which the upstream gets too */
    const char *model; /* as the body names it */
    int stream;
    int prompt_tokens; /* an estimate; exact below when the gateway tokenizes */
    int outputs;       /* answers generated: choices (n, or best_of) x prompts */
    int max_tokens;    /* per answer; 0: not given (up to the upstream) */
    /* The body fields that cap an answer's tokens, the first added when a
     * key's limit caps a body that names none (NULL: nothing generated). */
    const char *const *cap_fields;
    int ncap_fields;
    /* The whole parse of a completion or chat body where the gateway reads
     * the prompt (token ids, prefix hashes), else NULL. */
    const ig_api_request_t *r;
} gw_call_t;

/* Reserves the key's tokens for the call; caps the answers' max tokens in
 * *body when the bucket holds less than they ask (so that a stream ends
 * cleanly, finish_reason "length", at the limit). 0, or an error in e. */
static int reserve_tokens(ig_http_req_t *req, ig_key_use_t *use, const gw_call_t *c,
                          const char **body, size_t *len, char **edited, ig_api_error_t *e)
{
    int outputs = c->outputs;
    int per = c->max_tokens > 0 ? c->max_tokens : 1 << 20;
    int asked = outputs == 0 ? 0 : per > (1 << 24) / outputs ? 1 << 24 : per * outputs;
    int prompts =
        c->r != NULL && c->r->kind == IG_API_COMPLETION && c->r->nprompts > 1 ? c->r->nprompts : 1;
    ig_key_limit_t tok, why;
    int allowed =
        ig_key_use_reserve(use, uv_hrtime(), c->prompt_tokens * prompts, asked, &tok, &why);
    if (allowed < 0 || allowed < outputs) {
        int ra = (int)ceil(why.retry_after > 0 ? why.retry_after : 1);
        ig_key_limit_headers(req, &why);
        ig_api_error(e, 429, NULL, "token limit of this API key reached; retry after %d s", ra);
        e->code = "rate_limit_exceeded";
        e->retry_after_s = ra; /* the Retry-After header */
        return IG_EFULL;
    }
    ig_key_limit_headers(req, &tok);
    if (allowed >= asked || c->ncap_fields == 0)
        return 0;
    int rc =
        ig_api_body_cap(*body, *len, c->cap_fields, c->ncap_fields, allowed / outputs, edited, len);
    if (rc != 0)
        return ig_api_error_oom(e);
    *body = *edited;
    return 0;
}

/*
 * Admits one parsed request and hands it to the proxy: the key's model
 * list and tokens, the operator's prompt limit, the forwarded mark, the
 * priority, admission by predicted wait, the version and the prefix
 * hashes. 0 when the proxy took the request, else an error in e for the
 * caller to answer.
 */
static int admit_and_forward(ig_gateway_t *gw, ig_http_req_t *req, const gw_call_t *c,
                             ig_api_error_t *e)
{
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    char *edited = NULL;
    int rc = IG_EINVAL;
    if (!ig__gateway_model_known(gw, c->model)) {
        ig_api_error(e, 404, "model", "the model '%s' does not exist", c->model);
        e->code = "model_not_found";
        return IG_EINVAL;
    }
    /* The key's policy: its models, its tokens (serve.c authenticated it and
     * took its request token). */
    ig_key_use_t *use = ig_http_req_get_data(req);
    ig_key_t *key = use != NULL ? ig_key_use_key(use) : NULL;
    if (key != NULL && !ig_key_allows_model(key, c->model)) {
        ig_api_error(e, 403, "model", "this API key may not use the model '%s'", c->model);
        e->type = "permission_error";
        e->code = "model_not_allowed";
        return IG_EINVAL;
    }
    if (key != NULL && (rc = reserve_tokens(req, use, c, &body, &len, &edited, e)) != 0)
        return rc;
    /* Token ids count exactly here, so an over-long one never takes an
     * upstream's time; text is counted by the worker that tokenizes it. */
    for (int i = 0; c->r != NULL && i < c->r->nprompts; i++) {
        if (c->r->prompts[i].text == NULL &&
            (rc = ig_api_check_prompt_limit(c->r, c->r->prompts[i].nids,
                                            (int)gw->cfg->limits.max_prompt_tokens, e)) != 0)
            goto fail;
    }
    /* Once there are keys, only a peer gateway's key may say "forwarded,
     * serve it here": from anyone else the mark is ignored (and never passed
     * on: the proxy writes its own), or a client could pin itself to this
     * region's pools. Without keys anyone is trusted, the mark included
     * (it is what stops two regions from forwarding in a loop). */
    int trusted = gw->cfg->napi_keys == 0 || (key != NULL && ig_key_policy(key)->peer);
    int local_only = trusted && ig_http_req_header(req, "x-infergate-forwarded") != NULL;
    /* Admission by predicted wait: a request that would wait longer than
     * its budget is told so now, not after the wait. */
    int priority = request_priority(req, key);
    uint64_t budget = queue_budget_ms(gw, req, priority);
    if (budget > 0) {
        double wait = predicted_wait(gw, c->model, priority, local_only);
        if (wait * 1000.0 > (double)budget) {
            static const char *const pn[] = {"critical", "standard", "sheddable"};
            if (m_admission == NULL)
                m_admission = ig_metrics_counter(
                    "infergate_admission_rejections_total",
                    "Requests refused at once because their predicted wait exceeded their "
                    "budget, by priority.",
                    "priority");
            ig_metric_add(m_admission, 1, pn[priority]);
            ig_api_error(e, 429, NULL,
                         "the predicted wait for model '%s' (%.0f ms) exceeds this request's "
                         "budget (%llu ms); retry later",
                         c->model, wait * 1000.0, (unsigned long long)budget);
            e->code = "predicted_wait_exceeds_budget";
            e->retry_after_s = (int)ceil(wait - (double)budget / 1000.0);
            rc = IG_EINVAL;
            goto fail;
        }
    }
    char route_name[512];
    const char *version;
    if ((rc = ig__gateway_route_key(gw, req, c->model, route_name, sizeof(route_name), &version,
                                    e)) != 0)
        goto fail;
    if (version != NULL)
        ig_http_add_header(req, IG_GATEWAY_VERSION_HEADER, version);
    ig_proxy_call_t call;
    memset(&call, 0, sizeof(call));
    call.model = route_name; /* the body names the model; the key picks the version */
    call.path = c->path;
    call.stream = c->stream;
    call.prompt_tokens = c->prompt_tokens;
    call.body = body;
    call.len = len;
    call.local_only = local_only;
    call.priority = priority;
    /* Admitted on a prediction: one that turns out a little short is
     * still served rather than dropped at its budget; twice the budget is
     * the most it is held. */
    call.max_queue_ms = budget * 2;
    call.region = gw->region[0] ? gw->region : NULL;
    /* The first prompt's tokens as its worker will prefill them: an exact
     * count for the cost, and its block hashes for the prefix index. */
    const gw_prefix_model_t *pm = c->r != NULL ? prefix_model(gw, c->model) : NULL;
    int *ids = NULL, nids = 0;
    uint64_t *hashes = NULL;
    int ids_only = c->r != NULL && c->r->kind != IG_API_CHAT && c->r->nprompts > 0 &&
                   c->r->prompts[0].text == NULL;
    if (pm && (pm->tok || ids_only) &&
        ig_prefix_prompt_tokens(pm->tok, pm->style, c->r, 0, &ids, &nids, NULL, 0) == 0) {
        int bs = prefix_block_size(gw, pm);
        int cap = nids / bs + 1;
        if ((hashes = malloc(sizeof(uint64_t) * (size_t)cap)) != NULL) {
            call.nprefix = ig_prefix_hashes(ig_prefix_seed(c->model), ids, nids, bs, hashes, cap);
            call.prefix_hashes = hashes;
            call.block_size = bs;
        }
        if (c->r->kind == IG_API_CHAT || c->r->nprompts == 1)
            call.prompt_tokens = nids;
    }
    free(ids);
    call.session_id = ig_http_req_header(req, "x-session-id");
    long long out = (long long)c->max_tokens * (c->outputs > 0 ? c->outputs : 1);
    call.output_tokens = out > (1 << 24) ? 1 << 24 : (int)out;
    /* A client may tighten the TTFT SLO of the cost objective, never loosen it. */
    const char *slo = ig_http_req_header(req, "x-infergate-slo-ttft-ms");
    if (slo != NULL) {
        char *end;
        double ms = strtod(slo, &end);
        if (end != slo && *end == '\0' && ms > 0 && isfinite(ms))
            call.slo_ttft_s = ms / 1000.0;
    }
    ig_proxy_handle(gw->proxy, req, &call);
    free(hashes);
    free(edited);
    return 0;
fail:
    free(edited);
    return rc;
}

static void handle_openai(ig_gateway_t *gw, ig_http_req_t *req, ig_api_kind_t kind)
{
    static const char *const completion_cap[] = {"max_tokens"};
    static const char *const chat_cap[] = {"max_completion_tokens", "max_tokens"};
    size_t len, prompt_bytes;
    const char *body = ig_http_req_body(req, &len);
    ig_api_request_t r;
    ig_api_error_t e;
    int rc = ig_api_peek(kind, body, len, &r, &prompt_bytes, &e);
    if (rc < 0) {
        ig_api_respond_error(req, &e);
        return;
    }
    /* The prompt itself is read only where the gateway needs its tokens:
     * token ids, or prefix-aware routing with the model's tokenizer. */
    const gw_prefix_model_t *pm = r.model != NULL ? prefix_model(gw, r.model) : NULL;
    int whole = rc == 1 || (pm != NULL && pm->tok != NULL);
    if (whole) {
        ig_api_request_dispose(&r);
        if (ig_api_parse(kind, body, len, &r, &e) != 0) {
            ig_api_respond_error(req, &e);
            return;
        }
    }
    size_t guess = prompt_bytes / 4 + 1;
    gw_call_t c = {
        .path = kind == IG_API_CHAT ? "/v1/chat/completions" : "/v1/completions",
        .model = r.model,
        .stream = r.stream,
        .prompt_tokens = whole ? estimate_tokens(&r) : guess > 1 << 20 ? 1 << 20 : (int)guess,
        .outputs = (r.best_of > r.n ? r.best_of : r.n) *
                   (kind == IG_API_CHAT || r.nprompts < 1 ? 1 : r.nprompts),
        .max_tokens = r.max_tokens,
        .cap_fields = kind == IG_API_CHAT ? chat_cap : completion_cap,
        .ncap_fields = kind == IG_API_CHAT ? 2 : 1,
        .r = whole ? &r : NULL,
    };
    if (r.model == NULL)
        ig_api_error(&e, 400, "model", "you must provide a model parameter");
    if (r.model == NULL || admit_and_forward(gw, req, &c, &e) != 0)
        ig_api_respond_error(req, &e);
    ig_api_request_dispose(&r);
}

void ig_gateway_completions(ig_gateway_t *gw, ig_http_req_t *req)
{
    handle_openai(gw, req, IG_API_COMPLETION);
}

void ig_gateway_chat(ig_gateway_t *gw, ig_http_req_t *req)
{
    handle_openai(gw, req, IG_API_CHAT);
}

void ig_gateway_routed(ig_gateway_t *gw, ig_http_req_t *req, ig_api_routed_kind_t kind)
{
    static const char *const responses_cap[] = {"max_output_tokens"};
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    ig_api_routed_t r;
    ig_api_error_t e;
    if (ig_api_parse_routed(kind, body, len, &r, &e) != 0) {
        ig_api_respond_error(req, &e);
        return;
    }
    gw_call_t c = {
        .path = ig_api_routed_path(kind),
        .model = r.model,
        .stream = r.stream,
        .prompt_tokens = r.input_tokens,
        .outputs = kind == IG_API_RESPONSES ? 1 : 0,
        .max_tokens = r.max_tokens,
        .cap_fields = kind == IG_API_RESPONSES ? responses_cap : NULL,
        .ncap_fields = kind == IG_API_RESPONSES ? 1 : 0,
    };
    if (admit_and_forward(gw, req, &c, &e) != 0)
        ig_api_respond_error(req, &e);
    ig_api_routed_dispose(&r);
}
