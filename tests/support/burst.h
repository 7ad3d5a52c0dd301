#ifndef IG_TEST_BURST_H
#define IG_TEST_BURST_H

/*
 * A burst of concurrent POSTs to a gateway, one thread and one connection
 * each (ig_gwf_post): every answer's status, how long it took, and its
 * x-infergate-upstream and x-infergate-route headers. Header-only: the
 * routing tests that send load at once include it.
 */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gwfixture.h"

#define IG_BURST_MAX 64

typedef struct {
    int port;
    const char *path;
    const char *body;
    int timeout_ms;
    /* answers */
    int status; /* -1: no answer within timeout_ms */
    long long ms;
    char upstream[64];
    char route[512];
} ig_burst_one_t;

static void *ig_burst_thread(void *arg)
{
    ig_burst_one_t *b = arg;
    ig_tc_response_t r;
    long long t0 = ig_tc_now_ms();
    b->status = -1;
    if (ig_gwf_post(b->port, b->path, b->body, &r, b->timeout_ms) == 0) {
        b->status = r.status;
        const char *u = ig_tc_header(&r, "x-infergate-upstream");
        const char *h = ig_tc_header(&r, "x-infergate-route");
        snprintf(b->upstream, sizeof(b->upstream), "%s", u ? u : "");
        snprintf(b->route, sizeof(b->route), "%s", h ? h : "");
        ig_tc_response_free(&r);
    }
    b->ms = ig_tc_now_ms() - t0;
    return NULL;
}

/* Sends n (at most IG_BURST_MAX) POSTs of body to path at once and waits
 * for all; out[0..n) holds each. Returns how many answered 200. */
static inline int ig_burst(int port, const char *path, const char *body, int n, int timeout_ms,
                           ig_burst_one_t *out)
{
    pthread_t th[IG_BURST_MAX];
    if (n > IG_BURST_MAX)
        n = IG_BURST_MAX;
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        out[i].port = port;
        out[i].path = path;
        out[i].body = body;
        out[i].timeout_ms = timeout_ms;
        if (pthread_create(&th[i], NULL, ig_burst_thread, &out[i]) != 0)
            out[i].status = -2;
    }
    int ok = 0;
    for (int i = 0; i < n; i++) {
        if (out[i].status != -2)
            pthread_join(th[i], NULL);
        ok += out[i].status == 200;
    }
    return ok;
}

/* The number after "key=" in a route header, or -1 (ig_tc_route_num). */
static inline double ig_burst_route_num(const char *route, const char *key)
{
    return ig_tc_route_num(route, key);
}

#endif
