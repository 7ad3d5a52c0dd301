/*
 * The Q8_0 kernel of gemmq8.c, written once and included once per
 * instruction set (inside its target region) with these macros defined:
 *   Q8_SUFFIX  name suffix of the generated functions (avx2, avx512)
 *   Q8_IDOT    (wq, xq) -> eight int32 lanes, each the sum of four
 *              int8 x int8 products of its block's bytes
 * The instruction set differs only in that dot product, so both give the
 * same sums (integers are exact) and the same floats.
 */

#define Q8_CAT2(a, b) a##_##b
#define Q8_CAT(a, b) Q8_CAT2(a, b)
#define Q8_FN(name) Q8_CAT(name, Q8_SUFFIX)

static inline float Q8_FN(hsum8)(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Eight blocks per step: their eight integer dot products are summed
 * into one vector of eight block sums (exact: integers), their scales
 * gathered, and one multiply-add per lane joins block j's sum to lane j's
 * running total; the ragged end goes block by block into a second vector. */
static void Q8_FN(gemmq8)(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w,
                          int m, int k, int n0, int n1)
{
    int nb = k / IG_Q8_0_BLOCK;
    size_t row = (size_t)nb * IG_Q8_0_BYTES;
    const __m256i idx = _mm256_setr_epi32(0, 34, 68, 102, 136, 170, 204, 238);
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    for (int c = n0; c < n1; c++) {
        const uint8_t *wr = w + (size_t)c * row;
        for (int a = 0; a < m; a++) {
            const int8_t *xa = xq + (size_t)a * k;
            const float *da = xd + (size_t)a * nb;
            __m256 acc = _mm256_setzero_ps(), tail = _mm256_setzero_ps();
            int b = 0;
            for (; b + 8 <= nb; b += 8) {
                const uint8_t *bl = wr + (size_t)b * IG_Q8_0_BYTES;
                __m256i v[8];
#pragma GCC unroll 8
                for (int u = 0; u < 8; u++)
                    v[u] =
                        Q8_IDOT(_mm256_loadu_si256((const __m256i *)(bl + u * IG_Q8_0_BYTES + 2)),
                                _mm256_loadu_si256((const __m256i *)(xa + (b + u) * 32)));
                __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
                __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
                __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
                __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                                                _mm256_permute2x128_si256(u0, u1, 0x31));
                __m256i g = _mm256_and_si256(
                    _mm256_i32gather_epi32((const int *)(const void *)bl, idx, 1), lo16);
                __m128i h =
                    _mm_packus_epi32(_mm256_castsi256_si128(g), _mm256_extracti128_si256(g, 1));
                __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(da + b));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc);
            }
            for (; b < nb; b++) {
                const uint8_t *bl = wr + (size_t)b * IG_Q8_0_BYTES;
                __m256i s0 = Q8_IDOT(_mm256_loadu_si256((const __m256i *)(bl + 2)),
                                     _mm256_loadu_si256((const __m256i *)(xa + b * 32)));
                float d = _cvtsh_ss((unsigned short)(bl[0] | bl[1] << 8)) * da[b];
                tail = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d), tail);
            }
            y[(size_t)a * ldy + c] = Q8_FN(hsum8)(_mm256_add_ps(acc, tail));
        }
    }
}

#undef Q8_FN
#undef Q8_CAT
#undef Q8_CAT2
