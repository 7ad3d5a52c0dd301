/* The quantized GEMM tests' shared checks (quant_check.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "quant_check.h"

#include "../../kernels/cpu/cpu_internal.h"

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
