/*
 * Q4_0, Q4_K and Q6_K against llama.cpp's own gguf-py (gguf.quants), the
 * reference implementation of GGUF's formats outside ggml's C:
 *   - blocks we quantize (random rows, a row of zeros, rows whose largest
 *     weight is positive or negative, values on the clamp and on exact
 *     halves), written in a GGUF file by our writer, dequantize in gguf-py
 *     to the same floats, bit for bit, as ig_dtype_to_f32 gives (the
 *     dequantization is exact: an F16 scale times an integer of 4 bits);
 *   - the same F32 rows quantized by gguf-py give the same scales and the
 *     same nibbles, except where x / d + 8.5 lies within the F32 rounding
 *     of an integer: gguf-py rounds in float64, ggml and we in float32
 *     (gguf-py's own comment: "Q4_0's reference rounding is cursed"). There
 *     the nibbles may differ by one; such places are counted and printed.
 *   - random Q4_K and Q6_K super-blocks (any bytes are valid blocks; the
 *     F16 scales are drawn finite) dequantize to the same floats as
 *     gguf-py's. ggml's arithmetic is exact up to one rounding (Q4_K: the
 *     subtraction of the min; Q6_K: the product with q), which both do in
 *     F32 in the same order. gguf-py writes no K-quants: there is nothing
 *     to compare our (absent) quantizer with.
 * Exact comparison is the tolerance the format allows here: no arithmetic
 * of ours stands between the bytes and the values beyond those roundings.
 * Skipped (77) without gguf-py ($LLAMACPP_SRC, default /work/peers/llama.cpp)
 * or NumPy for $IG_PYTHON (default /usr/bin/python3).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "files.h"
#include "skip.h"
#include "xorshift.h"

#include "infergate/dtype.h"
#include "infergate/gguf.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROWS 12
#define COLS 256
#define KROWS 6
#define KCOLS 512

static char src[1024], python[1024];

/* Rows 0..7 random; 8 zeros; 9 the largest weight positive; 10 weights on
 * exact halves of d (ties of x / d + 8.5) and the clamp; 11 tiny values. */
static void fill(float *x)
{
    uint64_t rng = 0x51f15e5dull;
    float *r = ig_xs_buf(&rng, (size_t)ROWS * COLS, 1.0f);
    memcpy(x, r, (size_t)ROWS * COLS * sizeof(float));
    free(r);
    for (int i = 0; i < COLS; i++) {
        x[8 * COLS + i] = 0.0f;
        x[9 * COLS + i] = fabsf(x[9 * COLS + i]) * (i % 32 == 5 ? 3.0f : 1.0f);
        /* m = -16 at i % 32 == 0: d = 2; odd values give x / d + 8.5 on
         * integers (exact in both roundings); 16 is clamped to 7 d. */
        x[10 * COLS + i] = i % 32 == 0 ? -16.0f : i % 32 == 31 ? 16.0f : (float)(2 * (i % 16) - 15);
        x[11 * COLS + i] = x[11 * COLS + i] * 1e-30f;
    }
}

static void *slurp(const char *dir, const char *name, size_t want)
{
    char p[4200];
    size_t len = 0;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    void *b = ig_tf_read(p, &len);
    if (b == NULL || len != want)
        fail_msg("%s: %zu bytes, expected %zu", p, b ? len : 0, want);
    return b;
}

static void test_same_as_ggufpy(void **state)
{
    char dir[4096], path[4200], cmd[12000], err[256];
    assert_int_equal(ig_tf_mkdtemp(dir, sizeof(dir)), 0);
    float *x = malloc((size_t)ROWS * COLS * sizeof(float));
    fill(x);
    size_t qb = ig_dtype_bytes(IG_DTYPE_Q4_0, (size_t)ROWS * COLS);
    unsigned char *q = malloc(qb);
    ig_dtype_from_f32(q, IG_DTYPE_Q4_0, x, (size_t)ROWS * COLS);

    /* K-quant super-blocks: random bytes, finite F16 scales of either sign */
    uint64_t rng = 0xb5ad4eceda1ce2a9ull;
    size_t kb4 = ig_dtype_bytes(IG_DTYPE_Q4_K, (size_t)KROWS * KCOLS),
           kb6 = ig_dtype_bytes(IG_DTYPE_Q6_K, (size_t)KROWS * KCOLS);
    unsigned char *k4 = malloc(kb4), *k6 = malloc(kb6);
    for (size_t i = 0; i < kb4; i++)
        k4[i] = (unsigned char)(ig_xs_next(&rng) >> 56);
    for (size_t i = 0; i < kb6; i++)
        k6[i] = (unsigned char)(ig_xs_next(&rng) >> 56);
    for (size_t b = 0; b < (size_t)KROWS * KCOLS / IG_QK_K; b++) {
        float u = ig_xs_float(&rng) * 0.01f, v = ig_xs_float(&rng) * 0.01f;
        uint16_t hu = ig_f32_to_f16(u), hv = ig_f32_to_f16(v);
        memcpy(k4 + b * IG_Q4_K_BYTES, &hu, 2);
        memcpy(k4 + b * IG_Q4_K_BYTES + 2, &hv, 2);
        memcpy(k6 + b * IG_Q6_K_BYTES + 208, &hu, 2);
    }

    ig_gguf_writer_t *w;
    int64_t ne[2] = {COLS, ROWS}, nek[2] = {KCOLS, KROWS};
    snprintf(path, sizeof(path), "%s/q4.gguf", dir);
    assert_int_equal(ig_gguf_writer_init(&w), 0);
    assert_int_equal(ig_gguf_put_str(w, "general.architecture", "llama", 5), 0);
    assert_int_equal(ig_gguf_add_tensor(w, "q4_0", IG_DTYPE_Q4_0, 2, ne), 0);
    assert_int_equal(ig_gguf_add_tensor(w, "source", IG_DTYPE_F32, 2, ne), 0);
    assert_int_equal(ig_gguf_add_tensor(w, "q4k", IG_DTYPE_Q4_K, 2, nek), 0);
    assert_int_equal(ig_gguf_add_tensor(w, "q6k", IG_DTYPE_Q6_K, 2, nek), 0);
    if (ig_gguf_writer_begin(w, path, err, sizeof(err)) != 0 ||
        ig_gguf_writer_write(w, q, qb, err, sizeof(err)) != 0 ||
        ig_gguf_writer_write(w, x, (size_t)ROWS * COLS * sizeof(float), err, sizeof(err)) != 0 ||
        ig_gguf_writer_write(w, k4, kb4, err, sizeof(err)) != 0 ||
        ig_gguf_writer_write(w, k6, kb6, err, sizeof(err)) != 0 ||
        ig_gguf_writer_close(w, err, sizeof(err)) != 0)
        fail_msg("writing %s: %s", path, err);
    snprintf(cmd, sizeof(cmd),
             "'%s' '%s/tests/peers/ggufpy_quant.py' --gguf-py '%s/gguf-py' --in '%s' --out '%s' "
             "--type Q4_0",
             python, IG_SOURCE_DIR, src, path, dir);
    assert_int_equal(system(cmd), 0);

    /* gguf-py's dequantization of our blocks: the same floats */
    float *deq = slurp(dir, "q4_0.deq", (size_t)ROWS * COLS * sizeof(float));
    float *mine = malloc((size_t)ROWS * COLS * sizeof(float));
    ig_dtype_to_f32(mine, q, IG_DTYPE_Q4_0, (size_t)ROWS * COLS);
    assert_memory_equal(deq, mine, (size_t)ROWS * COLS * sizeof(float));

    /* gguf-py's quantization of the same rows: the same bytes but near ties */
    unsigned char *theirs = slurp(dir, "source.q", qb);
    int near = 0;
    for (size_t b = 0; b < (size_t)ROWS * COLS / 32; b++) {
        const unsigned char *o = q + b * IG_Q4_0_BYTES, *t = theirs + b * IG_Q4_0_BYTES;
        assert_memory_equal(o, t, 2); /* the scale */
        uint16_t h;
        memcpy(&h, o, 2);
        double d = ig_f16_to_f32(h);
        float amax = 0.0f, m = 0.0f;
        for (int i = 0; i < 32; i++)
            if (amax < fabsf(x[b * 32 + i]))
                amax = fabsf(x[b * 32 + i]), m = x[b * 32 + i];
        double inv = m != 0.0f ? 1.0 / (double)(m / -8.0f) : 0.0;
        for (int i = 0; i < 32; i++) {
            int j = i % 16, sh = i < 16 ? 0 : 4;
            int a = o[2 + j] >> sh & 15, c = t[2 + j] >> sh & 15;
            if (a == c)
                continue;
            /* Within the F32 rounding (2^-19 at these magnitudes) of an integer. */
            double v = (double)x[b * 32 + i] * inv + 8.5;
            if (abs(a - c) != 1 || fabs(v - nearbyint(v)) > 0x1p-18)
                fail_msg("block %zu weight %d (%.9g, d %.9g): nibble %d, gguf-py %d", b, i,
                         x[b * 32 + i], d, a, c);
            near++;
        }
    }
    printf("# Q4_0: %d of %d weights quantized one step apart from gguf-py, at float64 ties\n",
           near, ROWS * COLS);

    /* the K-quants: gguf-py's dequantization, bit for bit */
    size_t kn = (size_t)KROWS * KCOLS;
    float *kmine = malloc(kn * sizeof(float));
    float *k4d = slurp(dir, "q4k.deq", kn * sizeof(float));
    ig_dtype_to_f32(kmine, k4, IG_DTYPE_Q4_K, kn);
    assert_memory_equal(k4d, kmine, kn * sizeof(float));
    float *k6d = slurp(dir, "q6k.deq", kn * sizeof(float));
    ig_dtype_to_f32(kmine, k6, IG_DTYPE_Q6_K, kn);
    assert_memory_equal(k6d, kmine, kn * sizeof(float));
    free(k4), free(k6), free(kmine), free(k4d), free(k6d);
    free(x), free(q), free(deq), free(mine), free(theirs);
    ig_tf_rmtree(dir);
}

int main(void)
{
    const char *s = getenv("LLAMACPP_SRC"), *p = getenv("IG_PYTHON");
    snprintf(src, sizeof(src), "%s", s && *s ? s : "/work/peers/llama.cpp");
    snprintf(python, sizeof(python), "%s", p && *p ? p : "/usr/bin/python3");
    char probe[4096], qp[1100];
    snprintf(qp, sizeof(qp), "%s/gguf-py/gguf/quants.py", src);
    snprintf(probe, sizeof(probe), "'%s' -c 'import numpy' 2>/dev/null", python);
    if (access(qp, R_OK) != 0 || system(probe) != 0) {
        printf("# SKIP: needs gguf-py in $LLAMACPP_SRC and NumPy for $IG_PYTHON\n");
        return IG_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_ggufpy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
