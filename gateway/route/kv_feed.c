/*
 * GET /kv/events subscriber (include/infergate/kv_feed.h): its own
 * upstream client (so that the stream never takes a slot of the proxy's
 * connection pool), SSE framing, the snapshot and event codec, and the
 * reconnect backoff.
 */
#include "infergate/kv_feed.h"

#include "infergate/error.h"
#include "infergate/kv_index.h"
#include "infergate/log.h"
#include "infergate/metrics.h"
#include "infergate/prefix.h"
#include "infergate/upstream.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define HEARTBEAT_DEADLINE_MS 5000  /* the worker sends one each second */
#define MAX_EVENT_BYTES (32u << 20) /* a snapshot of 700k blocks */

struct ig_kv_feed_s {
    uv_loop_t *loop;
    char name[128];
    ig_router_upstream_t *u;
    ig_upstream_t *client;
    ig_upstream_req_t *req;
    uv_timer_t timer;
    int closing;
    uint64_t backoff_ms;
    ig_kv_index_t *idx;
    int live;
    uint64_t seq;
    uint64_t snapshots, losses, loads;
    char epoch[64];
    char last_error[160];
    char *buf; /* bytes of the event being received */
    size_t len, cap;
};

static ig_metric_t *m_live, *m_blocks, *m_lost;

static void metrics_register(void)
{
    if (m_live != NULL)
        return;
    m_live = ig_metrics_gauge("infergate_kv_index_live",
                              "1 while a worker's KV events feed its exact prefix index; 0 while "
                              "routing falls back to the approximate index",
                              "upstream");
    m_blocks = ig_metrics_gauge("infergate_kv_index_blocks",
                                "KV blocks the exact index says a worker holds", "upstream");
    m_lost = ig_metrics_counter("infergate_kv_events_lost_total",
                                "KV event streams lost after a snapshot (the exact index was "
                                "dropped until the next snapshot)",
                                "upstream");
}

static void connect_later(ig_kv_feed_t *f);

static void publish(ig_kv_feed_t *f)
{
    f->u->kv_exact = f->live ? f->idx : NULL;
    ig_metric_set(m_live, f->live, f->name);
    ig_metric_set(m_blocks, f->live && f->idx ? ig_kv_index_count(f->idx) : 0, f->name);
}

/* The exact index can no longer be believed: it leaves the router now. */
static void lose(ig_kv_feed_t *f, const char *why)
{
    if (f->live) {
        IG_WARN("kv events %s: lost (%s); routing on the approximate index", f->name, why);
        f->losses++;
        ig_metric_add(m_lost, 1, f->name);
    }
    snprintf(f->last_error, sizeof(f->last_error), "%s", why);
    f->live = 0;
    if (f->idx)
        ig_kv_index_clear(f->idx);
    publish(f);
}

/* Out of step: drop the stream and start over from a snapshot. */
static void restart(ig_kv_feed_t *f, const char *why)
{
    lose(f, why);
    if (f->req) {
        ig_upstream_cancel(f->req);
        f->req = NULL;
    }
    f->len = 0;
    f->backoff_ms = 0;
    connect_later(f);
}

static int hash_of(json_t *v, uint64_t *h)
{
    return json_is_string(v) ? ig_prefix_hash_parse(json_string_value(v), json_string_length(v), h)
                             : IG_EINVAL;
}

static void on_snapshot(ig_kv_feed_t *f, json_t *d)
{
    json_int_t bs = json_integer_value(json_object_get(d, "block_size"));
    json_int_t nb = json_integer_value(json_object_get(d, "num_blocks"));
    json_t *seq = json_object_get(d, "seq"), *blocks = json_object_get(d, "blocks");
    const char *epoch = json_string_value(json_object_get(d, "epoch"));
    if (bs <= 0 || nb <= 0 || nb > (1 << 24) || !json_is_integer(seq) || !json_is_array(blocks)) {
        restart(f, "malformed snapshot");
        return;
    }
    if (f->idx && (ig_kv_index_capacity(f->idx) != nb || ig_kv_index_block_size(f->idx) != bs)) {
        f->u->kv_exact = NULL;
        ig_kv_index_free(f->idx);
        f->idx = NULL;
    }
    if (!f->idx && ig_kv_index_create(&f->idx, (int)nb, (int)bs) != 0) {
        restart(f, "out of memory");
        return;
    }
    ig_kv_index_clear(f->idx);
    size_t i;
    json_t *b;
    json_array_foreach(blocks, i, b)
    {
        uint64_t h;
        if (hash_of(json_array_get(b, 0), &h) != 0 || ig_kv_index_add(f->idx, h) != 0) {
            restart(f, "snapshot does not fit");
            return;
        }
    }
    if (epoch && strcmp(epoch, f->epoch) != 0) {
        if (f->epoch[0]) {
            IG_INFO("kv events %s: a new worker process (%s)", f->name, epoch);
            f->u->kv_epoch++; /* the approximate index forgets it too */
        }
        snprintf(f->epoch, sizeof(f->epoch), "%s", epoch);
    }
    f->seq = (uint64_t)json_integer_value(seq);
    f->snapshots++;
    f->live = 1;
    f->backoff_ms = 0;
    publish(f);
}

static void on_events(ig_kv_feed_t *f, json_t *d)
{
    json_t *seq = json_object_get(d, "seq"), *evs = json_object_get(d, "events");
    if (!f->live) /* events before a snapshot: not ours to believe */
        return;
    if (!json_is_integer(seq) || !json_is_array(evs)) {
        restart(f, "malformed event");
        return;
    }
    if ((uint64_t)json_integer_value(seq) != f->seq + 1) {
        restart(f, "event numbers skipped");
        return;
    }
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e)
    {
        const char *kind = json_string_value(json_array_get(e, 0));
        uint64_t h;
        if (!kind || hash_of(json_array_get(e, 1), &h) != 0) {
            restart(f, "malformed event");
            return;
        }
        if (strcmp(kind, "stored") == 0) {
            if (ig_kv_index_add(f->idx, h) != 0) {
                restart(f, "more blocks than the worker has");
                return;
            }
        } else if (strcmp(kind, "removed") == 0) {
            ig_kv_index_remove(f->idx, h);
        }
        f->seq++;
    }
    publish(f);
}

void ig_kv_feed_take_load(ig_router_upstream_t *u, const ig_load_t *l, uint64_t now_ns)
{
    if (l->has & IG_LOAD_WAITING)
        u->reported_waiting = l->waiting;
    if (l->has & IG_LOAD_EST_WAIT) {
        u->reported_wait_s = l->est_wait_s;
        u->reported_wait_drains = 1;
    }
    if (l->has & IG_LOAD_PREFILL_TPS)
        u->reported_prefill_tps = l->prefill_tokens_per_s;
    if (l->has & IG_LOAD_KV_BLOCKS_TOTAL)
        u->kv_blocks = l->kv_blocks_total;
    if (l->has & IG_LOAD_MAX_NUM_SEQS)
        u->slots = l->max_num_seqs;
    u->reported_at_ns = now_ns;
}

/* A "load" event: the worker's /load report, as it moves. One that does
 * not parse is dropped; the stream goes on (the index does not depend on
 * it). */
static void on_load(ig_kv_feed_t *f, const char *data)
{
    ig_load_t l;
    ig_load_init(&l);
    if (ig_load_decode(data, strlen(data), &l, NULL, 0) != IG_EPARSE) {
        ig_kv_feed_take_load(f->u, &l, uv_hrtime());
        f->loads++;
    }
    ig_load_dispose(&l);
}

/* One SSE event: its "event:" name and its data (one line each here). */
static void on_event(ig_kv_feed_t *f, char *ev, size_t n)
{
    ev[n] = 0;
    const char *name = "message", *data = NULL;
    for (char *line = ev, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        if (strncmp(line, "event:", 6) == 0)
            name = line + 6 + (line[6] == ' ');
        else if (strncmp(line, "data:", 5) == 0)
            data = line + 5 + (line[5] == ' ');
    }
    if (data == NULL)
        return; /* a heartbeat */
    if (strcmp(name, "load") == 0) {
        on_load(f, data);
        return;
    }
    json_t *d = json_loads(data, 0, NULL);
    if (!json_is_object(d))
        restart(f, "malformed event");
    else if (strcmp(name, "snapshot") == 0)
        on_snapshot(f, d);
    else if (strcmp(name, "kv") == 0)
        on_events(f, d);
    json_decref(d);
}

static void on_headers(ig_upstream_req_t *r, int status, int nh, const char *const *names,
                       const char *const *values, void *data)
{
    ig_kv_feed_t *f = data;
    (void)nh, (void)names, (void)values;
    if (status != 200) {
        char why[64];
        snprintf(why, sizeof(why), "GET /kv/events answered %d", status);
        snprintf(f->last_error, sizeof(f->last_error), "%s", why);
        ig_upstream_cancel(r);
        f->req = NULL;
        lose(f, why);
        f->backoff_ms = BACKOFF_MAX_MS; /* an older worker: ask now and then */
        connect_later(f);
    }
}

static void on_body(ig_upstream_req_t *r, const char *p, size_t n, void *data)
{
    ig_kv_feed_t *f = data;
    if (f->len + n + 1 > f->cap) {
        size_t cap = f->cap ? f->cap : 4096;
        while (cap < f->len + n + 1)
            cap *= 2;
        char *nb = cap <= MAX_EVENT_BYTES ? realloc(f->buf, cap) : NULL;
        if (nb == NULL) {
            restart(f, "event too large");
            return;
        }
        f->buf = nb;
        f->cap = cap;
    }
    memcpy(f->buf + f->len, p, n);
    f->len += n;
    /* Whole events out; the rest waits for more bytes. */
    size_t start = 0;
    for (size_t i = 1; i < f->len && f->req == r; i++) {
        if (f->buf[i] == '\n' && f->buf[i - 1] == '\n') {
            on_event(f, f->buf + start, i - 1 - start);
            start = i + 1;
        }
    }
    if (f->req != r)
        return; /* restarted inside */
    memmove(f->buf, f->buf + start, f->len - start);
    f->len -= start;
}

static void on_done(ig_upstream_req_t *r, int err, void *data)
{
    ig_kv_feed_t *f = data;
    (void)r;
    f->req = NULL;
    f->len = 0;
    lose(f, err ? ig_strerror(err) : "the stream ended");
    connect_later(f);
}

static void on_timer(uv_timer_t *t)
{
    ig_kv_feed_t *f = t->data;
    static const ig_upstream_cbs_t cbs = {on_headers, on_body, on_done};
    if (f->closing || f->req)
        return;
    f->len = 0;
    if (ig_upstream_request(f->client, "GET", "/kv/events", "Accept: text/event-stream\r\n", NULL,
                            0, &cbs, f, &f->req) != 0) {
        f->req = NULL;
        connect_later(f);
    }
}

static void connect_later(ig_kv_feed_t *f)
{
    if (f->closing)
        return;
    f->backoff_ms = f->backoff_ms == 0 ? BACKOFF_MIN_MS : f->backoff_ms * 2;
    if (f->backoff_ms > BACKOFF_MAX_MS)
        f->backoff_ms = BACKOFF_MAX_MS;
    uv_timer_start(&f->timer, on_timer, f->backoff_ms, 0);
}

int ig_kv_feed_start(ig_kv_feed_t **out, uv_loop_t *loop, const char *name, const char *address,
                     ig_router_upstream_t *u)
{
    if (!name || !address || !u)
        return IG_EINVAL;
    metrics_register();
    ig_kv_feed_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return IG_ENOMEM;
    f->loop = loop;
    f->u = u;
    snprintf(f->name, sizeof(f->name), "%s", name);
    ig_upstream_opts_t uo;
    ig_upstream_opts_default(&uo);
    uo.connect_timeout_ms = 2000;
    uo.first_byte_timeout_ms = HEARTBEAT_DEADLINE_MS;
    uo.idle_timeout_ms = HEARTBEAT_DEADLINE_MS;
    uo.total_timeout_ms = 24ull * 3600 * 1000; /* then a fresh snapshot */
    uo.max_idle_connections = 0;
    int rc = ig_upstream_start(&f->client, loop, f->name, address, &uo);
    if (rc != 0) {
        free(f);
        return rc;
    }
    uv_timer_init(loop, &f->timer);
    f->timer.data = f;
    u->kv_exact = NULL;
    uv_timer_start(&f->timer, on_timer, 0, 0);
    *out = f;
    return 0;
}

static void feed_free(ig_kv_feed_t *f)
{
    ig_kv_index_free(f->idx);
    free(f->buf);
    free(f);
}

static void on_client_closed(void *data)
{
    feed_free(data);
}

static void on_timer_closed(uv_handle_t *h)
{
    ig_kv_feed_t *f = h->data;
    ig_upstream_close(f->client, on_client_closed, f);
}

void ig_kv_feed_close(ig_kv_feed_t *f)
{
    if (f == NULL || f->closing)
        return;
    f->closing = 1;
    f->live = 0;
    f->u->kv_exact = NULL;
    ig_metric_set(m_live, 0, f->name);
    ig_metric_set(m_blocks, 0, f->name);
    if (f->req) {
        ig_upstream_cancel(f->req);
        f->req = NULL;
    }
    uv_close((uv_handle_t *)&f->timer, on_timer_closed);
}

void ig_kv_feed_info(const ig_kv_feed_t *f, ig_kv_feed_info_t *o)
{
    memset(o, 0, sizeof(*o));
    o->live = f->live;
    o->blocks = f->live && f->idx ? ig_kv_index_count(f->idx) : 0;
    o->capacity = f->idx ? ig_kv_index_capacity(f->idx) : 0;
    o->block_size = f->idx ? ig_kv_index_block_size(f->idx) : 0;
    o->seq = f->seq;
    o->snapshots = f->snapshots;
    o->losses = f->losses;
    o->loads = f->loads;
    o->epoch = f->epoch;
    o->last_error = f->last_error;
}
