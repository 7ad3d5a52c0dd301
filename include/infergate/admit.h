#ifndef INFERGATE_ADMIT_H
#define INFERGATE_ADMIT_H

/*
 * Admission: which upstreams may take a new attempt now, and what to do
 * with a request when none may. Pure decisions over the router's state (no
 * loop, no clock of its own): the proxy (gateway/route/proxy.c) and the
 * routing simulator (bench/routing-sim/) call this one copy.
 */

#include "infergate/router.h"

/* The attempts u may have in flight: the configured cap max_inflight (0:
 * twice its reported slots, or 64), and under it the router's adaptive
 * limit (ig_router_limit()). */
int ig_admit_limit(const ig_router_t *r, const ig_router_upstream_t *u, int max_inflight);

/* How ups[0..n) stand for one request. held: the requests of its model
 * waiting in the gateway's queue now (those the places that come free
 * serve first). tried (n entries, may be NULL):
 * nonzero for an upstream this request already tried. exclude (n entries,
 * filled): nonzero for each one ig_router_pick must skip (tried, or at its
 * limit). eligible: those that may serve it and were not tried; saturated:
 * of those, the ones at their limit, and under the latency policy those
 * that would queue it for longer than a place at one at its limit is
 * expected to take (the request then waits in the gateway; admit.c). */
typedef struct {
    int eligible;
    int saturated;
} ig_admit_view_t;

void ig_admit_mark(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                   const unsigned char *tried, int max_inflight, int held, uint64_t now_ns,
                   unsigned char *exclude, ig_admit_view_t *view);

/* What a request whose pick found no upstream becomes. */
typedef enum {
    IG_ADMIT_QUEUE = 0,    /* every eligible one is at its limit (or one is
                              starting): hold it in the gateway's queue */
    IG_ADMIT_LAST_FAILURE, /* it was tried and failed everywhere: answer
                              with its last failure */
    IG_ADMIT_NO_UPSTREAM,  /* nothing can serve it: 503 */
} ig_admit_verdict_t;

/* answered: an upstream already answered this request with a failure
 * status; failed: it failed before (a status or a transport error);
 * starting: an instance is on its way up. */
ig_admit_verdict_t ig_admit_unplaced(const ig_admit_view_t *view, int answered, int failed,
                                     int starting);

#endif
