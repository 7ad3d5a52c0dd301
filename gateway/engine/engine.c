/*
 * The engine: one model on one backend. Weights are uploaded once, the KV
 * cache is one allocation of fixed-size blocks handed out by a free list,
 * and ig_engine_forward() runs the Llama forward pass over a whole batch at
 * once: every weight is applied with one GEMM over all rows of the batch
 * (decode rows and prefill chunks together), attention walks each
 * sequence's own blocks.
 */
#include "infergate/engine.h"

#include "infergate/error.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Rows of logits computed per lm_head GEMM; bounds the logits buffer when a
 * batch asks for every prompt position. */
#define LOGIT_CHUNK 128

/* The CPU backend cannot report free memory: a default KV cache (kv_blocks
 * 0) holds max_num_seqs full-length sequences but at most this many bytes. */
#define CPU_KV_DEFAULT_CAP ((size_t)2 << 30)

typedef struct {
    ig_weight_t attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, mlp_norm, w_gate, w_up,
        w_down;
    int has_bias, has_qk_norm;
} layer_t;

struct ig_engine_s {
    const ig_model_t *model;
    ig_backend_t *be;
    ig_model_config_t cfg;
    ig_engine_opts_t opts;
    int host_logits; /* the backend's memory is host memory: lm_head writes
                        straight into the caller's logits */

    ig_weight_t embed, final_norm, lm_head;
    int lm_head_tied;
    layer_t *layers;
    float *inv_freq; /* (head_dim / 2) backend */

    ig_kv_layout_t kv;
    int *free_blocks; /* stack of free block ids */
    int nfree;
    unsigned char *in_use; /* (num_blocks) guards against double release */
    int max_blocks;        /* blocks of one sequence of max_position_embeddings */

    /* Work buffers in backend memory, sized for max_batched_tokens rows. */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* activations */
    float *logits;                              /* (LOGIT_CHUNK, vocab) */
    int *d_tokens, *d_pos, *d_slots, *d_rows;   /* (max_batched_tokens) */
    int *d_q_start, *d_ctx_len;                 /* (max_num_seqs + 1) */
    int *d_tables;                              /* (max_num_seqs, max_blocks) */

    /* Host staging of the same index arrays. */
    int *h_pos, *h_slots, *h_rows, *h_q_start, *h_ctx_len, *h_tables;

    /* The step's index arrays packed for one upload: d_tokens .. d_tables
     * point into d_meta, h_meta is its host side (page-locked where the
     * backend has host_alloc). */
    int *d_meta, *h_meta;
};

void ig_engine_opts_default(ig_engine_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->kv_blocks = 0;
    opts->block_size = 16;
    opts->max_batched_tokens = 2048;
    opts->max_num_seqs = 256;
    opts->gpu_memory_fraction = 0.9;
}

/* ========================================================================= */
/* RoPE frequencies                                                          */
/* ========================================================================= */

/*
 * inv_freq(head_dim / 2) as Hugging Face's rope initialisers compute it
 * (modeling_rope_utils: default, linear, llama3), in double and rounded to
 * float once; tests/reference/llama_ref.py does the same.
 */
static void rope_inv_freq(const ig_model_config_t *c, float *out)
{
    int d = c->head_dim;
    double pi = 3.14159265358979323846;
    for (int i = 0; i < d / 2; i++) {
        double f = 1.0 / pow((double)c->rope_theta, (double)(2 * i) / (double)d);
        if (c->rope_scaling == IG_ROPE_LINEAR && c->rope_factor > 0) {
            f /= c->rope_factor;
        } else if (c->rope_scaling == IG_ROPE_LLAMA3 && c->rope_factor > 0) {
            double factor = c->rope_factor, lo = c->rope_low_freq_factor,
                   hi = c->rope_high_freq_factor, old = c->rope_original_max_position;
            double lo_wavelen = old / lo, hi_wavelen = old / hi;
            double wavelen = 2.0 * pi / f;
            if (wavelen > lo_wavelen) {
                f = f / factor;
            } else if (wavelen >= hi_wavelen) { /* between the two: interpolate */
                double smooth = (old / wavelen - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        out[i] = (float)f;
    }
}

/* ========================================================================= */
/* Create / free                                                             */
/* ========================================================================= */

static void free_w(ig_engine_t *e, ig_weight_t *w)
{
    if (w->data != NULL)
        e->be->free_weight(e->be, w);
    w->data = NULL;
}

static int up_w(ig_engine_t *e, const ig_tensor_t *t, ig_weight_t *w, const char *what, int layer,
                char *err, size_t errlen)
{
    int rc = e->be->upload_weight(e->be, t, w);
    if (rc != 0)
        ig_errf(err, errlen, "uploading %s of layer %d to %s: %s", what, layer, e->be->name,
                ig_strerror(rc));
    return rc;
}

/* K and V of one block over every layer: half of it for a 16-bit cache, so
 * a memory budget holds twice the blocks. */
static size_t kv_block_bytes(const ig_engine_t *e)
{
    return 2 * (size_t)e->cfg.num_hidden_layers * e->cfg.num_key_value_heads *
           (size_t)e->opts.block_size * e->cfg.head_dim * ig_dtype_size(e->opts.kv_dtype);
}

static int choose_kv_blocks(ig_engine_t *e, char *err, size_t errlen)
{
    size_t per = kv_block_bytes(e);
    size_t want;
    if (e->opts.kv_blocks > 0) {
        want = (size_t)e->opts.kv_blocks;
    } else {
        size_t budget = CPU_KV_DEFAULT_CAP, fr = 0, tot = 0;
        if (e->be->mem_info != NULL && e->be->mem_info(e->be, &fr, &tot) == 0) {
            /* Weights are already resident: what is free now is for the KV
             * cache, less the share the operator keeps back. */
            double keep = (1.0 - e->opts.gpu_memory_fraction) * (double)tot;
            budget = (double)fr > keep ? (size_t)((double)fr - keep) : 0;
        }
        want = (size_t)e->opts.max_num_seqs * (size_t)e->max_blocks;
        if (want * per > budget)
            want = budget / per;
    }
    if (want > INT_MAX / 2)
        want = INT_MAX / 2;
    if (want < 1) {
        ig_errf(err, errlen, "no memory left for the KV cache on %s (%zu bytes per block)",
                e->be->name, per);
        return IG_ENOMEM;
    }
    e->kv.num_blocks = (int)want;
    return 0;
}

static void *balloc(ig_engine_t *e, size_t bytes, int *failed)
{
    void *p = e->be->alloc(e->be, bytes ? bytes : 1);
    if (p == NULL)
        *failed = 1;
    return p;
}

static int alloc_buffers(ig_engine_t *e)
{
    const ig_model_config_t *c = &e->cfg;
    size_t T = (size_t)e->opts.max_batched_tokens, S = (size_t)e->opts.max_num_seqs;
    size_t qd = (size_t)c->num_attention_heads * c->head_dim;
    size_t kvd = (size_t)c->num_key_value_heads * c->head_dim;
    size_t f = sizeof(float), i = sizeof(int);
    int failed = 0;
    e->x = balloc(e, T * c->hidden_size * f, &failed);
    e->xb = balloc(e, T * (c->hidden_size > (int)qd ? (size_t)c->hidden_size : qd) * f, &failed);
    e->q = balloc(e, T * qd * f, &failed);
    e->k = balloc(e, T * kvd * f, &failed);
    e->v = balloc(e, T * kvd * f, &failed);
    e->att = balloc(e, T * qd * f, &failed);
    e->hb = balloc(e, T * c->intermediate_size * f, &failed);
    e->hb2 = balloc(e, T * c->intermediate_size * f, &failed);
    if (!e->host_logits)
        e->logits = balloc(e, (size_t)LOGIT_CHUNK * c->vocab_size * f, &failed);
    /* tokens, positions, slots, rows; q_start, ctx_len, block tables */
    size_t meta = (4 * T + 2 * S + 1 + S * e->max_blocks) * i;
    e->d_meta = balloc(e, meta, &failed);
    e->h_meta = e->be->host_alloc ? e->be->host_alloc(e->be, meta) : malloc(meta);
    e->inv_freq = balloc(e, (size_t)(c->head_dim / 2) * f, &failed);

    e->h_pos = malloc(T * i);
    e->h_slots = malloc(T * i);
    e->h_rows = malloc(T * i);
    e->h_q_start = malloc((S + 1) * i);
    e->h_ctx_len = malloc(S * i);
    e->h_tables = malloc(S * e->max_blocks * i);
    if (failed || !e->h_pos || !e->h_slots || !e->h_rows || !e->h_q_start || !e->h_ctx_len ||
        !e->h_tables || !e->h_meta)
        return IG_ENOMEM;
    return 0;
}

static int check_config(const ig_model_config_t *c, const ig_engine_opts_t *o, char *err,
                        size_t errlen)
{
    if (c->hidden_size <= 0 || c->num_hidden_layers <= 0 || c->num_attention_heads <= 0 ||
        c->num_key_value_heads <= 0 || c->head_dim <= 0 || c->head_dim % 2 != 0 ||
        c->vocab_size <= 0 || c->intermediate_size <= 0 ||
        c->num_attention_heads % c->num_key_value_heads != 0) {
        ig_errf(err, errlen, "model config has a shape the engine cannot run");
        return IG_EMODEL;
    }
    if (o->block_size <= 0 || o->max_batched_tokens <= 0 || o->max_num_seqs <= 0 ||
        o->kv_blocks < 0) {
        ig_errf(err, errlen, "engine options must be positive");
        return IG_EINVAL;
    }
    if (o->kv_dtype != IG_DTYPE_F32 && o->kv_dtype != IG_DTYPE_F16 &&
        o->kv_dtype != IG_DTYPE_BF16) {
        ig_errf(err, errlen, "KV cache dtype %s: must be f32, f16 or bf16",
                ig_dtype_name(o->kv_dtype));
        return IG_EINVAL;
    }
    return 0;
}

/* Whether the backend's kv_append and attention take the cache's dtype. */
static int check_kv_dtype(const ig_backend_t *be, ig_dtype_t dt, char *err, size_t errlen)
{
    unsigned ok = be->kv_dtypes != 0 ? be->kv_dtypes : 1u << IG_DTYPE_F32;
    if (ok & (1u << dt))
        return 0;
    ig_errf(err, errlen,
            "a KV cache in %s is not supported on %s (batching.kv_dtype, worker --kv-dtype): "
            "use f32",
            ig_engine_kv_dtype_name(dt), be->name);
    return IG_ENOTSUP;
}

static const struct {
    const char *name;
    ig_dtype_t dtype;
} kv_dtypes[] = {{"f32", IG_DTYPE_F32}, {"f16", IG_DTYPE_F16}, {"bf16", IG_DTYPE_BF16}};

int ig_engine_kv_dtype_parse(const char *name, ig_dtype_t *out)
{
    for (size_t i = 0; name != NULL && i < sizeof(kv_dtypes) / sizeof(kv_dtypes[0]); i++) {
        if (strcmp(name, kv_dtypes[i].name) == 0) {
            *out = kv_dtypes[i].dtype;
            return 0;
        }
    }
    return IG_EINVAL;
}

const char *ig_engine_kv_dtype_name(ig_dtype_t dtype)
{
    for (size_t i = 0; i < sizeof(kv_dtypes) / sizeof(kv_dtypes[0]); i++)
        if (kv_dtypes[i].dtype == dtype)
            return kv_dtypes[i].name;
    return "?";
}

int ig_engine_create(ig_engine_t **out, const ig_model_t *model, ig_backend_t *be,
                     const ig_engine_opts_t *opts, char *err, size_t errlen)
{
    int rc;
    ig_engine_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return IG_ENOMEM;
    e->model = model;
    e->be = be;
    e->cfg = *ig_model_config(model);
    if (opts != NULL)
        e->opts = *opts;
    else
        ig_engine_opts_default(&e->opts);
    const ig_model_config_t *c = &e->cfg;
    if ((rc = check_config(c, &e->opts, err, errlen)) != 0 ||
        (rc = check_kv_dtype(be, e->opts.kv_dtype, err, errlen)) != 0)
        goto fail;
    e->host_logits = be->host_memory;
    int maxpos = c->max_position_embeddings > 0 ? c->max_position_embeddings : 2048;
    e->max_blocks = (maxpos + e->opts.block_size - 1) / e->opts.block_size;

    /* ---- weights ---- */
    e->layers = calloc((size_t)c->num_hidden_layers, sizeof(layer_t));
    if (e->layers == NULL) {
        rc = IG_ENOMEM;
        goto fail;
    }
    if ((rc = up_w(e, ig_model_embed(model), &e->embed, "embed_tokens", -1, err, errlen)) ||
        (rc = up_w(e, ig_model_final_norm(model), &e->final_norm, "norm", -1, err, errlen)))
        goto fail;
    const ig_tensor_t *head = ig_model_lm_head(model);
    if (head == ig_model_embed(model) || head->data == ig_model_embed(model)->data) {
        e->lm_head = e->embed; /* tied: one copy in backend memory */
        e->lm_head_tied = 1;
    } else if ((rc = up_w(e, head, &e->lm_head, "lm_head", -1, err, errlen)) != 0) {
        goto fail;
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const ig_layer_weights_t *w = ig_model_layer(model, l);
        layer_t *L = &e->layers[l];
        if ((rc = up_w(e, &w->attn_norm, &L->attn_norm, "input_layernorm", l, err, errlen)) ||
            (rc = up_w(e, &w->wq, &L->wq, "q_proj", l, err, errlen)) ||
            (rc = up_w(e, &w->wk, &L->wk, "k_proj", l, err, errlen)) ||
            (rc = up_w(e, &w->wv, &L->wv, "v_proj", l, err, errlen)) ||
            (rc = up_w(e, &w->wo, &L->wo, "o_proj", l, err, errlen)) ||
            (rc =
                 up_w(e, &w->mlp_norm, &L->mlp_norm, "post_attention_layernorm", l, err, errlen)) ||
            (rc = up_w(e, &w->w_gate, &L->w_gate, "gate_proj", l, err, errlen)) ||
            (rc = up_w(e, &w->w_up, &L->w_up, "up_proj", l, err, errlen)) ||
            (rc = up_w(e, &w->w_down, &L->w_down, "down_proj", l, err, errlen)))
            goto fail;
        if (w->bq.data != NULL && w->bk.data != NULL && w->bv.data != NULL) {
            L->has_bias = 1;
            if ((rc = up_w(e, &w->bq, &L->bq, "q_proj.bias", l, err, errlen)) ||
                (rc = up_w(e, &w->bk, &L->bk, "k_proj.bias", l, err, errlen)) ||
                (rc = up_w(e, &w->bv, &L->bv, "v_proj.bias", l, err, errlen)))
                goto fail;
        }
        if (w->q_norm.data != NULL && w->k_norm.data != NULL) {
            L->has_qk_norm = 1;
            if ((rc = up_w(e, &w->q_norm, &L->q_norm, "q_norm", l, err, errlen)) ||
                (rc = up_w(e, &w->k_norm, &L->k_norm, "k_norm", l, err, errlen)))
                goto fail;
        }
    }

    /* ---- buffers, RoPE table and KV cache ---- */
    if ((rc = alloc_buffers(e)) != 0) {
        ig_errf(err, errlen, "out of memory for the work buffers on %s", be->name);
        goto fail;
    }
    {
        float *f = malloc((size_t)(c->head_dim / 2) * sizeof(float));
        if (f == NULL) {
            rc = IG_ENOMEM;
            goto fail;
        }
        rope_inv_freq(c, f);
        rc = be->upload(be, e->inv_freq, f, (size_t)(c->head_dim / 2) * sizeof(float));
        free(f);
        if (rc != 0)
            goto fail;
    }
    if ((rc = choose_kv_blocks(e, err, errlen)) != 0)
        goto fail;
    e->kv.num_layers = c->num_hidden_layers;
    e->kv.block_size = e->opts.block_size;
    e->kv.n_kv_heads = c->num_key_value_heads;
    e->kv.head_dim = c->head_dim;
    e->kv.dtype = e->opts.kv_dtype;
    size_t half = kv_block_bytes(e) / 2 * (size_t)e->kv.num_blocks;
    e->kv.k = be->alloc(be, half);
    e->kv.v = be->alloc(be, half);
    e->free_blocks = malloc((size_t)e->kv.num_blocks * sizeof(int));
    e->in_use = calloc((size_t)e->kv.num_blocks, 1);
    if (e->kv.k == NULL || e->kv.v == NULL || e->free_blocks == NULL || e->in_use == NULL) {
        ig_errf(err, errlen, "out of memory for a KV cache of %d blocks (%zu bytes) on %s",
                e->kv.num_blocks, 2 * half, be->name);
        rc = IG_ENOMEM;
        goto fail;
    }
    /* Pushed in reverse so that allocation hands out 0, 1, 2, ... */
    for (int b = 0; b < e->kv.num_blocks; b++)
        e->free_blocks[b] = e->kv.num_blocks - 1 - b;
    e->nfree = e->kv.num_blocks;
    *out = e;
    return 0;

fail:
    ig_engine_free(e);
    return rc;
}

void ig_engine_free(ig_engine_t *e)
{
    if (e == NULL)
        return;
    ig_backend_t *be = e->be;
    if (e->layers != NULL) {
        for (int l = 0; l < e->cfg.num_hidden_layers; l++) {
            layer_t *L = &e->layers[l];
            ig_weight_t *ws[] = {&L->attn_norm, &L->wq,     &L->wk,   &L->wv,     &L->wo,
                                 &L->bq,        &L->bk,     &L->bv,   &L->q_norm, &L->k_norm,
                                 &L->mlp_norm,  &L->w_gate, &L->w_up, &L->w_down};
            for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
                free_w(e, ws[i]);
        }
        free(e->layers);
    }
    if (!e->lm_head_tied)
        free_w(e, &e->lm_head);
    free_w(e, &e->embed);
    free_w(e, &e->final_norm);
    void *bufs[] = {e->x,   e->xb,     e->q,      e->k,        e->v,    e->att, e->hb,
                    e->hb2, e->logits, e->d_meta, e->inv_freq, e->kv.k, e->kv.v};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        if (bufs[i] != NULL)
            be->free(be, bufs[i]);
    free(e->h_pos);
    free(e->h_slots);
    free(e->h_rows);
    free(e->h_q_start);
    free(e->h_ctx_len);
    free(e->h_tables);
    if (be->host_alloc)
        be->host_free(be, e->h_meta);
    else
        free(e->h_meta);
    free(e->free_blocks);
    free(e->in_use);
    free(e);
}

/* ========================================================================= */
/* KV blocks                                                                 */
/* ========================================================================= */

int ig_engine_block_alloc(ig_engine_t *e)
{
    if (e->nfree == 0)
        return IG_ENOKV;
    int b = e->free_blocks[--e->nfree];
    e->in_use[b] = 1;
    return b;
}

void ig_engine_block_release(ig_engine_t *e, int block)
{
    /* A block that is out of range or already free is ignored: the free
     * list must never hold a block twice. */
    if (block < 0 || block >= e->kv.num_blocks || !e->in_use[block])
        return;
    e->in_use[block] = 0;
    e->free_blocks[e->nfree++] = block;
}

int ig_engine_blocks_free(const ig_engine_t *e)
{
    return e->nfree;
}

const ig_model_config_t *ig_engine_config(const ig_engine_t *e)
{
    return &e->cfg;
}

int ig_engine_block_size(const ig_engine_t *e)
{
    return e->kv.block_size;
}

int ig_engine_num_blocks(const ig_engine_t *e)
{
    return e->kv.num_blocks;
}

size_t ig_engine_kv_bytes(const ig_engine_t *e)
{
    return kv_block_bytes(e) * (size_t)e->kv.num_blocks;
}

ig_dtype_t ig_engine_kv_dtype(const ig_engine_t *e)
{
    return e->kv.dtype;
}

/* ========================================================================= */
/* Forward pass                                                              */
/* ========================================================================= */

int ig_batch_logit_rows(const ig_batch_t *b)
{
    int rows = 0;
    for (int s = 0; s < b->nseq; s++) {
        int len = b->seq_start[s + 1] - b->seq_start[s];
        int from = b->logits_from[s];
        if (from < len)
            rows += len - (from > 0 ? from : 0);
    }
    return rows;
}

/* Checks the batch and fills the host index arrays; returns the number of
 * block-table columns used, or a negative IG_E* code. */
static int stage_batch(ig_engine_t *e, const ig_batch_t *b, int *nrows_out)
{
    const ig_model_config_t *c = &e->cfg;
    int bs = e->kv.block_size;
    if (b->nseq <= 0 || b->nseq > e->opts.max_num_seqs || b->seq_start[0] != 0)
        return IG_EINVAL;
    int ntok = b->seq_start[b->nseq];
    if (ntok > e->opts.max_batched_tokens)
        return IG_ETOOLONG;
    int maxb = 0;
    for (int s = 0; s < b->nseq; s++) {
        int len = b->seq_start[s + 1] - b->seq_start[s];
        if (len <= 0 || b->pos_start[s] < 0 || b->logits_from[s] < 0 || b->logits_from[s] > len)
            return IG_EINVAL;
        int ctx = b->pos_start[s] + len;
        int nb = (ctx + bs - 1) / bs;
        if (nb > e->max_blocks)
            return IG_ETOOLONG;
        if (nb > maxb)
            maxb = nb;
    }
    int nrows = 0;
    e->h_q_start[0] = 0;
    for (int s = 0; s < b->nseq; s++) {
        int start = b->seq_start[s], len = b->seq_start[s + 1] - start;
        int ctx = b->pos_start[s] + len, nb = (ctx + bs - 1) / bs;
        const int *table = b->block_tables[s];
        int *row = e->h_tables + (size_t)s * maxb;
        for (int i = 0; i < nb; i++) {
            if (table[i] < 0 || table[i] >= e->kv.num_blocks)
                return IG_ERANGE;
            row[i] = table[i];
        }
        for (int i = nb; i < maxb; i++)
            row[i] = 0;
        for (int i = 0; i < len; i++) {
            int p = b->pos_start[s] + i, t = b->tokens[start + i];
            if (t < 0 || t >= c->vocab_size)
                return IG_ERANGE;
            e->h_pos[start + i] = p;
            e->h_slots[start + i] = table[p / bs] * bs + p % bs;
            if (i >= b->logits_from[s])
                e->h_rows[nrows++] = start + i;
        }
        e->h_q_start[s + 1] = start + len;
        e->h_ctx_len[s] = ctx;
    }
    *nrows_out = nrows;
    return maxb;
}

/* out(n, cols) = x[rows] through host memory, for a backend without gather. */
static int gather_via_host(ig_engine_t *e, float *out, const float *x, const int *rows, int n,
                           int cols)
{
    size_t rb = (size_t)cols * sizeof(float);
    float *tmp = malloc(rb);
    int rc = tmp ? 0 : IG_ENOMEM;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = e->be->download(e->be, tmp, x + (size_t)rows[i] * cols, rb);
        if (rc == 0)
            rc = e->be->upload(e->be, out + (size_t)i * cols, tmp, rb);
    }
    free(tmp);
    return rc;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((rc = (call)) != 0)                                                                    \
            goto fail;                                                                             \
    } while (0)

/* Copies count ints to the packed host buffer at *n and returns where they
 * will be in backend memory. */
static int *pack(ig_engine_t *e, size_t *n, const int *src, size_t count)
{
    memcpy(e->h_meta + *n, src, count * sizeof(int));
    int *at = e->d_meta + *n;
    *n += count;
    return at;
}

/* The step's index arrays in one upload, from page-locked memory where the
 * backend has it: the copy may still run when this returns, and the next
 * step rewrites h_meta only after this one's download or sync. */
static int upload_step(ig_engine_t *e, const ig_batch_t *b, int ntok, int nrows, int maxb)
{
    int nseq = b->nseq;
    size_t n = 0;
    e->d_tokens = pack(e, &n, b->tokens, (size_t)ntok);
    e->d_pos = pack(e, &n, e->h_pos, (size_t)ntok);
    e->d_slots = pack(e, &n, e->h_slots, (size_t)ntok);
    e->d_rows = pack(e, &n, e->h_rows, (size_t)nrows);
    e->d_q_start = pack(e, &n, e->h_q_start, (size_t)nseq + 1);
    e->d_ctx_len = pack(e, &n, e->h_ctx_len, (size_t)nseq);
    e->d_tables = pack(e, &n, e->h_tables, (size_t)nseq * maxb);
    return e->be->upload(e->be, e->d_meta, e->h_meta, n * sizeof(int));
}

/* The layers of a decode batch (one query row per sequence) through the
 * backend's fused operations: q/k/v with the attention norm, RoPE with the
 * KV append, attention, o_proj with the residual add, gate/up with the MLP
 * norm and SwiGLU, down_proj with the residual add (docs/gpu.md). */
static int forward_layers_fused(ig_engine_t *e, const ig_attn_batch_t *ab, float scale, int ntok)
{
    ig_backend_t *be = e->be;
    const ig_model_config_t *c = &e->cfg;
    int rc, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    float eps = c->rms_norm_eps;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const layer_t *L = &e->layers[l];
        float *qkv[3] = {e->q, e->k, e->v};
        const ig_weight_t *w[3] = {&L->wq, &L->wk, &L->wv}, *bias[3] = {&L->bq, &L->bk, &L->bv};
        CHECK(be->norm_matmul(be, qkv, e->x, &L->attn_norm, eps, w, L->has_bias ? bias : NULL, 3,
                              ntok));
        if (L->has_qk_norm) {
            CHECK(be->rmsnorm(be, e->q, e->q, &L->q_norm, ntok * nh, eps));
            CHECK(be->rmsnorm(be, e->k, e->k, &L->k_norm, ntok * nkv, eps));
        }
        CHECK(be->rope_kv_append(be, e->q, e->k, e->v, &e->kv, l, e->d_pos, e->d_slots, ntok, nh,
                                 e->inv_freq));
        CHECK(be->attention(be, e->att, e->q, &e->kv, l, ab, nh, scale));
        CHECK(be->matmul_add(be, e->x, e->att, &L->wo, ntok));
        CHECK(be->norm_swiglu(be, e->hb, e->x, &L->mlp_norm, eps, &L->w_gate, &L->w_up, ntok));
        CHECK(be->matmul_add(be, e->x, e->hb, &L->w_down, ntok));
    }
    return 0;

fail:
    return rc;
}

int ig_engine_forward(ig_engine_t *e, const ig_batch_t *b)
{
    ig_backend_t *be = e->be;
    const ig_model_config_t *c = &e->cfg;
    int rc, nrows = 0;
    int maxb = stage_batch(e, b, &nrows);
    if (maxb < 0)
        return maxb;
    int ntok = b->seq_start[b->nseq], nseq = b->nseq;
    int dim = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads;
    int nkv = c->num_key_value_heads, hidden = c->intermediate_size;

    /* A decode batch (one row per sequence) takes the fused operations
     * where the backend has them. */
    int fused =
        ntok == nseq && be->norm_matmul && be->norm_swiglu && be->matmul_add && be->rope_kv_append;
    CHECK(upload_step(e, b, ntok, nrows, maxb));

    ig_attn_batch_t ab = {
        .nseq = nseq,
        .ntok = ntok,
        .q_start = e->d_q_start,
        .ctx_len = e->d_ctx_len,
        .block_tables = e->d_tables,
        .max_blocks = maxb,
    };
    for (int s = 0; s < nseq; s++) {
        int qn = e->h_q_start[s + 1] - e->h_q_start[s];
        if (e->h_ctx_len[s] > ab.max_ctx)
            ab.max_ctx = e->h_ctx_len[s];
        if (qn > ab.max_q)
            ab.max_q = qn;
    }
    float scale = 1.0f / sqrtf((float)hd);

    CHECK(be->embed(be, e->x, &e->embed, e->d_tokens, ntok));
    if (fused)
        CHECK(forward_layers_fused(e, &ab, scale, ntok));
    for (int l = 0; !fused && l < c->num_hidden_layers; l++) {
        const layer_t *L = &e->layers[l];
        /* attention block */
        CHECK(be->rmsnorm(be, e->xb, e->x, &L->attn_norm, ntok, c->rms_norm_eps));
        CHECK(be->matmul(be, e->q, e->xb, &L->wq, L->has_bias ? &L->bq : NULL, ntok));
        CHECK(be->matmul(be, e->k, e->xb, &L->wk, L->has_bias ? &L->bk : NULL, ntok));
        CHECK(be->matmul(be, e->v, e->xb, &L->wv, L->has_bias ? &L->bv : NULL, ntok));
        if (L->has_qk_norm) {
            /* Qwen3: each head of q and k (rows of head_dim) normalized. */
            CHECK(be->rmsnorm(be, e->q, e->q, &L->q_norm, ntok * nh, c->rms_norm_eps));
            CHECK(be->rmsnorm(be, e->k, e->k, &L->k_norm, ntok * nkv, c->rms_norm_eps));
        }
        CHECK(be->rope(be, e->q, e->k, e->d_pos, ntok, nh, nkv, hd, e->inv_freq));
        CHECK(be->kv_append(be, &e->kv, l, e->k, e->v, e->d_slots, ntok));
        CHECK(be->attention(be, e->att, e->q, &e->kv, l, &ab, nh, scale));
        CHECK(be->matmul(be, e->xb, e->att, &L->wo, NULL, ntok));
        CHECK(be->add(be, e->x, e->xb, (size_t)ntok * dim));
        /* MLP block */
        CHECK(be->rmsnorm(be, e->xb, e->x, &L->mlp_norm, ntok, c->rms_norm_eps));
        CHECK(be->matmul(be, e->hb, e->xb, &L->w_gate, NULL, ntok));
        CHECK(be->matmul(be, e->hb2, e->xb, &L->w_up, NULL, ntok));
        CHECK(be->swiglu(be, e->hb, e->hb, e->hb2, (size_t)ntok * hidden));
        CHECK(be->matmul(be, e->xb, e->hb, &L->w_down, NULL, ntok));
        CHECK(be->add(be, e->x, e->xb, (size_t)ntok * dim));
    }

    /* Only the requested rows go through the final norm and lm_head. */
    for (int r0 = 0; r0 < nrows; r0 += LOGIT_CHUNK) {
        int n = nrows - r0 < LOGIT_CHUNK ? nrows - r0 : LOGIT_CHUNK;
        if (be->gather != NULL)
            CHECK(be->gather(be, e->xb, e->x, e->d_rows + r0, n, dim));
        else
            CHECK(gather_via_host(e, e->xb, e->x, e->h_rows + r0, n, dim));
        float *dst = b->logits + (size_t)r0 * c->vocab_size;
        float *out = e->host_logits ? dst : e->logits;
        if (fused) {
            const ig_weight_t *head = &e->lm_head;
            CHECK(be->norm_matmul(be, &out, e->xb, &e->final_norm, c->rms_norm_eps, &head, NULL, 1,
                                  n));
        } else {
            CHECK(be->rmsnorm(be, e->xb, e->xb, &e->final_norm, n, c->rms_norm_eps));
            CHECK(be->matmul(be, out, e->xb, &e->lm_head, NULL, n));
        }
        if (!e->host_logits)
            CHECK(be->download(be, dst, e->logits, (size_t)n * c->vocab_size * sizeof(float)));
    }
    /* The last download waited for the step's work: the one host wait. */
    if (e->host_logits || nrows == 0)
        CHECK(be->sync(be));
    return 0;

fail:
    /* Nothing may still read h_meta when the next step rewrites it. */
    (void)be->sync(be);
    return rc;
}
