#!/bin/bash
# Soak: SOAK_S seconds (default 600) of mixed open-loop load through one
# gateway with a pool of two CPU worker instances and one site, with faults on
# a schedule, and an account of every request (bench/lib/soak.py):
#   * load: completions and chat, streamed and not, 10% client aborts;
#   * a worker SIGKILL every 60 s (the pool restarts it);
#   * the site is a close-delimited HTTP/1.0 server that flaps (down for
#     FLAP_S seconds, up for FLAP_S seconds), tests/peers/closedelim_upstream.py;
#   * a slow-reading client streaming long answers at all times.
# It prints `accepted = completed + failed-with-an-explicit-error + lost +
# hung` and passes only with 0 lost, 0 hung and nothing refused; it prints the
# gateway's and the workers' RSS after warm-up (WARMUP_S) and at the end, and
# fails when the gateway grew by more than 10%. With ASAN=1 it runs the
# gateway of an ASan build (BUILD_DIR built with -DIG_ASAN=ON) and fails on
# any sanitizer report of the gateway or its workers instead of on RSS (ASan's
# quarantine holds freed memory by design). An unoptimised ASan build
# serves far less: run it at a lower RATE (`make soak-asan` uses RATE=4).
#
# usage: bench/soak.sh [BUILD_DIR]           (default: build)
# environment:
#   SOAK_S=600 WARMUP_S=60 RATE=20 KILL_EVERY_S=60 FLAP_S=20 SEED=1
#   POLICY=round_robin (routing.policy)
#   TIMEOUT_S=60    a request with no end by then is counted as hung
#   ASAN=0          1: a sanitizer build; a report fails the run
#   RESULTS=bench/results/soak.json (soak-asan.json with ASAN=1)
# Needs: python3.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
# a sanitizer run keeps its own results file (bench_init's default: soak.json)
if [ "${ASAN:-0}" = 1 ]; then
    RESULTS=${RESULTS:-$here/results/soak-asan.json}
fi
bench_init soak "$@"
bench_env SOAK_S=600 WARMUP_S=60 RATE=20 KILL_EVERY_S=60 FLAP_S=20 SEED=1
# round_robin by default, so that a third of the traffic goes through the
# flapping, close-delimited site: the latency policy rightly sends it almost
# nothing, since the local workers answer in under a millisecond.
bench_env POLICY=round_robin TIMEOUT_S=60 ASAN=0
check_bounds "int($SOAK_S) <= 3600 and int($WARMUP_S) < int($SOAK_S)" \
    "SOAK_S <= 3600 and WARMUP_S < SOAK_S"
need_built infergate
kill_on_exit gw_pid site_pid

export ASAN_OPTIONS="log_path=$tmp/asan:detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="log_path=$tmp/ubsan:print_stacktrace=1"

"$build/infergate" mkmodel --preset tiny --out "$tmp/tiny" >/dev/null

"$PY" "$root/tests/peers/closedelim_upstream.py" --port 0 --http 1.0 \
    --model tiny --tokens 8 --token-delay-ms 2 --flap-s "$FLAP_S" --max-s $((${SOAK_S%.*} + 300)) >"$tmp/site.log" 2>&1 &
site_pid=$!
site_port=$(port_of "$tmp/site.log")

port=$(free_port)
cat >"$tmp/soak.json" <<EOF
{"region": "soak", "listen": "127.0.0.1:$port",
 "models": [{"name": "tiny", "path": "$tmp/tiny"}],
 "pools": [{"name": "cpu", "model": "tiny", "devices": ["cpu", "cpu"], "threads": 1,
            "min_instances": 2, "max_instances": 2}],
 "sites": [{"name": "flappy", "url": "http://127.0.0.1:$site_port", "region": "elsewhere",
            "models": ["tiny"]}],
 "routing": {"policy": "$POLICY"},
 "log": {"level": "warn"}}
EOF
"$build/infergate" serve --config "$tmp/soak.json" 2>"$tmp/gateway.log" &
gw_pid=$!
# Ready once both instances are: /ready answers 200 as soon as one is, so
# wait for two worker processes to have answered too (/status).
"$PY" - "$port" <<'PYEOF'
import json, sys, time, urllib.request
port = sys.argv[1]
deadline = time.time() + 60
while time.time() < deadline:
    try:
        st = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2))
        ready = sum(1 for p in st.get("pools", []) for i in p.get("instances", [])
                    if i.get("state") == "ready")
        if ready >= 2:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit("soak: the pool's two instances were not ready within 60 s")
PYEOF

echo "soak: gateway pid $gw_pid on 127.0.0.1:$port, site on $site_port; ${SOAK_S}s at $RATE req/s"
rc=0
"$PY" "$here/lib/soak.py" --port "$port" --gateway-pid "$gw_pid" --model tiny \
    --duration "$SOAK_S" --warmup "$WARMUP_S" --rate "$RATE" \
    --kill-every "$KILL_EVERY_S" --timeout "$TIMEOUT_S" --seed "$SEED" --json "$tmp/report.json" || rc=$?

# The gateway must still answer, then drain and exit cleanly.
if ! curl -fsS -m 5 "http://127.0.0.1:$port/health" >/dev/null; then
    echo "soak: FAIL: the gateway does not answer /health after the run" >&2
    rc=1
fi
kill -TERM "$gw_pid"
gw_rc=0
wait "$gw_pid" || gw_rc=$?
gw_pid=""
if [ "$gw_rc" -ne 0 ]; then
    echo "soak: FAIL: the gateway exited with status $gw_rc after SIGTERM" >&2
    rc=1
fi

reports=$(cat "$tmp"/asan.* "$tmp"/ubsan.* 2>/dev/null | grep -c "ERROR: \|runtime error:" || true)
growth=$("$PY" -c 'import json,sys; g=json.load(open(sys.argv[1]))["gateway_rss_growth"]; print("" if g is None else g)' "$tmp/report.json")
if [ "$ASAN" = 1 ]; then
    if [ "$reports" -ne 0 ]; then
        echo "soak: FAIL: $reports sanitizer reports:" >&2
        cat "$tmp"/asan.* "$tmp"/ubsan.* 2>/dev/null | head -80 >&2
        rc=1
    else
        echo "soak: no sanitizer report from the gateway or its workers"
    fi
elif [ -z "$growth" ] || "$PY" -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= 0.10 else 1)' "$growth"; then
    :
else
    echo "soak: FAIL: the gateway's RSS grew by more than 10% after warm-up" >&2
    rc=1
fi
if grep -q "ERROR\|error" "$tmp/gateway.log"; then
    echo "soak: gateway log errors (first 10):"
    grep "ERROR\|error" "$tmp/gateway.log" | head -10
fi

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$tmp/report.json" "$RESULTS" "$rc" "$reports" "$ASAN" <<'PYEOF'
import json, sys
rep = json.load(open(sys.argv[1]))
rep["scenario"] = "soak"
rep["passed"] = sys.argv[3] == "0"
rep["sanitizer_reports"] = int(sys.argv[4]) if sys.argv[5] == "1" else None
json.dump(rep, open(sys.argv[2], "w"), indent=1)
PYEOF
echo "soak: $([ $rc -eq 0 ] && echo PASS || echo FAIL); wrote $RESULTS"
exit $rc
