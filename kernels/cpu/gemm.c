/*
 * GEMM for the CPU backend: y = x W^T, W (n, k) in nn.Linear layout.
 *
 * The own loop works on W packed once, at upload, into panels of NR output
 * columns stored k-major (packed[kk][c] = W[c][kk]), so a register tile is
 * an outer product: for each kk, NV vectors of W are loaded, each of up to
 * MR values of x is broadcast, and MR * NV accumulators get one FMA each. Every loaded W vector
 * serves MR rows of x, every accumulator already holds final outputs (no horizontal sums), and at
 * batch 1 the panels stream through memory in one pass.
 *
 * Each output is one accumulator lane that goes through kk = 0, 1, ..., k-1
 * in order: SUB FMAs from zero, that partial sum added to the output, the
 * next SUB from zero, and so on — the same operations whatever the tile
 * shape, the number of rows, the thread or the k-block (a k-block stores its
 * sums to y and the next reloads them, which is exact). So a sequence's
 * logits have the same bits alone or inside any batch.
 */
#include "cpu_internal.h"
#include "simd.h"

#include "infergate/error.h"

#include <string.h>

#ifdef IG_HAVE_OPENBLAS
#include <cblas.h>
#endif

#define NV 3            /* vectors of W per tile row */
#define NR (NV * IG_VL) /* output columns per panel: 48 with AVX-512 */

/* Rows of x per register tile: MR * NV accumulators, NV vectors of W and one
 * broadcast must fit the vector registers (32 with AVX-512, 16 with AVX2). */
#if defined(__AVX512F__)
#define MR 8
#else
#define MR 4
#endif

/* k-block: a panel's KC * NR slice (24 KiB with AVX-512) stays in L1 while
 * every row tile of x passes over it. */
#define KC 128

/* Each output sums SUB products from zero, then adds that to its running
 * sum in y: one long chain of k FMAs would lose about sqrt(k / SUB) times
 * more precision (1.2e-5 relative at k = 768 against 1e-5 allowed). */
#define SUB 32

#define LINE_FLOATS 16 /* floats per 64-byte cache line */

/* Software prefetch of the next slice of W, into L2 (locality 2), when m
 * spans at least two row tiles: without it a slice arrives in a burst that
 * stalls the first tile (64 x 32000 x 288 on one thread: about 100 GFLOP/s
 * without, 130 with, of an FMA peak of 170). With one row tile the
 * hardware prefetcher streams W better on its own. */
#define PF_MIN_TILES 2
#define PF_LOCALITY 2

static inline void ig_prefetch_l2(const float *p)
{
    __builtin_prefetch(p, 0, PF_LOCALITY);
}

int ig__gemm_panel_width(void)
{
    return NR;
}

size_t ig__gemm_packed_floats(int n, int k)
{
    return ig__panels_elems(n, k, NR);
}

void ig__gemm_pack(float *dst, const float *w, int n, int k)
{
    ig__panels_pack(dst, w, n, k, NR, sizeof(float));
}

void ig__gemm_unpack_row(float *dst, const float *packed, int k, int row)
{
    const float *panel = packed + (size_t)(row / NR) * NR * k + row % NR;
    for (int kk = 0; kk < k; kk++)
        dst[kk] = panel[(size_t)kk * NR];
}

/* c(mr, NR) (row stride ldc) = (load ? c : 0) + x(mr, kc) . panel(kc, NR),
 * x with row stride ldx, panel k-major with row stride NR; kc a multiple of
 * SUB except at the end of k. With PF, also prefetches npf cache lines per
 * kk from pf on (into L2). */
static inline __attribute__((always_inline)) void tile(float *c, int ldc, const float *x, int ldx,
                                                       const float *panel, int kc, int mr, int load,
                                                       int PF, const float *pf, int npf)
{
    for (int s0 = 0; s0 < kc; s0 += SUB) {
        int se = s0 + SUB < kc ? s0 + SUB : kc;
        /* Fully unrolled over mr and NV so that the accumulators live in
         * registers. */
        ig_vec_t acc[MR][NV];
#pragma GCC unroll 16
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                acc[a][v] = ig_vzero();
                /* Unrolled by 4: with one row (batch 1) the loop's own increments
                 * and compares were a quarter of the instructions. */
#pragma GCC unroll 4
        for (int kk = s0; kk < se; kk++) {
            if (PF)
                for (int j = 0; j < npf; j++)
                    ig_prefetch_l2(pf + ((size_t)kk * npf + j) * LINE_FLOATS);
            ig_vec_t wv[NV];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++)
                wv[v] = ig_vload(panel + (size_t)kk * NR + v * IG_VL);
#pragma GCC unroll 16
            for (int a = 0; a < mr; a++) {
                ig_vec_t xa = ig_vset1(x[(size_t)a * ldx + kk]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++)
                    acc[a][v] = ig_vfma(xa, wv[v], acc[a][v]);
            }
        }
        int add = load || s0 > 0;
#pragma GCC unroll 16
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) {
                float *cp = c + (size_t)a * ldc + v * IG_VL;
                ig_vstore(cp, add ? ig_vadd(ig_vload(cp), acc[a][v]) : acc[a][v]);
            }
    }
}

/* Constant row counts let the compiler keep the accumulators in registers. */
static void tile_rows(float *c, int ldc, const float *x, int ldx, const float *panel, int kc,
                      int mr, int load, const float *pf, int npf)
{
    switch (mr) {
#define MR_CASE(r)                                                                                 \
    case r:                                                                                        \
        if (npf > 0)                                                                               \
            tile(c, ldc, x, ldx, panel, kc, r, load, 1, pf, npf);                                  \
        else                                                                                       \
            tile(c, ldc, x, ldx, panel, kc, r, load, 0, pf, 0);                                    \
        return;
        MR_CASE(1)
#if MR > 1
        MR_CASE(2)
#endif
#if MR > 2
        MR_CASE(3)
#endif
#if MR > 3
        MR_CASE(4)
#endif
#if MR > 4
        MR_CASE(5)
#endif
#if MR > 5
        MR_CASE(6)
#endif
#if MR > 6
        MR_CASE(7)
#endif
#if MR > 7
        MR_CASE(8)
#endif
#undef MR_CASE
    default:
        return;
    }
}

void ig__gemm_own(float *y, int ldy, const float *x, const float *packed, int m, int k, int n,
                  int n0, int n1)
{
    /* While the row tiles work on one KC * NR slice of W, the first of them
     * prefetch the next slice (the memory right after it, in the same panel
     * or the next) into L2, spread over their iterations: the slice then
     * arrives at a steady rate instead of stalling the first tile. */
    const int slice_lines = KC * NR / LINE_FLOATS;
    int tiles = (m + MR - 1) / MR;
    for (int p = n0 / NR; p * NR < n1; p++) {
        const float *panel = packed + (size_t)p * NR * k;
        int col = p * NR, ncols = n - col < NR ? n - col : NR;
        int last = (p + 1) * NR >= n1; /* the next slice of the last panel is not ours */
        for (int k0 = 0; k0 < k; k0 += KC) {
            int kc = k - k0 < KC ? k - k0 : KC;
            const float *slice = panel + (size_t)k0 * NR;
            int npf = (slice_lines + tiles * kc - 1) / (tiles * kc);
            if ((last && k0 + kc >= k) || tiles < PF_MIN_TILES)
                npf = 0;
            for (int i = 0, t = 0; i < m; i += MR, t++) {
                int mr = m - i < MR ? m - i : MR;
                float *yt = y + (size_t)i * ldy + col;
                const float *xt = x + (size_t)i * k + k0;
                int tpf = t * kc * npf < slice_lines ? npf : 0;
                const float *pf = slice + (size_t)kc * NR + (size_t)t * kc * npf * LINE_FLOATS;
                if (ncols == NR) {
                    tile_rows(yt, ldy, xt, k, slice, kc, mr, k0 > 0, pf, tpf);
                } else {
                    /* The last panel's padding columns go to a scratch tile
                     * (the same operations, so the same bits). */
                    float tmp[MR * NR] = {0};
                    if (k0 > 0)
                        for (int a = 0; a < mr; a++)
                            memcpy(tmp + a * NR, yt + (size_t)a * ldy, ncols * sizeof(float));
                    tile_rows(tmp, NR, xt, k, slice, kc, mr, k0 > 0, pf, 0);
                    for (int a = 0; a < mr; a++)
                        memcpy(yt + (size_t)a * ldy, tmp + a * NR, ncols * sizeof(float));
                }
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

int ig__gemm_blas_packed(float *y, int ldy, const float *x, const float *packed, int m, int k,
                         int n, int n0, int n1)
{
#ifdef IG_HAVE_OPENBLAS
    /* A panel is a (k, NR) row-major matrix: W^T of its columns. */
    for (int p = n0 / NR; p * NR < n1 && m > 0; p++) {
        int col = p * NR, ncols = n - col < NR ? n - col : NR;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, ncols, k, 1.0f, x, k,
                    packed + (size_t)p * NR * k, NR, 0.0f, y + col, ldy);
    }
    return 0;
#else
    return IG_ENOTSUP;
#endif
}

const char *ig__cpu_simd_name(void)
{
    return IG_SIMD_NAME;
}
