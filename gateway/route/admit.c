/*
 * Admission decisions shared by the proxy and the routing simulator (see
 * include/infergate/admit.h).
 */
#include "infergate/admit.h"

#include <math.h>
#include <stddef.h>

int ig_admit_limit(const ig_router_t *r, const ig_router_upstream_t *u, int max_inflight)
{
    int cap = max_inflight > 0 ? max_inflight
              : u->slots > 0   ? 2 * u->slots
                               : IG_ROUTER_UNREPORTED_CAP;
    int adaptive = ig_router_limit(r, u);
    return adaptive < cap ? adaptive : cap;
}

/*
 * The latency policy: rather than queue a request behind others at an
 * upstream that would make it wait longer than a place at one now at its
 * limit, hold it in the gateway's queue. Each upstream at its limit that
 * answered within the delay it is expected to make a request wait
 * (ig_router_delay(); one silent for longer, stalled or slower than
 * believed, is not waited for) offers that delay; an upstream with room
 * that would queue the request (ig_router_would_queue()) and is expected
 * to be slower than the least of those offers is counted as at its limit
 * too. One with a free place is never passed over, so no capacity idles
 * while requests wait. Without this an upstream whose limit is high (64
 * when it reports no slots) took every request the others' limits turned
 * away, however long its queue: a 2-slot upstream 60 deep in one of the
 * simulator's fleets. The request waits in the gateway, where the next
 * place to come free takes it; over 200 random fleets x 3 loads x 30,000
 * requests (docs/routing.md, "The latency pick") the cells within 0.9x
 * the best baseline's TTFT p99 went from 83% to 85-86% of those with
 * room, the cells over 1.1x from 37 to 30-35.
 *
 * Only an upstream that reports its slots offers a place. One that
 * reports none is at the proxy's cap (64), which is not its capacity, and
 * its delay rests on a learned C that a batch slowdown read as a queue
 * can put several times low, as it can the C that says an upstream with
 * room would queue: over the simulator's fleets of 64-slot upstreams that
 * report nothing, one of them at the cap held requests in the gateway
 * while the others had room, until its queue was full and refused a
 * fifth of them (docs/routing.md, "Measured").
 *
 * held: the requests of the model already waiting in the gateway's queue.
 * The places that come free serve them all, so the wait for one grows
 * with them; without that term a queue that grew faster than the places
 * drained it was held until its timeout refused requests while an
 * upstream had room (fleet 29 at 90%, docs/routing.md, rule 5). Every
 * request is weighed against the whole queue, the one it lets go too: a
 * newcomer that counted it and a head that did not sent newcomers past
 * the head, out of order.
 */
static void hold_rather_than_queue(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                                   const unsigned char *tried, int held, uint64_t now_ns,
                                   unsigned char *exclude, ig_admit_view_t *view)
{
    double wait = INFINITY, rate = 0;
    for (int i = 0; i < n; i++) {
        const ig_router_upstream_t *u = ups[i];
        if (!exclude[i] || (tried != NULL && tried[i]) || !ig_router_eligible(u, now_ns))
            continue;
        if (u->slots <= 0) /* its limit is not its capacity (above) */
            continue;
        /* Silent since its last answer, or since it last became busy:
         * an idle spell is not a stall. */
        double d = ig_router_delay(r, u, now_ns);
        uint64_t since = u->done_at_ns > u->busy_since_ns ? u->done_at_ns : u->busy_since_ns;
        if (d > 0 && u->done_at_ns != 0 &&
            (now_ns <= since || (double)(now_ns - since) / 1e9 <= d)) {
            wait = fmin(wait, d);
            if (u->occupancy_s > 0)
                rate += u->slots / u->occupancy_s; /* places it frees a second */
        }
    }
    if (wait == INFINITY)
        return;
    /* The places that come free serve the whole queue: while they cannot
     * drain it within what the upstream with room offers, that one takes
     * the request. */
    if (held > 0) {
        if (!(rate > 0))
            return;
        wait += held / rate;
    }
    for (int i = 0; i < n; i++) {
        const ig_router_upstream_t *u = ups[i];
        if (exclude[i] || !ig_router_eligible(u, now_ns) || !ig_router_would_queue(u))
            continue;
        if (ig_router_delay(r, u, now_ns) > wait) {
            exclude[i] = 1;
            view->saturated++;
        }
    }
}

void ig_admit_mark(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                   const unsigned char *tried, int max_inflight, int held, uint64_t now_ns,
                   unsigned char *exclude, ig_admit_view_t *view)
{
    view->eligible = view->saturated = 0;
    for (int i = 0; i < n; i++) {
        int t = tried != NULL && tried[i];
        int e = ig_router_eligible(ups[i], now_ns);
        int sat = e && ups[i]->inflight >= ig_admit_limit(r, ups[i], max_inflight);
        exclude[i] = t || sat;
        view->eligible += e && !t;
        view->saturated += e && !t && sat;
    }
    /* Only when some are at their limit and some are not: the common
     * decision pays nothing for it. */
    if (r->opts.policy == IG_ROUTE_LATENCY && view->saturated > 0 &&
        view->saturated < view->eligible)
        hold_rather_than_queue(r, ups, n, tried, held, now_ns, exclude, view);
}

ig_admit_verdict_t ig_admit_unplaced(const ig_admit_view_t *view, int answered, int failed,
                                     int starting)
{
    if (answered && view->eligible == 0)
        return IG_ADMIT_LAST_FAILURE;
    if ((view->saturated > 0 && view->saturated == view->eligible) ||
        (view->eligible == 0 && starting))
        return IG_ADMIT_QUEUE;
    return failed ? IG_ADMIT_LAST_FAILURE : IG_ADMIT_NO_UPSTREAM;
}
