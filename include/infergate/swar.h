#ifndef INFERGATE_SWAR_H
#define INFERGATE_SWAR_H

/*
 * Eight bytes at a time in a 64-bit word: the tests that let a scanner step
 * over ordinary bytes (the JSON parser's strings, the HTTP header scan).
 * Each returns nonzero when some byte of w matches, with that byte's high
 * bit set; a borrow may also set the bit of a later byte, never of an
 * earlier one, so the first bit set is a true match (ig_swar_first).
 */
#include <stdint.h>
#include <string.h>

#define IG_SWAR_ONES 0x0101010101010101ULL
#define IG_SWAR_HIGH 0x8080808080808080ULL

/* Some byte of w is below n (n <= 128; bytes of 128 and up never are). */
static inline uint64_t ig_swar_below(uint64_t w, unsigned n)
{
    return (w - IG_SWAR_ONES * n) & ~w & IG_SWAR_HIGH;
}

/* Some byte of w is c. */
static inline uint64_t ig_swar_eq(uint64_t w, unsigned char c)
{
    return ig_swar_below(w ^ (IG_SWAR_ONES * c), 1);
}

/* The eight bytes at p as one word, the first in its low byte (on any
 * machine: that is what ig_swar_first counts on). */
static inline uint64_t ig_swar_load(const char *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* Where the first match is, 0 to 7, from a test's nonzero result. */
static inline unsigned ig_swar_first(uint64_t match)
{
    return (unsigned)__builtin_ctzll(match) / 8;
}

#endif
