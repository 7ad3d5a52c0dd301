#!/bin/bash
# infergate against llama.cpp on the same GGUF files of the `1b` preset
# (Llama-3.2-1B's shape, random weights): BF16, Q8_0 and Q4_0 written by
# `infergate mkmodel --format gguf`, and Q4_K_M written by llama.cpp's own
# llama-quantize from the BF16 file. Everything is measured in this one run
# and printed as ratios (ours / llama.cpp), for each format of FORMATS:
#   - one-stream decode: both servers over HTTP (our worker, llama-server),
#     the same prompt, N_TOKENS greedy tokens streamed, the rate between the
#     first and the last token; both servers up at once, rounds alternating
#     between them, best of ROUNDS each;
#   - batch 64 aggregate: build/engine-bench --batches 64 against
#     llama-batched-bench -npl 64 (both engine-level, decode tokens/s),
#     ENGINE_ROUNDS rounds alternating, best of each (prefill too);
#   - prefill: engine-bench's PREFILL-token prefill against llama-bench -p
#     PREFILL;
#   - the fraction of this machine's memory bandwidth that one-stream decode
#     reaches: bytes of the file read per token / time per token, against a
#     streaming read measured here by THREADS processes at once (numpy, 512
#     MiB each; one process's rate is printed too), before and after the
#     decode rounds, the higher of the two;
#   - both servers' RSS after decoding; ours less its KV cache (its
#     infergate_worker_kv_cache_bytes) against the file's bytes.
# The 1b runs take minutes: a benchmark, never a test.
#
# usage: bench/vs-llamacpp.sh [BUILD_DIR]            (default: build)
# environment:
#   LLAMACPP_BIN=/work/peers/llama.cpp/build/bin   llama-server, llama-bench,
#                 llama-batched-bench, and llama-quantize for q4_k_m
#   MODELS=/work/peers/models   where the 1b GGUFs are kept (made there when missing)
#   FORMATS="bf16 q8_0 q4_0 q4_k_m"   any of these, in this order
#   THREADS=2  N_TOKENS=48  ROUNDS=3  PREFILL=256  BATCH_STEPS=8  ENGINE_ROUNDS=2
#   RESULTS=bench/results/vs-llamacpp.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init vs-llamacpp "$@"
bench_env LLAMACPP_BIN=/work/peers/llama.cpp/build/bin MODELS=/work/peers/models \
    FORMATS="bf16 q8_0 q4_0 q4_k_m" THREADS=2 N_TOKENS=48 ROUNDS=3 PREFILL=256 BATCH_STEPS=8 \
    ENGINE_ROUNDS=2
check_bounds "$N_TOKENS <= 512 and $ROUNDS <= 5 and $PREFILL <= 2048 and $BATCH_STEPS <= 64 and 1 <= $ENGINE_ROUNDS <= 4" \
    "N_TOKENS <= 512, ROUNDS <= 5, PREFILL <= 2048, BATCH_STEPS <= 64 and ENGINE_ROUNDS in 1..4"
read -r -a formats <<<"$FORMATS"
[ ${#formats[@]} -gt 0 ] || bench_fail "FORMATS is empty"
need_one_of format "bf16 q8_0 q4_0 q4_k_m" "${formats[@]}"
need_built infergate engine-bench
tools="llama-server llama-bench llama-batched-bench"
[[ " $FORMATS " == *" q4_k_m "* ]] && tools+=" llama-quantize"
for t in $tools; do
    [ -x "$LLAMACPP_BIN/$t" ] || bench_fail "$LLAMACPP_BIN/$t not found (set LLAMACPP_BIN)"
done
mkdir -p "$MODELS" "$(dirname "$RESULTS")"
# Absolute: llama-quantize reads a name that starts with a digit as a type number.
MODELS=$(cd "$MODELS" && pwd)
model_file() { echo "$MODELS/1b-$1.gguf"; }
bf16=$(model_file bf16)
for f in "${formats[@]}"; do
    path=$(model_file "$f")
    [ -f "$path" ] && continue
    case $f in
    bf16) "$build/infergate" mkmodel --preset 1b --format gguf --out "$path" ;;
    q4_k_m) # llama.cpp's own mix of Q4_K and Q6_K, from the BF16 file
        [ -f "$bf16" ] || "$build/infergate" mkmodel --preset 1b --format gguf --out "$bf16"
        "$LLAMACPP_BIN/llama-quantize" "$bf16" "$path.part" Q4_K_M "$THREADS" >"$tmp/quantize.log" 2>&1 ||
            { cat "$tmp/quantize.log" >&2; bench_fail "llama-quantize failed"; }
        mv "$path.part" "$path" ;;
    *) "$build/infergate" mkmodel --preset 1b --format gguf --quantize "$f" --out "$path" ;;
    esac
done

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

decode_pair() { # FILE LABEL -> sets ours_tps llama_tps ours_rss ours_kv llama_rss
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

# Each figure goes to $tmp/figures as "FORMAT KEY VALUE", read by the report.
figures=$tmp/figures
: >"$figures"
for f in "${formats[@]}"; do
    decode_pair "$(model_file "$f")" "$f"
    echo "$f decode_ours $ours_tps
$f decode_llama $llama_tps
$f rss_kb $ours_rss
$f kv_bytes $ours_kv
$f llama_rss_kb $llama_rss" >>"$figures"
done
read -r bw1_after bw_after <<<"$(stream_bw)"
bw1=$(best "$bw1_before" "$bw1_after") bw=$(best "$bw_before" "$bw_after")
echo "memory bandwidth after decode: $bw1_after GB/s on 1 thread, $bw_after GB/s on $THREADS; the reference: $bw1 and $bw"

# ---- batch 64 and prefill (engine level) ---------------------------------------
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
for r in $(seq 1 "$ENGINE_ROUNDS"); do
    for f in "${formats[@]}"; do
        read -r b bl p pl < <(engine_pair "$(model_file "$f")")
        echo "engine round $r, $f: batch 64 $b vs $bl tok/s, prefill $p vs $pl tok/s (ours vs llama.cpp)"
        echo "$f b64_ours $b
$f b64_llama $bl
$f prefill_ours $p
$f prefill_llama $pl" >>"$figures"
    done
done

# ---- report -------------------------------------------------------------------
"$PY" - "$RESULTS" "$figures" "$MODELS" "$bw" "$bw1" "$THREADS" "$PREFILL" "${formats[@]}" <<'EOF'
import json, os, sys
out, figs, models = sys.argv[1:4]
bw, bw1, threads, prefill = float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
formats = sys.argv[8:]
got = {}  # (format, key) -> the best of the engine rounds' rates, else the one value
for line in open(figs):
    f, k, v = line.split()
    v = float(v)
    got[f, k] = max(got.get((f, k), v), v)
def r(a, b): return a / b if b > 0 else float("nan")
res = {"bandwidth_gbs_1thread": bw1, "bandwidth_gbs": bw, "threads": threads, "rss": {}}
for f in formats:
    size = os.path.getsize(os.path.join(models, "1b-%s.gguf" % f))
    ours, llama = got[f, "decode_ours"], got[f, "decode_llama"]
    res["decode_" + f] = {"ours": ours, "llamacpp": llama, "ratio": r(ours, llama),
                          "bandwidth_fraction": ours * size / 1e9 / bw}
    for k, key in (("batch64_", "b64"), ("prefill_", "prefill")):
        ours, llama = got[f, key + "_ours"], got[f, key + "_llama"]
        res[k + f] = {"ours": ours, "llamacpp": llama, "ratio": r(ours, llama)}
    res["prefill_" + f]["tokens"] = prefill
    rss, kv = got[f, "rss_kb"] * 1024, got[f, "kv_bytes"]
    res["rss"].update({f + "_file_mib": size / 2**20, f + "_worker_mib": rss / 2**20,
                       f + "_kv_mib": kv / 2**20, f + "_ratio_less_kv": (rss - kv) / size,
                       f + "_llamacpp_mib": got[f, "llama_rss_kb"] / 1024})
json.dump(res, open(out, "w"), indent=2)
print()
print("ratios (infergate / llama.cpp), 1b preset, %d threads:" % threads)
for k in ("decode_", "batch64_", "prefill_"):
    for f in formats:
        x = res[k + f]
        print("  %-16s %.2fx  (%.2f vs %.2f tok/s)" % (k + f, x["ratio"], x["ours"], x["llamacpp"]))
for f in formats:
    print("  %-16s reads %.2f of the streaming bandwidth on %d threads (%.1f GB/s; %.1f on one)"
          % ("decode_" + f, res["decode_" + f]["bandwidth_fraction"], threads, bw, bw1))
rs = res["rss"]
for f in formats:
    print("  %-7s RSS after decoding: worker %.0f MiB (%.2fx the %.0f MiB file, less its %.0f MiB"
          " KV cache; target <= 1.15x), llama-server %.0f MiB"
          % (f, rs[f + "_worker_mib"], rs[f + "_ratio_less_kv"], rs[f + "_file_mib"],
             rs[f + "_kv_mib"], rs[f + "_llamacpp_mib"]))
print("wrote", out)
EOF
