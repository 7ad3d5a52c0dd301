#ifndef INFERGATE_METRICS_H
#define INFERGATE_METRICS_H

/*
 * Prometheus metrics: one process-wide registry of counter, gauge and
 * histogram families with labels, rendered in the text exposition format
 * (HELP and TYPE lines). Names follow Prometheus conventions: snake_case,
 * base units, counters end in _total, all prefixed infergate_.
 *
 * Registration returns a family handle that lives until ig_metrics_reset().
 * Registering the same name twice returns the same family (the type and
 * label names must match). Updates are thread-safe (the engine thread of a
 * worker updates them too) and take label values in the order the label
 * names were given; a family has at most IG_METRICS_MAX_LABELS labels.
 */

#include <stddef.h>

#include "infergate/strbuf.h"

#define IG_METRICS_MAX_LABELS 4

typedef struct ig_metric_s ig_metric_t;

/* label_names is a comma-separated list ("route,status") or NULL for none. */
ig_metric_t *ig_metrics_counter(const char *name, const char *help, const char *label_names);
ig_metric_t *ig_metrics_gauge(const char *name, const char *help, const char *label_names);
/* buckets: upper bounds in ascending order (the +Inf bucket is implicit);
 * copied. NULL picks latency buckets from 1 ms to 60 s. */
ig_metric_t *ig_metrics_histogram(const char *name, const char *help, const char *label_names,
                                  const double *buckets, size_t nbuckets);

/* Label values follow v, one const char * per label of the family. */
void ig_metric_add(ig_metric_t *m, double v, ...);     /* counter (v >= 0) or gauge */
void ig_metric_set(ig_metric_t *m, double v, ...);     /* gauge */
void ig_metric_observe(ig_metric_t *m, double v, ...); /* histogram */

/* A gauge whose value is read at render time from fn(data); no labels. */
void ig_metrics_gauge_fn(const char *name, const char *help, double (*fn)(void *data), void *data);

/* A gauge family with labels whose samples are read at render time:
 * collect(data, emit, ctx) calls emit(ctx, values, v) once per series, with
 * one label value per label of the family, in the order they are to be
 * shown. It runs under the registry's lock, so it must not update metrics.
 * Registering the name again points the family at the new source. */
typedef void ig_metrics_emit_fn(void *ctx, const char *const *values, double v);
typedef void ig_metrics_collect_fn(void *data, ig_metrics_emit_fn *emit, void *ctx);
void ig_metrics_gauge_collect(const char *name, const char *help, const char *label_names,
                              ig_metrics_collect_fn *collect, void *data);
/* Detaches every family read at render time from data (ig_metrics_gauge_fn
 * or _collect): call it before data is freed; such a family renders no
 * samples until it is registered again. */
void ig_metrics_detach(const void *data);

/* Renders every family. Returns a malloc'ed NUL-terminated string (the
 * caller frees it) or NULL when out of memory. */
char *ig_metrics_render(size_t *len);

/* Appends s escaped for the text format: \ and newline always (HELP text),
 * and " too when quote (a label value). */
void ig_metrics_put_escaped(ig_strbuf_t *b, const char *s, int quote);

/* Frees every family (tests and shutdown). Handles become invalid. */
void ig_metrics_reset(void);

#endif
