/*
 * Where a request's time went, as an operator reads it: the histogram
 * infergate_upstream_time_to_first_token_seconds{upstream} (from the
 * answering attempt's send to its first content token, or its whole
 * answer) and the access log's queue=, ttft= and upstream_ttft=. Real
 * processes on loopback: `infergate serve` at log level info, its stderr
 * captured, in front of test upstreams with fixed delays.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "burst.h"
#include "gwfixture.h"

static const char *whole = "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":4}";
static const char *stream =
    "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":4,\"stream\":true}";

/* A gateway at log level info with stderr captured, in front of ups as
 * sites s0, s1, ... with routing policy `policy`. */
static int serve_info(ig_proc_t *g, const ig_proc_t *ups, int n, const char *policy)
{
    char routing[64];
    snprintf(routing, sizeof(routing), ",\"policy\":\"%s\"", policy);
    return ig_gwf_sites_serve_ex(g, ups, n, n, routing, NULL, "info", IG_PROC_PIPES);
}

static double series(int port, const char *suffix, const char *upstream, const char *le)
{
    char s[256];
    snprintf(s, sizeof(s),
             "infergate_upstream_time_to_first_token_seconds%s{upstream=\"%s\"%s%s%s} ", suffix,
             upstream, le ? ",le=\"" : "", le ? le : "", le ? "\"" : "");
    return ig_gwf_metric(port, s);
}

typedef struct {
    char upstream[16];
    double duration, queue, ttft, own;
} line_t;

/* The access-log lines of proxied completions in the gateway's stderr
 * (read after it stopped). Returns how many, at most cap. */
static int access_lines(const ig_proc_t *g, line_t *out, int cap)
{
    int n = 0;
    const char *p = g->err ? g->err : "";
    while (n < cap && (p = strstr(p, "POST /v1/completions status=200")) != NULL) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[512];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1), p);
        line_t *l = &out[n];
        const char *d = strstr(line, " duration="), *u = strstr(line, " upstream="),
                   *q = strstr(line, " queue="), *t = strstr(line, " ttft="),
                   *o = strstr(line, " upstream_ttft=");
        assert_non_null(d);
        assert_non_null(u);
        assert_non_null(q);
        assert_non_null(t);
        assert_non_null(o);
        assert_int_equal(sscanf(u, " upstream=%15s", l->upstream), 1);
        l->duration = strtod(d + 10, NULL);
        l->queue = strtod(q + 7, NULL);
        l->ttft = strtod(t + 6, NULL);
        l->own = strtod(o + 15, NULL);
        n++;
        p += len;
    }
    return n;
}

/* Two upstreams 20 ms and 300 ms to their first token, taken in turn: each
 * one's histogram counts exactly the answers it gave, the fast one's all
 * under 250 ms and the slow one's none, and every access-log line's times
 * add up. */
static void test_each_upstream_has_its_own_ttft(void **state)
{
    (void)state;
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--instant-raw", "--delay-ms", "20", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--instant-raw", "--delay-ms", "300", NULL), 0);
    ig_proc_t g;
    assert_int_equal(serve_info(&g, ups, 2, "round_robin"), 0);
    int by[2] = {0, 0};
    for (int i = 0; i < 12; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(g.port, "/v1/completions", i % 2 ? stream : whole, &r, 10000),
                         0);
        assert_int_equal(r.status, 200);
        const char *up = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(up);
        assert_true(strcmp(up, "s0") == 0 || strcmp(up, "s1") == 0);
        by[up[1] - '0']++;
        ig_tc_response_free(&r);
    }
    print_message("s0 answered %d, s1 %d\n", by[0], by[1]);
    assert_true(by[0] > 0 && by[1] > 0);
    for (int u = 0; u < 2; u++) {
        const char *name = u ? "s1" : "s0";
        double count = series(g.port, "_count", name, NULL);
        double sum = series(g.port, "_sum", name, NULL);
        double fast = series(g.port, "_bucket", name, "0.25");
        print_message("%s: %.0f answers, mean %.4f s, %.0f under 0.25 s\n", name, count,
                      sum / count, fast);
        assert_true(count == by[u]);
        if (u == 0) {
            assert_true(sum / count >= 0.020 && sum / count < 0.25);
            assert_true(fast == count);
        } else {
            assert_true(sum / count >= 0.300);
            assert_true(fast == 0);
        }
    }
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    line_t lines[16];
    int n = access_lines(&g, lines, 16);
    assert_int_equal(n, 12);
    for (int i = 0; i < n; i++) {
        const line_t *l = &lines[i];
        double least = strcmp(l->upstream, "s1") == 0 ? 0.300 : 0.020;
        assert_true(l->own >= least);
        /* One attempt each: the time to first token is the wait before it
         * plus the attempt's own, to the microsecond the log prints. */
        assert_true(l->queue >= 0 && l->queue < 0.1);
        assert_true(fabs(l->ttft - l->queue - l->own) < 3e-6);
        assert_true(l->ttft <= l->duration + 2e-6);
    }
    ig_proc_dispose(&g);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

/* One upstream of one slot that says so (/load): the gateway sends it at
 * most two (the proxy's cap, twice the slots) and holds the rest. The held
 * requests' queue= is the time they waited, and is part of their ttft=,
 * not of upstream_ttft=. */
static void test_a_held_request_shows_its_queue(void **state)
{
    (void)state;
    ig_proc_t ups[1];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--instant-raw", "--slots", "1", "--report-load",
                                     "--delay-ms", "100", NULL),
                     0);
    ig_proc_t g;
    assert_int_equal(serve_info(&g, ups, 1, "latency"), 0);
    /* Its slot count reaches the gateway with a /load poll: the limit
     * becomes 2 (64 before, for an upstream that has reported nothing). */
    const char *limit = "infergate_upstream_concurrency_limit{upstream=\"s0\"} ";
    long long end = ig_tc_now_ms() + 5000;
    while (ig_gwf_metric(g.port, limit) != 2 && ig_tc_now_ms() < end)
        ;
    assert_true(ig_gwf_metric(g.port, limit) == 2);
    ig_burst_one_t b[5];
    assert_int_equal(ig_burst(g.port, "/v1/completions", whole, 5, 20000, b), 5);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    line_t lines[8];
    int n = access_lines(&g, lines, 8);
    assert_int_equal(n, 5);
    int held = 0;
    for (int i = 0; i < n; i++) {
        const line_t *l = &lines[i];
        print_message("queue %.4f s, ttft %.4f s, upstream_ttft %.4f s\n", l->queue, l->ttft,
                      l->own);
        if (l->queue >= 0.09)
            held++;
        assert_true(l->own >= 0.1);
        assert_true(fabs(l->ttft - l->queue - l->own) < 3e-6);
    }
    /* Five at once, two places: three wait at least one answer's 100 ms. */
    assert_true(held >= 3);
    ig_proc_dispose(&g);
    ig_proc_stop(&ups[0], SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_upstream_has_its_own_ttft),
        cmocka_unit_test(test_a_held_request_shows_its_queue),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
