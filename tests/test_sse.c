/*
 * route/sse.c: an event's data as an EventSource parser joins it, and which
 * payloads start an OpenAI answer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/sse.h"

#include <stdlib.h>
#include <string.h>

/* Through a buffer that fits (cap 256) and one that does not (cap 1). */
static void expect_data(const char *ev, const char *want)
{
    for (size_t cap = 256; cap > 0; cap = cap == 256 ? 1 : 0) {
        char buf[256], *data;
        size_t len;
        assert_int_equal(ig_sse_event_data(ev, strlen(ev), buf, cap, &data, &len), 0);
        if (want == NULL) {
            assert_null(data);
            continue;
        }
        assert_non_null(data);
        assert_true(cap == 256 ? data == buf : data != buf);
        assert_int_equal(len, strlen(want));
        assert_string_equal(data, want);
        if (data != buf)
            free(data);
    }
}

static void test_event_data(void **state)
{
    (void)state;
    expect_data("data: {\"a\":1}", "{\"a\":1}");
    expect_data("data:{\"a\":1}\r", "{\"a\":1}");               /* CRLF lines, no space */
    expect_data("data:  two spaces", " two spaces");            /* only one is dropped */
    expect_data("data: one\ndata: two\r\ndata:", "one\ntwo\n"); /* joined with \n */
    expect_data(": a comment\nevent: x\nid: 3\ndata: d", "d");
    expect_data(": only a comment\nevent: ping", NULL);
    expect_data("", NULL);
    expect_data("data:", "");
    expect_data("dat: no", NULL);
}

static int token(const char *p)
{
    return ig_sse_payload_is_token(p, strlen(p));
}

static void test_payload_is_token(void **state)
{
    (void)state;
    assert_true(token("[DONE]"));
    assert_true(token("not json")); /* an unknown format is never held back */
    assert_true(token("{\"error\":{\"message\":\"x\"}}"));
    assert_true(token("{\"choices\":[],\"usage\":{\"prompt_tokens\":3}}"));
    assert_true(token("{\"choices\":[{\"text\":\"a\"}]}"));
    assert_true(token("{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}"));
    assert_true(token("{\"choices\":[{\"delta\":{\"refusal\":\"no\"}}]}"));
    assert_true(token("{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}"));
    assert_true(token("{\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}"));
    /* The role delta, empty text and a null finish_reason are not tokens. */
    assert_false(token("{\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}"));
    assert_false(token("{\"choices\":[{\"text\":\"\",\"finish_reason\":null}]}"));
    assert_false(token("{\"choices\":[{\"delta\":{\"tool_calls\":[]}}]}"));
    assert_false(token("{}"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_event_data),
        cmocka_unit_test(test_payload_is_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
