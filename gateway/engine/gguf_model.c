/*
 * A Llama-family model from one GGUF file (llama.cpp's "llama", "qwen2" and
 * "qwen3" architectures): the config from the <arch>.* metadata,
 * the tensors where they lie in the mapping (F32, F16, BF16, Q8_0, Q4_0), names
 * and shapes checked as the safetensors loader checks them, errors naming
 * the key or the tensor.
 *
 * llama.cpp's "llama" architecture rotates adjacent pairs of q and k, and its
 * converter permutes the rows of attn_q and attn_k so that Hugging Face's
 * rotate-half weights give the same result; the engine rotates halves, so
 * those two tensors are permuted back at load, into memory the model owns
 * (their mapped pages go back to the kernel). Every other tensor is used in
 * place. "qwen2" and "qwen3" rotate halves (NeoX) as the engine does: their
 * q and k are used as written.
 */
#include "infergate/error.h"
#include "infergate/gguf.h"
#include "infergate/model.h"
#include "infergate/page_release.h"
#include "model_internal.h"
#include "model_object.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The architectures read, as llama.cpp names them: their metadata keys
 * start with the name, and their rotation convention decides whether
 * attn_q / attn_k were permuted by the converter. */
typedef struct {
    const char *gguf, *hf;
    int permuted; /* llama.cpp's LLAMA_ROPE_TYPE_NORM: adjacent pairs */
    int qkv_bias; /* q/k/v biases (required) */
    int qk_norm;  /* per-head RMSNorm of q and k (attn_q_norm, attn_k_norm) */
} arch_t;

static const arch_t archs[] = {
    {"llama", "LlamaForCausalLM", 1, 0, 0},
    {"qwen2", "Qwen2ForCausalLM", 0, 1, 0},
    {"qwen3", "Qwen3ForCausalLM", 0, 0, 1},
};

typedef struct {
    ig_model_t *m;
    ig_gguf_t *g;
    char *err;
    size_t errlen;
    const arch_t *arch;
    char key[128]; /* the last key built by arch_key() */
} ctx_t;

/* "<arch>.<suffix>": the architecture's own metadata key. */
static const char *arch_key(ctx_t *c, const char *suffix)
{
    snprintf(c->key, sizeof(c->key), "%s.%s", c->arch->gguf, suffix);
    return c->key;
}

/* An integer key into *out; absent gives def, or an error when def < 0. */
static int get_int(ctx_t *c, const char *key, int64_t def, int64_t lo, int64_t hi, int *out)
{
    int64_t v;
    int rc = ig_gguf_get_int(c->g, key, lo, hi, &v, c->err, c->errlen);
    if (rc == IG_ENOENT) {
        if (def < 0) {
            ig_errf(c->err, c->errlen, "%s: %s: missing", ig_gguf_file_name(c->g), key);
            return IG_EMODEL;
        }
        v = def;
    } else if (rc != 0) {
        return rc;
    }
    *out = (int)v;
    return 0;
}

static int get_pos_float(ctx_t *c, const char *key, double def, float *out)
{
    double v;
    int rc = ig_gguf_get_float(c->g, key, &v, c->err, c->errlen);
    if (rc == IG_ENOENT)
        v = def;
    else if (rc != 0)
        return rc;
    if (!(v > 0) || !isfinite(v)) {
        ig_errf(c->err, c->errlen, "%s: %s: %g is not a positive finite number",
                ig_gguf_file_name(c->g), key, v);
        return IG_EMODEL;
    }
    *out = (float)v;
    return 0;
}

/* The llama3 factors of rope_freqs.weight for the config's parameters, as
 * Hugging Face's converter writes them (1, factor or the ramp between). */
static void llama3_factors(const ig_model_config_t *cfg, float *f, int n)
{
    const double pi = 3.14159265358979323846;
    double old = cfg->rope_original_max_position, lo = cfg->rope_low_freq_factor,
           hi = cfg->rope_high_freq_factor, factor = cfg->rope_factor;
    for (int i = 0; i < n; i++) {
        double freq = 1.0 / pow(cfg->rope_theta, 2.0 * i / (2.0 * n));
        double wavelen = 2 * pi / freq;
        if (wavelen < old / hi)
            f[i] = 1.0f;
        else if (wavelen > old / lo)
            f[i] = (float)factor;
        else {
            double smooth = (old / wavelen - lo) / (hi - lo);
            f[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

/* rope_freqs.weight: accepted when it is the llama3 ramp of the
 * infergate.rope.llama3.* keys (written by infergate mkmodel), or of
 * Llama 3.1/3.2's parameters. */
static int parse_rope(ctx_t *c, ig_model_config_t *cfg)
{
    int rc;
    const char *file = ig_gguf_file_name(c->g);
    const char *type;
    size_t tlen;
    cfg->rope_scaling = IG_ROPE_NONE;
    cfg->rope_factor = 1.0f;
    rc = ig_gguf_get_str(c->g, arch_key(c, "rope.scaling.type"), &type, &tlen, c->err, c->errlen);
    if (rc != 0 && rc != IG_ENOENT)
        return rc;
    if (rc == 0 && !(tlen == 4 && memcmp(type, "none", 4) == 0)) {
        if (!(tlen == 6 && memcmp(type, "linear", 6) == 0)) {
            ig_errf(c->err, c->errlen, "%s: %s: \"%.*s\" is not supported (none, linear)", file,
                    arch_key(c, "rope.scaling.type"), (int)(tlen < 32 ? tlen : 32), type);
            return IG_EMODEL;
        }
        cfg->rope_scaling = IG_ROPE_LINEAR;
        if ((rc = get_pos_float(c, arch_key(c, "rope.scaling.factor"), 1.0, &cfg->rope_factor)) !=
            0)
            return rc;
    }
    const ig_gguf_tensor_t *rf = ig_gguf_find_tensor(c->g, "rope_freqs.weight");
    if (rf == NULL)
        return 0;
    int half = cfg->head_dim / 2;
    if (rf->ndim != 1 || rf->ne[0] != half || rf->dtype != IG_DTYPE_F32) {
        ig_errf(c->err, c->errlen, "%s: rope_freqs.weight: expected F32 [%d]", file, half);
        return IG_EMODEL;
    }
    static const float known[][4] = {{32, 1, 4, 8192}, {8, 1, 4, 8192}};
    float got[512], want[512];
    memcpy(got, rf->data, (size_t)half * sizeof(float));
    double mine[4];
    int have =
        ig_gguf_get_float(c->g, "infergate.rope.llama3.factor", &mine[0], c->err, c->errlen) == 0 &&
        ig_gguf_get_float(c->g, "infergate.rope.llama3.low_freq_factor", &mine[1], c->err,
                          c->errlen) == 0 &&
        ig_gguf_get_float(c->g, "infergate.rope.llama3.high_freq_factor", &mine[2], c->err,
                          c->errlen) == 0 &&
        ig_gguf_get_float(c->g, "infergate.rope.llama3.original_max_position", &mine[3], c->err,
                          c->errlen) == 0;
    for (int k = have ? -1 : 0; k < (int)(sizeof(known) / sizeof(known[0])); k++) {
        cfg->rope_scaling = IG_ROPE_LLAMA3;
        cfg->rope_factor = k < 0 ? (float)mine[0] : known[k][0];
        cfg->rope_low_freq_factor = k < 0 ? (float)mine[1] : known[k][1];
        cfg->rope_high_freq_factor = k < 0 ? (float)mine[2] : known[k][2];
        cfg->rope_original_max_position = k < 0 ? (int)mine[3] : (int)known[k][3];
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
            cfg->rope_original_max_position <= 0)
            continue;
        llama3_factors(cfg, want, half);
        int same = 1;
        for (int i = 0; i < half && same; i++)
            same = fabsf(got[i] - want[i]) <= 1e-5f * fabsf(want[i]);
        if (same)
            return 0;
    }
    ig_errf(c->err, c->errlen,
            "%s: rope_freqs.weight: per-dimension rope factors that are not a llama3 ramp "
            "(of infergate.rope.llama3.* or Llama 3.1/3.2's parameters) are not supported",
            file);
    return IG_EMODEL;
}

static int parse_config(ctx_t *c, ig_model_config_t *cfg)
{
    const char *file = ig_gguf_file_name(c->g);
    const char *arch;
    size_t alen;
    int rc = ig_gguf_get_str(c->g, "general.architecture", &arch, &alen, c->err, c->errlen);
    if (rc == IG_ENOENT) {
        ig_errf(c->err, c->errlen, "%s: general.architecture: missing", file);
        return IG_EMODEL;
    }
    if (rc != 0)
        return rc;
    c->arch = NULL;
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
        if (strlen(archs[i].gguf) == alen && memcmp(archs[i].gguf, arch, alen) == 0)
            c->arch = &archs[i];
    if (c->arch == NULL) {
        ig_errf(c->err, c->errlen,
                "%s: general.architecture: \"%.*s\" is not supported (llama, qwen2, qwen3)", file,
                (int)(alen < 32 ? alen : 32), arch);
        return IG_EMODEL;
    }
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->architecture, sizeof(cfg->architecture), "%s", c->arch->hf);
    cfg->attention_bias = c->arch->qkv_bias;
    cfg->qk_norm = c->arch->qk_norm;
    if ((rc = get_int(c, arch_key(c, "embedding_length"), -1, 1, 65536, &cfg->hidden_size)) ||
        (rc = get_int(c, arch_key(c, "feed_forward_length"), -1, 1, 1 << 20,
                      &cfg->intermediate_size)) ||
        (rc = get_int(c, arch_key(c, "block_count"), -1, 1, 1024, &cfg->num_hidden_layers)) ||
        (rc = get_int(c, arch_key(c, "attention.head_count"), -1, 1, 1024,
                      &cfg->num_attention_heads)) ||
        (rc = get_int(c, arch_key(c, "attention.head_count_kv"), cfg->num_attention_heads, 1, 1024,
                      &cfg->num_key_value_heads)) ||
        (rc = get_int(c, arch_key(c, "context_length"), 2048, 1, 1 << 24,
                      &cfg->max_position_embeddings)) ||
        (rc = get_pos_float(c, arch_key(c, "attention.layer_norm_rms_epsilon"), 1e-5,
                            &cfg->rms_norm_eps)) ||
        (rc = get_pos_float(c, arch_key(c, "rope.freq_base"), 10000.0, &cfg->rope_theta)))
        return rc;
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
        ig_errf(c->err, c->errlen, "%s: %s: %d does not divide head_count %d", file,
                arch_key(c, "attention.head_count_kv"), cfg->num_key_value_heads,
                cfg->num_attention_heads);
        return IG_EMODEL;
    }
    int def_hd = cfg->hidden_size % cfg->num_attention_heads == 0
                     ? cfg->hidden_size / cfg->num_attention_heads
                     : -1;
    if ((rc = get_int(c, arch_key(c, "attention.key_length"), def_hd, 2, 1024, &cfg->head_dim)) !=
        0)
        return rc;
    int vlen = cfg->head_dim, rdim = cfg->head_dim;
    if ((rc = get_int(c, arch_key(c, "attention.value_length"), cfg->head_dim, 2, 1024, &vlen)) ||
        (rc = get_int(c, arch_key(c, "rope.dimension_count"), cfg->head_dim, 2, 1024, &rdim)))
        return rc;
    if (vlen != cfg->head_dim || rdim != cfg->head_dim || cfg->head_dim % 2 != 0) {
        ig_errf(c->err, c->errlen,
                "%s: %s: key %d, value %d and rope %d dimensions must be one even number", file,
                arch_key(c, "rope.dimension_count"), cfg->head_dim, vlen, rdim);
        return IG_EMODEL;
    }
    const ig_gguf_tensor_t *emb = ig_gguf_find_tensor(c->g, "token_embd.weight");
    if (emb == NULL || emb->ndim != 2) {
        ig_errf(c->err, c->errlen, "%s: token_embd.weight: %s", file,
                emb ? "not 2-D" : "missing tensor");
        return IG_EMODEL;
    }
    if ((rc = get_int(c, arch_key(c, "vocab_size"), emb->ne[1], 1, 1 << 24, &cfg->vocab_size)) != 0)
        return rc;
    cfg->tie_word_embeddings = ig_gguf_find_tensor(c->g, "output.weight") == NULL;
    cfg->bos_token_id = -1;
    int64_t id;
    int hi = cfg->vocab_size - 1;
    if ((rc = ig_gguf_get_int(c->g, "tokenizer.ggml.bos_token_id", 0, hi, &id, c->err,
                              c->errlen)) == 0)
        cfg->bos_token_id = (int)id;
    else if (rc != IG_ENOENT)
        return rc;
    if ((rc = ig_gguf_get_int(c->g, "tokenizer.ggml.eos_token_id", 0, hi, &id, c->err,
                              c->errlen)) == 0)
        cfg->eos_token_ids[cfg->n_eos++] = (int)id;
    else if (rc != IG_ENOENT)
        return rc;
    /* Llama 3 ends a chat turn with <|eot_id|>: a second end of sequence. */
    if ((rc = ig_gguf_get_int(c->g, "tokenizer.ggml.eot_token_id", 0, hi, &id, c->err,
                              c->errlen)) == 0) {
        if (cfg->n_eos == 0 || cfg->eos_token_ids[0] != id)
            cfg->eos_token_ids[cfg->n_eos++] = (int)id;
    } else if (rc != IG_ENOENT) {
        return rc;
    }
    return parse_rope(c, cfg);
}

/* Finds a tensor and checks its shape (rows, cols; cols 0 for a vector). */
static int bind(ctx_t *c, ig_tensor_t *t, const char *name, int64_t rows, int64_t cols)
{
    const char *file = ig_gguf_file_name(c->g);
    const ig_gguf_tensor_t *e = ig_gguf_find_tensor(c->g, name);
    memset(t, 0, sizeof(*t));
    if (e == NULL) {
        ig_errf(c->err, c->errlen, "%s: %s: missing tensor", file, name);
        return IG_EMODEL;
    }
    int ndim = cols ? 2 : 1;
    int same = e->ndim == ndim && e->ne[0] == (cols ? cols : rows) && (!cols || e->ne[1] == rows);
    if (!same) {
        char got[96], want[96];
        int64_t g[4], w[2] = {cols ? cols : rows, rows};
        for (int i = 0; i < e->ndim; i++)
            g[i] = e->ne[i];
        ig__shape_str(got, sizeof(got), e->ndim, g);
        ig__shape_str(want, sizeof(want), ndim, w);
        ig_errf(c->err, c->errlen, "%s: %s: ne %s, expected %s", file, name, got, want);
        return IG_EMODEL;
    }
    if (ndim == 1 && ig_dtype_block(e->dtype) > 1) {
        ig_errf(c->err, c->errlen, "%s: %s: a %s vector is not supported (F32, F16, BF16)", file,
                name, ig_dtype_name(e->dtype));
        return IG_EMODEL;
    }
    t->dtype = e->dtype;
    t->data = e->data;
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = cols;
    ig__model_add_bytes(c->m, e->nbytes);
    return 0;
}

/* Undoes the converter's row permutation of attn_q / attn_k: GGUF row
 * h * hd + 2 j + s holds Hugging Face row h * hd + s * hd / 2 + j. */
static int unpermute(ctx_t *c, ig_tensor_t *t, int heads, int hd, const char *name)
{
    size_t row = ig_dtype_bytes(t->dtype, (size_t)t->shape[1]);
    unsigned char *dst = malloc(row * (size_t)t->shape[0]);
    if (dst == NULL || ig__model_own(c->m, dst) != 0) {
        free(dst);
        ig_errf(c->err, c->errlen, "%s: %s: out of memory", ig_gguf_file_name(c->g), name);
        return IG_ENOMEM;
    }
    const unsigned char *src = t->data;
    for (int h = 0; h < heads; h++)
        for (int j = 0; j < hd / 2; j++)
            for (int s = 0; s < 2; s++)
                memcpy(dst + ((size_t)h * hd + (size_t)s * hd / 2 + j) * row,
                       src + ((size_t)h * hd + 2 * (size_t)j + s) * row, row);
    ig_pages_release(src, row * (size_t)t->shape[0]);
    t->data = dst;
    return 0;
}

int ig__model_load_gguf(ig_model_t *m, ig_gguf_t *g, char *err, size_t errlen)
{
    ctx_t c = {m, g, err, errlen, NULL, ""};
    ig_model_config_t *cfg = ig__model_cfg(m);
    int rc;
    char name[96];
    if ((rc = parse_config(&c, cfg)) != 0)
        return rc;
    int64_t dim = cfg->hidden_size, hid = cfg->intermediate_size, vocab = cfg->vocab_size;
    int64_t q = (int64_t)cfg->num_attention_heads * cfg->head_dim;
    int64_t kv = (int64_t)cfg->num_key_value_heads * cfg->head_dim;
    ig_tensor_t *embed = ig__model_tensor(m, 0), *norm = ig__model_tensor(m, 1),
                *head = ig__model_tensor(m, 2);
    if ((rc = bind(&c, embed, "token_embd.weight", vocab, dim)) ||
        (rc = bind(&c, norm, "output_norm.weight", dim, 0)))
        return rc;
    cfg->dtype = embed->dtype;
    if (cfg->tie_word_embeddings)
        *head = *embed;
    else if ((rc = bind(&c, head, "output.weight", vocab, dim)) != 0)
        return rc;
    if ((rc = ig__model_alloc_layers(m, cfg->num_hidden_layers)) != 0) {
        ig_errf(err, errlen, "model: out of memory");
        return rc;
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        ig_layer_weights_t *L = ig__model_layer_mut(m, l);
        const struct {
            ig_tensor_t *t;
            const char *suffix;
            int64_t rows, cols;
        } want[] = {
            {&L->attn_norm, "attn_norm.weight", dim, 0}, {&L->wq, "attn_q.weight", q, dim},
            {&L->wk, "attn_k.weight", kv, dim},          {&L->wv, "attn_v.weight", kv, dim},
            {&L->wo, "attn_output.weight", dim, q},      {&L->mlp_norm, "ffn_norm.weight", dim, 0},
            {&L->w_gate, "ffn_gate.weight", hid, dim},   {&L->w_up, "ffn_up.weight", hid, dim},
            {&L->w_down, "ffn_down.weight", dim, hid},
        };
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
            snprintf(name, sizeof(name), "blk.%d.%s", l, want[i].suffix);
            if ((rc = bind(&c, want[i].t, name, want[i].rows, want[i].cols)) != 0)
                return rc;
        }
        const struct {
            ig_tensor_t *t;
            const char *suffix;
            int64_t rows;
            int on;
        } extra[] = {
            {&L->bq, "attn_q.bias", q, c.arch->qkv_bias},
            {&L->bk, "attn_k.bias", kv, c.arch->qkv_bias},
            {&L->bv, "attn_v.bias", kv, c.arch->qkv_bias},
            {&L->q_norm, "attn_q_norm.weight", cfg->head_dim, c.arch->qk_norm},
            {&L->k_norm, "attn_k_norm.weight", cfg->head_dim, c.arch->qk_norm},
        };
        for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
            snprintf(name, sizeof(name), "blk.%d.%s", l, extra[i].suffix);
            if (extra[i].on && (rc = bind(&c, extra[i].t, name, extra[i].rows, 0)) != 0)
                return rc;
        }
        if (!c.arch->permuted)
            continue;
        snprintf(name, sizeof(name), "blk.%d.attn_q.weight", l);
        if ((rc = unpermute(&c, &L->wq, cfg->num_attention_heads, cfg->head_dim, name)) != 0)
            return rc;
        snprintf(name, sizeof(name), "blk.%d.attn_k.weight", l);
        if ((rc = unpermute(&c, &L->wk, cfg->num_key_value_heads, cfg->head_dim, name)) != 0)
            return rc;
    }
    return 0;
}
