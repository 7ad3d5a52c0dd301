#ifndef INFERGATE_BITS_H
#define INFERGATE_BITS_H

/* The smallest power of two that is at least n and at least lo (a power of
 * two itself), at most 2^30: the bucket count of a hash table for n
 * entries. */
static inline unsigned ig_pow2_at_least(unsigned n, unsigned lo)
{
    unsigned p = lo;
    while (p < n && p < (1u << 30))
        p <<= 1;
    return p;
}

#endif
