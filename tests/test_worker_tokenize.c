/*
 * POST /v1/tokenize and /v1/detokenize through the real worker: the count
 * is the prompt_tokens a generation request is billed for (text, token ids
 * and chat), detokenize gives the text back, and bad input is a 400 naming
 * the field. GET /v1/tokenizer/FILE gives the model directory's tokenizer
 * files byte for byte, and a 404 naming the file for one it lacks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker_proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The file's bytes, or NULL when it cannot be read; *len its length. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    *len = 0;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        buf = realloc(buf, *len + n);
        assert_non_null(buf);
        memcpy(buf + *len, chunk, n);
        *len += n;
    }
    fclose(f);
    return buf;
}

static void test_tokenizer_files(void **state)
{
    (void)state;
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json",
                                        "generation_config.json"};
    int served = 0;
    for (int i = 0; i < 3; i++) {
        char path[600], url[80];
        snprintf(path, sizeof(path), "%s/%s", ig_gwf_model_dir, names[i]);
        snprintf(url, sizeof(url), "/v1/tokenizer/%s", names[i]);
        size_t len = 0;
        char *want = read_all(path, &len);
        ig_tc_response_t r;
        assert_int_equal(wt_get(&W, url, &r), 0);
        if (want == NULL) {
            assert_int_equal(r.status, 404);
            assert_non_null(strstr(r.body, names[i]));
        } else {
            assert_int_equal(r.status, 200);
            assert_int_equal(r.body_len, len);
            assert_memory_equal(r.body, want, len);
            served++;
        }
        ig_tc_response_free(&r);
        free(want);
    }
    assert_true(served >= 1); /* tokenizer.json at least: the model loads */
    ig_tc_response_t r;
    assert_int_equal(wt_get(&W, "/v1/tokenizer/weights.safetensors", &r), 0);
    assert_int_equal(r.status, 404);
    ig_tc_response_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_bad),
        cmocka_unit_test(test_tokenizer_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
