#!/usr/bin/env python3
"""Whether routing-sim's standard errors are as large as the noise they stand for.

routing-sim reads a cell's loss as beyond the noise when it exceeds two
standard errors of the difference, each by batch means (bench/routing-sim/
sim.c, batch_se()). This runs the same fleets under DRAWS draws of the
arrivals (--rep 0..DRAWS-1) and, for every policy, cell and metric, takes
each pair of draws: (x_i - x_j) / sqrt(se_i^2 + se_j^2). Were the standard
errors exact, that would have a standard deviation of 1 and lie beyond 3 in
0.27% of pairs. Printed per metric and load: the standard deviation, a
robust one (the median |z| / 0.6745, which a few wild cells cannot move),
the share beyond 3, and the cells with the largest |z|.

usage: bench/routing-sim-noise.py BUILD [--fleets 60] [--draws 5]
                                  [--requests 30000] [--seed 1]
Writes bench/results/routing-sim-noise.json.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

POLICIES = ["latency", "least_inflight", "round_robin", "p2c", "nginx_lc", "haproxy_lc", "oracle"]
METRICS = ["ttft_p50", "ttft_p99"]


def run_draws(args, tmp):
    draws = []
    for rep in range(args.draws):
        out = os.path.join(tmp, f"rep{rep}.json")
        cmd = [os.path.join(args.build, "routing-sim"), "--fleets", str(args.fleets),
               "--requests", str(args.requests), "--seed", str(args.seed), "--jobs",
               str(os.cpu_count() or 1), "--rep", str(rep), "--json", out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            draws.append({(c["fleet"], c["load"]): c for c in json.load(f)["cells"]})
    return draws


def pair_z(draws, key, pol, m):
    """|z| of every pair of draws of one policy's metric in one cell."""
    v = [d[key][pol][m] for d in draws]
    se = [d[key][pol][m + "_se"] for d in draws]
    zs = []
    for i in range(len(v)):
        for j in range(i + 1, len(v)):
            den = math.hypot(se[i], se[j])
            if den > 0 and all(math.isfinite(x) for x in (v[i], v[j], den)):
                zs.append((v[i] - v[j]) / den)
    return zs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--fleets", type=int, default=60)
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--requests", type=int, default=30000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.draws < 2:
        sys.exit("routing-sim-noise: --draws must be at least 2")
    with tempfile.TemporaryDirectory() as tmp:
        draws = run_draws(args, tmp)
    keys = sorted(draws[0])
    loads = sorted({k[1] for k in keys})
    rows = []
    print(f"routing-sim-noise: {args.fleets} fleets (seed {args.seed}) x {args.draws} draws, "
          f"{args.requests} requests; z = difference of two draws / its standard error")
    print(f"{'metric':9s} {'load':>5s} {'pairs':>6s} {'sd':>5s} {'robust':>6s} {'>3':>6s}  largest |z| (fleet, policy)")
    for m in METRICS:
        for load in loads:
            zs = [(z, k[0], p) for k in keys if k[1] == load for p in POLICIES
                  for z in pair_z(draws, k, p, m)]
            a = sorted(abs(z) for z, _, _ in zs)
            sd = statistics.pstdev([z for z, _, _ in zs])
            robust = a[len(a) // 2] / 0.6745
            beyond3 = sum(x > 3 for x in a) / len(a)
            top = sorted(zs, key=lambda t: -abs(t[0]))[:4]
            print(f"{m:9s} {load:5.2f} {len(a):6d} {sd:5.2f} {robust:6.2f} {beyond3:6.2%}  "
                  + ", ".join(f"{abs(z):.1f} ({f}, {p})" for z, f, p in top))
            rows.append({"metric": m, "load": load, "pairs": len(a), "sd": sd,
                         "robust_sd": robust, "beyond_3": beyond3,
                         "largest": [{"z": abs(z), "fleet": f, "policy": p} for z, f, p in top]})
    res = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "routing-sim-noise.json")
    with open(res, "w") as f:
        json.dump({"bench": "routing-sim-noise", "fleets": args.fleets, "draws": args.draws,
                   "requests": args.requests, "seed": args.seed, "rows": rows}, f, indent=1)
    print(f"wrote {res}")


if __name__ == "__main__":
    main()
