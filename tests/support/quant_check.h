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
 * - ig_tq_check_blocks32: for a format of 32-weight blocks (Q8_0, Q4_0),
 *   y = x W^T through be against the product of the dequantized weights
 *   and the Q8_0-quantized x (its rounding bound), and against the exact
 *   product (that bound plus the quantization error of both), with
 *   random x and W(n, k) drawn from rng; embed gives W's dequantized row;
 * - ig_tq_check_round_trip32: for the same formats, 4096 weights drawn
 *   from rng, quantized and read back, are each within steps * d plus the
 *   F16 rounding of d (levels units of q at 2^-11 d) of their value, d the
 *   block's largest magnitude / levels;
 * - ig_tq_check_bad_shapes: upload_weight refuses a row length that is not
 *   a whole number of blocks, and a vector;
 * - ig_tq_check_panels32: for the same formats, the panels of gemmq.c hold
 *   the file's bytes (no growth beyond a short last panel's padding), and
 *   packing keeps every weight and scale (each row unpacked is the file's
 *   row dequantized; the padding columns are zeros).
 *
 * The first two leave the instruction set at the most this CPU has.
 */

#include <stdint.h>

#include "infergate/dtype.h"
#include "infergate/kernels.h"
#include "infergate/tensor.h"

typedef void (*ig_tq_check_fn)(ig_backend_t *be, int m, int n, int k, const char *isa);

void ig_tq_every_isa(const int (*shapes)[3], int nshapes, ig_tq_check_fn check);
void ig_tq_batch_invariant(const ig_tensor_t *t, const float *x, int m);
/* The same for W(n, k) and x(m, k) drawn from rng, W quantized to dt. */
void ig_tq_batch_invariant_random(ig_dtype_t dt, uint64_t *rng, int m, int n, int k);
/* x (m rows of k) quantized per block of 32 as the quantized GEMMs do it
 * (ig__q8_quantize_rows: xq, xs with k / 32 scales a row), and xdq, those
 * int8 values times their scales: the x each GEMM multiplies. */
void ig_tq_quantize_x(const float *x, int m, int k, int8_t *xq, float *xs, float *xdq);
void ig_tq_check_blocks32(ig_backend_t *be, ig_dtype_t dt, uint64_t *rng, int m, int n, int k,
                          const char *label);
void ig_tq_check_round_trip32(ig_dtype_t dt, uint64_t *rng, double levels, double steps);
void ig_tq_check_bad_shapes(ig_dtype_t dt);
void ig_tq_check_panels32(ig_dtype_t dt, uint64_t *rng);

#endif
