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
    (void)state;
    return ig_gwf_solo_start(&gw, "pl",
                             ",\"limits\":{\"max_prompt_tokens\":8,\"drain_grace_ms\":0}");
}

static int teardown(void **state)
{
    (void)state;
    return ig_gwf_solo_stop(&gw);
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

/* One request and what its answer must be. */
typedef struct {
    const char *path, *body;
    const char *param;    /* NULL: served (200); else refused as too long naming it */
    int upstream;         /* 1: x-infergate-upstream names one, 0: none, -1: not checked */
    const char *body_has; /* NULL or a part of the answer's body */
} pl_case_t;

static void run_cases(const pl_case_t *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const pl_case_t *c = &cases[i];
        ig_tc_response_t r;
        assert_int_equal(ig_gwf_post(gw.port, c->path, c->body, &r, 30000), 0);
        if (c->param)
            assert_too_long(&r, c->param);
        else
            assert_int_equal(r.status, 200);
        if (c->upstream >= 0)
            assert_int_equal(ig_tc_header(&r, "x-infergate-upstream") != NULL, c->upstream);
        if (c->body_has)
            assert_non_null(strstr(r.body, c->body_has));
        ig_tc_response_free(&r);
    }
}

#define COMPLETIONS "/v1/completions"
#define RUN_CASES(...)                                                                             \
    do {                                                                                           \
        static const pl_case_t cases_[] = {__VA_ARGS__};                                           \
        run_cases(cases_, sizeof(cases_) / sizeof(cases_[0]));                                     \
    } while (0)

static void test_text_refused_by_worker(void **state)
{
    RUN_CASES(
        {COMPLETIONS,
         "{\"model\":\"tiny\",\"max_tokens\":1,\"prompt\":\"once upon a "
         "time there was a model that read a long prompt\"}",
         "prompt", 1, NULL},
        /* A short one is served. */
        {COMPLETIONS, "{\"model\":\"tiny\",\"max_tokens\":1,\"prompt\":\"hi\"}", NULL, -1, NULL});
}

static void test_chat_refused_by_worker(void **state)
{
    RUN_CASES({"/v1/chat/completions",
               "{\"model\":\"tiny\",\"max_tokens\":1,\"messages\":[{\"role\":"
               "\"user\",\"content\":\"tell me a long story about a model\"}]}",
               "messages", -1, NULL});
}

static void test_ids_refused_by_gateway(void **state)
{
    /* Refused before routing: no upstream answered. */
    RUN_CASES({COMPLETIONS,
               "{\"model\":\"tiny\",\"max_tokens\":1,"
               "\"prompt\":[100,101,102,103,104,105,106,107,108]}",
               "prompt", 0, "resulted in 9 tokens"},
              /* In a batch too. */
              {COMPLETIONS,
               "{\"model\":\"tiny\",\"max_tokens\":1,"
               "\"prompt\":[[1,2],[1,2,3,4,5,6,7,8,9,10,11]]}",
               "prompt", 0, NULL},
              /* At the limit: routed and served. */
              {COMPLETIONS,
               "{\"model\":\"tiny\",\"max_tokens\":1,"
               "\"prompt\":[100,101,102,103,104,105,106,107]}",
               NULL, 1, NULL});
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
