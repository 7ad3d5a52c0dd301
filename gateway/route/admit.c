/*
 * Admission decisions shared by the proxy and the routing simulator (see
 * include/infergate/admit.h).
 */
#include "infergate/admit.h"

#include <stddef.h>

int ig_admit_limit(const ig_router_t *r, const ig_router_upstream_t *u, int max_inflight)
{
    int cap = max_inflight > 0 ? max_inflight : u->slots > 0 ? 2 * u->slots : 64;
    int adaptive = ig_router_limit(r, u);
    return adaptive < cap ? adaptive : cap;
}

void ig_admit_mark(const ig_router_t *r, ig_router_upstream_t *const *ups, int n,
                   const unsigned char *tried, int max_inflight, uint64_t now_ns,
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
