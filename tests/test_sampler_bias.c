/* Sampler: OpenAI's logit_bias (added to the logits before the penalties,
 * outside the logprobs) with greedy, temperature and the filters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "infergate/sampler.h"

#include <math.h>
#include <string.h>

#define V 64

static void fill(float *l)
{
    for (int i = 0; i < V; i++)
        l[i] = (float)(i % 7) * 0.5f; /* best: ids 6, 13, ... (3.0) */
}

static void bias(ig_sampling_params_t *p, int token, float b)
{
    p->logit_bias[p->nlogit_bias].token = token;
    p->logit_bias[p->nlogit_bias].bias = b;
    p->nlogit_bias++;
}

/* What every case starts from: a sampler over V ids, default parameters, a
 * seeded generator, and the logits (the case fills them). */
typedef struct {
    ig_sampler_t *s;
    ig_sampling_params_t p;
    ig_sample_t out;
    ig_rng_t rng;
    float l[V];
} fx_t;

static void fx_start(fx_t *f, uint64_t seed)
{
    assert_int_equal(ig_sampler_create(&f->s, V), 0);
    ig_sampling_params_default(&f->p);
    ig_rng_seed(&f->rng, seed);
}

static void test_force_and_ban(void **state)
{
    (void)state;
    fx_t f;
    fill(f.l);
    fx_start(&f, 3);

    /* greedy without a bias: the first of the best */
    f.p.temperature = 0;
    ig_sampler_sample(f.s, f.l, &f.p, &f.rng, NULL, 0, 0, 2, &f.out);
    assert_int_equal(f.out.token, 6);
    /* +100 forces the least likely id, at any temperature and with filters;
     * the logprob stays the model's (raw), not the biased one */
    bias(&f.p, 0, 100.0f);
    ig_sampler_sample(f.s, f.l, &f.p, &f.rng, NULL, 0, 0, 2, &f.out);
    assert_int_equal(f.out.token, 0);
    assert_true(f.out.logprob < -3.0f);
    assert_int_equal(f.out.top_tokens[0], 6);
    const float temps[] = {0.7f, 1.0f, 2.0f};
    for (int t = 0; t < 3; t++) {
        f.p.temperature = temps[t];
        f.p.top_k = t == 1 ? 5 : 0;
        f.p.top_p = t == 2 ? 0.9f : 1.0f;
        for (int k = 0; k < 200; k++) {
            ig_sampler_sample(f.s, f.l, &f.p, &f.rng, NULL, 0, 0, -1, &f.out);
            assert_int_equal(f.out.token, 0);
        }
    }
    /* -100 on every best id bans them: greedy takes the next best (2.5) */
    ig_sampling_params_default(&f.p);
    f.p.temperature = 0;
    for (int i = 6; i < V; i += 7)
        bias(&f.p, i, -100.0f);
    ig_sampler_sample(f.s, f.l, &f.p, &f.rng, NULL, 0, 0, -1, &f.out);
    assert_int_equal(f.out.token, 5);
    /* at temperature 1 a banned id is never drawn */
    f.p.temperature = 1.0f;
    for (int k = 0; k < 2000; k++) {
        ig_sampler_sample(f.s, f.l, &f.p, &f.rng, NULL, 0, 0, -1, &f.out);
        assert_int_not_equal(f.out.token % 7, 6);
    }
    /* an id outside the vocab is skipped, not written */
    ig_sampling_params_default(&f.p);
    f.p.temperature = 0;
    bias(&f.p, V + 5, 100.0f);
    bias(&f.p, -1, 100.0f);
    ig_sampler_sample(f.s, f.l, &f.p, &f.rng, NULL, 0, 0, -1, &f.out);
    assert_int_equal(f.out.token, 6);
    /* the logits given are not modified */
    float again[V];
    fill(again);
    assert_memory_equal(f.l, again, sizeof(f.l));
    ig_sampler_free(f.s);
}

/* A small bias moves the distribution by exp(bias): +ln 3 on one of two
 * equal ids makes it three times as likely. */
static void test_shift(void **state)
{
    (void)state;
    fx_t f;
    for (int i = 0; i < V; i++)
        f.l[i] = -1000.0f;
    f.l[10] = f.l[20] = 0.0f;
    fx_start(&f, 11);
    bias(&f.p, 20, logf(3.0f));
    int n20 = 0, n = 20000;
    for (int k = 0; k < n; k++) {
        ig_sampler_sample(f.s, f.l, &f.p, &f.rng, NULL, 0, 0, -1, &f.out);
        assert_true(f.out.token == 10 || f.out.token == 20);
        n20 += f.out.token == 20;
    }
    /* p = 0.75; 4 standard deviations of a binomial over n draws */
    double sd = sqrt(0.75 * 0.25 / n);
    assert_true(fabs((double)n20 / n - 0.75) < 4 * sd);
    ig_sampler_free(f.s);
}

/* The bias comes first, the penalties then apply to the biased logits:
 * logit + bias - (count * frequency + (count > 0) * presence). */
static void test_with_penalties(void **state)
{
    (void)state;
    fx_t f;
    for (int i = 0; i < V; i++)
        f.l[i] = 0.0f;
    fx_start(&f, 1);
    f.p.temperature = 0;
    bias(&f.p, 3, 5.0f);
    bias(&f.p, 4, 2.0f);
    int hist[] = {9, 3, 3};       /* prompt [9], generated [3, 3] */
    f.p.frequency_penalty = 1.4f; /* 5 - 2 x 1.4 = 2.2 > 2 */
    ig_sampler_sample(f.s, f.l, &f.p, &f.rng, hist, 3, 1, -1, &f.out);
    assert_int_equal(f.out.token, 3);
    f.p.presence_penalty = 0.3f; /* 5 - 2.8 - 0.3 = 1.9 < 2 */
    ig_sampler_sample(f.s, f.l, &f.p, &f.rng, hist, 3, 1, -1, &f.out);
    assert_int_equal(f.out.token, 4);
    ig_sampler_free(f.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_force_and_ban),
        cmocka_unit_test(test_shift),
        cmocka_unit_test(test_with_penalties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
