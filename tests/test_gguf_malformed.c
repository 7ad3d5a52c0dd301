/*
 * Malformed GGUF files, each refused with a message that names the file and
 * the key or tensor: the header (magic, version, truncation anywhere, a
 * duplicate key, an unsupported tensor type, a misaligned or out-of-file
 * offset), the llama metadata (missing, mistyped, out of range, another
 * architecture), the tensors (missing, wrong shape) and the vocabulary
 * (unknown tokenizer model, scores missing, a pre-tokenizer name llama.cpp
 * does not know). A well-formed file built the
 * same way loads, so every case fails for its one fault.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "files.h"

#include "infergate/error.h"
#include "infergate/gguf.h"
#include "infergate/model.h"
#include "infergate/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 32
#define HID 64
#define VOCAB 263 /* <unk>, 256 byte tokens, 6 pieces */

typedef struct {
    const char *skip_key;   /* metadata key left out */
    const char *string_key; /* integer key written as a string */
    const char *arch;       /* general.architecture, default llama */
    const char *skip_tensor;
    const char *wide_tensor; /* written with ne[0] + 32 */
    int dup_key;
    const char *tok_model; /* tokenizer.ggml.model, default llama */
    int no_scores;
    const char *pre; /* tokenizer.ggml.pre, with a merges array */
} spec_t;

static char dir[4096];

static void put_int(ig_gguf_writer_t *w, const spec_t *s, const char *key, uint32_t v)
{
    if (s->skip_key && strcmp(s->skip_key, key) == 0)
        return;
    if (s->string_key && strcmp(s->string_key, key) == 0)
        ig_gguf_put_str(w, key, "12", 2);
    else
        ig_gguf_put_u32(w, key, v);
}

/* GPT-2's byte-level character for byte b, as UTF-8 into out. */
static void byte_char(int b, char *out)
{
    int cp = b, n = 0;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
        for (int k = 0; k < b; k++)
            n += !((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174);
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

/* Writes a one-layer llama GGUF following s; returns its path (static). */
static const char *build(const spec_t *s, const char *name)
{
    static char path[4200];
    char err[256], tname[64];
    snprintf(path, sizeof(path), "%s/%s.gguf", dir, name);
    ig_gguf_writer_t *w;
    assert_int_equal(ig_gguf_writer_init(&w), 0);
    const char *arch = s->arch ? s->arch : "llama";
    ig_gguf_put_str(w, "general.architecture", arch, strlen(arch));
    if (s->dup_key)
        ig_gguf_put_str(w, "general.architecture", arch, strlen(arch));
    put_int(w, s, "llama.embedding_length", DIM);
    put_int(w, s, "llama.feed_forward_length", HID);
    put_int(w, s, "llama.block_count", 1);
    put_int(w, s, "llama.attention.head_count", 4);
    put_int(w, s, "llama.attention.head_count_kv", 2);
    put_int(w, s, "llama.context_length", 128);
    const char *tm = s->tok_model ? s->tok_model : "llama";
    ig_gguf_put_str(w, "tokenizer.ggml.model", tm, strlen(tm));
    const char *toks[VOCAB];
    char buf[VOCAB][16];
    float scores[VOCAB];
    for (int i = 0; i < VOCAB; i++) {
        static const char *const pieces[] = {"\xe2\x96\x81",
                                             "a",
                                             "b",
                                             "ab",
                                             "\xe2\x96\x81"
                                             "a",
                                             "\xe2\x96\x81"
                                             "ab"};
        if (i == 0)
            snprintf(buf[i], sizeof(buf[i]), "<unk>");
        else if (i <= 256 && s->pre != NULL)
            byte_char(i - 1, buf[i]);
        else if (i <= 256)
            snprintf(buf[i], sizeof(buf[i]), "<0x%02X>", i - 1);
        else
            snprintf(buf[i], sizeof(buf[i]), "%s", pieces[i - 257]);
        toks[i] = buf[i];
        scores[i] = -(float)i;
    }
    ig_gguf_put_str_array(w, "tokenizer.ggml.tokens", toks, NULL, VOCAB);
    int32_t types[VOCAB];
    for (int i = 0; i < VOCAB; i++)
        types[i] = i == 0 ? 2 : i <= 256 ? 6 : 1;
    ig_gguf_put_i32_array(w, "tokenizer.ggml.token_type", types, VOCAB);
    ig_gguf_put_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    if (s->pre != NULL) {
        const char *merges[] = {"a b"};
        ig_gguf_put_str_array(w, "tokenizer.ggml.merges", merges, NULL, 1);
        ig_gguf_put_str(w, "tokenizer.ggml.pre", s->pre, strlen(s->pre));
    }
    if (!s->no_scores)
        ig_gguf_put_f32_array(w, "tokenizer.ggml.scores", scores, VOCAB);
    const struct {
        const char *n;
        int64_t d0, d1;
    } ts[] = {{"token_embd.weight", DIM, VOCAB},      {"output_norm.weight", DIM, 0},
              {"blk.0.attn_norm.weight", DIM, 0},     {"blk.0.attn_q.weight", DIM, DIM},
              {"blk.0.attn_k.weight", DIM, DIM / 2},  {"blk.0.attn_v.weight", DIM, DIM / 2},
              {"blk.0.attn_output.weight", DIM, DIM}, {"blk.0.ffn_norm.weight", DIM, 0},
              {"blk.0.ffn_gate.weight", DIM, HID},    {"blk.0.ffn_up.weight", DIM, HID},
              {"blk.0.ffn_down.weight", HID, DIM}};
    size_t total = 0;
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
        if (s->skip_tensor && strcmp(s->skip_tensor, ts[i].n) == 0)
            continue;
        int64_t ne[2] = {ts[i].d0, ts[i].d1};
        if (s->wide_tensor && strcmp(s->wide_tensor, ts[i].n) == 0)
            ne[0] += 32;
        assert_int_equal(ig_gguf_add_tensor(w, ts[i].n, IG_DTYPE_F32, ts[i].d1 ? 2 : 1, ne), 0);
        total += (size_t)(ne[0] * (ts[i].d1 ? ne[1] : 1));
    }
    (void)tname;
    assert_int_equal(ig_gguf_writer_begin(w, path, err, sizeof(err)), 0);
    float *z = calloc(total, sizeof(float));
    for (size_t i = 0; i < total; i++)
        z[i] = (float)(i % 7) / 7.0f;
    assert_int_equal(ig_gguf_writer_write(w, z, total * sizeof(float), err, sizeof(err)), 0);
    free(z);
    assert_int_equal(ig_gguf_writer_close(w, err, sizeof(err)), 0);
    return path;
}

static void expect_model(const char *path, int code, const char *msg)
{
    char err[512] = "";
    ig_model_t *m = NULL;
    int rc = ig_model_load(&m, path, err, sizeof(err));
    if (rc != code || strstr(err, msg) == NULL)
        fail_msg("%s: got %d \"%s\", expected %d with \"%s\"", path, rc, err, code, msg);
    ig_model_free(m);
}

static int setup(void **state)
{
    return ig_tf_mkdtemp(dir, sizeof(dir));
}

static int teardown(void **state)
{
    ig_tf_rmtree(dir);
    return 0;
}

static void test_well_formed_loads(void **state)
{
    spec_t s = {0};
    const char *p = build(&s, "good");
    char err[512];
    ig_model_t *m;
    if (ig_model_load(&m, p, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(ig_model_config(m)->hidden_size, DIM);
    assert_int_equal(ig_model_config(m)->num_key_value_heads, 2);
    assert_int_equal(ig_model_config(m)->tie_word_embeddings, 1);
    ig_model_free(m);
    ig_tokenizer_t *t;
    if (ig_tokenizer_load(p, &t, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(ig_tokenizer_vocab_size(t), VOCAB);
    /* the merges rebuilt from the scores: "ab" and "▁ab" are single pieces */
    ig_tokvec_t v;
    ig_tokvec_init(&v);
    assert_int_equal(ig_tokenizer_encode(t, "ab ab", 5, 0, &v), 0);
    assert_int_equal(v.len, 2);
    assert_int_equal(v.ids[0], 262);
    assert_int_equal(v.ids[1], 262);
    ig_tokvec_dispose(&v);
    ig_tokenizer_free(t);
}

/* Byte surgery on a good file. */
static void test_header_faults(void **state)
{
    spec_t s = {0};
    const char *good = build(&s, "base");
    size_t len;
    char *data = ig_tf_read(good, &len), p[4300];
    assert_non_null(data);
    snprintf(p, sizeof(p), "%s/cut.gguf", dir);

    char *bad = malloc(len);
    memcpy(bad, data, len);
    memcpy(bad, "GGUX", 4);
    assert_int_equal(ig_tf_write(p, bad, len), 0);
    expect_model(p, IG_ENOENT, "config.json"); /* not GGUF: read as a directory */
    ig_gguf_t *g;
    char err[512];
    assert_int_equal(ig_gguf_open(&g, p, err, sizeof(err)), IG_EMODEL);
    assert_non_null(strstr(err, "cut.gguf: header: no GGUF magic"));

    memcpy(bad, data, len);
    bad[4] = 1; /* version 1 */
    assert_int_equal(ig_tf_write(p, bad, len), 0);
    expect_model(p, IG_EMODEL, "cut.gguf: version: 1 is not supported (2, 3)");

    memcpy(bad, data, len);
    bad[16] = (char)0xff, bad[17] = (char)0xff, bad[18] = (char)0xff; /* metadata count */
    assert_int_equal(ig_tf_write(p, bad, len), 0);
    expect_model(p, IG_EMODEL, "are absurd");

    for (size_t cut = 40; cut < 400; cut += 61) { /* inside the metadata */
        assert_int_equal(ig_tf_write(p, data, cut), 0);
        expect_model(p, IG_EMODEL, "runs past the end of the file");
    }
    assert_int_equal(ig_tf_write(p, data, len - 100), 0); /* inside the last tensor */
    expect_model(p, IG_EMODEL, "blk.0.ffn_down.weight: 8192 bytes at offset");

    /* The tensor info of ffn_up: name, ndim, 2 dims, type, offset. */
    const char *nm = "blk.0.ffn_up.weight";
    char *at = memmem(data, len, nm, strlen(nm));
    assert_non_null(at);
    size_t type_at = (size_t)(at - data) + strlen(nm) + 4 + 16;
    memcpy(bad, data, len);
    bad[type_at] = 13; /* Q5_K */
    assert_int_equal(ig_tf_write(p, bad, len), 0);
    expect_model(
        p, IG_EMODEL,
        "blk.0.ffn_up.weight: tensor type 13 is not supported (F32, F16, BF16, Q8_0, Q4_0, "
        "Q4_K, Q6_K)");
    memcpy(bad, data, len);
    bad[type_at + 4] += 4; /* offset + 4 */
    assert_int_equal(ig_tf_write(p, bad, len), 0);
    expect_model(p, IG_EMODEL, "blk.0.ffn_up.weight: offset");
    memcpy(bad, data, len);
    bad[type_at + 4 + 6] = 1; /* offset + 2^48 */
    assert_int_equal(ig_tf_write(p, bad, len), 0);
    expect_model(p, IG_EMODEL, "run past the end of the file");
    free(bad);
    free(data);
}

static void test_metadata_faults(void **state)
{
    spec_t s = {.dup_key = 1};
    expect_model(build(&s, "dup"), IG_EMODEL, "dup.gguf: general.architecture: duplicate key");
    s = (spec_t){.skip_key = "llama.embedding_length"};
    expect_model(build(&s, "nodim"), IG_EMODEL, "nodim.gguf: llama.embedding_length: missing");
    s = (spec_t){.string_key = "llama.block_count"};
    expect_model(build(&s, "str"), IG_EMODEL,
                 "str.gguf: llama.block_count: expected an integer, got string");
    s = (spec_t){.arch = "gpt2"};
    expect_model(
        build(&s, "arch"), IG_EMODEL,
        "arch.gguf: general.architecture: \"gpt2\" is not supported (llama, qwen2, qwen3)");
    /* Another architecture's keys carry its name: a llama file relabelled. */
    s = (spec_t){.arch = "qwen2"};
    expect_model(build(&s, "q2keys"), IG_EMODEL, "q2keys.gguf: qwen2.embedding_length: missing");
    s = (spec_t){.skip_key = "llama.attention.head_count_kv"}; /* default: all 4 heads */
    expect_model(build(&s, "mha"), IG_EMODEL,
                 "blk.0.attn_k.weight: ne [32, 16], expected [32, 32]");
}

static void test_tensor_faults(void **state)
{
    spec_t s = {.skip_tensor = "blk.0.ffn_down.weight"};
    expect_model(build(&s, "miss"), IG_EMODEL, "miss.gguf: blk.0.ffn_down.weight: missing tensor");
    s = (spec_t){.wide_tensor = "blk.0.attn_q.weight"};
    expect_model(build(&s, "wide"), IG_EMODEL,
                 "wide.gguf: blk.0.attn_q.weight: ne [64, 32], expected [32, 32]");
    s = (spec_t){.skip_tensor = "token_embd.weight"};
    expect_model(build(&s, "noemb"), IG_EMODEL, "noemb.gguf: token_embd.weight: missing tensor");
}

static void expect_tok(const char *path, const char *msg)
{
    char err[512] = "";
    ig_tokenizer_t *t = NULL;
    int rc = ig_tokenizer_load(path, &t, err, sizeof(err));
    if (rc != IG_ETOKENIZER || strstr(err, msg) == NULL)
        fail_msg("%s: got %d \"%s\", expected \"%s\"", path, rc, err, msg);
    ig_tokenizer_free(t);
}

static void test_vocabulary_faults(void **state)
{
    spec_t s = {.tok_model = "bert"};
    expect_tok(build(&s, "bert"),
               "bert.gguf: tokenizer.ggml.model: \"bert\" is not supported (gpt2, llama)");
    s = (spec_t){.no_scores = 1};
    expect_tok(build(&s, "noscores"), "noscores.gguf: tokenizer.ggml.scores: missing");
    s = (spec_t){.tok_model = "gpt2"};
    expect_tok(build(&s, "nomerges"), "nomerges.gguf: tokenizer.ggml.merges: missing");
    /* Names llama.cpp does not know are refused by name, our own earlier
     * "gpt2" among them (llama.cpp refuses it too). */
    s = (spec_t){.tok_model = "gpt2", .pre = "gpt2"};
    expect_tok(build(&s, "gpt2pre"),
               "gpt2pre.gguf: tokenizer.ggml.pre: \"gpt2\" is not a pre-tokenizer llama.cpp "
               "knows (GPT-2's is \"gpt-2\")");
    s = (spec_t){.tok_model = "gpt2", .pre = "llama-4"};
    expect_tok(build(&s, "unknownpre"),
               "unknownpre.gguf: tokenizer.ggml.pre: \"llama-4\" is not a pre-tokenizer "
               "llama.cpp knows");
}

/* Every name llama.cpp (src/llama-vocab.cpp, Feb 2025) maps to a split
 * regex loads (each regex list compiles in PCRE2) and encodes a mixed text
 * that decodes back whole. */
static void test_every_llamacpp_pre_loads(void **state)
{
    static const char *const names[] = {
        "default",      "llama3",         "llama-v3",     "llama-bpe",  "falcon3",
        "deepseek-llm", "deepseek-coder", "deepseek-v3",  "falcon",     "mpt",
        "starcoder",    "gpt-2",          "phi-2",        "jina-es",    "jina-de",
        "gigachat",     "jina-v1-en",     "jina-v2-es",   "jina-v2-de", "jina-v2-code",
        "roberta-bpe",  "refact",         "command-r",    "qwen2",      "deepseek-r1-qwen",
        "stablelm2",    "olmo",           "dbrx",         "smaug-bpe",  "poro-chat",
        "chatglm-bpe",  "viking",         "jais",         "tekken",     "smollm",
        "codeshell",    "bloom",          "gpt3-finnish", "exaone",     "chameleon",
        "minerva-7b",   "megrez",
    };
    (void)state;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        spec_t s = {.tok_model = "gpt2", .pre = names[i]};
        char err[512] = "";
        ig_tokenizer_t *t = NULL;
        int rc = ig_tokenizer_load(build(&s, "pre"), &t, err, sizeof(err));
        if (rc != 0)
            fail_msg("pre \"%s\": %d %s", names[i], rc, err);
        /* Every split keeps every byte: the text comes back whole. */
        static const char text[] = "It's 12345 ab, (x+y)^2 |~ caf\xc3\xa9\n\n  \xe6\x97\xa5\xe6\x9c"
                                   "\xac\xf0\x9f\x98\x80 <sentinel:7> IMGIMGABZ end  ";
        ig_tokvec_t v;
        ig_tokvec_init(&v);
        assert_int_equal(ig_tokenizer_encode(t, text, strlen(text), 0, &v), 0);
        char *back = NULL;
        size_t blen;
        assert_int_equal(ig_tokenizer_decode(t, v.ids, v.len, 0, &back, &blen), 0);
        if (blen != strlen(text) || memcmp(back, text, blen) != 0)
            fail_msg("pre \"%s\": \"%s\" decodes to \"%.*s\"", names[i], text, (int)blen, back);
        free(back);
        ig_tokvec_dispose(&v);
        ig_tokenizer_free(t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_well_formed_loads), cmocka_unit_test(test_header_faults),
        cmocka_unit_test(test_metadata_faults),   cmocka_unit_test(test_tensor_faults),
        cmocka_unit_test(test_vocabulary_faults), cmocka_unit_test(test_every_llamacpp_pre_loads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
