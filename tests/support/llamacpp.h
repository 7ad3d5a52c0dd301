#ifndef IG_TEST_LLAMACPP_H
#define IG_TEST_LLAMACPP_H

/*
 * llama.cpp's llama-server as a peer of the tests, built outside the tree:
 * $LLAMACPP_BIN, default /work/peers/llama.cpp/build/bin (February 2025);
 * a build recent enough for Qwen3 in $LLAMACPP_NEW_BIN, default
 * /work/peers/llama.cpp-2026/build/bin. The tests that need one return 77
 * (skipped) without it. The helpers hold for both builds (the same
 * /completion, /tokenize and n_probs answers). Header-only; include
 * cmocka.h first (the helpers assert).
 */

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testclient.h"

#include "infergate/tokenizer.h"

/* tool's path in the directory $env names (dflt when unset) in buf, or
 * NULL when it is not there. */
static inline const char *ig_llamacpp_tool_in(const char *env, const char *dflt, const char *tool,
                                              char *buf, size_t len)
{
    const char *d = getenv(env);
    snprintf(buf, len, "%s/%s", d && *d ? d : dflt, tool);
    return access(buf, X_OK) == 0 ? buf : NULL;
}

/* The path of llama.cpp's tool (llama-server, llama-quantize, ...) in buf,
 * or NULL when it is not there. */
static inline const char *ig_llamacpp_tool(const char *tool, char *buf, size_t len)
{
    return ig_llamacpp_tool_in("LLAMACPP_BIN", "/work/peers/llama.cpp/build/bin", tool, buf, len);
}

/* The same in the newer build ($LLAMACPP_NEW_BIN). */
static inline const char *ig_llamacpp_new_tool(const char *tool, char *buf, size_t len)
{
    return ig_llamacpp_tool_in("LLAMACPP_NEW_BIN", "/work/peers/llama.cpp-2026/build/bin", tool,
                               buf, len);
}

/* llama-server's path (a static buffer), or NULL when it is not there. */
static inline const char *ig_llamacpp_server(void)
{
    static char bin[1024];
    return ig_llamacpp_tool("llama-server", bin, sizeof(bin));
}

/* POSTs the JSON body to 127.0.0.1:port path: the parsed 200 answer (new),
 * or NULL, with the status and body printed. */
static inline json_t *ig_llamacpp_post(int port, const char *path, const char *body)
{
    char *raw = malloc(strlen(body) + 512);
    sprintf(raw,
            "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
            path, strlen(body), body);
    ig_tc_response_t r;
    int rc = ig_tc_request(port, raw, &r, 60000);
    free(raw);
    if (rc != 0)
        return NULL;
    json_t *j = r.status == 200 ? json_loadb(r.body, r.body_len, 0, NULL) : NULL;
    if (j == NULL)
        print_message("# %d %s: status %d: %.300s\n", port, path, r.status, r.body ? r.body : "");
    ig_tc_response_free(&r);
    return j;
}

/* The greedy text of n tokens for the token-id prompt ids (a JSON array)
 * from llama-server at lport (/completion, top_k 1, no prompt cache, and
 * the members in lextra, "" or starting with a comma) and from our worker
 * at wport (/v1/completions), in *lt and *wt (the caller frees them). */
static inline void ig_llamacpp_greedy(int lport, int wport, const char *ids, int n,
                                      const char *lextra, char **lt, char **wt)
{
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"prompt\": %s, \"n_predict\": %d, \"temperature\": 0, \"top_k\": 1, "
             "\"cache_prompt\": false%s}",
             ids, n, lextra);
    json_t *lj = ig_llamacpp_post(lport, "/completion", body);
    snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0}", ids,
             n);
    json_t *wj = ig_llamacpp_post(wport, "/v1/completions", body);
    assert_non_null(lj);
    assert_non_null(wj);
    const char *l = json_string_value(json_object_get(lj, "content"));
    const char *w = json_string_value(
        json_object_get(json_array_get(json_object_get(wj, "choices"), 0), "text"));
    assert_non_null(l);
    assert_non_null(w);
    *lt = strdup(l);
    *wt = strdup(w);
    json_decref(lj);
    json_decref(wj);
}

/* Text for the tokenizer checks: ASCII, white space, multi-byte UTF-8. */
static const char *const ig_llamacpp_corpus[] = {
    "Hello world, it's a test: 12345 + 678 = ?",
    "  spaces\tand\ttabs\n\nnew lines  ",
    "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 I'M DONE, they'll see",
};

/* llama-server's /tokenize (add_special, so BOS where the file says) equals
 * our tokenizer on the same file, special tokens parsed and BOS added. */
static inline void ig_llamacpp_same_tokens(int lport, const char *path)
{
    char err[512];
    ig_tokenizer_t *tok;
    if (ig_tokenizer_load(path, &tok, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    for (size_t i = 0; i < sizeof(ig_llamacpp_corpus) / sizeof(ig_llamacpp_corpus[0]); i++) {
        json_t *b = json_pack("{s:s, s:b}", "content", ig_llamacpp_corpus[i], "add_special", 1);
        char *body = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        json_t *lj = ig_llamacpp_post(lport, "/tokenize", body);
        free(body);
        assert_non_null(lj);
        ig_tokvec_t v;
        ig_tokvec_init(&v);
        assert_int_equal(ig_tokenizer_encode(tok, ig_llamacpp_corpus[i],
                                             strlen(ig_llamacpp_corpus[i]), IG_TOKENIZER_ADD_BOS,
                                             &v),
                         0);
        json_t *ids = json_object_get(lj, "tokens");
        int same = json_array_size(ids) == v.len;
        for (size_t k = 0; same && k < v.len; k++)
            same = json_integer_value(json_array_get(ids, k)) == v.ids[k];
        if (!same) {
            char *l = json_dumps(ids, JSON_COMPACT);
            fail_msg("corpus[%zu]: llama.cpp %s, %zu ids here", i, l, v.len);
        }
        ig_tokvec_dispose(&v);
        json_decref(lj);
    }
    ig_tokenizer_free(tok);
}

/* llama-server's greedy continuation (n tokens, /completion with top_k 1 and
 * n_probs 5) of the token-id prompt ids: its answer (new; the caller
 * decrefs it), with n entries in completion_probabilities. */
static inline json_t *ig_llamacpp_continue(int lport, const char *ids, int n)
{
    char body[4096];
    snprintf(body, sizeof(body),
             "{\"prompt\": %s, \"n_predict\": %d, \"temperature\": 0, \"top_k\": 1, "
             "\"cache_prompt\": false, \"n_probs\": 5}",
             ids, n);
    json_t *lj = ig_llamacpp_post(lport, "/completion", body);
    assert_non_null(lj);
    assert_int_equal(json_array_size(json_object_get(lj, "completion_probabilities")), n);
    return lj;
}

/* The token ids of the prompt ids followed by llama-server's greedy
 * continuation (lj, from ig_llamacpp_continue) in out (room for cap); their
 * count. */
static inline int ig_llamacpp_context(const char *ids, json_t *lj, int *out, int cap)
{
    json_t *p = json_loads(ids, 0, NULL), *lp = json_object_get(lj, "completion_probabilities");
    assert_non_null(p);
    int n = 0;
    for (size_t i = 0; i < json_array_size(p) && n < cap; i++)
        out[n++] = (int)json_integer_value(json_array_get(p, i));
    for (size_t i = 0; i < json_array_size(lp) && n < cap; i++)
        out[n++] = (int)json_integer_value(json_object_get(json_array_get(lp, i), "id"));
    json_decref(p);
    return n;
}

/* llama-server's greedy continuation (n tokens) of the token-id prompt ids,
 * and at each of its positions our worker's next token on the same context
 * (the prompt and llama.cpp's tokens before it): every token in both
 * engines' 5 best within tol in log-probability (but those shown as U+FFFD,
 * which our answer cannot tell apart), and our best token
 * llama.cpp's, or one llama.cpp ranks within tol of its best (a near tie
 * either engine may break). Returns the positions where the best token is
 * the same; the largest log-probability difference seen in *worst (may be
 * NULL). */
static inline int ig_llamacpp_compare_forced(int lport, int wport, const char *ids, int n,
                                             double tol, double *worst)
{
    char body[4096];
    json_t *lj = ig_llamacpp_continue(lport, ids, n);
    json_t *lp = json_object_get(lj, "completion_probabilities");
    json_t *ctx = json_loads(ids, 0, NULL);
    assert_non_null(ctx);
    int same = 0;
    double most = 0;
    for (int i = 0; i < n; i++) {
        json_t *l = json_array_get(lp, i), *ltop = json_object_get(l, "top_logprobs");
        char *cs = json_dumps(ctx, JSON_COMPACT);
        snprintf(body, sizeof(body),
                 "{\"prompt\": %s, \"max_tokens\": 1, \"temperature\": 0, \"logprobs\": 5}", cs);
        free(cs);
        json_t *wj = ig_llamacpp_post(wport, "/v1/completions", body);
        assert_non_null(wj);
        json_t *wl = json_object_get(json_array_get(json_object_get(wj, "choices"), 0), "logprobs");
        json_t *wtop = json_array_get(json_object_get(wl, "top_logprobs"), 0);
        const char *wt = json_string_value(json_array_get(json_object_get(wl, "tokens"), 0));
        const char *lt = json_string_value(json_object_get(l, "token"));
        double best = json_real_value(json_object_get(l, "logprob"));
        assert_non_null(wt);
        assert_non_null(lt);
        assert_true(json_array_size(ltop) > 1 && json_object_size(wtop) > 1);
        int tie = 0;
        for (size_t t = 0; t < json_array_size(ltop); t++) {
            json_t *e = json_array_get(ltop, t);
            const char *tok = json_string_value(json_object_get(e, "token"));
            double lv = json_real_value(json_object_get(e, "logprob"));
            /* Our top_logprobs is keyed by the token's text, and every
             * token that is a partial UTF-8 sequence shows as U+FFFD: such
             * a text may name another token of the five, so it is not
             * compared. */
            json_t *wv = strstr(tok, "\xef\xbf\xbd") ? NULL : json_object_get(wtop, tok);
            if (wv != NULL) {
                double d = fabs(json_real_value(wv) - lv);
                if (!(d <= tol))
                    fail_msg("%s, token %d, \"%s\": log-probability %.6f, llama.cpp's %.6f "
                             "(bound %.3g)",
                             ids, i, tok, json_real_value(wv), lv, tol);
                most = d > most ? d : most;
            }
            if (strcmp(tok, wt) == 0)
                tie = best - lv <= tol;
        }
        if (strcmp(lt, wt) == 0)
            same++;
        else if (!tie)
            fail_msg("%s, token %d: ours \"%s\", llama.cpp's \"%s\" (%.6f) by more than a near tie",
                     ids, i, wt, lt, best);
        json_array_append_new(ctx, json_integer(json_integer_value(json_object_get(l, "id"))));
        json_decref(wj);
    }
    json_decref(ctx);
    json_decref(lj);
    print_message("#   %s: the same best token at %d of %d positions, near ties at the rest; "
                  "largest log-probability difference %.3g\n",
                  ids, same, n, most);
    if (worst != NULL)
        *worst = most > *worst ? most : *worst;
    return same;
}

#endif
