#!/bin/bash
# TLS on the listener against plain HTTP and against nginx with the same
# certificate (P-256, made here by openssl):
#   - handshakes/s: `openssl s_time -new` (a full handshake per connection,
#     no request) against infergate's and nginx's TLS ports;
#   - proxied requests/s: wrk POSTs /v1/completions (keep-alive) through
#     infergate to a test upstream, over https and over http, and the same
#     through nginx (proxy_pass to the same upstream, keep-alive upstream
#     connections), over https and over http.
# Both servers are pinned to the same single core, the clients to another.
# Prints the figures and the ratios (TLS/plain for each server, infergate/
# nginx for each protocol) and writes bench/results/tls.json.
#
# usage: bench/tls.sh [BUILD_DIR]         (default: build)
# environment:
#   DURATION=5       seconds of each measured run
#   WARMUP=1         seconds of an unmeasured run before each wrk run
#   CONNECTIONS=32   wrk connections
#   SERVER_CPU=0     the core both servers are pinned to
#   CLIENT_CPU=1     the core wrk and s_time are pinned to
#   RESULTS=bench/results/tls.json
# Needs: wrk, nginx (Debian nginx-light, with http_ssl), openssl, taskset.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init tls "$@"
bench_env DURATION=5 WARMUP=1 CONNECTIONS=32 SERVER_CPU=0 CLIENT_CPU=1
check_bounds "$DURATION <= 60 and $WARMUP <= 10 and 1 <= $CONNECTIONS <= 1024" \
    "DURATION <= 60, WARMUP <= 10 and CONNECTIONS <= 1024"
for tool in wrk openssl taskset; do
    command -v "$tool" >/dev/null 2>&1 || bench_fail "$tool not found (scripts/deps.sh bench)"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || bench_fail "nginx not found (scripts/deps.sh bench)"
need_built infergate testupstream
ncpu=$(nproc)
[ "$SERVER_CPU" -lt "$ncpu" ] && [ "$CLIENT_CPU" -lt "$ncpu" ] ||
    bench_fail "SERVER_CPU/CLIENT_CPU must be below $ncpu"

kill_on_exit ig_pid igp_pid ngx_pid up_pid

# ---- the certificate: a CA and a leaf for localhost ------------------------
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $ec -keyout "$tmp/ca.key" -out "$tmp/ca.pem" -days 2 -subj /CN=bench-ca \
    2>/dev/null
openssl req $ec -keyout "$tmp/srv.key" -out "$tmp/srv.csr" -subj /CN=localhost 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$tmp/ext"
openssl x509 -req -in "$tmp/srv.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -set_serial 7 \
    -out "$tmp/srv.pem" -days 2 -extfile "$tmp/ext" 2>/dev/null
chmod 644 "$tmp/srv.key"

# ---- the upstream: instant one-token completions ----------------------------
up_port=$(free_port)
taskset -c "$CLIENT_CPU" "$build/testupstream" --listen "127.0.0.1:$up_port" --quiet \
    --instant-raw >/dev/null &
up_pid=$!

# ---- infergate: one TLS gateway and one plain, the same upstream as a site --
gw_conf() { # PORT EXTRA
    printf '{"region":"bench","listen":"127.0.0.1:%s","log":{"level":"warn"},
 "models":[{"name":"m"}],
 "sites":[{"name":"up","url":"http://127.0.0.1:%s","models":["m"]}]%s}\n' "$1" "$up_port" "$2"
}
ig_port=$(free_port)
igp_port=$(free_port)
gw_conf "$ig_port" ",\"tls\":{\"cert_file\":\"$tmp/srv.pem\",\"key_file\":\"$tmp/srv.key\"}" \
    >"$tmp/ig-tls.json"
gw_conf "$igp_port" "" >"$tmp/ig-plain.json"
taskset -c "$SERVER_CPU" "$build/infergate" serve --config "$tmp/ig-tls.json" \
    2>"$tmp/ig-tls.log" &
ig_pid=$!
taskset -c "$SERVER_CPU" "$build/infergate" serve --config "$tmp/ig-plain.json" \
    2>"$tmp/ig-plain.log" &
igp_pid=$!

# ---- nginx: the same certificate, TLS and plain servers, proxying ----------
ngx_port=$(free_port)
ngxp_port=$(free_port)
nginx_conf "$tmp/nginx" <<EOF
    upstream up { server 127.0.0.1:$up_port; keepalive 64; }
    server {
        listen 127.0.0.1:$ngx_port ssl;
        ssl_certificate $tmp/srv.pem;
        ssl_certificate_key $tmp/srv.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache off;
        ssl_session_tickets off;
        location / { proxy_pass http://up; proxy_http_version 1.1;
                     proxy_set_header Connection ""; }
    }
    server {
        listen 127.0.0.1:$ngxp_port;
        location / { proxy_pass http://up; proxy_http_version 1.1;
                     proxy_set_header Connection ""; }
    }
EOF
taskset -c "$SERVER_CPU" "$NGINX" -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" \
    -e "$tmp/nginx/logs/error.log" &
ngx_pid=$!

# Waits until a completion answers 200 on URL, up to 15 s.
wait_ok() {
    for _ in $(seq 1 150); do
        if curl -sf --cacert "$tmp/ca.pem" -o /dev/null -H 'Content-Type: application/json' \
            -d '{"model":"m","prompt":"hi","max_tokens":1}' "$1/v1/completions"; then
            return 0
        fi
        sleep 0.1
    done
    bench_fail "$1 did not answer a completion"
}
wait_ok "https://localhost:$ig_port"
wait_ok "http://127.0.0.1:$igp_port"
wait_ok "https://localhost:$ngx_port"
wait_ok "http://127.0.0.1:$ngxp_port"

cat >"$tmp/post.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"hi","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
EOF

# wrk on URL: prints requests/s.
rps() {
    if [ "$WARMUP" -gt 0 ]; then
        taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d"${WARMUP}s" -s "$tmp/post.lua" \
            "$1/v1/completions" >/dev/null
    fi
    local out
    out=$(taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" -s "$tmp/post.lua" \
        "$1/v1/completions")
    echo "$out" >>"$tmp/wrk.log"
    if echo "$out" | grep -q "Non-2xx\|Socket errors"; then
        echo "tls: wrk reported errors on $1:" >&2
        echo "$out" >&2
    fi
    echo "$out" | sed -n 's/^Requests\/sec:[[:space:]]*\([0-9.]*\).*/\1/p'
}

# openssl s_time -new against PORT: prints full handshakes/s.
handshakes() {
    local out
    out=$(taskset -c "$CLIENT_CPU" openssl s_time -connect "127.0.0.1:$1" -new \
        -time "$DURATION" -CAfile "$tmp/ca.pem" 2>&1)
    echo "$out" >>"$tmp/s_time.log"
    echo "$out" | sed -n 's/^\([0-9]*\) connections in \([0-9.]*\)s.*/\1 \2/p' | head -1 |
        awk '{ if ($2 > 0) printf "%.1f\n", $1 / $2; else print 0 }'
}

echo "tls: servers on cpu $SERVER_CPU, clients on cpu $CLIENT_CPU, ${DURATION}s runs," \
    "$CONNECTIONS wrk connections"
ig_hs=$(handshakes "$ig_port")
ngx_hs=$(handshakes "$ngx_port")
echo "  handshakes/s: infergate $ig_hs, nginx $ngx_hs"
ig_tls=$(rps "https://localhost:$ig_port")
ig_plain=$(rps "http://127.0.0.1:$igp_port")
ngx_tls=$(rps "https://localhost:$ngx_port")
ngx_plain=$(rps "http://127.0.0.1:$ngxp_port")
echo "  proxied req/s: infergate https $ig_tls, http $ig_plain; nginx https $ngx_tls, http $ngx_plain"

"$PY" - "$RESULTS" <<EOF
import sys
import benchlib
ig_hs, ngx_hs = float("$ig_hs" or 0), float("$ngx_hs" or 0)
ig_tls, ig_plain = float("$ig_tls" or 0), float("$ig_plain" or 0)
ngx_tls, ngx_plain = float("$ngx_tls" or 0), float("$ngx_plain" or 0)
def ratio(a, b):
    return round(a / b, 3) if b > 0 else None
res = benchlib.result(
    "tls",
    {"duration_s": $DURATION, "warmup_s": $WARMUP, "connections": $CONNECTIONS,
     "server_cpu": $SERVER_CPU, "client_cpu": $CLIENT_CPU, "cpus": $ncpu,
     "certificate": "P-256 ECDSA", "request": "POST /v1/completions, 1 token"},
    handshakes_per_s={"infergate": ig_hs, "nginx": ngx_hs},
    proxied_requests_per_s={"infergate_https": ig_tls, "infergate_http": ig_plain,
                            "nginx_https": ngx_tls, "nginx_http": ngx_plain},
    ratio={
        "handshakes_infergate_vs_nginx": ratio(ig_hs, ngx_hs),
        "infergate_tls_vs_plain": ratio(ig_tls, ig_plain),
        "nginx_tls_vs_plain": ratio(ngx_tls, ngx_plain),
        "tls_infergate_vs_nginx": ratio(ig_tls, ngx_tls),
        "plain_infergate_vs_nginx": ratio(ig_plain, ngx_plain),
    })
benchlib.write(sys.argv[1], res)
r = res["ratio"]
print(f"  ratios: handshakes infergate/nginx {r['handshakes_infergate_vs_nginx']}; "
      f"TLS/plain infergate {r['infergate_tls_vs_plain']}, nginx {r['nginx_tls_vs_plain']}; "
      f"infergate/nginx over TLS {r['tls_infergate_vs_nginx']}, plain {r['plain_infergate_vs_nginx']}")
print(f"  wrote {sys.argv[1]}")
EOF
