/*
 * The engine's logits against tests/reference/llama_ref.py, an independent
 * NumPy forward pass reading the same safetensors file: every prompt
 * position of three prompts prefilled in one batch, then the same prompts
 * fed as a shorter prefill followed by batched decode steps, on the tiny and
 * gqa and qwen3 presets, on models with llama3 and linear rope scaling, on
 * gqa in bf16 and tiny in f16. Max abs error must stay within ig_bound_forward() (fp_bound.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "fp_bound.h"

#include "engine_fixture.h"
#include "files.h"
#include "model_fixture.h"
#include "numpy_ref.h"
#include "skip.h"

#include "../kernels/cpu/cpu_internal.h"
#include "infergate/engine.h"
#include "infergate/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PY "/usr/bin/python3"
#define NPROMPT 3
static const int prompt_len[NPROMPT] = {5, 13, 22};
#define DECODE_STEPS 4

static void make_prompts(int vocab, int prompts[NPROMPT][32])
{
    unsigned x = 12345;
    for (int p = 0; p < NPROMPT; p++)
        for (int i = 0; i < prompt_len[p]; i++) {
            x = x * 1103515245u + 12345u;
            prompts[p][i] = (int)((x >> 8) % (unsigned)vocab);
        }
}

static void check_model(const char *preset, ig_dtype_t dtype)
{
    char dir[4096], err[256] = "";
    int real = 0;
    assert_int_equal(ig_fixture_model_dir(preset, dtype, dir, sizeof(dir), &real), 0);
    ig_model_t *model;
    int rc = ig_model_load(&model, dir, err, sizeof(err));
    if (rc != 0)
        fail_msg("loading %s: %s", dir, err);
    const ig_model_config_t *cfg = ig_model_config(model);
    int vocab = cfg->vocab_size;

    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 2), 0);
    ig_engine_opts_t opts;
    ig_engine_opts_default(&opts);
    opts.block_size = 4; /* many blocks per prompt: the paging is exercised */
    opts.kv_blocks = 40;
    opts.max_batched_tokens = 64;
    opts.max_num_seqs = 8;
    ig_engine_t *e;
    rc = ig_engine_create(&e, model, be, &opts, err, sizeof(err));
    if (rc != 0)
        fail_msg("engine: %s", err);

    int prompts[NPROMPT][32];
    make_prompts(vocab, prompts);
    int total = 0;
    for (int p = 0; p < NPROMPT; p++)
        total += prompt_len[p];
    float *ref = ig_ref_logits(dir, &prompts[0][0], 32, prompt_len, NPROMPT, vocab);
    float *got = malloc((size_t)total * vocab * sizeof(float));

    /* 1. Every prompt position in one batch. */
    assert_int_equal(ig_tbatch_prefill_all(e, &prompts[0][0], 32, prompt_len, NPROMPT, got), 0);
    double err1 = ig_max_abs_diff(got, ref, (size_t)total * vocab);
    assert_int_equal(ig_engine_blocks_free(e), opts.kv_blocks);

    /* 2. Prefill all but the last DECODE_STEPS tokens, then decode them
     * one step at a time for all prompts together. Blocks are taken in
     * turn, so each sequence's blocks are scattered through the cache. */
    double err2 = 0;
    ig_tseq_t seqs[NPROMPT];
    memset(seqs, 0, sizeof(seqs));
    ig_tbatch_t *b = malloc(sizeof(*b));
    ig_tbatch_init(b);
    for (int p = 0; p < NPROMPT; p++)
        assert_int_equal(ig_tbatch_add(b, e, &seqs[p], prompts[p], prompt_len[p] - DECODE_STEPS,
                                       prompt_len[p] - DECODE_STEPS - 1),
                         0);
    assert_int_equal(ig_tbatch_run(b, e, got), 0);
    int off = 0;
    for (int p = 0; p < NPROMPT; p++) {
        off += prompt_len[p];
        int row = off - DECODE_STEPS - 1; /* the last prefilled position */
        double d = ig_max_abs_diff(got + (size_t)p * vocab, ref + (size_t)row * vocab, vocab);
        err2 = d > err2 ? d : err2;
    }
    for (int step = 0; step < DECODE_STEPS; step++) {
        ig_tbatch_init(b);
        for (int p = 0; p < NPROMPT; p++)
            assert_int_equal(ig_tbatch_add(b, e, &seqs[p], &prompts[p][seqs[p].pos], 1, 0), 0);
        assert_int_equal(ig_tbatch_run(b, e, got), 0);
        off = 0;
        for (int p = 0; p < NPROMPT; p++) {
            int row = off + prompt_len[p] - DECODE_STEPS + step;
            double d = ig_max_abs_diff(got + (size_t)p * vocab, ref + (size_t)row * vocab, vocab);
            err2 = d > err2 ? d : err2;
            off += prompt_len[p];
        }
    }
    double max_logit = 0;
    for (size_t i = 0; i < (size_t)total * vocab; i++)
        max_logit = fmax(max_logit, fabs(ref[i]));
    int max_ctx = 0;
    for (int p = 0; p < NPROMPT; p++)
        max_ctx = prompt_len[p] > max_ctx ? prompt_len[p] : max_ctx;
    /* BF16 weights on a CPU with vdpbf16ps take BF16-rounded activations
     * (kernels/cpu/gemm16.c), whose bound is wider. */
    int bf16x = dtype == IG_DTYPE_BF16 && ig__cpu_bf16_dot();
    double tol = bf16x ? ig_bound_forward_bf16x(cfg, max_ctx, 1.0 + max_logit)
                       : ig_bound_forward(cfg, max_ctx, 1.0 + max_logit);
    printf("# %s %s%s (%s model): max abs error prefill %.3g, prefill+decode %.3g; "
           "bound %.3g (max |logit| %.3g): %.2g%% of it\n",
           preset, ig_dtype_name(dtype), bf16x ? " (bf16 activations)" : "",
           real ? "mkmodel" : "fixture", err1, err2, tol, max_logit, 100 * fmax(err1, err2) / tol);
    assert_true(err1 <= tol);
    assert_true(err2 <= tol);

    /* Logits that are all zero would match nothing; make sure they vary. */
    double spread = 0;
    for (int i = 1; i < vocab; i++)
        spread = fmax(spread, fabs(ref[i] - ref[0]));
    assert_true(spread > 1e-2);

    for (int p = 0; p < NPROMPT; p++)
        ig_tseq_release(&seqs[p], e);
    free(b), free(got), free(ref);
    ig_engine_free(e);
    be->destroy(be);
    ig_model_free(model);
    ig_tf_rmtree(dir);
}


static void test_tiny(void **state)
{
    check_model("tiny", IG_DTYPE_F32);
}

static void test_gqa(void **state)
{
    check_model("gqa", IG_DTYPE_F32);
}

/* Qwen3: per-head q/k RMSNorm, head_dim 64 with a 256-wide model. */
static void test_qwen3(void **state)
{
    check_model("qwen3", IG_DTYPE_F32);
}

static void test_llama3_rope(void **state)
{
    check_model("llama3", IG_DTYPE_F32);
}

static void test_linear_rope(void **state)
{
    check_model("linear", IG_DTYPE_F32);
}

/* BF16 through the widening path (IG_CPU_BF16_DOT=0): the F32 bound. */
static void test_gqa_bf16_widened(void **state)
{
    int was = ig__cpu_bf16_dot();
    assert_int_equal(ig__cpu_set_bf16_dot(0), 0);
    check_model("gqa", IG_DTYPE_BF16);
    assert_int_equal(ig__cpu_set_bf16_dot(was), 0);
}

static void test_gqa_bf16(void **state)
{
    check_model("gqa", IG_DTYPE_BF16);
}

static void test_tiny_f16(void **state)
{
    check_model("tiny", IG_DTYPE_F16);
}

int main(void)
{
    if (!ig_ref_have_numpy()) {
        fprintf(stderr, "# SKIP: " PY " has no numpy (apt-get install python3-numpy)\n");
        return IG_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),        cmocka_unit_test(test_gqa),
        cmocka_unit_test(test_llama3_rope), cmocka_unit_test(test_linear_rope),
        cmocka_unit_test(test_gqa_bf16),    cmocka_unit_test(test_gqa_bf16_widened),
        cmocka_unit_test(test_tiny_f16),    cmocka_unit_test(test_qwen3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
