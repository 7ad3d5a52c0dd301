#!/bin/bash
# llama.cpp's llama-server as a site of the gateway, against going to it
# directly; then the same case with the project's own worker in its place.
# llama-server is thread-per-connection (cpp-httplib): a keep-alive
# connection holds one of its HTTP threads, so a gateway that keeps idle
# connections or opens one per concurrent request starves it (issue 12:
# 27-44x slower than direct).
#
# The model: `infergate mkmodel --preset small` (random weights, the shape
# of stories15M) converted to GGUF by bench/lib/hf2gguf.py with llama.cpp's
# gguf-py. Each case: ROUNDS rounds of N concurrent completions (MAX_TOKENS
# tokens, ignore_eos), one connection per request as a simple client opens
# them, first directly to the server, then through `infergate serve` with
# the server as its only site, the rounds interleaved (direct, gateway,
# direct, ...). Prints each round's wall time and the ratio
# gateway/direct of the total (target <= 1.15); writes
# bench/results/llamacpp-site.json. The figure before a change: the same script
# with BUILD_DIR the build of an older checkout (its infergate is used for
# mkmodel, the worker and the gateway).
#
# usage: bench/llamacpp-site.sh [BUILD_DIR]         (default: build)
# environment:
#   LLAMACPP_BIN=/work/peers/llama.cpp/build/bin   where llama-server is
#   LLAMACPP_SRC=/work/peers/llama.cpp             where gguf-py is
#   ROUNDS=3  N=16  MAX_TOKENS=32
#   SLOTS=4   llama-server -np (and the worker's --max-num-seqs)
#   THREADS=1 compute threads of llama-server and of the worker
#   RESULTS=bench/results/llamacpp-site.json
# Needs: python3 with NumPy (python3-numpy) for the conversion.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init llamacpp-site "$@"
bench_env LLAMACPP_BIN=/work/peers/llama.cpp/build/bin \
    LLAMACPP_SRC=/work/peers/llama.cpp ROUNDS=3 N=16 MAX_TOKENS=32 SLOTS=4 THREADS=1
check_bounds "1 <= $ROUNDS <= 10 and 1 <= $N <= 64 and 1 <= $MAX_TOKENS <= 256
      and 1 <= $SLOTS <= 16 and 1 <= $THREADS <= 16" \
    "ROUNDS <= 10, N <= 64, MAX_TOKENS <= 256, SLOTS <= 16, THREADS <= 16"
need_built infergate
[ -x "$LLAMACPP_BIN/llama-server" ] ||
    bench_fail "no llama-server in $LLAMACPP_BIN (set LLAMACPP_BIN)"
"$PY" -c "import numpy" 2>/dev/null || bench_fail "$PY has no NumPy (apt-get install python3-numpy)"
pids=()
kill_on_exit gw_pid pids

"$build/infergate" mkmodel --preset small --out "$tmp/model" >/dev/null
LLAMACPP_SRC=$LLAMACPP_SRC "$PY" "$here/lib/hf2gguf.py" "$tmp/model" "$tmp/model.gguf" >/dev/null

wait_http() { # port path
    "$PY" - "$1" "$2" <<'PYEOF'
import sys, urllib.request
import benchlib
url = "http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2])
sys.exit(0 if benchlib.poll(lambda: urllib.request.urlopen(url, timeout=1).status == 200, 60) else 1)
PYEOF
}

# rounds PORT LABEL: ROUNDS x N concurrent completions; writes
# $tmp/rounds-LABEL.json {"rounds_s": [...], "total_s", "errors"}.
rounds() {
    "$PY" - "$1" "$tmp/rounds-$2.json" "${ROUNDS}" "$N" "$MAX_TOKENS" <<'PYEOF'
import http.client, json, sys, threading, time
port, out = int(sys.argv[1]), sys.argv[2]
rounds, n, max_tokens = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
body = json.dumps({"model": "m", "prompt": "once upon a time", "max_tokens": max_tokens,
                   "ignore_eos": True, "temperature": 0})
errors = [0]
def one():
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        if r.status != 200:
            errors[0] += 1
        c.close()
    except Exception:
        errors[0] += 1
times = []
for _ in range(rounds):
    t0 = time.time()
    th = [threading.Thread(target=one) for _ in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    times.append(time.time() - t0)
json.dump({"rounds_s": times, "total_s": sum(times), "errors": errors[0]}, open(out, "w"))
print("    %s" % " ".join("%.2fs" % t for t in times))
PYEOF
}

# gateway PORT SITE_URL: infergate serve with one site, in the background.
gateway() {
    "$PY" - "$tmp/gw.json" "$1" "$2" <<'PYEOF'
import json, sys
out, port, url = sys.argv[1:4]
json.dump({"region": "bench", "listen": "127.0.0.1:" + port, "log": {"level": "warn"},
           "models": [{"name": "m"}],
           "sites": [{"name": "up", "url": url, "models": ["m"]}]}, open(out, "w"))
PYEOF
    "$build/infergate" serve --config "$tmp/gw.json" 2>"$tmp/gw.log" &
    gw_pid=$!
    wait_http "$1" /ready || { cat "$tmp/gw.log" >&2; bench_fail "the gateway never got ready"; }
}

stop_gateway() {
    "$PY" - "$1" "$tmp/status-$2.json" <<'PYEOF' || true
import sys, urllib.request
open(sys.argv[2], "w").write(urllib.request.urlopen(
    "http://127.0.0.1:%s/status" % sys.argv[1], timeout=2).read().decode())
PYEOF
    kill "$gw_pid" 2>/dev/null && wait "$gw_pid" 2>/dev/null || true
    gw_pid=""
}

# One upstream, direct and through the gateway, the rounds interleaved
# (direct, gateway, direct, ...) so that a busy machine slows both alike.
# case_of NAME PORT
case_of() {
    local name=$1 port=$2 gw i
    wait_http "$port" /health || bench_fail "$name never answered /health"
    gw=$(free_port)
    gateway "$gw" "http://127.0.0.1:$port"
    # The first requests warm caches up and let the gateway learn.
    rounds "$port" "$name-warm" >/dev/null
    rounds "$gw" "$name-gwwarm" >/dev/null
    for i in $(seq 1 "$ROUNDS"); do
        ROUNDS=1 rounds "$port" "$name-direct-$i" >/dev/null
        ROUNDS=1 rounds "$gw" "$name-gateway-$i" >/dev/null
    done
    stop_gateway "$gw" "$name"
    "$PY" - "$tmp" "$name" "$ROUNDS" <<'PYEOF'
import json, sys
tmp, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for kind in ("direct", "gateway"):
    rs = [json.load(open("%s/rounds-%s-%s-%d.json" % (tmp, name, kind, i)))
          for i in range(1, rounds + 1)]
    doc = {"rounds_s": [r["rounds_s"][0] for r in rs], "errors": sum(r["errors"] for r in rs)}
    doc["total_s"] = sum(doc["rounds_s"])
    json.dump(doc, open("%s/rounds-%s-%s.json" % (tmp, name, kind), "w"))
    print("  %s %-8s %s" % (name, kind, " ".join("%.2fs" % t for t in doc["rounds_s"])))
PYEOF
}

echo "llamacpp-site: $ROUNDS rounds x $N concurrent completions of $MAX_TOKENS tokens;" \
    "$SLOTS slots, $THREADS thread(s)"
lport=$(free_port)
"$LLAMACPP_BIN/llama-server" -m "$tmp/model.gguf" --host 127.0.0.1 --port "$lport" \
    -np "$SLOTS" -c $((SLOTS * 512)) -t "$THREADS" --alias m >"$tmp/llama.log" 2>&1 &
pids+=($!)
case_of llama-server "$lport"
kill "${pids[0]}" 2>/dev/null && wait "${pids[0]}" 2>/dev/null || true
pids=()

wport=$(free_port)
"$build/infergate" worker --model "$tmp/model" --device cpu --listen "127.0.0.1:$wport" \
    --threads "$THREADS" --max-num-seqs "$SLOTS" --name m --log-level warn 2>"$tmp/worker.log" &
pids+=($!)
case_of worker "$wport"

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$RESULTS" "$tmp" <<PYEOF
import json, sys, time
out, tmp = sys.argv[1:3]
res = {"scenario": "llamacpp-site",
       "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "command": "bench/llamacpp-site.sh",
       "what": "$ROUNDS x $N concurrent completions through the gateway vs direct",
       "params": {"rounds": $ROUNDS, "n": $N, "max_tokens": $MAX_TOKENS, "slots": $SLOTS,
                  "threads": $THREADS,
                  "loadavg_1m": float(open("/proc/loadavg").read().split()[0])},
       "cases": {}}
for name in ("llama-server", "worker"):
    d = json.load(open("%s/rounds-%s-direct.json" % (tmp, name)))
    g = json.load(open("%s/rounds-%s-gateway.json" % (tmp, name)))
    try:
        st = json.load(open("%s/status-%s.json" % (tmp, name)))["sites"][0]
        site = {k: st.get(k) for k in ("concurrency_limit", "limit_reason", "concurrency", "peer")}
    except Exception:
        site = {}
    ratio = round(g["total_s"] / d["total_s"], 3)
    res["cases"][name] = {"direct": d, "gateway": g, "ratio_gateway_over_direct": ratio,
                          "site": site}
    print("  %-12s direct %.2fs, gateway %.2fs: ratio %.3f (target <= 1.15) %s; errors %d/%d; %s"
          % (name, d["total_s"], g["total_s"], ratio, "ok" if ratio <= 1.15 else "MISSED",
             d["errors"], g["errors"], site))
json.dump(res, open(out, "w"), indent=2)
open(out, "a").write("\n")
print("  wrote " + out)
PYEOF
