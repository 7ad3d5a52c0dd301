#!/bin/bash
# Stall-free batching, measured: one worker (preset `small`, 2 threads,
# default flags) with 4 streams decoding, then 3 prompts of 900 tokens at
# once. Reports the streams' time between tokens (p50, max) while the
# prompts are prefilled, the prompts' TTFT (p50), and batch-64 throughput
# (64 streams of 64 tokens, tokens/s), for the default ITL target and for
# --itl-target-ms 0 (every step fills max_batched_tokens: the behaviour
# before stall-free batching), in the same run, workers started one after
# the other on the same model. Prints the ratios and writes
# bench/results/stall.json.
#
# usage: bench/stall.sh [BUILD_DIR]            (default: build)
# environment:
#   PRESET=small   THREADS=2   ROUNDS=3 (stall rounds per setting; worst max gap kept)
#   TARGETS="default 0"  the --itl-target-ms settings compared ("default": no flag)
#   RESULTS=bench/results/stall.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init stall "$@"
bench_env PRESET=small THREADS=2 ROUNDS=3 TARGETS="default 0"
need_built infergate
kill_on_exit w_pid

"$build/infergate" mkmodel --preset "$PRESET" --out "$tmp/model" >/dev/null
# small's 256-token context would refuse the 900-token prompts: 2048 (random
# weights; RoPE goes on past the trained length).
"$PY" - "$tmp/model/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["max_position_embeddings"] = max(c["max_position_embeddings"], 2048)
json.dump(c, open(sys.argv[1], "w"))
PY
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

for t in $TARGETS; do
    flags=()
    [ "$t" != default ] && flags=(--itl-target-ms "$t")
    "$build/infergate" worker --model "$tmp/model" --device "cpu:$THREADS" \
        --listen "127.0.0.1:$port" --log-level warn ${flags[@]+"${flags[@]}"} &
    w_pid=$!
    "$PY" - "$port" "$t" "$ROUNDS" "$tmp/$t.json" <<'PY'
import json, sys, threading, time, http.client, statistics
port, tag, rounds, out = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]

def wait_ready():
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/ready")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit("worker not ready")

def stream(prompt, max_tokens, times):
    """POSTs a streaming completion; appends each chunk's arrival time."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
            times.append(time.perf_counter())
        if line.startswith(b"data: [DONE]"):
            break
    c.close()

def ids(seed, n):
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + (x >> 8) % 30000)
    return out

wait_ready()
stream(ids(1, 8), 4, [])  # warm up
gaps_max, gaps_p50, ttfts = [], [], []
for r in range(rounds):
    dec = [[] for _ in range(4)]
    th = [threading.Thread(target=stream, args=(ids(100 + 10 * r + i, 16), 400, dec[i]))
          for i in range(4)]
    for t in th:
        t.start()
    time.sleep(1.0)
    t0 = time.perf_counter()
    firsts = [[] for _ in range(3)]
    pt = [threading.Thread(target=stream, args=(ids(1000 + 10 * r + i, 900), 2, firsts[i]))
          for i in range(3)]
    for t in pt:
        t.start()
    for t in pt:
        t.join()
    t1 = time.perf_counter()
    for t in th:
        t.join()
    ttfts += [(f[0] - t0) * 1e3 for f in firsts if f]
    # gaps of the decoding streams while the prompts were being prefilled
    gaps = []
    for d in dec:
        for a, b in zip(d, d[1:]):
            if b >= t0 and a <= t1:
                gaps.append((b - a) * 1e3)
    gaps_max.append(max(gaps))
    gaps_p50.append(statistics.median(gaps))

# batch 64: 64 streams of 64 tokens at once
times = [[] for _ in range(64)]
th = [threading.Thread(target=stream, args=(ids(5000 + i, 16), 64, times[i])) for i in range(64)]
t0 = time.perf_counter()
for t in th:
    t.start()
for t in th:
    t.join()
t1 = time.perf_counter()
tok = sum(len(x) for x in times)
res = {"itl_target_ms": tag, "gap_max_ms": max(gaps_max), "gap_max_ms_rounds": gaps_max,
       "gap_p50_ms": statistics.median(gaps_p50), "ttft_p50_ms": statistics.median(ttfts),
       "ttfts_ms": ttfts, "batch64_tok_s": tok / (t1 - t0)}
json.dump(res, open(out, "w"))
print(f"itl_target {tag:>8}: gap max {res['gap_max_ms']:.1f} ms (rounds "
      + ", ".join(f"{g:.0f}" for g in gaps_max)
      + f"), gap p50 {res['gap_p50_ms']:.1f} ms, prefill TTFT p50 {res['ttft_p50_ms']:.0f} ms, "
      f"batch-64 {res['batch64_tok_s']:.0f} tok/s")
PY
    kill "$w_pid"
    wait "$w_pid" 2>/dev/null || true
    w_pid=""
done

"$PY" - "$tmp" "$RESULTS" $TARGETS <<'PY'
import json, sys
tmp, out, tags = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = [json.load(open(f"{tmp}/{t}.json")) for t in tags]
doc = {"bench": "stall", "runs": runs}
if len(runs) >= 2:
    new, old = runs[0], runs[1]
    doc["ratios"] = {
        "ttft_p50": new["ttft_p50_ms"] / old["ttft_p50_ms"],
        "batch64": new["batch64_tok_s"] / old["batch64_tok_s"],
        "gap_max": new["gap_max_ms"] / old["gap_max_ms"],
    }
    r = doc["ratios"]
    print(f"{tags[0]} vs {tags[1]}: max gap {new['gap_max_ms']:.1f} ms (<= 60 wanted), "
          f"TTFT p50 x{r['ttft_p50']:.2f} (<= 1.05 wanted), batch-64 x{r['batch64']:.2f} "
          f"(>= 0.95 wanted)")
json.dump(doc, open(out, "w"), indent=1)
PY
