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
#include "infergate/router.h"

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

/*
 * What the gateway reads of one API request to admit and route it; the
 * body itself goes upstream as the client sent it (docs/routing.md, "What
 * the gateway changes in a forwarded body").
 */
typedef struct {
    const char *path;  /* the client's path, which the upstream gets too */
    const char *model; /* as the body names it (NULL: it names none) */
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

/*
 * One request's admission: what the steps below decide, and what they
 * allocate, freed in one place (admit_and_forward) once the proxy has
 * taken the call or the request was refused.
 */
typedef struct {
    ig_proxy_call_t call; /* what the proxy gets */
    ig_key_use_t *use;    /* the key's use of this request (NULL: no keys) */
    ig_key_t *key;
    uint64_t budget_ms; /* the queueing budget (0: none) */
    char *edited;       /* the body with its max tokens capped by the key (owned) */
    uint64_t *hashes;   /* the first prompt's block hashes (owned) */
    char key_buf[512];  /* the routing key: model or model@version */
} admission_t;

/* The model is named and served here. */
static int admit_model(ig_gateway_t *gw, const gw_call_t *c, ig_api_error_t *e)
{
    if (c->model == NULL) {
        ig_api_error(e, 400, "model", "you must provide a model parameter");
        return IG_EINVAL;
    }
    if (!ig__gateway_model_known(gw, c->model)) {
        ig_api_error(e, 404, "model", "the model '%s' does not exist", c->model);
        e->code = "model_not_found";
        return IG_EINVAL;
    }
    return 0;
}

/* Reserves the key's tokens for the call; caps the answers' max tokens in
 * the body when the bucket holds less than they ask (so that a stream ends
 * cleanly, finish_reason "length", at the limit). 0, or an error in e. */
static int reserve_tokens(ig_http_req_t *req, admission_t *a, const gw_call_t *c,
                          ig_api_error_t *e)
{
    int outputs = c->outputs;
    int per = c->max_tokens > 0 ? c->max_tokens : 1 << 20;
    int asked = outputs == 0 ? 0 : per > (1 << 24) / outputs ? 1 << 24 : per * outputs;
    int prompts =
        c->r != NULL && c->r->kind == IG_API_COMPLETION && c->r->nprompts > 1 ? c->r->nprompts : 1;
    ig_key_limit_t tok, why;
    int allowed =
        ig_key_use_reserve(a->use, uv_hrtime(), c->prompt_tokens * prompts, asked, &tok, &why);
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
    if (ig_api_body_cap(a->call.body, a->call.len, c->cap_fields, c->ncap_fields,
                        allowed / outputs, &a->edited, &a->call.len) != 0)
        return ig_api_error_oom(e);
    a->call.body = a->edited;
    return 0;
}

/* The key's policy: its models, its tokens (serve.c authenticated it and
 * took its request token). */
static int admit_key(ig_http_req_t *req, admission_t *a, const gw_call_t *c, ig_api_error_t *e)
{
    if (a->key == NULL)
        return 0;
    if (!ig_key_allows_model(a->key, c->model)) {
        ig_api_error(e, 403, "model", "this API key may not use the model '%s'", c->model);
        e->type = "permission_error";
        e->code = "model_not_allowed";
        return IG_EINVAL;
    }
    return reserve_tokens(req, a, c, e);
}

/* Token ids count exactly here, so an over-long one never takes an
 * upstream's time; text is counted by the worker that tokenizes it. */
static int admit_prompt(ig_gateway_t *gw, const gw_call_t *c, ig_api_error_t *e)
{
    int rc;
    for (int i = 0; c->r != NULL && i < c->r->nprompts; i++) {
        if (c->r->prompts[i].text == NULL &&
            (rc = ig_api_check_prompt_limit(c->r, c->r->prompts[i].nids,
                                            (int)gw->cfg->limits.max_prompt_tokens, e)) != 0)
            return rc;
    }
    return 0;
}

/* Once there are keys, only a peer gateway's key may say "forwarded, serve
 * it here": from anyone else the mark is ignored (and never passed on: the
 * proxy writes its own), or a client could pin itself to this region's
 * pools. Without keys anyone is trusted, the mark included (it is what
 * stops two regions from forwarding in a loop). */
static int local_only(ig_gateway_t *gw, ig_http_req_t *req, const ig_key_t *key)
{
    int trusted = gw->cfg->napi_keys == 0 || (key != NULL && ig_key_policy(key)->peer);
    return trusted && ig_http_req_header(req, "x-infergate-forwarded") != NULL;
}

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

/*
 * The shortest wait, in seconds, a new request of priority for model can
 * expect (ig_router_predicted_wait over the upstreams it may go to, with
 * the requests the proxy holds ahead of it). Negative when nothing is
 * known yet: then nothing is refused on a guess.
 */
static double predicted_wait(ig_gateway_t *gw, const char *model, int priority, int local)
{
    ig_proxy_target_t t[64];
    ig_router_upstream_t *ups[64];
    int starting = 0, k = 0;
    int n = ig__gateway_targets(gw, model, t, 64, &starting, 0); /* a look, not a request */
    for (int i = 0; i < n; i++) {
        if (!(local && t[i].is_site))
            ups[k++] = t[i].route;
    }
    return ig_router_predicted_wait(ig_proxy_router(gw->proxy), ups, k,
                                    ig_proxy_queued_ahead(gw->proxy, model, priority),
                                    uv_hrtime());
}

static ig_metric_t *m_admission;

/* Admission by predicted wait: a request that would wait longer than its
 * budget is told so now, not after the wait. */
static int admit_wait(ig_gateway_t *gw, admission_t *a, const gw_call_t *c, ig_api_error_t *e)
{
    static const char *const pn[] = {"critical", "standard", "sheddable"};
    if (a->budget_ms == 0)
        return 0;
    double wait = predicted_wait(gw, c->model, a->call.priority, a->call.local_only);
    if (wait * 1000.0 <= (double)a->budget_ms)
        return 0;
    if (m_admission == NULL)
        m_admission = ig_metrics_counter("infergate_admission_rejections_total",
                                         "Requests refused at once because their predicted wait "
                                         "exceeded their budget, by priority.",
                                         "priority");
    ig_metric_add(m_admission, 1, pn[a->call.priority]);
    ig_api_error(e, 429, NULL,
                 "the predicted wait for model '%s' (%.0f ms) exceeds this request's budget "
                 "(%llu ms); retry later",
                 c->model, wait * 1000.0, (unsigned long long)a->budget_ms);
    e->code = "predicted_wait_exceeds_budget";
    e->retry_after_s = (int)ceil(wait - (double)a->budget_ms / 1000.0);
    return IG_EINVAL;
}

/* The routing key: the model, or the version the request pins or draws;
 * the answer names that version. */
static int admit_version(ig_gateway_t *gw, ig_http_req_t *req, admission_t *a,
                         const gw_call_t *c, ig_api_error_t *e)
{
    const char *version;
    int rc = ig__gateway_route_key(gw, req, c->model, a->key_buf, sizeof(a->key_buf), &version, e);
    if (rc != 0)
        return rc;
    if (version != NULL)
        ig_http_add_header(req, IG_GATEWAY_VERSION_HEADER, version);
    a->call.model = a->key_buf; /* the body names the model; the key picks the version */
    return 0;
}

/* The first prompt's tokens as its worker will prefill them: an exact
 * count for the cost, and its block hashes for the prefix index. */
static void prefix_hashes(ig_gateway_t *gw, admission_t *a, const gw_call_t *c)
{
    const gw_prefix_model_t *pm = c->r != NULL ? prefix_model(gw, c->model) : NULL;
    int *ids = NULL, nids = 0;
    int ids_only = c->r != NULL && c->r->kind != IG_API_CHAT && c->r->nprompts > 0 &&
                   c->r->prompts[0].text == NULL;
    if (pm && (pm->tok || ids_only) &&
        ig_prefix_prompt_tokens(pm->tok, pm->style, c->r, 0, &ids, &nids, NULL, 0) == 0) {
        int bs = prefix_block_size(gw, pm);
        int cap = nids / bs + 1;
        if ((a->hashes = malloc(sizeof(uint64_t) * (size_t)cap)) != NULL) {
            a->call.nprefix = ig_prefix_hashes(ig_prefix_seed(c->model), ids, nids, bs, a->hashes,
                                               cap);
            a->call.prefix_hashes = a->hashes;
            a->call.block_size = bs;
        }
        if (c->r->kind == IG_API_CHAT || c->r->nprompts == 1)
            a->call.prompt_tokens = nids;
    }
    free(ids);
}

/* The rest of the proxy's call: the session, the answers' tokens, and a
 * TTFT SLO the client may tighten (never loosen). */
static void call_rest(ig_http_req_t *req, admission_t *a, const gw_call_t *c)
{
    a->call.session_id = ig_http_req_header(req, "x-session-id");
    long long out = (long long)c->max_tokens * (c->outputs > 0 ? c->outputs : 1);
    a->call.output_tokens = out > (1 << 24) ? 1 << 24 : (int)out;
    const char *slo = ig_http_req_header(req, "x-infergate-slo-ttft-ms");
    if (slo != NULL) {
        char *end;
        double ms = strtod(slo, &end);
        if (end != slo && *end == '\0' && ms > 0 && isfinite(ms))
            a->call.slo_ttft_s = ms / 1000.0;
    }
}

/*
 * Admits one read request and hands it to the proxy, one step after the
 * other: the model, the key's model list and tokens, the operator's prompt
 * limit, the forwarded mark and the priority, the predicted wait, the
 * version, then the prefix hashes. 0 when the proxy took the request, else
 * an error in e for the caller to answer.
 */
static int admit_and_forward(ig_gateway_t *gw, ig_http_req_t *req, const gw_call_t *c,
                             ig_api_error_t *e)
{
    admission_t a;
    memset(&a.call, 0, sizeof(a.call));
    a.call.body = ig_http_req_body(req, &a.call.len);
    a.use = ig_http_req_get_data(req);
    a.key = a.use != NULL ? ig_key_use_key(a.use) : NULL;
    a.edited = NULL;
    a.hashes = NULL;
    int rc = admit_model(gw, c, e);
    if (rc == 0)
        rc = admit_key(req, &a, c, e);
    if (rc == 0)
        rc = admit_prompt(gw, c, e);
    if (rc == 0) {
        a.call.local_only = local_only(gw, req, a.key);
        a.call.priority = request_priority(req, a.key);
        a.budget_ms = queue_budget_ms(gw, req, a.call.priority);
        rc = admit_wait(gw, &a, c, e);
    }
    if (rc == 0)
        rc = admit_version(gw, req, &a, c, e);
    if (rc == 0) {
        a.call.path = c->path;
        a.call.stream = c->stream;
        a.call.prompt_tokens = c->prompt_tokens;
        /* Admitted on a prediction: one that turns out a little short is
         * still served rather than dropped at its budget; twice the budget
         * is the most it is held. */
        a.call.max_queue_ms = a.budget_ms * 2;
        a.call.region = gw->region[0] ? gw->region : NULL;
        prefix_hashes(gw, &a, c);
        call_rest(req, &a, c);
        ig_proxy_handle(gw->proxy, req, &a.call);
    }
    free(a.hashes);
    free(a.edited);
    return rc;
}

/* ---- the entry ------------------------------------------------------------ */

/* Reads a completion or chat body into r and c: the peek, or the whole
 * parse where the gateway needs the prompt (token ids, or prefix-aware
 * routing with the model's tokenizer). 0 (dispose r), or an error in e
 * and nothing to dispose. */
static int read_openai(ig_gateway_t *gw, ig_http_req_t *req, ig_api_kind_t kind,
                       ig_api_request_t *r, gw_call_t *c, ig_api_error_t *e)
{
    static const char *const completion_cap[] = {"max_tokens"};
    static const char *const chat_cap[] = {"max_completion_tokens", "max_tokens"};
    size_t len, prompt_bytes;
    const char *body = ig_http_req_body(req, &len);
    int rc = ig_api_peek(kind, body, len, r, &prompt_bytes, e);
    if (rc < 0)
        return rc;
    const gw_prefix_model_t *pm = r->model != NULL ? prefix_model(gw, r->model) : NULL;
    int whole = rc == 1 || (pm != NULL && pm->tok != NULL);
    if (whole) {
        ig_api_request_dispose(r);
        if ((rc = ig_api_parse(kind, body, len, r, e)) != 0)
            return rc;
    }
    size_t guess = prompt_bytes / 4 + 1;
    c->path = kind == IG_API_CHAT ? "/v1/chat/completions" : "/v1/completions";
    c->model = r->model;
    c->stream = r->stream;
    c->prompt_tokens = whole ? estimate_tokens(r) : guess > 1 << 20 ? 1 << 20 : (int)guess;
    c->outputs = (r->best_of > r->n ? r->best_of : r->n) *
                 (kind == IG_API_CHAT || r->nprompts < 1 ? 1 : r->nprompts);
    c->max_tokens = r->max_tokens;
    c->cap_fields = kind == IG_API_CHAT ? chat_cap : completion_cap;
    c->ncap_fields = kind == IG_API_CHAT ? 2 : 1;
    c->r = whole ? r : NULL;
    return 0;
}

static void handle_openai(ig_gateway_t *gw, ig_http_req_t *req, ig_api_kind_t kind)
{
    ig_api_request_t r;
    ig_api_error_t e;
    gw_call_t c;
    int rc = read_openai(gw, req, kind, &r, &c, &e);
    int read = rc == 0;
    if (rc == 0)
        rc = admit_and_forward(gw, req, &c, &e);
    if (rc != 0)
        ig_api_respond_error(req, &e);
    if (read)
        ig_api_request_dispose(&r);
}

static void handle_routed(ig_gateway_t *gw, ig_http_req_t *req, ig_api_routed_kind_t kind)
{
    static const char *const responses_cap[] = {"max_output_tokens"};
    size_t len;
    const char *body = ig_http_req_body(req, &len);
    ig_api_routed_t r;
    ig_api_error_t e;
    int rc = ig_api_parse_routed(kind, body, len, &r, &e);
    int read = rc == 0;
    if (rc == 0) {
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
        rc = admit_and_forward(gw, req, &c, &e);
    }
    if (rc != 0)
        ig_api_respond_error(req, &e);
    if (read)
        ig_api_routed_dispose(&r);
}

void ig_gateway_completions(ig_http_req_t *req, void *gw)
{
    handle_openai(gw, req, IG_API_COMPLETION);
}

void ig_gateway_chat(ig_http_req_t *req, void *gw)
{
    handle_openai(gw, req, IG_API_CHAT);
}

void ig_gateway_embeddings(ig_http_req_t *req, void *gw)
{
    handle_routed(gw, req, IG_API_EMBEDDINGS);
}

void ig_gateway_responses(ig_http_req_t *req, void *gw)
{
    handle_routed(gw, req, IG_API_RESPONSES);
}
