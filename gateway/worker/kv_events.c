/*
 * GET /kv/events (docs/worker.md, "KV events"): the worker's prefix cache
 * as a server-sent-event stream, for the gateways' exact indexes. Each
 * subscriber gets a snapshot first (every block committed now and the
 * number of the last event it includes), then the events after it, in
 * order. The scheduler keeps the events in a bounded ring; the loop reads
 * it after each drain of the scheduler's output and once a second. A
 * subscriber whose unsent bytes pass kv_events_buffer is dropped (its
 * connection closed, what it had queued discarded), so no subscriber holds
 * more than that; one that reconnects starts from a new snapshot. When
 * the loop itself falls behind the ring, every subscriber gets a new
 * snapshot. Beside the cache, the stream carries the worker's /load report
 * ("load" events) whenever it moves, so that a gateway sees the queue that
 * other gateways' requests make here within a step.
 */
#include "worker_internal.h"

#include "infergate/error.h"
#include "infergate/log.h"
#include "infergate/prefix.h"
#include "infergate/strbuf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_BATCH 512 /* events read from the ring at a time */

struct kvsub_s {
    worker_t *w;
    ig_http_req_t *req;
    uint64_t from; /* events up to this one are in what it was sent */
    struct kvsub_s *prev, *next;
};

static void unlink_sub(worker_t *w, kvsub_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        w->kv_subs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    w->nkv_subs--;
    free(s);
}

/* Ends s now: why is NULL when its client went away (nothing to say). */
static void drop(kvsub_t *s, const char *why)
{
    worker_t *w = s->w;
    if (why != NULL)
        IG_WARN("kv events: subscriber %s dropped: %s", ig_http_req_peer(s->req), why);
    ig_http_stream_reset(s->req);
    unlink_sub(w, s);
}

/* Sends bytes to s; 0, or -1 when s was dropped (gone, or too far behind). */
static int send_to(kvsub_t *s, const char *buf, size_t len)
{
    int rc = ig_http_stream_write(s->req, buf, len);
    if (rc == IG_ECLOSED || ig_http_req_aborted(s->req)) {
        drop(s, NULL);
        return -1;
    }
    if (ig_http_req_write_queued(s->req) > s->w->o.kv_events_buffer) {
        if (s->w->m_kv_dropped)
            ig_metric_add(s->w->m_kv_dropped, 1);
        drop(s, "it does not read");
        return -1;
    }
    return 0;
}

static void putf(ig_strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(ig_strbuf_t *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp))
        b->oom = 1;
    else
        ig_strbuf_put(b, tmp, (size_t)n);
}

static void hex(ig_strbuf_t *b, uint64_t h)
{
    char x[17];
    ig_prefix_hash_hex(h, x);
    putf(b, "\"%s\"", x);
}

/* The snapshot event for s; s->from becomes its seq. */
static int send_snapshot(kvsub_t *s)
{
    worker_t *w = s->w;
    int nb = ig_engine_num_blocks(w->engine);
    uint64_t *h = malloc(sizeof(uint64_t) * (size_t)(nb ? nb : 1));
    uint64_t *p = malloc(sizeof(uint64_t) * (size_t)(nb ? nb : 1));
    ig_strbuf_t b = {0};
    if (!h || !p) {
        free(h);
        free(p);
        drop(s, "out of memory");
        return -1;
    }
    uint64_t seq;
    int n = ig_sched_kv_snapshot(w->sched, h, p, nb, &seq);
    putf(&b,
         "event: snapshot\nid: %llu\ndata: {\"epoch\":\"%s\",\"model\":\"%s\","
         "\"block_size\":%d,\"num_blocks\":%d,\"seq\":%llu,\"blocks\":[",
         (unsigned long long)seq, w->kv_epoch, w->model_name, ig_engine_block_size(w->engine), nb,
         (unsigned long long)seq);
    for (int i = 0; i < n; i++) {
        ig_strbuf_put(&b, i ? ",[" : "[", i ? 2 : 1);
        hex(&b, h[i]);
        ig_strbuf_put(&b, ",", 1);
        hex(&b, p[i]);
        ig_strbuf_put(&b, "]", 1);
    }
    ig_strbuf_put(&b, "]}\n\n", 4);
    free(h);
    free(p);
    s->from = seq;
    int rc = b.oom ? (drop(s, "out of memory"), -1) : send_to(s, b.buf, b.len);
    ig_strbuf_free(&b);
    return rc;
}

/* One "kv" event with ev[0 .. n) that s has not had yet. */
static int send_events(kvsub_t *s, const ig_kv_event_t *ev, int n)
{
    int k = 0;
    while (k < n && ev[k].seq <= s->from)
        k++;
    if (k == n)
        return 0;
    ig_strbuf_t b = {0};
    putf(&b, "event: kv\nid: %llu\ndata: {\"seq\":%llu,\"events\":[",
         (unsigned long long)ev[n - 1].seq, (unsigned long long)ev[k].seq);
    for (int i = k; i < n; i++) {
        ig_strbuf_put(&b, i > k ? ",[" : "[", i > k ? 2 : 1);
        putf(&b, "\"%s\",", ev[i].kind == IG_KV_STORED ? "stored" : "removed");
        hex(&b, ev[i].hash);
        ig_strbuf_put(&b, ",", 1);
        hex(&b, ev[i].parent);
        ig_strbuf_put(&b, "]", 1);
    }
    ig_strbuf_put(&b, "]}\n\n", 4);
    s->from = ev[n - 1].seq;
    int rc = b.oom ? (drop(s, "out of memory"), -1) : send_to(s, b.buf, b.len);
    ig_strbuf_free(&b);
    return rc;
}

void ig__worker_kv_pump(worker_t *w)
{
    if (!w->sched || !w->kv_subs)
        return;
    ig_kv_event_t ev[KV_BATCH];
    for (;;) {
        int n = ig_sched_kv_events(w->sched, w->kv_cursor, ev, KV_BATCH);
        if (n == IG_ERANGE) {
            /* The ring moved on without us: everyone starts over. */
            IG_WARN("kv events: fell behind the ring; sending snapshots");
            /* From the oldest snapshot on: each subscriber skips the events
             * its own snapshot includes. */
            uint64_t low = UINT64_MAX;
            for (kvsub_t *s = w->kv_subs, *nx; s; s = nx) {
                nx = s->next;
                if (send_snapshot(s) == 0 && s->from < low)
                    low = s->from;
            }
            if (low == UINT64_MAX)
                return; /* nobody left */
            w->kv_cursor = low;
            continue;
        }
        if (n <= 0)
            return;
        for (kvsub_t *s = w->kv_subs, *nx; s; s = nx) {
            nx = s->next;
            send_events(s, ev, n);
        }
        w->kv_cursor = ev[n - 1].seq;
        if (n < KV_BATCH || !w->kv_subs)
            return;
    }
}

/* Whether the report has moved enough since the last "load" event to be
 * worth one: a count changed, or the predicted wait by 5 ms and 10%. */
static int load_moved(const ig_load_t *last, const ig_load_t *l)
{
    if (last->has == 0 || last->waiting != l->waiting || last->running != l->running ||
        last->inflight != l->inflight || last->ready != l->ready)
        return 1;
    double d = l->est_wait_s - last->est_wait_s;
    return fabs(d) > 0.005 + 0.1 * last->est_wait_s;
}

/* One "load" event with l, to s alone or (s NULL) to every subscriber. */
static void send_load(worker_t *w, kvsub_t *s, const ig_load_t *l)
{
    json_t *o = ig_load_encode(l);
    char *data = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (data == NULL)
        return; /* out of memory: the gateways still poll /load */
    ig_strbuf_t b = {0};
    ig_strbuf_put(&b, "event: load\ndata: ", 18);
    ig_strbuf_put(&b, data, strlen(data));
    ig_strbuf_put(&b, "\n\n", 2);
    free(data);
    if (!b.oom) {
        if (s != NULL)
            send_to(s, b.buf, b.len);
        for (kvsub_t *t = s ? NULL : w->kv_subs, *nx; t; t = nx) {
            nx = t->next;
            send_to(t, b.buf, b.len);
        }
    }
    ig_strbuf_free(&b);
}

void ig__worker_kv_load(worker_t *w)
{
    if (!w->kv_subs)
        return;
    ig_load_t l;
    ig__worker_load_of(w, &l);
    if (!load_moved(&w->kv_load, &l))
        return;
    w->kv_load = l;
    send_load(w, NULL, &l);
}

void ig__worker_kv_tick(worker_t *w)
{
    ig__worker_kv_pump(w);
    /* A comment line: the subscriber's idle deadline sees a live worker. */
    for (kvsub_t *s = w->kv_subs, *nx; s; s = nx) {
        nx = s->next;
        send_to(s, ":\n\n", 3);
    }
}

static void on_abort(ig_http_req_t *req, void *data)
{
    kvsub_t *s = data;
    worker_t *w = s->w;
    ig_http_stream_end(req);
    unlink_sub(w, s);
}

void ig__worker_kv_subscribe(worker_t *w, ig_http_req_t *req)
{
    if (w->state == W_LOADING || !w->sched) {
        ig__worker_respond_loading(req);
        return;
    }
    if (w->state != W_READY) {
        ig_http_respond_error(req, 503, "unavailable_error", NULL, NULL, "draining");
        return;
    }
    kvsub_t *s = calloc(1, sizeof(*s));
    if (!s) {
        ig_api_respond_oom(req);
        return;
    }
    s->w = w;
    s->req = req;
    if (ig_http_stream_start(req, 200, "text/event-stream") != 0) {
        free(s);
        ig_http_stream_end(req);
        return;
    }
    /* Events already read from the ring are in the snapshot too. */
    ig__worker_kv_pump(w);
    s->next = w->kv_subs;
    if (w->kv_subs)
        w->kv_subs->prev = s;
    w->kv_subs = s;
    w->nkv_subs++;
    ig_http_req_on_abort(req, on_abort, s);
    if (send_snapshot(s) != 0)
        return;
    if (w->nkv_subs == 1)
        w->kv_cursor = s->from;
    ig_load_t l;
    ig__worker_load_of(w, &l);
    send_load(w, s, &l);
}

void ig__worker_kv_close_all(worker_t *w)
{
    while (w->kv_subs) {
        kvsub_t *s = w->kv_subs;
        ig_http_stream_end(s->req);
        unlink_sub(w, s);
    }
}
