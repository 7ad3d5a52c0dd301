/* API: response bodies, SSE chunks and the models list have the shapes
 * OpenAI clients parse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/api.h"

#include <stdlib.h>
#include <string.h>

static json_t *sse_json(char *s, size_t *lenp)
{
    size_t len = *lenp;
    assert_non_null(s);
    assert_true(len > 8);
    assert_memory_equal(s, "data: ", 6);
    assert_memory_equal(s + len - 2, "\n\n", 2);
    json_t *j = json_loadb(s + 6, len - 8, 0, NULL);
    assert_non_null(j);
    free(s);
    return j;
}

/* Choice 0 of text (a string) with nlp logprobs. */
static ig_api_choice_t choice_with_logprobs(const char *text, const char *finish_reason,
                                            const ig_api_token_logprob_t *lp, int nlp)
{
    ig_api_choice_t c = {.index = 0,
                         .text = text,
                         .len = strlen(text),
                         .finish_reason = finish_reason,
                         .has_logprobs = 1,
                         .lp = lp,
                         .nlp = nlp};
    return c;
}

static void test_completion_echo_logprobs(void **state)
{
    ig_api_top_logprob_t top1[] = {{"b", 1, -0.5f}, {"c", 1, -1.5f}};
    ig_api_token_logprob_t lp[] = {
        {"a", 1, 0, 0, NULL, 0, 0}, /* first prompt position: null */
        {"b", 1, 1, -0.5f, top1, 2, 1},
        {"\xe2\x82", 2, 1, -2.0f, NULL, 0, 2}, /* half a UTF-8 char */
    };
    ig_api_choice_t c = choice_with_logprobs("abX", "length", lp, 3);
    ig_api_usage_t u = {2, 1};
    json_t *o = ig_api_response_json(IG_API_COMPLETION, "cmpl-1", 1700000000, "tiny", &c, 1, &u);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "object")), "text_completion");
    assert_string_equal(json_string_value(json_object_get(o, "id")), "cmpl-1");
    assert_int_equal(json_integer_value(json_object_get(o, "created")), 1700000000);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "abX");
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_t *l = json_object_get(ch, "logprobs");
    assert_true(json_is_null(json_array_get(json_object_get(l, "token_logprobs"), 0)));
    assert_true(json_is_null(json_array_get(json_object_get(l, "top_logprobs"), 0)));
    assert_true(json_real_value(json_array_get(json_object_get(l, "token_logprobs"), 1)) == -0.5);
    json_t *t1 = json_array_get(json_object_get(l, "top_logprobs"), 1);
    assert_true(json_real_value(json_object_get(t1, "c")) == -1.5);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 2)), 2);
    /* partial UTF-8 became U+FFFD, not a broken string */
    assert_string_equal(json_string_value(json_array_get(json_object_get(l, "tokens"), 2)),
                        "\xef\xbf\xbd\xef\xbf\xbd");
    json_decref(o);
    /* NUL in a text is shown as U+FFFD, so that any parser reads it back */
    ig_api_choice_t z = {.index = 0, .text = "a\0b", .len = 3, .finish_reason = "stop"};
    o = ig_api_response_json(IG_API_COMPLETION, "cmpl-1", 1, "tiny", &z, 1, &u);
    char *dump = json_dumps(o, JSON_COMPACT);
    assert_null(strstr(dump, "\\u0000"));
    json_t *back = json_loads(dump, 0, NULL);
    assert_non_null(back);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(back, "choices"), 0), "text")),
                        "a\xef\xbf\xbd"
                        "b");
    json_decref(back);
    free(dump);
    json_t *us = json_object_get(o, "usage");
    assert_int_equal(json_integer_value(json_object_get(us, "total_tokens")), 3);
    json_decref(o);
}

static void test_chat_response(void **state)
{
    ig_api_top_logprob_t top[] = {{"Hi", 2, -0.1f}};
    ig_api_token_logprob_t lp[] = {{"Hi", 2, 1, -0.1f, top, 1, 0}};
    ig_api_choice_t c = choice_with_logprobs("Hi", "stop", lp, 1);
    ig_api_usage_t u = {5, 1};
    json_t *o = ig_api_response_json(IG_API_CHAT, "chatcmpl-1", 1, "m", &c, 1, &u);
    assert_string_equal(json_string_value(json_object_get(o, "object")), "chat.completion");
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "Hi");
    json_t *e = json_array_get(json_object_get(json_object_get(ch, "logprobs"), "content"), 0);
    assert_string_equal(json_string_value(json_object_get(e, "token")), "Hi");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(e, "bytes"), 1)), 'i');
    assert_int_equal(json_array_size(json_object_get(e, "top_logprobs")), 1);
    json_decref(o);

    /* without logprobs the field is null */
    c.has_logprobs = 0;
    o = ig_api_response_json(IG_API_CHAT, "chatcmpl-1", 1, "m", &c, 1, &u);
    ch = json_array_get(json_object_get(o, "choices"), 0);
    assert_true(json_is_null(json_object_get(ch, "logprobs")));
    json_decref(o);
}

static void test_chunks(void **state)
{
    size_t len;
    ig_api_choice_t c = {.index = 0, .text = "", .len = 0};
    json_t *j = sse_json(ig_api_chunk_sse(IG_API_CHAT, "chatcmpl-x", 2, "m", &c, 1, 1, &len), &len);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *d = json_object_get(ch, "delta");
    assert_string_equal(json_string_value(json_object_get(d, "role")), "assistant");
    assert_true(json_is_null(json_object_get(ch, "finish_reason")));
    assert_true(json_is_null(json_object_get(j, "usage")));
    assert_non_null(json_object_get(j, "usage"));
    json_decref(j);

    c.text = "lo";
    c.len = 2;
    j = sse_json(ig_api_chunk_sse(IG_API_CHAT, "chatcmpl-x", 2, "m", &c, 0, 0, &len), &len);
    d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    assert_string_equal(json_string_value(json_object_get(d, "content")), "lo");
    assert_null(json_object_get(d, "role"));
    assert_null(json_object_get(j, "usage")); /* absent unless asked for */
    json_decref(j);

    c.text = "";
    c.len = 0;
    c.finish_reason = "stop";
    j = sse_json(ig_api_chunk_sse(IG_API_CHAT, "chatcmpl-x", 2, "m", &c, 0, 0, &len), &len);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(json_object_size(json_object_get(ch, "delta")), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(j);

    c.text = "abc";
    c.len = 3;
    c.finish_reason = NULL;
    j = sse_json(ig_api_chunk_sse(IG_API_COMPLETION, "cmpl-x", 2, "m", &c, 0, 1, &len), &len);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "text")), "abc");
    json_decref(j);

    ig_api_usage_t u = {3, 4};
    j = sse_json(ig_api_usage_sse(IG_API_COMPLETION, "cmpl-x", 2, "m", &u, &len), &len);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 7);
    json_decref(j);
    assert_string_equal(IG_API_SSE_DONE, "data: [DONE]\n\n");
}

static void test_errors_models_ids(void **state)
{
    ig_api_error_t e;
    ig_api_error(&e, 429, NULL, "queue full (%d waiting)", 8);
    json_t *j = ig_api_error_json(&e);
    json_t *er = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(er, "message")),
                        "queue full (8 waiting)");
    assert_string_equal(json_string_value(json_object_get(er, "type")), "rate_limit_error");
    assert_true(json_is_null(json_object_get(er, "param")));
    assert_int_equal(json_integer_value(json_object_get(er, "code")), 429);
    json_decref(j);

    const char *ids[] = {"tiny"};
    j = ig_api_models_json(ids, 1, 5, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "id")), "tiny");
    assert_string_equal(json_string_value(json_object_get(m, "object")), "model");
    json_decref(j);

    char a[64], b[64];
    ig_api_make_id(a, sizeof(a), "cmpl-");
    ig_api_make_id(b, sizeof(b), "cmpl-");
    assert_memory_equal(a, "cmpl-", 5);
    assert_int_equal(strlen(a), 5 + 24);
    assert_string_not_equal(a, b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_echo_logprobs),
        cmocka_unit_test(test_chat_response),
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_errors_models_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
