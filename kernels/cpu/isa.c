/*
 * Run-time choice of the instruction set for the kernels that dispatch
 * (gemm16.c, gemmq.c): the best the CPU runs, or a lower one named by
 * IG_CPU_ISA (avx512, avx2, scalar) or set by a test, so that the AVX2 and
 * scalar paths are exercised on an AVX-512 machine too. Apart from the
 * set, AVX512_BF16: whether BF16 weights are uploaded for vdpbf16ps
 * (gemm16.c's k-pair path): where the CPU has it, the set in use is
 * AVX-512 and the instruction pays on this core (measured, below); forced
 * with IG_CPU_BF16_DOT=1 or 0, or set by ig__cpu_set_bf16_dot(). And
 * whether the widening path's decode tiles prefetch: by the CPU's vendor,
 * or IG_CPU_PREFETCH=1 or 0.
 */
#include "cpu_internal.h"

#include "infergate/clock.h"
#include "infergate/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* ---- does vdpbf16ps pay on this CPU? -------------------------------------- */
/*
 * The k-pair path rounds x to BF16 (a wider error bound) to run vdpbf16ps,
 * which does 32 multiply-adds where an FMA does 16. Whether that is faster
 * than widening the weights and running FMAs depends on the core, not on
 * the flag. On an AMD Zen 4 the k-pair path was 1.5-1.8x faster at batch
 * 64 (bench/results/bf16-dot.json); on an Intel Xeon (Emerald Rapids)
 * vdpbf16ps issues at a quarter of the FMA's rate, does half its
 * multiply-adds a second, and the widening path was 1.22x faster at
 * batch 64 and 1.28x at prefill (the k-pair path won batch 1, which waits
 * on memory, by 1.14x). So the default is
 * measured: 12 independent chains of each instruction, timed in
 * alternation, the best of DOT_ROUNDS; the k-pair path when vdpbf16ps does
 * at least IG_CPU_BF16_DOT_GAIN times the FMA's multiply-adds a second.
 * About 0.2 ms, once per process, before any weights are uploaded (the
 * choice must not change afterwards: a row's bits would). IG_CPU_BF16_DOT=1
 * or 0 overrides it.
 */
#define DOT_ROUNDS 5
#define DOT_ITERS 2000

static double dot_rate[2]; /* multiply-adds per ns: vdpbf16ps, FMA */

#if defined(__x86_64__) || defined(__i386__)

IG__TARGET_BEGIN("avx512f,avx512bf16,fma")
/* Multiply-adds per ns of 12 chains of vdpbf16ps (which) or of FMA. */
static double chains_rate(int which)
{
    __m512 acc[12];
    for (int i = 0; i < 12; i++)
        acc[i] = _mm512_setzero_ps();
    __m512 f = _mm512_set1_ps(1.0f);
    __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80);
    double t0 = (double)ig_clock_ns();
    for (int it = 0; it < DOT_ITERS; it++) {
        /* The barrier keeps each round's operands opaque to the compiler. */
        __asm__ volatile("" : "+v"(f), "+v"(b));
        if (which == 0) {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++)
                acc[i] = _mm512_dpbf16_ps(acc[i], b, b);
        } else {
#pragma GCC unroll 12
            for (int i = 0; i < 12; i++)
                acc[i] = _mm512_fmadd_ps(acc[i], f, f);
        }
    }
    double dt = (double)ig_clock_ns() - t0;
    __m512 sum = acc[0];
    for (int i = 1; i < 12; i++)
        sum = _mm512_add_ps(sum, acc[i]);
    volatile float sink = _mm512_reduce_add_ps(sum);
    (void)sink;
    return 12.0 * DOT_ITERS * (which == 0 ? 32 : 16) / (dt > 1 ? dt : 1);
}
IG__TARGET_END

static int dot_pays(void)
{
    for (int r = 0; r < DOT_ROUNDS; r++)
        for (int w = 0; w < 2; w++) {
            double x = chains_rate(w);
            if (x > dot_rate[w])
                dot_rate[w] = x;
        }
    return dot_rate[0] >= IG_CPU_BF16_DOT_GAIN * dot_rate[1];
}
#else
static int dot_pays(void)
{
    return 0;
}
#endif

/* Once per process, whichever threads ask first: the rates are written
 * once, and every caller sees the same answer. */
static pthread_once_t dot_once = PTHREAD_ONCE_INIT;
static int dot_paid;

static void dot_measure(void)
{
    dot_paid = dot_pays();
}

void ig__cpu_bf16_dot_rates(double *dot, double *fma)
{
    (void)ig__cpu_bf16_dot();
    *dot = dot_rate[0];
    *fma = dot_rate[1];
}

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

/* An on/off switch from the environment: 1 or 0 as it says, -1 when it is
 * unset or says anything else. */
static int env_switch(const char *name)
{
    const char *env = getenv(name);
    if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0))
        return env[0] == '1';
    return -1;
}

int ig__cpu_bf16_dot(void)
{
    int now = atomic_load_explicit(&bf16_dot_now, memory_order_relaxed);
    if (now < 0) {
        int forced = env_switch("IG_CPU_BF16_DOT");
        if (!ig__cpu_has_bf16_dot()) {
            now = 0;
        } else if (forced >= 0) {
            now = forced;
        } else {
            pthread_once(&dot_once, dot_measure);
            now = dot_paid;
        }
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

static atomic_int prefetch_now = -1;

int ig__cpu_stream_prefetch(void)
{
    int now = atomic_load_explicit(&prefetch_now, memory_order_relaxed);
    if (now < 0) {
        now = env_switch("IG_CPU_PREFETCH");
        if (now < 0) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_cpu_init();
            now = !__builtin_cpu_is("amd");
#else
            now = 0;
#endif
        }
        atomic_store(&prefetch_now, now);
    }
    return now;
}
