#!/usr/bin/env bash
# The GPU check of the CUDA backend, in one run of under 5 minutes on an
# H100/H200:
#   1. configure and build (Release, CUDA on, sm_90 only);
#   2. run the CUDA tests, which must RUN here (a skip on a GPU machine fails);
#   3. write the `1b` preset (Llama-3.2-1B's shape, BF16) with mkmodel;
#   4. gpubench: decode tokens/s at batch 1, 8, 64, 256 and prefill tokens/s
#      through ig_engine_forward, memory-bandwidth utilisation and the
#      batching gain over batch 1 measured in the same run;
#   5. bench/results/gpu-check.json.
# Targets (issue 7): batch-1 decode >= 70% of peak bandwidth; batch-64
# aggregate >= 20x batch 1. Missing a target is reported, not an error.
#
# Environment: BUILD (build-gpu), DEVICE (cuda:0), JOBS (nproc), MODEL_DIR
# (BUILD/models/1b-bf16), ARCHS (90), STEPS (32), CTX (128).
# DRY_RUN=1 rehearses the script on a machine without a GPU: skipped tests
# are accepted, and gpubench runs the tiny preset on the CPU.
#
# bench/gpu-check.sh --prebuilt DIR runs a bundle of scripts/gpu-bundle.sh
# instead, on a machine without the build dependencies (below).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)

# ---------------------------------------------------------------------------
# --prebuilt DIR: the bundle of scripts/gpu-bundle.sh on a lent GPU machine,
# without CMake or a compiler. Everything goes to $OUT (what comes back from
# the machine), or bench/results/gpu-check-prebuilt/ when OUT is unset:
#   ldd.txt        the binaries' libraries (a missing one stops the run here);
#   devices.txt    `infergate devices`: the first GPU call; without a usable
#                  GPU the script stops here, says "no device" and exits 0;
#   test_*.log     the CUDA tests (a skip on a GPU machine is a failure);
#   gpubench-ctx*.json/.log  the 1b preset (BF16) at batch 1/8/64/256, ctx 128
#                  and batch 1/8/64 at ctx 8192 (256 x 8192 would not fit), with
#                  the time per operation at batch 1 and 64;
#   greedy-small.json/.log  64 greedy tokens of the small preset against the
#                  CPU backend;
#   sanitizer-*.log  compute-sanitizer memcheck and racecheck on
#                  test_cuda_kernels (last: the slowest, and what the budget
#                  leaves them);
#   summary.txt    one line per stage with its time and status.
# Each stage has a timeout, and all together stop at BUDGET_S (470 s): one
# run fits in 8 minutes. PRESET, STEPS, RUNS, PREFILL_LEN, OP_TIMES, GREEDY_PRESET and
# GREEDY_TOKENS shrink the run for a rehearsal over the CUDA emulation
# (docs/gpu.md).
# ---------------------------------------------------------------------------
prebuilt() {
    local dir out t0 fail=0
    dir=$(cd "$1" && pwd)
    out=${OUT:-$ROOT/bench/results/gpu-check-prebuilt}
    mkdir -p "$out"
    t0=$(date +%s)
    export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export IG_BIN_DIR="$dir/bin" IG_SOURCE_DIR="$ROOT"
    export PATH="$PATH:/usr/local/cuda/bin"
    note() { printf '[%4ss] %s\n' "$(($(date +%s) - t0))" "$*" | tee -a "$out/summary.txt"; }
    # A stage's timeout: its own limit, or what is left of the run's
    # ${BUDGET_S:-470} s when that is less (at least 5 s).
    tmo() {
        local left=$((${BUDGET_S:-470} - ($(date +%s) - t0)))
        [ "$left" -lt 5 ] && left=5
        echo $(($1 < left ? $1 : left))
    }
    : > "$out/summary.txt"
    [ -f "$dir/MANIFEST" ] && cp "$dir/MANIFEST" "$out/"

    note "ldd"
    : > "$out/ldd.txt"
    for b in "$dir"/bin/*; do
        { echo "== $b"; ldd "$b"; } >> "$out/ldd.txt" 2>&1
    done
    if grep -q "not found" "$out/ldd.txt"; then
        note "FAILED: libraries not found:"
        grep "not found" "$out/ldd.txt" | sort -u | tee -a "$out/summary.txt"
        return 1
    fi

    note "devices"
    timeout "$(tmo 60)" "$dir/bin/infergate" devices > "$out/devices.txt" 2>&1 || true
    cat "$out/devices.txt"
    if grep -q "no usable GPU" "$out/devices.txt" ||
        ! timeout "$(tmo 60)" "$dir/bin/infergate" devices --json 2>/dev/null | grep -q '"usable_gpu": *true'; then
        note "no device: $(grep -m1 'no usable GPU' "$out/devices.txt" || echo 'no usable GPU found')"
        note "stopped before the GPU stages (nothing else to run here)"
        return 0
    fi

    note "CUDA tests"
    for t in test_cuda_kernels test_cuda_model test_cuda_device test_cuda_devices; do
        if ! (cd "$out" && timeout "$(tmo 90)" "$dir/bin/$t") > "$out/$t.log" 2>&1; then
            if grep -q "^# SKIP" "$out/$t.log" && [ "$t" = test_cuda_device ]; then
                note "skipped: $t (its cases need the emulation)"
                continue
            fi
            note "FAILED: $t"
            fail=1
        elif grep -q "no usable GPU" "$out/$t.log"; then
            note "SKIPPED on a GPU machine: $t"
            fail=1
        else
            note "passed: $t ($(grep -c '^\[       OK \]' "$out/$t.log") tests)"
        fi
    done

    local model preset=${PRESET:-1b} steps=${STEPS:-32}
    model=$(mktemp -d)/$preset-bf16
    note "mkmodel $preset bf16"
    if ! timeout "$(tmo 120)" "$dir/bin/infergate" mkmodel --preset "$preset" --dtype bf16 \
        --out "$model" > "$out/mkmodel.log" 2>&1; then
        note "FAILED: mkmodel"
        return 1
    fi
    # RUNS: "CTX:BATCHES ..." (a rehearsal over the emulation sets smaller ones).
    for run in ${RUNS:-128:1,8,64,256 8192:1,8,64}; do
        set -- "${run%%:*}" "${run#*:}"
        note "gpubench ctx $1 batches $2"
        if ! timeout "$(tmo 150)" "$dir/bin/gpubench" --model "$model" --device cuda:0 --batches "$2" \
            --steps "$steps" --ctx "$1" --prefill-seqs 4 --prefill-len "${PREFILL_LEN:-512}" \
            --op-times "${OP_TIMES:-1,64}" --json "$out/gpubench-ctx$1.json" > "$out/gpubench-ctx$1.log" 2>&1; then
            note "FAILED or timed out: gpubench ctx $1"
            fail=1
        fi
        grep -E "MET|MISSED|tokens/s|^ +[0-9]" "$out/gpubench-ctx$1.log" | tee -a "$out/summary.txt" || true
    done
    note "greedy text of the small preset (BF16) against the CPU backend"
    if timeout "$(tmo 120)" "$dir/bin/infergate" mkmodel --preset "${GREEDY_PRESET:-small}" \
        --dtype bf16 --out "$model-small" > "$out/mkmodel-small.log" 2>&1 &&
        timeout "$(tmo 120)" "$dir/bin/gpubench" --model "$model-small" --device cuda:0 --batches 1 \
            --steps 2 --ctx 16 --prefill-seqs 0 --greedy-check "${GREEDY_TOKENS:-64}" \
            --json "$out/greedy-small.json" > "$out/greedy-small.log" 2>&1; then
        grep -E "^greedy" "$out/greedy-small.log" | tee -a "$out/summary.txt"
    else
        note "FAILED or timed out: greedy check (greedy-small.log)"
        fail=1
    fi
    if command -v compute-sanitizer >/dev/null; then
        for tool in memcheck racecheck; do
            note "compute-sanitizer --tool $tool test_cuda_kernels"
            if ! timeout "$(tmo 150)" compute-sanitizer --tool "$tool" --error-exitcode 3 \
                "$dir/bin/test_cuda_kernels" > "$out/sanitizer-$tool.log" 2>&1; then
                note "FAILED or timed out: $tool ($(grep -m1 'ERROR SUMMARY' "$out/sanitizer-$tool.log" || echo 'no summary'))"
                fail=1
            else
                note "clean: $tool ($(grep -m1 'ERROR SUMMARY' "$out/sanitizer-$tool.log"))"
            fi
        done
    else
        note "compute-sanitizer not found: sanitizer stages skipped"
        fail=1
    fi

    rm -rf "$(dirname "$model")"
    note "done: results in $out"
    return $fail
}

if [ "${1:-}" = "--prebuilt" ]; then
    [ $# -ge 2 ] && [ -d "$2" ] || { echo "usage: bench/gpu-check.sh --prebuilt DIR"; exit 2; }
    prebuilt "$2"
    exit $?
fi

BUILD=${BUILD:-$ROOT/build-gpu}
DEVICE=${DEVICE:-cuda:0}
JOBS=${JOBS:-$(nproc)}
ARCHS=${ARCHS:-90}
STEPS=${STEPS:-32}
CTX=${CTX:-128}
DRY_RUN=${DRY_RUN:-0}
RESULTS=$ROOT/bench/results
OUT=$RESULTS/gpu-check.json
PRESET=1b
BATCHES=1,8,64,256
PREFILL="--prefill-seqs 4 --prefill-len 512"
if [ "$DRY_RUN" = 1 ]; then
    DEVICE=cpu PRESET=tiny BATCHES=1,8 STEPS=4 CTX=16 PREFILL="--prefill-seqs 2 --prefill-len 32"
    OUT=$RESULTS/gpu-check-dry.json
fi
MODEL_DIR=${MODEL_DIR:-$BUILD/models/$PRESET-bf16}
T0=$(date +%s)

stage() { printf '\n== [%3ss] %s\n' "$(($(date +%s) - T0))" "$*"; }

stage "configure and build (Release, CUDA, sm_${ARCHS})"
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DIG_CUDA=ON \
      -DIG_CUDA_ARCHS="$ARCHS" > "$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; exit 1; }
# Everything (the tests exist only where cmocka is installed).
timeout 240 cmake --build "$BUILD" -j "$JOBS" 2>&1 | tail -3

stage "devices"
"$BUILD/infergate" devices

stage "CUDA tests"
fail=0
for t in test_cuda_kernels test_cuda_model test_cuda_gpubench test_cuda_devices; do
    log="$BUILD/$t.log"
    if [ ! -x "$BUILD/$t" ]; then
        echo "NOT BUILT: $t (is cmocka installed?)"; fail=1
    elif ! (cd "$BUILD" && IG_BIN_DIR="$BUILD" IG_SOURCE_DIR="$ROOT" timeout 120 "./$t") > "$log" 2>&1; then
        echo "FAILED: $t"; cat "$log"; fail=1
    elif grep -q "no usable GPU" "$log" && [ "$DRY_RUN" != 1 ]; then
        echo "SKIPPED on a GPU machine: $t"; grep -m1 "no usable GPU" "$log"; fail=1
    else
        echo "passed: $t ($(grep -c '^\[       OK \]' "$log") tests)"
    fi
done
# A failed test does not stop the benchmark (its figures are still worth
# having from a scarce GPU session); the script's status reports it at the end.

stage "model: $PRESET preset, bf16"
if [ ! -f "$MODEL_DIR/config.json" ]; then
    timeout 120 "$BUILD/infergate" mkmodel --preset "$PRESET" --dtype bf16 --out "$MODEL_DIR"
fi
du -sh "$MODEL_DIR"

stage "gpubench on $DEVICE"
mkdir -p "$RESULTS"
timeout 180 "$BUILD/gpubench" --model "$MODEL_DIR" --device "$DEVICE" \
    --batches "$BATCHES" --steps "$STEPS" --ctx "$CTX" $PREFILL --json "$OUT"

stage "done: $OUT"
if [ "$fail" != 0 ]; then
    echo "gpu-check: some CUDA tests failed or did not run (logs in $BUILD/test_cuda_*.log)"
    exit 1
fi
