/* The worker binary on a Unix socket with a tiny model: endpoints and its
 * route table (HEAD, 404, 405 + Allow, route labels), completions (plain,
 * stream, token ids, echo + logprobs), chat, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/load.h"

#include "worker_proc.h"

static wproc_t W;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    const char *extra[] = {"--kv-blocks", "256", NULL};
    return wt_start(&W, "w", extra);
}

static int teardown(void **state)
{
    wt_stop(&W);
    ig_gwf_model_teardown(state);
    return 0;
}

static void test_endpoints(void **state)
{
    ig_tc_response_t r;
    assert_int_equal(wt_get(&W, "/health", &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    assert_int_equal(wt_get(&W, "/ready", &r), 0);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);

    assert_int_equal(wt_get(&W, "/v1/models", &r), 0);
    assert_int_equal(r.status, 200);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")),
        "tiny");
    json_decref(j);
    ig_tc_response_free(&r);

    assert_int_equal(wt_get(&W, "/load", &r), 0);
    assert_int_equal(r.status, 200);
    j = json_loadb(r.body, r.body_len, 0, NULL);
    const char *keys[] = {"waiting",
                          "running",
                          "kv_blocks_used",
                          "kv_blocks_total",
                          "decode_tokens_per_s",
                          "prefill_tokens_per_s",
                          "est_wait_s",
                          "max_waiting",
                          "model",
                          "max_num_seqs"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (!json_object_get(j, keys[i]))
            fail_msg("/load lacks %s", keys[i]);
    assert_int_equal(json_integer_value(json_object_get(j, "kv_blocks_total")), 256);
    json_decref(j);
    /* What the pool reads: the one decoder takes every field the worker sends. */
    ig_load_t l;
    ig_load_init(&l);
    assert_int_equal(ig_load_decode(r.body, r.body_len, &l, NULL, 0), 0);
    assert_int_equal(l.has & IG_LOAD_WORKER_FIELDS, IG_LOAD_WORKER_FIELDS);
    assert_int_equal(l.kv_blocks_total, 256);
    assert_string_equal(l.model, "tiny");
    ig_load_dispose(&l);
    ig_tc_response_free(&r);

    assert_int_equal(wt_get(&W, "/nope", &r), 0);
    assert_int_equal(r.status, 404);
    ig_tc_response_free(&r);
    assert_int_equal(wt_request(&W, "GET", "/v1/completions", NULL, &r), 0);
    assert_int_equal(r.status, 405);
    ig_tc_response_free(&r);
}

static char *completion_text(json_t *j)
{
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    return strdup(json_string_value(json_object_get(ch, "text")));
}

static void test_completion_plain_and_stream(void **state)
{
    int st;
    json_t *j =
        wt_post_json(&W, "/v1/completions",
                     "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":12,"
                     "\"temperature\":0,\"ignore_eos\":true}",
                     &st);
    assert_int_equal(st, 200);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "text_completion");
    assert_memory_equal(json_string_value(json_object_get(j, "id")), "cmpl-", 5);
    json_t *u = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 12);
    assert_true(json_integer_value(json_object_get(u, "prompt_tokens")) > 1);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "length");
    char *plain = completion_text(j);
    assert_true(strlen(plain) > 0);
    json_decref(j);

    /* the same request streamed: same text, usage chunk, [DONE] */
    ig_tc_response_t r;
    assert_int_equal(wt_request(&W, "POST", "/v1/completions",
                                "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,"
                                "\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
                                "\"stream_options\":{\"include_usage\":true}}",
                                &r),
                     0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(ig_tc_header(&r, "content-type"), "text/event-stream"));
    int done;
    json_t *ev = wt_sse_events(r.body, &done);
    assert_true(done);
    size_t n = json_array_size(ev);
    assert_true(n >= 3);
    char text[4096] = "";
    for (size_t i = 0; i + 1 < n; i++) {
        json_t *e = json_array_get(ev, i);
        assert_string_equal(json_string_value(json_object_get(e, "object")), "text_completion");
        assert_true(json_is_null(json_object_get(e, "usage")));
        json_t *c = json_array_get(json_object_get(e, "choices"), 0);
        strncat(text, json_string_value(json_object_get(c, "text")),
                sizeof(text) - strlen(text) - 1);
    }
    json_t *last = json_array_get(ev, n - 1);
    assert_int_equal(json_array_size(json_object_get(last, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(last, "usage"), "completion_tokens")),
        12);
    json_t *before = json_array_get(json_object_get(json_array_get(ev, n - 2), "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(before, "finish_reason")), "length");
    assert_string_equal(text, plain);
    free(plain);
    json_decref(ev);
    ig_tc_response_free(&r);
}

static void test_token_ids_echo_logprobs(void **state)
{
    int st;
    json_t *j = wt_post_json(&W, "/v1/completions",
                             "{\"prompt\":[1,300,400,500],\"max_tokens\":3,\"echo\":true,"
                             "\"logprobs\":2,\"temperature\":0,\"ignore_eos\":true}",
                             &st);
    assert_int_equal(st, 200);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *lp = json_object_get(ch, "logprobs");
    json_t *tokens = json_object_get(lp, "tokens"), *tlp = json_object_get(lp, "token_logprobs"),
           *top = json_object_get(lp, "top_logprobs"), *off = json_object_get(lp, "text_offset");
    /* 4 prompt positions + 3 generated */
    assert_int_equal(json_array_size(tokens), 7);
    assert_int_equal(json_array_size(tlp), 7);
    assert_int_equal(json_array_size(top), 7);
    assert_int_equal(json_array_size(off), 7);
    assert_true(json_is_null(json_array_get(tlp, 0)));
    assert_true(json_is_null(json_array_get(top, 0)));
    for (int i = 1; i < 7; i++) {
        assert_true(json_is_number(json_array_get(tlp, (size_t)i)));
        assert_true(json_number_value(json_array_get(tlp, (size_t)i)) <= 0);
        assert_true(json_object_size(json_array_get(top, (size_t)i)) >= 1);
    }
    /* greedy: each generated token is the most likely one */
    for (int i = 4; i < 7; i++) {
        double l = json_number_value(json_array_get(tlp, (size_t)i));
        const char *k;
        json_t *v;
        json_object_foreach(json_array_get(top, (size_t)i), k, v)
        {
            assert_true(json_number_value(v) <= l + 1e-6);
        }
    }
    /* the text starts with the echoed prompt and the offsets rise */
    const char *text = json_string_value(json_object_get(ch, "text"));
    const char *t0 = json_string_value(json_array_get(tokens, 1));
    assert_non_null(strstr(text, t0));
    for (int i = 1; i < 7; i++)
        assert_true(json_integer_value(json_array_get(off, (size_t)i)) >=
                    json_integer_value(json_array_get(off, (size_t)i - 1)));
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 4);
    json_decref(j);

    /* a batch of two token-id prompts: two choices, indexes 0 and 1 */
    j = wt_post_json(&W, "/v1/completions", "{\"prompt\":[[1,5],[1,6,7]],\"max_tokens\":2}", &st);
    assert_int_equal(st, 200);
    json_t *chs = json_object_get(j, "choices");
    assert_int_equal(json_array_size(chs), 2);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(chs, 1), "index")), 1);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 5);
    json_decref(j);
}

static void test_chat(void **state)
{
    int st;
    json_t *j =
        wt_post_json(&W, "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]}],"
                     "\"max_tokens\":5,\"logprobs\":true,\"top_logprobs\":3,\"seed\":1}",
                     &st);
    assert_int_equal(st, 200);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    assert_memory_equal(json_string_value(json_object_get(j, "id")), "chatcmpl-", 9);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_true(json_is_string(json_object_get(msg, "content")));
    json_t *content = json_object_get(json_object_get(ch, "logprobs"), "content");
    int ntok =
        (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    assert_true(ntok >= 1 && ntok <= 5);
    assert_true((int)json_array_size(content) >= ntok - 1);
    json_t *e0 = json_array_get(content, 0);
    assert_true(json_is_array(json_object_get(e0, "bytes")));
    assert_int_equal(json_array_size(json_object_get(e0, "top_logprobs")), 3);
    json_decref(j);

    ig_tc_response_t r;
    assert_int_equal(wt_request(&W, "POST", "/v1/chat/completions",
                                "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"
                                "\"max_tokens\":4,\"stream\":true,\"temperature\":0}",
                                &r),
                     0);
    int done;
    json_t *ev = wt_sse_events(r.body, &done);
    assert_true(done);
    json_t *first = json_array_get(ev, 0);
    assert_string_equal(json_string_value(json_object_get(first, "object")),
                        "chat.completion.chunk");
    json_t *d0 = json_object_get(json_array_get(json_object_get(first, "choices"), 0), "delta");
    assert_string_equal(json_string_value(json_object_get(d0, "role")), "assistant");
    json_t *last = json_array_get(ev, json_array_size(ev) - 1);
    json_t *lc = json_array_get(json_object_get(last, "choices"), 0);
    assert_true(json_is_string(json_object_get(lc, "finish_reason")));
    json_decref(ev);
    ig_tc_response_free(&r);
}

typedef struct {
    const char *path;
    const char *body;
    int status;
    const char *param;
} bad_t;

static void test_bad_requests(void **state)
{
    static const bad_t cases[] = {
        {"/v1/completions", "{not json", 400, NULL},
        {"/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens"},
        {"/v1/completions", "{\"prompt\":\"x\",\"n\":0}", 400, "n"},
        {"/v1/completions", "{\"prompt\":\"x\",\"temperature\":\"warm\"}", 400, "temperature"},
        {"/v1/completions", "{\"prompt\":\"x\",\"logprobs\":50}", 400, "logprobs"},
        {"/v1/completions", "{\"prompt\":[1,99999]}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":100000}", 400, "prompt"},
        {"/v1/completions", "{\"prompt\":\"x\",\"model\":\"other\"}", 404, "model"},
        {"/v1/completions", "{\"prompt\":\"\\ud800\"}", 400, NULL},
        {"/v1/chat/completions", "{\"messages\":[]}", 400, "messages"},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400,
         "top_logprobs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int st;
        json_t *j = wt_post_json(&W, cases[i].path, cases[i].body, &st);
        if (st != cases[i].status)
            fail_msg("case %zu (%s): status %d, want %d", i, cases[i].body, st, cases[i].status);
        json_t *e = json_object_get(j, "error");
        assert_non_null(e);
        assert_true(json_is_string(json_object_get(e, "message")));
        if (cases[i].param)
            assert_string_equal(json_string_value(json_object_get(e, "param")), cases[i].param);
        json_decref(j);
    }
    /* Raw invalid UTF-8 bytes in the body */
    int st;
    json_t *j = wt_post_json(&W, "/v1/completions", "{\"prompt\":\"a\xff\"}", &st);
    assert_int_equal(st, 400);
    json_decref(j);
    /* a prompt longer than the context names both lengths */
    char big[8192];
    size_t o = (size_t)snprintf(big, sizeof(big), "{\"prompt\":[");
    for (int i = 0; i < 600; i++)
        o += (size_t)snprintf(big + o, sizeof(big) - o, "%s5", i ? "," : "");
    snprintf(big + o, sizeof(big) - o, "],\"max_tokens\":1}");
    j = wt_post_json(&W, "/v1/completions", big, &st);
    assert_int_equal(st, 400);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    assert_non_null(strstr(msg, "512"));
    assert_non_null(strstr(msg, "600"));
    json_decref(j);
}

static void test_stop_strings(void **state)
{
    /* Generate greedily, then ask again with a stop string taken from the
     * middle of that text: the answer is the text before it. */
    int st;
    json_t *j = wt_post_json(&W, "/v1/completions",
                             "{\"prompt\":\"The\",\"max_tokens\":30,\"temperature\":0,"
                             "\"ignore_eos\":true}",
                             &st);
    assert_int_equal(st, 200);
    char *full = completion_text(j);
    json_decref(j);
    size_t len = strlen(full);
    assert_true(len > 12);
    char stop[5];
    memcpy(stop, full + len / 2, 4);
    stop[4] = 0;
    const char *at = strstr(full, stop);
    char body[512];
    json_t *sj = json_string(stop);
    char *sjs = json_dumps(sj, JSON_ENCODE_ANY);
    snprintf(body, sizeof(body),
             "{\"prompt\":\"The\",\"max_tokens\":30,\"temperature\":0,\"ignore_eos\":true,"
             "\"stop\":[%s],\"stream\":%s}",
             sjs, "false");
    j = wt_post_json(&W, "/v1/completions", body, &st);
    assert_int_equal(st, 200);
    char *cut = completion_text(j);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    assert_int_equal(strlen(cut), (size_t)(at - full));
    assert_memory_equal(cut, full, strlen(cut));
    json_decref(j);
    free(cut);
    free(sjs);
    json_decref(sj);
    free(full);
}

static void test_deadline(void **state)
{
    /* A deadline from the request header: generation stops with 504
     * (non-streamed) or an error event before [DONE] (streamed). */
    const char *body = "{\"prompt\":\"Hi\",\"max_tokens\":480,\"ignore_eos\":true%s}";
    for (int stream = 0; stream < 2; stream++) {
        char b[256], raw[512];
        snprintf(b, sizeof(b), body, stream ? ",\"stream\":true" : "");
        snprintf(raw, sizeof(raw),
                 "POST /v1/completions HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
                 "x-infergate-timeout-ms: 30\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(b), b);
        ig_tc_t *tc = ig_tc_connect_unix(W.sock);
        assert_non_null(tc);
        assert_int_equal(ig_tc_sends(tc, raw), 0);
        ig_tc_response_t r;
        assert_int_equal(ig_tc_read_response(tc, &r, 20000), 0);
        if (!stream) {
            assert_int_equal(r.status, 504);
            assert_non_null(strstr(r.body, "deadline"));
        } else {
            assert_int_equal(r.status, 200);
            int done;
            json_t *ev = wt_sse_events(r.body, &done);
            assert_true(done);
            json_t *last = json_array_get(ev, json_array_size(ev) - 1);
            assert_non_null(json_object_get(last, "error"));
            json_decref(ev);
        }
        ig_tc_response_free(&r);
        ig_tc_close(tc);
    }
}

/* The worker's route table: GET rows answer HEAD, unknown paths 404 in the
 * OpenAI shape, a wrong method 405 with Allow from the table, and requests
 * are counted under the table's route, never the client's path. */
static void test_routes(void **state)
{
    ig_tc_response_t r;
    memset(&r, 0, sizeof(r));
    ig_tc_t *tc = ig_tc_connect_unix(W.sock);
    assert_non_null(tc);
    assert_int_equal(wt_send(tc, "HEAD", "/health", NULL), 0);
    assert_int_equal(ig_tc_read_response_ex(tc, &r, 5000, 1, 0), 0);
    ig_tc_close(tc);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 0);
    ig_tc_response_free(&r);

    assert_int_equal(wt_get(&W, "/v1/nothing", &r), 0);
    assert_int_equal(r.status, 404);
    json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
    json_t *e = json_object_get(j, "error");
    assert_string_equal(json_string_value(json_object_get(e, "type")), "not_found_error");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "/v1/nothing"));
    json_decref(j);
    ig_tc_response_free(&r);

    static const char *const cases[][3] = {{"GET", "/v1/completions", "POST"},
                                           {"PUT", "/v1/chat/completions", "POST"},
                                           {"POST", "/health", "GET, HEAD"},
                                           {"DELETE", "/load", "GET, HEAD"},
                                           {"POST", "/v1/models", "GET, HEAD"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(wt_request(&W, cases[i][0], cases[i][1], NULL, &r), 0);
        assert_int_equal(r.status, 405);
        assert_non_null(ig_tc_header(&r, "Allow"));
        assert_string_equal(ig_tc_header(&r, "Allow"), cases[i][2]);
        ig_tc_response_free(&r);
    }

    assert_int_equal(wt_get(&W, "/metrics", &r), 0);
    assert_non_null(
        strstr(r.body, "infergate_http_requests_total{route=\"/v1/completions\",status=\"405\"}"));
    assert_non_null(
        strstr(r.body, "infergate_http_requests_total{route=\"/health\",status=\"200\"}"));
    assert_non_null(strstr(r.body, "route=\"unmatched\",status=\"404\"}"));
    assert_null(strstr(r.body, "/v1/nothing"));
    ig_tc_response_free(&r);
}

static void test_metrics(void **state)
{
    ig_tc_response_t r;
    assert_int_equal(wt_get(&W, "/metrics", &r), 0);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "infergate_worker_generation_tokens_total"));
    assert_non_null(strstr(r.body, "infergate_worker_time_to_first_token_seconds_bucket"));
    assert_non_null(strstr(r.body, "infergate_worker_requests_running"));
    assert_non_null(strstr(r.body, "infergate_worker_batch_size_bucket"));
    ig_tc_response_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints),
        cmocka_unit_test(test_completion_plain_and_stream),
        cmocka_unit_test(test_token_ids_echo_logprobs),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_stop_strings),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_routes),
        cmocka_unit_test(test_metrics),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
