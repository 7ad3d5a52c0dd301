/*
 * GET /kv/events through the real worker binary: a subscriber gets a
 * snapshot and then numbered events whose hashes are the ones
 * ig_prefix_hashes computes for the prompts sent (stored, then removed
 * when a small cache evicts them); a subscriber that connects later gets a
 * snapshot equal to what the first one built from the events; and a
 * subscriber that stops reading is dropped with its bytes bounded, while
 * one that reads keeps its stream, every event in sequence. "load" events
 * give the /load report after the snapshot and as a request comes and goes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <sys/socket.h>

#include "infergate/prefix.h"
#include "worker_proc.h"

#define KV_BLOCKS 64
#define BS 16
#define BUFFER 4096 /* --kv-events-buffer */

static wproc_t W;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    const char *extra[] = {"--kv-blocks", "64",   "--block-size",       "16",
                           "--name",      "tiny", "--kv-events-buffer", "4096",
                           NULL};
    return wt_start(&W, "kv", extra);
}

static int teardown(void **state)
{
    wt_stop(&W);
    ig_gwf_model_teardown(state);
    return 0;
}

/* ---- a subscriber that parses what it reads ---------------------------------- */

#define MAXSET 4096

typedef struct {
    ig_tc_t *tc;
    char *buf;
    size_t len, cap;
    uint64_t set[MAXSET]; /* the blocks it believes the worker holds */
    int n;
    uint64_t seq;
    int snapshots, batches, gaps, stored, removed;
    int loads, max_inflight, last_inflight; /* "load" events */
} sub_t;

static int set_find(const sub_t *s, uint64_t h)
{
    for (int i = 0; i < s->n; i++)
        if (s->set[i] == h)
            return i;
    return -1;
}

static uint64_t hash_at(json_t *a, size_t i)
{
    uint64_t h = 0;
    json_t *v = json_array_get(a, i);
    assert_int_equal(ig_prefix_hash_parse(json_string_value(v), json_string_length(v), &h), 0);
    return h;
}

static void apply(sub_t *s, const char *name, const char *data)
{
    json_t *d = json_loads(data, 0, NULL);
    assert_non_null(d);
    if (strcmp(name, "snapshot") == 0) {
        s->snapshots++;
        s->n = 0;
        json_t *blocks = json_object_get(d, "blocks");
        assert_int_equal(json_integer_value(json_object_get(d, "block_size")), BS);
        assert_int_equal(json_integer_value(json_object_get(d, "num_blocks")), KV_BLOCKS);
        assert_true(json_array_size(blocks) <= KV_BLOCKS);
        for (size_t i = 0; i < json_array_size(blocks); i++)
            s->set[s->n++] = hash_at(json_array_get(blocks, i), 0);
        s->seq = (uint64_t)json_integer_value(json_object_get(d, "seq"));
    } else if (strcmp(name, "kv") == 0) {
        s->batches++;
        uint64_t first = (uint64_t)json_integer_value(json_object_get(d, "seq"));
        if (first != s->seq + 1)
            s->gaps++;
        json_t *evs = json_object_get(d, "events");
        for (size_t i = 0; i < json_array_size(evs); i++) {
            json_t *e = json_array_get(evs, i);
            const char *kind = json_string_value(json_array_get(e, 0));
            uint64_t h = hash_at(e, 1);
            int at = set_find(s, h);
            if (strcmp(kind, "stored") == 0) {
                assert_int_equal(at, -1);
                assert_true(s->n < MAXSET);
                s->set[s->n++] = h;
                s->stored++;
            } else {
                assert_string_equal(kind, "removed");
                assert_true(at >= 0);
                s->set[at] = s->set[--s->n];
                s->removed++;
            }
        }
        s->seq = first + json_array_size(evs) - 1;
    } else {
        assert_string_equal(name, "load");
        assert_true(json_is_true(json_object_get(d, "ready")));
        assert_string_equal(json_string_value(json_object_get(d, "model")), "tiny");
        assert_true(json_is_number(json_object_get(d, "est_wait_s")));
        s->loads++;
        s->last_inflight = (int)json_integer_value(json_object_get(d, "inflight"));
        if (s->last_inflight > s->max_inflight)
            s->max_inflight = s->last_inflight;
    }
    json_decref(d);
}

/* Reads what has come within ms and applies every complete event. */
static void pump(sub_t *s, int ms)
{
    char tmp[65536];
    long long end = ig_tc_now_ms() + ms;
    do {
        struct pollfd pf = {.fd = ig_tc_fd(s->tc), .events = POLLIN};
        if (poll(&pf, 1, 20) != 1)
            continue;
        ssize_t n = recv(pf.fd, tmp, sizeof(tmp), MSG_DONTWAIT);
        if (n <= 0)
            continue;
        if (s->len + (size_t)n + 1 > s->cap) {
            s->cap = (s->len + (size_t)n + 1) * 2;
            s->buf = realloc(s->buf, s->cap);
            assert_non_null(s->buf);
        }
        memcpy(s->buf + s->len, tmp, (size_t)n);
        s->len += (size_t)n;
    } while (ig_tc_now_ms() < end);
    /* The response head and the chunk framing come first: events are found
     * by their "event: " lines, each complete once its data line ends. */
    size_t at = 0;
    for (;;) {
        char *ev = s->len > at ? memmem(s->buf + at, s->len - at, "event: ", 7) : NULL;
        if (!ev)
            break;
        char *nl = memchr(ev, '\n', (size_t)(s->buf + s->len - ev));
        char *data = nl ? memmem(nl, (size_t)(s->buf + s->len - nl), "data: ", 6) : NULL;
        char *end = data ? memchr(data, '\n', (size_t)(s->buf + s->len - data)) : NULL;
        if (!end)
            break;
        char name[32];
        snprintf(name, sizeof(name), "%.*s", (int)(nl - ev - 7), ev + 7);
        *end = 0;
        apply(s, name, data + 6);
        at = (size_t)(end + 1 - s->buf);
    }
    memmove(s->buf, s->buf + at, s->len - at);
    s->len -= at;
}

static void subscribe(sub_t *s, int rcvbuf)
{
    memset(s, 0, sizeof(*s));
    s->tc = ig_tc_connect_unix(W.sock);
    assert_non_null(s->tc);
    if (rcvbuf > 0)
        setsockopt(ig_tc_fd(s->tc), SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    assert_int_equal(ig_tc_sends(s->tc, "GET /kv/events HTTP/1.1\r\nHost: w\r\n\r\n"), 0);
}

static void unsubscribe(sub_t *s)
{
    ig_tc_close(s->tc);
    free(s->buf);
}

/* Prompt `tenant`: ntok ids of its own (max_tokens 1). */
static void complete(int tenant, int ntok, int32_t *ids)
{
    json_t *p = json_array();
    for (int k = 0; k < ntok; k++) {
        ids[k] = 10 + (tenant * 131 + k * 7) % 4000;
        json_array_append_new(p, json_integer(ids[k]));
    }
    int st;
    json_t *r = wt_post_value(&W, "/v1/completions",
                              json_pack("{s:s, s:o, s:i, s:f}", "model", "tiny", "prompt", p,
                                        "max_tokens", 1, "temperature", 0.0),
                              &st);
    assert_int_equal(st, 200);
    json_decref(r);
}

static void test_events_match_hashes(void **state)
{
    (void)state;
    sub_t a;
    subscribe(&a, 0);
    pump(&a, 300);
    assert_int_equal(a.snapshots, 1);

    /* 4 full blocks and a partial one: the full ones are stored, with the
     * hashes the gateway computes. */
    int32_t ids[200];
    complete(1, 70, ids);
    uint64_t h[8];
    int nh = ig_prefix_hashes(ig_prefix_seed("tiny"), ids, 70, BS, h, 8);
    assert_int_equal(nh, 4);
    pump(&a, 300);
    for (int i = 0; i < nh; i++)
        assert_true(set_find(&a, h[i]) >= 0);
    assert_int_equal(a.gaps, 0);

    /* More tenants than the cache holds: evictions come as removals. */
    for (int t = 2; t < 14; t++)
        complete(t, 128, ids);
    pump(&a, 500);
    assert_true(a.removed > 0);
    assert_int_equal(a.gaps, 0);
    assert_true(a.n <= KV_BLOCKS);

    /* A late subscriber's snapshot is what the first built from events. */
    sub_t b;
    subscribe(&b, 0);
    pump(&b, 300);
    pump(&a, 100);
    assert_int_equal(b.snapshots, 1);
    assert_int_equal(b.n, a.n);
    for (int i = 0; i < b.n; i++)
        assert_true(set_find(&a, b.set[i]) >= 0);
    unsubscribe(&a);
    unsubscribe(&b);
}

static void test_load_events(void **state)
{
    (void)state;
    sub_t a;
    subscribe(&a, 0);
    pump(&a, 300);
    assert_int_equal(a.snapshots, 1);
    assert_int_equal(a.loads, 1); /* the report as it is, after the snapshot */
    assert_int_equal(a.last_inflight, 0);
    /* A request of 48 steps: the report says so while it runs (the loop
     * drains the engine's output at least once meanwhile) and again once
     * it is done. */
    int st;
    json_t *r = wt_post_value(&W, "/v1/completions",
                              json_pack("{s:s, s:s, s:i, s:b, s:f}", "model", "tiny", "prompt",
                                        "load events", "max_tokens", 48, "ignore_eos", 1,
                                        "temperature", 0.0),
                              &st);
    assert_int_equal(st, 200);
    json_decref(r);
    pump(&a, 300);
    assert_true(a.loads >= 3);
    assert_int_equal(a.max_inflight, 1);
    assert_int_equal(a.last_inflight, 0);
    /* Nothing moves: no more reports (the heartbeat is a comment). */
    int loads = a.loads;
    pump(&a, 1500);
    assert_int_equal(a.loads, loads);
    unsubscribe(&a);
}

static void test_slow_subscriber_dropped(void **state)
{
    (void)state;
    sub_t slow, good;
    subscribe(&slow, 0); /* and never read */
    subscribe(&good, 0);
    pump(&good, 200);
    int32_t ids[512];
    /* Each prompt stores 24 blocks and evicts as many: about 3 KB of
     * events; the slow one's socket buffer fills, then 4 KB more. */
    long long end = ig_tc_now_ms() + 60000;
    int t = 100, closed = 0;
    while (!closed && ig_tc_now_ms() < end) {
        for (int k = 0; k < 10; k++)
            complete(t++, 384, ids);
        pump(&good, 50);
        /* Closed by the worker? Asked without reading a byte. */
        struct pollfd pf = {.fd = ig_tc_fd(slow.tc), .events = POLLRDHUP};
        closed = poll(&pf, 1, 0) == 1 && (pf.revents & (POLLRDHUP | POLLHUP));
    }
    assert_true(closed);
    /* What it was sent before the drop: the socket's buffer (about 200 KB
     * for a Unix socket here), the worker's limit and one event at most. */
    long got = 0;
    char tmp[65536];
    for (ssize_t n; (n = recv(ig_tc_fd(slow.tc), tmp, sizeof(tmp), MSG_DONTWAIT)) > 0;)
        got += n;
    assert_true(got > BUFFER);
    assert_true(got < 512 * 1024);
    pump(&good, 300);
    complete(1000, 64, ids);
    pump(&good, 300);
    assert_int_equal(good.snapshots, 1);
    assert_int_equal(good.gaps, 0);
    assert_true(good.removed > 0);
    uint64_t h[8];
    int nh = ig_prefix_hashes(ig_prefix_seed("tiny"), ids, 64, BS, h, 8);
    for (int i = 0; i < nh; i++)
        assert_true(set_find(&good, h[i]) >= 0);
    /* The worker counts the one it dropped, and serves the other still. */
    ig_tc_response_t r;
    assert_int_equal(wt_get(&W, "/metrics", &r), 0);
    assert_non_null(strstr(r.body, "\ninfergate_worker_kv_event_subscribers_dropped_total 1\n"));
    ig_tc_response_free(&r);
    unsubscribe(&slow);
    unsubscribe(&good);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_match_hashes),
        cmocka_unit_test(test_load_events),
        cmocka_unit_test(test_slow_subscriber_dropped),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
