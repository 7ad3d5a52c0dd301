/*
 * Device helpers that more than one .cu file of the CUDA backend uses: warp
 * reductions and the range scale of F16 activations. Each .cu file is its
 * own compilation unit (no relocatable device code), so these are static
 * inline in every file that includes them. C++ only.
 */
#ifndef INFERGATE_CUDA_WARP_H
#define INFERGATE_CUDA_WARP_H

#include "cuda_internal.h"

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* F16 activations: a row whose largest |x| would not fit F16 (65504) is
 * scaled by a power of two first (exact), so that its largest value stays
 * below 2^15, and the products are scaled back after the sum (exact again).
 * A row that fits keeps scale 1: rounding x to F16 is then what it always
 * was. The CPU keeps activations in F32; this keeps their range. */
static __device__ __forceinline__ float f16_scale(float maxabs)
{
    if (!(maxabs >= 32768.0f) || isinf(maxabs))
        return 1.0f;
    int e;
    frexpf(maxabs, &e); /* maxabs < 2^e */
    return ldexpf(1.0f, 15 - e);
}

#endif
