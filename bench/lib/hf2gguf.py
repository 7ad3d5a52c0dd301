#!/usr/bin/env python3
"""Converts a Llama model in Hugging Face layout, as `infergate mkmodel`
writes it (config.json, one F32/F16 model.safetensors, a BPE tokenizer.json
with byte fallback), to a GGUF file llama.cpp loads, with llama.cpp's own
gguf-py (NumPy only).

    hf2gguf.py HF_DIR OUT.gguf [--gguf-py DIR]

--gguf-py defaults to $LLAMACPP_SRC/gguf-py, else
/work/peers/llama.cpp/gguf-py. The weights are random, so only the shapes and
the tokenizer matter: q/k rows are permuted from HF's rotate-half order to
llama.cpp's adjacent pairs, the tokenizer becomes llama.cpp's "llama"
(sentencepiece) kind with each merged token scored by its merge rank.
"""

import argparse
import json
import os
import struct
import sys
import types

import numpy as np


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    dtypes = {"F32": np.float32, "F16": np.float16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in dtypes:
            sys.exit("hf2gguf: %s is %s; only F32 and F16 are converted" % (name, info["dtype"]))
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


def permute(w, n_head):
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    default_py = os.path.join(os.environ.get("LLAMACPP_SRC", "/work/peers/llama.cpp"), "gguf-py")
    ap.add_argument("--gguf-py", default=default_py)
    args = ap.parse_args()
    # gguf-py imports sentencepiece for its vocab helpers; none is needed here.
    sys.modules.setdefault("sentencepiece",
                           types.SimpleNamespace(SentencePieceProcessor=type("S", (), {})))
    sys.path.insert(0, args.gguf_py)
    import gguf

    cfg = json.load(open(os.path.join(args.hf_dir, "config.json")))
    tok = json.load(open(os.path.join(args.hf_dir, "tokenizer.json")))
    w = load_safetensors(os.path.join(args.hf_dir, "model.safetensors"))
    dim, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim", dim // n_head)

    g = gguf.GGUFWriter(args.out, "llama")
    g.add_name("infergate-mkmodel")
    g.add_context_length(cfg["max_position_embeddings"])
    g.add_embedding_length(dim)
    g.add_block_count(cfg["num_hidden_layers"])
    g.add_feed_forward_length(cfg["intermediate_size"])
    g.add_rope_dimension_count(head_dim)
    g.add_head_count(n_head)
    g.add_head_count_kv(n_kv)
    g.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    g.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    g.add_file_type(0)  # all F32

    vocab = tok["model"]["vocab"]
    n_vocab = cfg["vocab_size"]
    tokens = [""] * n_vocab
    for t, i in vocab.items():
        if i < n_vocab:
            tokens[i] = t
    for a in tok.get("added_tokens", []):
        if a["id"] < n_vocab:
            tokens[a["id"]] = a["content"]
    rank = {}
    for r, m in enumerate(tok["model"].get("merges", [])):
        pair = m.split(" ") if isinstance(m, str) else m
        rank.setdefault("".join(pair), r)
    specials = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    scores, ttypes = [], []
    for i, t in enumerate(tokens):
        scores.append(-float(rank[t]) if t in rank else -1e6)
        if i == 0:
            ttypes.append(gguf.TokenType.UNKNOWN)
        elif i in specials:
            ttypes.append(gguf.TokenType.CONTROL)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            ttypes.append(gguf.TokenType.BYTE)
        else:
            ttypes.append(gguf.TokenType.NORMAL)
    g.add_tokenizer_model("llama")
    g.add_token_list(tokens)
    g.add_token_scores(scores)
    g.add_token_types(ttypes)
    g.add_bos_token_id(cfg.get("bos_token_id", 1))
    g.add_eos_token_id(cfg.get("eos_token_id", 2))
    g.add_unk_token_id(0)
    g.add_add_bos_token(True)

    def put(name, arr):
        g.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    put("token_embd.weight", w["model.embed_tokens.weight"])
    put("output_norm.weight", w["model.norm.weight"])
    if "lm_head.weight" in w and not cfg.get("tie_word_embeddings", False):
        put("output.weight", w["lm_head.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        b = "blk.%d." % l
        put(b + "attn_norm.weight", w[p + "input_layernorm.weight"])
        put(b + "attn_q.weight", permute(w[p + "self_attn.q_proj.weight"], n_head))
        put(b + "attn_k.weight", permute(w[p + "self_attn.k_proj.weight"], n_kv))
        put(b + "attn_v.weight", w[p + "self_attn.v_proj.weight"])
        put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"])
        put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        put(b + "ffn_gate.weight", w[p + "mlp.gate_proj.weight"])
        put(b + "ffn_up.weight", w[p + "mlp.up_proj.weight"])
        put(b + "ffn_down.weight", w[p + "mlp.down_proj.weight"])
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    print("hf2gguf: wrote %s" % args.out)


if __name__ == "__main__":
    main()
