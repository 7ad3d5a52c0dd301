/*
 * The CPU backend's element-wise operations, RoPE and the KV cache append
 * (cpu_backend.c has the backend itself), each split over the thread pool
 * when it is big enough to pay for waking it.
 */
#include "cpu_internal.h"
#include "simd.h"

#include "infergate/dtype.h"
#include "infergate/error.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================================= */
/* Element-wise operations                                                   */
/* ========================================================================= */

int ig__cpu_embed(ig_backend_t *be, float *out, const ig_weight_t *table, const int *tokens,
                  int ntok)
{
    const float *t = table->data;
    int packed = ig__cpu_is_packed(ig__cpu_of(be), table),
        pairs = packed && ig__cpu_is_pairs(ig__cpu_of(be), table);
    for (int i = 0; i < ntok; i++)
        if (tokens[i] < 0 || tokens[i] >= table->rows)
            return IG_ERANGE;
    for (int i = 0; i < ntok; i++) {
        float *o = out + (size_t)i * table->cols;
        if (table->dtype == IG_DTYPE_Q8_0 || table->dtype == IG_DTYPE_Q4_0)
            ig__qp_unpack_row(o, table->data, table->dtype, (int)table->cols, tokens[i]);
        else if (table->dtype == IG_DTYPE_Q4_K || table->dtype == IG_DTYPE_Q6_K)
            ig__kqp_unpack_row(o, table->data, table->dtype, (int)table->cols, tokens[i]);
        else if (pairs)
            ig__gemm16p_unpack_row(o, table->data, (int)table->cols, tokens[i]);
        else if (packed && table->dtype != IG_DTYPE_F32)
            ig__gemm16_unpack_row(o, table->data, table->dtype == IG_DTYPE_BF16, (int)table->cols,
                                  tokens[i]);
        else if (packed)
            ig__gemm_unpack_row(o, t, (int)table->cols, tokens[i]);
        else
            memcpy(o, t + (size_t)tokens[i] * table->cols, (size_t)table->cols * sizeof(float));
    }
    return 0;
}

typedef struct {
    float *out;
    const float *x;
    const float *w;
    int m, n;
    float eps;
    int chunk; /* rows per work item */
    atomic_int next;
} rmsnorm_job_t;

static void rmsnorm_rows(const rmsnorm_job_t *j, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        const float *x = j->x + (size_t)r * j->n;
        float *o = j->out + (size_t)r * j->n;
        float ss = ig__dot(x, x, j->n);
        float inv = 1.0f / sqrtf(ss / (float)j->n + j->eps);
        for (int i = 0; i < j->n; i++)
            o[i] = x[i] * inv * j->w[i];
    }
}

static void rmsnorm_task(void *arg, int tid, int nt)
{
    rmsnorm_job_t *j = arg;
    int r0, r1;
    while (ig__pool_take(&j->next, j->m, j->chunk, &r0, &r1))
        rmsnorm_rows(j, r0, r1);
}

int ig__cpu_rmsnorm(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                    float eps)
{
    rmsnorm_job_t j = {.out = out, .x = x, .w = w->data, .m = m, .n = (int)w->rows, .eps = eps};
    ig__cpu_t *c = ig__cpu_of(be);
    if ((size_t)m * j.n >= IG_CPU_PARALLEL_MIN_ELEMS && m > 1 && c->nthreads > 1) {
        j.chunk = m / (c->nthreads * 4) > 1 ? m / (c->nthreads * 4) : 1;
        atomic_init(&j.next, 0);
        ig__pool_run(c->pool, rmsnorm_task, &j);
    } else {
        rmsnorm_rows(&j, 0, m);
    }
    return 0;
}

typedef struct {
    float *y;
    const float *x;
    const float *gate, *up;
    size_t n;
    int op;          /* 0 add, 1 swiglu */
    atomic_int next; /* the next EW_CHUNK elements to take */
} ew_job_t;

#define EW_CHUNK 16384

static void ew_range(const ew_job_t *j, size_t b, size_t e)
{
    if (j->op == 0) {
        for (size_t i = b; i < e; i++)
            j->y[i] += j->x[i];
    } else {
        ig__swiglu(j->y + b, j->gate + b, j->up + b, e - b);
    }
}

static void ew_task(void *arg, int tid, int nt)
{
    ew_job_t *j = arg;
    for (;;) {
        size_t b = (size_t)atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed) * EW_CHUNK;
        if (b >= j->n)
            break;
        ew_range(j, b, b + EW_CHUNK < j->n ? b + EW_CHUNK : j->n);
    }
}

static void ew_run(ig_backend_t *be, ew_job_t *j)
{
    atomic_init(&j->next, 0);
    if (j->n >= IG_CPU_PARALLEL_MIN_ELEMS && j->n / EW_CHUNK < INT_MAX &&
        ig__cpu_of(be)->nthreads > 1)
        ig__pool_run(ig__cpu_of(be)->pool, ew_task, j);
    else
        ew_range(j, 0, j->n);
}

int ig__cpu_swiglu(ig_backend_t *be, float *out, const float *gate, const float *up, size_t n)
{
    ew_job_t j = {.y = out, .gate = gate, .up = up, .n = n, .op = 1};
    ew_run(be, &j);
    return 0;
}

int ig__cpu_add(ig_backend_t *be, float *y, const float *x, size_t n)
{
    ew_job_t j = {.y = y, .x = x, .n = n, .op = 0};
    ew_run(be, &j);
    return 0;
}

int ig__cpu_gather(ig_backend_t *be, float *out, const float *x, const int *rows, int n, int cols)
{
    for (int i = 0; i < n; i++)
        memmove(out + (size_t)i * cols, x + (size_t)rows[i] * cols, (size_t)cols * sizeof(float));
    return 0;
}

/* ========================================================================= */
/* RoPE                                                                      */
/* ========================================================================= */

typedef struct {
    float *q, *k;
    const int *pos;
    int ntok, n_heads, n_kv_heads, head_dim;
    const float *inv_freq;
    atomic_int next; /* the next 4 tokens to take */
} rope_job_t;

static void rope_rows(const rope_job_t *j, int t0, int t1)
{
    int half = j->head_dim / 2;
    float cs[512], sn[512];
    for (int t = t0; t < t1; t++) {
        /* The angle in double, as tests/reference/llama_ref.py takes it:
         * near position 10^5 a float32 product is off by up to 4e-3 rad. */
        for (int i = 0; i < half; i++) {
            double a = (double)j->pos[t] * (double)j->inv_freq[i];
            cs[i] = (float)cos(a);
            sn[i] = (float)sin(a);
        }
        for (int pass = 0; pass < 2; pass++) {
            int nh = pass == 0 ? j->n_heads : j->n_kv_heads;
            float *base = pass == 0 ? j->q : j->k;
            for (int h = 0; h < nh; h++) {
                float *v = base + ((size_t)t * nh + h) * j->head_dim;
                for (int i = 0; i < half; i++) {
                    float x1 = v[i], x2 = v[i + half];
                    v[i] = x1 * cs[i] - x2 * sn[i];
                    v[i + half] = x2 * cs[i] + x1 * sn[i];
                }
            }
        }
    }
}

static void rope_task(void *arg, int tid, int nt)
{
    rope_job_t *j = arg;
    int t0, t1;
    while (ig__pool_take(&j->next, j->ntok, 4, &t0, &t1))
        rope_rows(j, t0, t1);
}

int ig__cpu_rope(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int n_heads,
                 int n_kv_heads, int head_dim, const float *inv_freq)
{
    if (head_dim % 2 != 0 || head_dim > 1024)
        return IG_EINVAL;
    rope_job_t j = {.q = q,
                    .k = k,
                    .pos = pos,
                    .ntok = ntok,
                    .n_heads = n_heads,
                    .n_kv_heads = n_kv_heads,
                    .head_dim = head_dim,
                    .inv_freq = inv_freq};
    atomic_init(&j.next, 0);
    if (ntok >= 8 && ig__cpu_of(be)->nthreads > 1)
        ig__pool_run(ig__cpu_of(be)->pool, rope_task, &j);
    else
        rope_rows(&j, 0, ntok);
    return 0;
}

/* ========================================================================= */
/* Paged KV cache: append                                                 */
/* ========================================================================= */

typedef struct {
    const ig_kv_layout_t *kv;
    int layer;
    const float *k, *v;
    const int *slots;
    int ntok;
    atomic_int next; /* the next KV_CHUNK tokens to take */
} kv_job_t;

#define KV_CHUNK 8

static void kv_rows(const kv_job_t *j, int t0, int t1)
{
    const ig_kv_layout_t *kv = j->kv;
    size_t row = (size_t)kv->n_kv_heads * kv->head_dim, hd = (size_t)kv->head_dim;
    int bf16 = kv->dtype == IG_DTYPE_BF16;
    for (int t = t0; t < t1; t++) {
        int block = j->slots[t] / kv->block_size, off = j->slots[t] % kv->block_size;
        for (int h = 0; h < kv->n_kv_heads; h++) {
            size_t o = ig__kv_offset(kv, j->layer, block, h, off);
            const float *ks = j->k + t * row + (size_t)h * hd,
                        *vs = j->v + t * row + (size_t)h * hd;
            if (kv->dtype == IG_DTYPE_F32) {
                memcpy((float *)kv->k + o, ks, hd * sizeof(float));
                memcpy((float *)kv->v + o, vs, hd * sizeof(float));
            } else {
                ig__kv16_store((uint16_t *)kv->k + o, ks, hd, bf16);
                ig__kv16_store((uint16_t *)kv->v + o, vs, hd, bf16);
            }
        }
    }
}

static void kv_task(void *arg, int tid, int nt)
{
    kv_job_t *j = arg;
    int t0, t1;
    while (ig__pool_take(&j->next, j->ntok, KV_CHUNK, &t0, &t1))
        kv_rows(j, t0, t1);
}

/* At batch 64 the writes land in 64 sequences' blocks, cache misses each:
 * split over the pool like the other operations. Every slot is checked
 * before anything is written. */
int ig__cpu_kv_append(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                      const float *v, const int *slots, int ntok)
{
    if (!ig__kv_dtype_ok(kv))
        return IG_EINVAL;
    for (int t = 0; t < ntok; t++)
        if (slots[t] < 0 || slots[t] / kv->block_size >= kv->num_blocks)
            return IG_ERANGE;
    kv_job_t j = {.kv = kv, .layer = layer, .k = k, .v = v, .slots = slots, .ntok = ntok};
    atomic_init(&j.next, 0);
    if (ntok >= 2 * KV_CHUNK && ig__cpu_of(be)->nthreads > 1)
        ig__pool_run(ig__cpu_of(be)->pool, kv_task, &j);
    else
        kv_rows(&j, 0, ntok);
    return 0;
}