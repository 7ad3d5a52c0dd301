/*
 * Q8_0 and Q4_0 against a NumPy reference of their own: a model quantized
 * at load (ig_model_quantize) runs in the engine; its weights, dequantized,
 * are written as an F32 safetensors model and tests/reference/llama_ref.py
 * runs its float64 pass on them. (ig_dtype_to_f32 dequantizes as gguf-py
 * does, bit for bit: test_gguf_quants_ggufpy.) What is left between the two is
 * the F32 rounding budget (ig_bound_forward) plus the quantization of the
 * activations, which the reference does not do:
 *
 *   a block of 32 activations is off by at most d / 2 = amax / 254 per
 *   element, so a GEMM output by at most (amax / mean|x|) / 254 of
 *   sum |x w|; we take a crest factor amax / mean|x| of 4 (a Gaussian block
 *   of 32 has about 2.6; an RMS-normalised input cannot go far beyond) per
 *   GEMM on the path from the embedding to a logit: q/k/v, o, gate/up and
 *   down in each layer, then lm_head.
 *
 * Like ig_bound_forward it assumes layers do not amplify relative error, so
 * the measured error is printed beside it. The same bound with the weights'
 * own quantization added holds the quantized model's prompt logprobs to the
 * F32 model's (log-softmax moves by at most twice the largest logit
 * change). A weight is off by at most amax / 254 in Q8_0 (d / 2, as for
 * the activations) and amax / 8 in Q4_0 (|d|: the clamp of the side
 * opposite the largest weight, include/infergate/dtype.h), each with the
 * F16 rounding of d on top (2^-11 of d per unit of q: 2^-3 and 2^-8 of it),
 * so with the same crest factor a GEMM's output moves by at most
 * crest * that / amax of sum |x w|. For Q4_0 that worst case is loose
 * (errors of random sign cancel); the measured share is printed.
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

#include "infergate/engine.h"
#include "infergate/error.h"
#include "infergate/kernels.h"
#include "infergate/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NPROMPT 3
static const int prompt_len[NPROMPT] = {5, 13, 22};

typedef struct {
    char name[96];
    const ig_tensor_t *t;
} named_t;

/* Every tensor of the model with its Hugging Face name. */
static int list_tensors(const ig_model_t *m, named_t *out)
{
    const ig_model_config_t *c = ig_model_config(m);
    int n = 0;
    snprintf(out[n].name, 96, "model.embed_tokens.weight"), out[n++].t = ig_model_embed(m);
    snprintf(out[n].name, 96, "model.norm.weight"), out[n++].t = ig_model_final_norm(m);
    if (!c->tie_word_embeddings)
        snprintf(out[n].name, 96, "lm_head.weight"), out[n++].t = ig_model_lm_head(m);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const ig_layer_weights_t *L = ig_model_layer(m, l);
        const struct {
            const char *s;
            const ig_tensor_t *t;
        } w[] = {{"input_layernorm.weight", &L->attn_norm},
                 {"self_attn.q_proj.weight", &L->wq},
                 {"self_attn.k_proj.weight", &L->wk},
                 {"self_attn.v_proj.weight", &L->wv},
                 {"self_attn.o_proj.weight", &L->wo},
                 {"self_attn.q_proj.bias", &L->bq},
                 {"self_attn.k_proj.bias", &L->bk},
                 {"self_attn.v_proj.bias", &L->bv},
                 {"post_attention_layernorm.weight", &L->mlp_norm},
                 {"mlp.gate_proj.weight", &L->w_gate},
                 {"mlp.up_proj.weight", &L->w_up},
                 {"mlp.down_proj.weight", &L->w_down}};
        for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
            if (w[i].t->data == NULL)
                continue;
            snprintf(out[n].name, 96, "model.layers.%d.%s", l, w[i].s);
            out[n++].t = w[i].t;
        }
    }
    return n;
}

static size_t numel(const ig_tensor_t *t)
{
    return (size_t)t->shape[0] * (size_t)(t->ndim > 1 ? t->shape[1] : 1);
}

/* dst/config.json = src's, dst/model.safetensors = every tensor of m in F32. */
static void write_dequantized(const ig_model_t *m, const char *src, const char *dst)
{
    char path[4200], err[256];
    size_t len;
    snprintf(path, sizeof(path), "%s/config.json", src);
    char *cfg = ig_tf_read(path, &len);
    assert_non_null(cfg);
    snprintf(path, sizeof(path), "%s/config.json", dst);
    assert_int_equal(ig_tf_write(path, cfg, len), 0);
    free(cfg);
    named_t *ts = calloc(1024, sizeof(*ts));
    int n = list_tensors(m, ts);
    ig_safetensors_spec_t *sp = calloc((size_t)n, sizeof(*sp));
    for (int i = 0; i < n; i++) {
        sp[i].name = ts[i].name;
        sp[i].dtype = IG_DTYPE_F32;
        sp[i].ndim = ts[i].t->ndim;
        sp[i].shape[0] = ts[i].t->shape[0];
        sp[i].shape[1] = ts[i].t->shape[1];
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", dst);
    ig_safetensors_writer_t *w;
    assert_int_equal(ig_safetensors_writer_open(&w, path, sp, (size_t)n, err, sizeof(err)), 0);
    for (int i = 0; i < n; i++) {
        size_t k = numel(ts[i].t);
        float *f = malloc(k * sizeof(float));
        ig_dtype_to_f32(f, ts[i].t->data, ts[i].t->dtype, k);
        assert_int_equal(ig_safetensors_writer_write(w, f, k * sizeof(float), err, sizeof(err)), 0);
        free(f);
    }
    assert_int_equal(ig_safetensors_writer_close(w, err, sizeof(err)), 0);
    free(sp), free(ts);
}

/* The engine's logits of every prompt position, prompts in one batch. */
/* drop: the model's own copies are freed once the engine is made (as the
 * worker does); the engine must not need them. */
static float *engine_logits(ig_model_t *model, int prompts[NPROMPT][32], int total, int drop)
{
    char err[256];
    int vocab = ig_model_config(model)->vocab_size;
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 2), 0);
    ig_engine_opts_t opts;
    ig_engine_opts_default(&opts);
    opts.block_size = 4;
    opts.kv_blocks = 40;
    opts.max_batched_tokens = 64;
    opts.max_num_seqs = 8;
    ig_engine_t *e;
    if (ig_engine_create(&e, model, be, &opts, err, sizeof(err)) != 0)
        fail_msg("engine: %s", err);
    if (drop) {
        ig_model_drop_owned(model);
        assert_null(ig_model_layer(model, 0)->wq.data);
        assert_null(ig_model_embed(model)->data);
        assert_non_null(ig_model_layer(model, 0)->attn_norm.data); /* mapped: stays */
    }
    float *got = malloc((size_t)total * vocab * sizeof(float));
    assert_int_equal(ig_tbatch_prefill_all(e, &prompts[0][0], 32, prompt_len, NPROMPT, got), 0);
    ig_engine_free(e);
    be->destroy(be);
    return got;
}

/* Largest |log_softmax(a) - log_softmax(b)| over the rows. */
static double logprob_diff(const float *a, const float *b, int rows, int vocab)
{
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        const float *x = a + (size_t)r * vocab, *y = b + (size_t)r * vocab;
        double mx = -INFINITY, my = -INFINITY, sx = 0, sy = 0;
        for (int i = 0; i < vocab; i++)
            mx = fmax(mx, x[i]), my = fmax(my, y[i]);
        for (int i = 0; i < vocab; i++)
            sx += exp(x[i] - mx), sy += exp(y[i] - my);
        double lx = mx + log(sx), ly = my + log(sy);
        for (int i = 0; i < vocab; i++)
            worst = fmax(worst, fabs((x[i] - lx) - (y[i] - ly)));
    }
    return worst;
}

static void check_preset(const char *preset, ig_dtype_t dtype)
{
    char dir[4096], deq[4096], err[256] = "";
    int real = 0;
    assert_int_equal(ig_fixture_model_dir(preset, IG_DTYPE_F32, dir, sizeof(dir), &real), 0);
    ig_model_t *model, *f32;
    if (ig_model_load(&model, dir, err, sizeof(err)) != 0 ||
        ig_model_load(&f32, dir, err, sizeof(err)) != 0)
        fail_msg("loading %s: %s", dir, err);
    size_t before = ig_model_weight_bytes(model);
    if (ig_model_quantize(model, dtype, err, sizeof(err)) != 0)
        fail_msg("quantize: %s", err);
    const ig_model_config_t *cfg = ig_model_config(model);
    assert_int_equal(cfg->dtype, dtype);
    assert_int_equal(ig_model_layer(model, 0)->wq.dtype, dtype);
    assert_int_equal(ig_model_layer(model, 0)->attn_norm.dtype, IG_DTYPE_F32);
    /* 34 (Q8_0) or 18 (Q4_0) of 128 bytes per block, and the F32 norms */
    assert_true(ig_model_weight_bytes(model) < before / (dtype == IG_DTYPE_Q4_0 ? 6 : 3));
    int vocab = cfg->vocab_size;
    assert_int_equal(ig_tf_mkdtemp(deq, sizeof(deq)), 0);
    write_dequantized(model, dir, deq);

    int prompts[NPROMPT][32], total = 0;
    for (int p = 0; p < NPROMPT; p++) {
        ig_tprompt(100 + p, prompt_len[p], vocab, prompts[p]);
        total += prompt_len[p];
    }
    float *ref = ig_ref_logits(deq, &prompts[0][0], 32, prompt_len, NPROMPT, vocab);
    float *got = engine_logits(model, prompts, total, 0);
    float *full = engine_logits(f32, prompts, total, 0);

    double max_logit = 0;
    for (size_t i = 0; i < (size_t)total * vocab; i++)
        max_logit = fmax(max_logit, fabs(ref[i]));
    double scale = 1.0 + max_logit;
    double gemms = 4.0 * cfg->num_hidden_layers + 1, crest = 4.0;
    double act = gemms * crest / 254.0 * scale;
    double wq = dtype == IG_DTYPE_Q4_0 ? (1.0 / 8) * (1 + 0x1p-8) : (1.0 / 254) * (1 + 0x1p-3);
    double tol = ig_bound_forward(cfg, prompt_len[NPROMPT - 1], scale) + act;
    double e = ig_max_abs_diff(got, ref, (size_t)total * vocab);
    double lp = logprob_diff(got, full, total, vocab),
           lp_tol = 2 * (tol + gemms * crest * wq * scale);
    printf("# %s %s: max abs logit error vs the dequantized reference %.3g, bound %.3g "
           "(%.2g%%); logprobs vs the F32 model %.3g, bound %.3g (%.2g%%)\n",
           preset, ig_dtype_name(dtype), e, tol, 100 * e / tol, lp, lp_tol, 100 * lp / lp_tol);
    assert_true(e <= tol);
    assert_true(lp <= lp_tol);
    /* and the quantization is visible: the quantized logits are not the F32 ones */
    assert_true(ig_max_abs_diff(got, full, (size_t)total * vocab) > 0);

    float *dropped = engine_logits(model, prompts, total, 1);
    assert_memory_equal(dropped, got, (size_t)total * vocab * sizeof(float));

    free(ref), free(got), free(full), free(dropped);
    ig_model_free(model);
    ig_model_free(f32);
    ig_tf_rmtree(deq);
    ig_tf_rmtree(dir);
}

static void test_tiny_q8_0(void **state)
{
    check_preset("tiny", IG_DTYPE_Q8_0);
}

static void test_gqa_q8_0(void **state)
{
    check_preset("gqa", IG_DTYPE_Q8_0);
}

static void test_tiny_q4_0(void **state)
{
    check_preset("tiny", IG_DTYPE_Q4_0);
}

static void test_gqa_q4_0(void **state)
{
    check_preset("gqa", IG_DTYPE_Q4_0);
}

int main(void)
{
    if (!ig_ref_have_numpy()) {
        fprintf(stderr, "# SKIP: /usr/bin/python3 has no numpy (apt-get install python3-numpy)\n");
        return IG_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_q8_0),
        cmocka_unit_test(test_gqa_q8_0),
        cmocka_unit_test(test_tiny_q4_0),
        cmocka_unit_test(test_gqa_q4_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
