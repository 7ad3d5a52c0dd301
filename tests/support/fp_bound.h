/*
 * Floating-point error bounds for tests that compare a float computation
 * with a double-precision reference. A tolerance tuned on one machine fails
 * on the next (another BLAS, another SIMD width, another summation order);
 * a bound derived from the computation holds for every correct order on
 * every machine and still fails a wrong kernel by orders of magnitude.
 *
 * The bounds are the textbook ones (Higham, "Accuracy and Stability of
 * Numerical Algorithms", 2nd ed., ch. 2-3), with u = IG_F32_U = 2^-24 the
 * unit roundoff of f32 in round-to-nearest:
 *   - one operation (+ - * / sqrt, or a store to float): |err| <= u |exact|;
 *   - a sum of n terms x_i * w_i (+ a bias), in ANY order and grouping
 *     (sequential, blocked by k, SIMD lanes reduced by a tree, split-k, FMA
 *     or not): |err| <= gamma_n * sum |x_i w_i|, gamma_n = n u / (1 - n u),
 *     n counting the terms (a bias is one more). FMA only removes roundings.
 * A test computes the magnitude mag[i] (sum |x_i w_i| in double, or |exact|
 * for one operation) and a count of roundings `units`, and accepts
 *   |got[i] - ref[i]| <= IG_BOUND_C * units * u * mag[i] + floor.
 * IG_BOUND_C = 2 covers the second-order terms the count leaves out
 * (gamma_n's 1 / (1 - n u), (1 + u)^2 - 1 = 2u + u^2) and the reference's
 * own error (double: n * 2^-53 of the same magnitude). The theorem itself
 * needs 1, so a path that fails 2 is wrong, not unlucky. `floor` covers
 * underflow: each product that lands in the subnormal range is off by up to
 * half of FLT_TRUE_MIN = 2^-149 absolute, not relative (Higham §2.1), so a
 * k-term sum takes floor = k * 2^-149 = ig_f32_floor(k).
 *
 * Include after <cmocka.h>.
 */
#ifndef IG_TESTS_FP_BOUND_H
#define IG_TESTS_FP_BOUND_H

#include <math.h>
#include <stddef.h>
#include <stdlib.h>

#include "infergate/model.h"

#define IG_F32_U 0x1p-24 /* unit roundoff of f32, round to nearest */
#define IG_BOUND_C 2.0

/* Absolute floor for a computation of n roundings that may underflow. */
static inline double ig_f32_floor(double n)
{
    return n * 0x1p-149;
}

/* The allowed error of element i: IG_BOUND_C * units * u * mag + floor. */
static inline double ig_bound_of(double mag, double units, double floor)
{
    return IG_BOUND_C * units * IG_F32_U * mag + floor;
}

/* The largest |got[i] - ref[i]| / bound_i over n elements, with its index in
 * *at; mag may be NULL for a purely absolute bound (floor alone). NaN in got
 * counts as infinitely wrong. A result <= 1 means every element is within
 * its bound. */
static inline double ig_bound_worst(const float *got, const double *ref, const double *mag,
                                    size_t n, double units, double floor, size_t *at)
{
    double worst = 0;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double b = ig_bound_of(mag ? mag[i] : 0.0, units, floor);
        double e = fabs((double)got[i] - ref[i]);
        double r = isnan(e) ? INFINITY : e == 0 ? 0 : b > 0 ? e / b : INFINITY;
        if (r > worst) {
            worst = r;
            *at = i;
        }
    }
    return worst;
}

/* y = x W^T + bias (bias may be NULL) in double, and mag = sum |x w| +
 * |bias| per output: the reference of a GEMM test and the scale of its
 * k-term error bound. x is (m, k), w is (n, k), both row-major. */
static inline void ig_ref_gemm(double *y, double *mag, const float *x, const float *w,
                               const float *bias, int m, int n, int k)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = bias ? bias[j] : 0.0, a = bias ? fabs(bias[j]) : 0.0;
            for (int t = 0; t < k; t++) {
                double p = (double)x[(size_t)i * k + t] * w[(size_t)j * k + t];
                s += p;
                a += fabs(p);
            }
            y[(size_t)i * n + j] = s;
            mag[(size_t)i * n + j] = a;
        }
}

/* The largest |a[i] - b[i]| over n elements; NaN when any difference is
 * NaN (a NaN in either array), so that no bound check passes on it. */
static inline double ig_max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d))
            return d;
        if (d > m)
            m = d;
    }
    return m;
}

/* Fails the test when an element is beyond its bound, naming the worst one.
 * IG_TEST_SHOW_ERR=1 prints each check's worst ratio to its bound. */
static inline void ig_assert_within_bound(const float *got, const double *ref, const double *mag,
                                          size_t n, double units, double floor, const char *what)
{
    size_t at;
    double worst = ig_bound_worst(got, ref, mag, n, units, floor, &at);
    if (getenv("IG_TEST_SHOW_ERR") != NULL)
        print_message("%s: worst error %.3g of its bound\n", what, worst);
    if (!(worst <= 1.0))
        fail_msg("%s: element %zu is %.9g, reference %.9g: error %.3g > bound %.3g "
                 "(%g roundings of %.3g)",
                 what, at, got[at], ref[at], fabs((double)got[at] - ref[at]),
                 ig_bound_of(mag ? mag[at] : 0.0, units, floor), units, mag ? mag[at] : 0.0);
}

/*
 * BF16 activations (kernels/cpu/gemm16.c's vdpbf16ps path): x is rounded to
 * BF16 (8 significant bits, unit roundoff IG_BF16_U = 2^-8) before the
 * products, so each term x_i w_i becomes x_i (1 + d_i) w_i with
 * |d_i| <= 2^-8: the sum moves by at most 2^-8 * sum |x_i w_i| before the
 * F32 sum's own gamma_k (on terms 1 + 2^-8 as large, second order). In
 * `units` of u that is k + 2^-8 / 2^-24 = k + 65536, under the same
 * IG_BOUND_C. The instruction also treats BF16 subnormals as zero and
 * flushes subnormal sums: each x below 2^-126 loses at most 2^-126 |w_i|
 * and each of the k additions at most 2^-126, hence the floor
 * k * 2^-126 * (1 + max |w|).
 */
#define IG_BF16_U 0x1p-8

static inline double ig_bf16x_units(double k)
{
    return k + IG_BF16_U / IG_F32_U;
}

static inline double ig_bf16x_floor(double k, double wmax)
{
    return k * 0x1p-126 * (1 + wmax);
}

/*
 * The error budget of a whole forward pass in f32 against NumPy in float64
 * (which reads the same stored weights, so bf16 / f16 storage adds no error:
 * both sides compute with the same rounded values). Along the path from the
 * embedding to a logit, each layer rounds an element through RMSNorm
 * (dim / 2 + 6, see test_kernels_cpu_ops), the q/k/v GEMMs (dim terms), RoPE
 * (3), the scores (head_dim + 2), softmax and the weighted sum over the
 * context (2 ctx + 3 + EXP 6), the output projection (heads * head_dim),
 * a residual add (1), RMSNorm again, gate/up (dim), SwiGLU (10), down
 * (intermediate) and an add: first order, the roundings of a chain add up.
 * Then the final RMSNorm, lm_head (dim) and the reference's store to f32
 * (1). Each GEMM's error is relative to sum |x w|, not to its result; the
 * scale a caller passes is 1 + max |logit|, as every block's input is renormalised to
 * RMS 1 and the weights are of the size their fan-in gives. Unlike a kernel's
 * bound this is not a theorem (it assumes the layers do not amplify
 * relative error), so test_engine_reference prints the measured error beside it: about
 * 0.1% of the budget on every model here (see docs/engine.md). */
static inline double ig_bound_forward(const ig_model_config_t *c, int max_ctx, double scale)
{
    double dim = c->hidden_size, inner = (double)c->num_attention_heads * c->head_dim;
    double rms = dim / 2 + 6;
    double layer = rms + dim + 3 + (c->head_dim + 2) + (2.0 * max_ctx + 3 + 6) + inner + 1 + rms +
                   dim + 10 + c->intermediate_size + 1;
    double units = c->num_hidden_layers * layer + rms + dim + 1;
    return ig_bound_of(scale, units, 0);
}

/* The same when every GEMM rounds its input to BF16 (a BF16 model on the
 * vdpbf16ps path): along the chain each layer has four GEMM inputs rounded
 * (q/k/v, the output projection, gate/up, down) and lm_head one more, each
 * adding 2^-8 of its sum |x w| (ig_bf16x_units), which the scale bounds as
 * above. */
static inline double ig_bound_forward_bf16x(const ig_model_config_t *c, int max_ctx, double scale)
{
    double gemms = 4.0 * c->num_hidden_layers + 1;
    return ig_bound_forward(c, max_ctx, scale) +
           ig_bound_of(scale, gemms * (IG_BF16_U / IG_F32_U), 0);
}

#endif
