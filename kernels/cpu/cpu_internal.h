#ifndef INFERGATE_KERNELS_CPU_INTERNAL_H
#define INFERGATE_KERNELS_CPU_INTERNAL_H

/*
 * Private to the CPU backend (kernels/cpu/) and its tests: the thread pool,
 * the GEMM paths and the switches the tests and the benchmark use to compare
 * them. Nothing under gateway/ includes this file.
 */

#include "infergate/kernels.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- instruction sets per function ------------------------------------- */

/* Functions between IG__TARGET_BEGIN("avx2,fma") and IG__TARGET_END are
 * compiled for those extensions whatever the build's -march; isa.c picks
 * them at run time. clang has no GCC target pragmas, hence its attribute
 * push (the fuzz build is clang's). */
#define IG__PRAGMA(...) _Pragma(#__VA_ARGS__)
#ifdef __clang__
#define IG__TARGET_BEGIN(isa)                                                                      \
    IG__PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define IG__TARGET_END IG__PRAGMA(clang attribute pop)
#else
#define IG__TARGET_BEGIN(isa) IG__PRAGMA(GCC push_options) IG__PRAGMA(GCC target(isa))
#define IG__TARGET_END IG__PRAGMA(GCC pop_options)
#endif

/* ---- thread pool ---------------------------------------------------------- */

/* A small persistent pool: n - 1 pthreads plus the calling thread. run()
 * calls fn(arg, tid, n) on the calling thread (tid 0) and on every worker
 * that wakes up before the caller's call returns; it returns when all those
 * calls have. So fn must take its work from a shared counter until none is
 * left (ig__pool_take), never assume that every tid runs. */
typedef struct ig__pool_s ig__pool_t;
typedef void (*ig__pool_fn)(void *arg, int tid, int nthreads);

int ig__pool_create(ig__pool_t **out, int nthreads);
void ig__pool_run(ig__pool_t *pool, ig__pool_fn fn, void *arg);
int ig__pool_size(const ig__pool_t *pool);
void ig__pool_free(ig__pool_t *pool);

/* Takes the next range of `chunk` units out of [0, n) from *next; 0 when
 * none is left. */
static inline int ig__pool_take(atomic_int *next, int n, int chunk, int *begin, int *end)
{
    int c = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
    if (c >= (n + chunk - 1) / chunk)
        return 0;
    *begin = c * chunk;
    *end = *begin + chunk < n ? *begin + chunk : n;
    return 1;
}

/* ---- GEMM ----------------------------------------------------------------- */

/* How matmul computes y = x W^T. */
typedef enum {
    IG_CPU_GEMM_OWN = 0,   /* cache-blocked SIMD loop, split over the pool */
    IG_CPU_GEMM_BLAS_POOL, /* single-threaded OpenBLAS on each pool thread's slice of W */
    IG_CPU_GEMM_BLAS_OWN,  /* one OpenBLAS call using OpenBLAS's own threads */
    IG_CPU_GEMM_AUTO,      /* the default: the own loop (it outruns OpenBLAS's tuned
                              kernels at every batch size on the packed weights) */
} ig_cpu_gemm_t;

/* The own loop's weight layout: W(n, k) as ceil(n / width) panels of
 * `width` rows of W (output columns), each stored k-major
 * (panel[kk * width + c] = W[p * width + c][kk]), the last one padded with
 * zeros. upload_weight() stores every 2-D weight this way. */
int ig__gemm_panel_width(void);
size_t ig__gemm_packed_floats(int n, int k);
/* That layout for any element of es bytes and width nr: gemm.c's F32 panels
 * and gemm16.c's 16-bit ones. Inline, so that a caller's constant nr and es
 * make the copy a plain loop of loads and stores. */
static inline size_t ig__panels_elems(int n, int k, int nr)
{
    return (size_t)((n + nr - 1) / nr) * nr * (size_t)k;
}
static inline void ig__panels_pack(void *dst, const void *w, int n, int k, int nr, size_t es)
{
    for (int p = 0; p * nr < n; p++) {
        char *panel = (char *)dst + (size_t)p * nr * k * es;
        int rows = n - p * nr < nr ? n - p * nr : nr;
        if (rows < nr)
            memset(panel, 0, (size_t)nr * k * es);
        /* Row by row: each W row is read in order; the strided writes stay
         * within the panel's k * nr elements. */
        for (int c = 0; c < rows; c++) {
            const char *src = (const char *)w + (size_t)(p * nr + c) * k * es;
            for (int kk = 0; kk < k; kk++)
                memcpy(panel + ((size_t)kk * nr + c) * es, src + (size_t)kk * es, es);
        }
    }
}
void ig__gemm_pack(float *dst, const float *w, int n, int k);
/* dst(k) = row `row` of the packed W. */
void ig__gemm_unpack_row(float *dst, const float *packed, int k, int row);

/* y(m, n) (row stride ldy) = x(m, k) . W(n, k)^T for the output columns
 * [n0, n1), n0 a multiple of the panel width, W packed; single-threaded;
 * the own SIMD loop. Each output has the same bits whatever m, n0, n1. */
void ig__gemm_own(float *y, int ldy, const float *x, const float *packed, int m, int k, int n,
                  int n0, int n1);

/* The same with cblas_sgemm, W row-major (ig__gemm_blas) or packed (one call
 * per panel); IG_ENOTSUP without OpenBLAS. */
int ig__gemm_blas(float *y, int ldy, const float *x, const float *w, int m, int k, int n0, int n1);
int ig__gemm_blas_packed(float *y, int ldy, const float *x, const float *packed, int m, int k,
                         int n, int n0, int n1);

/* Selects the GEMM path of a CPU backend; IG_ENOTSUP for a BLAS path in a
 * build without OpenBLAS, IG_EINVAL for a backend that is not the CPU's.
 * The default comes from IG_CPU_GEMM (auto, own, blas-pool, blas), else is
 * auto (docs/engine.md says why). */
int ig__cpu_set_gemm(ig_backend_t *be, ig_cpu_gemm_t mode);
ig_cpu_gemm_t ig__cpu_gemm(const ig_backend_t *be);

/* Which SIMD the own loops were compiled for: "avx512", "avx2" or "scalar". */
const char *ig__cpu_simd_name(void);

/* Whether OpenBLAS runs a kernel at least as wide as the own loop's SIMD
 * (it falls back to a generic SSE kernel on CPUs it does not recognise,
 * e.g. some virtual machines, unless OPENBLAS_CORETYPE names one), and its
 * core name ("none" without OpenBLAS); for the benchmark's report. */
int ig__cpu_blas_usable(const char **core);

/* ---- instruction set of the dispatched kernels (isa.c) -------------------- */

/* The kernels of gemm16.c and gemmq.c pick their code at run time, not at
 * build time, so one binary is right on every x86-64. AVX-512 here means
 * F, BW, VL, DQ and VNNI; AVX2 means AVX2, FMA and F16C. */
typedef enum {
    IG_CPU_ISA_SCALAR = 0,
    IG_CPU_ISA_AVX2,
    IG_CPU_ISA_AVX512,
} ig_cpu_isa_t;

/* The set in use: the best the CPU has, lowered by IG_CPU_ISA=avx2|scalar
 * or by ig__cpu_set_isa(). Process-wide. */
ig_cpu_isa_t ig__cpu_isa(void);
ig_cpu_isa_t ig__cpu_isa_max(void);
/* IG_ENOTSUP when the CPU lacks isa. */
int ig__cpu_set_isa(ig_cpu_isa_t isa);
const char *ig__cpu_isa_name(ig_cpu_isa_t isa);
/* Whether the CPU has AVX512_BF16 on top of the AVX-512 set; whether BF16
 * weights are uploaded for it now (the CPU has it, the set in use is
 * AVX-512, and vdpbf16ps pays on this core as isa.c measures it, unless
 * IG_CPU_BF16_DOT=1/0 or ig__cpu_set_bf16_dot() says otherwise);
 * IG_ENOTSUP for on when the CPU lacks it. Process-wide. */
int ig__cpu_has_bf16_dot(void);
int ig__cpu_bf16_dot(void);
int ig__cpu_set_bf16_dot(int on);
/* The measured rates behind the default (multiply-adds per ns on one core,
 * vdpbf16ps and FMA; 0 where not measured: no AVX512_BF16, or forced by
 * IG_CPU_BF16_DOT). */
void ig__cpu_bf16_dot_rates(double *dot, double *fma);
/* Whether a decode tile of the 16-bit widening path (one or two rows, a
 * stream of weights from DRAM) asks for its weights G16_PREFETCH ahead:
 * on Intel, whose hardware prefetcher falls behind that stream, not on
 * AMD, whose own does better alone (docs/engine.md, "Weights").
 * IG_CPU_PREFETCH=1/0 forces it.
 * Process-wide. */
int ig__cpu_stream_prefetch(void);
/* The default takes vdpbf16ps when it does this many times the FMA's
 * multiply-adds a second (it rounds x to BF16: it must pay for that). */
#define IG_CPU_BF16_DOT_GAIN 1.25

/* ---- 16-bit weights (gemm16.c) -------------------------------------------- */

/* BF16 and F16 weights are packed like the F32 ones (panels of
 * IG_GEMM16_NR output columns, k-major, zero-padded) but keep their 16 bits;
 * the kernel widens them in registers, so every product is exact and the
 * F32 error bounds hold. */
#define IG_GEMM16_NR 32
size_t ig__gemm16_packed_elems(int n, int k);
/* Packs rows [0, n) of w(n, k); a caller packing a big W in pieces passes
 * pieces of a multiple of IG_GEMM16_NR rows, dst advanced by rows * k. */
void ig__gemm16_pack(uint16_t *dst, const uint16_t *w, int n, int k);
/* dst(k) = row `row` of the packed W, widened. */
void ig__gemm16_unpack_row(float *dst, const uint16_t *packed, int bf16, int k, int row);
/* y(m, n) (row stride ldy) = x(m, k) . W(n, k)^T for the columns [n0, n1),
 * n0 a multiple of IG_GEMM16_NR; single-threaded; each output has the same
 * bits whatever m, n0, n1. */
void ig__gemm16(float *y, int ldy, const float *x, const uint16_t *packed, int bf16, int m, int k,
                int n, int n0, int n1);

/* BF16 weights for vdpbf16ps (gemm16.c): panels of IG_GEMM16_NR columns
 * in k-pairs (pair j of column c at panel[j * 2 * NR + 2 * c], k padded to
 * ig__gemm16p_kpad(k), even), x rounded to BF16 by ig__bf16_round_rows
 * into rows of kpad (m, kpad). ig__gemm16p runs vdpbf16ps where the CPU
 * has it and the set in use is AVX-512, else plain C with the same bits.
 * Each output has the same bits whatever m, n0, n1. */
int ig__gemm16p_kpad(int k);
size_t ig__gemm16p_packed_elems(int n, int k);
void ig__gemm16p_pack(uint16_t *dst, const uint16_t *w, int n, int k);
void ig__gemm16p_unpack_row(float *dst, const uint16_t *packed, int k, int row);
void ig__bf16_round_rows(uint16_t *xb, const float *x, int m, int k);
void ig__gemm16p(float *y, int ldy, const uint16_t *xb, const uint16_t *packed, int m, int k, int n,
                 int n0, int n1);

/* ---- Q8_0 and Q4_0 weights (gemmq.c) -------------------------------------- */

/* x(m, k) quantized per block of 32 like a Q8_0 weight, but with the scale
 * kept in F32: q(m, k) int8 and d(m, k / 32); k a multiple of 32. The _sums
 * form also writes s(m, k / 32), each block's sum of q (s may be NULL). */
void ig__q8_quantize_rows(int8_t *q, float *d, const float *x, int m, int k);
void ig__q8_quantize_rows_sums(int8_t *q, float *d, int32_t *s, const float *x, int m, int k);
/* Q8_0 or Q4_0 weights (dt) packed in panels of IG_QP_NR rows of W (output
 * columns): block b of panel p holds the panel's IG_QP_NR F16 scales, then
 * the rows' weight bytes by quads as [quad][row][4] bytes. A Q8_0 quad is 4
 * weights of k, each w + 128 (w ^ 0x80); a Q4_0 quad g is bytes 4g..4g+3
 * of a row's 16 nibble bytes (low nibbles: weights 4g..4g+3, high:
 * 16 + 4g..). The same bytes as GGUF's layout (544 = 16 x 34, 288 =
 * 16 x 18); a short last panel is padded with zero weights. */
#define IG_QP_NR 16
size_t ig__qp_packed_bytes(ig_dtype_t dt, int n, int k);
/* src: n rows of k in GGUF's layout of dt; dst: ig__qp_packed_bytes(dt, n, k). */
void ig__qp_pack(uint8_t *dst, const uint8_t *src, ig_dtype_t dt, int n, int k);
/* Row `row` of W dequantized, as ig_dtype_to_f32 gives it from GGUF's layout. */
void ig__qp_unpack_row(float *dst, const uint8_t *packed, ig_dtype_t dt, int k, int row);
/* y(m, n) (row stride ldy) = x . W^T for the columns [n0, n1), W packed by
 * ig__qp_pack for dt, n0 a multiple of IG_QP_NR, x quantized by
 * ig__q8_quantize_rows_sums (xq, xd, xs); single-threaded. Every output has
 * the same bits whatever m, n0, n1 and the instruction set. */
void ig__gemm_qp(ig_dtype_t dt, float *y, int ldy, const int8_t *xq, const float *xd,
                 const int32_t *xs, const uint8_t *w, int m, int k, int n0, int n1);

/* ---- Q4_K and Q6_K weights (gemmkq.c) ------------------------------------- */

/* Both rewritten without loss into panels of IG_KQP_NR rows that keep the
 * formats' own integers: per super-block of 256 of k, the rows' F16 d (and
 * dmin), their scale bytes, and the quants as nibbles (Q6_K: plus 2-bit
 * high parts); gemmkq.c has the byte layout. 0.58 bytes a weight for Q4_K,
 * 0.83 for Q6_K. */
#define IG_KQP_NR 16
size_t ig__kqp_packed_bytes(ig_dtype_t dtype, int n, int k);
/* src: n rows of k (a multiple of 256) in dtype (Q4_K or Q6_K), GGUF's
 * layout; dst: ig__kqp_packed_bytes(dtype, n, k); -1 for another dtype. */
int ig__kqp_pack(uint8_t *dst, const uint8_t *src, ig_dtype_t dtype, int n, int k);
/* Row `row` dequantized: ig_dtype_to_f32's values (a zero may come out as
 * +0 where ggml's product gives -0). */
void ig__kqp_unpack_row(float *dst, const uint8_t *packed, ig_dtype_t dtype, int k, int row);
/* y(m, n) = x . W^T for the columns [n0, n1), n0 a multiple of IG_KQP_NR,
 * W packed by ig__kqp_pack from dtype, x quantized by ig__q8_quantize_rows
 * (xq, xd); single-threaded; the same bits whatever m, n0, n1 and the
 * instruction set. 0, or -1 out of memory. */
int ig__gemm_kq(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w,
                ig_dtype_t dtype, int m, int k, int n0, int n1);

/* ---- 16-bit KV cache (kv16.c) --------------------------------------------- */

/* dst(n) = src(n) rounded to F16 (bf16 = 0) or BF16, to nearest, ties to
 * even, as ig_f32_to_f16 / ig_f32_to_bf16 round; and back to F32 (exact).
 * The instruction set is ig__cpu_isa()'s; every path gives the same bits. */
void ig__kv16_store(uint16_t *dst, const float *src, size_t n, int bf16);
void ig__kv16_load(float *dst, const uint16_t *src, size_t n, int bf16);

/* ---- the backend's state, shared by its files ---------------------------- */

/* Below this many multiply-adds a GEMM runs on the calling thread alone:
 * waking the pool costs more than it saves (at batch 1 the attention
 * projections of small models stay on one thread, the MLP and lm_head
 * are split). */
#define IG_CPU_PARALLEL_MIN_FLOPS (128 * 1024)
#define IG_CPU_PARALLEL_MIN_ELEMS (32 * 1024)

typedef struct {
    ig__pool_t *pool;
    int nthreads;
    ig_cpu_gemm_t gemm;
    float **scratch; /* (nthreads) attention scores, scratch_cap floats each */
    size_t scratch_cap;
    int *items;  /* attention work items, items_cap of them */
    int8_t *xq;  /* matmul input quantized for Q8_0/Q4_0 weights, xq_cap bytes */
    float *xd;   /* its block scales, xq_cap / 32 */
    int32_t *xs; /* its block sums, xq_cap / 32 */
    size_t xq_cap;
    int items_cap;
    /* The data pointers of the weights upload_weight() packed for the own
     * GEMM (gemm.c), sorted; a weight made by hand is row-major. */
    pthread_mutex_t packed_lock;
    const void **packed;
    int npacked, packed_cap;
    /* Those of them in gemm16.c's k-pair layout for vdpbf16ps (BF16), sorted;
     * under packed_lock too. */
    const void **pairs;
    int npairs, pairs_cap;
    uint16_t *xb; /* matmul input rounded to BF16 for them, xb_cap elements */
    size_t xb_cap;
    char name[32];
} ig__cpu_t;

static inline ig__cpu_t *ig__cpu_of(ig_backend_t *be)
{
    return be->impl;
}

/* The registry of packed weights (cpu_packed.c), under packed_lock.
 * Whether w's data is in the own GEMM's panel layout (packed at upload), and
 * for BF16 also in gemm16.c's k-pairs; any thread. */
int ig__cpu_is_packed(ig__cpu_t *c, const ig_weight_t *w);
int ig__cpu_is_pairs(ig__cpu_t *c, const ig_weight_t *w);
/* Record or forget a packed data pointer (upload and free of a weight);
 * the adds return 0 or IG_ENOMEM. */
int ig__cpu_packed_add(ig__cpu_t *c, const void *p);
void ig__cpu_packed_remove(ig__cpu_t *c, const void *p);
int ig__cpu_pairs_add(ig__cpu_t *c, const void *p);
void ig__cpu_pairs_remove(ig__cpu_t *c, const void *p);

/* The operations of the table (include/infergate/kernels.h): cpu_ops.c,
 * cpu_matmul.c, cpu_attention.c. */
int ig__cpu_embed(ig_backend_t *be, float *out, const ig_weight_t *table, const int *tokens,
                  int ntok);
int ig__cpu_rmsnorm(ig_backend_t *be, float *out, const float *x, const ig_weight_t *w, int m,
                    float eps);
int ig__cpu_swiglu(ig_backend_t *be, float *out, const float *gate, const float *up, size_t n);
int ig__cpu_add(ig_backend_t *be, float *y, const float *x, size_t n);
int ig__cpu_gather(ig_backend_t *be, float *out, const float *x, const int *rows, int n, int cols);
int ig__cpu_rope(ig_backend_t *be, float *q, float *k, const int *pos, int ntok, int n_heads,
                 int n_kv_heads, int head_dim, const float *inv_freq);
int ig__cpu_kv_append(ig_backend_t *be, const ig_kv_layout_t *kv, int layer, const float *k,
                      const float *v, const int *slots, int ntok);
int ig__cpu_matmul(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w,
                   const ig_weight_t *bias, int m);
int ig__cpu_attention(ig_backend_t *be, float *out, const float *q, const ig_kv_layout_t *kv,
                      int layer, const ig_attn_batch_t *batch, int n_heads, float scale);

/* Where row `off` of (layer, block, head) starts in the cache, in elements. */
static inline size_t ig__kv_offset(const ig_kv_layout_t *kv, int layer, int block, int head,
                                   int off)
{
    return ((((size_t)layer * kv->num_blocks + block) * kv->n_kv_heads + head) * kv->block_size +
            off) *
           kv->head_dim;
}

static inline int ig__kv_dtype_ok(const ig_kv_layout_t *kv)
{
    return kv->dtype == IG_DTYPE_F32 || kv->dtype == IG_DTYPE_F16 || kv->dtype == IG_DTYPE_BF16;
}

#endif
