/*
 * The engine with its KV cache in F16 or BF16 (ig_engine_opts_t.kv_dtype)
 * against the same engine with an F32 cache, on the tiny and gqa presets:
 *   - every prompt position's logits and those of batched decode steps stay
 *     within kv16_bound() (below) of the F32 cache's;
 *   - greedy text is the same (tiny, gqa, small; 24 tokens) wherever the F32
 *     logits' top two are farther apart than twice that bound;
 *   - a memory budget holds twice the blocks in 16 bits (and the bytes
 *     follow the dtype);
 *   - a backend that cannot hold a 16-bit cache refuses it at create with a
 *     message that names the option; a dtype that is not f32, f16 or bf16
 *     is refused; the user spellings parse.
 * Batch invariance with a 16-bit cache is in test_engine_batch, prefix
 * caching with one in test_engine_prefix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "engine_fixture.h"
#include "files.h"
#include "model_fixture.h"

#include "infergate/engine.h"
#include "infergate/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the score magnitudes the bound needs --------------------------------- */

/*
 * The bound. Storing K and V in 16 bits rounds each element once: relative
 * error at most u16 = 2^-11 (F16) or 2^-8 (BF16), or, for an F16 value
 * below 2^-14 (subnormal), an absolute 2^-25 = u16 * 2^-14. Through one
 * layer's attention, first order:
 *   - a score s_t = scale q . k_t moves by at most u16 A_t, with
 *     A_t = scale sum_i |q_i| max(|k_ti|, 2^-14);
 *   - softmax turns that into a relative change of each weight p_t of at
 *     most 2 u16 max_t A_t (the shift cancels, the normalisation doubles);
 *   - the output sum_t p_t v_t moves by (2 u16 A + u16) sum_t p_t |v_t|,
 *     the second term V's own rounding.
 * So layer l adds (2 A_l + 1) u16 of relative error at its attention
 * output, A_l the largest A_t of the layer over every row and head of the
 * run, which the test measures on the F32 run by wrapping the backend's
 * attention. From there the error travels to the logits as every other
 * per-layer error does in ig_bound_forward (fp_bound.h: first order, times
 * 1 + max |logit|, assuming the layers do not amplify relative error), and
 * each of the two runs has its own F32 roundings. With IG_BOUND_C's
 * margin of 2:
 *   |logit16 - logit32| <= 2 ig_bound_forward(ctx, 1 + max|logit|)
 *                          + 2 u16 sum_l (2 A_l + 1) (1 + max|logit|).
 * Like ig_bound_forward it is not a theorem, so the test prints the
 * measured error beside it (docs/engine.md has the figures).
 */
#define MAX_LAYERS 16

static ig_backend_t g_orig;       /* the CPU backend's own table */
static int g_measure;             /* record score magnitudes on the next attentions */
static double g_amax[MAX_LAYERS]; /* A_l */

static int measuring_attention(ig_backend_t *be, float *out, const float *q,
                               const ig_kv_layout_t *kv, int layer, const ig_attn_batch_t *b,
                               int n_heads, float scale)
{
    if (g_measure && kv->dtype == IG_DTYPE_F32 && layer < MAX_LAYERS) {
        int hd = kv->head_dim, bs = kv->block_size, group = n_heads / kv->n_kv_heads;
        const float *kc = kv->k;
        for (int s = 0; s < b->nseq; s++) {
            int qn = b->q_start[s + 1] - b->q_start[s];
            const int *table = b->block_tables + (size_t)s * b->max_blocks;
            for (int r = 0; r < qn; r++) {
                int pos = b->ctx_len[s] - qn + r;
                for (int h = 0; h < n_heads; h++) {
                    const float *qv = q + ((size_t)(b->q_start[s] + r) * n_heads + h) * hd;
                    for (int t = 0; t <= pos; t++) {
                        size_t at =
                            ((((size_t)layer * kv->num_blocks + table[t / bs]) * kv->n_kv_heads +
                              h / group) *
                                 bs +
                             t % bs) *
                            hd;
                        double a = 0;
                        for (int i = 0; i < hd; i++)
                            a += fabs(qv[i]) * fmax(fabs(kc[at + i]), 0x1p-14);
                        g_amax[layer] = fmax(g_amax[layer], a * scale);
                    }
                }
            }
        }
    }
    return g_orig.attention(be, out, q, kv, layer, b, n_heads, scale);
}

static double unit16(ig_dtype_t dt)
{
    return dt == IG_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
}

static double kv16_bound(const ig_model_config_t *c, ig_dtype_t dt, int ctx, double max_logit,
                         double *kv_part)
{
    double units = 0;
    for (int l = 0; l < c->num_hidden_layers && l < MAX_LAYERS; l++)
        units += 2 * g_amax[l] + 1;
    *kv_part = IG_BOUND_C * unit16(dt) * units * (1 + max_logit);
    return 2 * ig_bound_forward(c, ctx, 1 + max_logit) + *kv_part;
}

/* ---- fixtures ------------------------------------------------------------ */

typedef struct {
    char dir[4096];
    ig_model_t *model;
    ig_backend_t *be;
    ig_engine_t *e32, *e16;
    int vocab;
} pair_t;

static ig_engine_t *engine_of(pair_t *p, ig_dtype_t dt, int kv_blocks)
{
    char err[256] = "";
    ig_engine_opts_t o;
    ig_engine_opts_default(&o);
    o.kv_blocks = kv_blocks;
    o.block_size = 4; /* every prompt spans several blocks */
    o.max_batched_tokens = 256;
    o.max_num_seqs = 8;
    o.kv_dtype = dt;
    ig_engine_t *e = NULL;
    if (ig_engine_create(&e, p->model, p->be, &o, err, sizeof(err)) != 0)
        fail_msg("engine (%s): %s", ig_engine_kv_dtype_name(dt), err);
    assert_int_equal(ig_engine_kv_dtype(e), dt);
    return e;
}

static void pair_open(pair_t *p, const char *preset, ig_dtype_t dt)
{
    char err[256] = "";
    memset(p, 0, sizeof(*p));
    assert_int_equal(ig_fixture_model_dir(preset, IG_DTYPE_F32, p->dir, sizeof(p->dir), NULL), 0);
    if (ig_model_load(&p->model, p->dir, err, sizeof(err)) != 0)
        fail_msg("load: %s", err);
    p->vocab = ig_model_config(p->model)->vocab_size;
    assert_int_equal(ig_backend_cpu_create(&p->be, 2), 0);
    g_orig = *p->be;
    p->be->attention = measuring_attention;
    p->e32 = engine_of(p, IG_DTYPE_F32, 128);
    p->e16 = engine_of(p, dt, 128);
    memset(g_amax, 0, sizeof(g_amax));
}

static void pair_close(pair_t *p)
{
    ig_engine_free(p->e32);
    ig_engine_free(p->e16);
    p->be->destroy(p->be);
    ig_model_free(p->model);
    ig_tf_rmtree(p->dir);
}

static double max_abs(const float *v, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(v[i]));
    return m;
}

/* ---- logits within the bound --------------------------------------------- */

#define NPROMPT 3
#define STEPS 4
static const int plen[NPROMPT] = {5, 13, 22};

/* The three prompts in one batch with every position's logits, then STEPS
 * batched decode steps fed the F32 run's greedy tokens (so both engines
 * see the same tokens); logits (rows, vocab) of each engine. */
static int run_prompts(pair_t *p, ig_engine_t *e, int measure, float *logits, int *next)
{
    ig_tseq_t seq[NPROMPT];
    memset(seq, 0, sizeof(seq));
    ig_tbatch_t *b = malloc(sizeof(*b));
    int prompts[NPROMPT][32], rows = 0;
    for (int s = 0; s < NPROMPT; s++)
        ig_tprompt(40 + s, plen[s], p->vocab, prompts[s]);
    g_measure = measure;
    ig_tbatch_init(b);
    for (int s = 0; s < NPROMPT; s++)
        assert_int_equal(ig_tbatch_add(b, e, &seq[s], prompts[s], plen[s], 0), 0);
    assert_int_equal(ig_tbatch_run(b, e, logits), 0);
    for (int s = 0; s < NPROMPT; s++) {
        rows += plen[s];
        if (measure)
            next[s] = ig_argmax(logits + (size_t)(rows - 1) * p->vocab, p->vocab);
    }
    for (int step = 0; step < STEPS; step++) {
        ig_tbatch_init(b);
        for (int s = 0; s < NPROMPT; s++)
            assert_int_equal(ig_tbatch_add(b, e, &seq[s], &next[step * NPROMPT + s], 1, 0), 0);
        float *out = logits + (size_t)rows * p->vocab;
        assert_int_equal(ig_tbatch_run(b, e, out), 0);
        for (int s = 0; s < NPROMPT && measure && step + 1 < STEPS; s++)
            next[(step + 1) * NPROMPT + s] = ig_argmax(out + (size_t)s * p->vocab, p->vocab);
        rows += NPROMPT;
    }
    g_measure = 0;
    for (int s = 0; s < NPROMPT; s++)
        ig_tseq_release(&seq[s], e);
    free(b);
    return rows;
}

static void check_logits(const char *preset, ig_dtype_t dt)
{
    pair_t p;
    pair_open(&p, preset, dt);
    int total = plen[0] + plen[1] + plen[2] + STEPS * NPROMPT;
    float *l32 = malloc((size_t)total * p.vocab * sizeof(float));
    float *l16 = malloc((size_t)total * p.vocab * sizeof(float));
    int next[STEPS * NPROMPT];
    assert_int_equal(run_prompts(&p, p.e32, 1, l32, next), total);
    assert_int_equal(run_prompts(&p, p.e16, 0, l16, next), total);
    size_t n = (size_t)total * p.vocab;
    double mx = max_abs(l32, n), kv_part;
    double err = ig_max_abs_diff(l16, l32, n);
    double bound = kv16_bound(ig_model_config(p.model), dt, 22 + STEPS, mx, &kv_part);
    printf("# %s, %s cache: max logit diff %.3g, bound %.3g (%.1f%% of it; KV part %.3g, "
           "A_0 %.2f, max |logit| %.2f)\n",
           preset, ig_engine_kv_dtype_name(dt), err, bound, 100 * err / bound, kv_part, g_amax[0],
           mx);
    assert_true(err <= bound);
    assert_true(err > 0); /* the cache really is 16-bit */
    free(l32), free(l16);
    pair_close(&p);
}

static void test_logits_f16(void **state)
{
    check_logits("tiny", IG_DTYPE_F16);
    check_logits("gqa", IG_DTYPE_F16);
}

static void test_logits_bf16(void **state)
{
    check_logits("tiny", IG_DTYPE_BF16);
    check_logits("gqa", IG_DTYPE_BF16);
}

/* ---- greedy text -------------------------------------------------------- */

#define GSTEPS 24
#define GPLEN 9

/* Greedy decode of one prompt: tokens and each step's logits. */
static void greedy(pair_t *p, ig_engine_t *e, int measure, int *toks, float *logits)
{
    ig_tseq_t s = {0};
    ig_tbatch_t *b = malloc(sizeof(*b));
    int prompt[GPLEN];
    ig_tprompt(77, GPLEN, p->vocab, prompt);
    g_measure = measure;
    ig_tbatch_init(b);
    assert_int_equal(ig_tbatch_add(b, e, &s, prompt, GPLEN, GPLEN - 1), 0);
    assert_int_equal(ig_tbatch_run(b, e, logits), 0);
    for (int step = 0; step < GSTEPS; step++) {
        const float *l = logits + (size_t)step * p->vocab;
        toks[step] = ig_argmax(l, p->vocab);
        if (step + 1 == GSTEPS)
            break;
        ig_tbatch_init(b);
        assert_int_equal(ig_tbatch_add(b, e, &s, &toks[step], 1, 0), 0);
        assert_int_equal(ig_tbatch_run(b, e, logits + (size_t)(step + 1) * p->vocab), 0);
    }
    g_measure = 0;
    ig_tseq_release(&s, e);
    free(b);
}

/* The gap between the largest and the second largest of n values. */
static double top2_gap(const float *v, int n)
{
    double a = -INFINITY, b = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (v[i] > a) {
            b = a;
            a = v[i];
        } else if (v[i] > b) {
            b = v[i];
        }
    }
    return a - b;
}

static void check_greedy(const char *preset, ig_dtype_t dt)
{
    pair_t p;
    pair_open(&p, preset, dt);
    float *l32 = malloc((size_t)GSTEPS * p.vocab * sizeof(float));
    float *l16 = malloc((size_t)GSTEPS * p.vocab * sizeof(float));
    int t32[GSTEPS], t16[GSTEPS];
    greedy(&p, p.e32, 1, t32, l32);
    greedy(&p, p.e16, 0, t16, l16);
    double kv_part;
    double bound = kv16_bound(ig_model_config(p.model), dt, GPLEN + GSTEPS,
                              max_abs(l32, (size_t)GSTEPS * p.vocab), &kv_part);
    int same = 0;
    double min_gap = INFINITY;
    while (same < GSTEPS && t16[same] == t32[same]) {
        min_gap = fmin(min_gap, top2_gap(l32 + (size_t)same * p.vocab, p.vocab));
        same++;
    }
    printf("# %s, %s cache: greedy text equal for %d of %d tokens (smallest top-2 gap %.3g, "
           "2x bound %.3g)\n",
           preset, ig_engine_kv_dtype_name(dt), same, GSTEPS, min_gap, 2 * bound);
    if (same < GSTEPS) {
        /* Only a near tie may flip: each logit moved by at most the bound. */
        double gap = top2_gap(l32 + (size_t)same * p.vocab, p.vocab);
        printf("#   differs at token %d: F32 top-2 gap %.3g\n", same, gap);
        assert_true(gap <= 2 * bound);
    }
    free(l32), free(l16);
    pair_close(&p);
}

static void test_greedy_text(void **state)
{
    check_greedy("tiny", IG_DTYPE_F16);
    check_greedy("tiny", IG_DTYPE_BF16);
    check_greedy("gqa", IG_DTYPE_F16);
    check_greedy("gqa", IG_DTYPE_BF16);
    check_greedy("small", IG_DTYPE_F16);
    check_greedy("small", IG_DTYPE_BF16);
}

/* ---- sizing ------------------------------------------------------------- */

static size_t g_free, g_total;

static int fixed_mem_info(ig_backend_t *be, size_t *free_bytes, size_t *total_bytes)
{
    *free_bytes = g_free;
    *total_bytes = g_total;
    return 0;
}

/* The same memory budget (the share of free memory a backend that reports
 * it leaves for the cache) holds twice the blocks in 16 bits. */
static void test_budget_holds_twice_the_blocks(void **state)
{
    char err[256];
    ig_tengine_t t;
    assert_int_equal(ig_tengine_model(&t, "tiny", 1, err, sizeof(err)), 0);
    t.be->mem_info = fixed_mem_info;
    g_total = (size_t)10 << 20;
    g_free = (size_t)5 << 20; /* budget 5 - 0.1 * 10 = 4 MiB */
    const ig_model_config_t *c = ig_model_config(t.model);
    size_t per32 = (size_t)2 * c->num_hidden_layers * c->num_key_value_heads * 16 * c->head_dim * 4;
    int blocks[3];
    ig_dtype_t dts[3] = {IG_DTYPE_F32, IG_DTYPE_F16, IG_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        ig_engine_opts_t o;
        ig_engine_opts_default(&o);
        o.max_num_seqs = 32;
        o.kv_dtype = dts[i];
        ig_engine_t *e = NULL;
        if (ig_engine_create(&e, t.model, t.be, &o, err, sizeof(err)) != 0)
            fail_msg("engine: %s", err);
        blocks[i] = ig_engine_num_blocks(e);
        size_t per = i == 0 ? per32 : per32 / 2;
        assert_int_equal(ig_engine_kv_bytes(e), per * (size_t)blocks[i]);
        assert_int_equal(blocks[i], (int)(((size_t)4 << 20) / per));
        ig_engine_free(e);
    }
    printf("# 4 MiB of cache: %d blocks in f32, %d in f16, %d in bf16\n", blocks[0], blocks[1],
           blocks[2]);
    assert_int_equal(blocks[1], 2 * blocks[0]);
    assert_int_equal(blocks[2], 2 * blocks[0]);

    /* kv_blocks given: the same count, half the bytes. */
    ig_engine_opts_t o;
    ig_engine_opts_default(&o);
    o.kv_blocks = 10;
    o.kv_dtype = IG_DTYPE_BF16;
    ig_engine_t *e = NULL;
    assert_int_equal(ig_engine_create(&e, t.model, t.be, &o, err, sizeof(err)), 0);
    assert_int_equal(ig_engine_num_blocks(e), 10);
    assert_int_equal(ig_engine_kv_bytes(e), 10 * per32 / 2);
    ig_engine_free(e);
    ig_tengine_close(&t);
    ig_tf_rmtree(t.dir);
}

/* ---- refusals ------------------------------------------------------------- */

static void test_refusals(void **state)
{
    char err[256];
    ig_tengine_t t;
    assert_int_equal(ig_tengine_model(&t, "tiny", 1, err, sizeof(err)), 0);
    assert_int_equal(t.be->kv_dtypes,
                     (1u << IG_DTYPE_F32) | (1u << IG_DTYPE_F16) | (1u << IG_DTYPE_BF16));
    ig_engine_opts_t o;
    ig_engine_opts_default(&o);
    o.kv_blocks = 4;
    ig_engine_t *e = NULL;

    /* A backend whose kernels take F32 only (the CUDA backend's kv_dtypes). */
    t.be->kv_dtypes = 1u << IG_DTYPE_F32;
    o.kv_dtype = IG_DTYPE_F16;
    err[0] = 0;
    assert_int_equal(ig_engine_create(&e, t.model, t.be, &o, err, sizeof(err)), IG_ENOTSUP);
    assert_null(e);
    printf("# %s\n", err);
    assert_non_null(strstr(err, "f16"));
    assert_non_null(strstr(err, "kv_dtype"));
    assert_non_null(strstr(err, "--kv-dtype"));
    o.kv_dtype = IG_DTYPE_F32;
    assert_int_equal(ig_engine_create(&e, t.model, t.be, &o, err, sizeof(err)), 0);
    ig_engine_free(e);
    e = NULL;

    /* Not a KV dtype at all. */
    t.be->kv_dtypes = 0;
    o.kv_dtype = IG_DTYPE_Q8_0;
    err[0] = 0;
    assert_int_equal(ig_engine_create(&e, t.model, t.be, &o, err, sizeof(err)), IG_EINVAL);
    assert_null(e);
    assert_true(strlen(err) > 0);

    ig_dtype_t dt;
    assert_int_equal(ig_engine_kv_dtype_parse("f16", &dt), 0);
    assert_int_equal(dt, IG_DTYPE_F16);
    assert_int_equal(ig_engine_kv_dtype_parse("bf16", &dt), 0);
    assert_int_equal(dt, IG_DTYPE_BF16);
    assert_int_equal(ig_engine_kv_dtype_parse("f32", &dt), 0);
    assert_int_equal(dt, IG_DTYPE_F32);
    assert_int_equal(ig_engine_kv_dtype_parse("fp8", &dt), IG_EINVAL);
    assert_int_equal(ig_engine_kv_dtype_parse("F16", &dt), IG_EINVAL);
    assert_string_equal(ig_engine_kv_dtype_name(IG_DTYPE_BF16), "bf16");
    ig_tengine_close(&t);
    ig_tf_rmtree(t.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_f16),  cmocka_unit_test(test_logits_bf16),
        cmocka_unit_test(test_greedy_text), cmocka_unit_test(test_budget_holds_twice_the_blocks),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
