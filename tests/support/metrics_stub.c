/*
 * TEMPORARY: a do-nothing stand-in for gateway/metrics.c so that the HTTP
 * tests link before the metrics module is merged. DELETE this file once
 * `git merge main` brings gateway/metrics.c (duplicate symbols otherwise).
 */
#include "infergate/metrics.h"

#include <stdlib.h>
#include <string.h>

struct ig_metric_s {
    int unused;
};

static ig_metric_t stub_metric;

ig_metric_t *ig_metrics_counter(const char *name, const char *help, const char *label_names)
{
    return &stub_metric;
}

ig_metric_t *ig_metrics_gauge(const char *name, const char *help, const char *label_names)
{
    return &stub_metric;
}

ig_metric_t *ig_metrics_histogram(const char *name, const char *help, const char *label_names,
                                  const double *buckets, size_t nbuckets)
{
    return &stub_metric;
}

void ig_metric_add(ig_metric_t *m, double v, ...) {}

void ig_metric_set(ig_metric_t *m, double v, ...) {}

void ig_metric_observe(ig_metric_t *m, double v, ...) {}

void ig_metrics_gauge_fn(const char *name, const char *help, double (*fn)(void *data), void *data)
{
}

char *ig_metrics_render(size_t *len)
{
    if (len != NULL)
        *len = 0;
    return strdup("");
}

void ig_metrics_reset(void) {}
