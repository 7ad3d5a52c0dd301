#!/bin/bash
# The panel GEMM on Q8_0 and Q4_0 weights: gemmq.c (both formats in one
# kernel, specialized on the format) against gemmq8.c and gemmq4.c as they
# were at REV, the last revision with the split files, compiled with the same
# flags into one binary (bench/gemmq-vs-split.c). Per format, instruction
# set (AVX2, AVX-512 where the CPU has it) and batch (1, 64): one thread, all
# N columns, the best of ROUNDS rounds alternating old and new, by the
# thread's CPU time; prints new / old and checks that packing and outputs
# have the same bits. Writes bench/results/gemmq-vs-split.json.
#
# usage: bench/gemmq-vs-split.sh [BUILD_DIR]     (default: build, with igcore built)
# environment:
#   REV=a4507e6   the revision holding kernels/cpu/gemmq8.c and gemmq4.c
#   N=2048 K=2048 the weight's shape (1b's square projections)
#   ROUNDS=9      rounds per case
#   RUN_PREFIX    a command to run the driver under (taskset -c 1, valgrind ...)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init gemmq-vs-split "$@"
bench_env REV=a4507e6 N=2048 K=2048 ROUNDS=9
[ -f "$build/libigcore.a" ] || bench_fail "$build/libigcore.a not built (cmake --build $build --target igcore)"

mkdir -p "$tmp/old"
for f in gemmq8.c gemmq4.c cpu_internal.h; do
    git -C "$root" show "$REV:kernels/cpu/$f" >"$tmp/old/$f" ||
        bench_fail "$REV has no kernels/cpu/$f"
done
flags=(-O3 -march=native -std=c11 -D_GNU_SOURCE -I"$root/include" -I"$root/gateway")
rename=(-Dig__q8_quantize_rows_sums=old_q8_quantize_rows_sums
    -Dig__q8_quantize_rows=old_q8_quantize_rows)
for f in gemmq8 gemmq4; do
    cc "${flags[@]}" "${rename[@]}" -c "$tmp/old/$f.c" -o "$tmp/$f.o"
done
cc "${flags[@]}" "$here/gemmq-vs-split.c" "$tmp/gemmq8.o" "$tmp/gemmq4.o" "$build/libigcore.a" \
    "$build/libllhttp.a" $(pkg-config --libs libuv jansson libutf8proc openssl) \
    $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -lm -lpthread -ldl \
    -o "$tmp/gemmq-vs-split"

echo "gemmq-vs-split: N=$N K=$K, $ROUNDS rounds, old = $REV's gemmq8.c/gemmq4.c; $(uptime | sed 's/.*load/load/')"
${RUN_PREFIX:-} "$tmp/gemmq-vs-split" "$N" "$K" "$ROUNDS" "$RESULTS"
echo "wrote $RESULTS"
