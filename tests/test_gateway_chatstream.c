/*
 * Chat streams commit on their first content token, not on the worker's
 * empty role delta: a chat stream that stalls after its role delta is
 * hedged, one that breaks after it is retried, and the TTFT metric measures
 * the content token. Real processes on loopback: `infergate serve` in front
 * of test upstreams (build/testupstream --chat-role-first sends the role
 * delta with the headers and the content after --delay-ms).
 *
 * Timing: the TTFT and hedge checks measure hundreds of milliseconds.
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

#include "gwfixture.h"

static const char *chat_stream =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hello there\"}],"
    "\"max_tokens\":4,\"stream\":true}";

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* The client gets the role delta first, once, then the content, in order. */
static void check_chat_stream(const ig_tc_response_t *r)
{
    assert_int_equal(r->status, 200);
    assert_int_equal(count_of(r->body, "\"role\":\"assistant\""), 1);
    const char *role = strstr(r->body, "\"role\":\"assistant\"");
    const char *content = strstr(r->body, "\"content\":\" ");
    const char *done = strstr(r->body, "data: [DONE]");
    assert_non_null(role);
    assert_non_null(content);
    assert_non_null(done);
    assert_true(role < content && content < done);
}

/* TTFT is the content token's delay (300 ms), not the role delta's round
 * trip: the histogram's sum over one request says so. */
static void test_chat_ttft_is_the_content_token(void **state)
{
    (void)state;
    ig_proc_t ups[1];
    assert_int_equal(
        ig_gwf_upstream(&ups[0], "--instant-raw", "--chat-role-first", "--delay-ms", "300", NULL),
        0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 1, 1, NULL, NULL), 0);
    const char *count = "infergate_time_to_first_token_seconds_count{model=\"m\"} ";
    const char *sum = "infergate_time_to_first_token_seconds_sum{model=\"m\"} ";
    double c0 = ig_gwf_metric(g.port, count), s0 = ig_gwf_metric(g.port, sum);
    if (c0 < 0)
        c0 = s0 = 0;
    ig_tc_response_t r;
    long long t0 = ig_tc_now_ms();
    assert_int_equal(ig_gwf_post(g.port, "/v1/chat/completions", chat_stream, &r, 20000), 0);
    long long took = ig_tc_now_ms() - t0;
    check_chat_stream(&r);
    ig_tc_response_free(&r);
    double c1 = ig_gwf_metric(g.port, count), s1 = ig_gwf_metric(g.port, sum);
    print_message("ttft of one chat stream: %.3f s (the answer took %lld ms)\n", s1 - s0, took);
    assert_true(c1 - c0 == 1);
    assert_true(s1 - s0 >= 0.25);
    assert_true(s1 - s0 <= took / 1000.0 + 0.05);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&ups[0], SIGKILL, 5000);
}

/* Hedging fires for chat: the chosen upstream sends its role delta and then
 * stalls; the copy on the runner-up wins, and the client sees one stream
 * (the winner's role delta, not the loser's). */
static void test_chat_hedge_beats_a_stall_after_the_role_delta(void **state)
{
    (void)state;
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--instant-raw", "--chat-role-first", "--delay-ms",
                                     "2", "--itl-ms", "1", NULL),
                     0);
    /* s1 is far slower than s0 (60 vs 2 ms), so that s0 is the router's
     * pick however slow the build is (under ASan the gateway's own time made
     * 2 and 10 ms too close to call, and s1 then answered without a hedge). */
    assert_int_equal(ig_gwf_upstream(&ups[1], "--instant-raw", "--chat-role-first", "--delay-ms",
                                     "60", "--itl-ms", "1", NULL),
                     0);
    ig_proc_t g;
    /* A whole hedge earned per request: under a sanitizer on a slow machine
     * warm-up requests past the 95th percentile spent 0.1-a-request budget
     * before the stall, which then had none (s0 answered after 3 s). */
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2,
                                        ",\"hedge\":{\"enabled\":true,\"budget\":1,"
                                        "\"delay_quantile\":0.95}",
                                        NULL),
                     0);
    ig_tc_response_t r;
    /* Earn hedge budget and teach the router s0's TTFT. */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(ig_gwf_post(g.port, "/v1/chat/completions", chat_stream, &r, 20000), 0);
        check_chat_stream(&r);
        ig_tc_response_free(&r);
    }
    const char *won = "infergate_hedges_total{model=\"m\",result=\"hedge_won\"} ";
    double won0 = ig_gwf_metric(g.port, won);
    if (won0 < 0)
        won0 = 0;
    /* s0 freezes: headers and role delta still leave at once. */
    assert_int_equal(ig_gwf_control(ups[0].port, "stall?ms=3000"), 200);
    long long t0 = ig_tc_now_ms();
    assert_int_equal(ig_gwf_post(g.port, "/v1/chat/completions", chat_stream, &r, 20000), 0);
    long long took = ig_tc_now_ms() - t0;
    check_chat_stream(&r);
    const char *up = ig_tc_header(&r, "x-infergate-upstream");
    const char *route = ig_tc_header(&r, "x-infergate-route");
    /* The route header names the primary's pick: s0 unless the router chose
     * otherwise, which is what a failure below needs to know. */
    print_message("hedged chat answer in %lld ms (the stall lasts 3000 ms); route: %s\n", took,
                  route ? route : "(none)");
    assert_non_null(up);
    assert_string_equal(up, "s1");
    ig_tc_response_free(&r);
    assert_true(took < 1500);
    assert_true(ig_gwf_metric(g.port, won) - won0 == 1);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

/* A stream that breaks after its role delta and before any content sent
 * nothing the client has seen: it is retried elsewhere, and the client
 * gets one whole stream. */
static void test_chat_break_before_content_is_retried(void **state)
{
    (void)state;
    ig_proc_t ups[2];
    assert_int_equal(ig_gwf_upstream(&ups[0], "--instant-raw", "--chat-role-first", "--delay-ms",
                                     "20", "--fail-after-tokens", "0", NULL),
                     0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--chat-role-first", "--delay-ms", "60", NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2, NULL, NULL), 0);
    for (int i = 0; i < 3; i++) {
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(g.port, "/v1/chat/completions", chat_stream, &r, 20000), 0);
        check_chat_stream(&r);
        assert_null(strstr(r.body, "upstream_stream_broken"));
        const char *up = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(up);
        assert_string_equal(up, "s1");
        ig_tc_response_free(&r);
    }
    assert_true(
        ig_gwf_metric(g.port, "infergate_retries_total{model=\"m\",reason=\"transport\"} ") >= 1);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

/* The completions endpoint: its first event carries text, and commits at
 * once (nothing is held back from a stream that has tokens). */
static void test_completion_stream_commits_on_first_text(void **state)
{
    (void)state;
    ig_proc_t ups[1];
    assert_int_equal(
        ig_gwf_upstream(&ups[0], "--instant-raw", "--delay-ms", "5", "--itl-ms", "200", NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 1, 1, NULL, NULL), 0);
    ig_tc_t *tc = ig_tc_connect(g.port);
    assert_non_null(tc);
    long long t0 = ig_tc_now_ms();
    assert_int_equal(ig_tc_send_post(tc, "/v1/completions",
                                     "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":5,"
                                     "\"stream\":true}"),
                     0);
    char buf[2048];
    long n = 0;
    long long first_text = -1;
    while (ig_tc_now_ms() - t0 < 3000 && n < (long)sizeof(buf) - 1) {
        long k = ig_tc_read_raw(tc, buf + n, 1, 3000);
        if (k <= 0)
            break;
        n += k;
        buf[n] = '\0';
        if (strstr(buf, "\"text\":\" ") != NULL) {
            first_text = ig_tc_now_ms() - t0;
            break;
        }
    }
    ig_tc_close(tc);
    print_message("first text event after %lld ms (the second comes at 205 ms)\n", first_text);
    assert_true(first_text >= 0);
    assert_true(first_text < 150);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_stop(&ups[0], SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_ttft_is_the_content_token),
        cmocka_unit_test(test_chat_hedge_beats_a_stall_after_the_role_delta),
        cmocka_unit_test(test_chat_break_before_content_is_retried),
        cmocka_unit_test(test_completion_stream_commits_on_first_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
