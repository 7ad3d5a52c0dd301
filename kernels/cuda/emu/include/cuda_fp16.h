/* The CUDA emulation: __half and the conversions the kernels use (C++). */
#ifndef INFERGATE_EMU_CUDA_FP16_H
#define INFERGATE_EMU_CUDA_FP16_H

#include "cuda_runtime.h"

extern "C" {
#include "infergate/dtype.h"
}

struct __half_raw {
    unsigned short x;
};
struct __half2_raw {
    unsigned short x, y;
};
struct __half {
    unsigned short x;
    __half() = default;
    __half(__half_raw r) : x(r.x) {}
};
struct __half2 {
    unsigned short x, y;
    __half2() = default;
    __half2(__half2_raw r) : x(r.x), y(r.y) {}
};

static inline float __half2float(__half h)
{
    return ig_f16_to_f32(h.x);
}
static inline __half __float2half_rn(float f)
{
    return __half(__half_raw{ig_f32_to_f16(f)});
}
static inline float2 __half22float2(__half2 h)
{
    return float2{ig_f16_to_f32(h.x), ig_f16_to_f32(h.y)};
}

#endif
