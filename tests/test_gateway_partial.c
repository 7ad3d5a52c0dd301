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
    assert_int_equal(
        ig_gwf_upstream(&ups[0], "--instant-raw", "--fail-partial", "--delay-ms", "1", NULL), 0);
    assert_int_equal(ig_gwf_upstream(&ups[1], "--delay-ms", "40", NULL), 0);
    ig_proc_t g;
    assert_int_equal(ig_gwf_sites_serve(&g, ups, 2, 2, NULL, NULL), 0);

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
    double retried =
        ig_gwf_metric(g.port, "infergate_retries_total{model=\"m\",reason=\"transport\"} ");
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
