#ifndef INFERGATE_KERNELS_H
#define INFERGATE_KERNELS_H

/*
 * The kernel interface of the execution core. A backend (kernels/cpu/,
 * kernels/cuda/) implements the operations of one forward pass on its own
 * memory; the forward pass (gateway/engine/engine.c) is written once
 * against this table and runs on either.
 *
 * Pointers named in the operations are backend memory (host memory for the
 * CPU backend, device memory for CUDA) obtained from alloc() or
 * upload_weight(). Activations are float32; the KV cache is float32 or, on
 * a backend whose kv_dtypes says so, F16 or BF16 (ig_kv_layout_t.dtype);
 * weights stay in the dtype upload_weight() chose (both backends keep 2-D
 * BF16/F16 weights in 16 bits and accumulate in F32; vectors become F32).
 *
 * Every operation returns 0 or a negative IG_E* code (a CUDA failure becomes
 * IG_EDEVICE). Operations may be asynchronous on the backend's one stream;
 * download() and sync() wait for them.
 */

#include "infergate/tensor.h"

#include <stddef.h>

typedef struct ig_backend_s ig_backend_t;

/* A weight as the backend holds it. */
typedef struct {
    ig_dtype_t dtype;
    void *data;   /* backend memory */
    int64_t rows; /* out_features (or elements for a vector) */
    int64_t cols; /* in_features (1 for a vector) */
} ig_weight_t;

/*
 * One batch as attention sees it: nseq sequences, each with a run of query
 * rows in q, attending causally to its cached keys and values. Arrays are
 * backend memory.
 */
typedef struct {
    int nseq;
    int ntok;                /* total query rows = q_start[nseq] */
    const int *q_start;      /* (nseq + 1) first query row of each sequence */
    const int *ctx_len;      /* (nseq) cached positions after this step's append;
                                query row j of sequence s is at position
                                ctx_len[s] - (q_start[s+1] - q_start[s]) + j */
    const int *block_tables; /* (nseq, max_blocks) KV block ids of each sequence */
    int max_blocks;          /* row stride of block_tables */
    int max_ctx;             /* max over ctx_len, for launch sizing */
    int max_q;               /* max query rows of one sequence */
} ig_attn_batch_t;

/* The paged KV cache of one engine: fixed-size blocks, allocated by the
 * scheduler from the engine's free list (include/infergate/engine.h).
 * Elements are in `dtype`: F32 (0, the default), or F16 / BF16, which
 * kv_append rounds to (nearest, ties to even) and attention widens back to
 * F32 before its F32 arithmetic. */
typedef struct {
    int num_layers;
    int num_blocks;
    int block_size; /* tokens per block */
    int n_kv_heads;
    int head_dim;
    void *k;          /* (layer, block, kv_head, block_size, head_dim) in dtype */
    void *v;          /* (layer, block, kv_head, block_size, head_dim) in dtype */
    ig_dtype_t dtype; /* IG_DTYPE_F32, IG_DTYPE_F16 or IG_DTYPE_BF16 */
} ig_kv_layout_t;

struct ig_backend_s {
    const char *name; /* "cpu", "cuda:0", ... */
    /* The KV element types kv_append and attention take: bit (1u << dtype)
     * for each; 0 means F32 only. The engine refuses any other at create. */
    unsigned kv_dtypes;
    /* 1 when alloc()'s memory is host memory that the caller may read and
     * write in place (the CPU backend: the engine then lets lm_head write
     * the logits where the sampler reads them); 0 for device memory, which
     * only upload() and download() reach. */
    int host_memory;

    /* ---- memory ---- */
    void *(*alloc)(ig_backend_t *be, size_t bytes); /* NULL when out of memory */
    void (*free)(ig_backend_t *be, void *ptr);
    int (*upload)(ig_backend_t *be, void *dst, const void *src, size_t bytes);
    int (*download)(ig_backend_t *be, void *dst, const void *src, size_t bytes);
    /* Copies a model tensor into backend memory in the backend's preferred
     * dtype. A 1-D tensor becomes rows = n, cols = 1. */
    int (*upload_weight)(ig_backend_t *be, const ig_tensor_t *src, ig_weight_t *dst);
    void (*free_weight)(ig_backend_t *be, ig_weight_t *w);

    /* ---- operations (all shapes row-major) ---- */
    /* out(ntok, dim) = table[tokens[i]] */
    int (*embed)(ig_backend_t *be, float *out, const ig_weight_t *table, const int *tokens,
                 int ntok);
    /* out(m, dim) = x / rms(x) * w; out may alias x */
    int (*rmsnorm)(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                   float eps);
    /* y(m, n) = x(m, k) . W(n, k)^T (+ bias(n) when bias is not NULL) */
    int (*matmul)(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w,
                  const ig_weight_t *bias, int m);
    /* Rotates q(ntok, n_heads, head_dim) and k(ntok, n_kv_heads, head_dim)
     * in place at positions pos(ntok), rotate-half (NeoX/HF) convention;
     * inv_freq(head_dim / 2) already holds any rope scaling. */
    int (*rope)(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int n_heads,
                int n_kv_heads, int head_dim, const float *inv_freq);
    /* out(n) = silu(gate(n)) * up(n) */
    int (*swiglu)(ig_backend_t *be, float *out, const float *gate, const float *up, size_t n);
    /* y(n) += x(n) */
    int (*add)(ig_backend_t *be, float *y, const float *x, size_t n);
    /* Writes k, v (ntok, n_kv_heads, head_dim) of one layer into the cache at
     * slots(ntok) = block * block_size + offset. */
    int (*kv_append)(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                     const float *v, const int *slots, int ntok);
    /* out(ntok, n_heads, head_dim) = softmax(q k^T * scale, causal) v over the
     * paged cache of one layer. */
    int (*attention)(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                     int layer, const ig_attn_batch_t *batch, int n_heads, float scale);
    /* out(n, cols) = x[rows[i]] for i < n: picks the rows that need logits.
     * rows(n) is backend memory; out must not overlap x. */
    int (*gather)(ig_backend_t *be, float *out, const float *x, const int *rows, int n, int cols);
    /* Free and total bytes of backend memory, for sizing the KV cache; NULL
     * where the backend cannot tell (the CPU: its cap is in docs/engine.md). */
    int (*mem_info)(ig_backend_t *be, size_t *free_bytes, size_t *total_bytes);
    /* Waits for all queued work. */
    int (*sync)(ig_backend_t *be);
    void (*destroy)(ig_backend_t *be);

    void *impl; /* the backend's own state */

    /* ---- optional: the fused decode step ----
     * NULL where the backend has none (the CPU: the engine then runs the
     * plain operations above). Each computes what the plain sequence named
     * in its comment computes, in one launch where the shapes allow, and
     * differs from it only in the order of F32 sums. The output must not
     * overlap the input x. */
    /* y_i(m, n_i) = rmsnorm(x, norm, eps) . W_i(n_i, k)^T (+ bias_i) for
     * i < nw (1 to 3, one k): rmsnorm, then nw matmuls. q/k/v of a layer in
     * one pass over x; norm NULL takes x as it is; bias or bias[i] may be
     * NULL. */
    int (*norm_matmul)(ig_backend_t *be, float *const *y, const float *x, const ig_weight_t *norm,
                       float eps, const ig_weight_t *const *w, const ig_weight_t *const *bias,
                       int nw, int m);
    /* out(m, n) = silu(rmsnorm(x) . W_gate^T) * (rmsnorm(x) . W_up^T):
     * rmsnorm, the gate and up matmuls, then swiglu. */
    int (*norm_swiglu)(ig_backend_t *be, float *out, const float *x, const ig_weight_t *norm,
                       float eps, const ig_weight_t *w_gate, const ig_weight_t *w_up, int m);
    /* y(m, n) += x(m, k) . W(n, k)^T: matmul, then add (the residual after
     * o_proj and down_proj). */
    int (*matmul_add)(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w, int m);
    /* rope on q (in place) and k at pos(ntok), and kv_append of the rotated
     * k and of v at slots(ntok): rope, then kv_append. The k buffer is left
     * as it was. */
    int (*rope_kv_append)(ig_backend_t *be, float *q, const float *k, const float *v,
                          const ig_kv_layout_t *kv, int layer, const int *pos, const int *slots,
                          int ntok, int n_heads, const float *inv_freq);
    /* Page-locked host memory (NULL when out of memory) and its release.
     * upload() from it does not wait for the copy: the caller rewrites it
     * only after the next download() or sync() has returned. */
    void *(*host_alloc)(ig_backend_t *be, size_t bytes);
    void (*host_free)(ig_backend_t *be, void *ptr);
};

/* The CPU backend with `threads` worker threads (0 = the number of cores).
 * GEMM runs our own SIMD kernel on weights packed at upload (faster than
 * OpenBLAS on every shape measured, and batch-invariant); a build with
 * OpenBLAS can be told to use it with IG_CPU_GEMM=blas-pool|blas. */
int ig_backend_cpu_create(ig_backend_t **out, int threads);

/*
 * The CUDA backend on device `ordinal` (after CUDA_VISIBLE_DEVICES). Returns
 * IG_ENOTSUP in a build without CUDA and IG_EDEVICE when no usable GPU is
 * there; err then says why in one line.
 */
int ig_backend_cuda_create(ig_backend_t **out, int ordinal, char *err, size_t errlen);

/* Opens a backend from a device string: "cpu", "cpu:THREADS", "cuda:N" or
 * "MIG-<uuid>" (the process must already run with CUDA_VISIBLE_DEVICES set to
 * it, so the slice is device 0). threads applies to the CPU backend. */
int ig_backend_open(ig_backend_t **out, const char *device, int threads, char *err, size_t errlen);

#endif
