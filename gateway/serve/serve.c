/*
 * `infergate serve`: the gateway of one region.
 *
 * Start-up order matters for operators: the config is loaded and checked
 * completely before anything listens, so a bad config exits 2 with its
 * message and never takes a port. Then logging, signals, the HTTP server.
 *
 * Shutdown: the first SIGTERM/SIGINT makes /ready answer 503 at once, but
 * the server goes on accepting and serving for limits.drain_grace_ms, so
 * that a readiness probe sees the 503 and the load balancer takes the
 * gateway out before any connection is refused. Then the listener closes
 * and requests in flight finish for up to limits.drain_timeout_ms
 * (ig_http_server_close), and the process exits 0. A second signal stops
 * the loop at once and exits 1.
 */
#include "infergate/serve.h"
#include "infergate/api.h"
#include "infergate/cli.h"
#include "infergate/config.h"
#include "infergate/error.h"
#include "infergate/gateway.h"
#include "infergate/http.h"
#include "infergate/http_route.h"
#include "infergate/keys.h"
#include "infergate/log.h"
#include "infergate/metrics.h"
#include "infergate/tls.h"

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

struct ig_serve_s {
    uv_loop_t *loop;
    ig_config_t cfg;
    ig_http_server_t *server;
    ig_gateway_t *gw; /* pools, sites and the proxy behind the /v1 routes */
    ig_keys_t *keys;  /* api_keys and their policy */
    int load_open;    /* GET /load needs no key (no admin and no peer key) */
    uv_signal_t sigterm;
    uv_signal_t sigint;
    uv_signal_t sighup; /* reloads the config and the listener's certificate */
    uv_timer_t grace;   /* the drain grace: from the first signal to closing the listener */
    ig_serve_ready_cb ready_cb;
    void *ready_data;
    int draining;     /* first signal seen */
    int forced;       /* second signal seen: exit without waiting */
    int handles_open; /* the signal handles and the grace timer */
    int tls;          /* the listener speaks TLS */
    /* what a reload reads again: the file (NULL: the embedded default) and
     * the command line's overrides */
    const char *config_path;
    const char *listen_override;
    int log_overridden;
    /* configs and key sets replaced by reloads: requests in flight may still
     * point into them (a key's policy, its buckets), so they are freed at
     * exit; each is a few KB and only an operator makes one */
    struct retired_s {
        ig_config_t cfg;
        ig_keys_t *keys;
    } * retired;
    size_t nretired;
};

/* ---- readiness ---------------------------------------------------------- */

void ig_serve_set_readiness(ig_serve_t *s, ig_serve_ready_cb cb, void *data)
{
    s->ready_cb = cb;
    s->ready_data = data;
}

int ig_serve_ready(ig_serve_t *s, char *reason, size_t reason_len)
{
    if (s->draining) {
        snprintf(reason, reason_len, "shutting down");
        return 0;
    }
    if (s->ready_cb == NULL) {
        snprintf(reason, reason_len, "no backend is attached yet");
        return 0;
    }
    reason[0] = '\0';
    if (s->ready_cb(s->ready_data, reason, reason_len))
        return 1;
    if (reason[0] == '\0')
        snprintf(reason, reason_len, "not ready");
    return 0;
}

const ig_config_t *ig_serve_config(const ig_serve_t *s)
{
    return &s->cfg;
}

uv_loop_t *ig_serve_loop(const ig_serve_t *s)
{
    return s->loop;
}

/* The serve state the infergate_ready gauge reads; NULL once it is gone
 * (the registry outlives it, and other modules' families stay registered). */
static ig_serve_t *gauge_serve;

static double ready_gauge(void *data)
{
    char reason[256];
    return gauge_serve != NULL && ig_serve_ready(gauge_serve, reason, sizeof(reason));
}

/* ---- endpoints ---------------------------------------------------------- */

static void handle_health(ig_http_req_t *req, void *data)
{
    static const char body[] = "{\"status\":\"ok\"}";
    ig_http_respond(req, 200, "application/json", body, sizeof(body) - 1);
}

static void handle_ready(ig_http_req_t *req, void *data)
{
    ig_serve_t *s = data;
    static const char body[] = "{\"status\":\"ready\"}";
    char reason[256];
    if (ig_serve_ready(s, reason, sizeof(reason))) {
        ig_http_respond(req, 200, "application/json", body, sizeof(body) - 1);
        return;
    }
    ig_http_respond_error(req, 503, "unavailable_error", NULL, "not_ready", "not ready: %s",
                          reason);
}

static void handle_metrics(ig_http_req_t *req, void *data)
{
    ig_serve_t *s = data;
    if (s->gw != NULL) {
        ig_gateway_metrics(s->gw, req);
        return;
    }
    size_t len;
    char *text = ig_metrics_render(&len);
    if (text == NULL) {
        ig_api_respond_oom(req);
        return;
    }
    ig_http_respond(req, 200, "text/plain; version=0.0.4", text, len);
    free(text);
}

static int tls_load(ig_serve_t *s, char *err, size_t errlen);

/* ---- reload ------------------------------------------------------------- */

/*
 * Reads the config again and hands it to the gateway (ig_gateway_reload).
 * An invalid config is refused with its message and the running one stays;
 * the listen address cannot move without a restart, so a new one is
 * ignored with a warning. Returns 0 (summary says what changes), IG_EBUSY,
 * IG_ESTATE (shutting down) or the load's error with the message in err.
 */
static int reload(ig_serve_t *s, const char *trigger, char *summary, size_t slen, char *err,
                  size_t errlen)
{
    ig_config_t next;
    int rc;
    summary[0] = '\0';
    if (s->draining || s->gw == NULL) {
        snprintf(err, errlen, "the gateway is shutting down");
        return IG_ESTATE;
    }
    rc = s->config_path ? ig_config_load_file(&next, s->config_path, err, errlen)
                        : ig_config_load_default(&next, err, errlen);
    if (rc != 0) {
        IG_WARN("reload (%s) refused: %s; the running config stays", trigger, err);
        ig_gateway_reload_count("invalid");
        return rc;
    }
    if (strcmp(next.listen, s->cfg.listen) != 0) {
        if (s->listen_override == NULL)
            IG_WARN("reload (%s): listen %s -> %s needs a restart; still listening on %s", trigger,
                    s->cfg.listen, next.listen, s->cfg.listen);
        char *copy = strdup(s->cfg.listen);
        if (copy == NULL) {
            ig_config_dispose(&next);
            snprintf(err, errlen, "out of memory");
            return IG_ENOMEM;
        }
        free(next.listen);
        next.listen = copy;
    }
    ig_keys_t *keys;
    struct retired_s *r = realloc(s->retired, (s->nretired + 1) * sizeof(*r));
    if (r == NULL || ig_keys_new(&keys, &next) != 0) {
        if (r != NULL)
            s->retired = r;
        ig_config_dispose(&next);
        snprintf(err, errlen, "out of memory");
        return IG_ENOMEM;
    }
    s->retired = r;
    ig_config_t prev = s->cfg; /* the gateway reads s->cfg: swap the contents */
    s->cfg = next;
    rc = ig_gateway_reload(s->gw, &prev, &s->cfg, summary, slen, err, errlen);
    if (rc != 0) {
        next = s->cfg;
        s->cfg = prev;
        ig_config_dispose(&next);
        ig_keys_free(keys);
        IG_WARN("reload (%s) refused: %s; the running config stays", trigger, err);
        ig_gateway_reload_count(rc == IG_EBUSY ? "busy" : "invalid");
        return rc;
    }
    s->retired[s->nretired].cfg = prev;
    s->retired[s->nretired++].keys = s->keys;
    ig_keys_carry_spend(keys, s->keys);
    s->keys = keys;
    s->load_open = s->cfg.admin_open;
    for (size_t i = 0; i < s->cfg.napi_keys; i++)
        s->load_open &= !s->cfg.keys[i].peer;
    if (s->server != NULL)
        ig_http_server_set_limits(s->server, &s->cfg.limits.http);
    if (!s->log_overridden)
        ig_log_setup((ig_log_level_t)s->cfg.log.level, (ig_log_format_t)s->cfg.log.format);
    IG_INFO("reload (%s) of %s: %s", trigger, s->cfg.source, summary);
    if (!s->tls && s->cfg.tls.cert_file != NULL)
        IG_WARN("reload (%s): tls needs a restart: the listener stays plain HTTP", trigger);
    if (s->tls && s->cfg.tls.cert_file == NULL)
        IG_WARN("reload (%s): plain HTTP needs a restart: the listener keeps its certificate",
                trigger);
    else if (s->tls && s->server != NULL) {
        char terr[512];
        if (tls_load(s, terr, sizeof(terr)) != 0)
            IG_ERROR("reload (%s): certificate not reloaded, the old one stays in use: %s", trigger,
                     terr);
        else
            IG_INFO("reload (%s): reloaded %s; new connections use it", trigger,
                    s->cfg.tls.cert_file);
    }
    return 0;
}

static void handle_reload(ig_http_req_t *req, void *data)
{
    ig_serve_t *s = data;
    char summary[1024], err[1024];
    int rc = reload(s, "POST /admin/reload", summary, sizeof(summary), err, sizeof(err));
    if (rc == IG_EBUSY) {
        ig_http_respond_error(req, 409, "invalid_request_error", NULL, "reload_in_progress", "%s",
                              err);
        return;
    }
    if (rc == IG_ESTATE) {
        ig_http_respond_error(req, 503, "unavailable_error", NULL, "shutting_down", "%s", err);
        return;
    }
    if (rc != 0) {
        ig_http_respond_error(req, rc == IG_ENOMEM ? 503 : 400, "invalid_request_error", NULL,
                              "invalid_config", "%s", err);
        return;
    }
    json_t *body = json_pack("{s:s, s:s, s:s}", "status", "reloading", "config",
                             s->cfg.source ? s->cfg.source : "", "changes", summary);
    ig_api_respond_json(req, 200, body);
}

/*
 * The gateway's routes; new endpoints add a row. When the config lists API
 * keys, rows with NEEDS_KEY need one of them; ADMIN rows need a key with
 * admin once some key has it (else they stay open, for probes and
 * dashboards); /load (PEER) needs a peer or admin key once some key is
 * either, since what it answers feeds other gateways' routing. CONTROL rows
 * change the gateway: they need an admin key once some key has admin, and
 * any key while none has; they are open only with no keys at all. /health
 * and /ready stay open (docs/security.md). GATEWAY rows are the gateway's
 * own handlers, called with the gateway as their data.
 */
enum { NEEDS_KEY = 1, ADMIN = 2, PEER = 4, CONTROL = 8, GATEWAY = 16 }; /* a row's flags */

static const ig_http_route_t routes[] = {
    {"GET", "/health", handle_health, 0},
    {"GET", "/ready", handle_ready, 0},
    {"GET", "/metrics", handle_metrics, ADMIN},
    {"POST", "/v1/completions", ig_gateway_completions, NEEDS_KEY | GATEWAY},
    {"POST", "/v1/chat/completions", ig_gateway_chat, NEEDS_KEY | GATEWAY},
    {"POST", "/v1/embeddings", ig_gateway_embeddings, NEEDS_KEY | GATEWAY},
    {"POST", "/v1/responses", ig_gateway_responses, NEEDS_KEY | GATEWAY},
    {"GET", "/v1/models", ig_gateway_models, NEEDS_KEY | GATEWAY},
    {"GET", "/load", ig_gateway_load, PEER | GATEWAY},
    {"GET", "/status", ig_gateway_status, ADMIN | GATEWAY},
    {"GET", "/", ig_gateway_page, GATEWAY},
    {"POST", "/admin/reload", handle_reload, CONTROL},
};

static void answer_unauthorized(ig_http_req_t *req)
{
    ig_http_add_header(req, "WWW-Authenticate", "Bearer");
    ig_http_respond_error(req, 401, "invalid_request_error", NULL, "invalid_api_key",
                          "missing or invalid API key (Authorization: Bearer KEY)");
}

/* 429 for a key's limit, with when to come back. */
static void answer_limited(ig_http_req_t *req, const ig_key_limit_t *why)
{
    char ra[32];
    snprintf(ra, sizeof(ra), "%d", (int)ceil(why->retry_after > 0 ? why->retry_after : 1));
    ig_http_add_header(req, "Retry-After", ra);
    if (strcmp(why->which, "budget") == 0) {
        ig_http_respond_error(req, 429, "rate_limit_error", NULL, "budget_exceeded",
                              "the budget of this API key ($%.6g) is spent for this period; "
                              "retry after %s s",
                              why->limit, ra);
        return;
    }
    ig_key_limit_headers(req, why);
    ig_http_respond_error(req, 429, "rate_limit_error", NULL, "rate_limit_exceeded",
                          "rate limit of this API key reached (%s); retry after %s s", why->which,
                          ra);
}

static void on_request(ig_http_req_t *req, void *data)
{
    ig_serve_t *s = data;
    const ig_http_route_t *row =
        ig_http_route_match(routes, sizeof(routes) / sizeof(routes[0]), req);
    if (row == NULL)
        return; /* answered: 404 or 405 */
    ig_key_t *key = NULL;
    if (ig_keys_count(s->keys) > 0)
        key = ig_keys_find(s->keys, ig_http_req_header(req, "Authorization"));
    const ig_config_key_t *p = key != NULL ? ig_key_policy(key) : NULL;
    int ok = 1;
    if (row->flags & NEEDS_KEY)
        ok = ig_keys_count(s->keys) == 0 || key != NULL;
    else if (row->flags & ADMIN)
        ok = s->cfg.admin_open || (p != NULL && p->admin);
    else if (row->flags & PEER)
        ok = s->load_open || (p != NULL && (p->admin || p->peer));
    else if (row->flags & CONTROL)
        ok = ig_keys_count(s->keys) == 0 ||
             (s->cfg.admin_open ? key != NULL : (p != NULL && p->admin));
    if (!ok && key == NULL) {
        answer_unauthorized(req);
        return;
    }
    if (!ok) {
        ig_key_count(key, 403);
        ig_http_respond_error(req, 403, "permission_error", NULL, "forbidden",
                              "this API key may not use %s", ig_http_req_path(req));
        return;
    }
    if (key != NULL && (row->flags & NEEDS_KEY)) {
        ig_key_limit_t lim, why;
        if (ig_key_admit(key, uv_hrtime(), &lim, &why) != 0) {
            ig_key_count(key, 429);
            answer_limited(req, &why);
            return;
        }
        ig_key_limit_headers(req, &lim);
        if (ig_key_track(key, req) == NULL) {
            ig_api_respond_oom(req);
            return;
        }
    }
    row->handler(req, (row->flags & GATEWAY) ? (void *)s->gw : s);
}

/* ---- shutdown ----------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    ig_serve_t *s = h->data;
    s->handles_open--;
}

/* The serve command's own handles; once they are closed, uv_run returns. */
static void close_handles(ig_serve_t *s)
{
    uv_handle_t *hs[] = {(uv_handle_t *)&s->sigterm, (uv_handle_t *)&s->sigint,
                         (uv_handle_t *)&s->sighup, (uv_handle_t *)&s->grace};
    for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
        if (!uv_is_closing(hs[i]))
            uv_close(hs[i], on_handle_closed);
}

/* Workers have nothing in flight once the HTTP server has drained. */
#define WORKER_GRACE_MS 5000

/* The gateway's readiness as an ig_serve_ready_cb. */
static int gateway_ready(void *gw, char *reason, size_t reason_len)
{
    return ig_gateway_ready(gw, reason, reason_len);
}

static void on_gateway_closed(void *data)
{
    ig_serve_t *s = data;
    s->gw = NULL;
    IG_INFO("drained; exiting");
    close_handles(s); /* the last handles: uv_run returns */
}

static void on_server_closed(ig_http_server_t *server, void *data)
{
    ig_serve_t *s = data;
    s->server = NULL;
    ig_serve_set_readiness(s, NULL, NULL);
    if (s->gw != NULL)
        ig_gateway_close(s->gw, WORKER_GRACE_MS, on_gateway_closed, s);
    else
        on_gateway_closed(s);
}

/* The end of the grace: no more connections; those in flight get the
 * drain timeout. */
static void close_listener(ig_serve_t *s)
{
    if (s->server == NULL)
        return;
    IG_INFO("closing the listener: %u requests in flight get up to %llu ms",
            ig_http_server_inflight(s->server), (unsigned long long)s->cfg.limits.drain_timeout_ms);
    ig_http_server_close(s->server, s->cfg.limits.drain_timeout_ms, on_server_closed, s);
}

static void on_grace_end(uv_timer_t *t)
{
    close_listener(t->data);
}

static void on_signal(uv_signal_t *h, int signum)
{
    ig_serve_t *s = h->data;
    const char *name = signum == SIGTERM ? "SIGTERM" : "SIGINT";
    if (s->draining) {
        IG_WARN("%s again: exiting without waiting for %u requests in flight", name,
                s->server ? ig_http_server_inflight(s->server) : 0);
        s->forced = 1;
        uv_stop(s->loop);
        return;
    }
    s->draining = 1; /* /ready answers 503 from now on */
    IG_INFO("%s: draining (%u requests in flight): /ready answers 503, the listener closes in "
            "%llu ms, then requests in flight get up to %llu ms; a second signal exits now",
            name, s->server ? ig_http_server_inflight(s->server) : 0,
            (unsigned long long)s->cfg.limits.drain_grace_ms,
            (unsigned long long)s->cfg.limits.drain_timeout_ms);
    if (s->cfg.limits.drain_grace_ms == 0)
        close_listener(s);
    else
        uv_timer_start(&s->grace, on_grace_end, s->cfg.limits.drain_grace_ms, 0);
}

/* ---- TLS ---------------------------------------------------------------- */

/* Loads tls.cert_file and tls.key_file into the listener. At start a
 * failure is fatal; on SIGHUP the old certificate stays in use and open
 * connections are not touched either way. */
static int tls_load(ig_serve_t *s, char *err, size_t errlen)
{
    ig_tls_ctx_t *ctx;
    int rc = ig_tls_server_ctx_new(&ctx, s->cfg.tls.cert_file, s->cfg.tls.key_file, err, errlen);
    if (rc != 0)
        return rc;
    ig_http_server_set_tls(s->server, ctx, s->cfg.tls.handshake_timeout_ms);
    ig_tls_ctx_unref(ctx); /* the server holds it */
    return 0;
}

/* SIGHUP reloads the config (reload above), the certificate with it. */
static void on_sighup(uv_signal_t *h, int signum)
{
    ig_serve_t *s = h->data;
    char summary[1024], err[1024];
    (void)signum;
    reload(s, "SIGHUP", summary, sizeof(summary), err, sizeof(err));
}

/* ---- the command -------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: infergate serve [--config FILE] [--listen HOST:PORT|unix:PATH]\n"
            "                       [--log-level LEVEL] [--log-format FORMAT] [--check-config]\n"
            "                       [--help]\n"
            "\n"
            "Runs the gateway of one region: OpenAI-style HTTP in front of the local\n"
            "instance pools and remote sites of the config.\n"
            "\n"
            "  --config FILE        the region's JSON config (docs/config.md); without it,\n"
            "                       the embedded default: region \"local\" on 127.0.0.1:8080,\n"
            "                       one CPU pool serving model \"tiny\", generated from the\n"
            "                       mkmodel preset \"tiny\" into $INFERGATE_CACHE_DIR/models/tiny\n"
            "                       (default cache: $XDG_CACHE_HOME/infergate or\n"
            "                       ~/.cache/infergate)\n"
            "  --listen ADDR        overrides the config's listen: HOST:PORT with an IPv4 or\n"
            "                       [IPv6] address (port 0 picks a free one), or unix:PATH\n"
            "  --log-level LEVEL    debug, info, warn or error (overrides log.level)\n"
            "  --log-format FORMAT  text or json, one line per event on stderr\n"
            "                       (overrides log.format)\n"
            "  --check-config       check the config (as a start would) and exit: 0 when it\n"
            "                       is valid, 2 with the error otherwise; starts nothing\n"
            "  --help               this text\n"
            "\n"
            "Endpoints: GET /health (live), GET /ready (ready for traffic; 503 with the\n"
            "reason otherwise), GET /metrics (Prometheus text).\n"
            "\n"
            "Exit status: 0 after a graceful shutdown, 1 on a run-time failure (cannot\n"
            "listen) or a forced shutdown, 2 on a usage or config error (before listening).\n"
            "SIGTERM or SIGINT makes /ready answer 503 while the gateway still serves for\n"
            "limits.drain_grace_ms (5 s), then stops accepting and lets requests in flight\n"
            "finish for up to limits.drain_timeout_ms; a second signal exits at once.\n"
            "SIGHUP or POST /admin/reload reads the config again without dropping a request\n"
            "(docs/operations.md); an invalid config is refused and the running one stays.\n");
}

typedef struct {
    const char *config;
    const char *listen;
    const char *log_level;
    const char *log_format;
    int help;
    int check_config; /* --check-config: load, report, exit */
} args_t;

/* --flag VALUE or --flag=VALUE. 0, or IG_EINVAL with the message printed. */
static int parse_args(int argc, char **argv, args_t *a)
{
    static const struct {
        const char *name;
        size_t off;
    } flags[] = {
        {"--config", offsetof(args_t, config)},
        {"--listen", offsetof(args_t, listen)},
        {"--log-level", offsetof(args_t, log_level)},
        {"--log-format", offsetof(args_t, log_format)},
    };
    memset(a, 0, sizeof(*a));
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            a->help = 1;
            continue;
        }
        if (strcmp(arg, "--check-config") == 0) {
            a->check_config = 1;
            continue;
        }
        size_t k = 0, nflags = sizeof(flags) / sizeof(flags[0]);
        const char *value = NULL;
        for (; k < nflags; k++) {
            size_t n = strlen(flags[k].name);
            if (strncmp(arg, flags[k].name, n) != 0)
                continue;
            if (arg[n] == '=') {
                value = arg + n + 1;
                break;
            }
            if (arg[n] == '\0') {
                if (i + 1 >= argc) {
                    fprintf(stderr, "infergate serve: %s needs a value\n", arg);
                    return IG_EINVAL;
                }
                value = argv[++i];
                break;
            }
        }
        if (k == nflags) {
            fprintf(stderr, "infergate serve: unknown argument '%s' (see --help)\n", arg);
            return IG_EINVAL;
        }
        *(const char **)((char *)a + flags[k].off) = value;
    }
    return 0;
}

int ig_cmd_serve(int argc, char **argv)
{
    ig_serve_t s;
    args_t a;
    char err[1024];
    uv_loop_t loop;
    int rc, status = IG_EXIT_FAILURE;
    ig_log_level_t level;
    ig_log_format_t format;
    ig_tls_ctx_t *tls_ctx = NULL;

    memset(&s, 0, sizeof(s));
    if (parse_args(argc, argv, &a) != 0)
        return IG_EXIT_USAGE;
    if (a.help) {
        usage(stdout);
        return IG_EXIT_OK;
    }
    if (a.log_level != NULL && ig_log_level_parse(a.log_level, &level) != 0) {
        fprintf(stderr, "infergate serve: --log-level: '%s': must be debug, info, warn or error\n",
                a.log_level);
        return IG_EXIT_USAGE;
    }
    if (a.log_format != NULL && ig_log_format_parse(a.log_format, &format) != 0) {
        fprintf(stderr, "infergate serve: --log-format: '%s': must be text or json\n",
                a.log_format);
        return IG_EXIT_USAGE;
    }
    if (a.listen != NULL && ig_config_check_listen(a.listen, err, sizeof(err)) != 0) {
        fprintf(stderr, "infergate serve: --listen: %s\n", err);
        return IG_EXIT_USAGE;
    }

    /* The whole config is checked before anything listens. */
    rc = a.config ? ig_config_load_file(&s.cfg, a.config, err, sizeof(err))
                  : ig_config_load_default(&s.cfg, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "%s\n", err);
        return rc == IG_ENOMEM ? IG_EXIT_FAILURE : IG_EXIT_USAGE;
    }
    if (a.check_config) {
        /* What a deployment pipeline (or a ConfigMap's test) runs: the
         * same checks as a start, and nothing started. */
        printf("%s: ok (region %s, %zu models, %zu pools, %zu sites)\n", s.cfg.source, s.cfg.region,
               s.cfg.nmodels, s.cfg.npools, s.cfg.nsites);
        ig_config_dispose(&s.cfg);
        return IG_EXIT_OK;
    }
    if (a.listen != NULL) {
        char *copy = strdup(a.listen);
        if (copy == NULL)
            goto fail_config;
        free(s.cfg.listen);
        s.cfg.listen = copy;
    }
    /* A certificate that does not load is a config error, found before
     * anything listens. */
    if (s.cfg.tls.cert_file != NULL &&
        ig_tls_server_ctx_new(&tls_ctx, s.cfg.tls.cert_file, s.cfg.tls.key_file, err,
                              sizeof(err)) != 0) {
        fprintf(stderr, "%s: %s\n", s.cfg.source, err);
        ig_config_dispose(&s.cfg);
        return IG_EXIT_USAGE;
    }
    if (ig_keys_new(&s.keys, &s.cfg) != 0)
        goto fail_config;
    s.load_open = s.cfg.admin_open;
    for (size_t i = 0; i < s.cfg.napi_keys; i++)
        s.load_open &= !s.cfg.keys[i].peer;
    ig_log_setup(a.log_level ? level : (ig_log_level_t)s.cfg.log.level,
                 a.log_format ? format : (ig_log_format_t)s.cfg.log.format);
    ig_log_set_component("serve");

    /* A peer that resets mid-write must cost an EPIPE, not the process. */
    signal(SIGPIPE, SIG_IGN);

    if ((rc = uv_loop_init(&loop)) != 0) {
        IG_ERROR("cannot start the event loop: %s", ig_strerror(rc));
        goto fail_config;
    }
    s.loop = &loop;
    s.sigterm.data = &s;
    s.sigint.data = &s;
    s.sighup.data = &s;
    s.grace.data = &s;
    uv_signal_init(&loop, &s.sigterm);
    uv_signal_init(&loop, &s.sigint);
    uv_signal_init(&loop, &s.sighup);
    uv_timer_init(&loop, &s.grace);
    s.handles_open = 4;
    uv_signal_start(&s.sigterm, on_signal, SIGTERM);
    uv_signal_start(&s.sigint, on_signal, SIGINT);
    uv_signal_start(&s.sighup, on_sighup, SIGHUP);
    s.config_path = a.config;
    s.listen_override = a.listen;
    s.log_overridden = a.log_level != NULL || a.log_format != NULL;

    ig_metric_t *info =
        ig_metrics_gauge("infergate_build_info",
                         "Constant 1, labeled with the version and the region.", "version,region");
    ig_metric_set(info, 1, IG_VERSION, s.cfg.region);
    ig_metric_t *start = ig_metrics_gauge("infergate_start_time_seconds",
                                          "Start time of the process since the Unix epoch.", NULL);
    ig_metric_set(start, (double)time(NULL));
    ig_metrics_gauge_fn("infergate_ready", "1 when the gateway can serve traffic (GET /ready).",
                        ready_gauge, NULL);
    gauge_serve = &s;

    /* Pools and sites first (this may generate preset models): a gateway
     * that listens can route at once, and one that cannot start never listens. */
    char exe[4096];
    size_t exe_len = sizeof(exe);
    if ((rc = uv_exepath(exe, &exe_len)) != 0) {
        IG_ERROR("cannot find the infergate binary: %s", ig_strerror(rc));
        goto fail_signals;
    }
    ig_gateway_reload_metrics();
    if ((rc = ig_gateway_start(&s.gw, &loop, &s.cfg, exe, NULL, err, sizeof(err))) != 0) {
        IG_ERROR("cannot start the gateway: %s", err);
        s.gw = NULL;
        goto fail_signals;
    }
    ig_serve_set_readiness(&s, gateway_ready, s.gw);

    rc = ig_http_server_start(&s.server, &loop, s.cfg.listen, &s.cfg.limits.http, on_request, &s);
    if (rc != 0) {
        IG_ERROR("cannot listen on %s: %s", s.cfg.listen, ig_strerror(rc));
        s.server = NULL;
        ig_serve_set_readiness(&s, NULL, NULL);
        ig_gateway_close(s.gw, 0, on_gateway_closed, &s);
        uv_run(&loop, UV_RUN_DEFAULT);
        goto done;
    }
    if (tls_ctx != NULL) {
        ig_http_server_set_tls(s.server, tls_ctx, s.cfg.tls.handshake_timeout_ms);
        ig_tls_ctx_unref(tls_ctx);
        tls_ctx = NULL;
        s.tls = 1;
    }
    if (strncmp(s.cfg.listen, "unix:", 5) == 0) {
        IG_INFO("listening on %s (region %s, config %s)", s.cfg.listen, s.cfg.region, s.cfg.source);
    } else {
        /* The real port: with port 0 the kernel picked it, and tests read it here. */
        char host[64];
        size_t hlen = (size_t)(strrchr(s.cfg.listen, ':') - s.cfg.listen);
        snprintf(host, sizeof(host), "%.*s", (int)hlen, s.cfg.listen);
        IG_INFO("listening on %s://%s:%d (region %s, config %s)", s.tls ? "https" : "http", host,
                ig_http_server_port(s.server), s.cfg.region, s.cfg.source);
    }

    uv_run(&loop, UV_RUN_DEFAULT);
    if (s.forced) {
        /* Handles are still open and the process ends now; nothing to unwind. */
        return IG_EXIT_FAILURE;
    }
    status = IG_EXIT_OK;
    goto done;
fail_signals:
    close_handles(&s);
    uv_run(&loop, UV_RUN_DEFAULT);
done:
    gauge_serve = NULL;
    if (uv_loop_close(&loop) != 0)
        IG_WARN("event loop closed with handles still open");
fail_config:
    ig_keys_free(s.keys);
    for (size_t i = 0; i < s.nretired; i++) {
        ig_keys_free(s.retired[i].keys);
        ig_config_dispose(&s.retired[i].cfg);
    }
    free(s.retired);
    ig_tls_ctx_unref(tls_ctx);
    ig_config_dispose(&s.cfg);
    return status;
}
