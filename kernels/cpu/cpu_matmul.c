/*
 * The CPU backend's GEMM dispatch, y = x W^T (+ bias): the own SIMD loops
 * (gemm.c for F32 panels, gemm16.c for BF16/F16, gemmq.c for Q8_0 and
 * Q4_0, gemmkq.c for Q4_K and Q6_K) over the thread pool, or OpenBLAS
 * with IG_CPU_GEMM=blas-pool|blas.
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

#ifdef IG_HAVE_OPENBLAS
#include <cblas.h>
#endif

/* ========================================================================= */
/* GEMM                                                                      */
/* ========================================================================= */

typedef struct {
    float *y;
    const float *x;
    const void *w; /* float, or uint16_t for 16-bit weights */
    const float *bias;
    ig_dtype_t dtype; /* of w: F32 packed or not, BF16/F16 and the block formats always packed */
    const int8_t *xq; /* block formats: x quantized (m, k), its scales and sums (m, k / 32) */
    const float *xd;
    const int32_t *xs;
    const uint16_t *xb; /* BF16 in k-pairs: x rounded to BF16 (m, kpad) */
    int m, n, k;
    int packed; /* w in the own GEMM's panel layout */
    int pairs;  /* BF16 w in gemm16.c's k-pair layout */
    ig_cpu_gemm_t mode;
    int chunk;         /* output columns per work item */
    atomic_int next;   /* the next work item to take */
    atomic_int failed; /* a work item ran out of memory */
} matmul_job_t;

static void matmul_cols(matmul_job_t *j, int n0, int n1)
{
    if (n1 <= n0)
        return;
    if (j->dtype == IG_DTYPE_Q8_0 || j->dtype == IG_DTYPE_Q4_0)
        ig__gemm_qp(j->dtype, j->y, j->n, j->xq, j->xd, j->xs, j->w, j->m, j->k, n0, n1);
    else if (j->dtype == IG_DTYPE_Q4_K || j->dtype == IG_DTYPE_Q6_K) {
        if (ig__gemm_kq(j->y, j->n, j->xq, j->xd, j->w, j->dtype, j->m, j->k, n0, n1) != 0)
            atomic_store(&j->failed, 1);
    } else if (j->pairs)
        ig__gemm16p(j->y, j->n, j->xb, j->w, j->m, j->k, j->n, n0, n1);
    else if (j->dtype != IG_DTYPE_F32)
        ig__gemm16(j->y, j->n, j->x, j->w, j->dtype == IG_DTYPE_BF16, j->m, j->k, j->n, n0, n1);
    else if (j->mode == IG_CPU_GEMM_OWN || j->mode == IG_CPU_GEMM_AUTO)
        ig__gemm_own(j->y, j->n, j->x, j->w, j->m, j->k, j->n, n0, n1);
    else if (j->packed)
        ig__gemm_blas_packed(j->y, j->n, j->x, j->w, j->m, j->k, j->n, n0, n1);
    else
        ig__gemm_blas(j->y, j->n, j->x, j->w, j->m, j->k, n0, n1);
    if (j->bias != NULL) {
        for (int r = 0; r < j->m; r++) {
            float *y = j->y + (size_t)r * j->n;
            for (int c = n0; c < n1; c++)
                y[c] += j->bias[c];
        }
    }
}

/* Threads take slices of output columns from a shared counter rather than
 * one fixed share each: on a loaded machine a thread that is descheduled
 * for a while leaves its slices to the others instead of stalling the
 * section. Every column is computed the same way whoever computes it. */
static void matmul_task(void *arg, int tid, int nt)
{
    matmul_job_t *j = arg;
    int n0, n1;
    while (ig__pool_take(&j->next, j->n, j->chunk, &n0, &n1))
        matmul_cols(j, n0, n1);
}

int ig__cpu_matmul(ig_backend_t *be, float *y, const float *x, const ig_weight_t *w,
                   const ig_weight_t *bias, int m)
{
    ig__cpu_t *c = ig__cpu_of(be);
    matmul_job_t j = {.y = y,
                      .x = x,
                      .w = w->data,
                      .bias = bias ? bias->data : NULL,
                      .m = m,
                      .n = (int)w->rows,
                      .k = (int)w->cols,
                      .dtype = w->dtype,
                      .packed = ig__cpu_is_packed(c, w),
                      .mode = c->gemm};
    float *tmp = NULL;
    if (m <= 0)
        return 0;
    double flops = (double)m * j.n * j.k;
    if (j.mode == IG_CPU_GEMM_AUTO)
        j.mode = IG_CPU_GEMM_OWN; /* faster than OpenBLAS at every m here (docs/engine.md) */
    atomic_init(&j.failed, 0);
    int blocks = j.dtype == IG_DTYPE_Q8_0 || j.dtype == IG_DTYPE_Q4_0 || j.dtype == IG_DTYPE_Q4_K ||
                 j.dtype == IG_DTYPE_Q6_K;
    if (blocks) {
        /* x quantized once here, for every thread's columns. */
        size_t need = (size_t)m * j.k;
        if (need > c->xq_cap) {
            int8_t *q = realloc(c->xq, need);
            if (q != NULL)
                c->xq = q;
            float *d = q ? realloc(c->xd, need / IG_Q8_0_BLOCK * sizeof(float)) : NULL;
            if (d != NULL)
                c->xd = d;
            int32_t *s = d ? realloc(c->xs, need / IG_Q8_0_BLOCK * sizeof(int32_t)) : NULL;
            if (s == NULL)
                return IG_ENOMEM;
            c->xs = s;
            c->xq_cap = need;
        }
        ig__q8_quantize_rows_sums(c->xq, c->xd, c->xs, x, m, j.k);
        j.xq = c->xq;
        j.xd = c->xd;
        j.xs = c->xs;
    } else if (j.dtype == IG_DTYPE_BF16 && j.packed && ig__cpu_is_pairs(c, w)) {
        /* x rounded to BF16 once here, for every thread's columns. */
        size_t need = (size_t)m * ig__gemm16p_kpad(j.k);
        if (need > c->xb_cap) {
            uint16_t *b = realloc(c->xb, need * sizeof(uint16_t));
            if (b == NULL)
                return IG_ENOMEM;
            c->xb = b;
            c->xb_cap = need;
        }
        ig__bf16_round_rows(c->xb, x, m, j.k);
        j.xb = c->xb;
        j.pairs = 1;
    } else if (j.dtype != IG_DTYPE_F32 && !j.packed) {
        return IG_EINVAL; /* 16-bit weights come only from upload_weight */
    }
    if (j.dtype == IG_DTYPE_F32 && j.mode == IG_CPU_GEMM_OWN && !j.packed) {
        /* A weight made by hand (tests): packed here, for this call. */
        tmp = malloc(ig__gemm_packed_floats(j.n, j.k) * sizeof(float));
        if (tmp == NULL)
            return IG_ENOMEM;
        ig__gemm_pack(tmp, j.w, j.n, j.k);
        j.w = tmp;
        j.packed = 1;
    }
    int nr = ig__gemm_panel_width();
    if (j.dtype == IG_DTYPE_Q8_0 || j.dtype == IG_DTYPE_Q4_0)
        nr = IG_QP_NR; /* whole panels */
    else if (j.dtype == IG_DTYPE_Q4_K || j.dtype == IG_DTYPE_Q6_K)
        nr = IG_KQP_NR;
    else if (j.dtype != IG_DTYPE_F32)
        nr = IG_GEMM16_NR;
    if (j.mode == IG_CPU_GEMM_BLAS_OWN && j.dtype == IG_DTYPE_F32) {
        /* OpenBLAS splits the work over its own threads. */
        j.mode = IG_CPU_GEMM_BLAS_POOL;
        matmul_cols(&j, 0, j.n);
    } else if (flops >= IG_CPU_PARALLEL_MIN_FLOPS && c->nthreads > 1) {
        /* About eight slices per thread, whole panels. */
        int chunk = j.n / (c->nthreads * 8);
        j.chunk = chunk < nr ? nr : chunk - chunk % nr;
        atomic_init(&j.next, 0);
        ig__pool_run(c->pool, matmul_task, &j);
    } else {
        matmul_cols(&j, 0, j.n);
    }
    free(tmp);
    return atomic_load(&j.failed) ? IG_ENOMEM : 0;
}
