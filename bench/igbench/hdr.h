#ifndef IGB_HDR_H
#define IGB_HDR_H

/*
 * A log-linear latency histogram in the manner of HdrHistogram: values are
 * microseconds; below 2,048 µs every value has its own bucket, above it
 * each power of two is split into 1,024 buckets, so any value is known to
 * within 1/1024 (0.1%), and quantiles report the bucket middle (error <=
 * 0.05%): routing's targets compare two routers' p50s at 1.0x, and the
 * buckets must be finer than the differences they read.
 * Values above IGB_HDR_MAX_US (100 s) are clamped to it; the exact maximum,
 * minimum and sum are kept aside.
 */
#include <stddef.h>
#include <stdint.h>

#define IGB_HDR_MAX_US 100000000ull

typedef struct {
    uint64_t *counts;
    int nbuckets;
    uint64_t total;
    uint64_t min, max; /* exact, µs */
    double sum;        /* µs */
    /* The values in the order recorded, for igb_hdr_p50_interval(); NULL
     * unless igb_hdr_keep_order() asked for them (or could not have them). */
    uint32_t *seq;
    size_t nseq, seq_cap;
    int seq_lost; /* a value was not kept (the cap, or out of memory) */
} igb_hdr_t;

/* The batch means of igb_hdr_p50_interval(): this many consecutive batches,
 * each of at least IGB_HDR_BATCH_MIN values; at most IGB_HDR_SEQ_MAX values
 * are kept (16 MiB). */
#define IGB_HDR_BATCHES 10
#define IGB_HDR_BATCH_MIN 10
#define IGB_HDR_SEQ_MAX (1u << 22)

/* 0, or -1 when out of memory. */
int igb_hdr_init(igb_hdr_t *h);
void igb_hdr_dispose(igb_hdr_t *h);

/* Keeps every value recorded from now on, in order, as well. */
void igb_hdr_keep_order(igb_hdr_t *h);

/* Records one value in microseconds. */
void igb_hdr_record(igb_hdr_t *h, uint64_t us);

/* The value at quantile q in [0, 1] (0 when empty), in microseconds. q = 1
 * gives the exact maximum. */
double igb_hdr_quantile(const igb_hdr_t *h, double q);

double igb_hdr_mean(const igb_hdr_t *h);

/* The p50's 95% interval by batch means, in microseconds: the values in
 * the order recorded cut into IGB_HDR_BATCHES consecutive batches, the
 * p50 -+ t(0.975, 9) x the batches' p50s' standard deviation / sqrt(10),
 * within the least and the largest value. Latencies under load are not
 * independent (a busy period slows its neighbours); batches longer than a
 * busy period are nearly so, and the interval widens with the correlation
 * where the order statistics' would not. 0, or -1 without the values
 * (order not kept, some lost, or too few for the batches). */
int igb_hdr_p50_interval(const igb_hdr_t *h, double *lo, double *hi);

/* Bucket index of a value, and the [lo, hi) range of a bucket: for tests. */
int igb_hdr_index(uint64_t us);
void igb_hdr_range(int idx, uint64_t *lo, uint64_t *hi);

#endif
