/*
 * The register tile of the 16-bit GEMM (gemm16.c), written once and
 * included once per instruction set with these macros defined:
 *   T16_SUFFIX     name suffix of the generated functions (avx512, avx2)
 *   T16_V          the float vector type, T16_VL its lanes
 *   T16_NV         vectors per panel row (T16_NV * T16_VL == IG_GEMM16_NR)
 *   T16_MR         rows of x per register tile
 *   T16_ZERO(), T16_SET1(x), T16_FMA(a, b, c), T16_ADD(a, b),
 *   T16_LOADF(p), T16_STOREF(p, v)
 *   T16_BF16(p), T16_F16(p)  T16_VL 16-bit weights at p widened to floats
 * Every output is one lane that sums SUB products from zero, then adds that
 * partial to its running value in y: the same operations whatever the tile's
 * row count, so a row of x gets the same bits alone or in a batch.
 */

#define T16_CAT2(a, b) a##_##b
#define T16_CAT(a, b) T16_CAT2(a, b)
#define T16_FN(name) T16_CAT(name, T16_SUFFIX)

static inline __attribute__((always_inline)) void T16_FN(tile16)(float *c, int ldc, const float *x,
                                                                 int ldx, const uint16_t *panel,
                                                                 int kc, int mr, int load, int bf16,
                                                                 int pf)
{
    for (int s0 = 0; s0 < kc; s0 += G16_SUB) {
        int se = s0 + G16_SUB < kc ? s0 + G16_SUB : kc;
        T16_V acc[T16_MR][T16_NV];
#pragma GCC unroll 16
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (int v = 0; v < T16_NV; v++)
                acc[a][v] = T16_ZERO();
#pragma GCC unroll 4
        for (int kk = s0; kk < se; kk++) {
            T16_V wv[T16_NV];
            const uint16_t *wp = panel + (size_t)kk * IG_GEMM16_NR;
            /* A tile of one or two rows streams the weights from memory
             * faster than it uses them: ask for them G16_PREFETCH ahead
             * (pf: a call of at most 2 rows where that pays,
             * ig__cpu_stream_prefetch). */
            if (pf)
                _mm_prefetch((const char *)(wp + G16_PREFETCH), _MM_HINT_T0);
#pragma GCC unroll 4
            for (int v = 0; v < T16_NV; v++)
                wv[v] = bf16 ? T16_BF16(wp + v * T16_VL) : T16_F16(wp + v * T16_VL);
#pragma GCC unroll 16
            for (int a = 0; a < mr; a++) {
                T16_V xa = T16_SET1(x[(size_t)a * ldx + kk]);
#pragma GCC unroll 4
                for (int v = 0; v < T16_NV; v++)
                    acc[a][v] = T16_FMA(xa, wv[v], acc[a][v]);
            }
        }
        int add = load || s0 > 0;
#pragma GCC unroll 16
        for (int a = 0; a < mr; a++)
#pragma GCC unroll 4
            for (int v = 0; v < T16_NV; v++) {
                float *cp = c + (size_t)a * ldc + v * T16_VL;
                T16_STOREF(cp, add ? T16_ADD(T16_LOADF(cp), acc[a][v]) : acc[a][v]);
            }
    }
}

/* Constant row counts and dtype keep the accumulators in registers. */
static void T16_FN(tile16_rows)(float *c, int ldc, const float *x, int ldx, const uint16_t *panel,
                                int kc, int mr, int load, int bf16, int pf)
{
    switch (mr * 2 + (bf16 != 0)) {
#define T16_CASE(r)                                                                                \
    case 2 * r:                                                                                    \
        T16_FN(tile16)(c, ldc, x, ldx, panel, kc, r, load, 0, pf);                                 \
        return;                                                                                    \
    case 2 * r + 1:                                                                                \
        T16_FN(tile16)(c, ldc, x, ldx, panel, kc, r, load, 1, pf);                                 \
        return;
        T16_CASE(1)
#if T16_MR > 1
        T16_CASE(2)
#endif
#if T16_MR > 2
        T16_CASE(3)
#endif
#if T16_MR > 3
        T16_CASE(4)
#endif
#if T16_MR > 4
        T16_CASE(5)
#endif
#if T16_MR > 5
        T16_CASE(6)
#endif
#if T16_MR > 6
        T16_CASE(7)
#endif
#if T16_MR > 7
        T16_CASE(8)
#endif
#undef T16_CASE
    default:
        return;
    }
}

static void T16_FN(gemm16)(float *y, int ldy, const float *x, const uint16_t *packed, int bf16,
                           int m, int k, int n, int n0, int n1)
{
    int pf = m <= 2 && ig__cpu_stream_prefetch();
    for (int p = n0 / IG_GEMM16_NR; p * IG_GEMM16_NR < n1; p++) {
        const uint16_t *panel = packed + (size_t)p * IG_GEMM16_NR * k;
        int col = p * IG_GEMM16_NR, ncols = n - col < IG_GEMM16_NR ? n - col : IG_GEMM16_NR;
        for (int k0 = 0; k0 < k; k0 += G16_KC) {
            int kc = k - k0 < G16_KC ? k - k0 : G16_KC;
            const uint16_t *slice = panel + (size_t)k0 * IG_GEMM16_NR;
            for (int i = 0; i < m; i += T16_MR) {
                int mr = m - i < T16_MR ? m - i : T16_MR;
                float *yt = y + (size_t)i * ldy + col;
                const float *xt = x + (size_t)i * k + k0;
                if (ncols == IG_GEMM16_NR) {
                    T16_FN(tile16_rows)(yt, ldy, xt, k, slice, kc, mr, k0 > 0, bf16, pf);
                } else {
                    /* The last panel's padding columns go to a scratch tile
                     * (the same operations, so the same bits). */
                    float tmp[T16_MR * IG_GEMM16_NR];
                    memset(tmp, 0, sizeof(tmp));
                    if (k0 > 0)
                        for (int a = 0; a < mr; a++)
                            memcpy(tmp + a * IG_GEMM16_NR, yt + (size_t)a * ldy,
                                   ncols * sizeof(float));
                    T16_FN(tile16_rows)(tmp, IG_GEMM16_NR, xt, k, slice, kc, mr, k0 > 0, bf16, pf);
                    for (int a = 0; a < mr; a++)
                        memcpy(yt + (size_t)a * ldy, tmp + a * IG_GEMM16_NR, ncols * sizeof(float));
                }
            }
        }
    }
}

#undef T16_FN
#undef T16_CAT
#undef T16_CAT2

/* The includer defines these afresh for each instruction set. */
#undef T16_SUFFIX
#undef T16_V
#undef T16_VL
#undef T16_NV
#undef T16_MR
#undef T16_ZERO
#undef T16_SET1
#undef T16_FMA
#undef T16_ADD
#undef T16_LOADF
#undef T16_STOREF
#undef T16_BF16
#undef T16_F16
