#!/bin/bash
# What it would cost a gateway without model files to have each text prompt
# tokenized by a worker (POST /v1/tokenize, one round trip before routing),
# against the same round trip doing no work (GET /health) on the same
# keep-alive connection, in the same run: one CPU worker of the tiny preset
# (a Llama-2 sentencepiece tokenizer) on loopback TCP, one client thread,
# prompts of about 250, 1,000 and 4,000 tokens, N requests each.
# docs/routing.md ("Text prompts without model files") reads the figures.
#
# usage: bench/tokenize-remote.sh [BUILD_DIR]        (default: build)
# environment: N=500, PORT=18641, RESULTS=bench/results/tokenize-remote.json
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
N=${N:-500}
PORT=${PORT:-18641}
RESULTS=${RESULTS:-$root/bench/results/tokenize-remote.json}
tmp=$(mktemp -d /tmp/ig-tokenize-remote.XXXXXX)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
"$build/infergate" mkmodel --preset tiny --out "$tmp/tiny" >/dev/null
"$build/infergate" worker --model "$tmp/tiny" --listen "127.0.0.1:$PORT" --name tiny \
    --threads 1 --log-level warn &
pid=$!
for _ in $(seq 100); do curl -sf "127.0.0.1:$PORT/ready" >/dev/null && break; sleep 0.1; done
N=$N PORT=$PORT RESULTS=$RESULTS python3 - <<'PY'
import http.client, json, os, random, time
n, port = int(os.environ["N"]), int(os.environ["PORT"])
random.seed(1)
words = ("the quick brown fox jumps over a lazy dog while tenants share long system "
         "prompts about policy, refunds, shipping and the weather in 2026").split()
c = http.client.HTTPConnection("127.0.0.1", port)
def call(method, path, body=None):
    c.request(method, path, body, {"Content-Type": "application/json"} if body else {})
    r = c.getresponse()
    return r.read()
def timed(method, path, body=None):
    call(method, path, body)
    t0 = time.perf_counter()
    for _ in range(n):
        call(method, path, body)
    return (time.perf_counter() - t0) / n
base = timed("GET", "/health")
rows = []
for nw in (100, 400, 1600):
    body = json.dumps({"model": "tiny", "prompt": " ".join(random.choice(words) for _ in range(nw))})
    toks = json.loads(call("POST", "/v1/tokenize", body))["count"]
    t = timed("POST", "/v1/tokenize", body)
    rows.append({"tokens": toks, "tokenize_s": t, "health_s": base, "extra_s": t - base,
                 "ratio_vs_health": t / base})
    print(f"{toks:5d} tokens: /v1/tokenize {t*1e3:.3f} ms per request, /health {base*1e3:.3f} ms "
          f"({t/base:.2f}x); {1e3*(t-base):.3f} ms more than an empty round trip")
os.makedirs(os.path.dirname(os.environ["RESULTS"]), exist_ok=True)
with open(os.environ["RESULTS"], "w") as f:
    json.dump({"bench": "tokenize-remote", "requests": n, "rows": rows}, f, indent=1)
PY
