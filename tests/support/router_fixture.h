#ifndef INFERGATE_TEST_ROUTER_FIXTURE_H
#define INFERGATE_TEST_ROUTER_FIXTURE_H

/* Test support: routers for the router's unit tests. */

#include "infergate/router.h"

/* A router with the default options but policy. */
static inline ig_router_t ig_trouter(ig_route_policy_t policy)
{
    ig_router_opts_t o;
    ig_router_opts_default(&o);
    o.policy = policy;
    ig_router_t r;
    ig_router_init(&r, &o);
    return r;
}

#endif
