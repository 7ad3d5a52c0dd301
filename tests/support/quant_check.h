#ifndef IG_QUANT_CHECK_H
#define IG_QUANT_CHECK_H

/*
 * What the quantized GEMM tests (test_kernels_q8, _q4, _kquant) check the
 * same way for every block format, on the CPU backend, on every
 * instruction set this CPU has (the scalar path first):
 *
 * - ig_tq_every_isa: check(be, m, n, k, isa) for each shape, with 1 and 3
 *   threads;
 * - ig_tq_batch_invariant: an m x k by n x k product (weights t, of the
 *   format) gives each row's bits alone and batched, with 1 and 2
 *   threads, and the same bits on every instruction set.
 *
 * Both leave the instruction set at the most this CPU has.
 */

#include "infergate/kernels.h"
#include "infergate/tensor.h"

typedef void (*ig_tq_check_fn)(ig_backend_t *be, int m, int n, int k, const char *isa);

void ig_tq_every_isa(const int (*shapes)[3], int nshapes, ig_tq_check_fn check);
void ig_tq_batch_invariant(const ig_tensor_t *t, const float *x, int m);

#endif
