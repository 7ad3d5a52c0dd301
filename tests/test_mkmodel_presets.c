/* mkmodel.h and `infergate mkmodel`: each preset loads with its exact config
 * and shapes, the same seed gives the same bytes, half dtypes hold exactly
 * the rounded F32 values, shards hold the same tensors, and the values have
 * the intended scale. (The 2.5 GB `1b` preset is checked by hand, see
 * docs/model.md, not in ctest.) */
#include "model_testutil.h"

#include "infergate/safetensors.h"
#include "infergate/tokenizer.h"

#include <sys/wait.h>

static ig_model_t *load(const char *dir)
{
    ig_model_t *m = NULL;
    char err[512] = "";
    int rc = ig_model_load(&m, dir, err, sizeof(err));
    if (rc != 0)
        fail_msg("load %s: %s", dir, err);
    return m;
}

static void test_tiny_config(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    tu_mkmodel(dir, "tiny", 1, 0, 0, IG_DTYPE_F32);
    ig_model_t *m = load(dir);
    const ig_model_config_t *c = ig_model_config(m);
    tu_assert_shape(c, &(tu_shape_t){"LlamaForCausalLM", 128, 512, 2, 4, 2, 32, 4096, 512});
    assert_int_equal(c->tie_word_embeddings, 1);
    assert_int_equal(c->attention_bias, 0);
    assert_int_equal(c->rope_scaling, IG_ROPE_NONE);
    assert_true(c->rope_theta == 10000.0f);
    assert_true(c->rms_norm_eps == 1e-5f);
    assert_int_equal(c->bos_token_id, 1);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos_token_ids[0], 2);
    assert_int_equal(c->dtype, IG_DTYPE_F32);
    /* about one million parameters */
    size_t params = ig_model_weight_bytes(m) / 4;
    assert_int_equal(params, 4096 * 128 + 128 +
                                 2 * (2 * 128 + 2 * 128 * 128 + 2 * 64 * 128 + 3 * 512 * 128));
    assert_int_equal(ig_model_layer(m, 1)->wk.shape[0], 64);
    assert_ptr_equal(ig_model_lm_head(m)->data, ig_model_embed(m)->data);
    assert_false(access(dir, F_OK) != 0);
    ig_model_free(m);
    tu_rmtree(dir);
}

static void test_small_and_gqa_config(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    tu_mkmodel(dir, "small", 7, 0, 0, IG_DTYPE_F32);
    ig_model_t *m = load(dir);
    const ig_model_config_t *c = ig_model_config(m);
    tu_assert_shape(c, &(tu_shape_t){NULL, 288, 768, 6, 6, 6, 48, 32000, 256});
    assert_int_equal(c->tie_word_embeddings, 1);
    /* stories15M's parameter count */
    assert_int_equal(ig_model_weight_bytes(m) / 4, 15191712);
    ig_model_free(m);

    tu_mkmodel(dir, "gqa", 7, 0, 0, IG_DTYPE_F32);
    m = load(dir);
    c = ig_model_config(m);
    assert_string_equal(c->architecture, "Qwen2ForCausalLM");
    assert_int_equal(c->num_attention_heads, 8);
    assert_int_equal(c->num_key_value_heads, 2);
    assert_int_equal(c->attention_bias, 1);
    assert_int_equal(c->tie_word_embeddings, 0);
    assert_true(c->rope_theta == 500000.0f);
    assert_int_equal(c->vocab_size, 8192);
    assert_int_equal(c->bos_token_id, -1); /* Qwen2 adds no BOS */
    /* generation_config's list wins over config.json's single id */
    assert_int_equal(c->n_eos, 2);
    assert_int_equal(c->eos_token_ids[0], 8191);
    assert_int_equal(c->eos_token_ids[1], 8189);
    const ig_layer_weights_t *L = ig_model_layer(m, 3);
    assert_non_null(L->bq.data);
    assert_int_equal(L->bk.shape[0], 64);
    assert_ptr_not_equal(ig_model_lm_head(m)->data, ig_model_embed(m)->data);
    ig_model_free(m);
    tu_rmtree(dir);
}

static int same_file(const char *a_dir, const char *b_dir, const char *name)
{
    char *a = tu_path(a_dir, name), *b = tu_path(b_dir, name);
    size_t la, lb;
    unsigned char *x = tu_read(a, &la), *y = tu_read(b, &lb);
    int same = la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    free(a);
    free(b);
    return same;
}

/* The special ids in config.json and generation_config.json are the
 * tokenizer's: BOS, and every EOS is one of its end-of-generation ids. */
static void check_tokenizer(const char *preset, const char *eos_str)
{
    char *dir = tu_mkdtemp();
    tu_with_tokenizer = 1;
    tu_mkmodel(dir, preset, 1, 0, 0, IG_DTYPE_F32);
    tu_with_tokenizer = 0;
    ig_model_t *m = load(dir);
    const ig_model_config_t *c = ig_model_config(m);
    ig_tokenizer_t *tok = NULL;
    char err[512] = "";
    if (ig_tokenizer_load(dir, &tok, err, sizeof(err)) != 0)
        fail_msg("tokenizer: %s", err);
    assert_int_equal(ig_tokenizer_vocab_size(tok), c->vocab_size);
    assert_int_equal(ig_tokenizer_bos_id(tok), c->bos_token_id);
    assert_true(c->n_eos >= 1);
    assert_string_equal(ig_tokenizer_token_str(tok, c->eos_token_ids[0]), eos_str);
    const int32_t *ids;
    size_t n = ig_tokenizer_eos_ids(tok, &ids);
    for (int e = 0; e < c->n_eos; e++) {
        int found = 0;
        for (size_t i = 0; i < n; i++)
            found |= ids[i] == c->eos_token_ids[e];
        assert_true(found);
        assert_true(ig_tokenizer_is_special(tok, c->eos_token_ids[e]));
    }
    ig_tokenizer_free(tok);
    ig_model_free(m);
    tu_rmtree(dir);
}

static void test_tokenizer_matches(void **state)
{
    (void)state;
    check_tokenizer("tiny", "</s>");
    check_tokenizer("gqa", "<|im_end|>");
}

static void test_determinism(void **state)
{
    (void)state;
    tu_with_tokenizer = 1;
    char *a = tu_mkdtemp(), *b = tu_mkdtemp(), *c = tu_mkdtemp();
    tu_mkmodel(a, "tiny", 42, 0, 1, IG_DTYPE_BF16);
    tu_mkmodel(b, "tiny", 42, 0, 1, IG_DTYPE_BF16);
    tu_mkmodel(c, "tiny", 43, 0, 1, IG_DTYPE_BF16);
    assert_true(same_file(a, b, "model.safetensors"));
    assert_true(same_file(a, b, "config.json"));
    assert_true(same_file(a, b, "generation_config.json"));
    assert_true(same_file(a, b, "tokenizer.json"));
    assert_true(same_file(a, b, "tokenizer_config.json"));
    tu_with_tokenizer = 0;
    assert_false(same_file(a, c, "model.safetensors"));
    assert_true(same_file(a, c, "config.json"));
    tu_rmtree(a);
    tu_rmtree(b);
    tu_rmtree(c);
}

/* The same seed in F16 / BF16 holds exactly the rounded F32 values. */
static void test_dtypes_convert_on_write(void **state)
{
    (void)state;
    char *d32 = tu_mkdtemp(), *dh = tu_mkdtemp();
    tu_mkmodel(d32, "tiny", 5, 0, 0, IG_DTYPE_F32);
    ig_model_t *m32 = load(d32);
    for (int d = IG_DTYPE_F16; d <= IG_DTYPE_BF16; d++) {
        tu_mkmodel(dh, "tiny", 5, 0, 1, (ig_dtype_t)d);
        ig_model_t *mh = load(dh);
        assert_int_equal(ig_model_config(mh)->dtype, d);
        assert_int_equal(ig_model_weight_bytes(mh) * 2, ig_model_weight_bytes(m32));
        const ig_tensor_t *pairs[][2] = {
            {ig_model_embed(m32), ig_model_embed(mh)},
            {&ig_model_layer(m32, 1)->w_down, &ig_model_layer(mh, 1)->w_down},
            {&ig_model_layer(m32, 0)->attn_norm, &ig_model_layer(mh, 0)->attn_norm},
        };
        for (size_t p = 0; p < 3; p++) {
            size_t n = (size_t)pairs[p][0]->shape[0] *
                       (size_t)(pairs[p][0]->ndim > 1 ? pairs[p][0]->shape[1] : 1);
            const float *f = pairs[p][0]->data;
            const unsigned char *h = pairs[p][1]->data;
            for (size_t i = 0; i < n; i++) {
                uint16_t got;
                memcpy(&got, h + 2 * i, 2);
                uint16_t want = d == IG_DTYPE_F16 ? ig_f32_to_f16(f[i]) : ig_f32_to_bf16(f[i]);
                assert_int_equal(got, want);
                float back = d == IG_DTYPE_F16 ? ig_f16_to_f32(got) : ig_bf16_to_f32(got);
                assert_true(fabsf(back - f[i]) <= fabsf(f[i]) / (d == IG_DTYPE_F16 ? 1024 : 128));
            }
        }
        ig_model_free(mh);
    }
    ig_model_free(m32);
    tu_rmtree(d32);
    tu_rmtree(dh);
}

static void stats(const ig_tensor_t *t, double *mean, double *std, double *maxabs)
{
    size_t n = (size_t)t->shape[0] * (size_t)(t->ndim > 1 ? t->shape[1] : 1);
    const float *v = t->data;
    double s = 0, s2 = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
    }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(v[i] - *mean));
    *maxabs = mx;
}

static void test_value_scale(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    tu_mkmodel(dir, "tiny", 9, 0, 0, IG_DTYPE_F32);
    ig_model_t *m = load(dir);
    double mean, std, mx;
    stats(ig_model_embed(m), &mean, &std, &mx);
    assert_true(fabs(mean) < 0.001);
    assert_true(std > 0.016 && std < 0.020);
    assert_true(mx < 0.07); /* Irwin-Hall is bounded at 3.5 sigma */
    stats(&ig_model_layer(m, 0)->wq, &mean, &std, &mx);
    assert_true(std > 0.016 && std < 0.020);
    stats(&ig_model_layer(m, 1)->mlp_norm, &mean, &std, &mx);
    assert_true(fabs(mean - 1.0) < 0.002);
    assert_true(std > 0.002 && std < 0.008);
    /* tensors get independent streams */
    assert_memory_not_equal(ig_model_layer(m, 0)->w_gate.data, ig_model_layer(m, 0)->w_up.data,
                            4096);
    ig_model_free(m);
    tu_rmtree(dir);
}

static void test_sharded(void **state)
{
    (void)state;
    char *one = tu_mkdtemp(), *three = tu_mkdtemp();
    tu_mkmodel(one, "gqa", 11, 1, 0, IG_DTYPE_F32);
    tu_mkmodel(three, "gqa", 11, 3, 0, IG_DTYPE_F32);
    char *idx = tu_path(three, "model.safetensors.index.json");
    char *single = tu_path(three, "model.safetensors");
    char *s3 = tu_path(three, "model-00003-of-00003.safetensors");
    assert_int_equal(access(idx, F_OK), 0);
    assert_int_equal(access(s3, F_OK), 0);
    assert_int_not_equal(access(single, F_OK), 0);
    ig_model_t *a = load(one), *b = load(three);
    assert_int_equal(ig_model_weight_bytes(a), ig_model_weight_bytes(b));
    const ig_model_config_t *c = ig_model_config(a);
    /* same values, whichever file they sit in */
    assert_memory_equal(ig_model_embed(a)->data, ig_model_embed(b)->data,
                        (size_t)c->vocab_size * (size_t)c->hidden_size * 4);
    assert_memory_equal(ig_model_lm_head(a)->data, ig_model_lm_head(b)->data,
                        (size_t)c->vocab_size * (size_t)c->hidden_size * 4);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        assert_memory_equal(ig_model_layer(a, l)->w_down.data, ig_model_layer(b, l)->w_down.data,
                            (size_t)c->intermediate_size * (size_t)c->hidden_size * 4);
        assert_memory_equal(ig_model_layer(a, l)->bv.data, ig_model_layer(b, l)->bv.data,
                            (size_t)c->num_key_value_heads * (size_t)c->head_dim * 4);
    }
    ig_model_free(a);
    ig_model_free(b);
    /* writing one file over a sharded model removes the index */
    tu_mkmodel(three, "gqa", 11, 1, 0, IG_DTYPE_F32);
    assert_int_not_equal(access(idx, F_OK), 0);
    assert_true(same_file(one, three, "model.safetensors"));
    free(idx);
    free(single);
    free(s3);
    tu_rmtree(one);
    tu_rmtree(three);
}

static void test_api_errors(void **state)
{
    (void)state;
    ig_mkmodel_opts_t o;
    char err[256];
    ig_mkmodel_opts_default(&o);
    o.preset = "huge";
    assert_int_equal(ig_mkmodel_write("/tmp/never", &o, err, sizeof(err)), IG_EINVAL);
    assert_non_null(strstr(err, "unknown preset \"huge\""));
    o.preset = "tiny";
    o.shards = 1000;
    assert_int_equal(ig_mkmodel_write("/tmp/never", &o, err, sizeof(err)), IG_EINVAL);
    assert_int_not_equal(access("/tmp/never", F_OK), 0);
    assert_string_equal(ig_mkmodel_preset_name(0), "tiny");
    assert_string_equal(ig_mkmodel_preset_name(3), "qwen3");
    assert_null(ig_mkmodel_preset_name(5));
}

/* Runs the binary; returns its exit status. */
static int run(const char *args)
{
    char cmd[1024];
    const char *bin = getenv("IG_BIN_DIR") ? getenv("IG_BIN_DIR") : IG_BIN_DIR;
    snprintf(cmd, sizeof(cmd), "%s/infergate mkmodel %s >/dev/null 2>&1", bin, args);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void test_cli(void **state)
{
    (void)state;
    char *dir = tu_mkdtemp();
    char args[512];
    assert_int_equal(run("--help"), 0);
    assert_int_equal(run("--preset tiny"), 2);
    snprintf(args, sizeof(args), "--preset nope --out %s", dir);
    assert_int_equal(run(args), 2);
    snprintf(args, sizeof(args), "--preset tiny --out %s --dtype f64", dir);
    assert_int_equal(run(args), 2);
    snprintf(args, sizeof(args), "--preset tiny --out %s --seed -1", dir);
    assert_int_equal(run(args), 2);
    snprintf(args, sizeof(args), "--preset tiny --out %s --bogus", dir);
    assert_int_equal(run(args), 2);
    snprintf(args, sizeof(args), "--preset tiny --out %s/sub/model --seed 3 --dtype f16", dir);
    assert_int_equal(run(args), 0);
    char *sub = tu_path(dir, "sub/model");
    char *tj = tu_path(sub, "tokenizer.json");
    assert_int_equal(access(tj, F_OK), 0);
    free(tj);
    tj = NULL;
    ig_model_t *m = load(sub);
    assert_int_equal(ig_model_config(m)->dtype, IG_DTYPE_F16);
    ig_model_free(m);
    /* the command writes what the API writes */
    char *api = tu_mkdtemp();
    tu_mkmodel(api, "tiny", 3, 0, 1, IG_DTYPE_F16);
    assert_true(same_file(api, sub, "model.safetensors"));
    /* --no-tokenizer writes the same weights and no tokenizer */
    snprintf(args, sizeof(args), "--preset tiny --out %s/bare --seed 3 --dtype f16 --no-tokenizer",
             dir);
    assert_int_equal(run(args), 0);
    char *bare = tu_path(dir, "bare");
    tj = tu_path(bare, "tokenizer.json");
    assert_int_not_equal(access(tj, F_OK), 0);
    assert_true(same_file(bare, sub, "model.safetensors"));
    free(tj);
    free(bare);
    free(sub);
    tu_rmtree(api);
    tu_rmtree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_config),
        cmocka_unit_test(test_small_and_gqa_config),
        cmocka_unit_test(test_tokenizer_matches),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_dtypes_convert_on_write),
        cmocka_unit_test(test_value_scale),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_api_errors),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
