#!/bin/bash
# The cost objective against the latency objective on a fleet of a cheap
# colo site and a pay-per-token cloud. Two build/testupstream processes
# stand in for them: "colo" (SLOTS_COLO slots, first token after 10 ms, 20 ms
# in all; priced per hour) and "cloud" (32 slots, 15 ms to the first token,
# 30 ms in all, +10 ms RTT through faultproxy; priced per token). For each
# load (a fraction of colo's capacity) and each objective, a fresh gateway
# gets the same seeded open-loop Poisson schedule, streamed, with
# routing.slo_ttft_ms = SLO_MS. Prints each run's share of answers from colo,
# TTFT p50/p99 against the SLO, errors and the cloud's bill (its
# infergate_cost_usd_total), and the ratios cost/latency of the cloud bill;
# writes bench/results/cost-routing.json and a plot of the cost per 1M
# output tokens (idle colo capacity included) against load.
#
# The floor: colo's capacity in a run is its slots over the mean time an
# answer held a slot (testupstream's slot_s / slot_holds over the run), cap,
# below SLOTS_COLO / 20 ms where timers fire late (a loaded machine). Over a
# run of D = WARMUP + DURATION seconds that sends N requests, colo can answer
# at most cap x (D + SLO) of them (the last may wait up to the SLO in its
# queue), so any router sends the cloud at least
#
#   floor = max(0, 1 - cap x (D + SLO) / N)
#
# of them (cap from the cost objective's run, where colo is busiest);
# floor x N over the latency objective's cloud answers is the least
# cost/latency ratio of the cloud's bill any router could show (all answers
# have TOKENS tokens, so the bill is in proportion to the answers). Each run
# also reports how busy colo's slots were: slot time held over SLOTS_COLO x D.
#
# Targets (docs/routing.md, "The cost objective"), printed as met or not:
# the cost objective meets the SLO at p99 with no errors at every load; at a
# LOAD up to 0.5 it serves >= 90% from colo; above 1 its cloud share is
# within FLOOR_SLACK (0.02) of the floor. Issue 32's own figure, a cloud
# bill <= 0.8x the latency objective's at 1.5, is printed too: it holds only
# where the latency objective leaves colo idle enough (the floor's ratio is
# printed beside it).
#
# usage: bench/cost-routing.sh [BUILD_DIR]      (default: build)
# environment:
#   LOADS="0.5 1.5"   offered load as fractions of colo's capacity
#   DURATION=15       seconds measured per run (after WARMUP)
#   WARMUP=3
#   SLO_MS=150        the TTFT SLO
#   SLOTS_COLO=4
#   COLO_PER_HOUR=2   colo's price, USD per hour
#   CLOUD_IN=0.5 CLOUD_OUT=1.5   the cloud's price, USD per 1M tokens
#   SEED=1
#   FLOOR_SLACK=0.02  the cloud share the cost objective may leave above the floor
#   RESULTS=bench/results/cost-routing.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init cost-routing "$@"
LOADS=${LOADS:-"0.5 1.5"}
DURATION=${DURATION:-15}
WARMUP=${WARMUP:-3}
SLO_MS=${SLO_MS:-150}
SLOTS_COLO=${SLOTS_COLO:-4}
COLO_PER_HOUR=${COLO_PER_HOUR:-2}
CLOUD_IN=${CLOUD_IN:-0.5}
CLOUD_OUT=${CLOUD_OUT:-1.5}
SEED=${SEED:-1}
FLOOR_SLACK=${FLOOR_SLACK:-0.02}
TOKENS=8
RESULTS=${RESULTS:-$root/bench/results/cost-routing.json}
check_bounds "0 < $DURATION <= 120 and 0 <= $WARMUP <= 30 and 0 < $SLO_MS <= 10000
      and 1 <= $SLOTS_COLO <= 64" \
    "DURATION <= 120, WARMUP <= 30, SLO_MS <= 10000, SLOTS_COLO <= 64"
need_built igbench faultproxy testupstream infergate
pids=()
gw_pid=""
kill_on_exit gw_pid pids

# colo: 10 ms to the first token, 20 ms in all; cloud: 15 ms and 30 ms.
"$build/testupstream" --quiet --instant-raw --slots "$SLOTS_COLO" --delay-ms 10 \
    --itl-ms 1.43 --tokens "$TOKENS" --seed 1 >"$tmp/colo.out" &
pids+=($!)
"$build/testupstream" --quiet --instant-raw --slots 32 --delay-ms 15 --itl-ms 2.14 \
    --tokens "$TOKENS" --seed 2 >"$tmp/cloud.out" &
pids+=($!)
colo_port=$(port_of "$tmp/colo.out")
cloud_port=$(port_of "$tmp/cloud.out")
"$build/faultproxy" --quiet --target "127.0.0.1:$cloud_port" --delay-ms 5 >"$tmp/fp.out" &
pids+=($!)
fp_port=$(port_of "$tmp/fp.out")
capacity=$("$PY" -c "print($SLOTS_COLO / 0.020)")
echo "cost-routing: colo $SLOTS_COLO slots (capacity $capacity req/s nominal, \$$COLO_PER_HOUR/h)," \
    "cloud 32 slots +10 ms RTT (\$$CLOUD_IN/\$$CLOUD_OUT per 1M), SLO TTFT ${SLO_MS} ms"

completions() { # PORT: "completions slot_s slot_holds" of a testupstream
    http_get "$1" /_control/stats | "$PY" -c 'import json,sys; s = json.load(sys.stdin)
print(s["completions"], s["slot_s"], s["slot_holds"])' 2>/dev/null || echo 0 0 0
}

run() { # LOAD OBJECTIVE: one run; writes $tmp/run-LOAD-OBJECTIVE.json
    local load=$1 obj=$2 gw_port rate c0 k0 s0 h0
    gw_port=$(free_port)
    rate=$("$PY" -c "print(round($load * $capacity, 2))")
    cat >"$tmp/gw.json" <<EOF
{"region": "bench", "listen": "127.0.0.1:$gw_port", "log": {"level": "warn"},
 "models": [{"name": "m"}],
 "sites": [{"name": "colo", "url": "http://127.0.0.1:$colo_port", "models": ["m"],
            "price": {"per_hour": $COLO_PER_HOUR}},
           {"name": "cloud", "url": "http://127.0.0.1:$fp_port", "models": ["m"],
            "price": {"per_1m_input_tokens": $CLOUD_IN, "per_1m_output_tokens": $CLOUD_OUT}}],
 "routing": {"objective": "$obj", "slo_ttft_ms": $SLO_MS}}
EOF
    "$build/infergate" serve --config "$tmp/gw.json" 2>"$tmp/gw-$load-$obj.log" &
    gw_pid=$!
    for _ in $(seq 1 100); do
        [ "$(http_get "$gw_port" /ready | grep -c ready)" -gt 0 ] && break
        sleep 0.1
    done
    sleep 1 # both sites probed
    read -r c0 s0 h0 < <(completions "$colo_port")
    read -r k0 _ _ < <(completions "$cloud_port")
    "$build/igbench" --quiet --target "127.0.0.1:$gw_port" --rate "$rate" --arrival poisson \
        --duration "$((DURATION + WARMUP))" --warmup "$WARMUP" --seed "$SEED" --timeout 15 \
        --stream --endpoint completions --model m --max-tokens "$TOKENS" --input-tokens 32 \
        --json "$tmp/ig.json"
    local c1 k1 s1 h1
    read -r c1 s1 h1 < <(completions "$colo_port")
    read -r k1 _ _ < <(completions "$cloud_port")
    http_get "$gw_port" /metrics >"$tmp/metrics.txt"
    kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null || true
    gw_pid=""
    "$PY" - "$tmp/ig.json" "$tmp/metrics.txt" "$load" "$obj" "$rate" "$((c1 - c0))" \
        "$((k1 - k0))" "$SLO_MS" "$s0" "$s1" "$((h1 - h0))" "$SLOTS_COLO" "$((DURATION + WARMUP))" \
        >"$tmp/run-$load-$obj.json" <<'PYEOF'
import json, re, sys
ig = json.load(open(sys.argv[1]))
metrics = open(sys.argv[2]).read()
load, obj, rate, colo, cloud, slo = sys.argv[3:9]
slot_s = float(sys.argv[10]) - float(sys.argv[9])
holds, slots, span = int(sys.argv[11]), int(sys.argv[12]), float(sys.argv[13])
def cost(up):
    total = 0.0
    for m in re.finditer(r'^infergate_cost_usd_total\{upstream="%s"[^}]*\} (\S+)' % up, metrics, re.M):
        total += float(m.group(1))
    return total
def idle(up):
    m = re.search(r'^infergate_cost_idle_usd_total\{upstream="%s"\} (\S+)' % up, metrics, re.M)
    return float(m.group(1)) if m else 0.0
colo, cloud = int(colo), int(cloud)
ttft = ig["latency_ms"]["ttft"]
out_tokens = ig.get("output_tokens", 0)
spend = cost("colo") + idle("colo") + cost("cloud")
print(json.dumps({
    "load": float(load), "objective": obj, "rate_rps": float(rate),
    "colo_share": colo / max(1, colo + cloud), "colo_answers": colo, "cloud_answers": cloud,
    "ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"], "slo_ttft_ms": float(slo),
    "slo_met_p99": ttft["p99"] <= float(slo),
    "errors": ig["requests"]["errors"], "ok": ig["requests"]["ok"],
    "sent": ig["requests"]["issued"],
    "colo_service_ms": 1e3 * slot_s / holds if holds else None,
    "colo_capacity_rps": slots * holds / slot_s if slot_s > 0 else None,
    "colo_busy": slot_s / (slots * span),
    "cloud_bill_usd": cost("cloud"), "colo_busy_usd": cost("colo"), "colo_idle_usd": idle("colo"),
    "cost_per_1m_output_tokens": spend / out_tokens * 1e6 if out_tokens else None}))
PYEOF
    "$PY" - "$tmp/run-$load-$obj.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
print("  load %.2f %-7s %7.1f req/s: colo %5.1f%% (busy %3.0f%%)  ttft p50 %6.1f p99 %7.1f ms (SLO %s)  "
      "errors %d  cloud bill $%.6f  $/1M out %s" % (
          r["load"], r["objective"], r["rate_rps"], 100 * r["colo_share"], 100 * r["colo_busy"],
          r["ttft_p50_ms"],
          r["ttft_p99_ms"], "met" if r["slo_met_p99"] else "MISSED", r["errors"],
          r["cloud_bill_usd"], "%.4f" % r["cost_per_1m_output_tokens"]
          if r["cost_per_1m_output_tokens"] is not None else "-"))
PYEOF
    sleep 1
}

for load in $LOADS; do
    for obj in latency cost; do
        run "$load" "$obj"
    done
done

"$PY" - "$RESULTS" "$tmp" "$((DURATION + WARMUP))" "$SLO_MS" "$FLOOR_SLACK" $LOADS <<'PYEOF'
import json, os, sys
out, tmp, span, slo = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]) / 1e3
slack, loads = float(sys.argv[5]), sys.argv[6:]
runs, verdicts = [], []
for load in loads:
    pair = {}
    for obj in ("latency", "cost"):
        r = json.load(open(os.path.join(tmp, "run-%s-%s.json" % (load, obj))))
        runs.append(r)
        pair[obj] = r
    c, l = pair["cost"], pair["latency"]
    cap = c["colo_capacity_rps"] or 0.0
    answers = c["colo_answers"] + c["cloud_answers"]
    floor = max(0.0, 1 - cap * (span + slo) / answers) if answers else 0.0
    ratio = c["cloud_bill_usd"] / l["cloud_bill_usd"] if l["cloud_bill_usd"] > 0 else None
    floor_ratio = floor * answers / l["cloud_answers"] if l["cloud_answers"] else None
    cloud_share = 1 - c["colo_share"]
    line = ("load %s: cost/latency cloud bill %s (floor %s); cloud share: cost %.3f, latency %.3f,"
            " floor %.3f (colo %.1f req/s measured, %.1f sent); cost objective: p99 TTFT %.1f ms"
            " (%s), errors %d" % (
                load, "%.3f" % ratio if ratio is not None else "-",
                "%.3f" % floor_ratio if floor_ratio is not None else "-", cloud_share,
                1 - l["colo_share"], floor, cap, c["sent"] / span, c["ttft_p99_ms"],
                "SLO met" if c["slo_met_p99"] else "SLO MISSED", c["errors"]))
    print(line)
    checks = {"slo_p99_no_errors": c["slo_met_p99"] and c["errors"] == 0}
    if float(load) <= 0.5:
        checks["colo_share_ge_0.9"] = c["colo_share"] >= 0.9
    if float(load) > 1:
        checks["cloud_share_within_%g_of_floor" % slack] = cloud_share - floor <= slack
    issue = ratio is not None and ratio <= 0.8 if float(load) >= 1.5 else None
    print("  targets: %s%s" % (", ".join("%s %s" % (k, "met" if v else "MISSED")
                                        for k, v in checks.items()),
          "" if issue is None else "; issue 32's cloud bill <= 0.8x latency's: %s"
          % ("met" if issue else "not met")))
    verdicts.append({"load": float(load), "cloud_bill_ratio_cost_to_latency": ratio,
                     "floor_ratio_cost_to_latency": floor_ratio,
                     "colo_capacity_rps": cap,
                     "sent_rps": c["sent"] / span,
                     "cost_cloud_share": cloud_share, "latency_cloud_share": 1 - l["colo_share"],
                     "floor_cloud_share": floor,
                     "cost_cloud_share_above_floor": cloud_share - floor,
                     "cost_colo_share": c["colo_share"], "cost_slo_met_p99": c["slo_met_p99"],
                     "cost_errors": c["errors"], "targets": checks,
                     "issue_ratio_le_0.8": issue})
json.dump({"bench": "cost-routing", "runs": runs, "ratios": verdicts}, open(out, "w"), indent=1)
print("wrote", out)
PYEOF

plot="${RESULTS%.json}.png"
if command -v gnuplot >/dev/null 2>&1; then
    "$PY" - "$RESULTS" >"$tmp/plot.dat" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
for obj in ("latency", "cost"):
    for r in sorted((r for r in d["runs"] if r["objective"] == obj), key=lambda r: r["load"]):
        if r["cost_per_1m_output_tokens"] is not None:
            print(r["load"], r["cost_per_1m_output_tokens"])
    print()
    print()
PYEOF
    gnuplot <<EOF
set terminal png size 800,480
set output "$plot"
set xlabel "offered load (fraction of colo's capacity)"
set ylabel "USD per 1M output tokens (idle colo included)"
set key top left
plot "$tmp/plot.dat" index 0 with linespoints title "objective latency", \
     "$tmp/plot.dat" index 1 with linespoints title "objective cost"
EOF
    echo "plot: wrote $plot"
else
    echo "plot: gnuplot not found, skipped"
fi
