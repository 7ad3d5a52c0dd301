/*
 * The whole OpenAI API through the door: a site that records what it was
 * sent (tests/peers/recording_site.py, a python3 http.server peer) behind
 * a real `infergate serve`. For each request the test sends the body to
 * the gateway and the same body to the site directly, then checks that
 *  - the site received, through the gateway, exactly the client's JSON:
 *    every field with the same value, unknown vendor fields included, and
 *    nothing added (tools, tool_choice, response_format, user,
 *    parallel_tool_calls, n, best_of, suffix, logit_bias, a tool-call
 *    history, embeddings inputs, a Responses request);
 *  - the client got the site's answer unchanged, byte for byte (tool
 *    calls, n choices, vectors, the Response object), streamed too;
 *  - a key's token limit is the one edit: it caps max_tokens and leaves
 *    every other field as sent;
 *  - an upstream that answers 404 for an endpoint is not asked again and
 *    the request goes to one that serves it; when none does, 404
 *    endpoint_not_served; a local worker says so for /v1/embeddings;
 *  - a body of 10,000 unknown fields is forwarded intact within the body
 *    limit, and one past the limit or nested past the JSON depth limit is
 *    refused (413, 400) before anything is sent;
 *  - with a priced site, each answer's cost (hand-computed from the site's
 *    usage) in its header or after its stream, in the metric and /status;
 *    a key's budget refuses the request that finds it spent, and a reload
 *    with a new price keeps the spend.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "gwfixture.h"
#include "peers.h"
#include "testclient.h"

static ig_proc_t site;   /* serves every endpoint */
static ig_proc_t site_b; /* no embeddings, no responses */
static ig_proc_t gw;     /* site only */
static ig_proc_t gw_ab;  /* site_b first, then site */

static int start_gateway(ig_proc_t *g, const char *sites, const char *extra)
{
    int port = ig_proc_free_port();
    return ig_gwf_serve_config(g, port, "warn", 0, 10000, 15000,
                               "{\"region\":\"pt\",\"listen\":\"127.0.0.1:%d\","
                               "\"limits\":{\"drain_grace_ms\":0,\"max_body_bytes\":1048576},"
                               "\"routing\":{\"policy\":\"round_robin\"},"
                               "\"sites\":[%s]%s}",
                               port, sites, extra != NULL ? extra : "");
}

static int group_setup(void **state)
{
    (void)state;
    const char *const no[] = {"--no-embeddings", "--no-responses", NULL};
    if (ig_peer_start(&site, "recording_site.py", NULL, 10000) != 0 ||
        ig_peer_start(&site_b, "recording_site.py", no, 10000) != 0)
        return -1;
    char sites[512];
    snprintf(sites, sizeof(sites),
             "{\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}", site.port);
    if (start_gateway(&gw, sites, NULL) != 0)
        return -1;
    snprintf(sites, sizeof(sites),
             "{\"name\":\"b\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]},"
             "{\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}",
             site_b.port, site.port);
    return start_gateway(&gw_ab, sites, NULL);
}

static int group_teardown(void **state)
{
    (void)state;
    ig_proc_t *all[] = {&gw, &gw_ab, &site, &site_b};
    for (int i = 0; i < 4; i++) {
        ig_proc_stop(all[i], SIGTERM, 10000);
        ig_proc_dispose(all[i]);
    }
    return 0;
}

/* What a site recorded since the last call: a JSON list of {path, body}
 * (new reference), emptied as it is read. */
static json_t *recorded(const ig_proc_t *s)
{
    json_t *r = ig_gwf_get_json(s->port, "/_recorded?clear=1");
    assert_non_null(r);
    assert_true(json_is_array(r));
    return r;
}

/* POSTs body to path on port; returns the response (caller frees). */
static ig_tc_response_t post(int port, const char *path, const char *body)
{
    ig_tc_response_t r;
    assert_int_equal(ig_gwf_post(port, path, body, &r, 20000), 0);
    return r;
}

/* Sends body through the gateway and directly; checks that the site got
 * the client's JSON and that the client got the site's bytes. Returns the
 * gateway's answer (caller frees). */
static ig_tc_response_t through(const char *path, const char *body)
{
    json_decref(recorded(&site));
    ig_tc_response_t via = post(gw.port, path, body);
    json_t *rec = recorded(&site);
    ig_tc_response_t direct = post(site.port, path, body);
    json_decref(recorded(&site));
    print_message("%s -> %d %.300s\n", path, via.status, via.body ? via.body : "");
    assert_int_equal(via.status, 200);
    assert_int_equal(json_array_size(rec), 1);
    json_t *one = json_array_get(rec, 0);
    assert_string_equal(json_string_value(json_object_get(one, "path")), path);
    json_t *sent = json_loads(body, 0, NULL);
    json_t *got = json_loads(json_string_value(json_object_get(one, "body")), 0, NULL);
    assert_non_null(sent);
    assert_non_null(got);
    if (!json_equal(sent, got)) {
        char *g = json_dumps(got, JSON_COMPACT);
        print_message("sent %s\ngot  %s\n", body, g);
        free(g);
    }
    assert_true(json_equal(sent, got));
    /* nothing added: the same keys, no more */
    assert_int_equal(json_object_size(got), json_object_size(sent));
    /* The gateway's own words: the cost, after a stream or in a header
     * (the site is unpriced here) */
    static const char tail[] = ": x-infergate-cost: unknown\n\n";
    size_t tl = sizeof(tail) - 1;
    if (ig_tc_header(&via, "x-infergate-cost") == NULL) {
        assert_true(via.body_len >= tl);
        assert_memory_equal(via.body + via.body_len - tl, tail, tl);
        via.body_len -= tl;
        via.body[via.body_len] = '\0';
    } else {
        assert_string_equal(ig_tc_header(&via, "x-infergate-cost"), "unknown");
    }
    assert_int_equal(via.body_len, direct.body_len);
    assert_memory_equal(via.body, direct.body, direct.body_len);
    json_decref(sent);
    json_decref(got);
    json_decref(rec);
    ig_tc_response_free(&direct);
    return via;
}

static const char chat_all[] =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"weather?\"}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"description\":\"the weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
    "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\","
    "\"schema\":{\"type\":\"object\"},\"strict\":true}},"
    "\"user\":\"u-42\",\"parallel_tool_calls\":false,\"n\":2,\"seed\":7,"
    "\"logit_bias\":{\"50256\":-100},\"logprobs\":true,\"top_logprobs\":3,"
    "\"max_completion_tokens\":40,\"presence_penalty\":0.5,\"frequency_penalty\":0.25,"
    "\"stop\":[\"\\n\\n\",\"END\"],\"metadata\":{\"team\":\"a\"},\"store\":false,"
    "\"service_tier\":\"auto\",\"reasoning_effort\":\"low\",\"temperature\":0.7,"
    "\"top_p\":0.9,\"x_vendor_knob\":{\"deep\":[1,2.5,\"three\",null,true]}}";

static void test_chat_every_field(void **state)
{
    (void)state;
    ig_tc_response_t r = through("/v1/chat/completions", chat_all);
    json_t *o = json_loads(r.body, 0, NULL);
    json_t *choices = json_object_get(o, "choices");
    assert_int_equal(json_array_size(choices), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *c = json_array_get(choices, i);
        assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
        json_t *call = json_array_get(
            json_object_get(json_object_get(c, "message"), "tool_calls"), 0);
        assert_string_equal(
            json_string_value(json_object_get(json_object_get(call, "function"), "name")),
            "get_weather");
    }
    json_decref(o);
    ig_tc_response_free(&r);
}

static void test_chat_tool_history(void **state)
{
    (void)state;
    ig_tc_response_t r = through(
        "/v1/chat/completions",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18C, sunny\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}],"
        "\"tool_choice\":\"none\"}");
    assert_non_null(strstr(r.body, "choice 0 says hi"));
    ig_tc_response_free(&r);
}

static void test_completions_n_best_of_suffix_bias(void **state)
{
    (void)state;
    ig_tc_response_t r =
        through("/v1/completions",
                "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"],\"n\":3,\"best_of\":4,"
                "\"suffix\":\" the end\",\"logit_bias\":{\"7\":5,\"9\":-5},\"echo\":false,"
                "\"max_tokens\":5,\"logprobs\":2}");
    json_t *o = json_loads(r.body, 0, NULL);
    assert_int_equal(json_array_size(json_object_get(o, "choices")), 6);
    json_decref(o);
    ig_tc_response_free(&r);
}

static void test_embeddings_list(void **state)
{
    (void)state;
    ig_tc_response_t r = through("/v1/embeddings",
                                 "{\"model\":\"m\",\"input\":[\"one\",\"two\",\"three\"],"
                                 "\"encoding_format\":\"float\",\"dimensions\":4,\"user\":\"u\"}");
    json_t *o = json_loads(r.body, 0, NULL);
    json_t *data = json_object_get(o, "data");
    assert_int_equal(json_array_size(data), 3);
    assert_int_equal(json_array_size(json_object_get(json_array_get(data, 2), "embedding")), 4);
    json_decref(o);
    /* the route headers say who answered, as for completions */
    assert_non_null(ig_tc_header(&r, "x-infergate-upstream"));
    ig_tc_response_free(&r);
}

static void test_responses(void **state)
{
    (void)state;
    ig_tc_response_t r =
        through("/v1/responses", "{\"model\":\"m\",\"input\":[{\"role\":\"user\",\"content\":"
                                 "\"hi\"}],\"instructions\":\"be kind\",\"max_output_tokens\":"
                                 "20,\"reasoning\":{\"effort\":\"low\"},\"store\":false}");
    assert_non_null(strstr(r.body, "\"the site answers\""));
    ig_tc_response_free(&r);
}

/* Streams: the events reach the client as the site sent them. */
static void test_streams(void **state)
{
    (void)state;
    ig_tc_response_t r = through("/v1/chat/completions",
                                 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
                                 "\"x\"}],\"n\":2,\"stream\":true,\"stream_options\":"
                                 "{\"include_usage\":true},\"tools\":[{\"type\":\"function\","
                                 "\"function\":{\"name\":\"f\"}}]}");
    assert_non_null(strstr(r.body, "\"index\":1,\"delta\":{\"tool_calls\""));
    assert_non_null(strstr(r.body, "data: [DONE]"));
    ig_tc_response_free(&r);
    r = through("/v1/chat/completions",
                "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"n\":2,\"stream\":true}");
    assert_non_null(strstr(r.body, "\"index\":1,\"delta\":{\"content\":\"choice \"}"));
    ig_tc_response_free(&r);
    r = through("/v1/responses", "{\"model\":\"m\",\"input\":\"hi\",\"stream\":true}");
    assert_non_null(strstr(r.body, "event: response.completed"));
    ig_tc_response_free(&r);
}

/* POSTs body to path on port with "Authorization: Bearer key"; the
 * response (caller frees). */
static ig_tc_response_t post_key(int port, const char *key, const char *path, const char *body)
{
    char req[2048];
    snprintf(req, sizeof(req),
             "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
             path, key, strlen(body), body);
    ig_tc_response_t r;
    assert_int_equal(ig_tc_request(port, req, &r, 20000), 0);
    return r;
}

/* A key with a token limit smaller than max_tokens: the body's cap is
 * lowered, and every other field arrives as the client sent it. */
static void test_key_cap_is_the_only_edit(void **state)
{
    (void)state;
    ig_proc_t g;
    char sites[256];
    snprintf(sites, sizeof(sites),
             "{\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}", site.port);
    assert_int_equal(start_gateway(&g, sites,
                                   ",\"api_keys\":[{\"key\":\"k1\",\"name\":\"k1\","
                                   "\"tokens_per_min\":1000}]"),
                     0);
    json_decref(recorded(&site));
    const char *body = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":5000,"
                       "\"x_vendor\":[1,2],\"n\":2}";
    ig_tc_response_t r = post_key(g.port, "k1", "/v1/completions", body);
    print_message("capped: %d %s\n", r.status, r.body);
    assert_int_equal(r.status, 200);
    ig_tc_response_free(&r);
    json_t *rec = recorded(&site);
    assert_int_equal(json_array_size(rec), 1);
    json_t *got = json_loads(json_string_value(json_object_get(json_array_get(rec, 0), "body")),
                             0, NULL);
    long long cap = json_integer_value(json_object_get(got, "max_tokens"));
    print_message("max_tokens arrived as %lld\n", cap);
    assert_true(cap >= 1 && cap < 500); /* 1000 tokens for two answers and the prompt */
    json_object_del(got, "max_tokens");
    json_t *want = json_loads(body, 0, NULL);
    json_object_del(want, "max_tokens");
    assert_true(json_equal(got, want));
    json_decref(want);
    json_decref(got);
    json_decref(rec);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
}

/* site_b answers 404 for embeddings and responses: after it said so once,
 * every such request goes to the site that serves them. */
static void test_endpoint_learned(void **state)
{
    (void)state;
    for (int i = 0; i < 6; i++) {
        ig_tc_response_t r = post(gw_ab.port, i % 2 ? "/v1/responses" : "/v1/embeddings",
                                  i % 2 ? "{\"model\":\"m\",\"input\":\"hi\"}"
                                        : "{\"model\":\"m\",\"input\":\"hi\"}");
        assert_int_equal(r.status, 200);
        assert_string_equal(ig_tc_header(&r, "x-infergate-upstream"), "s");
        ig_tc_response_free(&r);
    }
    json_t *rec = recorded(&site_b);
    print_message("site_b was asked %zu times\n", json_array_size(rec));
    assert_true(json_array_size(rec) <= 2); /* once per endpoint at most */
    json_decref(rec);
    /* completions still go to both (round robin) */
    for (int i = 0; i < 4; i++) {
        ig_tc_response_t r = post(gw_ab.port, "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\"}");
        assert_int_equal(r.status, 200);
        ig_tc_response_free(&r);
    }
    rec = recorded(&site_b);
    assert_true(json_array_size(rec) >= 1);
    json_decref(rec);
    json_decref(recorded(&site));
}

/* Nobody serves the endpoint: 404 naming it, not a 502 or a hang. */
static void test_endpoint_nobody_serves(void **state)
{
    (void)state;
    ig_proc_t g;
    char sites[256];
    snprintf(sites, sizeof(sites),
             "{\"name\":\"b\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"]}", site_b.port);
    assert_int_equal(start_gateway(&g, sites, NULL), 0);
    for (int i = 0; i < 2; i++) {
        ig_tc_response_t r = post(g.port, "/v1/embeddings", "{\"model\":\"m\",\"input\":\"hi\"}");
        print_message("nobody: %d %s\n", r.status, r.body);
        assert_int_equal(r.status, 404);
        assert_non_null(strstr(r.body, "endpoint_not_served"));
        assert_non_null(strstr(r.body, "/v1/embeddings"));
        ig_tc_response_free(&r);
    }
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
    json_decref(recorded(&site_b));
}

static void test_bad_routed_bodies(void **state)
{
    (void)state;
    static const struct {
        const char *path, *body, *param;
    } cases[] = {
        {"/v1/embeddings", "{\"model\":\"m\"}", "input"},
        {"/v1/embeddings", "{\"model\":\"m\",\"input\":[\"a\",[1,2]]}", "input"},
        {"/v1/embeddings", "{\"model\":\"m\",\"input\":\"a\",\"encoding_format\":\"hex\"}",
         "encoding_format"},
        {"/v1/embeddings", "{\"input\":\"a\"}", "model"},
        {"/v1/responses", "{\"model\":\"m\",\"input\":\"a\",\"stream\":\"yes\"}", "stream"},
        {"/v1/responses", "{\"model\":\"m\",\"input\":\"a\",\"max_output_tokens\":0}",
         "max_output_tokens"},
        {"/v1/responses", "{\"model\":\"m\",\"input\":7}", "input"},
        {"/v1/chat/completions",
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", "n"},
        {"/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\",\"n\":3,\"best_of\":2}", "best_of"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ig_tc_response_t r = post(gw.port, cases[i].path, cases[i].body);
        print_message("%s %s -> %d %s\n", cases[i].path, cases[i].body, r.status, r.body);
        assert_int_equal(r.status, 400);
        char want[96];
        snprintf(want, sizeof(want), "\"param\":\"%s\"", cases[i].param);
        assert_non_null(strstr(r.body, want));
        ig_tc_response_free(&r);
    }
    json_t *rec = recorded(&site);
    assert_int_equal(json_array_size(rec), 0); /* none reached the site */
    json_decref(rec);
}

/* 10,000 unknown fields fit in the body limit and arrive intact; a body
 * past the limit is 413 and one nested past the parser's depth is 400,
 * and neither reaches the site. */
static void test_big_bodies_bounded(void **state)
{
    (void)state;
    size_t cap = 400000;
    char *b = malloc(cap);
    assert_non_null(b);
    size_t n = (size_t)snprintf(b, cap, "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":1");
    for (int i = 0; i < 10000; i++)
        n += (size_t)snprintf(b + n, cap - n, ",\"x%05d\":%d", i, i);
    n += (size_t)snprintf(b + n, cap - n, "}");
    ig_tc_response_t r = through("/v1/completions", b);
    ig_tc_response_free(&r);

    /* 1 MiB and more of nesting: past max_body_bytes (1 MiB here) */
    size_t big = (1u << 20) + 16;
    char *d = malloc(big * 2 + 64);
    assert_non_null(d);
    n = (size_t)sprintf(d, "{\"model\":\"m\",\"prompt\":\"hi\",\"x\":");
    for (size_t i = 0; i < big / 2; i++)
        d[n++] = '[';
    for (size_t i = 0; i < big / 2; i++)
        d[n++] = ']';
    d[n++] = '}';
    d[n] = '\0';
    r = post(gw.port, "/v1/completions", d);
    print_message("deep 1 MiB: %d\n", r.status);
    assert_int_equal(r.status, 413);
    ig_tc_response_free(&r);
    /* within the limit, nested past jansson's depth: a 400 naming the JSON */
    n = (size_t)sprintf(d, "{\"model\":\"m\",\"prompt\":\"hi\",\"x\":");
    for (int i = 0; i < 100000; i++)
        d[n++] = '[';
    for (int i = 0; i < 100000; i++)
        d[n++] = ']';
    d[n++] = '}';
    d[n] = '\0';
    r = post(gw.port, "/v1/completions", d);
    print_message("deep: %d %.200s\n", r.status, r.body);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.body, "invalid JSON body"));
    ig_tc_response_free(&r);
    json_t *rec = recorded(&site);
    assert_int_equal(json_array_size(rec), 0);
    json_decref(rec);
    free(d);
    free(b);
}

/* A site priced per token: the cost of each answer from its usage, in the
 * header of a whole answer and after a stream, summed in the metric, and
 * per 1M generated tokens in /status. */
static void test_cost_reported(void **state)
{
    (void)state;
    ig_proc_t g;
    char sites[256];
    snprintf(sites, sizeof(sites),
             "{\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],"
             "\"price\":{\"per_1m_input_tokens\":0.5,\"per_1m_output_tokens\":1.5}}",
             site.port);
    assert_int_equal(start_gateway(&g, sites, NULL), 0);
    /* usage 5 + 2 tokens: 5 x 0.5 + 2 x 1.5 = 5.5 micro-dollars */
    ig_tc_response_t r = post(g.port, "/v1/completions", "{\"model\":\"m\",\"prompt\":\"x\"}");
    assert_int_equal(r.status, 200);
    assert_string_equal(ig_tc_header(&r, "x-infergate-cost"), "5.5e-06");
    ig_tc_response_free(&r);
    /* a stream of n 2 with usage 7 + 6: 12.5 micro-dollars, after the stream */
    r = post(g.port, "/v1/chat/completions",
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
             "\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(r.status, 200);
    print_message("stream tail: %s\n", r.body + (r.body_len > 60 ? r.body_len - 60 : 0));
    assert_non_null(strstr(r.body, "data: [DONE]\n\n: x-infergate-cost: 1.25e-05\n\n"));
    ig_tc_response_free(&r);
    double total = ig_gwf_metric(
        g.port, "infergate_cost_usd_total{upstream=\"s\",model=\"m\",key=\"none\"} ");
    print_message("cost metric %.9g\n", total);
    assert_true(fabs(total - 18e-6) < 1e-12);
    json_t *st = ig_gwf_get_json(g.port, "/status");
    json_t *s0 = json_array_get(json_object_get(st, "sites"), 0);
    assert_string_equal(json_string_value(json_object_get(s0, "price")), "per_token");
    double per_1m = json_real_value(json_object_get(s0, "cost_per_1m_output_tokens"));
    print_message("per 1M %.9g\n", per_1m);
    assert_true(fabs(per_1m - 18e-6 / 8 * 1e6) < 1e-9); /* 8 tokens generated */
    assert_true(json_real_value(json_object_get(st, "spend_usd_per_hour")) > 0);
    json_decref(st);
    /* igbench sums the costs the gateway reports: 10 answers of 5.5 */
    char cmd[1024], out[256];
    snprintf(out, sizeof(out), "%s/igbench-cost.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(cmd, sizeof(cmd),
             "'%s' --quiet --target 127.0.0.1:%d --concurrency 2 --requests 10 --model m "
             "--json '%s' >/dev/null 2>&1",
             ig_proc_bin("igbench"), g.port, out);
    assert_int_equal(system(cmd), 0);
    json_t *ib = json_load_file(out, 0, NULL);
    assert_non_null(ib);
    print_message("igbench cost %.9g over %lld\n", json_real_value(json_object_get(ib, "cost_usd")),
                  (long long)json_integer_value(json_object_get(ib, "priced_answers")));
    assert_int_equal(json_integer_value(json_object_get(ib, "priced_answers")), 10);
    assert_true(fabs(json_real_value(json_object_get(ib, "cost_usd")) - 55e-6) < 1e-12);
    json_decref(ib);
    unlink(out);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
    json_decref(recorded(&site));
}

/* A key with a budget of 10 micro-dollars a day on that site: two answers
 * of 5.5 spend it, the third is 429 budget_exceeded until the day ends; a
 * reload that changes the price keeps what was spent, and answers cost the
 * new price at once. */
static void test_budget_and_reload(void **state)
{
    (void)state;
    static const char fmt[] =
        "{\"region\":\"pt\",\"listen\":\"127.0.0.1:%d\",\"limits\":{\"drain_grace_ms\":0},"
        "\"api_keys\":[{\"key\":\"k1\",\"name\":\"k1\",\"budget_usd\":0.00001,"
        "\"budget_period\":\"day\"},{\"key\":\"k2\",\"name\":\"k2\"}],"
        "\"sites\":[{\"name\":\"s\",\"url\":\"http://127.0.0.1:%d\",\"models\":[\"m\"],"
        "\"price\":{\"per_1m_input_tokens\":%s,\"per_1m_output_tokens\":1.5}}]}";
    char cfg[1024], body[] = "{\"model\":\"m\",\"prompt\":\"x\"}";
    int port = ig_proc_free_port();
    snprintf(cfg, sizeof(cfg), fmt, port, site.port, "0.5");
    const char *path = ig_proc_temp_file(cfg, ".json");
    assert_non_null(path);
    ig_proc_t g;
    assert_int_equal(ig_gwf_serve(&g, path, port, "warn", 0, 10000, 15000), 0);
    const char *keys[] = {"k1", "k1", "k1", "k2"};
    const int want[] = {200, 200, 429, 200};
    for (int i = 0; i < 4; i++) {
        ig_tc_response_t r = post_key(g.port, keys[i], "/v1/completions", body);
        print_message("%s: %d %s\n", keys[i], r.status, r.body);
        assert_int_equal(r.status, want[i]);
        if (r.status == 429) {
            assert_non_null(strstr(r.body, "budget_exceeded"));
            int ra = atoi(ig_tc_header(&r, "Retry-After"));
            assert_true(ra >= 1 && ra <= 86400); /* the day's end */
        }
        ig_tc_response_free(&r);
    }
    /* a reload with a new price: the spend stays, new answers cost more */
    snprintf(cfg, sizeof(cfg), fmt, port, site.port, "1.5");
    assert_int_equal(ig_tf_replace(path, cfg, strlen(cfg)), 0);
    kill(g.pid, SIGHUP);
    assert_int_equal(ig_gwf_wait_reloads(g.port, "applied", 1, 10000), 0);
    ig_tc_response_t r = post_key(g.port, "k1", "/v1/completions", body);
    assert_int_equal(r.status, 429); /* still spent */
    ig_tc_response_free(&r);
    r = post_key(g.port, "k2", "/v1/completions", body);
    assert_int_equal(r.status, 200);
    assert_string_equal(ig_tc_header(&r, "x-infergate-cost"), "1.05e-05"); /* 5 x 1.5 + 2 x 1.5 */
    ig_tc_response_free(&r);
    assert_int_equal(ig_proc_stop(&g, SIGTERM, 10000), 0);
    ig_proc_dispose(&g);
    json_decref(recorded(&site));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_every_field),
        cmocka_unit_test(test_chat_tool_history),
        cmocka_unit_test(test_completions_n_best_of_suffix_bias),
        cmocka_unit_test(test_embeddings_list),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_streams),
        cmocka_unit_test(test_key_cap_is_the_only_edit),
        cmocka_unit_test(test_endpoint_learned),
        cmocka_unit_test(test_endpoint_nobody_serves),
        cmocka_unit_test(test_bad_routed_bodies),
        cmocka_unit_test(test_big_bodies_bounded),
        cmocka_unit_test(test_cost_reported),
        cmocka_unit_test(test_budget_and_reload),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
