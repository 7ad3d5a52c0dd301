/* Chat templates: family detection, exact renderings of ChatML, Llama-2 and
 * Llama-3, conversation errors, OpenAI messages (parsed by the api module,
 * as the worker does) through the renderer and the encoder, and stop tokens. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "infergate/api.h"
#include "infergate/chat.h"
#include "infergate/error.h"
#include "infergate/tokenizer.h"
#include "infergate/tokgen.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MSG(r, c)                                                                                  \
    {                                                                                              \
        .role = r, .content = c, .content_len = sizeof(c) - 1                                      \
    }

static const ig_chat_msg_t CONVO[] = {
    MSG("system", "You are terse."),
    MSG("user", "  Hi there \n"),
    MSG("assistant", "Hello."),
    MSG("user", "What is 2+2?"),
};

static char *render(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n, const char *bos,
                    const char *eos)
{
    char *out, err[256];
    size_t len;
    int rc = ig_chat_render(style, m, n, bos, eos, 1, &out, &len, err, sizeof err);
    if (rc != 0)
        print_error("render: %s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(strlen(out), len);
    return out;
}

/* Renders m in style and compares the text with want. */
static void expect_render(ig_chat_style_t style, const ig_chat_msg_t *m, size_t n, const char *bos,
                          const char *eos, const char *want)
{
    char *s = render(style, m, n, bos, eos);
    assert_string_equal(s, want);
    free(s);
}

static void test_detect(void **state)
{
    (void)state;
    assert_int_equal(ig_chat_detect(NULL), IG_CHAT_CHATML);
    assert_int_equal(ig_chat_detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
                     IG_CHAT_CHATML);
    assert_int_equal(ig_chat_detect("{{'<|im_start|>' + message['role']}}"), IG_CHAT_CHATML);
    assert_int_equal(ig_chat_detect("{{ bos_token + '[INST] ' + content + ' [/INST]' }}"),
                     IG_CHAT_LLAMA2);
    assert_int_equal(
        ig_chat_detect("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"),
        IG_CHAT_LLAMA3);
    assert_string_equal(ig_chat_style_name(IG_CHAT_LLAMA3), "llama3");
    assert_string_equal(ig_chat_style_name(IG_CHAT_LLAMA2), "llama2");
    assert_string_equal(ig_chat_style_name(IG_CHAT_CHATML), "chatml");
}

static void test_chatml(void **state)
{
    (void)state;
    expect_render(IG_CHAT_CHATML, CONVO, 4, NULL, NULL,
                  "<|im_start|>system\nYou are terse.<|im_end|>\n"
                  "<|im_start|>user\n  Hi there \n<|im_end|>\n"
                  "<|im_start|>assistant\nHello.<|im_end|>\n"
                  "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
}

static void test_llama3(void **state)
{
    (void)state;
    expect_render(IG_CHAT_LLAMA3, CONVO, 4, "<|begin_of_text|>", "<|end_of_text|>",
                  "<|begin_of_text|>"
                  "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void test_llama2(void **state)
{
    (void)state;
    expect_render(IG_CHAT_LLAMA2, CONVO, 4, "<s>", "</s>",
                  "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\n  Hi there [/INST]"
                  " Hello. </s>"
                  "<s>[INST] What is 2+2? [/INST]");
    /* Without a system message. */
    expect_render(IG_CHAT_LLAMA2, CONVO + 1, 1, "<s>", "</s>", "<s>[INST] Hi there [/INST]");
}

/* The tool role: a `tool` turn in ChatML, an `ipython` turn in Llama-3. */
static void test_tool_role(void **state)
{
    const ig_chat_msg_t m[] = {MSG("user", "Weather?"), MSG("assistant", ""),
                               MSG("tool", "{\"t\": 21}")};
    (void)state;
    expect_render(IG_CHAT_CHATML, m, 3, NULL, NULL,
                  "<|im_start|>user\nWeather?<|im_end|>\n"
                  "<|im_start|>assistant\n<|im_end|>\n"
                  "<|im_start|>tool\n{\"t\": 21}<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render(IG_CHAT_LLAMA3, m, 3, "<|begin_of_text|>", NULL,
                  "<|begin_of_text|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>"
                  "<|start_header_id|>ipython<|end_header_id|>\n\n{\"t\": 21}<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Which family, and the sentence that says why (logged at load). */
static void test_detect_why(void **state)
{
    const char *why = NULL;
    (void)state;
    assert_int_equal(ig_chat_detect_why(NULL, &why), IG_CHAT_CHATML);
    assert_non_null(strstr(why, "no chat_template"));
    assert_int_equal(ig_chat_detect_fallback(NULL), 0);
    assert_int_equal(ig_chat_detect_why("{{ messages }}", &why), IG_CHAT_CHATML);
    assert_non_null(strstr(why, "fallback"));
    assert_int_equal(ig_chat_detect_fallback("{{ messages }}"), 1);
    assert_int_equal(ig_chat_detect_why("x<|im_start|>y", &why), IG_CHAT_CHATML);
    assert_string_equal(why, "its chat_template has <|im_start|>");
    assert_int_equal(ig_chat_detect_fallback("x<|im_start|>y"), 0);
    assert_int_equal(ig_chat_detect_why("[INST]", &why), IG_CHAT_LLAMA2);
    assert_int_equal(ig_chat_detect_why("<|start_header_id|>", NULL), IG_CHAT_LLAMA3);
}

static void test_errors(void **state)
{
    char *out = (char *)1, err[256];
    size_t len;
    const ig_chat_msg_t bad_role[] = {MSG("user", "a"), MSG("robot", "b")};
    const ig_chat_msg_t tool[] = {MSG("user", "a"), MSG("assistant", "b"), MSG("tool", "c")};
    const ig_chat_msg_t two_users[] = {MSG("user", "a"), MSG("user", "b")};
    (void)state;
    assert_int_equal(
        ig_chat_render(IG_CHAT_CHATML, bad_role, 2, NULL, NULL, 1, &out, &len, err, sizeof err),
        IG_EINVAL);
    assert_null(out);
    assert_string_equal(
        err, "messages[1].role: must be \"system\", \"user\", \"assistant\" or \"tool\"");
    /* Llama-2 has no tool turn: a clear refusal, not a silent fold. */
    assert_int_equal(
        ig_chat_render(IG_CHAT_LLAMA2, tool, 3, "<s>", "</s>", 1, &out, &len, err, sizeof err),
        IG_EINVAL);
    assert_null(out);
    assert_string_equal(err, "messages[2].role: \"tool\" messages are not supported by this "
                             "model's chat template (Llama-2 has no tool turn)");
    assert_int_equal(
        ig_chat_render(IG_CHAT_LLAMA2, two_users, 2, "<s>", "</s>", 1, &out, &len, err, sizeof err),
        IG_EINVAL);
    assert_non_null(strstr(err, "messages[1].role: Llama-2 chat needs user and assistant"));
    /* The other families accept any order. */
    out = render(IG_CHAT_LLAMA3, two_users, 2, NULL, NULL);
    free(out);
}

/* A chat body parsed by the api module; fails the test on a parse error. */
static void parse_chat(const char *body, ig_api_request_t *r)
{
    ig_api_error_t e;
    if (ig_api_parse_chat(body, strlen(body), r, &e) != 0)
        fail_msg("parse: %s", e.message);
}

/* The parsed messages as the renderer takes them (borrowed from r). */
static ig_chat_msg_t *chat_msgs(const ig_api_request_t *r)
{
    ig_chat_msg_t *m = calloc((size_t)r->nmessages, sizeof(*m));
    assert_non_null(m);
    for (int i = 0; i < r->nmessages; i++) {
        m[i].role = r->messages[i].role;
        m[i].content = r->messages[i].content;
        m[i].content_len = strlen(r->messages[i].content);
    }
    return m;
}

/* OpenAI messages (content parts joined by the api parser) against generated
 * tokenizers of each family: the rendered text, the encoded ids, stop ids. */
static void test_messages_and_stop_ids(void **state)
{
    char dir[] = "/tmp/ig_chat_XXXXXX", sub[64], err[256], cmd[96];
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello \"},"
                       "{\"type\":\"text\",\"text\":\"you\"}]}]}";
    ig_api_request_t req;
    (void)state;
    parse_chat(body, &req);
    ig_chat_msg_t *msgs = chat_msgs(&req);
    size_t nmsgs = (size_t)req.nmessages;
    assert_non_null(mkdtemp(dir));
    for (int style = 1; style <= 3; style++) {
        ig_tokenizer_t *tok;
        char *out;
        size_t len, n;
        int32_t ids[8];
        ig_tokvec_t v;
        snprintf(sub, sizeof sub, "%s/%d", dir, style);
        assert_int_equal(mkdir(sub, 0755), 0);
        assert_int_equal(ig_tokgen_write(sub, 1024, style, 5, err, sizeof err), 0);
        assert_int_equal(ig_tokenizer_load(sub, &tok, err, sizeof err), 0);
        ig_chat_style_t cs = ig_chat_detect(ig_tokenizer_chat_template(tok));
        int32_t bos = ig_tokenizer_bos_id(tok), eos = ig_tokenizer_eos_id(tok);
        assert_int_equal(ig_chat_render(cs, msgs, nmsgs,
                                        bos >= 0 ? ig_tokenizer_token_str(tok, bos) : NULL,
                                        eos >= 0 ? ig_tokenizer_token_str(tok, eos) : NULL, 1, &out,
                                        &len, err, sizeof err),
                         0);
        n = ig_chat_stop_ids(cs, tok, ids, 8);
        ig_tokvec_init(&v);
        /* What the worker runs: markers as special tokens, BOS from the template. */
        assert_int_equal(ig_chat_encode(cs, tok, msgs, nmsgs, 1, &v, err, sizeof err), 0);
        if (style == IG_TOKGEN_BYTE_LEVEL) {
            assert_int_equal(cs, IG_CHAT_LLAMA3);
            assert_string_equal(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>"
                                     "\n\nBe brief.<|eot_id|><|start_header_id|>user"
                                     "<|end_header_id|>\n\nHello you<|eot_id|>"
                                     "<|start_header_id|>assistant<|end_header_id|>\n\n");
            assert_int_equal(n, 2);
            assert_int_equal(ids[0], ig_tokenizer_token_id(tok, "<|eot_id|>", 10));
            assert_int_equal(ids[1], ig_tokenizer_token_id(tok, "<|end_of_text|>", 15));
            assert_int_equal(v.ids[0], ig_tokenizer_bos_id(tok));
            assert_int_equal(v.ids[1], ig_tokenizer_token_id(tok, "<|start_header_id|>", 19));
        } else if (style == IG_TOKGEN_SENTENCEPIECE) {
            assert_int_equal(cs, IG_CHAT_LLAMA2);
            assert_string_equal(out, "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello you [/INST]");
            assert_int_equal(n, 1);
            assert_int_equal(ids[0], 2);
            assert_int_equal(v.ids[0], 1);
        } else {
            assert_int_equal(cs, IG_CHAT_CHATML);
            assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n"
                                     "<|im_start|>user\nHello you<|im_end|>\n"
                                     "<|im_start|>assistant\n");
            assert_int_equal(n, 2);
            assert_int_equal(ids[0], ig_tokenizer_token_id(tok, "<|im_end|>", 10));
            assert_int_equal(ids[1], ig_tokenizer_token_id(tok, "<|endoftext|>", 13));
            assert_int_equal(v.ids[0], ig_tokenizer_token_id(tok, "<|im_start|>", 12));
        }
        ig_tokvec_dispose(&v);
        free(out);
        ig_tokenizer_free(tok);
    }
    free(msgs);
    ig_api_request_dispose(&req);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The shape of messages is the api parser's to refuse (400, param messages,
 * the field named); what the family cannot express is the renderer's. */
static void test_messages_errors(void **state)
{
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"messages\":[]}", "'messages' must be a non-empty list"},
        {"{\"messages\":[5]}", "messages[0] must be an object"},
        {"{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":3}]}",
         "messages[0].content must be a string or a list of parts"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
         "messages[0].content[0]: content type 'image_url' is not supported"},
        {"{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}",
         "messages[0].role 'robot' is not one of"},
    };
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ig_api_request_t r;
        ig_api_error_t e;
        assert_int_equal(ig_api_parse_chat(bad[i].json, strlen(bad[i].json), &r, &e), IG_EINVAL);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "messages");
        if (strstr(e.message, bad[i].msg) != e.message)
            fail_msg("case %zu: got \"%s\", want \"%s...\"", i, e.message, bad[i].msg);
    }
    /* Parsed fine, but Llama-2 has no tool turn: the renderer refuses. */
    ig_api_request_t r;
    char err[256], *out;
    size_t len;
    parse_chat("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
               "{\"role\":\"tool\",\"content\":\"42\"}]}",
               &r);
    ig_chat_msg_t *m = chat_msgs(&r);
    assert_int_equal(ig_chat_render(IG_CHAT_LLAMA2, m, (size_t)r.nmessages, "<s>", "</s>", 1, &out,
                                    &len, err, sizeof err),
                     IG_EINVAL);
    assert_non_null(strstr(err, "messages[1].role"));
    free(m);
    ig_api_request_dispose(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detect),          cmocka_unit_test(test_chatml),
        cmocka_unit_test(test_llama3),          cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_errors),          cmocka_unit_test(test_messages_and_stop_ids),
        cmocka_unit_test(test_messages_errors), cmocka_unit_test(test_tool_role),
        cmocka_unit_test(test_detect_why),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
