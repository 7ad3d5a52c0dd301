/*
 * The log-linear histogram of hdr.h. Index layout: values v < 2048 map to
 * bucket v. Above, with e = floor(log2 v) >= 11 and shift = e - 10, the
 * top eleven bits t = v >> shift lie in [1024, 2048) and v maps to
 * 2048 + (shift - 1) * 1024 + (t - 1024).
 */
#include "hdr.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    h->seq = NULL;
    h->nseq = h->seq_cap = 0;
    h->seq_lost = 0;
    return h->counts ? 0 : -1;
}

void igb_hdr_dispose(igb_hdr_t *h)
{
    free(h->counts);
    free(h->seq);
    h->counts = NULL;
    h->seq = NULL;
}

void igb_hdr_keep_order(igb_hdr_t *h)
{
    if (h->seq == NULL) {
        h->seq = malloc(1024 * sizeof(*h->seq));
        h->seq_cap = h->seq ? 1024 : 0;
    }
    /* Values recorded before now are not in the order (the interval would
     * be over part of them), and without the buffer none can be kept. */
    if (h->total > 0 || h->seq == NULL)
        h->seq_lost = 1;
}

static void keep(igb_hdr_t *h, uint64_t us)
{
    if (h->nseq == h->seq_cap) {
        size_t cap = h->seq_cap * 2;
        uint32_t *n = cap <= IGB_HDR_SEQ_MAX ? realloc(h->seq, cap * sizeof(*n)) : NULL;
        if (n == NULL) {
            h->seq_lost = 1;
            return;
        }
        h->seq = n;
        h->seq_cap = cap;
    }
    h->seq[h->nseq++] = (uint32_t)us;
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
    if (h->seq != NULL && !h->seq_lost)
        keep(h, us);
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

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

int igb_hdr_p50_interval(const igb_hdr_t *h, double *lo, double *hi)
{
    size_t len = h->nseq / IGB_HDR_BATCHES;
    if (h->seq == NULL || h->seq_lost || h->nseq != h->total || len < (size_t)IGB_HDR_BATCH_MIN)
        return -1;
    uint32_t *w = malloc(len * sizeof(*w));
    if (w == NULL)
        return -1;
    double s = 0, s2 = 0;
    for (int b = 0; b < IGB_HDR_BATCHES; b++) {
        memcpy(w, h->seq + (size_t)b * len, len * sizeof(*w));
        qsort(w, len, sizeof(*w), cmp_u32);
        double m = (double)w[(len + 1) / 2 - 1]; /* as igb_hdr_quantile(0.5) ranks */
        s += m;
        s2 += m * m;
    }
    free(w);
    _Static_assert(IGB_HDR_BATCHES == 10, "t975_9 is Student's t for 10 batches");
    const double t975_9 = 2.262; /* Student's t, 9 degrees of freedom */
    double k = IGB_HDR_BATCHES, var = fmax(s2 / k - (s / k) * (s / k), 0) * k / (k - 1);
    double half = t975_9 * sqrt(var / k), p50 = igb_hdr_quantile(h, 0.5);
    /* A run whose queue grows has batches far apart: the interval is then
     * wide, but never beyond the values seen. */
    *lo = fmax(p50 - half, (double)h->min);
    *hi = fmin(p50 + half, (double)h->max);
    return 0;
}
