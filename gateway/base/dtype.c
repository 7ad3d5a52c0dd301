/* Element types of stored weights and the bit-exact conversions between them. */
#include "infergate/dtype.h"
#include "infergate/error.h"

#include <math.h>
#include <string.h>

size_t ig_dtype_size(ig_dtype_t dtype)
{
    switch (dtype) {
    case IG_DTYPE_F32:
        return 4;
    case IG_DTYPE_F16:
    case IG_DTYPE_BF16:
        return 2;
    case IG_DTYPE_Q8_0:
    case IG_DTYPE_Q4_0:
    case IG_DTYPE_Q4_K:
    case IG_DTYPE_Q6_K:
        return 0;
    }
    return 0;
}

size_t ig_dtype_block(ig_dtype_t dtype)
{
    if (dtype == IG_DTYPE_Q4_K || dtype == IG_DTYPE_Q6_K)
        return IG_QK_K;
    return dtype == IG_DTYPE_Q8_0 || dtype == IG_DTYPE_Q4_0 ? 32 : 1;
}

size_t ig_dtype_bytes(ig_dtype_t dtype, size_t n)
{
    if (dtype == IG_DTYPE_Q8_0)
        return n % IG_Q8_0_BLOCK ? 0 : n / IG_Q8_0_BLOCK * IG_Q8_0_BYTES;
    if (dtype == IG_DTYPE_Q4_0)
        return n % IG_Q4_0_BLOCK ? 0 : n / IG_Q4_0_BLOCK * IG_Q4_0_BYTES;
    if (dtype == IG_DTYPE_Q4_K)
        return n % IG_QK_K ? 0 : n / IG_QK_K * IG_Q4_K_BYTES;
    if (dtype == IG_DTYPE_Q6_K)
        return n % IG_QK_K ? 0 : n / IG_QK_K * IG_Q6_K_BYTES;
    return n * ig_dtype_size(dtype);
}

const char *ig_dtype_name(ig_dtype_t dtype)
{
    switch (dtype) {
    case IG_DTYPE_F32:
        return "F32";
    case IG_DTYPE_F16:
        return "F16";
    case IG_DTYPE_BF16:
        return "BF16";
    case IG_DTYPE_Q8_0:
        return "Q8_0";
    case IG_DTYPE_Q4_0:
        return "Q4_0";
    case IG_DTYPE_Q4_K:
        return "Q4_K";
    case IG_DTYPE_Q6_K:
        return "Q6_K";
    }
    return "?";
}

int ig_dtype_parse(const char *name, ig_dtype_t *out)
{
    static const struct {
        const char *name;
        ig_dtype_t dtype;
    } names[] = {{"F32", IG_DTYPE_F32}, {"F16", IG_DTYPE_F16}, {"BF16", IG_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].dtype;
            return 0;
        }
    }
    return IG_ENOTSUP;
}

int ig_dtype_parse_user(const char *name, ig_dtype_t *out)
{
    static const struct {
        const char *name;
        ig_dtype_t dtype;
    } names[] = {{"f32", IG_DTYPE_F32},     {"float32", IG_DTYPE_F32}, {"f16", IG_DTYPE_F16},
                 {"float16", IG_DTYPE_F16}, {"bf16", IG_DTYPE_BF16},   {"bfloat16", IG_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].dtype;
            return 0;
        }
    }
    return IG_EINVAL;
}

/* ---- scalar conversions ------------------------------------------------ */

static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    return x;
}

static float bits_f32(uint32_t x)
{
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

float ig_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        /* Zero or subnormal: mant * 2^-24 is exact in f32. */
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t ig_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u)
            return sign | 0x7c00u;
        /* NaN: keep it quiet and keep the top payload bits. */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    if (ax >= 0x477ff000u) /* 65520 and above round to infinity */
        return sign | 0x7c00u;
    if (ax < 0x38800000u) {
        /* Below the smallest normal f16 (2^-14): a subnormal or zero. */
        if (ax < 0x33000000u) /* at most 2^-25: rounds to zero */
            return sign;
        uint32_t exp = ax >> 23;
        uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - exp; /* 14 .. 24 */
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    /* Normal: rebias the exponent (127 -> 15); a carry out of the mantissa
     * correctly bumps the exponent. */
    uint32_t r = (ax >> 13) - (112u << 10);
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

float ig_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t ig_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, never rounded to inf */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* ---- bulk conversions ---------------------------------------------------- */

/* The 16-bit conversions, one loop for both formats; bf16 is a constant
 * at each call, so the compiler keeps a loop for each. */
static inline void halves_to_f32(float *dst, const unsigned char *s, size_t n, int bf16)
{
    uint16_t h;
    for (size_t i = 0; i < n; i++) {
        memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16 ? ig_bf16_to_f32(h) : ig_f16_to_f32(h);
    }
}

static inline void f32_to_halves(unsigned char *d, const float *src, size_t n, int bf16)
{
    uint16_t h;
    for (size_t i = 0; i < n; i++) {
        h = bf16 ? ig_f32_to_bf16(src[i]) : ig_f32_to_f16(src[i]);
        memcpy(d + 2 * i, &h, 2);
    }
}

/* ---- Q8_0 ------------------------------------------------------------------ */

static void q8_0_to_f32(float *dst, const unsigned char *s, size_t n)
{
    for (size_t b = 0; b < n / IG_Q8_0_BLOCK; b++, s += IG_Q8_0_BYTES) {
        uint16_t h;
        memcpy(&h, s, 2);
        float d = ig_f16_to_f32(h);
        for (int i = 0; i < IG_Q8_0_BLOCK; i++)
            dst[b * IG_Q8_0_BLOCK + i] = d * (float)(int8_t)s[2 + i];
    }
}

static void f32_to_q8_0(unsigned char *d, const float *src, size_t n)
{
    for (size_t b = 0; b < n / IG_Q8_0_BLOCK; b++, d += IG_Q8_0_BYTES) {
        const float *x = src + b * IG_Q8_0_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < IG_Q8_0_BLOCK; i++)
            amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float sc = amax / 127.0f, inv = sc != 0.0f ? 1.0f / sc : 0.0f;
        uint16_t h = ig_f32_to_f16(sc);
        memcpy(d, &h, 2);
        for (int i = 0; i < IG_Q8_0_BLOCK; i++)
            d[2 + i] = (unsigned char)(int8_t)roundf(x[i] * inv);
    }
}

/* ---- Q4_0 ------------------------------------------------------------------ */

static void q4_0_to_f32(float *dst, const unsigned char *s, size_t n)
{
    for (size_t b = 0; b < n / IG_Q4_0_BLOCK; b++, s += IG_Q4_0_BYTES) {
        uint16_t h;
        memcpy(&h, s, 2);
        float d = ig_f16_to_f32(h);
        for (int i = 0; i < IG_Q4_0_BLOCK / 2; i++) {
            dst[b * IG_Q4_0_BLOCK + i] = d * (float)((s[2 + i] & 15) - 8);
            dst[b * IG_Q4_0_BLOCK + i + 16] = d * (float)((s[2 + i] >> 4) - 8);
        }
    }
}

/* ggml's quantize_row_q4_0_ref, step for step (the same bytes). */
static void f32_to_q4_0(unsigned char *d, const float *src, size_t n)
{
    for (size_t b = 0; b < n / IG_Q4_0_BLOCK; b++, d += IG_Q4_0_BYTES) {
        const float *x = src + b * IG_Q4_0_BLOCK;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < IG_Q4_0_BLOCK; i++)
            if (amax < fabsf(x[i])) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        float sc = max / -8.0f, inv = sc != 0.0f ? 1.0f / sc : 0.0f;
        uint16_t h = ig_f32_to_f16(sc);
        memcpy(d, &h, 2);
        for (int i = 0; i < IG_Q4_0_BLOCK / 2; i++) {
            int q0 = (int)(int8_t)(x[i] * inv + 8.5f), q1 = (int)(int8_t)(x[i + 16] * inv + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            d[2 + i] = (unsigned char)(q0 | q1 << 4);
        }
    }
}

/* ---- K-quants ---------------------------------------------------------------- */

/* Scale and min j (0..7) of a Q4_K super-block: ggml's get_scale_min_k4. */
static void q4_k_scale_min(int j, const unsigned char *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ggml's dequantize_row_q4_K: d * sc and dmin * m are exact in F32 (11 +
 * 6 bits), so is their product with a nibble; the subtraction rounds once,
 * as it does there with or without a fused multiply-add. */
static void q4_k_to_f32(float *dst, const unsigned char *s, size_t n)
{
    for (size_t b = 0; b < n / IG_QK_K; b++, s += IG_Q4_K_BYTES) {
        uint16_t h;
        memcpy(&h, s, 2);
        float d = ig_f16_to_f32(h);
        memcpy(&h, s + 2, 2);
        float dmin = ig_f16_to_f32(h);
        const unsigned char *sc = s + 4, *q = s + 16;
        for (int j = 0; j < 8; j++) {
            int a, m;
            q4_k_scale_min(j, sc, &a, &m);
            float d1 = d * (float)a, m1 = dmin * (float)m;
            const unsigned char *qj = q + 32 * (j / 2);
            for (int l = 0; l < 32; l++)
                *dst++ = d1 * (float)(j % 2 ? qj[l] >> 4 : qj[l] & 15) - m1;
        }
    }
}

/* ggml's dequantize_row_q6_K: (d * sc) exact, then one rounding by q. */
static void q6_k_to_f32(float *dst, const unsigned char *s, size_t n)
{
    for (size_t b = 0; b < n / IG_QK_K; b++, s += IG_Q6_K_BYTES) {
        uint16_t h;
        memcpy(&h, s + 208, 2);
        float d = ig_f16_to_f32(h);
        const unsigned char *ql = s, *qh = s + 128;
        const signed char *sc = (const signed char *)(s + 192);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, dst += 128)
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 15) | ((qh[l] >> 0 & 3) << 4)) - 32;
                int q2 = ((ql[l + 32] & 15) | ((qh[l] >> 2 & 3) << 4)) - 32;
                int q3 = ((ql[l] >> 4) | ((qh[l] >> 4 & 3) << 4)) - 32;
                int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6 & 3) << 4)) - 32;
                dst[l] = d * (float)sc[is] * (float)q1;
                dst[l + 32] = d * (float)sc[is + 2] * (float)q2;
                dst[l + 64] = d * (float)sc[is + 4] * (float)q3;
                dst[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
    }
}

/* A plain quantizer of our own (not ggml's iterative search, whose bytes
 * llama-quantize alone makes): valid blocks that any reader decodes.
 * Q4_K: per sub-block of 32, min mn = min(0, min x), scale (max x - mn)
 * / 15; the super-block's d and dmin the largest of those over 63; the
 * 6-bit sc and m rounded; q = round((x + dmin m) / (d sc)) in 0..15. */
static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void f32_to_q4_k(unsigned char *o, const float *src, size_t n)
{
    for (size_t b = 0; b < n / IG_QK_K; b++, o += IG_Q4_K_BYTES) {
        const float *x = src + b * IG_QK_K;
        float sc[8], mn[8], dmax = 0.0f, mmax = 0.0f;
        for (int j = 0; j < 8; j++) {
            float lo = 0.0f, hi = 0.0f;
            for (int l = 0; l < 32; l++) {
                lo = x[32 * j + l] < lo ? x[32 * j + l] : lo;
                hi = x[32 * j + l] > hi ? x[32 * j + l] : hi;
            }
            sc[j] = (hi - lo) / 15.0f;
            mn[j] = -lo;
            dmax = sc[j] > dmax ? sc[j] : dmax;
            mmax = mn[j] > mmax ? mn[j] : mmax;
        }
        uint16_t hd = ig_f32_to_f16(dmax / 63.0f), hm = ig_f32_to_f16(mmax / 63.0f);
        float d = ig_f16_to_f32(hd), dmin = ig_f16_to_f32(hm);
        int ls[8], lm[8];
        for (int j = 0; j < 8; j++) {
            ls[j] = d > 0.0f ? clampi((int)lroundf(sc[j] / d), 0, 63) : 0;
            lm[j] = dmin > 0.0f ? clampi((int)lroundf(mn[j] / dmin), 0, 63) : 0;
        }
        memcpy(o, &hd, 2);
        memcpy(o + 2, &hm, 2);
        unsigned char *q = o + 4;
        for (int j = 0; j < 4; j++) {
            q[j] = (unsigned char)((ls[j] & 63) | (ls[j + 4] >> 4) << 6);
            q[j + 4] = (unsigned char)((lm[j] & 63) | (lm[j + 4] >> 4) << 6);
            q[j + 8] = (unsigned char)((ls[j + 4] & 15) | (lm[j + 4] & 15) << 4);
        }
        unsigned char *qs = o + 16;
        memset(qs, 0, 128);
        for (int j = 0; j < 8; j++) {
            float s = d * (float)ls[j], off = dmin * (float)lm[j];
            for (int l = 0; l < 32; l++) {
                int v = s > 0.0f ? clampi((int)lroundf((x[32 * j + l] + off) / s), 0, 15) : 0;
                qs[32 * (j / 2) + l] |= (unsigned char)(j % 2 ? v << 4 : v);
            }
        }
    }
}

/* Q6_K: per sub-block of 16, scale max|x| / 31; d the largest over 127;
 * the int8 sc rounded; q = round(x / (d sc)) in -32..31, stored + 32. */
static void f32_to_q6_k(unsigned char *o, const float *src, size_t n)
{
    for (size_t b = 0; b < n / IG_QK_K; b++, o += IG_Q6_K_BYTES) {
        const float *x = src + b * IG_QK_K;
        float sc[16], smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            float a = 0.0f;
            for (int l = 0; l < 16; l++)
                a = fabsf(x[16 * j + l]) > a ? fabsf(x[16 * j + l]) : a;
            sc[j] = a / 31.0f;
            smax = sc[j] > smax ? sc[j] : smax;
        }
        uint16_t hd = ig_f32_to_f16(smax / 127.0f);
        float d = ig_f16_to_f32(hd);
        int L[IG_QK_K];
        signed char *scales = (signed char *)(o + 192);
        for (int j = 0; j < 16; j++) {
            int l8 = d > 0.0f ? clampi((int)lroundf(sc[j] / d), 0, 127) : 0;
            scales[j] = (signed char)l8;
            float s = d * (float)l8;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] =
                    s > 0.0f ? clampi((int)lroundf(x[16 * j + l] / s), -32, 31) + 32 : 32;
        }
        memcpy(o + 208, &hd, 2);
        unsigned char *ql = o, *qh = o + 128;
        for (int half = 0; half < 2; half++, ql += 64, qh += 32) {
            const int *Lh = L + 128 * half;
            for (int l = 0; l < 32; l++) {
                ql[l] = (unsigned char)((Lh[l] & 15) | (Lh[l + 64] & 15) << 4);
                ql[l + 32] = (unsigned char)((Lh[l + 32] & 15) | (Lh[l + 96] & 15) << 4);
                qh[l] = (unsigned char)((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 |
                                        (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
            }
        }
    }
}

void ig_dtype_to_f32(float *dst, const void *src, ig_dtype_t dtype, size_t n)
{
    if (dtype == IG_DTYPE_Q4_K)
        q4_k_to_f32(dst, src, n);
    else if (dtype == IG_DTYPE_Q6_K)
        q6_k_to_f32(dst, src, n);
    else if (dtype == IG_DTYPE_Q4_0)
        q4_0_to_f32(dst, src, n);
    else if (dtype == IG_DTYPE_Q8_0)
        q8_0_to_f32(dst, src, n);
    else if (dtype == IG_DTYPE_F32)
        memmove(dst, src, n * sizeof(float));
    else if (dtype == IG_DTYPE_F16)
        halves_to_f32(dst, src, n, 0);
    else if (dtype == IG_DTYPE_BF16)
        halves_to_f32(dst, src, n, 1);
}

void ig_dtype_from_f32(void *dst, ig_dtype_t dtype, const float *src, size_t n)
{
    if (dtype == IG_DTYPE_Q4_K)
        f32_to_q4_k(dst, src, n);
    else if (dtype == IG_DTYPE_Q6_K)
        f32_to_q6_k(dst, src, n);
    else if (dtype == IG_DTYPE_Q4_0)
        f32_to_q4_0(dst, src, n);
    else if (dtype == IG_DTYPE_Q8_0)
        f32_to_q8_0(dst, src, n);
    else if (dtype == IG_DTYPE_F32)
        memmove(dst, src, n * sizeof(float));
    else if (dtype == IG_DTYPE_F16)
        f32_to_halves(dst, src, n, 0);
    else if (dtype == IG_DTYPE_BF16)
        f32_to_halves(dst, src, n, 1);
}
