/*
 * Test support: writes random-weight models in Hugging Face layout, and
 * weak stand-ins for the model loader until the real one is linked in.
 */
#include "model_fixture.h"

#include "infergate/error.h"

#include <dirent.h>
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

#define WEAK __attribute__((weak))

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
    } else if (strcmp(name, "gqa") == 0 || strcmp(name, "llama3") == 0) {
        s->architecture = "Qwen2ForCausalLM";
        s->dim = 64, s->hidden = 128, s->layers = 2, s->heads = 4, s->kv_heads = 2;
        s->head_dim = 32, s->vocab = 384, s->tie = 0, s->bias = 1;
        s->rope_theta = 500000.0f;
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

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int exp = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (exp <= 0) { /* the weights here never get this small; flush */
        return (uint16_t)sign;
    }
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++;
    return (uint16_t)h;
}

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
                uint16_t v = s->dtype == IG_DTYPE_F16 ? f32_to_f16(ts[i].data[j])
                                                      : f32_to_bf16(ts[i].data[j]);
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

int ig_fixture_tmpdir(char *buf, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(buf, len, "%s/igtest-XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(buf) != NULL ? 0 : IG_EIO;
}

void ig_fixture_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

int ig_fixture_model_dir(const char *name, char *buf, size_t len, int *real)
{
    ig_fixture_spec_t spec;
    if (real != NULL)
        *real = 0;
    if (ig_fixture_tmpdir(buf, len) != 0)
        return IG_EIO;
    const char *bin = getenv("IG_BIN_DIR");
#ifdef IG_BIN_DIR
    if (bin == NULL)
        bin = IG_BIN_DIR;
#endif
    if (bin != NULL && strcmp(name, "llama3") != 0) {
        char cmd[8192];
        snprintf(cmd, sizeof(cmd),
                 "'%s/infergate' mkmodel --preset %s --out '%s' --seed 1 >/dev/null 2>&1", bin,
                 name, buf);
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
    return ig_fixture_write(&spec, buf);
}

/* ========================================================================= */
/* Weak stand-in loader (F32/F16/BF16, single file)                          */
/* ========================================================================= */

struct ig_model_s {
    ig_model_config_t cfg;
    char dir[1024];
    void *map;
    size_t maplen;
    ig_tensor_t embed, norm, lm_head;
    ig_layer_weights_t *layers;
    size_t weight_bytes;
};

WEAK size_t ig_dtype_size(ig_dtype_t dtype)
{
    return dtype == IG_DTYPE_F32 ? 4 : 2;
}

WEAK const char *ig_dtype_name(ig_dtype_t dtype)
{
    return dtype == IG_DTYPE_F32 ? "F32" : dtype == IG_DTYPE_F16 ? "F16" : "BF16";
}

static int jint(json_t *o, const char *k, int def)
{
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int)json_integer_value(v) : def;
}

static double jnum(json_t *o, const char *k, double def)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : def;
}

static int find_tensor(ig_model_t *m, json_t *hdr, const char *base, const char *name,
                       ig_tensor_t *t, int required)
{
    json_t *e = json_object_get(hdr, name);
    memset(t, 0, sizeof(*t));
    if (e == NULL)
        return required ? IG_EMODEL : 0;
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
    if (dt == NULL || !json_is_array(shape) || !json_is_array(offs))
        return IG_EMODEL;
    t->dtype = strcmp(dt, "F32") == 0   ? IG_DTYPE_F32
               : strcmp(dt, "F16") == 0 ? IG_DTYPE_F16
                                        : IG_DTYPE_BF16;
    t->ndim = (int)json_array_size(shape);
    if (t->ndim < 1 || t->ndim > 4)
        return IG_EMODEL;
    for (int i = 0; i < t->ndim; i++)
        t->shape[i] = json_integer_value(json_array_get(shape, i));
    size_t b = (size_t)json_integer_value(json_array_get(offs, 0));
    t->data = (const char *)base + b;
    size_t e2 = (size_t)json_integer_value(json_array_get(offs, 1));
    m->weight_bytes += e2 - b;
    return 0;
}

WEAK int ig_model_load(ig_model_t **out, const char *dir, char *err, size_t errlen)
{
    char path[2048];
    int rc = IG_EMODEL, fd = -1;
    json_t *cfg = NULL, *hdr = NULL;
    ig_model_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return IG_ENOMEM;
    snprintf(m->dir, sizeof(m->dir), "%s", dir);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    json_error_t je;
    if ((cfg = json_load_file(path, 0, &je)) == NULL) {
        snprintf(err, errlen, "%s: %s", path, je.text);
        goto fail;
    }
    ig_model_config_t *c = &m->cfg;
    json_t *arch = json_array_get(json_object_get(cfg, "architectures"), 0);
    snprintf(c->architecture, sizeof(c->architecture), "%s",
             json_is_string(arch) ? json_string_value(arch) : "LlamaForCausalLM");
    c->hidden_size = jint(cfg, "hidden_size", 0);
    c->intermediate_size = jint(cfg, "intermediate_size", 0);
    c->num_hidden_layers = jint(cfg, "num_hidden_layers", 0);
    c->num_attention_heads = jint(cfg, "num_attention_heads", 1);
    c->num_key_value_heads = jint(cfg, "num_key_value_heads", c->num_attention_heads);
    c->head_dim = jint(cfg, "head_dim", c->hidden_size / c->num_attention_heads);
    c->rms_norm_eps = (float)jnum(cfg, "rms_norm_eps", 1e-6);
    c->rope_theta = (float)jnum(cfg, "rope_theta", 10000.0);
    c->vocab_size = jint(cfg, "vocab_size", 0);
    c->max_position_embeddings = jint(cfg, "max_position_embeddings", 2048);
    c->tie_word_embeddings = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
    c->attention_bias = json_is_true(json_object_get(cfg, "attention_bias"));
    c->bos_token_id = jint(cfg, "bos_token_id", -1);
    c->eos_token_ids[0] = jint(cfg, "eos_token_id", -1);
    c->n_eos = 1;
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if (json_is_object(rs)) {
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (type == NULL)
            type = json_string_value(json_object_get(rs, "type"));
        c->rope_factor = (float)jnum(rs, "factor", 1.0);
        if (type != NULL && strcmp(type, "linear") == 0) {
            c->rope_scaling = IG_ROPE_LINEAR;
        } else if (type != NULL && strcmp(type, "llama3") == 0) {
            c->rope_scaling = IG_ROPE_LLAMA3;
            c->rope_low_freq_factor = (float)jnum(rs, "low_freq_factor", 1.0);
            c->rope_high_freq_factor = (float)jnum(rs, "high_freq_factor", 4.0);
            c->rope_original_max_position = jint(rs, "original_max_position_embeddings", 8192);
        }
    }

    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    struct stat st;
    if ((fd = open(path, O_RDONLY)) < 0 || fstat(fd, &st) != 0 || st.st_size < 8) {
        snprintf(err, errlen, "%s: cannot open", path);
        rc = IG_ENOENT;
        goto fail;
    }
    m->maplen = (size_t)st.st_size;
    m->map = mmap(NULL, m->maplen, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m->map == MAP_FAILED) {
        m->map = NULL;
        goto fail;
    }
    uint64_t hl;
    memcpy(&hl, m->map, 8);
    if (hl + 8 > m->maplen || (hdr = json_loadb((const char *)m->map + 8, hl, 0, &je)) == NULL) {
        snprintf(err, errlen, "%s: bad header", path);
        goto fail;
    }
    const char *base = (const char *)m->map + 8 + hl;
    json_t *first = json_object_get(hdr, "model.embed_tokens.weight");
    const char *dt = first ? json_string_value(json_object_get(first, "dtype")) : "F32";
    c->dtype = dt && strcmp(dt, "F16") == 0    ? IG_DTYPE_F16
               : dt && strcmp(dt, "BF16") == 0 ? IG_DTYPE_BF16
                                               : IG_DTYPE_F32;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof(*m->layers));
    if (m->layers == NULL) {
        rc = IG_ENOMEM;
        goto fail;
    }
    if (find_tensor(m, hdr, base, "model.embed_tokens.weight", &m->embed, 1) ||
        find_tensor(m, hdr, base, "model.norm.weight", &m->norm, 1) ||
        find_tensor(m, hdr, base, "lm_head.weight", &m->lm_head, 0))
        goto fail;
    if (m->lm_head.data == NULL)
        m->lm_head = m->embed;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        ig_layer_weights_t *w = &m->layers[l];
        struct {
            const char *n;
            ig_tensor_t *t;
            int req;
        } list[] = {
            {"input_layernorm.weight", &w->attn_norm, 1},
            {"self_attn.q_proj.weight", &w->wq, 1},
            {"self_attn.k_proj.weight", &w->wk, 1},
            {"self_attn.v_proj.weight", &w->wv, 1},
            {"self_attn.o_proj.weight", &w->wo, 1},
            {"self_attn.q_proj.bias", &w->bq, 0},
            {"self_attn.k_proj.bias", &w->bk, 0},
            {"self_attn.v_proj.bias", &w->bv, 0},
            {"post_attention_layernorm.weight", &w->mlp_norm, 1},
            {"mlp.gate_proj.weight", &w->w_gate, 1},
            {"mlp.up_proj.weight", &w->w_up, 1},
            {"mlp.down_proj.weight", &w->w_down, 1},
        };
        for (size_t i = 0; i < sizeof(list) / sizeof(list[0]); i++) {
            char name[128];
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, list[i].n);
            if (find_tensor(m, hdr, base, name, list[i].t, list[i].req)) {
                snprintf(err, errlen, "%s: %s: missing or malformed", path, name);
                goto fail;
            }
        }
    }
    json_decref(cfg);
    json_decref(hdr);
    close(fd);
    *out = m;
    return 0;

fail:
    if (fd >= 0)
        close(fd);
    json_decref(cfg);
    json_decref(hdr);
    ig_model_free(m);
    return rc;
}

WEAK void ig_model_free(ig_model_t *m)
{
    if (m == NULL)
        return;
    if (m->map != NULL)
        munmap(m->map, m->maplen);
    free(m->layers);
    free(m);
}

WEAK const ig_model_config_t *ig_model_config(const ig_model_t *m)
{
    return &m->cfg;
}

WEAK const char *ig_model_dir(const ig_model_t *m)
{
    return m->dir;
}

WEAK const ig_tensor_t *ig_model_embed(const ig_model_t *m)
{
    return &m->embed;
}

WEAK const ig_tensor_t *ig_model_final_norm(const ig_model_t *m)
{
    return &m->norm;
}

WEAK const ig_tensor_t *ig_model_lm_head(const ig_model_t *m)
{
    return m->cfg.tie_word_embeddings ? &m->embed : &m->lm_head;
}

WEAK const ig_layer_weights_t *ig_model_layer(const ig_model_t *m, int layer)
{
    return &m->layers[layer];
}

WEAK size_t ig_model_weight_bytes(const ig_model_t *m)
{
    return m->weight_bytes;
}
