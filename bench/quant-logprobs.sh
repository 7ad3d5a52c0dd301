#!/bin/bash
# Prompt log-probabilities of the `1b` preset quantized (Q4_0 written by
# mkmodel, Q4_K_M by llama.cpp's llama-quantize: the files of
# bench/vs-llamacpp.sh) against the same model unquantized, through our
# worker, and the bound docs/engine.md ("Quantized prompt logprobs against
# the unquantized model") derives from the formats' error:
#   - the reference is the BF16 file computed in F32 arithmetic
#     (IG_CPU_BF16_DOT=0: the widening path, x is not rounded to BF16), the
#     closest to an F32 model the 1b files have (its weights are the F32
#     model's rounded once, 2^-9 relative, noise beside 4-bit steps);
#   - each worker scores the same text (echo with logprobs): the log-
#     probability of every prompt token after the first, and the ids must
#     be the same;
#   - each 2-D weight's relative RMS error eps = |W_q - W| / |W| is measured
#     from the files (gguf-py's dequantization, SAMPLE_ROWS rows a tensor,
#     whole blocks), and the bound is SIGMAS x sqrt(2) x rho x sigma_z, with
#     rho the root sum of squares of eps over the GEMMs on the path to a logit
#     (per layer the worst of q/k/v, o, the worst of gate/up, down; then the
#     output matrix), each with the activations' Q8 rounding added, and
#     sigma_z the logits' spread the weights give (rms of the output matrix
#     x rms of the final norm x sqrt(dim)).
# The measured max |dlogprob| is printed against the bound, and the RMS
# against the predicted sqrt(2) rho sigma_z; the script exits 1 when a
# format's max is over its bound. The 1b runs take minutes: a benchmark,
# not a test.
#
# usage: bench/quant-logprobs.sh [BUILD_DIR]            (default: build)
# environment:
#   MODELS=/work/peers/models   1b-bf16.gguf and 1b-FORMAT.gguf (bench/vs-llamacpp.sh makes them)
#   FORMATS="q8_0 q4_0 q4_k_m"   any of these
#   LLAMACPP_SRC=/work/peers/llama.cpp   gguf-py is read from its gguf-py/
#   THREADS=2  SAMPLE_ROWS=32  SIGMAS=5
#   RESULTS=bench/results/quant-logprobs.json
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/common.sh"
bench_init quant-logprobs "$@"
bench_env MODELS=/work/peers/models FORMATS="q8_0 q4_0 q4_k_m" LLAMACPP_SRC=/work/peers/llama.cpp \
    THREADS=2 SAMPLE_ROWS=32 SIGMAS=5
check_bounds "1 <= $THREADS <= 64 and 1 <= $SAMPLE_ROWS <= 4096 and 1 <= $SIGMAS <= 20" \
    "THREADS in 1..64, SAMPLE_ROWS in 1..4096 and SIGMAS in 1..20"
read -r -a formats <<<"$FORMATS"
[ ${#formats[@]} -gt 0 ] || bench_fail "FORMATS is empty"
need_one_of format "q8_0 q4_0 q4_k_m" "${formats[@]}"
need_built infergate
[ -f "$LLAMACPP_SRC/gguf-py/gguf/quants.py" ] || bench_fail "no gguf-py in $LLAMACPP_SRC (set LLAMACPP_SRC)"
for f in bf16 "${formats[@]}"; do
    [ -f "$MODELS/1b-$f.gguf" ] ||
        bench_fail "$MODELS/1b-$f.gguf not found (bench/vs-llamacpp.sh makes it; FORMATS=$f)"
done
mkdir -p "$(dirname "$RESULTS")"

kill_on_exit worker_pid

# A fixed English text: the byte-level vocabulary splits it into ~100 ids.
prompt="The history of the city begins with a small settlement on the river, where \
fishermen and traders met twice a year. Over three centuries it grew into a market town, \
then a port, and by the time the railway arrived it had a cathedral, two bridges, a \
university and more than forty thousand inhabitants."

wait_ready() { # PORT PID: up to 300 s
    for _ in $(seq 1 600); do
        [ -n "$(http_get "$1" /ready)" ] && return 0
        kill -0 "$2" 2>/dev/null || bench_fail "the worker exited before it was ready"
        sleep 0.5
    done
    bench_fail "the worker on port $1 was not ready in 300 s"
}

# score FORMAT: our worker on 1b-FORMAT.gguf scores the prompt into $tmp/FORMAT.json.
score() {
    local port
    port=$(free_port)
    if [ "$1" = bf16 ]; then
        IG_CPU_BF16_DOT=0 "$build/infergate" worker --model "$MODELS/1b-$1.gguf" \
            --device "cpu:$THREADS" --listen "127.0.0.1:$port" --kv-blocks 64 --log-level warn &
    else
        "$build/infergate" worker --model "$MODELS/1b-$1.gguf" --device "cpu:$THREADS" \
            --listen "127.0.0.1:$port" --kv-blocks 64 --log-level warn &
    fi
    worker_pid=$!
    wait_ready "$port" "$worker_pid"
    "$PY" - "$port" "$prompt" >"$tmp/$1.json" <<'EOF'
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=600)
c.request("POST", "/v1/completions",
          json.dumps({"prompt": sys.argv[2], "max_tokens": 1, "temperature": 0, "echo": True,
                      "logprobs": 1}), {"Content-Type": "application/json"})
r = c.getresponse()
body = r.read()
if r.status != 200:
    sys.exit("status %d: %s" % (r.status, body[:300]))
print(body.decode())
EOF
    kill "$worker_pid"
    wait "$worker_pid" 2>/dev/null || true
    worker_pid=
    echo "scored the prompt with 1b-$1.gguf"
}

for f in bf16 "${formats[@]}"; do
    score "$f"
done

"$PY" - "$RESULTS" "$tmp" "$MODELS" "$LLAMACPP_SRC/gguf-py" "$SAMPLE_ROWS" "$SIGMAS" \
    "${formats[@]}" <<'EOF'
import json, math, os, sys, types
out, tmp, models, ggufpy = sys.argv[1:5]
rows, sigmas = int(sys.argv[5]), float(sys.argv[6])
formats = sys.argv[7:]
stub = types.ModuleType("sentencepiece")  # gguf-py imports it for its vocab helpers
stub.SentencePieceProcessor = type("SentencePieceProcessor", (), {})
sys.modules.setdefault("sentencepiece", stub)
sys.path.insert(0, ggufpy)
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

def prompt_logprobs(f):
    j = json.load(open(os.path.join(tmp, f + ".json")))
    n = j["usage"]["prompt_tokens"]
    lp = j["choices"][0]["logprobs"]
    return lp["tokens"][:n], np.array(lp["token_logprobs"][1:n], dtype=np.float64)

ref = GGUFReader(os.path.join(models, "1b-bf16.gguf"))
rt = {t.name: t for t in ref.tensors}
def weights(t, idx):
    return dequantize(np.asarray(t.data[idx]), t.tensor_type).astype(np.float64)
rng = np.random.default_rng(1)
def rows_of(t):
    n = t.data.shape[0]
    return np.sort(rng.choice(n, size=min(rows, n), replace=False))

kv = {f.name: f for f in ref.fields.values()}
def field(name):
    f = kv[name]
    return f.parts[f.data[0]]
arch = bytes(field("general.architecture")).decode()
dim, layers = int(field(arch + ".embedding_length")[0]), int(field(arch + ".block_count")[0])
out_name = "output.weight" if "output.weight" in rt else "token_embd.weight"
ow = weights(rt[out_name], rows_of(rt[out_name]))
norm = dequantize(np.asarray(rt["output_norm.weight"].data), rt["output_norm.weight"].tensor_type)
sigma_z = math.sqrt((ow ** 2).mean()) * math.sqrt((norm.astype(np.float64) ** 2).mean()) * math.sqrt(dim)
# x is rounded per block of 32 to amax / 127 steps (RMS step / sqrt(12)),
# amax taken as 4 x the block's RMS (the crest factor of docs/engine.md).
eps_x = 4 / 127 / math.sqrt(12)

ref_tok, ref_lp = prompt_logprobs("bf16")
res = {"prompt_tokens": len(ref_tok), "sample_rows": rows, "sigmas": sigmas,
       "sigma_z": sigma_z, "eps_activations": eps_x, "formats": {}}
fail = []
print()
print("1b preset, prompt log-probabilities against BF16 weights in F32 arithmetic, %d tokens"
      % (len(ref_tok) - 1))
for f in formats:
    q = GGUFReader(os.path.join(models, "1b-%s.gguf" % f))
    eps, types_ = {}, {}
    for t in q.tensors:
        if len(t.data.shape) != 2 or t.name not in rt or t.name.endswith("norm.weight"):
            continue
        idx = rows_of(t)
        a, b = weights(rt[t.name], idx), weights(t, idx)
        eps[t.name] = math.sqrt(((a - b) ** 2).sum() / (a ** 2).sum())
        types_[t.tensor_type.name] = types_.get(t.tensor_type.name, 0) + 1
    chain = []
    for l in range(layers):
        g = lambda s: eps["blk.%d.%s.weight" % (l, s)]
        chain += [max(g("attn_q"), g("attn_k"), g("attn_v")), g("attn_output"),
                  max(g("ffn_gate"), g("ffn_up")), g("ffn_down")]
    chain.append(eps[out_name])
    rho = math.sqrt(sum(e * e + eps_x * eps_x for e in chain))
    predicted = math.sqrt(2) * rho * sigma_z
    bound = sigmas * predicted
    tok, lp = prompt_logprobs(f)
    if tok != ref_tok:
        sys.exit("%s: the prompt's tokens differ from the reference's" % f)
    d = np.abs(lp - ref_lp)
    worst, rms = float(d.max()), float(math.sqrt((d ** 2).mean()))
    res["formats"][f] = {"max_abs_dlogprob": worst, "rms_dlogprob": rms, "bound": bound,
                         "predicted_rms": predicted, "rho": rho,
                         "eps_mean": float(np.mean(list(eps.values()))),
                         "eps_max": max(eps.values()), "tensor_types": types_,
                         "worst_position": int(d.argmax()) + 1}
    print("  %-7s max |dlogprob| %.4f, bound %.4f (%.0f%% of it); RMS %.4f, predicted %.4f "
          "(%.2fx); weights' eps %.4f mean, %.4f max; rho %.3f, sigma_z %.3f"
          % (f, worst, bound, 100 * worst / bound, rms, predicted, rms / predicted,
             res["formats"][f]["eps_mean"], res["formats"][f]["eps_max"], rho, sigma_z))
    if not worst <= bound:
        fail.append(f)
json.dump(res, open(out, "w"), indent=2)
print("wrote", out)
if fail:
    print("OVER THE BOUND:", " ".join(fail))
    sys.exit(1)
EOF
