#!/usr/bin/python3
"""A GGUF file written by llama.cpp's own gguf-py, as its converter would.

A small random-weight Llama (dim 64, 2 layers, 4 heads / 2 kv, hidden 192,
F32, seeded) around the byte-level BPE vocabulary of a Hugging Face
directory (tokenizer.json + tokenizer_config.json: tokens, merges, added
tokens as control / user-defined), with tokenizer.ggml.pre set to --pre. q
and k rows are permuted to llama.cpp's adjacent-pair rotation as its
convert_hf_to_gguf.py does. add_bos_token is written only with --add-bos,
so that the file's defaults are llama.cpp's for that pre-tokenizer.

Usage: ggufpy_model.py --gguf-py DIR --tokenizer HFDIR --pre NAME --out F.gguf
       [--add-bos 0|1] [--seed N]
Needs NumPy; gguf-py imports sentencepiece, which a stub stands in for.
"""
import argparse
import json
import os
import sys
import types

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf-py", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--pre", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--add-bos", type=int, default=-1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    stub = types.ModuleType("sentencepiece")
    stub.SentencePieceProcessor = type("SentencePieceProcessor", (), {})
    sys.modules.setdefault("sentencepiece", stub)
    sys.path.insert(0, a.gguf_py)
    import gguf

    with open(os.path.join(a.tokenizer, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with open(os.path.join(a.tokenizer, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)
    vocab = tj["model"]["vocab"]
    added = {t["id"]: t for t in tj.get("added_tokens", [])}
    n = max(list(vocab.values()) + list(added)) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    ttypes = [gguf.TokenType.UNUSED] * n
    for s, i in vocab.items():
        tokens[i] = s
        ttypes[i] = gguf.TokenType.NORMAL
    for i, t in added.items():
        tokens[i] = t["content"]
        ttypes[i] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    def tok_id(field):
        v = tc.get(field)
        if isinstance(v, dict):
            v = v.get("content")
        return tokens.index(v) if v in tokens else None

    dim, layers, heads, kv_heads, hidden = 64, 2, 4, 2, 192
    hd = dim // heads
    rng = np.random.default_rng(a.seed)

    def w(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(k):
        return (1.0 + 0.1 * rng.standard_normal(k)).astype(np.float32)

    def permute(x, nh):
        r, c = x.shape
        return x.reshape(nh, 2, r // nh // 2, c).swapaxes(1, 2).reshape(r, c)

    gw = gguf.GGUFWriter(a.out, "llama")
    gw.add_context_length(512)
    gw.add_embedding_length(dim)
    gw.add_feed_forward_length(hidden)
    gw.add_block_count(layers)
    gw.add_head_count(heads)
    gw.add_head_count_kv(kv_heads)
    gw.add_layer_norm_rms_eps(1e-5)
    gw.add_rope_freq_base(10000.0)
    gw.add_rope_dimension_count(hd)
    gw.add_file_type(gguf.LlamaFileType.ALL_F32)
    gw.add_vocab_size(n)
    gw.add_tokenizer_model("gpt2")
    gw.add_tokenizer_pre(a.pre)
    gw.add_token_list(tokens)
    gw.add_token_types(ttypes)
    gw.add_token_merges(merges)
    bos, eos = tok_id("bos_token"), tok_id("eos_token")
    if eos is None:
        eos = tokens.index("<|endoftext|>")
    if bos is None:
        bos = eos
    gw.add_bos_token_id(bos)
    gw.add_eos_token_id(eos)
    if a.add_bos >= 0:
        gw.add_add_bos_token(bool(a.add_bos))

    gw.add_tensor("token_embd.weight", w(n, dim) * 4)
    gw.add_tensor("output_norm.weight", norm(dim))
    gw.add_tensor("output.weight", w(n, dim) * 4)
    for i in range(layers):
        p = f"blk.{i}."
        gw.add_tensor(p + "attn_norm.weight", norm(dim))
        gw.add_tensor(p + "attn_q.weight", permute(w(heads * hd, dim), heads))
        gw.add_tensor(p + "attn_k.weight", permute(w(kv_heads * hd, dim), kv_heads))
        gw.add_tensor(p + "attn_v.weight", w(kv_heads * hd, dim))
        gw.add_tensor(p + "attn_output.weight", w(dim, heads * hd))
        gw.add_tensor(p + "ffn_norm.weight", norm(dim))
        gw.add_tensor(p + "ffn_gate.weight", w(hidden, dim))
        gw.add_tensor(p + "ffn_up.weight", w(hidden, dim))
        gw.add_tensor(p + "ffn_down.weight", w(dim, hidden))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()


if __name__ == "__main__":
    main()
