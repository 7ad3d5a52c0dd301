#!/bin/bash
# faultproxy's added delay against its setting. igbench sends raw GETs
# (closed loop, one at a time) to the test upstream directly -- the baseline,
# measured in the same run -- and through faultproxy with a one-way
# (server->client) delay switched at run time over the control socket. For
# each setting it reports the added p50 latency and its ratio to the setting
# (1.000 is perfect), and writes bench/results/proxy-delay.json and .png.
#
# usage: bench/proxy-delay.sh [BUILD_DIR]        (default: build)
# environment:
#   DELAYS="1 5 10 20 40"   one-way delays to set (ms)
#   REQUESTS=60             requests per measurement
#   REPEATS=3               measurements per setting (the median is kept)
#   RESULTS=bench/results/proxy-delay.json
# Needs: python3; gnuplot for the PNG (skipped with a note when missing).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init proxy-delay "$@"
bench_env DELAYS="1 5 10 20 40" REQUESTS=60 REPEATS=3
check_bounds "$REQUESTS <= 10000 and $REPEATS <= 20" "REQUESTS <= 10000 and REPEATS <= 20"
need_built igbench faultproxy testupstream
kill_on_exit fp_pid up_pid

control() {
    "$PY" - "$tmp/fp.sock" "$1" <<'PYEOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall((sys.argv[2] + "\n").encode())
reply = s.recv(4096).decode()
if not reply.startswith("ok") and not reply.startswith("{"):
    sys.exit("proxy-delay: control: " + reply.strip())
PYEOF
}

# Median p50 (ms) of REPEATS runs against a port; the run JSONs are kept.
measure() {
    local port=$1 tag=$2 vals=()
    for i in $(seq 1 "$REPEATS"); do
        "$build/igbench" --quiet --target "127.0.0.1:$port" --concurrency 1 \
            --requests "$REQUESTS" --raw GET /health --seed "$i" --json "$tmp/$tag-$i.json"
        vals+=("$tmp/$tag-$i.json")
    done
    "$PY" - "${vals[@]}" <<'PYEOF'
import json, sys, statistics
v = []
for p in sys.argv[1:]:
    r = json.load(open(p))
    if r["requests"]["errors"]:
        sys.exit("proxy-delay: errors in " + p + ": " + json.dumps(r["errors"]))
    v.append(r["latency_ms"]["e2e"]["p50"])
print("%.4f" % statistics.median(v))
PYEOF
}

"$build/testupstream" --quiet >"$tmp/up.out" &
up_pid=$!
up_port=$(port_of "$tmp/up.out")
"$build/faultproxy" --quiet --target "127.0.0.1:$up_port" --control "unix:$tmp/fp.sock" \
    >"$tmp/fp.out" &
fp_pid=$!
fp_port=$(port_of "$tmp/fp.out")

echo "proxy-delay: upstream 127.0.0.1:$up_port, faultproxy 127.0.0.1:$fp_port"
direct=$(measure "$up_port" direct)
control "delay 0"
proxy0=$(measure "$fp_port" proxy0)
rows=""
printf '  %-10s %12s %12s %12s %8s\n' "setting" "direct p50" "proxied p50" "added" "ratio"
printf '  %-10s %12s %12s %12s %8s\n' "0 ms" "$direct" "$proxy0" \
    "$("$PY" -c "print('%.4f' % ($proxy0 - $direct))")" "-"
for d in $DELAYS; do
    control "delay s2c $d"
    base=$(measure "$up_port" "direct-$d")
    through=$(measure "$fp_port" "proxy-$d")
    line=$("$PY" -c "
a = $through - $base
print('%.4f %.4f' % (a, a / $d))")
    added=${line% *}
    ratio=${line#* }
    printf '  %-10s %12s %12s %12s %8s\n' "$d ms" "$base" "$through" "$added" "$ratio"
    rows="$rows $d:$base:$through"
done

mkdir -p "$(dirname "$RESULTS")"
"$PY" - "$RESULTS" "$direct" "$proxy0" "$REQUESTS" "$REPEATS" $rows <<'PYEOF'
import json, sys
out, direct, proxy0, requests, repeats = sys.argv[1:6]
rows = []
for item in sys.argv[6:]:
    d, base, through = item.split(":")
    d, base, through = float(d), float(base), float(through)
    rows.append({"setting_ms": d, "direct_p50_ms": base, "proxied_p50_ms": through,
                 "added_ms": through - base, "ratio": (through - base) / d})
res = {
    "scenario": "proxy-delay",
    "what": "faultproxy one-way (s2c) delay: added p50 round trip vs the setting",
    "baseline": {"direct_p50_ms": float(direct), "proxy_no_delay_p50_ms": float(proxy0),
                 "proxy_overhead_ms": float(proxy0) - float(direct)},
    "params": {"requests": int(requests), "repeats": int(repeats),
               "load": "igbench --concurrency 1 --raw GET /health"},
    "rows": rows,
    "worst_abs_error_ms": max(abs(r["added_ms"] - r["setting_ms"]) for r in rows),
    "plot": {"title": "faultproxy: added latency vs setting (one way, s2c)",
             "xlabel": "delay setting (ms)", "ylabel": "added p50 round trip (ms)",
             "x": [r["setting_ms"] for r in rows],
             "series": {"measured": [r["added_ms"] for r in rows],
                        "setting": [r["setting_ms"] for r in rows]}},
}
json.dump(res, open(out, "w"), indent=2)
print("proxy-delay: worst error %.3f ms; wrote %s" % (res["worst_abs_error_ms"], out))
PYEOF
bench_plot
