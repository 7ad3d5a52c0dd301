#!/bin/sh
# scripts/long-functions.sh [-n LINES] [PATH...]: every C function longer
# than LINES (default 80) in the .c files under each PATH (a folder or a
# file; default gateway/), one line each: "LENGTH FILE:LINE NAME", longest
# first. The length counts from the line that names the function to its
# closing brace, both included, as universal-ctags reports them (--fields=+e).
# Exits 1 when one is found, 0 when none, 2 on a usage error or without ctags.
set -eu
max=80
if [ "${1:-}" = "-n" ]; then
    max="${2:?usage: scripts/long-functions.sh [-n LINES] [PATH...]}"
    shift 2
fi
case "$max" in '' | *[!0-9]*) echo "long-functions: -n takes a number" >&2; exit 2 ;; esac
command -v ctags >/dev/null 2>&1 || { echo "long-functions: ctags not found (universal-ctags)" >&2; exit 2; }
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- gateway
long=$(find "$@" -name '*.c' -type f | sort |
    xargs ctags -x --_xformat='%N %F %n %{end}' --c-kinds=f --fields=+ne --language-force=C |
    awk -v max="$max" '$4 != "" && $4 - $3 + 1 > max { printf "%d %s:%d %s\n", $4 - $3 + 1, $2, $3, $1 }' |
    sort -rn)
[ -z "$long" ] && exit 0
echo "$long"
exit 1
