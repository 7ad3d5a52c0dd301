# Shell helpers shared by the benchmark scenarios (sourced, not run).

# Prints a free loopback TCP port (bound and released; a small race is fine
# for a benchmark).
free_port() {
    "${PY:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (up to 10 s) for "... listening on HOST:PORT" in the log file $1 and
# prints PORT.
port_of() {
    for _ in $(seq 1 100); do
        if grep -q "listening on" "$1" 2>/dev/null; then
            sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$1" | head -1
            return 0
        fi
        sleep 0.1
    done
    echo "$(basename "$0" .sh): $1: no listening line" >&2
    return 1
}
