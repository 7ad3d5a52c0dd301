# Shell helpers shared by the benchmark scenarios (sourced, not run).
#
# A scenario starts with
#     here=$(cd "$(dirname "$0")" && pwd)
#     . "$here/lib/common.sh"
#     bench_init NAME "$@"
#     bench_env PARAM=DEFAULT...
# and then names the tools it needs (need_built) and the background processes
# the exit trap must stop (kill_on_exit).

# Sets bench_name, root (the checkout), build (BUILD_DIR, $1, default build,
# made absolute), PY (an interpreter for the inline Python: $PY if set, else
# /usr/bin/python3, which starts faster than a pyenv shim, else python3),
# RESULTS (the JSON the scenario writes: $RESULTS if set, else
# bench/results/NAME.json) and tmp (a fresh directory under /tmp), puts
# bench/lib on PYTHONPATH (the inline Python imports benchlib) and installs
# the exit trap that stops the processes named with kill_on_exit and removes
# tmp.
bench_init() {
    bench_name=$1
    shift
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    build=${1:-build}
    case "$build" in /*) ;; *) build="$root/$build" ;; esac
    if [ -z "${PY:-}" ]; then
        PY=/usr/bin/python3
        [ -x "$PY" ] || PY=python3
    fi
    RESULTS=${RESULTS:-$root/bench/results/$bench_name.json}
    tmp=$(mktemp -d "/tmp/ig-$bench_name.XXXXXX")
    export PYTHONPATH="$root/bench/lib${PYTHONPATH:+:$PYTHONPATH}"
    bench_kill_vars=()
    trap bench_cleanup EXIT INT TERM
}

# bench_env NAME=DEFAULT...: the scenario's parameters. Each NAME keeps its
# value from the environment when that is set and not empty, else takes
# DEFAULT (NAME=${NAME:-DEFAULT}, once for all of them).
bench_env() {
    local kv name
    for kv in "$@"; do
        name=${kv%%=*}
        [ -n "${!name:-}" ] || printf -v "$name" '%s' "${kv#*=}"
    done
}

# kill_on_exit VAR...: at exit, the pids held in these variables (a pid, an
# empty string, or an array of pids) are killed and reaped, in this order.
# Each variable that is not an array starts empty here. The variables are
# read at exit, so a scenario may restart a process and clear the variable
# once it stopped it itself.
kill_on_exit() {
    local v
    for v in "$@"; do
        [[ "$(declare -p "$v" 2>/dev/null)" == "declare -a"* ]] || printf -v "$v" '%s' ""
    done
    bench_kill_vars+=("$@")
}

bench_cleanup() {
    local v p
    for v in "${bench_kill_vars[@]}"; do
        local -n pids_ref=$v
        for p in ${pids_ref[@]+"${pids_ref[@]}"}; do
            [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true
        done
        unset -n pids_ref
    done
    rm -rf "$tmp"
}

# bench_fail MESSAGE: prints "NAME: MESSAGE" to stderr and exits 2 (a usage or
# setup error, not a failed measurement).
bench_fail() {
    echo "$bench_name: $*" >&2
    exit 2
}

# need_built TOOL...: each must be an executable in the build directory.
need_built() {
    local t
    for t in "$@"; do
        [ -x "$build/$t" ] || bench_fail "$build/$t not built"
    done
}

# check_bounds PYTHON_EXPR MESSAGE...: a run must be bounded (a typo must not
# start an hour-long benchmark); fails with "MESSAGE, please" unless the
# Python expression (over the scenario's numbers) is true.
check_bounds() {
    local expr=$1
    shift
    "$PY" -c "import sys; sys.exit(0 if ($expr) else 1)" 2>/dev/null || bench_fail "$*, please"
}

# need_one_of KIND "ALLOWED..." VALUE...: each VALUE must be one of ALLOWED.
need_one_of() {
    local kind=$1 allowed=" $2 " v
    shift 2
    for v in "$@"; do
        [[ "$allowed" == *" $v "* ]] || bench_fail "unknown $kind '$v'"
    done
}

# bench_plot: draws the "plot" block of $RESULTS into RESULTS.png with
# lib/plot.sh (its status is returned) when gnuplot is installed; else says
# there is no PNG.
bench_plot() {
    if command -v gnuplot >/dev/null 2>&1; then
        "$root/bench/lib/plot.sh" "$RESULTS" "${RESULTS%.json}.png"
    else
        echo "$bench_name: gnuplot not found, no PNG (apt-get install gnuplot-nox)"
    fi
}

# http_get PORT PATH: prints the body of GET http://127.0.0.1:PORT/PATH
# (empty on failure, 2 s at most).
http_get() {
    "$PY" - "$1" "$2" <<'PYEOF' 2>/dev/null || true
import sys, urllib.request
try:
    print(urllib.request.urlopen("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]),
                                 timeout=2).read().decode(), end="")
except Exception:
    pass
PYEOF
}

# Prints a free loopback TCP port (bound and released; a small race is fine
# for a benchmark).
free_port() {
    "${PY:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (up to 10 s) for "... listening on HOST:PORT" in the log file $1 and
# prints PORT (a line read while it is being written, with no digits yet,
# is read again). The file must not exist before the process is started: the
# shell opens a redirection in the child, after the fork, so a file left by
# an earlier process can still be read here and give that process's port
# (remove it first).
port_of() {
    local p
    for _ in $(seq 1 100); do
        p=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$1" 2>/dev/null | head -1)
        case "$p" in '' | *[!0-9]*) sleep 0.1 ;; *) echo "$p" && return 0 ;; esac
    done
    echo "$(basename "$0" .sh): $1: no listening line" >&2
    return 1
}

# nginx_conf DIR: writes DIR/nginx.conf for one unprivileged nginx worker in
# the foreground, all its files under DIR, access log off and keep-alive
# connections that last the run; the http {} block's own content (upstream
# and server blocks) comes on stdin. Start it with
#     "$NGINX" -p DIR -c DIR/nginx.conf -e DIR/logs/error.log
nginx_conf() {
    local dir=$1
    mkdir -p "$dir/logs"
    {
        [ "$(id -u)" -eq 0 ] && echo "user nobody nogroup;"
        cat <<NGINX
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    server_tokens off;
    keepalive_requests 100000000;
    keepalive_timeout 75s;
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
NGINX
        cat
        echo "}"
    } >"$dir/nginx.conf"
}
