/*
 * The gateway's block hashes agree with the engine's, through a real
 * worker: this process parses a request with the API module, turns it into
 * tokens and block hashes with the shared code the gateway runs
 * (ig_prefix_prompt_tokens, ig_prefix_hashes with ig_prefix_seed(model)),
 * sends the same request to `infergate worker`, and then asks the worker's
 * POST /prefix how many of those hashes it holds: every full block of the
 * prompt, for a text prompt, a chat request and token ids alike. A prompt
 * that differs in block 2 matches 2 blocks; another model's seed matches
 * none.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/api.h"
#include "infergate/prefix.h"
#include "infergate/tokenizer.h"
#include "worker_proc.h"

#define BS 16

static wproc_t W;
static ig_tokenizer_t *TOK;
static ig_chat_style_t STYLE;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    char err[256];
    if (ig_tokenizer_load(ig_gwf_model_dir, &TOK, err, sizeof(err)) < 0) {
        fprintf(stderr, "tokenizer: %s\n", err);
        return -1;
    }
    STYLE = ig_chat_detect(ig_tokenizer_chat_template(TOK));
    const char *extra[] = {"--name", "tiny", NULL};
    return wt_start(&W, "w", extra);
}

static int teardown(void **state)
{
    wt_stop(&W);
    ig_tokenizer_free(TOK);
    ig_gwf_model_teardown(state);
    return 0;
}

/* What the gateway computes for body: its prompt tokens and block hashes
 * (returned, malloc'ed; *nh of them). */
static uint64_t *gateway_hashes(ig_api_kind_t kind, const char *body, const char *model, int *ntok,
                                int *nh)
{
    ig_api_request_t r;
    ig_api_error_t e;
    assert_int_equal(ig_api_parse(kind, body, strlen(body), &r, &e), 0);
    int *ids, n;
    char err[200] = "";
    assert_int_equal(ig_prefix_prompt_tokens(TOK, STYLE, &r, 0, &ids, &n, err, sizeof(err)), 0);
    ig_api_request_dispose(&r);
    uint64_t *h = malloc(sizeof(uint64_t) * (size_t)(n / BS + 1));
    *nh = ig_prefix_hashes(ig_prefix_seed(model), ids, n, BS, h, n / BS + 1);
    *ntok = n;
    free(ids);
    return h;
}

/* POST /prefix with hashes; the answer's matched_blocks. */
static int worker_matched(const uint64_t *h, int n)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        char hex[17];
        ig_prefix_hash_hex(h[i], hex);
        json_array_append_new(arr, json_string(hex));
    }
    int status;
    json_t *j = wt_post_value(&W, "/prefix", json_pack("{s:o}", "hashes", arr), &status);
    assert_int_equal(status, 200);
    assert_int_equal(json_integer_value(json_object_get(j, "block_size")), BS);
    assert_true(json_is_number(json_object_get(j, "est_wait_s"))); /* its wait, same answer */
    int m = (int)json_integer_value(json_object_get(j, "matched_blocks"));
    assert_int_equal(json_integer_value(json_object_get(j, "matched_tokens")), m * BS);
    json_decref(j);
    return m;
}

/* Sends body to the worker; its usage.prompt_tokens. */
static int worker_serve(const char *path, const char *body)
{
    int status;
    json_t *j = wt_post_json(&W, path, body, &status);
    assert_int_equal(status, 200);
    int n = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    return n;
}

static void check_agreement(ig_api_kind_t kind, const char *path, const char *body)
{
    int ntok, nh;
    uint64_t *h = gateway_hashes(kind, body, "tiny", &ntok, &nh);
    assert_true(nh >= 3);
    assert_int_equal(worker_matched(h, nh), 0); /* nothing cached yet */
    assert_int_equal(worker_serve(path, body), ntok);
    assert_int_equal(worker_matched(h, nh), nh);
    /* another model's hashes of the same tokens: nothing */
    int ntok2, nh2;
    uint64_t *other = gateway_hashes(kind, body, "other-model", &ntok2, &nh2);
    assert_int_equal(worker_matched(other, nh2), 0);
    free(other);
    free(h);
}

static void test_text_prompt(void **state)
{
    char body[4096] = "{\"model\":\"tiny\",\"max_tokens\":2,\"temperature\":0,\"prompt\":\"";
    for (int i = 0; i < 12; i++)
        strcat(body, i % 3 ? "the quick brown fox " : "jumps over a lazy dog, ");
    strcat(body, "\"}");
    check_agreement(IG_API_COMPLETION, "/v1/completions", body);
}

static void test_chat_request(void **state)
{
    char body[4096] = "{\"model\":\"tiny\",\"max_tokens\":2,\"temperature\":0,\"messages\":["
                      "{\"role\":\"system\",\"content\":\"";
    for (int i = 0; i < 8; i++)
        strcat(body, "You are a careful assistant. ");
    strcat(body, "\"},{\"role\":\"user\",\"content\":\"Tell me about the weather.\"}]}");
    check_agreement(IG_API_CHAT, "/v1/chat/completions", body);
}

/* Token ids, and a second prompt that leaves the first in block 2. */
static void test_token_ids_and_divergence(void **state)
{
    char a[2048], b[2048];
    int n = snprintf(a, sizeof(a), "{\"model\":\"tiny\",\"max_tokens\":1,\"prompt\":[");
    int m = snprintf(b, sizeof(b), "{\"model\":\"tiny\",\"max_tokens\":1,\"prompt\":[");
    for (int i = 0; i < 5 * BS + 3; i++) {
        n += snprintf(a + n, sizeof(a) - (size_t)n, "%s%d", i ? "," : "", 300 + i);
        m += snprintf(b + m, sizeof(b) - (size_t)m, "%s%d", i ? "," : "",
                      i == 2 * BS + 5 ? 7 : 300 + i);
    }
    snprintf(a + n, sizeof(a) - (size_t)n, "]}");
    snprintf(b + m, sizeof(b) - (size_t)m, "]}");
    int ntok, nh;
    uint64_t *h = gateway_hashes(IG_API_COMPLETION, a, "tiny", &ntok, &nh);
    assert_int_equal(nh, 5);
    assert_int_equal(worker_serve("/v1/completions", a), 5 * BS + 3);
    assert_int_equal(worker_matched(h, nh), 5);
    uint64_t *h2 = gateway_hashes(IG_API_COMPLETION, b, "tiny", &ntok, &nh);
    assert_int_equal(worker_matched(h2, nh), 2);
    free(h);
    free(h2);
    /* a malformed query is a 400, not a crash */
    int status;
    json_t *j = wt_post_json(&W, "/prefix", "{\"hashes\":[\"xyz\"]}", &status);
    assert_int_equal(status, 400);
    json_decref(j);
    j = wt_post_json(&W, "/prefix", "[1,2]", &status);
    assert_int_equal(status, 400);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_prompt),
        cmocka_unit_test(test_chat_request),
        cmocka_unit_test(test_token_ids_and_divergence),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
