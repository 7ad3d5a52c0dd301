#ifndef INFERGATE_MODEL_H
#define INFERGATE_MODEL_H

/*
 * Llama-family models in Hugging Face layout: config.json, model.safetensors
 * (or shards listed in model.safetensors.index.json), generation_config.json.
 * Tensors are memory-mapped; nothing is copied at load. A loaded model is a
 * read-only handle that any number of engines (one per backend) may share.
 */

#include <stddef.h>
#include <stdint.h>

#include "infergate/dtype.h"  /* ig_dtype_t, ig_dtype_size(), ig_dtype_name() */
#include "infergate/tensor.h" /* ig_tensor_t */

typedef enum {
    IG_ROPE_NONE = 0,
    IG_ROPE_LINEAR,
    IG_ROPE_LLAMA3,
} ig_rope_scaling_t;

#define IG_MAX_EOS 8

typedef struct {
    char architecture[64]; /* LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
                              Qwen3ForCausalLM */
    int hidden_size;       /* dim */
    int intermediate_size; /* MLP hidden */
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads; /* GQA: divides num_attention_heads */
    int head_dim;            /* from config, else hidden_size / num_attention_heads */
    float rms_norm_eps;
    float rope_theta;
    ig_rope_scaling_t rope_scaling;
    float rope_factor;          /* linear and llama3 */
    float rope_low_freq_factor; /* llama3 */
    float rope_high_freq_factor;
    int rope_original_max_position; /* llama3 original_max_position_embeddings */
    int vocab_size;
    int max_position_embeddings;
    int tie_word_embeddings;
    int attention_bias; /* q/k/v projections have biases (Qwen2: always) */
    int qk_norm;        /* q and k get an RMSNorm per head before RoPE (Qwen3) */
    int bos_token_id;   /* -1 when none */
    int eos_token_ids[IG_MAX_EOS];
    int n_eos;
    ig_dtype_t dtype; /* dtype of the stored weights */
} ig_model_config_t;

/* Weights of one decoder layer, with Hugging Face's shapes
 * (nn.Linear weights are (out_features, in_features)). */
typedef struct {
    ig_tensor_t attn_norm; /* (dim) input_layernorm */
    ig_tensor_t wq;        /* (n_heads * head_dim, dim) */
    ig_tensor_t wk;        /* (n_kv_heads * head_dim, dim) */
    ig_tensor_t wv;        /* (n_kv_heads * head_dim, dim) */
    ig_tensor_t wo;        /* (dim, n_heads * head_dim) */
    ig_tensor_t bq;        /* (n_heads * head_dim) or absent */
    ig_tensor_t bk;        /* (n_kv_heads * head_dim) or absent */
    ig_tensor_t bv;        /* (n_kv_heads * head_dim) or absent */
    ig_tensor_t q_norm;    /* (head_dim) per-head RMSNorm of q, or absent */
    ig_tensor_t k_norm;    /* (head_dim) per-head RMSNorm of k, or absent */
    ig_tensor_t mlp_norm;  /* (dim) post_attention_layernorm */
    ig_tensor_t w_gate;    /* (hidden, dim) */
    ig_tensor_t w_up;      /* (hidden, dim) */
    ig_tensor_t w_down;    /* (dim, hidden) */
} ig_layer_weights_t;

typedef struct ig_model_s ig_model_t;

/*
 * Loads the model in `dir`. On failure returns IG_EMODEL (or IG_ENOENT,
 * IG_ENOMEM) and writes a message naming the file and the tensor or field
 * into err, e.g. "model.safetensors: model.layers.0.self_attn.q_proj.weight:
 * shape [64, 32], expected [64, 64]".
 */
int ig_model_load(ig_model_t **out, const char *dir, char *err, size_t errlen);
void ig_model_free(ig_model_t *model);

/*
 * Frees the tensors the model made at load (ig_model_quantize's, converted
 * ones) and sets those tensors' data to NULL; mapped tensors stay. For a
 * process whose engines are all created: every backend holds its own copy
 * of what it was given (the CPU one packs, the CUDA one copies to the
 * device), so the model's would be a second one. The config, the sizes and
 * the other tensors remain.
 */
void ig_model_drop_owned(ig_model_t *model);

const ig_model_config_t *ig_model_config(const ig_model_t *model);
const char *ig_model_dir(const ig_model_t *model);
const ig_tensor_t *ig_model_embed(const ig_model_t *model);      /* (vocab, dim) */
const ig_tensor_t *ig_model_final_norm(const ig_model_t *model); /* (dim) */
const ig_tensor_t *ig_model_lm_head(const ig_model_t *model);    /* (vocab, dim); the
                                                                    embedding when tied */
const ig_layer_weights_t *ig_model_layer(const ig_model_t *model, int layer);
/* Bytes of all weights as stored (after ig_model_quantize: as quantized). */
size_t ig_model_weight_bytes(const ig_model_t *model);

/*
 * Quantizes every 2-D weight of a loaded model (embedding, lm_head, the
 * seven matrices of each layer) to `to`, IG_DTYPE_Q8_0 or IG_DTYPE_Q4_0,
 * into memory the model owns; norms and biases keep their dtype. Each
 * tensor's mapped pages are handed back once it is done, so the process
 * holds about the quantized bytes, not those plus the file. Weights
 * already in a block format (Q8_0, Q4_0) stay as they are.
 * Call before any engine is created on the model. IG_EINVAL for another
 * dtype, IG_EMODEL when a matrix's columns are not a multiple of 32,
 * IG_ENOMEM; err names the tensor.
 */
int ig_model_quantize(ig_model_t *model, ig_dtype_t to, char *err, size_t errlen);

#endif
