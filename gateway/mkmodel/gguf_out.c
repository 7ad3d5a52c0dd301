/*
 * `infergate mkmodel --format gguf`: a model in Hugging Face layout written
 * as one GGUF file that llama.cpp and our loader (engine/gguf_model.c) both
 * read: <arch>.* metadata from config.json (llama, qwen2, qwen3), the
 * tokenizer as tokenizer.ggml.* (a "llama" SentencePiece vocabulary with
 * scores, or a "gpt2" BPE one with merges and the tokenizer.ggml.pre name
 * llama.cpp gives its split), the tensors under llama.cpp's names (llama's
 * attn_q / attn_k rows permuted to its adjacent-pair rotation), 1-D tensors
 * in F32 as llama.cpp's converter writes them, matrices in the model's dtype
 * or Q8_0.
 */
#include "infergate/error.h"
#include "infergate/gguf.h"
#include "infergate/jsonv.h"
#include "infergate/mkmodel.h"
#include "infergate/model.h"

#include "../engine/model_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the tokenizer -------------------------------------------------------- */

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_BYTE = 6 };

static json_t *load(const char *dir, const char *name, char *err, size_t errlen)
{
    char p[4200];
    json_error_t je;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    json_t *j = json_load_file(p, 0, &je);
    if (j == NULL)
        ig_errf(err, errlen, "%s: %s", name, je.text);
    return j;
}

/* The merge at index i as "a b". */
static char *merge_str(const json_t *m)
{
    if (json_is_string(m))
        return strdup(json_string_value(m));
    const char *a = json_string_value(json_array_get(m, 0)),
               *b = json_string_value(json_array_get(m, 1));
    if (a == NULL || b == NULL)
        return NULL;
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (s != NULL) {
        memcpy(s, a, la);
        s[la] = ' ';
        memcpy(s + la + 1, b, lb + 1);
    }
    return s;
}

static int put_tokenizer(ig_gguf_writer_t *w, const char *dir, const ig_model_config_t *cfg,
                         char *err, size_t errlen)
{
    int nvocab = cfg->vocab_size;
    int rc = IG_EMODEL;
    json_t *tj = load(dir, "tokenizer.json", err, errlen), *tc = NULL;
    char **tokens = calloc((size_t)nvocab, sizeof(char *)), **merges = NULL;
    int32_t *types = calloc((size_t)nvocab, sizeof(int32_t));
    float *scores = calloc((size_t)nvocab, sizeof(float));
    size_t nm = 0;
    if (tj == NULL)
        goto out;
    tc = load(dir, "tokenizer_config.json", err, errlen);
    if (tc == NULL || tokens == NULL || types == NULL || scores == NULL)
        goto out;
    const json_t *model = json_object_get(tj, "model"), *vocab = json_object_get(model, "vocab");
    const json_t *ml = json_object_get(model, "merges");
    int spm = json_is_true(json_object_get(model, "byte_fallback"));
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val)
    {
        json_int_t id = json_integer_value(val);
        if (id >= 0 && id < nvocab && tokens[id] == NULL) {
            tokens[id] = strdup(key);
            types[id] = TT_NORMAL;
        }
    }
    size_t i;
    json_array_foreach(json_object_get(tj, "added_tokens"), i, val)
    {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        const char *s = json_string_value(json_object_get(val, "content"));
        if (id < 0 || id >= nvocab || s == NULL)
            continue;
        free(tokens[id]);
        tokens[id] = strdup(s);
        /* llama.cpp matches user-defined tokens in any text, control ones
         * only where special tokens are parsed: the tokenizers library's
         * non-special and special added tokens. */
        types[id] = json_is_true(json_object_get(val, "special")) ? TT_CONTROL : TT_USER;
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    for (int id = 0; id < nvocab; id++) {
        if (tokens[id] == NULL) {
            char pad[32];
            snprintf(pad, sizeof(pad), "[PAD%d]", id);
            tokens[id] = strdup(pad);
            types[id] = TT_UNKNOWN;
        }
        if (tokens[id] == NULL)
            goto oom;
        if (unk && strcmp(tokens[id], unk) == 0)
            types[id] = TT_UNKNOWN;
        if (spm && strlen(tokens[id]) == 6 && strncmp(tokens[id], "<0x", 3) == 0 &&
            tokens[id][5] == '>')
            types[id] = TT_BYTE;
    }
    nm = json_array_size(ml);
    merges = calloc(nm ? nm : 1, sizeof(char *));
    if (merges == NULL)
        goto oom;
    for (i = 0; i < nm; i++)
        if ((merges[i] = merge_str(json_array_get(ml, i))) == NULL)
            goto oom;
    if (spm) {
        /* SentencePiece merges by the score of the merged piece: a piece made
         * by merge r scores -r, so the highest score is the first merge. */
        for (int id = 0; id < nvocab; id++)
            scores[id] = types[id] == TT_NORMAL ? -(float)nm - 1 : 0.0f;
        for (i = nm; i-- > 0;) {
            char *sp = strchr(merges[i], ' ');
            if (sp == NULL)
                continue;
            char *joined = malloc(strlen(merges[i]));
            if (joined == NULL)
                goto oom;
            memcpy(joined, merges[i], (size_t)(sp - merges[i]));
            strcpy(joined + (sp - merges[i]), sp + 1);
            json_t *idv = json_object_get(vocab, joined);
            free(joined);
            if (idv != NULL && json_integer_value(idv) < nvocab)
                scores[json_integer_value(idv)] = -(float)i;
        }
    }
    const char *model_name = spm ? "llama" : "gpt2";
    if ((rc = ig_gguf_put_str(w, "tokenizer.ggml.model", model_name, strlen(model_name))) != 0)
        goto out;
    if (!spm) {
        /* The pre-tokenizer's regex decides llama.cpp's name for it: the
         * Llama-3 split (digits in threes), Qwen2's (single digits), or
         * GPT-2's (ByteLevel's own regex). Anything else has no name that
         * llama.cpp would split the same way, and is refused. */
        const char *pre = NULL;
        char *pt = json_dumps(json_object_get(tj, "pre_tokenizer"), JSON_COMPACT);
        if (pt && strstr(pt, "\\\\p{N}{1,3}"))
            pre = "llama-bpe";
        else if (pt && strstr(pt, "\\\\p{N}|"))
            pre = "qwen2";
        else if (pt && !strstr(pt, "\"Split\"") && strstr(pt, "\"use_regex\":true"))
            pre = "gpt-2";
        free(pt);
        if (pre == NULL) {
            ig_errf(err, errlen,
                    "tokenizer.json: pre_tokenizer: no llama.cpp pre-tokenizer splits as this "
                    "one does (Llama-3, Qwen2 and GPT-2 splits are written)");
            rc = IG_EINVAL;
            goto out;
        }
        if ((rc = ig_gguf_put_str(w, "tokenizer.ggml.pre", pre, strlen(pre))) != 0)
            goto out;
    }
    if ((rc = ig_gguf_put_str_array(w, "tokenizer.ggml.tokens", (const char *const *)tokens, NULL,
                                    (uint64_t)nvocab)) ||
        (rc = ig_gguf_put_i32_array(w, "tokenizer.ggml.token_type", types, (uint64_t)nvocab)))
        goto out;
    if (spm)
        rc = ig_gguf_put_f32_array(w, "tokenizer.ggml.scores", scores, (uint64_t)nvocab);
    else
        rc = ig_gguf_put_str_array(w, "tokenizer.ggml.merges", (const char *const *)merges, NULL,
                                   nm);
    if (rc != 0)
        goto out;
    const char *names[] = {"bos_token", "eos_token", "unk_token"};
    const char *keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id"};
    int eos_id = -1;
    for (int k = 0; k < 3; k++) {
        const char *s = json_string_value(json_object_get(tc, names[k]));
        for (int id = 0; s && id < nvocab; id++)
            if (strcmp(tokens[id], s) == 0) {
                if ((rc = ig_gguf_put_u32(w, keys[k], (uint32_t)id)) != 0)
                    goto out;
                if (k == 1)
                    eos_id = id;
                break;
            }
    }
    /* The model's first end of sequence that is not the vocabulary's EOS
     * (ChatML's <|im_end|> beside <|endoftext|>) is its end of turn. */
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_token_ids[i] != eos_id) {
            if ((rc = ig_gguf_put_u32(w, "tokenizer.ggml.eot_token_id",
                                      (uint32_t)cfg->eos_token_ids[i])) != 0)
                goto out;
            break;
        }
    if ((rc = ig_gguf_put_bool(w, "tokenizer.ggml.add_bos_token",
                               json_is_true(json_object_get(tc, "add_bos_token")))) ||
        (rc = ig_gguf_put_bool(w, "tokenizer.ggml.add_eos_token",
                               json_is_true(json_object_get(tc, "add_eos_token")))))
        goto out;
    if (spm && (rc = ig_gguf_put_bool(w, "tokenizer.ggml.add_space_prefix", 1)) != 0)
        goto out;
    const char *tpl = json_string_value(json_object_get(tc, "chat_template"));
    if (tpl != NULL && (rc = ig_gguf_put_str(w, "tokenizer.chat_template", tpl, strlen(tpl))) != 0)
        goto out;
    rc = 0;
    goto out;
oom:
    rc = IG_ENOMEM;
    ig_errf(err, errlen, "tokenizer: out of memory");
out:
    for (int id = 0; tokens && id < nvocab; id++)
        free(tokens[id]);
    for (i = 0; merges && i < nm; i++)
        free(merges[i]);
    free(tokens), free(merges), free(types), free(scores);
    json_decref(tj);
    json_decref(tc);
    return rc;
}

/* ---- the weights ------------------------------------------------------------ */

typedef struct {
    char name[96];
    const ig_tensor_t *t;
    ig_dtype_t dtype;  /* as written */
    int permute_heads; /* attn_q / attn_k: the head count, else 0 */
} out_t;

static int write_tensor(ig_gguf_writer_t *w, const out_t *o, int head_dim, char *err, size_t errlen)
{
    const ig_tensor_t *t = o->t;
    int64_t rows = t->shape[0], cols = t->ndim > 1 ? t->shape[1] : rows;
    if (t->ndim == 1)
        rows = 1;
    size_t in_row = ig_dtype_bytes(t->dtype, (size_t)cols);
    size_t out_row = ig_dtype_bytes(o->dtype, (size_t)cols);
    float *f = malloc((size_t)cols * sizeof(float));
    unsigned char *b = malloc(out_row);
    int rc = 0;
    if (f == NULL || b == NULL) {
        free(f), free(b);
        return IG_ENOMEM;
    }
    for (int64_t r = 0; r < rows && rc == 0; r++) {
        int64_t src = r;
        if (o->permute_heads) {
            /* GGUF row h*hd + 2j + s is Hugging Face row h*hd + s*hd/2 + j. */
            int64_t h = r / head_dim, rest = r % head_dim, j = rest / 2, s = rest % 2;
            src = h * head_dim + s * (head_dim / 2) + j;
        }
        const unsigned char *p = (const unsigned char *)t->data + (size_t)src * in_row;
        if (o->dtype == t->dtype) {
            rc = ig_gguf_writer_write(w, p, out_row, err, errlen);
        } else {
            ig_dtype_to_f32(f, p, t->dtype, (size_t)cols);
            ig_dtype_from_f32(b, o->dtype, f, (size_t)cols);
            rc = ig_gguf_writer_write(w, b, out_row, err, errlen);
        }
    }
    free(f), free(b);
    return rc;
}

/* Q4_K_M as llama.cpp's llama-quantize mixes it (llama_tensor_get_type):
 * Q6_K for the output matrix (the embedding when tied) and for attn_v and
 * ffn_down in the layers use_more_bits picks, Q4_K for the rest. */
static int use_more_bits(int l, int n)
{
    return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
}

static void q4_k_m_types(out_t *outs, int n, int nl, int tied)
{
    for (int i = 0; i < n; i++) {
        int l;
        char what[64];
        if (outs[i].dtype != IG_DTYPE_Q4_K)
            continue;
        if (strcmp(outs[i].name, "output.weight") == 0 ||
            (tied && strcmp(outs[i].name, "token_embd.weight") == 0))
            outs[i].dtype = IG_DTYPE_Q6_K;
        else if (sscanf(outs[i].name, "blk.%d.%63[^.]", &l, what) == 2 &&
                 (strcmp(what, "attn_v") == 0 || strcmp(what, "ffn_down") == 0) &&
                 use_more_bits(l, nl))
            outs[i].dtype = IG_DTYPE_Q6_K;
    }
}

int ig_mkmodel_to_gguf(const char *hf_dir, const char *path, ig_dtype_t quant, char *err,
                       size_t errlen)
{
    ig_model_t *m = NULL;
    ig_gguf_writer_t *w = NULL;
    out_t *outs = NULL;
    float *freqs = NULL;
    int rc = ig_model_load(&m, hf_dir, err, errlen);
    if (rc != 0)
        return rc;
    const ig_model_config_t *c = ig_model_config(m);
    /* llama.cpp's architecture: Llama and Mistral are "llama" (adjacent-pair
     * rotation, so q and k rows are permuted), Qwen2 and Qwen3 their own
     * (rotate-half, as Hugging Face's; Qwen2 with q/k/v biases, Qwen3 with
     * q/k norms). */
    const char *arch = "llama";
    int permute = 1;
    if (strcmp(c->architecture, "Qwen2ForCausalLM") == 0)
        arch = "qwen2", permute = 0;
    else if (strcmp(c->architecture, "Qwen3ForCausalLM") == 0)
        arch = "qwen3", permute = 0;
    else if (c->attention_bias || c->qk_norm) {
        ig_errf(err, errlen,
                "%s: --format gguf: %s with q/k/v biases or q/k norms has no llama.cpp "
                "architecture",
                hf_dir, c->architecture);
        rc = IG_EINVAL;
        goto out;
    }
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof(key), "%s.%s", arch, suffix), key)
    if ((rc = ig_gguf_writer_init(&w)) != 0)
        goto out;
    ig_gguf_put_str(w, "general.architecture", arch, strlen(arch));
    ig_gguf_put_str(w, "general.name", "infergate mkmodel", 17);
    ig_gguf_put_u32(w, "general.alignment", 32);
    int q = quant == IG_DTYPE_Q8_0 || quant == IG_DTYPE_Q4_0 || quant == IG_DTYPE_Q4_K;
    if (quant != IG_DTYPE_F32 && !q) {
        ig_errf(err, errlen, "--format gguf: %s is not a quantized type (q8_0, q4_0, q4_k_m)",
                ig_dtype_name(quant));
        rc = IG_EINVAL;
        goto out;
    }
    /* llama.cpp's llama_ftype: MOSTLY_Q8_0 7, MOSTLY_Q4_0 2, MOSTLY_Q4_K_M 15. */
    ig_gguf_put_u32(w, "general.file_type",
                    quant == IG_DTYPE_Q8_0     ? 7
                    : quant == IG_DTYPE_Q4_0   ? 2
                    : quant == IG_DTYPE_Q4_K   ? 15
                    : c->dtype == IG_DTYPE_F32 ? 0
                    : c->dtype == IG_DTYPE_F16 ? 1
                                               : 32);
    ig_gguf_put_u32(w, KEY("context_length"), (uint32_t)c->max_position_embeddings);
    ig_gguf_put_u32(w, KEY("embedding_length"), (uint32_t)c->hidden_size);
    ig_gguf_put_u32(w, KEY("block_count"), (uint32_t)c->num_hidden_layers);
    ig_gguf_put_u32(w, KEY("feed_forward_length"), (uint32_t)c->intermediate_size);
    ig_gguf_put_u32(w, KEY("attention.head_count"), (uint32_t)c->num_attention_heads);
    ig_gguf_put_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->num_key_value_heads);
    ig_gguf_put_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
    ig_gguf_put_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    ig_gguf_put_u32(w, KEY("rope.dimension_count"), (uint32_t)c->head_dim);
    ig_gguf_put_f32(w, KEY("rope.freq_base"), c->rope_theta);
    ig_gguf_put_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_norm_eps);
    ig_gguf_put_u32(w, KEY("vocab_size"), (uint32_t)c->vocab_size);
    if (c->rope_scaling == IG_ROPE_LINEAR) {
        ig_gguf_put_str(w, KEY("rope.scaling.type"), "linear", 6);
        ig_gguf_put_f32(w, KEY("rope.scaling.factor"), c->rope_factor);
    }
    if (c->rope_scaling == IG_ROPE_LLAMA3) {
        ig_gguf_put_f32(w, "infergate.rope.llama3.factor", c->rope_factor);
        ig_gguf_put_f32(w, "infergate.rope.llama3.low_freq_factor", c->rope_low_freq_factor);
        ig_gguf_put_f32(w, "infergate.rope.llama3.high_freq_factor", c->rope_high_freq_factor);
        ig_gguf_put_f32(w, "infergate.rope.llama3.original_max_position",
                        (float)c->rope_original_max_position);
    }
    if ((rc = put_tokenizer(w, hf_dir, c, err, errlen)) != 0)
        goto out;

    int nl = c->num_hidden_layers, n = 0;
    outs = calloc((size_t)(3 + 14 * nl), sizeof(*outs));
    if (outs == NULL) {
        rc = IG_ENOMEM;
        goto out;
    }
#define ADD(nm, tp, heads)                                                                         \
    do {                                                                                           \
        snprintf(outs[n].name, sizeof(outs[n].name), "%s", nm);                                    \
        outs[n].t = (tp);                                                                          \
        outs[n].dtype = (tp)->ndim == 1 ? IG_DTYPE_F32 : q ? quant : (tp)->dtype;                  \
        outs[n].permute_heads = (heads);                                                           \
        n++;                                                                                       \
    } while (0)
    ADD("token_embd.weight", ig_model_embed(m), 0);
    ADD("output_norm.weight", ig_model_final_norm(m), 0);
    if (!c->tie_word_embeddings)
        ADD("output.weight", ig_model_lm_head(m), 0);
    char nm[96];
    for (int l = 0; l < nl; l++) {
        const ig_layer_weights_t *L = ig_model_layer(m, l);
        const struct {
            const char *s;
            const ig_tensor_t *t;
            int heads;
        } ts[] = {{"attn_norm", &L->attn_norm, 0},
                  {"attn_q", &L->wq, c->num_attention_heads},
                  {"attn_k", &L->wk, c->num_key_value_heads},
                  {"attn_v", &L->wv, 0},
                  {"attn_output", &L->wo, 0},
                  {"ffn_norm", &L->mlp_norm, 0},
                  {"ffn_gate", &L->w_gate, 0},
                  {"ffn_up", &L->w_up, 0},
                  {"ffn_down", &L->w_down, 0}};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
            snprintf(nm, sizeof(nm), "blk.%d.%s.weight", l, ts[i].s);
            ADD(nm, ts[i].t, permute ? ts[i].heads : 0);
        }
        const struct {
            const char *s;
            const ig_tensor_t *t;
        } extra[] = {{"attn_q.bias", &L->bq},
                     {"attn_k.bias", &L->bk},
                     {"attn_v.bias", &L->bv},
                     {"attn_q_norm.weight", &L->q_norm},
                     {"attn_k_norm.weight", &L->k_norm}};
        for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
            if (extra[i].t->data == NULL)
                continue;
            snprintf(nm, sizeof(nm), "blk.%d.%s", l, extra[i].s);
            ADD(nm, extra[i].t, 0);
        }
    }
#undef ADD
#undef KEY
    if (quant == IG_DTYPE_Q4_K)
        q4_k_m_types(outs, n, nl, c->tie_word_embeddings);
    int half = c->head_dim / 2;
    ig_tensor_t rope = {IG_DTYPE_F32, NULL, 1, {half}};
    if (c->rope_scaling == IG_ROPE_LLAMA3) {
        /* llama.cpp divides each frequency by its factor: the llama3 ramp. */
        const double pi = 3.14159265358979323846;
        freqs = malloc((size_t)half * sizeof(float));
        if (freqs == NULL) {
            rc = IG_ENOMEM;
            goto out;
        }
        double old = c->rope_original_max_position, lo = c->rope_low_freq_factor,
               hi = c->rope_high_freq_factor;
        for (int i = 0; i < half; i++) {
            double wl = 2 * pi * pow(c->rope_theta, 2.0 * i / c->head_dim);
            if (wl < old / hi)
                freqs[i] = 1.0f;
            else if (wl > old / lo)
                freqs[i] = c->rope_factor;
            else {
                double sm = (old / wl - lo) / (hi - lo);
                freqs[i] = (float)(1.0 / ((1 - sm) / c->rope_factor + sm));
            }
        }
        rope.data = freqs;
    }
    for (int i = 0; i < n; i++) {
        const ig_tensor_t *t = outs[i].t;
        int64_t ne[2] = {t->ndim > 1 ? t->shape[1] : t->shape[0], t->shape[0]};
        if (ne[0] % (int64_t)ig_dtype_block(outs[i].dtype) != 0)
            outs[i].dtype = t->dtype; /* rows that are not whole blocks stay as they are */
        if ((rc = ig_gguf_add_tensor(w, outs[i].name, outs[i].dtype, t->ndim, ne)) != 0)
            goto out;
    }
    if (freqs != NULL &&
        (rc = ig_gguf_add_tensor(w, "rope_freqs.weight", IG_DTYPE_F32, 1, (int64_t[]){half})) != 0)
        goto out;
    if ((rc = ig_gguf_writer_begin(w, path, err, errlen)) != 0)
        goto out;
    for (int i = 0; i < n && rc == 0; i++)
        rc = write_tensor(w, &outs[i], c->head_dim, err, errlen);
    if (rc == 0 && freqs != NULL) {
        out_t o = {.t = &rope, .dtype = IG_DTYPE_F32};
        rc = write_tensor(w, &o, c->head_dim, err, errlen);
    }
    if (rc != 0)
        goto out;
    rc = ig_gguf_writer_close(w, err, errlen);
    w = NULL;
out:
    free(freqs);
    ig_gguf_writer_abort(w);
    free(outs);
    ig_model_free(m);
    return rc;
}
