#!/usr/bin/env python3
"""What an omniscient router could reach on bench/routing-foreign.sh's fleets.

A discrete-event simulation, not a benchmark of the gateway: Poisson
arrivals at LOAD x the fleet's capacity, each upstream C slots with
exponential service (mean S) and a FIFO queue behind them, a fixed RTT
added to each answer. The policies see the true number of requests in each
upstream and the true C, S and RTT:

  least_inflight  the fewest in flight (ties at random)
  cost W K        rtt + W x wait + S + K x sd, wait = max(0, n + 1 - C) S / C,
                  sd = sqrt(S^2 + max(0, n + 1 - C) (S / C)^2): the mean
                  TTFT with the wait weighed W times, plus K standard
                  deviations (gateway/route/router.c's ranked_cost, with
                  the estimates exact)

Also a bound for any router at all, informed or not (any_router_bound():
no queueing, each upstream at most its capacity): on the narrow fleet at
50% and 70% it is 0.97x of the p99 least_inflight measures there, so the
issue's p99 target cannot be met on that shape by any router.

Prints p50 and p99 TTFT and their ratios to least_inflight's, and writes
them to bench/results/routing-oracle.json. It bounds what estimates can
buy: a target the best of these cannot reach on a fleet is not one that
learned estimates will reach (docs/routing.md, "The tail").

On the shift fleet the router knows each upstream's speed at every moment:
the two that slow down do so after half the arrivals.

usage: bench/routing-oracle.py [--requests N] [--seed S]
                               [--fleets issue,narrow,shift] [--loads 0.5,0.7,0.9]
"""
import argparse
import heapq
import json
import math
import os
import random
import time

# (slots, mean service s, rtt s[, mean service s from half way on]):
# bench/routing-foreign.sh's shapes
FLEETS = {
    "issue": [(4, .020, 0), (4, .020, 0), (4, .020, 0), (4, .060, 0), (8, .020, .040)],
    "narrow": [(1, .005, 0), (16, .100, 0), (16, .100, 0)],
    "shift": [(4, .020, 0), (4, .020, 0), (4, .020, 0, .050), (4, .020, 0, .050)],
}
COSTS = [(3, 0), (5, 0), (8, 0), (3, 1), (5, 1), (8, 1)]


def capacity(fleet):
    """Requests a second, each upstream at its slower speed (as the bench)."""
    return sum(u[0] / max(u[1], u[3] if len(u) > 3 else u[1]) for u in fleet)


def service(fleet, u, later):
    """Upstream u's mean service time now: its later one from half way on."""
    return fleet[u][3] if later and len(fleet[u]) > 3 else fleet[u][1]


def phases(fleet):
    """The fleet as (slots, mean service s, rtt s) per phase: one, or the
    halves before and after the shift fleet's slowdown."""
    if not any(len(u) > 3 for u in fleet):
        return [[tuple(u[:3]) for u in fleet]]
    return [[tuple(u[:3]) for u in fleet],
            [(u[0], u[3] if len(u) > 3 else u[1], u[2]) for u in fleet]]


def any_router_bound(fleet, load, q):
    """A lower bound on the q-quantile TTFT (s) that ANY router reaches.

    Nothing waits (every request is served at once), and the only limit is
    that an upstream cannot take more than its capacity (slots / mean) of
    the offered rate. A request sent to u takes rtt + an exponential
    service, whatever the router knew: it cannot see the service time
    before it sends. For a time t, the least share of requests above t is
    the split that fills the upstreams least likely to exceed t first, each
    up to its capacity; the bound is the least t where that share is
    1 - q. Queueing only adds to it, so a cell where this bound is above a
    target is one no router meets."""
    lam = load * capacity(fleet)

    def least_over(ph, t):
        over = sorted((1.0 if t < rtt else math.exp(-(t - rtt) / s), c / s / lam)
                      for c, s, rtt in ph)
        left, share = 1.0, 0.0
        for p, room in over:
            take = min(room, left)
            share += take * p
            left -= take
        return share if left <= 1e-12 else 1.0

    lo, hi = 0.0, 60.0
    for _ in range(60):
        t = (lo + hi) / 2
        if sum(least_over(ph, t) for ph in phases(fleet)) / len(phases(fleet)) <= 1 - q:
            hi = t
        else:
            lo = t
    return hi


def pick_cost(fleet, insys, w, k, later):
    best, chosen = None, 0
    for i, up in enumerate(fleet):
        c, rtt, s = up[0], up[2], service(fleet, i, later)
        ahead = max(0, insys[i] + 1 - c)
        cost = rtt + w * ahead * s / c + s
        if k > 0:
            cost += k * math.sqrt(s * s + ahead * (s / c) ** 2)
        if best is None or cost < best:
            best, chosen = cost, i
    return chosen


def simulate(fleet, load, policy, n, seed):
    rnd = random.Random(seed)
    lam = load * capacity(fleet)
    nu = len(fleet)
    busy, insys, waiting = [0] * nu, [0] * nu, [[] for _ in range(nu)]
    events, lat, seq, issued = [], [], 0, 0
    next_arrival = rnd.expovariate(lam)
    while issued < n or events:
        if issued < n and (not events or next_arrival < events[0][0]):
            t = next_arrival
            next_arrival = t + rnd.expovariate(lam)
            issued += 1
            later = issued > n // 2
            if policy[0] == "least_inflight":
                low = min(insys)
                u = rnd.choice([i for i in range(nu) if insys[i] == low])
            else:
                u = pick_cost(fleet, insys, policy[1], policy[2], later)
            insys[u] += 1
            if busy[u] < fleet[u][0]:
                busy[u] += 1
                seq += 1
                heapq.heappush(events,
                               (t + rnd.expovariate(1 / service(fleet, u, later)), seq, u, t))
            else:
                waiting[u].append(t)
        else:
            t, _, u, began = heapq.heappop(events)
            lat.append(t - began + fleet[u][2])
            insys[u] -= 1
            if waiting[u]:
                seq += 1
                s = service(fleet, u, issued > n // 2)
                heapq.heappush(events, (t + rnd.expovariate(1 / s), seq, u, waiting[u].pop(0)))
            else:
                busy[u] -= 1
    lat.sort()
    return lat[len(lat) // 2] * 1e3, lat[int(0.99 * len(lat))] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fleets", default="issue,narrow,shift")
    ap.add_argument("--loads", default="0.5,0.7,0.9")
    a = ap.parse_args()
    if not 1000 <= a.requests <= 1000000:
        raise SystemExit("routing-oracle: --requests must be within 1000..1000000")
    out = {"scenario": "routing-oracle", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "bench/routing-oracle.py", "requests": a.requests, "seed": a.seed,
           "cells": {}}
    for name in a.fleets.split(","):
        for load in (float(x) for x in a.loads.split(",")):
            base = simulate(FLEETS[name], load, ("least_inflight",), a.requests, a.seed)
            bound = [1e3 * any_router_bound(FLEETS[name], load, q) for q in (0.5, 0.99)]
            cell = {"least_inflight": {"p50_ms": base[0], "p99_ms": base[1]},
                    "any_router_bound": {"p50_ms": bound[0], "p99_ms": bound[1],
                                         "p99_ratio": bound[1] / base[1]}}
            print("%-6s %.1f least_inflight p50 %6.1f p99 %6.1f ms; any router: p50 >= %.1f, "
                  "p99 >= %.1f ms (%.2fx)" % (name, load, *base, *bound, bound[1] / base[1]))
            for w, k in COSTS:
                p50, p99 = simulate(FLEETS[name], load, ("cost", w, k), a.requests, a.seed)
                met = p99 <= 0.8 * base[1] and p50 <= base[0]
                cell["cost w=%g k=%g" % (w, k)] = {
                    "p50_ms": p50, "p99_ms": p99, "p99_ratio": p99 / base[1],
                    "p50_ratio": p50 / base[0], "targets_met": met}
                print("%-6s %.1f cost w=%g k=%g    p50 %6.1f p99 %6.1f ms: p99 %.2fx p50 %.2fx%s"
                      % (name, load, w, k, p50, p99, p99 / base[1], p50 / base[0],
                         "  (both targets)" if met else ""), flush=True)
            out["cells"]["%s@%g" % (name, load)] = cell
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "routing-oracle.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
