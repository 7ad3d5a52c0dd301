#!/bin/bash
# Coordinated omission, shown: the test upstream freezes for STALL seconds in
# the middle of the run. igbench measures it open loop (Poisson arrivals at
# RATE, latency from the scheduled send) and closed loop (one user, latency
# from the actual send). Prints both tails and the ratio open/closed p99 --
# the factor by which a closed-loop benchmark under-reports the stall -- and
# writes bench/results/stall-omission.json and .png.
#
# usage: bench/stall-omission.sh [BUILD_DIR]        (default: build)
# environment:
#   RATE=40          open-loop arrivals per second
#   DURATION=4       seconds of each run
#   STALL=1          seconds the upstream freezes, starting 1 s into the run
#   SERVICE_MS=10    the upstream's normal service time
#   RESULTS=bench/results/stall-omission.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init stall-omission "$@"
bench_env RATE=40 DURATION=4 STALL=1 SERVICE_MS=10
check_bounds "int($DURATION) <= 120 and int($STALL) <= 30" "DURATION <= 120 and STALL <= 30"
need_built igbench testupstream
kill_on_exit up_pid

# One run against a fresh upstream (its stall clock starts at its first request).
run() {
    local tag=$1
    shift
    rm -f "$tmp/up.out"
    "$build/testupstream" --quiet --delay-ms "$SERVICE_MS" --stall-at 1 --stall-for "$STALL" \
        >"$tmp/up.out" &
    up_pid=$!
    local port
    port=$(port_of "$tmp/up.out")
    "$build/igbench" --quiet --target "127.0.0.1:$port" --duration "$DURATION" \
        --timeout $((${STALL%.*} + 10)) --json "$tmp/$tag.json" "$@"
    kill "$up_pid"
    wait "$up_pid" 2>/dev/null || true
    up_pid=""
}

run open --rate "$RATE"
run closed --concurrency 1

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$tmp/open.json" "$tmp/closed.json" "$RESULTS" "$STALL" "$SERVICE_MS" <<'PYEOF'
import json, sys
o, c = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
out, stall, service = sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
qs = ["p50", "p90", "p99", "p99.9", "max"]
lo, lc = o["latency_ms"]["e2e"], c["latency_ms"]["e2e"]
print("  %-8s %8s " % ("loop", "requests") + " ".join("%10s" % q for q in qs) + "  (ms)")
for name, l in (("open", lo), ("closed", lc)):
    print("  %-8s %8d " % (name, l["count"]) + " ".join("%10.2f" % l[q] for q in qs))
ratio = lo["p99"] / lc["p99"] if lc["p99"] > 0 else float("inf")
print("stall-omission: a %.1f s stall: open-loop p99 / closed-loop p99 = %.1f" % (stall, ratio))
res = {
    "scenario": "stall-omission",
    "what": "p99 of open vs closed loop through an upstream stall (coordinated omission)",
    "params": {"stall_s": stall, "service_ms": service, "open": o["params"], "closed": c["params"]},
    "open": {"e2e_ms": lo, "errors": o["errors"], "peak_connections": o["connections"]["peak_open"]},
    "closed": {"e2e_ms": lc, "errors": c["errors"]},
    "ratio_open_over_closed_p99": ratio,
    "plot": {"title": "a %.1f s upstream stall: open vs closed loop (e2e, ms)" % stall,
             "xlabel": "quantile (1=p50 2=p90 3=p99 4=p99.9 5=max)", "ylabel": "latency (ms)",
             "x": [1, 2, 3, 4, 5],
             "series": {"open loop": [lo[q] for q in qs], "closed loop": [lc[q] for q in qs]}},
}
json.dump(res, open(out, "w"), indent=2)
print("stall-omission: wrote " + out)
PYEOF
bench_plot
