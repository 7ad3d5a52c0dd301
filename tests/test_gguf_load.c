/*
 * GGUF models against the same model in Hugging Face layout: a model made
 * by mkmodel is written as GGUF (ig_mkmodel_to_gguf, what `mkmodel --format
 * gguf` runs) and loaded back through ig_model_load on the .gguf path:
 *   - the config and every tensor's bytes are the safetensors ones (attn_q
 *     and attn_k permuted for llama.cpp in the file, permuted back at load),
 *     for llama (tiny), qwen2 (gqa: biases) and qwen3 (q/k norms);
 *   - the engine's logits are bit-identical on the two (F32 and BF16), and a
 *     prompt alone gets the bits it gets in a batch (BF16, Q8_0 too);
 *   - a Q8_0 GGUF holds exactly ig_model_quantize's blocks;
 *   - the tokenizer rebuilt from tokenizer.ggml.* encodes a corpus to the
 *     same ids and decodes them to the same text as tokenizer.json, for a
 *     SentencePiece vocabulary (tiny) and a byte-level BPE one (gqa's).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "engine_fixture.h"
#include "files.h"
#include "model_fixture.h"

#include "infergate/engine.h"
#include "infergate/error.h"
#include "infergate/gguf.h"
#include "infergate/kernels.h"
#include "infergate/mkmodel.h"
#include "infergate/tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void gguf_of(const char *dir, char *path, size_t len, ig_dtype_t quant)
{
    char err[512];
    snprintf(path, len, "%s/model-%s.gguf", dir, ig_dtype_name(quant));
    if (ig_mkmodel_to_gguf(dir, path, quant, err, sizeof(err)) != 0)
        fail_msg("to gguf: %s", err);
}

static size_t nbytes(const ig_tensor_t *t)
{
    return ig_dtype_bytes(t->dtype, (size_t)t->shape[0] * (t->ndim > 1 ? (size_t)t->shape[1] : 1));
}

static void same_tensor(const ig_tensor_t *a, const ig_tensor_t *b, const char *what, int l)
{
    if (a->ndim != b->ndim || a->shape[0] != b->shape[0] ||
        (a->ndim > 1 && a->shape[1] != b->shape[1]))
        fail_msg("layer %d %s: shapes differ", l, what);
    /* vectors are F32 in the file: compare values */
    if (a->dtype != b->dtype) {
        size_t n = (size_t)a->shape[0];
        float *x = malloc(n * 4), *y = malloc(n * 4);
        ig_dtype_to_f32(x, a->data, a->dtype, n);
        ig_dtype_to_f32(y, b->data, b->dtype, n);
        assert_memory_equal(x, y, n * 4);
        free(x), free(y);
        return;
    }
    if (memcmp(a->data, b->data, nbytes(a)) != 0)
        fail_msg("layer %d %s: bytes differ", l, what);
}

static void same_weights(const ig_model_t *a, const ig_model_t *b)
{
    const ig_model_config_t *x = ig_model_config(a), *y = ig_model_config(b);
    assert_int_equal(x->hidden_size, y->hidden_size);
    assert_int_equal(x->intermediate_size, y->intermediate_size);
    assert_int_equal(x->num_hidden_layers, y->num_hidden_layers);
    assert_int_equal(x->num_attention_heads, y->num_attention_heads);
    assert_int_equal(x->num_key_value_heads, y->num_key_value_heads);
    assert_int_equal(x->head_dim, y->head_dim);
    assert_int_equal(x->vocab_size, y->vocab_size);
    assert_int_equal(x->tie_word_embeddings, y->tie_word_embeddings);
    assert_int_equal(x->bos_token_id, y->bos_token_id);
    /* the same ends of sequence (GGUF: eos_token_id, then eot_token_id) */
    assert_int_equal(x->n_eos, y->n_eos);
    for (int i = 0; i < x->n_eos; i++) {
        int found = 0;
        for (int j = 0; j < y->n_eos; j++)
            found |= x->eos_token_ids[i] == y->eos_token_ids[j];
        if (!found)
            fail_msg("eos %d of the safetensors model is not one of the GGUF's",
                     x->eos_token_ids[i]);
    }
    assert_true(x->rms_norm_eps == y->rms_norm_eps);
    assert_true(x->rope_theta == y->rope_theta);
    assert_int_equal(x->rope_scaling, y->rope_scaling);
    assert_int_equal(x->dtype, y->dtype);
    same_tensor(ig_model_embed(a), ig_model_embed(b), "embed", -1);
    same_tensor(ig_model_final_norm(a), ig_model_final_norm(b), "norm", -1);
    same_tensor(ig_model_lm_head(a), ig_model_lm_head(b), "lm_head", -1);
    for (int l = 0; l < x->num_hidden_layers; l++) {
        const ig_layer_weights_t *p = ig_model_layer(a, l), *q = ig_model_layer(b, l);
        same_tensor(&p->attn_norm, &q->attn_norm, "attn_norm", l);
        same_tensor(&p->wq, &q->wq, "wq", l);
        same_tensor(&p->wk, &q->wk, "wk", l);
        same_tensor(&p->wv, &q->wv, "wv", l);
        same_tensor(&p->wo, &q->wo, "wo", l);
        const ig_tensor_t *opt[][2] = {{&p->bq, &q->bq},
                                       {&p->bk, &q->bk},
                                       {&p->bv, &q->bv},
                                       {&p->q_norm, &q->q_norm},
                                       {&p->k_norm, &q->k_norm}};
        for (size_t i = 0; i < sizeof(opt) / sizeof(opt[0]); i++) {
            assert_int_equal(opt[i][0]->data == NULL, opt[i][1]->data == NULL);
            if (opt[i][0]->data != NULL)
                same_tensor(opt[i][0], opt[i][1], "bias or q/k norm", l);
        }
        same_tensor(&p->mlp_norm, &q->mlp_norm, "mlp_norm", l);
        same_tensor(&p->w_gate, &q->w_gate, "gate", l);
        same_tensor(&p->w_up, &q->w_up, "up", l);
        same_tensor(&p->w_down, &q->w_down, "down", l);
    }
}

/* Logits of two prompts' every position, in one batch (only = -1), or of
 * prompt `only` alone. */
static float *logits_of(ig_model_t *m, int *total, int only)
{
    char err[256];
    static const int len[2] = {7, 19};
    int vocab = ig_model_config(m)->vocab_size, prompts[2][32];
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 2), 0);
    ig_engine_opts_t o;
    ig_engine_opts_default(&o);
    o.block_size = 4, o.kv_blocks = 16, o.max_batched_tokens = 64, o.max_num_seqs = 4;
    ig_engine_t *e;
    if (ig_engine_create(&e, m, be, &o, err, sizeof(err)) != 0)
        fail_msg("engine: %s", err);
    ig_tseq_t seqs[2];
    memset(seqs, 0, sizeof(seqs));
    ig_tbatch_t *b = malloc(sizeof(*b));
    ig_tbatch_init(b);
    *total = 0;
    for (int p = 0; p < 2; p++) {
        ig_tprompt(7 + p, len[p], vocab, prompts[p]);
        if (only >= 0 && p != only)
            continue;
        assert_int_equal(ig_tbatch_add(b, e, &seqs[p], prompts[p], len[p], 0), 0);
        *total += len[p];
    }
    float *out = malloc((size_t)*total * vocab * sizeof(float));
    assert_int_equal(ig_tbatch_run(b, e, out), 0);
    for (int p = 0; p < 2; p++)
        ig_tseq_release(&seqs[p], e);
    free(b);
    ig_engine_free(e);
    be->destroy(be);
    return out;
}

static float *logits(ig_model_t *m, int *total)
{
    return logits_of(m, total, -1);
}

/* Batch invariance on the GGUF model: the second prompt alone gets the
 * bits it got beside the first (its rows follow the first's 7). */
static void alone_same_as_batched(ig_model_t *m, const float *batched)
{
    int n, vocab = ig_model_config(m)->vocab_size;
    float *alone = logits_of(m, &n, 1);
    assert_int_equal(n, 19);
    assert_memory_equal(alone, batched + (size_t)7 * vocab, (size_t)n * vocab * sizeof(float));
    free(alone);
}

/* A preset stored in dt (F32 + quant Q8_0 or Q4_0: quantized in the GGUF,
 * ig_model_quantize on the safetensors side; F32: none) loads from GGUF
 * with the same weights and the same logits, bit for bit, alone and in a
 * batch. */
static void check_model(const char *preset, ig_dtype_t dt, ig_dtype_t quant)
{
    char dir[4096], path[4200], err[512];
    int real = 0;
    assert_int_equal(ig_fixture_model_dir(preset, dt, dir, sizeof(dir), &real), 0);
    if (!real && strcmp(preset, "tiny") != 0) {
        ig_tf_rmtree(dir);
        skip(); /* the other presets need the mkmodel binary */
    }
    gguf_of(dir, path, sizeof(path), quant);
    ig_model_t *hf, *gg;
    assert_int_equal(ig_model_load(&hf, dir, err, sizeof(err)), 0);
    if (quant != IG_DTYPE_F32)
        assert_int_equal(ig_model_quantize(hf, quant, err, sizeof(err)), 0);
    if (ig_model_load(&gg, path, err, sizeof(err)) != 0)
        fail_msg("gguf load: %s", err);
    if (quant != IG_DTYPE_F32)
        assert_int_equal(ig_model_layer(gg, 0)->w_up.dtype, quant);
    same_weights(hf, gg);
    int n1, n2, vocab = ig_model_config(hf)->vocab_size;
    float *a = logits(hf, &n1), *b = logits(gg, &n2);
    assert_memory_equal(a, b, (size_t)n1 * vocab * sizeof(float));
    alone_same_as_batched(gg, b);
    free(a), free(b);
    ig_model_free(hf);
    ig_model_free(gg);
    ig_tf_rmtree(dir);
}

static void test_f32_same_as_safetensors(void **state)
{
    check_model("tiny", IG_DTYPE_F32, IG_DTYPE_F32);
}

static void test_bf16_same_as_safetensors(void **state)
{
    check_model("tiny", IG_DTYPE_BF16, IG_DTYPE_F32);
}

static void test_q8_0_same_as_quantize(void **state)
{
    check_model("tiny", IG_DTYPE_F32, IG_DTYPE_Q8_0);
}

static void test_q4_0_same_as_quantize(void **state)
{
    check_model("tiny", IG_DTYPE_F32, IG_DTYPE_Q4_0);
}

/* Q4_K_M as llama-quantize mixes it: gqa's 4 layers give Q6_K to the
 * output matrix and to attn_v / ffn_down of layer 3 (use_more_bits), Q4_K
 * elsewhere; the file loads, and a sequence gets the same logits alone and
 * in a batch. (test_gguf_llamacpp: llama-server's greedy text.) */
static void test_q4_k_m_mix(void **state)
{
    char dir[4096], path[4200], err[512];
    int real = 0;
    assert_int_equal(ig_fixture_model_dir("gqa", IG_DTYPE_F32, dir, sizeof(dir), &real), 0);
    if (!real) {
        ig_tf_rmtree(dir);
        skip();
    }
    gguf_of(dir, path, sizeof(path), IG_DTYPE_Q4_K);
    ig_model_t *gg;
    if (ig_model_load(&gg, path, err, sizeof(err)) != 0)
        fail_msg("gguf load: %s", err);
    assert_int_equal(ig_model_lm_head(gg)->dtype, IG_DTYPE_Q6_K);
    assert_int_equal(ig_model_embed(gg)->dtype, IG_DTYPE_Q4_K);
    assert_int_equal(ig_model_layer(gg, 0)->wq.dtype, IG_DTYPE_Q4_K);
    assert_int_equal(ig_model_layer(gg, 0)->wv.dtype, IG_DTYPE_Q4_K);
    assert_int_equal(ig_model_layer(gg, 3)->wv.dtype, IG_DTYPE_Q6_K);
    assert_int_equal(ig_model_layer(gg, 3)->w_down.dtype, IG_DTYPE_Q6_K);
    assert_int_equal(ig_model_layer(gg, 3)->w_up.dtype, IG_DTYPE_Q4_K);
    int n, vocab = ig_model_config(gg)->vocab_size;
    float *b = logits(gg, &n);
    for (size_t i = 0; i < (size_t)n * vocab; i++)
        assert_true(isfinite(b[i]));
    alone_same_as_batched(gg, b);
    free(b);
    ig_model_free(gg);
    ig_tf_rmtree(dir);
}

/* llama.cpp's "qwen2": q/k/v biases, q and k not permuted. */
static void test_qwen2_same_as_safetensors(void **state)
{
    check_model("gqa", IG_DTYPE_F32, IG_DTYPE_F32);
}

/* llama.cpp's "qwen3": attn_q_norm / attn_k_norm, head_dim 64 in a 256-wide
 * model. */
static void test_qwen3_same_as_safetensors(void **state)
{
    check_model("qwen3", IG_DTYPE_F32, IG_DTYPE_F32);
}

static const char *const corpus[] = {
    "Once upon a time, there was a little girl named Lily.",
    "  two  spaces, a tab\tand a newline\nhere",
    "numbers 12345 and 3.14159, punctuation!?;:",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🙂",
    "<s> looks special; </s> too",
    "",
    "a",
    "It's what we'll do; they're DONE.",
};

static void same_tokenizer(const char *dir, const char *gguf)
{
    char err[512];
    ig_tokenizer_t *a, *b;
    if (ig_tokenizer_load(dir, &a, err, sizeof(err)) != 0)
        fail_msg("hf tokenizer: %s", err);
    if (ig_tokenizer_load(gguf, &b, err, sizeof(err)) != 0)
        fail_msg("gguf tokenizer: %s", err);
    assert_int_equal(ig_tokenizer_style(a), ig_tokenizer_style(b));
    assert_int_equal(ig_tokenizer_vocab_size(a), ig_tokenizer_vocab_size(b));
    for (size_t i = 0; i < sizeof(corpus) / sizeof(corpus[0]); i++) {
        for (unsigned flags = 0; flags <= IG_TOKENIZER_ADD_BOS; flags += IG_TOKENIZER_ADD_BOS) {
            ig_tokvec_t x, y;
            ig_tokvec_init(&x);
            ig_tokvec_init(&y);
            assert_int_equal(ig_tokenizer_encode(a, corpus[i], strlen(corpus[i]), flags, &x), 0);
            assert_int_equal(ig_tokenizer_encode(b, corpus[i], strlen(corpus[i]), flags, &y), 0);
            if (x.len != y.len || (x.len > 0 && memcmp(x.ids, y.ids, x.len * sizeof(int32_t)) != 0))
                fail_msg("\"%s\" (flags %u): %zu ids from tokenizer.json, %zu from the GGUF",
                         corpus[i], flags, x.len, y.len);
            char *da = NULL, *db = NULL;
            size_t la, lb;
            assert_int_equal(ig_tokenizer_decode(a, x.ids, x.len, 0, &da, &la), 0);
            assert_int_equal(ig_tokenizer_decode(b, y.ids, y.len, 0, &db, &lb), 0);
            assert_string_equal(da, db);
            free(da), free(db);
            ig_tokvec_dispose(&x);
            ig_tokvec_dispose(&y);
        }
    }
    ig_tokenizer_free(a);
    ig_tokenizer_free(b);
}

static void test_tokenizer_sentencepiece(void **state)
{
    char dir[4096], path[4200];
    int real = 0;
    assert_int_equal(ig_fixture_model_dir("tiny", IG_DTYPE_F32, dir, sizeof(dir), &real), 0);
    if (!real)
        skip(); /* the fixture writes no tokenizer without the mkmodel binary */
    gguf_of(dir, path, sizeof(path), IG_DTYPE_F32);
    same_tokenizer(dir, path);
    ig_tf_rmtree(dir);
}

/* A llama-shaped model carrying gqa's byte-level (Qwen2-style) tokenizer. */
static void test_tokenizer_byte_level(void **state)
{
    char gqa[4096], dir[4096], path[4200], a[4300], b[4300];
    int real = 0;
    assert_int_equal(ig_fixture_model_dir("gqa", IG_DTYPE_F32, gqa, sizeof(gqa), &real), 0);
    if (!real)
        skip();
    ig_fixture_spec_t spec;
    assert_int_equal(ig_fixture_preset("tiny", &spec), 0);
    spec.vocab = 8192;
    spec.hidden = 256;
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    assert_int_equal(ig_fixture_write(&spec, dir), 0);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++) {
        size_t len;
        snprintf(a, sizeof(a), "%s/%s", gqa, files[i]);
        snprintf(b, sizeof(b), "%s/%s", dir, files[i]);
        char *data = ig_tf_read(a, &len);
        assert_non_null(data);
        assert_int_equal(ig_tf_write(b, data, len), 0);
        free(data);
    }
    gguf_of(dir, path, sizeof(path), IG_DTYPE_F32);
    ig_gguf_t *g;
    char err[256];
    assert_int_equal(ig_gguf_open(&g, path, err, sizeof(err)), 0);
    const char *s;
    size_t len;
    assert_int_equal(ig_gguf_get_str(g, "tokenizer.ggml.model", &s, &len, err, sizeof(err)), 0);
    assert_true(len == 4 && memcmp(s, "gpt2", 4) == 0);
    assert_int_equal(ig_gguf_get_str(g, "tokenizer.ggml.pre", &s, &len, err, sizeof(err)), 0);
    assert_true(len == 5 && memcmp(s, "qwen2", 5) == 0);
    ig_gguf_close(g);
    same_tokenizer(dir, path);
    ig_tf_rmtree(dir);
    ig_tf_rmtree(gqa);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_same_as_safetensors),
        cmocka_unit_test(test_bf16_same_as_safetensors),
        cmocka_unit_test(test_q8_0_same_as_quantize),
        cmocka_unit_test(test_q4_0_same_as_quantize),
        cmocka_unit_test(test_q4_k_m_mix),
        cmocka_unit_test(test_qwen2_same_as_safetensors),
        cmocka_unit_test(test_qwen3_same_as_safetensors),
        cmocka_unit_test(test_tokenizer_sentencepiece),
        cmocka_unit_test(test_tokenizer_byte_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
