/*
 * The OpenAI fields a worker honours or refuses, through the real binary:
 * n > 1 (choices that differ at temperature > 0 with a seed, one prefill
 * shared through the prefix cache, usage once, streamed with each choice's
 * index), logit_bias, the penalties, max_completion_tokens, tools rendered
 * by a template's convention and read back into tool_calls (forced with
 * tool_choice and logit_bias on a random-weight model, whole and streamed),
 * and a 400 naming each field the worker does not implement.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker_proc.h"

#include "infergate/tokenizer.h"
#include "infergate/tokgen.h"

static wproc_t TINY, HERMES, LLAMA3;
static char hermes_model[160], llama3_model[160];
static int brace_hermes, brace_llama3; /* the token id of "}" in each vocab */

static const char TOOLS[] =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"description\":\"Weather of a city\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]";

/* A copy of the tiny model with a tokenizer of style and a chat_template. */
static int model_with(const char *name, int style, const char *tpl, char *out, size_t cap)
{
    char cmd[512], err[256], path[256];
    snprintf(out, cap, "%s/%s", ig_gwf_run_dir, name);
    snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s'", ig_gwf_model_dir, out);
    if (system(cmd) != 0 || ig_tokgen_write(out, 4096, style, 3, err, sizeof(err)) != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", out);
    json_t *cfg = json_load_file(path, 0, NULL);
    if (cfg == NULL)
        return -1;
    json_object_set_new(cfg, "chat_template", json_string(tpl));
    int rc = json_dump_file(cfg, path, 0);
    json_decref(cfg);
    /* room for tool definitions: a context of 2048 (random weights, RoPE) */
    snprintf(path, sizeof(path), "%s/config.json", out);
    if (rc != 0 || (cfg = json_load_file(path, 0, NULL)) == NULL)
        return -1;
    json_object_set_new(cfg, "max_position_embeddings", json_integer(2048));
    rc = json_dump_file(cfg, path, 0);
    json_decref(cfg);
    return rc;
}

static int brace_id(const char *model)
{
    ig_tokenizer_t *tok;
    char err[256];
    if (ig_tokenizer_load(model, &tok, err, sizeof(err)) != 0)
        return -1;
    ig_tokvec_t v;
    ig_tokvec_init(&v);
    int id = ig_tokenizer_encode(tok, "}", 1, 0, &v) == 0 && v.len == 1 ? (int)v.ids[0] : -1;
    ig_tokvec_dispose(&v);
    ig_tokenizer_free(tok);
    return id;
}

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    /* Qwen2.5-like: ChatML whose template has the Hermes tool convention */
    if (model_with("hermes", IG_TOKGEN_CHATML,
                   "{%- if tools %}<|im_start|>system\n<tools>{{ tools }}</tools> <tool_call>"
                   "{%- endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                   "<|im_end|>\n{%- endfor %}",
                   hermes_model, sizeof(hermes_model)) < 0)
        return -1;
    /* Llama 3.1-like: "Environment: ipython" and a tools loop */
    if (model_with("llama31", IG_TOKGEN_BYTE_LEVEL,
                   "{{- bos_token }}{%- if tools %}Environment: ipython{{ tools }}{%- endif %}"
                   "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
                   "\n\n{{ m.content }}<|eot_id|>{%- endfor %}",
                   llama3_model, sizeof(llama3_model)) < 0)
        return -1;
    brace_hermes = brace_id(hermes_model);
    brace_llama3 = brace_id(llama3_model);
    if (brace_hermes < 0 || brace_llama3 < 0)
        return -1;
    if (wt_start(&TINY, "tiny", NULL) < 0 ||
        wt_start_on(&HERMES, "hermes", hermes_model, NULL, 0) < 0 ||
        wt_start_on(&LLAMA3, "llama3", llama3_model, NULL, 0) < 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    wt_stop(&TINY);
    wt_stop(&HERMES);
    wt_stop(&LLAMA3);
    ig_gwf_model_teardown(state);
    return 0;
}

/* POSTs body and wants status; the parsed reply (new reference). */
static json_t *post(const wproc_t *w, const char *path, const char *body, int want)
{
    int st;
    json_t *j = wt_post_json(w, path, body, &st);
    if (st != want)
        fail_msg("%s %s: status %d, want %d: %s", path, body, st, want,
                 json_string_value(json_object_get(json_object_get(j, "error"), "message")));
    assert_non_null(j);
    return j;
}

static const char *choice_text(json_t *j, int i)
{
    json_t *c = json_array_get(json_object_get(j, "choices"), (size_t)i);
    json_t *msg = json_object_get(c, "message");
    return json_string_value(msg ? json_object_get(msg, "content") : json_object_get(c, "text"));
}

static int usage(json_t *j, const char *key)
{
    return (int)json_integer_value(json_object_get(json_object_get(j, "usage"), key));
}

/* The SSE events of a streamed POST (new reference); [DONE] must end it. */
static json_t *post_stream(const wproc_t *w, const char *path, const char *body)
{
    ig_tc_response_t r;
    assert_int_equal(wt_request(w, "POST", path, body, &r), 0);
    assert_int_equal(r.status, 200);
    int done;
    json_t *ev = wt_sse_events(r.body, &done);
    ig_tc_response_free(&r);
    assert_true(done);
    return ev;
}

static double metric(const wproc_t *w, const char *name)
{
    ig_tc_response_t r;
    assert_int_equal(wt_get(w, "/metrics", &r), 0);
    char key[128];
    snprintf(key, sizeof(key), "\n%s ", name);
    const char *p = strstr(r.body, key);
    double v = p ? atof(p + strlen(key)) : -1;
    ig_tc_response_free(&r);
    return v;
}

/* ---- n ---------------------------------------------------------------------- */

static void test_n_choices(void **state)
{
    (void)state;
    const char *one = "{\"prompt\":\"the cat sat on\",\"max_tokens\":12,\"temperature\":1.0,"
                      "\"seed\":7,\"ignore_eos\":true}";
    const char *two = "{\"prompt\":\"the cat sat on\",\"max_tokens\":12,\"temperature\":1.0,"
                      "\"seed\":7,\"ignore_eos\":true,\"n\":2}";
    json_t *a = post(&TINY, "/v1/completions", one, 200);
    json_t *b = post(&TINY, "/v1/completions", two, 200);
    json_t *c = post(&TINY, "/v1/completions", two, 200);
    json_t *ch = json_object_get(b, "choices");
    assert_int_equal(json_array_size(ch), 2);
    for (int i = 0; i < 2; i++) {
        json_t *x = json_array_get(ch, (size_t)i);
        assert_int_equal(json_integer_value(json_object_get(x, "index")), i);
        assert_string_equal(json_string_value(json_object_get(x, "finish_reason")), "length");
    }
    /* each choice its own seed stream: they differ, choice 0 is seed + 0
     * (the n = 1 answer), and the same seed gives the same two again */
    assert_string_not_equal(choice_text(b, 0), choice_text(b, 1));
    assert_string_equal(choice_text(b, 0), choice_text(a, 0));
    assert_string_equal(choice_text(b, 1), choice_text(c, 1));
    /* usage: the prompt once, the completions summed */
    assert_int_equal(usage(b, "prompt_tokens"), usage(a, "prompt_tokens"));
    assert_int_equal(usage(b, "completion_tokens"), 24);
    assert_int_equal(usage(b, "total_tokens"), usage(a, "prompt_tokens") + 24);
    json_decref(c);

    /* streamed: chunks carry each choice's index, each ends once, usage once,
     * and the texts are the unstreamed ones */
    json_t *ev = post_stream(&TINY, "/v1/completions",
                             "{\"prompt\":\"the cat sat on\",\"max_tokens\":12,\"temperature\":1.0,"
                             "\"seed\":7,\"ignore_eos\":true,\"n\":2,\"stream\":true,"
                             "\"stream_options\":{\"include_usage\":true}}");
    char text[2][512] = {"", ""};
    int finishes[2] = {0, 0}, usages = 0;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e)
    {
        json_t *cs = json_object_get(e, "choices");
        if (json_array_size(cs) == 0) {
            usages++;
            assert_int_equal(usage(e, "prompt_tokens"), usage(a, "prompt_tokens"));
            assert_int_equal(usage(e, "completion_tokens"), 24);
            continue;
        }
        json_t *x = json_array_get(cs, 0);
        int idx = (int)json_integer_value(json_object_get(x, "index"));
        assert_true(idx == 0 || idx == 1);
        strncat(text[idx], json_string_value(json_object_get(x, "text")),
                sizeof(text[idx]) - strlen(text[idx]) - 1);
        finishes[idx] += json_is_string(json_object_get(x, "finish_reason"));
    }
    assert_int_equal(finishes[0], 1);
    assert_int_equal(finishes[1], 1);
    assert_int_equal(usages, 1);
    assert_string_equal(text[0], choice_text(b, 0));
    assert_string_equal(text[1], choice_text(b, 1));
    json_decref(ev);
    json_decref(a);
    json_decref(b);

    /* chat, streamed: a role delta per choice, then deltas by index */
    ev = post_stream(&HERMES, "/v1/chat/completions",
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":6,"
                     "\"temperature\":1.0,\"seed\":3,\"ignore_eos\":true,\"n\":3,\"stream\":true}");
    int roles[3] = {0, 0, 0}, ends[3] = {0, 0, 0};
    json_array_foreach(ev, i, e)
    {
        json_t *x = json_array_get(json_object_get(e, "choices"), 0);
        int idx = (int)json_integer_value(json_object_get(x, "index"));
        assert_true(idx >= 0 && idx < 3);
        roles[idx] += json_object_get(json_object_get(x, "delta"), "role") != NULL;
        ends[idx] += json_is_string(json_object_get(x, "finish_reason"));
    }
    for (int k = 0; k < 3; k++) {
        assert_int_equal(roles[k], 1);
        assert_int_equal(ends[k], 1);
    }
    json_decref(ev);
}

static double sum_logprobs(json_t *j, int i)
{
    json_t *lp =
        json_object_get(json_array_get(json_object_get(j, "choices"), (size_t)i), "logprobs");
    json_t *v;
    size_t k;
    double sum = 0;
    json_array_foreach(json_object_get(lp, "token_logprobs"), k, v) sum += json_real_value(v);
    return sum;
}

/* best_of > n: best_of samples (seeds as n = best_of gives them), the n
 * with the highest summed logprob returned, best first; usage counts what
 * was generated. */
static void test_best_of(void **state)
{
    (void)state;
    const char *all = "{\"prompt\":\"hello there\",\"max_tokens\":6,\"temperature\":1.0,"
                      "\"seed\":5,\"ignore_eos\":true,\"logprobs\":0,\"n\":4}";
    const char *best = "{\"prompt\":\"hello there\",\"max_tokens\":6,\"temperature\":1.0,"
                       "\"seed\":5,\"ignore_eos\":true,\"n\":2,\"best_of\":4}";
    json_t *a = post(&TINY, "/v1/completions", all, 200);
    json_t *b = post(&TINY, "/v1/completions", best, 200);
    int rank[4] = {0, 1, 2, 3};
    for (int x = 1; x < 4; x++)
        for (int y = x; y > 0 && sum_logprobs(a, rank[y - 1]) < sum_logprobs(a, rank[y]); y--) {
            int t = rank[y];
            rank[y] = rank[y - 1];
            rank[y - 1] = t;
        }
    json_t *ch = json_object_get(b, "choices");
    assert_int_equal(json_array_size(ch), 2);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(
            json_integer_value(json_object_get(json_array_get(ch, (size_t)k), "index")), k);
        assert_string_equal(choice_text(b, k), choice_text(a, rank[k]));
        /* logprobs were not asked for: none shown, though they ranked */
        assert_true(json_is_null(json_object_get(json_array_get(ch, (size_t)k), "logprobs")));
    }
    assert_int_equal(usage(b, "completion_tokens"), 24);
    assert_int_equal(usage(b, "prompt_tokens"), usage(a, "prompt_tokens"));
    json_decref(a);
    json_decref(b);
}

/* n > 1 prefills the prompt once: the other samples find its full blocks
 * in the prefix cache (16-token blocks). */
static void test_n_shares_prefill(void **state)
{
    (void)state;
    char body[2048];
    int off = snprintf(body, sizeof(body), "{\"prompt\":[");
    for (int k = 0; k < 80; k++)
        off += snprintf(body + off, sizeof(body) - (size_t)off, "%s%d", k ? "," : "", 300 + k);
    snprintf(body + off, sizeof(body) - (size_t)off,
             "],\"max_tokens\":2,\"temperature\":1.0,\"seed\":1,\"n\":3}");
    double q0 = metric(&TINY, "infergate_worker_prefix_cache_queries_total");
    double h0 = metric(&TINY, "infergate_worker_prefix_cache_hits_total");
    json_t *j = post(&TINY, "/v1/completions", body, 200);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 3);
    assert_int_equal(usage(j, "prompt_tokens"), 80);
    json_decref(j);
    double q1 = metric(&TINY, "infergate_worker_prefix_cache_queries_total");
    double h1 = metric(&TINY, "infergate_worker_prefix_cache_hits_total");
    assert_true(q1 - q0 == 240); /* three sequences of 80 looked up */
    /* the two later samples each find at least the 4 full blocks before the
     * last token (64 of 80); a cache the earlier test filled may give more */
    assert_true(h1 - h0 >= 2 * 64);
}

/* ---- sampling fields ---------------------------------------------------------- */

static void test_logit_bias_and_penalties(void **state)
{
    (void)state;
    /* +100 on one id: every token at temperature 1.5 is that id */
    json_t *j = post(&TINY, "/v1/completions",
                     "{\"prompt\":\"hello\",\"max_tokens\":8,\"temperature\":1.5,\"seed\":2,"
                     "\"ignore_eos\":true,\"logprobs\":0,\"logit_bias\":{\"1234\":100}}",
                     200);
    json_t *toks = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "tokens");
    assert_int_equal(json_array_size(toks), 8);
    const char *first = json_string_value(json_array_get(toks, 0));
    for (size_t k = 1; k < 8; k++)
        assert_string_equal(json_string_value(json_array_get(toks, k)), first);
    json_decref(j);
    char body[512];
    /* the penalties reach the sampler: greedy text changes with them */
    const char *plain = "{\"prompt\":\"the the the\",\"max_tokens\":16,\"temperature\":0,"
                        "\"ignore_eos\":true}";
    j = post(&TINY, "/v1/completions", plain, 200);
    char base[512];
    snprintf(base, sizeof(base), "%s", choice_text(j, 0));
    json_decref(j);
    snprintf(body, sizeof(body),
             "{\"prompt\":\"the the the\",\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true,"
             "\"frequency_penalty\":2,\"presence_penalty\":2}");
    j = post(&TINY, "/v1/completions", body, 200);
    assert_string_not_equal(choice_text(j, 0), base);
    /* the same penalties again: the same text (greedy is deterministic) */
    json_t *k = post(&TINY, "/v1/completions", body, 200);
    assert_string_equal(choice_text(k, 0), choice_text(j, 0));
    json_decref(k);
    json_decref(j);

    /* max_completion_tokens is the chat name of max_tokens */
    j = post(&HERMES, "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":3,"
             "\"ignore_eos\":true}",
             200);
    assert_int_equal(usage(j, "completion_tokens"), 3);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(j, "choices"), 0), "finish_reason")),
                        "length");
    json_decref(j);
}

/* ---- refusals ------------------------------------------------------------------ */

typedef struct {
    const wproc_t *w;
    const char *path;
    const char *body;
    const char *param;
} refusal_t;

static void test_refusals(void **state)
{
    (void)state;
    const refusal_t cases[] = {
        {&TINY, "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
         "{\"type\":\"json_object\"}}",
         "response_format"},
        {&HERMES, "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
         "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{}}}}",
         "response_format"},
        {&TINY, "/v1/completions", "{\"prompt\":\"x\",\"suffix\":\"end\"}", "suffix"},
        {&TINY, "/v1/completions", "{\"prompt\":\"x\",\"best_of\":3,\"stream\":true}", "best_of"},
        {&TINY, "/v1/completions", "{\"prompt\":\"x\",\"n\":3,\"best_of\":2}", "best_of"},
        {&TINY, "/v1/completions", "{\"prompt\":\"x\",\"logit_bias\":{\"4096\":1}}", "logit_bias"},
        {&TINY, "/v1/completions", "{\"prompt\":\"x\",\"n\":129}", "n"},
        /* Llama-2's template has no tool convention */
        {&TINY, "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"f\"}}]}",
         "tools"},
        {&HERMES, "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":"
         "[{\"type\":\"code_interpreter\"}]}",
         "tools"},
        /* a history call where the template cannot write it */
        {&TINY, "/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\","
         "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\","
         "\"arguments\":\"{}\"}}]}]}",
         "messages"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = post(cases[i].w, cases[i].path, cases[i].body, 400);
        json_t *e = json_object_get(j, "error");
        if (!json_is_string(json_object_get(e, "param")) ||
            strcmp(json_string_value(json_object_get(e, "param")), cases[i].param) != 0)
            fail_msg("case %zu: param %s, want %s (%s)", i,
                     json_string_value(json_object_get(e, "param")), cases[i].param,
                     json_string_value(json_object_get(e, "message")));
        assert_string_equal(json_string_value(json_object_get(e, "type")), "invalid_request_error");
        json_decref(j);
    }
    /* what is implemented is answered: text format, best_of = n, tools
     * with tool_choice none (nothing rendered) */
    const char *ok[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,"
        "\"response_format\":{\"type\":\"text\"}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":2,\"n\":2,"
        "\"best_of\":2,\"user\":\"u1\",\"parallel_tool_calls\":true}",
    };
    for (size_t i = 0; i < 2; i++)
        json_decref(post(&TINY, "/v1/chat/completions", ok[i], 200));
    json_t *a =
        post(&TINY, "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1}", 200);
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1,"
             "\"tool_choice\":\"none\",%s}",
             TOOLS);
    json_t *b = post(&TINY, "/v1/chat/completions", body, 200);
    assert_int_equal(usage(a, "prompt_tokens"), usage(b, "prompt_tokens"));
    json_decref(a);
    json_decref(b);
}

/* ---- tools ----------------------------------------------------------------------- */

static void check_call(json_t *j, const char *name)
{
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
    assert_true(json_is_null(json_object_get(msg, "content")));
    json_t *calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    json_t *call = json_array_get(calls, 0);
    assert_true(strncmp(json_string_value(json_object_get(call, "id")), "call_", 5) == 0);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), name);
    /* arguments are a string of JSON, as OpenAI sends them */
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{}");
}

static void test_tools(void **state)
{
    (void)state;
    char body[2048];
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]";
    const wproc_t *ws[] = {&HERMES, &LLAMA3};
    const int brace[] = {brace_hermes, brace_llama3};
    for (int k = 0; k < 2; k++) {
        /* the tools are rendered: the prompt grows */
        snprintf(body, sizeof(body), "{%s,\"max_tokens\":1}", msgs);
        json_t *a = post(ws[k], "/v1/chat/completions", body, 200);
        snprintf(body, sizeof(body), "{%s,\"max_tokens\":1,%s}", msgs, TOOLS);
        json_t *b = post(ws[k], "/v1/chat/completions", body, 200);
        assert_true(usage(b, "prompt_tokens") > usage(a, "prompt_tokens") + 40);
        /* tool_choice names a function; "}" is forced by logit_bias: the
         * answer is that call, without arguments */
        snprintf(body, sizeof(body),
                 "{%s,\"max_tokens\":1,\"temperature\":0,\"logit_bias\":{\"%d\":100},"
                 "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}},%s}",
                 msgs, brace[k], TOOLS);
        json_t *c = post(ws[k], "/v1/chat/completions", body, 200);
        check_call(c, "now");
        assert_true(usage(c, "prompt_tokens") > usage(b, "prompt_tokens"));
        json_decref(a);
        json_decref(b);
        json_decref(c);
    }

    /* streamed as OpenAI streams calls: index, id, type and name with empty
     * arguments, then the arguments, then finish_reason tool_calls */
    snprintf(body, sizeof(body),
             "{%s,\"max_tokens\":1,\"temperature\":0,\"logit_bias\":{\"%d\":100},\"stream\":true,"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},%s}",
             msgs, brace_hermes, TOOLS);
    json_t *ev = post_stream(&HERMES, "/v1/chat/completions", body);
    int heads = 0, args = 0, fins = 0;
    char id[64] = "";
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e)
    {
        json_t *x = json_array_get(json_object_get(e, "choices"), 0);
        json_t *delta = json_object_get(x, "delta");
        /* the forced call is no content: nothing of it leaks as text */
        json_t *content = json_object_get(delta, "content");
        if (content && json_string_length(content) > 0)
            fail_msg("content delta in a call: %s", json_string_value(content));
        json_t *tc = json_array_get(json_object_get(delta, "tool_calls"), 0);
        if (tc) {
            assert_int_equal(json_integer_value(json_object_get(tc, "index")), 0);
            json_t *fn = json_object_get(tc, "function");
            if (json_object_get(tc, "id")) {
                heads++;
                snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(tc, "id")));
                assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
                assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "");
            } else {
                args++;
                assert_int_equal(heads, 1);
                assert_null(json_object_get(fn, "name"));
                assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{}");
            }
        }
        if (json_is_string(json_object_get(x, "finish_reason"))) {
            fins++;
            assert_string_equal(json_string_value(json_object_get(x, "finish_reason")),
                                "tool_calls");
        }
    }
    assert_int_equal(heads, 1);
    assert_int_equal(args, 1);
    assert_int_equal(fins, 1);
    assert_true(strncmp(id, "call_", 5) == 0);
    json_decref(ev);

    /* a history with an assistant call and its result renders (Hermes:
     * <tool_call> and <tool_response>; Llama 3: a JSON call and ipython) */
    for (int k = 0; k < 2; k++) {
        snprintf(body, sizeof(body),
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                 "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
                 "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
                 "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
                 "\"call_1\",\"content\":\"sunny\"}],\"max_tokens\":1,%s}",
                 TOOLS);
        json_t *h = post(ws[k], "/v1/chat/completions", body, 200);
        assert_true(usage(h, "prompt_tokens") > 60);
        json_decref(h);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_n_choices), cmocka_unit_test(test_n_shares_prefill),
        cmocka_unit_test(test_best_of),   cmocka_unit_test(test_logit_bias_and_penalties),
        cmocka_unit_test(test_refusals),  cmocka_unit_test(test_tools),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
