/* Test support: writes random-weight models in Hugging Face layout. */
#include "model_fixture.h"
#include "files.h"

#include "infergate/dtype.h"
#include "infergate/error.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ========================================================================= */
/* Presets and writer                                                        */
/* ========================================================================= */

int ig_fixture_preset(const char *name, ig_fixture_spec_t *s)
{
    memset(s, 0, sizeof(*s));
    s->architecture = "LlamaForCausalLM";
    s->rope_scaling = "none";
    s->eps = 1e-5f;
    s->rope_theta = 10000.0f;
    s->max_pos = 256;
    s->dtype = IG_DTYPE_F32;
    s->seed = 1;
    if (strcmp(name, "tiny") == 0) {
        s->dim = 64, s->hidden = 172, s->layers = 2, s->heads = 4, s->kv_heads = 4;
        s->vocab = 512, s->tie = 1;
    } else if (strcmp(name, "gqa") == 0 || strcmp(name, "llama3") == 0 ||
               strcmp(name, "linear") == 0) {
        s->architecture = "Qwen2ForCausalLM";
        s->dim = 64, s->hidden = 128, s->layers = 2, s->heads = 4, s->kv_heads = 2;
        s->head_dim = 32, s->vocab = 384, s->tie = 0, s->bias = 1;
        s->rope_theta = 500000.0f;
        if (strcmp(name, "linear") == 0) {
            s->architecture = "MistralForCausalLM";
            s->bias = 0, s->tie = 1, s->rope_theta = 10000.0f;
            s->rope_scaling = "linear", s->rope_factor = 4.0f;
        }
        if (strcmp(name, "llama3") == 0) {
            s->architecture = "LlamaForCausalLM";
            s->bias = 0, s->head_dim = 16;
            s->rope_scaling = "llama3", s->rope_factor = 8.0f, s->rope_low = 1.0f;
            s->rope_high = 4.0f, s->rope_orig_max = 64;
        }
    } else if (strcmp(name, "small") == 0) {
        s->dim = 288, s->hidden = 768, s->layers = 6, s->heads = 6, s->kv_heads = 6;
        s->vocab = 32000, s->tie = 1, s->max_pos = 256;
    } else {
        return IG_EINVAL;
    }
    return 0;
}

typedef struct {
    uint64_t state;
} rng_t;

static double rng_uniform(rng_t *r) /* splitmix64 -> [-1, 1) */
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 52) - 1.0;
}

typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    float *data;
} ftensor_t;

static int add_tensor(ftensor_t *ts, int *n, rng_t *r, const char *name, int64_t rows, int64_t cols,
                      double scale, double center)
{
    ftensor_t *t = &ts[(*n)++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = cols > 0 ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    size_t count = (size_t)rows * (size_t)(cols > 0 ? cols : 1);
    t->data = malloc(count * sizeof(float));
    if (t->data == NULL)
        return IG_ENOMEM;
    for (size_t i = 0; i < count; i++)
        t->data[i] = (float)(center + scale * rng_uniform(r));
    return 0;
}

static int write_config(const ig_fixture_spec_t *s, const char *dir)
{
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", s->architecture));
    json_object_set_new(c, "model_type",
                        json_string(strstr(s->architecture, "Qwen2") ? "qwen2" : "llama"));
    json_object_set_new(c, "hidden_size", json_integer(s->dim));
    json_object_set_new(c, "intermediate_size", json_integer(s->hidden));
    json_object_set_new(c, "num_hidden_layers", json_integer(s->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(s->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(s->kv_heads));
    if (s->head_dim > 0)
        json_object_set_new(c, "head_dim", json_integer(s->head_dim));
    json_object_set_new(c, "rms_norm_eps", json_real(s->eps));
    json_object_set_new(c, "rope_theta", json_real(s->rope_theta));
    if (strcmp(s->rope_scaling, "linear") == 0) {
        json_object_set_new(
            c, "rope_scaling",
            json_pack("{s:s, s:f}", "rope_type", "linear", "factor", (double)s->rope_factor));
    } else if (strcmp(s->rope_scaling, "llama3") == 0) {
        json_object_set_new(c, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      (double)s->rope_factor, "low_freq_factor",
                                      (double)s->rope_low, "high_freq_factor", (double)s->rope_high,
                                      "original_max_position_embeddings", s->rope_orig_max));
    } else {
        json_object_set_new(c, "rope_scaling", json_null());
    }
    json_object_set_new(c, "vocab_size", json_integer(s->vocab));
    json_object_set_new(c, "max_position_embeddings", json_integer(s->max_pos));
    json_object_set_new(c, "tie_word_embeddings", json_boolean(s->tie));
    json_object_set_new(c, "attention_bias", json_boolean(s->bias));
    json_object_set_new(c, "bos_token_id", json_integer(1));
    json_object_set_new(c, "eos_token_id", json_integer(2));
    json_object_set_new(c, "torch_dtype",
                        json_string(s->dtype == IG_DTYPE_F32   ? "float32"
                                    : s->dtype == IG_DTYPE_F16 ? "float16"
                                                               : "bfloat16"));
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    int rc = json_dump_file(c, path, JSON_INDENT(2)) == 0 ? 0 : IG_EIO;
    json_decref(c);
    return rc;
}

int ig_fixture_write(const ig_fixture_spec_t *s, const char *dir)
{
    int hd = s->head_dim > 0 ? s->head_dim : s->dim / s->heads;
    int maxt = 4 + 12 * s->layers;
    ftensor_t *ts = calloc((size_t)maxt, sizeof(ftensor_t));
    int n = 0, rc = IG_ENOMEM;
    rng_t r = {s->seed * 0x2545f4914f6cdd1dull + 7};
    char name[96];
    char *hdr = NULL;
    FILE *f = NULL;
    if (ts == NULL)
        return IG_ENOMEM;
    double sd = 1.0 / sqrt((double)s->dim), sh = 1.0 / sqrt((double)s->hidden);
    double sq = 1.0 / sqrt((double)(s->heads * hd));
    if (add_tensor(ts, &n, &r, "model.embed_tokens.weight", s->vocab, s->dim, 1.0, 0))
        goto fail;
    for (int l = 0; l < s->layers; l++) {
#define T(suffix, rows, cols, scale, center)                                                       \
    snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);                                 \
    if (add_tensor(ts, &n, &r, name, rows, cols, scale, center))                                   \
        goto fail;
        T("input_layernorm.weight", s->dim, 0, 0.2, 1.0);
        T("self_attn.q_proj.weight", s->heads * hd, s->dim, 2 * sd, 0);
        T("self_attn.k_proj.weight", s->kv_heads * hd, s->dim, 2 * sd, 0);
        T("self_attn.v_proj.weight", s->kv_heads * hd, s->dim, sd, 0);
        if (s->bias) {
            T("self_attn.q_proj.bias", s->heads * hd, 0, 0.5, 0);
            T("self_attn.k_proj.bias", s->kv_heads * hd, 0, 0.5, 0);
            T("self_attn.v_proj.bias", s->kv_heads * hd, 0, 0.5, 0);
        }
        T("self_attn.o_proj.weight", s->dim, s->heads * hd, sq, 0);
        T("post_attention_layernorm.weight", s->dim, 0, 0.2, 1.0);
        T("mlp.gate_proj.weight", s->hidden, s->dim, 2 * sd, 0);
        T("mlp.up_proj.weight", s->hidden, s->dim, sd, 0);
        T("mlp.down_proj.weight", s->dim, s->hidden, sh, 0);
#undef T
    }
    if (add_tensor(ts, &n, &r, "model.norm.weight", s->dim, 0, 0.2, 1.0))
        goto fail;
    if (!s->tie && add_tensor(ts, &n, &r, "lm_head.weight", s->vocab, s->dim, sd, 0))
        goto fail;

    /* Header: names with dtype, shape and byte range, padded to 8 bytes. */
    size_t esz = ig_dtype_size(s->dtype);
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)ts[i].shape[0] * (ts[i].ndim == 2 ? ts[i].shape[1] : 1) * esz;
        json_t *shape = ts[i].ndim == 2 ? json_pack("[I, I]", (json_int_t)ts[i].shape[0],
                                                    (json_int_t)ts[i].shape[1])
                                        : json_pack("[I]", (json_int_t)ts[i].shape[0]);
        json_object_set_new(h, ts[i].name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", ig_dtype_name(s->dtype),
                                      "shape", shape, "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + bytes)));
        off += bytes;
    }
    hdr = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    if (hdr == NULL)
        goto fail;
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
    char path[4096];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    rc = IG_EIO;
    if ((f = fopen(path, "wb")) == NULL)
        goto fail;
    uint64_t le = padded; /* the build hosts are little-endian */
    fwrite(&le, 8, 1, f);
    fwrite(hdr, 1, hlen, f);
    for (size_t i = hlen; i < padded; i++)
        fputc(' ', f);
    for (int i = 0; i < n; i++) {
        size_t count = (size_t)ts[i].shape[0] * (ts[i].ndim == 2 ? ts[i].shape[1] : 1);
        if (s->dtype == IG_DTYPE_F32) {
            fwrite(ts[i].data, sizeof(float), count, f);
        } else {
            for (size_t j = 0; j < count; j++) {
                uint16_t v = s->dtype == IG_DTYPE_F16 ? ig_f32_to_f16(ts[i].data[j])
                                                      : ig_f32_to_bf16(ts[i].data[j]);
                fwrite(&v, 2, 1, f);
            }
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        goto fail;
    }
    f = NULL;
    rc = write_config(s, dir);

fail:
    if (f != NULL)
        fclose(f);
    free(hdr);
    for (int i = 0; i < n; i++)
        free(ts[i].data);
    free(ts);
    return rc;
}

int ig_fixture_model_dir(const char *name, ig_dtype_t dtype, char *buf, size_t len, int *real)
{
    ig_fixture_spec_t spec;
    if (real != NULL)
        *real = 0;
    if (ig_tf_mkdtemp(buf, len) != 0)
        return IG_EIO;
    const char *bin = getenv("IG_BIN_DIR");
#ifdef IG_BIN_DIR
    if (bin == NULL)
        bin = IG_BIN_DIR;
#endif
    if (bin != NULL && strcmp(name, "llama3") != 0 && strcmp(name, "linear") != 0) {
        char cmd[8192];
        snprintf(
            cmd, sizeof(cmd),
            "'%s/infergate' mkmodel --preset %s --out '%s' --seed 1 --dtype %s >/dev/null 2>&1",
            bin, name, buf,
            dtype == IG_DTYPE_F32   ? "f32"
            : dtype == IG_DTYPE_F16 ? "f16"
                                    : "bf16");
        int st = system(cmd);
        char cfg[4096];
        snprintf(cfg, sizeof(cfg), "%s/config.json", buf);
        if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && access(cfg, R_OK) == 0) {
            if (real != NULL)
                *real = 1;
            return 0;
        }
    }
    if (ig_fixture_preset(name, &spec) != 0)
        return IG_EINVAL;
    spec.dtype = dtype;
    return ig_fixture_write(&spec, buf);
}
