#ifndef INFERGATE_USAGE_H
#define INFERGATE_USAGE_H

/*
 * The region's token counters and inter-token latency, measured where the
 * answers pass through the gateway (route/proxy.c): every local instance
 * and every site, as the client sees it.
 *
 * Tokens: an answer's `usage` object when it carries one (every whole
 * answer; a stream with stream_options.include_usage). A stream without
 * usage counts one generation token per event whose choices carry text or
 * delta.content (our workers and llama-server send one token an event),
 * and the proxy's prompt estimate as its prompt tokens.
 *
 * Inter-token latency: the gap between two consecutive content events of
 * one stream, at the moment their bytes reach the gateway. Events that
 * arrive in one read are gaps of 0: what the client sees too.
 */

#include <stddef.h>
#include <stdint.h>

#include "infergate/metrics.h"

/* infergate_prompt_tokens_total, infergate_generation_tokens_total and
 * infergate_inter_token_latency_seconds, each labelled model. */
typedef struct {
    ig_metric_t *prompt, *generation, *itl;
} ig_usage_families_t;

void ig_usage_families_register(ig_usage_families_t *f);

/* One answer's meter; zero it (or ig_usage_init) before use. */
typedef struct {
    char *tail; /* a stream's incomplete event, up to the next blank line */
    size_t tlen, tcap;
    uint64_t last_token_ns;       /* 0 before the first content event */
    long long events;             /* content events seen */
    long long prompt, completion; /* from usage; -1 while none came */
    int overflow;                 /* an event larger than the meter keeps: skipped */
    size_t line_len;              /* bytes of the line being read, over pieces */
    char line_first;              /* its first byte */
} ig_usage_meter_t;

void ig_usage_init(ig_usage_meter_t *m);

/* Stream bytes as they go to the client, at monotonic time now_ns. */
void ig_usage_stream(ig_usage_meter_t *m, const ig_usage_families_t *f, const char *model,
                     const char *buf, size_t len, uint64_t now_ns);

/* A whole JSON answer: reads its usage. */
void ig_usage_body(ig_usage_meter_t *m, const char *body, size_t len);

/* The answer is over: adds its tokens to the counters (prompt_estimate for a
 * stream that carried no usage) and frees the meter's memory. */
void ig_usage_end(ig_usage_meter_t *m, const ig_usage_families_t *f, const char *model,
                  int prompt_estimate);

#endif
