/*
 * Llama-family models in Hugging Face layout: config.json (+ optional
 * generation_config.json) and safetensors weights, one file or shards listed
 * in model.safetensors.index.json. Loading maps the files and validates the
 * headers, the config and every tensor's name, dtype and shape; it reads no
 * weight data, so it costs the same for 1 MB and 2.5 GB models.
 */
#include "infergate/model.h"
#include "infergate/error.h"
#include "infergate/jsonv.h"
#include "infergate/page_release.h"
#include "model_internal.h"
#include "model_object.h"
#include "infergate/gguf.h"
#include "infergate/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFIG_FILE "config.json"
#define GENCONFIG_FILE "generation_config.json"
#define WEIGHTS_FILE "model.safetensors"
#define INDEX_FILE "model.safetensors.index.json"

static int join_path(char *buf, size_t len, const char *dir, const char *name)
{
    int n = snprintf(buf, len, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Loads a JSON object file; IG_ENOENT when absent (no message), IG_EMODEL when malformed. */
static int load_json(json_t **out, const char *dir, const char *name, char *err, size_t errlen)
{
    char path[PATH_MAX];
    json_error_t jerr;
    *out = NULL;
    if (join_path(path, sizeof(path), dir, name) != 0) {
        ig_errf(err, errlen, "%s: path too long", name);
        return IG_EINVAL;
    }
    if (!file_exists(path))
        return IG_ENOENT;
    json_t *root = ig_jsonv_load_file(path, &jerr);
    if (root == NULL) {
        ig_errf(err, errlen, "%s: bad JSON at line %d column %d: %s", name, jerr.line, jerr.column,
                jerr.text);
        return IG_EMODEL;
    }
    if (!json_is_object(root)) {
        ig_errf(err, errlen, "%s: not a JSON object", name);
        json_decref(root);
        return IG_EMODEL;
    }
    *out = root;
    return 0;
}

/* ---- config fields --------------------------------------------------- */

/* Config fields read through base/jsonv: absent or null gives the default;
 * the faults become "FILE: KEY: ..." (file may name an object inside it,
 * "config.json: rope_scaling"). */
typedef struct {
    const char *file;
    char *err;
    size_t errlen;
} reader_t;

static int on_fault(ig_jsonv_t *v, const ig_jsonv_fault_t *f)
{
    const reader_t *r = v->data;
    static const char *const want[] = {
        [IG_JSONV_OBJECT] = "an object", [IG_JSONV_ARRAY] = "an array",
        [IG_JSONV_STRING] = "a string",  [IG_JSONV_INTEGER] = "an integer",
        [IG_JSONV_NUMBER] = "a number",  [IG_JSONV_BOOLEAN] = "a boolean",
    };
    switch (f->kind) {
    case IG_JSONV_MISSING:
        ig_errf(r->err, r->errlen, "%s: %s: missing", r->file, f->key);
        break;
    case IG_JSONV_TYPE:
        ig_errf(r->err, r->errlen, "%s: %s: expected %s, got %s", r->file, f->key, want[f->want],
                ig_jsonv_type_name(f->value));
        break;
    case IG_JSONV_RANGE:
        if (f->want == IG_JSONV_INTEGER)
            ig_errf(r->err, r->errlen, "%s: %s: %lld is out of range [%lld, %lld]", r->file, f->key,
                    f->x, f->lo, f->hi);
        else
            ig_errf(r->err, r->errlen, "%s: %s: %g is not a positive finite number", r->file,
                    f->key, f->dx);
        break;
    default:
        ig_errf(r->err, r->errlen, "%s: %s: invalid value", r->file, f->key);
    }
    return IG_EMODEL;
}

#define READER(name, file, err, errlen)                                                            \
    reader_t name##_r = {file, err, errlen};                                                       \
    ig_jsonv_t name = {IG_JSONV_NULL_ABSENT, on_fault, &name##_r}

/* An integer field in [min, max]; absent or null gives def, or an error when
 * required. */
static int get_int(const json_t *obj, const char *file, const char *key, int required, int def,
                   long long min, long long max, int *out, char *err, size_t errlen)
{
    READER(v, file, err, errlen);
    long long x;
    int rc = ig_jsonv_int(&v, obj, "", key, required ? IG_JSONV_REQUIRED : 0, min, max, def, &x);
    if (rc < 0)
        return rc;
    *out = (int)x;
    return 0;
}

/* A positive finite number; absent or null gives def, or an error when def < 0. */
static int get_pos_float(const json_t *obj, const char *file, const char *key, double def,
                         float *out, char *err, size_t errlen)
{
    READER(v, file, err, errlen);
    double x;
    int rc = ig_jsonv_number(&v, obj, "", key, (def < 0 ? IG_JSONV_REQUIRED : 0) | IG_JSONV_LO_OPEN,
                             0, 3.0e38, def, &x);
    if (rc < 0)
        return rc;
    *out = (float)x;
    return 0;
}

static int get_bool(const json_t *obj, const char *file, const char *key, int def, int *out,
                    char *err, size_t errlen)
{
    READER(v, file, err, errlen);
    int rc = ig_jsonv_bool(&v, obj, "", key, 0, def, out);
    return rc < 0 ? rc : 0;
}

/* bos_token_id: an id or null. */
static int get_bos(const json_t *obj, const char *file, int vocab, int *bos, char *err,
                   size_t errlen)
{
    const json_t *v = json_object_get(obj, "bos_token_id");
    if (v == NULL)
        return 0;
    if (json_is_null(v)) {
        *bos = -1;
        return 0;
    }
    return get_int(obj, file, "bos_token_id", 1, -1, 0, vocab - 1, bos, err, errlen);
}

/* eos_token_id: an id, a list of ids, or null. */
static int get_eos(const json_t *obj, const char *file, ig_model_config_t *cfg, char *err,
                   size_t errlen)
{
    const json_t *v = json_object_get(obj, "eos_token_id");
    if (v == NULL)
        return 0;
    if (json_is_null(v)) {
        cfg->n_eos = 0;
        return 0;
    }
    if (json_is_integer(v)) {
        int id;
        int rc =
            get_int(obj, file, "eos_token_id", 1, -1, 0, cfg->vocab_size - 1, &id, err, errlen);
        if (rc != 0)
            return rc;
        cfg->eos_token_ids[0] = id;
        cfg->n_eos = 1;
        return 0;
    }
    if (!json_is_array(v)) {
        ig_errf(err, errlen, "%s: eos_token_id: expected an integer or a list of integers, got %s",
                file, ig_jsonv_type_name(v));
        return IG_EMODEL;
    }
    if (json_array_size(v) > IG_MAX_EOS) {
        ig_errf(err, errlen, "%s: eos_token_id: %zu ids, at most %d are supported", file,
                json_array_size(v), IG_MAX_EOS);
        return IG_EMODEL;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= cfg->vocab_size) {
            ig_errf(err, errlen, "%s: eos_token_id[%zu]: not a token id below vocab_size %d", file,
                    i, cfg->vocab_size);
            return IG_EMODEL;
        }
        cfg->eos_token_ids[i] = (int)json_integer_value(e);
    }
    cfg->n_eos = (int)json_array_size(v);
    return 0;
}

static int parse_rope_scaling(const json_t *root, ig_model_config_t *cfg, char *err, size_t errlen)
{
    const char *file = CONFIG_FILE;
    const json_t *rs = json_object_get(root, "rope_scaling");
    cfg->rope_scaling = IG_ROPE_NONE;
    cfg->rope_factor = 1.0f;
    if (rs == NULL || json_is_null(rs))
        return 0;
    if (!json_is_object(rs)) {
        ig_errf(err, errlen, "%s: rope_scaling: expected an object or null, got %s", file,
                ig_jsonv_type_name(rs));
        return IG_EMODEL;
    }
    const json_t *type = json_object_get(rs, "rope_type");
    if (type == NULL)
        type = json_object_get(rs, "type");
    if (!json_is_string(type)) {
        ig_errf(err, errlen, "%s: rope_scaling.rope_type: missing or not a string", file);
        return IG_EMODEL;
    }
    const char *t = json_string_value(type);
    int rc;
    if (strcmp(t, "default") == 0)
        return 0;
    if (strcmp(t, "linear") == 0) {
        cfg->rope_scaling = IG_ROPE_LINEAR;
        return get_pos_float(rs, "config.json: rope_scaling", "factor", -1, &cfg->rope_factor, err,
                             errlen);
    }
    if (strcmp(t, "llama3") == 0) {
        const char *f = "config.json: rope_scaling";
        cfg->rope_scaling = IG_ROPE_LLAMA3;
        if ((rc = get_pos_float(rs, f, "factor", -1, &cfg->rope_factor, err, errlen)) != 0 ||
            (rc = get_pos_float(rs, f, "low_freq_factor", -1, &cfg->rope_low_freq_factor, err,
                                errlen)) != 0 ||
            (rc = get_pos_float(rs, f, "high_freq_factor", -1, &cfg->rope_high_freq_factor, err,
                                errlen)) != 0 ||
            (rc = get_int(rs, f, "original_max_position_embeddings", 1, 0, 1, 1 << 24,
                          &cfg->rope_original_max_position, err, errlen)) != 0)
            return rc;
        /* The llama3 ramp divides by (high - low). */
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor)) {
            ig_errf(err, errlen,
                    "%s: rope_scaling: high_freq_factor %g must exceed low_freq_factor %g", file,
                    cfg->rope_high_freq_factor, cfg->rope_low_freq_factor);
            return IG_EMODEL;
        }
        return 0;
    }
    ig_errf(err, errlen,
            "%s: rope_scaling.rope_type: \"%.32s\" is not supported (default, linear, llama3)",
            file, t);
    return IG_EMODEL;
}

static const struct {
    const char *architecture;
    const char *model_type;
    int max_position; /* transformers' default */
} archs[] = {
    {"LlamaForCausalLM", "llama", 2048},
    {"MistralForCausalLM", "mistral", 4096 * 32},
    {"Qwen2ForCausalLM", "qwen2", 32768},
    {"Qwen3ForCausalLM", "qwen3", 32768},
};

static int parse_config(const json_t *root, ig_model_config_t *cfg, char *err, size_t errlen)
{
    const char *file = CONFIG_FILE;
    int rc, arch = -1;
    memset(cfg, 0, sizeof(*cfg));

    const json_t *list = json_object_get(root, "architectures");
    const json_t *mtype = json_object_get(root, "model_type");
    const char *name = NULL;
    if (list != NULL && !json_is_null(list)) {
        if (!json_is_array(list) || json_array_size(list) < 1 ||
            !json_is_string(json_array_get(list, 0))) {
            ig_errf(err, errlen, "%s: architectures: expected a list of strings", file);
            return IG_EMODEL;
        }
        name = json_string_value(json_array_get(list, 0));
        for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
            if (strcmp(name, archs[i].architecture) == 0)
                arch = (int)i;
    } else if (json_is_string(mtype)) {
        name = json_string_value(mtype);
        for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
            if (strcmp(name, archs[i].model_type) == 0)
                arch = (int)i;
    } else {
        ig_errf(err, errlen, "%s: architectures: missing (and no model_type)", file);
        return IG_EMODEL;
    }
    if (arch < 0) {
        ig_errf(err, errlen,
                "%s: architectures: \"%.64s\" is not supported (LlamaForCausalLM, "
                "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)",
                file, name);
        return IG_EMODEL;
    }
    snprintf(cfg->architecture, sizeof(cfg->architecture), "%s", archs[arch].architecture);
    int is_qwen2 = strcmp(archs[arch].model_type, "qwen2") == 0;
    /* Qwen3: RMSNorm of each q and k head (q_norm, k_norm), no biases. */
    cfg->qk_norm = strcmp(archs[arch].model_type, "qwen3") == 0;

    const json_t *act = json_object_get(root, "hidden_act");
    if (act != NULL && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0)) {
        ig_errf(err, errlen, "%s: hidden_act: only \"silu\" is supported", file);
        return IG_EMODEL;
    }
    if ((rc = get_int(root, file, "hidden_size", 1, 0, 1, 65536, &cfg->hidden_size, err, errlen)) !=
            0 ||
        (rc = get_int(root, file, "intermediate_size", 1, 0, 1, 1 << 20, &cfg->intermediate_size,
                      err, errlen)) != 0 ||
        (rc = get_int(root, file, "num_hidden_layers", 1, 0, 1, 1024, &cfg->num_hidden_layers, err,
                      errlen)) != 0 ||
        (rc = get_int(root, file, "num_attention_heads", 1, 0, 1, 1024, &cfg->num_attention_heads,
                      err, errlen)) != 0 ||
        (rc = get_int(root, file, "num_key_value_heads", 0, cfg->num_attention_heads, 1, 1024,
                      &cfg->num_key_value_heads, err, errlen)) != 0 ||
        (rc = get_int(root, file, "head_dim", 0, 0, 2, 1024, &cfg->head_dim, err, errlen)) != 0 ||
        (rc = get_int(root, file, "vocab_size", 1, 0, 1, 1 << 24, &cfg->vocab_size, err, errlen)) !=
            0 ||
        (rc = get_int(root, file, "max_position_embeddings", 0, archs[arch].max_position, 1,
                      1 << 24, &cfg->max_position_embeddings, err, errlen)) != 0 ||
        (rc = get_pos_float(root, file, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps, err, errlen)) !=
            0 ||
        (rc = get_pos_float(root, file, "rope_theta", 10000.0, &cfg->rope_theta, err, errlen)) !=
            0 ||
        (rc = get_bool(root, file, "tie_word_embeddings", 0, &cfg->tie_word_embeddings, err,
                       errlen)) != 0 ||
        (rc = get_bool(root, file, "attention_bias", 0, &cfg->attention_bias, err, errlen)) != 0)
        return rc;
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
        ig_errf(err, errlen,
                "%s: num_key_value_heads: num_attention_heads %d is not divisible by "
                "num_key_value_heads %d",
                file, cfg->num_attention_heads, cfg->num_key_value_heads);
        return IG_EMODEL;
    }
    if (cfg->head_dim == 0) {
        if (cfg->hidden_size % cfg->num_attention_heads != 0) {
            ig_errf(err, errlen,
                    "%s: num_attention_heads: hidden_size %d is not divisible by "
                    "num_attention_heads %d (and head_dim is absent)",
                    file, cfg->hidden_size, cfg->num_attention_heads);
            return IG_EMODEL;
        }
        cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
    }
    if (cfg->head_dim % 2 != 0) {
        ig_errf(err, errlen, "%s: head_dim: %d is odd; rotary embeddings need pairs", file,
                cfg->head_dim);
        return IG_EMODEL;
    }
    if (is_qwen2) {
        /* Qwen2's q/k/v projections always carry biases; its config has no key for it. */
        cfg->attention_bias = 1;
    } else if (cfg->attention_bias) {
        /* transformers' Llama then also gives o_proj a bias, which
         * ig_layer_weights_t has no room for. */
        ig_errf(err, errlen,
                "%s: attention_bias: true is not supported for %s (its o_proj bias has no "
                "place in the weights; Qwen2ForCausalLM has q/k/v biases)",
                file, cfg->architecture);
        return IG_EMODEL;
    }
    int flag = 0;
    if ((rc = get_bool(root, file, "mlp_bias", 0, &flag, err, errlen)) != 0)
        return rc;
    if (flag) {
        ig_errf(err, errlen, "%s: mlp_bias: true is not supported", file);
        return IG_EMODEL;
    }
    if ((rc = get_bool(root, file, "use_sliding_window", 0, &flag, err, errlen)) != 0)
        return rc;
    if (flag) {
        ig_errf(err, errlen, "%s: use_sliding_window: true is not supported", file);
        return IG_EMODEL;
    }
    const json_t *td = json_object_get(root, "torch_dtype");
    if (td == NULL)
        td = json_object_get(root, "dtype");
    if (td != NULL && !json_is_null(td) && !json_is_string(td)) {
        ig_errf(err, errlen, "%s: torch_dtype: expected a string, got %s", file,
                ig_jsonv_type_name(td));
        return IG_EMODEL;
    }
    if ((rc = parse_rope_scaling(root, cfg, err, errlen)) != 0)
        return rc;
    cfg->bos_token_id = -1;
    cfg->n_eos = 0;
    if ((rc = get_bos(root, file, cfg->vocab_size, &cfg->bos_token_id, err, errlen)) != 0 ||
        (rc = get_eos(root, file, cfg, err, errlen)) != 0)
        return rc;
    return 0;
}

/* ---- tensors ---------------------------------------------------------- */

static int is_plain_file_name(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int open_shard(ig_model_t *m, const char *name, const char *named_by, char *err,
                      size_t errlen)
{
    char path[PATH_MAX];
    for (size_t i = 0; i < m->nfiles; i++)
        if (strcmp(ig_safetensors_file_name(m->files[i]), name) == 0)
            return 0;
    if (join_path(path, sizeof(path), m->dir, name) != 0) {
        ig_errf(err, errlen, "%s: path too long", name);
        return IG_EMODEL;
    }
    ig_safetensors_t **files = realloc(m->files, (m->nfiles + 1) * sizeof(*files));
    if (files == NULL) {
        ig_errf(err, errlen, "%s: out of memory", name);
        return IG_ENOMEM;
    }
    m->files = files;
    int rc = ig_safetensors_open(&m->files[m->nfiles], path, err, errlen);
    if (rc == IG_ENOENT) {
        if (named_by)
            ig_errf(err, errlen, "%s: no such file, named by %s", name, named_by);
        else
            ig_errf(err, errlen, "%s: no such file (and no %s)", name, INDEX_FILE);
        return IG_EMODEL;
    }
    if (rc != 0)
        return rc;
    m->nfiles++;
    return 0;
}

/* Opens the shards listed in the index and checks that each holds the
 * tensors the index assigns to it. */
static int open_index(ig_model_t *m, const json_t *index, char *err, size_t errlen)
{
    const json_t *map = json_object_get(index, "weight_map");
    const char *key;
    const json_t *val;
    int rc;
    if (!json_is_object(map)) {
        ig_errf(err, errlen, "%s: weight_map: missing or not an object", INDEX_FILE);
        return IG_EMODEL;
    }
    json_object_foreach((json_t *)map, key, val)
    {
        if (!json_is_string(val) || !is_plain_file_name(json_string_value(val))) {
            ig_errf(err, errlen, "%s: weight_map.%s: not a file name in the model directory",
                    INDEX_FILE, key);
            return IG_EMODEL;
        }
        if ((rc = open_shard(m, json_string_value(val), INDEX_FILE, err, errlen)) != 0)
            return rc;
    }
    json_object_foreach((json_t *)map, key, val)
    {
        const char *shard = json_string_value(val);
        for (size_t i = 0; i < m->nfiles; i++) {
            if (strcmp(ig_safetensors_file_name(m->files[i]), shard) != 0)
                continue;
            if (ig_safetensors_find(m->files[i], key) == NULL) {
                ig_errf(err, errlen, "%s: %s: not in %s, where weight_map places it", INDEX_FILE,
                        key, shard);
                return IG_EMODEL;
            }
        }
    }
    if (m->nfiles == 0) {
        ig_errf(err, errlen, "%s: weight_map: empty", INDEX_FILE);
        return IG_EMODEL;
    }
    return 0;
}

static int open_weights(ig_model_t *m, char *err, size_t errlen)
{
    json_t *index = NULL;
    int rc = load_json(&index, m->dir, INDEX_FILE, err, errlen);
    if (rc == IG_ENOENT) {
        m->weights_label = WEIGHTS_FILE;
        return open_shard(m, WEIGHTS_FILE, NULL, err, errlen);
    }
    if (rc != 0)
        return rc;
    m->weights_label = INDEX_FILE;
    rc = open_index(m, index, err, errlen);
    json_decref(index);
    return rc;
}

/* Finds name in the weight files and checks its dtype and shape. An absent
 * optional tensor leaves t zeroed (data NULL). */
static int bind(ig_model_t *m, ig_tensor_t *t, const char *name, int optional, int ndim, int64_t d0,
                int64_t d1, char *err, size_t errlen)
{
    const ig_safetensors_entry_t *e = NULL;
    const ig_safetensors_t *in = NULL;
    char got[96], want[96];
    memset(t, 0, sizeof(*t));
    for (size_t i = 0; i < m->nfiles; i++) {
        const ig_safetensors_entry_t *f = ig_safetensors_find(m->files[i], name);
        if (f == NULL)
            continue;
        if (e != NULL) {
            ig_errf(err, errlen, "%s: %s: also in %s", ig_safetensors_file_name(m->files[i]), name,
                    ig_safetensors_file_name(in));
            return IG_EMODEL;
        }
        e = f;
        in = m->files[i];
    }
    if (e == NULL) {
        if (optional)
            return 0;
        ig_errf(err, errlen, "%s: %s: missing tensor", m->weights_label, name);
        return IG_EMODEL;
    }
    /* One dtype for all weights: backends convert or upload them in one pass. */
    if (m->embed.data != NULL && e->dtype != m->cfg.dtype) {
        ig_errf(err, errlen, "%s: %s: dtype %s, expected %s like model.embed_tokens.weight",
                ig_safetensors_file_name(in), name, ig_dtype_name(e->dtype),
                ig_dtype_name(m->cfg.dtype));
        return IG_EMODEL;
    }
    int64_t want_shape[2] = {d0, d1};
    int same = e->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = e->shape[i] == want_shape[i];
    if (!same) {
        ig__shape_str(got, sizeof(got), e->ndim, e->shape);
        ig__shape_str(want, sizeof(want), ndim, want_shape);
        ig_errf(err, errlen, "%s: %s: shape %s, expected %s", ig_safetensors_file_name(in), name,
                got, want);
        return IG_EMODEL;
    }
    t->dtype = e->dtype;
    t->data = e->data;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    m->weight_bytes += e->nbytes;
    return 0;
}

static int bind_all(ig_model_t *m, char *err, size_t errlen)
{
    const ig_model_config_t *c = &m->cfg;
    int64_t dim = c->hidden_size, hid = c->intermediate_size, vocab = c->vocab_size;
    int64_t q = (int64_t)c->num_attention_heads * c->head_dim;
    int64_t kv = (int64_t)c->num_key_value_heads * c->head_dim;
    char name[128];
    int rc;

    if ((rc = bind(m, &m->embed, "model.embed_tokens.weight", 0, 2, vocab, dim, err, errlen)) != 0)
        return rc;
    m->cfg.dtype = m->embed.dtype;
    if ((rc = bind(m, &m->final_norm, "model.norm.weight", 0, 1, dim, 0, err, errlen)) != 0)
        return rc;
    if (c->tie_word_embeddings)
        m->lm_head = m->embed;
    else if ((rc = bind(m, &m->lm_head, "lm_head.weight", 0, 2, vocab, dim, err, errlen)) != 0)
        return rc;

    m->layers = calloc((size_t)c->num_hidden_layers, sizeof(*m->layers));
    if (m->layers == NULL) {
        ig_errf(err, errlen, "model: out of memory");
        return IG_ENOMEM;
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        ig_layer_weights_t *L = &m->layers[l];
        const struct {
            ig_tensor_t *t;
            const char *suffix;
            int optional; /* 1: a bias, 2: a q/k norm (each as the config says) */
            int ndim;
            int64_t d0, d1;
        } want[] = {
            {&L->attn_norm, "input_layernorm.weight", 0, 1, dim, 0},
            {&L->wq, "self_attn.q_proj.weight", 0, 2, q, dim},
            {&L->wk, "self_attn.k_proj.weight", 0, 2, kv, dim},
            {&L->wv, "self_attn.v_proj.weight", 0, 2, kv, dim},
            {&L->wo, "self_attn.o_proj.weight", 0, 2, dim, q},
            {&L->bq, "self_attn.q_proj.bias", 1, 1, q, 0},
            {&L->bk, "self_attn.k_proj.bias", 1, 1, kv, 0},
            {&L->bv, "self_attn.v_proj.bias", 1, 1, kv, 0},
            {&L->q_norm, "self_attn.q_norm.weight", 2, 1, c->head_dim, 0},
            {&L->k_norm, "self_attn.k_norm.weight", 2, 1, c->head_dim, 0},
            {&L->mlp_norm, "post_attention_layernorm.weight", 0, 1, dim, 0},
            {&L->w_gate, "mlp.gate_proj.weight", 0, 2, hid, dim},
            {&L->w_up, "mlp.up_proj.weight", 0, 2, hid, dim},
            {&L->w_down, "mlp.down_proj.weight", 0, 2, dim, hid},
        };
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
            snprintf(name, sizeof(name), "model.layers.%d.%s", l, want[i].suffix);
            /* Biases are required exactly when the config says so; without
             * attention_bias any stored bias is ignored, as transformers does. */
            int is_bias = want[i].optional == 1, is_qk_norm = want[i].optional == 2;
            if ((is_bias && !c->attention_bias) || (is_qk_norm && !c->qk_norm))
                continue;
            if ((rc = bind(m, want[i].t, name, 0, want[i].ndim, want[i].d0, want[i].d1, err,
                           errlen)) != 0)
                return rc;
        }
    }
    return 0;
}

/* ---- public ----------------------------------------------------------- */

int ig_model_load(ig_model_t **out, const char *dir, char *err, size_t errlen)
{
    int rc;
    json_t *config = NULL, *gen = NULL;
    ig_model_t *m = NULL;
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';

    m = calloc(1, sizeof(*m));
    if (m == NULL || (m->dir = strdup(dir)) == NULL) {
        rc = IG_ENOMEM;
        ig_errf(err, errlen, "model: out of memory");
        goto fail;
    }
    if (ig_gguf_is_gguf(dir)) {
        if ((rc = ig_gguf_open(&m->gguf, dir, err, errlen)) != 0 ||
            (rc = ig__model_load_gguf(m, m->gguf, err, errlen)) != 0)
            goto fail;
        *out = m;
        return 0;
    }
    rc = load_json(&config, dir, CONFIG_FILE, err, errlen);
    if (rc == IG_ENOENT) {
        ig_errf(err, errlen, "%s: no such file in %s", CONFIG_FILE, dir);
        goto fail;
    }
    if (rc != 0)
        goto fail;
    if ((rc = parse_config(config, &m->cfg, err, errlen)) != 0)
        goto fail;

    rc = load_json(&gen, dir, GENCONFIG_FILE, err, errlen);
    if (rc == 0) {
        /* generation_config.json is what generate() uses: its ids win. */
        if ((rc = get_bos(gen, GENCONFIG_FILE, m->cfg.vocab_size, &m->cfg.bos_token_id, err,
                          errlen)) != 0 ||
            (rc = get_eos(gen, GENCONFIG_FILE, &m->cfg, err, errlen)) != 0)
            goto fail;
    } else if (rc != IG_ENOENT) {
        goto fail;
    }

    if ((rc = open_weights(m, err, errlen)) != 0)
        goto fail;
    if ((rc = bind_all(m, err, errlen)) != 0)
        goto fail;
    json_decref(config);
    json_decref(gen);
    *out = m;
    return 0;

fail:
    json_decref(config);
    json_decref(gen);
    ig_model_free(m);
    return rc;
}

void ig_model_free(ig_model_t *model)
{
    if (model == NULL)
        return;
    for (size_t i = 0; i < model->nfiles; i++)
        ig_safetensors_close(model->files[i]);
    ig_gguf_close(model->gguf);
    free(model->files);
    for (size_t i = 0; i < model->nowned; i++)
        free(model->owned[i]);
    free(model->owned);
    free(model->layers);
    free(model->dir);
    free(model);
}

static void drop_if_owned(const ig_model_t *m, ig_tensor_t *t)
{
    for (size_t i = 0; i < m->nowned; i++)
        if (t->data != NULL && t->data == m->owned[i])
            t->data = NULL;
}

void ig_model_drop_owned(ig_model_t *model)
{
    if (model == NULL)
        return;
    drop_if_owned(model, &model->embed);
    drop_if_owned(model, &model->lm_head);
    drop_if_owned(model, &model->final_norm);
    for (int l = 0; l < model->cfg.num_hidden_layers; l++) {
        ig_layer_weights_t *L = &model->layers[l];
        ig_tensor_t *ts[] = {&L->attn_norm, &L->wq,     &L->wk,   &L->wv,     &L->wo,
                             &L->bq,        &L->bk,     &L->bv,   &L->q_norm, &L->k_norm,
                             &L->mlp_norm,  &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++)
            drop_if_owned(model, ts[i]);
    }
    for (size_t i = 0; i < model->nowned; i++)
        free(model->owned[i]);
    model->nowned = 0;
}

const ig_model_config_t *ig_model_config(const ig_model_t *model)
{
    return &model->cfg;
}

const char *ig_model_dir(const ig_model_t *model)
{
    return model->dir;
}

const ig_tensor_t *ig_model_embed(const ig_model_t *model)
{
    return &model->embed;
}

const ig_tensor_t *ig_model_final_norm(const ig_model_t *model)
{
    return &model->final_norm;
}

const ig_tensor_t *ig_model_lm_head(const ig_model_t *model)
{
    return &model->lm_head;
}

const ig_layer_weights_t *ig_model_layer(const ig_model_t *model, int layer)
{
    if (layer < 0 || layer >= model->cfg.num_hidden_layers)
        return NULL;
    return &model->layers[layer];
}

size_t ig_model_weight_bytes(const ig_model_t *model)
{
    return model->weight_bytes;
}

/* ---- load-time quantization ------------------------------------------- */

#define QUANT_ROWS 256 /* rows widened to F32 at a time */

/* A matrix already in a block format (Q8_0 or Q4_0) stays as it is. */
static int quantize_tensor(ig_model_t *m, ig_tensor_t *t, ig_dtype_t to, const char *name,
                           char *err, size_t errlen)
{
    if (t->data == NULL || t->ndim != 2 || ig_dtype_block(t->dtype) > 1)
        return 0;
    int64_t rows = t->shape[0], cols = t->shape[1];
    if (cols % (int64_t)ig_dtype_block(to) != 0) {
        ig_errf(err, errlen, "%s: %lld columns, not a multiple of %d: cannot be %s", name,
                (long long)cols, (int)ig_dtype_block(to), ig_dtype_name(to));
        return IG_EMODEL;
    }
    size_t esz = ig_dtype_size(t->dtype), rowq = ig_dtype_bytes(to, (size_t)cols);
    void **owned = realloc(m->owned, (m->nowned + 1) * sizeof(*owned));
    unsigned char *q = malloc((size_t)rows * rowq);
    float *tmp = malloc((size_t)QUANT_ROWS * cols * sizeof(float));
    if (owned != NULL)
        m->owned = owned;
    if (owned == NULL || q == NULL || tmp == NULL) {
        free(q);
        free(tmp);
        ig_errf(err, errlen, "%s: out of memory quantizing to %s", name, ig_dtype_name(to));
        return IG_ENOMEM;
    }
    for (int64_t r = 0; r < rows; r += QUANT_ROWS) {
        size_t n = (size_t)(rows - r < QUANT_ROWS ? rows - r : QUANT_ROWS) * cols;
        const char *from = (const char *)t->data + (size_t)r * cols * esz;
        ig_dtype_to_f32(tmp, from, t->dtype, n);
        ig_dtype_from_f32(q + (size_t)r * rowq, to, tmp, n);
        ig_pages_release(from, n * esz);
    }
    free(tmp);
    m->owned[m->nowned++] = q;
    m->weight_bytes -= (size_t)rows * cols * esz;
    m->weight_bytes += (size_t)rows * rowq;
    t->dtype = to;
    t->data = q;
    return 0;
}

int ig_model_quantize(ig_model_t *m, ig_dtype_t to, char *err, size_t errlen)
{
    int rc;
    char name[96];
    if (to != IG_DTYPE_Q8_0 && to != IG_DTYPE_Q4_0) {
        ig_errf(err, errlen, "quantize: %s is not a quantized type (q8_0, q4_0)",
                ig_dtype_name(to));
        return IG_EINVAL;
    }
    int tied = m->lm_head.data == m->embed.data;
    if ((rc = quantize_tensor(m, &m->embed, to, "model.embed_tokens.weight", err, errlen)) != 0)
        return rc;
    if (tied)
        m->lm_head = m->embed;
    else if ((rc = quantize_tensor(m, &m->lm_head, to, "lm_head.weight", err, errlen)) != 0)
        return rc;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        ig_layer_weights_t *L = &m->layers[l];
        ig_tensor_t *ts[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        static const char *const what[] = {
            "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
        for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
            snprintf(name, sizeof(name), "model.layers.%d.%s.weight", l, what[i]);
            if ((rc = quantize_tensor(m, ts[i], to, name, err, errlen)) != 0)
                return rc;
        }
    }
    m->cfg.dtype = to;
    return 0;
}
