/*
 * The log-linear histogram of hdr.h. Index layout: values v < 2048 map to
 * bucket v. Above, with e = floor(log2 v) >= 11 and shift = e - 10, the
 * top eleven bits t = v >> shift lie in [1024, 2048) and v maps to
 * 2048 + (shift - 1) * 1024 + (t - 1024).
 */
#include "hdr.h"

#include <stdlib.h>

#define SUB_BITS 10
#define SUB (1 << SUB_BITS)
#define LINEAR (2 * SUB)

int igb_hdr_index(uint64_t v)
{
    if (v < LINEAR)
        return (int)v;
    int e = 63 - __builtin_clzll(v);
    int shift = e - SUB_BITS;
    uint64_t t = v >> shift;
    return LINEAR + (shift - 1) * SUB + (int)(t - SUB);
}

void igb_hdr_range(int idx, uint64_t *lo, uint64_t *hi)
{
    if (idx < LINEAR) {
        *lo = (uint64_t)idx;
        *hi = (uint64_t)idx + 1;
        return;
    }
    int shift = (idx - LINEAR) / SUB + 1;
    uint64_t t = (uint64_t)((idx - LINEAR) % SUB + SUB);
    *lo = t << shift;
    *hi = (t + 1) << shift;
}

int igb_hdr_init(igb_hdr_t *h)
{
    h->nbuckets = igb_hdr_index(IGB_HDR_MAX_US) + 1;
    h->counts = calloc((size_t)h->nbuckets, sizeof(uint64_t));
    h->total = 0;
    h->min = UINT64_MAX;
    h->max = 0;
    h->sum = 0;
    return h->counts ? 0 : -1;
}

void igb_hdr_dispose(igb_hdr_t *h)
{
    free(h->counts);
    h->counts = NULL;
}

void igb_hdr_record(igb_hdr_t *h, uint64_t us)
{
    if (us < h->min)
        h->min = us;
    if (us > h->max)
        h->max = us;
    h->sum += (double)us;
    h->total++;
    if (us > IGB_HDR_MAX_US)
        us = IGB_HDR_MAX_US;
    h->counts[igb_hdr_index(us)]++;
}

double igb_hdr_quantile(const igb_hdr_t *h, double q)
{
    if (h->total == 0)
        return 0;
    if (q >= 1.0)
        return (double)h->max;
    /* The smallest value with at least ceil(q * total) values at or below it. */
    uint64_t rank = (uint64_t)(q * (double)h->total + 0.999999);
    if (rank < 1)
        rank = 1;
    uint64_t seen = 0;
    for (int i = 0; i < h->nbuckets; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t lo, hi;
            igb_hdr_range(i, &lo, &hi);
            double mid = hi - lo == 1 ? (double)lo : ((double)lo + (double)hi) / 2.0;
            if (mid > (double)h->max)
                mid = (double)h->max;
            if (mid < (double)h->min)
                mid = (double)h->min;
            return mid;
        }
    }
    return (double)h->max;
}

double igb_hdr_mean(const igb_hdr_t *h)
{
    return h->total ? h->sum / (double)h->total : 0;
}
