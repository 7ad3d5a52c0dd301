/*
 * Elementwise and row kernels of the CUDA backend: embedding gather,
 * RMSNorm, RoPE, SwiGLU, residual add, paged-KV append (alone or with RoPE
 * in one launch), dtype conversion and bias add; the decode GEMV is in
 * cuda_gemv.cu. Each launcher checks its arguments,
 * queues one kernel on the backend's stream and maps launch errors through
 * IG_CUDA_CHECK.
 */
#include "cuda_internal.h"
#include "cuda_warp.h"

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
/* The pair (i, i + half) of src rotated by p * inv_freq[i] into dst (which
 * may be src). */
__device__ __forceinline__ void rope_pair(const float *src, float *dst, int i, int half, double p,
                                          const float *inv_freq)
{
    double sd, cd;
    sincos(p * (double)inv_freq[i], &sd, &cd);
    float s = (float)sd, co = (float)cd;
    float x1 = src[i], x2 = src[i + half];
    dst[i] = x1 * co - x2 * s;
    dst[i + half] = x2 * co + x1 * s;
}

__global__ void rope_kernel(float *q, float *k, const int *pos, int n_heads, int n_kv_heads,
                            int head_dim, const float *inv_freq)
{
    int t = blockIdx.x, h = blockIdx.y, half = head_dim / 2;
    float *x = h < n_heads ? q + ((size_t)t * n_heads + h) * head_dim
                           : k + ((size_t)t * n_kv_heads + (h - n_heads)) * head_dim;
    double p = (double)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        rope_pair(x, x, i, half, p, inv_freq);
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

/* Whether the cache layout holds layer and can be addressed: 0, IG_EINVAL,
 * or IG_ENOTSUP for a KV dtype other than F32 (ig_engine_create refuses
 * others). */
static int kv_layer_check(const ig_kv_layout_t *kv, int layer)
{
    if (layer < 0 || layer >= kv->num_layers || kv->block_size <= 0 ||
        (int64_t)kv->num_blocks * kv->block_size > INT32_MAX)
        return IG_EINVAL;
    return kv->dtype != IG_DTYPE_F32 ? IG_ENOTSUP : 0;
}

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
    if (kv->head_dim <= 0)
        return IG_EINVAL;
    if ((rc = kv_layer_check(kv, layer)) != 0)
        return rc;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    kv_append_kernel<<<ntok, 128, 0, c->stream>>>((float *)kv->k, (float *)kv->v, k, v, slots,
                                                  layer, kv->num_blocks, kv->block_size,
                                                  kv->n_kv_heads, kv->head_dim);
    return ig__cuda_launched(c, "kv_append");
}

/* ---- RoPE with the KV append (decode) ------------------------------------- */

/* Block (token, head) over q's heads then k's, as rope_kernel: a q head is
 * rotated in place; a k head is rotated into its slot of the cache, and the
 * same head of v copied beside it (the k buffer itself is left as it was).
 * The same arithmetic as rope_kernel, so the cache holds what rope then
 * kv_append would have written. A negative slot is padding: q is still
 * rotated, nothing is written to the cache. */
__global__ void rope_kv_kernel(float *q, const float *k, const float *v, float *kc, float *vc,
                               const int *pos, const int *slots, int layer, int num_blocks,
                               int block_size, int n_heads, int n_kv_heads, int head_dim,
                               const float *inv_freq)
{
    int t = blockIdx.x, h = blockIdx.y, half = head_dim / 2;
    float *dst = NULL, *vdst = NULL;
    const float *src, *vsrc = NULL;
    if (h < n_heads) {
        dst = q + ((size_t)t * n_heads + h) * head_dim;
        src = dst;
    } else {
        int kvh = h - n_heads, slot = slots[t];
        if (slot < 0 || slot >= num_blocks * block_size)
            return;
        size_t row =
            ((((size_t)layer * num_blocks + slot / block_size) * n_kv_heads + kvh) * block_size +
             slot % block_size) *
            head_dim;
        src = k + ((size_t)t * n_kv_heads + kvh) * head_dim;
        vsrc = v + ((size_t)t * n_kv_heads + kvh) * head_dim;
        dst = kc + row;
        vdst = vc + row;
    }
    double p = (double)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        rope_pair(src, dst, i, half, p, inv_freq);
        if (vdst) {
            vdst[i] = vsrc[i];
            vdst[i + half] = vsrc[i + half];
        }
    }
}

int ig__cuda_rope_kv_append(ig_backend_t *be, float *q, const float *k, const float *v,
                            const ig_kv_layout_t *kv, int layer, const int *pos, const int *slots,
                            int ntok, int n_heads, const float *inv_freq)
{
    ig__cuda_t *c = ig__cuda(be);
    int rc, nkv = kv->n_kv_heads, hd = kv->head_dim;
    if (ntok <= 0)
        return ntok == 0 ? 0 : IG_EINVAL;
    if (n_heads <= 0 || nkv <= 0 || hd <= 0 || hd % 2 || n_heads + nkv > 65535)
        return IG_EINVAL;
    if ((rc = kv_layer_check(kv, layer)) != 0)
        return rc;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    dim3 grid((unsigned)ntok, (unsigned)(n_heads + nkv));
    int threads = hd / 2 < 128 ? ((hd / 2 + 31) / 32) * 32 : 128;
    rope_kv_kernel<<<grid, threads, 0, c->stream>>>(q, k, v, (float *)kv->k, (float *)kv->v, pos,
                                                    slots, layer, kv->num_blocks, kv->block_size,
                                                    n_heads, nkv, hd, inv_freq);
    return ig__cuda_launched(c, "rope + kv_append");
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
