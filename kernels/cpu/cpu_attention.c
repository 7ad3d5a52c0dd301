/*
 * The CPU backend's attention over the paged KV cache: causal, per
 * sequence and head, one fixed order of summation so that a row's result
 * does not depend on the batch (docs/engine.md).
 */
#include "cpu_internal.h"
#include "simd.h"

#include "infergate/dtype.h"
#include "infergate/error.h"

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================================= */
/* Paged KV cache: attention                                                 */
/* ========================================================================= */

/* n consecutive rows of one (block, head) of the cache `base` (kv->k or
 * kv->v) from row `off`, as F32: where they lie in an F32 cache, widened
 * into wide (n * head_dim floats) from a 16-bit one. Widening is exact, so
 * attention over a 16-bit cache computes exactly what it computes over an
 * F32 cache holding the rounded values. */
static inline const float *kv_rows_f32(const ig_kv_layout_t *kv, const void *base, int layer,
                                       int block, int head, int off, int n, float *wide)
{
    size_t at = ig__kv_offset(kv, layer, block, head, off);
    if (kv->dtype == IG_DTYPE_F32)
        return (const float *)base + at;
    ig__kv16_load(wide, (const uint16_t *)base + at, (size_t)n * kv->head_dim,
                  kv->dtype == IG_DTYPE_BF16);
    return wide;
}

/* Query rows of one sequence per attention work item: a long prefill is
 * split so that all threads share it, a decode row is one item per head. */
#define ATTN_ROWS 16

typedef struct {
    float *out;
    const float *q;
    const ig_kv_layout_t *kv;
    int layer;
    const ig_attn_batch_t *b;
    int n_heads;
    float scale;
    float **scratch;  /* per thread: scores, then at wide_off 16 + block_size widened rows */
    size_t wide_off;  /* floats of scores before the widened K rows (16 of them), then V's */
    const int *items; /* (nitems) sequence << 16 | first row / ATTN_ROWS */
    int nitems;
    atomic_int next; /* the next (item, head) to take */
} attn_job_t;

/* The element kinds of the cache as the attention loops take them: a
 * constant at every call of the inlined loops, so each kind gets its own
 * loop. KV_F16 / KV_BF16 are read in their 16 bits only on the AVX-512
 * path (vcvtph2ps and a shift are AVX-512F instructions, so the build that
 * runs this path has them); elsewhere rows are widened first (kv_rows_f32,
 * kv16.c's run-time dispatch) and read as KV_F32. */
enum { KV_F32 = 0, KV_F16, KV_BF16 };

static int kv_kind(const ig_kv_layout_t *kv)
{
    return kv->dtype == IG_DTYPE_F16 ? KV_F16 : kv->dtype == IG_DTYPE_BF16 ? KV_BF16 : KV_F32;
}

/* The blocks of a sequence lie anywhere in the cache, so the hardware
 * prefetcher loses the stream at each block boundary: the loops request the
 * rows of the block KV_AHEAD blocks on (of one head, bs * head_dim
 * elements) while they work on the current one. */
#define KV_AHEAD 2

static inline void kv_prefetch_block(const ig_kv_layout_t *kv, const void *base, int layer,
                                     int block, int head)
{
    size_t esz = ig_dtype_size(kv->dtype);
    const char *p = (const char *)base + ig__kv_offset(kv, layer, block, head, 0) * esz;
    size_t bytes = (size_t)kv->block_size * kv->head_dim * esz;
    for (size_t c = 0; c < bytes; c += 64)
        __builtin_prefetch(p + c, 0, 3);
}

/* Whether the AVX-512 loops read this cache in its own elements. */
static int kv_fused(const ig_kv_layout_t *kv)
{
#if defined(__AVX512F__)
    return kv->head_dim % 16 == 0;
#else
    return kv->dtype == IG_DTYPE_F32;
#endif
}

#if defined(__AVX512F__)
/* 16 elements of a cache row at element `at` of p, widened to F32 (exact). */
static inline __attribute__((always_inline)) __m512 kv_vload(const void *p, size_t at, int kind)
{
    if (kind == KV_F32)
        return _mm512_loadu_ps((const float *)p + at);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at));
    if (kind == KV_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

/* scores[t] = q . K[t] * scale for the n (<= 16) keys at kp[0..n), rows of
 * `kind` (KV_F32 only off the AVX-512 path). */
static inline __attribute__((always_inline)) void scores16_of(const float *q, const void *const *kp,
                                                              int n, int hd, float scale,
                                                              float *scores, int kind)
{
#if defined(__AVX512F__)
    if (hd % 16 == 0) {
        /* Sixteen dot products at once and one transpose-tree sum: a head
         * of 64 would otherwise spend as long on each horizontal sum as on
         * its four multiply-adds. Slots past n read the first key again (in
         * bounds) and are dropped; a lane's sum never mixes other lanes. */
        const void *p[16];
        for (int t = 0; t < 16; t++)
            p[t] = t < n ? kp[t] : kp[0];
        __m512 acc[16];
#pragma GCC unroll 16
        for (int t = 0; t < 16; t++)
            acc[t] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            __m512 qv = _mm512_loadu_ps(q + d);
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++)
                acc[t] = _mm512_fmadd_ps(qv, kv_vload(p[t], (size_t)d, kind), acc[t]);
        }
        __m512 sc = _mm512_mul_ps(ig__vsum_16(acc), _mm512_set1_ps(scale));
        _mm512_mask_storeu_ps(scores, (__mmask16)((1u << n) - 1), sc);
        return;
    }
#endif
    for (int t = 0; t < n; t++)
        scores[t] = ig__dot(q, kp[t], hd) * scale;
}

static void attn_scores16(const float *q, const void *const *kp, int n, int hd, float scale,
                          float *scores, int kind)
{
    if (kind == KV_F16)
        scores16_of(q, kp, n, hd, scale, scores, KV_F16);
    else if (kind == KV_BF16)
        scores16_of(q, kp, n, hd, scale, scores, KV_BF16);
    else
        scores16_of(q, kp, n, hd, scale, scores, KV_F32);
}

/* o(hd) = inv * sum over t < n of p[t] * V[t], V read through the block
 * table in its own elements (kind); the running sum stays in NV registers
 * of 16 lanes. */
static inline __attribute__((always_inline)) void wsum_regs(const ig_kv_layout_t *kv, int layer,
                                                            const int *table, int kvh,
                                                            const float *p, int n, float inv,
                                                            float *o, int NV, int kind)
{
#if defined(__AVX512F__)
    __m512 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++)
        acc[i] = _mm512_setzero_ps();
    int bs = kv->block_size, hd = kv->head_dim;
    for (int t0 = 0; t0 < n; t0 += bs) {
        int m = n - t0 < bs ? n - t0 : bs;
        size_t at = ig__kv_offset(kv, layer, table[t0 / bs], kvh, 0);
        if (t0 + KV_AHEAD * bs < n)
            kv_prefetch_block(kv, kv->v, layer, table[t0 / bs + KV_AHEAD], kvh);
        for (int t = 0; t < m; t++) {
            __m512 pv = _mm512_set1_ps(p[t0 + t]);
#pragma GCC unroll 8
            for (int i = 0; i < NV; i++)
                acc[i] = _mm512_fmadd_ps(pv, kv_vload(kv->v, at + (size_t)t * hd + 16 * i, kind),
                                         acc[i]);
        }
    }
    __m512 s = _mm512_set1_ps(inv);
#pragma GCC unroll 8
    for (int i = 0; i < NV; i++)
        _mm512_storeu_ps(o + 16 * i, _mm512_mul_ps(acc[i], s));
#endif
}

static void attn_weighted_sum(const ig_kv_layout_t *kv, int layer, const int *table, int kvh,
                              const float *p, int n, float inv, float *o, float *wide)
{
    int hd = kv->head_dim, bs = kv->block_size;
#if defined(__AVX512F__)
    int kind = kv_kind(kv);
    switch (hd % 16 == 0 && hd <= 128 ? hd / 16 * 3 + kind : 0) {
#define NV_CASE(k)                                                                                 \
    case 3 * k + KV_F32:                                                                           \
        wsum_regs(kv, layer, table, kvh, p, n, inv, o, k, KV_F32);                                 \
        return;                                                                                    \
    case 3 * k + KV_F16:                                                                           \
        wsum_regs(kv, layer, table, kvh, p, n, inv, o, k, KV_F16);                                 \
        return;                                                                                    \
    case 3 * k + KV_BF16:                                                                          \
        wsum_regs(kv, layer, table, kvh, p, n, inv, o, k, KV_BF16);                                \
        return;
        NV_CASE(1)
        NV_CASE(2)
        NV_CASE(3)
        NV_CASE(4)
        NV_CASE(5)
        NV_CASE(6)
        NV_CASE(7)
        NV_CASE(8)
#undef NV_CASE
    default:
        break;
    }
#endif
    memset(o, 0, (size_t)hd * sizeof(float));
    for (int t0 = 0; t0 < n; t0 += bs) {
        int m = n - t0 < bs ? n - t0 : bs;
        const float *vr = kv_rows_f32(kv, kv->v, layer, table[t0 / bs], kvh, 0, m, wide);
        for (int t = 0; t < m; t++)
            ig__axpy(o, p[t0 + t], vr + (size_t)t * hd, hd);
    }
    for (int i = 0; i < hd; i++)
        o[i] *= inv;
}

/* Up to ATTN_PREFETCH bytes each of the cached K and V that rows [.., r1)
 * of sequence s, head h will read, requested ahead: at decode a (sequence,
 * head) reads a few KiB from a cache far larger than L2, and one request
 * after another would leave the core waiting on each. */
#define ATTN_PREFETCH (16 * 1024)

static void attn_prefetch(const attn_job_t *j, int s, int h, int r1)
{
    const ig_kv_layout_t *kv = j->kv;
    const ig_attn_batch_t *b = j->b;
    int bs = kv->block_size, kvh = h / (j->n_heads / kv->n_kv_heads);
    const int *table = b->block_tables + (size_t)s * b->max_blocks;
    int n = b->ctx_len[s] - (b->q_start[s + 1] - b->q_start[s]) + r1; /* positions read */
    size_t esz = ig_dtype_size(kv->dtype), row = (size_t)kv->head_dim * esz, done = 0;
    for (int t0 = 0; t0 < n && done < ATTN_PREFETCH; t0 += bs) {
        size_t off = ig__kv_offset(kv, j->layer, table[t0 / bs], kvh, 0) * esz;
        size_t bytes = (size_t)(n - t0 < bs ? n - t0 : bs) * row;
        const char *k = (const char *)kv->k + off, *v = (const char *)kv->v + off;
        for (size_t c = 0; c < bytes; c += 64) {
            __builtin_prefetch(k + c, 0, 3);
            __builtin_prefetch(v + c, 0, 3);
        }
        done += bytes;
    }
}

/* Rows [r0, r1) of sequence s, head h: each against its cached positions up
 * to its own, softmax with the maximum subtracted. Every row is computed the
 * same way whatever else is in the batch. */
static void attn_rows(attn_job_t *j, int s, int h, int r0, int r1, float *scores)
{
    const ig_kv_layout_t *kv = j->kv;
    const ig_attn_batch_t *b = j->b;
    int hd = kv->head_dim, bs = kv->block_size;
    int kvh = h / (j->n_heads / kv->n_kv_heads);
    int q0 = b->q_start[s], qn = b->q_start[s + 1] - q0;
    const int *table = b->block_tables + (size_t)s * b->max_blocks;
    float *kwide = scores + j->wide_off, *vwide = kwide + (size_t)16 * hd;
    int fused = kv_fused(kv), kind = fused ? kv_kind(kv) : KV_F32;
    size_t esz = ig_dtype_size(kv->dtype);
    for (int r = r0; r < r1; r++) {
        int pos = b->ctx_len[s] - qn + r;
        const float *q = j->q + ((size_t)(q0 + r) * j->n_heads + h) * hd;
        float *o = j->out + ((size_t)(q0 + r) * j->n_heads + h) * hd;
        /* K rows found block by block (no division per position), a run
         * of consecutive rows of one block at a time. */
        const void *kp[16];
        int blk = 0, off = 0;
        for (int t0 = 0; t0 <= pos; t0 += 16) {
            int n = pos + 1 - t0 < 16 ? pos + 1 - t0 : 16;
            for (int t = 0; t < n;) {
                if (off == bs) {
                    off = 0;
                    blk++;
                    if ((blk + KV_AHEAD) * bs <= pos)
                        kv_prefetch_block(kv, kv->k, j->layer, table[blk + KV_AHEAD], kvh);
                }
                int run = n - t < bs - off ? n - t : bs - off;
                if (fused) { /* rows in the cache's own elements */
                    size_t at = ig__kv_offset(kv, j->layer, table[blk], kvh, off);
                    for (int i = 0; i < run; i++)
                        kp[t + i] = (const char *)kv->k + (at + (size_t)i * hd) * esz;
                } else {
                    const float *kr = kv_rows_f32(kv, kv->k, j->layer, table[blk], kvh, off, run,
                                                  kwide + (size_t)t * hd);
                    for (int i = 0; i < run; i++)
                        kp[t + i] = kr + (size_t)i * hd;
                }
                t += run;
                off += run;
            }
            attn_scores16(q, kp, n, hd, j->scale, scores + t0, kind);
        }
        float mx = -INFINITY;
        for (int t = 0; t <= pos; t++)
            mx = scores[t] > mx ? scores[t] : mx;
        float sum = ig__exp_shift_sum(scores, pos + 1, mx);
        attn_weighted_sum(kv, j->layer, table, kvh, scores, pos + 1, 1.0f / sum, o, vwide);
    }
}

/* Work item it: sequence, head and rows. */
static void attn_item(const attn_job_t *j, int it, int *s, int *h, int *r0, int *r1)
{
    int item = j->items[it / j->n_heads];
    *h = it % j->n_heads;
    *s = item >> 16;
    *r0 = (item & 0xffff) * ATTN_ROWS;
    int qn = j->b->q_start[*s + 1] - j->b->q_start[*s];
    *r1 = *r0 + ATTN_ROWS < qn ? *r0 + ATTN_ROWS : qn;
}

/* Each thread takes its next item before working on the current one, so
 * that the next item's K and V are on their way meanwhile. */
static void attn_task(void *arg, int tid, int nt)
{
    attn_job_t *j = arg;
    int total = j->nitems * j->n_heads, s, h, r0, r1;
    int it = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (it < total) {
        attn_item(j, it, &s, &h, &r0, &r1);
        attn_prefetch(j, s, h, r1);
    }
    while (it < total) {
        int nx = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed), s2, h2, a2, b2;
        if (nx < total) {
            attn_item(j, nx, &s2, &h2, &a2, &b2);
            attn_prefetch(j, s2, h2, b2);
        }
        attn_rows(j, s, h, r0, r1, j->scratch[tid]);
        it = nx, s = s2, h = h2, r0 = a2, r1 = b2;
    }
}

int ig__cpu_attention(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                      int layer, const ig_attn_batch_t *batch, int n_heads, float scale)
{
    ig__cpu_t *c = ig__cpu_of(be);
    if (kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads != 0 || batch->nseq > 0xffff ||
        !ig__kv_dtype_ok(kv))
        return IG_EINVAL;
    size_t need = (size_t)(batch->max_ctx > 0 ? batch->max_ctx : 1);
    int nitems = 0;
    double work = 0; /* multiply-adds of the scores and the weighted sum */
    for (int s = 0; s < batch->nseq; s++) {
        int qn = batch->q_start[s + 1] - batch->q_start[s];
        if (qn < 0 || batch->ctx_len[s] < qn ||
            batch->ctx_len[s] > batch->max_blocks * kv->block_size)
            return IG_ERANGE;
        if ((size_t)batch->ctx_len[s] > need)
            need = (size_t)batch->ctx_len[s];
        nitems += (qn + ATTN_ROWS - 1) / ATTN_ROWS;
        work += 2.0 * qn * batch->ctx_len[s] * n_heads * kv->head_dim;
    }
    /* After the scores, room for the rows a 16-bit cache is widened into. */
    size_t wide_off = (need + 15) & ~(size_t)15;
    need = wide_off + (size_t)(16 + kv->block_size) * kv->head_dim;
    if (need > c->scratch_cap) {
        for (int t = 0; t < c->nthreads; t++) {
            float *p = realloc(c->scratch[t], need * sizeof(float));
            if (p == NULL)
                return IG_ENOMEM;
            c->scratch[t] = p;
        }
        c->scratch_cap = need;
    }
    if (nitems > c->items_cap) {
        int *p = realloc(c->items, (size_t)nitems * sizeof(int));
        if (p == NULL)
            return IG_ENOMEM;
        c->items = p;
        c->items_cap = nitems;
    }
    nitems = 0;
    for (int s = 0; s < batch->nseq; s++) {
        int qn = batch->q_start[s + 1] - batch->q_start[s];
        for (int r = 0; r * ATTN_ROWS < qn; r++)
            c->items[nitems++] = s << 16 | r;
    }
    attn_job_t j = {.out = out,
                    .q = q,
                    .kv = kv,
                    .layer = layer,
                    .b = batch,
                    .n_heads = n_heads,
                    .scale = scale,
                    .scratch = c->scratch,
                    .wide_off = wide_off,
                    .items = c->items,
                    .nitems = nitems};
    atomic_init(&j.next, 0);
    if (nitems * n_heads > 1 && c->nthreads > 1 && work >= IG_CPU_PARALLEL_MIN_FLOPS)
        ig__pool_run(c->pool, attn_task, &j);
    else
        attn_task(&j, 0, 1);
    return 0;
}
