/*
 * POST /v1/tokenize and /v1/detokenize through the real worker: the count
 * is the prompt_tokens a generation request is billed for (text, token ids
 * and chat), detokenize gives the text back, and bad input is a 400 naming
 * the field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker_proc.h"

static wproc_t W;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    return wt_start(&W, "tok", NULL);
}

static int teardown(void **state)
{
    wt_stop(&W);
    ig_gwf_model_teardown(state);
    return 0;
}

static json_t *post(const char *path, const char *body, int want)
{
    int st;
    json_t *j = wt_post_json(&W, path, body, &st);
    if (st != want)
        fail_msg("%s %s: status %d, want %d", path, body, st, want);
    assert_non_null(j);
    return j;
}

static int prompt_tokens(const char *path, const char *body)
{
    json_t *j = post(path, body, 200);
    int n = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    return n;
}

static void test_counts(void **state)
{
    (void)state;
    json_t *t = post("/v1/tokenize", "{\"prompt\":\"hello world, how are you\"}", 200);
    json_t *toks = json_object_get(t, "tokens");
    int count = (int)json_integer_value(json_object_get(t, "count"));
    assert_int_equal(count, (int)json_array_size(toks));
    assert_true(json_integer_value(json_object_get(t, "max_model_len")) > 0);
    assert_int_equal(count,
                     prompt_tokens("/v1/completions",
                                   "{\"prompt\":\"hello world, how are you\",\"max_tokens\":1}"));
    /* detokenize gives the text back (BOS, a special token, by its name) */
    char *ids = json_dumps(toks, JSON_COMPACT);
    char body[4096];
    snprintf(body, sizeof(body), "{\"tokens\":%s}", ids);
    free(ids);
    json_t *d = post("/v1/detokenize", body, 200);
    assert_non_null(
        strstr(json_string_value(json_object_get(d, "prompt")), "hello world, how are you"));
    json_decref(d);
    json_decref(t);

    /* token ids are used as given */
    t = post("/v1/tokenize", "{\"prompt\":[5,6,7]}", 200);
    assert_int_equal(json_integer_value(json_object_get(t, "count")), 3);
    json_decref(t);

    /* chat: the rendered template, as the chat request counts it */
    const char *msgs = "\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"Hi there\"}]";
    snprintf(body, sizeof(body), "{%s}", msgs);
    t = post("/v1/tokenize", body, 200);
    snprintf(body, sizeof(body), "{%s,\"max_tokens\":1}", msgs);
    assert_int_equal(json_integer_value(json_object_get(t, "count")),
                     prompt_tokens("/v1/chat/completions", body));
    json_decref(t);
}

static void test_bad(void **state)
{
    (void)state;
    const struct {
        const char *path, *body, *param;
    } cases[] = {
        {"/v1/tokenize", "{}", "prompt"},
        {"/v1/tokenize", "{\"prompt\":[\"a\",\"b\"]}", "prompt"},
        {"/v1/tokenize", "{\"messages\":[]}", "messages"},
        {"/v1/tokenize",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\"}}]}",
         "tools"},
        {"/v1/detokenize", "{\"tokens\":\"x\"}", "tokens"},
        {"/v1/detokenize", "{\"tokens\":[1,-1]}", "tokens"},
        {"/v1/detokenize", "{\"tokens\":[4096]}", "tokens"},
        {"/v1/detokenize", "[1]", "tokens"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = post(cases[i].path, cases[i].body, 400);
        json_t *e = json_object_get(j, "error");
        const char *param = json_string_value(json_object_get(e, "param"));
        if (!param || strcmp(param, cases[i].param) != 0)
            fail_msg("case %zu %s: param %s, want %s", i, cases[i].body, param ? param : "null",
                     cases[i].param);
        json_decref(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_bad),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
