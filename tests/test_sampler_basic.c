/* Sampler: greedy, filters, seeds, logprobs and the stop rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "infergate/error.h"
#include "infergate/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 1000

static float *make_logits(uint64_t seed)
{
    float *l = malloc(sizeof(float) * V);
    ig_rng_t r;
    ig_rng_seed(&r, seed);
    for (int i = 0; i < V; i++)
        l[i] = (float)(ig_rng_uniform(&r) * 8.0 - 4.0);
    return l;
}

static int ref_argmax(const float *l)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

/* The error bound of a logprob l[t] - log sum_i exp(l[i] - m) computed in
 * float (fp_bound.h): each term's exponent l[i] - m and its product by
 * log2 e are rounded (u |l[i] - m| each, as relative error of the term),
 * the sampler's exp polynomial is within 2u, and the sum of V positive
 * terms adds gamma_V; log turns z's relative error into an absolute one.
 * Then the store of the logprob to float: u |logprob|. */
static double logprob_bound(const float *l, double logprob)
{
    double m = l[ref_argmax(l)], spread = 0;
    for (int i = 0; i < V; i++)
        spread = fmax(spread, m - l[i]);
    return ig_bound_of(1.0, V + 2 + 2 * spread + fabs(logprob), 0);
}

/* A sampler of vocab tokens, and p set to the defaults. */
static ig_sampler_t *new_sampler(int vocab, ig_sampling_params_t *p)
{
    ig_sampler_t *s;
    assert_int_equal(ig_sampler_create(&s, vocab), 0);
    ig_sampling_params_default(p);
    return s;
}

static void test_greedy_and_logprobs(void **state)
{
    ig_sampling_params_t p;
    ig_sampler_t *s = new_sampler(V, &p);
    float *l = make_logits(1);
    p.temperature = 0;
    ig_rng_t rng;
    ig_rng_seed(&rng, 7);
    ig_sample_t out;
    assert_int_equal(ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 5, &out), 0);
    assert_int_equal(out.token, ref_argmax(l));

    /* logprob = l - logsumexp(l), computed here independently in double. */
    double m = l[ref_argmax(l)], z = 0;
    for (int i = 0; i < V; i++)
        z += exp(l[i] - m);
    double lse = m + log(z);
    assert_true(fabs(out.logprob - (l[out.token] - lse)) <= logprob_bound(l, l[out.token] - lse));
    assert_int_equal(out.ntop, 5);
    assert_int_equal(out.top_tokens[0], out.token);
    for (int i = 1; i < 5; i++)
        assert_true(out.top_logprobs[i] <= out.top_logprobs[i - 1]);
    /* The 5th best really is the 5th: exactly 4 logits exceed it. */
    int above = 0;
    for (int i = 0; i < V; i++)
        above += l[i] > l[out.top_tokens[4]];
    assert_int_equal(above, 4);

    /* Prompt logprobs of a given token. */
    ig_sample_t lp;
    assert_int_equal(ig_sampler_logprobs(s, l, 17, 20, &lp), 0);
    assert_int_equal(lp.token, 17);
    assert_true(fabs(lp.logprob - (l[17] - lse)) <= logprob_bound(l, l[17] - lse));
    assert_int_equal(lp.ntop, 20);
    assert_int_equal(ig_sampler_logprobs(s, l, V, 0, &lp), IG_EINVAL);
    free(l);
    ig_sampler_free(s);
}

static void test_filters(void **state)
{
    ig_sampler_t *s;
    assert_int_equal(ig_sampler_create(&s, V), 0);
    float *l = make_logits(2);
    int best = ref_argmax(l);
    ig_sampling_params_t p;
    ig_rng_t rng;
    ig_rng_seed(&rng, 3);
    ig_sample_t out;

    /* top_k = 1 and a tiny top_p both collapse to greedy at any temperature. */
    ig_sampling_params_default(&p);
    p.temperature = 5.0f;
    p.top_k = 1;
    for (int i = 0; i < 50; i++) {
        ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 0, &out);
        assert_int_equal(out.token, best);
    }
    ig_sampling_params_default(&p);
    p.top_p = 1e-6f;
    for (int i = 0; i < 50; i++) {
        ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 0, &out);
        assert_int_equal(out.token, best);
    }
    /* top_k = 10: every draw is among the 10 best. */
    ig_sampling_params_default(&p);
    p.top_k = 10;
    p.temperature = 10.0f;
    float kth;
    {
        ig_sample_t t;
        ig_sampler_logprobs(s, l, 0, 10, &t);
        kth = l[t.top_tokens[9]];
    }
    int distinct = 0;
    char seen[V] = {0};
    for (int i = 0; i < 500; i++) {
        ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 0, &out);
        assert_true(l[out.token] >= kth);
        if (!seen[out.token]++)
            distinct++;
    }
    assert_true(distinct > 3); /* at T=10 it really samples */

    /* min_p = 0.5: only tokens with p >= 0.5 * p_max. */
    ig_sampling_params_default(&p);
    p.min_p = 0.5f;
    float lmax = l[best];
    for (int i = 0; i < 300; i++) {
        ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 0, &out);
        assert_true(expf(l[out.token] - lmax) >= 0.5f - 1e-6f);
    }
    /* top_p = 0.9 at T = 1.5: every draw lies in the nucleus computed here
     * by a full sort, and draws reach deep into it. */
    ig_sampling_params_default(&p);
    p.top_p = 0.9f;
    p.temperature = 1.5f;
    int order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    for (int i = 0; i < V; i++) /* selection sort, descending: a test may be slow */
        for (int j = i + 1; j < V; j++)
            if (l[order[j]] > l[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    double z = 0, cum = 0;
    for (int i = 0; i < V; i++)
        z += exp((l[i] - l[order[0]]) / 1.5);
    char in_nucleus[V] = {0};
    int nucleus = 0;
    for (int i = 0; i < V && cum < 0.9 * z; i++) {
        cum += exp((l[order[i]] - l[order[0]]) / 1.5);
        in_nucleus[order[i]] = 1;
        nucleus++;
    }
    int deepest = 0;
    for (int i = 0; i < 3000; i++) {
        ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, -1, &out);
        if (!in_nucleus[out.token])
            fail_msg("token %d is outside the nucleus of %d", out.token, nucleus);
        for (int k = 0; k < nucleus; k++)
            if (order[k] == out.token && k > deepest)
                deepest = k;
    }
    assert_true(nucleus > 100);
    assert_true(deepest > nucleus / 2);
    free(l);
    ig_sampler_free(s);
}

static void test_distribution(void **state)
{
    /* Four tokens with known probabilities; frequencies within 5 sigma. */
    ig_sampling_params_t p;
    ig_sampler_t *s = new_sampler(4, &p);
    float l[4] = {logf(0.1f), logf(0.2f), logf(0.3f), logf(0.4f)};
    ig_rng_t rng;
    ig_rng_seed(&rng, 11);
    int counts[4] = {0};
    const int N = 20000;
    ig_sample_t out;
    for (int i = 0; i < N; i++) {
        ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 0, &out);
        counts[out.token]++;
    }
    for (int i = 0; i < 4; i++) {
        double pr = 0.1 * (i + 1), sd = sqrt(N * pr * (1 - pr));
        assert_true(fabs(counts[i] - N * pr) < 5 * sd);
    }
    /* top_p = 0.65 keeps {0.4, 0.3} (cum 0.7): tokens 2 and 3 only, 3:4 ratio. */
    p.top_p = 0.65f;
    memset(counts, 0, sizeof(counts));
    for (int i = 0; i < N; i++) {
        ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 0, &out);
        counts[out.token]++;
    }
    assert_int_equal(counts[0] + counts[1], 0);
    double p3 = 0.4 / 0.7, sd = sqrt(N * p3 * (1 - p3));
    assert_true(fabs(counts[3] - N * p3) < 5 * sd);
    ig_sampler_free(s);
}

static void test_seed_determinism(void **state)
{
    ig_sampling_params_t p;
    ig_sampler_t *s = new_sampler(V, &p);
    float *l = make_logits(5);
    p.temperature = 1.5f;
    p.top_p = 0.9f;
    int a[64], b[64], c[64];
    ig_rng_t r1, r2, r3;
    ig_rng_seed(&r1, 1234);
    ig_rng_seed(&r2, 1234);
    ig_rng_seed(&r3, 999);
    ig_rng_t other;
    ig_rng_seed(&other, 42);
    ig_sample_t out;
    for (int i = 0; i < 64; i++) {
        ig_sampler_sample(s, l, &p, &r1, NULL, 0, 0, 0, &out);
        a[i] = out.token;
        /* another request shares the sampler between the two draws */
        ig_sampler_sample(s, l, &p, &other, NULL, 0, 0, 3, &out);
    }
    for (int i = 0; i < 64; i++) {
        ig_sampler_sample(s, l, &p, &r2, NULL, 0, 0, 0, &out);
        b[i] = out.token;
        ig_sampler_sample(s, l, &p, &r3, NULL, 0, 0, 0, &out);
        c[i] = out.token;
    }
    assert_memory_equal(a, b, sizeof(a));
    assert_memory_not_equal(a, c, sizeof(a));
    free(l);
    ig_sampler_free(s);
}

static void test_repetition_penalty(void **state)
{
    ig_sampling_params_t p;
    ig_sampler_t *s = new_sampler(4, &p);
    float l[4] = {1.0f, 2.0f, 1.9f, -1.0f};
    p.temperature = 0;
    p.repetition_penalty = 1.2f;
    ig_rng_t rng;
    ig_rng_seed(&rng, 1);
    ig_sample_t out;
    int hist[] = {1, 1, 1}; /* 2.0 / 1.2 = 1.67 < 1.9: token 2 wins */
    ig_sampler_sample(s, l, &p, &rng, hist, 3, 0, 1, &out);
    assert_int_equal(out.token, 2);
    /* logprobs stay raw: token 1 is still the top one reported */
    assert_int_equal(out.top_tokens[0], 1);
    /* without history the penalty does nothing */
    ig_sampler_sample(s, l, &p, &rng, NULL, 0, 0, 0, &out);
    assert_int_equal(out.token, 1);
    /* a negative logit is multiplied: token 3 goes further down */
    float l2[4] = {-1.0f, -1.1f, -5.0f, -6.0f};
    int h2[] = {0};
    ig_sampler_sample(s, l2, &p, &rng, h2, 1, 0, 0, &out);
    assert_int_equal(out.token, 1);
    ig_sampler_free(s);
}

static void test_presence_frequency(void **state)
{
    ig_sampling_params_t p;
    ig_sampler_t *s = new_sampler(4, &p);
    float l[4] = {2.0f, 1.9f, 1.0f, 0.0f};
    p.temperature = 0;
    ig_rng_t rng;
    ig_rng_seed(&rng, 1);
    ig_sample_t out;
    /* prompt [0, 0, 0] then output [0]: only the output counts */
    int hist[] = {0, 0, 0, 0};
    p.presence_penalty = 0.05f;
    ig_sampler_sample(s, l, &p, &rng, hist, 4, 3, -1, &out);
    assert_int_equal(out.token, 0); /* 2.0 - 0.05 > 1.9 */
    p.presence_penalty = 0.2f;
    ig_sampler_sample(s, l, &p, &rng, hist, 4, 3, -1, &out);
    assert_int_equal(out.token, 1); /* 2.0 - 0.2 < 1.9 */
    /* the prompt alone is not penalised */
    ig_sampler_sample(s, l, &p, &rng, hist, 4, 4, -1, &out);
    assert_int_equal(out.token, 0);
    /* frequency scales with the count: 0.06 x 1 keeps token 0, x 2 not */
    p.presence_penalty = 0;
    p.frequency_penalty = 0.06f;
    int h1[] = {0};
    ig_sampler_sample(s, l, &p, &rng, h1, 1, 0, -1, &out);
    assert_int_equal(out.token, 0);
    int h2[] = {0, 2, 0};
    ig_sampler_sample(s, l, &p, &rng, h2, 3, 0, -1, &out);
    assert_int_equal(out.token, 1);
    /* a negative presence penalty encourages repeats */
    p.frequency_penalty = 0;
    p.presence_penalty = -1.5f;
    int h3[] = {2};
    ig_sampler_sample(s, l, &p, &rng, h3, 1, 0, -1, &out);
    assert_int_equal(out.token, 2);
    ig_sampler_free(s);
}

static void test_stop_rule(void **state)
{
    int eos[] = {2};
    int stop_ids[] = {7, 9};
    ig_stop_rule_t r = {
        .max_tokens = 3, .eos = eos, .neos = 1, .stop_ids = stop_ids, .nstop_ids = 2};
    assert_int_equal(ig_stop_check(&r, 5, 1), IG_FINISH_NONE);
    assert_int_equal(ig_stop_check(&r, 2, 1), IG_FINISH_STOP);
    assert_int_equal(ig_stop_check(&r, 9, 1), IG_FINISH_STOP);
    assert_int_equal(ig_stop_check(&r, 5, 3), IG_FINISH_LENGTH);
    r.ignore_eos = 1;
    assert_int_equal(ig_stop_check(&r, 2, 1), IG_FINISH_NONE);
    assert_int_equal(ig_stop_check(&r, 7, 1), IG_FINISH_STOP);
    assert_string_equal(ig_finish_reason(IG_FINISH_LENGTH), "length");
    assert_null(ig_finish_reason(IG_FINISH_NONE));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_logprobs), cmocka_unit_test(test_filters),
        cmocka_unit_test(test_distribution),        cmocka_unit_test(test_seed_determinism),
        cmocka_unit_test(test_repetition_penalty),  cmocka_unit_test(test_presence_frequency),
        cmocka_unit_test(test_stop_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
