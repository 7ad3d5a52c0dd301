/* ig_model_load maps the weights and reads only the headers: a model whose
 * 3.89 GB of weights are a sparse hole loads while touching a handful of
 * pages, so load time does not grow with the model. */
#include "model_testutil.h"

#include <sys/resource.h>

static long faults(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

typedef struct {
    json_t *hdr;
    uint64_t off;
} hdr_t;

static void put(hdr_t *h, const char *name, int64_t d0, int64_t d1)
{
    uint64_t n = (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1) * 4;
    json_t *shape =
        d1 ? json_pack("[I,I]", (json_int_t)d0, (json_int_t)d1) : json_pack("[I]", (json_int_t)d0);
    json_object_set_new(h->hdr, name,
                        json_pack("{s:s, s:o, s:[I,I]}", "dtype", "F32", "shape", shape,
                                  "data_offsets", (json_int_t)h->off, (json_int_t)(h->off + n)));
    h->off += n;
}

static void test_load_touches_headers_only(void **state)
{
    (void)state;
    const int dim = 4096, hid = 14336, layers = 2, heads = 32, kv = 8, vocab = 65536;
    char *dir = tu_mkdtemp();
    hdr_t h = {json_object(), 0};
    char name[96];
    put(&h, "model.embed_tokens.weight", vocab, dim);
    for (int l = 0; l < layers; l++) {
#define P(s, a, b)                                                                                 \
    snprintf(name, sizeof(name), "model.layers.%d.%s", l, s);                                      \
    put(&h, name, a, b)
        P("input_layernorm.weight", dim, 0);
        P("self_attn.q_proj.weight", dim, dim);
        P("self_attn.k_proj.weight", kv * 128, dim);
        P("self_attn.v_proj.weight", kv * 128, dim);
        P("self_attn.o_proj.weight", dim, dim);
        P("post_attention_layernorm.weight", dim, 0);
        P("mlp.gate_proj.weight", hid, dim);
        P("mlp.up_proj.weight", hid, dim);
        P("mlp.down_proj.weight", dim, hid);
#undef P
    }
    put(&h, "model.norm.weight", dim, 0);
    put(&h, "lm_head.weight", vocab, dim);
    char *text = json_dumps(h.hdr, JSON_COMPACT);
    size_t tl = strlen(text);
    char *path = tu_path(dir, "model.safetensors");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)tl >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(text, 1, tl, f), tl);
    assert_int_equal(fclose(f), 0);
    /* the weights: a hole, no disk blocks */
    assert_int_equal(truncate(path, (off_t)(8 + tl + h.off)), 0);

    json_t *cfg =
        json_pack("{s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:b}", "architectures", "LlamaForCausalLM",
                  "hidden_size", dim, "intermediate_size", hid, "num_hidden_layers", layers,
                  "num_attention_heads", heads, "num_key_value_heads", kv, "vocab_size", vocab,
                  "tie_word_embeddings", 0);
    char *cpath = tu_path(dir, "config.json");
    assert_int_equal(json_dump_file(cfg, cpath, 0), 0);

    long before = faults();
    ig_model_t *m = NULL;
    char err[512] = "";
    int rc = ig_model_load(&m, dir, err, sizeof(err));
    long touched = faults() - before;
    size_t bytes = m ? ig_model_weight_bytes(m) : 0;
    ig_model_free(m);
    /* clean up first: the 3.9 GB hole must not outlive a failed assertion */
    json_decref(cfg);
    json_decref(h.hdr);
    free(text);
    free(path);
    free(cpath);
    tu_rmtree(dir);

    if (rc != 0)
        fail_msg("load: %s", err);
    assert_int_equal(bytes, h.off);
    assert_true(h.off > 3800000000ull);
    /* a few pages of header and heap, not the ~950,000 pages of weights */
    print_message("load touched %ld pages\n", touched);
    if (touched > 2000)
        fail_msg("load touched %ld pages", touched);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_touches_headers_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
