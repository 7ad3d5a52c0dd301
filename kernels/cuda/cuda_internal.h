/*
 * Internal to the CUDA backend (the .cu files of kernels/cuda/): the backend's state, the
 * one checking macro and the launchers each .cu file provides to the others.
 * C++ only; nothing outside kernels/cuda/ includes it.
 */
#ifndef INFERGATE_CUDA_INTERNAL_H
#define INFERGATE_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

extern "C" {
#include "infergate/error.h"
#include "infergate/kernels.h"
#include "infergate/log.h"
}

#include <stddef.h>

/* The state behind ig_backend_t.impl. */
typedef struct {
    int ordinal;
    char name[32]; /* "cuda:N" */
    int num_sms;
    int sync_each; /* IG_CUDA_SYNC=1: wait after every operation (ig__cuda_launched) */
    size_t max_smem_optin; /* bytes of dynamic shared memory a block may opt into */
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws; /* a fixed cuBLAS workspace, so that a captured graph can replay */
    size_t cublas_ws_bytes;
    /* Scratch grown on demand and only between steps (growth synchronizes the
     * stream first): activations converted for cuBLAS, and the partial
     * results of split-K decode attention. */
    void *act;
    size_t act_bytes;
    float *attn_part;
    size_t attn_part_bytes;
    /* The fused operations' intermediates when they run as their plain
     * parts (more rows than the GEMV takes), grown like the others. */
    float *fused;
    size_t fused_bytes;
} ig__cuda_t;

/*
 * Maps a CUDA runtime or cuBLAS status to 0 or IG_EDEVICE, logging the
 * failing expression and the library's error string. Every CUDA call in
 * the backend goes through IG_CUDA_CHECK, which returns the int:
 *     if ((rc = IG_CUDA_CHECK(cudaMalloc(&p, n))) != 0) goto fail;
 *     return IG_CUDA_CHECK(cudaGetLastError());
 */
int ig__cuda_status(cudaError_t st, const char *expr, const char *file, int line);
int ig__cuda_status(cublasStatus_t st, const char *expr, const char *file, int line);
#define IG_CUDA_CHECK(expr) ig__cuda_status((expr), #expr, __FILE__, __LINE__)

/* The check after queuing operation `op` (a kernel launch or a cuBLAS
 * call): 0, or IG_EDEVICE with the error logged under the op's name. A
 * kernel's own fault surfaces only at the next host wait, against whatever
 * call that is; with IG_CUDA_SYNC=1 in the environment at create the stream
 * is synchronized here, after every operation, so the log names the op
 * that faulted (slow: for finding a fault, not for serving). */
int ig__cuda_launched(ig__cuda_t *c, const char *op);

/* Makes the backend's device current on the calling thread (cheap when it
 * already is): the engine thread need not be the one that created it. */
int ig__cuda_enter(ig__cuda_t *c);

static inline ig__cuda_t *ig__cuda(ig_backend_t *be)
{
    return (ig__cuda_t *)be->impl;
}

/* The start of an operation on n elements (or bytes): 1 with *c entered
 * when there is work, 0 when n is 0 (nothing to queue), or a negative code. */
static inline int ig__cuda_begin(ig_backend_t *be, size_t n, ig__cuda_t **c)
{
    *c = ig__cuda(be);
    if (n == 0)
        return 0;
    int rc = ig__cuda_enter(*c);
    return rc != 0 ? rc : 1;
}

/* Grows a scratch buffer to at least `bytes`, synchronizing the stream
 * before freeing the old one. */
int ig__cuda_scratch(ig__cuda_t *c, void **buf, size_t *cap, size_t bytes);

/* ---- launchers, cuda_ops.cu ---------------------------------------------- */
int ig__cuda_embed(ig_backend_t *be, float *out, const ig_weight_t *table, const int *tokens,
                   int ntok);
int ig__cuda_rmsnorm(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                     float eps);
int ig__cuda_rope(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int n_heads,
                  int n_kv_heads, int head_dim, const float *inv_freq);
int ig__cuda_swiglu(ig_backend_t *be, float *out, const float *gate, const float *up, size_t n);
int ig__cuda_add(ig_backend_t *be, float *y, const float *x, size_t n);
int ig__cuda_gather(ig_backend_t *be, float *out, const float *x, const int *rows, int n, int cols);
int ig__cuda_kv_append(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                       const float *v, const int *slots, int ntok);
/* f32 -> bf16/f16 conversion of n elements, and y(m, n) += bias(n). */
int ig__cuda_convert(ig__cuda_t *c, void *dst, ig_dtype_t dtype, const float *src, size_t n);
int ig__cuda_add_bias(ig__cuda_t *c, float *y, const float *bias, int m, int n);
/* F16 activations for cuBLAS: dst(m, k) = F16(x * scale[r]), each row scaled
 * by a power of two that keeps it inside F16's range (1 when it fits), and
 * after the GEMM y(m, n) = y / scale[r] (+ bias). */
int ig__cuda_convert_f16_rows(ig__cuda_t *c, void *dst, float *scale, const float *src, int m,
                              int k);
int ig__cuda_unscale_bias(ig__cuda_t *c, float *y, const float *scale, const float *bias, int m,
                          int n);
int ig__cuda_rope_kv_append(ig_backend_t *be, float *q, const float *k, const float *v,
                            const ig_kv_layout_t *kv, int layer, const int *pos, const int *slots,
                            int ntok, int n_heads, const float *inv_freq);

/* ---- the decode GEMV, cuda_gemv.cu ---------------------------------------- */

/* The most rows of x the GEMV takes; beyond it x is re-read once per output
 * row often enough that cuBLAS's tiled GEMM wins. */
#define IG_GEMV_MAX_M 8

typedef enum {
    IG__GEMV_STORE,  /* y_i = x W_i^T (+ bias_i), for w[0 .. nw) */
    IG__GEMV_ADD,    /* y_0 += x W_0^T (the residual) */
    IG__GEMV_SWIGLU, /* y_0 = silu(x W_0^T) * (x W_1^T): w[0] gate, w[1] up */
} ig__gemv_op_t;

/* One launch of the GEMV: x(m, k), optionally RMS-normalised by norm(k) and
 * eps first, times up to three weights of k columns (one 16-bit dtype). */
typedef struct {
    ig__gemv_op_t op;
    const float *x;
    int k;
    const float *norm; /* (k) or NULL */
    float eps;
    int nw; /* STORE: 1 to 3 */
    const ig_weight_t *w[3];
    const float *bias[3]; /* (n_i) or NULL; STORE only */
    float *y[3];          /* (m, n_i); must not overlap x */
} ig__gemv_t;

/* Queues the GEMV for m rows, reading every weight once with 16-byte
 * loads. IG_ENOTSUP when the shapes do not fit it (m > IG_GEMV_MAX_M, k not
 * a multiple of 8, unaligned pointers, mixed dtypes): the caller then runs
 * the plain operations. */
int ig__cuda_gemv(ig__cuda_t *c, const ig__gemv_t *g, int m);

/* ---- launchers, cuda_attention.cu --------------------------------------- */
int ig__cuda_attention(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                       int layer, const ig_attn_batch_t *batch, int n_heads, float scale);
/* Raises the dynamic shared-memory limit of the attention kernels; called
 * once at create. */
int ig__cuda_attention_setup(ig__cuda_t *c);

#endif
