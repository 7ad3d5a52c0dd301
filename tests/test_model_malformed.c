/* model.h: every malformed model fails at load with IG_EMODEL and a message
 * naming the file and the tensor or field. Each case starts from a good
 * `tiny` model written by mkmodel and breaks one thing. */
#include "model_testutil.h"

#include <stdint.h>

static int setup(void **state)
{
    tu_dir_setup(state);
    tu_mkmodel(tu_dir, "tiny", 1, 1, 0, IG_DTYPE_F32);
    return 0;
}

static int setup_sharded(void **state)
{
    tu_dir_setup(state);
    tu_mkmodel(tu_dir, "tiny", 1, 2, 0, IG_DTYPE_F32);
    return 0;
}

#define ST "model.safetensors"
#define Q0 "model.layers.0.self_attn.q_proj.weight"

static void expect(const char *a, const char *b)
{
    tu_expect_load_error(tu_dir, IG_EMODEL, a, b, NULL);
}

/* ---- header surgery -------------------------------------------------- */

typedef struct {
    const char *tensor;
    const char *field;
    json_t *value; /* stolen */
    const char *rename;
} edit_t;

static void apply_edit(json_t *hdr, void *arg)
{
    edit_t *e = arg;
    json_t *t = json_object_get(hdr, e->tensor);
    assert_non_null(t);
    if (e->rename) {
        json_incref(t);
        json_object_del(hdr, e->tensor);
        json_object_set_new(hdr, e->rename, t);
        return;
    }
    json_object_set_new(t, e->field, e->value);
}

static void st_edit(const char *file, const char *tensor, const char *field, json_t *value,
                    const char *rename)
{
    edit_t e = {tensor, field, value, rename};
    char *path = tu_path(tu_dir, file);
    tu_st_edit(path, apply_edit, &e);
    free(path);
}

static json_t *offsets_of(const char *tensor, int64_t delta_begin, int64_t delta_end)
{
    /* read the current offsets back from the file */
    char *path = tu_path(tu_dir, ST);
    size_t len;
    unsigned char *buf = tu_read(path, &len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    json_t *hdr = json_loadb((const char *)buf + 8, hlen, 0, NULL);
    json_t *o = json_object_get(json_object_get(hdr, tensor), "data_offsets");
    json_int_t b = json_integer_value(json_array_get(o, 0));
    json_int_t e = json_integer_value(json_array_get(o, 1));
    json_decref(hdr);
    free(buf);
    free(path);
    return json_pack("[I,I]", b + delta_begin, e + delta_end);
}

/* ---- tensors ----------------------------------------------------------- */

static void test_missing_tensor(void **state)
{
    (void)state;
    st_edit(ST, "model.layers.1.mlp.up_proj.weight", NULL, NULL, "model.layers.1.mlp.up.weight");
    expect("model.safetensors: model.layers.1.mlp.up_proj.weight: missing tensor", "");
}

static void test_missing_final_norm(void **state)
{
    (void)state;
    st_edit(ST, "model.norm.weight", NULL, NULL, "model.final_norm.weight");
    expect("model.safetensors: model.norm.weight: missing tensor", "");
}

static void test_untied_without_lm_head(void **state)
{
    (void)state;
    tu_json_set(tu_dir, "config.json", "tie_word_embeddings", json_false());
    expect("model.safetensors: lm_head.weight: missing tensor", "");
}

static void test_wrong_shape(void **state)
{
    (void)state;
    /* the same number of bytes, so only the shape is wrong */
    st_edit(ST, Q0, "shape", json_pack("[i,i]", 64, 256), NULL);
    expect("model.safetensors: " Q0 ": shape [64, 256], expected [128, 128]", "");
}

static void test_wrong_rank(void **state)
{
    (void)state;
    st_edit(ST, "model.norm.weight", "shape", json_pack("[i,i]", 1, 128), NULL);
    expect("model.safetensors: model.norm.weight: shape [1, 128], expected [128]", "");
}

static void test_mixed_dtype(void **state)
{
    (void)state;
    st_edit(ST, "model.norm.weight", "dtype", json_string("F16"), NULL);
    st_edit(ST, "model.norm.weight", "shape", json_pack("[i]", 256), NULL);
    expect("model.safetensors: model.norm.weight: dtype F16, expected F32", "");
}

static void test_unsupported_dtype(void **state)
{
    (void)state;
    st_edit(ST, Q0, "dtype", json_string("I8"), NULL);
    expect("model.safetensors: " Q0 ": unsupported dtype I8", "");
    st_edit(ST, Q0, "dtype", json_string("F64"), NULL);
    expect("model.safetensors: " Q0 ": unsupported dtype F64", "");
}

static void test_truncated(void **state)
{
    (void)state;
    char *path = tu_path(tu_dir, ST);
    size_t len;
    unsigned char *buf = tu_read(path, &len);
    tu_write(path, buf, len - 100);
    expect("model.safetensors: ", "end beyond the");
    tu_write(path, buf, 1000); /* cut inside the header */
    expect("model.safetensors: header: length", "(file truncated?)");
    tu_write(path, buf, 5);
    expect("model.safetensors: header: file is 5 bytes", "");
    free(buf);
    free(path);
}

static void test_offsets_that_lie(void **state)
{
    (void)state;
    /* beyond the end of the file */
    st_edit(ST, "model.norm.weight", "data_offsets", offsets_of("model.norm.weight", 0, 4096),
            NULL);
    expect("model.safetensors: model.norm.weight: data_offsets", "end beyond the");
    tu_dir_teardown(state);
    setup(state);
    /* overlapping its neighbour: shift one tensor back by 4 bytes */
    st_edit(ST, "model.norm.weight", "data_offsets", offsets_of("model.norm.weight", -4, -4), NULL);
    expect("model.safetensors: model.norm.weight: data_offsets", "overlap tensor");
    tu_dir_teardown(state);
    setup(state);
    /* not covering: bytes after the last tensor */
    char *path = tu_path(tu_dir, ST);
    size_t len;
    unsigned char *buf = tu_read(path, &len);
    unsigned char *longer = calloc(1, len + 4);
    memcpy(longer, buf, len);
    tu_write(path, longer, len + 4);
    expect("model.safetensors: model.norm.weight: 4 unused bytes after this last tensor", "");
    /* not covering: the last tensor moved forward into them leaves a gap */
    st_edit(ST, "model.norm.weight", "data_offsets", offsets_of("model.norm.weight", 4, 4), NULL);
    expect("model.safetensors: model.norm.weight: data_offsets begin at",
           "leaving 4 unused bytes after tensor model.layers.1.mlp.down_proj.weight");
    free(longer);
    free(buf);
    free(path);
}

static void test_header_length_absurd(void **state)
{
    (void)state;
    char *path = tu_path(tu_dir, ST);
    tu_st_set_hlen(path, (uint64_t)1 << 40);
    expect("model.safetensors: header: length 1099511627776 is absurd", "");
    free(path);
}

static void test_bad_header_json(void **state)
{
    (void)state;
    char *path = tu_path(tu_dir, ST);
    size_t len;
    unsigned char *buf = tu_read(path, &len);
    buf[8] = '['; /* the header's opening brace */
    tu_write(path, buf, len);
    expect("model.safetensors: header: bad JSON", "");
    free(buf);
    free(path);
}

/* ---- files --------------------------------------------------------------- */

static void test_missing_files(void **state)
{
    (void)state;
    char *st = tu_path(tu_dir, ST);
    unlink(st);
    expect("model.safetensors: no such file (and no model.safetensors.index.json)", "");
    char *cfg = tu_path(tu_dir, "config.json");
    unlink(cfg);
    tu_expect_load_error(tu_dir, IG_ENOENT, "config.json: no such file", NULL);
    tu_expect_load_error("/nonexistent/dir", IG_ENOENT, "config.json: no such file", NULL);
    free(st);
    free(cfg);
}

static void test_missing_shard(void **state)
{
    (void)state;
    char *p = tu_path(tu_dir, "model-00002-of-00002.safetensors");
    unlink(p);
    expect("model-00002-of-00002.safetensors: no such file, named by "
           "model.safetensors.index.json",
           "");
    free(p);
}

static void test_index_names_absent_tensor(void **state)
{
    (void)state;
    /* model.norm.weight lives in the second shard */
    tu_json_set(tu_dir, "model.safetensors.index.json", "weight_map.model.norm.weight",
                json_string("model-00001-of-00002.safetensors"));
    expect("model.safetensors.index.json: model.norm.weight: not in "
           "model-00001-of-00002.safetensors",
           "");
}

static void test_index_malformed(void **state)
{
    (void)state;
    tu_json_set(tu_dir, "model.safetensors.index.json", "weight_map.model.norm.weight",
                json_string("../model-00002-of-00002.safetensors"));
    expect("model.safetensors.index.json: weight_map.model.norm.weight: not a file name", "");
    tu_json_set(tu_dir, "model.safetensors.index.json", "weight_map", json_array());
    expect("model.safetensors.index.json: weight_map: missing or not an object", "");
    char *p = tu_path(tu_dir, "model.safetensors.index.json");
    tu_write(p, "{\"weight_map\": ", 15);
    expect("model.safetensors.index.json: bad JSON", "");
    free(p);
}

static void test_shard_missing_tensor(void **state)
{
    (void)state;
    /* a tensor the index does not list and no shard holds */
    st_edit("model-00002-of-00002.safetensors", "model.norm.weight", NULL, NULL, "other");
    tu_json_set(tu_dir, "model.safetensors.index.json", "weight_map.model.norm.weight", NULL);
    expect("model.safetensors.index.json: model.norm.weight: missing tensor", "");
}

/* ---- config.json ---------------------------------------------------------- */

static void test_unsupported_architecture(void **state)
{
    (void)state;
    tu_json_set(tu_dir, "config.json", "architectures", json_pack("[s]", "GPT2LMHeadModel"));
    expect("config.json: architectures: \"GPT2LMHeadModel\" is not supported", "");
    tu_json_set(tu_dir, "config.json", "architectures", json_array());
    expect("config.json: architectures: expected a list of strings", "");
    tu_json_set(tu_dir, "config.json", "architectures", NULL);
    tu_json_set(tu_dir, "config.json", "model_type", NULL);
    expect("config.json: architectures: missing", "");
}

/* A Llama's tensors under a Qwen3 config: the per-head norms are required,
 * and Qwen3's attention_bias (which would give o_proj a bias) is refused. */
static void test_qwen3_needs_qk_norms(void **state)
{
    (void)state;
    tu_json_set(tu_dir, "config.json", "architectures", json_pack("[s]", "Qwen3ForCausalLM"));
    expect("model.safetensors: model.layers.0.self_attn.q_norm.weight: missing tensor", "");
    tu_json_set(tu_dir, "config.json", "attention_bias", json_true());
    expect("config.json: attention_bias: true is not supported for Qwen3ForCausalLM", "");
}

static void test_missing_field(void **state)
{
    static const char *required[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                                     "num_attention_heads", "vocab_size"};
    char want[128];
    (void)state;
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        tu_dir_teardown(state);
        setup(state);
        tu_json_set(tu_dir, "config.json", required[i], NULL);
        snprintf(want, sizeof(want), "config.json: %s: missing", required[i]);
        expect(want, "");
    }
}

static void test_ill_typed_field(void **state)
{
    (void)state;
    const struct {
        const char *key;
        json_t *value;
        const char *want;
    } cases[] = {
        {"num_hidden_layers", json_string("2"),
         "config.json: num_hidden_layers: expected an integer, got a string"},
        {"hidden_size", json_real(128.0),
         "config.json: hidden_size: expected an integer, got a number"},
        {"vocab_size", json_integer(0), "config.json: vocab_size: 0 is out of range"},
        {"num_attention_heads", json_integer(-4), "config.json: num_attention_heads: -4 is out"},
        {"rms_norm_eps", json_string("1e-5"),
         "config.json: rms_norm_eps: expected a number, got a string"},
        {"rope_theta", json_integer(0), "config.json: rope_theta: 0 is not a positive"},
        {"tie_word_embeddings", json_integer(1),
         "config.json: tie_word_embeddings: expected a boolean, got an integer"},
        {"eos_token_id", json_string("</s>"),
         "config.json: eos_token_id: expected an integer or a list of integers, got a string"},
        {"eos_token_id", json_integer(4096), "config.json: eos_token_id: 4096 is out of range"},
        {"eos_token_id", json_pack("[i,s]", 2, "x"), "config.json: eos_token_id[1]: not a token"},
        {"bos_token_id", json_real(1.0), "config.json: bos_token_id: expected an integer"},
        {"head_dim", json_integer(33), "config.json: head_dim: 33 is odd"},
        {"rope_scaling", json_string("llama3"),
         "config.json: rope_scaling: expected an object or null, got a string"},
        {"rope_scaling", json_pack("{s:s,s:f}", "rope_type", "yarn", "factor", 4.0),
         "config.json: rope_scaling.rope_type: \"yarn\" is not supported"},
        {"rope_scaling", json_pack("{s:s}", "type", "linear"),
         "config.json: rope_scaling: factor: missing"},
        {"rope_scaling",
         json_pack("{s:s,s:f,s:f,s:f}", "rope_type", "llama3", "factor", 8.0, "low_freq_factor",
                   1.0, "high_freq_factor", 4.0),
         "config.json: rope_scaling: original_max_position_embeddings: missing"},
        {"hidden_act", json_string("gelu"), "config.json: hidden_act: only \"silu\""},
        {"attention_bias", json_true(), "config.json: attention_bias: true is not supported"},
        {"mlp_bias", json_true(), "config.json: mlp_bias: true is not supported"},
        {"torch_dtype", json_integer(16), "config.json: torch_dtype: expected a string"},
        {"max_position_embeddings", json_string("512"),
         "config.json: max_position_embeddings: expected an integer"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tu_dir_teardown(state);
        setup(state);
        tu_json_set(tu_dir, "config.json", cases[i].key, cases[i].value);
        expect(cases[i].want, "");
    }
}

static void test_heads_not_divisible(void **state)
{
    (void)state;
    tu_json_set(tu_dir, "config.json", "num_key_value_heads", json_integer(3));
    expect("config.json: num_key_value_heads: num_attention_heads 4 is not divisible by "
           "num_key_value_heads 3",
           "");
    tu_json_set(tu_dir, "config.json", "num_key_value_heads", json_integer(2));
    tu_json_set(tu_dir, "config.json", "head_dim", NULL);
    tu_json_set(tu_dir, "config.json", "num_attention_heads", json_integer(6));
    expect("config.json: num_attention_heads: hidden_size 128 is not divisible by "
           "num_attention_heads 6",
           "");
}

static void test_bad_config_json(void **state)
{
    (void)state;
    char *p = tu_path(tu_dir, "config.json");
    tu_write(p, "{\"hidden_size\": 12,", 19);
    expect("config.json: bad JSON at line 1", "");
    tu_write(p, "[]", 2);
    expect("config.json: not a JSON object", "");
    tu_write(p, "{\"a\": 1, \"a\": 2}", 16);
    expect("config.json: bad JSON", "duplicate");
    free(p);
}

static void test_bad_generation_config(void **state)
{
    (void)state;
    tu_json_set(tu_dir, "generation_config.json", "eos_token_id", json_string("x"));
    expect("generation_config.json: eos_token_id: expected an integer or a list", "");
    tu_json_set(tu_dir, "generation_config.json", "eos_token_id",
                json_pack("[i,i,i,i,i,i,i,i,i]", 1, 2, 3, 4, 5, 6, 7, 8, 9));
    expect("generation_config.json: eos_token_id: 9 ids, at most 8", "");
    char *p = tu_path(tu_dir, "generation_config.json");
    tu_write(p, "nope", 4);
    expect("generation_config.json: bad JSON", "");
    free(p);
}

/* Random byte corruption of the JSON files never crashes the loader: each
 * load either succeeds or fails with IG_EMODEL and a message naming a file. */
static void corrupt_and_load(const char *name, int iterations)
{
    char *path = tu_path(tu_dir, name);
    size_t len;
    unsigned char *good = tu_read(path, &len);
    uint64_t s = 7;
    static const char junk[] = "{}[]\",:0-9e.tfn \\";
    for (int iter = 0; iter < iterations; iter++) {
        unsigned char *buf = malloc(len);
        memcpy(buf, good, len);
        for (int k = 0; k < 1 + iter % 3; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            buf[(s >> 33) % len] = (unsigned char)junk[(s >> 20) % (sizeof(junk) - 1)];
        }
        tu_write(path, buf, len);
        free(buf);
        ig_model_t *m = NULL;
        char err[512] = "";
        int rc = ig_model_load(&m, tu_dir, err, sizeof(err));
        if (rc == 0) {
            ig_model_free(m);
            continue;
        }
        assert_int_equal(rc, IG_EMODEL);
        assert_non_null(strstr(err, ".json: ") ? strstr(err, ".json: ")
                                               : strstr(err, ".safetensors"));
    }
    tu_write(path, good, len);
    free(good);
    free(path);
}

static void test_fuzz_json_files(void **state)
{
    (void)state;
    corrupt_and_load("config.json", 300);
    corrupt_and_load("generation_config.json", 100);
    corrupt_and_load("model.safetensors.index.json", 300);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, tu_dir_teardown)
#define TS(f) cmocka_unit_test_setup_teardown(f, setup_sharded, tu_dir_teardown)
    const struct CMUnitTest tests[] = {
        T(test_missing_tensor),
        T(test_missing_final_norm),
        T(test_untied_without_lm_head),
        T(test_wrong_shape),
        T(test_wrong_rank),
        T(test_mixed_dtype),
        T(test_qwen3_needs_qk_norms),
        T(test_unsupported_dtype),
        T(test_truncated),
        T(test_offsets_that_lie),
        T(test_header_length_absurd),
        T(test_bad_header_json),
        T(test_missing_files),
        TS(test_missing_shard),
        TS(test_index_names_absent_tensor),
        TS(test_index_malformed),
        TS(test_shard_missing_tensor),
        T(test_unsupported_architecture),
        T(test_missing_field),
        T(test_ill_typed_field),
        T(test_heads_not_divisible),
        T(test_bad_config_json),
        T(test_bad_generation_config),
        TS(test_fuzz_json_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
