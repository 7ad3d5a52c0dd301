#!/bin/bash
# infergate against llama.cpp on the same GGUF files of the `1b` preset
# (Llama-3.2-1B's shape, random weights, written by `infergate mkmodel
# --format gguf`): BF16, Q8_0 and Q4_0. Everything is measured in this one run and
# printed as ratios (ours / llama.cpp):
#   - one-stream decode, BF16, Q8_0 and Q4_0: both servers over HTTP (our worker,
#     llama-server), the same prompt, N_TOKENS greedy tokens streamed, the
#     rate between the first and the last token; both servers up at once,
#     rounds alternating between them, best of ROUNDS each;
#   - batch 64 aggregate, BF16, Q8_0 and Q4_0: build/engine-bench --batches 64 against
#     llama-batched-bench -npl 64 (both engine-level, decode tokens/s),
#     ENGINE_ROUNDS rounds alternating, best of each (prefill too);
#   - prefill, BF16, Q8_0 and Q4_0: engine-bench's PREFILL-token prefill against
#     llama-bench -p PREFILL;
#   - the fraction of this machine's memory bandwidth that one-stream decode
#     reaches: bytes of weights read per token / time per token, against a
#     streaming read measured here by THREADS processes at once (numpy, 512
#     MiB each; one process's rate is printed too), before and after the
#     decode rounds, the higher of the two;
#   - the worker's RSS after decoding less its KV cache (its
#     infergate_worker_kv_cache_bytes), against the file's bytes.
# The 1b runs take minutes: a benchmark, never a test.
#
# usage: bench/vs-llamacpp.sh [BUILD_DIR]            (default: build)
# environment:
#   LLAMACPP_BIN=/work/peers/llama.cpp/build/bin   llama-server, llama-bench, llama-batched-bench
#   MODELS=/work/peers/models   where the 1b GGUFs are kept (made there when missing)
#   THREADS=2  N_TOKENS=48  ROUNDS=3  PREFILL=256  BATCH_STEPS=8  ENGINE_ROUNDS=2
#   RESULTS=bench/results/vs-llamacpp.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init vs-llamacpp "$@"
bench_env LLAMACPP_BIN=/work/peers/llama.cpp/build/bin MODELS=/work/peers/models \
    THREADS=2 N_TOKENS=48 ROUNDS=3 PREFILL=256 BATCH_STEPS=8 ENGINE_ROUNDS=2
check_bounds "$N_TOKENS <= 512 and $ROUNDS <= 5 and $PREFILL <= 2048 and $BATCH_STEPS <= 64 and 1 <= $ENGINE_ROUNDS <= 4" \
    "N_TOKENS <= 512, ROUNDS <= 5, PREFILL <= 2048, BATCH_STEPS <= 64 and ENGINE_ROUNDS in 1..4"
need_built infergate engine-bench
for t in llama-server llama-bench llama-batched-bench; do
    [ -x "$LLAMACPP_BIN/$t" ] || bench_fail "$LLAMACPP_BIN/$t not found (set LLAMACPP_BIN)"
done
mkdir -p "$MODELS" "$(dirname "$RESULTS")"
bf16=$MODELS/1b-bf16.gguf
q8=$MODELS/1b-q8_0.gguf
q4=$MODELS/1b-q4_0.gguf
[ -f "$bf16" ] || "$build/infergate" mkmodel --preset 1b --format gguf --out "$bf16"
[ -f "$q8" ] || "$build/infergate" mkmodel --preset 1b --format gguf --quantize q8_0 --out "$q8"
[ -f "$q4" ] || "$build/infergate" mkmodel --preset 1b --format gguf --quantize q4_0 --out "$q4"

kill_on_exit worker_pid llama_pid

# ---- memory bandwidth: a streaming read, one thread and THREADS at once ----
# Each process reads its own 512 MiB buffer (numpy's max: SIMD, memory-bound);
# THREADS of them start together at a barrier and the bytes of all over the
# slowest one's time is what the machine streams on THREADS cores, the
# reference for decode on THREADS threads. It is measured before and after
# the decode rounds and the higher of the two is the reference: this
# machine's bandwidth has moved by half within minutes (a shared host).
stream_bw() { # -> "GB/s on 1 thread" "GB/s on THREADS"
    OPENBLAS_NUM_THREADS=1 "$PY" - "$THREADS" <<'EOF'
import multiprocessing as mp, sys, time, numpy as np
def reader(bar, q):
    a = np.ones(1 << 27, dtype=np.float32)  # 512 MiB
    a.max()
    best = 1e9
    for _ in range(4):
        bar.wait(); t = time.perf_counter(); a.max(); best = min(best, time.perf_counter() - t)
    q.put((a.nbytes, best))
def run(n):
    bar, q = mp.Barrier(n), mp.Queue()
    ps = [mp.Process(target=reader, args=(bar, q)) for _ in range(n)]
    for p in ps: p.start()
    got = [q.get() for _ in ps]
    for p in ps: p.join()
    return sum(b for b, _ in got) / max(t for _, t in got) / 1e9
print("%.2f %.2f" % (run(1), run(int(sys.argv[1]))))
EOF
}
read -r bw1_before bw_before <<<"$(stream_bw)"
echo "memory bandwidth before decode (streaming read): $bw1_before GB/s on 1 thread, $bw_before GB/s on $THREADS"

# ---- one-stream decode over HTTP ----------------------------------------------
# Both servers run at once (idle while the other is measured) and the rounds
# alternate, ours then llama.cpp: on a machine shared with other work, load
# that comes and goes then falls on both alike instead of on one phase.
# stream_rate PORT KIND: tokens/s between the first and the last streamed
# token of one request (KIND: ours | llama).
stream_rate() {
    "$PY" - "$1" "$2" "$N_TOKENS" <<'EOF2'
import http.client, json, sys, time
port, kind, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
prompt = "The history of the city begins with a small settlement on the river"
if kind == "ours":
    path = "/v1/completions"
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, "ignore_eos": True}
else:
    path = "/completion"
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "stream": True,
            "ignore_eos": True, "cache_prompt": False}
c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
r = c.getresponse()
times = []
for line in r:
    line = line.strip()
    if not line.startswith(b"data: ") or line == b"data: [DONE]":
        continue
    ev = json.loads(line[6:])
    text = ev["choices"][0].get("text", "") if kind == "ours" else ev.get("content", "")
    if text or (kind != "ours" and ev.get("stop") is False):
        times.append(time.perf_counter())
c.close()
print(f"{(len(times) - 1) / (times[-1] - times[0]):.3f}" if len(times) >= 2 else "0")
EOF2
}

wait_http() { # PORT PATH: up to 300 s
    for _ in $(seq 1 600); do
        if curl -sf "http://127.0.0.1:$1$2" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    bench_fail "nothing answered on port $1$2"
}

rss_kb() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
best() { "$PY" -c 'import sys; print(max(float(x) for x in sys.argv[1:]))' "$@"; }

decode_pair() { # FILE LABEL -> sets ours_tps llama_tps ours_rss
    local wport lport r o=() l=()
    wport=$(free_port)
    lport=$(free_port)
    "$build/infergate" worker --model "$1" --device "cpu:$THREADS" --listen "127.0.0.1:$wport" \
        --kv-blocks 64 --log-level warn &
    worker_pid=$!
    # llama-server maps the file only once the worker has packed it: pages
    # another process maps cannot be handed back, and would count in both.
    wait_http "$wport" /ready
    "$LLAMACPP_BIN/llama-server" -m "$1" --port "$lport" --host 127.0.0.1 -t "$THREADS" -c 1024 \
        -np 1 >"$tmp/llama-$2.log" 2>&1 &
    llama_pid=$!
    wait_http "$lport" /health
    for r in $(seq 1 "$ROUNDS"); do
        o+=("$(stream_rate "$wport" ours)")
        l+=("$(stream_rate "$lport" llama)")
    done
    ours_tps=$(best "${o[@]}")
    llama_tps=$(best "${l[@]}")
    ours_rss=$(rss_kb "$worker_pid") # after decoding: a mapped file counts once touched
    ours_kv=$(curl -s "http://127.0.0.1:$wport/metrics" |
        awk '/^infergate_worker_kv_cache_bytes/ {s += $2} END {print s + 0}')
    llama_rss=$(rss_kb "$llama_pid")
    kill "$worker_pid" "$llama_pid"
    wait "$worker_pid" "$llama_pid" 2>/dev/null || true
    worker_pid= llama_pid=
    echo "decode $2: infergate ${o[*]} -> $ours_tps tok/s (RSS $((ours_rss / 1024)) MiB), llama.cpp ${l[*]} -> $llama_tps tok/s (RSS $((llama_rss / 1024)) MiB)"
}

decode_pair "$bf16" bf16
d_bf16_ours=$ours_tps d_bf16_llama=$llama_tps rss_bf16=$ours_rss kv_bf16=$ours_kv
decode_pair "$q8" q8_0
d_q8_ours=$ours_tps d_q8_llama=$llama_tps rss_q8=$ours_rss kv_q8=$ours_kv
decode_pair "$q4" q4_0
d_q4_ours=$ours_tps d_q4_llama=$llama_tps rss_q4=$ours_rss kv_q4=$ours_kv
read -r bw1_after bw_after <<<"$(stream_bw)"
bw1=$(best "$bw1_before" "$bw1_after") bw=$(best "$bw_before" "$bw_after")
echo "memory bandwidth after decode: $bw1_after GB/s on 1 thread, $bw_after GB/s on $THREADS; the reference: $bw1 and $bw"

# ---- batch 64 and prefill (engine level), BF16, Q8_0 and Q4_0 ----------------
# ENGINE_ROUNDS rounds, ours then llama.cpp's in each, the best of each side:
# a neighbour's burst then costs one side one round, not the whole figure.
engine_pair() { # FILE -> prints "ours_b64 llama_b64 ours_prefill llama_prefill"
    local f=$1 b bl p pl
    "$build/engine-bench" --model "$f" --threads "$THREADS" --batches 64 --steps "$BATCH_STEPS" \
        --prompt 16 --prefill "$PREFILL" --rounds 1 --out "$tmp/eb.json" >"$tmp/eb.txt" 2>&1
    b=$("$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); print([r for r in j["decode"] if r["batch"]==64][0]["tokens_per_s"])' "$tmp/eb.json")
    p=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill_tokens_per_s"])' "$tmp/eb.json")
    "$LLAMACPP_BIN/llama-batched-bench" -m "$f" -c 4096 -b 2048 -ub 512 -npp 16 \
        -ntg "$BATCH_STEPS" -npl 64 -t "$THREADS" >"$tmp/bb.txt" 2>&1
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    bl=$(awk -F'|' '$4+0 == 64 {gsub(/ /,"",$9); print $9}' "$tmp/bb.txt" | tail -1)
    "$LLAMACPP_BIN/llama-bench" -m "$f" -p "$PREFILL" -n 0 -t "$THREADS" -r 1 -o csv \
        >"$tmp/lb.csv" 2>/dev/null
    pl=$("$PY" -c '
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(rows[-1]["avg_ts"])' "$tmp/lb.csv")
    echo "$b ${bl:-0} $p ${pl:-0}"
}
b64_ours=0 pf_ours=0 b64_llama=0 pf_llama=0
b64q_ours=0 pfq_ours=0 b64q_llama=0 pfq_llama=0
b64q4_ours=0 pfq4_ours=0 b64q4_llama=0 pfq4_llama=0
for r in $(seq 1 "$ENGINE_ROUNDS"); do
    read -r b bl p pl < <(engine_pair "$bf16")
    echo "engine round $r, BF16: batch 64 $b vs $bl tok/s, prefill $p vs $pl tok/s (ours vs llama.cpp)"
    b64_ours=$(best "$b64_ours" "$b") pf_ours=$(best "$pf_ours" "$p")
    b64_llama=$(best "$b64_llama" "$bl") pf_llama=$(best "$pf_llama" "$pl")
    read -r b bl p pl < <(engine_pair "$q8")
    echo "engine round $r, Q8_0: batch 64 $b vs $bl tok/s, prefill $p vs $pl tok/s (ours vs llama.cpp)"
    b64q_ours=$(best "$b64q_ours" "$b") pfq_ours=$(best "$pfq_ours" "$p")
    b64q_llama=$(best "$b64q_llama" "$bl") pfq_llama=$(best "$pfq_llama" "$pl")
    read -r b bl p pl < <(engine_pair "$q4")
    echo "engine round $r, Q4_0: batch 64 $b vs $bl tok/s, prefill $p vs $pl tok/s (ours vs llama.cpp)"
    b64q4_ours=$(best "$b64q4_ours" "$b") pfq4_ours=$(best "$pfq4_ours" "$p")
    b64q4_llama=$(best "$b64q4_llama" "$bl") pfq4_llama=$(best "$pfq4_llama" "$pl")
done
echo "batch 64: BF16 infergate $b64_ours tok/s, llama.cpp $b64_llama; Q8_0 $b64q_ours vs $b64q_llama; Q4_0 $b64q4_ours vs $b64q4_llama"
echo "prefill $PREFILL: BF16 infergate $pf_ours tok/s, llama.cpp $pf_llama; Q8_0 $pfq_ours vs $pfq_llama; Q4_0 $pfq4_ours vs $pfq4_llama"

# ---- report -------------------------------------------------------------------
"$PY" - "$RESULTS" <<EOF
import json, os, sys
bw, bw1 = float("$bw"), float("$bw1")
bf16_bytes = os.path.getsize("$bf16"); q8_bytes = os.path.getsize("$q8"); q4_bytes = os.path.getsize("$q4")
def r(a, b): return float(a) / float(b) if float(b) > 0 else float("nan")
res = {
    "bandwidth_gbs_1thread": bw1, "bandwidth_gbs": bw, "threads": int("$THREADS"),
    "decode_bf16": {"ours": float("$d_bf16_ours"), "llamacpp": float("$d_bf16_llama"),
                    "ratio": r("$d_bf16_ours", "$d_bf16_llama"),
                    "bandwidth_fraction": float("$d_bf16_ours") * bf16_bytes / 1e9 / bw},
    "decode_q8_0": {"ours": float("$d_q8_ours"), "llamacpp": float("$d_q8_llama"),
                    "ratio": r("$d_q8_ours", "$d_q8_llama"),
                    "bandwidth_fraction": float("$d_q8_ours") * q8_bytes / 1e9 / bw},
    "decode_q4_0": {"ours": float("$d_q4_ours"), "llamacpp": float("$d_q4_llama"),
                    "ratio": r("$d_q4_ours", "$d_q4_llama"),
                    "bandwidth_fraction": float("$d_q4_ours") * q4_bytes / 1e9 / bw},
    "batch64_bf16": {"ours": float("$b64_ours"), "llamacpp": float("$b64_llama"),
                     "ratio": r("$b64_ours", "$b64_llama")},
    "prefill_bf16": {"tokens": int("$PREFILL"), "ours": float("$pf_ours"),
                     "llamacpp": float("$pf_llama"), "ratio": r("$pf_ours", "$pf_llama")},
    "batch64_q8_0": {"ours": float("$b64q_ours"), "llamacpp": float("$b64q_llama"),
                     "ratio": r("$b64q_ours", "$b64q_llama")},
    "prefill_q8_0": {"tokens": int("$PREFILL"), "ours": float("$pfq_ours"),
                     "llamacpp": float("$pfq_llama"), "ratio": r("$pfq_ours", "$pfq_llama")},
    "batch64_q4_0": {"ours": float("$b64q4_ours"), "llamacpp": float("$b64q4_llama"),
                     "ratio": r("$b64q4_ours", "$b64q4_llama")},
    "prefill_q4_0": {"tokens": int("$PREFILL"), "ours": float("$pfq4_ours"),
                     "llamacpp": float("$pfq4_llama"), "ratio": r("$pfq4_ours", "$pfq4_llama")},
    "rss": {"bf16_file_mib": bf16_bytes / 2**20, "bf16_worker_mib": int("$rss_bf16") / 1024,
            "bf16_kv_mib": int("$kv_bf16") / 2**20,
            "bf16_ratio": int("$rss_bf16") * 1024 / bf16_bytes,
            "bf16_ratio_less_kv": (int("$rss_bf16") * 1024 - int("$kv_bf16")) / bf16_bytes,
            "q8_0_file_mib": q8_bytes / 2**20, "q8_0_worker_mib": int("$rss_q8") / 1024,
            "q8_0_kv_mib": int("$kv_q8") / 2**20,
            "q8_0_ratio": int("$rss_q8") * 1024 / q8_bytes,
            "q8_0_ratio_less_kv": (int("$rss_q8") * 1024 - int("$kv_q8")) / q8_bytes,
            "q4_0_file_mib": q4_bytes / 2**20, "q4_0_worker_mib": int("$rss_q4") / 1024,
            "q4_0_ratio_less_kv": (int("$rss_q4") * 1024 - int("$kv_q4")) / q4_bytes},
}
json.dump(res, open(sys.argv[1], "w"), indent=2)
print()
print("ratios (infergate / llama.cpp), 1b preset, %d threads:" % res["threads"])
for k in ("decode_bf16", "decode_q8_0", "decode_q4_0", "batch64_bf16", "batch64_q8_0",
          "batch64_q4_0", "prefill_bf16", "prefill_q8_0", "prefill_q4_0"):
    print("  %-13s %.2fx  (%.2f vs %.2f tok/s)" % (k, res[k]["ratio"], res[k]["ours"], res[k]["llamacpp"]))
for k in ("decode_bf16", "decode_q8_0", "decode_q4_0"):
    print("  %-13s reads %.2f of the streaming bandwidth on %d threads (%.1f GB/s; %.1f on one)"
          % (k, res[k]["bandwidth_fraction"], res["threads"], bw, bw1))
rs = res["rss"]
print("  worker RSS after decoding, less its KV cache (%.0f MiB): %.2fx the BF16 file, %.2fx the Q8_0 file, %.2fx the Q4_0 file (target <= 1.15x)"
      % (rs["bf16_kv_mib"], rs["bf16_ratio_less_kv"], rs["q8_0_ratio_less_kv"], rs["q4_0_ratio_less_kv"]))
print("wrote", sys.argv[1])
EOF
