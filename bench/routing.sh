#!/bin/bash
# Routing policies side by side. A fleet of four upstreams with limited
# concurrency -- build/testupstream processes with --slots, standing in for
# instances: local-a and local-b (service time S), local-slow (3 x S) and
# remote (like local-a, behind faultproxy adding RTT_MS round trip, half each
# way) -- configured as sites of one gateway. For each policy the gateway is
# restarted on the same upstreams and igbench sends the same open-loop Poisson
# schedule (same seed) at LOAD x the fleet's capacity, streaming, so TTFT is
# measured. Prints p50/p99 TTFT and e2e per policy, each upstream's share of
# the requests, and the ratios latency/round_robin and latency/least_inflight
# of p99 TTFT (target: <= 0.5 and <= 1.0); writes bench/results/routing.json
# and .png.
#
# Capacity: an upstream with N slots and mean service time s serves N/s
# requests/s (testupstream starts a request's delay when it gets a slot and
# holds the slot to its last byte); s = DELAY_MS + (TOKENS - 1) x ITL_MS.
# The remote site's RTT adds latency, not service time.
#
# usage: bench/routing.sh [BUILD_DIR]        (default: build)
# environment:
#   POLICIES="latency round_robin least_inflight random"
#   DURATION=20      seconds of measured load per policy (after the warm-up)
#   WARMUP=4         seconds of load per policy not counted (the router learns)
#   LOAD=0.7         offered load as a fraction of the fleet's capacity
#   SLOTS=2          concurrent requests per upstream
#   DELAY_MS=20      time to first token of a fast upstream (slow: x SLOW)
#   ITL_MS=2         time between tokens of a fast upstream (slow: x SLOW)
#   TOKENS=8         output tokens per request
#   SLOW=3           how many times slower local-slow is
#   RTT_MS=40        round trip added to the remote site
#   SEED=1           igbench seed (the same schedule for every policy)
#   TIMEOUT=15       igbench per-request timeout (s)
#   REPORT_LOAD=0    1: the upstreams answer GET /load like infergate instances
#                    (testupstream --report-load: slots, waiting, running), so
#                    the latency policy knows each one's slots; 0: they are
#                    plain OpenAI servers and the router must infer the queue
#   VLLM_METRICS=0   1: the upstreams publish vLLM's queue gauges at GET
#                    /metrics (testupstream --vllm-metrics), which a gateway
#                    reads of a plain site: every replica's requests in it
#   REPLICAS=1       gateway replica counts to run each policy with, e.g.
#                    "1 3": N > 1 gateways of the same config behind HAProxy
#                    in TCP mode (round robin over connections, as a
#                    Kubernetes Service spreads them), each seeing 1/N of
#                    the traffic (one replica is behind HAProxy too, so
#                    that each count pays the same hop); a run is then named POLICYxN, and the
#                    ratio of each policy's p99 TTFT with the most replicas
#                    to one replica's is printed
#   RESULTS=bench/results/routing.json
# Needs: python3; gnuplot for the PNG (skipped with a note when missing).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init routing "$@"
bench_env POLICIES="latency round_robin least_inflight random" DURATION=20 WARMUP=4 \
    LOAD=0.7 SLOTS=2 DELAY_MS=20 ITL_MS=2 TOKENS=8 SLOW=3 RTT_MS=40 SEED=1 TIMEOUT=15 \
    REPORT_LOAD=0 VLLM_METRICS=0 REPLICAS=1
check_bounds "0 < $DURATION <= 120 and 0 <= $WARMUP <= 30 and 0 < $LOAD <= 1.5
      and 1 <= $SLOTS <= 256 and 1 <= $TOKENS <= 1000 and 0 < $TIMEOUT <= 60" \
    "DURATION <= 120, WARMUP <= 30, 0 < LOAD <= 1.5, SLOTS <= 256," \
    "TOKENS <= 1000, TIMEOUT <= 60"
need_one_of policy "latency round_robin least_inflight random" $POLICIES
for n in $REPLICAS; do check_bounds "1 <= $n <= 8" "REPLICAS 1..8"; done
need_built igbench faultproxy testupstream infergate
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
if [ "$REPLICAS" != 1 ] && [ ! -x "$HAPROXY" ]; then
    bench_fail "REPLICAS needs haproxy (scripts/deps.sh bench)"
fi
pids=()
gw_pids=()
kill_on_exit gw_pids pids
# The runs: each policy with each replica count, named POLICY (one count
# of 1) or POLICYxN.
runs=()
for p in $POLICIES; do
    for n in $REPLICAS; do
        if [ "$REPLICAS" = 1 ]; then runs+=("$p"); else runs+=("${p}x$n"); fi
    done
done

# The fleet. The slow one is SLOW x slower in both first token and ITL.
slow_delay=$("$PY" -c "print($DELAY_MS * $SLOW)")
slow_itl=$("$PY" -c "print($ITL_MS * $SLOW)")
names=(local-a local-b local-slow remote)
report_flag=""
[ "$REPORT_LOAD" = 1 ] && report_flag="--report-load"
[ "$VLLM_METRICS" = 1 ] && report_flag="$report_flag --vllm-metrics"
start_up() { # name delay itl
    "$build/testupstream" --quiet --instant-raw $report_flag --slots "$SLOTS" --delay-ms "$2" \
        --itl-ms "$3" --tokens "$TOKENS" --seed 1 >"$tmp/$1.out" &
    pids+=($!)
}
start_up local-a "$DELAY_MS" "$ITL_MS"
start_up local-b "$DELAY_MS" "$ITL_MS"
start_up local-slow "$slow_delay" "$slow_itl"
start_up remote "$DELAY_MS" "$ITL_MS"
declare -A port
for n in "${names[@]}"; do
    port[$n]=$(port_of "$tmp/$n.out")
done
half=$("$PY" -c "print($RTT_MS / 2)")
"$build/faultproxy" --quiet --target "127.0.0.1:${port[remote]}" --delay-ms "$half" \
    >"$tmp/fp.out" &
pids+=($!)
fp_port=$(port_of "$tmp/fp.out")
declare -A url
url[local-a]="http://127.0.0.1:${port[local-a]}"
url[local-b]="http://127.0.0.1:${port[local-b]}"
url[local-slow]="http://127.0.0.1:${port[local-slow]}"
url[remote]="http://127.0.0.1:$fp_port"

read -r svc_fast svc_slow capacity rate <<<"$("$PY" -c "
f = ($DELAY_MS + ($TOKENS - 1) * $ITL_MS) / 1000.0
s = f * $SLOW
cap = 3 * $SLOTS / f + $SLOTS / s
print(f, s, cap, round($LOAD * cap, 2))")"
echo "routing: 4 upstreams x $SLOTS slots; service time ${svc_fast}s (local-a, local-b, remote)," \
    "${svc_slow}s (local-slow); remote +${RTT_MS} ms RTT via faultproxy"
echo "routing: capacity $capacity req/s, offered $rate req/s (LOAD $LOAD), ${DURATION}s" \
    "(+${WARMUP}s warm-up) per policy, seed $SEED, REPORT_LOAD $REPORT_LOAD"

# A counter of every upstream's /_control/stats, "name=count ...".
counts() {
    local out="" c
    for n in "${names[@]}"; do
        c=$(http_get "${port[$n]}" /_control/stats | "$PY" -c \
            "import json,sys; print(json.load(sys.stdin)['$1'])" 2>/dev/null || echo 0)
        out="$out $n=$c"
    done
    echo "$out"
}

# Waits (up to 10 s) until no upstream holds or queues a request: what one
# policy left behind must not slow the next.
wait_idle() {
    for _ in $(seq 1 100); do
        local busy=0
        for n in "${names[@]}"; do
            b=$(http_get "${port[$n]}" /_control/stats | "$PY" -c \
                'import json,sys; d=json.load(sys.stdin); print(d["busy"] + d["waiting"])' \
                2>/dev/null || echo 1)
            busy=$((busy + b))
        done
        [ "$busy" -eq 0 ] && return 0
        sleep 0.1
    done
    echo "routing: upstreams still busy after 10 s" >&2
    return 1
}

run_policy() { # run: POLICY or POLICYxN
    local run=$1 policy=${1%x*} nrep=1 front i
    [ "$run" != "$policy" ] && nrep=${run##*x}
    local gw_ports=()
    for i in $(seq 1 "$nrep"); do gw_ports+=("$(free_port)"); done
    local raw0
    raw0=$(counts raw)
    for i in $(seq 0 $((nrep - 1))); do
        "$PY" - "$tmp/gw-$run-$i.json" "${gw_ports[$i]}" "$policy" \
            "${url[local-a]}" "${url[local-b]}" "${url[local-slow]}" "${url[remote]}" <<'PYEOF'
import json, sys
out, port, policy = sys.argv[1:4]
urls = sys.argv[4:8]
names = ["local-a", "local-b", "local-slow", "remote"]
cfg = {"region": "bench", "listen": "127.0.0.1:" + port, "log": {"level": "warn"},
       "models": [{"name": "m"}],
       "sites": [{"name": n, "url": u, "models": ["m"]} for n, u in zip(names, urls)],
       # No retries or hedges: each policy's first choice is what is measured.
       "routing": {"policy": policy, "max_retries": 0}}
json.dump(cfg, open(out, "w"))
PYEOF
        "$build/infergate" serve --config "$tmp/gw-$run-$i.json" 2>"$tmp/gw-$run-$i.log" &
        gw_pids+=($!)
    done
    front=${gw_ports[0]}
    if [ "$REPLICAS" != 1 ]; then # every count behind the same hop, one replica too
        front=$(free_port)
        {
            printf 'global\n    nbthread 1\n    maxconn 4096\n'
            printf 'defaults\n    mode tcp\n    timeout connect 5s\n'
            printf '    timeout client 75s\n    timeout server 75s\n'
            printf 'listen gateways\n    bind 127.0.0.1:%s\n    balance roundrobin\n' "$front"
            for i in $(seq 0 $((nrep - 1))); do
                printf '    server g%d 127.0.0.1:%s\n' "$i" "${gw_ports[$i]}"
            done
        } >"$tmp/haproxy-$run.cfg"
        "$HAPROXY" -db -f "$tmp/haproxy-$run.cfg" >"$tmp/haproxy-$run.log" 2>&1 &
        gw_pids+=($!)
    fi
    # Ready when every site has had every gateway's probes: GET /load, which
    # makes an upstream with --report-load a ready peer; else /load, /health
    # and /v1/models, after which a plain OpenAI server is up.
    local ok=0 per=3
    [ "$REPORT_LOAD" = 1 ] && per=1
    for _ in $(seq 1 100); do
        if "$PY" - "$raw0" "$(counts raw)" "$((per * nrep))" <<'PYEOF'; then
import sys
def parse(s):
    return {k: int(v) for k, v in (x.split("=") for x in s.split())}
a, b = parse(sys.argv[1]), parse(sys.argv[2])
sys.exit(0 if all(b[k] - a[k] >= int(sys.argv[3]) for k in a) else 1)
PYEOF
            ok=1
            break
        fi
        sleep 0.1
    done
    if [ "$ok" -ne 1 ]; then
        echo "routing: gateway ($run) did not see its 4 sites; log:" >&2
        cat "$tmp/gw-$run-0.log" >&2
        return 1
    fi
    local before after
    before=$(counts completions)
    "$build/igbench" --quiet --target "127.0.0.1:$front" --rate "$rate" --arrival poisson \
        --duration "$((DURATION + WARMUP))" --warmup "$WARMUP" --seed "$SEED" \
        --timeout "$TIMEOUT" --stream --endpoint completions --model m --max-tokens "$TOKENS" \
        --input-tokens 32 --label "routing-$run" --json "$tmp/ig-$run.json"
    after=$(counts completions)
    http_get "${gw_ports[0]}" /metrics | grep '^infergate_upstream_rtt_ewma_seconds\|^infergate_upstream_ttft_ewma_seconds' \
        >"$tmp/metrics-$run.txt" || true
    for i in "${gw_pids[@]}"; do kill "$i" 2>/dev/null && wait "$i" 2>/dev/null || true; done
    gw_pids=()
    echo "$before" >"$tmp/before-$run.txt"
    echo "$after" >"$tmp/after-$run.txt"
    wait_idle
}

for r in "${runs[@]}"; do
    echo "  running $r ..."
    run_policy "$r"
done

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$RESULTS" "$tmp" "$rate" "$capacity" "$svc_fast" "$svc_slow" "${runs[@]}" <<PYEOF
import json, sys
import benchlib
out, tmp, rate, capacity, svc_fast, svc_slow = sys.argv[1:7]
policies = sys.argv[7:]
names = ["local-a", "local-b", "local-slow", "remote"]
def counts(path):
    return {k: int(v) for k, v in (x.split("=") for x in open(path).read().split())}
rows = {}
for p in policies:
    r = json.load(open("%s/ig-%s.json" % (tmp, p)))
    b, a = counts("%s/before-%s.txt" % (tmp, p)), counts("%s/after-%s.txt" % (tmp, p))
    served = {n: a[n] - b[n] for n in names}
    total = sum(served.values()) or 1
    lat = r["latency_ms"]
    rows[p] = {"ttft_p50_ms": lat["ttft"]["p50"], "ttft_p99_ms": lat["ttft"]["p99"],
               "e2e_p50_ms": lat["e2e"]["p50"], "e2e_p99_ms": lat["e2e"]["p99"],
               "ttft_max_ms": lat["ttft"]["max"],
               "requests": r["requests"], "errors": r["errors"],
               "throughput_rps": r["throughput_rps"],
               "send_lag_p99_ms": lat.get("send_lag", {}).get("p99"),
               "share": {n: round(served[n] / total, 3) for n in names}}
def ratio(a, b):
    if a in rows and b in rows and rows[b]["ttft_p99_ms"] > 0:
        return round(rows[a]["ttft_p99_ms"] / rows[b]["ttft_p99_ms"], 3)
    return None
# With several replica counts: each policy's p99 TTFT with the most
# replicas over one replica's.
counts_ = sorted(set(int(p.rsplit("x", 1)[1]) for p in policies if "x" in p))
replica_ratios = {}
if len(counts_) > 1:
    for base in dict.fromkeys(p.rsplit("x", 1)[0] for p in policies):
        replica_ratios["ttft_p99_%s_x%d_over_x%d" % (base, counts_[-1], counts_[0])] = \
            ratio("%sx%d" % (base, counts_[-1]), "%sx%d" % (base, counts_[0]))
res = benchlib.result(
    "routing",
    {"duration_s": $DURATION, "warmup_s": $WARMUP, "load": $LOAD,
     "rate_rps": float(rate), "capacity_rps": float(capacity), "slots": $SLOTS,
     "delay_ms": $DELAY_MS, "itl_ms": $ITL_MS, "tokens": $TOKENS, "slow": $SLOW,
     "rtt_ms": $RTT_MS, "seed": $SEED, "timeout_s": $TIMEOUT,
     "report_load": $REPORT_LOAD, "vllm_metrics": $VLLM_METRICS, "replicas": "$REPLICAS",
     "service_time_s": {"fast": float(svc_fast), "slow": float(svc_slow)}},
    what="p50/p99 TTFT and e2e per routing policy, open-loop Poisson at LOAD x fleet capacity",
    policies=rows,
    ratio=replica_ratios if replica_ratios else
          {"ttft_p99_latency_over_round_robin": ratio("latency", "round_robin"),
           "ttft_p99_latency_over_least_inflight": ratio("latency", "least_inflight")},
    plot={"title": "routing policies: TTFT at %.0f%% of capacity (%.1f req/s)"
                   % ($LOAD * 100, float(rate)),
          "xlabel": "policy (%s)" % ", ".join("%d=%s" % (i + 1, p) for i, p in enumerate(policies)),
          "ylabel": "ms",
          "x": list(range(1, len(policies) + 1)),
          "series": {"ttft p50": [rows[p]["ttft_p50_ms"] for p in policies],
                     "ttft p99": [rows[p]["ttft_p99_ms"] for p in policies],
                     "e2e p99": [rows[p]["e2e_p99_ms"] for p in policies]}})
benchlib.write(out, res)
print("  %-15s %9s %9s %9s %9s %6s %7s  %s" % ("policy", "ttft p50", "ttft p99", "e2e p50",
      "e2e p99", "errors", "req/s", "share a/b/slow/remote"))
for p in policies:
    x = rows[p]
    print("  %-15s %9.1f %9.1f %9.1f %9.1f %6d %7.1f  %s" % (
        p, x["ttft_p50_ms"], x["ttft_p99_ms"], x["e2e_p50_ms"], x["e2e_p99_ms"],
        x["requests"]["errors"], x["throughput_rps"],
        "/".join("%.2f" % x["share"][n] for n in names)))
for k, v in replica_ratios.items():
    print("  %s: %s" % (k, v))
r1 = res["ratio"].get("ttft_p99_latency_over_round_robin")
r2 = res["ratio"].get("ttft_p99_latency_over_least_inflight")
if r1 is not None:
    print("  p99 TTFT latency/round_robin:    %.3f (target <= 0.5) %s" % (r1, "ok" if r1 <= 0.5 else "MISSED"))
if r2 is not None:
    print("  p99 TTFT latency/least_inflight: %.3f (target <= 1.0) %s" % (r2, "ok" if r2 <= 1.0 else "MISSED"))
print("  wrote " + out)
PYEOF
for r in "${runs[@]}"; do
    sed "s/^/  [$r] /" "$tmp/metrics-$r.txt" 2>/dev/null || true
done
bench_plot
