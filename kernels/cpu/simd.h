#ifndef INFERGATE_KERNELS_CPU_SIMD_H
#define INFERGATE_KERNELS_CPU_SIMD_H

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
