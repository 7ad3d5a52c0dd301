/*
 * `infergate worker --quantize q8_0` (and q4_0) as a real process: it loads
 * the fixture's F32 model, quantizes it at load and serves greedy
 * completions (the tokens counted, the same text twice); the same request
 * to a worker without the flag also answers, and the two agree on the first
 * greedy token's logprob within the Q8_0 logprob bound of
 * test_model_quant_reference (checked loosely here: 0.5 nats; Q4_0's bound
 * is checked there, not here). An unknown --quantize value is a usage
 * error: the process exits non-zero without serving.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker_proc.h"

#include <math.h>

static wproc_t Q8, Q4, PLAIN;

static int setup(void **state)
{
    if (ig_gwf_model_setup(state) < 0)
        return -1;
    const char *q[] = {"--quantize", "q8_0", NULL};
    const char *q4[] = {"--quantize", "q4_0", NULL};
    if (wt_start(&Q8, "q8", q) < 0 || wt_start(&Q4, "q4", q4) < 0)
        return -1;
    return wt_start(&PLAIN, "plain", NULL);
}

static int teardown(void **state)
{
    wt_stop(&Q8);
    wt_stop(&Q4);
    wt_stop(&PLAIN);
    ig_gwf_model_teardown(state);
    return 0;
}

static const char *BODY = "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0,"
                          "\"logprobs\":1}";

/* The text and the first token's logprob of a greedy completion. */
static char *complete(const wproc_t *w, double *lp0)
{
    int st;
    json_t *j = wt_post_json(w, "/v1/completions", BODY, &st);
    assert_non_null(j);
    if (st != 200)
        fail_msg("status %d: %s", st, json_dumps(j, 0));
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 8);
    json_t *lps = json_object_get(json_object_get(c, "logprobs"), "token_logprobs");
    *lp0 = json_is_array(lps) ? json_number_value(json_array_get(lps, 0)) : NAN;
    char *text = strdup(json_string_value(json_object_get(c, "text")));
    json_decref(j);
    return text;
}

static void test_quantized_worker_serves(void **state)
{
    double a, b, c;
    char *t1 = complete(&Q8, &a), *t2 = complete(&Q8, &b), *t3 = complete(&PLAIN, &c);
    assert_string_equal(t1, t2); /* greedy: deterministic */
    assert_true(strlen(t1) > 0);
    print_message("# q8_0: \"%s\" (first logprob %.4f); f32: \"%s\" (%.4f)\n", t1, a, t3, c);
    if (!isnan(a) && !isnan(c))
        assert_true(fabs(a - c) < 0.5);
    free(t1), free(t2), free(t3);
    t1 = complete(&Q4, &a), t2 = complete(&Q4, &b);
    assert_string_equal(t1, t2);
    assert_true(strlen(t1) > 0);
    print_message("# q4_0: \"%s\" (first logprob %.4f)\n", t1, a);
    free(t1), free(t2);
}

static void test_unknown_quantize_refused(void **state)
{
    wproc_t bad;
    const char *q[] = {"--quantize", "q2_k", NULL};
    assert_int_equal(wt_start_on(&bad, "bad", NULL, q, IG_PROC_PIPE_ERR), -1);
    int st = wt_wait_exit(&bad, 5000);
    assert_true(st != 0);
    wt_stop(&bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantized_worker_serves),
        cmocka_unit_test(test_unknown_quantize_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
