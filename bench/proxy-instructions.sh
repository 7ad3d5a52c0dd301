#!/bin/bash
# Instructions per proxied request, counted by valgrind's callgrind: what
# the machine's noise cannot move. infergate (the upstream as a site) and
# nginx (proxy_pass with keep-alive) in front of the same build/testupstream;
# igbench sends WARMUP requests, then callgrind counts the proxy's user-space
# instructions over N more (closed loop, CONCURRENCY users). Prints both
# counts per request and their ratio; writes
# bench/results/proxy-instructions.json.
#
# valgrind does not decode AVX-512, so BUILD_DIR must be a build without
# -march=native: cmake -S . -B build-cg -DIG_NATIVE=OFF -DIG_CUDA=OFF
# (only infergate, igbench and testupstream are needed).
#
# usage: bench/proxy-instructions.sh BUILD_DIR
# environment: N=2000 WARMUP=200 CONCURRENCY=8
#   RESULTS=bench/results/proxy-instructions.json
#   CG_DIR=DIR keeps the callgrind profiles there (callgrind_annotate reads them)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init proxy-instructions "$@"
bench_env N=2000 WARMUP=200 CONCURRENCY=8
check_bounds "100 <= $N <= 100000 and 0 <= $WARMUP <= 10000 and 1 <= $CONCURRENCY <= 256" \
    "100 <= N <= 100000, WARMUP <= 10000, CONCURRENCY <= 256"
need_built igbench testupstream infergate
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
for bin in valgrind callgrind_control callgrind_annotate "$NGINX"; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "proxy-instructions: $bin not found (valgrind; nginx-light)" >&2
        exit 2
    fi
done
pids=()
kill_on_exit vg_pid pids

"$build/testupstream" --quiet --delay-ms 0 >"$tmp/up.out" &
pids+=($!)
up_port=$(port_of "$tmp/up.out")

# count NAME PORT SIGNAL CMD...: starts CMD under callgrind with
# instrumentation off, loads it, counts N requests, stops it with SIGNAL (its
# graceful stop, so that callgrind writes its counts); prints the
# instructions per request.
count() {
    local name=$1 port=$2 sig=$3
    shift 3
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$tmp/$name.cg" \
        "$@" >"$tmp/$name.log" 2>&1 &
    vg_pid=$!
    for _ in $(seq 1 300); do # valgrind takes seconds to start it
        [ -n "$(http_get "$port" /health)" ] && break
        sleep 0.2
    done
    "$build/igbench" --quiet --target "127.0.0.1:$port" --concurrency "$CONCURRENCY" \
        --requests "$WARMUP" --model m >/dev/null 2>&1 || true
    callgrind_control -i on "$vg_pid" >/dev/null
    "$build/igbench" --quiet --target "127.0.0.1:$port" --concurrency "$CONCURRENCY" \
        --requests "$N" --model m --json "$tmp/$name.json" >/dev/null
    callgrind_control -i off "$vg_pid" >/dev/null
    kill -"$sig" "$vg_pid" 2>/dev/null || true
    wait "$vg_pid" 2>/dev/null || true
    vg_pid=""
    if [ -n "${CG_DIR:-}" ]; then
        mkdir -p "$CG_DIR" && cp "$tmp/$name".cg* "$CG_DIR/"
    fi
    local total
    total=$(callgrind_annotate "$tmp"/"$name".cg* 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' |
        head -1 | tr -d ,)
    "$PY" -c "print(round($total / $N))"
}

gw_port=$(free_port)
cat >"$tmp/gw.json" <<EOF
{"region": "bench", "listen": "127.0.0.1:$gw_port", "log": {"level": "warn"},
 "models": [{"name": "m"}],
 "sites": [{"name": "echo", "url": "http://127.0.0.1:$up_port", "models": ["m"]}],
 "routing": {"max_retries": 0}}
EOF
ig=$(count infergate "$gw_port" TERM "$build/infergate" serve --config "$tmp/gw.json")

ngx_port=$(free_port)
mkdir -p "$tmp/ngx/logs"
cat >"$tmp/ngx/nginx.conf" <<EOF
worker_processes 1; master_process off; daemon off;
error_log $tmp/ngx/logs/error.log warn; pid $tmp/ngx/nginx.pid;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $tmp/ngx/cb; proxy_temp_path $tmp/ngx/pt;
       fastcgi_temp_path $tmp/ngx/ft; uwsgi_temp_path $tmp/ngx/ut; scgi_temp_path $tmp/ngx/st;
  upstream echo { server 127.0.0.1:$up_port; keepalive 64; }
  server { listen 127.0.0.1:$ngx_port;
    location / { proxy_pass http://echo; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_buffering off; } } }
EOF
ngx=$(count nginx "$ngx_port" QUIT "$NGINX" -p "$tmp/ngx" -c "$tmp/ngx/nginx.conf")

"$PY" - "$RESULTS" "$ig" "$ngx" "$N" "$CONCURRENCY" <<'PYEOF'
import json, sys
out, ig, ngx, n, conc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print("instructions per proxied request: infergate %d, nginx %d; infergate/nginx %.2f" % (ig, ngx, ig / ngx))
json.dump({"bench": "proxy-instructions", "requests": n, "concurrency": conc,
           "infergate_instructions_per_request": ig, "nginx_instructions_per_request": ngx,
           "ratio": round(ig / ngx, 3)}, open(out, "w"), indent=1)
print("wrote", out)
PYEOF
