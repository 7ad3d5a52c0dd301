/*
 * The gateway routing across remote sites, with real processes on
 * loopback: `infergate serve` in front of programmable test upstreams
 * (build/testupstream) that stand for sites of known speed and faults.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "burst.h"
#include "gwfixture.h"

static int upstream_index(const ig_tc_response_t *r)
{
    const char *u = ig_tc_header(r, "x-infergate-upstream");
    if (u == NULL || u[0] != 's')
        return -1;
    return atoi(u + 1);
}

static const char *stream_body =
    "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":4,\"stream\":true}";
static const char *plain_body = "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":4}";

/* Most traffic goes to the fastest upstreams; the slow one keeps being
 * probed (it stays up and measured) but takes little. */
static void test_prefers_fastest(void **state)
{
    ig_proc_t ups[3];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--delay-ms", "10", "--itl-ms", "1", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "10", "--itl-ms", "1", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[2], "--delay-ms", "30", "--itl-ms", "1", NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 3, 3, NULL, NULL), 0);

    int count[3] = {0};
    for (int i = 0; i < 40; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", stream_body, &r, 20000), 0);
        assert_int_equal(r.status, 200);
        assert_non_null(strstr(r.body, "data: [DONE]"));
        assert_non_null(ig_tc_header(&r, "x-infergate-route"));
        int k = upstream_index(&r);
        assert_true(k >= 0 && k < 3);
        count[k]++;
        ig_tc_response_free(&r);
    }
    print_message("fast %d, fast %d, slow %d\n", count[0], count[1], count[2]);
    assert_true(count[0] + count[1] >= 32);
    assert_true(count[2] <= 8);

    /* The slow site is still probed: /status shows it up and measured. */
    ig_tc_response_t st;
    assert_int_equal(ig_tc_request(g.port, "GET /status HTTP/1.1\r\nHost: t\r\n\r\n", &st, 5000),
                     0);
    assert_int_equal(st.status, 200);
    assert_non_null(strstr(st.body, "\"name\":\"s2\""));
    assert_null(strstr(st.body, "\"up\":false"));
    ig_tc_response_free(&st);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 3; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

/* A site that dies is ejected; requests that had not started streaming
 * succeed elsewhere with no client-visible error. */
static void test_dead_site_fails_over(void **state)
{
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--delay-ms", "2", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "20", NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2, NULL, NULL), 0);
    /* Warm up: the fast one takes the traffic. */
    for (int i = 0; i < 5; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
    }
    ig_proc_stop(&ups[0], SIGKILL, 5000);
    for (int i = 0; i < 20; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
        if (r.status != 200)
            print_message("request %d: %d %s\n", i, r.status, r.body);
        assert_int_equal(r.status, 200);
        assert_int_equal(upstream_index(&r), 1);
        ig_tc_response_free(&r);
    }
    ig_tc_response_t st;
    assert_int_equal(ig_tc_request(g.port, "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n", &st, 5000),
                     0);
    assert_non_null(strstr(st.body, "infergate_retries_total"));
    ig_tc_response_free(&st);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&ups[1], SIGKILL, 5000);
}

/* A stream that breaks midway ends with an SSE error event and is not
 * retried; an upstream 5xx before any byte is retried on the other. */
static void test_mid_stream_failure_not_retried(void **state)
{
    ig_proc_t ups[1];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--fail-after-tokens", "2", "--itl-ms", "5",
                                     "--tokens", "20", NULL),
                     0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 1, 1, NULL, NULL), 0);
    ig_tc_response_t r;
    const char *body = "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":20,\"stream\":true}";
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", body, &r, 20000), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"error\""));
    assert_non_null(strstr(r.body, "upstream_stream_broken"));
    assert_null(strstr(r.body, "[DONE]"));
    ig_tc_response_free(&r);
    /* Exactly one attempt reached the upstream. */
    ig_tc_response_t st;
    assert_int_equal(ig_tc_request(g.port, "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n", &st, 5000),
                     0);
    assert_null(strstr(st.body, "infergate_retries_total{"));
    ig_tc_response_free(&st);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&ups[0], SIGKILL, 5000);
}

static void test_errors_retried_then_reported(void **state)
{
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--delay-ms", "1", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "50", NULL),
                     0); /* far slower, even under load */
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2, NULL, NULL), 0);
    /* The preferred site starts answering 500 to everything. */
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_control(ups[0].port, "error-rate?p=1"), 200);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
        assert_int_equal(r.status, 200);
        assert_int_equal(upstream_index(&r), 1);
        ig_tc_response_free(&r);
    }
    assert_int_equal(ig_tc_request(g.port, "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n", &r, 5000),
                     0);
    assert_non_null(strstr(r.body, "infergate_retries_total{model=\"m\",reason=\"5xx\"}"));
    ig_tc_response_free(&r);
    /* Unknown model: 404 in the OpenAI shape; bad JSON: 400. */
    assert_int_equal(
        ig_gwf_post(g.port, "/v1/completions", "{\"model\":\"nope\",\"prompt\":\"x\"}", &r, 20000),
        0);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "\"error\""));
    assert_non_null(strstr(r.body, "nope"));
    ig_tc_response_free(&r);
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", "{\"model\":", &r, 20000), 0);
    assert_int_equal(r.status, 400);
    ig_tc_response_free(&r);
    /* Nothing healthy left: an explicit 5xx, never a hang. */
    ig_proc_stop(&ups[1], SIGKILL, 5000);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", plain_body, &r, 20000), 0);
        assert_true(r.status >= 500);
        assert_non_null(strstr(r.body, "\"error\""));
        ig_tc_response_free(&r);
    }
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&ups[0], SIGKILL, 5000);
}

/* A client that goes away mid-stream cancels the upstream request: the
 * upstream connection closes long before the stream would have ended. */
static void test_client_disconnect_cancels(void **state)
{
    ig_proc_t ups[1];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--itl-ms", "20", "--tokens", "500", NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 1, 1, NULL, NULL), 0);
    ig_tc_t *tc = ig_tc_connect(g.port);
    assert_non_null(tc);
    assert_int_equal(ig_tc_send_post(tc, "/v1/completions",
                                     "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":500,"
                                     "\"stream\":true}"),
                     0);
    char buf[512];
    assert_true(ig_tc_read_raw(tc, buf, sizeof(buf), 5000) > 0);
    long long t0 = ig_tc_now_ms();
    ig_tc_close(tc);
    /* The gateway's in-flight count drops to zero quickly (the 500-token
     * stream would take 10 s). */
    int drained = 0;
    while (ig_tc_now_ms() - t0 < 3000 && !drained) {
        ig_tc_response_t st;
        if (ig_tc_request(g.port, "GET /status HTTP/1.1\r\nHost: t\r\n\r\n", &st, 2000) == 0) {
            json_t *doc = json_loads(st.body, 0, NULL);
            drained = json_integer_value(json_object_get(doc, "inflight")) == 0 &&
                      json_object_get(doc, "inflight") != NULL;
            json_decref(doc);
            ig_tc_response_free(&st);
        }
    }
    assert_true(drained);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&ups[0], SIGKILL, 5000);
}

/* Hedging: when the first token is late on the chosen upstream, a copy
 * goes to the runner-up, the first to answer wins and the other is
 * canceled. */
static void test_hedge_beats_a_stall(void **state)
{
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--delay-ms", "2", "--itl-ms", "1", NULL), 0);
    /* s1 far enough behind that the router picks s0 even on a loaded machine. */
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "40", "--itl-ms", "1", NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2, IG_GWF_HEDGE, NULL), 0);
    ig_tc_response_t r;
    /* Earn hedge budget (0.1 per request) and teach the router s0's TTFT. */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", stream_body, &r, 20000), 0);
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
    }
    /* A training request whose first token was late on a loaded machine may
     * have been hedged already: count the stalled request's hedge alone. */
    const char *won = "infergate_hedges_total{model=\"m\",result=\"hedge_won\"} ";
    double won_before = ig_gwf_metric(g.port, won);
    assert_int_equal(ig_gwf_control(ups[0].port, "stall?ms=3000"), 200);
    long long t0 = ig_tc_now_ms();
    assert_int_equal(ig_gwf_post(g.port, "/v1/completions", stream_body, &r, 20000), 0);
    long long took = ig_tc_now_ms() - t0;
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "[DONE]"));
    assert_int_equal(upstream_index(&r), 1);
    ig_tc_response_free(&r);
    print_message("hedged answer in %lld ms (the stall lasts 3000 ms)\n", took);
    assert_true(took < 1500);
    assert_true(ig_gwf_metric(g.port, won) >= (won_before > 0 ? won_before : 0) + 1);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

/* The mean of bucket rif in a [[rif, samples, seconds], ...] array, and
 * its samples; -1 when the bucket is absent. */
static double bucket_mean(const json_t *buckets, int rif, int *samples)
{
    size_t i;
    json_t *b;
    *samples = 0;
    json_array_foreach(buckets, i, b)
    {
        if (json_integer_value(json_array_get(b, 0)) == rif) {
            *samples = (int)json_integer_value(json_array_get(b, 1));
            return json_real_value(json_array_get(b, 2));
        }
    }
    return -1;
}

/* Streams in bursts of six, round robin over a 1-slot site and a 4-slot
 * one, neither reporting /load: each takes 3 at once. /status shows the
 * first tokens by the requests in flight when each began; the 1-slot
 * site's wait a place for a hold each, and the C of that queue is 1. The
 * 4-slot site's never wait a hold, and no queue is seen there. */
static void test_first_tokens_show_the_queue(void **state)
{
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--slots", "1", "--delay-ms", "60", "--itl-ms", "10",
                                     "--tokens", "4", NULL),
                     0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--slots", "4", "--delay-ms", "60", "--itl-ms", "10",
                                     "--tokens", "4", NULL),
                     0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2, ",\"policy\":\"round_robin\"", NULL), 0);

    ig_burst_one_t out[6];
    for (int round = 0; round < 25; round++)
        assert_int_equal(ig_burst(g.port, "/v1/completions", stream_body, 6, 20000, out), 6);

    json_t *one = ig_gwf_site_status(g.port, "s0"), *four = ig_gwf_site_status(g.port, "s1");
    assert_non_null(one);
    assert_non_null(four);
    const json_t *f1 = json_object_get(one, "first_token_by_rif");
    const json_t *f4 = json_object_get(four, "first_token_by_rif");
    int n0, n1, n2;
    double hold = bucket_mean(json_object_get(one, "hold_by_rif"), 0, &n0);
    double w0 = bucket_mean(f1, 0, &n0), w1 = bucket_mean(f1, 1, &n1), w2 = bucket_mean(f1, 2, &n2);
    double c1 = json_real_value(json_object_get(one, "first_token_c"));
    print_message("1 slot: hold %.0f ms alone; first token %.0f / %.0f / %.0f ms (%d / %d / %d) "
                  "at 0 / 1 / 2 in flight; C %.2f (first tokens), %.2f\n",
                  1e3 * hold, 1e3 * w0, 1e3 * w1, 1e3 * w2, n0, n1, n2, c1,
                  json_real_value(json_object_get(one, "concurrency")));
    /* Each burst gives each site one request at each of 0, 1 and 2 in
     * flight: every bucket has its samples. */
    assert_true(n0 >= 20 && n1 >= 20 && n2 >= 20);
    assert_true(hold > 0.06);
    /* A place comes free once a hold is over: the second waits about one
     * hold more than the first, the third about two. */
    assert_true(w1 - w0 > 0.5 * hold);
    assert_true(w2 - w0 > 1.2 * hold);
    assert_true(c1 >= 0.5 && c1 <= 1.5);
    assert_true(json_real_value(json_object_get(one, "concurrency")) <= 1.5);

    double v0 = bucket_mean(f4, 0, &n0), v2 = bucket_mean(f4, 2, &n2);
    double c4 = json_real_value(json_object_get(four, "first_token_c"));
    print_message("4 slots: first token %.0f / %.0f ms (%d / %d) at 0 / 2 in flight; C %.2f "
                  "(first tokens; 0 = no queue seen)\n",
                  1e3 * v0, 1e3 * v2, n0, n2, c4);
    assert_true(n0 >= 20 && n2 >= 20);
    assert_true(v2 - v0 < 0.5 * hold);
    assert_true(c4 == 0);
    json_decref(one);
    json_decref(four);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefers_fastest),
        cmocka_unit_test(test_dead_site_fails_over),
        cmocka_unit_test(test_mid_stream_failure_not_retried),
        cmocka_unit_test(test_errors_retried_then_reported),
        cmocka_unit_test(test_client_disconnect_cancels),
        cmocka_unit_test(test_hedge_beats_a_stall),
        cmocka_unit_test(test_first_tokens_show_the_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
