/* API: request parsing and validation, one table of bad bodies with the
 * param each must name, and the canonical round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/api.h"
#include "infergate/utf8.h"
#include "infergate/error.h"

#include <string.h>

static int parse(ig_api_kind_t kind, const char *body, ig_api_request_t *r, ig_api_error_t *e)
{
    return ig_api_parse(kind, body, strlen(body), r, e);
}

static void test_completion_defaults(void **state)
{
    ig_api_request_t r;
    ig_api_error_t e;
    assert_int_equal(
        parse(IG_API_COMPLETION, "{\"prompt\":\"hello\",\"extra_field\":[1,2]}", &r, &e), 0);
    assert_int_equal(r.nprompts, 1);
    assert_string_equal(r.prompts[0].text, "hello");
    assert_int_equal(r.max_tokens, 16);
    assert_int_equal(r.logprobs, -1);
    assert_true(r.sampling.temperature == 1.0f);
    assert_null(r.model);
    assert_false(r.stream);
    ig_api_request_dispose(&r);
}

static void test_completion_fields(void **state)
{
    ig_api_request_t r;
    ig_api_error_t e;
    const char *body =
        "{\"model\":\"tiny\",\"prompt\":[1,2,3],\"max_tokens\":5,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"repetition_penalty\":1.1,"
        "\"seed\":42,\"stop\":[\"\\n\",\"END\"],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"logprobs\":3,\"echo\":true,"
        "\"n\":1,\"ignore_eos\":true,\"user\":\"u-1\",\"stop_token_ids\":[7]}";
    assert_int_equal(parse(IG_API_COMPLETION, body, &r, &e), 0);
    assert_string_equal(r.model, "tiny");
    assert_int_equal(r.nprompts, 1);
    assert_null(r.prompts[0].text);
    assert_int_equal(r.prompts[0].nids, 3);
    assert_int_equal(r.prompts[0].ids[2], 3);
    assert_int_equal(r.max_tokens, 5);
    assert_true(r.sampling.temperature == 0.5f);
    assert_int_equal(r.sampling.top_k, 40);
    assert_true(r.has_seed);
    assert_int_equal(r.seed, 42);
    assert_int_equal(r.nstop, 2);
    assert_string_equal(r.stop[1], "END");
    assert_true(r.stream && r.include_usage && r.echo && r.ignore_eos);
    assert_int_equal(r.logprobs, 3);
    assert_int_equal(r.nstop_ids, 1);

    /* canonical JSON parses back to the same request */
    json_t *j = ig_api_request_to_json(&r);
    char *s = json_dumps(j, JSON_COMPACT);
    ig_api_request_t r2;
    assert_int_equal(parse(IG_API_COMPLETION, s, &r2, &e), 0);
    assert_int_equal(r2.prompts[0].nids, 3);
    assert_int_equal(r2.max_tokens, 5);
    assert_int_equal(r2.sampling.top_k, 40);
    assert_true(r2.sampling.top_p == r.sampling.top_p);
    assert_int_equal(r2.seed, 42);
    assert_int_equal(r2.nstop, 2);
    assert_int_equal(r2.logprobs, 3);
    assert_true(r2.echo && r2.include_usage && r2.ignore_eos);
    free(s);
    json_decref(j);
    ig_api_request_dispose(&r2);
    ig_api_request_dispose(&r);

    /* a list of strings and a list of token-id lists are batches */
    assert_int_equal(parse(IG_API_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", &r, &e), 0);
    assert_int_equal(r.nprompts, 2);
    assert_string_equal(r.prompts[1].text, "b");
    ig_api_request_dispose(&r);
    assert_int_equal(parse(IG_API_COMPLETION, "{\"prompt\":[[1],[2,3]]}", &r, &e), 0);
    assert_int_equal(r.nprompts, 2);
    assert_int_equal(r.prompts[1].nids, 2);
    ig_api_request_dispose(&r);
}

static void test_chat(void **state)
{
    ig_api_request_t r;
    ig_api_error_t e;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"be nice\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \"},"
        "{\"type\":\"text\",\"text\":\"there\"}]}],\"logprobs\":true,"
        "\"top_logprobs\":2,\"max_completion_tokens\":7,\"max_tokens\":99}";
    assert_int_equal(parse(IG_API_CHAT, body, &r, &e), 0);
    assert_int_equal(r.nmessages, 2);
    assert_string_equal(r.messages[1].role, "user");
    assert_string_equal(r.messages[1].content, "hi there");
    assert_int_equal(r.logprobs, 2);
    assert_int_equal(r.max_tokens, 7);
    ig_api_request_dispose(&r);
    assert_int_equal(
        parse(IG_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e), 0);
    assert_int_equal(r.max_tokens, 0); /* up to the context */
    assert_int_equal(r.logprobs, -1);
    ig_api_request_dispose(&r);
}

typedef struct {
    ig_api_kind_t kind;
    const char *body;
    const char *param; /* "" for none */
} bad_case_t;

static const bad_case_t bad_cases[] = {
    {IG_API_COMPLETION, "not json", ""},
    {IG_API_COMPLETION, "[1,2]", ""},
    {IG_API_COMPLETION, "{}", "prompt"},
    {IG_API_COMPLETION, "{\"prompt\":5}", "prompt"},
    {IG_API_COMPLETION, "{\"prompt\":[]}", "prompt"},
    {IG_API_COMPLETION, "{\"prompt\":[1,-2]}", "prompt"},
    {IG_API_COMPLETION, "{\"prompt\":[1,\"a\"]}", "prompt"},
    {IG_API_COMPLETION, "{\"prompt\":[\"a\",3]}", "prompt"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":-3}", "max_tokens"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", "max_tokens"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":1.5}", "max_tokens"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"temperature\":-1}", "temperature"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"temperature\":\"hot\"}", "temperature"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"top_p\":0}", "top_p"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"top_p\":1.5}", "top_p"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"top_k\":-5}", "top_k"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"min_p\":2}", "min_p"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"repetition_penalty\":0}", "repetition_penalty"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"seed\":\"x\"}", "seed"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"stop\":3}", "stop"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"\"]}", "stop"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"x\",1]}", "stop"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"stream\":\"yes\"}", "stream"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}",
     "stream_options"},
    {IG_API_COMPLETION,
     "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
     "stream_options.include_usage"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":21}", "logprobs"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":true}", "logprobs"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"echo\":1}", "echo"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"n\":0}", "n"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"n\":129}", "n"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"n\":\"2\"}", "n"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"n\":3,\"best_of\":2}", "best_of"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"best_of\":1000}", "best_of"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"suffix\":5}", "suffix"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"user\":{\"x\":1}}", "user"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":[1]}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":[[5]]}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":[[\"hi\",1]]}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":[[5,101]]}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":{\"-1\":1}}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":{\"5\":\"1\"}}", "logit_bias"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"response_format\":\"json\"}", "response_format"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"response_format\":{}}", "response_format"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"n\":2,\"best_of\":1}", "best_of"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"ignore_eos\":\"no\"}", "ignore_eos"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"model\":7}", "model"},
    {IG_API_COMPLETION, "{\"prompt\":\"a\",\"presence_penalty\":3}", "presence_penalty"},
    {IG_API_COMPLETION, "{\"prompt\":\"\\udc00\"}", ""},   /* lone surrogate */
    {IG_API_COMPLETION, "{\"prompt\":\"a\\u0000b\"}", ""}, /* NUL */
    {IG_API_CHAT, "{}", "messages"},
    {IG_API_CHAT, "{\"messages\":[]}", "messages"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages"},
    {IG_API_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     "messages"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}",
     "logprobs"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}",
     "top_logprobs"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":30}",
     "top_logprobs"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}",
     "max_completion_tokens"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", "tools"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[1]}", "tools"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}",
     "tools"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"\"}}]}",
     "tools"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
     "tools"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"maybe\"}",
     "tool_choice"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}",
     "tool_choice"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
     "\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{"
     "\"name\":\"g\"}}}",
     "tool_choice"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"parallel_tool_calls\":\"yes\"}",
     "parallel_tool_calls"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}",
     "messages"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\"}]}]}",
     "messages"},
    {IG_API_CHAT,
     "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"f\","
     "\"arguments\":5}}]}]}",
     "messages"},
    {IG_API_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"1\",\"tool_call_id\":7}]}",
     "messages"},
};

static void test_bad_requests(void **state)
{
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        ig_api_request_t r;
        ig_api_error_t e;
        memset(&e, 0, sizeof(e));
        int rc = parse(bad_cases[i].kind, bad_cases[i].body, &r, &e);
        if (rc != IG_EINVAL || e.status != 400 || strcmp(e.param, bad_cases[i].param) != 0)
            fail_msg("case %zu %s: rc %d status %d param '%s' (%s)", i, bad_cases[i].body, rc,
                     e.status, e.param, e.message);
        assert_string_equal(e.type, "invalid_request_error");
        assert_true(strlen(e.message) > 0);
    }
}

static void test_invalid_utf8_raw(void **state)
{
    /* Raw invalid bytes in the body (not escapes) are refused too. */
    ig_api_request_t r;
    ig_api_error_t e;
    const char body[] = "{\"prompt\":\"a\xff\xfe\"}";
    assert_int_equal(ig_api_parse_completion(body, sizeof(body) - 1, &r, &e), IG_EINVAL);
    assert_int_equal(e.status, 400);
    assert_true(ig_utf8_valid("h\xc3\xa9llo", 6));
    assert_false(ig_utf8_valid("\xc3", 1));
    assert_false(ig_utf8_valid("\xed\xa0\x80", 3)); /* surrogate */
    assert_false(ig_utf8_valid("\xc0\xaf", 2));     /* overlong */
    assert_true(ig_utf8_valid("\xf0\x9f\x98\x80", 4));
}

static void test_context_check(void **state)
{
    ig_api_request_t r;
    ig_api_error_t e;
    assert_int_equal(parse(IG_API_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":100}", &r, &e), 0);
    assert_int_equal(ig_api_check_context(&r, 10, 128, &e), 0);
    assert_int_equal(ig_api_check_context(&r, 50, 128, &e), IG_ETOOLONG);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "prompt");
    assert_string_equal(e.code, "context_length_exceeded");
    assert_non_null(strstr(e.message, "128"));
    assert_non_null(strstr(e.message, "150"));
    assert_non_null(strstr(e.message, "50 in the prompt"));
    ig_api_request_dispose(&r);
}

/* The fields a gateway forwards and a worker honours or refuses are parsed
 * and recorded, not refused here. */
static void test_recorded_fields(void **state)
{
    ig_api_request_t r;
    ig_api_error_t e;
    const char *body =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"the weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"}}}}},{\"type\":\"code_interpreter\"}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
        "\"parallel_tool_calls\":false,\"n\":3,\"logit_bias\":{\"17\":-100,\"42\":5.5},"
        "\"response_format\":{\"type\":\"json_object\"},\"user\":\"u\","
        "\"max_completion_tokens\":9,\"vendor_x\":{\"deep\":[1]}}";
    assert_int_equal(parse(IG_API_CHAT, body, &r, &e), 0);
    assert_int_equal(r.n, 3);
    assert_int_equal(r.best_of, 3); /* n when not given */
    assert_int_equal(r.max_tokens, 9);
    assert_true(r.max_tokens_given);
    assert_int_equal(r.nmessages, 4);
    assert_int_equal(r.messages[2].ntool_calls, 1);
    assert_string_equal(r.messages[2].content, "");
    assert_string_equal(r.messages[2].tool_calls[0].id, "call_1");
    assert_string_equal(r.messages[2].tool_calls[0].name, "get_weather");
    assert_string_equal(r.messages[2].tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_string_equal(r.messages[3].tool_call_id, "call_1");
    assert_int_equal(r.ntools, 2);
    assert_string_equal(r.tools[0].name, "get_weather");
    assert_string_equal(r.tools[0].description, "the weather");
    assert_string_equal(r.tools[0].parameters,
                        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}");
    assert_string_equal(r.tools[1].type, "code_interpreter");
    assert_null(r.tools[1].name);
    assert_int_equal(r.tool_choice, IG_API_TOOL_CHOICE_FUNCTION);
    assert_string_equal(r.tool_choice_name, "get_weather");
    assert_int_equal(r.parallel_tool_calls, 0);
    assert_int_equal(r.sampling.nlogit_bias, 2);
    int saw17 = 0, saw42 = 0;
    for (int i = 0; i < 2; i++) {
        saw17 |= r.sampling.logit_bias[i].token == 17 && r.sampling.logit_bias[i].bias == -100.0f;
        saw42 |= r.sampling.logit_bias[i].token == 42 && r.sampling.logit_bias[i].bias == 5.5f;
    }
    assert_true(saw17 && saw42);
    assert_string_equal(r.response_format, "json_object");
    assert_string_equal(r.user, "u");
    ig_api_request_dispose(&r);

    assert_int_equal(parse(IG_API_COMPLETION,
                           "{\"prompt\":\"a\",\"n\":2,\"best_of\":4,\"suffix\":\"end\"}", &r, &e),
                     0);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.best_of, 4);
    json_t *canon = ig_api_request_to_json(&r);
    assert_int_equal(json_integer_value(json_object_get(canon, "n")), 2);
    assert_int_equal(json_integer_value(json_object_get(canon, "best_of")), 4);
    json_decref(canon);
    assert_string_equal(r.suffix, "end");
    assert_int_equal(r.parallel_tool_calls, -1);
    assert_int_equal(r.tool_choice, IG_API_TOOL_CHOICE_AUTO);
    assert_false(r.max_tokens_given);
    ig_api_request_dispose(&r);

    /* llama.cpp's list of [token id, bias] pairs reads the same */
    assert_int_equal(
        parse(IG_API_COMPLETION, "{\"prompt\":\"a\",\"logit_bias\":[[17,-100],[42,5.5]]}", &r, &e),
        0);
    assert_int_equal(r.sampling.nlogit_bias, 2);
    assert_int_equal(r.sampling.logit_bias[0].token, 17);
    assert_true(r.sampling.logit_bias[1].bias == 5.5f);
    ig_api_request_dispose(&r);

    /* the bounds are named in the error */
    char big[16384];
    size_t off = (size_t)snprintf(big, sizeof(big), "{\"prompt\":\"a\",\"logit_bias\":{");
    for (int i = 0; i <= IG_API_MAX_LOGIT_BIAS; i++)
        off += (size_t)snprintf(big + off, sizeof(big) - off, "%s\"%d\":1", i ? "," : "", i);
    snprintf(big + off, sizeof(big) - off, "}}");
    assert_int_equal(parse(IG_API_COMPLETION, big, &r, &e), IG_EINVAL);
    assert_string_equal(e.param, "logit_bias");
    assert_non_null(strstr(e.message, "at most 300"));
    off = (size_t)snprintf(big, sizeof(big),
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[");
    for (int i = 0; i <= IG_API_MAX_TOOLS; i++)
        off += (size_t)snprintf(big + off, sizeof(big) - off, "%s{\"type\":\"x\"}", i ? "," : "");
    snprintf(big + off, sizeof(big) - off, "]}");
    assert_int_equal(parse(IG_API_CHAT, big, &r, &e), IG_EINVAL);
    assert_string_equal(e.param, "tools");
    assert_non_null(strstr(e.message, "at most 128"));
    assert_int_equal(parse(IG_API_COMPLETION, "{\"prompt\":\"a\",\"n\":1000}", &r, &e), IG_EINVAL);
    assert_non_null(strstr(e.message, "128"));
}

/* ig_api_peek: what the gateway reads, as ig_api_parse reads it; the rest
 * left to the site. */
static void test_peek(void **state)
{
    (void)state;
    static const struct {
        ig_api_kind_t kind;
        const char *body;
        int rc;          /* 0, 1 (a list prompt) or IG_EINVAL */
        const char *why; /* in the 400's message */
    } cases[] = {
        {IG_API_COMPLETION,
         "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":7,\"n\":2,"
         "\"best_of\":3,\"stream\":true,\"temperature\":\"hot\"}",
         0, NULL},
        {IG_API_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,2,3]}", 1, NULL},
        {IG_API_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", 1, NULL},
        {IG_API_COMPLETION, "{\"model\":\"m\"}", IG_EINVAL, "'prompt' is required"},
        {IG_API_COMPLETION, "{\"model\":\"m\",\"prompt\":null}", IG_EINVAL, "required"},
        {IG_API_COMPLETION, "{\"model\":\"m\",\"prompt\":5}", IG_EINVAL, "must be a string"},
        {IG_API_COMPLETION, "{\"model\":5,\"prompt\":\"x\"}", IG_EINVAL, "'model' must be"},
        {IG_API_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":0}", IG_EINVAL, "at least 1"},
        {IG_API_COMPLETION, "{\"prompt\":\"x\",\"n\":3,\"best_of\":2}", IG_EINVAL, "best_of"},
        {IG_API_COMPLETION, "{\"prompt\":\"x\",\"stream\":\"yes\"}", IG_EINVAL, "stream"},
        {IG_API_COMPLETION, "{\"prompt\":\"x\",\"model\":\"a\",\"model\":\"b\"}", IG_EINVAL,
         "duplicate"},
        {IG_API_COMPLETION, "{\"prompt\":\"x\",", IG_EINVAL, "invalid JSON body"},
        {IG_API_COMPLETION, "[1]", IG_EINVAL, "must be a JSON object"},
        {IG_API_CHAT,
         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"max_completion_tokens\":9,\"max_tokens\":4}",
         0, NULL},
        {IG_API_CHAT, "{\"model\":\"m\",\"messages\":[ ]}", IG_EINVAL, "non-empty list"},
        {IG_API_CHAT, "{\"model\":\"m\",\"messages\":{}}", IG_EINVAL, "non-empty list"},
        {IG_API_CHAT, "{\"model\":\"m\"}", IG_EINVAL, "'messages' is required"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ig_api_request_t r;
        ig_api_error_t e;
        size_t bytes;
        int rc = ig_api_peek(cases[i].kind, cases[i].body, strlen(cases[i].body), &r, &bytes, &e);
        if (rc != cases[i].rc)
            print_message("case %zu: %d, want %d\n", i, rc, cases[i].rc);
        assert_int_equal(rc, cases[i].rc);
        if (rc < 0) {
            assert_int_equal(e.status, 400);
            assert_non_null(strstr(e.message, cases[i].why));
            continue;
        }
        ig_api_request_dispose(&r);
    }
    /* the fields it reads, as the whole parse reads them */
    ig_api_request_t r;
    ig_api_error_t e;
    size_t bytes;
    assert_int_equal(
        ig_api_peek(IG_API_COMPLETION, cases[0].body, strlen(cases[0].body), &r, &bytes, &e), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.max_tokens, 7);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.best_of, 3);
    assert_true(r.stream);
    assert_int_equal(bytes, 4); /* "hi" */
    ig_api_request_dispose(&r);
    assert_int_equal(
        ig_api_peek(IG_API_CHAT, cases[13].body, strlen(cases[13].body), &r, &bytes, &e), 0);
    assert_int_equal(r.max_tokens, 9);
    assert_int_equal(bytes, strlen("[{\"role\":\"user\",\"content\":\"x\"}]"));
    ig_api_request_dispose(&r);
}

/* The peek's admission fields equal the whole parse's, or both refuse with
 * the same status and param: for plain values (read without a parse) and
 * for every kind the peek hands to the parse (escapes, null, reals, out of
 * range, too many digits). */
static void test_peek_matches_parse(void **state)
{
    (void)state;
    static const char *const model[] = {"",
                                        "\"model\":\"m\",",
                                        "\"model\":\"\",",
                                        "\"model\":\"a\\u00e9b\",",
                                        "\"model\":null,",
                                        "\"model\":7,"};
    static const char *const number[] = {
        "1",
        "16",
        "0",
        "-3",
        "2.0",
        "null",
        "\"5\"",
        "128",
        "129",
        "1099511627776",
        "1099511627777",
        "123456789012345678",
        "1234567890123456789",
        "1e2",
        "-0",
    };
    static const char *const stream[] = {"", "\"stream\":true,", "\"stream\":false,",
                                         "\"stream\":null,", "\"stream\":1,"};
    static const char *const field[] = {"max_tokens", "max_completion_tokens", "n", "best_of"};
    char body[256];
    int cases = 0;
    for (int kind = 0; kind < 2; kind++) {
        ig_api_kind_t k = kind ? IG_API_CHAT : IG_API_COMPLETION;
        const char *prompt =
            kind ? "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]" : "\"prompt\":\"x\"";
        for (size_t m = 0; m < sizeof(model) / sizeof(model[0]); m++)
            for (size_t f = 0; f < 4; f++)
                for (size_t v = 0; v < sizeof(number) / sizeof(number[0]); v++)
                    for (size_t st = 0; st < sizeof(stream) / sizeof(stream[0]); st++) {
                        /* best_of beside n 2, so that both orders are seen */
                        snprintf(body, sizeof(body), "{%s%s\"%s\":%s,%s%s}", model[m], stream[st],
                                 field[f], number[v], f == 3 ? "\"n\":2," : "", prompt);
                        ig_api_request_t a, b;
                        ig_api_error_t ea, eb;
                        size_t bytes;
                        int ra = ig_api_peek(k, body, strlen(body), &a, &bytes, &ea);
                        int rb = ig_api_parse(k, body, strlen(body), &b, &eb);
                        if ((ra < 0) != (rb < 0))
                            print_message("%s: peek %d, parse %d\n", body, ra, rb);
                        assert_int_equal(ra < 0, rb < 0);
                        cases++;
                        if (ra < 0) {
                            assert_int_equal(ea.status, eb.status);
                            assert_string_equal(ea.param, eb.param);
                            continue;
                        }
                        assert_true((a.model == NULL) == (b.model == NULL));
                        if (a.model != NULL)
                            assert_string_equal(a.model, b.model);
                        assert_int_equal(a.max_tokens, b.max_tokens);
                        assert_int_equal(a.max_tokens_given, b.max_tokens_given);
                        assert_int_equal(a.n, b.n);
                        assert_int_equal(a.best_of, b.best_of);
                        assert_int_equal(a.stream, b.stream);
                        ig_api_request_dispose(&a);
                        ig_api_request_dispose(&b);
                    }
    }
    assert_int_equal(cases, 2 * 6 * 4 * 15 * 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completion_defaults),
        cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_recorded_fields),
        cmocka_unit_test(test_invalid_utf8_raw),
        cmocka_unit_test(test_context_check),
        cmocka_unit_test(test_peek),
        cmocka_unit_test(test_peek_matches_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
