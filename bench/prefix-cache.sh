#!/bin/bash
# The engine's prefix cache alone: one `infergate worker` on a random-weight
# model gets ROUNDS fresh 512-token prompts, each sent twice in a row (the
# second an exact repeat). With --prefix-cache on the repeat finds all but
# its last block cached and prefills 16 tokens instead of 512; the same run
# with --prefix-cache off is the baseline (the repeat costs what the first
# did). TTFT is measured from the request's send to its first streamed
# token, over a Unix socket. Prints the median TTFT of first and repeat for
# both settings and the ratio repeat/first with the cache (target <= 0.2),
# and writes bench/results/prefix-cache.json.
#
# usage: bench/prefix-cache.sh [BUILD_DIR]         (default: build)
# environment:
#   PRESET=gqa          mkmodel preset (gqa: 2048 positions)
#   DEVICE=cpu:1        worker --device
#   PROMPT_TOKENS=512   prompt length in token ids
#   ROUNDS=5            fresh prompts per setting
#   RESULTS=bench/results/prefix-cache.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init prefix-cache "$@"
bench_env PRESET=gqa DEVICE=cpu:1 PROMPT_TOKENS=512 ROUNDS=5
check_bounds "1 <= $ROUNDS <= 50 and 16 <= $PROMPT_TOKENS <= 1900" \
    "ROUNDS 1..50 and PROMPT_TOKENS 16..1900"
need_built infergate
kill_on_exit wpid

"$build/infergate" mkmodel --preset "$PRESET" --out "$tmp/model" >/dev/null

run() {
    local mode=$1 sock="$tmp/w-$1.sock"
    "$build/infergate" worker --model "$tmp/model" --name bench --device "$DEVICE" \
        --listen "unix:$sock" --prefix-cache "$mode" --log-level warn \
        2>"$tmp/worker-$mode.log" &
    wpid=$!
    "$PY" - "$sock" "$mode" "$PROMPT_TOKENS" "$ROUNDS" "$tmp/run-$mode.json" <<'EOF'
import json, os, socket, sys, time
sock, mode, ntok, rounds, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

def request(method, path, body=b""):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(sock)
    head = (f"{method} {path} HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    t0 = time.perf_counter()
    s.sendall(head + body)
    buf, first = b"", None
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
        if first is None and b'"text"' in buf.split(b"\r\n\r\n", 1)[-1]:
            first = time.perf_counter() - t0
    s.close()
    return buf, first

deadline = time.time() + 120
while True:
    try:
        b, _ = request("GET", "/ready")
        if b.startswith(b"HTTP/1.1 200"):
            break
    except OSError:
        pass
    if time.time() > deadline:
        sys.exit("worker not ready")
    time.sleep(0.1)

def prompt(r):
    # distinct from the first token on: no two rounds share a block
    return [1 + (r * 7919 + k * 131 + (k * k) % 97) % 8000 for k in range(ntok)]

def ttft(ids):
    body = json.dumps({"model": "bench", "prompt": ids, "max_tokens": 1, "stream": True,
                       "temperature": 0}).encode()
    b, first = request("POST", "/v1/completions", body)
    if not b.startswith(b"HTTP/1.1 200") or first is None:
        sys.exit("bad answer: " + b[:300].decode(errors="replace"))
    return first

ttft(prompt(10_000))  # warm-up: first touches of weights and KV pages
res = []
for r in range(rounds):
    ids = prompt(r)
    a = ttft(ids)
    b = ttft(ids)
    res.append({"first_s": a, "repeat_s": b})
m, _ = request("GET", "/metrics")
def metric(name):
    for line in m.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
json.dump({"mode": mode, "rounds": res,
           "queries": metric("infergate_worker_prefix_cache_queries_total"),
           "hits": metric("infergate_worker_prefix_cache_hits_total")}, open(out, "w"))
EOF
    kill "$wpid" 2>/dev/null || true
    wait "$wpid" 2>/dev/null || true
    wpid=""
}

run off
run on

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$tmp" "$RESULTS" "$PRESET" "$DEVICE" "$PROMPT_TOKENS" "$ROUNDS" <<'EOF'
import json, statistics, sys
tmp, out = sys.argv[1], sys.argv[2]
params = dict(zip(["preset", "device", "prompt_tokens", "rounds"], sys.argv[3:7]))
doc = {"scenario": "prefix-cache", "params": params}
for mode in ("off", "on"):
    r = json.load(open(f"{tmp}/run-{mode}.json"))
    first = statistics.median(x["first_s"] for x in r["rounds"])
    rep = statistics.median(x["repeat_s"] for x in r["rounds"])
    doc[mode] = {"ttft_first_ms": first * 1e3, "ttft_repeat_ms": rep * 1e3,
                 "ratio_repeat_first": rep / first,
                 "hit_rate": r["hits"] / r["queries"] if r["queries"] else 0, "runs": r}
doc["ratio_repeat_first"] = doc["on"]["ratio_repeat_first"]
json.dump(doc, open(out, "w"), indent=2)
print(f"prefix-cache ({params['preset']} on {params['device']}, {params['prompt_tokens']}-token "
      f"prompts, {params['rounds']} rounds, medians)")
print(f"  {'':18} {'TTFT first':>11} {'TTFT repeat':>12} {'repeat/first':>13} {'hit rate':>9}")
for mode in ("off", "on"):
    d = doc[mode]
    print(f"  prefix-cache {mode:5} {d['ttft_first_ms']:9.1f}ms {d['ttft_repeat_ms']:10.1f}ms "
          f"{d['ratio_repeat_first']:12.3f}x {d['hit_rate']:8.1%}")
print(f"  repeat/first with the cache: {doc['ratio_repeat_first']:.3f}x (target <= 0.2)   -> {out}")
EOF
