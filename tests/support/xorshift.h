#ifndef INFERGATE_TEST_XORSHIFT_H
#define INFERGATE_TEST_XORSHIFT_H

/*
 * Test support: xorshift64, a reproducible stream of pseudo-random numbers
 * for the kernel tests (each keeps its own state and seed, so that one
 * test's draws do not move another's).
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline uint64_t ig_xs_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Uniform in [-1, 1), from the top 53 bits. */
static inline float ig_xs_float(uint64_t *s)
{
    return (float)((double)(ig_xs_next(s) >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* n floats of ig_xs_float() times scale, malloc'd with 64 bytes of slack for
 * kernels that read past the end; the test ends when there is no memory. */
static inline float *ig_xs_buf(uint64_t *s, size_t n, float scale)
{
    float *p = malloc(n * sizeof(float) + 64);
    if (p == NULL) {
        fprintf(stderr, "ig_xs_buf: out of memory\n");
        abort();
    }
    for (size_t i = 0; i < n; i++)
        p[i] = ig_xs_float(s) * scale;
    return p;
}

#endif
