/*
 * Chat tool conventions: detection from the template's source, tools and
 * tool-call history rendered the way Qwen2.5 (Hermes) and Llama 3.1 write
 * them, the client's text left unmarked, forced calls, refusals where the
 * convention cannot say it, and the model's text read back into calls
 * (whole and as a stream's safe prefix).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/chat.h"
#include "infergate/error.h"

#include <stdlib.h>
#include <string.h>

#define MSG(r, c)                                                                                  \
    {                                                                                              \
        .role = r, .content = c, .content_len = sizeof(c) - 1                                      \
    }

static const ig_chat_tool_t TOOLS[] = {
    {.name = "get_weather",
     .description = "Weather of a city",
     .parameters = "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}"},
    {.name = "now", .description = NULL, .parameters = NULL},
};
static const char *const NAMES[] = {"get_weather", "now"};

static char *render(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n,
                    const ig_chat_tools_opts_t *t, ig_tokspan_t **marks, size_t *nmarks)
{
    char *out, err[256];
    size_t len;
    int rc = ig_chat_render_tools(style, m, n, t, "<BOS>", "<EOS>", 1, &out, &len, marks, nmarks,
                                  err, sizeof(err));
    if (rc != 0)
        fail_msg("render: %d %s", rc, err);
    assert_int_equal(strlen(out), len);
    return out;
}

/* 1 when [off, off + len) lies inside no mark: the client's text. */
static int unmarked(const ig_tokspan_t *marks, size_t n, size_t off, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (marks[i].off < off + len && off < marks[i].off + marks[i].len)
            return 0;
    return 1;
}

static void test_detect(void **state)
{
    (void)state;
    assert_int_equal(ig_chat_detect_tools(IG_CHAT_CHATML, "<|im_start|>{{ m }}<|im_end|>"),
                     IG_CHAT_TOOLS_NONE);
    assert_int_equal(ig_chat_detect_tools(IG_CHAT_CHATML, "<|im_start|>{% if tools %}<tool_call>"),
                     IG_CHAT_TOOLS_HERMES);
    assert_int_equal(ig_chat_detect_tools(IG_CHAT_LLAMA3, "<|start_header_id|>{{ m }}"),
                     IG_CHAT_TOOLS_NONE);
    assert_int_equal(
        ig_chat_detect_tools(IG_CHAT_LLAMA3, "<|start_header_id|>Environment: ipython{{ tools }}"),
        IG_CHAT_TOOLS_LLAMA3);
    assert_int_equal(ig_chat_detect_tools(IG_CHAT_LLAMA2, "[INST] tools <tool_call>"),
                     IG_CHAT_TOOLS_NONE);
    assert_int_equal(ig_chat_detect_tools(IG_CHAT_CHATML, NULL), IG_CHAT_TOOLS_NONE);
    assert_string_equal(ig_chat_tools_name(IG_CHAT_TOOLS_HERMES), "hermes");
    assert_string_equal(ig_chat_tools_name(IG_CHAT_TOOLS_LLAMA3), "llama3_json");
    assert_string_equal(ig_chat_tools_name(IG_CHAT_TOOLS_NONE), "none");
}

static void test_hermes_render(void **state)
{
    (void)state;
    const ig_chat_call_t calls[] = {{"call_1", "get_weather", "{\"city\": \"Paris\"}"},
                                    {"call_2", "now", "{}"}};
    ig_chat_msg_t m[] = {MSG("system", "Be brief."), MSG("user", "Weather in Paris?"),
                         MSG("assistant", ""),       MSG("tool", "sunny"),
                         MSG("tool", "12:00"),       MSG("user", "Thanks")};
    m[2].tool_calls = calls;
    m[2].ntool_calls = 2;
    m[3].tool_call_id = "call_1";
    m[4].tool_call_id = "call_2";
    ig_chat_tools_opts_t t = {.convention = IG_CHAT_TOOLS_HERMES, .tools = TOOLS, .ntools = 2};
    ig_tokspan_t *marks;
    size_t nmarks;
    char *s = render(IG_CHAT_CHATML, m, 6, &t, &marks, &nmarks);
    const char *want =
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within "
        "<tools></tools> XML tags:\n<tools>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
        "\"Weather of a city\", \"parameters\": {\"type\": \"object\", \"properties\": "
        "{\"city\": {\"type\": \"string\"}}}}}\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": "
        "{}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n12:00\n"
        "</tool_response><|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n";
    assert_string_equal(s, want);
    /* the tool definitions and the call arguments are the client's text:
     * never marked, so no special token can be smuggled through them */
    const char *def = strstr(s, "{\"type\": \"function\"");
    assert_true(unmarked(marks, nmarks, (size_t)(def - s), strlen("{\"type\": \"function\"")));
    const char *args = strstr(s, "{\"city\": \"Paris\"}}");
    assert_true(unmarked(marks, nmarks, (size_t)(args - s), 17));
    const char *tag = strstr(s, "<tool_call>\n{\"name\": \"get");
    assert_false(unmarked(marks, nmarks, (size_t)(tag - s), 11));
    free(s);
    free(marks);

    /* tools without a system message: the tools' system turn comes first;
     * a forced call ends the prompt with its start */
    ig_chat_msg_t u[] = {MSG("user", "hi")};
    t.force = "now";
    s = render(IG_CHAT_CHATML, u, 1, &t, NULL, NULL);
    assert_true(strncmp(s, "<|im_start|>system\n# Tools\n", 27) == 0);
    const char *tail = "<|im_start|>assistant\n<tool_call>\n{\"name\": \"now\"";
    assert_string_equal(s + strlen(s) - strlen(tail), tail);
    char pre[128];
    size_t n = ig_chat_tools_forced_prefix(IG_CHAT_TOOLS_HERMES, "now", pre, sizeof(pre));
    assert_int_equal(n, strlen("<tool_call>\n{\"name\": \"now\""));
    assert_string_equal(pre, "<tool_call>\n{\"name\": \"now\"");
    assert_int_equal(ig_chat_tools_forced_prefix(IG_CHAT_TOOLS_HERMES, "", pre, sizeof(pre)),
                     strlen("<tool_call>\n"));
    assert_int_equal(ig_chat_tools_forced_prefix(IG_CHAT_TOOLS_HERMES, NULL, pre, sizeof(pre)), 0);
    free(s);

    /* tool_choice none: the same text as no tools at all */
    char *plain = render(IG_CHAT_CHATML, u, 1, NULL, NULL, NULL);
    ig_chat_tools_opts_t none = {.convention = IG_CHAT_TOOLS_HERMES};
    s = render(IG_CHAT_CHATML, u, 1, &none, NULL, NULL);
    assert_string_equal(s, plain);
    free(s);
    free(plain);
}

static void test_llama3_render(void **state)
{
    (void)state;
    const ig_chat_call_t call = {"call_1", "get_weather", "{\"city\": \"Paris\"}"};
    ig_chat_msg_t m[] = {MSG("system", "Be brief."), MSG("user", " Weather? "),
                         MSG("assistant", ""), MSG("tool", "{\"t\": 21}")};
    m[2].tool_calls = &call;
    m[2].ntool_calls = 1;
    ig_chat_tools_opts_t t = {.convention = IG_CHAT_TOOLS_LLAMA3, .tools = TOOLS, .ntools = 1};
    char *s = render(IG_CHAT_LLAMA3, m, 4, &t, NULL, NULL);
    const char *want =
        "<BOS><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
        "respond with a JSON for a function call with its proper arguments that best answers "
        "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.Do not use variables.\n\n"
        "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": "
        "\"get_weather\",\n        \"description\": \"Weather of a city\",\n        "
        "\"parameters\": {\n            \"type\": \"object\",\n            \"properties\": {\n"
        "                \"city\": {\n                    \"type\": \"string\"\n"
        "                }\n            }\n        }\n    }\n}\n\nWeather?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
        "\"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n{\"t\": 21}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_string_equal(s, want);
    free(s);
    t.force = "";
    s = render(IG_CHAT_LLAMA3, m, 2, &t, NULL, NULL);
    const char *tail = "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"";
    assert_string_equal(s + strlen(s) - strlen(tail), tail);
    free(s);
}

static void test_refusals(void **state)
{
    (void)state;
    char *out = (char *)1, err[256];
    size_t len;
    const ig_chat_call_t calls[] = {{"a", "now", "{}"}, {"b", "now", "{}"}};
    ig_chat_msg_t m[] = {MSG("user", "hi"), MSG("assistant", "")};
    m[1].tool_calls = calls;
    m[1].ntool_calls = 1;
    /* no convention: tools, and calls in the history, cannot be written */
    ig_chat_tools_opts_t t = {.convention = IG_CHAT_TOOLS_NONE, .tools = TOOLS, .ntools = 1};
    err[0] = 0;
    assert_int_equal(ig_chat_render_tools(IG_CHAT_CHATML, m, 1, &t, NULL, NULL, 1, &out, &len, NULL,
                                          NULL, err, sizeof(err)),
                     IG_EINVAL);
    assert_null(out);
    assert_non_null(strstr(err, "tools"));
    assert_int_equal(ig_chat_render_tools(IG_CHAT_CHATML, m, 2, NULL, NULL, NULL, 1, &out, &len,
                                          NULL, NULL, err, sizeof(err)),
                     IG_EINVAL);
    assert_non_null(strstr(err, "messages[1].tool_calls"));
    /* Llama 3: one call per turn, and the tools need a first user turn */
    m[1].ntool_calls = 2;
    t.convention = IG_CHAT_TOOLS_LLAMA3;
    assert_int_equal(ig_chat_render_tools(IG_CHAT_LLAMA3, m, 2, &t, NULL, NULL, 1, &out, &len, NULL,
                                          NULL, err, sizeof(err)),
                     IG_EINVAL);
    assert_non_null(strstr(err, "one tool call"));
    ig_chat_msg_t sys[] = {MSG("system", "s")};
    assert_int_equal(ig_chat_render_tools(IG_CHAT_LLAMA3, sys, 1, &t, NULL, NULL, 1, &out, &len,
                                          NULL, NULL, err, sizeof(err)),
                     IG_EINVAL);
    assert_non_null(strstr(err, "first user message"));
}

typedef struct {
    ig_chat_tools_t conv;
    const char *text;
    int ncalls;
    size_t content_len;
    const char *name0, *args0, *args1;
} parse_case_t;

static void test_parse(void **state)
{
    (void)state;
    const parse_case_t cases[] = {
        {IG_CHAT_TOOLS_HERMES,
         "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
         "\"Paris\"}}\n</tool_call>",
         1, 12, "get_weather", "{\"city\":\"Paris\"}", NULL},
        {IG_CHAT_TOOLS_HERMES,
         "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>"
         "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}"
         "</tool_call>\n",
         2, 0, "now", "{}", "{\"city\": \"Oslo\"}"},
        /* unterminated, but whole JSON (a stop string or max_tokens ended it) */
        {IG_CHAT_TOOLS_HERMES, "<tool_call>\n{\"name\": \"now\"}", 1, 0, "now", "{}", NULL},
        /* not calls: unknown name, broken JSON, text between calls, no tag */
        {IG_CHAT_TOOLS_HERMES, "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", 0,
         0, NULL, NULL, NULL},
        {IG_CHAT_TOOLS_HERMES, "<tool_call>{\"name\": \"now\", \"argu", 0, 0, NULL, NULL, NULL},
        {IG_CHAT_TOOLS_HERMES,
         "<tool_call>{\"name\": \"now\"}</tool_call> and <tool_call>{\"name\": \"now\"}"
         "</tool_call>",
         0, 0, NULL, NULL, NULL},
        {IG_CHAT_TOOLS_HERMES, "{\"name\": \"now\"}", 0, 0, NULL, NULL, NULL},
        {IG_CHAT_TOOLS_LLAMA3,
         " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 1, 0, "get_weather",
         "{\"city\":\"Paris\"}", NULL},
        {IG_CHAT_TOOLS_LLAMA3, "{\"name\": \"now\", \"arguments\": {\"tz\": 1}}", 1, 0, "now",
         "{\"tz\":1}", NULL},
        {IG_CHAT_TOOLS_LLAMA3, "It is {\"name\": \"now\"}", 0, 0, NULL, NULL, NULL},
        {IG_CHAT_TOOLS_LLAMA3, "{\"name\": \"now\"} trailing", 0, 0, NULL, NULL, NULL},
        {IG_CHAT_TOOLS_LLAMA3, "{\"name\": \"now\", \"parameters\": [1]}", 0, 0, NULL, NULL, NULL},
        {IG_CHAT_TOOLS_NONE, "<tool_call>{\"name\": \"now\"}</tool_call>", 0, 0, NULL, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const parse_case_t *c = &cases[i];
        ig_chat_parsed_call_t *calls = NULL;
        size_t n = 99, content = 0, len = strlen(c->text);
        assert_int_equal(
            ig_chat_parse_tool_calls(c->conv, c->text, len, NAMES, 2, &calls, &n, &content), 0);
        if ((int)n != c->ncalls)
            fail_msg("case %zu: %zu calls, want %d", i, n, c->ncalls);
        if (n == 0) {
            assert_null(calls);
            assert_int_equal(content, len);
            continue;
        }
        assert_int_equal(content, c->content_len);
        assert_string_equal(calls[0].name, c->name0);
        assert_string_equal(calls[0].arguments, c->args0);
        if (c->args1)
            assert_string_equal(calls[1].arguments, c->args1);
        ig_chat_parsed_calls_free(calls, n);
    }
}

static void test_stream_prefix(void **state)
{
    (void)state;
    int in = 9;
    const char *t = "Sure <tool_";
    assert_int_equal(ig_chat_tools_content_prefix(IG_CHAT_TOOLS_HERMES, t, strlen(t), &in), 5);
    assert_int_equal(in, 0);
    t = "Sure <b>";
    assert_int_equal(ig_chat_tools_content_prefix(IG_CHAT_TOOLS_HERMES, t, strlen(t), &in), 8);
    t = "Sure <tool_call>\n{\"na";
    assert_int_equal(ig_chat_tools_content_prefix(IG_CHAT_TOOLS_HERMES, t, strlen(t), &in), 5);
    assert_int_equal(in, 1);
    t = " \n";
    assert_int_equal(ig_chat_tools_content_prefix(IG_CHAT_TOOLS_LLAMA3, t, strlen(t), &in), 0);
    assert_int_equal(in, 0);
    t = " {\"name";
    assert_int_equal(ig_chat_tools_content_prefix(IG_CHAT_TOOLS_LLAMA3, t, strlen(t), &in), 0);
    assert_int_equal(in, 1);
    t = "Hello {";
    assert_int_equal(ig_chat_tools_content_prefix(IG_CHAT_TOOLS_LLAMA3, t, strlen(t), &in), 7);
    assert_int_equal(in, 0);
}

/* The calls of a growing answer: names once whole and declared, arguments
 * as far as they have come, the next call once the one before is closed. */
static void test_stream_scan(void **state)
{
    (void)state;
    const char *full = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Pa}ris\\\"\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\"}"
                       "</tool_call>";
    ig_chat_call_span_t sp[4];
    size_t len = strlen(full), n, last_args = 0;
    int saw_two = 0;
    const char *args = strstr(full, "{\"city");
    for (size_t cut = 0; cut <= len; cut++) {
        n = ig_chat_tools_scan(IG_CHAT_TOOLS_HERMES, full, cut, NAMES, 2, sp, 4);
        const char *name_end = strstr(full, "get_weather\"") + 12;
        assert_int_equal(n > 0, cut >= (size_t)(name_end - full));
        if (n == 0)
            continue;
        assert_int_equal(sp[0].name_len, 11);
        assert_memory_equal(full + sp[0].name_off, "get_weather", 11);
        if (sp[0].args_len) {
            /* the arguments so far: a prefix of the whole, never shrinking,
             * never past the value (the quoted brace is inside it) */
            assert_int_equal(sp[0].args_off, (size_t)(args - full));
            assert_true(sp[0].args_len >= last_args);
            last_args = sp[0].args_len;
            assert_true(sp[0].args_len <= strlen("{\"city\": \"Pa}ris\\\"\"}"));
        }
        if (n == 2) {
            saw_two = 1;
            assert_true(sp[0].args_done);
            assert_memory_equal(full + sp[1].name_off, "now", 3);
        }
    }
    assert_true(saw_two);
    assert_int_equal(last_args, strlen("{\"city\": \"Pa}ris\\\"\"}"));
    assert_true(sp[1].args_done);
    assert_int_equal(sp[1].args_len, 0);

    /* Llama 3: "parameters", one call */
    const char *l3 = "{\"name\": \"get_weather\", \"parameters\": {\"city\": [1, 2";
    n = ig_chat_tools_scan(IG_CHAT_TOOLS_LLAMA3, l3, strlen(l3), NAMES, 2, sp, 4);
    assert_int_equal(n, 1);
    assert_false(sp[0].args_done);
    assert_string_equal(l3 + sp[0].args_off, "{\"city\": [1, 2");
    /* string arguments are marked (they are unquoted at the end, not streamed) */
    const char *st = "{\"name\": \"now\", \"arguments\": \"{}\"}";
    n = ig_chat_tools_scan(IG_CHAT_TOOLS_LLAMA3, st, strlen(st), NAMES, 2, sp, 4);
    assert_int_equal(n, 1);
    assert_true(sp[0].args_string && sp[0].args_done);
    /* not calls: an undeclared name, another shape, no convention */
    const char *bad[] = {"<tool_call>{\"name\": \"rm\", \"arguments\": {}}",
                         "<tool_call>{\"arguments\": {}, \"name\": \"now\"}",
                         "<tool_call>[\"now\"]"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(
            ig_chat_tools_scan(IG_CHAT_TOOLS_HERMES, bad[i], strlen(bad[i]), NAMES, 2, sp, 4), 0);
    assert_int_equal(ig_chat_tools_scan(IG_CHAT_TOOLS_NONE, full, len, NAMES, 2, sp, 4), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),        cmocka_unit_test(test_hermes_render),
        cmocka_unit_test(test_llama3_render), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_parse),         cmocka_unit_test(test_stream_prefix),
        cmocka_unit_test(test_stream_scan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
