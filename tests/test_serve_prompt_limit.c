/*
 * limits.max_prompt_tokens through a real gateway and its pool worker:
 * the gateway starts its workers with --max-prompt-tokens, so a text
 * prompt over the limit is refused by the worker that tokenizes it (the
 * answer names the upstream), and a token-id prompt over it is refused by
 * the gateway itself before routing (no upstream named). Both are
 * OpenAI-style 400 context_length_exceeded naming the limit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gwfixture.h"

#define LIMIT 8

static ig_proc_t gw;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) != 0)
        return -1;
    int port = ig_proc_free_port();
    const char *path =
        ig_gwf_pool_config("pl", port, ig_gwf_model_dir, 1, 1, 1, 8, NULL,
                           ",\"limits\":{\"max_prompt_tokens\":8,\"drain_grace_ms\":0}");
    if (path == NULL || ig_gwf_serve(&gw, path, port, "warn", 0, 20000, 60000) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    int rc = ig_proc_stop(&gw, SIGTERM, 20000);
    ig_proc_dispose(&gw);
    ig_gwf_model_teardown(state);
    return rc == 0 ? 0 : -1;
}

static void assert_too_long(const ig_tc_response_t *r, const char *param)
{
    char want[64];
    assert_int_equal(r->status, 400);
    json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
    assert_string_equal(json_string_value(json_object_get(e, "param")), param);
    snprintf(want, sizeof(want), "maximum prompt length is %d tokens", LIMIT);
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), want));
    json_decref(j);
}

/* The pool's worker was started with the limit. */
static void test_worker_gets_the_flag(void **state)
{
    json_t *st = ig_gwf_get_json(gw.port, "/status");
    assert_non_null(st);
    json_t *in = json_array_get(
        json_object_get(json_array_get(json_object_get(st, "pools"), 0), "instances"), 0);
    int pid = (int)json_integer_value(json_object_get(in, "pid"));
    json_decref(st);
    assert_true(pid > 0);
    char path[64], buf[4096];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    buf[n] = '\0';
    if (strstr(buf, " --max-prompt-tokens 8 ") == NULL)
        fail_msg("worker argv: %s", buf);
}

static void test_text_refused_by_worker(void **state)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(gw.port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"max_tokens\":1,\"prompt\":\"once upon a "
                                 "time there was a model that read a long prompt\"}",
                                 &r, 30000),
                     0);
    assert_too_long(&r, "prompt");
    assert_non_null(ig_tc_header(&r, "x-infergate-upstream"));
    ig_tc_response_free(&r);
    /* A short one is served. */
    assert_int_equal(ig_gwf_post(gw.port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"max_tokens\":1,\"prompt\":\"hi\"}", &r,
                                 30000),
                     0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
}

static void test_chat_refused_by_worker(void **state)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(gw.port, "/v1/chat/completions",
                                 "{\"model\":\"tiny\",\"max_tokens\":1,\"messages\":[{\"role\":"
                                 "\"user\",\"content\":\"tell me a long story about a model\"}]}",
                                 &r, 30000),
                     0);
    assert_too_long(&r, "messages");
    ig_tc_response_free(&r);
}

static void test_ids_refused_by_gateway(void **state)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(gw.port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"max_tokens\":1,"
                                 "\"prompt\":[100,101,102,103,104,105,106,107,108]}",
                                 &r, 30000),
                     0);
    assert_too_long(&r, "prompt");
    assert_non_null(strstr(r.body, "resulted in 9 tokens"));
    /* Refused before routing: no upstream answered. */
    assert_null(ig_tc_header(&r, "x-infergate-upstream"));
    ig_tc_response_free(&r);
    /* In a batch too. */
    assert_int_equal(ig_gwf_post(gw.port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"max_tokens\":1,"
                                 "\"prompt\":[[1,2],[1,2,3,4,5,6,7,8,9,10,11]]}",
                                 &r, 30000),
                     0);
    assert_too_long(&r, "prompt");
    assert_null(ig_tc_header(&r, "x-infergate-upstream"));
    ig_tc_response_free(&r);
    /* At the limit: routed and served. */
    assert_int_equal(ig_gwf_post(gw.port, "/v1/completions",
                                 "{\"model\":\"tiny\",\"max_tokens\":1,"
                                 "\"prompt\":[100,101,102,103,104,105,106,107]}",
                                 &r, 30000),
                     0);
    assert_int_equal(r.status, 200);
    assert_non_null(ig_tc_header(&r, "x-infergate-upstream"));
    ig_tc_response_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worker_gets_the_flag),
        cmocka_unit_test(test_text_refused_by_worker),
        cmocka_unit_test(test_chat_refused_by_worker),
        cmocka_unit_test(test_ids_refused_by_gateway),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
