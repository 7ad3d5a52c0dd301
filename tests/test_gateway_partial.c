/*
 * A retry after a partial body: an upstream that sends the headers and
 * half a non-streamed answer and then resets the connection is retried on
 * the healthy one, and the client gets exactly the healthy answer, never
 * the two bodies joined. Real processes on loopback: `infergate serve` in
 * front of two test upstreams (build/testupstream).
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

static void upstream_start(ig_proc_t *u, ...)
{
    const char *args[32];
    int n = 0;
    args[n++] = "--quiet";
    va_list ap;
    va_start(ap, u);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 31)
        args[n++] = a;
    va_end(ap);
    args[n] = NULL;
    assert_int_equal(ig_gwf_tool(u, "testupstream", ig_proc_free_port(), args, 10000), 0);
}

/* `infergate serve` with the upstreams as sites s0, s1, ... of model "m";
 * waits until every one is probed up. */
static void gateway_start(ig_proc_t *g, ig_proc_t *ups, int n, const char *routing_extra)
{
    char cfg[4096];
    int port = ig_proc_free_port();
    int off = snprintf(cfg, sizeof(cfg),
                       "{\"region\":\"test\",\"listen\":\"127.0.0.1:%d\","
                       "\"models\":[{\"name\":\"m\"}],\"sites\":[",
                       port);
    for (int i = 0; i < n; i++)
        off += snprintf(cfg + off, sizeof(cfg) - off,
                        "%s{\"name\":\"s%d\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}",
                        i ? "," : "", i, ups[i].port);
    snprintf(cfg + off, sizeof(cfg) - off, "],\"routing\":{\"policy\":\"latency\"%s}}",
             routing_extra ? routing_extra : "");
    const char *path = ig_proc_temp_file(cfg, ".json");
    assert_non_null(path);
    assert_int_equal(ig_gwf_serve(g, path, port, "warn", 0, 15000, 15000), 0);
    long long end = ig_tc_now_ms() + 10000;
    int up = 0;
    while (up < n && ig_tc_now_ms() < end) {
        up = 0;
        json_t *doc = ig_gwf_get_json(g->port, "/status");
        size_t i;
        json_t *site;
        json_array_foreach(json_object_get(doc, "sites"), i, site) up +=
            json_is_true(json_object_get(site, "up"));
        json_decref(doc);
    }
    assert_int_equal(up, n);
}

/* The number in the metric line that starts with `series`, or -1. */
static double metric(int port, const char *series)
{
    char *text = ig_gwf_get_text(port, "/metrics");
    assert_non_null(text);
    double v = -1;
    const char *p = strstr(text, series);
    if (p != NULL)
        v = strtod(p + strlen(series), NULL);
    free(text);
    return v;
}

static void check_whole_answer(const ig_tc_response_t *r, const char *object)
{
    json_error_t err;
    json_t *doc = json_loadb(r->body, r->body_len, 0, &err);
    if (doc == NULL)
        print_message("not one JSON document (%s): %.*s\n", err.text, (int)r->body_len, r->body);
    assert_non_null(doc);
    assert_string_equal(json_string_value(json_object_get(doc, "object")), object);
    /* Exactly one answer: a second body would follow the first one's end. */
    assert_int_equal(json_array_size(json_object_get(doc, "choices")), 1);
    json_decref(doc);
}

static void test_partial_body_then_reset_is_retried_clean(void **state)
{
    (void)state;
    ig_proc_t ups[2];
    /* s0 is the fast one the router prefers; every answer it starts breaks
     * after half the body. s1 is slower and healthy. */
    upstream_start(&ups[0], "--instant-raw", "--fail-partial", "--delay-ms", "1", NULL);
    upstream_start(&ups[1], "--delay-ms", "40", NULL);
    ig_proc_t g;
    gateway_start(&g, ups, 2, NULL);

    static const char *bodies[][2] = {
        {"/v1/completions", "{\"model\":\"m\",\"prompt\":\"hello there\",\"max_tokens\":8}"},
        {"/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
                                 "\"hello there\"}],\"max_tokens\":8}"},
    };
    for (int i = 0; i < 4; i++) {
        const char *path = bodies[i % 2][0];
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(g.port, path, bodies[i % 2][1], &r, 20000), 0);
        if (r.status != 200)
            print_message("request %d: %d %s\n", i, r.status, r.body);
        assert_int_equal(r.status, 200);
        const char *up = ig_tc_header(&r, "x-infergate-upstream");
        assert_non_null(up);
        assert_string_equal(up, "s1");
        check_whole_answer(&r, i % 2 ? "chat.completion" : "text_completion");
        ig_tc_response_free(&r);
    }
    /* The partial answers did happen (s0 was tried, and retried away from). */
    double retried = metric(g.port, "infergate_retries_total{model=\"m\",reason=\"transport\"} ");
    print_message("retries after a partial body: %g\n", retried);
    assert_true(retried >= 1);
    json_t *st = ig_gwf_get_json(ups[0].port, "/_control/stats");
    assert_non_null(st);
    assert_true(json_integer_value(json_object_get(st, "failed_streams")) >= 1);
    json_decref(st);

    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    for (int i = 0; i < 2; i++)
        ig_proc_stop(&ups[i], SIGKILL, 5000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_partial_body_then_reset_is_retried_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
