/* The CUDA emulation: __nv_bfloat16 and the conversions the kernels use (C++). */
#ifndef INFERGATE_EMU_CUDA_BF16_H
#define INFERGATE_EMU_CUDA_BF16_H

#include "cuda_runtime.h"

extern "C" {
#include "infergate/dtype.h"
}

struct __nv_bfloat16 {
    unsigned short x;
};

static inline float __bfloat162float(__nv_bfloat16 h)
{
    return ig_bf16_to_f32(h.x);
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    return __nv_bfloat16{ig_f32_to_bf16(f)};
}

#endif
