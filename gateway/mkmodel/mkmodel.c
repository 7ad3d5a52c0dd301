/*
 * `infergate mkmodel`: random-weight Llama-family models in Hugging Face
 * layout. Every value is an integer times a power of two, so it is exact in
 * F32 and the bytes do not depend on compiler flags (FMA contraction, x87).
 */
#include "infergate/cli.h"
#include "infergate/error.h"
#include "../engine/model_internal.h"
#include "infergate/mkmodel.h"
#include "infergate/model.h"
#include "infergate/safetensors.h"
#include "infergate/tokgen.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- presets ------------------------------------------------------------ */

typedef struct {
    const char *name;
    const char *summary;
    const char *architecture;
    const char *model_type;
    int dim, hidden, layers, heads, kv_heads, head_dim, vocab, max_pos;
    double rms_eps, rope_theta;
    ig_rope_scaling_t rope_scaling;
    double rope_factor, rope_low, rope_high;
    int rope_original_max_pos;
    int tied;
    int attention_bias;
    int qk_norm; /* Qwen3's per-head q_norm / k_norm */
    ig_dtype_t dtype;
    int shards;
    int tok_style; /* IG_TOKGEN_* */
} preset_t;

/* One row a preset: what it is, then its shape, its RoPE, and how it is
 * written (fields not named are 0: no biases, no RoPE scaling). A table,
 * kept out of clang-format, which would give every field its own line. */
/* clang-format off */
static const preset_t presets[] = {
    {.name = "tiny",
     .summary = "about 1.0M parameters: dim 128, 2 layers, 4 heads / 2 kv, vocab 4096, "
                "tied, Llama-2 sentencepiece tokenizer, F32",
     .architecture = "LlamaForCausalLM", .model_type = "llama",
     .dim = 128, .hidden = 512, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 32,
     .vocab = 4096, .max_pos = 512, .rms_eps = 1e-5, .rope_theta = 10000.0,
     .tied = 1, .dtype = IG_DTYPE_F32, .shards = 1, .tok_style = IG_TOKGEN_SENTENCEPIECE},
    {.name = "small",
     .summary = "the shape of stories15M: dim 288, 6 layers, 6 heads, hidden 768, vocab "
                "32000, tied, Llama-2 sentencepiece tokenizer, F32",
     .architecture = "LlamaForCausalLM", .model_type = "llama",
     .dim = 288, .hidden = 768, .layers = 6, .heads = 6, .kv_heads = 6, .head_dim = 48,
     .vocab = 32000, .max_pos = 256, .rms_eps = 1e-5, .rope_theta = 10000.0,
     .tied = 1, .dtype = IG_DTYPE_F32, .shards = 1, .tok_style = IG_TOKGEN_SENTENCEPIECE},
    {.name = "gqa",
     .summary = "Qwen2 with q/k/v biases: dim 256, 4 layers, 8 heads / 2 kv, vocab 8192, "
                "untied, rope_theta 500000, ChatML byte-level tokenizer, F32",
     .architecture = "Qwen2ForCausalLM", .model_type = "qwen2",
     .dim = 256, .hidden = 768, .layers = 4, .heads = 8, .kv_heads = 2, .head_dim = 32,
     .vocab = 8192, .max_pos = 2048, .rms_eps = 1e-6, .rope_theta = 500000.0,
     .tied = 0, .attention_bias = 1, .dtype = IG_DTYPE_F32, .shards = 1,
     .tok_style = IG_TOKGEN_CHATML},
    {.name = "qwen3",
     .summary = "Qwen3 with per-head q/k RMSNorm, no biases: dim 256, 4 layers, 8 heads / 2 kv, "
                "head_dim 64 (q is 512 wide), vocab 8192, tied, rope_theta 1000000, ChatML "
                "byte-level tokenizer, F32",
     .architecture = "Qwen3ForCausalLM", .model_type = "qwen3",
     .dim = 256, .hidden = 768, .layers = 4, .heads = 8, .kv_heads = 2, .head_dim = 64,
     .vocab = 8192, .max_pos = 4096, .rms_eps = 1e-6, .rope_theta = 1000000.0,
     .tied = 1, .qk_norm = 1, .dtype = IG_DTYPE_F32, .shards = 1,
     .tok_style = IG_TOKGEN_CHATML},
    {.name = "1b",
     .summary = "the shape of Llama-3.2-1B: dim 2048, 16 layers, 32 heads / 8 kv, vocab "
                "128256, llama3 rope scaling, tied, Llama-3 byte-level tokenizer, BF16, "
                "2 shards",
     .architecture = "LlamaForCausalLM", .model_type = "llama",
     .dim = 2048, .hidden = 8192, .layers = 16, .heads = 32, .kv_heads = 8, .head_dim = 64,
     .vocab = 128256, .max_pos = 131072, .rms_eps = 1e-5, .rope_theta = 500000.0,
     .rope_scaling = IG_ROPE_LLAMA3, .rope_factor = 32.0, .rope_low = 1.0, .rope_high = 4.0,
     .rope_original_max_pos = 8192,
     .tied = 1, .dtype = IG_DTYPE_BF16, .shards = 2, .tok_style = IG_TOKGEN_BYTE_LEVEL},
};
/* clang-format on */

#define NPRESETS (sizeof(presets) / sizeof(presets[0]))

const char *ig_mkmodel_preset_name(size_t i)
{
    return i < NPRESETS ? presets[i].name : NULL;
}

const char *ig_mkmodel_preset_summary(size_t i)
{
    return i < NPRESETS ? presets[i].summary : NULL;
}

/* The preset called name, or NULL. */
static const preset_t *find_preset(const char *name)
{
    for (size_t i = 0; name != NULL && i < NPRESETS; i++)
        if (strcmp(name, presets[i].name) == 0)
            return &presets[i];
    return NULL;
}

void ig_mkmodel_opts_default(ig_mkmodel_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->preset = "tiny";
    opts->seed = 1;
}

/* Special token ids, where ig_tokgen_write() puts them: sentencepiece
 * vocabularies start with <unk> 0, <s> 1, </s> 2 (Llama-2); byte-level ones
 * end with <|begin_of_text|> V-5, <|end_of_text|> V-4, <|start_header_id|>,
 * <|end_header_id|>, <|eot_id|> V-1 (Llama-3); ChatML ones end with
 * <|endoftext|> V-3, <|im_start|> V-2, <|im_end|> V-1 and have no BOS (Qwen2).
 * test_mkmodel_presets checks these against the written tokenizer. */
static int preset_bos(const preset_t *p)
{
    switch (p->tok_style) {
    case IG_TOKGEN_SENTENCEPIECE:
        return 1;
    case IG_TOKGEN_BYTE_LEVEL:
        return p->vocab - 5;
    default:
        return -1;
    }
}

/* The ids that end generation; the first is config.json's eos_token_id,
 * all of them go to generation_config.json (as the Instruct models do). */
static int preset_eos(const preset_t *p, int *ids)
{
    switch (p->tok_style) {
    case IG_TOKGEN_SENTENCEPIECE:
        ids[0] = 2;
        return 1;
    case IG_TOKGEN_BYTE_LEVEL:
        ids[0] = p->vocab - 4; /* <|end_of_text|> */
        ids[1] = p->vocab - 1; /* <|eot_id|> */
        return 2;
    default:
        ids[0] = p->vocab - 1; /* <|im_end|> */
        ids[1] = p->vocab - 3; /* <|endoftext|> */
        return 2;
    }
}

/* ---- random values ------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

typedef enum {
    INIT_WEIGHT, /* N(0, ~0.018): k * 2^-21 */
    INIT_NORM,   /* 1 + N(0, ~0.0045) */
} init_t;

/* Fills n values: a sum of four 16-bit uniforms (Irwin-Hall, close to a
 * normal; std 37837) centred on zero, times a power of two. */
static void fill(float *dst, size_t n, uint64_t *state, init_t init)
{
    const float w = 1.0f / 2097152.0f;  /* 2^-21 */
    const float nw = 1.0f / 8388608.0f; /* 2^-23 */
    for (size_t i = 0; i < n; i++) {
        uint64_t x = splitmix64(state);
        int32_t k = (int32_t)(x & 0xffff) + (int32_t)((x >> 16) & 0xffff) +
                    (int32_t)((x >> 32) & 0xffff) + (int32_t)(x >> 48) - 131070;
        dst[i] = init == INIT_NORM ? 1.0f + (float)k * nw : (float)k * w;
    }
}

/* ---- tensor list --------------------------------------------------------- */

typedef struct {
    char name[80];
    init_t init;
    int ndim;
    int64_t shape[2];
    uint64_t nbytes;
    int shard;
} tensor_t;

static void add(tensor_t *t, size_t *n, const char *name, init_t init, int ndim, int64_t d0,
                int64_t d1, ig_dtype_t dtype)
{
    tensor_t *x = &t[(*n)++];
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->init = init;
    x->ndim = ndim;
    x->shape[0] = d0;
    x->shape[1] = ndim > 1 ? d1 : 0;
    x->nbytes = (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1) * ig_dtype_size(dtype);
}

/* The tensors in Hugging Face's order; t must hold 3 + 14 * layers. */
static size_t list_tensors(tensor_t *t, const preset_t *p, ig_dtype_t dtype)
{
    size_t n = 0;
    char name[80];
    int64_t q = (int64_t)p->heads * p->head_dim, kv = (int64_t)p->kv_heads * p->head_dim;
    add(t, &n, "model.embed_tokens.weight", INIT_WEIGHT, 2, p->vocab, p->dim, dtype);
    for (int l = 0; l < p->layers; l++) {
        const struct {
            const char *suffix;
            init_t init;
            int ndim;
            int64_t d0, d1;
            int bias; /* 1: a q/k/v bias, 2: a q/k norm */
        } parts[] = {
            {"input_layernorm.weight", INIT_NORM, 1, p->dim, 0, 0},
            {"self_attn.q_proj.weight", INIT_WEIGHT, 2, q, p->dim, 0},
            {"self_attn.q_proj.bias", INIT_WEIGHT, 1, q, 0, 1},
            {"self_attn.k_proj.weight", INIT_WEIGHT, 2, kv, p->dim, 0},
            {"self_attn.k_proj.bias", INIT_WEIGHT, 1, kv, 0, 1},
            {"self_attn.v_proj.weight", INIT_WEIGHT, 2, kv, p->dim, 0},
            {"self_attn.v_proj.bias", INIT_WEIGHT, 1, kv, 0, 1},
            {"self_attn.o_proj.weight", INIT_WEIGHT, 2, p->dim, q, 0},
            {"self_attn.q_norm.weight", INIT_NORM, 1, p->head_dim, 0, 2},
            {"self_attn.k_norm.weight", INIT_NORM, 1, p->head_dim, 0, 2},
            {"post_attention_layernorm.weight", INIT_NORM, 1, p->dim, 0, 0},
            {"mlp.gate_proj.weight", INIT_WEIGHT, 2, p->hidden, p->dim, 0},
            {"mlp.up_proj.weight", INIT_WEIGHT, 2, p->hidden, p->dim, 0},
            {"mlp.down_proj.weight", INIT_WEIGHT, 2, p->dim, p->hidden, 0},
        };
        for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
            if ((parts[i].bias == 1 && !p->attention_bias) || (parts[i].bias == 2 && !p->qk_norm))
                continue;
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, parts[i].suffix);
            add(t, &n, name, parts[i].init, parts[i].ndim, parts[i].d0, parts[i].d1, dtype);
        }
    }
    add(t, &n, "model.norm.weight", INIT_NORM, 1, p->dim, 0, dtype);
    if (!p->tied)
        add(t, &n, "lm_head.weight", INIT_WEIGHT, 2, p->vocab, p->dim, dtype);
    return n;
}

/* Splits the tensors, in order, into nshards runs of about equal bytes. */
static void assign_shards(tensor_t *t, size_t n, int nshards)
{
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < n; i++)
        total += t[i].nbytes;
    int s = 0;
    for (size_t i = 0; i < n; i++) {
        /* Move on once this shard has its share, keeping one tensor for each
         * shard still to come. */
        size_t left = n - i;
        if (s < nshards - 1 && i > 0 && t[i - 1].shard == s &&
            (done >= total / (uint64_t)nshards * (uint64_t)(s + 1) ||
             left == (size_t)(nshards - 1 - s)))
            s++;
        t[i].shard = s;
        done += t[i].nbytes;
    }
}

/* ---- writing -------------------------------------------------------------- */

static int mkdirs(const char *dir, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path)) {
        ig_errf(err, errlen, "%s: path too long", dir);
        return IG_EINVAL;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            ig_errf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
            return IG_EIO;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    return 0;
}

#define CHUNK 16384

static int write_shard(const char *path, const tensor_t *t, size_t n, int shard, ig_dtype_t dtype,
                       uint64_t seed, char *err, size_t errlen)
{
    int rc = 0;
    size_t count = 0;
    ig_safetensors_spec_t *specs = calloc(n, sizeof(*specs));
    float *vals = malloc(CHUNK * sizeof(float));
    unsigned char *bytes = malloc(CHUNK * sizeof(float));
    ig_safetensors_writer_t *w = NULL;
    if (specs == NULL || vals == NULL || bytes == NULL) {
        rc = IG_ENOMEM;
        ig_errf(err, errlen, "mkmodel: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        if (t[i].shard != shard)
            continue;
        specs[count] =
            (ig_safetensors_spec_t){.name = t[i].name, .dtype = dtype, .ndim = t[i].ndim};
        specs[count].shape[0] = t[i].shape[0];
        specs[count].shape[1] = t[i].shape[1];
        count++;
    }
    if ((rc = ig_safetensors_writer_open(&w, path, specs, count, err, errlen)) != 0)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        if (t[i].shard != shard)
            continue;
        /* Each tensor has its own stream, so its values do not depend on
         * which tensors come before it or on the shard layout. */
        uint64_t state = seed ^ fnv1a64(t[i].name);
        uint64_t left = t[i].nbytes / ig_dtype_size(dtype);
        while (left > 0) {
            size_t m = left < CHUNK ? (size_t)left : CHUNK;
            fill(vals, m, &state, t[i].init);
            ig_dtype_from_f32(bytes, dtype, vals, m);
            if ((rc = ig_safetensors_writer_write(w, bytes, m * ig_dtype_size(dtype), err,
                                                  errlen)) != 0)
                goto fail;
            left -= m;
        }
    }
    rc = ig_safetensors_writer_close(w, err, errlen);
    w = NULL;

fail:
    ig_safetensors_writer_abort(w);
    free(specs);
    free(vals);
    free(bytes);
    return rc;
}

static int dump_json(json_t *root, const char *dir, const char *name, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (root == NULL) {
        ig_errf(err, errlen, "%s: out of memory", name);
        return IG_ENOMEM;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(root);
    if (rc != 0) {
        ig_errf(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        return IG_EIO;
    }
    return 0;
}

static json_t *eos_json(const int *ids, int n)
{
    if (n == 1)
        return json_integer(ids[0]);
    json_t *a = json_array();
    for (int i = 0; i < n && a; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *bos_json(const preset_t *p)
{
    return preset_bos(p) < 0 ? json_null() : json_integer(preset_bos(p));
}

static int write_config(const char *dir, const preset_t *p, ig_dtype_t dtype, char *err,
                        size_t errlen)
{
    static const char *torch_names[] = {"float32", "float16", "bfloat16"};
    int eos[IG_MAX_EOS];
    preset_eos(p, eos);
    json_t *c = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:f, s:i, s:b, s:o, s:i, "
        "s:s, s:f, s:b}",
        "architectures", p->architecture, "model_type", p->model_type, "hidden_size", p->dim,
        "intermediate_size", p->hidden, "num_hidden_layers", p->layers, "num_attention_heads",
        p->heads, "num_key_value_heads", p->kv_heads, "head_dim", p->head_dim, "hidden_act", "silu",
        "max_position_embeddings", p->max_pos, "rms_norm_eps", p->rms_eps, "rope_theta",
        p->rope_theta, "vocab_size", p->vocab, "tie_word_embeddings", p->tied, "bos_token_id",
        bos_json(p), "eos_token_id", eos[0], "torch_dtype", torch_names[dtype], "initializer_range",
        0.02, "use_cache", 1);
    if (c == NULL) {
        ig_errf(err, errlen, "config.json: out of memory");
        return IG_ENOMEM;
    }
    if (strcmp(p->model_type, "qwen2") != 0) {
        json_object_set_new(c, "attention_bias", json_boolean(p->attention_bias));
        json_object_set_new(c, "mlp_bias", json_false());
    }
    if (p->rope_scaling == IG_ROPE_LLAMA3)
        json_object_set_new(
            c, "rope_scaling",
            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", p->rope_factor,
                      "low_freq_factor", p->rope_low, "high_freq_factor", p->rope_high,
                      "original_max_position_embeddings", p->rope_original_max_pos));
    else if (p->rope_scaling == IG_ROPE_LINEAR)
        json_object_set_new(
            c, "rope_scaling",
            json_pack("{s:s, s:f}", "rope_type", "linear", "factor", p->rope_factor));
    else
        json_object_set_new(c, "rope_scaling", json_null());
    return dump_json(c, dir, "config.json", err, errlen);
}

static int write_generation_config(const char *dir, const preset_t *p, char *err, size_t errlen)
{
    int eos[IG_MAX_EOS];
    int n = preset_eos(p, eos);
    json_t *g =
        json_pack("{s:o, s:o}", "bos_token_id", bos_json(p), "eos_token_id", eos_json(eos, n));
    return dump_json(g, dir, "generation_config.json", err, errlen);
}

static int write_index(const char *dir, const tensor_t *t, size_t n, int nshards, char *err,
                       size_t errlen)
{
    char file[64];
    uint64_t total = 0;
    json_t *map = json_object();
    for (size_t i = 0; i < n && map; i++) {
        snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", t[i].shard + 1, nshards);
        json_object_set_new(map, t[i].name, json_string(file));
        total += t[i].nbytes;
    }
    json_t *idx =
        json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
    return dump_json(idx, dir, "model.safetensors.index.json", err, errlen);
}

/* tokenizer.json and tokenizer_config.json, from the tokenizer module's
 * generator; its special token ids are the ones preset_bos()/preset_eos()
 * name. It trains a BPE vocabulary, CPU work that runs on its own thread
 * while the weights, mostly I/O, are written. */
typedef struct {
    const char *dir;
    const preset_t *p;
    uint64_t seed;
    int rc;
    char err[256];
} tokjob_t;

static void *write_tokenizer(void *arg)
{
    tokjob_t *j = arg;
    j->rc = ig_tokgen_write(j->dir, j->p->vocab, j->p->tok_style, j->seed, j->err, sizeof(j->err));
    return NULL;
}

int ig_mkmodel_write(const char *dir, const ig_mkmodel_opts_t *opts, char *err, size_t errlen)
{
    int rc = 0;
    const preset_t *p = NULL;
    tensor_t *t = NULL;
    char path[PATH_MAX];
    tokjob_t job = {0};
    pthread_t tok_thread;
    int tok_started = 0;

    if ((p = find_preset(opts->preset)) == NULL) {
        ig_errf(err, errlen, "unknown preset \"%s\" (tiny, small, gqa, 1b)",
                opts->preset ? opts->preset : "");
        return IG_EINVAL;
    }
    ig_dtype_t dtype = opts->has_dtype ? opts->dtype : p->dtype;
    int nshards = opts->shards > 0 ? opts->shards : p->shards;
    size_t cap = 3 + 14 * (size_t)p->layers;
    if (nshards > 99 || (size_t)nshards > cap || ig_dtype_size(dtype) == 0) {
        ig_errf(err, errlen, "shards must be 1..99 and at most the tensor count");
        return IG_EINVAL;
    }
    if ((rc = mkdirs(dir, err, errlen)) != 0)
        return rc;
    if (strlen(dir) + 64 >= sizeof(path)) {
        ig_errf(err, errlen, "%s: path too long", dir);
        return IG_EINVAL;
    }
    t = calloc(cap, sizeof(*t));
    if (t == NULL) {
        ig_errf(err, errlen, "mkmodel: out of memory");
        return IG_ENOMEM;
    }
    size_t n = list_tensors(t, p, dtype);
    if ((size_t)nshards > n) {
        rc = IG_EINVAL;
        ig_errf(err, errlen, "shards: %d is more than the %zu tensors", nshards, n);
        goto fail;
    }
    assign_shards(t, n, nshards);

    /* A stale index would make the loader ignore a new single file, and the
     * other way round: remove whichever layout is not written now. */
    snprintf(path, sizeof(path), "%s/%s", dir,
             nshards > 1 ? "model.safetensors" : "model.safetensors.index.json");
    unlink(path);

    if (!opts->no_tokenizer) {
        job = (tokjob_t){.dir = dir, .p = p, .seed = opts->seed};
        if (pthread_create(&tok_thread, NULL, write_tokenizer, &job) == 0) {
            tok_started = 1;
        } else {
            write_tokenizer(&job); /* no thread: do it here */
            if ((rc = job.rc) != 0) {
                ig_errf(err, errlen, "%s", job.err);
                goto fail;
            }
        }
    }
    if ((rc = write_config(dir, p, dtype, err, errlen)) != 0 ||
        (rc = write_generation_config(dir, p, err, errlen)) != 0)
        goto fail;
    for (int s = 0; s < nshards; s++) {
        if (nshards == 1)
            snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        else
            snprintf(path, sizeof(path), "%s/model-%05d-of-%05d.safetensors", dir, s + 1, nshards);
        if ((rc = write_shard(path, t, n, s, dtype, opts->seed, err, errlen)) != 0)
            goto fail;
    }
    if (nshards > 1 && (rc = write_index(dir, t, n, nshards, err, errlen)) != 0)
        goto fail;

fail:
    if (tok_started) {
        pthread_join(tok_thread, NULL);
        if (rc == 0 && (rc = job.rc) != 0)
            ig_errf(err, errlen, "%s", job.err);
    }
    free(t);
    return rc;
}

/* ---- command line ------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out, "usage: infergate mkmodel --preset NAME --out DIR [--seed N] "
                 "[--dtype f32|f16|bf16] [--shards N] [--no-tokenizer]\n"
                 "       infergate mkmodel --preset NAME --format gguf --out FILE.gguf "
                 "[--seed N] [--dtype T] [--quantize q8_0|q4_0|q4_k_m]\n\n"
                 "Writes a random-weight Llama-family model in Hugging Face layout (config.json,\n"
                 "generation_config.json, model.safetensors or shards with an index, tokenizer).\n"
                 "The same preset, seed, dtype and shard count give the same bytes.\n\n"
                 "  --preset NAME   model shape (below)\n"
                 "  --out DIR       output directory, created when missing\n"
                 "  --seed N        seed of the weights (default 1)\n"
                 "  --dtype T       f32, f16 or bf16 (default: the preset's)\n"
                 "  --shards N      split the weights into N files (default: the preset's)\n"
                 "  --no-tokenizer  write no tokenizer files (the weights only, faster)\n"
                 "  --format F      hf (the default) or gguf: one GGUF file (llama presets),\n"
                 "                  the same weights as hf with the same seed and dtype\n"
                 "  --quantize Q     with --format gguf: matrices as q8_0, q4_0, or q4_k_m\n"
                 "                  (Q4_K and Q6_K mixed as llama-quantize does)\n"
                 "  --help          this text\n\npresets:\n");
    for (size_t i = 0; i < NPRESETS; i++)
        fprintf(out, "  %-6s %s\n", presets[i].name, presets[i].summary);
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

/* --format gguf: the model in Hugging Face layout in a scratch directory
 * beside out (one shard, with its tokenizer), converted (gguf_out.c), the
 * scratch directory removed. */
static int write_gguf(const char *out, ig_mkmodel_opts_t *opts, ig_dtype_t quant)
{
    static const char *const files[] = {"config.json", "generation_config.json",
                                        "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json"};
    char tmp[4200], p[4300], err[512];
    snprintf(tmp, sizeof(tmp), "%s.hf.tmp", out);
    opts->shards = 1;
    opts->no_tokenizer = 0;
    int rc = ig_mkmodel_write(tmp, opts, err, sizeof(err));
    if (rc == 0)
        rc = ig_mkmodel_to_gguf(tmp, out, quant, err, sizeof(err));
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", tmp, files[i]);
        unlink(p);
    }
    rmdir(tmp);
    if (rc != 0) {
        fprintf(stderr, "infergate mkmodel: %s\n", err);
        return rc == IG_EINVAL ? IG_EXIT_USAGE : IG_EXIT_FAILURE;
    }
    ig_model_t *m = NULL;
    if ((rc = ig_model_load(&m, out, err, sizeof(err))) != 0) {
        fprintf(stderr, "infergate mkmodel: written GGUF does not load: %s\n", err);
        return IG_EXIT_FAILURE;
    }
    printf("wrote %s as GGUF (%s, %.1f MB of weights) to %s\n", opts->preset,
           quant == IG_DTYPE_Q4_K ? "Q4_K_M" : ig_dtype_name(ig_model_config(m)->dtype),
           (double)ig_model_weight_bytes(m) / 1e6, out);
    ig_model_free(m);
    return IG_EXIT_OK;
}

int ig_cmd_mkmodel(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"preset", required_argument, NULL, 'p'},   {"out", required_argument, NULL, 'o'},
        {"seed", required_argument, NULL, 's'},     {"dtype", required_argument, NULL, 'd'},
        {"shards", required_argument, NULL, 'n'},   {"no-tokenizer", no_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},           {"format", required_argument, NULL, 'f'},
        {"quantize", required_argument, NULL, 'q'}, {NULL, 0, NULL, 0},
    };
    int gguf = 0;
    ig_dtype_t quant = IG_DTYPE_F32; /* none */
    ig_mkmodel_opts_t opts;
    const char *out = NULL, *preset = NULL;
    char err[512];
    uint64_t v;
    int c;
    ig_mkmodel_opts_default(&opts);
    optind = 0; /* glibc: a full reset, the gateway may have parsed its own flags */
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'p':
            preset = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 's':
            if (parse_u64(optarg, &opts.seed) != 0) {
                fprintf(stderr, "infergate mkmodel: --seed: \"%s\" is not an unsigned integer\n",
                        optarg);
                return IG_EXIT_USAGE;
            }
            break;
        case 'd':
            if (ig_dtype_parse_user(optarg, &opts.dtype) != 0) {
                fprintf(stderr, "infergate mkmodel: --dtype: \"%s\" is not f32, f16 or bf16\n",
                        optarg);
                return IG_EXIT_USAGE;
            }
            opts.has_dtype = 1;
            break;
        case 'n':
            if (parse_u64(optarg, &v) != 0 || v < 1 || v > 99) {
                fprintf(stderr, "infergate mkmodel: --shards: \"%s\" is not 1..99\n", optarg);
                return IG_EXIT_USAGE;
            }
            opts.shards = (int)v;
            break;
        case 't':
            opts.no_tokenizer = 1;
            break;
        case 'f':
            if (strcmp(optarg, "gguf") != 0 && strcmp(optarg, "hf") != 0) {
                fprintf(stderr, "infergate mkmodel: --format: \"%s\" is not hf or gguf\n", optarg);
                return IG_EXIT_USAGE;
            }
            gguf = strcmp(optarg, "gguf") == 0;
            break;
        case 'q':
            if (strcmp(optarg, "q8_0") == 0)
                quant = IG_DTYPE_Q8_0;
            else if (strcmp(optarg, "q4_0") == 0)
                quant = IG_DTYPE_Q4_0;
            else if (strcmp(optarg, "q4_k_m") == 0)
                quant = IG_DTYPE_Q4_K;
            else {
                fprintf(stderr,
                        "infergate mkmodel: --quantize: \"%s\" is not q8_0, q4_0 or q4_k_m\n",
                        optarg);
                return IG_EXIT_USAGE;
            }
            break;
        case 'h':
            usage(stdout);
            return IG_EXIT_OK;
        case ':':
            fprintf(stderr, "infergate mkmodel: %s needs a value\n", argv[optind - 1]);
            return IG_EXIT_USAGE;
        default:
            fprintf(stderr, "infergate mkmodel: unknown option %s\n\n", argv[optind - 1]);
            usage(stderr);
            return IG_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "infergate mkmodel: unexpected argument \"%s\"\n", argv[optind]);
        return IG_EXIT_USAGE;
    }
    if (preset == NULL || out == NULL) {
        fprintf(stderr, "infergate mkmodel: --preset and --out are required\n\n");
        usage(stderr);
        return IG_EXIT_USAGE;
    }
    if (find_preset(preset) == NULL) {
        fprintf(stderr, "infergate mkmodel: unknown preset \"%s\" (tiny, small, gqa, 1b)\n",
                preset);
        return IG_EXIT_USAGE;
    }
    opts.preset = preset;
    if (quant != IG_DTYPE_F32 && !gguf) {
        fprintf(stderr, "infergate mkmodel: --quantize needs --format gguf (a worker quantizes "
                        "a Hugging Face model itself: worker --quantize q8_0)\n");
        return IG_EXIT_USAGE;
    }
    if (gguf)
        return write_gguf(out, &opts, quant);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ig_mkmodel_write(out, &opts, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "infergate mkmodel: %s\n", err);
        return rc == IG_EINVAL ? IG_EXIT_USAGE : IG_EXIT_FAILURE;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ig_model_t *m = NULL;
    if ((rc = ig_model_load(&m, out, err, sizeof(err))) != 0) {
        /* A file that does not load back is a bug here, not bad input. */
        fprintf(stderr, "infergate mkmodel: written model does not load: %s\n", err);
        return IG_EXIT_FAILURE;
    }
    const ig_model_config_t *cfg = ig_model_config(m);
    size_t bytes = ig_model_weight_bytes(m);
    printf("wrote %s (%s, %zu parameters, %s, %.1f MB) to %s in %.2f s\n", preset,
           cfg->architecture, bytes / ig_dtype_size(cfg->dtype), ig_dtype_name(cfg->dtype),
           (double)bytes / 1e6, out,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    ig_model_free(m);
    return IG_EXIT_OK;
}
