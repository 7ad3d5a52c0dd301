/*
 * The decode GEMV of the CUDA backend: y(m, n) = x(m, k) W(n, k)^T for a
 * decode-sized m (at most IG_GEMV_MAX_M rows), the bandwidth-bound case in
 * which every weight is read once per step and nothing else matters. One
 * kernel, templated on the weight dtype (BF16 or F16, the 16-bit types the
 * backend keeps matrices in) and on a row count, serves the plain matmul
 * and the fused decode operations of the backend table:
 *   - up to three weight matrices of one input in one launch (q, k and v:
 *     their rows are one row space), or two read side by side (gate, up);
 *   - an RMSNorm prologue: each block computes the norms of x's rows itself
 *     (x is a few KiB and in L2), so no normalised copy is written;
 *   - epilogues: store (+ bias), add into y (the residual after o_proj and
 *     down_proj), SwiGLU (silu(gate) * up).
 *
 * Each lane keeps GEMV_UNROLL 16-byte weight loads in flight; a row is
 * split across 1 to 8 warps of a block when there are too few rows to fill
 * the device (k/v projections, down_proj), the warps' sums meeting in shared
 * memory. The split depends on n, k and the device only, never on m, so a
 * row's result is the same alone and in any batch of up to IG_GEMV_MAX_M.
 *
 * x is rounded to the weights' dtype before the multiply (F16 with a power
 * of two range scale, cuda_warp.h), as the cuBLAS path feeds it, so both
 * paths multiply the same values exactly and differ only in the order of
 * the F32 sums.
 */
#include "cuda_internal.h"
#include "cuda_warp.h"

#include <stdint.h>
#include <string.h>

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_UNROLL 8 /* 16-byte weight loads in flight per lane */

/* The kernel's arguments, by value. */
struct gemv_args {
    const float *x;    /* (m, k) */
    const float *norm; /* (k) RMSNorm weight, or NULL: x as is */
    float eps;
    const void *w[3];     /* (n[i], k); SwiGLU: w[0] gate, w[1] up */
    const float *bias[3]; /* (n[i]) or NULL */
    float *y[3];          /* (m, n[i]) */
    int n[3];
    int nw;
    int rows; /* output rows of the launch: the n[i] summed (n[0] for SwiGLU) */
    int k;
    int add;    /* y += instead of y = */
    int splits; /* warps per output row */
};

template <ig_dtype_t DT> __device__ __forceinline__ void unpack8(uint4 u, float f[8])
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (DT == IG_DTYPE_BF16) {
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

template <ig_dtype_t DT> __device__ __forceinline__ float round_as(float v)
{
    return DT == IG_DTYPE_BF16 ? __bfloat162float(__float2bfloat16_rn(v))
                               : __half2float(__float2half_rn(v));
}

/* Sums (or maxima, MAX) over the block of v[r] for the first m of M rows,
 * which every thread gets. Through shared memory: one value a thread, then
 * warp r folds row r; two block barriers whatever M (warp shuffles per row
 * would cost 5 M). red and out are shared, used by this reduction only;
 * m <= M <= GEMV_WARPS. */
template <int M, bool MAX>
__device__ __forceinline__ void block_reduce_rows(float v[M], int m, float (*red)[GEMV_THREADS],
                                                  float *out)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int r = 0; r < M; r++)
        if (r < m)
            red[r][tid] = v[r];
    __syncthreads();
    if (warp < m) {
        float t = red[warp][lane];
        for (int i = 1; i < GEMV_WARPS; i++) {
            float o = red[warp][lane + 32 * i];
            t = MAX ? fmaxf(t, o) : t + o;
        }
        t = MAX ? warp_max(t) : warp_sum(t);
        if (lane == 0)
            out[warp] = t;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < M; r++)
        v[r] = r < m ? out[r] : 0.0f;
}

/*
 * Block b, warp w: output row b * (GEMV_WARPS / splits) + w / splits, share
 * w % splits of its k. M is the most rows of x the kernel takes; the first
 * m are live. GLU: a row is two dot products, gate and up, read side by
 * side, and the output silu(gate) * up.
 */
template <ig_dtype_t DT, int M, bool GLU>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_kernel(gemv_args a, int m)
{
    __shared__ float red[M][GEMV_THREADS];
    __shared__ float inv_sh[M], max_sh[M];
    /* The final sums: a warp's lanes' partial dot products (padded rows). */
    __shared__ float part[GEMV_WARPS][GLU ? 2 * M : M][33];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, k = a.k;

    /* Prologue: 1 / rms of each row of x, and the F16 range scale of what
     * is multiplied (the normalised row). */
    float inv[M], sc[M];
#pragma unroll
    for (int r = 0; r < M; r++) {
        inv[r] = 1.0f;
        sc[r] = 1.0f;
    }
    if (a.norm) {
        float ss[M];
#pragma unroll
        for (int r = 0; r < M; r++) {
            ss[r] = 0.0f;
            if (r < m)
                for (int i = tid; i < k; i += GEMV_THREADS) {
                    float v = a.x[(size_t)r * k + i];
                    ss[r] += v * v;
                }
        }
        block_reduce_rows<M, false>(ss, m, red, inv_sh);
#pragma unroll
        for (int r = 0; r < M; r++)
            inv[r] = rsqrtf(ss[r] / (float)k + a.eps);
    }
    if (DT == IG_DTYPE_F16) {
        float mx[M];
#pragma unroll
        for (int r = 0; r < M; r++) {
            mx[r] = 0.0f;
            if (r < m)
                for (int i = tid; i < k; i += GEMV_THREADS) {
                    float v = a.x[(size_t)r * k + i];
                    if (a.norm)
                        v = v * inv[r] * a.norm[i];
                    mx[r] = fmaxf(mx[r], fabsf(v));
                }
        }
        block_reduce_rows<M, true>(mx, m, red, max_sh);
#pragma unroll
        for (int r = 0; r < M; r++)
            sc[r] = f16_scale(mx[r]);
    }

    /* The warp's row and which matrix it is in. */
    const int splits = a.splits;
    const int row = blockIdx.x * (GEMV_WARPS / splits) + warp / splits, share = warp % splits;
    const bool live = row < a.rows;
    int mat = 0, j = row;
    if (!GLU)
        while (mat < a.nw - 1 && j >= a.n[mat]) {
            j -= a.n[mat];
            mat++;
        }
    float acc[M], acc2[M];
#pragma unroll
    for (int r = 0; r < M; r++) {
        acc[r] = 0.0f;
        acc2[r] = 0.0f;
    }
    if (live) {
        const int k8 = k / 8, step = 32 * splits;
        const uint4 *wg = (const uint4 *)((const unsigned char *)a.w[mat] + (size_t)j * k * 2);
        const uint4 *wu =
            GLU ? (const uint4 *)((const unsigned char *)a.w[1] + (size_t)j * k * 2) : NULL;
        for (int base = lane + 32 * share; base < k8; base += step * GEMV_UNROLL) {
            /* All of this round's loads first, then the arithmetic. */
            uint4 lg[GEMV_UNROLL], lu[GEMV_UNROLL];
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int i = base + u * step;
                uint4 zero = {0u, 0u, 0u, 0u};
                lg[u] = i < k8 ? __ldg(wg + i) : zero;
                if (GLU)
                    lu[u] = i < k8 ? __ldg(wu + i) : zero;
            }
#pragma unroll
            for (int u = 0; u < GEMV_UNROLL; u++) {
                int i = base + u * step;
                if (i >= k8)
                    break;
                float fg[8], fu[8];
                unpack8<DT>(lg[u], fg);
                if (GLU)
                    unpack8<DT>(lu[u], fu);
#pragma unroll
                for (int r = 0; r < M; r++) {
                    if (r >= m)
                        break;
                    const float4 *xr = (const float4 *)(a.x + (size_t)r * k) + 2 * i;
                    float4 p = xr[0], q = xr[1];
                    float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
                    if (a.norm) {
                        const float4 *nr = (const float4 *)a.norm + 2 * i;
                        float4 n0 = nr[0], n1 = nr[1];
                        float nv[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            xv[e] = xv[e] * inv[r] * nv[e];
                    }
                    float sg = 0.0f, su = 0.0f;
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        float xe = round_as<DT>(xv[e] * sc[r]);
                        sg += fg[e] * xe;
                        if (GLU)
                            su += fu[e] * xe;
                    }
                    acc[r] += sg;
                    if (GLU)
                        acc2[r] += su;
                }
            }
        }
    }

    /* The row's sums: every lane of its warps leaves its partial sums in
     * shared memory, then lane r of the row's first warp adds up row r of
     * x (one barrier; the same order whatever m). */
    if (live)
#pragma unroll
        for (int r = 0; r < M; r++) {
            if (r >= m)
                break;
            part[warp][r][lane] = acc[r];
            if (GLU)
                part[warp][M + r][lane] = acc2[r];
        }
    __syncthreads();
    if (!live || share != 0 || lane >= m)
        return;
    const int r = lane;
    float dot = 0.0f, dot2 = 0.0f;
    for (int s = 0; s < splits; s++)
        for (int l = 0; l < 32; l++) {
            dot += part[warp + s][r][l];
            if (GLU)
                dot2 += part[warp + s][M + r][l];
        }
    float v = dot / sc[r];
    if (GLU) {
        float up = dot2 / sc[r];
        a.y[0][(size_t)r * a.n[0] + j] = v / (1.0f + expf(-v)) * up;
        return;
    }
    if (a.bias[mat])
        v += a.bias[mat][j];
    float *yp = a.y[mat] + (size_t)r * a.n[mat] + j;
    if (a.add)
        *yp += v;
    else
        *yp = v;
}

template <ig_dtype_t DT, bool GLU>
static void gemv_launch(const gemv_args &a, int m, unsigned grid, cudaStream_t st)
{
    if (m <= 1)
        gemv_kernel<DT, 1, GLU><<<grid, GEMV_THREADS, 0, st>>>(a, m);
    else if (m <= 2)
        gemv_kernel<DT, 2, GLU><<<grid, GEMV_THREADS, 0, st>>>(a, m);
    else if (m <= 4)
        gemv_kernel<DT, 4, GLU><<<grid, GEMV_THREADS, 0, st>>>(a, m);
    else
        gemv_kernel<DT, 8, GLU><<<grid, GEMV_THREADS, 0, st>>>(a, m);
}

static int aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

int ig__cuda_gemv(ig__cuda_t *c, const ig__gemv_t *g, int m)
{
    gemv_args a;
    memset(&a, 0, sizeof(a));
    int nw = g->op == IG__GEMV_SWIGLU ? 2 : g->nw;
    if (m <= 0 || m > IG_GEMV_MAX_M || nw < 1 || nw > 3 || g->k <= 0 || g->k % 8 != 0 ||
        !aligned16(g->x) || (g->norm && !aligned16(g->norm)))
        return IG_ENOTSUP;
    ig_dtype_t dt = g->w[0]->dtype;
    long long rows = 0;
    for (int i = 0; i < nw; i++) {
        const ig_weight_t *w = g->w[i];
        if (w->dtype != dt || (dt != IG_DTYPE_BF16 && dt != IG_DTYPE_F16) || w->cols != g->k ||
            w->rows <= 0 || w->rows > INT32_MAX || !aligned16(w->data))
            return IG_ENOTSUP;
        a.w[i] = w->data;
        a.n[i] = (int)w->rows;
        a.bias[i] = g->bias[i];
        a.y[i] = g->y[i];
        rows += w->rows;
    }
    if (g->op == IG__GEMV_SWIGLU) {
        if (g->w[1]->rows != g->w[0]->rows)
            return IG_ENOTSUP;
        rows = g->w[0]->rows;
    }
    if (rows > INT32_MAX)
        return IG_ENOTSUP;
    a.x = g->x;
    a.norm = g->norm;
    a.eps = g->eps;
    a.nw = nw;
    a.rows = (int)rows;
    a.k = g->k;
    a.add = g->op == IG__GEMV_ADD;
    /* Split rows across warps until the launch has about 16 warps per SM,
     * while each share still gets two rounds of loads. */
    int splits = 1, k8 = g->k / 8;
    while (splits < GEMV_WARPS && rows * splits < 16LL * c->num_sms &&
           k8 >= 2 * 32 * GEMV_UNROLL * splits)
        splits *= 2;
    a.splits = splits;
    int per_block = GEMV_WARPS / splits;
    long long grid = (rows + per_block - 1) / per_block;
    if (grid > INT32_MAX)
        return IG_ENOTSUP;
    bool glu = g->op == IG__GEMV_SWIGLU;
    if (dt == IG_DTYPE_BF16) {
        if (glu)
            gemv_launch<IG_DTYPE_BF16, true>(a, m, (unsigned)grid, c->stream);
        else
            gemv_launch<IG_DTYPE_BF16, false>(a, m, (unsigned)grid, c->stream);
    } else {
        if (glu)
            gemv_launch<IG_DTYPE_F16, true>(a, m, (unsigned)grid, c->stream);
        else
            gemv_launch<IG_DTYPE_F16, false>(a, m, (unsigned)grid, c->stream);
    }
    static const char *names[2][3] = {
        {"matmul (gemv)", "matmul + add (gemv)", "gate/up + swiglu (gemv)"},
        {"rmsnorm + matmul (gemv)", "rmsnorm + matmul + add (gemv)",
         "rmsnorm + gate/up + swiglu (gemv)"}};
    return ig__cuda_launched(c, names[g->norm != NULL][g->op]);
}
