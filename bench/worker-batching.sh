#!/bin/bash
# Continuous batching in one worker: igbench drives `infergate worker` over
# its Unix socket with the same closed-loop load twice, once with batching
# off (--max-num-seqs 1: one sequence per forward pass, the baseline) and
# once with it on (--max-num-seqs 64), alternated REPEAT times. Prints output
# tokens/s, TTFT and TPOT of both and the ratio batched/unbatched, and writes
# bench/results/worker-batching.json.
#
# usage: bench/worker-batching.sh [BUILD_DIR]         (default: build)
# environment:
#   PRESET=small        mkmodel preset of the random-weight model
#   DEVICE=cpu          worker --device (cpu, cpu:N, cuda:0, ...)
#   CONCURRENCY=16      igbench users in the closed loop
#   REQUESTS=96         requests per run (the first 16 are warm-up)
#   INPUT_TOKENS=32     prompt length (words; the small preset has 256 positions)
#   MAX_TOKENS=64       generated tokens per request (ignore_eos)
#   REPEAT=2            runs of each setting, alternated (A B A B)
#   RESULTS=bench/results/worker-batching.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init worker-batching "$@"
bench_env PRESET=small DEVICE=cpu CONCURRENCY=16 REQUESTS=96 INPUT_TOKENS=32 \
    MAX_TOKENS=64 REPEAT=2
# Bounded runs only.
check_bounds "$REQUESTS <= 5000 and $CONCURRENCY <= 512 and 1 <= $REPEAT <= 10" \
    "REQUESTS <= 5000, CONCURRENCY <= 512, 1 <= REPEAT <= 10"
need_built infergate igbench
kill_on_exit wpid

"$build/infergate" mkmodel --preset "$PRESET" --out "$tmp/model" >/dev/null

# Starts a worker with the given --max-num-seqs and waits for /ready.
start_worker() {
    local seqs=$1 sock="$tmp/w.sock"
    rm -f "$sock"
    "$build/infergate" worker --model "$tmp/model" --name test --device "$DEVICE" \
        --listen "unix:$sock" --max-num-seqs "$seqs" --max-waiting 4096 \
        --log-level warn 2>"$tmp/worker-$seqs.log" &
    wpid=$!
    for _ in $(seq 1 600); do
        if "$build/igbench" --target "unix:$sock" --concurrency 1 --requests 1 \
            --raw GET /ready --quiet --json "$tmp/ready.json" >/dev/null 2>&1 &&
            "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["requests"]["ok"] >= 1 else 1)' \
                "$tmp/ready.json" 2>/dev/null; then
            return 0
        fi
        if ! kill -0 "$wpid" 2>/dev/null; then
            echo "worker-batching: worker exited; log:" >&2
            cat "$tmp/worker-$seqs.log" >&2
            exit 1
        fi
        sleep 0.1
    done
    echo "worker-batching: worker not ready after 60 s" >&2
    exit 1
}

stop_worker() {
    kill "$wpid" 2>/dev/null || true
    wait "$wpid" 2>/dev/null || true
    wpid=""
}

run() {
    local seqs=$1 i=$2
    start_worker "$seqs"
    "$build/igbench" --target "unix:$tmp/w.sock" --concurrency "$CONCURRENCY" \
        --requests "$REQUESTS" --warmup 0 --input-tokens "$INPUT_TOKENS" \
        --max-tokens "$MAX_TOKENS" --stream --model test --quiet \
        --label "max-num-seqs=$seqs" --json "$tmp/run-$seqs-$i.json" >/dev/null
    stop_worker
}

for i in $(seq 1 "$REPEAT"); do
    run 1 "$i"
    run 64 "$i"
done

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$tmp" "$REPEAT" "$RESULTS" "$PRESET" "$DEVICE" "$CONCURRENCY" "$REQUESTS" \
    "$INPUT_TOKENS" "$MAX_TOKENS" <<'EOF'
import json, statistics, sys
tmp, repeat, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
params = dict(zip(["preset", "device", "concurrency", "requests", "input_tokens", "max_tokens"],
                  sys.argv[4:10]))
def load(seqs):
    runs = [json.load(open(f"{tmp}/run-{seqs}-{i}.json")) for i in range(1, repeat + 1)]
    med = lambda f: statistics.median(f(r) for r in runs)
    return {
        "output_tokens_per_s": med(lambda r: r["output_tokens_per_s"]),
        "throughput_rps": med(lambda r: r["throughput_rps"]),
        "ttft_p50_ms": med(lambda r: r["latency_ms"]["ttft"]["p50"]),
        "ttft_p99_ms": med(lambda r: r["latency_ms"]["ttft"]["p99"]),
        "tpot_p50_ms": med(lambda r: r["latency_ms"]["tpot"]["p50"]),
        "errors": sum(sum(r["errors"].values()) if isinstance(r["errors"], dict) else r["errors"]
                      for r in runs),
        "runs": runs,
    }
base, batched = load(1), load(64)
ratio = batched["output_tokens_per_s"] / base["output_tokens_per_s"] if base["output_tokens_per_s"] else 0
doc = {"scenario": "worker-batching", "params": params,
       "baseline_max_num_seqs_1": base, "batched_max_num_seqs_64": batched,
       "ratio_output_tokens_per_s": ratio}
json.dump(doc, open(out, "w"), indent=2)
print(f"worker-batching ({params['preset']} on {params['device']}, {params['concurrency']} users, "
      f"{params['input_tokens']} in / {params['max_tokens']} out)")
print(f"  {'':22} {'tok/s':>10} {'TTFT p50':>10} {'TTFT p99':>10} {'TPOT p50':>10} {'errors':>7}")
for name, r in (("max-num-seqs 1", base), ("max-num-seqs 64", batched)):
    print(f"  {name:22} {r['output_tokens_per_s']:10.1f} {r['ttft_p50_ms']:10.1f} "
          f"{r['ttft_p99_ms']:10.1f} {r['tpot_p50_ms']:10.2f} {r['errors']:7d}")
print(f"  ratio batched/unbatched output tokens/s: {ratio:.2f}x   -> {out}")
EOF
