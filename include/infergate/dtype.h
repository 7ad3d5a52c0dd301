#ifndef INFERGATE_DTYPE_H
#define INFERGATE_DTYPE_H

/*
 * Element types of stored weights and the conversions between them. The
 * conversions are exact where the target can hold the value and round to
 * nearest, ties to even, otherwise (what PyTorch's .to() does). They read and
 * write through memcpy, so source and destination need no alignment.
 */

#include <stddef.h>
#include <stdint.h>

typedef enum {
    IG_DTYPE_F32 = 0,
    IG_DTYPE_F16,
    IG_DTYPE_BF16,
    IG_DTYPE_Q8_0, /* GGUF's Q8_0: blocks of 32 weights, see below */
    IG_DTYPE_Q4_0, /* GGUF's Q4_0: blocks of 32 weights, see below */
    IG_DTYPE_Q4_K, /* GGUF's K-quants: super-blocks of 256 weights, see below */
    IG_DTYPE_Q6_K,
} ig_dtype_t;

/*
 * Q8_0, exactly as GGUF (ggml) defines it: a row of n weights (n a multiple
 * of 32) is n / 32 blocks of 34 bytes, an F16 scale d then 32 int8 q, and
 * weight i of a block is d * q[i]. Quantizing a block takes d = max |x| / 127
 * and q = round(x / d), ties away from zero (d = 0 gives q = 0); so a weight
 * is off by at most d / 2 plus the F16 rounding of d (2^-11 d per unit of q).
 */
#define IG_Q8_0_BLOCK 32
#define IG_Q8_0_BYTES 34

/*
 * Q4_0, exactly as GGUF (ggml) defines it: blocks of 32 weights in 18
 * bytes, an F16 scale d then 16 bytes qs; weight i < 16 is the low nibble
 * of qs[i], weight i + 16 its high nibble, and its value is d * (q - 8).
 * Quantizing a block does what ggml's quantize_row_q4_0_ref does: m = the
 * weight of largest magnitude (its sign kept), d = m / -8, q = min(15,
 * (int)(x / d + 8.5)) (d = 0 gives q = 8). So m itself is exact (q = 0),
 * values rounded to nearest are off by at most d / 2, and values of the
 * other sign beyond 7.5 d are clamped to 7 d: a weight is off by at most
 * |d| = max |x| / 8, plus the F16 rounding of d (2^-11 |d| per unit of q).
 */
#define IG_Q4_0_BLOCK 32
#define IG_Q4_0_BYTES 18

/*
 * Q4_K and Q6_K, exactly as GGUF (ggml's dequantize_row_q4_K / _q6_K)
 * defines them: super-blocks of IG_QK_K = 256 weights. ig_dtype_from_f32
 * writes valid blocks by a plain rounding of its own (not llama-quantize's
 * search for the best scales, so not its bytes).
 *   - Q4_K, 144 bytes: F16 d, F16 dmin, 12 bytes of eight 6-bit scales and
 *     eight 6-bit mins, 128 bytes of nibbles; sub-block j (32 weights) is
 *     d * sc[j] * q - dmin * m[j], its nibbles the low (even j) or high (odd
 *     j) halves of bytes 32 * (j / 2) .. + 31.
 *   - Q6_K, 210 bytes: 128 bytes of low nibbles, 64 of 2-bit high parts,
 *     16 int8 scales, F16 d; weight i of sub-block i / 16 is
 *     d * sc[i / 16] * (q - 32), q of 6 bits.
 */
#define IG_QK_K 256
#define IG_Q4_K_BYTES 144
#define IG_Q6_K_BYTES 210

/* Bytes per element, and the safetensors name ("F32", "F16", "BF16";
 * "Q8_0" and "Q4_0", whose size here is 0: they have no whole bytes per
 * element, use ig_dtype_bytes). */
size_t ig_dtype_size(ig_dtype_t dtype);
/* Elements per block: 32 for Q8_0 and Q4_0, 256 for Q4_K and Q6_K, else 1. */
size_t ig_dtype_block(ig_dtype_t dtype);
/* Bytes of n elements; 0 for a block format when n is not a multiple of
 * its block. */
size_t ig_dtype_bytes(ig_dtype_t dtype, size_t n);
const char *ig_dtype_name(ig_dtype_t dtype);

/* Parses a safetensors dtype name ("F32", "F16", "BF16"). Returns 0, or
 * IG_ENOTSUP for any other name (I8, F64, ...). */
int ig_dtype_parse(const char *name, ig_dtype_t *out);

/* Parses a lower-case command-line spelling ("f32", "f16", "bf16") or a
 * Hugging Face torch_dtype ("float32", "float16", "bfloat16"). 0 or IG_EINVAL. */
int ig_dtype_parse_user(const char *name, ig_dtype_t *out);

/* Scalar conversions; the 16-bit values are raw bit patterns. NaN stays NaN
 * and infinities stay infinite; values beyond the F16 range become infinity. */
float ig_f16_to_f32(uint16_t h);
uint16_t ig_f32_to_f16(float f);
float ig_bf16_to_f32(uint16_t h);
uint16_t ig_f32_to_bf16(float f);

/* Converts n elements of src (in dtype) to f32 in dst; for a block format,
 * n is a multiple of its block and this dequantizes. */
void ig_dtype_to_f32(float *dst, const void *src, ig_dtype_t dtype, size_t n);

/* Converts n f32 elements of src to dtype in dst; for a block format, n is
 * a multiple of its block and this quantizes. */
void ig_dtype_from_f32(void *dst, ig_dtype_t dtype, const float *src, size_t n);

#endif
