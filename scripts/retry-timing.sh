#!/bin/sh
# After a failed ctest run in the current build folder: when every failed
# test is labelled "timing" (CMakeLists.txt, IG_TIMING_TESTS), they run once
# more, one at a time, and that run decides; a failed test of any other kind
# fails at once and is never retried (README.md, "CI").
set -eu
failed=Testing/Temporary/LastTestsFailed.log
[ -s "$failed" ] || exit 1
timing=$(ctest -N -L timing | sed -n 's/^ *Test *#[0-9]*: *//p')
for name in $(cut -d: -f2 "$failed"); do
    if ! printf '%s\n' "$timing" | grep -qx "$name"; then
        echo "retry-timing: $name failed and is not a timing test: no retry" >&2
        exit 1
    fi
done
echo "retry-timing: running the failed timing tests once more: $(cut -d: -f2 "$failed" | tr '\n' ' ')"
ctest --output-on-failure --rerun-failed
