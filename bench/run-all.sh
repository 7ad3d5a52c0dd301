#!/bin/bash
# Runs every benchmark scenario (bench/*.sh except this one) with the build
# directory as $1, then prints one line per scenario: its status and the JSON
# results it wrote. `make bench` calls this.
#
# usage: bench/run-all.sh [BUILD_DIR]     (default: build)
# ONLY=name1,name2 runs only those scenarios (file names without .sh).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
mkdir -p "$here/results"

names=()
statuses=()
for script in "$here"/*.sh; do
    name=$(basename "$script" .sh)
    [ "$name" = "run-all" ] && continue
    if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then
        continue
    fi
    echo "=== $name"
    start=$(date +%s)
    bash "$script" "$build"
    rc=$?
    names+=("$name")
    statuses+=("$rc $(($(date +%s) - start))s")
    echo
done

echo "=== summary"
failed=0
for i in "${!names[@]}"; do
    read -r rc secs <<<"${statuses[$i]}"
    result="$here/results/${names[$i]}.json"
    [ -f "$result" ] || result="(no results file)"
    if [ "$rc" -eq 0 ]; then
        printf '  %-28s ok     %6s  %s\n' "${names[$i]}" "$secs" "$result"
    else
        printf '  %-28s FAILED %6s  exit %s\n' "${names[$i]}" "$secs" "$rc"
        failed=1
    fi
done
[ "${#names[@]}" -eq 0 ] && echo "  no scenarios found"
exit $failed
