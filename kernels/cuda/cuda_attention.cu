/*
 * Attention over the paged KV cache (layer, block, kv_head, block_size,
 * head_dim), F32, with GQA (query head h reads kv head h / (n_heads /
 * n_kv_heads)).
 *
 * Two kernels share one launch; each takes the sequences the other leaves:
 *   - decode rows (a sequence with exactly one query row): split-K flash
 *     decoding. The context is cut into partitions; one block scores a
 *     partition for all the query heads of one kv head (K and V are read
 *     once for the group), keeps an online softmax, and writes an
 *     unnormalised partial output with its running max and sum. A second
 *     kernel combines the partitions with log-sum-exp weights.
 *   - prefill rows (more than one query row): a tiled kernel, BQ query rows
 *     by BK keys per step in shared memory, online softmax, causal mask.
 *
 * The partition size depends only on the longest context of the batch and
 * is fixed (64) up to 2048 positions, so a sequence's result does not depend
 * on which other sequences share its batch (greedy decoding is the same
 * alone and batched) in that range.
 */
#include "cuda_internal.h"

#include <math.h>
#include <stdint.h>

#define DEC_THREADS 128
#define DEC_CHUNK DEC_THREADS /* positions scored per round, one per thread */
#define DEC_MAX_G 8           /* query heads per block */
#define DEC_MAX_PARTS 32
#define DEC_MIN_PART 64
#define MAX_HEAD_DIM 256

#define PF_THREADS 128
#define PF_BQ 16
#define PF_BK 16

__device__ __forceinline__ size_t kv_row(int layer, int num_blocks, int n_kv_heads, int block_size,
                                         int head_dim, int blk, int kvh, int off)
{
    return ((((size_t)layer * num_blocks + blk) * n_kv_heads + kvh) * block_size + off) *
           (size_t)head_dim;
}

/* The physical block of a position, or -1 when the table names none valid
 * (a bad table reads nothing instead of out of bounds). */
__device__ __forceinline__ int block_of(const int *bt, int p, int block_size, int num_blocks)
{
    int b = bt[p / block_size];
    return b >= 0 && b < num_blocks ? b : -1;
}

/* ======================================================================== */
/* Decode: split-K                                                          */
/* ======================================================================== */

/*
 * grid (nseq, n_kv_heads * head_groups, nparts). Block (s, kvh, hg, part)
 * handles query heads kvh * group + hg * DEC_MAX_G .. + G of sequence s over
 * positions [part * part_len, min(ctx, (part + 1) * part_len)).
 * part_o (nseq, n_heads, nparts, head_dim), part_ml (nseq, n_heads, nparts, 2).
 */
__global__ void __launch_bounds__(DEC_THREADS)
    decode_kernel(float *part_o, float *part_ml, const float *q, const float *kc, const float *vc,
                  const int *q_start, const int *ctx_len, const int *block_tables, int max_blocks,
                  int layer, int num_blocks, int block_size, int n_kv_heads, int head_dim,
                  int n_heads, int head_groups, int part_len, int nparts, float scale)
{
    __shared__ float4 q_sh[DEC_MAX_G * MAX_HEAD_DIM / 4];
    __shared__ float s_sh[DEC_MAX_G][DEC_CHUNK];
    __shared__ float m_sh[DEC_MAX_G], l_sh[DEC_MAX_G], a_sh[DEC_MAX_G];

    int s = blockIdx.x, part = blockIdx.z;
    int kvh = blockIdx.y / head_groups, hg = blockIdx.y % head_groups;
    int group = n_heads / n_kv_heads;
    int h0 = kvh * group + hg * DEC_MAX_G;
    int G = min(DEC_MAX_G, group - hg * DEC_MAX_G);
    int row = q_start[s];
    if (q_start[s + 1] - row != 1)
        return; /* not a decode row: the prefill kernel takes it */
    int ctx = ctx_len[s];
    int p_begin = part * part_len, p_end = min(ctx, p_begin + part_len);
    int tid = threadIdx.x, hd4 = head_dim / 4;
    const int *bt = block_tables + (size_t)s * max_blocks;

    for (int i = tid; i < G * hd4; i += DEC_THREADS) {
        int g = i / hd4, d4 = i % hd4;
        q_sh[g * hd4 + d4] =
            ((const float4 *)(q + ((size_t)row * n_heads + h0 + g) * head_dim))[d4];
    }
    if (tid < DEC_MAX_G) {
        m_sh[tid] = -INFINITY;
        l_sh[tid] = 0.0f;
    }
    /* Each thread owns output dims d = tid + j * DEC_THREADS for every head. */
    float acc[DEC_MAX_G][MAX_HEAD_DIM / DEC_THREADS];
#pragma unroll
    for (int g = 0; g < DEC_MAX_G; g++)
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / DEC_THREADS; j++)
            acc[g][j] = 0.0f;
    __syncthreads();

    for (int c0 = p_begin; c0 < p_end; c0 += DEC_CHUNK) {
        /* Scores: one position per thread, all G heads. */
        int p = c0 + tid;
        float sc[DEC_MAX_G];
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; g++)
            sc[g] = 0.0f;
        int blk = p < p_end ? block_of(bt, p, block_size, num_blocks) : -1;
        if (blk >= 0) {
            const float4 *kr =
                (const float4 *)(kc + kv_row(layer, num_blocks, n_kv_heads, block_size, head_dim,
                                             blk, kvh, p % block_size));
            for (int d4 = 0; d4 < hd4; d4++) {
                float4 kv = kr[d4];
#pragma unroll
                for (int g = 0; g < DEC_MAX_G; g++) {
                    if (g < G) {
                        float4 qq = q_sh[g * hd4 + d4];
                        sc[g] += qq.x * kv.x + qq.y * kv.y + qq.z * kv.z + qq.w * kv.w;
                    }
                }
            }
        }
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; g++)
            if (g < G)
                s_sh[g][tid] = blk >= 0 ? sc[g] * scale : -INFINITY;
        __syncthreads();

        /* Online softmax: warp w updates heads w, w + 4, ... */
        int lane = tid & 31, warp = tid >> 5;
        for (int g = warp; g < G; g += DEC_THREADS / 32) {
            float mx = -INFINITY;
            for (int i = lane; i < DEC_CHUNK; i += 32)
                mx = fmaxf(mx, s_sh[g][i]);
            for (int o = 16; o > 0; o >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float m_old = m_sh[g], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int i = lane; i < DEC_CHUNK; i += 32) {
                float e = m_new == -INFINITY ? 0.0f : __expf(s_sh[g][i] - m_new);
                s_sh[g][i] = e;
                sum += e;
            }
            for (int o = 16; o > 0; o >>= 1)
                sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
                a_sh[g] = alpha;
                l_sh[g] = l_sh[g] * alpha + sum;
                m_sh[g] = m_new;
            }
        }
        __syncthreads();

        /* acc = acc * alpha + P V over the chunk; V rows read once. */
#pragma unroll
        for (int g = 0; g < DEC_MAX_G; g++)
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / DEC_THREADS; j++)
                if (g < G)
                    acc[g][j] *= a_sh[g];
        int cn = min(DEC_CHUNK, p_end - c0);
        for (int i = 0; i < cn; i++) {
            int pp = c0 + i;
            int b = block_of(bt, pp, block_size, num_blocks);
            if (b < 0)
                continue;
            const float *vr = vc + kv_row(layer, num_blocks, n_kv_heads, block_size, head_dim, b,
                                          kvh, pp % block_size);
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / DEC_THREADS; j++) {
                int d = tid + j * DEC_THREADS;
                if (d < head_dim) {
                    float v = vr[d];
#pragma unroll
                    for (int g = 0; g < DEC_MAX_G; g++)
                        if (g < G)
                            acc[g][j] += s_sh[g][i] * v;
                }
            }
        }
        __syncthreads(); /* s_sh is overwritten by the next chunk */
    }

#pragma unroll
    for (int g = 0; g < DEC_MAX_G; g++) {
        if (g >= G)
            break;
        size_t base = ((size_t)s * n_heads + h0 + g) * nparts + part;
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / DEC_THREADS; j++) {
            int d = tid + j * DEC_THREADS;
            if (d < head_dim)
                part_o[base * head_dim + d] = acc[g][j];
        }
        if (tid == 0) {
            part_ml[base * 2] = m_sh[g];
            part_ml[base * 2 + 1] = l_sh[g];
        }
    }
}

/* grid (nseq, n_heads): out(row, h) = sum_p o_p e^(m_p - M) / sum_p l_p e^(m_p - M). */
__global__ void decode_combine_kernel(float *out, const float *part_o, const float *part_ml,
                                      const int *q_start, int n_heads, int head_dim, int nparts)
{
    int s = blockIdx.x, h = blockIdx.y;
    int row = q_start[s];
    if (q_start[s + 1] - row != 1)
        return;
    size_t base = ((size_t)s * n_heads + h) * nparts;
    float M = -INFINITY;
    for (int p = 0; p < nparts; p++)
        M = fmaxf(M, part_ml[(base + p) * 2]);
    float L = 0.0f;
    for (int p = 0; p < nparts; p++) {
        float m = part_ml[(base + p) * 2];
        if (m != -INFINITY)
            L += part_ml[(base + p) * 2 + 1] * __expf(m - M);
    }
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int p = 0; p < nparts; p++) {
            float m = part_ml[(base + p) * 2];
            if (m != -INFINITY)
                o += part_o[(base + p) * head_dim + d] * __expf(m - M);
        }
        out[((size_t)row * n_heads + h) * head_dim + d] = o * inv;
    }
}

/* ======================================================================== */
/* Prefill: tiled, causal                                                   */
/* ======================================================================== */

/* Dynamic shared memory of the prefill kernel for a head dimension. */
static size_t prefill_smem(int head_dim)
{
    size_t hp = (size_t)head_dim + 1; /* padded rows: no bank conflicts down a column */
    return sizeof(float) * (PF_BQ * hp + PF_BK * hp + PF_BK * (size_t)head_dim +
                            PF_BQ * (size_t)head_dim + PF_BQ * PF_BK + 3 * PF_BQ);
}

/*
 * grid (nseq, n_heads, q tiles). Block (s, h, t) handles query rows
 * t * PF_BQ .. + PF_BQ of sequence s, head h, when the sequence has more than
 * one query row. Query row i sits at position ctx - qlen + i and sees keys
 * 0 .. that position.
 */
__global__ void __launch_bounds__(PF_THREADS)
    prefill_kernel(float *out, const float *q, const float *kc, const float *vc, const int *q_start,
                   const int *ctx_len, const int *block_tables, int max_blocks, int layer,
                   int num_blocks, int block_size, int n_kv_heads, int head_dim, int n_heads,
                   float scale)
{
    extern __shared__ float smem[];
    int s = blockIdx.x, h = blockIdx.y, tile = blockIdx.z;
    int q0 = q_start[s], qlen = q_start[s + 1] - q0;
    if (qlen <= 1 || tile * PF_BQ >= qlen)
        return;
    int ctx = ctx_len[s];
    int kvh = h / (n_heads / n_kv_heads);
    int hp = head_dim + 1, tid = threadIdx.x;
    int nq = min(PF_BQ, qlen - tile * PF_BQ);
    int pos0 = ctx - qlen + tile * PF_BQ; /* position of the tile's first row */
    int kv_end = min(ctx, pos0 + nq);     /* keys the last row sees */
    const int *bt = block_tables + (size_t)s * max_blocks;

    float *q_sh = smem;                    /* [BQ][hp] */
    float *k_sh = q_sh + PF_BQ * hp;       /* [BK][hp] */
    float *v_sh = k_sh + PF_BK * hp;       /* [BK][head_dim] */
    float *o_sh = v_sh + PF_BK * head_dim; /* [BQ][head_dim] */
    float *p_sh = o_sh + PF_BQ * head_dim; /* [BQ][BK] */
    float *m_sh = p_sh + PF_BQ * PF_BK;
    float *l_sh = m_sh + PF_BQ;
    float *a_sh = l_sh + PF_BQ;

    for (int i = tid; i < PF_BQ * head_dim; i += PF_THREADS) {
        int r = i / head_dim, d = i % head_dim;
        q_sh[r * hp + d] =
            r < nq ? q[((size_t)(q0 + tile * PF_BQ + r) * n_heads + h) * head_dim + d] * scale
                   : 0.0f;
        o_sh[i] = 0.0f;
    }
    if (tid < PF_BQ) {
        m_sh[tid] = -INFINITY;
        l_sh[tid] = 0.0f;
    }

    for (int k0 = 0; k0 < kv_end; k0 += PF_BK) {
        __syncthreads(); /* the previous tile's K, V and P are consumed */
        for (int i = tid; i < PF_BK * head_dim; i += PF_THREADS) {
            int j = i / head_dim, d = i % head_dim, p = k0 + j;
            int b = p < kv_end ? block_of(bt, p, block_size, num_blocks) : -1;
            float kk = 0.0f, vv = 0.0f;
            if (b >= 0) {
                size_t a = kv_row(layer, num_blocks, n_kv_heads, block_size, head_dim, b, kvh,
                                  p % block_size) +
                           d;
                kk = kc[a];
                vv = vc[a];
            }
            k_sh[j * hp + d] = kk;
            v_sh[j * head_dim + d] = vv;
        }
        __syncthreads();
        /* S = Q K^T (scale already in Q), masked. */
        for (int i = tid; i < PF_BQ * PF_BK; i += PF_THREADS) {
            int r = i / PF_BK, j = i % PF_BK, p = k0 + j;
            float sc = -INFINITY;
            if (r < nq && p < kv_end && p <= pos0 + r &&
                block_of(bt, p, block_size, num_blocks) >= 0) {
                sc = 0.0f;
                for (int d = 0; d < head_dim; d++)
                    sc += q_sh[r * hp + d] * k_sh[j * hp + d];
            }
            p_sh[i] = sc;
        }
        __syncthreads();
        if (tid < PF_BQ) {
            float m_old = m_sh[tid], mx = m_old;
            for (int j = 0; j < PF_BK; j++)
                mx = fmaxf(mx, p_sh[tid * PF_BK + j]);
            float sum = 0.0f;
            for (int j = 0; j < PF_BK; j++) {
                float e = mx == -INFINITY ? 0.0f : __expf(p_sh[tid * PF_BK + j] - mx);
                p_sh[tid * PF_BK + j] = e;
                sum += e;
            }
            float alpha = m_old == -INFINITY ? 0.0f : __expf(m_old - mx);
            a_sh[tid] = alpha;
            l_sh[tid] = l_sh[tid] * alpha + sum;
            m_sh[tid] = mx;
        }
        __syncthreads();
        for (int i = tid; i < PF_BQ * head_dim; i += PF_THREADS) {
            int r = i / head_dim, d = i % head_dim;
            float o = o_sh[i] * a_sh[r];
            for (int j = 0; j < PF_BK; j++)
                o += p_sh[r * PF_BK + j] * v_sh[j * head_dim + d];
            o_sh[i] = o;
        }
    }
    __syncthreads();
    for (int i = tid; i < nq * head_dim; i += PF_THREADS) {
        int r = i / head_dim, d = i % head_dim;
        float l = l_sh[r];
        out[((size_t)(q0 + tile * PF_BQ + r) * n_heads + h) * head_dim + d] =
            l > 0.0f ? o_sh[i] / l : 0.0f;
    }
}

/* ======================================================================== */
/* Launch                                                                   */
/* ======================================================================== */

int ig__cuda_attention_setup(ig__cuda_t *c)
{
    size_t need = prefill_smem(MAX_HEAD_DIM);
    if (need > 48 * 1024 && need <= c->max_smem_optin)
        return IG_CUDA_CHECK(cudaFuncSetAttribute(
            prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need));
    return 0;
}

int ig__cuda_attention(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                       int layer, const ig_attn_batch_t *batch, int n_heads, float scale)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc, hd = kv->head_dim, nkv = kv->n_kv_heads;
    if (batch->nseq <= 0 || batch->ntok <= 0)
        return batch->nseq < 0 || batch->ntok < 0 ? IG_EINVAL : 0;
    if (layer < 0 || layer >= kv->num_layers || nkv <= 0 || n_heads % nkv != 0 || hd % 4 != 0 ||
        hd > MAX_HEAD_DIM || batch->nseq > 65535 || n_heads > 65535)
        return hd > MAX_HEAD_DIM || hd % 4 != 0 ? IG_ENOTSUP : IG_EINVAL;
    /* The decode kernel reads q and K rows as float4. */
    if (((uintptr_t)q & 15) != 0 || ((uintptr_t)kv->k & 15) != 0 || ((uintptr_t)kv->v & 15) != 0)
        return IG_EINVAL;
    if (kv->dtype != IG_DTYPE_F32) /* kv_dtypes: F32 only (ig_engine_create refuses others) */
        return IG_ENOTSUP;
    const float *kc = (const float *)kv->k, *vc = (const float *)kv->v;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    int max_ctx = batch->max_ctx > 0 ? batch->max_ctx : 1;

    /* Decode rows. Partitions of 64 positions, at most 32 of them. */
    int part_len = DEC_MIN_PART;
    while ((max_ctx + part_len - 1) / part_len > DEC_MAX_PARTS)
        part_len *= 2;
    int nparts = (max_ctx + part_len - 1) / part_len;
    int group = n_heads / nkv;
    int head_groups = (group + DEC_MAX_G - 1) / DEC_MAX_G;
    size_t rows = (size_t)batch->nseq * n_heads * nparts;
    if ((rc = ig__cuda_scratch(c, (void **)&c->attn_part, &c->attn_part_bytes,
                               rows * (hd + 2) * sizeof(float))) != 0)
        return rc;
    float *part_o = c->attn_part, *part_ml = c->attn_part + rows * hd;
    dim3 dgrid((unsigned)batch->nseq, (unsigned)(nkv * head_groups), (unsigned)nparts);
    decode_kernel<<<dgrid, DEC_THREADS, 0, c->stream>>>(
        part_o, part_ml, q, kc, vc, batch->q_start, batch->ctx_len, batch->block_tables,
        batch->max_blocks, layer, kv->num_blocks, kv->block_size, nkv, hd, n_heads, head_groups,
        part_len, nparts, scale);
    if ((rc = ig__cuda_launched(c, "attention (decode)")) != 0)
        return rc;
    dim3 cgrid((unsigned)batch->nseq, (unsigned)n_heads);
    decode_combine_kernel<<<cgrid, 128, 0, c->stream>>>(out, part_o, part_ml, batch->q_start,
                                                        n_heads, hd, nparts);
    if ((rc = ig__cuda_launched(c, "attention (decode combine)")) != 0)
        return rc;

    /* Prefill rows. */
    if (batch->max_q > 1) {
        size_t smem = prefill_smem(hd);
        if (smem > 48 * 1024 && smem > c->max_smem_optin)
            return IG_ENOTSUP;
        unsigned tiles = (unsigned)((batch->max_q + PF_BQ - 1) / PF_BQ);
        dim3 pgrid((unsigned)batch->nseq, (unsigned)n_heads, tiles);
        prefill_kernel<<<pgrid, PF_THREADS, smem, c->stream>>>(
            out, q, kc, vc, batch->q_start, batch->ctx_len, batch->block_tables,
            batch->max_blocks, layer, kv->num_blocks, kv->block_size, nkv, hd, n_heads, scale);
        if ((rc = ig__cuda_launched(c, "attention (prefill)")) != 0)
            return rc;
    }
    return 0;
}
