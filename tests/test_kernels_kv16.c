/*
 * The 16-bit KV cache of the CPU backend (kernels/cpu/kv16.c and the
 * attention over it), on every instruction set the CPU runs (AVX-512,
 * AVX2 + F16C, plain C, chosen through ig__cpu_set_isa):
 *   - rounding F32 to F16 / BF16 gives the bits of dtype.c's scalar
 *     conversions (round to nearest, ties to even; NaN, infinities,
 *     subnormals, the F16 overflow edge, ties both ways) at every length
 *     (the vector bodies and their tails), and widening back is exact;
 *   - kv_append into an F16 / BF16 cache then attention gives exactly the
 *     bits of attention over an F32 cache holding the rounded K and V
 *     (widening is exact, the arithmetic is the F32 path's), for block
 *     sizes below, at and above the 16 keys of a score group, 1 and 3
 *     threads;
 *   - a layout with another dtype is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "../kernels/cpu/cpu_internal.h"

#include "infergate/dtype.h"
#include "infergate/error.h"
#include "infergate/kernels.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float frand(void)
{
    return (float)((double)next32() / 4294967296.0 * 2.0 - 1.0);
}

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static int isa_list(ig_cpu_isa_t *out)
{
    int n = 0;
    for (int i = IG_CPU_ISA_SCALAR; i <= (int)ig__cpu_isa_max(); i++)
        out[n++] = (ig_cpu_isa_t)i;
    return n;
}

/* Values where a rounding goes wrong first. */
static size_t edge_values(float *v)
{
    static const uint32_t bits[] = {
        0x00000000, 0x80000000, 0x7f800000, 0xff800000, /* zeros, infinities */
        0x7fc00000, 0xffc00001, 0x7f800001, 0x7fbfffff, /* NaNs: quiet, signalling, payloads */
        0x00000001, 0x807fffff, 0x00800000,             /* F32 subnormals, smallest normal */
        0x33000000, 0x33000001, 0x337fffff, 0x33800000, /* around half the smallest F16 subnormal */
        0x387fc000, 0x387fe000, 0x38800000, 0x38801000, /* F16 subnormal / normal edge, ties */
        0x3f800000, 0x3f801000, 0x3f803000, 0x3f801001, /* 1.0 and F16 ties to even both ways */
        0x3f808000, 0x3f818000, 0x3f808001, 0xbf7f8000, /* BF16 ties both ways */
        0x477fe000, 0x477fefff, 0x477ff000, 0x47800000, /* 65504, the F16 overflow edge */
        0x7f7fffff, 0xff7f8000, 0x7f7f8000,             /* F32 max: BF16 rounds it to inf */
    };
    size_t n = sizeof(bits) / sizeof(bits[0]);
    for (size_t i = 0; i < n; i++)
        v[i] = from_bits(bits[i]);
    return n;
}

static void test_conversions_match_scalar(void **state)
{
    enum { N = 4096 };
    float *src = malloc(N * sizeof(float)), *back = malloc((N + 1) * sizeof(float));
    uint16_t *got = malloc((N + 1) * sizeof(uint16_t)), *want = malloc(N * sizeof(uint16_t));
    size_t ne = edge_values(src);
    for (size_t i = ne; i < N; i++) /* random bit patterns, and values of KV size */
        src[i] = i % 2 ? from_bits(next32() << 1 ^ next32()) : frand() * 8.0f;
    ig_cpu_isa_t isas[3];
    int nisa = isa_list(isas);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        for (size_t i = 0; i < N; i++)
            want[i] = bf16 ? ig_f32_to_bf16(src[i]) : ig_f32_to_f16(src[i]);
        for (int a = 0; a < nisa; a++) {
            assert_int_equal(ig__cpu_set_isa(isas[a]), 0);
            /* Every length up to 40 (bodies of 8 and 16 and their tails)
             * from every start, then the whole array. */
            for (size_t len = 0; len <= 40; len++) {
                for (size_t at = 0; at + len <= 80; at += 7) {
                    got[len] = 0xabcd; /* a guard past the end */
                    ig__kv16_store(got, src + at, len, bf16);
                    assert_int_equal(got[len], 0xabcd);
                    assert_memory_equal(got, want + at, len * sizeof(uint16_t));
                }
            }
            ig__kv16_store(got, src, N, bf16);
            for (size_t i = 0; i < N; i++) {
                uint32_t in;
                memcpy(&in, &src[i], 4);
                if (got[i] != want[i])
                    fail_msg("%s %s: %#010x -> %#06x, want %#06x", ig__cpu_isa_name(isas[a]),
                             bf16 ? "bf16" : "f16", in, got[i], want[i]);
            }
            /* Widening is exact: the scalar conversion's value, NaN for NaN. */
            for (size_t len = 0; len <= 40; len++) {
                back[len] = 12345.0f;
                ig__kv16_load(back, want + 3, len, bf16);
                assert_true(back[len] == 12345.0f);
                for (size_t i = 0; i < len; i++) {
                    float w = bf16 ? ig_bf16_to_f32(want[3 + i]) : ig_f16_to_f32(want[3 + i]);
                    assert_true(isnan(w) ? isnan(back[i]) : memcmp(&w, &back[i], 4) == 0);
                }
            }
        }
    }
    printf("# kv16 conversions: %d instruction sets (best %s) match the scalar rounding\n", nisa,
           ig__cpu_isa_name(ig__cpu_isa_max()));
    assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
    free(src), free(back), free(got), free(want);
}

static float *rand_buf(size_t n)
{
    float *p = malloc(n * sizeof(float) + 64);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * 2.0f;
    return p;
}

/* One paged attention batch over a 16-bit cache against the same batch over
 * an F32 cache that holds the rounded values: the same bits. */
static void check_attention(ig_dtype_t dt, int bs, int threads, int HD)
{
    enum { NSEQ = 3, NL = 2, NKV = 2, NH = 4, MAXB = 48 };
    int ctx[NSEQ] = {150, 37, 60};
    int nb = 0, tables[NSEQ * MAXB];
    for (int s = 0; s < NSEQ; s++)
        for (int b = 0; b < MAXB; b++)
            tables[s * MAXB + b] = b < (ctx[s] + bs - 1) / bs ? nb++ : 0;
    /* scatter the blocks: reverse the ids */
    for (int i = 0; i < NSEQ * MAXB; i++)
        tables[i] = nb - 1 - tables[i];
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, threads), 0);
    size_t kvn = (size_t)NL * nb * NKV * bs * HD;
    ig_kv_layout_t k16 = {NL, nb, bs, NKV, HD, malloc(kvn * 2), malloc(kvn * 2), dt};
    ig_kv_layout_t k32 = {NL, nb, bs, NKV, HD, malloc(kvn * 4), malloc(kvn * 4), IG_DTYPE_F32};
    int layer = 1, bf16 = dt == IG_DTYPE_BF16;
    for (int s = 0; s < NSEQ; s++) {
        size_t n = (size_t)ctx[s] * NKV * HD;
        float *hk = rand_buf(n), *hv = rand_buf(n);
        int *slots = malloc(ctx[s] * sizeof(int));
        for (int p = 0; p < ctx[s]; p++)
            slots[p] = tables[s * MAXB + p / bs] * bs + p % bs;
        assert_int_equal(be->kv_append(be, &k16, layer, hk, hv, slots, ctx[s]), 0);
        for (size_t i = 0; i < n; i++) { /* what the 16-bit cache holds, in F32 */
            hk[i] =
                bf16 ? ig_bf16_to_f32(ig_f32_to_bf16(hk[i])) : ig_f16_to_f32(ig_f32_to_f16(hk[i]));
            hv[i] =
                bf16 ? ig_bf16_to_f32(ig_f32_to_bf16(hv[i])) : ig_f16_to_f32(ig_f32_to_f16(hv[i]));
        }
        assert_int_equal(be->kv_append(be, &k32, layer, hk, hv, slots, ctx[s]), 0);
        free(hk), free(hv), free(slots);
    }
    int q_start[NSEQ + 1] = {0, 1, 38, 43}, ntok = q_start[NSEQ];
    float *q = rand_buf((size_t)ntok * NH * HD);
    float *o16 = malloc((size_t)ntok * NH * HD * 4), *o32 = malloc((size_t)ntok * NH * HD * 4);
    ig_attn_batch_t b = {NSEQ, ntok, q_start, ctx, tables, MAXB, 150, 37};
    float scale = 1.0f / sqrtf((float)HD);
    assert_int_equal(be->attention(be, o16, q, &k16, layer, &b, NH, scale), 0);
    assert_int_equal(be->attention(be, o32, q, &k32, layer, &b, NH, scale), 0);
    assert_memory_equal(o16, o32, (size_t)ntok * NH * HD * 4);

    ig_kv_layout_t bad = k16;
    bad.dtype = IG_DTYPE_Q8_0;
    assert_int_equal(be->attention(be, o16, q, &bad, layer, &b, NH, scale), IG_EINVAL);
    assert_int_equal(be->kv_append(be, &bad, 0, q, q, tables, 1), IG_EINVAL);
    free(k16.k), free(k16.v), free(k32.k), free(k32.v), free(q), free(o16), free(o32);
    be->destroy(be);
}

static void test_attention_over_16bit_cache(void **state)
{
    ig_cpu_isa_t isas[3];
    int nisa = isa_list(isas);
    int sizes[] = {4, 16, 32};
    for (int a = 0; a < nisa; a++) {
        assert_int_equal(ig__cpu_set_isa(isas[a]), 0);
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            /* heads of 48 read in 16 bits (AVX-512), of 40 widened first */
            check_attention(IG_DTYPE_F16, sizes[i], 1, 48);
            check_attention(IG_DTYPE_BF16, sizes[i], 3, 48);
            check_attention(IG_DTYPE_F16, sizes[i], 3, 40);
            check_attention(IG_DTYPE_BF16, sizes[i], 1, 40);
        }
    }
    assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions_match_scalar),
        cmocka_unit_test(test_attention_over_16bit_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
