/* model.h: a model written here by hand (config.json + safetensors with a
 * known value in every element) loads with the exact config, every tensor
 * bound to the right name with the right shape and values, for Llama, Qwen2
 * (q/k/v biases) and Mistral, tied and untied, F32/F16/BF16, and with the
 * config variants real checkpoints use. */
#include "model_testutil.h"

#include "infergate/safetensors.h"

typedef struct {
    const char *arch;
    int dim, hidden, layers, heads, kv, head_dim, vocab;
    int tied, bias;
    ig_dtype_t dtype;
    int extra; /* also write a tensor the loader must ignore */
} fx_t;

#define FX_MAX 64
static char names[FX_MAX][96];
static int nnames;

/* The value of element i of the t-th tensor written: exact in every dtype. */
static float pattern(int t, size_t i)
{
    /* integers of magnitude <= 125: exact even in BF16's 8 bits; the
     * offset 37 * t tells tensors of the same shape apart */
    return (float)(((size_t)t * 37 + i) % 251) - 125.0f;
}

static void add_spec(ig_safetensors_spec_t *s, const char *name, ig_dtype_t dt, int ndim,
                     int64_t d0, int64_t d1)
{
    assert_true(nnames < FX_MAX);
    snprintf(names[nnames], sizeof(names[0]), "%s", name);
    s[nnames] = (ig_safetensors_spec_t){.name = names[nnames], .dtype = dt, .ndim = ndim};
    s[nnames].shape[0] = d0;
    s[nnames].shape[1] = d1;
    nnames++;
}

static void fx_write(const fx_t *f)
{
    int hd = f->head_dim ? f->head_dim : f->dim / f->heads;
    int64_t q = (int64_t)f->heads * hd, kv = (int64_t)f->kv * hd;
    ig_safetensors_spec_t specs[FX_MAX];
    char name[96];
    nnames = 0;
    add_spec(specs, "model.embed_tokens.weight", f->dtype, 2, f->vocab, f->dim);
    for (int l = 0; l < f->layers; l++) {
#define L(suffix, nd, a, b)                                                                        \
    snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);                                 \
    add_spec(specs, name, f->dtype, nd, a, b)
        L("input_layernorm.weight", 1, f->dim, 0);
        L("self_attn.q_proj.weight", 2, q, f->dim);
        L("self_attn.k_proj.weight", 2, kv, f->dim);
        L("self_attn.v_proj.weight", 2, kv, f->dim);
        L("self_attn.o_proj.weight", 2, f->dim, q);
        if (f->bias) {
            L("self_attn.q_proj.bias", 1, q, 0);
            L("self_attn.k_proj.bias", 1, kv, 0);
            L("self_attn.v_proj.bias", 1, kv, 0);
        }
        L("post_attention_layernorm.weight", 1, f->dim, 0);
        L("mlp.gate_proj.weight", 2, f->hidden, f->dim);
        L("mlp.up_proj.weight", 2, f->hidden, f->dim);
        L("mlp.down_proj.weight", 2, f->dim, f->hidden);
        if (f->extra) {
            L("self_attn.rotary_emb.inv_freq", 1, hd / 2, 0);
        }
#undef L
    }
    add_spec(specs, "model.norm.weight", f->dtype, 1, f->dim, 0);
    if (!f->tied)
        add_spec(specs, "lm_head.weight", f->dtype, 2, f->vocab, f->dim);

    char *path = tu_path(tu_dir, "model.safetensors");
    char err[256];
    ig_safetensors_writer_t *w = NULL;
    assert_int_equal(ig_safetensors_writer_open(&w, path, specs, (size_t)nnames, err, sizeof(err)),
                     0);
    for (int t = 0; t < nnames; t++) {
        size_t n = (size_t)specs[t].shape[0] * (size_t)(specs[t].ndim > 1 ? specs[t].shape[1] : 1);
        float *v = malloc(n * sizeof(float));
        unsigned char *b = malloc(n * 4);
        for (size_t i = 0; i < n; i++)
            v[i] = pattern(t, i);
        ig_dtype_from_f32(b, f->dtype, v, n);
        assert_int_equal(
            ig_safetensors_writer_write(w, b, n * ig_dtype_size(f->dtype), err, sizeof(err)), 0);
        free(v);
        free(b);
    }
    assert_int_equal(ig_safetensors_writer_close(w, err, sizeof(err)), 0);
    free(path);

    json_t *c =
        json_pack("{s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:f}", "architectures",
                  f->arch, "hidden_size", f->dim, "intermediate_size", f->hidden,
                  "num_hidden_layers", f->layers, "num_attention_heads", f->heads,
                  "num_key_value_heads", f->kv, "vocab_size", f->vocab, "max_position_embeddings",
                  128, "tie_word_embeddings", f->tied, "rms_norm_eps", 1e-5, "rope_theta", 10000.0);
    if (f->head_dim)
        json_object_set_new(c, "head_dim", json_integer(f->head_dim));
    char *cpath = tu_path(tu_dir, "config.json");
    assert_int_equal(json_dump_file(c, cpath, JSON_INDENT(2)), 0);
    json_decref(c);
    free(cpath);
}

/* Checks shape and every value of a bound tensor against what fx_write wrote. */
static void expect_tensor(const ig_tensor_t *t, const char *name, int ndim, int64_t d0, int64_t d1)
{
    int idx = -1;
    for (int i = 0; i < nnames; i++)
        if (strcmp(names[i], name) == 0)
            idx = i;
    assert_true(idx >= 0);
    assert_non_null(t->data);
    assert_int_equal(t->ndim, ndim);
    assert_int_equal(t->shape[0], d0);
    if (ndim > 1)
        assert_int_equal(t->shape[1], d1);
    size_t n = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    float *v = malloc(n * sizeof(float));
    ig_dtype_to_f32(v, t->data, t->dtype, n);
    for (size_t i = 0; i < n; i++) {
        if (v[i] != pattern(idx, i))
            fail_msg("%s[%zu] = %g, expected %g", name, i, v[i], pattern(idx, i));
    }
    free(v);
}

static ig_model_t *load_ok(void)
{
    ig_model_t *m = NULL;
    char err[512] = "";
    int rc = ig_model_load(&m, tu_dir, err, sizeof(err));
    if (rc != 0)
        fail_msg("load: %s: %s", ig_err_name(rc), err);
    return m;
}

static void check_all(const ig_model_t *m, const fx_t *f)
{
    const ig_model_config_t *c = ig_model_config(m);
    int hd = c->head_dim;
    int64_t q = (int64_t)f->heads * hd, kv = (int64_t)f->kv * hd;
    char name[96];
    expect_tensor(ig_model_embed(m), "model.embed_tokens.weight", 2, f->vocab, f->dim);
    expect_tensor(ig_model_final_norm(m), "model.norm.weight", 1, f->dim, 0);
    if (f->tied)
        assert_ptr_equal(ig_model_lm_head(m)->data, ig_model_embed(m)->data);
    else
        expect_tensor(ig_model_lm_head(m), "lm_head.weight", 2, f->vocab, f->dim);
    for (int l = 0; l < f->layers; l++) {
        const ig_layer_weights_t *L = ig_model_layer(m, l);
        assert_non_null(L);
#define E(field, suffix, nd, a, b)                                                                 \
    snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);                                 \
    expect_tensor(&L->field, name, nd, a, b)
        E(attn_norm, "input_layernorm.weight", 1, f->dim, 0);
        E(wq, "self_attn.q_proj.weight", 2, q, f->dim);
        E(wk, "self_attn.k_proj.weight", 2, kv, f->dim);
        E(wv, "self_attn.v_proj.weight", 2, kv, f->dim);
        E(wo, "self_attn.o_proj.weight", 2, f->dim, q);
        E(mlp_norm, "post_attention_layernorm.weight", 1, f->dim, 0);
        E(w_gate, "mlp.gate_proj.weight", 2, f->hidden, f->dim);
        E(w_up, "mlp.up_proj.weight", 2, f->hidden, f->dim);
        E(w_down, "mlp.down_proj.weight", 2, f->dim, f->hidden);
        if (f->bias) {
            E(bq, "self_attn.q_proj.bias", 1, q, 0);
            E(bk, "self_attn.k_proj.bias", 1, kv, 0);
            E(bv, "self_attn.v_proj.bias", 1, kv, 0);
        } else {
            assert_null(L->bq.data);
            assert_null(L->bk.data);
            assert_null(L->bv.data);
        }
#undef E
    }
    assert_null(ig_model_layer(m, f->layers));
    assert_null(ig_model_layer(m, -1));
}

static void test_llama_untied_gqa(void **state)
{
    (void)state;
    fx_t f = {"LlamaForCausalLM", 32, 48, 2, 4, 2, 0, 64, 0, 0, IG_DTYPE_F32, 1};
    fx_write(&f);
    ig_model_t *m = load_ok();
    const ig_model_config_t *c = ig_model_config(m);
    /* head_dim 8: hidden_size / heads when absent */
    tu_assert_shape(c, &(tu_shape_t){"LlamaForCausalLM", 32, 48, 2, 4, 2, 8, 64, 128});
    assert_true(c->rms_norm_eps == 1e-5f);
    assert_true(c->rope_theta == 10000.0f);
    assert_int_equal(c->rope_scaling, IG_ROPE_NONE);
    assert_int_equal(c->tie_word_embeddings, 0);
    assert_int_equal(c->attention_bias, 0);
    assert_int_equal(c->bos_token_id, -1);
    assert_int_equal(c->n_eos, 0);
    assert_int_equal(c->dtype, IG_DTYPE_F32);
    assert_string_equal(ig_model_dir(m), tu_dir);
    check_all(m, &f);
    /* every bound tensor once; the ignored inv_freq not counted */
    size_t params = 2 * 64 * 32 + 32 + 2 * (2 * 32 + 2 * 32 * 32 + 2 * 16 * 32 + 3 * 48 * 32);
    assert_int_equal(ig_model_weight_bytes(m), params * 4);
    ig_model_free(m);
}

static void test_qwen2_bias_tied_head_dim(void **state)
{
    (void)state;
    /* head_dim given explicitly and different from dim / heads */
    fx_t f = {"Qwen2ForCausalLM", 32, 40, 1, 4, 1, 16, 50, 1, 1, IG_DTYPE_F32, 0};
    fx_write(&f);
    ig_model_t *m = load_ok();
    const ig_model_config_t *c = ig_model_config(m);
    assert_string_equal(c->architecture, "Qwen2ForCausalLM");
    assert_int_equal(c->attention_bias, 1); /* Qwen2 always */
    assert_int_equal(c->head_dim, 16);
    assert_int_equal(c->tie_word_embeddings, 1);
    assert_int_equal(ig_model_layer(m, 0)->wq.shape[0], 64);
    check_all(m, &f);
    ig_model_free(m);
}

static void test_half_dtypes(void **state)
{
    (void)state;
    for (int d = IG_DTYPE_F16; d <= IG_DTYPE_BF16; d++) {
        fx_t f = {"MistralForCausalLM", 16, 24, 1, 2, 2, 0, 40, 0, 0, (ig_dtype_t)d, 0};
        fx_write(&f);
        ig_model_t *m = load_ok();
        assert_int_equal(ig_model_config(m)->dtype, d);
        assert_int_equal(ig_model_embed(m)->dtype, d);
        assert_string_equal(ig_model_config(m)->architecture, "MistralForCausalLM");
        check_all(m, &f); /* the pattern is exact in F16 and BF16 */
        ig_model_free(m);
    }
}

static void test_config_variants(void **state)
{
    (void)state;
    fx_t f = {"LlamaForCausalLM", 16, 24, 1, 2, 1, 0, 300, 1, 0, IG_DTYPE_F32, 0};
    fx_write(&f);
    /* llama3 rope scaling under "rope_type", eos as a list */
    tu_json_set(tu_dir, "config.json", "rope_scaling",
                json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", 32.0,
                          "low_freq_factor", 1.0, "high_freq_factor", 4.0,
                          "original_max_position_embeddings", 8192));
    tu_json_set(tu_dir, "config.json", "eos_token_id", json_pack("[i,i,i]", 257, 264, 265));
    tu_json_set(tu_dir, "config.json", "bos_token_id", json_integer(256));
    tu_json_set(tu_dir, "config.json", "torch_dtype", json_string("bfloat16"));
    tu_json_set(tu_dir, "config.json", "rms_norm_eps", NULL);
    tu_json_set(tu_dir, "config.json", "rope_theta", json_integer(500000));
    ig_model_t *m = load_ok();
    const ig_model_config_t *c = ig_model_config(m);
    assert_int_equal(c->rope_scaling, IG_ROPE_LLAMA3);
    assert_true(c->rope_factor == 32.0f);
    assert_true(c->rope_low_freq_factor == 1.0f);
    assert_true(c->rope_high_freq_factor == 4.0f);
    assert_int_equal(c->rope_original_max_position, 8192);
    assert_true(c->rope_theta == 500000.0f);
    assert_true(c->rms_norm_eps == 1e-6f); /* transformers' default */
    assert_int_equal(c->bos_token_id, 256);
    assert_int_equal(c->n_eos, 3);
    assert_int_equal(c->eos_token_ids[0], 257);
    assert_int_equal(c->eos_token_ids[2], 265);
    assert_int_equal(c->dtype, IG_DTYPE_F32); /* what is stored, not torch_dtype */
    ig_model_free(m);

    /* linear scaling under the older "type" key; generation_config wins for ids */
    tu_json_set(tu_dir, "config.json", "rope_scaling",
                json_pack("{s:s, s:f}", "type", "linear", "factor", 4.0));
    tu_json_set(tu_dir, "config.json", "eos_token_id", json_integer(2));
    char *g = tu_path(tu_dir, "generation_config.json");
    const char *gen = "{\"bos_token_id\": 1, \"eos_token_id\": [7, 2], \"temperature\": 0.6}";
    tu_write(g, gen, strlen(gen));
    m = load_ok();
    c = ig_model_config(m);
    assert_int_equal(c->rope_scaling, IG_ROPE_LINEAR);
    assert_true(c->rope_factor == 4.0f);
    assert_int_equal(c->bos_token_id, 1);
    assert_int_equal(c->n_eos, 2);
    assert_int_equal(c->eos_token_ids[0], 7);
    assert_int_equal(c->eos_token_ids[1], 2);
    ig_model_free(m);

    /* rope_type "default" and null bos */
    gen = "{\"eos_token_id\": 3}";
    tu_write(g, gen, strlen(gen));
    tu_json_set(tu_dir, "config.json", "rope_scaling", json_pack("{s:s}", "rope_type", "default"));
    tu_json_set(tu_dir, "config.json", "bos_token_id", json_null());
    m = load_ok();
    c = ig_model_config(m);
    assert_int_equal(c->rope_scaling, IG_ROPE_NONE);
    assert_int_equal(c->bos_token_id, -1);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos_token_ids[0], 3);
    ig_model_free(m);
    free(g);

    /* model_type alone names the architecture when architectures is absent */
    tu_json_set(tu_dir, "config.json", "architectures", NULL);
    tu_json_set(tu_dir, "config.json", "model_type", json_string("qwen2"));
    tu_expect_load_error(tu_dir, IG_EMODEL,
                         "model.safetensors: model.layers.0.self_attn.q_proj.bias",
                         "missing tensor", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_llama_untied_gqa, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_qwen2_bias_tied_head_dim, tu_dir_setup,
                                        tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_half_dtypes, tu_dir_setup, tu_dir_teardown),
        cmocka_unit_test_setup_teardown(test_config_variants, tu_dir_setup, tu_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
