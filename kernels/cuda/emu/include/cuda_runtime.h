/*
 * The CUDA emulation (-DIG_CUDA_EMU=ON): what a .cu file sees of CUDA when it
 * is compiled as host C++ (kernels/cuda/emu/cu2cpp.cmake rewrites its
 * launches). Every GPU thread of a block is a fiber on the calling host
 * thread; __syncthreads and the warp shuffles are its yield points
 * (emu_fiber.cpp). Qualifiers that only steer nvcc vanish; __shared__
 * variables are function statics, one copy for the block that runs (blocks
 * run one after another). Only what the project uses is provided.
 */
#ifndef INFERGATE_EMU_CUDA_RUNTIME_H
#define INFERGATE_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct float2 {
    float x, y;
};
struct float4 {
    float x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};

namespace ig_emu
{

/* The running launch and thread (emu_fiber.cpp). */
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;
struct thread_s {
    uint3 idx;
};
extern thread_s *volatile current;

void syncthreads();
/* Lane exchange of one warp: every live lane of the calling warp deposits
 * v, then each gets the value deposited by lane src_lane(lane). */
uint64_t warp_exchange(uint64_t v, int mode, int arg, int width);
enum { XCHG_XOR = 0, XCHG_DOWN, XCHG_UP, XCHG_IDX, XCHG_BALLOT, XCHG_ANY, XCHG_ALL };
void *dynamic_smem();

/* One launch: grid, block, shared memory and stream checked, then body(ctx)
 * run once per thread of every block. 0 or the launch error. */
cudaError_t run(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, void (*body)(void *), void *ctx);

template <class... P> struct pending {
    const char *name;
    void (*fn)(P...);
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <class... A> void operator()(A &&...a)
    {
        struct call {
            void (*fn)(P...);
            std::tuple<P...> args;
        } c{fn, std::tuple<P...>(static_cast<P>(std::forward<A>(a))...)};
        run(
            name, (const void *)fn, grid, block, smem, stream,
            [](void *ctx) {
                call *cp = (call *)ctx;
                std::tuple<P...> mine = cp->args; /* parameters are per thread */
                std::apply(cp->fn, mine);
            },
            &c);
    }
};

template <class... P> struct launcher {
    const char *name;
    void (*fn)(P...);
    pending<P...> operator()(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0)
    {
        return pending<P...>{name, fn, grid, block, smem, stream};
    }
};

template <class... P> launcher<P...> launch(const char *name, void (*fn)(P...))
{
    return launcher<P...>{name, fn};
}

template <class T> static inline uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T> static inline T from_bits(uint64_t u)
{
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}

} // namespace ig_emu

#define threadIdx (ig_emu::current->idx)
#define blockIdx (ig_emu::block_idx)
#define blockDim (ig_emu::block_dim)
#define gridDim (ig_emu::grid_dim)

static inline void __syncthreads()
{
    ig_emu::syncthreads();
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    (void)mask;
    return ig_emu::from_bits<T>(
        ig_emu::warp_exchange(ig_emu::to_bits(v), ig_emu::XCHG_XOR, lane_mask, width));
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    (void)mask;
    return ig_emu::from_bits<T>(
        ig_emu::warp_exchange(ig_emu::to_bits(v), ig_emu::XCHG_DOWN, (int)delta, width));
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    (void)mask;
    return ig_emu::from_bits<T>(
        ig_emu::warp_exchange(ig_emu::to_bits(v), ig_emu::XCHG_UP, (int)delta, width));
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    (void)mask;
    return ig_emu::from_bits<T>(
        ig_emu::warp_exchange(ig_emu::to_bits(v), ig_emu::XCHG_IDX, src, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    (void)mask;
    return (unsigned)ig_emu::warp_exchange(pred != 0, ig_emu::XCHG_BALLOT, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred)
{
    (void)mask;
    return (int)ig_emu::warp_exchange(pred != 0, ig_emu::XCHG_ANY, 0, 32);
}
static inline int __all_sync(unsigned mask, int pred)
{
    (void)mask;
    return (int)ig_emu::warp_exchange(pred != 0, ig_emu::XCHG_ALL, 0, 32);
}

/* Atomics: the fibers of a launch share one host thread and switch only at
 * yield points, so a plain read-modify-write is atomic here. Each atomic is
 * that one read-modify-write with its own new value; it returns the old. */
template <class T, class F> static inline T ig_emu_rmw(T *p, F next)
{
    T old = *p;
    *p = next(old);
    return old;
}
template <class T> static inline T atomicAdd(T *p, T v)
{
    return ig_emu_rmw(p, [v](T old) { return old + v; });
}
template <class T> static inline T atomicMax(T *p, T v)
{
    return ig_emu_rmw(p, [v](T old) { return old < v ? v : old; });
}
template <class T> static inline T atomicMin(T *p, T v)
{
    return ig_emu_rmw(p, [v](T old) { return v < old ? v : old; });
}
template <class T> static inline T atomicExch(T *p, T v)
{
    return ig_emu_rmw(p, [v](T) { return v; });
}
template <class T> static inline T atomicCAS(T *p, T cmp, T v)
{
    return ig_emu_rmw(p, [cmp, v](T old) { return old == cmp ? v : old; });
}

template <class T> static inline T __ldg(const T *p)
{
    return *p;
}

/* glibc declares __expf and __logf itself: the intrinsics get other names. */
static inline float ig_emu_expf(float x)
{
    return expf(x);
}
static inline float ig_emu_logf(float x)
{
    return logf(x);
}
#define __expf ig_emu_expf
#define __logf ig_emu_logf
static inline float rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}
static inline float __fdividef(float a, float b)
{
    return a / b;
}
static inline unsigned __float_as_uint(float f)
{
    return ig_emu::from_bits<unsigned>(ig_emu::to_bits(f));
}
static inline float __uint_as_float(unsigned u)
{
    return ig_emu::from_bits<float>(ig_emu::to_bits(u));
}
static inline int __float_as_int(float f)
{
    return ig_emu::from_bits<int>(ig_emu::to_bits(f));
}
static inline float __int_as_float(int u)
{
    return ig_emu::from_bits<float>(ig_emu::to_bits(u));
}
static inline int min(int a, int b)
{
    return a < b ? a : b;
}
static inline int max(int a, int b)
{
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b)
{
    return a > b ? a : b;
}
static inline long long min(long long a, long long b)
{
    return a < b ? a : b;
}
static inline long long max(long long a, long long b)
{
    return a > b ? a : b;
}
static inline size_t min(size_t a, size_t b)
{
    return a < b ? a : b;
}
static inline size_t max(size_t a, size_t b)
{
    return a > b ? a : b;
}

template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *func, cudaFuncAttribute attr, int value)
{
    return ig_emu_func_set_attribute((const void *)func, attr, value);
}

#endif /* __cplusplus */

#endif
