/*
 * GEMM for the CPU backend: y = x W^T with W in nn.Linear layout (n, k).
 *
 * The own loop computes register tiles of up to 4 rows of x by 4 rows of W,
 * each output a dot product over k held in one vector accumulator, and walks
 * W in panels that stay in L2 while every row of x passes over them: at
 * batch 64 each weight byte is read from memory once per step instead of 64
 * times. Every output element is computed by the same sequence of
 * operations whatever the batch size, so a sequence's logits do not depend
 * on what shares its batch.
 */
#include "cpu_internal.h"
#include "simd.h"

#include "infergate/error.h"

#ifdef IG_HAVE_OPENBLAS
#include <cblas.h>
#endif

#define TILE_M 4
#define TILE_N 4
#define PANEL_BYTES (128 * 1024)

#if defined(__AVX512F__)
#define VSUM_ONE(v) ig__vsum_one(v)
#else
#define VSUM_ONE(v) ig_vsum(v)
#endif

static inline __attribute__((always_inline)) void tile(float *y, int ldy, const float *x,
                                                       const float *w, int k, int mr, int nr)
{
    /* Fully unrolled so that the accumulators live in registers: at -O2
     * GCC otherwise keeps the array in memory. */
    ig_vec_t acc[TILE_M][TILE_N];
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
        for (int b = 0; b < nr; b++)
            acc[a][b] = ig_vzero();
    int kk = 0;
    for (; kk + IG_VL <= k; kk += IG_VL) {
        ig_vec_t xv[TILE_M];
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++)
            xv[a] = ig_vload(x + (size_t)a * k + kk);
#pragma GCC unroll 4
        for (int b = 0; b < nr; b++) {
            ig_vec_t wv = ig_vload(w + (size_t)b * k + kk);
#pragma GCC unroll 4
            for (int a = 0; a < mr; a++)
                acc[a][b] = ig_vfma(xv[a], wv, acc[a][b]);
        }
    }
    float sums[TILE_M * TILE_N];
#if defined(__AVX512F__)
    if (mr == TILE_M && nr == TILE_N) {
        _mm512_storeu_ps(sums, ig__vsum_16(&acc[0][0]));
    } else
#endif
    {
#pragma GCC unroll 4
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (int b = 0; b < nr; b++)
                sums[a * TILE_N + b] = VSUM_ONE(acc[a][b]);
    }
#pragma GCC unroll 4
    for (int a = 0; a < mr; a++) {
#pragma GCC unroll 4
        for (int b = 0; b < nr; b++) {
            float s = sums[a * TILE_N + b];
            for (int t = kk; t < k; t++)
                s += x[(size_t)a * k + t] * w[(size_t)b * k + t];
            y[(size_t)a * ldy + b] = s;
        }
    }
}

/* Constant tile shapes let the compiler keep the accumulators in registers. */
static void tile_rows(float *y, int ldy, const float *x, const float *w, int k, int mr, int nr)
{
    if (nr == TILE_N) {
        switch (mr) {
        case 4:
            tile(y, ldy, x, w, k, 4, TILE_N);
            return;
        case 3:
            tile(y, ldy, x, w, k, 3, TILE_N);
            return;
        case 2:
            tile(y, ldy, x, w, k, 2, TILE_N);
            return;
        case 1:
            tile(y, ldy, x, w, k, 1, TILE_N);
            return;
        }
    }
    for (int a = 0; a < mr; a++)
        for (int b = 0; b < nr; b++)
            tile(y + (size_t)a * ldy + b, ldy, x + (size_t)a * k, w + (size_t)b * k, k, 1, 1);
}

void ig__gemm_own(float *y, int ldy, const float *x, const float *w, int m, int k, int n0, int n1)
{
    int panel = PANEL_BYTES / (int)(sizeof(float) * (size_t)(k > 0 ? k : 1));
    panel = panel < TILE_N ? TILE_N : panel - panel % TILE_N;
    for (int jb = n0; jb < n1; jb += panel) {
        int je = jb + panel < n1 ? jb + panel : n1;
        for (int i = 0; i < m; i += TILE_M) {
            int mr = m - i < TILE_M ? m - i : TILE_M;
            for (int j = jb; j < je; j += TILE_N) {
                int nr = je - j < TILE_N ? je - j : TILE_N;
                tile_rows(y + (size_t)i * ldy + j, ldy, x + (size_t)i * k, w + (size_t)j * k, k, mr,
                          nr);
            }
        }
    }
}

int ig__gemm_blas(float *y, int ldy, const float *x, const float *w, int m, int k, int n0, int n1)
{
#ifdef IG_HAVE_OPENBLAS
    if (n1 <= n0 || m <= 0)
        return 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n1 - n0, k, 1.0f, x, k,
                w + (size_t)n0 * k, k, 0.0f, y + n0, ldy);
    return 0;
#else
    return IG_ENOTSUP;
#endif
}

const char *ig__cpu_simd_name(void)
{
    return IG_SIMD_NAME;
}
