#ifndef INFERGATE_PROM_TEXT_H
#define INFERGATE_PROM_TEXT_H

/*
 * Reading another server's Prometheus text exposition (version 0.0.4):
 * what a site running vLLM, SGLang, TGI or llama.cpp's server publishes at
 * GET /metrics. Only what the gateway reads of it: a metric's samples
 * summed over their labels (vLLM labels its gauges by model_name).
 * gateway/api/prom_text.c.
 */

#include <stddef.h>

/* Sums every sample of the metric named name (whole name; any labels) in
 * text; returns how many samples were read (0: none, *sum untouched). A
 * sample whose value does not parse, or is NaN, is skipped. Comment lines
 * and other metrics are passed over; text need not end in a newline. */
int ig_prom_sum(const char *text, size_t len, const char *name, double *sum);

#endif
