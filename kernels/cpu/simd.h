#ifndef INFERGATE_KERNELS_CPU_SIMD_H
#define INFERGATE_KERNELS_CPU_SIMD_H

#include <math.h>
#include <stddef.h>

/*
 * The vector width the CPU kernels are compiled for, chosen by the compiler
 * flags (-march=native by default): AVX-512, AVX2 with FMA, or plain scalar
 * code. Only the few primitives the kernels need are wrapped.
 */

#if defined(__AVX512F__)
#include <immintrin.h>
#define IG_SIMD_NAME "avx512"
#define IG_VL 16
typedef __m512 ig_vec_t;
#define ig_vzero() _mm512_setzero_ps()
#define ig_vload(p) _mm512_loadu_ps(p)
#define ig_vstore(p, v) _mm512_storeu_ps((p), (v))
#define ig_vset1(x) _mm512_set1_ps(x)
#define ig_vfma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define ig_vmul(a, b) _mm512_mul_ps((a), (b))
#define ig_vadd(a, b) _mm512_add_ps((a), (b))
#define ig_vsum(v) _mm512_reduce_add_ps(v)
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define IG_SIMD_NAME "avx2"
#define IG_VL 8
typedef __m256 ig_vec_t;
#define ig_vzero() _mm256_setzero_ps()
#define ig_vload(p) _mm256_loadu_ps(p)
#define ig_vstore(p, v) _mm256_storeu_ps((p), (v))
#define ig_vset1(x) _mm256_set1_ps(x)
#define ig_vfma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define ig_vmul(a, b) _mm256_mul_ps((a), (b))
#define ig_vadd(a, b) _mm256_add_ps((a), (b))
static inline float ig__vsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    __m128 s = _mm_add_ps(lo, hi);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define ig_vsum(v) ig__vsum256(v)
#else
#define IG_SIMD_NAME "scalar"
#define IG_VL 1
typedef float ig_vec_t;
#define ig_vzero() 0.0f
#define ig_vload(p) (*(p))
#define ig_vstore(p, v) (*(p) = (v))
#define ig_vset1(x) (x)
#define ig_vfma(a, b, c) ((a) * (b) + (c))
#define ig_vmul(a, b) ((a) * (b))
#define ig_vadd(a, b) ((a) + (b))
#define ig_vsum(v) (v)
#endif

#if defined(__AVX512F__)
/*
 * Horizontal sums in one fixed order, so that an output gets the same bits
 * whether it was reduced alone (edge tiles, m = 1) or as one of the sixteen
 * of a full tile: within each 128-bit chunk (l0 + l2) + (l1 + l3), then
 * (c0 + c1) + (c2 + c3) over the chunks.
 */
static inline float ig__vsum_one(__m512 v)
{
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(2, 3, 0, 1)));
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_cvtss_f32(v);
}

/* The sixteen sums of v[0..15] in one vector (lane i = sum of v[i]), in the
 * order of ig__vsum_one, with 15 vector additions instead of 16 reductions. */
static inline __m512 ig__vsum_16(const __m512 *v)
{
    __m512 w[8], x[4], y[2];
    for (int p = 0; p < 8; p++)
        w[p] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * p], v[2 * p + 1]),
                             _mm512_unpackhi_ps(v[2 * p], v[2 * p + 1]));
    for (int p = 0; p < 4; p++)
        x[p] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * p], w[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * p], w[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int p = 0; p < 2; p++)
        y[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

#if defined(__AVX512F__)
/* e^x for 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, e^r from Cephes'
 * degree-6 polynomial, then scaled by 2^n; within 2 ulp of expf. Inputs
 * are clamped to [-87.3, 88.4] (results ~1e-38 and ~2.4e38 at the ends). */
static inline __m512 ig__vexp(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654475f)),
                      _mm512_set1_ps(88.37626266f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

/* s[i] = e^(s[i] - mx) for i < n, the exponent clamped to [-87.3, 88.4];
 * returns their sum. */
static inline float ig__exp_shift_sum(float *s, int n, float mx)
{
    int i = 0;
    float sum = 0.0f;
#if defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps(), vm = _mm512_set1_ps(mx);
    for (; i + 16 <= n; i += 16) {
        __m512 e = ig__vexp(_mm512_sub_ps(_mm512_loadu_ps(s + i), vm));
        _mm512_storeu_ps(s + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 e = ig__vexp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), vm));
        _mm512_mask_storeu_ps(s + i, m, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(m, e));
        i = n;
    }
    sum = ig__vsum_one(acc);
#endif
    for (; i < n; i++) {
        float x = s[i] - mx; /* clamped as ig__vexp clamps */
        x = x < -87.33654475f ? -87.33654475f : x > 88.37626266f ? 88.37626266f : x;
        s[i] = expf(x);
        sum += s[i];
    }
    return sum;
}

/* y[i] = silu(g[i]) * u[i] = g / (1 + e^-g) * u */
static inline void ig__swiglu(float *y, const float *g, const float *u, size_t n)
{
    size_t i = 0;
#if defined(__AVX512F__)
    __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = ig__vexp(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 sv = _mm512_div_ps(gv, _mm512_add_ps(one, e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(sv, _mm512_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++)
        y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* sum a[i] * b[i], two accumulators to hide FMA latency. */
static inline float ig__dot(const float *a, const float *b, int n)
{
    ig_vec_t s0 = ig_vzero(), s1 = ig_vzero();
    int i = 0;
    for (; i + 2 * IG_VL <= n; i += 2 * IG_VL) {
        s0 = ig_vfma(ig_vload(a + i), ig_vload(b + i), s0);
        s1 = ig_vfma(ig_vload(a + i + IG_VL), ig_vload(b + i + IG_VL), s1);
    }
    for (; i + IG_VL <= n; i += IG_VL)
        s0 = ig_vfma(ig_vload(a + i), ig_vload(b + i), s0);
    float s = ig_vsum(ig_vadd(s0, s1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* y[i] += alpha * x[i] */
static inline void ig__axpy(float *y, float alpha, const float *x, int n)
{
    ig_vec_t va = ig_vset1(alpha);
    int i = 0;
    for (; i + IG_VL <= n; i += IG_VL)
        ig_vstore(y + i, ig_vfma(va, ig_vload(x + i), ig_vload(y + i)));
    for (; i < n; i++)
        y[i] += alpha * x[i];
}

#endif
