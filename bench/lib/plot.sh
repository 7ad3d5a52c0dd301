#!/bin/bash
# Turns a benchmark results JSON into a PNG with gnuplot.
#
# usage: bench/lib/plot.sh RESULTS.json [OUT.png]     (default: RESULTS.png)
#
# Two shapes of JSON are understood:
#  - a scenario's results with a "plot" object:
#      {"plot": {"title": "...", "xlabel": "...", "ylabel": "...",
#                "x": [x1, x2, ...],
#                "series": {"name": [y1, y2, ...], ...}}}
#    each series is drawn as a line with points against x;
#  - an igbench --json report (has "latency_ms"): the p50/p90/p99/p99.9/max
#    of e2e, ttft, itl and tpot as grouped bars (log scale, ms).
# Needs gnuplot (Debian gnuplot-nox) and python3.
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = "--help" ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    [ $# -ge 1 ] && exit 0 || exit 2
fi
in=$1
out=${2:-${in%.json}.png}
if ! command -v gnuplot >/dev/null 2>&1; then
    echo "plot: gnuplot not found (apt-get install gnuplot-nox)" >&2
    exit 2
fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
tmp=$(mktemp -d /tmp/ig-plot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# python writes the data file and the gnuplot script; gnuplot draws.
"$PY" - "$in" "$out" "$tmp" <<'PYEOF'
import json, sys, os
src, out, tmp = sys.argv[1:4]
with open(src) as f:
    r = json.load(f)
dat = os.path.join(tmp, "data.dat")
gp = os.path.join(tmp, "plot.gp")

def q(s):
    return '"' + str(s).replace('"', "'") + '"'

lines = ["set terminal png size 900,560 noenhanced",
         "set output " + q(out), "set grid", "set key top left"]
if "plot" in r:
    p = r["plot"]
    names = list(p["series"].keys())
    with open(dat, "w") as f:
        for i, x in enumerate(p["x"]):
            f.write(" ".join([str(x)] + [str(p["series"][n][i]) for n in names]) + "\n")
    lines += ["set title " + q(p.get("title", os.path.basename(src))),
              "set xlabel " + q(p.get("xlabel", "")), "set ylabel " + q(p.get("ylabel", ""))]
    plots = ["%s using 1:%d with linespoints lw 2 pt 7 title %s" % (q(dat), i + 2, q(n))
             for i, n in enumerate(names)]
    lines.append("plot " + ", ".join(plots))
elif "latency_ms" in r:
    lat = r["latency_ms"]
    metrics = [m for m in ("e2e", "ttft", "itl", "tpot") if lat.get(m, {}).get("count", 0) > 0]
    if not metrics:
        sys.exit("plot: %s has no successful requests to plot" % src)
    qs = ["p50", "p90", "p99", "p99.9", "max"]
    with open(dat, "w") as f:
        f.write("metric " + " ".join(qs) + "\n")
        for m in metrics:
            f.write(m + " " + " ".join(str(max(lat[m][k], 1e-3)) for k in qs) + "\n")
    par = r.get("params", {})
    title = "igbench %s loop %s %s" % (par.get("mode", ""), par.get("target", ""), par.get("path", ""))
    lines += ["set title " + q(title), "set ylabel 'latency (ms)'", "set logscale y",
              "set style data histograms", "set style histogram clustered gap 1",
              "set style fill solid 0.8 border -1", "set key autotitle columnhead"]
    lines.append("plot " + ", ".join("%s using %d:xtic(1)" % (q(dat), i + 2) for i in range(len(qs))))
else:
    sys.exit("plot: %s has neither a \"plot\" object nor igbench's \"latency_ms\"" % src)
with open(gp, "w") as f:
    f.write("\n".join(lines) + "\n")
PYEOF
gnuplot "$tmp/plot.gp"
echo "plot: wrote $out"
