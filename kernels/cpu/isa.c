/*
 * Run-time choice of the instruction set for the kernels that dispatch
 * (gemm16.c, gemmq8.c): the best the CPU runs, or a lower one named by
 * IG_CPU_ISA (avx512, avx2, scalar) or set by a test, so that the AVX2 and
 * scalar paths are exercised on an AVX-512 machine too. Apart from the
 * set, AVX512_BF16: whether BF16 weights are uploaded for vdpbf16ps
 * (gemm16.c's k-pair path): on where the CPU has it and the set in use is
 * AVX-512, off with IG_CPU_BF16_DOT=0 or ig__cpu_set_bf16_dot(0).
 */
#include "cpu_internal.h"

#include "infergate/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_int isa_now = -1;

#if defined(__x86_64__) || defined(__i386__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * does not know the name. The OS's AVX state is checked by the avx2 test
 * it goes with. */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}

/* AVX512_BF16 (vdpbf16ps) from CPUID leaf 7 subleaf 1 (EAX bit 5), which
 * __builtin_cpu_supports of GCC 12 does not name either. */
static int has_avx512bf16(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) != 0;
}
#endif

static ig_cpu_isa_t isa_best(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") && has_f16c())
        return IG_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c())
        return IG_CPU_ISA_AVX2;
#endif
    return IG_CPU_ISA_SCALAR;
}

const char *ig__cpu_isa_name(ig_cpu_isa_t isa)
{
    switch (isa) {
    case IG_CPU_ISA_AVX512:
        return "avx512";
    case IG_CPU_ISA_AVX2:
        return "avx2";
    default:
        return "scalar";
    }
}

ig_cpu_isa_t ig__cpu_isa_max(void)
{
    return isa_best();
}

int ig__cpu_set_isa(ig_cpu_isa_t isa)
{
    if (isa < IG_CPU_ISA_SCALAR || isa > IG_CPU_ISA_AVX512)
        return IG_EINVAL;
    if (isa > isa_best())
        return IG_ENOTSUP;
    atomic_store(&isa_now, (int)isa);
    return 0;
}

ig_cpu_isa_t ig__cpu_isa(void)
{
    int now = atomic_load_explicit(&isa_now, memory_order_relaxed);
    if (now >= 0)
        return (ig_cpu_isa_t)now;
    ig_cpu_isa_t best = isa_best(), want = best;
    const char *env = getenv("IG_CPU_ISA");
    if (env != NULL) {
        if (strcmp(env, "scalar") == 0)
            want = IG_CPU_ISA_SCALAR;
        else if (strcmp(env, "avx2") == 0)
            want = IG_CPU_ISA_AVX2;
    }
    if (want > best)
        want = best;
    atomic_store(&isa_now, (int)want);
    return want;
}

static atomic_int bf16_dot_now = -1;

static atomic_int bf16_dot_has = -1;

/* Cached: CPUID traps to the hypervisor in a virtual machine (tens of
 * microseconds), and ig__gemm16p asks on every call. */
int ig__cpu_has_bf16_dot(void)
{
    int has = atomic_load_explicit(&bf16_dot_has, memory_order_relaxed);
    if (has < 0) {
#if defined(__x86_64__) || defined(__i386__)
        has = isa_best() == IG_CPU_ISA_AVX512 && has_avx512bf16();
#else
        has = 0;
#endif
        atomic_store(&bf16_dot_has, has);
    }
    return has;
}

int ig__cpu_bf16_dot(void)
{
    int now = atomic_load_explicit(&bf16_dot_now, memory_order_relaxed);
    if (now < 0) {
        const char *env = getenv("IG_CPU_BF16_DOT");
        now = ig__cpu_has_bf16_dot() && !(env != NULL && strcmp(env, "0") == 0);
        atomic_store(&bf16_dot_now, now);
    }
    return now && ig__cpu_isa() == IG_CPU_ISA_AVX512;
}

int ig__cpu_set_bf16_dot(int on)
{
    if (on && !ig__cpu_has_bf16_dot())
        return IG_ENOTSUP;
    atomic_store(&bf16_dot_now, on != 0);
    return 0;
}
