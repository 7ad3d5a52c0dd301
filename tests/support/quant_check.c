/* The quantized GEMM tests' shared checks (quant_check.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "quant_check.h"

#include "fp_bound.h"
#include "xorshift.h"

#include "../../kernels/cpu/cpu_internal.h"
#include "infergate/dtype.h"
#include "infergate/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ig_tq_every_isa(const int (*shapes)[3], int nshapes, ig_tq_check_fn check)
{
    for (int t = 1; t <= 3; t += 2) {
        ig_backend_t *be;
        assert_int_equal(ig_backend_cpu_create(&be, t), 0);
        for (int i = IG_CPU_ISA_SCALAR; i <= (int)ig__cpu_isa_max(); i++) {
            assert_int_equal(ig__cpu_set_isa((ig_cpu_isa_t)i), 0);
            for (int s = 0; s < nshapes; s++)
                check(be, shapes[s][0], shapes[s][1], shapes[s][2],
                      ig__cpu_isa_name((ig_cpu_isa_t)i));
        }
        be->destroy(be);
    }
    assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
}

void ig_tq_batch_invariant(const ig_tensor_t *t, const float *x, int m)
{
    int n = (int)t->shape[0], k = (int)t->shape[1];
    float *all = malloc((size_t)m * n * 4), *part = malloc((size_t)m * n * 4),
          *first = malloc((size_t)m * n * 4);
    assert_true(all != NULL && part != NULL && first != NULL);
    for (int i = IG_CPU_ISA_SCALAR; i <= (int)ig__cpu_isa_max(); i++) {
        assert_int_equal(ig__cpu_set_isa((ig_cpu_isa_t)i), 0);
        ig_backend_t *be1, *be2;
        ig_weight_t W1, W2;
        assert_int_equal(ig_backend_cpu_create(&be1, 1), 0);
        assert_int_equal(ig_backend_cpu_create(&be2, 2), 0);
        assert_int_equal(be1->upload_weight(be1, t, &W1), 0);
        assert_int_equal(be2->upload_weight(be2, t, &W2), 0);
        assert_int_equal(be1->matmul(be1, all, x, &W1, NULL, m), 0);
        for (int r = 0; r < m; r++) {
            assert_int_equal(be1->matmul(be1, part, x + (size_t)r * k, &W1, NULL, 1), 0);
            assert_memory_equal(part, all + (size_t)r * n, (size_t)n * 4);
        }
        assert_int_equal(be2->matmul(be2, part, x, &W2, NULL, m), 0);
        assert_memory_equal(part, all, (size_t)m * n * 4);
        /* one order of float operations per output on every instruction set */
        if (i == IG_CPU_ISA_SCALAR)
            memcpy(first, all, (size_t)m * n * 4);
        else
            assert_memory_equal(all, first, (size_t)m * n * 4);
        be1->free_weight(be1, &W1);
        be2->free_weight(be2, &W2);
        be1->destroy(be1);
        be2->destroy(be2);
    }
    assert_int_equal(ig__cpu_set_isa(ig__cpu_isa_max()), 0);
    free(all), free(part), free(first);
}

void ig_tq_quantize_x(const float *x, int m, int k, int8_t *xq, float *xs, float *xdq)
{
    int nb = k / 32;
    ig__q8_quantize_rows(xq, xs, x, m, k);
    for (int r = 0; r < m; r++)
        for (int i = 0; i < k; i++)
            xdq[(size_t)r * k + i] = xs[(size_t)r * nb + i / 32] * xq[(size_t)r * k + i];
}

void ig_tq_check_blocks32(ig_backend_t *be, ig_dtype_t dt, uint64_t *rng, int m, int n, int k,
                          const char *label)
{
    int nb = k / 32;
    float *x = ig_xs_buf(rng, (size_t)m * k, 1.0f), *w = ig_xs_buf(rng, (size_t)n * k, 1.0f);
    size_t wb = ig_dtype_bytes(dt, (size_t)n * k);
    unsigned char *wq = malloc(wb);
    float *wd = malloc((size_t)n * k * sizeof(float)), *xdq = malloc((size_t)m * k * 4);
    int8_t *xq = malloc((size_t)m * k);
    float *xs = malloc((size_t)m * nb * sizeof(float));
    ig_dtype_from_f32(wq, dt, w, (size_t)n * k);
    ig_dtype_to_f32(wd, wq, dt, (size_t)n * k);
    ig_tq_quantize_x(x, m, k, xq, xs, xdq);
    size_t ny = (size_t)m * n;
    float *y = malloc(ny * sizeof(float));
    double *ref = malloc(ny * 8), *mag = malloc(ny * 8), *exact = malloc(ny * 8),
           *qerr = malloc(ny * 8);
    for (int r = 0; r < m; r++)
        for (int c = 0; c < n; c++) {
            double s = 0, a = 0, e = 0, qe = 0;
            for (int i = 0; i < k; i++) {
                double xv = x[(size_t)r * k + i], xd = xdq[(size_t)r * k + i];
                double wv = w[(size_t)c * k + i], wdv = wd[(size_t)c * k + i];
                s += xd * wdv;
                a += fabs(xd * wdv);
                e += xv * wv;
                qe += fabs(xv) * fabs(wv - wdv) + fabs(wdv) * fabs(xv - xd);
            }
            ref[(size_t)r * n + c] = s, mag[(size_t)r * n + c] = a;
            exact[(size_t)r * n + c] = e, qerr[(size_t)r * n + c] = qe;
        }
    ig_tensor_t t = {dt, wq, 2, {n, k}};
    ig_weight_t W;
    assert_int_equal(be->upload_weight(be, &t, &W), 0);
    memset(y, 0xff, ny * sizeof(float));
    assert_int_equal(be->matmul(be, y, x, &W, NULL, m), 0);
    char what[160];
    snprintf(what, sizeof(what), "%s %s m=%d n=%d k=%d", label, ig_dtype_name(dt), m, n, k);
    /* scale product, conversion, fma, nb additions */
    ig_assert_within_bound(y, ref, mag, ny, nb + 3, ig_f32_floor(k), what);
    for (size_t i = 0; i < ny; i++) {
        double b = qerr[i] + ig_bound_of(mag[i], nb + 3, ig_f32_floor(k));
        if (!(fabs(y[i] - exact[i]) <= b))
            fail_msg("%s: element %zu: %.9g vs exact %.9g beyond the quantization bound %.3g", what,
                     i, y[i], exact[i], b);
    }
    int id = n / 2;
    float *row = malloc((size_t)k * sizeof(float));
    assert_int_equal(be->embed(be, row, &W, &id, 1), 0);
    assert_memory_equal(row, wd + (size_t)id * k, (size_t)k * sizeof(float));
    free(row);
    be->free_weight(be, &W);
    free(x), free(w), free(wq), free(wd), free(xdq), free(xq), free(xs), free(y);
    free(ref), free(mag), free(exact), free(qerr);
}

void ig_tq_check_round_trip32(ig_dtype_t dt, uint64_t *rng, double levels, double steps)
{
    float *w = ig_xs_buf(rng, 4096, 1.0f), *back = malloc(4096 * sizeof(float));
    unsigned char *q = malloc(ig_dtype_bytes(dt, 4096));
    assert_non_null(back);
    assert_non_null(q);
    ig_dtype_from_f32(q, dt, w, 4096);
    ig_dtype_to_f32(back, q, dt, 4096);
    for (int b = 0; b < 4096 / 32; b++) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(w[b * 32 + i]));
        double dd = amax / levels, bound = steps * dd + levels * dd * 0x1p-11 + 1e-12;
        for (int i = 0; i < 32; i++)
            assert_true(fabs((double)back[b * 32 + i] - w[b * 32 + i]) <= bound);
    }
    free(w), free(back), free(q);
}

void ig_tq_check_bad_shapes(ig_dtype_t dt)
{
    ig_backend_t *be;
    assert_int_equal(ig_backend_cpu_create(&be, 1), 0);
    int block = (int)ig_dtype_block(dt);
    unsigned char *buf = calloc(1, ig_dtype_bytes(dt, (size_t)block) * 2);
    assert_non_null(buf);
    ig_tensor_t odd = {dt, buf, 2, {1, block + 1}}, vec = {dt, buf, 1, {block}};
    ig_weight_t W;
    assert_int_equal(be->upload_weight(be, &odd, &W), IG_EINVAL);
    assert_int_equal(be->upload_weight(be, &vec, &W), IG_EINVAL);
    be->destroy(be);
    free(buf);
}

void ig_tq_check_panels32(ig_dtype_t dt, uint64_t *rng)
{
    assert_int_equal(ig__qp_packed_bytes(dt, 64, 2048), ig_dtype_bytes(dt, 64 * 2048));
    assert_int_equal(ig__qp_packed_bytes(dt, 17, 64), 2 * ig_dtype_bytes(dt, 16 * 64));
    int n = 37, k = 96;
    float *w = ig_xs_buf(rng, (size_t)n * k, 1.0f), row[96], back[96];
    unsigned char *q = malloc(ig_dtype_bytes(dt, (size_t)n * k));
    uint8_t *p = malloc(ig__qp_packed_bytes(dt, n, k));
    assert_non_null(q);
    assert_non_null(p);
    ig_dtype_from_f32(q, dt, w, (size_t)n * k);
    ig__qp_pack(p, q, dt, n, k);
    for (int r = 0; r < n; r++) {
        ig_dtype_to_f32(row, q + (size_t)r * ig_dtype_bytes(dt, k), dt, k);
        ig__qp_unpack_row(back, p, dt, k, r);
        assert_memory_equal(row, back, sizeof(row));
    }
    ig__qp_unpack_row(back, p, dt, k, 47); /* padding of the last panel: zeros */
    for (int i = 0; i < k; i++)
        assert_true(back[i] == 0.0f);
    free(w), free(q), free(p);
}

void ig_tq_batch_invariant_random(ig_dtype_t dt, uint64_t *rng, int m, int n, int k)
{
    float *x = ig_xs_buf(rng, (size_t)m * k, 1.0f), *w = ig_xs_buf(rng, (size_t)n * k, 1.0f);
    unsigned char *wq = malloc(ig_dtype_bytes(dt, (size_t)n * k));
    assert_non_null(wq);
    ig_dtype_from_f32(wq, dt, w, (size_t)n * k);
    ig_tensor_t t = {dt, wq, 2, {n, k}};
    ig_tq_batch_invariant(&t, x, m);
    free(x), free(w), free(wq);
}
