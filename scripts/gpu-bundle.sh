#!/usr/bin/env bash
# Builds what bench/gpu-check.sh --prebuilt runs on a lent GPU machine, here,
# where the build dependencies are: the machine has the CUDA driver and
# runtime but no libuv, jansson, utf8proc, pcre2, c-ares, cmocka, llhttp sources,
# CMake or package registry.
#
#   scripts/gpu-bundle.sh [DIR]        (default: gpu-bundle/, ignored by git)
#
# Release, CUDA for sm_90 (H100/H200) only, no -march=native (the lent
# machine's CPU is not this one), no OpenBLAS. The binaries are stripped and
# copied to DIR/bin, with the CUDA backend module beside them
# (libinfergate_cuda.so; docs/gpu.md, "The CUDA module"), and the shared
# libraries they need that a bare CUDA
# image lacks in DIR/lib (libuv, jansson, utf8proc, pcre2, c-ares, cmocka, OpenSSL,
# and libcudart of the toolkit they were built with); cuBLAS (570 MB) is
# the machine's own. DIR/MANIFEST says what was built from which commit.
# Fails if DIR is not under 60 MiB (what a lent machine's run takes along).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/gpu-bundle}
BUILD=${BUILD:-$ROOT/build-gpu-bundle}
JOBS=${JOBS:-2}
ARCHS=${ARCHS:-90}
LIMIT_MIB=60
BINS="infergate gpubench test_cuda_kernels test_cuda_model test_cuda_device test_cuda_devices"
# The libraries a bare CUDA image lacks (matched against ldd's names).
LIBS='libuv|libjansson|libutf8proc|libpcre2|libcares|libcmocka|libssl|libcrypto|libcudart'

command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
    { echo "gpu-bundle: nvcc not found"; exit 1; }
export PATH=$PATH:/usr/local/cuda/bin

echo "== configure $BUILD (Release, CUDA sm_$ARCHS, no -march=native, no OpenBLAS)"
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DIG_CUDA=ON -DIG_CUDA_ARCHS="$ARCHS" \
      -DIG_NATIVE=OFF -DIG_OPENBLAS=OFF -DIG_CUDA_EMU=OFF > "$BUILD/configure.log" 2>&1 ||
    { cat "$BUILD/configure.log"; exit 1; }
grep -q "CUDA=ON" "$BUILD/configure.log" || { echo "gpu-bundle: CUDA not enabled"; exit 1; }
grep -q "OpenBLAS=OFF" "$BUILD/configure.log" || { echo "gpu-bundle: OpenBLAS still on"; exit 1; }

echo "== build: $BINS"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j "$JOBS" --target $BINS infergate_cuda

rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/lib"
for b in $BINS; do
    cp "$BUILD/$b" "$DIR/bin/"
    strip --strip-unneeded "$DIR/bin/$b"
done
cp "$BUILD/libinfergate_cuda.so" "$DIR/bin/"
strip --strip-unneeded "$DIR/bin/libinfergate_cuda.so"
# shellcheck disable=SC2086
for b in $BINS libinfergate_cuda.so; do ldd "$BUILD/$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u | grep -E "^($LIBS)" | while read -r name path; do
    cp -L "$path" "$DIR/lib/$name"
    strip --strip-unneeded "$DIR/lib/$name" 2>/dev/null || true
done

{
    echo "built:   $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "commit:  $(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with local changes)')"
    echo "cuda:    $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_$ARCHS"
    echo "flags:   Release, IG_NATIVE=OFF, IG_OPENBLAS=OFF"
    echo "bin:     $BINS"
    echo "lib:     $(cd "$DIR/lib" && echo *)"
    echo "needs:   the NVIDIA driver for CUDA $(nvcc --version | sed -n 's/.*release \([0-9]*\).*/\1/p') and libcublas/libcublasLt of that major version"
    echo "run:     bench/gpu-check.sh --prebuilt $(realpath --relative-to="$ROOT" "$DIR" 2>/dev/null || echo "$DIR")"
} > "$DIR/MANIFEST"

size=$(du -sm "$DIR" | cut -f1)
cat "$DIR/MANIFEST"
echo "gpu-bundle: $DIR is $size MiB ($(du -sh "$DIR" | cut -f1))"
if [ "$size" -ge "$LIMIT_MIB" ]; then
    echo "gpu-bundle: over the $LIMIT_MIB MiB limit" >&2
    exit 1
fi
