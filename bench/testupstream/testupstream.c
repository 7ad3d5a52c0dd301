/*
 * testupstream: a programmable OpenAI-style HTTP server for benchmarks and
 * integration tests. Its latency, errors, stalls and stream failures are
 * set by flags (and some at run time through /_control/...), and every random
 * choice comes from one seeded generator, so a run is reproducible.
 *
 * Delays use a timerfd-backed queue (bench/lib/benchutil.h): a response due
 * at 20 ms leaves within a few tens of µs of 20 ms, which the accuracy tests
 * of igbench rely on.
 */
#include "../lib/benchutil.h"

#include <jansson.h>
#include <llhttp.h>

#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_URL 8192
#define MAX_BODY (16u << 20)

typedef enum {
    K_COMPLETIONS,
    K_CHAT,
    K_GET,
    K_BYTES,
    K_CONTROL,
    K_LOAD,
    K_NOTFOUND,
    K_BADREQ,
} kind_t;

typedef struct conn_s conn_t;

typedef struct req_s {
    conn_t *c;
    struct req_s *next;
    kind_t kind;
    int stream;
    int include_usage;
    int tokens;
    int prompt_tokens;
    int error_status; /* 0, or the injected error status */
    int fail_after;   /* -1, or tokens sent before the connection is reset */
    int sent;         /* tokens sent so far */
    int partial;      /* --fail-partial drawn: half the body, then a reset */
    int reset_due;    /* the partial body is out; the next due resets */
    int keep_alive;
    int head_only; /* a HEAD request: headers, no body */
    size_t nbytes; /* for GET /bytes/N */
    char model[128];
    char url[MAX_URL];
    uint64_t id;
    uint64_t t_arrive;
    int has_slot;     /* holds one of the --slots */
    uint64_t slot_at; /* since when (its service's start) */
    igb_link_t wlink; /* in g.waitq while it waits for a slot */
    uint64_t next_due;
    igb_tq_entry_t tq;
} req_t;

struct conn_s {
    uv_tcp_t tcp;
    llhttp_t parser;
    char url[MAX_URL];
    size_t url_len;
    char *body;
    size_t body_len, body_cap;
    req_t *head, *tail;
    int closing;
    int active;          /* head request started */
    igb_tq_entry_t idle; /* closes an idle keep-alive connection */
};

static struct {
    uv_loop_t *loop;
    uv_tcp_t server;
    igb_tq_t tq;
    llhttp_settings_t settings;
    igb_rng_t rng;
    igb_dist_t delay;        /* ms */
    igb_dist_t change_delay; /* --change-delay: drawn instead from --change-at on */
    double change_at_s;      /* seconds after the first request; 0 = never */
    double itl_ms;
    int force_tokens; /* 0: use the request's max_tokens */
    double error_rate;
    int error_status;
    double stall_at_s, stall_for_s;   /* relative to the first request; at < 0 off */
    uint64_t stall_from, stall_until; /* absolute hrtime window */
    int fail_after;
    double fail_rate;
    int fail_partial;       /* --fail-partial */
    int role_first;         /* --chat-role-first */
    double idle_timeout_ms; /* 0: keep idle connections open */
    uint64_t first_request;
    uint64_t nreq, nconn, nactive_conn, nstalled, nfailed, nerrors;
    int quiet;
    /* --slots: at most `slots` requests are served at once (0 = no limit);
     * the others wait in arrival order in `waitq`. */
    int slots, busy;
    int instant_raw;  /* --instant-raw */
    int report_load;  /* --report-load: GET /load answers like an infergate instance */
    int vllm_metrics; /* --vllm-metrics: GET /metrics answers with vLLM's queue gauges */
    igb_link_t waitq; /* req_t.wlink */
    uint64_t nwaiting, nqueued_total;
    uint64_t ncompletions, nraw;  /* requests by kind, for /_control/stats */
    uint64_t max_inside;          /* the most completions in a slot or waiting for one at once */
    uint64_t slot_ns, slot_holds; /* time the slots were held, in all, and by how many releases */
    uint64_t max_open_conn;       /* the most connections open at once */
} g;

/* ------------------------------------------------------------------------- */
/* Output                                                                    */
/* ------------------------------------------------------------------------- */

typedef struct {
    uv_write_t w;
    uv_buf_t buf;
} wreq_t;

static void on_written(uv_write_t *w, int status)
{
    wreq_t *wr = (wreq_t *)w;
    free(wr->buf.base);
    free(wr);
}

/* Takes ownership of data (malloc'd). */
static void send_raw(conn_t *c, char *data, size_t len)
{
    if (c->closing) {
        free(data);
        return;
    }
    wreq_t *wr = malloc(sizeof(*wr));
    if (!wr) {
        free(data);
        return;
    }
    wr->buf = uv_buf_init(data, (unsigned)len);
    if (uv_write(&wr->w, (uv_stream_t *)&c->tcp, &wr->buf, 1, on_written) != 0) {
        free(data);
        free(wr);
    }
}

static void send_fmt(conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void send_fmt(conn_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n >= 0)
        send_raw(c, s, (size_t)n);
}

/* One chunk of a chunked body. */
static void send_chunk(conn_t *c, const char *data, size_t len)
{
    send_fmt(c, "%zx\r\n%.*s\r\n", len, (int)len, data);
}

static void send_response(conn_t *c, req_t *r, int status, const char *ctype, const char *body,
                          size_t len)
{
    send_fmt(c, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s\r\n%.*s", status,
             status < 300 ? "OK" : "Error", ctype, len,
             r->keep_alive ? "" : "Connection: close\r\n", r->head_only ? 0 : (int)len, body);
}

static void send_str(conn_t *c, req_t *r, int status, const char *ctype, const char *body)
{
    send_response(c, r, status, ctype, body, strlen(body));
}

/* ------------------------------------------------------------------------- */
/* Connection lifecycle                                                      */
/* ------------------------------------------------------------------------- */

static void slot_release(req_t *r);
static void wait_unlink(req_t *r);

static void free_reqs(conn_t *c)
{
    while (c->head) {
        req_t *r = c->head;
        c->head = r->next;
        igb_tq_remove(&g.tq, &r->tq);
        wait_unlink(r);
        slot_release(r);
        free(r);
    }
    c->tail = NULL;
}

static void on_conn_closed(uv_handle_t *h)
{
    conn_t *c = h->data;
    free(c->body);
    free(c);
}

static void conn_close(conn_t *c, int reset)
{
    if (c->closing)
        return;
    c->closing = 1;
    g.nactive_conn--;
    igb_tq_remove(&g.tq, &c->idle);
    free_reqs(c);
    if (reset && uv_tcp_close_reset(&c->tcp, on_conn_closed) == 0)
        return;
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void start_head(conn_t *c, int at_arrival);

static void on_idle(igb_tq_entry_t *e)
{
    conn_t *c = (conn_t *)((char *)e - offsetof(conn_t, idle));
    if (!c->head)
        conn_close(c, 0);
}

static void arm_idle(conn_t *c)
{
    if (g.idle_timeout_ms > 0 && !c->head && !c->closing)
        igb_tq_add(&g.tq, &c->idle, uv_hrtime() + (uint64_t)(g.idle_timeout_ms * 1e6), on_idle);
}

static void on_shutdown(uv_shutdown_t *sd, int status)
{
    conn_t *c = sd->handle->data;
    free(sd);
    conn_close(c, 0);
}

/* The head request is answered: drop it and start the next one. */
static void finish_head(conn_t *c)
{
    req_t *r = c->head;
    int keep = r->keep_alive;
    c->head = r->next;
    if (!c->head)
        c->tail = NULL;
    slot_release(r);
    free(r);
    c->active = 0;
    if (!keep) {
        /* Let the queued writes drain before closing: uv_close would cancel them. */
        uv_shutdown_t *sd = malloc(sizeof(*sd));
        if (sd && uv_shutdown(sd, (uv_stream_t *)&c->tcp, on_shutdown) == 0)
            return;
        free(sd);
        conn_close(c, 0);
        return;
    }
    if (c->head)
        start_head(c, 0);
    else
        arm_idle(c);
}

/* ------------------------------------------------------------------------- */
/* Answers                                                                   */
/* ------------------------------------------------------------------------- */

static const char *const words[] = {
    " the",  " model", " answers", " quickly", " with", " tokens", " of", " text", " and",
    " then", " it",    " stops",   " when",    " told", " to",     " by", " the",  " limit",
};

static const char *word(req_t *r, int i)
{
    return words[(r->id * 7 + (uint64_t)i) % (sizeof(words) / sizeof(words[0]))];
}

static uint64_t stall_adjust(uint64_t due)
{
    if (g.stall_until && due >= g.stall_from && due < g.stall_until)
        return g.stall_until;
    return due;
}

static void on_due(igb_tq_entry_t *e);

static void answer_plain(conn_t *c, req_t *r)
{
    char buf[512];
    if (r->error_status) {
        int n = snprintf(buf, sizeof(buf),
                         "{\"error\":{\"message\":\"injected error\",\"type\":\"server_error\","
                         "\"param\":null,\"code\":%d}}",
                         r->error_status);
        send_response(c, r, r->error_status, "application/json", buf, (size_t)n);
        return;
    }
    switch (r->kind) {
    case K_GET:
        send_response(c, r, 200, "text/plain", "ok\n", 3);
        return;
    case K_BYTES: {
        char *body = malloc(r->nbytes + 1);
        if (!body)
            return;
        memset(body, 'x', r->nbytes);
        char hdr[256];
        int n = snprintf(hdr, sizeof(hdr),
                         "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                         "Content-Length: %zu\r\n%s\r\n",
                         r->nbytes, r->keep_alive ? "" : "Connection: close\r\n");
        send_raw(c, strdup(hdr), (size_t)n);
        if (r->head_only)
            free(body);
        else
            send_raw(c, body, r->nbytes);
        return;
    }
    case K_NOTFOUND:
        send_str(c, r, 404, "application/json",
                 "{\"error\":{\"message\":\"not found\",\"type\":\"invalid_request_error\","
                 "\"param\":null,\"code\":404}}");
        return;
    case K_BADREQ:
        send_str(c, r, 400, "application/json",
                 "{\"error\":{\"message\":\"bad request\",\"type\":\"invalid_request_error\","
                 "\"param\":null,\"code\":400}}");
        return;
    default:
        break;
    }
    /* A non-streamed completion. */
    size_t cap = 512 + (size_t)r->tokens * 16, len = 0;
    char *text = malloc(cap);
    if (!text)
        return;
    text[0] = 0;
    for (int i = 0; i < r->tokens; i++)
        len += (size_t)snprintf(text + len, cap - len, "%s", word(r, i));
    char *body = NULL;
    int n;
    if (r->kind == K_CHAT)
        n = asprintf(&body,
                     "{\"id\":\"chatcmpl-%llu\",\"object\":\"chat.completion\",\"created\":0,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                     "\"assistant\",\"content\":\"%s\"},\"finish_reason\":\"length\"}],"
                     "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                     "\"total_tokens\":%d}}",
                     (unsigned long long)r->id, r->model, text, r->prompt_tokens, r->tokens,
                     r->prompt_tokens + r->tokens);
    else
        n = asprintf(&body,
                     "{\"id\":\"cmpl-%llu\",\"object\":\"text_completion\",\"created\":0,"
                     "\"model\":\"%s\",\"choices\":[{\"index\":0,\"text\":\"%s\","
                     "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":%d,"
                     "\"completion_tokens\":%d,\"total_tokens\":%d}}",
                     (unsigned long long)r->id, r->model, text, r->prompt_tokens, r->tokens,
                     r->prompt_tokens + r->tokens);
    free(text);
    if (n < 0)
        return;
    if (r->partial) {
        /* The whole length is promised, half the body leaves, and the
         * connection is reset a little later (so that the half arrives). */
        send_fmt(
            c,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%.*s",
            n, n / 2, body);
        free(body);
        g.nfailed++;
        r->reset_due = 1;
        igb_tq_add(&g.tq, &r->tq, uv_hrtime() + 20 * 1000000ULL, on_due);
        return;
    }
    send_response(c, r, 200, "application/json", body, (size_t)n);
    free(body);
}

static void send_event(conn_t *c, const char *json)
{
    char buf[1024];
    int n = snprintf(buf, sizeof(buf), "data: %s\n\n", json);
    send_chunk(c, buf, (size_t)n);
}

static void send_token(conn_t *c, req_t *r)
{
    char buf[768];
    const char *w = word(r, r->sent);
    if (r->kind == K_CHAT)
        snprintf(buf, sizeof(buf),
                 "{\"id\":\"chatcmpl-%llu\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                 "\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{%s\"content\":\"%s\"},"
                 "\"finish_reason\":null}]%s}",
                 (unsigned long long)r->id, r->model,
                 r->sent == 0 && !g.role_first ? "\"role\":\"assistant\"," : "", w,
                 r->include_usage ? ",\"usage\":null" : "");
    else
        snprintf(buf, sizeof(buf),
                 "{\"id\":\"cmpl-%llu\",\"object\":\"text_completion\",\"created\":0,"
                 "\"model\":\"%s\",\"choices\":[{\"index\":0,\"text\":\"%s\","
                 "\"finish_reason\":null}]%s}",
                 (unsigned long long)r->id, r->model, w, r->include_usage ? ",\"usage\":null" : "");
    send_event(c, buf);
    r->sent++;
}

static void send_stream_end(conn_t *c, req_t *r)
{
    char buf[768];
    if (r->kind == K_CHAT)
        snprintf(buf, sizeof(buf),
                 "{\"id\":\"chatcmpl-%llu\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                 "\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{},"
                 "\"finish_reason\":\"length\"}]%s}",
                 (unsigned long long)r->id, r->model, r->include_usage ? ",\"usage\":null" : "");
    else
        snprintf(buf, sizeof(buf),
                 "{\"id\":\"cmpl-%llu\",\"object\":\"text_completion\",\"created\":0,"
                 "\"model\":\"%s\",\"choices\":[{\"index\":0,\"text\":\"\","
                 "\"finish_reason\":\"length\"}]%s}",
                 (unsigned long long)r->id, r->model, r->include_usage ? ",\"usage\":null" : "");
    send_event(c, buf);
    if (r->include_usage) {
        snprintf(buf, sizeof(buf),
                 "{\"id\":\"%s-%llu\",\"object\":\"%s\",\"created\":0,\"model\":\"%s\","
                 "\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                 "\"total_tokens\":%d}}",
                 r->kind == K_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)r->id,
                 r->kind == K_CHAT ? "chat.completion.chunk" : "text_completion", r->model,
                 r->prompt_tokens, r->sent, r->prompt_tokens + r->sent);
        send_event(c, buf);
    }
    send_event(c, "[DONE]");
    send_raw(c, strdup("0\r\n\r\n"), 5);
}

static void on_due(igb_tq_entry_t *e)
{
    req_t *r = (req_t *)((char *)e - offsetof(req_t, tq));
    conn_t *c = r->c;
    uint64_t now = uv_hrtime();
    if (r->reset_due) {
        conn_close(c, 1);
        return;
    }
    uint64_t adj = stall_adjust(now);
    if (adj != now) {
        /* The server is frozen: whatever falls due now waits for the thaw. */
        g.nstalled++;
        igb_tq_add(&g.tq, &r->tq, adj, on_due);
        return;
    }
    int streamed = r->stream && !r->error_status && (r->kind == K_COMPLETIONS || r->kind == K_CHAT);
    if (!streamed) {
        answer_plain(c, r);
        if (!r->reset_due)
            finish_head(c);
        return;
    }
    if (r->fail_after >= 0 && r->sent >= r->fail_after) {
        g.nfailed++;
        conn_close(c, 1);
        return;
    }
    if (r->sent < r->tokens) {
        send_token(c, r);
        if (r->sent < r->tokens || (r->fail_after >= 0 && r->sent >= r->fail_after)) {
            r->next_due += (uint64_t)(g.itl_ms * 1e6);
            if (r->next_due < now)
                r->next_due = now;
            igb_tq_add(&g.tq, &r->tq, r->next_due, on_due);
            return;
        }
    }
    send_stream_end(c, r);
    finish_head(c);
}

/* ------------------------------------------------------------------------- */
/* Slots: a FIFO in front of the service, like a server with N workers        */
/* ------------------------------------------------------------------------- */

static void begin_service(req_t *r, uint64_t t_start);
static void answer_control(conn_t *c, req_t *r);

static void wait_unlink(req_t *r)
{
    if (!igb_link_linked(&r->wlink))
        return;
    igb_list_remove(&r->wlink);
    g.nwaiting--;
}

/* Gives r's slot back and hands it to the longest-waiting request, whose
 * delay starts now. */
static void slot_release(req_t *r)
{
    if (!r->has_slot)
        return;
    r->has_slot = 0;
    g.busy--;
    g.slot_ns += uv_hrtime() - r->slot_at;
    g.slot_holds++;
    igb_link_t *l;
    while ((l = igb_list_first(&g.waitq)) && g.busy < g.slots) {
        req_t *w = IGB_CONTAINER_OF(l, req_t, wlink);
        wait_unlink(w);
        w->has_slot = 1;
        g.busy++;
        w->slot_at = uv_hrtime();
        begin_service(w, w->slot_at);
    }
}

/* Starts the head request of c: at once, or after a wait for a slot.
 * at_arrival: called as the request arrived (not after an earlier request on
 * the same connection finished). */
static void start_head(conn_t *c, int at_arrival)
{
    req_t *r = c->head;
    c->active = 1;
    if (r->kind == K_CONTROL || r->kind == K_LOAD) {
        /* Control requests bypass delay, stall and slots, and are answered
         * here so that they leave in order; a /load report was answered at
         * arrival (on_message_complete). */
        if (r->kind == K_CONTROL)
            answer_control(c, r);
        finish_head(c);
        return;
    }
    if (g.instant_raw && (r->kind == K_GET || r->kind == K_BYTES || r->kind == K_NOTFOUND)) {
        /* Like a real server's /health: answered by the HTTP front, never
         * behind the model's work, and drawing nothing from the seed. */
        answer_plain(c, r);
        finish_head(c);
        return;
    }
    /* Only completions take slots: probes (GET /health, /load, ...) and
     * other raw requests do not queue behind the model's work. */
    if (g.slots > 0 && (r->kind == K_COMPLETIONS || r->kind == K_CHAT)) {
        if (g.busy >= g.slots) {
            igb_list_push(&g.waitq, &r->wlink);
            g.nwaiting++;
            g.nqueued_total++;
            if ((uint64_t)g.busy + g.nwaiting > g.max_inside)
                g.max_inside = (uint64_t)g.busy + g.nwaiting;
            return;
        }
        r->has_slot = 1;
        g.busy++;
        if ((uint64_t)g.busy + g.nwaiting > g.max_inside)
            g.max_inside = (uint64_t)g.busy + g.nwaiting;
        /* A pipelined request gets its slot only now, when it reaches the
         * head of its connection; its service starts now too. */
        r->slot_at = at_arrival ? r->t_arrive : uv_hrtime();
        begin_service(r, r->slot_at);
        return;
    }
    begin_service(r, r->t_arrive);
}

/* Draws the request's service (delay, error, failure) and schedules its
 * first output at t_start + delay. */
static void begin_service(req_t *r, uint64_t t_start)
{
    conn_t *c = r->c;
    int changed = g.change_at_s > 0 && g.first_request != 0 &&
                  t_start > g.first_request + (uint64_t)(g.change_at_s * 1e9);
    double delay_ms = igb_dist_sample(changed ? &g.change_delay : &g.delay, &g.rng);
    if (g.error_rate > 0 && igb_rng_double(&g.rng) < g.error_rate) {
        r->error_status = g.error_status;
        g.nerrors++;
    }
    if (r->stream && g.fail_after >= 0 && igb_rng_double(&g.rng) < g.fail_rate)
        r->fail_after = g.fail_after;
    if (!r->stream && g.fail_partial && !r->error_status &&
        (r->kind == K_COMPLETIONS || r->kind == K_CHAT) && igb_rng_double(&g.rng) < g.fail_rate)
        r->partial = 1;
    uint64_t due = t_start + (uint64_t)(delay_ms * 1e6);
    int streamed = r->stream && !r->error_status && (r->kind == K_COMPLETIONS || r->kind == K_CHAT);
    if (streamed) {
        send_fmt(c,
                 "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 "Transfer-Encoding: chunked\r\n%s\r\n",
                 r->keep_alive ? "" : "Connection: close\r\n");
        if (r->kind == K_CHAT && g.role_first) {
            /* Like a worker: the role delta leaves at once, with empty
             * content; the tokens follow after the delay. */
            char ev[512];
            snprintf(ev, sizeof(ev),
                     "{\"id\":\"chatcmpl-%llu\",\"object\":\"chat.completion.chunk\","
                     "\"created\":0,\"model\":\"%s\",\"choices\":[{\"index\":0,\"delta\":"
                     "{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}",
                     (unsigned long long)r->id, r->model);
            send_event(c, ev);
        }
    } else if (r->kind == K_COMPLETIONS || r->kind == K_CHAT) {
        /* A non-streamed answer ends when the last token would have. */
        if (r->tokens > 1)
            due += (uint64_t)((r->tokens - 1) * g.itl_ms * 1e6);
    }
    r->next_due = due;
    igb_tq_add(&g.tq, &r->tq, due, on_due);
}

/* ------------------------------------------------------------------------- */
/* Requests                                                                  */
/* ------------------------------------------------------------------------- */

static double query_num(const char *url, const char *key, double dflt)
{
    const char *q = strchr(url, '?');
    size_t kl = strlen(key);
    while (q) {
        q++;
        if (strncmp(q, key, kl) == 0 && q[kl] == '=')
            return strtod(q + kl + 1, NULL);
        q = strchr(q, '&');
    }
    return dflt;
}

static int count_words(const char *s)
{
    int n = 0, in = 0;
    for (; *s; s++) {
        int sp = (*s == ' ' || *s == '\n' || *s == '\t');
        if (!sp && !in)
            n++;
        in = !sp;
    }
    return n;
}

static void copy_model(char *dst, size_t cap, const char *src)
{
    size_t j = 0;
    /* Only plain characters: the name is echoed into JSON unescaped. */
    for (size_t i = 0; src[i] && j + 1 < cap; i++) {
        char ch = src[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            strchr("._-/:", ch))
            dst[j++] = ch;
    }
    dst[j] = 0;
}

static void parse_body(conn_t *c, req_t *r)
{
    json_error_t err;
    json_t *root = json_loadb(c->body ? c->body : "", c->body_len, 0, &err);
    if (!root || !json_is_object(root)) {
        r->kind = K_BADREQ;
        json_decref(root);
        return;
    }
    json_t *mt = json_object_get(root, "max_tokens");
    if (!mt)
        mt = json_object_get(root, "max_completion_tokens");
    r->tokens = json_is_integer(mt) ? (int)json_integer_value(mt) : 16;
    if (g.force_tokens > 0)
        r->tokens = g.force_tokens;
    if (r->tokens < 1)
        r->tokens = 1;
    if (r->tokens > 100000)
        r->tokens = 100000;
    r->stream = json_is_true(json_object_get(root, "stream"));
    json_t *so = json_object_get(root, "stream_options");
    r->include_usage = json_is_true(json_object_get(so, "include_usage"));
    const char *model = json_string_value(json_object_get(root, "model"));
    copy_model(r->model, sizeof(r->model), model ? model : "test");
    const char *prompt = json_string_value(json_object_get(root, "prompt"));
    if (prompt)
        r->prompt_tokens = count_words(prompt);
    json_t *msgs = json_object_get(root, "messages");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        const char *content = json_string_value(json_object_get(m, "content"));
        if (content)
            r->prompt_tokens += count_words(content);
    }
    json_decref(root);
}

static void answer_control(conn_t *c, req_t *r)
{
    const char *path = r->url + strlen("/_control/");
    char body[768]; /* the stats at their widest: 16 numbers of up to 20 digits and 209 bytes */
    int n;
    if (strncmp(path, "stall", 5) == 0) {
        double ms = query_num(r->url, "ms", 1000);
        g.stall_from = uv_hrtime();
        g.stall_until = g.stall_from + (uint64_t)(ms * 1e6);
        n = snprintf(body, sizeof(body), "{\"stall_ms\":%g}", ms);
    } else if (strncmp(path, "delay", 5) == 0) {
        double ms = query_num(r->url, "ms", 0);
        memset(&g.delay, 0, sizeof(g.delay));
        g.delay.kind = IGB_DIST_FIXED;
        g.delay.a = ms;
        n = snprintf(body, sizeof(body), "{\"delay_ms\":%g}", ms);
    } else if (strncmp(path, "error-rate", 10) == 0) {
        g.error_rate = query_num(r->url, "p", 0);
        n = snprintf(body, sizeof(body), "{\"error_rate\":%g}", g.error_rate);
    } else if (strncmp(path, "stats", 5) == 0) {
        n = snprintf(
            body, sizeof(body),
            "{\"requests\":%llu,\"connections\":%llu,\"open_connections\":%llu,"
            "\"stalled\":%llu,\"failed_streams\":%llu,\"errors\":%llu,"
            "\"slots\":%d,\"busy\":%d,\"waiting\":%llu,\"queued\":%llu,"
            "\"completions\":%llu,\"raw\":%llu,\"max_inside\":%llu,\"max_open_connections\":%llu,"
            "\"slot_s\":%.6f,\"slot_holds\":%llu}",
            (unsigned long long)g.nreq, (unsigned long long)g.nconn,
            (unsigned long long)g.nactive_conn, (unsigned long long)g.nstalled,
            (unsigned long long)g.nfailed, (unsigned long long)g.nerrors, g.slots, g.busy,
            (unsigned long long)g.nwaiting, (unsigned long long)g.nqueued_total,
            (unsigned long long)g.ncompletions, (unsigned long long)g.nraw,
            (unsigned long long)g.max_inside, (unsigned long long)g.max_open_conn,
            (double)g.slot_ns / 1e9, (unsigned long long)g.slot_holds);
    } else {
        send_str(c, r, 404, "application/json", "{\"error\":\"unknown control\"}");
        return;
    }
    send_response(c, r, 200, "application/json", body, (size_t)n);
}

/* GET /load in the shape of an infergate instance's (docs: /load): what is
 * queued and running now, and the slots, so a router can model the queue. */
static void answer_load(conn_t *c, req_t *r)
{
    char body[512];
    int n = snprintf(body, sizeof(body),
                     "{\"ready_instances\":1,\"waiting\":%llu,\"running\":%d,\"inflight\":%llu,"
                     "\"max_num_seqs\":%d}",
                     (unsigned long long)g.nwaiting, g.busy,
                     (unsigned long long)g.nwaiting + (unsigned long long)g.busy, g.slots);
    send_response(c, r, 200, "application/json", body, (size_t)n);
}

/* GET /metrics as vLLM publishes its queue: requests holding a slot and
 * requests waiting for one, as Prometheus gauges. */
static void answer_metrics(conn_t *c, req_t *r)
{
    char body[512];
    int n = snprintf(body, sizeof(body),
                     "# TYPE vllm:num_requests_running gauge\n"
                     "vllm:num_requests_running{model_name=\"m\"} %d.0\n"
                     "# TYPE vllm:num_requests_waiting gauge\n"
                     "vllm:num_requests_waiting{model_name=\"m\"} %llu.0\n",
                     g.busy, (unsigned long long)g.nwaiting);
    send_response(c, r, 200, "text/plain; version=0.0.4", body, (size_t)n);
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (c->url_len + len >= MAX_URL)
        return -1;
    memcpy(c->url + c->url_len, at, len);
    c->url_len += len;
    c->url[c->url_len] = 0;
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (c->body_len + len > MAX_BODY)
        return -1;
    return igb_buf_append(&c->body, &c->body_len, &c->body_cap, at, len, SIZE_MAX);
}

static int on_message_begin(llhttp_t *p)
{
    conn_t *c = p->data;
    c->url_len = 0;
    c->url[0] = 0;
    c->body_len = 0;
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return -1;
    igb_tq_entry_init(&r->tq);
    r->c = c;
    r->fail_after = -1;
    r->t_arrive = uv_hrtime();
    r->keep_alive = llhttp_should_keep_alive(p);
    r->id = g.nreq++;
    memcpy(r->url, c->url, c->url_len + 1);
    if (!g.first_request) {
        g.first_request = r->t_arrive;
        if (g.stall_at_s >= 0 && g.stall_for_s > 0) {
            g.stall_from = r->t_arrive + (uint64_t)(g.stall_at_s * 1e9);
            g.stall_until = g.stall_from + (uint64_t)(g.stall_for_s * 1e9);
        }
    }
    int method = llhttp_get_method(p);
    r->head_only = method == HTTP_HEAD;
    char path[MAX_URL];
    strcpy(path, r->url);
    char *q = strchr(path, '?');
    if (q)
        *q = 0;
    if (g.report_load && method == HTTP_GET && strcmp(path, "/load") == 0) {
        /* Answered at once, like a control request: a load report that
         * waited behind the model would report a past state. */
        r->kind = K_LOAD;
        answer_load(c, r);
    } else if (g.vllm_metrics && method == HTTP_GET && strcmp(path, "/metrics") == 0) {
        r->kind = K_LOAD; /* at once, as /load */
        answer_metrics(c, r);
    } else if (strncmp(path, "/_control/", 10) == 0) {
        r->kind = K_CONTROL;
    } else if (method == HTTP_POST && strcmp(path, "/v1/completions") == 0) {
        r->kind = K_COMPLETIONS;
        parse_body(c, r);
    } else if (method == HTTP_POST && strcmp(path, "/v1/chat/completions") == 0) {
        r->kind = K_CHAT;
        parse_body(c, r);
    } else if ((method == HTTP_GET || method == HTTP_HEAD) && strncmp(path, "/bytes/", 7) == 0) {
        r->kind = K_BYTES;
        r->nbytes = strtoul(path + 7, NULL, 10);
        if (r->nbytes > MAX_BODY)
            r->nbytes = MAX_BODY;
    } else if (method == HTTP_GET || method == HTTP_POST || method == HTTP_HEAD) {
        /* Any other GET or POST is a "raw" request: "ok" after the delay. */
        r->kind = K_GET;
    } else {
        r->kind = K_NOTFOUND;
    }
    igb_tq_remove(&g.tq, &c->idle);
    if (r->kind == K_COMPLETIONS || r->kind == K_CHAT)
        g.ncompletions++;
    else if (r->kind == K_GET || r->kind == K_BYTES || r->kind == K_LOAD)
        g.nraw++;
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    if (!c->active)
        start_head(c, 1);
    return 0;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (nread < 0) {
        conn_close(c, 0);
        return;
    }
    if (nread == 0 || c->closing)
        return;
    llhttp_errno_t e = llhttp_execute(&c->parser, buf->base, (size_t)nread);
    if (e != HPE_OK && !c->closing) {
        if (!g.quiet)
            fprintf(stderr, "testupstream: bad request: %s\n", llhttp_errno_name(e));
        send_fmt(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        uv_read_stop(s);
        uv_shutdown_t *sd = malloc(sizeof(*sd));
        if (!sd || uv_shutdown(sd, s, on_shutdown) != 0) {
            free(sd);
            conn_close(c, 0);
        }
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    if (status < 0)
        return;
    conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    igb_tq_entry_init(&c->idle);
    uv_tcp_init(g.loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    g.nconn++;
    g.nactive_conn++;
    if (g.nactive_conn > g.max_open_conn)
        g.max_open_conn = g.nactive_conn;
    llhttp_init(&c->parser, HTTP_REQUEST, &g.settings);
    c->parser.data = c;
    uv_read_start((uv_stream_t *)&c->tcp, igb_on_alloc, on_read);
    arm_idle(c);
}

/* ------------------------------------------------------------------------- */
/* Main                                                                      */
/* ------------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: testupstream [options]\n"
        "\n"
        "A programmable OpenAI-style upstream for benchmarks and tests. Serves\n"
        "  POST /v1/completions, POST /v1/chat/completions  (\"stream\": true gives SSE,\n"
        "       one event per token, then a finish chunk, a usage chunk when\n"
        "       stream_options.include_usage is set, and data: [DONE])\n"
        "  GET  /bytes/N      N bytes of 'x'\n"
        "  GET|POST any other path   \"ok\\n\" (a raw request)\n"
        "  /_control/stall?ms=N      freeze all answers for N ms from now\n"
        "  /_control/delay?ms=N      set a fixed delay\n"
        "  /_control/error-rate?p=X  set the injected error rate\n"
        "  /_control/stats           counters as JSON\n"
        "Control requests are answered at once (no delay, no stall).\n"
        "\n"
        "options:\n"
        "  --listen HOST:PORT     address (default 127.0.0.1:0, a kernel-picked port)\n"
        "  --port-file FILE       write the bound port to FILE once listening\n"
        "  --seed N               seed for every random choice (default 1)\n"
        "  --delay-ms MS          fixed delay before the answer / first token (default 0)\n"
        "  --delay-dist SPEC      delay distribution in ms: N | uniform:A:B | exp:MEAN |\n"
        "                         choice:A@W,B@W,... (e.g. choice:10@0.6,40@0.4)\n"
        "  --change-at S          from S seconds after the first request on, draw the\n"
        "  --change-delay SPEC    delay from SPEC instead (a fleet whose speed changes)\n"
        "  --itl-ms MS            delay between streamed tokens (default 0); a non-streamed\n"
        "                         answer is sent when its last token would have been\n"
        "  --tokens N             output tokens per completion (default: the request's\n"
        "                         max_tokens, itself 16 when absent)\n"
        "  --error-rate P         fraction of requests answered with an error (default 0)\n"
        "  --error-status CODE    status of injected errors (default 500)\n"
        "  --stall-at S           freeze all answers S seconds after the first request ...\n"
        "  --stall-for S          ... for S seconds (answers due meanwhile leave at the end)\n"
        "  --fail-after-tokens K  reset the connection (RST) after K streamed tokens ...\n"
        "  --fail-rate P          ... in a fraction P of streams (default 1)\n"
        "  --fail-partial         non-streamed completions (a fraction --fail-rate of\n"
        "                         them) send their headers and half the body, then\n"
        "                         reset the connection 20 ms later\n"
        "  --chat-role-first      a chat stream sends its role delta (role assistant,\n"
        "                         empty content) with the headers, at once; the\n"
        "                         content tokens follow after the delay, as a worker's\n"
        "  --slots N              serve at most N completions at once (default 0: no\n"
        "                         limit); the others wait for a slot in arrival order\n"
        "                         (FIFO), and a request's delay and ITL start when it\n"
        "                         gets its slot, which it holds until its last byte.\n"
        "                         Capacity is then N / mean service time. Raw and\n"
        "                         control requests never take a slot\n"
        "  --instant-raw          answer raw requests (GET /health, /load, /v1/models,\n"
        "                         /bytes/N, any other path) at once, without delay,\n"
        "                         stall, error injection or a draw from the seed: a\n"
        "                         router's probes then see the network, not the model\n"
        "  --report-load          answer GET /load at once like an infergate instance:\n"
        "                         {ready_instances, waiting, running, inflight,\n"
        "                         max_num_seqs (= --slots)}, so a gateway that probes it\n"
        "                         knows its slots and queue\n"
        "  --vllm-metrics         answer GET /metrics at once with vLLM's queue gauges\n"
        "                         (vllm:num_requests_running and _waiting), as a plain\n"
        "                         vLLM site publishes every client's requests\n"
        "  --spin-us US           wake this early and spin, for precise timing (default 200)\n"
        "  --idle-timeout-ms MS   close keep-alive connections idle this long (default: never)\n"
        "  --quiet                no log lines on stderr\n"
        "  --help                 this text\n"
        "\n"
        "On start it prints \"testupstream listening on HOST:PORT\" to stdout.\n"
        "Answers on one connection leave in request order; the delay counts from\n"
        "the arrival of each request (with --slots: from when it gets a slot).\n");
}

static void on_signal(uv_signal_t *s, int signum)
{
    uv_stop(g.loop);
}

int main(int argc, char **argv)
{
    double spin_us = 200;
    const char *listen = "127.0.0.1:0", *port_file = NULL;
    unsigned long long seed = 1;
    g.stall_at_s = -1;
    g.error_status = 500;
    g.fail_after = -1;
    g.fail_rate = 1.0;
    igb_dist_parse("0", &g.delay);
    igb_dist_parse("0", &g.change_delay);
    igb_list_init(&g.waitq);
    igb_opts_t o;
    igb_opts_init(&o, "testupstream", argc, argv, usage);
    int more;
    while ((more = igb_opts_next(&o)) > 0) {
        const char *a = o.opt, *v = NULL;
        if (!strcmp(a, "--listen")) {
            IGB_NEED(&o, v);
            listen = v;
        } else if (!strcmp(a, "--port-file")) {
            IGB_NEED(&o, v);
            port_file = v;
        } else if (!strcmp(a, "--seed")) {
            IGB_NEED(&o, v);
            seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--delay-ms") || !strcmp(a, "--delay-dist")) {
            IGB_NEED(&o, v);
            if (igb_dist_parse(v, &g.delay) != 0) {
                fprintf(stderr, "testupstream: bad delay '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--change-delay")) {
            IGB_NEED(&o, v);
            if (igb_dist_parse(v, &g.change_delay) != 0) {
                fprintf(stderr, "testupstream: bad delay '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--change-at")) {
            IGB_NEED(&o, v);
            g.change_at_s = atof(v);
        } else if (!strcmp(a, "--itl-ms")) {
            IGB_NEED(&o, v);
            g.itl_ms = atof(v);
        } else if (!strcmp(a, "--tokens")) {
            IGB_NEED(&o, v);
            g.force_tokens = atoi(v);
        } else if (!strcmp(a, "--error-rate")) {
            IGB_NEED(&o, v);
            g.error_rate = atof(v);
        } else if (!strcmp(a, "--error-status")) {
            IGB_NEED(&o, v);
            g.error_status = atoi(v);
        } else if (!strcmp(a, "--stall-at")) {
            IGB_NEED(&o, v);
            g.stall_at_s = atof(v);
        } else if (!strcmp(a, "--stall-for")) {
            IGB_NEED(&o, v);
            g.stall_for_s = atof(v);
        } else if (!strcmp(a, "--fail-after-tokens")) {
            IGB_NEED(&o, v);
            g.fail_after = atoi(v);
        } else if (!strcmp(a, "--fail-rate")) {
            IGB_NEED(&o, v);
            g.fail_rate = atof(v);
        } else if (!strcmp(a, "--fail-partial")) {
            g.fail_partial = 1;
        } else if (!strcmp(a, "--chat-role-first")) {
            g.role_first = 1;
        } else if (!strcmp(a, "--idle-timeout-ms")) {
            IGB_NEED(&o, v);
            g.idle_timeout_ms = atof(v);
        } else if (!strcmp(a, "--instant-raw")) {
            g.instant_raw = 1;
        } else if (!strcmp(a, "--report-load")) {
            g.report_load = 1;
        } else if (!strcmp(a, "--vllm-metrics")) {
            g.vllm_metrics = 1;
        } else if (!strcmp(a, "--slots")) {
            IGB_NEED(&o, v);
            char *end = NULL;
            long n = strtol(v, &end, 10);
            if (!end || *end || n < 0 || n > 1000000) {
                fprintf(stderr, "testupstream: --slots must be 0..1000000\n");
                return 2;
            }
            g.slots = (int)n;
        } else if (igb_opt_shared(&o, &spin_us, &g.quiet) != 0) {
            return 2;
        }
    }
    if (more < 0)
        return 0;
    if (g.error_status < 100 || g.error_status > 599) {
        fprintf(stderr, "testupstream: --error-status must be 100..599\n");
        return 2;
    }
    if (g.stall_at_s >= 0 && g.stall_for_s <= 0)
        g.stall_for_s = 1.0;
    igb_rng_init(&g.rng, seed);
    signal(SIGPIPE, SIG_IGN);
    g.loop = uv_default_loop();
    llhttp_settings_init(&g.settings);
    g.settings.on_message_begin = on_message_begin;
    g.settings.on_url = on_url;
    g.settings.on_body = on_body;
    g.settings.on_message_complete = on_message_complete;

    igb_addr_t addr;
    if (igb_addr_parse(listen, &addr) != 0 || addr.is_unix) {
        fprintf(stderr, "testupstream: bad --listen '%s' (HOST:PORT)\n", listen);
        return 2;
    }
    int rc = igb_tq_start(g.loop, &g.tq);
    g.tq.spin_ns = (uint64_t)(spin_us * 1000);
    if (rc == 0)
        rc = uv_tcp_init(g.loop, &g.server);
    if (rc == 0)
        rc = uv_tcp_bind(&g.server, (struct sockaddr *)&addr.ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&g.server, 1024, on_connection);
    if (rc != 0) {
        fprintf(stderr, "testupstream: cannot listen on %s: %s\n", listen, uv_strerror(rc));
        return 1;
    }
    char name[128];
    igb_tcp_name(&g.server, name, sizeof(name));
    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (f) {
            fprintf(f, "%s\n", strrchr(name, ':') + 1);
            fclose(f);
        }
    }
    printf("testupstream listening on %s\n", name);
    fflush(stdout);
    uv_signal_t sigint, sigterm;
    uv_signal_init(g.loop, &sigint);
    uv_signal_init(g.loop, &sigterm);
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
    uv_run(g.loop, UV_RUN_DEFAULT);
    if (!g.quiet)
        fprintf(stderr, "testupstream: %llu requests, %llu connections\n",
                (unsigned long long)g.nreq, (unsigned long long)g.nconn);
    return 0;
}
