#!/bin/bash
# What a proxy adds: an echo upstream (build/testupstream, no delay) reached
# directly -- the baseline, measured in the same run -- and through
# infergate (the upstream configured as a site serving the model), nginx
# (proxy_pass to an upstream block with keepalive) and HAProxy (http mode,
# keep-alive and connection reuse to the server). All four get the same
# non-streamed POST /v1/completions (the only paths the gateway forwards).
# The proxy under test is pinned to PROXY_CPU; igbench and the upstream to
# CLIENT_CPU. For each it measures the added p50/p99 latency against direct
# at a fixed open-loop rate, and the maximum throughput in a closed loop;
# prints the ratios to nginx (targets: infergate's CPU per request <= nginx's,
# added p99 <= nginx's; issue 29) and writes bench/results/proxy-overhead.json
# and .png.
#
# usage: bench/proxy-overhead.sh [BUILD_DIR]        (default: build)
# environment:
#   RATE=500          open-loop Poisson rate (requests/s) for the latency figures
#   DURATION=4        seconds of each open-loop run (after WARMUP)
#   CONCURRENCY=64    closed-loop users for the throughput figure
#   TPUT_DURATION=3   seconds of each closed-loop run (after WARMUP)
#   WARMUP=1          seconds of each run not counted
#   REPEAT=3          runs of each target, alternated (A B C D A B C D), so that
#                     load from elsewhere hits all alike; medians reported
#   TOKENS=16         max_tokens of each request (the answer's length)
#   PROXY_CPU=0       the core the proxy under test is pinned to
#   CLIENT_CPU=1      the core igbench and the upstream are pinned to
#   TARGETS="direct infergate nginx haproxy"
#   BASE=             another build directory: its infergate runs as target
#                     "base" beside the others (configured alike), and the
#                     ratio infergate/base is printed -- a change's cost in
#                     the same run (issue 31's "within 1.05x of before")
#   RESULTS=bench/results/proxy-overhead.json
# Needs: nginx (Debian nginx-light), haproxy, taskset, python3 (scripts/deps.sh
# bench); gnuplot for the PNG (skipped with a note when missing).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init proxy-overhead "$@"
bench_env RATE=500 DURATION=4 CONCURRENCY=64 TPUT_DURATION=3 WARMUP=1 REPEAT=3 \
    TOKENS=16 PROXY_CPU=0 CLIENT_CPU=1 TARGETS="direct infergate nginx haproxy" BASE=
check_bounds "0 < $RATE <= 20000 and 0 < $DURATION <= 60 and 0 < $TPUT_DURATION <= 60
      and 0 <= $WARMUP <= 10 and 1 <= $REPEAT <= 10 and 1 <= $CONCURRENCY <= 1024
      and 1 <= $TOKENS <= 4096" \
    "RATE <= 20000, DURATION and TPUT_DURATION <= 60, WARMUP <= 10," \
    "1 <= REPEAT <= 10, CONCURRENCY <= 1024, TOKENS <= 4096"
need_one_of target "direct infergate nginx haproxy" $TARGETS
if [ -n "$BASE" ]; then
    [ -x "$BASE/infergate" ] || bench_fail "BASE=$BASE has no infergate"
    TARGETS="$TARGETS base"
fi
need_built igbench testupstream infergate
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
for bin in "$NGINX" "$HAPROXY" "$(command -v taskset || true)"; do
    if [ ! -x "$bin" ]; then
        echo "proxy-overhead: nginx, haproxy or taskset not found" \
            "(scripts/deps.sh bench: nginx-light haproxy util-linux)" >&2
        exit 2
    fi
done
ncpu=$(nproc)
if [ "$PROXY_CPU" -ge "$ncpu" ] || [ "$CLIENT_CPU" -ge "$ncpu" ]; then
    echo "proxy-overhead: PROXY_CPU/CLIENT_CPU must be below $ncpu" >&2
    exit 2
fi

pids=()
kill_on_exit pids

# Waits (up to 10 s) until a completion through PORT answers 200; prints the
# response's size in bytes (head + body) and its head lines to stderr.
wait_completion() {
    for _ in $(seq 1 100); do
        if "$PY" - "$1" "$TOKENS" <<'PYEOF'; then return 0; fi
import json, socket, sys
body = json.dumps({"model": "m", "prompt": "hello there", "max_tokens": int(sys.argv[2])}).encode()
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
except OSError:
    sys.exit(1)
s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
data = b""
while b"\r\n\r\n" not in data:
    chunk = s.recv(4096)
    if not chunk:
        sys.exit(1)
    data += chunk
head, rest = data.split(b"\r\n\r\n", 1)
if not head.startswith(b"HTTP/1.1 200"):
    sys.exit(1)
length = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
if length:
    while len(rest) < length[0]:
        rest += s.recv(4096)
print(len(head) + 4 + len(rest))
for line in head.split(b"\r\n")[1:]:
    sys.stderr.write("      " + line.decode() + "\n")
PYEOF
        sleep 0.1
    done
    echo "proxy-overhead: no 200 from port $1" >&2
    return 1
}

# ---- the echo upstream ---------------------------------------------------------
taskset -c "$CLIENT_CPU" "$build/testupstream" --quiet --delay-ms 0 >"$tmp/up.out" &
pids+=($!)
up_port=$(port_of "$tmp/up.out")
declare -A port

# ---- infergate: the upstream as a site serving model m ----------------------------
port[direct]=$up_port
port[infergate]=$(free_port)
cat >"$tmp/gateway.json" <<EOF
{"region": "bench", "listen": "127.0.0.1:${port[infergate]}", "log": {"level": "warn"},
 "models": [{"name": "m"}],
 "sites": [{"name": "echo", "url": "http://127.0.0.1:$up_port", "models": ["m"]}],
 "routing": {"max_retries": 0}}
EOF
declare -A ppid
# start_infergate NAME BIN: BIN serves the config above on its own port as target NAME.
start_infergate() {
    local name=$1 bin=$2
    [ "$name" = infergate ] || port[$name]=$(free_port)
    sed "s/127.0.0.1:${port[infergate]}\"/127.0.0.1:${port[$name]}\"/" "$tmp/gateway.json" \
        >"$tmp/$name.json"
    taskset -c "$PROXY_CPU" "$bin" serve --config "$tmp/$name.json" 2>"$tmp/$name.log" &
    pids+=($!)
    ppid[$name]=$!
}
start_infergate infergate "$build/infergate"
[ -z "$BASE" ] || start_infergate base "$BASE/infergate"

# ---- nginx: one worker, an upstream block with keep-alive connections ------------
port[nginx]=$(free_port)
nginx_conf "$tmp/nginx" <<EOF
    upstream echo {
        server 127.0.0.1:$up_port;
        keepalive 128;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:${port[nginx]};
        location / {
            proxy_pass http://echo;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
EOF
taskset -c "$PROXY_CPU" "$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" \
    -e "$tmp/nginx/logs/error.log" &
pids+=($!)
ppid[nginx]=$!

# ---- HAProxy: http mode, one thread, keep-alive and reuse to the server ------------
port[haproxy]=$(free_port)
cat >"$tmp/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 75s
    timeout server 75s
    timeout http-keep-alive 75s
frontend fe
    bind 127.0.0.1:${port[haproxy]}
    default_backend be
backend be
    server echo 127.0.0.1:$up_port maxconn 1024
EOF
taskset -c "$PROXY_CPU" "$HAPROXY" -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 &
pids+=($!)
ppid[haproxy]=$!
ppid[direct]=""

echo "proxy-overhead: POST /v1/completions (max_tokens $TOKENS, non-streamed) to testupstream" \
    "127.0.0.1:$up_port; proxies on cpu $PROXY_CPU, igbench and upstream on cpu $CLIENT_CPU"
declare -A bytes
for t in $TARGETS; do
    echo "  $t (127.0.0.1:${port[$t]}) response head:"
    bytes[$t]=$(wait_completion "${port[$t]}")
done

# CPU time of a proxy in nanoseconds: every thread of the process and of
# its children (nginx's worker), from /proc/PID/task/TID/schedstat, the
# scheduler's exact run time. (utime + stime count 100 Hz ticks: a 3 s run
# of a proxy 40% busy is some 120 of them, a +-9% error per run.) 0 for
# direct.
cpu_ns() {
    local pid=$1 total=0 p f
    [ -z "$pid" ] && {
        echo 0
        return
    }
    for p in $pid $(pgrep -P "$pid" || true); do
        for f in /proc/"$p"/task/*/schedstat; do
            [ -r "$f" ] || continue
            read -r ns _ <"$f" || continue
            total=$((total + ns))
        done
    done
    echo "$total"
}

# One igbench run; prints the JSON path. A closed-loop run also writes the
# proxy's CPU time over it to PATH.cpu (ns).
bench() { # target kind run
    local t=$1 kind=$2 i=$3 out="$tmp/$1-$2-$3.json"
    if [ "$kind" = open ]; then
        taskset -c "$CLIENT_CPU" "$build/igbench" --quiet --target "127.0.0.1:${port[$t]}" \
            --rate "$RATE" --duration "$((DURATION + WARMUP))" --warmup "$WARMUP" --seed "$i" \
            --endpoint completions --model m --max-tokens "$TOKENS" --timeout 10 \
            --label "$t-open" --json "$out"
    else
        local c0 c1
        c0=$(cpu_ns "${ppid[$t]}")
        taskset -c "$CLIENT_CPU" "$build/igbench" --quiet --target "127.0.0.1:${port[$t]}" \
            --concurrency "$CONCURRENCY" --duration "$((TPUT_DURATION + WARMUP))" \
            --warmup "$WARMUP" --seed "$i" --endpoint completions --model m \
            --max-tokens "$TOKENS" --timeout 10 --label "$t-closed" --json "$out"
        c1=$(cpu_ns "${ppid[$t]}")
        echo $((c1 - c0)) >"$out.cpu"
    fi
    echo "$out"
}

for i in $(seq 1 "$REPEAT"); do
    for t in $TARGETS; do
        o=$(bench "$t" open "$i")
        c=$(bench "$t" closed "$i")
        "$PY" - "$t" "$i" "$o" "$c" <<'PYEOF'
import json, sys
t, i, o, c = sys.argv[1:5]
import os
ns = int(open(c + ".cpu").read())
o, c = json.load(open(o)), json.load(open(c))
e = o["latency_ms"]["e2e"]
err = o["requests"]["errors"] + c["requests"]["errors"]
cpu = ns / 1e3 / max(c["requests"]["issued"], 1)
print("  run %s %-10s open: p50 %.3f p99 %.3f ms   closed: %.0f req/s, proxy cpu %.1f us/req%s"
      % (i, t, e["p50"], e["p99"], c["throughput_rps"], cpu, "   ERRORS %d" % err if err else ""))
PYEOF
    done
done

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$RESULTS" "$tmp" "$REPEAT" $TARGETS <<PYEOF
import json, os, statistics, sys
import benchlib
out, tmp, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
targets = sys.argv[4:]
bytes_ = {$(for t in $TARGETS; do printf '"%s": %s, ' "$t" "${bytes[$t]}"; done)}
rows = {}
for t in targets:
    runs = []
    for i in range(1, repeat + 1):
        o = json.load(open("%s/%s-open-%d.json" % (tmp, t, i)))
        cpath = "%s/%s-closed-%d.json" % (tmp, t, i)
        c = json.load(open(cpath))
        ns = int(open(cpath + ".cpu").read())
        runs.append({"p50_ms": o["latency_ms"]["e2e"]["p50"], "p99_ms": o["latency_ms"]["e2e"]["p99"],
                     "open_errors": o["requests"]["errors"],
                     "send_lag_p99_ms": o["latency_ms"].get("send_lag", {}).get("p99"),
                     "requests_per_s": c["throughput_rps"], "closed_errors": c["requests"]["errors"],
                     "closed_p99_ms": c["latency_ms"]["e2e"]["p99"],
                     "proxy_cpu_us_per_request": round(ns / 1e3 / max(c["requests"]["issued"], 1),
                                                       2)})
    med = lambda k: statistics.median(r[k] for r in runs)
    rows[t] = {"p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
               "requests_per_s": med("requests_per_s"), "response_bytes": bytes_[t],
               "proxy_cpu_us_per_request": med("proxy_cpu_us_per_request"),
               "errors": sum(r["open_errors"] + r["closed_errors"] for r in runs), "runs": runs}
if "direct" in rows:
    for t in targets:
        rows[t]["added_p50_ms"] = round(rows[t]["p50_ms"] - rows["direct"]["p50_ms"], 4)
        rows[t]["added_p99_ms"] = round(rows[t]["p99_ms"] - rows["direct"]["p99_ms"], 4)
ratio = {}
if "nginx" in rows:
    for t in targets:
        if t in ("nginx", "direct"):
            continue
        r = {"requests_per_s": round(rows[t]["requests_per_s"] / rows["nginx"]["requests_per_s"], 3)}
        if rows["nginx"]["proxy_cpu_us_per_request"] > 0:
            r["cpu_per_request"] = round(rows[t]["proxy_cpu_us_per_request"]
                                         / rows["nginx"]["proxy_cpu_us_per_request"], 3)
        if "direct" in rows and rows["nginx"]["added_p99_ms"] > 0:
            r["added_p99"] = round(rows[t]["added_p99_ms"] / rows["nginx"]["added_p99_ms"], 3)
            r["added_p50"] = round(rows[t]["added_p50_ms"] / rows["nginx"]["added_p50_ms"], 3) \
                if rows["nginx"]["added_p50_ms"] > 0 else None
        ratio[t + "/nginx"] = r
if "base" in rows:
    b, n = rows["base"], rows["infergate"]
    ratio["infergate/base"] = {
        "requests_per_s": round(n["requests_per_s"] / b["requests_per_s"], 3),
        "cpu_per_request": round(n["proxy_cpu_us_per_request"] / b["proxy_cpu_us_per_request"], 3)
        if b["proxy_cpu_us_per_request"] > 0 else None}
res = benchlib.result(
    "proxy-overhead",
    {"rate_rps": $RATE, "duration_s": $DURATION, "concurrency": $CONCURRENCY,
     "tput_duration_s": $TPUT_DURATION, "warmup_s": $WARMUP, "repeat": repeat,
     "tokens": $TOKENS, "proxy_cpu": $PROXY_CPU, "client_cpu": $CLIENT_CPU,
     "cpus": $ncpu, "request": "POST /v1/completions, non-streamed"},
    what="added p50/p99 latency vs direct (open loop) and max throughput (closed loop) "
         "of infergate, nginx and haproxy in front of one echo upstream",
    targets=rows,
    ratio=ratio,
    plot={"title": "proxy overhead at %d req/s (open loop), added latency vs direct" % $RATE,
          "xlabel": "target (%s)" % ", ".join("%d=%s" % (i + 1, t) for i, t in enumerate(targets)),
          "ylabel": "ms",
          "x": list(range(1, len(targets) + 1)),
          "series": {"added p50": [rows[t].get("added_p50_ms", rows[t]["p50_ms"]) for t in targets],
                     "added p99": [rows[t].get("added_p99_ms", rows[t]["p99_ms"]) for t in targets]}})
benchlib.write(out, res)
print("  median of %d runs each (open loop %d req/s; closed loop $CONCURRENCY users):" % (repeat, $RATE))
print("  %-10s %9s %9s %10s %10s %10s %8s %6s %6s" % ("target", "p50 ms", "p99 ms", "+p50 ms",
      "+p99 ms", "req/s", "cpu us/r", "bytes", "errors"))
for t in targets:
    x = rows[t]
    print("  %-10s %9.3f %9.3f %10.3f %10.3f %10.0f %8.1f %6d %6d" % (t, x["p50_ms"], x["p99_ms"],
          x.get("added_p50_ms", 0), x.get("added_p99_ms", 0), x["requests_per_s"],
          x["proxy_cpu_us_per_request"], x["response_bytes"], x["errors"]))
for k, r in ratio.items():
    line = "  %s: requests/s %.3f" % (k, r["requests_per_s"])
    if "added_p99" in r:
        line += ", added p99 %.3f" % r["added_p99"]
    if r.get("cpu_per_request") is not None:
        line += ", cpu/request %.3f" % r["cpu_per_request"]
    if k == "infergate/nginx":
        ok = (r.get("cpu_per_request") or 0) <= 1.0 and r.get("added_p99", 0) <= 1.0
        line += "  (targets: cpu/request <= 1, added p99 <= 1) %s" % ("ok" if ok else "MISSED")
    print(line)
print("  wrote " + out)
PYEOF
bench_plot
