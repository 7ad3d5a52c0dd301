/*
 * Device-side sampling (cuda_sampling.h). One block per logits row.
 *
 * Top-k and top-p need a threshold, not a sort: logits map to unsigned keys
 * that order like the floats, and a bit-by-bit search over the key (32
 * counting passes over the row, which stays in L2) finds the k-th largest
 * key exactly, then the largest key whose tail mass still reaches top_p.
 * A radix select with 8-bit histograms (4 passes) is the faster follow-up.
 */
#include "cuda_internal.h"
#include "cuda_sampling.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define SAMPLE_THREADS 512

/* A key that orders like the float: larger float, larger key. */
__device__ __forceinline__ uint32_t float_key(float f)
{
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename T> __device__ T block_reduce_sum(T v, T *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    T s = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++)
        s += sh[i];
    return s;
}

/* (value, index) of the largest value, lowest index on ties; all threads get it. */
__device__ void block_argmax(float v, int idx, float *best_v, int *best_i)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx)) {
            v = ov;
            idx = oi;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    float bv = sv[0];
    int bi = si[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) {
        if (sv[i] > bv || (sv[i] == bv && si[i] < bi)) {
            bv = sv[i];
            bi = si[i];
        }
    }
    *best_v = bv;
    *best_i = bi;
}

__device__ int row_argmax(const float *x, int vocab)
{
    float v = -INFINITY;
    int idx = vocab; /* beyond any real index: loses every tie */
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float f = x[i];
        if (f > v || (f == v && i < idx)) {
            v = f;
            idx = i;
        }
    }
    float bv;
    int bi;
    block_argmax(v, idx, &bv, &bi);
    return bi < vocab ? bi : 0; /* an all-NaN row still yields a valid id */
}

__global__ void argmax_kernel(int *tokens, const float *logits, int vocab)
{
    int t = row_argmax(logits + (size_t)blockIdx.x * vocab, vocab);
    if (threadIdx.x == 0)
        tokens[blockIdx.x] = t;
}

/* Probability mass (unnormalised) of the tokens whose key is >= thr. */
__device__ float tail_mass(const float *x, int vocab, uint32_t thr, float mx, float inv_t,
                           float *sh)
{
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float f = x[i];
        if (float_key(f) >= thr)
            s += __expf((f - mx) * inv_t);
    }
    return block_reduce_sum(s, sh);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(int *tokens, const float *logits, int vocab,
                  const ig_cuda_sample_params_t *params)
{
    __shared__ float fsh[32];
    __shared__ unsigned csh[32];
    __shared__ float chunk_sum[SAMPLE_THREADS];
    __shared__ int picked;
    const float *x = logits + (size_t)blockIdx.x * vocab;
    ig_cuda_sample_params_t p = params[blockIdx.x];

    int top = row_argmax(x, vocab);
    if (!(p.temperature > 0.0f)) {
        if (threadIdx.x == 0)
            tokens[blockIdx.x] = top;
        return;
    }
    float mx = x[top], inv_t = 1.0f / p.temperature;

    /* Top-k: the largest key with at least k tokens at or above it. */
    uint32_t kth = 0;
    if (p.top_k > 0 && p.top_k < vocab) {
        for (int bit = 31; bit >= 0; bit--) {
            uint32_t cand = kth | (1u << bit);
            unsigned n = 0;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x)
                n += float_key(x[i]) >= cand;
            if (block_reduce_sum(n, csh) >= (unsigned)p.top_k)
                kth = cand;
        }
    }
    float total = tail_mass(x, vocab, kth, mx, inv_t, fsh);

    /* Top-p: the largest key (at or above kth) whose tail mass reaches p. */
    uint32_t thr = kth;
    if (p.top_p < 1.0f) {
        float want = p.top_p * total;
        uint32_t t = 0;
        for (int bit = 31; bit >= 0; bit--) {
            uint32_t cand = t | (1u << bit);
            uint32_t c = cand > kth ? cand : kth;
            if (tail_mass(x, vocab, c, mx, inv_t, fsh) >= want)
                t = cand;
        }
        thr = t > kth ? t : kth;
        total = tail_mass(x, vocab, thr, mx, inv_t, fsh);
    }

    /* The draw: contiguous chunks per thread, a scan over chunk sums, and
     * the thread whose range holds the target walks its chunk. */
    int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    int lo = threadIdx.x * chunk, hi = min(vocab, lo + chunk);
    float s = 0.0f;
    for (int i = lo; i < hi; i++)
        if (float_key(x[i]) >= thr)
            s += __expf((x[i] - mx) * inv_t);
    chunk_sum[threadIdx.x] = s;
    if (threadIdx.x == 0)
        picked = -1;
    __syncthreads();
    if (threadIdx.x == 0) {
        float run = 0.0f;
        for (int i = 0; i < (int)blockDim.x; i++) {
            float v = chunk_sum[i];
            chunk_sum[i] = run;
            run += v;
        }
    }
    __syncthreads();
    float target = p.u * total, acc = chunk_sum[threadIdx.x];
    if (target >= acc && target < acc + s) {
        int last = -1;
        for (int i = lo; i < hi; i++) {
            if (float_key(x[i]) < thr)
                continue;
            last = i;
            acc += __expf((x[i] - mx) * inv_t);
            if (acc > target)
                break;
        }
        if (last >= 0)
            atomicCAS(&picked, -1, last);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        tokens[blockIdx.x] = picked >= 0 ? picked : top; /* rounding at the very end */
}

static int is_cuda(ig_backend_t *be)
{
    return be && be->name && strncmp(be->name, "cuda:", 5) == 0 && be->impl;
}

extern "C" int ig_cuda_argmax(ig_backend_t *be, int *tokens, const float *logits, int rows,
                              int vocab)
{
    if (!is_cuda(be) || rows < 0 || vocab <= 0)
        return IG_EINVAL;
    if (rows == 0)
        return 0;
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    if ((rc = ig__cuda_scratch(c, &c->sample_buf, &c->sample_bytes, (size_t)rows * 4)) != 0)
        return rc;
    int *dev_tokens = (int *)c->sample_buf;
    argmax_kernel<<<rows, SAMPLE_THREADS, 0, c->stream>>>(dev_tokens, logits, vocab);
    if ((rc = ig__cuda_launched(c, "argmax")) != 0)
        return rc;
    return be->download(be, tokens, dev_tokens, (size_t)rows * sizeof(int));
}

extern "C" int ig_cuda_sample(ig_backend_t *be, int *tokens, const float *logits, int rows,
                              int vocab, const ig_cuda_sample_params_t *params)
{
    if (!is_cuda(be) || rows < 0 || vocab <= 0 || (rows > 0 && !params))
        return IG_EINVAL;
    if (rows == 0)
        return 0;
    ig__cuda_t *c = ig__cuda(be);
    int rc;
    size_t pbytes = (size_t)rows * sizeof(ig_cuda_sample_params_t);
    if ((rc = ig__cuda_enter(c)) != 0)
        return rc;
    if ((rc = ig__cuda_scratch(c, &c->sample_buf, &c->sample_bytes,
                               pbytes + (size_t)rows * sizeof(int))) != 0)
        return rc;
    ig_cuda_sample_params_t *dev_params = (ig_cuda_sample_params_t *)c->sample_buf;
    int *dev_tokens = (int *)((unsigned char *)c->sample_buf + pbytes);
    if ((rc = be->upload(be, dev_params, params, pbytes)) != 0)
        return rc;
    sample_kernel<<<rows, SAMPLE_THREADS, 0, c->stream>>>(dev_tokens, logits, vocab, dev_params);
    if ((rc = ig__cuda_launched(c, "sample")) != 0)
        return rc;
    return be->download(be, tokens, dev_tokens, (size_t)rows * sizeof(int));
}
