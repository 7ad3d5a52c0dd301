/*
 * Elementwise and row kernels of the CUDA backend: embedding gather,
 * RMSNorm, RoPE, SwiGLU, residual add, paged-KV append, dtype conversion,
 * bias add and the small-batch GEMV. Each launcher checks its arguments,
 * queues one kernel on the backend's stream and maps launch errors through
 * IG_CUDA_CHECK.
 */
#include "cuda_internal.h"

#include <stdint.h>

/* Grid-stride launches never need more blocks than this. */
#define IG_MAX_GRID 65535u

static unsigned blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b == 0)
        b = 1;
    return b > IG_MAX_GRID ? IG_MAX_GRID : (unsigned)b;
}

__device__ __forceinline__ float load_f32(const void *p, ig_dtype_t dtype, size_t i)
{
    switch (dtype) {
    case IG_DTYPE_BF16:
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case IG_DTYPE_F16:
        return __half2float(((const __half *)p)[i]);
    default:
        return ((const float *)p)[i];
    }
}

/* ---- embedding ------------------------------------------------------------ */

/* One block per token: out(ntok, dim) = table[tokens[t]]. A token id out of
 * range gives a zero row (the engine validates ids; this keeps a bad one from
 * reading outside the table). */
__global__ void embed_kernel(float *out, const void *table, ig_dtype_t dtype, const int *tokens,
                             int vocab, int dim)
{
    int t = blockIdx.x;
    int id = tokens[t];
    float *o = out + (size_t)t * dim;
    if (id < 0 || id >= vocab) {
        for (int d = threadIdx.x; d < dim; d += blockDim.x)
            o[d] = 0.0f;
        return;
    }
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
        o[d] = load_f32(table, dtype, (size_t)id * dim + d);
}

int ig__cuda_embed(ig_backend_t *be, float *out, const ig_weight_t *table, const int *tokens,
                   int ntok)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if (ntok <= 0)
        return ntok == 0 ? 0 : IG_EINVAL;
    if (table->cols > INT32_MAX || table->rows > INT32_MAX)
        return IG_ERANGE;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    embed_kernel<<<ntok, 256, 0, c->stream>>>(out, table->data, table->dtype, tokens,
                                              (int)table->rows, (int)table->cols);
    return ig__cuda_launched(c, "embed");
}

/* ---- row gather --------------------------------------------------------- */

/* One block per picked row: out(n, cols) = x[rows[i]]. */
__global__ void gather_kernel(float *out, const float *x, const int *rows, int cols)
{
    const float *src = x + (size_t)rows[blockIdx.x] * cols;
    float *dst = out + (size_t)blockIdx.x * cols;
    for (int d = threadIdx.x; d < cols; d += blockDim.x)
        dst[d] = src[d];
}

int ig__cuda_gather(ig_backend_t *be, float *out, const float *x, const int *rows, int n, int cols)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if (n <= 0 || cols <= 0)
        return n < 0 || cols < 0 ? IG_EINVAL : 0;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    gather_kernel<<<n, 256, 0, c->stream>>>(out, x, rows, cols);
    return ig__cuda_launched(c, "gather");
}

/* ---- block reduction ------------------------------------------------------ */

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every
 * thread gets the result. */
__device__ float block_sum(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0)
            total = s;
    }
    __syncthreads();
    return total;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Max over the block, as block_sum. */
__device__ float block_max(float v)
{
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0f;
        s = warp_max(s);
        if (lane == 0)
            total = s;
    }
    __syncthreads();
    return total;
}

/* F16 activations: a row whose largest |x| would not fit F16 (65504) is
 * scaled by a power of two first (exact), so that its largest value stays
 * below 2^15, and the products are scaled back after the sum (exact again).
 * A row that fits keeps scale 1: rounding x to F16 is then what it always
 * was. The CPU keeps activations in F32; this keeps their range. */
__device__ __forceinline__ float f16_scale(float maxabs)
{
    if (!(maxabs >= 32768.0f) || isinf(maxabs))
        return 1.0f;
    int e;
    frexpf(maxabs, &e); /* maxabs < 2^e */
    return ldexpf(1.0f, 15 - e);
}

/* ---- RMSNorm -------------------------------------------------------------- */

/* One block per row; out may alias x (each element is read before it is
 * written, by the same thread). */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *or_ = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
        ss += xr[d] * xr[d];
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int d = threadIdx.x; d < dim; d += blockDim.x)
        or_[d] = xr[d] * inv * w[d];
}

int ig__cuda_rmsnorm(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                     float eps)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if (m <= 0)
        return m == 0 ? 0 : IG_EINVAL;
    if (w->dtype != IG_DTYPE_F32 || w->cols != 1 || w->rows > INT32_MAX)
        return IG_EINVAL;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    rmsnorm_kernel<<<m, 256, 0, c->stream>>>(out, x, (const float *)w->data, (int)w->rows, eps);
    return ig__cuda_launched(c, "rmsnorm");
}

/* ---- RoPE ----------------------------------------------------------------- */

/* Block (token, head) over q's heads then k's; thread i rotates the pair
 * (i, i + half) by pos * inv_freq[i] (rotate-half, the HF/NeoX layout).
 * The angle is taken in double, as on the CPU (kernels/cpu): near position
 * 1e5 a float product is off by up to 4e-3 rad. cos and sin of it are
 * rounded to float, then the rotation runs in float, as on the CPU. */
__global__ void rope_kernel(float *q, float *k, const int *pos, int n_heads, int n_kv_heads,
                            int head_dim, const float *inv_freq)
{
    int t = blockIdx.x, h = blockIdx.y, half = head_dim / 2;
    float *x = h < n_heads ? q + ((size_t)t * n_heads + h) * head_dim
                           : k + ((size_t)t * n_kv_heads + (h - n_heads)) * head_dim;
    double p = (double)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double sd, cd;
        sincos(p * (double)inv_freq[i], &sd, &cd);
        float s = (float)sd, co = (float)cd;
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * co - x2 * s;
        x[i + half] = x2 * co + x1 * s;
    }
}

int ig__cuda_rope(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int n_heads,
                  int n_kv_heads, int head_dim, const float *inv_freq)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if (ntok <= 0)
        return ntok == 0 ? 0 : IG_EINVAL;
    if (n_heads <= 0 || n_kv_heads < 0 || head_dim <= 0 || head_dim % 2 ||
        n_heads + n_kv_heads > 65535)
        return IG_EINVAL;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    dim3 grid((unsigned)ntok, (unsigned)(n_heads + n_kv_heads));
    int threads = head_dim / 2 < 128 ? ((head_dim / 2 + 31) / 32) * 32 : 128;
    rope_kernel<<<grid, threads, 0, c->stream>>>(q, k, pos, n_heads, n_kv_heads, head_dim,
                                                 inv_freq);
    return ig__cuda_launched(c, "rope");
}

/* ---- SwiGLU, add ------------------------------------------------------------ */

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

int ig__cuda_swiglu(ig_backend_t *be, float *out, const float *gate, const float *up, size_t n)
{
    ig__cuda_t *c;
    int rc = ig__cuda_begin(be, n, &c);
    if (rc <= 0)
        return rc;
    swiglu_kernel<<<blocks_for(n, 256), 256, 0, c->stream>>>(out, gate, up, n);
    return ig__cuda_launched(c, "swiglu");
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

int ig__cuda_add(ig_backend_t *be, float *y, const float *x, size_t n)
{
    ig__cuda_t *c;
    int rc = ig__cuda_begin(be, n, &c);
    if (rc <= 0)
        return rc;
    add_kernel<<<blocks_for(n, 256), 256, 0, c->stream>>>(y, x, n);
    return ig__cuda_launched(c, "add");
}

/* ---- paged KV append ---------------------------------------------------- */

/* Block per token; k, v (ntok, n_kv_heads, head_dim) go to slot
 * block * block_size + offset of the layer's cache (layer, block, kv_head,
 * block_size, head_dim). A negative slot is padding and is skipped. */
__global__ void kv_append_kernel(float *kc, float *vc, const float *k, const float *v,
                                 const int *slots, int layer, int num_blocks, int block_size,
                                 int n_kv_heads, int head_dim)
{
    int t = blockIdx.x;
    int slot = slots[t];
    if (slot < 0 || slot >= num_blocks * block_size)
        return;
    int blk = slot / block_size, off = slot % block_size;
    int row = n_kv_heads * head_dim;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        int h = i / head_dim, d = i % head_dim;
        size_t dst =
            ((((size_t)layer * num_blocks + blk) * n_kv_heads + h) * block_size + off) * head_dim +
            d;
        kc[dst] = k[(size_t)t * row + i];
        vc[dst] = v[(size_t)t * row + i];
    }
}

int ig__cuda_kv_append(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                       const float *v, const int *slots, int ntok)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if (ntok <= 0)
        return ntok == 0 ? 0 : IG_EINVAL;
    if (layer < 0 || layer >= kv->num_layers || kv->block_size <= 0 || kv->head_dim <= 0 ||
        (int64_t)kv->num_blocks * kv->block_size > INT32_MAX)
        return IG_EINVAL;
    if (kv->dtype != IG_DTYPE_F32) /* kv_dtypes: F32 only (ig_engine_create refuses others) */
        return IG_ENOTSUP;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    kv_append_kernel<<<ntok, 128, 0, c->stream>>>((float *)kv->k, (float *)kv->v, k, v, slots,
                                                  layer, kv->num_blocks, kv->block_size,
                                                  kv->n_kv_heads, kv->head_dim);
    return ig__cuda_launched(c, "kv_append");
}

/* ---- conversion and bias -------------------------------------------------- */

__global__ void to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void to_f16_kernel(__half *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2half_rn(src[i]);
}

int ig__cuda_convert(ig__cuda_t *c, void *dst, ig_dtype_t dtype, const float *src, size_t n)
{
    if (n == 0)
        return 0;
    if (dtype == IG_DTYPE_BF16)
        to_bf16_kernel<<<blocks_for(n, 256), 256, 0, c->stream>>>((__nv_bfloat16 *)dst, src, n);
    else if (dtype == IG_DTYPE_F16)
        to_f16_kernel<<<blocks_for(n, 256), 256, 0, c->stream>>>((__half *)dst, src, n);
    else
        return IG_EINVAL;
    return ig__cuda_launched(c, "matmul (convert)");
}

/* One block per row: dst(m, k) = F16(x * scale[r]) with scale[r] from the
 * row's largest |x| (f16_scale). */
__global__ void to_f16_rows_kernel(__half *dst, float *scale, const float *src, int k)
{
    const float *x = src + (size_t)blockIdx.x * k;
    __half *d = dst + (size_t)blockIdx.x * k;
    float mx = 0.0f;
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        mx = fmaxf(mx, fabsf(x[i]));
    float sc = f16_scale(block_max(mx));
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        d[i] = __float2half_rn(x[i] * sc);
    if (threadIdx.x == 0)
        scale[blockIdx.x] = sc;
}

int ig__cuda_convert_f16_rows(ig__cuda_t *c, void *dst, float *scale, const float *src, int m,
                              int k)
{
    if (m <= 0 || k <= 0)
        return 0;
    to_f16_rows_kernel<<<m, 256, 0, c->stream>>>((__half *)dst, scale, src, k);
    return ig__cuda_launched(c, "matmul (f16 activations)");
}

/* y(m, n) = y / scale[r] + bias (bias may be NULL). */
__global__ void unscale_bias_kernel(float *y, const float *scale, const float *bias, size_t total,
                                    int n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = y[i] / scale[i / n] + (bias ? bias[i % n] : 0.0f);
}

int ig__cuda_unscale_bias(ig__cuda_t *c, float *y, const float *scale, const float *bias, int m,
                          int n)
{
    size_t total = (size_t)m * n;
    unscale_bias_kernel<<<blocks_for(total, 256), 256, 0, c->stream>>>(y, scale, bias, total, n);
    return ig__cuda_launched(c, "matmul (f16 rescale)");
}

__global__ void add_bias_kernel(float *y, const float *bias, size_t total, int n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % n];
}

int ig__cuda_add_bias(ig__cuda_t *c, float *y, const float *bias, int m, int n)
{
    size_t total = (size_t)m * n;
    add_bias_kernel<<<blocks_for(total, 256), 256, 0, c->stream>>>(y, bias, total, n);
    return ig__cuda_launched(c, "matmul (bias)");
}

/* ---- small-batch GEMV ---------------------------------------------------- */

/* The most rows the GEMV path takes; beyond it x is re-read from cache once
 * per output row often enough that cuBLAS's tiled GEMM wins. */
#define IG_GEMV_MAX_M 4

__device__ __forceinline__ void unpack8(uint4 u, ig_dtype_t dtype, float f[8])
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (dtype == IG_DTYPE_BF16) {
            /* bf16 -> f32 is a shift; exact. */
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        } else {
            __half2_raw r;
            r.x = (unsigned short)(w[i] & 0xffffu);
            r.y = (unsigned short)(w[i] >> 16);
            float2 p = __half22float2(__half2(r));
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        }
    }
}

/* x rounded to the weights' dtype, as the cuBLAS path feeds it: both paths
 * then multiply the same values exactly in F32 and differ only in the order
 * of the sums, so a row's result hardly depends on how many rows share the
 * batch (greedy decoding is the same alone and batched). */
__device__ __forceinline__ float round_as(float v, ig_dtype_t dtype)
{
    return dtype == IG_DTYPE_BF16 ? __bfloat162float(__float2bfloat16_rn(v))
                                  : __half2float(__float2half_rn(v));
}

/* A warp per output feature: the lanes stream its weight row in 16-byte
 * pieces (8 elements), several loads in flight, and keep M dot products.
 * x is F32 and small enough to stay in L1/L2. */
template <int M>
__global__ void __launch_bounds__(256)
    gemv_kernel(float *y, const float *x, const void *w, ig_dtype_t dtype, const float *bias, int n,
                int k)
{
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= n)
        return;
    const uint4 *wr = (const uint4 *)((const unsigned char *)w + (size_t)row * k * 2);
    float acc[M], sc[M];
#pragma unroll
    for (int r = 0; r < M; r++) {
        acc[r] = 0.0f;
        sc[r] = 1.0f;
    }
    if (dtype == IG_DTYPE_F16) {
        /* The row scale of F16 activations, as to_f16_rows_kernel takes it. */
#pragma unroll
        for (int r = 0; r < M; r++) {
            float mx = 0.0f;
            for (int i = lane; i < k; i += 32)
                mx = fmaxf(mx, fabsf(x[(size_t)r * k + i]));
            sc[r] = f16_scale(warp_max(mx));
        }
    }
    int k8 = k / 8;
#pragma unroll 4
    for (int i = lane; i < k8; i += 32) {
        float wf[8];
        unpack8(__ldg(wr + i), dtype, wf);
#pragma unroll
        for (int r = 0; r < M; r++) {
            const float4 *xr = (const float4 *)(x + (size_t)r * k) + 2 * i;
            float4 a = xr[0], b = xr[1];
            float s = sc[r];
            acc[r] += wf[0] * round_as(a.x * s, dtype) + wf[1] * round_as(a.y * s, dtype) +
                      wf[2] * round_as(a.z * s, dtype) + wf[3] * round_as(a.w * s, dtype) +
                      wf[4] * round_as(b.x * s, dtype) + wf[5] * round_as(b.y * s, dtype) +
                      wf[6] * round_as(b.z * s, dtype) + wf[7] * round_as(b.w * s, dtype);
        }
    }
#pragma unroll
    for (int r = 0; r < M; r++) {
        float s = warp_sum(acc[r]);
        if (lane == 0)
            y[(size_t)r * n + row] = s / sc[r] + (bias ? bias[row] : 0.0f);
    }
}

int ig__cuda_gemv(ig__cuda_t *c, float *y, const float *x, const ig_weight_t *w, const float *bias,
                  int m)
{
    int n = (int)w->rows, k = (int)w->cols;
    if (m > IG_GEMV_MAX_M || k % 8 != 0 || ((uintptr_t)x & 15) != 0 ||
        ((uintptr_t)w->data & 15) != 0)
        return IG_ENOTSUP;
    unsigned grid = (unsigned)((n + 7) / 8);
    switch (m) {
    case 1:
        gemv_kernel<1><<<grid, 256, 0, c->stream>>>(y, x, w->data, w->dtype, bias, n, k);
        break;
    case 2:
        gemv_kernel<2><<<grid, 256, 0, c->stream>>>(y, x, w->data, w->dtype, bias, n, k);
        break;
    case 3:
        gemv_kernel<3><<<grid, 256, 0, c->stream>>>(y, x, w->data, w->dtype, bias, n, k);
        break;
    default:
        gemv_kernel<4><<<grid, 256, 0, c->stream>>>(y, x, w->data, w->dtype, bias, n, k);
        break;
    }
    return ig__cuda_launched(c, "matmul (gemv)");
}
