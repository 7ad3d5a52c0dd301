#!/bin/bash
# HTTP front end against nginx: wrk drives GET /health on infergate and on an
# nginx instance that returns the same body and content type, with both
# servers pinned to the same single core and wrk on another one, the same
# connections and duration. Prints requests/s and p99 latency of both and the
# ratios infergate/nginx, and writes bench/results/http-vs-nginx.json.
#
# usage: bench/http-vs-nginx.sh [BUILD_DIR]         (default: build)
# environment:
#   DURATION=10      seconds of each measured run
#   WARMUP=2         seconds of an unmeasured run before each
#   CONNECTIONS=64   wrk connections (keep-alive)
#   WRK_THREADS=1    wrk threads
#   REPEAT=3         measured runs of each server, alternated (A B A B ...) so
#                    that load from elsewhere hits both alike; medians reported
#   SERVER_CPU=0     the core both servers are pinned to (infergate is
#                    single-threaded; nginx gets worker_processes 1)
#   CLIENT_CPU=1     the core wrk is pinned to
#   RESULTS=bench/results/http-vs-nginx.json
# Needs: wrk, nginx (Debian nginx-light), taskset, python3.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init http-vs-nginx "$@"
bench_env DURATION=10 WARMUP=2 CONNECTIONS=64 WRK_THREADS=1 REPEAT=3 SERVER_CPU=0 \
    CLIENT_CPU=1
# Bounded runs only: a typo must not start an hour-long benchmark.
check_bounds "$DURATION <= 120 and $WARMUP <= 30 and 1 <= $REPEAT <= 10" \
    "DURATION <= 120, WARMUP <= 30 and 1 <= REPEAT <= 10"

for tool in wrk nginx taskset python3; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
        echo "http-vs-nginx: $tool not found (apt-get install wrk nginx-light util-linux)" >&2
        exit 2
    fi
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
need_built infergate
ncpu=$(nproc)
if [ "$SERVER_CPU" -ge "$ncpu" ] || [ "$CLIENT_CPU" -ge "$ncpu" ]; then
    echo "http-vs-nginx: SERVER_CPU/CLIENT_CPU must be below $ncpu" >&2
    exit 2
fi

kill_on_exit ig_pid ngx_pid

# Waits until GET /health answers 200, up to 10 s.
wait_up() {
    for _ in $(seq 1 100); do
        if python3 - "$1" <<'EOF' 2>/dev/null; then return 0; fi
import socket, sys
import benchlib
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
data = benchlib.get_all(s, "/health")
sys.exit(0 if data.startswith(b"HTTP/1.1 200") else 1)
EOF
        sleep 0.1
    done
    echo "http-vs-nginx: server on port $1 did not come up" >&2
    return 1
}

# The raw response to one keep-alive GET /health (what wrk receives each time).
response_bytes() {
    python3 - "$1" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
data = b""
while b"\r\n\r\n" not in data:
    data += s.recv(4096)
head, body = data.split(b"\r\n\r\n", 1)
length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0]
while len(body) < length:
    body += s.recv(4096)
print(len(head) + 4 + length)
for line in head.split(b"\r\n"):
    sys.stderr.write("    " + line.decode() + "\n")
sys.stderr.write("    \n    " + body.decode() + "\n")
EOF
}

# Runs wrk against a port; prints "RPS P99_MS".
measure() {
    local port=$1 out
    if [ "$WARMUP" -gt 0 ]; then
        taskset -c "$CLIENT_CPU" wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"${WARMUP}s" \
            "http://127.0.0.1:$port/health" >/dev/null
    fi
    out=$(taskset -c "$CLIENT_CPU" wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"${DURATION}s" \
        --latency "http://127.0.0.1:$port/health")
    echo "$out" >>"$tmp/wrk.log"
    python3 - <<EOF
import re
out = """$out"""
rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))
m = re.search(r"^\s+99%\s+([0-9.]+)(us|ms|s)\s*$", out, re.M)
scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
sock = re.search(r"Socket errors: .*", out)
if errors or sock:
    import sys
    sys.stderr.write("http-vs-nginx: wrk reported errors:\n" + out + "\n")
print(f"{rps:.1f} {float(m.group(1)) * scale:.3f}")
EOF
}

# ---- infergate ---------------------------------------------------------------
# Access logs off on both sides (warn level here, access_log off in nginx):
# this measures the HTTP path, not stderr.
# No pools and no sites: the gateway starts no workers, so the server core
# runs the HTTP path alone, as nginx does.
ig_port=$(free_port)
printf '{"region": "bench", "listen": "127.0.0.1:%s", "log": {"level": "warn"}}\n' \
    "$ig_port" >"$tmp/infergate.json"
taskset -c "$SERVER_CPU" "$build/infergate" serve --config "$tmp/infergate.json" \
    2>"$tmp/infergate.log" &
ig_pid=$!
wait_up "$ig_port"

# ---- nginx: same body and content type, unprivileged-style temp prefix ---------
ngx_port=$(free_port)
nginx_conf "$tmp/nginx" <<EOF
    server {
        listen 127.0.0.1:$ngx_port;
        location = /health {
            default_type application/json;
            return 200 '{"status":"ok"}';
        }
    }
EOF
taskset -c "$SERVER_CPU" "$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" \
    -e "$tmp/nginx/logs/error.log" &
ngx_pid=$!
wait_up "$ngx_port"

echo "http-vs-nginx: GET /health, $CONNECTIONS connections, ${DURATION}s (+${WARMUP}s warm-up)," \
    "servers on cpu $SERVER_CPU, wrk on cpu $CLIENT_CPU"
echo "  infergate response:"
ig_bytes=$(response_bytes "$ig_port")
echo "  nginx response:"
ngx_bytes=$(response_bytes "$ngx_port")

ig_runs=""
ngx_runs=""
for i in $(seq 1 "$REPEAT"); do
    ig_runs="$ig_runs $(measure "$ig_port" | tr ' ' ,)"
    ngx_runs="$ngx_runs $(measure "$ngx_port" | tr ' ' ,)"
    echo "  run $i/$REPEAT: infergate ${ig_runs##* } nginx ${ngx_runs##* } (req/s,p99 ms)"
done

python3 - "$RESULTS" <<EOF
import statistics, sys
import benchlib
def runs(text):
    return [tuple(float(x) for x in r.split(",")) for r in text.split()]
ig, ngx = runs("$ig_runs"), runs("$ngx_runs")
ig_rps, ig_p99 = statistics.median(r[0] for r in ig), statistics.median(r[1] for r in ig)
ngx_rps, ngx_p99 = statistics.median(r[0] for r in ngx), statistics.median(r[1] for r in ngx)
res = benchlib.result(
    "http-vs-nginx",
    {"duration_s": $DURATION, "warmup_s": $WARMUP, "connections": $CONNECTIONS,
     "wrk_threads": $WRK_THREADS, "repeat": $REPEAT, "server_cpu": $SERVER_CPU,
     "client_cpu": $CLIENT_CPU, "cpus": $ncpu, "path": "/health"},
    infergate={"requests_per_s": ig_rps, "p99_ms": ig_p99, "response_bytes": $ig_bytes,
               "runs": [{"requests_per_s": a, "p99_ms": b} for a, b in ig]},
    nginx={"requests_per_s": ngx_rps, "p99_ms": ngx_p99, "response_bytes": $ngx_bytes,
           "runs": [{"requests_per_s": a, "p99_ms": b} for a, b in ngx]},
    ratio={"requests_per_s": round(ig_rps / ngx_rps, 3), "p99": round(ig_p99 / ngx_p99, 3)})
benchlib.write(sys.argv[1], res)
print(f"  median of {len(ig)} runs each:")
print(f"  {'':10} {'req/s':>12} {'p99 ms':>9} {'resp bytes':>11}")
print(f"  {'infergate':10} {ig_rps:12.0f} {ig_p99:9.3f} {$ig_bytes:11d}")
print(f"  {'nginx':10} {ngx_rps:12.0f} {ngx_p99:9.3f} {$ngx_bytes:11d}")
print(f"  ratio infergate/nginx: requests/s {res['ratio']['requests_per_s']:.3f}, "
      f"p99 {res['ratio']['p99']:.3f} (higher req/s and lower p99 are better)")
print(f"  wrote {sys.argv[1]}")
EOF
