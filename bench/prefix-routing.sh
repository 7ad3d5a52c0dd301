#!/bin/bash
# Prefix-aware routing over two real CPU workers: `infergate serve` with one
# pool of two `infergate worker`s (1 thread each, KV cache KV_BLOCKS blocks
# of 16 each), TENANTS tenants whose requests share a 512-token system
# prefix (together more than one instance's KV cache holds, less than the
# pool's), plus SESSIONS multi-turn chats whose every turn extends the last
# (x-session-id). Open-loop Poisson arrivals at RATE req/s, streamed, TTFT
# from the scheduled send time. Run twice, with routing.policy latency
# (prefix-aware) and least_inflight (the baseline), same seed. Prints TTFT
# p50/p99 of both, the ratios latency/least_inflight (targets p50 <= 0.5,
# p99 <= 1.0), the workers' prefix-cache hit rates, and writes
# bench/results/prefix-routing.json.
#
# usage: bench/prefix-routing.sh [BUILD_DIR]         (default: build)
# environment:
#   PRESET=gqa  TENANTS=6  SESSIONS=2  TURNS=6  KV_BLOCKS=112
#   RATE=3  REQUESTS=90  MAX_TOKENS=4  SEED=1
#   RESULTS=bench/results/prefix-routing.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init prefix-routing "$@"
bench_env PRESET=gqa TENANTS=6 SESSIONS=2 TURNS=6 KV_BLOCKS=112 RATE=3 REQUESTS=90 \
    MAX_TOKENS=4 SEED=1
check_bounds "1 <= $TENANTS <= 64 and 0 <= $SESSIONS <= 16 and 1 <= $REQUESTS <= 2000 and 0 < $RATE <= 100" \
    "TENANTS 1..64, SESSIONS 0..16, REQUESTS 1..2000, RATE 0..100"
need_built infergate
kill_on_exit gw_pid

"$build/infergate" mkmodel --preset "$PRESET" --out "$tmp/model" >/dev/null

run_policy() {
    local policy=$1 port
    port=$(free_port)
    "$PY" - "$tmp/gw-$policy.json" "$port" "$policy" "$tmp/model" "$KV_BLOCKS" <<'EOF'
import json, sys
out, port, policy, model, kv = sys.argv[1:6]
json.dump({"region": "bench", "listen": "127.0.0.1:" + port, "log": {"level": "warn"},
           "models": [{"name": "m", "path": model}],
           "pools": [{"name": "cpu", "model": "m", "devices": ["cpu", "cpu"], "threads": 1,
                      "min_instances": 2, "max_instances": 2,
                      "batching": {"kv_blocks": int(kv), "max_num_seqs": 16}}],
           "routing": {"policy": policy, "max_retries": 0}}, open(out, "w"))
EOF
    # the workers' sockets land under TMPDIR: their /metrics give the hit rates
    mkdir -p "$tmp/run-$policy"
    TMPDIR="$tmp/run-$policy" "$build/infergate" serve --config "$tmp/gw-$policy.json" \
        2>"$tmp/gw-$policy.log" &
    gw_pid=$!
    "$PY" - "$port" "$policy" "$TENANTS" "$SESSIONS" "$TURNS" "$RATE" "$REQUESTS" \
        "$MAX_TOKENS" "$SEED" "$tmp/run-$policy.json" "$tmp/run-$policy" <<'EOF'
import glob, json, random, socket, sys, threading, time
import benchlib
port, policy = int(sys.argv[1]), sys.argv[2]
tenants, sessions, turns, rate, nreq, max_tokens, seed = map(float, sys.argv[3:10])
tenants, sessions, turns, nreq, max_tokens, seed = map(int, (tenants, sessions, turns, nreq, max_tokens, seed))
out, rundir = sys.argv[10], sys.argv[11]

def eligible():
    insts = json.loads(benchlib.http_get("127.0.0.1", port, "/status")[1])["pools"][0]["instances"]
    return sum(1 for i in insts if i.get("eligible")) == 2

if not benchlib.poll(eligible, 120, 0.2):
    sys.exit("prefix-routing: the pool never had 2 eligible instances")

rng = random.Random(seed)
# A tenant's system prefix: 512 tokens of its own; a user part of 24.
systems = [[1 + (t * 7919 + k * 131 + (k * k) % 89) % 8000 for k in range(512)] for t in range(tenants)]
chats = [[1 + (9000 * (s + 1) + k * 17) % 8000 for k in range(300)] for s in range(sessions)]
chat_turn = [0] * sessions
plan, t = [], 0.0
for i in range(nreq):
    t += rng.expovariate(rate)
    if sessions and rng.random() < 0.25:
        s = rng.randrange(sessions)
        plan.append((t, "chat", s))
    else:
        plan.append((t, "tenant", rng.randrange(tenants)))

results, lock = [], threading.Lock()

def one(at, kind, k, t0):
    if kind == "tenant":
        ids = systems[k] + [rng2 for rng2 in random.Random(at).sample(range(1, 8000), 24)]
        headers = {"Content-Type": "application/json"}
    else:
        with lock:
            turn = chat_turn[k] % turns
            chat_turn[k] += 1
        # each turn extends the last: the conversation so far, then 48 more
        ids = chats[k][:200] + [1 + (k * 31 + j * 7) % 8000 for j in range(48 * (turn + 1))]
        headers = {"Content-Type": "application/json", "x-session-id": f"chat-{k}"}
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0, "ignore_eos": True})
    status, ttft, r = benchlib.stream_completion(port, body, headers, t0 + at)
    up = r.getheader("x-infergate-upstream", "") if r else ""
    route = r.getheader("x-infergate-route", "") if r else ""
    with lock:
        results.append({"kind": kind, "key": k, "status": status, "ttft_s": ttft,
                        "upstream": up, "route": route})

benchlib.run_plan(plan, one)
q = h = 0.0
for path in glob.glob(rundir + "/**/*.sock", recursive=True):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    buf = benchlib.get_all(s, "/metrics", host="w")
    s.close()
    dq, dh = benchlib.prefix_cache_counts(buf.decode(errors="replace"))
    q, h = q + dq, h + dh
json.dump({"policy": policy, "results": results, "queries": q, "hits": h}, open(out, "w"))
EOF
    kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null || true
    gw_pid=""
}

run_policy least_inflight
run_policy latency

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$tmp" "$RESULTS" "$PRESET" "$TENANTS" "$SESSIONS" "$KV_BLOCKS" "$RATE" "$REQUESTS" <<'EOF'
import json, sys
import benchlib
tmp, out = sys.argv[1], sys.argv[2]
params = dict(zip(["preset", "tenants", "sessions", "kv_blocks_per_instance", "rate", "requests"], sys.argv[3:9]))
doc = {"scenario": "prefix-routing", "params": params}
for pol in ("least_inflight", "latency"):
    r = json.load(open(f"{tmp}/run-{pol}.json"))
    doc[pol] = dict(benchlib.ttft_summary(r["results"]),
                    hit_rate=r["hits"] / r["queries"] if r["queries"] else 0,
                    queries_tokens=r["queries"], hit_tokens=r["hits"], results=r["results"])
b, l = doc["least_inflight"], doc["latency"]
doc["ratio_p50"] = l["ttft_p50_ms"] / b["ttft_p50_ms"]
doc["ratio_p99"] = l["ttft_p99_ms"] / b["ttft_p99_ms"]
json.dump(doc, open(out, "w"), indent=2)
print(f"prefix-routing ({params['preset']}, 2 CPU workers x {params['kv_blocks_per_instance']} KV blocks, "
      f"{params['tenants']} tenants x 512-token prefixes + {params['sessions']} chats, "
      f"{params['rate']} req/s Poisson, {params['requests']} requests)")
print(f"  {'':16} {'TTFT p50':>10} {'TTFT p99':>10} {'hit rate':>9} {'errors':>7}")
for pol in ("least_inflight", "latency"):
    d = doc[pol]
    print(f"  {pol:16} {d['ttft_p50_ms']:8.1f}ms {d['ttft_p99_ms']:8.1f}ms {d['hit_rate']:8.1%} {d['errors']:7d}")
print(f"  latency / least_inflight: p50 {doc['ratio_p50']:.2f}x (target <= 0.5), "
      f"p99 {doc['ratio_p99']:.2f}x (target <= 1.0)   -> {out}")
EOF
