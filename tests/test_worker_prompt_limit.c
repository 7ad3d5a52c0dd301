/*
 * --max-prompt-tokens against the real worker binary: text, token-id and
 * chat prompts over the limit get an OpenAI-style 400
 * (context_length_exceeded) naming the limit and the prompt's length; at
 * the limit they are served. Without the flag the context length (512 for
 * the tiny model) is the bound.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker_proc.h"

#define LIMIT 8

static wproc_t W;     /* --max-prompt-tokens LIMIT */
static wproc_t PLAIN; /* no flag */

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    const char *limited[] = {"--max-prompt-tokens", "8", NULL};
    if (wt_start(&W, "limited", limited) < 0)
        return -1;
    return wt_start(&PLAIN, "plain", NULL);
}

static int teardown(void **state)
{
    wt_stop(&W);
    wt_stop(&PLAIN);
    ig_gwf_model_teardown(state);
    return 0;
}

/* A token-id prompt of n ids (ids 100 + i: ordinary pieces of the vocab). */
static char *ids_body(int n)
{
    json_t *ids = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(ids, json_integer(100 + i));
    json_t *b = json_pack("{s:o, s:i, s:f}", "prompt", ids, "max_tokens", 1, "temperature", 0.0);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

/* Asserts a context_length_exceeded 400 whose message has both numbers
 * (ntok 0: only the limit). */
static void assert_too_long(json_t *j, int status, const char *param, int limit, int ntok)
{
    char a[32], b[32];
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    if (status != 400)
        fail_msg("status %d: %s", status, json_string_value(json_object_get(e, "message")));
    assert_string_equal(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    assert_string_equal(json_string_value(json_object_get(e, "param")), param);
    const char *msg = json_string_value(json_object_get(e, "message"));
    snprintf(a, sizeof(a), "%d tokens", limit);
    assert_non_null(strstr(msg, a));
    if (ntok > 0) {
        snprintf(b, sizeof(b), "%d tokens", ntok);
        assert_non_null(strstr(msg, b));
    }
}

/* Posts body to path of w and asserts the answer with assert_too_long. */
static void expect_too_long(const wproc_t *w, const char *path, const char *body, const char *param,
                            int limit, int ntok)
{
    int status;
    json_t *j = wt_post_json(w, path, body, &status);
    assert_too_long(j, status, param, limit, ntok);
    json_decref(j);
}

static void test_token_ids(void **state)
{
    int status;
    char *body = ids_body(LIMIT + 1);
    json_t *j = wt_post_json(&W, "/v1/completions", body, &status);
    assert_too_long(j, status, "prompt", LIMIT, LIMIT + 1);
    assert_non_null(
        strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
               "maximum prompt length"));
    json_decref(j);
    free(body);
    body = ids_body(LIMIT);
    j = wt_post_json(&W, "/v1/completions", body, &status);
    assert_int_equal(status, 200);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), LIMIT);
    json_decref(j);
    free(body);
}

static void test_text_and_batch(void **state)
{
    int status;
    /* Many words: far more than 8 tokens. */
    expect_too_long(&W, "/v1/completions",
                    "{\"prompt\": \"once upon a time there was a little model that "
                    "read a very long prompt\", \"max_tokens\": 1}",
                    "prompt", LIMIT, 0);
    json_t *j =
        wt_post_json(&W, "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 1}", &status);
    assert_int_equal(status, 200);
    json_decref(j);
    /* One long prompt in a batch refuses the whole request. */
    expect_too_long(&W, "/v1/completions",
                    "{\"prompt\": [\"hi\", [1,2,3,4,5,6,7,8,9,10]], \"max_tokens\": 1}", "prompt",
                    LIMIT, 10);
}

static void test_chat(void **state)
{
    /* The template alone is several tokens; with the content, over 8. */
    expect_too_long(&W, "/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"tell me a long "
                    "story about a model\"}], \"max_tokens\": 1}",
                    "messages", LIMIT, 0);
}

/* Without the flag: the context length. */
static void test_default_is_context(void **state)
{
    int status;
    char *body = ids_body(600);
    expect_too_long(&PLAIN, "/v1/completions", body, "prompt", 512, 0);
    free(body);
    body = ids_body(LIMIT + 1);
    json_t *j = wt_post_json(&PLAIN, "/v1/completions", body, &status);
    assert_int_equal(status, 200);
    json_decref(j);
    free(body);
    /* /v1/models says which bound is in force. */
    ig_tc_response_t r;
    assert_int_equal(wt_get(&W, "/v1/models", &r), 0);
    j = json_loadb(r.body, r.body_len, 0, NULL);
    ig_tc_response_free(&r);
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    assert_int_equal(json_integer_value(json_object_get(m, "max_prompt_tokens")), LIMIT);
    json_decref(j);
}

static void test_flag_checked(void **state)
{
    ig_proc_t p;
    const char *args[] = {"worker",
                          "--model",
                          ig_gwf_model_dir,
                          "--listen",
                          "unix:/tmp/x.sock",
                          "--max-prompt-tokens",
                          "-1",
                          NULL};
    assert_int_equal(ig_proc_start_bin(&p, "infergate", args, IG_PROC_PIPES), 0);
    assert_int_equal(ig_proc_wait_exit(&p, 10000), 2);
    assert_non_null(strstr(p.err, "--max-prompt-tokens"));
    ig_proc_dispose(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_ids),    cmocka_unit_test(test_text_and_batch),
        cmocka_unit_test(test_chat),         cmocka_unit_test(test_default_is_context),
        cmocka_unit_test(test_flag_checked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
