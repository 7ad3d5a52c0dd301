#!/bin/bash
# The engine's batching gain on the CPU: aggregate decode tokens/s of the
# `small` preset (stories15M's shape, f32) at 1, 4, 16 and 64 concurrent
# sequences, with the ratio to batch 1 measured in the same run, and prefill
# tokens/s (build/engine-bench; docs/engine.md explains the figures). Writes
# bench/results/engine-batching.json and .png. Target of the project: batch 64 >= 8x
# batch 1.
#
# usage: bench/engine-batching.sh [BUILD_DIR]        (default: build)
# environment:
#   THREADS=2        CPU threads of the backend
#   ROUNDS=3         rounds over all batch sizes (each keeps its best)
#   STEPS=32         timed decode steps per batch size and round
#   RESULTS=bench/results/engine-batching.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init engine-batching "$@"
bench_env THREADS=2 ROUNDS=3 STEPS=32
check_bounds "$ROUNDS <= 20 and $STEPS <= 1000" "ROUNDS <= 20 and STEPS <= 1000"
need_built infergate engine-bench
"$build/infergate" mkmodel --preset small --out "$tmp/small" --seed 1 >/dev/null
mkdir -p "$(dirname "$RESULTS")"
"$build/engine-bench" --model "$tmp/small" --threads "$THREADS" --rounds "$ROUNDS" \
    --steps "$STEPS" --out "$RESULTS"
bench_plot
