#!/bin/bash
# Prefix-aware routing with several gateway replicas over the same workers:
# two standalone `infergate worker`s (1 thread each, KV_BLOCKS blocks of 16)
# on 127.0.0.2 and 127.0.0.3 found through dnsmasq (`pools[].discover`), and
# REPLICAS gateways, the load spread over them round robin by the client.
# MODEL_FILES=0: the gateways have no model files (the model has no path)
# and the prompts are token ids; MODEL_FILES=1: the model's files are on
# the gateways and the prompts are text, tokenized there. TENANTS
# tenants share 512-token prefixes (more than one worker's cache holds);
# open-loop Poisson arrivals at RATE req/s, streamed, TTFT from the
# scheduled send time. For each replica count in REPLICAS, run with
# routing.policy latency and least_inflight (the baseline), fresh workers
# each run, same seed. Prints TTFT p50/p99, the ratios latency /
# least_inflight (targets with 3 replicas: p50 <= 0.5, p99 <= 1.0) with a
# 95% bootstrap interval each (a p99 of a few hundred requests moves a lot
# by chance), the workers' prefix-cache hit rates, and writes
# bench/results/prefix-replicas.json.
#
# usage: bench/prefix-replicas.sh [BUILD_DIR]         (default: build)
# environment:
#   PRESET=gqa  TENANTS=10  KV_BLOCKS=112  RATE=3  REQUESTS=240  MAX_TOKENS=4
#   SEED=1  REPLICAS="1 3"  MODEL_FILES=0
#   RESULTS=bench/results/prefix-replicas.json (-model-files.json with MODEL_FILES=1)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
[ "${MODEL_FILES:-0}" = 1 ] && [ -z "${RESULTS:-}" ] &&
    RESULTS=$(cd "$here/.." && pwd)/bench/results/prefix-replicas-model-files.json
bench_init prefix-replicas "$@"
bench_env PRESET=gqa TENANTS=10 KV_BLOCKS=112 RATE=3 REQUESTS=240 MAX_TOKENS=4 SEED=1 \
    REPLICAS="1 3" MODEL_FILES=0 DNSMASQ=/usr/sbin/dnsmasq
check_bounds "1 <= $TENANTS <= 64 and 1 <= $REQUESTS <= 2000 and 0 < $RATE <= 100" \
    "TENANTS 1..64, REQUESTS 1..2000, RATE 0..100"
for r in $REPLICAS; do check_bounds "1 <= $r <= 8" "REPLICAS 1..8"; done
check_bounds "$MODEL_FILES in (0, 1)" "MODEL_FILES 0 or 1"
need_built infergate
[ -x "$DNSMASQ" ] || bench_fail "dnsmasq not found (DNSMASQ=$DNSMASQ)"
pids=()
kill_on_exit pids

"$build/infergate" mkmodel --preset "$PRESET" --out "$tmp/model" >/dev/null
wport=$(free_port)
dport=$(free_port)
printf '127.0.0.2 workers.bench\n127.0.0.3 workers.bench\n' >"$tmp/hosts"
"$DNSMASQ" --keep-in-foreground --conf-file=/dev/null --port="$dport" \
    --listen-address=127.0.0.1 --bind-interfaces --no-resolv --no-hosts \
    --addn-hosts="$tmp/hosts" --cache-size=0 --local-ttl=0 --pid-file= --user=root \
    2>"$tmp/dns.log" &
pids+=($!)

stop_run() {
    local p
    for p in ${run_pids[@]+"${run_pids[@]}"}; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true
    done
    run_pids=()
}

run_one() {
    local n=$1 policy=$2 ports="" i port
    run_pids=()
    for ip in 127.0.0.2 127.0.0.3; do
        "$build/infergate" worker --model "$tmp/model" --listen "$ip:$wport" --name m \
            --threads 1 --kv-blocks "$KV_BLOCKS" --block-size 16 --max-num-seqs 16 \
            --log-level warn 2>>"$tmp/workers.log" &
        run_pids+=($!)
    done
    for i in $(seq "$n"); do
        port=$(free_port)
        "$PY" - "$tmp/gw-$n-$policy-$i.json" "$port" "$policy" "$wport" "$dport" "$MODEL_FILES" \
            "$tmp/model" <<'EOF'
import json, sys
out, port, policy, wport, dport, files, path = sys.argv[1:8]
model = {"name": "m", "path": path} if files == "1" else {"name": "m"}
json.dump({"region": "bench", "listen": "127.0.0.1:" + port, "log": {"level": "warn"},
           "models": [model],
           "pools": [{"name": "w", "model": "m", "max_instances": 4,
                      "batching": {"block_size": 16, "max_num_seqs": 16},
                      "discover": {"dns": "workers.bench", "port": int(wport), "interval_s": 1,
                                   "resolver": "127.0.0.1:" + dport}}],
           "routing": {"policy": policy, "max_retries": 0}}, open(out, "w"))
EOF
        "$build/infergate" serve --config "$tmp/gw-$n-$policy-$i.json" 2>>"$tmp/gw.log" &
        run_pids+=($!)
        ports="$ports $port"
    done
    "$PY" - "$policy" "$TENANTS" "$RATE" "$REQUESTS" "$MAX_TOKENS" "$SEED" \
        "$tmp/run-$n-$policy.json" "$wport" "$MODEL_FILES" $ports <<'EOF'
import json, random, sys, threading, time
import benchlib
policy = sys.argv[1]
tenants, rate, nreq, max_tokens, seed = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
tenants = int(tenants)
out, wport, text = sys.argv[7], int(sys.argv[8]), sys.argv[9] == "1"
ports = [int(p) for p in sys.argv[10:]]

get = benchlib.http_get

def ready(port):
    insts = json.loads(get("127.0.0.1", port, "/status")[1])["pools"][0]["instances"]
    return sum(1 for i in insts if i.get("eligible")) == 2 and \
        (policy != "latency" or sum(1 for i in insts if i.get("prefix_index") == "exact") == 2)

deadline = time.time() + 180
for port in ports:
    if not benchlib.poll(lambda: ready(port), deadline - time.time(), 0.2):
        sys.exit("prefix-replicas: a gateway never had 2 eligible instances")

rng = random.Random(seed)
systems = [[1 + (t * 7919 + k * 131 + (k * k) % 89) % 8000 for k in range(512)] for t in range(tenants)]
# Text prompts: each tenant's prefix is words of its own, about 512 tokens.
words = ["alpha", "river", "stone", "cloud", "amber", "north", "glass", "ember", "field", "quiet"]
texts = [" ".join(words[(t * 3 + k * 7 + (k * k) % 5) % len(words)] + str(k % 97) for k in range(128))
         for t in range(tenants)]
plan, t = [], 0.0
for i in range(nreq):
    t += rng.expovariate(rate)
    plan.append((t, rng.randrange(tenants), ports[i % len(ports)]))
results, lock = [], threading.Lock()

def one(at, k, port, t0):
    tail = random.Random(at).sample(range(1, 8000), 24)
    # as text, 6 of the numbers: about as many tokens as the 24 ids
    prompt = texts[k] + " " + " ".join(map(str, tail[:6])) if text else systems[k] + tail
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0, "ignore_eos": True})
    status, ttft, r = benchlib.stream_completion(port, body, {"Content-Type": "application/json"},
                                                 t0 + at)
    up = r.getheader("x-infergate-upstream", "") if r else ""
    with lock:
        results.append({"tenant": k, "gateway": port, "status": status, "ttft_s": ttft, "upstream": up})

benchlib.run_plan(plan, one)
q = h = 0.0
for ip in ("127.0.0.2", "127.0.0.3"):
    dq, dh = benchlib.prefix_cache_counts(get(ip, wport, "/metrics")[1].decode(errors="replace"))
    q, h = q + dq, h + dh
json.dump({"policy": policy, "results": results, "queries": q, "hits": h}, open(out, "w"))
EOF
    stop_run
}

for n in $REPLICAS; do
    run_one "$n" least_inflight
    run_one "$n" latency
done

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$tmp" "$RESULTS" "$PRESET" "$TENANTS" "$KV_BLOCKS" "$RATE" "$REQUESTS" "$MODEL_FILES" \
    $REPLICAS <<'EOF'
import json, sys
import benchlib
tmp, out = sys.argv[1], sys.argv[2]
params = dict(zip(["preset", "tenants", "kv_blocks_per_worker", "rate", "requests"], sys.argv[3:8]))
files = sys.argv[8] == "1"
replicas = sys.argv[9:]
doc = {"scenario": "prefix-replicas", "params": params, "model_files_on_gateway": files, "runs": {}}
print(f"prefix-replicas ({params['preset']}, 2 workers x {params['kv_blocks_per_worker']} KV blocks via dnsmasq, "
      f"{params['tenants']} tenants x 512-token prefixes, {params['rate']} req/s Poisson, "
      f"{params['requests']} requests, "
      + ("text prompts, model files on the gateways)" if files else
         "token-id prompts, no model files on the gateways)"))
print(f"  {'replicas':>8} {'policy':16} {'TTFT p50':>10} {'TTFT p99':>10} {'hit rate':>9} {'errors':>7}")
for n in replicas:
    run = {}
    for pol in ("least_inflight", "latency"):
        r = json.load(open(f"{tmp}/run-{n}-{pol}.json"))
        run[pol] = dict(benchlib.ttft_summary(r["results"]),
                        hit_rate=r["hits"] / r["queries"] if r["queries"] else 0,
                        results=r["results"])
        d = run[pol]
        print(f"  {n:>8} {pol:16} {d['ttft_p50_ms']:8.1f}ms {d['ttft_p99_ms']:8.1f}ms {d['hit_rate']:8.1%} {d['errors']:7d}")
    run["ratio_p50"] = run["latency"]["ttft_p50_ms"] / run["least_inflight"]["ttft_p50_ms"]
    run["ratio_p99"] = run["latency"]["ttft_p99_ms"] / run["least_inflight"]["ttft_p99_ms"]
    ok = {pol: [x["ttft_s"] for x in run[pol]["results"] if x["status"] == 200 and x["ttft_s"] is not None]
          for pol in ("least_inflight", "latency")}
    for p in (50, 99):
        run[f"ratio_p{p}_95ci"] = benchlib.ratio_interval(ok["latency"], ok["least_inflight"], p)
    doc["runs"][n] = run
    ci50, ci99 = run["ratio_p50_95ci"], run["ratio_p99_95ci"]
    print(f"  {n} replica(s): latency / least_inflight p50 {run['ratio_p50']:.2f}x "
          f"[{ci50[0]:.2f}, {ci50[1]:.2f}] (target <= 0.5), p99 {run['ratio_p99']:.2f}x "
          f"[{ci99[0]:.2f}, {ci99[1]:.2f}] (target <= 1.0)")
if "1" in doc["runs"] and "3" in doc["runs"]:
    d = (doc["runs"]["3"]["latency"]["hit_rate"] - doc["runs"]["1"]["latency"]["hit_rate"]) * 100
    doc["hit_rate_3_minus_1_points"] = d
    print(f"  hit rate, latency, 3 replicas minus 1: {d:+.1f} points (target within 10)")
json.dump(doc, open(out, "w"), indent=2)
print(f"  -> {out}")
EOF
