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
} ig_dtype_t;

/* Bytes per element, and the safetensors name ("F32", "F16", "BF16"). */
size_t ig_dtype_size(ig_dtype_t dtype);
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

/* Converts n elements of src (in dtype) to f32 in dst. */
void ig_dtype_to_f32(float *dst, const void *src, ig_dtype_t dtype, size_t n);

/* Converts n f32 elements of src to dtype in dst. */
void ig_dtype_from_f32(void *dst, ig_dtype_t dtype, const float *src, size_t n);

#endif
